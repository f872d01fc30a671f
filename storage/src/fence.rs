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
//! # Concurrency
//! Reads come from memory: one shard read of a [`DashMap`] and an atomic load, with no
//! global lock and no disk I/O. Raises of one scope are serialised by that scope's own
//! lock; raises of different scopes only meet in redb's single writer.
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

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

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
    /// value; while `advance_lock` is free it equals the stored value.
    current: AtomicU64,
    /// Held across the read-check-write-read-back of a raise or a reset, so that two
    /// changes of the same scope cannot interleave between the check and the commit.
    advance_lock: Mutex<()>,
}

impl ScopeFence {
    fn new(current: u64) -> Self {
        Self {
            current: AtomicU64::new(current),
            advance_lock: Mutex::new(()),
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
    /// always remains the scope's one fence.
    scopes: DashMap<String, Arc<ScopeFence>>,
    /// Number of entries in `scopes` that are not reserved. Counted separately so that
    /// reserving a slot and checking the bound is one atomic step.
    scopes_len: AtomicUsize,
    /// Bound on `scopes_len` for new scopes; scopes loaded at open are kept even above it.
    scopes_max: usize,
    /// Scopes that are always available and not counted in `scopes_len`.
    reserved: HashSet<String>,
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
        let scopes = DashMap::new();
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
    /// this returns. Equal and lower tokens do no disk I/O.
    pub fn advance(&self, scope: &str, token: u64) -> Result<Advance, AdvanceError> {
        // Clone the Arc out so that no map guard is held across the lock or the disk.
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

        // The mutex guards no data, only the sequence below, and a panic inside it leaves
        // memory and disk as they were: taking a poisoned lock is safe.
        let _raising = fence
            .advance_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Another caller may have raised the fence while this one waited for the lock.
        let previous = fence.load();
        if let Some(outcome) = settled(scope, token, previous) {
            return Ok(outcome);
        }
        self.persist(scope, token, Write::Raise)
            .map_err(|err| AdvanceError::Storage {
                scope: scope.to_owned(),
                token,
                cause: err.to_string(),
            })
            .inspect_err(|err| tracing::warn!(scope, token, cause = %err, "fence raise failed"))?;
        // Only raises write `current`, and they hold the lock, so it still holds `previous`.
        let published = fence.current.fetch_max(token, Ordering::AcqRel);
        assert_eq!(
            published, previous,
            "fence of scope {scope} changed from {previous} to {published} under its lock"
        );
        tracing::debug!(scope, token, previous, "fence raised");
        Ok(Advance::Raised { previous })
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
        // As in `advance`, the mutex only orders the sequence below.
        let _resetting = fence
            .advance_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let previous = fence.load();
        if previous == token {
            return Ok(previous);
        }
        self.persist(scope, token, Write::Reset)
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

    /// Commits `token` as the fence of `scope`, fsynced, and reads it back.
    /// The caller holds the scope's `advance_lock` and has checked `token` against memory.
    fn persist(&self, scope: &str, token: u64, write: Write) -> Result<(), redb::Error> {
        let db = &self.shared.db;
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        {
            let mut table = txn.open_table(FENCES)?;
            let stored = table.get(scope)?.map_or(0, |stored| stored.value());
            // Paired assertion, first half: a raise never moves the stored fence down
            // (only a reset may). Memory equals disk under the lock, and redb latches its
            // first I/O failure so a half-finished earlier commit cannot leave disk ahead
            // of memory here.
            if write == Write::Raise {
                assert!(
                    token > stored,
                    "fence of scope {scope} would move from {stored} down to {token}"
                );
            }
            table.insert(scope, token)?;
        }
        // Dropping `txn` on an early return above aborts it: nothing reaches the disk.
        txn.commit()?;

        // Paired assertion, second half: what a fresh reader sees is what was committed.
        let txn = db.begin_read()?;
        let read_back = txn
            .open_table(FENCES)?
            .get(scope)?
            .map(|stored| stored.value());
        assert_eq!(
            read_back,
            Some(token),
            "fence of scope {scope} read back wrong after commit"
        );
        Ok(())
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
