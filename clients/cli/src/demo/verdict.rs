//! The demo's verdict: the ledger as the store applied it, against what the workers were
//! told, through the history checker of `palisade-cluster` (the one the fault tests use),
//! plus the demo's own requirement that the paused writer's stale write (the leader's, or
//! with `--sessions` the scope holder's) was seen rejected.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use palisade_cluster::history::{self, Applied, History, Op, Outcome, Recorder, Report};
use palisade_cluster::worker::LEDGER_PREFIX;

/// One ledger entry as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub key: String,
    pub token: u64,
    /// Store-wide apply order.
    pub revision: u64,
}

impl Entry {
    /// The entry as an applied write in `scope`: writer and sequence number from the key
    /// (`ledger/<writer>-<seq>`). A key of another shape keeps its whole text as the
    /// writer, so the checker reports it as a write no worker attempted.
    fn applied(&self, scope: &str) -> Applied {
        let name = self.key.strip_prefix(LEDGER_PREFIX).unwrap_or(&self.key);
        let (writer, seq) = name
            .rsplit_once('-')
            .and_then(|(w, s)| Some((w, s.parse().ok()?)))
            .unwrap_or((self.key.as_str(), 0));
        Applied {
            scope: scope.to_owned(),
            token: self.token,
            writer: writer.to_owned(),
            seq,
        }
    }
}

/// What the demo observed around the pause.
#[derive(Debug)]
pub(crate) struct Observed {
    /// Every write a worker attempted, with the outcome it reported.
    pub recorder: Recorder,
    /// The scope every worker writes in: the cluster's, or with `--sessions` the named
    /// scope the sessions hold. The workers' events do not say it; the demo knows it.
    pub scope: String,
    /// Who was paused, as the verdict names it: `leader`, or `holder` with `--sessions`.
    pub paused: &'static str,
    /// The paused writer's token.
    pub old_token: u64,
    /// The first token above it that the next leader (or holder) was given.
    pub new_token: Option<u64>,
}

impl Observed {
    /// Nothing observed yet, of workers writing in `scope`, one of which, `paused`, will be.
    pub(crate) fn new(scope: &str, paused: &'static str) -> Self {
        Self {
            recorder: Recorder::default(),
            scope: scope.to_owned(),
            paused,
            old_token: 0,
            new_token: None,
        }
    }
}

/// The outcome of every check; the verdict holds when `violations` is empty.
#[derive(Debug)]
pub(crate) struct Verdict {
    pub violations: Vec<String>,
    /// Ledger entries per token.
    pub per_token: BTreeMap<u64, usize>,
    /// Whether the paused leader's stale write was rejected.
    pub stale_write_rejected: bool,
    /// The history checker's report.
    pub report: Report,
}

impl Verdict {
    pub(crate) fn holds(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Checks the ledger in apply order with the history checker (tokens never decrease; no
/// write with a lower token landed after a higher one; every acknowledged write is stored
/// with its token; no rejected write is), then that the paused leader's stale write was
/// attempted and rejected (what the demo shows). Every write is judged in
/// `observed.scope`.
///
/// The store keeps one entry per key and each job writes its own key, so a write applied
/// twice would not show here; the fault tests, on a recording upstream, see that too.
pub(crate) fn check(ledger: &[Entry], observed: &Observed) -> Verdict {
    let mut ledger = ledger.to_vec();
    ledger.sort_by_key(|e| e.revision);
    let history = History {
        ops: observed
            .recorder
            .ops()
            .into_iter()
            .map(|op| Op {
                scope: observed.scope.clone(),
                ..op
            })
            .collect(),
        applied: ledger.iter().map(|e| e.applied(&observed.scope)).collect(),
    };
    let report = history::check(&history);
    let mut violations: Vec<String> = report.violations.iter().map(ToString::to_string).collect();

    let stale_write_rejected = history.ops.iter().any(|op| {
        op.outcome == Outcome::Rejected
            && op.token == observed.old_token
            && observed.new_token.is_some_and(|n| n > op.token)
    });
    if !stale_write_rejected {
        violations.push(format!(
            "no write with the paused {}'s token {} was seen rejected",
            observed.paused, observed.old_token
        ));
    }

    let per_token = report
        .per_token
        .iter()
        .map(|((_, token), count)| (*token, *count))
        .collect();
    Verdict {
        violations,
        per_token,
        stale_write_rejected,
        report,
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
    use palisade_cluster::worker::WORKER_SCOPE;

    /// A ledger entry for writer `w`, job `seq`.
    fn entry(w: &str, seq: u64, token: u64, revision: u64) -> Entry {
        Entry {
            key: format!("{LEDGER_PREFIX}{w}-{seq:06}"),
            token,
            revision,
        }
    }

    fn op(w: &str, seq: u64, token: u64, outcome: Outcome) -> Op {
        Op {
            scope: WORKER_SCOPE.to_owned(),
            token,
            writer: w.to_owned(),
            seq,
            outcome,
        }
    }

    /// Old token 2 (worker w1), new token 3 (worker w2).
    fn observed(ops: &[Op]) -> Observed {
        let mut recorder = Recorder::default();
        for op in ops {
            recorder.record(op.clone());
        }
        Observed {
            recorder,
            old_token: 2,
            new_token: Some(3),
            ..Observed::new(WORKER_SCOPE, "leader")
        }
    }

    /// Goal: a failover where the stale write was rejected passes the verdict.
    /// Method: a clean history and ledger, checked.
    #[test]
    fn a_clean_failover_holds() {
        let ledger = [
            entry("w1", 1, 2, 1),
            entry("w1", 2, 2, 2),
            entry("w2", 1, 3, 3),
        ];
        let v = check(
            &ledger,
            &observed(&[
                op("w1", 1, 2, Outcome::Ok),
                op("w1", 2, 2, Outcome::Ok),
                op("w2", 1, 3, Outcome::Ok),
                op("w1", 3, 2, Outcome::Rejected),
            ]),
        );
        assert!(v.holds(), "{:?}", v.violations);
        assert_eq!(v.per_token, BTreeMap::from([(2, 2), (3, 1)]));
        assert_eq!(v.report.ops(), 4);
    }

    /// Goal: a stale write that landed after the new token's is a violation.
    /// Method: a ledger with token 2 after token 3, checked.
    #[test]
    fn a_stale_write_after_the_new_token_is_caught() {
        let ledger = [
            entry("w1", 1, 2, 1),
            entry("w2", 1, 3, 2),
            entry("w1", 2, 2, 3),
        ];
        let v = check(
            &ledger,
            &observed(&[
                op("w1", 1, 2, Outcome::Ok),
                op("w2", 1, 3, Outcome::Ok),
                op("w1", 2, 2, Outcome::Ok),
                op("w1", 3, 2, Outcome::Rejected),
            ]),
        );
        assert!(!v.holds());
        assert!(
            v.violations
                .iter()
                .any(|m| m.starts_with("applied token went down")),
            "{:?}",
            v.violations
        );
        assert!(
            v.violations
                .iter()
                .any(|m| m.starts_with("lower token landed after a higher one")
                    && m.contains("w1#2 (token 2) applied at position 2")),
            "{:?}",
            v.violations
        );
    }

    /// Goal: an acknowledged write missing from the ledger, and a rejected one present in
    /// it, are both violations. Method: such a history and ledger, checked.
    #[test]
    fn lost_and_rejected_but_applied_writes_are_caught() {
        let ledger = [entry("w1", 1, 2, 1), entry("w1", 3, 2, 2)];
        let v = check(
            &ledger,
            &observed(&[
                op("w1", 1, 2, Outcome::Ok),
                op("w1", 2, 2, Outcome::Ok),
                op("w1", 3, 2, Outcome::Rejected),
            ]),
        );
        assert!(
            v.violations
                .iter()
                .any(|m| m.contains("acknowledged write w1#2") && m.contains("never applied")),
            "{:?}",
            v.violations
        );
        assert!(
            v.violations
                .iter()
                .any(|m| m.starts_with("rejected write w1#3")),
            "{:?}",
            v.violations
        );
    }

    /// Goal: a run in which no stale write was rejected does not pass: it showed nothing.
    /// Method: a history without a rejection, checked.
    #[test]
    fn no_rejection_seen_means_the_demo_did_not_show_fencing() {
        let ledger = [entry("w1", 1, 2, 1), entry("w2", 1, 3, 2)];
        let v = check(
            &ledger,
            &observed(&[op("w1", 1, 2, Outcome::Ok), op("w2", 1, 3, Outcome::Ok)]),
        );
        assert!(!v.stale_write_rejected);
        assert!(!v.holds());
    }

    /// Goal: a `--sessions` run is judged in its named scope (the workers' events do not
    /// name it), and a run without the stale rejection names the paused holder.
    /// Method: a late stale write and no rejection, checked with scope `ledger`.
    #[test]
    fn a_sessions_run_is_judged_in_its_named_scope() {
        let ledger = [
            entry("w1", 1, 2, 1),
            entry("w2", 1, 3, 2),
            entry("w1", 2, 2, 3),
        ];
        let v = check(
            &ledger,
            &Observed {
                scope: "ledger".to_owned(),
                paused: "holder",
                ..observed(&[
                    op("w1", 1, 2, Outcome::Ok),
                    op("w2", 1, 3, Outcome::Ok),
                    op("w1", 2, 2, Outcome::Ok),
                ])
            },
        );
        assert!(
            v.violations
                .iter()
                .any(|m| m.starts_with("lower token landed after a higher one in scope ledger")),
            "{:?}",
            v.violations
        );
        assert!(
            !v.violations.iter().any(|m| m.contains("scope default")),
            "{:?}",
            v.violations
        );
        assert!(
            v.violations
                .iter()
                .any(|m| m == "no write with the paused holder's token 2 was seen rejected"),
            "{:?}",
            v.violations
        );
    }

    /// Goal: ledger keys are read back into writer and job number.
    /// Method: parse one key.
    #[test]
    fn keys_name_their_writer_and_job() {
        let a = entry("w12", 7, 4, 1).applied(WORKER_SCOPE);
        assert_eq!((a.writer.as_str(), a.seq, a.token), ("w12", 7, 4));
        let odd = Entry {
            key: "elsewhere".to_owned(),
            token: 1,
            revision: 1,
        }
        .applied(WORKER_SCOPE);
        assert_eq!((odd.writer.as_str(), odd.seq), ("elsewhere", 0));
    }
}
