//! An HTTP/1 upstream connection run by the task that uses it.
//!
//! hyper splits a client connection in two: the sending half, and a future that writes
//! the requests and reads the answers, usually spawned as a task of its own. Here that
//! future is polled by whoever uses the connection: the request's task while it waits
//! for the answer's head ([`Http1::send`]), then the answer's body as it is read. A
//! connection task would cost every request two more hops between tasks (the request to
//! it, the answer back) and a wake-up of the task on each side, and at one thread most
//! of a request's cost is such work.
//!
//! The two halves still talk through hyper's channels, and each message wakes the
//! other half's waker, which is now the same task: left as they are, those wake-ups
//! would have the client connection's whole task polled again for nothing. So both
//! halves are polled with the connection's own waker ([`Hook`]), which swallows a
//! wake-up that comes while they are being polled, and polls both again instead; a
//! wake-up at any other time (the upstream's socket became readable) goes through to
//! the task.
//!
//! An idle connection in the pool is polled by nobody. Should the upstream have closed
//! it meanwhile, the next request on it finds out as the connection is first polled: it
//! reads before it writes, sees the close, and hands the request back unsent, to be
//! tried on another connection.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::{TrySendError, http1};
use sync_wrapper::SyncWrapper;

use crate::stream::UpstreamBody;

/// The future that runs an HTTP/1 connection: it writes the requests and reads the
/// answers. Wrapped so that the answer's body, which holds it, can be shared between
/// threads as a boxed body must; it is only ever polled through `&mut`.
type Driver = SyncWrapper<Pin<Box<dyn Future<Output = Result<(), hyper::Error>> + Send>>>;

/// What hyper's `try_send_request` returns: the answer's head, or the request back.
pub(super) type Answer = Result<Response<Incoming>, TrySendError<Request<UpstreamBody>>>;

/// How many times one poll runs the two halves again after a wake-up between them,
/// before it leaves the rest to a wake-up of the task. Each round is progress (one half
/// gave the other something); the bound keeps one connection from holding its thread.
const ROUNDS_MAX: usize = 8;

/// An HTTP/1 connection: its sending half, and the future that runs it.
pub(super) struct Http1 {
    sender: http1::SendRequest<UpstreamBody>,
    /// `None` once the connection has ended.
    driver: Option<Driver>,
    hook: Arc<Hook>,
    /// The waker of `hook`, made once.
    waker: Waker,
}

impl Http1 {
    /// A connection from hyper's two halves (`connection` with upgrades, so that a 101
    /// answer can become a tunnel).
    pub(super) fn new<F>(sender: http1::SendRequest<UpstreamBody>, connection: F) -> Self
    where
        F: Future<Output = Result<(), hyper::Error>> + Send + 'static,
    {
        let hook = Arc::new(Hook::default());
        Self {
            sender,
            driver: Some(SyncWrapper::new(Box::pin(connection))),
            waker: Waker::from(Arc::clone(&hook)),
            hook,
        }
    }

    /// Polls the connection, then `half` (what the caller waits for: the answer, a
    /// body frame), both with the connection's waker, and again while either woke the
    /// other during the round.
    pub(super) fn poll_with<T>(
        &mut self,
        cx: &mut Context<'_>,
        mut half: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        self.hook.task.register(cx.waker());
        let waker = self.waker.clone();
        let mut own = Context::from_waker(&waker);
        for _ in 0..ROUNDS_MAX {
            self.hook.state.store(POLLING, Ordering::SeqCst);
            self.poll_drive(&mut own);
            let polled = half(&mut own);
            let woken = self.hook.state.swap(IDLE, Ordering::SeqCst) & WOKEN != 0;
            // Ready with a wake-up swallowed: what the caller does next with the
            // connection (reads the body, returns it to the pool) polls it again.
            if polled.is_ready() || !woken {
                return polled;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Runs the connection alone: one [`poll_with`](Self::poll_with) round with nothing
    /// else to poll.
    pub(super) fn poll_run(&mut self, cx: &mut Context<'_>) {
        let _ = self.poll_with(cx, |_| Poll::Ready(()));
    }

    /// Lets the connection do what it can (write, read, notice a close); `false` once it
    /// has ended. Its end drops it, which fails the request in flight on it, if any,
    /// with the cause.
    fn poll_drive(&mut self, cx: &mut Context<'_>) -> bool {
        if let Some(driver) = &mut self.driver
            && let Poll::Ready(ended) = driver.get_mut().as_mut().poll(cx)
        {
            if let Err(e) = ended {
                tracing::debug!(cause = %e, "upstream connection ended with an error");
            }
            self.driver = None;
        }
        self.driver.is_some()
    }

    /// Sends `request` and waits for the answer's head, running the connection
    /// meanwhile. A request the connection did not begin to send comes back in the
    /// error (hyper's `try_send_request`).
    pub(super) fn send(
        &mut self,
        request: Request<UpstreamBody>,
    ) -> Sending<'_, impl Future<Output = Answer> + use<>> {
        // Handing the request over wakes the connection, which the first poll of
        // `Sending` polls anyway: the wake-up is swallowed rather than sent to the task
        // that last used the connection.
        self.hook.state.store(POLLING, Ordering::SeqCst);
        Sending {
            answer: self.sender.try_send_request(request),
            conn: self,
        }
    }

    /// Waits until the connection is ready for its next request (`true`) or has ended
    /// (`false`), running it meanwhile.
    pub(super) async fn ready(&mut self) -> bool {
        poll_fn(|cx| {
            self.poll_run(cx);
            if !self.is_open() {
                return Poll::Ready(false);
            }
            self.sender.poll_ready(cx).map(|ready| ready.is_ok())
        })
        .await
    }

    /// Hands the connection's future to a task of its own: for a connection that
    /// switched protocols, whose upgrade completes only when that future runs on.
    pub(super) fn detach(&mut self) {
        if let Some(driver) = self.driver.take() {
            tokio::spawn(async move {
                if let Err(e) = driver.into_inner().await {
                    tracing::debug!(cause = %e, "upstream connection ended with an error");
                }
            });
        }
    }

    /// Open: not ended.
    pub(super) fn is_open(&self) -> bool {
        self.driver.is_some()
    }

    /// Ready for its next request: open, and done with the last one.
    pub(super) fn is_ready(&self) -> bool {
        self.is_open() && self.sender.is_ready()
    }
}

pin_project_lite::pin_project! {
    /// A request on an HTTP/1 connection ([`Http1::send`]). A hand-written future
    /// rather than an `async` block, which would keep the request (inside the answer's
    /// future) twice for as long as it is in flight.
    pub(super) struct Sending<'a, F> {
        conn: &'a mut Http1,
        #[pin]
        answer: F,
    }
}

impl<F: Future<Output = Answer>> Future for Sending<'_, F> {
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        let this = self.project();
        let mut answer = this.answer;
        this.conn.poll_with(cx, |own| answer.as_mut().poll(own))
    }
}

/// Nothing is being polled.
const IDLE: u8 = 0;
/// The connection's halves are being polled.
const POLLING: u8 = 1;
/// A wake-up came while they were.
const WOKEN: u8 = 2;

/// The waker both halves of a connection are polled with: a wake-up while they are
/// being polled ([`Http1::poll_with`]) is only noted, as they are polled again anyway;
/// any other wakes the task that last polled them.
#[derive(Default)]
struct Hook {
    state: AtomicU8,
    task: AtomicWaker,
}

impl Wake for Hook {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Noted in one step with the poll's state, so that a wake-up cannot fall
        // between the poll's last look and its end: either the poll sees it, or it
        // comes after the poll and goes through.
        if self.state.fetch_or(WOKEN, Ordering::SeqCst) & POLLING == 0 {
            self.task.wake();
        }
    }
}
