//! The node API through its router (`oneshot`, no socket): the contract's shapes, long
//! polls, and hostile queries and bodies refused before they reach the election loop.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use http::{Request, StatusCode, header};
use http_body_util::BodyExt as _;
use palisade_protocol::headers::PROBLEM_JSON;
use palisade_protocol::{Health, LeaderView, MemberList, Problem, Role, Scope};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::transfer::transfer_problem;
use super::{API_BODY_BYTES_MAX, ApiState, LEASE_BUSY, LEASE_PENDING_MAX, LeaseApi, app};
use crate::audit::Observer;
use crate::leadership::Leadership;
use crate::metrics::NodeMetrics;
use crate::node::{Commands, Msg, TransferError};
use crate::transport::faults::LinkFaults;

/// A test node: its leadership sender, its inbox (kept so the loop counts as
/// running), and the app.
struct TestNode {
    leadership: watch::Sender<Leadership>,
    inbox: Option<mpsc::Receiver<Msg>>,
    faults: bool,
    /// Grant leases to this proxy (`None`: leases off).
    lease_proxy: Option<String>,
    /// The permits of the last app's lease API.
    lease_permits: Option<Arc<tokio::sync::Semaphore>>,
}

impl TestNode {
    fn new(faults: bool) -> Self {
        // A follower in term 7 that knows leader 2.
        let (leadership, _) = watch::channel(Leadership {
            term: 7,
            leader_id: Some(2),
            ..Leadership::default()
        });
        Self {
            leadership,
            inbox: None,
            faults,
            lease_proxy: None,
            lease_permits: None,
        }
    }

    fn app(&mut self) -> Router {
        let (tx, rx) = mpsc::channel(4);
        self.inbox = Some(rx);
        let leases = self
            .lease_proxy
            .as_ref()
            .map(|proxy| LeaseApi::new(60_000, std::slice::from_ref(proxy)));
        self.lease_permits = leases.as_ref().map(|l| Arc::clone(&l.permits));
        app(ApiState {
            node_id: 1,
            scope: Scope::default_scope(),
            leadership: self.leadership.subscribe(),
            commands: Commands::new(tx),
            metrics: NodeMetrics::new(1),
            leases,
            faults: self
                .faults
                .then(|| Arc::new(LinkFaults::new(true, 1, [1, 2, 3]))),
            scores: None,
            members: watch::channel(MemberList::default()).1,
            announce: watch::channel(Vec::new()).1,
            observer: Arc::new(Observer::new(
                1,
                &["http://127.0.0.1:1/<proxy>".to_owned()],
                None,
            )),
            fences: crate::announce::ProxyFences::plain("default"),
            shutdown: CancellationToken::new(),
            roles_enforced: false,
            scopes: None,
        })
    }
}

struct Answer {
    status: StatusCode,
    content_type: String,
    body: String,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap()
    }

    /// Asserts a problem+json answer of `status`, and returns the problem.
    fn problem(&self, status: StatusCode) -> Problem {
        assert_eq!(self.status, status, "{}", self.body);
        assert_eq!(self.content_type, PROBLEM_JSON, "{}", self.body);
        serde_json::from_str(&self.body).unwrap()
    }
}

async fn call(app: Router, method: &str, uri: &str, body: &str) -> Answer {
    call_as(app, method, uri, "application/json", body).await
}

async fn call_as(app: Router, method: &str, uri: &str, content_type: &str, body: &str) -> Answer {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::CONTENT_TYPE, content_type)
        .body(axum::body::Body::from(body.to_owned()))
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        content_type,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// Goal: `GET /v1/leader` answers the contract's leader view of this node.
/// Method: publish a follower's leadership, read it back through the router.
#[tokio::test]
async fn leader_view_has_the_contract_shape() {
    let mut node = TestNode::new(false);
    let answer = call(node.app(), "GET", "/v1/leader", "").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let view: LeaderView = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(
        view,
        LeaderView {
            node_id: 1,
            scope: Scope::default_scope(),
            term: 7,
            leader_id: Some(2),
            role: Role::Follower,
            token: None,
            announced: false,
            proof: None,
            lease_ms: None,
            released: None,
            scores: None,
            score_oracle: None,
        }
    );
}

/// Goal: `GET /` is an HTML page for people showing role, term and leader, the
/// announce board with its proxy URL escaped, and refreshing itself.
/// Method: publish a follower's leadership (term 7, leader 2), GET `/`.
#[tokio::test]
async fn status_page_shows_role_term_leader_and_escapes() {
    let mut node = TestNode::new(false);
    let answer = call(node.app(), "GET", "/", "").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert!(
        answer.content_type.starts_with("text/html"),
        "{}",
        answer.content_type
    );
    let page = &answer.body;
    assert!(page.contains("<h1>Palisade node 1</h1>"), "{page}");
    assert!(
        page.contains("<dt>Role</dt><dd class=\"\">follower</dd>"),
        "{page}"
    );
    assert!(
        page.contains("<dt>Term</dt><dd class=\"\">7</dd>"),
        "{page}"
    );
    assert!(page.contains("node 2"), "{page}");
    assert!(page.contains("http://127.0.0.1:1/&lt;proxy&gt;"), "{page}");
    assert!(!page.contains("<proxy>"), "{page}");
    assert!(page.contains("http-equiv=\"refresh\""), "{page}");
}

/// Goal: a long poll answers as soon as the view changes, with the new view.
/// Method: poll past the current term, publish a higher term while it waits.
#[tokio::test]
async fn long_poll_answers_on_a_new_term() {
    let mut node = TestNode::new(false);
    let app = node.app();
    let poll = tokio::spawn(call(
        app,
        "GET",
        "/v1/leader?after_term=7&timeout_ms=10000",
        "",
    ));
    node.leadership.send_modify(|l| l.term = 8);
    let answer = tokio::time::timeout(Duration::from_secs(5), poll)
        .await
        .expect("the long poll answered before its timeout")
        .unwrap();
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.json()["term"], 8);
}

/// Goal: an unknown or malformed query parameter is a 400 bad-query problem naming
/// this node and its leader, not a silently ignored long poll.
/// Method: a typo'd parameter name, then a negative term.
#[tokio::test]
async fn bad_long_poll_query_is_a_400_problem() {
    let mut node = TestNode::new(false);
    for query in ["after-term=1", "after_term=-1"] {
        let answer = call(node.app(), "GET", &format!("/v1/leader?{query}"), "").await;
        let problem = answer.problem(StatusCode::BAD_REQUEST);
        assert_eq!(problem.kind(), "bad-query", "{query}");
        assert_eq!((problem.node_id, problem.leader_id), (Some(1), Some(2)));
    }
}

/// Goal: a transfer body that is not JSON is a 400 problem, one of the wrong shape a
/// 422 problem; neither reaches the election loop.
/// Method: post both; check the loop's inbox stayed empty.
#[tokio::test]
async fn bad_transfer_bodies_are_problems() {
    let mut node = TestNode::new(false);
    let answer = call(node.app(), "POST", "/v1/transfer", "{to:").await;
    let problem = answer.problem(StatusCode::BAD_REQUEST);
    assert_eq!((problem.kind(), problem.node_id), ("bad-body", Some(1)));
    let answer = call(node.app(), "POST", "/v1/transfer", r#"{"too":2}"#).await;
    answer.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert!(node.inbox.as_mut().unwrap().try_recv().is_err());
}

/// Goal: unknown paths and wrong methods are 404 and 405 problems.
/// Method: call an unknown path and `GET /v1/transfer`.
#[tokio::test]
async fn unknown_paths_and_methods_are_problems() {
    let mut node = TestNode::new(false);
    let answer = call(node.app(), "GET", "/v1/nope", "").await;
    answer.problem(StatusCode::NOT_FOUND);
    assert!(answer.body.contains("node API"), "{}", answer.body);
    let answer = call(node.app(), "GET", "/v1/transfer", "").await;
    answer.problem(StatusCode::METHOD_NOT_ALLOWED);
}

/// Goal: the test-fault routes do not exist on a node without test faults, and work
/// on one with them.
/// Method: GET and POST them on both kinds of node.
#[tokio::test]
async fn faults_route_exists_only_when_enabled() {
    let mut off = TestNode::new(false);
    for method in ["GET", "POST"] {
        let answer = call(off.app(), method, "/v1/test/faults", r#"{"drop":[2]}"#).await;
        answer.problem(StatusCode::NOT_FOUND);
    }
    let mut on = TestNode::new(true);
    let answer = call(on.app(), "POST", "/v1/test/faults", r#"{"drop":[2]}"#).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.json()["drop"], serde_json::json!([2]));
    let answer = call(on.app(), "POST", "/v1/test/faults", r#"{"drop":[9]}"#).await;
    assert_eq!(answer.problem(StatusCode::BAD_REQUEST).kind(), "bad-faults");
}

/// Goal: `/healthz` is 200 with the node id while the loop runs, and a 503 problem
/// once it stopped.
/// Method: call it with the inbox open, then with the inbox dropped.
#[tokio::test]
async fn health_follows_the_election_loop() {
    let mut node = TestNode::new(false);
    let app = node.app();
    let answer = call(app.clone(), "GET", "/healthz", "").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let health: Health = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(health, Health::ok(Some(1)));
    node.inbox = None;
    let answer = call(app, "GET", "/healthz", "").await;
    let problem = answer.problem(StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(problem.kind(), "node-stopped");
}

/// Goal: a node without leases answers 409 leases-off, and one with leases refuses
/// a proxy it does not announce to with 403 unknown-proxy; neither reaches the loop.
/// Method: post a lease request to both kinds of node; check the inbox stayed empty.
#[tokio::test]
async fn lease_refusals_before_the_loop() {
    let mut off = TestNode::new(false);
    let body = r#"{"proxy":"http://127.0.0.1:9001"}"#;
    let answer = call(off.app(), "POST", "/v1/lease", body).await;
    assert_eq!(answer.problem(StatusCode::CONFLICT).kind(), "leases-off");
    assert!(off.inbox.as_mut().unwrap().try_recv().is_err());

    let mut on = TestNode::new(false);
    on.lease_proxy = Some("http://127.0.0.1:9001/".to_owned());
    let other = r#"{"proxy":"http://127.0.0.1:9002"}"#;
    let answer = call(on.app(), "POST", "/v1/lease", other).await;
    let problem = answer.problem(StatusCode::FORBIDDEN);
    assert_eq!(problem.kind(), "unknown-proxy");
    assert!(problem.detail.contains("9002"), "{}", problem.detail);
    assert!(on.inbox.as_mut().unwrap().try_recv().is_err());
}

/// Goal: hostile lease bodies are refused before the loop: a huge body 413, unknown
/// fields 422, a wrong content type 415, not JSON 400.
/// Method: post each to a node with leases; check statuses and the empty inbox.
#[tokio::test]
async fn hostile_lease_bodies_are_problems() {
    let mut node = TestNode::new(false);
    node.lease_proxy = Some("http://127.0.0.1:9001".to_owned());
    let huge = format!(r#"{{"proxy":"{}"}}"#, "a".repeat(API_BODY_BYTES_MAX + 1));
    let json = "application/json";
    let cases = [
        (json, huge.as_str(), StatusCode::PAYLOAD_TOO_LARGE),
        (
            json,
            r#"{"proxy":"http://127.0.0.1:9001","term":9}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "text/plain",
            r#"{"proxy":"http://127.0.0.1:9001"}"#,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (json, "{proxy:", StatusCode::BAD_REQUEST),
    ];
    for (content_type, body, status) in cases {
        let answer = call_as(node.app(), "POST", "/v1/lease", content_type, body).await;
        answer.problem(status);
        assert!(node.inbox.as_mut().unwrap().try_recv().is_err());
    }
}

/// Goal: a flood of lease requests is bounded: once `LEASE_PENDING_MAX` wait for the
/// loop, one more is answered 503 lease-busy at once.
/// Method: a loop that never answers; start the cap's worth of requests, wait until
/// every permit is taken, then send one more.
#[tokio::test]
async fn lease_flood_is_answered_busy_at_the_cap() {
    let mut node = TestNode::new(false);
    node.lease_proxy = Some("http://127.0.0.1:9001".to_owned());
    let app = node.app();
    let permits = node.lease_permits.clone().unwrap();
    let body = r#"{"proxy":"http://127.0.0.1:9001"}"#;
    let mut waiting = Vec::new();
    for _ in 0..LEASE_PENDING_MAX {
        waiting.push(tokio::spawn(call(app.clone(), "POST", "/v1/lease", body)));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while permits.available_permits() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the requests did not take every permit"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let answer = call(app, "POST", "/v1/lease", body).await;
    let problem = answer.problem(StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(problem.kind(), LEASE_BUSY);
    for task in waiting {
        task.abort();
    }
}

/// Goal: each transfer error maps to its status and kind, and names the leader to
/// retry at: the error's own when it has one, else the one the node knows.
/// Method: map a not-leader and a timed-out error.
#[test]
fn transfer_errors_map_to_problems() {
    let p = transfer_problem(1, Some(2), &TransferError::NotLeader { leader_id: Some(3) });
    assert_eq!((p.status, p.kind()), (409, "not-leader"));
    assert_eq!((p.node_id, p.leader_id), (Some(1), Some(3)));
    let p = transfer_problem(1, Some(2), &TransferError::TimedOut { to: 2, ticks: 30 });
    assert_eq!(
        (p.status, p.kind(), p.leader_id),
        (504, "transfer-timeout", Some(2))
    );
    assert!(p.detail.contains("30 ticks"), "{}", p.detail);
}

/// Goal: `DELETE /v1/members/{id}` takes no body, `{}` or `{"force":true}`, refuses any
/// other body before the loop (400 `bad-body`), hands the loop the force it was given,
/// and answers a refusal as its 409 problem. Method: delete with a misspelt body (the
/// inbox stays empty); delete with `{"force":true}` and with no body, each time taking
/// the change from the inbox and answering it refused.
#[tokio::test]
async fn member_removal_body_and_refusals() {
    use crate::members::{MemberChange, MemberError};
    let mut node = TestNode::new(false);
    let answer = call(node.app(), "DELETE", "/v1/members/3", r#"{"forse":true}"#).await;
    let problem = answer.problem(StatusCode::BAD_REQUEST);
    assert_eq!(problem.kind(), "bad-body");
    assert!(problem.detail.contains("force"), "{}", problem.detail);
    assert!(node.inbox.as_mut().unwrap().try_recv().is_err());
    for (body, force) in [(r#"{"force":true}"#, true), ("", false)] {
        let app = node.app();
        let mut inbox = node.inbox.take().unwrap();
        let call = tokio::spawn(call(app, "DELETE", "/v1/members/3", body));
        let Some(Msg::Member { change, reply }) = inbox.recv().await else {
            panic!("no membership change reached the loop");
        };
        assert_eq!(change, MemberChange::Remove { id: 3, force });
        reply
            .send(Err(MemberError::BelowSafeMinimum { id: 3, voters: 2 }))
            .unwrap();
        let answer = call.await.unwrap();
        let problem = answer.problem(StatusCode::CONFLICT);
        assert_eq!(problem.kind(), "voters-below-three");
        assert!(problem.detail.contains("--force"), "{}", problem.detail);
    }
}
