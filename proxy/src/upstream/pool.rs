//! The connections to the one upstream: idle HTTP/1 connections on a stack, or one
//! shared HTTP/2 connection.
//!
//! The proxy has exactly one upstream (one scheme and authority), so the pool is not a
//! map keyed by host: there is nothing to hash or compare per request. Idle HTTP/1
//! connections wait on a stack behind a short lock, the most recently used on top (it is
//! the one most likely still open, and the older ones expire at the bottom). A connection
//! goes back on the stack only when its response body has ended, as only then can it
//! carry the next request; a response dropped before its end leaves the connection to
//! close. Over TLS, when the upstream picks HTTP/2 by ALPN, one multiplexed connection is
//! shared by every request and dialled again once it has closed.
//!
//! Expiry needs no timer: the oldest idle connections are at the bottom of the stack, so
//! each return drops those idle for longer than [`IDLE_EXPIRY_MS`], and a take that finds
//! an expired one on top drops the whole stack, all older still.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::h1::Conn;
use crate::StartError;
use crate::body::BodyError;
use crate::config::ConfigError;
use crate::error::ProxyError;
use crate::stream::UpstreamBody;

/// How long an idle upstream connection is kept for reuse, in milliseconds. Upstreams
/// close idle connections on their own after a while (nginx after 75 s); a connection
/// kept longer would mostly be found closed. Expired connections are dropped when the
/// pool is next used, not by a timer.
pub(super) const IDLE_EXPIRY_MS: u64 = 90_000;

/// Where and how to connect, and the connections waiting for a request.
pub(super) struct Pool {
    /// `host:port` for messages.
    authority: Authority,
    /// The host to resolve (an IPv6 literal without its brackets) and the port.
    host: String,
    port: u16,
    /// The address, when the host is an IP literal: nothing to resolve per connection.
    addr: Option<SocketAddr>,
    /// For `https://`: the connector (ALPN h2 and http/1.1) and the name to verify.
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    /// `limits.upstream_connect_timeout_ms`, for TCP and TLS together.
    connect_timeout: Duration,
    /// `limits.upstream_idle_per_host`.
    idle_max: usize,
    idle_expiry: Duration,
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    /// One pool per data-path thread (`reuseport_threads`; one in all when that is off).
    /// A connection's task runs on the runtime that dialled it, so a request that took a
    /// connection dialled by another thread would cross threads at every step of its
    /// exchange; each thread takes and returns its own instead.
    shards: Box<[Mutex<State>]>,
}

std::thread_local! {
    /// The pool shard of this thread: its index among the data-path threads, set when
    /// the thread starts ([`set_thread_shard`]); 0 on every other thread.
    static SHARD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Makes this thread take and return upstream connections in shard `index` of every
/// pool (a data-path thread of `reuseport_threads` calls it once, as it starts).
pub(crate) fn set_thread_shard(index: usize) {
    SHARD.with(|s| s.set(index));
}

/// What the lock guards: held only to push or pop, never across an await.
#[derive(Default)]
struct State {
    /// Idle HTTP/1 connections and when each became idle; the back is the top.
    idle: VecDeque<(Instant, http1::SendRequest<UpstreamBody>)>,
    /// The shared HTTP/2 connection, once the upstream has chosen h2.
    h2: Option<http2::SendRequest<UpstreamBody>>,
    /// Idle connections of the proxy's own HTTP/1 exchange ([`super::h1`]), kept the
    /// same way as `idle`.
    own: VecDeque<(Instant, Conn)>,
}

/// A connection to send one request on.
pub(super) struct Checkout {
    pub(super) sender: Sender,
    /// Taken from the pool rather than dialled for this request: a request it hands
    /// back unsent may be tried again on another connection.
    pub(super) reused: bool,
}

/// The sending half of an upstream connection; its other half runs in its own task.
pub(super) enum Sender {
    Http1(http1::SendRequest<UpstreamBody>),
    Http2(http2::SendRequest<UpstreamBody>),
}

impl Pool {
    /// The pool for an upstream of `scheme://authority`. `tls` is the rustls client
    /// configuration, used only for `https`.
    pub(super) fn new(
        scheme: &Scheme,
        authority: &Authority,
        tls: rustls::ClientConfig,
        connect_timeout: Duration,
        idle_max: usize,
        shards: usize,
    ) -> Result<Self, StartError> {
        let https = *scheme == Scheme::HTTPS;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let addr = host
            .parse::<std::net::IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, port));
        let tls = if https {
            let mut tls = tls;
            tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            let name = ServerName::try_from(host.clone()).map_err(|e| {
                StartError::Config(ConfigError::Invalid {
                    field: "upstream".to_owned(),
                    reason: format!("{host:?} is not a name a TLS certificate can be for: {e}"),
                })
            })?;
            Some((tokio_rustls::TlsConnector::from(Arc::new(tls)), name))
        } else {
            None
        };
        Ok(Self {
            authority: authority.clone(),
            host,
            port,
            addr,
            tls,
            connect_timeout,
            // `limits.upstream_idle_per_host` is for the whole proxy: each shard keeps
            // its share, rounded up.
            idle_max: idle_max.div_ceil(shards.max(1)),
            idle_expiry: Duration::from_millis(IDLE_EXPIRY_MS),
            http1: http1::Builder::new(),
            http2: http2::Builder::new(TokioExecutor::new()),
            shards: (0..shards.max(1))
                .map(|_| Mutex::new(State::default()))
                .collect(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The lock guards plain pushes and pops; a panic elsewhere cannot leave the
        // stack half-changed, so a poisoned lock is still consistent.
        let shard = SHARD.with(std::cell::Cell::get) % self.shards.len();
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection ready for a request: the shared HTTP/2 one, the most recently idle
    /// HTTP/1 one that is still open, or a new one.
    pub(super) async fn take(&self) -> Result<Checkout, ProxyError> {
        loop {
            let popped = {
                let mut state = self.state();
                if let Some(h2) = &state.h2 {
                    if !h2.is_closed() {
                        return Ok(Checkout {
                            sender: Sender::Http2(h2.clone()),
                            reused: true,
                        });
                    }
                    state.h2 = None;
                }
                state.idle.pop_back()
            };
            let Some((since, sender)) = popped else {
                break;
            };
            if sender.is_closed() {
                continue;
            }
            if palisade_server::clock::tokio_now().saturating_duration_since(since)
                >= self.idle_expiry
            {
                // Every connection below this one has been idle longer still.
                let expired = std::mem::take(&mut self.state().idle);
                drop(expired);
                continue;
            }
            if sender.is_ready() {
                return Ok(Checkout {
                    sender: Sender::Http1(sender),
                    reused: true,
                });
            }
            // Only ready connections are put back, and nothing else sends on them; one
            // that is not ready now is closing. It is dropped, never waited for.
        }
        // Boxed: the dial's state (TCP, TLS and HTTP/2 handshakes) is large, and a
        // request that finds a pooled connection should not carry its room in its own
        // future, which is moved and copied whole.
        let dial = Box::pin(self.dial());
        let sender = match tokio::time::timeout(self.connect_timeout, dial).await {
            Ok(dialled) => dialled?,
            Err(_) => return Err(self.connect_timed_out()),
        };
        if let Sender::Http2(h2) = &sender {
            // Requests that dialled at the same time may each have made one; the last
            // is kept for the next requests, and the others close when their requests
            // are done.
            self.state().h2 = Some(h2.clone());
        }
        Ok(Checkout {
            sender,
            reused: false,
        })
    }

    /// Puts an HTTP/1 connection whose response has ended back on the stack, dropping
    /// those idle past the expiry and, at `limits.upstream_idle_per_host`, the oldest.
    ///
    /// A connection is ready for its next request once its task has taken in the end of
    /// the response, which usually happened before the response's last frame was read
    /// here. When not (the two tasks ran in parallel on two threads, or the upstream
    /// answered before it took the whole request body), a task waits for it to become
    /// ready, or close, before it is put back: no request ever waits for it.
    pub(super) fn put(self: &Arc<Self>, mut sender: http1::SendRequest<UpstreamBody>) {
        if sender.is_closed() || self.idle_max == 0 {
            return;
        }
        if !sender.is_ready() {
            let pool = Arc::clone(self);
            tokio::spawn(async move {
                if sender.ready().await.is_ok() {
                    pool.push(sender);
                }
            });
            return;
        }
        self.push(sender);
    }

    fn push(&self, sender: http1::SendRequest<UpstreamBody>) {
        let dropped = self.push_idle(sender, |state| &mut state.idle);
        // Closing connections happens outside the lock.
        drop(dropped);
    }

    /// Pushes an idle connection on its stack (`stack` picks it), first taking off those
    /// idle past the expiry and, at `limits.upstream_idle_per_host`, the oldest; returns
    /// them, to be closed once the lock is released.
    fn push_idle<T>(
        &self,
        conn: T,
        stack: impl Fn(&mut State) -> &mut VecDeque<(Instant, T)>,
    ) -> Vec<(Instant, T)> {
        let now = palisade_server::clock::tokio_now();
        let mut dropped = Vec::new();
        let mut state = self.state();
        let idle = stack(&mut state);
        while let Some((since, _)) = idle.front()
            && now.saturating_duration_since(*since) >= self.idle_expiry
        {
            dropped.extend(idle.pop_front());
        }
        if idle.len() >= self.idle_max {
            dropped.extend(idle.pop_front());
        }
        idle.push_back((now, conn));
        dropped
    }

    /// A connection for the proxy's own HTTP/1 exchange: the most recently idle one that
    /// is still open (the upstream has not closed it), or a new one. (The proxy takes
    /// the two ways apart: see `HttpUpstream::exchange`.)
    #[cfg(test)]
    pub(super) async fn take_own(&self) -> Result<Conn, ProxyError> {
        match self.take_idle_own() {
            Some(conn) => Ok(conn),
            None => self.dial_own().await,
        }
    }

    /// The most recently idle connection of the proxy's own HTTP/1 exchange that is
    /// still open, if any: no await, so a request that finds one needs no future for it.
    pub(super) fn take_idle_own(&self) -> Option<Conn> {
        loop {
            let (since, conn) = self.state().own.pop_back()?;
            if palisade_server::clock::tokio_now().saturating_duration_since(since)
                >= self.idle_expiry
            {
                // Every connection below this one has been idle longer still.
                let expired = std::mem::take(&mut self.state().own);
                drop(expired);
                continue;
            }
            if conn.is_open() {
                return Some(conn);
            }
        }
    }

    /// A new connection for the proxy's own HTTP/1 exchange, within the connect timeout.
    pub(super) async fn dial_own(&self) -> Result<Conn, ProxyError> {
        let dial = async {
            let tcp = self.connect().await?;
            Ok(Conn::new(tcp))
        };
        match tokio::time::timeout(self.connect_timeout, dial).await {
            Ok(dialled) => dialled,
            Err(_) => Err(self.connect_timed_out()),
        }
    }

    /// Puts a connection of the proxy's own HTTP/1 exchange whose answer has ended back
    /// on its stack.
    pub(super) fn put_own(&self, conn: Conn) {
        if self.idle_max == 0 {
            return;
        }
        let dropped = self.push_idle(conn, |state| &mut state.own);
        drop(dropped);
    }

    fn connect_timed_out(&self) -> ProxyError {
        ProxyError::Upstream(format!(
            "no connection to the upstream {} within {} ms (limits.upstream_connect_timeout_ms)",
            self.authority,
            self.connect_timeout.as_millis()
        ))
    }

    /// A TCP connection to the upstream, with `TCP_NODELAY`.
    async fn connect(&self) -> Result<TcpStream, ProxyError> {
        let tcp = match self.addr {
            Some(addr) => TcpStream::connect(addr).await,
            None => TcpStream::connect((self.host.as_str(), self.port)).await,
        }
        .map_err(|e| self.cannot_connect(&e))?;
        tcp.set_nodelay(true).map_err(|e| self.cannot_connect(&e))?;
        Ok(tcp)
    }

    fn cannot_connect(&self, e: &dyn std::fmt::Display) -> ProxyError {
        ProxyError::Upstream(format!(
            "cannot connect to the upstream {}: {e}",
            self.authority
        ))
    }

    /// Connects (TCP with `TCP_NODELAY`, then TLS for `https`) and starts the HTTP
    /// connection's task.
    async fn dial(&self) -> Result<Sender, ProxyError> {
        let cannot = |e: &dyn std::fmt::Display| self.cannot_connect(e);
        let tcp = self.connect().await?;
        let Some((connector, name)) = &self.tls else {
            return self.http1(tcp).await.map_err(|e| cannot(&e));
        };
        let tls = connector
            .connect(name.clone(), tcp)
            .await
            .map_err(|e| cannot(&e))?;
        if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
            let (sender, connection) = self
                .http2
                .handshake(TokioIo::new(tls))
                .await
                .map_err(|e| cannot(&e))?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(cause = %e, "upstream h2 connection ended with an error");
                }
            });
            Ok(Sender::Http2(sender))
        } else {
            self.http1(tls).await.map_err(|e| cannot(&e))
        }
    }

    /// The HTTP/1 handshake (nothing is sent) and the connection's task, with upgrades
    /// so that a 101 answer can become a tunnel.
    async fn http1<T>(&self, io: T) -> Result<Sender, hyper::Error>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, connection) = self.http1.handshake(TokioIo::new(io)).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.with_upgrades().await {
                tracing::debug!(cause = %e, "upstream connection ended with an error");
            }
        });
        Ok(Sender::Http1(sender))
    }
}

/// The upstream's response body, which returns its HTTP/1 connection to the pool once
/// it has ended (then the connection can carry the next request). Dropped before its
/// end, it drops the connection, which hyper then closes.
pub(super) struct PooledBody {
    inner: Incoming,
    conn: Option<(Arc<Pool>, http1::SendRequest<UpstreamBody>)>,
}

impl PooledBody {
    pub(super) fn new(
        inner: Incoming,
        conn: Option<(Arc<Pool>, http1::SendRequest<UpstreamBody>)>,
    ) -> Self {
        Self { inner, conn }
    }

    fn release(&mut self) {
        if let Some((pool, sender)) = self.conn.take() {
            pool.put(sender);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner)
            .poll_frame(cx)
            .map_err(BodyError::Hyper);
        match &polled {
            Poll::Ready(None) => this.release(),
            // The last frame: the caller may not ask again.
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.release(),
            Poll::Ready(Some(Err(_))) => this.conn = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // A body with nothing left to read (a HEAD or 204 answer, or one whose last
        // frame was read) leaves its connection reusable.
        if self.inner.is_end_stream() {
            self.release();
        }
    }
}
