//! Backoff between attempts, and the server's `Retry-After`.

use std::time::Duration;

use http::HeaderMap;
use rand::Rng;

/// The delay before attempt `attempt + 1` (`attempt` counts from 1): exponential from
/// `initial`, capped at `max`, with jitter in its upper half so that clients that failed
/// together do not retry together.
pub(crate) fn backoff(attempt: u32, initial: Duration, max: Duration) -> Duration {
    let exponent = attempt.saturating_sub(1).min(20);
    let full = initial.saturating_mul(1 << exponent).min(max);
    let half = full / 2;
    half + full
        .saturating_sub(half)
        .mul_f64(rand::rng().random::<f64>())
}

/// `Retry-After: <seconds>`, capped at `max`. The HTTP-date form is ignored: the proxy
/// sends seconds.
pub(crate) fn retry_after(headers: &HeaderMap, max: Duration) -> Option<Duration> {
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

    #[test]
    fn backoff_grows_and_is_capped() {
        let initial = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        for _ in 0..50 {
            let first = backoff(1, initial, max);
            assert!(
                first >= Duration::from_millis(50) && first <= initial,
                "{first:?}"
            );
            let third = backoff(3, initial, max);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
            assert!(backoff(40, initial, max) <= max);
        }
    }

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
