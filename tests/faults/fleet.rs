//! A fleet: three proxies in fleet mode (`palisade proxy --cluster ... --fleet-name ...`)
//! in front of one recording upstream, three nodes granting leases (`--lease-ms`) and
//! announcing to every proxy. The worker of node N writes through proxy N - 1, so an old
//! leader's write and a new leader's go through different proxies: the case a fence per
//! proxy cannot handle.
//!
//! Each scenario is about one refusal, asserts it, and ends with the history checker
//! over every write (workers' and the test's own probes): no lower token applied after a
//! higher one, every acknowledged write applied once, no refused one applied.
//! - a proxy paused (`SIGSTOP`) through an election and resumed: the old leader's write
//!   through it is rejected (409);
//! - a proxy cut off from the cluster (its `--cluster` URLs and its fleet name go through
//!   relays the test cuts; or, as root with `--ignored`, every proxy in a network
//!   namespace of its own, cut by nft) while the stale leader still reaches it: its
//!   writes turn 503 within one lease, and the stale leader's write through it is never
//!   admitted;
//! - a proxy killed for good during an election: the new leader still gets its token,
//!   within the release wait (lease, drift, write bound) plus a margin;
//! - every node paused: writes through every proxy turn 503 within one lease, and go
//!   through again once the nodes are resumed;
//! - the seeded random mix of `fault_random_mix` with three proxies.

use std::time::{Duration, Instant};

use palisade_cluster::history::Outcome;
use palisade_cluster::{Fleet, LeaderView, Role, wait};
use palisade_protocol::DEFAULT_SCOPE;
use palisade_protocol::process::{EVENT_FIELD, events};
use palisade_tests::netns::NetnsNet;
use palisade_tests::relay::Relay;
use palisade_tests::scenario::{ELECTION_TIMEOUT, STEP_TIMEOUT, Scenario, ScenarioSpec};

/// Proxies of the fleet: as many as nodes, so every worker has a proxy of its own.
const PROXIES: usize = 3;
/// The nodes' `--lease-ms`: long enough for renewals on a loaded 2-core machine, short
/// enough that a release wait keeps the scenarios quick.
const LEASE_MS: u64 = 1_000;
/// The nodes' `--lease-drift-ppm` (their default, given explicitly so the bound below
/// is computed from what they run with).
const DRIFT_PPM: u64 = 10_000;
/// The nodes' `--lease-write-bound-ms` (their default, given explicitly).
const WRITE_BOUND_MS: u64 = 500;
/// Slack on "no write sent after the lease lapsed is admitted": the proxy reads its
/// clock a little after the test stamped the send.
const SEND_SLACK: Duration = Duration::from_millis(100);
/// Slack on "writes turn 503 within one lease": the probe loop's own pace and a loaded
/// machine.
const REFUSAL_MARGIN: Duration = Duration::from_millis(1_500);
/// Generous margin on the release wait of a new leader with a dead proxy: elections,
/// polls and scheduling on a loaded 2-core machine.
const RELEASE_MARGIN: Duration = Duration::from_secs(3);
/// Pause between two probes of a proxy.
const PROBE_GAP: Duration = Duration::from_millis(25);
/// Period of the leadership polls that time a release.
const RELEASE_POLL: Duration = Duration::from_millis(10);

fn fleet() -> Fleet {
    Fleet {
        lease_drift_ppm: Some(DRIFT_PPM),
        lease_write_bound_ms: Some(WRITE_BOUND_MS),
        ..Fleet::new(PROXIES, LEASE_MS)
    }
}

/// The longest a new leader waits before releasing its token when a proxy never
/// acknowledges: `lease_ms * (1 + drift) + write_bound_ms`.
fn release_wait() -> Duration {
    Duration::from_millis(LEASE_MS + LEASE_MS * DRIFT_PPM / 1_000_000 + WRITE_BOUND_MS)
}

fn lease() -> Duration {
    Duration::from_millis(LEASE_MS)
}

fn fleet_spec(stop_workers: bool) -> ScenarioSpec {
    ScenarioSpec {
        stop_workers,
        fleet: Some(fleet()),
        ..ScenarioSpec::default()
    }
}

/// Probes proxy `i` with `token` from `from` on until it answers 503. Panics if a probe
/// sent after `from` + one lease (+ [`SEND_SLACK`]) was admitted, or if an answer is
/// neither 2xx nor 503, or if no 503 comes within [`ELECTION_TIMEOUT`]. Returns when,
/// after `from`, the first refused probe was sent, and when the first probe was (a
/// proxy probed only after another's refusal may be refusing long before).
async fn probe_until_refused(
    s: &mut Scenario,
    i: usize,
    token: u64,
    from: Instant,
) -> (Duration, Duration) {
    let deadline = from + ELECTION_TIMEOUT;
    let mut first = None;
    loop {
        s.pump();
        let (sent, answer) = s.probe(i, token).await;
        let after = sent.saturating_duration_since(from);
        let first = *first.get_or_insert(after);
        match answer {
            Ok(a) if a.status.is_success() => assert!(
                after < lease() + SEND_SLACK,
                "proxy {i} admitted a write with token {token} sent {after:?} after it lost the cluster, past its lease of {LEASE_MS} ms"
            ),
            Ok(a) if a.status == http::StatusCode::SERVICE_UNAVAILABLE => {
                assert!(
                    a.headers.contains_key(http::header::RETRY_AFTER),
                    "proxy {i}'s 503 carries Retry-After: {:?}",
                    a.headers
                );
                return (after, first);
            }
            Ok(a) => panic!(
                "proxy {i} answered {} to a write with token {token}: {}",
                a.status,
                String::from_utf8_lossy(&a.body)
            ),
            Err(e) => panic!("proxy {i} did not answer a write with token {token}: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "proxy {i} still admitted writes {ELECTION_TIMEOUT:?} after it lost the cluster"
        );
        tokio::time::sleep(PROBE_GAP).await;
    }
}

/// Probes proxy `i` with the token of the established leader of the moment until one is
/// admitted, within [`ELECTION_TIMEOUT`]; returns that token.
async fn probe_until_admitted(s: &mut Scenario, i: usize) -> u64 {
    let deadline = Instant::now() + ELECTION_TIMEOUT;
    loop {
        s.pump();
        if let Some(token) = s
            .cluster
            .established_leader(None)
            .await
            .and_then(|l| l.token)
        {
            let (_, answer) = s.probe(i, token).await;
            if answer.as_ref().is_ok_and(|a| a.status.is_success()) {
                return token;
            }
        }
        assert!(
            Instant::now() < deadline,
            "proxy {i} admitted no write with the leader's token within {ELECTION_TIMEOUT:?}"
        );
        tokio::time::sleep(PROBE_GAP).await;
    }
}

/// Waits for a leader above term `above` among the nodes but `except` to release its
/// token, and returns it with the time from when it was first seen leading (role leader
/// in that term, token not yet released) to when its token was first seen.
async fn time_release(s: &Scenario, above: u64, except: u64) -> (LeaderView, Duration) {
    let deadline = Instant::now() + ELECTION_TIMEOUT;
    let mut leading: Option<(u64, Instant)> = None;
    loop {
        for node in s.cluster.nodes.iter().filter(|n| n.id() != except) {
            let Some(l) = node.leadership().await else {
                continue;
            };
            if l.term <= above || l.role != Role::Leader {
                continue;
            }
            let since = match leading {
                Some((term, at)) if term == l.term => at,
                _ => {
                    let now = Instant::now();
                    leading = Some((l.term, now));
                    now
                }
            };
            if l.token.is_some() {
                return (l, since.elapsed());
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader above term {above} released its token within {ELECTION_TIMEOUT:?}"
        );
        tokio::time::sleep(RELEASE_POLL).await;
    }
}

/// How node `id` says it released its token of `term`: the `by` field of its
/// `token-released` log event (`announce` or `lease-expiry`), if it logged one.
fn released_by(s: &Scenario, id: u64, term: u64) -> Option<String> {
    let logs = s.cluster.node(id)?.logs();
    logs.iter().flat_map(|log| log.lines()).find_map(|line| {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let fields = &v["fields"];
        (fields[EVENT_FIELD].as_str() == Some(events::TOKEN_RELEASED)
            && fields["term"].as_u64() == Some(term))
        .then(|| fields["by"].as_str().map(str::to_owned))
        .flatten()
    })
}

/// Goal: a proxy paused (`SIGSTOP`) through a whole election, resumed after the new
/// leader wrote through another proxy, rejects the old leader's write (409): its lease
/// lapsed while it was stopped, so it renews before admitting, learns the new term and
/// raises its fence. Method: freeze the leader's worker at `client-before-send` with
/// token t, `SIGSTOP` its node and the proxy it writes through, wait for the new leader's
/// token t' (released once the paused proxy's lease certainly expired) and a write with
/// it through the new leader's proxy, resume the proxy and the old leader, let its write
/// go: 409, and that proxy's fence is t'. Then the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_proxy_rejects_the_old_leaders_write_after_resuming() {
    crate::use_tested_binary();
    let mut s = Scenario::start(&fleet_spec(true)).await;
    let leader = s.wait_announced_leader(0, None).await;
    let (old, token) = (leader.node_id, leader.token.unwrap());
    let job = s.freeze_leaders_writer(&leader, 2).await;
    let paused = s.worker_proxy(old);
    s.cluster.node(old).unwrap().guard.pause().unwrap();
    s.cluster.proxy_at(paused).unwrap().guard.pause().unwrap();
    s.skip_proxies.insert(paused);
    s.say(&format!(
        "PAUSE node {old} (its worker frozen with token {token}) and proxy {paused}"
    ));

    let next = s.wait_announced_leader(token, Some(old)).await;
    let new_token = next.token.unwrap();
    assert_ne!(
        s.worker_proxy(next.node_id),
        paused,
        "the new leader writes through another proxy"
    );
    s.wait_acked(new_token, 1).await;
    s.say(&format!(
        "node {} leads with token {new_token} and wrote through proxy {}",
        next.node_id,
        s.worker_proxy(next.node_id)
    ));

    s.cluster.proxy_at(paused).unwrap().guard.resume().unwrap();
    let outcome = s.resume_and_release(old, job.seq).await;
    assert_eq!(
        outcome,
        Outcome::Rejected,
        "the old leader's write with token {token} through the resumed proxy {paused}, after token {new_token}"
    );
    assert_eq!(
        s.cluster
            .proxy_at(paused)
            .unwrap()
            .fence(DEFAULT_SCOPE)
            .await,
        Some(new_token),
        "the resumed proxy's fence is the new term"
    );
    let report = s.finish("fleet: paused proxy");
    assert!(report.count(Outcome::Rejected) >= 1);
}

/// How a test cuts one proxy off from the cluster, both ways.
enum Link {
    /// Per proxy, relays in front of each node's API (its `--cluster` URLs) and one in
    /// front of its admin listener (its fleet name, where the nodes announce and lease).
    Relays {
        nodes: Vec<Vec<Relay>>,
        admin: Vec<Relay>,
    },
    /// Every proxy in a network namespace of its own, after the nodes' ones: nft drop
    /// rules in it cut it off from every node's address.
    Nft,
}

impl Link {
    /// Relays for every proxy, and a fleet whose proxies reach the nodes and are reached
    /// by them through them (targets set by [`Link::aim`] once the cluster runs).
    async fn relays() -> (Self, Fleet) {
        let mut nodes: Vec<Vec<Relay>> = Vec::new();
        let mut admin: Vec<Relay> = Vec::new();
        let mut fleet = fleet();
        for i in 0..PROXIES {
            let mut relays = Vec::new();
            for _ in 0..ScenarioSpec::default().nodes {
                relays.push(Relay::start().await);
            }
            fleet
                .cluster_urls
                .insert(i, relays.iter().map(Relay::url).collect());
            nodes.push(relays);
            let relay = Relay::start().await;
            fleet.fleet_names.insert(i, relay.url());
            admin.push(relay);
        }
        (Self::Relays { nodes, admin }, fleet)
    }

    /// Points the relays at the nodes' APIs and the proxies' admin listeners.
    fn aim(&self, s: &Scenario) {
        if let Link::Relays { nodes, admin } = self {
            for (i, relays) in nodes.iter().enumerate() {
                for (relay, node) in relays.iter().zip(&s.cluster.nodes) {
                    relay.set_target(node.spec.api);
                }
                admin[i].set_target(s.cluster.proxy_at(i).unwrap().admin);
            }
        }
    }

    /// The namespace number of proxy `i` (the nodes' come first).
    fn namespace_of(s: &Scenario, i: usize) -> u64 {
        (s.cluster.nodes.len() + i + 1) as u64
    }

    fn cut(&self, s: &Scenario, i: usize) {
        match self {
            Link::Relays { nodes, admin } => {
                for relay in nodes[i].iter().chain([&admin[i]]) {
                    relay.cut();
                }
            }
            Link::Nft => {
                let net = s.net.as_ref().unwrap();
                net.cut(Self::namespace_of(s, i), &s.cluster.ids()).unwrap();
            }
        }
    }

    fn heal(&self, s: &Scenario, i: usize) {
        match self {
            Link::Relays { nodes, admin } => {
                for relay in nodes[i].iter().chain([&admin[i]]) {
                    relay.heal();
                }
            }
            Link::Nft => {
                let net = s.net.as_ref().unwrap();
                net.heal(Self::namespace_of(s, i)).unwrap();
            }
        }
    }
}

/// Goal: a proxy cut off from the cluster (both ways) while the stale leader still
/// reaches it refuses writes (503 with Retry-After) within one lease of the cut, and
/// never admits the stale leader's write; once the links heal it follows the new term.
/// Method: every proxy reaches the nodes, and the nodes reach it, through relays; freeze
/// the leader's worker with token t, cut the relays of the proxy it writes through,
/// probe that proxy with t until 503 (no probe sent after one lease admitted), partition
/// the leader from the other nodes, wait for the new leader's token t' (released by the
/// lease wait: the cut proxy cannot acknowledge), let the stale write go through the cut
/// proxy: not admitted, not applied. Heal; the proxy admits the current token. Then the
/// history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_cut_off_from_the_cluster_refuses_within_one_lease_and_never_admits_the_stale_leader()
{
    crate::use_tested_binary();
    let (link, fleet) = Link::relays().await;
    let s = Scenario::start(&ScenarioSpec {
        stop_workers: true,
        fleet: Some(fleet),
        ..ScenarioSpec::default()
    })
    .await;
    link.aim(&s);
    cut_off_proxy_refuses_the_stale_leader(s, &link, "fleet: proxy cut off (relays)").await;
}

/// Goal: the same with a real cut: every proxy in a network namespace of its own, the
/// stale leader's proxy cut off from every node by nft drop rules in its namespace.
/// Method: as above, with the cut made by nft. Needs root, `ip` and `nft`, so it is
/// ignored by default; run it with `--ignored` where it can run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, ip and nft: run with --ignored"]
async fn proxy_in_a_network_namespace_cut_off_by_nft_refuses_within_one_lease_and_never_admits_the_stale_leader()
 {
    crate::use_tested_binary();
    let nodes = ScenarioSpec::default().nodes;
    let net = NetnsNet::create(nodes + PROXIES).unwrap_or_else(|why| {
        panic!(
            "cannot set up network namespaces: {why} (this test needs root, `ip netns` and `nft`)"
        )
    });
    let s = Scenario::start_on(&fleet_spec(true), Some(net)).await;
    cut_off_proxy_refuses_the_stale_leader(s, &Link::Nft, "fleet: proxy cut off (netns + nft)")
        .await;
}

async fn cut_off_proxy_refuses_the_stale_leader(mut s: Scenario, link: &Link, name: &str) {
    let leader = s.wait_announced_leader(0, None).await;
    let (old, token) = (leader.node_id, leader.token.unwrap());
    let job = s.freeze_leaders_writer(&leader, 1).await;

    let cut = s.worker_proxy(old);
    link.cut(&s, cut);
    let cut_at = Instant::now();
    s.skip_proxies.insert(cut);
    s.say(&format!(
        "CUT proxy {cut} off from the cluster (node {old}'s worker writes through it)"
    ));
    let (refused_after, _) = probe_until_refused(&mut s, cut, token, cut_at).await;
    s.say(&format!(
        "proxy {cut} refuses writes with 503: the first refused write was sent {refused_after:?} after the cut (lease {LEASE_MS} ms)"
    ));
    assert!(
        refused_after <= lease() + REFUSAL_MARGIN,
        "proxy {cut} turned to 503 {refused_after:?} after the cut, more than one lease ({LEASE_MS} ms) + {REFUSAL_MARGIN:?}"
    );

    s.cluster.partition(&[old]).await.unwrap();
    let next = s.wait_announced_leader(token, Some(old)).await;
    let new_token = next.token.unwrap();
    s.say(&format!(
        "node {} leads with token {new_token}; node {old} is partitioned",
        next.node_id
    ));
    s.release(old).await;
    let outcome = s.wait_outcome(old, job.seq).await;
    assert_ne!(
        outcome,
        Outcome::Ok,
        "the stale leader's write with token {token} through the cut-off proxy {cut} was admitted"
    );
    let writer = palisade_tests::scenario::writer(old);
    assert!(
        !s.upstream
            .apply_log()
            .iter()
            .any(|a| a.writer == writer && a.seq == job.seq),
        "the stale write {writer}#{} reached the storage",
        job.seq
    );
    s.say(&format!(
        "the stale write {writer}#{} through proxy {cut} ended {outcome:?}, never applied",
        job.seq
    ));

    link.heal(&s, cut);
    s.cluster.heal().await.unwrap();
    s.skip_proxies.remove(&cut);
    let admitted = probe_until_admitted(&mut s, cut).await;
    assert!(
        admitted >= new_token,
        "after healing, proxy {cut} admits the current token {admitted}"
    );
    let report = s.finish(name);
    assert!(report.ops() > 0);
}

/// Goal: a proxy killed for good during an election does not block the failover: the
/// new leader releases its token within the release wait (`lease_ms * (1 + drift) +
/// write_bound_ms`) plus a generous margin, by the lease wait, and writes with it.
/// Method: `SIGSTOP` the leader and at once `kill -9` the proxy its worker writes
/// through (never restarted); time the new leader from when it is first seen leading to
/// when its token is first seen; check its log says the release came by lease expiry;
/// wait for a write with the new token through a live proxy. Then the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_killed_during_an_election_delays_the_new_token_by_at_most_the_release_wait() {
    crate::use_tested_binary();
    let mut s = Scenario::start(&fleet_spec(false)).await;
    let leader = s.wait_announced_leader(0, None).await;
    let old = leader.node_id;
    let token = leader.token.unwrap();
    s.wait_acked(token, 1).await;
    let dead = s.worker_proxy(old);
    s.workers[&old].guard.pause().unwrap();
    s.cluster.node(old).unwrap().guard.pause().unwrap();
    s.cluster.proxy_at_mut(dead).unwrap().guard.kill9();
    s.skip_proxies.insert(dead);
    s.say(&format!("PAUSE node {old}, KILL proxy {dead} for good"));

    let (next, took) = time_release(&s, leader.term, old).await;
    let new_token = next.token.unwrap();
    s.say(&format!(
        "node {} released token {new_token} {took:?} after it was first seen leading (release wait {:?})",
        next.node_id,
        release_wait()
    ));
    eprintln!(
        "fleet: killed proxy: release took {} ms (bound {} ms + margin {} ms)",
        took.as_millis(),
        release_wait().as_millis(),
        RELEASE_MARGIN.as_millis()
    );
    assert!(
        took <= release_wait() + RELEASE_MARGIN,
        "the new leader released its token {took:?} after leading, more than the release wait {:?} + {RELEASE_MARGIN:?}",
        release_wait()
    );
    let by = wait_for_release_log(&s, next.node_id, next.term).await;
    assert_eq!(
        by, "lease-expiry",
        "with a dead proxy, the release came by the lease wait"
    );
    s.wait_announced_leader(token, Some(old)).await;
    s.wait_acked(new_token, 1).await;
    s.cluster.node(old).unwrap().guard.resume().unwrap();
    s.workers[&old].guard.resume().unwrap();
    let report = s.finish("fleet: killed proxy");
    assert!(report.ops() > 0);
}

/// Waits for node `id`'s `token-released` event of `term` in its log; returns its `by`.
async fn wait_for_release_log(s: &Scenario, id: u64, term: u64) -> String {
    wait::poll(STEP_TIMEOUT, || async { released_by(s, id, term) })
        .await
        .unwrap_or_else(|| {
            panic!("timed out waiting for node {id} to log token-released for term {term}")
        })
}

/// Goal: with the whole cluster unreachable from every proxy, writes through every proxy
/// turn to 503 (with Retry-After) within one lease, none sent after the lease is
/// admitted, and writes go through again once the cluster is back. Method: probe each
/// proxy until it admits the leader's token, `SIGSTOP` every node, probe each proxy until 503,
/// `SIGCONT` them, probe each proxy until a write with the current token is admitted.
/// Then the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_unreachable_from_every_proxy_turns_writes_to_503_within_one_lease_and_back() {
    crate::use_tested_binary();
    let mut s = Scenario::start(&ScenarioSpec {
        workers: false,
        fleet: Some(fleet()),
        ..ScenarioSpec::default()
    })
    .await;
    s.wait_announced_leader(0, None).await;
    // Every proxy admits writes first (a renewal may lag on a loaded machine: wait for
    // it); the probes after the pause carry the highest token admitted.
    let mut token = 0;
    for i in 0..PROXIES {
        token = token.max(probe_until_admitted(&mut s, i).await);
    }
    for node in &s.cluster.nodes {
        node.guard.pause().unwrap();
    }
    let paused_at = Instant::now();
    s.say("PAUSE every node");
    for i in 0..PROXIES {
        let (after, first) = probe_until_refused(&mut s, i, token, paused_at).await;
        s.say(&format!(
            "proxy {i} refuses writes with 503; first refused write sent {after:?} after the pause"
        ));
        assert!(
            after <= (lease() + REFUSAL_MARGIN).max(first),
            "proxy {i} turned to 503 {after:?} after the cluster went away, more than one lease ({LEASE_MS} ms) + {REFUSAL_MARGIN:?}"
        );
    }
    for node in &s.cluster.nodes {
        node.guard.resume().unwrap();
    }
    s.say("RESUME every node");
    for i in 0..PROXIES {
        let admitted = probe_until_admitted(&mut s, i).await;
        assert!(admitted >= token);
    }
    let report = s.finish("fleet: cluster unreachable");
    assert!(report.count(Outcome::Ok) >= 2 * PROXIES);
}

/// Goal: the seeded random mix of faults (pauses, kills, partitions, slow links, slow
/// storage, proxy restarts) keeps every history clean with a fleet of three proxies.
/// Method: the random mix of `fault_random_mix` with a fleet ([`fleet`]); replay with
/// `PALISADE_FAULT_SEED`, soak with `PALISADE_SOAK_SECS`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_never_break_fencing_with_three_proxies() {
    crate::use_tested_binary();
    crate::fault_random_mix::run_mix(
        "fleet random mix",
        ScenarioSpec {
            job_ms: 50,
            fleet: Some(fleet()),
            ..ScenarioSpec::default()
        },
    )
    .await;
}
