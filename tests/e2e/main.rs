//! End-to-end tests of the `palisade` binary: real processes, real sockets, real signals.
//!
//! These are integration tests of the package that owns the binary (`palisade-cli`), so
//! Cargo builds the binary for them, with the dev-dependencies' features (the failpoints)
//! on, and names it in `CARGO_BIN_EXE_palisade`: whatever was built before (`cargo
//! build`, another package's tests), the binary these tests run is the one this build
//! made. The harness (fixtures, recording upstream, scenarios) is the `palisade-tests`
//! library.
//!
//! # Layout
//! - `proxy_connections`: idle floods on the data and admin ports: new clients and the
//!   announce still served in time; silent connections closed at the header timeout.
//! - `proxy_idle`: idle keep-alive connections parked without their HTTP state: served
//!   again (TCP and TLS), closed at the keep-alive timeout, evicted oldest first.
//! - `proxy_reuseport`: `--reuseport-threads`: connections spread over the threads,
//!   fences shared by them, every thread drained on SIGTERM, a second proxy kept off the
//!   port, a bad count refused.
//! - `proxy_fencing`: the proxy's fencing rules against a recording upstream, restarts
//!   and `kill -9`.
//! - `proxy_routing`: classification that fails closed: path spellings, methods, scope
//!   tricks and the scope limit, with nothing forwarded.
//! - `proxy_streaming`: bodies streamed after admission (a 1 GiB upload and a flood of
//!   unfinished bodies in bounded memory, `Expect: 100-continue`, body limits), trailers,
//!   `Host` and `X-Forwarded-For`.
//! - `proxy_framing`: hostile framings refused whole (`Connection` naming framing
//!   headers, repeated `Host`, transfer codings); slow anonymous bodies cannot hold the
//!   upstream's slots.
//! - `proxy_transport`: body and header limits, slow clients, TLS, h2c, graceful shutdown.
//! - `election_process`: elections among `palisade node` processes: pauses, kills,
//!   transfer, resign, long poll, configuration errors.
//! - `election_announce`: a new leader fences the proxy without writing.
//! - `election_announce_list`: the announce list cannot drop fencing: a removed proxy is
//!   retired, bad entries are refused up front, an unreachable proxy stops no announce.
//! - `election_scores`: leaders placed by score (`--score-oracle static`): the best node
//!   leads, the next best while it is paused, leadership returns after the hold, a
//!   behind log waits, scores within the margin never transfer.
//! - `fleet_no_leases`: a fleet proxy in front of a node without `--lease-ms` names the
//!   flag in its 503s, `/healthz`, `/v1/lease` and its log at start.
//! - `fleet_proxy`: proxies in fleet mode (`--cluster`) under leases: the old term
//!   refused at every proxy, 503 while the cluster is unreachable, unlisted proxies.
//! - `client_rust`: the Rust client against a real proxy.
//! - `client_embedded`: an in-process election node driving the Rust client.
//! - `demo`: `palisade demo`, as a user runs it.
//! - `status_pages`: the proxy's and the nodes' status pages over HTTP and in headless
//!   Chromium (screenshots kept in `target/test-artifacts/`), and `palisade status`.
//! - `audit`: the audit log: a stale leader's rejection with its fields, `palisade audit`
//!   filters, rotation by size, a node's announce and a transfer asked of its API.
//! - `audit_flood`: a million requests without a proof leave an earlier stale write in
//!   the audit log and on the status page, and every one of them is accounted for.
//! - `lost_database`: a `proxy.redb` or `raft.redb` that existed and is now empty or
//!   damaged stops the process with the recovery steps, never a fresh start or a panic.
//! - `trust_tokens`: signed tokens: forged tokens and proofs refused with 401, the
//!   leader's proof admitted, and only the new leader's after an election.
//! - `scopes_contention`: fifty scopes, three `palisade lock` client processes contending
//!   for each, through the history checker.
//! - `scopes_lock`: `palisade lock`: two locks contend; the paused holder's write is
//!   refused and its command stopped (exit 75).
//! - `scopes_named`: named leaderships: an expired holder fenced out at the proxy before
//!   the next grant answers; no kept-alive session expires when the leader is killed.
//! - `trust_admin`: the admin bearer token, and the audited fence reset (API and CLI).
//! - `trust_peers`: peer mTLS and the node API's client certificates; forged raft frames
//!   in plaintext loopback mode; frames nested 500,000 groups deep.
//! - `trust_roles`: roles on the node API (certificates named `node-`, `proxy-`,
//!   `writer-`, `operator-`): each route admits exactly its roles, proxies lease only
//!   their own entry, nodes add only themselves; refusals counted and audited.
// Tests may unwrap: a failed step panics with its cause, which is what a test should do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod audit;
mod audit_flood;
mod client_embedded;
mod client_rust;
mod demo;
mod doors;
mod election_announce;
mod election_announce_list;
mod election_process;
mod election_scores;
mod fleet_no_leases;
mod fleet_proxy;
mod lost_database;
mod proxy_connections;
mod proxy_fencing;
mod proxy_framing;
mod proxy_idle;
mod proxy_reuseport;
mod proxy_routing;
mod proxy_streaming;
mod proxy_transport;
mod scopes_contention;
mod scopes_lock;
mod scopes_named;
mod status_pages;
mod trust_admin;
mod trust_peers;
mod trust_roles;
mod trust_tokens;

/// The `palisade` binary Cargo built for these tests.
const PALISADE: &str = env!("CARGO_BIN_EXE_palisade");

/// Names [`PALISADE`] as the binary every launcher of `palisade_cluster` runs, in this
/// whole test process, and returns its path. Every test calls it first: the launchers
/// guess no binary (one found in `target/` may be stale or lack the failpoints), so a test
/// that forgot would fail saying so, never run another binary.
fn use_tested_binary() -> &'static str {
    palisade_cluster::set_palisade_bin(PALISADE);
    PALISADE
}
