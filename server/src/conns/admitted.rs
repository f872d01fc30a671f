//! [`Admitted`], one admitted connection: its TLS handshake, its serving loop (timeouts,
//! eviction, shutdown, release) and its parking while idle.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::server::graceful::GracefulConnection;
use tokio::time::Instant;

use super::slot::{CLOSING, Slot, Told};
use super::table::Table;
use super::{CloseReason, Releasable, RequestTracker, Served, Stopped};
use crate::LazySleep;

/// Adapts a hyper connection to [`Releasable`] for [`Admitted::serve`], which never
/// releases.
struct Graceful<'a, C>(Pin<&'a mut C>);

impl<C: GracefulConnection> Future for Graceful<'_, C> {
    type Output = Result<(), C::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl<C> Releasable for Graceful<'_, C>
where
    C: GracefulConnection,
    C::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    type Error = C::Error;

    fn close_gracefully(mut self: Pin<&mut Self>) {
        self.0.as_mut().graceful_shutdown();
    }

    fn release(self: Pin<&mut Self>) {
        self.close_gracefully();
    }
}

/// One admitted connection. Dropping it (when the connection's task ends) frees its slot.
pub struct Admitted {
    pub(super) slot: Arc<Slot>,
    pub(super) table: Arc<Table>,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("listener", &self.table.policy.name)
            .field("id", &self.slot.id)
            .finish_non_exhaustive()
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let signals = &self.table.signals;
        {
            let mut open = self.table.open();
            open.slots.remove(&self.slot.id);
        }
        if signals.live.fetch_sub(1, Ordering::AcqRel) == 1 {
            signals.all_closed.notify_waiters();
        }
        signals.freed.notify_one();
    }
}

impl Admitted {
    /// The counter the connection's service calls for each request.
    #[must_use]
    pub fn requests(&self) -> RequestTracker {
        RequestTracker(Arc::clone(&self.slot))
    }

    /// Whether an eviction claimed this connection.
    #[must_use]
    pub fn is_evicted(&self) -> bool {
        !self
            .table
            .open()
            .slots
            .get(&self.slot.id)
            .is_some_and(|slot| Arc::ptr_eq(slot, &self.slot))
            && self.slot.state.load(Ordering::Acquire) & CLOSING != 0
    }

    /// Runs a handshake (TLS) within the header timeout counted from admission; stops
    /// early on eviction or shutdown.
    pub async fn handshake<F: Future>(&self, handshake: F) -> Result<F::Output, Stopped> {
        let policy = &self.table.policy;
        let since = self.slot.signals.epoch
            + Duration::from_millis(self.slot.idle_since_ms.load(Ordering::Acquire));
        tokio::select! {
            done = handshake => Ok(done),
            () = tokio::time::sleep_until(since + policy.header_read_timeout) => {
                // Claimed so that no eviction counts it a second time.
                if self.slot.claim_idle() {
                    self.table.closed(CloseReason::HeaderTimeout);
                }
                Err(Stopped::TimedOut {
                    timeout_ms: u64::try_from(policy.header_read_timeout.as_millis())
                        .unwrap_or(u64::MAX),
                })
            }
            told = self.slot.told() => Err(stopped(told)),
        }
    }

    /// Drives `conn` to its end, closing it gracefully at the header or keep-alive
    /// timeout, on eviction, or at shutdown.
    pub async fn serve<C>(&self, conn: C) -> Result<(), Box<dyn StdError + Send + Sync>>
    where
        C: GracefulConnection,
        C::Error: Into<Box<dyn StdError + Send + Sync>>,
    {
        let mut conn = Graceful(std::pin::pin!(conn));
        self.drive(Pin::new(&mut conn), None).await.map(drop)
    }

    /// [`Self::serve`], and also, once the connection has served a request and then
    /// stayed idle for `release_after`, [`Releasable::release`]s it: its HTTP state ends
    /// and the stream stays open, for the caller to [`Self::park`] without hyper's
    /// buffers. `conn` is borrowed so that the caller can take the stream back from it.
    pub async fn serve_or_release<C: Releasable>(
        &self,
        conn: Pin<&mut C>,
        release_after: Duration,
    ) -> Result<Served, Box<dyn StdError + Send + Sync>> {
        self.drive(conn, Some(release_after)).await
    }

    /// Waits, with the connection idle and no HTTP state, until `wake` (the stream turning
    /// readable) finishes; stops at the keep-alive timeout counted from the connection's
    /// last response (counted as [`CloseReason::KeepaliveTimeout`]), on eviction, or at
    /// shutdown, and the caller closes the stream. The slot is idle throughout, so
    /// eviction picks a parked connection as it would any idle one.
    ///
    /// `wake` is `Unpin` (pinned by the caller, say with `std::pin::pin!`): a parked
    /// connection's task is all the memory it keeps, and a future moved in here to be
    /// pinned would take room twice.
    pub async fn park<F: Future + Unpin>(&self, mut wake: F) -> Result<F::Output, Stopped> {
        let policy = &self.table.policy;
        loop {
            let check = self.slot.next_check(policy, None);
            tokio::select! {
                woke = &mut wake => return Ok(woke),
                told = self.slot.told() => return Err(stopped(told)),
                () = tokio::time::sleep_until(check.at) => {
                    if let Some((reason, deadline)) = check.close
                        && Instant::now() >= deadline
                        && self.close_if_idle_since(check.since_ms)
                    {
                        self.table.closed(reason);
                        let (timeout, stopped): (Duration, fn(u64) -> Stopped) = match reason {
                            CloseReason::HeaderTimeout => (policy.header_read_timeout, |timeout_ms| {
                                Stopped::TimedOut { timeout_ms }
                            }),
                            _ => (policy.keepalive_timeout, |timeout_ms| {
                                Stopped::KeepaliveTimeout { timeout_ms }
                            }),
                        };
                        return Err(stopped(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)));
                    }
                }
            }
        }
    }

    /// The loop behind [`Self::serve`] and [`Self::serve_or_release`].
    async fn drive<C: Releasable>(
        &self,
        mut conn: Pin<&mut C>,
        release_after: Option<Duration>,
    ) -> Result<Served, Box<dyn StdError + Send + Sync>> {
        let policy = &self.table.policy;
        // Once set, the connection is only driven to its end.
        let mut closing = false;
        // Whether the close was ours and already counted.
        let mut counted = false;
        // Whether the end is a release rather than a close.
        let mut released = false;
        // Polled at every wake-up of the connection's task: a lazy sleep answers those
        // polls without calling into tokio's timer, and moving it later is free.
        let mut check = self.slot.next_check(policy, release_after);
        let mut timer = std::pin::pin!(LazySleep::until(check.at));
        loop {
            tokio::select! {
                // In this order at every poll, not a random one: the connection's own
                // work first (a random order costs a draw per wake-up, three a request).
                biased;
                ended = conn.as_mut() => {
                    return match ended {
                        Ok(()) if released => Ok(Served::Released),
                        Ok(()) => Ok(Served::Ended),
                        Err(err) => {
                            let err = err.into();
                            if !counted && is_hyper_header_timeout(&*err) {
                                self.table.closed(CloseReason::HeaderTimeout);
                            }
                            Err(err)
                        }
                    };
                }
                told = self.slot.told(), if !closing => {
                    // An eviction has counted the close already.
                    counted = told == Told::Evicted;
                    closing = true;
                    conn.as_mut().close_gracefully();
                }
                () = timer.as_mut(), if !closing => {
                    let now = Instant::now();
                    if let Some((reason, deadline)) = check.close
                        && now >= deadline
                        && self.close_if_idle_since(check.since_ms)
                    {
                        self.table.closed(reason);
                        counted = true;
                        closing = true;
                        conn.as_mut().close_gracefully();
                    } else if check.release.is_some_and(|at| now >= at)
                        && self.slot.idle_since(check.since_ms)
                    {
                        // The slot stays idle and unclaimed: an eviction, a timeout or
                        // shutdown while the connection is parked is the park's to see.
                        released = true;
                        closing = true;
                        conn.as_mut().release();
                    }
                }
            }
            check = self.slot.next_check(policy, release_after);
            timer.as_mut().reset(check.at);
        }
    }

    /// Claims the slot for closing if nothing is in flight and it has stayed idle since
    /// `since_ms`; a request that came and went since then moved the deadline.
    fn close_if_idle_since(&self, since_ms: u64) -> bool {
        if !self.slot.claim_idle() {
            return false;
        }
        if self.slot.idle_since_ms.load(Ordering::Acquire) == since_ms {
            return true;
        }
        self.slot.state.fetch_and(!CLOSING, Ordering::AcqRel);
        false
    }
}

/// Whether hyper ended the connection for its own HTTP/1 head timer. That timer starts
/// when hyper first reads for a head (at once under the HTTP/1 builder, only once the
/// first bytes have told the `auto` builder the version) and again after each response
/// on a keep-alive connection.
fn is_hyper_header_timeout(err: &(dyn StdError + 'static)) -> bool {
    err.downcast_ref::<hyper::Error>()
        .is_some_and(hyper::Error::is_timeout)
}

/// What a wait ends with when its slot is told to stop.
fn stopped(told: Told) -> Stopped {
    match told {
        Told::Evicted => Stopped::Evicted,
        Told::ShuttingDown => Stopped::ShuttingDown,
    }
}
