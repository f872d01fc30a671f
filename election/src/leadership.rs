//! What a node knows about leadership, published on a `tokio::sync::watch` after every
//! cycle of the election loop.

use serde::{Deserialize, Serialize};

/// A node's raft role, as the API reports it. raft's pre-candidate is reported as
/// `candidate`: both are campaigning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Follows a leader, or waits for one.
    Follower,
    /// Campaigning (pre-vote or vote).
    Candidate,
    /// The raft leader of `term`; a fencing token only once established.
    Leader,
}

impl Role {
    /// The API spelling: `leader`, `follower` or `candidate`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Leader => "leader",
        }
    }
}

impl From<raft::StateRole> for Role {
    fn from(state: raft::StateRole) -> Self {
        match state {
            raft::StateRole::Follower => Role::Follower,
            raft::StateRole::Candidate | raft::StateRole::PreCandidate => Role::Candidate,
            raft::StateRole::Leader => Role::Leader,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
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
