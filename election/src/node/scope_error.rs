//! [`ScopeError`]: why a call of the named-leaderships service
//! ([`ScopesService`](super::ScopesService)) was not carried out. Its text is the detail
//! of the problem the node API answers; the API picks the status and kind.

use palisade_protocol::scopes::{SESSION_TTL_MS_MAX, SESSION_TTL_MS_MIN};

use super::scopes::ScopeCallError;
use crate::scopes::Refusal;
use crate::scopes::limits::{
    KEEPALIVE_INTERVAL_MS_MIN, SCOPES_MAX, SCOPES_PER_SESSION_MAX, SESSIONS_MAX,
    WAITERS_PER_SCOPE_MAX,
};

/// Why a named-leaderships call was not carried out. Its text is the detail of the
/// problem the node API answers for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// The cluster runs fleet leases (`--lease-ms`) and grants no named scopes.
    #[error(
        "this cluster runs fleet leases (--lease-ms): it grants no named scopes; run named \
         leaderships on a cluster that announces to its proxies"
    )]
    Unavailable,
    /// A TTL outside [`SESSION_TTL_MS_MIN`]`..=`[`SESSION_TTL_MS_MAX`].
    #[error("ttl_ms {ttl_ms} is outside {SESSION_TTL_MS_MIN}..={SESSION_TTL_MS_MAX}")]
    BadTtl {
        /// The TTL asked for.
        ttl_ms: u64,
    },
    /// Not a scope name.
    #[error("{cause}")]
    BadScope {
        /// Why not.
        cause: String,
    },
    /// The cluster's own scope (`--scope`), which nobody campaigns for.
    #[error(
        "scope {scope} is this cluster's own (--scope): its token is the raft leader's term \
         and nobody campaigns for it"
    )]
    ClusterScope {
        /// The scope named.
        scope: String,
    },
    /// This node is not the established leader; ask `leader_id` (the leader it knows).
    #[error("this node is not the established leader; ask the leader_id named here")]
    NotLeader {
        /// The leader this node knows, if any.
        leader_id: Option<u64>,
    },
    /// Leadership moved before the change was applied; it may still apply.
    #[error(
        "leadership moved before the change was applied; it may still apply: check with the \
         new leader before asking again"
    )]
    Lost,
    /// raft refused the proposal.
    #[error("raft refused the change: {0}")]
    Refused(String),
    /// The node is stopping.
    #[error("the node is stopping")]
    Stopped,
    /// The change was applied and changed nothing, for this reason.
    #[error("{}", refusal_detail(*refusal, session))]
    Refusal {
        /// Why.
        refusal: Refusal,
        /// The session of the change.
        session: String,
    },
    /// No live session has that id: never opened, revoked or expired.
    #[error("no live session {session}: never opened, revoked or expired")]
    UnknownSession {
        /// The id asked for.
        session: String,
    },
    /// The session belongs to another identity.
    #[error("session {session} belongs to {owner}; only that identity may use it")]
    SessionOwner {
        /// The session.
        session: String,
        /// The identity that opened it.
        owner: String,
    },
    /// Keepalives of this session come closer together than
    /// [`KEEPALIVE_INTERVAL_MS_MIN`].
    #[error(
        "keepalives for session {session} come faster than one per {KEEPALIVE_INTERVAL_MS_MIN} ms"
    )]
    KeepaliveTooFast {
        /// The session.
        session: String,
    },
    /// The campaign's timeout passed while the session still waited; it no longer waits.
    #[error(
        "{scope} stayed held by another session for {waited_ms} ms; session {session} no \
         longer waits for it"
    )]
    CampaignTimeout {
        /// The scope.
        scope: String,
        /// The session.
        session: String,
        /// The timeout, in milliseconds.
        waited_ms: u64,
    },
    /// The session holds the scope, but not every announce proxy fences it yet; it keeps
    /// the scope: campaign again for the grant.
    #[error(
        "session {session} holds {scope}, but not every announce proxy fences it yet (see \
         GET /); campaign again for the grant once they do"
    )]
    FencePending {
        /// The scope.
        scope: String,
        /// The session.
        session: String,
    },
    /// An outcome that does not belong to the change (a broken invariant).
    #[error("unexpected outcome {0}")]
    Unexpected(String),
}

/// Why an applied change changed nothing, in words.
fn refusal_detail(refusal: Refusal, session: &str) -> String {
    match refusal {
        Refusal::UnknownSession => {
            format!("no live session {session}: never opened, revoked or expired")
        }
        Refusal::SessionExists => "a session id collided; ask again".to_owned(),
        Refusal::TooManySessions => {
            format!("the cluster holds {SESSIONS_MAX} sessions, its limit")
        }
        Refusal::TooManyScopes => {
            format!("the cluster holds {SCOPES_MAX} scopes held or waited for, its limit")
        }
        Refusal::TooManyWaiters => {
            format!("{WAITERS_PER_SCOPE_MAX} sessions wait for this scope already, its limit")
        }
        Refusal::SessionScopesFull => format!(
            "session {session} holds or waits for {SCOPES_PER_SESSION_MAX} scopes, its limit"
        ),
    }
}

impl From<ScopeCallError> for ScopeError {
    fn from(err: ScopeCallError) -> Self {
        match err {
            ScopeCallError::NotLeader { leader_id } => Self::NotLeader { leader_id },
            ScopeCallError::Refused(cause) => Self::Refused(cause),
            ScopeCallError::Lost => Self::Lost,
            ScopeCallError::Stopped => Self::Stopped,
        }
    }
}
