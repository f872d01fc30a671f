//! HTTP framing is never changed silently, and no client without a token can hold the
//! upstream's slots with a slow body: a real `palisade proxy` in front of a raw upstream
//! that records exactly the bytes it receives.
//!
//! Each hostile head of the review gets its documented answer (docs/proxy.md, "HTTP
//! framing"), and the upstream receives either the whole request, as sent, or nothing.
//! Under 500 slow-body GETs on a route that lets GETs carry bodies, a valid write is
//! forwarded within 1 s (the requirement).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_cluster::wait;
use palisade_tests::client::send;
use palisade_tests::fixtures::write_config;
use palisade_tests::process::{ProxyProcess, start_proxy};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// Longest any single exchange in these tests may take: generous for loopback.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// The requirement: a valid write is forwarded within this under the flood.
const WRITE_WITHIN: Duration = Duration::from_secs(1);
/// Slow-body GETs of the flood.
const FLOOD_CLIENTS: usize = 500;
/// Of them, those declaring a large body (streamed): more than the proxy's 256
/// upstream slots, as in the review, which took them all. The others declare a small
/// one (read whole before a slot is taken).
const FLOOD_LARGE_CLIENTS: usize = 300;
/// What each flood client declares.
const FLOOD_LARGE_BYTES: usize = 1_000_000;
const FLOOD_SMALL_BYTES: usize = 1_000;
/// Pause between two bytes of a flood client's body. Not a wait for a condition: it is
/// the hostile client's pace, slow enough that no body ever completes during the test,
/// fast enough that no idle timeout (30 s) fires.
const TRICKLE_PACE: Duration = Duration::from_secs(2);
/// The proxy's default `limits.unfenced_streams_max`: half of 256 upstream slots.
const UNFENCED_STREAMS_MAX: usize = 128;
/// `limits.body_arrival_timeout_ms` of the flood test: short, so the small bodies' 408s
/// are seen within the test.
const ARRIVAL_TIMEOUT_MS: u64 = 3_000;
/// Descriptors this test process needs: the flood, the upstream's side, the harness.
const TEST_FDS_NEEDED: u64 = 2_048;

/// What the raw upstream saw.
#[derive(Default)]
struct Seen {
    /// Every complete request, byte for byte as it arrived (head and body).
    requests: Vec<Vec<u8>>,
    /// Requests whose connection closed before they were complete, as far as they came.
    truncated: Vec<Vec<u8>>,
    /// Request heads seen, of requests complete or not.
    heads: Vec<String>,
}

/// An HTTP/1.1 upstream written by hand, so that it records the exact bytes it is sent
/// and reads every body, GET bodies included, before it answers `200 ok`. A request to
/// `/gzip-answer` is answered with `Transfer-Encoding: gzip, chunked` instead.
#[derive(Clone)]
struct RawUpstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    /// Requests whose head arrived and whose body has not: in the upstream's hands now.
    open: Arc<AtomicUsize>,
    /// The most that were open at once.
    open_max: Arc<AtomicUsize>,
}

impl RawUpstream {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = Self {
            addr: listener.local_addr().unwrap(),
            seen: Arc::default(),
            open: Arc::default(),
            open_max: Arc::default(),
        };
        let accepting = upstream.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(accepting.clone().serve(stream));
            }
        });
        upstream
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        seen.requests
            .iter()
            .map(|r| String::from_utf8_lossy(r).into_owned())
            .collect()
    }

    fn truncated(&self) -> usize {
        self.seen.lock().unwrap().truncated.len()
    }

    fn heads(&self) -> Vec<String> {
        self.seen.lock().unwrap().heads.clone()
    }

    /// Serves one connection: request after request, each read whole (by its
    /// `Content-Length` or its chunked framing) before it is answered.
    async fn serve(self, mut stream: TcpStream) {
        let mut buf = Vec::new();
        loop {
            let Some(head_len) = self.read_until(&mut stream, &mut buf, head_end).await else {
                return;
            };
            let head = String::from_utf8_lossy(&buf[..head_len]).into_owned();
            let open = self.open.fetch_add(1, Ordering::SeqCst) + 1;
            self.open_max.fetch_max(open, Ordering::SeqCst);
            self.seen.lock().unwrap().heads.push(head.clone());
            let lower = head.to_ascii_lowercase();
            let length = header(&lower, "content-length").and_then(|v| v.parse::<usize>().ok());
            let chunked =
                header(&lower, "transfer-encoding").is_some_and(|v| v.contains("chunked"));
            let whole = if chunked {
                self.read_until(&mut stream, &mut buf, |b| {
                    chunked_end(b.get(head_len..)?).map(|n| head_len + n)
                })
                .await
            } else {
                let total = head_len + length.unwrap_or(0);
                self.read_until(&mut stream, &mut buf, |b| {
                    (b.len() >= total).then_some(total)
                })
                .await
            };
            self.open.fetch_sub(1, Ordering::SeqCst);
            let Some(total) = whole else {
                return;
            };
            let request: Vec<u8> = buf.drain(..total).collect();
            self.seen.lock().unwrap().requests.push(request);
            let answer: &[u8] = if head.starts_with("GET /gzip-answer ") {
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
            } else {
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
            };
            if stream.write_all(answer).await.is_err() {
                return;
            }
        }
    }

    /// Reads into `buf` until `complete` says how much of it is one whole piece; `None`
    /// when the connection ends first (what came of an unfinished request is recorded
    /// as truncated).
    async fn read_until(
        &self,
        stream: &mut TcpStream,
        buf: &mut Vec<u8>,
        complete: impl Fn(&[u8]) -> Option<usize>,
    ) -> Option<usize> {
        loop {
            if let Some(n) = complete(buf) {
                return Some(n);
            }
            buf.reserve(16 * 1024);
            match stream.read_buf(buf).await {
                Ok(0) | Err(_) => {
                    if !buf.is_empty() {
                        self.seen.lock().unwrap().truncated.push(buf.clone());
                    }
                    return None;
                }
                Ok(_) => {}
            }
        }
    }
}

/// The length of a request or response head, its blank line included, once complete.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// The value of header `name` in a lower-cased head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// The length of a complete chunked body (trailers and the final blank line included)
/// at the start of `buf`, or `None` while it is incomplete.
fn chunked_end(buf: &[u8]) -> Option<usize> {
    let mut at = 0;
    loop {
        let line_end = at + buf.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
        let line = std::str::from_utf8(&buf[at..line_end]).ok()?;
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        at = line_end + 2;
        if size == 0 {
            // Trailers, if any, then the blank line.
            return if buf.get(at..)?.starts_with(b"\r\n") {
                Some(at + 2)
            } else {
                head_end(buf.get(at..)?).map(|n| at + n)
            };
        }
        at += size + 2;
        if buf.len() < at {
            return None;
        }
    }
}

/// An answer read off a raw connection.
struct Answer {
    status: u16,
    text: String,
}

/// Reads one answer: its head, then its `Content-Length` body, or up to the close.
async fn read_answer(stream: &mut TcpStream) -> Answer {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let read = async {
        loop {
            if let Some(head_len) = head_end(&buf) {
                let head = String::from_utf8_lossy(&buf[..head_len]).to_ascii_lowercase();
                let length = header(&head, "content-length").and_then(|v| v.parse().ok());
                if length.is_some_and(|n: usize| buf.len() >= head_len + n) {
                    return;
                }
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(EXCHANGE_TIMEOUT, read).await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    // "HTTP/1.x NNN ...": hyper answers an HTTP/1.0 request in HTTP/1.0.
    let status = text
        .starts_with("HTTP/1.")
        .then(|| text.get(9..12))
        .flatten()
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    Answer { status, text }
}

/// Sends `request` on a fresh connection and reads the answer.
async fn exchange(addr: SocketAddr, request: &str) -> Answer {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    read_answer(&mut stream).await
}

/// The sum of the counter `name` over its lines carrying `label`, from the proxy's
/// metrics page.
async fn counter(proxy: &ProxyProcess, name: &str, label: &str) -> f64 {
    let page = send(
        http::Method::GET,
        &format!("http://{}/metrics", proxy.admin),
        &[],
        "",
    )
    .await
    .text();
    page.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A raw upstream and a proxy in front of it with `config` (TOML).
async fn proxy_in_front_of_raw_upstream(
    dir: &std::path::Path,
    config: &str,
) -> (RawUpstream, ProxyProcess) {
    let upstream = RawUpstream::start().await;
    let config = write_config(dir, config);
    let proxy = start_proxy(dir, &["--upstream", &upstream.url(), "--config", &config]);
    (upstream, proxy)
}

/// Goal: every hostile framing of the review gets its documented answer (a problem of
/// its own kind, counted among the refusals, or hyper's own 400), and the upstream gets
/// either the whole request as sent or nothing; the framings that are fine reach it
/// whole.
/// Method: a raw upstream that records exact bytes; each case on a fresh connection;
/// then the upstream's records: exactly the accepted requests, none truncated, and the
/// refusal counters.
#[tokio::test]
async fn hostile_framings_get_their_answer_and_nothing_partial_reaches_the_upstream() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (upstream, proxy) = proxy_in_front_of_raw_upstream(dir.path(), "").await;
    let put = "PUT /a HTTP/1.1\r\nHost: x\r\nFencing-Token: 1\r\n";
    let refused = [
        (
            format!("{put}Connection: Content-Length\r\nContent-Length: 5\r\n\r\nhello"),
            400,
            "bad-connection",
        ),
        (
            format!("{put}Connection: keep-alive, Fencing-Token\r\nContent-Length: 1\r\n\r\nx"),
            400,
            "bad-connection",
        ),
        (
            format!("{put}Connection: Host\r\nContent-Length: 1\r\n\r\nx"),
            400,
            "bad-connection",
        ),
        (
            format!("{put}Host: y\r\nContent-Length: 1\r\n\r\nx"),
            400,
            "bad-host",
        ),
        (
            "PUT /a HTTP/1.1\r\nFencing-Token: 1\r\nContent-Length: 1\r\n\r\nx".to_owned(),
            400,
            "bad-host",
        ),
        (
            "PUT http://other/a HTTP/1.1\r\nHost: x\r\nFencing-Token: 1\r\nContent-Length: 1\r\n\r\nx"
                .to_owned(),
            400,
            "bad-host",
        ),
        (
            format!("{put}Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            501,
            "unsupported-transfer-coding",
        ),
        (
            format!(
                "{put}Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
            ),
            501,
            "unsupported-transfer-coding",
        ),
        (
            "GET /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello".to_owned(),
            400,
            "body-on-read",
        ),
        (
            "GET /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_owned(),
            400,
            "body-on-read",
        ),
    ];
    for (request, status, kind) in &refused {
        let answer = exchange(proxy.addr, request).await;
        assert_eq!(answer.status, *status, "{request:?}: {}", answer.text);
        assert!(
            answer.text.contains(&format!("problems/{kind}")),
            "{request:?}: {}",
            answer.text
        );
    }
    // hyper refuses these itself, with a bare 400, before the proxy sees them.
    let by_hyper = [
        format!("{put}Transfer-Encoding: chunked, gzip\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
        format!("{put}Content-Length: 1\r\nContent-Length: 2\r\n\r\nxy"),
        "PUT /a HTTP/1.0\r\nHost: x\r\nFencing-Token: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
            .to_owned(),
    ];
    for request in &by_hyper {
        let answer = exchange(proxy.addr, request).await;
        assert_eq!(answer.status, 400, "{request:?}: {}", answer.text);
    }
    assert!(
        upstream.requests().is_empty() && upstream.heads().is_empty(),
        "a refused request reached the upstream: {:?}",
        upstream.heads()
    );

    // Accepted as they are: an absolute-form target naming the Host, `TE` named by
    // `Connection` (as RFC 9110 asks), and chunked with a Content-Length, which hyper
    // reads as chunked (RFC 9112 §6.3) and the proxy forwards chunked without it.
    let fine = [
        "PUT http://x/abs HTTP/1.1\r\nHost: x\r\nFencing-Token: 1\r\nContent-Length: 5\r\n\r\nhello",
        "PUT /te HTTP/1.1\r\nHost: x\r\nFencing-Token: 1\r\nConnection: keep-alive, TE\r\nTE: trailers\r\nContent-Length: 5\r\n\r\nhello",
        "PUT /both HTTP/1.1\r\nHost: x\r\nFencing-Token: 1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ];
    for request in fine {
        let answer = exchange(proxy.addr, request).await;
        assert_eq!(answer.status, 200, "{request:?}: {}", answer.text);
    }
    let requests = upstream.requests();
    assert_eq!(requests.len(), fine.len(), "{requests:?}");
    for (path, request) in ["/abs", "/te", "/both"].iter().zip(&requests) {
        let lower = request.to_ascii_lowercase();
        assert!(
            lower.starts_with(&format!("put {path} http/1.1\r\n")),
            "{request:?}"
        );
        assert_eq!(header(&lower, "host"), Some("x"), "{request:?}");
        assert!(request.contains("hello"), "the body arrived: {request:?}");
    }
    let both = requests[2].to_ascii_lowercase();
    assert!(
        header(&both, "transfer-encoding") == Some("chunked")
            && header(&both, "content-length").is_none(),
        "{both:?}"
    );

    // An upstream answer whose codings the proxy would have to drop is a 502.
    let answer = exchange(proxy.addr, "GET /gzip-answer HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(answer.status, 502, "{}", answer.text);
    assert!(answer.text.contains("gzip, chunked"), "{}", answer.text);

    assert_eq!(
        upstream.truncated(),
        0,
        "a request reached the upstream cut off"
    );
    for (kind, times) in [
        ("bad-connection", 3.0),
        ("bad-host", 3.0),
        ("unsupported-transfer-coding", 2.0),
        ("body-on-read", 2.0),
    ] {
        let label = format!("reason=\"{kind}\"");
        let counted = counter(&proxy, "palisade_proxy_rejections_total", &label).await;
        assert!(
            (counted - times).abs() < 0.5,
            "rejections of {kind}: {counted}, not {times}"
        );
    }
}

/// Raises this process's soft descriptor limit to at least `needed`, within the hard
/// limit, which must allow it.
fn ensure_own_fds(needed: u64) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    assert!(
        hard >= needed,
        "{needed} descriptors needed; the hard limit is {hard}"
    );
    setrlimit(Resource::RLIMIT_NOFILE, soft.max(needed), hard).unwrap();
}

/// One slow-body GET of the flood: its head and first byte, then a byte every
/// [`TRICKLE_PACE`], until the proxy answers or closes; the answer's status (0 if none).
async fn slow_get(addr: SocketAddr, i: usize, declared: usize) -> u16 {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return 0;
    };
    let head = format!("GET /read/{i} HTTP/1.1\r\nHost: x\r\nContent-Length: {declared}\r\n\r\nx");
    if stream.write_all(head.as_bytes()).await.is_err() {
        return 0;
    }
    let (mut reader, mut writer) = stream.into_split();
    let trickle = async {
        loop {
            tokio::time::sleep(TRICKLE_PACE).await;
            if writer.write_all(b"x").await.is_err() {
                return;
            }
        }
    };
    let answer = async {
        let mut buf = [0u8; 64];
        match reader.read(&mut buf).await {
            Ok(n) if n >= 12 => std::str::from_utf8(&buf[9..12])
                .ok()
                .and_then(|code| code.parse().ok())
                .unwrap_or(0),
            _ => 0,
        }
    };
    tokio::select! {
        status = answer => status,
        () = trickle => 0,
    }
}

/// Goal: slow anonymous bodies cannot hold the upstream's slots: under 500 GETs that
/// declare bodies and send a byte every 2 s (on a route that lets GETs carry bodies, the
/// worst case; without `read_bodies` they are refused at once), a valid write is
/// forwarded within 1 s. Small bodies are read whole before a slot and cut off at the
/// arrival deadline (408) without reaching the upstream; large ones stream, at most
/// `unfenced_streams_max` at once, the rest answered 503.
/// Method: a raw upstream that reads GET bodies; 300 clients declaring 1 MB and 200
/// declaring 1,000 bytes; once the proxy holds every connection and the upstream has
/// the streams' share, time a PUT; then the flood's answers and the upstream's records.
#[tokio::test]
async fn slow_body_flood_cannot_hold_the_slots_a_write_needs() {
    crate::use_tested_binary();
    ensure_own_fds(TEST_FDS_NEEDED);
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[limits]\nbody_arrival_timeout_ms = {ARRIVAL_TIMEOUT_MS}\n\n\
         [[routes]]\nprefix = \"/read/\"\nscope = \"reads\"\nread_bodies = true\n"
    );
    let (upstream, proxy) = proxy_in_front_of_raw_upstream(dir.path(), &config).await;

    let mut flood = tokio::task::JoinSet::new();
    for i in 0..FLOOD_CLIENTS {
        let declared = if i < FLOOD_LARGE_CLIENTS {
            FLOOD_LARGE_BYTES
        } else {
            FLOOD_SMALL_BYTES
        };
        let addr = proxy.addr;
        flood.spawn(async move { (declared, slow_get(addr, i, declared).await) });
    }
    let connections = wait::poll(EXCHANGE_TIMEOUT, || async {
        let open = counter(&proxy, "palisade_proxy_connections", "listener=\"client\"").await;
        (open >= f64::from(u32::try_from(FLOOD_CLIENTS).unwrap())).then_some(open)
    })
    .await;
    assert!(
        connections.is_some(),
        "the proxy never held the whole flood"
    );
    let streaming = wait::poll(EXCHANGE_TIMEOUT, || async {
        let open = upstream.open.load(Ordering::SeqCst);
        (open >= UNFENCED_STREAMS_MAX).then_some(open)
    })
    .await;
    assert!(
        streaming.is_some(),
        "the upstream never got the streams' share of the flood"
    );

    let started = Instant::now();
    let write = exchange(
        proxy.addr,
        "PUT /w HTTP/1.1\r\nHost: x\r\nFencing-Token: 1\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await;
    let took = started.elapsed();
    assert_eq!(write.status, 200, "{}", write.text);
    assert!(
        took < WRITE_WITHIN,
        "the write took {took:?} under the flood; the requirement is {WRITE_WITHIN:?}"
    );
    assert!(
        upstream
            .requests()
            .iter()
            .any(|r| r.starts_with("PUT /w ") && r.ends_with("\r\n\r\nhello")),
        "the write reached the upstream whole"
    );

    // The flood's answers: every small body 408 at its arrival deadline, every large
    // one either streaming still (no answer yet) or 503 for want of a stream slot.
    let mut small = Vec::new();
    let mut large_refused = 0;
    let flood_done = wait::poll(Duration::from_secs(20), || {
        while let Some(Ok((declared, status))) = flood.try_join_next() {
            if declared == FLOOD_SMALL_BYTES {
                small.push(status);
            } else if status == 503 {
                large_refused += 1;
            }
        }
        let done = small.len() == FLOOD_CLIENTS - FLOOD_LARGE_CLIENTS
            && large_refused >= FLOOD_LARGE_CLIENTS - UNFENCED_STREAMS_MAX;
        async move { done.then_some(()) }
    })
    .await;
    assert!(
        flood_done.is_some(),
        "small answered: {}, large refused: {large_refused}",
        small.len()
    );
    assert!(small.iter().all(|s| *s == 408), "{small:?}");
    let max = upstream.open_max.load(Ordering::SeqCst);
    assert!(
        max <= UNFENCED_STREAMS_MAX + 1,
        "{max} requests were open at the upstream at once"
    );
    let heads = upstream.heads();
    assert!(
        !heads
            .iter()
            .any(|h| h.contains(&format!("content-length: {FLOOD_SMALL_BYTES}\r\n"))),
        "a small slow body reached the upstream before it had arrived"
    );
    flood.abort_all();
}
