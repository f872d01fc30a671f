//! The configuration of one election node, its defaults, limits and validation.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use palisade_protocol::{DEFAULT_SCOPE, Scope};

use crate::score::{
    SCORE_HOLD_MS_DEFAULT, SCORE_HOLD_MS_MAX, SCORE_MARGIN_DEFAULT, SCORE_ORACLE_DEFAULT,
    ScoreOracle,
};
use crate::transport::SCORE_ABS_MAX;
use serde::{Deserialize, Serialize};

/// Default tick period. 50-100 ms is short enough for a failover in about a second, and
/// long enough that a busy machine does not miss heartbeats.
pub const TICK_MS_DEFAULT: u64 = 100;
/// Lower bound on the tick period: below this, timer jitter dominates.
pub const TICK_MS_MIN: u64 = 1;
/// Upper bound on the tick period: a minute per tick is certainly a mistake.
pub const TICK_MS_MAX: u64 = 60_000;
/// Default election timeout in ticks: 5, that is 500 ms at the default 100 ms tick. With
/// the default score oracle ([`crate::SCORE_ORACLE_DEFAULT`]) the best-ranked follower
/// campaigns `election_ticks + 1` ticks after the last heartbeat it heard, and the next
/// ranks a slot of 2 ticks apart after it; with `--score-oracle off`, raft draws the
/// timeout in `[n, 2n)`.
///
/// Why 500 ms is safe: the heartbeat is one tick (100 ms), so a follower must miss five
/// heartbeats in a row before it may campaign; one lost or late heartbeat, or a
/// scheduler stall of a few hundred milliseconds, never starts an election. Pre-vote
/// keeps a follower that only lost touch from raising the term of a healthy cluster,
/// and a candidate still needs a majority with an up-to-date log, so the timeout only
/// decides how soon a failure is acted on, never who may win. A spurious election would
/// cost a term (and a fence advance), not safety. Measured: 10-minute soaks under proxy
/// load on a busy 2-core machine (`tests/bench/soak_elections.sh`, load average up to 6)
/// saw no election, and failover against etcd at its defaults dropped from 0.94x to
/// under 0.5x of etcd's (docs/benchmarks.md, "Failover against etcd").
///
/// Why not shorter: check-quorum makes the leader step down after one election timeout
/// without a quorum's answer, so a timeout of two or three heartbeats would let one
/// slow fsync round on a loaded machine depose a healthy leader.
pub const ELECTION_TICKS_DEFAULT: u64 = 5;
/// Upper bound on the election timeout in ticks.
pub const ELECTION_TICKS_MAX: u64 = 10_000;
/// Default heartbeat interval in ticks. One tick keeps followers' election timers far from
/// expiring even when one heartbeat is lost (1-2 ticks is the usual choice).
pub const HEARTBEAT_TICKS_DEFAULT: u64 = 1;
/// Most peers (voters, self included) a cluster may name.
pub const PEERS_MAX: usize = 15;
/// Most `--announce` proxies.
pub const ANNOUNCE_URLS_MAX: usize = 64;
/// Default of `max_term_gap`: a peer message whose term is more than this many terms above
/// this node's is refused. A healthy cluster moves a few terms per failure, so 1,000 is
/// years of churn, while one forged term cannot drag the cluster (and the fence) far ahead.
pub const MAX_TERM_GAP_DEFAULT: u64 = 1_000;
/// Default of `lease_drift_ppm`: 1% (10,000 parts per million). Quartz and the kernel's
/// monotonic clock drift by tens of ppm; 1% leaves two orders of magnitude of margin
/// for virtual machines whose clocks are slewed or stepped in rate.
pub const LEASE_DRIFT_PPM_DEFAULT: u64 = 10_000;
/// Upper bound (exclusive) of `lease_drift_ppm`: a clock-rate error of 100% would mean a
/// clock that may stand still, and no wait would bound a lease measured on it.
pub const LEASE_DRIFT_PPM_LIMIT: u64 = 1_000_000;
/// Default of `lease_write_bound_ms`: the time from a proxy's last lease check to the
/// storage applying the write it admitted. Half a second covers a loaded loopback or LAN
/// hop; a proxy logs and counts every write that overran it.
pub const LEASE_WRITE_BOUND_MS_DEFAULT: u64 = 500;
/// Upper bound of `lease_ms` and `lease_write_bound_ms`: a new leader with a dead proxy
/// waits about their sum before releasing its token, and more than ten minutes of
/// write unavailability per failover is certainly a mistake.
pub const LEASE_MS_MAX: u64 = 600_000;
/// Lower bound of `lease_ms` in milliseconds, whatever the heartbeat.
pub const LEASE_MS_MIN: u64 = 50;
/// Lower bound of `lease_ms` in heartbeat intervals (`heartbeat_ticks * tick_ms`). A
/// proxy renews every third of its lease, and a renewal costs the leader one heartbeat
/// round to a quorum; a lease shorter than three heartbeat intervals would leave a
/// renewal less than one heartbeat interval to be answered, so leases would lapse on an
/// ordinary delayed heartbeat and writes would turn to 503 on a healthy cluster.
pub const LEASE_HEARTBEATS_MIN: u64 = 3;

/// The configuration of one node. Every field has a default except `id`, `peers` and
/// `data_dir`, which [`NodeConfig::validate`] requires.
// Each bool is an independent switch of its own flag or file key, not a state machine.
#[allow(clippy::struct_excessive_bools)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// This node's raft id: non-zero, unique in the cluster, never reused with wiped storage.
    pub id: u64,
    /// Every voter's raft id and peer address (`HOST:PORT`), this node included. This node
    /// listens on its own entry. All members must be started with the same set.
    pub peers: BTreeMap<u64, String>,
    /// Directory of the node's redb file (`raft.redb`); created when missing.
    pub data_dir: PathBuf,
    /// Address of the HTTP API (`None`: no API, for embedding).
    pub api: Option<SocketAddr>,
    /// The fencing scope this cluster's tokens fence; [`Scope::check`] is the rule.
    pub scope: String,
    /// Admin base URLs (`http://HOST:PORT`) of proxies to fence on election.
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
}

/// Smallest `audit_log_bytes_max`: a few records' worth; a smaller file would rotate at
/// every line.
pub const AUDIT_LOG_BYTES_MIN: u64 = 1024;

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
        }
    }
}

/// A node's TLS material, PEM files: its certificate, which must name `node-<id>` (a DNS
/// subject alternative name; also the names or addresses clients use for the API), its
/// key, and the cluster CA that issued every node's and every API client's certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// Checks every field and the relations between them, then raft's own rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.id == 0 {
            return Err(ConfigError::new("id", "must be a non-zero integer"));
        }
        if self.audit_log.is_some() && self.audit_log_bytes_max < AUDIT_LOG_BYTES_MIN {
            return Err(ConfigError::new(
                "audit_log_bytes_max",
                format!(
                    "{} bytes; at least {AUDIT_LOG_BYTES_MIN}, so that a file holds more than a few records",
                    self.audit_log_bytes_max
                ),
            ));
        }
        if self.peers.is_empty() {
            return Err(ConfigError::new(
                "peers",
                "is empty; expected ID=HOST:PORT,... including this node",
            ));
        }
        if self.peers.len() > PEERS_MAX {
            return Err(ConfigError::new(
                "peers",
                format!("names {} nodes, the limit is {PEERS_MAX}", self.peers.len()),
            ));
        }
        if !self.peers.contains_key(&self.id) {
            return Err(ConfigError::new(
                "peers",
                format!("does not name this node's id {}", self.id),
            ));
        }
        for (&id, addr) in &self.peers {
            if id == 0 {
                return Err(ConfigError::new("peers", "node id 0 is invalid"));
            }
            if split_host_port(addr).is_none() {
                return Err(ConfigError::new(
                    "peers",
                    format!("address {addr:?} of node {id} is not HOST:PORT"),
                ));
            }
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::new("data_dir", "is required"));
        }
        Scope::check(&self.scope).map_err(|err| ConfigError::new("scope", err.to_string()))?;
        if self.announce.len() > ANNOUNCE_URLS_MAX {
            return Err(ConfigError::new(
                "announce",
                format!(
                    "names {} proxies, the limit is {ANNOUNCE_URLS_MAX}",
                    self.announce.len()
                ),
            ));
        }
        for url in &self.announce {
            check_announce_url(url)?;
        }
        if !(TICK_MS_MIN..=TICK_MS_MAX).contains(&self.tick_ms) {
            return Err(ConfigError::new(
                "tick_ms",
                format!("{} is outside [{TICK_MS_MIN}, {TICK_MS_MAX}]", self.tick_ms),
            ));
        }
        if self.heartbeat_ticks == 0 {
            return Err(ConfigError::new("heartbeat_ticks", "must be at least 1"));
        }
        if self.election_ticks <= self.heartbeat_ticks {
            return Err(ConfigError::new(
                "election_ticks",
                format!(
                    "{} must be greater than heartbeat_ticks {}",
                    self.election_ticks, self.heartbeat_ticks
                ),
            ));
        }
        if self.election_ticks > ELECTION_TICKS_MAX {
            return Err(ConfigError::new(
                "election_ticks",
                format!(
                    "{} is over the limit of {ELECTION_TICKS_MAX}",
                    self.election_ticks
                ),
            ));
        }
        if self.max_term_gap == 0 {
            return Err(ConfigError::new(
                "max_term_gap",
                "must be at least 1 (0 would refuse every election)",
            ));
        }
        for (field, path) in [
            ("token_key", &self.token_key),
            ("announce_token_file", &self.announce_token_file),
        ] {
            if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(ConfigError::new(field, "is an empty path"));
            }
        }
        self.check_leases()?;
        self.check_scores()?;
        self.check_plaintext()?;
        self.raft_config()
            .validate()
            .map_err(|e| ConfigError::new(raft_error_field(&e), e.to_string()))
    }

    /// The score settings; `storage-rtt` needs proxies to measure.
    fn check_scores(&self) -> Result<(), ConfigError> {
        if !(self.score.is_finite() && self.score.abs() <= SCORE_ABS_MAX) {
            return Err(ConfigError::new(
                "score",
                format!(
                    "{} is not a finite number within +-{SCORE_ABS_MAX}",
                    self.score
                ),
            ));
        }
        if !(self.score_margin.is_finite() && (0.0..=SCORE_ABS_MAX).contains(&self.score_margin)) {
            return Err(ConfigError::new(
                "score_margin",
                format!("{} is outside [0, {SCORE_ABS_MAX}]", self.score_margin),
            ));
        }
        if self.score_hold_ms > SCORE_HOLD_MS_MAX {
            return Err(ConfigError::new(
                "score_hold_ms",
                format!(
                    "{} is over the limit of {SCORE_HOLD_MS_MAX}",
                    self.score_hold_ms
                ),
            ));
        }
        if self.score_oracle == Some(ScoreOracle::StorageRtt) && self.announce.is_empty() {
            return Err(ConfigError::new(
                "score_oracle",
                "storage-rtt measures the round trip to the --announce proxies, and none is \
                 configured",
            ));
        }
        Ok(())
    }

    /// The lease settings: only checked when leases are on (`lease_ms` > 0).
    fn check_leases(&self) -> Result<(), ConfigError> {
        if self.lease_ms == 0 {
            return Ok(());
        }
        let heartbeat_ms = self.heartbeat_ticks.saturating_mul(self.tick_ms);
        let floor = LEASE_MS_MIN.max(LEASE_HEARTBEATS_MIN.saturating_mul(heartbeat_ms));
        if !(floor..=LEASE_MS_MAX).contains(&self.lease_ms) {
            return Err(ConfigError::new(
                "lease_ms",
                format!(
                    "{} is outside [{floor}, {LEASE_MS_MAX}] (the floor is the larger of \
                     {LEASE_MS_MIN} ms and {LEASE_HEARTBEATS_MIN} heartbeat intervals of \
                     {heartbeat_ms} ms); 0 turns leases off",
                    self.lease_ms
                ),
            ));
        }
        if self.lease_drift_ppm >= LEASE_DRIFT_PPM_LIMIT {
            return Err(ConfigError::new(
                "lease_drift_ppm",
                format!(
                    "{} must be below {LEASE_DRIFT_PPM_LIMIT}",
                    self.lease_drift_ppm
                ),
            ));
        }
        if self.lease_write_bound_ms > LEASE_MS_MAX {
            return Err(ConfigError::new(
                "lease_write_bound_ms",
                format!(
                    "{} is over the limit of {LEASE_MS_MAX}",
                    self.lease_write_bound_ms
                ),
            ));
        }
        Ok(())
    }

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

    /// Without TLS and without `insecure`, the API and every peer address must be loopback
    /// IP addresses: plaintext raft and an unauthenticated API must not reach a network.
    /// Host names are refused too, since what they resolve to is not known here.
    fn check_plaintext(&self) -> Result<(), ConfigError> {
        if self.tls.is_some() || self.insecure {
            return Ok(());
        }
        let advice = "plaintext is allowed only on loopback addresses; give --cert, --key \
                      and --ca for mutual TLS, or --insecure";
        if let Some(api) = self.api.filter(|a| !a.ip().is_loopback()) {
            return Err(ConfigError::new(
                "api",
                format!("{api} is not a loopback address: {advice}"),
            ));
        }
        for (&id, addr) in &self.peers {
            if !is_loopback_host_port(addr) {
                return Err(ConfigError::new(
                    "peers",
                    format!("address {addr} of node {id} is not a loopback IP address: {advice}"),
                ));
            }
        }
        Ok(())
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
            max_size_per_msg: crate::transport::RAFT_MSG_BYTES_MAX,
            max_inflight_msgs: crate::transport::RAFT_INFLIGHT_MSGS_MAX,
            read_only_option: raft::ReadOnlyOption::Safe,
            skip_bcast_commit: false,
            // With scores, the election timeout is set from the node's rank; the range
            // leaves a slot per rank (without, 0 keeps raft's default of twice the minimum).
            max_election_tick: match self.score_oracle {
                Some(_) => crate::score::max_election_tick(
                    usize::try_from(self.election_ticks).unwrap_or(usize::MAX),
                    self.peers.len(),
                ),
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

/// Whether `HOST:PORT` names a loopback IP address (`127.0.0.0/8`, `[::1]`).
fn is_loopback_host_port(addr: &str) -> bool {
    split_host_port(addr)
        .map(|(host, _)| host.trim_start_matches('[').trim_end_matches(']'))
        .and_then(|host| host.parse::<std::net::IpAddr>().ok())
        .is_some_and(|ip| ip.is_loopback())
}

/// Names the field a raft `Config::validate` error is about.
fn raft_error_field(err: &raft::Error) -> &'static str {
    let text = err.to_string();
    if text.contains("heartbeat") {
        "heartbeat_ticks"
    } else if text.contains("election") {
        "election_ticks"
    } else if text.contains("node id") {
        "id"
    } else {
        "raft"
    }
}

fn check_announce_url(url: &str) -> Result<(), ConfigError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| ConfigError::new("announce", format!("{url:?} is not a URL: {e}")))?;
    // https announcements trust the cluster CA and present this node's certificate when
    // `tls` is set (so a proxy admin listener with `client_ca` can require it), and the
    // system's roots otherwise.
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(ConfigError::new(
            "announce",
            format!("{url:?} must be an http:// or https:// URL"),
        ));
    }
    if uri.authority().is_none() {
        return Err(ConfigError::new("announce", format!("{url:?} has no host")));
    }
    if uri.query().is_some() {
        return Err(ConfigError::new(
            "announce",
            format!("{url:?} must be a base URL without a query"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> NodeConfig {
        NodeConfig {
            id: 1,
            peers: [
                (1, "127.0.0.1:7001".to_owned()),
                (2, "127.0.0.1:7002".to_owned()),
            ]
            .into_iter()
            .collect(),
            data_dir: "/tmp/x".into(),
            ..NodeConfig::default()
        }
    }

    /// Goal: the defaults are the safe ones: `check_quorum` and `pre_vote` on, 100 ms
    /// ticks, election 5 ticks (five heartbeats), heartbeat 1 tick, the `static` oracle
    /// with raft's range widened for the rank slots; `off` gives raft's own range.
    /// Method: validate the default with the required fields set; then with the oracle off.
    #[test]
    fn defaults_are_valid_and_safe() {
        let mut cfg = valid();
        cfg.validate().unwrap();
        let raft = cfg.raft_config();
        assert!(raft.check_quorum && raft.pre_vote);
        assert_eq!(
            (cfg.tick_ms, raft.election_tick, raft.heartbeat_tick),
            (100, 5, 1)
        );
        assert!(
            raft.election_tick >= 5 * raft.heartbeat_tick,
            "five heartbeats per timeout"
        );
        assert_eq!(cfg.score_oracle, Some(ScoreOracle::Static));
        assert_eq!(raft.max_election_tick, 5 + (2 + 2) * 2);
        cfg.score_oracle = None;
        cfg.validate().unwrap();
        assert_eq!(
            cfg.raft_config().max_election_tick,
            0,
            "raft's default, 2x the minimum"
        );
    }

    /// Goal: the oracle setting reads and writes `"off"` as no oracle, a name as that
    /// oracle, a missing key as the default, and an unknown name is refused naming `off`.
    /// Method: round-trip configurations through JSON.
    #[test]
    fn score_oracle_setting_round_trips_with_off() {
        let mut cfg = valid();
        for setting in [
            None,
            Some(ScoreOracle::StorageRtt),
            Some(ScoreOracle::Static),
        ] {
            cfg.score_oracle = setting;
            let json = serde_json::to_value(&cfg).unwrap();
            assert_eq!(json["score_oracle"], ScoreOracle::setting_str(setting));
            let back: NodeConfig = serde_json::from_value(json).unwrap();
            assert_eq!(back.score_oracle, setting);
        }
        let missing: NodeConfig = serde_json::from_str(r#"{"id": 1}"#).unwrap();
        assert_eq!(missing.score_oracle, Some(SCORE_ORACLE_DEFAULT));
        let null: NodeConfig = serde_json::from_str(r#"{"score_oracle": null}"#).unwrap();
        assert_eq!(null.score_oracle, None);
        let err = serde_json::from_str::<NodeConfig>(r#"{"score_oracle": "fastest"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("fastest") && err.contains("off"), "{err}");
    }

    /// Goal: each broken field is named in the error. Method: break one field at a time.
    #[test]
    fn errors_name_the_field() {
        type Breaker = Box<dyn Fn(&mut NodeConfig)>;
        let cases: Vec<(&str, Breaker)> = vec![
            ("id", Box::new(|c| c.id = 0)),
            ("peers", Box::new(|c| c.id = 3)),
            (
                "peers",
                Box::new(|c| {
                    c.peers.insert(2, "nohostport".into());
                }),
            ),
            ("data_dir", Box::new(|c| c.data_dir = PathBuf::new())),
            ("scope", Box::new(|c| c.scope = "a b".into())),
            (
                "announce",
                Box::new(|c| c.announce = vec!["ftp://x".into()]),
            ),
            ("tick_ms", Box::new(|c| c.tick_ms = 0)),
            ("heartbeat_ticks", Box::new(|c| c.heartbeat_ticks = 0)),
            ("election_ticks", Box::new(|c| c.election_ticks = 1)),
            ("max_term_gap", Box::new(|c| c.max_term_gap = 0)),
            (
                "token_key",
                Box::new(|c| c.token_key = Some(PathBuf::new())),
            ),
            (
                "announce_token_file",
                Box::new(|c| c.announce_token_file = Some(PathBuf::new())),
            ),
            ("lease_ms", Box::new(|c| c.lease_ms = 299)),
            ("lease_ms", Box::new(|c| c.lease_ms = LEASE_MS_MAX + 1)),
            (
                "lease_drift_ppm",
                Box::new(|c| {
                    c.lease_ms = 1_000;
                    c.lease_drift_ppm = LEASE_DRIFT_PPM_LIMIT;
                }),
            ),
            (
                "lease_write_bound_ms",
                Box::new(|c| {
                    c.lease_ms = 1_000;
                    c.lease_write_bound_ms = LEASE_MS_MAX + 1;
                }),
            ),
        ];
        for (field, breaker) in cases {
            let mut cfg = valid();
            breaker(&mut cfg);
            let err = cfg.validate().unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
    }

    /// Goal: leases are off by default and then ignore their other settings; on, the
    /// release wait is lease * (1 + drift) + write bound, rounded up.
    /// Method: validate the default with absurd drift; compute waits for two settings.
    #[test]
    fn lease_settings_and_release_wait() {
        let mut cfg = valid();
        cfg.lease_drift_ppm = u64::MAX;
        cfg.validate().unwrap();
        assert_eq!(cfg.lease_release_wait(), None);
        cfg.lease_drift_ppm = LEASE_DRIFT_PPM_DEFAULT;
        cfg.lease_ms = 2_000;
        cfg.validate().unwrap();
        assert_eq!(
            cfg.lease_release_wait(),
            Some(std::time::Duration::from_millis(2_000 + 20 + 500))
        );
        cfg.lease_ms = 300;
        cfg.lease_drift_ppm = 1;
        cfg.lease_write_bound_ms = 0;
        cfg.validate().unwrap();
        assert_eq!(
            cfg.lease_release_wait(),
            Some(std::time::Duration::from_millis(301)),
            "a fraction of a millisecond rounds up"
        );
    }

    /// Goal: plaintext is refused off loopback, naming the address, and allowed with TLS
    /// or `insecure`; host names count as not loopback.
    /// Method: a wildcard API, a LAN peer, a host-name peer; then the same with TLS and
    /// with `insecure`.
    #[test]
    fn plaintext_off_loopback_needs_tls_or_insecure() {
        let mut api = valid();
        api.api = Some("0.0.0.0:8001".parse().unwrap());
        let err = api.validate().unwrap_err();
        assert_eq!(err.field, "api", "{err}");
        assert!(err.message.contains("0.0.0.0:8001"), "{err}");
        for addr in ["10.0.0.2:7002", "localhost:7002", "[::2]:7002"] {
            let mut peer = valid();
            peer.peers.insert(2, addr.to_owned());
            let err = peer.validate().unwrap_err();
            assert_eq!(err.field, "peers", "{err}");
            assert!(err.message.contains(addr), "{err}");
            peer.insecure = true;
            peer.validate().unwrap();
            peer.insecure = false;
            peer.tls = Some(NodeTls {
                cert: "n.pem".into(),
                key: "n.key".into(),
                ca: "ca.pem".into(),
            });
            peer.validate().unwrap();
        }
        let mut v6 = valid();
        v6.peers.insert(2, "[::1]:7002".to_owned());
        v6.validate().unwrap();
    }
}
