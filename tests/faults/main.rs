//! Fault scenarios on real `palisade` processes: failpoints, pauses, `kill -9`,
//! partitions, slow links and a slow storage, with every write checked by the history
//! checker.
//!
//! These are integration tests of the package that owns the binary (`palisade-cli`), so
//! Cargo builds the binary for them with the failpoints compiled in (`palisade-cli`'s
//! dev-dependencies turn the `failpoints` features on) and names it in
//! `CARGO_BIN_EXE_palisade`: a plain `cargo build` beforehand, which builds the binary
//! without failpoints, cannot leave these tests running that one.
//!
//! # Layout
//! - `failpoints`: the failpoints the scenarios rely on fire in the binary under test.
//! - `clock`: clocks fast and slow within the drift bound and beyond it, and wall-clock
//!   steps, through libfaketime (ignored without it; `.ci/run` runs them).
//! - `fault_paused_leader`: the headline: a leader paused before sending is fenced out.
//! - `fault_partition`: a partitioned or slow leader is fenced out (test faults; network
//!   namespaces and nft when run as root with `--ignored`).
//! - `fault_inflight_race`: a lower-token write in flight is applied before a higher one.
//! - `fault_node_restarts`: `kill -9` of nodes during elections never reuses a term.
//! - `fault_proxy_crash`: `kill -9` of the proxy at each failpoint keeps the fence.
//! - `fault_random_mix`: a seeded random mix of all of the above.
//! - `fleet`: three proxies in fleet mode: a paused proxy, a proxy cut off from the
//!   cluster, a proxy killed during an election, the cluster unreachable, a random mix.
//! - `membership`: membership changes while workers write: grow 3 -> 5 -> 3, replace a
//!   wiped node, add a member after compaction (a snapshot), refuse a reused id.
//! - `membership_safety`: changes that cannot brick the cluster: unreachable new members
//!   stay learners and the token stays, removals below three voters need force, and a
//!   survivor of a lost quorum comes back with `--force-new-cluster`.
//! - `soak`: overlapping fault cycles of every kind above (and wall-clock jumps), counted
//!   in cycles (`PALISADE_SOAK_CYCLES`), the whole history checked after every batch.
// Tests may unwrap: a failed step panics with its cause, which is what a test should do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod clock;
mod failpoints;
mod fault_inflight_race;
mod fault_node_restarts;
mod fault_partition;
mod fault_paused_leader;
mod fault_proxy_crash;
mod fault_random_mix;
mod fleet;
mod membership;
mod membership_safety;
mod soak;

/// The `palisade` binary Cargo built for these tests, failpoints included.
const PALISADE: &str = env!("CARGO_BIN_EXE_palisade");

/// Names [`PALISADE`] as the binary every launcher of `palisade_cluster` runs, in this
/// whole test process, and returns its path. Every test calls it first: the launchers
/// guess no binary (one found in `target/` may be stale or lack the failpoints), so a test
/// that forgot would fail saying so, never run another binary.
fn use_tested_binary() -> &'static str {
    palisade_cluster::set_palisade_bin(PALISADE);
    PALISADE
}
