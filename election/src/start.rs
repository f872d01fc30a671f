//! Starting a node: the composition root. It reads the node's secrets and certificates,
//! opens the raft log and prepares the members table, binds the transport and the API,
//! runs the announcers, the score prober and the audit log's membership watch, and spawns
//! the election loop (`crate::node`) with the parts it prepared. Every other module is
//! below this one: none of them starts anything it does not own.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use palisade_protocol::process::{TEST_FAULTS_ENV, events};
use palisade_protocol::{MemberList, Scope};
use palisade_storage::{MembersTable, OpenError, RaftLog, RaftLogError};
use raft::RawNode;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, info, info_span, warn};

use crate::announce::{self, Announcer};
use crate::api::{self, ApiState, LeaseApi};
use crate::audit::{self, Observer};
use crate::config::{ConfigError, NodeConfig};
use crate::leadership::Leadership;
use crate::members;
use crate::metrics::NodeMetrics;
use crate::node::{self, Commands, INBOX_MAX, LoopParts, NodeHandle, TokenSigner};
use crate::score::board::ScoreBoard;
use crate::score::{ScoreOracle, probe};
use crate::transport::faults::LinkFaults;
use crate::transport::mem::MemNetwork;
use crate::transport::{PeerInbox, Transport, tcp};

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
        let opened = path.clone();
        let (log, record) = blocking_start(move || {
            let db = palisade_storage::open_database(&opened)?;
            let log = RaftLog::open(db)?;
            // A log that once held a configuration and now reads back as new was reset
            // by damage: never start it as a fresh node.
            palisade_storage::check_holds_state(&opened, log.is_initialized())?;
            let record = palisade_storage::TermRecord::open(&opened)?;
            record.check(&opened, log.hard_state().term)?;
            Ok::<_, StartError>((log, record))
        })
        .await?;
        let kept = log.clone();
        let handle = start(config, log, TransportSpec::Tcp, options, Some(record)).await?;
        // From the first start on (the log initialized by `start`), its loss is noticed.
        blocking_start(move || {
            Ok::<_, StartError>(palisade_storage::check_holds_state(
                &path,
                kept.is_initialized(),
            )?)
        })
        .await?;
        Ok(handle)
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
        start(
            config,
            log,
            TransportSpec::Memory(net.clone()),
            options,
            None,
        )
        .await
    }
}

/// How a node starts, beyond its [`crate::NodeConfig`].
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Join a running cluster (`palisade node --join URL`): the member list a member
    /// answered, which must name this node. A node with an empty log then does not
    /// create a membership of its own (it must never elect itself alone): it waits for
    /// the leader's snapshot. A node whose log already has the cluster restarts normally.
    pub join: Option<MemberList>,
    /// Entries kept behind the applied index when the log is compacted, and compacted at
    /// once when as many more accumulated. `None`: 1,000 retained, compacted every 1,000
    /// more. Small values make compaction (and snapshots) happen in tests.
    pub log_entries_retained: Option<u64>,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The database could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The raft log could not be loaded.
    #[error(transparent)]
    Log(#[from] RaftLogError),
    /// A configuration value is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
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

/// Runs `f` (storage work) on a blocking thread; inline in deterministic mode (the
/// simulation, `crate::deterministic`).
async fn blocking_start<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StartError> + Send + 'static,
) -> Result<T, StartError> {
    if crate::deterministic::is_on() {
        return f();
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StartError::Task(e.to_string()))?
}

/// Which transport a node's peers are reached over.
enum TransportSpec {
    Tcp,
    Memory(MemNetwork),
}

/// Starts the node `config` describes over its opened `log`: everything around the
/// election loop, then the loop itself.
async fn start(
    config: NodeConfig,
    log: RaftLog,
    transport: TransportSpec,
    options: StartOptions,
    term_record: Option<palisade_storage::TermRecord>,
) -> Result<NodeHandle, StartError> {
    let id = config.id;
    let members_table = prepare(&config, &log, options.join.as_ref()).await?;
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
        Some(path) => Some(node::load_bearer(path)?),
        None => None,
    };
    // TLS files are read and checked before anything binds, like the secrets above.
    let tls = crate::tls::prepare(&config)?;
    let announce_tls = announce::client_tls(config.tls.as_ref())?;
    let raft_config = config.raft_config();
    let logger = slog::Logger::root(tracing_slog::TracingSlogDrain, slog::o!());
    let raw_node = {
        let _span = info_span!("node", node_id = id).entered();
        RawNode::new(&raft_config, log.clone(), &logger)?
    };
    let hard_state = log.hard_state();
    // Every member this node talks raft with, at the addresses of the members table (a
    // joining node has no conf state yet, but the table the cluster answered).
    let peers = members::peer_map(&members_table, &log.conf_state(), id, &own_peer);
    let (members_tx, members_rx) = watch::channel(members::view(&members_table, &log.conf_state()));
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
            let (t, addr) = tcp::start(
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
        let probe = (oracle == ScoreOracle::StorageRtt).then(|| {
            probe::spawn_storage_probe(
                id,
                &config.announce,
                &announce_tls,
                shutdown.clone(),
                &mut tasks,
            )
        });
        ScoreBoard::new(&config, oracle, probe, metrics.score_transfers.clone())
    });
    let score_view = scores.as_ref().map(ScoreBoard::view);

    let observer = Arc::new(Observer::new(id, &config.announce, audit::open(&config)?));
    if observer.audit_log().is_some() {
        tasks.spawn(audit::watch_members(
            Arc::clone(&observer),
            members_rx.clone(),
            leadership_rx.clone(),
            shutdown.clone(),
        ));
    }
    // What retires the proxies a `POST /v1/announce` removes: the announcers' credentials.
    let fences = Arc::new(announce::ProxyFences::new(
        config.scope.clone(),
        announce_bearer.clone(),
        announce_tls.clone(),
        Arc::clone(&observer),
    ));
    // Named leaderships: the machine as stored (the loop owns it), and the fencer that
    // raises every announce proxy's fence to each grant (never with fleet leases).
    let machine = crate::scopes::Machine::decode(&log.scopes()).map_err(|e| {
        StartError::Log(RaftLogError::Corrupt(format!(
            "the named-leaderships state does not decode: {e}"
        )))
    })?;
    let (mut scopes_loop, scopes_shared) = node::ScopesLoop::new(machine);
    let (fenced_tx, fenced_rx) = watch::channel(announce::Fenced::new());
    let scopes_service = node::ScopesService::new(node::ScopesParts {
        shared: scopes_shared.clone(),
        fenced: fenced_rx,
        leadership: leadership_rx.clone(),
        commands: commands.clone(),
        signer: signer.clone(),
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
        cluster_scope: config.scope.clone(),
        available: !config.leases_on(),
    });
    let scopes_api = api::ScopesApi {
        service: scopes_service.clone(),
        forward_tls: announce_tls.clone(),
    };
    let announcer = Announcer {
        scope: config.scope.clone(),
        urls: Vec::new(),
        bearer: announce_bearer,
        signer: signer.clone(),
        tls: announce_tls,
        leadership: leadership_rx.clone(),
        commands: commands.clone(),
        metrics: metrics.clone(),
        observer: Arc::clone(&observer),
        shutdown: shutdown.clone(),
    };
    if !config.leases_on() {
        tasks.spawn(
            announce::fence_grants(announce::GrantFencer {
                template: announcer.clone(),
                machine: scopes_shared.machine.clone(),
                lists: announce_rx.clone(),
                fenced: fenced_tx,
                commands: commands.clone(),
            })
            .instrument(info_span!("grant_fencer", node_id = id)),
        );
    }
    // The announcers follow the announce list the loop publishes: the flags', or the one
    // the cluster agreed on (`POST /v1/announce`, never with fleet leases).
    announce::follow(
        announcer,
        announce_rx.clone(),
        shutdown.clone(),
        &mut tasks,
        info_span!("announcer", node_id = id, scope = %config.scope),
    );

    if tls.is_none() && config.api.is_some() {
        warn!(
            node_id = id,
            "roles are not enforced: the node API is plaintext (no --cert/--key/--ca), so \
             every caller may use every route; with mutual TLS each route admits only the \
             roles its client certificate names (node-, proxy-, writer-, operator-)"
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
                api::serve(
                    listener,
                    ApiState {
                        node_id: id,
                        scope,
                        leadership: leadership_rx.clone(),
                        commands: commands.clone(),
                        metrics: metrics.clone(),
                        leases: LeaseApi::from_config(&config),
                        faults: faults.is_enabled().then(|| Arc::clone(&faults)),
                        scores: score_view.clone(),
                        members: members_rx.clone(),
                        announce: announce_rx.clone(),
                        observer: Arc::clone(&observer),
                        fences: Arc::clone(&fences),
                        shutdown: shutdown.clone(),
                        roles_enforced: tls.is_some(),
                        scopes: Some(scopes_api),
                    },
                    tls.as_ref().map(|t| t.api_acceptor.clone()),
                )
                .instrument(info_span!("api", node_id = id)),
            );
            Some(bound)
        }
        None => None,
    };

    scopes_loop.own_api = api_addr.map(|bound| {
        api_base_url(
            bound,
            config.peers.get(&id).map(String::as_str),
            tls.is_some(),
        )
    });
    let has_key = signer.is_some();
    let main = node::spawn(
        &config,
        LoopParts {
            raw_node,
            log,
            transport,
            inbox: rx,
            leadership: leadership_tx,
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
            signer,
            scores,
            scopes: scopes_loop,
            voters: peers.keys().copied().collect(),
            members: members_table,
            members_tx,
            own_peer,
            announce_tx,
            no_proxies: announce_urls.is_empty(),
            log_entries_retained: options.log_entries_retained,
            term_record,
        },
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
        scopes: scopes_service,
    })
}

/// `--force-new-cluster`: rewrites the stored configuration to this node alone (see
/// `palisade_storage`'s `RaftLog::force_new_cluster`), loudly. The log, the hard state and
/// so the term are kept: the next election raises the term above every one this node
/// stored, so its tokens keep increasing.
fn force_new_cluster(log: &RaftLog, id: u64) -> Result<(), StartError> {
    let forced = log.force_new_cluster(id)?;
    if forced.already {
        warn!(
            node_id = id,
            term = forced.term,
            index = forced.index,
            "--force-new-cluster given again on a node it already made the only voter, with \
             no membership change since: nothing to do; remove the flag"
        );
        return Ok(());
    }
    warn!(
        node_id = id,
        term = forced.term,
        index = forced.index,
        previous_voters = ?forced.previous.voters,
        previous_voters_outgoing = ?forced.previous.voters_outgoing,
        previous_learners = ?forced.previous.learners,
        removed = ?forced.removed,
        "!!! FORCING A NEW CLUSTER: this node is now the only voter of its configuration \
         (log and term kept); members {:?} are removed for good and their ids are never \
         accepted again. NEVER restart those nodes with their old data: they could elect a \
         leader of their own and hand out tokens that collide with this cluster's. Add \
         members again with `palisade member add` (they join as learners), and restart this \
         node WITHOUT --force-new-cluster from now on",
        forced.removed
    );
    Ok(())
}

/// Prepares the members table a node starts with, initializing a new log from `--peers`
/// unless the node joins. Refuses a removed id and a log that belongs to another node.
async fn prepare(
    config: &NodeConfig,
    log: &RaftLog,
    join: Option<&MemberList>,
) -> Result<MembersTable, StartError> {
    let id = config.id;
    let peers = config.peers.clone();
    let join = join.cloned();
    let log = log.clone();
    let force = config.force_new_cluster;
    blocking_start(move || {
        if force {
            if join.is_some() {
                return Err(crate::config::force_with_join().into());
            }
            force_new_cluster(&log, id)?;
        } else {
            // A start without the flag: a later loss of quorum may be recovered again.
            log.clear_forced_mark()?;
        }
        if log.is_initialized() {
            let cs = log.conf_state();
            let mut table = log.members();
            if table.is_empty() {
                // A log written before membership changes: its voters are the members,
                // at the addresses `--peers` gives.
                let mut initial = BTreeMap::new();
                for voter in &cs.voters {
                    let addr = peers.get(voter).ok_or_else(|| {
                        ConfigError::new(
                            "peers",
                            format!("does not name voter {voter} of this node's log"),
                        )
                    })?;
                    initial.insert(*voter, addr.clone());
                }
                table = MembersTable::initial(&initial);
            }
            if table.is_removed(id) {
                return Err(ConfigError::new(
                    "id",
                    format!(
                        "node {id} was removed from the cluster (this data directory still \
                         holds its log); ids are never reused: add this machine under a new \
                         id and start it with --join and an empty data directory"
                    ),
                )
                .into());
            }
            let in_conf = members::conf_ids(&cs).any(|v| v == id);
            if !in_conf && !table.is_member(id) {
                return Err(ConfigError::new(
                    "data_dir",
                    format!(
                        "holds the raft log of a cluster whose members {:?} do not include \
                         node {id}: it belongs to another node or cluster; use an empty \
                         data directory",
                        table.members().keys().collect::<Vec<_>>()
                    ),
                )
                .into());
            }
            return Ok(table);
        }
        if let Some(list) = join {
            if list.removed.contains(&id) {
                return Err(ConfigError::new(
                    "id",
                    format!("node {id} was removed from the cluster; ids are never reused"),
                )
                .into());
            }
            if !list.members.iter().any(|m| m.id == id) {
                return Err(ConfigError::new(
                    "id",
                    format!(
                        "node {id} is not a member of the cluster yet: run `palisade member \
                             add --node URL --id {id} --peer HOST:PORT` first"
                    ),
                )
                .into());
            }
            return Ok(members::table_from_list(&list));
        }
        log.initialize_members(&peers)?;
        Ok(log.members())
    })
    .await
}

/// This node's API base URL as other nodes reach it: the bound address, or, when bound to
/// every interface, the host of its own peer address with the API's port.
fn api_base_url(bound: std::net::SocketAddr, own_peer: Option<&str>, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    let host = match own_peer.and_then(crate::config::split_host_port) {
        Some((host, _)) if bound.ip().is_unspecified() => host.to_owned(),
        _ => return format!("{scheme}://{bound}"),
    };
    format!("{scheme}://{host}:{}", bound.port())
}
