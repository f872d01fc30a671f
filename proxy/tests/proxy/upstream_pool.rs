//! The upstream connection pool over real sockets: a proxy started in-process on port 0,
//! in front of small upstreams written here that count the connections they accept.

use std::convert::Infallible;
use std::future::ready;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use palisade_cluster::{Pki, wait};
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::harness::{Harness, Setup};

/// Longest wait for the upstream to see a connection closed or dialled again.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts a proxy in front of `upstream`, trusting `upstream_ca` if given.
async fn proxy(upstream: String, upstream_ca: Option<PathBuf>) -> Harness {
    Harness::start(Setup {
        upstream: Some(upstream),
        upstream_ca,
        ..Setup::default()
    })
    .await
}

/// Connections an upstream holds open after answering, for the test to close.
type Held = Arc<std::sync::Mutex<Vec<tokio::net::TcpStream>>>;

/// An HTTP/1.1 upstream that answers each connection's first request with `200 ok` and
/// a `Content-Length`, no `Connection: close` (so the proxy pools the connection), then
/// reads nothing more and holds the connection in `Held` until the test drops it: the
/// proxy's pooled connection is then closed by the upstream while it is idle. Returns
/// its address, the held connections and the count of connections it accepted.
async fn closing_upstream() -> (SocketAddr, Held, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let held: Held = Arc::default();
    let (count, hold) = (Arc::clone(&accepted), Arc::clone(&held));
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            count.fetch_add(1, Ordering::SeqCst);
            let hold = Arc::clone(&hold);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                if stream
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await
                    .is_ok()
                {
                    hold.lock().unwrap().push(stream);
                }
            });
        }
    });
    (addr, held, accepted)
}

/// A keep-alive upstream (hyper, HTTP/1.1 and h2c) answering `200 ok`, counting the
/// connections it accepted.
async fn keepalive_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let service = service_fn(|_req: http::Request<hyper::body::Incoming>| async {
                    Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, accepted)
}

/// Goal: a pooled connection that the upstream closed while it was idle is not used for
/// the next request: every request succeeds, each on a fresh connection. Method: an
/// upstream that answers one request per connection (keep-alive as far as the headers
/// say) and then holds it; after each answer the test closes the held connection (the
/// proxy has pooled it by then), then sends the next request; six requests, each must
/// be 200 `ok`, and the upstream must have accepted six connections.
#[tokio::test]
async fn a_connection_closed_by_the_upstream_while_idle_is_not_reused() {
    let (addr, held, accepted) = closing_upstream().await;
    let h = proxy(format!("http://{addr}"), None).await;
    for i in 0..6 {
        let (status, text) = get(&h, &format!("/k{i}")).await;
        assert_eq!(status, StatusCode::OK, "request {i}: {text}");
        assert_eq!(text, "ok", "request {i}");
        // The upstream closes the connection the proxy has just put back in its pool.
        // (The upstream holds it a moment after its answer was written: wait for that.)
        let closed = wait::poll(STEP_TIMEOUT, || {
            let closed: Vec<_> = held.lock().unwrap().drain(..).collect();
            ready((!closed.is_empty()).then_some(closed))
        })
        .await
        .expect("the upstream to hold the answered connection");
        assert_eq!(closed.len(), 1, "request {i}: one connection answered");
        drop(closed);
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        6,
        "one connection per request"
    );
    h.proxy.shutdown();
}

/// Goal: the pool reuses an idle keep-alive connection: requests one after another go
/// over a single upstream connection. Method: a keep-alive upstream that counts
/// connections; ten requests in sequence; exactly one connection accepted.
#[tokio::test]
async fn requests_in_sequence_reuse_one_upstream_connection() {
    let (addr, accepted) = keepalive_upstream().await;
    let h = proxy(format!("http://{addr}"), None).await;
    for i in 0..10 {
        assert_eq!(
            get(&h, &format!("/k{i}")).await,
            (StatusCode::OK, "ok".to_owned())
        );
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    h.proxy.shutdown();
}

/// An h2-only TLS upstream with a throwaway certificate, answering `over h2`.
struct H2Upstream {
    addr: SocketAddr,
    /// The certificate's CA, for `upstream_ca`.
    ca_path: PathBuf,
    accepted: Arc<AtomicUsize>,
    /// The version of each request it served.
    versions: Arc<std::sync::Mutex<Vec<http::Version>>>,
    /// Its connections' tasks, to close them.
    connections: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    _dir: tempfile::TempDir,
}

async fn h2_tls_upstream() -> H2Upstream {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::issue(dir.path(), &["upstream"]).unwrap();
    let ca_path = pki.ca();
    let mut tls = pki.server_config("upstream").unwrap();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let versions = Arc::new(std::sync::Mutex::new(Vec::new()));
    let connections = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (count, record, tasks) = (
        Arc::clone(&accepted),
        Arc::clone(&versions),
        Arc::clone(&connections),
    );
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            count.fetch_add(1, Ordering::SeqCst);
            let (acceptor, record) = (acceptor.clone(), Arc::clone(&record));
            let task = tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    record.lock().unwrap().push(req.version());
                    async {
                        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(
                            b"over h2",
                        ))))
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
            tasks.lock().unwrap().push(task);
        }
    });
    H2Upstream {
        addr,
        ca_path,
        accepted,
        versions,
        connections,
        _dir: dir,
    }
}

/// GETs `path` from the proxy: status and text.
async fn get(h: &Harness, path: &str) -> (StatusCode, String) {
    let response = h.client.get(h.data(path)).send().await.unwrap();
    (response.status(), response.text().await.unwrap())
}

/// Goal: an `https://` upstream that picks HTTP/2 by ALPN is reached over one shared,
/// multiplexed connection: requests in sequence and concurrent ones all succeed, all
/// arrive as HTTP/2, over a single connection. Method: an h2-only TLS upstream with a
/// throwaway certificate (trusted through `upstream_ca`) that records each request's
/// version and counts connections; five requests in sequence, then eight at once.
#[tokio::test]
async fn an_h2_upstream_over_tls_shares_one_connection() {
    let upstream = h2_tls_upstream().await;
    let upstream_url = format!("https://localhost:{}", upstream.addr.port());
    let h = Arc::new(proxy(upstream_url, Some(upstream.ca_path.clone())).await);
    for i in 0..5 {
        let (status, text) = get(&h, &format!("/h2/{i}")).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(text, "over h2");
    }
    let concurrent: Vec<_> = (5..13)
        .map(|i| {
            let h = Arc::clone(&h);
            tokio::spawn(async move { get(&h, &format!("/h2/{i}")).await })
        })
        .collect();
    for task in concurrent {
        let (status, text) = task.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{text}");
    }
    let versions = upstream.versions.lock().unwrap().clone();
    assert_eq!(versions.len(), 13);
    assert!(
        versions.iter().all(|v| *v == http::Version::HTTP_2),
        "{versions:?}"
    );
    assert_eq!(
        upstream.accepted.load(Ordering::SeqCst),
        1,
        "one multiplexed connection"
    );
    h.proxy.shutdown();
}

/// Goal: when the upstream closes the shared HTTP/2 connection, the proxy dials a new
/// one: requests are served again, over a second connection. Method: the h2 TLS
/// upstream; one request; the upstream's side of the connection is dropped; requests
/// until one succeeds (a request racing the close may fail, as on any connection an
/// upstream drops without `GOAWAY`), with a deadline; then five more must all succeed,
/// and the upstream must have accepted exactly two connections.
#[tokio::test]
async fn a_closed_h2_upstream_connection_is_dialled_again() {
    let upstream = h2_tls_upstream().await;
    let upstream_url = format!("https://localhost:{}", upstream.addr.port());
    let h = proxy(upstream_url, Some(upstream.ca_path.clone())).await;
    assert_eq!(get(&h, "/first").await.0, StatusCode::OK);
    for task in upstream.connections.lock().unwrap().drain(..) {
        task.abort();
    }
    wait::poll(STEP_TIMEOUT, || async {
        (get(&h, "/again").await.0 == StatusCode::OK).then_some(())
    })
    .await
    .expect("a request to succeed after the close");
    for i in 0..5 {
        let (status, text) = get(&h, &format!("/after/{i}")).await;
        assert_eq!(status, StatusCode::OK, "{text}");
    }
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 2);
    h.proxy.shutdown();
}
