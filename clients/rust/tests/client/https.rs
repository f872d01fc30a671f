//! The Rust client speaks https: a proxy started in-process with a TLS listener whose
//! certificate (for 127.0.0.1 and localhost) is issued by a throwaway CA, and a
//! `FencedClient` that trusts that CA, or does not.

use std::path::Path;
use std::sync::Arc;

use palisade_client::{ClientError, ClientTls, FencedClient, StaticToken, StatusCode};
use palisade_cluster::Pki;
use palisade_proxy::{ProxyConfig, ProxyHandle, TlsConfig};

/// A proxy with its embedded store, listening with TLS on a free loopback port with a
/// `server` certificate (for 127.0.0.1 and localhost) of a CA issued in `dir`.
async fn tls_proxy(dir: &Path) -> ProxyHandle {
    let pki = Pki::issue(dir, &["server"]).unwrap();
    let config = ProxyConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.join("data"),
        tls: Some(TlsConfig {
            cert: pki.cert("server"),
            key: pki.key("server"),
        }),
        ..ProxyConfig::default()
    };
    palisade_proxy::start(config).await.unwrap()
}

fn client(url: &str, tls: ClientTls) -> FencedClient {
    FencedClient::builder(url, Arc::new(StaticToken::new(3)))
        .tls(tls)
        .retries(0)
        .build()
        .unwrap()
}

/// Goal: with the proxy's CA trusted, a fenced PUT and a GET succeed over https, and the
/// store records the token the PUT carried.
/// Method: in-process proxy with a TLS listener; PUT with token 3, GET it back, read
/// `Fencing-Token` of the stored object.
#[tokio::test]
async fn fenced_put_and_get_over_https_with_the_ca_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = tls_proxy(dir.path()).await;
    let tls = ClientTls::new()
        .trust_pem_file(dir.path().join("ca.pem"))
        .unwrap();
    for host in ["127.0.0.1", "localhost"] {
        let url = format!("https://{host}:{}", proxy.listen.port());
        let client = client(&url, tls.clone());
        let key = format!("charges/{host}");
        let put = client.put(&key, "4200 cents").await.unwrap();
        assert!(put.status.is_success(), "{}", put.status);
        assert_eq!(put.sent_token, Some(3));
        let got = client.get(&key).await.unwrap();
        assert_eq!(got.text(), "4200 cents");
        assert_eq!(
            got.stored_token(),
            Some(3),
            "the store records the writer's token"
        );
    }
    proxy.shutdown();
}

/// Goal: without the proxy's CA, the client refuses the server's certificate with a TLS
/// error that says so, and nothing is written.
/// Method: PUT through a client with the system's roots only; then read the key through a
/// client that trusts the CA and expect 404.
#[tokio::test]
async fn untrusted_certificate_is_a_clear_tls_error() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = tls_proxy(dir.path()).await;
    let url = format!("https://127.0.0.1:{}", proxy.listen.port());

    let err = client(&url, ClientTls::new())
        .put("charges/untrusted", "x")
        .await
        .unwrap_err();
    let ClientError::Tls { reason, .. } = &err else {
        panic!("expected a TLS error, got {err:?}");
    };
    assert!(
        reason.contains("certificate"),
        "the reason names the certificate problem: {reason}"
    );
    assert!(
        err.to_string()
            .starts_with("TLS error with https://127.0.0.1:"),
        "{err}"
    );

    let trusted = client(
        &url,
        ClientTls::new()
            .trust_pem_file(dir.path().join("ca.pem"))
            .unwrap(),
    );
    let missing = trusted.get("charges/untrusted").await.unwrap_err();
    assert_eq!(missing.status(), Some(StatusCode::NOT_FOUND), "{missing}");
    proxy.shutdown();
}

/// Goal: a client certificate and key in PEM files load as the client's TLS identity,
/// and a file that holds no key is refused when the settings are made, naming TLS.
/// Method: issued certificate and key files; then the certificate given as its own key.
#[test]
fn client_identity_loads_from_pem_files() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::issue(dir.path(), &["client"]).unwrap();
    let cert = pki.cert("client");
    let key = pki.key("client");
    let tls = ClientTls::new().identity_pem_files(&cert, &key).unwrap();
    FencedClient::builder("https://127.0.0.1:1", Arc::new(StaticToken::new(1)))
        .tls(tls)
        .build()
        .unwrap();
    let err = ClientTls::new()
        .identity_pem_files(&cert, &cert)
        .unwrap_err();
    assert!(matches!(err, ClientError::Tls { .. }), "{err}");
}
