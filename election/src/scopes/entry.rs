//! The raft entries of named leaderships, and what applying one gives.
//!
//! An entry is a normal raft entry whose data is [`ENTRY_PREFIX`] followed by the JSON of
//! a [`ScopeEntry`]. Only the leader proposes them (forwarded proposals stay limited to
//! membership and announce list changes); each carries the proposer's request number, so
//! that the API call waiting for it gets its outcome when it is applied.

use serde::{Deserialize, Serialize};

/// The prefix of a named-leaderships entry's data.
pub(crate) const ENTRY_PREFIX: &[u8] = b"palisade-scopes/1 ";

/// One change to the named-leaderships state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub(crate) enum Op {
    /// Open a session with a fresh id.
    Open {
        session: String,
        ttl_ms: u64,
        owner: Option<String>,
    },
    /// End a session (revoked by its client, or expired by the leader): release what it
    /// holds, leave what it waits for.
    Revoke { session: String, expired: bool },
    /// Hold `scope`, or wait for it.
    Campaign { session: String, scope: String },
    /// Let go of `scope`, or stop waiting for it.
    Resign { session: String, scope: String },
    /// Grant `scope` again to its holder `session`, with a token above `above` (a
    /// proxy's fence that was above the grant's token).
    Raise {
        session: String,
        scope: String,
        above: u64,
    },
    /// The leader of `term` (node `node_id`) serves its API at `url`: where followers
    /// forward the keepalives they receive.
    LeaderApi {
        node_id: u64,
        term: u64,
        url: String,
    },
}

/// A proposed entry: the operation and the number of the request waiting for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ScopeEntry {
    /// Chosen by the proposing leader; 0 when nobody waits for the outcome.
    pub req: u64,
    /// The change.
    #[serde(flatten)]
    pub op: Op,
}

impl ScopeEntry {
    /// The entry's data.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut data = ENTRY_PREFIX.to_vec();
        // Serialising strings and integers cannot fail.
        data.extend(serde_json::to_vec(self).unwrap_or_default());
        data
    }

    /// `None` when `data` is not a named-leaderships entry; an error when it is one that
    /// does not decode (then it is skipped on every node alike).
    pub(crate) fn decode(data: &[u8]) -> Option<Result<Self, String>> {
        let body = data.strip_prefix(ENTRY_PREFIX)?;
        Some(serde_json::from_slice(body).map_err(|e| e.to_string()))
    }
}

/// Why a named-leaderships change was applied and changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No live session has that id.
    UnknownSession,
    /// An open with an id already in use (ids are random: a retried proposal).
    SessionExists,
    /// [`super::limits::SESSIONS_MAX`].
    TooManySessions,
    /// [`super::limits::SCOPES_MAX`].
    TooManyScopes,
    /// [`super::limits::WAITERS_PER_SCOPE_MAX`].
    TooManyWaiters,
    /// [`super::limits::SCOPES_PER_SESSION_MAX`].
    SessionScopesFull,
}

/// What applying an entry did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The session is open.
    Opened,
    /// The session ended; it held these scopes.
    Revoked { released: Vec<String> },
    /// The session holds the scope with this token.
    Holding { token: u64 },
    /// The session waits for the scope.
    Waiting,
    /// The session let go of the scope (`released`), or only stopped waiting.
    Resigned { released: bool },
    /// A raise found the scope held by another session (or nobody): nothing changed.
    NotRaised,
    /// The leader's API URL is recorded.
    Noted,
    /// Nothing changed, for this reason.
    Refused(Refusal),
}
