//! Fencing on election: once this node is the established leader, raise every `--announce` proxy's
//! fence for the scope to it (`POST <url>/v1/fences/<scope>`, through
//! [`palisade_client::ProxyAdmin::advance`]), so a deposed leader's writes are refused at
//! once rather than when its own token arrives.
//!
//! Attempts are retried with the client's backoff policy ([`palisade_client::backoff`])
//! while the node holds the same token, and abandoned the moment it does not. A 409 means
//! the proxy already holds a higher fence (a newer leader exists, or someone raised it by
//! hand): that proxy is not retried, and the token stays not announced; so does any other
//! answer that asking again cannot change (another 4xx, an answer that is not an advance
//! response). When every proxy accepted the token the loop is told, and
//! `Leadership::announced` becomes true.
//!
//! The announcer follows `Leadership::established`, not `token`: with fleet leases the
//! token is released only once every proxy accepted the term (or the release wait
//! passed), so the announcement must come first. Without leases the two are equal.
//!
//! With a signing key, each announcement carries the token's proof, which a proxy holding
//! the public key accepts without any other credential; `--announce-token-file` adds a
//! bearer token for proxies whose admin API requires one.
//!
//! The announcers follow the announce list the election loop publishes (the flags', or
//! the one the cluster agreed on through `POST /v1/announce`): [`follow`] runs one for
//! the current list and replaces it when the list changes. Each proxy is announced to on
//! its own task: one that cannot be reached, refuses, or whose entry the client cannot
//! use is that proxy's error on the status page's board, and never keeps the others from
//! their announcement (the token is only not announced).
//!
//! A proxy that leaves the list is retired first (`retire`): its fence is raised above
//! every term, so it admits no token the cluster no longer announces to it.

mod grants;
mod retire;

pub(crate) use grants::{Fenced, GrantFencer, fence_grants};
pub(crate) use retire::ProxyFences;
pub use retire::RETIRE_TIMEOUT_MS;

use std::sync::Arc;
use std::time::Duration;

use palisade_client::{ClientError, ClientTls, ProxyAdmin, StatusCode, backoff};
use palisade_protocol::announce::{RETIRED_FENCE, parse_announce_entry};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, info, warn};

use crate::audit::Observer;
use crate::config::{ConfigError, NodeTls};
use crate::leadership::{Leadership, TokenProof};
use crate::metrics::NodeMetrics;
use crate::node::{Commands, TokenSigner};

/// Time allowed for one announcement request.
pub const ANNOUNCE_TIMEOUT_MS: u64 = 2_000;
/// First delay before retrying a failed announcement.
pub const ANNOUNCE_BACKOFF_MIN_MS: u64 = 50;
/// Cap of the retry delay (before jitter: see [`palisade_client::backoff::exponential`]).
pub const ANNOUNCE_BACKOFF_MAX_MS: u64 = 2_000;

/// What the announcer needs.
#[derive(Clone)]
pub(crate) struct Announcer {
    pub scope: String,
    pub urls: Vec<String>,
    /// The bearer token of `--announce-token-file`, if any.
    pub bearer: Option<String>,
    /// Signs each announced term's proof (`--token-key`), the same proof the leader view
    /// shows once the token is released.
    pub signer: Option<Arc<TokenSigner>>,
    /// How to speak https to the proxies: the cluster CA and this node's certificate
    /// when the node has TLS, the system's roots otherwise.
    pub tls: ClientTls,
    pub leadership: watch::Receiver<Leadership>,
    pub commands: Commands,
    pub metrics: NodeMetrics,
    /// The status page's announce board and the audit log, told each attempt's outcome.
    pub observer: Arc<Observer>,
    pub shutdown: CancellationToken,
}

/// The announcer's https settings: with node TLS, trust the cluster CA and present this
/// node's own certificate (a proxy whose admin listener requires client certificates
/// from the cluster CA then knows the announce comes from a node); without, the system's
/// roots. A file the client cannot use is a configuration error naming `tls`.
pub(crate) fn client_tls(tls: Option<&NodeTls>) -> Result<ClientTls, ConfigError> {
    let Some(tls) = tls else {
        return Ok(ClientTls::new());
    };
    let bad = |e: ClientError| ConfigError::new("tls", format!("for announcements: {e}"));
    ClientTls::new()
        .trust_pem_file(&tls.ca)
        .and_then(|t| t.identity_pem_files(&tls.cert, &tls.key))
        .map_err(bad)
}

/// Runs the announcer for the current announce list, and a new one (the old one stopped)
/// each time the list changes: the election loop publishes the list it applied on
/// `lists`. Each announcer is `template` with the list's URLs, stopped by a child of
/// `shutdown`. No announcer runs while the list is empty.
pub(crate) fn follow(
    template: Announcer,
    mut lists: watch::Receiver<Vec<String>>,
    shutdown: CancellationToken,
    tasks: &mut JoinSet<()>,
    span: tracing::Span,
) {
    tasks.spawn(
        async move {
            loop {
                let urls = lists.borrow_and_update().clone();
                let stop = shutdown.child_token();
                let running = (!urls.is_empty()).then(|| {
                    let announcer = Announcer {
                        urls,
                        shutdown: stop.clone(),
                        ..template.clone()
                    };
                    tokio::spawn(run(announcer).in_current_span())
                });
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    changed = lists.changed() => {
                        if changed.is_ok() {
                            stop.cancel();
                            if let Some(task) = running {
                                // The announcer ends at its token; a panic there was logged.
                                let _ = task.await;
                            }
                            continue;
                        }
                    }
                }
                stop.cancel();
                if let Some(task) = running {
                    let _ = task.await;
                }
                return;
            }
        }
        .instrument(span),
    );
}

/// One proxy of the list: its entry as listed (the name the board and the audit log use)
/// and its admin client, or why there is none.
struct Target {
    entry: String,
    admin: Result<ProxyAdmin, String>,
}

/// The client of one list entry, or why the announcer cannot use it.
fn target(a: &Announcer, entry: &str) -> Target {
    let timeout = Duration::from_millis(ANNOUNCE_TIMEOUT_MS);
    let admin = parse_announce_entry(entry)
        .map_err(|e| e.to_string())
        .and_then(|parsed| ProxyAdmin::with_tls(&parsed.url, &a.tls).map_err(|e| e.to_string()))
        .map(|admin| {
            let admin = admin.timeout(timeout);
            match &a.bearer {
                Some(bearer) => admin.with_bearer(bearer),
                None => admin,
            }
        });
    if let Err(err) = &admin {
        warn!(proxy = %entry, cause = %err,
            "cannot announce to this proxy; the others are announced, tokens stay not announced");
    }
    Target {
        entry: entry.to_owned(),
        admin,
    }
}

/// The announcer task: waits for a token, announces it, repeats for the next one.
async fn run(a: Announcer) {
    // The entries were checked with the configuration or the API; one the client still
    // refuses (its TLS settings) is that proxy's error alone, reported for every token,
    // and never keeps the others from being announced.
    let targets: Vec<Target> = a.urls.iter().map(|entry| target(&a, entry)).collect();
    let mut rx = a.leadership.clone();
    loop {
        // Each branch future yields a plain value: a watch guard must not live across an await.
        let waited = tokio::select! {
            () = a.shutdown.cancelled() => return,
            w = async { rx.wait_for(|l| l.established.is_some() && !l.announced).await.map(|l| l.established) } => w,
        };
        let Ok(Some(token)) = waited else {
            return; // the loop stopped
        };
        let proof = a.signer.as_ref().map(|signer| signer.sign(token));
        let mut lost = rx.clone();
        let accepted = tokio::select! {
            () = a.shutdown.cancelled() => return,
            () = async { let _ = lost.wait_for(|l| l.established != Some(token)).await; } => {
                info!(token, "leadership lost before every proxy accepted the term");
                continue;
            }
            all = announce_all(&targets, &a, token, proof) => all,
        };
        if accepted {
            a.commands.announced(token).await;
        }
        // Announced (or refused somewhere): nothing more to do until the token changes.
        let stopped = tokio::select! {
            () = a.shutdown.cancelled() => true,
            s = async { rx.wait_for(|l| l.established != Some(token)).await.is_err() } => s,
        };
        if stopped {
            return;
        }
    }
}

/// Announces `token` to every proxy at once, each on its own task. True when all
/// accepted it.
async fn announce_all(
    targets: &[Target],
    a: &Announcer,
    token: u64,
    proof: Option<TokenProof>,
) -> bool {
    let proof = proof.map(|p| p.encode());
    let mut set = JoinSet::new();
    let mut all = true;
    for target in targets {
        let admin = match &target.admin {
            Ok(admin) => admin.clone(),
            Err(err) => {
                a.metrics.announce_failures.increment(1);
                a.observer
                    .announced(&target.entry, &a.scope, token, "refused", Some(err.clone()));
                all = false;
                continue;
            }
        };
        set.spawn(
            announce_one(
                admin,
                target.entry.clone(),
                a.scope.clone(),
                token,
                proof.clone(),
                a.metrics.clone(),
                Arc::clone(&a.observer),
            )
            .in_current_span(),
        );
    }
    while let Some(joined) = set.join_next().await {
        all &= joined.is_ok_and(|answer| answer == Answer::Accepted);
    }
    all
}

/// How one proxy answered an announcement, in the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// It fences the scope at the token now.
    Accepted,
    /// It holds a higher fence, `current` (not the retired one).
    Higher { current: u64 },
    /// It refused for good (retired, a 4xx, an unusable answer or entry).
    Refused,
}

/// Announces `token` to one proxy until it is accepted or refused.
async fn announce_one(
    admin: ProxyAdmin,
    url: String,
    scope: String,
    token: u64,
    proof: Option<String>,
    metrics: NodeMetrics,
    observer: Arc<Observer>,
) -> Answer {
    let mut delays = backoff::delays(
        Duration::from_millis(ANNOUNCE_BACKOFF_MIN_MS),
        Duration::from_millis(ANNOUNCE_BACKOFF_MAX_MS),
    );
    loop {
        let err = match admin
            .advance_with_proof(&scope, token, proof.as_deref())
            .await
        {
            Ok(answer) => {
                info!(url = %admin.url(), token, advanced = answer.advanced, "proxy accepted the token");
                observer.announced(&url, &scope, token, "accepted", None);
                return Answer::Accepted;
            }
            Err(err) => err,
        };
        metrics.announce_failures.increment(1);
        match &err {
            ClientError::Fenced { current, .. } if *current == RETIRED_FENCE => {
                let detail = format!(
                    "{err}: the proxy was retired when it left an announce list; an \
                     operator must reset its fence before it is announced to again"
                );
                warn!(url = %admin.url(), token, cause = %detail, "proxy is retired; not announced");
                observer.announced(&url, &scope, token, "refused", Some(detail));
                return Answer::Refused;
            }
            ClientError::Fenced { current, .. } => {
                warn!(
                    url = %admin.url(), token, current, cause = %err,
                    "proxy holds a higher fence than this token; not announced"
                );
                observer.announced(&url, &scope, token, "refused", Some(err.to_string()));
                return Answer::Higher { current: *current };
            }
            // Asking again cannot change these answers: the proxy refused the request
            // (a 4xx), or its answer is not an advance response.
            ClientError::Status { status, .. } if status.is_client_error() => {
                let higher = *status == StatusCode::CONFLICT;
                warn!(url = %admin.url(), token, %status, higher_fence = higher, cause = %err,
                    "proxy refused the token; not announced");
                observer.announced(&url, &scope, token, "refused", Some(err.to_string()));
                return Answer::Refused;
            }
            ClientError::InvalidUrl { .. }
            | ClientError::InvalidRequest(_)
            | ClientError::InvalidResponse(_)
            | ClientError::Tls { .. } => {
                warn!(url = %admin.url(), token, cause = %err, "cannot announce to this proxy; not announced");
                observer.announced(&url, &scope, token, "refused", Some(err.to_string()));
                return Answer::Refused;
            }
            // No answer, a 5xx, a broken connection: the proxy may be restarting.
            _ => {}
        }
        let delay = delays
            .next()
            .unwrap_or(Duration::from_millis(ANNOUNCE_BACKOFF_MAX_MS));
        observer.announced(&url, &scope, token, "retrying", Some(err.to_string()));
        warn!(url = %admin.url(), token, cause = %err, retry_in_ms = delay.as_millis() as u64, "announcement failed");
        tokio::time::sleep(delay).await;
    }
}
