//! Named leaderships in process: [`ScopesService`], what the HTTP routes (`crate::api`'s
//! `sessions` and `scopes`) and an embedding application (the simulation in `tests/sim`)
//! call to open, keep alive and revoke sessions and to campaign for and resign scopes.
//!
//! Everything that does not depend on HTTP is here, once: the TTL bounds, the leader
//! check, the session limit, proposing each change through the election loop
//! (`Commands::scope`), the keepalive's `ReadIndex` confirmation and the lessor's bump,
//! and the campaign's wait on the machine, the fenced grants and the leadership, with
//! its timeout. What is HTTP's stays in the routes: parsing, roles and the caller's
//! identity (passed here as the owner's name), forwarding a follower's keepalive to the
//! leader, long polls, and turning a [`ScopeError`] into a problem.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use palisade_protocol::Scope;
use palisade_protocol::scopes::{
    Grant, Resigned, ScopeView, SessionEntry, SessionRevoked, SessionView, ttl_in_bounds,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::handle::Commands;
use super::scope_error::ScopeError;
use super::scopes::ScopesShared;
use super::signer::TokenSigner;
use crate::leadership::Leadership;
use crate::metrics::NodeMetrics;
use crate::scopes::lessor::KeepaliveRefused;
use crate::scopes::limits::SESSIONS_MAX;
use crate::scopes::machine::SessionRecord;
use crate::scopes::{Fenced, Machine, Op, Outcome, Refusal, new_session_id};

/// The named leaderships of one node ([`crate::NodeHandle::scopes`]). Cheap to clone.
///
/// Changes (open, revoke, campaign, resign) are answered by the established leader once
/// the change is applied on this node; keepalives once a quorum confirmed, after the call,
/// that this node still leads. Another node answers [`ScopeError::NotLeader`] with the
/// leader it knows. Reads answer from what this node applied. A session opened with an
/// owner (a client certificate's name) may be used only by that owner.
#[derive(Clone)]
pub struct ScopesService {
    shared: ScopesShared,
    fenced: watch::Receiver<Fenced>,
    leadership: watch::Receiver<Leadership>,
    commands: Commands,
    signer: Option<Arc<TokenSigner>>,
    metrics: NodeMetrics,
    shutdown: CancellationToken,
    /// The cluster's own scope, which nobody campaigns for.
    cluster_scope: String,
    /// False with fleet leases: every call is [`ScopeError::Unavailable`].
    available: bool,
}

/// Who may keep a session alive.
#[derive(Clone, Copy)]
enum OwnerCheck<'a> {
    /// The session's owner only: this identity (`None`: none) must be it.
    Owner(Option<&'a str>),
    /// Anyone: a cluster node forwarding its client's keepalive (it checked the owner).
    Any,
}

/// Where a campaign stands.
enum Standing {
    /// Held and fenced at every proxy: the grant.
    Granted(u64),
    /// Held, not fenced everywhere yet.
    Pending,
    /// Waiting for the holder to let go.
    Waiting,
    /// The session is gone.
    Gone,
}

/// The parts [`ScopesService::new`] takes, from the node's start.
pub(crate) struct ScopesParts {
    pub shared: ScopesShared,
    pub fenced: watch::Receiver<Fenced>,
    pub leadership: watch::Receiver<Leadership>,
    pub commands: Commands,
    pub signer: Option<Arc<TokenSigner>>,
    pub metrics: NodeMetrics,
    pub shutdown: CancellationToken,
    pub cluster_scope: String,
    pub available: bool,
}

impl ScopesService {
    /// The service over a starting node's parts.
    pub(crate) fn new(parts: ScopesParts) -> Self {
        Self {
            shared: parts.shared,
            fenced: parts.fenced,
            leadership: parts.leadership,
            commands: parts.commands,
            signer: parts.signer,
            metrics: parts.metrics,
            shutdown: parts.shutdown,
            cluster_scope: parts.cluster_scope,
            available: parts.available,
        }
    }

    /// Whether this cluster grants named scopes (not with fleet leases).
    pub fn available(&self) -> bool {
        self.available
    }

    fn check_available(&self) -> Result<(), ScopeError> {
        if self.available {
            Ok(())
        } else {
            Err(ScopeError::Unavailable)
        }
    }

    /// The applied machine's watch (the routes' long polls).
    pub(crate) fn machine(&self) -> &watch::Receiver<Arc<Machine>> {
        &self.shared.machine
    }

    /// [`ScopeError::NotLeader`] unless this node is the established leader.
    fn require_leader(&self) -> Result<(), ScopeError> {
        let l = self.leadership.borrow();
        if l.established.is_some() {
            Ok(())
        } else {
            Err(ScopeError::NotLeader {
                leader_id: l.leader_id,
            })
        }
    }

    /// `scope` as a name one campaigns for: a valid scope other than the cluster's own.
    pub fn named_scope(&self, scope: &str) -> Result<String, ScopeError> {
        let scope = Scope::new(scope).map_err(|e| ScopeError::BadScope {
            cause: e.to_string(),
        })?;
        if scope.as_str() == self.cluster_scope {
            return Err(ScopeError::ClusterScope {
                scope: scope.as_str().to_owned(),
            });
        }
        Ok(scope.as_str().to_owned())
    }

    /// The session `id` as applied here, if `owner` may act with it (`None` for the
    /// owner: no identity, which may use only sessions opened without one).
    pub(crate) fn owned_session(
        machine: &Machine,
        id: &str,
        owner: Option<&str>,
    ) -> Result<SessionRecord, ScopeError> {
        let record = machine
            .sessions
            .get(id)
            .ok_or_else(|| ScopeError::UnknownSession {
                session: id.to_owned(),
            })?;
        match record.owner.as_deref() {
            Some(theirs) if Some(theirs) != owner => Err(ScopeError::SessionOwner {
                session: id.to_owned(),
                owner: theirs.to_owned(),
            }),
            _ => Ok(record.clone()),
        }
    }

    /// Checks [`Self::owned_session`] on the machine as applied now.
    fn check_owner(&self, id: &str, owner: Option<&str>) -> Result<SessionRecord, ScopeError> {
        let machine = self.shared.machine.borrow();
        Self::owned_session(&machine, id, owner)
    }

    /// Proposes `op` and waits for its outcome; a refusal is an error for `session`.
    async fn propose(&self, op: Op, session: &str) -> Result<Outcome, ScopeError> {
        match self.commands.scope(op).await? {
            Outcome::Refused(Refusal::UnknownSession) => Err(ScopeError::UnknownSession {
                session: session.to_owned(),
            }),
            Outcome::Refused(refusal) => Err(ScopeError::Refusal {
                refusal,
                session: session.to_owned(),
            }),
            outcome => Ok(outcome),
        }
    }

    /// Opens a session with a TTL of `ttl_ms`, owned by `owner` when given (then only
    /// that identity may use it). Answers its fresh id.
    pub async fn open(&self, ttl_ms: u64, owner: Option<&str>) -> Result<SessionView, ScopeError> {
        self.check_available()?;
        if !ttl_in_bounds(ttl_ms) {
            return Err(ScopeError::BadTtl { ttl_ms });
        }
        self.require_leader()?;
        if self.shared.machine.borrow().sessions.len() >= SESSIONS_MAX {
            return Err(ScopeError::Refusal {
                refusal: Refusal::TooManySessions,
                session: String::new(),
            });
        }
        let id = new_session_id();
        let op = Op::Open {
            session: id.clone(),
            ttl_ms,
            owner: owner.map(str::to_owned),
        };
        match self.propose(op, &id).await? {
            Outcome::Opened => Ok(SessionView { id, ttl_ms }),
            other => Err(unexpected(&other)),
        }
    }

    /// Keeps session `id` alive, for `owner`: answered once a quorum confirmed, after this
    /// call, that this node still leads (a leader deposed without knowing it must not
    /// extend a session its successor may expire). The client's trust runs from when it
    /// made the call (`palisade_protocol::scopes::session_trusted_until`).
    pub async fn keepalive(
        &self,
        id: &str,
        owner: Option<&str>,
    ) -> Result<SessionView, ScopeError> {
        self.keepalive_checked(id, OwnerCheck::Owner(owner)).await
    }

    /// [`Self::keepalive`] for a cluster node forwarding its client's keepalive (it
    /// checked the owner itself): any session.
    pub(crate) async fn keepalive_for_node(&self, id: &str) -> Result<SessionView, ScopeError> {
        self.keepalive_checked(id, OwnerCheck::Any).await
    }

    /// A keepalive, checking its owner as `owner` says.
    async fn keepalive_checked(
        &self,
        id: &str,
        owner: OwnerCheck<'_>,
    ) -> Result<SessionView, ScopeError> {
        self.check_available()?;
        self.require_leader()?;
        let record = match owner {
            OwnerCheck::Owner(owner) => self.check_owner(id, owner)?,
            OwnerCheck::Any => self
                .shared
                .machine
                .borrow()
                .sessions
                .get(id)
                .cloned()
                .ok_or_else(|| ScopeError::UnknownSession {
                    session: id.to_owned(),
                })?,
        };
        let now = tokio::time::Instant::now();
        // A quorum must confirm this node still leads, after the keepalive arrived, before
        // it is answered: a leader paused through an election (deposed without knowing it)
        // would otherwise extend a session its successor already expired, and the client
        // would trust it past the expiry (the named-leaderships model found this). The
        // confirmation shares the `ReadIndex` rounds of the fleet leases.
        let (established, leader_id) = {
            let l = self.leadership.borrow();
            (l.established, l.leader_id)
        };
        let not_leader = ScopeError::NotLeader { leader_id };
        let confirmed = self.commands.lease(false).await;
        if confirmed.ok().is_none_or(|term| Some(term) != established) {
            return Err(not_leader);
        }
        let answer = {
            let mut lessor = self
                .shared
                .lessor
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // Not leading yet: established a moment ago; the loop's next tick starts the
            // deadlines.
            lessor
                .leading()
                .then(|| lessor.keepalive(id, record.ttl_ms, now))
        };
        match answer {
            None => Err(not_leader),
            Some(Ok(())) => {
                self.metrics.session_keepalives.increment(1);
                Ok(SessionView {
                    id: id.to_owned(),
                    ttl_ms: record.ttl_ms,
                })
            }
            Some(Err(KeepaliveRefused::Unknown)) => Err(ScopeError::UnknownSession {
                session: id.to_owned(),
            }),
            Some(Err(KeepaliveRefused::TooFast)) => Err(ScopeError::KeepaliveTooFast {
                session: id.to_owned(),
            }),
        }
    }

    /// Ends session `id`, for `owner`: the scopes it held pass to their next waiters.
    pub async fn revoke(
        &self,
        id: &str,
        owner: Option<&str>,
    ) -> Result<SessionRevoked, ScopeError> {
        self.check_available()?;
        self.require_leader()?;
        self.check_owner(id, owner)?;
        let op = Op::Revoke {
            session: id.to_owned(),
            expired: false,
        };
        match self.propose(op, id).await? {
            Outcome::Revoked { released } => Ok(SessionRevoked {
                id: id.to_owned(),
                released,
            }),
            other => Err(unexpected(&other)),
        }
    }

    /// Every live session as applied here (`expires_in_ms` only on the leader).
    pub fn sessions(&self) -> Result<Vec<SessionEntry>, ScopeError> {
        self.check_available()?;
        let machine = Arc::clone(&self.shared.machine.borrow());
        let now = tokio::time::Instant::now();
        let lessor = self
            .shared
            .lessor
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(machine
            .sessions
            .iter()
            .map(|(id, s)| SessionEntry {
                id: id.clone(),
                ttl_ms: s.ttl_ms,
                owner: s.owner.clone(),
                holds: s.holds.iter().cloned().collect(),
                waits: s.waits.iter().cloned().collect(),
                expires_in_ms: lessor.remaining_ms(id, now),
            })
            .collect())
    }

    fn standing(&self, scope: &str, session: &str) -> Standing {
        let machine = self.shared.machine.borrow();
        if !machine.sessions.contains_key(session) {
            return Standing::Gone;
        }
        match machine.holder(scope) {
            Some(h) if h.session == session => {
                if self.fenced.borrow().get(scope) == Some(&h.token) {
                    Standing::Granted(h.token)
                } else {
                    Standing::Pending
                }
            }
            _ => Standing::Waiting,
        }
    }

    fn proof(&self, scope: &str, token: u64) -> Option<String> {
        self.signer
            .as_ref()
            .map(|s| s.sign_scope(scope, token).encode())
    }

    /// Campaigns for `scope` with session `session`, for `owner`: answers the grant once
    /// the session holds the scope **and** every announce proxy fences the scope at its
    /// token; a session that holds it already gets the same grant again. When `timeout`
    /// passes first: still waiting, the session stops waiting (a resign is proposed) and
    /// the answer is [`ScopeError::CampaignTimeout`]; holding but not fenced everywhere,
    /// [`ScopeError::FencePending`] (it keeps the scope).
    pub async fn campaign(
        &self,
        scope: &str,
        session: &str,
        owner: Option<&str>,
        timeout: Duration,
    ) -> Result<Grant, ScopeError> {
        self.check_available()?;
        let scope = self.named_scope(scope)?;
        self.require_leader()?;
        self.check_owner(session, owner)?;
        let deadline = tokio::time::Instant::now() + timeout;
        if matches!(self.standing(&scope, session), Standing::Waiting) {
            let op = Op::Campaign {
                session: session.to_owned(),
                scope: scope.clone(),
            };
            match self.propose(op, session).await? {
                Outcome::Holding { .. } | Outcome::Waiting => {}
                other => return Err(unexpected(&other)),
            }
        }
        let mut machine = self.shared.machine.clone();
        let mut fenced = self.fenced.clone();
        let mut leadership = self.leadership.clone();
        loop {
            machine.mark_unchanged();
            fenced.mark_unchanged();
            let expired = tokio::time::Instant::now() >= deadline;
            match self.standing(&scope, session) {
                Standing::Granted(token) => {
                    return Ok(Grant {
                        proof: self.proof(&scope, token),
                        scope,
                        token,
                        session: session.to_owned(),
                    });
                }
                Standing::Gone => {
                    return Err(ScopeError::UnknownSession {
                        session: session.to_owned(),
                    });
                }
                Standing::Pending if expired => {
                    return Err(ScopeError::FencePending {
                        scope,
                        session: session.to_owned(),
                    });
                }
                Standing::Waiting if expired => {
                    let op = Op::Resign {
                        session: session.to_owned(),
                        scope: scope.clone(),
                    };
                    // Whatever its outcome: the answer is the timeout. A grant made
                    // meanwhile is released by it; its token was never handed out.
                    let _ = self.commands.scope(op).await;
                    return Err(ScopeError::CampaignTimeout {
                        scope,
                        session: session.to_owned(),
                        waited_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                    });
                }
                Standing::Pending | Standing::Waiting => {}
            }
            if leadership.borrow_and_update().established.is_none() {
                return Err(ScopeError::Lost);
            }
            // Biased (in the order written) rather than tokio's random pick: every branch
            // only wakes the loop to look again, and a fixed order lets the simulation
            // replay a seed.
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return Err(ScopeError::Stopped),
                () = tokio::time::sleep_until(deadline) => {}
                _ = machine.changed() => {}
                _ = fenced.changed() => {}
                _ = leadership.changed() => {}
            }
        }
    }

    /// Session `session` lets go of `scope` (for `owner`), or stops waiting for it;
    /// resigning is idempotent.
    pub async fn resign(
        &self,
        scope: &str,
        session: &str,
        owner: Option<&str>,
    ) -> Result<Resigned, ScopeError> {
        self.check_available()?;
        let scope = self.named_scope(scope)?;
        self.require_leader()?;
        self.check_owner(session, owner)?;
        let op = Op::Resign {
            session: session.to_owned(),
            scope: scope.clone(),
        };
        match self.propose(op, session).await? {
            Outcome::Resigned { released } => Ok(Resigned {
                scope,
                session: session.to_owned(),
                released,
            }),
            other => Err(unexpected(&other)),
        }
    }

    /// Waits until this node applies a change to named leaderships that this handle has
    /// not seen yet (then [`Self::read`] and [`Self::held`] show it): an observer's wait.
    /// [`ScopeError::Stopped`] once the node stopped. Each clone sees changes on its own.
    pub async fn changed(&mut self) -> Result<(), ScopeError> {
        self.shared
            .machine
            .changed()
            .await
            .map_err(|_| ScopeError::Stopped)
    }

    /// What a reader sees of `scope` in `machine`.
    pub(crate) fn view_in(&self, machine: &Machine, scope: &str) -> ScopeView {
        let holder = machine.holder(scope);
        ScopeView {
            scope: scope.to_owned(),
            session: holder.map(|h| h.session.clone()),
            token: holder.map(|h| h.token),
            proof: holder.and_then(|h| self.proof(scope, h.token)),
        }
    }

    /// Who holds `scope` as applied on this node (every field `None`: nobody).
    pub fn read(&self, scope: &str) -> Result<ScopeView, ScopeError> {
        self.check_available()?;
        let scope = self.named_scope(scope)?;
        Ok(self.view_in(&self.shared.machine.borrow(), &scope))
    }

    /// The held scopes as applied on this node.
    pub fn held(&self) -> Result<Vec<ScopeView>, ScopeError> {
        self.check_available()?;
        let machine = Arc::clone(&self.shared.machine.borrow());
        Ok(machine
            .scopes
            .iter()
            .filter(|(_, s)| s.holder.is_some())
            .map(|(name, _)| self.view_in(&machine, name))
            .collect())
    }
}

/// The error for an outcome that does not belong to the change (a broken invariant).
fn unexpected(outcome: &Outcome) -> ScopeError {
    tracing::error!(?outcome, "unexpected outcome of a named-leaderships change");
    ScopeError::Unexpected(format!("{outcome:?}"))
}
