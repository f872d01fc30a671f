//! What a node knows about leadership, published on a `tokio::sync::watch` after every
//! cycle of the election loop.

use serde::{Deserialize, Serialize};

pub use palisade_protocol::Role;

/// The API role of a raft state: raft's pre-candidate is reported as `candidate`, since
/// both campaign.
pub(crate) fn role_of(state: raft::StateRole) -> Role {
    match state {
        raft::StateRole::Follower => Role::Follower,
        raft::StateRole::Candidate | raft::StateRole::PreCandidate => Role::Candidate,
        raft::StateRole::Leader => Role::Leader,
    }
}

/// One node's view of leadership.
///
/// Invariants (kept by the election loop, the only writer):
/// - `token` is `Some(term)` only while this node is the leader of `term`, has applied an
///   entry of `term` (it is *established*), and is not transferring leadership;
/// - `announced` is true only while `token` is `Some`, and only once every configured proxy
///   accepted the token (at once when none is configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leadership {
    /// The node's current raft term; never decreases, across restarts too.
    pub term: u64,
    /// The leader this node knows for `term`, if any.
    pub leader_id: Option<u64>,
    /// This node's role.
    pub role: Role,
    /// The fencing token this node may use: its term while it is the established leader.
    pub token: Option<u64>,
    /// Whether every configured proxy accepted `token`.
    pub announced: bool,
}

impl Default for Leadership {
    fn default() -> Self {
        Self {
            term: 0,
            leader_id: None,
            role: Role::Follower,
            token: None,
            announced: false,
        }
    }
}
