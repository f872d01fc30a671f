//! Every knob of the simulation, named once. Times are virtual milliseconds on tokio's
//! paused clock; probabilities are per decision.

/// Seeds run by `cargo test -p palisade-sim` when `PALISADE_SIM_SEEDS` is unset: enough to
/// exercise every fault, few enough that a plain workspace test run stays quick.
pub const SEEDS_DEFAULT: u64 = 20;

/// Events kept, newest last, to print with a failing seed.
pub const TRACE_TAIL_EVENTS: usize = 60;

/// The cluster's size is drawn from these (odd sizes, as operators run them).
pub const NODE_COUNTS: [u64; 2] = [3, 5];
/// Proxies, each fronting a storage of its own (a fence protects one resource).
pub const PROXY_COUNT: u64 = 2;
/// Workers beside each node, which learn the token from it.
pub const WORKERS_PER_NODE: u64 = 1;

/// A node's tick. Short, so that a seed covers many elections in little CPU.
pub const TICK_MS: u64 = 20;
/// Each node's election timeout in ticks is drawn from this range (start inclusive, end
/// exclusive) once per seed: raft-rs's own randomisation is off in deterministic mode.
pub const ELECTION_TICKS_RANGE: (u64, u64) = (10, 20);
/// Heartbeat period in ticks.
pub const HEARTBEAT_TICKS: u64 = 2;

/// How long the faults run.
pub const CHAOS_MS: u64 = 12_000;
/// After the faults: everything healed and restarted, the system runs on this long, so
/// late writes and the last elections are checked too.
pub const SETTLE_MS: u64 = 3_000;
/// Gap between two fault decisions, drawn from this range.
pub const CHAOS_GAP_MS: (u64, u64) = (20, 400);
/// How long a fault lasts (a partition, a pause, a crash before its restart), drawn.
pub const FAULT_MS: (u64, u64) = (100, 2_500);
/// Period of the checker that reads every fence and every node's leadership.
pub const CHECK_PERIOD_MS: u64 = 25;

/// Message loss probability in lossy weather, per raft message.
pub const LOSS_P: f64 = 0.2;
/// Extra delay of a raft message in slow weather, drawn.
pub const NET_DELAY_MS: (u64, u64) = (1, 120);
/// Delay on the client and proxy hops (worker to proxy, proxy to storage, the answer),
/// drawn per hop.
pub const HOP_DELAY_MS: (u64, u64) = (0, 30);
/// Probability that a slow hop is very slow (a write stuck in flight behind which the
/// barrier holds higher tokens).
pub const HOP_STALL_P: f64 = 0.05;
/// The very slow hop's extra delay, drawn.
pub const HOP_STALL_MS: (u64, u64) = (100, 1_500);

/// A worker's pause between writes, drawn.
pub const THINK_MS: (u64, u64) = (5, 80);
/// Probability that a worker pauses between reading its token and sending the write: the
/// dangerous window of a GC pause.
pub const STALE_PAUSE_P: f64 = 0.03;
/// That pause's length, drawn: up to several election timeouts.
pub const STALE_PAUSE_MS: (u64, u64) = (200, 3_000);
/// Probability that a worker keeps the token it used last instead of asking its node
/// again (a client that caches its token).
pub const TOKEN_CACHE_P: f64 = 0.5;

/// The proxies' barrier deadline (`limits.barrier_timeout_ms`).
pub const BARRIER_TIMEOUT_MS: u64 = 1_000;
/// The proxies' bound on scopes (`limits.scopes_max`).
pub const SCOPES_MAX: usize = 64;

/// Delay before the announcer's advance reaches a proxy, drawn.
pub const ANNOUNCE_DELAY_MS: (u64, u64) = (0, 60);
/// Probability that an announcement to one proxy is lost (the proxy is fenced by the new
/// leader's first write instead).
pub const ANNOUNCE_LOSS_P: f64 = 0.2;

/// Node ids of members added by membership changes start here (ids are never reused).
pub const JOIN_ID_FIRST: u64 = 100;
/// Most members at once: removals and additions keep the cluster between the safe
/// minimum and this.
pub const MEMBERS_MAX: usize = 5;
/// Probability that a membership change removes a member (when it may) rather than adds.
pub const REMOVE_P: f64 = 0.5;

/// The named scopes the holders campaign for: fewer than the holders, so that they
/// contend.
pub const NAMED_SCOPES: [&str; 3] = ["billing", "ledger", "payroll"];
/// Clients of named leaderships (sessions, campaigns, grants), not raft members: twice
/// the scopes, so that campaigns queue (with four, a client trusting its session 1.5 times
/// too long went unnoticed in 10 seeds; with six, seed 0 caught it).
pub const HOLDERS: u64 = 6;
/// A session's TTL, drawn per session (the smallest the cluster accepts is 1,000 ms).
pub const SESSION_TTL_MS: (u64, u64) = (1_000, 3_001);
/// The clock-rate drift bound of the clients' loss rule, in parts per million: a client
/// trusts its session `ttl × (1 − drift)` after it sent its last answered keepalive
/// (`palisade_protocol::scopes::session_trusted_until`), with the node's default bound.
pub const DRIFT_PPM: u64 = palisade_election::LEASE_DRIFT_PPM_DEFAULT;
/// Keepalives are sent every TTL divided by this, as the clients do.
pub const KEEPALIVE_DIVISOR: u64 = 3;
/// After a keepalive that got no answer (not the leader, a lost leadership, a node
/// down), the next is tried after this, drawn.
pub const KEEPALIVE_RETRY_MS: (u64, u64) = (20, 120);
/// How often a holder looks for the answer to its call (see `holders`' `call`).
pub const CALL_POLL_MS: u64 = 5;
/// A campaign's timeout, drawn per campaign.
pub const CAMPAIGN_TIMEOUT_MS: (u64, u64) = (300, 8_000);
/// Campaigns tried (after not-leader, a lost leadership or fence-pending answers) before
/// the holder gives the session up.
pub const CAMPAIGN_TRIES: u64 = 4;
/// Writes a holder sends with one grant, drawn.
pub const HOLD_WRITES: (u64, u64) = (1, 12);
/// Pause between a holder's sessions, drawn.
pub const HOLDER_THINK_MS: (u64, u64) = (0, 300);
/// Probability that a holder pauses (a GC pause of the whole client: its keepalives
/// stop too) between checking its trust and sending a write.
pub const HOLDER_PAUSE_P: f64 = 0.06;
/// That pause's length, drawn: often longer than the session's TTL.
pub const HOLDER_PAUSE_MS: (u64, u64) = (200, 4_500);
/// How a holder ends its hold, by weight: resign (then revoke or let the session lapse),
/// revoke the session, or stop keeping it alive and let it expire while it still
/// believes it holds the scope until its trust ends.
pub const RELEASE_WEIGHTS: (u64, u64, u64) = (4, 3, 3);
