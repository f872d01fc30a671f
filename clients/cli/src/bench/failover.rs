//! `palisade bench failover`: start a local cluster (nodes announcing to one proxy),
//! then, trial after trial, pause the leader with `SIGSTOP` and time three moments,
//! each from the signal:
//!
//! - `elected`: another node reports itself leader of a higher term;
//! - `established`: that leader has applied an entry of its term, so it has a token;
//! - `announced`: the proxy's fence for the scope has risen (`GET /v1/fences/{scope}`):
//!   from here on the paused leader's writes are refused;
//! - `accepted`: a write carrying the new token is accepted at the proxy (2xx). The
//!   writer is a client of the nodes, as a worker beside each would be: one
//!   [`NodeApiSource`] per node (long polls of `GET /v1/leader`), and the first to report
//!   a leader with a token higher than the paused one's sends a PUT with it through the
//!   proxy at once, and again every poll interval until one is accepted. This is the
//!   failover as a user sees it, measured from outside.
//!
//! Where the time goes comes from the nodes' own log lines ([`failover_events`]):
//! detection (until a node campaigns), election (until it leads), establishment (until
//! it holds the token) and announce (until every proxy has acknowledged the term).
//!
//! Then `SIGCONT`, wait until every node agrees on one leader whose token the proxy
//! holds, wait `--settle-ms`, and start the next trial. The processes come from
//! `palisade-cluster`, which kills them all when the run ends or is interrupted.

use std::time::{Duration, Instant};

use clap::Args;
use std::sync::Arc;

use palisade_client::{FencedClient, NodeApi, NodeApiSource, StaticToken, TokenSource};
use palisade_cluster::{Cluster, ClusterSpec, LeaderView, Role};
use serde::Serialize;

use super::failover_events::{self, Steps};

use crate::Failure;

/// Most trials of one run.
const TRIALS_MAX: u32 = 1000;
/// Fewest nodes: a quorum must survive the pause of one.
const NODES_MIN: usize = 3;
/// Most nodes started on one machine.
const NODES_MAX: usize = 7;
/// Longest wait for one failover, or for the cluster to settle after a resume; a trial
/// that takes longer is counted as failed.
const TRIAL_TIMEOUT: Duration = Duration::from_secs(30);
/// Fastest polling allowed, in milliseconds: below it the polls themselves load the
/// machine that is being measured.
const POLL_MS_MIN: u64 = 1;
/// Timeout of one poll of a node: a node that is not paused answers in well under a
/// millisecond on loopback, so a slow answer only means a busy machine.
const QUERY_TIMEOUT_MS: u64 = 500;
/// Longest total run allowed by `--budget-s`.
const BUDGET_S_MAX: u64 = 24 * 3600;

/// Time failovers of a local cluster.
#[derive(Args)]
pub(crate) struct FailoverArgs {
    /// Number of trials (1 to 1000).
    #[arg(long, env = "PALISADE_BENCH_TRIALS", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(TRIALS_MAX)))]
    trials: u32,
    /// Number of election nodes (3 to 7).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// raft tick of the nodes, in milliseconds (the node's default).
    #[arg(long, default_value_t = palisade_election::TICK_MS_DEFAULT)]
    tick_ms: u64,
    /// Ticks between leader heartbeats (the node's default).
    #[arg(long, default_value_t = palisade_election::HEARTBEAT_TICKS_DEFAULT)]
    heartbeat_ticks: u64,
    /// Ticks without a leader before a follower campaigns (the node's default). With the
    /// default score ranking the best-ranked follower campaigns one tick after it;
    /// with `--score-oracle off` on the nodes raft randomizes it up to twice this.
    #[arg(long, default_value_t = palisade_election::ELECTION_TICKS_DEFAULT)]
    election_ticks: u64,
    /// How often the nodes and the proxy are polled during a failover, in milliseconds.
    #[arg(long, default_value_t = 10)]
    poll_ms: u64,
    /// Quiet time after the cluster has settled, before the next pause, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    settle_ms: u64,
    /// Stop starting new trials after this many seconds in total.
    #[arg(long, env = "PALISADE_BENCH_BUDGET_S", default_value_t = 240)]
    budget_s: u64,
    /// Print the report as one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Keep the temporary directory (data and logs).
    #[arg(long)]
    keep: bool,
}

/// One trial's times from the `SIGSTOP`, in milliseconds (`None`: not seen in time).
#[derive(Debug, Default, Clone, Serialize)]
struct Trial {
    paused_node: u64,
    old_term: u64,
    new_term: Option<u64>,
    elected_ms: Option<f64>,
    established_ms: Option<f64>,
    announced_ms: Option<f64>,
    /// A write with the new token was accepted at the proxy.
    accepted_ms: Option<f64>,
    /// The steps of the takeover from the nodes' logs.
    log: Steps,
}

/// Median, min and max of one moment over the successful trials.
#[derive(Serialize)]
struct Summary {
    count: usize,
    median_ms: Option<f64>,
    min_ms: Option<f64>,
    max_ms: Option<f64>,
}

impl Summary {
    fn of(values: impl Iterator<Item = Option<f64>>) -> Self {
        let v: Vec<f64> = values.flatten().collect();
        Self {
            count: v.len(),
            median_ms: super::median(&v),
            min_ms: v.iter().copied().reduce(f64::min),
            max_ms: v.iter().copied().reduce(f64::max),
        }
    }
}

#[derive(Serialize)]
struct Report {
    nodes: usize,
    tick_ms: u64,
    heartbeat_ticks: u64,
    election_ticks: u64,
    poll_ms: u64,
    trials_requested: u32,
    trials: Vec<Trial>,
    elected: Summary,
    established: Summary,
    announced: Summary,
    accepted: Summary,
    /// From the nodes' logs: the end of detection, election, establishment and announce.
    log_campaign: Summary,
    log_leader: Summary,
    log_established: Summary,
    log_announced: Summary,
}

pub(crate) async fn run(args: FailoverArgs) -> Result<(), Failure> {
    crate::children_run_this_binary()?;
    if !(NODES_MIN..=NODES_MAX).contains(&args.nodes) {
        return Err(Failure::Usage(format!(
            "--nodes {} is out of range: {NODES_MIN} to {NODES_MAX}",
            args.nodes
        )));
    }
    if args.poll_ms < POLL_MS_MIN || args.tick_ms == 0 || args.election_ticks == 0 {
        return Err(Failure::Usage(format!(
            "--poll-ms (at least {POLL_MS_MIN}), --tick-ms and --election-ticks must be positive"
        )));
    }
    if args.budget_s == 0 || args.budget_s > BUDGET_S_MAX {
        return Err(Failure::Usage(format!(
            "--budget-s {} must be 1 to {BUDGET_S_MAX}",
            args.budget_s
        )));
    }
    let dir = tempfile::Builder::new()
        .prefix("palisade-bench-failover-")
        .tempdir()
        .map_err(|e| Failure::Runtime(format!("cannot create a temporary directory: {e}")))?;
    let path = dir.path().to_owned();
    let outcome = tokio::select! {
        outcome = trials(&args, &path) => outcome,
        () = crate::shutdown_signal() => Err(Failure::Runtime("interrupted; every process was stopped".to_owned())),
    };
    // The cluster was dropped above, which resumed and killed every child.
    if args.keep {
        let kept = dir.keep();
        eprintln!("data and logs kept in {}", kept.display());
    }
    let report = outcome?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).map_err(|e| Failure::Runtime(e.to_string()))?
        );
    } else {
        print_text(&report);
    }
    if report.announced.count == 0 {
        return Err(Failure::Runtime(
            "no trial saw a new token at the proxy".to_owned(),
        ));
    }
    Ok(())
}

async fn trials(args: &FailoverArgs, dir: &std::path::Path) -> Result<Report, Failure> {
    let runtime = |e: palisade_cluster::ClusterError| Failure::Runtime(e.to_string());
    let started = Instant::now();
    let budget = Duration::from_secs(args.budget_s);
    let spec = ClusterSpec {
        nodes: args.nodes,
        node_flags: [
            "--tick-ms",
            &args.tick_ms.to_string(),
            "--heartbeat-ticks",
            &args.heartbeat_ticks.to_string(),
            "--election-ticks",
            &args.election_ticks.to_string(),
        ]
        .iter()
        .map(ToString::to_string)
        .collect(),
        proxy_flags: Vec::new(),
    };
    // Starting waits for ready lines on blocking channels.
    let cluster = tokio::task::block_in_place(|| Cluster::start(dir, &spec)).map_err(runtime)?;
    let poll = Duration::from_millis(args.poll_ms);
    let settle = Duration::from_millis(args.settle_ms);
    let mut done = Vec::new();
    for n in 1..=args.trials {
        if started.elapsed() >= budget {
            eprintln!(
                "palisade bench failover: time budget of {} s spent after {} trials",
                args.budget_s,
                n - 1
            );
            break;
        }
        let leader = settled_leader(&cluster).await.ok_or_else(|| {
            Failure::Runtime(format!(
                "trial {n}: the cluster did not settle on an announced leader within {} s",
                TRIAL_TIMEOUT.as_secs()
            ))
        })?;
        tokio::time::sleep(settle).await;
        let trial = one_trial(&cluster, &leader, poll).await.map_err(runtime)?;
        // Progress on stderr, so stdout stays one JSON object with --json.
        eprintln!(
            "trial {n:>3}: paused node {} (term {}): elected {} ms, established {} ms, announced {} ms, \
             write accepted {} ms; logs: campaign {} ms, leader {} ms, established {} ms, announced {} ms",
            trial.paused_node,
            trial.old_term,
            fmt_ms(trial.elected_ms),
            fmt_ms(trial.established_ms),
            fmt_ms(trial.announced_ms),
            fmt_ms(trial.accepted_ms),
            fmt_ms(trial.log.campaign_ms),
            fmt_ms(trial.log.leader_ms),
            fmt_ms(trial.log.established_ms),
            fmt_ms(trial.log.announced_ms),
        );
        done.push(trial);
    }
    Ok(Report {
        nodes: args.nodes,
        tick_ms: args.tick_ms,
        heartbeat_ticks: args.heartbeat_ticks,
        election_ticks: args.election_ticks,
        poll_ms: args.poll_ms,
        trials_requested: args.trials,
        elected: Summary::of(done.iter().map(|t| t.elected_ms)),
        established: Summary::of(done.iter().map(|t| t.established_ms)),
        announced: Summary::of(done.iter().map(|t| t.announced_ms)),
        accepted: Summary::of(done.iter().map(|t| t.accepted_ms)),
        log_campaign: Summary::of(done.iter().map(|t| t.log.campaign_ms)),
        log_leader: Summary::of(done.iter().map(|t| t.log.leader_ms)),
        log_established: Summary::of(done.iter().map(|t| t.log.established_ms)),
        log_announced: Summary::of(done.iter().map(|t| t.log.announced_ms)),
        trials: done,
    })
}

/// Waits until every node answers and agrees on one established, announced leader whose
/// token the proxy holds; returns that leader.
async fn settled_leader(cluster: &Cluster) -> Option<LeaderView> {
    palisade_cluster::wait::poll(TRIAL_TIMEOUT, || async {
        let all = cluster.leaderships().await;
        if all.len() != cluster.nodes.len() {
            return None;
        }
        let leader = all.values().find(|l| l.token.is_some() && l.announced)?;
        let agreed = all
            .values()
            .all(|l| l.leader_id == Some(leader.node_id) && l.term == leader.term);
        let fence = cluster.proxy_fence(&leader.scope).await?;
        (agreed && Some(fence) == leader.token).then(|| leader.clone())
    })
    .await
}

/// Pauses `leader`'s node, times the failover, and resumes it.
async fn one_trial(
    cluster: &Cluster,
    leader: &LeaderView,
    poll: Duration,
) -> palisade_cluster::Result<Trial> {
    let old_term = leader.term;
    let old_fence = leader.token.unwrap_or(old_term);
    let mut trial = Trial {
        paused_node: leader.node_id,
        old_term,
        ..Trial::default()
    };
    let Some(paused) = cluster.node(leader.node_id) else {
        return Ok(trial);
    };
    let survivors: Vec<_> = cluster
        .nodes
        .iter()
        .filter(|n| n.id() != leader.node_id)
        .collect();
    let others: Vec<NodeApi> = survivors
        .iter()
        .map(|n| {
            n.api()
                .clone()
                .timeout(Duration::from_millis(QUERY_TIMEOUT_MS))
        })
        .collect();
    // The writer's sources follow the nodes before the pause, as a worker's would.
    let sources = followers(&others).await;
    let proxy_url = cluster.proxy.url("");
    let writer = write_with_new_token(&sources, &proxy_url, old_fence, poll);
    tokio::pin!(writer);
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1000.0;

    let paused_at = std::time::SystemTime::now();
    let t0 = Instant::now();
    paused.guard.pause()?;
    let deadline = t0 + TRIAL_TIMEOUT;
    let mut writer_done = false;
    while Instant::now() < deadline {
        // One round: every other node and the proxy, concurrently, while the writer
        // waits for a new leader and writes.
        let round =
            async { tokio::join!(leaderships(&others), cluster.proxy_fence(&leader.scope)) };
        let (views, fence) = if writer_done {
            round.await
        } else {
            tokio::select! {
                accepted = &mut writer => {
                    trial.accepted_ms = accepted.then(|| ms(t0));
                    writer_done = true;
                    continue;
                }
                r = round => r,
            }
        };
        let now_ms = ms(t0);
        for view in views.into_iter().flatten() {
            if view.term > old_term && view.role == Role::Leader {
                trial.elected_ms.get_or_insert(now_ms);
                trial.new_term.get_or_insert(view.term);
                if view.token.is_some() {
                    trial.established_ms.get_or_insert(now_ms);
                }
            }
        }
        if trial.announced_ms.is_none() && fence.is_some_and(|f| f > old_fence) {
            trial.announced_ms = Some(now_ms);
            // A node that is announced was elected and established before; if a poll
            // missed those moments, they happened no later than now.
            trial.elected_ms.get_or_insert(now_ms);
            trial.established_ms.get_or_insert(now_ms);
        }
        if trial.announced_ms.is_some() && writer_done {
            break;
        }
        let pause = tokio::time::sleep(poll);
        if writer_done {
            pause.await;
        } else {
            tokio::select! {
                accepted = &mut writer => {
                    trial.accepted_ms = accepted.then(|| ms(t0));
                    writer_done = true;
                }
                () = pause => {}
            }
        }
    }
    paused.guard.resume()?;
    if let Some(term) = trial.new_term {
        let logs: Vec<String> = survivors.iter().flat_map(|n| n.logs()).collect();
        trial.log = failover_events::steps(&logs, paused_at, term);
    }
    Ok(trial)
}

/// A [`NodeApiSource`] per node, each once it has its first answer (or after
/// [`QUERY_TIMEOUT_MS`]).
async fn followers(apis: &[NodeApi]) -> Vec<NodeApiSource> {
    let mut sources = Vec::new();
    for api in apis {
        // Short long polls: a source of a follower asks again soon after each answer,
        // as a worker's would with the client's default.
        match NodeApiSource::start(&api.url()) {
            Ok(source) => sources.push(source),
            Err(e) => eprintln!("palisade bench failover: cannot follow {}: {e}", api.url()),
        }
    }
    let deadline = Instant::now() + Duration::from_millis(QUERY_TIMEOUT_MS);
    for source in &sources {
        while source.last_answer().is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    sources
}

/// Waits until one of `sources` reports an established leader with a token above
/// `old_fence`, then PUTs with that token through the proxy at `proxy_url` until a PUT
/// is accepted (true) or [`TRIAL_TIMEOUT`] passes (false). A refusal (409: the token is
/// already below the fence, which a correct cluster never makes it) ends it too (false).
async fn write_with_new_token(
    sources: &[NodeApiSource],
    proxy_url: &str,
    old_fence: u64,
    poll: Duration,
) -> bool {
    let work = async {
        let token = loop {
            let waits = sources.iter().map(TokenSource::wait_for_leader);
            let (leadership, _, _) = futures_util::future::select_all(waits).await;
            match leadership.write_token() {
                Some(t) if t > old_fence => break t,
                // The paused leader's own term, seen by a source before the pause was
                // noticed: wait for a change.
                _ => {
                    let changes = sources.iter().map(|s| Box::pin(s.changed()));
                    futures_util::future::select_all(changes).await;
                }
            }
        };
        let Ok(client) = FencedClient::builder(proxy_url, Arc::new(StaticToken::new(token)))
            .retries(0)
            .build()
        else {
            return false;
        };
        loop {
            match client.put("bench/failover", "x").await {
                Ok(_) => return true,
                Err(palisade_client::ClientError::Fenced { .. }) => return false,
                Err(_) => tokio::time::sleep(poll).await,
            }
        }
    };
    tokio::time::timeout(TRIAL_TIMEOUT, work)
        .await
        .unwrap_or(false)
}

/// Every node's leadership (`None` for a node that does not answer), queried at once.
async fn leaderships(apis: &[NodeApi]) -> Vec<Option<LeaderView>> {
    let mut set = tokio::task::JoinSet::new();
    for api in apis {
        let api = api.clone();
        set.spawn(async move { api.leader().await.ok() });
    }
    set.join_all().await
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.0}"))
}

fn print_text(r: &Report) {
    println!(
        "failover of {} nodes (tick {} ms, heartbeat {} ticks, election {} ticks), {} of {} trials, polled every {} ms",
        r.nodes,
        r.tick_ms,
        r.heartbeat_ticks,
        r.election_ticks,
        r.trials.len(),
        r.trials_requested,
        r.poll_ms
    );
    for (name, s) in [
        ("elected", &r.elected),
        ("established", &r.established),
        ("announced", &r.announced),
        ("accepted", &r.accepted),
    ] {
        println!(
            "  {name:<12} median {} ms   min {} ms   max {} ms   ({} trials)",
            fmt_ms(s.median_ms),
            fmt_ms(s.min_ms),
            fmt_ms(s.max_ms),
            s.count
        );
    }
}
