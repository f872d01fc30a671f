//! Idle keep-alive connections parked without their HTTP state, end to end: after about a
//! second with nothing in flight, an HTTP/1.1 connection's hyper state and buffers are
//! dropped and the bare stream waits for the client's next bytes. These tests hold such
//! connections open to a real `palisade proxy` and check that nothing a client can see
//! changed: the next request on a parked connection is served, the keep-alive timeout
//! still closes it, and at `connections_max` parked connections are the idle ones evicted.
//!
//! Each test waits for the proxy's gauge `palisade_proxy_connections_parked` to count its
//! connections, so that what follows happens to parked connections, not to connections
//! hyper still serves.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use palisade_cluster::wait;
use palisade_tests::client::send;
use palisade_tests::process::start_proxy;
use palisade_tests::upstream::RecordingUpstream;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Keep-alive connections held in the tests that count on all of them being parked.
const HELD_CONNECTIONS: usize = 50;
/// Bound for the proxy to park connections: the release time is about a second (at most
/// two after the last response), so this is generous on a loaded 2-core machine.
const PARKED_WITHIN: Duration = Duration::from_secs(20);
/// Bound for any one answer or close the tests read.
const READ_WITHIN: Duration = Duration::from_secs(10);

/// The sum of the samples of metric `name` whose labels include every one of `labels`,
/// in the proxy's metrics page; 0 when absent.
async fn metric(admin: SocketAddr, name: &str, labels: &[&str]) -> f64 {
    let page = send(
        http::Method::GET,
        &format!("http://{admin}/metrics"),
        &[],
        "",
    )
    .await
    .text();
    page.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")))
        .filter(|line| labels.iter().all(|l| line.contains(l)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Client connections the proxy has parked now.
async fn parked(admin: SocketAddr) -> f64 {
    metric(
        admin,
        "palisade_proxy_connections_parked",
        &["listener=\"client\""],
    )
    .await
}

/// Waits until the proxy has parked at least `count` client connections.
async fn wait_parked(admin: SocketAddr, count: usize) {
    wait::poll(PARKED_WITHIN, || async {
        #[allow(clippy::cast_precision_loss)]
        (parked(admin).await >= count as f64).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("timed out waiting for {count} connections to be parked"));
}

/// Sends one keep-alive GET of `path` on `stream` and reads its answer: the status line.
async fn get<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, path: &str) -> String {
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    tokio::time::timeout(READ_WITHIN, read_response(stream))
        .await
        .unwrap_or_else(|_| panic!("no answer to GET {path} within {READ_WITHIN:?}"))
}

/// Reads one HTTP/1.1 response with a `Content-Length` body: its status line, or what
/// ended the stream before it.
async fn read_response<S: AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(0) => return format!("(closed after {:?})", String::from_utf8_lossy(&head)),
            Ok(_) => head.push(byte[0]),
            Err(e) => return format!("(read failed: {e})"),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("a Content-Length in {head:?}"));
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    head.lines().next().unwrap_or_default().to_owned()
}

/// `count` keep-alive connections to the proxy at `addr`, each of which has sent one GET
/// and read its 200: connections the proxy will park once they idle.
async fn served_connections(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(count);
    for i in 0..count {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let status = get(&mut stream, &format!("/idle/{i}")).await;
        assert!(
            status.starts_with("HTTP/1.1 200"),
            "first GET {i}: {status}"
        );
        held.push(stream);
    }
    held
}

/// Reads until the proxy closes `stream`: whether it did within [`READ_WITHIN`], with
/// nothing sent.
async fn closed_by_proxy(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(READ_WITHIN, stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Goal: a keep-alive connection whose HTTP state was released while it idled is served
/// again: its next request, whole or split across writes, gets 200.
/// Method: 50 connections send one GET each and read the answer; wait until the proxy
/// has parked all 50; then each sends a second GET (every tenth in two writes, the head
/// cut in the middle) and must read 200; then all are parked again, and a third round
/// is answered too.
#[tokio::test]
async fn parked_keepalive_connections_serve_their_next_request() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);

    let mut held = served_connections(proxy.addr, HELD_CONNECTIONS).await;
    for round in 2..=3 {
        wait_parked(proxy.admin, HELD_CONNECTIONS).await;
        for (i, stream) in held.iter_mut().enumerate() {
            let status = if i % 10 == 0 {
                // The head in two writes: the first part wakes the parked connection.
                stream.write_all(b"GET /idle/split HT").await.unwrap();
                stream.flush().await.unwrap();
                tokio::task::yield_now().await;
                stream
                    .write_all(b"TP/1.1\r\nhost: x\r\n\r\n")
                    .await
                    .unwrap();
                tokio::time::timeout(READ_WITHIN, read_response(stream))
                    .await
                    .unwrap()
            } else {
                get(stream, &format!("/idle/{i}/{round}")).await
            };
            assert!(
                status.starts_with("HTTP/1.1 200"),
                "GET {round} on parked connection {i}: {status}"
            );
        }
    }
    assert!(
        metric(
            proxy.admin,
            "palisade_proxy_connection_closes_total",
            &["listener=\"client\""]
        )
        .await
            < 0.5,
        "the proxy closed none of the held connections"
    );
}

/// Goal: the keep-alive timeout still closes a parked connection, counted as
/// `keepalive-timeout`, and hyper's own header timer (which runs between requests while
/// hyper serves a connection) no longer closes idle keep-alive connections early.
/// Method: a 2 s header timeout and a 4 s keep-alive timeout; 5 connections send one GET
/// each; wait until parked; read each until the proxy closes it; the close counters
/// show 5 `keepalive-timeout` closes and no `header-timeout` one.
#[tokio::test]
async fn parked_connection_is_closed_at_the_keepalive_timeout() {
    const COUNT: usize = 5;
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (_upstream, proxy) = palisade_tests::fixtures::proxy_with_upstream(
        dir.path(),
        "[limits]\nheader_read_timeout_ms = 2000\nkeepalive_timeout_ms = 4000\n",
    )
    .await;
    let mut held = served_connections(proxy.addr, COUNT).await;
    wait_parked(proxy.admin, COUNT).await;
    for (i, stream) in held.iter_mut().enumerate() {
        assert!(
            closed_by_proxy(stream).await,
            "parked connection {i} still open {READ_WITHIN:?} after being parked"
        );
    }
    let closes = |reason: &'static str| {
        let admin = proxy.admin;
        async move {
            metric(
                admin,
                "palisade_proxy_connection_closes_total",
                &["listener=\"client\"", &format!("reason=\"{reason}\"")],
            )
            .await
        }
    };
    wait::poll(Duration::from_secs(5), || async {
        #[allow(clippy::cast_precision_loss)]
        (closes("keepalive-timeout").await >= COUNT as f64).then_some(())
    })
    .await
    .expect("timed out waiting for the keep-alive closes to be counted");
    assert!(
        closes("header-timeout").await < 0.5,
        "no idle keep-alive connection was closed by a header timer"
    );
    assert!(parked(proxy.admin).await < 0.5, "nothing is left parked");
}

/// Goal: parking opens no slow-loris hole: a parked connection woken by part of a head
/// that then stalls is closed at the header timeout, counted from that first byte, not
/// kept until the keep-alive timeout.
/// Method: a 2 s header timeout and a 60 s keep-alive timeout; 3 connections send one
/// GET each; wait until parked; each sends the start of a head and nothing more; each
/// must be closed by the proxy within 10 s (the keep-alive timeout is far later), with
/// nothing but a 408 sent before the close, and none is left parked.
#[tokio::test]
async fn parked_connection_woken_by_a_partial_head_is_closed_at_the_header_timeout() {
    const COUNT: usize = 3;
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (_upstream, proxy) = palisade_tests::fixtures::proxy_with_upstream(
        dir.path(),
        "[limits]\nheader_read_timeout_ms = 2000\nkeepalive_timeout_ms = 60000\n",
    )
    .await;
    let mut held = served_connections(proxy.addr, COUNT).await;
    wait_parked(proxy.admin, COUNT).await;
    for stream in &mut held {
        stream
            .write_all(b"PUT /slow HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        stream.flush().await.unwrap();
    }
    for (i, stream) in held.iter_mut().enumerate() {
        let mut buf = [0u8; 256];
        let read = tokio::time::timeout(READ_WITHIN, stream.read(&mut buf)).await;
        match read {
            Ok(Ok(0) | Err(_)) => {}
            Ok(Ok(n)) => {
                // hyper may answer a timed-out head with 408 before closing: that is a
                // close too, as long as the connection then ends.
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                assert!(
                    text.starts_with("HTTP/1.1 408"),
                    "connection {i}: only a 408 may come back for a stalled head, got {text:?}"
                );
                assert!(
                    closed_by_proxy(stream).await,
                    "connection {i} still open after its 408"
                );
            }
            Err(elapsed) => panic!(
                "connection {i} with a stalled head still open {READ_WITHIN:?} later \
                 ({elapsed}): the header timeout (2 s) did not apply after parking"
            ),
        }
    }
    assert!(parked(proxy.admin).await < 0.5, "nothing is left parked");
}

/// Goal: at `connections_max`, parked connections are the idle ones evicted, the one idle
/// the longest first, and the new clients are served.
/// Method: `connections_max = 10`; 10 connections send one GET each in turn; wait until
/// all are parked; 3 new clients each GET (and stay connected) and get 200; the 3
/// connections whose last answer is oldest are closed, with 3 `evicted-idle` closes
/// counted; the other 7 are still served.
#[tokio::test]
async fn eviction_at_the_connection_limit_takes_parked_connections_oldest_first() {
    const LIMIT: usize = 10;
    const NEW: usize = 3;
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (_upstream, proxy) = palisade_tests::fixtures::proxy_with_upstream(
        dir.path(),
        &format!("[limits]\nconnections_max = {LIMIT}\n"),
    )
    .await;
    let mut held = Vec::new();
    for i in 0..LIMIT {
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        let status = get(&mut stream, &format!("/idle/{i}")).await;
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        held.push(stream);
    }
    wait_parked(proxy.admin, LIMIT).await;
    // The new clients stay connected, so that each needs a slot of its own.
    let mut new_clients = Vec::new();
    for i in 0..NEW {
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        let status = get(&mut stream, &format!("/new/{i}")).await;
        assert!(
            status.starts_with("HTTP/1.1 200"),
            "new client {i}: {status}"
        );
        new_clients.push(stream);
    }
    for (i, stream) in held.iter_mut().take(NEW).enumerate() {
        assert!(
            closed_by_proxy(stream).await,
            "parked connection {i}, among the {NEW} idle the longest, was evicted"
        );
    }
    let evicted = metric(
        proxy.admin,
        "palisade_proxy_connection_closes_total",
        &["listener=\"client\"", "reason=\"evicted-idle\""],
    )
    .await;
    #[allow(clippy::cast_precision_loss)]
    let expected = NEW as f64;
    assert!(
        (evicted - expected).abs() < 0.5,
        "one eviction per new client: {evicted}"
    );
    for (i, stream) in held.iter_mut().enumerate().skip(NEW) {
        let status = get(stream, &format!("/idle/{i}/again")).await;
        assert!(
            status.starts_with("HTTP/1.1 200"),
            "parked connection {i} kept its slot and is served: {status}"
        );
    }
}

/// Goal: a parked TLS connection (HTTP/1.1 by ALPN) is served again: the client's next
/// request, read through TLS to wake the connection, reaches hyper whole.
/// Method: a proxy with a certificate of a CA issued in the test; 5 TLS connections send one GET each;
/// wait until parked; each sends a second GET and must read 200.
#[tokio::test]
async fn parked_tls_connection_serves_its_next_request() {
    const COUNT: usize = 5;
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let (proxy, pki) =
        palisade_tests::fixtures::tls_proxy(dir.path(), &["--upstream", &upstream.url()]);
    let mut config = pki.client_config(None).unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut held = Vec::new();
    for i in 0..COUNT {
        let tcp = TcpStream::connect(proxy.addr).await.unwrap();
        let mut tls = connector.connect(name.clone(), tcp).await.unwrap();
        let status = get(&mut tls, &format!("/tls/{i}")).await;
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        held.push(tls);
    }
    wait_parked(proxy.admin, COUNT).await;
    for (i, tls) in held.iter_mut().enumerate() {
        let status = get(tls, &format!("/tls/{i}/again")).await;
        assert!(
            status.starts_with("HTTP/1.1 200"),
            "GET on parked TLS connection {i}: {status}"
        );
    }
}
