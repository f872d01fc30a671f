//! What both ends of a peer connection share: the framing, the handshake's limits, and
//! waiting out a backoff unless the node stops.

use std::time::Duration;

use tokio_util::codec::LengthDelimitedCodec;
use tokio_util::sync::CancellationToken;

/// Time a new inbound connection has to complete its TLS handshake, and then again to send
/// its [`Hello`](crate::transport::Hello); also the time a dialer's TLS handshake may take.
pub const PEER_HANDSHAKE_TIMEOUT_MS: u64 = 2_000;
/// First reconnect delay after a failed connect.
pub const PEER_BACKOFF_MIN_MS: u64 = 20;
/// Largest [`Hello`](crate::transport::Hello) frame, in bytes (it is three small integers).
pub(super) const HELLO_BYTES_MAX: usize = 64;

/// The peer links' framing: a u32 big-endian length before each frame of at most `max`
/// bytes. A longer frame ends the connection: read, from its length alone (`InvalidData`);
/// written, before anything is sent (`InvalidInput`).
pub(crate) fn peer_codec(max: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_type::<u32>()
        .big_endian()
        .max_frame_length(max)
        .new_codec()
}

/// Sleeps `delay`, or until shutdown. Returns false on shutdown.
pub(super) async fn sleep_unless_shutdown(delay: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => false,
        () = tokio::time::sleep(delay) => true,
    }
}
