//! Building the election loop from what `crate::start` prepared, and spawning the one task
//! that owns it.

use std::collections::BTreeSet;
use std::sync::Arc;

use palisade_protocol::MemberList;
use palisade_storage::{MembersTable, RaftLog};
use raft::RawNode;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, info_span};

use super::error::NodeError;
use super::guard::{DropLog, Guard};
use super::inbox::Msg;
use super::lease_rounds::{LeaseRounds, lease_gather_interval};
use super::membership::Membership;
use super::promote::Reachability;
use super::ready::ElectionLoop;
use super::signer::TokenSigner;
use crate::config::NodeConfig;
use crate::leadership::Leadership;
use crate::metrics::NodeMetrics;
use crate::score::board::ScoreBoard;
use crate::transport::Transport;

/// A transfer that has not completed within this many election timeouts is answered
/// `TimedOut` (raft itself abandons a transfer after one election timeout).
pub const TRANSFER_TIMEOUT_ELECTIONS: u64 = 3;
/// Entries kept behind the applied index when the log is compacted. Lagging followers
/// within this distance catch up by appends, farther ones by a (metadata-only) snapshot.
pub const LOG_ENTRIES_RETAINED: u64 = 1_000;
/// Compaction runs once this many more entries than [`LOG_ENTRIES_RETAINED`] accumulated.
pub const LOG_COMPACT_STEP: u64 = 1_000;

/// What the election loop starts from, prepared by `crate::start`; the rest of its state
/// follows from the node's configuration.
pub(crate) struct LoopParts {
    /// raft's state machine over `log`; the loop becomes its only owner.
    pub raw_node: RawNode<RaftLog>,
    /// A handle on the same log, for writes from blocking tasks.
    pub log: RaftLog,
    /// Where outgoing raft messages and score frames go.
    pub transport: Box<dyn Transport>,
    /// The receiving end of the inbox that `Commands` and the transport's `PeerInbox`
    /// send into.
    pub inbox: mpsc::Receiver<Msg>,
    /// The published leadership; the loop becomes its only writer.
    pub leadership: watch::Sender<Leadership>,
    pub metrics: NodeMetrics,
    /// Cancelled when the node stops.
    pub shutdown: CancellationToken,
    /// Signs each new token's proof (`--token-key`).
    pub signer: Option<Arc<TokenSigner>>,
    /// Scores (`--score-oracle`); `None`: raft's randomized election.
    pub scores: Option<ScoreBoard>,
    /// Named leaderships: the machine as stored, and the API's side of it.
    pub scopes: super::scopes::ScopesLoop,
    /// Every member this node exchanges raft traffic with at start, this node included.
    pub voters: BTreeSet<u64>,
    /// The members table the node starts with.
    pub members: MembersTable,
    /// Where the loop publishes the members it applied.
    pub members_tx: watch::Sender<MemberList>,
    /// This node's own peer address.
    pub own_peer: String,
    /// Where the loop publishes the announce list the announcers follow.
    pub announce_tx: watch::Sender<Vec<String>>,
    /// The announce list is empty: a token counts as announced once established.
    pub no_proxies: bool,
    /// Entries kept behind the applied index at compaction; `None`:
    /// [`LOG_ENTRIES_RETAINED`], compacted every [`LOG_COMPACT_STEP`].
    pub log_entries_retained: Option<u64>,
    /// The record of the highest term the log held, beside `raft.redb`; `None` for an
    /// in-memory log.
    pub term_record: Option<palisade_storage::TermRecord>,
}

/// Spawns the election loop of the node `config` describes. The task ends at shutdown or
/// on a fatal storage error, and says which.
pub(crate) fn spawn(config: &NodeConfig, parts: LoopParts) -> JoinHandle<Result<(), NodeError>> {
    let id = config.id;
    let election_loop = ElectionLoop {
        id,
        raw_node: parts.raw_node,
        log: parts.log,
        transport: parts.transport,
        inbox: parts.inbox,
        leadership: parts.leadership,
        metrics: parts.metrics,
        no_proxies: parts.no_proxies,
        transfers: Vec::new(),
        unreachable: BTreeSet::new(),
        snapshot_failed: BTreeSet::new(),
        transfer_ticks: TRANSFER_TIMEOUT_ELECTIONS * config.election_ticks,
        shutdown: parts.shutdown,
        guard: Guard {
            voters: parts.voters,
            max_term_gap: config.max_term_gap,
        },
        drop_log: DropLog::default(),
        term_record: parts
            .term_record
            .map(|r| Arc::new(std::sync::Mutex::new(r))),
        signer: parts.signer,
        leases: LeaseRounds::new(lease_gather_interval(config)),
        release_wait: config.lease_release_wait(),
        established_at: None,
        scores: parts.scores,
        scopes: parts.scopes,
        membership: Membership {
            table: parts.members,
            tx: parts.members_tx,
            own_peer: parts.own_peer,
            compact_to_applied: false,
            lost: None,
            announce_tx: parts.announce_tx,
            leases_on: config.leases_on(),
            retained: parts.log_entries_retained.unwrap_or(LOG_ENTRIES_RETAINED),
            compact_step: parts.log_entries_retained.unwrap_or(LOG_COMPACT_STEP),
            reachability: Reachability::new(config.election_ticks),
        },
    };
    tokio::spawn(
        election_loop
            .run(config.tick())
            .instrument(info_span!("node", node_id = id)),
    )
}
