//! `raft::Storage` on redb.

/// The raft log of one node (to be written).
pub struct RaftLog;

/// Why a raft log operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RaftLogError {
    /// redb failed.
    #[error("raft log storage error: {0}")]
    Storage(String),
}
