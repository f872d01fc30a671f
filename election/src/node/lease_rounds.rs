//! Lease requests in the election loop: each is answered only after a `ReadIndex` round
//! started after it arrived is confirmed by a quorum, so a grant proves that this node
//! led at some moment after the proxy sent its request.
//!
//! The leader gathers requests: a request waits for the next round, and rounds start at
//! most once per gather interval ([`lease_gather_interval`]). One round answers every
//! request that arrived before it started, so the cluster's cost grows with the number
//! of rounds, which the interval bounds, not with the number of proxies. A request that
//! finds no round started within the last interval (an idle leader) starts one at once.
//! An urgent request (a proxy holds a write until it is answered, as after a failover)
//! is not held for the interval: it starts a round as soon as none is in flight, and the
//! requests gathered so far ride along. A round is abandoned (its
//! requests answered not-leader or timed out, never left hanging) when this node loses
//! leadership or its term changes, and after [`LEASE_ROUND_TIMEOUT_MS`].

use std::time::Duration;

use raft::{ReadState, StateRole};
use tokio::time::Instant;
use tracing::debug;

use super::error::LeaseError;
use super::inbox::LeaseReply;
use super::ready::ElectionLoop;
use crate::config::NodeConfig;

/// The longest a `ReadIndex` round may stay unconfirmed before its requests are answered
/// timed out and the next batch gets a round of its own. raft-rs keeps an unconfirmed
/// read for ever while the leader keeps its term (heartbeat acks lost, or the leader has
/// not yet committed an entry of its term); the API gives up on each request after at
/// most the same time, so a longer round would only answer requests nobody waits for.
pub const LEASE_ROUND_TIMEOUT_MS: u64 = 2_000;

/// The gather interval is `lease_ms` divided by this (at most [`LEASE_GATHER_MS_MAX`]).
/// A background renewal may wait one interval before its round starts, and the proxy
/// counts its lease from when it sent the request, so the wait is taken off the lease it
/// gets: a tenth is small against the two thirds of a lease a renewal has before the
/// lease lapses (proxies renew every third). Proxies renew on their own timers, at fixed
/// phases, so one round gathers the proxies whose phases fall within one interval; a
/// tenth of the lease (three gathers per renewal period) bounds the rounds to about ten
/// per lease, whatever the size of the fleet.
pub const LEASE_GATHER_LEASE_DIVISOR: u64 = 10;
/// The longest gather interval, in milliseconds, however long the lease. A proxy gives up
/// on a node after `limits.lease_renew_timeout_ms` (1 s by default) and asks the other
/// nodes after its hedge delay (500 ms): a gathered request must be answered well within
/// both, so a long lease does not make healthy leaders look dead.
pub const LEASE_GATHER_MS_MAX: u64 = 300;

/// How often this node starts a round for background renewals at most: `lease_ms /`
/// [`LEASE_GATHER_LEASE_DIVISOR`], at most [`LEASE_GATHER_MS_MAX`].
pub(crate) fn lease_gather_interval(config: &NodeConfig) -> Duration {
    Duration::from_millis((config.lease_ms / LEASE_GATHER_LEASE_DIVISOR).min(LEASE_GATHER_MS_MAX))
}

/// A `ReadIndex` round in flight.
struct Round {
    /// The `read_index` context that identifies this round's `ReadState`.
    ctx: Vec<u8>,
    /// The term the round was started in: the grant's term if it is confirmed in it.
    term: u64,
    started: Instant,
    /// Every request that arrived before the round started, and none that came later.
    waiters: Vec<LeaseReply>,
}

/// The lease requests the loop holds: at most one round in flight, and the batch that
/// waits for the next one. Pure bookkeeping (no raft), so the gathering is tested on
/// its own.
pub(super) struct LeaseRounds {
    /// The least time between the starts of two rounds.
    gather: Duration,
    /// Numbers the rounds, so a late `ReadState` of an abandoned round is ignored.
    next_round: u64,
    /// When the last round started; `None` before the first.
    last_start: Option<Instant>,
    in_flight: Option<Round>,
    waiting: Vec<LeaseReply>,
    /// Whether a waiting request is urgent.
    urgent: bool,
}

/// The context prefix of this module's `read_index` calls.
const CTX_PREFIX: &[u8] = b"lease:";

impl LeaseRounds {
    /// No requests yet; rounds start at most once per `gather`.
    pub(super) fn new(gather: Duration) -> Self {
        Self {
            gather,
            next_round: 0,
            last_start: None,
            in_flight: None,
            waiting: Vec::new(),
            urgent: false,
        }
    }

    /// Queues a request for the next round.
    fn push(&mut self, reply: LeaseReply) {
        self.urgent |= reply.urgent;
        self.waiting.push(reply);
    }

    /// The earliest moment the next round may start: one gather interval after the last
    /// start (`None`: at once).
    fn next_start(&self) -> Option<Instant> {
        self.last_start.map(|at| at + self.gather)
    }

    /// Whether a round should start now: requests wait, none is in flight, and one of
    /// them is urgent or the gather interval since the last start has passed.
    fn due(&self, now: Instant) -> bool {
        self.in_flight.is_none()
            && !self.waiting.is_empty()
            && (self.urgent || self.next_start().is_none_or(|at| now >= at))
    }

    /// Starts a round in `term` for every request waiting now; returns its `read_index`
    /// context.
    fn start(&mut self, term: u64, now: Instant) -> Vec<u8> {
        self.next_round += 1;
        let mut ctx = CTX_PREFIX.to_vec();
        ctx.extend_from_slice(&self.next_round.to_be_bytes());
        self.last_start = Some(now);
        self.urgent = false;
        self.in_flight = Some(Round {
            ctx: ctx.clone(),
            term,
            started: now,
            waiters: std::mem::take(&mut self.waiting),
        });
        ctx
    }

    /// Takes the round in flight if `ctx` is its context.
    fn confirmed(&mut self, ctx: &[u8]) -> Option<Round> {
        if self
            .in_flight
            .as_ref()
            .is_some_and(|round| round.ctx == ctx)
        {
            self.in_flight.take()
        } else {
            None
        }
    }

    /// Requests held: in the round in flight and waiting for the next.
    fn pending(&self) -> usize {
        self.in_flight.as_ref().map_or(0, |r| r.waiters.len()) + self.waiting.len()
    }

    /// When the loop must wake for the leases: the round in flight's timeout, or, with
    /// requests waiting and none in flight, the start of the next round.
    fn deadline(&self) -> Option<Instant> {
        match &self.in_flight {
            Some(round) => Some(round.started + Duration::from_millis(LEASE_ROUND_TIMEOUT_MS)),
            None if self.urgent => Some(Instant::now()),
            None if !self.waiting.is_empty() => self.next_start(),
            None => None,
        }
    }
}

impl ElectionLoop {
    /// Whether raft backs a lease now: leader and not handing leadership over.
    fn leads_for_lease(&self) -> bool {
        let r = &self.raw_node.raft;
        r.state == StateRole::Leader && r.lead_transferee.is_none()
    }

    /// A lease request from the API: refused at once unless this node leads, else queued
    /// for the next round (started by [`ElectionLoop::lease_cycle`], at once when it is
    /// urgent and none is in flight).
    pub(super) fn on_lease(&mut self, reply: LeaseReply) {
        if self.leads_for_lease() {
            self.leases.push(reply);
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
            let Some(round) = self.leases.confirmed(&state.request_ctx) else {
                debug!(
                    index = state.index,
                    "read state of no pending lease round ignored"
                );
                continue;
            };
            // Confirmed: a quorum acknowledged this node as leader of `round.term` after
            // every request of the round arrived (they all arrived before it started).
            // If the term moved on meanwhile, the confirmation is of a term this node no
            // longer leads.
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
    /// flight and the gather interval has passed. True when it started one (its messages
    /// wait in the next Ready).
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
            self.leases.urgent = false;
            self.count_pending();
            return false;
        }
        if !self.leases.due(Instant::now()) {
            self.count_pending();
            return false;
        }
        let ctx = self.leases.start(term, Instant::now());
        self.raw_node.read_index(ctx);
        self.metrics.lease_rounds.increment(1);
        self.count_pending();
        true
    }

    /// Sets the pending-requests gauge.
    #[allow(clippy::cast_precision_loss)] // a gauge is f64; the count is a few hundred
    fn count_pending(&self) {
        self.metrics.lease_pending.set(self.leases.pending() as f64);
    }

    /// When the loop must wake for the leases: the round in flight times out, or the
    /// gathered requests' round may start.
    pub(super) fn lease_round_deadline(&self) -> Option<Instant> {
        self.leases.deadline()
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
        self.leases.urgent = false;
    }
}

fn answer(waiters: Vec<LeaseReply>, err: &LeaseError) {
    for waiter in waiters {
        let _ = waiter.send(Err(err.clone()));
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;

    const GATHER: Duration = Duration::from_millis(100);

    /// A background request as the API sends it, and the end its answer arrives at.
    fn request() -> (LeaseReply, oneshot::Receiver<Result<u64, LeaseError>>) {
        let (tx, rx) = oneshot::channel();
        (LeaseReply::new(tx, false), rx)
    }

    /// An urgent request (a write waits for it).
    fn urgent() -> (LeaseReply, oneshot::Receiver<Result<u64, LeaseError>>) {
        let (tx, rx) = oneshot::channel();
        (LeaseReply::new(tx, true), rx)
    }

    /// What the loop does with a confirmed round: answer its waiters with its term.
    fn confirm(rounds: &mut LeaseRounds, ctx: &[u8]) -> usize {
        let round = rounds.confirmed(ctx).expect("the round in flight");
        let answered = round.waiters.len();
        for waiter in round.waiters {
            waiter.send(Ok(round.term)).unwrap();
        }
        answered
    }

    /// Goal: the requests of one gather interval share one round, that round starts only
    /// once the interval since the last start has passed, and its confirmation answers
    /// exactly the requests that arrived before it started: a request arriving while it
    /// is in flight is answered only by the next round.
    /// Method: paused time; a first request starts a round at once; ten more arrive
    /// spread over the next 90 ms and must wait (not due, the deadline is the interval's
    /// end); at the deadline one round takes all ten; one more request arrives while it
    /// is in flight and stays unanswered by its confirmation.
    #[tokio::test(start_paused = true)]
    async fn requests_of_one_interval_share_one_round_started_after_them() {
        let mut rounds = LeaseRounds::new(GATHER);
        let t0 = Instant::now();
        let (first, mut first_rx) = request();
        rounds.push(first);
        assert!(rounds.due(t0), "an idle leader starts a round at once");
        let ctx1 = rounds.start(7, t0);
        assert_eq!(confirm(&mut rounds, &ctx1), 1);
        assert_eq!(first_rx.try_recv().unwrap().unwrap(), 7);

        let mut gathered = Vec::new();
        for _ in 0..10 {
            tokio::time::advance(Duration::from_millis(9)).await;
            let (tx, rx) = request();
            rounds.push(tx);
            gathered.push(rx);
            assert!(
                !rounds.due(Instant::now()),
                "no second round inside the interval"
            );
        }
        assert_eq!(rounds.deadline(), Some(t0 + GATHER));
        tokio::time::sleep_until(rounds.deadline().unwrap()).await;
        assert!(rounds.due(Instant::now()));
        let ctx2 = rounds.start(7, Instant::now());
        assert_eq!(rounds.next_round, 2, "ten requests, one round");

        let (late, mut late_rx) = request();
        rounds.push(late);
        assert!(!rounds.due(Instant::now()), "one round in flight at a time");
        assert_eq!(confirm(&mut rounds, &ctx2), 10);
        for mut rx in gathered {
            assert_eq!(rx.try_recv().unwrap().unwrap(), 7);
        }
        assert!(
            late_rx.try_recv().is_err(),
            "a request that arrived after the round started is not answered by it"
        );
        assert_eq!(rounds.pending(), 1);
        // Its own round starts one interval after the last start, not before.
        assert!(!rounds.due(Instant::now()));
        tokio::time::advance(GATHER).await;
        assert!(rounds.due(Instant::now()));
        let ctx3 = rounds.start(7, Instant::now());
        assert_eq!(confirm(&mut rounds, &ctx3), 1);
        assert_eq!(late_rx.try_recv().unwrap().unwrap(), 7);
    }

    /// Goal: a late or foreign read state answers nothing, and the deadline is the round
    /// timeout while a round is in flight, nothing when idle.
    /// Method: start a round, confirm another context, check the deadline.
    #[tokio::test(start_paused = true)]
    async fn only_the_round_in_flight_is_confirmed() {
        let mut rounds = LeaseRounds::new(GATHER);
        assert_eq!(rounds.deadline(), None);
        let (tx, mut rx) = request();
        rounds.push(tx);
        let now = Instant::now();
        let ctx = rounds.start(3, now);
        assert!(rounds.confirmed(b"lease:\0\0\0\0\0\0\0\x09").is_none());
        assert!(rounds.confirmed(b"other").is_none());
        assert_eq!(
            rounds.deadline(),
            Some(now + Duration::from_millis(LEASE_ROUND_TIMEOUT_MS))
        );
        assert!(rx.try_recv().is_err());
        assert_eq!(confirm(&mut rounds, &ctx), 1);
        assert_eq!(rounds.deadline(), None);
    }

    /// Goal: an urgent request is not held for the gather interval: it starts a round
    /// at once when none is in flight, the background requests gathered so far ride
    /// along, and otherwise it starts the next round as soon as the one in flight ends.
    /// Method: paused time; a round, then background requests inside the interval (not
    /// due), then an urgent one (due at once, one round for all); then an urgent request
    /// while a round is in flight.
    #[tokio::test(start_paused = true)]
    async fn an_urgent_request_starts_a_round_without_gathering() {
        let mut rounds = LeaseRounds::new(GATHER);
        let (first, _first_rx) = request();
        rounds.push(first);
        let ctx = rounds.start(2, Instant::now());
        confirm(&mut rounds, &ctx);
        tokio::time::advance(Duration::from_millis(10)).await;
        let (background, mut background_rx) = request();
        rounds.push(background);
        assert!(!rounds.due(Instant::now()));
        let (write, mut write_rx) = urgent();
        rounds.push(write);
        assert!(
            rounds.due(Instant::now()),
            "an urgent request does not gather"
        );
        assert_eq!(rounds.deadline(), Some(Instant::now()));
        let ctx = rounds.start(2, Instant::now());
        assert_eq!(
            confirm(&mut rounds, &ctx),
            2,
            "the gathered request rides along"
        );
        assert_eq!(background_rx.try_recv().unwrap().unwrap(), 2);
        assert_eq!(write_rx.try_recv().unwrap().unwrap(), 2);

        let (background, _rx) = request();
        rounds.push(background);
        let ctx = rounds.start(2, Instant::now());
        let (write, _write_rx) = urgent();
        rounds.push(write);
        assert!(!rounds.due(Instant::now()), "one round in flight at a time");
        confirm(&mut rounds, &ctx);
        assert!(
            rounds.due(Instant::now()),
            "due as soon as the round in flight ended"
        );
    }

    /// Goal: the gather interval is a tenth of the lease, capped. Method: leases either
    /// side of the cap.
    #[test]
    fn gather_interval_is_a_tenth_of_the_lease_capped() {
        let mut config = NodeConfig {
            lease_ms: 1_000,
            ..NodeConfig::default()
        };
        assert_eq!(lease_gather_interval(&config), Duration::from_millis(100));
        config.lease_ms = 3_000;
        assert_eq!(
            lease_gather_interval(&config),
            Duration::from_millis(LEASE_GATHER_MS_MAX)
        );
        config.lease_ms = 60_000;
        assert_eq!(
            lease_gather_interval(&config),
            Duration::from_millis(LEASE_GATHER_MS_MAX)
        );
    }
}
