//! `POST /v1/lease` on the node API: fleet leases for the `--announce` proxies.
//!
//! Answers, in this order:
//! - a body that is not a [`LeaseRequest`]: 400/413/415/422 problems like every API body;
//! - leases off (the node runs without `--lease-ms`): 409 `leases-off`. It is a
//!   configuration mismatch between the proxy and this node, not a transient state, so it
//!   is not a 503 a proxy would retry on the next node as if it were an election;
//! - a `proxy` that is none of this node's `--announce` URLs (compared without trailing
//!   slashes): 403 `unknown-proxy`. Only those proxies are announced to, so only they may
//!   hold leases: the release shortcut "every proxy accepted the term" covers every
//!   lease holder;
//! - more than [`LEASE_PENDING_MAX`] requests already waiting: 503 `lease-busy`;
//! - not the leader, handing leadership over, or leadership lost before a quorum
//!   confirmed it: 503 `not-leader`, naming the leader this node knows (`leader_id`);
//! - no quorum confirmation within the wait (the smaller of [`LEASE_WAIT_TIMEOUT_MS`] and
//!   `lease_ms`): 503 `lease-timeout`;
//! - else 200 [`LeaseGrant`]: the term a quorum confirmed this node leads, after the
//!   request arrived (a raft `ReadIndex` round started after it arrived; the leader
//!   gathers requests so that one round answers every request that arrived before it
//!   started: see the election loop's `lease` module). An `urgent` request (a write
//!   waits for it) is not held to gather others.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use http::StatusCode;
use palisade_protocol::Problem;
use palisade_protocol::lease::{LEASES_OFF, LeaseGrant, LeaseRequest, NOT_LEADER, UNKNOWN_PROXY};
use palisade_protocol::server::ApiJson;
use tokio::sync::Semaphore;

use crate::api::ApiState;
use crate::config::NodeConfig;
use crate::node::LeaseError;

/// Lease requests waiting for their answer at once, on one node; one more is answered 503
/// `lease-busy`. A proxy sends one node one request of a renewal at a time (a write's
/// renewal may replace a timer renewal still waiting here), so a fleet of the most
/// `--announce` proxies (64) needs 64; twice that leaves room for those replaced requests
/// and retries overlapping a slow round, and the bound keeps a flood from filling the election
/// loop's inbox, which raft traffic shares.
pub const LEASE_PENDING_MAX: usize = 128;
/// The longest one lease request waits for a quorum's confirmation (and never longer than
/// `lease_ms`: a grant arriving after that would already have lapsed at the proxy, which
/// counts the lease from when it sent the request).
pub const LEASE_WAIT_TIMEOUT_MS: u64 = 2_000;
/// Problem kind: too many lease requests are waiting on this node.
pub const LEASE_BUSY: &str = "lease-busy";
/// Problem kind: the leader could not confirm its leadership within the wait.
pub const LEASE_TIMEOUT: &str = "lease-timeout";

/// The lease side of the API's state; `None` in [`ApiState`] when leases are off.
pub(crate) struct LeaseApi {
    /// The lease duration granted.
    pub lease_ms: u64,
    /// The `--announce` URLs, without trailing slashes.
    proxies: Vec<String>,
    /// One permit per waiting request ([`LEASE_PENDING_MAX`]).
    pub(crate) permits: Arc<Semaphore>,
}

impl LeaseApi {
    /// The lease API of a node with `config`, `None` when leases are off.
    pub(crate) fn from_config(config: &NodeConfig) -> Option<Self> {
        config
            .leases_on()
            .then(|| Self::new(config.lease_ms, &config.announce))
    }

    /// A lease API granting `lease_ms` to the proxies `announce` lists.
    pub(crate) fn new(lease_ms: u64, announce: &[String]) -> Self {
        Self {
            lease_ms,
            proxies: announce.iter().map(|u| normalise(u).to_owned()).collect(),
            permits: Arc::new(Semaphore::new(LEASE_PENDING_MAX)),
        }
    }

    fn knows(&self, proxy: &str) -> bool {
        let proxy = normalise(proxy);
        self.proxies.iter().any(|p| p == proxy)
    }

    fn wait(&self) -> Duration {
        Duration::from_millis(LEASE_WAIT_TIMEOUT_MS.min(self.lease_ms))
    }
}

/// A proxy URL as compared: without trailing slashes (`http://p:9001/` is
/// `http://p:9001`).
fn normalise(url: &str) -> &str {
    url.trim_end_matches('/')
}

/// `POST /v1/lease`.
pub(crate) async fn lease(
    State(state): State<Arc<ApiState>>,
    body: Result<ApiJson<LeaseRequest>, Problem>,
) -> Result<ApiJson<LeaseGrant>, Problem> {
    let refuse = |status: StatusCode, kind: &'static str, title: &str, detail: String| {
        state.metrics.lease_refused(kind);
        state.problem(Problem::new(status, kind, detail).with_title(title))
    };
    let ApiJson(request) = body.map_err(|p| {
        state.metrics.lease_refused("bad-body");
        state.problem(p)
    })?;
    let Some(leases) = state.leases.as_ref() else {
        return Err(refuse(
            StatusCode::CONFLICT,
            LEASES_OFF,
            "This node grants no leases",
            format!(
                "node {} runs without --lease-ms; start every node with it to use a proxy fleet",
                state.node_id
            ),
        ));
    };
    if !leases.knows(&request.proxy) {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            UNKNOWN_PROXY,
            "Not a proxy of this fleet",
            format!(
                "proxy {:?} is not among node {}'s --announce URLs; only announced proxies \
                 may hold leases",
                request.proxy, state.node_id
            ),
        ));
    }
    let Ok(_permit) = Arc::clone(&leases.permits).try_acquire_owned() else {
        return Err(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            LEASE_BUSY,
            "Too many lease requests waiting",
            format!("{LEASE_PENDING_MAX} lease requests are already waiting (LEASE_PENDING_MAX)"),
        ));
    };
    let wait = leases.wait();
    let outcome = tokio::time::timeout(wait, state.commands.lease(request.urgent)).await;
    let err = match outcome {
        Ok(Ok(term)) => {
            return Ok(ApiJson(LeaseGrant {
                scope: state.scope.clone(),
                term,
                leader_id: state.node_id,
                lease_ms: leases.lease_ms,
            }));
        }
        Ok(Err(err)) => err,
        Err(_) => LeaseError::TimedOut {
            waited_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        },
    };
    Err(match err {
        LeaseError::NotLeader { leader_id } => {
            state.metrics.lease_refused(NOT_LEADER);
            Problem::new(StatusCode::SERVICE_UNAVAILABLE, NOT_LEADER, err.to_string())
                .with_title("This node is not the leader")
                .with_node(state.node_id, leader_id.filter(|&id| id != state.node_id))
        }
        LeaseError::TimedOut { .. } => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            LEASE_TIMEOUT,
            "Leadership not confirmed in time",
            err.to_string(),
        ),
        LeaseError::Stopped => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "node-stopped",
            "The node stopped",
            err.to_string(),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a proxy is known by its announce URL with or without a trailing slash, and
    /// nothing else matches. Method: compare variants of a URL against one list.
    #[test]
    fn proxies_are_compared_without_trailing_slashes() {
        let api = LeaseApi::new(1_000, &["http://127.0.0.1:9001/".to_owned()]);
        assert!(api.knows("http://127.0.0.1:9001"));
        assert!(api.knows("http://127.0.0.1:9001/"));
        assert!(!api.knows("http://127.0.0.1:9002"));
        assert!(!api.knows("http://127.0.0.1:9001/admin"));
        assert!(!api.knows(""));
    }
}
