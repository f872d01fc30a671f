//! Embedding: an application runs its election node in-process and writes through a real
//! proxy with the node's token, read from the node's leadership watch.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use palisade_client::{FencedClient, TokenSource};
use palisade_election::{Node, NodeConfig, NodeHandleSource};
use palisade_tests::process::start_proxy;

/// Goal: a single in-process node becomes the established leader, announces its token to
/// the proxy, and a `FencedClient` over `NodeHandleSource` writes with that token.
/// Method: `Node::start` with a one-voter cluster and `--announce`-equivalent config; wait
/// for the source to offer a token; write; read the token the store recorded.
#[tokio::test]
async fn in_process_node_drives_a_fenced_client() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_proxy(&dir.path().join("proxy"), &[]);
    let port = palisade_cluster::free_port().unwrap();
    let config = NodeConfig {
        id: 1,
        peers: BTreeMap::from([(1, format!("127.0.0.1:{port}"))]),
        data_dir: dir.path().join("node"),
        announce: vec![format!("http://{}", proxy.admin)],
        tick_ms: 20,
        ..NodeConfig::default()
    };
    let node = Node::start(config).await.unwrap();
    let source = Arc::new(NodeHandleSource::new(&node));
    let leadership = tokio::time::timeout(Duration::from_secs(20), source.wait_for_leader())
        .await
        .expect("the single node becomes the established leader");
    let token = leadership.write_token().unwrap();
    assert_eq!(token, leadership.term, "the token is the leader's term");

    let client = FencedClient::builder(&proxy.url(""), source)
        .build()
        .unwrap();
    client
        .put("embedded/1", "from an in-process node")
        .await
        .unwrap();
    let stored = client.get("embedded/1").await.unwrap();
    assert_eq!(stored.stored_token(), Some(token));
    node.shutdown().await.unwrap();
}
