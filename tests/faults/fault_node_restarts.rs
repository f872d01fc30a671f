//! `kill -9` and restart of nodes while elections are under way: a term is never reused
//! (no two established leaders ever share one) and a node's term never goes back, over
//! the whole run, as seen both over the API (polled every 20 ms) and in the nodes' logs
//! (which record every established leadership, however short). Workers keep writing
//! through the proxy meanwhile, and their history is checked.

use std::time::Duration;

use palisade_tests::scenario::{Scenario, ScenarioSpec, fault_seed};
use palisade_tests::terms::{Monitor, term_violations};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

/// Rounds of kills.
const ROUNDS: usize = 10;
/// Period of the leadership poll.
const POLL: Duration = Duration::from_millis(20);

/// Goal: terms are never reused and never go back across `kill -9`s, including kills in
/// the middle of an election. Method: each round, `kill -9` the leader; at a random
/// moment of the election that follows (within its 200-400 ms timeout), `kill -9` a second
/// node; restart both after random short delays; wait for an announced leader of a
/// higher term. Then check the polled views, the logs and the write history. The random
/// timings are the fault schedule (seeded, replayable with `PALISADE_FAULT_SEED`), not
/// waits for a condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_killed_during_elections_never_reuse_or_lose_a_term() {
    crate::use_tested_binary();
    let seed = fault_seed("node restarts");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut s = Scenario::start(&ScenarioSpec::default()).await;
    let monitor = Monitor::start(&s.cluster, POLL);
    let mut leader = s.wait_announced_leader(0, None).await;
    let mut kills = 0;
    for round in 1..=ROUNDS {
        let first = leader.node_id;
        s.cluster.node_mut(first).unwrap().kill9();
        s.run_for(Duration::from_millis(rng.random_range(0..400)))
            .await;
        let ids: Vec<u64> = s
            .cluster
            .ids()
            .into_iter()
            .filter(|&i| i != first)
            .collect();
        let second = ids[rng.random_range(0..ids.len())];
        s.cluster.node_mut(second).unwrap().kill9();
        kills += 2;
        s.run_for(Duration::from_millis(rng.random_range(0..300)))
            .await;
        s.cluster.node_mut(second).unwrap().restart().unwrap();
        s.run_for(Duration::from_millis(rng.random_range(0..300)))
            .await;
        s.cluster.node_mut(first).unwrap().restart().unwrap();
        let next = s.wait_announced_leader(leader.term, None).await;
        s.say(&format!(
            "round {round}: killed nodes {first} (leader, term {}) and {second}; node {} leads in term {}",
            leader.term, next.node_id, next.term
        ));
        leader = next;
    }
    s.run_for(Duration::from_millis(300)).await;

    let (answers, mut violations) = monitor.violations();
    let (established, logged) = term_violations(&s.cluster);
    violations.extend(logged);
    let report = s.finish("node restarts");
    eprintln!(
        "node restarts: {ROUNDS} rounds, {kills} kills, {established} established leaderships in the logs, {answers} leadership answers, {} writes checked, {} term violations, {} history violations",
        report.ops(),
        violations.len(),
        report.violations.len()
    );
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(established > ROUNDS, "every round elected a leader");
}
