//! One admitted connection's slot: its requests in flight, whether it has served one,
//! since when it has been idle, and what its task should do next.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

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
    /// [`Told`] reasons, as bits, set before `told` is notified.
    pub(super) reasons: AtomicU8,
    /// Notified when the slot is claimed by an eviction or the listener shuts down.
    ///
    /// One notifier per slot, rather than one the whole listener shares (as a watch
    /// channel of its shutdown was): the connection's task polls this on every wake-up,
    /// and a waiting `Notified` takes its notifier's lock at each poll. Shared, that lock
    /// was one cache line for every connection of every data-path thread; per slot, it is
    /// only ever taken by the slot's own thread, except at the one eviction or shutdown.
    pub(super) told: Notify,
    pub(super) signals: Arc<Signals>,
}

impl Slot {
    /// Tells the slot's task to stop, for `why`. A task not waiting yet sees it at its
    /// next wait (`Notify` keeps the permit).
    pub(super) fn tell(&self, why: Told) {
        self.reasons.fetch_or(why as u8, Ordering::AcqRel);
        self.told.notify_one();
    }

    /// Waits until the slot is told to stop, and says why; at once if it was told before
    /// (the reasons stay set, so every later wait sees them too). An eviction wins over a
    /// shutdown when both came, since the eviction has already counted the close.
    pub(super) async fn told(&self) -> Told {
        loop {
            let reasons = self.reasons.load(Ordering::Acquire);
            if reasons & Told::Evicted as u8 != 0 {
                return Told::Evicted;
            }
            if reasons & Told::ShuttingDown as u8 != 0 {
                return Told::ShuttingDown;
            }
            // A `tell` between the load and this wait leaves a permit, which ends it.
            self.told.notified().await;
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
