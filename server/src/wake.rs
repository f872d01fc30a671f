//! A connection task's waker that can drop a wake-up known to be stale.
//!
//! **Why.** hyper's HTTP/1 server hands a request's body to the service through a
//! channel (hyper 1.12, `body::chan`). Before it sends each chunk, its dispatcher
//! registers the connection task's waker with the channel, so that the receiver can
//! wake it once the chunk is taken; and it drops its end of the channel in the same
//! poll that sent the body's last bytes. The registration outlives that end: when the
//! service then takes the last chunk, the channel wakes the task for a sender that no
//! longer exists. tokio then polls the whole connection once more (the dispatcher, the
//! service, the upstream exchange) to find nothing to do. For a proxied PUT whose body
//! came with its head, that was one poll in three, about 1,600 instructions
//! (`docs/benchmarks.md`, thirteenth pass).
//!
//! **How.** [`Relayed`] polls a connection's future with a waker of its own (a relay),
//! which passes every wake-up on to the task's, but one: a wake-up of this connection's
//! own relay made on this thread while `muffled` runs ([`poll_http1_body`] runs the
//! body's poll in it) is held. When the call returns, its caller says whether what it
//! polled shows the wake-up stale (the body's sender is gone): then it is dropped;
//! otherwise it is passed on as the poll ends, and the task is polled again exactly as
//! it would have been. A panic caught within the poll passes it on too.
//!
//! **What may be judged stale.** Only what the caller can prove from what it just
//! polled. A wake-up dropped wrongly would leave the connection unpolled until its next
//! wake-up: a stalled request, never a wrong answer. Wake-ups from other threads, of
//! other tasks, and outside `muffled` always pass.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use hyper::body::{Body, Frame};

use crate::scoped::Scoped;

/// Where this thread is, as far as relays are concerned. Relays are told apart by
/// their address.
#[derive(Clone, Copy)]
struct State {
    /// The relay of the [`Relayed`] future being polled on this thread; 0 outside one.
    polling: usize,
    /// The relay whose wake-ups are held: `polling` inside [`muffled`], else 0.
    muffling: usize,
    /// A wake-up of `muffling` was held during the current [`muffled`] call.
    held: bool,
    /// A held wake-up was judged live: wake the task when the poll ends.
    pass_on: bool,
}

const OUTSIDE: State = State {
    polling: 0,
    muffling: 0,
    held: false,
    pass_on: false,
};

thread_local! {
    static STATE: Cell<State> = const { Cell::new(OUTSIDE) };
}

/// The waker a [`Relayed`] future is polled with: the task's, and what tells it apart.
struct Relay {
    /// The task's waker. Fixed: a poll with another makes another relay (see
    /// [`Relayed::poll`]).
    task: Waker,
}

impl Relay {
    fn id(self: &Arc<Self>) -> usize {
        Arc::as_ptr(self) as usize
    }
}

impl Wake for Relay {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let id = self.id();
        let held = STATE.with(|state| {
            let now = state.get();
            if now.muffling == id {
                state.set(State { held: true, ..now });
            }
            now.muffling == id
        });
        if !held {
            self.task.wake_by_ref();
        }
    }
}

pin_project_lite::pin_project! {
    /// A connection's future, polled with a relay of the task's waker that
    /// [`poll_http1_body`] can hold a stale wake-up at.
    pub struct Relayed<F> {
        #[pin]
        inner: F,
        // The relay, and it as a waker; made at the first poll.
        relay: Option<(Arc<Relay>, Waker)>,
    }
}

impl<F> Relayed<F> {
    /// Wraps `inner`.
    pub fn new(inner: F) -> Self {
        Self { inner, relay: None }
    }
}

impl<F: Future> Future for Relayed<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        // A task's waker does not change from poll to poll (tokio's never does), so the
        // relay is made once. Should it change, a new relay carries the new waker: a
        // future registers the waker of its latest poll wherever it waits, so the old
        // relay's registrations are replaced as they are polled again, and meanwhile
        // they wake the old waker, which is harmless.
        let (relay, waker) = match this.relay {
            Some((relay, waker)) if relay.task.will_wake(cx.waker()) => (relay, waker),
            stale => {
                let relay = Arc::new(Relay {
                    task: cx.waker().clone(),
                });
                let waker = Waker::from(Arc::clone(&relay));
                let (relay, waker) = stale.insert((relay, waker));
                (relay, waker)
            }
        };
        // No state outlives this poll, and a poll nested in another keeps the outer
        // one's.
        let scoped = Scoped::set(
            &STATE,
            State {
                polling: relay.id(),
                ..OUTSIDE
            },
        );
        let polled = this.inner.poll(&mut Context::from_waker(waker));
        let pass_on = STATE.with(|state| state.get().pass_on);
        drop(scoped);
        if pass_on {
            cx.waker().wake_by_ref();
        }
        polled
    }
}

/// What a body's poll yields.
type FrameOf<B> = Result<Frame<<B as Body>::Data>, <B as Body>::Error>;

/// Polls a request body of hyper's HTTP/1 server (`hyper::body::Incoming`) for its
/// next frame, dropping the wake-up its channel sends for a sender already gone.
///
/// hyper's dispatcher drops its end of the channel once the body is complete: for a
/// body of known length, in the same poll that sent its last bytes, before the service
/// can take them. So a wake-up on taking those (`is_end_stream` after them), or on
/// finding the channel closed, is stale. Any other outcome (more to come, a chunked
/// body's last chunk, an error, nothing yet) passes its wake-up on. Inside a
/// [`Relayed`] poll only; elsewhere it is a plain poll.
pub fn poll_http1_body<B: Body + Unpin>(
    body: &mut B,
    cx: &mut Context<'_>,
) -> Poll<Option<FrameOf<B>>> {
    muffled(|| {
        let polled = Pin::new(&mut *body).poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(frame))) => frame.is_data() && body.is_end_stream(),
            _ => false,
        };
        (polled, ended)
    })
}

/// Runs `poll`, which returns what it polled and whether that shows a wake-up of this
/// connection's task, made during the call, to be stale. Such a wake-up is held during
/// the call, then dropped if it was stale, or else passed on when the connection's poll
/// ends. Outside a [`Relayed`] poll, or inside another `muffled`, it only runs `poll`.
fn muffled<T>(poll: impl FnOnce() -> (T, bool)) -> T {
    /// Ends the call; a panic (`stale` stays false) passes a held wake-up on.
    struct Muffle {
        active: bool,
        stale: bool,
    }
    impl Drop for Muffle {
        fn drop(&mut self) {
            if !self.active {
                return;
            }
            STATE.with(|state| {
                let now = state.get();
                state.set(State {
                    muffling: 0,
                    held: false,
                    pass_on: now.pass_on || (now.held && !self.stale),
                    ..now
                });
            });
        }
    }
    let active = STATE.with(|state| {
        let now = state.get();
        let start = now.polling != 0 && now.muffling == 0;
        if start {
            state.set(State {
                muffling: now.polling,
                held: false,
                ..now
            });
        }
        start
    });
    let mut muffle = Muffle {
        active,
        stale: false,
    };
    let (polled, stale) = poll();
    muffle.stale = stale;
    drop(muffle);
    polled
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A task's waker that counts its wake-ups.
    #[derive(Default)]
    struct Counted(AtomicUsize);

    impl Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Counted {
        fn wakes(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// Polls `future` once with a counting task waker; returns the counter.
    fn poll_once<F: Future>(future: Pin<&mut F>) -> (Poll<F::Output>, Arc<Counted>) {
        let counted = Arc::new(Counted::default());
        let waker = Waker::from(Arc::clone(&counted));
        let polled = future.poll(&mut Context::from_waker(&waker));
        (polled, counted)
    }

    /// A registration, as a channel's sender keeps one: the waker of the poll that
    /// registered, woken later.
    type Registered = Arc<Mutex<Option<Waker>>>;

    fn register(slot: &Registered) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            *slot.lock().unwrap() = Some(cx.waker().clone());
            Poll::Ready(())
        })
    }

    fn wake(slot: &Registered) {
        slot.lock()
            .unwrap()
            .as_ref()
            .expect("registered")
            .wake_by_ref();
    }

    /// Goal: a wake-up made inside `muffled` and judged stale never reaches the task,
    /// while one judged live reaches it once, and wake-ups outside `muffled` pass as
    /// they come (fails if the relay drops or doubles any of them).
    /// Method: a future registers its waker, then wakes it inside `muffled` (stale,
    /// then live) and, after the poll, outside; a counting waker stands for the task.
    #[test]
    fn a_stale_wake_up_is_dropped_and_every_other_one_passes() {
        let slot = Registered::default();
        for (stale, expected) in [(true, 0), (false, 1)] {
            let mut relayed = Box::pin(Relayed::new(async {
                register(&slot).await;
                muffled(|| {
                    wake(&slot);
                    ((), stale)
                });
                std::future::pending::<()>().await;
            }));
            let (polled, counted) = poll_once(relayed.as_mut());
            assert!(polled.is_pending());
            assert_eq!(counted.wakes(), expected, "stale: {stale}");
            wake(&slot);
            assert_eq!(counted.wakes(), expected + 1, "stale: {stale}");
        }
    }

    /// Goal: when the task's waker changes between polls, wake-ups registered in the
    /// later poll reach the later waker (a new relay carries it).
    /// Method: a future that registers at every poll, polled with two counting wakers
    /// in turn, woken after each poll.
    #[test]
    fn a_new_task_waker_gets_the_wake_ups_registered_after_it() {
        let slot = Registered::default();
        let mut relayed = Box::pin(Relayed::new(std::future::poll_fn(|cx| {
            *slot.lock().unwrap() = Some(cx.waker().clone());
            Poll::<()>::Pending
        })));
        for _ in 0..2 {
            let (polled, counted) = poll_once(relayed.as_mut());
            assert!(polled.is_pending());
            wake(&slot);
            assert_eq!(counted.wakes(), 1);
        }
    }

    /// Goal: a wake-up from another thread during `muffled` passes, even when the
    /// call judges its own stale: only this thread's wake-ups are held (were it held,
    /// the stale judgement would drop it and the count would be 0).
    /// Method: a scoped thread wakes the registration inside `muffled`.
    #[test]
    fn a_wake_up_from_another_thread_is_never_held() {
        let slot = Registered::default();
        let mut relayed = Box::pin(Relayed::new(async {
            register(&slot).await;
            muffled(|| {
                std::thread::scope(|scope| {
                    scope.spawn(|| wake(&slot));
                });
                ((), true)
            });
            std::future::pending::<()>().await;
        }));
        let (polled, counted) = poll_once(relayed.as_mut());
        assert!(polled.is_pending());
        assert_eq!(counted.wakes(), 1);
    }

    /// Goal: a panic inside `muffled`, caught within the same poll (as a forward's is),
    /// passes a held wake-up on (it may have been live), and no state outlives the
    /// poll; outside a `Relayed` poll, `muffled` holds nothing.
    /// Method: a call that wakes and then panics, under `catch_unwind` inside the
    /// relayed future; then the thread's state, and a bare `muffled`.
    #[test]
    fn a_panic_passes_the_wake_up_on_and_leaves_nothing_behind() {
        let slot = Registered::default();
        let mut relayed = Box::pin(Relayed::new(async {
            register(&slot).await;
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                muffled(|| -> ((), bool) {
                    wake(&slot);
                    panic!("in the middle of a poll");
                });
            }));
            assert!(caught.is_err());
            std::future::pending::<()>().await;
        }));
        let (polled, counted) = poll_once(relayed.as_mut());
        assert!(polled.is_pending());
        assert_eq!(counted.wakes(), 1, "the held wake-up was passed on");
        let after = STATE.with(Cell::get);
        assert_eq!((after.polling, after.muffling), (0, 0), "state restored");
        assert!(!after.held && !after.pass_on, "state restored");
        let plain = Arc::new(Counted::default());
        let plain_waker = Waker::from(Arc::clone(&plain));
        muffled(|| {
            plain_waker.wake_by_ref();
            ((), true)
        });
        assert_eq!(plain.wakes(), 1);
    }
}
