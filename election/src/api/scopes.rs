//! Scopes on the node API: campaign, resign, read or observe one, list the held ones.
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
use super::sessions::{ScopesApi, unexpected};
use super::state::{ApiState, Shared};
use crate::scopes::{Machine, Op, Outcome};

impl ApiState {
    /// The scope named in a path, if it is a valid name other than the cluster's own.
    fn named_scope(&self, name: &str) -> Result<String, ApiProblem> {
        let scope = Scope::new(name).map_err(|e| {
            self.problem(Problem::new(
                StatusCode::BAD_REQUEST,
                kind::BAD_SCOPE,
                e.to_string(),
            ))
        })?;
        // `.` and `..` are scope names, but not in a URL path: a client's URL parser
        // turns them into path steps before the request is sent.
        if matches!(scope.as_str(), "." | "..") {
            return Err(self.problem(Problem::new(
                StatusCode::BAD_REQUEST,
                kind::BAD_SCOPE,
                format!("scope {scope:?} cannot be named in a node API path"),
            )));
        }
        if scope == self.scope {
            return Err(self.problem(Problem::new(
                StatusCode::CONFLICT,
                kind::CLUSTER_SCOPE,
                format!(
                    "scope {scope} is this cluster's own (--scope): its token is the raft \
                     leader's term and nobody campaigns for it"
                ),
            )));
        }
        Ok(scope.as_str().to_owned())
    }

    /// What a reader sees of `scope` in `machine`.
    fn scope_view(api: &ScopesApi, machine: &Machine, scope: &str) -> ScopeView {
        let holder = machine.holder(scope);
        ScopeView {
            scope: scope.to_owned(),
            session: holder.map(|h| h.session.clone()),
            token: holder.map(|h| h.token),
            proof: holder.and_then(|h| {
                api.signer
                    .as_ref()
                    .map(|s| s.sign_scope(scope, h.token).encode())
            }),
        }
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

/// Where a campaign stands.
enum Standing {
    /// Held and fenced at every proxy: the grant.
    Granted(u64),
    /// Held, not fenced everywhere yet.
    Pending,
    /// Waiting for the holder to let go.
    Waiting,
    /// The session is gone.
    Gone,
}

fn standing(api: &ScopesApi, scope: &str, session: &str) -> Standing {
    let machine = api.shared.machine.borrow();
    if !machine.sessions.contains_key(session) {
        return Standing::Gone;
    }
    match machine.holder(scope) {
        Some(h) if h.session == session => {
            if api.fenced.borrow().get(scope) == Some(&h.token) {
                Standing::Granted(h.token)
            } else {
                Standing::Pending
            }
        }
        _ => Standing::Waiting,
    }
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
    let scope = state.named_scope(&name).map_err(fail)?;
    state.require_leader().map_err(fail)?;
    {
        let machine = api.shared.machine.borrow();
        state
            .owned_session(&machine, &session, &caller)
            .map_err(fail)?;
    }
    // No long-poll place: a campaign needs a session (a writer's credential over mTLS),
    // the connection table bounds how many wait, and each scope's queue has its limit.
    let timeout = Duration::from_millis(
        query
            .timeout_ms
            .unwrap_or(CAMPAIGN_TIMEOUT_MS_DEFAULT)
            .min(LONG_POLL_TIMEOUT_MS_MAX),
    );
    let deadline = tokio::time::Instant::now() + timeout;
    if matches!(standing(&api, &scope, &session), Standing::Waiting) {
        let op = Op::Campaign {
            session: session.clone(),
            scope: scope.clone(),
        };
        match state.commands.scope(op).await {
            Ok(Outcome::Holding { .. } | Outcome::Waiting) => {}
            Ok(Outcome::Refused(refusal)) => {
                return Err(fail(state.refusal_problem(refusal, &session)));
            }
            Ok(other) => return Err(fail(unexpected(&state, &other))),
            Err(err) => return Err(fail(state.call_problem(&err))),
        }
    }
    let mut machine = api.shared.machine.clone();
    let mut fenced = api.fenced.clone();
    let mut leadership = state.leadership.clone();
    loop {
        machine.mark_unchanged();
        fenced.mark_unchanged();
        let now = standing(&api, &scope, &session);
        let expired = tokio::time::Instant::now() >= deadline;
        match now {
            Standing::Granted(token) => {
                let proof = api
                    .signer
                    .as_ref()
                    .map(|s| s.sign_scope(&scope, token).encode());
                return Ok(ApiJson(Grant {
                    scope,
                    token,
                    proof,
                    session,
                }));
            }
            Standing::Gone => return Err(fail(state.unknown_session(&session))),
            Standing::Pending if expired => {
                return Err(fail(state.problem(Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    kind::FENCE_PENDING,
                    format!(
                        "session {session} holds {scope}, but not every announce proxy fences \
                         it yet (see GET /); campaign again for the grant once they do"
                    ),
                ))));
            }
            Standing::Waiting if expired => {
                let op = Op::Resign {
                    session: session.clone(),
                    scope: scope.clone(),
                };
                // Whatever its outcome: the answer is the timeout. A grant made meanwhile
                // is released by it; its token was never handed out.
                let _ = state.commands.scope(op).await;
                return Err(fail(state.problem(Problem::new(
                    StatusCode::CONFLICT,
                    kind::CAMPAIGN_TIMEOUT,
                    format!(
                        "{scope} stayed held by another session for {} ms; session {session} \
                         no longer waits for it",
                        timeout.as_millis()
                    ),
                ))));
            }
            Standing::Pending | Standing::Waiting => {}
        }
        if leadership.borrow_and_update().established.is_none() {
            return Err(fail(state.call_problem(&crate::node::ScopeCallError::Lost)));
        }
        tokio::select! {
            () = state.shutdown.cancelled() => {
                return Err(fail(state.call_problem(&crate::node::ScopeCallError::Stopped)));
            }
            () = tokio::time::sleep_until(deadline) => {}
            _ = machine.changed() => {}
            _ = fenced.changed() => {}
            _ = leadership.changed() => {}
        }
    }
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
    let scope = state.named_scope(&name)?;
    state.require_leader()?;
    {
        let machine = api.shared.machine.borrow();
        state.owned_session(&machine, &session, &caller)?;
    }
    let op = Op::Resign {
        session: session.clone(),
        scope: scope.clone(),
    };
    match state.commands.scope(op).await {
        Ok(Outcome::Resigned { released }) => Ok(ApiJson(Resigned {
            scope,
            session,
            released,
        })),
        Ok(Outcome::Refused(refusal)) => Err(state.refusal_problem(refusal, &session)),
        Ok(other) => Err(unexpected(&state, &other)),
        Err(err) => Err(state.call_problem(&err)),
    }
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
        .named_scope(&name)
        .map_err(IntoResponse::into_response)?;
    let mut machine = api.shared.machine.clone();
    let now = ApiState::scope_view(&api, &machine.borrow_and_update(), &scope);
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
    let latest = Arc::clone(&api.shared.machine.borrow());
    Ok(ApiJson(ApiState::scope_view(&api, &latest, &scope)))
}

/// `GET /v1/scopes`: the held scopes.
pub(super) async fn list(State(state): State<Shared>) -> Result<ApiJson<ScopeList>, ApiProblem> {
    let api = state.scopes_api()?;
    let machine = Arc::clone(&api.shared.machine.borrow());
    let scopes = machine
        .scopes
        .iter()
        .filter(|(_, s)| s.holder.is_some())
        .map(|(name, _)| ApiState::scope_view(api, &machine, name))
        .collect();
    Ok(ApiJson(ScopeList { scopes }))
}
