//! TLS and mutual TLS on the admin listener (`[admin_tls]`), with a throwaway CA.

use std::time::Duration;

use palisade_cluster::Pki;
use palisade_proxy::{AdminTlsConfig, ProxyConfig};
use reqwest::{Certificate, Client, Identity, StatusCode};

use crate::harness::{Harness, Setup};

/// An HTTPS client trusting `pki`'s CA, presenting its `client` certificate if
/// `identity`.
fn client(pki: &Pki, identity: bool) -> Client {
    let ca = Certificate::from_pem(&std::fs::read(pki.ca()).unwrap()).unwrap();
    let mut builder = Client::builder()
        .use_rustls_tls()
        .add_root_certificate(ca)
        .timeout(Duration::from_secs(10));
    if identity {
        let mut pem = std::fs::read(pki.cert("client")).unwrap();
        pem.extend(std::fs::read(pki.key("client")).unwrap());
        builder = builder.identity(Identity::from_pem(&pem).unwrap());
    }
    builder.build().unwrap()
}

/// A proxy whose admin listener presents `server`, requiring client certificates of the
/// CA if `client_ca`.
async fn start(pki: &Pki, client_ca: bool) -> Harness {
    Harness::start(Setup {
        admin_tls: Some(AdminTlsConfig {
            cert: pki.cert("server"),
            key: pki.key("server"),
            client_ca: client_ca.then(|| pki.ca()),
        }),
        ..Setup::default()
    })
    .await
}

/// Goal: with `client_ca`, the admin API serves a client holding a certificate from that
/// CA and refuses one without (in the handshake), and plaintext gets nothing; without
/// `client_ca` it is plain HTTPS.
/// Method: start proxies both ways; GET `/healthz` over HTTPS with and without a client
/// identity, and over plain HTTP.
#[tokio::test]
async fn admin_mutual_tls_requires_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::issue(dir.path(), &["server", "client"]).unwrap();
    let h = start(&pki, true).await;
    let url = format!("https://{}/healthz", h.proxy.admin);
    let served = client(&pki, true).get(&url).send().await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    let refused = client(&pki, false).get(&url).send().await;
    assert!(
        refused.is_err(),
        "served without a client certificate: {refused:?}"
    );
    let plain = client(&pki, false).get(h.admin("/healthz")).send().await;
    assert!(
        plain.as_ref().map_or(true, |r| !r.status().is_success()),
        "served over plaintext: {plain:?}"
    );
    h.stop().await;

    let h = start(&pki, false).await;
    let url = format!("https://{}/healthz", h.proxy.admin);
    let served = client(&pki, false).get(&url).send().await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    h.stop().await;
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
