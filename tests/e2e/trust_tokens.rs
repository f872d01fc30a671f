//! Signed fencing tokens, end to end: a proxy started with `--token-pub` admits a fenced
//! request only with a valid `Fencing-Token-Proof` for exactly its scope and token. Keys
//! come from `palisade keys generate`; forged proofs are signed in the test with that key
//! (for another scope, a lower token) or with a stranger's.

use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{HeaderName, Method, StatusCode};
use palisade_cluster::{ClusterOptions, ClusterSpec};
use palisade_protocol::DEFAULT_SCOPE;
use palisade_protocol::headers::{FENCING_SCOPE, FENCING_TOKEN, FENCING_TOKEN_PROOF, PROBLEM_JSON};
use palisade_protocol::process::events;
use palisade_protocol::proof::PROOF_CHARS_MAX;
use palisade_tests::client::{Answer, send};
use palisade_tests::fixtures::proxy_with_upstream_args;
use palisade_tests::fixtures::{fence_at_proxy, resign};
use palisade_tests::process::start_cluster;
use palisade_tests::trust::{Signer, TokenKeys, encode_proof, log_events};

/// `Fencing-Token`, in a static so that the raw requests below can borrow its name.
static TOKEN: HeaderName = FENCING_TOKEN;
/// `Fencing-Token-Proof`, likewise.
static PROOF: HeaderName = FENCING_TOKEN_PROOF;
/// `Fencing-Scope`, likewise.
static SCOPE: HeaderName = FENCING_SCOPE;

/// Generous bound for an election at 20 ms ticks on a loaded 2-core machine.
const ELECTION_TIMEOUT: Duration = Duration::from_secs(20);

/// A PUT of `body` to `url` with exactly `headers`.
async fn put_with(url: &str, headers: &[(&str, &str)]) -> Answer {
    send(Method::PUT, url, headers, "w").await
}

/// A PUT with `token` and `proof`.
async fn put_proven(url: &str, token: u64, proof: &str) -> Answer {
    let token = token.to_string();
    put_with(url, &[(TOKEN.as_str(), &token), (PROOF.as_str(), proof)]).await
}

/// The problem kind of a request without a proof.
const MISSING: &str = "missing-proof";
/// The problem kind of a request whose proof does not verify.
const INVALID: &str = "invalid-proof";

/// Asserts `answer` is a 401 problem+json of one of `kinds` (its own types, not a
/// stale-token problem).
fn assert_unproven(answer: &Answer, case: &str, kinds: &[&str]) {
    assert_eq!(
        answer.status,
        StatusCode::UNAUTHORIZED,
        "{case}: {answer:?}"
    );
    assert_eq!(
        answer.header(CONTENT_TYPE.as_str()).as_deref(),
        Some(PROBLEM_JSON),
        "{case}"
    );
    let problem = answer.problem().expect("a problem+json body");
    assert_eq!(problem.status, 401, "{case}");
    assert!(
        kinds.contains(&problem.kind()),
        "{case}: kind {} is one of {kinds:?}",
        problem.kind()
    );
}

/// Goal: a forged token (the maximum, the current + 1, the current itself) without a
/// proof, with another scope's proof, with a proof for a lower token, with a stranger
/// key's proof or a mangled one, is refused with 401 problem+json; the fence does not move
/// and the upstream sees nothing; the right proof is then admitted. Method: a proxy with
/// `--token-pub` in front of the recording upstream; one proven write at 5, then every
/// forgery, then the fences (admin GET), the upstream's log and the proxy's
/// `proof-rejected` log events; last a proven write at 6.
#[tokio::test]
async fn forged_tokens_are_refused_with_401_and_move_nothing() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let keys = TokenKeys::generate(&dir.path().join("keys"));
    let signer = keys.signer();
    let (upstream, proxy) = proxy_with_upstream_args(
        &dir.path().join("proxy"),
        &[
            "--token-pub",
            keys.public_arg(),
            "--log-format",
            "json",
            // So that a proof under another scope header reaches the proof check.
            "--client-scopes",
        ],
    )
    .await;
    let url = proxy.url("/k");
    let ok = put_proven(&url, 5, &signer.prove(DEFAULT_SCOPE, 5)).await;
    assert_eq!(ok.status, StatusCode::OK, "the proven token 5: {ok:?}");

    let max = u64::MAX.to_string();
    let six = "6";
    let five = "5";
    let other_scope = signer.prove("other", 6);
    let lower = signer.prove(DEFAULT_SCOPE, 4);
    let proof_of_five = signer.prove(DEFAULT_SCOPE, 5);
    let stranger = Signer::stranger().prove(DEFAULT_SCOPE, 6);
    let mut flipped = signer.sign(DEFAULT_SCOPE, 6);
    flipped[10] ^= 1;
    let flipped = encode_proof(&flipped);
    let right_six = signer.prove(DEFAULT_SCOPE, 6);
    let truncated = &right_six[..right_six.len() - 1];
    let too_long = "A".repeat(PROOF_CHARS_MAX + 1);
    let t = TOKEN.as_str();
    let p = PROOF.as_str();
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("the maximum, no proof", vec![(t, &max)]),
        ("current + 1, no proof", vec![(t, six)]),
        ("the current token, no proof", vec![(t, five)]),
        ("another scope's proof", vec![(t, six), (p, &other_scope)]),
        ("a lower token's proof", vec![(t, six), (p, &lower)]),
        (
            "the maximum with the proof of 5",
            vec![(t, &max), (p, &proof_of_five)],
        ),
        ("a stranger key's proof", vec![(t, six), (p, &stranger)]),
        ("one bit flipped", vec![(t, six), (p, &flipped)]),
        ("one character short", vec![(t, six), (p, truncated)]),
        ("an empty proof", vec![(t, six), (p, "")]),
        ("not base64url", vec![(t, six), (p, "not/a+proof==")]),
        ("longer than any proof", vec![(t, six), (p, &too_long)]),
        (
            "the right proof under another scope header",
            vec![(t, six), (p, &right_six), (SCOPE.as_str(), "other")],
        ),
    ];
    for (case, headers) in &cases {
        let kinds: &[&str] = match headers.iter().find(|(name, _)| *name == p) {
            None => &[MISSING],
            Some((_, "")) => &[MISSING, INVALID],
            Some(_) => &[INVALID],
        };
        assert_unproven(&put_with(&url, headers).await, case, kinds);
    }
    // Two proofs, the right one among them: ambiguous, so refused (400 or 401).
    let twice = put_with(&url, &[(t, six), (p, &right_six), (p, &stranger)]).await;
    assert!(
        matches!(
            twice.status,
            StatusCode::BAD_REQUEST | StatusCode::UNAUTHORIZED
        ),
        "a repeated proof header: {twice:?}"
    );

    let admin = proxy.admin_client();
    assert_eq!(admin.fence(DEFAULT_SCOPE).await.unwrap().token, 5);
    assert_eq!(admin.fence("other").await.unwrap().token, 0);
    let applied: Vec<Option<String>> = upstream.arrived().into_iter().map(|a| a.token).collect();
    assert_eq!(
        applied,
        vec![Some("5".to_owned())],
        "only the proven write arrived"
    );
    let rejected = log_events(&proxy.guard.log_text(), events::PROOF_REJECTED);
    assert!(
        rejected.len() >= cases.len(),
        "every refusal is logged as {}: {} of {}",
        events::PROOF_REJECTED,
        rejected.len(),
        cases.len()
    );

    let next = put_proven(&url, 6, &right_six).await;
    assert_eq!(next.status, StatusCode::OK, "the proven token 6: {next:?}");
    assert_eq!(admin.fence(DEFAULT_SCOPE).await.unwrap().token, 6);
}

/// Goal: the real leader's token with the proof from its leader view is admitted; after
/// an election the new leader's proof works and the old leader's token, with its own
/// valid proof, is refused with 409 (stale), while the new token with the old proof is
/// 401. Method: three nodes with `--token-key` announcing to a proxy with `--token-pub`;
/// read `proof` from `GET /v1/leader` (and check it is exactly the signature of (scope,
/// token) with the generated key); write; `POST /v1/resign`; wait for the new leader's
/// token at the proxy; write with each (token, proof).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_proof_is_admitted_and_survives_an_election_only_for_the_new_leader() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let keys = TokenKeys::generate(&dir.path().join("keys"));
    let signer = keys.signer();
    let spec = ClusterSpec {
        nodes: 3,
        node_flags: ["--tick-ms", "20", "--token-key", keys.key_arg()]
            .map(String::from)
            .to_vec(),
        proxy_flags: vec!["--token-pub".into(), keys.public_arg().into()],
    };
    let cluster = start_cluster(dir.path(), &spec, &ClusterOptions::default());

    let first = cluster
        .wait_for_leader(0, None, ELECTION_TIMEOUT)
        .await
        .expect("a first leader");
    let old = first.token.unwrap();
    let old_proof = first
        .proof
        .clone()
        .expect("the leader view carries a proof");
    assert_eq!(
        old_proof,
        signer.prove(first.scope.as_str(), old),
        "the proof is the key's signature of exactly (scope, token)"
    );
    for (id, view) in cluster.leaderships().await {
        assert_eq!(
            view.proof.is_some(),
            view.token.is_some(),
            "node {id}: a proof exactly when a token"
        );
    }
    fence_at_proxy(&cluster, ELECTION_TIMEOUT, "the announced token", |f| {
        f == old
    })
    .await;
    let url = cluster.proxy.url("/ledger/1");
    let ok = put_proven(&url, old, &old_proof).await;
    assert_eq!(
        ok.status,
        StatusCode::OK,
        "the leader's proven write: {ok:?}"
    );

    resign(&cluster, first.node_id).await;
    let next = cluster
        .wait_for_leader(old, None, ELECTION_TIMEOUT)
        .await
        .expect("a new leader after the resignation");
    let new = next.token.unwrap();
    let new_proof = next.proof.clone().expect("the new leader's proof");
    fence_at_proxy(&cluster, ELECTION_TIMEOUT, "the new token", |f| f == new).await;

    let url = cluster.proxy.url("/ledger/2");
    let ok = put_proven(&url, new, &new_proof).await;
    assert_eq!(ok.status, StatusCode::OK, "the new leader's write: {ok:?}");
    let stale = put_proven(&url, old, &old_proof).await;
    assert_eq!(
        stale.status,
        StatusCode::CONFLICT,
        "the old leader's token, validly proven, is stale: {stale:?}"
    );
    assert_unproven(
        &put_proven(&url, new, &old_proof).await,
        "the new token with the old proof",
        &[INVALID],
    );
    assert_eq!(cluster.proxy_fence(DEFAULT_SCOPE).await, Some(new));
}
