//! Signed tokens on the node side: with `token_key`, the established leader's token comes
//! with an Ed25519 proof over `proof_message(scope, token)`, withdrawn with the token and
//! made anew for the next leader's token; without a key there is no proof; a bad key file
//! is a configuration error naming it.

use std::path::Path;

use palisade_election::{LeaderView, MemNetwork, Node, NodeConfig, NodeHandle};

use crate::support::{self, SCOPE, token_holder, token_key, verifies, verifies_encoded};

/// Nodes `ids` of scope [`SCOPE`] on one in-memory network, signing with `key` if given;
/// in the order of `ids`.
async fn start(ids: &[u64], key: Option<&Path>) -> Vec<NodeHandle> {
    let net = MemNetwork::new();
    let mut nodes = Vec::new();
    for &id in ids {
        let config = NodeConfig {
            scope: SCOPE.to_owned(),
            tick_ms: 20,
            token_key: key.map(Path::to_path_buf),
            ..support::config(id, ids)
        };
        nodes.push(support::start_in_memory(config, &net).await);
    }
    nodes
}

/// Goal: the leader's token carries a proof that verifies for exactly that scope and
/// token; after a transfer the old leader shows no proof, and the new token's proof
/// verifies while the old proof does not pass for it.
/// Method: three in-memory nodes sharing a key file; verify with the public key; resign;
/// verify again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_token_carries_a_proof_that_follows_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = token_key(dir.path());
    let nodes = start(&[1, 2, 3], Some(&key)).await;
    let node = |id: u64| &nodes[usize::try_from(id - 1).unwrap()];

    let (first, l1) = token_holder(&nodes, |_| true).await;
    let t1 = l1.token.unwrap();
    let p1 = l1
        .proof
        .expect("a key is configured: the token has a proof");
    assert!(verifies(&public, t1, &p1.0), "proof of {t1} verifies");
    assert!(!verifies(&public, t1 + 1, &p1.0), "not for the next token");

    node(first).resign().await.unwrap();
    let (second, l2) = token_holder(&nodes, |l| l.token != Some(t1)).await;
    assert_ne!(first, second);
    let t2 = l2.token.unwrap();
    let p2 = l2.proof.unwrap();
    assert!(t2 > t1 && verifies(&public, t2, &p2.0));
    assert!(
        !verifies(&public, t2, &p1.0),
        "the old proof does not prove the new token"
    );
    let old = *node(first).leadership().borrow();
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
    let (key, public) = token_key(dir.path());
    let config = NodeConfig {
        scope: SCOPE.to_owned(),
        api: Some("127.0.0.1:0".parse().unwrap()),
        tick_ms: 20,
        token_key: Some(key),
        ..support::config(1, &[1])
    };
    let node = support::start_in_memory(config, &MemNetwork::new()).await;
    let (_, l) = token_holder([&node], |_| true).await;
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
    assert!(verifies_encoded(&public, view.token.unwrap(), &proof));
    node.shutdown().await.unwrap();
}

/// Goal: without a key, a token carries no proof (the behaviour before signed tokens).
/// Method: a one-node cluster without `token_key`; wait for its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_tokens_carry_no_proof() {
    let nodes = start(&[1], None).await;
    let (_, l) = token_holder(&nodes, |_| true).await;
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
            token_key: Some(path.clone()),
            ..support::config(1, &[1])
        };
        let err = Node::start_in_memory(config, support::memory_db(), &MemNetwork::new())
            .await
            .unwrap_err();
        assert!(err.is_config(), "{err}");
        let text = err.to_string();
        assert!(text.contains("token_key"), "{text}");
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(text.contains(name), "{text}");
    }
}
