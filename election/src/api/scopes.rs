//! Scopes on the node API: campaign, resign, read or observe one, list the held ones. The
//! rules are the node's [`ScopesService`](crate::ScopesService)'s; what is HTTP's is here.
//!
//! A campaign answers 200 with the grant only once the session holds the scope **and**
//! every announce proxy fences the scope at its token (`announce`'s `grants`); a session
//! that already holds the scope gets the same grant again. When its timeout passes first:
//! - still waiting: the session stops waiting (a resign is proposed) and the answer is
//!   409 `campaign-timeout`;
//! - holding, but not every proxy fences it yet: 503 `fence-pending`; the session keeps
//!   the scope, and campaigning again returns the grant once the proxies fence it.
//!
//! Reads are answered by any node from what it applied.

// The helpers here return the problem a refused request gets, built once per refusal
// on the control plane: its size does not matter, and boxing it would only add noise.
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use palisade_protocol::problem::kind;
use palisade_protocol::scopes::{
    CAMPAIGN_TIMEOUT_MS_DEFAULT, CampaignQuery, Grant, ObserveQuery, Resigned, ScopeList,
    ScopeView, SessionRef,
};
use palisade_protocol::{Problem, Scope};
use palisade_server::roles::Caller;
use palisade_server::{ApiJson, ApiProblem, ApiQuery};

use super::leader::LONG_POLL_TIMEOUT_MS_MAX;
use super::long_polls::{LONG_POLL_RETRY_AFTER_S, LongPolls, client_of};
use super::sessions::owner_of;
use super::state::{ApiState, Shared};
use crate::scopes::Machine;

impl ApiState {
    /// The scope named in a path, if it is a valid name other than the cluster's own.
    fn named_scope(
        &self,
        service: &crate::ScopesService,
        name: &str,
    ) -> Result<String, ApiProblem> {
        // `.` and `..` are scope names, but not in a URL path: a client's URL parser
        // turns them into path steps before the request is sent.
        if let Ok(scope) = Scope::new(name)
            && matches!(scope.as_str(), "." | "..")
        {
            return Err(self.problem(Problem::new(
                StatusCode::BAD_REQUEST,
                kind::BAD_SCOPE,
                format!("scope {scope:?} cannot be named in a node API path"),
            )));
        }
        service
            .named_scope(name)
            .map_err(|err| self.scope_problem(&err))
    }
}

/// A place among the long polls, or the 429 that refuses one.
fn long_poll_place(
    state: &ApiState,
    polls: &Arc<LongPolls>,
    extensions: &http::Extensions,
) -> Result<super::long_polls::Held, Response> {
    let client = client_of(extensions);
    polls.enter(client.clone()).map_err(|over| {
        state.metrics.long_poll_refused(over.as_str());
        let mut response = state.problem(over.problem(&client)).into_response();
        response.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from(LONG_POLL_RETRY_AFTER_S),
        );
        response
    })
}

/// `POST /v1/scopes/{scope}/campaign`.
pub(super) async fn campaign(
    State(state): State<Shared>,
    Path(name): Path<String>,
    caller: Caller,
    query: Result<ApiQuery<CampaignQuery>, ApiProblem>,
    body: Result<ApiJson<SessionRef>, ApiProblem>,
) -> Result<ApiJson<Grant>, Response> {
    let fail = |p: ApiProblem| p.into_response();
    let api = state.scopes_api().map_err(fail)?.clone();
    let ApiQuery(query) = query.map_err(|p| state.problem(p.0).into_response())?;
    let ApiJson(SessionRef { session }) = body.map_err(|p| state.problem(p.0).into_response())?;
    let scope = state.named_scope(&api.service, &name).map_err(fail)?;
    // No long-poll place: a campaign needs a session (a writer's credential over mTLS),
    // the connection table bounds how many wait, and each scope's queue has its limit.
    let timeout = Duration::from_millis(
        query
            .timeout_ms
            .unwrap_or(CAMPAIGN_TIMEOUT_MS_DEFAULT)
            .min(LONG_POLL_TIMEOUT_MS_MAX),
    );
    api.service
        .campaign(&scope, &session, owner_of(&caller).as_deref(), timeout)
        .await
        .map(ApiJson)
        .map_err(|err| fail(state.scope_problem(&err)))
}

/// `POST /v1/scopes/{scope}/resign`.
pub(super) async fn resign(
    State(state): State<Shared>,
    Path(name): Path<String>,
    caller: Caller,
    body: Result<ApiJson<SessionRef>, ApiProblem>,
) -> Result<ApiJson<Resigned>, ApiProblem> {
    let api = state.scopes_api()?;
    let ApiJson(SessionRef { session }) = body.map_err(|p| state.problem(p.0))?;
    let scope = state.named_scope(&api.service, &name)?;
    api.service
        .resign(&scope, &session, owner_of(&caller).as_deref())
        .await
        .map(ApiJson)
        .map_err(|err| state.scope_problem(&err))
}

/// `GET /v1/scopes/{scope}`, plain or as a long poll (`after_token`, `timeout_ms`).
pub(super) async fn read(
    State(state): State<Shared>,
    Extension(polls): Extension<Arc<LongPolls>>,
    Path(name): Path<String>,
    extensions: http::Extensions,
    query: Result<ApiQuery<ObserveQuery>, ApiProblem>,
) -> Result<ApiJson<ScopeView>, Response> {
    let api = state
        .scopes_api()
        .map_err(IntoResponse::into_response)?
        .clone();
    let ApiQuery(query) = query.map_err(|p| state.problem(p.0).into_response())?;
    let scope = state
        .named_scope(&api.service, &name)
        .map_err(IntoResponse::into_response)?;
    let mut machine = api.service.machine().clone();
    let now = api.service.view_in(&machine.borrow_and_update(), &scope);
    if query.after_token.is_none() && query.timeout_ms.is_none() {
        return Ok(ApiJson(now));
    }
    let _place = long_poll_place(&state, &polls, &extensions)?;
    let timeout = Duration::from_millis(
        query
            .timeout_ms
            .unwrap_or(super::leader::LONG_POLL_TIMEOUT_MS_DEFAULT)
            .min(LONG_POLL_TIMEOUT_MS_MAX),
    );
    let known = query.after_token;
    let changed = |m: &Arc<Machine>| m.holder(&scope).map(|h| h.token) != known;
    tokio::select! {
        () = state.shutdown.cancelled() => {}
        _ = tokio::time::timeout(timeout, machine.wait_for(changed)) => {}
    }
    let latest = Arc::clone(&api.service.machine().borrow());
    Ok(ApiJson(api.service.view_in(&latest, &scope)))
}

/// `GET /v1/scopes`: the held scopes.
pub(super) async fn list(State(state): State<Shared>) -> Result<ApiJson<ScopeList>, ApiProblem> {
    let api = state.scopes_api()?;
    let scopes = api
        .service
        .held()
        .map_err(|err| state.scope_problem(&err))?;
    Ok(ApiJson(ScopeList { scopes }))
}
