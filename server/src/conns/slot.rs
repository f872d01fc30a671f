//! One admitted connection's slot: its requests in flight, whether it has served one,
//! since when it has been idle, and what its task should do next.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use futures_util::task::AtomicWaker;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{CloseReason, ConnPolicy};

/// Set in a slot's state word once the slot is claimed for closing.
pub(super) const CLOSING: u32 = 1 << 31;

/// Why a slot's task was told to stop (see [`Slot::tell`]): its slot was claimed by an
/// eviction, or its listener is shutting down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Told {
    Evicted = 1,
    ShuttingDown = 2,
}

/// What every slot and guard shares.
pub(super) struct Signals {
    /// Time zero of the slots' millisecond clocks.
    pub(super) epoch: Instant,
    /// A waiting [`Connections::admit`] wants to hear of connections turning idle.
    pub(super) waiting: AtomicBool,
    /// A slot was freed or a connection turned idle.
    pub(super) freed: Notify,
    /// Connections admitted and not yet ended (evicted ones included until they end).
    pub(super) live: AtomicUsize,
    /// `live` reached zero.
    pub(super) all_closed: Notify,
}

impl Signals {
    /// Signals whose clock starts now, with nothing live or waiting.
    pub(super) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            waiting: AtomicBool::new(false),
            freed: Notify::new(),
            live: AtomicUsize::new(0),
            all_closed: Notify::new(),
        }
    }

    pub(super) fn now_ms(&self) -> u64 {
        u64::try_from(
            crate::clock::tokio_now()
                .saturating_duration_since(self.epoch)
                .as_millis(),
        )
        .unwrap_or(u64::MAX)
    }
}

/// One admitted connection's state.
pub(super) struct Slot {
    pub(super) id: u64,
    /// Requests in flight, with [`CLOSING`] set once the slot is claimed for closing.
    pub(super) state: AtomicU32,
    /// Whether a request has reached the service yet (then idle means keep-alive).
    pub(super) served: AtomicBool,
    /// Milliseconds since `Signals::epoch` at admission, then at the end of the latest
    /// response.
    pub(super) idle_since_ms: AtomicU64,
    /// [`Told`] reasons, as bits, set before `told` is woken.
    pub(super) reasons: AtomicU8,
    /// Woken when the slot is claimed by an eviction or the listener shuts down.
    ///
    /// One waker per slot, rather than a notifier the whole listener shares (as a watch
    /// channel of its shutdown was): the connection's task polls [`Slot::told`] at every
    /// wake-up (three a request). A waiting `Notify` takes its lock at each of those
    /// polls; the waker is a compare-and-swap, and its line is only ever touched by the
    /// slot's own thread, except at the one eviction or shutdown. It holds one waker:
    /// only the connection's own task waits on its slot.
    pub(super) told: AtomicWaker,
    pub(super) signals: Arc<Signals>,
}

impl Slot {
    /// Tells the slot's task to stop, for `why`. A task not waiting yet sees it at its
    /// next wait (the reasons stay set).
    pub(super) fn tell(&self, why: Told) {
        self.reasons.fetch_or(why as u8, Ordering::AcqRel);
        self.told.wake();
    }

    /// Waits until the slot is told to stop, and says why; at once if it was told before
    /// (the reasons stay set, so every later wait sees them too). An eviction wins over a
    /// shutdown when both came, since the eviction has already counted the close. Only
    /// the connection's own task may wait (the slot keeps one waker).
    pub(super) fn told(&self) -> impl Future<Output = Told> + '_ {
        std::future::poll_fn(move |cx| {
            if let Some(told) = self.reason() {
                return Poll::Ready(told);
            }
            self.told.register(cx.waker());
            // A `tell` between the first look and the registration woke no waker: look
            // again now that one is registered.
            self.reason().map_or(Poll::Pending, Poll::Ready)
        })
    }

    /// Why the slot was told to stop, if it was.
    fn reason(&self) -> Option<Told> {
        let reasons = self.reasons.load(Ordering::Acquire);
        if reasons & Told::Evicted as u8 != 0 {
            Some(Told::Evicted)
        } else if reasons & Told::ShuttingDown as u8 != 0 {
            Some(Told::ShuttingDown)
        } else {
            None
        }
    }

    /// Claims the slot for closing if nothing is in flight.
    pub(super) fn claim_idle(&self) -> bool {
        self.state
            .compare_exchange(0, CLOSING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// What the connection's task does next: when to look at the slot again, and, if
    /// the slot is idle, the reason and deadline to close it for.
    pub(super) fn next_check(&self, policy: &ConnPolicy, release_after: Option<Duration>) -> Check {
        let now = crate::clock::tokio_now();
        // Nothing signals the task when a request starts or ends, so it looks again at
        // least this often: a connection that turns idle at `t` is then seen idle by
        // `t + recheck`, at or before its close is due (`t + keepalive_timeout`), and a
        // fresh connection that served a request moves to the keep-alive deadline in time.
        // With a release time, also that often, so that an idle connection is released
        // by twice that time after its last response.
        let mut recheck = policy.header_read_timeout.min(policy.keepalive_timeout);
        if let Some(release_after) = release_after {
            recheck = recheck.min(release_after);
        }
        let recheck = now + recheck;
        let state = self.state.load(Ordering::Acquire);
        let since_ms = self.idle_since_ms.load(Ordering::Acquire);
        if state != 0 {
            // Busy (or already closing): nothing can time out now.
            return Check {
                at: recheck,
                close: None,
                release: None,
                since_ms,
            };
        }
        let since = self.signals.epoch + Duration::from_millis(since_ms);
        let served = self.served.load(Ordering::Acquire);
        // Only a connection that has served a request is released: a fresh one is still
        // within its header timeout, which hyper's buffers are there to serve.
        let release = release_after
            .filter(|_| served)
            .map(|release_after| since + release_after);
        let (deadline, reason) = if served {
            (
                since + policy.keepalive_timeout,
                CloseReason::KeepaliveTimeout,
            )
        } else {
            (
                since + policy.header_read_timeout,
                CloseReason::HeaderTimeout,
            )
        };
        let at = deadline.min(recheck);
        Check {
            at: release.map_or(at, |release| at.min(release)),
            close: Some((reason, deadline)),
            release,
            since_ms,
        }
    }

    /// Whether nothing is in flight (nor the slot claimed) and no request came and went
    /// since `since_ms`.
    pub(super) fn idle_since(&self, since_ms: u64) -> bool {
        self.state.load(Ordering::Acquire) == 0
            && self.idle_since_ms.load(Ordering::Acquire) == since_ms
    }
}

/// See [`Slot::next_check`].
pub(super) struct Check {
    /// When to look again.
    pub(super) at: Instant,
    /// For an idle slot: why and when it is to be closed.
    pub(super) close: Option<(CloseReason, Instant)>,
    /// For an idle slot that has served a request, with a release time: when to release
    /// it.
    pub(super) release: Option<Instant>,
    /// The slot's `idle_since_ms` this was computed from.
    pub(super) since_ms: u64,
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Wake, Waker};

    use super::*;

    fn slot() -> Arc<Slot> {
        Arc::new(Slot {
            id: 0,
            state: AtomicU32::new(0),
            served: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            reasons: AtomicU8::new(0),
            told: AtomicWaker::new(),
            signals: Arc::new(Signals::new()),
        })
    }

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Goal: a task waiting on its slot is woken by a `tell` and then hears why, however
    /// often it was polled before; polls before the `tell` stay pending. Method: poll a
    /// wait by hand with a counting waker, several times, then tell the slot.
    #[test]
    fn a_waiting_task_is_woken_by_a_tell_and_hears_why() {
        let slot = slot();
        let count = Arc::new(Count::default());
        let waker = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        let mut wait = pin!(slot.told());
        for _ in 0..3 {
            assert!(wait.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        slot.tell(Told::ShuttingDown);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "the tell woke no one");
        assert_eq!(wait.poll(&mut cx), Poll::Ready(Told::ShuttingDown));
    }

    /// Goal: a `tell` before the wait is not lost: every later wait ends at once, and an
    /// eviction wins over a shutdown. Method: tell twice, then start fresh waits.
    #[test]
    fn a_tell_before_the_wait_is_seen_by_every_later_wait() {
        let slot = slot();
        slot.tell(Told::ShuttingDown);
        slot.tell(Told::Evicted);
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..2 {
            assert_eq!(pin!(slot.told()).poll(&mut cx), Poll::Ready(Told::Evicted));
        }
    }

    /// Goal: a `tell` from another thread (as an eviction or a shutdown comes) wakes the
    /// task waiting on a runtime. Method: tell from a fresh thread while a spawned task
    /// waits, many times, each with a deadline. (The narrow window between the wait's
    /// first look and its registration is not forced here: the look after registering,
    /// the pattern `AtomicWaker` documents, covers it.)
    #[test]
    fn a_tell_from_another_thread_wakes_the_waiting_task() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .expect("a runtime");
        for _ in 0..500 {
            let slot = slot();
            let teller = Arc::clone(&slot);
            runtime.block_on(async move {
                let waiting = tokio::spawn(async move { slot.told().await });
                tokio::task::yield_now().await;
                std::thread::spawn(move || teller.tell(Told::Evicted));
                let told = tokio::time::timeout(Duration::from_secs(10), waiting)
                    .await
                    .expect("the tell was missed")
                    .expect("the task ran");
                assert_eq!(told, Told::Evicted);
            });
        }
    }
}
