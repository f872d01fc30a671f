//! Accepting the data path's connections: TLS, HTTP/1.1 and h2c, the connection limit
//! with idle-first eviction, timeouts from accept and between requests, and graceful
//! shutdown. The admin API is served by the protocol crate's control-plane accept loop
//! instead (see `admin`); both share its connection table.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use palisade_protocol::server::{ConnPolicy, Connections};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::body::ProxyBody;
use crate::metrics as m;

/// Pause after a failed accept (for example EMFILE), so the loop does not spin.
const ACCEPT_BACKOFF_MS: u64 = 50;

/// Largest single read of an HTTP/1 connection, in bytes: how much of a body can arrive
/// as one frame. hyper grows its reads from 8 KiB up to this while they come back full,
/// so a connection sending small requests keeps small buffers.
pub(crate) const READ_BUFFER_BYTES_MAX: usize = 64 * 1024;

/// The client at the other end of a connection, worked out once per connection rather
/// than once per request.
pub(crate) struct Peer {
    /// Its IP as an `X-Forwarded-For` value.
    pub forwarded_for: Option<http::HeaderValue>,
}

impl Peer {
    fn new(addr: SocketAddr) -> Self {
        Self {
            forwarded_for: http::HeaderValue::from_str(&addr.ip().to_string()).ok(),
        }
    }
}

/// How one listener treats its connections.
#[derive(Clone)]
pub(crate) struct ListenerSettings {
    /// Name in logs, in the connections gauge and in the closes counter (`client`).
    pub name: &'static str,
    pub connections_max: usize,
    pub header_read_timeout: Duration,
    pub keepalive_timeout: Duration,
    pub header_bytes_max: usize,
    pub h2_streams_max: u32,
    pub drain_timeout: Duration,
    pub tls: Option<TlsAcceptor>,
    /// Whether some route allows upgrades (`upgrade = true`). Only then are connections
    /// served with hyper's upgrade support, which costs every request a little; without
    /// it the service still refuses every upgrade before anything is forwarded.
    pub upgrades: bool,
}

impl ListenerSettings {
    fn policy(&self) -> ConnPolicy {
        ConnPolicy {
            name: self.name,
            connections_max: self.connections_max,
            header_read_timeout: self.header_read_timeout,
            keepalive_timeout: self.keepalive_timeout,
            on_close: Some(m::connection_closed),
        }
    }
}

/// Serves `listener` until `shutdown` turns true, then stops accepting and waits up to
/// the drain timeout for open connections to finish their in-flight requests.
///
/// Connections go through the protocol crate's connection table (shared with the
/// control plane): a connection that sends nothing is closed at the header timeout
/// counted from accept, the TLS handshake included; an idle keep-alive connection at the
/// keep-alive timeout; and at `connections_max` the connection idle the longest is closed
/// so that a new client is served. This matters here more than anywhere: hyper-util's
/// `auto` builder (HTTP/1.1 and h2c on one port) reads the first bytes to tell the
/// HTTP/2 preface apart with no timer, and hyper's HTTP/1 header timer only starts
/// after that, so without the table a client that never sends a byte held its slot, and
/// `connections_max` of them locked every other client out. Only when every connection
/// has a request in flight does a new one wait, in the kernel's backlog behind it.
pub(crate) async fn serve<H, F>(
    listener: TcpListener,
    settings: ListenerSettings,
    mut shutdown: watch::Receiver<bool>,
    handler: H,
) where
    H: Fn(Request<Incoming>, Arc<Peer>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<ProxyBody>, Infallible>> + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        // hyper's one buffer limit bounds both the request head and each read of a body.
        // At `header_bytes_max` (16 KiB by default) a 64 KiB body would arrive as four
        // or more frames, each a wake-up of the upstream connection's task and a write
        // to the upstream: streaming would cost more CPU than reading the body whole. So reads
        // may grow to `READ_BUFFER_BYTES_MAX`, and the head limit is checked by the
        // service instead (`service::check_head_size`, 431 as before).
        .max_buf_size(settings.header_bytes_max.max(READ_BUFFER_BYTES_MAX))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(settings.header_bytes_max).unwrap_or(u32::MAX))
        .max_concurrent_streams(settings.h2_streams_max);
    let builder = Arc::new(builder);
    let connections = Connections::new(settings.policy());

    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(listener = settings.name, cause = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_BACKOFF_MS)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        // At the limit this closes the connection idle the longest; with every
        // connection busy it waits, and the clients behind this one queue in the
        // kernel's backlog instead of holding memory here.
        let admitted = tokio::select! {
            admitted = connections.admit() => admitted,
            _ = shutdown.changed() => break,
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let client = Arc::new(Peer::new(peer));
        let requests = admitted.requests();
        let service = service_fn(move |req| {
            let in_flight = requests.enter();
            let answer = handler(req, Arc::clone(&client));
            async move {
                let response = answer.await?;
                Ok::<_, Infallible>(in_flight.carry(response))
            }
        });
        let builder = Arc::clone(&builder);
        let settings = settings.clone();
        tokio::spawn(async move {
            let gauge = metrics::gauge!(m::CONNECTIONS, "listener" => settings.name);
            gauge.increment(1.0);
            // hyper's upgrade support only where a route allows upgrades (see
            // `ListenerSettings::upgrades`); the two connection types differ, so each
            // branch is written out.
            let upgrades = settings.upgrades;
            macro_rules! serve_io {
                ($io:expr) => {
                    if upgrades {
                        admitted
                            .serve(builder.serve_connection_with_upgrades($io, service))
                            .await
                    } else {
                        admitted.serve(builder.serve_connection($io, service)).await
                    }
                };
            }
            let result = match &settings.tls {
                None => serve_io!(TokioIo::new(stream)),
                Some(acceptor) => match admitted.handshake(acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => serve_io!(TokioIo::new(tls)),
                    Ok(Err(e)) => Err(e.into()),
                    Err(stopped) => Err(stopped.into()),
                },
            };
            if let Err(e) = result {
                tracing::debug!(listener = settings.name, %peer, cause = %e, "connection ended with an error");
            }
            gauge.decrement(1.0);
            drop(admitted);
        });
    }
    drop(listener);
    let open = connections.live();
    tracing::info!(
        listener = settings.name,
        open,
        "stopped accepting; draining connections"
    );
    connections.shutdown();
    tokio::select! {
        () = connections.drained() => tracing::info!(listener = settings.name, "drained"),
        () = tokio::time::sleep(settings.drain_timeout) => {
            tracing::warn!(listener = settings.name, "drain timeout reached; closing remaining connections");
        }
    }
}
