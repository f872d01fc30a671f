//! The demo's verdict: checks the ledger as the store applied it against what the
//! workers were told.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// One ledger entry as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub key: String,
    pub token: u64,
    /// Store-wide apply order.
    pub revision: u64,
}

/// What the demo observed around the pause.
#[derive(Debug, Default)]
pub(crate) struct Observed {
    /// Keys whose write a worker saw accepted, with the token it used.
    pub acknowledged: BTreeMap<String, u64>,
    /// Keys whose write a worker saw rejected with 409, with the token it used.
    pub rejected: BTreeMap<String, u64>,
    /// The paused leader's token.
    pub old_token: u64,
    /// The first token above it that an established leader claimed.
    pub new_token: Option<u64>,
}

/// The outcome of every check; the verdict holds when `violations` is empty.
#[derive(Debug)]
pub(crate) struct Verdict {
    pub violations: Vec<String>,
    /// Ledger entries per token.
    pub per_token: BTreeMap<u64, usize>,
    /// Whether the paused leader's stale write was rejected.
    pub stale_write_rejected: bool,
}

impl Verdict {
    pub(crate) fn holds(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Checks, on the ledger in apply order:
/// 1. tokens never decrease;
/// 2. no write with the paused leader's token landed after the first write with a higher one;
/// 3. every acknowledged write is in the ledger with its token;
/// 4. no rejected write is in the ledger;
/// 5. the paused leader's stale write was attempted and rejected (what the demo shows).
pub(crate) fn check(ledger: &[Entry], observed: &Observed) -> Verdict {
    let mut ledger = ledger.to_vec();
    ledger.sort_by_key(|e| e.revision);
    let mut violations = Vec::new();

    for pair in ledger.windows(2) {
        if pair[1].token < pair[0].token {
            violations.push(format!(
                "token went down: {} (token {}, revision {}) applied after {} (token {}, revision {})",
                pair[1].key, pair[1].token, pair[1].revision, pair[0].key, pair[0].token, pair[0].revision
            ));
        }
    }

    if let Some(first_new) = ledger.iter().find(|e| e.token > observed.old_token) {
        for late in ledger
            .iter()
            .filter(|e| e.token <= observed.old_token && e.revision > first_new.revision)
        {
            violations.push(format!(
                "write {} with old token {} landed at revision {}, after token {} at revision {}",
                late.key, late.token, late.revision, first_new.token, first_new.revision
            ));
        }
    }

    let stored: BTreeMap<&str, &Entry> = ledger.iter().map(|e| (e.key.as_str(), e)).collect();
    for (key, token) in &observed.acknowledged {
        match stored.get(key.as_str()) {
            Some(e) if e.token == *token => {}
            Some(e) => violations.push(format!(
                "acknowledged write {key} with token {token} is stored with token {}",
                e.token
            )),
            None => violations.push(format!(
                "acknowledged write {key} (token {token}) is missing"
            )),
        }
    }
    for (key, token) in &observed.rejected {
        if stored.contains_key(key.as_str()) {
            violations.push(format!(
                "rejected write {key} (token {token}) is in the ledger"
            ));
        }
    }

    let stale_write_rejected = observed
        .rejected
        .values()
        .any(|&t| t == observed.old_token && observed.new_token.is_some_and(|n| n > t));
    if !stale_write_rejected {
        violations.push(format!(
            "no write with the paused leader's token {} was seen rejected",
            observed.old_token
        ));
    }

    let mut per_token = BTreeMap::new();
    for e in &ledger {
        *per_token.entry(e.token).or_insert(0) += 1;
    }
    Verdict {
        violations,
        per_token,
        stale_write_rejected,
    }
}

/// One line per token: `token 2: 14 writes`.
pub(crate) fn per_token_lines(
    per_token: &BTreeMap<u64, usize>,
    writers: &BTreeMap<u64, BTreeSet<String>>,
) -> String {
    let mut out = String::new();
    for (token, count) in per_token {
        let who = writers
            .get(token)
            .map(|w| w.iter().cloned().collect::<Vec<_>>().join(", "))
            .unwrap_or_default();
        let _ = writeln!(out, "    token {token:>3}: {count:>4} writes  ({who})");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, token: u64, revision: u64) -> Entry {
        Entry {
            key: key.to_owned(),
            token,
            revision,
        }
    }

    fn observed(acked: &[(&str, u64)], rejected: &[(&str, u64)]) -> Observed {
        Observed {
            acknowledged: acked.iter().map(|(k, t)| ((*k).to_owned(), *t)).collect(),
            rejected: rejected
                .iter()
                .map(|(k, t)| ((*k).to_owned(), *t))
                .collect(),
            old_token: 2,
            new_token: Some(3),
        }
    }

    #[test]
    fn a_clean_failover_holds() {
        let ledger = [entry("a", 2, 1), entry("b", 2, 2), entry("c", 3, 3)];
        let v = check(
            &ledger,
            &observed(&[("a", 2), ("b", 2), ("c", 3)], &[("d", 2)]),
        );
        assert!(v.holds(), "{:?}", v.violations);
        assert_eq!(v.per_token, BTreeMap::from([(2, 2), (3, 1)]));
    }

    #[test]
    fn a_stale_write_after_the_new_token_is_caught() {
        let ledger = [entry("a", 2, 1), entry("c", 3, 2), entry("d", 2, 3)];
        let v = check(
            &ledger,
            &observed(&[("a", 2), ("c", 3), ("d", 2)], &[("x", 2)]),
        );
        assert!(!v.holds());
        assert!(v.violations.iter().any(|m| m.contains("token went down")));
        assert!(
            v.violations
                .iter()
                .any(|m| m.contains("landed at revision 3"))
        );
    }

    #[test]
    fn lost_and_rejected_but_applied_writes_are_caught() {
        let ledger = [entry("a", 2, 1), entry("d", 3, 2)];
        let v = check(
            &ledger,
            &observed(&[("a", 2), ("b", 2)], &[("d", 2), ("x", 2)]),
        );
        assert!(
            v.violations
                .iter()
                .any(|m| m.contains("b (token 2) is missing"))
        );
        assert!(v.violations.iter().any(|m| m.contains("rejected write d")));
    }

    #[test]
    fn no_rejection_seen_means_the_demo_did_not_show_fencing() {
        let ledger = [entry("a", 2, 1), entry("c", 3, 2)];
        let v = check(&ledger, &observed(&[("a", 2), ("c", 3)], &[]));
        assert!(!v.stale_write_rejected);
        assert!(!v.holds());
    }
}
