//! The errors of a running node, of a leadership transfer and of a lease request (those
//! of starting a node are `crate::start`'s).

/// Why a transfer or resignation did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransferError {
    /// Resigning needs leadership, and transferring needs a known leader.
    #[error("this node is not the leader (leader: {leader_id:?})")]
    NotLeader {
        /// The leader this node knows, if any.
        leader_id: Option<u64>,
    },
    /// The target is not a voter of this cluster.
    #[error("node {to} is not a voter of this cluster")]
    UnknownNode {
        /// The requested target.
        to: u64,
    },
    /// There is no other voter to resign to.
    #[error("there is no other voter to transfer leadership to")]
    NoCandidate,
    /// raft refused or abandoned the transfer (the target did not catch up in time, or a
    /// higher-priority voter refused to vote for it).
    #[error("raft refused or abandoned the transfer to node {to} in term {term}")]
    Refused {
        /// The requested target.
        to: u64,
        /// The term the transfer was started in.
        term: u64,
    },
    /// Another node than the target became leader.
    #[error("node {leader_id} became leader in term {term} instead of node {to}")]
    Superseded {
        /// The requested target.
        to: u64,
        /// The leader that won.
        leader_id: u64,
        /// Its term.
        term: u64,
    },
    /// No outcome within the deadline.
    #[error("transfer to node {to} did not complete within {ticks} ticks")]
    TimedOut {
        /// The requested target.
        to: u64,
        /// The deadline in ticks.
        ticks: u64,
    },
    /// The node stopped before the transfer completed.
    #[error("the node stopped")]
    Stopped,
}

/// Why a running node stopped on its own.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// Writing the raft log failed. The node stops: continuing could break raft's promises.
    #[error("raft log write failed: {0}")]
    Storage(String),
    /// A blocking storage task panicked or was cancelled.
    #[error("storage task failed: {0}")]
    Task(String),
    /// The loop task panicked.
    #[error("election loop failed: {0}")]
    Loop(String),
    /// This node's storage lost entries the cluster had acknowledged from it (its data
    /// directory was wiped or replaced): the leader's heartbeat counts more than its log
    /// holds. Going on could cast a second vote in a term, so the node stops.
    #[error(
        "storage of node {id} was wiped or replaced (leader {leader_id} counts index {commit} \
         as acknowledged by it, its log ends at {last_index}), but the cluster still has id \
         {id}: remove it with `palisade member remove --node URL --id {id}`, then add this \
         machine under a new id with `palisade member add --node URL --id NEW --peer \
         HOST:PORT` and start it with `palisade node --join URL --id NEW` and an empty data \
         directory"
    )]
    StorageLost {
        /// This node's id.
        id: u64,
        /// The leader whose heartbeat showed it.
        leader_id: u64,
        /// The commit index the leader sent.
        commit: u64,
        /// This node's last log index.
        last_index: u64,
    },
}

/// Why a lease request was not granted by the election loop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// This node does not lead (or is handing leadership over, or lost leadership before
    /// its `ReadIndex` round was confirmed); ask the leader it names.
    #[error("this node is not the leader (leader: {leader_id:?})")]
    NotLeader {
        /// The leader this node knows, if any.
        leader_id: Option<u64>,
    },
    /// The `ReadIndex` round was not confirmed by a quorum within the wait.
    #[error("leadership was not confirmed by a quorum within {waited_ms} ms")]
    TimedOut {
        /// How long the request waited.
        waited_ms: u64,
    },
    /// The node stopped before answering.
    #[error("the node stopped")]
    Stopped,
}
