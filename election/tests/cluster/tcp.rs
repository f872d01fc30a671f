//! Nodes over the real TCP transport and the real HTTP API, on loopback: the framing of
//! the peer links and the API's accept loop, end to end in one process.

use std::cell::Cell;

use palisade_cluster::wait;
use palisade_election::{LeaderView, Node, NodeConfig, NodeHandle, Role};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::support::{SETTLE_TIMEOUT, loopback_peers, token_holder};

async fn start(dir: &std::path::Path) -> Vec<NodeHandle> {
    let peers = loopback_peers(3);
    let mut nodes = Vec::new();
    for id in 1..=3 {
        let config = NodeConfig {
            id,
            peers: peers.clone(),
            data_dir: dir.join(format!("node{id}")),
            api: Some("127.0.0.1:0".parse().unwrap()),
            tick_ms: 50,
            ..NodeConfig::default()
        };
        nodes.push(Node::start(config).await.unwrap());
    }
    nodes
}

/// `GET path` on `node`'s API over a plain socket: the status code and the body.
async fn get(node: &NodeHandle, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(node.api_addr().unwrap())
        .await
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: node\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Goal: three nodes on real sockets elect one established leader, which every node's
/// API reports, so the peer framing carries raft traffic both ways.
/// Method: start three nodes on loopback ports; wait with a deadline until one holds a
/// token; read `/v1/leader` of every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_over_tcp_elect_a_leader_the_api_reports() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = start(dir.path()).await;
    let (leader, l) = token_holder(&nodes, |_| true).await;
    let term = l.term;
    // Followers learn the leader from its next heartbeat: long-poll each until it shows
    // that leader, within a deadline.
    for node in &nodes {
        let seen_term = Cell::new(None);
        let view = wait::poll(SETTLE_TIMEOUT, || async {
            let path = match seen_term.get() {
                None => "/v1/leader".to_owned(),
                Some(term) => format!("/v1/leader?after_term={term}&timeout_ms=1000"),
            };
            let (status, body) = get(node, &path).await;
            assert_eq!(status, 200, "{body}");
            let view: LeaderView = serde_json::from_str(&body).unwrap();
            seen_term.set(Some(view.term));
            (view.leader_id == Some(leader)).then_some(view)
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "timed out waiting for node {} to report the leader",
                node.id()
            )
        });
        assert_eq!(view.term, term, "{view:?}");
        let role = if node.id() == leader {
            Role::Leader
        } else {
            Role::Follower
        };
        assert_eq!(view.role, role, "{view:?}");
    }
    let (status, body) = get(&nodes[0], "/v1/leader?timeout_ms=x").await;
    assert_eq!(status, 400, "{body}");
    for node in nodes {
        node.stop().await.unwrap();
    }
}
