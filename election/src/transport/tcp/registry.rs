//! Which inbound connection speaks for each peer, and when a new one may take over.
//!
//! A peer has at most one live inbound connection. A new connection for the same id:
//!
//! - with TLS, proves with its certificate that it is that node (a restart, or a
//!   reconnect after a network fault), so it replaces the old one at once;
//! - in plaintext, proves nothing: it must not cut off the live connection of a real
//!   peer. It waits up to [`PEER_REPLACE_WAIT_MS`] for the old connection to end (a
//!   restarted peer's old connection ends as its process dies, and its reader sees the
//!   close within moments) and is refused if the old one is still live. A refused dialer
//!   sees its connection closed and dials again after its backoff.
//!
//! The accepting side never writes, so a peer whose host vanished without closing its
//! connection would hold its slot for ever; TCP keep-alive ([`keep_alive`]) ends such a
//! connection within about [`KEEPALIVE_IDLE_S`] + [`KEEPALIVE_RETRIES`] ×
//! [`KEEPALIVE_INTERVAL_S`] seconds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Time a plaintext connection waits for the live connection of the id it claims to end
/// before it is refused, in milliseconds.
pub const PEER_REPLACE_WAIT_MS: u64 = 500;
/// Idle time before the first keep-alive probe on an inbound peer connection, in seconds.
pub const KEEPALIVE_IDLE_S: u64 = 10;
/// Time between keep-alive probes, in seconds.
pub const KEEPALIVE_INTERVAL_S: u64 = 5;
/// Unanswered keep-alive probes before the kernel closes the connection.
pub const KEEPALIVE_RETRIES: u32 = 3;

/// Turns on TCP keep-alive for an inbound peer connection, so that a peer that vanished
/// without closing it releases its slot. Best effort: without it, only a TLS peer can
/// take over its own slot.
pub(super) fn keep_alive(stream: &TcpStream) {
    let params = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(KEEPALIVE_IDLE_S))
        .with_interval(Duration::from_secs(KEEPALIVE_INTERVAL_S))
        .with_retries(KEEPALIVE_RETRIES);
    if let Err(err) = socket2::SockRef::from(stream).set_tcp_keepalive(&params) {
        tracing::debug!(cause = %err, "cannot set keep-alive on a peer connection");
    }
}

/// One live connection.
struct Entry {
    serial: u64,
    /// Cancelled to make the connection's reader stop (it was replaced).
    stop: CancellationToken,
    /// Cancelled when the connection's reader has stopped.
    ended: CancellationToken,
}

#[derive(Default)]
struct Inner {
    next_serial: u64,
    live: HashMap<u64, Entry>,
}

/// The live inbound connection of each peer.
#[derive(Clone, Default)]
pub(super) struct Registry {
    inner: Arc<Mutex<Inner>>,
}

/// A connection's place in the [`Registry`]; dropping it frees the place.
pub(super) struct Registration {
    registry: Registry,
    peer: u64,
    serial: u64,
    stop: CancellationToken,
    ended: CancellationToken,
}

impl Registration {
    /// Cancelled when a newer connection of the same peer replaced this one.
    pub(super) fn cancelled(&self) -> CancellationToken {
        self.stop.clone()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.ended.cancel();
        let mut inner = self.registry.lock();
        if inner
            .live
            .get(&self.peer)
            .is_some_and(|e| e.serial == self.serial)
        {
            inner.live.remove(&self.peer);
        }
    }
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes a new connection the live one of `peer`. `authenticated`: its certificate
    /// names `peer`, so it may replace a live connection; otherwise it waits for the live
    /// one to end, and is refused (with the reason) if it does not end in time.
    pub(super) async fn register(
        &self,
        peer: u64,
        authenticated: bool,
    ) -> Result<Registration, String> {
        let live_ended = match self.try_register(peer, authenticated) {
            Ok(registration) => return Ok(registration),
            Err(ended) => ended,
        };
        let wait = Duration::from_millis(PEER_REPLACE_WAIT_MS);
        let _ = tokio::time::timeout(wait, live_ended.cancelled()).await;
        self.try_register(peer, authenticated).map_err(|_| {
            format!(
                "node {peer} already has a live connection, and a plaintext connection \
                 cannot replace it (it stayed up {PEER_REPLACE_WAIT_MS} ms)"
            )
        })
    }

    /// Registers at once, or returns the live connection's `ended` token to wait on.
    fn try_register(
        &self,
        peer: u64,
        authenticated: bool,
    ) -> Result<Registration, CancellationToken> {
        let mut inner = self.lock();
        if let Some(live) = inner.live.get(&peer)
            && !live.ended.is_cancelled()
        {
            if !authenticated {
                return Err(live.ended.clone());
            }
            live.stop.cancel();
        }
        inner.next_serial += 1;
        let serial = inner.next_serial;
        let (stop, ended) = (CancellationToken::new(), CancellationToken::new());
        inner.live.insert(
            peer,
            Entry {
                serial,
                stop: stop.clone(),
                ended: ended.clone(),
            },
        );
        Ok(Registration {
            registry: self.clone(),
            peer,
            serial,
            stop,
            ended,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a plaintext newcomer never cuts off a live connection of its id, but takes
    /// over once the old one ended (a restarted peer); an authenticated one replaces it.
    /// Method: register, register again plaintext (refused after the wait), drop the
    /// first, register again (accepted); then an authenticated replacement.
    #[tokio::test(start_paused = true)]
    async fn only_a_dead_or_authenticated_connection_is_replaced() {
        let registry = Registry::default();
        let first = registry.register(2, false).await.unwrap();
        let refused = registry.register(2, false).await;
        assert!(refused.is_err(), "a live connection must not be replaced");
        assert!(!first.cancelled().is_cancelled());
        // Another id is independent.
        let other = registry.register(3, false).await.unwrap();
        drop(first);
        let second = registry.register(2, false).await.unwrap();
        let third = registry.register(2, true).await.unwrap();
        assert!(
            second.cancelled().is_cancelled(),
            "replaced by a proven peer"
        );
        drop(second);
        // The replaced connection's drop does not free its successor's place.
        assert!(registry.register(2, false).await.is_err());
        drop((third, other));
    }

    /// Goal: a plaintext newcomer that arrives just before the old connection's reader
    /// noticed the close still gets in.
    /// Method: register; a second registration waits; drop the first meanwhile.
    #[tokio::test(start_paused = true)]
    async fn a_newcomer_waits_for_a_closing_connection() {
        let registry = Registry::default();
        let first = registry.register(2, false).await.unwrap();
        let waiting = {
            let registry = registry.clone();
            tokio::spawn(async move { registry.register(2, false).await.is_ok() })
        };
        tokio::time::sleep(Duration::from_millis(PEER_REPLACE_WAIT_MS / 2)).await;
        drop(first);
        assert!(waiting.await.unwrap());
    }
}
