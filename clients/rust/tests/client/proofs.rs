//! The Rust client against a proxy that checks token proofs and guards its admin API
//! with a bearer token (an in-process proxy with `token_pub` and `admin_token_file`):
//! the client attaches the proof its source has, a proxy refuses a token without a valid
//! one (401) before it can move the fence, and the typed admin client's bearer, advance
//! with a proof, and reset do what the proxy asks of them.

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use palisade_client::{ClientError, FencedClient, ProxyAdmin, StaticToken, StatusCode};
use palisade_protocol::proof::{encode_proof, proof_message};
use palisade_proxy::{ProxyConfig, ProxyHandle};
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair as _};

/// The admin bearer token the proxy is started with.
const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// The cluster key: signs proofs as a node does.
struct Key(Ed25519KeyPair);

impl Key {
    fn generate() -> Self {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        Self(Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap())
    }

    fn prove(&self, scope: &str, token: u64) -> String {
        encode_proof(self.0.sign(&proof_message(scope, token)).as_ref())
    }

    /// Writes `token.pub` (PEM SPKI) into `dir`.
    fn write_public(&self, dir: &Path) -> std::path::PathBuf {
        let mut spki = vec![
            0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
        ];
        spki.extend_from_slice(self.0.public_key().as_ref());
        let path = dir.join("token.pub");
        std::fs::write(
            &path,
            format!(
                "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
                STANDARD.encode(spki)
            ),
        )
        .unwrap();
        path
    }
}

/// A proxy (embedded store) that checks proofs with `key` and requires the admin token.
async fn proxy(dir: &Path, key: &Key) -> ProxyHandle {
    let admin_token = dir.join("admin.token");
    std::fs::write(&admin_token, format!("{ADMIN_TOKEN}\n")).unwrap();
    std::fs::set_permissions(
        &admin_token,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let config = ProxyConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.join("data"),
        token_pub: vec![key.write_public(dir)],
        admin_token_file: Some(admin_token),
        // The tests name their scope (`jobs`) with Fencing-Scope.
        client_scopes: true,
        ..ProxyConfig::default()
    };
    palisade_proxy::start(config).await.unwrap()
}

fn client(proxy: &ProxyHandle, source: StaticToken) -> FencedClient {
    FencedClient::builder(&format!("http://{}", proxy.listen), Arc::new(source))
        .scope("jobs")
        .retries(0)
        .build()
        .unwrap()
}

fn admin(proxy: &ProxyHandle) -> ProxyAdmin {
    ProxyAdmin::new(&format!("http://{}", proxy.admin)).unwrap()
}

#[track_caller]
fn assert_status(result: Result<impl std::fmt::Debug, ClientError>, status: StatusCode) {
    match result {
        Err(e) => assert_eq!(e.status(), Some(status), "{e}"),
        Ok(v) => panic!("expected {status}, got {v:?}"),
    }
}

/// Goal: a write whose source has the token's proof is admitted; without a proof, with
/// another scope's, or with a lower token's, it is refused with 401 and the fence stays
/// where it was; a proof-carrying token below the fence is refused with 409 (`Fenced`).
/// Method: in-process proxy with the public key; static tokens with and without proofs.
#[tokio::test]
async fn the_client_attaches_the_proof_its_source_has() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::generate();
    let proxy = proxy(dir.path(), &key).await;
    let admin = admin(&proxy).with_bearer(ADMIN_TOKEN);

    let proved = client(&proxy, StaticToken::with_proof(5, key.prove("jobs", 5)));
    let put = proved.put("k", "v5").await.unwrap();
    assert_eq!(put.sent_token, Some(5));
    assert_eq!(admin.fence("jobs").await.unwrap().token, 5);

    for (what, source) in [
        ("no proof", StaticToken::new(6)),
        (
            "another scope's proof",
            StaticToken::with_proof(6, key.prove("other", 6)),
        ),
        (
            "a lower token's proof",
            StaticToken::with_proof(6, key.prove("jobs", 5)),
        ),
        (
            "a stranger's proof",
            StaticToken::with_proof(6, Key::generate().prove("jobs", 6)),
        ),
        ("not base64", StaticToken::with_proof(6, "!!!")),
    ] {
        let result = client(&proxy, source).put("k", "forged").await;
        assert!(
            matches!(&result, Err(e) if e.status() == Some(StatusCode::UNAUTHORIZED)),
            "{what}: {result:?}"
        );
        assert_eq!(admin.fence("jobs").await.unwrap().token, 5, "{what}");
    }

    let stale = client(&proxy, StaticToken::with_proof(3, key.prove("jobs", 3)));
    let err = stale.put("k", "v3").await.unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Fenced {
                presented: 3,
                current: 5,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(proved.get("k").await.unwrap().text(), "v5");
    proxy.shutdown();
}

/// Goal: the typed admin client: without the bearer token the proxy refuses an advance
/// and a reset (401); an advance with the token's proof needs no bearer; the reset with
/// the bearer lowers the fence and reports both values; a blank or oversized reason is
/// refused before anything is sent.
/// Method: in-process proxy with an admin token; every call with and without it.
#[tokio::test]
async fn admin_bearer_advance_with_proof_and_reset() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::generate();
    let proxy = proxy(dir.path(), &key).await;
    let anonymous = admin(&proxy);
    let operator = admin(&proxy).with_bearer(ADMIN_TOKEN);
    let wrong = admin(&proxy).with_bearer("not-the-admin-token-at-all");

    assert_status(anonymous.advance("jobs", 9).await, StatusCode::UNAUTHORIZED);
    assert_status(wrong.fences().await, StatusCode::UNAUTHORIZED);
    assert_status(
        anonymous
            .advance_with_proof("jobs", 9, Some(&key.prove("jobs", 8)))
            .await,
        StatusCode::UNAUTHORIZED,
    );
    let advanced = anonymous
        .advance_with_proof("jobs", 9, Some(&key.prove("jobs", 9)))
        .await
        .unwrap();
    assert!(advanced.advanced);
    assert_eq!(operator.fence("jobs").await.unwrap().token, 9);

    assert_status(
        anonymous.reset("jobs", 2, "recovery").await,
        StatusCode::UNAUTHORIZED,
    );
    assert_eq!(operator.fence("jobs").await.unwrap().token, 9);
    let reset = operator
        .reset("jobs", 2, "forged raise on ticket 42")
        .await
        .unwrap();
    assert_eq!((reset.previous, reset.token), (9, 2));
    assert_eq!(operator.fence("jobs").await.unwrap().token, 2);

    for reason in ["", "   ", &"x".repeat(513)] {
        let err = operator.reset("jobs", 1, reason).await.unwrap_err();
        assert!(matches!(err, ClientError::InvalidRequest(_)), "{err}");
    }
    assert_eq!(operator.fence("jobs").await.unwrap().token, 2);
    proxy.shutdown();
}
