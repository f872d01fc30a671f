//! Clock faults: nodes and fleet proxies whose clocks run fast or slow, or whose wall
//! clocks jump, through libfaketime ([`palisade_tests::clock`]).
//!
//! The fleet's safety rests on one clock assumption (docs/fleet.md, "Assumptions"): an
//! interval one process measures as `d` lasts at most `d * (1 + drift_ppm / 1e6)` on
//! another's monotonic clock. These tests run real processes within that bound and just
//! beyond it:
//! - the check under all of them: a faked rate really reaches the binary's tokio timers;
//! - clocks drifting apart by 0.9% (bound 1%): every lease holds in a steady cluster, and
//!   a paused leader's write is fenced out;
//! - a proxy cut off from the cluster, its clock 0.45% slow, the nodes' 0.45% fast: its
//!   lease lapses before the new leader's token is released;
//! - the same proxy 5% slow (beyond the bound): it admits the stale token after the new
//!   leader wrote, and the history checker reports the reordering;
//! - wall clocks stepped by hours and days, forwards and back, on every process: nothing
//!   changes, as nothing the protocol decides reads the wall clock.
//!
//! They need libfaketime (Debian's `faketime` package), so they are `#[ignore]`d;
//! `.ci/run` runs them with `--ignored` where it is installed.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http::Method;
use palisade_client::NodeApi;
use palisade_cluster::history::{self, Outcome, Violation};
use palisade_cluster::{FaultSpec, Fleet, NodeHost, Role, wait};
use palisade_protocol::lease::{LEASE_PATH, LeaseView};
use palisade_tests::clock::{
    JUMP_CACHE_S, WallClock, forget_cluster_names, node_wall_offset_s, offset_is,
    proxy_wall_offset_s, rate_prefix, require_libfaketime,
};
use palisade_tests::relay::Relay;
use palisade_tests::scenario::{ELECTION_TIMEOUT, STEP_TIMEOUT, Scenario, ScenarioSpec};
use palisade_tests::upstream::RecordingUpstream;
use tokio::sync::watch;

/// The nodes' `--lease-drift-ppm`: their default, 1%, given explicitly.
const DRIFT_PPM: u64 = 10_000;
/// Within the bound: the fast clocks' rate. With [`SLOW`], two clocks differ by a factor
/// of 1.0045 / 0.9955 = 1.009, just inside the 1% bound.
const FAST: f64 = 1.0045;
/// Within the bound: the slow clocks' rate.
const SLOW: f64 = 0.9955;
/// Beyond the bound: a proxy clock 5% slow.
const BEYOND: f64 = 0.95;
/// Nodes of every scenario here.
const NODES: u64 = 3;
/// The steady tests' `--lease-ms`: 2 s, so that one slow renewal round on a loaded
/// machine does not let a lease lapse (a renewal has two thirds of a lease).
const STEADY_LEASE_MS: u64 = 2_000;
/// The drift test's steady window: two leases.
const STEADY: Duration = Duration::from_secs(4);
/// Pause between two probes of a proxy.
const PROBE_GAP: Duration = Duration::from_millis(20);

fn localhost(prefix: Vec<String>) -> NodeHost {
    NodeHost {
        ip: Ipv4Addr::LOCALHOST.into(),
        prefix,
    }
}

/// Unlinks libfaketime's per-process names of every node and proxy (all faked here), so
/// that killing them leaves nothing in `/dev/shm` (see [`palisade_tests::clock`]).
fn forget_faked_names(s: &Scenario) {
    forget_cluster_names(&s.cluster);
}

async fn lease_view(s: &Scenario, i: usize) -> LeaseView {
    let url = s.cluster.proxy_at(i).unwrap().admin_url(LEASE_PATH);
    let answer = palisade_cluster::client::try_send(Method::GET, &url, &[], "")
        .await
        .unwrap();
    serde_json::from_value(answer.json()).unwrap()
}

/// Goal: the rate libfaketime is given is the rate the binary's tokio timers run at,
/// fast and slow, so that the tests below fake what they claim to. Method: three
/// `palisade bench --hold --duration 3` runs at once (a tokio `sleep_until` of 3 s on
/// the bench's clock), at x1.05, x0.95 and unfaked; each one's hold, timed in real time
/// from its `holding` line to its `released` line, is 3 s divided by its rate, within
/// 2% (the rates differ from 1 by 5%).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs libfaketime (apt-get install faketime): run with --ignored"]
async fn faked_clock_rates_reach_the_binarys_tokio_timers() {
    let bin = crate::use_tested_binary();
    let lib = require_libfaketime();
    let upstream = RecordingUpstream::start().await;
    let hold_s = 3.0;
    let runs: Vec<(f64, std::thread::JoinHandle<Duration>)> = [Some(1.05), Some(0.95), None]
        .into_iter()
        .map(|rate| {
            let mut argv = rate.map(|r| rate_prefix(&lib, r)).unwrap_or_default();
            argv.push(bin.to_owned());
            argv.extend(
                [
                    "bench",
                    "--url",
                    &upstream.url(),
                    "--connections",
                    "1",
                    "--hold",
                ]
                .map(str::to_owned),
            );
            argv.extend(["--duration".to_owned(), hold_s.to_string()]);
            (
                rate.unwrap_or(1.0),
                std::thread::spawn(move || time_hold(&argv)),
            )
        })
        .collect();
    for (rate, run) in runs {
        let held = run.join().unwrap();
        let want = Duration::from_secs_f64(hold_s / rate);
        let error = held.as_secs_f64() / want.as_secs_f64() - 1.0;
        eprintln!("clock: a {hold_s} s tokio sleep at x{rate} took {held:?} (expected {want:?})");
        assert!(
            error.abs() < 0.02,
            "at x{rate} a {hold_s} s hold took {held:?}, not {want:?}: libfaketime's rate does not reach tokio's timers"
        );
    }
}

/// Runs `argv` and times, in real time, from its `holding` line to its `released` line.
fn time_hold(argv: &[String]) -> Duration {
    use std::io::BufRead as _;
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut holding = None;
    let mut held = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.starts_with("holding 1 connections") {
            holding = Some(Instant::now());
        } else if line.starts_with("released") {
            held = holding.map(|at| at.elapsed());
            break;
        }
    }
    assert!(child.wait().unwrap().success(), "{argv:?} failed");
    held.unwrap_or_else(|| panic!("{argv:?} printed no holding and released lines"))
}

/// A fleet of three proxies with lease `lease_ms` and write bound `write_bound_ms`.
fn fleet(proxies: usize, lease_ms: u64, write_bound_ms: u64) -> Fleet {
    Fleet {
        lease_drift_ppm: Some(DRIFT_PPM),
        lease_write_bound_ms: Some(write_bound_ms),
        ..Fleet::new(proxies, lease_ms)
    }
}

/// Probes every proxy in turn with `token` for `duration` and asserts each write is
/// admitted (no lease lapsed, no 503); returns how many were.
async fn every_proxy_admits_for(s: &mut Scenario, token: u64, duration: Duration) -> usize {
    let end = Instant::now() + duration;
    let mut admitted = 0;
    while Instant::now() < end {
        for i in 0..s.cluster.proxies().len() {
            s.pump();
            let (_, answer) = s.probe(i, token).await;
            match answer {
                Ok(a) if a.status.is_success() => admitted += 1,
                Ok(a) => panic!(
                    "proxy {i} answered {} to a write with the current token {token}: {}",
                    a.status,
                    a.text()
                ),
                Err(e) => panic!("proxy {i} did not answer a write with token {token}: {e}"),
            }
        }
        tokio::time::sleep(PROBE_GAP).await;
    }
    admitted
}

/// Goal: clocks running apart by a factor of 1.009 (bound 1%) cost no lease in a steady
/// cluster and keep fencing: a paused leader's write is refused once a new leader wrote.
/// Method: three nodes at x1.0045, x0.9955 and x1, three fleet proxies at x0.9955,
/// x1.0045 and x1 (lease 2 s, workers writing); once every proxy admitted a write, probe
/// every proxy with the leader's token for 4 s (two leases): every write admitted, no
/// renewal failed; then freeze
/// the leader's worker with token t, `SIGSTOP` its node, wait for the new leader's token
/// and a write with it, resume: the old write is rejected (409). Then the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs libfaketime (apt-get install faketime): run with --ignored"]
async fn drifting_clocks_within_the_bound_keep_every_lease_and_fence_a_paused_leader() {
    crate::use_tested_binary();
    let lib = require_libfaketime();
    let node_rates = [FAST, SLOW, 1.0];
    let proxy_rates = [SLOW, FAST, 1.0];
    let mut fleet = fleet(3, STEADY_LEASE_MS, 500);
    for (i, rate) in proxy_rates.into_iter().enumerate() {
        fleet
            .proxy_hosts
            .insert(i, localhost(rate_prefix(&lib, rate)));
    }
    let mut s = Scenario::start(&ScenarioSpec {
        stop_workers: true,
        fleet: Some(fleet),
        node_prefixes: (1..=NODES)
            .zip(node_rates)
            .map(|(id, rate)| (id, rate_prefix(&lib, rate)))
            .collect(),
        ..ScenarioSpec::default()
    })
    .await;
    forget_faked_names(&s);
    let leader = s.wait_announced_leader(0, None).await;
    let (old, token) = (leader.node_id, leader.token.unwrap());
    // Each proxy's first lease may come late on a loaded machine (renewals failed while
    // there was no leader yet): the steady state starts once every proxy admitted.
    for i in 0..3 {
        wait_until_admitted(&mut s, i, token).await;
    }
    let failures: Vec<u64> = renewal_failures(&s).await;
    let admitted = every_proxy_admits_for(&mut s, token, STEADY).await;
    let after: Vec<u64> = renewal_failures(&s).await;
    s.say(&format!(
        "{admitted} writes admitted through 3 proxies in {STEADY:?}; renewal failures {failures:?} -> {after:?}"
    ));
    assert_eq!(
        failures, after,
        "a lease renewal failed on a steady cluster"
    );

    let job = s.freeze_leaders_writer(&leader, 1).await;
    s.cluster.node(old).unwrap().guard.pause().unwrap();
    s.say(&format!(
        "PAUSE node {old} (rate x{}), its worker frozen with token {token}",
        node_rates[usize::try_from(old - 1).unwrap()]
    ));
    let next = s.wait_announced_leader(token, Some(old)).await;
    let new_token = next.token.unwrap();
    s.wait_acked(new_token, 1).await;
    let outcome = s.resume_and_release(old, job.seq).await;
    assert_eq!(
        outcome,
        Outcome::Rejected,
        "the paused leader's write with token {token}, after token {new_token}"
    );
    s.finish("clock: drift within the bound");
}

/// Probes proxy `i` with `token` until a write is admitted, within [`STEP_TIMEOUT`].
async fn wait_until_admitted(s: &mut Scenario, i: usize, token: u64) {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        s.pump();
        let (_, answer) = s.probe(i, token).await;
        if answer.as_ref().is_ok_and(|a| a.status.is_success()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "proxy {i} admitted no write with token {token} within {STEP_TIMEOUT:?}: {answer:?}"
        );
        tokio::time::sleep(PROBE_GAP).await;
    }
}

/// Each proxy's failed renewal rounds so far.
async fn renewal_failures(s: &Scenario) -> Vec<u64> {
    let mut out = Vec::new();
    for i in 0..s.cluster.proxies().len() {
        out.push(lease_view(s, i).await.failures);
    }
    out
}

/// The race tests' lease: long, so that 5% of it (the beyond-the-bound test's excess) is
/// far more than the time from a renewal to the next leader's election.
const RACE_LEASE_MS: u64 = 10_000;
/// The race tests' write bound: the least the proxies take, so that the release wait is
/// the lease's alone and the drift term is what stands between the two.
const RACE_WRITE_BOUND_MS: u64 = 1;

/// What [`race_a_cut_off_proxy`] saw, timed from when the new leader's token was first
/// seen released (`R`: at or after the actual release).
struct Race {
    /// How long the cut-off proxy had left on its lease just after the cut and the
    /// resignation, on its own clock (its lease view).
    lease_left_ms: u64,
    /// When the new leader's first write (through the other proxy) was acknowledged.
    new_write_acked: Duration,
    /// Send times of stale-token writes the cut-off proxy admitted after `R`.
    stale_admitted_after_release: Vec<Duration>,
    /// How many of those were sent after the new leader's write was acknowledged.
    stale_admitted_after_new: usize,
    /// Send time of the last stale-token write the cut-off proxy admitted, from `R`, in
    /// milliseconds (negative: before it).
    last_admitted_ms: i128,
    /// Send time of the cut-off proxy's first refusal (503) from `R`, in milliseconds
    /// (negative: before it).
    refused_ms: i128,
    /// The history checker's verdict.
    report: history::Report,
}

/// `at - from` in milliseconds, negative when `at` is earlier.
fn signed_ms(at: Instant, from: Instant) -> i128 {
    if at >= from {
        i128::try_from((at - from).as_millis()).unwrap()
    } else {
        -i128::try_from((from - at).as_millis()).unwrap()
    }
}

/// The race behind the drift bound. Nodes at x[`FAST`] with a lease of
/// [`RACE_LEASE_MS`] and a write bound of [`RACE_WRITE_BOUND_MS`]; two fleet proxies,
/// proxy 0 at x`proxy_rate` reaching the nodes (and reached by them) through relays,
/// proxy 1 at x[`SLOW`]. Proxy 0 renews at once (a write with a token above its lease's
/// term makes it renew urgently, and is refused 409), its relays are cut, the leader
/// resigns; from then on proxy 0 is probed with the old token until it refuses (503),
/// and as soon as the new leader's token is seen, a write with it goes through proxy 1.
async fn race_a_cut_off_proxy(proxy_rate: f64, name: &str) -> Race {
    let lib = require_libfaketime();
    let mut relays = Vec::new();
    for _ in 0..NODES {
        relays.push(Relay::start().await);
    }
    let admin_relay = Relay::start().await;
    let mut fleet = fleet(2, RACE_LEASE_MS, RACE_WRITE_BOUND_MS);
    fleet
        .cluster_urls
        .insert(0, relays.iter().map(Relay::url).collect());
    fleet.fleet_names.insert(0, admin_relay.url());
    fleet
        .proxy_hosts
        .insert(0, localhost(rate_prefix(&lib, proxy_rate)));
    fleet
        .proxy_hosts
        .insert(1, localhost(rate_prefix(&lib, SLOW)));
    let mut s = Scenario::start(&ScenarioSpec {
        workers: false,
        fleet: Some(fleet),
        node_prefixes: (1..=NODES)
            .map(|id| (id, rate_prefix(&lib, FAST)))
            .collect(),
        ..ScenarioSpec::default()
    })
    .await;
    forget_faked_names(&s);
    for (relay, node) in relays.iter().zip(&s.cluster.nodes) {
        relay.set_target(node.spec.api);
    }
    admin_relay.set_target(s.cluster.proxy_at(0).unwrap().admin);
    let leader = s.wait_announced_leader(0, None).await;
    let (old, token) = (leader.node_id, leader.token.unwrap());

    let (_, renew) = s.probe(0, token + 1).await;
    assert_eq!(
        renew.as_ref().map(|a| a.status).ok(),
        Some(http::StatusCode::CONFLICT),
        "a token above the cluster's term is refused after a renewal: {renew:?}"
    );
    for relay in relays.iter().chain([&admin_relay]) {
        relay.cut();
    }
    s.skip_proxies.insert(0);
    if let Err(e) = s.cluster.node(old).unwrap().api().resign().await {
        // The watch below still needs a new leader, and says so if none comes.
        s.say(&format!("node {old}'s resignation answered {e}"));
    }
    let view = lease_view(&s, 0).await;
    assert!(view.valid && view.term == leader.term, "{view:?}");
    s.say(&format!(
        "proxy 0 (x{proxy_rate}) renewed, CUT off with {} ms left on its lease; node {old} (x{FAST}) resigned",
        view.expires_in_ms
    ));

    // The release is watched by a task of its own, so that a probe waiting out a renewal
    // round (a refused one takes `limits.lease_renew_timeout_ms`) does not delay seeing it.
    let release_watch = watch_release(&s, leader.term);
    let watch_from = Instant::now();
    let deadline = watch_from + Duration::from_millis(RACE_LEASE_MS * 2) + ELECTION_TIMEOUT;
    let mut new_write_acked: Option<Instant> = None;
    let mut refused: Option<Instant> = None;
    let mut stale_admitted = Vec::new();
    loop {
        let released = *release_watch.borrow();
        assert!(
            Instant::now() < deadline,
            "{name}: no release, or no refusal after it, within {:?} (released {released:?}, new write acked {new_write_acked:?}, refused {refused:?})",
            watch_from.elapsed()
        );
        if let (Some((_, new_token)), None) = (released, new_write_acked) {
            let (_, answer) = s.probe(1, new_token).await;
            let status = answer.map(|a| a.status);
            assert!(
                status.as_ref().is_ok_and(http::StatusCode::is_success),
                "the new leader's write with token {new_token} through proxy 1: {status:?}"
            );
            new_write_acked = Some(Instant::now());
        }
        // Once proxy 0 refused, one more probe after the new leader's write is enough.
        if refused.is_none() || refused < new_write_acked {
            let (sent, answer) = s.probe(0, token).await;
            match answer.map(|a| a.status) {
                Ok(status) if status.is_success() => stale_admitted.push(sent),
                Ok(http::StatusCode::SERVICE_UNAVAILABLE) => {
                    refused.get_or_insert(sent);
                    if new_write_acked.is_some_and(|at| sent > at) {
                        break;
                    }
                }
                other => panic!("proxy 0 answered a stale write with {other:?}"),
            }
        }
        tokio::time::sleep(PROBE_GAP).await;
    }
    let released = *release_watch.borrow();
    let (release, _) = released.unwrap();
    let acked = new_write_acked.unwrap();
    let race = Race {
        lease_left_ms: view.expires_in_ms,
        new_write_acked: acked - release,
        stale_admitted_after_release: stale_admitted
            .iter()
            .filter(|&&t| t > release)
            .map(|&t| t - release)
            .collect(),
        stale_admitted_after_new: stale_admitted.iter().filter(|&&t| t > acked).count(),
        last_admitted_ms: signed_ms(*stale_admitted.last().unwrap(), release),
        refused_ms: signed_ms(refused.unwrap(), release),
        report: history::check(&s.history()),
    };
    eprintln!(
        "{name}: proxy 0 at x{proxy_rate} (nodes x{FAST}, lease {RACE_LEASE_MS} ms, drift bound {DRIFT_PPM} ppm): \
         its last admitted stale write was sent {:+} ms from the release, its first refusal {:+} ms; \
         the new leader's write was acked at +{} ms; stale writes admitted after the release: {}, \
         after the new write: {}; history: {}",
        race.last_admitted_ms,
        race.refused_ms,
        race.new_write_acked.as_millis(),
        race.stale_admitted_after_release.len(),
        race.stale_admitted_after_new,
        race.report.summary()
    );
    race
}

/// Watches every node (every 10 ms, in a task of its own) for an established leader
/// above term `above` with its token released; the watch holds when it was first seen,
/// and the token.
fn watch_release(s: &Scenario, above: u64) -> watch::Receiver<Option<(Instant, u64)>> {
    let apis: Vec<NodeApi> = s
        .cluster
        .nodes
        .iter()
        .map(|n| {
            NodeApi::new(&format!("http://{}", n.spec.api))
                .unwrap()
                .timeout(Duration::from_millis(500))
        })
        .collect();
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        loop {
            for api in &apis {
                if let Ok(l) = api.leader().await
                    && l.term > above
                    && l.role == Role::Leader
                    && let Some(token) = l.token
                {
                    tx.send_replace(Some((Instant::now(), token)));
                    return;
                }
            }
            if tx.is_closed() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    rx
}

/// Goal: within the drift bound, the lease of a proxy cut off from the cluster has
/// lapsed when the next leader releases its token, with the write bound at its least:
/// the drift term of the release wait alone covers a clock running slow. Method:
/// [`race_a_cut_off_proxy`] with proxy 0 at x0.9955 and the nodes at x1.0045 (a factor
/// of 1.009, bound 1%); its lease ends at most `lease / 0.9955` after it was renewed,
/// the release comes `lease * 1.01 / 1.0045` after the election (which follows the
/// renewal): every stale write sent after the release was seen is refused, and the
/// history holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs libfaketime (apt-get install faketime): run with --ignored"]
async fn within_the_drift_bound_a_slow_proxys_lease_lapses_before_the_next_token_is_released() {
    crate::use_tested_binary();
    let race = race_a_cut_off_proxy(SLOW, "clock: race within the bound").await;
    assert!(
        race.lease_left_ms > RACE_LEASE_MS * 9 / 10,
        "the renewal before the cut was fresh: {} ms left",
        race.lease_left_ms
    );
    assert!(
        race.stale_admitted_after_release.is_empty(),
        "the cut-off proxy admitted the old token after the next token was released, at {:?}",
        race.stale_admitted_after_release
    );
    assert!(race.report.holds(), "{}", race.report);
}

/// Goal: document what the drift assumption buys by breaking it: a proxy whose clock
/// runs 5% slow, against a 1% bound, still holds its lease when the next leader's token
/// is released, admits the old token after the new leader's write, and the storage
/// applies a lower token after a higher one, which the history checker reports. Nothing
/// in the protocol detects a slow clock (each process only sees its own); the write
/// bound (1 ms here, 500 ms by default) is the only slack, and it is meant for the
/// write's flight. Method: [`race_a_cut_off_proxy`] with proxy 0 at x0.95: its lease
/// lasts `lease / 0.95` = 10,526 ms of real time, the release wait `10,101 / 1.0045` =
/// 10,056 ms from the election, a window of about 470 ms less the election's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs libfaketime (apt-get install faketime): run with --ignored"]
async fn beyond_the_drift_bound_a_slow_proxy_admits_the_old_token_after_the_new_leader_wrote() {
    crate::use_tested_binary();
    let race = race_a_cut_off_proxy(BEYOND, "clock: race beyond the bound").await;
    assert!(
        !race.stale_admitted_after_release.is_empty(),
        "the 5%-slow proxy admitted nothing after the release (first refusal at {:+} ms): the window the drift opens was not there",
        race.refused_ms
    );
    assert!(
        race.stale_admitted_after_new > 0,
        "no stale write was admitted after the new leader's write (acked at +{:?}, proxy refused at {:+} ms)",
        race.new_write_acked,
        race.refused_ms
    );
    let reordered = race
        .report
        .violations
        .iter()
        .filter(|v| matches!(v, Violation::AppliedAfterHigher { .. }))
        .count();
    assert!(
        reordered > 0,
        "the history checker saw no stale write land after the new token's: {}",
        race.report
    );
}

/// How far node `id`'s wall clock is from this process's ([`node_wall_offset_s`], its
/// test faults set to none).
async fn node_offset_s(s: &Scenario, id: u64) -> Option<f64> {
    node_wall_offset_s(s.cluster.node(id)?, &FaultSpec::default()).await
}

/// How far proxy `i`'s wall clock is from this process's ([`proxy_wall_offset_s`]).
async fn proxy_offset_s(s: &Scenario, i: usize) -> Option<f64> {
    proxy_wall_offset_s(s.cluster.proxy_at(i)?).await
}

/// Steps every wall clock to its offset in `offsets` (libfaketime's syntax and the same
/// in seconds), nodes first then proxies, and waits until each process reports it.
async fn jump(s: &mut Scenario, clocks: &[WallClock], offsets: &[(&str, i64)]) {
    for (clock, (offset, _)) in clocks.iter().zip(offsets) {
        clock.set(offset);
    }
    let slack = Duration::from_secs(JUMP_CACHE_S + 5);
    let nodes = usize::try_from(NODES).unwrap();
    for (k, (offset, want)) in offsets.iter().enumerate() {
        let seen = wait::poll(STEP_TIMEOUT, || async {
            let seen = if k < nodes {
                node_offset_s(s, u64::try_from(k + 1).unwrap()).await
            } else {
                proxy_offset_s(s, k - nodes).await
            };
            seen.filter(|&o| offset_is(o, *want, slack))
        })
        .await;
        assert!(
            seen.is_some(),
            "process {k} (nodes first, then proxies) never showed its wall clock at {offset}"
        );
    }
    s.say(&format!("wall clocks stepped to {offsets:?}"));
}

/// Goal: wall-clock steps, forwards and back by an hour and by a day, on every node and
/// proxy while they run, change nothing: no lease is lost and a paused leader's write is
/// still fenced out, because leases, release waits, elections and timeouts all run on
/// the monotonic clock, which a step leaves alone. Method: every process on a wall clock
/// of its own (`FAKETIME_DONT_FAKE_MONOTONIC=1`, offset file re-read every second),
/// lease 2 s; once every proxy admits, step the clocks apart (-1h, +1d, -1d on the
/// nodes, +1h, -1h, +1d on the proxies), see each process report its new time (a node's
/// log timestamps, a proxy's status), and probe every proxy for 2 s: all admitted;
/// freeze the leader's worker, `SIGSTOP` its node, wait for the new leader, step every
/// clock back to the real time (the stopped leader's too), resume it: its write is
/// rejected; see every process report the real time again and probe every proxy for
/// 2 s. Then the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs libfaketime (apt-get install faketime): run with --ignored"]
async fn wall_clock_jumps_forwards_and_back_change_no_lease_and_no_fence() {
    crate::use_tested_binary();
    let lib = require_libfaketime();
    let dir = tempfile::tempdir().unwrap();
    let clocks: Vec<WallClock> = (1..=NODES)
        .map(|id| WallClock::new(dir.path(), &format!("node-{id}")))
        .chain((0..3).map(|i| WallClock::new(dir.path(), &format!("proxy-{i}"))))
        .collect();
    let mut fleet = fleet(3, STEADY_LEASE_MS, 500);
    for i in 0..3 {
        fleet
            .proxy_hosts
            .insert(i, localhost(clocks[3 + i].prefix(&lib)));
    }
    let node_prefixes: BTreeMap<u64, Vec<String>> = (1..=NODES)
        .map(|id| (id, clocks[usize::try_from(id - 1).unwrap()].prefix(&lib)))
        .collect();
    let mut s = Scenario::start(&ScenarioSpec {
        stop_workers: true,
        fleet: Some(fleet),
        node_prefixes,
        ..ScenarioSpec::default()
    })
    .await;
    forget_faked_names(&s);
    let leader = s.wait_announced_leader(0, None).await;
    let (old, token) = (leader.node_id, leader.token.unwrap());
    let (hour, day) = (3_600, 86_400);
    let apart = [
        ("-1h", -hour),
        ("+1d", day),
        ("-1d", -day),
        ("+1h", hour),
        ("-1h", -hour),
        ("+1d", day),
    ];
    for i in 0..3 {
        wait_until_admitted(&mut s, i, token).await;
    }
    jump(&mut s, &clocks, &apart).await;
    every_proxy_admits_for(&mut s, token, Duration::from_secs(2)).await;

    let job = s.freeze_leaders_writer(&leader, 1).await;
    s.cluster.node(old).unwrap().guard.pause().unwrap();
    s.say(&format!(
        "PAUSE node {old}, its worker frozen with token {token}"
    ));
    let next = s.wait_announced_leader(token, Some(old)).await;
    let new_token = next.token.unwrap();
    s.wait_acked(new_token, 1).await;
    for clock in &clocks {
        clock.set("+0");
    }
    let outcome = s.resume_and_release(old, job.seq).await;
    assert_eq!(
        outcome,
        Outcome::Rejected,
        "the paused leader's write with token {token}, after token {new_token}"
    );
    jump(&mut s, &clocks, &[("+0", 0); 6]).await;
    let current = s
        .cluster
        .established_leader(None)
        .await
        .and_then(|l| l.token)
        .unwrap();
    for i in 0..3 {
        wait_until_admitted(&mut s, i, current).await;
    }
    every_proxy_admits_for(&mut s, current, Duration::from_secs(2)).await;
    s.finish("clock: wall-clock jumps");
}
