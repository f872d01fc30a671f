//! `GET`/`POST /v1/announce`: the `--announce` proxy list, replaced through raft.
//!
//! `POST /v1/announce` with an [`AnnounceChange`] answers, in this order:
//! - a body that is not one: 400/413/415/422 like every API body;
//! - an entry that is not `URL` or `NAME=URL` (user information, a query or a fragment
//!   included: see [`palisade_protocol::announce`]), a proxy named twice, or more than
//!   [`crate::config::ANNOUNCE_URLS_MAX`] entries: 400 `bad-announce`, naming the entry;
//! - fleet leases (`--lease-ms`): 409 `announce-fixed`;
//! - no leader known: 503 `no-leader`, with nothing retired;
//! - then every proxy the new list drops (by normal URL) is retired: its fence raised to
//!   [`RETIRED_FENCE`] (see `crate::announce`'s `retire`), so that a proxy leaving the
//!   list admits no token the cluster no longer announces to it. One that cannot be
//!   retired (unreachable, or it refuses): 409 `proxy-not-retired`, nothing proposed,
//!   unless the request says `"force": true`;
//! - the change is proposed on top of the list it was computed against: another change
//!   that came first (asked of any node) is 409 `announce-changed`, and the entry is
//!   refused on every node;
//! - the answers of a membership change (503 `proposal-refused`, 504 once not applied
//!   within [`crate::MEMBER_CHANGE_TIMEOUT_MS`], ...);
//! - else 200 [`AnnounceChanged`]: the list this node applied and each removed proxy's
//!   retirement.
//!
//! Any node retires: the retirement needs no token, only the announcer's credentials,
//! which every node has. Changes asked of one node run one at a time.

use std::sync::Arc;

use axum::extract::State;
use http::StatusCode;
use palisade_protocol::announce::{AnnounceEntry, RETIRED_FENCE, parse_announce_entry};
use palisade_protocol::{AnnounceChange, AnnounceChanged, AnnounceList, Problem, RemovedProxy};
use palisade_server::{ApiJson, ApiProblem};

use super::members::member_problem;
use super::state::{ApiState, Shared};
use crate::members::{MemberError, check_announce};

pub use palisade_protocol::problem::kind::ANNOUNCE_CHANGED;
pub use palisade_protocol::problem::kind::BAD_ANNOUNCE;
pub use palisade_protocol::problem::kind::PROXY_NOT_RETIRED;

/// `GET /v1/announce`.
pub(super) async fn announce_list(State(state): State<Shared>) -> ApiJson<AnnounceList> {
    ApiJson(AnnounceList {
        proxies: state.announce.borrow().clone(),
    })
}

/// `POST /v1/announce`: retires the proxies the new list drops, then replaces the
/// cluster's announce list through raft.
pub(super) async fn announce_set(
    State(state): State<Shared>,
    body: Result<ApiJson<AnnounceChange>, ApiProblem>,
) -> Result<ApiJson<AnnounceChanged>, ApiProblem> {
    let ApiJson(change) = body.map_err(|p| state.problem(p))?;
    let proxies = check_announce(&change.proxies).map_err(|err| {
        let detail = match err {
            MemberError::Invalid { detail } => detail,
            other => other.to_string(),
        };
        state.problem(
            Problem::new(StatusCode::BAD_REQUEST, BAD_ANNOUNCE, detail)
                .with_title("Bad announce list"),
        )
    })?;
    // Refused here as the loop would refuse them, before anything is retired.
    if state.leases.is_some() {
        return Err(state.problem(member_problem(&MemberError::AnnounceFixed)));
    }
    let leader_known = state.leadership.borrow().leader_id.is_some();
    if !leader_known {
        return Err(state.problem(member_problem(&MemberError::NoLeader)));
    }
    let _one_at_a_time = state.fences.changes.lock().await;
    let seen = state.announce.borrow().clone();
    let removed = removed_entries(&seen, &proxies);
    let entries: Vec<AnnounceEntry> = removed.iter().map(|(_, e)| e.clone()).collect();
    let outcomes = Arc::clone(&state.fences).retire_all(&entries).await;
    let report: Vec<RemovedProxy> = removed
        .iter()
        .zip(outcomes)
        .map(|((listed, _), outcome)| RemovedProxy {
            proxy: listed.clone(),
            retired: outcome.is_ok(),
            error: outcome.err(),
        })
        .collect();
    if !change.force && report.iter().any(|r| !r.retired) {
        return Err(state.problem(not_retired(&report)));
    }
    let applied = state
        .commands
        .change_announce(&state.announce, proxies, seen)
        .await
        .map_err(|err| state.problem(change_problem(&state, &err, &report)))?;
    Ok(ApiJson(AnnounceChanged {
        proxies: applied,
        removed: report,
    }))
}

/// The entries of `seen` (as listed, and parsed) whose proxy `proxies` (in normal form)
/// no longer names. An entry that does not parse (a list written before entries were
/// checked this way) is compared by its text without trailing slashes, and removing it
/// then fails to retire it rather than skipping it.
fn removed_entries(seen: &[String], proxies: &[String]) -> Vec<(String, AnnounceEntry)> {
    let kept: Vec<String> = proxies
        .iter()
        .filter_map(|p| parse_announce_entry(p).ok())
        .map(|e| e.url)
        .collect();
    seen.iter()
        .map(|listed| {
            let entry = parse_announce_entry(listed).unwrap_or_else(|_| AnnounceEntry {
                name: None,
                url: listed.trim_end_matches('/').to_owned(),
            });
            (listed.clone(), entry)
        })
        .filter(|(_, entry)| !kept.contains(&entry.url))
        .collect()
}

/// 409 `proxy-not-retired`: the removed proxies that kept their fence, and why.
fn not_retired(report: &[RemovedProxy]) -> Problem {
    let failed: Vec<String> = report
        .iter()
        .filter(|r| !r.retired)
        .map(|r| {
            format!(
                "{} ({})",
                r.proxy,
                r.error.as_deref().unwrap_or("not retired")
            )
        })
        .collect();
    Problem::new(
        StatusCode::CONFLICT,
        PROXY_NOT_RETIRED,
        format!(
            "the list was not changed: removing {} would leave it admitting tokens older \
             than the cluster's, since no leader announces to it once it is off the list, \
             and its fence could not be raised to {RETIRED_FENCE}; retry once it answers, \
             or send \"force\": true to remove it anyway",
            failed.join(", ")
        ),
    )
    .with_title("A removed proxy could not be retired")
}

/// The problem of a change the loop refused or did not apply; `report` names the
/// proxies already retired for it, which stay retired.
fn change_problem(state: &ApiState, err: &MemberError, report: &[RemovedProxy]) -> Problem {
    let retired: Vec<&str> = report
        .iter()
        .filter(|r| r.retired)
        .map(|r| r.proxy.as_str())
        .collect();
    let mut problem = match err {
        // The loop answers `Pending` for an announce list that is no longer the one the
        // request read.
        MemberError::Pending => Problem::new(
            StatusCode::CONFLICT,
            ANNOUNCE_CHANGED,
            format!(
                "the announce list of node {} changed while this request was handled \
                 (another change came first); read it again (GET /v1/announce) and retry",
                state.node_id
            ),
        )
        .with_title("The announce list changed"),
        other => member_problem(other),
    };
    if !retired.is_empty() {
        problem.detail = format!(
            "{}; already retired, and staying so: {}",
            problem.detail,
            retired.join(", ")
        );
    }
    problem
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a proxy counts as removed only when no entry of the new list names its URL,
    /// whatever the spelling or name; an old entry that no longer parses counts by its
    /// text, so removing it is attempted (and fails closed) rather than skipped. Method:
    /// an old list of four spellings against a new list keeping two of them.
    #[test]
    fn removed_proxies_are_found_by_normal_url() {
        let seen = [
            "http://a:1/".to_owned(),
            "proxy-b=http://b:1".to_owned(),
            "http://c:1".to_owned(),
            "http://u:p@d:1".to_owned(),
        ];
        let new = ["HTTP://A:1".to_owned(), "proxy-b2=http://b:1".to_owned()];
        let proxies = check_announce(&new).unwrap();
        let removed = removed_entries(&seen, &proxies);
        let listed: Vec<&str> = removed.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(listed, ["http://c:1", "http://u:p@d:1"]);
        assert_eq!(removed[0].1.url, "http://c:1");
        assert_eq!(removed[1].1.url, "http://u:p@d:1");
        let kept = check_announce(&seen[..3]).unwrap();
        assert_eq!(removed_entries(&seen, &kept).len(), 1);
    }
}
