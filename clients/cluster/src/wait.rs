//! Waiting for a condition with a deadline, never with a bare sleep: the one wait helper
//! of the workspace, for this library, `palisade demo` and every test.
//!
//! The deadline is measured on tokio's clock, so under paused time (`start_paused`) a
//! wait costs no real time and still ends after `timeout` of virtual time.

use std::time::Duration;

use tokio::time::Instant;

/// How often conditions are polled.
pub const POLL: Duration = Duration::from_millis(20);

/// Polls `check` every [`POLL`] until it returns `Some`, and returns that value, or
/// `None` once `timeout` has passed. `check` runs at least once, even with a zero timeout.
///
/// A synchronous condition is written `|| std::future::ready(condition())`. A test that
/// must not go on without the value says what it waited for:
/// `poll(timeout, check).await.expect("a leader")`.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a condition that turns true is returned, and one that never does ends the
    /// wait once its deadline of tokio time has passed, not later.
    /// Method: paused time; a counter that holds on its third poll; then a condition that
    /// never holds, with the virtual time that passed measured.
    #[tokio::test(start_paused = true)]
    async fn returns_the_value_or_none_after_the_deadline_of_tokio_time() {
        let mut polls = 0;
        let got = poll(Duration::from_secs(1), || {
            polls += 1;
            std::future::ready((polls == 3).then_some(polls))
        })
        .await;
        assert_eq!(got, Some(3));

        let start = Instant::now();
        let never = poll(Duration::from_secs(5), || std::future::ready(None::<()>)).await;
        let waited = start.elapsed();
        assert_eq!(never, None);
        assert!(
            (Duration::from_secs(5)..Duration::from_secs(5) + POLL * 2).contains(&waited),
            "{waited:?}"
        );
    }
}
