//! The node: starting it, its handle, and the election loop that owns the `RawNode`.
//!
//! One task owns the `RawNode` (no `Arc<Mutex<RawNode>>`). Everything else talks to it
//! through one bounded inbox of [`Msg`]: peer traffic from the transport, transfer requests
//! from the API or the embedding application, and the announcer's reports. Ticks come from
//! a `tokio::time::interval` with `MissedTickBehavior::Delay`, so a node that was paused
//! does not fire a burst of ticks (and a spurious election) when it resumes.
//!
//! After every wake-up the loop handles raft's `Ready` in the order raft-rs documents for
//! `RawNode` and then publishes a [`Leadership`] on a watch channel.
//!
//! # Layout
//! - `mod.rs` (this file): the limits, the inbox message, [`Node::start`].
//! - `error`: [`StartError`], [`NodeError`], [`TransferError`].
//! - `handle`: [`NodeHandle`] and `Commands`, the ways into a running loop.
//! - `ready`: `ElectionLoop`, the task that owns the `RawNode` and handles each `Ready`.
//! - `transfer`: starting leadership transfers and answering them once decided.
//! - `publish`: turning raft's state into the published [`Leadership`], signing each new
//!   token's proof.
//! - `lease`: lease requests gathered into `ReadIndex` rounds, answered once a quorum
//!   confirms this node's leadership.
//! - `guard`: the last check of every peer message before `step` (defence in depth).
//! - `signer`: loading `--token-key` and `--announce-token-file`, and signing proofs.
//! - `membership`: membership changes in the loop (proposing, applying with the members
//!   table, snapshots), the start-up table and joining, and the wiped-storage stop.

mod error;
mod guard;
mod handle;
mod lease;
mod membership;
mod publish;
mod ready;
mod signer;
mod transfer;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use raft::RawNode;
use raft::eraftpb::Message;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, info, info_span, warn};

use palisade_protocol::Scope;
use palisade_protocol::process::{TEST_FAULTS_ENV, events};
use palisade_storage::RaftLog;

use crate::config::{ConfigError, NodeConfig};
use crate::leadership::Leadership;
use crate::metrics::NodeMetrics;
use crate::transport::faults::LinkFaults;
use crate::transport::mem::MemNetwork;
use crate::transport::{PeerInbox, Transport};
use guard::Guard;
pub(crate) use signer::TokenSigner;

pub use error::{LeaseError, NodeError, StartError, TransferError};
pub use guard::TERM_ACCEPTED_MAX;
pub(crate) use handle::Commands;
pub use handle::NodeHandle;
pub(crate) use lease::LeaseReply;
pub use lease::{LEASE_GATHER_LEASE_DIVISOR, LEASE_GATHER_MS_MAX, LEASE_ROUND_TIMEOUT_MS};
pub use membership::StartOptions;
pub use palisade_protocol::Transferred;
use ready::ElectionLoop;
pub use signer::KEY_FILE_BYTES_MAX;

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
    /// Every announce proxy accepted the established term `term`.
    Announced { term: u64 },
    /// A lease request: answer with the term a quorum confirmed after it arrived.
    Lease { reply: LeaseReply },
    /// A membership change: check and propose it; the reply says whether raft took it.
    Member {
        change: crate::members::MemberChange,
        reply: membership::MemberReply,
    },
    /// A peer's score frame, already checked by the transport (see `crate::score`).
    Score {
        from: u64,
        frame: crate::transport::ScoreFrame,
    },
}

/// Entry point for running a node.
#[derive(Debug)]
pub struct Node;

impl Node {
    /// Starts a node with its redb log under `config.data_dir`, TCP to its peers, and the
    /// HTTP API when `config.api` is set.
    #[tracing::instrument(skip_all, fields(node_id = config.id))]
    pub async fn start(config: NodeConfig) -> Result<NodeHandle, StartError> {
        Self::start_with(config, StartOptions::default()).await
    }

    /// [`Node::start`] with [`StartOptions`]: joining a running cluster, compaction.
    #[tracing::instrument(skip_all, fields(node_id = config.id))]
    pub async fn start_with(
        config: NodeConfig,
        options: StartOptions,
    ) -> Result<NodeHandle, StartError> {
        config.validate()?;
        let path = config.database_path();
        let log = blocking_start(move || {
            let db = palisade_storage::open_database(&path)?;
            Ok::<_, StartError>(RaftLog::open(db)?)
        })
        .await?;
        start(config, log, TransportSpec::Tcp, options).await
    }

    /// Starts a node whose peers are reached over the in-memory `net`, with its raft log in
    /// `db` (typically an in-memory redb). `config.data_dir` is not used. For tests.
    pub async fn start_in_memory(
        config: NodeConfig,
        db: Arc<redb::Database>,
        net: &MemNetwork,
    ) -> Result<NodeHandle, StartError> {
        Self::start_in_memory_with(config, db, net, StartOptions::default()).await
    }

    /// [`Node::start_in_memory`] with [`StartOptions`]. For tests.
    pub async fn start_in_memory_with(
        mut config: NodeConfig,
        db: Arc<redb::Database>,
        net: &MemNetwork,
        options: StartOptions,
    ) -> Result<NodeHandle, StartError> {
        if config.data_dir.as_os_str().is_empty() {
            config.data_dir = "<memory>".into();
        }
        config.validate()?;
        let log = blocking_start(move || Ok::<_, StartError>(RaftLog::open(db)?)).await?;
        start(config, log, TransportSpec::Memory(net.clone()), options).await
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
    options: StartOptions,
) -> Result<NodeHandle, StartError> {
    let id = config.id;
    let members_table = membership::prepare(&config, &log, options.join.as_ref()).await?;
    let own_peer = config.peers.get(&id).cloned().unwrap_or_default();
    // `validate` checked the scope already; this turns it into the API's type.
    let scope = Scope::new(config.scope.clone())
        .map_err(|err| ConfigError::new("scope", err.to_string()))?;
    // Secrets are read before anything binds, so a bad file is a configuration error that
    // names it, and nothing runs without the key the operator asked for.
    let signer = match &config.token_key {
        Some(path) => Some(Arc::new(TokenSigner::load(path, &config.scope)?)),
        None => None,
    };
    let announce_bearer = match &config.announce_token_file {
        Some(path) => Some(signer::load_bearer(path)?),
        None => None,
    };
    // TLS files are read and checked before anything binds, like the secrets above.
    let tls = crate::tls::prepare(&config)?;
    let announce_tls = crate::announce::client_tls(config.tls.as_ref())?;
    let raft_config = config.raft_config();
    let logger = slog::Logger::root(tracing_slog::TracingSlogDrain, slog::o!());
    let raw_node = {
        let _span = info_span!("node", node_id = id).entered();
        RawNode::new(&raft_config, log.clone(), &logger)?
    };
    let hard_state = log.hard_state();
    // Every member this node talks raft with, at the addresses of the members table (a
    // joining node has no conf state yet, but the table the cluster answered).
    let peers = crate::members::peer_map(&members_table, &log.conf_state(), id, &own_peer);
    let (members_tx, members_rx) =
        watch::channel(crate::members::view(&members_table, &log.conf_state()));
    // With fleet leases the list is always the flags' (the release rule depends on it).
    let announce_urls = match (&members_table.announce, config.leases_on()) {
        (Some(agreed), false) => agreed.clone(),
        _ => config.announce.clone(),
    };
    let (announce_tx, announce_rx) = watch::channel(announce_urls.clone());

    let shutdown = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let (tx, rx) = mpsc::channel(INBOX_MAX);
    let inbox = PeerInbox::new(tx.clone());
    // Test faults exist only on the TCP transport; the in-memory one has its own cuts.
    let faults = Arc::new(LinkFaults::new(
        config.test_faults && matches!(transport, TransportSpec::Tcp),
        id,
        peers.keys().copied(),
    ));
    if faults.is_enabled() {
        warn!(
            node_id = id,
            env = TEST_FAULTS_ENV,
            "test faults enabled: POST /v1/test/faults can drop or delay raft traffic"
        );
    }
    let (transport, peer_addr): (Box<dyn Transport>, Option<SocketAddr>) = match transport {
        TransportSpec::Tcp => {
            let (t, addr) = crate::transport::tcp::start(
                id,
                &peers,
                inbox,
                Arc::clone(&faults),
                tls.as_ref(),
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
    let commands = Commands::new(tx);

    // Scores (`--score-oracle`): the board lives in the election loop, the API reads its
    // view; `storage-rtt` also runs a prober of the announce proxies.
    let scores = config.score_oracle.map(|oracle| {
        let probe = (oracle == crate::score::ScoreOracle::StorageRtt).then(|| {
            crate::score::spawn_storage_probe(
                id,
                &config.announce,
                &announce_tls,
                shutdown.clone(),
                &mut tasks,
            )
        });
        crate::score::ScoreBoard::new(&config, oracle, probe, metrics.score_transfers.clone())
    });
    let score_view = scores.as_ref().map(crate::score::ScoreBoard::view);

    let observer = Arc::new(crate::audit::Observer::new(
        id,
        &config.announce,
        crate::audit::open(&config)?,
    ));
    if observer.audit_log().is_some() {
        tasks.spawn(crate::audit::watch_members(
            Arc::clone(&observer),
            members_rx.clone(),
            leadership_rx.clone(),
            shutdown.clone(),
        ));
    }
    // The announcer follows the announce list: the flags', or the one the cluster agreed
    // on (`POST /v1/announce`, never with fleet leases); see `membership`.
    {
        let scope = config.scope.clone();
        let signer = signer.clone();
        let leadership = leadership_rx.clone();
        let commands = commands.clone();
        let metrics = metrics.clone();
        let observer = Arc::clone(&observer);
        let make = move |urls, shutdown| crate::announce::Announcer {
            scope: scope.clone(),
            urls,
            bearer: announce_bearer.clone(),
            signer: signer.clone(),
            tls: announce_tls.clone(),
            leadership: leadership.clone(),
            commands: commands.clone(),
            metrics: metrics.clone(),
            observer: Arc::clone(&observer),
            shutdown,
        };
        membership::spawn_announcers(
            make,
            announce_rx.clone(),
            shutdown.clone(),
            &mut tasks,
            info_span!("announcer", node_id = id, scope = %config.scope),
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
                        scope,
                        leadership: leadership_rx.clone(),
                        commands: commands.clone(),
                        metrics: metrics.clone(),
                        leases: crate::lease::LeaseApi::from_config(&config),
                        faults: faults.is_enabled().then(|| Arc::clone(&faults)),
                        scores: score_view.clone(),
                        members: members_rx.clone(),
                        announce: announce_rx.clone(),
                        observer: Arc::clone(&observer),
                        shutdown: shutdown.clone(),
                    },
                    tls.as_ref().map(|t| t.api_acceptor.clone()),
                )
                .instrument(info_span!("api", node_id = id)),
            );
            Some(bound)
        }
        None => None,
    };

    let has_key = signer.is_some();
    let election_loop = ElectionLoop {
        id,
        raw_node,
        log,
        transport,
        inbox: rx,
        leadership: leadership_tx,
        metrics: metrics.clone(),
        no_proxies: announce_urls.is_empty(),
        transfers: Vec::new(),
        unreachable: BTreeSet::new(),
        snapshot_failed: BTreeSet::new(),
        transfer_ticks: TRANSFER_TIMEOUT_ELECTIONS * config.election_ticks,
        shutdown: shutdown.clone(),
        guard: Guard {
            voters: peers.keys().copied().collect(),
            max_term_gap: config.max_term_gap,
        },
        drop_log: guard::DropLog::default(),
        signer,
        leases: lease::LeaseRounds::new(lease::lease_gather_interval(&config)),
        release_wait: config.lease_release_wait(),
        established_at: None,
        scores,
        membership: membership::Membership {
            table: members_table,
            tx: members_tx,
            own_peer,
            compact_to_applied: false,
            lost: None,
            announce_tx,
            leases_on: config.leases_on(),
            retained: options.log_entries_retained.unwrap_or(LOG_ENTRIES_RETAINED),
            compact_step: options.log_entries_retained.unwrap_or(LOG_COMPACT_STEP),
        },
    };
    let main = tokio::spawn(
        election_loop
            .run(config.tick())
            .instrument(info_span!("node", node_id = id)),
    );
    info!(
        event = events::NODE_STARTED,
        node_id = id,
        scope = %config.scope,
        term = hard_state.term,
        peer_addr = ?peer_addr,
        api_addr = ?api_addr,
        tls = tls.is_some(),
        signed_tokens = has_key,
        max_term_gap = config.max_term_gap,
        lease_ms = config.lease_ms,
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
        members: members_rx,
    })
}
