//! Connection bookkeeping shared by every listener: the proxy's data port, its admin API
//! and the node API. It decides which connections may stay open, so that connections
//! that send nothing can never starve the clients that do.
//!
//! - Each admitted connection has a slot: how many requests it has in flight, whether it
//!   has served one yet, and since when it has been idle.
//! - A connection that has sent no request head is closed at the header timeout, counted
//!   from the moment it was admitted. The TLS handshake counts within it.
//! - A keep-alive connection with nothing in flight is closed at the keep-alive timeout,
//!   counted from the end of its last response.
//! - At `connections_max`, a new connection closes the connection that has been idle the
//!   longest (fresh ones count as idle since they were admitted), as nginx reuses its idle
//!   connections. A connection with a request in flight is never chosen. When every
//!   connection is busy, [`Connections::try_admit`] says so (the control plane answers
//!   503) and [`Connections::admit`] waits (the data port).
//!
//! Closing is hyper's graceful shutdown: an idle connection closes at once; a request
//! that slipped in just before is still answered. Why the header timer must be ours:
//! hyper-util 0.1.21's `auto` builder (HTTP/1.1 and h2c on one port) first reads up to
//! 24 bytes to tell the HTTP/2 preface apart, with no timer at all, and only then hands
//! the connection to hyper 1.12's HTTP/1 code, whose `header_read_timeout` starts when it
//! first polls for a head; a TLS handshake happens before either. A client that connects
//! and sends nothing therefore held its slot forever. The plain HTTP/1 builder of the
//! control plane does start hyper's timer at once, but it had no eviction.
//!
//! A listener may also release an idle connection's HTTP state without closing it
//! ([`Admitted::serve_or_release`], then [`Admitted::park`]): the proxy's data port does,
//! so that an idle keep-alive connection holds its socket and its slot here, not hyper's
//! buffers. A parked connection is still idle to this table: its keep-alive timeout,
//! eviction and shutdown apply as before.
//!
//! Requests are counted by the service: [`RequestTracker::enter`] when a request reaches
//! it, and the [`InFlight`] guard, carried by the response body ([`TrackedBody`]), ends
//! the request when hyper drops the body (finished, or the connection gone). Nothing is
//! signalled on the request path: a connection's task re-reads the slot when its timer
//! fires.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use hyper_util::server::graceful::GracefulConnection;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// How often a waiting [`Connections::admit`] looks for an idle connection even without
/// being told one freed up: a safety net for a wake-up that raced with its registration.
pub const ADMISSION_RECHECK_MS: u64 = 100;

/// Set in a slot's state word once the slot is claimed for closing.
const CLOSING: u32 = 1 << 31;

/// Why a listener closed a connection on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CloseReason {
    /// No complete request head (or TLS handshake) within the header timeout.
    HeaderTimeout,
    /// Idle between requests for the keep-alive timeout.
    KeepaliveTimeout,
    /// Idle (or not yet sent a head) and closed to make room at `connections_max`.
    EvictedIdle,
    /// A write to the client made no progress for the write timeout: a client that
    /// stopped reading its response.
    WriteTimeout,
}

impl CloseReason {
    /// The metric label: `header-timeout`, `keepalive-timeout`, `evicted-idle`,
    /// `write-timeout`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HeaderTimeout => "header-timeout",
            Self::KeepaliveTimeout => "keepalive-timeout",
            Self::EvictedIdle => "evicted-idle",
            Self::WriteTimeout => "write-timeout",
        }
    }
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Called once per connection the listener closed on its own, with the listener's name:
/// where the owner counts closes by reason in its metrics.
pub type CloseHook = fn(listener: &'static str, reason: CloseReason);

/// The connection policy of one listener.
#[derive(Debug, Clone)]
pub struct ConnPolicy {
    /// The listener's name in logs and in the close hook.
    pub name: &'static str,
    /// Connections admitted at once.
    pub connections_max: usize,
    /// Time a connection has, from admission, to complete its TLS handshake and its first
    /// request head.
    pub header_read_timeout: Duration,
    /// Time a connection may stay idle after a response before it is closed.
    pub keepalive_timeout: Duration,
    /// Told of every close by timeout or eviction.
    pub on_close: Option<CloseHook>,
}

/// Why a connection stopped before it was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Stopped {
    /// The header timeout ran out (during the TLS handshake).
    #[error("no TLS handshake within the header timeout of {timeout_ms} ms")]
    TimedOut {
        /// The header timeout.
        timeout_ms: u64,
    },
    /// Closed to make room for a new connection at `connections_max`.
    #[error("closed to make room at connections_max")]
    Evicted,
    /// The listener is shutting down.
    #[error("the listener is shutting down")]
    ShuttingDown,
    /// A parked connection stayed idle for the keep-alive timeout.
    #[error("idle for the keep-alive timeout of {timeout_ms} ms")]
    KeepaliveTimeout {
        /// The keep-alive timeout.
        timeout_ms: u64,
    },
}

/// How [`Admitted::serve_or_release`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// The connection is over: the client closed it, or the listener did (a timeout, an
    /// eviction, shutdown).
    Ended,
    /// The connection was idle for the release time and its HTTP state was ended with
    /// the stream kept open: the caller may [`Admitted::park`] the stream.
    Released,
}

/// A connection that [`Admitted::serve_or_release`] can end in two ways: closing it, or
/// releasing it (ending its HTTP state but leaving the stream open to its owner).
/// hyper's connection types do not offer the second on their own, so the owner wraps
/// them in a type of its own.
pub trait Releasable: Future<Output = Result<(), Self::Error>> {
    /// The error the connection can end with.
    type Error: Into<Box<dyn StdError + Send + Sync>>;

    /// Finish the request in flight, if any, then close the connection.
    fn close_gracefully(self: Pin<&mut Self>);

    /// Finish the request in flight, if any, then end the connection's HTTP state and
    /// leave its stream open.
    fn release(self: Pin<&mut Self>);
}

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

/// What every slot and guard shares.
struct Signals {
    /// Time zero of the slots' millisecond clocks.
    epoch: Instant,
    /// A waiting [`Connections::admit`] wants to hear of connections turning idle.
    waiting: AtomicBool,
    /// A slot was freed or a connection turned idle.
    freed: Notify,
    /// Connections admitted and not yet ended (evicted ones included until they end).
    live: AtomicUsize,
    /// `live` reached zero.
    all_closed: Notify,
}

impl Signals {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// One admitted connection's state.
struct Slot {
    id: u64,
    /// Requests in flight, with [`CLOSING`] set once the slot is claimed for closing.
    state: AtomicU32,
    /// Whether a request has reached the service yet (then idle means keep-alive).
    served: AtomicBool,
    /// Milliseconds since `Signals::epoch` at admission, then at the end of the latest
    /// response.
    idle_since_ms: AtomicU64,
    /// Told when the slot was claimed by an eviction.
    evict: Notify,
    signals: Arc<Signals>,
}

impl Slot {
    /// Claims the slot for closing if nothing is in flight.
    fn claim_idle(&self) -> bool {
        self.state
            .compare_exchange(0, CLOSING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// What the connection's task does next: when to look at the slot again, and, if
    /// the slot is idle, the reason and deadline to close it for.
    fn next_check(&self, policy: &ConnPolicy, release_after: Option<Duration>) -> Check {
        let now = Instant::now();
        // Nothing signals the task when a request starts or ends, so it looks again at
        // least this often: a connection that turns idle at `t` is then seen idle by
        // `t + recheck`, at or before its close is due (`t + keepalive_timeout`), and a
        // fresh connection that served a request moves to the keep-alive deadline in time.
        // With a release time, also that often, so that an idle connection is released
        // by twice that time after its last response.
        let mut recheck = policy.header_read_timeout.min(policy.keepalive_timeout);
        if let Some(release_after) = release_after {
            recheck = recheck.min(release_after);
        }
        let recheck = now + recheck;
        let state = self.state.load(Ordering::Acquire);
        let since_ms = self.idle_since_ms.load(Ordering::Acquire);
        if state != 0 {
            // Busy (or already closing): nothing can time out now.
            return Check {
                at: recheck,
                close: None,
                release: None,
                since_ms,
            };
        }
        let since = self.signals.epoch + Duration::from_millis(since_ms);
        let served = self.served.load(Ordering::Acquire);
        // Only a connection that has served a request is released: a fresh one is still
        // within its header timeout, which hyper's buffers are there to serve.
        let release = release_after
            .filter(|_| served)
            .map(|release_after| since + release_after);
        let (deadline, reason) = if served {
            (
                since + policy.keepalive_timeout,
                CloseReason::KeepaliveTimeout,
            )
        } else {
            (
                since + policy.header_read_timeout,
                CloseReason::HeaderTimeout,
            )
        };
        let at = deadline.min(recheck);
        Check {
            at: release.map_or(at, |release| at.min(release)),
            close: Some((reason, deadline)),
            release,
            since_ms,
        }
    }

    /// Whether nothing is in flight (nor the slot claimed) and no request came and went
    /// since `since_ms`.
    fn idle_since(&self, since_ms: u64) -> bool {
        self.state.load(Ordering::Acquire) == 0
            && self.idle_since_ms.load(Ordering::Acquire) == since_ms
    }
}

/// See [`Slot::next_check`].
struct Check {
    /// When to look again.
    at: Instant,
    /// For an idle slot: why and when it is to be closed.
    close: Option<(CloseReason, Instant)>,
    /// For an idle slot that has served a request, with a release time: when to release
    /// it.
    release: Option<Instant>,
    /// The slot's `idle_since_ms` this was computed from.
    since_ms: u64,
}

struct Open {
    next_id: u64,
    slots: HashMap<u64, Arc<Slot>>,
}

struct Table {
    policy: ConnPolicy,
    signals: Arc<Signals>,
    open: Mutex<Open>,
    shutdown: watch::Sender<bool>,
}

impl Table {
    fn open(&self) -> MutexGuard<'_, Open> {
        // The map stays consistent whatever panicked while holding the lock: every
        // change is a single insert or remove.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn closed(&self, reason: CloseReason) {
        if let Some(hook) = self.policy.on_close {
            hook(self.policy.name, reason);
        }
    }
}

/// The connections of one listener.
#[derive(Clone)]
pub struct Connections {
    table: Arc<Table>,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("policy", &self.table.policy)
            .field("live", &self.live())
            .finish_non_exhaustive()
    }
}

impl Connections {
    /// No connections yet.
    #[must_use]
    pub fn new(policy: ConnPolicy) -> Self {
        let (shutdown, _) = watch::channel(false);
        Self {
            table: Arc::new(Table {
                policy,
                signals: Arc::new(Signals {
                    epoch: Instant::now(),
                    waiting: AtomicBool::new(false),
                    freed: Notify::new(),
                    live: AtomicUsize::new(0),
                    all_closed: Notify::new(),
                }),
                open: Mutex::new(Open {
                    next_id: 0,
                    slots: HashMap::new(),
                }),
                shutdown,
            }),
        }
    }

    /// The policy this table applies.
    #[must_use]
    pub fn policy(&self) -> &ConnPolicy {
        &self.table.policy
    }

    /// Connections admitted and not ended yet (evicted ones still closing included).
    #[must_use]
    pub fn live(&self) -> usize {
        self.table.signals.live.load(Ordering::Acquire)
    }

    /// Admits a new connection: at once under `connections_max`, else by closing the
    /// connection idle the longest. `None` when every admitted connection has a request
    /// in flight.
    #[must_use]
    pub fn try_admit(&self) -> Option<Admitted> {
        let table = &self.table;
        let mut open = table.open();
        if open.slots.len() >= table.policy.connections_max {
            let victim = evict_oldest_idle(&mut open.slots)?;
            victim.evict.notify_one();
            table.closed(CloseReason::EvictedIdle);
            tracing::debug!(
                listener = table.policy.name,
                limit = table.policy.connections_max,
                "closed the connection idle the longest to admit a new one"
            );
        }
        let id = open.next_id;
        open.next_id += 1;
        let slot = Arc::new(Slot {
            id,
            state: AtomicU32::new(0),
            served: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(table.signals.now_ms()),
            evict: Notify::new(),
            signals: Arc::clone(&table.signals),
        });
        open.slots.insert(id, Arc::clone(&slot));
        table.signals.live.fetch_add(1, Ordering::AcqRel);
        Some(Admitted {
            slot,
            table: Arc::clone(table),
        })
    }

    /// [`Self::try_admit`], waiting while every connection is busy until one ends or
    /// turns idle. Cancel-safe.
    pub async fn admit(&self) -> Admitted {
        let signals = &self.table.signals;
        loop {
            let freed = signals.freed.notified();
            if let Some(admitted) = self.try_admit() {
                signals.waiting.store(false, Ordering::Release);
                return admitted;
            }
            signals.waiting.store(true, Ordering::Release);
            tokio::select! {
                () = freed => {}
                () = tokio::time::sleep(Duration::from_millis(ADMISSION_RECHECK_MS)) => {}
            }
        }
    }

    /// Asks every connection to finish: idle ones close at once, busy ones after their
    /// requests in flight.
    pub fn shutdown(&self) {
        self.table.shutdown.send_replace(true);
    }

    /// Waits until no admitted connection is left.
    pub async fn drained(&self) {
        let signals = &self.table.signals;
        loop {
            let notified = signals.all_closed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if signals.live.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Claims the slot idle the longest (the smallest `idle_since_ms`; fresh connections count
/// from admission) whose connection has nothing in flight, and takes it out of `slots`.
fn evict_oldest_idle(slots: &mut HashMap<u64, Arc<Slot>>) -> Option<Arc<Slot>> {
    loop {
        let id = slots
            .values()
            .filter(|slot| slot.state.load(Ordering::Acquire) == 0)
            .min_by_key(|slot| (slot.idle_since_ms.load(Ordering::Acquire), slot.id))?
            .id;
        let claimed = slots.get(&id).is_some_and(|slot| slot.claim_idle());
        if claimed {
            return slots.remove(&id);
        }
        // A request reached that connection between the scan and the claim: scan again.
    }
}

/// One admitted connection. Dropping it (when the connection's task ends) frees its slot.
pub struct Admitted {
    slot: Arc<Slot>,
    table: Arc<Table>,
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
        let mut shutdown = self.table.shutdown.subscribe();
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
            () = self.slot.evict.notified() => Err(Stopped::Evicted),
            _ = shutdown.wait_for(|stop| *stop) => Err(Stopped::ShuttingDown),
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
        let mut shutdown = self.table.shutdown.subscribe();
        loop {
            let check = self.slot.next_check(policy, None);
            tokio::select! {
                woke = &mut wake => return Ok(woke),
                () = self.slot.evict.notified() => return Err(Stopped::Evicted),
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
                _ = shutdown.wait_for(|stop| *stop) => return Err(Stopped::ShuttingDown),
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
        let mut shutdown = self.table.shutdown.subscribe();
        // Once set, the connection is only driven to its end.
        let mut closing = false;
        // Whether the close was ours and already counted.
        let mut counted = false;
        // Whether the end is a release rather than a close.
        let mut released = false;
        loop {
            let check = self.slot.next_check(policy, release_after);
            tokio::select! {
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
                () = self.slot.evict.notified(), if !closing => {
                    // Counted by the eviction.
                    counted = true;
                    closing = true;
                    conn.as_mut().close_gracefully();
                }
                () = tokio::time::sleep_until(check.at), if !closing => {
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
                _ = shutdown.wait_for(|stop| *stop), if !closing => {
                    closing = true;
                    conn.as_mut().close_gracefully();
                }
            }
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

/// Counts one connection's requests in flight; cheap to clone into its service.
#[derive(Clone)]
pub struct RequestTracker(Arc<Slot>);

impl std::fmt::Debug for RequestTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestTracker")
            .field("id", &self.0.id)
            .finish_non_exhaustive()
    }
}

impl RequestTracker {
    /// A request reached the service; the connection is busy until the guard drops.
    #[must_use]
    pub fn enter(&self) -> InFlight {
        let slot = &self.0;
        if !slot.served.load(Ordering::Relaxed) {
            slot.served.store(true, Ordering::Release);
        }
        slot.state.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(slot))
    }
}

/// One request in flight. Dropped when its response body has been sent (or dropped
/// unsent), which makes the connection idle again if it was the last one.
pub struct InFlight(Arc<Slot>);

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("id", &self.0.id)
            .finish_non_exhaustive()
    }
}

impl InFlight {
    /// Moves the guard into `response`'s body, so the request ends with the body.
    pub fn carry<B>(self, response: http::Response<B>) -> http::Response<TrackedBody<B>> {
        response.map(|inner| TrackedBody {
            inner,
            _in_flight: self,
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let slot = &self.0;
        // The idle time is stored before the count drops, so whoever sees the connection
        // idle also sees when it became so.
        slot.idle_since_ms
            .store(slot.signals.now_ms(), Ordering::Release);
        let before = slot.state.fetch_sub(1, Ordering::AcqRel);
        if before & !CLOSING == 1 && slot.signals.waiting.load(Ordering::Acquire) {
            slot.signals.freed.notify_one();
        }
    }
}

/// A response body that ends its request's [`InFlight`] when hyper drops it.
pub struct TrackedBody<B> {
    inner: B,
    _in_flight: InFlight,
}

impl<B> std::fmt::Debug for TrackedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackedBody").finish_non_exhaustive()
    }
}

impl<B: Body + Unpin> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(max: usize) -> Connections {
        Connections::new(ConnPolicy {
            name: "test",
            connections_max: max,
            header_read_timeout: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(60),
            on_close: None,
        })
    }

    /// Goal: at the limit, the connection idle the longest is closed first, fresh ones
    /// counting from admission; a busy one never is; when all are busy there is no room.
    /// Method: paused clock; admit three, one second apart; make the oldest busy and let
    /// the newest serve a request (idle since later); admit more and see who is evicted.
    #[tokio::test(start_paused = true)]
    async fn eviction_closes_the_longest_idle_first_and_never_a_busy_one() {
        let conns = table(3);
        let oldest = conns.try_admit().unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let second = conns.try_admit().unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let third = conns.try_admit().unwrap();
        let busy = oldest.requests().enter();
        // `third` serves a request that ends at t=3 s: idle since then.
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(third.requests().enter());
        tokio::time::advance(Duration::from_secs(1)).await;

        let fourth = conns.try_admit().unwrap();
        assert!(
            second.is_evicted(),
            "second (fresh since 1 s) is idle the longest"
        );
        assert!(
            !oldest.is_evicted() && !third.is_evicted(),
            "oldest is busy; third idle since 3 s"
        );
        let fifth = conns.try_admit().unwrap();
        assert!(
            third.is_evicted(),
            "next: third, idle since 3 s, before fourth (since 4 s)"
        );
        assert!(!oldest.is_evicted(), "a busy connection is never evicted");
        // Make both remaining connections busy: no room any more.
        let _fourth_busy = fourth.requests().enter();
        let _fifth_busy = fifth.requests().enter();
        assert!(conns.try_admit().is_none(), "every connection is busy");
        // The busy `oldest` ends its request: it is now the only idle one.
        drop(busy);
        let _sixth = conns.try_admit().unwrap();
        assert!(oldest.is_evicted(), "oldest turned idle and is taken");
        // Evicted connections stay live until their tasks end.
        assert_eq!(conns.live(), 6);
        drop((oldest, second, third));
        assert_eq!(conns.live(), 3);
    }

    /// Goal: a waiting `admit` gets a slot when a busy connection turns idle.
    /// Method: a limit of 1, the one connection busy; wait in `admit` while the request
    /// ends from another task.
    #[tokio::test]
    async fn admit_waits_for_a_connection_to_turn_idle() {
        let conns = table(1);
        let only = conns.try_admit().unwrap();
        let busy = only.requests().enter();
        let waiter = tokio::spawn({
            let conns = conns.clone();
            async move { conns.admit().await }
        });
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "no room while the only connection is busy"
        );
        drop(busy);
        let admitted = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(only.is_evicted());
        drop(admitted);
    }

    /// Goal: a request that enters while the connection is claimed still counts, and an
    /// eviction scan never picks a connection whose request is in flight.
    /// Method: claim by hand, enter, then check the state word and the scan.
    #[tokio::test]
    async fn a_claimed_connection_with_a_request_is_not_claimed_again() {
        let conns = table(1);
        let only = conns.try_admit().unwrap();
        let _busy = only.requests().enter();
        assert!(!only.slot.claim_idle(), "busy: not claimable");
        let mut open = conns.table.open();
        assert!(evict_oldest_idle(&mut open.slots).is_none());
    }

    /// Goal: the close hook hears each eviction once, under its reason.
    /// Method: a hook counting into a static; evict one connection.
    #[tokio::test]
    async fn eviction_is_reported_to_the_close_hook() {
        static EVICTED: AtomicUsize = AtomicUsize::new(0);
        fn hook(_: &'static str, reason: CloseReason) {
            if reason == CloseReason::EvictedIdle {
                EVICTED.fetch_add(1, Ordering::SeqCst);
            }
        }
        let conns = Connections::new(ConnPolicy {
            on_close: Some(hook),
            ..table(1).policy().clone()
        });
        let _first = conns.try_admit().unwrap();
        let _second = conns.try_admit().unwrap();
        assert_eq!(EVICTED.load(Ordering::SeqCst), 1);
        assert_eq!(CloseReason::EvictedIdle.as_str(), "evicted-idle");
    }

    /// A connection that stays pending until told how to end, and then ends at once.
    #[derive(Default)]
    struct FakeConn {
        ended_by: Option<&'static str>,
    }

    impl Future for FakeConn {
        type Output = Result<(), std::io::Error>;

        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
            if self.ended_by.is_some() {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        }
    }

    impl Releasable for FakeConn {
        type Error = std::io::Error;

        fn close_gracefully(mut self: Pin<&mut Self>) {
            self.ended_by = Some("close");
        }

        fn release(mut self: Pin<&mut Self>) {
            self.ended_by = Some("release");
        }
    }

    /// Goal: a connection is released only once it has served a request and then stayed
    /// idle for the release time, never while a request is in flight, and the release
    /// leaves its slot idle and unclaimed.
    /// Method: paused clock, release time 1 s; a request in flight for 5 s (the serve
    /// must still be running), then ended: the serve returns `Released` within 3 s.
    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_released_and_a_busy_one_is_not() {
        let conns = table(2);
        let only = conns.try_admit().unwrap();
        let busy = only.requests().enter();
        let mut conn = FakeConn::default();
        let release_after = Duration::from_secs(1);
        let running = tokio::time::timeout(
            Duration::from_secs(5),
            only.serve_or_release(Pin::new(&mut conn), release_after),
        )
        .await;
        assert!(running.is_err(), "busy: neither released nor closed");
        assert_eq!(conn.ended_by, None);
        drop(busy);
        let served = tokio::time::timeout(
            Duration::from_secs(3),
            only.serve_or_release(Pin::new(&mut conn), release_after),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!((served, conn.ended_by), (Served::Released, Some("release")));
        assert!(!only.is_evicted());
        assert!(
            only.slot.claim_idle(),
            "the released slot is idle and unclaimed"
        );
    }

    /// Goal: a parked connection is idle to the table: the keep-alive timeout, counted
    /// from its last response, ends the park, and so does an eviction at the limit.
    /// Method: paused clock, a 60 s keep-alive timeout; park a served connection on a
    /// wake that never comes: it stops with `KeepaliveTimeout` by 61 s. Then, with a
    /// limit of 2, park a second served connection and admit two more: the park stops
    /// with `Evicted`.
    #[tokio::test(start_paused = true)]
    async fn a_parked_connection_times_out_and_is_evicted_like_an_idle_one() {
        let conns = table(2);
        let first = conns.try_admit().unwrap();
        drop(first.requests().enter());
        let parked = tokio::time::timeout(
            Duration::from_secs(61),
            first.park(std::future::pending::<()>()),
        )
        .await
        .unwrap();
        assert_eq!(
            parked,
            Err(Stopped::KeepaliveTimeout { timeout_ms: 60_000 })
        );
        drop(first);

        let second = conns.try_admit().unwrap();
        drop(second.requests().enter());
        tokio::time::advance(Duration::from_secs(1)).await;
        let _third = conns.try_admit().unwrap();
        let _fourth = conns.try_admit().unwrap();
        let parked = tokio::time::timeout(
            Duration::from_secs(5),
            second.park(std::future::pending::<()>()),
        )
        .await
        .unwrap();
        assert_eq!(parked, Err(Stopped::Evicted));
    }
}
