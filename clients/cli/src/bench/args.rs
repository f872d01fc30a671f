//! The flags of a load run, their limits, and the [`Plan`] they are checked into.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use http::{HeaderValue, Method, Uri};
use palisade_protocol::Scope;

use crate::Failure;

/// Most connections one run opens: each is a task and a socket, and the machine's file
/// descriptor limit (`ulimit -n`) has to cover them.
const CONNECTIONS_MAX: u32 = 10_000;
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
pub(super) const LATENCY_US_MAX: u64 = TIMEOUT_MS_MAX * 1000;
/// Most scopes of a `--scopes` run: one per connection at most makes sense, and each is
/// a fence the proxy keeps (its `scopes_max` bounds them too).
const SCOPES_MAX: u32 = CONNECTIONS_MAX;
/// Most processes `--pid` measures in one run.
pub(super) const PIDS_MAX: usize = 16;
/// Significant decimal digits of the histogram: 0.1% resolution.
pub(super) const LATENCY_SIGFIGS: u8 = 3;

/// Flags of a load run.
#[derive(Args)]
pub(super) struct LoadArgs {
    /// Target URL (http:// only); its path and query are requested on every request.
    #[arg(
        long,
        env = "PALISADE_BENCH_URL",
        default_value = "http://127.0.0.1:8080/bench"
    )]
    pub(super) url: String,
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
    pub(super) token: Option<u64>,
    /// Fencing scope to send (`Fencing-Scope`); the proxy must take client-chosen scopes
    /// (`palisade proxy --client-scopes`).
    #[arg(long, env = "PALISADE_BENCH_SCOPE")]
    scope: Option<String>,
    /// Spread the connections over this many scopes: connection i sends
    /// `Fencing-Scope: SCOPE-(i mod N)`, so concurrent fence raises fall on different
    /// scopes (as many independent writers would). Needs --scope.
    #[arg(long, env = "PALISADE_BENCH_SCOPES",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(SCOPES_MAX)))]
    scopes: Option<u32>,
    /// Report the CPU time the process with this pid used during the measured window,
    /// per request (for example the proxy's, to compare it with another server's).
    /// Repeatable; Linux only (reads /proc/PID/stat).
    #[arg(long = "pid", env = "PALISADE_BENCH_PIDS", value_delimiter = ',')]
    pids: Vec<i32>,
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
    pub(super) json: bool,
}

/// What every worker needs, checked and resolved once.
pub(super) struct Plan {
    /// An empty latency histogram with the run's bounds, cloned by every tally.
    pub(super) latency_us: Histogram<u64>,
    pub(super) addr: SocketAddr,
    /// `host[:port]` for the Host header.
    pub(super) authority: HeaderValue,
    /// Origin-form target: path and query.
    pub(super) target: Uri,
    pub(super) method: Method,
    pub(super) body: Bytes,
    pub(super) content_type: Option<HeaderValue>,
    /// The scope each connection sends, by connection index modulo the length (empty:
    /// no `Fencing-Scope` header).
    pub(super) scopes: Vec<HeaderValue>,
    /// Whether requests carry a token at all.
    pub(super) tokens: bool,
    pub(super) advance_share: f64,
    pub(super) timeout: Duration,
    pub(super) connections: u32,
    /// Measuring starts here; requests before it are warm-up.
    pub(super) measure_from: Instant,
    /// Duration mode: no request starts after this.
    pub(super) end: Option<Instant>,
    /// Requests mode: how many to measure.
    pub(super) requests: Option<u64>,
    pub(super) hold: bool,
    /// Processes whose CPU time is reported (`--pid`).
    pub(super) pids: Vec<i32>,
}

impl LoadArgs {
    /// Checks the flags against each other and the limits; every failure is a usage
    /// error (exit 2) naming the flag.
    pub(super) fn plan(self, addr: SocketAddr) -> Result<Plan, Failure> {
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
        let scope_names = match (&self.scope, self.scopes) {
            (None, Some(_)) => {
                return Err(usage(
                    "--scopes needs --scope (the names' prefix)".to_owned(),
                ));
            }
            (None, None) => Vec::new(),
            (Some(s), None) => vec![s.clone()],
            (Some(s), Some(n)) => (0..n).map(|i| format!("{s}-{i}")).collect(),
        };
        let scopes = scope_names
            .iter()
            .map(|s| {
                Scope::check(s).map_err(|e| usage(format!("--scope: {e}")))?;
                HeaderValue::from_str(s).map_err(|e| usage(format!("--scope: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if self.pids.len() > PIDS_MAX {
            return Err(usage(format!(
                "--pid given {} times; at most {PIDS_MAX}",
                self.pids.len()
            )));
        }
        if let Some(pid) = self.pids.iter().find(|&&pid| pid <= 0) {
            return Err(usage(format!("--pid {pid} is not a process id")));
        }
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
        let latency_us = Histogram::new_with_bounds(1, LATENCY_US_MAX, LATENCY_SIGFIGS)
            .map_err(|e| Failure::Runtime(format!("latency histogram: {e}")))?;
        let measure_from = Instant::now() + Duration::from_secs_f64(self.warmup);
        Ok(Plan {
            latency_us,
            addr,
            authority,
            target,
            method,
            body,
            content_type,
            scopes,
            tokens: self.token.is_some(),
            advance_share: self.advance_share,
            timeout: Duration::from_millis(self.timeout_ms),
            connections: self.connections,
            measure_from,
            end: duration.map(|d| measure_from + Duration::from_secs_f64(d)),
            requests: self.requests,
            hold: self.hold,
            pids: self.pids,
        })
    }
}

/// The URL's socket address: `http://` only, resolved once before the run.
pub(super) async fn resolve(url: &str) -> Result<SocketAddr, Failure> {
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

#[cfg(test)]
pub(super) mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }

    /// The plan of a run with `args`, as `palisade bench` would make it.
    pub(in crate::bench) fn plan(args: &[&str]) -> Result<Plan, Failure> {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .map_err(|e| Failure::Usage(e.to_string()))?;
        cli.load.plan(([127, 0, 0, 1], 1).into())
    }

    /// Goal: bad flag combinations are usage errors (exit 2), each naming the flag.
    /// Method: plan runs with each bad combination.
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
                Err(other) => panic!("{args:?}: not a usage error: {other}"),
                Ok(_) => panic!("{args:?} was accepted"),
            }
        }
        assert!(plan(&["--connections", "0"]).is_err());
        assert!(plan(&["--connections", "10001"]).is_err());
        assert!(plan(&["--duration", "1", "--requests", "5"]).is_err());
    }
}
