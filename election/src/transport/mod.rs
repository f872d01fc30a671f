//! Carrying raft messages between nodes.
//!
//! The election loop hands each outgoing message to a `Transport`, which must never
//! block: it queues the message or drops it and says so, and the loop reports dropped
//! destinations to raft with `report_unreachable`. Raft resends what matters. Incoming
//! messages reach the loop through its inbox ([`PeerInbox`]) after `check_inbound`, as
//! the transport's own `Inbound` type, which the loop's message converts from: the
//! transport knows nothing of the loop.
//!
//! Nodes started with a score oracle (`crate::score`) also send [`ScoreFrame`]s over the
//! same links, in the same [`PeerFrame`] envelope (its `score` field instead of a raft
//! payload), checked by `check_score` before they reach the inbox.
//!
//! Two transports exist: `tcp`, the real one, and [`mem`], an in-process network with
//! per-link drops and partitions for deterministic tests. The TCP transport can also drop
//! or delay traffic per peer at runtime ([`faults`]) for end-to-end tests of real
//! processes; that is off unless the node is started with test faults.

pub mod faults;
pub mod mem;
pub(crate) mod tcp;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use tokio::sync::mpsc;

/// The peer protocol's limits, defined with the node's other limits in `crate::config`.
pub use crate::config::{
    FRAME_BYTES_MAX, PEER_QUEUE_MAX, RAFT_INFLIGHT_MSGS_MAX, RAFT_MSG_BYTES_MAX, SCORE_ABS_MAX,
};

/// What happened to one outgoing message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Queued for sending.
    Queued,
    /// Dropped: the peer is down, disconnected, or its queue is full.
    Unreachable,
}

/// Something that carries raft messages (and score frames) to peers. Implementations must
/// not block.
pub(crate) trait Transport: Send + 'static {
    /// Queues `msg` for `msg.to`, or drops it.
    fn send(&mut self, msg: Message) -> Delivery;
    /// Queues a score frame for peer `to`, or drops it (scores are resent every share
    /// period, so a dropped one is only late).
    fn send_score(&mut self, to: u64, frame: ScoreFrame) -> Delivery;
    /// Follows a membership change: every id in `peers` (this node included) is reachable
    /// at its address from now on, and links to other ids are closed. The in-memory
    /// network reaches every attached node anyway.
    fn set_peers(&mut self, _peers: &BTreeMap<u64, String>) {}
}

/// A checked message from a peer, as a transport delivers it. The election loop's inbox
/// carries more than peer traffic; its message type converts from this one, so the
/// transports need not know it.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// A raft message ([`check_inbound`]).
    Raft(Box<Message>),
    /// A score frame from peer `from` ([`check_score`]).
    Score {
        /// The peer that sent it (the connection's, not a claim of the frame).
        from: u64,
        /// The frame.
        frame: ScoreFrame,
    },
}

/// The sending side of a node's inbox, for transports to deliver checked messages.
#[derive(Clone)]
pub struct PeerInbox {
    tx: Arc<dyn InboxSender>,
}

impl std::fmt::Debug for PeerInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerInbox").finish_non_exhaustive()
    }
}

/// A bounded channel whose messages convert from [`Inbound`], seen without its message
/// type.
trait InboxSender: Send + Sync {
    /// Delivers `msg` if there is room now: `Ok(true)`, or `Ok(false)` when the inbox is
    /// closed; a full inbox gives `msg` back.
    fn try_send(&self, msg: Inbound) -> Result<bool, Inbound>;
    /// Waits for room, then delivers `msg`; false when the inbox is closed.
    fn send(&self, msg: Inbound) -> Pin<Box<dyn Future<Output = bool> + Send + '_>>;
}

impl<M: From<Inbound> + Send + 'static> InboxSender for mpsc::Sender<M> {
    fn try_send(&self, msg: Inbound) -> Result<bool, Inbound> {
        match self.try_reserve() {
            Ok(permit) => {
                permit.send(M::from(msg));
                Ok(true)
            }
            Err(mpsc::error::TrySendError::Full(())) => Err(msg),
            Err(mpsc::error::TrySendError::Closed(())) => Ok(false),
        }
    }

    fn send(&self, msg: Inbound) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(async move { mpsc::Sender::send(self, M::from(msg)).await.is_ok() })
    }
}

impl PeerInbox {
    /// The inbox that `tx` fills: the election loop's, or (in tests) a channel of
    /// [`Inbound`] itself.
    pub(crate) fn new<M: From<Inbound> + Send + 'static>(tx: mpsc::Sender<M>) -> Self {
        Self { tx: Arc::new(tx) }
    }

    /// Delivers `msg`, waiting for room (back-pressure onto the connection). Returns false
    /// when the node has stopped.
    pub(crate) async fn deliver(&self, msg: Inbound) -> bool {
        // Room now (the usual case) needs no allocation; only a full inbox is waited on,
        // through the boxed future of the channel's own `send`.
        match self.tx.try_send(msg) {
            Ok(delivered) => delivered,
            Err(msg) => self.tx.send(msg).await,
        }
    }

    /// Delivers `msg` if there is room now. Returns false when it was dropped.
    pub(crate) fn try_deliver(&self, msg: Inbound) -> bool {
        matches!(self.tx.try_send(msg), Ok(true))
    }

    /// Whether both are the same node's inbox (clones of one `PeerInbox`).
    pub(crate) fn same_inbox(&self, other: &PeerInbox) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.tx), Arc::as_ptr(&other.tx))
    }
}

/// One frame on a peer connection after the handshake: a raft message and its routing.
/// Public, with [`Hello`], so that tests can speak the wire as a hostile peer would.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PeerFrame {
    /// Sender's raft id.
    #[prost(uint64, tag = "1")]
    pub from: u64,
    /// Receiver's raft id.
    #[prost(uint64, tag = "2")]
    pub to: u64,
    /// A raft `eraftpb::Message`, protobuf-encoded (`write_to_bytes`); empty in a score
    /// frame.
    #[prost(bytes = "vec", tag = "3")]
    pub payload: Vec<u8>,
    /// A score frame instead of a raft message (then `payload` must be empty). Only nodes
    /// started with a score oracle send these.
    #[prost(message, optional, tag = "4")]
    pub score: Option<ScoreFrame>,
}

/// What a node shares with each peer every score period (`crate::score`): its score, its
/// log position (for the "behind log ranks last" rule), and a ping-pong pair of
/// timestamps from which both sides measure their round trip.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct ScoreFrame {
    /// The sender's score (higher is better); absent while its oracle has no value.
    #[prost(double, optional, tag = "1")]
    pub score: Option<f64>,
    /// The sender's last log index.
    #[prost(uint64, tag = "2")]
    pub last_index: u64,
    /// The term of the sender's last log entry.
    #[prost(uint64, tag = "3")]
    pub last_term: u64,
    /// When the sender sent this, in microseconds on its own monotonic clock (never 0).
    #[prost(uint64, tag = "4")]
    pub sent_us: u64,
    /// The `sent_us` of the last frame the sender received from the receiver, echoed
    /// unchanged (0: none yet).
    #[prost(uint64, tag = "5")]
    pub echo_us: u64,
    /// How long the sender held that echoed frame before sending this one, in
    /// microseconds; the receiver subtracts it from the round trip.
    #[prost(uint64, tag = "6")]
    pub echo_held_us: u64,
}

/// The longest echo hold a frame may claim, in microseconds: a peer holds an echo for at
/// most one share period, and one minute rules out only nonsense.
pub const SCORE_ECHO_HELD_US_MAX: u64 = 60_000_000;

/// Checks a received score frame: a finite score within [`SCORE_ABS_MAX`], a non-zero
/// send time, and an echo hold within [`SCORE_ECHO_HELD_US_MAX`].
pub(crate) fn check_score(frame: &ScoreFrame) -> Result<(), InboundError> {
    if let Some(score) = frame.score
        && !(score.is_finite() && score.abs() <= SCORE_ABS_MAX)
    {
        return Err(InboundError::Score(format!(
            "score {score} is not a finite number within +-{SCORE_ABS_MAX}"
        )));
    }
    if frame.sent_us == 0 {
        return Err(InboundError::Score("sent_us is 0".to_owned()));
    }
    if frame.echo_held_us > SCORE_ECHO_HELD_US_MAX {
        return Err(InboundError::Score(format!(
            "echo_held_us {} is over the limit of {SCORE_ECHO_HELD_US_MAX}",
            frame.echo_held_us
        )));
    }
    Ok(())
}

/// Checks a received [`PeerFrame`] from `peer` at `me`: a raft message
/// ([`check_inbound`]) or a score frame ([`check_score`]), never both.
pub(crate) fn check_frame(frame: &PeerFrame, peer: u64, me: u64) -> Result<Inbound, InboundError> {
    match frame.score {
        Some(_) if !frame.payload.is_empty() => Err(InboundError::Score(format!(
            "frame carries both a score and a raft payload of {} bytes",
            frame.payload.len()
        ))),
        Some(score) => check_score(&score).map(|()| Inbound::Score {
            from: peer,
            frame: score,
        }),
        None => check_inbound(&frame.payload, peer, me).map(|msg| Inbound::Raft(Box::new(msg))),
    }
}

/// The first frame on every peer connection: who is calling whom.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`].
    #[prost(uint32, tag = "1")]
    pub protocol: u32,
    /// Caller's raft id.
    #[prost(uint64, tag = "2")]
    pub from: u64,
    /// Callee's raft id.
    #[prost(uint64, tag = "3")]
    pub to: u64,
}

/// Version of the peer protocol; a node refuses a handshake with another version.
pub const PROTOCOL_VERSION: u32 = 1;

/// Why an incoming message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InboundError {
    /// The payload is not a raft message (an unknown enum value fails here too).
    #[error("payload does not decode as a raft message: {0}")]
    Decode(String),
    /// A local-only message type (`MsgHup`, `MsgBeat`, ...) arrived from the network.
    #[error("message type {0:?} is local-only")]
    LocalType(MessageType),
    /// The message is addressed to another node.
    #[error("message to node {to} arrived at node {me}")]
    WrongRecipient {
        /// The message's `to`.
        to: u64,
        /// This node.
        me: u64,
    },
    /// The message claims another sender than the connection's peer.
    #[error("message from node {claimed} arrived on the connection of node {peer}")]
    WrongSender {
        /// The message's `from`.
        claimed: u64,
        /// The authenticated peer of the connection.
        peer: u64,
    },
    /// A malformed score frame.
    #[error("bad score frame: {0}")]
    Score(String),
    /// A message without a term, other than a forwarded proposal. Raft sends every other
    /// message with the sender's term, which is at least 1 once any election happened
    /// (an honest one without it is at most a fresh node's pre-vote rejection, which raft
    /// does without). raft-rs reads a message without a term as local and skips its term
    /// checks: answering such a vote request it panics (`term should be set when sending
    /// MsgRequestVoteResponse`), and a candidate takes such an append or heartbeat as
    /// from a leader of term 0 and moves its own term back to 0.
    #[error("{0:?} carries no term")]
    NoTerm(MessageType),
    /// An append carrying an entry without a term. Only the log's placeholder before its
    /// first entry has term 0; raft-rs reads term 0 at an index beyond its log as a match,
    /// so such an entry makes it slice its unstable log out of bounds and panic.
    #[error("append carries entry {index} without a term")]
    EntryWithoutTerm {
        /// The entry's index.
        index: u64,
    },
}

/// Decodes a raft message received from `peer` and checks it before it may reach `step`:
/// a known, non-local message type, addressed to `me`, sent by `peer`, a term on every
/// message but a forwarded proposal, and a term on every entry of an append.
pub(crate) fn check_inbound(payload: &[u8], peer: u64, me: u64) -> Result<Message, InboundError> {
    // `merge_from_bytes` into a default message: with the protobuf codec an unknown enum
    // value is a decode error (never a panic later in `get_msg_type`).
    let mut msg = Message::default();
    msg.merge_from_bytes(payload)
        .map_err(|e| InboundError::Decode(e.to_string()))?;
    if raft::raw_node::is_local_msg(msg.get_msg_type()) {
        return Err(InboundError::LocalType(msg.get_msg_type()));
    }
    if msg.to != me {
        return Err(InboundError::WrongRecipient { to: msg.to, me });
    }
    if msg.from != peer {
        return Err(InboundError::WrongSender {
            claimed: msg.from,
            peer,
        });
    }
    let kind = msg.get_msg_type();
    if msg.term == 0 && kind != MessageType::MsgPropose {
        return Err(InboundError::NoTerm(kind));
    }
    if kind == MessageType::MsgAppend
        && let Some(entry) = msg.get_entries().iter().find(|e| e.term == 0)
    {
        return Err(InboundError::EntryWithoutTerm { index: entry.index });
    }
    Ok(msg)
}

/// Encodes a raft message for a [`PeerFrame`].
pub(crate) fn encode_raft(msg: &Message) -> Result<Vec<u8>, protobuf::ProtobufError> {
    msg.write_to_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heartbeat(from: u64, to: u64) -> Message {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgHeartbeat);
        m.from = from;
        m.to = to;
        m.term = 3;
        m
    }

    /// Goal: a well-formed message passes and round-trips. Method: encode, check, compare.
    #[test]
    fn valid_message_round_trips() {
        let m = heartbeat(2, 1);
        let bytes = encode_raft(&m).unwrap();
        assert_eq!(check_inbound(&bytes, 2, 1).unwrap(), m);
    }

    /// Goal: an unknown message type is a decode error, not a panic. Method: hand-encode
    /// field 1 (`msg_type`) as varint 99.
    #[test]
    fn unknown_message_type_is_refused() {
        let bytes = [0x08, 99];
        assert!(matches!(
            check_inbound(&bytes, 2, 1),
            Err(InboundError::Decode(_))
        ));
    }

    /// Goal: local-only types, wrong recipients and spoofed senders are refused. Method:
    /// one message each.
    #[test]
    fn local_misaddressed_and_spoofed_messages_are_refused() {
        let mut hup = heartbeat(2, 1);
        hup.set_msg_type(MessageType::MsgHup);
        assert!(matches!(
            check_inbound(&encode_raft(&hup).unwrap(), 2, 1),
            Err(InboundError::LocalType(MessageType::MsgHup))
        ));
        assert!(matches!(
            check_inbound(&encode_raft(&heartbeat(2, 3)).unwrap(), 2, 1),
            Err(InboundError::WrongRecipient { to: 3, me: 1 })
        ));
        assert!(matches!(
            check_inbound(&encode_raft(&heartbeat(3, 1)).unwrap(), 2, 1),
            Err(InboundError::WrongSender {
                claimed: 3,
                peer: 2
            })
        ));
        // Empty bytes decode as MsgHup (the zero value) and are refused as local.
        assert!(matches!(
            check_inbound(&[], 2, 1),
            Err(InboundError::LocalType(MessageType::MsgHup))
        ));
    }

    /// A fresh `RawNode`, node 1 of voters 1, 2, 3, with raft's default settings.
    fn fresh_node() -> raft::RawNode<raft::storage::MemStorage> {
        let storage = raft::storage::MemStorage::new_with_conf_state(
            raft::eraftpb::ConfState::from((vec![1, 2, 3], vec![])),
        );
        let config = raft::Config {
            id: 1,
            ..raft::Config::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        raft::RawNode::new(&config, storage, &logger).unwrap()
    }

    /// Goal: a message without a term never reaches raft, which reads it as local (found
    /// by the `peer_frame` fuzz target: a vote request at term 0 makes raft panic as it
    /// answers, and an append at term 0 to a candidate sets the candidate's term back to
    /// 0); a forwarded proposal, which raft sends without a term, passes, and so do the
    /// same messages with a term. Method: check each at term 0, then at term 1 and step it
    /// into a fresh `RawNode` (a campaigning one for the append).
    #[test]
    fn messages_without_a_term_are_refused() {
        for kind in [
            MessageType::MsgRequestVote,
            MessageType::MsgRequestPreVote,
            MessageType::MsgAppend,
            MessageType::MsgHeartbeat,
        ] {
            let mut m = heartbeat(2, 1);
            m.set_msg_type(kind);
            m.term = 0;
            assert_eq!(
                check_inbound(&encode_raft(&m).unwrap(), 2, 1),
                Err(InboundError::NoTerm(kind))
            );
            m.term = 1;
            let checked = check_inbound(&encode_raft(&m).unwrap(), 2, 1).unwrap();
            let mut node = fresh_node();
            if kind == MessageType::MsgAppend {
                node.campaign().unwrap();
            }
            node.step(checked).unwrap();
            // A pre-vote does not move the term; every other message leaves it at 1.
            if kind != MessageType::MsgRequestPreVote {
                assert_eq!(node.raft.term, 1, "{kind:?}");
            }
        }
        let mut proposal = heartbeat(2, 1);
        proposal.set_msg_type(MessageType::MsgPropose);
        proposal.term = 0;
        assert!(check_inbound(&encode_raft(&proposal).unwrap(), 2, 1).is_ok());
    }

    /// Goal: an append with an entry of term 0 never reaches raft, which reads term 0
    /// beyond its log as a match and panics slicing its unstable log (found by the
    /// `peer_frame` fuzz target: entries 1 at term 0 and 2 at term 2, to a fresh node);
    /// the same append with terms passes and raft takes it. Method: check the fuzzer's
    /// append, then the corrected one, stepped into a fresh `RawNode`.
    #[test]
    fn append_entries_without_a_term_are_refused() {
        let entry = |term, index| raft::eraftpb::Entry {
            term,
            index,
            data: b"a".to_vec().into(),
            ..Default::default()
        };
        let mut append = heartbeat(2, 1);
        append.set_msg_type(MessageType::MsgAppend);
        append.term = 2;
        append.set_entries(vec![entry(0, 1), entry(2, 2)].into());
        assert_eq!(
            check_inbound(&encode_raft(&append).unwrap(), 2, 1),
            Err(InboundError::EntryWithoutTerm { index: 1 })
        );
        append.set_entries(vec![entry(1, 1), entry(2, 2)].into());
        let checked = check_inbound(&encode_raft(&append).unwrap(), 2, 1).unwrap();
        let mut node = fresh_node();
        node.step(checked).unwrap();
        assert_eq!(node.raft.raft_log.last_index(), 2);
    }

    /// A heartbeat from 2 to 1 followed by `depth` start-group tags of the unknown field
    /// 100 (two bytes each: `(100 << 3) | 3` = 803, varint `a3 06`), without end tags.
    fn nested_groups(depth: usize) -> Vec<u8> {
        let mut bytes = encode_raft(&heartbeat(2, 1)).unwrap();
        bytes.extend(std::iter::repeat_n([0xa3_u8, 0x06], depth).flatten());
        bytes
    }

    /// Goal: RUSTSEC-2024-0437 (a stack overflow on deeply nested groups in unknown
    /// fields) cannot be reached through this decoder: protobuf 2.28 skips an unknown
    /// group in a loop and refuses a group inside it ("unexpected wire type"), so a
    /// payload nested 500,000 deep, and one as deep as the largest peer frame holds
    /// (about 2.1 million), are decode errors on a 128 KiB stack. Method: decode each on a
    /// thread with a 128 KiB stack; a decoder that recursed per level, at even 16 bytes a
    /// level, would need 8 MB for the first.
    #[test]
    fn deeply_nested_groups_are_refused_without_recursion() {
        for depth in [500_000, (FRAME_BYTES_MAX - 64) / 2] {
            let payload = nested_groups(depth);
            let decoded = std::thread::Builder::new()
                .stack_size(128 * 1024)
                .spawn(move || check_inbound(&payload, 2, 1))
                .unwrap()
                .join()
                .expect("decoding on a 128 KiB stack");
            assert!(
                matches!(&decoded, Err(InboundError::Decode(e)) if e.contains("unexpected wire type")),
                "depth {depth}: {decoded:?}"
            );
        }
        // The same groups closed again, each with its end tag (`a4 06`), fail the same way.
        let mut closed = nested_groups(500_000);
        closed.extend(std::iter::repeat_n([0xa4_u8, 0x06], 500_000).flatten());
        assert!(matches!(
            check_inbound(&closed, 2, 1),
            Err(InboundError::Decode(_))
        ));
    }
}
