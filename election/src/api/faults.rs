//! `GET` and `POST /v1/test/faults`, routed only on a node started with test faults.

use axum::extract::State;
use http::StatusCode;
use palisade_protocol::problem::kind;
use palisade_protocol::{FaultSpec, Problem};
use palisade_server::{ApiJson, ApiProblem};
use tracing::warn;

use super::state::Shared;
use crate::transport::faults::FaultError;

/// `GET /v1/test/faults`.
pub(super) async fn get_faults(State(state): State<Shared>) -> ApiJson<FaultSpec> {
    ApiJson(state.faults.as_ref().map(|f| f.get()).unwrap_or_default())
}

/// `POST /v1/test/faults`: replaces the faults of this node's links.
pub(super) async fn set_faults(
    State(state): State<Shared>,
    body: Result<ApiJson<FaultSpec>, ApiProblem>,
) -> Result<ApiJson<FaultSpec>, ApiProblem> {
    let ApiJson(spec) = body.map_err(|p| state.problem(p))?;
    let Some(faults) = state.faults.as_ref() else {
        // The route exists only with faults enabled; this answers the same as without it.
        return Err(state.problem(Problem::new(
            StatusCode::NOT_FOUND,
            kind::NOT_FOUND,
            FaultError::Disabled.to_string(),
        )));
    };
    match faults.set(spec) {
        Ok(spec) => {
            warn!(drop = ?spec.drop, delay_ms = ?spec.delay_ms, "test faults set");
            Ok(ApiJson(spec))
        }
        Err(err) => Err(state.problem(
            Problem::new(StatusCode::BAD_REQUEST, kind::BAD_FAULTS, err.to_string())
                .with_title("Fault spec refused"),
        )),
    }
}
