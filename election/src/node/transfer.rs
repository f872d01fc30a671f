//! Leadership transfers: starting one in raft, and answering it once its outcome is known
//! (done, superseded by another leader, refused by raft, or out of time).

use raft::StateRole;
use tokio::sync::oneshot;
use tracing::{info, warn};

use palisade_protocol::Transferred;

use super::error::TransferError;
use super::ready::ElectionLoop;

/// A transfer waiting for its outcome.
pub(super) struct PendingTransfer {
    pub(super) from: u64,
    pub(super) to: u64,
    pub(super) start_term: u64,
    pub(super) ticks_left: u64,
    pub(super) reply: oneshot::Sender<Result<Transferred, TransferError>>,
}

impl ElectionLoop {
    /// Starts a transfer to `to` (resign when `None`), or answers at once when it cannot
    /// start or is already done.
    pub(super) fn start_transfer(
        &mut self,
        to: Option<u64>,
        reply: oneshot::Sender<Result<Transferred, TransferError>>,
    ) {
        let is_leader = self.raw_node.raft.state == StateRole::Leader;
        let term = self.raw_node.raft.term;
        let leader_id = self.leader_id();
        let voters = self.raw_node.raft.prs().conf().voters().clone();
        let to = match to {
            Some(to) if !voters.contains(to) => {
                let _ = reply.send(Err(TransferError::UnknownNode { to }));
                return;
            }
            Some(to) => to,
            None if !is_leader => {
                let _ = reply.send(Err(TransferError::NotLeader { leader_id }));
                return;
            }
            None => {
                // The best other voter: the highest match index, then the lowest id.
                let best = self
                    .raw_node
                    .raft
                    .prs()
                    .iter()
                    .filter(|(id, _)| **id != self.id && voters.contains(**id))
                    .max_by_key(|(id, pr)| (pr.matched, std::cmp::Reverse(**id)))
                    .map(|(id, _)| *id);
                let Some(best) = best else {
                    let _ = reply.send(Err(TransferError::NoCandidate));
                    return;
                };
                best
            }
        };
        if leader_id == Some(to) {
            // Already there; nothing to do.
            let _ = reply.send(Ok(Transferred { from: to, to, term }));
            return;
        }
        let Some(from) = leader_id else {
            // raft drops a transfer on a node that knows no leader.
            let _ = reply.send(Err(TransferError::NotLeader { leader_id }));
            return;
        };
        info!(from, to, term, "leadership transfer requested");
        self.raw_node.transfer_leader(to);
        if is_leader && self.raw_node.raft.lead_transferee != Some(to) {
            let _ = reply.send(Err(TransferError::Refused { to, term }));
            return;
        }
        self.transfers.push(PendingTransfer {
            from,
            to,
            start_term: term,
            ticks_left: self.transfer_ticks,
            reply,
        });
    }

    /// Answers every transfer whose outcome is known: done, superseded, refused or late.
    pub(super) fn check_transfers(&mut self) {
        if self.transfers.is_empty() {
            return;
        }
        let term = self.raw_node.raft.term;
        let state = self.raw_node.raft.state;
        let transferee = self.raw_node.raft.lead_transferee;
        let leader_id = self.leader_id();
        let id = self.id;
        let ticks = self.transfer_ticks;
        let mut keep = Vec::new();
        for t in self.transfers.drain(..) {
            let outcome = if term > t.start_term && leader_id == Some(t.to) {
                Some(Ok(Transferred {
                    from: t.from,
                    to: t.to,
                    term,
                }))
            } else if let (true, Some(other)) = (term > t.start_term, leader_id) {
                Some(Err(TransferError::Superseded {
                    to: t.to,
                    leader_id: other,
                    term,
                }))
            } else if t.from == id
                && state == StateRole::Leader
                && term == t.start_term
                && transferee != Some(t.to)
            {
                Some(Err(TransferError::Refused {
                    to: t.to,
                    term: t.start_term,
                }))
            } else if t.ticks_left == 0 {
                Some(Err(TransferError::TimedOut { to: t.to, ticks }))
            } else {
                None
            };
            match outcome {
                Some(result) => {
                    match &result {
                        Ok(done) => info!(
                            from = done.from,
                            to = done.to,
                            term = done.term,
                            "leadership transferred"
                        ),
                        Err(err) => warn!(to = t.to, cause = %err, "leadership transfer failed"),
                    }
                    let _ = t.reply.send(result);
                }
                None => keep.push(t),
            }
        }
        self.transfers = keep;
    }
}
