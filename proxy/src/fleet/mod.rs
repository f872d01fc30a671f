//! Fleet mode: the lease on the cluster's current term, and admission under it.
//!
//! Fleet admission is built on top of standalone admission ([`crate::fencing`]: the fence
//! check and the per-scope barrier), which knows nothing of leases: a request admitted
//! under the lease is a standalone admission wrapped in a
//! [`LeasedAdmission`](admission::LeasedAdmission), which owns the lease's deadlines. The
//! data path holds an [`Admission`] (standalone or leased) and asks it one question,
//! [`Admission::forward_until`].
//!
//! A proxy started with `cluster` (the nodes' API URLs) follows one cluster. One task
//! renews its lease with `POST /v1/lease` (one request carries the proxy's whole lease:
//! a fleet follows one scope) every third of the granted `lease_ms`. A renewal on the
//! timer asks the node that last granted first and every other node too once it refuses
//! or [`RENEW_HEDGE_MS`](renewer::RENEW_HEDGE_MS) passed; a renewal a request waits for
//! asks every node at once (see [`Renewer::run`]). The first grant wins, so a paused or
//! dead node never holds a renewal for the whole `limits.lease_renew_timeout_ms`. The
//! leader answers only after a quorum confirmed its leadership after the request arrived
//! (it may first wait to gather requests into one round), so the lease is measured from
//! when the round was *sent*, on the proxy's monotonic clock, before any of its requests:
//! it holds until `sent + lease_ms`, and a slow answer only shortens it.
//!
//! A grant whose term is above the lease's raises the scope's fence to that term first,
//! through [`Fencer::admit`](crate::fencing::Fencer::admit) as an admin advance does (so
//! the barrier waits for the lower-token writes in flight), and only then is the new term
//! published. The data path reads the lease from atomics, so an equal-token write with a
//! valid lease takes no lock and no allocation beyond standalone admission.
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
//! After the upstream has answered (when the
//! [`LeasedAdmission`](admission::LeasedAdmission) drops), a write that finished later
//! than its lease's expiry plus `lease_write_bound_ms` is logged as `lease-overrun` and
//! counted: the nodes' release wait covers writes only up to that bound.
//!
//! # Layout
//! - `lease`: [`Lease`], the lease's state (term and expiry in atomics), the renewal
//!   rounds requests wait for, and what a grant does (raise the fence, then publish).
//! - `admission`: the fleet admission rule above, `LeasedAdmission` with the lease's
//!   deadlines and the overrun check, and [`Admission`], what the data path holds.
//! - `renewer`: [`Renewer`], the renewal task, and how one round asks the nodes
//!   (`first_grant`: hedging, retries with backoff).
//! - `tests`: the fleet's unit tests.

mod admission;
mod lease;
mod renewer;
#[cfg(test)]
mod tests;

pub(crate) use admission::Admission;
pub(crate) use lease::Lease;
pub(crate) use renewer::Renewer;
pub use renewer::{RENEW_INTERVAL_MS_MIN, RENEW_RETRY_MS_MAX, RENEW_RETRY_MS_MIN};
