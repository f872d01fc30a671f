//! Tests of the fence register: raises, resets, limits, durability across reopen, and
//! which calls touch the disk.

use super::*;
use crate::open_database;
use palisade_cluster::wait;
use std::future::ready;
use std::sync::mpsc;
use std::time::Duration;

/// How long a test waits for an advance that must not block.
const NOT_BLOCKED_TIMEOUT_MS: u64 = 10_000;
/// How long a test watches an advance that must block, to show that it does.
const BLOCKED_WATCH_MS: u64 = 200;

fn register(dir: &tempfile::TempDir, scopes_max: usize) -> FenceRegister {
    register_on(dir, scopes_max).1
}

/// A register in `dir` and its database, for a test to hold redb's only write transaction.
fn register_on(dir: &tempfile::TempDir, scopes_max: usize) -> (Arc<redb::Database>, FenceRegister) {
    let db = open_database(&dir.path().join("fences.redb")).unwrap();
    let fences = FenceRegister::open(Arc::clone(&db), scopes_max).unwrap();
    (db, fences)
}

/// A register in `dir` with `orders` at 10, and redb's only write transaction, held: any
/// call that writes blocks until it is dropped.
fn orders_at_10_with_the_writer_held(
    dir: &tempfile::TempDir,
) -> (FenceRegister, redb::WriteTransaction) {
    let (db, fences) = register_on(dir, SCOPES_MAX_DEFAULT);
    fences.advance("orders", 10).unwrap();
    let writer = db.begin_write().unwrap();
    (fences, writer)
}

/// Presents each `(scope, token)` in order and asserts the outcome given beside it.
fn advances(fences: &FenceRegister, steps: &[(&str, u64, Advance)]) {
    for (i, &(scope, token, expected)) in steps.iter().enumerate() {
        let outcome = fences.advance(scope, token).unwrap();
        assert_eq!(outcome, expected, "step {i}: {token} to {scope}");
    }
}

/// The next `n` answers on `rx`, each within [`NOT_BLOCKED_TIMEOUT_MS`].
fn answers<T>(rx: &mpsc::Receiver<T>, n: usize) -> Vec<T> {
    (0..n)
        .map(|_| {
            rx.recv_timeout(Duration::from_millis(NOT_BLOCKED_TIMEOUT_MS))
                .unwrap()
        })
        .collect()
}

/// Waits (polling, on a runtime of the calling test) until `condition` holds, for at most
/// [`NOT_BLOCKED_TIMEOUT_MS`].
async fn until(what: &str, condition: impl Fn() -> bool) {
    wait::poll(Duration::from_millis(NOT_BLOCKED_TIMEOUT_MS), || {
        ready(condition().then_some(()))
    })
    .await
    .unwrap_or_else(|| panic!("timed out waiting for {what}"));
}

/// Goal: higher raises, equal is unchanged, lower is stale and reports the fence.
/// Method: present 5, 5, 3, 9, 9, 1 to one scope and check each outcome and `current`.
#[test]
fn higher_raises_equal_is_unchanged_lower_is_stale() {
    let dir = tempfile::tempdir().unwrap();
    let fences = register(&dir, SCOPES_MAX_DEFAULT);
    assert_eq!(fences.current("orders"), 0);
    advances(&fences, &[("orders", 5, Advance::Raised { previous: 0 })]);
    assert_eq!(fences.current("orders"), 5);
    advances(
        &fences,
        &[
            ("orders", 5, Advance::Unchanged),
            ("orders", 3, Advance::Stale { current: 5 }),
        ],
    );
    assert_eq!(fences.current("orders"), 5);
    advances(
        &fences,
        &[
            ("orders", 9, Advance::Raised { previous: 5 }),
            ("orders", 9, Advance::Unchanged),
            ("orders", 1, Advance::Stale { current: 9 }),
        ],
    );
    assert_eq!(fences.current("orders"), 9);
}

/// Goal: scopes are independent. Method: raise one scope, check another is untouched.
#[test]
fn scopes_are_independent() {
    let dir = tempfile::tempdir().unwrap();
    let fences = register(&dir, SCOPES_MAX_DEFAULT);
    fences.advance("a", 7).unwrap();
    assert_eq!(fences.current("b"), 0);
    advances(&fences, &[("b", 2, Advance::Raised { previous: 0 })]);
    assert_eq!(fences.current("a"), 7);
    assert_eq!(fences.current("b"), 2);
}

/// Goal: token 0 on an unseen scope is "equal" and creates nothing.
/// Method: advance a new scope to 0, check the outcome and that `list` stays empty.
#[test]
fn token_zero_on_new_scope_is_unchanged_and_adds_no_scope() {
    let dir = tempfile::tempdir().unwrap();
    let fences = register(&dir, 1);
    assert_eq!(fences.advance("new", 0).unwrap(), Advance::Unchanged);
    assert!(fences.list().is_empty());
    // The one allowed scope is still free.
    advances(&fences, &[("other", 1, Advance::Raised { previous: 0 })]);
}

/// Goal: a raised fence is on disk, not only in memory.
/// Method: raise two scopes, drop every handle, reopen the file, read the fences.
#[test]
fn fence_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let fences = register(&dir, SCOPES_MAX_DEFAULT);
        fences.advance("orders", 41).unwrap();
        fences.advance("orders", 42).unwrap();
        fences.advance("users", 3).unwrap();
        advances(&fences, &[("users", 2, Advance::Stale { current: 3 })]);
    }
    let fences = register(&dir, SCOPES_MAX_DEFAULT);
    assert_eq!(fences.current("orders"), 42);
    assert_eq!(fences.current("users"), 3);
    // The reopened fence is the last raise.
    advances(
        &fences,
        &[
            ("orders", 42, Advance::Unchanged),
            ("orders", 43, Advance::Raised { previous: 42 }),
        ],
    );
}

/// Goal: new scopes beyond `scopes_max` are refused, while existing scopes keep
/// working, also after a reopen. Method: limit 2, add two scopes, try a third.
#[test]
fn new_scope_over_limit_is_refused_and_existing_scopes_still_rise() {
    let dir = tempfile::tempdir().unwrap();
    {
        let fences = register(&dir, 2);
        fences.advance("a", 1).unwrap();
        fences.advance("b", 1).unwrap();
        let err = fences.advance("c", 1).unwrap_err();
        assert!(
            matches!(err, AdvanceError::ScopeLimit { ref scope, scopes_max: 2 } if scope == "c"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "scope limit reached: 2 scopes exist, cannot add c"
        );
        assert_eq!(fences.current("c"), 0);
        advances(&fences, &[("a", 2, Advance::Raised { previous: 1 })]);
    }
    // Scopes loaded from disk count against the limit.
    let fences = register(&dir, 2);
    assert!(matches!(
        fences.advance("c", 1),
        Err(AdvanceError::ScopeLimit { .. })
    ));
    assert_eq!(
        fences.list(),
        vec![("a".to_owned(), 2), ("b".to_owned(), 1)]
    );
}

/// Goal: reserved scopes are always available: at the limit they can still be created,
/// they take no slot (before or after a reopen), and other scopes still count.
/// Method: limit 2 with `default` and `billing` reserved; fill the limit with two other
/// scopes, then raise both reserved ones; reopen and check that a third other scope is
/// still refused while a reserved one still rises.
#[test]
fn reserved_scopes_are_always_available_and_not_counted() {
    let dir = tempfile::tempdir().unwrap();
    let reserved = || ["default", "billing"].map(String::from);
    let open = |dir: &tempfile::TempDir| {
        let db = open_database(&dir.path().join("fences.redb")).unwrap();
        FenceRegister::open_reserved(db, 2, reserved()).unwrap()
    };
    {
        let fences = open(&dir);
        fences.advance("a", 1).unwrap();
        fences.advance("b", 1).unwrap();
        assert!(matches!(
            fences.advance("c", 1),
            Err(AdvanceError::ScopeLimit { scopes_max: 2, .. })
        ));
        advances(&fences, &[("default", 3, Advance::Raised { previous: 0 })]);
        assert_eq!(fences.reset("billing", 4).unwrap(), 0);
        assert!(matches!(
            fences.advance("c", 1),
            Err(AdvanceError::ScopeLimit { .. })
        ));
    }
    let fences = open(&dir);
    assert!(matches!(
        fences.advance("c", 1),
        Err(AdvanceError::ScopeLimit { .. })
    ));
    advances(&fences, &[("billing", 5, Advance::Raised { previous: 4 })]);
    assert_eq!(fences.list().len(), 4);
    // Opened without the reservation, the same four scopes all count: the reservation
    // is what kept `default` and `billing` out of the count.
    drop(fences);
    let plain = register(&dir, 4);
    assert!(matches!(
        plain.advance("c", 1),
        Err(AdvanceError::ScopeLimit { scopes_max: 4, .. })
    ));
}

/// Goal: `list` returns every raised scope, sorted by scope.
/// Method: raise scopes out of order, compare with the sorted expectation.
#[test]
fn list_is_sorted_by_scope() {
    let dir = tempfile::tempdir().unwrap();
    let fences = register(&dir, SCOPES_MAX_DEFAULT);
    for (scope, token) in [("m", 3), ("z", 1), ("a", 9), ("k", 4)] {
        fences.advance(scope, token).unwrap();
    }
    assert_eq!(
        fences.list(),
        vec![
            ("a".to_owned(), 9),
            ("k".to_owned(), 4),
            ("m".to_owned(), 3),
            ("z".to_owned(), 1),
        ]
    );
}

/// Goal: equal and lower tokens and reads never touch redb, while a raise does.
/// Method: hold redb's only write transaction open, so any advance that writes must
/// block. Equal, lower and `current` must finish anyway; a raise must not finish until
/// the transaction is dropped (this half shows the method can detect disk access).
#[test]
fn equal_and_lower_tokens_do_no_disk_io() {
    let dir = tempfile::tempdir().unwrap();
    let (fences, writer) = orders_at_10_with_the_writer_held(&dir);
    let (done_tx, done_rx) = mpsc::channel();
    let probe = fences.clone();
    let memory_only = std::thread::spawn(move || {
        let outcomes = (
            probe.advance("orders", 10).unwrap(),
            probe.advance("orders", 4).unwrap(),
            probe.current("orders"),
        );
        done_tx.send(outcomes).unwrap();
    });
    let outcomes = done_rx
        .recv_timeout(Duration::from_millis(NOT_BLOCKED_TIMEOUT_MS))
        .expect("equal/lower advance blocked on the redb writer: it touched the disk");
    assert_eq!(
        outcomes,
        (Advance::Unchanged, Advance::Stale { current: 10 }, 10)
    );
    memory_only.join().unwrap();

    let (raised_tx, raised_rx) = mpsc::channel();
    let probe = fences.clone();
    let raising = std::thread::spawn(move || {
        raised_tx
            .send(probe.advance("orders", 11).unwrap())
            .unwrap();
    });
    assert!(
        raised_rx
            .recv_timeout(Duration::from_millis(BLOCKED_WATCH_MS))
            .is_err(),
        "a raise finished while redb's writer was held: it did not write"
    );
    // Until the raise is durable, readers still see the old fence.
    assert_eq!(fences.current("orders"), 10);
    drop(writer);
    assert_eq!(
        raised_rx
            .recv_timeout(Duration::from_millis(NOT_BLOCKED_TIMEOUT_MS))
            .unwrap(),
        Advance::Raised { previous: 10 }
    );
    raising.join().unwrap();
    assert_eq!(fences.current("orders"), 11);
}

/// Goal: concurrent raises of one scope each see a consistent previous fence and the
/// result is the maximum. Method: several threads raise the same scope with
/// interleaved tokens; every `Raised { previous }` must be below its token, and the
/// final fence must be the highest token.
#[test]
fn concurrent_raises_of_one_scope_end_at_the_maximum() {
    const THREADS: u64 = 4;
    const TOKENS_PER_THREAD: u64 = 8;
    let dir = tempfile::tempdir().unwrap();
    let fences = register(&dir, SCOPES_MAX_DEFAULT);
    std::thread::scope(|threads| {
        for thread in 0..THREADS {
            let fences = &fences;
            threads.spawn(move || {
                for step in 0..TOKENS_PER_THREAD {
                    let token = step * THREADS + thread + 1;
                    match fences.advance("shared", token).unwrap() {
                        Advance::Raised { previous } => assert!(previous < token),
                        Advance::Stale { current } => assert!(current > token),
                        Advance::Unchanged => panic!("tokens are distinct"),
                    }
                }
            });
        }
    });
    assert_eq!(fences.current("shared"), THREADS * TOKENS_PER_THREAD);
}

/// Goal: a register opened on a file without the fence table starts empty and creates
/// the table on the first raise. Method: a bare `redb::Database`, not `open_database`.
#[test]
fn open_without_fence_table_starts_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bare.redb");
    let db = Arc::new(redb::Database::create(&path).unwrap());
    let fences = FenceRegister::open(db, SCOPES_MAX_DEFAULT).unwrap();
    assert!(fences.list().is_empty());
    advances(&fences, &[("s", 1, Advance::Raised { previous: 0 })]);
}

/// Goal: a reset lowers a fence durably: after a reopen the fence is the reset value, and
/// from there the register behaves as for any fence (a raise is needed to go back up, a
/// token below the reset value is stale).
/// Method: raise to 100 (as a forged token would), reset to 5, reopen the file, present
/// 5, 4 and 6.
#[test]
fn reset_lowers_the_fence_durably_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let fences = register(&dir, SCOPES_MAX_DEFAULT);
        fences.advance("orders", 100).unwrap();
        fences.advance("users", 3).unwrap();
        assert_eq!(fences.reset("orders", 5).unwrap(), 100);
        assert_eq!(fences.current("orders"), 5);
        assert_eq!(fences.advance("orders", 5).unwrap(), Advance::Unchanged);
    }
    let fences = register(&dir, SCOPES_MAX_DEFAULT);
    assert_eq!(fences.current("orders"), 5, "the reset is on disk");
    assert_eq!(fences.current("users"), 3, "other scopes are untouched");
    advances(
        &fences,
        &[
            ("orders", 4, Advance::Stale { current: 5 }),
            ("orders", 6, Advance::Raised { previous: 5 }),
        ],
    );
}

/// Goal: a reset may also raise, may set 0, and a reset of an unseen scope to 0 neither
/// writes nor uses up a scope slot, while one to a real value counts against the limit.
/// Method: a register limited to one scope; reset an unseen scope to 0, another to 7, a
/// third to 1 (over the limit), then the second to 0 and reopen.
#[test]
fn reset_to_any_value_and_the_scope_limit() {
    let dir = tempfile::tempdir().unwrap();
    {
        let fences = register(&dir, 1);
        assert_eq!(fences.reset("ghost", 0).unwrap(), 0);
        assert!(fences.list().is_empty());
        assert_eq!(fences.reset("a", 7).unwrap(), 0);
        assert_eq!(fences.current("a"), 7);
        assert!(matches!(
            fences.reset("b", 1),
            Err(AdvanceError::ScopeLimit { scopes_max: 1, .. })
        ));
        assert_eq!(fences.reset("a", 7).unwrap(), 7, "same value: a no-op");
        assert_eq!(fences.reset("a", 0).unwrap(), 7);
        assert!(fences.list().is_empty(), "a fence of 0 is not listed");
    }
    let fences = register(&dir, 1);
    assert_eq!(fences.current("a"), 0);
    advances(&fences, &[("a", 1, Advance::Raised { previous: 0 })]);
}

/// Goal: a reset writes to disk (it is not a memory-only change that a restart undoes).
/// Method: hold redb's only write transaction open; a reset must not finish until it is
/// dropped, and until then readers see the old fence.
#[test]
fn reset_waits_for_the_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (fences, writer) = orders_at_10_with_the_writer_held(&dir);
    let (done_tx, done_rx) = mpsc::channel();
    let probe = fences.clone();
    let resetting = std::thread::spawn(move || {
        done_tx.send(probe.reset("orders", 2).unwrap()).unwrap();
    });
    assert!(
        done_rx
            .recv_timeout(Duration::from_millis(BLOCKED_WATCH_MS))
            .is_err(),
        "a reset finished while redb's writer was held: it did not write"
    );
    assert_eq!(fences.current("orders"), 10);
    drop(writer);
    assert_eq!(
        done_rx
            .recv_timeout(Duration::from_millis(NOT_BLOCKED_TIMEOUT_MS))
            .unwrap(),
        10
    );
    resetting.join().unwrap();
    assert_eq!(fences.current("orders"), 2);
}

/// Goal: concurrent raises share one commit (group commit), and each caller still
/// returns only after the commit that carried its raise. Method: hold redb's only write
/// transaction so the first raise's commit blocks; queue raises of four other scopes and
/// one more of the first scope behind it; release: the four scopes and the second raise
/// of the first scope land in one further commit, so five raises take two commits, and
/// every caller saw its own raise (or the higher one of its scope) when it returned.
#[tokio::test]
async fn concurrent_raises_share_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (db, fences) = register_on(&dir, SCOPES_MAX_DEFAULT);
    assert_eq!(fences.commits(), 0);

    let writer = db.begin_write().unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let mut threads = Vec::new();
    // The first raise becomes the committer and blocks in redb; wait until it has taken
    // its batch (the queue is empty again) before queuing the others behind it.
    let spawn = |scope: &'static str, token: u64| {
        let probe = fences.clone();
        let done_tx = done_tx.clone();
        std::thread::spawn(move || {
            let outcome = probe.advance(scope, token).unwrap();
            // What the caller can see the moment it is answered.
            done_tx
                .send((scope, token, outcome, probe.current(scope)))
                .unwrap();
        })
    };
    threads.push(spawn("a", 1));
    until("the first raise to commit its batch", || {
        fences.queued() == 0 && fences.shared.queue.lock().unwrap().committing
    })
    .await;
    for scope in ["b", "c", "d", "e"] {
        threads.push(spawn(scope, 5));
    }
    threads.push(spawn("a", 2));
    until("five raises queued", || fences.queued() == 5).await;
    assert!(
        done_rx
            .recv_timeout(Duration::from_millis(BLOCKED_WATCH_MS))
            .is_err(),
        "a raise was answered while redb's writer was held"
    );
    drop(writer);
    let answers = answers(&done_rx, 6);
    for thread in threads {
        thread.join().unwrap();
    }
    for &(scope, token, _, seen) in &answers {
        assert!(
            seen >= token,
            "scope {scope}: raise {token} answered while the fence read {seen}"
        );
    }
    let mut outcomes: Vec<_> = answers
        .into_iter()
        .map(|(scope, token, outcome, _)| (scope, token, outcome))
        .collect();
    outcomes.sort_by_key(|&(scope, token, _)| (scope, token));
    assert_eq!(
        outcomes,
        vec![
            ("a", 1, Advance::Raised { previous: 0 }),
            ("a", 2, Advance::Raised { previous: 1 }),
            ("b", 5, Advance::Raised { previous: 0 }),
            ("c", 5, Advance::Raised { previous: 0 }),
            ("d", 5, Advance::Raised { previous: 0 }),
            ("e", 5, Advance::Raised { previous: 0 }),
        ]
    );
    assert_eq!(
        fences.commits(),
        2,
        "five raises behind one commit take one more"
    );
}

/// Goal: within one batch a scope takes its highest token; lower raises of that scope
/// are answered stale with the new fence, an equal second caller unchanged.
/// Method: hold redb's writer behind a first raise, queue 3, 7, 7 and 5 for one scope,
/// release, and check each answer and the single extra commit.
#[tokio::test]
async fn a_batch_raises_each_scope_to_its_highest_token() {
    let dir = tempfile::tempdir().unwrap();
    let (db, fences) = register_on(&dir, SCOPES_MAX_DEFAULT);
    let writer = db.begin_write().unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let spawn = |token: u64| {
        let probe = fences.clone();
        let done_tx = done_tx.clone();
        std::thread::spawn(move || {
            done_tx
                .send((token, probe.advance("s", token).unwrap()))
                .unwrap();
        })
    };
    let mut threads = vec![spawn(1)];
    until("the first raise to commit its batch", || {
        fences.queued() == 0 && fences.shared.queue.lock().unwrap().committing
    })
    .await;
    for token in [3, 7, 7, 5] {
        threads.push(spawn(token));
    }
    until("four raises queued", || fences.queued() == 4).await;
    drop(writer);
    let mut answers = answers(&done_rx, 5);
    for thread in threads {
        thread.join().unwrap();
    }
    answers.sort_by_key(|&(token, outcome)| (token, outcome == Advance::Unchanged));
    assert_eq!(
        answers,
        vec![
            (1, Advance::Raised { previous: 0 }),
            (3, Advance::Stale { current: 7 }),
            (5, Advance::Stale { current: 7 }),
            (7, Advance::Raised { previous: 1 }),
            (7, Advance::Unchanged),
        ]
    );
    assert_eq!(fences.current("s"), 7);
    assert_eq!(fences.commits(), 2);
}
