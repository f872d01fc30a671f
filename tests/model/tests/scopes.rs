//! The exhaustive checks of the named-leaderships model, and the counterexamples that
//! show each of its rules is needed: the new leader's TTL grace, fence on grant, the
//! drift term of the client's loss rule, and a deposed leader answering no keepalive.
//!
//! Every check prints its state counts and time; each counterexample prints its trace.
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use palisade_model::scopes::{
    Action, Bounds, Office, PROP_GRANT_AFTER_FAILOVER, PROP_ONE_BELIEVER, PROP_ORDERED,
    PROP_PREDECESSOR_FENCED_OUT, PROP_SECOND_HOLDER_WRITES, PROP_STALE_WRITE_LANDS,
    PROP_TRUST_SOUND, ScopesModel, State,
};
use stateright::{Checker, Model, Path};

/// The safety properties (`always`).
const SAFETY: [&str; 4] = [
    PROP_ORDERED,
    PROP_TRUST_SOUND,
    PROP_ONE_BELIEVER,
    PROP_PREDECESSOR_FENCED_OUT,
];

/// The properties that show the model is not vacuous (`sometimes`).
const REACHED: [&str; 3] = [
    PROP_SECOND_HOLDER_WRITES,
    PROP_STALE_WRITE_LANDS,
    PROP_GRANT_AFTER_FAILOVER,
];

/// What a check found: the unique states, whether the walk ended by itself, and the
/// paths to the properties discovered, by name.
struct Outcome {
    unique: usize,
    done: bool,
    discoveries: HashMap<&'static str, Path<State, Action>>,
}

/// Runs a breadth-first check to its end (or to a discovery of every property) and
/// prints what it visited.
fn check(name: &str, bounds: Bounds) -> Outcome {
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let started = Instant::now();
    let checker = ScopesModel::new(bounds)
        .checker()
        .threads(threads)
        .spawn_bfs()
        .join();
    println!(
        "{name}: {bounds:?}: {} states generated, {} unique, max depth {}, {:.1} s on {threads} threads",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64(),
    );
    Outcome {
        unique: checker.unique_state_count(),
        done: checker.is_done(),
        discoveries: checker.discoveries(),
    }
}

/// Checks the rules as designed: no safety property fails, every `sometimes` property
/// is reached, and the walk covered every state. Returns the unique state count.
fn check_design(name: &str, bounds: Bounds) -> usize {
    let outcome = check(name, bounds);
    for property in SAFETY {
        if let Some(path) = outcome.discoveries.get(property) {
            panic!("{name}: \"{property}\" fails:\n{path}");
        }
    }
    for property in REACHED {
        assert!(
            outcome.discoveries.contains_key(property),
            "{name}: no run reaches \"{property}\": the model is vacuous there"
        );
    }
    assert!(outcome.done, "{name}: the check stopped before the end");
    outcome.unique
}

/// A shortest run from the initial state to one where `property` (an `always`) fails:
/// the steps, each with the state it leads to. The checker's own path is a valid
/// counterexample but not the shortest (its workers take states last in, first out),
/// so the trace to print is found by a plain breadth-first walk.
fn shortest_counterexample(model: &ScopesModel, property: &str) -> Option<Vec<(Action, State)>> {
    let holds = model
        .properties()
        .into_iter()
        .find(|p| p.name == property)?
        .condition;
    let mut parents: HashMap<State, Option<(State, Action)>> = HashMap::new();
    let mut queue = VecDeque::new();
    for init in model.init_states() {
        parents.insert(init.clone(), None);
        queue.push_back(init);
    }
    let mut actions = Vec::new();
    while let Some(state) = queue.pop_front() {
        if !holds(model, &state) {
            let mut steps = Vec::new();
            let mut at = state;
            while let Some(Some((parent, action))) = parents.get(&at).cloned() {
                steps.push((action, at));
                at = parent;
            }
            steps.reverse();
            return Some(steps);
        }
        model.actions(&state, &mut actions);
        for action in actions.drain(..) {
            if let Some(next) = model.next_state(&state, action)
                && !parents.contains_key(&next)
            {
                parents.insert(next.clone(), Some((state.clone(), action)));
                queue.push_back(next);
            }
        }
    }
    None
}

/// Checks bounds that break a rule; asserts that `broken` fails and that every safety
/// property outside `broken` and `also` holds over the whole state space; prints a
/// shortest counterexample to `broken` and returns its last state.
fn find_violation(name: &str, bounds: Bounds, broken: &str, also: &[&str]) -> State {
    let outcome = check(name, bounds);
    assert!(
        outcome.discoveries.contains_key(broken),
        "{name}: no counterexample to \"{broken}\" (done: {})",
        outcome.done
    );
    // The walk stops early only once every property has a discovery; one without is
    // then checked over every reachable state.
    assert!(outcome.done, "{name}: the check stopped before the end");
    for property in SAFETY {
        if property != broken && !also.contains(&property) {
            assert!(
                !outcome.discoveries.contains_key(property),
                "{name}: \"{property}\" fails too:\n{}",
                outcome.discoveries[property]
            );
        }
    }
    let Some(steps) = shortest_counterexample(&ScopesModel::new(bounds), broken) else {
        panic!("{name}: the checker's counterexample to \"{broken}\" is not reachable");
    };
    println!(
        "{name}: shortest counterexample to \"{broken}\", {} steps:",
        steps.len()
    );
    for (action, state) in &steps {
        let trust: Vec<u8> = state.clients.iter().map(|c| c.trust_left).collect();
        let deadlines: Vec<u8> = state.sessions.iter().map(|s| s.deadline_left).collect();
        println!(
            "  {action:?}   -> office {:?}, trust left {trust:?}, deadlines left {deadlines:?}, fences {:?}",
            state.office,
            state.proxies.iter().map(|p| p.fence).collect::<Vec<_>>(),
        );
    }
    let last = steps.last().map_or_else(
        || ScopesModel::new(bounds).init_states().remove(0),
        |(_, state)| state.clone(),
    );
    println!("final state: {last:#?}");
    last
}

/// Whether some client trusts a session the cluster has expired.
fn trusts_an_expired_session(state: &State) -> bool {
    state
        .clients
        .iter()
        .zip(&state.sessions)
        .any(|(client, session)| client.trust_left > 0 && session.expired)
}

/// The bounds of the design checks: a TTL of 3 ticks (keepalives, answers and expiry
/// interleave over more ticks than the counterexamples need) and two writes per client.
fn design_bounds(proxies: usize) -> Bounds {
    let mut bounds = Bounds::small(proxies);
    bounds.ttl_ticks = 3;
    bounds.writes = 2;
    bounds
}

/// Goal: with two proxies, the rules as designed keep every safety property (no stale
/// apply, the client's loss rule sound across a failover, one believer, the previous
/// holder fenced out once a grant is delivered), and the second holder does write after
/// a failover. Method: exhaustive BFS of every interleaving of keepalives, expiry,
/// failover, campaign, fence, grant, writes and ticks (pauses, lost, delayed and
/// reordered messages), asserting no property fails and each `sometimes` is met.
#[test]
fn design_keeps_scopes_safe_with_two_proxies() {
    check_design("design, 2 proxies", design_bounds(2));
}

/// Goal: the same with one proxy, the common deployment. Method: the same exhaustive
/// BFS and assertions.
#[test]
fn design_keeps_scopes_safe_with_one_proxy() {
    check_design("design, 1 proxy", design_bounds(1));
}

/// Goal: the same with a TTL of 4 ticks on two proxies (keepalives overtaking one
/// another and the expiry over more ticks). Method: the same exhaustive BFS and
/// assertions.
#[test]
#[ignore = "a TTL of 4 ticks on two proxies: 4.4 million states, about 50 s here, which would double the default run; run with --ignored"]
fn design_keeps_scopes_safe_with_a_longer_ttl() {
    let mut bounds = design_bounds(2);
    bounds.ttl_ticks = 4;
    check_design("design, ttl 4, 2 proxies", bounds);
}

/// Goal: the new leader's grace is what keeps the client's loss rule sound across a
/// failover: without it, the new leader expires a session whose client, having kept
/// alive with the old leader, still trusts it. Method: the model without the grace, one
/// proxy (the proxies play no part in it); the checker must find the violation of "no
/// client trusts an expired session" (one believer may fail with it), printed; every
/// other property holds over the whole state space (the fence still keeps the data).
#[test]
fn removing_the_grace_lets_the_new_leader_expire_a_trusted_session() {
    let mut bounds = Bounds::small(1);
    bounds.grace = false;
    let last = find_violation(
        "grace removed",
        bounds,
        PROP_TRUST_SOUND,
        &[PROP_ONE_BELIEVER],
    );
    assert_eq!(last.office, Office::Two, "the expiry is the new leader's");
    assert!(trusts_an_expired_session(&last));
}

/// Goal: without fence on grant, two proxies let a stale write land last: the new
/// holder's first write raises the fence at one proxy only, and the paused old holder's
/// write, delayed in flight to the other proxy, is admitted there and applied after it.
/// Method: the model without fence on grant, two proxies; the checker must find the
/// violation of the order, printed, ending in a token 1 applied after a 2.
#[test]
fn removing_fence_on_grant_lets_a_stale_write_land_last_with_two_proxies() {
    let mut bounds = Bounds::small(2);
    bounds.fence_on_grant = false;
    let last = find_violation(
        "fence on grant removed, 2 proxies",
        bounds,
        PROP_ORDERED,
        &[PROP_PREDECESSOR_FENCED_OUT],
    );
    assert_eq!(last.highest_applied, 2, "the violation is a 1 after a 2");
}

/// Goal: with one proxy, the proxy's own check and barrier keep the order even without
/// fence on grant, and what fence on grant buys there is that the previous holder is
/// refused from the moment the grant is delivered (not only from the new holder's first
/// write on). Method: the model without fence on grant, one proxy; the checker must
/// find a proxy admitting token 1 after token 2 was delivered, printed; the order holds
/// over the whole state space (the walk is exhaustive, and "no lower token applied
/// after a higher one" has no counterexample).
#[test]
fn removing_fence_on_grant_lets_the_old_holder_in_after_the_grant_with_one_proxy() {
    let mut bounds = Bounds::small(1);
    bounds.fence_on_grant = false;
    let last = find_violation(
        "fence on grant removed, 1 proxy",
        bounds,
        PROP_PREDECESSOR_FENCED_OUT,
        &[],
    );
    assert!(last.stale_admitted && last.delivered == 2);
}

/// Goal: the drift term of the client's loss rule is needed: a client that trusts its
/// session for a full TTL of its own clock, which runs slow, still trusts it when the
/// leader expires it. Method: the model with the rule's drift term left out, one proxy;
/// the checker must find the violation of "no client trusts an expired session",
/// printed.
#[test]
fn dropping_the_drift_from_the_loss_rule_lets_a_client_trust_an_expired_session() {
    let mut bounds = Bounds::small(1);
    bounds.loss_rule_drift = false;
    let last = find_violation(
        "loss rule without the drift",
        bounds,
        PROP_TRUST_SOUND,
        &[PROP_ONE_BELIEVER],
    );
    assert!(trusts_an_expired_session(&last));
}

/// Goal: the grace and the loss rule are sound only if no keepalive sent after the new
/// leader took office is answered by the old one: a leader paused over the election
/// that answers one on waking (before it learns of the new term) gives the client a
/// trust the new leader's deadline does not cover. Method: the model in which leader 1,
/// deposed without knowing it, still answers keepalives (refusing only what it knew
/// expired or had proposed for expiry when it left office), one proxy; the checker must
/// find the violation of "no client trusts an expired session", printed, in leader 2's
/// term.
#[test]
fn a_deposed_leader_answering_keepalives_lets_a_client_trust_an_expired_session() {
    let mut bounds = Bounds::small(1);
    bounds.deposed_leader_answers = true;
    let last = find_violation(
        "deposed leader answers keepalives",
        bounds,
        PROP_TRUST_SOUND,
        &[PROP_ONE_BELIEVER],
    );
    assert_eq!(last.office, Office::Two);
    assert!(trusts_an_expired_session(&last));
}
