//! Named leaderships end to end: real `palisade node` processes grant named scopes to
//! sessions of clients that are not raft members, and fence every grant at a real
//! `palisade proxy` before the campaign answers.

use std::collections::BTreeSet;
use std::time::Duration;

use http::{Method, StatusCode};
use palisade_cluster::{Cluster, ClusterOptions, ClusterSpec};
use palisade_protocol::headers::{FENCING_SCOPE, FENCING_TOKEN, FENCING_TOKEN_CURRENT};
use palisade_protocol::problem::kind;
use palisade_tests::client::{Answer, send};
use palisade_tests::fixtures::first_announced_leader;
use palisade_tests::process::start_cluster;

/// Generous bound for an election at 20 ms ticks on a loaded 2-core machine.
const ELECTION_TIMEOUT: Duration = Duration::from_secs(20);
/// The sessions' TTL in these tests.
const TTL_MS: u64 = 2_000;
/// How often a kept-alive session sends a keepalive (a third of the TTL, as the clients).
const KEEPALIVE_EVERY: Duration = Duration::from_millis(TTL_MS / 3);

/// Three nodes at 20 ms ticks announcing to one proxy that takes client-chosen scopes.
fn cluster(dir: &std::path::Path) -> Cluster {
    crate::use_tested_binary();
    let spec = ClusterSpec {
        nodes: 3,
        node_flags: vec!["--tick-ms".into(), "20".into()],
        proxy_flags: vec!["--client-scopes".into()],
    };
    start_cluster(dir, &spec, &ClusterOptions::default())
}

/// A JSON request to a node's API.
async fn call(method: Method, url: &str, body: &serde_json::Value) -> Answer {
    let body = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    send(method, url, &[("content-type", "application/json")], body).await
}

/// Opens a session on `api` (the leader's API URL), its id.
async fn open(api: &str) -> String {
    let answer = call(
        Method::POST,
        &format!("{api}/v1/sessions"),
        &serde_json::json!({"ttl_ms": TTL_MS}),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "open: {:?}", answer.json());
    answer.json()["id"].as_str().unwrap().to_owned()
}

/// A write through the proxy to `path` in scope `scope` with `token`.
async fn write(cluster: &Cluster, path: &str, scope: &str, token: u64) -> Answer {
    let token = token.to_string();
    send(
        Method::PUT,
        &cluster.proxy.url(path),
        &[
            (FENCING_TOKEN.as_str(), token.as_str()),
            (FENCING_SCOPE.as_str(), scope),
        ],
        "x",
    )
    .await
}

/// Keeps `session` alive on `api` until the task is aborted; panics if the leader ever
/// says the session is unknown.
fn keep_alive(api: String, session: String) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let answer = call(
                Method::POST,
                &format!("{api}/v1/sessions/{session}/keepalive"),
                &serde_json::Value::Null,
            )
            .await;
            assert_ne!(
                answer.status,
                StatusCode::NOT_FOUND,
                "session {session} was expired while kept alive"
            );
            tokio::time::sleep(KEEPALIVE_EVERY).await;
        }
    })
}

/// Goal: the scenario over HTTP: a holder that stops keeping its session alive
/// (a paused worker) loses the scope when the session expires; the next waiter gets a
/// higher token; the proxy's fence for the scope is at that token before the waiter's
/// campaign answers; the old holder's write is refused with 409 and the new one's is
/// admitted; a campaign past its timeout is 409 `campaign-timeout`; the cluster's own
/// scope cannot be campaigned for.
/// Method: three nodes announcing to a proxy; sessions A and B (TTL 2 s) on the leader;
/// A campaigns for `billing` and writes; B campaigns with a 1 s timeout (409), then again
/// with 15 s while only B is kept alive; read the proxy's fence the moment B's grant
/// arrives; then both write.
#[tokio::test]
async fn an_expired_holder_is_fenced_out_before_the_next_grant_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path());
    let leader = first_announced_leader(&cluster, ELECTION_TIMEOUT).await;
    let api = cluster.node(leader.node_id).unwrap().api_url("");
    let api = api.trim_end_matches('/').to_owned();
    let (a, b) = (open(&api).await, open(&api).await);
    let campaign = |session: &str, timeout_ms: u64| {
        let url = format!("{api}/v1/scopes/billing/campaign?timeout_ms={timeout_ms}");
        let body = serde_json::json!({ "session": session });
        async move { call(Method::POST, &url, &body).await }
    };
    let first = campaign(&a, 5_000).await;
    assert_eq!(first.status, StatusCode::OK, "{:?}", first.json());
    let token_a = first.json()["token"].as_u64().unwrap();
    assert_eq!(
        cluster.proxy_fence("billing").await,
        Some(token_a),
        "fenced before the answer"
    );
    assert_eq!(
        write(&cluster, "/billing/1", "billing", token_a)
            .await
            .status,
        StatusCode::OK
    );

    let keeper_b = keep_alive(api.clone(), b.clone());
    let timed_out = campaign(&b, 1_000).await;
    assert_eq!(timed_out.status, StatusCode::CONFLICT);
    assert_eq!(
        timed_out.problem().map(|p| p.kind().to_owned()),
        Some(kind::CAMPAIGN_TIMEOUT.to_owned())
    );
    let own = call(
        Method::POST,
        &format!("{api}/v1/scopes/default/campaign"),
        &serde_json::json!({"session": b}),
    )
    .await;
    assert_eq!(
        own.status,
        StatusCode::CONFLICT,
        "the cluster's own scope: {:?}",
        own.json()
    );

    // A is never kept alive: it expires TTL_MS after it was opened, and B is granted.
    let second = campaign(&b, 15_000).await;
    let fence_then = cluster.proxy_fence("billing").await;
    assert_eq!(second.status, StatusCode::OK, "{:?}", second.json());
    let token_b = second.json()["token"].as_u64().unwrap();
    assert!(
        token_b > token_a,
        "the next grant's token is higher: {token_b} > {token_a}"
    );
    assert_eq!(
        fence_then,
        Some(token_b),
        "the proxy fenced B's token before B got it"
    );
    let stale = write(&cluster, "/billing/2", "billing", token_a).await;
    assert_eq!(
        stale.status,
        StatusCode::CONFLICT,
        "A's write after its expiry"
    );
    assert_eq!(
        stale
            .headers
            .get(FENCING_TOKEN_CURRENT.as_str())
            .and_then(|v| v.to_str().ok()),
        Some(token_b.to_string().as_str())
    );
    assert_eq!(
        write(&cluster, "/billing/3", "billing", token_b)
            .await
            .status,
        StatusCode::OK
    );
    let gone = call(
        Method::POST,
        &format!("{api}/v1/sessions/{a}/keepalive"),
        &serde_json::Value::Null,
    )
    .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "A's session expired");
    keeper_b.abort();
}

/// Goal: a failover never expires a session that keeps alive: with the leader killed
/// with `kill -9`, every kept-alive session survives (the new leader grants each a full
/// TTL), and the scopes they hold keep their holders and tokens.
/// Method: 20 sessions (TTL 2 s) each holding a scope, kept alive every 2/3 s by a task
/// that finds the leader among the nodes; kill -9 the leader; after the new leader is
/// established, wait three TTLs; every session and every grant is still there.
#[tokio::test]
async fn no_session_expires_when_the_leader_is_killed() {
    const SESSIONS: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = cluster(dir.path());
    let leader = first_announced_leader(&cluster, ELECTION_TIMEOUT).await;
    let api = cluster
        .node(leader.node_id)
        .unwrap()
        .api_url("")
        .trim_end_matches('/')
        .to_owned();
    let urls: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| n.api_url("").trim_end_matches('/').to_owned())
        .collect();
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(open(&api).await);
    }
    let keeper = {
        let urls = urls.clone();
        let sessions = sessions.clone();
        tokio::spawn(async move {
            loop {
                for session in &sessions {
                    for url in &urls {
                        let answer = palisade_tests::client::try_send_within(
                            Method::POST,
                            &format!("{url}/v1/sessions/{session}/keepalive"),
                            &[],
                            bytes::Bytes::new(),
                            Duration::from_millis(300),
                        )
                        .await;
                        if let Ok(answer) = answer {
                            assert_ne!(
                                answer.status,
                                StatusCode::NOT_FOUND,
                                "session {session} expired during the failover"
                            );
                            if answer.status == StatusCode::OK {
                                break;
                            }
                        }
                    }
                }
                tokio::time::sleep(KEEPALIVE_EVERY / 2).await;
            }
        })
    };
    let mut grants = Vec::new();
    for (n, session) in sessions.iter().enumerate() {
        let url = format!("{api}/v1/scopes/job-{n}/campaign");
        let grant = call(Method::POST, &url, &serde_json::json!({"session": session})).await;
        assert_eq!(grant.status, StatusCode::OK, "{:?}", grant.json());
        grants.push((session.clone(), grant.json()["token"].as_u64().unwrap()));
    }
    cluster.node_mut(leader.node_id).unwrap().kill9();
    let next = cluster
        .wait_for_leader(leader.term, Some(leader.node_id), ELECTION_TIMEOUT)
        .await
        .expect("a new leader after kill -9");
    tokio::time::sleep(Duration::from_millis(3 * TTL_MS)).await;
    assert!(
        !keeper.is_finished(),
        "the keepalive task saw an expired session"
    );
    let new_api = cluster
        .node(next.node_id)
        .unwrap()
        .api_url("")
        .trim_end_matches('/')
        .to_owned();
    let live = call(
        Method::GET,
        &format!("{new_api}/v1/sessions"),
        &serde_json::Value::Null,
    )
    .await;
    let live: BTreeSet<String> = live.json()["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        live,
        sessions.iter().cloned().collect(),
        "every session survived the failover"
    );
    for (n, (session, token)) in grants.iter().enumerate() {
        let view = call(
            Method::GET,
            &format!("{new_api}/v1/scopes/job-{n}"),
            &serde_json::Value::Null,
        )
        .await
        .json();
        assert_eq!(
            (view["session"].as_str(), view["token"].as_u64()),
            (Some(session.as_str()), Some(*token))
        );
    }
    keeper.abort();
}
