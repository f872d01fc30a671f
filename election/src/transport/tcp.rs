//! raft over TCP between the configured peers.
//!
//! Every connection carries prost frames in one direction, each behind a u32 big-endian
//! length (`LengthDelimitedCodec`, at most [`FRAME_BYTES_MAX`](super::FRAME_BYTES_MAX)
//! bytes): first a [`Hello`](super::Hello) naming caller and callee, then
//! [`PeerFrame`](super::PeerFrame)s (raft messages, or score frames of `crate::score`). A
//! node dials each peer once (one writer task per peer, with a bounded queue, reconnecting
//! with capped exponential backoff) and accepts the peers' connections on its own peer
//! address (one reader task per connection). While a peer is not connected, messages to
//! it are dropped and the loop reports it unreachable; raft resends.
//!
//! Only configured ids are accepted, and every message must name the connection's peer as
//! sender and this node as recipient. With TLS ([`crate::tls`]) every connection is mutual
//! TLS under the cluster CA: the dialer checks that the callee's certificate names
//! `node-<callee>`, and the acceptor that the caller's names the id its hello claims. A
//! new connection replaces the live one of its peer only when its certificate proves that
//! identity; in plaintext mode (loopback only, or `--insecure`) it replaces it only once
//! the old one has ended ([`registry`]).
//!
//! Test faults ([`super::faults`]) hook in at two places: the send path (drop, or stamp a
//! due time that the writer waits for) and the reader (drop what a cut-off peer sent).
//!
//! # Layout
//! - `tcp.rs` (this file): [`TcpTransport`], the election loop's side, and [`start`].
//! - `writer`: one task per peer that dials it and writes its queue.
//! - `reader`: the listener and one task per inbound connection.
//! - `wire`: the framing and the handshake limits both ends share.
//! - `registry`: which inbound connection speaks for each peer.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use raft::eraftpb::Message;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, info, info_span};

use self::reader::{KnownPeers, run_listener};
use self::writer::{Outgoing, Payload, run_writer};
use super::faults::{LinkFaults, Outbound};
use super::{Delivery, PeerInbox, ScoreFrame, Transport};
use crate::config::PEER_QUEUE_MAX;
use crate::tls::NodeTlsMaterial;

mod reader;
mod registry;
// Visible to the crate for the fuzz targets' entry points (`crate::fuzzing`).
pub(crate) mod wire;
mod writer;

/// One peer's writer: its queue and whether it is connected now.
struct PeerLink {
    queue: mpsc::Sender<Outgoing>,
    connected: Arc<AtomicBool>,
    /// The address the writer dials.
    addr: String,
    /// Stops this writer alone (a child of the node's shutdown), when the peer leaves the
    /// cluster or moves to another address.
    stop: CancellationToken,
}

/// The TCP transport of one node.
pub(crate) struct TcpTransport {
    links: HashMap<u64, PeerLink>,
    faults: Arc<LinkFaults>,
    /// What new writers need (peers added by a membership change).
    id: u64,
    tls: Option<TlsConnector>,
    shutdown: CancellationToken,
    known: KnownPeers,
}

impl TcpTransport {
    /// Starts the writer of `peer` at `addr`; `tasks` when starting, else a detached task
    /// (it ends with its own token or the node's shutdown).
    fn spawn_link(&mut self, peer: u64, addr: &str, tasks: Option<&mut JoinSet<()>>) {
        let (tx, rx) = mpsc::channel(PEER_QUEUE_MAX);
        let connected = Arc::new(AtomicBool::new(false));
        let stop = self.shutdown.child_token();
        let writer = run_writer(
            self.id,
            peer,
            addr.to_owned(),
            rx,
            connected.clone(),
            self.tls.clone(),
            stop.clone(),
        )
        .instrument(info_span!("peer_writer", node_id = self.id, peer_id = peer));
        match tasks {
            Some(tasks) => {
                tasks.spawn(writer);
            }
            None => {
                tokio::spawn(writer);
            }
        }
        self.links.insert(
            peer,
            PeerLink {
                queue: tx,
                connected,
                addr: addr.to_owned(),
                stop,
            },
        );
    }
}

impl TcpTransport {
    /// Queues `msg` for `to`'s writer, through the test faults (which delay or drop score
    /// frames like raft messages, so a delayed link also shows a longer round trip).
    fn queue(&mut self, to: u64, msg: Payload) -> Delivery {
        let Some(link) = self.links.get(&to) else {
            return Delivery::Unreachable;
        };
        if !link.connected.load(Ordering::Acquire) {
            return Delivery::Unreachable;
        }
        let due = match self.faults.outbound(to) {
            Outbound::Pass => None,
            // A black hole: raft is told nothing, as with a real partition at first.
            Outbound::Drop => return Delivery::Queued,
            Outbound::Delay(delay) => Some(tokio::time::Instant::now() + delay),
        };
        match link.queue.try_send(Outgoing { msg, due }) {
            Ok(()) => Delivery::Queued,
            Err(_) => Delivery::Unreachable,
        }
    }
}

impl Transport for TcpTransport {
    fn send(&mut self, msg: Message) -> Delivery {
        self.queue(msg.to, Payload::Raft(msg))
    }

    fn set_peers(&mut self, peers: &BTreeMap<u64, String>) {
        let gone: Vec<u64> = self
            .links
            .iter()
            .filter(|(id, link)| peers.get(id) != Some(&link.addr))
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            if let Some(link) = self.links.remove(&id) {
                link.stop.cancel();
                info!(node_id = self.id, peer_id = id, addr = %link.addr, "peer link closed");
            }
        }
        for (&id, addr) in peers {
            if id != self.id && !self.links.contains_key(&id) {
                info!(node_id = self.id, peer_id = id, %addr, "peer link opened");
                self.spawn_link(id, addr, None);
            }
        }
        let mut known = self
            .known
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *known = peers.keys().copied().collect();
    }

    fn send_score(&mut self, to: u64, frame: ScoreFrame) -> Delivery {
        self.queue(to, Payload::Score(frame))
    }
}

/// Binds this node's peer address, spawns the listener and one writer per peer into
/// `tasks`, and returns the transport and the bound address. With `tls`, every link is
/// mutual TLS.
pub(crate) async fn start(
    id: u64,
    peers: &BTreeMap<u64, String>,
    inbox: PeerInbox,
    faults: Arc<LinkFaults>,
    tls: Option<&NodeTlsMaterial>,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<()>,
) -> io::Result<(TcpTransport, SocketAddr)> {
    let own = peers
        .get(&id)
        .ok_or_else(|| io::Error::other(format!("node {id} has no peer address")))?;
    let listener = TcpListener::bind(own.as_str()).await?;
    let local = listener.local_addr()?;
    let known: KnownPeers = Arc::new(std::sync::RwLock::new(peers.keys().copied().collect()));
    tasks.spawn(
        run_listener(
            listener,
            id,
            Arc::clone(&known),
            inbox,
            Arc::clone(&faults),
            tls.map(|t| t.peer_acceptor.clone()),
            shutdown.clone(),
        )
        .instrument(info_span!("peer_listener", node_id = id)),
    );
    let mut transport = TcpTransport {
        links: HashMap::new(),
        faults,
        id,
        tls: tls.map(|t| t.peer_connector.clone()),
        shutdown: shutdown.clone(),
        known,
    };
    for (&peer, addr) in peers.iter().filter(|(p, _)| **p != id) {
        transport.spawn_link(peer, addr, Some(&mut *tasks));
    }
    Ok((transport, local))
}

#[cfg(test)]
mod tests;
