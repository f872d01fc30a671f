//! Sessions on the node API: open, keep alive, revoke, list; and what the scopes routes
//! share with them (the service they call, the caller's identity, the problem of each
//! [`ScopeError`]).
//!
//! The rules are the node's [`ScopesService`]'s (`node`'s `scopes_service`), which these
//! routes share with embedding applications: every change goes through raft and is
//! answered once applied on this node, except keepalives: they touch only the leader's
//! deadlines (`scopes`' `lessor`), so a thousand sessions cost no log entries. A node that
//! is not the established leader answers 503 `not-leader` naming the leader it knows. What
//! is HTTP's is here: parsing, roles and owners, forwarding a follower's keepalive.

// The helpers here return the problem a refused request gets, built once per refusal
// on the control plane: its size does not matter, and boxing it would only add noise.
#![allow(clippy::result_large_err)]

use axum::extract::{Path, State};
use http::StatusCode;
use palisade_protocol::lease::NOT_LEADER;
use palisade_protocol::problem::kind;
use palisade_protocol::scopes::{SessionList, SessionRequest, SessionRevoked, SessionView};
use palisade_protocol::{CredentialRole, Problem};
use palisade_server::roles::Caller;
use palisade_server::{ApiJson, ApiProblem};

use super::state::{ApiState, Shared};
use crate::node::{ScopeError, ScopesService};
use crate::scopes::Refusal;

/// What the sessions and scopes routes read.
#[derive(Clone)]
pub(crate) struct ScopesApi {
    /// Named leaderships, as the node serves them in process.
    pub service: ScopesService,
    /// How this node speaks to the leader's API when it forwards a keepalive (its own
    /// certificate with mTLS, as for announcements).
    pub forward_tls: palisade_client::ClientTls,
}

/// Time a follower waits for the leader's answer to a keepalive it forwarded.
pub const KEEPALIVE_FORWARD_TIMEOUT_MS: u64 = 2_000;

/// The status and problem kind of `err`.
fn status_and_kind(err: &ScopeError) -> (StatusCode, &'static str) {
    let full = StatusCode::INSUFFICIENT_STORAGE;
    let unavailable = StatusCode::SERVICE_UNAVAILABLE;
    match err {
        ScopeError::Unavailable => (StatusCode::NOT_IMPLEMENTED, kind::SCOPES_UNAVAILABLE),
        ScopeError::BadTtl { .. } => (StatusCode::BAD_REQUEST, kind::BAD_TTL),
        ScopeError::BadScope { .. } => (StatusCode::BAD_REQUEST, kind::BAD_SCOPE),
        ScopeError::ClusterScope { .. } => (StatusCode::CONFLICT, kind::CLUSTER_SCOPE),
        ScopeError::NotLeader { .. } | ScopeError::Lost => (unavailable, NOT_LEADER),
        ScopeError::Refused(_) => (unavailable, kind::PROPOSAL_REFUSED),
        ScopeError::Stopped => (unavailable, kind::NODE_STOPPED),
        ScopeError::Refusal { refusal, .. } => match refusal {
            Refusal::UnknownSession => (StatusCode::NOT_FOUND, kind::UNKNOWN_SESSION),
            Refusal::SessionExists => (unavailable, kind::PROPOSAL_REFUSED),
            Refusal::TooManySessions => (full, kind::TOO_MANY_SESSIONS),
            Refusal::TooManyScopes => (full, kind::TOO_MANY_SCOPES),
            Refusal::TooManyWaiters => (full, kind::TOO_MANY_WAITERS),
            Refusal::SessionScopesFull => (full, kind::SESSION_SCOPES_FULL),
        },
        ScopeError::UnknownSession { .. } => (StatusCode::NOT_FOUND, kind::UNKNOWN_SESSION),
        ScopeError::SessionOwner { .. } => (StatusCode::FORBIDDEN, kind::SESSION_OWNER),
        ScopeError::KeepaliveTooFast { .. } => {
            (StatusCode::TOO_MANY_REQUESTS, kind::KEEPALIVE_TOO_FAST)
        }
        ScopeError::CampaignTimeout { .. } => (StatusCode::CONFLICT, kind::CAMPAIGN_TIMEOUT),
        ScopeError::FencePending { .. } => (unavailable, kind::FENCE_PENDING),
        ScopeError::Unexpected(_) => (StatusCode::INTERNAL_SERVER_ERROR, kind::PROPOSAL_REFUSED),
    }
}

impl ApiState {
    /// The named-leaderships routes' state, or 501 where this cluster cannot grant named
    /// scopes.
    pub(super) fn scopes_api(&self) -> Result<&ScopesApi, ApiProblem> {
        match self.scopes.as_ref() {
            Some(api) if api.service.available() => Ok(api),
            _ => Err(self.scope_problem(&ScopeError::Unavailable)),
        }
    }

    /// The problem of a named-leaderships call that was not carried out: its status and
    /// kind, the error's text as the detail.
    pub(super) fn scope_problem(&self, err: &ScopeError) -> ApiProblem {
        let (status, kind) = status_and_kind(err);
        self.problem(Problem::new(status, kind, err.to_string()))
    }

    /// 503 `not-leader`, naming the leader this node knows.
    fn not_leader(&self) -> ApiProblem {
        self.scope_problem(&ScopeError::NotLeader { leader_id: None })
    }
}

/// The identity that owns what `caller` opens: its certificate's first name.
pub(super) fn owner_of(caller: &Caller) -> Option<String> {
    caller.0.as_ref().and_then(|c| c.names().first().cloned())
}

/// `POST /v1/sessions`.
pub(super) async fn open(
    State(state): State<Shared>,
    caller: Caller,
    body: Result<ApiJson<SessionRequest>, ApiProblem>,
) -> Result<ApiJson<SessionView>, ApiProblem> {
    let api = state.scopes_api()?;
    let ApiJson(request) = body.map_err(|p| state.problem(p.0))?;
    api.service
        .open(request.ttl_ms, owner_of(&caller).as_deref())
        .await
        .map(ApiJson)
        .map_err(|err| state.scope_problem(&err))
}

/// `POST /v1/sessions/{id}/keepalive`. On a follower it is forwarded to the leader (see
/// [`forward_keepalive`]). A node credential (a forwarding follower) may keep any session
/// alive: the follower checked the session's owner against its own caller.
pub(super) async fn keepalive(
    State(state): State<Shared>,
    Path(id): Path<String>,
    caller: Caller,
) -> Result<ApiJson<SessionView>, ApiProblem> {
    let api = state.scopes_api()?;
    if state.leadership.borrow().established.is_none() {
        return forward_keepalive(&state, api, &id, &caller).await;
    }
    let forwarded = state.roles_enforced && caller.has_any(&[CredentialRole::Node]);
    let answer = if forwarded {
        api.service.keepalive_for_node(&id).await
    } else {
        api.service
            .keepalive(&id, owner_of(&caller).as_deref())
            .await
    };
    answer.map(ApiJson).map_err(|err| state.scope_problem(&err))
}

/// A follower's keepalive: checked here (the session as this node applied it, and its
/// owner against the caller), then sent to the leader this node follows, at the URL the
/// leader recorded when it took office, and its answer passed back. Only the leader says
/// 404: a session this follower has not applied yet, a leader of another term, or a
/// leader that cannot be reached are 503 `not-leader` (the client then asks the leader).
/// The client counts its trust from when it sent the keepalive, before this hop, so the
/// extra hop never lengthens it.
async fn forward_keepalive(
    state: &ApiState,
    api: &ScopesApi,
    id: &str,
    caller: &Caller,
) -> Result<ApiJson<SessionView>, ApiProblem> {
    let not_leader = || state.not_leader();
    let (leader_id, term) = {
        let l = state.leadership.borrow();
        (l.leader_id, l.term)
    };
    let url = {
        let machine = api.service.machine().borrow();
        if !machine.sessions.contains_key(id) {
            return Err(not_leader());
        }
        ScopesService::owned_session(&machine, id, owner_of(caller).as_deref())
            .map_err(|err| state.scope_problem(&err))?;
        match &machine.leader_api {
            Some(l)
                if Some(l.node_id) == leader_id && l.term == term && l.node_id != state.node_id =>
            {
                l.url.clone()
            }
            _ => return Err(not_leader()),
        }
    };
    let timeout = std::time::Duration::from_millis(KEEPALIVE_FORWARD_TIMEOUT_MS);
    let leader = palisade_client::NodeApi::with_tls(&url, &api.forward_tls)
        .map_err(|_| not_leader())?
        .timeout(timeout);
    match leader.keepalive(id).await {
        Ok(view) => Ok(ApiJson(view)),
        Err(err) if err.status() == Some(StatusCode::NOT_FOUND) => {
            Err(state.scope_problem(&ScopeError::UnknownSession {
                session: id.to_owned(),
            }))
        }
        Err(err) if err.status() == Some(StatusCode::TOO_MANY_REQUESTS) => {
            Err(state.problem(Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                kind::KEEPALIVE_TOO_FAST,
                format!("the leader refused the keepalive: {err}"),
            )))
        }
        Err(err) => {
            tracing::debug!(node_id = state.node_id, url, cause = %err, "keepalive not forwarded");
            Err(not_leader())
        }
    }
}

/// `DELETE /v1/sessions/{id}`.
pub(super) async fn revoke(
    State(state): State<Shared>,
    Path(id): Path<String>,
    caller: Caller,
) -> Result<ApiJson<SessionRevoked>, ApiProblem> {
    let api = state.scopes_api()?;
    api.service
        .revoke(&id, owner_of(&caller).as_deref())
        .await
        .map(ApiJson)
        .map_err(|err| state.scope_problem(&err))
}

/// `GET /v1/sessions`: every live session (deadlines only on the leader).
pub(super) async fn list(State(state): State<Shared>) -> Result<ApiJson<SessionList>, ApiProblem> {
    let api = state.scopes_api()?;
    let sessions = api
        .service
        .sessions()
        .map_err(|err| state.scope_problem(&err))?;
    Ok(ApiJson(SessionList { sessions }))
}
