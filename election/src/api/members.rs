//! `GET`/`POST /v1/members`, `DELETE /v1/members/{id}`, and `GET`/`POST /v1/announce`:
//! membership and announce-list changes through raft, and the problem of each
//! [`MemberError`].

use axum::extract::{Path, State};
use http::StatusCode;
use palisade_protocol::{AnnounceList, MemberAdd, MemberList, Problem};
use palisade_server::{ApiJson, ApiProblem};

use super::state::{ApiState, Shared};
use crate::members::{MemberChange, MemberError};

/// `GET /v1/members`.
pub(super) async fn members_list(State(state): State<Shared>) -> ApiJson<MemberList> {
    ApiJson(state.members.borrow().clone())
}

/// `POST /v1/members`.
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

/// `DELETE /v1/members/{id}`.
pub(super) async fn member_remove(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<ApiJson<MemberList>, ApiProblem> {
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
    let change = MemberChange::Remove { id };
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

/// `GET /v1/announce`.
pub(super) async fn announce_list(State(state): State<Shared>) -> ApiJson<AnnounceList> {
    ApiJson(AnnounceList {
        proxies: state.announce.borrow().clone(),
    })
}

/// `POST /v1/announce`: replaces the cluster's announce list through raft.
pub(super) async fn announce_set(
    State(state): State<Shared>,
    body: Result<ApiJson<AnnounceList>, ApiProblem>,
) -> Result<ApiJson<AnnounceList>, ApiProblem> {
    let ApiJson(list) = body.map_err(|p| state.problem(p))?;
    state
        .commands
        .change_announce(&state.announce, list.proxies)
        .await
        .map(|proxies| ApiJson(AnnounceList { proxies }))
        .map_err(|err| state.problem(member_problem(&err)))
}

/// The problem that answers a refused or failed membership change.
fn member_problem(err: &MemberError) -> Problem {
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
