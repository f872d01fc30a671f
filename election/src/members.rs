//! Membership changes: the rules, the conf changes that carry them, and the members table
//! they produce.
//!
//! A change is one raft `ConfChangeV2` of a single change (`conf`: raft's simple
//! protocol, never a joint configuration). A new member joins as a learner, which
//! receives the log but does not vote, and the leader promotes it to voter once it has
//! caught up (`safety`), so an unreachable new member never costs the cluster its quorum.
//! The new member's peer address travels in the entry's context, so every member learns
//! it from the log, and the members table (in `palisade_storage`, stored with the conf
//! state and carried by snapshots) records it.
//!
//! The leader also refuses a change that would leave the voters without a reachable
//! quorum, and a removal below [`VOTERS_SAFE_MIN`] voters unless forced (`safety`).
//!
//! Each change is checked twice: when it is requested (to answer a clear 409), and again
//! when its entry is applied, on every node against the same table, so that every node
//! refuses the same entries. A refused entry is not applied to raft at all, which raft-rs
//! allows ("except when it decides to reject the configuration change").
//!
//! Ids are never reused: a removed id stays in the table, marked removed, and adding it
//! again is refused.
//!
//! The `--announce` proxy list can be replaced the same way (`POST /v1/announce`): a
//! normal entry whose data starts with [`ANNOUNCE_ENTRY_PREFIX`], applied on every node
//! into the members table (so snapshots carry it too), and only on top of the list it
//! was computed against (`announce`). Only on nodes without fleet leases: their release
//! rule ("every proxy accepted the term") would otherwise change under a
//! lease already granted, so with `--lease-ms` the list stays the one of the flags.

use std::collections::BTreeMap;

use palisade_protocol::{Member, MemberList, MemberRole};
use palisade_storage::{MemberRecord, MembersTable};
use raft::eraftpb::ConfState;

use crate::config::{PEERS_MAX, split_host_port};

mod announce;
mod conf;
mod safety;

pub(crate) use announce::{
    ANNOUNCE_ENTRY_PREFIX, AppliesOn, announce_entry, check_announce, decode_announce_entry,
};

pub(crate) use conf::{apply_to_table, classify, conf_change};
pub use safety::{PROMOTE_LAG_ENTRIES_MAX, VOTERS_SAFE_MIN};
pub(crate) use safety::{Reach, check_voter_count};

/// How long `POST /v1/members` and `DELETE /v1/members/{id}` wait for the change to be
/// applied on the node that was asked (a follower forwards the proposal to the leader and
/// then waits for the entry like any other). A healthy cluster needs a few heartbeats;
/// the bound keeps a request from hanging when no quorum is reachable.
pub const MEMBER_CHANGE_TIMEOUT_MS: u64 = 10_000;

/// Members a cluster may have at once: the same bound as `--peers` (raft's messages grow
/// with the voters, and an election cluster gains nothing from more).
pub const MEMBERS_MAX: usize = PEERS_MAX;

/// A requested change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MemberChange {
    /// Add a learner at this peer address (the leader promotes it once caught up).
    Add { id: u64, peer: String },
    /// Make a learner a voter.
    Promote { id: u64 },
    /// Remove a member; `force`: even below [`VOTERS_SAFE_MIN`] voters.
    Remove { id: u64, force: bool },
    /// Replace the `--announce` proxy list with `proxies`, if the list this node follows
    /// is still `seen` (the one the request read and retired the removed proxies of).
    Announce {
        proxies: Vec<String>,
        seen: Vec<String>,
    },
}

impl MemberChange {
    /// Whether `table` shows this change done.
    pub(crate) fn is_done(&self, list: &MemberList) -> bool {
        match self {
            MemberChange::Add { id, .. } => list.members.iter().any(|m| m.id == *id),
            MemberChange::Promote { id } => list.members.iter().any(|m| m.id == *id && m.voter),
            MemberChange::Remove { id, .. } => list.removed.contains(id),
            MemberChange::Announce { .. } => false,
        }
    }
}

/// Why a membership change was refused or did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemberError {
    /// The id was removed before; ids are never reused.
    #[error(
        "id {id} was removed from this cluster and ids are never reused: add the machine \
         under a new id"
    )]
    Reused {
        /// The refused id.
        id: u64,
    },
    /// The id is a member already.
    #[error("node {id} is already a member (peer {peer})")]
    AlreadyMember {
        /// The id.
        id: u64,
        /// Its peer address.
        peer: String,
    },
    /// The id is not a member.
    #[error("node {id} is not a member of this cluster")]
    NotAMember {
        /// The id.
        id: u64,
    },
    /// The id is 0 or the peer address is not `HOST:PORT`.
    #[error("{detail}")]
    Invalid {
        /// What is wrong.
        detail: String,
    },
    /// Another member already has this peer address.
    #[error("peer address {peer} is already the address of member {id}")]
    PeerInUse {
        /// The address.
        peer: String,
        /// The member that has it.
        id: u64,
    },
    /// The cluster is at [`MEMBERS_MAX`].
    #[error("the cluster has {count} members, the limit is {MEMBERS_MAX}")]
    TooMany {
        /// Members now.
        count: usize,
    },
    /// A change is still in progress (proposed but not applied, or the joint
    /// configuration not left yet).
    #[error("a membership change is still in progress; retry once it is applied")]
    Pending,
    /// Removing the leader: leadership must move first.
    #[error(
        "node {id} is the leader; move leadership to another member first \
         (POST /v1/transfer), then remove it"
    )]
    IsLeader {
        /// The leader's id.
        id: u64,
    },
    /// The change would leave no voter.
    #[error("removing node {id} would leave the cluster without voters")]
    LastVoter {
        /// The id.
        id: u64,
    },
    /// Removing the leader: leadership could not be moved off it first.
    #[error(
        "node {id} leads: its removal first moves leadership to another voter, which failed: \
         {cause}"
    )]
    LeaderNotMoved {
        /// The leader to be removed.
        id: u64,
        /// Why the transfer failed.
        cause: String,
    },
    /// No leader is known to forward the change to.
    #[error("no leader is known; retry once one is elected")]
    NoLeader,
    /// raft refused the proposal.
    #[error("raft refused the proposal: {detail}")]
    Refused {
        /// raft's error.
        detail: String,
    },
    /// The id is a voter already (a promotion).
    #[error("node {id} is already a voter")]
    AlreadyVoter {
        /// The id.
        id: u64,
    },
    /// A learner cannot be promoted yet.
    #[error(
        "learner {id} has not caught up: its log matches the leader's up to index \
         {matched} of {last_index} (at most {PROMOTE_LAG_ENTRIES_MAX} behind is needed) \
         and it {answered} within the last election timeout; is it running and reachable?",
        answered = if *active { "answered" } else { "did not answer" }
    )]
    NotCaughtUp {
        /// The learner.
        id: u64,
        /// Its matched index.
        matched: u64,
        /// The leader's last index.
        last_index: u64,
        /// Whether it answered within the last election timeout.
        active: bool,
    },
    /// Removing a voter would leave fewer than [`VOTERS_SAFE_MIN`] voters.
    #[error(
        "removing voter {id} would leave {voters} voters, fewer than {VOTERS_SAFE_MIN}: one \
         more failure would then stop the cluster; to do it anyway, remove with force \
         (`palisade member remove --force`, or the body {{\"force\":true}})"
    )]
    BelowSafeMinimum {
        /// The voter.
        id: u64,
        /// Voters that would be left.
        voters: usize,
    },
    /// The change would leave the voters without a reachable quorum.
    #[error(
        "{change} would leave {voters} voters, of which {quorum} must agree, but the leader \
         heard from only {reachable} of them within the last election timeout \
         (unreachable: {unreachable:?}); bring those back, or remove the unreachable ones \
         first"
    )]
    QuorumUnreachable {
        /// What was asked (`removing voter 3`).
        change: String,
        /// Voters after the change.
        voters: usize,
        /// Votes a quorum of them needs.
        quorum: usize,
        /// How many of them the leader reaches (itself included).
        reachable: usize,
        /// The ones it does not reach.
        unreachable: Vec<u64>,
    },
    /// The change was not applied on this node in time.
    #[error(
        "the change was not applied on this node within {waited_ms} ms (no quorum, another \
         change was in progress, or the leader refused a change forwarded to it: its log \
         says why)"
    )]
    TimedOut {
        /// How long the request waited.
        waited_ms: u64,
    },
    /// The node stopped.
    #[error("the node stopped")]
    Stopped,
    /// This node runs fleet leases, whose release rule depends on the proxy list.
    #[error(
        "this node runs fleet leases (--lease-ms): the lease release rule depends on the \
         --announce list, so it can only change by restarting the nodes with new flags"
    )]
    AnnounceFixed,
}

/// Checks a requested change against this node's table and conf state; `leader_id` is the
/// leader this node knows.
pub(crate) fn check(
    table: &MembersTable,
    cs: &ConfState,
    leader_id: Option<u64>,
    change: &MemberChange,
) -> Result<(), MemberError> {
    check_rules(table, change)?;
    if is_joint(cs) {
        return Err(MemberError::Pending);
    }
    match change {
        MemberChange::Remove { id, .. } if leader_id == Some(*id) => {
            Err(MemberError::IsLeader { id: *id })
        }
        MemberChange::Promote { id } if cs.voters.contains(id) => {
            Err(MemberError::AlreadyVoter { id: *id })
        }
        _ => Ok(()),
    }
}

/// The rules every node applies the same way, at request and at apply time.
pub(crate) fn check_rules(table: &MembersTable, change: &MemberChange) -> Result<(), MemberError> {
    match change {
        MemberChange::Add { id, peer } => {
            if *id == 0 {
                return Err(MemberError::Invalid {
                    detail: "member id 0 is invalid".to_owned(),
                });
            }
            if split_host_port(peer).is_none() || peer.contains(char::is_whitespace) {
                return Err(MemberError::Invalid {
                    detail: format!("peer address {peer:?} of node {id} is not HOST:PORT"),
                });
            }
            if table.is_removed(*id) {
                return Err(MemberError::Reused { id: *id });
            }
            if let Some(r) = table.records.get(id) {
                return Err(MemberError::AlreadyMember {
                    id: *id,
                    peer: r.peer.clone(),
                });
            }
            let members = table.members();
            if let Some((&other, _)) = members.iter().find(|(_, p)| *p == peer) {
                return Err(MemberError::PeerInUse {
                    peer: peer.clone(),
                    id: other,
                });
            }
            if members.len() >= MEMBERS_MAX {
                return Err(MemberError::TooMany {
                    count: members.len(),
                });
            }
            Ok(())
        }
        MemberChange::Announce { proxies, .. } => check_announce(proxies).map(drop),
        MemberChange::Promote { id } => {
            if table.is_member(*id) {
                Ok(())
            } else {
                Err(MemberError::NotAMember { id: *id })
            }
        }
        MemberChange::Remove { id, .. } => {
            if table.is_removed(*id) {
                return Err(MemberError::NotAMember { id: *id });
            }
            if !table.is_member(*id) {
                return Err(MemberError::NotAMember { id: *id });
            }
            if table.members().len() <= 1 {
                return Err(MemberError::LastVoter { id: *id });
            }
            Ok(())
        }
    }
}

/// Whether `cs` is a joint configuration.
pub(crate) fn is_joint(cs: &ConfState) -> bool {
    !cs.voters_outgoing.is_empty()
}

/// Every id this node exchanges raft traffic with, and its address: the members, plus any
/// removed id still in the conf state (the outgoing half of a joint configuration), plus
/// this node at `own_peer`.
pub(crate) fn peer_map(
    table: &MembersTable,
    cs: &ConfState,
    own_id: u64,
    own_peer: &str,
) -> BTreeMap<u64, String> {
    let mut peers = table.members();
    for id in conf_ids(cs) {
        if let Some(r) = table.records.get(&id) {
            peers.entry(id).or_insert_with(|| r.peer.clone());
        }
    }
    peers.insert(own_id, own_peer.to_owned());
    peers
}

/// Every id in a conf state, voters and learners, incoming and outgoing.
pub(crate) fn conf_ids(cs: &ConfState) -> impl Iterator<Item = u64> + '_ {
    cs.voters
        .iter()
        .chain(&cs.voters_outgoing)
        .chain(&cs.learners)
        .chain(&cs.learners_next)
        .copied()
}

/// The API's view of the table: each member, a voter when the conf state has it in its
/// incoming voters, a learner when in its learners (no role while this node has no
/// configuration yet: a node still joining).
pub(crate) fn view(table: &MembersTable, cs: &ConfState) -> MemberList {
    MemberList {
        members: table
            .members()
            .into_iter()
            .map(|(id, peer)| {
                let voter = cs.voters.contains(&id);
                let learner = cs.learners.contains(&id) || cs.learners_next.contains(&id);
                Member {
                    id,
                    peer,
                    voter,
                    role: match (voter, learner) {
                        (true, _) => Some(MemberRole::Voter),
                        (false, true) => Some(MemberRole::Learner),
                        (false, false) => None,
                    },
                }
            })
            .collect(),
        removed: table.removed(),
        index: table.index,
        joint: is_joint(cs),
    }
}

/// The table a joining node starts from: the list a member answered.
pub(crate) fn table_from_list(list: &MemberList) -> MembersTable {
    let mut table = MembersTable {
        index: list.index,
        records: BTreeMap::new(),
        announce: None,
    };
    for m in &list.members {
        table.records.insert(
            m.id,
            MemberRecord {
                peer: m.peer.clone(),
                removed: false,
            },
        );
    }
    for &id in &list.removed {
        table.records.entry(id).or_insert(MemberRecord {
            // The address of a removed id is unknown here and never dialed.
            peer: "removed:1".to_owned(),
            removed: true,
        });
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Members 1, 2, 3 at index 0.
    pub(super) fn table() -> MembersTable {
        MembersTable::initial(&BTreeMap::from([
            (1, "127.0.0.1:7001".to_owned()),
            (2, "127.0.0.1:7002".to_owned()),
            (3, "127.0.0.1:7003".to_owned()),
        ]))
    }

    fn cs(voters: &[u64]) -> ConfState {
        ConfState {
            voters: voters.to_vec(),
            ..ConfState::default()
        }
    }

    fn apply(t: &MembersTable, change: &MemberChange, index: u64) -> MembersTable {
        let (cc, ctx) = conf_change(change).unwrap();
        apply_to_table(t, &cc, &ctx, index).unwrap()
    }

    /// Goal: an add carries the peer address to every node, and a removed id is refused
    /// for ever, at request and at apply time. Method: add 4, remove 4, try to add 4
    /// again through both checks.
    #[test]
    fn add_then_remove_then_reuse_is_refused() {
        let t = apply(
            &table(),
            &MemberChange::Add {
                id: 4,
                peer: "127.0.0.1:7004".into(),
            },
            10,
        );
        assert_eq!(t.index, 10);
        assert_eq!(
            t.members().get(&4).map(String::as_str),
            Some("127.0.0.1:7004")
        );
        let t = apply(
            &t,
            &MemberChange::Remove {
                id: 4,
                force: false,
            },
            12,
        );
        assert_eq!(t.removed(), vec![4]);
        let again = MemberChange::Add {
            id: 4,
            peer: "127.0.0.1:7014".into(),
        };
        assert_eq!(
            check(&t, &cs(&[1, 2, 3]), Some(1), &again),
            Err(MemberError::Reused { id: 4 })
        );
        let (cc, ctx) = conf_change(&again).unwrap();
        assert_eq!(
            apply_to_table(&t, &cc, &ctx, 14),
            Err(MemberError::Reused { id: 4 })
        );
        let view = view(&t, &cs(&[1, 2, 3]));
        assert_eq!(view.members.len(), 3);
        assert_eq!(view.removed, vec![4]);
    }

    /// Goal: the list names each member's role: voters, learners, and no role on a node
    /// that has no configuration yet. Method: view a table of four with 4 a learner, then
    /// with an empty conf state.
    #[test]
    fn view_names_voters_and_learners() {
        let t = apply(
            &table(),
            &MemberChange::Add {
                id: 4,
                peer: "127.0.0.1:7004".into(),
            },
            3,
        );
        let with_learner = ConfState {
            voters: vec![1, 2, 3],
            learners: vec![4],
            ..ConfState::default()
        };
        let roles: Vec<_> = view(&t, &with_learner)
            .members
            .iter()
            .map(|m| (m.id, m.voter, m.role))
            .collect();
        assert_eq!(
            roles,
            vec![
                (1, true, Some(MemberRole::Voter)),
                (2, true, Some(MemberRole::Voter)),
                (3, true, Some(MemberRole::Voter)),
                (4, false, Some(MemberRole::Learner)),
            ]
        );
        assert!(
            view(&t, &ConfState::default())
                .members
                .iter()
                .all(|m| m.role.is_none() && !m.voter)
        );
        assert_eq!(
            check(&t, &with_learner, Some(1), &MemberChange::Promote { id: 2 }),
            Err(MemberError::AlreadyVoter { id: 2 })
        );
        assert_eq!(
            check(&t, &with_learner, Some(1), &MemberChange::Promote { id: 4 }),
            Ok(())
        );
    }

    /// Goal: requests that cannot be right are refused with their reason. Method: one
    /// request per rule.
    #[test]
    fn bad_requests_are_refused_with_their_reason() {
        let t = table();
        let normal = cs(&[1, 2, 3]);
        let add = |id: u64, peer: &str| MemberChange::Add {
            id,
            peer: peer.into(),
        };
        assert!(matches!(
            check(&t, &normal, Some(1), &add(2, "127.0.0.1:9")),
            Err(MemberError::AlreadyMember { id: 2, .. })
        ));
        assert!(matches!(
            check(&t, &normal, Some(1), &add(4, "127.0.0.1:7002")),
            Err(MemberError::PeerInUse { id: 2, .. })
        ));
        assert!(matches!(
            check(&t, &normal, Some(1), &add(4, "no-port")),
            Err(MemberError::Invalid { .. })
        ));
        assert_eq!(
            check(
                &t,
                &normal,
                Some(1),
                &MemberChange::Remove {
                    id: 9,
                    force: false
                }
            ),
            Err(MemberError::NotAMember { id: 9 })
        );
        assert_eq!(
            check(
                &t,
                &normal,
                Some(1),
                &MemberChange::Remove { id: 1, force: true }
            ),
            Err(MemberError::IsLeader { id: 1 })
        );
        let joint = ConfState {
            voters: vec![1, 2],
            voters_outgoing: vec![1, 2, 3],
            ..ConfState::default()
        };
        assert_eq!(
            check(
                &t,
                &joint,
                Some(1),
                &MemberChange::Remove { id: 2, force: true }
            ),
            Err(MemberError::Pending)
        );
    }

    /// Goal: a member on its way out stays reachable while a joint configuration (left by
    /// an older version) still counts it. Method: remove 3, build the peer map with 3
    /// still outgoing, then without.
    #[test]
    fn removed_member_stays_reachable_while_outgoing() {
        let t = apply(&table(), &MemberChange::Remove { id: 3, force: true }, 5);
        let joint = ConfState {
            voters: vec![1, 2],
            voters_outgoing: vec![1, 2, 3],
            ..ConfState::default()
        };
        assert!(peer_map(&t, &joint, 1, "127.0.0.1:7001").contains_key(&3));
        assert!(!peer_map(&t, &cs(&[1, 2]), 1, "127.0.0.1:7001").contains_key(&3));
    }
}
