//! When the leader hands over: a follower must have been better than the leader by more
//! than the margin, fresh and caught up, without a break, for longer than the hold time.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// What the leader knows of one follower at one check.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Follower {
    /// Its raft id.
    pub id: u64,
    /// Its fresh score (`None`: unknown or stale).
    pub score: Option<f64>,
    /// Whether its log matches the leader's last index.
    pub caught_up: bool,
}

/// The leader's record of how long each follower has been better.
#[derive(Debug, Default)]
pub(crate) struct ResignTracker {
    /// Follower id -> since when it has been better without a break.
    since: BTreeMap<u64, Instant>,
}

impl ResignTracker {
    /// Forgets every follower (this node is not, or no longer, the leader, or it just
    /// started a transfer: the hold starts afresh).
    pub(crate) fn clear(&mut self) {
        self.since.clear();
    }

    /// One check at `now` with the leader's score `own`: returns the follower to hand
    /// over to, if any has been better for longer than `hold` (the best of those, by the
    /// order of [`super::order::precedes`]). A follower that is not better at this check
    /// starts over.
    pub(crate) fn check(
        &mut self,
        now: Instant,
        own: Option<f64>,
        followers: &[Follower],
        margin: f64,
        hold: Duration,
    ) -> Option<u64> {
        let better: Vec<&Follower> = followers
            .iter()
            .filter(|f| f.caught_up && super::order::better_by_margin(f.score, own, margin))
            .collect();
        self.since
            .retain(|id, _| better.iter().any(|f| f.id == *id));
        for f in &better {
            self.since.entry(f.id).or_insert(now);
        }
        better
            .into_iter()
            .filter(|f| {
                self.since
                    .get(&f.id)
                    .is_some_and(|t| now.saturating_duration_since(*t) > hold)
            })
            .map(|f| super::order::Contender {
                id: f.id,
                score: f.score,
                log: (0, 0),
            })
            .reduce(|a, b| {
                if super::order::precedes(&a, &b, margin) {
                    a
                } else {
                    b
                }
            })
            .map(|c| c.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(id: u64, score: f64) -> Follower {
        Follower {
            id,
            score: Some(score),
            caught_up: true,
        }
    }

    /// Goal: a follower better by more than the margin is chosen only after the hold, not
    /// before. Method: checks at 0, just under and just over the hold.
    #[test]
    fn hands_over_only_after_the_hold() {
        let (t0, hold) = (Instant::now(), Duration::from_secs(1));
        let mut r = ResignTracker::default();
        let fs = [f(2, 20.0), f(3, 5.0)];
        assert_eq!(r.check(t0, Some(10.0), &fs, 0.5, hold), None);
        let under = t0 + Duration::from_millis(999);
        assert_eq!(r.check(under, Some(10.0), &fs, 0.5, hold), None);
        let over = t0 + Duration::from_millis(1_001);
        assert_eq!(r.check(over, Some(10.0), &fs, 0.5, hold), Some(2));
    }

    /// Goal: scores moving within the margin never hand over, and one check below the
    /// margin restarts the hold. Method: a follower alternating between just inside and
    /// far above the margin, then staying inside it for many holds.
    #[test]
    fn flapping_within_the_margin_never_hands_over() {
        let (t0, hold) = (Instant::now(), Duration::from_secs(1));
        let mut r = ResignTracker::default();
        for step in 0..100u64 {
            let now = t0 + Duration::from_millis(step * 300);
            let score = if step % 3 == 2 { 10.4 } else { 12.0 };
            assert_eq!(r.check(now, Some(10.0), &[f(2, score)], 0.5, hold), None);
        }
        let mut r = ResignTracker::default();
        for step in 0..100u64 {
            let now = t0 + Duration::from_millis(step * 300);
            let score = if step % 2 == 0 { 10.5 } else { 9.6 };
            assert_eq!(r.check(now, Some(10.0), &[f(2, score)], 0.5, hold), None);
        }
    }

    /// Goal: a follower that is not caught up, or whose score is unknown, is never chosen,
    /// and among several the best one is. Method: one check each after the hold.
    #[test]
    fn only_caught_up_followers_with_known_scores_qualify() {
        let (t0, hold) = (Instant::now(), Duration::from_millis(10));
        let later = t0 + Duration::from_millis(11);
        let behind = Follower {
            caught_up: false,
            ..f(2, 50.0)
        };
        let unknown = Follower {
            score: None,
            ..f(3, 0.0)
        };
        let mut r = ResignTracker::default();
        for now in [t0, later] {
            assert_eq!(r.check(now, Some(1.0), &[behind, unknown], 0.5, hold), None);
        }
        let mut r = ResignTracker::default();
        let fs = [f(2, 20.0), f(3, 30.0), f(4, 29.8)];
        assert_eq!(r.check(t0, Some(1.0), &fs, 0.5, hold), None);
        assert_eq!(r.check(later, Some(1.0), &fs, 0.5, hold), Some(3));
    }
}
