//! The ways into a running election loop: [`NodeHandle`] for the embedding application,
//! and `Commands`, the cloneable sender the API and the announcer use.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use palisade_protocol::{MemberList, Transferred};

use super::error::{LeaseError, NodeError, TransferError};
use super::inbox::{LeaseReply, Msg};
use crate::leadership::{Leadership, Role};
use crate::members::{MEMBER_CHANGE_TIMEOUT_MS, MemberChange, MemberError};
use crate::metrics::NodeMetrics;

/// Time [`NodeHandle::shutdown`] waits for background tasks after the loop stopped.
pub const SHUTDOWN_TASKS_TIMEOUT_MS: u64 = 2_000;

/// A cloneable way to send requests into the loop.
#[derive(Clone)]
pub(crate) struct Commands {
    tx: mpsc::Sender<Msg>,
}

/// How long a membership change waits before it is proposed again, while a transfer
/// that had to come first settles on a new leader.
const MEMBER_RETRY_MS: u64 = 50;

/// How long the removal of a former leader, once proposed to the new leader, may go
/// unapplied before it is proposed again (within [`MEMBER_CHANGE_TIMEOUT_MS`] in all).
/// A follower's proposal is forwarded to the leader, which may drop it without telling
/// the follower: a leader elected a moment ago refuses a removal until it has heard from
/// a quorum of the voters that would remain, and it may not have heard from all of them
/// yet. Applying a removal takes a few heartbeats; this is several times that.
const MEMBER_REPROPOSE_MS: u64 = 1_000;

impl Commands {
    /// Commands into the loop that reads `tx`'s inbox.
    pub(crate) fn new(tx: mpsc::Sender<Msg>) -> Self {
        Self { tx }
    }

    pub(crate) async fn transfer(&self, to: Option<u64>) -> Result<Transferred, TransferError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Msg::Transfer { to, reply })
            .await
            .map_err(|_| TransferError::Stopped)?;
        answer.await.map_err(|_| TransferError::Stopped)?
    }

    /// Asks the loop for a lease: the term a quorum confirmed after this call; `urgent`:
    /// in a round started without gathering.
    pub(crate) async fn lease(&self, urgent: bool) -> Result<u64, LeaseError> {
        let (reply, answer) = oneshot::channel();
        let reply = LeaseReply::new(reply, urgent);
        self.tx
            .send(Msg::Lease { reply })
            .await
            .map_err(|_| LeaseError::Stopped)?;
        answer.await.map_err(|_| LeaseError::Stopped)?
    }

    pub(crate) async fn announced(&self, term: u64) {
        // Fails only when the loop stopped; then there is nothing to record.
        let _ = self.tx.send(Msg::Announced { term }).await;
    }

    /// Proposes a named-leaderships change and waits until it is applied on this node:
    /// its outcome, or why there is none.
    pub(crate) async fn scope(
        &self,
        op: crate::scopes::Op,
    ) -> Result<crate::scopes::Outcome, super::ScopeCallError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Msg::Scope { op, reply })
            .await
            .map_err(|_| super::ScopeCallError::Stopped)?;
        answer.await.map_err(|_| super::ScopeCallError::Stopped)?
    }

    /// Checks and proposes a membership change; `Ok` once raft took the proposal.
    pub(crate) async fn member_change(&self, change: MemberChange) -> Result<(), MemberError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Msg::Member { change, reply })
            .await
            .map_err(|_| MemberError::Stopped)?;
        answer.await.map_err(|_| MemberError::Stopped)?
    }

    /// Proposes `change` through the loop and waits (at most [`MEMBER_CHANGE_TIMEOUT_MS`])
    /// until this node (`own_id`, whose applied members `members` shows) applied it and
    /// left the joint configuration; answers the members then. A node asked to remove
    /// itself answers once it applied its removal: the entry that leaves the joint
    /// configuration may never reach it.
    pub(crate) async fn change_members(
        &self,
        members: &watch::Receiver<MemberList>,
        own_id: u64,
        change: MemberChange,
    ) -> Result<MemberList, MemberError> {
        let rx = members.clone();
        let removing_self = matches!(change, MemberChange::Remove { id, .. } if id == own_id);
        let done = |l: &MemberList| change.is_done(l) && (!l.joint || removing_self);
        match self.member_change(change.clone()).await {
            // Removing the leader (as etcd's `member remove` does): move leadership to
            // another voter first, then propose the removal to the new leader.
            Err(MemberError::IsLeader { id }) => {
                self.move_leadership_off(id, own_id).await?;
                return self.propose_until_applied(rx, &change, done).await;
            }
            other => other?,
        }
        wait_applied(rx, done).await
    }

    /// Proposes `change` to the new leader after a transfer, and again every
    /// [`MEMBER_REPROPOSE_MS`] while it is not applied (the new leader may have dropped
    /// it), until `done` holds or [`MEMBER_CHANGE_TIMEOUT_MS`] passed. A proposal made
    /// again is harmless: the leader checks it against the members as they are then, and
    /// raft takes one configuration change at a time.
    async fn propose_until_applied(
        &self,
        mut rx: watch::Receiver<MemberList>,
        change: &MemberChange,
        done: impl Fn(&MemberList) -> bool,
    ) -> Result<MemberList, MemberError> {
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(MEMBER_CHANGE_TIMEOUT_MS);
        loop {
            match self.propose_after_transfer(change, deadline).await {
                // Proposed; or a change is in progress, most likely this one's earlier
                // proposal: wait for it either way.
                Ok(()) | Err(MemberError::Pending) => {}
                Err(err) => {
                    // Refused because an earlier proposal was applied meanwhile: done.
                    let now = rx.borrow().clone();
                    return if done(&now) { Ok(now) } else { Err(err) };
                }
            }
            let window = (tokio::time::Instant::now() + Duration::from_millis(MEMBER_REPROPOSE_MS))
                .min(deadline);
            match tokio::time::timeout_at(window, rx.wait_for(&done)).await {
                Ok(Ok(list)) => return Ok(list.clone()),
                Ok(Err(_)) => return Err(MemberError::Stopped),
                Err(_) if tokio::time::Instant::now() < deadline => {
                    debug!(?change, "the change is not applied yet: proposing it again");
                }
                Err(_) => {
                    return Err(MemberError::TimedOut {
                        waited_ms: MEMBER_CHANGE_TIMEOUT_MS,
                    });
                }
            }
        }
    }

    /// Moves leadership off `leader` before its removal: a leader asked to remove itself
    /// hands over to the best other voter; a follower asks for leadership itself (it stays
    /// a voter, as it is not the one removed).
    async fn move_leadership_off(&self, leader: u64, own_id: u64) -> Result<(), MemberError> {
        let to = (leader != own_id).then_some(own_id);
        info!(
            node_id = own_id,
            leader, "removing the leader: moving leadership first"
        );
        self.transfer(to)
            .await
            .map(|_| ())
            .map_err(|err| MemberError::LeaderNotMoved {
                id: leader,
                cause: err.to_string(),
            })
    }

    /// Proposes `change` once a new leader (after a transfer) can take it: while no leader
    /// is known yet, or the old one still leads, the proposal is tried again every
    /// [`MEMBER_RETRY_MS`] until `deadline`.
    async fn propose_after_transfer(
        &self,
        change: &MemberChange,
        deadline: tokio::time::Instant,
    ) -> Result<(), MemberError> {
        loop {
            match self.member_change(change.clone()).await {
                Err(
                    MemberError::NoLeader
                    | MemberError::IsLeader { .. }
                    | MemberError::Refused { .. },
                ) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(MEMBER_RETRY_MS)).await;
                }
                other => return other,
            }
        }
    }

    /// Replaces the announce list `seen` with `proxies` (in normal form) through the loop
    /// and waits (at most [`MEMBER_CHANGE_TIMEOUT_MS`]) until this node applied it
    /// (`announce` shows the list the announcers follow). [`MemberError::Pending`] when
    /// the list is no longer `seen`, before or after the proposal: another change came
    /// first, and this one is refused on every node.
    pub(crate) async fn change_announce(
        &self,
        announce: &watch::Receiver<Vec<String>>,
        proxies: Vec<String>,
        seen: Vec<String>,
    ) -> Result<Vec<String>, MemberError> {
        let rx = announce.clone();
        let want = proxies.clone();
        let base = seen.clone();
        self.member_change(MemberChange::Announce { proxies, seen })
            .await?;
        let now = wait_applied(rx, |l| *l == want || *l != base).await?;
        if now == want {
            Ok(now)
        } else {
            Err(MemberError::Pending)
        }
    }

    /// Whether the loop is still running (it closes its inbox when it stops).
    pub(crate) fn is_running(&self) -> bool {
        !self.tx.is_closed()
    }
}

/// Waits (at most [`MEMBER_CHANGE_TIMEOUT_MS`]) until `rx` shows a value `done` accepts,
/// and answers that value.
async fn wait_applied<T: Clone>(
    mut rx: watch::Receiver<T>,
    done: impl FnMut(&T) -> bool,
) -> Result<T, MemberError> {
    let waited = tokio::time::timeout(
        Duration::from_millis(MEMBER_CHANGE_TIMEOUT_MS),
        rx.wait_for(done),
    )
    .await;
    match waited {
        Ok(Ok(value)) => Ok(value.clone()),
        Ok(Err(_)) => Err(MemberError::Stopped),
        Err(_) => Err(MemberError::TimedOut {
            waited_ms: MEMBER_CHANGE_TIMEOUT_MS,
        }),
    }
}

/// A running node. Dropping it does not stop the node; call [`NodeHandle::shutdown`] or
/// [`NodeHandle::stop`].
pub struct NodeHandle {
    pub(crate) id: u64,
    pub(crate) scope: String,
    pub(crate) leadership: watch::Receiver<Leadership>,
    pub(crate) commands: Commands,
    pub(crate) shutdown: CancellationToken,
    pub(crate) main: Option<tokio::task::JoinHandle<Result<(), NodeError>>>,
    pub(crate) outcome: Option<Result<(), NodeError>>,
    pub(crate) tasks: JoinSet<()>,
    pub(crate) api_addr: Option<SocketAddr>,
    pub(crate) peer_addr: Option<SocketAddr>,
    pub(crate) metrics: NodeMetrics,
    pub(crate) members: watch::Receiver<MemberList>,
    pub(crate) scopes: super::ScopesService,
}

impl std::fmt::Debug for NodeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHandle")
            .field("id", &self.id)
            .field("scope", &self.scope)
            .field("leadership", &*self.leadership.borrow())
            .field("api_addr", &self.api_addr)
            .field("peer_addr", &self.peer_addr)
            .finish_non_exhaustive()
    }
}

impl NodeHandle {
    /// This node's raft id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The fencing scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// A watch of this node's leadership; it changes after every election-loop cycle that
    /// changes it. When the node stops, it shows no token.
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    /// The address the HTTP API listens on, when it was configured.
    pub fn api_addr(&self) -> Option<SocketAddr> {
        self.api_addr
    }

    /// The address the peer listener is bound to (TCP transport only).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer_addr
    }

    /// A watch of the cluster's members as this node applied them (`GET /v1/members`
    /// answers the same); it changes after each membership change or installed snapshot.
    pub fn members(&self) -> watch::Receiver<MemberList> {
        self.members.clone()
    }

    /// Named leaderships on this node, in process: open and keep alive sessions, campaign
    /// for and resign scopes, read who holds one; the same service the node API's
    /// `/v1/sessions` and `/v1/scopes` routes call (see [`super::ScopesService`]).
    pub fn scopes(&self) -> super::ScopesService {
        self.scopes.clone()
    }

    /// Adds member `id` at peer address `peer` (`HOST:PORT`) as a learner, and waits until
    /// this node applied it (at most [`crate::MEMBER_CHANGE_TIMEOUT_MS`]). On a follower
    /// the proposal goes to the leader. The leader promotes the learner to voter once it
    /// has caught up.
    pub async fn add_member(&self, id: u64, peer: String) -> Result<MemberList, MemberError> {
        let change = MemberChange::Add { id, peer };
        self.commands
            .change_members(&self.members, self.id, change)
            .await
    }

    /// Removes member `id` (the leader too: leadership moves to another voter first), and waits like
    /// [`NodeHandle::add_member`]. The id is never accepted again. Refused below
    /// [`crate::VOTERS_SAFE_MIN`] voters (see [`NodeHandle::remove_member_forced`]) and
    /// when the voters left would have no reachable quorum.
    pub async fn remove_member(&self, id: u64) -> Result<MemberList, MemberError> {
        self.remove_member_with(id, false).await
    }

    /// [`NodeHandle::remove_member`], even when fewer than [`crate::VOTERS_SAFE_MIN`]
    /// voters remain (never without a reachable quorum).
    pub async fn remove_member_forced(&self, id: u64) -> Result<MemberList, MemberError> {
        self.remove_member_with(id, true).await
    }

    async fn remove_member_with(&self, id: u64, force: bool) -> Result<MemberList, MemberError> {
        let change = MemberChange::Remove { id, force };
        self.commands
            .change_members(&self.members, self.id, change)
            .await
    }

    /// The node's metrics in Prometheus text format.
    pub fn metrics_text(&self) -> String {
        self.metrics.render()
    }

    /// Transfers leadership to `to` and waits for the outcome. On a follower the request
    /// is forwarded to the known leader; `to` may be this node (asking for leadership).
    #[tracing::instrument(skip(self), fields(node_id = self.id))]
    pub async fn transfer(&self, to: u64) -> Result<Transferred, TransferError> {
        self.commands.transfer(Some(to)).await
    }

    /// Transfers leadership to the best other voter (the one with the highest match
    /// index). Only the leader can resign.
    #[tracing::instrument(skip(self), fields(node_id = self.id))]
    pub async fn resign(&self) -> Result<Transferred, TransferError> {
        self.commands.transfer(None).await
    }

    /// Resolves when the node stops on its own (a fatal storage error) or after a stop.
    pub async fn wait(&mut self) -> Result<(), NodeError> {
        if let Some(main) = self.main.as_mut() {
            let outcome = match main.await {
                Ok(r) => r,
                Err(e) => Err(NodeError::Loop(e.to_string())),
            };
            self.main = None;
            self.outcome = Some(outcome);
        }
        self.outcome.clone().unwrap_or(Ok(()))
    }

    /// Stops gracefully: a leader first hands leadership to the best other voter (bounded
    /// by the transfer deadline; failure is logged, not fatal), then everything stops.
    #[tracing::instrument(skip(self), fields(node_id = self.id))]
    pub async fn shutdown(self) -> Result<(), NodeError> {
        if self.leadership.borrow().role == Role::Leader && self.commands.is_running() {
            match self.resign().await {
                Ok(t) => info!(
                    to = t.to,
                    term = t.term,
                    "handed leadership over before stopping"
                ),
                Err(err) => warn!(cause = %err, "could not hand leadership over before stopping"),
            }
        }
        self.stop().await
    }

    /// Stops at once: the loop, the transport, the announcer and the API. Pending requests
    /// are answered `Stopped`, and the leadership watch shows no token.
    pub async fn stop(mut self) -> Result<(), NodeError> {
        self.shutdown.cancel();
        let outcome = self.wait().await;
        debug!(node_id = self.id, "election loop stopped");
        let mut tasks = std::mem::take(&mut self.tasks);
        let joined = tokio::time::timeout(
            Duration::from_millis(SHUTDOWN_TASKS_TIMEOUT_MS),
            async move { while tasks.join_next().await.is_some() {} },
        )
        .await;
        if joined.is_ok() {
            debug!(node_id = self.id, "background tasks stopped");
        } else {
            warn!(
                node_id = self.id,
                timeout_ms = SHUTDOWN_TASKS_TIMEOUT_MS,
                "background tasks did not stop in time; aborted"
            );
        }
        outcome
    }
}
