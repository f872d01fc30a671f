//! The leadership watch: turning raft's state into the published [`Leadership`] after
//! every cycle, with the log events and metrics that go with each change.

use raft::StateRole;
use tokio::time::Instant;
use tracing::info;

use palisade_protocol::process::events;

use super::ready::ElectionLoop;
use crate::leadership::{Leadership, ReleasedBy, Role, role_of};

impl ElectionLoop {
    /// Withdraws a published token as soon as raft no longer backs it, leaving every other
    /// field as published (those wait for the Ready to be persisted).
    pub(super) fn withdraw_token_if_lost(&mut self) {
        let r = &self.raw_node.raft;
        let backed = |token: u64| {
            r.state == StateRole::Leader && r.term == token && r.lead_transferee.is_none()
        };
        let withdrawn = self.leadership.send_if_modified(|l| match l.established {
            Some(term) if !backed(term) => {
                l.token = None;
                l.established = None;
                l.released_by = None;
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
        let established = (r.state == StateRole::Leader
            && r.apply_to_current_term()
            && r.lead_transferee.is_none())
        .then_some(r.term);
        let prev = *self.leadership.borrow();
        let announced = match established {
            Some(t) if prev.established == Some(t) => prev.announced,
            Some(_) => self.no_proxies,
            None => false,
        };
        // The release clock starts when this loop first sees the term established: no
        // earlier than the real moment, so the wait is never shorter than required.
        self.established_at = match (established, self.established_at) {
            (Some(t), Some((at_term, at))) if at_term == t => Some((t, at)),
            (Some(t), _) => Some((t, Instant::now())),
            (None, _) => None,
        };
        let released_by = match established {
            None => None,
            Some(t) if prev.token == Some(t) => prev.released_by,
            Some(_) => self.release_cause(announced),
        };
        let token = established.filter(|_| released_by.is_some());
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
            established,
            released_by,
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
        if established != prev.established
            && let Some(t) = established
            && token.is_none()
        {
            info!(
                event = events::LEADER_ESTABLISHED,
                term = next.term,
                token = t,
                release_wait_ms = self.release_wait.map(|w| w.as_millis() as u64),
                "established leader: token held back until every proxy accepted the \
                 term or the release wait passed"
            );
        }
        if token != prev.token {
            if let Some(t) = token {
                if prev.established != Some(t) {
                    info!(
                        event = events::LEADER_ESTABLISHED,
                        term = next.term,
                        token = t,
                        "established leader: token available"
                    );
                }
                if self.release_wait.is_some() {
                    self.log_release(t, released_by);
                }
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

    /// Whether a newly established, not yet released term may be released now, and why.
    fn release_cause(&self, announced: bool) -> Option<ReleasedBy> {
        let Some(wait) = self.release_wait else {
            return Some(ReleasedBy::Establishment);
        };
        if announced {
            return Some(ReleasedBy::Announce);
        }
        let waited = self.established_at.map(|(_, at)| at.elapsed());
        waited
            .is_some_and(|waited| waited >= wait)
            .then_some(ReleasedBy::LeaseExpiry)
    }

    /// When a held-back token is released by the wait alone: `None` when there is no
    /// held-back token (leases off, not established, or released already).
    pub(super) fn release_deadline(&self) -> Option<Instant> {
        let wait = self.release_wait?;
        let (term, at) = self.established_at?;
        let l = self.leadership.borrow();
        (l.established == Some(term) && l.token.is_none()).then_some(at + wait)
    }

    /// Logs and counts a release with leases on.
    fn log_release(&self, token: u64, by: Option<ReleasedBy>) {
        let by = by.unwrap_or(ReleasedBy::Establishment);
        match by {
            ReleasedBy::Announce => self.metrics.released_by_announce.increment(1),
            ReleasedBy::LeaseExpiry => self.metrics.released_by_lease_expiry.increment(1),
            ReleasedBy::Establishment => {}
        }
        let waited_ms = self
            .established_at
            .map(|(_, at)| u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX));
        info!(
            event = events::TOKEN_RELEASED,
            term = token,
            token,
            by = by.as_str(),
            waited_ms,
            "token released"
        );
    }
}
