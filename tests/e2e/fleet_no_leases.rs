//! A fleet proxy (`--cluster`) in front of a real `palisade node` started without
//! `--lease-ms`: the node grants no leases, and the proxy says so, naming the flag.

use std::time::Duration;

use http::{Method, StatusCode};
use palisade_cluster::{ClusterOptions, ClusterSpec, wait};
use palisade_protocol::Health;
use palisade_protocol::lease::{LEASES_OFF, LeaseView};
use palisade_tests::client::{put, send};
use palisade_tests::process::{start_cluster, start_proxy};

/// How long the test waits for a condition before failing.
const WAIT: Duration = Duration::from_secs(20);

/// Goal: the operator is told that the nodes grant no leases, and which flag fixes it,
/// wherever they look: every write's 503 (the first, and one made while the renewal
/// backs off), `GET /healthz` (`degraded`, 200), `GET /v1/lease`, and the proxy's log,
/// at start rather than at every failed renewal.
/// Method: one node without `--lease-ms` (and no `--announce`); a proxy with `--cluster`
/// naming its API; write twice, 1.2 s apart; read `/healthz`, `/v1/lease` and the log.
#[tokio::test]
async fn fleet_proxy_names_nodes_without_lease_ms() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let spec = ClusterSpec {
        nodes: 1,
        node_flags: vec!["--tick-ms".into(), "20".into()],
        proxy_flags: Vec::new(),
    };
    let options = ClusterOptions {
        announce: false,
        ..ClusterOptions::default()
    };
    let cluster = start_cluster(dir.path(), &spec, &options);
    let node = cluster.node(1).unwrap().api_url("");
    let node = node.trim_end_matches('/');
    let proxy = start_proxy(&dir.path().join("fleet"), &["--cluster", node]);

    for round in ["first", "during the backoff"] {
        let answer = put(&proxy.url("/k"), 1, "x").await;
        assert_eq!(
            answer.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{round}: {}",
            answer.text()
        );
        let detail = answer.problem().unwrap().detail;
        assert!(
            detail.contains("--lease-ms") && detail.contains(LEASES_OFF) && detail.contains(node),
            "{round}: {detail}"
        );
        tokio::time::sleep(Duration::from_millis(1_200)).await;
    }

    let health = send(Method::GET, &proxy.admin_url("/healthz"), &[], "").await;
    assert_eq!(health.status, StatusCode::OK, "{}", health.text());
    let health: Health = serde_json::from_slice(&health.body).unwrap();
    assert_eq!(health.status, "degraded", "{health:?}");
    assert!(
        health
            .detail
            .as_deref()
            .unwrap_or_default()
            .contains("--lease-ms"),
        "{health:?}"
    );

    let lease = send(Method::GET, &proxy.admin_url("/v1/lease"), &[], "").await;
    let lease: LeaseView = serde_json::from_slice(&lease.body).unwrap();
    assert!(!lease.valid, "{lease:?}");
    assert!(
        lease
            .refusal
            .as_deref()
            .unwrap_or_default()
            .contains("--lease-ms"),
        "{lease:?}"
    );

    // The log says it when it starts, not at every failed renewal (a round that fails
    // otherwise, a node too slow to answer, would end it and a later one say it again).
    let said = wait::poll(WAIT, || async {
        let log = proxy.guard.log_text();
        let lines: Vec<String> = log
            .lines()
            .filter(|l| l.contains("the cluster grants no leases") && l.contains("ERROR"))
            .map(str::to_owned)
            .collect();
        (!lines.is_empty()).then_some(lines)
    })
    .await
    .expect("timed out waiting for the log line naming --lease-ms");
    let failures = usize::try_from(lease.failures).unwrap();
    assert!(
        said.len() < failures,
        "{} lines, {failures} failed renewals: {said:?}",
        said.len()
    );
    assert!(said[0].contains("--lease-ms"), "{}", said[0]);
    drop(cluster);
}
