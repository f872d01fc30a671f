//! `POST /v1/transfer` and `POST /v1/resign`: leadership transfers, their audit records,
//! and the problem of each [`TransferError`].

use axum::extract::State;
use http::StatusCode;
use palisade_protocol::lease::NOT_LEADER;
use palisade_protocol::problem::kind;
use palisade_protocol::{Problem, TransferRequest, Transferred};
use palisade_server::{ApiJson, ApiProblem};

use super::state::{ApiState, Shared};
use crate::node::TransferError;

/// `POST /v1/transfer`.
pub(super) async fn transfer(
    State(state): State<Shared>,
    body: Result<ApiJson<TransferRequest>, ApiProblem>,
) -> Result<ApiJson<Transferred>, ApiProblem> {
    let ApiJson(request) = body.map_err(|p| state.problem(p))?;
    let outcome = state.commands.transfer(Some(request.to)).await;
    audit_transfer(&state, Some(request.to), &outcome);
    outcome
        .map(ApiJson)
        .map_err(|err| state.transfer_problem(&err))
}

/// `POST /v1/resign`.
pub(super) async fn resign(
    State(state): State<Shared>,
) -> Result<ApiJson<Transferred>, ApiProblem> {
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

impl ApiState {
    /// The problem that answers a failed transfer from this node.
    fn transfer_problem(&self, err: &TransferError) -> ApiProblem {
        let known_leader = self.leadership.borrow().leader_id;
        ApiProblem(transfer_problem(self.node_id, known_leader, err))
    }
}

/// The problem that answers a failed transfer or resignation: its status, kind and title,
/// and the leader to retry at (the one the error names, else the one this node knows).
pub(super) fn transfer_problem(
    node_id: u64,
    known_leader: Option<u64>,
    err: &TransferError,
) -> Problem {
    let (status, kind, title, leader_id) = match err {
        TransferError::NotLeader { leader_id } => (
            StatusCode::CONFLICT,
            NOT_LEADER,
            "This node is not the leader",
            *leader_id,
        ),
        TransferError::UnknownNode { .. } => (
            StatusCode::BAD_REQUEST,
            kind::UNKNOWN_NODE,
            "No such voter",
            None,
        ),
        TransferError::NoCandidate => (
            StatusCode::CONFLICT,
            kind::NO_CANDIDATE,
            "No other voter to transfer to",
            None,
        ),
        TransferError::Refused { .. } => (
            StatusCode::CONFLICT,
            kind::TRANSFER_REFUSED,
            "Transfer refused or abandoned by raft",
            None,
        ),
        TransferError::Superseded { leader_id, .. } => (
            StatusCode::CONFLICT,
            kind::TRANSFER_SUPERSEDED,
            "Another node became leader",
            Some(*leader_id),
        ),
        TransferError::TimedOut { .. } => (
            StatusCode::GATEWAY_TIMEOUT,
            kind::TRANSFER_TIMEOUT,
            "Transfer did not complete in time",
            None,
        ),
        TransferError::Stopped => (
            StatusCode::SERVICE_UNAVAILABLE,
            kind::NODE_STOPPED,
            "The node stopped",
            None,
        ),
    };
    Problem::new(status, kind, err.to_string())
        .with_title(title)
        .with_node(node_id, leader_id.or(known_leader))
}
