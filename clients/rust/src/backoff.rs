//! The one backoff policy of Palisade's Rust code, built on [`backon`]: the client's
//! retries, the launcher's waits and reconnects, and the election node's announce loop
//! all use it, so that they all back off the same way.
//!
//! ```
//! use std::time::Duration;
//! use palisade_client::backoff;
//!
//! // Iterate the delays by hand (a loop that decides itself when to stop)...
//! let mut delays = backoff::delays(Duration::from_millis(50), Duration::from_secs(1));
//! let first = delays.next().unwrap();
//! assert!(first >= Duration::from_millis(50) && first < Duration::from_millis(100));
//!
//! // ...or hand the builder to backon's `Retryable` with a limit on attempts.
//! let three_retries = backoff::exponential(Duration::from_millis(50), Duration::from_secs(1))
//!     .with_max_times(3);
//! # let _ = three_retries;
//! ```

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use http::HeaderMap;

/// Exponential backoff with jitter and no limit on attempts: the `n`-th delay is
/// `d + jitter` where `d = min * 2^(n-1)`, capped at `max`, and `jitter` is uniform in
/// `[0, d)`, so that clients that failed together do not retry together. Every delay
/// therefore lies in `[min, 2 * max)`.
///
/// Callers that give up after some attempts add `.with_max_times(n)`; loops that never
/// give up (reconnecting to a node, announcing a token) use it as is.
pub fn exponential(min: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max.max(min))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
}

/// The delays of [`exponential`], as an endless iterator: for loops that sleep
/// themselves between attempts (`tokio::time::sleep(delays.next()...)`).
pub fn delays(min: Duration, max: Duration) -> impl Iterator<Item = Duration> + Send {
    exponential(min, max).build()
}

/// `Retry-After: <seconds>`, capped at `max`. The HTTP-date form is ignored: Palisade's
/// proxy and nodes send seconds.
pub fn retry_after(headers: &HeaderMap, max: Duration) -> Option<Duration> {
    let seconds: u64 = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds).min(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: delays start at `min`, double, stop growing at `max`, and stay within the
    /// documented bounds despite the jitter; the builder never runs out.
    /// Method: draw many sequences and check every delay against its window.
    #[test]
    fn delays_grow_and_are_capped() {
        let min = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        for _ in 0..50 {
            let got: Vec<Duration> = delays(min, max).take(40).collect();
            assert_eq!(got.len(), 40, "the policy has no limit on attempts");
            assert!(got[0] >= min && got[0] < 2 * min, "{:?}", got[0]);
            assert!(
                got[2] >= Duration::from_millis(400) && got[2] < Duration::from_millis(800),
                "{:?}",
                got[2]
            );
            for d in &got {
                assert!(*d >= min && *d < 2 * max, "{d:?}");
            }
            assert!(got[39] >= max, "{:?}", got[39]);
        }
    }

    /// Goal: a limit added by the caller is honoured. Method: count the delays.
    #[test]
    fn callers_can_limit_attempts() {
        let limited = exponential(Duration::from_millis(1), Duration::from_millis(2))
            .with_max_times(3)
            .build();
        assert_eq!(limited.count(), 3);
    }

    /// Goal: `Retry-After` seconds are read and capped; absence is `None`.
    /// Method: header maps with no, small and huge values.
    #[test]
    fn retry_after_is_read_and_capped() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers, Duration::from_secs(5)), None);
        headers.insert(http::header::RETRY_AFTER, "1".parse().unwrap());
        assert_eq!(
            retry_after(&headers, Duration::from_secs(5)),
            Some(Duration::from_secs(1))
        );
        headers.insert(http::header::RETRY_AFTER, "3600".parse().unwrap());
        assert_eq!(
            retry_after(&headers, Duration::from_secs(5)),
            Some(Duration::from_secs(5))
        );
    }
}
