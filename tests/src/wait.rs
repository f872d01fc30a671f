//! Waiting for a condition with a deadline, never with a bare sleep; a timeout panics
//! naming what was awaited, as a failed test step should.

use std::time::Duration;

pub use palisade_cluster::wait::{POLL, poll};

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
