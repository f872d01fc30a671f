//! The fence register against a model: for any interleaving of advances and reads from
//! several threads, the register behaves like a map from scope to the maximum token
//! advanced so far, readers never see it go down or run ahead of the advances, and the
//! disk holds what memory held.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use palisade_storage::{Advance, FenceRegister, SCOPES_MAX_DEFAULT, open_database};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// Few scopes, so that threads collide on the same scope often.
const SCOPES: [&str; 3] = ["alpha", "beta", "gamma"];
/// Small tokens, so that equal and stale tokens are common, not only raises.
const TOKEN_MAX: u64 = 24;
/// Threads per case; each runs its own generated op list.
const THREADS_MAX: usize = 4;
/// Ops per thread.
const OPS_PER_THREAD_MAX: usize = 24;
/// Every raise fsyncs, so the case count stays small.
const CASES: u32 = 32;

#[derive(Debug, Clone, Copy)]
enum Op {
    Advance { scope: usize, token: u64 },
    Read { scope: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..SCOPES.len(), 0..=TOKEN_MAX).prop_map(|(scope, token)| Op::Advance { scope, token }),
        (0..SCOPES.len()).prop_map(|scope| Op::Read { scope }),
    ]
}

fn threads() -> impl Strategy<Value = Vec<Vec<Op>>> {
    prop::collection::vec(
        prop::collection::vec(op(), 0..=OPS_PER_THREAD_MAX),
        1..=THREADS_MAX,
    )
}

/// The model: each scope's fence is the maximum token ever advanced (0 if none).
fn model(threads: &[Vec<Op>]) -> BTreeMap<&'static str, u64> {
    let mut fences: BTreeMap<&'static str, u64> = SCOPES.iter().map(|&scope| (scope, 0)).collect();
    for op in threads.iter().flatten() {
        if let Op::Advance { scope, token } = *op {
            let fence = fences.entry(SCOPES[scope]).or_default();
            *fence = (*fence).max(token);
        }
    }
    fences
}

/// Runs one thread's ops, checking what it observes as it goes.
/// `attempted[s]` is raised before each advance of scope `s`, so it bounds every fence
/// a reader may legally see.
fn run_thread(fences: &FenceRegister, ops: &[Op], attempted: &[AtomicU64]) {
    // Per scope, the highest fence this thread has seen.
    let mut seen = [0_u64; SCOPES.len()];
    let observe = |seen: &mut [u64; SCOPES.len()], scope: usize, context: &str| {
        let current = fences.current(SCOPES[scope]);
        let bound = attempted[scope].load(Ordering::SeqCst);
        assert!(
            current >= seen[scope],
            "{context}: scope {} went down from {} to {current}",
            SCOPES[scope],
            seen[scope]
        );
        assert!(
            current <= bound,
            "{context}: scope {} shows {current}, above the highest advance so far {bound}",
            SCOPES[scope]
        );
        seen[scope] = current;
        current
    };
    for op in ops {
        match *op {
            Op::Read { scope } => {
                observe(&mut seen, scope, "read");
            }
            Op::Advance { scope, token } => {
                attempted[scope].fetch_max(token, Ordering::SeqCst);
                let before = seen[scope];
                let outcome = fences
                    .advance(SCOPES[scope], token)
                    .expect("advance must succeed within the scope limit");
                match outcome {
                    Advance::Raised { previous } => {
                        assert!(previous < token, "raised from {previous} to {token}");
                        assert!(
                            previous >= before,
                            "raised from {previous}, below seen {before}"
                        );
                    }
                    Advance::Unchanged => {}
                    Advance::Stale { current } => {
                        assert!(current > token, "stale {token} against {current}");
                        assert!(
                            current >= before,
                            "stale against {current}, below seen {before}"
                        );
                    }
                }
                // Once an advance returns, the fence covers its token.
                let current = observe(&mut seen, scope, "after advance");
                match outcome {
                    Advance::Stale { .. } => assert!(current > token),
                    Advance::Raised { .. } | Advance::Unchanged => assert!(current >= token),
                }
            }
        }
    }
}

proptest! {
    // Failing cases are kept next to this file as `fence_model.regressions`: the default
    // location needs a `src/` ancestor, which an integration test does not have.
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::with_cases(CASES)
    })]

    /// Goal: concurrency does not break the max-register semantics, in memory or on disk.
    /// Method: run generated op lists on real threads against one register, then compare
    /// the final fences with the model, before and after reopening the database.
    #[test]
    fn concurrent_advances_and_reads_match_max_model(threads in threads()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fences.redb");
        let expected = model(&threads);
        let expected_list: Vec<(String, u64)> = expected
            .iter()
            .filter(|&(_, &token)| token > 0)
            .map(|(&scope, &token)| (scope.to_owned(), token))
            .collect();
        {
            let fences =
                FenceRegister::open(open_database(&path).unwrap(), SCOPES_MAX_DEFAULT).unwrap();
            let attempted: Vec<AtomicU64> = SCOPES.iter().map(|_| AtomicU64::new(0)).collect();
            std::thread::scope(|scope| {
                for ops in &threads {
                    let (fences, attempted) = (&fences, &attempted);
                    scope.spawn(move || run_thread(fences, ops, attempted));
                }
            });
            for (&scope, &token) in &expected {
                prop_assert_eq!(fences.current(scope), token, "scope {}", scope);
            }
            prop_assert_eq!(fences.list(), expected_list.clone());
        }
        // Every handle is dropped: the reopened register only knows what is on disk.
        let fences =
            FenceRegister::open(open_database(&path).unwrap(), SCOPES_MAX_DEFAULT).unwrap();
        for (&scope, &token) in &expected {
            prop_assert_eq!(fences.current(scope), token, "scope {} after reopen", scope);
        }
        prop_assert_eq!(fences.list(), expected_list);
    }
}
