//! The cluster's nodes as a [`Session`](super::Session) sees them: which one leads, and
//! a call that follows `not-leader` answers and moves on from nodes that do not answer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use http::StatusCode;
use palisade_protocol::problem::kind::FENCE_PENDING;
use palisade_protocol::{LeaderView, Role};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep};

use super::{SESSION_RETRY_MAX_MS, retry_delays};
use crate::error::ClientError;
use crate::node::NodeApi;
use crate::transport::ClientTls;

/// Whether an error means "this node cannot answer now; another may": no answer, a
/// node that does not lead, or one that is unavailable. Everything else is the answer.
fn try_another_node(error: &ClientError) -> bool {
    match error {
        ClientError::Unreachable { .. }
        | ClientError::Indeterminate { .. }
        | ClientError::NodeNotLeader { .. } => true,
        ClientError::Status { status, .. } => {
            matches!(
                *status,
                StatusCode::BAD_GATEWAY
                    | StatusCode::SERVICE_UNAVAILABLE
                    | StatusCode::GATEWAY_TIMEOUT
            ) && error.problem_kind() != Some(FENCE_PENDING)
        }
        _ => false,
    }
}

/// The cluster's nodes as a session sees them: one client each, the raft ids learnt
/// from their `GET /v1/leader`, and the one believed to lead.
pub(super) struct Nodes {
    apis: Vec<NodeApi>,
    /// The raft id of each node, once it said.
    ids: Mutex<Vec<Option<u64>>>,
    /// Index in `apis` of the node believed to lead.
    current: AtomicUsize,
    /// The last error of a call that found no node to answer (cleared by an answer), to
    /// say why a session was lost.
    last_error: Mutex<Option<String>>,
}

impl Nodes {
    pub(super) fn new(
        urls: &[String],
        tls: &ClientTls,
        attempt: Duration,
    ) -> Result<Self, ClientError> {
        let apis = urls
            .iter()
            .map(|url| NodeApi::with_tls(url, tls).map(|api| api.timeout(attempt)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            ids: Mutex::new(vec![None; apis.len()]),
            apis,
            current: AtomicUsize::new(0),
            last_error: Mutex::new(None),
        })
    }

    pub(super) fn note_error(&self, error: &ClientError) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(error.to_string());
    }

    pub(super) fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Asks every node's `GET /v1/leader` at once, learns their ids, and takes as
    /// current the node that says it leads in the highest term, else the leader the
    /// nodes name. Nodes that do not answer are skipped.
    pub(super) async fn locate(&self) {
        let mut asks = JoinSet::new();
        for (index, api) in self.apis.iter().enumerate() {
            let api = api.clone();
            asks.spawn(async move { (index, api.leader().await) });
        }
        let mut views: Vec<(usize, LeaderView)> = Vec::new();
        while let Some(joined) = asks.join_next().await {
            if let Ok((index, Ok(view))) = joined {
                self.learn(index, view.node_id);
                views.push((index, view));
            }
        }
        views.sort_by_key(|(_, view)| std::cmp::Reverse(view.term));
        let leading = views
            .iter()
            .find(|(_, view)| view.role == Role::Leader)
            .map(|(index, _)| *index);
        let named = views
            .iter()
            .filter_map(|(_, view)| view.leader_id.filter(|id| *id != 0))
            .find_map(|id| self.index_of(id));
        if let Some(index) = leading.or(named) {
            self.current.store(index, Ordering::Relaxed);
        }
    }

    fn learn(&self, index: usize, id: u64) {
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = ids.get_mut(index) {
            *slot = Some(id);
        }
    }

    fn index_of(&self, id: u64) -> Option<usize> {
        let ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        ids.iter().position(|known| *known == Some(id))
    }

    /// After `index` answered `not-leader` naming `leader_id`: the node with that id
    /// (asking the nodes for their ids if it is not known yet), else the next node.
    async fn follow(&self, index: usize, leader_id: Option<u64>) {
        if let Some(id) = leader_id {
            if self.index_of(id).is_none() {
                self.locate().await;
            }
            if let Some(found) = self.index_of(id) {
                tracing::debug!(leader_id = id, node = %self.apis[found].url(), "following the leader");
                self.current.store(found, Ordering::Relaxed);
                return;
            }
        }
        self.advance(index);
    }

    /// The next node after `index`, unless another call moved on already.
    fn advance(&self, index: usize) {
        let next = (index + 1) % self.apis.len();
        let _ = self
            .current
            .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Runs `op` on the node believed to lead, moving to another node on the errors
    /// [`try_another_node`] names (to the leader a `not-leader` answer names), pausing
    /// after each round of failures, until an answer or `deadline`; then the last error.
    pub(super) async fn call<T, F, Fut>(
        &self,
        deadline: Instant,
        mut op: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(NodeApi) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let mut delays = retry_delays();
        let mut failures = 0_usize;
        loop {
            let index = self.current.load(Ordering::Relaxed) % self.apis.len();
            let error = match op(self.apis[index].clone()).await {
                Ok(answer) => {
                    *self
                        .last_error
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = None;
                    return Ok(answer);
                }
                Err(e) if !try_another_node(&e) => return Err(e),
                Err(e) => e,
            };
            self.note_error(&error);
            tracing::debug!(node = %self.apis[index].url(), cause = %error, "trying another node");
            match &error {
                ClientError::NodeNotLeader { leader_id, .. } => {
                    self.follow(index, *leader_id).await;
                }
                _ => self.advance(index),
            }
            failures += 1;
            if failures.is_multiple_of(self.apis.len()) {
                let pause = delays
                    .next()
                    .unwrap_or(Duration::from_millis(SESSION_RETRY_MAX_MS));
                sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
            }
            if Instant::now() >= deadline {
                return Err(error);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use palisade_protocol::Problem;

    use super::*;

    fn answer(status: StatusCode, kind: &str) -> ClientError {
        ClientError::Status {
            status,
            detail: kind.to_owned(),
            problem: Some(Box::new(Problem::new(status, kind, kind))),
        }
    }

    /// Goal: a call moves to another node only when this one cannot answer (no answer, a
    /// follower, an unavailable node), never on an answer that is the leader's word
    /// (`fence-pending`, a refusal, too fast, an unknown session).
    /// Method: classify examples.
    #[test]
    fn only_unanswerable_calls_move_to_another_node() {
        let moving = [
            ClientError::NodeNotLeader {
                url: "u".into(),
                node_id: Some(1),
                leader_id: None,
            },
            ClientError::Unreachable {
                url: "u".into(),
                attempts: 1,
                reason: "refused".into(),
            },
            answer(StatusCode::SERVICE_UNAVAILABLE, "node-stopped"),
            answer(StatusCode::GATEWAY_TIMEOUT, "member-change-timeout"),
        ];
        for e in &moving {
            assert!(try_another_node(e), "{e}");
        }
        let staying = [
            answer(StatusCode::SERVICE_UNAVAILABLE, FENCE_PENDING),
            answer(StatusCode::TOO_MANY_REQUESTS, "keepalive-too-fast"),
            answer(StatusCode::CONFLICT, "campaign-timeout"),
            answer(StatusCode::FORBIDDEN, "session-owner"),
            ClientError::UnknownSession { id: "s".into() },
            ClientError::InvalidRequest("bad".into()),
        ];
        for e in &staying {
            assert!(!try_another_node(e), "{e}");
        }
    }
}
