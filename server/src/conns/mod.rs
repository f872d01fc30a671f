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
//! - At `connections_max`, a new connection closes a keep-alive connection that has been
//!   idle the longest or, when none is left, the fresh connection admitted the longest
//!   ago, as nginx reuses its idle connections. A connection with a request in flight is
//!   never chosen. When every
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
//!
//! The control plane reads each request's body before counting the request in flight
//! (`body`, [`read_body`]): a connection still sending its body is idle to this table,
//! so it can be evicted, and it is answered 408 and closed at the request timeout.
//!
//! The files: `slot` (one connection's state and what its task does next), `table`
//! ([`Connections`]: admission, eviction, shutdown, drain), `admitted` ([`Admitted`]: the
//! handshake, serving and parking of one connection), `requests` (request counting),
//! `body` (the control plane's request deadline).

mod admitted;
mod body;
mod requests;
mod slot;
mod table;

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use admitted::Admitted;
pub use body::{BodyRefused, CONTROL_BODY_BYTES_MAX, CONTROL_REQUEST_TIMEOUT_MS, read_body};
pub use requests::{InFlight, RequestTracker, TrackedBody};
pub use table::Connections;

/// How often a waiting [`Connections::admit`] looks for an idle connection even without
/// being told one freed up: a safety net for a wake-up that raced with its registration.
pub const ADMISSION_RECHECK_MS: u64 = 100;

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
    /// A control-plane request whose body did not arrive within the request timeout
    /// (answered 408, then closed).
    RequestTimeout,
}

impl CloseReason {
    /// The metric label: `header-timeout`, `keepalive-timeout`, `evicted-idle`,
    /// `write-timeout`, `request-timeout`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HeaderTimeout => "header-timeout",
            Self::KeepaliveTimeout => "keepalive-timeout",
            Self::EvictedIdle => "evicted-idle",
            Self::WriteTimeout => "write-timeout",
            Self::RequestTimeout => "request-timeout",
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};

    use super::table::evict_oldest_idle;
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

    /// Goal: at the limit, a keep-alive connection idle the longest is closed first, then
    /// the fresh connection admitted the longest ago; a busy one never is; when all are
    /// busy there is no room.
    /// Method: paused clock; admit three, one second apart; make the oldest busy and let
    /// the newest serve a request (a keep-alive connection, idle since later than the
    /// fresh `second`); admit more and see who is evicted.
    #[tokio::test(start_paused = true)]
    async fn eviction_closes_keepalive_then_fresh_connections_and_never_a_busy_one() {
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
            third.is_evicted(),
            "third has served a request: a keep-alive connection goes first"
        );
        assert!(
            !oldest.is_evicted() && !second.is_evicted(),
            "oldest is busy; second is fresh"
        );
        let fifth = conns.try_admit().unwrap();
        assert!(
            second.is_evicted(),
            "next: second, fresh since 1 s, before fourth (fresh since 4 s)"
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

    /// Goal: shutdown reaches every connection through its own slot: one waiting when it
    /// comes, one admitted after it (told at once), and an eviction that came first is
    /// still reported as the eviction.
    /// Method: paused clock; park a served connection, shut down: the park stops with
    /// `ShuttingDown`. Admit another after the shutdown: its park stops at once, and so
    /// does its handshake. With a limit of 1, park a served connection, admit a second
    /// (evicting the first), then shut down: the first park reports `Evicted`.
    #[tokio::test(start_paused = true)]
    async fn shutdown_reaches_waiting_and_later_connections_and_keeps_an_eviction() {
        let conns = table(4);
        let waiting = conns.try_admit().unwrap();
        drop(waiting.requests().enter());
        let park = waiting.park(std::future::pending::<()>());
        tokio::pin!(park);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), park.as_mut())
                .await
                .is_err(),
            "the park ended before the shutdown"
        );
        conns.shutdown();
        let parked = tokio::time::timeout(Duration::from_secs(1), park)
            .await
            .unwrap();
        assert_eq!(parked, Err(Stopped::ShuttingDown));

        let later = conns.try_admit().unwrap();
        let handshake = tokio::time::timeout(
            Duration::from_secs(1),
            later.handshake(std::future::pending::<()>()),
        )
        .await
        .unwrap();
        assert!(matches!(handshake, Err(Stopped::ShuttingDown)));
        let parked = tokio::time::timeout(
            Duration::from_secs(1),
            later.park(std::future::pending::<()>()),
        )
        .await
        .unwrap();
        assert_eq!(parked, Err(Stopped::ShuttingDown));

        let conns = table(1);
        let evicted = conns.try_admit().unwrap();
        drop(evicted.requests().enter());
        tokio::time::advance(Duration::from_secs(1)).await;
        let _newer = conns.try_admit().unwrap();
        conns.shutdown();
        let parked = tokio::time::timeout(
            Duration::from_secs(1),
            evicted.park(std::future::pending::<()>()),
        )
        .await
        .unwrap();
        assert_eq!(parked, Err(Stopped::Evicted));
    }
}
