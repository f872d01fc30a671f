//! The sending side of the peer links: one writer task per peer dials it, says hello, and
//! writes its queue in batches, reconnecting with backoff when the connection breaks.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::SinkExt;
use prost::Message as _;
use raft::eraftpb::Message;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;
use tokio_util::codec::{FramedWrite, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::wire::{
    PEER_BACKOFF_MIN_MS, PEER_HANDSHAKE_TIMEOUT_MS, peer_codec, sleep_unless_shutdown,
};
use crate::config::FRAME_BYTES_MAX;
use crate::tls::peer_server_name;
use crate::transport::{Hello, PROTOCOL_VERSION, PeerFrame, ScoreFrame, encode_raft};

/// Time allowed for a TCP connect to a peer.
pub const PEER_CONNECT_TIMEOUT_MS: u64 = 1_000;
/// Time allowed for writing one batch to a peer before the connection is dropped: a
/// stopped peer must not hold messages (and memory) forever.
pub const PEER_WRITE_TIMEOUT_MS: u64 = 2_000;
/// Cap of the reconnect delay: a restarted peer is reached within this.
pub const PEER_BACKOFF_MAX_MS: u64 = 1_000;
/// Messages coalesced into one write and flush.
pub const PEER_BATCH_MAX: usize = 64;

/// What a peer's writer sends: a raft message or a score frame.
pub(super) enum Payload {
    Raft(Message),
    Score(ScoreFrame),
}

/// A message queued for a peer's writer.
pub(super) struct Outgoing {
    pub(super) msg: Payload,
    /// Not to be written before this instant (a test delay); `None` almost always.
    pub(super) due: Option<tokio::time::Instant>,
}

/// The receiving half of a dialed peer connection, plaintext or TLS (only read to learn
/// that the peer closed it).
type PeerRead = Box<dyn AsyncRead + Send + Unpin>;
/// The sending half of a dialed peer connection, plaintext or TLS.
type PeerWrite = Box<dyn AsyncWrite + Send + Unpin>;
/// The sending half of a peer connection: frames out, each behind its length.
type FrameWriter = FramedWrite<PeerWrite, LengthDelimitedCodec>;

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
pub(super) async fn run_writer(
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
