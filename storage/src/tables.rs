//! Every redb table Palisade uses. Keys and values are fixed here so that a file written
//! by one version is read with the same types by the next.

use redb::TableDefinition;

/// Fence register: scope name to the highest admitted fencing token.
/// Invariant: a stored value never decreases.
pub(crate) const FENCES: TableDefinition<&str, u64> = TableDefinition::new("fences");

/// Embedded object store: key to `(token that wrote it, revision of the write, body bytes)`.
pub(crate) const OBJECTS: TableDefinition<&str, (u64, u64, &[u8])> =
    TableDefinition::new("objects");

/// Embedded object store counters by name; `revision` is the last write's revision.
/// Invariant: it only grows, by one per put.
pub(crate) const OBJECT_COUNTERS: TableDefinition<&str, u64> =
    TableDefinition::new("object_counters");

/// Raft log entries by index, each a protobuf-encoded `raft::eraftpb::Entry`.
pub(crate) const RAFT_ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_entries");

/// Raft metadata by name (`hard_state`, `conf_state`, `snapshot_meta`, ...), protobuf-encoded.
pub(crate) const RAFT_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
