//! Deterministic mode, for the simulation in `tests/sim` only. On a thread where it is on
//! (the simulator's: it runs each seed on one thread, in a current-thread runtime on a
//! paused clock), nodes started there
//!
//! - write their raft log inline on the loop's task instead of on the blocking pool: a
//!   blocking-pool thread finishes at a moment of real time, so the order in which the
//!   simulator resumes its tasks afterwards would differ from run to run;
//! - use an election timeout of exactly their `election_ticks`: raft-rs draws it from an
//!   unseeded thread RNG, which no seed could replay (the simulation varies
//!   `election_ticks` per node from its seed instead).
//!
//! A thread-local switch rather than a cargo feature: features are unified across a
//! workspace build, so a feature would change every node that `cargo test --workspace`
//! builds; a switch changes only the threads that turn it on. Off, it costs one
//! thread-local read per raft-log write.

use std::cell::Cell;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
}

/// Turns deterministic mode on or off for nodes started on (and running on) the calling
/// thread. For the simulation only.
#[doc(hidden)]
pub fn set_deterministic(on: bool) {
    ON.with(|cell| cell.set(on));
}

/// Whether deterministic mode is on for the calling thread.
pub(crate) fn is_on() -> bool {
    ON.with(Cell::get)
}
