//! The election loop's side of membership changes (the rules are in [`crate::members`]):
//! proposing a change, applying committed conf changes together with the members table,
//! installing a snapshot's table, keeping the guard and the transport in step with the
//! members, and refusing to go on when this node's storage lost acknowledged entries.

use palisade_protocol::MemberList;
use palisade_protocol::process::events;
use palisade_storage::MembersTable;
use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeV2, Entry, EntryType, Message, MessageType};
use tokio::sync::watch;
use tracing::{error, info, warn};

use super::error::NodeError;
use super::guard::DropCause;
use super::inbox::MemberReply;
use super::promote::Reachability;
use super::ready::{ElectionLoop, blocking};
use crate::members::{self, MemberChange, MemberError};

/// The loop's membership state.
pub(crate) struct Membership {
    /// The members table as of the applied index (or, on a node still joining, the
    /// table the cluster answered, until a snapshot brings the real one).
    pub(crate) table: MembersTable,
    /// The published view, for the API and the embedding application.
    pub(crate) tx: watch::Sender<MemberList>,
    /// This node's own peer address (what it listens on).
    pub(crate) own_peer: String,
    /// Compact the log up to the applied index after this Ready: a member was added, and
    /// it must catch up from a snapshot (which carries the members table), never from
    /// entry 1 (the initial membership is in no entry).
    pub(crate) compact_to_applied: bool,
    /// Set when this node must stop: its storage lost entries the cluster acknowledged.
    pub(crate) lost: Option<NodeError>,
    /// The announce list the announcers follow (the flags', or the one the cluster agreed
    /// on); a node with fleet leases keeps its flags'. The loop only publishes it: whoever
    /// started the node runs the announcers that follow it.
    pub(crate) announce_tx: watch::Sender<Vec<String>>,
    /// Whether this node runs fleet leases (`--lease-ms`): then the announce list is fixed.
    pub(crate) leases_on: bool,
    /// Entries kept behind the applied index at compaction
    /// ([`super::setup::LOG_ENTRIES_RETAINED`] unless a start option says otherwise).
    pub(crate) retained: u64,
    /// Compaction runs once this many more entries than `retained` accumulated
    /// ([`super::setup::LOG_COMPACT_STEP`] unless a start option says otherwise; at
    /// least 1).
    pub(crate) compact_step: u64,
    /// Which peers the leader heard from lately (see `promote`).
    pub(crate) reachability: Reachability,
}

impl ElectionLoop {
    /// Checks and proposes a membership change; answers once raft took the proposal (or
    /// forwarded it to the leader). The caller waits for the change to be applied.
    pub(super) fn on_member_request(&mut self, change: &MemberChange, reply: MemberReply) {
        let outcome = self.propose_member_change(change);
        if let Err(err) = &outcome {
            info!(node_id = self.id, change = ?change, cause = %err, "membership change refused");
        } else {
            info!(
                node_id = self.id,
                change = ?change,
                term = self.raw_node.raft.term,
                "membership change proposed"
            );
        }
        let _ = reply.send(outcome);
    }

    fn propose_member_change(&mut self, change: &MemberChange) -> Result<(), MemberError> {
        let leader = self.leader_id().ok_or(MemberError::NoLeader)?;
        if let MemberChange::Announce { proxies, seen } = change {
            if self.membership.leases_on {
                return Err(MemberError::AnnounceFixed);
            }
            let proxies = members::check_announce(proxies)?;
            // The request retired the proxies missing from `seen`: a list that changed
            // since may name others, which nobody retired. The API answers `Pending` as
            // the announce list having changed.
            if *self.membership.announce_tx.borrow() != *seen {
                return Err(MemberError::Pending);
            }
            // The entry applies only on top of the table's list of now (the flags' list
            // when the cluster never replaced it), so a change committed in between
            // (asked of another node) makes every node refuse this one.
            let base = self.membership.table.announce.clone();
            // A normal entry; a follower forwards it to the leader like a conf change.
            return self
                .raw_node
                .propose(
                    Vec::new(),
                    members::announce_entry(&proxies, base.as_deref()),
                )
                .map_err(|e| MemberError::Refused {
                    detail: e.to_string(),
                });
        }
        let cs = self.raw_node.raft.prs().conf().to_conf_state();
        // Removing the leader is refused here as `IsLeader`, which the caller answers by
        // moving leadership first; but only after every other check, so that a removal
        // refused anyway never moves leadership for nothing.
        let leader_removal = match members::check(&self.membership.table, &cs, Some(leader), change)
        {
            Err(MemberError::IsLeader { id }) => Some(id),
            other => {
                other?;
                None
            }
        };
        if self.raw_node.raft.has_pending_conf() {
            return Err(MemberError::Pending);
        }
        // Only the leader knows who is reachable; a follower checks what its own
        // configuration decides, and the leader checks the rest when the proposal arrives.
        if leader == self.id {
            self.check_on_leader(change)?;
        } else {
            members::check_voter_count(&cs.voters.iter().copied().collect(), change)?;
        }
        if let Some(id) = leader_removal {
            return Err(MemberError::IsLeader { id });
        }
        let Some((cc, context)) = members::conf_change(change) else {
            return Err(MemberError::Invalid {
                detail: "not a membership change".to_owned(),
            });
        };
        // On a follower raft forwards the proposal to the leader (a `MsgPropose`, which
        // the leader's guard lets through for conf changes only, and which the leader
        // checks like its own requests before raft sees it: `promote`).
        self.raw_node
            .propose_conf_change(context, cc)
            .map_err(|e| MemberError::Refused {
                detail: e.to_string(),
            })
    }

    /// Applies one committed conf-change entry: checks it against the table (every node
    /// decides the same), applies it to raft, and stores the conf state and the table in
    /// one transaction. Entries already reflected in the stored table (re-applied after a
    /// restart) are skipped: raft started from the stored conf state, which includes them.
    pub(super) async fn apply_conf_entry(&mut self, entry: &Entry) -> Result<(), NodeError> {
        if entry.index <= self.membership.table.index {
            return Ok(());
        }
        let cc = match entry.get_entry_type() {
            EntryType::EntryNormal => return self.apply_announce_entry(entry).await,
            EntryType::EntryConfChange => {
                let mut cc = ConfChange::default();
                if let Err(err) = cc.merge_from_bytes(&entry.data) {
                    warn!(index = entry.index, cause = %err, "undecodable conf change skipped");
                    return Ok(());
                }
                // A legacy single change, as raft-rs itself converts it.
                let mut single = raft::eraftpb::ConfChangeSingle::default();
                single.set_change_type(cc.get_change_type());
                single.node_id = cc.node_id;
                let mut v2 = ConfChangeV2::default();
                v2.set_changes(vec![single].into());
                v2
            }
            EntryType::EntryConfChangeV2 => {
                let mut cc = ConfChangeV2::default();
                if let Err(err) = cc.merge_from_bytes(&entry.data) {
                    warn!(index = entry.index, cause = %err, "undecodable conf change skipped");
                    return Ok(());
                }
                cc
            }
        };
        let table =
            match members::apply_to_table(&self.membership.table, &cc, &entry.context, entry.index)
            {
                Ok(table) => table,
                Err(err) => {
                    // Not applied to raft either: every node refuses the same entry.
                    warn!(
                        node_id = self.id,
                        index = entry.index,
                        cause = %err,
                        "conf change refused"
                    );
                    return Ok(());
                }
            };
        let cs = match self.raw_node.apply_conf_change(&cc) {
            Ok(cs) => cs,
            Err(err) => {
                warn!(node_id = self.id, index = entry.index, cause = %err, "conf change refused by raft");
                return Ok(());
            }
        };
        // A new id in the table (not a promotion): it catches up from a snapshot.
        let added = table.records.len() > self.membership.table.records.len();
        let log = self.log.clone();
        let (stored_cs, stored_table) = (cs.clone(), table.clone());
        blocking(move || log.apply_membership(&stored_cs, &stored_table)).await?;
        for c in cc.get_changes() {
            let id = c.node_id;
            let peer = table.records.get(&id).map(|r| r.peer.clone());
            let change = match c.get_change_type() {
                raft::eraftpb::ConfChangeType::RemoveNode => "remove",
                raft::eraftpb::ConfChangeType::AddLearnerNode => "add-learner",
                raft::eraftpb::ConfChangeType::AddNode if self.membership.table.is_member(id) => {
                    "promote"
                }
                raft::eraftpb::ConfChangeType::AddNode => "add",
            };
            info!(
                event = events::MEMBERSHIP_CHANGED,
                node_id = self.id,
                change,
                member_id = id,
                peer = peer.as_deref().unwrap_or(""),
                index = entry.index,
                term = self.raw_node.raft.term,
                voters = ?cs.voters,
                voters_outgoing = ?cs.voters_outgoing,
                learners = ?cs.learners,
                "membership changed"
            );
        }
        if cc.get_changes().is_empty() {
            info!(
                event = events::MEMBERSHIP_CHANGED,
                node_id = self.id,
                change = "leave-joint",
                index = entry.index,
                term = self.raw_node.raft.term,
                voters = ?cs.voters,
                "membership changed"
            );
        }
        self.membership.table = table;
        if added {
            self.membership.compact_to_applied = true;
        }
        self.on_members_changed();
        if self.membership.table.is_removed(self.id) && !members::is_joint(&cs) {
            warn!(
                node_id = self.id,
                index = entry.index,
                "this node was removed from the cluster; it no longer votes or campaigns: \
                 stop it (its id is never reused)"
            );
        }
        Ok(())
    }

    /// Applies a normal entry that replaces the announce list (any other normal entry, the
    /// leaders' no-ops, does nothing): stores it in the members table and hands it to the
    /// announcers. A node with fleet leases stores it but keeps announcing to its flags'
    /// proxies (the API refuses such changes on it; this covers a cluster of mixed flags).
    async fn apply_announce_entry(&mut self, entry: &Entry) -> Result<(), NodeError> {
        let change = match members::decode_announce_entry(&entry.data) {
            None => return Ok(()),
            Some(Err(err)) => {
                warn!(node_id = self.id, index = entry.index, cause = %err, "announce list change refused");
                return Ok(());
            }
            Some(Ok(change)) => change,
        };
        // Every node decides the same: the table is the same at the same index.
        if let members::AppliesOn::List(base) = &change.applies_on
            && *base != self.membership.table.announce
        {
            warn!(
                node_id = self.id,
                index = entry.index,
                "announce list change refused: the list changed after it was asked"
            );
            return Ok(());
        }
        let proxies = change.proxies;
        let mut table = self.membership.table.clone();
        table.announce = Some(proxies.clone());
        table.index = entry.index;
        let cs = self.raw_node.raft.prs().conf().to_conf_state();
        let log = self.log.clone();
        let stored = table.clone();
        blocking(move || log.apply_membership(&cs, &stored)).await?;
        self.membership.table = table;
        info!(
            event = events::ANNOUNCE_CHANGED,
            node_id = self.id,
            index = entry.index,
            term = self.raw_node.raft.term,
            proxies = ?proxies,
            "announce list changed"
        );
        if self.membership.leases_on {
            warn!(
                node_id = self.id,
                "this node runs fleet leases: it keeps announcing to its --announce flags"
            );
            return Ok(());
        }
        self.publish_announce(proxies);
        Ok(())
    }

    /// Hands a new announce list to the announcers; a token already announced to the old
    /// list is announced again to the new one.
    fn publish_announce(&mut self, proxies: Vec<String>) {
        self.no_proxies = proxies.is_empty();
        let changed = self.membership.announce_tx.send_if_modified(|l| {
            if *l == proxies {
                false
            } else {
                *l = proxies;
                true
            }
        });
        if changed {
            // A new list must accept the token again; an empty one needs nothing.
            let announced = self.no_proxies;
            self.leadership.send_modify(|l| {
                l.announced = announced && l.established.is_some();
            });
            self.metrics
                .announced
                .set(if announced { 1.0 } else { 0.0 });
        }
    }

    /// After a snapshot from the leader was persisted: its members table is now the
    /// stored one.
    pub(super) fn on_snapshot_installed(&mut self, index: u64) {
        self.membership.table = self.log.members();
        self.load_scopes_from_log();
        if let (Some(proxies), false) = (
            self.membership.table.announce.clone(),
            self.membership.leases_on,
        ) {
            self.publish_announce(proxies);
        }
        self.metrics.snapshots_applied.increment(1);
        info!(
            event = events::SNAPSHOT_APPLIED,
            node_id = self.id,
            index,
            term = self.raw_node.raft.term,
            members = ?self.membership.table.members().keys().collect::<Vec<_>>(),
            "snapshot applied"
        );
        self.on_members_changed();
    }

    /// Brings the guard, the transport and the published view in step with the table
    /// and raft's conf state.
    pub(super) fn on_members_changed(&mut self) {
        let cs = self.raw_node.raft.prs().conf().to_conf_state();
        let peers = members::peer_map(
            &self.membership.table,
            &cs,
            self.id,
            &self.membership.own_peer,
        );
        self.guard.voters = peers.keys().copied().collect();
        self.transport.set_peers(&peers);
        let view = members::view(&self.membership.table, &cs);
        self.membership.tx.send_if_modified(|v| {
            if *v == view {
                false
            } else {
                *v = view;
                true
            }
        });
    }

    /// Called for a peer message the guard dropped: a heartbeat whose commit index is
    /// beyond this node's log means the leader counts entries this node acknowledged and
    /// no longer has (a leader sends a follower at most the index it acknowledged). The
    /// storage was wiped or replaced; going on would let this node vote again in terms it
    /// already voted in. It stops.
    ///
    /// Only a heartbeat that could come from this node's leader counts: one of a later
    /// term, or of this term from the leader it follows (or while it knows none). A peer
    /// that is not that leader cannot have counted this node's acknowledgements, so its
    /// heartbeat is forged or confused and is only dropped, as before.
    pub(super) fn check_storage_lost(&mut self, m: &Message, cause: &DropCause) {
        if m.get_msg_type() != MessageType::MsgHeartbeat || self.membership.lost.is_some() {
            return;
        }
        let (term, leader_id) = (self.raw_node.raft.term, self.raw_node.raft.leader_id);
        let from_leader =
            m.term > term || (m.term == term && (leader_id == 0 || leader_id == m.from));
        if !from_leader {
            return;
        }
        if let DropCause::CommitBeyondLog { commit, last_index } = *cause {
            let err = NodeError::StorageLost {
                id: self.id,
                leader_id: m.from,
                commit,
                last_index,
            };
            error!(
                event = events::STORAGE_LOST,
                node_id = self.id,
                leader_id = m.from,
                term = m.term,
                commit,
                last_index,
                cause = %err,
                "storage lost acknowledged entries; stopping"
            );
            self.membership.lost = Some(err);
        }
    }

    /// The compaction target, if the log should be compacted now: everything up to the
    /// applied index right after a member was added, else `retained` entries behind it
    /// once `compact_step` more accumulated.
    pub(super) fn compaction_target(&mut self, applied: u64, first: u64) -> Option<u64> {
        if std::mem::take(&mut self.membership.compact_to_applied) && applied + 1 > first {
            return Some(applied + 1);
        }
        let (retained, step) = (
            self.membership.retained,
            self.membership.compact_step.max(1),
        );
        if applied + 1 >= first.saturating_add(retained).saturating_add(step) {
            return Some(applied + 1 - retained);
        }
        None
    }
}
