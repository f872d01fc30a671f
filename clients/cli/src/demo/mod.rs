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
//!
//! With `--sessions` ([`sessions`]) the workers are not beside the nodes and are not raft
//! members: each opens a session on the cluster and campaigns for one named scope
//! ([`SESSION_SCOPE`]); the holder writes with its grant's token, is paused past its
//! session's TTL, the next waiter is granted a higher token (fenced at the proxy before
//! the grant is answered), and the resumed holder's write is rejected. The same verdict.

pub(crate) mod session_worker;
mod sessions;
mod state;
mod store;
mod timeline;
mod verdict;
pub(crate) mod worker;

use std::time::Duration;

use clap::Args;

use crate::Failure;

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
/// The named scope the `--sessions` workers campaign for and write in.
const SESSION_SCOPE: &str = "ledger";
/// The `--sessions` workers' session TTL: the shortest the cluster grants is 1 s; three
/// keepalives per TTL at 1 s apart keep up on a loaded machine, and the holder's pause
/// outlasts it by little so the demo stays short. `--sessions`' help and the README say 3 s.
const SESSION_TTL: Duration = Duration::from_secs(3);

/// Run the demonstration: a cluster, a proxy, workers, a GC-paused stale leader, a verdict.
#[derive(Args)]
pub(crate) struct DemoArgs {
    /// Number of election nodes (3 to 7).
    #[arg(long, default_value_t = 3, env = "PALISADE_DEMO_NODES")]
    nodes: usize,
    /// How long the leader stays paused, in seconds. With --sessions: how long the
    /// holder stays paused at least; it stays paused until the next waiter was granted
    /// the scope.
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
    /// The workers are clients, not raft members: each opens a session (TTL 3 s) and
    /// campaigns for the named scope `ledger`, writing with its grant's token and
    /// `Fencing-Scope: ledger` (the proxy runs with --client-scopes). The holder is paused
    /// past its TTL, the next waiter is granted a higher token, and the resumed holder's
    /// write is rejected; it notices that its session is lost and stops. One proxy only.
    #[arg(long, env = "PALISADE_DEMO_SESSIONS")]
    sessions: bool,
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
    if args.sessions && args.proxies > 1 {
        return Err(Failure::Usage(format!(
            "--sessions with --proxies {}: named scopes are not granted by a cluster of fleet proxies; --sessions runs one proxy",
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
        outcome = async {
            if args.sessions {
                sessions::run(&args, path.clone()).await
            } else {
                timeline::run(&args, path.clone()).await
            }
        } => outcome,
        () = crate::shutdown_signal() => Err(Failure::Runtime("interrupted; every process was stopped".to_owned())),
    };
    // Every child was killed when the demo's state was dropped above.
    if args.keep {
        let kept = dir.keep();
        println!("data and logs kept in {}", kept.display());
    }
    outcome
}
