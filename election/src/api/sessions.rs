//! Sessions on the node API: open, keep alive, revoke, list; and what the scopes routes
//! share with them (the state they read, who owns a session, the problems of a refusal).
//!
//! Every change goes through raft (`node`'s `scopes`) and is answered once applied on
//! this node, except keepalives: they touch only the leader's deadlines (`scopes`'
//! `lessor`), so a thousand sessions cost no log entries. A node that is not the
//! established leader answers 503 `not-leader` naming the leader it knows.

// The helpers here return the problem a refused request gets, built once per refusal
// on the control plane: its size does not matter, and boxing it would only add noise.
#![allow(clippy::result_large_err)]

use std::sync::{Arc, PoisonError};

use axum::extract::{Path, State};
use http::StatusCode;
use palisade_protocol::lease::NOT_LEADER;
use palisade_protocol::problem::kind;
use palisade_protocol::scopes::{
    SESSION_TTL_MS_MAX, SESSION_TTL_MS_MIN, SessionEntry, SessionList, SessionRequest,
    SessionRevoked, SessionView, ttl_in_bounds,
};
use palisade_protocol::{CredentialRole, Problem};
use palisade_server::roles::Caller;
use palisade_server::{ApiJson, ApiProblem};
use tokio::sync::watch;

use super::state::{ApiState, Shared};
use crate::announce::Fenced;
use crate::node::{ScopeCallError, ScopesShared, TokenSigner};
use crate::scopes::lessor::KeepaliveRefused;
use crate::scopes::limits::SESSIONS_MAX;
use crate::scopes::machine::SessionRecord;
use crate::scopes::{Machine, Op, Outcome, Refusal, new_session_id};

/// What the sessions and scopes routes read.
#[derive(Clone)]
pub(crate) struct ScopesApi {
    /// The applied machine and the leader's deadlines.
    pub shared: ScopesShared,
    /// The grants every announce proxy fences (the leader's fencer publishes them).
    pub fenced: watch::Receiver<Fenced>,
    /// Signs grants' proofs (`--token-key`).
    pub signer: Option<Arc<TokenSigner>>,
    /// False with fleet leases: named scopes are refused with 501.
    pub available: bool,
    /// How this node speaks to the leader's API when it forwards a keepalive (its own
    /// certificate with mTLS, as for announcements).
    pub forward_tls: palisade_client::ClientTls,
}

/// Time a follower waits for the leader's answer to a keepalive it forwarded.
pub const KEEPALIVE_FORWARD_TIMEOUT_MS: u64 = 2_000;

impl ApiState {
    /// The named-leaderships state, or 501 where this cluster cannot grant named scopes.
    pub(super) fn scopes_api(&self) -> Result<&ScopesApi, ApiProblem> {
        self.scopes.as_ref().filter(|s| s.available).ok_or_else(|| {
            self.problem(Problem::new(
                StatusCode::NOT_IMPLEMENTED,
                kind::SCOPES_UNAVAILABLE,
                "this cluster runs fleet leases (--lease-ms): it grants no named scopes; \
                 run named leaderships on a cluster that announces to its proxies",
            ))
        })
    }

    /// The problem of a request the loop could not carry out.
    pub(super) fn call_problem(&self, err: &ScopeCallError) -> ApiProblem {
        let (status, kind, detail) = match err {
            ScopeCallError::NotLeader { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                NOT_LEADER,
                "this node is not the established leader; ask the leader_id named here".to_owned(),
            ),
            ScopeCallError::Lost => (
                StatusCode::SERVICE_UNAVAILABLE,
                NOT_LEADER,
                "leadership moved before the change was applied; it may still apply: check \
                 with the new leader before asking again"
                    .to_owned(),
            ),
            ScopeCallError::Refused(cause) => (
                StatusCode::SERVICE_UNAVAILABLE,
                kind::PROPOSAL_REFUSED,
                format!("raft refused the change: {cause}"),
            ),
            ScopeCallError::Stopped => (
                StatusCode::SERVICE_UNAVAILABLE,
                kind::NODE_STOPPED,
                "the node is stopping".to_owned(),
            ),
        };
        self.problem(Problem::new(status, kind, detail))
    }

    /// The problem of an entry that changed nothing.
    pub(super) fn refusal_problem(&self, refusal: Refusal, session: &str) -> ApiProblem {
        use crate::scopes::limits::{SCOPES_MAX, SCOPES_PER_SESSION_MAX, WAITERS_PER_SCOPE_MAX};
        let full = StatusCode::INSUFFICIENT_STORAGE;
        let (status, kind, detail) = match refusal {
            Refusal::UnknownSession => return self.unknown_session(session),
            Refusal::SessionExists => (
                StatusCode::SERVICE_UNAVAILABLE,
                kind::PROPOSAL_REFUSED,
                "a session id collided; ask again".to_owned(),
            ),
            Refusal::TooManySessions => (
                full,
                kind::TOO_MANY_SESSIONS,
                format!("the cluster holds {SESSIONS_MAX} sessions, its limit"),
            ),
            Refusal::TooManyScopes => (
                full,
                kind::TOO_MANY_SCOPES,
                format!("the cluster holds {SCOPES_MAX} scopes held or waited for, its limit"),
            ),
            Refusal::TooManyWaiters => (
                full,
                kind::TOO_MANY_WAITERS,
                format!("{WAITERS_PER_SCOPE_MAX} sessions wait for this scope already, its limit"),
            ),
            Refusal::SessionScopesFull => (
                full,
                kind::SESSION_SCOPES_FULL,
                format!(
                    "session {session} holds or waits for {SCOPES_PER_SESSION_MAX} scopes, its limit"
                ),
            ),
        };
        self.problem(Problem::new(status, kind, detail))
    }

    /// 404 for a session that is not live.
    pub(super) fn unknown_session(&self, session: &str) -> ApiProblem {
        self.problem(Problem::new(
            StatusCode::NOT_FOUND,
            kind::UNKNOWN_SESSION,
            format!("no live session {session}: never opened, revoked or expired"),
        ))
    }

    /// The session `id`, if `caller` may act with it: a session opened over mTLS belongs
    /// to the certificate name that opened it.
    pub(super) fn owned_session(
        &self,
        machine: &Machine,
        id: &str,
        caller: &Caller,
    ) -> Result<SessionRecord, ApiProblem> {
        let record = machine
            .sessions
            .get(id)
            .ok_or_else(|| self.unknown_session(id))?;
        if record.owner.is_some() && record.owner != owner_of(caller) {
            return Err(self.problem(Problem::new(
                StatusCode::FORBIDDEN,
                kind::SESSION_OWNER,
                format!(
                    "session {id} belongs to {}; only that identity may use it",
                    record.owner.as_deref().unwrap_or_default()
                ),
            )));
        }
        Ok(record.clone())
    }

    /// 503 `not-leader` unless this node is the established leader.
    pub(super) fn require_leader(&self) -> Result<(), ApiProblem> {
        let leading = self.leadership.borrow().established.is_some();
        if leading {
            Ok(())
        } else {
            Err(self.call_problem(&ScopeCallError::NotLeader { leader_id: None }))
        }
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
    if !ttl_in_bounds(request.ttl_ms) {
        return Err(state.problem(Problem::new(
            StatusCode::BAD_REQUEST,
            kind::BAD_TTL,
            format!(
                "ttl_ms {} is outside {SESSION_TTL_MS_MIN}..={SESSION_TTL_MS_MAX}",
                request.ttl_ms
            ),
        )));
    }
    state.require_leader()?;
    if api.shared.machine.borrow().sessions.len() >= SESSIONS_MAX {
        return Err(state.refusal_problem(Refusal::TooManySessions, ""));
    }
    let id = new_session_id();
    let op = Op::Open {
        session: id.clone(),
        ttl_ms: request.ttl_ms,
        owner: owner_of(&caller),
    };
    match state.commands.scope(op).await {
        Ok(Outcome::Opened) => Ok(ApiJson(SessionView {
            id,
            ttl_ms: request.ttl_ms,
        })),
        Ok(Outcome::Refused(refusal)) => Err(state.refusal_problem(refusal, &id)),
        Ok(other) => Err(unexpected(&state, &other)),
        Err(err) => Err(state.call_problem(&err)),
    }
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
    let record = {
        let machine = api.shared.machine.borrow();
        if forwarded {
            machine
                .sessions
                .get(&id)
                .cloned()
                .ok_or_else(|| state.unknown_session(&id))?
        } else {
            state.owned_session(&machine, &id, &caller)?
        }
    };
    let now = tokio::time::Instant::now();
    // A quorum must confirm this node still leads, after the keepalive arrived, before
    // it is answered: a leader paused through an election (deposed without knowing it)
    // would otherwise extend a session its successor already expired, and the client
    // would trust it past the expiry (the named-leaderships model found this). The
    // confirmation shares the `ReadIndex` rounds of the fleet leases.
    let established = state.leadership.borrow().established;
    let confirmed = state.commands.lease(false).await;
    if confirmed.ok().is_none_or(|term| Some(term) != established) {
        return Err(state.call_problem(&ScopeCallError::NotLeader { leader_id: None }));
    }
    let answer = {
        let mut lessor = api
            .shared
            .lessor
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Not leading yet: established a moment ago; the loop's next tick starts the
        // deadlines.
        lessor
            .leading()
            .then(|| lessor.keepalive(&id, record.ttl_ms, now))
    };
    match answer {
        None => Err(state.call_problem(&ScopeCallError::NotLeader { leader_id: None })),
        Some(Ok(())) => {
            state.metrics.session_keepalives.increment(1);
            Ok(ApiJson(SessionView {
                id,
                ttl_ms: record.ttl_ms,
            }))
        }
        Some(Err(KeepaliveRefused::Unknown)) => Err(state.unknown_session(&id)),
        Some(Err(KeepaliveRefused::TooFast)) => Err(state.problem(Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            kind::KEEPALIVE_TOO_FAST,
            format!(
                "keepalives for session {id} come faster than one per {} ms",
                crate::scopes::limits::KEEPALIVE_INTERVAL_MS_MIN
            ),
        ))),
    }
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
    let not_leader = || state.call_problem(&ScopeCallError::NotLeader { leader_id: None });
    let (leader_id, term) = {
        let l = state.leadership.borrow();
        (l.leader_id, l.term)
    };
    let url = {
        let machine = api.shared.machine.borrow();
        if !machine.sessions.contains_key(id) {
            return Err(not_leader());
        }
        state.owned_session(&machine, id, caller)?;
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
        Err(err) if err.status() == Some(StatusCode::NOT_FOUND) => Err(state.unknown_session(id)),
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
    state.require_leader()?;
    {
        let machine = api.shared.machine.borrow();
        state.owned_session(&machine, &id, &caller)?;
    }
    let op = Op::Revoke {
        session: id.clone(),
        expired: false,
    };
    match state.commands.scope(op).await {
        Ok(Outcome::Revoked { released }) => Ok(ApiJson(SessionRevoked { id, released })),
        Ok(Outcome::Refused(refusal)) => Err(state.refusal_problem(refusal, &id)),
        Ok(other) => Err(unexpected(&state, &other)),
        Err(err) => Err(state.call_problem(&err)),
    }
}

/// `GET /v1/sessions`: every live session (deadlines only on the leader).
pub(super) async fn list(State(state): State<Shared>) -> Result<ApiJson<SessionList>, ApiProblem> {
    let api = state.scopes_api()?;
    let machine = Arc::clone(&api.shared.machine.borrow());
    let now = tokio::time::Instant::now();
    let lessor = api
        .shared
        .lessor
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let sessions = machine
        .sessions
        .iter()
        .map(|(id, s)| SessionEntry {
            id: id.clone(),
            ttl_ms: s.ttl_ms,
            owner: s.owner.clone(),
            holds: s.holds.iter().cloned().collect(),
            waits: s.waits.iter().cloned().collect(),
            expires_in_ms: lessor.remaining_ms(id, now),
        })
        .collect();
    Ok(ApiJson(SessionList { sessions }))
}

/// A 500 for an outcome that does not belong to the request (a broken invariant).
pub(super) fn unexpected(state: &ApiState, outcome: &Outcome) -> ApiProblem {
    tracing::error!(
        node_id = state.node_id,
        ?outcome,
        "unexpected outcome of a named-leaderships change"
    );
    state.problem(Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        kind::PROPOSAL_REFUSED,
        format!("unexpected outcome {outcome:?}"),
    ))
}
