//! The election loop: the one task that owns the `RawNode`, and the ways into it.
//!
//! One task owns the `RawNode` (no `Arc<Mutex<RawNode>>`). Everything else talks to it
//! through one bounded inbox of `Msg`: peer traffic from the transport (which delivers
//! its own `Inbound` type; the inbox's message converts from it), transfer requests from
//! the API or the embedding application, and the announcer's reports. Ticks come from a
//! `tokio::time::interval` with `MissedTickBehavior::Delay`, so a node that was paused
//! does not fire a burst of ticks (and a spurious election) when it resumes.
//!
//! After every wake-up the loop handles raft's `Ready` in the order raft-rs documents for
//! `RawNode` and then publishes a [`Leadership`](crate::Leadership) on a watch channel.
//!
//! The loop knows nothing of what runs around it: `crate::start` prepares its parts, binds
//! the transport and the API, runs the announcers, and spawns it ([`spawn`]). The loop
//! publishes what others follow (the leadership, the members, the announce list) on watch
//! channels.
//!
//! # Layout
//! - `mod.rs` (this file): the re-exports of the loop's public names.
//! - `inbox`: `Msg`, the inbox's one message type, its limits, and the replies requests
//!   carry.
//! - `setup`: the loop's parts (`LoopParts`) and [`spawn`], with the limits that follow
//!   from the configuration.
//! - `error`: [`NodeError`], [`TransferError`], [`LeaseError`].
//! - `handle`: [`NodeHandle`] and `Commands`, the ways into a running loop.
//! - `ready`: `ElectionLoop`, the task that owns the `RawNode` and handles each `Ready`.
//!   The files below are further `impl` blocks of it, one concern each.
//! - `transfer`: starting leadership transfers and answering them once decided.
//! - `publish`: turning raft's state into the published leadership, signing each new
//!   token's proof.
//! - `lease_rounds`: lease requests gathered into `ReadIndex` rounds, answered once a
//!   quorum confirms this node's leadership (the HTTP side is `crate::api`'s `lease`).
//! - `membership`: membership changes in the loop (proposing, applying with the members
//!   table, snapshots), and the wiped-storage stop.
//! - `promote`: the leader's watch over the membership: who it hears from, promoting
//!   learners that caught up, leaving a joint configuration, and checking the changes
//!   followers forward.
//! - `guard`: the last check of every peer message before `step` (defence in depth).
//! - `scopes_service`: [`ScopesService`], named leaderships in process: what the HTTP
//!   routes and an embedding application share (the loop's side is `scopes`), and
//!   `scope_error`, its [`ScopeError`].
//! - `signer`: loading `--token-key` and `--announce-token-file`, and signing proofs.

mod error;
mod guard;
mod handle;
mod inbox;
mod lease_rounds;
mod membership;
mod promote;
mod publish;
mod ready;
mod scope_error;
mod scopes;
mod scopes_service;
mod setup;
mod signer;
mod transfer;

pub use error::{LeaseError, NodeError, TransferError};
pub use guard::TERM_ACCEPTED_MAX;
pub(crate) use handle::Commands;
pub use handle::NodeHandle;
pub use inbox::INBOX_MAX;
#[cfg(test)]
pub(crate) use inbox::Msg;
pub use lease_rounds::{LEASE_GATHER_LEASE_DIVISOR, LEASE_GATHER_MS_MAX, LEASE_ROUND_TIMEOUT_MS};
pub use scope_error::ScopeError;
pub(crate) use scopes::{ScopeCallError, ScopesLoop};
pub(crate) use scopes_service::ScopesParts;
pub use scopes_service::ScopesService;
pub use setup::TRANSFER_TIMEOUT_ELECTIONS;
pub(crate) use setup::{LoopParts, spawn};
pub use signer::KEY_FILE_BYTES_MAX;
pub(crate) use signer::{TokenSigner, load_bearer};
