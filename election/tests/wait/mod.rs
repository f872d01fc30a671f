//! Waiting for a condition in the integration tests that run on tokio's clock (paused
//! time in most of them, so the waits cost no real time).

use std::time::Duration;

use tokio::time::Instant;

/// Polls `cond` every 10 ms of tokio time until it holds; panics after `within`.
pub async fn wait_until<T>(within: Duration, what: &str, mut cond: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = cond() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
