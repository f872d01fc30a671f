//! The fence register: per scope, the highest fencing token admitted so far.
//!
//! # Durability
//! A raise is committed to redb with [`redb::Durability::Immediate`] (fsynced) and read
//! back before [`FenceRegister::advance`] returns [`Advance::Raised`], and before any
//! reader can see it through [`FenceRegister::current`]. So every fence a caller has been
//! told about survives a crash, `kill -9` or power loss, and after a restart the fence of
//! a scope is at least the highest raise that was acknowledged. At most one raise per
//! scope can be on disk without having been acknowledged: the one that was committing
//! when the process died.
//!
//! # Concurrency and group commit
//! Reads come from memory: one shard read of a [`DashMap`] and an atomic load, with no
//! global lock and no disk I/O. Raises share commits: a raise joins a queue, and one
//! caller at a time (the committer) takes everything queued, writes it in one redb
//! transaction, fsyncs once and publishes the new fences; raises that arrive meanwhile
//! form the next batch. Every caller still returns only after the commit that carried its
//! raise, so a raise is durable before its caller acts on it. Within one batch a scope
//! takes the highest token queued for it; the lower ones of that scope are answered
//! stale, as they would have been had the highest one committed first. Under load the
//! number of fsyncs therefore follows the disk's speed, not the number of raises.
//! Writes to the fence table (the committer's batches and resets) are serialised by one
//! lock, and while it is free memory equals disk.
//!
//! # Reset
//! [`FenceRegister::reset`] is the one way a fence goes down: an operator's recovery from
//! a forged or mistaken raise. It is durable like a raise, under the same per-scope lock;
//! the caller (the proxy) makes sure no request of the scope is in flight meanwhile.
//!
//! # Scope limit
//! New scopes are bounded by `scopes_max`, so that clients naming scopes cannot grow the
//! register without end. Reserved scopes (given at open: the proxy's `default` and the
//! scopes its routes name) are always available: they are not counted against the limit,
//! so a flood of other scopes can never lock them out.
//!
//! One register must own the fence table of a database: two registers on the same file
//! would each trust their own memory, and the second would trip the paired assertion
//! that the fence never moves down.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use redb::{Durability, ReadableDatabase, ReadableTable, TableError};

use crate::db::load_error;
use crate::tables::FENCES;

/// Default bound on the number of distinct scopes a register holds.
pub const SCOPES_MAX_DEFAULT: usize = 10_000;

/// What [`FenceRegister::advance`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// The token was higher: the fence moved to it and is durable.
    Raised {
        /// The fence before the call (0 when the scope was new).
        previous: u64,
    },
    /// The token equals the fence: nothing changed, no disk I/O.
    Unchanged,
    /// The token is lower than the fence: nothing changed.
    Stale {
        /// The fence, higher than the presented token.
        current: u64,
    },
}

/// Why an advance failed. After an error the fence is unchanged in memory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdvanceError {
    /// Too many distinct scopes.
    #[error("scope limit reached: {scopes_max} scopes exist, cannot add {scope}")]
    ScopeLimit {
        /// The new scope.
        scope: String,
        /// The configured limit.
        scopes_max: usize,
    },
    /// redb failed.
    #[error("storage error advancing scope {scope} to token {token}: {cause}")]
    Storage {
        /// The scope.
        scope: String,
        /// The token.
        token: u64,
        /// The underlying error, rendered.
        cause: String,
    },
    /// redb failed during a reset; the fence is unchanged.
    #[error("storage error resetting scope {scope} to token {token}: {cause}")]
    ResetStorage {
        /// The scope.
        scope: String,
        /// The token.
        token: u64,
        /// The underlying error, rendered.
        cause: String,
    },
}

/// What a write to the fence table is: a raise may only move the stored fence up; a
/// reset may set it to anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    Raise,
    Reset,
}

/// The in-memory fence of one scope.
struct ScopeFence {
    /// The highest token known durable for this scope (0 before the first raise).
    /// Invariant: never decreases except through a reset, and never exceeds the stored
    /// value; while the register's `writer` lock is free it equals the stored value.
    current: AtomicU64,
}

impl ScopeFence {
    fn new(current: u64) -> Self {
        Self {
            current: AtomicU64::new(current),
        }
    }

    fn load(&self) -> u64 {
        // Acquire pairs with the release in `advance`: a reader that sees a token also
        // sees everything that happened before it was published.
        self.current.load(Ordering::Acquire)
    }
}

/// State shared by every clone of a register.
struct Shared {
    db: Arc<redb::Database>,
    /// Scope to fence. Entries are never removed, so an `Arc` taken out of the map
    /// always remains the scope's one fence. Every fenced request looks its scope up
    /// here, and scope names can be the client's, so the hasher is foldhash with a
    /// random seed per map: a fraction of the cost of the standard library's hasher
    /// (`SipHash`) for a short name, and no fixed seed to pick colliding names against
    /// (the map is bounded by `scopes_max`).
    scopes: DashMap<String, Arc<ScopeFence>, foldhash::fast::RandomState>,
    /// Number of entries in `scopes` that are not reserved. Counted separately so that
    /// reserving a slot and checking the bound is one atomic step.
    scopes_len: AtomicUsize,
    /// Bound on `scopes_len` for new scopes; scopes loaded at open are kept even above it.
    scopes_max: usize,
    /// Scopes that are always available and not counted in `scopes_len`.
    reserved: HashSet<String>,
    /// Raises waiting for a commit, and their answers (see the module docs).
    queue: Mutex<CommitQueue>,
    /// Signalled whenever a batch's answers are in `queue`.
    answered: Condvar,
    /// Held across the check-write-read-back-publish of a batch or a reset: every write
    /// of the fence table goes through it, so memory equals disk while it is free.
    writer: Mutex<()>,
    /// Commits of raises made since open (a batch counts once), for metrics.
    commits: AtomicU64,
}

/// One raise waiting in the queue.
struct Pending {
    ticket: u64,
    scope: String,
    token: u64,
    fence: Arc<ScopeFence>,
}

/// The raises waiting for the next batch, and the answers of finished batches.
#[derive(Default)]
struct CommitQueue {
    next_ticket: u64,
    pending: Vec<Pending>,
    /// Whether a caller is committing a batch right now.
    committing: bool,
    /// Answers by ticket, taken by their callers.
    answers: HashMap<u64, Result<Advance, AdvanceError>>,
}

/// Locks a mutex whose data stays consistent across a panic: the queue is only ever
/// changed in whole steps, and `writer` guards no data, so a poisoned lock is safe.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Scope to highest admitted token. Cheap to clone; shared by all tasks.
///
/// Durability: when [`advance`](Self::advance) returns [`Advance::Raised`], the new
/// fence is fsynced to disk (`Durability::Immediate`) and has been read back. Reads never
/// touch the disk. See the module docs.
#[derive(Clone)]
pub struct FenceRegister {
    shared: Arc<Shared>,
}

impl FenceRegister {
    /// Loads every scope from `db` into memory. `scopes_max` bounds new scopes.
    pub fn open(db: Arc<redb::Database>, scopes_max: usize) -> Result<Self, crate::OpenError> {
        Self::open_reserved(db, scopes_max, std::iter::empty::<String>())
    }

    /// [`open`](Self::open), with `reserved` scopes that are always available: they are
    /// not counted against `scopes_max`, so no number of other scopes can lock them out.
    pub fn open_reserved(
        db: Arc<redb::Database>,
        scopes_max: usize,
        reserved: impl IntoIterator<Item = String>,
    ) -> Result<Self, crate::OpenError> {
        let reserved: HashSet<String> = reserved.into_iter().collect();
        let scopes = DashMap::with_hasher(foldhash::fast::RandomState::default());
        {
            let txn = db.begin_read().map_err(load_error)?;
            match txn.open_table(FENCES) {
                Ok(table) => {
                    for row in table.iter().map_err(load_error)? {
                        let (scope, token) = row.map_err(load_error)?;
                        scopes.insert(
                            scope.value().to_owned(),
                            Arc::new(ScopeFence::new(token.value())),
                        );
                    }
                }
                // A file not made by `open_database` may lack the table; the first raise
                // creates it.
                Err(TableError::TableDoesNotExist(_)) => {}
                Err(err) => return Err(load_error(err)),
            }
        }
        let counted = scopes
            .iter()
            .filter(|entry| !reserved.contains(entry.key()))
            .count();
        let scopes_len = AtomicUsize::new(counted);
        tracing::debug!(
            scopes = scopes.len(),
            counted,
            reserved = reserved.len(),
            scopes_max,
            "fence register loaded"
        );
        Ok(Self {
            shared: Arc::new(Shared {
                db,
                scopes,
                scopes_len,
                scopes_max,
                reserved,
                queue: Mutex::new(CommitQueue::default()),
                answered: Condvar::new(),
                writer: Mutex::new(()),
                commits: AtomicU64::new(0),
            }),
        })
    }

    /// The fence of `scope` (0 when never seen). Memory only: no disk I/O, no global lock.
    pub fn current(&self, scope: &str) -> u64 {
        self.shared
            .scopes
            .get(scope)
            .map_or(0, |fence| fence.value().load())
    }

    /// Moves the fence of `scope` up to `token` if it is higher. Blocking: when the fence
    /// rises the new value is committed with `Durability::Immediate` (fsynced) before
    /// this returns, possibly in one commit with other callers' raises (see the module
    /// docs). Equal and lower tokens do no disk I/O.
    pub fn advance(&self, scope: &str, token: u64) -> Result<Advance, AdvanceError> {
        // Clone the Arc out so that no map guard is held across the queue or the disk.
        let fence = self
            .shared
            .scopes
            .get(scope)
            .map(|entry| Arc::clone(entry.value()));
        let current = fence.as_ref().map_or(0, |fence| fence.load());
        if let Some(outcome) = settled(scope, token, current) {
            return Ok(outcome);
        }
        let fence = match fence {
            Some(fence) => fence,
            None => self.insert_scope(scope)?,
        };

        let shared = &self.shared;
        let mut queue = lock(&shared.queue);
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        queue.pending.push(Pending {
            ticket,
            scope: scope.to_owned(),
            token,
            fence,
        });
        loop {
            if let Some(answer) = queue.answers.remove(&ticket) {
                return answer;
            }
            if queue.committing {
                queue = shared
                    .answered
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            // Nobody is committing: this caller commits everything queued, its own raise
            // included unless an earlier committer already answered it (checked above).
            queue.committing = true;
            drop(queue);
            Committer {
                shared,
                batch: Vec::new(),
                finished: false,
            }
            .run();
            queue = lock(&shared.queue);
        }
    }

    /// Sets the fence of `scope` to `token`, lower included, and returns the fence it
    /// had. This is the only way a fence goes down: an operator's audited recovery from a
    /// forged or mistaken raise, never part of admitting a request. Blocking: the new
    /// value is committed with `Durability::Immediate` (fsynced) and read back before
    /// this returns, as a raise is. A reset to the fence it already has writes nothing.
    ///
    /// It takes the scope's lock, so it never interleaves with a raise of the scope; but
    /// a caller that admitted a request at the old fence must let it finish first, which
    /// is the proxy's job (its in-flight barrier), not the register's.
    pub fn reset(&self, scope: &str, token: u64) -> Result<u64, AdvanceError> {
        let existing = self
            .shared
            .scopes
            .get(scope)
            .map(|entry| Arc::clone(entry.value()));
        let fence = match existing {
            Some(fence) => fence,
            // Resetting an unseen scope to 0 is a no-op and must not use up a scope slot.
            None if token == 0 => return Ok(0),
            None => self.insert_scope(scope)?,
        };
        // The writer lock orders the reset with every batch of raises.
        let _writing = lock(&self.shared.writer);
        let previous = fence.load();
        if previous == token {
            return Ok(previous);
        }
        self.persist(&[(scope, token)], Write::Reset)
            .map_err(|err| AdvanceError::ResetStorage {
                scope: scope.to_owned(),
                token,
                cause: err.to_string(),
            })
            .inspect_err(|err| tracing::warn!(scope, token, cause = %err, "fence reset failed"))?;
        // Under the lock nothing else writes `current`, so a plain swap publishes the reset
        // and must find the value read above.
        let published = fence.current.swap(token, Ordering::AcqRel);
        assert_eq!(
            published, previous,
            "fence of scope {scope} changed from {previous} to {published} under its lock"
        );
        tracing::debug!(scope, token, previous, "fence reset");
        Ok(previous)
    }

    /// Every scope and its fence, sorted by scope.
    pub fn list(&self) -> Vec<(String, u64)> {
        let mut scopes: Vec<(String, u64)> = self
            .shared
            .scopes
            .iter()
            .map(|entry| (entry.key().clone(), entry.value().load()))
            // A scope whose first raise failed has an entry but no fence.
            .filter(|&(_, token)| token > 0)
            .collect();
        scopes.sort_unstable();
        scopes
    }

    /// Adds `scope` with fence 0, or returns the entry a concurrent caller just added.
    /// A reserved scope takes no slot of `scopes_max`.
    fn insert_scope(&self, scope: &str) -> Result<Arc<ScopeFence>, AdvanceError> {
        let shared = &self.shared;
        match shared.scopes.entry(scope.to_owned()) {
            Entry::Occupied(entry) => Ok(Arc::clone(entry.get())),
            Entry::Vacant(entry) if shared.reserved.contains(scope) => Ok(Arc::clone(
                entry.insert(Arc::new(ScopeFence::new(0))).value(),
            )),
            Entry::Vacant(entry) => {
                let reserved =
                    shared
                        .scopes_len
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |len| {
                            (len < shared.scopes_max).then_some(len + 1)
                        });
                if reserved.is_err() {
                    tracing::warn!(scope, scopes_max = shared.scopes_max, "scope limit reached");
                    return Err(AdvanceError::ScopeLimit {
                        scope: scope.to_owned(),
                        scopes_max: shared.scopes_max,
                    });
                }
                Ok(Arc::clone(
                    entry.insert(Arc::new(ScopeFence::new(0))).value(),
                ))
            }
        }
    }

    /// Commits each `(scope, token)` as that scope's fence in one transaction, fsynced,
    /// and reads them back. The caller holds the `writer` lock and has checked each token
    /// against memory.
    fn persist(&self, writes: &[(&str, u64)], write: Write) -> Result<(), redb::Error> {
        let db = &self.shared.db;
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        {
            let mut table = txn.open_table(FENCES)?;
            for &(scope, token) in writes {
                let stored = table.get(scope)?.map_or(0, |stored| stored.value());
                // Paired assertion, first half: a raise never moves the stored fence down
                // (only a reset may). Memory equals disk under the writer lock, and redb
                // latches its first I/O failure so a half-finished earlier commit cannot
                // leave disk ahead of memory here.
                if write == Write::Raise {
                    assert!(
                        token > stored,
                        "fence of scope {scope} would move from {stored} down to {token}"
                    );
                }
                table.insert(scope, token)?;
            }
        }
        // Dropping `txn` on an early return above aborts it: nothing reaches the disk.
        txn.commit()?;

        // Paired assertion, second half: what a fresh reader sees is what was committed.
        let txn = db.begin_read()?;
        let table = txn.open_table(FENCES)?;
        for &(scope, token) in writes {
            let read_back = table.get(scope)?.map(|stored| stored.value());
            assert_eq!(
                read_back,
                Some(token),
                "fence of scope {scope} read back wrong after commit"
            );
        }
        Ok(())
    }

    /// The number of commits that raised fences since open; a batch of raises counts once.
    pub fn commits(&self) -> u64 {
        self.shared.commits.load(Ordering::Relaxed)
    }

    /// Raises waiting for a commit (tests use it to line up a batch).
    #[cfg(test)]
    fn queued(&self) -> usize {
        lock(&self.shared.queue).pending.len()
    }
}

/// The caller that commits one batch of queued raises. If it unwinds (a broken
/// invariant), dropping it answers the batch's callers with an error and frees the queue
/// for the next committer, so no caller waits forever.
struct Committer<'a> {
    shared: &'a Arc<Shared>,
    batch: Vec<Pending>,
    finished: bool,
}

impl Committer<'_> {
    /// Takes the writer lock, then everything queued, commits it and posts the answers.
    fn run(mut self) {
        let shared = self.shared;
        // The batch is taken only once the writer lock is held, so that raises queued
        // while a reset or a test held it join this batch.
        let _writing = lock(&shared.writer);
        self.batch = std::mem::take(&mut lock(&shared.queue).pending);
        let register = FenceRegister {
            shared: Arc::clone(shared),
        };
        let answers = register.commit_batch(&self.batch);
        let mut queue = lock(&shared.queue);
        queue.answers.extend(answers);
        queue.committing = false;
        self.finished = true;
        shared.answered.notify_all();
    }
}

impl Drop for Committer<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut queue = lock(&self.shared.queue);
        for pending in &self.batch {
            queue.answers.insert(
                pending.ticket,
                Err(AdvanceError::Storage {
                    scope: pending.scope.clone(),
                    token: pending.token,
                    cause: "the commit of this raise's batch failed an internal check".into(),
                }),
            );
        }
        queue.committing = false;
        self.shared.answered.notify_all();
    }
}

impl FenceRegister {
    /// Commits one batch: per scope the highest token queued, when it is above the fence,
    /// all in one transaction; then publishes the new fences and answers every raise of
    /// the batch. The caller holds the writer lock.
    fn commit_batch(&self, batch: &[Pending]) -> Vec<(u64, Result<Advance, AdvanceError>)> {
        // Per scope: the fence before the batch (memory equals disk under the writer
        // lock), the highest token queued, and the scope's in-memory fence.
        let mut scopes: BTreeMap<&str, (u64, u64, &Arc<ScopeFence>)> = BTreeMap::new();
        for pending in batch {
            let entry = scopes.entry(pending.scope.as_str()).or_insert_with(|| {
                let current = pending.fence.load();
                (current, current, &pending.fence)
            });
            entry.1 = entry.1.max(pending.token);
        }
        let writes: Vec<(&str, u64)> = scopes
            .iter()
            .filter(|(_, (previous, target, _))| target > previous)
            .map(|(scope, (_, target, _))| (*scope, *target))
            .collect();
        let failed = if writes.is_empty() {
            None
        } else {
            match self.persist(&writes, Write::Raise) {
                Ok(()) => {
                    self.shared.commits.fetch_add(1, Ordering::Relaxed);
                    for (scope, (previous, target, fence)) in &scopes {
                        if target > previous {
                            // Only batches write `current` upwards, under the writer
                            // lock, so it still holds `previous`.
                            let published = fence.current.fetch_max(*target, Ordering::AcqRel);
                            assert_eq!(
                                published, *previous,
                                "fence of scope {scope} changed from {previous} to {published} \
                                 under the writer lock"
                            );
                            tracing::debug!(scope, token = target, previous, "fence raised");
                        }
                    }
                    None
                }
                Err(err) => {
                    let cause = err.to_string();
                    tracing::warn!(raises = writes.len(), cause = %cause, "fence raise failed");
                    Some(cause)
                }
            }
        };

        let mut raised_by_someone: HashSet<&str> = HashSet::new();
        batch
            .iter()
            .map(|pending| {
                let scope = pending.scope.as_str();
                let (previous, target, _) = scopes[scope];
                let answer = match &failed {
                    // The write failed: every raise it carried fails; the fence is as it was.
                    Some(cause) if pending.token > previous => Err(AdvanceError::Storage {
                        scope: pending.scope.clone(),
                        token: pending.token,
                        cause: cause.clone(),
                    }),
                    Some(_) => {
                        Ok(settled(scope, pending.token, previous).unwrap_or(Advance::Unchanged))
                    }
                    // The first caller of the winning token is told it raised the fence;
                    // a second caller with the same token finds it equal.
                    None if pending.token == target
                        && target > previous
                        && raised_by_someone.insert(scope) =>
                    {
                        Ok(Advance::Raised { previous })
                    }
                    None => Ok(settled(scope, pending.token, previous.max(target))
                        .unwrap_or(Advance::Unchanged)),
                };
                (pending.ticket, answer)
            })
            .collect()
    }
}

/// The outcome of presenting `token` to a fence at `current`, if it needs no raise.
fn settled(scope: &str, token: u64, current: u64) -> Option<Advance> {
    match token.cmp(&current) {
        std::cmp::Ordering::Equal => {
            tracing::debug!(scope, token, "token equals fence");
            Some(Advance::Unchanged)
        }
        std::cmp::Ordering::Less => {
            tracing::debug!(scope, token, current, "stale token");
            Some(Advance::Stale { current })
        }
        std::cmp::Ordering::Greater => None,
    }
}

#[cfg(test)]
mod tests;
