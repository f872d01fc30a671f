//! [`Session`]: a named-leadership session on a cluster, kept alive in the background,
//! and the one rule that says how long its holder may trust it.
//!
//! # The loss rule
//!
//! The leader expires a session no earlier than its TTL after it *received* the last
//! keepalive. The client cannot know when that was, only when it *sent* that keepalive,
//! which was earlier; and the two clocks may run at rates that differ by up to
//! `drift_ppm`. So the session is trusted until
//! [`session_trusted_until`]`(sent, ttl, drift_ppm)`, where `sent` is when the last
//! keepalive the leader *answered* (or the open) was sent. Past that instant, or as soon
//! as a node answers 404 `unknown-session`, the session is lost for good: a keepalive
//! answered later does not bring it back, and whatever it held may be someone else's.
//!
//! ```text
//! open ──> keepalive every ttl/3 ──> leader ──> answered: trust until sent + ttl·(1 - drift)
//!              │   ▲                     │
//!              │   └── 503 not-leader ───┘ (ask the node it names)
//!              └── no answer past the trust, or 404 ──> lost (watch: `lost()` resolves)
//! ```

use std::sync::Arc;
use std::time::Duration;

use palisade_protocol::problem::kind::{CAMPAIGN_TIMEOUT, FENCE_PENDING};
use palisade_protocol::scopes::{
    Grant, Resigned, SESSION_TTL_MS_DEFAULT, ScopeView, SessionRevoked, session_trusted_until,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use crate::backoff;
use crate::error::ClientError;
use crate::node::{LONG_POLL_SLACK_MS, NODE_REQUEST_TIMEOUT_MS, valid_session_id};
use crate::transport::{ClientTls, millis};

mod nodes;

use nodes::Nodes;

/// Keepalives sent per TTL: one every third of it, so that two may fail (a lost packet,
/// a leader moving) before the session's trust runs out.
pub const KEEPALIVES_PER_TTL: u32 = 3;
/// The clock-rate drift bound, in parts per million, that the fleet assumes between a
/// client and the leader (1%): far above what quartz clocks drift (tens of ppm) and what
/// NTP slews (500 ppm at most), so that only a broken clock breaks it.
pub const DRIFT_PPM_DEFAULT: u64 = 10_000;
/// One whole in parts per million: a drift bound at or above it leaves no trust at all.
const PPM_WHOLE: u64 = 1_000_000;
/// Most node URLs a session takes: a cluster has a handful of voters; a longer list is a
/// mistake, and each URL costs a client.
pub const SESSION_NODES_MAX: usize = 64;
/// How long [`SessionBuilder::open`] tries the nodes before giving up: long enough for an
/// election (a few election timeouts) to end.
pub const SESSION_OPEN_TIMEOUT_MS: u64 = 10_000;
/// How long a resignation or a revocation tries the nodes before giving up: as long as
/// opening, for the same reason.
pub const SESSION_CALL_TIMEOUT_MS: u64 = SESSION_OPEN_TIMEOUT_MS;
/// First pause after every node failed a call (or between two campaigns that found the
/// scope held but not yet fenced everywhere).
pub const SESSION_RETRY_MIN_MS: u64 = 50;
/// Longest pause (before jitter) between two rounds of the nodes: a new leader is found
/// within about this long of its election.
pub const SESSION_RETRY_MAX_MS: u64 = 500;

/// Why a session was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionLoss {
    /// No keepalive was answered before the trust given by the last answered one (or by
    /// the open) ran out. The leader may have expired the session by now.
    Expired {
        /// The session's TTL.
        ttl_ms: u64,
        /// The drift bound its trust allowed for.
        drift_ppm: u64,
        /// What the last failed keepalive reported, if one failed.
        last_error: Option<String>,
    },
    /// A node answered 404 `unknown-session`: the leader expired or revoked it.
    Unknown,
}

impl std::fmt::Display for SessionLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Expired {
                ttl_ms,
                drift_ppm,
                last_error,
            } => {
                write!(
                    f,
                    "no keepalive answered within its trust ({ttl_ms} ms TTL less {drift_ppm} ppm drift, counted from the last answered one's send)"
                )?;
                match last_error {
                    Some(error) => write!(f, "; last error: {error}"),
                    None => Ok(()),
                }
            }
            Self::Unknown => write!(
                f,
                "the cluster no longer knows the session (404 unknown-session): it expired or was revoked"
            ),
        }
    }
}

/// What the session's holder may rely on; the keepalive task and the callers share it
/// through a `watch`.
#[derive(Debug, Clone)]
struct Trust {
    /// The session is trusted strictly before this instant. It only moves forward, and
    /// never once the session is lost.
    until: Instant,
    /// Set once, when lost; never cleared.
    loss: Option<SessionLoss>,
}

/// Options of a [`Session`]; [`open`](Self::open) opens it.
#[derive(Debug)]
pub struct SessionBuilder {
    urls: Vec<String>,
    tls: ClientTls,
    ttl: Duration,
    drift_ppm: u64,
}

impl SessionBuilder {
    /// TLS settings for `https://` node URLs (the same as [`NodeApi::with_tls`](crate::NodeApi::with_tls)).
    #[must_use]
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = tls;
        self
    }

    /// The TTL to ask for (default `SESSION_TTL_MS_DEFAULT`, 10 s).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The clock-rate drift bound in parts per million (default [`DRIFT_PPM_DEFAULT`]);
    /// below 1,000,000 (a whole).
    #[must_use]
    pub fn drift_ppm(mut self, drift_ppm: u64) -> Self {
        self.drift_ppm = drift_ppm;
        self
    }

    /// Finds the leader among the nodes, opens the session there (following `not-leader`
    /// answers, trying the nodes for up to [`SESSION_OPEN_TIMEOUT_MS`]), and starts its
    /// keepalives. A call whose answer was lost may leave an unused session behind; the
    /// leader expires it after its TTL.
    #[tracing::instrument(skip(self), fields(nodes = self.urls.len()))]
    pub async fn open(self) -> Result<Session, ClientError> {
        if self.urls.is_empty() || self.urls.len() > SESSION_NODES_MAX {
            return Err(ClientError::InvalidRequest(format!(
                "a session needs 1 to {SESSION_NODES_MAX} node URLs, not {}",
                self.urls.len()
            )));
        }
        if self.drift_ppm >= PPM_WHOLE {
            return Err(ClientError::InvalidRequest(format!(
                "drift bound {} ppm leaves no trust at all: it must be below {PPM_WHOLE}",
                self.drift_ppm
            )));
        }
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| ClientError::NoRuntime(e.to_string()))?;
        // Each attempt is limited so that a keepalive to a paused node leaves time for
        // another before the trust runs out.
        let attempt =
            (self.ttl / KEEPALIVES_PER_TTL).min(Duration::from_millis(NODE_REQUEST_TIMEOUT_MS));
        let nodes = Nodes::new(&self.urls, &self.tls, attempt)?;
        nodes.locate().await;
        let ttl = self.ttl;
        let deadline = Instant::now() + Duration::from_millis(SESSION_OPEN_TIMEOUT_MS);
        let (sent, view) = nodes
            .call(deadline, |api| async move {
                let sent = Instant::now();
                api.open_session(ttl).await.map(|view| (sent, view))
            })
            .await?;
        if !valid_session_id(&view.id) {
            return Err(ClientError::InvalidResponse(format!(
                "the leader opened a session with id {:?}, which cannot be used in a path",
                view.id
            )));
        }
        // The node's TTL counts, but never more than was asked for.
        let ttl = ttl.min(Duration::from_millis(view.ttl_ms));
        let until = trusted_until(sent, ttl, self.drift_ppm);
        tracing::info!(session = %view.id, ttl_ms = millis(ttl), "session opened");
        let inner = Arc::new(Inner {
            id: view.id,
            ttl,
            drift_ppm: self.drift_ppm,
            nodes,
            trust: watch::Sender::new(Trust { until, loss: None }),
        });
        let keepalive = runtime.spawn(keep_alive(Arc::clone(&inner), sent));
        Ok(Session { inner, keepalive })
    }
}

/// A session on the cluster, kept alive by a background task every third of its TTL
/// (retrying on other nodes when the leader moves), until it is revoked, dropped, or
/// lost (see the module's loss rule). Whatever it holds is its holder's only while
/// [`is_lost`](Self::is_lost) is false.
pub struct Session {
    inner: Arc<Inner>,
    keepalive: JoinHandle<()>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.inner.id)
            .field("ttl", &self.inner.ttl)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

impl Session {
    /// A builder for a session on the cluster of the nodes at `urls` (any of its nodes;
    /// the leader is found among them).
    pub fn builder<I, S>(urls: I) -> SessionBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        SessionBuilder {
            urls: urls.into_iter().map(Into::into).collect(),
            tls: ClientTls::default(),
            ttl: Duration::from_millis(SESSION_TTL_MS_DEFAULT),
            drift_ppm: DRIFT_PPM_DEFAULT,
        }
    }

    /// The session's id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Its TTL (the one asked for, or the node's if shorter).
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The instant (on this process's monotonic clock) before which the session is
    /// trusted; it moves forward with each answered keepalive.
    pub fn trusted_until(&self) -> std::time::Instant {
        self.inner.trust.borrow().until.into_std()
    }

    /// Whether the session is lost: past [`trusted_until`](Self::trusted_until), or
    /// unknown to the cluster. Once true, true for good.
    pub fn is_lost(&self) -> bool {
        self.loss().is_some()
    }

    /// Why the session is lost, or `None` while it is trusted.
    pub fn loss(&self) -> Option<SessionLoss> {
        self.inner.loss()
    }

    /// Resolves once the session is lost, with why; at once if it is already.
    pub async fn lost(&self) -> SessionLoss {
        let mut trust = self.inner.trust.subscribe();
        loop {
            let until = {
                let now = trust.borrow_and_update();
                if let Some(loss) = &now.loss {
                    return loss.clone();
                }
                now.until
            };
            tokio::select! {
                changed = trust.changed() => {
                    // The sender lives in `self.inner`, so it cannot be gone; if it were,
                    // only the clock would be left to tell.
                    if changed.is_err() {
                        sleep_until(until).await;
                        return self.inner.loss().unwrap_or_else(|| self.inner.expired());
                    }
                }
                () = sleep_until(until) => {
                    if let Some(loss) = self.inner.loss() {
                        return loss;
                    }
                }
            }
        }
    }

    /// Campaigns for `scope` until the session holds it and every announce proxy fences
    /// it, waiting at most `timeout` while another session holds it. Follows
    /// `not-leader` answers and campaigns again after `fence-pending` within the
    /// timeout. Errors: [`ClientError::SessionLost`] as soon as the session is lost (the
    /// grant is worthless then, even if it arrives); the timeout passing first is
    /// [`ClientError::Status`] of kind `campaign-timeout`.
    #[tracing::instrument(skip(self), fields(session = %self.inner.id))]
    pub async fn campaign(&self, scope: &str, timeout: Duration) -> Result<Grant, ClientError> {
        let deadline = Instant::now() + timeout;
        let mut delays = retry_delays();
        loop {
            self.check_trusted()?;
            let attempt = self.inner.nodes.call(deadline, |api| {
                let id = self.inner.id.clone();
                let wait = deadline.saturating_duration_since(Instant::now());
                async move { api.campaign(scope, &id, wait).await }
            });
            let result = tokio::select! {
                loss = self.lost() => return Err(self.lost_error(&loss)),
                result = attempt => result,
            };
            match result {
                Ok(grant) => {
                    if grant.scope != scope || grant.session != self.inner.id {
                        return Err(ClientError::InvalidResponse(format!(
                            "campaign for scope {scope} by session {} answered a grant of scope {} to session {}",
                            self.inner.id, grant.scope, grant.session
                        )));
                    }
                    // A grant that arrives after the trust ran out is not one to act on.
                    self.check_trusted()?;
                    tracing::info!(scope, token = grant.token, "scope held");
                    return Ok(grant);
                }
                Err(e) if again_after(&e) && Instant::now() < deadline => {
                    tracing::debug!(scope, cause = %e, "campaigning again");
                    let pause = delays
                        .next()
                        .unwrap_or(Duration::from_millis(SESSION_RETRY_MAX_MS));
                    sleep_until((Instant::now() + pause).min(deadline)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Gives `scope` up (or stops waiting for it). Idempotent: `released` is false when
    /// the session held nothing.
    #[tracing::instrument(skip(self), fields(session = %self.inner.id))]
    pub async fn resign(&self, scope: &str) -> Result<Resigned, ClientError> {
        let deadline = Instant::now() + Duration::from_millis(SESSION_CALL_TIMEOUT_MS);
        self.inner
            .nodes
            .call(deadline, |api| {
                let id = self.inner.id.clone();
                async move { api.resign_scope(scope, &id).await }
            })
            .await
    }

    /// Who holds `scope`: at once, or as a long poll that answers once its token is not
    /// `after_token` or `timeout` passed (see [`NodeApi::observe`](crate::NodeApi::observe)). Asks any node.
    pub async fn observe(
        &self,
        scope: &str,
        after_token: Option<u64>,
        timeout: Duration,
    ) -> Result<ScopeView, ClientError> {
        let deadline = Instant::now() + timeout + Duration::from_millis(LONG_POLL_SLACK_MS);
        self.inner
            .nodes
            .call(deadline, |api| async move {
                api.observe(scope, after_token, timeout).await
            })
            .await
    }

    /// Stops the keepalives and revokes the session, releasing what it holds.
    /// [`ClientError::UnknownSession`] means it was gone already.
    #[tracing::instrument(skip(self), fields(session = %self.inner.id))]
    pub async fn revoke(self) -> Result<SessionRevoked, ClientError> {
        self.keepalive.abort();
        let deadline = Instant::now() + Duration::from_millis(SESSION_CALL_TIMEOUT_MS);
        self.inner
            .nodes
            .call(deadline, |api| {
                let id = self.inner.id.clone();
                async move { api.revoke_session(&id).await }
            })
            .await
    }

    fn check_trusted(&self) -> Result<(), ClientError> {
        match self.loss() {
            Some(loss) => Err(self.lost_error(&loss)),
            None => Ok(()),
        }
    }

    fn lost_error(&self, loss: &SessionLoss) -> ClientError {
        ClientError::SessionLost {
            id: self.inner.id.clone(),
            cause: loss.to_string(),
        }
    }
}

/// What the session and its keepalive task share.
struct Inner {
    id: String,
    ttl: Duration,
    drift_ppm: u64,
    nodes: Nodes,
    trust: watch::Sender<Trust>,
}

impl Inner {
    /// Why the session is lost, recording expiry when its trust has run out.
    fn loss(&self) -> Option<SessionLoss> {
        let now = Instant::now();
        {
            let trust = self.trust.borrow();
            if trust.loss.is_some() || now < trust.until {
                return trust.loss.clone();
            }
        }
        self.trust.send_if_modified(|trust| {
            if trust.loss.is_none() && now >= trust.until {
                trust.loss = Some(self.expired());
                return true;
            }
            false
        });
        self.trust.borrow().loss.clone()
    }

    fn expired(&self) -> SessionLoss {
        SessionLoss::Expired {
            ttl_ms: millis(self.ttl),
            drift_ppm: self.drift_ppm,
            last_error: self.nodes.last_error(),
        }
    }

    /// Records a loss; the first cause stays.
    fn lose(&self, loss: SessionLoss) {
        self.trust.send_if_modified(|trust| {
            if trust.loss.is_some() {
                return false;
            }
            tracing::warn!(session = %self.id, cause = %loss, "session lost");
            trust.loss = Some(loss);
            true
        });
    }

    /// Records a keepalive sent at `sent` and answered with `ttl_ms`: the trust moves
    /// forward, unless it ran out before the answer came (then it is lost for good).
    fn answered(&self, sent: Instant, ttl_ms: u64) {
        let ttl = self.ttl.min(Duration::from_millis(ttl_ms));
        let until = trusted_until(sent, ttl, self.drift_ppm);
        if self.loss().is_some() {
            return;
        }
        self.trust.send_modify(|trust| {
            if trust.loss.is_none() {
                trust.until = trust.until.max(until);
            }
        });
    }

    fn failed(&self, error: &ClientError) {
        tracing::warn!(session = %self.id, cause = %error, "keepalive failed");
        self.nodes.note_error(error);
    }
}

/// [`session_trusted_until`] on tokio's clock (which tests may pause).
fn trusted_until(sent: Instant, ttl: Duration, drift_ppm: u64) -> Instant {
    Instant::from_std(session_trusted_until(sent.into_std(), ttl, drift_ppm))
}

/// The keepalive task: one keepalive every third of the TTL after the last answered
/// one's send, until the trust runs out or the cluster forgets the session.
async fn keep_alive(inner: Arc<Inner>, opened: Instant) {
    let period = inner.ttl / KEEPALIVES_PER_TTL;
    let mut next = opened + period;
    let mut delays = retry_delays();
    loop {
        let until = inner.trust.borrow().until;
        let (at, shared) = (next, &inner);
        let round = async move {
            sleep_until(at).await;
            shared
                .nodes
                .call(until, |api| {
                    let id = shared.id.clone();
                    async move {
                        let sent = Instant::now();
                        api.keepalive(&id).await.map(|view| (sent, view))
                    }
                })
                .await
        };
        // The trust's end wins over an answer that arrives at the same moment: an answer
        // cannot revive a session whose trust ran out (`answered` checks again).
        tokio::select! {
            biased;
            () = sleep_until(until) => {
                inner.lose(inner.expired());
                return;
            }
            result = round => match result {
                Ok((sent, view)) if view.id == inner.id => {
                    inner.answered(sent, view.ttl_ms);
                    next = sent + period;
                    delays = retry_delays();
                }
                Ok((_, view)) => inner.failed(&ClientError::InvalidResponse(format!(
                    "keepalive of session {} answered for session {}",
                    inner.id, view.id
                ))),
                Err(ClientError::UnknownSession { .. }) => {
                    inner.lose(SessionLoss::Unknown);
                    return;
                }
                Err(e) => {
                    inner.failed(&e);
                    let pause = delays
                        .next()
                        .unwrap_or(Duration::from_millis(SESSION_RETRY_MAX_MS));
                    next = Instant::now() + pause;
                }
            }
        }
        if inner.loss().is_some() {
            return;
        }
    }
}

fn retry_delays() -> impl Iterator<Item = Duration> + Send {
    backoff::delays(
        Duration::from_millis(SESSION_RETRY_MIN_MS),
        Duration::from_millis(SESSION_RETRY_MAX_MS),
    )
}

/// Whether a campaign should be sent again (within its timeout): held but not yet
/// fenced everywhere, or one request's capped wait passed before the caller's.
fn again_after(error: &ClientError) -> bool {
    matches!(error.problem_kind(), Some(FENCE_PENDING | CAMPAIGN_TIMEOUT))
}
