//! A proxy's status, as JSON: `GET /v1/status` on its admin API. The same snapshot is
//! rendered as the HTML status page at `GET /`, and `palisade status` reads it.
//!
//! Fields are only ever added; a reader ignores fields it does not know.

use serde::{Deserialize, Serialize};

use crate::audit::AuditRecord;
use crate::lease::LeaseView;

/// The proxy's status as JSON (admin API).
pub const STATUS_PATH: &str = "/v1/status";
/// The HTML status page (admin API and node API).
pub const STATUS_PAGE_PATH: &str = "/";

/// `GET /v1/status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyStatus {
    /// When the snapshot was taken, RFC 3339 in UTC.
    pub time: String,
    /// When the proxy started, RFC 3339 in UTC.
    #[serde(default)]
    pub started: String,
    /// Every fence, by scope.
    #[serde(default)]
    pub fences: Vec<FenceStatus>,
    /// The most recent rejections, newest first (a bounded ring: see `rejections_max`).
    #[serde(default)]
    pub rejections: Vec<AuditRecord>,
    /// How many rejections the rings keep in all: half for stale tokens, half for the
    /// missing or invalid proofs written in full, so that a flood of the second never
    /// pushes the first out.
    #[serde(default)]
    pub rejections_max: u64,
    /// Rejections since the proxy started.
    #[serde(default)]
    pub rejections_total: u64,
    /// The in-flight barrier.
    #[serde(default)]
    pub barrier: BarrierStatus,
    /// The upstream's health, as the data path has seen it.
    #[serde(default)]
    pub upstream: UpstreamStatus,
    /// Fleet mode's lease; absent in standalone mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseView>,
    /// The audit log; absent when none is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditStatus>,
}

/// One scope's fence.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceStatus {
    /// The scope.
    pub scope: String,
    /// Its fence: the highest token admitted.
    pub token: u64,
    /// When this process last raised it (absent when it has not since it started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raised_at: Option<String>,
    /// The fence before that raise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raised_from: Option<u64>,
    /// Requests of the scope in flight now (admitted or waiting at the barrier).
    #[serde(default)]
    pub in_flight: u64,
}

/// The barrier: higher-token writes waiting for lower-token writes still in flight.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BarrierStatus {
    /// Requests that had to wait at the barrier since the proxy started.
    pub waits_total: u64,
    /// Requests waiting now (a higher token behind a lower one still in flight).
    pub waiting: u64,
    /// Fenced requests in flight now, all scopes.
    pub in_flight: u64,
}

/// What the data path has seen of the upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamStatus {
    /// The upstream's URL, or `embedded` for the embedded object store.
    pub target: String,
    /// Requests it answered since the proxy started.
    pub answered: u64,
    /// Forwarded requests that failed (no answer, a timeout, a broken connection).
    pub failed: u64,
    /// When it last answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_answer_at: Option<String>,
    /// When a forward last failed, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_at: Option<String>,
    /// The last failure's cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
}

/// The audit log's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditStatus {
    /// The file.
    pub path: String,
    /// Records queued for writing since start.
    pub queued: u64,
    /// Records dropped because the writer's queue was full (never blocking the data
    /// path).
    pub dropped: u64,
    /// Records that could not be written (the file failed).
    #[serde(default)]
    pub failed: u64,
    /// Noise records (missing or invalid proofs) counted but not written in full, past
    /// the rate written per kind; the noise file's `suppressed` records say how many.
    #[serde(default)]
    pub suppressed: u64,
}
