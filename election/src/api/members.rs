//! `GET`/`POST /v1/members` and `DELETE /v1/members/{id}`: membership changes through
//! raft, and the problem of each [`MemberError`] (the announce list's handlers in
//! `announce` share it).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use http::StatusCode;
use palisade_protocol::problem::kind;
use palisade_protocol::{MemberAdd, MemberList, MemberRemove, Problem};
use palisade_server::{ApiJson, ApiProblem};

use super::state::{ApiState, Shared};
use crate::members::{MemberChange, MemberError};

/// `GET /v1/members`.
pub(super) async fn members_list(State(state): State<Shared>) -> ApiJson<MemberList> {
    ApiJson(state.members.borrow().clone())
}

/// `POST /v1/members`: the new member joins as a learner; the leader promotes it once it
/// has caught up.
pub(super) async fn member_add(
    State(state): State<Shared>,
    body: Result<ApiJson<MemberAdd>, ApiProblem>,
) -> Result<ApiJson<MemberList>, ApiProblem> {
    let ApiJson(add) = body.map_err(|p| state.problem(p))?;
    let change = MemberChange::Add {
        id: add.id,
        peer: add.peer,
    };
    change_members(&state, change).await
}

/// `DELETE /v1/members/{id}`, with an optional [`MemberRemove`] body (`{"force":true}`:
/// even below three voters).
pub(super) async fn member_remove(
    State(state): State<Shared>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<ApiJson<MemberList>, ApiProblem> {
    let bad_body = |status: StatusCode, detail: String| {
        state.problem(Problem::new(status, kind::BAD_BODY, detail).with_title("Bad request body"))
    };
    let body = body.map_err(|e| bad_body(e.status(), e.body_text()))?;
    let remove = if body.is_empty() {
        MemberRemove::default()
    } else {
        serde_json::from_slice::<MemberRemove>(&body).map_err(|e| {
            bad_body(
                StatusCode::BAD_REQUEST,
                format!("the body must be {{}} or {{\"force\":true}}: {e}"),
            )
        })?
    };
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
    let change = MemberChange::Remove {
        id,
        force: remove.force,
    };
    change_members(&state, change).await
}

/// Proposes `change` and answers the members once this node applied it.
async fn change_members(
    state: &ApiState,
    change: MemberChange,
) -> Result<ApiJson<MemberList>, ApiProblem> {
    state
        .commands
        .change_members(&state.members, state.node_id, change)
        .await
        .map(ApiJson)
        .map_err(|err| state.problem(member_problem(&err)))
}

/// The problem that answers a refused or failed membership change.
pub(super) fn member_problem(err: &MemberError) -> Problem {
    use MemberError as E;
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
        E::AlreadyVoter { .. } => (StatusCode::CONFLICT, "already-voter", "Already a voter"),
        E::NotCaughtUp { .. } => (
            StatusCode::CONFLICT,
            "learner-not-caught-up",
            "The learner has not caught up",
        ),
        E::BelowSafeMinimum { .. } => (
            StatusCode::CONFLICT,
            "voters-below-three",
            "Fewer than three voters would remain",
        ),
        E::QuorumUnreachable { .. } => (
            StatusCode::CONFLICT,
            "quorum-unreachable",
            "The voters left would have no reachable quorum",
        ),
        E::LeaderNotMoved { .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            "leader-not-moved",
            "Leadership could not be moved off the member",
        ),
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
