//! The election loop's inbox: its one message type, the replies requests carry, and its
//! limits. Peer traffic arrives as the transport's [`Inbound`] and converts into a [`Msg`].

use raft::eraftpb::Message;
use tokio::sync::oneshot;

use palisade_protocol::Transferred;

use super::error::{LeaseError, TransferError};
use crate::members::{MemberChange, MemberError};
use crate::transport::{Inbound, ScoreFrame};

/// Messages the inbox holds. Peer traffic waits (back-pressure onto its connection) when it
/// is full; a few hundred covers a burst from every peer with room to spare.
pub const INBOX_MAX: usize = 1024;
/// Messages taken from the inbox before one `Ready` is handled, so a burst shares one fsync
/// while ticks still run on time.
pub const INBOX_BATCH_MAX: usize = 256;

/// The one message type of the election loop's inbox.
pub(crate) enum Msg {
    /// A raft message from a peer, already checked by the transport.
    Raft(Box<Message>),
    /// Transfer leadership to `to`, or to the best other voter when `None` (resign).
    Transfer {
        to: Option<u64>,
        reply: oneshot::Sender<Result<Transferred, TransferError>>,
    },
    /// Every announce proxy accepted the established term `term`.
    Announced { term: u64 },
    /// A lease request: answer with the term a quorum confirmed after it arrived.
    Lease { reply: LeaseReply },
    /// A membership change: check and propose it; the reply says whether raft took it.
    Member {
        change: MemberChange,
        reply: MemberReply,
    },
    /// A peer's score frame, already checked by the transport (see `crate::score`).
    Score { from: u64, frame: ScoreFrame },
    /// A named-leaderships change to propose; the reply gets its outcome once applied.
    Scope {
        op: crate::scopes::Op,
        reply: super::scopes::ScopeReply,
    },
}

impl From<Inbound> for Msg {
    fn from(inbound: Inbound) -> Self {
        match inbound {
            Inbound::Raft(msg) => Msg::Raft(msg),
            Inbound::Score { from, frame } => Msg::Score { from, frame },
        }
    }
}

/// A membership request waiting for the loop: the change and where the outcome of its
/// proposal goes (the API then waits for the change to be applied).
pub(crate) type MemberReply = oneshot::Sender<Result<(), MemberError>>;

/// One lease request waiting in the loop: where its answer goes (the term confirmed by a
/// quorum), and whether a write waits for it.
pub(crate) struct LeaseReply {
    tx: oneshot::Sender<Result<u64, LeaseError>>,
    /// Whether a write waits for it: then it is not held to gather others.
    pub(super) urgent: bool,
}

impl LeaseReply {
    /// A request answered on `tx`; `urgent` when it must not be held to gather others.
    pub(crate) fn new(tx: oneshot::Sender<Result<u64, LeaseError>>, urgent: bool) -> Self {
        Self { tx, urgent }
    }

    /// Answers the request (an error when its asker is gone, which is fine to ignore).
    pub(crate) fn send(
        self,
        answer: Result<u64, LeaseError>,
    ) -> Result<(), Result<u64, LeaseError>> {
        self.tx.send(answer)
    }
}
