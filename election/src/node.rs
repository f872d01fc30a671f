//! The node: starting it, its handle, and the election loop that owns the `RawNode`.
//!
//! One task owns the `RawNode` (no `Arc<Mutex<RawNode>>`). Everything else talks to it
//! through one bounded inbox of [`Msg`]: peer traffic from the transport, transfer requests
//! from the API or the embedding application, and the announcer's reports. Ticks come from
//! a `tokio::time::interval` with `MissedTickBehavior::Delay`, so a node that was paused
//! does not fire a burst of ticks (and a spurious election) when it resumes.
//!
//! After every wake-up the loop handles raft's `Ready` in the documented order (see
//! `shared/notes/raft-rs.md` §1) and then publishes a [`Leadership`] on a watch channel.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeV2, Entry, EntryType, Message, MessageType};
use raft::{RawNode, SnapshotStatus, StateRole, Storage as _};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, error, info, info_span, warn};

use palisade_storage::{OpenError, RaftLog, RaftLogError, ReadyWrite};

use crate::config::{ConfigError, NodeConfig};
use crate::leadership::{Leadership, Role};
use crate::metrics::NodeMetrics;
use crate::transport::faults::LinkFaults;
use crate::transport::mem::MemNetwork;
use crate::transport::{Delivery, PeerInbox, Transport};

/// Messages the inbox holds. Peer traffic waits (back-pressure onto its connection) when it
/// is full; a few hundred covers a burst from every peer with room to spare.
pub const INBOX_MAX: usize = 1024;
/// Messages taken from the inbox before one `Ready` is handled, so a burst shares one fsync
/// while ticks still run on time.
pub const INBOX_BATCH_MAX: usize = 256;
/// `Ready` rounds handled per wake-up: advancing can make a new `Ready` at once (a commit
/// learned while persisting); a bound keeps the loop from starving its tick.
pub const READY_ROUNDS_MAX: usize = 8;
/// A transfer that has not completed within this many election timeouts is answered
/// `TimedOut` (raft itself abandons a transfer after one election timeout).
pub const TRANSFER_TIMEOUT_ELECTIONS: u64 = 3;
/// Entries kept behind the applied index when the log is compacted. Lagging followers
/// within this distance catch up by appends, farther ones by a (metadata-only) snapshot.
pub const LOG_ENTRIES_RETAINED: u64 = 1_000;
/// Compaction runs once this many more entries than [`LOG_ENTRIES_RETAINED`] accumulated.
pub const LOG_COMPACT_STEP: u64 = 1_000;
/// Time [`NodeHandle::shutdown`] waits for background tasks after the loop stopped.
pub const SHUTDOWN_TASKS_TIMEOUT_MS: u64 = 2_000;

/// The one message type of the election loop's inbox.
pub(crate) enum Msg {
    /// A raft message from a peer, already checked by the transport.
    Raft(Box<Message>),
    /// Transfer leadership to `to`, or to the best other voter when `None` (resign).
    Transfer {
        to: Option<u64>,
        reply: oneshot::Sender<Result<Transferred, TransferError>>,
    },
    /// Every announce proxy accepted the token `term`.
    Announced { term: u64 },
}

/// A completed leadership transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Transferred {
    /// The leader when the transfer started.
    pub from: u64,
    /// The new leader.
    pub to: u64,
    /// The new leader's term (higher than the old one).
    pub term: u64,
}

/// Why a transfer or resignation did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransferError {
    /// Resigning needs leadership, and transferring needs a known leader.
    #[error("this node is not the leader (leader: {leader_id:?})")]
    NotLeader {
        /// The leader this node knows, if any.
        leader_id: Option<u64>,
    },
    /// The target is not a voter of this cluster.
    #[error("node {to} is not a voter of this cluster")]
    UnknownNode {
        /// The requested target.
        to: u64,
    },
    /// There is no other voter to resign to.
    #[error("there is no other voter to transfer leadership to")]
    NoCandidate,
    /// raft refused or abandoned the transfer (the target did not catch up in time, or a
    /// higher-priority voter refused to vote for it).
    #[error("raft refused or abandoned the transfer to node {to} in term {term}")]
    Refused {
        /// The requested target.
        to: u64,
        /// The term the transfer was started in.
        term: u64,
    },
    /// Another node than the target became leader.
    #[error("node {leader_id} became leader in term {term} instead of node {to}")]
    Superseded {
        /// The requested target.
        to: u64,
        /// The leader that won.
        leader_id: u64,
        /// Its term.
        term: u64,
    },
    /// No outcome within the deadline.
    #[error("transfer to node {to} did not complete within {ticks} ticks")]
    TimedOut {
        /// The requested target.
        to: u64,
        /// The deadline in ticks.
        ticks: u64,
    },
    /// The node stopped before the transfer completed.
    #[error("the node stopped")]
    Stopped,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A configuration value is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The database could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The raft log could not be loaded.
    #[error(transparent)]
    Log(#[from] RaftLogError),
    /// raft refused the stored state.
    #[error("raft refused to start: {0}")]
    Raft(#[from] raft::Error),
    /// An address could not be bound.
    #[error("cannot bind the {what} address {addr}: {source}")]
    Bind {
        /// `peer` or `api`.
        what: &'static str,
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A start-up task failed.
    #[error("start-up task failed: {0}")]
    Task(String),
}

impl StartError {
    /// Whether this is a configuration error (the CLI exits 2 for these).
    pub fn is_config(&self) -> bool {
        matches!(self, StartError::Config(_))
    }
}

/// Why a running node stopped on its own.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// Writing the raft log failed. The node stops: continuing could break raft's promises.
    #[error("raft log write failed: {0}")]
    Storage(String),
    /// A blocking storage task panicked or was cancelled.
    #[error("storage task failed: {0}")]
    Task(String),
    /// The loop task panicked.
    #[error("election loop failed: {0}")]
    Loop(String),
}

/// Entry point for running a node.
#[derive(Debug)]
pub struct Node;

impl Node {
    /// Starts a node with its redb log under `config.data_dir`, TCP to its peers, and the
    /// HTTP API when `config.api` is set.
    #[tracing::instrument(skip_all, fields(node_id = config.id))]
    pub async fn start(config: NodeConfig) -> Result<NodeHandle, StartError> {
        config.validate()?;
        let path = config.database_path();
        let log = blocking_start(move || {
            let db = palisade_storage::open_database(&path)?;
            Ok::<_, StartError>(RaftLog::open(db)?)
        })
        .await?;
        start(config, log, TransportSpec::Tcp).await
    }

    /// Starts a node whose peers are reached over the in-memory `net`, with its raft log in
    /// `db` (typically an in-memory redb). `config.data_dir` is not used. For tests.
    pub async fn start_in_memory(
        mut config: NodeConfig,
        db: Arc<redb::Database>,
        net: &MemNetwork,
    ) -> Result<NodeHandle, StartError> {
        if config.data_dir.as_os_str().is_empty() {
            config.data_dir = "<memory>".into();
        }
        config.validate()?;
        let log = blocking_start(move || Ok::<_, StartError>(RaftLog::open(db)?)).await?;
        start(config, log, TransportSpec::Memory(net.clone())).await
    }
}

async fn blocking_start<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StartError> + Send + 'static,
) -> Result<T, StartError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StartError::Task(e.to_string()))?
}

enum TransportSpec {
    Tcp,
    Memory(MemNetwork),
}

async fn start(
    config: NodeConfig,
    log: RaftLog,
    transport: TransportSpec,
) -> Result<NodeHandle, StartError> {
    let id = config.id;
    let voters: Vec<u64> = config.peers.keys().copied().collect();
    {
        let log = log.clone();
        blocking_start(move || match log.initialize(&voters) {
            Err(RaftLogError::ConfStateMismatch { stored, configured }) => Err(ConfigError::new(
                "peers",
                format!(
                    "names voters {configured:?} but this node's log was created with \
                         {stored:?}; membership changes are not supported"
                ),
            )
            .into()),
            other => Ok(other?),
        })
        .await?;
    }
    let raft_config = config.raft_config();
    let logger = slog::Logger::root(tracing_slog::TracingSlogDrain, slog::o!());
    let rn = {
        let _span = info_span!("node", node_id = id).entered();
        RawNode::new(&raft_config, log.clone(), &logger)?
    };
    let hard_state = log.hard_state();

    let shutdown = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let (tx, rx) = mpsc::channel(INBOX_MAX);
    let inbox = PeerInbox::new(tx.clone());
    // Test faults exist only on the TCP transport; the in-memory one has its own cuts.
    let faults = Arc::new(LinkFaults::new(
        config.test_faults && matches!(transport, TransportSpec::Tcp),
        id,
        config.peers.keys().copied(),
    ));
    if faults.is_enabled() {
        warn!(
            node_id = id,
            "test faults enabled (PALISADE_TEST_FAULTS): POST /v1/test/faults can drop or delay raft traffic"
        );
    }
    let (transport, peer_addr): (Box<dyn Transport>, Option<SocketAddr>) = match transport {
        TransportSpec::Tcp => {
            let (t, addr) = crate::transport::tcp::start(
                id,
                &config.peers,
                inbox,
                Arc::clone(&faults),
                &shutdown,
                &mut tasks,
            )
            .await
            .map_err(|source| StartError::Bind {
                what: "peer",
                addr: config.peers.get(&id).cloned().unwrap_or_default(),
                source,
            })?;
            (Box::new(t), Some(addr))
        }
        TransportSpec::Memory(net) => (Box::new(net.attach(id, inbox)), None),
    };

    let (leadership_tx, leadership_rx) = watch::channel(Leadership {
        term: hard_state.term,
        ..Leadership::default()
    });
    let metrics = NodeMetrics::new(id);
    let commands = Commands { tx };

    if !config.announce.is_empty() {
        tasks.spawn(
            crate::announce::run(crate::announce::Announcer {
                scope: config.scope.clone(),
                urls: config.announce.clone(),
                leadership: leadership_rx.clone(),
                commands: commands.clone(),
                metrics: metrics.clone(),
                shutdown: shutdown.clone(),
            })
            .instrument(info_span!("announcer", node_id = id, scope = %config.scope)),
        );
    }

    let api_addr = match config.api {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::Bind {
                    what: "api",
                    addr: addr.to_string(),
                    source,
                })?;
            let bound = listener.local_addr().map_err(|source| StartError::Bind {
                what: "api",
                addr: addr.to_string(),
                source,
            })?;
            tasks.spawn(
                crate::api::serve(
                    listener,
                    crate::api::ApiState {
                        node_id: id,
                        scope: config.scope.clone(),
                        leadership: leadership_rx.clone(),
                        commands: commands.clone(),
                        metrics: metrics.clone(),
                        faults: faults.is_enabled().then(|| Arc::clone(&faults)),
                    },
                    shutdown.clone(),
                )
                .instrument(info_span!("api", node_id = id)),
            );
            Some(bound)
        }
        None => None,
    };

    let election_loop = Loop {
        id,
        rn,
        log,
        transport,
        inbox: rx,
        leadership: leadership_tx,
        metrics: metrics.clone(),
        no_proxies: config.announce.is_empty(),
        transfers: Vec::new(),
        unreachable: BTreeSet::new(),
        snapshot_failed: BTreeSet::new(),
        transfer_ticks: TRANSFER_TIMEOUT_ELECTIONS * config.election_ticks,
        shutdown: shutdown.clone(),
    };
    let main = tokio::spawn(
        election_loop
            .run(config.tick())
            .instrument(info_span!("node", node_id = id)),
    );
    info!(
        node_id = id,
        scope = %config.scope,
        term = hard_state.term,
        peer_addr = ?peer_addr,
        api_addr = ?api_addr,
        "node started"
    );
    Ok(NodeHandle {
        id,
        scope: config.scope,
        leadership: leadership_rx,
        commands,
        shutdown,
        main: Some(main),
        outcome: None,
        tasks,
        api_addr,
        peer_addr,
        metrics,
    })
}

/// A cloneable way to send requests into the loop.
#[derive(Clone)]
pub(crate) struct Commands {
    tx: mpsc::Sender<Msg>,
}

impl Commands {
    pub(crate) async fn transfer(&self, to: Option<u64>) -> Result<Transferred, TransferError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Msg::Transfer { to, reply })
            .await
            .map_err(|_| TransferError::Stopped)?;
        answer.await.map_err(|_| TransferError::Stopped)?
    }

    pub(crate) async fn announced(&self, term: u64) {
        // Fails only when the loop stopped; then there is nothing to record.
        let _ = self.tx.send(Msg::Announced { term }).await;
    }

    /// Whether the loop is still running (it closes its inbox when it stops).
    pub(crate) fn is_running(&self) -> bool {
        !self.tx.is_closed()
    }
}

/// A running node. Dropping it does not stop the node; call [`NodeHandle::shutdown`] or
/// [`NodeHandle::stop`].
pub struct NodeHandle {
    id: u64,
    scope: String,
    leadership: watch::Receiver<Leadership>,
    commands: Commands,
    shutdown: CancellationToken,
    main: Option<tokio::task::JoinHandle<Result<(), NodeError>>>,
    outcome: Option<Result<(), NodeError>>,
    tasks: JoinSet<()>,
    api_addr: Option<SocketAddr>,
    peer_addr: Option<SocketAddr>,
    metrics: NodeMetrics,
}

impl std::fmt::Debug for NodeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHandle")
            .field("id", &self.id)
            .field("scope", &self.scope)
            .field("leadership", &*self.leadership.borrow())
            .field("api_addr", &self.api_addr)
            .field("peer_addr", &self.peer_addr)
            .finish_non_exhaustive()
    }
}

impl NodeHandle {
    /// This node's raft id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The fencing scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// A watch of this node's leadership; it changes after every election-loop cycle that
    /// changes it. When the node stops, it shows no token.
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    /// The address the HTTP API listens on, when it was configured.
    pub fn api_addr(&self) -> Option<SocketAddr> {
        self.api_addr
    }

    /// The address the peer listener is bound to (TCP transport only).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer_addr
    }

    /// The node's metrics in Prometheus text format.
    pub fn metrics_text(&self) -> String {
        self.metrics.render()
    }

    /// Transfers leadership to `to` and waits for the outcome. On a follower the request
    /// is forwarded to the known leader; `to` may be this node (asking for leadership).
    #[tracing::instrument(skip(self), fields(node_id = self.id))]
    pub async fn transfer(&self, to: u64) -> Result<Transferred, TransferError> {
        self.commands.transfer(Some(to)).await
    }

    /// Transfers leadership to the best other voter (the one with the highest match
    /// index). Only the leader can resign.
    #[tracing::instrument(skip(self), fields(node_id = self.id))]
    pub async fn resign(&self) -> Result<Transferred, TransferError> {
        self.commands.transfer(None).await
    }

    /// Resolves when the node stops on its own (a fatal storage error) or after a stop.
    pub async fn wait(&mut self) -> Result<(), NodeError> {
        if let Some(main) = self.main.as_mut() {
            let outcome = match main.await {
                Ok(r) => r,
                Err(e) => Err(NodeError::Loop(e.to_string())),
            };
            self.main = None;
            self.outcome = Some(outcome);
        }
        self.outcome.clone().unwrap_or(Ok(()))
    }

    /// Stops gracefully: a leader first hands leadership to the best other voter (bounded
    /// by the transfer deadline; failure is logged, not fatal), then everything stops.
    #[tracing::instrument(skip(self), fields(node_id = self.id))]
    pub async fn shutdown(self) -> Result<(), NodeError> {
        if self.leadership.borrow().role == Role::Leader && self.commands.is_running() {
            match self.resign().await {
                Ok(t) => info!(
                    to = t.to,
                    term = t.term,
                    "handed leadership over before stopping"
                ),
                Err(err) => warn!(cause = %err, "could not hand leadership over before stopping"),
            }
        }
        self.stop().await
    }

    /// Stops at once: the loop, the transport, the announcer and the API. Pending requests
    /// are answered `Stopped`, and the leadership watch shows no token.
    pub async fn stop(mut self) -> Result<(), NodeError> {
        self.shutdown.cancel();
        let outcome = self.wait().await;
        debug!(node_id = self.id, "election loop stopped");
        let mut tasks = std::mem::take(&mut self.tasks);
        let joined = tokio::time::timeout(
            Duration::from_millis(SHUTDOWN_TASKS_TIMEOUT_MS),
            async move { while tasks.join_next().await.is_some() {} },
        )
        .await;
        if joined.is_ok() {
            debug!(node_id = self.id, "background tasks stopped");
        } else {
            warn!(
                node_id = self.id,
                timeout_ms = SHUTDOWN_TASKS_TIMEOUT_MS,
                "background tasks did not stop in time; aborted"
            );
        }
        outcome
    }
}

/// A transfer waiting for its outcome.
struct PendingTransfer {
    from: u64,
    to: u64,
    start_term: u64,
    ticks_left: u64,
    reply: oneshot::Sender<Result<Transferred, TransferError>>,
}

/// The election loop's state. Owned by one task.
struct Loop {
    id: u64,
    rn: RawNode<RaftLog>,
    /// A handle on the same log the `RawNode` reads, for writes from blocking tasks.
    log: RaftLog,
    transport: Box<dyn Transport>,
    inbox: mpsc::Receiver<Msg>,
    leadership: watch::Sender<Leadership>,
    metrics: NodeMetrics,
    /// No `--announce` proxies: a token counts as announced once established.
    no_proxies: bool,
    transfers: Vec<PendingTransfer>,
    /// Peers a message could not be queued for since the last report.
    unreachable: BTreeSet<u64>,
    /// Peers a snapshot could not be queued for since the last report.
    snapshot_failed: BTreeSet<u64>,
    transfer_ticks: u64,
    shutdown: CancellationToken,
}

impl Loop {
    async fn run(mut self, tick_period: Duration) -> Result<(), NodeError> {
        let mut tick = tokio::time::interval(tick_period);
        // Delay, not the default Burst: after a pause (SIGSTOP, a slow fsync) a burst of
        // ticks would expire the election timer at once and start a needless election.
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The first tick of an interval completes at once; consume it so the first real
        // tick comes one period after start.
        tick.tick().await;
        self.publish();
        let outcome = loop {
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => break Ok(()),
                _ = tick.tick() => self.on_tick(),
                msg = self.inbox.recv() => match msg {
                    Some(msg) => self.on_msg(msg),
                    None => break Ok(()),
                },
            }
            for _ in 0..INBOX_BATCH_MAX {
                match self.inbox.try_recv() {
                    Ok(msg) => self.on_msg(msg),
                    Err(_) => break,
                }
            }
            // A step-down (check-quorum in `tick`, a higher term in `step`) or a transfer
            // takes the token away now, not after the Ready's fsync. Only the withdrawal is
            // published early: a new term is shown only once it is durable.
            self.withdraw_token_if_lost();
            if let Err(err) = self.handle_ready().await {
                error!(node_id = self.id, cause = %err, "election loop stopped");
                break Err(err);
            }
            self.publish();
            self.check_transfers();
        };
        self.stop();
        outcome
    }

    fn on_tick(&mut self) {
        self.rn.tick();
        for t in &mut self.transfers {
            t.ticks_left = t.ticks_left.saturating_sub(1);
        }
    }

    fn on_msg(&mut self, msg: Msg) {
        match msg {
            Msg::Raft(m) => {
                let (from, kind) = (m.from, m.get_msg_type());
                if let Err(err) = self.rn.step(*m) {
                    debug!(from, ?kind, cause = %err, "raft refused a peer message");
                }
            }
            Msg::Transfer { to, reply } => self.start_transfer(to, reply),
            Msg::Announced { term } => {
                let announced = self.leadership.send_if_modified(|l| {
                    if l.token == Some(term) && !l.announced {
                        l.announced = true;
                        true
                    } else {
                        false
                    }
                });
                if announced {
                    self.metrics.announced.set(1.0);
                    info!(term, token = term, "token announced to every proxy");
                }
            }
        }
    }

    /// Handles `Ready`s until raft has none (bounded), in the order of raft-rs.md §1.
    async fn handle_ready(&mut self) -> Result<(), NodeError> {
        for _ in 0..READY_ROUNDS_MAX {
            if !self.rn.has_ready() {
                break;
            }
            let mut rd = self.rn.ready();

            // 1. A leader may send its messages before persisting (raft thesis 10.2.1); for
            //    every other role this is empty.
            let early = rd.take_messages();
            self.send(early);

            // 2. Persist snapshot, then entries, then hard state, in one redb transaction.
            //    It is fsynced (Durability::Immediate) even when `must_sync()` is false: redb
            //    4 has no cheaper durable level, and see RaftLog's docs for why that is fine.
            let write = ReadyWrite {
                snapshot: (!rd.snapshot().is_empty()).then(|| rd.snapshot().clone()),
                entries: rd.take_entries(),
                hard_state: rd.hs().cloned(),
            };
            if !write.is_empty() {
                let log = self.log.clone();
                blocking(move || log.persist(&write)).await?;
            }

            // 3. Only now send what depends on that write: vote grants and append acks. A
            //    vote sent before its fsync could be cast twice after a crash.
            let persisted = rd.take_persisted_messages();
            self.send(persisted);

            // 4. Apply the committed entries (raft hands out at most min(committed,
            //    persisted)). There is no state machine: only conf changes do anything.
            let committed = rd.take_committed_entries();
            self.apply(committed).await?;

            // 5. Advance: marks those entries applied and returns the LightReady.
            let mut light = self.rn.advance(rd);

            // 5a. Persist the new commit index (no later than the entries are applied).
            if let Some(commit) = light.commit_index() {
                let log = self.log.clone();
                blocking(move || log.set_commit(commit)).await?;
            }

            // 5b. Send the LightReady's messages (only a leader has any).
            let more = light.take_messages();
            self.send(more);

            // 5c. Apply its committed entries.
            let committed = light.take_committed_entries();
            self.apply(committed).await?;

            // 5d. Tell raft they are applied; without this `applied` freezes and the leader
            //     never becomes established.
            self.rn.advance_apply();

            // 6. Report peers we could not send to, only now that advance has run (both
            //    calls step internally).
            for peer in std::mem::take(&mut self.unreachable) {
                self.rn.report_unreachable(peer);
            }
            for peer in std::mem::take(&mut self.snapshot_failed) {
                self.rn.report_snapshot(peer, SnapshotStatus::Failure);
            }

            // 7. Keep the log short: compact behind the applied index.
            self.maybe_compact().await?;
        }
        Ok(())
    }

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

    async fn apply(&mut self, entries: Vec<Entry>) -> Result<(), NodeError> {
        for entry in entries {
            let cs = match entry.get_entry_type() {
                EntryType::EntryNormal => continue,
                // No API proposes conf changes; a committed one still has to be applied for
                // the cluster to agree on membership.
                EntryType::EntryConfChange => {
                    let mut cc = ConfChange::default();
                    if let Err(err) = cc.merge_from_bytes(&entry.data) {
                        warn!(index = entry.index, cause = %err, "undecodable conf change skipped");
                        continue;
                    }
                    self.rn.apply_conf_change(&cc)
                }
                EntryType::EntryConfChangeV2 => {
                    let mut cc = ConfChangeV2::default();
                    if let Err(err) = cc.merge_from_bytes(&entry.data) {
                        warn!(index = entry.index, cause = %err, "undecodable conf change skipped");
                        continue;
                    }
                    self.rn.apply_conf_change(&cc)
                }
            };
            match cs {
                Ok(cs) => {
                    info!(index = entry.index, voters = ?cs.voters, "conf change applied");
                    let log = self.log.clone();
                    blocking(move || log.set_conf_state(&cs)).await?;
                }
                Err(err) => warn!(index = entry.index, cause = %err, "conf change refused"),
            }
        }
        Ok(())
    }

    async fn maybe_compact(&mut self) -> Result<(), NodeError> {
        let applied = self.rn.raft.raft_log.applied;
        let first = self.rn.store().first_index().unwrap_or(1);
        if applied + 1 >= first + LOG_ENTRIES_RETAINED + LOG_COMPACT_STEP {
            let to = applied + 1 - LOG_ENTRIES_RETAINED;
            let log = self.log.clone();
            blocking(move || log.compact(to)).await?;
            debug!(first_index = to, applied, "raft log compacted");
        }
        Ok(())
    }

    fn leader_id(&self) -> Option<u64> {
        let id = self.rn.raft.leader_id;
        (id != 0).then_some(id)
    }

    fn start_transfer(
        &mut self,
        to: Option<u64>,
        reply: oneshot::Sender<Result<Transferred, TransferError>>,
    ) {
        let is_leader = self.rn.raft.state == StateRole::Leader;
        let term = self.rn.raft.term;
        let leader_id = self.leader_id();
        let voters = self.rn.raft.prs().conf().voters().clone();
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
                    .rn
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
        self.rn.transfer_leader(to);
        if is_leader && self.rn.raft.lead_transferee != Some(to) {
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
    fn check_transfers(&mut self) {
        if self.transfers.is_empty() {
            return;
        }
        let term = self.rn.raft.term;
        let state = self.rn.raft.state;
        let transferee = self.rn.raft.lead_transferee;
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

    /// Withdraws a published token as soon as raft no longer backs it, leaving every other
    /// field as published (those wait for the Ready to be persisted).
    fn withdraw_token_if_lost(&mut self) {
        let r = &self.rn.raft;
        let backed = |token: u64| {
            r.state == StateRole::Leader && r.term == token && r.lead_transferee.is_none()
        };
        let withdrawn = self.leadership.send_if_modified(|l| match l.token {
            Some(token) if !backed(token) => {
                l.token = None;
                l.announced = false;
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
    fn publish(&mut self) {
        let r = &self.rn.raft;
        let role = Role::from(r.state);
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
        let next = Leadership {
            term: r.term,
            leader_id: self.leader_id(),
            role,
            token,
            announced,
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
            info!(term = next.term, "became leader");
        }
        if role != prev.role {
            info!(term = next.term, role = %role, previous = %prev.role, "role changed");
        }
        if next.leader_id != prev.leader_id && next.leader_id.is_some() {
            self.metrics.leader_changes.increment(1);
            info!(term = next.term, leader_id = ?next.leader_id, "leader changed");
        }
        if token != prev.token {
            if let Some(t) = token {
                info!(
                    term = next.term,
                    token = t,
                    "established leader: token available"
                );
            } else {
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

    /// Final duties: no token is shown by a stopped node, and every request is answered.
    fn stop(&mut self) {
        self.inbox.close();
        while let Ok(msg) = self.inbox.try_recv() {
            if let Msg::Transfer { reply, .. } = msg {
                let _ = reply.send(Err(TransferError::Stopped));
            }
        }
        for t in self.transfers.drain(..) {
            let _ = t.reply.send(Err(TransferError::Stopped));
        }
        self.leadership.send_modify(|l| {
            l.token = None;
            l.announced = false;
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

/// Runs a raft-log write on the blocking pool.
async fn blocking(
    f: impl FnOnce() -> Result<(), RaftLogError> + Send + 'static,
) -> Result<(), NodeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| NodeError::Task(e.to_string()))?
        .map_err(|e| NodeError::Storage(e.to_string()))
}
