//! The election loop's score state: what this node and its peers score, the frames that
//! share it, the election timeout of this node's rank, the leader's resignation check,
//! and the `scores` of the leader view.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use metrics::Counter;
use raft::{RawNode, StateRole};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info};

use palisade_protocol::process::events;
use palisade_storage::RaftLog;

use super::order::{self, Contender};
use super::resign::{Follower, ResignTracker};
use super::rtt::{RttWindow, theta_c};
use super::timeout::election_timeout;
use super::{
    SCORE_LEASE_GRACE_TICKS, SCORE_RANK_SLOT_TICKS, SCORE_SHARE_TICKS, SCORE_STALE_ELECTIONS,
    ScoreOracle,
};
use crate::config::NodeConfig;
use crate::transport::{ScoreFrame, Transport};

/// What the leader view shows: the oracle and the fresh scores by node id, this node's
/// included once it has one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ScoreView {
    /// This node's oracle.
    pub oracle: ScoreOracle,
    /// Fresh scores by node id.
    pub scores: BTreeMap<u64, f64>,
}

/// The view shared with the API: written by the election loop once per tick, read per
/// request.
pub(crate) type SharedScoreView = Arc<Mutex<ScoreView>>;

/// Reads a shared view (the lock is only held to copy or replace the map, so a poisoned
/// one still holds a consistent view).
pub(crate) fn read_view(view: &SharedScoreView) -> ScoreView {
    view.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// One peer as this node last heard it.
#[derive(Debug, Default)]
struct Peer {
    /// Its last frame and when it arrived (`None`: never heard).
    last: Option<(ScoreFrame, Instant)>,
    /// Round trips measured from its echoes of this node's frames.
    rtt: RttWindow,
    /// The newest echo already turned into a sample, so one echo counts once.
    sampled_echo_us: u64,
    /// Heard from for the first time since this node started, not yet looked at by
    /// [`ScoreBoard::set_timeout`].
    first_contact: bool,
}

/// The election loop's score state; `None` in the loop when no oracle is configured.
pub(crate) struct ScoreBoard {
    id: u64,
    oracle: ScoreOracle,
    static_score: f64,
    margin: f64,
    hold: Duration,
    stale: Duration,
    min_tick: usize,
    max_tick: usize,
    slot: usize,
    /// Zero of the microsecond clock in frames (`sent_us`).
    epoch: Instant,
    /// Ticks since the last frames were sent.
    ticks_since_share: u64,
    /// The `storage-rtt` prober's worst median round trip, in milliseconds.
    storage_rtt: Option<watch::Receiver<Option<f64>>>,
    peers: BTreeMap<u64, Peer>,
    /// This node's score at the last tick.
    own: Option<f64>,
    /// The random part of the timeout and the term it was drawn for.
    jitter: (u64, usize),
    /// Ticks this node has spent campaigning since it last knew a leader (see
    /// [`ScoreBoard::refuses_pre_vote`]).
    campaign_ticks: u64,
    /// The last leader this node knew (for `rotating`).
    last_leader: Option<u64>,
    resign: ResignTracker,
    view: SharedScoreView,
    transfers: Counter,
}

impl ScoreBoard {
    /// A board for `config` (which has an oracle), the prober's watch for `storage-rtt`,
    /// and the counter of score transfers.
    pub(crate) fn new(
        config: &NodeConfig,
        oracle: ScoreOracle,
        storage_rtt: Option<watch::Receiver<Option<f64>>>,
        transfers: Counter,
    ) -> Self {
        let min_tick = usize::try_from(config.election_ticks).unwrap_or(usize::MAX);
        let slot = usize::try_from(SCORE_RANK_SLOT_TICKS).unwrap_or(1);
        let stale_ticks = config
            .election_ticks
            .saturating_mul(SCORE_STALE_ELECTIONS)
            .max(1);
        let stale = config
            .tick()
            .saturating_mul(u32::try_from(stale_ticks).unwrap_or(u32::MAX));
        Self {
            id: config.id,
            oracle,
            static_score: config.score,
            margin: config.score_margin,
            hold: Duration::from_millis(config.score_hold_ms),
            stale,
            min_tick,
            max_tick: super::max_election_tick(min_tick, config.peers.len()),
            slot,
            epoch: Instant::now(),
            ticks_since_share: 0,
            storage_rtt,
            peers: BTreeMap::new(),
            own: None,
            jitter: (0, 0),
            campaign_ticks: 0,
            last_leader: None,
            resign: ResignTracker::default(),
            view: Arc::new(Mutex::new(ScoreView {
                oracle,
                scores: BTreeMap::new(),
            })),
            transfers,
        }
    }

    /// The view the API reads.
    pub(crate) fn view(&self) -> SharedScoreView {
        Arc::clone(&self.view)
    }

    fn now_us(&self, now: Instant) -> u64 {
        // Never 0: 0 means "no echo" on the wire.
        u64::try_from(now.saturating_duration_since(self.epoch).as_micros())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    /// A peer's frame, if it is fresh at `now`.
    fn fresh(&self, id: u64, now: Instant) -> Option<&ScoreFrame> {
        let (frame, at) = self.peers.get(&id)?.last.as_ref()?;
        (now.saturating_duration_since(*at) <= self.stale).then_some(frame)
    }

    /// A frame from peer `from` (already checked by the transport, and `from` is a
    /// voter): remembered, and its echo of one of this node's frames becomes a round-trip
    /// sample.
    pub(crate) fn on_frame(&mut self, from: u64, frame: ScoreFrame) {
        if from == self.id {
            return;
        }
        let now = Instant::now();
        let now_us = self.now_us(now);
        let peer = self.peers.entry(from).or_default();
        if frame.echo_us != 0 && frame.echo_us > peer.sampled_echo_us && frame.echo_us <= now_us {
            peer.sampled_echo_us = frame.echo_us;
            // The time since this node sent the echoed frame, less the time the peer held
            // it: the network's (and both inboxes') round trip.
            if let Some(rtt_us) = (now_us - frame.echo_us).checked_sub(frame.echo_held_us) {
                #[allow(clippy::cast_precision_loss)] // microseconds: far below 2^52
                peer.rtt.push(rtt_us as f64 / 1_000.0);
            }
        }
        if peer.last.is_none() {
            peer.first_contact = true;
        }
        peer.last = Some((frame, now));
    }

    /// This node's score now.
    fn own_score(&self, raw_node: &RawNode<RaftLog>, voters: &[u64], now: Instant) -> Option<f64> {
        match self.oracle {
            ScoreOracle::Static => Some(self.static_score),
            ScoreOracle::StorageRtt => self
                .storage_rtt
                .as_ref()
                .and_then(|rx| *rx.borrow())
                .map(|ms| -ms),
            ScoreOracle::ConsensusLatency => {
                let rtts = voters
                    .iter()
                    .filter(|id| **id != self.id && self.fresh(**id, now).is_some())
                    .filter_map(|id| self.peers.get(id).and_then(|p| p.rtt.median()));
                theta_c(voters.len(), rtts).map(|ms| -ms)
            }
            ScoreOracle::Rotating => {
                if raw_node.raft.state == StateRole::Leader {
                    return Some(1.0);
                }
                let successor = self.last_leader.and_then(|leader| {
                    voters
                        .iter()
                        .copied()
                        .find(|id| *id > leader)
                        .or_else(|| voters.first().copied())
                });
                Some(if successor == Some(self.id) { 1.0 } else { 0.0 })
            }
        }
    }

    /// Once per tick, before raft's tick: computes this node's score, shares it, publishes
    /// the view, and then, as a follower or candidate, sets raft's election timeout from
    /// this node's rank; as the leader, returns the follower to hand leadership to, if
    /// one has been better for longer than the hold time.
    pub(crate) fn on_tick(
        &mut self,
        raw_node: &mut RawNode<RaftLog>,
        transport: &mut dyn Transport,
    ) -> Option<u64> {
        let now = Instant::now();
        let voters: Vec<u64> = {
            let mut v: Vec<u64> = raw_node.raft.prs().conf().voters().ids().iter().collect();
            v.sort_unstable();
            v
        };
        let leader_id = raw_node.raft.leader_id;
        if leader_id != 0 {
            self.last_leader = Some(leader_id);
        }
        self.campaign_ticks = match raw_node.raft.state {
            StateRole::PreCandidate | StateRole::Candidate => self.campaign_ticks.saturating_add(1),
            StateRole::Follower | StateRole::Leader => 0,
        };
        self.own = self.own_score(raw_node, &voters, now);
        let log = (
            raw_node.raft.raft_log.last_term(),
            raw_node.raft.raft_log.last_index(),
        );
        self.ticks_since_share = self.ticks_since_share.saturating_add(1);
        if self.ticks_since_share >= SCORE_SHARE_TICKS {
            self.ticks_since_share = 0;
            self.share(transport, &voters, log, now);
        }
        self.publish(&voters, now);
        if raw_node.raft.state == StateRole::Leader {
            return self.check_resign(raw_node, &voters, now);
        }
        self.resign.clear();
        self.set_timeout(raw_node, &voters, log, now);
        None
    }

    /// Sends this node's frame to every other voter.
    fn share(
        &self,
        transport: &mut dyn Transport,
        voters: &[u64],
        (last_term, last_index): (u64, u64),
        now: Instant,
    ) {
        let sent_us = self.now_us(now);
        for &peer in voters.iter().filter(|id| **id != self.id) {
            // Only a fresh frame is echoed: an old one would carry a hold the peer refuses
            // (over `SCORE_ECHO_HELD_US_MAX`) after a long silence, and says nothing about
            // the round trip now.
            let last = self.peers.get(&peer).and_then(|p| p.last);
            let fresh = last.filter(|(_, at)| now.saturating_duration_since(*at) <= self.stale);
            let (echo_us, echo_held_us) = match fresh {
                Some((frame, at)) => (
                    frame.sent_us,
                    u64::try_from(now.saturating_duration_since(at).as_micros())
                        .unwrap_or(u64::MAX),
                ),
                None => (0, 0),
            };
            // A dropped frame is only late: the next share period sends a new one.
            let _ = transport.send_score(
                peer,
                ScoreFrame {
                    score: self.own,
                    last_index,
                    last_term,
                    sent_us,
                    echo_us,
                    echo_held_us,
                },
            );
        }
    }

    /// Replaces the view's scores with the fresh ones.
    fn publish(&self, voters: &[u64], now: Instant) {
        let mut scores: BTreeMap<u64, f64> = voters
            .iter()
            .filter_map(|id| Some((*id, self.fresh(*id, now)?.score?)))
            .collect();
        if let Some(own) = self.own {
            scores.insert(self.id, own);
        }
        let mut view = self.view.lock().unwrap_or_else(PoisonError::into_inner);
        view.scores = scores;
    }

    /// Whether to drop a pre-vote request from `from` before raft sees it: only while this
    /// node is itself campaigning, for at most two of its rank-0 timeouts (one retry),
    /// and only when `from` (whose request names its log's last term and index,
    /// `candidate_log`) ranks behind it.
    ///
    /// Why: with check-quorum, a follower whose ticks lag (a busy machine) may ignore the
    /// best node's first pre-vote as still "hearing the leader"; the best node then waits
    /// a whole timeout to retry, while a worse node's later pre-vote would be granted by
    /// the best node itself and win. Refusing it for one retry lets the best node's retry,
    /// which the lagging follower now grants, win instead. Dropping a pre-vote request is
    /// always safe (it only withholds a vote), and the bound keeps a best node that cannot
    /// win (say, one whose messages do not get out) from blocking the others for longer.
    pub(crate) fn refuses_pre_vote(
        &self,
        raw_node: &RawNode<RaftLog>,
        from: u64,
        candidate_log: (u64, u64),
    ) -> bool {
        let window = u64::try_from(self.min_tick)
            .unwrap_or(u64::MAX)
            .saturating_add(SCORE_LEASE_GRACE_TICKS)
            .saturating_mul(2);
        if self.campaign_ticks == 0 || self.campaign_ticks > window {
            return false;
        }
        let now = Instant::now();
        let Some(theirs) = self.fresh(from, now) else {
            return false;
        };
        let me = Contender {
            id: self.id,
            score: self.own,
            log: (
                raw_node.raft.raft_log.last_term(),
                raw_node.raft.raft_log.last_index(),
            ),
        };
        let them = Contender {
            id: from,
            score: theirs.score,
            log: candidate_log,
        };
        let newest = order::newest_log(&me, &[them]);
        order::ahead(&me, &them, newest, self.margin)
    }

    /// Sets raft's randomized election timeout from this node's rank among the voters it
    /// hears from, the leader it follows excluded (its timeout only runs out once that
    /// leader is gone).
    fn set_timeout(
        &mut self,
        raw_node: &mut RawNode<RaftLog>,
        voters: &[u64],
        log: (u64, u64),
        now: Instant,
    ) {
        let leader_id = raw_node.raft.leader_id;
        let me = Contender {
            id: self.id,
            score: self.own,
            log,
        };
        let others: Vec<Contender> = voters
            .iter()
            .filter(|id| **id != self.id && **id != leader_id)
            .filter_map(|id| {
                let f = self.fresh(*id, now)?;
                Some(Contender {
                    id: *id,
                    score: f.score,
                    log: (f.last_term, f.last_index),
                })
            })
            .collect();
        let rank = order::rank(&me, &others, self.margin);
        // Nodes start at different times, and each election timer runs from its own
        // node's start: a node that first hears from a better peer restarts its timer, so
        // that peer, perhaps started later, gets its full timeout first (as if a leader
        // had been heard: this only ever delays an election).
        let newest = order::newest_log(&me, &others);
        let newcomers: Vec<u64> = self
            .peers
            .iter_mut()
            .filter_map(|(id, p)| std::mem::take(&mut p.first_contact).then_some(*id))
            .collect();
        let better_newcomer = others
            .iter()
            .any(|c| newcomers.contains(&c.id) && order::ahead(c, &me, newest, self.margin));
        if better_newcomer {
            debug!(
                node_id = self.id,
                "first heard from a better-ranked peer; election timer restarted"
            );
            raw_node.raft.election_elapsed = 0;
        }
        let term = raw_node.raft.term;
        if self.jitter.0 != term {
            self.jitter = (term, rand::random_range(0..self.slot.max(1)));
        }
        let grace = usize::try_from(SCORE_LEASE_GRACE_TICKS).unwrap_or(1);
        let timeout = election_timeout(
            rank,
            self.min_tick,
            self.max_tick,
            self.slot,
            self.jitter.1,
            grace,
        );
        if raw_node.raft.randomized_election_timeout() != timeout {
            debug!(
                node_id = self.id,
                term,
                rank,
                timeout_ticks = timeout,
                "election timeout set from score rank"
            );
            raw_node.raft.set_randomized_election_timeout(timeout);
        }
    }

    /// The leader's check: the follower to hand over to, if any.
    fn check_resign(
        &mut self,
        raw_node: &RawNode<RaftLog>,
        voters: &[u64],
        now: Instant,
    ) -> Option<u64> {
        // A transfer in flight: raft finishes or abandons it within an election timeout,
        // and the hold starts afresh after it.
        if raw_node.raft.lead_transferee.is_some() {
            self.resign.clear();
            return None;
        }
        let last_index = raw_node.raft.raft_log.last_index();
        let followers: Vec<Follower> = voters
            .iter()
            .filter(|id| **id != self.id)
            .map(|id| Follower {
                id: *id,
                score: self.fresh(*id, now).and_then(|f| f.score),
                caught_up: raw_node
                    .raft
                    .prs()
                    .get(*id)
                    .is_some_and(|pr| pr.matched >= last_index),
            })
            .collect();
        let to = self
            .resign
            .check(now, self.own, &followers, self.margin, self.hold)?;
        self.resign.clear();
        self.transfers.increment(1);
        let to_score = followers.iter().find(|f| f.id == to).and_then(|f| f.score);
        info!(
            event = events::SCORE_TRANSFER,
            node_id = self.id,
            term = raw_node.raft.term,
            to,
            own_score = ?self.own,
            to_score = ?to_score,
            oracle = %self.oracle,
            hold_ms = u64::try_from(self.hold.as_millis()).unwrap_or(u64::MAX),
            "a follower scored better than this leader for the hold time; handing over"
        );
        Some(to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board() -> ScoreBoard {
        let config = NodeConfig {
            id: 1,
            peers: [(1, "127.0.0.1:1"), (2, "127.0.0.1:2"), (3, "127.0.0.1:3")]
                .into_iter()
                .map(|(id, a)| (id, a.to_owned()))
                .collect(),
            score_oracle: Some(ScoreOracle::ConsensusLatency),
            ..NodeConfig::default()
        };
        ScoreBoard::new(
            &config,
            ScoreOracle::ConsensusLatency,
            None,
            metrics::Counter::noop(),
        )
    }

    /// A transport that keeps the score frames sent.
    #[derive(Default)]
    struct Recorder(Vec<(u64, ScoreFrame)>);

    impl Transport for Recorder {
        fn send(&mut self, _msg: raft::eraftpb::Message) -> crate::transport::Delivery {
            crate::transport::Delivery::Unreachable
        }

        fn send_score(&mut self, to: u64, frame: ScoreFrame) -> crate::transport::Delivery {
            self.0.push((to, frame));
            crate::transport::Delivery::Queued
        }
    }

    fn frame(echo_us: u64, echo_held_us: u64) -> ScoreFrame {
        ScoreFrame {
            score: Some(-3.0),
            last_index: 5,
            last_term: 2,
            sent_us: 77,
            echo_us,
            echo_held_us,
        }
    }

    /// Goal: an echo of this node's frame becomes one round-trip sample (less the time the
    /// peer held it), the same echo never counts twice, an echo claiming a hold longer
    /// than the time since sending is no sample, and an echo from the future is ignored.
    /// Method: frames from node 2 echoing this board's clock.
    #[test]
    fn echoes_become_round_trip_samples_once() {
        let mut b = board();
        let sent = b.now_us(Instant::now());
        std::thread::sleep(Duration::from_millis(5));
        b.on_frame(2, frame(sent, 1_000));
        let rtt = b.peers[&2].rtt.median().unwrap();
        assert!((4.0..1_000.0).contains(&rtt), "{rtt} ms");
        b.on_frame(2, frame(sent, 1_000));
        assert_eq!(b.peers[&2].rtt.len(), 1, "one echo, one sample");
        let later = b.now_us(Instant::now());
        b.on_frame(2, frame(later, 60_000_000));
        assert_eq!(
            b.peers[&2].rtt.len(),
            1,
            "a hold longer than the round trip"
        );
        b.on_frame(3, frame(u64::MAX, 0));
        assert_eq!(b.peers[&3].rtt.len(), 0, "an echo from the future");
        // Echoes go back only for fresh frames.
        let mut sent = Recorder::default();
        b.share(&mut sent, &[1, 2, 3], (2, 5), Instant::now());
        assert!(sent.0.iter().all(|(_, f)| f.echo_us == 77), "{:?}", sent.0);
        let mut sent = Recorder::default();
        let later = Instant::now() + b.stale + Duration::from_millis(1);
        b.share(&mut sent, &[1, 2, 3], (2, 5), later);
        assert_eq!(sent.0.len(), 2);
        assert!(
            sent.0
                .iter()
                .all(|(_, f)| f.echo_us == 0 && f.echo_held_us == 0)
        );
        // Both peers are fresh now and their frames are remembered.
        let now = Instant::now();
        assert_eq!(b.fresh(2, now).map(|f| f.last_index), Some(5));
        assert!(b.fresh(3, now).is_some());
        assert!(
            b.fresh(3, now + b.stale + Duration::from_millis(1))
                .is_none()
        );
    }
}
