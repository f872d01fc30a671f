//! The leader's safety rules for membership changes: a change must never leave the
//! cluster without a reachable quorum, and a learner becomes a voter only once it has
//! caught up.
//!
//! Only the leader knows who is reachable (raft's `Progress` of each peer: whether it
//! answered recently, and how far its log matches), so these rules run on the leader, for
//! the changes it is asked for and for those a follower forwards to it. The rules every
//! node applies the same way at apply time are in the parent module.
//!
//! - Adding a member never changes the voters: it joins as a learner.
//! - A learner is promoted (automatically, by the leader) only when it acknowledged
//!   entries up to within [`PROMOTE_LAG_ENTRIES_MAX`] of the leader's last index, it was
//!   heard from within the last election timeout, and the voters after the promotion
//!   still have a reachable quorum.
//! - Removing a voter is refused when the voters left would have no reachable quorum,
//!   and, unless forced, when fewer than [`VOTERS_SAFE_MIN`] voters would be left.
//! - Removing a learner changes no quorum and is always safe.

use std::collections::{BTreeMap, BTreeSet};

use super::{MemberChange, MemberError};

/// Voters a cluster keeps unless a removal is forced: with three, one failure still
/// leaves a quorum; with two or one, any failure stops the cluster.
pub const VOTERS_SAFE_MIN: usize = 3;

/// A learner is promoted once its log matches the leader's to within this many entries.
/// The log of an election cluster holds a few entries per term, so a learner this close
/// catches up with one append once it votes.
pub const PROMOTE_LAG_ENTRIES_MAX: u64 = 16;

/// What the leader knows of its peers when it checks a change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Reach {
    /// The voters (the incoming configuration).
    pub(crate) voters: BTreeSet<u64>,
    /// The learners (staged ones included).
    pub(crate) learners: BTreeSet<u64>,
    /// The ids the leader heard from within the last election timeout, itself included.
    pub(crate) reachable: BTreeSet<u64>,
    /// Each peer's matched index (how far its log is known to match the leader's).
    pub(crate) matched: BTreeMap<u64, u64>,
    /// The leader's last log index.
    pub(crate) last_index: u64,
}

/// The part of [`Reach::check`] any node decides from its own configuration (a follower
/// checks it before forwarding): a removal that would leave fewer than
/// [`VOTERS_SAFE_MIN`] of `voters` needs force.
pub(crate) fn check_voter_count(
    voters: &BTreeSet<u64>,
    change: &MemberChange,
) -> Result<(), MemberError> {
    match change {
        MemberChange::Remove { id, force: false } if voters.contains(id) => {
            let left = voters.len() - 1;
            if left < VOTERS_SAFE_MIN {
                return Err(MemberError::BelowSafeMinimum {
                    id: *id,
                    voters: left,
                });
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Votes a quorum of `voters` needs.
pub(crate) fn quorum(voters: usize) -> usize {
    voters / 2 + 1
}

impl Reach {
    /// Whether `change` keeps a reachable quorum (and, for a promotion, whether the
    /// learner caught up); `Ok` for changes that do not touch the voters.
    pub(crate) fn check(&self, change: &MemberChange) -> Result<(), MemberError> {
        match change {
            MemberChange::Promote { id } => {
                if self.voters.contains(id) {
                    return Err(MemberError::AlreadyVoter { id: *id });
                }
                if !self.learners.contains(id) {
                    return Err(MemberError::NotAMember { id: *id });
                }
                let matched = self.matched.get(id).copied().unwrap_or(0);
                let active = self.reachable.contains(id);
                // matched 0: it never acknowledged anything, however short the log.
                let behind = matched == 0
                    || matched.saturating_add(PROMOTE_LAG_ENTRIES_MAX) < self.last_index;
                if !active || behind {
                    return Err(MemberError::NotCaughtUp {
                        id: *id,
                        matched,
                        last_index: self.last_index,
                        active,
                    });
                }
                let mut after = self.voters.clone();
                after.insert(*id);
                self.check_quorum(&format!("promoting learner {id}"), &after)
            }
            MemberChange::Remove { id, .. } if self.voters.contains(id) => {
                check_voter_count(&self.voters, change)?;
                let mut after = self.voters.clone();
                after.remove(id);
                self.check_quorum(&format!("removing voter {id}"), &after)
            }
            MemberChange::Add { .. }
            | MemberChange::Remove { .. }
            | MemberChange::Announce { .. } => Ok(()),
        }
    }

    /// Whether the voters `after` would still have a reachable quorum.
    fn check_quorum(&self, what: &str, after: &BTreeSet<u64>) -> Result<(), MemberError> {
        let reachable = after
            .iter()
            .filter(|id| self.reachable.contains(id))
            .count();
        let needed = quorum(after.len());
        if reachable >= needed {
            return Ok(());
        }
        Err(MemberError::QuorumUnreachable {
            change: what.to_owned(),
            voters: after.len(),
            quorum: needed,
            reachable,
            unreachable: after
                .iter()
                .filter(|id| !self.reachable.contains(id))
                .copied()
                .collect(),
        })
    }

    /// The first learner the leader may promote now, if any.
    pub(crate) fn promotable(&self) -> Option<u64> {
        self.learners
            .iter()
            .copied()
            .find(|&id| self.check(&MemberChange::Promote { id }).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leader 1 with voters 1..=3 (`up` of them reachable) and learner 4, at index 40.
    fn reach(up: &[u64], learner_matched: u64) -> Reach {
        Reach {
            voters: BTreeSet::from([1, 2, 3]),
            learners: BTreeSet::from([4]),
            reachable: up.iter().copied().chain([1]).collect(),
            matched: BTreeMap::from([(2, 40), (3, 40), (4, learner_matched)]),
            last_index: 40,
        }
    }

    fn remove(id: u64, force: bool) -> MemberChange {
        MemberChange::Remove { id, force }
    }

    /// Goal: a learner is promoted only once it is reachable and caught up, and only when
    /// the larger voter set keeps a reachable quorum. Method: a learner far behind, one
    /// caught up, one caught up but silent, one caught up while two voters are down.
    #[test]
    fn learner_is_promoted_only_when_caught_up_and_safe() {
        let behind = reach(&[2, 3, 4], 3);
        assert!(matches!(
            behind.check(&MemberChange::Promote { id: 4 }),
            Err(MemberError::NotCaughtUp {
                id: 4,
                matched: 3,
                last_index: 40,
                active: true
            })
        ));
        assert_eq!(behind.promotable(), None);
        // A log shorter than the lag: a learner that acknowledged nothing is not caught up.
        let never = Reach {
            last_index: 4,
            ..reach(&[2, 3, 4], 0)
        };
        assert!(matches!(
            never.check(&MemberChange::Promote { id: 4 }),
            Err(MemberError::NotCaughtUp { matched: 0, .. })
        ));
        let ready = reach(&[2, 3, 4], 40 - PROMOTE_LAG_ENTRIES_MAX);
        assert_eq!(ready.promotable(), Some(4));
        let silent = reach(&[2, 3], 40);
        assert_eq!(silent.promotable(), None);
        // Voters 1, 2, 3 with only 1 up: promoting 4 would need 3 of 4, 2 are reachable.
        let lonely = reach(&[4], 40);
        assert!(matches!(
            lonely.check(&MemberChange::Promote { id: 4 }),
            Err(MemberError::QuorumUnreachable {
                voters: 4,
                quorum: 3,
                reachable: 2,
                ..
            })
        ));
        assert!(matches!(
            ready.check(&MemberChange::Promote { id: 2 }),
            Err(MemberError::AlreadyVoter { id: 2 })
        ));
    }

    /// Goal: removals never leave an unreachable quorum, and go below three voters only
    /// when forced; learners are removed freely. Method: remove from 3 voters with all up,
    /// with one down, forced and not; remove the learner.
    #[test]
    fn removal_keeps_a_reachable_quorum_and_three_voters_unless_forced() {
        let all_up = reach(&[2, 3], 40);
        assert!(matches!(
            all_up.check(&remove(3, false)),
            Err(MemberError::BelowSafeMinimum { id: 3, voters: 2 })
        ));
        assert_eq!(all_up.check(&remove(3, true)), Ok(()));
        assert_eq!(all_up.check(&remove(4, false)), Ok(()));
        // 3 is down: removing 2 (up) leaves {1, 3}, which needs both.
        let three_down = reach(&[2], 40);
        let err = three_down.check(&remove(2, true)).unwrap_err();
        assert_eq!(
            err,
            MemberError::QuorumUnreachable {
                change: "removing voter 2".to_owned(),
                voters: 2,
                quorum: 2,
                reachable: 1,
                unreachable: vec![3],
            }
        );
        assert!(err.to_string().contains("1 of them"), "{err}");
        // Removing the dead one instead is fine (forced: two voters left).
        assert_eq!(three_down.check(&remove(3, true)), Ok(()));
        // Five voters, two down: removing a live one leaves 4 voters, 2 reachable < 3.
        let five = Reach {
            voters: BTreeSet::from([1, 2, 3, 4, 5]),
            reachable: BTreeSet::from([1, 2, 3]),
            ..Reach::default()
        };
        assert!(matches!(
            five.check(&remove(3, false)),
            Err(MemberError::QuorumUnreachable {
                quorum: 3,
                reachable: 2,
                ..
            })
        ));
        assert_eq!(five.check(&remove(5, false)), Ok(()));
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(4), 3);
    }
}
