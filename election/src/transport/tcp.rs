//! raft over TCP between the configured peers.
//!
//! Every connection carries prost frames in one direction, each behind a u32 big-endian
//! length ([`LengthDelimitedCodec`], at most [`FRAME_BYTES_MAX`] bytes): first a [`Hello`]
//! naming caller and callee, then [`PeerFrame`]s (raft messages, or score frames of
//! `crate::score`). A node dials each peer
//! once (one writer task per peer, with a bounded queue, reconnecting with capped
//! exponential backoff) and accepts the peers' connections on its own peer address (one
//! reader task per connection). While a peer is not connected, messages to it are dropped
//! and the loop reports it unreachable; raft resends.
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

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt as _};
use prost::Message as _;
use raft::eraftpb::Message;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, info_span, warn};

use self::registry::Registry;

use super::faults::{LinkFaults, Outbound};
use super::{
    Delivery, FRAME_BYTES_MAX, Hello, Inbound, PEER_QUEUE_MAX, PROTOCOL_VERSION, PeerFrame,
    PeerInbox, ScoreFrame, Transport, check_frame, encode_raft,
};
use crate::tls::{NodeTlsMaterial, check_peer_certificate, peer_server_name};

mod registry;

/// Time allowed for a TCP connect to a peer.
pub const PEER_CONNECT_TIMEOUT_MS: u64 = 1_000;
/// Time allowed for writing one batch to a peer before the connection is dropped: a
/// stopped peer must not hold messages (and memory) forever.
pub const PEER_WRITE_TIMEOUT_MS: u64 = 2_000;
/// Time a new inbound connection has to complete its TLS handshake, and then again to send
/// its [`Hello`]; also the time a dialer's TLS handshake may take.
pub const PEER_HANDSHAKE_TIMEOUT_MS: u64 = 2_000;
/// First reconnect delay after a failed connect.
pub const PEER_BACKOFF_MIN_MS: u64 = 20;
/// Cap of the reconnect delay: a restarted peer is reached within this.
pub const PEER_BACKOFF_MAX_MS: u64 = 1_000;
/// Inbound peer connections open at once; more are closed at accept. Each peer needs one.
pub const PEER_CONNECTIONS_MAX: usize = 64;
/// Messages coalesced into one write and flush.
pub const PEER_BATCH_MAX: usize = 64;
/// Largest [`Hello`] frame, in bytes (it is three small integers).
const HELLO_BYTES_MAX: usize = 64;

/// What a peer's writer sends: a raft message or a score frame.
enum Payload {
    Raft(Message),
    Score(ScoreFrame),
}

/// A message queued for a peer's writer.
struct Outgoing {
    msg: Payload,
    /// Not to be written before this instant (a test delay); `None` almost always.
    due: Option<tokio::time::Instant>,
}

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

/// The ids the listener accepts handshakes from; membership changes update it.
type KnownPeers = Arc<std::sync::RwLock<Vec<u64>>>;

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

/// The receiving half of a dialed peer connection, plaintext or TLS (only read to learn
/// that the peer closed it).
type PeerRead = Box<dyn AsyncRead + Send + Unpin>;
/// The sending half of a dialed peer connection, plaintext or TLS.
type PeerWrite = Box<dyn AsyncWrite + Send + Unpin>;
/// The sending half of a peer connection: frames out, each behind its length.
type FrameWriter = FramedWrite<PeerWrite, LengthDelimitedCodec>;

/// The peer links' framing: a u32 big-endian length before each frame of at most `max`
/// bytes. A longer frame ends the connection: read, from its length alone (`InvalidData`);
/// written, before anything is sent (`InvalidInput`).
fn peer_codec(max: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_type::<u32>()
        .big_endian()
        .max_frame_length(max)
        .new_codec()
}

/// Sleeps `delay`, or until shutdown. Returns false on shutdown.
async fn sleep_unless_shutdown(delay: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => false,
        () = tokio::time::sleep(delay) => true,
    }
}

/// The reconnect delays of one peer link: the project's one backoff policy (exponential
/// with jitter, see [`palisade_client::backoff`]), started afresh after each success.
fn reconnect_delays() -> impl Iterator<Item = Duration> + Send {
    palisade_client::backoff::delays(
        Duration::from_millis(PEER_BACKOFF_MIN_MS),
        Duration::from_millis(PEER_BACKOFF_MAX_MS),
    )
}

async fn connect(
    addr: &str,
    id: u64,
    peer: u64,
    tls: Option<&TlsConnector>,
) -> io::Result<(PeerRead, FrameWriter)> {
    let stream = tokio::time::timeout(
        Duration::from_millis(PEER_CONNECT_TIMEOUT_MS),
        TcpStream::connect(addr),
    )
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    stream.set_nodelay(true)?;
    let (r, w): (PeerRead, PeerWrite) = match tls {
        None => {
            let (r, w) = stream.into_split();
            (Box::new(r), Box::new(w))
        }
        Some(connector) => {
            // The callee must prove it is `node-<peer>`: a certificate from the CA for
            // another name (or another node at this address) fails here.
            let stream = tokio::time::timeout(
                Duration::from_millis(PEER_HANDSHAKE_TIMEOUT_MS),
                connector.connect(peer_server_name(peer)?, stream),
            )
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
            let (r, w) = tokio::io::split(stream);
            (Box::new(r), Box::new(w))
        }
    };
    let mut w = FramedWrite::new(w, peer_codec(FRAME_BYTES_MAX));
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        from: id,
        to: peer,
    };
    w.send(Bytes::from(hello.encode_to_vec())).await?;
    Ok((r, w))
}

/// Keeps a connection to `peer` and writes its queue to it.
async fn run_writer(
    id: u64,
    peer: u64,
    addr: String,
    mut rx: mpsc::Receiver<Outgoing>,
    connected: Arc<AtomicBool>,
    tls: Option<TlsConnector>,
    shutdown: CancellationToken,
) {
    let mut delays = reconnect_delays();
    let mut batch = Vec::with_capacity(PEER_BATCH_MAX);
    let mut was_connected = true; // log the first failure
    loop {
        // Whatever was queued before the connection broke is stale: raft resends.
        while rx.try_recv().is_ok() {}
        let connecting = tokio::select! {
            () = shutdown.cancelled() => return,
            c = connect(&addr, id, peer, tls.as_ref()) => c,
        };
        let (mut r, mut w) = match connecting {
            Ok(rw) => rw,
            Err(err) => {
                if was_connected {
                    debug!(peer_id = peer, %addr, cause = %err, "cannot connect to peer");
                    was_connected = false;
                }
                let delay = delays
                    .next()
                    .unwrap_or(Duration::from_millis(PEER_BACKOFF_MAX_MS));
                if !sleep_unless_shutdown(delay, &shutdown).await {
                    return;
                }
                continue;
            }
        };
        info!(peer_id = peer, %addr, "connected to peer");
        delays = reconnect_delays();
        was_connected = true;
        connected.store(true, Ordering::Release);
        let mut probe = [0u8; 1];
        // A delayed message taken from the queue but not yet due: it starts the next batch.
        let mut next: Option<Outgoing> = None;
        loop {
            let first = if let Some(m) = next.take() {
                m
            } else {
                tokio::select! {
                    () = shutdown.cancelled() => {
                        connected.store(false, Ordering::Release);
                        return;
                    }
                    m = rx.recv() => match m {
                        Some(m) => m,
                        None => return,
                    },
                    // The peer never writes on this connection: any read result means it
                    // was closed (the peer restarted or died), so reconnect now rather than
                    // at the next failed write, which would lose that message.
                    _ = r.read(&mut probe) => {
                        debug!(peer_id = peer, "peer closed the connection");
                        break;
                    }
                }
            };
            if let Some(due) = first.due {
                // A test delay: wait for the message's due time, in queue order.
                tokio::select! {
                    () = shutdown.cancelled() => {
                        connected.store(false, Ordering::Release);
                        return;
                    }
                    () = tokio::time::sleep_until(due) => {}
                }
            }
            batch.push(first.msg);
            while batch.len() < PEER_BATCH_MAX {
                match rx.try_recv() {
                    Ok(m) if m.due.is_some_and(|d| d > tokio::time::Instant::now()) => {
                        next = Some(m);
                        break;
                    }
                    Ok(m) => batch.push(m.msg),
                    Err(_) => break,
                }
            }
            let written = tokio::time::timeout(
                Duration::from_millis(PEER_WRITE_TIMEOUT_MS),
                write_batch(&mut w, id, peer, &mut batch),
            )
            .await;
            batch.clear();
            match written {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    warn!(peer_id = peer, cause = %err, "peer connection failed");
                    break;
                }
                Err(_) => {
                    warn!(
                        peer_id = peer,
                        timeout_ms = PEER_WRITE_TIMEOUT_MS,
                        "peer write timed out"
                    );
                    break;
                }
            }
        }
        connected.store(false, Ordering::Release);
        let delay = delays
            .next()
            .unwrap_or(Duration::from_millis(PEER_BACKOFF_MAX_MS));
        if !sleep_unless_shutdown(delay, &shutdown).await {
            return;
        }
    }
}

async fn write_batch(
    w: &mut FrameWriter,
    id: u64,
    peer: u64,
    batch: &mut Vec<Payload>,
) -> io::Result<()> {
    for msg in batch.drain(..) {
        let frame = match msg {
            Payload::Raft(msg) => match encode_raft(&msg) {
                Ok(payload) => PeerFrame {
                    from: id,
                    to: peer,
                    payload,
                    score: None,
                },
                Err(err) => {
                    warn!(peer_id = peer, cause = %err, "cannot encode raft message; dropped");
                    continue;
                }
            },
            Payload::Score(score) => PeerFrame {
                from: id,
                to: peer,
                payload: Vec::new(),
                score: Some(score),
            },
        }
        .encode_to_vec();
        if frame.len() > FRAME_BYTES_MAX {
            warn!(
                peer_id = peer,
                bytes = frame.len(),
                limit = FRAME_BYTES_MAX,
                "raft message over the frame limit; dropped"
            );
            continue;
        }
        // `feed` buffers; the one flush below writes the whole batch.
        w.feed(Bytes::from(frame)).await?;
    }
    SinkExt::<Bytes>::flush(w).await
}

async fn run_listener(
    listener: TcpListener,
    id: u64,
    known: KnownPeers,
    inbox: PeerInbox,
    faults: Arc<LinkFaults>,
    tls: Option<TlsAcceptor>,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(PEER_CONNECTIONS_MAX));
    let current = Registry::default();
    let mut readers = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            a = listener.accept() => a,
            Some(_) = readers.join_next(), if !readers.is_empty() => continue,
        };
        let (stream, remote) = match accepted {
            Ok(a) => a,
            Err(err) => {
                warn!(cause = %err, "peer accept failed");
                if !sleep_unless_shutdown(Duration::from_millis(PEER_BACKOFF_MIN_MS), &shutdown)
                    .await
                {
                    break;
                }
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            warn!(%remote, limit = PEER_CONNECTIONS_MAX, "too many peer connections; closed");
            continue;
        };
        let ctx = ReaderCtx {
            id,
            // The members as of this accept: a peer removed later is refused at its next
            // connection, and its messages meanwhile by the election loop's guard.
            known: known
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
            inbox: inbox.clone(),
            faults: Arc::clone(&faults),
            shutdown: shutdown.clone(),
            current: current.clone(),
            tls: tls.is_some(),
        };
        let tls = tls.clone();
        readers.spawn(
            async move {
                // This side never writes, so a failure to set no-delay changes nothing.
                let _ = stream.set_nodelay(true);
                registry::keep_alive(&stream);
                let ended = match tls {
                    None => read_frames(stream, &ctx, None).await,
                    Some(acceptor) => match tokio::time::timeout(
                        Duration::from_millis(PEER_HANDSHAKE_TIMEOUT_MS),
                        acceptor.accept(stream),
                    )
                    .await
                    {
                        Ok(Ok(stream)) => {
                            let cert = stream
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first())
                                .map(|c| c.clone().into_owned());
                            read_frames(stream, &ctx, cert).await
                        }
                        Ok(Err(err)) => Err(io::Error::new(
                            io::ErrorKind::PermissionDenied,
                            format!("TLS handshake refused: {err}"),
                        )),
                        Err(_) => Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "no TLS handshake in time",
                        )),
                    },
                };
                match ended {
                    Err(err) if err.kind() == io::ErrorKind::PermissionDenied => {
                        warn!(%remote, cause = %err, "peer connection refused");
                    }
                    Err(err) => info!(%remote, cause = %err, "peer connection closed"),
                    Ok(()) => {}
                }
                drop(permit);
            }
            .in_current_span(),
        );
    }
    readers.shutdown().await;
}

struct ReaderCtx {
    id: u64,
    known: Vec<u64>,
    inbox: PeerInbox,
    faults: Arc<LinkFaults>,
    shutdown: CancellationToken,
    current: Registry,
    /// Whether connections are mutual TLS: then the hello's id must be the certificate's.
    tls: bool,
}

/// Reads one inbound connection: the handshake (at most [`HELLO_BYTES_MAX`] bytes, within
/// [`PEER_HANDSHAKE_TIMEOUT_MS`]), then checked raft messages into the inbox until the
/// connection closes, a newer one from the same peer replaces it, or a frame is refused.
/// A clean close between frames is `Ok`; a frame cut short by the close is an error.
/// With TLS, `cert` is the certificate the peer presented: it must name the id the hello
/// claims, or the connection is refused (`PermissionDenied`) before any frame is read.
async fn read_frames<R: AsyncRead + Unpin>(
    stream: R,
    ctx: &ReaderCtx,
    cert: Option<CertificateDer<'static>>,
) -> io::Result<()> {
    let mut frames = FramedRead::new(stream, peer_codec(HELLO_BYTES_MAX));
    let first = tokio::time::timeout(
        Duration::from_millis(PEER_HANDSHAKE_TIMEOUT_MS),
        frames.next(),
    )
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no handshake"))?;
    let Some(first) = first else {
        return Ok(());
    };
    let hello = Hello::decode(first?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if hello.protocol != PROTOCOL_VERSION {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "peer speaks protocol {}, this node {PROTOCOL_VERSION}",
                hello.protocol
            ),
        ));
    }
    let peer = hello.from;
    if peer == ctx.id || !ctx.known.contains(&peer) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("refused handshake from unknown node id {peer}"),
        ));
    }
    if hello.to != ctx.id {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("handshake for node {} arrived at node {}", hello.to, ctx.id),
        ));
    }
    if ctx.tls {
        check_peer_certificate(cert.as_ref(), peer).map_err(|reason| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("refused handshake claiming node {peer}: {reason}"),
            )
        })?;
    }
    let registration = ctx
        .current
        .register(peer, ctx.tls)
        .await
        .map_err(|reason| io::Error::new(io::ErrorKind::PermissionDenied, reason))?;
    let mine = registration.cancelled();
    debug!(peer_id = peer, "peer connected");
    // The handshake is done: from now on frames may be as large as raft's.
    frames.decoder_mut().set_max_frame_length(FRAME_BYTES_MAX);
    loop {
        let next = tokio::select! {
            () = ctx.shutdown.cancelled() => return Ok(()),
            () = mine.cancelled() => return Ok(()),
            next = frames.next() => next,
        };
        let Some(bytes) = next else {
            return Ok(());
        };
        let frame =
            PeerFrame::decode(bytes?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if frame.from != peer || frame.to != ctx.id {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "frame {} -> {} on the connection {peer} -> {}",
                    frame.from, frame.to, ctx.id
                ),
            ));
        }
        // A malformed frame (raft or score) ends the connection with the reason logged
        // by the listener; the peer reconnects, and a broken peer keeps being refused.
        let inbound = check_frame(&frame, peer, ctx.id)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if ctx.faults.drops_from(peer) {
            continue;
        }
        let delivered = match inbound {
            Inbound::Raft(msg) => ctx.inbox.deliver(msg).await,
            Inbound::Score(score) => ctx.inbox.deliver_score(peer, score).await,
        };
        if !delivered {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests;
