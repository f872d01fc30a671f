//! Bodies stream through the proxy after admission, and requests reach the upstream as
//! the client sent them: a 1 GiB upload in bounded memory, unfinished bodies that do not
//! pile up, `Expect: 100-continue` answered only after admission, trailers, `Host`,
//! `X-Forwarded-For`, the body limits (size cap, idle timeout), and upgrades tunnelled on
//! the routes that allow them.
//!
//! Memory figures come from the proxy process's `/proc/PID/status` (`VmHWM`, its peak
//! resident set, and `VmRSS`). They are bounds the proxy must keep by design, asserted as
//! stated requirements, and they hold for the debug binary these tests run.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Version};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use palisade_cluster::wait;
use palisade_protocol::headers::FENCING_TOKEN;
use palisade_tests::client::{put, send};
use palisade_tests::fixtures::write_config;
use palisade_tests::process::{ProxyProcess, start_proxy};
use palisade_tests::upstream::RecordingUpstream;

const MIB: usize = 1024 * 1024;
/// MiB blocks of the large upload: 1 GiB.
const BLOCKS: u64 = 1024;
/// Connections of the unfinished-body flood.
const CONNECTIONS: usize = 60;
/// Body bytes each of them sends (of the 16 MiB it declares).
const SENT: usize = 15 * MIB;

/// A field of the proxy's `/proc/PID/status` in bytes (`VmRSS`, `VmHWM`).
fn proc_status_bytes(proxy: &ProxyProcess, field: &str) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", proxy.guard.pid().as_raw())).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc status"));
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("bad {field} line: {line}"));
    kib * 1024
}

/// Reads from `stream` until `pattern` has arrived (or the proxy closes, or `timeout`).
fn read_until(stream: &mut TcpStream, pattern: &str, timeout: Duration) -> String {
    stream.set_read_timeout(Some(timeout)).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(pattern) {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// PUTs 2 KiB to `path` with a declared length and `token`, through a proxy whose
/// `limit` (a config key) is 1 KiB; asserts it is refused with 413 naming the limit.
async fn put_declared_over_the_limit(proxy: &ProxyProcess, path: &str, token: u64, limit: &str) {
    let big = put(&proxy.url(path), token, vec![b'x'; 2048]).await;
    assert_eq!(big.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(big.text().contains(limit), "{}", big.text());
}

/// PUTs 1600 bytes to `path` chunked (so the length is known only once it crosses) with
/// token 1, through a proxy whose `limit` (a config key) is 1 KiB; asserts the raw answer
/// is a 413 (read until it names the limit).
async fn put_chunked_over_the_limit(proxy: &ProxyProcess, path: &str, limit: &str) {
    let chunk = "y".repeat(800);
    let chunked = format!(
        "PUT {path} HTTP/1.1\r\nHost: x\r\n{FENCING_TOKEN}: 1\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len(),
        chunk.len()
    );
    let (addr, limit) = (proxy.addr, limit.to_owned());
    let answer = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.write_all(chunked.as_bytes()).unwrap();
        read_until(&mut stream, &limit, Duration::from_secs(10))
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
}

/// The `i`-th MiB of the generated upload: a fixed block with its index written in, so
/// a lost, repeated or reordered block changes the checksum.
fn block(base: &[u8], i: u64) -> Vec<u8> {
    let mut b = base.to_vec();
    b[..8].copy_from_slice(&i.to_le_bytes());
    b
}

/// Goal: a 1 GiB upload reaches the upstream intact through the proxy, and the proxy's
/// peak resident memory stays under 64 MiB (bodies stream; nothing holds them whole).
/// Method: a counting upstream (length and SHA-256, no storage); a raw client writes a
/// 1 GiB Content-Length body generated 1 MiB at a time, hashing what it sends; compare
/// length and hash at the upstream, and read the proxy's `VmHWM`.
#[tokio::test]
async fn gigabyte_upload_arrives_intact_with_peak_rss_under_64_mib() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start_counting().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);
    let addr = proxy.addr;
    let (answer, sent_hash) = tokio::task::spawn_blocking(move || {
        let base: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
        let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
        let mut stream = TcpStream::connect(addr).unwrap();
        let head = format!(
            "PUT /big HTTP/1.1\r\nHost: x\r\n{FENCING_TOKEN}: 1\r\nContent-Length: {}\r\n\r\n",
            BLOCKS * MIB as u64
        );
        stream.write_all(head.as_bytes()).unwrap();
        for i in 0..BLOCKS {
            let b = block(&base, i);
            hash.update(&b);
            stream.write_all(&b).unwrap();
        }
        let answer = read_until(&mut stream, "applied", Duration::from_secs(120));
        (answer, hash.finish().as_ref().to_vec())
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let applied = upstream.applied();
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].body_len, BLOCKS * MIB as u64);
    assert_eq!(
        applied[0].body_sha256.map(|h| h.to_vec()),
        Some(sent_hash),
        "the body arrived intact"
    );
    let peak = proc_status_bytes(&proxy, "VmHWM");
    eprintln!("proxy VmHWM after a 1 GiB upload: {} KiB", peak / 1024);
    assert!(
        peak < 64 * MIB as u64,
        "peak RSS {} KiB is over 64 MiB",
        peak / 1024
    );
}

/// Goal: 60 connections each holding 15 MiB of a body they never finish keep the proxy
/// under 128 MiB RSS, and once they close the proxy recovers: the bodies fail at the
/// upstream (never applied) and their in-flight guards are released, so a higher token
/// is admitted at once.
/// Method: a counting upstream; 60 raw connections declare 16 MiB and send 15 MiB; wait
/// until the upstream has received all 900 MiB, read `VmRSS`; close them, wait for 60
/// aborted bodies at the upstream, then write with token 2.
#[tokio::test]
async fn sixty_unfinished_15_mib_bodies_stay_under_128_mib_rss_and_recover() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start_counting().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);
    let addr = proxy.addr;
    // The senders block while the proxy applies backpressure, and the recording upstream
    // runs on this test's runtime: they write from threads of their own.
    let senders = tokio::task::spawn_blocking(move || {
        let threads: Vec<_> = (0..CONNECTIONS)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut stream = TcpStream::connect(addr).unwrap();
                    let head = format!(
                        "PUT /flood HTTP/1.1\r\nHost: x\r\n{FENCING_TOKEN}: 1\r\nContent-Length: {}\r\n\r\n",
                        16 * MIB
                    );
                    stream.write_all(head.as_bytes()).unwrap();
                    let chunk = vec![b'f'; MIB];
                    for _ in 0..SENT / MIB {
                        stream.write_all(&chunk).unwrap();
                    }
                    stream
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect::<Vec<TcpStream>>()
    });
    let total = (CONNECTIONS * SENT) as u64;
    wait::poll(Duration::from_secs(120), || async {
        (upstream.body_bytes() >= total).then_some(())
    })
    .await
    .expect("timed out waiting for every sent body byte to reach the upstream");
    let streams = senders.await.unwrap();
    let rss = proc_status_bytes(&proxy, "VmRSS");
    eprintln!(
        "proxy VmRSS with {CONNECTIONS} unfinished 15 MiB bodies: {} KiB",
        rss / 1024
    );
    assert!(
        rss < 128 * MIB as u64,
        "RSS {} KiB is over 128 MiB",
        rss / 1024
    );
    assert!(upstream.applied().is_empty(), "no body was complete");

    drop(streams);
    wait::poll(Duration::from_secs(30), || async {
        (upstream.aborted() >= CONNECTIONS as u64).then_some(())
    })
    .await
    .expect("timed out waiting for the 60 broken bodies to fail at the upstream");
    let higher = put(&proxy.url("/flood"), 2, b"after").await;
    assert_eq!(
        higher.status,
        StatusCode::OK,
        "the guards of the broken bodies were released: {}",
        higher.text()
    );
    assert_eq!(
        upstream.applied().len(),
        1,
        "only the complete write applied"
    );
    let rss = proc_status_bytes(&proxy, "VmRSS");
    eprintln!("proxy VmRSS after they closed: {} KiB", rss / 1024);
    assert!(rss < 128 * MIB as u64, "RSS {} KiB after close", rss / 1024);
}

/// Goal: a stale write sent with `Expect: 100-continue` is answered 409 without `100
/// Continue`, and none of its body reaches the upstream; an admitted one gets `100
/// Continue` and is applied.
/// Method: raise the fence to 5; send a head with token 1, `Expect` and a 1 MiB length,
/// read the answer without sending any body; then the same with token 5, sending the
/// body after `100 Continue`.
#[tokio::test]
async fn stale_write_with_expect_continue_is_refused_before_any_body() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);
    assert_eq!(
        put(&proxy.url("/k"), 5, b"five").await.status,
        StatusCode::OK
    );
    let before = upstream.body_bytes();
    let addr = proxy.addr;

    let stale = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        let head = format!(
            "PUT /k HTTP/1.1\r\nHost: x\r\n{FENCING_TOKEN}: 1\r\nExpect: 100-continue\r\nContent-Length: {MIB}\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).unwrap();
        read_until(&mut stream, "stale", Duration::from_secs(10))
    })
    .await
    .unwrap();
    assert!(stale.starts_with("HTTP/1.1 409"), "{stale}");
    assert!(!stale.contains("100 Continue"), "{stale}");
    assert_eq!(
        upstream.body_bytes(),
        before,
        "no body byte reached the upstream"
    );
    assert_eq!(
        upstream.arrived().len(),
        1,
        "the stale write was not forwarded"
    );

    let admitted = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        let head = format!(
            "PUT /k HTTP/1.1\r\nHost: x\r\n{FENCING_TOKEN}: 5\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).unwrap();
        let cont = read_until(&mut stream, "\r\n\r\n", Duration::from_secs(10));
        stream.write_all(b"body").unwrap();
        (cont, read_until(&mut stream, "applied", Duration::from_secs(10)))
    })
    .await
    .unwrap();
    assert!(
        admitted.0.starts_with("HTTP/1.1 100 Continue"),
        "{admitted:?}"
    );
    assert!(admitted.1.contains("HTTP/1.1 200"), "{admitted:?}");
    assert_eq!(upstream.applied().last().unwrap().body.as_ref(), b"body");
}

/// Goal: request trailers reach the upstream (S3 clients send checksums in them), and
/// requests reach it alike through either upstream exchange (the proxy's own, the
/// default, and hyper's client, `upstream_http1_client = "hyper"`).
/// Method: through a proxy of each kind, a raw chunked PUT declaring `Trailer:
/// x-checksum` and ending with that trailer, then a PUT with a length; compare what the
/// upstream received.
#[tokio::test]
async fn request_trailers_reach_the_upstream_through_either_exchange() {
    crate::use_tested_binary();
    let upstream = RecordingUpstream::start().await;
    let own_dir = tempfile::tempdir().unwrap();
    let own = start_proxy(own_dir.path(), &["--upstream", &upstream.url()]);
    let hyper_dir = tempfile::tempdir().unwrap();
    let config = write_config(hyper_dir.path(), "upstream_http1_client = \"hyper\"\n");
    let hyper = start_proxy(
        hyper_dir.path(),
        &["--upstream", &upstream.url(), "--config", &config],
    );
    for proxy in [&own, &hyper] {
        let addr = proxy.addr;
        let answer = tokio::task::spawn_blocking(move || {
            let mut stream = TcpStream::connect(addr).unwrap();
            let request = format!(
                "PUT /t HTTP/1.1\r\nHost: x\r\n{FENCING_TOKEN}: 1\r\nTransfer-Encoding: chunked\r\nTrailer: x-checksum\r\n\r\n5\r\nhello\r\n0\r\nx-checksum: abc123\r\n\r\n"
            );
            stream.write_all(request.as_bytes()).unwrap();
            read_until(&mut stream, "applied", Duration::from_secs(10))
        })
        .await
        .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let answer = put(&proxy.url("/len"), 1, b"twelve bytes").await;
        assert_eq!(answer.status, StatusCode::OK);
    }
    let applied = upstream.applied();
    assert_eq!(applied.len(), 4);
    for (i, request) in applied.iter().enumerate() {
        let (path, body) = if i % 2 == 0 {
            ("/t", &b"hello"[..])
        } else {
            ("/len", &b"twelve bytes"[..])
        };
        assert_eq!((request.path.as_str(), request.body.as_ref()), (path, body));
    }
    for chunked in [&applied[0], &applied[2]] {
        let trailers = chunked.trailers.as_ref().expect("trailers arrived");
        assert_eq!(trailers["x-checksum"], "abc123");
        assert_eq!(chunked.headers["transfer-encoding"], "chunked");
    }
    assert_eq!(applied[1].headers["content-length"], "12");
    assert_eq!(applied[3].headers["content-length"], "12");
}

/// Goal: the client's `Host` reaches the upstream unchanged (`SigV4` signs it); an HTTP/2
/// client's `:authority` arrives as `Host`; `upstream_host = "upstream"` rewrites it to
/// the upstream's authority.
/// Method: a PUT with `Host: bucket.s3.example`, an h2c PUT, then a second proxy with
/// `upstream_host = "upstream"`; read the `Host` each request arrived with.
#[tokio::test]
async fn host_is_forwarded_unchanged_unless_configured_to_rewrite() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);
    let token = ("Fencing-Token", "1");
    let answer = send(
        Method::PUT,
        &proxy.url("/h"),
        &[token, ("Host", "bucket.s3.example")],
        b"x",
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(upstream.applied()[0].headers["host"], "bucket.s3.example");

    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let request = Request::builder()
        .method(Method::PUT)
        .uri(proxy.url("/h2"))
        .header(FENCING_TOKEN, "1")
        .body(Full::new(Bytes::from_static(b"y")))
        .unwrap();
    let response = h2.request(request).await.unwrap();
    assert_eq!(response.version(), Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        upstream.applied()[1].headers["host"],
        proxy.addr.to_string().as_str(),
        ":authority arrives as Host"
    );

    let dir2 = tempfile::tempdir().unwrap();
    let config = write_config(dir2.path(), "upstream_host = \"upstream\"\n");
    let rewriting = start_proxy(
        dir2.path(),
        &["--upstream", &upstream.url(), "--config", &config],
    );
    let answer = send(
        Method::PUT,
        &rewriting.url("/h"),
        &[token, ("Host", "bucket.s3.example")],
        b"z",
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        upstream.applied()[2].headers["host"],
        upstream.addr.to_string().as_str()
    );
}

/// Goal: a client cannot forge its origin: `X-Forwarded-For` is replaced by the peer's
/// IP; from a trusted proxy it is kept and the peer appended.
/// Method: PUT with `X-Forwarded-For: 6.6.6.6` from 127.0.0.1 to a proxy with no trusted
/// proxies, then to one that trusts 127.0.0.1; read the values the upstream received.
#[tokio::test]
async fn forged_forwarded_for_is_replaced_and_a_trusted_one_appended_to() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);
    let headers = [("Fencing-Token", "1"), ("X-Forwarded-For", "6.6.6.6")];
    assert_eq!(
        send(Method::PUT, &proxy.url("/f"), &headers, b"x")
            .await
            .status,
        StatusCode::OK
    );
    let values = |i: usize| -> Vec<String> {
        upstream.applied()[i]
            .headers
            .get_all("x-forwarded-for")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(values(0), ["127.0.0.1"], "the forged value is replaced");

    let dir2 = tempfile::tempdir().unwrap();
    let config = write_config(dir2.path(), "trusted_proxies = [\"127.0.0.1\"]\n");
    let trusting = start_proxy(
        dir2.path(),
        &["--upstream", &upstream.url(), "--config", &config],
    );
    assert_eq!(
        send(Method::PUT, &trusting.url("/f"), &headers, b"x")
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        values(1).join(", "),
        "6.6.6.6, 127.0.0.1",
        "a trusted proxy's value is kept and the peer appended"
    );
}

/// Goal: a body whose client stops sending is cut off after `body_idle_timeout_ms`: 408
/// when the upstream has not answered, never applied, and its scope's barrier released;
/// both for a body read whole before it is sent (declared at most 64 KiB: the upstream
/// never sees the request) and for one that streams (declared longer: the upstream's
/// exchange breaks off).
/// Method: a 300 ms idle timeout; raw PUTs declaring 1000 and 100,000 bytes and sending
/// 10; read each answer; then a higher token writes.
#[tokio::test]
async fn idle_body_is_cut_off_with_408_and_releases_its_scope() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (upstream, proxy) = palisade_tests::fixtures::proxy_with_upstream(
        dir.path(),
        "[limits]\nbody_idle_timeout_ms = 300\n",
    )
    .await;
    let addr = proxy.addr;
    let stall = |declared: u64| {
        tokio::task::spawn_blocking(move || {
            let mut stream = TcpStream::connect(addr).unwrap();
            let head = format!(
                "PUT /slow HTTP/1.1\r\nHost: x\r\n{FENCING_TOKEN}: 1\r\nContent-Length: {declared}\r\n\r\n0123456789"
            );
            stream.write_all(head.as_bytes()).unwrap();
            read_until(
                &mut stream,
                "limits.body_idle_timeout_ms",
                Duration::from_secs(20),
            )
        })
    };

    let answer = stall(1000).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        upstream.arrived().is_empty() && upstream.aborted() == 0 && upstream.body_bytes() == 0,
        "a body read ahead whole and cut off is never sent"
    );

    let answer = stall(100_000).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    wait::poll(Duration::from_secs(10), || async {
        (upstream.aborted() == 1).then_some(())
    })
    .await
    .expect("timed out waiting for the cut-off body to fail at the upstream");
    assert!(upstream.applied().is_empty());
    assert_eq!(
        put(&proxy.url("/slow"), 2, b"next").await.status,
        StatusCode::OK
    );
}

/// Goal: with an operator's `body_bytes_max`, a declared length over it is 413 before
/// admission (not forwarded, the fence unmoved), and a chunked body that crosses it is
/// cut off with 413 and never applied.
/// Method: a 1 KiB cap; PUT 2 KiB with Content-Length and token 7; then a raw chunked
/// PUT of 1600 bytes with token 1; read the upstream and the fence.
#[tokio::test]
async fn body_over_the_operator_cap_is_413() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (upstream, proxy) = crate::proxy_transport::proxy_with_a_1_kib_body_cap(dir.path()).await;
    put_declared_over_the_limit(&proxy, "/c", 7, "limits.body_bytes_max").await;
    assert!(upstream.arrived().is_empty());
    assert_eq!(upstream.body_bytes(), 0);

    put_chunked_over_the_limit(&proxy, "/c", "limits.body_bytes_max").await;
    assert!(
        upstream.applied().is_empty(),
        "a cut-off body is never applied"
    );
    let fence = palisade_tests::fixtures::admin(&proxy)
        .fence(palisade_protocol::DEFAULT_SCOPE)
        .await
        .unwrap();
    assert_eq!(
        fence.token, 1,
        "the 413 before admission did not raise the fence to 7"
    );
}

/// A tiny upstream that answers an upgrade request with 101 and then echoes what the
/// client sends on the upgraded connection; any other request gets 200.
async fn echo_upstream() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |mut req: Request<hyper::body::Incoming>| async move {
                        if !req.headers().contains_key("upgrade") {
                            return Ok(http::Response::new(Full::new(Bytes::from_static(
                                b"plain\n",
                            ))));
                        }
                        let upgrade = hyper::upgrade::on(&mut req);
                        tokio::spawn(async move {
                            if let Ok(upgraded) = upgrade.await {
                                let mut io = hyper_util::rt::TokioIo::new(upgraded);
                                let (mut r, mut w) = tokio::io::split(&mut io);
                                let _ = tokio::io::copy(&mut r, &mut w).await;
                            }
                        });
                        let response = http::Response::builder()
                            .status(StatusCode::SWITCHING_PROTOCOLS)
                            .header("connection", "upgrade")
                            .header("upgrade", "echo")
                            .body(Full::new(Bytes::new()))
                            .unwrap();
                        Ok::<_, std::convert::Infallible>(response)
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
    (addr, task)
}

/// Goal: on a route with `upgrade = true`, an upgrade is forwarded and, on the
/// upstream's 101, tunnelled both ways; the tunnel holds its scope's in-flight guard while
/// open (a higher token waits at the barrier), and releases it when closed.
/// Method: an echo upstream answering 101; a raw upgrade request with token 1 on `/ws`;
/// echo a line through the tunnel; a write with token 2 of the same scope times out at
/// a 300 ms barrier while the tunnel is open, and passes once it is closed.
#[tokio::test]
async fn upgrade_on_an_allowed_route_is_tunnelled_and_holds_its_scope() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (upstream, _task) = echo_upstream().await;
    let config = write_config(
        dir.path(),
        "[[routes]]\nprefix = \"/ws\"\nscope = \"ws\"\nupgrade = true\n\n[limits]\nbarrier_timeout_ms = 300\n",
    );
    let proxy = start_proxy(
        dir.path(),
        &[
            "--upstream",
            &format!("http://{upstream}"),
            "--config",
            &config,
        ],
    );
    let addr = proxy.addr;
    let tunnel = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        let head = format!(
            "GET /ws HTTP/1.1\r\nHost: x\r\n{FENCING_TOKEN}: 1\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).unwrap();
        let answer = read_until(&mut stream, "\r\n\r\n", Duration::from_secs(10));
        assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
        stream.write_all(b"ping through the tunnel\n").unwrap();
        let echoed = read_until(&mut stream, "tunnel\n", Duration::from_secs(10));
        assert_eq!(echoed, "ping through the tunnel\n");
        stream
    })
    .await
    .unwrap();

    let waiting = put(&proxy.url("/ws"), 2, b"x").await;
    assert_eq!(
        waiting.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the open tunnel holds the scope: {}",
        waiting.text()
    );
    tunnel.shutdown(std::net::Shutdown::Both).unwrap();
    drop(tunnel);
    let status = wait::poll(Duration::from_secs(10), || async {
        let answer = put(&proxy.url("/ws"), 2, b"x").await;
        (answer.status != StatusCode::SERVICE_UNAVAILABLE).then_some(answer.status)
    })
    .await
    .expect("timed out waiting for the closed tunnel to release its scope");
    assert_eq!(status, StatusCode::OK);
}

/// A response body of one data frame and then trailers, with no length known up front
/// (so it goes chunked, the only HTTP/1 framing that carries trailers).
struct WithTrailers(Option<Bytes>, Option<http::HeaderMap>);

impl hyper::body::Body for WithTrailers {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let frame = match self.0.take() {
            Some(data) => Some(hyper::body::Frame::data(data)),
            None => self.1.take().map(hyper::body::Frame::trailers),
        };
        std::task::Poll::Ready(frame.map(Ok))
    }
}

/// Goal: response trailers reach a client that accepts them (`TE: trailers`): the proxy
/// asks the upstream for them on its own hop and passes them on.
/// Method: an upstream answering with a chunked body, `Trailer: x-sum` and that trailer,
/// but only when its request carries `TE: trailers`; a raw client sends `TE: trailers`
/// and reads the chunked answer to its end.
#[tokio::test]
async fn response_trailers_reach_a_client_that_accepts_them() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let _task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                        let te = req
                            .headers()
                            .get("te")
                            .map(|v| v.to_str().unwrap().to_owned());
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("x-sum", http::HeaderValue::from_static("42"));
                        let response = http::Response::builder()
                            .header("trailer", "x-sum")
                            .header("x-te-seen", te.unwrap_or_default())
                            .body(WithTrailers(
                                Some(Bytes::from_static(b"payload")),
                                Some(trailers),
                            ))
                            .unwrap();
                        Ok::<_, std::convert::Infallible>(response)
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let proxy = start_proxy(dir.path(), &["--upstream", &format!("http://{upstream}")]);
    let addr = proxy.addr;
    let answer = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .write_all(b"GET /t HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nConnection: close\r\n\r\n")
            .unwrap();
        read_until(&mut stream, "x-sum: 42\r\n\r\n", Duration::from_secs(10))
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("x-te-seen: trailers"), "{answer}");
    assert!(answer.contains("payload"), "{answer}");
    assert!(answer.contains("\r\n0\r\nx-sum: 42\r\n\r\n"), "{answer}");
}

/// Goal: the embedded store, which holds objects whole, refuses a body over
/// `limits.object_bytes_max` with 413 naming that field, with or without a declared
/// length, and stores nothing of it.
/// Method: an embedded store with a 1 KiB object limit; PUT 2 KiB with Content-Length,
/// then 1600 bytes chunked; read the key back.
#[tokio::test]
async fn embedded_store_refuses_bodies_over_its_object_limit_naming_it() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "[limits]\nobject_bytes_max = 1024\n");
    let proxy = start_proxy(dir.path(), &["--config", &config]);
    put_declared_over_the_limit(&proxy, "/obj", 1, "limits.object_bytes_max").await;
    put_chunked_over_the_limit(&proxy, "/obj", "limits.object_bytes_max").await;
    let read = send(Method::GET, &proxy.url("/obj"), &[], b"").await;
    assert_eq!(read.status, StatusCode::NOT_FOUND, "nothing was stored");
}
