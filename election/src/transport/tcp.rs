//! raft over TCP between the configured peers.
//!
//! Every connection carries u32-big-endian-length-prefixed prost frames in one direction:
//! first a [`Hello`] naming caller and callee, then [`PeerFrame`]s. A node dials each peer
//! once (one writer task per peer, with a bounded queue, reconnecting with capped
//! exponential backoff) and accepts the peers' connections on its own peer address (one
//! reader task per connection). While a peer is not connected, messages to it are dropped
//! and the loop reports it unreachable; raft resends.
//!
//! Only configured ids are accepted, and every message must name the connection's peer as
//! sender and this node as recipient. There is no authentication beyond that: run peers on
//! a trusted network.
//!
//! Test faults ([`super::faults`]) hook in at two places: the send path (drop, or stamp a
//! due time that the writer waits for) and the reader (drop what a cut-off peer sent).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prost::Message as _;
use raft::eraftpb::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, info_span, warn};

use super::faults::{LinkFaults, Outbound};
use super::{
    Delivery, FRAME_BYTES_MAX, Hello, PEER_QUEUE_MAX, PROTOCOL_VERSION, PeerFrame, PeerInbox,
    Transport, check_inbound, encode_raft,
};

/// Time allowed for a TCP connect to a peer.
pub const PEER_CONNECT_TIMEOUT_MS: u64 = 1_000;
/// Time allowed for writing one batch to a peer before the connection is dropped: a
/// stopped peer must not hold messages (and memory) forever.
pub const PEER_WRITE_TIMEOUT_MS: u64 = 2_000;
/// Time a new inbound connection has to send its [`Hello`].
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

/// A message queued for a peer's writer.
struct Outgoing {
    msg: Message,
    /// Not to be written before this instant (a test delay); `None` almost always.
    due: Option<tokio::time::Instant>,
}

/// One peer's writer: its queue and whether it is connected now.
struct PeerLink {
    queue: mpsc::Sender<Outgoing>,
    connected: Arc<AtomicBool>,
}

/// The TCP transport of one node.
pub(crate) struct TcpTransport {
    links: HashMap<u64, PeerLink>,
    faults: Arc<LinkFaults>,
}

impl Transport for TcpTransport {
    fn send(&mut self, msg: Message) -> Delivery {
        let Some(link) = self.links.get(&msg.to) else {
            return Delivery::Unreachable;
        };
        if !link.connected.load(Ordering::Acquire) {
            return Delivery::Unreachable;
        }
        let due = match self.faults.outbound(msg.to) {
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

/// Binds this node's peer address, spawns the listener and one writer per peer into
/// `tasks`, and returns the transport and the bound address.
pub(crate) async fn start(
    id: u64,
    peers: &BTreeMap<u64, String>,
    inbox: PeerInbox,
    faults: Arc<LinkFaults>,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<()>,
) -> io::Result<(TcpTransport, SocketAddr)> {
    let own = peers
        .get(&id)
        .ok_or_else(|| io::Error::other(format!("node {id} has no peer address")))?;
    let listener = TcpListener::bind(own.as_str()).await?;
    let local = listener.local_addr()?;
    let known: Vec<u64> = peers.keys().copied().collect();
    tasks.spawn(
        run_listener(
            listener,
            id,
            known,
            inbox,
            Arc::clone(&faults),
            shutdown.clone(),
        )
        .instrument(info_span!("peer_listener", node_id = id)),
    );
    let mut links = HashMap::new();
    for (&peer, addr) in peers.iter().filter(|(p, _)| **p != id) {
        let (tx, rx) = mpsc::channel(PEER_QUEUE_MAX);
        let connected = Arc::new(AtomicBool::new(false));
        tasks.spawn(
            run_writer(
                id,
                peer,
                addr.clone(),
                rx,
                connected.clone(),
                shutdown.clone(),
            )
            .instrument(info_span!("peer_writer", node_id = id, peer_id = peer)),
        );
        links.insert(
            peer,
            PeerLink {
                queue: tx,
                connected,
            },
        );
    }
    Ok((TcpTransport { links, faults }, local))
}

async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame too large"))?;
    w.write_u32(len).await?;
    w.write_all(body).await
}

/// Reads one frame into `buf`. `Ok(false)` on a clean close between frames.
async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
    buf: &mut Vec<u8>,
) -> io::Result<bool> {
    let len = match r.read_u32().await {
        Ok(len) => len as usize,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(e),
    };
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is over the limit of {max}"),
        ));
    }
    buf.clear();
    buf.resize(len, 0);
    r.read_exact(buf).await?;
    Ok(true)
}

/// Sleeps `ms` with up to 25% jitter, or until shutdown. Returns false on shutdown.
async fn backoff_sleep(ms: u64, shutdown: &CancellationToken) -> bool {
    let jitter = rand::random_range(0..=ms / 4);
    tokio::select! {
        () = shutdown.cancelled() => false,
        () = tokio::time::sleep(Duration::from_millis(ms + jitter)) => true,
    }
}

async fn connect(
    addr: &str,
    id: u64,
    peer: u64,
) -> io::Result<(OwnedReadHalf, BufWriter<OwnedWriteHalf>)> {
    let stream = tokio::time::timeout(
        Duration::from_millis(PEER_CONNECT_TIMEOUT_MS),
        TcpStream::connect(addr),
    )
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    stream.set_nodelay(true)?;
    let (r, w) = stream.into_split();
    let mut w = BufWriter::new(w);
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        from: id,
        to: peer,
    };
    write_frame(&mut w, &hello.encode_to_vec()).await?;
    w.flush().await?;
    Ok((r, w))
}

/// Keeps a connection to `peer` and writes its queue to it.
async fn run_writer(
    id: u64,
    peer: u64,
    addr: String,
    mut rx: mpsc::Receiver<Outgoing>,
    connected: Arc<AtomicBool>,
    shutdown: CancellationToken,
) {
    let mut backoff_ms = PEER_BACKOFF_MIN_MS;
    let mut batch = Vec::with_capacity(PEER_BATCH_MAX);
    let mut was_connected = true; // log the first failure
    loop {
        // Whatever was queued before the connection broke is stale: raft resends.
        while rx.try_recv().is_ok() {}
        let connecting = tokio::select! {
            () = shutdown.cancelled() => return,
            c = connect(&addr, id, peer) => c,
        };
        let (mut r, mut w) = match connecting {
            Ok(rw) => rw,
            Err(err) => {
                if was_connected {
                    debug!(peer_id = peer, %addr, cause = %err, "cannot connect to peer");
                    was_connected = false;
                }
                if !backoff_sleep(backoff_ms, &shutdown).await {
                    return;
                }
                backoff_ms = (backoff_ms * 2).min(PEER_BACKOFF_MAX_MS);
                continue;
            }
        };
        info!(peer_id = peer, %addr, "connected to peer");
        backoff_ms = PEER_BACKOFF_MIN_MS;
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
        if !backoff_sleep(backoff_ms, &shutdown).await {
            return;
        }
    }
}

async fn write_batch(
    w: &mut BufWriter<OwnedWriteHalf>,
    id: u64,
    peer: u64,
    batch: &mut Vec<Message>,
) -> io::Result<()> {
    for msg in batch.drain(..) {
        let payload = match encode_raft(&msg) {
            Ok(p) => p,
            Err(err) => {
                warn!(peer_id = peer, cause = %err, "cannot encode raft message; dropped");
                continue;
            }
        };
        let frame = PeerFrame {
            from: id,
            to: peer,
            payload,
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
        write_frame(w, &frame).await?;
    }
    w.flush().await
}

/// The live inbound connection of each peer; a newer one closes the older.
type Current = Arc<Mutex<HashMap<u64, CancellationToken>>>;

async fn run_listener(
    listener: TcpListener,
    id: u64,
    known: Vec<u64>,
    inbox: PeerInbox,
    faults: Arc<LinkFaults>,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(PEER_CONNECTIONS_MAX));
    let current: Current = Arc::default();
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
                if !backoff_sleep(PEER_BACKOFF_MIN_MS, &shutdown).await {
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
            known: known.clone(),
            inbox: inbox.clone(),
            faults: Arc::clone(&faults),
            shutdown: shutdown.clone(),
            current: current.clone(),
        };
        readers.spawn(
            async move {
                if let Err(err) = read_connection(stream, &ctx).await {
                    info!(%remote, cause = %err, "peer connection closed");
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
    current: Current,
}

async fn read_connection(stream: TcpStream, ctx: &ReaderCtx) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut r = tokio::io::BufReader::new(stream);
    let mut buf = Vec::new();
    let got = tokio::time::timeout(
        Duration::from_millis(PEER_HANDSHAKE_TIMEOUT_MS),
        read_frame(&mut r, HELLO_BYTES_MAX, &mut buf),
    )
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no handshake"))??;
    if !got {
        return Ok(());
    }
    let hello =
        Hello::decode(buf.as_slice()).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
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
    let mine = CancellationToken::new();
    if let Some(older) = ctx
        .current
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(peer, mine.clone())
    {
        older.cancel();
    }
    debug!(peer_id = peer, "peer connected");
    loop {
        let got = tokio::select! {
            () = ctx.shutdown.cancelled() => return Ok(()),
            () = mine.cancelled() => return Ok(()),
            g = read_frame(&mut r, FRAME_BYTES_MAX, &mut buf) => g?,
        };
        if !got {
            return Ok(());
        }
        let frame = PeerFrame::decode(buf.as_slice())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if frame.from != peer || frame.to != ctx.id {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "frame {} -> {} on the connection {peer} -> {}",
                    frame.from, frame.to, ctx.id
                ),
            ));
        }
        let msg = check_inbound(&frame.payload, peer, ctx.id)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if ctx.faults.drops_from(peer) {
            continue;
        }
        if !ctx.inbox.deliver(msg).await {
            return Ok(());
        }
    }
}
