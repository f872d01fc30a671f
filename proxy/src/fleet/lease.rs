//! The lease's state: the term and expiry the data path reads from atomics, the renewal
//! rounds requests wait for, and what a grant does (raise the fence, then publish).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use palisade_protocol::Scope;
use palisade_protocol::lease::{LeaseGrant, LeaseView};
use palisade_protocol::process::events;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::error::ProxyError;
use crate::fencing::Fencer;
use crate::metrics as m;

/// The result of the last renewal round, for the requests waiting on one.
#[derive(Debug, Clone, Default)]
struct Round {
    /// Its number (0: no round yet); rounds are numbered from 1 as they start.
    number: u64,
    /// Why it failed; `None` when it was granted.
    failure: Option<String>,
}

/// The lease, shared by the renewal task, the data path and the admin API.
pub(crate) struct Lease {
    /// The origin of the lease's clock (tokio's, so tests can pause it).
    base: Instant,
    /// Expiry in nanoseconds since `base`; 0 while no lease has been granted, or while a
    /// new term is being published (see [`Lease::publish`]).
    expiry_ns: AtomicU64,
    term: AtomicU64,
    leader_id: AtomicU64,
    /// The cluster's scope, from the first grant. A later grant naming another scope is
    /// refused (the fleet follows one cluster).
    scope: OnceLock<Scope>,
    renewals: AtomicU64,
    failures: AtomicU64,
    /// Why the cluster refuses this proxy a lease, from the last finished round, when its
    /// answers name a configuration an operator must fix (see [`Lease::set_refusal`]).
    refusal: Mutex<Option<String>>,
    /// Requests that need a renewal now wake the renewal task with it.
    pub(super) demand: Notify,
    rounds: watch::Sender<Round>,
    /// Rounds started so far: a request needs a round numbered above the count it read
    /// when it arrived, which was sent after it arrived.
    started: AtomicU64,
    /// Publishing is one writer's job; this keeps a test driving rounds by hand and the
    /// task from interleaving.
    publishing: Mutex<()>,
    /// `limits.lease_renew_timeout_ms`: how long a request waits for a renewal round,
    /// and the bound on each round.
    pub(super) renew_timeout: Duration,
    /// `lease_write_bound_ms` (see [`LeasedAdmission`](super::admission::LeasedAdmission)).
    pub(super) write_bound: Duration,
}

/// What the data path reads: the lease's term and when it lapses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) term: u64,
    expiry_ns: u64,
}

impl Lease {
    pub(crate) fn new(renew_timeout: Duration, write_bound: Duration) -> Self {
        Self {
            base: Instant::now(),
            expiry_ns: AtomicU64::new(0),
            term: AtomicU64::new(0),
            leader_id: AtomicU64::new(0),
            scope: OnceLock::new(),
            renewals: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            refusal: Mutex::new(None),
            demand: Notify::new(),
            rounds: watch::Sender::new(Round::default()),
            started: AtomicU64::new(0),
            publishing: Mutex::new(()),
            renew_timeout,
            write_bound,
        }
    }

    /// Nanoseconds since `base`, at least 1 (0 means "no lease").
    pub(super) fn now_ns(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The lease if it holds now. Reads expiry, term, expiry: a publication of a new term
    /// between the two expiry reads is seen as a change, and the read is tried again, so
    /// a term is never paired with another term's expiry.
    pub(crate) fn current(&self) -> Option<Snapshot> {
        for _ in 0..3 {
            let expiry_ns = self.expiry_ns.load(Ordering::Acquire);
            let term = self.term.load(Ordering::Acquire);
            if self.expiry_ns.load(Ordering::Acquire) != expiry_ns {
                continue;
            }
            if expiry_ns == 0 || self.now_ns() >= expiry_ns {
                return None;
            }
            return Some(Snapshot { term, expiry_ns });
        }
        // Three publications during one read: treat it as no lease, which makes the
        // request renew (fail closed).
        None
    }

    /// When the lease of `snapshot` ends, on tokio's clock.
    pub(crate) fn expiry(&self, snapshot: Snapshot) -> Instant {
        self.base + Duration::from_nanos(snapshot.expiry_ns)
    }

    /// The cluster's scope, once a grant named it.
    pub(crate) fn scope(&self) -> Option<&Scope> {
        self.scope.get()
    }

    /// Starts a renewal round: its number, and when it is sent (nanoseconds on the
    /// lease's clock). Call just before sending the request.
    pub(crate) fn begin_round(&self) -> (u64, u64) {
        let number = self.started.fetch_add(1, Ordering::AcqRel) + 1;
        (number, self.now_ns())
    }

    /// The number of rounds started so far.
    pub(super) fn rounds_started(&self) -> u64 {
        self.started.load(Ordering::Acquire)
    }

    /// Waits for a renewal round numbered above `seen` (so sent after the caller read
    /// `seen`) and returns its failure, if any; at most `renew_timeout`. Every request
    /// waiting at once joins the same round.
    pub(super) async fn renewed_since(&self, seen: u64) -> Result<(), String> {
        let mut rounds = self.rounds.subscribe();
        self.demand.notify_one();
        let waited = tokio::time::timeout(
            self.renew_timeout,
            rounds.wait_for(|round| round.number > seen),
        )
        .await;
        match waited {
            Ok(Ok(round)) => match &round.failure {
                None => Ok(()),
                Some(reason) => Err(reason.clone()),
            },
            Ok(Err(_)) => Err("the lease task has stopped".to_owned()),
            Err(_) => Err(format!(
                "no lease renewal finished within {} ms (limits.lease_renew_timeout_ms)",
                self.renew_timeout.as_millis()
            )),
        }
    }

    /// Records round `number`, sent at `sent_ns`: on a grant, raises the fence to its term if it
    /// is new (through the fencer, so lower-token writes in flight finish first), then
    /// publishes the lease; on a failure, publishes nothing (the lease lapses on its own).
    /// Either way, the requests waiting for a round are woken.
    pub(crate) async fn finish_round(
        &self,
        fencer: &Arc<Fencer>,
        (number, sent_ns): (u64, u64),
        result: Result<LeaseGrant, String>,
    ) {
        let failure = match result {
            Ok(grant) => self.accept(fencer, sent_ns, &grant).await.err(),
            Err(reason) => Some(reason),
        };
        match &failure {
            None => {
                self.renewals.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(m::LEASE_RENEWALS, "outcome" => "granted").increment(1);
            }
            Some(reason) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(m::LEASE_RENEWALS, "outcome" => "failed").increment(1);
                tracing::warn!(event = events::LEASE_REFUSED, term = self.term.load(Ordering::Relaxed),
                    cause = %reason, "lease renewal failed");
            }
        }
        self.update_gauge();
        self.rounds.send_replace(Round { number, failure });
    }

    async fn accept(
        &self,
        fencer: &Arc<Fencer>,
        sent_ns: u64,
        grant: &LeaseGrant,
    ) -> Result<(), String> {
        let scope = self.scope.get_or_init(|| grant.scope.clone());
        if *scope != grant.scope {
            return Err(format!(
                "node {} granted a lease for scope {}, but this fleet follows scope {scope}",
                grant.leader_id, grant.scope
            ));
        }
        let published = self.term.load(Ordering::Acquire);
        if grant.term > published {
            // The cluster says grant.term is current: the fence goes there before the
            // term is published, by the same path as an announce's advance.
            match fencer.admit(scope.as_str(), grant.term).await {
                Ok(admitted) => drop(admitted),
                // BarrierTimeout: the fence is raised; lower-token writes are still in
                // flight, admitted under the old term's lease, which still holds for them.
                // Stale: the fence is already above the grant (a newer leader announced),
                // and it refuses the older term whatever the lease says.
                Err(ProxyError::BarrierTimeout { .. } | ProxyError::Stale { .. }) => {}
                Err(err) => {
                    return Err(format!(
                        "cannot raise the fence of scope {scope} to the granted term {}: {err}",
                        grant.term
                    ));
                }
            }
        } else if grant.term < published {
            return Err(format!(
                "node {} granted term {}, below the term {published} already granted",
                grant.leader_id, grant.term
            ));
        }
        let expiry_ns = sent_ns.saturating_add(
            u64::try_from(Duration::from_millis(grant.lease_ms).as_nanos()).unwrap_or(u64::MAX),
        );
        self.publish(grant.term, grant.leader_id, expiry_ns);
        tracing::debug!(scope = %scope, term = grant.term, leader_id = grant.leader_id,
            lease_ms = grant.lease_ms, "lease renewed");
        Ok(())
    }

    /// Publishes a lease. A new term is written between two stores of the expiry, the
    /// first of which invalidates the lease, so a reader never pairs the new term with
    /// the old expiry or the old term with the new expiry (see [`Lease::current`]).
    pub(super) fn publish(&self, term: u64, leader_id: u64, expiry_ns: u64) {
        let _one = self
            .publishing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.term.load(Ordering::Acquire) != term {
            self.expiry_ns.store(0, Ordering::Release);
            self.term.store(term, Ordering::Release);
        }
        self.leader_id.store(leader_id, Ordering::Relaxed);
        self.expiry_ns.store(expiry_ns.max(1), Ordering::Release);
    }

    pub(super) fn update_gauge(&self) {
        let valid = if self.current().is_some() { 1.0 } else { 0.0 };
        metrics::gauge!(m::LEASE_VALID).set(valid);
    }

    /// Why the cluster refuses this proxy a lease, when the last round said so: for the
    /// 503s of the data path, `/healthz` and the status page.
    pub(crate) fn refusal(&self) -> Option<String> {
        self.refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records what the last round's answers say an operator must fix (`None`: nothing,
    /// or a grant). A change is logged, at error level while there is a refusal: the
    /// first round runs at start, so a misconfigured cluster is named in the log at
    /// start-up, once, not at every round.
    pub(super) fn set_refusal(&self, refusal: Option<String>) {
        let mut held = self.refusal.lock().unwrap_or_else(PoisonError::into_inner);
        if *held == refusal {
            return;
        }
        if let Some(why) = &refusal {
            tracing::error!(event = events::LEASE_REFUSED, cause = %why,
                "the cluster grants this proxy no lease: every fenced write of its scope is refused with 503 until this is fixed");
        } else {
            tracing::info!("the cluster's refusal is over: leases can be granted again");
        }
        *held = refusal;
    }

    /// The admin API's view.
    pub(crate) fn view(&self) -> LeaseView {
        let snapshot = self.current();
        let leader_id = self.leader_id.load(Ordering::Relaxed);
        LeaseView {
            scope: self.scope.get().cloned(),
            term: self.term.load(Ordering::Acquire),
            leader_id: (leader_id != 0).then_some(leader_id),
            valid: snapshot.is_some(),
            expires_in_ms: snapshot
                .map_or(0, |s| s.expiry_ns.saturating_sub(self.now_ns()) / 1_000_000),
            renewals: self.renewals.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            refusal: self.refusal(),
        }
    }
}
