//! Entry points for the fuzz targets in `tests/fuzz`, compiled only with the `fuzzing`
//! feature: the peer links' framing and inbound checks, the election loop's last check
//! before `step` (the guard), and the node API's router over a stand-in for the loop.
//! Nothing here is part of the node's API.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::BytesMut;
use palisade_protocol::{MemberList, Scope};
use prost::Message as _;
use raft::eraftpb::Message;
use tokio::sync::{mpsc, watch};
use tokio_util::codec::Decoder as _;
use tokio_util::sync::CancellationToken;

use crate::api::{ApiState, LeaseApi};
use crate::audit::Observer;
use crate::leadership::Leadership;
use crate::metrics::NodeMetrics;
use crate::node::Commands;
use crate::transport::faults::LinkFaults;
use crate::transport::{InboundError, PeerFrame};

/// The election loop's guard, compiled from its own source file: the module that owns it
/// keeps it private to the loop, and the fuzz target must check exactly that code.
#[allow(dead_code, unreachable_pub, clippy::duplicate_mod)]
#[path = "node/guard.rs"]
mod guard;

/// The inbox of the stand-in loop behind [`node_api`]: small, as a busy loop's is.
const STAND_IN_INBOX_MAX: usize = 4;

/// Splits `bytes` into peer frames as an inbound connection reads them (u32 big-endian
/// length, at most [`crate::FRAME_BYTES_MAX`]) and decodes each as a [`PeerFrame`]. Stops
/// at the first frame that does not decode or frame, as the connection would end there.
pub fn read_frames(bytes: &[u8]) -> Vec<PeerFrame> {
    let mut codec = crate::transport::tcp::wire::peer_codec(crate::FRAME_BYTES_MAX);
    let mut buffer = BytesMut::from(bytes);
    let mut frames = Vec::new();
    while let Ok(Some(frame)) = codec.decode(&mut buffer) {
        match PeerFrame::decode(frame) {
            Ok(frame) => frames.push(frame),
            Err(_) => break,
        }
    }
    frames
}

/// The transport's check of a frame from `peer` at node `me`: `Some` raft message to hand
/// to the loop, `None` for a valid score frame.
pub fn check_frame(frame: &PeerFrame, peer: u64, me: u64) -> Result<Option<Message>, InboundError> {
    crate::transport::check_frame(frame, peer, me).map(|inbound| match inbound {
        crate::transport::Inbound::Raft(message) => Some(*message),
        crate::transport::Inbound::Score { .. } => None,
    })
}

/// This node's raft state, as the guard reads it just before each step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalState {
    /// This node's id.
    pub id: u64,
    /// Its current term.
    pub term: u64,
    /// The leader it follows in `term` (0: none).
    pub leader_id: u64,
    /// Its last log index.
    pub last_index: u64,
}

/// The guard of a node whose voters are `voters` (itself included), refusing terms more
/// than `max_term_gap` ahead: `Err` says why `message` is dropped before `step`.
pub fn guard_check(
    voters: &BTreeSet<u64>,
    max_term_gap: u64,
    message: &Message,
    me: LocalState,
) -> Result<(), String> {
    let guard = guard::Guard {
        voters: voters.clone(),
        max_term_gap,
    };
    let local = guard::LocalState {
        id: me.id,
        term: me.term,
        leader_id: me.leader_id,
        last_index: me.last_index,
    };
    guard
        .check(message, &local)
        .map_err(|cause| cause.to_string())
}

/// What the stand-in node behind [`node_api`] offers.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeApiOptions {
    /// The leadership the node publishes.
    pub leadership: Leadership,
    /// Test faults on (`/v1/test/faults` exists).
    pub faults: bool,
    /// Fleet leases on, for one listed proxy.
    pub leases: bool,
    /// Routes admit only their roles (as under mutual TLS).
    pub roles_enforced: bool,
}

/// The node API's router for node 1 of a three-node cluster, as the node serves it, in
/// front of a stand-in election loop that drops every request it is sent (as a loop that
/// stops mid-request would). Must be called inside a tokio runtime: the stand-in is a
/// task, which ends when the router is dropped.
pub fn node_api(options: NodeApiOptions) -> axum::Router {
    // The inbox's message type is the loop's own; it is inferred from `Commands::new`.
    let (tx, mut rx) = mpsc::channel(STAND_IN_INBOX_MAX);
    let (leadership, _) = watch::channel(options.leadership);
    let published = leadership.subscribe();
    // The stand-in keeps the leadership sender, so long polls wait as on a live node.
    tokio::spawn(async move {
        let _publisher = leadership;
        while rx.recv().await.is_some() {}
    });
    let proxies = ["http://127.0.0.1:1".to_owned()];
    let observer = Arc::new(Observer::new(1, &[], None));
    crate::api::app(ApiState {
        node_id: 1,
        scope: Scope::default_scope(),
        leadership: published,
        commands: Commands::new(tx),
        metrics: NodeMetrics::new(1),
        leases: options.leases.then(|| LeaseApi::new(60_000, &proxies)),
        faults: options
            .faults
            .then(|| Arc::new(LinkFaults::new(true, 1, [1, 2, 3]))),
        scores: None,
        members: watch::channel(MemberList::default()).1,
        announce: watch::channel(Vec::new()).1,
        observer: Arc::clone(&observer),
        fences: Arc::new(crate::announce::ProxyFences::new(
            palisade_protocol::DEFAULT_SCOPE.to_owned(),
            None,
            palisade_client::ClientTls::new(),
            observer,
        )),
        shutdown: CancellationToken::new(),
        roles_enforced: options.roles_enforced,
        scopes: None,
    })
}
