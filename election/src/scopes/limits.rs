//! The limits of named leaderships. Each is enforced where the state changes (so every
//! node agrees) and checked again before proposing, for a quick answer.

/// Live sessions in a cluster. Each costs about 200 bytes of state on every node and one
/// deadline on the leader; 100,000 keeps the state a few tens of MiB at most.
pub const SESSIONS_MAX: usize = 100_000;
/// Scopes held or waited for at once, in a cluster.
pub const SCOPES_MAX: usize = 100_000;
/// Sessions waiting for one scope: beyond it a queue is a sign of a runaway client.
pub const WAITERS_PER_SCOPE_MAX: usize = 1_024;
/// Scopes one session holds or waits for at once.
pub const SCOPES_PER_SESSION_MAX: usize = 1_024;
/// Shortest time between two keepalives of one session the leader accepts; a client
/// keeps alive every third of its TTL, and a TTL is at least a second.
pub const KEEPALIVE_INTERVAL_MS_MIN: u64 = 100;
/// How long the leader waits for an expiry it proposed to be applied before proposing it
/// again (a proposal can be lost when leadership moves).
pub const EXPIRY_RETRY_MS: u64 = 1_000;
/// Expiries proposed in one tick: a leader that finds many sessions expired at once (its
/// clock was stopped) spreads them over a few ticks instead of one huge batch.
pub const EXPIRIES_PER_TICK_MAX: usize = 256;
