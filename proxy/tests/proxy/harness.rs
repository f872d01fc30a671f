//! What the topics share: a proxy started in-process on port 0 with a temporary data
//! directory, set up as a test asks ([`Setup`]), and a client calling it as an operator,
//! an election node or an application would; token signing keys; problem+json checks.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use palisade_protocol::admin::reset_path;
use palisade_protocol::headers::{FENCING_TOKEN, FENCING_TOKEN_PROOF, JSON, PROBLEM_JSON};
use palisade_protocol::proof::{encode_proof, proof_message};
use palisade_protocol::{AdvanceRequest, FenceList, FenceView, Problem, Scope};
use palisade_proxy::{AdminTlsConfig, ProxyConfig, ProxyHandle};
use reqwest::{Client, RequestBuilder, Response, StatusCode, header};
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair as _};

/// The admin token of every proxy set up with one.
pub const ADMIN_TOKEN: &str = "s3cret-admin-token-0123456789";
/// The DER prefix of an Ed25519 `SubjectPublicKeyInfo`, as `palisade keys generate`
/// writes it.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];
/// Longest a client call may take.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest the proxy may take to stop: its drain timeout and some.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// A token signing key, as the cluster's.
pub struct Key(Ed25519KeyPair);

impl Key {
    pub fn generate() -> Self {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        Self(Ed25519KeyPair::from_pkcs8_maybe_unchecked(pkcs8.as_ref()).unwrap())
    }

    /// The proof of `token` in `scope`, as a node makes it.
    pub fn proof(&self, scope: &str, token: u64) -> String {
        encode_proof(self.0.sign(&proof_message(scope, token)).as_ref())
    }

    /// Writes the public key as `token.pub` would be, and returns its path.
    fn write_pub(&self, dir: &tempfile::TempDir, name: &str) -> PathBuf {
        let der = [SPKI_PREFIX.as_slice(), self.0.public_key().as_ref()].concat();
        let path = dir.path().join(name);
        let pem = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            STANDARD.encode(der)
        );
        std::fs::write(&path, pem).unwrap();
        path
    }
}

/// How a test proxy is set up; the default is an embedded store and no credentials.
#[derive(Default)]
pub struct Setup<'a> {
    /// The keys whose proofs it admits.
    pub keys: Vec<&'a Key>,
    /// Whether the admin API needs [`ADMIN_TOKEN`].
    pub admin_token: bool,
    pub metrics_public: bool,
    pub upstream: Option<String>,
    pub upstream_ca: Option<PathBuf>,
    pub admin_tls: Option<AdminTlsConfig>,
    pub barrier_timeout_ms: Option<u64>,
}

impl<'a> Setup<'a> {
    /// Secured as a cluster's proxy is: proofs of `key` and the admin token.
    pub fn secured(key: &'a Key) -> Self {
        Self {
            keys: vec![key],
            admin_token: true,
            ..Self::default()
        }
    }
}

/// A proxy on ephemeral ports, its data directory, and a client.
pub struct Harness {
    pub proxy: ProxyHandle,
    pub client: Client,
    /// The bearer token the harness's own reads present, if the proxy wants one.
    bearer: Option<&'static str>,
    _dir: tempfile::TempDir,
}

impl Harness {
    pub async fn start(setup: Setup<'_>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let token_pub = setup
            .keys
            .iter()
            .enumerate()
            .map(|(i, key)| key.write_pub(&dir, &format!("token{i}.pub")))
            .collect();
        let admin_token_file = setup.admin_token.then(|| {
            let path = dir.path().join("admin.token");
            std::fs::write(&path, format!("{ADMIN_TOKEN}\n")).unwrap();
            path
        });
        let mut config = ProxyConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin_listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.path().join("data"),
            upstream: setup.upstream,
            upstream_ca: setup.upstream_ca,
            admin_tls: setup.admin_tls,
            token_pub,
            admin_token_file,
            admin_metrics_public: setup.metrics_public,
            ..ProxyConfig::default()
        };
        if let Some(ms) = setup.barrier_timeout_ms {
            config.limits.barrier_timeout_ms = ms;
        }
        let proxy = palisade_proxy::start(config).await.unwrap();
        let client = Client::builder().timeout(CLIENT_TIMEOUT).build().unwrap();
        Self {
            proxy,
            client,
            bearer: setup.admin_token.then_some(ADMIN_TOKEN),
            _dir: dir,
        }
    }

    pub fn admin(&self, path: &str) -> String {
        format!("http://{}{path}", self.proxy.admin)
    }

    pub fn data(&self, path: &str) -> String {
        format!("http://{}{path}", self.proxy.listen)
    }

    /// A PUT of `key` with `token` and, if given, `proof`.
    pub fn put(&self, key: &str, token: u64, proof: Option<&str>) -> RequestBuilder {
        let request = self
            .client
            .put(self.data(key))
            .header(FENCING_TOKEN, token.to_string())
            .body("payload");
        match proof {
            Some(proof) => request.header(FENCING_TOKEN_PROOF, proof),
            None => request,
        }
    }

    /// An advance of `scope`'s fence to `token`, with `proof` if given.
    pub fn advance(&self, scope: &str, token: u64, proof: Option<String>) -> RequestBuilder {
        self.client
            .post(self.admin(&format!("/v1/fences/{scope}")))
            .json(&AdvanceRequest { token, proof })
    }

    /// A reset of `scope`'s fence with `body` as JSON text (not necessarily valid).
    pub fn reset(&self, scope: &str, body: &str) -> RequestBuilder {
        self.client
            .post(self.admin(&reset_path(&Scope::new(scope).unwrap())))
            .header(header::CONTENT_TYPE, JSON)
            .body(body.to_owned())
    }

    /// A GET of the admin `path`, with the admin token if the proxy wants one.
    fn admin_get(&self, path: &str) -> RequestBuilder {
        let request = self.client.get(self.admin(path));
        match self.bearer {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    pub async fn fence(&self, scope: &str) -> u64 {
        let response = self
            .admin_get(&format!("/v1/fences/{scope}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.json::<FenceView>().await.unwrap().token
    }

    pub async fn fences(&self) -> FenceList {
        let response = self.admin_get("/v1/fences").send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.json().await.unwrap()
    }

    pub async fn metrics(&self) -> String {
        let response = self.admin_get("/metrics").send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.unwrap()
    }

    pub async fn stop(self) {
        self.proxy.shutdown();
        tokio::time::timeout(STOP_TIMEOUT, self.proxy.wait())
            .await
            .expect("the proxy stops within its drain timeout");
    }
}

/// Asserts a problem+json answer of `status` and `kind`, and returns the problem.
pub async fn problem(response: Response, status: StatusCode, kind: &str) -> Problem {
    let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
    let got = response.status();
    let text = response.text().await.unwrap();
    assert_eq!(got, status, "{text}");
    assert_eq!(
        content_type.as_ref().and_then(|v| v.to_str().ok()),
        Some(PROBLEM_JSON),
        "{text}"
    );
    let problem: Problem = serde_json::from_str(&text).unwrap();
    assert_eq!(problem.kind(), kind, "{text}");
    assert_eq!(problem.status, status.as_u16(), "{text}");
    problem
}

/// The lines of Prometheus text `metrics` of the series `name` with `reason="REASON"`.
pub fn metric_lines<'a>(metrics: &'a str, name: &str, reason: &str) -> Vec<&'a str> {
    let label = format!("reason=\"{reason}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(&label))
        .collect()
}
