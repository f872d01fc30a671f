//! `palisade demo`: a local cluster, a proxy on its embedded store, a worker beside each
//! node, a GC-paused leader, and a verdict on what the store applied.
//!
//! The timeline: start everything; let the leader's worker write ledger entries; pause
//! the leader's node and its worker with `SIGSTOP` while the worker holds its token (a
//! GC pause in the middle of a job); wait for a new leader and its token at the proxy;
//! resume both with `SIGCONT`; the old worker finishes its job and writes with its old
//! token, and the proxy rejects it. Then check the ledger in the store.
//!
//! With `--proxies N` (N > 1) the demo runs a fleet: N proxies in fleet mode
//! (`--cluster`, leases from nodes started with `--lease-ms`) in front of one shared
//! store that fences nothing itself ([`store`]). The worker of node K writes through
//! proxy `(K - 1) % N`, so the paused leader's write goes through a different proxy from
//! the new leader's, and is still rejected.

mod store;
mod verdict;
pub(crate) mod worker;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use palisade_cluster::{
    CLIENT_CERT_NAME, ChildGuard, Cluster, ClusterOptions, ClusterSpec, Fleet, LeaderView,
    spawn_until_line, wait,
};
use palisade_protocol::process::WORKER_READY_LINE;
use serde::Deserialize;

use crate::Failure;
use verdict::{Entry, Observed};
use worker::Event;

/// Fewest nodes: a quorum must survive the pause of one.
const NODES_MIN: usize = 3;
/// Most nodes the demo starts on one machine.
const NODES_MAX: usize = 7;
/// The demo nodes' `--score-margin`, in milliseconds of round trip: far above the
/// differences between loopback round trips, even of a debug build on a busy machine, so
/// noise never moves leadership while the demo runs (equal scores go to the lower id).
const DEMO_SCORE_MARGIN_MS: f64 = 50.0;
/// Longest wait for every node's score to reach the leader's view.
const SCORES_WAIT: Duration = Duration::from_secs(5);
/// Longest wait for a leader, a failover, or a worker's answer.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the first leader's worker writes before the pause.
const WARMUP: Duration = Duration::from_secs(2);
/// How long the new leader's worker writes after the resume.
const COOLDOWN: Duration = Duration::from_secs(1);
/// Most proxies the demo starts in a fleet on one machine.
const PROXIES_MAX: usize = 5;
/// A fleet's lease, in raft ticks: well above the nodes' floor of three heartbeat
/// intervals (one tick each by default), so renewals every third of it keep up on a
/// loaded machine, and short enough that a failover with a release wait stays quick.
const LEASE_TICKS: u64 = 10;

/// Run the demonstration: a cluster, a proxy, workers, a GC-paused stale leader, a verdict.
#[derive(Args)]
pub(crate) struct DemoArgs {
    /// Number of election nodes (3 to 7).
    #[arg(long, default_value_t = 3, env = "PALISADE_DEMO_NODES")]
    nodes: usize,
    /// How long the leader stays paused, in seconds.
    #[arg(long, default_value_t = 5.0, env = "PALISADE_DEMO_PAUSE")]
    pause: f64,
    /// raft tick in milliseconds for the nodes.
    #[arg(long, default_value_t = 100)]
    tick_ms: u64,
    /// Number of proxies (1 to 5). More than one runs a fleet: proxies in fleet mode
    /// holding leases from the cluster, in front of one shared store.
    #[arg(long, default_value_t = 1, env = "PALISADE_DEMO_PROXIES")]
    proxies: usize,
    /// Keep the temporary directory (data and logs) instead of removing it.
    #[arg(long)]
    keep: bool,
    /// Run without the trust mechanisms (unsigned tokens, plaintext peers and node APIs,
    /// no admin token), as before they existed. By default the demo runs secure.
    #[arg(long)]
    insecure_demo: bool,
}

/// The demo's state: the cluster, workers, and what was seen so far.
struct Demo {
    started: Instant,
    cluster: Cluster,
    workers: BTreeMap<u64, Worker>,
    observed: Observed,
    /// The fleet's shared store, when the demo runs more than one proxy.
    store: Option<store::DemoStore>,
    /// Token to the workers whose writes with it were accepted.
    writers: BTreeMap<u64, BTreeSet<String>>,
    rejections: Vec<String>,
}

struct Worker {
    guard: ChildGuard,
    lines: mpsc::Receiver<String>,
    /// The token of the last `holding` event.
    holding: Option<u64>,
    /// Whether it reported a write outcome since the last `holding`.
    finished_job: bool,
}

pub(crate) async fn run(args: DemoArgs) -> Result<(), Failure> {
    crate::children_run_this_binary()?;
    if !(NODES_MIN..=NODES_MAX).contains(&args.nodes) {
        return Err(Failure::Usage(format!(
            "--nodes {} is out of range: {NODES_MIN} to {NODES_MAX}",
            args.nodes
        )));
    }
    if !(1..=PROXIES_MAX).contains(&args.proxies) {
        return Err(Failure::Usage(format!(
            "--proxies {} is out of range: 1 to {PROXIES_MAX}",
            args.proxies
        )));
    }
    if !(args.pause.is_finite() && (0.5..=120.0).contains(&args.pause)) {
        return Err(Failure::Usage(format!(
            "--pause {} is out of range: 0.5 to 120 seconds",
            args.pause
        )));
    }
    let dir = tempfile::Builder::new()
        .prefix("palisade-demo-")
        .tempdir()
        .map_err(|e| Failure::Runtime(format!("cannot create a temporary directory: {e}")))?;
    let path = dir.path().to_owned();
    let outcome = tokio::select! {
        outcome = demo(&args, path.clone()) => outcome,
        () = crate::shutdown_signal() => Err(Failure::Runtime("interrupted; every process was stopped".to_owned())),
    };
    // Every child was killed when the demo's state was dropped above.
    if args.keep {
        let kept = dir.keep();
        println!("data and logs kept in {}", kept.display());
    }
    outcome
}

async fn demo(args: &DemoArgs, dir: PathBuf) -> Result<(), Failure> {
    let runtime = |e: palisade_cluster::ClusterError| Failure::Runtime(e.to_string());
    let pause = Duration::from_secs_f64(args.pause);
    let fleet = args.proxies > 1;
    if fleet {
        println!(
            "palisade demo: {} nodes, a fleet of {} proxies in front of one store, a worker beside each node; pause {:.1}s",
            args.nodes, args.proxies, args.pause
        );
    } else {
        println!(
            "palisade demo: {} nodes, 1 proxy on its embedded store, a worker beside each node; pause {:.1}s",
            args.nodes, args.pause
        );
    }
    println!("  (data and logs in {})", dir.display());
    let started = Instant::now();
    let store = if fleet {
        Some(
            store::DemoStore::start()
                .await
                .map_err(|e| Failure::Runtime(format!("cannot start the demo's store: {e}")))?,
        )
    } else {
        None
    };
    let lease_ms = LEASE_TICKS * args.tick_ms;
    let spec = ClusterSpec {
        nodes: args.nodes,
        node_flags: vec![
            "--tick-ms".to_owned(),
            args.tick_ms.to_string(),
            // Leaders placed by score: each node measures its round trip to the proxies.
            "--score-oracle".to_owned(),
            "storage-rtt".to_owned(),
            "--score-margin".to_owned(),
            DEMO_SCORE_MARGIN_MS.to_string(),
        ],
        proxy_flags: store
            .as_ref()
            .map(|s| vec!["--upstream".to_owned(), s.url()])
            .unwrap_or_default(),
    };
    let options = ClusterOptions {
        secure: !args.insecure_demo,
        fleet: fleet.then(|| Fleet::new(args.proxies, lease_ms)),
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start_with(&dir, &spec, &options).map_err(runtime)?;
    if fleet {
        println!(
            "  fleet: every proxy holds a lease of {lease_ms} ms on the current term (renewed from the cluster); a new leader's token is released once every proxy accepted its term, or once every lease certainly expired"
        );
        println!(
            "  fleet: the store behind the proxies fences nothing itself: what it applied is what the fleet admitted"
        );
    }
    if cluster.trust.is_some() {
        println!(
            "  secure: signed fencing tokens (nodes sign with token.key, the proxy checks proofs with token.pub)"
        );
        println!(
            "  secure: peer mutual TLS between nodes, and an https node API that requires client certificates"
        );
        println!("  secure: the proxy's admin API requires a bearer token (admin.token)");
    } else {
        println!(
            "  insecure (--insecure-demo): unsigned tokens, plaintext peers and node APIs, no admin token"
        );
    }
    println!();
    let mut demo = Demo {
        started,
        cluster,
        workers: BTreeMap::new(),
        observed: Observed::default(),
        store,
        writers: BTreeMap::new(),
        rejections: Vec::new(),
    };
    for (i, proxy) in demo.cluster.proxies().into_iter().enumerate() {
        demo.say(
            &demo.proxy_name(i),
            &format!("listening on {} (admin {})", proxy.addr, proxy.admin),
        );
    }
    for node in &demo.cluster.nodes {
        demo.say(
            &format!("node {}", node.id()),
            &format!("started, API {}", node.spec.api),
        );
    }
    demo.start_workers(&dir)?;

    // The first leader.
    let first = demo.wait_for_announced_leader(0, None).await?;
    let old_token = first.token.unwrap_or(first.term);
    let leader = first.node_id;
    demo.observed.old_token = old_token;
    demo.say(
        "leader",
        &format!(
            "node {leader} established with token {old_token}; {} {old_token}",
            if fleet {
                "every proxy's fence is"
            } else {
                "the proxy's fence is"
            }
        ),
    );
    demo.show_scores(leader).await;
    demo.pump_for(WARMUP).await;

    // The pause: wait until the leader's worker holds its token in the middle of a job,
    // then stop the node and its worker together.
    demo.wait_for_holding(leader, old_token).await?;
    let old_proxy = demo.worker_proxy(leader);
    let paused_at = Instant::now();
    demo.pause(leader)?;
    demo.say(
        "PAUSE",
        &format!(
            "SIGSTOP node {leader} and its worker while it holds token {old_token} (a GC pause)"
        ),
    );

    // A new leader, and its token at the proxy.
    let next = demo
        .wait_for_announced_leader(old_token, Some(leader))
        .await?;
    let failover = paused_at.elapsed();
    let new_token = next.token.unwrap_or(next.term);
    demo.observed.new_token = Some(new_token);
    let new_proxy = demo.worker_proxy(next.node_id);
    demo.say(
        "leader",
        &format!(
            "node {} established with token {new_token}; {} {new_token} (failover {:.2}s after SIGSTOP)",
            next.node_id,
            if fleet {
                "every proxy's fence is"
            } else {
                "the proxy's fence is"
            },
            failover.as_secs_f64()
        ),
    );
    if fleet {
        demo.say(
            "fleet",
            &format!(
                "node {leader}'s worker writes through {}, node {}'s through {}",
                demo.proxy_name(old_proxy),
                next.node_id,
                demo.proxy_name(new_proxy)
            ),
        );
    }

    // Resume the old leader after the rest of its pause.
    demo.pump_for(pause.saturating_sub(paused_at.elapsed()))
        .await;
    demo.resume(leader)?;
    demo.say(
        "RESUME",
        &format!(
            "SIGCONT node {leader} and its worker; it still believes it holds token {old_token}"
        ),
    );
    demo.wait_for_job_end(leader).await?;
    if let Some(l) = demo.wait_for_follower(leader, new_token).await {
        demo.say(
            &format!("node {leader}"),
            &format!(
                "now {} in term {}, leader {}",
                l.role,
                l.term,
                l.leader_id
                    .map_or_else(|| "unknown".to_owned(), |id| id.to_string())
            ),
        );
    }
    demo.pump_for(COOLDOWN).await;
    demo.stop_workers();

    // The verdict, on the ledger as the store applied it.
    let ledger = demo.ledger().await?;
    let verdict = verdict::check(&ledger, &demo.observed);
    println!("\nSummary");
    println!("  writes in the ledger, per token (store's view):");
    print!(
        "{}",
        verdict::per_token_lines(&verdict.per_token, &demo.writers)
    );
    println!(
        "  rejections: {} (the paused leader's stale write {})",
        demo.rejections.len(),
        if verdict.stale_write_rejected {
            "was rejected"
        } else {
            "was NOT seen rejected"
        }
    );
    for r in &demo.rejections {
        println!("    {r}");
    }
    if fleet {
        println!(
            "  fleet: the paused leader's write went through {}, the new leader's through {}{}",
            demo.proxy_name(old_proxy),
            demo.proxy_name(new_proxy),
            if old_proxy == new_proxy {
                " (the same proxy: more nodes than proxies)"
            } else {
                " (different proxies)"
            }
        );
    }
    println!(
        "  failover: {:.2}s from SIGSTOP of node {leader} until token {new_token} was announced at the {}",
        failover.as_secs_f64(),
        if fleet { "proxies" } else { "proxy" }
    );
    if verdict.holds() {
        println!(
            "  verdict: HOLDS. {} ledger entries in apply order: tokens never decrease, no write with token {old_token} landed after token {new_token}, every acknowledged write is stored, no rejected write is.",
            ledger.len()
        );
        Ok(())
    } else {
        println!("  verdict: VIOLATED. {}", verdict.report.summary());
        for v in &verdict.violations {
            println!("    - {v}");
        }
        Err(Failure::Runtime("the verdict does not hold".to_owned()))
    }
}

impl Demo {
    /// One line per node with its score, as the leader's view shows them (waiting up to
    /// [`SCORES_WAIT`] for every node's first measurement).
    async fn show_scores(&mut self, leader: u64) {
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

    fn say(&self, who: &str, what: &str) {
        println!(
            "[{:>6.2}s] {who:<8} {what}",
            self.started.elapsed().as_secs_f64()
        );
    }

    /// How the demo names proxy `i` (by position): "proxy" alone, "proxy N" in a fleet.
    fn proxy_name(&self, i: usize) -> String {
        if self.cluster.fleet.is_empty() {
            "proxy".to_owned()
        } else {
            format!("proxy {}", i + 1)
        }
    }

    /// The proxy (by position) the worker of node `id` writes through.
    fn worker_proxy(&self, id: u64) -> usize {
        usize::try_from(id.saturating_sub(1)).unwrap_or(0) % self.cluster.proxies().len()
    }

    fn start_workers(&mut self, dir: &std::path::Path) -> Result<(), Failure> {
        for node in &self.cluster.nodes {
            let id = node.id();
            let proxy = self
                .cluster
                .proxy_at(self.worker_proxy(id))
                .unwrap_or(&self.cluster.proxy)
                .url("");
            let mut args = vec![
                "demo-worker".to_owned(),
                "--node".to_owned(),
                node.api_url(""),
                "--proxy".to_owned(),
                proxy,
                "--name".to_owned(),
                format!("w{id}"),
            ];
            if let Some(trust) = &self.cluster.trust {
                for (flag, path) in [
                    ("--ca", trust.ca()),
                    ("--cert", trust.cert(CLIENT_CERT_NAME)),
                    ("--key", trust.key(CLIENT_CERT_NAME)),
                ] {
                    args.push(flag.to_owned());
                    args.push(path.display().to_string());
                }
            }
            let log = dir.join(format!("worker-{id}.log"));
            let (guard, _, lines) =
                spawn_until_line(&args, &log, WORKER_READY_LINE, &format!("worker {id}"))
                    .map_err(|e| Failure::Runtime(e.to_string()))?;
            self.workers.insert(
                id,
                Worker {
                    guard,
                    lines,
                    holding: None,
                    finished_job: true,
                },
            );
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

    /// Reads every worker's new events and prints them.
    fn pump(&mut self) {
        let mut said = Vec::new();
        for (id, worker) in &mut self.workers {
            while let Ok(line) = worker.lines.try_recv() {
                let Ok(event) = serde_json::from_str::<Event>(&line) else {
                    continue;
                };
                event.record(&format!("w{id}"), &mut self.observed.recorder);
                match event {
                    Event::Ready => {}
                    Event::Holding { token, .. } => {
                        worker.holding = Some(token);
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

    async fn pump_for(&mut self, duration: Duration) {
        let end = Instant::now() + duration;
        while Instant::now() < end {
            self.pump();
            tokio::time::sleep(wait::POLL).await;
        }
        self.pump();
    }

    async fn wait_for_announced_leader(
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

    async fn wait_for_holding(&mut self, id: u64, token: u64) -> Result<(), Failure> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            self.pump();
            if let Some(w) = self.workers.get(&id)
                && w.holding == Some(token)
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

    async fn wait_for_job_end(&mut self, id: u64) -> Result<(), Failure> {
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

    async fn wait_for_follower(&mut self, id: u64, term: u64) -> Option<LeaderView> {
        let node = self.cluster.node(id)?;
        wait::poll(STEP_TIMEOUT, || async {
            node.leadership()
                .await
                .filter(|l| l.term >= term && l.token.is_none())
        })
        .await
    }

    fn pause(&self, id: u64) -> Result<(), Failure> {
        self.signal_pair(id, true)
    }

    fn resume(&self, id: u64) -> Result<(), Failure> {
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

    fn stop_workers(&mut self) {
        for w in self.workers.values_mut() {
            w.guard.kill9();
        }
        self.pump();
    }

    /// The ledger as the store holds it, in apply order: the fleet's shared store's
    /// whole apply log, or the listing of the proxy's embedded store.
    async fn ledger(&self) -> Result<Vec<Entry>, Failure> {
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
