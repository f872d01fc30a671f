//! The node's limits and defaults: each a named constant saying why it is what it is.

/// Default tick period. 50-100 ms is short enough for a failover in about a second, and
/// long enough that a busy machine does not miss heartbeats.
pub const TICK_MS_DEFAULT: u64 = 100;
/// Lower bound on the tick period: below this, timer jitter dominates.
pub const TICK_MS_MIN: u64 = 1;
/// Upper bound on the tick period: a minute per tick is certainly a mistake.
pub const TICK_MS_MAX: u64 = 60_000;
/// Default election timeout in ticks: 5, that is 500 ms at the default 100 ms tick. With
/// the default score oracle ([`crate::SCORE_ORACLE_DEFAULT`]) the best-ranked follower
/// campaigns `election_ticks + 1` ticks after the last heartbeat it heard, and the next
/// ranks a slot of 2 ticks apart after it; with `--score-oracle off`, raft draws the
/// timeout in `[n, 2n)`.
///
/// Why 500 ms is safe: the heartbeat is one tick (100 ms), so a follower must miss five
/// heartbeats in a row before it may campaign; one lost or late heartbeat, or a
/// scheduler stall of a few hundred milliseconds, never starts an election. Pre-vote
/// keeps a follower that only lost touch from raising the term of a healthy cluster,
/// and a candidate still needs a majority with an up-to-date log, so the timeout only
/// decides how soon a failure is acted on, never who may win. A spurious election would
/// cost a term (and a fence advance), not safety. Measured: 10-minute soaks under proxy
/// load on a busy 2-core machine (`tests/bench/soak_elections.sh`, load average up to 6)
/// saw no election, and failover against etcd at its defaults dropped from 0.94x to
/// under 0.5x of etcd's (docs/benchmarks.md, "Failover against etcd").
///
/// Why not shorter: check-quorum makes the leader step down after one election timeout
/// without a quorum's answer, so a timeout of two or three heartbeats would let one
/// slow fsync round on a loaded machine depose a healthy leader.
pub const ELECTION_TICKS_DEFAULT: u64 = 5;
/// Upper bound on the election timeout in ticks.
pub const ELECTION_TICKS_MAX: u64 = 10_000;
/// Default heartbeat interval in ticks. One tick keeps followers' election timers far from
/// expiring even when one heartbeat is lost (1-2 ticks is the usual choice).
pub const HEARTBEAT_TICKS_DEFAULT: u64 = 1;
/// Most peers (voters, self included) a cluster may name.
pub const PEERS_MAX: usize = 15;
/// Most `--announce` proxies.
pub const ANNOUNCE_URLS_MAX: usize = 64;
/// Default of `max_term_gap`: a peer message whose term is more than this many terms above
/// this node's is refused. A healthy cluster moves a few terms per failure, so 1,000 is
/// years of churn, while one forged term cannot drag the cluster (and the fence) far ahead.
pub const MAX_TERM_GAP_DEFAULT: u64 = 1_000;
/// Default of `lease_drift_ppm`: 1% (10,000 parts per million). Quartz and the kernel's
/// monotonic clock drift by tens of ppm; 1% leaves two orders of magnitude of margin
/// for virtual machines whose clocks are slewed or stepped in rate.
pub const LEASE_DRIFT_PPM_DEFAULT: u64 = 10_000;
/// Upper bound (exclusive) of `lease_drift_ppm`: a clock-rate error of 100% would mean a
/// clock that may stand still, and no wait would bound a lease measured on it.
pub const LEASE_DRIFT_PPM_LIMIT: u64 = 1_000_000;
/// Default of `lease_write_bound_ms`: the time from a proxy's last lease check to the
/// storage applying the write it admitted. Half a second covers a loaded loopback or LAN
/// hop; a proxy logs and counts every write that overran it.
pub const LEASE_WRITE_BOUND_MS_DEFAULT: u64 = 500;
/// Upper bound of `lease_ms` and `lease_write_bound_ms`: a new leader with a dead proxy
/// waits about their sum before releasing its token, and more than ten minutes of
/// write unavailability per failover is certainly a mistake.
pub const LEASE_MS_MAX: u64 = 600_000;
/// Lower bound of `lease_ms` in milliseconds, whatever the heartbeat.
pub const LEASE_MS_MIN: u64 = 50;
/// Lower bound of `lease_ms` in heartbeat intervals (`heartbeat_ticks * tick_ms`). A
/// proxy renews every third of its lease, and a renewal costs the leader one heartbeat
/// round to a quorum; a lease shorter than three heartbeat intervals would leave a
/// renewal less than one heartbeat interval to be answered, so leases would lapse on an
/// ordinary delayed heartbeat and writes would turn to 503 on a healthy cluster.
pub const LEASE_HEARTBEATS_MIN: u64 = 3;
/// Smallest `audit_log_bytes_max`: a few records' worth; a smaller file would rotate at
/// every line.
pub const AUDIT_LOG_BYTES_MIN: u64 = 1024;

/// Largest frame accepted or sent on a peer connection, in bytes. raft messages here are
/// small (an election cluster replicates one empty entry per term); the bound stops a
/// hostile or broken peer from making us allocate without limit. It does not bound the
/// nesting of a frame enough to matter (two bytes a protobuf group: about 2.1 million
/// levels); what keeps RUSTSEC-2024-0437 away is protobuf 2.28 skipping unknown groups
/// without recursion (docs/security.md, "Known advisories").
pub const FRAME_BYTES_MAX: usize = 4 * 1024 * 1024;
/// raft's `max_size_per_msg`: the entry bytes of one append, well under [`FRAME_BYTES_MAX`].
pub const RAFT_MSG_BYTES_MAX: u64 = 1024 * 1024;
/// raft's `max_inflight_msgs`: appends pipelined per follower. The peer queue holds more.
pub const RAFT_INFLIGHT_MSGS_MAX: usize = 64;
/// Messages queued for one peer's writer. More than raft's in-flight appends plus a round of
/// heartbeats and votes; when full, messages are dropped and the peer reported unreachable.
pub const PEER_QUEUE_MAX: usize = 256;
/// The largest score magnitude a frame may carry (and a static `--score` may have): far
/// beyond any sensible score, and small enough that differences and margins stay exact
/// in an `f64`.
pub const SCORE_ABS_MAX: f64 = 1e12;
