//! `palisade node`: runs one election node (a raft member) with its HTTP API.
//!
//! The settings, their defaults, the TOML file (`--config`) and validation belong to
//! [`NodeConfig`] (see [`NodeConfig::from_file`] for the file); the rules of `--join` to
//! [`NodeConfig::join_members`]. Here flags, and their `PALISADE_*` environment
//! variables, override the file's values, and the process runs the node until a signal.

use palisade_election::{
    ConfigError, ConfigFileError, JoinError, Node, NodeConfig, NodeError, NodeTls, ScoreOracle,
    StartError, StartOptions, parse_api, parse_peers,
};
use palisade_protocol::process::{NodeReady, TEST_FAULTS_ENV, TEST_LOG_RETAINED_ENV};
use std::path::PathBuf;

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
    /// A proxy to fence on election: its admin base URL, or NAME=URL with the proxy's
    /// credential name (proxy-...); no user information, query or fragment (repeatable;
    /// in the environment, comma-separated).
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
    /// Recovery only, when the cluster lost its quorum for good: make this node the only
    /// voter of its stored configuration (keeping its log and term), elect itself, then
    /// add members again. Once, on the most up-to-date survivor, with every other node
    /// stopped for good; never with --join. See docs/node.md, "Recovering a cluster that
    /// lost its quorum".
    #[arg(long, env = "PALISADE_FORCE_NEW_CLUSTER")]
    pub force_new_cluster: bool,
}

/// Why `palisade node` failed. [`NodeCommandError::exit_code`] gives the process exit code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeCommandError {
    /// A setting is wrong (exit 2); the message names it as flag and as file key.
    #[error("invalid --{} ({} in the config file): {}", .0.field.replace('_', "-"), .0.field, .0.message)]
    Config(#[from] ConfigError),
    /// The `--config` file cannot be read or parsed (exit 2).
    #[error(transparent)]
    ConfigFile(#[from] ConfigFileError),
    /// The node could not start (exit 1, or 2 when it is a configuration error).
    #[error(transparent)]
    Start(#[from] StartError),
    /// The node stopped on a fatal error (exit 1).
    #[error(transparent)]
    Node(#[from] NodeError),
    /// `--join`: the cluster could not be asked for its members (exit 1).
    #[error(transparent)]
    Join(JoinError),
}

impl From<JoinError> for NodeCommandError {
    fn from(err: JoinError) -> Self {
        match err {
            JoinError::Config(c) => NodeCommandError::Config(c),
            other => NodeCommandError::Join(other),
        }
    }
}

impl NodeCommandError {
    /// 2 for usage and configuration errors, 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            NodeCommandError::Config(_) | NodeCommandError::ConfigFile(_) => 2,
            NodeCommandError::Start(e) if e.is_config() => 2,
            _ => 1,
        }
    }
}

/// Sets each named field of `config` whose flag was given.
macro_rules! override_set {
    ($config:ident, $args:ident: $($field:ident),+ $(,)?) => {
        $(if let Some(v) = $args.$field {
            $config.$field = v;
        })+
    };
}

/// Builds and validates the node configuration: flags and environment over the file over
/// the defaults.
pub fn build_config(args: NodeArgs) -> Result<NodeConfig, NodeCommandError> {
    let mut config = match &args.config {
        Some(path) => NodeConfig::from_file(path)?,
        None => NodeConfig::default(),
    };
    override_set!(config, args: id, data_dir, scope, tick_ms, election_ticks, heartbeat_ticks,
        priority, max_term_gap, lease_ms, lease_drift_ppm, lease_write_bound_ms, score,
        score_margin, score_hold_ms, audit_log_bytes_max);
    if let Some(spec) = &args.peers {
        config.peers = parse_peers(spec)?;
    }
    if let Some(api) = &args.api {
        config.api = Some(parse_api(api)?);
    }
    if !args.announce.is_empty() {
        config.announce = args.announce;
    }
    if let Some(name) = &args.score_oracle {
        config.score_oracle = ScoreOracle::parse_setting(name)
            .map_err(|message| ConfigError::new("score_oracle", message))?;
    }
    // Each TLS flag overrides its `[tls]` key; `validate` names one still missing.
    if args.cert.is_some() || args.key.is_some() || args.ca.is_some() {
        let tls = config.tls.get_or_insert_with(NodeTls::default);
        override_set!(tls, args: cert, key, ca);
    }
    config.insecure |= args.insecure;
    config.force_new_cluster |= args.force_new_cluster;
    config.token_key = args.token_key.or(config.token_key);
    config.announce_token_file = args.announce_token_file.or(config.announce_token_file);
    config.audit_log = args.audit_log.or(config.audit_log);
    config.check_required()?;
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
        options.join = Some(config.join_members(&url).await?);
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

#[cfg(test)]
mod tests {
    use super::*;

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
    /// the `[tls]` table supplies them (each flag over its key), and plaintext off loopback
    /// needs `--insecure`. Method: flags with one file missing; a file with the table; a
    /// table without `ca`, with and without `--ca`; a LAN API address without and with
    /// `--insecure`.
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
            config: Some(path.clone()),
            api: Some("10.1.2.3:8001".into()),
            ..args()
        })
        .unwrap();
        let tls = c.tls.unwrap();
        assert_eq!(tls.key, PathBuf::from("/p/node-1.key"));

        // A flag overrides its key, and completes a table that leaves one out.
        std::fs::write(
            &path,
            "[tls]\ncert = \"/p/node-1.pem\"\nkey = \"/p/node-1.key\"\n",
        )
        .unwrap();
        let partial = |ca: Option<PathBuf>| NodeArgs {
            config: Some(path.clone()),
            key: Some("/q/node-1.key".into()),
            ca,
            ..args()
        };
        let tls = build_config(partial(Some("/p/ca.pem".into())))
            .unwrap()
            .tls
            .unwrap();
        assert_eq!(
            (tls.key, tls.ca),
            ("/q/node-1.key".into(), "/p/ca.pem".into())
        );
        let err = build_config(partial(None)).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("--ca"), "{err}");

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
