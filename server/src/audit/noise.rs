//! The rate limit on noise records: per kind, at most [`AUDIT_NOISE_PER_SECOND_MAX`]
//! records a second are written in full; the rest are counted, and the writer turns the
//! counts into one `suppressed` record per kind (see [`super`]).
//!
//! The limit is checked before the caller builds the record, so a refused one costs a
//! short mutex and a clock read, never an allocation: a flood of unproven requests then
//! costs the data path about what answering them costs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

/// Noise records of one kind written in full per second. Enough to show who floods and
/// how (each record names the peer, method and path), few enough that a flood that never
/// stops adds under 10 KiB a second per kind to the noise file.
pub const AUDIT_NOISE_PER_SECOND_MAX: u64 = 10;
/// Kinds of noise told apart. The kinds are names in the code (`missing-proof`,
/// `invalid-proof`, ...), so this is never reached; past it, further kinds share the
/// one kind [`OTHER_KIND`] rather than grow the table.
pub const AUDIT_NOISE_KINDS_MAX: usize = 16;
/// The kind every kind past [`AUDIT_NOISE_KINDS_MAX`] is counted under.
pub const OTHER_KIND: &str = "other";

/// One kind's window: the current second and what it let through.
#[derive(Debug)]
struct Window {
    kind: &'static str,
    /// Seconds since the epoch of the current window.
    second: u64,
    /// Records admitted in that second.
    admitted: u64,
    /// Records refused since the writer last took the count.
    pending: u64,
}

/// Admits noise records at [`AUDIT_NOISE_PER_SECOND_MAX`] per kind and second, and
/// counts the rest. Shared by whoever records noise and the writer that summarises it.
#[derive(Debug)]
pub struct NoiseLimiter {
    per_second: u64,
    windows: Mutex<Vec<Window>>,
    /// Records refused since start.
    suppressed: AtomicU64,
}

impl Default for NoiseLimiter {
    fn default() -> Self {
        Self::new(AUDIT_NOISE_PER_SECOND_MAX)
    }
}

impl NoiseLimiter {
    /// A limiter letting `per_second` records of each kind through a second.
    pub fn new(per_second: u64) -> Self {
        Self {
            per_second,
            windows: Mutex::new(Vec::with_capacity(AUDIT_NOISE_KINDS_MAX + 1)),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether a record of `kind` may be written in full now; when not, it is counted
    /// for the next `suppressed` record of its kind. Never blocks on I/O.
    pub fn admit(&self, kind: &'static str) -> bool {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // Each critical section below is arithmetic that cannot panic half-way.
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        let window = window_of(&mut windows, kind, now);
        if window.second != now {
            window.second = now;
            window.admitted = 0;
        }
        if window.admitted < self.per_second {
            window.admitted += 1;
            return true;
        }
        window.pending += 1;
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Records refused since start.
    pub fn suppressed(&self) -> u64 {
        self.suppressed.load(Ordering::Relaxed)
    }

    /// The counts refused since the last call, by kind (kinds with none left out).
    pub(super) fn take(&self) -> Vec<(&'static str, u64)> {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        windows
            .iter_mut()
            .filter(|w| w.pending > 0)
            .map(|w| (w.kind, std::mem::take(&mut w.pending)))
            .collect()
    }
}

/// The window of `kind`, added (in `now`'s second) when it is new.
fn window_of<'a>(windows: &'a mut Vec<Window>, kind: &'static str, now: u64) -> &'a mut Window {
    let kind = if windows.len() >= AUDIT_NOISE_KINDS_MAX && !windows.iter().any(|w| w.kind == kind)
    {
        OTHER_KIND
    } else {
        kind
    };
    let index = windows
        .iter()
        .position(|w| w.kind == kind)
        .unwrap_or_else(|| {
            windows.push(Window {
                kind,
                second: now,
                admitted: 0,
                pending: 0,
            });
            windows.len() - 1
        });
    &mut windows[index]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: each kind gets its own budget a second; the rest are counted by kind, and
    /// taking the counts resets them. Method: admit 25 of one kind and 3 of another in
    /// a limiter of 10 a second (retried from the start if the second turned meanwhile).
    #[test]
    fn each_kind_gets_its_own_budget_and_the_rest_are_counted() {
        loop {
            let limiter = NoiseLimiter::new(10);
            let start = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs();
            let a = (0..25).filter(|_| limiter.admit("a")).count();
            let b = (0..3).filter(|_| limiter.admit("b")).count();
            let end = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs();
            if start != end {
                continue;
            }
            assert_eq!((a, b), (10, 3));
            assert_eq!(limiter.suppressed(), 15);
            assert_eq!(limiter.take(), [("a", 15)]);
            assert!(limiter.take().is_empty());
            return;
        }
    }

    /// Goal: the table of kinds is bounded; kinds past the bound share `other`.
    /// Method: admit one record of each of 40 kinds named at run time.
    #[test]
    fn kinds_past_the_bound_share_one_window() {
        let limiter = NoiseLimiter::new(0);
        let names: Vec<&'static str> = (0..40)
            .map(|i| &*Box::leak(format!("k{i}").into_boxed_str()))
            .collect();
        for name in &names {
            assert!(!limiter.admit(name));
        }
        let taken = limiter.take();
        assert_eq!(taken.len(), AUDIT_NOISE_KINDS_MAX + 1);
        assert_eq!(
            taken.last(),
            Some(&(OTHER_KIND, 40 - AUDIT_NOISE_KINDS_MAX as u64))
        );
    }
}
