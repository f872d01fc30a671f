//! An HTTP/1 byte stream through the proxy's data path, in process, against an
//! in-process upstream that records what reaches it.
//!
//! Each input is one client connection: the first byte picks the configuration
//! (`fence_reads` off or on), the rest is sent as the client's bytes, then the client
//! closes its side and reads every answer. The proxy is fresh for each input (an
//! in-memory fence register), and so is the upstream (a loopback listener of its own).
//!
//! Property: nothing reaches the upstream that is a fenced request without a valid
//! `Fencing-Token`, or whose token is lower than one the upstream already received for
//! the same scope (the scope worked out here from the forwarded head: `Fencing-Scope`,
//! else the route `/s/<scope>/`, else `default`); and serving the connection never
//! panics.
#![no_main]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use palisade_protocol::headers::FENCING_SCOPE;
use palisade_protocol::parse_token_header;
use palisade_proxy::ProxyConfig;
use palisade_proxy::fuzzing::{DataPath, normalise};
use palisade_storage::FenceRegister;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// How long one input may take before it is abandoned (not a finding: a client that
/// stops half-way is answered by the proxy's timeouts, which are longer than this).
const INPUT_TIMEOUT_MS: u64 = 2_000;
/// Bytes of the in-memory client connection's buffer.
const PIPE_BYTES: usize = 64 * 1024;
/// Scopes the register takes.
const SCOPES_MAX: usize = 64;
/// The override headers the proxy classifies by (its defaults), lower-case.
const OVERRIDES: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];
const READS: [Method; 3] = [Method::GET, Method::HEAD, Method::OPTIONS];

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
});

/// What the upstream saw: method, path and head of each request, in arrival order.
type Seen = Arc<Mutex<Vec<(Method, String, HeaderMap)>>>;

async fn upstream() -> (SocketAddr, Seen, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen: Seen = Arc::default();
    let record = Arc::clone(&seen);
    let accepting = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let record = Arc::clone(&record);
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let record = Arc::clone(&record);
                async move {
                    let (parts, body) = request.into_parts();
                    record.lock().expect("not poisoned").push((
                        parts.method,
                        parts.uri.path().to_owned(),
                        parts.headers,
                    ));
                    let _ = body.collect().await;
                    Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service),
            );
        }
    });
    (addr, seen, accepting)
}

fn config(upstream: SocketAddr, fence_reads: bool) -> ProxyConfig {
    let text = format!(
        r#"
upstream = "http://{upstream}"
client_scopes = true
fence_reads = {fence_reads}
strip_token = false
[limits]
barrier_timeout_ms = 200
upstream_timeout_ms = 1000
upstream_connect_timeout_ms = 1000
body_idle_timeout_ms = 1000
[[routes]]
prefix = "/s/"
scope_segment = 2
"#
    );
    let config = ProxyConfig::from_toml_str(&text).expect("the fixed config parses");
    config.validate().expect("the fixed config validates");
    config
}

/// Whether the proxy must have fenced this forwarded request.
fn fenced(method: &Method, headers: &HeaderMap, fence_reads: bool) -> bool {
    if fence_reads || !READS.contains(method) {
        return true;
    }
    OVERRIDES.iter().any(|name| {
        headers.get_all(*name).iter().any(|v| {
            v.to_str()
                .ok()
                .and_then(|v| Method::from_bytes(v.trim().as_bytes()).ok())
                .is_none_or(|m| !READS.contains(&m))
        })
    })
}

/// The scope of a forwarded request: its `Fencing-Scope`, else its route's, else
/// `default`.
fn scope_of(path: &str, headers: &HeaderMap) -> String {
    let mut named = headers.get_all(FENCING_SCOPE).iter();
    if let Some(value) = named.next() {
        assert!(
            named.next().is_none(),
            "forwarded with a repeated Fencing-Scope"
        );
        return value.to_str().expect("an ASCII Fencing-Scope").to_owned();
    }
    let normal = normalise(path).expect("a forwarded path normalises");
    match normal.strip_prefix("/s/") {
        Some(rest) => rest.split('/').next().unwrap_or_default().to_owned(),
        None if normal == "/s" => String::new(),
        None => "default".to_owned(),
    }
}

async fn run(data: &[u8]) {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let fence_reads = selector & 1 == 1;
    let (addr, seen, accepting) = upstream().await;
    let db = Arc::new(
        redb::Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .expect("an in-memory database"),
    );
    let register = FenceRegister::open(db, SCOPES_MAX).expect("the register opens");
    let proxy = DataPath::new(&config(addr, fence_reads), register).expect("the data path");
    let (mut client, server) = tokio::io::duplex(PIPE_BYTES);
    let peer = SocketAddr::from(([192, 0, 2, 1], 40_000));
    let serving = proxy.serve_http1(server, peer);
    let talking = async {
        let _ = client.write_all(bytes).await;
        let _ = client.shutdown().await;
        let mut answers = Vec::new();
        let _ = client.read_to_end(&mut answers).await;
    };
    let both = async { tokio::join!(serving, talking) };
    let _ = tokio::time::timeout(Duration::from_millis(INPUT_TIMEOUT_MS), both).await;
    // A forward whose client went away finishes in a task of its own: let it land.
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
    accepting.abort();

    let mut highest: BTreeMap<String, u64> = BTreeMap::new();
    for (method, path, headers) in seen.lock().expect("not poisoned").iter() {
        if !fenced(method, headers, fence_reads) {
            continue;
        }
        let token = match parse_token_header(headers) {
            Ok(Some(token)) => token,
            other => panic!("{method} {path:?} reached the upstream without a token: {other:?}"),
        };
        let scope = scope_of(path, headers);
        let previous = highest.entry(scope.clone()).or_default();
        assert!(
            token >= *previous,
            "{method} {path:?} reached the upstream with token {token} after {previous} in scope {scope:?}"
        );
        *previous = token;
    }
}

fuzz_target!(|data: &[u8]| {
    RUNTIME.block_on(run(data));
});
