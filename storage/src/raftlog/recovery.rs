//! The way out for a cluster that lost its quorum for good (`palisade node
//! --force-new-cluster`): one surviving node rewrites its stored configuration so that it
//! is the only voter, keeping its log, its hard state and so its term.
//!
//! Keeping the term is what keeps fencing tokens increasing: the node's next election
//! raises its term above every term it stored, so its first token is higher than every
//! token it ever saw (pick the survivor with the highest term: terms the others reached
//! and this node never saw stay unknown to it).
//!
//! The rewrite is marked (`RAFT_META`'s `forced_new_cluster`, the log's last index at the
//! rewrite), so that the flag left on by mistake never throws out members added since:
//! a node started again with the flag whose membership changed since the mark refuses to
//! start. A start without the flag clears the mark, so that a later loss of quorum can be
//! recovered the same way.

use raft::eraftpb::ConfState;
use redb::ReadableDatabase as _;

use super::{RaftLog, RaftLogError, encode};
use crate::members::MembersTable;
use crate::tables::RAFT_META;

/// `RAFT_META` key of the recovery mark: the last log index when the configuration was
/// rewritten, 8 bytes little-endian.
const META_FORCED: &str = "forced_new_cluster";

/// What [`RaftLog::force_new_cluster`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct ForcedCluster {
    /// The configuration before the rewrite (equal to the new one when `already`).
    pub previous: ConfState,
    /// The ids the rewrite marked removed in the members table: every other member. They
    /// are never accepted again.
    pub removed: Vec<u64>,
    /// The stored term, which the next election raises.
    pub term: u64,
    /// The log's last index at the rewrite; membership entries up to it are never applied
    /// again (they belong to the configuration the rewrite replaced).
    pub index: u64,
    /// The flag was given again on a node already rewritten, whose membership did not
    /// change since: nothing was written.
    pub already: bool,
}

impl RaftLog {
    /// Makes `own_id` the only voter of this log's configuration, durably, in one
    /// transaction: the conf state becomes `{voters: [own_id]}` (no learners, no joint
    /// configuration), every other member of the members table is marked removed, the
    /// table's index becomes the last log index (so no membership entry already in the
    /// log is applied again), and the recovery mark is written. The entries and the hard
    /// state (term, vote, commit) are kept.
    ///
    /// Refused when the log was never initialized (there is nothing to recover), when
    /// `own_id` is not a member of it, and when the log was rewritten before and its
    /// membership changed since the mark (the flag was left on; see the module docs).
    pub fn force_new_cluster(&self, own_id: u64) -> Result<ForcedCluster, RaftLogError> {
        let core = self.read().clone();
        let previous = core.conf_state.clone();
        let refused = |why: String| RaftLogError::Recovery(why);
        if !self.is_initialized() {
            return Err(refused(
                "the raft log is empty: --force-new-cluster recovers a node that was a member \
                 of a cluster; start a new cluster with --peers instead"
                    .to_owned(),
            ));
        }
        let in_conf = previous
            .voters
            .iter()
            .chain(&previous.voters_outgoing)
            .chain(&previous.learners)
            .chain(&previous.learners_next)
            .any(|&id| id == own_id);
        if !in_conf && !core.members.is_member(own_id) {
            return Err(refused(format!(
                "node {own_id} is not a member of the configuration in this log ({:?}): \
                 recover with the node that owns this data directory",
                previous.voters
            )));
        }
        let alone = ConfState {
            voters: vec![own_id],
            ..ConfState::default()
        };
        if let Some(mark) = self.forced_mark()? {
            let unchanged = previous == alone && core.members.index <= mark;
            if unchanged {
                return Ok(ForcedCluster {
                    previous,
                    removed: Vec::new(),
                    term: core.hard_state.term,
                    index: mark,
                    already: true,
                });
            }
            return Err(refused(format!(
                "this node already started a new cluster with --force-new-cluster (at index \
                 {mark}) and its membership changed since (voters {:?}, learners {:?}): the \
                 flag was left on; start without it (running it again would throw out the \
                 members added since)",
                previous.voters, previous.learners
            )));
        }
        let index = core.last_index();
        let mut table = if core.members.is_empty() {
            // A log written before members tables: its voters are the members; their
            // addresses are unknown here and never dialed again.
            MembersTable::initial(
                &previous
                    .voters
                    .iter()
                    .map(|&id| (id, "unknown:1".to_owned()))
                    .collect(),
            )
        } else {
            core.members.clone()
        };
        let mut removed = Vec::new();
        for (&id, record) in &mut table.records {
            if id != own_id && !record.removed {
                record.removed = true;
                removed.push(id);
            }
        }
        table.index = table.index.max(index);
        let mut boundary = core.boundary.clone();
        boundary.set_conf_state(alone.clone());
        let txn = self.begin_write()?;
        {
            let mut meta = txn.open_table(RAFT_META).map_err(RaftLogError::storage)?;
            meta.insert(
                super::META_CONF_STATE,
                encode("conf state", &alone)?.as_slice(),
            )
            .map_err(RaftLogError::storage)?;
            meta.insert(super::META_MEMBERS, table.encode().as_slice())
                .map_err(RaftLogError::storage)?;
            meta.insert(
                super::META_SNAPSHOT,
                encode("snapshot metadata", &boundary)?.as_slice(),
            )
            .map_err(RaftLogError::storage)?;
            meta.insert(META_FORCED, index.to_le_bytes().as_slice())
                .map_err(RaftLogError::storage)?;
        }
        txn.commit().map_err(RaftLogError::storage)?;
        let mut cache = self.write();
        cache.conf_state = alone;
        cache.members = table;
        cache.boundary = boundary;
        Ok(ForcedCluster {
            previous,
            removed,
            term: core.hard_state.term,
            index,
            already: false,
        })
    }

    /// Clears the recovery mark (a start without `--force-new-cluster`), so that a later
    /// loss of quorum can be recovered again. Writes nothing when there is no mark.
    pub fn clear_forced_mark(&self) -> Result<(), RaftLogError> {
        if self.forced_mark()?.is_none() {
            return Ok(());
        }
        let txn = self.begin_write()?;
        {
            let mut meta = txn.open_table(RAFT_META).map_err(RaftLogError::storage)?;
            meta.remove(META_FORCED).map_err(RaftLogError::storage)?;
        }
        txn.commit().map_err(RaftLogError::storage)
    }

    /// The recovery mark, `None` when this log was not rewritten (or started without the
    /// flag since).
    pub fn forced_mark(&self) -> Result<Option<u64>, RaftLogError> {
        let txn = self.db.begin_read().map_err(RaftLogError::storage)?;
        let meta = txn.open_table(RAFT_META).map_err(RaftLogError::storage)?;
        let Some(value) = meta.get(META_FORCED).map_err(RaftLogError::storage)? else {
            return Ok(None);
        };
        let bytes: [u8; 8] = value.value().try_into().map_err(|_| {
            RaftLogError::Corrupt(format!(
                "the recovery mark holds {} bytes, expected 8",
                value.value().len()
            ))
        })?;
        Ok(Some(u64::from_le_bytes(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use raft::Storage as _;
    use raft::eraftpb::{Entry, HardState};
    use redb::Database;
    use redb::backends::InMemoryBackend;

    use super::*;
    use crate::raftlog::ReadyWrite;

    fn log_of_three_in_joint() -> RaftLog {
        let db = Arc::new(
            Database::builder()
                .create_with_backend(InMemoryBackend::new())
                .unwrap(),
        );
        let log = RaftLog::open(db).unwrap();
        let peers: BTreeMap<u64, String> = (1..=3)
            .map(|id| (id, format!("127.0.0.1:700{id}")))
            .collect();
        log.initialize_members(&peers).unwrap();
        log.persist(&ReadyWrite {
            entries: (1..=5)
                .map(|index| Entry {
                    index,
                    term: 7,
                    ..Entry::default()
                })
                .collect(),
            hard_state: Some(HardState {
                term: 7,
                vote: 2,
                commit: 4,
                ..HardState::default()
            }),
            ..ReadyWrite::default()
        })
        .unwrap();
        // A joint configuration that can never complete: 4, 5 and 6 were added and are
        // gone.
        let joint = ConfState {
            voters: vec![1, 2, 3, 4, 5, 6],
            voters_outgoing: vec![1, 2, 3, 4, 5],
            auto_leave: true,
            ..ConfState::default()
        };
        let mut table = log.members();
        for id in 4..=6 {
            table.records.insert(
                id,
                crate::MemberRecord {
                    peer: format!("127.0.0.1:700{id}"),
                    removed: false,
                },
            );
        }
        table.index = 3;
        log.apply_membership(&joint, &table).unwrap();
        log
    }

    /// Goal: the recovery leaves this node the only voter and keeps what keeps tokens
    /// increasing (term, vote, commit, entries), marks the others removed, and skips the
    /// membership entries already in the log. Method: a log of six voters stuck in a joint
    /// configuration; force node 1; read everything back through a fresh open.
    #[test]
    fn force_new_cluster_keeps_the_log_and_term_and_leaves_one_voter() {
        let log = log_of_three_in_joint();
        let forced = log.force_new_cluster(1).unwrap();
        assert!(!forced.already);
        assert_eq!(forced.removed, vec![2, 3, 4, 5, 6]);
        assert_eq!((forced.term, forced.index), (7, 5));
        let again = RaftLog::open(Arc::clone(&log.db)).unwrap();
        let state = again.initial_state().unwrap();
        assert_eq!(state.conf_state.voters, vec![1]);
        assert!(state.conf_state.voters_outgoing.is_empty() && !state.conf_state.auto_leave);
        assert_eq!(
            (
                state.hard_state.term,
                state.hard_state.vote,
                state.hard_state.commit
            ),
            (7, 2, 4)
        );
        assert_eq!(again.last_index().unwrap(), 5);
        let table = again.members();
        assert_eq!(table.members().keys().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!(table.removed(), vec![2, 3, 4, 5, 6]);
        assert_eq!(table.index, 5);
        assert_eq!(again.forced_mark().unwrap(), Some(5));
    }

    /// Goal: the flag left on is harmless while nothing changed, refused once members
    /// were added since, and a start without it clears the mark. Method: force twice;
    /// add a learner; force again; clear the mark; force again.
    #[test]
    fn forcing_again_is_a_no_op_then_refused_after_changes_until_cleared() {
        let log = log_of_three_in_joint();
        log.force_new_cluster(1).unwrap();
        let twice = log.force_new_cluster(1).unwrap();
        assert!(twice.already);
        let mut table = log.members();
        table.records.insert(
            7,
            crate::MemberRecord {
                peer: "127.0.0.1:7007".to_owned(),
                removed: false,
            },
        );
        table.index = 9;
        let grown = ConfState {
            voters: vec![1],
            learners: vec![7],
            ..ConfState::default()
        };
        log.apply_membership(&grown, &table).unwrap();
        let err = log.force_new_cluster(1).unwrap_err();
        assert!(
            matches!(err, RaftLogError::Recovery(ref why) if why.contains("left on")),
            "{err}"
        );
        log.clear_forced_mark().unwrap();
        assert_eq!(log.forced_mark().unwrap(), None);
        let forced = log.force_new_cluster(1).unwrap();
        assert_eq!(forced.removed, vec![7]);
    }

    /// Goal: a log that is not this node's, or no log at all, is refused. Method: force
    /// id 9 on a log of 1..=6; force an empty log.
    #[test]
    fn force_new_cluster_refuses_a_foreign_or_empty_log() {
        let log = log_of_three_in_joint();
        assert!(matches!(
            log.force_new_cluster(9),
            Err(RaftLogError::Recovery(_))
        ));
        let empty = RaftLog::open(Arc::new(
            Database::builder()
                .create_with_backend(InMemoryBackend::new())
                .unwrap(),
        ))
        .unwrap();
        assert!(matches!(
            empty.force_new_cluster(1),
            Err(RaftLogError::Recovery(_))
        ));
    }
}
