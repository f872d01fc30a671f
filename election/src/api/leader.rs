//! `GET /v1/leader`: this node's leader view, plain or as a long poll.

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::response::{IntoResponse as _, Response};
use palisade_protocol::{LeaderView, LongPoll};
use palisade_server::{ApiJson, ApiProblem, ApiQuery};

use super::long_polls::{LONG_POLL_RETRY_AFTER_S, LongPolls, client_of};
use super::state::Shared;
use crate::leadership::Leadership;

/// Longest long poll: a client asking for more waits this long. Keeps a forgotten client
/// from pinning a connection for ever.
pub const LONG_POLL_TIMEOUT_MS_MAX: u64 = 60_000;
/// Long-poll timeout when `after_term` is given without `timeout_ms`.
pub const LONG_POLL_TIMEOUT_MS_DEFAULT: u64 = 30_000;

/// `GET /v1/leader`, plain or as a long poll; a long poll over its limits
/// ([`super::long_polls`]) is answered 429 at once.
pub(super) async fn leader(
    State(state): State<Shared>,
    Extension(polls): Extension<Arc<LongPolls>>,
    extensions: http::Extensions,
    query: Result<ApiQuery<LongPoll>, ApiProblem>,
) -> Result<ApiJson<LeaderView>, Response> {
    let ApiQuery(poll) = query.map_err(|p| state.problem(p).into_response())?;
    let mut rx = state.leadership.clone();
    let now = *rx.borrow_and_update();
    if !poll.is_poll() {
        return Ok(ApiJson(state.view(&now)));
    }
    let client = client_of(&extensions);
    let _held = polls.enter(client.clone()).map_err(|over| {
        state.metrics.long_poll_refused(over.as_str());
        tracing::info!(
            node_id = state.node_id,
            client,
            limit = over.as_str(),
            "long poll refused over its limit"
        );
        let mut response = state.problem(over.problem(&client)).into_response();
        response.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from(LONG_POLL_RETRY_AFTER_S),
        );
        response
    })?;
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
