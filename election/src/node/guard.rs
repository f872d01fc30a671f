//! Defence in depth: the last check of a peer message before `RawNode::step`.
//!
//! The transport already refused what does not decode, local-only types, and messages
//! whose sender is not the connection's peer. This check runs in the election loop, where
//! this node's raft state is at hand, and drops every message that raft-rs 0.7 would panic
//! on or that no honest peer sends: a sender outside the configuration, a type peers never
//! send each other, a term that would overflow or that is far ahead of this node's, a
//! commit index beyond this node's log (`commit_to` panics with "`to_commit` out of range"), an
//! append whose entries are not the consecutive run after its index (`maybe_append` slices
//! and panics), an append acknowledgement beyond the leader's log (the next append reads
//! entries out of bounds), a snapshot whose membership does not include this node, a
//! forwarded proposal that is anything but a membership change, and a `MsgTimeoutNow`
//! that is not from the leader this node follows. A dropped message is counted, and logged at most
//! once per reason per [`DROP_WARN_INTERVAL_MS`] (a flood of forged frames must not become
//! a flood of log lines); the node keeps running.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use raft::eraftpb::{Message, MessageType};

/// This node's raft state that the checks compare against, read just before the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LocalState {
    /// This node's id.
    pub id: u64,
    /// Its current term.
    pub term: u64,
    /// The leader it follows in `term` (0: none).
    pub leader_id: u64,
    /// Its last log index.
    pub last_index: u64,
}

/// The configuration the checks enforce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Guard {
    /// Every member this node exchanges raft traffic with, this node included; follows
    /// the members table at run time.
    pub voters: BTreeSet<u64>,
    /// Largest accepted distance of a message's term above this node's.
    pub max_term_gap: u64,
}

/// The highest term a message may carry: raft increments the term at the next election,
/// and `u64::MAX` would overflow there. `u64::MAX - 1` is refused as well, so this node
/// itself can always campaign once more.
pub const TERM_ACCEPTED_MAX: u64 = u64::MAX - 2;

/// Shortest time between two warnings about dropped peer messages of the same reason, in
/// milliseconds; the drops in between are counted and reported with the next warning.
pub const DROP_WARN_INTERVAL_MS: u64 = 1_000;

/// Rate limit of the drop warnings: per reason, the last warning's time and the drops
/// not logged since.
#[derive(Debug, Default)]
pub(crate) struct DropLog {
    last: HashMap<&'static str, (Instant, u64)>,
}

impl DropLog {
    /// Whether a drop for `reason` at `now` is to be logged; `Some(n)` with the `n` drops
    /// of that reason left unlogged since the last warning.
    pub(crate) fn should_log(&mut self, reason: &'static str, now: Instant) -> Option<u64> {
        let interval = Duration::from_millis(DROP_WARN_INTERVAL_MS);
        match self.last.get_mut(reason) {
            Some((at, suppressed)) if now.saturating_duration_since(*at) < interval => {
                *suppressed = suppressed.saturating_add(1);
                None
            }
            Some((at, suppressed)) => {
                let n = std::mem::take(suppressed);
                *at = now;
                Some(n)
            }
            None => {
                self.last.insert(reason, (now, 0));
                Some(0)
            }
        }
    }
}

/// Why a peer message was dropped. `reason()` is the metric label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum DropCause {
    /// The sender is not a voter of this cluster, or is this node itself.
    #[error("sender {from} is not a peer of this cluster")]
    NotAPeer { from: u64 },
    /// The message is addressed to another node.
    #[error("message to node {to} arrived at node {me}")]
    WrongRecipient { to: u64, me: u64 },
    /// A type peers never send each other (local-only, or forwarding this node never uses).
    #[error("peers never send {0:?} to each other")]
    ForbiddenType(MessageType),
    /// The term is so large that the next election would overflow.
    #[error("term {term} is above the largest accepted term {TERM_ACCEPTED_MAX}")]
    TermOverflow { term: u64 },
    /// The term is further ahead of this node's than `max_term_gap`.
    #[error("term {term} is more than {gap} terms above this node's term {own}")]
    TermTooFarAhead { term: u64, own: u64, gap: u64 },
    /// A commit index beyond this node's log.
    #[error("commit {commit} is beyond this node's last index {last_index}")]
    CommitBeyondLog { commit: u64, last_index: u64 },
    /// An append whose entries do not follow its index one by one, or whose entry terms
    /// are above the message's term or go down.
    #[error("append at index {index} carries inconsistent entries: {detail}")]
    AppendInconsistent { index: u64, detail: String },
    /// An append acknowledgement for entries this leader does not have.
    #[error("acknowledged index {index} is beyond this node's last index {last_index}")]
    AckBeyondLog { index: u64, last_index: u64 },
    /// A snapshot whose membership does not include this node.
    #[error("snapshot voters {voters:?} do not include this node")]
    SnapshotMembership { voters: Vec<u64> },
    /// A forwarded proposal that is not exactly one membership or announce list change.
    #[error("a forwarded proposal must be one membership or announce list change")]
    ProposalNotConfChange,
    /// A `MsgTimeoutNow` not from the leader this node follows in its term.
    #[error(
        "MsgTimeoutNow from node {from} in term {term}, but this node follows {leader_id} in term {own}"
    )]
    TimeoutNowNotFromLeader {
        from: u64,
        term: u64,
        leader_id: u64,
        own: u64,
    },
    /// A `MsgTransferLeader` to a node that is not the leader: raft-rs would forward it
    /// with its term set and panic (the fuzzer found it; a cluster whose leadership moves
    /// while a transfer is forwarded can send one).
    #[error(
        "MsgTransferLeader from node {from} reached this node, which is not the leader (it follows {leader_id})"
    )]
    TransferNotAtLeader { from: u64, leader_id: u64 },
}

impl DropCause {
    /// The `reason` label of `palisade_node_peer_messages_dropped_total`.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            DropCause::NotAPeer { .. } => "not_a_peer",
            DropCause::WrongRecipient { .. } => "wrong_recipient",
            DropCause::ForbiddenType(_) => "forbidden_type",
            DropCause::TermOverflow { .. } => "term_overflow",
            DropCause::TermTooFarAhead { .. } => "term_too_far_ahead",
            DropCause::CommitBeyondLog { .. } => "commit_beyond_log",
            DropCause::AppendInconsistent { .. } => "append_inconsistent",
            DropCause::AckBeyondLog { .. } => "ack_beyond_log",
            DropCause::SnapshotMembership { .. } => "snapshot_membership",
            DropCause::ProposalNotConfChange => "proposal_not_conf_change",
            DropCause::TimeoutNowNotFromLeader { .. } => "timeout_now_not_from_leader",
            DropCause::TransferNotAtLeader { .. } => "transfer_not_at_leader",
        }
    }
}

/// Whether peers may send `t` to each other here. Local-only types never cross the
/// network; this node reads (lease rounds) only as leader, which raft does with
/// heartbeats, so read-index traffic is never legitimate. `MsgTransferLeader` is forwarded
/// by a follower asked to transfer, and `MsgPropose` by a follower asked for a membership
/// change (checked further in [`Guard::check`]), so both are allowed.
fn peers_send(t: MessageType) -> bool {
    use MessageType::{
        MsgAppend, MsgAppendResponse, MsgBeat, MsgCheckQuorum, MsgHeartbeat, MsgHeartbeatResponse,
        MsgHup, MsgPropose, MsgReadIndex, MsgReadIndexResp, MsgRequestPreVote,
        MsgRequestPreVoteResponse, MsgRequestVote, MsgRequestVoteResponse, MsgSnapStatus,
        MsgSnapshot, MsgTimeoutNow, MsgTransferLeader, MsgUnreachable,
    };
    match t {
        MsgAppend
        | MsgAppendResponse
        | MsgRequestVote
        | MsgRequestVoteResponse
        | MsgRequestPreVote
        | MsgRequestPreVoteResponse
        | MsgSnapshot
        | MsgHeartbeat
        | MsgHeartbeatResponse
        | MsgTransferLeader
        | MsgTimeoutNow
        | MsgPropose => true,
        MsgHup | MsgBeat | MsgUnreachable | MsgSnapStatus | MsgCheckQuorum | MsgReadIndex
        | MsgReadIndexResp => false,
    }
}

impl Guard {
    /// Checks `m` against this node's state `me`; `Err` says why it must be dropped.
    pub(crate) fn check(&self, m: &Message, me: &LocalState) -> Result<(), DropCause> {
        if m.from == me.id || !self.voters.contains(&m.from) {
            return Err(DropCause::NotAPeer { from: m.from });
        }
        if m.to != me.id {
            return Err(DropCause::WrongRecipient {
                to: m.to,
                me: me.id,
            });
        }
        let kind = m.get_msg_type();
        if !peers_send(kind) {
            return Err(DropCause::ForbiddenType(kind));
        }
        if m.term > TERM_ACCEPTED_MAX {
            return Err(DropCause::TermOverflow { term: m.term });
        }
        if m.term > me.term.saturating_add(self.max_term_gap) {
            return Err(DropCause::TermTooFarAhead {
                term: m.term,
                own: me.term,
                gap: self.max_term_gap,
            });
        }
        match kind {
            MessageType::MsgHeartbeat if m.commit > me.last_index => {
                Err(DropCause::CommitBeyondLog {
                    commit: m.commit,
                    last_index: me.last_index,
                })
            }
            MessageType::MsgAppend => check_append(m),
            MessageType::MsgAppendResponse if !m.reject && m.index > me.last_index => {
                Err(DropCause::AckBeyondLog {
                    index: m.index,
                    last_index: me.last_index,
                })
            }
            MessageType::MsgSnapshot => Self::check_snapshot(m, me.id),
            MessageType::MsgPropose if !is_forwarded_change(m) => {
                Err(DropCause::ProposalNotConfChange)
            }
            MessageType::MsgTransferLeader if me.leader_id != me.id => {
                Err(DropCause::TransferNotAtLeader {
                    from: m.from,
                    leader_id: me.leader_id,
                })
            }
            MessageType::MsgTimeoutNow
                if m.term != me.term || me.leader_id == 0 || m.from != me.leader_id =>
            {
                Err(DropCause::TimeoutNowNotFromLeader {
                    from: m.from,
                    term: m.term,
                    leader_id: me.leader_id,
                    own: me.term,
                })
            }
            _ => Ok(()),
        }
    }

    fn check_snapshot(m: &Message, me: u64) -> Result<(), DropCause> {
        let meta = m.get_snapshot().get_metadata();
        let cs = meta.get_conf_state();
        // The membership may have changed since this node last heard (it may be joining),
        // so the snapshot's need not match this node's; it must include this node (raft
        // would refuse it otherwise) and name no id twice.
        let voters: BTreeSet<u64> = cs.get_voters().iter().copied().collect();
        let includes_me = cs
            .get_voters()
            .iter()
            .chain(cs.get_voters_outgoing())
            .chain(cs.get_learners())
            .any(|&id| id == me);
        if !includes_me || cs.get_voters().len() != voters.len() {
            return Err(DropCause::SnapshotMembership {
                voters: cs.get_voters().to_vec(),
            });
        }
        if meta.term > m.term {
            return Err(DropCause::AppendInconsistent {
                index: meta.index,
                detail: format!(
                    "snapshot term {} is above the message term {}",
                    meta.term, m.term
                ),
            });
        }
        Ok(())
    }
}

/// Whether a forwarded proposal is one change a follower may forward: a membership change
/// (`ConfChangeV2`) or a new announce list (a normal entry with its prefix).
fn is_forwarded_change(m: &Message) -> bool {
    use raft::eraftpb::EntryType;
    match m.get_entries() {
        [e] => match e.get_entry_type() {
            EntryType::EntryConfChangeV2 => true,
            EntryType::EntryNormal => e.data.starts_with(crate::members::ANNOUNCE_ENTRY_PREFIX),
            EntryType::EntryConfChange => false,
        },
        _ => false,
    }
}

/// An append's entries must be the run `index + 1, index + 2, ...`, with terms that never
/// go down, never exceed the message's term, and never go below its `log_term`.
fn check_append(m: &Message) -> Result<(), DropCause> {
    let bad = |detail: String| {
        Err(DropCause::AppendInconsistent {
            index: m.index,
            detail,
        })
    };
    if m.log_term > m.term {
        return bad(format!(
            "log term {} is above the message term {}",
            m.log_term, m.term
        ));
    }
    // Every entry after index 0 has a term of at least 1, so a leader appending after
    // index `i > 0` names a term of at least 1 for it. raft-rs reads term 0 at an index
    // beyond its log as a match, and then commits past its last index and panics (the
    // `peer_frame` fuzz target found it).
    if m.index > 0 && m.log_term == 0 {
        return bad(format!("log term 0 at index {}", m.index));
    }
    let mut previous_term = m.log_term;
    for (offset, entry) in (1u64..).zip(m.get_entries()) {
        let Some(expected) = m.index.checked_add(offset) else {
            return bad("entry indices overflow".to_owned());
        };
        if entry.index != expected {
            return bad(format!(
                "entry {offset} has index {}, expected {expected}",
                entry.index
            ));
        }
        if entry.term < previous_term || entry.term > m.term {
            return bad(format!(
                "entry {} has term {}, outside [{previous_term}, {}]",
                entry.index, entry.term, m.term
            ));
        }
        previous_term = entry.term;
    }
    Ok(())
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
