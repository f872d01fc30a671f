//! Tests of the node configuration: defaults, validation, the file format.

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

/// Goal: the file takes every documented key, `peers` in either form, and refuses an
/// unknown key and a bad value naming it. Method: parse a full file and compare with the
/// same settings built in code; then `peers` as a table; then broken files.
#[test]
fn file_reads_every_key_and_names_a_bad_one() {
    let text = r#"
id = 1
peers = "1=127.0.0.1:7001, 2=127.0.0.1:7002"
data_dir = "/var/lib/palisade/node1"
api = "127.0.0.1:8001"
scope = "orders"
announce = ["http://127.0.0.1:9001"]
tick_ms = 50
election_ticks = 7
heartbeat_ticks = 2
priority = -3
check_quorum = false
pre_vote = false
insecure = true
token_key = "/k/token.key"
announce_token_file = "/k/admin.token"
max_term_gap = 50
lease_ms = 2000
lease_drift_ppm = 500
lease_write_bound_ms = 250
score_oracle = "off"
score = 5.0
score_margin = 2.0
score_hold_ms = 700
audit_log = "/var/log/n1.audit"
audit_log_bytes_max = 4096
audit_log_keep = 2

[tls]
cert = "/p/node-1.pem"
key = "/p/node-1.key"
ca = "/p/ca.pem"
"#;
    let file: NodeConfig = toml::from_str(text).unwrap();
    let expected = NodeConfig {
        id: 1,
        peers: valid().peers,
        data_dir: "/var/lib/palisade/node1".into(),
        api: Some("127.0.0.1:8001".parse().unwrap()),
        scope: "orders".into(),
        announce: vec!["http://127.0.0.1:9001".into()],
        tick_ms: 50,
        election_ticks: 7,
        heartbeat_ticks: 2,
        priority: -3,
        check_quorum: false,
        pre_vote: false,
        test_faults: false,
        tls: Some(NodeTls {
            cert: "/p/node-1.pem".into(),
            key: "/p/node-1.key".into(),
            ca: "/p/ca.pem".into(),
        }),
        insecure: true,
        token_key: Some("/k/token.key".into()),
        announce_token_file: Some("/k/admin.token".into()),
        max_term_gap: 50,
        lease_ms: 2_000,
        lease_drift_ppm: 500,
        lease_write_bound_ms: 250,
        score_oracle: None,
        score: 5.0,
        score_margin: 2.0,
        score_hold_ms: 700,
        audit_log: Some("/var/log/n1.audit".into()),
        audit_log_bytes_max: 4096,
        audit_log_keep: 2,
        force_new_cluster: false,
    };
    assert_eq!(file, expected);
    file.validate().unwrap();

    let table: NodeConfig =
        toml::from_str("[peers]\n1 = \"127.0.0.1:7001\"\n2 = \"127.0.0.1:7002\"\n").unwrap();
    assert_eq!(table.peers, valid().peers);
    let empty: NodeConfig = toml::from_str("").unwrap();
    assert_eq!(empty, NodeConfig::default());

    for (text, named) in [
        ("idd = 2\n", "idd"),
        ("peers = \"1=a:1,x\"\n", "\"x\" is not ID=HOST:PORT"),
        ("[peers]\none = \"127.0.0.1:7001\"\n", "\"one\""),
        ("peers = \"1=a:1,1=b:2\"\n", "named twice"),
        ("api = \"localhost:8001\"\n", "not an IP:PORT"),
        ("score_oracle = \"fastest\"\n", "fastest"),
        ("[tls]\ncrt = \"/p/x.pem\"\n", "crt"),
    ] {
        let err = toml::from_str::<NodeConfig>(text).unwrap_err().to_string();
        assert!(err.contains(named), "{text}: {err}");
    }
}

/// Goal: a `[tls]` table missing a key reads, and validation names the missing key;
/// `from_file` names the file when it cannot be read or parsed.
/// Method: a table with `cert` and `ca` only; a missing file and a file with a bad key.
#[test]
fn partial_tls_is_named_and_file_errors_name_the_file() {
    let mut cfg: NodeConfig =
        toml::from_str("[tls]\ncert = \"/c.pem\"\nca = \"/ca.pem\"\n").unwrap();
    cfg.id = 1;
    cfg.peers = valid().peers;
    cfg.data_dir = "/tmp/x".into();
    let err = cfg.validate().unwrap_err();
    assert_eq!(err.field, "key", "{err}");
    assert!(err.message.contains("--cert, --key and --ca"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.toml");
    let err = NodeConfig::from_file(&path).unwrap_err();
    assert!(matches!(err, ConfigFileError::Read { .. }), "{err}");
    assert!(err.to_string().contains("node.toml"), "{err}");
    std::fs::write(&path, "tick_ms = \"fast\"\n").unwrap();
    let err = NodeConfig::from_file(&path).unwrap_err().to_string();
    assert!(
        err.contains("node.toml") && err.contains("tick_ms"),
        "{err}"
    );
}

/// Goal: a process must name id, peers, data dir and API; the message names the flag.
/// Method: start from the default and fill one setting at a time.
#[test]
fn required_settings_are_named_with_their_flag() {
    let mut cfg = NodeConfig::default();
    for (field, flag) in [
        ("id", "--id"),
        ("peers", "--peers"),
        ("data_dir", "--data-dir"),
        ("api", "--api"),
    ] {
        let err = cfg.check_required().unwrap_err();
        assert_eq!(err.field, field, "{err}");
        assert!(err.message.contains(flag), "{err}");
        let filled = valid();
        match field {
            "id" => cfg.id = filled.id,
            "peers" => cfg.peers = filled.peers,
            "data_dir" => cfg.data_dir = filled.data_dir,
            _ => cfg.api = Some("127.0.0.1:8001".parse().unwrap()),
        }
    }
    cfg.check_required().unwrap();
}

/// Goal: `--join` refuses, before anything starts, what cannot be a join: `peers` naming
/// other nodes, a non-empty data directory without a raft log (both configuration
/// errors naming the field), and a join URL that does not answer (naming the URL).
/// Method: call `join_members` with each; the URL is a closed local port.
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
    let err = config.join_members(url).await.unwrap_err();
    assert!(matches!(err, JoinError::Unreachable { .. }), "{err}");
    assert!(err.to_string().contains(url), "{err}");

    config.peers.insert(1, "127.0.0.1:7001".to_owned());
    match config.join_members(url).await.unwrap_err() {
        JoinError::Config(err) => {
            assert_eq!(err.field, "peers", "{err}");
            assert!(err.message.contains("only this node"), "{err}");
        }
        other => panic!("expected a config error, got {other}"),
    }

    config.peers.remove(&1);
    std::fs::create_dir_all(&config.data_dir).unwrap();
    std::fs::write(config.data_dir.join("notes.txt"), "not a raft log").unwrap();
    match config.join_members(url).await.unwrap_err() {
        JoinError::Config(err) => {
            assert_eq!(err.field, "data_dir", "{err}");
            assert!(err.message.contains("holds no raft log"), "{err}");
        }
        other => panic!("expected a config error, got {other}"),
    }
}

/// Goal: `--force-new-cluster` (recovering a survivor alone) and `--join` (adding a new
/// node) are refused together, naming the recovery flag; the file key reads like the flag.
/// Method: join with the flag set; parse a file that sets the key.
#[tokio::test]
async fn force_new_cluster_is_refused_with_join() {
    let dir = tempfile::tempdir().unwrap();
    let config = NodeConfig {
        id: 4,
        peers: [(4, "127.0.0.1:7004".to_owned())].into_iter().collect(),
        data_dir: dir.path().join("node4"),
        force_new_cluster: true,
        ..NodeConfig::default()
    };
    match config.join_members("http://127.0.0.1:1").await.unwrap_err() {
        JoinError::Config(err) => {
            assert_eq!(err.field, "force_new_cluster", "{err}");
            assert!(err.message.contains("--join"), "{err}");
        }
        other => panic!("expected a config error, got {other}"),
    }
    let path = dir.path().join("node.toml");
    std::fs::write(&path, "force_new_cluster = true\n").unwrap();
    assert!(NodeConfig::from_file(&path).unwrap().force_new_cluster);
}

/// Goal: the member list must name this node at its own address, unless its log decides.
/// Method: check lists that lack the node, name it removed, or at another address.
#[test]
fn join_list_must_name_this_node_at_its_address() {
    let config = NodeConfig {
        id: 4,
        peers: [(4, "127.0.0.1:7004".to_owned())].into_iter().collect(),
        ..NodeConfig::default()
    };
    let url = "http://127.0.0.1:8001";
    let member = |peer: &str| palisade_client::Member {
        id: 4,
        peer: peer.to_owned(),
        voter: true,
        role: None,
    };
    let mut list = palisade_client::MemberList::default();
    let err = config.check_join_list(&list, url, false).unwrap_err();
    assert!(err.message.contains("palisade member add"), "{err}");
    config.check_join_list(&list, url, true).unwrap();
    list.members.push(member("127.0.0.1:7999"));
    let err = config.check_join_list(&list, url, false).unwrap_err();
    assert_eq!(err.field, "peers", "{err}");
    list.members[0] = member("127.0.0.1:7004");
    config.check_join_list(&list, url, false).unwrap();
    list.removed.push(4);
    let err = config.check_join_list(&list, url, true).unwrap_err();
    assert!(err.message.contains("never reused"), "{err}");
}

/// Goal: every announce entry the API refuses is refused at configuration time too,
/// naming the field and the entry (without its password); named and bare entries pass.
/// Method: validate one hostile entry at a time, then a list with a proxy twice, then a
/// good named list.
#[test]
fn announce_entries_are_checked_by_the_one_rule() {
    for entry in [
        "http://u:p@127.0.0.1:1",
        "http://127.0.0.1:1/#frag",
        "http://127.0.0.1:1/?q",
        "ftp://127.0.0.1:1",
        "node-a=http://127.0.0.1:1",
        "http://127.0.0.1:1 ",
    ] {
        let mut c = valid();
        c.announce = vec![entry.to_owned()];
        let err = c.validate().unwrap_err();
        assert_eq!(err.field, "announce", "{entry}: {err}");
        assert!(err.message.contains("announce entry"), "{entry}: {err}");
        assert!(!err.message.contains("u:p"), "{entry}: {err}");
    }
    let mut c = valid();
    c.announce = vec!["http://127.0.0.1:1".into(), "http://127.0.0.1:1/".into()];
    let err = c.validate().unwrap_err();
    assert!(err.message.contains("same proxy"), "{err}");
    c.announce = vec![
        "proxy-a=http://127.0.0.1:1".into(),
        "https://proxy-b.example:9443/admin/".into(),
    ];
    c.validate().unwrap();
    c.announce = vec!["x".into(); ANNOUNCE_URLS_MAX + 1];
    assert!(c.validate().unwrap_err().message.contains("limit"));
}

/// Goal: a cluster names at most `PEERS_MAX` nodes: the bound on the keys of raft-rs's
/// progress and vote maps, which hash with the unmaintained fxhash (RUSTSEC-2025-0057;
/// docs/security.md, "Known advisories"), so no input can grow them. Method: a peer
/// list of exactly `PEERS_MAX` passes; one more is refused, naming the limit.
#[test]
fn a_peer_list_over_the_limit_is_refused_naming_it() {
    let max = u64::try_from(PEERS_MAX).unwrap();
    let mut cfg = valid();
    cfg.peers = (1..=max)
        .map(|id| (id, format!("127.0.0.1:{}", 7000 + id)))
        .collect();
    cfg.validate().unwrap();
    cfg.peers.insert(max + 1, "127.0.0.1:7999".to_owned());
    let err = cfg.validate().unwrap_err();
    assert_eq!(err.field, "peers");
    assert!(
        err.message.contains(&format!("the limit is {PEERS_MAX}")),
        "{}",
        err.message
    );
}
