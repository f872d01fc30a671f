//! `palisade node`: runs one election node (a raft member) with its HTTP API.
//!
//! Settings come from flags, then `PALISADE_*` environment variables, then the TOML file
//! named by `--config`, then defaults. The file uses the flags' names with underscores:
//!
//! ```toml
//! id = 1
//! peers = "1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003"   # or a table: [peers] 1 = "..."
//! data_dir = "/var/lib/palisade/node1"
//! api = "127.0.0.1:8001"
//! scope = "default"
//! announce = ["http://127.0.0.1:9001"]
//! tick_ms = 100
//! election_ticks = 5
//! heartbeat_ticks = 1
//! priority = 0
//! token_key = "/etc/palisade/token.key"      # sign tokens: the leader view gains "proof"
//! announce_token_file = "/etc/palisade/admin.token"  # bearer token for --announce proxies
//! max_term_gap = 1000                         # refuse peer terms further ahead than this
//! lease_ms = 0                                # fleet leases for --announce proxies (0: off)
//! lease_drift_ppm = 10000                     # clock-rate bound for the release wait
//! lease_write_bound_ms = 500                  # lease check to storage apply, at most
//! insecure = false                            # plaintext off loopback (see below)
//! score_oracle = "static"                     # leaders placed by score; "off": raft's random
//! score = 10.0                                # the static oracle's score; higher is better
//! score_margin = 0.5                          # scores this close count as equal
//! score_hold_ms = 3000                        # a better follower waits this long to lead
//! audit_log = "/var/log/palisade/node1.audit" # one JSON line per announce, transfer, member change
//! audit_log_bytes_max = 67108864              # rotate the audit log at this size
//! audit_log_keep = 4                          # rotated audit files kept
//! # File-only knobs (leave them on):
//! check_quorum = true
//! pre_vote = true
//!
//! # Mutual TLS on the peer links and HTTPS with client certificates on the API
//! # (--cert, --key, --ca; all three or none). The certificate must name node-<id>.
//! [tls]
//! cert = "/etc/palisade/node-1.pem"
//! key = "/etc/palisade/node-1.key"
//! ca = "/etc/palisade/ca.pem"
//! ```
//!
//! Without TLS, the API and every peer address must be loopback IP addresses, unless
//! `--insecure` says plaintext may leave the machine (a warning is logged at start).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use palisade_client::{ClientTls, MemberList, NodeApi};
use palisade_election::StartOptions;
use palisade_election::{
    ConfigError, Node, NodeConfig, NodeError, NodeTls, ScoreOracle, StartError,
};
use palisade_protocol::process::{NodeReady, TEST_FAULTS_ENV, TEST_LOG_RETAINED_ENV};
use serde::Deserialize;

/// Flags of `palisade node`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NodeArgs {
    /// This node's raft id: a non-zero integer, unique in the cluster, never reused.
    #[arg(long, env = "PALISADE_ID", value_name = "N")]
    pub id: Option<u64>,
    /// Every voter's id and peer address, this node included: `1=HOST:PORT,2=HOST:PORT,...`.
    #[arg(long, env = "PALISADE_PEERS", value_name = "ID=HOST:PORT,...")]
    pub peers: Option<String>,
    /// Directory of the node's raft log (created when missing).
    #[arg(long, env = "PALISADE_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Address of the node's HTTP API, e.g. `127.0.0.1:8001`.
    #[arg(long, env = "PALISADE_API", value_name = "ADDR")]
    pub api: Option<String>,
    /// The fencing scope of this cluster's tokens [default: default].
    #[arg(long, env = "PALISADE_SCOPE", value_name = "NAME")]
    pub scope: Option<String>,
    /// Admin base URL of a proxy to fence on election (repeatable; in the environment,
    /// comma-separated).
    #[arg(
        long,
        env = "PALISADE_ANNOUNCE",
        value_name = "URL",
        value_delimiter = ','
    )]
    pub announce: Vec<String>,
    /// Tick period in milliseconds [default: 100].
    #[arg(long, env = "PALISADE_TICK_MS", value_name = "MS")]
    pub tick_ms: Option<u64>,
    /// Election timeout in ticks [default: 5]. With a score oracle the best-ranked node
    /// campaigns one tick after it and the others later by rank; with `--score-oracle off`
    /// raft randomizes it up to twice this.
    #[arg(long, env = "PALISADE_ELECTION_TICKS", value_name = "N")]
    pub election_ticks: Option<u64>,
    /// Heartbeat interval in ticks [default: 1].
    #[arg(long, env = "PALISADE_HEARTBEAT_TICKS", value_name = "N")]
    pub heartbeat_ticks: Option<u64>,
    /// raft election priority: breaks ties in votes and transfers [default: 0].
    #[arg(
        long,
        env = "PALISADE_PRIORITY",
        value_name = "N",
        allow_hyphen_values = true
    )]
    pub priority: Option<i64>,
    /// The cluster's token signing key (PEM Ed25519 `PRIVATE KEY`, as `palisade keys
    /// generate` writes it): every token is published with its proof.
    #[arg(long, env = "PALISADE_TOKEN_KEY", value_name = "FILE")]
    pub token_key: Option<PathBuf>,
    /// A file holding the bearer token sent to `--announce` proxies whose admin API
    /// requires one (`--admin-token-file` there) and that cannot check proofs.
    #[arg(long, env = "PALISADE_ANNOUNCE_TOKEN_FILE", value_name = "FILE")]
    pub announce_token_file: Option<PathBuf>,
    /// Refuse a peer message whose term is more than N terms above this node's
    /// [default: 1000].
    #[arg(long, env = "PALISADE_MAX_TERM_GAP", value_name = "N")]
    pub max_term_gap: Option<u64>,
    /// Fleet leases: grant `--announce` proxies leases of MS milliseconds on
    /// `POST /v1/lease`, and hold each new token back until every proxy accepted it or
    /// MS * (1 + drift) + write bound passed [default: 0, leases off].
    #[arg(long, env = "PALISADE_LEASE_MS", value_name = "MS")]
    pub lease_ms: Option<u64>,
    /// With --lease-ms: the bound on clock-rate difference between proxies and nodes, in
    /// parts per million [default: 10000, i.e. 1%].
    #[arg(long, env = "PALISADE_LEASE_DRIFT_PPM", value_name = "PPM")]
    pub lease_drift_ppm: Option<u64>,
    /// With --lease-ms: the bound on the time from a proxy's last lease check to the
    /// storage applying the write [default: 500].
    #[arg(long, env = "PALISADE_LEASE_WRITE_BOUND_MS", value_name = "MS")]
    pub lease_write_bound_ms: Option<u64>,
    /// Place leaders by score: how this node scores itself, one of `static` (--score;
    /// with equal scores, the lower id ranks first), `storage-rtt` (round trip to the
    /// --announce proxies), `consensus-latency` (round trip to a quorum of peers),
    /// `rotating` (the next id after a failed leader), or `off` (no scores: raft's
    /// randomized election). The best node campaigns first and a leader hands over to a
    /// node that stays better [default: static].
    #[arg(long, env = "PALISADE_SCORE_ORACLE", value_name = "ORACLE")]
    pub score_oracle: Option<String>,
    /// The `static` oracle's score; higher is better [default: 0].
    #[arg(
        long,
        env = "PALISADE_SCORE",
        value_name = "N",
        allow_hyphen_values = true
    )]
    pub score: Option<f64>,
    /// Scores at most this far apart count as equal (ties go to the lower id); in
    /// milliseconds for the latency oracles [default: 0.5].
    #[arg(long, env = "PALISADE_SCORE_MARGIN", value_name = "X")]
    pub score_margin: Option<f64>,
    /// A leader hands over to a caught-up follower only after it scored better by more
    /// than the margin for this long [default: 3000].
    #[arg(long, env = "PALISADE_SCORE_HOLD_MS", value_name = "MS")]
    pub score_hold_ms: Option<u64>,
    /// Audit log: one JSON line per announce, transfer and membership change; read it
    /// with `palisade audit FILE`.
    #[arg(long, env = "PALISADE_AUDIT_LOG", value_name = "FILE")]
    pub audit_log: Option<PathBuf>,
    /// Rotate the audit log when it would grow past this size [default: 67108864].
    #[arg(long, env = "PALISADE_AUDIT_LOG_BYTES_MAX", value_name = "BYTES")]
    pub audit_log_bytes_max: Option<u64>,
    /// This node's certificate (PEM), issued by the cluster CA and naming `node-<id>`:
    /// mutual TLS on the peer links, HTTPS on the API. Needs --key and --ca.
    #[arg(long, env = "PALISADE_CERT", value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// This node's private key (PEM), for --cert.
    #[arg(long, env = "PALISADE_KEY", value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// The cluster CA (PEM): peers and API clients must present a certificate it issued.
    #[arg(long, env = "PALISADE_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Allow plaintext peer links and API on addresses other than loopback (without
    /// --cert/--key/--ca). Anyone who reaches them can impersonate a peer.
    #[arg(long, env = "PALISADE_INSECURE")]
    pub insecure: bool,
    /// TOML file with any of the settings above; flags and environment override it.
    #[arg(long, env = "PALISADE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Join a running cluster through this member's API URL: after `palisade member add`,
    /// start the new node with an empty --data-dir and --peers naming only itself; it
    /// learns the members and the log from the leader. A data dir that already holds this
    /// node's log restarts normally.
    #[arg(long, env = "PALISADE_JOIN", value_name = "URL")]
    pub join: Option<String>,
}

/// Why `palisade node` failed. [`NodeCommandError::exit_code`] gives the process exit code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeCommandError {
    /// A setting is wrong (exit 2); the message names it as flag and as file key.
    #[error("invalid --{} ({} in the config file): {}", .0.field.replace('_', "-"), .0.field, .0.message)]
    Config(#[from] ConfigError),
    /// The `--config` file cannot be read or parsed (exit 2).
    #[error("cannot use config file {path}: {message}")]
    ConfigFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The node could not start (exit 1, or 2 when it is a configuration error).
    #[error(transparent)]
    Start(#[from] StartError),
    /// The node stopped on a fatal error (exit 1).
    #[error(transparent)]
    Node(#[from] NodeError),
    /// `--join`: the cluster could not be asked for its members (exit 1).
    #[error("cannot join through {url}: {message}")]
    Join {
        /// The `--join` URL.
        url: String,
        /// What went wrong.
        message: String,
    },
}

impl NodeCommandError {
    /// 2 for usage and configuration errors, 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            NodeCommandError::Config(_) | NodeCommandError::ConfigFile { .. } => 2,
            NodeCommandError::Start(e) if e.is_config() => 2,
            _ => 1,
        }
    }
}

/// `peers` in the file: the flag's syntax, or a table of id to address.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum PeersSpec {
    Flag(String),
    Table(BTreeMap<String, String>),
}

/// The `--config` file. Every field is optional; each has the meaning of its flag.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct FileConfig {
    /// `--id`.
    id: Option<u64>,
    /// `--peers`.
    peers: Option<PeersSpec>,
    /// `--data-dir`.
    data_dir: Option<PathBuf>,
    /// `--api`.
    api: Option<String>,
    /// `--scope`.
    scope: Option<String>,
    /// `--announce`, as a list.
    announce: Option<Vec<String>>,
    /// `--tick-ms`.
    tick_ms: Option<u64>,
    /// `--election-ticks`.
    election_ticks: Option<u64>,
    /// `--heartbeat-ticks`.
    heartbeat_ticks: Option<u64>,
    /// `--priority`.
    priority: Option<i64>,
    /// `--token-key`.
    token_key: Option<PathBuf>,
    /// `--announce-token-file`.
    announce_token_file: Option<PathBuf>,
    /// `--max-term-gap`.
    max_term_gap: Option<u64>,
    /// `--lease-ms`.
    lease_ms: Option<u64>,
    /// `--lease-drift-ppm`.
    lease_drift_ppm: Option<u64>,
    /// `--lease-write-bound-ms`.
    lease_write_bound_ms: Option<u64>,
    /// `--insecure`.
    insecure: Option<bool>,
    /// `--score-oracle`.
    score_oracle: Option<String>,
    /// `--score`.
    score: Option<f64>,
    /// `--score-margin`.
    score_margin: Option<f64>,
    /// `--score-hold-ms`.
    score_hold_ms: Option<u64>,
    /// `--audit-log`.
    audit_log: Option<PathBuf>,
    /// `--audit-log-bytes-max`.
    audit_log_bytes_max: Option<u64>,
    /// Rotated audit files kept (file only; default 4).
    audit_log_keep: Option<u32>,
    /// `--cert`, `--key`, `--ca`, as a table.
    tls: Option<FileTls>,
    /// Leader steps down without a quorum (file only; default true).
    check_quorum: Option<bool>,
    /// Pre-vote before campaigning (file only; default true).
    pre_vote: Option<bool>,
}

/// The file's `[tls]` table; each key may be overridden by its flag.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct FileTls {
    /// `--cert`.
    cert: Option<PathBuf>,
    /// `--key`.
    key: Option<PathBuf>,
    /// `--ca`.
    ca: Option<PathBuf>,
}

/// `--cert`, `--key` and `--ca` (each over its `[tls]` key): all three, or none.
fn tls_files(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
) -> Result<Option<NodeTls>, ConfigError> {
    match (cert, key, ca) {
        (None, None, None) => Ok(None),
        (Some(cert), Some(key), Some(ca)) => Ok(Some(NodeTls { cert, key, ca })),
        (cert, key, _) => {
            let missing = if cert.is_none() {
                "cert"
            } else if key.is_none() {
                "key"
            } else {
                "ca"
            };
            Err(ConfigError::new(
                missing,
                "is missing: TLS needs --cert, --key and --ca together",
            ))
        }
    }
}

/// Parses `1=HOST:PORT,2=HOST:PORT`.
fn parse_peers(spec: &str) -> Result<BTreeMap<u64, String>, ConfigError> {
    let mut peers = BTreeMap::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((id, addr)) = item.split_once('=') else {
            return Err(ConfigError::new(
                "peers",
                format!("entry {item:?} is not ID=HOST:PORT"),
            ));
        };
        insert_peer(&mut peers, id, addr)?;
    }
    Ok(peers)
}

fn insert_peer(peers: &mut BTreeMap<u64, String>, id: &str, addr: &str) -> Result<(), ConfigError> {
    let id: u64 = id.trim().parse().map_err(|_| {
        ConfigError::new(
            "peers",
            format!("node id {id:?} is not a non-negative integer"),
        )
    })?;
    let addr = addr.trim();
    if peers.insert(id, addr.to_owned()).is_some() {
        return Err(ConfigError::new(
            "peers",
            format!("node id {id} is named twice"),
        ));
    }
    Ok(())
}

fn read_file(path: &PathBuf) -> Result<FileConfig, NodeCommandError> {
    let text = std::fs::read_to_string(path).map_err(|e| NodeCommandError::ConfigFile {
        path: path.clone(),
        message: e.to_string(),
    })?;
    toml::from_str(&text).map_err(|e| NodeCommandError::ConfigFile {
        path: path.clone(),
        message: e.to_string(),
    })
}

/// Builds and validates the node configuration: flags and environment over the file over
/// the defaults.
pub fn build_config(args: NodeArgs) -> Result<NodeConfig, NodeCommandError> {
    let file = match &args.config {
        Some(path) => read_file(path)?,
        None => FileConfig::default(),
    };
    let defaults = NodeConfig::default();
    let id = args
        .id
        .or(file.id)
        .ok_or_else(|| ConfigError::new("id", "is required (--id N)"))?;
    let peers = match (args.peers, file.peers) {
        (Some(flag), _) | (None, Some(PeersSpec::Flag(flag))) => parse_peers(&flag)?,
        (None, Some(PeersSpec::Table(table))) => {
            let mut peers = BTreeMap::new();
            for (id, addr) in &table {
                insert_peer(&mut peers, id, addr)?;
            }
            peers
        }
        (None, None) => {
            return Err(ConfigError::new("peers", "is required (--peers 1=HOST:PORT,...)").into());
        }
    };
    let data_dir = args
        .data_dir
        .or(file.data_dir)
        .ok_or_else(|| ConfigError::new("data_dir", "is required (--data-dir DIR)"))?;
    let api = args
        .api
        .or(file.api)
        .ok_or_else(|| ConfigError::new("api", "is required (--api HOST:PORT)"))?;
    let api: SocketAddr = api.parse().map_err(|e| {
        ConfigError::new(
            "api",
            format!("{api:?} is not an IP:PORT socket address: {e}"),
        )
    })?;
    let file_tls = file.tls.unwrap_or_default();
    let tls = tls_files(
        args.cert.or(file_tls.cert),
        args.key.or(file_tls.key),
        args.ca.or(file_tls.ca),
    )?;
    let score_oracle = match args.score_oracle.or(file.score_oracle) {
        Some(name) => ScoreOracle::parse_setting(&name)
            .map_err(|message| ConfigError::new("score_oracle", message))?,
        None => defaults.score_oracle,
    };
    let config = NodeConfig {
        id,
        peers,
        data_dir,
        api: Some(api),
        scope: args.scope.or(file.scope).unwrap_or(defaults.scope),
        announce: if args.announce.is_empty() {
            file.announce.unwrap_or_default()
        } else {
            args.announce
        },
        tick_ms: args.tick_ms.or(file.tick_ms).unwrap_or(defaults.tick_ms),
        election_ticks: args
            .election_ticks
            .or(file.election_ticks)
            .unwrap_or(defaults.election_ticks),
        heartbeat_ticks: args
            .heartbeat_ticks
            .or(file.heartbeat_ticks)
            .unwrap_or(defaults.heartbeat_ticks),
        priority: args.priority.or(file.priority).unwrap_or(defaults.priority),
        check_quorum: file.check_quorum.unwrap_or(defaults.check_quorum),
        pre_vote: file.pre_vote.unwrap_or(defaults.pre_vote),
        test_faults: false,
        token_key: args.token_key.or(file.token_key),
        announce_token_file: args.announce_token_file.or(file.announce_token_file),
        max_term_gap: args
            .max_term_gap
            .or(file.max_term_gap)
            .unwrap_or(defaults.max_term_gap),
        lease_ms: args.lease_ms.or(file.lease_ms).unwrap_or(defaults.lease_ms),
        lease_drift_ppm: args
            .lease_drift_ppm
            .or(file.lease_drift_ppm)
            .unwrap_or(defaults.lease_drift_ppm),
        lease_write_bound_ms: args
            .lease_write_bound_ms
            .or(file.lease_write_bound_ms)
            .unwrap_or(defaults.lease_write_bound_ms),
        tls,
        insecure: args.insecure || file.insecure.unwrap_or(false),
        score_oracle,
        score: args.score.or(file.score).unwrap_or(defaults.score),
        score_margin: args
            .score_margin
            .or(file.score_margin)
            .unwrap_or(defaults.score_margin),
        score_hold_ms: args
            .score_hold_ms
            .or(file.score_hold_ms)
            .unwrap_or(defaults.score_hold_ms),
        audit_log: args.audit_log.or(file.audit_log),
        audit_log_bytes_max: args
            .audit_log_bytes_max
            .or(file.audit_log_bytes_max)
            .unwrap_or(defaults.audit_log_bytes_max),
        audit_log_keep: file.audit_log_keep.unwrap_or(defaults.audit_log_keep),
    };
    config.validate()?;
    Ok(config)
}

/// Runs `palisade node` until SIGTERM/SIGINT (then hands leadership over and stops) or a
/// fatal error.
pub async fn run(args: NodeArgs) -> Result<(), NodeCommandError> {
    let join = args.join.clone();
    let mut config = build_config(args)?;
    // Test faults (drop or delay raft traffic per peer through `POST /v1/test/faults`)
    // are for end-to-end tests only: no flag, no config key, only this variable.
    config.test_faults = std::env::var_os(TEST_FAULTS_ENV).is_some_and(|v| v == "1");
    let mut options = StartOptions::default();
    // A small compaction threshold, for end-to-end tests of snapshots only: no flag, no
    // config key, only this variable.
    if let Some(v) = std::env::var_os(TEST_LOG_RETAINED_ENV) {
        let n = v.to_str().and_then(|v| v.parse().ok()).ok_or_else(|| {
            ConfigError::new(
                "log_retained",
                format!(
                    "{TEST_LOG_RETAINED_ENV}={} is not a number of entries",
                    v.to_string_lossy()
                ),
            )
        })?;
        options.log_entries_retained = Some(n);
    }
    if let Some(url) = join {
        options.join = Some(join_members(&config, &url).await?);
    }
    let mut node = Node::start_with(config, options)
        .await
        .map_err(|e| match e {
            StartError::Config(c) => NodeCommandError::Config(c),
            other => NodeCommandError::Start(other),
        })?;
    // A line on stdout that scripts and tests can wait for.
    let ready = NodeReady {
        id: node.id(),
        api: node.api_addr(),
        peer: node.peer_addr(),
    };
    println!("{ready}");
    let stopped = tokio::select! {
        () = crate::shutdown_signal() => {
            tracing::info!(node_id = node.id(), "stopping");
            None
        }
        outcome = node.wait() => Some(outcome),
    };
    match stopped {
        None => Ok(node.shutdown().await?),
        Some(outcome) => Ok(outcome?),
    }
}

/// `--join URL`: checks the flags and the data directory, and asks the cluster for its
/// members. A data directory that already holds a raft log restarts normally (the node
/// checks that the log is this node's), so then an unreachable URL is no error.
async fn join_members(config: &NodeConfig, url: &str) -> Result<MemberList, NodeCommandError> {
    let join_error = |message: String| NodeCommandError::Join {
        url: url.to_owned(),
        message,
    };
    if config.peers.len() != 1 {
        return Err(ConfigError::new(
            "peers",
            format!(
                "with --join names only this node (--peers {}=HOST:PORT); the node learns the \
                 other members from the cluster",
                config.id
            ),
        )
        .into());
    }
    let has_log = config.database_path().exists();
    if !has_log {
        let foreign =
            std::fs::read_dir(&config.data_dir).is_ok_and(|mut entries| entries.next().is_some());
        if foreign {
            return Err(ConfigError::new(
                "data_dir",
                format!(
                    "{} is not empty but holds no raft log: --join needs an empty data \
                     directory",
                    config.data_dir.display()
                ),
            )
            .into());
        }
    }
    // With TLS the node asks as itself: its certificate is from the cluster CA, which the
    // members' APIs require of clients.
    let api = match &config.tls {
        None => NodeApi::new(url),
        Some(tls) => ClientTls::new()
            .trust_pem_file(&tls.ca)
            .and_then(|t| t.identity_pem_files(&tls.cert, &tls.key))
            .and_then(|t| NodeApi::with_tls(url, &t)),
    }
    .map_err(|e| join_error(e.to_string()))?;
    let list = match api.members().await {
        Ok(list) => list,
        // The log decides; an uninitialized one is refused with "not a member yet".
        Err(err) if has_log => {
            tracing::warn!(url, cause = %err, "cannot ask the cluster for its members; restarting from the data directory");
            return Ok(MemberList::default());
        }
        Err(err) => return Err(join_error(format!("the cluster did not answer: {err}"))),
    };
    if list.removed.contains(&config.id) {
        return Err(ConfigError::new(
            "id",
            format!(
                "node {} was removed from the cluster at {url} and ids are never reused: add \
                 this machine under a new id",
                config.id
            ),
        )
        .into());
    }
    let Some(me) = list.members.iter().find(|m| m.id == config.id) else {
        if has_log {
            return Ok(list);
        }
        return Err(ConfigError::new(
            "id",
            format!(
                "node {id} is not a member of the cluster at {url} yet: run `palisade member \
                 add --node {url} --id {id} --peer HOST:PORT` first",
                id = config.id
            ),
        )
        .into());
    };
    let own = config.peers.get(&config.id).cloned().unwrap_or_default();
    if me.peer != own {
        return Err(ConfigError::new(
            "peers",
            format!(
                "names {own} for node {}, but the cluster added it with peer address {}",
                config.id, me.peer
            ),
        )
        .into());
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: `--join` refuses, before anything starts, what cannot be a join: `--peers`
    /// naming other nodes (exit 2), a non-empty data directory without a raft log (exit
    /// 2), and a join URL that does not answer (exit 1, naming the URL). Method: call
    /// `join_members` with each; the URL is a closed local port.
    #[tokio::test]
    async fn join_refuses_other_peers_a_foreign_dir_and_a_silent_url() {
        let dir = tempfile::tempdir().unwrap();
        let url = "http://127.0.0.1:1";
        let mut config = NodeConfig {
            id: 4,
            peers: [(4, "127.0.0.1:7004".to_owned())].into_iter().collect(),
            data_dir: dir.path().join("node4"),
            ..NodeConfig::default()
        };
        let err = join_members(&config, url).await.unwrap_err();
        assert!(matches!(err, NodeCommandError::Join { .. }), "{err}");
        assert_eq!(err.exit_code(), 1);
        assert!(err.to_string().contains(url), "{err}");

        config.peers.insert(1, "127.0.0.1:7001".to_owned());
        let err = join_members(&config, url).await.unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        assert!(err.to_string().contains("only this node"), "{err}");

        config.peers.remove(&1);
        std::fs::create_dir_all(&config.data_dir).unwrap();
        std::fs::write(config.data_dir.join("notes.txt"), "not a raft log").unwrap();
        let err = join_members(&config, url).await.unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        assert!(err.to_string().contains("holds no raft log"), "{err}");
    }

    fn args() -> NodeArgs {
        NodeArgs {
            id: Some(1),
            peers: Some("1=127.0.0.1:7001, 2=127.0.0.1:7002".into()),
            data_dir: Some("/tmp/n1".into()),
            api: Some("127.0.0.1:8001".into()),
            ..NodeArgs::default()
        }
    }

    /// Goal: flags build a valid config with the documented defaults.
    #[test]
    fn flags_build_config_with_defaults() {
        let c = build_config(args()).unwrap();
        assert_eq!(c.peers.len(), 2);
        assert_eq!(
            (c.scope.as_str(), c.tick_ms, c.election_ticks),
            ("default", 100, 5)
        );
        assert!(c.check_quorum && c.pre_vote);
    }

    /// Goal: config errors name the field and exit 2. Method: break fields one at a time.
    #[test]
    fn bad_fields_are_named_and_exit_2() {
        let cases: [(&str, NodeArgs); 5] = [
            ("id", NodeArgs { id: None, ..args() }),
            (
                "peers",
                NodeArgs {
                    peers: Some("1=a:1,x".into()),
                    ..args()
                },
            ),
            (
                "api",
                NodeArgs {
                    api: Some("nope".into()),
                    ..args()
                },
            ),
            (
                "election_ticks",
                NodeArgs {
                    election_ticks: Some(1),
                    ..args()
                },
            ),
            (
                "scope",
                NodeArgs {
                    scope: Some("no/slash".into()),
                    ..args()
                },
            ),
        ];
        for (field, a) in cases {
            let err = build_config(a).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{err}");
            match err {
                NodeCommandError::Config(c) => assert_eq!(c.field, field),
                other => panic!("expected a config error for {field}, got {other}"),
            }
        }
    }

    /// Goal: the score settings come from the file and the flags, `static` is the
    /// default and `off` turns scores off, and bad ones are named.
    /// Method: no setting, `off` by flag and by file; a file with an oracle and a score,
    /// a flag overriding the score; then an unknown oracle, a negative margin, and
    /// storage-rtt without proxies.
    #[test]
    fn score_settings_come_from_file_and_flags() {
        let c = build_config(args()).unwrap();
        assert_eq!(c.score_oracle, Some(ScoreOracle::Static));
        let c = build_config(NodeArgs {
            score_oracle: Some("off".into()),
            ..args()
        })
        .unwrap();
        assert_eq!(c.score_oracle, None);
        let off_dir = tempfile::tempdir().unwrap();
        let off_path = off_dir.path().join("node.toml");
        std::fs::write(&off_path, "score_oracle = \"off\"\n").unwrap();
        let c = build_config(NodeArgs {
            config: Some(off_path),
            ..args()
        })
        .unwrap();
        assert_eq!(c.score_oracle, None);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "score_oracle = \"static\"\nscore = 5.0\nscore_margin = 2.0\nscore_hold_ms = 700\n",
        )
        .unwrap();
        let c = build_config(NodeArgs {
            config: Some(path),
            score: Some(-7.5),
            ..args()
        })
        .unwrap();
        assert_eq!(
            (c.score_oracle, c.score, c.score_margin, c.score_hold_ms),
            (Some(ScoreOracle::Static), -7.5, 2.0, 700)
        );
        let cases: [(&str, NodeArgs); 3] = [
            (
                "score_oracle",
                NodeArgs {
                    score_oracle: Some("fastest".into()),
                    ..args()
                },
            ),
            (
                "score_margin",
                NodeArgs {
                    score_margin: Some(-1.0),
                    ..args()
                },
            ),
            (
                "score_oracle",
                NodeArgs {
                    score_oracle: Some("storage-rtt".into()),
                    ..args()
                },
            ),
        ];
        for (field, a) in cases {
            match build_config(a).unwrap_err() {
                NodeCommandError::Config(c) => assert_eq!(c.field, field, "{c}"),
                other => panic!("expected a config error for {field}, got {other}"),
            }
        }
    }

    /// Goal: a TOML file supplies settings and flags override it. Method: write a file with
    /// a table of peers and a tick, override the tick by flag.
    #[test]
    fn file_settings_are_overridden_by_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "id = 2\ndata_dir = \"/tmp/n2\"\napi = \"127.0.0.1:8002\"\ntick_ms = 50\n\
             [peers]\n1 = \"127.0.0.1:7001\"\n2 = \"127.0.0.1:7002\"\n",
        )
        .unwrap();
        let c = build_config(NodeArgs {
            config: Some(path.clone()),
            tick_ms: Some(20),
            ..NodeArgs::default()
        })
        .unwrap();
        assert_eq!((c.id, c.tick_ms, c.peers.len()), (2, 20, 2));

        std::fs::write(&path, "idd = 2\n").unwrap();
        let err = build_config(NodeArgs {
            config: Some(path),
            ..NodeArgs::default()
        })
        .unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("idd"), "{err}");
    }

    /// Goal: leases are off by default; the lease settings come from the file, flags
    /// override them, and a bad value is a usage error naming its flag.
    /// Method: defaults; a file with the three keys; a flag over it; a drift of 100%.
    #[test]
    fn lease_settings_come_from_file_and_flags() {
        let c = build_config(args()).unwrap();
        assert_eq!(
            (c.lease_ms, c.lease_drift_ppm, c.lease_write_bound_ms),
            (0, 10_000, 500)
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "lease_ms = 2000
lease_drift_ppm = 500
lease_write_bound_ms = 250
",
        )
        .unwrap();
        let c = build_config(NodeArgs {
            config: Some(path.clone()),
            ..args()
        })
        .unwrap();
        assert_eq!(
            (c.lease_ms, c.lease_drift_ppm, c.lease_write_bound_ms),
            (2_000, 500, 250)
        );
        let c = build_config(NodeArgs {
            config: Some(path),
            lease_ms: Some(3_000),
            ..args()
        })
        .unwrap();
        assert_eq!(c.lease_ms, 3_000);
        let err = build_config(NodeArgs {
            lease_ms: Some(1_000),
            lease_drift_ppm: Some(1_000_000),
            ..args()
        })
        .unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("--lease-drift-ppm"), "{err}");
    }

    /// Goal: the trust settings come from the file, flags override them, and a zero term
    /// gap is a usage error naming the flag. Method: a file with `token_key`,
    /// `announce_token_file` and `max_term_gap`; override the gap; then set it to 0.
    #[test]
    fn trust_settings_come_from_file_and_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "token_key = \"/k/token.key\"\nannounce_token_file = \"/k/admin.token\"\n\
             max_term_gap = 50\n",
        )
        .unwrap();
        let c = build_config(NodeArgs {
            config: Some(path.clone()),
            ..args()
        })
        .unwrap();
        assert_eq!(c.token_key, Some(PathBuf::from("/k/token.key")));
        assert_eq!(c.announce_token_file, Some(PathBuf::from("/k/admin.token")));
        assert_eq!(c.max_term_gap, 50);
        let c = build_config(NodeArgs {
            config: Some(path),
            max_term_gap: Some(7),
            ..args()
        })
        .unwrap();
        assert_eq!(c.max_term_gap, 7);
        assert_eq!(build_config(args()).unwrap().max_term_gap, 1_000);
        let err = build_config(NodeArgs {
            max_term_gap: Some(0),
            ..args()
        })
        .unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("--max-term-gap"), "{err}");
    }

    /// Goal: `--cert`, `--key` and `--ca` come together (a missing one is named, exit 2),
    /// the `[tls]` table supplies them, and plaintext off loopback needs `--insecure`.
    /// Method: flags with one file missing; a file with the table; a LAN API address
    /// without and with `--insecure`.
    #[test]
    fn tls_flags_come_together_and_plaintext_stays_on_loopback() {
        let err = build_config(NodeArgs {
            cert: Some("/p/node-1.pem".into()),
            ca: Some("/p/ca.pem".into()),
            ..args()
        })
        .unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("--key"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "[tls]\ncert = \"/p/node-1.pem\"\nkey = \"/p/node-1.key\"\nca = \"/p/ca.pem\"\n",
        )
        .unwrap();
        let c = build_config(NodeArgs {
            config: Some(path),
            api: Some("10.1.2.3:8001".into()),
            ..args()
        })
        .unwrap();
        let tls = c.tls.unwrap();
        assert_eq!(tls.key, PathBuf::from("/p/node-1.key"));

        let lan = || NodeArgs {
            api: Some("10.1.2.3:8001".into()),
            ..args()
        };
        let err = build_config(lan()).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("10.1.2.3:8001"), "{err}");
        let c = build_config(NodeArgs {
            insecure: true,
            ..lan()
        })
        .unwrap();
        assert!(c.insecure && c.tls.is_none());
    }
}
