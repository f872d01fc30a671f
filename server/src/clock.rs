//! One reading of the clock per poll of a connection's task.
//!
//! A proxied request read the monotonic clock about a dozen times: its start, the
//! barrier's deadline, the exchange's start, each body frame's progress, the upstream
//! latency, the pool's idle times, the connection's idle time. Each reading is a call
//! into the vDSO, about 30 ns on the 2-core VM (`clock_gettime` with the TSC), so a
//! dozen cost more than the proxy's header checks together.
//!
//! Inside [`Cached`] (the future of a connection's task is wrapped in it), [`now`] and
//! [`tokio_now`] read the clock once per poll and give that reading to every caller in
//! the same poll. Outside it (any other task, a test polling a body by hand), they read
//! the clock each time, exactly as `Instant::now()` does.
//!
//! **What a reading from earlier in the poll may be used for.** A poll runs without
//! waiting, so the reading is at most as old as the work done since in that poll
//! (microseconds; an inline fence commit, the longest, calls [`forget`] after it).
//! A reading that old is only ever *earlier* than the true time, so:
//! - a deadline computed from it (`now + timeout`) comes at most that much sooner, and
//!   an elapsed time measured to it is at most that much shorter: timeouts and
//!   metrics, where that does not matter;
//! - a check "has the deadline passed?" may answer "not yet" for that long after it
//!   has: **never use it where answering late is unsafe**, as for a lease that is about
//!   to end. The lease checks read the clock themselves.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::scoped::Scoped;

/// The reading of this poll: `None` outside a poll of a [`Cached`] future (read the
/// clock each time), `Some(None)` inside one before the first reading.
type Reading = Option<Option<tokio::time::Instant>>;

thread_local! {
    static READING: Cell<Reading> = const { Cell::new(None) };
}

/// The monotonic time: the reading of this poll inside a [`Cached`] future, else the
/// clock's now.
pub fn now() -> std::time::Instant {
    tokio_now().into_std()
}

/// [`now`] as tokio's `Instant` (which follows a paused clock in tests).
pub fn tokio_now() -> tokio::time::Instant {
    READING.with(|reading| match reading.get() {
        None => tokio::time::Instant::now(),
        Some(Some(at)) => at,
        Some(None) => {
            let at = tokio::time::Instant::now();
            reading.set(Some(Some(at)));
            at
        }
    })
}

/// Drops the reading of this poll, after work that may have taken long (a fence
/// committed inline, with its `fsync`): the next [`now`] reads the clock again.
pub fn forget() {
    READING.with(|reading| {
        if reading.get().is_some() {
            reading.set(Some(None));
        }
    });
}

pin_project_lite::pin_project! {
    /// A future whose polls each share one reading of the clock ([`now`]).
    pub struct Cached<F> {
        #[pin]
        inner: F,
    }
}

impl<F> Cached<F> {
    /// Wraps `inner`.
    pub fn new(inner: F) -> Self {
        Self { inner }
    }
}

impl<F: Future> Future for Cached<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // No reading outlives this poll, and a poll nested in another keeps the outer
        // one's.
        let _scoped = Scoped::set(&READING, Some(None));
        self.project().inner.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Goal: inside a poll every caller gets the reading taken at the first call, even
    /// as the real clock moves on; [`forget`] makes the next call read again; a later
    /// poll reads again; outside a poll each call reads the clock.
    /// Method: real sleeps (2 ms inside the poll, 20 ms between polls) and comparisons.
    #[tokio::test]
    async fn a_reading_lasts_one_poll_and_no_longer() {
        Cached::new(async {
            let first = now();
            std::thread::sleep(Duration::from_millis(2));
            assert_eq!(now(), first, "one reading for the whole poll");
            assert_eq!(tokio_now().into_std(), first);
            forget();
            let again = now();
            assert!(
                again - first >= Duration::from_millis(2),
                "{:?}",
                again - first
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
            let later = now();
            assert!(
                later - again >= Duration::from_millis(20),
                "{:?}",
                later - again
            );
        })
        .await;
        let outside = now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(now() - outside >= Duration::from_millis(2));
    }

    /// Goal: a reading follows tokio's clock, so a test with a paused clock sees the
    /// time its runtime sees, poll after poll.
    /// Method: a paused clock advanced between two polls.
    #[tokio::test(start_paused = true)]
    async fn a_reading_follows_a_paused_clock() {
        Cached::new(async {
            let first = tokio_now();
            tokio::time::advance(Duration::from_millis(5)).await;
            assert_eq!(tokio_now() - first, Duration::from_millis(5));
        })
        .await;
    }

    /// Goal: a panic inside a poll leaves no reading behind for the thread's next task.
    /// Method: poll a panicking future under `catch_unwind`, then read outside.
    #[test]
    fn a_panicking_poll_leaves_no_reading() {
        let mut cached = Box::pin(Cached::new(async {
            let _ = now();
            panic!("in the poll");
        }));
        let waker = std::task::Waker::noop();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = cached.as_mut().poll(&mut Context::from_waker(waker));
        }));
        assert!(result.is_err());
        assert_eq!(READING.with(Cell::get), None);
    }
}
