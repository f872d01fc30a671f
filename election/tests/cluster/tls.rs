//! Mutual TLS on the peer links and the node API, with in-process nodes on loopback and
//! a throwaway CA (`Pki`): who can speak to a peer port, who can claim which id, and who
//! can call the API.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use palisade_client::NodeApi;
use palisade_cluster::{Pki, wait};
use palisade_election::{Node, NodeConfig, NodeHandle, StartError};
use raft::eraftpb::MessageType;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;

use crate::support::{
    SETTLE_TIMEOUT, hello_frame, loopback_peers, node_tls, raft_frame, token_holder,
};

/// Longest wait for a node to close a connection it refuses.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(10);
/// A forged term far ahead of any real one.
const FORGED_TERM: u64 = 1_000;

/// Node `id` of `peers` on loopback, with its data in `dir` and its TLS files (when the
/// cluster runs with TLS) in `dir/pki`.
fn config(id: u64, peers: &BTreeMap<u64, String>, dir: &Path) -> NodeConfig {
    NodeConfig {
        id,
        peers: peers.clone(),
        data_dir: dir.join(format!("node{id}")),
        api: Some("127.0.0.1:0".parse().unwrap()),
        tick_ms: 50,
        tls: Some(node_tls(&Pki::at(&dir.join("pki")), &format!("node-{id}"))),
        ..NodeConfig::default()
    }
}

/// Three nodes with mutual TLS, and the directory holding their data and certificates
/// (`pki/`: the CA, `node-1`..`node-4`, `writer-client`, and `client`, a name without a
/// role).
struct Cluster {
    dir: tempfile::TempDir,
    nodes: Vec<NodeHandle>,
}

impl Cluster {
    async fn start() -> Self {
        Self::start_of(3).await
    }

    /// Nodes 1 to 3 of a cluster of `voters` (3 or 4: node 4, when configured, is never
    /// started, so its id is free to test with).
    async fn start_of(voters: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Pki::issue(
            &dir.path().join("pki"),
            &[
                "node-1",
                "node-2",
                "node-3",
                "node-4",
                "writer-client",
                "client",
            ],
        )
        .unwrap();
        let peers = loopback_peers(voters);
        let mut nodes = Vec::new();
        for id in 1..=3 {
            nodes.push(Node::start(config(id, &peers, dir.path())).await.unwrap());
        }
        Self { dir, nodes }
    }

    fn pki(&self) -> Pki {
        Pki::at(&self.dir.path().join("pki"))
    }

    /// Waits for an established leader; its id.
    async fn leader(&self) -> u64 {
        token_holder(&self.nodes, |_| true).await.0
    }

    fn terms(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|n| n.leadership().borrow().term)
            .collect()
    }

    async fn shutdown(self) {
        for node in self.nodes {
            node.shutdown().await.unwrap();
        }
    }
}

/// A hello frame and a heartbeat frame with `term`, from `from` to `to`.
fn hello_and_heartbeat(from: u64, to: u64, term: u64) -> Vec<u8> {
    let heartbeat = raft_frame(MessageType::MsgHeartbeat, from, to, term, 0);
    [hello_frame(from, to), heartbeat].concat()
}

/// A TLS connector trusting the cluster CA, presenting `identity` if given.
fn tls_connector(pki: &Pki, identity: Option<&str>) -> TlsConnector {
    TlsConnector::from(Arc::new(pki.client_config(identity).unwrap()))
}

/// Writes `bytes`, then waits for the node to close the connection. True when it did
/// within [`REFUSAL_TIMEOUT`] (an end of stream or an error both count). Beware: a
/// connection that stays open makes this wait the whole timeout.
async fn closed_after<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, bytes: &[u8]) -> bool {
    let _ = stream.write_all(bytes).await;
    let _ = stream.flush().await;
    // A node never writes to a peer connection except TLS alerts: read to the end.
    let mut rest = Vec::new();
    tokio::time::timeout(REFUSAL_TIMEOUT, stream.read_to_end(&mut rest))
        .await
        .is_ok()
}

/// Goal: three nodes with mutual TLS on every peer link elect an established leader.
/// Method: a CA and `node-<id>` certificates; start three nodes; wait with a deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_with_mutual_tls_elect_a_leader() {
    let cluster = Cluster::start().await;
    let leader = cluster.leader().await;
    assert!((1..=3).contains(&leader));
    cluster.shutdown().await;
}

/// Goal: a raw TCP client without a certificate cannot speak to a peer port: a plaintext
/// hello with a forged high-term heartbeat is refused, a TLS client without a certificate
/// fails its handshake, and the cluster is unaffected (same term, still led).
/// Method: after a leader is established, send both to every node's peer port; wait for
/// each connection to be closed; compare the terms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_certificate_cannot_speak_to_a_peer_port() {
    let cluster = Cluster::start().await;
    cluster.leader().await;
    let before = cluster.terms();
    let connector = tls_connector(&cluster.pki(), None);
    for node in &cluster.nodes {
        let addr = node.peer_addr().unwrap();
        let plain = tokio::net::TcpStream::connect(addr).await.unwrap();
        let forged = hello_and_heartbeat(99, node.id(), FORGED_TERM);
        assert!(
            closed_after(plain, &forged).await,
            "plaintext to node {}",
            node.id()
        );
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from(format!("node-{}", node.id())).unwrap();
        // TLS 1.3: the client may finish its side before the server refuses the missing
        // certificate; then the refusal shows as the connection closing.
        if let Ok(tls) = connector.connect(name, tcp).await {
            let other = if node.id() == 1 { 2 } else { 1 };
            let forged = hello_and_heartbeat(other, node.id(), FORGED_TERM);
            assert!(
                closed_after(tls, &forged).await,
                "certless TLS to node {}",
                node.id()
            );
        }
    }
    assert_eq!(cluster.terms(), before, "no forged term got through");
    assert!(cluster.terms().iter().all(|&t| t < FORGED_TERM));
    cluster.leader().await;
    cluster.shutdown().await;
}

/// Goal: a peer holding a valid certificate for `node-2` cannot claim to be node 1: the
/// connection is refused before any message is delivered.
/// Method: dial node 3's peer port with node 2's certificate, say hello as node 1 and
/// send a forged high-term heartbeat; wait for the close; the terms are unchanged. As a
/// control, node 4's certificate (node 4 is configured but not running) saying hello as
/// node 4 is kept open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_node_2_cannot_claim_node_1() {
    let cluster = Cluster::start_of(4).await;
    cluster.leader().await;
    let before = cluster.terms();
    let connector = tls_connector(&cluster.pki(), Some("node-2"));
    let target = &cluster.nodes[2];
    let tcp = tokio::net::TcpStream::connect(target.peer_addr().unwrap())
        .await
        .unwrap();
    let tls = connector
        .connect(ServerName::try_from("node-3").unwrap(), tcp)
        .await
        .expect("node 2's certificate is valid under the CA");
    let forged = hello_and_heartbeat(1, 3, FORGED_TERM);
    assert!(
        closed_after(tls, &forged).await,
        "the impostor's connection was closed"
    );
    assert_eq!(cluster.terms(), before);
    // Control: a certificate saying hello as the node it names is accepted (kept open),
    // so the refusal above came from the name check.
    let connector = tls_connector(&cluster.pki(), Some("node-4"));
    let tcp = tokio::net::TcpStream::connect(target.peer_addr().unwrap())
        .await
        .unwrap();
    let mut tls = connector
        .connect(ServerName::try_from("node-3").unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(&hello_frame(4, 3)).await.unwrap();
    tls.flush().await.unwrap();
    let mut rest = Vec::new();
    let held = tokio::time::timeout(Duration::from_secs(1), tls.read_to_end(&mut rest)).await;
    assert!(
        held.is_err(),
        "node 4's own hello must be accepted: {held:?}"
    );
    cluster.leader().await;
    cluster.shutdown().await;
}

/// Goal: with TLS on, the node API refuses a call without a client certificate, serves
/// one with a certificate from the CA whose name carries a role the route admits (a
/// writer reads leadership), and answers 403 `forbidden-role` to a certificate from the
/// CA whose name carries no role. Method: the Rust client's `NodeApi` over HTTPS,
/// trusting the CA, without an identity, as `writer-client` and as `client`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_api_needs_a_client_certificate() {
    let cluster = Cluster::start().await;
    let pki = cluster.pki();
    let url = format!("https://{}", cluster.nodes[0].api_addr().unwrap());
    let anonymous = NodeApi::with_tls(&url, &pki.client_tls(None).unwrap()).unwrap();
    let refused = anonymous.leader().await;
    assert!(
        refused.is_err(),
        "served without a client certificate: {refused:?}"
    );
    let identified = pki.client_tls(Some("writer-client")).unwrap();
    let view = NodeApi::with_tls(&url, &identified)
        .unwrap()
        .leader()
        .await
        .unwrap();
    assert_eq!(view.node_id, 1);
    let no_role = pki.client_tls(Some("client")).unwrap();
    let refused = NodeApi::with_tls(&url, &no_role).unwrap().leader().await;
    let problem = refused.as_ref().err().and_then(|e| e.problem());
    assert!(
        problem.is_some_and(|p| p.status == 403 && p.kind() == "forbidden-role"),
        "a certificate naming no role: {refused:?}"
    );
    let plain = NodeApi::new(&format!("http://{}", cluster.nodes[0].api_addr().unwrap()))
        .unwrap()
        .leader()
        .await;
    assert!(plain.is_err(), "served over plaintext: {plain:?}");
    cluster.shutdown().await;
}

/// Goal: a node whose certificate does not name `node-<id>` does not start: a
/// configuration error naming the certificate, not a cluster whose peers refuse it.
/// Method: start node 1 with node 2's certificate.
#[tokio::test]
async fn a_certificate_for_another_node_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::issue(&dir.path().join("pki"), &["node-2"]).unwrap();
    let peers = loopback_peers(1);
    let mut config = config(1, &peers, dir.path());
    config.tls = Some(node_tls(&pki, "node-2"));
    let err = Node::start(config).await.unwrap_err();
    match err {
        StartError::Config(c) => {
            assert_eq!(c.field, "cert", "{c}");
            assert!(c.message.contains("node-1"), "{c}");
        }
        other => panic!("expected a config error, got {other}"),
    }
}

/// Goal: in plaintext mode, a hello naming a peer whose connection is live does not
/// replace that connection (nothing the forger sends is delivered), while a real peer
/// that restarts still reconnects.
/// Method: a plaintext cluster on loopback; dial a follower's peer port, say hello as a
/// live peer and send a forged high-term heartbeat: the connection is closed and the
/// terms are unchanged. Then restart another follower and transfer the leadership to it,
/// which needs its messages to reach the leader over a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_hello_cannot_replace_a_live_peer_but_a_restarted_peer_rejoins() {
    let dir = tempfile::tempdir().unwrap();
    let peers = loopback_peers(3);
    let plain = |id| NodeConfig {
        tls: None,
        ..config(id, &peers, dir.path())
    };
    let mut cluster = Cluster {
        dir: tempfile::tempdir().unwrap(),
        nodes: Vec::new(),
    };
    for id in 1..=3 {
        cluster.nodes.push(Node::start(plain(id)).await.unwrap());
    }
    let leader = cluster.leader().await;
    let before = cluster.terms();
    let followers: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    let (target, restarted) = (followers[0], followers[1]);
    let addr = cluster.nodes[target as usize - 1].peer_addr().unwrap();
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let forged = hello_and_heartbeat(leader, target, FORGED_TERM);
    assert!(
        closed_after(stream, &forged).await,
        "the forger was refused"
    );
    assert_eq!(cluster.terms(), before, "no forged term got through");

    let old = cluster.nodes.remove(restarted as usize - 1);
    old.shutdown().await.unwrap();
    let node = Node::start(plain(restarted)).await.unwrap();
    cluster.nodes.insert(restarted as usize - 1, node);
    let leader_handle = &cluster.nodes[leader as usize - 1];
    wait::poll(SETTLE_TIMEOUT, || async {
        leader_handle.transfer(restarted).await.ok()
    })
    .await
    .expect("the restarted node to take over");
    cluster.shutdown().await;
}
