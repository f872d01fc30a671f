//! Deadlines that move without touching the runtime's timer wheel.
//!
//! A connection's timers are polled at every wake-up of its task: the connection
//! table's check (`Admitted::serve_or_release`), and, while a request waits for the
//! upstream, the upstream timeout; a request body's idle timeout moves at every frame.
//! With tokio's `Sleep` each such poll checks the task's budget and registers the waker
//! again, and each move of a deadline takes the timer wheel's lock to take the entry out
//! and put it back.
//!
//! [`LazySleep`] keeps its deadline beside a tokio timer armed at or before it. Moving
//! the deadline later only writes the new value; when the armed timer fires early, the
//! sleep arms it again at the deadline and keeps waiting (one extra wake-up per move
//! that was still pending, at most one per timeout period on a busy connection). Moving
//! it earlier arms the timer at once. Once the armed timer holds the polling task's
//! waker, a poll that finds it neither fired nor polled by another task returns
//! `Pending` without calling into tokio.
//!
//! It never completes before its deadline (the armed timer firing early only re-arms it)
//! and no later than tokio's own timer would (from the last early firing on, it is armed
//! at the deadline itself).
//!
//! **Spare timers.** A request made two timers and dropped them: hyper's HTTP/1 server
//! makes a head timer for each request and drops it once the head is read, and the
//! upstream timeout lives for one exchange. Each put an entry into the wheel at its
//! first poll and took it out when dropped. Inside [`Recycling`] (a connection's task
//! is wrapped in it), a sleep dropped during a poll leaves its armed timer to the
//! connection as a spare, still in the wheel and holding the task's waker, and the next
//! sleep made in that connection takes it.
//! A spare armed at or before the new deadline is kept as it is (the deadlines of one
//! connection's requests follow each other), so taking it costs no wheel operation;
//! one armed later is moved, as a new timer would be armed. A spare that fires while
//! nobody holds it wakes its connection's task once, for nothing (at most once per
//! timeout period). Outside [`Recycling`], or with no spare, a sleep arms a timer of
//! its own, and it is dropped with it. Measured with callgrind (one worker, 1 KiB
//! bodies): 24,201 → 23,738 instructions per GET, 29,036 → 28,482 per PUT.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

/// Spare timers one connection keeps: hyper's head timer and the upstream timeout of a
/// request overlap only for a moment, and a body's idle timer may be alive beside them.
pub const SPARE_TIMERS_MAX: usize = 2;

/// hyper's timer, with [`LazySleep`]s: `reset` moves a deadline without a wheel
/// operation. Reads the clock through tokio, so tests with a paused clock see the same
/// time as the runtime.
#[derive(Clone, Copy, Debug, Default)]
pub struct LazyTimer;

impl hyper::rt::Timer for LazyTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(LazySleep::until(crate::clock::tokio_now() + duration))
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(LazySleep::until(deadline.into()))
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: std::time::Instant) {
        match sleep.as_mut().downcast_mut_pin::<LazySleep>() {
            Some(lazy) => lazy.reset(new_deadline.into()),
            // Not one of ours (hyper only gives back what `sleep` made): replace it.
            None => *sleep = self.sleep_until(new_deadline),
        }
    }

    fn now(&self) -> std::time::Instant {
        crate::clock::now()
    }
}

/// A tokio timer and the waker it holds, once polled since it was last armed.
#[derive(Debug)]
struct Armed {
    sleep: Pin<Box<tokio::time::Sleep>>,
    registered: Option<Waker>,
}

impl Armed {
    fn at(deadline: Instant) -> Self {
        Self {
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            registered: None,
        }
    }

    /// Arms it at `deadline`: a wheel operation, and the waker must be registered again.
    fn rearm(&mut self, deadline: Instant) {
        self.sleep.as_mut().reset(deadline);
        self.registered = None;
    }
}

/// A future that completes at its deadline, which [`LazySleep::reset`] moves cheaply
/// (see the module's documentation).
#[derive(Debug)]
pub struct LazySleep {
    // When it completes.
    deadline: Instant,
    // tokio's timer, armed at or before `deadline`. `None` only once dropped (its timer
    // went back to the connection's spares).
    armed: Option<Armed>,
    // The connection whose spare timers it may take and give back (its
    // [`Recycling`]'s id); 0: none.
    owner: u64,
}

impl LazySleep {
    /// A sleep that completes at `deadline`: on a spare timer of the connection being
    /// polled, if it has one.
    pub fn until(deadline: Instant) -> Self {
        let (spare, owner) = take_spare(deadline);
        Self {
            deadline,
            armed: Some(spare.unwrap_or_else(|| Armed::at(deadline))),
            owner,
        }
    }

    /// Its timer; armed again at the deadline should it be missing (it is, only while
    /// the sleep is dropped).
    fn armed(&mut self) -> &mut Armed {
        let deadline = self.deadline;
        self.armed.get_or_insert_with(|| Armed::at(deadline))
    }

    /// Moves the deadline. Later: only the value changes, and the armed timer re-arms
    /// when it fires. Earlier: the armed timer is moved at once.
    pub fn reset(self: Pin<&mut Self>, deadline: Instant) {
        let this = self.get_mut();
        this.deadline = deadline;
        let armed = this.armed();
        if deadline < armed.sleep.deadline() {
            armed.rearm(deadline);
        }
    }
}

impl Future for LazySleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let deadline = this.deadline;
        let armed = this.armed();
        loop {
            let holds_waker = armed
                .registered
                .as_ref()
                .is_some_and(|waker| waker.will_wake(cx.waker()));
            // Armed, holding this task's waker, not fired: it wakes the task when it
            // fires, and nothing else can have changed.
            if holds_waker && !armed.sleep.is_elapsed() {
                return Poll::Pending;
            }
            if armed.sleep.as_mut().poll(cx).is_pending() {
                if !holds_waker {
                    armed.registered = Some(cx.waker().clone());
                }
                return Poll::Pending;
            }
            // Fired. At or after the deadline: done. Before it (the deadline moved later
            // since it was armed): arm it again at the deadline, and poll it to register
            // the waker.
            if armed.sleep.deadline() >= deadline {
                return Poll::Ready(());
            }
            armed.rearm(deadline);
        }
    }
}

impl Drop for LazySleep {
    fn drop(&mut self) {
        if let Some(armed) = self.armed.take() {
            give_back(self.owner, armed);
        }
    }
}

impl hyper::rt::Sleep for LazySleep {}

/// One connection's spare timers, with its id; outside a [`Recycling`] poll the
/// thread-local holds [`Spares::NONE`].
#[derive(Debug)]
struct Spares {
    /// The connection's id; 0: none.
    owner: u64,
    timers: [Option<Armed>; SPARE_TIMERS_MAX],
}

impl Spares {
    const NONE: Self = Self {
        owner: 0,
        timers: [const { None }; SPARE_TIMERS_MAX],
    };
}

thread_local! {
    /// The spares of the connection whose [`Recycling`] poll runs on this thread, swapped
    /// in for the poll and out after it (no allocation, no move of the timers
    /// themselves).
    static SPARES: RefCell<Spares> = const { RefCell::new(Spares::NONE) };
}

/// Runs `f` on the spares of the connection being polled on this thread ([`Spares::NONE`]
/// outside one). `f` must not drop a timer: give it back to the caller instead. `None`,
/// without running `f`, once the thread-local is gone (a sleep dropped as its thread
/// exits) or should it be in use: the caller then acts as outside a poll.
fn with_spares<R>(f: impl FnOnce(&mut Spares) -> R) -> Option<R> {
    SPARES
        .try_with(|cell| cell.try_borrow_mut().ok().map(|mut spares| f(&mut spares)))
        .ok()
        .flatten()
}

/// A spare timer of the connection being polled, if it has one, armed at or before
/// `deadline` (moved there if it was armed later); and the connection's id (0 outside
/// a [`Recycling`] poll).
fn take_spare(deadline: Instant) -> (Option<Armed>, u64) {
    with_spares(|spares| {
        let timers = &mut spares.timers;
        let at = timers
            .iter()
            .position(|t| t.as_ref().is_some_and(|t| t.sleep.deadline() <= deadline))
            .or_else(|| timers.iter().position(Option::is_some));
        let spare = at.and_then(|at| timers[at].take()).map(|mut armed| {
            if armed.sleep.deadline() > deadline {
                armed.rearm(deadline);
            }
            armed
        });
        (spare, spares.owner)
    })
    .unwrap_or((None, 0))
}

/// A dropped sleep's timer: kept as a spare when its connection is the one being polled
/// and has room, else dropped (taken out of the wheel).
fn give_back(owner: u64, armed: Armed) {
    if owner == 0 {
        return;
    }
    let left = with_spares(|spares| {
        if spares.owner != owner {
            return Some(armed);
        }
        match spares.timers.iter_mut().find(|t| t.is_none()) {
            Some(free) => free.replace(armed),
            None => Some(armed),
        }
    });
    // Dropped here, outside the thread-local's borrow (a closure not run is dropped with
    // its timer before `with_spares` returns, outside the borrow too).
    drop(left);
}

/// Where connection ids come from: one per [`Recycling`], never 0.
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

pin_project_lite::pin_project! {
    /// A connection's future, whose polls let its sleeps reuse each other's timers (see
    /// the module's documentation).
    pub struct Recycling<F> {
        #[pin]
        inner: F,
        // Its spares between polls; the thread-local's (the outer poll's, or none)
        // during one.
        spares: Spares,
    }
}

impl<F> Recycling<F> {
    /// Wraps `inner`.
    pub fn new(inner: F) -> Self {
        Self {
            inner,
            spares: Spares {
                owner: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
                ..Spares::NONE
            },
        }
    }
}

/// Swaps a connection's spares with the thread-local's for one poll, and back when
/// dropped, unwinding included: a poll nested in another leaves the outer one's as they
/// were.
struct Lent<'a>(&'a mut Spares);

impl<'a> Lent<'a> {
    fn new(home: &'a mut Spares) -> Self {
        // Not lent (the thread-local is gone): the poll runs as outside one.
        let _ = with_spares(|spares| std::mem::swap(spares, home));
        Self(home)
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        let _ = with_spares(|spares| std::mem::swap(spares, self.0));
    }
}

impl<F: Future> Future for Recycling<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _lent = Lent::new(this.spares);
        this.inner.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// Counts its wake-ups.
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn poll(sleep: Pin<&mut LazySleep>, waker: &Waker) -> Poll<()> {
        sleep.poll(&mut Context::from_waker(waker))
    }

    /// Lets the runtime's timer fire what is due at the paused clock.
    async fn settle() {
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }

    /// Goal: a deadline moved later, without a wheel operation, still holds: the sleep
    /// is not done when the first deadline passes (the armed timer wakes the task once,
    /// and re-arms), and is done at the new one.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_moved_later_completes_at_the_new_deadline_not_the_old() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let start = Instant::now();
        let mut sleep = std::pin::pin!(LazySleep::until(start + Duration::from_secs(10)));
        assert!(poll(sleep.as_mut(), &waker).is_pending());
        sleep.as_mut().reset(start + Duration::from_secs(25));
        // Polls before anything fired return at once, still pending.
        assert!(poll(sleep.as_mut(), &waker).is_pending());

        tokio::time::advance(Duration::from_secs(10)).await;
        settle().await;
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "the armed timer woke the task"
        );
        assert!(
            poll(sleep.as_mut(), &waker).is_pending(),
            "done before its deadline"
        );

        tokio::time::advance(Duration::from_secs(14)).await;
        settle().await;
        assert!(
            poll(sleep.as_mut(), &waker).is_pending(),
            "done a second early"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        settle().await;
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            2,
            "the re-armed timer woke it"
        );
        assert_eq!(poll(sleep.as_mut(), &waker), Poll::Ready(()));
        assert_eq!(Instant::now() - start, Duration::from_secs(25));
    }

    /// Goal: a deadline moved earlier takes effect at once: the task is woken at the
    /// earlier deadline, not at the one first armed.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_moved_earlier_wakes_the_task_at_the_earlier_deadline() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let start = Instant::now();
        let mut sleep = std::pin::pin!(LazySleep::until(start + Duration::from_secs(30)));
        assert!(poll(sleep.as_mut(), &waker).is_pending());
        sleep.as_mut().reset(start + Duration::from_secs(5));
        assert!(poll(sleep.as_mut(), &waker).is_pending());
        tokio::time::advance(Duration::from_secs(5)).await;
        settle().await;
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(poll(sleep.as_mut(), &waker), Poll::Ready(()));
    }

    /// Goal: polled by another task (another waker), the sleep registers that task's
    /// waker, so the task that polled last is the one woken.
    #[tokio::test(start_paused = true)]
    async fn the_waker_of_the_last_poll_is_the_one_woken() {
        let first = Arc::new(Count(AtomicUsize::new(0)));
        let second = Arc::new(Count(AtomicUsize::new(0)));
        let (first_waker, second_waker) = (
            Waker::from(Arc::clone(&first)),
            Waker::from(Arc::clone(&second)),
        );
        let mut sleep = std::pin::pin!(LazySleep::until(Instant::now() + Duration::from_secs(3)));
        assert!(poll(sleep.as_mut(), &first_waker).is_pending());
        assert!(poll(sleep.as_mut(), &second_waker).is_pending());
        tokio::time::advance(Duration::from_secs(3)).await;
        settle().await;
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
        assert_eq!(second.0.load(Ordering::SeqCst), 1);
        assert_eq!(poll(sleep.as_mut(), &second_waker), Poll::Ready(()));
    }

    /// Goal: hyper's `reset` reaches the lazy sleep through its downcast (a deadline
    /// moved later through the `Timer` holds), and the sleep stays done once done.
    #[tokio::test(start_paused = true)]
    async fn hypers_reset_moves_the_deadline_of_a_lazy_sleep() {
        use hyper::rt::Timer;
        let timer = LazyTimer;
        let start = timer.now();
        let mut sleep = timer.sleep(Duration::from_secs(2));
        timer.reset(&mut sleep, start + Duration::from_secs(6));
        let waited = tokio::time::timeout(Duration::from_secs(60), sleep.as_mut()).await;
        assert!(waited.is_ok());
        assert_eq!(timer.now() - start, Duration::from_secs(6));
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        assert_eq!(
            sleep.as_mut().poll(&mut Context::from_waker(&waker)),
            Poll::Ready(())
        );
    }

    /// The address of a sleep's tokio timer: the same address, the same timer.
    fn timer_of(sleep: &LazySleep) -> usize {
        sleep
            .armed
            .as_ref()
            .map_or(0, |armed| std::ptr::from_ref(&*armed.sleep) as usize)
    }

    /// Goal: inside a connection's poll, a sleep made after another was dropped runs on
    /// the dropped one's timer, and still completes at its own (later) deadline, not at
    /// the one the timer was armed at; outside a poll nothing is reused.
    /// Method: a paused clock; two sleeps one after the other in one `Recycling` future,
    /// their timers compared; the second awaited, the time it took checked.
    #[tokio::test(start_paused = true)]
    async fn a_sleep_reuses_a_dropped_sleeps_timer_and_keeps_its_own_deadline() {
        let start = Instant::now();
        Recycling::new(async move {
            let mut first = LazySleep::until(start + Duration::from_secs(10));
            assert!(futures_poll(&mut first).is_pending());
            let timer = timer_of(&first);
            drop(first);
            let second = LazySleep::until(start + Duration::from_secs(30));
            assert_eq!(timer_of(&second), timer, "the spare was taken");
            second.await;
            assert_eq!(Instant::now() - start, Duration::from_secs(30));
        })
        .await;
        let outside = LazySleep::until(start + Duration::from_secs(40));
        assert_eq!(outside.owner, 0);
        drop(outside);
        let left = with_spares(|s| (s.owner, s.timers.iter().flatten().count()));
        assert_eq!(left, Some((0, 0)), "no spares outside a poll");
    }

    /// Goal: a spare armed later than a new sleep's deadline is moved to it, so the new
    /// sleep completes at its own, earlier, deadline.
    /// Method: a paused clock; a 30 s sleep dropped, a 5 s sleep made and awaited.
    #[tokio::test(start_paused = true)]
    async fn a_spare_armed_later_is_moved_to_an_earlier_deadline() {
        let start = Instant::now();
        Recycling::new(async move {
            let mut long = LazySleep::until(start + Duration::from_secs(30));
            assert!(futures_poll(&mut long).is_pending());
            let timer = timer_of(&long);
            drop(long);
            let short = LazySleep::until(start + Duration::from_secs(5));
            assert_eq!(timer_of(&short), timer);
            short.await;
            assert_eq!(Instant::now() - start, Duration::from_secs(5));
        })
        .await;
    }

    /// Goal: a spare that fires while nobody holds it wakes its connection's task (once,
    /// for nothing), and a sleep that takes it afterwards still waits for its own
    /// deadline.
    /// Method: a paused clock and a counting waker; a 2 s sleep polled and dropped; the
    /// clock moved 3 s; a 10 s sleep taken from the spares, polled: pending until 13 s.
    #[tokio::test(start_paused = true)]
    async fn a_spare_that_fired_wakes_once_and_delays_nothing() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let start = Instant::now();
        let mut connection = Box::pin(Recycling::new(std::future::poll_fn({
            let mut step = 0;
            let mut held: Option<LazySleep> = None;
            move |cx| {
                step += 1;
                match step {
                    1 => {
                        let mut sleep = LazySleep::until(start + Duration::from_secs(2));
                        assert!(Pin::new(&mut sleep).poll(cx).is_pending());
                        drop(sleep);
                    }
                    2 => {
                        let mut sleep = LazySleep::until(Instant::now() + Duration::from_secs(10));
                        assert!(Pin::new(&mut sleep).poll(cx).is_pending());
                        held = Some(sleep);
                    }
                    _ => {
                        let sleep = held.as_mut().map(Pin::new);
                        return sleep.map_or(Poll::Ready(()), |sleep| sleep.poll(cx));
                    }
                }
                Poll::<()>::Pending
            }
        })));
        let mut poll = || connection.as_mut().poll(&mut Context::from_waker(&waker));
        assert!(poll().is_pending());
        tokio::time::advance(Duration::from_secs(3)).await;
        settle().await;
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "the spare woke the task");
        assert!(poll().is_pending(), "second sleep made");
        tokio::time::advance(Duration::from_secs(9)).await;
        settle().await;
        assert!(poll().is_pending(), "done before its deadline");
        tokio::time::advance(Duration::from_secs(1)).await;
        settle().await;
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert_eq!(poll(), Poll::Ready(()));
        assert_eq!(Instant::now() - start, Duration::from_secs(13));
    }

    /// Goal: a connection keeps at most `SPARE_TIMERS_MAX` spares, and never one from
    /// another connection: a sleep made in one connection's poll and dropped in
    /// another's is not kept by either.
    /// Method: three sleeps dropped in one poll, the spares counted; a sleep moved from
    /// one `Recycling` into another's poll and dropped there.
    #[tokio::test(start_paused = true)]
    async fn spares_are_bounded_and_never_cross_connections() {
        let at = Instant::now() + Duration::from_secs(5);
        let made: [LazySleep; 1] = Recycling::new(async move {
            let sleeps: Vec<LazySleep> = (0..=SPARE_TIMERS_MAX)
                .map(|_| LazySleep::until(at))
                .collect();
            drop(sleeps);
            let kept = with_spares(|s| s.timers.iter().flatten().count());
            assert_eq!(kept, Some(SPARE_TIMERS_MAX));
            // In an array: a sleep is itself a future, which an async block should not
            // yield bare.
            [LazySleep::until(at)]
        })
        .await;
        let [made] = made;
        assert_ne!(made.owner, 0);
        Recycling::new(async move {
            drop(made);
            let kept = with_spares(|s| s.timers.iter().flatten().count());
            assert_eq!(kept, Some(0), "another connection's timer is not kept");
        })
        .await;
    }

    /// Goal: a panic inside a poll leaves no spares on the thread for its next task.
    /// Method: poll a panicking `Recycling` future under `catch_unwind`.
    #[test]
    fn a_panicking_poll_leaves_no_spares_behind() {
        let mut connection = Box::pin(Recycling::new(async {
            panic!("in the poll");
        }));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = connection
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()));
        }));
        assert!(result.is_err());
        let left = with_spares(|s| (s.owner, s.timers.iter().flatten().count()));
        assert_eq!(left, Some((0, 0)));
    }

    /// One poll of `sleep` with the current task's waker.
    fn futures_poll(sleep: &mut LazySleep) -> Poll<()> {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(sleep).poll(&mut cx)
    }
}
