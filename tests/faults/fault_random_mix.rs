//! A randomized mix of faults for a bounded time, while a worker beside each node keeps
//! writing through the proxy: pauses (`SIGSTOP`) of a node with its worker, of a worker
//! alone, `kill -9` and restart of nodes and of the proxy, partitions and slow links (the
//! nodes' test faults), a slow storage. Afterwards everything heals, a leader must be
//! announced and write again, and the whole run is checked: the write history, terms
//! (polled and logged), and the proxy's fence.
//!
//! The fault schedule comes from a seed, printed at the start; `PALISADE_FAULT_SEED=N`
//! replays it: the same kinds of faults, durations and gaps, in the same order (a fault
//! aimed at "the leader" hits whichever node leads at that moment, and the machine's
//! timing is not replayed). `PALISADE_SOAK_SECS=N` runs the
//! mix for N seconds instead of the default 20: the soak mode.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use palisade_cluster::history::Outcome;
use palisade_protocol::FaultSpec;
use palisade_tests::scenario::{Scenario, ScenarioSpec, fault_seed};
use palisade_tests::terms::{Monitor, term_violations};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

/// How long the mix runs by default.
const DEFAULT_SECS: u64 = 20;
/// Period of the leadership and fence poll.
const POLL: Duration = Duration::from_millis(25);
/// The path prefix of the workers' writes, for the slow-storage fault.
pub(crate) const LEDGER: &str = "/ledger/";

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// `SIGSTOP` a node and its worker, resume later: a GC pause of the whole leader.
    PauseNode,
    /// `SIGSTOP` a worker alone: a client's GC pause, anywhere in its job.
    PauseWorker,
    /// `kill -9` a node, restart it later.
    KillNode,
    /// Cut a node off from the others, both ways, heal later.
    Partition,
    /// Delay everything a node sends to its peers, clear later.
    SlowLinks,
    /// Delay the storage's applies (stays until the next such fault).
    SlowStorage,
    /// `kill -9` the proxy, restart it on the same data and ports.
    KillProxy,
}

/// The faults, with their weights.
const FAULTS: [(Fault, u32); 7] = [
    (Fault::PauseNode, 4),
    (Fault::PauseWorker, 3),
    (Fault::KillNode, 3),
    (Fault::Partition, 3),
    (Fault::SlowLinks, 2),
    (Fault::SlowStorage, 2),
    (Fault::KillProxy, 1),
];

fn pick(rng: &mut StdRng) -> Fault {
    let total: u32 = FAULTS.iter().map(|(_, w)| w).sum();
    let mut n = rng.random_range(0..total);
    for (fault, weight) in FAULTS {
        if n < weight {
            return fault;
        }
        n -= weight;
    }
    Fault::PauseNode
}

/// A duration drawn from `range`, in milliseconds.
pub(crate) fn ms(rng: &mut StdRng, range: std::ops::Range<u64>) -> Duration {
    Duration::from_millis(rng.random_range(range))
}

/// Goal: whatever mix of pauses, kills, partitions and delays happens, the storage
/// never applies a lower token after a higher one, every acknowledged write is applied
/// once, no rejected one is, no term is held by two leaders or goes back, and the
/// cluster recovers. Method: apply seeded random faults one after another, each for a
/// random time, with random quiet gaps (the fault schedule, not waits for conditions),
/// for `PALISADE_SOAK_SECS` (default 20 s); heal; wait for an announced leader that
/// writes; check everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_never_break_fencing() {
    crate::use_tested_binary();
    run_mix(
        "random mix",
        ScenarioSpec {
            job_ms: 50,
            ..ScenarioSpec::default()
        },
    )
    .await;
}

/// The random mix on a scenario started from `spec` (one proxy, or a fleet), named
/// `name` in its output; panics on any violation. With a fleet, a proxy kill hits a
/// proxy drawn from the fleet.
pub(crate) async fn run_mix(name: &str, spec: ScenarioSpec) {
    let seed = fault_seed(name);
    let secs: u64 = std::env::var("PALISADE_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_SECS);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut s = Scenario::start(&spec).await;
    let monitor = Monitor::start(&s.cluster, POLL);
    let first = s.wait_announced_leader(0, None).await;
    let ids = s.cluster.ids();
    let mut applied: BTreeMap<Fault, usize> = BTreeMap::new();
    let run = Duration::from_secs(secs);
    let started = Instant::now();
    while started.elapsed() < run {
        let fault = pick(&mut rng);
        // Most faults hit the leader of the moment: that is where fencing matters.
        let at_leader = rng.random_bool(0.6);
        let any = ids[rng.random_range(0..ids.len())];
        let id = match s.cluster.established_leader(None).await {
            Some(l) if at_leader => l.node_id,
            _ => any,
        };
        *applied.entry(fault).or_insert(0) += 1;
        match fault {
            Fault::PauseNode => {
                let d = ms(&mut rng, 200..1500);
                s.workers[&id].guard.pause().unwrap();
                s.cluster.node(id).unwrap().guard.pause().unwrap();
                s.run_for(d).await;
                s.cluster.node(id).unwrap().guard.resume().unwrap();
                s.workers[&id].guard.resume().unwrap();
            }
            Fault::PauseWorker => {
                let d = ms(&mut rng, 100..1500);
                s.workers[&id].guard.pause().unwrap();
                s.run_for(d).await;
                s.workers[&id].guard.resume().unwrap();
            }
            Fault::KillNode => {
                let d = ms(&mut rng, 0..800);
                s.cluster.node_mut(id).unwrap().kill9();
                s.run_for(d).await;
                s.cluster.node_mut(id).unwrap().restart().unwrap();
            }
            Fault::Partition => {
                let d = ms(&mut rng, 300..2000);
                s.cluster.partition(&[id]).await.unwrap();
                s.run_for(d).await;
                s.cluster.heal().await.unwrap();
            }
            Fault::SlowLinks => {
                let d = ms(&mut rng, 500..2000);
                let delay = rng.random_range(50..400);
                let faults = FaultSpec {
                    delay_ms: ids
                        .iter()
                        .filter(|&&p| p != id)
                        .map(|&p| (p, delay))
                        .collect(),
                    ..FaultSpec::default()
                };
                s.cluster
                    .node(id)
                    .unwrap()
                    .set_faults(&faults)
                    .await
                    .unwrap();
                s.run_for(d).await;
                s.cluster.heal().await.unwrap();
            }
            Fault::SlowStorage => {
                let delay = ms(&mut rng, 0..300);
                s.upstream.delay(LEDGER, delay);
            }
            Fault::KillProxy => {
                // One proxy draws nothing, so a seed replays as it did before fleets.
                let proxies = s.cluster.proxies().len();
                let i = if proxies > 1 {
                    rng.random_range(0..proxies)
                } else {
                    0
                };
                s.cluster.proxy_at_mut(i).unwrap().restart().unwrap();
            }
        }
        let quiet = ms(&mut rng, 100..600);
        s.run_for(quiet).await;
    }

    // Heal, and see the cluster recover: an announced leader whose worker writes.
    s.upstream.delay(LEDGER, Duration::ZERO);
    s.cluster.heal().await.unwrap();
    let leader = s.wait_announced_leader(first.term, None).await;
    let token = leader.token.unwrap();
    s.wait_acked(token, 1).await;

    let (answers, mut violations) = monitor.violations();
    let (established, logged) = term_violations(&s.cluster);
    violations.extend(logged);
    let report = s.finish(name);
    let faults: usize = applied.values().sum();
    eprintln!(
        "{name}: seed {seed}, {secs} s, {faults} faults {applied:?}, {established} established leaderships, {answers} leadership answers, {} writes checked ({} rejected), {} term violations, {} history violations",
        report.ops(),
        report.count(Outcome::Rejected),
        violations.len(),
        report.violations.len()
    );
    assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
}
