//! The `storage-rtt` oracle's prober: times `GET /healthz` on each `--announce` proxy's
//! admin API, with the node's client TLS, and publishes the worst proxy's median round
//! trip in milliseconds.
//!
//! The worst proxy counts because a new leader must reach every proxy before its token is
//! announced; with one proxy (the usual deployment) it is simply that proxy. A probe that
//! fails or times out counts as a sample of [`STORAGE_PROBE_TIMEOUT_MS`]: a node that
//! cannot reach its proxies makes a poor leader, which is what its score should say.

use std::time::{Duration, Instant};

use palisade_client::{ClientTls, ProxyAdmin};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info_span, warn};

use super::rtt::RttWindow;

/// Time between two probe rounds. Half a second gives a median of
/// [`super::rtt::RTT_SAMPLES_MAX`] samples within a few seconds, well inside the default
/// hold time, at two tiny requests per second per proxy.
pub const STORAGE_PROBE_INTERVAL_MS: u64 = 500;
/// Time one probe may take; a slower or failed one counts as this many milliseconds.
pub const STORAGE_PROBE_TIMEOUT_MS: u64 = 2_000;
/// Samples per proxy before the score is published (until then it is unknown, which ranks
/// last and never draws a hand-over): one sample is too easily an outlier of a busy
/// moment, and a node's first scores would otherwise move leadership for nothing.
pub const STORAGE_PROBE_SAMPLES_MIN: usize = 3;

/// Starts the prober in `tasks`; the returned watch holds the worst proxy's median round
/// trip in milliseconds (`None` until every proxy has a sample).
pub(crate) fn spawn_storage_probe(
    node_id: u64,
    urls: &[String],
    tls: &ClientTls,
    shutdown: CancellationToken,
    tasks: &mut JoinSet<()>,
) -> watch::Receiver<Option<f64>> {
    let (tx, rx) = watch::channel(None);
    let timeout = Duration::from_millis(STORAGE_PROBE_TIMEOUT_MS);
    let mut admins = Vec::with_capacity(urls.len());
    for entry in urls {
        // An entry may name the proxy's credential (`proxy-a=URL`): probe the URL. Entries
        // were validated at start-up; one that does not parse is skipped like an unusable
        // URL below.
        let url = match palisade_protocol::announce::parse_announce_entry(entry) {
            Ok(parsed) => parsed.url,
            Err(err) => {
                warn!(node_id, entry = %err.entry, cause = %err, "cannot probe this proxy; the storage-rtt score stays unknown");
                continue;
            }
        };
        let url = &url;
        match ProxyAdmin::with_tls(url, tls) {
            Ok(admin) => admins.push((url.clone(), admin.timeout(timeout))),
            // The URLs were validated with the configuration; a proxy the client still
            // refuses has no round trip, so this node's score stays unknown (worst).
            Err(err) => {
                warn!(node_id, url = %url, cause = %err, "cannot probe this proxy; the storage-rtt score stays unknown");
                return rx;
            }
        }
    }
    tasks.spawn(
        async move {
            let mut windows = vec![RttWindow::default(); admins.len()];
            let mut first_round = true;
            let mut interval =
                tokio::time::interval(Duration::from_millis(STORAGE_PROBE_INTERVAL_MS));
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = interval.tick() => {}
                }
                for ((url, admin), window) in admins.iter().zip(windows.iter_mut()) {
                    // The first probe of a proxy also opens the connection (and its TLS
                    // session): not a round trip the leader's writes would pay.
                    if first_round {
                        let _ = admin.health().await;
                    }
                    let started = Instant::now();
                    let ms = match admin.health().await {
                        Ok(_) => started.elapsed().as_secs_f64() * 1_000.0,
                        Err(err) => {
                            debug!(url = %url, cause = %err, "storage probe failed");
                            timeout.as_secs_f64() * 1_000.0
                        }
                    };
                    window.push(ms);
                }
                first_round = false;
                let worst = windows
                    .iter()
                    .map(|w| {
                        (w.len() >= STORAGE_PROBE_SAMPLES_MIN)
                            .then(|| w.median())
                            .flatten()
                    })
                    .try_fold(0.0_f64, |acc, m| m.map(|m| acc.max(m)));
                tx.send_replace(worst);
            }
        }
        .instrument(info_span!("storage_probe", node_id)),
    );
    rx
}
