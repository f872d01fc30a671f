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
//!   and the transport's inbound checks. Named leaderships (sessions, keepalives,
//!   campaigns, resignations, revocations, the leader's expiries, fence on grant with an
//!   empty announce list) are the node's own `ScopesService` (`NodeHandle::scopes`), the
//!   one the node API's routes call. Each proxy's admission is the proxy's own
//!   `Fencer` (fence check, durable raise in `palisade_storage::FenceRegister` on an
//!   in-memory redb that outlives its crashes, the in-flight barrier), through its
//!   `fuzzing` handles.
//! - **Modelled**: the storage behind each proxy (it applies what arrives, in order); the
//!   hops between worker, proxy and storage (drawn delays); the announcer (a new token is
//!   posted to each proxy's admission like the admin API's advance, after a drawn delay,
//!   sometimes lost; for named scopes, each grant the established leader applies); the
//!   workers (they read their node's leadership watch as an in-process token source does);
//!   the holders (clients of named leaderships: a drawn hop to and from the node, the
//!   clients' loss rule for their trust, GC pauses, resign, revoke or lapse).
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
//! Five things would still make runs differ, and are switched off:
//! - `spawn_blocking`: the election loop's raft-log writes and the proxy's fence commit
//!   run on the blocking pool, whose threads finish at moments of real time. In the
//!   election crate's deterministic mode (`palisade_election::set_deterministic`, a
//!   thread-local switch) and with the proxy's inline commit (`Fences::new_inline`) they
//!   run on the caller's task instead.
//! - raft-rs draws each election timeout from an unseeded thread RNG; in deterministic
//!   mode the timeout is exactly `election_ticks`, which the simulation draws per node.
//! - score oracles re-draw timeouts from an unseeded RNG: they are off here.
//! - named leaderships' session ids (128 random bits) and request numbers: in
//!   deterministic mode they come from a counter of the thread, restarted with each run.
//! - tokio itself: `select!` picks among ready branches at random (the selects the
//!   simulation runs are `biased`), and a watch channel wakes its waiters in a random
//!   order. So no two tasks of the simulation wait on one of a node's watch channels (one
//!   watcher per node run), and a holder never wakes on its service call's answer: the
//!   call runs as a task of its own and the holder looks for the answer on its own timer.
//!
//! A switch rather than a cargo feature because features are unified across a workspace
//! build: `cargo test --workspace` would build every node with them.
//!
//! # Layout
//! - `knobs`: every constant of the simulation, named once.
//! - `trace`: the steps of a run, their SHA-256 digest, the tail kept for a failing seed.
//! - `world`: the seeded dice, the virtual clock, the trace and the invariants' checks
//!   (the storages' and fences' per scope, one holder per token of the cluster's scope,
//!   and for named scopes: at most one client trusting a grant at a time, grants rising).
//! - `cluster`: the nodes: start, crash, restart, watch, transfer, membership changes.
//! - `proxies`: each proxy's real admission and its storage model; crashes and restarts;
//!   the modelled announcer.
//! - `workers`: the clients of the cluster's scope, stale ones included.
//! - `holders`: the clients of named leaderships: sessions, keepalives, campaigns,
//!   writes with the grant's token, pauses, releases.
//! - `chaos`: the fault schedule.
//! - `sim`: one run from its seed to its [`Outcome`].
#![deny(missing_docs)]

mod chaos;
mod cluster;
mod holders;
pub mod knobs;
mod proxies;
mod sim;
mod trace;
mod workers;
mod world;

pub use sim::{Outcome, SCOPE, run_seed};
pub use world::Stats;
