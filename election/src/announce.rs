//! Fencing on election: once this node holds a token, raise every `--announce` proxy's
//! fence for the scope to it (`POST <url>/v1/fences/<scope>` with `{"token":N}`), so a
//! deposed leader's writes are refused at once rather than when its own token arrives.
//!
//! Attempts are retried with capped exponential backoff while the node holds the same
//! token, and abandoned the moment it does not. A 409 means the proxy already holds a
//! higher fence (a newer leader exists, or someone raised it by hand): that proxy is not
//! retried, and the token stays not announced. When every proxy answered 200 the loop is
//! told, and `Leadership::announced` becomes true.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, info, warn};

use crate::leadership::Leadership;
use crate::metrics::NodeMetrics;
use crate::node::Commands;

/// Time allowed for one announcement request.
pub const ANNOUNCE_TIMEOUT_MS: u64 = 2_000;
/// First delay before retrying a failed announcement.
pub const ANNOUNCE_BACKOFF_MIN_MS: u64 = 50;
/// Cap of the retry delay.
pub const ANNOUNCE_BACKOFF_MAX_MS: u64 = 2_000;
/// Bytes of a proxy's answer read for the log.
const ANSWER_BYTES_MAX: usize = 4 * 1024;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// What the announcer needs.
pub(crate) struct Announcer {
    pub scope: String,
    pub urls: Vec<String>,
    pub leadership: watch::Receiver<Leadership>,
    pub commands: Commands,
    pub metrics: NodeMetrics,
    pub shutdown: CancellationToken,
}

/// The announcer task: waits for a token, announces it, repeats for the next one.
pub(crate) async fn run(a: Announcer) {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut rx = a.leadership.clone();
    loop {
        // Each branch future yields a plain value: a watch guard must not live across an await.
        let waited = tokio::select! {
            () = a.shutdown.cancelled() => return,
            w = async { rx.wait_for(|l| l.token.is_some() && !l.announced).await.map(|l| l.token) } => w,
        };
        let Ok(Some(token)) = waited else {
            return; // the loop stopped
        };
        let mut lost = rx.clone();
        let accepted = tokio::select! {
            () = a.shutdown.cancelled() => return,
            () = async { let _ = lost.wait_for(|l| l.token != Some(token)).await; } => {
                info!(token, "token withdrawn before every proxy accepted it");
                continue;
            }
            all = announce_all(&client, &a, token) => all,
        };
        if accepted {
            a.commands.announced(token).await;
        }
        // Announced (or refused somewhere): nothing more to do until the token changes.
        let stopped = tokio::select! {
            () = a.shutdown.cancelled() => true,
            s = async { rx.wait_for(|l| l.token != Some(token)).await.is_err() } => s,
        };
        if stopped {
            return;
        }
    }
}

/// Announces `token` to every proxy at once. True when all accepted it.
async fn announce_all(client: &HttpClient, a: &Announcer, token: u64) -> bool {
    let mut set = JoinSet::new();
    for url in &a.urls {
        let target = format!("{}/v1/fences/{}", url.trim_end_matches('/'), a.scope);
        set.spawn(announce_one(client.clone(), target, token, a.metrics.clone()).in_current_span());
    }
    let mut all = true;
    while let Some(joined) = set.join_next().await {
        all &= joined.unwrap_or(false);
    }
    all
}

/// Announces `token` at `target` until it is accepted (true) or refused (false).
async fn announce_one(
    client: HttpClient,
    target: String,
    token: u64,
    metrics: NodeMetrics,
) -> bool {
    let body = Bytes::from(format!("{{\"token\":{token}}}"));
    let mut backoff_ms = ANNOUNCE_BACKOFF_MIN_MS;
    loop {
        let request = http::Request::post(target.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body.clone()));
        let request = match request {
            Ok(r) => r,
            Err(err) => {
                warn!(url = %target, cause = %err, "cannot build the announcement request");
                return false;
            }
        };
        let sent = tokio::time::timeout(
            Duration::from_millis(ANNOUNCE_TIMEOUT_MS),
            client.request(request),
        )
        .await;
        let retry_cause = match sent {
            Ok(Ok(response)) => {
                let status = response.status();
                let answer = Limited::new(response.into_body(), ANSWER_BYTES_MAX)
                    .collect()
                    .await
                    .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                    .unwrap_or_default();
                if status == http::StatusCode::OK {
                    info!(url = %target, token, "proxy accepted the token");
                    return true;
                }
                metrics.announce_failures.increment(1);
                if status == http::StatusCode::CONFLICT {
                    warn!(
                        url = %target, token, answer = %answer,
                        "proxy holds a higher fence than this token; not announced"
                    );
                    return false;
                }
                if status.is_client_error() {
                    warn!(url = %target, token, %status, answer = %answer, "proxy refused the token");
                    return false;
                }
                format!("status {status}")
            }
            Ok(Err(err)) => {
                metrics.announce_failures.increment(1);
                err.to_string()
            }
            Err(_) => {
                metrics.announce_failures.increment(1);
                format!("no answer within {ANNOUNCE_TIMEOUT_MS} ms")
            }
        };
        warn!(url = %target, token, cause = %retry_cause, retry_in_ms = backoff_ms, "announcement failed");
        tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
        backoff_ms = (backoff_ms * 2).min(ANNOUNCE_BACKOFF_MAX_MS);
    }
}
