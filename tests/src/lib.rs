//! Harness for Palisade's end-to-end tests. Processes, the HTTP client, the CA builder
//! (`Pki`) and waiting (`wait::poll`, the workspace's one wait helper) come from
//! `palisade-cluster` (shared with `palisade demo`); this crate adds what only tests need.
//!
//! # Layout
//! - `fixtures`: set-ups several tests share: proxies in front of a recording upstream or
//!   serving TLS, a write held in flight, and a cluster's first announced leader, its
//!   fence at the proxy, a settled leader and a resignation.
//! - `upstream`: the recording upstream, with per-path hold gates to keep a request in
//!   flight, per-prefix delays, and its apply log for the history checker.
//! - `relay`: a TCP relay a test can cut, to cut a fleet proxy off from the cluster
//!   without network namespaces.
//! - `clock`: clock faults through libfaketime: processes whose clocks run at a rate,
//!   or whose wall clock a test steps.
//! - `netns`: real partitions: nodes in network namespaces, cut off with nft drop rules
//!   (root only).
//! - `scenario`: fault scenarios: a cluster with test faults, the recording upstream, a
//!   worker per node stopping at a failpoint on demand, and the history of every write.
//! - `terms`: term and fence checks over a whole run, from polled views and the nodes'
//!   logs (their `event` field).
//! - `trust`: keys and certificates made by `palisade keys/certs generate`, token proofs
//!   signed with the generated key (and forged ones), admin token files, log events.
//! - `peer_wire`: a hostile peer speaking the nodes' wire by hand, over TCP or TLS.
//! - `process`: a panicking facade over `palisade_cluster`'s launchers, and waiting for a
//!   child to stop at a failpoint.
//! - `client`: raw HTTP requests (exactly the headers given), panicking on a failed
//!   exchange.
// A harness for tests only: a failed set-up step should panic with its cause, as a test
// would, so the workspace's library rule against unwrap/expect is lifted here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::missing_panics_doc)]

pub mod client;
pub mod clock;
pub mod fixtures;
pub mod netns;
pub mod peer_wire;
pub mod relay;
pub mod scenario;
pub mod terms;
pub mod trust;
pub mod upstream;

/// Launchers that panic with the cause, for tests.
pub mod process {
    use std::path::Path;
    use std::time::Duration;

    pub use palisade_cluster::ChildGuard;
    use palisade_cluster::{Cluster, ClusterOptions, ClusterSpec, Lines};
    use palisade_protocol::process::FailpointStop;

    /// A running `palisade proxy`.
    pub type ProxyProcess = palisade_cluster::ProxyProcess;

    /// Starts a proxy in `dir` with `extra` flags, or panics with the cause.
    pub fn start_proxy(dir: &Path, extra: &[&str]) -> ProxyProcess {
        palisade_cluster::ProxyProcess::start(dir, extra).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts of a cluster tried before giving up, when ports it picked were taken first.
    const CLUSTER_START_ATTEMPTS: usize = 3;

    /// Starts a cluster in a fresh subdirectory of `dir`, or panics with the cause. The
    /// launcher picks free ports by binding port 0 and releasing it, so another process
    /// (a test running in parallel, or an outgoing connection given that port as its
    /// ephemeral source) may take one before the node binds it: such a start is retried
    /// with new ports, up to [`CLUSTER_START_ATTEMPTS`] times; any other failure panics at
    /// once.
    pub fn start_cluster(dir: &Path, spec: &ClusterSpec, options: &ClusterOptions) -> Cluster {
        let mut attempt = 1;
        loop {
            let at = dir.join(format!("cluster-{attempt}"));
            match Cluster::start_with(&at, spec, options) {
                Ok(cluster) => return cluster,
                Err(e)
                    if attempt < CLUSTER_START_ATTEMPTS
                        && e.to_string().contains("Address already in use") =>
                {
                    eprintln!("cluster start {attempt} lost a port race, retrying: {e}");
                    attempt += 1;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// Waits for a child's line saying it stopped at a failpoint (skipping other lines),
    /// and returns it read; panics after `timeout`, saying which child never stopped.
    pub async fn wait_for_failpoint(lines: &Lines, what: &str, timeout: Duration) -> FailpointStop {
        palisade_cluster::wait::poll(timeout, || async {
            std::iter::from_fn(|| lines.try_next()).find_map(|l| FailpointStop::parse(&l))
        })
        .await
        .unwrap_or_else(|| panic!("timed out waiting for {what} to stop at a failpoint"))
    }
}
