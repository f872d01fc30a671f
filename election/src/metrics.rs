//! The node's Prometheus metrics, kept in a recorder of its own (not the process-global
//! one), so several nodes can run in one process and each `/metrics` shows its own.

use std::sync::Arc;

use metrics::{Counter, Gauge, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

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

    /// The Prometheus text exposition.
    pub(crate) fn render(&self) -> String {
        self.handle.render()
    }
}
