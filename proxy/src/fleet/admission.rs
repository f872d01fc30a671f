//! Admission under the lease, on top of standalone admission: the fleet rule, the guard
//! that carries the lease's deadlines with an admitted request, and what the data path
//! holds for either mode.

use std::sync::Arc;

use palisade_protocol::process::events;
use tokio::time::Instant;

use super::Lease;
use super::lease::Snapshot;
use crate::error::ProxyError;
use crate::fencing::{Admitted, Fencer};
use crate::metrics as m;

/// What the data path holds for an admitted fenced request, from admission until the
/// upstream has answered and the body is done with: dropping it lets higher tokens of
/// the scope pass.
pub(crate) enum Admission {
    /// Standalone mode: admitted by the fence and the barrier alone.
    Standalone(Admitted),
    /// Fleet mode: admitted under the lease too.
    Leased(LeasedAdmission),
}

impl Admission {
    /// Admits a fenced request of the data path: under `lease` in fleet mode (the rule in
    /// the [module docs](super)), otherwise by [`Fencer::admit`] alone. An admin advance
    /// calls `Fencer::admit` directly: a higher fence only refuses more, so it needs no
    /// lease.
    pub(crate) async fn admit(
        fencer: &Arc<Fencer>,
        lease: Option<&Lease>,
        scope: &str,
        token: u64,
    ) -> Result<Self, ProxyError> {
        match lease {
            Some(lease) => admit(fencer, lease, scope, token).await.map(Self::Leased),
            None => fencer.admit(scope, token).await.map(Self::Standalone),
        }
    }

    /// Whether this request raised the fence.
    pub(crate) fn raised(&self) -> bool {
        self.admitted().raised
    }

    /// Until when may this forward run? `None` in standalone mode: no limit. In fleet
    /// mode, the end of the lease the request was admitted under: the whole request must
    /// have reached the upstream by then (a body still arriving is cut off, and the
    /// client gets 503), so that only the storage's own time to apply it is left to the
    /// write bound. A small body read whole before forwarding counts as arriving until
    /// it has been read.
    pub(crate) fn forward_until(&self) -> Option<Instant> {
        match self {
            Self::Standalone(_) => None,
            Self::Leased(leased) => Some(leased.forward_until),
        }
    }

    /// The forward ended without an answer (a timeout, a broken connection), so the
    /// storage may still apply the write. In fleet mode the admission in `slot` is taken
    /// out and kept, in a task of its own, until the write can no longer land (its
    /// lease's end plus `lease_write_bound_ms`), so that neither a higher token here nor
    /// an acknowledgement of a new term (an advance waits at the barrier) passes it
    /// meanwhile. Its completion is unknown, so it is not judged an overrun. In
    /// standalone mode there is no write bound: the admission stays in `slot`, and
    /// leaves the in-flight set as an answered one does.
    pub(crate) fn keep_while_it_may_land(slot: &mut Option<Self>) {
        let Some(Self::Leased(mut held)) = slot.take_if(|a| matches!(a, Self::Leased(_))) else {
            return;
        };
        held.overrun_check = false;
        let until = held.lands_by;
        tokio::spawn(async move {
            tokio::time::sleep_until(until).await;
            drop(held);
        });
    }

    fn admitted(&self) -> &Admitted {
        match self {
            Self::Standalone(admitted) => admitted,
            Self::Leased(leased) => &leased.admitted,
        }
    }
}

/// A request admitted under the lease: its standalone admission (the in-flight guard),
/// and the two deadlines the lease puts on it, on the proxy's monotonic clock (tokio's).
/// When it drops (the upstream has answered and the body is done with), a write that
/// completed after `lands_by` is logged and counted as a lease overrun.
pub(crate) struct LeasedAdmission {
    admitted: Admitted,
    /// The end of the lease it was admitted under: see [`Admission::forward_until`].
    forward_until: Instant,
    /// `forward_until` plus `lease_write_bound_ms`: the write must have landed by then,
    /// if at all. The nodes' release wait covers a write only up to here: a completion
    /// later is an overrun, and a forward without an answer stays in flight until then
    /// ([`Admission::keep_while_it_may_land`]).
    lands_by: Instant,
    /// Whether dropping it checks for an overrun: not once its completion is unknown.
    overrun_check: bool,
}

impl LeasedAdmission {
    /// `admitted` under the lease of `snapshot`, checked just now.
    fn new(admitted: Admitted, lease: &Lease, snapshot: Snapshot) -> Self {
        let forward_until = lease.expiry(snapshot);
        Self {
            admitted,
            forward_until,
            lands_by: forward_until + lease.write_bound,
            overrun_check: true,
        }
    }
}

impl Drop for LeasedAdmission {
    fn drop(&mut self) {
        if self.overrun_check {
            let guard = &self.admitted.guard;
            check_overrun(self.lands_by, guard.scope(), guard.token());
        }
    }
}

/// Admits a fenced request in fleet mode (the rule in the [module docs](super)): by
/// standalone admission, under a lease of exactly the request's term.
async fn admit(
    fencer: &Arc<Fencer>,
    lease: &Lease,
    scope: &str,
    token: u64,
) -> Result<LeasedAdmission, ProxyError> {
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
                let admitted = fencer.admit(scope, token).await?;
                // The last check before the request is handed to the upstream: the
                // barrier may have taken long enough for the lease to lapse.
                if let Some(snapshot) = lease.current()
                    && snapshot.term == token
                {
                    return Ok(LeasedAdmission::new(admitted, lease, snapshot));
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
            return Err(lease_expired(lease, scope, token, reason));
        }
        let result = lease.renewed_since(seen).await;
        if let Err(reason) = &result
            && lease.current().is_none()
        {
            return Err(lease_expired(lease, scope, token, reason.clone()));
        }
        renewal = Some(result);
    }
}

/// The 503 of a request that found no lease, counted. Its reason is the cluster's
/// refusal when the last round named one an operator must fix (nodes without
/// `--lease-ms`, a proxy they do not list), since that is the cause whatever this
/// request's own wait ended on; otherwise `reason`, why the wait ended.
fn lease_expired(lease: &Lease, scope: &str, token: u64, reason: String) -> ProxyError {
    metrics::counter!(m::LEASE_EXPIRED_REFUSALS).increment(1);
    ProxyError::LeaseExpired {
        scope: scope.to_owned(),
        presented: token,
        reason: lease.refusal().unwrap_or(reason),
    }
}

/// Logs and counts a write that completed after `lands_by` (its lease's expiry plus the
/// write bound); says whether it did.
pub(super) fn check_overrun(lands_by: Instant, scope: &str, token: u64) -> bool {
    let now = Instant::now();
    let overran = now > lands_by;
    if overran {
        let late_ms = u64::try_from((now - lands_by).as_millis()).unwrap_or(u64::MAX);
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
