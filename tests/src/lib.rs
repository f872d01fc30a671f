//! Harness for Palisade's end-to-end tests. Processes, the HTTP client and waiting come
//! from `palisade-cluster` (shared with `palisade demo`); this crate adds what only tests
//! need.
//!
//! # Layout
//! - `fixtures`: set-ups several proxy tests share.
//! - `upstream`: the recording upstream, with per-path hold gates to keep a request in
//!   flight, per-prefix delays, and its apply log for the history checker.
//! - `netns`: real partitions: nodes in network namespaces, cut off with nft drop rules
//!   (root only).
//! - `scenario`: fault scenarios: a cluster with test faults, the recording upstream, a
//!   worker per node stopping at a failpoint on demand, the history of every write, and
//!   term checks over a whole run.
//! - re-exports of `palisade_cluster`'s `client` and `wait`, and a panicking `process`
//!   facade over its launchers.
// A harness for tests only: a failed set-up step should panic with its cause, as a test
// would, so the workspace's library rule against unwrap/expect is lifted here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::missing_panics_doc)]

pub use palisade_cluster::{client, wait};

pub mod fixtures;
pub mod netns;
pub mod scenario;
pub mod upstream;

/// Launchers that panic with the cause, for tests.
pub mod process {
    use std::path::Path;

    pub use palisade_cluster::ChildGuard;

    /// A running `palisade proxy`.
    pub type ProxyProcess = palisade_cluster::ProxyProcess;

    /// Starts a proxy in `dir` with `extra` flags, or panics with the cause.
    pub fn start_proxy(dir: &Path, extra: &[&str]) -> ProxyProcess {
        palisade_cluster::ProxyProcess::start(dir, extra).unwrap_or_else(|e| panic!("{e}"))
    }
}
