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
            Self {
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

    /// The Prometheus text exposition.
    pub(crate) fn render(&self) -> String {
        self.handle.render()
    }
}
