//! Roles on the node API: which route admits which role, the two rules that read more
//! than the route (a node credential adds only its own node; a proxy credential leases
//! only under its own name), and what a refusal leaves behind: the 403 problem+json
//! `forbidden-role` naming the role needed and the credential,
//! `palisade_node_api_forbidden_total{route,role}`, and a `forbidden` audit record.
//!
//! | route | admits |
//! |---|---|
//! | `GET /v1/leader` (long polls too), `GET /v1/scopes`, `GET /v1/scopes/{scope}` | writer, operator, node |
//! | `/v1/sessions` (open, list, revoke), `POST /v1/scopes/{scope}/campaign` and `/resign` | writer, operator (a session opened with a certificate only by that name) |
//! | `POST /v1/sessions/{id}/keepalive` | writer, operator (the session's owner), node (a follower forwarding its client's keepalive, owner checked there) |
//! | `POST /v1/lease` | proxy (its own announce entry only, see `lease`), operator |
//! | `GET /v1/members` | operator, node |
//! | `POST /v1/members` | operator; a node adding itself |
//! | `DELETE /v1/members/{id}`, `POST /v1/transfer`, `POST /v1/resign`, `GET`/`POST /v1/announce`, `GET /`, `/v1/test/faults` | operator |
//! | `GET /metrics` | any role |
//! | `GET /healthz` | any certificate of the CA |
//!
//! Roles are enforced only when [`ApiState::roles_enforced`] (the API is served over
//! mutual TLS); in plaintext every route is open, as before roles existed.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse as _, Response};
use axum::routing::MethodRouter;
use http::StatusCode;
use palisade_protocol::admin::{HEALTHZ_PATH, METRICS_PATH};
use palisade_protocol::lease::LEASE_PATH;
use palisade_protocol::node::{
    ANNOUNCE_PATH, LEADER_PATH, MEMBER_PATH, MEMBERS_PATH, RESIGN_PATH, TEST_FAULTS_PATH,
    TRANSFER_PATH,
};
use palisade_protocol::problem::kind;
use palisade_protocol::scopes::{
    CAMPAIGN_PATH, KEEPALIVE_PATH, SCOPE_PATH, SCOPE_RESIGN_PATH, SCOPES_PATH, SESSION_PATH,
    SESSIONS_PATH,
};
use palisade_protocol::status::STATUS_PAGE_PATH;
use palisade_protocol::{CredentialRole, MemberAdd, Problem};
use palisade_server::roles::{Caller, RefusalHook, RequestHead, RoleRule, require_roles};

use super::API_BODY_BYTES_MAX;
use super::state::{ApiState, Binding, Shared};
use crate::audit::ForbiddenRequest;

use CredentialRole::{Node, Operator, Proxy, Writer};

/// `GET /v1/leader`: whoever acts on leadership.
pub(super) const LEADER_READERS: &[CredentialRole] = &[Writer, Operator, Node];
/// `POST /v1/lease`: proxies (under their own name) and operators.
pub(super) const LEASE_HOLDERS: &[CredentialRole] = &[Proxy, Operator];
/// `GET /v1/members`, and `POST /v1/members` (a node only for itself).
pub(super) const MEMBER_NODES: &[CredentialRole] = &[Operator, Node];
/// The administration: transfers, membership, the announce list, the status page.
pub(super) const OPERATORS: &[CredentialRole] = &[Operator];
/// Sessions, campaigns and resignations: whoever holds named scopes (writers), and
/// operators.
pub(super) const SESSION_HOLDERS: &[CredentialRole] = &[Writer, Operator];
/// Keepalives: session holders, and nodes forwarding their clients' keepalives.
pub(super) const KEEPALIVE_SENDERS: &[CredentialRole] = &[Writer, Operator, Node];
/// `GET /metrics`: any role.
pub(super) const ANY_ROLE: &[CredentialRole] = &CredentialRole::ALL;

/// Every route of the API: the `route` label of a refusal is one of these (or `other`),
/// so the metric has a bounded number of series whatever clients send.
const ROUTES: [&str; 18] = [
    LEADER_PATH,
    TRANSFER_PATH,
    RESIGN_PATH,
    LEASE_PATH,
    MEMBERS_PATH,
    MEMBER_PATH,
    ANNOUNCE_PATH,
    METRICS_PATH,
    HEALTHZ_PATH,
    STATUS_PAGE_PATH,
    TEST_FAULTS_PATH,
    SESSIONS_PATH,
    SESSION_PATH,
    KEEPALIVE_PATH,
    SCOPES_PATH,
    SCOPE_PATH,
    CAMPAIGN_PATH,
    SCOPE_RESIGN_PATH,
];

/// The rule of a route admitting `needed`, enforced as `state` says, whose refusals are
/// counted and audited.
pub(super) fn rule(state: &Shared, needed: &'static [CredentialRole]) -> RoleRule {
    RoleRule::new(needed, state.roles_enforced, Some(refusal_hook(state)))
}

/// `handler` (a method router), admitting only `needed`.
pub(super) fn only(
    state: &Shared,
    needed: &'static [CredentialRole],
    handler: MethodRouter<Shared>,
) -> MethodRouter<Shared> {
    handler.route_layer(from_fn_with_state(rule(state, needed), require_roles))
}

/// `POST /v1/members`: an operator, or a node adding itself.
pub(super) fn member_add(state: &Shared, handler: MethodRouter<Shared>) -> MethodRouter<Shared> {
    only(
        state,
        MEMBER_NODES,
        handler.route_layer(from_fn_with_state(Arc::clone(state), node_adds_itself)),
    )
}

/// Counts and audits each refusal, and answers it as this node (its id and the leader it
/// knows).
fn refusal_hook(state: &Shared) -> RefusalHook {
    let state = Arc::clone(state);
    Arc::new(move |refusal| {
        let route = ROUTES
            .into_iter()
            .find(|r| *r == refusal.route)
            .unwrap_or("other");
        let role = refusal
            .credential
            .and_then(palisade_protocol::Credential::role)
            .map_or("none", CredentialRole::as_str);
        state.metrics.api_forbidden(route, role);
        let term = state.leadership.borrow().term;
        state.observer.forbidden(
            term,
            ForbiddenRequest {
                peer: refusal.peer,
                method: refusal.method.as_str(),
                path: refusal.path,
                role,
                detail: &refusal.problem.detail,
            },
        );
        state.problem(refusal.problem).0
    })
}

/// Behind [`require_roles`] on `POST /v1/members`: a caller that is no operator is a node
/// (the rule admitted it), and may add only its own id. A body that is not a
/// [`MemberAdd`] goes on to the handler, which answers it as it answers anyone.
async fn node_adds_itself(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let caller = Caller::of(request.extensions());
    if !state.roles_enforced || caller.has_any(OPERATORS) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, API_BODY_BYTES_MAX).await {
        Ok(bytes) => bytes,
        Err(err) => {
            return state
                .problem(Problem::new(
                    StatusCode::BAD_REQUEST,
                    kind::BODY_READ,
                    format!(
                        "the body could not be read (at most {API_BODY_BYTES_MAX} bytes): {err}"
                    ),
                ))
                .into_response();
        }
    };
    if let Ok(add) = serde_json::from_slice::<MemberAdd>(&bytes)
        && !caller.0.as_ref().is_some_and(|c| c.is_node(add.id))
    {
        let head = RequestHead {
            method: &parts.method,
            uri: &parts.uri,
            extensions: &parts.extensions,
        };
        let why = format!(
            "a node credential may add only its own node; adding node {} needs the role \
             operator (operator-<name>)",
            add.id
        );
        return rule(&state, MEMBER_NODES)
            .refuse(&head, Some(&why))
            .into_response();
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

impl ApiState {
    /// Whether the credential of a lease request may lease `proxy`'s entry: always when
    /// roles are not enforced or it is an operator's; a proxy's only when the entry is
    /// bound to one of its names (`--announce proxy-a=URL`). `Err` says why not. An
    /// unlisted URL passes here: the lease handler refuses it on its own.
    pub(super) fn lease_identity(
        &self,
        caller: &Caller,
        proxy: &str,
        binding: Binding<'_>,
    ) -> Result<(), String> {
        if !self.roles_enforced || caller.has_any(OPERATORS) {
            return Ok(());
        }
        match binding {
            Binding::Unlisted => Ok(()),
            Binding::Unbound => Err(format!(
                "the announce entry {proxy} is bound to no name, so only an operator \
                 credential may lease it; bind it to the proxy's certificate name with \
                 --announce proxy-<name>={proxy}"
            )),
            Binding::Bound(name) if caller.0.as_ref().is_some_and(|c| c.holds(name)) => Ok(()),
            Binding::Bound(name) => Err(format!(
                "the announce entry {proxy} is bound to {name}: a proxy credential leases \
                 only under its own name"
            )),
        }
    }
}

#[cfg(test)]
mod tests;
