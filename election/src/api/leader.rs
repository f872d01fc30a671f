//! `GET /v1/leader`: this node's leader view, plain or as a long poll.

use std::time::Duration;

use axum::extract::State;
use palisade_protocol::{LeaderView, LongPoll};
use palisade_server::{ApiJson, ApiProblem, ApiQuery};

use super::state::Shared;
use crate::leadership::Leadership;

/// Longest long poll: a client asking for more waits this long. Keeps a forgotten client
/// from pinning a connection for ever.
pub const LONG_POLL_TIMEOUT_MS_MAX: u64 = 60_000;
/// Long-poll timeout when `after_term` is given without `timeout_ms`.
pub const LONG_POLL_TIMEOUT_MS_DEFAULT: u64 = 30_000;

/// `GET /v1/leader`, plain or as a long poll.
pub(super) async fn leader(
    State(state): State<Shared>,
    query: Result<ApiQuery<LongPoll>, ApiProblem>,
) -> Result<ApiJson<LeaderView>, ApiProblem> {
    let ApiQuery(poll) = query.map_err(|p| state.problem(p))?;
    let mut rx = state.leadership.clone();
    let now = *rx.borrow_and_update();
    if !poll.is_poll() {
        return Ok(ApiJson(state.view(&now)));
    }
    let after_term = poll.after_term.unwrap_or(now.term);
    let timeout_ms = poll
        .timeout_ms
        .unwrap_or(LONG_POLL_TIMEOUT_MS_DEFAULT)
        .min(LONG_POLL_TIMEOUT_MS_MAX);
    // Besides "term above N or role changed", any other change of the view (leader
    // learned, token established or withdrawn, announcement done) also answers: a client
    // waiting for the token to appear would otherwise wait out the timeout.
    let changed = |l: &Leadership| {
        l.term > after_term
            || (l.role, l.leader_id, l.token, l.announced)
                != (now.role, now.leader_id, now.token, now.announced)
    };
    if !changed(&now) {
        tokio::select! {
            () = state.shutdown.cancelled() => {}
            _ = tokio::time::timeout(Duration::from_millis(timeout_ms), rx.wait_for(changed)) => {}
        }
    }
    let latest = *state.leadership.borrow();
    Ok(ApiJson(state.view(&latest)))
}
