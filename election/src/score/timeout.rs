//! The election timeout of a rank.
//!
//! raft-rs draws a follower's election timeout at random in `[min, max)` ticks whenever
//! it resets its election state; [`ScoreBoard`](super::board::ScoreBoard) overrides it
//! before every tick with this function's value, so the value raft compares with is
//! always the rank's. raft-rs asserts `min <= t < max`; the result is clamped into that
//! range, so it can never go below `election_ticks`.

/// The election timeout in ticks of a node at `rank`: `min + grace` for rank 0; for rank
/// `r > 0`, `min + grace + r * slot + jitter` with `jitter < slot` (the random part that
/// breaks ties between nodes of equal rank). Clamped into `[min, max)`; `max` must exceed
/// `min`.
///
/// `grace` ([`super::SCORE_LEASE_GRACE_TICKS`]) is why rank 0 is not exactly `min`: with
/// check-quorum, a follower ignores (pre-)vote requests while fewer than `min` ticks
/// passed since it heard the leader. Ticks of different nodes are not in phase, so a
/// candidate that campaigns on its own `min`-th tick finds some peers one tick short, is
/// ignored, and the next rank wins instead (seen in the end-to-end tests). One tick later,
/// every peer that heard the same last heartbeat has counted at least `min` ticks.
pub(crate) fn election_timeout(
    rank: usize,
    min: usize,
    max: usize,
    slot: usize,
    jitter: usize,
    grace: usize,
) -> usize {
    let first = min.saturating_add(grace);
    let wanted = if rank == 0 {
        first
    } else {
        let jitter = if slot == 0 { 0 } else { jitter % slot };
        first
            .saturating_add(rank.saturating_mul(slot))
            .saturating_add(jitter)
    };
    wanted.clamp(min, max.saturating_sub(1).max(min))
}

/// raft's `max_election_tick` with scores on: room for every rank's slot among `voters`
/// nodes, and never less than raft's default of twice the minimum.
pub(crate) fn max_election_tick(min: usize, slot: usize, voters: usize) -> usize {
    // One slot per rank, one more for the grace tick and the random part.
    let ranks = min.saturating_add(voters.saturating_add(2).saturating_mul(slot));
    ranks.max(min.saturating_mul(2)).max(min.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: rank 0 gets raft's minimum plus the grace tick, each further rank a later
    /// slot, the random part never reaches the next slot, and nothing leaves `[min,
    /// max)`. Method: ranks 0-2 with every jitter, and a rank too large for the range.
    #[test]
    fn ranks_get_later_slots_within_raft_bounds() {
        let (min, slot, grace) = (10, 2, 1);
        let max = max_election_tick(min, slot, 3);
        assert_eq!(max, 20);
        for jitter in 0..10 {
            assert_eq!(election_timeout(0, min, max, slot, jitter, grace), 11);
            let r1 = election_timeout(1, min, max, slot, jitter, grace);
            let r2 = election_timeout(2, min, max, slot, jitter, grace);
            assert!((13..15).contains(&r1), "{r1}");
            assert!((15..17).contains(&r2), "{r2}");
        }
        assert_eq!(election_timeout(50, min, max, slot, 1, grace), max - 1);
        // A degenerate range never goes below the minimum.
        assert_eq!(election_timeout(3, 10, 10, 2, 1, grace), 10);
        assert_eq!(election_timeout(0, 10, 11, 2, 0, grace), 10);
    }

    /// Goal: the range grows with the cluster so every rank of a large one has a slot.
    /// Method: 15 voters with the default slot.
    #[test]
    fn max_tick_leaves_a_slot_per_rank() {
        let max = max_election_tick(10, 2, 15);
        assert!(election_timeout(14, 10, max, 2, 1, 1) < max);
        assert!(election_timeout(14, 10, max, 2, 1, 1) > election_timeout(13, 10, max, 2, 1, 1));
    }
}
