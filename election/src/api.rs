//! The node's HTTP API, on axum through `palisade_protocol::server` (JSON bodies; every
//! error is an `application/problem+json` [`Problem`] naming this node and, when known,
//! the leader to ask instead):
//!
//! - `GET /v1/leader`: this node's [`LeaderView`]; with [`LongPoll`] parameters
//!   (`?after_term=N&timeout_ms=T`) a long poll that answers once the term exceeds N or the
//!   view changes in any other way (role, leader, token, announced), or after T ms (at most
//!   [`LONG_POLL_TIMEOUT_MS_MAX`]). `after_term` defaults to the current term, `timeout_ms`
//!   to [`LONG_POLL_TIMEOUT_MS_DEFAULT`]. An unknown parameter is a 400 `bad-query`: a
//!   typo would otherwise turn a long poll into a busy loop.
//! - `POST /v1/transfer` with a [`TransferRequest`]: leadership transfer; waits for the
//!   outcome and answers [`Transferred`].
//! - `POST /v1/resign`: transfer to the best other voter.
//! - `POST /v1/lease` with a `LeaseRequest`: a fleet lease for an `--announce` proxy
//!   (see [`crate::lease`] for its answers).
//! - `GET /v1/members`: the members this node applied ([`MemberList`]); `POST /v1/members`
//!   with a [`MemberAdd`] adds one, `DELETE /v1/members/{id}` removes one (never the
//!   leader). Both go through raft's joint consensus (a follower forwards the proposal to
//!   the leader) and answer the new list once this node applied the change, at most
//!   [`crate::MEMBER_CHANGE_TIMEOUT_MS`] later. Refusals are 409 problems whose detail
//!   says why (a removed id is never accepted again; one change at a time).
//! - `GET /v1/announce`: the `--announce` proxy list the announcer follows
//!   ([`AnnounceList`]); `POST /v1/announce` with one replaces it through raft on every
//!   node and answers once this node applied it (409 `announce-fixed` with fleet leases).
//! - `GET /metrics` (Prometheus text), `GET /healthz` ([`Health`]; 503 once the election
//!   loop stopped).
//! - `GET /`: the status page for people ([`crate::status_page`]): role, term, leader,
//!   members, scores, the announce state per proxy. Transfers asked here are written to
//!   the audit log.
//! - Only on a node started with test faults (`PALISADE_TEST_FAULTS=1`), else 404:
//!   `GET /v1/test/faults` and `POST /v1/test/faults` with a [`FaultSpec`], which replaces
//!   every fault of this node's links (`{}` heals them); see [`crate::transport::faults`].

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Path;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::{delete, get, post};
use http::{StatusCode, header};
use palisade_protocol::admin::{HEALTHZ_PATH, METRICS_PATH};
use palisade_protocol::headers::PROMETHEUS_TEXT;
use palisade_protocol::node::{
    ANNOUNCE_PATH, LEADER_PATH, MEMBER_PATH, MEMBERS_PATH, RESIGN_PATH, TEST_FAULTS_PATH,
    TRANSFER_PATH,
};
use palisade_protocol::server::{ApiJson, ApiQuery, ControlLimits, finish};
use palisade_protocol::status::STATUS_PAGE_PATH;
use palisade_protocol::{AnnounceList, MemberAdd, MemberList};
use palisade_protocol::{
    FaultSpec, Health, LeaderView, LongPoll, Problem, Scope, TransferRequest, Transferred,
};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::leadership::Leadership;
use crate::metrics::NodeMetrics;
use crate::node::{Commands, TransferError};
use crate::transport::faults::{FaultError, LinkFaults};

/// Longest long poll: a client asking for more waits this long. Keeps a forgotten client
/// from pinning a connection for ever.
pub const LONG_POLL_TIMEOUT_MS_MAX: u64 = 60_000;
/// Long-poll timeout when `after_term` is given without `timeout_ms`.
pub const LONG_POLL_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Largest request body accepted (`{"to":N}` needs a few bytes).
pub const API_BODY_BYTES_MAX: usize = 4 * 1024;
/// API connections open at once. At the limit the connection idle the longest is closed
/// to admit a new one; only when all are busy (long polls included) is one more answered
/// 503 and closed.
pub const API_CONNECTIONS_MAX: usize = 256;
/// Time a client has, from accept, to finish its TLS handshake and send its request
/// headers. Its clients (peers' tools, proxies, operators) send a small request at once.
pub const API_HEADER_TIMEOUT_MS: u64 = 10_000;
/// Time a keep-alive API connection may stay idle between requests; a long poll is a
/// request in flight, not idle.
pub const API_KEEPALIVE_TIMEOUT_MS: u64 = 30_000;
/// Connections the node API closed on its own, by `reason` (header-timeout,
/// keepalive-timeout, evicted-idle).
pub const API_CONNECTION_CLOSES: &str = "palisade_node_api_connection_closes_total";
/// Time in-flight requests get to finish at shutdown.
pub const API_DRAIN_TIMEOUT_MS: u64 = 2_000;

/// The API's name in 404 and 405 problems.
const API_NAME: &str = "node API";

/// What the API handlers share.
pub(crate) struct ApiState {
    pub node_id: u64,
    pub scope: Scope,
    pub leadership: watch::Receiver<Leadership>,
    pub commands: Commands,
    pub metrics: NodeMetrics,
    /// Fleet leases; `None` when the node runs without `--lease-ms`.
    pub leases: Option<crate::lease::LeaseApi>,
    /// The transport's test faults, only when they are enabled.
    pub faults: Option<Arc<LinkFaults>>,
    /// The scores the election loop publishes; `None` with `--score-oracle off`.
    pub scores: Option<crate::score::SharedScoreView>,
    /// The members the election loop applied.
    pub members: watch::Receiver<MemberList>,
    /// The announce list the announcers follow.
    pub announce: watch::Receiver<Vec<String>>,
    /// The announce board and the audit log (the status page shows both).
    pub observer: Arc<crate::audit::Observer>,
    /// Cancelled at shutdown: ends long polls, then the listener.
    pub shutdown: CancellationToken,
}

impl ApiState {
    /// A problem from this node, naming the leader it knows.
    pub(crate) fn problem(&self, problem: Problem) -> Problem {
        let leader_id = self.leadership.borrow().leader_id;
        problem.with_node(self.node_id, leader_id)
    }

    /// The problem that answers a failed transfer from this node.
    fn transfer_problem(&self, err: &TransferError) -> Problem {
        let known_leader = self.leadership.borrow().leader_id;
        transfer_problem(self.node_id, known_leader, err)
    }

    fn view(&self, l: &Leadership) -> LeaderView {
        let scores = self.scores.as_ref().map(crate::score::read_view);
        LeaderView {
            node_id: self.node_id,
            scope: self.scope.clone(),
            term: l.term,
            leader_id: l.leader_id,
            role: l.role,
            token: l.token,
            announced: l.announced,
            proof: l.proof.map(|p| p.encode()),
            lease_ms: self.leases.as_ref().map(|leases| leases.lease_ms),
            released: self.leases.as_ref().map(|_| l.token.is_some()),
            score_oracle: scores.as_ref().map(|v| v.oracle.as_str().to_owned()),
            scores: scores.map(|v| {
                v.scores
                    .into_iter()
                    .map(|(id, score)| (id.to_string(), score))
                    .collect()
            }),
        }
    }
}

type Shared = Arc<ApiState>;

/// Serves the API on `listener` until `state.shutdown`, then drains in-flight requests.
/// With `tls` (the node's mutual-TLS acceptor), the API is HTTPS and every connection must
/// present a client certificate from the cluster CA.
pub(crate) async fn serve(listener: TcpListener, state: ApiState, tls: Option<TlsAcceptor>) {
    let shutdown = state.shutdown.clone();
    let limits = ControlLimits {
        name: "node-api",
        connections_max: API_CONNECTIONS_MAX,
        header_read_timeout: Duration::from_millis(API_HEADER_TIMEOUT_MS),
        keepalive_timeout: Duration::from_millis(API_KEEPALIVE_TIMEOUT_MS),
        drain_timeout: Duration::from_millis(API_DRAIN_TIMEOUT_MS),
        on_close: Some(connection_closed),
    };
    palisade_protocol::server::serve_tls(listener, app(state), limits, tls, async move {
        shutdown.cancelled().await;
    })
    .await;
}

/// Counts one connection the node API closed on its own ([`API_CONNECTION_CLOSES`]).
fn connection_closed(_listener: &'static str, reason: palisade_protocol::server::CloseReason) {
    metrics::counter!(API_CONNECTION_CLOSES, "reason" => reason.as_str()).increment(1);
}

/// The node API's routes; the test-fault routes exist only when faults are enabled, so a
/// production node answers 404 there like for any other unknown path.
pub(crate) fn app(state: ApiState) -> Router {
    let faults_enabled = state.faults.is_some();
    let mut router = Router::new()
        .route(LEADER_PATH, get(leader))
        .route(TRANSFER_PATH, post(transfer))
        .route(RESIGN_PATH, post(resign))
        .route(
            palisade_protocol::lease::LEASE_PATH,
            post(crate::lease::lease),
        )
        .route(MEMBERS_PATH, get(members_list).post(member_add))
        .route(ANNOUNCE_PATH, get(announce_list).post(announce_set))
        .route(MEMBER_PATH, delete(member_remove))
        .route(METRICS_PATH, get(metrics))
        .route(HEALTHZ_PATH, get(health))
        .route(STATUS_PAGE_PATH, get(status_page));
    if faults_enabled {
        router = router.route(TEST_FAULTS_PATH, get(get_faults).post(set_faults));
    }
    finish(
        router.with_state(Arc::new(state)),
        API_NAME,
        API_BODY_BYTES_MAX,
    )
}

/// `GET /v1/leader`, plain or as a long poll.
async fn leader(
    State(state): State<Shared>,
    query: Result<ApiQuery<LongPoll>, Problem>,
) -> Result<ApiJson<LeaderView>, Problem> {
    let ApiQuery(poll) = query.map_err(|p| state.problem(p))?;
    let mut rx = state.leadership.clone();
    let now = *rx.borrow_and_update();
    if !poll.is_poll() {
        return Ok(ApiJson(state.view(&now)));
    }
    let after_term = poll.after_term.unwrap_or(now.term);
    let timeout_ms = poll
        .timeout_ms
        .unwrap_or(LONG_POLL_TIMEOUT_MS_DEFAULT)
        .min(LONG_POLL_TIMEOUT_MS_MAX);
    // Besides "term above N or role changed", any other change of the view (leader
    // learned, token established or withdrawn, announcement done) also answers: a client
    // waiting for the token to appear would otherwise wait out the timeout.
    let changed = |l: &Leadership| {
        l.term > after_term
            || (l.role, l.leader_id, l.token, l.announced)
                != (now.role, now.leader_id, now.token, now.announced)
    };
    if !changed(&now) {
        tokio::select! {
            () = state.shutdown.cancelled() => {}
            _ = tokio::time::timeout(Duration::from_millis(timeout_ms), rx.wait_for(changed)) => {}
        }
    }
    let latest = *state.leadership.borrow();
    Ok(ApiJson(state.view(&latest)))
}

/// `POST /v1/transfer`.
async fn transfer(
    State(state): State<Shared>,
    body: Result<ApiJson<TransferRequest>, Problem>,
) -> Result<ApiJson<Transferred>, Problem> {
    let ApiJson(request) = body.map_err(|p| state.problem(p))?;
    let outcome = state.commands.transfer(Some(request.to)).await;
    audit_transfer(&state, Some(request.to), &outcome);
    outcome
        .map(ApiJson)
        .map_err(|err| state.transfer_problem(&err))
}

/// `POST /v1/resign`.
async fn resign(State(state): State<Shared>) -> Result<ApiJson<Transferred>, Problem> {
    let outcome = state.commands.transfer(None).await;
    audit_transfer(&state, None, &outcome);
    outcome
        .map(ApiJson)
        .map_err(|err| state.transfer_problem(&err))
}

/// Writes a transfer's outcome to the audit log.
fn audit_transfer(state: &ApiState, to: Option<u64>, outcome: &Result<Transferred, TransferError>) {
    let term = state.leadership.borrow().term;
    match outcome {
        Ok(done) => state.observer.transfer(
            done.term,
            Some(done.to),
            "transferred",
            Some(format!(
                "leadership moved from node {} to node {}",
                done.from, done.to
            )),
        ),
        Err(err) => state
            .observer
            .transfer(term, to, "failed", Some(err.to_string())),
    }
}

/// `GET /`: the status page ([`crate::status_page`]).
async fn status_page(State(state): State<Shared>) -> axum::response::Html<String> {
    let view = state.view(&state.leadership.borrow());
    let scores = match (&view.score_oracle, &view.scores) {
        (Some(oracle), Some(scores)) => Some((oracle.clone(), scores.clone())),
        _ => None,
    };
    let members = state
        .members
        .borrow()
        .members
        .iter()
        .map(|m| (m.id, m.peer.clone(), m.voter))
        .collect();
    let page = crate::status_page::NodePage {
        view,
        members,
        members_applied: true,
        scores,
        observer: &state.observer,
    };
    axum::response::Html(crate::status_page::render(&page))
}

/// `GET /v1/members`.
async fn members_list(State(state): State<Shared>) -> ApiJson<MemberList> {
    ApiJson(state.members.borrow().clone())
}

/// `POST /v1/members`.
async fn member_add(
    State(state): State<Shared>,
    body: Result<ApiJson<MemberAdd>, Problem>,
) -> Result<ApiJson<MemberList>, Problem> {
    let ApiJson(add) = body.map_err(|p| state.problem(p))?;
    let change = crate::members::MemberChange::Add {
        id: add.id,
        peer: add.peer,
    };
    crate::members::change_and_wait(&state.commands, &state.members, state.node_id, change)
        .await
        .map(ApiJson)
        .map_err(|err| state.problem(member_problem(&err)))
}

/// `DELETE /v1/members/{id}`.
async fn member_remove(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<ApiJson<MemberList>, Problem> {
    let id: u64 = id.parse().map_err(|_| {
        state.problem(
            Problem::new(
                StatusCode::BAD_REQUEST,
                "bad-member",
                format!("member id {id:?} is not a non-negative integer"),
            )
            .with_title("Bad member id"),
        )
    })?;
    let change = crate::members::MemberChange::Remove { id };
    crate::members::change_and_wait(&state.commands, &state.members, state.node_id, change)
        .await
        .map(ApiJson)
        .map_err(|err| state.problem(member_problem(&err)))
}

/// `GET /v1/announce`.
async fn announce_list(State(state): State<Shared>) -> ApiJson<AnnounceList> {
    ApiJson(AnnounceList {
        proxies: state.announce.borrow().clone(),
    })
}

/// `POST /v1/announce`: replaces the cluster's announce list through raft.
async fn announce_set(
    State(state): State<Shared>,
    body: Result<ApiJson<AnnounceList>, Problem>,
) -> Result<ApiJson<AnnounceList>, Problem> {
    let ApiJson(list) = body.map_err(|p| state.problem(p))?;
    crate::members::announce_and_wait(&state.commands, &state.announce, list.proxies)
        .await
        .map(|proxies| ApiJson(AnnounceList { proxies }))
        .map_err(|err| state.problem(member_problem(&err)))
}

/// The problem that answers a refused or failed membership change.
fn member_problem(err: &crate::MemberError) -> Problem {
    use crate::MemberError as E;
    let (status, kind, title) = match err {
        E::Reused { .. } => (
            StatusCode::CONFLICT,
            "member-id-reused",
            "Removed ids are never reused",
        ),
        E::AlreadyMember { .. } => (StatusCode::CONFLICT, "already-member", "Already a member"),
        E::PeerInUse { .. } => (StatusCode::CONFLICT, "peer-in-use", "Peer address in use"),
        E::NotAMember { .. } => (StatusCode::NOT_FOUND, "not-a-member", "No such member"),
        E::Invalid { .. } => (StatusCode::BAD_REQUEST, "bad-member", "Bad member"),
        E::TooMany { .. } => (
            StatusCode::CONFLICT,
            "too-many-members",
            "Member limit reached",
        ),
        E::Pending => (
            StatusCode::CONFLICT,
            "membership-change-pending",
            "A membership change is in progress",
        ),
        E::IsLeader { .. } => (
            StatusCode::CONFLICT,
            "member-is-leader",
            "The leader cannot be removed",
        ),
        E::LastVoter { .. } => (StatusCode::CONFLICT, "last-voter", "Last voter"),
        E::NoLeader => (StatusCode::SERVICE_UNAVAILABLE, "no-leader", "No leader"),
        E::Refused { .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            "proposal-refused",
            "raft refused the proposal",
        ),
        E::TimedOut { .. } => (
            StatusCode::GATEWAY_TIMEOUT,
            "member-change-timeout",
            "The change was not applied in time",
        ),
        E::AnnounceFixed => (
            StatusCode::CONFLICT,
            "announce-fixed",
            "The announce list is fixed with fleet leases",
        ),
        E::Stopped => (
            StatusCode::SERVICE_UNAVAILABLE,
            "node-stopped",
            "The node stopped",
        ),
    };
    Problem::new(status, kind, err.to_string()).with_title(title)
}

/// `GET /metrics`.
async fn metrics(State(state): State<Shared>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
        state.metrics.render(),
    )
}

/// `GET /healthz`: healthy while the election loop runs.
async fn health(State(state): State<Shared>) -> Result<ApiJson<Health>, Problem> {
    if state.commands.is_running() {
        Ok(ApiJson(Health::ok(Some(state.node_id))))
    } else {
        Err(state.problem(
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "node-stopped",
                "the election loop stopped; see the node's log",
            )
            .with_title("The election loop is not running"),
        ))
    }
}

/// `GET /v1/test/faults`.
async fn get_faults(State(state): State<Shared>) -> ApiJson<FaultSpec> {
    ApiJson(state.faults.as_ref().map(|f| f.get()).unwrap_or_default())
}

/// `POST /v1/test/faults`: replaces the faults of this node's links.
async fn set_faults(
    State(state): State<Shared>,
    body: Result<ApiJson<FaultSpec>, Problem>,
) -> Result<ApiJson<FaultSpec>, Problem> {
    let ApiJson(spec) = body.map_err(|p| state.problem(p))?;
    let Some(faults) = state.faults.as_ref() else {
        // The route exists only with faults enabled; this answers the same as without it.
        return Err(state.problem(Problem::new(
            StatusCode::NOT_FOUND,
            "not-found",
            FaultError::Disabled.to_string(),
        )));
    };
    match faults.set(spec) {
        Ok(spec) => {
            warn!(drop = ?spec.drop, delay_ms = ?spec.delay_ms, "test faults set");
            Ok(ApiJson(spec))
        }
        Err(err) => Err(state.problem(
            Problem::new(StatusCode::BAD_REQUEST, "bad-faults", err.to_string())
                .with_title("Fault spec refused"),
        )),
    }
}

/// The problem that answers a failed transfer or resignation: its status, kind and title,
/// and the leader to retry at (the one the error names, else the one this node knows).
fn transfer_problem(node_id: u64, known_leader: Option<u64>, err: &TransferError) -> Problem {
    let (status, kind, title, leader_id) = match err {
        TransferError::NotLeader { leader_id } => (
            StatusCode::CONFLICT,
            "not-leader",
            "This node is not the leader",
            *leader_id,
        ),
        TransferError::UnknownNode { .. } => (
            StatusCode::BAD_REQUEST,
            "unknown-node",
            "No such voter",
            None,
        ),
        TransferError::NoCandidate => (
            StatusCode::CONFLICT,
            "no-candidate",
            "No other voter to transfer to",
            None,
        ),
        TransferError::Refused { .. } => (
            StatusCode::CONFLICT,
            "transfer-refused",
            "Transfer refused or abandoned by raft",
            None,
        ),
        TransferError::Superseded { leader_id, .. } => (
            StatusCode::CONFLICT,
            "transfer-superseded",
            "Another node became leader",
            Some(*leader_id),
        ),
        TransferError::TimedOut { .. } => (
            StatusCode::GATEWAY_TIMEOUT,
            "transfer-timeout",
            "Transfer did not complete in time",
            None,
        ),
        TransferError::Stopped => (
            StatusCode::SERVICE_UNAVAILABLE,
            "node-stopped",
            "The node stopped",
            None,
        ),
    };
    Problem::new(status, kind, err.to_string())
        .with_title(title)
        .with_node(node_id, leader_id.or(known_leader))
}

#[cfg(test)]
mod tests {
    use http::Request;
    use http_body_util::BodyExt as _;
    use palisade_protocol::Role;
    use palisade_protocol::headers::PROBLEM_JSON;
    use tokio::sync::mpsc;
    use tower::ServiceExt as _;

    use super::*;
    use crate::node::Msg;

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
            let (leadership, _) = watch::channel(Leadership {
                term: 7,
                leader_id: Some(2),
                role: Role::Follower,
                token: None,
                announced: false,
                proof: None,
                established: None,
                released_by: None,
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
                .map(|proxy| crate::lease::LeaseApi::new(60_000, std::slice::from_ref(proxy)));
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
                observer: Arc::new(crate::audit::Observer::new(
                    1,
                    &["http://127.0.0.1:1/<proxy>".to_owned()],
                    None,
                )),
                shutdown: CancellationToken::new(),
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
    }

    async fn call(app: Router, method: &str, uri: &str, body: &str) -> Answer {
        call_as(app, method, uri, "application/json", body).await
    }

    async fn call_as(
        app: Router,
        method: &str,
        uri: &str,
        content_type: &str,
        body: &str,
    ) -> Answer {
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
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
            assert_eq!(answer.content_type, PROBLEM_JSON);
            let problem: Problem = serde_json::from_str(&answer.body).unwrap();
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
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
        assert_eq!(
            answer.json()["type"],
            "https://palisade.invalid/problems/bad-body"
        );
        assert_eq!(answer.json()["node_id"], 1);
        let answer = call(node.app(), "POST", "/v1/transfer", r#"{"too":2}"#).await;
        assert_eq!(
            answer.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{}",
            answer.body
        );
        assert_eq!(answer.content_type, PROBLEM_JSON);
        assert!(node.inbox.as_mut().unwrap().try_recv().is_err());
    }

    /// Goal: unknown paths and wrong methods are 404 and 405 problems.
    /// Method: call an unknown path and `GET /v1/transfer`.
    #[tokio::test]
    async fn unknown_paths_and_methods_are_problems() {
        let mut node = TestNode::new(false);
        let answer = call(node.app(), "GET", "/v1/nope", "").await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{}", answer.body);
        assert_eq!(answer.content_type, PROBLEM_JSON);
        assert!(answer.body.contains("node API"), "{}", answer.body);
        let answer = call(node.app(), "GET", "/v1/transfer", "").await;
        assert_eq!(
            answer.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{}",
            answer.body
        );
        assert_eq!(answer.content_type, PROBLEM_JSON);
    }

    /// Goal: the test-fault routes do not exist on a node without test faults, and work
    /// on one with them.
    /// Method: GET and POST them on both kinds of node.
    #[tokio::test]
    async fn faults_route_exists_only_when_enabled() {
        let mut off = TestNode::new(false);
        for method in ["GET", "POST"] {
            let answer = call(off.app(), method, "/v1/test/faults", r#"{"drop":[2]}"#).await;
            assert_eq!(
                answer.status,
                StatusCode::NOT_FOUND,
                "{method}: {}",
                answer.body
            );
            assert_eq!(answer.content_type, PROBLEM_JSON);
        }
        let mut on = TestNode::new(true);
        let answer = call(on.app(), "POST", "/v1/test/faults", r#"{"drop":[2]}"#).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        assert_eq!(answer.json()["drop"], serde_json::json!([2]));
        let answer = call(on.app(), "POST", "/v1/test/faults", r#"{"drop":[9]}"#).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
        assert_eq!(
            answer.json()["type"],
            "https://palisade.invalid/problems/bad-faults"
        );
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
        assert_eq!(
            answer.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            answer.body
        );
        assert_eq!(
            answer.json()["type"],
            "https://palisade.invalid/problems/node-stopped"
        );
    }

    /// Goal: a node without leases answers 409 leases-off, and one with leases refuses
    /// a proxy it does not announce to with 403 unknown-proxy; neither reaches the loop.
    /// Method: post a lease request to both kinds of node; check the inbox stayed empty.
    #[tokio::test]
    async fn lease_refusals_before_the_loop() {
        let mut off = TestNode::new(false);
        let body = r#"{"proxy":"http://127.0.0.1:9001"}"#;
        let answer = call(off.app(), "POST", "/v1/lease", body).await;
        assert_eq!(answer.status, StatusCode::CONFLICT, "{}", answer.body);
        assert_eq!(answer.content_type, PROBLEM_JSON);
        let problem: Problem = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(problem.kind(), "leases-off");
        assert!(off.inbox.as_mut().unwrap().try_recv().is_err());

        let mut on = TestNode::new(false);
        on.lease_proxy = Some("http://127.0.0.1:9001/".to_owned());
        let other = r#"{"proxy":"http://127.0.0.1:9002"}"#;
        let answer = call(on.app(), "POST", "/v1/lease", other).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.body);
        let problem: Problem = serde_json::from_str(&answer.body).unwrap();
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
            assert_eq!(answer.status, status, "{content_type} {}", answer.body);
            assert_eq!(answer.content_type, PROBLEM_JSON);
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
        for _ in 0..crate::lease::LEASE_PENDING_MAX {
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
        assert_eq!(
            answer.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            answer.body
        );
        let problem: Problem = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(problem.kind(), crate::lease::LEASE_BUSY);
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
}
