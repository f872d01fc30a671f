//! `GET /metrics` and `GET /healthz`.

use axum::extract::State;
use axum::response::IntoResponse;
use http::{StatusCode, header};
use palisade_protocol::headers::PROMETHEUS_TEXT;
use palisade_protocol::problem::kind;
use palisade_protocol::{Health, Problem};
use palisade_server::{ApiJson, ApiProblem};

use super::state::Shared;

/// `GET /metrics`.
pub(super) async fn metrics(State(state): State<Shared>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
        state.metrics.render(),
    )
}

/// `GET /healthz`: healthy while the election loop runs.
pub(super) async fn health(State(state): State<Shared>) -> Result<ApiJson<Health>, ApiProblem> {
    if state.commands.is_running() {
        Ok(ApiJson(Health::ok(Some(state.node_id))))
    } else {
        Err(state.problem(
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                kind::NODE_STOPPED,
                "the election loop stopped; see the node's log",
            )
            .with_title("The election loop is not running"),
        ))
    }
}
