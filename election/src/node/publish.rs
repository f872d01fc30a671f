//! The leadership watch: turning raft's state into the published [`Leadership`] after
//! every cycle, with the log events and metrics that go with each change.

use raft::StateRole;
use tracing::info;

use palisade_protocol::process::events;

use super::ready::ElectionLoop;
use crate::leadership::{Leadership, Role, role_of};

impl ElectionLoop {
    /// Withdraws a published token as soon as raft no longer backs it, leaving every other
    /// field as published (those wait for the Ready to be persisted).
    pub(super) fn withdraw_token_if_lost(&mut self) {
        let r = &self.raw_node.raft;
        let backed = |token: u64| {
            r.state == StateRole::Leader && r.term == token && r.lead_transferee.is_none()
        };
        let withdrawn = self.leadership.send_if_modified(|l| match l.token {
            Some(token) if !backed(token) => {
                l.token = None;
                l.announced = false;
                l.proof = None;
                true
            }
            _ => false,
        });
        if withdrawn {
            self.metrics.token.set(0.0);
            self.metrics.announced.set(0.0);
            info!(term = r.term, "token withdrawn");
        }
    }

    /// Publishes the leadership after a cycle, keyed on `(term, role)`: `ss` in a `Ready`
    /// is not enough (a check-quorum step-down keeps the term).
    #[allow(clippy::cast_precision_loss)] // gauges are f64; terms stay far below 2^52
    pub(super) fn publish(&mut self) {
        let r = &self.raw_node.raft;
        let role = role_of(r.state);
        // Established: leader, has applied an entry of its own term, not handing over.
        let established = r.state == StateRole::Leader
            && r.apply_to_current_term()
            && r.lead_transferee.is_none();
        let token = established.then_some(r.term);
        let prev = *self.leadership.borrow();
        let announced = match token {
            Some(t) if prev.token == Some(t) => prev.announced,
            Some(_) => self.no_proxies,
            None => false,
        };
        // Signed once per token, when it becomes available (an Ed25519 signature takes
        // tens of microseconds), and withdrawn with it.
        let proof = match (token, &self.signer) {
            (Some(t), Some(_)) if prev.token == Some(t) && prev.proof.is_some() => prev.proof,
            (Some(t), Some(signer)) => Some(signer.sign(t)),
            _ => None,
        };
        let next = Leadership {
            term: r.term,
            leader_id: self.leader_id(),
            role,
            token,
            announced,
            proof,
        };
        if next == prev {
            return;
        }
        assert!(
            next.term >= prev.term,
            "raft term went back from {} to {}",
            prev.term,
            next.term
        );
        if role == Role::Leader && !(prev.role == Role::Leader && prev.term == next.term) {
            self.metrics.elections_won.increment(1);
            info!(
                event = events::LEADERSHIP_CHANGED,
                term = next.term,
                "became leader"
            );
        }
        if role != prev.role {
            info!(
                event = events::LEADERSHIP_CHANGED,
                term = next.term,
                role = %role,
                previous = %prev.role,
                "role changed"
            );
        }
        if next.leader_id != prev.leader_id && next.leader_id.is_some() {
            self.metrics.leader_changes.increment(1);
            info!(
                event = events::LEADERSHIP_CHANGED,
                term = next.term,
                leader_id = ?next.leader_id,
                "leader changed"
            );
        }
        if token != prev.token {
            if let Some(t) = token {
                info!(
                    event = events::LEADER_ESTABLISHED,
                    term = next.term,
                    token = t,
                    "established leader: token available"
                );
            } else {
                // No `event` field: `withdraw_token_if_lost` logs withdrawals before the
                // Ready that carries their term is persisted, and every event's term must
                // be durable, so withdrawals are never events.
                info!(term = next.term, previous = ?prev.token, "token withdrawn");
            }
        }
        self.metrics.term.set(next.term as f64);
        self.metrics
            .is_leader
            .set(if role == Role::Leader { 1.0 } else { 0.0 });
        self.metrics.token.set(token.unwrap_or(0) as f64);
        self.metrics
            .announced
            .set(if announced { 1.0 } else { 0.0 });
        self.leadership.send_replace(next);
    }
}
