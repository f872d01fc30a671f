//! The node's Prometheus metrics, kept in a recorder of its own (not the process-global
//! one), so several nodes can run in one process and each `/metrics` shows its own.
//! Every metric has a `HELP` text; `.ci/check-metrics` runs `promtool check metrics` on
//! a node's `/metrics`.
//!
//! One family is not in the recorder: [`API_CONNECTION_CLOSES`], counted by the API's
//! close hook, a plain function with no node to reach, so in process-wide atomics that
//! [`NodeMetrics::render`] appends.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{Counter, Gauge, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use palisade_server::CloseReason;

/// Connections the node API closed on its own, by `reason` (header-timeout,
/// keepalive-timeout, evicted-idle, request-timeout). Defined here, with the other
/// metric names, so that the metrics (a floor below the API) never import the API.
pub const API_CONNECTION_CLOSES: &str = "palisade_node_api_connection_closes_total";

/// Always 1, with the build's `version` as a label (also on the proxy).
pub const BUILD_INFO: &str = "palisade_build_info";

/// The close reasons counted apart, in the order of [`API_CLOSES`]; any other counts as
/// `other`.
const API_CLOSE_REASONS: [CloseReason; 5] = [
    CloseReason::HeaderTimeout,
    CloseReason::KeepaliveTimeout,
    CloseReason::EvictedIdle,
    CloseReason::WriteTimeout,
    CloseReason::RequestTimeout,
];
/// Connections the node APIs of this process closed on their own: one per reason of
/// [`API_CLOSE_REASONS`], then `other`.
static API_CLOSES: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

/// Node API requests refused for the credential's role, by `route` and `role`.
pub const API_FORBIDDEN: &str = "palisade_node_api_forbidden_total";

/// Handles to every metric of one node.
#[derive(Clone)]
pub(crate) struct NodeMetrics {
    /// Renders the text exposition.
    pub handle: PrometheusHandle,
    /// `palisade_node_term`: the current raft term.
    pub term: Gauge,
    /// `palisade_node_is_leader`: 1 while raft leader, else 0.
    pub is_leader: Gauge,
    /// `palisade_node_token`: the fencing token held (0 when none).
    pub token: Gauge,
    /// `palisade_node_announced`: 1 while every proxy accepted the token.
    pub announced: Gauge,
    /// `palisade_node_elections_won_total`: times this node became leader.
    pub elections_won: Counter,
    /// `palisade_node_leader_changes_total`: times the known leader changed.
    pub leader_changes: Counter,
    /// `palisade_node_peer_messages_dropped_total{reason="unreachable"}`: outgoing raft
    /// messages dropped.
    pub peer_dropped: Counter,
    /// `palisade_node_announce_failures_total`: failed announcement attempts.
    pub announce_failures: Counter,
    /// `palisade_node_session_keepalives_total`: session keepalives this node accepted
    /// as the leader.
    pub session_keepalives: Counter,
    /// `palisade_node_token_releases_total{by="announce"}`: tokens released (leases on)
    /// because every proxy accepted the term.
    pub released_by_announce: Counter,
    /// `palisade_node_token_releases_total{by="lease-expiry"}`: tokens released (leases
    /// on) because the release wait passed first.
    pub released_by_lease_expiry: Counter,
    /// `palisade_node_lease_rounds_total`: `ReadIndex` rounds started for lease requests
    /// (one per batch of concurrent requests).
    pub lease_rounds: Counter,
    /// `palisade_node_lease_grants_total`: leases granted.
    pub lease_grants: Counter,
    /// `palisade_node_lease_pending`: lease requests the election loop holds (in the
    /// round in flight or waiting for the next).
    pub lease_pending: Gauge,
    /// `palisade_node_snapshots_applied_total`: snapshots from a leader this node
    /// installed (a new member catching up after compaction, or a far-behind one).
    pub snapshots_applied: Counter,
    /// `palisade_node_score_transfers_total`: leadership transfers this node started as
    /// leader because a follower scored better for the hold time.
    pub score_transfers: Counter,
    /// The node's own recorder, to register the per-reason counters of dropped incoming
    /// messages when a reason first occurs.
    recorder: Arc<PrometheusRecorder>,
    node_id: String,
}

impl NodeMetrics {
    pub(crate) fn new(node_id: u64) -> Self {
        let recorder = Arc::new(PrometheusBuilder::new().build_recorder());
        let handle = recorder.handle();
        let labels = [("node_id", node_id.to_string())];
        metrics::with_local_recorder(&*recorder, || {
            metrics::describe_gauge!("palisade_node_term", "The current raft term.");
            metrics::describe_gauge!(
                "palisade_node_is_leader",
                "1 while this node is the raft leader, else 0."
            );
            metrics::describe_gauge!(
                "palisade_node_token",
                "The fencing token this node holds as established leader (0 when none)."
            );
            metrics::describe_gauge!(
                "palisade_node_announced",
                "1 while every configured proxy accepted this node's token."
            );
            metrics::describe_counter!(
                "palisade_node_session_keepalives_total",
                Unit::Count,
                "Session keepalives this node accepted as the leader."
            );
            metrics::describe_counter!(
                "palisade_node_elections_won_total",
                Unit::Count,
                "Times this node became the raft leader."
            );
            metrics::describe_counter!(
                "palisade_node_leader_changes_total",
                Unit::Count,
                "Times the leader known to this node changed."
            );
            metrics::describe_counter!(
                "palisade_node_peer_messages_dropped_total",
                Unit::Count,
                "Raft messages dropped: outgoing ones because the peer was unreachable \
                 (reason unreachable), incoming ones that failed a check before raft saw them."
            );
            metrics::describe_counter!(
                "palisade_node_long_poll_refusals_total",
                Unit::Count,
                "Long polls of GET /v1/leader answered 429 at once: over the limit of one \
                 client (scope client) or of the node (scope total)."
            );
            metrics::describe_counter!(
                "palisade_node_announce_failures_total",
                Unit::Count,
                "Failed attempts to announce a token to a proxy."
            );
            metrics::describe_counter!(
                "palisade_node_token_releases_total",
                Unit::Count,
                "Tokens released with fleet leases on, by cause: announce (every proxy \
                 accepted the term) or lease-expiry (the release wait passed first)."
            );
            metrics::describe_counter!(
                "palisade_node_lease_rounds_total",
                Unit::Count,
                "ReadIndex rounds started to answer lease requests; concurrent requests \
                 share one round."
            );
            metrics::describe_counter!(
                "palisade_node_lease_grants_total",
                Unit::Count,
                "Fleet leases granted."
            );
            metrics::describe_counter!(
                "palisade_node_lease_refusals_total",
                Unit::Count,
                "Lease requests refused, by reason (the problem kind)."
            );
            metrics::describe_counter!(
                "palisade_node_score_transfers_total",
                Unit::Count,
                "Leadership transfers started because a follower scored better than this \
                 leader by more than the margin for the hold time."
            );
            metrics::describe_counter!(
                "palisade_node_snapshots_applied_total",
                Unit::Count,
                "Snapshots from a leader this node installed."
            );
            metrics::describe_counter!(
                API_FORBIDDEN,
                Unit::Count,
                "Node API requests refused (403 forbidden-role) because the client \
                 certificate's role does not allow them, by route (its path template) and \
                 role (node, proxy, writer, operator, none)."
            );
            metrics::describe_gauge!(BUILD_INFO, "Always 1; the version label is the build's.");
            metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            metrics::describe_gauge!(
                "palisade_node_lease_pending",
                "Lease requests waiting for a quorum round in the election loop."
            );
            let release = |by: &'static str| {
                metrics::counter!(
                    "palisade_node_token_releases_total",
                    "node_id" => node_id.to_string(),
                    "by" => by
                )
            };
            Self {
                released_by_announce: release("announce"),
                released_by_lease_expiry: release("lease-expiry"),
                lease_rounds: metrics::counter!("palisade_node_lease_rounds_total", &labels),
                lease_grants: metrics::counter!("palisade_node_lease_grants_total", &labels),
                lease_pending: metrics::gauge!("palisade_node_lease_pending", &labels),
                snapshots_applied: metrics::counter!(
                    "palisade_node_snapshots_applied_total",
                    &labels
                ),
                score_transfers: metrics::counter!("palisade_node_score_transfers_total", &labels),
                term: metrics::gauge!("palisade_node_term", &labels),
                is_leader: metrics::gauge!("palisade_node_is_leader", &labels),
                token: metrics::gauge!("palisade_node_token", &labels),
                announced: metrics::gauge!("palisade_node_announced", &labels),
                elections_won: metrics::counter!("palisade_node_elections_won_total", &labels),
                leader_changes: metrics::counter!("palisade_node_leader_changes_total", &labels),
                peer_dropped: metrics::counter!(
                    "palisade_node_peer_messages_dropped_total",
                    "node_id" => node_id.to_string(),
                    "reason" => "unreachable"
                ),
                announce_failures: metrics::counter!(
                    "palisade_node_announce_failures_total",
                    &labels
                ),
                session_keepalives: metrics::counter!(
                    "palisade_node_session_keepalives_total",
                    &labels
                ),
                handle,
                recorder: Arc::clone(&recorder),
                node_id: node_id.to_string(),
            }
        })
    }

    /// Counts one incoming peer message dropped for `reason`.
    pub(crate) fn inbound_dropped(&self, reason: &'static str) {
        metrics::with_local_recorder(&*self.recorder, || {
            metrics::counter!(
                "palisade_node_peer_messages_dropped_total",
                "node_id" => self.node_id.clone(),
                "reason" => reason
            )
            .increment(1);
        });
    }

    /// Counts one long poll refused over the limit of `scope`: `client` or `total`.
    pub(crate) fn long_poll_refused(&self, scope: &'static str) {
        metrics::with_local_recorder(&*self.recorder, || {
            metrics::counter!(
                "palisade_node_long_poll_refusals_total",
                "node_id" => self.node_id.clone(),
                "scope" => scope
            )
            .increment(1);
        });
    }

    /// Counts one lease request refused for `reason` (its problem kind).
    pub(crate) fn lease_refused(&self, reason: &'static str) {
        metrics::with_local_recorder(&*self.recorder, || {
            metrics::counter!(
                "palisade_node_lease_refusals_total",
                "node_id" => self.node_id.clone(),
                "reason" => reason
            )
            .increment(1);
        });
    }

    /// Counts one API request refused for its credential's role: `route` one of the
    /// API's path templates, `role` one of the four roles or `none`.
    pub(crate) fn api_forbidden(&self, route: &'static str, role: &'static str) {
        metrics::with_local_recorder(&*self.recorder, || {
            metrics::counter!(
                API_FORBIDDEN,
                "node_id" => self.node_id.clone(),
                "route" => route,
                "role" => role
            )
            .increment(1);
        });
    }

    /// The Prometheus text exposition: the node's recorder, then the API's connection
    /// closes.
    pub(crate) fn render(&self) -> String {
        let mut text = self.handle.render();
        let _ = writeln!(
            text,
            "# HELP {API_CONNECTION_CLOSES} Connections the node APIs of this process closed \
             on their own, by reason (header-timeout, keepalive-timeout, evicted-idle, \
             write-timeout, request-timeout, other).\n# TYPE {API_CONNECTION_CLOSES} counter"
        );
        let labels = API_CLOSE_REASONS.map(CloseReason::as_str);
        for (reason, count) in labels.iter().chain(&["other"]).zip(&API_CLOSES) {
            let _ = writeln!(
                text,
                "{API_CONNECTION_CLOSES}{{reason=\"{reason}\"}} {}",
                count.load(Ordering::Relaxed)
            );
        }
        text
    }
}

/// Counts one connection the node API closed on its own ([`API_CONNECTION_CLOSES`]):
/// the API listener's close hook.
pub(crate) fn api_connection_closed(_listener: &'static str, reason: CloseReason) {
    let slot = API_CLOSE_REASONS
        .iter()
        .position(|r| *r == reason)
        .unwrap_or(API_CLOSE_REASONS.len());
    API_CLOSES[slot].fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a node's `/metrics` carries the build's version and the API's connection
    /// closes, counted by the close hook, every reason present from the start.
    /// Method: count a keep-alive close through the hook; render; read the lines.
    #[test]
    fn render_has_build_info_and_the_api_connection_closes() {
        let metrics = NodeMetrics::new(7);
        let before = metrics.render();
        let count = |text: &str, reason: &str| -> u64 {
            let prefix = format!("{API_CONNECTION_CLOSES}{{reason=\"{reason}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no {reason} line in {text}"))
        };
        api_connection_closed("node-api", CloseReason::KeepaliveTimeout);
        let after = metrics.render();
        assert_eq!(
            count(&after, "keepalive-timeout"),
            count(&before, "keepalive-timeout") + 1
        );
        for reason in ["header-timeout", "evicted-idle", "write-timeout", "other"] {
            count(&after, reason);
        }
        assert!(
            after.contains(&format!(
                "{BUILD_INFO}{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{after}"
        );
    }
}
