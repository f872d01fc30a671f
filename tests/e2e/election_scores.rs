//! Leaders placed by score, with real `palisade node` processes on 127.0.0.1 started with
//! `--score-oracle static`: each node's `--score` comes from its own environment
//! (`PALISADE_SCORE`, set through a per-node `env` prefix), so the scores are known and
//! the outcomes deterministic. Ticks of 50 ms and `--election-ticks 10` (set here, not the
//! default of 5): an election timeout of 500 ms for the best node, and a rank slot of
//! 100 ms. The tests assert which node leads first after a cold start, which needs every
//! node to hear the others' scores before the first timeout runs out; 250 ms (the
//! default ticks at 50 ms) is shorter than starting three processes on a busy machine.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use palisade_cluster::wait::{self, POLL};
use palisade_cluster::{Cluster, ClusterOptions, ClusterSpec, NodeHost};
use palisade_protocol::process::events;
use palisade_protocol::{LeaderView, Role};
use palisade_tests::fixtures::settled_leader;
use palisade_tests::process::start_cluster;

/// Generous deadline for anything that takes a few election timeouts.
const SETTLE: Duration = Duration::from_secs(15);
/// The nodes' `--score-hold-ms`.
const HOLD_MS: u64 = 2_000;

/// The environment prefix that gives a node its static score.
fn score_prefix(score: f64) -> Vec<String> {
    vec!["env".to_owned(), format!("PALISADE_SCORE={score}")]
}

/// `scores.len()` nodes with static scores (node `i + 1` scores `scores[i]`), not
/// announcing (a token then counts as announced at once), with `--score-hold-ms`
/// [`HOLD_MS`] and the default margin of 0.5.
fn start_scored(dir: &std::path::Path, scores: &[f64]) -> Cluster {
    let spec = ClusterSpec {
        nodes: scores.len(),
        node_flags: [
            "--tick-ms",
            "50",
            "--election-ticks",
            "10",
            "--score-oracle",
            "static",
            "--score-hold-ms",
            &HOLD_MS.to_string(),
        ]
        .map(str::to_owned)
        .to_vec(),
        proxy_flags: Vec::new(),
    };
    let options = ClusterOptions {
        announce: false,
        node_hosts: scores
            .iter()
            .map(|s| NodeHost {
                ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
                prefix: score_prefix(*s),
            })
            .collect(),
        ..ClusterOptions::default()
    };
    start_cluster(dir, &spec, &options)
}

/// The established leader above `term` among `ids` (asking only them).
async fn leader_above(c: &Cluster, ids: &[u64], term: u64, what: &str) -> LeaderView {
    wait::poll(SETTLE, || async {
        for &id in ids {
            if let Some(v) = c.node(id).unwrap().leadership().await
                && v.role == Role::Leader
                && v.token.is_some_and(|t| t > term)
            {
                return Some(v);
            }
        }
        None
    })
    .await
    .unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

/// Node `id`'s score as `view` shows it.
fn score_of(view: &LeaderView, id: u64) -> Option<f64> {
    view.scores.as_ref()?.get(&id.to_string()).copied()
}

/// Whether any of node `id`'s logs has a line with event `event`.
fn logged(c: &Cluster, id: u64, event: &str) -> bool {
    c.node(id)
        .unwrap()
        .logs()
        .iter()
        .any(|log| log.lines().any(|l| l.contains(event)))
}

/// Goal: the highest-scored node leads after start; paused, the next best leads; resumed,
/// leadership returns to it after the hold time and not before, by a transfer the leader
/// logs as `score-transfer`; the leader view shows every node's score and the oracle.
/// Method: scores 10, 30, 20 for nodes 1-3; SIGSTOP node 2, wait for a new leader; SIGCONT
/// it and poll node 2 every 20 ms until it leads a newer term, checking that no answer
/// received earlier than the hold time after the SIGCONT showed it leading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_node_leads_next_best_takes_over_and_leadership_returns_after_the_hold() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let c = start_scored(dir.path(), &[10.0, 30.0, 20.0]);
    let ids = c.ids();
    let first = settled_leader(&c, &ids, SETTLE, "a settled leader").await;
    assert_eq!(
        first.node_id, 2,
        "the highest score leads after start: {first:?}"
    );
    let view = wait::poll(SETTLE, || async {
        c.node(2)
            .unwrap()
            .leadership()
            .await
            .filter(|v| v.scores.as_ref().is_some_and(|s| s.len() == 3))
    })
    .await
    .expect("timed out waiting for every score in the leader's view");
    assert_eq!(view.score_oracle.as_deref(), Some("static"));
    assert_eq!(
        [1, 2, 3].map(|id| score_of(&view, id)),
        [Some(10.0), Some(30.0), Some(20.0)]
    );

    let best = c.node(2).unwrap();
    best.guard.pause().unwrap();
    let next = leader_above(&c, &[1, 3], first.term, "a leader after the pause").await;
    assert_eq!(
        next.node_id, 3,
        "the next best leads while node 2 is paused"
    );

    let resumed_at = Instant::now();
    best.guard.resume().unwrap();
    let hold = Duration::from_millis(HOLD_MS);
    let back = wait::poll(SETTLE + hold, || async {
        let v = best.leadership().await;
        let answered = resumed_at.elapsed();
        let leads = v
            .as_ref()
            .is_some_and(|v| v.role == Role::Leader && v.token.is_some_and(|t| t > next.term));
        assert!(
            !leads || answered >= hold,
            "node 2 led again {answered:?} after SIGCONT, before the hold of {hold:?}"
        );
        v.filter(|_| leads)
    })
    .await
    .expect("timed out waiting for node 2 to lead again");
    eprintln!(
        "SIGCONT to node 2 leading again: {:?} (hold {HOLD_MS} ms)",
        resumed_at.elapsed()
    );
    assert!(back.term > next.term);
    assert!(
        logged(&c, 3, events::SCORE_TRANSFER),
        "node 3 logged its hand-over as {}",
        events::SCORE_TRANSFER
    );
    let again = settled_leader(&c, &ids, SETTLE, "the cluster to settle on node 2").await;
    assert_eq!(again.node_id, 2);
}

/// Goal: a node whose log is behind does not win an election before it has caught up,
/// even with the best score; once caught up it leads after the hold. Method: scores 10,
/// 30, 20; SIGKILL the leader (node 2) so node 3 leads a newer term that node 2's log
/// lacks; then SIGSTOP node 3 and restart node 2. Of nodes 1 and 2 only node 1 has the
/// newest log: it must win first, and node 2 must lead only later, in a higher term
/// (raft's transfer catches the target up before it campaigns).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_log_node_with_the_best_score_does_not_win_before_catching_up() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let mut c = start_scored(dir.path(), &[10.0, 30.0, 20.0]);
    let first = settled_leader(&c, &c.ids(), SETTLE, "a settled leader").await;
    assert_eq!(first.node_id, 2);

    c.node_mut(2).unwrap().kill9();
    let second = leader_above(&c, &[1, 3], first.term, "a leader after the kill").await;
    assert_eq!(second.node_id, 3);

    c.node(3).unwrap().guard.pause().unwrap();
    c.node_mut(2).unwrap().restart().unwrap();
    let third = leader_above(&c, &[1, 2], second.term, "a leader of nodes 1 and 2").await;
    assert_eq!(
        third.node_id, 1,
        "node 2's log lacked term {}: node 1 wins first",
        second.term
    );
    let fourth = leader_above(&c, &[2], third.term, "node 2 to lead once caught up").await;
    assert!(fourth.term > third.term);
    assert!(logged(&c, 1, events::SCORE_TRANSFER));
    c.node(3).unwrap().guard.resume().unwrap();
}

/// Goal: scores that move within the margin never move leadership. Method: scores 10,
/// 10.4, 9.7 with the default margin 0.5 (node 1 leads: equal to both, lowest id);
/// restart node 2 three times, alternating its score between 9.6 and 10.4, each time
/// waiting until the leader's view shows the new score and then for longer than the
/// hold; the leader's term and role never change and it logs no `score-transfer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scores_flapping_within_the_margin_never_transfer() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let mut c = start_scored(dir.path(), &[10.0, 10.4, 9.7]);
    let first = settled_leader(&c, &c.ids(), SETTLE, "a settled leader").await;
    assert_eq!(
        first.node_id, 1,
        "scores within the margin: the lowest id leads"
    );
    let hold = Duration::from_millis(HOLD_MS);
    for score in [9.6, 10.4, 9.6] {
        let node = c.node_mut(2).unwrap();
        node.spec.prefix = score_prefix(score);
        node.restart().unwrap();
        wait::poll(SETTLE, || async {
            c.node(1)
                .unwrap()
                .leadership()
                .await
                .filter(|v| score_of(v, 2) == Some(score))
        })
        .await
        .expect("timed out waiting for the leader to see node 2's new score");
        let seen = Instant::now();
        while seen.elapsed() < hold + Duration::from_millis(500) {
            let v = c.node(1).unwrap().leadership().await.unwrap();
            assert_eq!(
                (v.role, v.term),
                (Role::Leader, first.term),
                "node 1 keeps leading its term while node 2 scores {score}"
            );
            tokio::time::sleep(POLL).await;
        }
    }
    assert!(!logged(&c, 1, events::SCORE_TRANSFER));
}
