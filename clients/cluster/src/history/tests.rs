//! Unit tests of the history checker.

use super::*;

fn op(writer: &str, seq: u64, token: u64, outcome: Outcome) -> Op {
    Op {
        scope: "default".to_owned(),
        token,
        writer: writer.to_owned(),
        seq,
        outcome,
    }
}

fn applied(writer: &str, seq: u64, token: u64) -> Applied {
    Applied {
        scope: "default".to_owned(),
        token,
        writer: writer.to_owned(),
        seq,
    }
}

fn kinds(report: &Report) -> Vec<&'static str> {
    report
        .violations
        .iter()
        .map(|v| match v {
            Violation::TokenDecreased { .. } => "decreased",
            Violation::AppliedAfterHigher { .. } => "after-higher",
            Violation::AckedNotApplied { .. } => "acked-not-applied",
            Violation::AppliedTwice { .. } => "twice",
            Violation::AppliedDiffers { .. } => "differs",
            Violation::RefusedButApplied { .. } => "refused-applied",
            Violation::Unrecorded { .. } => "unrecorded",
            Violation::DuplicateOp { .. } => "duplicate-op",
        })
        .collect()
}

/// A failover done right: token 1 writes, one rejected stale write, token 2 writes,
/// an indeterminate write that landed and one that did not.
fn clean() -> History {
    History {
        ops: vec![
            op("a", 1, 1, Outcome::Ok),
            op("a", 2, 1, Outcome::Ok),
            op("a", 3, 1, Outcome::Rejected),
            op("b", 1, 2, Outcome::Ok),
            op("b", 2, 2, Outcome::Indeterminate),
            op("b", 3, 2, Outcome::Indeterminate),
            op("a", 4, 1, Outcome::Failed),
        ],
        applied: vec![
            applied("a", 1, 1),
            applied("a", 2, 1),
            applied("b", 1, 2),
            applied("b", 2, 2),
        ],
    }
}

/// Goal: a correct history passes, with equal tokens, indeterminate writes either way,
/// and counts. Method: check the clean history.
#[test]
fn a_correct_failover_history_holds() {
    let report = check(&clean());
    assert!(report.holds(), "{report}");
    assert_eq!(report.ops(), 7);
    assert_eq!(report.count(Outcome::Rejected), 1);
    assert_eq!(report.count(Outcome::Indeterminate), 2);
    assert_eq!(report.applied, 4);
    assert_eq!(report.per_token[&("default".to_owned(), 2)], 2);
    assert!(report.summary().ends_with(": 0 violations"));
}

/// Goal: checks 1 and 2 catch a stale write that landed after the new leader's, and
/// name both writes. Method: move a token-1 write after a token-2 one.
#[test]
fn a_lower_token_after_a_higher_one_is_caught_by_checks_1_and_2() {
    let mut h = clean();
    h.ops.push(op("a", 9, 1, Outcome::Ok));
    h.applied.push(applied("a", 9, 1));
    let report = check(&h);
    assert_eq!(kinds(&report), ["decreased", "after-higher"], "{report}");
    let text = report.violations[1].to_string();
    assert!(
        text.contains("a#9 (token 1)") && text.contains("b#"),
        "{text}"
    );
}

/// Goal: check 2 names every late write against the highest earlier one, where check 1
/// sees only the first step down. Method: tokens 5, 3, 4.
#[test]
fn every_write_under_a_higher_token_is_named_by_check_2() {
    let h = History {
        ops: vec![
            op("a", 1, 5, Outcome::Ok),
            op("b", 1, 3, Outcome::Ok),
            op("b", 2, 4, Outcome::Ok),
        ],
        applied: vec![applied("a", 1, 5), applied("b", 1, 3), applied("b", 2, 4)],
    };
    let report = check(&h);
    assert_eq!(
        kinds(&report),
        ["decreased", "after-higher", "after-higher"],
        "{report}"
    );
    for v in &report.violations[1..] {
        let Violation::AppliedAfterHigher { higher, .. } = v else {
            panic!("{v}");
        };
        assert_eq!(higher.write.token, 5);
    }
}

/// Goal: scopes are independent: a lower token in another scope is fine. Method: two
/// scopes, each increasing, interleaved so the global sequence goes down.
#[test]
fn scopes_are_checked_separately() {
    let mut x = applied("x", 1, 7);
    x.scope = "other".to_owned();
    let mut ox = op("x", 1, 7, Outcome::Ok);
    ox.scope = "other".to_owned();
    let h = History {
        ops: vec![op("a", 1, 2, Outcome::Ok), ox],
        applied: vec![x, applied("a", 1, 2)],
    };
    assert!(check(&h).holds());
}

/// Goal: check 3 catches an acknowledged write that is missing. Method: drop one from
/// the apply log.
#[test]
fn a_lost_acknowledged_write_is_caught_by_check_3() {
    let mut h = clean();
    h.applied.remove(1);
    let report = check(&h);
    assert_eq!(kinds(&report), ["acked-not-applied"], "{report}");
    assert!(report.violations[0].to_string().contains("a#2"));
}

/// Goal: check 3 catches a write applied twice, acknowledged or not. Method: repeat an
/// acknowledged and an indeterminate write.
#[test]
fn a_write_applied_twice_is_caught_by_check_3() {
    let mut h = clean();
    h.applied.push(applied("b", 1, 2));
    h.applied.push(applied("b", 2, 2));
    let report = check(&h);
    assert_eq!(kinds(&report), ["twice", "twice"], "{report}");
}

/// Goal: check 3 catches a write applied with another token than it was sent with.
#[test]
fn a_write_applied_with_another_token_is_caught_by_check_3() {
    let mut h = clean();
    h.applied[3].token = 3;
    let report = check(&h);
    assert_eq!(kinds(&report), ["differs"], "{report}");
}

/// Goal: check 4 catches a rejected write, and a failed one, that were applied.
/// Method: apply the rejected a#3 and the failed a#4 (token 1, before token 2).
#[test]
fn rejected_and_failed_writes_that_were_applied_are_caught_by_check_4() {
    let mut h = clean();
    h.applied.insert(2, applied("a", 3, 1));
    h.applied.insert(3, applied("a", 4, 1));
    let report = check(&h);
    assert_eq!(
        kinds(&report),
        ["refused-applied", "refused-applied"],
        "{report}"
    );
    assert!(
        report.violations[0]
            .to_string()
            .starts_with("rejected write a#3")
    );
    assert!(
        report.violations[1]
            .to_string()
            .starts_with("failed write a#4")
    );
}

/// Goal: check 5 catches a write no client attempted, and duplicate operation names
/// are reported. Method: add an unknown application and a second a#1.
#[test]
fn unrecorded_writes_and_duplicate_names_are_caught() {
    let mut h = clean();
    h.applied.push(applied("ghost", 1, 2));
    h.ops.push(op("a", 1, 1, Outcome::Ok));
    let report = check(&h);
    assert_eq!(kinds(&report), ["duplicate-op", "unrecorded"], "{report}");
}

/// Goal: the recorder keeps unanswered writes indeterminate. Method: invoke two,
/// complete one.
#[test]
fn the_recorder_leaves_unanswered_writes_indeterminate() {
    let mut r = Recorder::default();
    r.invoke("default", 3, "w1", 1);
    r.invoke("default", 3, "w1", 2);
    assert!(r.complete("w1", 1, Outcome::Ok));
    assert!(!r.complete("w1", 9, Outcome::Ok));
    assert_eq!(r.count(Outcome::Ok), 1);
    assert_eq!(
        r.get("w1", 2).map(|o| o.outcome),
        Some(Outcome::Indeterminate)
    );
    assert_eq!(r.ops().len(), 2);
}
