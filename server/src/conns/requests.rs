//! Request counting: [`RequestTracker::enter`] when a request reaches the service, and the
//! [`InFlight`] guard, carried by the response body ([`TrackedBody`]), ends it.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};

use super::slot::{CLOSING, Slot};

/// Counts one connection's requests in flight; cheap to clone into its service.
#[derive(Clone)]
pub struct RequestTracker(pub(super) Arc<Slot>);

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
