//! [`Connections`], the table of one listener's slots: admission, idle-first eviction,
//! shutdown and drain.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::task::AtomicWaker;

use super::slot::{Signals, Slot, Told};
use super::{ADMISSION_RECHECK_MS, Admitted, CloseReason, ConnPolicy};

pub(super) struct Open {
    pub(super) next_id: u64,
    pub(super) slots: HashMap<u64, Arc<Slot>>,
}

pub(super) struct Table {
    pub(super) policy: ConnPolicy,
    pub(super) signals: Arc<Signals>,
    pub(super) open: Mutex<Open>,
    /// Set, under the `open` lock, by [`Connections::shutdown`]: a slot admitted after it
    /// is told at once.
    pub(super) stopping: AtomicBool,
}

impl Table {
    pub(super) fn open(&self) -> MutexGuard<'_, Open> {
        // The map stays consistent whatever panicked while holding the lock: every
        // change is a single insert or remove.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn closed(&self, reason: CloseReason) {
        if let Some(hook) = self.policy.on_close {
            hook(self.policy.name, reason);
        }
    }
}

/// The connections of one listener.
#[derive(Clone)]
pub struct Connections {
    pub(super) table: Arc<Table>,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("policy", &self.table.policy)
            .field("live", &self.live())
            .finish_non_exhaustive()
    }
}

impl Connections {
    /// No connections yet.
    #[must_use]
    pub fn new(policy: ConnPolicy) -> Self {
        Self {
            table: Arc::new(Table {
                policy,
                signals: Arc::new(Signals::new()),
                open: Mutex::new(Open {
                    next_id: 0,
                    slots: HashMap::new(),
                }),
                stopping: AtomicBool::new(false),
            }),
        }
    }

    /// The policy this table applies.
    #[must_use]
    pub fn policy(&self) -> &ConnPolicy {
        &self.table.policy
    }

    /// Connections admitted and not ended yet (evicted ones still closing included).
    #[must_use]
    pub fn live(&self) -> usize {
        self.table.signals.live.load(Ordering::Acquire)
    }

    /// Admits a new connection: at once under `connections_max`, else by closing the
    /// connection idle the longest. `None` when every admitted connection has a request
    /// in flight.
    #[must_use]
    pub fn try_admit(&self) -> Option<Admitted> {
        let table = &self.table;
        let mut open = table.open();
        if open.slots.len() >= table.policy.connections_max {
            let victim = evict_oldest_idle(&mut open.slots)?;
            victim.tell(Told::Evicted);
            table.closed(CloseReason::EvictedIdle);
            tracing::debug!(
                listener = table.policy.name,
                limit = table.policy.connections_max,
                "closed the connection idle the longest to admit a new one"
            );
        }
        let id = open.next_id;
        open.next_id += 1;
        let slot = Arc::new(Slot {
            id,
            state: AtomicU32::new(0),
            served: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(table.signals.now_ms()),
            reasons: AtomicU8::new(0),
            told: AtomicWaker::new(),
            signals: Arc::clone(&table.signals),
        });
        if table.stopping.load(Ordering::Acquire) {
            slot.tell(Told::ShuttingDown);
        }
        open.slots.insert(id, Arc::clone(&slot));
        table.signals.live.fetch_add(1, Ordering::AcqRel);
        Some(Admitted {
            slot,
            table: Arc::clone(table),
        })
    }

    /// [`Self::try_admit`], waiting while every connection is busy until one ends or
    /// turns idle. Cancel-safe.
    pub async fn admit(&self) -> Admitted {
        let signals = &self.table.signals;
        loop {
            let freed = signals.freed.notified();
            if let Some(admitted) = self.try_admit() {
                signals.waiting.store(false, Ordering::Release);
                return admitted;
            }
            signals.waiting.store(true, Ordering::Release);
            tokio::select! {
                () = freed => {}
                () = tokio::time::sleep(Duration::from_millis(ADMISSION_RECHECK_MS)) => {}
            }
        }
    }

    /// Asks every connection to finish: idle ones close at once, busy ones after their
    /// requests in flight.
    pub fn shutdown(&self) {
        let open = self.table.open();
        self.table.stopping.store(true, Ordering::Release);
        for slot in open.slots.values() {
            slot.tell(Told::ShuttingDown);
        }
    }

    /// Waits until no admitted connection is left.
    pub async fn drained(&self) {
        let signals = &self.table.signals;
        loop {
            let notified = signals.all_closed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if signals.live.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Claims a slot whose connection has nothing in flight and takes it out of `slots`: a
/// keep-alive connection (one that has served a request) idle the longest if there is one,
/// else the fresh connection admitted the longest ago.
///
/// Keep-alive connections go first because closing one between requests costs its client
/// a reconnect at most, while a fresh connection may be carrying a head that the server has
/// not read yet. Under a flood of clients that reconnect as soon as they are closed, an
/// order by idle time alone closed a legitimate client's new connection before its head was
/// read; with this order, a fresh connection is closed only once no keep-alive one is left.
pub(super) fn evict_oldest_idle(slots: &mut HashMap<u64, Arc<Slot>>) -> Option<Arc<Slot>> {
    loop {
        let id = slots
            .values()
            .filter(|slot| slot.state.load(Ordering::Acquire) == 0)
            .min_by_key(|slot| {
                let fresh = !slot.served.load(Ordering::Acquire);
                (fresh, slot.idle_since_ms.load(Ordering::Acquire), slot.id)
            })?
            .id;
        let claimed = slots.get(&id).is_some_and(|slot| slot.claim_idle());
        if claimed {
            return slots.remove(&id);
        }
        // A request reached that connection between the scan and the claim: scan again.
    }
}
