//! The admin API over real HTTP: a proxy started in-process on port 0 with a temporary
//! data directory, called with reqwest as an operator or an election node would.
//!
//! Every answer is checked against the protocol's types, and every error against its
//! status, `application/problem+json` and problem kind.

use palisade_protocol::headers::{FENCING_TOKEN, FENCING_TOKEN_CURRENT, JSON, PROMETHEUS_TEXT};
use palisade_protocol::{AdvanceResponse, Health, KeyList, StoredObject};
use reqwest::{Method, Response, StatusCode, header};

use crate::harness::{Harness, Setup, metric_lines, problem};

/// POSTs `body` as JSON text (not necessarily valid) to the admin path.
async fn post_text(h: &Harness, path: &str, body: impl Into<reqwest::Body>) -> Response {
    h.client
        .post(h.admin(path))
        .header(header::CONTENT_TYPE, JSON)
        .body(body)
        .send()
        .await
        .unwrap()
}

/// Goal: list, read and advance speak the protocol's types: an advance moves the fence,
/// an equal one answers `advanced: false`, and the list and a read show the new fence; a
/// scope never seen reads as token 0.
/// Method: advance `jobs` to 7 twice, then GET the list, `jobs`, and an unseen scope.
#[tokio::test]
async fn fences_round_trip_through_the_typed_api() {
    let h = Harness::start(Setup::default()).await;
    let first = h.advance("jobs", 7, None).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()[header::CONTENT_TYPE], JSON);
    let first: AdvanceResponse = first.json().await.unwrap();
    assert_eq!(
        (first.scope.as_str(), first.token, first.advanced),
        ("jobs", 7, true)
    );
    let again = h.advance("jobs", 7, None).send().await.unwrap();
    let again: AdvanceResponse = again.json().await.unwrap();
    assert!(!again.advanced);

    let list = h.fences().await;
    assert_eq!(list.fences.len(), 1, "{list:?}");
    assert_eq!(
        (list.fences[0].scope.as_str(), list.fences[0].token),
        ("jobs", 7)
    );
    assert_eq!(h.fence("jobs").await, 7);
    assert_eq!(h.fence("never-seen").await, 0);
    h.stop().await;
}

/// Goal: an advance below the fence is refused 409 with a problem that names scope,
/// presented and current, and with `Fencing-Token-Current`, exactly as a stale write on
/// the data path is; the fence stays where it was.
/// Method: advance to 9, advance to 4; then a stale PUT on the data path, compared.
#[tokio::test]
async fn stale_advance_is_409_like_a_stale_write() {
    let h = Harness::start(Setup::default()).await;
    assert_eq!(
        h.advance("default", 9, None).send().await.unwrap().status(),
        StatusCode::OK
    );
    let stale = h.advance("default", 4, None).send().await.unwrap();
    assert_eq!(stale.headers()[FENCING_TOKEN_CURRENT], "9");
    let admin = problem(stale, StatusCode::CONFLICT, "stale-token").await;
    assert_eq!(admin.scope.as_deref(), Some("default"));
    assert_eq!((admin.presented, admin.current), (Some(4), Some(9)));
    assert_eq!(h.fence("default").await, 9);

    let write = h
        .client
        .put(h.data("/k"))
        .header(FENCING_TOKEN, "4")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(write.headers()[FENCING_TOKEN_CURRENT], "9");
    let data = problem(write, StatusCode::CONFLICT, "stale-token").await;
    assert_eq!(data, admin, "one mapping from error to problem");
    h.stop().await;
}

/// Goal: a scope outside the rule is 400 bad-scope whether it is too long (129 bytes) or
/// smuggles a `/` as `%2F`, on reads and on advances; nothing is stored.
/// Method: GET and POST such paths, then list the fences.
#[tokio::test]
async fn bad_scopes_are_400_problems() {
    let h = Harness::start(Setup::default()).await;
    let long = "x".repeat(palisade_protocol::SCOPE_BYTES_MAX + 1);
    for scope in [long.as_str(), "a%2Fb", "a%2F..%2Fb", "%2F"] {
        let path = format!("/v1/fences/{scope}");
        let read = h.client.get(h.admin(&path)).send().await.unwrap();
        problem(read, StatusCode::BAD_REQUEST, "bad-scope").await;
        let advance = post_text(&h, &path, r#"{"token":1}"#).await;
        problem(advance, StatusCode::BAD_REQUEST, "bad-scope").await;
    }
    let list = h.fences().await;
    assert!(list.fences.is_empty(), "{list:?}");
    h.stop().await;
}

/// Goal: an unknown path is 404 and a method a path does not take is 405, both as
/// problem+json rather than an empty or plain-text answer.
/// Method: GET an unknown path; DELETE a fence, POST the list, PUT `/healthz`.
#[tokio::test]
async fn unknown_paths_and_wrong_methods_are_problems() {
    let h = Harness::start(Setup::default()).await;
    let missing = h.client.get(h.admin("/v1/nope")).send().await.unwrap();
    let p = problem(missing, StatusCode::NOT_FOUND, "not-found").await;
    assert!(p.detail.contains("/v1/nope"), "{p}");
    for (method, path) in [
        (Method::DELETE, "/v1/fences/default"),
        (Method::POST, "/v1/fences"),
        (Method::PUT, "/healthz"),
    ] {
        let response = h
            .client
            .request(method.clone(), h.admin(path))
            .send()
            .await
            .unwrap();
        problem(
            response,
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
        )
        .await;
    }
    h.stop().await;
}

/// Goal: `/healthz` answers JSON health (not Prometheus text), `/metrics` Prometheus
/// text with its content type.
/// Method: GET both and parse.
#[tokio::test]
async fn health_is_json_and_metrics_are_prometheus_text() {
    let h = Harness::start(Setup::default()).await;
    let health = h.client.get(h.admin("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    assert_eq!(health.headers()[header::CONTENT_TYPE], JSON);
    assert_eq!(health.json::<Health>().await.unwrap(), Health::ok(None));
    let metrics = h.client.get(h.admin("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), StatusCode::OK);
    assert_eq!(metrics.headers()[header::CONTENT_TYPE], PROMETHEUS_TEXT);
    h.stop().await;
}

/// Goal: hostile bodies are refused with a 4xx problem and move no fence: a body over
/// the admin limit (just over, and 1 MiB) is 413; a token above `u64::MAX`, an unknown
/// field, a token as a string, and a body without the JSON content type are refused.
/// Method: POST each to `/v1/fences/default`, then read the fence.
#[tokio::test]
async fn hostile_bodies_are_refused() {
    let h = Harness::start(Setup::default()).await;
    let path = "/v1/fences/default";
    let padded = format!("{{\"token\":1{}}}", " ".repeat(5000));
    problem(
        post_text(&h, path, padded).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "body-too-large",
    )
    .await;
    let mebibyte = format!("{{\"token\":1,\"pad\":\"{}\"}}", "x".repeat(1 << 20));
    problem(
        post_text(&h, path, mebibyte).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "body-too-large",
    )
    .await;
    for body in [
        r#"{"token":18446744073709551616}"#,
        r#"{"token":5,"force":true}"#,
        r#"{"token":"5"}"#,
        r#"{"token":-1}"#,
        "{}",
        "not json",
    ] {
        let response = post_text(&h, path, body).await;
        assert!(
            response.status().is_client_error(),
            "{body}: {}",
            response.status()
        );
        problem(response, response_status(body), "bad-body").await;
    }
    // Without `Content-Type: application/json` (a browser's form post, for one) the
    // body is not read at all: a cross-site page cannot raise a fence.
    let plain = h
        .client
        .post(h.admin(path))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(r#"{"token":5}"#)
        .send()
        .await
        .unwrap();
    problem(plain, StatusCode::UNSUPPORTED_MEDIA_TYPE, "bad-body").await;
    assert_eq!(
        h.fence("default").await,
        0,
        "no hostile body moved the fence"
    );
    h.stop().await;
}

/// The status axum's JSON extractor gives a body: 400 when it is not JSON at all, 422
/// when it is JSON of the wrong shape.
fn response_status(body: &str) -> StatusCode {
    if body == "not json" {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    }
}

/// Goal: `palisade_proxy_rejections_total` counts only requests refused before
/// forwarding; an upstream that cannot be reached is counted in
/// `palisade_proxy_upstream_errors_total` instead.
/// Method: a proxy whose upstream port is closed; one stale write (refused) and one
/// admitted write (fails upstream, 502); read `/metrics`.
#[tokio::test]
async fn upstream_failures_are_not_rejections() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let h = Harness::start(Setup {
        upstream: Some(format!("http://{closed}")),
        ..Setup::default()
    })
    .await;
    assert_eq!(
        h.advance("default", 5, None).send().await.unwrap().status(),
        StatusCode::OK
    );
    let put = |token: &'static str| {
        h.client
            .put(h.data("/k"))
            .header(FENCING_TOKEN, token)
            .body("x")
            .send()
    };
    problem(put("1").await.unwrap(), StatusCode::CONFLICT, "stale-token").await;
    problem(
        put("5").await.unwrap(),
        StatusCode::BAD_GATEWAY,
        "upstream-error",
    )
    .await;

    let metrics = h.metrics().await;
    let lines = |name: &str, reason: &str| metric_lines(&metrics, name, reason);
    assert!(
        !lines("palisade_proxy_rejections_total", "stale-token").is_empty(),
        "{metrics}"
    );
    assert!(
        !lines("palisade_proxy_upstream_errors_total", "upstream-error").is_empty(),
        "{metrics}"
    );
    assert!(
        lines("palisade_proxy_rejections_total", "upstream-error").is_empty(),
        "an upstream failure is not a rejection: {metrics}"
    );
    h.stop().await;
}

/// Goal: the embedded store answers with the protocol's types, and a method it does not
/// take is a 405 whose message and `Allow` header name what it does take (the data path
/// shares the error type with the admin API, so the message must not guess the source).
/// Method: PUT two keys, list them typed, then PATCH one.
#[tokio::test]
async fn embedded_store_answers_are_typed() {
    let h = Harness::start(Setup::default()).await;
    for (key, token) in [("/d/a", "3"), ("/d/b", "4")] {
        let put = h
            .client
            .put(h.data(key))
            .header(FENCING_TOKEN, token)
            .body("hello")
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), StatusCode::OK);
        let stored: StoredObject = put.json().await.unwrap();
        assert_eq!((stored.key.as_str(), stored.size), (&key[1..], 5));
    }
    let list: KeyList = h
        .client
        .get(h.data("/d/?list"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let seen: Vec<(&str, u64, u64)> = list
        .keys
        .iter()
        .map(|o| (o.key.as_str(), o.token, o.revision))
        .collect();
    assert_eq!(seen, [("d/a", 3, 1), ("d/b", 4, 2)]);
    assert!(!list.truncated);

    let patch = h
        .client
        .patch(h.data("/d/a"))
        .header(FENCING_TOKEN, "4")
        .send()
        .await
        .unwrap();
    let allow = patch.headers().get(header::ALLOW).cloned();
    let p = problem(patch, StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed").await;
    assert_eq!(
        p.detail,
        format!(
            "method PATCH is not allowed here; allowed: {}",
            allow.unwrap().to_str().unwrap()
        )
    );
    assert!(p.detail.contains("GET"), "{p}");
    h.stop().await;
}
