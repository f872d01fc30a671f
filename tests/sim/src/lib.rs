//! A deterministic simulation of the whole system, in one process: the project's own
//! nodes, the proxies' own admission, simulated clients and storage, on a simulated
//! network and clock, under a fault schedule drawn from a seed. After every step it checks
//! the invariants; a failing seed is printed and replays exactly.
//!
//! # What is real code and what is a model
//! - **Real**: each node is `palisade_election::Node::start_in_memory_with`: the election
//!   loop (raft-rs, the Ready handling, the guard, publishing the token, transfers,
//!   membership changes) and its raft log (`palisade_storage::RaftLog`) on an in-memory
//!   redb that outlives the node's crashes. The nodes talk over the election crate's
//!   in-memory network (`MemNetwork`), which runs every message through the wire encoding
//!   and the transport's inbound checks. Each proxy's admission is the proxy's own
//!   `Fencer` (fence check, durable raise in `palisade_storage::FenceRegister` on an
//!   in-memory redb that outlives its crashes, the in-flight barrier), through its
//!   `fuzzing` handles.
//! - **Modelled**: the storage behind each proxy (it applies what arrives, in order); the
//!   hops between worker, proxy and storage (drawn delays); the announcer (a new token is
//!   posted to each proxy's admission like the admin API's advance, after a drawn delay,
//!   sometimes lost); the workers (they read their node's leadership watch as an
//!   in-process token source does).
//!
//! # Why tokio's paused clock rather than turmoil
//! Nothing here does real I/O: the nodes already run on an in-memory network and redb, and
//! the proxy's admission is plain async code. A current-thread tokio runtime with
//! `start_paused` (time advances only when every task waits, straight to the next timer)
//! is then a deterministic simulator as it is, with every random decision drawn from one
//! seeded RNG in the order the single thread runs the actors. turmoil would simulate hosts
//! and TCP, which the in-memory network makes unnecessary, and would need the nodes and
//! proxies to run their real sockets, which is far more code to bring under one clock.
//!
//! Three things would still make runs differ, and are switched off:
//! - `spawn_blocking`: the election loop's raft-log writes and the proxy's fence commit
//!   run on the blocking pool, whose threads finish at moments of real time. In the
//!   election crate's deterministic mode (`palisade_election::set_deterministic`, a
//!   thread-local switch) and with the proxy's inline commit (`Fences::new_inline`) they
//!   run on the caller's task instead.
//! - raft-rs draws each election timeout from an unseeded thread RNG; in deterministic
//!   mode the timeout is exactly `election_ticks`, which the simulation draws per node.
//! - score oracles re-draw timeouts from an unseeded RNG: they are off here.
//!
//! A switch rather than a cargo feature because features are unified across a workspace
//! build: `cargo test --workspace` would build every node with them.
//!
//! # Layout
//! - `knobs`: every constant of the simulation, named once.
//! - `trace`: the steps of a run, their SHA-256 digest, the tail kept for a failing seed.
//! - `world`: the seeded dice, the virtual clock, the trace and the invariants' checks.
//! - `cluster`: the nodes: start, crash, restart, watch, transfer, membership changes.
//! - `proxies`: each proxy's real admission and its storage model; crashes and restarts;
//!   the modelled announcer.
//! - `workers`: the clients, stale ones included.
//! - `chaos`: the fault schedule.
//! - `sim`: one run from its seed to its [`Outcome`].
#![deny(missing_docs)]

mod chaos;
mod cluster;
pub mod knobs;
mod proxies;
mod sim;
mod trace;
mod workers;
mod world;

pub use sim::{Outcome, SCOPE, run_seed};
pub use world::Stats;
