//! The simulation's entry point: many seeds (`PALISADE_SIM_SEEDS=N`, default
//! [`SEEDS_DEFAULT`]) or one seed with its trace digest (`PALISADE_SIM_SEED=S`). Its own
//! test binary, which cargo runs after `replay`, so that its summary line comes last.
// Test code may panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use palisade_sim::knobs::SEEDS_DEFAULT;
use palisade_sim::{Outcome, run_seed};

/// How many seeds to run: `PALISADE_SIM_SEEDS`, else the default.
fn seed_count() -> u64 {
    match std::env::var("PALISADE_SIM_SEEDS") {
        Ok(n) => n
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("PALISADE_SIM_SEEDS={n:?} is not a count of seeds")),
        Err(_) => SEEDS_DEFAULT,
    }
}

/// The one seed `PALISADE_SIM_SEED` names, if it is set.
fn one_seed() -> Option<u64> {
    std::env::var("PALISADE_SIM_SEED").ok().map(|s| {
        s.trim()
            .parse()
            .unwrap_or_else(|_| panic!("PALISADE_SIM_SEED={s:?} is not a seed"))
    })
}

/// Prints a failing seed: its violations, the end of its trace, and how to replay it.
fn report_failure(o: &Outcome) {
    eprintln!(
        "seed {} FAILED ({} nodes, digest {}):",
        o.seed, o.nodes, o.digest
    );
    for v in &o.violations {
        eprintln!("  violation {v}");
    }
    eprintln!("  last steps:");
    for line in &o.tail {
        eprintln!("    {line}");
    }
    eprintln!(
        "  replay: PALISADE_SIM_SEED={} cargo test --release -p palisade-sim",
        o.seed
    );
}

/// Runs seeds `0..count` on every core, each on a thread of its own; the outcomes in seed
/// order.
fn run_seeds(count: u64) -> Vec<Outcome> {
    let next = AtomicU64::new(0);
    let outcomes = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= count {
                        return;
                    }
                    let outcome = run_seed(seed, false);
                    if !outcome.violations.is_empty() {
                        report_failure(&outcome);
                    }
                    outcomes.lock().unwrap().push(outcome);
                }
            });
        }
    });
    let mut outcomes = outcomes.into_inner().unwrap();
    outcomes.sort_by_key(|o| o.seed);
    outcomes
}

/// Goal: no seed breaks an invariant (per scope, named ones included, the storage never
/// applies a lower token after a higher one; a fence never moves back nor below an applied
/// token; one holder per token of the cluster's scope; at most one client trusts a grant
/// of a named scope at a time, and each named scope's grants rise). Method: with `PALISADE_SIM_SEED` set, run that seed alone and print its trace
/// digest (and, with `PALISADE_SIM_TRACE` set, every step); else run `PALISADE_SIM_SEEDS` seeds (default 20) across the cores; print
/// `seeds: N, violations: V` last and fail, naming the seeds, if V > 0.
#[test]
fn seeds_keep_every_invariant() {
    let started = Instant::now();
    let outcomes = match one_seed() {
        Some(seed) => {
            let outcome = run_seed(seed, std::env::var_os("PALISADE_SIM_TRACE").is_some());
            if !outcome.violations.is_empty() {
                report_failure(&outcome);
            }
            println!(
                "seed {seed}: {} nodes, {} steps, {:?}",
                outcome.nodes, outcome.events, outcome.stats
            );
            println!("trace digest: {}", outcome.digest);
            vec![outcome]
        }
        None => run_seeds(seed_count()),
    };
    let elapsed = started.elapsed();
    let failing: Vec<u64> = outcomes
        .iter()
        .filter(|o| !o.violations.is_empty())
        .map(|o| o.seed)
        .collect();
    let violations: usize = outcomes.iter().map(|o| o.violations.len()).sum();
    let applied: u64 = outcomes.iter().map(|o| o.stats.applied).sum();
    let stale: u64 = outcomes.iter().map(|o| o.stats.stale).sum();
    let tokens: u64 = outcomes.iter().map(|o| o.stats.tokens).sum();
    let faults: u64 = outcomes.iter().map(|o| o.stats.faults).sum();
    let sum = |f: fn(&Outcome) -> u64| outcomes.iter().map(f).sum::<u64>();
    let sessions = sum(|o| o.stats.sessions);
    let lost = sum(|o| o.stats.sessions_lost);
    let grants = sum(|o| o.stats.grants);
    let timeouts = sum(|o| o.stats.campaign_timeouts);
    let named_applied = sum(|o| o.stats.named_applied);
    let named_stale = sum(|o| o.stats.named_stale);
    println!(
        "{} seeds in {:.1} s ({:.2} seeds/s): {faults} faults, {tokens} tokens, \
         {applied} writes applied, {stale} refused as stale; named leaderships: \
         {sessions} sessions ({lost} lost), {grants} grants, {timeouts} campaign timeouts, \
         {named_applied} writes applied, {named_stale} refused as stale",
        outcomes.len(),
        elapsed.as_secs_f64(),
        f64::from(u32::try_from(outcomes.len()).unwrap_or(u32::MAX))
            / elapsed.as_secs_f64().max(f64::EPSILON),
    );
    if !failing.is_empty() {
        println!("failing seeds: {failing:?}");
    }
    println!("seeds: {}, violations: {violations}", outcomes.len());
    assert!(failing.is_empty(), "failing seeds: {failing:?}");
}
