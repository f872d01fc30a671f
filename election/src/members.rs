//! Membership changes: the rules, the conf changes that carry them, and the members table
//! they produce.
//!
//! A change is one raft `ConfChangeV2` with an explicit joint transition
//! (`ConfChangeTransition::Implicit`): raft enters the joint configuration (old and new
//! voters must both agree) when the entry is applied and its leader proposes the empty
//! change that leaves it once that is applied. The new member's peer address travels in
//! the entry's context (JSON [`MemberAdd`]), so every member learns it from the log, and
//! the members table (in `palisade_storage`, stored with the conf state and carried by
//! snapshots) records it.
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
//! into the members table (so snapshots carry it too). Only on nodes without fleet leases:
//! their release rule ("every proxy accepted the term") would otherwise change under a
//! lease already granted, so with `--lease-ms` the list stays the one of the flags.

use std::collections::BTreeMap;

use palisade_protocol::{Member, MemberAdd, MemberList};
use palisade_storage::{MemberRecord, MembersTable};
use raft::eraftpb::{
    ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState,
};

use crate::config::{PEERS_MAX, split_host_port};

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
    /// Add a voter at this peer address.
    Add { id: u64, peer: String },
    /// Remove a member.
    Remove { id: u64 },
    /// Replace the `--announce` proxy list.
    Announce { proxies: Vec<String> },
}

impl MemberChange {
    /// Whether `table` shows this change done.
    pub(crate) fn is_done(&self, list: &MemberList) -> bool {
        match self {
            MemberChange::Add { id, .. } => list.members.iter().any(|m| m.id == *id),
            MemberChange::Remove { id } => list.removed.contains(id),
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
    /// No leader is known to forward the change to.
    #[error("no leader is known; retry once one is elected")]
    NoLeader,
    /// raft refused the proposal.
    #[error("raft refused the proposal: {detail}")]
    Refused {
        /// raft's error.
        detail: String,
    },
    /// The change was not applied on this node in time.
    #[error(
        "the change was not applied on this node within {waited_ms} ms (no quorum, or \
         another change was in progress)"
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

/// The start of a normal entry's data that replaces the `--announce` list; the URLs
/// follow, one per line.
pub(crate) const ANNOUNCE_ENTRY_PREFIX: &[u8] = b"palisade-announce 1\n";

/// The entry data that replaces the announce list with `proxies`.
pub(crate) fn announce_entry(proxies: &[String]) -> Vec<u8> {
    let mut data = ANNOUNCE_ENTRY_PREFIX.to_vec();
    for url in proxies {
        data.extend_from_slice(url.as_bytes());
        data.push(b'\n');
    }
    data
}

/// The proxies an entry's data names, `None` when it is not an announce entry.
pub(crate) fn parse_announce_entry(data: &[u8]) -> Option<Result<Vec<String>, MemberError>> {
    let rest = data.strip_prefix(ANNOUNCE_ENTRY_PREFIX)?;
    let parsed = std::str::from_utf8(rest)
        .map_err(|e| MemberError::Invalid {
            detail: format!("announce entry is not UTF-8: {e}"),
        })
        .map(|text| text.lines().map(str::to_owned).collect::<Vec<_>>())
        .and_then(|urls| check_announce(&urls).map(|()| urls));
    Some(parsed)
}

/// An announce list must hold at most [`crate::config::ANNOUNCE_URLS_MAX`] distinct
/// http(s) base URLs, as `--announce` must.
pub(crate) fn check_announce(proxies: &[String]) -> Result<(), MemberError> {
    if proxies.len() > crate::config::ANNOUNCE_URLS_MAX {
        return Err(MemberError::Invalid {
            detail: format!(
                "names {} proxies, the limit is {}",
                proxies.len(),
                crate::config::ANNOUNCE_URLS_MAX
            ),
        });
    }
    for (i, url) in proxies.iter().enumerate() {
        let bad = |why: &str| MemberError::Invalid {
            detail: format!("announce URL {url:?} {why}"),
        };
        if url.is_empty()
            || url.len() > palisade_storage::ANNOUNCE_URL_BYTES_MAX
            || url.contains(char::is_whitespace)
        {
            return Err(bad("is empty, too long or has white space"));
        }
        let uri: http::Uri = url.parse().map_err(|_| bad("is not a URL"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
            return Err(bad("must be an http:// or https:// URL with a host"));
        }
        if uri.query().is_some() {
            return Err(bad("must be a base URL without a query"));
        }
        if proxies[..i].contains(url) {
            return Err(bad("is named twice"));
        }
    }
    Ok(())
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
        MemberChange::Remove { id } if leader_id == Some(*id) => {
            Err(MemberError::IsLeader { id: *id })
        }
        _ => Ok(()),
    }
}

/// The rules every node applies the same way, at request and at apply time.
fn check_rules(table: &MembersTable, change: &MemberChange) -> Result<(), MemberError> {
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
        MemberChange::Announce { proxies } => check_announce(proxies),
        MemberChange::Remove { id } => {
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

/// The conf change and its context for `change` (`None` for an announce list, which is
/// a normal entry).
pub(crate) fn conf_change(change: &MemberChange) -> Option<(ConfChangeV2, Vec<u8>)> {
    let mut single = ConfChangeSingle::default();
    let context = match change {
        MemberChange::Announce { .. } => return None,
        MemberChange::Add { id, peer } => {
            single.set_change_type(ConfChangeType::AddNode);
            single.node_id = *id;
            serde_json::to_vec(&MemberAdd {
                id: *id,
                peer: peer.clone(),
            })
            .unwrap_or_default()
        }
        MemberChange::Remove { id } => {
            single.set_change_type(ConfChangeType::RemoveNode);
            single.node_id = *id;
            Vec::new()
        }
    };
    let mut cc = ConfChangeV2::default();
    // Implicit: enter the joint configuration and let raft's leader leave it on its own.
    cc.set_transition(ConfChangeTransition::Implicit);
    cc.set_changes(vec![single].into());
    Some((cc, context))
}

/// The table after applying the conf change of entry `index` (with its `context`), or why
/// every node refuses it. The empty change that leaves a joint configuration changes no
/// record.
pub(crate) fn apply_to_table(
    table: &MembersTable,
    cc: &ConfChangeV2,
    context: &[u8],
    index: u64,
) -> Result<MembersTable, MemberError> {
    let mut next = table.clone();
    for single in cc.get_changes() {
        let id = single.node_id;
        let change = match single.get_change_type() {
            ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                let add: MemberAdd =
                    serde_json::from_slice(context).map_err(|e| MemberError::Invalid {
                        detail: format!("conf change adding node {id} has no peer address: {e}"),
                    })?;
                if add.id != id {
                    return Err(MemberError::Invalid {
                        detail: format!(
                            "conf change adds node {id} but its context names node {}",
                            add.id
                        ),
                    });
                }
                MemberChange::Add { id, peer: add.peer }
            }
            ConfChangeType::RemoveNode => MemberChange::Remove { id },
        };
        check_rules(&next, &change)?;
        match change {
            MemberChange::Add { id, peer } => {
                next.records.insert(
                    id,
                    MemberRecord {
                        peer,
                        removed: false,
                    },
                );
            }
            MemberChange::Remove { id } => {
                if let Some(r) = next.records.get_mut(&id) {
                    r.removed = true;
                }
            }
            MemberChange::Announce { .. } => {}
        }
    }
    next.index = index;
    Ok(next)
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
/// incoming voters.
pub(crate) fn view(table: &MembersTable, cs: &ConfState) -> MemberList {
    MemberList {
        members: table
            .members()
            .into_iter()
            .map(|(id, peer)| Member {
                id,
                peer,
                voter: cs.voters.contains(&id),
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

    fn table() -> MembersTable {
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
        let t = apply(&t, &MemberChange::Remove { id: 4 }, 12);
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
            check(&t, &normal, Some(1), &MemberChange::Remove { id: 9 }),
            Err(MemberError::NotAMember { id: 9 })
        );
        assert_eq!(
            check(&t, &normal, Some(1), &MemberChange::Remove { id: 1 }),
            Err(MemberError::IsLeader { id: 1 })
        );
        let joint = ConfState {
            voters: vec![1, 2],
            voters_outgoing: vec![1, 2, 3],
            ..ConfState::default()
        };
        assert_eq!(
            check(&t, &joint, Some(1), &MemberChange::Remove { id: 2 }),
            Err(MemberError::Pending)
        );
    }

    /// Goal: a member on its way out stays reachable while the joint configuration still
    /// counts it, and the conf change is a joint one. Method: remove 3, build the peer
    /// map with 3 still outgoing, then without.
    #[test]
    fn removed_member_stays_reachable_while_outgoing() {
        let (cc, _) = conf_change(&MemberChange::Remove { id: 3 }).unwrap();
        assert_eq!(cc.get_transition(), ConfChangeTransition::Implicit);
        let t = apply(&table(), &MemberChange::Remove { id: 3 }, 5);
        let joint = ConfState {
            voters: vec![1, 2],
            voters_outgoing: vec![1, 2, 3],
            ..ConfState::default()
        };
        assert!(peer_map(&t, &joint, 1, "127.0.0.1:7001").contains_key(&3));
        assert!(!peer_map(&t, &cs(&[1, 2]), 1, "127.0.0.1:7001").contains_key(&3));
    }
}
