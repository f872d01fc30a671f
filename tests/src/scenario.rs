//! Fault scenarios on real processes: `palisade node`s (with test faults on), a `palisade
//! proxy` in front of the [recording upstream](crate::upstream), a worker beside each node
//! (`palisade demo-worker`), and the history of every write, checked at the end.
//!
//! Workers may be started stopping at the `client-before-send` failpoint before every
//! write (`PALISADE_FAILPOINT_STOP`). The scenario then decides, worker by worker, whether
//! a stopped write goes on at once ([`Scenario::pump`] continues it) or waits
//! ([`Scenario::hold`], then [`Scenario::release`]): that is how a test freezes the
//! leader's client between reading its token and sending, for as long as it likes.
//!
//! The term and fence checks over a whole run are in [`crate::terms`].

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use http::Method;
use palisade_cluster::history::{self, History, Outcome, Recorder, Report};
use palisade_cluster::worker::{Event, WorkerLine, WorkerProcess, WorkerSpec};
use palisade_cluster::{Cluster, ClusterOptions, ClusterSpec, Fleet};
use palisade_protocol::process::{FAILPOINT_STOP_ENV, TEST_FAULTS_ENV};
use palisade_protocol::{DEFAULT_SCOPE, LeaderView, headers};

use crate::netns::NetnsNet;
use crate::upstream::RecordingUpstream;
use palisade_cluster::wait;

/// Generous bound on an election plus its announcement, on a loaded 2-core machine.
pub const ELECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on one worker's job once it may go on.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on one probe write ([`Scenario::probe`]): longer than a fleet proxy's bounded
/// wait for a lease renewal, so a refused write is seen as its 503, not as a timeout.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// The failpoint between reading the token and sending the write.
pub const CLIENT_FAILPOINT: &str = "client-before-send";

/// How to set up a scenario.
#[derive(Debug, Clone)]
pub struct ScenarioSpec {
    /// Election nodes.
    pub nodes: usize,
    /// Whether a worker runs beside each node.
    pub workers: bool,
    /// raft tick of the nodes.
    pub tick_ms: u64,
    /// How long a worker's job takes between reading its token and writing.
    pub job_ms: u64,
    /// Whether workers stop at `client-before-send` before every write.
    pub stop_workers: bool,
    /// Further proxy flags.
    pub proxy_flags: Vec<String>,
    /// A fleet of proxies in fleet mode instead of one proxy. The worker of node N
    /// writes through proxy `(N - 1) % proxies` ([`Scenario::worker_proxy`]), so with as
    /// many proxies as nodes an old leader's write and a new leader's go through
    /// different proxies.
    pub fleet: Option<Fleet>,
    /// Per node id, a command that runs its binary (`env LD_PRELOAD=... FAKETIME=...`:
    /// a node on a faked clock, see [`crate::clock`]); absent: run directly. Not with
    /// network namespaces, whose prefix is `ip netns exec`. (A fleet's proxies take
    /// theirs from [`Fleet::proxy_hosts`].)
    pub node_prefixes: BTreeMap<u64, Vec<String>>,
    /// A command that runs the (standalone) proxy's binary, as [`Self::node_prefixes`]
    /// for the nodes; empty: run it directly.
    pub proxy_prefix: Vec<String>,
}

impl ScenarioSpec {
    /// The defaults, with workers that stop at `client-before-send` before every write.
    pub fn stopping_workers() -> Self {
        Self {
            stop_workers: true,
            ..Self::default()
        }
    }
}

impl Default for ScenarioSpec {
    fn default() -> Self {
        Self {
            nodes: 3,
            workers: true,
            tick_ms: 20,
            job_ms: 20,
            stop_workers: false,
            proxy_flags: Vec::new(),
            fleet: None,
            node_prefixes: BTreeMap::new(),
            proxy_prefix: Vec::new(),
        }
    }
}

/// What a worker holds for its current job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    /// The job's number.
    pub seq: u64,
    /// The token it read.
    pub token: u64,
}

/// A cluster, a recording upstream, workers, and the history so far.
pub struct Scenario {
    /// The workers, by node id (worker of node N is named `wN`). Dropped first.
    pub workers: BTreeMap<u64, WorkerProcess>,
    /// Nodes and proxy.
    pub cluster: Cluster,
    /// The storage behind the proxy.
    pub upstream: RecordingUpstream,
    /// Every write attempted, by workers and by the test itself.
    pub recorder: Recorder,
    /// Each worker's current job.
    pub holding: BTreeMap<u64, Holding>,
    /// Workers stopped at the failpoint that were not continued yet.
    stopped: BTreeSet<u64>,
    /// Workers to keep stopped at the failpoint.
    held: BTreeSet<u64>,
    /// Proxies (by position) that [`Scenario::wait_announced_leader`] does not ask: a
    /// test adds those it paused, killed or cut off.
    pub skip_proxies: BTreeSet<usize>,
    /// The last sequence number of each proxy's probe writer ([`Scenario::probe`]).
    probes: BTreeMap<usize, u64>,
    /// Jobs whose outcome a worker reported: (node id, seq).
    completed: BTreeSet<(u64, u64)>,
    /// The network namespaces the nodes run in, if any; removed after the processes.
    pub net: Option<NetnsNet>,
    /// When the scenario started, for the timeline.
    pub started: Instant,
    /// The test's name, for the timeline (tests of a binary run in parallel).
    name: String,
    /// Data and logs; removed last.
    pub dir: tempfile::TempDir,
}

/// The proxy (by position, of `proxies`) the worker of node `id` writes through.
fn worker_proxy_of(id: u64, proxies: usize) -> usize {
    usize::try_from(id.saturating_sub(1)).unwrap_or(0) % proxies.max(1)
}

/// The worker name of node `id`.
pub fn writer(id: u64) -> String {
    format!("w{id}")
}

impl Scenario {
    /// Starts the upstream, the proxy, the nodes (with `PALISADE_TEST_FAULTS=1` and JSON
    /// logs) and a worker beside each node.
    pub async fn start(spec: &ScenarioSpec) -> Self {
        Self::start_on(spec, None).await
    }

    /// [`start`](Self::start), with each node in its own network namespace of `net` (and
    /// the proxy on the test side of it) when given. With a fleet and more namespaces than
    /// nodes, the namespaces after the nodes' hold the proxies, one each (the others stay
    /// on the test side); the recording upstream listens on the test side.
    pub async fn start_on(spec: &ScenarioSpec, net: Option<NetnsNet>) -> Self {
        if spec.stop_workers {
            palisade_cluster::require_failpoints().unwrap_or_else(|e| panic!("{e}"));
        }
        let dir = tempfile::Builder::new()
            .prefix("palisade-t60-")
            .tempdir()
            .unwrap();
        // With namespaces, the upstream listens on the test side of their bridge, which
        // proxies inside a namespace of their own reach as well as those outside.
        let upstream = match &net {
            Some(net) => RecordingUpstream::start_on(net.host_ip()).await,
            None => RecordingUpstream::start().await,
        };
        let mut proxy_flags = vec!["--upstream".to_owned(), upstream.url()];
        proxy_flags.extend(spec.proxy_flags.iter().cloned());
        let cluster_spec = ClusterSpec {
            nodes: spec.nodes,
            node_flags: [
                "--tick-ms",
                &spec.tick_ms.to_string(),
                "--log-format",
                "json",
            ]
            .iter()
            .map(ToString::to_string)
            .collect(),
            proxy_flags,
        };
        let mut options = ClusterOptions {
            node_env: vec![(TEST_FAULTS_ENV.to_owned(), "1".to_owned())],
            fleet: spec.fleet.clone(),
            proxy_prefix: spec.proxy_prefix.clone(),
            ..ClusterOptions::default()
        };
        if !spec.node_prefixes.is_empty() {
            assert!(
                net.is_none(),
                "node prefixes and network namespaces do not mix"
            );
            options.node_hosts = (1..=spec.nodes as u64)
                .map(|id| palisade_cluster::NodeHost {
                    ip: std::net::Ipv4Addr::LOCALHOST.into(),
                    prefix: spec.node_prefixes.get(&id).cloned().unwrap_or_default(),
                })
                .collect();
        }
        if let Some(net) = &net {
            let hosts = net.node_hosts();
            options.node_hosts.clone_from(&hosts);
            options.proxy_host = net.host_ip();
            // Namespaces beyond the nodes' hold the fleet's proxies, one each.
            if let Some(fleet) = &mut options.fleet {
                for (i, host) in hosts.into_iter().skip(spec.nodes).enumerate() {
                    fleet.proxy_hosts.insert(i, host);
                }
            }
        }
        let cluster = crate::process::start_cluster(dir.path(), &cluster_spec, &options);
        let mut workers = BTreeMap::new();
        let proxies = cluster.proxies().len();
        for node in cluster.nodes.iter().filter(|_| spec.workers) {
            let through = worker_proxy_of(node.id(), proxies);
            let spec = WorkerSpec {
                name: writer(node.id()),
                node_url: node.api_url(""),
                proxy_url: cluster.proxy_at(through).unwrap().url(""),
                job_ms: Some(spec.job_ms),
                retries: Some(0),
                env: if spec.stop_workers {
                    vec![(FAILPOINT_STOP_ENV.to_owned(), CLIENT_FAILPOINT.to_owned())]
                } else {
                    Vec::new()
                },
            };
            let worker = WorkerProcess::start(dir.path(), &spec).unwrap_or_else(|e| panic!("{e}"));
            workers.insert(node.id(), worker);
        }
        Self {
            workers,
            cluster,
            upstream,
            recorder: Recorder::default(),
            holding: BTreeMap::new(),
            stopped: BTreeSet::new(),
            held: BTreeSet::new(),
            skip_proxies: BTreeSet::new(),
            probes: BTreeMap::new(),
            completed: BTreeSet::new(),
            net,
            started: Instant::now(),
            name: std::thread::current()
                .name()
                .unwrap_or("scenario")
                .to_owned(),
            dir,
        }
    }

    /// The proxy (by position) the worker of node `id` writes through.
    pub fn worker_proxy(&self, id: u64) -> usize {
        worker_proxy_of(id, self.cluster.proxies().len())
    }

    /// Whether every proxy not in [`Scenario::skip_proxies`] has its fence at `token`.
    pub async fn fences_at(&self, token: Option<u64>) -> bool {
        for (i, proxy) in self.cluster.proxies().into_iter().enumerate() {
            if !self.skip_proxies.contains(&i) && proxy.fence(DEFAULT_SCOPE).await != token {
                return false;
            }
        }
        true
    }

    /// Sends one fenced PUT with `token` through proxy `i` (by position) as the writer
    /// `probe-<i>`, records it in the history (invoked, then its outcome), and returns
    /// when it was sent and the answer. Bounded by [`PROBE_TIMEOUT`].
    pub async fn probe(
        &mut self,
        i: usize,
        token: u64,
    ) -> (
        Instant,
        palisade_cluster::Result<palisade_cluster::client::Answer>,
    ) {
        let writer = format!("probe-{i}");
        let seq = {
            let n = self.probes.entry(i).or_insert(0);
            *n += 1;
            *n
        };
        let base = self.cluster.proxy_at(i).unwrap().url("");
        self.recorder
            .invoke(palisade_cluster::worker::WORKER_SCOPE, token, &writer, seq);
        let sent = Instant::now();
        let answer = tagged_put(
            &base,
            &format!("/probe/{writer}-{seq:06}"),
            token,
            &writer,
            seq,
            PROBE_TIMEOUT,
        )
        .await;
        self.recorder.complete(&writer, seq, outcome_of(&answer));
        (sent, answer)
    }

    /// Prints one timeline line.
    pub fn say(&self, what: &str) {
        eprintln!(
            "[{:>7.2}s {}] {what}",
            self.started.elapsed().as_secs_f64(),
            self.name
        );
    }

    /// Reads every worker's new lines: records events, and continues each worker stopped
    /// at the failpoint unless it is held. Never waits.
    pub fn pump(&mut self) {
        let lines: Vec<(u64, Vec<WorkerLine>)> =
            self.workers.iter().map(|(&id, w)| (id, w.poll())).collect();
        self.take_lines(lines);
        self.continue_stopped();
    }

    /// Records worker lines.
    fn take_lines(&mut self, lines: Vec<(u64, Vec<WorkerLine>)>) {
        for (id, lines) in lines {
            for line in lines {
                match line {
                    WorkerLine::Event(event) => {
                        event.record(&writer(id), &mut self.recorder);
                        match &event {
                            Event::Holding { seq, token, .. } => {
                                self.holding.insert(
                                    id,
                                    Holding {
                                        seq: *seq,
                                        token: *token,
                                    },
                                );
                            }
                            Event::Rejected {
                                seq,
                                token,
                                current,
                                ..
                            } => {
                                self.completed.insert((id, *seq));
                                eprintln!(
                                    "[{:>7.2}s {}] REJECTED w{id}#{seq} with token {token}: 409, fence {current}",
                                    self.started.elapsed().as_secs_f64(),
                                    self.name
                                );
                            }
                            other => {
                                if let Some((seq, _)) = other.outcome() {
                                    self.completed.insert((id, seq));
                                }
                            }
                        }
                    }
                    WorkerLine::Stopped(_) => {
                        self.stopped.insert(id);
                    }
                    WorkerLine::Other(_) => {}
                }
            }
        }
    }

    /// Continues stopped workers that are not held, once the kernel shows them stopped
    /// (a SIGCONT sent before the SIGSTOP lands would be lost).
    fn continue_stopped(&mut self) {
        let go: Vec<u64> = self
            .stopped
            .iter()
            .copied()
            .filter(|id| !self.held.contains(id))
            .collect();
        for id in go {
            if let Some(w) = self.workers.get(&id)
                && w.guard.is_stopped()
            {
                w.guard.resume().unwrap();
                self.stopped.remove(&id);
            }
        }
    }

    /// Pumps the workers, then asks `check` of the scenario, every [`wait::POLL`] until it
    /// returns `Some`; panics naming `what` after `timeout`.
    #[allow(clippy::await_holding_refcell_ref)]
    pub async fn pump_until<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        check: impl AsyncFn(&Self) -> Option<T>,
    ) -> T {
        // Each round pumps (`&mut self`) and then checks (`&self`, across the check's
        // awaits); `wait::poll` runs one round at a time, so the cell's borrows never
        // overlap (hence the lint's allowance above).
        let this = RefCell::new(self);
        wait::poll(timeout, || async {
            this.borrow_mut().pump();
            check(&this.borrow()).await
        })
        .await
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
    }

    /// Pumps until at least `n` writes with `token` were acknowledged, within
    /// [`STEP_TIMEOUT`].
    pub async fn wait_acked(&mut self, token: u64, n: usize) {
        self.pump_until(
            &format!("{n} acknowledged writes with token {token}"),
            STEP_TIMEOUT,
            async |s| (s.acked_with(token) >= n).then_some(()),
        )
        .await;
    }

    /// Keeps worker `id` stopped the next time (or now, if it is) at the failpoint.
    pub fn hold(&mut self, id: u64) {
        self.held.insert(id);
    }

    /// Stops holding worker `id`, and continues it if it is stopped at the failpoint.
    pub async fn release(&mut self, id: u64) {
        self.held.remove(&id);
        if self.stopped.contains(&id) {
            let worker = &self.workers[&id];
            wait::poll(STEP_TIMEOUT, || async {
                worker.guard.is_stopped().then_some(())
            })
            .await
            .unwrap_or_else(|| panic!("timed out waiting for worker {id} to be stopped"));
        }
        self.pump();
    }

    /// Freezes the writer of `leader` (an announced leader) at `client-before-send`, after
    /// `acked` acknowledged writes with its token; the job it holds, asserted to carry that
    /// token.
    pub async fn freeze_leaders_writer(&mut self, leader: &LeaderView, acked: usize) -> Holding {
        let (id, token) = (
            leader.node_id,
            leader.token.expect("an announced leader's token"),
        );
        self.wait_acked(token, acked).await;
        self.hold(id);
        let job = self.wait_stopped(id).await;
        assert_eq!(job.token, token, "the frozen job holds the leader's token");
        job
    }

    /// Resumes the paused node `id` and releases its held worker; the outcome of the job
    /// `seq` it was frozen in.
    pub async fn resume_and_release(&mut self, id: u64, seq: u64) -> Outcome {
        self.cluster.node(id).unwrap().guard.resume().unwrap();
        self.release(id).await;
        self.wait_outcome(id, seq).await
    }

    /// Waits until held worker `id` is stopped at the failpoint, and returns its job.
    pub async fn wait_stopped(&mut self, id: u64) -> Holding {
        assert!(self.held.contains(&id), "worker {id} is not held");
        self.pump_until(
            &format!("worker {id} to stop at {CLIENT_FAILPOINT}"),
            STEP_TIMEOUT,
            async |s| {
                (s.stopped.contains(&id) && s.workers[&id].guard.is_stopped())
                    .then(|| s.holding.get(&id).copied())
                    .flatten()
            },
        )
        .await
    }

    /// Waits until worker `id` reported the outcome of job `seq`; returns it.
    pub async fn wait_outcome(&mut self, id: u64, seq: u64) -> Outcome {
        self.pump_until(
            &format!("worker {id}'s job {seq} to end"),
            STEP_TIMEOUT,
            async |s| {
                s.completed
                    .contains(&(id, seq))
                    .then(|| s.recorder.get(&writer(id), seq).map(|o| o.outcome))
                    .flatten()
            },
        )
        .await
    }

    /// Acknowledged writes with `token`.
    pub fn acked_with(&self, token: u64) -> usize {
        self.recorder
            .ops()
            .iter()
            .filter(|o| o.outcome == Outcome::Ok && o.token == token)
            .count()
    }

    /// Waits for an established leader above term `above` (skipping `except`) whose token
    /// the proxy's fence equals (every proxy's in a fleet, but for
    /// [`Scenario::skip_proxies`]): elected, established and announced. Pumps meanwhile.
    pub async fn wait_announced_leader(&mut self, above: u64, except: Option<u64>) -> LeaderView {
        self.pump_until(
            &format!("a leader above term {above} announced at the proxies"),
            ELECTION_TIMEOUT,
            async |s| {
                let l = s.cluster.established_leader(except).await?;
                (l.term > above && s.fences_at(l.token).await).then_some(l)
            },
        )
        .await
    }

    /// Pumps for `duration`: lets the workers write.
    pub async fn run_for(&mut self, duration: Duration) {
        let end = Instant::now() + duration;
        while Instant::now() < end {
            self.pump();
            tokio::time::sleep(wait::POLL).await;
        }
        self.pump();
    }

    /// The history so far, taken while the workers keep writing, in a form the checker
    /// can judge: the operations as recorded now, then the apply log (so every write
    /// acknowledged in the first is applied in the second), then the operation of each
    /// applied write whose worker's `holding` line had not been read yet (its line is on
    /// its way: pumped for, within [`STEP_TIMEOUT`]; one still missing after that is left
    /// for the checker to report as unrecorded).
    pub async fn history_so_far(&mut self) -> History {
        self.pump();
        let mut ops: BTreeMap<(String, u64), history::Op> = self
            .recorder
            .ops()
            .into_iter()
            .map(|op| ((op.writer.clone(), op.seq), op))
            .collect();
        let applied = self.upstream.apply_log();
        let unread = |s: &Self| {
            applied
                .iter()
                .any(|a| s.recorder.get(&a.writer, a.seq).is_none())
        };
        let deadline = Instant::now() + STEP_TIMEOUT;
        while unread(self) && Instant::now() < deadline {
            tokio::time::sleep(wait::POLL).await;
            self.pump();
        }
        for a in &applied {
            let name = (a.writer.clone(), a.seq);
            if !ops.contains_key(&name)
                && let Some(op) = self.recorder.get(&a.writer, a.seq)
            {
                ops.insert(name, op.clone());
            }
        }
        History {
            ops: ops.into_values().collect(),
            applied,
        }
    }

    /// The history so far: every recorded operation, and the upstream's apply log.
    pub fn history(&self) -> History {
        History {
            ops: self.recorder.ops(),
            applied: self.upstream.apply_log(),
        }
    }

    /// Ends the scenario: kills the workers (their unanswered writes stay indeterminate),
    /// checks the history, prints its counts, and panics on any violation.
    pub fn finish(mut self, name: &str) -> Report {
        self.pump();
        let lines: Vec<(u64, Vec<WorkerLine>)> = self
            .workers
            .iter_mut()
            .map(|(&id, w)| (id, w.kill9_and_drain()))
            .collect();
        self.take_lines(lines);
        let report = history::check(&self.history());
        eprintln!("{name}: history: {}", report.summary());
        assert!(report.holds(), "{name}: {report}");
        report
    }
}

/// The seed of a randomized scenario: `PALISADE_FAULT_SEED` if set (to replay a run),
/// else one drawn from the clock. Printed, with how to replay it.
pub fn fault_seed(name: &str) -> u64 {
    let seed = std::env::var("PALISADE_FAULT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
    eprintln!("{name}: seed {seed} (replay the fault schedule with PALISADE_FAULT_SEED={seed})");
    seed
}

/// A fenced PUT of `base` + `path` carrying the writer's name and sequence number (the
/// headers the recording upstream logs for the history checker), bounded by `timeout`.
pub async fn tagged_put(
    base: &str,
    path: &str,
    token: u64,
    writer: &str,
    seq: u64,
    timeout: Duration,
) -> palisade_cluster::Result<palisade_cluster::client::Answer> {
    let (t, q) = (token.to_string(), seq.to_string());
    palisade_cluster::client::try_send_within(
        Method::PUT,
        &format!("{base}{path}"),
        &[
            (headers::FENCING_TOKEN.as_str(), &t),
            (palisade_cluster::worker::WRITER_HEADER, writer),
            (palisade_cluster::worker::SEQ_HEADER, &q),
        ],
        format!("{writer} {seq}"),
        timeout,
    )
    .await
}

/// What a client may conclude from a write's answer: 2xx applied, 409 rejected, another
/// 4xx refused; anything else (5xx, no answer) may or may not have been applied.
pub fn outcome_of(answer: &palisade_cluster::Result<palisade_cluster::client::Answer>) -> Outcome {
    match answer {
        Ok(a) if a.status.is_success() => Outcome::Ok,
        Ok(a) if a.status == http::StatusCode::CONFLICT => Outcome::Rejected,
        Ok(a) if a.status.is_client_error() => Outcome::Failed,
        _ => Outcome::Indeterminate,
    }
}
