//! The proxy's admin API: paths, request bodies and answers.
//!
//! - `GET /v1/fences` -> [`FenceList`]
//! - `GET /v1/fences/{scope}` -> [`FenceView`] (token 0 when never seen)
//! - `POST /v1/fences/{scope}` with [`AdvanceRequest`] -> [`AdvanceResponse`]; 409
//!   problem+json when the token is below the fence.
//! - `GET /metrics` (Prometheus text), `GET /healthz` -> [`crate::Health`].

use serde::{Deserialize, Serialize};

use crate::scope::Scope;

/// The list of fences.
pub const FENCES_PATH: &str = "/v1/fences";
/// Liveness, on the admin port and on the node API.
pub const HEALTHZ_PATH: &str = "/healthz";
/// Prometheus metrics, on the admin port and on the node API.
pub const METRICS_PATH: &str = "/metrics";

/// The path of one scope's reset (`POST`, admin credential required).
pub fn reset_path(scope: &Scope) -> String {
    format!("{FENCES_PATH}/{scope}/reset")
}

/// The path of one scope's fence.
pub fn fence_path(scope: &Scope) -> String {
    format!("{FENCES_PATH}/{scope}")
}

/// One scope's fence: the highest token the proxy has admitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceView {
    /// The scope.
    pub scope: Scope,
    /// Its fence (0 when the scope was never seen).
    pub token: u64,
}

/// `GET /v1/fences`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FenceList {
    /// Every scope the proxy has a fence for.
    pub fences: Vec<FenceView>,
}

/// `POST /v1/fences/{scope}`: advance the fence without a write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdvanceRequest {
    /// The new fence; a lower one is refused with 409.
    pub token: u64,
    /// The token's proof from the leader view; with a valid one, a proxy that checks
    /// proofs needs no other credential for the advance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<String>,
}

/// The answer to an advance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdvanceResponse {
    /// The scope.
    pub scope: Scope,
    /// The token asked for, now the fence (or already it).
    pub token: u64,
    /// Whether the fence moved (false when it already was `token`).
    pub advanced: bool,
}

/// Longest reset reason, in bytes: a sentence or two for the audit trail.
pub const RESET_REASON_BYTES_MAX: usize = 512;

/// `POST /v1/fences/{scope}/reset`: set the fence to any value, lower included. The only
/// way a fence goes down; an operator's recovery from a forged or mistaken raise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResetRequest {
    /// The new fence.
    pub token: u64,
    /// Why, for the log and the audit trail: 1 to [`RESET_REASON_BYTES_MAX`] bytes.
    pub reason: String,
}

/// The answer to a reset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetResponse {
    /// The scope.
    pub scope: Scope,
    /// The fence before the reset.
    pub previous: u64,
    /// The fence now.
    pub token: u64,
}
