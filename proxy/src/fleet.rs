//! Fleet mode: the lease on the cluster's current term, and admission under it.
//!
//! A proxy started with `cluster` (the nodes' API URLs) follows one cluster. One task
//! renews its lease with `POST /v1/lease` (one request carries the proxy's whole lease:
//! a fleet follows one scope) every third of the granted `lease_ms`. A renewal on the
//! timer asks the node that last granted first and every other node too once it refuses
//! or [`RENEW_HEDGE_MS`] passed; a renewal a request waits for asks every node at once
//! (see [`Renewer::run`]). The first grant wins, so a paused or dead node never holds a
//! renewal for the whole `limits.lease_renew_timeout_ms`. The leader answers only after a
//! quorum confirmed its leadership after the request arrived (it may first wait to
//! gather requests into one round), so the lease is measured from when the round was
//! *sent*, on the proxy's monotonic clock, before any of its requests: it holds until
//! `sent + lease_ms`, and a slow answer only shortens it.
//!
//! A grant whose term is above the lease's raises the scope's fence to that term first,
//! through [`Fencer::admit`] as an admin advance does (so the barrier waits for the
//! lower-token writes in flight), and only then is the new term published. The data path
//! reads the lease from atomics, so an equal-token write with a valid lease takes no lock
//! and no allocation beyond standalone admission.
//!
//! Admission of a fenced request of the cluster's scope with token `t`:
//! - `t` below the fence: 409, as in standalone mode.
//! - a valid lease of term `t`: admitted as in standalone mode (fence, barrier), and the
//!   lease is checked again as the last step before forwarding.
//! - otherwise (no lease, a lapsed lease, `t` above the lease's term): the request waits
//!   (at most `limits.lease_renew_timeout_ms`) for a renewal *sent after it arrived*
//!   (single flight: every waiting request joins the same one). With the grant's term `T`
//!   (the fence is then at least `T`): `t < T` is 409 stale, `t > T` is 409
//!   token-not-issued (the cluster has not issued it), `t == T` is admitted. No grant in
//!   time: 503 `lease-expired` with `Retry-After`, nothing forwarded.
//!
//! Fenced requests of any other scope are refused with 403 `foreign-scope`: the lease
//! covers only the scope the cluster's grants name, and a scope no cluster fences cannot
//! be kept in order across proxies that share no disk.
//!
//! After the upstream has answered (when the in-flight guard drops), a write that
//! finished later than its lease's expiry plus `lease_write_bound_ms` is logged as
//! `lease-overrun` and counted: the nodes' release wait covers writes only up to that
//! bound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use palisade_client::{ClientError, NodeApi, backoff};
use palisade_protocol::Scope;
use palisade_protocol::lease::{
    LEASES_OFF, LeaseGrant, LeaseRequest, LeaseView, NOT_LEADER, UNKNOWN_PROXY,
};
use palisade_protocol::process::events;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::error::ProxyError;
use crate::fencing::{Admitted, Fencer};
use crate::metrics as m;

/// Shortest wait before retrying after a renewal round in which no node granted a lease.
pub const RENEW_RETRY_MS_MIN: u64 = 50;
/// Longest wait between failed renewal rounds: short, so that writes resume soon after
/// the cluster is reachable again (a write waits only `limits.lease_renew_timeout_ms`).
pub const RENEW_RETRY_MS_MAX: u64 = 1_000;
/// How long a timer renewal waits for the node that granted last before asking every
/// other node too. Above a leader's longest usual answer time (a leader holds a
/// background renewal for up to its gather interval, at most 300 ms, then needs one
/// quorum round), so a healthy leader is the only node asked; at most half of
/// `limits.lease_renew_timeout_ms` (1 s by default), so a paused or dead node delays a
/// renewal by this much, not by the whole timeout. A renewal a write waits for does not
/// hedge: it asks every node at once.
pub const RENEW_HEDGE_MS: u64 = 500;
/// Fewest milliseconds between two renewals of a valid lease, however short the granted
/// `lease_ms`: a node answering `lease_ms` of 0 or 1 must not make the proxy spin.
pub const RENEW_INTERVAL_MS_MIN: u64 = 10;

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
    /// Requests that need a renewal now wake the renewal task with it.
    demand: Notify,
    rounds: watch::Sender<Round>,
    /// Rounds started so far: a request needs a round numbered above the count it read
    /// when it arrived, which was sent after it arrived.
    started: AtomicU64,
    /// Publishing is one writer's job; this keeps a test driving rounds by hand and the
    /// task from interleaving.
    publishing: Mutex<()>,
    renew_timeout: Duration,
    write_bound: Duration,
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
            demand: Notify::new(),
            rounds: watch::Sender::new(Round::default()),
            started: AtomicU64::new(0),
            publishing: Mutex::new(()),
            renew_timeout,
            write_bound,
        }
    }

    /// Nanoseconds since `base`, at least 1 (0 means "no lease").
    fn now_ns(&self) -> u64 {
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

    /// When a write admitted under `snapshot` must have completed, on tokio's clock.
    pub(crate) fn overrun_deadline(&self, snapshot: Snapshot) -> Instant {
        self.expiry(snapshot) + self.write_bound
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
    fn rounds_started(&self) -> u64 {
        self.started.load(Ordering::Acquire)
    }

    /// Waits for a renewal round numbered above `seen` (so sent after the caller read
    /// `seen`) and returns its failure, if any; at most `renew_timeout`. Every request
    /// waiting at once joins the same round.
    async fn renewed_since(&self, seen: u64) -> Result<(), String> {
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
    fn publish(&self, term: u64, leader_id: u64, expiry_ns: u64) {
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

    fn update_gauge(&self) {
        let valid = if self.current().is_some() { 1.0 } else { 0.0 };
        metrics::gauge!(m::LEASE_VALID).set(valid);
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
        }
    }
}

/// Admits a fenced request in fleet mode (the rule in the module docs).
pub(crate) async fn admit(
    fencer: &Arc<Fencer>,
    lease: &Lease,
    scope: &str,
    token: u64,
) -> Result<Admitted, ProxyError> {
    let seen = lease.rounds_started();
    let mut renewal: Option<Result<(), String>> = None;
    loop {
        if let Some(cluster) = lease.scope()
            && cluster.as_str() != scope
        {
            return Err(ProxyError::ForeignScope {
                scope: scope.to_owned(),
                cluster_scope: cluster.to_string(),
            });
        }
        match lease.current() {
            Some(snapshot) if snapshot.term == token => {
                let mut admitted = fencer.admit(scope, token).await?;
                // The last check before the request is handed to the upstream: the
                // barrier may have taken long enough for the lease to lapse.
                if let Some(snapshot) = lease.current()
                    && snapshot.term == token
                {
                    admitted.lease_deadline = Some(lease.overrun_deadline(snapshot));
                    admitted.lease_expiry = Some(lease.expiry(snapshot));
                    return Ok(admitted);
                }
                // Lapsed meanwhile: leave the in-flight set before renewing, since the
                // renewal may need to raise the fence past this request.
                drop(admitted);
            }
            // After a granted round sent since this request arrived, the grant's term
            // is the cluster's current one: a lower token is stale, a higher one was
            // never issued. After a failed round, a higher token is left to the 503
            // below: the cluster may have moved on without this proxy hearing of it.
            Some(snapshot)
                if token < snapshot.term
                    || (token > snapshot.term && matches!(renewal, Some(Ok(())))) =>
            {
                let current = fencer.fence_register().current(scope).max(snapshot.term);
                return Err(if token < snapshot.term {
                    ProxyError::Stale {
                        scope: scope.to_owned(),
                        presented: token,
                        current,
                    }
                } else {
                    ProxyError::NotIssued {
                        scope: scope.to_owned(),
                        presented: token,
                        current,
                    }
                });
            }
            _ => {}
        }
        let fence = fencer.fence_register().current(scope);
        if token < fence {
            return Err(ProxyError::Stale {
                scope: scope.to_owned(),
                presented: token,
                current: fence,
            });
        }
        if let Some(result) = renewal {
            // A round sent after this request arrived ended, and no lease holds.
            let reason = match result {
                Err(reason) => reason,
                Ok(()) => "the lease granted lapsed before the request could use it".to_owned(),
            };
            metrics::counter!(m::LEASE_EXPIRED_REFUSALS).increment(1);
            return Err(ProxyError::LeaseExpired {
                scope: scope.to_owned(),
                presented: token,
                reason,
            });
        }
        let result = lease.renewed_since(seen).await;
        if let Err(reason) = &result
            && lease.current().is_none()
        {
            metrics::counter!(m::LEASE_EXPIRED_REFUSALS).increment(1);
            return Err(ProxyError::LeaseExpired {
                scope: scope.to_owned(),
                presented: token,
                reason: reason.clone(),
            });
        }
        renewal = Some(result);
    }
}

/// Logs and counts a write that completed after its lease's expiry plus the write bound;
/// says whether it did.
pub(crate) fn check_overrun(deadline: Instant, scope: &str, token: u64) -> bool {
    let now = Instant::now();
    let overran = now > deadline;
    if overran {
        let late_ms = u64::try_from((now - deadline).as_millis()).unwrap_or(u64::MAX);
        metrics::counter!(m::LEASE_OVERRUNS).increment(1);
        tracing::warn!(
            event = events::LEASE_OVERRUN,
            scope,
            token,
            late_ms,
            "a write completed after its lease expired plus lease_write_bound_ms"
        );
    }
    overran
}

/// The renewal task's fixed parts.
pub(crate) struct Renewer {
    pub(crate) lease: Arc<Lease>,
    pub(crate) fencer: Arc<Fencer>,
    /// The nodes, in the configured order.
    pub(crate) nodes: Vec<NodeApi>,
    /// This proxy as the nodes' `--announce` lists it.
    pub(crate) name: String,
}

/// Why a round was started, which decides whom it asks first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// The timer: the lease is renewed ahead of its end, and nobody waits. The node that
    /// last granted is asked first, the others after [`RENEW_HEDGE_MS`].
    Timer,
    /// A request waits for it: every node is asked at once, since a write is held until
    /// the grant and a follower's refusal costs it nothing; the request is marked
    /// `urgent`, so the leader does not hold it to gather others.
    Demand,
}

impl Renewer {
    /// Renews until `shutdown`: every third of the lease after a grant, at once on demand
    /// while the lease holds, with backoff after a failed round. A request that needs a
    /// renewal while a timer round is under way does not wait for it (that round was sent
    /// before the request arrived, so it would not do): the timer round is dropped and a
    /// demand round starts at once. A demand round is never dropped, so requests arriving
    /// in a stream cannot keep every round from finishing.
    pub(crate) async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let request = LeaseRequest {
            proxy: self.name.clone(),
            urgent: false,
        };
        let retry = || {
            backoff::delays(
                Duration::from_millis(RENEW_RETRY_MS_MIN),
                Duration::from_millis(RENEW_RETRY_MS_MAX),
            )
        };
        let mut delays = retry();
        let mut preferred = None;
        let mut cause = Cause::Timer;
        loop {
            // A demand stored while nobody listened (during the last round or its
            // backoff) makes this a demand round: a request is waiting.
            if cause == Cause::Timer && self.demand_stored().await {
                cause = Cause::Demand;
            }
            let sent = Instant::now();
            let round = self.lease.begin_round();
            let asked = self.round(&request, &mut preferred, cause);
            tokio::pin!(asked);
            let result = tokio::select! {
                result = &mut asked => result,
                () = self.lease.demand.notified(), if cause == Cause::Timer => {
                    cause = Cause::Demand;
                    continue;
                }
                _ = shutdown.wait_for(|stop| *stop) => return,
            };
            cause = Cause::Timer;
            let next = match &result {
                Ok(grant) => {
                    delays = retry();
                    sent + Duration::from_millis((grant.lease_ms / 3).max(RENEW_INTERVAL_MS_MIN))
                }
                Err(_) => {
                    Instant::now()
                        + delays
                            .next()
                            .unwrap_or(Duration::from_millis(RENEW_RETRY_MS_MAX))
                }
            };
            let granted = result.is_ok();
            self.lease.finish_round(&self.fencer, round, result).await;
            let lapse = self
                .lease
                .current()
                .map(|s| self.lease.base + Duration::from_nanos(s.expiry_ns));
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                // A request needs a newer grant: renew now, unless the last round failed
                // (then the backoff holds, and the request waits for the next round).
                () = self.lease.demand.notified(), if granted => cause = Cause::Demand,
                () = async {
                    match lapse {
                        Some(at) if at < next => {
                            tokio::time::sleep_until(at).await;
                            self.lease.update_gauge();
                            std::future::pending::<()>().await;
                        }
                        _ => std::future::pending().await,
                    }
                } => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
        }
    }

    /// Whether a demand is stored (taking it).
    async fn demand_stored(&self) -> bool {
        tokio::select! {
            biased;
            () = self.lease.demand.notified() => true,
            () = std::future::ready(()) => false,
        }
    }

    /// One round: the first grant of any node, asked as [`first_grant`] says, within the
    /// renewal timeout. `preferred` becomes the node that granted, or `None` after a
    /// failed round (the next asks every node at once). The failure names every node's
    /// last answer.
    async fn round(
        &self,
        request: &LeaseRequest,
        preferred: &mut Option<usize>,
        cause: Cause,
    ) -> Result<LeaseGrant, String> {
        let first = match cause {
            Cause::Timer => *preferred,
            Cause::Demand => None,
        };
        // A write waits for a demand round: the leader must not hold it to gather others.
        let request = &LeaseRequest {
            urgent: cause == Cause::Demand,
            ..request.clone()
        };
        let hedge = Duration::from_millis(RENEW_HEDGE_MS).min(self.lease.renew_timeout / 2);
        let ask = |index: usize, timeout: Duration| {
            let node: NodeApi = self.nodes[index].clone();
            let request = request.clone();
            async move {
                node.lease(&request, timeout).await.map_err(|err| {
                    let reason = refusal_reason(&err);
                    (reason, err.to_string())
                })
            }
        };
        let outcome = first_grant(
            self.nodes.len(),
            first,
            hedge,
            self.lease.renew_timeout,
            ask,
        )
        .await;
        match outcome {
            Ok((index, grant)) => {
                *preferred = Some(index);
                Ok(grant)
            }
            Err(answers) => {
                *preferred = None;
                let answers: Vec<String> = answers
                    .iter()
                    .map(|(index, reason, err)| {
                        let url = self.nodes[*index].url();
                        if *reason == UNKNOWN_PROXY || *reason == LEASES_OFF {
                            tracing::warn!(event = events::LEASE_REFUSED, node = %url,
                                proxy = %request.proxy, reason, cause = %err,
                                "the node refuses this proxy a lease");
                        }
                        format!("{url} ({reason}): {err}")
                    })
                    .collect();
                Err(format!(
                    "no node granted a lease to {}: {}",
                    request.proxy,
                    answers.join("; ")
                ))
            }
        }
    }
}

/// A node's refusal as a round sees it: the metrics label and the message.
type Refusal = (&'static str, String);

/// The first grant of `count` nodes within `timeout`, and which node gave it; or every
/// node's last refusal (a node that never answered is named as not answering in time).
///
/// With `preferred`, that node is asked first and the others all at once when it refuses
/// or after `hedge`, whichever comes first; without, every node is asked at once. So a
/// paused or dead node costs at most `hedge`, never the whole timeout. A node that
/// refuses in a way asking again may change (not the leader yet, busy, unreachable) is
/// asked again after a backoff from [`RENEW_RETRY_MS_MIN`] to [`RENEW_RETRY_MS_MAX`]
/// while the time lasts, so a round under way during an election is granted soon after
/// the new leader is there. The first grant wins; the requests still out are dropped, and
/// a later answer to them is never seen. Each request is bounded by what is left of
/// `timeout`, so the round is too.
async fn first_grant<A, F>(
    count: usize,
    preferred: Option<usize>,
    hedge: Duration,
    timeout: Duration,
    ask: A,
) -> Result<(usize, LeaseGrant), Vec<(usize, &'static str, String)>>
where
    A: Fn(usize, Duration) -> F,
    F: Future<Output = Result<LeaseGrant, Refusal>> + Send + 'static,
{
    let deadline = Instant::now() + timeout;
    let mut asks = tokio::task::JoinSet::new();
    let mut last: Vec<Option<Refusal>> = vec![None; count];
    let mut backoffs: Vec<_> = (0..count)
        .map(|_| {
            backoff::delays(
                Duration::from_millis(RENEW_RETRY_MS_MIN),
                Duration::from_millis(RENEW_RETRY_MS_MAX),
            )
        })
        .collect();
    // Spawns a request to node `index` after `delay`, bounded by the round's deadline.
    let spawn = |asks: &mut tokio::task::JoinSet<_>, index: usize, delay: Duration| {
        let start = Instant::now() + delay;
        let request = ask(index, deadline.saturating_duration_since(start));
        asks.spawn(async move {
            tokio::time::sleep_until(start).await;
            (index, request.await)
        });
    };
    let mut hedge_at = match preferred {
        Some(index) if index < count => {
            spawn(&mut asks, index, Duration::ZERO);
            Some((index, Instant::now() + hedge))
        }
        _ => {
            for index in 0..count {
                spawn(&mut asks, index, Duration::ZERO);
            }
            None
        }
    };
    while !(asks.is_empty() && hedge_at.is_none()) {
        let hedged = async {
            match hedge_at {
                Some((_, at)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(joined) = asks.join_next() => {
                let Ok((index, answer)) = joined else {
                    continue;
                };
                match answer {
                    Ok(grant) => return Ok((index, grant)),
                    Err((reason, err)) => {
                        metrics::counter!(m::LEASE_REFUSALS, "reason" => reason).increment(1);
                        let again = reason != UNKNOWN_PROXY && reason != LEASES_OFF;
                        last[index] = Some((reason, err));
                        if let Some((first, _)) = hedge_at.take() {
                            (0..count)
                                .filter(|&i| i != first)
                                .for_each(|i| spawn(&mut asks, i, Duration::ZERO));
                        }
                        let delay = backoffs[index]
                            .next()
                            .unwrap_or(Duration::from_millis(RENEW_RETRY_MS_MAX));
                        if again && Instant::now() + delay < deadline {
                            spawn(&mut asks, index, delay);
                        }
                    }
                }
            }
            () = hedged => {
                if let Some((first, _)) = hedge_at.take() {
                    (0..count)
                        .filter(|&i| i != first)
                        .for_each(|i| spawn(&mut asks, i, Duration::ZERO));
                }
            }
            () = tokio::time::sleep_until(deadline) => break,
        }
    }
    let waited_ms = timeout.as_millis();
    Err(last
        .into_iter()
        .enumerate()
        .map(|(index, refusal)| {
            let (reason, err) = refusal.unwrap_or_else(|| {
                (
                    "unreachable",
                    format!("no answer within {waited_ms} ms (limits.lease_renew_timeout_ms)"),
                )
            });
            (index, reason, err)
        })
        .collect())
}

/// The metrics label of a node's refusal.
fn refusal_reason(err: &ClientError) -> &'static str {
    match err {
        ClientError::Status {
            problem: Some(problem),
            ..
        } => match problem.kind() {
            NOT_LEADER => NOT_LEADER,
            UNKNOWN_PROXY => UNKNOWN_PROXY,
            LEASES_OFF => LEASES_OFF,
            _ => "error",
        },
        ClientError::Unreachable { .. } | ClientError::Indeterminate { .. } => "unreachable",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A fencer in fleet mode over a fresh database.
    fn fleet_fencer(dir: &tempfile::TempDir, renew_ms: u64) -> (Arc<Fencer>, Arc<Lease>) {
        let db = palisade_storage::open_database(&dir.path().join("f.redb")).unwrap();
        let register = palisade_storage::FenceRegister::open(db, 100).unwrap();
        let lease = Arc::new(Lease::new(
            Duration::from_millis(renew_ms),
            Duration::from_millis(500),
        ));
        let fencer = Fencer::new(register, Duration::from_secs(5)).with_lease(Arc::clone(&lease));
        (Arc::new(fencer), lease)
    }

    #[expect(
        clippy::unnecessary_wraps,
        reason = "a round's result, as the source answers"
    )]
    fn grant(term: u64, lease_ms: u64) -> Result<LeaseGrant, String> {
        Ok(LeaseGrant {
            scope: Scope::new("s").unwrap(),
            term,
            leader_id: 1,
            lease_ms,
        })
    }

    /// A fake lease source: answers every demand with a round whose result the test
    /// sets, and counts the rounds.
    struct FakeSource {
        answer: Arc<std::sync::Mutex<Result<LeaseGrant, String>>>,
        rounds: Arc<AtomicUsize>,
        task: tokio::task::JoinHandle<()>,
    }

    impl FakeSource {
        fn start(
            fencer: &Arc<Fencer>,
            lease: &Arc<Lease>,
            answer: Result<LeaseGrant, String>,
        ) -> Self {
            let answer = Arc::new(std::sync::Mutex::new(answer));
            let rounds = Arc::new(AtomicUsize::new(0));
            let (f, l, a, r) = (
                Arc::clone(fencer),
                Arc::clone(lease),
                Arc::clone(&answer),
                Arc::clone(&rounds),
            );
            let task = tokio::spawn(async move {
                loop {
                    l.demand.notified().await;
                    let round = l.begin_round();
                    let result = a.lock().unwrap().clone();
                    r.fetch_add(1, Ordering::SeqCst);
                    l.finish_round(&f, round, result).await;
                }
            });
            Self {
                answer,
                rounds,
                task,
            }
        }

        fn answer(&self, answer: Result<LeaseGrant, String>) {
            *self.answer.lock().unwrap() = answer;
        }

        fn rounds(&self) -> usize {
            self.rounds.load(Ordering::SeqCst)
        }
    }

    /// Goal: with no lease a write waits for a renewal and is admitted at the granted
    /// term; while the lease holds, equal tokens pass without renewing; once it lapses
    /// and renewals fail, writes are 503 lease-expired naming the cause, and with no
    /// answer at all 503 naming the renewal timeout.
    /// Method: a fake lease source granting term 5 for 1 s, then failing, then stopped;
    /// paused time moved past the lease (the fence is raised to 5 before pausing, so no
    /// blocking fsync runs while time is paused).
    #[tokio::test]
    async fn equal_token_needs_a_valid_lease_and_a_lapsed_one_is_503() {
        let dir = tempfile::tempdir().unwrap();
        let (fencer, lease) = fleet_fencer(&dir, 200);
        drop(fencer.admit("s", 5).await.unwrap());
        tokio::time::pause();
        let source = FakeSource::start(&fencer, &lease, grant(5, 1_000));

        let admitted = fencer.admit_request("s", 5).await.unwrap();
        assert!(admitted.lease_deadline.is_some());
        drop(admitted);
        assert_eq!(source.rounds(), 1);
        for _ in 0..10 {
            drop(fencer.admit_request("s", 5).await.unwrap());
        }
        assert_eq!(
            source.rounds(),
            1,
            "equal tokens under a valid lease renew nothing"
        );
        assert!(lease.view().valid);

        source.answer(Err("all nodes unreachable".into()));
        tokio::time::advance(Duration::from_millis(1_001)).await;
        assert!(!lease.view().valid);
        let err = fencer.admit_request("s", 5).await.err().unwrap();
        assert!(
            matches!(&err, ProxyError::LeaseExpired { presented: 5, reason, .. }
            if reason.contains("all nodes unreachable")),
            "{err}"
        );
        assert_eq!(err.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(err.reason(), "lease-expired");

        source.task.abort();
        let err = fencer.admit_request("s", 5).await.err().unwrap();
        assert!(
            matches!(&err, ProxyError::LeaseExpired { reason, .. }
            if reason.contains("limits.lease_renew_timeout_ms")),
            "{err}"
        );
        assert!(
            fencer.busy_scopes() == 0,
            "refused writes leave nothing in flight"
        );
    }

    /// Goal: a burst of writes with a token above the lease's term makes one renewal
    /// (single flight), the grant raises the fence durably, and then a lower token is
    /// stale and a higher one never issued (409 both).
    /// Method: lease at 5; the source now grants 6; 20 concurrent writes of 6; then 5
    /// and 7.
    #[tokio::test]
    async fn higher_token_renews_once_for_a_burst_and_raises_the_fence() {
        let dir = tempfile::tempdir().unwrap();
        let (fencer, lease) = fleet_fencer(&dir, 5_000);
        let source = FakeSource::start(&fencer, &lease, grant(5, 60_000));
        drop(fencer.admit_request("s", 5).await.unwrap());
        assert_eq!(fencer.fence_register().current("s"), 5);
        source.answer(grant(6, 60_000));
        let before = source.rounds();
        let writes: Vec<_> = (0..20)
            .map(|_| {
                let f = Arc::clone(&fencer);
                tokio::spawn(async move { f.admit_request("s", 6).await.map(drop) })
            })
            .collect();
        for w in writes {
            w.await.unwrap().unwrap();
        }
        // One round for the burst, and at most one more from a demand stored while it
        // was under way.
        assert!(
            source.rounds() - before <= 2,
            "{} rounds",
            source.rounds() - before
        );
        assert_eq!(fencer.fence_register().current("s"), 6);
        assert_eq!(lease.view().term, 6);

        let err = fencer.admit_request("s", 5).await.err().unwrap();
        assert!(
            matches!(
                err,
                ProxyError::Stale {
                    presented: 5,
                    current: 6,
                    ..
                }
            ),
            "{err}"
        );
        let err = fencer.admit_request("s", 7).await.err().unwrap();
        assert!(
            matches!(
                err,
                ProxyError::NotIssued {
                    presented: 7,
                    current: 6,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(err.status(), http::StatusCode::CONFLICT);
        assert_eq!(
            fencer.fence_register().current("s"),
            6,
            "an unissued token moves nothing"
        );
    }

    /// Goal: a token above the lease's term with a failed renewal is 503, not 409: the
    /// cluster may have moved on without this proxy hearing of it. And a scope other
    /// than the cluster's is refused with 403 foreign-scope.
    /// Method: lease at 5, the source fails, write 6; write to scope `t`.
    #[tokio::test]
    async fn failed_renewal_for_a_higher_token_is_503_and_other_scopes_are_403() {
        let dir = tempfile::tempdir().unwrap();
        let (fencer, lease) = fleet_fencer(&dir, 5_000);
        let source = FakeSource::start(&fencer, &lease, grant(5, 60_000));
        drop(fencer.admit_request("s", 5).await.unwrap());
        source.answer(Err("node 2: not leader".into()));
        let err = fencer.admit_request("s", 6).await.err().unwrap();
        assert!(
            matches!(&err, ProxyError::LeaseExpired { presented: 6, reason, .. }
            if reason.contains("not leader")),
            "{err}"
        );
        assert_eq!(fencer.fence_register().current("s"), 5);
        let err = fencer.admit_request("t", 5).await.err().unwrap();
        assert!(
            matches!(&err, ProxyError::ForeignScope { cluster_scope, .. } if cluster_scope == "s"),
            "{err}"
        );
        assert_eq!(err.status(), http::StatusCode::FORBIDDEN);
        // The admin advance (an announce) needs no lease.
        drop(fencer.admit("s", 9).await.unwrap());
        assert_eq!(fencer.fence_register().current("s"), 9);
    }

    /// Goal: a grant of a new term raises the fence only once the lower-token write in
    /// flight is done (the barrier), and only then publishes the term.
    /// Method: hold an admitted write of 5, finish a round granting 6 in a task; show it
    /// has not finished while 5 is held (a negative check, so a fixed wait), release 5.
    #[tokio::test]
    async fn new_term_is_published_after_lower_writes_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let (fencer, lease) = fleet_fencer(&dir, 5_000);
        let round = lease.begin_round();
        lease.finish_round(&fencer, round, grant(5, 60_000)).await;
        let held = fencer.admit_request("s", 5).await.unwrap();
        let (f, l) = (Arc::clone(&fencer), Arc::clone(&lease));
        let round = lease.begin_round();
        let round = tokio::spawn(async move { l.finish_round(&f, round, grant(6, 60_000)).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!round.is_finished());
        assert_eq!(
            lease.view().term,
            5,
            "the new term waits for the write in flight"
        );
        drop(held);
        round.await.unwrap();
        assert_eq!(lease.view().term, 6);
        assert_eq!(lease.view().renewals, 2);
    }

    /// Goal: a write that completes after its lease's expiry plus the write bound is an
    /// overrun; one that completes in time is not.
    /// Method: paused time; check deadlines either side.
    #[tokio::test(start_paused = true)]
    async fn overrun_is_a_write_completing_past_lease_plus_bound() {
        let lease = Lease::new(Duration::from_secs(1), Duration::from_millis(500));
        lease.publish(3, 1, lease.now_ns() + 1_000_000_000);
        let deadline = lease.overrun_deadline(lease.current().unwrap());
        tokio::time::advance(Duration::from_millis(1_400)).await;
        assert!(!check_overrun(deadline, "s", 3));
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(check_overrun(deadline, "s", 3));
    }

    /// A fake cluster for [`first_grant`]: what each node answers at a given moment
    /// after the round started, and how often each was asked.
    struct FakeNodes {
        start: Instant,
        asked: Arc<Vec<AtomicUsize>>,
    }

    /// What a fake node does when asked.
    #[derive(Clone, Copy)]
    enum Behaviour {
        /// Never answers (a paused or dead node).
        Paused,
        /// Refuses with this kind until the given moment after the start, then grants
        /// `term` after 5 ms (a leader's round).
        LeaderFrom(&'static str, Duration, u64),
    }

    impl FakeNodes {
        fn new(count: usize) -> Self {
            Self {
                start: Instant::now(),
                asked: Arc::new((0..count).map(|_| AtomicUsize::new(0)).collect()),
            }
        }

        fn asked(&self, index: usize) -> usize {
            self.asked[index].load(Ordering::SeqCst)
        }

        /// The `ask` of [`first_grant`] over `nodes`.
        fn ask(
            &self,
            nodes: Vec<Behaviour>,
        ) -> impl Fn(
            usize,
            Duration,
        ) -> std::pin::Pin<
            Box<dyn Future<Output = Result<LeaseGrant, Refusal>> + Send + 'static>,
        > {
            let (start, asked) = (self.start, Arc::clone(&self.asked));
            move |index, timeout| {
                let behaviour = nodes[index];
                let asked = Arc::clone(&asked);
                Box::pin(async move {
                    asked[index].fetch_add(1, Ordering::SeqCst);
                    let answer = async {
                        match behaviour {
                            Behaviour::Paused => std::future::pending().await,
                            Behaviour::LeaderFrom(kind, from, term) => {
                                if start.elapsed() < from {
                                    Err((kind, format!("node {index}: {kind}")))
                                } else {
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                    Ok(grant(term, 3_000).unwrap())
                                }
                            }
                        }
                    };
                    tokio::time::timeout(timeout, answer)
                        .await
                        .unwrap_or_else(|_| Err(("unreachable", "timed out".to_owned())))
                })
            }
        }
    }

    const HEDGE: Duration = Duration::from_millis(RENEW_HEDGE_MS);
    const TIMEOUT: Duration = Duration::from_millis(crate::config::LEASE_RENEW_TIMEOUT_MS_DEFAULT);
    const NEVER: Duration = Duration::from_secs(3_600);
    const NOW: Duration = Duration::ZERO;

    /// Goal: a paused node asked first costs a timer renewal the hedge delay, not the
    /// renewal timeout; a renewal a request waits for asks every node at once, so the
    /// paused node costs it nothing; a node asked first that refuses at once makes the
    /// others be asked at once.
    /// Method: paused time; node 0 never answers, node 1 leads (grants 5 ms after being
    /// asked), node 2 answers not-leader; the moment of the grant is exact.
    #[tokio::test(start_paused = true)]
    async fn a_paused_node_costs_the_hedge_or_nothing() {
        use Behaviour::{LeaderFrom, Paused};
        let cluster = vec![
            Paused,
            LeaderFrom(NOT_LEADER, NOW, 4),
            LeaderFrom(NOT_LEADER, NEVER, 0),
        ];
        let nodes = FakeNodes::new(3);
        let got = first_grant(3, Some(0), HEDGE, TIMEOUT, nodes.ask(cluster.clone())).await;
        assert_eq!(got.unwrap().0, 1);
        assert_eq!(nodes.start.elapsed(), HEDGE + Duration::from_millis(5));
        assert_eq!((nodes.asked(0), nodes.asked(1)), (1, 1));

        let nodes = FakeNodes::new(3);
        let got = first_grant(3, None, HEDGE, TIMEOUT, nodes.ask(cluster.clone())).await;
        assert_eq!(got.unwrap(), (1, grant(4, 3_000).unwrap()));
        assert_eq!(nodes.start.elapsed(), Duration::from_millis(5));

        let nodes = FakeNodes::new(3);
        let got = first_grant(3, Some(2), HEDGE, TIMEOUT, nodes.ask(cluster)).await;
        assert_eq!(got.unwrap().0, 1);
        assert_eq!(
            nodes.start.elapsed(),
            Duration::from_millis(5),
            "a refusal of the node asked first hedges at once"
        );
    }

    /// Goal: a round under way during an election is granted by the new leader within
    /// the round, not after it failed: nodes that answer not-leader are asked again
    /// with backoff, a few times, while the old leader never answers.
    /// Method: paused time; node 0 never answers, node 1 leads from 400 ms, node 2
    /// never leads; every node is asked at once.
    #[tokio::test(start_paused = true)]
    async fn a_round_during_an_election_is_granted_by_the_new_leader() {
        use Behaviour::{LeaderFrom, Paused};
        let nodes = FakeNodes::new(3);
        let cluster = vec![
            Paused,
            LeaderFrom(NOT_LEADER, Duration::from_millis(400), 5),
            LeaderFrom(NOT_LEADER, NEVER, 0),
        ];
        let got = first_grant(3, None, HEDGE, TIMEOUT, nodes.ask(cluster)).await;
        assert_eq!(got.unwrap(), (1, grant(5, 3_000).unwrap()));
        let waited = nodes.start.elapsed();
        assert!(
            waited > Duration::from_millis(400) && waited < TIMEOUT,
            "{waited:?}"
        );
        assert_eq!(
            nodes.asked(0),
            1,
            "a node that has not answered is not asked again"
        );
        assert!(
            (2..=8).contains(&nodes.asked(2)),
            "refusing nodes are asked again with backoff: {}",
            nodes.asked(2)
        );
    }

    /// Goal: a round in which no node grants fails at the renewal timeout at the latest,
    /// naming each node's last answer; refusals no retry can change (unknown-proxy,
    /// leases-off) are not asked again, and end the round at once when every node gave
    /// one.
    /// Method: paused time; one cluster with a paused node, one refusing this proxy.
    #[tokio::test(start_paused = true)]
    async fn a_round_without_a_grant_fails_naming_every_node() {
        use Behaviour::{LeaderFrom, Paused};
        let nodes = FakeNodes::new(2);
        let cluster = vec![Paused, LeaderFrom(NOT_LEADER, NEVER, 0)];
        let answers = first_grant(2, Some(0), HEDGE, TIMEOUT, nodes.ask(cluster))
            .await
            .unwrap_err();
        assert_eq!(nodes.start.elapsed(), TIMEOUT);
        assert_eq!(answers.len(), 2);
        assert_eq!(answers[0].1, "unreachable");
        assert!(
            answers[0].2.contains("lease_renew_timeout_ms"),
            "{}",
            answers[0].2
        );
        assert_eq!(answers[1].1, NOT_LEADER);

        let nodes = FakeNodes::new(3);
        let cluster = vec![LeaderFrom(UNKNOWN_PROXY, NEVER, 0); 3];
        let answers = first_grant(3, None, HEDGE, TIMEOUT, nodes.ask(cluster))
            .await
            .unwrap_err();
        assert_eq!(nodes.start.elapsed(), Duration::ZERO);
        assert!(
            answers
                .iter()
                .all(|(_, reason, _)| *reason == UNKNOWN_PROXY)
        );
        assert_eq!(
            (nodes.asked(0), nodes.asked(1), nodes.asked(2)),
            (1, 1, 1),
            "asked once each"
        );
    }

    /// A fake node API on 127.0.0.1 for the renewal task: `POST /v1/lease` grants the
    /// term in `term` for 3 s (renewed every second), or never answers while it is 0 (a
    /// paused node). It keeps every request it received.
    async fn fake_node(
        term: Arc<AtomicU64>,
        received: Arc<std::sync::Mutex<Vec<LeaseRequest>>>,
    ) -> String {
        let app = axum::Router::new().route(
            palisade_protocol::lease::LEASE_PATH,
            axum::routing::post(move |axum::Json(request): axum::Json<LeaseRequest>| {
                let term = term.load(Ordering::SeqCst);
                received.lock().unwrap().push(request);
                async move {
                    if term == 0 {
                        std::future::pending::<()>().await;
                    }
                    axum::Json(grant(term, 3_000).unwrap())
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }

    /// Goal: a write with a token above the lease's term does not wait for a timer
    /// renewal stuck on a paused node: its own renewal replaces it, asks every node at
    /// once, is marked urgent, and the write is admitted within the renewal timeout.
    /// Method: two fake nodes; B grants term 5 (so B is asked first from then on) while A
    /// hangs; then B hangs and A grants 6; once a timer renewal has reached B, a write of
    /// 6 is made; the first request A gets after that must be urgent (the timer renewal
    /// would reach A only after its hedge, not urgent), and the write is admitted.
    #[tokio::test]
    async fn a_write_renewal_replaces_a_timer_renewal_stuck_on_a_paused_node() {
        let dir = tempfile::tempdir().unwrap();
        let (fencer, lease) = fleet_fencer(&dir, 1_000);
        let (a_term, b_term) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(5)));
        let (a_got, b_got) = (Arc::default(), Arc::default());
        let a = fake_node(Arc::clone(&a_term), Arc::clone(&a_got)).await;
        let b = fake_node(Arc::clone(&b_term), Arc::clone(&b_got)).await;
        let renewer = Renewer {
            lease: Arc::clone(&lease),
            fencer: Arc::clone(&fencer),
            nodes: vec![NodeApi::new(&a).unwrap(), NodeApi::new(&b).unwrap()],
            name: "http://127.0.0.1:1".to_owned(),
        };
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(renewer.run(stopped));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while lease.view().term != 5 {
            assert!(std::time::Instant::now() < deadline, "no grant of term 5");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        b_term.store(0, Ordering::SeqCst);
        a_term.store(6, Ordering::SeqCst);
        let asked_a = a_got.lock().unwrap().len();
        let asked_b = b_got.lock().unwrap().len();
        while b_got.lock().unwrap().len() == asked_b {
            assert!(
                std::time::Instant::now() < deadline,
                "no timer renewal reached B"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let started = std::time::Instant::now();
        let admitted = fencer.admit_request("s", 6).await;
        let waited = started.elapsed();
        assert!(admitted.is_ok(), "{:?}", admitted.err());
        assert!(waited < lease.renew_timeout, "the write waited {waited:?}");
        // The timer renewal would ask A only after the hedge (500 ms), not urgent: the
        // first request A sees is the write's own renewal.
        assert!(
            a_got.lock().unwrap()[asked_a].urgent,
            "A was first asked by the write's renewal, not by the timer renewal's hedge"
        );
        stop.send(true).unwrap();
        task.await.unwrap();
    }
}
