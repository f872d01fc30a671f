//! The election loop's side of named leaderships: proposing their entries for the API,
//! applying committed ones to the machine (and storing it), the leader's expiries, and
//! answering every waiting request, also when leadership is lost.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use raft::StateRole;
use tokio::sync::{oneshot, watch};
use tracing::{debug, info, warn};

use super::error::NodeError;
use super::ready::{ElectionLoop, blocking};
use crate::scopes::{Lessor, Machine, Op, Outcome, ScopeEntry};

/// Why a named-leaderships request got no outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ScopeCallError {
    /// This node is not the established leader; `leader_id` is the one it knows.
    #[error("this node is not the established leader")]
    NotLeader { leader_id: Option<u64> },
    /// raft refused the proposal.
    #[error("the proposal was refused: {0}")]
    Refused(String),
    /// Leadership moved before the entry was applied; it may or may not be applied later.
    #[error("leadership moved before the change was applied")]
    Lost,
    /// The node stopped.
    #[error("the node stopped")]
    Stopped,
}

/// Where the outcome of one proposed entry goes.
pub(crate) type ScopeReply = oneshot::Sender<Result<Outcome, ScopeCallError>>;

/// What the API reads of named leaderships.
#[derive(Clone)]
pub(crate) struct ScopesShared {
    /// The machine as last applied on this node.
    pub machine: watch::Receiver<Arc<Machine>>,
    /// The leader's deadlines (keepalives go straight here, not through the loop).
    pub lessor: Arc<Mutex<Lessor>>,
}

/// The loop's named-leaderships state.
pub(crate) struct ScopesLoop {
    pub(super) machine: Machine,
    pub(super) tx: watch::Sender<Arc<Machine>>,
    pub(super) lessor: Arc<Mutex<Lessor>>,
    /// Requests waiting for their entry, by request number. Ordered, so that failing them
    /// all wakes their callers in one order (the simulation replays it).
    pub(super) pending: BTreeMap<u64, ScopeReply>,
    /// Whether the machine changed since it was last stored.
    pub(super) dirty: bool,
    /// Outcomes applied in this batch, answered once the machine is stored and published
    /// (an API call answered earlier could read the machine without its own change).
    pub(super) answers: Vec<(ScopeReply, Outcome)>,
    /// This node's API base URL, recorded in the machine each time it takes office, so
    /// that followers can forward keepalives to it; `None` without an API.
    pub(crate) own_api: Option<String>,
}

impl ScopesLoop {
    /// The loop's state from the stored machine, and what the API reads.
    pub(crate) fn new(machine: Machine) -> (Self, ScopesShared) {
        let (tx, rx) = watch::channel(Arc::new(machine.clone()));
        let lessor = Arc::new(Mutex::new(Lessor::default()));
        let shared = ScopesShared {
            machine: rx,
            lessor: Arc::clone(&lessor),
        };
        let this = Self {
            machine,
            tx,
            lessor,
            pending: BTreeMap::new(),
            dirty: false,
            answers: Vec::new(),
            own_api: None,
        };
        (this, shared)
    }

    fn lessor(&self) -> std::sync::MutexGuard<'_, Lessor> {
        self.lessor.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ElectionLoop {
    /// The term this node leads in, established: only then may it propose and expire.
    fn established_term(&self) -> Option<u64> {
        let r = &self.raw_node.raft;
        self.established_at
            .map(|(term, _)| term)
            .filter(|term| *term == r.term && r.state == StateRole::Leader)
    }

    /// Proposes `op` for an API request; the outcome goes to `reply` once applied.
    pub(super) fn on_scope_request(&mut self, op: Op, reply: ScopeReply) {
        if self.established_term().is_none() {
            let _ = reply.send(Err(ScopeCallError::NotLeader {
                leader_id: self.leader_id(),
            }));
            return;
        }
        // Random, so that a request of a deposed leader whose entry commits later never
        // answers another node's request of the same number; in deterministic mode the
        // thread's counter, unique across the simulation's nodes.
        let req = loop {
            let req = crate::deterministic::next_id().unwrap_or_else(rand::random::<u64>);
            if req != 0 && !self.scopes.pending.contains_key(&req) {
                break req;
            }
        };
        let entry = ScopeEntry { req, op };
        match self.raw_node.propose(Vec::new(), entry.encode()) {
            Ok(()) => {
                self.scopes.pending.insert(req, reply);
            }
            Err(err) => {
                let _ = reply.send(Err(ScopeCallError::Refused(err.to_string())));
            }
        }
    }

    /// Applies one committed named-leaderships entry (already decoded).
    pub(super) fn apply_scope_entry(&mut self, index: u64, entry: Result<ScopeEntry, String>) {
        let entry = match entry {
            Ok(entry) => entry,
            Err(cause) => {
                warn!(node_id = self.id, index, %cause, "named-leaderships entry does not decode; skipped");
                return;
            }
        };
        let Some(outcome) = self.scopes.machine.apply(index, &entry.op) else {
            return; // applied before a restart
        };
        self.scopes.dirty = true;
        let now = tokio::time::Instant::now();
        match (&entry.op, &outcome) {
            (
                Op::Open {
                    session, ttl_ms, ..
                },
                Outcome::Opened,
            ) => {
                self.scopes.lessor().opened(session, *ttl_ms, now);
            }
            (Op::Revoke { session, expired }, Outcome::Revoked { released }) => {
                self.scopes.lessor().ended(session);
                info!(node_id = self.id, index, session = %session, expired, released = ?released, "session ended");
            }
            _ => {}
        }
        debug!(node_id = self.id, index, op = ?entry.op, ?outcome, "named-leaderships entry applied");
        if let Some(reply) = self.scopes.pending.remove(&entry.req) {
            self.scopes.answers.push((reply, outcome));
        }
    }

    /// After a batch of applied entries: stores the machine (fsynced), publishes it, and
    /// only then answers the requests whose entries the batch applied.
    pub(super) async fn store_scopes(&mut self) -> Result<(), NodeError> {
        if std::mem::take(&mut self.scopes.dirty) {
            let bytes = self.scopes.machine.encode();
            let log = self.log.clone();
            blocking(move || log.apply_scopes(&bytes)).await?;
            self.scopes
                .tx
                .send_replace(Arc::new(self.scopes.machine.clone()));
        }
        for (reply, outcome) in self.scopes.answers.drain(..) {
            let _ = reply.send(Ok(outcome));
        }
        Ok(())
    }

    /// After a snapshot was installed: its machine replaces this node's.
    pub(super) fn load_scopes_from_log(&mut self) {
        match Machine::decode(&self.log.scopes()) {
            Ok(machine) => {
                self.scopes.machine = machine;
                self.scopes
                    .tx
                    .send_replace(Arc::new(self.scopes.machine.clone()));
            }
            Err(cause) => {
                warn!(node_id = self.id, %cause, "snapshot's named-leaderships state does not decode; kept the old one");
            }
        }
    }

    /// Each tick: the leader keeps its deadlines and proposes the expiries due; a node
    /// that does not lead forgets its deadlines and answers every waiting request.
    pub(super) fn scopes_tick(&mut self) {
        let now = tokio::time::Instant::now();
        let Some(term) = self.established_term() else {
            self.scopes.lessor().follow();
            self.fail_scope_requests(&ScopeCallError::Lost);
            return;
        };
        let (new_term, due) = {
            let mut lessor = self.scopes.lessor();
            let new_term = lessor.lead(term, &self.scopes.machine, now);
            (new_term, lessor.due(now))
        };
        if let (true, Some(url)) = (new_term, self.scopes.own_api.clone()) {
            let entry = ScopeEntry {
                req: 0,
                op: Op::LeaderApi {
                    node_id: self.id,
                    term,
                    url,
                },
            };
            if let Err(err) = self.raw_node.propose(Vec::new(), entry.encode()) {
                warn!(node_id = self.id, cause = %err, "leader API URL not proposed; followers will not forward keepalives");
            }
        }
        for session in due {
            info!(node_id = self.id, term, session = %session, "session expired; proposing its end");
            let entry = ScopeEntry {
                req: 0,
                op: Op::Revoke {
                    session,
                    expired: true,
                },
            };
            if let Err(err) = self.raw_node.propose(Vec::new(), entry.encode()) {
                warn!(node_id = self.id, cause = %err, "expiry not proposed; tried again later");
            }
        }
    }

    /// Answers every waiting request with `err` (leadership lost, or the node stops).
    pub(super) fn fail_scope_requests(&mut self, err: &ScopeCallError) {
        for (_, reply) in std::mem::take(&mut self.scopes.pending) {
            let _ = reply.send(Err(err.clone()));
        }
    }
}
