//! Metric names, their help texts, and the process-wide Prometheus recorder.
//!
//! Every metric is described once, when the recorder is installed ([`prometheus`]), so
//! that `/metrics` carries a `HELP` line for each; `promtool check metrics` finds nothing
//! to say (`.ci/check-metrics` checks it). The fence of each scope is not a registered
//! metric: [`render`] writes it from the fence register at each scrape, for at most
//! [`FENCE_GAUGE_SCOPES_MAX`] scopes.
//!
//! The recorder keeps each sample of a histogram (the upstream latency: one per
//! forwarded request) until it is drained into the histogram's buckets. A scrape drains
//! them, and so does the recorder's upkeep, which a thread of its own runs every
//! [`METRICS_UPKEEP_INTERVAL`]. Without it, a proxy nobody scrapes held about 20 bytes
//! per request for good: 3.5 MiB more every 10 s at 18,000 requests a second.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Counter, Histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::fencing::Fencer;

/// Requests by `class` (read, write) and `outcome`: `forwarded` (the backend answered,
/// whatever its status), `rejected` (refused by the proxy for a cause of the client's),
/// `failed` (refused for a cause of the proxy's, or the backend failed).
pub const REQUESTS: &str = "palisade_proxy_requests_total";
/// Requests the proxy refused before forwarding them, by `reason` (stale-token,
/// missing-token, bad-token, missing-proof, invalid-proof, barrier-timeout, ...). Nothing
/// of these reached the backend.
pub const REJECTIONS: &str = "palisade_proxy_rejections_total";
/// Forwarded requests whose backend failed, by `reason`: the HTTP upstream
/// (upstream-error, upstream-timeout) or the embedded store's storage (storage-error).
pub const UPSTREAM_ERRORS: &str = "palisade_proxy_upstream_errors_total";
/// Times a fence moved up, by a write or the admin API.
pub const FENCE_ADVANCES: &str = "palisade_proxy_fence_advances_total";
/// Fsynced commits that raised fences; concurrent raises share one (group commit), so
/// advances per commit show how much the disk was spared.
pub const FENCE_COMMITS: &str = "palisade_proxy_fence_commits_total";
/// Times an operator reset a fence (`POST /v1/fences/{scope}/reset`), down or up.
pub const FENCE_RESETS: &str = "palisade_proxy_fence_resets_total";
/// Requests that had to wait at the in-flight barrier.
pub const BARRIER_WAITS: &str = "palisade_proxy_barrier_waits_total";
/// Time from forwarding until the upstream's response head, in seconds.
pub const UPSTREAM_SECONDS: &str = "palisade_proxy_upstream_seconds";
/// Client connections open now.
pub const CONNECTIONS: &str = "palisade_proxy_connections";
/// Client connections parked now: HTTP/1.1 keep-alive connections idle long enough that
/// their HTTP state and buffers were freed; each still counts in [`CONNECTIONS`].
pub const CONNECTIONS_PARKED: &str = "palisade_proxy_connections_parked";
/// Connections the proxy closed on its own, by `listener` (client, admin) and `reason`:
/// `header-timeout` (no request head, or TLS handshake, within the header timeout from
/// accept), `keepalive-timeout` (idle between requests), `evicted-idle` (idle, or not yet
/// sent a head, and closed to admit a new connection at the connection limit).
pub const CONNECTION_CLOSES: &str = "palisade_proxy_connection_closes_total";
/// Request-body bytes the proxy holds now: read from clients, not yet taken by the
/// upstream. At most `limits.body_buffer_bytes_max` (plus one frame per connection
/// waiting at the cap).
pub const BODY_BUFFER_BYTES: &str = "palisade_proxy_body_buffer_bytes";
/// Times a request body waited for room under `limits.body_buffer_bytes_max`.
pub const BODY_BUFFER_WAITS: &str = "palisade_proxy_body_buffer_waits_total";

/// Fleet mode: lease renewal rounds by `outcome`: `granted`, `failed` (no node granted
/// one: not leader, unreachable, refused).
pub const LEASE_RENEWALS: &str = "palisade_proxy_lease_renewals_total";
/// Fleet mode: renewal answers a node refused, by `reason` (not-leader, unknown-proxy,
/// leases-off, unreachable, error).
pub const LEASE_REFUSALS: &str = "palisade_proxy_lease_refusals_total";
/// Fleet mode: 1 while the proxy holds a valid lease, 0 otherwise (updated by the lease
/// task at each renewal and when a lease lapses).
pub const LEASE_VALID: &str = "palisade_proxy_lease_valid";
/// Fleet mode: fenced requests refused because the proxy held no valid lease.
pub const LEASE_EXPIRED_REFUSALS: &str = "palisade_proxy_lease_expired_refusals_total";
/// Fleet mode: writes that completed after their lease's expiry plus
/// `lease_write_bound_ms` (the window a lease cannot cover; see `lease-overrun` logs).
pub const LEASE_OVERRUNS: &str = "palisade_proxy_lease_overruns_total";

/// The fence of a scope (`scope` label): the highest token admitted. Written at each
/// scrape for the first [`FENCE_GAUGE_SCOPES_MAX`] scopes in name order; the others are
/// left out, and [`FENCE_SCOPES`] counts them all.
pub const FENCE_TOKEN: &str = "palisade_proxy_fence_token";
/// Scopes with a fence.
pub const FENCE_SCOPES: &str = "palisade_proxy_fence_scopes";
/// Always 1, with the build's `version` as a label (also on the node).
pub const BUILD_INFO: &str = "palisade_build_info";

/// Scopes whose fence [`FENCE_TOKEN`] shows: a label per scope is a series per scope, and
/// `limits.scopes_max` allows thousands, too many for a metrics store to keep per proxy.
/// A fleet follows one scope and most deployments use a handful.
pub const FENCE_GAUGE_SCOPES_MAX: usize = 100;

/// Upstream latency buckets, in seconds: 100 µs to 10 s.
const UPSTREAM_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// How often the recorder's upkeep drains the histogram samples kept since the last
/// drain into their buckets: the memory they hold is bounded by the requests forwarded
/// in this time (about 20 bytes each).
pub const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The process's Prometheus handle. The recorder is global to the process, so it is
/// installed once, by whichever proxy or node starts first, and so is the thread that
/// runs its upkeep (see the module's documentation).
pub fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(UPSTREAM_SECONDS.to_owned()), UPSTREAM_BUCKETS)
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be installed (an application embedding the proxy
        // brought its own); then our handle renders only what was recorded through it.
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
        }
        describe();
        metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
        spawn_upkeep(handle.clone(), METRICS_UPKEEP_INTERVAL);
        handle
    })
}

/// Runs `handle`'s upkeep every `interval`, for the life of the process, in a thread
/// of its own: the recorder is the process's, not any one runtime's, and outlives them.
fn spawn_upkeep(handle: PrometheusHandle, interval: Duration) {
    let spawned = std::thread::Builder::new()
        .name("metrics-upkeep".to_owned())
        .spawn(move || {
            loop {
                std::thread::sleep(interval);
                handle.run_upkeep();
            }
        });
    if let Err(e) = spawned {
        // Scrapes still drain the samples; between them they are held.
        tracing::warn!(error = %e, "cannot start the metrics upkeep thread: histogram samples are held until /metrics is scraped");
    }
}

/// The text exposition: the recorder's metrics, then each scope's fence.
pub(crate) fn render(fencer: &Fencer) -> String {
    let mut text = prometheus().render();
    let fences = fencer.fence_register().list();
    let _ = write!(
        text,
        "# HELP {FENCE_SCOPES} Scopes with a fence at this proxy.\n\
         # TYPE {FENCE_SCOPES} gauge\n\
         {FENCE_SCOPES} {}\n\n\
         # HELP {FENCE_TOKEN} The fence of a scope: the highest token admitted (the first \
         {FENCE_GAUGE_SCOPES_MAX} scopes in name order).\n\
         # TYPE {FENCE_TOKEN} gauge\n",
        fences.len()
    );
    for (scope, token) in fences.iter().take(FENCE_GAUGE_SCOPES_MAX) {
        let _ = writeln!(text, "{FENCE_TOKEN}{{scope=\"{}\"}} {token}", label(scope));
    }
    text
}

/// `value` escaped for a label value of the text exposition (scope names never need
/// it, but the exposition must stay well-formed whatever a name holds).
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The `HELP` text of every metric the recorder holds.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        REQUESTS,
        Unit::Count,
        "Requests by class (read, write) and outcome: forwarded (the backend answered), \
         rejected (refused for a cause of the client's), failed (refused for a cause of the \
         proxy's, or the backend failed)."
    );
    describe_counter!(
        REJECTIONS,
        Unit::Count,
        "Requests refused before forwarding, by reason (the problem kind); none reached \
         the backend."
    );
    describe_counter!(
        UPSTREAM_ERRORS,
        Unit::Count,
        "Forwarded requests whose backend failed, by reason (upstream-error, \
         upstream-timeout, storage-error)."
    );
    describe_counter!(
        FENCE_ADVANCES,
        Unit::Count,
        "Times a fence moved up, by a write or the admin API."
    );
    describe_counter!(
        FENCE_COMMITS,
        Unit::Count,
        "Fsynced commits that raised fences; concurrent raises share one."
    );
    describe_counter!(
        FENCE_RESETS,
        Unit::Count,
        "Times an operator reset a fence, down or up."
    );
    describe_counter!(
        BARRIER_WAITS,
        Unit::Count,
        "Requests that waited at the in-flight barrier for lower-token writes."
    );
    describe_histogram!(
        UPSTREAM_SECONDS,
        Unit::Seconds,
        "Time from forwarding a request until the upstream's response head."
    );
    describe_gauge!(
        CONNECTIONS,
        Unit::Count,
        "Client connections open now, by listener."
    );
    describe_gauge!(
        CONNECTIONS_PARKED,
        Unit::Count,
        "Idle keep-alive client connections parked now (their HTTP state freed); each \
         also counts as open."
    );
    describe_counter!(
        CONNECTION_CLOSES,
        Unit::Count,
        "Connections the proxy closed on its own, by listener (client, admin) and reason \
         (header-timeout, keepalive-timeout, evicted-idle, write-timeout)."
    );
    describe_gauge!(
        BODY_BUFFER_BYTES,
        Unit::Bytes,
        "Request-body bytes read from clients and not yet taken by the upstream."
    );
    describe_counter!(
        BODY_BUFFER_WAITS,
        Unit::Count,
        "Times a request body waited for room under limits.body_buffer_bytes_max."
    );
    describe_counter!(
        LEASE_RENEWALS,
        Unit::Count,
        "Fleet mode: lease renewal rounds, by outcome (granted, failed)."
    );
    describe_counter!(
        LEASE_REFUSALS,
        Unit::Count,
        "Fleet mode: renewal answers a node refused, by reason (not-leader, \
         unknown-proxy, leases-off, unreachable, error)."
    );
    describe_gauge!(
        LEASE_VALID,
        "Fleet mode: 1 while the proxy holds a valid lease, else 0."
    );
    describe_counter!(
        LEASE_EXPIRED_REFUSALS,
        Unit::Count,
        "Fleet mode: fenced requests refused (503) because the proxy held no valid lease."
    );
    describe_counter!(
        LEASE_OVERRUNS,
        Unit::Count,
        "Fleet mode: writes that completed after their lease's expiry plus \
         lease_write_bound_ms."
    );
    describe_gauge!(BUILD_INFO, "Always 1; the version label is the build's.");
}

/// Handles of the metrics every forwarded request touches, registered once: looking a
/// labelled metric up by name on each request costs a hash and a lock.
pub(crate) struct HotPathHandles {
    /// `REQUESTS{class="read",outcome="forwarded"}`.
    pub forwarded_read: Counter,
    /// `REQUESTS{class="write",outcome="forwarded"}`.
    pub forwarded_write: Counter,
    /// `UPSTREAM_SECONDS`.
    pub upstream_seconds: Histogram,
}

/// The hot-path handles, registered with the recorder on the first call and reused
/// after. They bind to the recorder installed at that first call, so `start` installs it
/// (through [`prometheus`]) and then calls this before serving any request.
pub(crate) fn hot_path_handles() -> &'static HotPathHandles {
    static HANDLES: OnceLock<HotPathHandles> = OnceLock::new();
    HANDLES.get_or_init(|| HotPathHandles {
        forwarded_read: metrics::counter!(REQUESTS, "class" => "read", "outcome" => "forwarded"),
        forwarded_write: metrics::counter!(REQUESTS, "class" => "write", "outcome" => "forwarded"),
        upstream_seconds: metrics::histogram!(UPSTREAM_SECONDS),
    })
}

/// Counts one connection closed by a listener's own timeout or eviction
/// ([`CONNECTION_CLOSES`]); the close hook of both listeners.
pub(crate) fn connection_closed(listener: &'static str, reason: palisade_server::CloseReason) {
    metrics::counter!(CONNECTION_CLOSES, "listener" => listener, "reason" => reason.as_str())
        .increment(1);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Goal: `/metrics` shows the fence of at most `FENCE_GAUGE_SCOPES_MAX` scopes, the
    /// first in name order, counts every scope, and carries the build's version.
    /// Method: raise 130 scopes' fences; render; read the lines.
    #[test]
    fn fence_gauges_are_bounded_and_every_scope_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let db = palisade_storage::open_database(&dir.path().join("m.redb")).unwrap();
        let register = palisade_storage::FenceRegister::open(db, 1000).unwrap();
        let fencer = Fencer::new(register, Duration::from_millis(200));
        for i in 0..130u64 {
            fencer
                .fence_register()
                .advance(&format!("s{i:03}"), i + 1)
                .unwrap();
        }
        let text = render(&fencer);
        let fences: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("palisade_proxy_fence_token{"))
            .collect();
        assert_eq!(fences.len(), FENCE_GAUGE_SCOPES_MAX);
        assert_eq!(fences[0], "palisade_proxy_fence_token{scope=\"s000\"} 1");
        assert!(
            text.contains("\npalisade_proxy_fence_scopes 130\n"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "palisade_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
