//! Fleet mode (`palisade proxy --cluster`): real proxy processes hold leases and admit
//! writes only under them.
//!
//! One test runs against real `palisade node` processes started with `--lease-ms` and
//! `--announce` naming the proxies. The others use a lease endpoint that is a small
//! in-test server that speaks `POST /v1/lease` as a
//! node does: it grants the term the test sets, refuses proxies it does not list with 403
//! `unknown-proxy`, and can stall (answer nothing, as a stopped cluster does). The test
//! plays the new leader's part of the protocol itself: after moving the term it waits the
//! release wait (lease plus drift plus write bound) before using the new token.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use palisade_cluster::wait;
use palisade_protocol::Problem;
use palisade_protocol::lease::{LeaseGrant, LeaseRequest, LeaseView, UNKNOWN_PROXY};
use palisade_protocol::{DEFAULT_SCOPE, Scope};
use palisade_tests::client::put;
use palisade_tests::fixtures::resign;
use palisade_tests::process::{ProxyProcess, start_proxy};
use palisade_tests::upstream::RecordingUpstream;

/// The lease the fake cluster grants. Short, so that expiry tests are quick.
const LEASE_MS: u64 = 600;
/// The release wait a new leader would observe: lease, 1% drift, 500 ms write bound.
const RELEASE_WAIT_MS: u64 = LEASE_MS + LEASE_MS / 100 + 500;
/// How long the tests wait for a condition before failing.
const WAIT: Duration = Duration::from_secs(10);

/// What the fake cluster answers.
#[derive(Clone)]
struct FakeState {
    term: u64,
    /// Answer nothing (a stopped cluster).
    stalled: bool,
    /// Fleet names refused with 403 unknown-proxy.
    unknown: Vec<String>,
}

/// An in-test lease endpoint.
struct FakeCluster {
    addr: SocketAddr,
    state: Arc<Mutex<FakeState>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeCluster {
    async fn start(term: u64, unknown: &[&str]) -> Self {
        let state = Arc::new(Mutex::new(FakeState {
            term,
            stalled: false,
            unknown: unknown.iter().map(ToString::to_string).collect(),
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let state = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let state = Arc::clone(&state);
                        async move {
                            let body = req.into_body().collect().await?.to_bytes();
                            let request: LeaseRequest = serde_json::from_slice(&body).unwrap();
                            let now = state.lock().unwrap().clone();
                            if now.stalled {
                                std::future::pending::<()>().await;
                            }
                            let (status, json) = if now.unknown.contains(&request.proxy) {
                                let problem = Problem::new(
                                    StatusCode::FORBIDDEN,
                                    UNKNOWN_PROXY,
                                    format!("{} is not in --announce", request.proxy),
                                );
                                (StatusCode::FORBIDDEN, serde_json::to_vec(&problem).unwrap())
                            } else {
                                let grant = LeaseGrant {
                                    scope: Scope::new(DEFAULT_SCOPE).unwrap(),
                                    term: now.term,
                                    leader_id: 1,
                                    lease_ms: LEASE_MS,
                                };
                                (StatusCode::OK, serde_json::to_vec(&grant).unwrap())
                            };
                            let content_type = if status.is_success() {
                                "application/json"
                            } else {
                                "application/problem+json"
                            };
                            Ok::<_, hyper::Error>(
                                Response::builder()
                                    .status(status)
                                    .header(http::header::CONTENT_TYPE, content_type)
                                    .body(Full::new(Bytes::from(json)))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, state, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn set(&self, change: impl FnOnce(&mut FakeState)) {
        change(&mut self.state.lock().unwrap());
    }
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A proxy in fleet mode in front of `upstream`, following `cluster`.
fn fleet_proxy(
    dir: &std::path::Path,
    upstream: &RecordingUpstream,
    cluster: &str,
    extra: &[&str],
) -> ProxyProcess {
    let upstream = upstream.url();
    let mut args = vec!["--upstream", upstream.as_str(), "--cluster", cluster];
    args.extend_from_slice(extra);
    start_proxy(dir, &args)
}

/// The proxy's `GET /v1/lease`.
async fn lease_of(proxy: &ProxyProcess) -> LeaseView {
    let answer =
        palisade_tests::client::send(http::Method::GET, &proxy.admin_url("/v1/lease"), &[], "")
            .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    serde_json::from_slice(&answer.body).unwrap()
}

/// Goal: two proxies following one cluster admit the current term's token; once the
/// cluster moves to a new term (and the new leader's release wait has passed), the old
/// token is refused at BOTH proxies, also at the one that took no write of the new term.
/// Method: fake cluster at term 5; write 5 through A and B; move it to 6; wait the
/// release wait; write 6 through A only; then 5 through B.
#[tokio::test]
async fn old_term_is_refused_at_every_proxy_after_the_cluster_moves() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let cluster = FakeCluster::start(5, &[]).await;
    let a = fleet_proxy(&dir.path().join("a"), &upstream, &cluster.url(), &[]);
    let b = fleet_proxy(&dir.path().join("b"), &upstream, &cluster.url(), &[]);

    for proxy in [&a, &b] {
        let answer = put(&proxy.url("/k"), 5, "five").await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    }
    let view = lease_of(&b).await;
    assert_eq!((view.term, view.valid), (5, true), "{view:?}");
    assert!(view.renewals >= 1);

    cluster.set(|s| s.term = 6);
    tokio::time::sleep(Duration::from_millis(RELEASE_WAIT_MS)).await;
    let answer = put(&a.url("/k"), 6, "six").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());

    let stale = put(&b.url("/k"), 5, "late five").await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.text());
    let problem = stale.problem().unwrap();
    assert_eq!((problem.presented, problem.current), (Some(5), Some(6)));
    let tokens: Vec<String> = upstream
        .applied()
        .into_iter()
        .map(|w| w.token.unwrap_or_default())
        .collect();
    assert_eq!(
        tokens,
        vec!["5", "5", "6"],
        "the late 5 never reached the storage"
    );

    // A token the cluster never issued is refused too, and moves no fence.
    let ahead = put(&b.url("/k"), 9, "nine").await;
    assert_eq!(ahead.status, StatusCode::CONFLICT, "{}", ahead.text());
    assert_eq!(ahead.problem().unwrap().kind(), "token-not-issued");
    assert_eq!(b.fence(DEFAULT_SCOPE).await, Some(6));
}

/// Goal: with the whole cluster unreachable, writes turn to 503 lease-expired within one
/// lease (plus the renewal wait), nothing reaches the storage, and they succeed again
/// once the cluster answers.
/// Method: fake cluster stalls (answers nothing, as under SIGSTOP); write until 503; it
/// answers again; write until 200.
#[tokio::test]
async fn unreachable_cluster_turns_writes_to_503_and_back() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let cluster = FakeCluster::start(3, &[]).await;
    let proxy = fleet_proxy(dir.path(), &upstream, &cluster.url(), &[]);
    assert_eq!(put(&proxy.url("/k"), 3, "x").await.status, StatusCode::OK);

    cluster.set(|s| s.stalled = true);
    let stalled = Instant::now();
    let refused = wait::poll(WAIT, || async {
        let answer = put(&proxy.url("/k"), 3, "x").await;
        (answer.status == StatusCode::SERVICE_UNAVAILABLE).then_some(answer)
    })
    .await
    .expect("timed out waiting for a 503 lease-expired");
    // Bound: the lease (600 ms) plus one renewal wait (1 s default) plus slack for the
    // processes; the requirement is "within one lease", the rest is the refusal's wait.
    assert!(
        stalled.elapsed() < Duration::from_millis(LEASE_MS + 1_000 + 1_500),
        "{:?}",
        stalled.elapsed()
    );
    assert!(refused.header("retry-after").is_some());
    assert_eq!(refused.problem().unwrap().kind(), "lease-expired");
    let forwarded = upstream.applied().len();

    cluster.set(|s| s.stalled = false);
    wait::poll(WAIT, || async {
        (put(&proxy.url("/k"), 3, "x").await.status == StatusCode::OK).then_some(())
    })
    .await
    .expect("timed out waiting for writes admitted again");
    assert_eq!(
        upstream.applied().len(),
        forwarded + 1,
        "nothing was forwarded while refused"
    );
}

/// Goal: a proxy the cluster does not list gets no lease: its writes are 503 and the
/// reason is logged (lease-refused, unknown-proxy).
/// Method: the fake cluster refuses the fleet name `http://not-listed.invalid`; write;
/// read the lease view and the log.
#[tokio::test]
async fn unlisted_proxy_gets_no_lease() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let name = "http://not-listed.invalid";
    let cluster = FakeCluster::start(3, &[name]).await;
    let proxy = fleet_proxy(
        dir.path(),
        &upstream,
        &cluster.url(),
        &["--fleet-name", name],
    );
    let answer = put(&proxy.url("/k"), 3, "x").await;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.text()
    );
    assert!(answer.text().contains(UNKNOWN_PROXY), "{}", answer.text());
    // The proxy's log (stderr, in `proxy-N.log` of its directory) says why.
    let line = wait::poll(WAIT, || async {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .flat_map(|text| text.lines().map(str::to_owned).collect::<Vec<_>>())
            .find(|l| l.contains("lease-refused") && l.contains(UNKNOWN_PROXY))
    })
    .await
    .expect("timed out waiting for a lease-refused log line");
    assert!(line.contains(name), "{line}");
    let view = lease_of(&proxy).await;
    assert!(!view.valid && view.failures >= 1, "{view:?}");
    assert!(upstream.applied().is_empty());
}

/// The lease the real nodes grant in [`real_cluster_fences_both_proxies_and_stops_writes_when_stopped`].
const NODE_LEASE_MS: u64 = 1_000;
/// `limits.lease_renew_timeout_ms` of that test's proxies. The test is about whose grant
/// a renewal takes, not about how fast a new leader answers: on a loaded 2-core machine a
/// new leader's first grant once took longer than the 1 s default, and the first write
/// with its token was refused (fail closed, as it should be).
const RENEW_TIMEOUT_MS: u64 = 3_000;

/// Three nodes started with `--lease-ms lease_ms` and one `--announce` per proxy admin
/// URL in `proxies` (not announcing to the launcher's own proxy), and their API URLs
/// joined with commas, as a fleet proxy's `--cluster` takes them.
pub(crate) fn start_leased_cluster(
    dir: &std::path::Path,
    lease_ms: u64,
    proxies: &[String],
) -> (palisade_cluster::Cluster, String) {
    let mut node_flags = vec!["--lease-ms".to_owned(), lease_ms.to_string()];
    for proxy in proxies {
        node_flags.extend(["--announce".to_owned(), proxy.clone()]);
    }
    let spec = palisade_cluster::ClusterSpec {
        nodes: 3,
        node_flags,
        ..palisade_cluster::ClusterSpec::default()
    };
    let options = palisade_cluster::ClusterOptions {
        announce: false,
        ..palisade_cluster::ClusterOptions::default()
    };
    let cluster = palisade_tests::process::start_cluster(dir, &spec, &options);
    let urls: Vec<String> = cluster
        .ids()
        .into_iter()
        .map(|id| {
            cluster
                .node(id)
                .unwrap()
                .api_url("")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    let urls = urls.join(",");
    (cluster, urls)
}

/// Goal: against real `palisade node` processes started with `--lease-ms` and
/// `--announce` naming two fleet proxies: the leader's token is admitted at both; after a
/// leadership transfer the old token is refused at BOTH proxies, also at the one that
/// took no write from the new leader; with every node stopped (SIGSTOP) writes get 503
/// lease-expired within one lease plus the renewal wait, and succeed again after SIGCONT;
/// a proxy whose fleet name the nodes do not list gets 503 unknown-proxy.
/// Method: pick the proxies' admin ports first (the nodes' `--announce` names them),
/// start three nodes, then the proxies with `--cluster`; write, try an unlisted proxy,
/// resign, write, stop all, write until 503, continue all, write until 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_cluster_fences_both_proxies_and_stops_writes_when_stopped() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let upstream = RecordingUpstream::start().await;
    let ports = [
        palisade_cluster::free_port().unwrap(),
        palisade_cluster::free_port().unwrap(),
    ];
    let names = ports.map(|p| format!("http://127.0.0.1:{p}"));
    let (cluster, urls) = start_leased_cluster(dir.path(), NODE_LEASE_MS, &names);
    let config = palisade_tests::fixtures::write_config(
        dir.path(),
        &format!("[limits]\nlease_renew_timeout_ms = {RENEW_TIMEOUT_MS}\n"),
    );
    let start = |name: &str, port: u16| {
        let upstream = upstream.url();
        palisade_cluster::ProxyProcess::start_with(
            &dir.path().join(name),
            "127.0.0.1:0",
            &format!("127.0.0.1:{port}"),
            &[
                "--upstream",
                &upstream,
                "--cluster",
                &urls,
                "--config",
                &config,
            ],
            &[],
        )
        .unwrap()
    };
    let a = start("a", ports[0]);
    let b = start("b", ports[1]);

    let first = wait::poll(WAIT, || async {
        cluster
            .established_leader(None)
            .await
            .filter(|v| v.token.is_some())
    })
    .await
    .expect("timed out waiting for an established leader with its token");
    let t1 = first.token.unwrap();
    for proxy in [&a, &b] {
        let answer = wait::poll(WAIT, || async {
            let answer = put(&proxy.url("/k"), t1, "first").await;
            (answer.status == StatusCode::OK).then_some(answer)
        })
        .await
        .expect("timed out waiting for the leader's token admitted");
        assert_eq!(answer.status, StatusCode::OK);
    }

    // A proxy the nodes do not list gets no lease: 503, naming the node's refusal.
    let outsider = {
        let upstream = upstream.url();
        palisade_cluster::ProxyProcess::start(
            &dir.path().join("outsider"),
            &[
                "--upstream",
                &upstream,
                "--cluster",
                &urls,
                "--fleet-name",
                "http://not-listed.invalid",
            ],
        )
        .unwrap()
    };
    let refused = put(&outsider.url("/k"), t1, "outsider").await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.text()
    );
    assert!(refused.text().contains(UNKNOWN_PROXY), "{}", refused.text());
    drop(outsider);

    resign(&cluster, first.node_id).await;
    let second = wait::poll(WAIT, || async {
        cluster
            .established_leader(Some(first.node_id))
            .await
            .filter(|v| v.token.is_some_and(|t| t > t1))
    })
    .await
    .expect("timed out waiting for a new leader's released token");
    let t2 = second.token.unwrap();
    // The first write with the new token is admitted at once, without a retry: its
    // renewal asks every node and takes the new leader's grant (given up to
    // `RENEW_TIMEOUT_MS`), whatever the old leader's state.
    let answer = put(&a.url("/k"), t2, "second").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let stale = put(&b.url("/k"), t1, "late first").await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.text());
    assert_eq!(stale.problem().unwrap().current, Some(t2));

    for id in cluster.ids() {
        cluster.node(id).unwrap().guard.pause().unwrap();
    }
    let stopped = Instant::now();
    let refused = wait::poll(WAIT, || async {
        let answer = put(&a.url("/k"), t2, "while stopped").await;
        (answer.status == StatusCode::SERVICE_UNAVAILABLE).then_some(answer)
    })
    .await
    .expect("timed out waiting for a 503 lease-expired with every node stopped");
    let took = stopped.elapsed();
    assert_eq!(refused.problem().unwrap().kind(), "lease-expired");
    // The requirement: within one lease; plus the refused write's own renewal wait
    // (`RENEW_TIMEOUT_MS` here) and slack for loaded test machines.
    assert!(
        took < Duration::from_millis(NODE_LEASE_MS + RENEW_TIMEOUT_MS + 1_500),
        "{took:?}"
    );
    for id in cluster.ids() {
        cluster.node(id).unwrap().guard.resume().unwrap();
    }
    wait::poll(WAIT, || async {
        let token = cluster.established_leader(None).await?.token?;
        (put(&a.url("/k"), token, "after").await.status == StatusCode::OK).then_some(())
    })
    .await
    .expect("timed out waiting for writes admitted again after SIGCONT");
    let tokens: Vec<u64> = upstream
        .applied()
        .into_iter()
        .filter_map(|w| w.token?.parse().ok())
        .collect();
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "the storage applied tokens in order: {tokens:?}"
    );
}

/// Goal: a write whose forward ended without an answer (the upstream broke the
/// connection) may still be applied by the storage, so in fleet mode it stays in flight
/// until it can no longer land: its lease's end plus the write bound. An advance to a
/// new term (the announce, whose acceptance releases a new leader's token) waits for it
/// instead of passing it at once.
/// Method: an upstream that closes every connection without answering; a token-5 write
/// gets 502; at once an advance to 6; it is answered only after at least the write bound
/// (500 ms by default; 100 ms are left for the time between the lease check and the 502).
#[tokio::test]
async fn a_write_without_an_answer_holds_the_barrier_until_it_cannot_land() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let cluster = FakeCluster::start(5, &[]).await;
    let breaker = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let breaker_url = format!("http://{}", breaker.local_addr().unwrap());
    let closer = tokio::spawn(async move {
        while let Ok((stream, _)) = breaker.accept().await {
            drop(stream);
        }
    });
    let proxy = start_proxy(
        dir.path(),
        &["--upstream", &breaker_url, "--cluster", &cluster.url()],
    );
    // The first write renews the lease, then meets the broken upstream.
    let lost = put(&proxy.url("/k"), 5, "five").await;
    assert_eq!(lost.status, StatusCode::BAD_GATEWAY, "{}", lost.text());
    let failed_at = Instant::now();

    let advance = palisade_tests::client::send(
        http::Method::POST,
        &proxy.admin_url("/v1/fences/default"),
        &[("content-type", "application/json")],
        r#"{"token":6}"#,
    )
    .await;
    let waited = failed_at.elapsed();
    assert_eq!(advance.status, StatusCode::OK, "{}", advance.text());
    assert!(
        waited >= Duration::from_millis(400),
        "the advance passed a write of unknown outcome after {waited:?}"
    );
    closer.abort();
}
