//! Named leaderships: sessions that clients keep alive, and scopes held through them, each
//! grant with a fencing token of its own.
//!
//! - `machine`: the replicated state and the one function that changes it, with the
//!   argument for the tokens (every node applies the same entries to the same state).
//! - `entry`: the raft entries that carry the changes, and the outcomes of applying them.
//! - `lessor`: the leader's side of session lifetimes: deadlines on its monotonic clock,
//!   keepalives, the grace a new leader gives every session, and which sessions expired.
//! - `limits`: the named limits.
//!
//! `node`'s `scopes_service` is the transport-independent way in ([`crate::ScopesService`]),
//! which the HTTP routes and embedding applications share.
//!
//! The election loop owns the machine (`node`'s `scopes`) and publishes it after each
//! change; `api`'s `sessions` and `scopes` serve it; `announce`'s `grants` raises every
//! announce proxy's fence to each new grant before the campaign that asked for it answers.

pub(crate) mod entry;
pub(crate) mod lessor;
pub mod limits;
pub(crate) mod machine;

pub use entry::Refusal;
pub(crate) use entry::{Op, Outcome, ScopeEntry};
pub(crate) use lessor::Lessor;
pub(crate) use machine::Machine;

/// Per held scope, the token every announce proxy fences it at (published by the
/// leader's fencer, `announce`'s `grants`; empty elsewhere).
pub(crate) type Fenced = std::collections::BTreeMap<String, u64>;

/// A fresh session id: 128 random bits in hex, so that one client cannot guess another's
/// session (which matters without mTLS, where the id is the only credential). In the
/// simulation's deterministic mode it is the next number of the thread's counter instead
/// (unique within the run, the same in every run of a seed).
pub(crate) fn new_session_id() -> String {
    let id = crate::deterministic::next_id().unwrap_or_else(rand::random::<u128>);
    format!("{id:032x}")
}
