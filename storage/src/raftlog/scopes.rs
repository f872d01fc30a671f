//! The named-leaderships state (sessions and the scopes they hold) beside the raft log.
//!
//! The election applies its entries and hands the log the encoded state, opaque here, with
//! every batch that changed it ([`RaftLog::apply_scopes`], fsynced). Like the members
//! table it travels in snapshots: a snapshot's data is the members table's text, then,
//! when there is any state, one NUL byte and the state's bytes (the table's text never
//! holds a NUL, so a snapshot from a node without named leaderships reads the same).

use redb::{ReadableTable, Table};

use super::{RaftLog, RaftLogError};
use crate::members::MembersTable;
use crate::tables::RAFT_META;

/// `RAFT_META` key of the named-leaderships state; absent until a first change.
const META_SCOPES: &str = "scopes";

/// Separates the members table from the named-leaderships state in a snapshot's data.
const SNAPSHOT_SEPARATOR: u8 = 0;

/// A snapshot's data: the members table, then the state if there is any.
pub(super) fn snapshot_data(members: &MembersTable, scopes: &[u8]) -> Vec<u8> {
    let mut data = members.encode();
    if !scopes.is_empty() {
        data.push(SNAPSHOT_SEPARATOR);
        data.extend_from_slice(scopes);
    }
    data
}

/// The members table's bytes and the state's bytes (empty when absent) of a snapshot's
/// data.
pub(super) fn split_snapshot_data(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|b| *b == SNAPSHOT_SEPARATOR) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[]),
    }
}

/// Writes `scopes` under its key (removes the key when empty) in an open write.
pub(super) fn store_scopes(
    meta: &mut Table<'_, &'static str, &'static [u8]>,
    scopes: &[u8],
) -> Result<(), RaftLogError> {
    if scopes.is_empty() {
        meta.remove(META_SCOPES).map_err(RaftLogError::storage)?;
    } else {
        meta.insert(META_SCOPES, scopes)
            .map_err(RaftLogError::storage)?;
    }
    Ok(())
}

/// Reads the stored state (empty when none was written).
pub(super) fn load_scopes(
    meta: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<Vec<u8>, RaftLogError> {
    Ok(meta
        .get(META_SCOPES)
        .map_err(RaftLogError::storage)?
        .map(|v| v.value().to_vec())
        .unwrap_or_default())
}

impl RaftLog {
    /// The named-leaderships state last stored (empty when none was).
    pub fn scopes(&self) -> Vec<u8> {
        self.read().scopes.clone()
    }

    /// Stores the named-leaderships state after the election applied entries that changed
    /// it, in one transaction, fsynced before this returns: a restart finds it with the
    /// index it records, and a snapshot taken at the applied index carries it.
    pub fn apply_scopes(&self, scopes: &[u8]) -> Result<(), RaftLogError> {
        let txn = self.begin_write()?;
        {
            let mut meta = txn.open_table(RAFT_META).map_err(RaftLogError::storage)?;
            store_scopes(&mut meta, scopes)?;
        }
        txn.commit().map_err(RaftLogError::storage)?;
        self.write().scopes = scopes.to_vec();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Goal: a snapshot's data splits back into the table and the state it was made of,
    /// and a table without state (an older node's snapshot) reads with an empty state.
    /// Method: round trips with and without state.
    #[test]
    fn snapshot_data_splits_into_members_and_scopes() {
        let peers = BTreeMap::from([(1, "127.0.0.1:1".to_owned())]);
        let members = MembersTable::initial(&peers);
        let with = snapshot_data(&members, b"{\"index\":7}");
        let (table, scopes) = split_snapshot_data(&with);
        assert_eq!(MembersTable::decode(table).unwrap(), members);
        assert_eq!(scopes, b"{\"index\":7}");
        let without = snapshot_data(&members, b"");
        assert_eq!(without, members.encode());
        assert_eq!(split_snapshot_data(&without).1, b"");
    }

    /// Goal: the stored state survives a reopen and travels in the snapshots the log
    /// serves; installing such a snapshot elsewhere stores it there.
    /// Method: in-memory redb; store, reopen, take a snapshot, persist it into a new log.
    #[test]
    fn scopes_are_stored_reopened_and_carried_by_snapshots() {
        use std::sync::Arc;

        use raft::Storage as _;
        use redb::backends::InMemoryBackend;

        use crate::raftlog::ReadyWrite;

        let mem = || {
            Arc::new(
                redb::Database::builder()
                    .create_with_backend(InMemoryBackend::new())
                    .unwrap(),
            )
        };
        let db = mem();
        let log = RaftLog::open(Arc::clone(&db)).unwrap();
        log.initialize(&[1, 2, 3]).unwrap();
        log.apply_scopes(b"state-1").unwrap();
        drop(log);
        let log = RaftLog::open(db).unwrap();
        assert_eq!(log.scopes(), b"state-1");
        let snapshot = log.snapshot(0, 2).unwrap();
        let other = RaftLog::open(mem()).unwrap();
        other
            .persist(&ReadyWrite {
                snapshot: Some(snapshot),
                entries: Vec::new(),
                hard_state: None,
            })
            .unwrap();
        assert_eq!(other.scopes(), b"state-1");
    }
}
