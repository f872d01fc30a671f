//! The closed loop: one task per connection sending its next request when the previous
//! answer has been read whole; warm-up; `--hold`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use palisade_client::backoff;
use palisade_protocol::headers::{FENCING_SCOPE, FENCING_TOKEN};
use std::net::SocketAddr;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use super::args::{LoadArgs, Plan, resolve};
use super::cpu;
use super::report::{Report, Tally};
use crate::Failure;

/// First pause after a failed connect, so a refused port does not become a busy loop.
const CONNECT_RETRY_MIN_MS: u64 = 20;
/// Longest pause (before jitter) between connects to a port that keeps refusing: short,
/// since a benchmark wants its connections back as soon as the server is.
const CONNECT_RETRY_MAX_MS: u64 = 200;

/// State the workers share while running.
pub(super) struct Shared {
    /// The highest token handed out so far.
    pub(super) token: AtomicU64,
    /// Measured requests started (requests mode).
    pub(super) issued: AtomicU64,
    /// Set on SIGINT/SIGTERM: workers stop after their current request.
    pub(super) stop: AtomicBool,
}

pub(super) async fn run_load(args: LoadArgs) -> Result<(), Failure> {
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

    let plan_for_total = Arc::clone(&plan);
    let mut workers = JoinSet::new();
    // CPU of the --pid processes: sampled when measuring starts and when it ends.
    let cpu_start = (!plan.pids.is_empty()).then(|| {
        let pids = plan.pids.clone();
        let at = plan.measure_from;
        tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            cpu::sample(&pids)
        })
    });
    for connection in 0..plan.connections as usize {
        workers.spawn(worker(Arc::clone(&plan), Arc::clone(&shared), connection));
    }
    let collect = async move {
        let mut total = Tally::new(&plan_for_total);
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
    let cpu_end = cpu::sample(&plan.pids);
    let finished = total.finished.unwrap_or_else(Instant::now);
    let elapsed = finished.saturating_duration_since(plan.measure_from);
    let mut report = Report::new(
        &plan,
        &url,
        &total,
        elapsed,
        shared.token.load(Ordering::SeqCst),
    );
    if let Some(start) = cpu_start {
        let start = start
            .await
            .map_err(|e| Failure::Runtime(format!("CPU sampling failed: {e}")))?;
        report.set_cpu(cpu::usage(&plan.pids, &start?, &cpu_end?, report.answered));
    }
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
    pub(super) fn request(
        &self,
        shared: &Shared,
        connection: usize,
        advance: bool,
    ) -> Request<Full<Bytes>> {
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
        if !self.scopes.is_empty() {
            let scope = &self.scopes[connection % self.scopes.len()];
            headers.insert(FENCING_SCOPE, scope.clone());
        }
        if self.tokens {
            let token = if advance {
                shared.token.fetch_add(1, Ordering::SeqCst) + 1
            } else {
                shared.token.load(Ordering::SeqCst)
            };
            headers.insert(FENCING_TOKEN, HeaderValue::from(token));
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
async fn worker(plan: Arc<Plan>, shared: Arc<Shared>, connection: usize) -> Tally {
    let mut tally = Tally::new(&plan);
    let mut sender: Option<SendRequest<Full<Bytes>>> = None;
    let reconnect = || {
        backoff::delays(
            Duration::from_millis(CONNECT_RETRY_MIN_MS),
            Duration::from_millis(CONNECT_RETRY_MAX_MS),
        )
    };
    let mut delays = reconnect();
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
                    delays = reconnect();
                    sender.insert(s)
                }
                Err(message) => {
                    if measured {
                        tally.error("connect", message);
                        tally.finished = Some(Instant::now());
                    }
                    let delay = delays
                        .next()
                        .unwrap_or(Duration::from_millis(CONNECT_RETRY_MAX_MS));
                    tokio::time::sleep(delay).await;
                    continue;
                }
            },
        };
        advance_credit += plan.advance_share;
        let advance = advance_credit >= 1.0;
        if advance {
            advance_credit -= 1.0;
        }
        let request = plan.request(&shared, connection, advance);
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
    for connection in 0..plan.connections as usize {
        let plan = Arc::clone(plan);
        let shared = Arc::clone(shared);
        opening.spawn(async move {
            let mut sender = connect(plan.addr).await?;
            let request = plan.request(&shared, connection, false);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::args::tests::plan;

    /// Goal: advancing requests draw strictly rising tokens; the others repeat the latest.
    /// Method: build four requests from one shared counter.
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
            r.headers()[FENCING_TOKEN]
                .to_str()
                .unwrap_or_default()
                .parse()
                .unwrap_or_default()
        };
        assert_eq!(token(&p.request(&shared, 0, false)), 7);
        assert_eq!(token(&p.request(&shared, 0, true)), 8);
        assert_eq!(token(&p.request(&shared, 0, false)), 8);
        assert_eq!(token(&p.request(&shared, 0, true)), 9);
        let r = p.request(&shared, 0, false);
        assert_eq!(r.method(), Method::PUT);
        assert_eq!(r.headers()[header::CONTENT_LENGTH], "0");
    }

    /// Goal: `--scopes N` spreads connections over N scopes, connection i on `S-(i mod N)`;
    /// without it every request names the one `--scope`.
    /// Method: build requests for several connection indexes and read `Fencing-Scope`.
    #[test]
    fn scopes_are_spread_over_connections() {
        let shared = Shared {
            token: AtomicU64::new(1),
            issued: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        };
        let scope_of = |p: &Plan, connection: usize| -> String {
            p.request(&shared, connection, false).headers()[FENCING_SCOPE]
                .to_str()
                .unwrap_or_default()
                .to_owned()
        };
        let spread = plan(&["--token", "1", "--scope", "bench", "--scopes", "3"])
            .unwrap_or_else(|_| panic!("valid flags"));
        let names: Vec<String> = (0..5).map(|c| scope_of(&spread, c)).collect();
        assert_eq!(
            names,
            ["bench-0", "bench-1", "bench-2", "bench-0", "bench-1"]
        );
        let single =
            plan(&["--token", "1", "--scope", "bench"]).unwrap_or_else(|_| panic!("valid flags"));
        assert_eq!(scope_of(&single, 4), "bench");
        assert!(
            plan(&["--scopes", "3"]).is_err(),
            "--scopes without --scope"
        );
        assert!(plan(&["--pid", "0"]).is_err(), "pid 0");
    }
}
