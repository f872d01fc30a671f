//! Fencing on election: the established leader announces its token to the proxies of its
//! scope. Fake proxies (plain sockets answering fixed statuses) on a one-node cluster
//! over the in-memory network; then the proof and bearer token the announce carries, and
//! an in-process proxy over https that requires the node's certificate. Real time: the
//! announcer does real HTTP.

use std::time::Duration;

use palisade_client::{ProxyAdmin, Scope};
use palisade_cluster::{Pki, wait};
use palisade_election::{Node, NodeConfig};
use palisade_protocol::AdvanceRequest;
use palisade_proxy::{AdminTlsConfig, ProxyConfig};
use tokio::net::TcpListener;

use crate::support::{
    self, SCOPE, advance_of, fake_proxy, leadership, one_node, serve_fake_proxy, token_key,
    verifies_encoded,
};

/// Goal: the established leader posts its token to every proxy's fence of its scope and
/// reports `announced` once all accepted. Method: two fake proxies answering 200.
#[tokio::test]
async fn token_is_announced_to_every_proxy() {
    let (a, seen_a) = fake_proxy(200).await;
    let (b, seen_b) = fake_proxy(200).await;
    let node = one_node(vec![a, format!("{b}/")]).await;
    let l = leadership(&node, "announced", |l| l.announced).await;
    let token = l.token.expect("announced implies a token");
    for seen in [seen_a, seen_b] {
        let seen = seen.lock().unwrap().clone();
        let advanced_to_token = |r: &String| {
            r.starts_with(&format!("POST /v1/fences/{SCOPE} HTTP/1.1\r\n"))
                && advance_of(r) == Some(AdvanceRequest { token, proof: None })
        };
        assert!(seen.iter().any(advanced_to_token), "{seen:?}");
    }
    node.stop().await.unwrap();
}

/// Goal: a proxy holding a higher fence (409) leaves the token not announced, while the
/// token itself stays usable by the application's choice. Method: one proxy answers 200,
/// the other 409; wait for both to be asked, then check `announced` stays false.
#[tokio::test]
async fn conflict_at_one_proxy_leaves_token_not_announced() {
    let (ok, _) = fake_proxy(200).await;
    let (conflict, seen) = fake_proxy(409).await;
    let node = one_node(vec![ok, conflict]).await;
    let l = leadership(&node, "a token", |l| l.token.is_some()).await;
    assert!(!l.announced);
    wait::poll(Duration::from_secs(2), || {
        std::future::ready((!seen.lock().unwrap().is_empty()).then_some(()))
    })
    .await
    .expect("timed out waiting for the 409 proxy to be asked");
    assert_eq!(seen.lock().unwrap().len(), 1, "409 must not be retried");
    // Nothing will change: sleeping here shows that it does not.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!node.leadership().borrow().announced);
    assert_eq!(seen.lock().unwrap().len(), 1, "409 must not be retried");
    node.stop().await.unwrap();
}

/// Goal: an unreachable proxy is retried until it comes up. Method: announce to a port
/// with nothing listening, then start a fake proxy on it.
#[tokio::test]
async fn unreachable_proxy_is_retried_until_it_accepts() {
    let port = palisade_cluster::free_port().unwrap();
    let node = one_node(vec![format!("http://127.0.0.1:{port}")]).await;
    let l = leadership(&node, "a token", |l| l.token.is_some()).await;
    assert!(!l.announced);
    // Nothing listens yet: sleeping here shows that the token is not announced.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!node.leadership().borrow().announced);
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    serve_fake_proxy(listener, 200);
    leadership(&node, "announced after the proxy came up", |l| l.announced).await;
    node.stop().await.unwrap();
}

/// Goal: with a key and a bearer file, the announce's body carries the token's proof
/// (verifiable with the public key) and the request carries `Authorization: Bearer`.
/// Method: a one-node cluster announcing to a fake proxy; wait for `announced`; parse the
/// recorded request.
#[tokio::test]
async fn announce_carries_the_proof_and_the_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = token_key(dir.path());
    let bearer = dir.path().join("admin.token");
    std::fs::write(&bearer, "s3cret-admin\n").unwrap();

    let (url, seen) = fake_proxy(200).await;
    let config = NodeConfig {
        scope: SCOPE.into(),
        announce: vec![url],
        tick_ms: 10,
        token_key: Some(key),
        announce_token_file: Some(bearer),
        ..support::config(1, &[1])
    };
    let node = support::start_in_memory(config, &palisade_election::MemNetwork::new()).await;
    let l = leadership(&node, "announced", |l| l.announced).await;
    let token = l.token.unwrap();

    let seen = seen.lock().unwrap().clone();
    let request = seen.last().expect("the proxy was asked");
    assert!(
        request
            .lines()
            .any(|h| h.eq_ignore_ascii_case("authorization: Bearer s3cret-admin")),
        "{request}"
    );
    let advance = advance_of(request).unwrap();
    assert_eq!(advance.token, token);
    let proof = advance.proof.expect("the announce carries the proof");
    assert_eq!(Some(proof.clone()), l.proof.map(|p| p.encode()));
    assert!(
        verifies_encoded(&public, token, &proof),
        "the announced proof verifies"
    );
    node.stop().await.unwrap();
}

/// Goal: a node with TLS announces its token over https to an admin listener that
/// requires client certificates, and the fence moves to the term; a caller without a
/// client certificate is refused by the same listener.
/// Method: an in-process proxy with `admin_tls.client_ca`, a one-node cluster with
/// `tls` and an `https://` announce URL; wait for `announced`, read the fence with the
/// node's identity, then try without one.
#[tokio::test]
async fn announce_over_https_presents_the_node_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::issue(&dir.path().join("pki"), &["node-1", "proxy"]).unwrap();
    let proxy = palisade_proxy::start(ProxyConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().join("proxy"),
        admin_tls: Some(AdminTlsConfig {
            cert: pki.cert("proxy"),
            key: pki.key("proxy"),
            client_ca: Some(pki.ca()),
        }),
        ..ProxyConfig::default()
    })
    .await
    .unwrap();
    let admin_url = format!("https://127.0.0.1:{}", proxy.admin.port());
    let node = Node::start(NodeConfig {
        id: 1,
        peers: support::loopback_peers(1),
        data_dir: dir.path().join("node1"),
        tick_ms: 50,
        announce: vec![admin_url.clone()],
        tls: Some(support::node_tls(&pki, "node-1")),
        ..NodeConfig::default()
    })
    .await
    .unwrap();
    let announced = leadership(&node, "the token announced", |l| {
        l.token.is_some() && l.announced
    })
    .await
    .token
    .unwrap();

    let scope = Scope::default_scope();
    let as_node = pki.client_tls(Some("node-1")).unwrap();
    let fence = ProxyAdmin::with_tls(&admin_url, &as_node)
        .unwrap()
        .fence(&scope)
        .await
        .unwrap();
    assert_eq!(fence.token, announced);

    let anonymous = pki.client_tls(None).unwrap();
    let refused = ProxyAdmin::with_tls(&admin_url, &anonymous)
        .unwrap()
        .fence(&scope)
        .await;
    assert!(
        refused.is_err(),
        "a caller without a certificate got {refused:?}"
    );

    node.shutdown().await.unwrap();
    proxy.shutdown();
    proxy.wait().await;
}
