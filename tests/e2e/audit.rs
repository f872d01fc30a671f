//! The audit log (`--audit-log`) of real `palisade proxy` processes, read back with
//! `palisade audit`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use http::StatusCode;
use palisade_cluster::wait;
use palisade_protocol::AuditRecord;
use palisade_protocol::DEFAULT_SCOPE;
use palisade_protocol::audit::rotated_path;
use palisade_tests::client::put;
use palisade_tests::process::start_proxy;

/// Time the audit writer gets to put a record on disk on a loaded machine.
const AUDIT_TIMEOUT: Duration = Duration::from_secs(10);

/// `palisade audit FILE ARGS... --json`, parsed.
fn audit(file: &Path, args: &[&str]) -> Vec<AuditRecord> {
    let out = Command::new(crate::PALISADE)
        .arg("audit")
        .arg(file)
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Waits until `palisade audit FILE ARGS` finds at least `n` records.
async fn wait_records(file: &Path, args: &[&str], n: usize) -> Vec<AuditRecord> {
    wait::poll(AUDIT_TIMEOUT, || async {
        let found = audit(file, args);
        (found.len() >= n).then_some(found)
    })
    .await
    .expect("timed out waiting for the audit records")
}

/// Goal: a stale leader's rejected write is in the proxy's audit log with its fields
/// (time, scope, presented and current token, peer, method, path, reason), next to the
/// raise and the announce that fenced it out; `palisade audit` filters by event, token
/// and time, and prints a table too.
/// Method: the stale-leader workload with `--audit-log` on the proxy; read the log with
/// `palisade audit --event rejection`, `--token NEW --event raise`, `--since`/`--until`.
#[tokio::test]
async fn stale_leader_rejection_is_in_the_audit_log_with_its_fields() {
    let dir = tempfile::tempdir().unwrap();
    let (s, log) = crate::election_announce::audited_stale_write_cluster(dir.path()).await;

    let rejections = wait_records(&log, &["--event", "rejection"], 1).await;
    assert_eq!(rejections.len(), 1, "{rejections:?}");
    let r = &rejections[0];
    assert_eq!(r.event, "rejection");
    assert_eq!(r.scope.as_deref(), Some(DEFAULT_SCOPE));
    assert_eq!((r.presented, r.current), (Some(s.old), Some(s.new)));
    assert_eq!(r.method.as_deref(), Some("PUT"));
    assert_eq!(r.path.as_deref(), Some("/ledger/2"));
    assert_eq!(r.peer.as_deref(), Some("127.0.0.1"));
    assert_eq!(r.reason.as_deref(), Some("stale-token"));
    let at = r.at().expect("an RFC 3339 time");

    // The raise to the new token, from the old one, and the announce that made it.
    let raises = wait_records(
        &log,
        &["--event", "raise", "--token", &s.new.to_string()],
        1,
    )
    .await;
    assert_eq!(
        (raises[0].presented, raises[0].previous),
        (Some(s.new), Some(s.old))
    );
    let announces = wait_records(
        &log,
        &["--event", "announce", "--token", &s.new.to_string()],
        1,
    )
    .await;
    assert!(
        announces
            .iter()
            .any(|a| a.outcome.as_deref() == Some("advanced")),
        "{announces:?}"
    );

    // The time window: the rejection is inside [at, at + 1 s) and outside [.., at).
    let since = palisade_protocol::audit::rfc3339(at);
    let until = palisade_protocol::audit::rfc3339(at + Duration::from_secs(1));
    assert_eq!(
        audit(
            &log,
            &["--event", "rejection", "--since", &since, "--until", &until]
        )
        .len(),
        1
    );
    assert_eq!(
        audit(&log, &["--event", "rejection", "--until", &since]).len(),
        0
    );
    assert_eq!(audit(&log, &["--scope", "no-such-scope"]).len(), 0);

    let table = Command::new(crate::PALISADE)
        .arg("audit")
        .arg(&log)
        .args(["--event", "rejection"])
        .output()
        .unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.contains(&format!(
            "presented={} current={} peer=127.0.0.1 method=PUT path=/ledger/2 reason=stale-token",
            s.old, s.new
        )),
        "{table}"
    );
    assert!(table.contains("1 event\n"), "{table}");
    let _ = (s.old_leader, s.new_leader, &s.cluster);
}

/// Goal: the audit log rotates at `--audit-log-bytes-max` (no file over the limit) and
/// `palisade audit` reads the rotated files oldest first, so every record comes back in
/// the order it was written.
/// Method: a proxy with a 1 KiB limit; raise the fence to 100, send 12 stale writes with
/// tokens 1..=12 (about 2.6 KiB of rejections); read them back with `palisade audit`.
#[tokio::test]
async fn audit_log_rotates_at_its_size_limit_and_is_read_back_in_order() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let proxy = start_proxy(
        dir.path(),
        &[
            "--audit-log",
            &log.display().to_string(),
            "--audit-log-bytes-max",
            "1024",
        ],
    );
    proxy
        .admin_client()
        .advance(DEFAULT_SCOPE, 100)
        .await
        .unwrap();
    for token in 1..=12u64 {
        let answer = put(&proxy.url(&format!("/rotation/{token}")), token, "stale").await;
        assert_eq!(answer.status, StatusCode::CONFLICT);
    }
    let rejections = wait_records(&log, &["--event", "rejection"], 12).await;
    let tokens: Vec<u64> = rejections.iter().filter_map(|r| r.presented).collect();
    assert_eq!(tokens, (1..=12).collect::<Vec<_>>());
    assert!(rotated_path(&log, 2).exists(), "fewer than two rotations");
    for n in 0..=4 {
        if let Ok(meta) = std::fs::metadata(rotated_path(&log, n)) {
            assert!(meta.len() <= 1024, "file {n} is {} bytes", meta.len());
        }
    }
    // The raise and the announce came first, in the oldest file.
    let all = audit(&log, &[]);
    assert_eq!(all[0].event, "raise", "{all:?}");
}

/// Goal: a node's audit log records its announce to the proxy (node, term, proxy,
/// outcome), and `palisade audit --token` finds it by the term.
/// Method: one node with `--audit-log` and a proxy; wait for the leader's token at the
/// proxy; read the node's log.
#[tokio::test]
async fn node_audit_log_records_the_announce_with_its_fields() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("node-audit.log");
    let spec = palisade_cluster::ClusterSpec {
        nodes: 1,
        node_flags: vec![
            "--tick-ms".into(),
            "20".into(),
            "--audit-log".into(),
            log.display().to_string(),
        ],
        proxy_flags: Vec::new(),
    };
    let cluster = palisade_tests::process::start_cluster(
        dir.path(),
        &spec,
        &palisade_cluster::ClusterOptions::default(),
    );
    let leader = cluster
        .wait_for_leader(0, None, Duration::from_secs(20))
        .await
        .expect("a leader");
    let term = leader.token.unwrap();
    let announces = wait_records(
        &log,
        &["--event", "announce", "--token", &term.to_string()],
        1,
    )
    .await;
    let a = &announces[0];
    assert_eq!(
        (a.node_id, a.term, a.presented),
        (Some(1), Some(term), Some(term))
    );
    assert_eq!(a.outcome.as_deref(), Some("accepted"));
    assert_eq!(a.scope.as_deref(), Some(DEFAULT_SCOPE));
    assert_eq!(
        a.proxy.as_deref(),
        Some(cluster.proxy.admin_url("").as_str())
    );
}

/// Goal: a node's audit log records a transfer asked of its API, with the new term, the
/// target and the outcome. Method: three nodes; restart one follower with `--audit-log`;
/// move leadership to it through the leader's API; then ask it to hand leadership to
/// another node; read its log for the `transfer` record.
#[tokio::test]
async fn node_audit_log_records_a_transfer_asked_of_its_api() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("node-audit.log");
    let spec = palisade_cluster::ClusterSpec {
        nodes: 3,
        node_flags: vec!["--tick-ms".into(), "20".into()],
        proxy_flags: Vec::new(),
    };
    let mut cluster = palisade_tests::process::start_cluster(
        dir.path(),
        &spec,
        &palisade_cluster::ClusterOptions::default(),
    );
    let timeout = Duration::from_secs(20);
    let first = cluster
        .wait_for_leader(0, None, timeout)
        .await
        .expect("a leader");
    let audited = cluster
        .ids()
        .into_iter()
        .find(|&id| id != first.node_id)
        .unwrap();
    {
        let node = cluster.node_mut(audited).unwrap();
        node.spec
            .extra
            .extend(["--audit-log".to_owned(), log.display().to_string()]);
        node.restart().unwrap();
    }
    // Leadership to the audited node (asked of the leader, whose log is off), once it is
    // back and caught up; a refusal while it catches up is retried.
    let leader_api = cluster.node(first.node_id).unwrap().api().clone();
    wait::poll(timeout, || async {
        leader_api.transfer(audited).await.ok()
    })
    .await
    .expect("timed out waiting for leadership moved to the audited node");
    let target = cluster.ids().into_iter().find(|&id| id != audited).unwrap();
    let api = cluster.node(audited).unwrap().api().clone();
    let moved = wait::poll(timeout, || async { api.transfer(target).await.ok() })
        .await
        .expect("timed out waiting for a transfer from the audited node");
    let records = wait_records(
        &log,
        &["--event", "transfer", "--token", &moved.term.to_string()],
        1,
    )
    .await;
    let t = &records[0];
    assert_eq!(
        (t.node_id, t.term, t.current, t.outcome.as_deref()),
        (
            Some(audited),
            Some(moved.term),
            Some(target),
            Some("transferred")
        )
    );
}
