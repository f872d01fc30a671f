//! The long soak: overlapping fault cycles on real processes, counted in cycles, while a
//! worker beside each node keeps writing through the proxy with its node's token, and the
//! whole history checked after every batch.
//!
//! # Cycles
//!
//! A cycle injects one fault, holds it for a drawn time, and undoes it:
//! - `PauseNode`: `SIGSTOP` a node and its worker, then `SIGCONT` both (a GC pause of a
//!   whole leader);
//! - `PauseWorker`: `SIGSTOP` a worker alone (a client's GC pause, mostly while it holds
//!   a token in its job);
//! - `KillNode`: `kill -9` a node, restart it on its data;
//! - `FailpointKill`: `kill -9` of the proxy at one of its five failpoints. They are read
//!   at start (`PALISADE_FAILPOINT_STOP`), so arming one is a restart of the proxy with it;
//!   the first write (or announce, for the fence-commit ones) to reach it stops the proxy
//!   there whole; held stopped, it is killed and restarted without it, and its fence must
//!   then be at least every token that reached the storage (as in `fault_proxy_crash`).
//!   One that no request reaches within [`ARMED_TIMEOUT`] is disarmed by a plain restart
//!   (counted as missed). The nodes have no failpoints; the client's
//!   (`client-before-send`) is the headline of `fault_paused_leader`;
//! - `Partition`: cut a node off from every other, both ways (the nodes' test faults);
//! - `SlowLinks`: delay what a node sends to its peers by 50 to 400 ms (test faults);
//! - `SlowStorage`: delay the storage's applies by 50 to 400 ms;
//! - `KillProxy`: `kill -9` the proxy, restart it on the same data and ports;
//! - `ClockJump`: step one process's wall clock (a node's or the proxy's) by 30 s, 10 min,
//!   1 h or 1 d, forwards or back, through libfaketime's offset file (re-read every
//!   second; the monotonic clock is left alone, as a stepped system clock leaves it), and
//!   back to the real time at the end. The design reads only monotonic clocks for what it
//!   decides (docs/testing.md, "Clock faults"), so such jumps must change nothing. Before
//!   the clock is set back, the process's wall clock is read (a node's log timestamp, the
//!   proxy's status) and must show the jump: a reading at another offset fails the run, a
//!   process that cannot be read (paused or killed by another cycle) leaves it unverified.
//!   Without libfaketime this kind is skipped, saying so; everything else runs.
//!
//! # Overlap, and the rules that keep it meaningful
//!
//! Cycles start a drawn gap apart (50 to 500 ms), shorter than a cycle lasts (holds of 0
//! to 5 s, plus restarts), so several are in progress at once, at most
//! [`MAX_IN_PROGRESS`]. The rules:
//! - each process (a node, a worker, the proxy), the storage and each wall clock is in one
//!   cycle at a time;
//! - at most a minority of the nodes (`(n - 1) / 2`: one of three) is paused, killed or
//!   cut off at a time, so that a quorum can always make progress: the run tests fencing
//!   under the faults the cluster is built to survive, not a cluster that lost its quorum.
//!   Slow links, worker pauses, the proxy, the storage and the clocks are not limited by
//!   it (so a majority can be slow while one node is down);
//! - a cycle the rules do not admit yet waits, and the cycles after it wait behind it.
//!
//! A node fault hits the leader of the moment (as last seen by the monitor) with
//! probability 0.6, a drawn node otherwise.
//!
//! # Checks
//!
//! Every [`BATCH`] cycles (fewer in a short run, so that a default run checks twice), the
//! run stops starting cycles, lets those in progress end, heals every fault, waits for an
//! announced leader (the proxy's fence at its token) whose worker's next write is
//! acknowledged, and checks the whole history so far with the history checker, the term
//! and fence monitor's views (no term with two leaders, no term going back, the fence
//! never down) and the nodes' logs, with the fence checks of the failpoint kills and the
//! clock read-backs. Any violation fails the run there, with the seed and the cycle
//! count. The run then goes on with the same processes, history and monitor, so the last
//! batch's check covers the whole run; at the end the workers are killed and the whole
//! history is checked once more.
//!
//! # Knobs
//!
//! `PALISADE_SOAK_CYCLES=N` runs N cycles (the soak: 10,000); without it,
//! [`DEFAULT_CYCLES`], about 25 s on 2 cores, so `cargo test` runs it. The seed is
//! printed at the start; `PALISADE_FAULT_SEED=N` replays the schedule: the same cycles,
//! holds and gaps in the same order (each cycle's draws are made in full, whatever its
//! kind), not the machine's timing, nor which node led when a cycle aimed at the leader.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::{Duration, Instant};

use palisade_cluster::history::{self, Report};
use palisade_cluster::{FaultSpec, wait};
use palisade_protocol::DEFAULT_SCOPE;
use palisade_protocol::process::{FAILPOINT_STOP_ENV, FailpointStop};
use palisade_tests::clock::{
    JUMP_CACHE_S, WallClock, forget_cluster_names, libfaketime, node_wall_offset_s, offset_is,
    proxy_wall_offset_s, require_libfaketime,
};
use palisade_tests::scenario::{STEP_TIMEOUT, Scenario, ScenarioSpec, fault_seed};
use palisade_tests::terms::{Monitor, term_violations};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

use crate::fault_proxy_crash::FAILPOINTS;
use crate::fault_random_mix::{LEDGER, ms};

/// The test's name in its output.
const NAME: &str = "soak";
/// The variable that sets the number of cycles.
const CYCLES_ENV: &str = "PALISADE_SOAK_CYCLES";
/// Cycles without [`CYCLES_ENV`].
const DEFAULT_CYCLES: usize = 40;
/// Cycles between two checks of the whole history.
const BATCH: usize = 100;
/// Most cycles in progress at once.
const MAX_IN_PROGRESS: usize = 5;
/// The gap between two cycles' starts, in milliseconds: shorter than a cycle lasts.
const GAP_MS: Range<u64> = 50..500;
/// Election nodes.
const NODES: usize = 3;
/// Period of the term and fence monitor's polls.
const POLL: Duration = Duration::from_millis(25);
/// How long an armed failpoint waits for a request to reach it.
const ARMED_TIMEOUT: Duration = Duration::from_secs(5);
/// The wall-clock jumps, in libfaketime's syntax and in seconds.
const JUMPS: [(&str, i64); 8] = [
    ("-1d", -86_400),
    ("-1h", -3_600),
    ("-10m", -600),
    ("-30s", -30),
    ("+30s", 30),
    ("+10m", 600),
    ("+1h", 3_600),
    ("+1d", 86_400),
];
/// Longest a clock read-back is retried (a log line or a status on its way).
const JUMP_READ: Duration = Duration::from_secs(2);

/// One kind of fault cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    PauseNode,
    PauseWorker,
    KillNode,
    FailpointKill,
    Partition,
    SlowLinks,
    SlowStorage,
    KillProxy,
    ClockJump,
}

/// The kinds, with their weights.
const KINDS: [(Kind, u32); 9] = [
    (Kind::PauseNode, 4),
    (Kind::PauseWorker, 3),
    (Kind::KillNode, 3),
    (Kind::FailpointKill, 3),
    (Kind::Partition, 3),
    (Kind::SlowLinks, 2),
    (Kind::SlowStorage, 2),
    (Kind::KillProxy, 1),
    (Kind::ClockJump, 3),
];

impl Kind {
    /// How long the fault is held, in milliseconds (for a failpoint kill: stopped at the
    /// failpoint; for a kill: down before the restart).
    fn hold_ms(self) -> Range<u64> {
        match self {
            Kind::PauseNode => 200..1500,
            Kind::PauseWorker => 100..1500,
            Kind::KillNode | Kind::KillProxy => 0..800,
            Kind::FailpointKill => 0..1000,
            Kind::Partition => 300..2000,
            Kind::SlowLinks | Kind::SlowStorage => 500..2000,
            // Long enough for the offset file to be re-read, and then seen.
            Kind::ClockJump => JUMP_CACHE_S * 1000 + 1500..5000,
        }
    }

    /// Whether it takes its node out of the quorum (paused, killed or cut off).
    fn impairs(self) -> bool {
        matches!(self, Kind::PauseNode | Kind::KillNode | Kind::Partition)
    }
}

/// What one cycle does, drawn in full before it starts.
#[derive(Debug, Clone, Copy)]
struct Draw {
    kind: Kind,
    /// Whether a node fault aims at the leader of the moment.
    at_leader: bool,
    /// The node otherwise.
    node: u64,
    hold: Duration,
    /// The delay of slow links or a slow storage.
    delay_ms: u64,
    /// Index into [`FAILPOINTS`].
    failpoint: usize,
    /// Index into [`JUMPS`].
    jump: usize,
    /// Whose wall clock jumps: a node's by position, or (at [`NODES`]) the proxy's.
    clock: usize,
    /// The gap before the next cycle may start.
    gap: Duration,
}

/// Draws the next cycle. Every field is drawn whatever the kind, so that the stream of
/// draws, and so the schedule a seed replays, never depends on the machine.
fn draw(rng: &mut StdRng) -> Draw {
    let total: u32 = KINDS.iter().map(|(_, w)| w).sum();
    let mut n = rng.random_range(0..total);
    let mut kind = KINDS[0].0;
    for (k, weight) in KINDS {
        if n < weight {
            kind = k;
            break;
        }
        n -= weight;
    }
    Draw {
        kind,
        at_leader: rng.random_bool(0.6),
        node: rng.random_range(1..=NODES as u64),
        hold: ms(rng, kind.hold_ms()),
        delay_ms: rng.random_range(50..400),
        failpoint: rng.random_range(0..FAILPOINTS.len()),
        jump: rng.random_range(0..JUMPS.len()),
        clock: rng.random_range(0..=NODES),
        gap: ms(rng, GAP_MS),
    }
}

/// What a cycle occupies: no two cycles in progress share one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Node(u64),
    Worker(u64),
    Proxy,
    Storage,
    Clock(usize),
}

/// Where a cycle is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The fault is in force until the cycle's `until`.
    Held,
    /// A failpoint is armed; `seen` once the proxy said it stopped there. `until` is the
    /// deadline for a request to reach it.
    Armed { seen: bool },
    /// The proxy is stopped at the failpoint until `until`, then killed.
    Stopped,
}

/// A cycle in progress.
#[derive(Debug)]
struct Cycle {
    /// Its number, from 1.
    n: usize,
    draw: Draw,
    /// The node it hits (the draw's, or the leader's), for node and worker faults.
    node: u64,
    targets: Vec<Target>,
    phase: Phase,
    until: Instant,
    started: Instant,
}

impl Cycle {
    fn describe(&self) -> String {
        let d = &self.draw;
        match d.kind {
            Kind::PauseNode | Kind::PauseWorker | Kind::KillNode | Kind::Partition => {
                format!("{:?} node {}", d.kind, self.node)
            }
            Kind::SlowLinks => format!("SlowLinks node {} +{} ms", self.node, d.delay_ms),
            Kind::SlowStorage => format!("SlowStorage +{} ms", d.delay_ms),
            Kind::KillProxy => "KillProxy".to_owned(),
            Kind::FailpointKill => format!("FailpointKill at {}", FAILPOINTS[d.failpoint]),
            Kind::ClockJump => format!("ClockJump {} {}", clock_name(d.clock), JUMPS[d.jump].0),
        }
    }
}

/// The name of wall clock `i`: a node's, or the proxy's.
fn clock_name(i: usize) -> String {
    if i < NODES {
        format!("node-{}", i + 1)
    } else {
        "proxy".to_owned()
    }
}

/// Counts for the summary.
#[derive(Debug, Default)]
struct Stats {
    started: usize,
    kinds: BTreeMap<Kind, usize>,
    max_overlap: usize,
    failpoints_reached: BTreeMap<&'static str, usize>,
    failpoints_missed: usize,
    fence_checks: usize,
    jumps_seen: usize,
    jumps_unverified: usize,
    jumps_skipped: usize,
    batches: usize,
}

/// The soak's state: the scenario, the monitor, the schedule and what is in force.
struct Soak {
    s: Scenario,
    monitor: Monitor,
    rng: StdRng,
    seed: u64,
    ids: Vec<u64>,
    /// The wall clocks (nodes by position, then the proxy); empty without libfaketime.
    clocks: Vec<WallClock>,
    active: Vec<Cycle>,
    /// A drawn cycle the rules did not admit yet.
    pending: Option<Draw>,
    next_start: Instant,
    /// Nodes cut off by a partition cycle.
    partitioned: BTreeSet<u64>,
    /// Nodes whose sends are delayed, and by how much.
    slow: BTreeMap<u64, u64>,
    /// Nodes paused or killed: not asked anything until they are back.
    down: BTreeSet<u64>,
    /// The test faults each node has in force, as last set.
    in_force: BTreeMap<u64, FaultSpec>,
    stats: Stats,
    /// Violations found by the cycles themselves (failpoint fences, clock read-backs).
    violations: Vec<String>,
    started: Instant,
}

impl Soak {
    /// Runs cycles until `target` have started and every one has ended.
    async fn run_until(&mut self, target: usize) {
        loop {
            self.s.pump();
            self.end_due().await;
            self.push_faults().await;
            if self.stats.started < target {
                self.maybe_start();
            } else if self.active.is_empty() {
                return;
            }
            tokio::time::sleep(wait::POLL).await;
        }
    }

    /// Starts the next cycle if its time has come and the rules admit it.
    fn maybe_start(&mut self) {
        if self.active.len() >= MAX_IN_PROGRESS || Instant::now() < self.next_start {
            return;
        }
        let d = self.pending.take().unwrap_or_else(|| draw(&mut self.rng));
        if d.kind == Kind::ClockJump && self.clocks.is_empty() {
            // Not a cycle: the next one is drawn at once.
            self.stats.jumps_skipped += 1;
            return;
        }
        let node = if d.at_leader {
            self.monitor.leader().map_or(d.node, |l| l.node_id)
        } else {
            d.node
        };
        let targets = match d.kind {
            Kind::PauseNode => vec![Target::Node(node), Target::Worker(node)],
            Kind::PauseWorker => vec![Target::Worker(node)],
            Kind::KillNode | Kind::Partition | Kind::SlowLinks => vec![Target::Node(node)],
            Kind::FailpointKill | Kind::KillProxy => vec![Target::Proxy],
            Kind::SlowStorage => vec![Target::Storage],
            Kind::ClockJump => vec![Target::Clock(d.clock)],
        };
        let busy = self
            .active
            .iter()
            .any(|c| c.targets.iter().any(|t| targets.contains(t)));
        let impaired = self.active.iter().filter(|c| c.draw.kind.impairs()).count();
        if busy || (d.kind.impairs() && impaired >= (self.ids.len() - 1) / 2) {
            self.pending = Some(d);
            return;
        }
        self.start(d, node, targets);
    }

    /// Injects the fault of a new cycle.
    fn start(&mut self, d: Draw, node: u64, targets: Vec<Target>) {
        let now = Instant::now();
        let mut phase = Phase::Held;
        let mut until = now + d.hold;
        match d.kind {
            Kind::PauseNode => {
                self.s.workers[&node].guard.pause().unwrap();
                self.s.cluster.node(node).unwrap().guard.pause().unwrap();
                self.down.insert(node);
            }
            Kind::PauseWorker => self.s.workers[&node].guard.pause().unwrap(),
            Kind::KillNode => {
                self.s.cluster.node_mut(node).unwrap().kill9();
                self.down.insert(node);
            }
            Kind::Partition => {
                self.partitioned.insert(node);
            }
            Kind::SlowLinks => {
                self.slow.insert(node, d.delay_ms);
            }
            Kind::SlowStorage => self
                .s
                .upstream
                .delay(LEDGER, Duration::from_millis(d.delay_ms)),
            Kind::KillProxy => self.s.cluster.proxy.guard.kill9(),
            Kind::FailpointKill => {
                let failpoint = FAILPOINTS[d.failpoint];
                self.s
                    .cluster
                    .proxy
                    .restart_with_env(&[(FAILPOINT_STOP_ENV, failpoint)])
                    .unwrap();
                self.forget_faked_names();
                phase = Phase::Armed { seen: false };
                until = Instant::now() + ARMED_TIMEOUT;
            }
            Kind::ClockJump => self.clocks[d.clock].set(JUMPS[d.jump].0),
        }
        self.stats.started += 1;
        *self.stats.kinds.entry(d.kind).or_insert(0) += 1;
        let cycle = Cycle {
            n: self.stats.started,
            draw: d,
            node,
            targets,
            phase,
            until,
            started: now,
        };
        self.s.say(&format!(
            "+#{} {} (hold {} ms; {} in progress)",
            cycle.n,
            cycle.describe(),
            d.hold.as_millis(),
            self.active.len() + 1
        ));
        self.active.push(cycle);
        self.stats.max_overlap = self.stats.max_overlap.max(self.active.len());
        self.next_start = now + d.gap;
    }

    /// Moves armed failpoints on, and undoes the cycles whose time is up.
    async fn end_due(&mut self) {
        let mut i = 0;
        while i < self.active.len() {
            if let Phase::Armed { seen } = self.active[i].phase {
                self.watch_armed(i, seen);
            }
            if self.active[i].until <= Instant::now() {
                let cycle = self.active.remove(i);
                self.undo(cycle).await;
            } else {
                i += 1;
            }
        }
    }

    /// Whether the proxy stopped at cycle `i`'s armed failpoint; if so, the cycle holds it
    /// there for its hold.
    fn watch_armed(&mut self, i: usize, seen: bool) {
        let cycle = &mut self.active[i];
        let failpoint = FAILPOINTS[cycle.draw.failpoint];
        let proxy = &self.s.cluster.proxy;
        let lines = proxy.lines().drain();
        let seen = seen
            || lines
                .iter()
                .filter_map(|l| FailpointStop::parse(l))
                .any(|stop| stop.name == failpoint);
        cycle.phase = Phase::Armed { seen };
        if seen && proxy.guard.is_stopped() {
            cycle.phase = Phase::Stopped;
            cycle.until = Instant::now() + cycle.draw.hold;
            *self.stats.failpoints_reached.entry(failpoint).or_insert(0) += 1;
            let n = cycle.n;
            self.s
                .say(&format!("=#{n} the proxy stopped at {failpoint}"));
        }
    }

    /// Undoes a cycle's fault.
    async fn undo(&mut self, cycle: Cycle) {
        let node = cycle.node;
        let mut how = "ended";
        match cycle.draw.kind {
            Kind::PauseNode => {
                self.s.cluster.node(node).unwrap().guard.resume().unwrap();
                self.s.workers[&node].guard.resume().unwrap();
                self.down.remove(&node);
            }
            Kind::PauseWorker => self.s.workers[&node].guard.resume().unwrap(),
            Kind::KillNode => {
                self.s.cluster.node_mut(node).unwrap().restart().unwrap();
                self.forget_faked_names();
                // A fresh process has no test faults.
                self.in_force.insert(node, FaultSpec::default());
                self.down.remove(&node);
            }
            Kind::Partition => {
                self.partitioned.remove(&node);
            }
            Kind::SlowLinks => {
                self.slow.remove(&node);
            }
            Kind::SlowStorage => self.s.upstream.delay(LEDGER, Duration::ZERO),
            Kind::KillProxy => {
                self.s.cluster.proxy.restart().unwrap();
                self.forget_faked_names();
            }
            Kind::FailpointKill => {
                if cycle.phase == Phase::Stopped {
                    self.kill_at_failpoint(&cycle).await;
                } else {
                    how = "missed: no request reached the failpoint; disarmed";
                    self.stats.failpoints_missed += 1;
                    self.s.cluster.proxy.restart().unwrap();
                    self.forget_faked_names();
                }
            }
            Kind::ClockJump => {
                self.read_back_jump(&cycle).await;
                self.clocks[cycle.draw.clock].set("+0");
            }
        }
        self.s.say(&format!(
            "-#{} {} {how} after {} ms",
            cycle.n,
            cycle.describe(),
            cycle.started.elapsed().as_millis()
        ));
    }

    /// `kill -9` of the proxy stopped at the cycle's failpoint, a restart, and the check
    /// of `fault_proxy_crash`: the fence it comes back with is at least every token that
    /// reached the storage.
    async fn kill_at_failpoint(&mut self, cycle: &Cycle) {
        let failpoint = FAILPOINTS[cycle.draw.failpoint];
        self.s.cluster.proxy.guard.kill9();
        let reached = self
            .s
            .upstream
            .arrived()
            .iter()
            .filter_map(|a| a.token.as_deref()?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        self.s.cluster.proxy.restart().unwrap();
        self.forget_faked_names();
        let proxy = &self.s.cluster.proxy;
        let fence = wait::poll(STEP_TIMEOUT, || proxy.fence(DEFAULT_SCOPE)).await;
        match fence {
            Some(fence) if fence >= reached => self.stats.fence_checks += 1,
            Some(fence) => self.violations.push(format!(
                "cycle #{}: after kill -9 at {failpoint} the restarted proxy's fence {fence} is behind token {reached}, which reached the storage",
                cycle.n
            )),
            None => self.violations.push(format!(
                "cycle #{}: the proxy restarted after kill -9 at {failpoint} did not answer its fence within {STEP_TIMEOUT:?}",
                cycle.n
            )),
        }
    }

    /// Reads the jumped wall clock back before it is set back: it must show the jump.
    async fn read_back_jump(&mut self, cycle: &Cycle) {
        let i = cycle.draw.clock;
        let (offset, want) = JUMPS[cycle.draw.jump];
        let slack = Duration::from_secs(JUMP_CACHE_S + 5);
        let last: Cell<Option<f64>> = Cell::new(None);
        let seen = if i < NODES {
            let id = self.ids[i];
            if self.down.contains(&id) {
                None
            } else {
                let node = self.s.cluster.node(id).unwrap();
                let faults = self.desired(id);
                wait::poll(JUMP_READ, || async {
                    let o = node_wall_offset_s(node, &faults).await;
                    last.set(o.or(last.get()));
                    o.filter(|&o| offset_is(o, want, slack))
                })
                .await
            }
        } else if self
            .active
            .iter()
            .any(|c| c.targets.contains(&Target::Proxy))
        {
            None
        } else {
            let proxy = &self.s.cluster.proxy;
            wait::poll(JUMP_READ, || async {
                let o = proxy_wall_offset_s(proxy).await;
                last.set(o.or(last.get()));
                o.filter(|&o| offset_is(o, want, slack))
            })
            .await
        };
        match (seen, last.get()) {
            (Some(_), _) => self.stats.jumps_seen += 1,
            (None, None) => self.stats.jumps_unverified += 1,
            (None, Some(o)) => self.violations.push(format!(
                "cycle #{}: {}'s wall clock, stepped by {offset}, read {o:.1} s off the real time",
                cycle.n,
                clock_name(i)
            )),
        }
    }

    /// The test faults node `id` should have in force: cut off from every node when it is
    /// partitioned, from the partitioned nodes otherwise; its sends delayed when slow.
    fn desired(&self, id: u64) -> FaultSpec {
        let others = || self.ids.iter().copied().filter(move |&m| m != id);
        FaultSpec {
            drop: others()
                .filter(|m| self.partitioned.contains(&id) || self.partitioned.contains(m))
                .collect(),
            delay_ms: self
                .slow
                .get(&id)
                .map(|&d| others().map(|m| (m, d)).collect())
                .unwrap_or_default(),
        }
    }

    /// Sets the test faults of every node that is up and does not have what it should;
    /// whether every node now has them.
    async fn push_faults(&mut self) -> bool {
        let mut all = true;
        for id in self.ids.clone() {
            let want = self.desired(id);
            if self.in_force.get(&id) == Some(&want) {
                continue;
            }
            if self.down.contains(&id) {
                all = false;
                continue;
            }
            match self.s.cluster.node(id).unwrap().set_faults(&want).await {
                Ok(()) => {
                    self.in_force.insert(id, want);
                }
                Err(_) => all = false,
            }
        }
        all
    }

    /// Unlinks libfaketime's names of the processes as they run now (after a start).
    fn forget_faked_names(&self) {
        if !self.clocks.is_empty() {
            forget_cluster_names(&self.s.cluster);
        }
    }

    /// After a batch: heal, see a leader announced whose worker writes, check the whole
    /// history so far, the monitor and the logs; panic on any violation.
    async fn check_batch(&mut self) {
        let deadline = Instant::now() + STEP_TIMEOUT;
        while !self.push_faults().await {
            assert!(
                Instant::now() < deadline,
                "{NAME}: seed {}: the test faults could not be cleared within {STEP_TIMEOUT:?}",
                self.seed
            );
            tokio::time::sleep(wait::POLL).await;
        }
        let proxy = &self.s.cluster.proxy;
        if wait::poll(STEP_TIMEOUT, || proxy.fence(DEFAULT_SCOPE))
            .await
            .is_none()
        {
            panic!(
                "{NAME}: seed {} (replay with PALISADE_FAULT_SEED={}): after {} cycles, healed, the proxy (pid {}) has not answered its admin API for {STEP_TIMEOUT:?}; its threads (state, wait channel): {:?}",
                self.seed,
                self.seed,
                self.stats.started,
                proxy.guard.pid(),
                threads(proxy.guard.pid().as_raw())
            );
        }
        let leader = self.s.wait_announced_leader(0, None).await;
        let token = leader.token.unwrap();
        let acked = self.s.acked_with(token);
        self.s.wait_acked(token, acked + 1).await;
        let history = self.s.history_so_far().await;
        let report = history::check(&history);
        let (answers, mut violations) = self.monitor.violations();
        let (elections, logged) = term_violations(&self.s.cluster);
        violations.extend(logged);
        violations.extend(self.violations.iter().cloned());
        self.stats.batches += 1;
        self.s.say(&format!(
            "batch {} checked after {} cycles: node {} leads in term {} (fence {token}), its worker writes; {}; {elections} elections, {answers} leadership answers, {} term, fence and cycle violations",
            self.stats.batches,
            self.stats.started,
            leader.node_id,
            leader.term,
            report.summary(),
            violations.len()
        ));
        if !report.holds() || !violations.is_empty() {
            eprintln!(
                "{}",
                summary(
                    self.seed,
                    self.started,
                    &self.stats,
                    &report,
                    elections,
                    violations.len()
                )
            );
            panic!(
                "{NAME}: seed {} (replay with PALISADE_FAULT_SEED={}): after {} cycles: {report}\n{violations:#?}",
                self.seed, self.seed, self.stats.started
            );
        }
    }
}

/// Each thread of process `pid`: its name, state and kernel wait channel (from
/// `/proc`), to tell a process stopped (`T`) from one blocked (`S` and where).
fn threads(pid: i32) -> Vec<String> {
    let read = |path: std::path::PathBuf| std::fs::read_to_string(path).unwrap_or_default();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return vec![format!("no /proc/{pid}/task")];
    };
    tasks
        .flatten()
        .map(|task| {
            let stat = read(task.path().join("stat"));
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("?")
                .to_owned();
            format!(
                "{} {state} {}",
                read(task.path().join("comm")).trim(),
                read(task.path().join("wchan")).trim()
            )
        })
        .collect()
}

/// The summary line.
fn summary(
    seed: u64,
    started: Instant,
    stats: &Stats,
    report: &Report,
    elections: usize,
    violations: usize,
) -> String {
    let secs = started.elapsed().as_secs_f64();
    #[allow(clippy::cast_precision_loss)]
    let per_hour = stats.started as f64 * 3600.0 / secs.max(1e-3);
    format!(
        "{NAME}: seed {seed}, {} cycles in {secs:.0} s ({per_hour:.0} cycles/hour), {} batches checked; kinds {:?}; max {} in progress; failpoints reached {:?}, missed {}, fence checked after {} kills at a failpoint; clock jumps read back {}, unverified {}, skipped {}; {}; {elections} elections; {} violations",
        stats.started,
        stats.batches,
        stats.kinds,
        stats.max_overlap,
        stats.failpoints_reached,
        stats.failpoints_missed,
        stats.fence_checks,
        stats.jumps_seen,
        stats.jumps_unverified,
        stats.jumps_skipped,
        report.summary(),
        violations + report.violations.len()
    )
}

/// Goal: whatever overlapping mix of pauses, kills (at failpoints too), partitions, slow
/// links, a slow storage and wall-clock jumps happens, within a minority of the nodes at
/// a time, the storage never applies a lower token after a higher one, every
/// acknowledged write is applied once and no rejected one is, no term has two leaders or
/// goes back, the fence never goes down (nor behind a token that reached the storage
/// after a kill at a failpoint), a jumped wall clock is seen where it was jumped, and the
/// cluster recovers after every batch. Method: the cycles and checks of the module
/// documentation, `PALISADE_SOAK_CYCLES` cycles (default 40), checked every 100 (every 20
/// by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_fault_cycles_never_break_fencing() {
    crate::use_tested_binary();
    palisade_cluster::require_failpoints().unwrap_or_else(|e| panic!("{e}"));
    let cycles: usize = std::env::var(CYCLES_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CYCLES);
    let seed = fault_seed(NAME);
    let clock_dir = tempfile::tempdir().unwrap();
    let lib = match libfaketime() {
        Ok(_) => Some(require_libfaketime()),
        Err(why) => {
            eprintln!("{NAME}: clock jumps SKIPPED (everything else runs): {why}");
            None
        }
    };
    let clocks: Vec<WallClock> = match &lib {
        Some(_) => (0..=NODES)
            .map(|i| WallClock::new(clock_dir.path(), &clock_name(i)))
            .collect(),
        None => Vec::new(),
    };
    let prefix = |i: usize| match &lib {
        Some(lib) => clocks[i].prefix(lib),
        None => Vec::new(),
    };
    let mut s = Scenario::start(&ScenarioSpec {
        job_ms: 50,
        node_prefixes: (1..=NODES as u64)
            .map(|id| (id, prefix(usize::try_from(id - 1).unwrap())))
            .filter(|(_, p)| !p.is_empty())
            .collect(),
        proxy_prefix: prefix(NODES),
        ..ScenarioSpec::default()
    })
    .await;
    let monitor = Monitor::start(&s.cluster, POLL);
    s.wait_announced_leader(0, None).await;
    let ids = s.cluster.ids();
    let mut soak = Soak {
        in_force: ids.iter().map(|&id| (id, FaultSpec::default())).collect(),
        ids,
        s,
        monitor,
        rng: StdRng::seed_from_u64(seed),
        seed,
        clocks,
        active: Vec::new(),
        pending: None,
        next_start: Instant::now(),
        partitioned: BTreeSet::new(),
        slow: BTreeMap::new(),
        down: BTreeSet::new(),
        stats: Stats::default(),
        violations: Vec::new(),
        started: Instant::now(),
    };
    soak.forget_faked_names();
    let batch = BATCH.min(cycles.div_ceil(2)).max(1);
    eprintln!(
        "{NAME}: {cycles} cycles ({CYCLES_ENV}), the whole history checked every {batch}, at most {MAX_IN_PROGRESS} in progress"
    );
    while soak.stats.started < cycles {
        let target = (soak.stats.started + batch).min(cycles);
        soak.run_until(target).await;
        soak.check_batch().await;
    }

    let (_, mut violations) = soak.monitor.violations();
    let (elections, logged) = term_violations(&soak.s.cluster);
    violations.extend(logged);
    violations.extend(soak.violations.iter().cloned());
    let Soak {
        s, stats, started, ..
    } = soak;
    let report = s.finish(NAME);
    eprintln!(
        "{}",
        summary(seed, started, &stats, &report, elections, violations.len())
    );
    assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
    assert_eq!(stats.started, cycles);
}
