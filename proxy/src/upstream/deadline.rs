//! The upstream timeout of an exchange: it is given up once the upstream has been quiet
//! for `limits.upstream_timeout_ms`, counted from the request body's last progress.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use palisade_server::LazySleep;
use tokio::time::Instant;

pin_project_lite::pin_project! {
    /// `send`, given up once `late` says the upstream is late: `None` then.
    ///
    /// `late` gives the moment the upstream is late, or `None` while the request body
    /// waits for its client (whose own idle timeout applies then), in which case it is
    /// asked again `recheck` later. It is asked at every wake-up, and the timer set to
    /// its answer, so a deadline that moved later (the body made progress) is followed.
    /// When the timer is due it is asked once more, and only a deadline still past ends
    /// the exchange: the body, sent from another task, may have moved it in between.
    ///
    /// A future of its own rather than an `async` block: the exchange's future is held
    /// once, where it was made, with the timer beside it (an `async` block that awaits a
    /// future it was given keeps it twice).
    pub(super) struct Deadlined<F, D> {
        #[pin]
        send: F,
        // A lazy sleep: its polls while the exchange waits do not call into tokio's
        // timer, and moving it later is free.
        #[pin]
        timer: LazySleep,
        late: D,
        recheck: Duration,
    }
}

impl<F, D> Deadlined<F, D>
where
    F: Future,
    D: Fn() -> Option<Instant>,
{
    pub(super) fn new(send: F, late: D, recheck: Duration) -> Self {
        let first = late().unwrap_or_else(|| Instant::now() + recheck);
        Self {
            send,
            timer: LazySleep::until(first),
            late,
            recheck,
        }
    }
}

impl<F, D> Future for Deadlined<F, D>
where
    F: Future,
    D: Fn() -> Option<Instant>,
{
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // The exchange first, always: an answer that is there wins over a timer that
        // fired in the same wake-up.
        if let Poll::Ready(output) = this.send.poll(cx) {
            return Poll::Ready(Some(output));
        }
        loop {
            let deadline = (this.late)();
            let wake = deadline.unwrap_or_else(|| Instant::now() + *this.recheck);
            this.timer.as_mut().reset(wake);
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The timer fired: late only if the deadline, asked again, has passed.
            let now = Instant::now();
            if (this.late)().is_some_and(|d| d <= now) {
                return Poll::Ready(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    const TIMEOUT: Duration = Duration::from_secs(30);

    /// A deadline the test moves: `None` while "the body waits for its client".
    fn shared_deadline(
        at: Option<Instant>,
    ) -> (Arc<Mutex<Option<Instant>>>, impl Fn() -> Option<Instant>) {
        let cell = Arc::new(Mutex::new(at));
        let read = Arc::clone(&cell);
        (cell, move || *read.lock().unwrap())
    }

    /// Goal: an upstream that never answers is given up at its deadline, not before.
    /// Method: a paused clock; an exchange that never ends; the time just before the
    /// deadline, then the deadline.
    #[tokio::test(start_paused = true)]
    async fn a_silent_upstream_is_given_up_at_its_deadline() {
        let start = Instant::now();
        let wait = Deadlined::new(
            std::future::pending::<()>(),
            move || Some(start + TIMEOUT),
            TIMEOUT,
        );
        tokio::pin!(wait);
        let early = tokio::time::timeout(Duration::from_millis(29_999), wait.as_mut()).await;
        assert!(early.is_err(), "given up before its deadline");
        assert_eq!(wait.await, None);
        assert_eq!(Instant::now(), start + TIMEOUT);
    }

    /// Goal: an answer ends the wait with it, even when the deadline passed in the same
    /// wake-up; and a deadline moved later (the body's progress) is followed.
    /// Method: a paused clock; the deadline moved 20 s later at 25 s; the answer at 40 s
    /// (past the first deadline, before the moved one); then an answer that is ready
    /// when the deadline is already past.
    #[tokio::test(start_paused = true)]
    async fn progress_moves_the_deadline_and_an_answer_wins() {
        let start = Instant::now();
        let (deadline, late) = shared_deadline(Some(start + TIMEOUT));
        let answer = tokio::time::sleep(Duration::from_secs(40));
        let wait = Deadlined::new(answer, late, TIMEOUT);
        tokio::pin!(wait);
        assert!(
            tokio::time::timeout(Duration::from_secs(25), wait.as_mut())
                .await
                .is_err()
        );
        *deadline.lock().unwrap() = Some(start + Duration::from_secs(50));
        assert_eq!(wait.await, Some(()));
        assert_eq!(Instant::now(), start + Duration::from_secs(40));

        // A deadline that is due already.
        let due = Instant::now();
        let past = Deadlined::new(std::future::ready(7), move || Some(due), TIMEOUT);
        assert_eq!(past.await, Some(7));
    }

    /// Goal: a deadline found past is asked again before the exchange is given up, so
    /// progress made in between (the body is sent from another task) keeps it going.
    /// Method: a paused clock; `late` says "now" at its first two calls (as the future is
    /// made, and at its first poll), then 10 s on: the wait ends at 10 s, not at once.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_found_past_is_asked_again_before_giving_up() {
        let start = Instant::now();
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let late = move || {
            let call = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Some(if call < 2 {
                start
            } else {
                start + Duration::from_secs(10)
            })
        };
        let wait = Deadlined::new(std::future::pending::<()>(), late, TIMEOUT);
        assert_eq!(wait.await, None);
        assert_eq!(Instant::now(), start + Duration::from_secs(10));
    }

    /// Goal: while the body waits for its client (no deadline), the upstream is not
    /// late however long that lasts; once the body moves on, the deadline holds again.
    /// Method: a paused clock; no deadline for 100 s (past three timeouts); then a
    /// deadline 10 s on.
    #[tokio::test(start_paused = true)]
    async fn a_body_waiting_for_its_client_is_not_timed_out_by_the_upstream() {
        let start = Instant::now();
        let (deadline, late) = shared_deadline(None);
        let wait = Deadlined::new(std::future::pending::<()>(), late, TIMEOUT);
        tokio::pin!(wait);
        let quiet = tokio::time::timeout(Duration::from_secs(100), wait.as_mut()).await;
        assert!(
            quiet.is_err(),
            "timed out while the body waited for its client"
        );
        *deadline.lock().unwrap() = Some(start + Duration::from_secs(110));
        assert_eq!(wait.await, None);
        // Seen at the next look (a timeout after the last), not at once: 120 s.
        let ended = Instant::now() - start;
        assert!(
            ended >= Duration::from_secs(110) && ended <= Duration::from_secs(130),
            "{ended:?}"
        );
    }
}
