//! The admin API, on axum: read and advance fences, Prometheus metrics, health.
//!
//! - `GET /v1/fences` -> [`FenceList`]
//! - `GET /v1/fences/{scope}` -> [`FenceView`] (token 0 when never seen)
//! - `POST /v1/fences/{scope}` with [`AdvanceRequest`] -> [`AdvanceResponse`]: advances
//!   the fence without a write, through the same admission as a write. It answers 200
//!   only once no lower-token write of the scope is still in flight (503 if they do not
//!   finish within the barrier timeout; the fence is raised either way), so a new leader
//!   that has announced knows its predecessor is done. A token below the fence is 409.
//!   With `token_pub`, a valid `proof` authorizes it without the admin token.
//! - `POST /v1/fences/{scope}/reset` with [`ResetRequest`] -> [`ResetResponse`]: sets the
//!   fence to any value, lower included, once the scope's writes in flight are done. The
//!   admin token is required; without one configured resets are disabled (403).
//! - `GET /v1/lease` -> [`LeaseView`]: fleet mode's lease (404 `leases-off` in
//!   standalone mode).
//! - `GET /metrics` (Prometheus text), `GET /healthz` -> [`Health`] (`degraded`, with the
//!   reason, while a fleet's cluster refuses this proxy a lease for a reason an operator
//!   must fix).
//! - `GET /v1/status` -> [`ProxyStatus`](palisade_protocol::ProxyStatus), and `GET /`, the
//!   same as an HTML page for people (see [`crate::status_page`]). Admin reads: they need
//!   the admin token when one is configured.
//!
//! Advances and resets are reported to the status page's activity and the audit log
//! (`announce`, `reset` records); raises are reported by the fencer itself.
//!
//! Who may call what is decided by the [`crate::auth`] layer, except for an advance,
//! whose handler accepts a valid proof in place of the admin token (`authorize_advance`).
//!
//! Every error is problem+json: a fencing error is rendered by
//! [`ProxyError::to_problem`], as on the data path; unknown paths (404), wrong methods
//! (405) and bad or oversized bodies come from the protocol's control-plane stack.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::rejection::{ExtensionRejection, PathRejection};
use axum::extract::{ConnectInfo, Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use palisade_protocol::admin::{
    FENCES_PATH, HEALTHZ_PATH, METRICS_PATH, RESET_REASON_BYTES_MAX, ResetRequest, ResetResponse,
};
use palisade_protocol::headers::PROMETHEUS_TEXT;
use palisade_protocol::lease::{LEASE_PATH, LEASES_OFF, LeaseView};
use palisade_protocol::problem::kind;
use palisade_protocol::process::events;
use palisade_protocol::status::{STATUS_PAGE_PATH, STATUS_PATH};
use palisade_protocol::{
    AdvanceRequest, AdvanceResponse, FenceList, FenceView, Health, Problem, Scope,
};
use palisade_server::{ApiJson, ApiProblem, ControlLimits, finish};

use crate::auth::{ADVANCE_ROUTE, AdminAuth, AuthError, require_admin};
use crate::error::ProxyError;
use crate::fencing::Fencer;
use crate::fleet::Lease;
use crate::metrics as m;
use crate::proof::ProofVerifier;

/// Largest admin request body. The largest valid one is a reset whose 512-byte reason is
/// written wholly in `\uXXXX` escapes (3,072 bytes) plus its token; an advance with its
/// proof is under 150. Nothing larger is ever a valid request.
pub(crate) const ADMIN_BODY_BYTES_MAX: usize = 4096;
/// Time an admin keep-alive connection may stay idle between requests. Its callers are
/// operators' tools and election nodes announcing leaders; a pooled connection idle this
/// long is not saving anyone a handshake, and closing it frees a slot.
pub(crate) const ADMIN_KEEPALIVE_TIMEOUT_MS: u64 = 15_000;

/// What the admin listener's accept loop allows: its own connection limit and header
/// timeout (`limits.admin_connections_max`, `limits.admin_header_read_timeout_ms`), apart
/// from the data port's, so that neither the data port nor idle admin connections lock
/// out the announce or the operator; idle-first eviction at the limit; and the request
/// timeout ([`palisade_server::CONTROL_REQUEST_TIMEOUT_MS`]), within which a body must
/// arrive, read before the request holds its connection, so that clients sending slow
/// bodies are evictable and cannot fill the port.
pub(crate) fn limits(config: &crate::config::Limits, drain_timeout: Duration) -> ControlLimits {
    ControlLimits {
        name: "admin",
        connections_max: config.admin_connections_max,
        header_read_timeout: Duration::from_millis(config.admin_header_read_timeout_ms),
        request_timeout: Duration::from_millis(palisade_server::CONTROL_REQUEST_TIMEOUT_MS),
        keepalive_timeout: Duration::from_millis(ADMIN_KEEPALIVE_TIMEOUT_MS),
        drain_timeout,
        on_close: Some(m::connection_closed),
    }
}

/// What the admin handlers share.
pub(crate) struct AdminState {
    /// The same fencer the data path admits through.
    pub(crate) fencer: Arc<Fencer>,
    /// Fleet mode: the lease, for `GET /v1/lease` and the status page.
    pub(crate) lease: Option<Arc<Lease>>,
    /// The proof verifier, when `token_pub` is set (shared with the data path).
    pub(crate) proofs: Option<Arc<ProofVerifier>>,
    /// The admin credential.
    pub(crate) auth: Arc<AdminAuth>,
    /// The upstream as the status page names it (its URL, or `embedded`).
    pub(crate) upstream: String,
    /// This admin listener's address, for the status page's subtitle.
    pub(crate) admin_addr: String,
}

type AdminRef = State<Arc<AdminState>>;

/// The admin API's router, behind the [`require_admin`] layer.
pub(crate) fn app(state: AdminState) -> Router {
    let auth = Arc::clone(&state.auth);
    let router = Router::new()
        .route(FENCES_PATH, get(list))
        .route(ADVANCE_ROUTE, get(read).post(advance))
        .route(&format!("{ADVANCE_ROUTE}/reset"), post(reset))
        .route(LEASE_PATH, get(lease))
        .route(METRICS_PATH, get(metrics))
        .route(HEALTHZ_PATH, get(health))
        .route(STATUS_PAGE_PATH, get(status_page))
        .route(STATUS_PATH, get(status))
        .with_state(Arc::new(state));
    // The layer goes on last, so that it also guards the 404 and 405 answers: without
    // the credential, a caller learns nothing about which paths exist.
    finish(router, "admin API", ADMIN_BODY_BYTES_MAX)
        .layer(axum::middleware::from_fn_with_state(auth, require_admin))
}

/// `GET /v1/fences`.
async fn list(State(state): AdminRef) -> ApiJson<FenceList> {
    let fences = state
        .fencer
        .fence_register()
        .list()
        .into_iter()
        .filter_map(|(name, token)| match Scope::new(name) {
            Ok(scope) => Some(FenceView { scope, token }),
            // Every stored scope passed the same check on its way in; one that does not
            // now was written by something else, and is left out rather than failing the
            // whole list.
            Err(err) => {
                tracing::warn!(cause = %err, "stored fence has an invalid scope; not listed");
                None
            }
        })
        .collect();
    ApiJson(FenceList { fences })
}

/// `GET /v1/fences/{scope}`.
async fn read(
    State(state): AdminRef,
    path: Result<Path<String>, PathRejection>,
) -> Result<ApiJson<FenceView>, ApiProblem> {
    let scope = scope_of(path).map_err(|err| err.to_problem())?;
    let token = state.fencer.fence_register().current(&scope);
    Ok(ApiJson(FenceView { scope, token }))
}

/// `POST /v1/fences/{scope}`. The scope is checked before the body, so a request wrong
/// in both is told about the path first; then the authorization, before anything moves.
async fn advance(
    State(state): AdminRef,
    peer: Result<ConnectInfo<SocketAddr>, ExtensionRejection>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<ApiJson<AdvanceRequest>, ApiProblem>,
) -> Result<ApiJson<AdvanceResponse>, Response> {
    let scope = scope_of(path).map_err(|err| ApiProblem(err.to_problem()).into_response())?;
    let ApiJson(AdvanceRequest { token, proof }) = body.map_err(IntoResponse::into_response)?;
    state
        .authorize_advance(&scope, token, proof.as_deref(), &headers)
        .map_err(IntoResponse::into_response)?;
    // The same admission as a write: raise the fence, then wait at the barrier.
    let peer = peer.ok().map(|ConnectInfo(addr)| addr);
    let activity = state.fencer.activity();
    let admitted = state.fencer.admit(&scope, token).await.map_err(|err| {
        tracing::info!(scope = %scope, token, cause = %err, "admin advance refused");
        let current = state.fencer.fence_register().current(&scope);
        activity.announced(
            &scope,
            token,
            "refused",
            current,
            peer,
            Some(err.to_string()),
        );
        ApiProblem(err.to_problem()).into_response()
    })?;
    let advanced = admitted.raised;
    drop(admitted);
    let outcome = if advanced { "advanced" } else { "unchanged" };
    let current = state.fencer.fence_register().current(&scope);
    activity.announced(&scope, token, outcome, current, peer, None);
    Ok(ApiJson(AdvanceResponse {
        scope,
        token,
        advanced,
    }))
}

impl AdminState {
    /// Whether an advance of `scope` to `token` may go ahead. With `token_pub`, a proof
    /// must verify if one is given, and suffices; without a proof the admin token is
    /// needed, and with keys but no admin token nothing else is accepted (keys make the
    /// proof the credential). Without keys a proof is ignored (it cannot be checked) and
    /// the admin token, if any, is needed.
    fn authorize_advance(
        &self,
        scope: &Scope,
        token: u64,
        proof: Option<&str>,
        headers: &HeaderMap,
    ) -> Result<(), Refusal> {
        let refused = |err: ProxyError| {
            tracing::warn!(event = events::PROOF_REJECTED, scope = %scope, token, cause = %err,
                "admin advance refused");
            Refusal::Proof(err)
        };
        match (&self.proofs, proof, &self.auth.token) {
            (Some(verifier), Some(text), _) => verifier
                .check(scope.as_str(), token, text.as_bytes())
                .map_err(|fault| {
                    refused(ProxyError::InvalidProof {
                        scope: scope.to_string(),
                        presented: token,
                        fault,
                    })
                }),
            (Some(_), None, None) => Err(refused(ProxyError::MissingProof {
                scope: scope.to_string(),
                presented: token,
            })),
            (_, _, Some(admin)) => admin.check(headers).map_err(|err| {
                tracing::warn!(scope = %scope, token, cause = %err, "admin advance refused");
                Refusal::Auth(err)
            }),
            (None, _, None) => Ok(()),
        }
    }
}

/// Why an advance was not authorized: its proof, or the admin credential.
enum Refusal {
    Proof(ProxyError),
    Auth(AuthError),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Self::Proof(err) => ApiProblem(err.to_problem()).into_response(),
            Self::Auth(err) => err.into_response(),
        }
    }
}

/// `POST /v1/fences/{scope}/reset`. The layer has checked the admin token; without one
/// configured, resets are refused outright.
async fn reset(
    State(state): AdminRef,
    path: Result<Path<String>, PathRejection>,
    body: Result<ApiJson<ResetRequest>, ApiProblem>,
) -> Result<ApiJson<ResetResponse>, Response> {
    if state.auth.token.is_none() {
        return Err(AuthError::ResetDisabled.into_response());
    }
    let scope = scope_of(path).map_err(|err| ApiProblem(err.to_problem()).into_response())?;
    let ApiJson(ResetRequest { token, reason }) = body.map_err(IntoResponse::into_response)?;
    check_reason(&reason).map_err(|detail| {
        ApiProblem(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            kind::BAD_BODY,
            detail,
        ))
        .into_response()
    })?;
    let previous = state.fencer.reset(scope.as_str(), token).await.map_err(|err| {
        tracing::warn!(scope = %scope, token, reason = reason.as_str(), cause = %err, "fence reset failed");
        ApiProblem(err.to_problem()).into_response()
    })?;
    if let Some(proofs) = &state.proofs {
        proofs.forget(scope.as_str());
    }
    metrics::counter!(m::FENCE_RESETS).increment(1);
    (state.fencer.activity()).reset(scope.as_str(), token, previous, &reason);
    tracing::warn!(event = events::FENCE_RESET, scope = %scope, reason = reason.as_str(), previous, token,
        "fence reset by an operator");
    Ok(ApiJson(ResetResponse {
        scope,
        previous,
        token,
    }))
}

/// A reset's reason: 1 to [`RESET_REASON_BYTES_MAX`] bytes of printable text (it goes to
/// the log as it is, so no control characters that could forge log lines). The error is
/// the detail of a 422.
fn check_reason(reason: &str) -> Result<(), String> {
    if reason.trim().is_empty() {
        return Err("reason is empty; a reset must say why".into());
    }
    if reason.len() > RESET_REASON_BYTES_MAX {
        return Err(format!(
            "reason is {} bytes; at most {RESET_REASON_BYTES_MAX}",
            reason.len()
        ));
    }
    if reason.chars().any(char::is_control) {
        return Err("reason holds a control character".into());
    }
    Ok(())
}

/// The scope named by the path, or the bad-scope error the data path gives (400).
fn scope_of(path: Result<Path<String>, PathRejection>) -> Result<Scope, ProxyError> {
    let Path(name) = path.map_err(|rejection| ProxyError::BadScope {
        reason: rejection.body_text(),
    })?;
    Scope::new(name).map_err(|err| ProxyError::BadScope {
        reason: err.to_string(),
    })
}

/// `GET /v1/lease`.
async fn lease(State(state): AdminRef) -> Result<ApiJson<LeaseView>, ApiProblem> {
    match &state.lease {
        Some(lease) => Ok(ApiJson(lease.view())),
        None => Err(Problem::new(
            StatusCode::NOT_FOUND,
            LEASES_OFF,
            "this proxy is not in fleet mode (no cluster configured), so it holds no lease",
        )
        .into()),
    }
}

/// `GET /metrics`.
async fn metrics(State(state): AdminRef) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(PROMETHEUS_TEXT),
        )],
        crate::metrics::render(&state.fencer),
    )
}

/// `GET /v1/status`.
async fn status(State(state): AdminRef) -> ApiJson<palisade_protocol::ProxyStatus> {
    ApiJson(crate::status_page::snapshot(
        &state.fencer,
        state.lease.as_deref(),
        &state.upstream,
    ))
}

/// `GET /`: the status page.
async fn status_page(State(state): AdminRef) -> axum::response::Response {
    let snapshot =
        crate::status_page::snapshot(&state.fencer, state.lease.as_deref(), &state.upstream);
    palisade_server::html::page_response(crate::status_page::render(&snapshot, &state.admin_addr))
}

/// `GET /healthz`: `ok`, or `degraded` (still 200: the process serves, and a fleet's
/// proxies all sharing the cause should not all be taken out of a balancer for it) with
/// the cluster's refusal in `detail`, when in fleet mode the cluster refuses this proxy a
/// lease for a reason an operator must fix (nodes without `--lease-ms`, say).
async fn health(State(state): AdminRef) -> ApiJson<Health> {
    match state.lease.as_ref().and_then(|lease| lease.refusal()) {
        Some(refusal) => ApiJson(Health::degraded(None, refusal)),
        None => ApiJson(Health::ok(None)),
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use http::{Method, Request, StatusCode};
    use http_body_util::BodyExt as _;
    use palisade_protocol::headers::{FENCING_TOKEN_CURRENT, JSON, PROBLEM_JSON};
    use tower::ServiceExt as _;

    use super::*;

    fn fencer(dir: &tempfile::TempDir) -> Arc<Fencer> {
        let db = palisade_storage::open_database(&dir.path().join("a.redb")).unwrap();
        let register = palisade_storage::FenceRegister::open(db, 100).unwrap();
        Arc::new(Fencer::new(register, Duration::from_millis(200)))
    }

    /// One request through the router: status, content type, body.
    async fn call(
        fencer: &Arc<Fencer>,
        method: Method,
        uri: &str,
        body: &str,
    ) -> (StatusCode, http::HeaderMap, String) {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, JSON)
            .body(Body::from(body.to_owned()))
            .unwrap();
        let state = AdminState {
            fencer: Arc::clone(fencer),
            lease: None,
            proofs: None,
            auth: Arc::new(AdminAuth {
                token: None,
                metrics_public: false,
            }),
            upstream: "embedded".to_owned(),
            admin_addr: "127.0.0.1:0".to_owned(),
        };
        let response = app(state).oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, String::from_utf8(bytes.to_vec()).unwrap())
    }

    /// Goal: an advance moves the fence and reads back typed; a stale one is 409 with the
    /// fencing members and `Fencing-Token-Current`, as the data path answers it.
    /// Method: advance to 5, advance to 3, read the fence, through `oneshot`.
    #[tokio::test]
    async fn advance_then_stale_advance() {
        let dir = tempfile::tempdir().unwrap();
        let f = fencer(&dir);
        let (s, _, b) = call(&f, Method::POST, "/v1/fences/jobs", r#"{"token":5}"#).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        let answer: AdvanceResponse = serde_json::from_str(&b).unwrap();
        assert_eq!((answer.scope.as_str(), answer.token), ("jobs", 5));
        assert!(answer.advanced);

        let (s, h, b) = call(&f, Method::POST, "/v1/fences/jobs", r#"{"token":3}"#).await;
        assert_eq!(s, StatusCode::CONFLICT, "{b}");
        assert_eq!(h[header::CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(h[FENCING_TOKEN_CURRENT], "5");
        let problem: Problem = serde_json::from_str(&b).unwrap();
        let expected = ProxyError::Stale {
            scope: "jobs".into(),
            presented: 3,
            current: 5,
        }
        .to_problem();
        assert_eq!(problem, expected);

        let (s, _, b) = call(&f, Method::GET, "/v1/fences/jobs", "").await;
        assert_eq!(s, StatusCode::OK);
        let view: FenceView = serde_json::from_str(&b).unwrap();
        assert_eq!(view.token, 5);
    }

    /// Goal: a scope outside the rule in the path is 400 problem+json of kind bad-scope,
    /// whether it is too long or smuggles a `/` as `%2F`; the fence table is untouched.
    /// Method: GET and POST such paths, then list the fences.
    #[tokio::test]
    async fn bad_scopes_in_the_path_are_400() {
        let dir = tempfile::tempdir().unwrap();
        let f = fencer(&dir);
        let long = format!(
            "/v1/fences/{}",
            "x".repeat(palisade_protocol::SCOPE_BYTES_MAX + 1)
        );
        for (method, uri) in [
            (Method::GET, long.as_str()),
            (Method::POST, long.as_str()),
            (Method::POST, "/v1/fences/a%2Fb"),
            (Method::GET, "/v1/fences/a%20b"),
        ] {
            let (s, h, b) = call(&f, method.clone(), uri, r#"{"token":1}"#).await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{method} {uri}: {b}");
            assert_eq!(h[header::CONTENT_TYPE], PROBLEM_JSON);
            let problem: Problem = serde_json::from_str(&b).unwrap();
            assert_eq!(problem.kind(), "bad-scope", "{b}");
        }
        let (_, _, b) = call(&f, Method::GET, "/v1/fences", "").await;
        let list: FenceList = serde_json::from_str(&b).unwrap();
        assert!(list.fences.is_empty(), "{b}");
    }

    /// Goal: `/healthz` is JSON health, `/metrics` Prometheus text.
    /// Method: GET both through `oneshot`.
    #[tokio::test]
    async fn health_is_json_and_metrics_are_prometheus_text() {
        let dir = tempfile::tempdir().unwrap();
        let f = fencer(&dir);
        let (s, h, b) = call(&f, Method::GET, "/healthz", "").await;
        assert_eq!(
            (s, &h[header::CONTENT_TYPE]),
            (StatusCode::OK, &HeaderValue::from_static(JSON))
        );
        assert_eq!(
            serde_json::from_str::<Health>(&b).unwrap(),
            Health::ok(None)
        );
        let (s, h, _) = call(&f, Method::GET, "/metrics", "").await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(h[header::CONTENT_TYPE], PROMETHEUS_TEXT);
    }

    /// Goal: a standalone proxy has no lease to show: `GET /v1/lease` is a 404 problem of
    /// kind leases-off, not an empty view a tool could mistake for a lapsed lease.
    /// Method: GET it through `oneshot` on a fencer without a lease.
    #[tokio::test]
    async fn lease_view_is_404_leases_off_in_standalone_mode() {
        let dir = tempfile::tempdir().unwrap();
        let f = fencer(&dir);
        let (s, h, b) = call(&f, Method::GET, LEASE_PATH, "").await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{b}");
        assert_eq!(h[header::CONTENT_TYPE], PROBLEM_JSON);
        let problem: Problem = serde_json::from_str(&b).unwrap();
        assert_eq!(problem.kind(), LEASES_OFF);
    }

    /// Goal: the status page and `/v1/status` show fences with their raise, and a
    /// rejection row with its fields, and a hostile path comes out escaped, never as
    /// markup. Method: advance `jobs` to 5 through the router, record a stale write whose
    /// path holds `<script>`, GET `/` and `/v1/status` through `oneshot`.
    #[tokio::test]
    async fn status_page_shows_fences_and_rejections_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let f = fencer(&dir);
        let (s, _, b) = call(&f, Method::POST, "/v1/fences/jobs", r#"{"token":5}"#).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        let stale = ProxyError::Stale {
            scope: "jobs".into(),
            presented: 3,
            current: 5,
        };
        let peer = HeaderValue::from_static("192.0.2.7");
        f.activity().refused(
            &stale,
            &Method::PUT,
            "/<script>alert(1)</script>",
            Some(&peer),
        );

        let (s, headers, page) = call(&f, Method::GET, "/", "").await;
        assert_eq!(s, StatusCode::OK, "{page}");
        assert!(
            headers[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/html")
        );
        assert!(page.contains("http-equiv=\"refresh\""), "{page}");
        assert!(!page.contains("<script>"), "{page}");
        assert!(
            page.contains("/&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{page}"
        );
        assert!(page.contains("192.0.2.7"), "{page}");
        assert!(page.contains("Recent rejections (1 since start"), "{page}");
        assert!(
            page.contains("s ago") || page.contains("just now"),
            "{page}"
        );

        let (s, _, json) = call(&f, Method::GET, "/v1/status", "").await;
        assert_eq!(s, StatusCode::OK, "{json}");
        let status: palisade_protocol::ProxyStatus = serde_json::from_str(&json).unwrap();
        let fence = &status.fences[0];
        assert_eq!((fence.scope.as_str(), fence.token), ("jobs", 5));
        assert_eq!(fence.raised_from, Some(0));
        assert!(fence.raised_at.is_some());
        let rejection = &status.rejections[0];
        assert_eq!((rejection.presented, rejection.current), (Some(3), Some(5)));
        assert_eq!(
            rejection.path.as_deref(),
            Some("/<script>alert(1)</script>")
        );
        assert_eq!(status.rejections_total, 1);
        assert!(status.lease.is_none() && status.audit.is_none());
    }

    /// Goal: the status page and `/v1/status` are admin reads: with an admin token
    /// configured they are 401 without it and 200 with it (they show tokens, client
    /// addresses and paths). Method: GET both through `oneshot` on a router with a token.
    #[tokio::test]
    async fn status_page_needs_the_admin_token_when_one_is_configured() {
        let dir = tempfile::tempdir().unwrap();
        let f = fencer(&dir);
        let secret = "0123456789abcdef0123456789abcdef";
        for path in ["/", "/v1/status"] {
            for bearer in [None, Some(secret)] {
                let mut request = Request::builder().method(Method::GET).uri(path);
                if let Some(b) = bearer {
                    request = request.header(header::AUTHORIZATION, format!("Bearer {b}"));
                }
                let state = AdminState {
                    fencer: Arc::clone(&f),
                    lease: None,
                    proofs: None,
                    auth: Arc::new(AdminAuth {
                        token: Some(crate::auth::AdminToken::new(secret.as_bytes())),
                        metrics_public: false,
                    }),
                    upstream: "embedded".to_owned(),
                    admin_addr: "127.0.0.1:0".to_owned(),
                };
                let response = app(state)
                    .oneshot(request.body(Body::empty()).unwrap())
                    .await
                    .unwrap();
                let expected = if bearer.is_some() {
                    StatusCode::OK
                } else {
                    StatusCode::UNAUTHORIZED
                };
                assert_eq!(response.status(), expected, "{path} with {bearer:?}");
            }
        }
    }
}
