//! `palisade bench`: a closed-loop HTTP/1.1 load generator for the proxy (or any HTTP
//! server); `palisade bench failover`, which times the failover of a local cluster; and
//! `palisade bench scopes`, which measures named leaderships against Palisade or etcd.
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
//! With `--scopes N` the connections are spread over N scopes, so that concurrent raises
//! fall on different fences.
//!
//! CPU: `--pid PID` reports the CPU time (user + system) that process used during the
//! measured window, in total and per answered request, so that two servers loaded the
//! same way can be compared by what each request costs them.

//!
//! # Layout
//! - `args`: the load run's flags, their limits, and the checked [`args::Plan`].
//! - `load`: the closed loop: one task per connection, warm-up, `--hold`.
//! - `report`: per-worker tallies, the latency histogram, and the printed report.
//! - `cpu`: the CPU time of `--pid` processes over the measured window.
//! - `failover`: `palisade bench failover`; `failover_events`: its breakdown from the nodes' logs.
//! - `scopes`: `palisade bench scopes`.

mod args;
mod cpu;
mod failover;
mod failover_events;
mod load;
mod report;
mod scopes;

use clap::{Args, Subcommand};

use crate::Failure;

/// Load an HTTP server and report throughput and latency percentiles; or, with a
/// scenario (`failover`), time a cluster.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    scenario: Option<Scenario>,
    #[command(flatten)]
    load: args::LoadArgs,
}

#[derive(Subcommand)]
enum Scenario {
    /// Time failovers of a local cluster: pause the leader with SIGSTOP, wait for a new
    /// leader and for its token at the proxy, resume, repeat.
    Failover(failover::FailoverArgs),
    /// Measure named leaderships (handover latency with contenders waiting, the server
    /// CPU of kept-alive sessions, grants per second) against a Palisade or an etcd
    /// cluster, through the same client.
    Scopes(scopes::ScopesArgs),
}

/// Runs `palisade bench`.
pub(crate) async fn run(args: BenchArgs) -> Result<(), Failure> {
    match args.scenario {
        Some(Scenario::Failover(a)) => failover::run(a).await,
        Some(Scenario::Scopes(a)) => scopes::run(a).await,
        None => load::run_load(args.load).await,
    }
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

    /// Goal: the median of odd and even counts, and none of nothing.
    /// Method: three examples.
    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }
}
