//! Models of the proxy fleet's protocol and of named leaderships, checked exhaustively
//! with `stateright`.
//!
//! The fleet protocol is described in `docs/fleet.md`: proxies hold leases on the cluster's
//! current term, renewed with a quorum confirmation; a new leader's token is released
//! once every proxy has acknowledged the new term or once every older lease has
//! certainly expired and every write admitted under it has landed. This crate states
//! that protocol as a finite transition system ([`FleetModel`]) and lets `stateright`
//! visit every reachable state for small bounds, checking the one safety invariant: the
//! storage never applies a write with a lower token after one with a higher token.
//! Named leaderships (`docs/scopes.md`) are a second, separate model ([`scopes`]),
//! built the same way; its module docs say what it covers.
//!
//! The model is deliberately more permissive than the real processes wherever that
//! only adds behaviours: a proxy may refuse any write at any time (409, 503, a timeout),
//! renew at any time, and accept any grant that reaches it; any message may be lost,
//! delayed or reordered; any process may pause for any number of ticks. Every real run
//! is then one of the model's runs, so a state the model cannot reach is one the
//! processes cannot reach either, within the bounds.
//!
//! # Layout
//!
//! - [`model`]: the bounds ([`Bounds`]), the release rule under test ([`ReleaseWait`]),
//!   the state ([`FleetState`], [`ProxyState`], [`Msg`]), the actions ([`Action`]), the
//!   properties ([`FleetModel`]'s `properties`, named by the `PROP_*` consts), and the
//!   symmetry reduction over interchangeable proxies (`Representative` for
//!   [`FleetState`]).
//! - `tests/fleet.rs`: the exhaustive checks (the protocol as designed, two proxies by
//!   default, three with `--ignored`) and the counterexamples (the release wait removed
//!   or shortened, the barrier letting go of a write the storage may still apply).
//!   `PALISADE_MODEL_DEEP=1` gives each leader two writes.
//! - [`scopes`]: named leaderships (`docs/scopes.md`): sessions kept alive on the
//!   leader's clock, expiry, a failover with the new leader's TTL grace, grants with
//!   growing tokens, fence on grant, and the client's loss rule; its own `Bounds`,
//!   `State`, `Action` and `PROP_*` names, and switches that remove each rule.
//! - `tests/scopes.rs`: its exhaustive checks and the counterexamples (the grace, fence
//!   on grant or the loss rule's drift term removed, a deposed leader answering
//!   keepalives).
#![deny(missing_docs)]

pub mod model;
pub mod scopes;

pub use model::{
    Action, Bounds, FleetModel, FleetState, Forward, Lease, Msg, PROP_NEW_LEADER_WRITES,
    PROP_OLD_WRITE_LANDS_AFTER_ELECTION, PROP_ORDERED, PROP_RELEASED_BY_ACKS, ProxyState,
    ReleaseWait,
};
