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
                kind::BAD_MEMBER,
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
            kind::MEMBER_ID_REUSED,
            "Removed ids are never reused",
        ),
        E::AlreadyMember { .. } => (
            StatusCode::CONFLICT,
            kind::ALREADY_MEMBER,
            "Already a member",
        ),
        E::PeerInUse { .. } => (
            StatusCode::CONFLICT,
            kind::PEER_IN_USE,
            "Peer address in use",
        ),
        E::NotAMember { .. } => (StatusCode::NOT_FOUND, kind::NOT_A_MEMBER, "No such member"),
        E::Invalid { .. } => (StatusCode::BAD_REQUEST, kind::BAD_MEMBER, "Bad member"),
        E::TooMany { .. } => (
            StatusCode::CONFLICT,
            kind::TOO_MANY_MEMBERS,
            "Member limit reached",
        ),
        E::Pending => (
            StatusCode::CONFLICT,
            kind::MEMBERSHIP_CHANGE_PENDING,
            "A membership change is in progress",
        ),
        E::IsLeader { .. } => (
            StatusCode::CONFLICT,
            kind::MEMBER_IS_LEADER,
            "The leader cannot be removed",
        ),
        E::LastVoter { .. } => (StatusCode::CONFLICT, kind::LAST_VOTER, "Last voter"),
        E::AlreadyVoter { .. } => (StatusCode::CONFLICT, kind::ALREADY_VOTER, "Already a voter"),
        E::NotCaughtUp { .. } => (
            StatusCode::CONFLICT,
            kind::LEARNER_NOT_CAUGHT_UP,
            "The learner has not caught up",
        ),
        E::BelowSafeMinimum { .. } => (
            StatusCode::CONFLICT,
            kind::VOTERS_BELOW_THREE,
            "Fewer than three voters would remain",
        ),
        E::QuorumUnreachable { .. } => (
            StatusCode::CONFLICT,
            kind::QUORUM_UNREACHABLE,
            "The voters left would have no reachable quorum",
        ),
        E::LeaderNotMoved { .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            kind::LEADER_NOT_MOVED,
            "Leadership could not be moved off the member",
        ),
        E::NoLeader => (
            StatusCode::SERVICE_UNAVAILABLE,
            kind::NO_LEADER,
            "No leader",
        ),
        E::Refused { .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            kind::PROPOSAL_REFUSED,
            "raft refused the proposal",
        ),
        E::TimedOut { .. } => (
            StatusCode::GATEWAY_TIMEOUT,
            kind::MEMBER_CHANGE_TIMEOUT,
            "The change was not applied in time",
        ),
        E::AnnounceFixed => (
            StatusCode::CONFLICT,
            kind::ANNOUNCE_FIXED,
            "The announce list is fixed with fleet leases",
        ),
        E::Stopped => (
            StatusCode::SERVICE_UNAVAILABLE,
            kind::NODE_STOPPED,
            "The node stopped",
        ),
    };
    Problem::new(status, kind, err.to_string()).with_title(title)
}
