//! `palisade bench scopes`: named leaderships measured against a Palisade cluster or an
//! etcd cluster, with the same client, so the two can be set side by side.
//!
//! Three measures (`--measure`):
//! - `handover`: `--contenders` sessions wait on one scope while another holds it; the
//!   holder resigns and the time from its resignation's answer until the next
//!   contender's campaign answers is recorded, `--handovers` times (the resigned holder
//!   campaigns again, so as many always wait).
//! - `keepalive`: `--sessions` sessions (etcd: leases), each kept alive every
//!   `--interval-ms`, spread evenly over the interval, for `--warmup` then `--duration`
//!   seconds; reports keepalives sent and answered per second, their latency, the CPU
//!   of the `--pid` processes (the servers) and of this process over the measured window.
//! - `grants`: `--concurrency` workers, each with one session, acquire and release
//!   distinct scopes in a loop for `--duration` seconds: grants per second.
//!
//! Palisade: sessions, `campaign` long polls and `resign` on the established leader.
//! etcd: its v3 JSON gateway on the leader member, the way etcd's Go `concurrency`
//! package campaigns (see `etcd`).
//!
//! # Layout
//! - `http`: the one HTTP/1.1 client both targets are driven through.
//! - `palisade`: the calls against Palisade's node API.
//! - `etcd`: the same against etcd's gateway, as its election package does them.
//! - `measures`: the three measures and what each reports.

mod etcd;
mod http;
mod measures;
mod palisade;

use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::Failure;

/// Most contenders of a handover run: Palisade queues at most 1,024 waiters per scope.
const CONTENDERS_MAX: u32 = 1_000;
/// Most handovers of one run.
const HANDOVERS_MAX: u32 = 10_000;
/// Most sessions of a keepalive run: Palisade's cluster-wide limit (100,000).
const SESSIONS_MAX: u32 = 100_000;
/// Most workers (and so connections) of a keepalive or grants run.
const CONCURRENCY_MAX: u32 = 1_024;
/// Shortest keepalive interval: Palisade refuses keepalives closer than 100 ms.
const INTERVAL_MS_MIN: u64 = 100;
/// Longest measured window, warm-up included, in seconds.
const DURATION_S_MAX: f64 = 3600.0;
/// Longest any single call but a campaign may take before the run fails: the servers
/// answer in milliseconds on loopback.
const CALL_TIMEOUT_MS: u64 = 10_000;

/// Which cluster is measured.
#[derive(Clone, Copy, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Against {
    /// Palisade's node API (`/v1/sessions`, `/v1/scopes/...`).
    Palisade,
    /// etcd's v3 JSON gateway (`/v3/...`).
    Etcd,
}

/// What is measured.
#[derive(Clone, Copy, ValueEnum, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Measure {
    /// Acquisition latency after the holder resigns, with contenders waiting.
    Handover,
    /// Server CPU of many sessions kept alive.
    Keepalive,
    /// Grants (acquire and release) per second.
    Grants,
}

/// Measure named leaderships against a Palisade or an etcd cluster.
#[derive(Args)]
pub(crate) struct ScopesArgs {
    /// The cluster measured.
    #[arg(long, value_enum)]
    against: Against,
    /// What to measure.
    #[arg(long, value_enum)]
    measure: Measure,
    /// Every member's client URL (Palisade: `--api`; etcd: its client URL), comma
    /// separated; the leader is found among them and every call goes to it.
    #[arg(long, value_delimiter = ',', required = true)]
    endpoints: Vec<String>,
    /// Session (lease) TTL in milliseconds; etcd's is this in whole seconds.
    #[arg(long, default_value_t = 5_000)]
    ttl_ms: u64,
    /// handover: sessions waiting on the scope while another holds it.
    #[arg(long, default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(CONTENDERS_MAX)))]
    contenders: u32,
    /// handover: how many handovers to time.
    #[arg(long, default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(HANDOVERS_MAX)))]
    handovers: u32,
    /// handover: pause after each handover before the next resignation, in
    /// milliseconds (the resigned holder campaigns again meanwhile).
    #[arg(long, default_value_t = 100)]
    pause_ms: u64,
    /// keepalive: sessions kept alive.
    #[arg(long, default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(SESSIONS_MAX)))]
    sessions: u32,
    /// keepalive: each session's keepalive interval in milliseconds.
    #[arg(long, default_value_t = 1_000)]
    interval_ms: u64,
    /// keepalive and grants: concurrent workers, each with its own connection.
    #[arg(long, default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(CONCURRENCY_MAX)))]
    concurrency: u32,
    /// keepalive and grants: seconds measured.
    #[arg(long, default_value_t = 20.0)]
    duration: f64,
    /// keepalive and grants: seconds of load before measuring.
    #[arg(long, default_value_t = 5.0)]
    warmup: f64,
    /// The servers' process ids, whose CPU time over the measured window is reported.
    #[arg(long = "pid", value_delimiter = ',')]
    pids: Vec<i32>,
    /// A name that keeps this run's scopes apart from earlier runs' on the same cluster.
    #[arg(long, default_value = "bench")]
    tag: String,
    /// Print the report as one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// The measured cluster's leader, reached the same way whatever it is.
enum Target {
    Palisade(palisade::Palisade),
    Etcd(etcd::Etcd),
}

impl Target {
    async fn connect(against: Against, endpoints: &[String]) -> Result<Self, Failure> {
        let timeout = Duration::from_millis(CALL_TIMEOUT_MS);
        Ok(match against {
            Against::Palisade => {
                Self::Palisade(palisade::Palisade::connect(endpoints, timeout).await?)
            }
            Against::Etcd => Self::Etcd(etcd::Etcd::connect(endpoints, timeout).await?),
        })
    }

    fn leader(&self) -> String {
        match self {
            Self::Palisade(p) => p.leader(),
            Self::Etcd(e) => e.leader(),
        }
    }

    /// Opens a session (etcd: grants a lease); its id.
    async fn open(&self, ttl: Duration) -> Result<String, Failure> {
        match self {
            Self::Palisade(p) => p.open(ttl).await,
            Self::Etcd(e) => e.open(ttl).await,
        }
    }

    async fn keepalive(&self, id: &str) -> Result<(), Failure> {
        match self {
            Self::Palisade(p) => p.keepalive(id).await,
            Self::Etcd(e) => e.keepalive(id).await,
        }
    }

    /// Campaigns for `scope` (etcd: the election under that prefix) and waits until held.
    async fn campaign(&self, scope: &str, id: &str) -> Result<u64, Failure> {
        match self {
            Self::Palisade(p) => p.campaign(scope, id).await,
            Self::Etcd(e) => e.campaign(scope, id).await,
        }
    }

    async fn resign(&self, scope: &str, id: &str) -> Result<(), Failure> {
        match self {
            Self::Palisade(p) => p.resign(scope, id).await,
            Self::Etcd(e) => e.resign(scope, id).await,
        }
    }

    /// Acquires a free `scope` (Palisade: a campaign nobody else makes; etcd: one
    /// transaction on one key).
    async fn acquire(&self, scope: &str, id: &str) -> Result<u64, Failure> {
        match self {
            Self::Palisade(p) => p.campaign(scope, id).await,
            Self::Etcd(e) => e.acquire(scope, id).await,
        }
    }

    async fn release(&self, scope: &str, id: &str) -> Result<(), Failure> {
        match self {
            Self::Palisade(p) => p.resign(scope, id).await,
            Self::Etcd(e) => e.release(scope).await,
        }
    }

    async fn revoke(&self, id: &str) -> Result<(), Failure> {
        match self {
            Self::Palisade(p) => p.revoke(id).await,
            Self::Etcd(e) => e.revoke(id).await,
        }
    }

    /// How many sessions wait on `scope` behind its holder.
    async fn waiting(&self, scope: &str) -> Result<usize, Failure> {
        match self {
            Self::Palisade(p) => p.waiting(scope).await,
            Self::Etcd(e) => e.waiting(scope).await,
        }
    }
}

impl ScopesArgs {
    /// Checks what clap cannot: each failure is a usage error naming the flag.
    fn check(&self) -> Result<(), Failure> {
        let usage = |m: String| Err(Failure::Usage(m));
        if !(1_000..=300_000).contains(&self.ttl_ms) {
            return usage(format!("--ttl-ms {} must be 1000 to 300000", self.ttl_ms));
        }
        if self.interval_ms < INTERVAL_MS_MIN || self.interval_ms >= self.ttl_ms {
            return usage(format!(
                "--interval-ms {} must be at least {INTERVAL_MS_MIN} and below --ttl-ms {}",
                self.interval_ms, self.ttl_ms
            ));
        }
        if !(self.duration > 0.0
            && self.warmup >= 0.0
            && self.duration + self.warmup <= DURATION_S_MAX)
        {
            return usage(format!(
                "--duration {} and --warmup {} must be above 0 and at least 0, at most {DURATION_S_MAX} s together",
                self.duration, self.warmup
            ));
        }
        if self.pause_ms > CALL_TIMEOUT_MS {
            return usage(format!(
                "--pause-ms {} must be at most {CALL_TIMEOUT_MS}",
                self.pause_ms
            ));
        }
        if self.pids.len() > super::args::PIDS_MAX || self.pids.iter().any(|&p| p <= 0) {
            return usage(format!(
                "--pid: at most {} process ids, each above 0",
                super::args::PIDS_MAX
            ));
        }
        let tag_ok = !self.tag.is_empty()
            && self.tag.len() <= 64
            && self
                .tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !tag_ok {
            return usage(format!("--tag {:?}: 1 to 64 of A-Z a-z 0-9 -", self.tag));
        }
        Ok(())
    }
}

/// What every measure reports beside its own figures.
#[derive(Serialize)]
struct Common {
    against: Against,
    measure: Measure,
    leader: String,
}

/// Runs `palisade bench scopes`.
pub(crate) async fn run(args: ScopesArgs) -> Result<(), Failure> {
    args.check()?;
    let target = std::sync::Arc::new(Target::connect(args.against, &args.endpoints).await?);
    let common = Common {
        against: args.against,
        measure: args.measure,
        leader: target.leader(),
    };
    let figures = match args.measure {
        Measure::Handover => measures::handover(&target, &args).await?,
        Measure::Keepalive => measures::keepalive(&target, &args).await?,
        Measure::Grants => measures::grants(&target, &args).await?,
    };
    let mut report = serde_json::to_value(&common).map_err(|e| Failure::Runtime(e.to_string()))?;
    if let (Some(out), serde_json::Value::Object(more)) = (report.as_object_mut(), figures) {
        out.extend(more);
    }
    if args.json {
        println!("{report}");
    } else {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| Failure::Runtime(e.to_string()))?
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        scopes: ScopesArgs,
    }

    /// Goal: flag values the run cannot honour are usage errors naming the flag.
    /// Method: check each bad value on top of otherwise good flags.
    #[test]
    fn bad_flags_are_usage_errors() {
        let base = [
            "bench",
            "--against",
            "etcd",
            "--measure",
            "grants",
            "--endpoints",
            "http://127.0.0.1:1",
        ];
        for (extra, flag) in [
            (&["--ttl-ms", "500"][..], "--ttl-ms"),
            (&["--interval-ms", "50"][..], "--interval-ms"),
            (&["--interval-ms", "6000"][..], "--interval-ms"),
            (&["--duration", "0"][..], "--duration"),
            (&["--pid", "0"][..], "--pid"),
            (&["--tag", "a/b"][..], "--tag"),
        ] {
            let cli = Cli::try_parse_from(base.iter().chain(extra)).unwrap();
            match cli.scopes.check() {
                Err(Failure::Usage(m)) => assert!(m.contains(flag), "{extra:?}: {m}"),
                _ => panic!("{extra:?} was accepted"),
            }
        }
        assert!(Cli::try_parse_from(base.iter().chain(&["--contenders", "0"])).is_err());
        let good = Cli::try_parse_from(base).unwrap();
        assert!(good.scopes.check().is_ok());
    }
}
