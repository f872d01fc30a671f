//! `palisade bench`: a closed-loop HTTP/1.1 load generator for the proxy (or any HTTP
//! server), and `palisade bench failover`, which times the failover of a local cluster.
//!
//! Each of `--connections` workers owns one connection (`hyper::client::conn`), so the
//! connection count is exact, and sends its next request when the previous answer has
//! been read whole. Latencies go into an HDR histogram per worker, merged at the end.
//! A closed loop understates latency when the server stalls (coordinated omission): the
//! percentiles are those of answered requests, not of a fixed arrival schedule.
//!
//! Tokens: `--token T` sets `Fencing-Token: T` on every request. With
//! `--advance-share S`, a fraction `S` of the requests draws a new token from one counter
//! shared by all workers (`T+1`, `T+2`, ...), so tokens only rise; the others carry the
//! counter's latest value. With several connections, a token drawn earlier can still
//! arrive after a later one was admitted: the proxy answers it 409, counted as non-2xx.

mod failover;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, Subcommand};
use hdrhistogram::Histogram;
use http::{HeaderValue, Method, Request, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::Failure;

/// Most connections one run opens: each is a task and a socket, and the machine's file
/// descriptor limit (`ulimit -n`) has to cover them.
pub(crate) const CONNECTIONS_MAX: u32 = 10_000;
/// Longest run, warm-up included, in seconds: a benchmark that runs longer than an hour
/// is a soak test, better run by a tool made for that.
const DURATION_S_MAX: f64 = 3600.0;
/// Most requests of a `--requests` run.
const REQUESTS_MAX: u64 = 1_000_000_000;
/// Largest request body: the proxy's default `body_bytes_max`.
const BODY_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Longest per-request timeout, in milliseconds.
const TIMEOUT_MS_MAX: u64 = 600_000;
/// Highest latency the histogram tells apart, in microseconds; slower answers are
/// recorded as this value. It is the longest request timeout allowed.
const LATENCY_US_MAX: u64 = TIMEOUT_MS_MAX * 1000;
/// Significant decimal digits of the histogram: 0.1% resolution.
const LATENCY_SIGFIGS: u8 = 3;
/// Pause after a failed connect, so a refused port does not become a busy loop.
const CONNECT_RETRY_MS: u64 = 20;
/// Longest scope name (CONTRACT.md: 1-128 of `[A-Za-z0-9._-]`).
const SCOPE_BYTES_MAX: usize = 128;

/// Load an HTTP server and report throughput and latency percentiles; or, with a
/// scenario (`failover`), time a cluster.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    scenario: Option<Scenario>,
    #[command(flatten)]
    load: LoadArgs,
}

#[derive(Subcommand)]
enum Scenario {
    /// Time failovers of a local cluster: pause the leader with SIGSTOP, wait for a new
    /// leader and for its token at the proxy, resume, repeat.
    Failover(failover::FailoverArgs),
}

/// Flags of a load run.
#[derive(Args)]
struct LoadArgs {
    /// Target URL (http:// only); its path and query are requested on every request.
    #[arg(
        long,
        env = "PALISADE_BENCH_URL",
        default_value = "http://127.0.0.1:8080/bench"
    )]
    url: String,
    /// Connections, each with one request in flight at a time (1 to 10000).
    #[arg(long, env = "PALISADE_BENCH_CONNECTIONS", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(CONNECTIONS_MAX)))]
    connections: u32,
    /// Seconds to measure for [default: 10 unless --requests is given].
    #[arg(long, env = "PALISADE_BENCH_DURATION", conflicts_with = "requests")]
    duration: Option<f64>,
    /// Number of requests to measure, instead of a duration.
    #[arg(long, env = "PALISADE_BENCH_REQUESTS")]
    requests: Option<u64>,
    /// Seconds of load before measuring starts (not counted).
    #[arg(long, env = "PALISADE_BENCH_WARMUP", default_value_t = 0.0)]
    warmup: f64,
    /// HTTP method.
    #[arg(long, env = "PALISADE_BENCH_METHOD", default_value = "GET")]
    method: String,
    /// Request body size in bytes (filled with 'x'); sent with Content-Length.
    #[arg(
        long,
        env = "PALISADE_BENCH_BODY_BYTES",
        default_value_t = 0,
        conflicts_with = "body_file"
    )]
    body_bytes: usize,
    /// Send this file's content as the body of every request.
    #[arg(long, env = "PALISADE_BENCH_BODY_FILE")]
    body_file: Option<PathBuf>,
    /// Content-Type of the body.
    #[arg(long, env = "PALISADE_BENCH_CONTENT_TYPE")]
    content_type: Option<String>,
    /// Fencing token to send (`Fencing-Token`); the start of the counter with
    /// --advance-share.
    #[arg(long, env = "PALISADE_BENCH_TOKEN")]
    token: Option<u64>,
    /// Fencing scope to send (`Fencing-Scope`).
    #[arg(long, env = "PALISADE_BENCH_SCOPE")]
    scope: Option<String>,
    /// Fraction (0 to 1) of requests that carry a new, higher token from a counter
    /// shared by all connections. Needs --token.
    #[arg(long, env = "PALISADE_BENCH_ADVANCE_SHARE", default_value_t = 0.0)]
    advance_share: f64,
    /// Per-request timeout in milliseconds; a request that takes longer is an error and
    /// its connection is reopened.
    #[arg(long, env = "PALISADE_BENCH_TIMEOUT_MS", default_value_t = 10_000)]
    timeout_ms: u64,
    /// Open the connections, send one request on each, print `holding N connections`,
    /// then keep them open and idle for --duration seconds (for memory measurements).
    #[arg(long)]
    hold: bool,
    /// Print the report as one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `palisade bench`.
pub(crate) async fn run(args: BenchArgs) -> Result<(), Failure> {
    match args.scenario {
        Some(Scenario::Failover(a)) => failover::run(a).await,
        None => run_load(args.load).await,
    }
}

/// What every worker needs, checked and resolved once.
struct Plan {
    addr: SocketAddr,
    /// `host[:port]` for the Host header.
    authority: HeaderValue,
    /// Origin-form target: path and query.
    target: Uri,
    method: Method,
    body: Bytes,
    content_type: Option<HeaderValue>,
    scope: Option<HeaderValue>,
    /// Whether requests carry a token at all.
    tokens: bool,
    advance_share: f64,
    timeout: Duration,
    connections: u32,
    /// Measuring starts here; requests before it are warm-up.
    measure_from: Instant,
    /// Duration mode: no request starts after this.
    end: Option<Instant>,
    /// Requests mode: how many to measure.
    requests: Option<u64>,
    hold: bool,
}

/// State the workers share while running.
struct Shared {
    /// The highest token handed out so far.
    token: AtomicU64,
    /// Measured requests started (requests mode).
    issued: AtomicU64,
    /// Set on SIGINT/SIGTERM: workers stop after their current request.
    stop: AtomicBool,
}

impl LoadArgs {
    /// Checks the flags against each other and the limits; every failure is a usage
    /// error (exit 2) naming the flag.
    fn plan(self, addr: SocketAddr) -> Result<Plan, Failure> {
        let usage = |m: String| Failure::Usage(m);
        let uri: Uri = self
            .url
            .parse()
            .map_err(|e| usage(format!("--url {:?}: {e}", self.url)))?;
        let authority = uri
            .authority()
            .ok_or_else(|| usage(format!("--url {:?} has no host", self.url)))?;
        let authority = HeaderValue::from_str(authority.as_str())
            .map_err(|e| usage(format!("--url host: {e}")))?;
        let target: Uri = uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str)
            .parse()
            .map_err(|e| usage(format!("--url path: {e}")))?;
        let method = Method::from_bytes(self.method.to_ascii_uppercase().as_bytes())
            .map_err(|_| usage(format!("--method {:?} is not an HTTP method", self.method)))?;
        let body = match &self.body_file {
            Some(path) => {
                let bytes = std::fs::read(path)
                    .map_err(|e| usage(format!("--body-file {}: {e}", path.display())))?;
                if bytes.len() > BODY_BYTES_MAX {
                    return Err(usage(format!(
                        "--body-file {} has {} bytes; at most {BODY_BYTES_MAX}",
                        path.display(),
                        bytes.len()
                    )));
                }
                Bytes::from(bytes)
            }
            None if self.body_bytes > BODY_BYTES_MAX => {
                return Err(usage(format!(
                    "--body-bytes {} is above the limit of {BODY_BYTES_MAX}",
                    self.body_bytes
                )));
            }
            None => Bytes::from(vec![b'x'; self.body_bytes]),
        };
        let content_type = self
            .content_type
            .as_deref()
            .map(HeaderValue::from_str)
            .transpose()
            .map_err(|e| usage(format!("--content-type: {e}")))?;
        let scope = match &self.scope {
            Some(s) => {
                let valid = !s.is_empty()
                    && s.len() <= SCOPE_BYTES_MAX
                    && s.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
                if !valid {
                    return Err(usage(format!(
                        "--scope {s:?}: a scope is 1 to {SCOPE_BYTES_MAX} of [A-Za-z0-9._-]"
                    )));
                }
                Some(HeaderValue::from_str(s).map_err(|e| usage(format!("--scope: {e}")))?)
            }
            None => None,
        };
        if !(0.0..=1.0).contains(&self.advance_share) {
            return Err(usage(format!(
                "--advance-share {} must be between 0 and 1",
                self.advance_share
            )));
        }
        if self.advance_share > 0.0 && self.token.is_none() {
            return Err(usage(
                "--advance-share needs --token (the counter's start)".to_owned(),
            ));
        }
        if self.timeout_ms == 0 || self.timeout_ms > TIMEOUT_MS_MAX {
            return Err(usage(format!(
                "--timeout-ms {} must be 1 to {TIMEOUT_MS_MAX}",
                self.timeout_ms
            )));
        }
        let duration = match (self.duration, self.requests) {
            (Some(d), _) => Some(d),
            (None, Some(_)) => None,
            (None, None) => Some(10.0),
        };
        if let Some(d) = duration
            && !(d > 0.0 && d + self.warmup <= DURATION_S_MAX)
        {
            return Err(usage(format!(
                "--duration {d} must be above 0, and with --warmup at most {DURATION_S_MAX} s"
            )));
        }
        if !(0.0..=DURATION_S_MAX).contains(&self.warmup) {
            return Err(usage(format!(
                "--warmup {} must be 0 to {DURATION_S_MAX} s",
                self.warmup
            )));
        }
        if let Some(n) = self.requests
            && (n == 0 || n > REQUESTS_MAX)
        {
            return Err(usage(format!("--requests {n} must be 1 to {REQUESTS_MAX}")));
        }
        if self.hold && duration.is_none() {
            return Err(usage("--hold needs --duration, not --requests".to_owned()));
        }
        let measure_from = Instant::now() + Duration::from_secs_f64(self.warmup);
        Ok(Plan {
            addr,
            authority,
            target,
            method,
            body,
            content_type,
            scope,
            tokens: self.token.is_some(),
            advance_share: self.advance_share,
            timeout: Duration::from_millis(self.timeout_ms),
            connections: self.connections,
            measure_from,
            end: duration.map(|d| measure_from + Duration::from_secs_f64(d)),
            requests: self.requests,
            hold: self.hold,
        })
    }
}

/// The URL's socket address: `http://` only, resolved once before the run.
async fn resolve(url: &str) -> Result<SocketAddr, Failure> {
    let uri: Uri = url
        .parse()
        .map_err(|e| Failure::Usage(format!("--url {url:?}: {e}")))?;
    if uri.scheme_str() != Some("http") {
        return Err(Failure::Usage(format!(
            "--url {url:?}: only http:// URLs are supported"
        )));
    }
    let host = uri
        .host()
        .ok_or_else(|| Failure::Usage(format!("--url {url:?} has no host")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| Failure::Usage(format!("--url {url:?}: cannot resolve {host}: {e}")))?
        .next()
        .ok_or_else(|| Failure::Usage(format!("--url {url:?}: {host} has no address")))
}

async fn run_load(args: LoadArgs) -> Result<(), Failure> {
    let addr = resolve(&args.url).await?;
    let url = args.url.clone();
    let json = args.json;
    let start_token = args.token.unwrap_or(0);
    let plan = Arc::new(args.plan(addr)?);
    let shared = Arc::new(Shared {
        token: AtomicU64::new(start_token),
        issued: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    if plan.hold {
        return hold(&plan, &shared).await;
    }

    let mut workers = JoinSet::new();
    for _ in 0..plan.connections {
        workers.spawn(worker(Arc::clone(&plan), Arc::clone(&shared)));
    }
    let collect = async move {
        let mut total = Tally::new();
        while let Some(joined) = workers.join_next().await {
            match joined {
                Ok(t) => total.merge(t),
                Err(e) => return Err(Failure::Runtime(format!("a worker failed: {e}"))),
            }
        }
        Ok(total)
    };
    tokio::pin!(collect);
    let total = tokio::select! {
        r = &mut collect => r?,
        () = crate::shutdown_signal() => {
            // Let every worker finish its request in flight, then report what was measured.
            shared.stop.store(true, Ordering::SeqCst);
            collect.await?
        }
    };
    let finished = total.finished.unwrap_or_else(Instant::now);
    let elapsed = finished.saturating_duration_since(plan.measure_from);
    let report = Report::new(
        &plan,
        &url,
        &total,
        elapsed,
        shared.token.load(Ordering::SeqCst),
    );
    if json {
        println!(
            "{}",
            serde_json::to_string(&report).map_err(|e| Failure::Runtime(e.to_string()))?
        );
    } else {
        print!("{}", report.text());
    }
    if report.answered == 0 && report.errors > 0 {
        return Err(Failure::Runtime(format!(
            "no request was answered; first error: {}",
            total.first_error.as_deref().unwrap_or("unknown")
        )));
    }
    Ok(())
}

/// What one worker (or, merged, all of them) saw during the measured window.
struct Tally {
    latency_us: Histogram<u64>,
    statuses: BTreeMap<u16, u64>,
    errors: BTreeMap<&'static str, u64>,
    first_error: Option<String>,
    /// Requests that carried a newly drawn token.
    advances: u64,
    connects: u64,
    /// When the last measured request ended.
    finished: Option<Instant>,
}

impl Tally {
    fn new() -> Self {
        Self {
            latency_us: histogram(),
            statuses: BTreeMap::new(),
            errors: BTreeMap::new(),
            first_error: None,
            advances: 0,
            connects: 0,
            finished: None,
        }
    }

    fn error(&mut self, kind: &'static str, message: String) {
        *self.errors.entry(kind).or_insert(0) += 1;
        self.first_error.get_or_insert(message);
    }

    fn merge(&mut self, other: Self) {
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = self.latency_us.add(&other.latency_us);
        for (k, v) in other.statuses {
            *self.statuses.entry(k).or_insert(0) += v;
        }
        for (k, v) in other.errors {
            *self.errors.entry(k).or_insert(0) += v;
        }
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.advances += other.advances;
        self.connects += other.connects;
        self.finished = self.finished.max(other.finished);
    }
}

fn histogram() -> Histogram<u64> {
    // The bounds are constants that hdrhistogram accepts (1 <= low, high >= 2 * low,
    // sigfigs <= 5), so this cannot fail; fall back to an auto-resizing one anyway.
    Histogram::new_with_bounds(1, LATENCY_US_MAX, LATENCY_SIGFIGS).unwrap_or_else(|_| {
        Histogram::new(LATENCY_SIGFIGS).unwrap_or_else(|_| unreachable!("sigfigs 3 is valid"))
    })
}

/// Whether the next request is measured, warm-up, or not sent at all.
enum Slot {
    Warmup,
    Measured,
    Done,
}

impl Plan {
    fn next_slot(&self, shared: &Shared) -> Slot {
        if shared.stop.load(Ordering::Relaxed) {
            return Slot::Done;
        }
        let now = Instant::now();
        if now < self.measure_from {
            return Slot::Warmup;
        }
        match (self.end, self.requests) {
            (Some(end), _) if now >= end => Slot::Done,
            (Some(_), _) => Slot::Measured,
            (None, Some(n)) => {
                if shared.issued.fetch_add(1, Ordering::Relaxed) < n {
                    Slot::Measured
                } else {
                    Slot::Done
                }
            }
            (None, None) => Slot::Done,
        }
    }

    /// The request to send: the token is drawn here, so a request that advances the
    /// counter is the one that carries the new token.
    fn request(&self, shared: &Shared, advance: bool) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(self.body.clone()));
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.target.clone();
        let headers = request.headers_mut();
        headers.insert(header::HOST, self.authority.clone());
        if !self.body.is_empty()
            || matches!(self.method, Method::POST | Method::PUT | Method::PATCH)
        {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(self.body.len()));
        }
        if let Some(ct) = &self.content_type {
            headers.insert(header::CONTENT_TYPE, ct.clone());
        }
        if let Some(scope) = &self.scope {
            headers.insert(palisade_proxy::FENCING_SCOPE, scope.clone());
        }
        if self.tokens {
            let token = if advance {
                shared.token.fetch_add(1, Ordering::SeqCst) + 1
            } else {
                shared.token.load(Ordering::SeqCst)
            };
            headers.insert(palisade_proxy::FENCING_TOKEN, HeaderValue::from(token));
        }
        request
    }
}

/// Opens one HTTP/1.1 connection and drives it on its own task.
async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake {addr}: {e}"))?;
    tokio::spawn(async move {
        // The connection ends when the sender is dropped or the server closes it; the
        // worker notices through the sender and reconnects.
        let _ = conn.await;
    });
    Ok(sender)
}

/// Sends one request and reads its answer whole; returns the status.
async fn exchange(
    sender: &mut SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> Result<u16, (&'static str, String)> {
    sender
        .ready()
        .await
        .map_err(|e| ("io", format!("connection not ready: {e}")))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| ("io", format!("request failed: {e}")))?;
    let status = response.status().as_u16();
    response
        .into_body()
        .collect()
        .await
        .map_err(|e| ("io", format!("reading the body failed: {e}")))?;
    Ok(status)
}

/// One connection's loop: send, wait for the whole answer, record, repeat.
async fn worker(plan: Arc<Plan>, shared: Arc<Shared>) -> Tally {
    let mut tally = Tally::new();
    let mut sender: Option<SendRequest<Full<Bytes>>> = None;
    // Bresenham-style share: exactly `advance_share` of this worker's requests advance,
    // evenly spread, without a random number generator.
    let mut advance_credit = 0.0_f64;
    loop {
        let measured = match plan.next_slot(&shared) {
            Slot::Done => break,
            Slot::Warmup => false,
            Slot::Measured => true,
        };
        let current = match sender.as_mut() {
            Some(s) if !s.is_closed() => s,
            _ => match connect(plan.addr).await {
                Ok(s) => {
                    tally.connects += 1;
                    sender.insert(s)
                }
                Err(message) => {
                    if measured {
                        tally.error("connect", message);
                        tally.finished = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(CONNECT_RETRY_MS)).await;
                    continue;
                }
            },
        };
        advance_credit += plan.advance_share;
        let advance = advance_credit >= 1.0;
        if advance {
            advance_credit -= 1.0;
        }
        let request = plan.request(&shared, advance);
        let started = Instant::now();
        let result = tokio::time::timeout(plan.timeout, exchange(current, request)).await;
        let ended = Instant::now();
        let result = result.unwrap_or_else(|_| {
            Err((
                "timeout",
                format!("no complete answer within {} ms", plan.timeout.as_millis()),
            ))
        });
        if result.is_err() {
            // The connection's state is unknown after a failure: open a new one.
            sender = None;
        }
        if !measured {
            continue;
        }
        tally.finished = Some(ended);
        if advance {
            tally.advances += 1;
        }
        match result {
            Ok(status) => {
                let us = u64::try_from(ended.duration_since(started).as_micros())
                    .unwrap_or(u64::MAX)
                    .max(1);
                tally.latency_us.saturating_record(us);
                *tally.statuses.entry(status).or_insert(0) += 1;
            }
            Err((kind, message)) => tally.error(kind, message),
        }
    }
    tally
}

/// `--hold`: open every connection, send one request on each so the server has set it
/// up completely, then keep them idle until the duration ends or a signal arrives.
async fn hold(plan: &Arc<Plan>, shared: &Arc<Shared>) -> Result<(), Failure> {
    let mut opening = JoinSet::new();
    for _ in 0..plan.connections {
        let plan = Arc::clone(plan);
        let shared = Arc::clone(shared);
        opening.spawn(async move {
            let mut sender = connect(plan.addr).await?;
            let request = plan.request(&shared, false);
            let status = tokio::time::timeout(plan.timeout, exchange(&mut sender, request))
                .await
                .map_err(|_| "timeout".to_owned())?
                .map_err(|(_, m)| m)?;
            Ok::<_, String>((sender, status))
        });
    }
    let mut held = Vec::with_capacity(plan.connections as usize);
    let mut failed = 0_u64;
    let mut first_error = None;
    while let Some(joined) = opening.join_next().await {
        match joined {
            Ok(Ok((sender, _status))) => held.push(sender),
            Ok(Err(e)) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
            Err(e) => return Err(Failure::Runtime(format!("a connection task failed: {e}"))),
        }
    }
    println!("holding {} connections ({failed} failed)", held.len());
    if let Some(e) = &first_error {
        eprintln!("palisade bench: first connection error: {e}");
    }
    let end = plan.end.unwrap_or_else(Instant::now);
    tokio::select! {
        () = tokio::time::sleep_until(end.into()) => {}
        () = crate::shutdown_signal() => {}
    }
    let open = held.iter().filter(|s| !s.is_closed()).count();
    println!("released {open} connections still open");
    drop(held);
    if open == 0 && failed > 0 {
        return Err(Failure::Runtime(format!(
            "no connection could be held; first error: {}",
            first_error.unwrap_or_default()
        )));
    }
    Ok(())
}

/// Latency percentiles in microseconds.
#[derive(Serialize)]
struct Percentiles {
    p50: u64,
    p90: u64,
    p99: u64,
    p999: u64,
    max: u64,
    mean: f64,
}

/// The result of a load run, as printed.
#[derive(Serialize)]
struct Report {
    url: String,
    method: String,
    connections: u32,
    body_bytes: usize,
    /// Length of the measured window.
    seconds: f64,
    /// Requests answered with any status.
    answered: u64,
    /// Answered per second.
    rps: f64,
    /// 2xx answers.
    ok: u64,
    /// 2xx answers per second.
    ok_rps: f64,
    /// Answers with any other status.
    non_2xx: u64,
    /// Requests without an answer (connect, I/O, timeout).
    errors: u64,
    statuses: BTreeMap<u16, u64>,
    error_kinds: BTreeMap<&'static str, u64>,
    first_error: Option<String>,
    /// Requests that carried a newly drawn token, and the last token drawn.
    advances: u64,
    last_token: Option<u64>,
    /// Connections opened during the measured window and before (warm-up).
    connects: u64,
    latency_us: Percentiles,
}

impl Report {
    fn new(plan: &Plan, url: &str, t: &Tally, elapsed: Duration, last_token: u64) -> Self {
        let seconds = elapsed.as_secs_f64();
        let per_s = |n: u64| {
            if seconds > 0.0 {
                count_f64(n) / seconds
            } else {
                0.0
            }
        };
        let answered: u64 = t.statuses.values().sum();
        let ok: u64 = t
            .statuses
            .iter()
            .filter(|(s, _)| (200..300).contains(*s))
            .map(|(_, n)| n)
            .sum();
        let h = &t.latency_us;
        Self {
            url: url.to_owned(),
            method: plan.method.to_string(),
            connections: plan.connections,
            body_bytes: plan.body.len(),
            seconds,
            answered,
            rps: per_s(answered),
            ok,
            ok_rps: per_s(ok),
            non_2xx: answered - ok,
            errors: t.errors.values().sum(),
            statuses: t.statuses.clone(),
            error_kinds: t.errors.clone(),
            first_error: t.first_error.clone(),
            advances: t.advances,
            last_token: plan.tokens.then_some(last_token),
            connects: t.connects,
            latency_us: Percentiles {
                p50: h.value_at_quantile(0.50),
                p90: h.value_at_quantile(0.90),
                p99: h.value_at_quantile(0.99),
                p999: h.value_at_quantile(0.999),
                max: h.max(),
                mean: h.mean(),
            },
        }
    }

    fn text(&self) -> String {
        use std::fmt::Write as _;
        let ms = |us: u64| count_f64(us) / 1000.0;
        let l = &self.latency_us;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} {}: {} connections, {:.2} s, {}-byte bodies",
            self.method, self.url, self.connections, self.seconds, self.body_bytes
        );
        let _ = writeln!(
            out,
            "  requests   {:>10}   {:>10.1} req/s",
            self.answered, self.rps
        );
        let _ = writeln!(
            out,
            "  2xx        {:>10}   {:>10.1} req/s",
            self.ok, self.ok_rps
        );
        let statuses = self
            .statuses
            .iter()
            .filter(|(s, _)| !(200..300).contains(*s))
            .map(|(s, n)| format!("{s}: {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(out, "  non-2xx    {:>10}   {statuses}", self.non_2xx);
        let kinds = self
            .error_kinds
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(out, "  errors     {:>10}   {kinds}", self.errors);
        if let Some(e) = &self.first_error {
            let _ = writeln!(out, "  first error: {e}");
        }
        if let Some(token) = self.last_token {
            let _ = writeln!(
                out,
                "  tokens     {:>10} advances, last token {token}",
                self.advances
            );
        }
        let _ = writeln!(
            out,
            "  latency    p50 {:.3} ms   p90 {:.3} ms   p99 {:.3} ms   p99.9 {:.3} ms   max {:.3} ms",
            ms(l.p50),
            ms(l.p90),
            ms(l.p99),
            ms(l.p999),
            ms(l.max)
        );
        out
    }
}

/// A count or a latency in microseconds as `f64`, for rates and milliseconds. Both stay
/// far below 2^52, where `f64` would start rounding.
#[allow(clippy::cast_precision_loss)]
fn count_f64(n: u64) -> f64 {
    n as f64
}

/// The median of `values` (the mean of the two middle ones for an even count).
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        f64::midpoint(v[mid - 1], v[mid])
    } else {
        v[mid]
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }

    fn plan(args: &[&str]) -> Result<Plan, Failure> {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .map_err(|e| Failure::Usage(e.to_string()))?;
        cli.load.plan(([127, 0, 0, 1], 1).into())
    }

    /// Bad flag combinations are usage errors (exit 2), each naming the flag.
    #[test]
    fn bad_flags_are_usage_errors() {
        for (args, flag) in [
            (
                &["--advance-share", "1.5", "--token", "1"][..],
                "--advance-share",
            ),
            (&["--advance-share", "0.5"][..], "--token"),
            (&["--method", "NOT A METHOD"][..], "--method"),
            (&["--body-bytes", "999999999"][..], "--body-bytes"),
            (&["--scope", "no spaces"][..], "--scope"),
            (&["--duration", "0"][..], "--duration"),
            (&["--requests", "0"][..], "--requests"),
            (&["--timeout-ms", "0"][..], "--timeout-ms"),
            (&["--hold", "--requests", "5"][..], "--hold"),
        ] {
            match plan(args) {
                Err(Failure::Usage(m)) => assert!(m.contains(flag), "{args:?}: {m}"),
                Err(Failure::Runtime(m)) => panic!("{args:?}: runtime error {m}"),
                Ok(_) => panic!("{args:?} was accepted"),
            }
        }
        assert!(plan(&["--connections", "0"]).is_err());
        assert!(plan(&["--connections", "10001"]).is_err());
        assert!(plan(&["--duration", "1", "--requests", "5"]).is_err());
    }

    /// Advancing requests draw strictly rising tokens; the others repeat the latest.
    #[test]
    fn advancing_tokens_only_rise() {
        let p = plan(&["--token", "7", "--advance-share", "0.5", "--method", "put"])
            .unwrap_or_else(|_| panic!("valid flags"));
        let shared = Shared {
            token: AtomicU64::new(7),
            issued: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        };
        let token = |r: &Request<Full<Bytes>>| -> u64 {
            r.headers()[palisade_proxy::FENCING_TOKEN]
                .to_str()
                .unwrap_or_default()
                .parse()
                .unwrap_or_default()
        };
        assert_eq!(token(&p.request(&shared, false)), 7);
        assert_eq!(token(&p.request(&shared, true)), 8);
        assert_eq!(token(&p.request(&shared, false)), 8);
        assert_eq!(token(&p.request(&shared, true)), 9);
        let r = p.request(&shared, false);
        assert_eq!(r.method(), Method::PUT);
        assert_eq!(r.headers()[header::CONTENT_LENGTH], "0");
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }
}
