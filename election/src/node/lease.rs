//! Lease requests in the election loop: each is answered only after a `ReadIndex` round
//! started after it arrived is confirmed by a quorum, so a grant proves that this node
//! led at some moment after the proxy sent its request.
//!
//! Requests that arrive while a round is in flight wait for the next one: one
//! `read_index` per batch, not per request, so the cost to the cluster grows with the
//! number of batches, not of proxies. A round is abandoned (its requests answered
//! not-leader or timed out, never left hanging) when this node loses leadership or its
//! term changes, and after [`LEASE_ROUND_TIMEOUT_MS`].

use std::time::Duration;

use raft::{ReadState, StateRole};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::debug;

use super::LeaseError;
use super::ready::ElectionLoop;

/// The longest a `ReadIndex` round may stay unconfirmed before its requests are answered
/// timed out and the next batch gets a round of its own. raft-rs keeps an unconfirmed
/// read for ever while the leader keeps its term (heartbeat acks lost, or the leader has
/// not yet committed an entry of its term); the API gives up on each request after at
/// most the same time, so a longer round would only answer requests nobody waits for.
pub const LEASE_ROUND_TIMEOUT_MS: u64 = 2_000;

/// The answer to one lease request: the term confirmed by a quorum.
pub(crate) type LeaseReply = oneshot::Sender<Result<u64, LeaseError>>;

/// A `ReadIndex` round in flight.
struct Round {
    /// The `read_index` context that identifies this round's `ReadState`.
    ctx: Vec<u8>,
    /// The term the round was started in: the grant's term if it is confirmed in it.
    term: u64,
    started: Instant,
    waiters: Vec<LeaseReply>,
}

/// The lease requests the loop holds: at most one round in flight, and the batch that
/// waits for the next one.
#[derive(Default)]
pub(super) struct LeaseRounds {
    /// Numbers the rounds, so a late `ReadState` of an abandoned round is ignored.
    next_round: u64,
    in_flight: Option<Round>,
    waiting: Vec<LeaseReply>,
}

/// The context prefix of this module's `read_index` calls.
const CTX_PREFIX: &[u8] = b"lease:";

impl ElectionLoop {
    /// Whether raft backs a lease now: leader and not handing leadership over.
    fn leads_for_lease(&self) -> bool {
        let r = &self.raw_node.raft;
        r.state == StateRole::Leader && r.lead_transferee.is_none()
    }

    /// A lease request from the API: refused at once unless this node leads, else queued
    /// for the next round (started by [`ElectionLoop::lease_cycle`]).
    pub(super) fn on_lease(&mut self, reply: LeaseReply) {
        if self.leads_for_lease() {
            self.leases.waiting.push(reply);
            self.count_pending();
        } else {
            let _ = reply.send(Err(LeaseError::NotLeader {
                leader_id: self.leader_id(),
            }));
        }
    }

    /// Answers the round a `ReadState` confirms. Called with a Ready's read states;
    /// does not step raft, so it is safe inside a Ready.
    pub(super) fn on_read_states(&mut self, states: &[ReadState]) {
        for state in states {
            let matches = self
                .leases
                .in_flight
                .as_ref()
                .is_some_and(|round| round.ctx == state.request_ctx);
            if !matches {
                debug!(
                    index = state.index,
                    "read state of no pending lease round ignored"
                );
                continue;
            }
            let Some(round) = self.leases.in_flight.take() else {
                continue;
            };
            // Confirmed: a quorum acknowledged this node as leader of `round.term` after
            // every request of the round arrived. If the term moved on meanwhile, the
            // confirmation is of a term this node no longer leads.
            let r = &self.raw_node.raft;
            let outcome = if self.leads_for_lease() && r.term == round.term {
                self.metrics
                    .lease_grants
                    .increment(round.waiters.len() as u64);
                Ok(round.term)
            } else {
                Err(LeaseError::NotLeader {
                    leader_id: self.leader_id(),
                })
            };
            for waiter in round.waiters {
                let _ = waiter.send(outcome.clone());
            }
        }
        self.count_pending();
    }

    /// Between Readys: answers every request leadership no longer backs, abandons a
    /// round that timed out, and starts a round for the waiting batch when none is in
    /// flight. True when it started one (its messages wait in the next Ready).
    pub(super) fn lease_cycle(&mut self) -> bool {
        let leads = self.leads_for_lease();
        let term = self.raw_node.raft.term;
        let not_leader = LeaseError::NotLeader {
            leader_id: self.leader_id(),
        };
        if let Some(round) = self.leases.in_flight.take() {
            let waited = round.started.elapsed();
            if !leads || round.term != term {
                answer(round.waiters, &not_leader);
            } else if waited >= Duration::from_millis(LEASE_ROUND_TIMEOUT_MS) {
                let waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
                answer(round.waiters, &LeaseError::TimedOut { waited_ms });
            } else {
                self.leases.in_flight = Some(round);
            }
        }
        if !leads {
            answer(std::mem::take(&mut self.leases.waiting), &not_leader);
            self.count_pending();
            return false;
        }
        if self.leases.in_flight.is_some() || self.leases.waiting.is_empty() {
            self.count_pending();
            return false;
        }
        self.leases.next_round += 1;
        let mut ctx = CTX_PREFIX.to_vec();
        ctx.extend_from_slice(&self.leases.next_round.to_be_bytes());
        self.raw_node.read_index(ctx.clone());
        self.metrics.lease_rounds.increment(1);
        self.leases.in_flight = Some(Round {
            ctx,
            term,
            started: Instant::now(),
            waiters: std::mem::take(&mut self.leases.waiting),
        });
        self.count_pending();
        true
    }

    /// Sets the pending-requests gauge.
    #[allow(clippy::cast_precision_loss)] // a gauge is f64; the count is a few hundred
    fn count_pending(&self) {
        let in_flight = self
            .leases
            .in_flight
            .as_ref()
            .map_or(0, |r| r.waiters.len());
        self.metrics
            .lease_pending
            .set((in_flight + self.leases.waiting.len()) as f64);
    }

    /// When the pending round times out, so the loop wakes to abandon it.
    pub(super) fn lease_round_deadline(&self) -> Option<Instant> {
        self.leases
            .in_flight
            .as_ref()
            .map(|round| round.started + Duration::from_millis(LEASE_ROUND_TIMEOUT_MS))
    }

    /// At stop: every pending request is answered.
    pub(super) fn stop_leases(&mut self) {
        if let Some(round) = self.leases.in_flight.take() {
            answer(round.waiters, &LeaseError::Stopped);
        }
        answer(
            std::mem::take(&mut self.leases.waiting),
            &LeaseError::Stopped,
        );
    }
}

fn answer(waiters: Vec<LeaseReply>, err: &LeaseError) {
    for waiter in waiters {
        let _ = waiter.send(Err(err.clone()));
    }
}
