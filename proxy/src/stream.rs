//! Request bodies, streamed to the backend after admission, one frame at a time.
//!
//! The fence check and the barrier need only the request head, so a request is admitted
//! (or refused) before any of its body is read. Only then is the body polled, and the
//! first poll is what makes hyper answer `Expect: 100-continue`: a refused write is
//! answered before its client sends a byte of body.
//!
//! [`RequestBody`] wraps the client's body on its way to the upstream:
//! - `limits.body_bytes_max`, when set, cuts off a body that crosses it (a body whose
//!   `Content-Length` is over it is refused before admission, by the service);
//! - `limits.body_idle_timeout_ms` cuts off a body whose client sends nothing for that
//!   long while the upstream waits for more, so a slow body cannot hold its scope's
//!   barrier forever;
//! - `limits.body_buffer_bytes_max` is a budget shared by every connection: each frame
//!   holds permits for its bytes from the moment it is read until the upstream asks for
//!   the next one. At the cap a connection waits before it reads more, and its client
//!   is held back by TCP flow control.
//!
//! Before the request goes upstream, the body is read ahead
//! ([`RequestBody::read_ahead`]): whole when its declared length is at most
//! [`READ_AHEAD_BYTES_MAX`], else its first frame, so that the request head and a small
//! body leave in one write, as they did when bodies were read whole.
//!
//! Memory per connection is bounded whatever the body size: hyper reads at most its
//! buffer (the larger of `limits.header_bytes_max` and 64 KiB on HTTP/1, the
//! flow-control window on HTTP/2), and the wrapper holds one frame, or at most
//! [`READ_AHEAD_BYTES_MAX`] bytes read ahead.
//!
//! [`Exchange`] is what the body and the forward (which waits for the upstream's answer)
//! share: when the body last made
//! progress (the upstream's timeout counts from there, not from the start of a long
//! upload), and the in-flight guard, released only when both the upstream has answered
//! and the body is done with, so no lower-token body is still streaming once a higher
//! token is admitted.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use metrics::{Counter, Gauge};
use palisade_server::LazySleep;
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::error::ProxyError;
use crate::fleet::Admission;
use crate::metrics as m;

/// The limits every streamed body obeys, built once from the configuration.
pub(crate) struct BodyLimits {
    /// `limits.body_bytes_max`.
    pub max: Option<u64>,
    /// `limits.body_idle_timeout_ms`.
    pub idle: Duration,
    /// `limits.body_arrival_timeout_ms`: the bound on [`RequestBody::read_ahead`].
    pub arrival: Duration,
    /// The shared budget of `limits.body_buffer_bytes_max` bytes.
    budget: Arc<Semaphore>,
    /// The budget's size, so one frame larger than all of it still passes (alone).
    budget_bytes: u32,
}

impl BodyLimits {
    pub(crate) fn new(
        max: Option<u64>,
        idle: Duration,
        arrival: Duration,
        buffer_bytes_max: u64,
    ) -> Self {
        // Permits are counted in u32 by tokio's `acquire_many`; a budget above 4 GiB is
        // no budget at all on the machines this runs on, so it is clamped.
        let budget_bytes = u32::try_from(buffer_bytes_max).unwrap_or(u32::MAX);
        Self {
            max,
            idle,
            arrival,
            budget: Arc::new(Semaphore::new(budget_bytes as usize)),
            budget_bytes,
        }
    }
}

/// Why a streamed body was cut off.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum BodyFault {
    /// The body crossed a size limit.
    #[error("request body is over the limit of {max} bytes ({field})")]
    TooLarge {
        /// The limit.
        max: u64,
        /// The configuration field that sets it.
        field: &'static str,
    },
    /// The client sent nothing for the idle timeout while the backend waited for more.
    #[error("request body made no progress for {timeout_ms} ms (limits.body_idle_timeout_ms)")]
    Idle {
        /// The limit.
        timeout_ms: u64,
    },
    /// What is read ahead of the body did not arrive in time, so the request never took
    /// an upstream slot.
    #[error("request body did not arrive within {timeout_ms} ms (limits.body_arrival_timeout_ms)")]
    Arrival {
        /// The limit.
        timeout_ms: u64,
    },
    /// The client's body broke (the client went away, or sent a malformed chunk).
    #[error("cannot read request body: {0}")]
    Read(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Fleet mode: the lease the write was admitted under ended before its body was
    /// complete, so it was cut off rather than sent whole after the lease.
    #[error(
        "the lease this write was admitted under ended before its body was complete; it was not sent whole"
    )]
    LeaseEnded,
    /// The shared body budget was closed. It never is; this fails closed if it were.
    #[error("the body buffer budget (limits.body_buffer_bytes_max) is closed")]
    BudgetClosed,
}

impl BodyFault {
    /// The answer to the client, when none was sent yet.
    pub(crate) fn to_proxy_error(&self) -> ProxyError {
        match self {
            Self::TooLarge { max, field } => ProxyError::BodyTooLarge { max: *max, field },
            Self::Idle { timeout_ms } => ProxyError::BodyTimeout {
                timeout_ms: *timeout_ms,
            },
            Self::Arrival { timeout_ms } => ProxyError::BodyArrivalTimeout {
                timeout_ms: *timeout_ms,
            },
            Self::Read(e) => ProxyError::BodyRead(e.to_string()),
            Self::BudgetClosed | Self::LeaseEnded => ProxyError::Unavailable(self.to_string()),
        }
    }

    /// The fault of a body somewhere in an error's sources (the upstream client reports a
    /// body's error as the cause of its own).
    pub(crate) fn find<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Self> {
        let mut next = Some(e);
        while let Some(e) = next {
            if let Some(fault) = e.downcast_ref::<Self>() {
                return Some(fault);
            }
            next = e.source();
        }
        None
    }
}

/// What a streaming body and its forward share.
pub(crate) struct Exchange {
    /// When the exchange started; progress is counted in ms from here. Also when its
    /// body starts waiting for its client (one reading of the clock for both).
    started: Instant,
    /// Milliseconds from `started` to the body's last progress (a frame taken by the
    /// upstream, or its end).
    progress_ms: AtomicU64,
    /// Whether the body is waiting for its client (then a quiet upstream is not late).
    waiting_for_client: AtomicBool,
    /// The in-flight guard: held until the last holder of the exchange (the forwarding
    /// task waiting for the answer, or the body still being sent) lets go, unless a
    /// forward without an answer takes it out to hold it longer
    /// ([`Exchange::keep_while_it_may_land`]).
    admitted: Mutex<Option<Admission>>,
}

impl Exchange {
    pub(crate) fn new(admitted: Option<Admission>) -> Arc<Self> {
        Arc::new(Self {
            started: palisade_server::clock::tokio_now(),
            progress_ms: AtomicU64::new(0),
            waiting_for_client: AtomicBool::new(false),
            admitted: Mutex::new(admitted),
        })
    }

    /// The forward ended without an answer: the in-flight guard is kept as
    /// [`Admission::keep_while_it_may_land`] says, which may be longer than the exchange
    /// lives.
    pub(crate) fn keep_while_it_may_land(&self) {
        let mut admitted = self
            .admitted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Admission::keep_while_it_may_land(&mut admitted);
    }

    /// The body made progress at `at`.
    fn progressed(&self, at: Instant) {
        let since = at.saturating_duration_since(self.started);
        let ms = u64::try_from(since.as_millis()).unwrap_or(u64::MAX);
        self.progress_ms.store(ms, Ordering::Relaxed);
    }

    /// When the upstream is late: `timeout` after the body's last progress. `None` while
    /// the body waits for its client, whose own idle timeout applies instead.
    pub(crate) fn upstream_deadline(&self, timeout: Duration) -> Option<tokio::time::Instant> {
        if self.waiting_for_client.load(Ordering::Relaxed) {
            return None;
        }
        let progress = Duration::from_millis(self.progress_ms.load(Ordering::Relaxed));
        Some(self.started + progress + timeout)
    }
}

/// Handles of the body-buffer metrics, registered once.
struct BufferMetrics {
    held: Gauge,
    waits: Counter,
}

fn buffer_metrics() -> &'static BufferMetrics {
    static HANDLES: OnceLock<BufferMetrics> = OnceLock::new();
    HANDLES.get_or_init(|| BufferMetrics {
        held: metrics::gauge!(m::BODY_BUFFER_BYTES),
        waits: metrics::counter!(m::BODY_BUFFER_WAITS),
    })
}

/// The most of a body read ahead before the request is sent upstream, in bytes: a body
/// whose declared length (`Content-Length`) is at most this is read whole first, as the
/// frames come, so that the upstream client finds all of it ready and writes the request
/// head and the whole body in one system call, as a body read whole before admission
/// was. A longer body, or one of unknown length, gets its first frame read ahead only,
/// and streams from there. The same as the largest read of a client connection
/// (`server::READ_BUFFER_BYTES_MAX`), so such a body is one or two reads.
pub(crate) const READ_AHEAD_BYTES_MAX: u64 = 64 * 1024;

/// Permits of the shared budget held by the frames last handed over (the frame last
/// asked for, or every frame read ahead).
struct Held {
    permit: OwnedSemaphorePermit,
    bytes: u32,
}

impl Drop for Held {
    fn drop(&mut self) {
        buffer_metrics().held.decrement(f64::from(self.bytes));
    }
}

type Acquire =
    Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send + Sync>>;

/// A request body as it goes to the upstream: boxed, so the request that carries it
/// (queued per upstream connection, and moved through the forwarding futures) stays
/// small.
pub(crate) type UpstreamBody = Pin<Box<RequestBody>>;

/// A client's request body on its way to the backend, under [`BodyLimits`]. Generic
/// over the body it wraps only so the tests can feed it frames by hand.
pub(crate) struct RequestBody<B = Incoming> {
    inner: B,
    budget: Arc<Semaphore>,
    budget_bytes: u32,
    max: Option<u64>,
    /// The field `max` comes from, for the error.
    max_field: &'static str,
    idle: Duration,
    /// `limits.body_arrival_timeout_ms`.
    arrival: Duration,
    /// Bytes seen so far.
    seen: u64,
    /// Made when the client is first waited for; its deadline follows the last progress
    /// without a timer operation per frame (a lazy sleep re-arms only when it fires
    /// early).
    idle_timer: Option<LazySleep>,
    /// When the client last sent something (or the body started).
    last_progress: Instant,
    /// Permits for the frame last handed over.
    held: Option<Held>,
    /// A frame read while the budget was exhausted, waiting for its permits.
    parked: Option<(Frame<Bytes>, u32, Acquire)>,
    /// Shared with the forward; `None` for a body that was empty from the start.
    exchange: Option<Arc<Exchange>>,
    /// Set once the body failed or ended, so it is never polled past that.
    done: bool,
    /// Fleet mode: [`Admission::forward_until`]. A body not complete by then is cut off,
    /// so the upstream never gets it whole.
    forward_until: Option<Pin<Box<Sleep>>>,
    /// Frames read ahead by [`RequestBody::read_ahead`], handed over first, one per
    /// poll. Their permits stay held until the upstream asks for the frame after them.
    ahead: VecDeque<Frame<Bytes>>,
    /// The body's fault, met while reading ahead, handed over on the first poll.
    ahead_fault: Option<BodyFault>,
    /// The body comes from hyper's HTTP/1 server: see [`RequestBody::drop_stale_wakes`].
    drop_stale_wakes: bool,
}

impl<B> RequestBody<B> {
    /// Wraps `inner`. `max` overrides `limits.body_bytes_max` (the embedded store's own
    /// object limit), with the field that sets it.
    pub(crate) fn new(
        inner: B,
        limits: &BodyLimits,
        max: Option<(u64, &'static str)>,
        exchange: Option<Arc<Exchange>>,
    ) -> Self {
        let (max, max_field) = match max {
            Some((max, field)) => (Some(max), field),
            None => (limits.max, "limits.body_bytes_max"),
        };
        Self {
            inner,
            budget: Arc::clone(&limits.budget),
            budget_bytes: limits.budget_bytes,
            max,
            max_field,
            idle: limits.idle,
            arrival: limits.arrival,
            seen: 0,
            idle_timer: None,
            // The exchange's start is this body's too: no second reading of the clock.
            last_progress: exchange
                .as_ref()
                .map_or_else(palisade_server::clock::tokio_now, |x| x.started),
            held: None,
            parked: None,
            exchange,
            done: false,
            ahead: VecDeque::new(),
            ahead_fault: None,
            forward_until: None,
            drop_stale_wakes: false,
        }
    }

    /// Marks the body as one from hyper's HTTP/1 server, polled through
    /// [`palisade_server::wake::poll_http1_body`]: a poll per request saved.
    pub(crate) fn drop_stale_wakes(&mut self) {
        self.drop_stale_wakes = true;
    }

    /// Cuts the body off at `at` ([`Admission::forward_until`]) if it is not complete by
    /// then.
    pub(crate) fn set_forward_until(&mut self, at: tokio::time::Instant) {
        self.forward_until = Some(Box::pin(tokio::time::sleep_until(at)));
    }

    fn idle_ms(&self) -> u64 {
        u64::try_from(self.idle.as_millis()).unwrap_or(u64::MAX)
    }

    /// Hands `frame` over with its permits, or parks it until the budget has room. The
    /// frame was read at `last_progress`.
    fn hand_over(&mut self, frame: Frame<Bytes>, bytes: u32) -> Option<Frame<Bytes>> {
        if let Ok(permit) = Arc::clone(&self.budget).try_acquire_many_owned(bytes) {
            self.hold(permit, bytes, self.last_progress);
            return Some(frame);
        }
        buffer_metrics().waits.increment(1);
        let acquire = Box::pin(Arc::clone(&self.budget).acquire_many_owned(bytes));
        self.parked = Some((frame, bytes, acquire));
        None
    }

    /// Holds `permit` for a frame being handed over at `at`, with the permits already
    /// held (frames read ahead hold theirs together until they are all taken).
    fn hold(&mut self, permit: OwnedSemaphorePermit, bytes: u32, at: Instant) {
        buffer_metrics().held.increment(f64::from(bytes));
        match &mut self.held {
            Some(held) => {
                held.permit.merge(permit);
                held.bytes = held.bytes.saturating_add(bytes);
            }
            None => self.held = Some(Held { permit, bytes }),
        }
        if let Some(exchange) = &self.exchange {
            exchange.progressed(at);
        }
    }

    fn fail(&mut self, fault: BodyFault) -> Poll<Option<Result<Frame<Bytes>, BodyFault>>> {
        self.done = true;
        self.parked = None;
        self.held = None;
        self.ahead.clear();
        Poll::Ready(Some(Err(fault)))
    }

    /// Waits for the parked frame's permits, then hands it over.
    fn poll_parked(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyFault>>> {
        let Some((_, bytes, acquire)) = &mut self.parked else {
            return Poll::Ready(None);
        };
        let bytes = *bytes;
        let permit = ready!(acquire.as_mut().poll(cx));
        let Some((frame, _, _)) = self.parked.take() else {
            return Poll::Ready(None);
        };
        match permit {
            Ok(permit) => {
                self.hold(permit, bytes, Instant::now());
                Poll::Ready(Some(Ok(frame)))
            }
            // The budget is never closed; if it were, fail closed rather than send a
            // frame past the cap.
            Err(_) => self.fail(BodyFault::BudgetClosed),
        }
    }

    /// The client has nothing for us now: arm the idle timer if it is not armed, and see
    /// whether the client has been silent for the whole idle timeout.
    ///
    /// The timer is made once per body; its deadline moves to the last progress plus the
    /// timeout at each wait, which a lazy sleep does without a timer operation: a body
    /// arriving in many frames costs one timer registration, not one per frame.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(exchange) = &self.exchange {
            exchange.waiting_for_client.store(true, Ordering::Relaxed);
        }
        let due = self.last_progress + self.idle;
        let timer = self.idle_timer.get_or_insert_with(|| LazySleep::until(due));
        Pin::new(&mut *timer).reset(due);
        Pin::new(timer).poll(cx)
    }
}

impl<B> RequestBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// Reads ahead before the body is handed to the upstream client, under the same
    /// limits as every frame: the whole body when its declared length is at most
    /// [`READ_AHEAD_BYTES_MAX`], else its first frame. The client then finds them ready
    /// and writes them with the request head in one system call, instead of sending
    /// the head alone and the body after, frame by frame. Called after admission only,
    /// so `100 Continue` still goes out only to an admitted write.
    ///
    /// It never waits for the shared budget while it holds frames read ahead: a frame
    /// that must wait stays parked, and the frames before it go upstream first, so
    /// bodies reading ahead cannot hold the whole budget while each waits for more.
    ///
    /// It has `limits.body_arrival_timeout_ms` to finish, on top of the idle timeout: a
    /// client that trickles a small body a byte at a time is never idle, and the request
    /// takes its upstream slot only after this returns. Past it, the body fails with
    /// [`BodyFault::Arrival`] and nothing goes upstream.
    pub(crate) async fn read_ahead(&mut self) {
        let whole = self
            .inner
            .size_hint()
            .exact()
            .is_some_and(|len| len <= READ_AHEAD_BYTES_MAX);
        let arrival = self.arrival;
        // A body already read (most small ones) ends the read on its first poll, before
        // the timer is polled: no timer is registered for it.
        let read = std::future::poll_fn(|cx| self.poll_ahead(cx, whole));
        if tokio::time::timeout(arrival, read).await.is_err() {
            let timeout_ms = u64::try_from(arrival.as_millis()).unwrap_or(u64::MAX);
            if let Poll::Ready(Some(Err(fault))) = self.fail(BodyFault::Arrival { timeout_ms }) {
                self.ahead_fault = Some(fault);
            }
        }
    }

    /// Whether more of the body is still to come from the client: it was not read to
    /// its end (ahead or handed over) and has not failed. An upstream request with such
    /// a body waits for its client while it holds its upstream slot.
    pub(crate) fn still_arriving(&self) -> bool {
        !self.done && !self.inner.is_end_stream()
    }

    /// The body's fault met while reading ahead (too large, idle, broken, cut off), if
    /// any: then nothing of it needs to go upstream.
    pub(crate) fn fault_ahead(&mut self) -> Option<BodyFault> {
        self.ahead_fault.take()
    }

    fn poll_ahead(&mut self, cx: &mut Context<'_>, whole: bool) -> Poll<()> {
        loop {
            // The lease's end is watched while reading ahead too, so a body still
            // arriving then is cut off at once, not when it is first handed over.
            if let Some(until) = &mut self.forward_until
                && until.as_mut().poll(cx).is_ready()
            {
                if let Poll::Ready(Some(Err(fault))) = self.fail(BodyFault::LeaseEnded) {
                    self.ahead_fault = Some(fault);
                }
                return Poll::Ready(());
            }
            if self.done || self.inner.is_end_stream() || (!whole && !self.ahead.is_empty()) {
                return Poll::Ready(());
            }
            let next = match self.poll_read(cx) {
                Poll::Ready(next) => next,
                // Waiting for the budget with frames in hand: send those first.
                Poll::Pending if self.parked.is_some() && !self.ahead.is_empty() => {
                    return Poll::Ready(());
                }
                Poll::Pending => return Poll::Pending,
            };
            match next {
                Some(Ok(frame)) => {
                    let trailers = frame.is_trailers();
                    self.ahead.push_back(frame);
                    if trailers {
                        return Poll::Ready(());
                    }
                }
                Some(Err(fault)) => {
                    self.ahead_fault = Some(fault);
                    return Poll::Ready(());
                }
                None => return Poll::Ready(()),
            }
        }
    }

    /// Reads the next frame from the client, under the limits.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyFault>>> {
        if self.parked.is_some() {
            return self.poll_parked(cx);
        }
        loop {
            let polled = if self.drop_stale_wakes {
                palisade_server::wake::poll_http1_body(&mut self.inner, cx)
            } else {
                Pin::new(&mut self.inner).poll_frame(cx)
            };
            let frame = match polled {
                Poll::Pending => {
                    if self.poll_idle(cx).is_ready() {
                        let timeout_ms = self.idle_ms();
                        return self.fail(BodyFault::Idle { timeout_ms });
                    }
                    return Poll::Pending;
                }
                Poll::Ready(None) => {
                    self.done = true;
                    if let Some(exchange) = &self.exchange {
                        exchange.waiting_for_client.store(false, Ordering::Relaxed);
                        exchange.progressed(palisade_server::clock::tokio_now());
                    }
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(e))) => return self.fail(BodyFault::Read(e.into())),
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            self.last_progress = palisade_server::clock::tokio_now();
            if let Some(exchange) = &self.exchange {
                exchange.waiting_for_client.store(false, Ordering::Relaxed);
            }
            let Some(data) = frame.data_ref() else {
                // Trailers pass through as they are.
                if let Some(exchange) = &self.exchange {
                    exchange.progressed(self.last_progress);
                }
                return Poll::Ready(Some(Ok(frame)));
            };
            if data.is_empty() {
                continue;
            }
            self.seen = self.seen.saturating_add(data.len() as u64);
            if let Some(max) = self.max
                && self.seen > max
            {
                let field = self.max_field;
                return self.fail(BodyFault::TooLarge { max, field });
            }
            // A frame larger than the whole budget takes all of it, so it still passes
            // (alone) instead of waiting forever.
            let bytes = u32::try_from(data.len())
                .unwrap_or(u32::MAX)
                .min(self.budget_bytes);
            if let Some(frame) = self.hand_over(frame, bytes) {
                return Poll::Ready(Some(Ok(frame)));
            }
            // Parked: poll the acquisition now, so its waker is registered.
            return self.poll_parked(cx);
        }
    }
}

impl<B> Body for RequestBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = BodyFault;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyFault>>> {
        let this = self.get_mut();
        // Checked before frames read ahead are handed over too: a body read whole
        // before the lease ended still may not go upstream after it.
        if let Some(until) = &mut this.forward_until
            && (!this.done || !this.ahead.is_empty())
            && until.as_mut().poll(cx).is_ready()
        {
            return this.fail(BodyFault::LeaseEnded);
        }
        // Frames read ahead keep their permits until the upstream asks past them.
        if let Some(frame) = this.ahead.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if let Some(fault) = this.ahead_fault.take() {
            return Poll::Ready(Some(Err(fault)));
        }
        // Asked for the next frame: the upstream has taken the last one.
        this.held = None;
        if this.done {
            return Poll::Ready(None);
        }
        this.poll_read(cx)
    }

    fn is_end_stream(&self) -> bool {
        if !self.ahead.is_empty() || self.ahead_fault.is_some() {
            return false;
        }
        self.done || (self.parked.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        // The client's length, so a Content-Length body is forwarded with its length
        // (and a chunked one chunked, with its trailers). hyper's body counts only what
        // it has not handed out yet, so the frames read ahead (and one parked for the
        // budget) are added back: the hint is what this body will still yield.
        let inner = self.inner.size_hint();
        let held = self
            .ahead
            .iter()
            .chain(self.parked.as_ref().map(|(frame, _, _)| frame))
            .filter_map(Frame::data_ref)
            .map(|data| data.len() as u64)
            .sum::<u64>();
        if held == 0 {
            return inner;
        }
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(held));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(held));
        }
        hint
    }
}

#[cfg(test)]
mod wake_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::future::poll_fn;

    use tokio::sync::mpsc;

    /// A body the test feeds frame by frame; closing the sender ends it. The length it
    /// declares, if any, less what it has yielded, is its size hint, as hyper's body of
    /// a `Content-Length` request gives it.
    struct Fed(mpsc::UnboundedReceiver<Frame<Bytes>>, Option<u64>);

    impl Body for Fed {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            let frame = ready!(self.0.poll_recv(cx));
            if let (Some(left), Some(data)) =
                (&mut self.1, frame.as_ref().and_then(Frame::data_ref))
            {
                *left = left.saturating_sub(data.len() as u64);
            }
            Poll::Ready(frame.map(Ok))
        }

        fn is_end_stream(&self) -> bool {
            self.1 == Some(0)
        }

        fn size_hint(&self) -> SizeHint {
            self.1.map_or_else(SizeHint::default, SizeHint::with_exact)
        }
    }

    fn fed(limits: &BodyLimits) -> (mpsc::UnboundedSender<Frame<Bytes>>, RequestBody<Fed>) {
        fed_declaring(limits, None)
    }

    fn fed_declaring(
        limits: &BodyLimits,
        len: Option<u64>,
    ) -> (mpsc::UnboundedSender<Frame<Bytes>>, RequestBody<Fed>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, RequestBody::new(Fed(rx, len), limits, None, None))
    }

    fn data(n: usize) -> Frame<Bytes> {
        Frame::data(Bytes::from(vec![b'x'; n]))
    }

    /// The next frame, waiting for it.
    async fn next(body: &mut RequestBody<Fed>) -> Option<Result<Frame<Bytes>, BodyFault>> {
        poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
    }

    /// Polls once, without waiting.
    fn poll_once(body: &mut RequestBody<Fed>) -> Poll<Option<Result<Frame<Bytes>, BodyFault>>> {
        let waker = std::task::Waker::noop();
        Pin::new(body).poll_frame(&mut Context::from_waker(waker))
    }

    /// Goal: the body buffer budget is shared by every body: a frame that does not fit
    /// waits (its connection reads no more) until another body's frame is taken by the
    /// upstream, and a frame larger than the whole budget still passes alone.
    /// Method: a 10-byte budget; body A takes an 8-byte frame; body B's 8-byte frame must
    /// wait; A is polled again (its frame taken), and B's frame passes; then a 20-byte
    /// frame on A.
    #[tokio::test]
    async fn the_budget_holds_back_a_frame_until_another_is_taken() {
        let limits = BodyLimits::new(None, Duration::from_secs(30), Duration::from_secs(60), 10);
        let (a_tx, mut a) = fed(&limits);
        let (b_tx, mut b) = fed(&limits);
        a_tx.send(data(8)).unwrap();
        b_tx.send(data(8)).unwrap();
        assert!(matches!(poll_once(&mut a), Poll::Ready(Some(Ok(_)))));
        assert_eq!(limits.budget.available_permits(), 2);
        assert!(
            poll_once(&mut b).is_pending(),
            "B waits: 8 bytes do not fit in 2"
        );
        assert!(
            poll_once(&mut a).is_pending(),
            "A's next frame has not come"
        );
        assert_eq!(
            limits.budget.available_permits(),
            2,
            "A's frame was taken, and its 8 bytes went to B, which was waiting for them"
        );
        let frame = poll_fn(|cx| Pin::new(&mut b).poll_frame(cx)).await;
        assert_eq!(frame.unwrap().unwrap().into_data().unwrap().len(), 8);
        assert_eq!(limits.budget.available_permits(), 2);
        drop(b);
        assert_eq!(
            limits.budget.available_permits(),
            10,
            "a dropped body frees its share"
        );
        a_tx.send(data(20)).unwrap();
        assert!(matches!(poll_once(&mut a), Poll::Ready(Some(Ok(_)))));
        assert_eq!(limits.budget.available_permits(), 0);
    }

    /// Goal: a body that crosses the size limit is cut off naming the field, and one that
    /// stays within it passes whole, with its trailers.
    /// Method: a 10-byte limit; frames of 6 and 4 bytes and trailers on one body, 6 and 5
    /// on another.
    #[tokio::test]
    async fn the_size_limit_cuts_off_a_body_that_crosses_it() {
        let limits = BodyLimits::new(
            Some(10),
            Duration::from_secs(30),
            Duration::from_secs(60),
            1024,
        );
        let (tx, mut within) = fed(&limits);
        tx.send(data(6)).unwrap();
        tx.send(data(4)).unwrap();
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-checksum", http::HeaderValue::from_static("abc"));
        tx.send(Frame::trailers(trailers)).unwrap();
        drop(tx);
        let mut frames = Vec::new();
        while let Some(frame) = poll_fn(|cx| Pin::new(&mut within).poll_frame(cx)).await {
            frames.push(frame.unwrap());
        }
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[2].trailers_ref().unwrap()["x-checksum"], "abc");

        let (tx, mut over) = fed(&limits);
        tx.send(data(6)).unwrap();
        tx.send(data(5)).unwrap();
        assert!(matches!(poll_once(&mut over), Poll::Ready(Some(Ok(_)))));
        let Poll::Ready(Some(Err(fault))) = poll_once(&mut over) else {
            panic!("the body crossed its limit and was not cut off");
        };
        assert_eq!(
            fault.to_string(),
            "request body is over the limit of 10 bytes (limits.body_bytes_max)"
        );
        assert_eq!(
            fault.to_proxy_error().status(),
            http::StatusCode::PAYLOAD_TOO_LARGE
        );
        assert!(
            matches!(poll_once(&mut over), Poll::Ready(None)),
            "never polled past it"
        );
    }

    /// Goal: a body whose client sends nothing for the idle timeout is cut off (408), and
    /// progress resets the timer.
    /// Method: paused time, a 100 ms idle timeout; a frame, 80 ms of silence, a frame,
    /// 80 ms more (still alive: the timer was reset), then 100 ms more.
    #[tokio::test(start_paused = true)]
    async fn an_idle_body_is_cut_off_and_progress_resets_the_timer() {
        let limits = BodyLimits::new(
            None,
            Duration::from_millis(100),
            Duration::from_secs(60),
            1024,
        );
        let (tx, mut body) = fed(&limits);
        tx.send(data(1)).unwrap();
        assert!(next(&mut body).await.unwrap().is_ok());
        let pending = tokio::time::timeout(Duration::from_millis(80), next(&mut body)).await;
        assert!(pending.is_err(), "still waiting within the timeout");
        tx.send(data(1)).unwrap();
        assert!(next(&mut body).await.unwrap().is_ok());
        let pending = tokio::time::timeout(Duration::from_millis(80), next(&mut body)).await;
        assert!(pending.is_err(), "the timer restarted at the last frame");
        let fault = next(&mut body).await.unwrap().unwrap_err();
        assert_eq!(
            fault.to_proxy_error().status(),
            http::StatusCode::REQUEST_TIMEOUT
        );
        assert!(
            fault.to_string().contains("limits.body_idle_timeout_ms"),
            "{fault}"
        );
    }

    /// Goal: in fleet mode a body still arriving when its write's lease ends is cut off,
    /// even while its client keeps sending, so the upstream never gets it whole after
    /// the lease; frames before the end pass.
    /// Method: paused time; a cut-off 100 ms ahead and an idle timeout far longer; a
    /// frame at once, then frames every 40 ms until the cut-off.
    #[tokio::test(start_paused = true)]
    async fn a_body_is_cut_off_when_its_lease_ends() {
        let limits = BodyLimits::new(None, Duration::from_secs(60), Duration::from_secs(60), 1024);
        let (tx, mut body) = fed(&limits);
        body.set_forward_until(tokio::time::Instant::now() + Duration::from_millis(100));
        tx.send(data(1)).unwrap();
        assert!(next(&mut body).await.unwrap().is_ok());
        let mut passed = 1;
        let fault = loop {
            tokio::time::sleep(Duration::from_millis(40)).await;
            tx.send(data(1)).unwrap();
            match next(&mut body).await.unwrap() {
                Ok(_) => passed += 1,
                Err(fault) => break fault,
            }
        };
        assert_eq!(
            passed, 3,
            "frames at 0, 40 and 80 ms pass; the one at 120 ms does not"
        );
        assert!(matches!(fault, BodyFault::LeaseEnded), "{fault}");
        assert_eq!(
            fault.to_proxy_error().status(),
            http::StatusCode::SERVICE_UNAVAILABLE
        );
        assert!(next(&mut body).await.is_none(), "nothing after the cut-off");
    }

    /// Goal: a body whose declared length is at most `READ_AHEAD_BYTES_MAX` is read whole
    /// before it goes upstream, even when its frames come one at a time, and is then
    /// handed over frame by frame, holding its permits until the upstream asks past the
    /// last; a body of unknown length, or declared longer, gets its first frame read
    /// ahead only.
    /// Method: a 30-byte body declared as such, its three frames sent while `read_ahead`
    /// waits; then the same frames on a body of unknown length and on one declaring
    /// `READ_AHEAD_BYTES_MAX + 1` bytes, each with its first frame only ready.
    #[tokio::test]
    async fn read_ahead_takes_a_small_declared_body_whole_and_others_one_frame() {
        let limits = BodyLimits::new(None, Duration::from_secs(30), Duration::from_secs(60), 1024);
        let (tx, mut body) = fed_declaring(&limits, Some(30));
        tx.send(data(10)).unwrap();
        let feeder = tokio::spawn(async move {
            for _ in 0..2 {
                tokio::task::yield_now().await;
                tx.send(data(10)).unwrap();
            }
        });
        body.read_ahead().await;
        feeder.await.unwrap();
        assert_eq!(body.ahead.len(), 3, "the whole body was read ahead");
        assert_eq!(limits.budget.available_permits(), 1024 - 30);
        for _ in 0..3 {
            assert!(!body.is_end_stream(), "frames are still to be handed over");
            assert!(matches!(poll_once(&mut body), Poll::Ready(Some(Ok(_)))));
        }
        assert_eq!(
            limits.budget.available_permits(),
            1024 - 30,
            "the frames read ahead hold their permits until the upstream asks past them"
        );
        assert!(matches!(poll_once(&mut body), Poll::Ready(None)));
        assert_eq!(limits.budget.available_permits(), 1024);

        for len in [None, Some(READ_AHEAD_BYTES_MAX + 1)] {
            let (tx, mut body) = fed_declaring(&limits, len);
            tx.send(data(10)).unwrap();
            body.read_ahead().await;
            assert_eq!(body.ahead.len(), 1, "one frame only ({len:?})");
            assert!(
                poll_once(&mut body).is_ready(),
                "the frame read ahead comes first"
            );
            assert!(
                poll_once(&mut body).is_pending(),
                "nothing more was read ({len:?})"
            );
        }
    }

    /// Goal: a body reading ahead never waits for the shared budget while it holds frames
    /// (bodies each holding part of the budget and waiting for more would wait for each
    /// other forever); the frame that does not fit waits, parked, until the frames before
    /// it were taken.
    /// Method: a 10-byte budget; a body declaring 16 bytes sends 8 and 8: `read_ahead`
    /// must return (within a deadline) with the first frame; taking it and asking again
    /// frees its permits for the second.
    #[tokio::test]
    async fn read_ahead_does_not_wait_for_the_budget_while_holding_frames() {
        let limits = BodyLimits::new(None, Duration::from_secs(30), Duration::from_secs(60), 10);
        let (tx, mut body) = fed_declaring(&limits, Some(16));
        tx.send(data(8)).unwrap();
        tx.send(data(8)).unwrap();
        tokio::time::timeout(Duration::from_secs(10), body.read_ahead())
            .await
            .expect("read_ahead waited for the budget while holding a frame");
        assert_eq!(body.ahead.len(), 1);
        assert!(body.parked.is_some(), "the second frame waits for permits");
        let first = next(&mut body).await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap().len(), 8);
        let second = next(&mut body).await.unwrap().unwrap();
        assert_eq!(second.into_data().unwrap().len(), 8);
        assert_eq!(limits.budget.available_permits(), 2);
    }

    /// Goal: in fleet mode, frames read ahead are not handed over once the lease ended,
    /// even though the whole body was read before it ended.
    /// Method: paused time; a 10-byte body declared as such, read ahead whole, a cut-off
    /// 100 ms ahead; 150 ms later the first poll is the cut-off.
    #[tokio::test(start_paused = true)]
    async fn a_body_read_ahead_is_cut_off_when_its_lease_ends_before_it_is_sent() {
        let limits = BodyLimits::new(None, Duration::from_secs(60), Duration::from_secs(60), 1024);
        let (tx, mut body) = fed_declaring(&limits, Some(10));
        body.set_forward_until(tokio::time::Instant::now() + Duration::from_millis(100));
        tx.send(data(10)).unwrap();
        drop(tx);
        body.read_ahead().await;
        assert_eq!(body.ahead.len(), 1);
        tokio::time::sleep(Duration::from_millis(150)).await;
        let fault = next(&mut body).await.unwrap().unwrap_err();
        assert!(matches!(fault, BodyFault::LeaseEnded), "{fault}");
        assert!(next(&mut body).await.is_none(), "nothing after the cut-off");
        assert_eq!(limits.budget.available_permits(), 1024);
    }

    /// Goal: in fleet mode, a body still being read ahead when its lease ends is cut off
    /// then, while its client is still sending, not only once it would be handed over.
    /// Method: paused time; a body declaring 30 bytes of which 10 come, a cut-off 100 ms
    /// ahead and an idle timeout far longer; `read_ahead` must end at the cut-off (well
    /// before the idle timeout) with the lease fault, and release the frame's permits.
    #[tokio::test(start_paused = true)]
    async fn a_body_being_read_ahead_is_cut_off_when_its_lease_ends() {
        let limits = BodyLimits::new(None, Duration::from_secs(60), Duration::from_secs(60), 1024);
        let (tx, mut body) = fed_declaring(&limits, Some(30));
        body.set_forward_until(tokio::time::Instant::now() + Duration::from_millis(100));
        tx.send(data(10)).unwrap();
        let started = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(10), body.read_ahead())
            .await
            .expect("read_ahead went on past the lease's end");
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(matches!(body.fault_ahead(), Some(BodyFault::LeaseEnded)));
        assert!(body.ahead.is_empty(), "nothing read ahead is handed over");
        assert_eq!(limits.budget.available_permits(), 1024);
        drop(tx);
    }

    /// Goal: what is read ahead must arrive within `limits.body_arrival_timeout_ms`, even
    /// from a client that is never idle: a small body trickled a byte at a time fails
    /// with the arrival fault (408), nothing of it is handed over, and its permits are
    /// released.
    /// Method: paused time; an arrival timeout of 100 ms and an idle timeout far longer;
    /// a body declaring 30 bytes that sends one every 40 ms while `read_ahead` waits.
    #[tokio::test(start_paused = true)]
    async fn read_ahead_gives_up_at_the_arrival_deadline() {
        let limits = BodyLimits::new(
            None,
            Duration::from_secs(60),
            Duration::from_millis(100),
            1024,
        );
        let (tx, mut body) = fed_declaring(&limits, Some(30));
        let feeder = tokio::spawn(async move {
            loop {
                if tx.send(data(1)).is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        });
        let started = tokio::time::Instant::now();
        body.read_ahead().await;
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not the idle timeout"
        );
        let fault = body.fault_ahead().expect("the arrival deadline passed");
        assert!(
            matches!(fault, BodyFault::Arrival { timeout_ms: 100 }),
            "{fault}"
        );
        let err = fault.to_proxy_error();
        assert_eq!(err.status(), http::StatusCode::REQUEST_TIMEOUT);
        assert!(
            err.to_string().contains("limits.body_arrival_timeout_ms"),
            "{err}"
        );
        assert!(body.ahead.is_empty(), "nothing read ahead is handed over");
        assert!(!body.still_arriving());
        assert_eq!(limits.budget.available_permits(), 1024);
        drop(body);
        feeder.await.unwrap();
    }

    /// Goal: a body's size hint is what it will still yield, frames read ahead
    /// included, so an upstream request built after the read-ahead is framed with the
    /// body's whole length (hyper's own body counts only what it has not handed out);
    /// and a body is "still arriving" exactly until its client has sent all of it.
    /// Method: a body declaring 10 bytes, 4 sent and read ahead (the other 6 not yet
    /// sent), then the rest; hints and `still_arriving` at each step.
    #[tokio::test]
    async fn size_hint_counts_what_was_read_ahead() {
        let limits = BodyLimits::new(None, Duration::from_secs(30), Duration::from_secs(30), 1024);
        let (tx, mut body) = fed_declaring(&limits, Some(10));
        tx.send(data(4)).unwrap();
        assert!(
            poll_fn(|cx| Poll::Ready(body.poll_ahead(cx, true)))
                .await
                .is_pending()
        );
        assert_eq!(body.ahead.len(), 1);
        assert_eq!(body.size_hint().exact(), Some(10));
        assert!(body.still_arriving());
        tx.send(data(6)).unwrap();
        body.read_ahead().await;
        assert_eq!(body.size_hint().exact(), Some(10));
        assert!(!body.still_arriving(), "all of it has come");
        assert!(matches!(poll_once(&mut body), Poll::Ready(Some(Ok(_)))));
        assert_eq!(body.size_hint().exact(), Some(6));
        assert!(matches!(poll_once(&mut body), Poll::Ready(Some(Ok(_)))));
        assert_eq!(body.size_hint().exact(), Some(0));
    }
}
