//! Accepting the data path's connections: TLS, HTTP/1.1 and h2c, the connection limit
//! with idle-first eviction, timeouts from accept and between requests, and graceful
//! shutdown. The admin API is served by the protocol crate's control-plane accept loop
//! instead (see `admin`); both share its connection table.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::FutureExt as _;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use palisade_server::clock::Cached;
use palisade_server::wake::Relayed;
use palisade_server::{Admitted, ConnPolicy, Connections, Releasable, Served};
use palisade_server::{LazyTimer, Recycling};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

mod rewind;

use crate::body::ProxyBody;
use crate::metrics as m;
use rewind::Rewind;

/// Pause after a failed accept (for example EMFILE), so the loop does not spin.
const ACCEPT_BACKOFF_MS: u64 = 50;

/// Largest single read of an HTTP/1 connection, in bytes: how much of a body can arrive
/// as one frame. hyper grows its reads from 8 KiB up to this while they come back full,
/// so a connection sending small requests keeps small buffers.
pub(crate) const READ_BUFFER_BYTES_MAX: usize = 64 * 1024;

/// How long an HTTP/1.1 connection stays idle after its last response before hyper's
/// connection is ended and its buffers freed, the stream kept (at most half the header
/// timeout; see `Http::new`). Short, so that idle keep-alive connections cost little
/// memory (hyper's read buffer alone starts at 8 KiB); long enough that a client sending
/// request after request never pays for a new hyper connection between them.
const IDLE_RELEASE_MS: u64 = 1_000;

/// Bytes read through TLS, at most, to learn that a parked connection's client sent its
/// next request (the rest stays in rustls's buffer for hyper).
const PARKED_TLS_READ_BYTES: usize = 64;

/// Time given to close a stream (TLS `close_notify`, TCP FIN) after its connection ended,
/// so that a client that stopped reading cannot hold the connection's task.
const CLOSE_TIMEOUT_MS: u64 = 1_000;

/// Logs the size of a connection's task once per process.
static FUTURE_SIZE_LOGGED: std::sync::Once = std::sync::Once::new();

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
    /// See [`Rewind`]'s write timeout (`limits.client_write_timeout_ms`).
    pub write_timeout: Duration,
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
/// the drain timeout for open connections to finish their in-flight requests. With
/// `loops`, each accepted connection is served on one of their runtimes; without, on the
/// runtime that accepted it.
///
/// Connections go through the protocol crate's connection table (shared with the
/// control plane): a connection that sends nothing is closed at the header timeout
/// counted from accept, the TLS handshake included; an idle keep-alive connection at the
/// keep-alive timeout; and at `connections_max` an idle connection (keep-alive ones first,
/// the longest idle first) is closed so that a new client is served. This matters here more than anywhere: hyper-util's
/// `auto` builder (HTTP/1.1 and h2c on one port) reads the first bytes to tell the
/// HTTP/2 preface apart with no timer, and hyper's HTTP/1 header timer only starts
/// after that, so without the table a client that never sends a byte held its slot, and
/// `connections_max` of them locked every other client out. Only when every connection
/// has a request in flight does a new one wait, in the kernel's backlog behind it.
pub(crate) async fn serve<H, F>(
    listener: TcpListener,
    settings: ListenerSettings,
    mut shutdown: watch::Receiver<bool>,
    loops: Option<Arc<crate::loops::Loops>>,
    handler: H,
) where
    H: Fn(Request<Incoming>, Arc<Peer>) -> F + Clone + Send + Sync + Unpin + 'static,
    F: Future<Output = Result<Response<ProxyBody>, Infallible>> + Send + 'static,
{
    let http = Arc::new(Http::new(&settings));
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
            // `map`, not an `async` block: a block that captures the answer's future and
            // awaits it keeps two copies of it (rustc does not lay a captured future over
            // the one it awaits), 2 KiB more per request in flight.
            handler(req, Arc::clone(&client))
                .map(move |answer| answer.map(|response| in_flight.carry(response)))
        });
        let http = Arc::clone(&http);
        let tls = settings.tls.clone();
        // Each poll of a connection's task reads the clock once (`Cached`), passes its
        // wake-ups on through one waker (`Relayed`), and keeps the timers its requests
        // drop for the next ones (`Recycling`).
        let task = move |stream: TcpStream| {
            Cached::new(Relayed::new(Recycling::new(async move {
                let gauge = metrics::gauge!(m::CONNECTIONS, "listener" => http.name);
                gauge.increment(1.0);
                let result = match tls {
                    None => http.serve_stream(stream, &admitted, service).await,
                    // Boxed, handshake and all: a task is one allocation of the size of its
                    // largest state, and TLS's (the handshake, the TLS stream) would
                    // otherwise make every connection's task that large, parked or not.
                    Some(acceptor) => {
                        Box::pin(async {
                            match admitted.handshake(acceptor.accept(stream)).await {
                                Ok(Ok(tls)) => http.serve_stream(tls, &admitted, service).await,
                                Ok(Err(e)) => Err(e.into()),
                                Err(stopped) => Err(stopped.into()),
                            }
                        })
                        .await
                    }
                };
                if let Err(e) = result {
                    tracing::debug!(listener = http.name, %peer, cause = %e, "connection ended with an error");
                }
                gauge.decrement(1.0);
                drop(admitted);
            })))
        };
        let Some(loops) = &loops else {
            let task = task(stream);
            // A task is one allocation of its future's size, for as long as the
            // connection lives, parked or not: worth seeing when weighing what a
            // connection costs.
            FUTURE_SIZE_LOGGED.call_once(|| {
                tracing::debug!(
                    listener = settings.name,
                    bytes = std::mem::size_of_val(&task),
                    "size of a connection's task"
                );
            });
            tokio::spawn(task);
            continue;
        };
        // Moved as a plain socket and registered again on the thread that serves it: a
        // tokio stream is tied to the reactor of the runtime that registered it.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!(listener = settings.name, %peer, cause = %e,
                    "cannot hand the connection to a data-path thread; closed");
                continue;
            }
        };
        let name = settings.name;
        loops.pick().spawn(async move {
            match TcpStream::from_std(stream) {
                Ok(stream) => task(stream).await,
                Err(e) => tracing::warn!(listener = name, %peer, cause = %e,
                    "cannot register the connection on its data-path thread; closed"),
            }
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

/// What a connection's task needs besides its stream and its service: hyper's builders
/// and the release policy, shared by the listener's connections.
struct Http {
    name: &'static str,
    /// HTTP/1.1 connections, which are released when idle.
    h1: http1::Builder,
    /// HTTP/2 connections (told apart by their preface), which are served as they are.
    auto: auto::Builder<TokioExecutor>,
    /// See [`ListenerSettings::upgrades`].
    upgrades: bool,
    /// See [`IDLE_RELEASE_MS`].
    release_after: Duration,
    /// See [`ListenerSettings::write_timeout`].
    write_timeout: Duration,
    /// Connections parked now: released, waiting for their next request.
    parked: metrics::Gauge,
}

impl Http {
    fn new(settings: &ListenerSettings) -> Self {
        // hyper's one buffer limit bounds both the request head and each read of a body.
        // At `header_bytes_max` (16 KiB by default) a 64 KiB body would arrive as four
        // or more frames, each a wake-up of the upstream connection's task and a write
        // to the upstream: streaming would cost more CPU than reading the body whole. So
        // reads may grow to `READ_BUFFER_BYTES_MAX`, and the head limit is checked by the
        // service instead (`service::check_head_size`, 431 as before).
        let buf_max = settings.header_bytes_max.max(READ_BUFFER_BYTES_MAX);
        let mut h1 = http1::Builder::new();
        h1.timer(LazyTimer)
            .header_read_timeout(settings.header_read_timeout)
            .max_buf_size(buf_max)
            .keep_alive(true);
        let mut auto = auto::Builder::new(TokioExecutor::new());
        auto.http1()
            .timer(LazyTimer)
            .header_read_timeout(settings.header_read_timeout)
            .max_buf_size(buf_max)
            .keep_alive(true);
        auto.http2()
            .timer(LazyTimer)
            .max_header_list_size(u32::try_from(settings.header_bytes_max).unwrap_or(u32::MAX))
            .max_concurrent_streams(settings.h2_streams_max);
        // hyper's HTTP/1 header timer also runs while a connection idles between requests
        // (it starts when hyper begins reading for the next head), so a connection must
        // be released before it fires, or the keep-alive timeout could never be reached.
        let release_after =
            Duration::from_millis(IDLE_RELEASE_MS).min(settings.header_read_timeout / 2);
        Self {
            name: settings.name,
            h1,
            auto,
            upgrades: settings.upgrades,
            release_after,
            write_timeout: settings.write_timeout,
            parked: metrics::gauge!(m::CONNECTIONS_PARKED, "listener" => settings.name),
        }
    }

    /// Serves one client stream to its end: tells HTTP/2 from HTTP/1.1 by the first
    /// bytes (within the header timeout from accept), serves HTTP/2 with the `auto`
    /// builder, and HTTP/1.1 in rounds: hyper serves the connection until it has been
    /// idle for the release time, then its HTTP state and buffers are dropped and the
    /// bare stream is parked until the client sends again, when a new round begins.
    async fn serve_stream<T, S, B>(
        &self,
        stream: T,
        admitted: &Admitted,
        mut service: S,
    ) -> Result<(), BoxError>
    where
        T: ClientStream,
        S: hyper::service::Service<Request<Incoming>, Response = Response<B>>
            + Clone
            + Send
            + Unpin
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: hyper::body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        let mut stream = stream;
        let (h2, first) = match admitted.handshake(sniff_version(&mut stream)).await {
            Ok(Ok(sniffed)) => sniffed,
            Ok(Err(e)) => return Err(e.into()),
            Err(stopped) => return Err(stopped.into()),
        };
        let mut stream = Rewind::new(stream, first, self.name, self.write_timeout);
        if h2 {
            let io = TokioIo::new(stream);
            // Boxed: hyper's HTTP/2 connection state is large, and only HTTP/2
            // connections should pay for it.
            return if self.upgrades {
                Box::pin(admitted.serve(self.auto.serve_connection_with_upgrades(io, service)))
                    .await
            } else {
                Box::pin(admitted.serve(self.auto.serve_connection(io, service))).await
            };
        }
        loop {
            // One round: hyper serves the connection until it ends, or until it is
            // released after idling for the release time. Boxed, the whole round:
            // hyper's connection and the future that drives it are one allocation,
            // freed when the connection is released, so a parked connection's task
            // keeps room only for the parked wait. In a block, so that what the round
            // gave back takes no room in the task either.
            stream = {
                let round = async move {
                    let keep_open = Arc::clone(&stream.keep_open);
                    let conn = self.h1.serve_connection(TokioIo::new(stream), service);
                    let conn = if self.upgrades {
                        H1Conn::Upgradeable(conn.with_upgrades())
                    } else {
                        H1Conn::Plain(conn)
                    };
                    let mut conn = H1 { conn, keep_open };
                    let served = admitted
                        .serve_or_release(Pin::new(&mut conn), self.release_after)
                        .await;
                    (served, conn.into_parts())
                };
                let (served, parts) = Box::pin(round).await;
                // No parts: the connection was upgraded, and the stream is the upgrade's.
                let Some(parts) = parts else {
                    return served.map(drop);
                };
                match served {
                    Ok(Served::Released) => {}
                    // hyper closed the stream itself.
                    Ok(Served::Ended) => return Ok(()),
                    Err(e) => return Err(e),
                }
                service = parts.service;
                let mut rewound = parts.io.into_inner();
                rewound.put_back(parts.read_buf);
                rewound
            };
            if !stream.has_prefix() {
                self.parked.increment(1.0);
                let woke = admitted
                    .park(std::pin::pin!(stream.inner.next_bytes()))
                    .await;
                self.parked.decrement(1.0);
                match woke {
                    Ok(Ok(Some(first))) => stream.put_back(first),
                    // The client closed the connection.
                    Ok(Ok(None)) => return Ok(()),
                    Ok(Err(e)) => return Err(e.into()),
                    Err(stopped) => {
                        tracing::trace!(listener = self.name, cause = %stopped, "closing a parked connection");
                        stream.close().await;
                        return Ok(());
                    }
                }
            }
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The first bytes of an HTTP/2 connection with prior knowledge (RFC 9113, 3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads the first bytes of a connection until they either differ from the HTTP/2
/// preface or are all of it: whether the client speaks HTTP/2, and the bytes read (at
/// most the preface's 24, as hyper-util's `auto` builder reads).
async fn sniff_version<T: AsyncRead + Unpin>(stream: &mut T) -> std::io::Result<(bool, Bytes)> {
    let mut first = [0u8; H2_PREFACE.len()];
    let mut len = 0;
    loop {
        let n = stream.read(&mut first[len..]).await?;
        len += n;
        let read = &first[..len];
        if n == 0 || read != &H2_PREFACE[..len] {
            return Ok((false, Bytes::copy_from_slice(read)));
        }
        if len == H2_PREFACE.len() {
            return Ok((true, Bytes::copy_from_slice(read)));
        }
    }
}

/// A client's stream (TCP, or TLS over TCP) as a parked connection waits on it.
pub(crate) trait ClientStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Waits until the client sends something: the bytes read to find out (none for
    /// TCP, where readiness is enough), or `None` when the client closed the stream.
    fn next_bytes(&mut self) -> impl Future<Output = std::io::Result<Option<Bytes>>> + Send;
}

impl ClientStream for TcpStream {
    async fn next_bytes(&mut self) -> std::io::Result<Option<Bytes>> {
        // Readable also at end of stream: the next round's hyper connection then reads
        // the end and finishes quietly.
        self.readable().await?;
        Ok(Some(Bytes::new()))
    }
}

impl ClientStream for tokio_rustls::server::TlsStream<TcpStream> {
    async fn next_bytes(&mut self) -> std::io::Result<Option<Bytes>> {
        // A readable socket need not mean plaintext (a TLS record may be partial, or a
        // key update), so this reads through TLS, a few bytes at most: the rest stays in
        // rustls's buffer until hyper reads it.
        let mut first = [0u8; PARKED_TLS_READ_BYTES];
        let n = self.read(&mut first).await?;
        Ok((n > 0).then(|| Bytes::copy_from_slice(&first[..n])))
    }
}

/// hyper's two HTTP/1.1 connection types: without upgrades, and with them (on a
/// listener with routes that allow upgrades).
enum H1Conn<I, S: hyper::service::HttpService<Incoming>> {
    Plain(http1::Connection<I, S>),
    Upgradeable(http1::UpgradeableConnection<I, S>),
}

/// An HTTP/1.1 connection as a round uses it.
trait Round: Unpin {
    type Io;
    type Service;

    fn poll_round(&mut self, cx: &mut Context<'_>) -> Poll<hyper::Result<()>>;

    fn shut_down_gracefully(&mut self);

    /// The stream, the bytes read and not yet used, and the service; `None` once upgraded.
    fn into_parts(self) -> Option<http1::Parts<Self::Io, Self::Service>>;
}

impl<I, S, B> Round for H1Conn<I, S>
where
    S: hyper::service::HttpService<Incoming, ResBody = B> + Unpin,
    S::Error: Into<BoxError>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<BoxError>,
    Self: Unpin,
{
    type Io = I;
    type Service = S;

    fn poll_round(&mut self, cx: &mut Context<'_>) -> Poll<hyper::Result<()>> {
        match self {
            Self::Plain(conn) => Pin::new(conn).poll(cx),
            Self::Upgradeable(conn) => Pin::new(conn).poll(cx),
        }
    }

    fn shut_down_gracefully(&mut self) {
        match self {
            Self::Plain(conn) => Pin::new(conn).graceful_shutdown(),
            Self::Upgradeable(conn) => Pin::new(conn).graceful_shutdown(),
        }
    }

    fn into_parts(self) -> Option<http1::Parts<I, S>> {
        match self {
            Self::Plain(conn) => Some(conn.into_parts()),
            Self::Upgradeable(conn) => conn.into_parts(),
        }
    }
}

/// One round of an HTTP/1.1 connection (boxed with the future that drives it, by
/// `Http::serve_stream`), with the switch that makes hyper's final shutdown keep the
/// stream open when the round ends in a release.
struct H1<C> {
    conn: C,
    keep_open: Arc<AtomicBool>,
}

impl<C: Round> H1<C> {
    fn into_parts(self) -> Option<http1::Parts<C::Io, C::Service>> {
        self.conn.into_parts()
    }
}

impl<C: Round> Future for H1<C> {
    type Output = hyper::Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.conn.poll_round(cx)
    }
}

impl<C: Round> Releasable for H1<C> {
    type Error = hyper::Error;

    fn close_gracefully(mut self: Pin<&mut Self>) {
        self.keep_open.store(false, Ordering::Relaxed);
        self.conn.shut_down_gracefully();
    }

    fn release(mut self: Pin<&mut Self>) {
        self.keep_open.store(true, Ordering::Relaxed);
        self.conn.shut_down_gracefully();
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt as _;

    use super::*;

    /// Goal: a client that reads nothing of what the proxy writes loses its connection at
    /// the write timeout, counted from the last progress. Method: a stream whose other
    /// end never reads (an in-memory pipe with room for 64 bytes), a 1 KiB write, in
    /// virtual time.
    #[tokio::test(start_paused = true)]
    async fn a_write_that_makes_no_progress_fails_at_the_write_timeout() {
        let (_client, server) = tokio::io::duplex(64);
        let timeout = Duration::from_secs(60);
        let mut stream = Rewind::new(server, Bytes::new(), "test", timeout);
        let started = tokio::time::Instant::now();
        let err = tokio::time::timeout(timeout * 2, stream.write_all(&[0u8; 1024]))
            .await
            .expect("the write ended within twice the timeout")
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        assert!(
            err.to_string().contains("limits.client_write_timeout_ms"),
            "{err}"
        );
        assert_eq!(
            started.elapsed(),
            timeout,
            "failed at the timeout, not before"
        );
    }

    /// Goal: a slow reader is not cut off: the timeout counts from the last progress, not
    /// from the start of the write. Method: the other end reads 64 bytes every 40 s (the
    /// timeout is 60 s), so the 1 KiB write takes 10 minutes of virtual time.
    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_is_not_cut_off() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut stream = Rewind::new(server, Bytes::new(), "test", Duration::from_secs(60));
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            let mut total = 0;
            while total < 1024 {
                tokio::time::sleep(Duration::from_secs(40)).await;
                total += client.read(&mut buf).await.unwrap();
            }
            total
        });
        let started = tokio::time::Instant::now();
        stream.write_all(&[0u8; 1024]).await.unwrap();
        stream.flush().await.unwrap();
        assert!(started.elapsed() >= Duration::from_secs(600));
        assert_eq!(reader.await.unwrap(), 1024);
    }

    /// Goal: a plain TCP connection's future stays small, as it is allocated for every
    /// connection for as long as it lives (parked ones included): neither the TLS
    /// stream nor hyper's HTTP/1 or HTTP/2 connection state is inline in it, nor an
    /// HTTP/1.1 round's driving future (boxed per round), nor a second copy of the
    /// parked wait's future (888 bytes in a test build; 1,376 before those two went).
    /// Method: build a listener's `Http` and one connection's `serve_stream` future over
    /// a loopback TCP stream, without running it, and measure it.
    #[tokio::test]
    async fn a_tcp_connection_future_has_no_connection_state_inline() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let settings = ListenerSettings {
            name: "test",
            connections_max: 4,
            header_read_timeout: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(60),
            header_bytes_max: 16 * 1024,
            h2_streams_max: 100,
            drain_timeout: Duration::from_secs(1),
            tls: None,
            upgrades: true,
        };
        let http = Http::new(&settings);
        let connections = Connections::new(settings.policy());
        let admitted = connections.try_admit().unwrap();
        let service = service_fn(|_req: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(http_body_util::Empty::<Bytes>::new()))
        });
        let future = http.serve_stream(stream, &admitted, service);
        let bytes = std::mem::size_of_val(&future);
        eprintln!("serve_stream over TCP: {bytes} bytes");
        assert!(bytes < 1024, "{bytes} bytes");
    }
}
