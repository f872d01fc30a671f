//! The configuration of one election node: its settings, declared once here, their
//! defaults and limits, the TOML file that holds them, validation naming the bad field,
//! and the rules of joining a running cluster.
//!
//! `palisade node` maps its flags onto a [`NodeConfig`] read from the file; an embedder
//! builds one in code. Either way [`NodeConfig::validate`] decides what may run.
//!
//! - `limits`: every default and bound, a named constant each (the peer transport's too).
//! - `file`: the TOML file ([`NodeConfig::from_file`]) and the text forms of `peers` and
//!   `api` shared by the file and the flags.
//! - `validate`: [`NodeConfig::validate`] and [`NodeConfig::check_required`].
//! - `join`: [`NodeConfig::join_members`], the checks and the member list of `--join`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use palisade_protocol::DEFAULT_SCOPE;

use crate::score::{
    SCORE_HOLD_MS_DEFAULT, SCORE_MARGIN_DEFAULT, SCORE_ORACLE_DEFAULT, ScoreOracle,
};
use serde::{Deserialize, Serialize};

mod file;
mod join;
mod limits;
#[cfg(test)]
mod tests;
mod validate;

pub use file::{ConfigFileError, parse_api, parse_peers};
pub use join::JoinError;
pub(crate) use join::force_with_join;

pub use limits::{
    ANNOUNCE_URLS_MAX, AUDIT_LOG_BYTES_MIN, ELECTION_TICKS_DEFAULT, ELECTION_TICKS_MAX,
    FRAME_BYTES_MAX, HEARTBEAT_TICKS_DEFAULT, LEASE_DRIFT_PPM_DEFAULT, LEASE_DRIFT_PPM_LIMIT,
    LEASE_HEARTBEATS_MIN, LEASE_MS_MAX, LEASE_MS_MIN, LEASE_WRITE_BOUND_MS_DEFAULT,
    MAX_TERM_GAP_DEFAULT, PEER_QUEUE_MAX, PEERS_MAX, RAFT_INFLIGHT_MSGS_MAX, RAFT_MSG_BYTES_MAX,
    SCORE_ABS_MAX, TICK_MS_DEFAULT, TICK_MS_MAX, TICK_MS_MIN,
};

/// The configuration of one node. Every field has a default except `id`, `peers` and
/// `data_dir`, which [`NodeConfig::validate`] requires. In the file ([`NodeConfig::from_file`])
/// each field is a key of the same name; the flags of `palisade node` spell it with dashes.
// Each bool is an independent switch of its own flag or file key, not a state machine.
#[allow(clippy::struct_excessive_bools)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// This node's raft id: non-zero, unique in the cluster, never reused with wiped storage.
    pub id: u64,
    /// Every voter's raft id and peer address (`HOST:PORT`), this node included. This node
    /// listens on its own entry. All members must be started with the same set. In the
    /// file: the flag's `"1=HOST:PORT,2=HOST:PORT"` or a table `[peers] 1 = "HOST:PORT"`.
    #[serde(deserialize_with = "file::deserialize_peers")]
    pub peers: BTreeMap<u64, String>,
    /// Directory of the node's redb file (`raft.redb`); created when missing.
    pub data_dir: PathBuf,
    /// Address of the HTTP API, `IP:PORT` (`None`: no API, for embedding).
    #[serde(deserialize_with = "file::deserialize_api")]
    pub api: Option<SocketAddr>,
    /// The fencing scope this cluster's tokens fence; [`palisade_protocol::Scope::check`] is the
    /// rule.
    pub scope: String,
    /// The proxies to fence on election: entries `URL` or `NAME=URL`, the admin base URL
    /// (`http://HOST:PORT`, optionally with a path prefix; no user information, query or
    /// fragment) and the proxy's credential name (`proxy-...`);
    /// [`palisade_protocol::announce::parse_announce_entry`] is the rule.
    pub announce: Vec<String>,
    /// Tick period in milliseconds.
    pub tick_ms: u64,
    /// Election timeout in ticks; must exceed `heartbeat_ticks`.
    pub election_ticks: u64,
    /// Heartbeat interval in ticks; at least 1.
    pub heartbeat_ticks: u64,
    /// raft election priority: a tie-breaker in votes and transfers, not a speed-up.
    pub priority: i64,
    /// A leader that has not heard from a quorum for an election timeout steps down.
    pub check_quorum: bool,
    /// Candidates first probe whether they could win, so a rejoining node does not disrupt.
    pub pre_vote: bool,
    /// Test faults: lets the API's `POST /v1/test/faults` drop or delay raft traffic per
    /// peer (see [`crate::transport::faults`]). Never read from a config file; `palisade
    /// node` sets it only when `PALISADE_TEST_FAULTS=1` is in its environment.
    #[serde(skip)]
    pub test_faults: bool,
    /// Mutual TLS (`--cert`, `--key`, `--ca`; the file's `[tls]` table) on the peer links
    /// and the API. `None`: plaintext, allowed only on loopback addresses unless
    /// `insecure`.
    pub tls: Option<NodeTls>,
    /// Allows plaintext peers and API on addresses other than loopback (`--insecure`).
    pub insecure: bool,
    /// The cluster's token signing key (`--token-key`): a PEM `PRIVATE KEY` file holding an
    /// Ed25519 PKCS#8 document. With it, every token is published with its proof.
    pub token_key: Option<PathBuf>,
    /// A file holding the bearer token sent with announcements (`--announce-token-file`),
    /// for proxies whose admin API requires one and that cannot check proofs.
    pub announce_token_file: Option<PathBuf>,
    /// A peer message whose term is more than this many terms above this node's is
    /// refused (at least 1).
    pub max_term_gap: u64,
    /// Fleet leases (`--lease-ms`): how long a lease granted on `POST /v1/lease` holds,
    /// counted by the proxy from when it sent the request. 0 (the default): this node
    /// grants no leases and releases each token at establishment, as without a fleet.
    pub lease_ms: u64,
    /// The bound on clock-rate difference between a proxy and this node, in parts per
    /// million (`--lease-drift-ppm`); below [`LEASE_DRIFT_PPM_LIMIT`].
    pub lease_drift_ppm: u64,
    /// The bound on the time from a proxy's last lease check to the storage applying the
    /// write (`--lease-write-bound-ms`).
    pub lease_write_bound_ms: u64,
    /// How this node scores itself (`--score-oracle`); the default is
    /// [`SCORE_ORACLE_DEFAULT`] (`static`: ranks by node id unless `score` is set).
    /// `None` (`--score-oracle off`, `"off"` in a file): no scores, raft's randomized
    /// election. See `crate::score`.
    #[serde(with = "crate::score::setting_serde")]
    pub score_oracle: Option<ScoreOracle>,
    /// The `static` oracle's score (`--score`); higher is better. Within
    /// [`SCORE_ABS_MAX`] of zero.
    pub score: f64,
    /// Scores at most this far apart count as equal (`--score-margin`), in score units
    /// (milliseconds for the latency oracles); at least 0.
    pub score_margin: f64,
    /// How long a follower must score better than the leader by more than the margin
    /// before the leader hands over to it (`--score-hold-ms`).
    pub score_hold_ms: u64,
    /// The audit log (`--audit-log`): one JSON line per announce, transfer and
    /// membership change (see `palisade_protocol::audit`). `None`: none is written.
    pub audit_log: Option<PathBuf>,
    /// Size at which the audit log is rotated (`FILE` becomes `FILE.1`), in bytes.
    pub audit_log_bytes_max: u64,
    /// Rotated audit files kept besides the current one; older ones are deleted.
    pub audit_log_keep: u32,
    /// Recovery of a cluster that lost its quorum for good (`--force-new-cluster`): at
    /// start, this node rewrites its stored configuration so that it is the only voter,
    /// keeping its log and its term (so its next token is higher than every one it saw),
    /// and then elects itself; members are added again from there. Once, on the most
    /// up-to-date survivor, never with `--join`, and the old members must never run
    /// again with their old data (see `crate::start`).
    pub force_new_cluster: bool,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            id: 0,
            peers: BTreeMap::new(),
            data_dir: PathBuf::new(),
            api: None,
            scope: DEFAULT_SCOPE.to_owned(),
            announce: Vec::new(),
            tick_ms: TICK_MS_DEFAULT,
            election_ticks: ELECTION_TICKS_DEFAULT,
            heartbeat_ticks: HEARTBEAT_TICKS_DEFAULT,
            priority: 0,
            check_quorum: true,
            pre_vote: true,
            test_faults: false,
            tls: None,
            insecure: false,
            token_key: None,
            announce_token_file: None,
            max_term_gap: MAX_TERM_GAP_DEFAULT,
            lease_ms: 0,
            lease_drift_ppm: LEASE_DRIFT_PPM_DEFAULT,
            lease_write_bound_ms: LEASE_WRITE_BOUND_MS_DEFAULT,
            score_oracle: Some(SCORE_ORACLE_DEFAULT),
            score: 0.0,
            score_margin: SCORE_MARGIN_DEFAULT,
            score_hold_ms: SCORE_HOLD_MS_DEFAULT,
            audit_log: None,
            audit_log_bytes_max: palisade_protocol::audit::AUDIT_LOG_BYTES_MAX_DEFAULT,
            audit_log_keep: palisade_protocol::audit::AUDIT_LOG_KEEP_DEFAULT,
            force_new_cluster: false,
        }
    }
}

/// A node's TLS material, PEM files: its certificate, which must name `node-<id>` (a DNS
/// subject alternative name; also the names or addresses clients use for the API), its
/// key, and the cluster CA that issued every node's and every API client's certificate.
///
/// All three are required; in the file's `[tls]` table a key left out reads as an empty
/// path, which a flag may fill and [`NodeConfig::validate`] otherwise refuses, naming it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeTls {
    /// This node's certificate chain.
    pub cert: PathBuf,
    /// This node's private key.
    pub key: PathBuf,
    /// The cluster CA's certificate(s).
    pub ca: PathBuf,
}

/// A configuration value that is wrong, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {message}")]
pub struct ConfigError {
    /// The field, spelled as the command-line flag without dashes (`election_ticks` is
    /// `--election-ticks`).
    pub field: &'static str,
    /// What is wrong, with the values involved.
    pub message: String,
}

impl ConfigError {
    /// A new error for `field`.
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
        }
    }
}

/// Splits `HOST:PORT` (host may be a bracketed IPv6 literal); `None` when malformed.
pub fn split_host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    if host.is_empty() || port == 0 {
        return None;
    }
    Some((host, port))
}
impl NodeConfig {
    /// Whether this node grants leases and holds new tokens back until they are safe.
    pub fn leases_on(&self) -> bool {
        self.lease_ms > 0
    }

    /// How long a new leader holds its token back at most when leases are on:
    /// `lease_ms * (1 + lease_drift_ppm / 1e6) + lease_write_bound_ms`, rounded up to the
    /// millisecond. Every lease granted in an older term was requested before this leader
    /// was established, so on this node's clock it has certainly expired after this long,
    /// and a write admitted under it has reached the storage. `None` when leases are off.
    pub fn lease_release_wait(&self) -> Option<std::time::Duration> {
        if !self.leases_on() {
            return None;
        }
        let scaled = u128::from(self.lease_ms) * u128::from(1_000_000 + self.lease_drift_ppm);
        let lease = scaled.div_ceil(1_000_000);
        let total = lease + u128::from(self.lease_write_bound_ms);
        Some(std::time::Duration::from_millis(
            u64::try_from(total).unwrap_or(u64::MAX),
        ))
    }

    /// The raft configuration this node runs with.
    pub fn raft_config(&self) -> raft::Config {
        raft::Config {
            id: self.id,
            election_tick: usize::try_from(self.election_ticks).unwrap_or(usize::MAX),
            heartbeat_tick: usize::try_from(self.heartbeat_ticks).unwrap_or(usize::MAX),
            check_quorum: self.check_quorum,
            pre_vote: self.pre_vote,
            priority: self.priority,
            max_size_per_msg: RAFT_MSG_BYTES_MAX,
            max_inflight_msgs: RAFT_INFLIGHT_MSGS_MAX,
            read_only_option: raft::ReadOnlyOption::Safe,
            skip_bcast_commit: false,
            // With scores, the election timeout is set from the node's rank; the range
            // leaves a slot per rank (without, 0 keeps raft's default of twice the minimum).
            max_election_tick: match self.score_oracle {
                Some(_) => crate::score::max_election_tick(
                    usize::try_from(self.election_ticks).unwrap_or(usize::MAX),
                    self.peers.len(),
                ),
                // In deterministic mode (the simulation, `crate::deterministic`) the
                // timeout is exactly `election_ticks`: raft-rs draws it from an unseeded
                // thread RNG, which no seed could replay.
                None if crate::deterministic::is_on() => {
                    usize::try_from(self.election_ticks).unwrap_or(usize::MAX - 1) + 1
                }
                None => 0,
            },
            ..raft::Config::default()
        }
    }

    /// The path of the node's redb file.
    pub fn database_path(&self) -> PathBuf {
        self.data_dir.join("raft.redb")
    }

    /// The tick period.
    pub fn tick(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.tick_ms)
    }
}
