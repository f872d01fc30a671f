//! The three measures of `palisade bench scopes`, each against a [`Target`], each
//! returning its report as JSON.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::super::cpu;
use super::{CALL_TIMEOUT_MS, ScopesArgs, Target};
use crate::Failure;

/// Longest a handover may take before the run fails: far above any grant's latency,
/// short enough that a stuck run ends.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for every contender to be queued.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(60);
/// Scope names each grants worker cycles through.
const GRANT_SCOPES_PER_WORKER: usize = 16;
/// Highest latency the histograms tell apart, in microseconds (a call's timeout).
const LATENCY_US_MAX: u64 = CALL_TIMEOUT_MS * 1000;

/// Percentiles of a list of values (milliseconds).
#[derive(Serialize)]
struct Spread {
    count: usize,
    median: Option<f64>,
    p99: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
}

impl Spread {
    /// Nearest-rank percentiles of `values`.
    #[allow(clippy::cast_sign_loss, clippy::cast_precision_loss)]
    fn of(values: &[f64]) -> Self {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            if v.is_empty() {
                return None;
            }
            let n = v.len() as f64;
            let i = ((p * n).ceil() as usize).clamp(1, v.len()) - 1;
            Some(v[i])
        };
        Self {
            count: v.len(),
            median: super::super::median(&v),
            p99: rank(0.99),
            min: v.first().copied(),
            max: v.last().copied(),
        }
    }
}

/// A count or a number of microseconds as `f64`; all stay far below 2^52.
#[allow(clippy::cast_precision_loss)]
fn float(n: impl Into<u64>) -> f64 {
    n.into() as f64
}

/// A `usize` count as `f64`.
fn float_of(n: usize) -> f64 {
    float(u64::try_from(n).unwrap_or(u64::MAX))
}

/// Percentiles of a latency histogram, in milliseconds.
fn latency_ms(h: &Histogram<u64>) -> serde_json::Value {
    let q = |p: f64| float(h.value_at_quantile(p)) / 1000.0;
    serde_json::json!({
        "count": h.len(), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": float(h.max()) / 1000.0,
    })
}

fn histogram() -> Result<Histogram<u64>, Failure> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3)
        .map_err(|e| Failure::Runtime(format!("latency histogram: {e}")))
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Signed milliseconds from `a` to `b`.
fn ms_between(a: Instant, b: Instant) -> f64 {
    if b >= a {
        (b - a).as_secs_f64() * 1000.0
    } else {
        -(a - b).as_secs_f64() * 1000.0
    }
}

/// Opens `n` sessions with `workers` in parallel; their ids and the seconds it took.
async fn open_sessions(
    target: &Arc<Target>,
    n: usize,
    workers: usize,
    ttl: Duration,
) -> Result<(Vec<String>, f64), Failure> {
    let started = Instant::now();
    let mut set = JoinSet::new();
    for w in 0..workers.min(n) {
        let target = Arc::clone(target);
        let count = (w..n).step_by(workers).count();
        set.spawn(async move {
            let mut ids = Vec::with_capacity(count);
            for _ in 0..count {
                ids.push(target.open(ttl).await?);
            }
            Ok::<_, Failure>(ids)
        });
    }
    let mut ids = Vec::with_capacity(n);
    while let Some(joined) = set.join_next().await {
        ids.extend(joined.map_err(|e| Failure::Runtime(format!("opening sessions: {e}")))??);
    }
    Ok((ids, started.elapsed().as_secs_f64()))
}

/// Revokes `ids` with `workers` in parallel, ignoring failures (the run is over).
async fn revoke_sessions(target: &Arc<Target>, ids: Vec<String>, workers: usize) {
    let ids = Arc::new(ids);
    let mut set = JoinSet::new();
    for w in 0..workers.max(1) {
        let (target, ids) = (Arc::clone(target), Arc::clone(&ids));
        set.spawn(async move {
            for id in ids.iter().skip(w).step_by(workers.max(1)) {
                let _ = target.revoke(id).await;
            }
        });
    }
    while set.join_next().await.is_some() {}
}

/// Keeps `ids` alive every `every` until dropped (a handover's or a grants run's few
/// sessions, outside what is measured).
fn keep_alive(target: &Arc<Target>, ids: Vec<String>, every: Duration) -> tokio::task::AbortHandle {
    let target = Arc::clone(target);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            for id in &ids {
                let _ = target.keepalive(id).await;
            }
        }
    })
    .abort_handle()
}

/// CPU samples at the start and the end of a window, and its length in seconds.
type Samples = (Vec<cpu::Sample>, Vec<cpu::Sample>, f64);

/// The CPU of `pids` and of this process between two instants.
struct CpuWindow {
    pids: Vec<i32>,
    task: tokio::task::JoinHandle<Result<Samples, Failure>>,
}

impl CpuWindow {
    fn start(pids: &[i32], from: Instant, to: Instant) -> Self {
        let mut pids = pids.to_vec();
        pids.push(i32::try_from(std::process::id()).unwrap_or(i32::MAX));
        let sampled = pids.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep_until(from.into()).await;
            let (a, at) = (cpu::sample(&sampled)?, Instant::now());
            tokio::time::sleep_until(to.into()).await;
            let b = cpu::sample(&sampled)?;
            Ok((a, b, at.elapsed().as_secs_f64()))
        });
        Self { pids, task }
    }

    /// The servers' CPU seconds (each, and summed), this process's, and the window.
    async fn finish(self, operations: u64) -> Result<serde_json::Value, Failure> {
        let (a, b, window) = self
            .task
            .await
            .map_err(|e| Failure::Runtime(format!("CPU sampling: {e}")))??;
        let used = cpu::usage(&self.pids, &a, &b, operations);
        let (own, servers) = used
            .split_last()
            .ok_or_else(|| Failure::Runtime("no CPU samples".into()))?;
        let total: f64 = servers.iter().map(|u| u.cpu_s).sum();
        let per_k = (operations > 0).then(|| total * 1e3 * 1000.0 / float(operations));
        Ok(serde_json::json!({
            "window_s": window,
            "servers_cpu_s": total,
            "servers_cpu_per_s": total / window,
            "servers_cpu_ms_per_1000_ops": per_k,
            "servers": servers.iter().map(|u| serde_json::json!({"pid": u.pid, "cpu_s": u.cpu_s})).collect::<Vec<_>>(),
            "generator_cpu_s": own.cpu_s,
            "generator_cpu_per_s": own.cpu_s / window,
        }))
    }
}

fn to_json(v: impl Serialize) -> Result<serde_json::Value, Failure> {
    serde_json::to_value(v).map_err(|e| Failure::Runtime(e.to_string()))
}

/// Waits until `want` sessions wait on `scope`.
async fn await_queue(target: &Target, scope: &str, want: usize) -> Result<(), Failure> {
    let deadline = Instant::now() + QUEUE_TIMEOUT;
    loop {
        let n = target.waiting(scope).await?;
        if n >= want {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Failure::Runtime(format!(
                "{scope}: {n} of {want} contenders queued after {QUEUE_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Acquisition latency after the holder resigns, with `--contenders` waiting.
pub(super) async fn handover(
    target: &Arc<Target>,
    args: &ScopesArgs,
) -> Result<serde_json::Value, Failure> {
    let scope = format!("{}-handover", args.tag);
    let ttl = Duration::from_millis(args.ttl_ms);
    let contenders = args.contenders as usize;
    let (ids, _) = open_sessions(target, contenders + 1, 16, ttl).await?;
    let keeper = keep_alive(target, ids.clone(), ttl / 3);
    target.campaign(&scope, &ids[0]).await?;
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Instant, Result<u64, Failure>)>();
    let mut waiters = JoinSet::new();
    let spawn = |waiters: &mut JoinSet<()>, i: usize| {
        let (target, tx, scope, id) = (
            Arc::clone(target),
            tx.clone(),
            scope.clone(),
            ids[i].clone(),
        );
        waiters.spawn(async move {
            let result = target.campaign(&scope, &id).await;
            let _ = tx.send((i, Instant::now(), result));
        });
    };
    for i in 1..=contenders {
        spawn(&mut waiters, i);
        // Queue them in order, so the first handovers do not wait for the last to queue.
        await_queue(target, &scope, i).await?;
    }
    let mut after_return = Vec::new();
    let mut after_send = Vec::new();
    let mut resign_ms = Vec::new();
    let mut holder = 0;
    for _ in 0..args.handovers {
        tokio::time::sleep(Duration::from_millis(args.pause_ms)).await;
        await_queue(target, &scope, contenders).await?;
        let sent = Instant::now();
        target.resign(&scope, &ids[holder]).await?;
        let returned = Instant::now();
        let (next, granted, result) = tokio::time::timeout(HANDOVER_TIMEOUT, rx.recv())
            .await
            .map_err(|_| {
                Failure::Runtime(format!(
                    "no grant within {HANDOVER_TIMEOUT:?} of a resignation"
                ))
            })?
            .ok_or_else(|| Failure::Runtime("the contenders are gone".into()))?;
        result?;
        after_return.push(ms_between(returned, granted));
        after_send.push(ms_between(sent, granted));
        resign_ms.push(ms_between(sent, returned));
        // The resigned holder queues again at the end, so as many always wait.
        spawn(&mut waiters, holder);
        holder = next;
    }
    keeper.abort();
    waiters.abort_all();
    revoke_sessions(target, ids, 16).await;
    let answered_first = after_return.iter().filter(|&&ms| ms < 0.0).count();
    to_json(serde_json::json!({
        "scope": scope,
        "contenders": contenders,
        "handovers": after_return.len(),
        "after_resign_returned_ms": Spread::of(&after_return),
        "after_resign_sent_ms": Spread::of(&after_send),
        "resign_call_ms": Spread::of(&resign_ms),
        "granted_before_resign_returned": answered_first,
        "samples_ms": after_return,
        "samples_sent_ms": after_send,
    }))
}

/// Server CPU of `--sessions` sessions kept alive every `--interval-ms`.
pub(super) async fn keepalive(
    target: &Arc<Target>,
    args: &ScopesArgs,
) -> Result<serde_json::Value, Failure> {
    let ttl = Duration::from_millis(args.ttl_ms);
    let workers = args.concurrency as usize;
    let sessions = args.sessions as usize;
    let interval = Duration::from_millis(args.interval_ms);
    let start = Instant::now() + Duration::from_millis(100);
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let end = measure_from + Duration::from_secs_f64(args.duration);
    let window = CpuWindow::start(&args.pids, measure_from, end);
    let mut set = JoinSet::new();
    for w in 0..workers {
        let target = Arc::clone(target);
        set.spawn(async move {
            let mut tally = Tally::new()?;
            // Session g's turn is g/N of the interval into each round, so the load is
            // spread evenly over the interval. Its first turn opens it, so that no
            // session waits for the others to open (opening them all takes longer than
            // a TTL); the warm-up leaves time for every session to be open.
            let mine: Vec<usize> = (w..sessions).step_by(workers).collect();
            let mut ids: Vec<Option<String>> = vec![None; mine.len()];
            let mut last_open = None;
            'rounds: for round in 0_u32.. {
                for (k, &g) in mine.iter().enumerate() {
                    let offset = interval.mul_f64(float_of(g) / float_of(sessions));
                    let due = start + interval * round + offset;
                    tokio::time::sleep_until(due.into()).await;
                    let sent = Instant::now();
                    if sent >= end {
                        break 'rounds;
                    }
                    let Some(id) = &ids[k] else {
                        ids[k] = Some(target.open(ttl).await?);
                        last_open = Some(Instant::now());
                        tally.opens_in_window += u64::from(sent >= measure_from);
                        continue;
                    };
                    let result = target.keepalive(id).await;
                    // Counted by when it was sent, so the rate is what the servers had
                    // to answer within the window the CPU is measured over.
                    if sent >= measure_from {
                        tally.record(sent, due, result);
                    }
                }
            }
            Ok::<_, Failure>((tally, ids, last_open))
        });
    }
    let mut total = Tally::new()?;
    let mut ids = Vec::with_capacity(sessions);
    let mut all_open = start;
    while let Some(joined) = set.join_next().await {
        let (tally, opened, last_open) =
            joined.map_err(|e| Failure::Runtime(format!("a keepalive worker: {e}")))??;
        total.merge(tally);
        ids.extend(opened.into_iter().flatten());
        all_open = all_open.max(last_open.unwrap_or(start));
    }
    let cpu = window.finish(total.ok).await?;
    let opened = ids.len();
    revoke_sessions(target, ids, workers).await;
    let seconds = args.duration;
    to_json(serde_json::json!({
        "sessions": sessions,
        "opened": opened,
        "interval_ms": args.interval_ms,
        "ttl_ms": args.ttl_ms,
        "workers": workers,
        "all_open_after_s": (all_open - start).as_secs_f64(),
        "opens_in_window": total.opens_in_window,
        "wanted_per_s": float_of(sessions) * 1000.0 / float(args.interval_ms),
        "sent_per_s": float(total.sent) / seconds,
        "answered_per_s": float(total.ok) / seconds,
        "sent": total.sent,
        "answered": total.ok,
        "errors": total.errors,
        "first_error": total.first_error,
        "sent_late_100ms": total.late,
        "latency_ms": latency_ms(&total.latency_us),
        "cpu": cpu,
    }))
}

/// Grants per second: each worker acquires and releases its own scopes in a loop.
pub(super) async fn grants(
    target: &Arc<Target>,
    args: &ScopesArgs,
) -> Result<serde_json::Value, Failure> {
    let ttl = Duration::from_millis(args.ttl_ms);
    let workers = args.concurrency as usize;
    let (ids, _) = open_sessions(target, workers, workers, ttl).await?;
    let keeper = keep_alive(target, ids.clone(), ttl / 3);
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let end = measure_from + Duration::from_secs_f64(args.duration);
    let window = CpuWindow::start(&args.pids, measure_from, end);
    let failed = Arc::new(AtomicBool::new(false));
    let mut set = JoinSet::new();
    for (w, id) in ids.iter().cloned().enumerate() {
        let (target, failed) = (Arc::clone(target), Arc::clone(&failed));
        let tag = args.tag.clone();
        set.spawn(async move {
            let mut acquire = histogram()?;
            let mut cycle = histogram()?;
            let mut grants = 0_u64;
            for k in 0.. {
                let t0 = Instant::now();
                if t0 >= end || failed.load(Ordering::Relaxed) {
                    break;
                }
                let scope = format!("{tag}-g{w}-{}", k % GRANT_SCOPES_PER_WORKER);
                let run = async {
                    target.acquire(&scope, &id).await?;
                    let t1 = Instant::now();
                    target.release(&scope, &id).await?;
                    Ok::<_, Failure>(t1)
                };
                let t1 = match run.await {
                    Ok(t1) => t1,
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                };
                if t0 >= measure_from {
                    grants += 1;
                    let _ = acquire.record(micros(t1 - t0));
                    let _ = cycle.record(micros(t0.elapsed()));
                }
            }
            Ok::<_, Failure>((grants, acquire, cycle))
        });
    }
    let (mut grants, mut acquire, mut cycle) = (0, histogram()?, histogram()?);
    while let Some(joined) = set.join_next().await {
        let (g, a, c) = joined.map_err(|e| Failure::Runtime(format!("a grants worker: {e}")))??;
        grants += g;
        let _ = acquire.add(&a);
        let _ = cycle.add(&c);
    }
    let cpu = window.finish(grants).await?;
    keeper.abort();
    revoke_sessions(target, ids, workers).await;
    to_json(serde_json::json!({
        "workers": workers,
        "seconds": args.duration,
        "grants": grants,
        "grants_per_s": float(grants) / args.duration,
        "acquire_ms": latency_ms(&acquire),
        "acquire_release_ms": latency_ms(&cycle),
        "cpu": cpu,
    }))
}

/// What one keepalive worker saw in the measured window.
struct Tally {
    sent: u64,
    /// Sessions opened in the measured window: the warm-up was too short to open them all.
    opens_in_window: u64,
    ok: u64,
    errors: u64,
    /// Keepalives sent more than 100 ms after they were due: the generator fell behind.
    late: u64,
    first_error: Option<String>,
    latency_us: Histogram<u64>,
}

impl Tally {
    fn new() -> Result<Self, Failure> {
        Ok(Self {
            sent: 0,
            opens_in_window: 0,
            ok: 0,
            errors: 0,
            late: 0,
            first_error: None,
            latency_us: histogram()?,
        })
    }

    fn record(&mut self, sent: Instant, due: Instant, result: Result<(), Failure>) {
        self.sent += 1;
        if sent.saturating_duration_since(due) > Duration::from_millis(100) {
            self.late += 1;
        }
        match result {
            Ok(()) => {
                self.ok += 1;
                let _ = self.latency_us.record(micros(sent.elapsed()));
            }
            Err(e) => {
                self.errors += 1;
                self.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }

    fn merge(&mut self, other: Self) {
        self.sent += other.sent;
        self.opens_in_window += other.opens_in_window;
        self.ok += other.ok;
        self.errors += other.errors;
        self.late += other.late;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        let _ = self.latency_us.add(&other.latency_us);
    }
}
