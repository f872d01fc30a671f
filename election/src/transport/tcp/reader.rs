//! The receiving side of the peer links: the listener accepts peer connections (at most
//! [`PEER_CONNECTIONS_MAX`]), and one reader task per connection checks its hello (and,
//! with TLS, the certificate behind it), then delivers its checked frames to the inbox.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use prost::Message as _;
use rustls::pki_types::CertificateDer;
use tokio::io::AsyncRead;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, warn};

use super::registry::{self, Registry};
use super::wire::{
    HELLO_BYTES_MAX, PEER_BACKOFF_MIN_MS, PEER_HANDSHAKE_TIMEOUT_MS, peer_codec,
    sleep_unless_shutdown,
};
use crate::config::FRAME_BYTES_MAX;
use crate::tls::check_peer_certificate;
use crate::transport::faults::LinkFaults;
use crate::transport::{Hello, PROTOCOL_VERSION, PeerFrame, PeerInbox, check_frame};

/// Inbound peer connections open at once; more are closed at accept. Each peer needs one.
pub const PEER_CONNECTIONS_MAX: usize = 64;

/// The ids the listener accepts handshakes from; membership changes update it.
pub(super) type KnownPeers = Arc<std::sync::RwLock<Vec<u64>>>;

pub(super) async fn run_listener(
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

/// What one reader needs: this node, the peers it accepts, where checked frames go.
pub(super) struct ReaderCtx {
    pub(super) id: u64,
    pub(super) known: Vec<u64>,
    pub(super) inbox: PeerInbox,
    pub(super) faults: Arc<LinkFaults>,
    pub(super) shutdown: CancellationToken,
    pub(super) current: Registry,
    /// Whether connections are mutual TLS: then the hello's id must be the certificate's.
    pub(super) tls: bool,
}

/// Reads one inbound connection: the handshake (at most [`HELLO_BYTES_MAX`] bytes, within
/// [`PEER_HANDSHAKE_TIMEOUT_MS`]), then checked raft messages into the inbox until the
/// connection closes, a newer one from the same peer replaces it, or a frame is refused.
/// A clean close between frames is `Ok`; a frame cut short by the close is an error.
/// With TLS, `cert` is the certificate the peer presented: it must name the id the hello
/// claims, or the connection is refused (`PermissionDenied`) before any frame is read.
pub(super) async fn read_frames<R: AsyncRead + Unpin>(
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
        if !ctx.inbox.deliver(inbound).await {
            return Ok(());
        }
    }
}
