//! Signed tokens on the node side: with `token_key`, the established leader's token comes
//! with an Ed25519 proof over `proof_message(scope, token)`, withdrawn with the token and
//! made anew for the next leader's token; without a key there is no proof; a bad key file
//! is a configuration error naming it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use palisade_election::{LeaderView, Leadership, MemNetwork, Node, NodeConfig, NodeHandle};
use palisade_protocol::proof::proof_message;
use redb::backends::InMemoryBackend;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};

/// Longest wait for a leader or a transfer, in real time.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);
const SCOPE: &str = "orders";

/// A fresh key: the PEM `PRIVATE KEY` file's text and the raw public key.
fn key_pair() -> (String, Vec<u8>) {
    let rng = ring::rand::SystemRandom::new();
    let doc = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let pair = Ed25519KeyPair::from_pkcs8(doc.as_ref()).unwrap();
    let body = base64::engine::general_purpose::STANDARD.encode(doc.as_ref());
    let pem = format!("-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n");
    (pem, pair.public_key().as_ref().to_vec())
}

fn memory_db() -> Arc<redb::Database> {
    Arc::new(
        redb::Database::builder()
            .create_with_backend(InMemoryBackend::new())
            .unwrap(),
    )
}

async fn start(ids: &[u64], key: Option<&std::path::Path>) -> Vec<NodeHandle> {
    let net = MemNetwork::new();
    let mut nodes = Vec::new();
    for &id in ids {
        let config = NodeConfig {
            id,
            peers: ids
                .iter()
                .map(|&p| (p, format!("127.0.0.1:{}", 7000 + p)))
                .collect(),
            scope: SCOPE.to_owned(),
            tick_ms: 20,
            token_key: key.map(std::path::Path::to_path_buf),
            ..NodeConfig::default()
        };
        nodes.push(
            Node::start_in_memory(config, memory_db(), &net)
                .await
                .unwrap(),
        );
    }
    nodes
}

/// Waits until some node holds a token other than `not`, and returns its index and view.
async fn leader_other_than(nodes: &[NodeHandle], not: Option<u64>) -> (usize, Leadership) {
    tokio::time::timeout(SETTLE_TIMEOUT, async {
        loop {
            for (i, n) in nodes.iter().enumerate() {
                let l = *n.leadership().borrow();
                if l.token.is_some() && l.token != not {
                    return (i, l);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("a leader was established within the deadline")
}

fn verifies(public: &[u8], token: u64, proof: &[u8]) -> bool {
    UnparsedPublicKey::new(&ED25519, public)
        .verify(&proof_message(SCOPE, token), proof)
        .is_ok()
}

/// Goal: the leader's token carries a proof that verifies for exactly that scope and
/// token; after a transfer the old leader shows no proof, and the new token's proof
/// verifies while the old proof does not pass for it.
/// Method: three in-memory nodes sharing a key file; verify with the public key; resign;
/// verify again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_token_carries_a_proof_that_follows_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let (pem, public) = key_pair();
    let key = dir.path().join("token.key");
    std::fs::write(&key, pem).unwrap();
    let nodes = start(&[1, 2, 3], Some(&key)).await;

    let (first, l1) = leader_other_than(&nodes, None).await;
    let t1 = l1.token.unwrap();
    let p1 = l1
        .proof
        .expect("a key is configured: the token has a proof");
    assert!(verifies(&public, t1, &p1.0), "proof of {t1} verifies");
    assert!(!verifies(&public, t1 + 1, &p1.0), "not for the next token");

    nodes[first].resign().await.unwrap();
    let (second, l2) = leader_other_than(&nodes, Some(t1)).await;
    assert_ne!(first, second);
    let t2 = l2.token.unwrap();
    let p2 = l2.proof.unwrap();
    assert!(t2 > t1 && verifies(&public, t2, &p2.0));
    assert!(
        !verifies(&public, t2, &p1.0),
        "the old proof does not prove the new token"
    );
    let old = *nodes[first].leadership().borrow();
    assert_eq!(
        (old.token, old.proof),
        (None, None),
        "withdrawn with the token"
    );
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}

/// Goal: the node API's leader view carries the proof, base64url without padding, and
/// it verifies for the view's scope and token. Method: a one-node cluster with a key and
/// an API on loopback; wait for the token; `GET /v1/leader` over a plain socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_view_carries_the_proof() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let dir = tempfile::tempdir().unwrap();
    let (pem, public) = key_pair();
    let key = dir.path().join("token.key");
    std::fs::write(&key, pem).unwrap();
    let config = NodeConfig {
        id: 1,
        peers: [(1, "127.0.0.1:7001".to_owned())].into_iter().collect(),
        scope: SCOPE.to_owned(),
        api: Some("127.0.0.1:0".parse().unwrap()),
        tick_ms: 20,
        token_key: Some(key),
        ..NodeConfig::default()
    };
    let node = Node::start_in_memory(config, memory_db(), &MemNetwork::new())
        .await
        .unwrap();
    let (_, l) = leader_other_than(std::slice::from_ref(&node), None).await;
    let mut stream = tokio::net::TcpStream::connect(node.api_addr().unwrap())
        .await
        .unwrap();
    stream
        .write_all(b"GET /v1/leader HTTP/1.1\r\nhost: node\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let body = answer.split_once("\r\n\r\n").unwrap().1;
    let view: LeaderView = serde_json::from_str(body).unwrap();
    assert_eq!(view.token, l.token);
    let proof = view.proof.expect("the view carries the proof");
    assert_eq!(Some(proof.clone()), l.proof.map(|p| p.encode()));
    let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(&proof)
        .unwrap();
    assert!(verifies(&public, view.token.unwrap(), &signature));
    node.shutdown().await.unwrap();
}

/// Goal: without a key, a token carries no proof (the behaviour before signed tokens).
/// Method: a one-node cluster without `token_key`; wait for its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_tokens_carry_no_proof() {
    let nodes = start(&[1], None).await;
    let (_, l) = leader_other_than(&nodes, None).await;
    assert!(l.token.is_some());
    assert_eq!(l.proof, None);
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}

/// Goal: a key file that is missing, not PEM, or not an Ed25519 key stops the start with
/// a configuration error naming `token_key` and the file.
/// Method: start one node with each bad file.
#[tokio::test]
async fn bad_key_files_are_configuration_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("not-pem.key");
    std::fs::write(&not_pem, "hello").unwrap();
    let not_ed = dir.path().join("not-ed25519.key");
    std::fs::write(
        &not_ed,
        "-----BEGIN PRIVATE KEY-----\nMAMCAQA=\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let missing = dir.path().join("missing.key");
    for path in [not_pem, not_ed, missing] {
        let config = NodeConfig {
            id: 1,
            peers: [(1, "127.0.0.1:7001".to_owned())].into_iter().collect(),
            token_key: Some(path.clone()),
            ..NodeConfig::default()
        };
        let err = Node::start_in_memory(config, memory_db(), &MemNetwork::new())
            .await
            .unwrap_err();
        assert!(err.is_config(), "{err}");
        let text = err.to_string();
        assert!(text.contains("token_key"), "{text}");
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(text.contains(name), "{text}");
    }
}
