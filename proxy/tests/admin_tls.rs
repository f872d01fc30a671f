//! TLS and mutual TLS on the admin listener (`[admin_tls]`), with a throwaway CA.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::path::Path;
use std::time::Duration;

use palisade_proxy::{AdminTlsConfig, ProxyConfig};
use reqwest::{Certificate, Client, Identity, StatusCode};

/// A CA (`ca.pem`), a server certificate for 127.0.0.1 (`server.pem`, `server.key`) and
/// a client certificate (`client.pem`, `client.key`) under `dir`.
fn issue(dir: &Path) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = params.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    for (name, san) in [("server", "127.0.0.1"), ("client", "operator")] {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![san.to_owned()]).unwrap();
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

fn client(dir: &Path, identity: bool) -> Client {
    let ca = Certificate::from_pem(&std::fs::read(dir.join("ca.pem")).unwrap()).unwrap();
    let mut builder = Client::builder()
        .use_rustls_tls()
        .add_root_certificate(ca)
        .timeout(Duration::from_secs(10));
    if identity {
        let mut pem = std::fs::read(dir.join("client.pem")).unwrap();
        pem.extend(std::fs::read(dir.join("client.key")).unwrap());
        builder = builder.identity(Identity::from_pem(&pem).unwrap());
    }
    builder.build().unwrap()
}

async fn start(dir: &Path, client_ca: bool) -> palisade_proxy::ProxyHandle {
    let config = ProxyConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.join("data"),
        admin_tls: Some(AdminTlsConfig {
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
            client_ca: client_ca.then(|| dir.join("ca.pem")),
        }),
        ..ProxyConfig::default()
    };
    palisade_proxy::start(config).await.unwrap()
}

/// Goal: with `client_ca`, the admin API serves a client holding a certificate from that
/// CA and refuses one without (in the handshake), and plaintext gets nothing; without
/// `client_ca` it is plain HTTPS.
/// Method: start proxies both ways; GET `/healthz` over HTTPS with and without a client
/// identity, and over plain HTTP.
#[tokio::test]
async fn admin_mutual_tls_requires_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    issue(dir.path());
    let proxy = start(dir.path(), true).await;
    let url = format!("https://{}/healthz", proxy.admin);
    let served = client(dir.path(), true).get(&url).send().await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    let refused = client(dir.path(), false).get(&url).send().await;
    assert!(
        refused.is_err(),
        "served without a client certificate: {refused:?}"
    );
    let plain = client(dir.path(), false)
        .get(format!("http://{}/healthz", proxy.admin))
        .send()
        .await;
    assert!(
        plain.as_ref().map_or(true, |r| !r.status().is_success()),
        "served over plaintext: {plain:?}"
    );
    proxy.shutdown();
    proxy.wait().await;

    let proxy = start(dir.path(), false).await;
    let url = format!("https://{}/healthz", proxy.admin);
    let served = client(dir.path(), false).get(&url).send().await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    proxy.shutdown();
    proxy.wait().await;
}

/// Goal: an unreadable admin certificate stops the start with an error naming the file.
/// Method: point `[admin_tls]` at missing files.
#[tokio::test]
async fn missing_admin_certificate_is_a_start_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = ProxyConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().join("data"),
        admin_tls: Some(AdminTlsConfig {
            cert: dir.path().join("nope.pem"),
            key: dir.path().join("nope.key"),
            client_ca: None,
        }),
        ..ProxyConfig::default()
    };
    let err = palisade_proxy::start(config)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("nope.pem"), "{err}");
}
