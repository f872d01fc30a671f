//! Waiting for a condition with a deadline, never with a bare sleep; a timeout panics
//! naming what was awaited, as a failed test step should.

use std::time::{Duration, Instant};

/// How often conditions are polled.
pub const POLL: Duration = Duration::from_millis(20);

/// Polls `check` every [`POLL`] until it returns `Some`, or returns `None` after `timeout`.
pub async fn poll<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Like [`poll`], but panics naming `what` after `timeout`.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match poll(timeout, check).await {
        Some(v) => v,
        None => panic!("timed out after {timeout:?} waiting for {what}"),
    }
}
