//! The accept loop of a control-plane listener ([`serve`], [`serve_tls`]) and the limits
//! it applies ([`ControlLimits`]).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use axum::response::IntoResponse as _;
use http::StatusCode;
use hyper_util::rt::TokioIo;
use palisade_protocol::Problem;
use palisade_protocol::headers::PROBLEM_JSON;
use palisade_protocol::problem::kind;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

use crate::conns::{CloseHook, CloseReason, ConnPolicy, Connections};
use crate::roles::PeerCredential;

/// Pause after a failed accept (for example EMFILE), so the loop does not spin.
pub const ACCEPT_BACKOFF_MS: u64 = 50;

/// The accept-loop policy of one control-plane listener.
#[derive(Debug, Clone)]
pub struct ControlLimits {
    /// The listener's name in logs (`admin`, `node-api`).
    pub name: &'static str,
    /// Connections open at once. At the limit, the keep-alive connection idle the longest
    /// (or, when none is left, the fresh connection admitted the longest ago) is closed to
    /// admit a new one; only when every connection has a request in flight is the new one
    /// answered 503 and closed.
    pub connections_max: usize,
    /// Time a client has, from accept, to finish its TLS handshake and send a whole
    /// request head.
    pub header_read_timeout: Duration,
    /// Time a client has, once its request head is read, to send the whole body
    /// (normally [`CONTROL_REQUEST_TIMEOUT_MS`](crate::CONTROL_REQUEST_TIMEOUT_MS)). The
    /// body is read before the request counts as in flight, so a connection still sending
    /// one can be evicted at the limit; past this it is answered 408 and closed, and told
    /// to `on_close` as [`CloseReason::RequestTimeout`].
    pub request_timeout: Duration,
    /// Time a keep-alive connection may stay idle between requests.
    pub keepalive_timeout: Duration,
    /// Time in-flight requests get to finish at shutdown.
    pub drain_timeout: Duration,
    /// Told of each connection closed by a timeout or an eviction (for metrics).
    pub on_close: Option<CloseHook>,
}

impl ControlLimits {
    /// The connection policy these limits set.
    #[must_use]
    pub fn policy(&self) -> ConnPolicy {
        ConnPolicy {
            name: self.name,
            connections_max: self.connections_max,
            header_read_timeout: self.header_read_timeout,
            keepalive_timeout: self.keepalive_timeout,
            on_close: self.on_close,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting and
/// waits up to `limits.drain_timeout` for requests in flight. Handlers can extract the
/// peer's address as `ConnectInfo<SocketAddr>`. Plaintext; [`serve_tls`] adds TLS.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ControlLimits,
    shutdown: impl Future<Output = ()> + Send,
) {
    serve_tls(listener, router, limits, None, shutdown).await;
}

/// [`serve`], with TLS when `tls` is given: each connection's handshake runs in its own
/// task, within `limits.header_read_timeout` counted from accept, before any HTTP is
/// read. When the acceptor's configuration requires client certificates (see
/// [`crate::tls::acceptor`]), a client without one fails the handshake and is never
/// served. A TLS connection refused at the connection limit is closed at once: a
/// plaintext 503 would be garbage to a TLS client. Every request of a connection whose
/// client presented a certificate carries its credential, a
/// [`PeerCredential`](crate::roles::PeerCredential) in its extensions (read it with
/// [`Caller`](crate::roles::Caller)).
///
/// A request's body is read whole ([`crate::read_body`]) before the request counts as
/// in flight and reaches `router`: until then its connection is idle to the connection
/// table, and so evictable, and at `limits.request_timeout` it is answered 408
/// (`body-timeout`) and closed. Only requests that reached `router` hold their slot.
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    limits: ControlLimits,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let connections = Connections::new(limits.policy());
    let mut builder = hyper::server::conn::http1::Builder::new();
    // hyper's own timer covers heads on keep-alive connections and heads that have
    // started arriving; the connection table covers the time from accept.
    builder
        .timer(crate::LazyTimer)
        .header_read_timeout(limits.header_read_timeout);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(err) => {
                    tracing::warn!(listener = limits.name, cause = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_BACKOFF_MS)).await;
                    continue;
                }
            },
        };
        let Some(admitted) = connections.try_admit() else {
            tracing::warn!(listener = limits.name, %peer, limit = limits.connections_max,
                "too many connections, all busy; answered 503");
            if tls.is_none() {
                tokio::spawn(refuse_over_limit(
                    stream,
                    limits.name,
                    limits.connections_max,
                ));
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let requests = admitted.requests();
        let (name, on_close, request_timeout) =
            (limits.name, limits.on_close, limits.request_timeout);
        // Each request carries the client's address and, on a TLS connection with a
        // client certificate, its credential (`crate::roles`).
        let service = move |credential: Option<PeerCredential>| {
            hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                let requests = requests.clone();
                let router = router.clone();
                let credential = credential.clone();
                async move {
                    let (mut parts, body) = request.into_parts();
                    let body = match crate::read_body(body, request_timeout).await {
                        Ok(body) => body,
                        Err(refused) => {
                            tracing::info!(listener = name, %peer, cause = %refused,
                                "request body refused; closing");
                            if matches!(refused, crate::BodyRefused::Timeout { .. })
                                && let Some(hook) = on_close
                            {
                                hook(name, CloseReason::RequestTimeout);
                            }
                            let response = refused_body(refused);
                            return Ok::<_, Infallible>(requests.enter().carry(response));
                        }
                    };
                    // Only now, body in hand, does the request hold its connection.
                    let in_flight = requests.enter();
                    parts.extensions.insert(ConnectInfo::<SocketAddr>(peer));
                    if let Some(credential) = credential {
                        parts.extensions.insert(credential);
                    }
                    let request = Request::from_parts(parts, axum::body::Body::from(body));
                    let response = router.oneshot(request).await.into_response();
                    Ok::<_, Infallible>(in_flight.carry(response))
                }
            })
        };
        let builder = builder.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let ended = match tls {
                None => {
                    admitted
                        .serve(builder.serve_connection(TokioIo::new(stream), service(None)))
                        .await
                }
                Some(acceptor) => match admitted.handshake(acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        let credential =
                            crate::tls::credential(stream.get_ref().1.peer_certificates())
                                .map(|c| PeerCredential(Arc::new(c)));
                        admitted
                            .serve(
                                builder.serve_connection(TokioIo::new(stream), service(credential)),
                            )
                            .await
                    }
                    Ok(Err(err)) => {
                        tracing::info!(listener = name, %peer, cause = %err,
                            "TLS handshake refused");
                        Ok(())
                    }
                    Err(stopped) => {
                        tracing::info!(listener = name, %peer, cause = %stopped,
                            "TLS handshake not finished");
                        Ok(())
                    }
                },
            };
            if let Err(err) = ended {
                tracing::debug!(listener = name, %peer, cause = %err, "connection ended with an error");
            }
            drop(admitted);
        });
    }
    drop(listener);
    connections.shutdown();
    if tokio::time::timeout(limits.drain_timeout, connections.drained())
        .await
        .is_err()
    {
        tracing::warn!(
            listener = limits.name,
            timeout_ms = limits.drain_timeout.as_millis() as u64,
            "requests still running at shutdown; closed"
        );
    }
}

/// The answer to a request whose body was not read: its problem, and `connection:
/// close`, since the rest of the body (if any) is never read.
fn refused_body(refused: crate::BodyRefused) -> axum::response::Response {
    let mut response = crate::ApiProblem(refused.problem()).into_response();
    response.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    response
}

/// Answers a connection over the limit with a 503 problem and closes it, without
/// reading its request: the client learns why, and nothing it sent is acted on.
async fn refuse_over_limit(mut stream: tokio::net::TcpStream, name: &'static str, limit: usize) {
    let problem = Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        kind::TOO_MANY_CONNECTIONS,
        format!("the {name} listener has its limit of {limit} connections open; retry shortly"),
    );
    let body = serde_json::to_string(&problem).unwrap_or_default();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: {PROBLEM_JSON}\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::routing::get;
    use tokio::io::AsyncReadExt as _;
    use tokio::net::TcpStream;
    use tokio::sync::{Notify, oneshot};
    use tokio::task::JoinHandle;

    use super::*;
    use crate::api::finish;
    use crate::conns::CloseReason;

    pub(super) fn limits(connections_max: usize, header_read_timeout: Duration) -> ControlLimits {
        ControlLimits {
            name: "test",
            connections_max,
            header_read_timeout,
            request_timeout: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(1),
            on_close: None,
        }
    }

    /// A router whose `/v1/hang` never answers, so a request to it stays in flight; it
    /// tells `entered` when a request reaches it.
    fn hanging_app(entered: Arc<Notify>) -> Router {
        let router = Router::new()
            .route("/v1/x", get(|| async { "ok" }))
            .route(
                "/v1/hang",
                get(move || async move {
                    entered.notify_one();
                    std::future::pending::<&'static str>().await
                }),
            )
            .route(
                "/v1/who",
                get(
                    |crate::roles::Caller(caller): crate::roles::Caller| async move {
                        caller.map_or_else(|| "nobody".to_owned(), |c| c.names().join(","))
                    },
                ),
            );
        finish(router, "test API", 64)
    }

    /// [`hanging_app`] served under some limits on a port of its own, with TLS when
    /// started with an acceptor.
    pub(super) struct Running {
        pub(super) addr: SocketAddr,
        stop: oneshot::Sender<()>,
        server: JoinHandle<()>,
    }

    impl Running {
        async fn start(limits: ControlLimits, entered: Arc<Notify>) -> Self {
            Self::start_tls(limits, entered, None).await
        }

        pub(super) async fn start_tls(
            limits: ControlLimits,
            entered: Arc<Notify>,
            tls: Option<TlsAcceptor>,
        ) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop, stopped) = oneshot::channel::<()>();
            let app = hanging_app(entered);
            let server = tokio::spawn(serve_tls(listener, app, limits, tls, async {
                let _ = stopped.await;
            }));
            Self { addr, stop, server }
        }

        pub(super) async fn stop(self) {
            let _ = self.stop.send(());
            self.server.await.unwrap();
        }
    }

    /// One HTTP/1.1 request with `connection: close`; the whole answer, or what came
    /// within `wait`.
    async fn request(addr: SocketAddr, path: &str, wait: Duration) -> String {
        let head = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut text = Vec::new();
        let _ = tokio::time::timeout(wait, stream.read_to_end(&mut text)).await;
        String::from_utf8_lossy(&text).into_owned()
    }

    /// Reads from `stream` until the server closes it, and fails unless it does within
    /// `wait`.
    pub(super) async fn assert_closed_by_server(stream: &mut TcpStream, wait: Duration) {
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(wait, stream.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0) | Err(_))),
            "closed by the server: {read:?}"
        );
    }

    /// Goal: when every connection has a request in flight, a new one is told 503 at
    /// once instead of hanging.
    /// Method: a limit of 1; hold a request in flight on one connection, then call again.
    #[tokio::test]
    async fn connection_over_the_limit_with_all_busy_is_answered_503() {
        let entered = Arc::new(Notify::new());
        let running = Running::start(limits(1, Duration::from_secs(5)), Arc::clone(&entered)).await;
        let mut busy = TcpStream::connect(running.addr).await.unwrap();
        busy.write_all(b"GET /v1/hang HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), entered.notified())
            .await
            .unwrap();
        let answer = request(running.addr, "/v1/x", Duration::from_secs(5)).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
        assert!(answer.contains("too-many-connections"), "{answer}");
        drop(busy);
        running.stop().await;
    }

    /// Goal: idle connections cannot lock a control-plane listener: at the limit the
    /// idle one is closed and the new client is served.
    /// Method: a limit of 2; two connections that send nothing; a third client's request
    /// is answered 200, and the oldest idle one sees its connection closed.
    #[tokio::test]
    async fn idle_connections_are_evicted_for_a_new_client() {
        let running = Running::start(limits(2, Duration::from_secs(30)), Arc::default()).await;
        let mut idle = vec![
            TcpStream::connect(running.addr).await.unwrap(),
            TcpStream::connect(running.addr).await.unwrap(),
        ];
        let answer = request(running.addr, "/v1/x", Duration::from_secs(5)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        assert_closed_by_server(&mut idle[0], Duration::from_secs(5)).await;
        idle.clear();
        running.stop().await;
    }

    /// Goal: a connection that sends nothing is closed at the header timeout, counted
    /// from accept, and reported as `header-timeout`.
    /// Method: a 300 ms header timeout and a counting hook; connect, send nothing, read
    /// until the server closes (bounded at 10 s, far above the timeout).
    #[tokio::test]
    async fn silent_connection_is_closed_at_the_header_timeout() {
        static HEADER_TIMEOUTS: AtomicUsize = AtomicUsize::new(0);
        fn hook(_: &'static str, reason: CloseReason) {
            if reason == CloseReason::HeaderTimeout {
                HEADER_TIMEOUTS.fetch_add(1, Ordering::SeqCst);
            }
        }
        let limits = ControlLimits {
            on_close: Some(hook),
            ..limits(4, Duration::from_millis(300))
        };
        let running = Running::start(limits, Arc::default()).await;
        let mut silent = TcpStream::connect(running.addr).await.unwrap();
        assert_closed_by_server(&mut silent, Duration::from_secs(10)).await;
        assert_eq!(HEADER_TIMEOUTS.load(Ordering::SeqCst), 1);
        running.stop().await;
    }

    /// Goal: a keep-alive connection left idle after its response is closed at the
    /// keep-alive timeout and counted as `keepalive-timeout`.
    /// Method: a 300 ms keep-alive timeout under a 30 s header timeout (so only the
    /// keep-alive timer can close it) and a counting hook; one keep-alive request, read
    /// its answer, then read until the server closes (bounded at 10 s).
    #[tokio::test]
    async fn idle_keepalive_connection_is_closed_at_the_keepalive_timeout() {
        static KEEPALIVE_TIMEOUTS: AtomicUsize = AtomicUsize::new(0);
        fn hook(_: &'static str, reason: CloseReason) {
            if reason == CloseReason::KeepaliveTimeout {
                KEEPALIVE_TIMEOUTS.fetch_add(1, Ordering::SeqCst);
            }
        }
        let limits = ControlLimits {
            keepalive_timeout: Duration::from_millis(300),
            on_close: Some(hook),
            ..limits(4, Duration::from_secs(30))
        };
        let running = Running::start(limits, Arc::default()).await;
        let mut stream = TcpStream::connect(running.addr).await.unwrap();
        stream
            .write_all(b"GET /v1/x HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let mut buf = [0u8; 512];
        while !answer.ends_with(b"ok") {
            let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0, "closed before answering: {answer:?}");
            answer.extend_from_slice(&buf[..n]);
        }
        assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
        assert_closed_by_server(&mut stream, Duration::from_secs(10)).await;
        assert_eq!(KEEPALIVE_TIMEOUTS.load(Ordering::SeqCst), 1);
        running.stop().await;
    }

    /// Goal: a client that sends a head and then its body a byte at a time is answered
    /// 408 (`body-timeout`) at the request timeout, its connection closed and counted as
    /// `request-timeout`.
    /// Method: a 300 ms request timeout and a counting hook; send a head announcing 4000
    /// bytes and one byte of body; read the answer (bounded at 10 s).
    #[tokio::test]
    async fn a_body_that_does_not_arrive_is_answered_408_at_the_request_timeout() {
        static REQUEST_TIMEOUTS: AtomicUsize = AtomicUsize::new(0);
        fn hook(_: &'static str, reason: CloseReason) {
            if reason == CloseReason::RequestTimeout {
                REQUEST_TIMEOUTS.fetch_add(1, Ordering::SeqCst);
            }
        }
        let limits = ControlLimits {
            request_timeout: Duration::from_millis(300),
            on_close: Some(hook),
            ..limits(4, Duration::from_secs(30))
        };
        let running = Running::start(limits, Arc::default()).await;
        let mut slow = TcpStream::connect(running.addr).await.unwrap();
        slow.write_all(b"POST /v1/x HTTP/1.1\r\nhost: x\r\ncontent-length: 4000\r\n\r\n{")
            .await
            .unwrap();
        let mut text = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut text))
            .await
            .unwrap()
            .unwrap();
        let text = String::from_utf8_lossy(&text);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("body-timeout"), "{text}");
        assert_eq!(REQUEST_TIMEOUTS.load(Ordering::SeqCst), 1);
        running.stop().await;
    }

    /// Goal: connections still sending their bodies do not hold the listener: at the
    /// limit a new client evicts one and is served.
    /// Method: a limit of 2 and a 30 s request timeout; two connections that sent a head
    /// and part of a body; a third client's request is answered 200 at once.
    #[tokio::test]
    async fn connections_sending_slow_bodies_are_evicted_for_a_new_client() {
        let limits = ControlLimits {
            request_timeout: Duration::from_secs(30),
            ..limits(2, Duration::from_secs(30))
        };
        let running = Running::start(limits, Arc::default()).await;
        let mut slow = Vec::new();
        for _ in 0..2 {
            let mut stream = TcpStream::connect(running.addr).await.unwrap();
            stream
                .write_all(b"POST /v1/x HTTP/1.1\r\nhost: x\r\ncontent-length: 4000\r\n\r\n{")
                .await
                .unwrap();
            slow.push(stream);
        }
        // Let the server read both heads before the third client comes.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let answer = request(running.addr, "/v1/x", Duration::from_secs(5)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        drop(slow);
        running.stop().await;
    }
}

#[cfg(test)]
mod tls_tests {
    use std::sync::Arc;

    use std::path::Path;

    use palisade_cluster::Pki;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio_rustls::TlsConnector;
    use tokio_rustls::rustls::pki_types::ServerName;

    use super::tests::{Running, assert_closed_by_server, limits};
    use super::*;

    /// The workspace's one test CA (`palisade_cluster::Pki`) under `dir`: `ca.pem`,
    /// `server.pem`/`server.key` (valid for 127.0.0.1) and a client certificate `client`.
    fn pki(dir: &Path) -> Pki {
        Pki::issue(dir, &["server", "client"]).unwrap()
    }

    /// `GET /v1/x` over TLS to `addr`, presenting `identity` if given. The response
    /// text, or the error that ended the exchange.
    async fn get_over_tls(
        addr: SocketAddr,
        pki: &Pki,
        identity: bool,
    ) -> Result<String, std::io::Error> {
        get_path_over_tls(addr, pki, identity, "/v1/x").await
    }

    /// `GET path` over TLS to `addr`, presenting `identity` if given.
    async fn get_path_over_tls(
        addr: SocketAddr,
        pki: &Pki,
        identity: bool,
        path: &str,
    ) -> Result<String, std::io::Error> {
        let config = pki.client_config(identity.then_some("client")).unwrap();
        let connector = TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = connector.connect(name, tcp).await?;
        tls.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut text = String::new();
        tls.read_to_string(&mut text).await?;
        Ok(text)
    }

    /// Goal: with a client CA, a client holding a certificate that CA issued is served,
    /// and a client without a certificate is refused in the handshake, before any HTTP.
    /// Method: an rcgen CA; serve a small router with `serve_tls`; call it both ways.
    #[tokio::test]
    async fn mutual_tls_serves_a_certified_client_and_refuses_one_without() {
        let dir = tempfile::tempdir().unwrap();
        let pki = pki(dir.path());
        let acceptor = crate::tls::acceptor(
            &dir.path().join("server.pem"),
            &dir.path().join("server.key"),
            Some(&dir.path().join("ca.pem")),
        )
        .unwrap();
        let limits = limits(8, Duration::from_secs(5));
        let running = Running::start_tls(limits, Arc::default(), Some(acceptor)).await;
        let addr = running.addr;
        let served = get_over_tls(addr, &pki, true).await.unwrap();
        assert!(served.starts_with("HTTP/1.1 200"), "{served}");
        assert!(served.ends_with("ok"), "{served}");
        // Each request carries the credential the handshake verified: the client
        // certificate's DNS names.
        let who = get_path_over_tls(addr, &pki, true, "/v1/who")
            .await
            .unwrap();
        let names = who.rsplit("\r\n\r\n").next().unwrap_or_default();
        assert!(names.split(',').any(|n| n == "client"), "{who}");
        // TLS 1.3 finishes the client's side of the handshake before the server checks
        // the (missing) certificate, so the refusal shows as a failed exchange.
        let refused = get_over_tls(addr, &pki, false).await;
        assert!(
            refused.as_ref().is_err() || refused.as_ref().is_ok_and(String::is_empty),
            "a client without a certificate must not be served: {refused:?}"
        );
        // A plaintext request on the TLS port is not served either.
        let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
        plain
            .write_all(b"GET /v1/x HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut text = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut text)).await;
        assert!(!String::from_utf8_lossy(&text).contains("200"), "{text:?}");
        running.stop().await;
    }

    /// Goal: the TLS handshake counts within the header timeout: a client that opens a
    /// TCP connection to a TLS listener and sends nothing is closed at that timeout.
    /// Method: a 300 ms header timeout on `serve_tls`; connect, send nothing, read until
    /// the server closes (bounded at 10 s, far above the timeout).
    #[tokio::test]
    async fn silent_connection_to_a_tls_listener_is_closed_at_the_header_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let _pki = pki(dir.path());
        let acceptor = crate::tls::acceptor(
            &dir.path().join("server.pem"),
            &dir.path().join("server.key"),
            None,
        )
        .unwrap();
        let limits = limits(8, Duration::from_millis(300));
        let running = Running::start_tls(limits, Arc::default(), Some(acceptor)).await;
        let mut silent = tokio::net::TcpStream::connect(running.addr).await.unwrap();
        assert_closed_by_server(&mut silent, Duration::from_secs(10)).await;
        running.stop().await;
    }
}
