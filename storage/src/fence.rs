//! The fence register: per scope, the highest fencing token admitted so far.

use std::sync::Arc;

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

/// Scope to highest admitted token. Cheap to clone; shared by all tasks.
#[derive(Clone)]
pub struct FenceRegister {
    _db: Arc<redb::Database>,
}

impl FenceRegister {
    /// Loads every scope from `db` into memory. `scopes_max` bounds new scopes.
    pub fn open(db: Arc<redb::Database>, scopes_max: usize) -> Result<Self, crate::OpenError> {
        let _ = (db, scopes_max);
        todo!("helper S")
    }

    /// The fence of `scope` (0 when never seen). Memory only: no disk I/O, no global lock.
    pub fn current(&self, scope: &str) -> u64 {
        let _ = scope;
        todo!("helper S")
    }

    /// Moves the fence of `scope` up to `token` if it is higher. Blocking: when the fence
    /// rises the new value is committed with `Durability::Immediate` (fsynced) before
    /// this returns. Equal and lower tokens do no disk I/O.
    pub fn advance(&self, scope: &str, token: u64) -> Result<Advance, AdvanceError> {
        let _ = (scope, token);
        todo!("helper S")
    }

    /// Every scope and its fence, sorted by scope.
    pub fn list(&self) -> Vec<(String, u64)> {
        todo!("helper S")
    }
}
