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
//! One register must own the fence table of a database: two registers on the same file
//! would each trust their own memory, and the second would trip the paired assertion
//! that the fence never moves down.

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
}

/// The in-memory fence of one scope.
struct ScopeFence {
    /// The highest token known durable for this scope (0 before the first raise).
    /// Invariant: never decreases, and never exceeds the stored value; while
    /// `advance_lock` is free it equals the stored value.
    current: AtomicU64,
    /// Held across the read-check-write-read-back of a raise, so that two raises of the
    /// same scope cannot interleave between the check and the commit.
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
    /// Number of entries in `scopes`. Counted separately so that reserving a slot and
    /// checking the bound is one atomic step.
    scopes_len: AtomicUsize,
    /// Bound on `scopes_len` for new scopes; scopes loaded at open are kept even above it.
    scopes_max: usize,
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
        let scopes_len = AtomicUsize::new(scopes.len());
        tracing::debug!(scopes = scopes.len(), scopes_max, "fence register loaded");
        Ok(Self {
            shared: Arc::new(Shared {
                db,
                scopes,
                scopes_len,
                scopes_max,
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
        self.persist(scope, token)
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
    fn insert_scope(&self, scope: &str) -> Result<Arc<ScopeFence>, AdvanceError> {
        let shared = &self.shared;
        match shared.scopes.entry(scope.to_owned()) {
            Entry::Occupied(entry) => Ok(Arc::clone(entry.get())),
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
    fn persist(&self, scope: &str, token: u64) -> Result<(), redb::Error> {
        let db = &self.shared.db;
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        {
            let mut table = txn.open_table(FENCES)?;
            let stored = table.get(scope)?.map_or(0, |stored| stored.value());
            // Paired assertion, first half: the stored fence never moves down. Memory
            // equals disk under the lock, and redb latches its first I/O failure so a
            // half-finished earlier commit cannot leave disk ahead of memory here.
            assert!(
                token > stored,
                "fence of scope {scope} would move from {stored} down to {token}"
            );
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
mod tests {
    use super::*;
    use crate::open_database;
    use std::sync::mpsc;
    use std::time::Duration;

    /// How long a test waits for an advance that must not block.
    const NOT_BLOCKED_TIMEOUT_MS: u64 = 10_000;
    /// How long a test watches an advance that must block, to show that it does.
    const BLOCKED_WATCH_MS: u64 = 200;

    fn register(dir: &tempfile::TempDir, scopes_max: usize) -> FenceRegister {
        let db = open_database(&dir.path().join("fences.redb")).unwrap();
        FenceRegister::open(db, scopes_max).unwrap()
    }

    /// Goal: higher raises, equal is unchanged, lower is stale and reports the fence.
    /// Method: present 5, 5, 3, 9, 9, 1 to one scope and check each outcome and `current`.
    #[test]
    fn higher_raises_equal_is_unchanged_lower_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let fences = register(&dir, SCOPES_MAX_DEFAULT);
        assert_eq!(fences.current("orders"), 0);

        assert_eq!(
            fences.advance("orders", 5).unwrap(),
            Advance::Raised { previous: 0 }
        );
        assert_eq!(fences.current("orders"), 5);
        assert_eq!(fences.advance("orders", 5).unwrap(), Advance::Unchanged);
        assert_eq!(
            fences.advance("orders", 3).unwrap(),
            Advance::Stale { current: 5 }
        );
        assert_eq!(fences.current("orders"), 5);
        assert_eq!(
            fences.advance("orders", 9).unwrap(),
            Advance::Raised { previous: 5 }
        );
        assert_eq!(fences.advance("orders", 9).unwrap(), Advance::Unchanged);
        assert_eq!(
            fences.advance("orders", 1).unwrap(),
            Advance::Stale { current: 9 }
        );
        assert_eq!(fences.current("orders"), 9);
    }

    /// Goal: scopes are independent. Method: raise one scope, check another is untouched.
    #[test]
    fn scopes_are_independent() {
        let dir = tempfile::tempdir().unwrap();
        let fences = register(&dir, SCOPES_MAX_DEFAULT);
        fences.advance("a", 7).unwrap();
        assert_eq!(fences.current("b"), 0);
        assert_eq!(
            fences.advance("b", 2).unwrap(),
            Advance::Raised { previous: 0 }
        );
        assert_eq!(fences.current("a"), 7);
        assert_eq!(fences.current("b"), 2);
    }

    /// Goal: token 0 on an unseen scope is "equal" and creates nothing.
    /// Method: advance a new scope to 0, check the outcome and that `list` stays empty.
    #[test]
    fn token_zero_on_new_scope_is_unchanged_and_adds_no_scope() {
        let dir = tempfile::tempdir().unwrap();
        let fences = register(&dir, 1);
        assert_eq!(fences.advance("new", 0).unwrap(), Advance::Unchanged);
        assert!(fences.list().is_empty());
        // The one allowed scope is still free.
        assert_eq!(
            fences.advance("other", 1).unwrap(),
            Advance::Raised { previous: 0 }
        );
    }

    /// Goal: a raised fence is on disk, not only in memory.
    /// Method: raise two scopes, drop every handle, reopen the file, read the fences.
    #[test]
    fn fence_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let fences = register(&dir, SCOPES_MAX_DEFAULT);
            fences.advance("orders", 41).unwrap();
            fences.advance("orders", 42).unwrap();
            fences.advance("users", 3).unwrap();
            assert_eq!(
                fences.advance("users", 2).unwrap(),
                Advance::Stale { current: 3 }
            );
        }
        let fences = register(&dir, SCOPES_MAX_DEFAULT);
        assert_eq!(fences.current("orders"), 42);
        assert_eq!(fences.current("users"), 3);
        assert_eq!(
            fences.advance("orders", 42).unwrap(),
            Advance::Unchanged,
            "the reopened fence is the last raise"
        );
        assert_eq!(
            fences.advance("orders", 43).unwrap(),
            Advance::Raised { previous: 42 }
        );
    }

    /// Goal: new scopes beyond `scopes_max` are refused, while existing scopes keep
    /// working, also after a reopen. Method: limit 2, add two scopes, try a third.
    #[test]
    fn new_scope_over_limit_is_refused_and_existing_scopes_still_rise() {
        let dir = tempfile::tempdir().unwrap();
        {
            let fences = register(&dir, 2);
            fences.advance("a", 1).unwrap();
            fences.advance("b", 1).unwrap();
            let err = fences.advance("c", 1).unwrap_err();
            assert!(
                matches!(err, AdvanceError::ScopeLimit { ref scope, scopes_max: 2 } if scope == "c"),
                "{err:?}"
            );
            assert_eq!(
                err.to_string(),
                "scope limit reached: 2 scopes exist, cannot add c"
            );
            assert_eq!(fences.current("c"), 0);
            assert_eq!(
                fences.advance("a", 2).unwrap(),
                Advance::Raised { previous: 1 }
            );
        }
        // Scopes loaded from disk count against the limit.
        let fences = register(&dir, 2);
        assert!(matches!(
            fences.advance("c", 1),
            Err(AdvanceError::ScopeLimit { .. })
        ));
        assert_eq!(
            fences.list(),
            vec![("a".to_owned(), 2), ("b".to_owned(), 1)]
        );
    }

    /// Goal: `list` returns every raised scope, sorted by scope.
    /// Method: raise scopes out of order, compare with the sorted expectation.
    #[test]
    fn list_is_sorted_by_scope() {
        let dir = tempfile::tempdir().unwrap();
        let fences = register(&dir, SCOPES_MAX_DEFAULT);
        for (scope, token) in [("m", 3), ("z", 1), ("a", 9), ("k", 4)] {
            fences.advance(scope, token).unwrap();
        }
        assert_eq!(
            fences.list(),
            vec![
                ("a".to_owned(), 9),
                ("k".to_owned(), 4),
                ("m".to_owned(), 3),
                ("z".to_owned(), 1),
            ]
        );
    }

    /// Goal: equal and lower tokens and reads never touch redb, while a raise does.
    /// Method: hold redb's only write transaction open, so any advance that writes must
    /// block. Equal, lower and `current` must finish anyway; a raise must not finish until
    /// the transaction is dropped (this half shows the method can detect disk access).
    #[test]
    fn equal_and_lower_tokens_do_no_disk_io() {
        let dir = tempfile::tempdir().unwrap();
        let db = open_database(&dir.path().join("fences.redb")).unwrap();
        let fences = FenceRegister::open(Arc::clone(&db), SCOPES_MAX_DEFAULT).unwrap();
        fences.advance("orders", 10).unwrap();

        let writer = db.begin_write().unwrap();
        let (done_tx, done_rx) = mpsc::channel();
        let probe = fences.clone();
        let memory_only = std::thread::spawn(move || {
            let outcomes = (
                probe.advance("orders", 10).unwrap(),
                probe.advance("orders", 4).unwrap(),
                probe.current("orders"),
            );
            done_tx.send(outcomes).unwrap();
        });
        let outcomes = done_rx
            .recv_timeout(Duration::from_millis(NOT_BLOCKED_TIMEOUT_MS))
            .expect("equal/lower advance blocked on the redb writer: it touched the disk");
        assert_eq!(
            outcomes,
            (Advance::Unchanged, Advance::Stale { current: 10 }, 10)
        );
        memory_only.join().unwrap();

        let (raised_tx, raised_rx) = mpsc::channel();
        let probe = fences.clone();
        let raising = std::thread::spawn(move || {
            raised_tx
                .send(probe.advance("orders", 11).unwrap())
                .unwrap();
        });
        assert!(
            raised_rx
                .recv_timeout(Duration::from_millis(BLOCKED_WATCH_MS))
                .is_err(),
            "a raise finished while redb's writer was held: it did not write"
        );
        // Until the raise is durable, readers still see the old fence.
        assert_eq!(fences.current("orders"), 10);
        drop(writer);
        assert_eq!(
            raised_rx
                .recv_timeout(Duration::from_millis(NOT_BLOCKED_TIMEOUT_MS))
                .unwrap(),
            Advance::Raised { previous: 10 }
        );
        raising.join().unwrap();
        assert_eq!(fences.current("orders"), 11);
    }

    /// Goal: concurrent raises of one scope each see a consistent previous fence and the
    /// result is the maximum. Method: several threads raise the same scope with
    /// interleaved tokens; every `Raised { previous }` must be below its token, and the
    /// final fence must be the highest token.
    #[test]
    fn concurrent_raises_of_one_scope_end_at_the_maximum() {
        const THREADS: u64 = 4;
        const TOKENS_PER_THREAD: u64 = 8;
        let dir = tempfile::tempdir().unwrap();
        let fences = register(&dir, SCOPES_MAX_DEFAULT);
        std::thread::scope(|threads| {
            for thread in 0..THREADS {
                let fences = &fences;
                threads.spawn(move || {
                    for step in 0..TOKENS_PER_THREAD {
                        let token = step * THREADS + thread + 1;
                        match fences.advance("shared", token).unwrap() {
                            Advance::Raised { previous } => assert!(previous < token),
                            Advance::Stale { current } => assert!(current > token),
                            Advance::Unchanged => panic!("tokens are distinct"),
                        }
                    }
                });
            }
        });
        assert_eq!(fences.current("shared"), THREADS * TOKENS_PER_THREAD);
    }

    /// Goal: a register opened on a file without the fence table starts empty and creates
    /// the table on the first raise. Method: a bare `redb::Database`, not `open_database`.
    #[test]
    fn open_without_fence_table_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bare.redb");
        let db = Arc::new(redb::Database::create(&path).unwrap());
        let fences = FenceRegister::open(db, SCOPES_MAX_DEFAULT).unwrap();
        assert!(fences.list().is_empty());
        assert_eq!(
            fences.advance("s", 1).unwrap(),
            Advance::Raised { previous: 0 }
        );
    }
}
