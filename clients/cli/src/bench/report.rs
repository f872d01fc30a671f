//! What a load run measured: per-worker tallies with a latency histogram, merged, and
//! the report printed from them (text or JSON).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::args::Plan;

/// What one worker (or, merged, all of them) saw during the measured window.
pub(super) struct Tally {
    pub(super) latency_us: Histogram<u64>,
    pub(super) statuses: BTreeMap<u16, u64>,
    pub(super) errors: BTreeMap<&'static str, u64>,
    pub(super) first_error: Option<String>,
    /// Requests that carried a newly drawn token.
    pub(super) advances: u64,
    pub(super) connects: u64,
    /// When the last measured request ended.
    pub(super) finished: Option<Instant>,
}

impl Tally {
    /// An empty tally whose histogram has `plan`'s bounds.
    pub(super) fn new(plan: &Plan) -> Self {
        Self {
            latency_us: plan.latency_us.clone(),
            statuses: BTreeMap::new(),
            errors: BTreeMap::new(),
            first_error: None,
            advances: 0,
            connects: 0,
            finished: None,
        }
    }

    pub(super) fn error(&mut self, kind: &'static str, message: String) {
        *self.errors.entry(kind).or_insert(0) += 1;
        self.first_error.get_or_insert(message);
    }

    pub(super) fn merge(&mut self, other: Self) {
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
pub(super) struct Report {
    url: String,
    method: String,
    connections: u32,
    body_bytes: usize,
    /// Length of the measured window.
    seconds: f64,
    /// Requests answered with any status.
    pub(super) answered: u64,
    /// Answered per second.
    rps: f64,
    /// 2xx answers.
    ok: u64,
    /// 2xx answers per second.
    ok_rps: f64,
    /// Answers with any other status.
    non_2xx: u64,
    /// Requests without an answer (connect, I/O, timeout).
    pub(super) errors: u64,
    statuses: BTreeMap<u16, u64>,
    error_kinds: BTreeMap<&'static str, u64>,
    first_error: Option<String>,
    /// Requests that carried a newly drawn token, and the last token drawn.
    advances: u64,
    last_token: Option<u64>,
    /// Connections opened during the measured window and before (warm-up).
    connects: u64,
    latency_us: Percentiles,
    /// CPU of the `--pid` processes over the measured window (empty without `--pid`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    cpu: Vec<super::cpu::Usage>,
}

impl Report {
    pub(super) fn new(
        plan: &Plan,
        url: &str,
        t: &Tally,
        elapsed: Duration,
        last_token: u64,
    ) -> Self {
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
            cpu: Vec::new(),
        }
    }

    /// Adds the CPU of the `--pid` processes.
    pub(super) fn set_cpu(&mut self, cpu: Vec<super::cpu::Usage>) {
        self.cpu = cpu;
    }

    pub(super) fn text(&self) -> String {
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
        for cpu in &self.cpu {
            let per_request = cpu
                .us_per_request
                .map_or_else(|| "-".to_owned(), |us| format!("{us:.2} µs/request"));
            let _ = writeln!(
                out,
                "  cpu        pid {}: {:.3} s   {per_request}",
                cpu.pid, cpu.cpu_s
            );
        }
        out
    }
}

/// A count or a latency in microseconds as `f64`, for rates and milliseconds. Both stay
/// far below 2^52, where `f64` would start rounding.
#[allow(clippy::cast_precision_loss)]
fn count_f64(n: u64) -> f64 {
    n as f64
}
