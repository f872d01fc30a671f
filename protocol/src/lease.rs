//! Fleet leases: how a proxy in fleet mode (`palisade proxy --cluster URL,...`) learns,
//! with a bound in time, which term is current.
//!
//! A proxy sends `POST /v1/lease` with a [`LeaseRequest`] to the cluster's leader. The
//! leader answers with a [`LeaseGrant`] only after it has confirmed, with a quorum and
//! after the request arrived, that it still leads (as a raft `ReadIndex` does). The proxy
//! measures the lease on its own monotonic clock **from when it sent the request**, so a
//! slow answer only shortens the lease. While the lease holds, the grant's `term` is
//! current: an equal token is admitted from memory, a lower one is stale, a higher one
//! makes the proxy renew first. A new leader releases its token only once every proxy
//! of the fleet acknowledged the new term (the announce) or every unacknowledged proxy's
//! lease has certainly expired. The protocol and its safety argument: `docs/fleet.md`.
//!
//! A node that is not the leader answers 503 problem+json of kind [`NOT_LEADER`], with
//! the leader it knows in `detail`; a proxy the cluster does not list (not among the
//! nodes' `--announce` URLs) is refused with 403 of kind [`UNKNOWN_PROXY`].

use serde::{Deserialize, Serialize};

use crate::scope::Scope;

/// A proxy asks for (or renews) its lease.
pub const LEASE_PATH: &str = "/v1/lease";
/// Problem kind: this node does not lead; ask another.
pub const NOT_LEADER: &str = "not-leader";
/// Problem kind: the proxy is not one of the fleet's (the nodes' `--announce` URLs).
pub const UNKNOWN_PROXY: &str = "unknown-proxy";
/// Problem kind: this cluster grants no leases (its nodes run without `--lease-ms`).
pub const LEASES_OFF: &str = "leases-off";
/// Problem kind, on a proxy's data path: the proxy holds no valid lease (it lapsed and a
/// renewal failed or timed out), so it forwards no fenced write; retry after `Retry-After`.
pub const LEASE_EXPIRED: &str = "lease-expired";
/// Problem kind: too many lease requests are already waiting on the node asked (503).
pub const LEASE_BUSY: &str = "lease-busy";
/// Problem kind: the leader could not confirm its leadership within the wait (503).
pub const LEASE_TIMEOUT: &str = "lease-timeout";

/// `POST /v1/lease`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// The proxy, named by its admin URL exactly as the nodes' `--announce` lists it.
    pub proxy: String,
    /// A write waits for this renewal (its lease lapsed, or its token is above the
    /// lease's term): the leader starts a round for it without gathering. False (the
    /// default, not sent): a renewal ahead of the lease's end, which the leader may hold
    /// for up to its gather interval so that one round answers many proxies.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub urgent: bool,
}

/// The leader's answer: it led, confirmed by a quorum, at some moment after the request
/// was sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    /// The scope the cluster's tokens are for.
    pub scope: Scope,
    /// The leader's term: the current term while the lease holds.
    pub term: u64,
    /// The leader that granted it.
    pub leader_id: u64,
    /// How long the lease holds, in milliseconds, counted by the proxy from when it sent
    /// the request.
    pub lease_ms: u64,
}

/// A proxy's `GET /v1/lease` (admin API): the lease it holds now, and its renewal counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseView {
    /// The cluster's scope, from the last grant (absent before the first).
    pub scope: Option<Scope>,
    /// The term of the last grant (0 before the first).
    pub term: u64,
    /// The leader that granted it (absent before the first grant).
    pub leader_id: Option<u64>,
    /// Whether the lease holds now.
    pub valid: bool,
    /// Milliseconds until it lapses on the proxy's clock (0 when not valid).
    pub expires_in_ms: u64,
    /// Renewals granted since the proxy started.
    pub renewals: u64,
    /// Renewal rounds that failed since the proxy started (no node granted a lease).
    pub failures: u64,
    /// Why the cluster refuses this proxy a lease, when the last round's answers say an
    /// operator must fix it (nodes started without `--lease-ms`, a proxy missing from
    /// their `--announce`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
}
