//! The headline: a leader paused between reading its token and sending its write is
//! fenced out. Real processes: three `palisade node`s announcing to a `palisade proxy` in
//! front of the recording upstream, and a worker (`palisade demo-worker`) beside each
//! node that stops itself at the `client-before-send` failpoint before every write, so
//! the test decides when each write goes out. A "GC pause" is `SIGSTOP` of the leader's
//! node while its worker is frozen at that failpoint, holding the old token.
//!
//! Every write's outcome and what the upstream applied go through the history checker.
//! `PALISADE_FAULT_CYCLES=N` runs the headline N times (default 3).

use palisade_cluster::history::Outcome;
use palisade_tests::scenario::{Scenario, ScenarioSpec};

/// Cycles of the headline by default: enough to see leadership move around, small
/// enough for CI.
const CYCLES_DEFAULT: u64 = 3;

/// Goal: the write of a leader paused between reading its token and sending is rejected
/// (409) once a new leader is elected and announced, in every cycle, and the storage
/// never applies a lower token after a higher one. Method: per cycle, let the leader's
/// worker write, freeze it at `client-before-send` holding token t, `SIGSTOP` its node,
/// wait for a new leader's token t' > t at the proxy, resume both; its write with t must
/// come back rejected. Then check the whole history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_write_of_a_leader_paused_before_send_is_rejected_every_cycle() {
    crate::use_tested_binary();
    let cycles: u64 = std::env::var("PALISADE_FAULT_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CYCLES_DEFAULT);
    let mut s = Scenario::start(&ScenarioSpec::stopping_workers()).await;
    let mut leader = s.wait_announced_leader(0, None).await;
    for cycle in 1..=cycles {
        let (old, token) = (leader.node_id, leader.token.unwrap());
        // Freeze the leader's client between reading its token and sending.
        let job = s.freeze_leaders_writer(&leader, 2).await;
        let node = s.cluster.node(old).unwrap();
        node.guard.pause().unwrap();
        s.say(&format!(
            "cycle {cycle}: PAUSE node {old} and its client, frozen before sending w{old}#{} with token {token}",
            job.seq
        ));

        let next = s.wait_announced_leader(token, Some(old)).await;
        let new_token = next.token.unwrap();
        s.say(&format!(
            "cycle {cycle}: node {} leads with token {new_token}, announced at the proxy",
            next.node_id
        ));

        let outcome = s.resume_and_release(old, job.seq).await;
        assert_eq!(
            outcome,
            Outcome::Rejected,
            "cycle {cycle}: the paused leader's write with token {token} after token {new_token} was announced"
        );
        leader = next;
    }
    let last = leader.token.unwrap();
    s.wait_acked(last, 2).await;
    let report = s.finish("headline");
    assert!(report.count(Outcome::Rejected) >= usize::try_from(cycles).unwrap());
    eprintln!(
        "headline: {cycles} cycles, {} writes checked, {} stale writes rejected, {} violations",
        report.ops(),
        report.count(Outcome::Rejected),
        report.violations.len()
    );
}

/// Goal: the fence on election alone rejects a paused leader's write: the new leader has
/// not written anything yet. Method: hold every worker at the failpoint (so the new
/// leader's worker never sends), freeze the leader's worker with its token and `SIGSTOP`
/// its node, wait for the new token at the proxy, check that the upstream has no write
/// with it, resume the old leader: its write is rejected by the announced fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_leaders_write_is_rejected_by_the_announced_fence_alone() {
    crate::use_tested_binary();
    let mut s = Scenario::start(&ScenarioSpec::stopping_workers()).await;
    let leader = s.wait_announced_leader(0, None).await;
    let old = leader.node_id;
    let token = leader.token.unwrap();
    s.wait_acked(token, 1).await;
    for id in s.cluster.ids() {
        s.hold(id);
    }
    let job = s.wait_stopped(old).await;
    s.cluster.node(old).unwrap().guard.pause().unwrap();
    let next = s.wait_announced_leader(token, Some(old)).await;
    let new_token = next.token.unwrap();
    let newer: Vec<u64> = s
        .upstream
        .apply_log()
        .iter()
        .map(|a| a.token)
        .filter(|&t| t > token)
        .collect();
    assert!(
        newer.is_empty(),
        "the new leader wrote nothing yet, yet the upstream has tokens {newer:?}"
    );

    s.cluster.node(old).unwrap().guard.resume().unwrap();
    s.release(old).await;
    assert_eq!(s.wait_outcome(old, job.seq).await, Outcome::Rejected);
    assert!(
        s.upstream.apply_log().iter().all(|a| a.token <= token),
        "the rejection came from the fence the election set, before any write with token {new_token}"
    );

    for id in s.cluster.ids() {
        s.release(id).await;
    }
    s.wait_acked(new_token, 1).await;
    let report = s.finish("fence on election");
    assert_eq!(report.count(Outcome::Rejected), 1);
}
