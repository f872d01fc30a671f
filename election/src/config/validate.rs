//! [`NodeConfig::validate`]: every field and the relations between them, each error
//! naming the field; and [`NodeConfig::check_required`], what a node process must be
//! given.

use palisade_protocol::Scope;

use super::{
    ANNOUNCE_URLS_MAX, AUDIT_LOG_BYTES_MIN, ConfigError, ELECTION_TICKS_MAX, LEASE_DRIFT_PPM_LIMIT,
    LEASE_HEARTBEATS_MIN, LEASE_MS_MAX, LEASE_MS_MIN, NodeConfig, PEERS_MAX, SCORE_ABS_MAX,
    TICK_MS_MAX, TICK_MS_MIN, split_host_port,
};
use crate::score::{SCORE_HOLD_MS_MAX, ScoreOracle};

impl NodeConfig {
    /// The settings a node process (`palisade node`) must be given in its flags or file,
    /// which [`NodeConfig::validate`] would refuse with less help (`id`, `peers`,
    /// `data_dir`) or which an embedder may leave out (`api`). The message names the flag.
    pub fn check_required(&self) -> Result<(), ConfigError> {
        let missing = [
            (
                self.id == 0,
                "id",
                "is required: a non-zero integer (--id N)",
            ),
            (
                self.peers.is_empty(),
                "peers",
                "is required (--peers 1=HOST:PORT,...)",
            ),
            (
                self.data_dir.as_os_str().is_empty(),
                "data_dir",
                "is required (--data-dir DIR)",
            ),
            (self.api.is_none(), "api", "is required (--api HOST:PORT)"),
        ];
        match missing.into_iter().find(|(absent, _, _)| *absent) {
            Some((_, field, message)) => Err(ConfigError::new(field, message)),
            None => Ok(()),
        }
    }

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
        // The one rule of announce entries (`URL` or `NAME=URL`), shared with
        // `POST /v1/announce`; https announcements trust the cluster CA and present this
        // node's certificate when `tls` is set, the system's roots otherwise.
        palisade_protocol::announce::parse_announce_list(&self.announce)
            .map_err(|err| ConfigError::new("announce", err.to_string()))?;
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
        self.check_tls()?;
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

    /// TLS needs all three files: an empty path (a key the file's `[tls]` table left out
    /// and no flag gave) is named.
    fn check_tls(&self) -> Result<(), ConfigError> {
        let Some(tls) = &self.tls else {
            return Ok(());
        };
        let missing = [("cert", &tls.cert), ("key", &tls.key), ("ca", &tls.ca)]
            .into_iter()
            .find(|(_, path)| path.as_os_str().is_empty());
        match missing {
            Some((field, _)) => Err(ConfigError::new(
                field,
                "is missing: TLS needs --cert, --key and --ca together",
            )),
            None => Ok(()),
        }
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
