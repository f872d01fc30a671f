//! The proxy's fencing rules, end to end: a real `palisade proxy` process in front of a
//! recording upstream that logs what really reached the storage.

use std::time::Duration;

use http::{Method, StatusCode};
use palisade_tests::client::{self, put, send};
use palisade_tests::fixtures::{hold_in_flight, proxy_with_upstream};
use palisade_tests::process::start_proxy;
use palisade_tests::upstream::RecordingUpstream;

/// A proxy config with a short barrier deadline, so 503 tests are quick.
const BARRIER_1500_MS: &str = "[limits]\nbarrier_timeout_ms = 1500\n";

fn tokens(upstream: &RecordingUpstream) -> Vec<String> {
    upstream
        .applied()
        .into_iter()
        .map(|a| a.token.unwrap_or_default())
        .collect()
}

/// A write with a token below the fence gets 409 with the numbers, and the upstream
/// never sees it.
#[tokio::test]
async fn stale_token_is_rejected_and_never_reaches_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);

    assert_eq!(
        put(&proxy.url("/k"), 5, "five").await.status,
        StatusCode::OK
    );
    let stale = put(&proxy.url("/k"), 4, "four").await;
    assert_eq!(stale.status, StatusCode::CONFLICT);
    assert_eq!(stale.header("fencing-token-current").as_deref(), Some("5"));
    assert_eq!(
        stale.header("content-type").as_deref(),
        Some("application/problem+json")
    );
    let problem = stale.json();
    assert_eq!(problem["status"], 409);
    assert_eq!(problem["scope"], "default");
    assert_eq!(problem["presented"], 4);
    assert_eq!(problem["current"], 5);

    assert_eq!(
        tokens(&upstream),
        vec!["5"],
        "only the token-5 write reached the upstream"
    );
    assert_eq!(upstream.arrived().len(), 1);
}

/// An equal token is forwarded; a higher one advances the fence, and the advance
/// survives a clean restart and a `kill -9` of the proxy process.
#[tokio::test]
async fn higher_token_advance_survives_restart_and_kill9() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let url = upstream.url();
    let args = ["--upstream", url.as_str()];

    let mut proxy = start_proxy(dir.path(), &args);
    assert_eq!(put(&proxy.url("/a"), 3, "x").await.status, StatusCode::OK);
    assert_eq!(
        put(&proxy.url("/a"), 3, "y").await.status,
        StatusCode::OK,
        "equal token is forwarded"
    );
    assert_eq!(put(&proxy.url("/a"), 7, "z").await.status, StatusCode::OK);
    // SIGTERM: a clean stop.
    proxy
        .guard
        .signal(nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    assert_eq!(
        proxy.guard.wait_exit(Duration::from_secs(20)).unwrap(),
        Some(0)
    );

    let mut proxy = start_proxy(dir.path(), &args);
    assert_eq!(
        put(&proxy.url("/a"), 6, "stale").await.status,
        StatusCode::CONFLICT
    );
    assert_eq!(put(&proxy.url("/a"), 9, "w").await.status, StatusCode::OK);
    proxy.guard.kill9();

    let proxy = start_proxy(dir.path(), &args);
    let fence = send(Method::GET, &proxy.admin_url("/v1/fences/default"), &[], "")
        .await
        .json();
    assert_eq!(
        fence["token"], 9,
        "the fence acknowledged before kill -9 is still there"
    );
    assert_eq!(
        put(&proxy.url("/a"), 8, "stale").await.status,
        StatusCode::CONFLICT
    );
    assert_eq!(tokens(&upstream), vec!["3", "3", "7", "9"]);
}

/// Missing token: 428. Malformed, negative, overflowing or repeated token: 400. Bad
/// scope: 400. None of them reaches the upstream.
#[tokio::test]
async fn malformed_requests_get_their_status_and_nothing_is_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);
    let url = proxy.url("/k");

    let missing = send(Method::PUT, &url, &[], "x").await;
    assert_eq!(missing.status, StatusCode::PRECONDITION_REQUIRED);
    assert_eq!(missing.json()["status"], 428);

    let cases: &[&[(&str, &str)]] = &[
        &[("fencing-token", "abc")],
        &[("fencing-token", "-1")],
        &[("fencing-token", "1.5")],
        &[("fencing-token", "18446744073709551616")],
        &[("fencing-token", "1"), ("fencing-token", "2")],
        &[("fencing-token", "1"), ("fencing-scope", "bad scope!")],
        &[("fencing-token", "1"), ("fencing-scope", "")],
    ];
    for headers in cases {
        let answer = send(Method::PUT, &url, headers, "x").await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{headers:?}: {}",
            answer.text()
        );
        assert_eq!(
            answer.header("content-type").as_deref(),
            Some("application/problem+json")
        );
    }
    let long_scope = "s".repeat(129);
    let answer = send(
        Method::PUT,
        &url,
        &[("fencing-token", "1"), ("fencing-scope", &long_scope)],
        "x",
    )
    .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);

    assert!(
        upstream.arrived().is_empty(),
        "nothing reached the upstream: {:?}",
        upstream.arrived()
    );
}

/// While a lower-token write is held in flight at the upstream, a higher-token write
/// waits; the upstream applies them in token order. With the lower one held past the
/// barrier deadline, the higher one is answered 503 with Retry-After and not forwarded.
#[tokio::test]
async fn higher_token_waits_for_lower_in_flight_and_times_out_with_503() {
    let dir = tempfile::tempdir().unwrap();
    let (upstream, proxy) = proxy_with_upstream(dir.path(), BARRIER_1500_MS).await;

    // Order: token 1 held in flight, then token 2 arrives.
    let low = hold_in_flight(&upstream, &proxy, "/slow", 1).await;
    let high_url = proxy.url("/fast");
    let high = tokio::spawn(async move { put(&high_url, 2, "high").await });
    // Show that the higher write is not forwarded while the lower one is in flight.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(upstream.arrived().len(), 1, "token 2 must wait for token 1");
    upstream.release("/slow");
    assert_eq!(low.await.unwrap().status, StatusCode::OK);
    assert_eq!(high.await.unwrap().status, StatusCode::OK);
    assert_eq!(tokens(&upstream), vec!["1", "2"], "applied in token order");

    // Now hold token 2 past the barrier deadline: token 3 gets 503 and is not forwarded.
    let held = hold_in_flight(&upstream, &proxy, "/slow", 2).await;
    let timed_out = put(&proxy.url("/fast"), 3, "too early").await;
    assert_eq!(
        timed_out.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        timed_out.text()
    );
    assert!(timed_out.header("retry-after").is_some());
    assert_eq!(
        upstream.arrived().len(),
        3,
        "the 503 request was not forwarded"
    );
    upstream.release("/slow");
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    assert_eq!(tokens(&upstream), vec!["1", "2", "2"]);
}

/// Reads pass through without a token; with `fence_reads`, they need one and are fenced.
#[tokio::test]
async fn reads_pass_unfenced_and_are_fenced_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);
    assert_eq!(put(&proxy.url("/k"), 5, "x").await.status, StatusCode::OK);
    assert_eq!(
        send(Method::GET, &proxy.url("/k"), &[], "").await.status,
        StatusCode::OK
    );
    let stale_read = send(Method::GET, &proxy.url("/k"), &[("fencing-token", "1")], "").await;
    assert_eq!(
        stale_read.status,
        StatusCode::OK,
        "reads are not fenced by default"
    );
    drop(proxy);

    let dir = tempfile::tempdir().unwrap();
    let proxy = start_proxy(
        dir.path(),
        &["--upstream", &upstream.url(), "--fence-reads"],
    );
    assert_eq!(put(&proxy.url("/k"), 5, "x").await.status, StatusCode::OK);
    let before = upstream.arrived().len();
    assert_eq!(
        send(Method::GET, &proxy.url("/k"), &[], "").await.status,
        StatusCode::PRECONDITION_REQUIRED
    );
    assert_eq!(
        send(Method::GET, &proxy.url("/k"), &[("fencing-token", "4")], "")
            .await
            .status,
        StatusCode::CONFLICT
    );
    assert_eq!(
        upstream.arrived().len(),
        before,
        "rejected reads never reach the upstream"
    );
    assert_eq!(
        send(Method::GET, &proxy.url("/k"), &[("fencing-token", "5")], "")
            .await
            .status,
        StatusCode::OK
    );
}

/// An admin advance fences out the next lower write, with no write at the higher token.
#[tokio::test]
async fn admin_advance_fences_out_lower_writes() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);
    assert_eq!(put(&proxy.url("/k"), 1, "x").await.status, StatusCode::OK);

    let advanced = send(
        Method::POST,
        &proxy.admin_url("/v1/fences/default"),
        &[("content-type", "application/json")],
        r#"{"token":4}"#,
    )
    .await;
    assert_eq!(advanced.status, StatusCode::OK);
    assert_eq!(advanced.json()["advanced"], true);
    assert_eq!(advanced.json()["token"], 4);
    let again = send(
        Method::POST,
        &proxy.admin_url("/v1/fences/default"),
        &[("content-type", "application/json")],
        r#"{"token":4}"#,
    )
    .await;
    assert_eq!(again.json()["advanced"], false);
    let lower = send(
        Method::POST,
        &proxy.admin_url("/v1/fences/default"),
        &[("content-type", "application/json")],
        r#"{"token":2}"#,
    )
    .await;
    assert_eq!(lower.status, StatusCode::CONFLICT);
    assert_eq!(lower.header("fencing-token-current").as_deref(), Some("4"));

    assert_eq!(
        put(&proxy.url("/k"), 1, "stale").await.status,
        StatusCode::CONFLICT
    );
    let list = send(Method::GET, &proxy.admin_url("/v1/fences"), &[], "")
        .await
        .json();
    assert_eq!(
        list["fences"],
        serde_json::json!([{"scope": "default", "token": 4}])
    );
    assert_eq!(tokens(&upstream), vec!["1"]);

    let bad = send(
        Method::POST,
        &proxy.admin_url("/v1/fences/default"),
        &[("content-type", "application/json")],
        "{}",
    )
    .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    let metrics = send(Method::GET, &proxy.admin_url("/metrics"), &[], "")
        .await
        .text();
    assert!(
        metrics.contains("palisade_proxy_rejections_total"),
        "{metrics}"
    );
    assert!(
        metrics.contains("palisade_proxy_fence_advances_total"),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"palisade_proxy_requests_total{class="write",outcome="forwarded"} 1"#),
        "one write was forwarded: {metrics}"
    );
    assert!(
        metrics.contains("palisade_proxy_upstream_seconds_count 1"),
        "one upstream latency recorded: {metrics}"
    );
    assert_eq!(
        send(Method::GET, &proxy.admin_url("/healthz"), &[], "")
            .await
            .status,
        StatusCode::OK
    );
}

/// Scopes are independent, and routes map path prefixes to scopes.
#[tokio::test]
async fn scopes_are_independent_and_routes_choose_them() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        "[[routes]]\nprefix = \"/billing/\"\nscope = \"billing\"\n",
    )
    .unwrap();
    let proxy = start_proxy(
        dir.path(),
        &[
            "--upstream",
            &upstream.url(),
            "--config",
            config.to_str().unwrap(),
        ],
    );
    assert_eq!(
        put(&proxy.url("/billing/x"), 9, "a").await.status,
        StatusCode::OK
    );
    assert_eq!(
        put(&proxy.url("/other"), 2, "b").await.status,
        StatusCode::OK,
        "default scope is separate"
    );
    let scoped = send(
        Method::PUT,
        &proxy.url("/other"),
        &[("fencing-token", "1"), ("fencing-scope", "jobs")],
        "c",
    )
    .await;
    assert_eq!(scoped.status, StatusCode::OK);
    assert_eq!(
        put(&proxy.url("/billing/y"), 8, "d").await.status,
        StatusCode::CONFLICT
    );
    let fence = send(Method::GET, &proxy.admin_url("/v1/fences/billing"), &[], "")
        .await
        .json();
    assert_eq!(fence["token"], 9);
    let unseen = send(Method::GET, &proxy.admin_url("/v1/fences/never"), &[], "")
        .await
        .json();
    assert_eq!(unseen["token"], 0);
}

/// The embedded object store: PUT, GET with the writer's token, list, DELETE; stale
/// writes rejected; objects survive a restart.
#[tokio::test]
async fn embedded_store_records_the_writing_token_and_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_proxy(dir.path(), &[]);
    assert_eq!(
        put(&proxy.url("/ledger/1"), 3, "one").await.status,
        StatusCode::OK
    );
    assert_eq!(
        put(&proxy.url("/ledger/2"), 4, "two").await.status,
        StatusCode::OK
    );
    assert_eq!(
        put(&proxy.url("/ledger/3"), 3, "stale").await.status,
        StatusCode::CONFLICT
    );
    drop(proxy);

    let proxy = start_proxy(dir.path(), &[]);
    let got = send(Method::GET, &proxy.url("/ledger/1"), &[], "").await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.text(), "one");
    assert_eq!(got.header("fencing-token").as_deref(), Some("3"));
    assert_eq!(
        got.header("palisade-revision").as_deref(),
        Some("1"),
        "first write applied"
    );
    let list = send(Method::GET, &proxy.url("/ledger/?list"), &[], "")
        .await
        .json();
    let keys: Vec<&str> = list["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, vec!["ledger/1", "ledger/2"]);
    assert_eq!(list["keys"][1]["token"], 4);
    assert_eq!(
        list["keys"][1]["revision"], 2,
        "revisions give the apply order"
    );
    let deleted = client::send(
        Method::DELETE,
        &proxy.url("/ledger/1"),
        &[("fencing-token", "4")],
        "",
    )
    .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(
        send(Method::GET, &proxy.url("/ledger/1"), &[], "")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

/// An admin advance answers only once lower-token writes in flight have finished, so a
/// node that has announced knows its predecessor's writes are done; past the barrier
/// deadline it gets 503, with the fence raised all the same.
#[tokio::test]
async fn admin_advance_waits_for_lower_writes_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let (upstream, proxy) = proxy_with_upstream(dir.path(), BARRIER_1500_MS).await;
    let low = hold_in_flight(&upstream, &proxy, "/slow", 1).await;
    let admin = proxy.admin_url("/v1/fences/default");
    let advance = tokio::spawn(async move {
        send(
            Method::POST,
            &admin,
            &[("content-type", "application/json")],
            r#"{"token":2}"#,
        )
        .await
    });
    // Show that the advance does not answer while the token-1 write is in flight.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !advance.is_finished(),
        "the admin advance must wait for the lower write"
    );
    upstream.release("/slow");
    assert_eq!(low.await.unwrap().status, StatusCode::OK);
    let answer = advance.await.unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["advanced"], true);

    // Held past the deadline: 503, and the fence is raised anyway.
    let held = hold_in_flight(&upstream, &proxy, "/slow", 2).await;
    let late = send(
        Method::POST,
        &proxy.admin_url("/v1/fences/default"),
        &[("content-type", "application/json")],
        r#"{"token":3}"#,
    )
    .await;
    assert_eq!(
        late.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        late.text()
    );
    let fence = send(Method::GET, &proxy.admin_url("/v1/fences/default"), &[], "")
        .await
        .json();
    assert_eq!(fence["token"], 3);
    upstream.release("/slow");
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
}

/// A client that gives up on a write does not cancel it: the proxy keeps it in flight
/// until the upstream answers, so a higher-token write still waits for it and the
/// upstream applies them in token order.
#[tokio::test]
async fn abandoned_lower_write_still_holds_back_higher_writes() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);
    upstream.hold("/slow");
    let impatient = palisade_cluster::client::try_send_within(
        Method::PUT,
        &proxy.url("/slow"),
        &[("fencing-token", "1")],
        "low",
        Duration::from_millis(300),
    )
    .await;
    assert!(impatient.is_err(), "the client gave up: {impatient:?}");
    let url = proxy.url("/fast");
    let high = tokio::spawn(async move { put(&url, 2, "high").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        upstream.arrived().len(),
        1,
        "token 2 waits for the abandoned token-1 write"
    );
    upstream.release("/slow");
    assert_eq!(high.await.unwrap().status, StatusCode::OK);
    assert_eq!(tokens(&upstream), vec!["1", "2"], "applied in token order");
}
