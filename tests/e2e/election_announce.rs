//! Fence on election, end to end: real `palisade node` processes announce their token to
//! a real `palisade proxy`, so a new leader fences out its predecessor without writing.

use std::time::Duration;

use http::{Method, StatusCode};
use palisade_cluster::wait;
use palisade_cluster::{ClusterOptions, ClusterSpec};
use palisade_protocol::DEFAULT_SCOPE;
use palisade_protocol::headers::FENCING_TOKEN_CURRENT;
use palisade_tests::client::{put, send};
use palisade_tests::process::start_cluster;

/// Generous bound for an election at 20 ms ticks on a loaded 2-core machine.
const ELECTION_TIMEOUT: Duration = Duration::from_secs(20);

fn spec() -> ClusterSpec {
    ClusterSpec {
        nodes: 3,
        node_flags: vec!["--tick-ms".into(), "20".into()],
        proxy_flags: Vec::new(),
    }
}

/// Goal: after a leader change the proxy's fence equals the new term with no data write,
/// so the paused leader's next write is rejected. Method: elect, write once, SIGSTOP the
/// leader, wait for the successor's announced token at the proxy, check that the store
/// holds only the first write, resume the old leader and write with its token.
#[tokio::test]
async fn new_leader_fences_the_proxy_without_writing() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(dir.path(), &spec(), &ClusterOptions::default());

    let first = cluster
        .wait_for_leader(0, None, ELECTION_TIMEOUT)
        .await
        .expect("a first leader");
    let old = first.token.unwrap();
    let fence = wait::poll(ELECTION_TIMEOUT, || async {
        cluster
            .proxy_fence(DEFAULT_SCOPE)
            .await
            .filter(|&f| f == old)
    })
    .await
    .expect("timed out waiting for the first token at the proxy");
    assert_eq!(fence, old);
    assert_eq!(
        put(&cluster.proxy.url("/ledger/1"), old, "first")
            .await
            .status,
        StatusCode::OK
    );

    let paused = cluster.node(first.node_id).unwrap();
    paused.guard.pause().unwrap();
    let next = cluster
        .wait_for_leader(old, Some(first.node_id), ELECTION_TIMEOUT)
        .await
        .expect("a new leader while the old one is paused");
    let new = next.token.unwrap();
    assert!(new > old, "terms only grow: {new} > {old}");
    wait::poll(ELECTION_TIMEOUT, || async {
        cluster
            .proxy_fence(DEFAULT_SCOPE)
            .await
            .filter(|&f| f == new)
    })
    .await
    .expect("timed out waiting for the new token at the proxy");
    let listing = send(Method::GET, &cluster.proxy.url("/ledger/?list"), &[], "")
        .await
        .json();
    assert_eq!(
        listing["keys"].as_array().unwrap().len(),
        1,
        "the fence moved without any data write"
    );

    paused.guard.resume().unwrap();
    let stale = put(
        &cluster.proxy.url("/ledger/2"),
        old,
        "from the paused leader",
    )
    .await;
    assert_eq!(stale.status, StatusCode::CONFLICT);
    assert_eq!(
        stale.header(FENCING_TOKEN_CURRENT.as_str()),
        Some(new.to_string())
    );

    // The resumed node learns the new term and reports no token.
    wait::poll(ELECTION_TIMEOUT, || async {
        paused
            .leadership()
            .await
            .filter(|l| l.term >= new && l.token.is_none())
    })
    .await
    .expect("timed out waiting for the old leader to follow the new term");
}
