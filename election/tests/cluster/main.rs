//! Election nodes in process, one test binary with a module per topic: elections,
//! transfers and restarts on tokio's paused clock over the in-memory network; membership
//! changes; leaders placed by score; fleet leases and the token's release; announcing the
//! token to proxies (with its proof, over https); signed tokens; the real TCP transport
//! and API; mutual TLS; and hostile peers. (The log events have a binary of their own,
//! `events`: see there why.)
//!
//! Waits are for conditions, with deadlines (`palisade_cluster::wait`), on tokio's clock:
//! virtual time in the tests that pause it, so they cost no real time.
// Test helpers may panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod announce;
mod elections;
mod lease;
mod members;
mod members_safety;
mod proof;
mod scopes;
mod scores;
mod tcp;
mod tls;
mod trust_peer;
