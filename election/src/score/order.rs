//! The order of scores with an equivalence margin, and a node's rank.
//!
//! The order is total and antisymmetric on every pair: a known score comes before an
//! unknown one; scores more than `margin` apart are ordered by score (higher first);
//! scores within the margin, or two unknown ones, are ordered by id (lower first). With a
//! margin it is not transitive across a chain of close scores (ids 1, 2, 3 scoring 0, 0.4,
//! 0.8 with margin 0.5 form a cycle), so a rank is counted (how many nodes come before this
//! one), not read off a sorted list: one node can still be first only if it comes before
//! every other, and in a cycle nobody is, so the random part of the timeout decides.

/// One node as the ranking sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Contender {
    /// Its raft id.
    pub id: u64,
    /// Its score; `None` when unknown (not measured yet, or stale).
    pub score: Option<f64>,
    /// `(last_term, last_index)` of its log, compared as raft compares logs.
    pub log: (u64, u64),
}

/// Whether `a` comes before `b`: the better node of the two.
pub(crate) fn precedes(a: &Contender, b: &Contender, margin: f64) -> bool {
    match (a.score, b.score) {
        (Some(x), Some(y)) if (x - y).abs() > margin => x > y,
        (Some(_), None) => true,
        (None, Some(_)) => false,
        _ => a.id < b.id,
    }
}

/// Whether `a`'s score is above `b`'s by more than `margin` (an unknown score is below
/// every known one, and never above anything).
pub(crate) fn better_by_margin(a: Option<f64>, b: Option<f64>, margin: f64) -> bool {
    match (a, b) {
        (Some(x), Some(y)) => x - y > margin,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// `me`'s rank among `others` (0: first): how many of them are [`ahead`] of it. Entries
/// of `others` with `me`'s id are ignored.
pub(crate) fn rank(me: &Contender, others: &[Contender], margin: f64) -> usize {
    let newest = newest_log(me, others);
    others
        .iter()
        .filter(|x| x.id != me.id && ahead(x, me, newest, margin))
        .count()
}

/// The most recent `(last_term, last_index)` among `me` and `others`.
pub(crate) fn newest_log(me: &Contender, others: &[Contender]) -> (u64, u64) {
    others.iter().map(|c| c.log).fold(me.log, std::cmp::max)
}

/// Whether `x` ranks ahead of `me`, where `newest` is the most recent log among the
/// nodes ranked: a node whose log is behind `newest` comes after every up-to-date node,
/// whatever its score; within each of the two groups the order is [`precedes`].
pub(crate) fn ahead(x: &Contender, me: &Contender, newest: (u64, u64), margin: f64) -> bool {
    let (theirs, mine) = (x.log >= newest, me.log >= newest);
    (theirs && !mine) || (theirs == mine && precedes(x, me, margin))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: u64, score: Option<f64>) -> Contender {
        Contender {
            id,
            score,
            log: (1, 1),
        }
    }

    /// Goal: higher scores come first, scores within the margin tie and go to the lower
    /// id, and known scores beat unknown ones. Method: pairs on both sides of the margin.
    #[test]
    fn higher_score_first_and_ties_within_margin_go_to_lower_id() {
        let m = 0.5;
        assert!(precedes(&c(2, Some(10.0)), &c(1, Some(9.0)), m));
        assert!(!precedes(&c(1, Some(9.0)), &c(2, Some(10.0)), m));
        // Within the margin: the lower id, whichever score is higher.
        assert!(precedes(&c(1, Some(9.8)), &c(2, Some(10.0)), m));
        assert!(!precedes(&c(2, Some(10.0)), &c(1, Some(9.8)), m));
        // Exactly the margin apart still counts as equal.
        assert!(precedes(&c(1, Some(9.5)), &c(2, Some(10.0)), m));
        assert!(precedes(&c(3, Some(-1e9)), &c(1, None), m));
        assert!(!precedes(&c(1, None), &c(3, Some(-1e9)), m));
        assert!(precedes(&c(1, None), &c(3, None), m));
    }

    /// Goal: the order is antisymmetric and total on every pair, so at most one node has
    /// rank 0. Method: every pair of a grid of scores and ids, with a margin.
    #[test]
    fn exactly_one_of_each_pair_precedes() {
        let scores = [None, Some(0.0), Some(0.3), Some(0.6), Some(5.0), Some(-5.0)];
        for (i, a) in scores.iter().enumerate() {
            for (j, b) in scores.iter().enumerate() {
                if i == j {
                    continue;
                }
                let (x, y) = (c(i as u64 + 1, *a), c(j as u64 + 1, *b));
                assert_ne!(precedes(&x, &y, 0.5), precedes(&y, &x, 0.5), "{x:?} {y:?}");
            }
        }
    }

    /// Goal: "better by more than the margin" is strict and treats unknown as worst.
    /// Method: values at, above and below the margin.
    #[test]
    fn better_by_margin_is_strict() {
        assert!(better_by_margin(Some(10.6), Some(10.0), 0.5));
        assert!(!better_by_margin(Some(10.5), Some(10.0), 0.5));
        assert!(!better_by_margin(Some(10.0), Some(10.6), 0.5));
        assert!(better_by_margin(Some(0.0), None, 0.5));
        assert!(!better_by_margin(None, Some(0.0), 0.5));
        assert!(!better_by_margin(None, None, 0.5));
    }

    /// Goal: ranks follow the scores, and the best node has rank 0. Method: three nodes.
    #[test]
    fn ranks_follow_scores() {
        let all = [c(1, Some(10.0)), c(2, Some(30.0)), c(3, Some(20.0))];
        let ranks: Vec<usize> = all.iter().map(|me| rank(me, &all, 0.5)).collect();
        assert_eq!(ranks, vec![2, 0, 1]);
    }

    /// Goal: a node whose log is behind ranks after every up-to-date node, even with the
    /// best score, and among the behind nodes the scores still order. Method: node 2 has
    /// the best score and an older log; node 4 too with a lower score.
    #[test]
    fn behind_log_ranks_after_every_up_to_date_node() {
        let mut all = [
            c(1, Some(10.0)),
            c(2, Some(99.0)),
            c(3, Some(20.0)),
            c(4, Some(50.0)),
        ];
        all[1].log = (1, 0);
        all[3].log = (0, 5);
        let ranks: Vec<usize> = all.iter().map(|me| rank(me, &all, 0.5)).collect();
        assert_eq!(ranks, vec![1, 2, 0, 3]);
    }

    /// Goal: a cycle of close scores leaves nobody at rank 0 rather than two. Method: the
    /// module doc's example.
    #[test]
    fn a_cycle_of_close_scores_has_no_first() {
        let cyc = [c(1, Some(0.0)), c(2, Some(0.4)), c(3, Some(0.8))];
        let ranks: Vec<usize> = cyc.iter().map(|me| rank(me, &cyc, 0.5)).collect();
        assert_eq!(ranks, vec![1, 1, 1]);
    }
}
