//! Everything Palisade keeps on disk, in [redb].
//!
//! A proxy keeps its fence register and (when it has no upstream) the embedded
//! object store in one database file; an election node keeps its raft log in another.
//! redb allows one open handle per file per process, so callers open the file once with
//! [`open_database`] and hand the shared handle to each store.
//!
//! # Layout
//! - `tables`: every redb table definition, in one place.
//! - `db`: opening (or creating, at first start only) a database file; a lost or damaged
//!   one is an error, never a fresh start.
//! - `fence`: the fence register, scope to highest admitted token; memory-served reads, fsynced raises.
//! - `objects`: the embedded object store, the proxy's default backing storage.
//! - `raftlog`: `raft::Storage` on redb, one write transaction per raft `Ready`; its
//!   `recovery` rewrites a node's configuration to itself alone (`--force-new-cluster`).
//! - `members`: the election cluster's members table (ids, peer addresses, removed ids),
//!   stored next to the raft log and carried in its snapshots.
#![deny(missing_docs)]

mod db;
mod fence;
mod members;
mod objects;
mod raftlog;
mod tables;

pub use db::{
    MARKER_SUFFIX, OpenError, STATE_MARKER_SUFFIX, TERM_RECORD_SUFFIX, TermRecord,
    check_holds_state, marker_path, open_database, without_panics,
};
pub use fence::{Advance, AdvanceError, FenceRegister, SCOPES_MAX_DEFAULT};
pub use members::{
    ANNOUNCE_URL_BYTES_MAX, MEMBER_PEER_BYTES_MAX, MEMBERS_TABLE_ENTRIES_MAX, MemberRecord,
    MembersError, MembersTable,
};
pub use objects::{OBJECT_BYTES_MAX_DEFAULT, Object, ObjectError, ObjectMeta, ObjectStore};
pub use raftlog::ReadyWrite;
pub use raftlog::{ForcedCluster, RaftLog, RaftLogError};
