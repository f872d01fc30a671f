//! The election loop: the one task that owns the `RawNode`. It ticks raft, steps the
//! messages of its inbox, and handles each `Ready` in the order raft-rs documents for
//! `RawNode` (see [`ElectionLoop::on_ready`]), then publishes the leadership.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use raft::eraftpb::{Entry, Message, MessageType};
use raft::{RawNode, SnapshotStatus, Storage as _};
use tokio::sync::{mpsc, watch};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use palisade_protocol::process::events;
use palisade_storage::{RaftLog, RaftLogError, ReadyWrite};

use super::error::{LeaseError, NodeError, TransferError};
use super::guard::{DropLog, Guard, LocalState};
use super::inbox::{INBOX_BATCH_MAX, Msg};
use super::lease_rounds::LeaseRounds;
use super::membership::Membership;
use super::signer::TokenSigner;
use super::transfer::PendingTransfer;
use crate::leadership::{Leadership, Role};
use crate::metrics::NodeMetrics;
use crate::score::board::ScoreBoard;
use crate::transport::{Delivery, Transport};

/// `Ready` rounds handled per wake-up: advancing can make a new `Ready` at once (a commit
/// learned while persisting); a bound keeps the loop from starving its tick.
pub const READY_ROUNDS_MAX: usize = 8;

/// The election loop's state. Owned by one task.
pub(super) struct ElectionLoop {
    /// This node's raft id.
    pub(super) id: u64,
    /// raft's state machine; only this task touches it, so it needs no lock.
    pub(super) raw_node: RawNode<RaftLog>,
    /// A handle on the same log the `RawNode` reads, for writes from blocking tasks.
    pub(super) log: RaftLog,
    /// Where outgoing raft messages go (TCP, or the in-memory test network).
    pub(super) transport: Box<dyn Transport>,
    /// Peer messages, transfer requests and the announcer's reports.
    pub(super) inbox: mpsc::Receiver<Msg>,
    /// The published leadership; this loop is its only writer.
    pub(super) leadership: watch::Sender<Leadership>,
    pub(super) metrics: NodeMetrics,
    /// No `--announce` proxies: a token counts as announced once established.
    pub(super) no_proxies: bool,
    /// Transfers waiting for their outcome.
    pub(super) transfers: Vec<PendingTransfer>,
    /// Peers a message could not be queued for since the last report.
    pub(super) unreachable: BTreeSet<u64>,
    /// Peers a snapshot could not be queued for since the last report.
    pub(super) snapshot_failed: BTreeSet<u64>,
    /// A transfer's deadline in ticks.
    pub(super) transfer_ticks: u64,
    /// Cancelled when the node stops.
    pub(super) shutdown: CancellationToken,
    /// The last check of every peer message before it is stepped.
    pub(super) guard: Guard,
    /// Rate limit of the guard's warnings.
    pub(super) drop_log: DropLog,
    /// The highest term the log held, recorded beside it after each persisted new term
    /// (see [`palisade_storage::TermRecord`]); `None` for an in-memory log.
    pub(super) term_record: Option<Arc<std::sync::Mutex<palisade_storage::TermRecord>>>,
    /// Signs each new token's proof (`--token-key`); `None`: tokens carry no proof.
    pub(super) signer: Option<Arc<TokenSigner>>,
    /// Lease requests waiting for a `ReadIndex` round, and the round in flight.
    pub(super) leases: LeaseRounds,
    /// With leases on (`lease_ms` > 0): the longest a new token is held back after
    /// establishment when not every proxy accepted it. `None`: leases off, tokens are
    /// released at establishment.
    pub(super) release_wait: Option<Duration>,
    /// The term this node is established in and when (monotonic clock) it saw that.
    pub(super) established_at: Option<(u64, tokio::time::Instant)>,
    /// Scores (`--score-oracle`); `None`: raft's randomized election, no score frames.
    pub(super) scores: Option<ScoreBoard>,
    /// Named leaderships: the machine, the leader's deadlines, requests waiting.
    pub(super) scopes: super::scopes::ScopesLoop,
    /// The members table and its watchers (see `membership`).
    pub(super) membership: Membership,
}

impl ElectionLoop {
    /// Runs until shutdown or a fatal storage error, then leaves the node showing no
    /// token and answers every pending request.
    pub(super) async fn run(mut self, tick_period: Duration) -> Result<(), NodeError> {
        let mut tick = tokio::time::interval(tick_period);
        // Delay, not the default Burst: after a pause (SIGSTOP, a slow fsync) a burst of
        // ticks would expire the election timer at once and start a needless election.
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The first tick of an interval completes at once; consume it so the first real
        // tick comes one period after start.
        tick.tick().await;
        self.publish();
        let outcome = loop {
            let deadline = self.next_deadline();
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => break Ok(()),
                _ = tick.tick() => self.on_tick(),
                msg = self.inbox.recv() => match msg {
                    Some(msg) => self.on_msg(msg),
                    None => break Ok(()),
                },
                // Wakes the loop when a held-back token may be released or a lease round
                // times out; both are then handled below.
                () = sleep_until_opt(deadline) => {}
            }
            for _ in 0..INBOX_BATCH_MAX {
                match self.inbox.try_recv() {
                    Ok(msg) => self.on_msg(msg),
                    Err(_) => break,
                }
            }
            // A heartbeat showed that this node's storage lost acknowledged entries.
            if let Some(err) = self.membership.lost.take() {
                break Err(err);
            }
            // A step-down (check-quorum in `tick`, a higher term in `step`) or a transfer
            // takes the token away now, not after the Ready's fsync. Only the withdrawal is
            // published early: a new term is shown only once it is durable.
            self.withdraw_token_if_lost();
            self.lease_cycle();
            if let Err(err) = self.on_ready().await {
                error!(node_id = self.id, cause = %err, "election loop stopped");
                break Err(err);
            }
            self.publish();
            self.check_transfers();
            // A round confirmed in that Ready lets the next batch start now rather than at
            // the next wake-up; its heartbeats go out in one more Ready.
            if self.lease_cycle() {
                if let Err(err) = self.on_ready().await {
                    error!(node_id = self.id, cause = %err, "election loop stopped");
                    break Err(err);
                }
                self.publish();
            }
        };
        self.stop();
        outcome
    }

    /// Handles `Ready`s until raft has none (at most [`READY_ROUNDS_MAX`] rounds), each in
    /// the order raft-rs documents for `RawNode`: every step below depends on the one
    /// before it having happened, and reordering them breaks raft's safety or liveness.
    async fn on_ready(&mut self) -> Result<(), NodeError> {
        for _ in 0..READY_ROUNDS_MAX {
            if !self.raw_node.has_ready() {
                break;
            }
            let mut ready = self.raw_node.ready();

            // 1. A leader may send its messages before persisting its own entries (the raft
            //    thesis, section 10.2.1): followers persist in parallel, and the leader only
            //    counts itself in a quorum once its write is done. For every other role this
            //    is empty.
            let early = ready.take_messages();
            self.send(early);

            // 2. Persist the snapshot, then the entries, then the hard state, in one redb
            //    transaction, so a crash never leaves a hard state that points past the
            //    entries. It is fsynced (Durability::Immediate) even when `must_sync()` is
            //    false: redb 4 has no cheaper durable level, and RaftLog's docs say why that
            //    is fine.
            let write = ReadyWrite {
                snapshot: (!ready.snapshot().is_empty()).then(|| ready.snapshot().clone()),
                entries: ready.take_entries(),
                hard_state: ready.hs().cloned(),
            };
            let snapshot_index = write.snapshot.as_ref().map(|s| s.get_metadata().index);
            if !write.is_empty() {
                let log = self.log.clone();
                let record = self.term_record.clone();
                blocking(move || {
                    log.persist(&write)?;
                    // After the log's commit: the record is never ahead of the log.
                    match (&record, &write.hard_state) {
                        (Some(record), Some(hs)) => record
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .record(hs.term)
                            .map_err(|e| {
                                RaftLogError::Storage(format!(
                                    "cannot record term {}: {e}",
                                    hs.term
                                ))
                            }),
                        _ => Ok(()),
                    }
                })
                .await?;
            }
            if let Some(index) = snapshot_index {
                self.on_snapshot_installed(index);
            }

            // 3. Only now send what depends on that write: vote grants and append acks. A
            //    vote sent before its fsync could be cast twice after a crash.
            let persisted = ready.take_persisted_messages();
            self.send(persisted);

            // 4. Apply the committed entries; raft hands out only entries that are both
            //    committed and persisted here. There is no state machine: only conf changes
            //    do anything.
            let committed = ready.take_committed_entries();
            self.apply(committed).await?;

            // 4a. Answer the lease rounds a quorum confirmed. Only after the write above:
            //     a grant names this node's term, which is then durable.
            let read_states = ready.take_read_states();
            self.on_read_states(&read_states);

            // 5. Advance: raft learns that this Ready is persisted and returns a LightReady
            //    with what that made possible.
            let mut light = self.raw_node.advance(ready);

            // 5a. Persist the new commit index, so a restart does not re-apply entries it
            //     already applied.
            if let Some(commit) = light.commit_index() {
                let log = self.log.clone();
                blocking(move || log.set_commit(commit)).await?;
            }

            // 5b. Send the LightReady's messages (only a leader has any: appends it could
            //     not send before its own write finished).
            let more = light.take_messages();
            self.send(more);

            // 5c. Apply its committed entries, which the persist in step 2 made safe.
            let committed = light.take_committed_entries();
            self.apply(committed).await?;

            // 5d. Tell raft they are applied; without this `applied` freezes and the leader
            //     never becomes established.
            self.raw_node.advance_apply();
            self.log.set_applied(self.raw_node.raft.raft_log.applied);

            // 6. Report peers we could not send to, only now that advance has run: both
            //    calls step raft internally, which must not happen inside a Ready.
            for peer in std::mem::take(&mut self.unreachable) {
                self.raw_node.report_unreachable(peer);
            }
            for peer in std::mem::take(&mut self.snapshot_failed) {
                self.raw_node.report_snapshot(peer, SnapshotStatus::Failure);
            }

            // 7. Keep the log short: compact behind the applied index, so the redb file
            //    does not grow with every term.
            self.maybe_compact().await?;
        }
        Ok(())
    }

    /// One raft tick; transfers count their deadline in ticks too.
    fn on_tick(&mut self) {
        // Scores first: they set the election timeout raft's tick compares with, and may
        // ask this leader to hand over to a better follower.
        if let Some(board) = &mut self.scores
            && let Some(to) = board.on_tick(&mut self.raw_node, self.transport.as_mut())
        {
            // Nobody waits for the answer; `check_transfers` logs the outcome.
            let (reply, _) = tokio::sync::oneshot::channel();
            self.start_transfer(Some(to), reply);
        }
        // The leader leaves a joint configuration, or promotes a learner that caught up.
        self.membership_tick();
        // Named leaderships: the leader's expiries, or forgetting them when not leading.
        self.scopes_tick();
        self.raw_node.tick();
        for t in &mut self.transfers {
            t.ticks_left = t.ticks_left.saturating_sub(1);
        }
    }

    /// Handles one inbox message.
    fn on_msg(&mut self, msg: Msg) {
        match msg {
            Msg::Raft(m) => {
                let (from, kind) = (m.from, m.get_msg_type());
                // Scores: a campaigning node may hold back a worse-ranked peer's pre-vote
                // for one retry of its own (see `ScoreBoard::refuses_pre_vote`).
                if kind == MessageType::MsgRequestPreVote
                    && let Some(board) = &self.scores
                    && board.refuses_pre_vote(&self.raw_node, from, (m.log_term, m.index))
                {
                    debug!(
                        from,
                        term = m.term,
                        "pre-vote of a worse-ranked peer held back"
                    );
                    return;
                }
                if let Err(cause) = self.guard.check(&m, &self.local_state()) {
                    self.check_storage_lost(&m, &cause);
                    let reason = cause.reason();
                    self.metrics.inbound_dropped(reason);
                    if let Some(unlogged) =
                        self.drop_log.should_log(reason, std::time::Instant::now())
                    {
                        warn!(
                            node_id = self.id,
                            from,
                            msg_type = ?kind,
                            term = m.term,
                            own_term = self.raw_node.raft.term,
                            reason,
                            unlogged_since_last = unlogged,
                            cause = %cause,
                            "peer message dropped before raft saw it"
                        );
                    }
                    return;
                }
                self.membership.reachability.heard(from);
                // A membership change a follower forwarded: the leader checks it as it
                // checks its own requests (a reachable quorum after it, three voters).
                if let Some(cause) = self.refuse_forwarded(&m) {
                    warn!(node_id = self.id, from, cause = %cause, "forwarded membership change refused");
                    return;
                }
                if let Err(err) = self.raw_node.step(*m) {
                    debug!(from, ?kind, cause = %err, "raft refused a peer message");
                }
            }
            Msg::Transfer { to, reply } => self.start_transfer(to, reply),
            Msg::Lease { reply } => self.on_lease(reply),
            Msg::Member { change, reply } => self.on_member_request(&change, reply),
            Msg::Scope { op, reply } => self.on_scope_request(op, reply),
            Msg::Score { from, frame } => {
                // Only voters' frames count; a node without an oracle ignores them all.
                let is_voter = self.raw_node.raft.prs().conf().voters().contains(from);
                if let (Some(board), true) = (&mut self.scores, is_voter) {
                    board.on_frame(from, frame);
                }
            }
            Msg::Announced { term } => {
                // The term is released (when held back) by the next `publish`.
                let announced = self.leadership.send_if_modified(|l| {
                    if l.established == Some(term) && !l.announced {
                        l.announced = true;
                        true
                    } else {
                        false
                    }
                });
                if announced {
                    self.metrics.announced.set(1.0);
                    info!(
                        event = events::TOKEN_ANNOUNCED,
                        term,
                        token = term,
                        "term announced to every proxy"
                    );
                }
            }
        }
    }

    /// Hands messages to the transport and remembers the peers it could not reach, to
    /// report them to raft after the Ready.
    fn send(&mut self, msgs: Vec<Message>) {
        for msg in msgs {
            let to = msg.to;
            let is_snapshot = msg.get_msg_type() == MessageType::MsgSnapshot;
            if self.transport.send(msg) == Delivery::Unreachable {
                self.metrics.peer_dropped.increment(1);
                self.unreachable.insert(to);
                if is_snapshot {
                    self.snapshot_failed.insert(to);
                }
            }
        }
    }

    /// Applies committed entries: only conf changes have an effect (see `membership`).
    async fn apply(&mut self, entries: Vec<Entry>) -> Result<(), NodeError> {
        for entry in entries {
            let scope_entry = (entry.get_entry_type() == raft::eraftpb::EntryType::EntryNormal)
                .then(|| crate::scopes::ScopeEntry::decode(&entry.data))
                .flatten();
            match scope_entry {
                Some(decoded) => self.apply_scope_entry(entry.index, decoded),
                None => self.apply_conf_entry(&entry).await?,
            }
        }
        self.store_scopes().await
    }

    /// Compacts the log once enough applied entries accumulated, or up to the applied
    /// index right after a member was added (it then catches up from a snapshot).
    async fn maybe_compact(&mut self) -> Result<(), NodeError> {
        let applied = self.raw_node.raft.raft_log.applied;
        let first = self.raw_node.store().first_index().unwrap_or(1);
        if let Some(to) = self.compaction_target(applied, first) {
            let log = self.log.clone();
            blocking(move || log.compact(to)).await?;
            // Info, not debug: it happens once per thousand entries (or when a member is
            // added), and tests of snapshots look for it.
            info!(
                node_id = self.id,
                first_index = to,
                applied,
                "raft log compacted"
            );
        }
        Ok(())
    }

    /// What the guard compares peer messages against, read just before each step.
    fn local_state(&self) -> LocalState {
        let r = &self.raw_node.raft;
        LocalState {
            id: self.id,
            term: r.term,
            leader_id: r.leader_id,
            last_index: r.raft_log.last_index(),
        }
    }

    /// The next moment the loop must wake without a tick or a message: a held-back
    /// token's release, or a lease round's timeout.
    fn next_deadline(&self) -> Option<tokio::time::Instant> {
        let release = self.release_deadline();
        let round = self.lease_round_deadline();
        match (release, round) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The leader raft knows, `None` for raft's 0.
    pub(super) fn leader_id(&self) -> Option<u64> {
        let id = self.raw_node.raft.leader_id;
        (id != 0).then_some(id)
    }

    /// Final duties: no token is shown by a stopped node, and every request is answered.
    fn stop(&mut self) {
        self.inbox.close();
        while let Ok(msg) = self.inbox.try_recv() {
            match msg {
                Msg::Transfer { reply, .. } => {
                    let _ = reply.send(Err(TransferError::Stopped));
                }
                Msg::Lease { reply } => {
                    let _ = reply.send(Err(LeaseError::Stopped));
                }
                Msg::Member { reply, .. } => {
                    let _ = reply.send(Err(crate::members::MemberError::Stopped));
                }
                Msg::Scope { reply, .. } => {
                    let _ = reply.send(Err(super::scopes::ScopeCallError::Stopped));
                }
                Msg::Raft(_) | Msg::Announced { .. } | Msg::Score { .. } => {}
            }
        }
        self.stop_leases();
        self.fail_scope_requests(&super::scopes::ScopeCallError::Stopped);
        self.established_at = None;
        for t in self.transfers.drain(..) {
            let _ = t.reply.send(Err(TransferError::Stopped));
        }
        self.leadership.send_modify(|l| {
            l.token = None;
            l.established = None;
            l.released_by = None;
            l.announced = false;
            l.proof = None;
            if l.role == Role::Leader {
                l.role = Role::Follower;
                l.leader_id = None;
            }
        });
        self.metrics.is_leader.set(0.0);
        self.metrics.token.set(0.0);
        self.metrics.announced.set(0.0);
    }
}

/// Sleeps until `deadline`, or for ever without one.
async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Runs a raft-log write on the blocking pool; inline in deterministic mode (the
/// simulation, `crate::deterministic`).
pub(super) async fn blocking(
    f: impl FnOnce() -> Result<(), RaftLogError> + Send + 'static,
) -> Result<(), NodeError> {
    if crate::deterministic::is_on() {
        return f().map_err(|e| NodeError::Storage(e.to_string()));
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| NodeError::Task(e.to_string()))?
        .map_err(|e| NodeError::Storage(e.to_string()))
}
