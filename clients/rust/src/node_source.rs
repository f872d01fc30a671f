//! [`NodeApiSource`]: a [`TokenSource`] that follows an election node's HTTP API with the
//! long poll, in a background task, and publishes through a `tokio::sync::watch`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use palisade_protocol::LeaderView;

use crate::backoff;
use crate::error::ClientError;
use crate::node::{NodeApi, is_establishing};
use crate::source::{BoxFuture, Leadership, TokenSource};
use crate::transport::ClientTls;

/// How long each long poll asks the node to wait for a change. A change is answered at
/// once; the wait bounds only how late a node that is paused or gone is noticed
/// (this plus [`LONG_POLL_SLACK_MS`](crate::LONG_POLL_SLACK_MS)).
pub const LONG_POLL_WAIT_MS: u64 = 2_000;
/// How long a long poll waits while the node leads but is not yet established, and how
/// often such a node is asked when it does not support the long poll. The node answers a
/// long poll as soon as its token appears, but compares with its view when the poll
/// arrives: a token that appeared between the previous answer and this poll's arrival is
/// no change to it, and is reported only when this wait ends. So the wait is short.
pub const ESTABLISH_POLL_MS: u64 = 20;
/// How often the node is asked when it does not support the long poll.
pub const PLAIN_POLL_MS: u64 = 200;
/// How long [`TokenSource::current`] waits for the node's first answer before reporting
/// "not leader": a node that answers at all answers well within this.
pub const FIRST_ANSWER_TIMEOUT_MS: u64 = 3_000;
/// First delay before asking an unreachable node again; doubles up to
/// [`RECONNECT_BACKOFF_MAX_MS`].
const RECONNECT_BACKOFF_INITIAL_MS: u64 = 50;
/// Longest delay (before jitter, which adds up to as much again) between two attempts to
/// reach an unreachable node, so that its return is noticed within about a second.
pub const RECONNECT_BACKOFF_MAX_MS: u64 = 500;

/// What the follower task knows, published through the watch channel.
#[derive(Debug, Clone)]
struct State {
    /// Whether the node has answered or failed at least once.
    settled: bool,
    /// The node's last answer while it is reachable; `None` before the first answer and
    /// while it is unreachable.
    view: Option<LeaderView>,
    /// Why the node is unreachable, while it is.
    unreachable: Option<String>,
    /// The last term the node reported, kept while it is unreachable.
    term: u64,
    /// The highest fence a proxy has reported. Invariant: only goes up.
    floor: u64,
    /// What clients see: derived from the fields above by [`State::recompute`].
    leadership: Leadership,
}

impl State {
    fn new() -> Self {
        Self {
            settled: false,
            view: None,
            unreachable: None,
            term: 0,
            floor: 0,
            leadership: Leadership::not_leader(0, None),
        }
    }

    /// Derives `leadership`; returns whether it changed.
    fn recompute(&mut self) -> bool {
        let next = match &self.view {
            Some(view) => Leadership::from(view).below_floor_removed(self.floor),
            None => Leadership::not_leader(self.term, None),
        };
        let changed = next != self.leadership;
        self.leadership = next;
        changed
    }

    fn observe(&mut self, view: LeaderView) -> bool {
        let newly_settled = !self.settled;
        self.settled = true;
        self.term = view.term;
        self.unreachable = None;
        self.view = Some(view);
        self.recompute() || newly_settled
    }

    fn lose(&mut self, reason: String) -> bool {
        let newly_settled = !self.settled;
        self.settled = true;
        self.view = None;
        self.unreachable = Some(reason);
        self.recompute() || newly_settled
    }
}

/// Follows one node's `GET /v1/leader` with the long poll. The node's established
/// leadership is this process's leadership: run one per worker, pointed at the node that
/// the worker runs beside.
///
/// A node that does not answer (refused, paused, too slow) counts as "not leader" at
/// once: a worker must not go on writing on the strength of an answer it can no longer
/// renew. The proxy's fence stays the safety net for the time between the node losing
/// its leadership and this source hearing of it.
///
/// The background task stops when the source is dropped.
pub struct NodeApiSource {
    api: NodeApi,
    state: Arc<watch::Sender<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for NodeApiSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeApiSource")
            .field("node", &self.api.url())
            .field("leadership", &self.state.borrow().leadership)
            .finish_non_exhaustive()
    }
}

impl Drop for NodeApiSource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NodeApiSource {
    /// Starts following the node API at `node_url` (`http://host:port`) with long polls
    /// of [`LONG_POLL_WAIT_MS`]. Needs a tokio runtime.
    pub fn start(node_url: &str) -> Result<Self, ClientError> {
        Self::start_with_wait(node_url, Duration::from_millis(LONG_POLL_WAIT_MS))
    }

    /// Like [`start`](Self::start), with long polls of `wait`.
    pub fn start_with_wait(node_url: &str, wait: Duration) -> Result<Self, ClientError> {
        Self::start_with(NodeApi::new(node_url)?, wait)
    }

    /// Like [`start`](Self::start), with TLS settings for an `https://` node URL.
    pub fn start_with_tls(node_url: &str, tls: &ClientTls) -> Result<Self, ClientError> {
        Self::start_with(
            NodeApi::with_tls(node_url, tls)?,
            Duration::from_millis(LONG_POLL_WAIT_MS),
        )
    }

    /// Follows the node `api` talks to, with long polls of `wait`.
    pub fn start_with(api: NodeApi, wait: Duration) -> Result<Self, ClientError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            ClientError::NoRuntime(format!("NodeApiSource::start needs a tokio runtime: {e}"))
        })?;
        let (tx, _) = watch::channel(State::new());
        let state = Arc::new(tx);
        let task = runtime.spawn(follow(api.clone(), Arc::clone(&state), wait));
        Ok(Self { api, state, task })
    }

    /// The node's last answer, while it is reachable.
    pub fn last_answer(&self) -> Option<LeaderView> {
        self.state.borrow().view.clone()
    }

    /// Why the node is unreachable, while it is.
    pub fn unreachable(&self) -> Option<String> {
        self.state.borrow().unreachable.clone()
    }

    /// Resolves when the leadership this source reports changes; returns the new one.
    pub async fn changed(&self) -> Leadership {
        let mut rx = self.state.subscribe();
        let before = rx.borrow_and_update().leadership.clone();
        loop {
            if rx.changed().await.is_err() {
                // The sender lives in `self`, so this cannot happen while we are borrowed.
                return before;
            }
            let now = rx.borrow_and_update().leadership.clone();
            if now != before {
                return now;
            }
        }
    }
}

impl TokenSource for NodeApiSource {
    fn current(&self) -> BoxFuture<'_, Leadership> {
        Box::pin(async move {
            let mut rx = self.state.subscribe();
            // Before the first answer the source knows nothing; wait a little for it rather
            // than refusing the first write of every fresh worker.
            let _ = tokio::time::timeout(
                Duration::from_millis(FIRST_ANSWER_TIMEOUT_MS),
                rx.wait_for(|s| s.settled),
            )
            .await;
            rx.borrow().leadership.clone()
        })
    }

    fn mark_not_leader(&self, current: u64) {
        self.state.send_if_modified(|s| {
            s.floor = s.floor.max(current);
            s.recompute()
        });
        tracing::info!(
            node = %self.api.url(),
            current,
            "marked not leader: a proxy fenced out tokens below {current}"
        );
    }

    fn wait_for_leader(&self) -> BoxFuture<'_, Leadership> {
        Box::pin(async move {
            let mut rx = self.state.subscribe();
            let found = rx
                .wait_for(|s| s.leadership.write_token().is_some())
                .await
                .map(|state| state.leadership.clone());
            match found {
                Ok(leadership) => leadership,
                // The sender lives in `self`, so the channel cannot close while we are
                // borrowed; should it, fall back to polling.
                Err(_) => loop {
                    let leadership = self.state.borrow().leadership.clone();
                    if leadership.write_token().is_some() {
                        return leadership;
                    }
                    tokio::time::sleep(Duration::from_millis(crate::source::LEADER_POLL_MS)).await;
                },
            }
        })
    }
}

/// The follower task: ask, publish, ask again after the term (long poll), forever.
async fn follow(api: NodeApi, state: Arc<watch::Sender<State>>, wait: Duration) {
    let mut after_term: Option<u64> = None;
    let mut long_poll = true;
    let mut failures: u32 = 0;
    let reconnect = || {
        backoff::delays(
            Duration::from_millis(RECONNECT_BACKOFF_INITIAL_MS),
            Duration::from_millis(RECONNECT_BACKOFF_MAX_MS),
        )
    };
    let mut delays = reconnect();
    // The node leads but has no token yet: the next long poll is a short one.
    let mut establishing = false;
    loop {
        let result = match after_term {
            Some(term) if long_poll => {
                let wait = if establishing {
                    Duration::from_millis(ESTABLISH_POLL_MS)
                } else {
                    wait
                };
                api.leader_after(term, wait).await
            }
            _ => api.leader().await,
        };
        match result {
            Ok(view) => {
                if failures > 0 {
                    tracing::info!(node = %api.url(), term = view.term, "node reachable again");
                }
                failures = 0;
                delays = reconnect();
                establishing = is_establishing(&view);
                let term = view.term;
                state.send_if_modified(|s| s.observe(view));
                after_term = Some(term);
                if establishing && !long_poll {
                    tokio::time::sleep(Duration::from_millis(ESTABLISH_POLL_MS)).await;
                } else if !long_poll {
                    tokio::time::sleep(Duration::from_millis(PLAIN_POLL_MS)).await;
                }
            }
            Err(ClientError::Status { status, detail, .. })
                if long_poll && after_term.is_some() && status.is_client_error() =>
            {
                // The node answers, but not to the long poll: follow it with plain polls.
                tracing::warn!(node = %api.url(), %status, detail,
                    "node rejected the long poll; polling every {PLAIN_POLL_MS} ms instead");
                long_poll = false;
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(node = %api.url(), cause = %e,
                        "node unreachable: not leader until it answers");
                }
                after_term = None;
                state.send_if_modified(|s| s.lose(e.to_string()));
                let delay = delays
                    .next()
                    .unwrap_or(Duration::from_millis(RECONNECT_BACKOFF_MAX_MS));
                tokio::time::sleep(delay).await;
            }
        }
    }
}
