//! [`ClientError`]: every way a Palisade client call can fail, with the numbers.

use http::{Method, StatusCode};
use palisade_protocol::Problem;

/// Why a client call failed. The variants that matter to a worker are
/// [`Fenced`](Self::Fenced) and [`NotLeader`](Self::NotLeader) (stop working: someone else
/// leads) and [`Indeterminate`](Self::Indeterminate) (the write may or may not have been
/// applied: check before doing anything that assumes either).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// A base URL that this client cannot use.
    #[error("invalid URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A request that cannot be sent as built: a bad path, header or scope name.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A background task was asked for outside a tokio runtime.
    #[error("no tokio runtime: {0}")]
    NoRuntime(String),
    /// The token source says this process is not the established leader, so the request
    /// was refused locally and nothing was sent.
    #[error(
        "not the established leader (term {term}, leader {}): request not sent",
        leader_name(*.leader_id)
    )]
    NotLeader {
        /// The raft term the source last knew.
        term: u64,
        /// The leader the source last knew, if any.
        leader_id: Option<u64>,
    },
    /// The proxy rejected the token as stale: a newer leader has written (or fenced) this
    /// scope. The token source has been marked "not leader"; the request was not applied.
    #[error("stale fencing token {presented} for scope {scope}: current is {current}")]
    Fenced {
        /// The scope.
        scope: String,
        /// The token this request carried.
        presented: u64,
        /// The scope's fence at the proxy.
        current: u64,
    },
    /// No answer in time, or the connection broke after the request was sent: the request
    /// may or may not have been applied. Not a failure: an unknown outcome.
    #[error(
        "outcome unknown for {method} after {attempts} attempt(s): {reason}; it may have been applied"
    )]
    Indeterminate {
        /// The request's method.
        method: Method,
        /// Attempts made.
        attempts: u32,
        /// What happened on the last attempt.
        reason: String,
    },
    /// No connection could be made: nothing was sent.
    #[error("cannot reach {url} after {attempts} attempt(s): {reason}")]
    Unreachable {
        /// Where.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The connect error.
        reason: String,
    },
    /// The TLS handshake failed (a server certificate the client does not trust, a name
    /// mismatch), or the TLS settings could not be loaded: nothing was sent. Trust the
    /// server's CA with [`ClientTls::trust_pem_file`](crate::ClientTls::trust_pem_file).
    #[error("TLS error with {url}: {reason}")]
    Tls {
        /// Where (a URL, or the file of a certificate that could not be loaded).
        url: String,
        /// What rustls reported.
        reason: String,
    },
    /// An HTTP error answer other than a fencing rejection (400, 404, 428, 503, ...).
    #[error("{status}: {detail}")]
    Status {
        /// The status.
        status: StatusCode,
        /// The problem's `detail`, or the body's text.
        detail: String,
        /// The whole problem+json body, when the answer had one.
        problem: Option<Box<Problem>>,
    },
    /// An answer this client cannot use (too large, not the expected JSON).
    #[error("bad response: {0}")]
    InvalidResponse(String),
    /// A node that is not the raft leader refused a call only the leader answers (open a
    /// session, keep it alive, campaign, resign): 503 `not-leader`. Ask the node it names.
    #[error(
        "node {url} (id {}) is not the leader: the leader it knows is {}",
        leader_name(*.node_id),
        leader_name(*.leader_id)
    )]
    NodeNotLeader {
        /// The node asked.
        url: String,
        /// Its raft id, when it said.
        node_id: Option<u64>,
        /// The leader it knows, if any.
        leader_id: Option<u64>,
    },
    /// The cluster has no live session with this id (404 `unknown-session`): never
    /// opened, revoked, or expired because no keepalive reached the leader within its TTL.
    #[error("unknown session {id}: never opened, revoked or expired")]
    UnknownSession {
        /// The session's id.
        id: String,
    },
    /// The session can no longer be trusted (see [`Session`](crate::Session)): whatever
    /// it held may already be someone else's. Nothing was sent.
    #[error("session {id} is lost: {cause}")]
    SessionLost {
        /// The session's id.
        id: String,
        /// Why: the keepalives went unanswered past the session's trust, or the leader
        /// no longer knows it.
        cause: String,
    },
}

impl ClientError {
    /// Whether the error is a fencing rejection or a local "not leader" refusal: the
    /// caller has lost (or never had) the leadership and should stop writing.
    pub fn is_leadership_lost(&self) -> bool {
        matches!(
            self,
            Self::Fenced { .. } | Self::NotLeader { .. } | Self::SessionLost { .. }
        )
    }

    /// The problem kind of an error answer (`campaign-timeout`, `fence-pending`, ...):
    /// the last segment of its problem+json `type`. The typed answers carry theirs too:
    /// `stale-token`, `not-leader`, `unknown-session`.
    pub fn problem_kind(&self) -> Option<&str> {
        match self {
            Self::Status { problem, .. } => problem.as_deref().map(Problem::kind),
            Self::Fenced { .. } => Some(palisade_protocol::problem::kind::STALE_TOKEN),
            Self::NodeNotLeader { .. } => Some(palisade_protocol::lease::NOT_LEADER),
            Self::UnknownSession { .. } => Some(palisade_protocol::problem::kind::UNKNOWN_SESSION),
            _ => None,
        }
    }

    /// Whether the outcome of the request is unknown.
    pub fn is_indeterminate(&self) -> bool {
        matches!(self, Self::Indeterminate { .. })
    }

    /// The problem+json body of a [`Status`](Self::Status) error, when it had one.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Self::Status { problem, .. } => problem.as_deref(),
            _ => None,
        }
    }

    /// The HTTP status, for [`Status`](Self::Status) errors.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Status { status, .. } => Some(*status),
            Self::Fenced { .. } => Some(StatusCode::CONFLICT),
            Self::NodeNotLeader { .. } => Some(StatusCode::SERVICE_UNAVAILABLE),
            Self::UnknownSession { .. } => Some(StatusCode::NOT_FOUND),
            _ => None,
        }
    }
}

fn leader_name(leader_id: Option<u64>) -> String {
    leader_id.map_or_else(|| "unknown".to_owned(), |id| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: error messages carry the numbers a reader needs. Method: format examples.
    #[test]
    fn messages_carry_the_numbers() {
        let fenced = ClientError::Fenced {
            scope: "billing".into(),
            presented: 3,
            current: 5,
        };
        assert_eq!(
            fenced.to_string(),
            "stale fencing token 3 for scope billing: current is 5"
        );
        assert!(fenced.is_leadership_lost());
        let not_leader = ClientError::NotLeader {
            term: 7,
            leader_id: Some(2),
        };
        assert_eq!(
            not_leader.to_string(),
            "not the established leader (term 7, leader 2): request not sent"
        );
        let unknown = ClientError::NotLeader {
            term: 7,
            leader_id: None,
        };
        assert!(unknown.to_string().contains("leader unknown"));
        let moved = ClientError::NodeNotLeader {
            url: "http://127.0.0.1:7001".into(),
            node_id: Some(1),
            leader_id: Some(3),
        };
        assert_eq!(
            moved.to_string(),
            "node http://127.0.0.1:7001 (id 1) is not the leader: the leader it knows is 3"
        );
        assert_eq!(moved.problem_kind(), Some("not-leader"));
        assert!(
            !moved.is_leadership_lost(),
            "the caller's own leadership is not at stake"
        );
        let lost = ClientError::SessionLost {
            id: "s1".into(),
            cause: "no keepalive answered".into(),
        };
        assert!(lost.is_leadership_lost());
    }
}
