//! The proxy's transport and limits, end to end: body and header limits, slow clients,
//! TLS from PEM files, cleartext HTTP/2, and graceful shutdown.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use palisade_cluster::{Pki, wait};
use palisade_protocol::DEFAULT_SCOPE;
use palisade_protocol::headers::FENCING_TOKEN;
use palisade_tests::client::{put, send};
use palisade_tests::fixtures::admin;
use palisade_tests::process::{ProxyProcess, start_proxy};
use palisade_tests::upstream::RecordingUpstream;

/// Sends raw bytes on a fresh connection and returns everything the proxy answers until
/// it closes the connection or `timeout` passes.
fn raw_exchange(addr: std::net::SocketAddr, request: &[u8], timeout: Duration) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(timeout)).unwrap();
    stream.write_all(request).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// A recording upstream and a proxy in front of it whose `limits.body_bytes_max` is 1 KiB.
pub(crate) async fn proxy_with_a_1_kib_body_cap(dir: &Path) -> (RecordingUpstream, ProxyProcess) {
    palisade_tests::fixtures::proxy_with_upstream(dir, "[limits]\nbody_bytes_max = 1024\n").await
}

/// Goal: an oversize body gets 413, with or without Content-Length, never arrives whole
/// upstream, and one refused by its Content-Length does not raise the fence. Method: a
/// 1 KiB limit; PUT 1024 bytes, 1025 bytes with token 2, and a chunked body of 1600
/// bytes; read what arrived upstream and the fence.
#[tokio::test]
async fn oversize_body_gets_413_and_is_not_forwarded() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (upstream, proxy) = proxy_with_a_1_kib_body_cap(dir.path()).await;

    assert_eq!(
        put(&proxy.url("/k"), 1, &"x".repeat(1024)).await.status,
        StatusCode::OK
    );
    let big = put(&proxy.url("/k"), 2, &"x".repeat(1025)).await;
    assert_eq!(big.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(big.problem().map(|p| p.status), Some(413));

    // A chunked body gives no size up front: the limit applies while it streams, after
    // admission (so with the current token 1: an admitted chunked write with a higher
    // token would have raised the fence from its head).
    let chunk = "y".repeat(800);
    let chunked = format!(
        "PUT /k HTTP/1.1\r\nHost: x\r\n{FENCING_TOKEN}: 1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{chunk}\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len(),
        chunk.len()
    );
    let answer = raw_exchange(proxy.addr, chunked.as_bytes(), Duration::from_secs(10));
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    assert_eq!(
        upstream.arrived().len(),
        1,
        "only the request within the limit arrived whole"
    );
    let fence = admin(&proxy).fence(DEFAULT_SCOPE).await.unwrap();
    assert_eq!(
        fence.token, 1,
        "a refused oversize write does not raise the fence"
    );
}

/// Goal: an oversize request head gets 431 and is not forwarded. Method: a raw GET with
/// a 64 KiB header.
#[tokio::test]
async fn oversize_headers_get_431() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);
    let big = "v".repeat(64 * 1024);
    let request = format!("GET /k HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n");
    let answer = raw_exchange(proxy.addr, request.as_bytes(), Duration::from_secs(10));
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(upstream.arrived().is_empty());
}

/// Goal: a client that never finishes its request head is disconnected after the header
/// read timeout (not before), while a prompt client on another connection is served.
/// Method: a 500 ms header timeout; half a request head on one connection, a PUT on
/// another; time until the proxy closes the first.
#[tokio::test]
async fn slow_headers_time_out() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (upstream, proxy) = palisade_tests::fixtures::proxy_with_upstream(
        dir.path(),
        "[limits]\nheader_read_timeout_ms = 500\n",
    )
    .await;

    let started = Instant::now();
    let addr = proxy.addr;
    let slow = tokio::task::spawn_blocking(move || {
        raw_exchange(
            addr,
            b"PUT /k HTTP/1.1\r\nHost: x\r\nFencing-To",
            Duration::from_secs(20),
        )
    });
    assert_eq!(
        put(&proxy.url("/k"), 1, "prompt").await.status,
        StatusCode::OK
    );
    let answer = slow.await.unwrap();
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(15),
        "the slow connection was closed by the proxy, not the test's read timeout ({elapsed:?})"
    );
    assert!(
        elapsed >= Duration::from_millis(450),
        "the proxy closed the slow connection after {elapsed:?}, before its 500 ms header timeout"
    );
    assert!(
        !answer.starts_with("HTTP/1.1 2"),
        "the incomplete request was not served: {answer}"
    );
    assert_eq!(upstream.arrived().len(), 1);
}

/// Goal: cleartext HTTP/2 (prior knowledge) is served and fenced like HTTP/1.1. Method:
/// an h2-only client writes with token 1, then 0.
#[tokio::test]
async fn h2c_clients_are_served() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_proxy(dir.path(), &[]);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let request = Request::builder()
        .method(Method::PUT)
        .uri(proxy.url("/h2/key"))
        .header(FENCING_TOKEN, "1")
        .body(Full::new(Bytes::from_static(b"over h2")))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.version(), Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::OK);
    let stale = Request::builder()
        .method(Method::PUT)
        .uri(proxy.url("/h2/key"))
        .header(FENCING_TOKEN, "0")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(
        client.request(stale).await.unwrap().status(),
        StatusCode::CONFLICT,
        "token 0 is below the fence 1"
    );
}

/// Goal: the TLS listener serves h2 (offered by ALPN) with a certificate from PEM files,
/// and does not serve cleartext. Method: a certificate of a CA issued in the test, a
/// client that trusts the CA; PUT, GET; then a cleartext GET.
#[tokio::test]
async fn tls_listener_serves_with_a_generated_certificate() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (proxy, pki) = palisade_tests::fixtures::tls_proxy(dir.path(), &[]);
    let tls = pki.client_config(None).unwrap();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .enable_http2()
        .build();
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let url = format!("https://localhost:{}/secure/key", proxy.addr.port());
    let request = Request::builder()
        .method(Method::PUT)
        .uri(&url)
        .header(FENCING_TOKEN, "2")
        .body(Full::new(Bytes::from_static(b"secret")))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.version(), Version::HTTP_2, "ALPN offers h2");
    let get = Request::builder()
        .uri(&url)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(get).await.unwrap();
    assert_eq!(response.headers()[FENCING_TOKEN], "2");
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "secret"
    );

    // Cleartext to the TLS port is not served.
    let plain =
        palisade_tests::client::try_send(Method::GET, &proxy.url("/secure/key"), &[], "").await;
    assert!(plain.is_err() || plain.unwrap().status != StatusCode::OK);
}

/// Goal: on SIGTERM the proxy stops accepting, finishes the request in flight, then
/// exits 0. Method: hold a write at the upstream, SIGTERM, wait until connections are
/// refused, release; read the answer and the exit code.
#[tokio::test]
async fn graceful_shutdown_completes_in_flight_request() {
    sigterm_finishes_the_request_in_flight(&[]).await;
}

/// The test above, for a proxy started with `extra` flags as well (also run by
/// `proxy_reuseport` with its threads): holds a write at the upstream, sends SIGTERM,
/// waits until new connections are refused, releases the write, and checks its answer
/// and the exit code.
pub(crate) async fn sigterm_finishes_the_request_in_flight(extra: &[&str]) {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let upstream_url = upstream.url();
    let mut args = vec!["--upstream", upstream_url.as_str()];
    args.extend_from_slice(extra);
    let mut proxy = start_proxy(dir.path(), &args);
    upstream.hold("/slow");
    let url = proxy.url("/slow");
    let in_flight = tokio::spawn(async move { put(&url, 1, "finish me").await });
    wait::poll(Duration::from_secs(10), || async {
        (!upstream.arrived().is_empty()).then_some(())
    })
    .await
    .expect("timed out waiting for the write to reach the upstream");

    proxy
        .guard
        .signal(nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let addr = proxy.addr;
    wait::poll(Duration::from_secs(10), || async {
        TcpStream::connect(addr).is_err().then_some(())
    })
    .await
    .expect("timed out waiting for the proxy to stop accepting");
    upstream.release("/slow");
    let answer = in_flight.await.unwrap();
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "the in-flight request completed"
    );
    assert_eq!(upstream.applied().len(), 1);
    let code = tokio::task::spawn_blocking(move || {
        proxy.guard.wait_exit(Duration::from_secs(20)).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0));
}

/// Goal: an `https://` upstream is reached with rustls, trusting the CA bundle given with
/// `--upstream-ca`; without it (platform roots only) the self-signed upstream is refused
/// with 502 and nothing is applied. Method: a self-signed HTTPS upstream; one proxy with
/// the bundle, one without.
#[tokio::test]
async fn https_upstream_is_trusted_through_the_configured_ca_bundle() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::issue(&dir.path().join("upstream-pki"), &["upstream"]).unwrap();
    let ca_path = pki.ca();
    let (addr, seen) = tls_upstream(&pki).await;
    let upstream = format!("https://localhost:{}", addr.port());

    let proxy = start_proxy(
        &dir.path().join("trusting"),
        &[
            "--upstream",
            &upstream,
            "--upstream-ca",
            ca_path.to_str().unwrap(),
        ],
    );
    let answer = put(&proxy.url("/over/tls"), 4, "secret").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(answer.text(), "applied over TLS");
    assert_eq!(seen.lock().unwrap().clone(), vec![Some("4".to_owned())]);

    let untrusting = start_proxy(&dir.path().join("untrusting"), &["--upstream", &upstream]);
    let refused = put(&untrusting.url("/over/tls"), 5, "secret").await;
    assert_eq!(
        refused.status,
        StatusCode::BAD_GATEWAY,
        "{}",
        refused.text()
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "nothing reached the untrusted upstream"
    );
}

/// A minimal HTTPS upstream on a free port that records each request's `Fencing-Token`.
async fn tls_upstream(
    pki: &Pki,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<Option<String>>>>,
) {
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use hyper_util::server::conn::auto;

    let mut config = pki.server_config("upstream").unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = std::sync::Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            let record = std::sync::Arc::clone(&record);
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let token = req
                        .headers()
                        .get(FENCING_TOKEN)
                        .map(|v| v.to_str().unwrap().to_owned());
                    record.lock().unwrap().push(token);
                    async {
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from_static(b"applied over TLS"),
                        )))
                    }
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// Goal: `limits.upstream_requests_max` bounds requests in flight to the upstream: with
/// its one slot held, the next request waits up to the upstream connect timeout, then
/// gets 503, and never reaches the upstream. Method: a cap of 1; hold one write at the
/// upstream, GET another path; release, GET again.
#[tokio::test]
async fn upstream_requests_are_capped() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (upstream, proxy) = palisade_tests::fixtures::proxy_with_upstream(
        dir.path(),
        "[limits]\nupstream_requests_max = 1\nupstream_connect_timeout_ms = 300\n",
    )
    .await;
    let held = palisade_tests::fixtures::hold_in_flight(&upstream, &proxy, "/slow", 1).await;
    let refused = send(Method::GET, &proxy.url("/other"), &[], "").await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.text()
    );
    assert!(
        refused.text().contains("1 requests are in flight"),
        "{}",
        refused.text()
    );
    assert_eq!(
        upstream.arrived().len(),
        1,
        "the refused request never reached the upstream"
    );
    upstream.release("/slow");
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    assert_eq!(
        send(Method::GET, &proxy.url("/other"), &[], "")
            .await
            .status,
        StatusCode::OK
    );
}
