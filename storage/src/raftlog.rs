//! `raft::Storage` on redb.
//!
//! The log keeps everything raft needs to restart: the entries after the compaction
//! boundary, the hard state (term, vote, commit), the conf state, and the boundary itself
//! (index, term and conf state of the last compacted entry), and the members table
//! ([`MembersTable`]: the peer addresses raft's conf state does not hold). An election
//! cluster has no other state machine, so a snapshot is its metadata (taken at the applied
//! index, with the conf state) plus the members table as its data.
//!
//! redb is the source of truth: [`RaftLog::open`] loads every table into an in-memory cache
//! and checks it, and every write commits its redb transaction **before** the cache changes,
//! so the cache never shows raft anything that is not durable.
//!
//! # Durability
//! redb 4 has exactly two durability levels: `Durability::Immediate` (fsynced before
//! `commit` returns) and `Durability::None` (kept in memory only until a later `Immediate`
//! commit; lost on a crash). There is no `Eventual`. Every write in this module commits with
//! `Immediate`, whether or not raft's `Ready::must_sync()` asked for it:
//! - `must_sync()` is true whenever entries, a snapshot, the term or the vote change; these
//!   must be on disk before the messages that depend on them are sent.
//! - The only writes raft lets go unsynced are advances of the commit index. Losing one is
//!   safe in raft terms, but it is still a hard state change, and in an election cluster it
//!   happens about once per term (the leader's no-op), so fsyncing it costs nothing
//!   measurable and spares the reader from reasoning about half-durable hard states.
//!
//! A `Ready` with nothing to store writes nothing at all.

use std::collections::VecDeque;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, StorageError};
use redb::{Database, Durability, ReadableDatabase, TableError};

use crate::members::MembersTable;
use crate::tables::{RAFT_ENTRIES, RAFT_META};

mod codec;
mod recovery;
mod scopes;
use codec::{decode, encode};
pub use recovery::ForcedCluster;

/// `RAFT_META` key of the protobuf-encoded `HardState`.
const META_HARD_STATE: &str = "hard_state";
/// `RAFT_META` key of the protobuf-encoded `ConfState`; absent until [`RaftLog::initialize`].
const META_CONF_STATE: &str = "conf_state";
/// `RAFT_META` key of the protobuf-encoded `SnapshotMetadata` of the compaction boundary.
const META_SNAPSHOT: &str = "snapshot_meta";
/// `RAFT_META` key of the encoded [`MembersTable`]; absent in logs written before
/// membership changes existed (then the conf state's voters are the members).
const META_MEMBERS: &str = "members";

/// Why a raft log operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RaftLogError {
    /// redb failed.
    #[error("raft log storage error: {0}")]
    Storage(String),
    /// A stored record does not decode, or the stored log breaks an invariant.
    #[error("raft log is corrupt: {0}")]
    Corrupt(String),
    /// The log was initialized with other voters than the ones configured now.
    #[error(
        "raft log was initialized with voters {stored:?} but the configuration names {configured:?}; \
         start it with the peers it was created with (later changes go through `palisade member`)"
    )]
    ConfStateMismatch {
        /// Voters recorded in the log.
        stored: Vec<u64>,
        /// Voters of the new configuration.
        configured: Vec<u64>,
    },
    /// Appended entries would leave a gap or overwrite compacted entries.
    #[error(
        "cannot append entries starting at index {first}: the log holds [{log_first}, {log_last}]"
    )]
    NotContiguous {
        /// Index of the first new entry.
        first: u64,
        /// First index of the log.
        log_first: u64,
        /// Last index of the log.
        log_last: u64,
    },
    /// `--force-new-cluster` cannot rewrite this log; the text says why and what to do.
    #[error("cannot force a new cluster: {0}")]
    Recovery(String),
    /// Compaction asked for entries that do not exist yet.
    #[error("cannot compact to index {index}: the last index is {last}")]
    CompactBeyondLast {
        /// The requested compaction index.
        index: u64,
        /// Last index of the log.
        last: u64,
    },
}

impl RaftLogError {
    fn storage(err: impl Into<redb::Error>) -> Self {
        Self::Storage(err.into().to_string())
    }
}

impl From<RaftLogError> for raft::Error {
    fn from(err: RaftLogError) -> Self {
        raft::Error::Store(StorageError::Other(Box::new(err)))
    }
}

/// What one raft `Ready` asks to store, written in one redb transaction in this order:
/// snapshot, entries, hard state.
#[derive(Debug, Clone, Default)]
pub struct ReadyWrite {
    /// A snapshot received from the leader (`None` when the Ready's snapshot is empty).
    pub snapshot: Option<Snapshot>,
    /// New entries; stored entries from the first new index onward are replaced.
    pub entries: Vec<Entry>,
    /// The new hard state, when it changed.
    pub hard_state: Option<HardState>,
}

impl ReadyWrite {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.snapshot.is_none() && self.entries.is_empty() && self.hard_state.is_none()
    }
}

/// The in-memory image of the stored log. Invariant: equal to what redb holds.
#[derive(Debug, Default, Clone)]
struct Core {
    hard_state: HardState,
    /// Empty until the log is initialized.
    conf_state: ConfState,
    /// Index, term (and conf state) of the last compacted entry; index 0 when nothing was.
    boundary: SnapshotMetadata,
    /// The entries `boundary.index + 1 ..= last_index`, in order, without gaps.
    entries: VecDeque<Entry>,
    /// The members table that goes with `conf_state`.
    members: MembersTable,
    /// The named-leaderships state the election applied last, opaque here (see `scopes`).
    scopes: Vec<u8>,
    /// The highest index the node applied, as the election loop reports it. Kept only in
    /// memory (an exception to "equal to what redb holds"): it only chooses the index of
    /// the snapshots this node serves, and after a restart the boundary is a safe floor.
    applied: u64,
}

impl Core {
    fn first_index(&self) -> u64 {
        self.boundary.index + 1
    }

    fn last_index(&self) -> u64 {
        self.boundary.index + self.entries.len() as u64
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        if index == self.boundary.index {
            return Ok(self.boundary.term);
        }
        if index < self.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if index > self.last_index() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let offset = (index - self.first_index()) as usize;
        self.entries
            .get(offset)
            .map(|e| e.term)
            .ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    /// Checks the invariants raft relies on at start-up (it panics on most violations).
    fn check(&self) -> Result<(), RaftLogError> {
        for (offset, entry) in self.entries.iter().enumerate() {
            let expected = self.first_index() + offset as u64;
            if entry.index != expected {
                return Err(RaftLogError::Corrupt(format!(
                    "entry at position {offset} has index {} but {expected} was expected",
                    entry.index
                )));
            }
        }
        let commit = self.hard_state.commit;
        if commit != 0 && (commit < self.boundary.index || commit > self.last_index()) {
            return Err(RaftLogError::Corrupt(format!(
                "commit index {commit} is outside [{}, {}]",
                self.boundary.index,
                self.last_index()
            )));
        }
        Ok(())
    }
}

/// The raft log of one node, stored in redb. Cheap to clone: clones share one cache and
/// one database handle. All methods are blocking (they may fsync); call them from a blocking
/// context when on an async runtime.
#[derive(Clone)]
pub struct RaftLog {
    db: Arc<Database>,
    core: Arc<RwLock<Core>>,
}

impl std::fmt::Debug for RaftLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let core = self.read();
        f.debug_struct("RaftLog")
            .field("first_index", &core.first_index())
            .field("last_index", &core.last_index())
            .field("hard_state", &core.hard_state)
            .finish_non_exhaustive()
    }
}

impl RaftLog {
    /// Opens the raft log kept in `db`, creating its tables when absent, and loads it into
    /// memory. A log that was never initialized has an empty conf state: call
    /// [`RaftLog::initialize`] before handing it to raft.
    ///
    /// A file damaged mid-way can make redb panic while the log is read; that panic is
    /// caught here and reported as [`RaftLogError::Corrupt`], so a node with a damaged
    /// `raft.redb` stops with a clear error instead.
    pub fn open(db: Arc<Database>) -> Result<Self, RaftLogError> {
        let core = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ensure_tables(&db)?;
            let core = load(&db)?;
            core.check()?;
            Ok::<_, RaftLogError>(core)
        }))
        .map_err(|panic| {
            RaftLogError::Corrupt(format!(
                "redb panicked while reading the log ({}): the file is damaged; \
                 restore it from a backup, or replace this node under a new id",
                crate::db::panic_detail(panic.as_ref())
            ))
        })??;
        Ok(Self {
            db,
            core: Arc::new(RwLock::new(core)),
        })
    }

    fn read(&self) -> RwLockReadGuard<'_, Core> {
        // A panic while holding the lock cannot leave the cache half-written: the cache is
        // only replaced after a successful commit, in one assignment sequence that does not
        // panic. So a poisoned lock still guards a consistent image.
        self.core.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Core> {
        self.core.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the log has a conf state (was initialized, or received a snapshot).
    pub fn is_initialized(&self) -> bool {
        self.read().conf_state != ConfState::default()
    }

    /// Records `voters` as the initial membership, durably, when the log is new. When the
    /// log was already initialized, checks that it names the same voters.
    pub fn initialize(&self, voters: &[u64]) -> Result<(), RaftLogError> {
        let mut configured = voters.to_vec();
        configured.sort_unstable();
        configured.dedup();
        if self.is_initialized() {
            let mut stored = self.read().conf_state.voters.clone();
            stored.sort_unstable();
            if stored != configured {
                return Err(RaftLogError::ConfStateMismatch { stored, configured });
            }
            return Ok(());
        }
        let cs = ConfState {
            voters: configured,
            ..ConfState::default()
        };
        self.set_conf_state(&cs)
    }

    /// The stored hard state.
    pub fn hard_state(&self) -> HardState {
        self.read().hard_state.clone()
    }

    /// The stored conf state.
    pub fn conf_state(&self) -> ConfState {
        self.read().conf_state.clone()
    }

    /// The stored members table (empty when none was ever written).
    pub fn members(&self) -> MembersTable {
        self.read().members.clone()
    }

    /// Records the initial membership, durably, when the log is new: the voters are the
    /// ids of `peers`, and the members table holds their addresses at index 0. A log that
    /// was already initialized is left as it is; call [`RaftLog::members`] for its table.
    pub fn initialize_members(
        &self,
        peers: &std::collections::BTreeMap<u64, String>,
    ) -> Result<(), RaftLogError> {
        if self.is_initialized() {
            return Ok(());
        }
        let cs = ConfState {
            voters: peers.keys().copied().collect(),
            ..ConfState::default()
        };
        self.apply_membership(&cs, &MembersTable::initial(peers))
    }

    /// Stores a conf state and the members table that goes with it (after a membership
    /// change was applied), in one transaction, fsynced.
    pub fn apply_membership(
        &self,
        cs: &ConfState,
        members: &MembersTable,
    ) -> Result<(), RaftLogError> {
        let txn = self.begin_write()?;
        {
            let mut meta = txn.open_table(RAFT_META).map_err(RaftLogError::storage)?;
            meta.insert(META_CONF_STATE, encode("conf state", cs)?.as_slice())
                .map_err(RaftLogError::storage)?;
            meta.insert(META_MEMBERS, members.encode().as_slice())
                .map_err(RaftLogError::storage)?;
        }
        txn.commit().map_err(RaftLogError::storage)?;
        let mut core = self.write();
        core.conf_state = cs.clone();
        core.members = members.clone();
        Ok(())
    }

    /// Records the highest applied index (memory only): the snapshots this node serves are
    /// taken there, where its conf state and members table are exactly those of the log.
    pub fn set_applied(&self, applied: u64) {
        let mut core = self.write();
        core.applied = core.applied.max(applied);
    }

    /// Stores what one raft `Ready` asks for, in one redb transaction committed with
    /// `Durability::Immediate` (see the module docs): first the snapshot (which replaces the
    /// whole log), then the entries (deleting the stored suffix from the first new index on),
    /// then the hard state. Nothing is written when `write` is empty.
    pub fn persist(&self, write: &ReadyWrite) -> Result<(), RaftLogError> {
        if write.is_empty() {
            return Ok(());
        }
        let mut next = self.read().clone();
        let txn = self.begin_write()?;
        {
            let mut entries = txn
                .open_table(RAFT_ENTRIES)
                .map_err(RaftLogError::storage)?;
            let mut meta = txn.open_table(RAFT_META).map_err(RaftLogError::storage)?;

            if let Some(snapshot) = &write.snapshot {
                let md = snapshot.get_metadata();
                if md.index < next.boundary.index {
                    return Err(RaftLogError::Corrupt(format!(
                        "snapshot at index {} is older than the compaction boundary {}",
                        md.index, next.boundary.index
                    )));
                }
                // The snapshot's data is the members table at its index; an empty one
                // (from a node that predates membership changes) leaves the table as it is.
                let (members, scopes) = scopes::split_snapshot_data(&snapshot.data);
                scopes::store_scopes(&mut meta, scopes)?;
                next.scopes = scopes.to_vec();
                if !members.is_empty() {
                    let members = MembersTable::decode(members).map_err(|e| {
                        RaftLogError::Corrupt(format!(
                            "snapshot at index {} carries a bad members table: {e}",
                            md.index
                        ))
                    })?;
                    meta.insert(META_MEMBERS, members.encode().as_slice())
                        .map_err(RaftLogError::storage)?;
                    next.members = members;
                }
                entries
                    .retain(|_, _| false)
                    .map_err(RaftLogError::storage)?;
                meta.insert(META_SNAPSHOT, encode("snapshot metadata", md)?.as_slice())
                    .map_err(RaftLogError::storage)?;
                meta.insert(
                    META_CONF_STATE,
                    encode("conf state", md.get_conf_state())?.as_slice(),
                )
                .map_err(RaftLogError::storage)?;
                next.boundary = md.clone();
                next.conf_state = md.get_conf_state().clone();
                next.entries.clear();
                next.hard_state.term = next.hard_state.term.max(md.term);
                next.hard_state.commit = md.index;
                next.applied = md.index;
            }

            if let Some(first) = write.entries.first() {
                if first.index < next.first_index() || first.index > next.last_index() + 1 {
                    return Err(RaftLogError::NotContiguous {
                        first: first.index,
                        log_first: next.first_index(),
                        log_last: next.last_index(),
                    });
                }
                entries
                    .retain_in(first.index.., |_, _| false)
                    .map_err(RaftLogError::storage)?;
                next.entries
                    .truncate((first.index - next.first_index()) as usize);
                for (offset, entry) in write.entries.iter().enumerate() {
                    if entry.index != first.index + offset as u64 {
                        return Err(RaftLogError::Corrupt(format!(
                            "new entries are not consecutive: index {} at position {offset}",
                            entry.index
                        )));
                    }
                    entries
                        .insert(entry.index, encode("entry", entry)?.as_slice())
                        .map_err(RaftLogError::storage)?;
                    next.entries.push_back(entry.clone());
                }
            }

            if let Some(hs) = &write.hard_state {
                next.hard_state = hs.clone();
            }
            if write.snapshot.is_some() || write.hard_state.is_some() {
                meta.insert(
                    META_HARD_STATE,
                    encode("hard state", &next.hard_state)?.as_slice(),
                )
                .map_err(RaftLogError::storage)?;
            }
        }
        txn.commit().map_err(RaftLogError::storage)?;
        *self.write() = next;
        Ok(())
    }

    /// Stores a new commit index (from raft's `LightReady`), fsynced.
    pub fn set_commit(&self, commit: u64) -> Result<(), RaftLogError> {
        let mut hs = self.hard_state();
        if hs.commit == commit {
            return Ok(());
        }
        hs.commit = commit;
        self.persist(&ReadyWrite {
            hard_state: Some(hs),
            ..ReadyWrite::default()
        })
    }

    /// Stores a new conf state (after `apply_conf_change`, or at initialization), fsynced.
    pub fn set_conf_state(&self, cs: &ConfState) -> Result<(), RaftLogError> {
        let txn = self.begin_write()?;
        {
            let mut meta = txn.open_table(RAFT_META).map_err(RaftLogError::storage)?;
            meta.insert(META_CONF_STATE, encode("conf state", cs)?.as_slice())
                .map_err(RaftLogError::storage)?;
        }
        txn.commit().map_err(RaftLogError::storage)?;
        self.write().conf_state = cs.clone();
        Ok(())
    }

    /// Discards the entries before `compact_index`, which becomes the first index; the term
    /// of `compact_index - 1` is kept as the boundary. The caller must not compact past the
    /// applied index. Compacting at or below the first index does nothing.
    pub fn compact(&self, compact_index: u64) -> Result<(), RaftLogError> {
        let mut next = self.read().clone();
        if compact_index <= next.first_index() {
            return Ok(());
        }
        if compact_index > next.last_index() + 1 {
            return Err(RaftLogError::CompactBeyondLast {
                index: compact_index,
                last: next.last_index(),
            });
        }
        let boundary_index = compact_index - 1;
        let boundary_term = next.term(boundary_index).map_err(|e| {
            RaftLogError::Corrupt(format!("no term for index {boundary_index}: {e}"))
        })?;
        let mut boundary = SnapshotMetadata {
            index: boundary_index,
            term: boundary_term,
            ..SnapshotMetadata::default()
        };
        boundary.set_conf_state(next.conf_state.clone());

        let txn = self.begin_write()?;
        {
            let mut entries = txn
                .open_table(RAFT_ENTRIES)
                .map_err(RaftLogError::storage)?;
            let mut meta = txn.open_table(RAFT_META).map_err(RaftLogError::storage)?;
            entries
                .retain_in(..compact_index, |_, _| false)
                .map_err(RaftLogError::storage)?;
            meta.insert(
                META_SNAPSHOT,
                encode("snapshot metadata", &boundary)?.as_slice(),
            )
            .map_err(RaftLogError::storage)?;
        }
        txn.commit().map_err(RaftLogError::storage)?;

        let drop_count = (compact_index - next.first_index()) as usize;
        next.entries.drain(..drop_count);
        next.boundary = boundary;
        *self.write() = next;
        Ok(())
    }

    fn begin_write(&self) -> Result<redb::WriteTransaction, RaftLogError> {
        let mut txn = self.db.begin_write().map_err(RaftLogError::storage)?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| RaftLogError::Storage(e.to_string()))?;
        Ok(txn)
    }
}

/// Creates the raft tables when absent, so that read transactions never meet a missing one.
fn ensure_tables(db: &Database) -> Result<(), RaftLogError> {
    let txn = db.begin_read().map_err(RaftLogError::storage)?;
    let missing = [
        txn.open_table(RAFT_ENTRIES).err(),
        txn.open_table(RAFT_META).err(),
    ];
    drop(txn);
    let mut create = false;
    for err in missing.into_iter().flatten() {
        match err {
            TableError::TableDoesNotExist(_) => create = true,
            other => return Err(RaftLogError::storage(other)),
        }
    }
    if create {
        let txn = db.begin_write().map_err(RaftLogError::storage)?;
        txn.open_table(RAFT_ENTRIES)
            .map_err(RaftLogError::storage)?;
        txn.open_table(RAFT_META).map_err(RaftLogError::storage)?;
        txn.commit().map_err(RaftLogError::storage)?;
    }
    Ok(())
}

/// Reads the whole log from redb.
fn load(db: &Database) -> Result<Core, RaftLogError> {
    let txn = db.begin_read().map_err(RaftLogError::storage)?;
    let meta = txn.open_table(RAFT_META).map_err(RaftLogError::storage)?;
    let mut core = Core::default();
    if let Some(v) = meta.get(META_HARD_STATE).map_err(RaftLogError::storage)? {
        core.hard_state = decode("hard state", v.value())?;
    }
    if let Some(v) = meta.get(META_CONF_STATE).map_err(RaftLogError::storage)? {
        core.conf_state = decode("conf state", v.value())?;
    }
    if let Some(v) = meta.get(META_SNAPSHOT).map_err(RaftLogError::storage)? {
        core.boundary = decode("snapshot metadata", v.value())?;
    }
    if let Some(v) = meta.get(META_MEMBERS).map_err(RaftLogError::storage)? {
        core.members = MembersTable::decode(v.value())
            .map_err(|e| RaftLogError::Corrupt(format!("members table: {e}")))?;
    }
    core.scopes = scopes::load_scopes(&meta)?;
    core.applied = core.boundary.index;
    let entries = txn
        .open_table(RAFT_ENTRIES)
        .map_err(RaftLogError::storage)?;
    for row in entries
        .range(core.boundary.index + 1..)
        .map_err(RaftLogError::storage)?
    {
        let (_, v) = row.map_err(RaftLogError::storage)?;
        core.entries.push_back(decode("entry", v.value())?);
    }
    Ok(core)
}

impl raft::Storage for RaftLog {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let core = self.read();
        Ok(RaftState::new(
            core.hard_state.clone(),
            core.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let core = self.read();
        if low < core.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > core.last_index() + 1 || low > high {
            // raft never asks for this; MemStorage panics. A library must not.
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let lo = (low - core.first_index()) as usize;
        let hi = (high - core.first_index()) as usize;
        let mut ents: Vec<Entry> = core.entries.range(lo..hi).cloned().collect();
        raft::util::limit_size(&mut ents, max_size.into());
        Ok(ents)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.read().term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.read().first_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.read().last_index())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let core = self.read();
        // The only state machine is the membership: a snapshot is taken at the applied
        // index, where the conf state and the members table are exactly those the log
        // produced (at the commit index a conf change could still be unapplied).
        let index = core.applied.max(core.boundary.index);
        if index < request_index {
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        let mut snapshot = Snapshot {
            data: scopes::snapshot_data(&core.members, &core.scopes).into(),
            ..Snapshot::default()
        };
        let md = snapshot.mut_metadata();
        md.index = index;
        md.term = core.term(index)?;
        md.set_conf_state(core.conf_state.clone());
        Ok(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::Storage as _;
    use redb::backends::InMemoryBackend;

    fn mem_db() -> Arc<Database> {
        Arc::new(
            Database::builder()
                .create_with_backend(InMemoryBackend::new())
                .unwrap(),
        )
    }

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            ..Entry::default()
        }
    }

    fn hs(term: u64, vote: u64, commit: u64) -> HardState {
        HardState {
            term,
            vote,
            commit,
            ..HardState::default()
        }
    }

    fn append(log: &RaftLog, entries: &[(u64, u64)]) {
        log.persist(&ReadyWrite {
            entries: entries.iter().map(|&(i, t)| entry(i, t)).collect(),
            ..ReadyWrite::default()
        })
        .unwrap();
    }

    fn ctx() -> GetEntriesContext {
        GetEntriesContext::empty(false)
    }

    /// Goal: a new log behaves like a freshly initialized `MemStorage`. Method: open an empty
    /// database, initialize with three voters, read every trait method.
    #[test]
    fn new_log_is_empty_and_initialized_with_voters() {
        let log = RaftLog::open(mem_db()).unwrap();
        assert!(!log.is_initialized());
        log.initialize(&[3, 1, 2]).unwrap();
        let state = log.initial_state().unwrap();
        assert_eq!(state.conf_state.voters, vec![1, 2, 3]);
        assert_eq!(state.hard_state, HardState::default());
        assert_eq!(log.first_index().unwrap(), 1);
        assert_eq!(log.last_index().unwrap(), 0);
        assert_eq!(log.term(0).unwrap(), 0);
        assert_eq!(
            log.term(1),
            Err(raft::Error::Store(StorageError::Unavailable))
        );
        assert!(log.entries(1, 1, None, ctx()).unwrap().is_empty());
    }

    /// Goal: re-initializing with other voters is refused. Method: initialize, then call
    /// again with a different set.
    #[test]
    fn initialize_with_other_voters_is_refused() {
        let log = RaftLog::open(mem_db()).unwrap();
        log.initialize(&[1, 2, 3]).unwrap();
        log.initialize(&[3, 2, 1]).unwrap();
        let err = log.initialize(&[1, 2]).unwrap_err();
        assert!(
            matches!(err, RaftLogError::ConfStateMismatch { .. }),
            "{err}"
        );
    }

    /// Goal: appending over an existing suffix replaces it. Method: append 1..=5, then a
    /// conflicting 3..=4 with a higher term; the old 5 must be gone.
    #[test]
    fn append_replaces_conflicting_suffix() {
        let log = RaftLog::open(mem_db()).unwrap();
        log.initialize(&[1]).unwrap();
        append(&log, &[(1, 1), (2, 1), (3, 1), (4, 1), (5, 1)]);
        append(&log, &[(3, 2), (4, 2)]);
        assert_eq!(log.last_index().unwrap(), 4);
        assert_eq!(log.term(3).unwrap(), 2);
        let ents = log.entries(1, 5, None, ctx()).unwrap();
        assert_eq!(
            ents.iter().map(|e| (e.index, e.term)).collect::<Vec<_>>(),
            vec![(1, 1), (2, 1), (3, 2), (4, 2)]
        );
        let err = log
            .persist(&ReadyWrite {
                entries: vec![entry(7, 2)],
                ..ReadyWrite::default()
            })
            .unwrap_err();
        assert!(
            matches!(err, RaftLogError::NotContiguous { first: 7, .. }),
            "{err}"
        );
    }

    /// Goal: `entries` honours `max_size` but always returns at least one entry. Method:
    /// ask for three entries with a zero budget.
    #[test]
    fn entries_limit_size_returns_at_least_one() {
        let log = RaftLog::open(mem_db()).unwrap();
        log.initialize(&[1]).unwrap();
        append(&log, &[(1, 1), (2, 1), (3, 1)]);
        assert_eq!(log.entries(1, 4, 0, ctx()).unwrap().len(), 1);
        assert_eq!(log.entries(1, 4, u64::MAX, ctx()).unwrap().len(), 3);
        assert_eq!(
            log.entries(2, 5, None, ctx()),
            Err(raft::Error::Store(StorageError::Unavailable))
        );
    }

    /// Goal: after compaction, compacted ranges answer `Compacted`, the boundary keeps its
    /// term, and first/last index move as raft expects. Method: append 1..=5 at terms
    /// 1,1,2,2,3, compact to 4, probe every edge.
    #[test]
    fn compaction_keeps_boundary_term_and_refuses_compacted_ranges() {
        let log = RaftLog::open(mem_db()).unwrap();
        log.initialize(&[1]).unwrap();
        append(&log, &[(1, 1), (2, 1), (3, 2), (4, 2), (5, 3)]);
        log.compact(4).unwrap();
        assert_eq!(log.first_index().unwrap(), 4);
        assert_eq!(log.last_index().unwrap(), 5);
        // The term at the boundary (first - 1) survives compaction.
        assert_eq!(log.term(3).unwrap(), 2);
        assert_eq!(log.term(4).unwrap(), 2);
        assert_eq!(
            log.term(2),
            Err(raft::Error::Store(StorageError::Compacted))
        );
        assert_eq!(
            log.entries(3, 5, None, ctx()),
            Err(raft::Error::Store(StorageError::Compacted))
        );
        assert_eq!(log.entries(4, 6, None, ctx()).unwrap().len(), 2);
        // Compacting at or below the first index is a no-op; beyond last+1 is an error.
        log.compact(2).unwrap();
        assert_eq!(log.first_index().unwrap(), 4);
        assert!(matches!(
            log.compact(7),
            Err(RaftLogError::CompactBeyondLast { index: 7, last: 5 })
        ));
        // Compacting everything leaves an empty log whose bounds still answer.
        log.compact(6).unwrap();
        assert_eq!(log.first_index().unwrap(), 6);
        assert_eq!(log.last_index().unwrap(), 5);
        assert_eq!(log.term(5).unwrap(), 3);
        append(&log, &[(6, 4)]);
        assert_eq!(log.term(6).unwrap(), 4);
        // Appending below the first index would overwrite compacted entries.
        assert!(matches!(
            log.persist(&ReadyWrite {
                entries: vec![entry(5, 4)],
                ..ReadyWrite::default()
            }),
            Err(RaftLogError::NotContiguous { .. })
        ));
    }

    /// Goal: a restart sees exactly what was persisted: hard state, conf state, entries and
    /// the compaction boundary. Method: write to a file database, drop it, reopen the file.
    #[test]
    fn restart_reloads_hard_state_entries_and_boundary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.redb");
        {
            let db = Arc::new(Database::create(&path).unwrap());
            let log = RaftLog::open(db).unwrap();
            log.initialize(&[1, 2, 3]).unwrap();
            log.persist(&ReadyWrite {
                entries: vec![entry(1, 1), entry(2, 1), entry(3, 5)],
                hard_state: Some(hs(5, 2, 2)),
                ..ReadyWrite::default()
            })
            .unwrap();
            log.compact(2).unwrap();
            log.set_commit(3).unwrap();
        }
        let db = Arc::new(Database::create(&path).unwrap());
        let log = RaftLog::open(db).unwrap();
        let state = log.initial_state().unwrap();
        assert_eq!(state.hard_state, hs(5, 2, 3));
        assert_eq!(state.conf_state.voters, vec![1, 2, 3]);
        assert_eq!(log.first_index().unwrap(), 2);
        assert_eq!(log.last_index().unwrap(), 3);
        assert_eq!(log.term(1).unwrap(), 1);
        assert_eq!(log.term(3).unwrap(), 5);
    }

    /// Goal: the members table is stored with the conf state, survives a restart, is the
    /// data of the snapshots this node serves (taken at the applied index), and a received
    /// snapshot's table replaces it. Method: initialize from peers, apply a change, reopen,
    /// serve a snapshot, persist it into a second log.
    #[test]
    fn members_table_is_stored_served_and_installed_with_snapshots() {
        use crate::members::MemberRecord;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.redb");
        let peers = std::collections::BTreeMap::from([
            (1, "127.0.0.1:7001".to_owned()),
            (2, "127.0.0.1:7002".to_owned()),
        ]);
        {
            let log = RaftLog::open(Arc::new(Database::create(&path).unwrap())).unwrap();
            log.initialize_members(&peers).unwrap();
            assert_eq!(log.members(), MembersTable::initial(&peers));
            append(&log, &[(1, 1), (2, 1), (3, 1)]);
            log.set_commit(3).unwrap();
            let mut table = log.members();
            table.index = 3;
            table.records.insert(
                3,
                MemberRecord {
                    peer: "127.0.0.1:7003".to_owned(),
                    removed: false,
                },
            );
            let cs = ConfState {
                voters: vec![1, 2, 3],
                ..ConfState::default()
            };
            log.apply_membership(&cs, &table).unwrap();
            log.set_applied(3);
        }
        let log = RaftLog::open(Arc::new(Database::create(&path).unwrap())).unwrap();
        assert_eq!(log.members().index, 3);
        assert_eq!(log.conf_state().voters, vec![1, 2, 3]);
        // After a restart the applied index is only known from the boundary (0 here) until
        // the loop reports it.
        log.set_applied(3);
        let snap = log.snapshot(0, 3).unwrap();
        assert_eq!(snap.get_metadata().index, 3);
        assert_eq!(snap.get_metadata().get_conf_state().voters, vec![1, 2, 3]);
        let carried = MembersTable::decode(&snap.data).unwrap();
        assert_eq!(carried, log.members());

        let joiner = RaftLog::open(mem_db()).unwrap();
        assert!(!joiner.is_initialized());
        joiner
            .persist(&ReadyWrite {
                snapshot: Some(snap),
                ..ReadyWrite::default()
            })
            .unwrap();
        assert_eq!(joiner.members(), carried);
        assert_eq!(joiner.conf_state().voters, vec![1, 2, 3]);
        assert_eq!(joiner.snapshot(0, 1).unwrap().get_metadata().index, 3);
    }

    /// Goal: a received snapshot replaces the log and moves the boundary; the snapshot we
    /// serve carries the conf state and the commit index. Method: persist a snapshot over a
    /// short log, then ask for a snapshot.
    #[test]
    fn snapshot_replaces_log_and_is_served_at_commit() {
        let log = RaftLog::open(mem_db()).unwrap();
        log.initialize(&[1, 2, 3]).unwrap();
        append(&log, &[(1, 1), (2, 1)]);
        let mut snap = Snapshot::default();
        snap.mut_metadata().index = 10;
        snap.mut_metadata().term = 4;
        snap.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
        log.persist(&ReadyWrite {
            snapshot: Some(snap),
            entries: vec![entry(11, 4)],
            hard_state: Some(hs(4, 0, 10)),
        })
        .unwrap();
        assert_eq!(log.first_index().unwrap(), 11);
        assert_eq!(log.last_index().unwrap(), 11);
        assert_eq!(log.term(10).unwrap(), 4);
        let served = log.snapshot(0, 2).unwrap();
        assert_eq!(served.get_metadata().index, 10);
        assert_eq!(served.get_metadata().term, 4);
        assert_eq!(served.get_metadata().get_conf_state().voters, vec![1, 2, 3]);
        assert_eq!(
            log.snapshot(12, 2),
            Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable
            ))
        );
    }
}
