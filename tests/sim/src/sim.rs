//! One run: the world, the cluster, the proxies and the workers, started on a
//! current-thread runtime with a paused clock, then the fault schedule, the settling
//! time, and the outcome.

use std::sync::Arc;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::knobs::{CHECK_PERIOD_MS, HOLDERS, NODE_COUNTS, SETTLE_MS, WORKERS_PER_NODE};
use crate::proxies::Proxies;
use crate::world::{Stats, World};

/// The scope the cluster fences: its own (`--scope`, token = the leader's term).
pub const SCOPE: &str = palisade_protocol::DEFAULT_SCOPE;

/// Everything one run simulates.
pub struct Sim {
    pub world: World,
    pub cluster: Cluster,
    pub proxies: Proxies,
}

/// What one run found.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// Nodes the cluster started with.
    pub nodes: u64,
    /// SHA-256 of the trace, in hex: equal for two runs of one seed.
    pub digest: String,
    /// Steps in the trace.
    pub events: u64,
    /// Every invariant broken, with its virtual time.
    pub violations: Vec<String>,
    /// The last steps of the trace, oldest first.
    pub tail: Vec<String>,
    /// Counts for the summary.
    pub stats: Stats,
}

/// Runs seed `seed` to its end, on the calling thread; with `print_steps`, every step is
/// printed to stderr as it happens.
pub fn run_seed(seed: u64, print_steps: bool) -> Outcome {
    palisade_election::set_deterministic(true);
    #[allow(clippy::expect_used)] // Without a runtime there is no simulation to report on.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread tokio runtime");
    let outcome = runtime.block_on(run(seed, print_steps));
    // Dropping the runtime drops every task of the run: nodes, proxies, workers.
    drop(runtime);
    outcome
}

async fn run(seed: u64, print_steps: bool) -> Outcome {
    let world = World::new(seed);
    world.trace().echo = print_steps;
    let nodes = world.dice.pick(&NODE_COUNTS);
    let cluster = Cluster::new(&world, nodes);
    let sim = Arc::new(Sim {
        world,
        cluster,
        proxies: Proxies::new(),
    });
    sim.world.log(&format!(
        "seed {seed}: {nodes} nodes, {} proxies",
        sim.proxies.ids().len()
    ));
    for p in sim.proxies.ids() {
        sim.start_proxy(p);
    }
    for id in sim.cluster.members() {
        sim.boot(id).await;
    }
    for w in 0..nodes * WORKERS_PER_NODE {
        tokio::spawn(Arc::clone(&sim).worker(w));
    }
    for h in 0..HOLDERS {
        tokio::spawn(Arc::clone(&sim).holder(h));
    }
    tokio::spawn(Arc::clone(&sim).checker());
    sim.chaos().await;
    tokio::time::sleep(Duration::from_millis(SETTLE_MS)).await;
    sim.proxies.check_fences(&sim.world, "at the end");
    sim.world.check_named_holders("at the end");
    let holders = sim.cluster.token_holders();
    sim.world.log(&format!("end: token holders {holders:?}"));
    let trace = sim.world.trace();
    Outcome {
        seed,
        nodes,
        digest: trace.digest_hex(),
        events: trace.events(),
        violations: trace.violations().to_vec(),
        tail: trace.tail().map(str::to_owned).collect(),
        stats: *sim.world.stats(),
    }
}

impl Sim {
    /// Every [`CHECK_PERIOD_MS`], checks every running proxy's fences and that no named
    /// scope has two holders.
    async fn checker(self: Arc<Self>) {
        let mut every = tokio::time::interval(Duration::from_millis(CHECK_PERIOD_MS));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            self.proxies.check_fences(&self.world, "periodic check");
            self.world.check_named_holders("periodic check");
        }
    }
}
