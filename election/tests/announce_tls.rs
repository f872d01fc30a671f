//! Announcements over https to a proxy whose admin listener requires client certificates
//! from the cluster CA: the node presents its own certificate, so the election fences the
//! proxy with no shared secret, and a caller without a certificate cannot.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::time::Duration;

mod common;
use common::issue;

use palisade_client::{ClientTls, ProxyAdmin, Scope};
use palisade_election::{Node, NodeConfig, NodeTls};
use palisade_proxy::{AdminTlsConfig, ProxyConfig};

/// Longest wait for the single node to lead and announce.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

/// Goal: a node with TLS announces its token over https to an admin listener that
/// requires client certificates, and the fence moves to the term; a caller without a
/// client certificate is refused by the same listener.
/// Method: an in-process proxy with `admin_tls.client_ca`, a one-node cluster with
/// `tls` and an `https://` announce URL; wait for `announced`, read the fence with the
/// node's identity, then try without one.
#[tokio::test]
async fn announce_over_https_presents_the_node_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    issue(&pki, &["node-1", "proxy"]);
    let proxy = palisade_proxy::start(ProxyConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().join("proxy"),
        admin_tls: Some(AdminTlsConfig {
            cert: pki.join("proxy.pem"),
            key: pki.join("proxy.key"),
            client_ca: Some(pki.join("ca.pem")),
        }),
        ..ProxyConfig::default()
    })
    .await
    .unwrap();
    let admin_url = format!("https://127.0.0.1:{}", proxy.admin.port());
    let peer = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let node = Node::start(NodeConfig {
        id: 1,
        peers: [(1, peer.to_string())].into_iter().collect(),
        data_dir: dir.path().join("node1"),
        tick_ms: 50,
        announce: vec![admin_url.clone()],
        tls: Some(NodeTls {
            cert: pki.join("node-1.pem"),
            key: pki.join("node-1.key"),
            ca: pki.join("ca.pem"),
        }),
        ..NodeConfig::default()
    })
    .await
    .unwrap();
    let mut leadership = node.leadership();
    let announced = tokio::time::timeout(
        SETTLE_TIMEOUT,
        leadership.wait_for(|l| l.token.is_some() && l.announced),
    )
    .await
    .expect("the token was announced within the deadline")
    .unwrap()
    .token
    .unwrap();

    let scope = Scope::default_scope();
    let as_node = ClientTls::new()
        .trust_pem_file(pki.join("ca.pem"))
        .unwrap()
        .identity_pem_files(pki.join("node-1.pem"), pki.join("node-1.key"))
        .unwrap();
    let fence = ProxyAdmin::with_tls(&admin_url, &as_node)
        .unwrap()
        .fence(&scope)
        .await
        .unwrap();
    assert_eq!(fence.token, announced);

    let anonymous = ClientTls::new().trust_pem_file(pki.join("ca.pem")).unwrap();
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
