//! `POST /v1/lease` on the node API: fleet leases for the `--announce` proxies.
//!
//! Answers, in this order:
//! - a body that is not a [`LeaseRequest`]: 400/413/415/422 problems like every API body;
//! - leases off (the node runs without `--lease-ms`): 409 `leases-off`. It is a
//!   configuration mismatch between the proxy and this node, not a transient state, so it
//!   is not a 503 a proxy would retry on the next node as if it were an election;
//! - a `proxy` that is none of this node's `--announce` URLs (compared in their normal
//!   form, `palisade_protocol::announce`): 403 `unknown-proxy`. Only those proxies are
//!   announced to, so only they may hold leases: the release shortcut "every proxy
//!   accepted the term" covers every lease holder;
//! - with roles enforced (mutual TLS), a proxy credential asking for an entry not bound
//!   to one of its names (`--announce proxy-a=URL` binds URL to `proxy-a`; a bare URL to
//!   none, which only an operator credential may lease): 403 `forbidden-role`. The route
//!   itself admits only proxy and operator credentials (`super::roles`);
//! - more than [`LEASE_PENDING_MAX`] requests already waiting: 503 `lease-busy`;
//! - not the leader, handing leadership over, or leadership lost before a quorum
//!   confirmed it: 503 `not-leader`, naming the leader this node knows (`leader_id`);
//! - no quorum confirmation within the wait (the smaller of [`LEASE_WAIT_TIMEOUT_MS`] and
//!   `lease_ms`): 503 `lease-timeout`;
//! - else 200 [`LeaseGrant`]: the term a quorum confirmed this node leads, after the
//!   request arrived (a raft `ReadIndex` round started after it arrived; the leader
//!   gathers requests so that one round answers every request that arrived before it
//!   started: see the election loop's `lease_rounds` module). An `urgent` request (a write
//!   waits for it) is not held to gather others.

use palisade_protocol::problem::kind;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use http::{Extensions, Method, StatusCode, Uri};
use palisade_protocol::Problem;
use palisade_protocol::lease::{LEASES_OFF, LeaseGrant, LeaseRequest, NOT_LEADER, UNKNOWN_PROXY};
use palisade_protocol::problem::kind::FORBIDDEN_ROLE;
use palisade_server::roles::{Caller, RequestHead};
use palisade_server::{ApiJson, ApiProblem};

use super::roles::{LEASE_HOLDERS, rule};
use super::state::{Binding, LEASE_PENDING_MAX, LeaseApi, Shared};
use crate::node::LeaseError;

pub use palisade_protocol::lease::{LEASE_BUSY, LEASE_TIMEOUT};

/// The longest one lease request waits for a quorum's confirmation (and never longer than
/// `lease_ms`: a grant arriving after that would already have lapsed at the proxy, which
/// counts the lease from when it sent the request).
pub const LEASE_WAIT_TIMEOUT_MS: u64 = 2_000;

/// How long a request to `leases` waits for the loop: [`LEASE_WAIT_TIMEOUT_MS`], never
/// more than the lease.
fn wait(leases: &LeaseApi) -> Duration {
    Duration::from_millis(LEASE_WAIT_TIMEOUT_MS.min(leases.lease_ms))
}

/// `POST /v1/lease`.
pub(super) async fn lease(
    State(state): State<Shared>,
    caller: Caller,
    method: Method,
    uri: Uri,
    extensions: Extensions,
    body: Result<ApiJson<LeaseRequest>, ApiProblem>,
) -> Result<ApiJson<LeaseGrant>, ApiProblem> {
    let refuse = |status: StatusCode, kind: &'static str, title: &str, detail: String| {
        state.metrics.lease_refused(kind);
        state.problem(Problem::new(status, kind, detail).with_title(title))
    };
    let ApiJson(request) = body.map_err(|p| {
        state.metrics.lease_refused(kind::BAD_BODY);
        state.problem(p)
    })?;
    let Some(leases) = state.leases.as_ref() else {
        return Err(refuse(
            StatusCode::CONFLICT,
            LEASES_OFF,
            "This node grants no leases",
            format!(
                "node {} runs without --lease-ms; start every node with it to use a proxy fleet",
                state.node_id
            ),
        ));
    };
    let binding = leases.binding(&request.proxy);
    if let Err(why) = state.lease_identity(&caller, &request.proxy, binding) {
        state.metrics.lease_refused(FORBIDDEN_ROLE);
        let head = RequestHead {
            method: &method,
            uri: &uri,
            extensions: &extensions,
        };
        return Err(rule(&state, LEASE_HOLDERS).refuse(&head, Some(&why)));
    }
    if binding == Binding::Unlisted {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            UNKNOWN_PROXY,
            "Not a proxy of this fleet",
            format!(
                "proxy {:?} is not among node {}'s --announce URLs; only announced proxies \
                 may hold leases",
                request.proxy, state.node_id
            ),
        ));
    }
    let Ok(_permit) = Arc::clone(&leases.permits).try_acquire_owned() else {
        return Err(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            LEASE_BUSY,
            "Too many lease requests waiting",
            format!("{LEASE_PENDING_MAX} lease requests are already waiting (LEASE_PENDING_MAX)"),
        ));
    };
    let wait = wait(leases);
    let outcome = tokio::time::timeout(wait, state.commands.lease(request.urgent)).await;
    let err = match outcome {
        Ok(Ok(term)) => {
            return Ok(ApiJson(LeaseGrant {
                scope: state.scope.clone(),
                term,
                leader_id: state.node_id,
                lease_ms: leases.lease_ms,
            }));
        }
        Ok(Err(err)) => err,
        Err(_) => LeaseError::TimedOut {
            waited_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        },
    };
    Err(match err {
        LeaseError::NotLeader { leader_id } => {
            state.metrics.lease_refused(NOT_LEADER);
            ApiProblem(
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, NOT_LEADER, err.to_string())
                    .with_title("This node is not the leader")
                    .with_node(state.node_id, leader_id.filter(|&id| id != state.node_id)),
            )
        }
        LeaseError::TimedOut { .. } => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            LEASE_TIMEOUT,
            "Leadership not confirmed in time",
            err.to_string(),
        ),
        LeaseError::Stopped => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            kind::NODE_STOPPED,
            "The node stopped",
            err.to_string(),
        ),
    })
}
