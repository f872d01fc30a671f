//! The demo's state while it runs: the cluster, a worker beside each node (or, with
//! `--sessions`, a session worker per node) and what the workers report, and the steps
//! the timeline waits for (a leader announced at every proxy, a worker in the middle of a
//! job, its end), the pause and resume of a node with its worker, and the ledger as the
//! store holds it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use palisade_cluster::{ChildGuard, Cluster, LeaderView, WRITER_CERT_NAME, spawn_until_line, wait};
use palisade_protocol::process::WORKER_READY_LINE;
use serde::Deserialize;

use super::session_worker::{Line, SessionEvent};
use super::verdict::{Entry, Observed};
use super::worker::{self, Event};
use super::{SCORES_WAIT, SESSION_SCOPE, STEP_TIMEOUT, store};
use crate::Failure;

/// The demo's state: the cluster, workers, and what was seen so far.
pub(super) struct Demo {
    started: Instant,
    pub(super) cluster: Cluster,
    pub(super) workers: BTreeMap<u64, Worker>,
    pub(super) observed: Observed,
    /// The fleet's shared store, when the demo runs more than one proxy.
    store: Option<store::DemoStore>,
    /// Token to the workers whose writes with it were accepted.
    pub(super) writers: BTreeMap<u64, BTreeSet<String>>,
    pub(super) rejections: Vec<String>,
    /// The session workers' grants, in the order they were reported: (worker, token).
    pub(super) grants: Vec<(u64, u64)>,
}

pub(super) struct Worker {
    pub(super) guard: ChildGuard,
    lines: mpsc::Receiver<String>,
    /// The token of the last `holding` event, and when the demo read it.
    holding: Option<(u64, Instant)>,
    /// Whether it reported a write outcome since the last `holding`.
    finished_job: bool,
    /// A session worker's reason to stop, once it reported one.
    pub(super) lost: Option<String>,
}

impl Demo {
    /// The state of a demo whose cluster (and, in a fleet, shared store) runs, before
    /// any worker starts.
    pub(super) fn new(
        started: Instant,
        cluster: Cluster,
        store: Option<store::DemoStore>,
        observed: Observed,
    ) -> Self {
        Self {
            started,
            cluster,
            workers: BTreeMap::new(),
            observed,
            store,
            writers: BTreeMap::new(),
            rejections: Vec::new(),
            grants: Vec::new(),
        }
    }

    /// One line per node with its score, as the leader's view shows them (waiting up to
    /// [`SCORES_WAIT`] for every node's first measurement).
    pub(super) async fn show_scores(&mut self, leader: u64) {
        let deadline = Instant::now() + SCORES_WAIT;
        let mut view = None;
        while Instant::now() < deadline {
            self.pump();
            let Some(node) = self.cluster.nodes.iter().find(|n| n.id() == leader) else {
                break;
            };
            view = node.leadership().await;
            let known = view
                .as_ref()
                .and_then(|v| v.scores.as_ref())
                .map_or(0, BTreeMap::len);
            if known >= self.cluster.nodes.len() {
                break;
            }
            tokio::time::sleep(wait::POLL).await;
        }
        let oracle = view
            .as_ref()
            .and_then(|v| v.score_oracle.clone())
            .unwrap_or_else(|| palisade_election::SCORE_ORACLE_OFF.to_owned());
        let scores = view.and_then(|v| v.scores).unwrap_or_default();
        let ids: Vec<u64> = self.cluster.ids();
        for id in ids {
            let what = match scores.get(&id.to_string()) {
                Some(score) => format!(
                    "score {score:.2} ({oracle}: minus the round trip to the proxies in ms; higher is better){}",
                    if id == leader { ", the leader" } else { "" }
                ),
                None => format!("score unknown ({oracle})"),
            };
            self.say(&format!("node {id}"), &what);
        }
    }

    pub(super) fn say(&self, who: &str, what: &str) {
        println!(
            "[{:>6.2}s] {who:<8} {what}",
            self.started.elapsed().as_secs_f64()
        );
    }

    /// How the demo names proxy `i` (by position): "proxy" alone, "proxy N" in a fleet.
    pub(super) fn proxy_name(&self, i: usize) -> String {
        if self.cluster.fleet.is_empty() {
            "proxy".to_owned()
        } else {
            format!("proxy {}", i + 1)
        }
    }

    /// The proxy (by position) the worker of node `id` writes through.
    pub(super) fn worker_proxy(&self, id: u64) -> usize {
        usize::try_from(id.saturating_sub(1)).unwrap_or(0) % self.cluster.proxies().len()
    }

    pub(super) fn start_workers(&mut self, dir: &std::path::Path) -> Result<(), Failure> {
        let nodes: Vec<(u64, String)> = self
            .cluster
            .nodes
            .iter()
            .map(|n| (n.id(), n.api_url("")))
            .collect();
        for (id, api) in nodes {
            let proxy = self
                .cluster
                .proxy_at(self.worker_proxy(id))
                .unwrap_or(&self.cluster.proxy)
                .url("");
            let mut args = vec![
                "demo-worker".to_owned(),
                "--node".to_owned(),
                api,
                "--proxy".to_owned(),
                proxy,
                "--name".to_owned(),
                format!("w{id}"),
            ];
            args.extend(self.worker_tls_args());
            self.spawn_worker(id, &args, dir)?;
        }
        let through = if self.cluster.fleet.is_empty() {
            String::new()
        } else {
            let names: Vec<String> = self
                .cluster
                .nodes
                .iter()
                .map(|n| {
                    format!(
                        "worker {} through {}",
                        n.id(),
                        self.proxy_name(self.worker_proxy(n.id()))
                    )
                })
                .collect();
            format!(" ({})", names.join(", "))
        };
        self.say(
            "workers",
            &format!(
                "{} started, one beside each node{through}",
                self.workers.len()
            ),
        );
        Ok(())
    }

    /// The TLS flags of a worker in a secure cluster (its CA, the writers' certificate);
    /// none otherwise.
    pub(super) fn worker_tls_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(trust) = &self.cluster.trust {
            for (flag, path) in [
                ("--ca", trust.ca()),
                ("--cert", trust.cert(WRITER_CERT_NAME)),
                ("--key", trust.key(WRITER_CERT_NAME)),
            ] {
                args.push(flag.to_owned());
                args.push(path.display().to_string());
            }
        }
        args
    }

    /// Starts worker `id` (`palisade <args>`, with its log in `dir`) and waits until it is
    /// ready.
    pub(super) fn spawn_worker(
        &mut self,
        id: u64,
        args: &[String],
        dir: &std::path::Path,
    ) -> Result<(), Failure> {
        let log = dir.join(format!("worker-{id}.log"));
        let (guard, _, lines) =
            spawn_until_line(args, &log, WORKER_READY_LINE, &format!("worker {id}"))
                .map_err(|e| Failure::Runtime(e.to_string()))?;
        self.workers.insert(
            id,
            Worker {
                guard,
                lines,
                holding: None,
                finished_job: true,
                lost: None,
            },
        );
        Ok(())
    }

    /// Reads every worker's new events and prints them.
    pub(super) fn pump(&mut self) {
        let mut said = Vec::new();
        for (id, worker) in &mut self.workers {
            while let Ok(line) = worker.lines.try_recv() {
                let event = match serde_json::from_str::<Line>(&line) {
                    Ok(Line::Job(event)) => event,
                    Ok(Line::Session(event)) => {
                        said.push(session_event(*id, worker, event, &mut self.grants));
                        continue;
                    }
                    Err(_) => continue,
                };
                event.record(&format!("w{id}"), &mut self.observed.recorder);
                match event {
                    Event::Ready => {}
                    Event::Holding { token, .. } => {
                        worker.holding = Some((token, Instant::now()));
                        worker.finished_job = false;
                    }
                    Event::Wrote {
                        key,
                        token,
                        revision,
                        ..
                    } => {
                        worker.finished_job = true;
                        self.writers
                            .entry(token)
                            .or_default()
                            .insert(format!("worker {id}"));
                        said.push((
                            format!("worker {id}"),
                            format!("wrote {key} with token {token} (revision {revision})"),
                        ));
                    }
                    Event::Rejected {
                        key,
                        token,
                        current,
                        ..
                    } => {
                        worker.finished_job = true;
                        let proxy = if self.cluster.fleet.is_empty() {
                            "the proxy's".to_owned()
                        } else {
                            let i = usize::try_from(id.saturating_sub(1)).unwrap_or(0)
                                % (self.cluster.fleet.len() + 1);
                            format!("proxy {}'s", i + 1)
                        };
                        let line = format!(
                            "worker {id}'s write {key} with token {token} rejected: 409, {proxy} fence is {current}"
                        );
                        self.rejections.push(line.clone());
                        said.push(("REJECTED".to_owned(), line));
                    }
                    Event::NotLeader { key, token, .. } => {
                        worker.finished_job = true;
                        said.push((
                            format!("worker {id}"),
                            format!(
                                "did not send {key} with token {token}: its node no longer leads"
                            ),
                        ));
                    }
                    Event::Failed {
                        key, token, cause, ..
                    } => {
                        worker.finished_job = true;
                        said.push((
                            format!("worker {id}"),
                            format!("write {key} with token {token} failed: {cause}"),
                        ));
                    }
                }
            }
        }
        for (who, what) in said {
            self.say(&who, &what);
        }
    }

    pub(super) async fn pump_for(&mut self, duration: Duration) {
        let end = Instant::now() + duration;
        while Instant::now() < end {
            self.pump();
            tokio::time::sleep(wait::POLL).await;
        }
        self.pump();
    }

    pub(super) async fn wait_for_announced_leader(
        &mut self,
        above: u64,
        except: Option<u64>,
    ) -> Result<LeaderView, Failure> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            self.pump();
            if let Some(l) = self.cluster.established_leader(except).await
                && l.term > above
                && self.fences_at(l.token).await
            {
                return Ok(l);
            }
            if Instant::now() > deadline {
                return Err(Failure::Runtime(format!(
                    "no leader with a token above {above} was announced at every proxy within {STEP_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(wait::POLL).await;
        }
    }

    /// Whether every proxy's fence is `token`.
    async fn fences_at(&self, token: Option<u64>) -> bool {
        for proxy in self.cluster.proxies() {
            if proxy.fence("default").await != token {
                return false;
            }
        }
        true
    }

    /// Waits until worker `id` has just started a job with `token`: read at most
    /// [`HOLDING_FRESH`] ago, so that a pause now lands in the job's work, before its
    /// write. A job started earlier (its `holding` read while the demo was busy with
    /// something else) may be writing already: a pause then would catch the write in
    /// flight, and the resumed worker would find its session lost before any stale write.
    pub(super) async fn wait_for_holding(&mut self, id: u64, token: u64) -> Result<(), Failure> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            self.pump();
            if let Some(w) = self.workers.get(&id)
                && w.holding
                    .is_some_and(|(t, read)| t == token && read.elapsed() < HOLDING_FRESH)
                && !w.finished_job
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Failure::Runtime(format!(
                    "worker {id} never started a job with token {token}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    pub(super) async fn wait_for_job_end(&mut self, id: u64) -> Result<(), Failure> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            self.pump();
            if self.workers.get(&id).is_none_or(|w| w.finished_job) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Failure::Runtime(format!(
                    "worker {id} did not finish its job after the resume"
                )));
            }
            tokio::time::sleep(wait::POLL).await;
        }
    }

    pub(super) async fn wait_for_follower(&mut self, id: u64, term: u64) -> Option<LeaderView> {
        let node = self.cluster.node(id)?;
        wait::poll(STEP_TIMEOUT, || async {
            node.leadership()
                .await
                .filter(|l| l.term >= term && l.token.is_none())
        })
        .await
    }

    /// Stops (`SIGSTOP`) or continues (`SIGCONT`) worker `id` alone.
    pub(super) fn signal_worker(&self, id: u64, stop: bool) -> Result<(), Failure> {
        let worker = self
            .workers
            .get(&id)
            .ok_or_else(|| Failure::Runtime(format!("no worker {id}")))?;
        let signalled = if stop {
            worker.guard.pause()
        } else {
            worker.guard.resume()
        };
        signalled.map_err(|e| Failure::Runtime(e.to_string()))
    }

    pub(super) fn pause(&self, id: u64) -> Result<(), Failure> {
        self.signal_pair(id, true)
    }

    pub(super) fn resume(&self, id: u64) -> Result<(), Failure> {
        self.signal_pair(id, false)
    }

    /// Stops or continues a node and its worker together, worker first on pause (so it
    /// cannot notice its node stopping) and node first on resume.
    fn signal_pair(&self, id: u64, stop: bool) -> Result<(), Failure> {
        let err = |e: palisade_cluster::ClusterError| Failure::Runtime(e.to_string());
        let node = self
            .cluster
            .node(id)
            .ok_or_else(|| Failure::Runtime(format!("no node {id}")))?;
        let worker = self
            .workers
            .get(&id)
            .ok_or_else(|| Failure::Runtime(format!("no worker {id}")))?;
        if stop {
            worker.guard.pause().map_err(err)?;
            node.guard.pause().map_err(err)
        } else {
            node.guard.resume().map_err(err)?;
            worker.guard.resume().map_err(err)
        }
    }

    pub(super) fn stop_workers(&mut self) {
        for w in self.workers.values_mut() {
            w.guard.kill9();
        }
        self.pump();
    }

    /// The ledger as the store holds it, in apply order: the fleet's shared store's
    /// whole apply log, or the listing of the proxy's embedded store.
    pub(super) async fn ledger(&self) -> Result<Vec<Entry>, Failure> {
        #[derive(Deserialize)]
        struct Listing {
            keys: Vec<Listed>,
            truncated: bool,
        }
        #[derive(Deserialize)]
        struct Listed {
            key: String,
            token: u64,
            revision: u64,
        }
        if let Some(store) = &self.store {
            return Ok(store.ledger(worker::LEDGER_PREFIX));
        }
        let path = format!("/{}?list", worker::LEDGER_PREFIX);
        // A plain read: it carries no token, so the token given here is never sent.
        let client = palisade_client::FencedClient::with_token(&self.cluster.proxy.url(""), 0)
            .map_err(|e| Failure::Runtime(e.to_string()))?;
        let answer = client
            .get(&path)
            .await
            .map_err(|e| Failure::Runtime(format!("cannot list the ledger: {e}")))?;
        let listing: Listing = serde_json::from_slice(&answer.body)
            .map_err(|e| Failure::Runtime(format!("cannot read the ledger listing: {e}")))?;
        if listing.truncated {
            return Err(Failure::Runtime(
                "the ledger is longer than one listing; the verdict needs all of it".to_owned(),
            ));
        }
        Ok(listing
            .keys
            .into_iter()
            .map(|k| Entry {
                key: k.key,
                token: k.token,
                revision: k.revision,
            })
            .collect())
    }
}

/// Records a session worker's event about its session, and what the demo says about it.
fn session_event(
    id: u64,
    worker: &mut Worker,
    event: SessionEvent,
    grants: &mut Vec<(u64, u64)>,
) -> (String, String) {
    let what = match event {
        SessionEvent::Opened { session, ttl_ms } => format!(
            "opened session {} (TTL {:.2}s) and campaigns for scope {SESSION_SCOPE}",
            session.get(..SESSION_ID_SHOWN).unwrap_or(&session),
            Duration::from_millis(ttl_ms).as_secs_f64()
        ),
        SessionEvent::Granted { scope, token } => {
            grants.push((id, token));
            format!("granted scope {scope} with token {token}")
        }
        SessionEvent::Lost { cause } => {
            let what = format!("stops because {cause}");
            worker.lost = Some(cause);
            what
        }
    };
    (format!("worker {id}"), what)
}

/// How many characters of a session id the demo prints: enough to tell the sessions apart.
const SESSION_ID_SHOWN: usize = 8;

/// How recently a worker's job must have started for [`Demo::wait_for_holding`]: a
/// third of a job's work ([`worker::JOB_MS`]), which leaves the rest for the pause's
/// signal to arrive before the write.
const HOLDING_FRESH: Duration = Duration::from_millis(worker::JOB_MS / 3);
