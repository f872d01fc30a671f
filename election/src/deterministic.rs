//! Deterministic mode, for the simulation in `tests/sim` only. On a thread where it is on
//! (the simulator's: it runs each seed on one thread, in a current-thread runtime on a
//! paused clock), nodes started there
//!
//! - write their raft log inline on the loop's task instead of on the blocking pool: a
//!   blocking-pool thread finishes at a moment of real time, so the order in which the
//!   simulator resumes its tasks afterwards would differ from run to run;
//! - use an election timeout of exactly their `election_ticks`: raft-rs draws it from an
//!   unseeded thread RNG, which no seed could replay (the simulation varies
//!   `election_ticks` per node from its seed instead);
//! - number named-leaderships sessions and requests from one counter of the thread
//!   ([`next_id`]) instead of drawing them at random: session ids are 128 random bits
//!   (a credential without mTLS) and each proposal's request number 64, neither of which
//!   a seed could replay. The counter is shared by every node of the thread, so its
//!   numbers are unique within a run, as the random ones are in practice.
//!
//! A thread-local switch rather than a cargo feature: features are unified across a
//! workspace build, so a feature would change every node that `cargo test --workspace`
//! builds; a switch changes only the threads that turn it on. Off, it costs one
//! thread-local read per raft-log write.

use std::cell::Cell;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    /// The last number [`next_id`] gave on this thread.
    static LAST_ID: Cell<u64> = const { Cell::new(0) };
}

/// Turns deterministic mode on or off for nodes started on (and running on) the calling
/// thread, and restarts the thread's id counter, so that each run that turns it on numbers
/// its sessions and requests alike. For the simulation only.
#[doc(hidden)]
pub fn set_deterministic(on: bool) {
    ON.with(|cell| cell.set(on));
    LAST_ID.with(|cell| cell.set(0));
}

/// Whether deterministic mode is on for the calling thread.
pub(crate) fn is_on() -> bool {
    ON.with(Cell::get)
}

/// In deterministic mode, the thread's next id (1, 2, ...); `None` otherwise, where the
/// caller draws a random one.
pub(crate) fn next_id<T: From<u64>>() -> Option<T> {
    is_on().then(|| {
        LAST_ID.with(|cell| {
            let id = cell.get() + 1;
            cell.set(id);
            T::from(id)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the counter gives ids only in deterministic mode, one after another, and
    /// starts over each time the mode is set (each simulated run numbers alike).
    /// Method: off, on twice, off, on a fresh thread so that no other test's mode leaks.
    #[test]
    fn ids_count_only_in_deterministic_mode_and_restart_with_it() {
        std::thread::spawn(|| {
            assert_eq!(next_id::<u64>(), None);
            set_deterministic(true);
            assert_eq!(next_id::<u64>(), Some(1));
            assert_eq!(next_id::<u128>(), Some(2));
            set_deterministic(true);
            assert_eq!(next_id::<u64>(), Some(1));
            set_deterministic(false);
            assert_eq!(next_id::<u64>(), None);
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
    }
}
