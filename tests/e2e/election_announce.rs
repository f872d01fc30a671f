//! Fence on election, end to end: real `palisade node` processes announce their token to
//! a real `palisade proxy`, so a new leader fences out its predecessor without writing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{Method, StatusCode};
use palisade_cluster::{Cluster, ClusterOptions, ClusterSpec, wait};
use palisade_protocol::headers::FENCING_TOKEN_CURRENT;
use palisade_tests::client::{put, send};
use palisade_tests::fixtures::{fence_at_proxy, first_announced_leader};
use palisade_tests::process::start_cluster;

/// Generous bound for an election at 20 ms ticks on a loaded 2-core machine.
const ELECTION_TIMEOUT: Duration = Duration::from_secs(20);

/// A cluster after the stale-leader workload.
pub(crate) struct AfterStaleWrite {
    pub cluster: Cluster,
    /// The paused leader's id and token.
    pub old_leader: u64,
    pub old: u64,
    /// The successor's id and token.
    pub new_leader: u64,
    pub new: u64,
}

/// Starts three nodes and a proxy (with `proxy_flags`), writes with the first leader's
/// token, pauses that leader until a successor is announced at the proxy, resumes it,
/// and has it write `/ledger/2` with its old token: rejected with 409.
pub(crate) async fn stale_write_cluster(dir: &Path, proxy_flags: Vec<String>) -> AfterStaleWrite {
    crate::use_tested_binary();
    let spec = ClusterSpec {
        nodes: 3,
        node_flags: vec!["--tick-ms".into(), "20".into()],
        proxy_flags,
    };
    let cluster = start_cluster(dir, &spec, &ClusterOptions::default());
    let first = first_announced_leader(&cluster, ELECTION_TIMEOUT).await;
    let old = first.token.unwrap();
    let ok = put(&cluster.proxy.url("/ledger/1"), old, "first").await;
    assert_eq!(ok.status, StatusCode::OK);

    let paused = cluster.node(first.node_id).unwrap();
    paused.guard.pause().unwrap();
    let next = cluster
        .wait_for_leader(old, Some(first.node_id), ELECTION_TIMEOUT)
        .await
        .expect("a new leader while the old one is paused");
    let new = next.token.unwrap();
    assert!(new > old, "terms only grow: {new} > {old}");
    fence_at_proxy(&cluster, ELECTION_TIMEOUT, "the new token", |f| f == new).await;
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
    // Every node, the resumed one included, follows the new leader before a page is read.
    for node in &cluster.nodes {
        wait::poll(ELECTION_TIMEOUT, || async {
            node.leadership()
                .await
                .filter(|l| l.term == new && l.leader_id == Some(next.node_id))
        })
        .await
        .expect("timed out waiting for every node to follow the new leader");
    }
    AfterStaleWrite {
        old_leader: first.node_id,
        old,
        new_leader: next.node_id,
        new,
        cluster,
    }
}

/// [`stale_write_cluster`] with the proxy's audit log at `dir/proxy-audit.log`; the log's
/// path too.
pub(crate) async fn audited_stale_write_cluster(dir: &Path) -> (AfterStaleWrite, PathBuf) {
    let log = dir.join("proxy-audit.log");
    let flags = vec!["--audit-log".into(), log.display().to_string()];
    (stale_write_cluster(dir, flags).await, log)
}

/// Goal: after a leader change the proxy's fence equals the new term with no data write,
/// so the paused leader's next write is rejected. Method: the stale-leader workload
/// ([`stale_write_cluster`]: elect, write once, SIGSTOP the leader, wait for the
/// successor's announced token at the proxy, resume the old leader and write with its
/// token); check that the store holds only the first write and that the resumed node
/// holds no token.
#[tokio::test]
async fn new_leader_fences_the_proxy_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let s = stale_write_cluster(dir.path(), Vec::new()).await;
    let listing = send(Method::GET, &s.cluster.proxy.url("/ledger/?list"), &[], "")
        .await
        .json();
    assert_eq!(
        listing["keys"].as_array().unwrap().len(),
        1,
        "the fence moved without any data write"
    );
    // The resumed node learns the new term and reports no token.
    let paused = s.cluster.node(s.old_leader).unwrap();
    wait::poll(ELECTION_TIMEOUT, || async {
        paused
            .leadership()
            .await
            .filter(|l| l.term >= s.new && l.token.is_none())
    })
    .await
    .expect("timed out waiting for the old leader to follow the new term");
}
