//! The announce carries the token's proof, and the bearer token of
//! `announce_token_file`, to a fake proxy (a plain socket that records each request).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use palisade_election::{MemNetwork, Node, NodeConfig, Scope};
use palisade_protocol::proof::proof_message;
use palisade_protocol::{AdvanceRequest, AdvanceResponse};
use redb::backends::InMemoryBackend;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// A fake proxy admin API answering 200 to every advance, recording each whole request.
async fn fake_proxy() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut got = 0;
                while !buf[..got].contains(&b'}') {
                    match s.read(&mut buf[got..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got += n,
                    }
                }
                let text = String::from_utf8_lossy(&buf[..got]).into_owned();
                let body = text.rsplit("\r\n\r\n").next().unwrap_or_default();
                let request: AdvanceRequest = serde_json::from_str(body).unwrap();
                record.lock().unwrap().push(text.clone());
                let answer = serde_json::to_string(&AdvanceResponse {
                    scope: Scope::new("orders").unwrap(),
                    token: request.token,
                    advanced: true,
                })
                .unwrap();
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                    answer.len()
                );
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    (url, seen)
}

/// Goal: with a key and a bearer file, the announce's body carries the token's proof
/// (verifiable with the public key) and the request carries `Authorization: Bearer`.
/// Method: a one-node cluster announcing to a fake proxy; wait for `announced`; parse the
/// recorded request.
#[tokio::test]
async fn announce_carries_the_proof_and_the_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let rng = ring::rand::SystemRandom::new();
    let doc = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let public = Ed25519KeyPair::from_pkcs8(doc.as_ref())
        .unwrap()
        .public_key()
        .as_ref()
        .to_vec();
    let body = base64::engine::general_purpose::STANDARD.encode(doc.as_ref());
    let key = dir.path().join("token.key");
    std::fs::write(
        &key,
        format!("-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n"),
    )
    .unwrap();
    let bearer = dir.path().join("admin.token");
    std::fs::write(&bearer, "s3cret-admin\n").unwrap();

    let (url, seen) = fake_proxy().await;
    let config = NodeConfig {
        id: 1,
        peers: [(1, "127.0.0.1:7001".to_owned())].into_iter().collect(),
        scope: "orders".into(),
        announce: vec![url],
        tick_ms: 10,
        token_key: Some(key),
        announce_token_file: Some(bearer),
        ..NodeConfig::default()
    };
    let db = Arc::new(
        redb::Database::builder()
            .create_with_backend(InMemoryBackend::new())
            .unwrap(),
    );
    let node = Node::start_in_memory(config, db, &MemNetwork::new())
        .await
        .unwrap();
    let mut rx = node.leadership();
    let l = *tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|l| l.announced))
        .await
        .expect("announced within the deadline")
        .unwrap();
    let token = l.token.unwrap();

    let seen = seen.lock().unwrap().clone();
    let request = seen.last().expect("the proxy was asked");
    assert!(
        request
            .lines()
            .any(|h| h.eq_ignore_ascii_case("authorization: Bearer s3cret-admin")),
        "{request}"
    );
    let body = request.rsplit("\r\n\r\n").next().unwrap();
    let advance: AdvanceRequest = serde_json::from_str(body).unwrap();
    assert_eq!(advance.token, token);
    let proof = advance.proof.expect("the announce carries the proof");
    assert_eq!(Some(proof.clone()), l.proof.map(|p| p.encode()));
    let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(&proof)
        .unwrap();
    UnparsedPublicKey::new(&ED25519, &public)
        .verify(&proof_message("orders", token), &signature)
        .expect("the announced proof verifies");
    node.stop().await.unwrap();
}
