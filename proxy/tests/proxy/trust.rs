//! Trust, over real HTTP: token proofs on the data path and the admin API, the admin
//! bearer token, and the audited reset. Each test starts a proxy in-process on port 0
//! with keys made here with ring, and attacks it as a client on the network would.

use palisade_protocol::admin::ResetResponse;
use palisade_protocol::headers::FENCING_TOKEN_PROOF;
use palisade_protocol::{AdvanceRequest, AdvanceResponse};
use reqwest::{Response, StatusCode, header};

use crate::harness::{ADMIN_TOKEN, Harness, Key, Setup, metric_lines, problem};

mod reset;

/// Asserts a 401 of the admin credential, with `WWW-Authenticate: Bearer`, whose detail
/// contains `detail`.
async fn unauthorized(response: Response, detail: &str) {
    assert_eq!(
        response
            .headers()
            .get(header::WWW_AUTHENTICATE)
            .map(|v| v.to_str().unwrap().to_owned()),
        Some("Bearer".to_owned())
    );
    let p = problem(response, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert!(p.detail.contains(detail), "{p}");
}

/// Goal: with keys configured, a forged token is refused 401 before it can do anything:
/// the maximum and the current token + 1 without a proof, with another scope's proof,
/// with a proof for a lower token, with garbage, with an unknown key's proof, with an
/// over-long or repeated header; the equal token without a proof too. The fence does
/// not move, nothing reaches the store, each problem names the scope and the presented
/// token, and the rejections are counted by reason.
/// Method: admit token 5 with its proof, then send each forgery as a PUT of its own key
/// and read the fence and the key back.
#[tokio::test]
async fn forged_tokens_are_401_and_move_nothing() {
    let key = Key::generate();
    let stranger = Key::generate();
    let h = Harness::start(Setup::secured(&key)).await;
    let real = h
        .put("/real", 5, Some(&key.proof("default", 5)))
        .send()
        .await;
    assert_eq!(real.unwrap().status(), StatusCode::OK);

    let other_scope = key.proof("other", 6);
    let lower = key.proof("default", 5);
    let unknown = stranger.proof("default", 6);
    let long = "A".repeat(palisade_protocol::proof::PROOF_CHARS_MAX + 1);
    let forgeries: Vec<(u64, Option<&str>, &str)> = vec![
        (u64::MAX, None, "missing-proof"),
        (6, None, "missing-proof"),
        (5, None, "missing-proof"),
        (6, Some(&other_scope), "invalid-proof"),
        (6, Some(&lower), "invalid-proof"),
        (6, Some("%%%not-base64%%%"), "invalid-proof"),
        (6, Some("AAAA"), "invalid-proof"),
        (6, Some(&unknown), "invalid-proof"),
        (u64::MAX, Some(&long), "invalid-proof"),
    ];
    for (i, (token, proof, kind)) in forgeries.into_iter().enumerate() {
        let key_path = format!("/forged-{i}");
        let response = h.put(&key_path, token, proof).send().await.unwrap();
        let p = problem(response, StatusCode::UNAUTHORIZED, kind).await;
        assert_eq!(p.scope.as_deref(), Some("default"), "{p}");
        assert_eq!(p.presented, Some(token), "{p}");
        assert_eq!(h.fence("default").await, 5, "forgery {i} moved the fence");
        let stored = h.client.get(h.data(&key_path)).send().await.unwrap();
        assert_eq!(
            stored.status(),
            StatusCode::NOT_FOUND,
            "forgery {i} was stored"
        );
    }
    let repeated = h
        .put("/forged-repeated", 6, Some(&key.proof("default", 6)))
        .header(FENCING_TOKEN_PROOF, key.proof("default", 6))
        .send()
        .await
        .unwrap();
    let p = problem(repeated, StatusCode::UNAUTHORIZED, "invalid-proof").await;
    assert!(p.detail.contains("repeated"), "{p}");
    assert_eq!(h.fence("default").await, 5);

    let metrics = h.metrics().await;
    for reason in ["missing-proof", "invalid-proof"] {
        assert!(
            !metric_lines(&metrics, "palisade_proxy_rejections_total", reason).is_empty(),
            "{reason}: {metrics}"
        );
    }
    h.stop().await;
}

/// Goal: the cluster's proof admits its token, by either key of a rotation; a valid
/// proof for an old token is still refused by the fence (409), and reads are not fenced.
/// Method: two keys; write with the old key's proof for 3, the new key's for 4, then the
/// old key's for 3 again.
#[tokio::test]
async fn valid_proofs_are_admitted_by_either_key_of_a_rotation() {
    let (old, new) = (Key::generate(), Key::generate());
    let h = Harness::start(Setup {
        keys: vec![&old, &new],
        ..Setup::default()
    })
    .await;
    let first = h.put("/k", 3, Some(&old.proof("default", 3))).send().await;
    assert_eq!(first.unwrap().status(), StatusCode::OK);
    // The same token and proof again: the cached path.
    let again = h.put("/k", 3, Some(&old.proof("default", 3))).send().await;
    assert_eq!(again.unwrap().status(), StatusCode::OK);
    let second = h.put("/k", 4, Some(&new.proof("default", 4))).send().await;
    assert_eq!(second.unwrap().status(), StatusCode::OK);
    let stale = h.put("/k", 3, Some(&old.proof("default", 3))).send().await;
    problem(stale.unwrap(), StatusCode::CONFLICT, "stale-token").await;
    let read = h.client.get(h.data("/k")).send().await.unwrap();
    assert_eq!(read.status(), StatusCode::OK);
    h.stop().await;
}

/// Goal: with keys and an admin token, an advance needs a valid proof or the exact
/// bearer token: nothing, a wrong bearer, a prefix of the right one, another scheme, or
/// an invalid proof (even beside the right bearer) are 401 and move nothing.
/// Method: POST advances of each kind, reading the fence after each.
#[tokio::test]
async fn admin_advance_needs_a_proof_or_the_bearer() {
    let key = Key::generate();
    let h = Harness::start(Setup::secured(&key)).await;
    let bare = h.advance("jobs", 9, None).send().await.unwrap();
    unauthorized(bare, "no Authorization header").await;
    let wrong = h
        .advance("jobs", 9, None)
        .bearer_auth("nope-nope-nope-nope");
    unauthorized(wrong.send().await.unwrap(), "wrong admin token").await;
    let prefix = &ADMIN_TOKEN[..ADMIN_TOKEN.len() - 1];
    let short = h.advance("jobs", 9, None).bearer_auth(prefix);
    unauthorized(short.send().await.unwrap(), "wrong admin token").await;
    let basic = h
        .advance("jobs", 9, None)
        .basic_auth("admin", Some(ADMIN_TOKEN));
    unauthorized(basic.send().await.unwrap(), "not a Bearer credential").await;
    let forged = h
        .advance("jobs", 9, Some(key.proof("jobs", 8)))
        .bearer_auth(ADMIN_TOKEN);
    problem(
        forged.send().await.unwrap(),
        StatusCode::UNAUTHORIZED,
        "invalid-proof",
    )
    .await;
    assert_eq!(
        h.fence("jobs").await,
        0,
        "no refused advance moved the fence"
    );

    let proven = h
        .advance("jobs", 9, Some(key.proof("jobs", 9)))
        .send()
        .await;
    let proven: AdvanceResponse = proven.unwrap().json().await.unwrap();
    assert!(proven.advanced);
    let bearer = h.advance("jobs", 10, None).bearer_auth(ADMIN_TOKEN);
    let bearer = bearer.send().await.unwrap();
    assert_eq!(bearer.status(), StatusCode::OK);
    assert_eq!(h.fence("jobs").await, 10);
    h.stop().await;
}

/// Goal: with an admin token, every admin route but `/healthz` needs it, including
/// `/metrics`, the fence reads, the reset and paths that do not exist; `/metrics` is
/// open when `admin_metrics_public` says so, and nothing else is.
/// Method: GET each route without and with the bearer, on two proxies.
#[tokio::test]
async fn admin_routes_need_the_bearer_except_healthz() {
    let h = Harness::start(Setup {
        admin_token: true,
        ..Setup::default()
    })
    .await;
    let get = |path: &str| h.client.get(h.admin(path));
    assert_eq!(
        get("/healthz").send().await.unwrap().status(),
        StatusCode::OK
    );
    for path in ["/metrics", "/v1/fences", "/v1/fences/default", "/v1/nope"] {
        unauthorized(get(path).send().await.unwrap(), "no Authorization header").await;
        let with = get(path).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
        let expected = if path == "/v1/nope" {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::OK
        };
        assert_eq!(with.status(), expected, "{path}");
    }
    let reset = h.reset("default", r#"{"token":1,"reason":"test"}"#);
    unauthorized(reset.send().await.unwrap(), "no Authorization header").await;
    // Without keys an advance needs the bearer; a proof cannot stand in for it.
    let advance = h.advance("default", 3, Some("A".repeat(86)));
    unauthorized(advance.send().await.unwrap(), "no Authorization header").await;
    let advance = h.advance("default", 3, None).bearer_auth(ADMIN_TOKEN);
    assert_eq!(advance.send().await.unwrap().status(), StatusCode::OK);
    // The advance exception covers only the POST of the advance route.
    let reset_as_advance =
        h.client
            .post(h.admin("/v1/fences/default/reset"))
            .json(&AdvanceRequest {
                token: 1,
                proof: None,
            });
    unauthorized(reset_as_advance.send().await.unwrap(), "no Authorization").await;
    h.stop().await;

    let h = Harness::start(Setup {
        admin_token: true,
        metrics_public: true,
        ..Setup::default()
    })
    .await;
    let metrics = h.client.get(h.admin("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), StatusCode::OK);
    let fences = h.client.get(h.admin("/v1/fences")).send().await.unwrap();
    unauthorized(fences, "no Authorization header").await;
    h.stop().await;
}

/// Goal: with keys but no admin token the proof is the only credential: an advance
/// without one is 401 missing-proof (not let through), a reset is 403 reset-disabled,
/// and reads stay open.
/// Method: advance without and with a proof, try a reset, read the fence.
#[tokio::test]
async fn keys_without_an_admin_token_fail_closed() {
    let key = Key::generate();
    let h = Harness::start(Setup {
        keys: vec![&key],
        ..Setup::default()
    })
    .await;
    let bare = h.advance("jobs", 4, None).send().await.unwrap();
    let p = problem(bare, StatusCode::UNAUTHORIZED, "missing-proof").await;
    assert_eq!((p.scope.as_deref(), p.presented), (Some("jobs"), Some(4)));
    let proven = h
        .advance("jobs", 4, Some(key.proof("jobs", 4)))
        .send()
        .await;
    assert_eq!(proven.unwrap().status(), StatusCode::OK);
    let reset = h
        .reset("jobs", r#"{"token":1,"reason":"try"}"#)
        .send()
        .await;
    let p = problem(reset.unwrap(), StatusCode::FORBIDDEN, "reset-disabled").await;
    assert!(p.detail.contains("--admin-token-file"), "{p}");
    assert_eq!(h.fence("jobs").await, 4);
    h.stop().await;
}

/// Goal: a reset with the bearer sets a fence below a mistaken maximum, durably enough
/// that the real leader's token works again, answers the old and new values, and is
/// counted; hostile reasons are refused and change nothing.
/// Method: advance to the maximum with the bearer, send bad resets, reset to 5, write
/// with token 5 and its proof, read `/metrics`.
#[tokio::test]
async fn reset_lowers_the_fence_with_the_bearer_and_is_counted() {
    let key = Key::generate();
    let h = Harness::start(Setup::secured(&key)).await;
    let max = h
        .advance("default", u64::MAX, None)
        .bearer_auth(ADMIN_TOKEN);
    assert_eq!(max.send().await.unwrap().status(), StatusCode::OK);
    let locked_out = h.put("/k", 5, Some(&key.proof("default", 5))).send().await;
    problem(locked_out.unwrap(), StatusCode::CONFLICT, "stale-token").await;

    let long = format!(r#"{{"token":5,"reason":"{}"}}"#, "x".repeat(513));
    for body in [
        r#"{"token":5}"#,
        r#"{"token":5,"reason":""}"#,
        r#"{"token":5,"reason":"   "}"#,
        r#"{"token":5,"reason":"line\nforged log line"}"#,
        r#"{"token":5,"reason":"ok","force":true}"#,
        long.as_str(),
    ] {
        let response = h
            .reset("default", body)
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await;
        problem(
            response.unwrap(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "bad-body",
        )
        .await;
    }
    assert_eq!(h.fence("default").await, u64::MAX);

    let body = r#"{"token":5,"reason":"a forged maximum locked the leader out"}"#;
    let reset = h
        .reset("default", body)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await;
    let reset = reset.unwrap();
    assert_eq!(reset.status(), StatusCode::OK);
    let reset: ResetResponse = reset.json().await.unwrap();
    assert_eq!((reset.previous, reset.token), (u64::MAX, 5));
    assert_eq!(h.fence("default").await, 5);
    let back = h.put("/k", 5, Some(&key.proof("default", 5))).send().await;
    assert_eq!(back.unwrap().status(), StatusCode::OK);

    let metrics = h.metrics().await;
    let resets = metrics
        .lines()
        .find(|l| l.starts_with("palisade_proxy_fence_resets_total"))
        .unwrap_or_else(|| panic!("no resets counter: {metrics}"));
    let count: f64 = resets.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(count >= 1.0, "{resets}");
    h.stop().await;
}
