use proptest::prelude::*;

use super::*;

fn open(m: &mut Machine, index: u64, session: &str) {
    let op = Op::Open {
        session: session.into(),
        ttl_ms: 5_000,
        owner: None,
    };
    assert_eq!(m.apply(index, &op), Some(Outcome::Opened));
}

fn campaign(session: &str, scope: &str) -> Op {
    Op::Campaign {
        session: session.into(),
        scope: scope.into(),
    }
}

/// Goal: a free scope is granted at the campaign's index; a second session waits; the
/// holder's resignation hands the scope to the waiter with the resignation's index.
/// Method: apply entries at indexes 1..=6 by hand.
#[test]
fn grants_go_in_order_with_the_index_as_token() {
    let mut m = Machine::default();
    open(&mut m, 1, "a");
    open(&mut m, 2, "b");
    assert_eq!(
        m.apply(3, &campaign("a", "billing")),
        Some(Outcome::Holding { token: 3 })
    );
    assert_eq!(
        m.apply(4, &campaign("b", "billing")),
        Some(Outcome::Waiting)
    );
    assert_eq!(
        m.apply(5, &campaign("a", "billing")),
        Some(Outcome::Holding { token: 3 }),
        "idempotent"
    );
    let resign = Op::Resign {
        session: "a".into(),
        scope: "billing".into(),
    };
    assert_eq!(
        m.apply(6, &resign),
        Some(Outcome::Resigned { released: true })
    );
    assert_eq!(
        m.holder("billing").map(|h| (h.session.as_str(), h.token)),
        Some(("b", 6))
    );
    m.check().unwrap();
}

/// Goal: revoking (or expiring) a holder passes its scopes on and removes it from every
/// queue; entries at or below the applied index change nothing (a restart's replay).
/// Method: a holds x, waits for y; revoke a; replay an old entry.
#[test]
fn revoke_releases_and_dequeues_and_replays_are_skipped() {
    let mut m = Machine::default();
    open(&mut m, 1, "a");
    open(&mut m, 2, "b");
    open(&mut m, 3, "c");
    m.apply(4, &campaign("a", "x"));
    m.apply(5, &campaign("c", "x"));
    m.apply(6, &campaign("b", "y"));
    m.apply(7, &campaign("a", "y"));
    let revoke = Op::Revoke {
        session: "a".into(),
        expired: true,
    };
    assert_eq!(
        m.apply(8, &revoke),
        Some(Outcome::Revoked {
            released: vec!["x".into()]
        })
    );
    assert_eq!(
        m.holder("x").map(|h| (h.session.as_str(), h.token)),
        Some(("c", 8))
    );
    assert!(m.scopes["y"].waiters.is_empty());
    assert_eq!(m.apply(8, &campaign("b", "z")), None, "replayed index");
    assert_eq!(m.apply(2, &campaign("b", "z")), None, "older index");
    assert!(!m.scopes.contains_key("z"));
    m.check().unwrap();
}

/// Goal: a raise above a proxy's fence grants the holder a token above it, and the
/// scope's next grant is above that again even after it was released.
/// Method: grant at 3, raise above 1,000, release at 5, grant again at 6.
#[test]
fn raised_scopes_keep_their_tokens_above_the_raise() {
    let mut m = Machine::default();
    open(&mut m, 1, "a");
    open(&mut m, 2, "b");
    m.apply(3, &campaign("a", "s"));
    let raise = Op::Raise {
        session: "a".into(),
        scope: "s".into(),
        above: 1_000,
    };
    assert_eq!(m.apply(4, &raise), Some(Outcome::Holding { token: 1_001 }));
    let resign = Op::Resign {
        session: "a".into(),
        scope: "s".into(),
    };
    m.apply(5, &resign);
    assert!(
        m.scopes.contains_key("s"),
        "a raised scope keeps its record"
    );
    assert_eq!(
        m.apply(6, &campaign("b", "s")),
        Some(Outcome::Holding { token: 1_002 })
    );
    let retired = Op::Raise {
        session: "b".into(),
        scope: "s".into(),
        above: u64::MAX,
    };
    assert_eq!(m.apply(7, &retired), Some(Outcome::NotRaised));
}

/// Goal: the limits refuse, and a refused entry changes nothing else.
/// Method: fill one scope's queue to its limit; one more waiter is refused.
#[test]
fn a_full_queue_refuses_the_next_waiter() {
    let mut m = Machine::default();
    let mut index = 0;
    let mut next = || {
        index += 1;
        index
    };
    for n in 0..=WAITERS_PER_SCOPE_MAX + 1 {
        open(&mut m, next(), &format!("s{n}"));
    }
    for n in 0..=WAITERS_PER_SCOPE_MAX {
        let outcome = m.apply(next(), &campaign(&format!("s{n}"), "q"));
        assert!(matches!(
            outcome,
            Some(Outcome::Holding { .. } | Outcome::Waiting)
        ));
    }
    let last = format!("s{}", WAITERS_PER_SCOPE_MAX + 1);
    assert_eq!(
        m.apply(next(), &campaign(&last, "q")),
        Some(Outcome::Refused(Refusal::TooManyWaiters))
    );
    assert!(m.sessions[&last].waits.is_empty());
    m.check().unwrap();
}

fn arb_op() -> impl Strategy<Value = Op> {
    let session = prop::sample::select(vec!["a", "b", "c", "d"]).prop_map(String::from);
    let scope = prop::sample::select(vec!["x", "y", "z"]).prop_map(String::from);
    prop_oneof![
        session.clone().prop_map(|session| Op::Open {
            session,
            ttl_ms: 1_000,
            owner: None
        }),
        session.clone().prop_map(|session| Op::Revoke {
            session,
            expired: false
        }),
        (session.clone(), scope.clone())
            .prop_map(|(session, scope)| Op::Campaign { session, scope }),
        (session.clone(), scope.clone()).prop_map(|(session, scope)| Op::Resign { session, scope }),
        (session, scope, 0..200u64).prop_map(|(session, scope, above)| Op::Raise {
            session,
            scope,
            above
        }),
    ]
}

proptest! {
    /// Goal: under any sequence of operations, each scope has at most one holder, every
    /// grant of a scope has a token above all its earlier grants, the invariants between
    /// sessions and scopes hold, and the state survives its encoding.
    /// Method: random sequences of 1..120 operations on 4 sessions and 3 scopes.
    #[test]
    fn tokens_only_grow_per_scope_and_state_stays_consistent(ops in prop::collection::vec(arb_op(), 1..120)) {
        let mut m = Machine::default();
        let mut granted: BTreeMap<String, u64> = BTreeMap::new();
        for (i, op) in ops.iter().enumerate() {
            m.apply(i as u64 + 1, op);
            m.check().map_err(TestCaseError::fail)?;
            for (name, scope) in &m.scopes {
                if let Some(h) = &scope.holder {
                    let last = granted.entry(name.clone()).or_insert(0);
                    // Equal: the same grant still held; otherwise a new grant, above.
                    let same_or_higher = h.token >= *last;
                    prop_assert!(same_or_higher, "scope {name}: token {} after {}", h.token, last);
                    *last = h.token;
                }
            }
            let holders = m.sessions.values().flat_map(|s| s.holds.iter()).count();
            let held = m.scopes.values().filter(|s| s.holder.is_some()).count();
            prop_assert_eq!(holders, held, "one holder per held scope");
        }
        prop_assert_eq!(Machine::decode(&m.encode()).unwrap(), m);
    }
}
