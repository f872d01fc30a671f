//! The leader's watch over the membership (the rules are in `crate::members`' `safety`):
//! which peers it hears from, promoting each learner once it has caught up, leaving a
//! joint configuration that an older version (or a crash) left behind, and checking the
//! membership changes followers forward to it before raft sees them.

use std::collections::BTreeMap;

use protobuf::Message as _;
use raft::StateRole;
use raft::eraftpb::{ConfChangeV2, EntryType, Message, MessageType};
use tracing::{debug, info, warn};

use super::ready::ElectionLoop;
use crate::members::{self, MemberChange, MemberError, Reach};

/// Which peers this node heard from, by tick: a peer counts as reachable when a raft
/// message from it arrived within the last election timeout, raft's own notion (its
/// check-quorum round). raft's `Progress::recent_active` is not used: it is only reset
/// every election timeout, and a new peer starts with it set, before it ever answered.
#[derive(Debug, Default)]
pub(crate) struct Reachability {
    /// The tick of the last raft message from each peer.
    heard_at: BTreeMap<u64, u64>,
    /// Ticks counted so far.
    ticks: u64,
    /// A peer counts as reachable when heard from within this many ticks (the election
    /// timeout).
    window: u64,
}

impl Reachability {
    /// Reachability with a window of `election_ticks`.
    pub(crate) fn new(election_ticks: u64) -> Self {
        Self {
            window: election_ticks,
            ..Self::default()
        }
    }

    /// A raft message from `from` arrived (and passed the guard).
    pub(crate) fn heard(&mut self, from: u64) {
        self.heard_at.insert(from, self.ticks);
    }

    /// Whether `id` was heard from within the window.
    fn recently(&self, id: u64) -> bool {
        self.heard_at
            .get(&id)
            .is_some_and(|&at| self.ticks.saturating_sub(at) <= self.window)
    }
}

impl ElectionLoop {
    /// Once per tick: counts the tick; then, on an established leader, leaves a joint
    /// configuration or promotes a learner that caught up.
    pub(super) fn membership_tick(&mut self) {
        self.membership.reachability.ticks += 1;
        let r = &self.raw_node.raft;
        if r.state != StateRole::Leader {
            return;
        }
        let ready =
            r.apply_to_current_term() && r.lead_transferee.is_none() && !r.has_pending_conf();
        if !ready {
            return;
        }
        let cs = r.prs().conf().to_conf_state();
        if members::is_joint(&cs) {
            self.leave_joint();
            return;
        }
        if cs.learners.is_empty() && cs.learners_next.is_empty() {
            return;
        }
        if let Some(id) = self.reach().promotable() {
            self.promote(id);
        }
    }

    /// What this leader knows of its peers now.
    pub(super) fn reach(&self) -> Reach {
        let r = &self.raw_node.raft;
        let cs = r.prs().conf().to_conf_state();
        let heard = &self.membership.reachability;
        let mut reachable = std::collections::BTreeSet::from([self.id]);
        let mut matched = BTreeMap::new();
        for (&id, pr) in r.prs().iter() {
            matched.insert(id, pr.matched);
            if heard.recently(id) {
                reachable.insert(id);
            }
        }
        Reach {
            voters: cs.voters.iter().copied().collect(),
            learners: cs
                .learners
                .iter()
                .chain(&cs.learners_next)
                .copied()
                .collect(),
            reachable,
            matched,
            last_index: r.raft_log.last_index(),
        }
    }

    /// Proposes the promotion of learner `id`.
    fn promote(&mut self, id: u64) {
        let Some((cc, context)) = members::conf_change(&MemberChange::Promote { id }) else {
            return;
        };
        match self.raw_node.propose_conf_change(context, cc) {
            Ok(()) => info!(
                node_id = self.id,
                member_id = id,
                term = self.raw_node.raft.term,
                "learner caught up: promotion to voter proposed"
            ),
            Err(err) => {
                debug!(node_id = self.id, member_id = id, cause = %err, "promotion not proposed");
            }
        }
    }

    /// Proposes the empty change that leaves a joint configuration. raft-rs leaves one on
    /// its own only when it was entered with automatic leaving and this leader applied
    /// the entry that entered it; this covers every other case (an explicit transition, a
    /// leader that changed in between). It completes only if the new configuration's
    /// quorum is reachable; otherwise the cluster has lost its quorum for good, and only
    /// `--force-new-cluster` gets it out.
    fn leave_joint(&mut self) {
        let cc = ConfChangeV2::default();
        match self.raw_node.propose_conf_change(Vec::new(), cc) {
            Ok(()) => warn!(
                node_id = self.id,
                term = self.raw_node.raft.term,
                "the cluster is in a joint configuration: proposed leaving it"
            ),
            Err(err) => {
                debug!(node_id = self.id, cause = %err, "leaving the joint configuration not proposed");
            }
        }
    }

    /// The leader's own checks of a change, beyond the rules every node applies: a
    /// reachable quorum after it, a caught-up learner for a promotion, three voters
    /// unless forced.
    pub(super) fn check_on_leader(&self, change: &MemberChange) -> Result<(), MemberError> {
        if self.raw_node.raft.has_pending_conf() {
            return Err(MemberError::Pending);
        }
        self.reach().check(change)
    }

    /// For a peer message about to be stepped: why the leader refuses a membership change
    /// a follower forwarded (`MsgPropose`), `None` to step it. The follower that asked
    /// then answers its caller when its wait runs out; this node's log says why.
    pub(super) fn refuse_forwarded(&self, m: &Message) -> Option<MemberError> {
        if m.get_msg_type() != MessageType::MsgPropose
            || self.raw_node.raft.state != StateRole::Leader
        {
            return None;
        }
        let entry = m.get_entries().first()?;
        if entry.get_entry_type() != EntryType::EntryConfChangeV2 {
            return None;
        }
        let mut cc = ConfChangeV2::default();
        if let Err(err) = cc.merge_from_bytes(&entry.data) {
            return Some(MemberError::Invalid {
                detail: format!("undecodable conf change: {err}"),
            });
        }
        let change = match members::classify(&self.membership.table, &cc, &entry.context) {
            Ok(Some(change)) => change,
            // Leaving a joint configuration: raft itself refuses it outside one.
            Ok(None) => return None,
            Err(err) => return Some(err),
        };
        let cs = self.raw_node.raft.prs().conf().to_conf_state();
        members::check(&self.membership.table, &cs, Some(self.id), &change)
            .and_then(|()| self.check_on_leader(&change))
            .err()
    }
}
