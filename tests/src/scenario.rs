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
//! [`Monitor`] polls every node's leadership and the proxy's fence in the background;
//! [`term_violations`] checks its observations and the nodes' JSON logs for a term that
//! two leaders held, or a node whose term went back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Method;
use palisade_cluster::history::{self, History, Outcome, Recorder, Report};
use palisade_cluster::worker::{Event, WorkerLine, WorkerProcess, WorkerSpec};
use palisade_cluster::{Cluster, ClusterOptions, ClusterSpec};
use palisade_protocol::process::{EVENT_FIELD, FAILPOINT_STOP_ENV, TEST_FAULTS_ENV, events};
use palisade_protocol::{DEFAULT_SCOPE, LeaderView, headers};

use crate::netns::NetnsNet;
use crate::upstream::RecordingUpstream;
use crate::wait;

/// Generous bound on an election plus its announcement, on a loaded 2-core machine.
pub const ELECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on one worker's job once it may go on.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(20);
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
    /// the proxy on the test side of it) when given.
    pub async fn start_on(spec: &ScenarioSpec, net: Option<NetnsNet>) -> Self {
        if spec.stop_workers {
            palisade_cluster::require_failpoints().unwrap_or_else(|e| panic!("{e}"));
        }
        let dir = tempfile::Builder::new()
            .prefix("palisade-t60-")
            .tempdir()
            .unwrap();
        let upstream = RecordingUpstream::start().await;
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
            ..ClusterOptions::default()
        };
        if let Some(net) = &net {
            options.node_hosts = net.node_hosts();
            options.proxy_host = net.host_ip();
        }
        let cluster = Cluster::start_with(dir.path(), &cluster_spec, &options)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut workers = BTreeMap::new();
        for node in cluster.nodes.iter().filter(|_| spec.workers) {
            let spec = WorkerSpec {
                name: writer(node.id()),
                node_url: node.api_url(""),
                proxy_url: cluster.proxy.url(""),
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

    /// Pumps until `check` holds, or panics naming `what` after `timeout`.
    pub async fn pump_until<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&Self) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            self.pump();
            if let Some(v) = check(self) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}"
            );
            tokio::time::sleep(wait::POLL).await;
        }
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
            wait::until(
                &format!("worker {id} to be stopped"),
                STEP_TIMEOUT,
                || async { worker.guard.is_stopped().then_some(()) },
            )
            .await;
        }
        self.pump();
    }

    /// Waits until held worker `id` is stopped at the failpoint, and returns its job.
    pub async fn wait_stopped(&mut self, id: u64) -> Holding {
        assert!(self.held.contains(&id), "worker {id} is not held");
        self.pump_until(
            &format!("worker {id} to stop at {CLIENT_FAILPOINT}"),
            STEP_TIMEOUT,
            |s| {
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
            |s| {
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
    /// the proxy's fence equals: elected, established and announced. Pumps meanwhile.
    pub async fn wait_announced_leader(&mut self, above: u64, except: Option<u64>) -> LeaderView {
        let deadline = Instant::now() + ELECTION_TIMEOUT;
        loop {
            self.pump();
            if let Some(l) = self.cluster.established_leader(except).await
                && l.term > above
                && self.cluster.proxy_fence(DEFAULT_SCOPE).await == l.token
            {
                return l;
            }
            assert!(
                Instant::now() < deadline,
                "no leader above term {above} was announced at the proxy within {ELECTION_TIMEOUT:?}"
            );
            tokio::time::sleep(wait::POLL).await;
        }
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

/// One node's answer, as the [`Monitor`] saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When.
    pub at: Instant,
    /// What the node said.
    pub leadership: LeaderView,
}

/// Longest one poll of the [`Monitor`] waits for an answer: a paused node must not hold
/// up the polls of the others for long.
const MONITOR_QUERY_TIMEOUT: Duration = Duration::from_millis(500);

/// Polls every node's leadership and the proxy's fence in the background, to check terms
/// and fences over a whole run.
pub struct Monitor {
    seen: Arc<Mutex<Vec<Seen>>>,
    fences: Arc<Mutex<Vec<u64>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Monitor {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Monitor {
    /// Starts polling `cluster`'s nodes (through their API clients, whose addresses
    /// survive restarts) and its proxy's fence every `period`.
    pub fn start(cluster: &Cluster, period: Duration) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let fences = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for node in &cluster.nodes {
            let api = node.api().clone().timeout(MONITOR_QUERY_TIMEOUT);
            let seen = Arc::clone(&seen);
            tasks.push(tokio::spawn(async move {
                loop {
                    if let Ok(leadership) = api.leader().await {
                        seen.lock().unwrap().push(Seen {
                            at: Instant::now(),
                            leadership,
                        });
                    }
                    tokio::time::sleep(period).await;
                }
            }));
        }
        let admin = cluster
            .proxy
            .admin_client()
            .clone()
            .timeout(MONITOR_QUERY_TIMEOUT);
        let fences_task = Arc::clone(&fences);
        tasks.push(tokio::spawn(async move {
            loop {
                if let Ok(fence) = admin.fence(DEFAULT_SCOPE).await {
                    fences_task.lock().unwrap().push(fence.token);
                }
                tokio::time::sleep(period).await;
            }
        }));
        Self {
            seen,
            fences,
            tasks,
        }
    }

    /// Every answer so far, in the order each node gave them.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Violations in what was seen: a term held by two established leaders, a node whose
    /// term went back, or the proxy's fence going down; and, so that a run in which the
    /// polls never got through cannot pass, no answer from the nodes or no fence reading
    /// at all. With the count of answers.
    pub fn violations(&self) -> (usize, Vec<String>) {
        let seen: Vec<LeaderView> = self.seen().into_iter().map(|s| s.leadership).collect();
        let fences = self.fences.lock().unwrap().clone();
        let mut out = view_violations(&seen, &fences);
        if seen.is_empty() {
            out.push("the monitor got no leadership answer from any node".to_owned());
        }
        if fences.is_empty() {
            out.push("the monitor got no fence reading from the proxy".to_owned());
        }
        (seen.len(), out)
    }
}

/// Violations in leadership answers (each node's in the order it gave them) and in the
/// proxy's fence readings (in order): a term with two established leaders, a node whose
/// term went back, the fence going down.
pub fn view_violations(seen: &[LeaderView], fences: &[u64]) -> Vec<String> {
    let mut out = Vec::new();
    let mut leaders: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    for l in seen {
        if let Some(token) = l.token {
            leaders.entry(token).or_default().insert(l.node_id);
        }
        if let Some(&before) = last.get(&l.node_id)
            && l.term < before
        {
            out.push(format!(
                "node {} answered term {} after term {before}",
                l.node_id, l.term
            ));
        }
        last.insert(l.node_id, l.term);
    }
    for (term, nodes) in leaders {
        if nodes.len() > 1 {
            out.push(format!(
                "term {term} had established leaders {nodes:?} (seen over the API)"
            ));
        }
    }
    for pair in fences.windows(2) {
        if pair[1] < pair[0] {
            out.push(format!(
                "the proxy's fence went down from {} to {}",
                pair[0], pair[1]
            ));
        }
    }
    out
}

/// The node's log events whose `term` the checks read. Every one of them carries a term
/// that is already durable when it is logged (its start loads the stored term; the others
/// are published only after the `Ready` carrying their term is persisted), so a node that
/// logged one of them can never come back from a `kill -9` below it. Lines without an
/// `event` field (raft's own lines, a token withdrawn before its term is persisted) may
/// show a term a `kill -9` loses, rightly, and are not read.
pub const TERM_EVENTS: [&str; 4] = [
    events::NODE_STARTED,
    events::LEADERSHIP_CHANGED,
    events::LEADER_ESTABLISHED,
    events::TOKEN_ANNOUNCED,
];

/// Term violations in the nodes' JSON logs (see [`log_violations`]).
pub fn term_violations(cluster: &Cluster) -> (usize, Vec<String>) {
    let logs: BTreeMap<u64, Vec<String>> =
        cluster.nodes.iter().map(|n| (n.id(), n.logs())).collect();
    log_violations(&logs)
}

/// Term violations in nodes' JSON logs (by node id, one log per start, oldest first),
/// with the number of established leaderships found. Events are recognised by their
/// structured `event` field (names from [`events`]), never by message text:
/// - a term in which two nodes became established leaders ([`events::LEADER_ESTABLISHED`]);
/// - a node that started (after a `kill -9`) at a lower term than one it had logged before
///   (every term in [`TERM_EVENTS`] is already durable when logged);
/// - a start that logged no [`events::NODE_STARTED`]: the checks would otherwise pass on
///   logs that hold no events at all (a changed log format, an empty file).
pub fn log_violations(logs: &BTreeMap<u64, Vec<String>>) -> (usize, Vec<String>) {
    let mut out = Vec::new();
    let mut leaders: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    let mut established = 0;
    if logs.is_empty() {
        out.push("no node logs to check".to_owned());
    }
    for (&id, starts) in logs {
        let mut highest = 0_u64;
        for (start, log) in starts.iter().enumerate() {
            let mut started = false;
            for (event, term) in log.lines().filter_map(term_event) {
                if event == events::NODE_STARTED {
                    started = true;
                    if term < highest {
                        out.push(format!(
                            "node {id} restarted (start {start}) at term {term} after logging term {highest}"
                        ));
                    }
                }
                if event == events::LEADER_ESTABLISHED {
                    established += 1;
                    leaders.entry(term).or_default().insert(id);
                }
                highest = highest.max(term);
            }
            if !started {
                out.push(format!(
                    "node {id} (start {start}) logged no `{EVENT_FIELD}={}` line: its log cannot be checked",
                    events::NODE_STARTED
                ));
            }
        }
    }
    for (term, nodes) in leaders {
        if nodes.len() > 1 {
            out.push(format!(
                "term {term} had established leaders {nodes:?} (from the logs)"
            ));
        }
    }
    (established, out)
}

/// The event name and term of a JSON log line that is one of [`TERM_EVENTS`].
fn term_event(line: &str) -> Option<(&'static str, u64)> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = &v["fields"];
    let name = fields[EVENT_FIELD].as_str()?;
    let event = TERM_EVENTS.into_iter().find(|&e| e == name)?;
    Some((event, fields["term"].as_u64()?))
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

#[cfg(test)]
mod tests {
    use palisade_protocol::Role;

    use super::*;

    fn view(node_id: u64, term: u64, token: Option<u64>) -> LeaderView {
        LeaderView {
            node_id,
            scope: palisade_protocol::Scope::default(),
            term,
            leader_id: None,
            role: if token.is_some() {
                Role::Leader
            } else {
                Role::Follower
            },
            token,
            announced: token.is_some(),
        }
    }

    /// Goal: each view check fires on a made-up violation and not on a clean run.
    /// Method: hand-made leadership views and fence readings.
    #[test]
    fn view_checks_catch_reused_terms_terms_going_back_and_fences_going_down() {
        let clean = [view(1, 2, Some(2)), view(2, 2, None), view(2, 3, Some(3))];
        assert!(view_violations(&clean, &[1, 2, 2, 3]).is_empty());
        let twice = [view(1, 2, Some(2)), view(2, 2, Some(2))];
        assert!(view_violations(&twice, &[])[0].contains("term 2 had established leaders"));
        let back = [view(1, 5, None), view(1, 4, None)];
        assert!(view_violations(&back, &[])[0].contains("answered term 4 after term 5"));
        assert!(view_violations(&[], &[3, 2])[0].contains("fence went down from 3 to 2"));
    }

    fn line(event: &str, term: u64) -> String {
        serde_json::json!({"level":"INFO","fields":{"message":"prose the checks ignore",EVENT_FIELD:event,"term":term}}).to_string()
    }

    /// Goal: each log check fires on a made-up violation and not on a clean run; lines
    /// without an `event` field are ignored whatever their message says. Method: hand-made
    /// JSON lines in the format of the nodes' logs.
    #[test]
    fn log_checks_catch_reused_terms_and_restarts_at_a_lower_term() {
        let started = |term| line(events::NODE_STARTED, term);
        let established = |term| line(events::LEADER_ESTABLISHED, term);
        let withdrawn = serde_json::json!({"fields":{"message":"token withdrawn","term":9}});
        let clean = BTreeMap::from([
            (
                1,
                vec![
                    [started(0), established(1)].join("\n"),
                    [started(1), withdrawn.to_string()].join("\n"),
                ],
            ),
            (2, vec![[started(0), established(2)].join("\n")]),
        ]);
        assert_eq!(log_violations(&clean), (2, Vec::new()));

        let reused = BTreeMap::from([
            (1, vec![[started(0), established(3)].join("\n")]),
            (2, vec![[started(0), established(3)].join("\n")]),
        ]);
        assert!(log_violations(&reused).1[0].contains("term 3 had established leaders {1, 2}"));

        let lost = BTreeMap::from([(
            1,
            vec![
                [started(0), line(events::LEADERSHIP_CHANGED, 4)].join("\n"),
                started(3),
            ],
        )]);
        assert!(log_violations(&lost).1[0].contains("restarted (start 1) at term 3"));
    }

    /// Goal: logs without events fail the check instead of passing it: prose messages
    /// alone (the old format), an empty log, or no logs at all. Method: check such logs.
    #[test]
    fn log_checks_fail_when_no_events_were_logged() {
        let prose = serde_json::json!({"fields":{"message":"node started","term":1}}).to_string();
        let (count, violations) = log_violations(&BTreeMap::from([(1, vec![prose])]));
        assert_eq!(count, 0);
        assert!(
            violations[0].contains("logged no `event=node-started` line"),
            "{violations:?}"
        );
        let (_, violations) = log_violations(&BTreeMap::from([(1, vec![String::new()])]));
        assert_eq!(violations.len(), 1, "{violations:?}");
        let (_, violations) = log_violations(&BTreeMap::new());
        assert_eq!(violations, vec!["no node logs to check".to_owned()]);
    }
}
