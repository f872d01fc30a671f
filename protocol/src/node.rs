//! The node API: paths, request bodies and answers.
//!
//! - `GET /v1/leader` -> [`LeaderView`]; with [`LongPoll`] parameters a long poll.
//! - `POST /v1/transfer` with [`TransferRequest`] -> [`Transferred`].
//! - `POST /v1/resign` -> [`Transferred`].
//! - `GET /metrics`, `GET /healthz` -> [`Health`].
//! - `GET|POST /v1/test/faults` with [`FaultSpec`]: only on nodes started with
//!   [`crate::process::TEST_FAULTS_ENV`]` = 1`.
//! - `GET /v1/announce` -> [`AnnounceList`]; `POST /v1/announce` with [`AnnounceChange`]
//!   replaces the cluster's `--announce` proxy list through raft, after retiring the fence
//!   of every proxy it removes -> [`AnnounceChanged`].
//! - `GET /v1/members` -> [`MemberList`]; `POST /v1/members` with [`MemberAdd`] (the
//!   member joins as a learner) and `DELETE /v1/members/{id}` with an optional
//!   [`MemberRemove`] -> [`MemberList`] once the change is applied on that node.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::scope::Scope;

/// This node's view of leadership.
pub const LEADER_PATH: &str = "/v1/leader";
/// Leadership transfer to a named node.
pub const TRANSFER_PATH: &str = "/v1/transfer";
/// Leadership transfer to the best other node.
pub const RESIGN_PATH: &str = "/v1/resign";
/// Test faults on the peer links (test builds of the cluster only).
pub const TEST_FAULTS_PATH: &str = "/v1/test/faults";
/// The cluster's members: list (`GET`) and add (`POST`).
pub const MEMBERS_PATH: &str = "/v1/members";
/// The cluster's `--announce` proxy list: read (`GET`) and replace (`POST`).
pub const ANNOUNCE_PATH: &str = "/v1/announce";
/// One member, by id: remove (`DELETE /v1/members/{id}`).
pub const MEMBER_PATH: &str = "/v1/members/{id}";

/// A node's raft role. raft's pre-candidate is reported as `candidate`: both campaign.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Follows a leader, or waits for one.
    Follower,
    /// Campaigning (pre-vote or vote).
    Candidate,
    /// The raft leader of its term; holds a fencing token only once established.
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

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `GET /v1/leader`: one node's view of leadership.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaderView {
    /// This node's raft id.
    pub node_id: u64,
    /// The fencing scope the cluster's token is for.
    pub scope: Scope,
    /// This node's current raft term.
    pub term: u64,
    /// The leader this node knows, `null` when none.
    pub leader_id: Option<u64>,
    /// This node's role.
    pub role: Role,
    /// The fencing token: non-null only on the established leader.
    pub token: Option<u64>,
    /// Whether every `--announce` proxy accepted `token`.
    pub announced: bool,
    /// The token's proof (base64url Ed25519 signature over
    /// [`crate::proof::proof_message`]): non-null exactly when `token` is and the node
    /// holds the cluster's signing key. Clients send it as `Fencing-Token-Proof`.
    #[serde(default)]
    pub proof: Option<String>,
    /// The lease duration this node grants (`--lease-ms`); absent when it grants none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// With leases on: whether this node's established term is released as `token`
    /// (every proxy accepted it, or the release wait passed). Absent with leases off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<bool>,
    /// With a score oracle (the default, `static`): the scores this node knows and
    /// considers fresh, its own included, by node id (`{"1": 20.0, "2": 10.5}`); higher
    /// is better. Absent with `--score-oracle off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scores: Option<BTreeMap<String, f64>>,
    /// With a score oracle: its name (`static`, `storage-rtt`, `consensus-latency`,
    /// `rotating`). Absent with `--score-oracle off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_oracle: Option<String>,
}

/// The query of a long poll on `GET /v1/leader`: answer once the term exceeds
/// `after_term` or the view changes in any other way, or after `timeout_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LongPoll {
    /// Answer once the term is above this (default: the current term).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_term: Option<u64>,
    /// Longest wait in milliseconds (capped by the server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl LongPoll {
    /// Whether this asks for a long poll at all (either parameter given).
    pub fn is_poll(&self) -> bool {
        self.after_term.is_some() || self.timeout_ms.is_some()
    }

    /// The query string (without `?`), empty when no parameter is set.
    pub fn to_query(&self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = self.after_term {
            parts.push(format!("after_term={t}"));
        }
        if let Some(t) = self.timeout_ms {
            parts.push(format!("timeout_ms={t}"));
        }
        parts.join("&")
    }
}

/// `POST /v1/transfer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferRequest {
    /// The node to hand leadership to.
    pub to: u64,
}

/// A completed leadership transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transferred {
    /// The leader when the transfer started.
    pub from: u64,
    /// The new leader.
    pub to: u64,
    /// The new leader's term (higher than the old one).
    pub term: u64,
}

/// `GET /healthz`: the process serves and its main loop runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `ok`; `degraded` when the process serves but cannot do its whole job for a reason
    /// an operator must fix (a fleet proxy whose cluster grants it no lease): `detail`
    /// says which.
    pub status: String,
    /// The node's id, on a node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<u64>,
    /// What is wrong, when `status` is `degraded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Health {
    /// A healthy answer.
    pub fn ok(node_id: Option<u64>) -> Self {
        Self {
            status: "ok".to_owned(),
            node_id,
            detail: None,
        }
    }

    /// A process that serves but cannot do its whole job, and why.
    pub fn degraded(node_id: Option<u64>, detail: String) -> Self {
        Self {
            status: "degraded".to_owned(),
            node_id,
            detail: Some(detail),
        }
    }
}

/// The test faults of one node's peer links: `{"drop":[2,3],"delay_ms":{"2":200}}`.
/// A `POST` replaces them all; `{}` heals every link.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultSpec {
    /// Peers cut off both ways: sends to them and receipts from them are discarded.
    pub drop: BTreeSet<u64>,
    /// Extra latency in milliseconds of what this node sends to each peer.
    pub delay_ms: BTreeMap<u64, u64>,
}

impl FaultSpec {
    /// Whether nothing is injected.
    pub fn is_empty(&self) -> bool {
        self.drop.is_empty() && self.delay_ms.values().all(|&d| d == 0)
    }
}

/// One member of the cluster, as `GET /v1/members` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its raft id (never reused once removed).
    pub id: u64,
    /// Its peer address, `HOST:PORT`, where the other members reach it.
    pub peer: String,
    /// Whether it votes now; `false` for a learner (a new member that has not caught up
    /// yet), or while a joint configuration left by an older version still adds it.
    /// Absent in older answers: then it is a voter.
    #[serde(default = "default_true")]
    pub voter: bool,
    /// Its raft role: `voter`, or `learner` (it receives the log but does not vote; the
    /// leader promotes it once it has caught up). Absent in older answers, and on a node
    /// that is still joining and has not received the configuration yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<MemberRole>,
}

/// A member's raft role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberRole {
    /// Votes in elections and counts in every quorum.
    Voter,
    /// Receives the log but neither votes nor counts in a quorum: every new member starts
    /// as one, so an unreachable new member can never cost the cluster its quorum.
    Learner,
}

impl MemberRole {
    /// The API spelling: `voter` or `learner`.
    pub fn as_str(self) -> &'static str {
        match self {
            MemberRole::Voter => "voter",
            MemberRole::Learner => "learner",
        }
    }
}

impl fmt::Display for MemberRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn default_true() -> bool {
    true
}

/// `GET /v1/members`: `{"members":[{"id":1,"peer":"127.0.0.1:7001"}, ...]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberList {
    /// The current members, by id.
    pub members: Vec<Member>,
    /// Ids that were removed; they are never accepted again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<u64>,
    /// The raft index of the last membership change this node applied (0: the initial
    /// membership).
    #[serde(default)]
    pub index: u64,
    /// Whether a change is under way: the cluster is in a joint configuration (old and new
    /// voters must both agree) until its leader leaves it. Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub joint: bool,
}

/// `GET /v1/announce`, and the body of `POST /v1/announce`: the admin base URLs of the
/// proxies the leader fences on election.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnnounceList {
    /// Entries `URL` or `NAME=URL` (see [`crate::announce`]): proxies' admin base URLs.
    pub proxies: Vec<String>,
}

/// The body of `POST /v1/announce`: the new list, and whether to remove proxies whose
/// fence could not be retired.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnnounceChange {
    /// The new list: entries `URL` or `NAME=URL` (see [`crate::announce`]).
    pub proxies: Vec<String>,
    /// Remove a proxy even when its fence could not be retired (it then keeps admitting
    /// the last token it accepted and any higher one). Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

/// The answer to `POST /v1/announce`: the list this node applied, and what became of
/// each proxy the change removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnnounceChanged {
    /// The list now, in normal form.
    pub proxies: Vec<String>,
    /// The proxies the change removed, in the order the old list named them.
    #[serde(default)]
    pub removed: Vec<RemovedProxy>,
}

/// A proxy a `POST /v1/announce` removed from the list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemovedProxy {
    /// Its entry as the old list named it.
    pub proxy: String,
    /// Whether its fence was raised to [`crate::announce::RETIRED_FENCE`] before the
    /// change was proposed (false only with `force`).
    pub retired: bool,
    /// Why it was not retired, when it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST /v1/members`: add a member. It joins as a learner and the leader promotes it to
/// voter once it has caught up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberAdd {
    /// The new member's id: not a member now, and never removed before.
    pub id: u64,
    /// Its peer address, `HOST:PORT`.
    pub peer: String,
}

/// The optional body of `DELETE /v1/members/{id}`: `{"force":true}` removes a voter even
/// when fewer than three voters would remain (one more failure then stops the cluster).
/// No body is the same as `{}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemberRemove {
    /// Remove even below three voters. Never overrides the quorum check: a removal that
    /// would leave fewer reachable voters than a quorum is refused regardless.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the member list reads and writes the contract's JSON. Method: parse the
    /// contract's example (no `voter`, no `removed`), write it back with the defaults.
    #[test]
    fn member_list_matches_the_contract() {
        let text = r#"{"members":[{"id":1,"peer":"127.0.0.1:7001"}]}"#;
        let list: MemberList = serde_json::from_str(text).unwrap();
        assert_eq!(list.members.len(), 1);
        assert!(list.members[0].voter);
        assert_eq!(
            serde_json::to_string(&list).unwrap(),
            r#"{"members":[{"id":1,"peer":"127.0.0.1:7001","voter":true}],"index":0}"#
        );
    }

    /// Goal: the role is an optional field spelled `voter`/`learner`, and a removal's
    /// body may be absent, `{}` or `{"force":true}`, but nothing else. Method: round-trip
    /// a learner; parse each body.
    #[test]
    fn member_role_and_remove_body_read_as_documented() {
        let text = r#"{"id":5,"peer":"127.0.0.1:7005","voter":false,"role":"learner"}"#;
        let m: Member = serde_json::from_str(text).unwrap();
        assert_eq!(m.role, Some(MemberRole::Learner));
        assert_eq!(serde_json::to_string(&m).unwrap(), text);
        let none: MemberRemove = serde_json::from_str("{}").unwrap();
        assert!(!none.force);
        let forced: MemberRemove = serde_json::from_str(r#"{"force":true}"#).unwrap();
        assert!(forced.force);
        assert!(serde_json::from_str::<MemberRemove>(r#"{"forse":true}"#).is_err());
    }

    /// Goal: the leader view reads and writes the contract's JSON exactly.
    /// Method: parse the contract's example, write it back.
    #[test]
    fn leader_view_matches_the_contract() {
        let text = r#"{"node_id":1,"scope":"default","term":7,"leader_id":2,"role":"follower","token":null,"announced":false,"proof":null}"#;
        let view: LeaderView = serde_json::from_str(text).unwrap();
        assert_eq!(view.role, Role::Follower);
        assert_eq!(view.leader_id, Some(2));
        assert_eq!(serde_json::to_string(&view).unwrap(), text);
    }

    /// Goal: the long-poll query is written as the server reads it.
    /// Method: format each combination.
    #[test]
    fn long_poll_query() {
        assert_eq!(LongPoll::default().to_query(), "");
        assert!(!LongPoll::default().is_poll());
        let q = LongPoll {
            after_term: Some(3),
            timeout_ms: Some(500),
        };
        assert_eq!(q.to_query(), "after_term=3&timeout_ms=500");
    }
}
