//! The proxy's fencing rules, end to end: a real `palisade proxy` process in front of a
//! recording upstream that logs what really reached the storage.

use std::time::Duration;

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, Method, StatusCode};
use palisade_client::ClientError;
use palisade_protocol::headers::{
    FENCING_SCOPE, FENCING_TOKEN, FENCING_TOKEN_CURRENT, PROBLEM_JSON, REVISION,
};
use palisade_protocol::{DEFAULT_SCOPE, SCOPE_BYTES_MAX};
use palisade_tests::client::{put, send};
use palisade_tests::fixtures::{admin, hold_in_flight, proxy_with_upstream};
use palisade_tests::process::start_proxy;
use palisade_tests::upstream::RecordingUpstream;

/// `Fencing-Token`, in a static so that the raw requests below can borrow its name.
static TOKEN: HeaderName = FENCING_TOKEN;
/// `Fencing-Scope`, likewise.
static SCOPE: HeaderName = FENCING_SCOPE;

/// A proxy config with a short barrier deadline, so 503 tests are quick.
const BARRIER_1500_MS: &str = "[limits]\nbarrier_timeout_ms = 1500\n";

fn tokens(upstream: &RecordingUpstream) -> Vec<String> {
    upstream
        .applied()
        .into_iter()
        .map(|a| a.token.unwrap_or_default())
        .collect()
}

/// Goal: a write with a token below the fence gets 409 with the numbers, and the
/// upstream never sees it. Method: write with token 5, then 4; read the problem body and
/// what arrived upstream.
#[tokio::test]
async fn stale_token_is_rejected_and_never_reaches_upstream() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);

    assert_eq!(
        put(&proxy.url("/k"), 5, "five").await.status,
        StatusCode::OK
    );
    let stale = put(&proxy.url("/k"), 4, "four").await;
    assert_eq!(stale.status, StatusCode::CONFLICT);
    assert_eq!(
        stale.header(FENCING_TOKEN_CURRENT.as_str()).as_deref(),
        Some("5")
    );
    assert_eq!(
        stale.header(CONTENT_TYPE.as_str()).as_deref(),
        Some(PROBLEM_JSON)
    );
    let problem = stale.problem().expect("a problem+json body");
    assert_eq!((problem.status, problem.kind()), (409, "stale-token"));
    assert_eq!(problem.scope.as_deref(), Some(DEFAULT_SCOPE));
    assert_eq!((problem.presented, problem.current), (Some(4), Some(5)));

    assert_eq!(
        tokens(&upstream),
        vec!["5"],
        "only the token-5 write reached the upstream"
    );
    assert_eq!(upstream.arrived().len(), 1);
}

/// Goal: an equal token is forwarded; a higher one advances the fence, and the advance
/// survives a clean restart (SIGTERM) and a `kill -9` of the proxy process. Method: write
/// 3, 3, 7; SIGTERM; restart; stale 6, then 9; `kill -9`; restart; read the fence.
#[tokio::test]
async fn higher_token_advance_survives_restart_and_kill9() {
    crate::use_tested_binary();
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
    let fence = admin(&proxy).fence(DEFAULT_SCOPE).await.unwrap();
    assert_eq!(
        fence.token, 9,
        "the fence acknowledged before kill -9 is still there"
    );
    assert_eq!(
        put(&proxy.url("/a"), 8, "stale").await.status,
        StatusCode::CONFLICT
    );
    assert_eq!(tokens(&upstream), vec!["3", "3", "7", "9"]);
}

/// Goal: a missing token is 428; a malformed, negative, overflowing or repeated token is
/// 400; a bad scope is 400; all as problem+json, and none of them reaches the upstream.
/// Method: raw requests with exactly those headers, to a proxy with client scopes on (so
/// that the scope rule, not the switch, refuses the bad scopes); then what arrived
/// upstream.
#[tokio::test]
async fn malformed_requests_get_their_status_and_nothing_is_forwarded() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(
        dir.path(),
        &["--upstream", &upstream.url(), "--client-scopes"],
    );
    let url = proxy.url("/k");

    let missing = send(Method::PUT, &url, &[], "x").await;
    assert_eq!(missing.status, StatusCode::PRECONDITION_REQUIRED);
    assert_eq!(missing.problem().map(|p| p.status), Some(428));

    let cases: &[&[(&str, &str)]] = &[
        &[(TOKEN.as_str(), "abc")],
        &[(TOKEN.as_str(), "-1")],
        &[(TOKEN.as_str(), "1.5")],
        &[(TOKEN.as_str(), "18446744073709551616")],
        &[(TOKEN.as_str(), "1"), (TOKEN.as_str(), "2")],
        &[(TOKEN.as_str(), "1"), (SCOPE.as_str(), "bad scope!")],
        &[(TOKEN.as_str(), "1"), (SCOPE.as_str(), "")],
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
            answer.problem().map(|p| p.status),
            Some(400),
            "{headers:?}: {}",
            answer.text()
        );
    }
    let long_scope = "s".repeat(SCOPE_BYTES_MAX + 1);
    let answer = send(
        Method::PUT,
        &url,
        &[(TOKEN.as_str(), "1"), (SCOPE.as_str(), &long_scope)],
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

/// Goal: while a lower-token write is held in flight at the upstream, a higher-token
/// write waits, and the upstream applies them in token order; with the lower one held
/// past the barrier deadline, the higher one is answered 503 with Retry-After and not
/// forwarded. Method: hold token 1 at the upstream, send token 2, release; then hold
/// token 2 past a 1.5 s barrier deadline and send token 3.
#[tokio::test]
async fn higher_token_waits_for_lower_in_flight_and_times_out_with_503() {
    crate::use_tested_binary();
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
    assert!(timed_out.header(RETRY_AFTER.as_str()).is_some());
    assert_eq!(
        upstream.arrived().len(),
        3,
        "the 503 request was not forwarded"
    );
    upstream.release("/slow");
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    assert_eq!(tokens(&upstream), vec!["1", "2", "2"]);
}

/// Goal: reads pass through without a token; with `--fence-reads`, they need one and are
/// fenced. Method: reads with no, stale and current tokens on a proxy without and with
/// the flag.
#[tokio::test]
async fn reads_pass_unfenced_and_are_fenced_when_configured() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);
    assert_eq!(put(&proxy.url("/k"), 5, "x").await.status, StatusCode::OK);
    assert_eq!(
        send(Method::GET, &proxy.url("/k"), &[], "").await.status,
        StatusCode::OK
    );
    let stale_read = send(Method::GET, &proxy.url("/k"), &[(TOKEN.as_str(), "1")], "").await;
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
        send(Method::GET, &proxy.url("/k"), &[(TOKEN.as_str(), "4")], "")
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
        send(Method::GET, &proxy.url("/k"), &[(TOKEN.as_str(), "5")], "")
            .await
            .status,
        StatusCode::OK
    );
}

/// Goal: an admin advance fences out the next lower write on the data path, with no
/// write at the higher token; the metrics count the one forwarded write and its upstream
/// latency. (The admin API's own answers are the subject of `proxy/tests/admin_api.rs`.)
/// Method: write with 1, advance to 4 through the typed admin client, write with 1
/// again; read what reached the upstream and `/metrics`.
#[tokio::test]
async fn admin_advance_fences_out_lower_writes() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);
    assert_eq!(put(&proxy.url("/k"), 1, "x").await.status, StatusCode::OK);

    let advanced = admin(&proxy).advance(DEFAULT_SCOPE, 4).await.unwrap();
    assert!(advanced.advanced && advanced.token == 4, "{advanced:?}");
    let stale = put(&proxy.url("/k"), 1, "stale").await;
    assert_eq!(stale.status, StatusCode::CONFLICT);
    assert_eq!(
        stale.problem().and_then(|p| p.current),
        Some(4),
        "{}",
        stale.text()
    );
    assert_eq!(tokens(&upstream), vec!["1"]);

    let metrics = send(
        Method::GET,
        &proxy.admin_url(palisade_protocol::admin::METRICS_PATH),
        &[],
        "",
    )
    .await
    .text();
    for line in [
        r#"palisade_proxy_requests_total{class="write",outcome="forwarded"} 1"#,
        "palisade_proxy_upstream_seconds_count 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no line `{line}` in:\n{metrics}"
        );
    }
    assert!(
        metrics.contains("palisade_proxy_fence_advances_total"),
        "{metrics}"
    );
}

/// Goal: scopes are independent, routes map path prefixes to scopes, and with
/// `client_scopes = true` a client may name its scope in `Fencing-Scope`. Method: write
/// to a routed prefix, the default scope and a named scope with unrelated tokens; a stale
/// write on the route; read each fence.
#[tokio::test]
async fn scopes_are_independent_and_routes_choose_them() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        "client_scopes = true\n[[routes]]\nprefix = \"/billing/\"\nscope = \"billing\"\n",
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
        &[(TOKEN.as_str(), "1"), (SCOPE.as_str(), "jobs")],
        "c",
    )
    .await;
    assert_eq!(scoped.status, StatusCode::OK);
    assert_eq!(
        put(&proxy.url("/billing/y"), 8, "d").await.status,
        StatusCode::CONFLICT
    );
    let admin = admin(&proxy);
    assert_eq!(admin.fence("billing").await.unwrap().token, 9);
    assert_eq!(admin.fence("jobs").await.unwrap().token, 1);
    assert_eq!(admin.fence(DEFAULT_SCOPE).await.unwrap().token, 2);
    assert_eq!(admin.fence("never").await.unwrap().token, 0);
}

/// Goal: the embedded object store records the writing token and revision, lists keys in
/// apply order, deletes, rejects stale writes, and keeps its objects across a restart.
/// Method: PUT, stale PUT, restart, GET, list, DELETE, GET.
#[tokio::test]
async fn embedded_store_records_the_writing_token_and_survives_restart() {
    crate::use_tested_binary();
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
    assert_eq!(got.header(TOKEN.as_str()).as_deref(), Some("3"));
    assert_eq!(
        got.header(REVISION.as_str()).as_deref(),
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
    let deleted = send(
        Method::DELETE,
        &proxy.url("/ledger/1"),
        &[(TOKEN.as_str(), "4")],
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

/// Goal: an admin advance answers only once lower-token writes in flight have finished,
/// so a node that has announced knows its predecessor's writes are done; past the barrier
/// deadline it gets 503, with the fence raised all the same. Method: hold a token-1 write
/// at the upstream, advance to 2, release; hold a token-2 write past a 1.5 s deadline and
/// advance to 3.
#[tokio::test]
async fn admin_advance_waits_for_lower_writes_in_flight() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (upstream, proxy) = proxy_with_upstream(dir.path(), BARRIER_1500_MS).await;
    let low = hold_in_flight(&upstream, &proxy, "/slow", 1).await;
    let admin = admin(&proxy);
    let advancing = admin.clone();
    let advance = tokio::spawn(async move { advancing.advance(DEFAULT_SCOPE, 2).await });
    // Show that the advance does not answer while the token-1 write is in flight.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !advance.is_finished(),
        "the admin advance must wait for the lower write"
    );
    upstream.release("/slow");
    assert_eq!(low.await.unwrap().status, StatusCode::OK);
    let answer = advance.await.unwrap().unwrap();
    assert!(answer.advanced, "{answer:?}");

    // Held past the deadline: 503, and the fence is raised anyway.
    let held = hold_in_flight(&upstream, &proxy, "/slow", 2).await;
    let late = admin.advance(DEFAULT_SCOPE, 3).await.unwrap_err();
    assert_eq!(
        late.status(),
        Some(StatusCode::SERVICE_UNAVAILABLE),
        "{late}"
    );
    assert!(!matches!(late, ClientError::Fenced { .. }), "{late:?}");
    assert_eq!(admin.fence(DEFAULT_SCOPE).await.unwrap().token, 3);
    upstream.release("/slow");
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
}

/// Goal: the admin status (`/v1/status` and the page) answers while writes of the default
/// scope are in flight, counts them, and the proxy goes on serving. (Counting a busy
/// default scope once deadlocked a runtime thread on the scope's lock, and then every
/// request of the scope and the admin API with it.) Method: hold a token-1 write of the
/// default scope at the upstream; read the status and the page, each within 5 s; release;
/// write again, read the status again.
#[tokio::test]
async fn status_answers_while_default_scope_writes_are_in_flight() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (upstream, proxy) = proxy_with_upstream(dir.path(), "").await;
    let admin = admin(&proxy);
    let within = Duration::from_secs(5);
    let held = hold_in_flight(&upstream, &proxy, "/slow", 1).await;

    let status = tokio::time::timeout(within, admin.status())
        .await
        .expect("the status answered within 5 s with a write in flight")
        .unwrap();
    assert_eq!(status.barrier.in_flight, 1, "{status:?}");
    let fence = status.fences.iter().find(|f| f.scope == DEFAULT_SCOPE);
    assert_eq!(
        fence.map(|f| (f.token, f.in_flight)),
        Some((1, 1)),
        "{status:?}"
    );
    let page = palisade_tests::client::try_send_within(
        Method::GET,
        &proxy.admin_url("/"),
        &[],
        "",
        within,
    )
    .await
    .expect("the status page answered within 5 s with a write in flight");
    assert_eq!(page.status, StatusCode::OK);

    upstream.release("/slow");
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    assert_eq!(
        put(&proxy.url("/fast"), 1, "again").await.status,
        StatusCode::OK
    );
    let status = tokio::time::timeout(within, admin.status())
        .await
        .expect("the status answered within 5 s")
        .unwrap();
    assert_eq!(status.barrier.in_flight, 0, "{status:?}");
}

/// Goal: a client that gives up on a write does not cancel it: the proxy keeps it in
/// flight until the upstream answers, so a higher-token write still waits for it and the
/// upstream applies them in token order. Method: hold a token-1 write at the upstream,
/// give up on it after 300 ms, send token 2, release.
#[tokio::test]
async fn abandoned_lower_write_still_holds_back_higher_writes() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);
    upstream.hold("/slow");
    let impatient = palisade_tests::client::try_send_within(
        Method::PUT,
        &proxy.url("/slow"),
        &[(TOKEN.as_str(), "1")],
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
