//! Retiring a proxy that leaves the announce list: its fence for the scope is raised to
//! [`RETIRED_FENCE`] (`POST <url>/v1/fences/<scope>`, the announcer's advance, without a
//! proof), before the list without it is proposed.
//!
//! Why retire rather than raise it to the current token: once a proxy is off the list no
//! leader announces to it again, so whatever fence it keeps stays admissible forever. Left
//! at the current token `T`, the leader of `T`, deposed by the next election, would still
//! write through it. At [`RETIRED_FENCE`] the proxy refuses every token of the scope until
//! an operator resets its fence, so no token (old or current) reaches its storage
//! unannounced.
//!
//! The advance carries no proof on purpose: a proof of [`RETIRED_FENCE`] would be a
//! token above every term, admitted at every proxy holding the public key. A proxy that
//! checks proofs must therefore accept the admin bearer token (`--announce-token-file`)
//! for the retirement; a proxy without credentials accepts it as is.

use std::sync::Arc;
use std::time::Duration;

use palisade_client::{ClientError, ClientTls, ProxyAdmin, backoff};
use palisade_protocol::announce::{AnnounceEntry, RETIRED_FENCE};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{Instrument as _, info, warn};

use super::{ANNOUNCE_BACKOFF_MAX_MS, ANNOUNCE_BACKOFF_MIN_MS, ANNOUNCE_TIMEOUT_MS};
use crate::audit::Observer;

/// How long the retirement of one proxy may take, retries of answers that may change
/// (no answer, a 5xx) included. A `POST /v1/announce` that removes proxies retires them
/// at once, so this bounds what it adds to the request.
pub const RETIRE_TIMEOUT_MS: u64 = 5_000;

/// What retiring proxies needs: the scope, and how the announcer speaks to proxies. The
/// API holds one; it also serialises this node's announce list changes.
pub(crate) struct ProxyFences {
    scope: String,
    bearer: Option<String>,
    tls: ClientTls,
    observer: Arc<Observer>,
    /// Held by `POST /v1/announce` from reading the list to the answer, so that two
    /// changes asked of this node never retire against the same list.
    pub(crate) changes: tokio::sync::Mutex<()>,
}

impl ProxyFences {
    /// Retires proxies of `scope`, with the announcer's `bearer` and `tls`, reporting each
    /// outcome to `observer` (the status page's board and the audit log).
    pub(crate) fn new(
        scope: String,
        bearer: Option<String>,
        tls: ClientTls,
        observer: Arc<Observer>,
    ) -> Self {
        Self {
            scope,
            bearer,
            tls,
            observer,
            changes: tokio::sync::Mutex::new(()),
        }
    }

    /// One that speaks plaintext without credentials and reports to a fresh observer,
    /// for tests of the API that retire nothing.
    #[cfg(test)]
    pub(crate) fn plain(scope: &str) -> Arc<Self> {
        Arc::new(Self::new(
            scope.to_owned(),
            None,
            ClientTls::new(),
            Arc::new(Observer::new(0, &[], None)),
        ))
    }

    /// Retires every proxy of `entries` at once; answers each one's outcome, in order.
    pub(crate) async fn retire_all(
        self: &Arc<Self>,
        entries: &[AnnounceEntry],
    ) -> Vec<Result<(), String>> {
        let mut set = JoinSet::new();
        for (i, entry) in entries.iter().enumerate() {
            let fences = Arc::clone(self);
            let entry = entry.clone();
            set.spawn(async move { (i, fences.retire(&entry).await) }.in_current_span());
        }
        let mut outcomes = vec![Err("not attempted".to_owned()); entries.len()];
        while let Some(joined) = set.join_next().await {
            if let Ok((i, outcome)) = joined {
                outcomes[i] = outcome;
            }
        }
        outcomes
    }

    /// Raises `entry`'s fence to [`RETIRED_FENCE`], retrying answers that may change
    /// until [`RETIRE_TIMEOUT_MS`]; the error says why it is not retired.
    async fn retire(&self, entry: &AnnounceEntry) -> Result<(), String> {
        let name = entry.to_string();
        let outcome = self.advance(entry).await;
        match &outcome {
            Ok(()) => {
                info!(proxy = %name, scope = %self.scope, token = RETIRED_FENCE,
                    "proxy left the announce list: its fence is retired");
                self.observer
                    .announced(&name, &self.scope, RETIRED_FENCE, "retired", None);
            }
            Err(err) => {
                warn!(proxy = %name, scope = %self.scope, cause = %err,
                    "cannot retire the fence of a proxy leaving the announce list");
                self.observer.announced(
                    &name,
                    &self.scope,
                    RETIRED_FENCE,
                    "not retired",
                    Some(err.clone()),
                );
            }
        }
        outcome
    }

    async fn advance(&self, entry: &AnnounceEntry) -> Result<(), String> {
        let admin = ProxyAdmin::with_tls(&entry.url, &self.tls)
            .map_err(|e| e.to_string())?
            .timeout(Duration::from_millis(ANNOUNCE_TIMEOUT_MS));
        let admin = match &self.bearer {
            Some(bearer) => admin.with_bearer(bearer),
            None => admin,
        };
        let deadline = Instant::now() + Duration::from_millis(RETIRE_TIMEOUT_MS);
        let mut delays = backoff::delays(
            Duration::from_millis(ANNOUNCE_BACKOFF_MIN_MS),
            Duration::from_millis(ANNOUNCE_BACKOFF_MAX_MS),
        );
        loop {
            let Err(err) = admin.advance(&self.scope, RETIRED_FENCE).await else {
                return Ok(());
            };
            if !may_change(&err) {
                return Err(err.to_string());
            }
            let delay = delays
                .next()
                .unwrap_or(Duration::from_millis(ANNOUNCE_BACKOFF_MAX_MS));
            if Instant::now() + delay >= deadline {
                return Err(format!(
                    "{err} (still failing after {RETIRE_TIMEOUT_MS} ms)"
                ));
            }
            tokio::time::sleep(delay).await;
        }
    }
}

/// Whether asking again may change the answer: no answer, a broken connection or a 5xx
/// (a proxy restarting, or its barrier still waiting for writes in flight). A refusal
/// (a 4xx: no credential, a proof required) or a client that cannot speak to the URL
/// stays what it is.
fn may_change(err: &ClientError) -> bool {
    match err {
        ClientError::Status { status, .. } => !status.is_client_error(),
        ClientError::Fenced { .. }
        | ClientError::InvalidUrl { .. }
        | ClientError::InvalidRequest(_)
        | ClientError::InvalidResponse(_)
        | ClientError::Tls { .. } => false,
        _ => true,
    }
}
