//! The authenticated admin API, end to end: a proxy started with `--admin-token-file`
//! answers only `Authorization: Bearer <token>` (or, for an advance, a valid token proof),
//! and its audited reset moves a fence anywhere, logged and counted, from the API and
//! from `palisade fence --reset`.

use std::process::Command;

use http::header::AUTHORIZATION;
use http::{Method, StatusCode};
use palisade_protocol::DEFAULT_SCOPE;
use palisade_protocol::admin::RESET_REASON_BYTES_MAX;
use palisade_protocol::process::events;
use palisade_tests::client::{Answer, send};
use palisade_tests::fixtures::proxy_with_upstream_args;
use palisade_tests::process::ProxyProcess;
use palisade_tests::trust::{Signer, TokenKeys, admin_token_file, log_events};
use palisade_tests::upstream::RecordingUpstream;

/// The reset counter the proxy exports.
const RESETS_METRIC: &str = "palisade_proxy_fence_resets_total";

/// A proxy with `--token-pub` and `--admin-token-file` in front of a recording upstream,
/// logging JSON; its bearer token and the signing key.
struct Secured {
    proxy: ProxyProcess,
    bearer: String,
    token_file: std::path::PathBuf,
    signer: Signer,
    _upstream: RecordingUpstream,
    _dir: tempfile::TempDir,
}

async fn secured() -> Secured {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let keys = TokenKeys::generate(&dir.path().join("keys"));
    let (token_file, bearer) = admin_token_file(dir.path());
    let (upstream, proxy) = proxy_with_upstream_args(
        &dir.path().join("proxy"),
        &[
            "--token-pub",
            keys.public_arg(),
            "--admin-token-file",
            token_file.to_str().unwrap(),
            "--log-format",
            "json",
        ],
    )
    .await;
    Secured {
        proxy,
        bearer,
        token_file,
        signer: keys.signer(),
        _upstream: upstream,
        _dir: dir,
    }
}

impl Secured {
    /// `Bearer <token>`.
    fn auth(&self) -> String {
        format!("Bearer {}", self.bearer)
    }

    /// An admin request with `auth` as the Authorization header (none when `None`).
    async fn admin(&self, method: Method, path: &str, auth: Option<&str>, body: &str) -> Answer {
        let mut headers = vec![("content-type", "application/json")];
        if let Some(auth) = auth {
            headers.push((AUTHORIZATION.as_str(), auth));
        }
        send(method, &self.proxy.admin_url(path), &headers, body).await
    }

    /// The fence of `scope`, read with the bearer token.
    async fn fence(&self, scope: &str) -> u64 {
        let auth = self.auth();
        let answer = self
            .admin(Method::GET, &format!("/v1/fences/{scope}"), Some(&auth), "")
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        answer.json()["token"].as_u64().unwrap()
    }
}

/// Asserts a 401 problem whose detail says something.
fn assert_401(answer: &Answer, case: &str) {
    assert_eq!(
        answer.status,
        StatusCode::UNAUTHORIZED,
        "{case}: {answer:?}"
    );
    let problem = answer.problem().expect("a problem+json body");
    assert!(
        !problem.detail.is_empty(),
        "{case}: the 401 names what was missing"
    );
}

/// Goal: with `--admin-token-file`, a fence advance without a proof or a bearer token is
/// refused 401 (no header, a wrong token, another scheme, a stranger's proof), and so is
/// every other admin call but `/healthz`; the bearer admits it; a valid proof alone
/// admits it too (the announce path). Method: raw admin requests, the fence read back with
/// the bearer after each.
#[tokio::test]
async fn admin_refuses_unproven_advances_without_the_bearer() {
    let s = secured().await;
    let path = format!("/v1/fences/{DEFAULT_SCOPE}");
    let max = format!("{{\"token\":{}}}", u64::MAX);
    let wrong = format!("Bearer {}x", s.bearer);
    let basic = format!("Basic {}", s.bearer);
    let lower = format!("bearer {}", s.bearer.to_lowercase());
    let stranger = format!(
        "{{\"token\":10,\"proof\":\"{}\"}}",
        Signer::stranger().prove(DEFAULT_SCOPE, 10)
    );
    let other_scope = format!(
        "{{\"token\":10,\"proof\":\"{}\"}}",
        s.signer.prove("other", 10)
    );
    let cases: [(&str, Option<&str>, &str); 7] = [
        ("no credential", None, "{\"token\":10}"),
        ("the maximum, no credential", None, &max),
        ("a wrong bearer token", Some(&wrong), "{\"token\":10}"),
        ("another scheme", Some(&basic), "{\"token\":10}"),
        ("an empty bearer", Some("Bearer "), "{\"token\":10}"),
        ("a stranger's proof", None, &stranger),
        ("another scope's proof", None, &other_scope),
    ];
    for (case, auth, body) in cases {
        assert_401(&s.admin(Method::POST, &path, auth, body).await, case);
    }
    if s.bearer.to_lowercase() != s.bearer {
        assert_401(
            &s.admin(Method::POST, &path, Some(&lower), "{\"token\":10}")
                .await,
            "a bearer token in the wrong case",
        );
    }
    assert_401(&s.admin(Method::GET, "/v1/fences", None, "").await, "list");
    assert_401(&s.admin(Method::GET, &path, None, "").await, "read");
    assert_eq!(
        s.admin(Method::GET, "/healthz", None, "").await.status,
        StatusCode::OK,
        "/healthz stays open"
    );
    assert_eq!(s.fence(DEFAULT_SCOPE).await, 0, "no refused call moved it");
    assert_eq!(s.fence("other").await, 0);

    let auth = s.auth();
    let ok = s
        .admin(Method::POST, &path, Some(&auth), "{\"token\":10}")
        .await;
    assert_eq!(ok.status, StatusCode::OK, "with the bearer: {ok:?}");
    assert_eq!(s.fence(DEFAULT_SCOPE).await, 10);
    let proven = format!(
        "{{\"token\":12,\"proof\":\"{}\"}}",
        s.signer.prove(DEFAULT_SCOPE, 12)
    );
    let ok = s.admin(Method::POST, &path, None, &proven).await;
    assert_eq!(ok.status, StatusCode::OK, "a valid proof alone: {ok:?}");
    assert_eq!(s.fence(DEFAULT_SCOPE).await, 12);
}

/// The sum of `name`'s samples in a Prometheus text.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Goal: the reset needs the bearer, moves the fence down, is logged with the event
/// `fence-reset` and its reason, counted in `palisade_proxy_fence_resets_total`, refuses
/// hostile bodies, and lets the proven lower token in again. Method: forge the fence to
/// the maximum with the bearer, reset it without and with the bearer and with bad bodies,
/// read the fence, the JSON log and `/metrics`; write with a proven token.
#[tokio::test]
async fn reset_needs_the_bearer_and_is_logged_and_counted() {
    let s = secured().await;
    let auth = s.auth();
    let path = format!("/v1/fences/{DEFAULT_SCOPE}");
    let reset = format!("{path}/reset");
    let max = format!("{{\"token\":{}}}", u64::MAX);
    let raised = s.admin(Method::POST, &path, Some(&auth), &max).await;
    assert_eq!(raised.status, StatusCode::OK, "{raised:?}");

    let body = "{\"token\":3,\"reason\":\"forged raise in test\"}";
    assert_401(
        &s.admin(Method::POST, &reset, None, body).await,
        "reset without bearer",
    );
    let proven = format!(
        "{{\"token\":3,\"reason\":\"r\",\"proof\":\"{}\"}}",
        s.signer.prove(DEFAULT_SCOPE, 3)
    );
    let with_proof = s.admin(Method::POST, &reset, None, &proven).await;
    assert!(
        with_proof.status.is_client_error(),
        "a proof is no credential for a reset: {with_proof:?}"
    );
    let long = format!(
        "{{\"token\":3,\"reason\":\"{}\"}}",
        "r".repeat(RESET_REASON_BYTES_MAX + 1)
    );
    let hostile = [
        (
            "an empty reason",
            "{\"token\":3,\"reason\":\"\"}".to_owned(),
        ),
        ("no reason", "{\"token\":3}".to_owned()),
        ("a reason too long", long),
        (
            "a negative token",
            "{\"token\":-1,\"reason\":\"r\"}".to_owned(),
        ),
        (
            "an unknown field",
            "{\"token\":3,\"reason\":\"r\",\"x\":1}".to_owned(),
        ),
        ("not JSON", "token=3".to_owned()),
    ];
    for (case, body) in &hostile {
        let answer = s.admin(Method::POST, &reset, Some(&auth), body).await;
        assert!(
            answer.status.is_client_error(),
            "{case}: refused, got {answer:?}"
        );
    }
    assert_eq!(
        s.fence(DEFAULT_SCOPE).await,
        u64::MAX,
        "nothing moved it yet"
    );

    let done = s.admin(Method::POST, &reset, Some(&auth), body).await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    let answer = done.json();
    assert_eq!(answer["previous"].as_u64(), Some(u64::MAX), "{answer}");
    assert_eq!(answer["token"].as_u64(), Some(3), "{answer}");
    assert_eq!(s.fence(DEFAULT_SCOPE).await, 3, "the fence went down");

    let logged = log_events(&s.proxy.guard.log_text(), events::FENCE_RESET);
    let [event] = logged.as_slice() else {
        panic!(
            "exactly one {} event in the proxy's log, found {logged:?}",
            events::FENCE_RESET
        );
    };
    assert!(
        event.to_string().contains("forged raise in test"),
        "the event carries the reason: {event}"
    );
    let metrics = s.admin(Method::GET, "/metrics", Some(&auth), "").await;
    assert_eq!(metrics.status, StatusCode::OK);
    assert_eq!(
        metric(&metrics.text(), RESETS_METRIC),
        1,
        "{}",
        metrics.text()
    );

    let url = s.proxy.url("/k");
    let proof = s.signer.prove(DEFAULT_SCOPE, 4);
    let back = send(
        Method::PUT,
        &url,
        &[("fencing-token", "4"), ("fencing-token-proof", &proof)],
        "after the reset",
    )
    .await;
    assert_eq!(
        back.status,
        StatusCode::OK,
        "the real leader is back: {back:?}"
    );
}

/// Goal: `palisade fence SCOPE --reset N --reason TEXT` resets a fence through the
/// authenticated admin API, down included, logged and counted like the API's reset.
/// Method: raise the fence with the bearer, run the CLI with the admin URL and the token
/// file, read the fence, `/metrics` and the JSON log.
#[tokio::test]
async fn the_cli_resets_a_fence_with_the_admin_token() {
    let s = secured().await;
    let auth = s.auth();
    let path = format!("/v1/fences/{DEFAULT_SCOPE}");
    let raised = s
        .admin(Method::POST, &path, Some(&auth), "{\"token\":50}")
        .await;
    assert_eq!(raised.status, StatusCode::OK, "{raised:?}");

    let output = Command::new(crate::PALISADE)
        .args([
            "fence",
            DEFAULT_SCOPE,
            "--reset",
            "2",
            "--reason",
            "cli reset in test",
            "--admin",
            &s.proxy.admin_url(""),
            "--admin-token-file",
            s.token_file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "palisade fence --reset: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(s.fence(DEFAULT_SCOPE).await, 2, "the CLI's reset");
    let metrics = s.admin(Method::GET, "/metrics", Some(&auth), "").await;
    assert_eq!(metric(&metrics.text(), RESETS_METRIC), 1);
    let logged = log_events(&s.proxy.guard.log_text(), events::FENCE_RESET);
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert!(
        logged[0].to_string().contains("cli reset in test"),
        "{logged:?}"
    );
}
