//! The Rust client (`palisade-client`) against a real `palisade proxy` process: the token
//! on writes, the typed rejection that stops a stale writer before it reaches the proxy
//! again, retries of idempotent requests, and timeouts reported as unknown outcomes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade_client::{
    ClientError, FencedClient, ProxyAdmin, StaticToken, StatusCode, TokenSource,
};
use palisade_cluster::wait;
use palisade_protocol::DEFAULT_SCOPE;
use palisade_protocol::admin::METRICS_PATH;
use palisade_tests::client::send;
use palisade_tests::fixtures::{hold_in_flight, proxy_with_upstream};
use palisade_tests::process::{ProxyProcess, start_proxy};
use palisade_tests::upstream::RecordingUpstream;

/// Longest a condition in these tests may take.
const WAIT: Duration = Duration::from_secs(10);

/// The sum of a counter's series on the proxy's `/metrics`, optionally only the series
/// whose labels contain `label`.
async fn counter(proxy: &ProxyProcess, name: &str, label: &str) -> u64 {
    let text = send(http::Method::GET, &proxy.admin_url(METRICS_PATH), &[], "")
        .await
        .text();
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .map(|l| {
            let value = l.rsplit(' ').next().unwrap();
            value
                .parse::<u64>()
                .unwrap_or_else(|e| panic!("counter {name} value {value:?}: {e}"))
        })
        .sum()
}

fn static_client(proxy: &ProxyProcess, token: u64) -> (Arc<StaticToken>, FencedClient) {
    let source = Arc::new(StaticToken::new(token));
    let client = FencedClient::builder(&proxy.url(""), source.clone())
        .build()
        .unwrap();
    (source, client)
}

/// Goal: the client attaches its token and scope; the embedded store records the token,
/// a GET reports it, and the scope's fence is at it. Method: a client with a static
/// token 3 and scope `billing` puts, gets and deletes (to a proxy with client scopes
/// on); read both scopes' fences.
#[tokio::test]
async fn token_is_attached_and_recorded_by_the_store() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_proxy(dir.path(), &["--client-scopes"]);
    let client = FencedClient::builder(&proxy.url(""), Arc::new(StaticToken::new(3)))
        .scope("billing")
        .build()
        .unwrap();

    let stored = client.put("charges/sub-1", "4200 cents").await.unwrap();
    assert_eq!(stored.status, StatusCode::OK);
    assert_eq!(stored.sent_token, Some(3));
    assert_eq!(stored.attempts, 1);

    let got = client.get("/charges/sub-1").await.unwrap();
    assert_eq!(got.text(), "4200 cents");
    assert_eq!(
        got.stored_token(),
        Some(3),
        "the store reports the writer's token"
    );
    assert_eq!(got.sent_token, None, "reads carry no token");

    let admin = ProxyAdmin::new(&proxy.admin_url("")).unwrap();
    assert_eq!(admin.fence("billing").await.unwrap().token, 3);
    assert_eq!(
        admin.fence(DEFAULT_SCOPE).await.unwrap().token,
        0,
        "the scope header was sent"
    );

    let deleted = client.delete("charges/sub-1").await.unwrap();
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let missing = client.get("charges/sub-1").await.unwrap_err();
    assert_eq!(missing.status(), Some(StatusCode::NOT_FOUND), "{missing}");
}

/// Goal: after a new leader fences the scope, the old leader's write is `Fenced` with the
/// numbers; its source is marked, so its next writes fail with `NotLeader` and reach
/// neither the upstream nor even the proxy. Method: advance to 5, write with 3, then
/// three more writes; compare the proxy's request counter and the upstream.
#[tokio::test]
async fn stale_write_is_fenced_and_later_writes_never_leave_the_process() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);
    let admin = ProxyAdmin::new(&proxy.admin_url("")).unwrap();
    let advanced = admin.advance(DEFAULT_SCOPE, 5).await.unwrap();
    assert!(advanced.advanced);

    let (source, client) = static_client(&proxy, 3);
    let err = client.put("/ledger/1", "stale").await.unwrap_err();
    let ClientError::Fenced {
        scope,
        presented,
        current,
    } = &err
    else {
        panic!("expected Fenced, got {err:?}");
    };
    assert_eq!(
        (scope.as_str(), *presented, *current),
        (DEFAULT_SCOPE, 3, 5)
    );
    assert_eq!(
        err.to_string(),
        "stale fencing token 3 for scope default: current is 5"
    );
    let now = source.current().await;
    assert!(!now.is_leader && now.write_token().is_none(), "{now:?}");

    let requests_before = counter(&proxy, "palisade_proxy_requests_total", "").await;
    assert!(
        requests_before >= 1,
        "the proxy counted the fenced write, so the counter read below is the real one"
    );
    for attempt in [
        client.put("/ledger/2", "x").await,
        client.delete("/ledger/1").await,
        client.post("/ledger/3", "y").await,
    ] {
        let err = attempt.unwrap_err();
        assert!(
            matches!(err, ClientError::NotLeader { term: 3, .. }),
            "{err:?}"
        );
    }
    assert_eq!(
        counter(&proxy, "palisade_proxy_requests_total", "").await,
        requests_before,
        "refused writes never reached the proxy"
    );
    assert!(
        upstream.arrived().is_empty(),
        "nothing reached the upstream: {:?}",
        upstream.arrived()
    );
    // The admin API also reports a stale advance as Fenced.
    let stale_advance = admin.advance(DEFAULT_SCOPE, 4).await.unwrap_err();
    assert!(
        matches!(
            stale_advance,
            ClientError::Fenced {
                presented: 4,
                current: 5,
                ..
            }
        ),
        "{stale_advance:?}"
    );
}

/// Goal: a PUT answered 503 by the proxy's in-flight barrier (a lower-token write is held
/// at the upstream) is retried after `Retry-After` and succeeds once the lower write
/// completes; a POST without an idempotency key in the same spot is not retried.
/// Method: a 300 ms barrier; hold a token-1 write, PUT with 2 and release after the first
/// 503; then hold a token-2 write and POST with 3; count barrier timeouts.
#[tokio::test]
async fn idempotent_put_is_retried_and_plain_post_is_not() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let (upstream, proxy) =
        proxy_with_upstream(dir.path(), "[limits]\nbarrier_timeout_ms = 300\n").await;
    let barrier_timeouts = || counter(&proxy, "palisade_proxy_rejections_total", "barrier-timeout");

    // Token 1 held in flight; the client's token-2 PUT waits at the barrier and gets 503.
    let low = hold_in_flight(&upstream, &proxy, "/slow", 1).await;
    let (_, client) = static_client(&proxy, 2);
    let retried = async {
        let response = client.put("/fast", "high").await;
        (response, Instant::now())
    };
    // Release the held write only once the first attempt has been answered 503.
    let release = async {
        wait::poll(WAIT, || async {
            (barrier_timeouts().await >= 1).then_some(())
        })
        .await
        .expect("timed out waiting for a barrier 503");
        upstream.release("/slow");
    };
    let ((response, _), ()) = tokio::join!(retried, release);
    let response = response.unwrap();
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.attempts, 2, "one 503, then success");
    assert_eq!(low.await.unwrap().status, http::StatusCode::OK);
    let applied: Vec<(String, Option<String>)> = upstream
        .applied()
        .into_iter()
        .map(|a| (a.path, a.token))
        .collect();
    assert_eq!(
        applied,
        vec![
            ("/slow".to_owned(), Some("1".to_owned())),
            ("/fast".to_owned(), Some("2".to_owned()))
        ],
        "the retried PUT was applied once, after the lower write"
    );

    // Same spot for a POST: one attempt, and the 503 is the answer.
    let held = hold_in_flight(&upstream, &proxy, "/slow", 2).await;
    let (_, client3) = static_client(&proxy, 3);
    let before = barrier_timeouts().await;
    let err = client3.post("/fast", "once").await.unwrap_err();
    assert_eq!(
        err.status(),
        Some(StatusCode::SERVICE_UNAVAILABLE),
        "{err:?}"
    );
    assert_eq!(
        barrier_timeouts().await,
        before + 1,
        "the POST was sent once"
    );
    upstream.release("/slow");
    assert_eq!(held.await.unwrap().status, http::StatusCode::OK);
}

/// Goal: a write held at the upstream past the client's timeout is `Indeterminate`, not a
/// failure: it did reach the storage. A POST is sent once; a PUT is retried, then
/// reported the same way; neither costs the leadership. Method: a 400 ms client timeout
/// with one retry; POST and PUT to a path held at the upstream.
#[tokio::test]
async fn timeout_is_reported_as_indeterminate() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let proxy = start_proxy(dir.path(), &["--upstream", &upstream.url()]);
    let client = FencedClient::builder(&proxy.url(""), Arc::new(StaticToken::new(1)))
        .request_timeout(Duration::from_millis(400))
        .retries(1)
        .backoff(Duration::from_millis(10), Duration::from_millis(20))
        .build()
        .unwrap();
    upstream.hold("/held");

    let err = client.post("/held", "charge").await.unwrap_err();
    assert!(
        matches!(err, ClientError::Indeterminate { attempts: 1, .. }),
        "a POST is sent once: {err:?}"
    );
    assert!(err.is_indeterminate() && !err.is_leadership_lost());
    assert!(err.to_string().contains("may have been applied"), "{err}");

    let err = client.put("/held", "charge").await.unwrap_err();
    assert!(
        matches!(err, ClientError::Indeterminate { attempts: 2, .. }),
        "a PUT is retried once, then reported unknown: {err:?}"
    );
    assert_eq!(
        client.source().current().await.write_token(),
        Some(1),
        "a timeout does not cost the leadership"
    );

    // Whether they are applied now depends on the storage: these three arrived at it and
    // wait there. That is what "indeterminate" means to the caller.
    assert_eq!(
        upstream.arrived().len(),
        3,
        "all three attempts reached the storage"
    );
    assert!(upstream.applied().is_empty());
    upstream.release("/held");
}
