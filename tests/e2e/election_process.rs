//! Election with real `palisade node` processes on 127.0.0.1: real sockets, real fsyncs,
//! real signals (SIGSTOP, SIGCONT, SIGKILL, SIGTERM), started and controlled through
//! `palisade-cluster`. The nodes do not announce to the cluster's proxy here. Short ticks
//! (`--tick-ms 20`, so an election timeout of 200-400 ms) keep the suite fast.

use std::time::{Duration, Instant};

use http::StatusCode;
use nix::sys::signal::Signal;
use palisade_client::NodeApi;
use palisade_cluster::{Cluster, ClusterOptions, ClusterSpec, wait};
use palisade_protocol::{DEFAULT_SCOPE, Role};
use palisade_tests::fixtures::settled_leader;
use palisade_tests::process::start_cluster;

/// Generous deadline for anything that takes a few election timeouts.
const SETTLE: Duration = Duration::from_secs(15);

/// Three fast nodes that do not announce (a token then counts as announced at once).
pub(crate) fn start(dir: &std::path::Path) -> Cluster {
    let spec = ClusterSpec {
        nodes: 3,
        node_flags: vec!["--tick-ms".into(), "20".into()],
        proxy_flags: Vec::new(),
    };
    let options = ClusterOptions {
        announce: false,
        ..ClusterOptions::default()
    };
    start_cluster(dir, &spec, &options)
}

/// The API client of node `id`.
fn api(c: &Cluster, id: u64) -> &NodeApi {
    c.node(id).unwrap().api()
}

/// Goal: three processes elect exactly one established leader that the others follow.
/// Method: start three nodes and poll their `/v1/leader` until settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_elect_one_established_leader() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path());
    let leader = settled_leader(&c, &c.ids(), SETTLE, "a settled leader").await;
    assert_eq!(leader.token, Some(leader.term));
    assert_eq!(leader.role, Role::Leader);
    assert!(
        leader.announced,
        "with no --announce a token counts as announced"
    );
    assert_eq!(leader.scope.as_str(), DEFAULT_SCOPE);
}

/// Goal: a paused (SIGSTOP) leader is replaced by a new established leader of a higher
/// term, and once continued (SIGCONT) it reports follower of the new term without a token,
/// following the new leader (or a later one).
/// Method: stop the leader, poll the other two until one holds a higher token, continue
/// the old leader and poll it until it names a leader of the new term or is in a later
/// term. On its way there it may show "follower of the new term, leader unknown" for a
/// moment, which is correct raft: a node adopts a higher term from a vote request or a
/// response without learning the leader (for instance after its check-quorum stepped it
/// down on resume), and learns the leader at the new leader's next heartbeat. A busy
/// machine stretches that moment enough for a poll to see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_leader_is_replaced_and_resumes_as_follower_of_new_term() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path());
    let ids = c.ids();
    let old = settled_leader(&c, &ids, SETTLE, "a settled leader").await;
    let paused = c.node(old.node_id).unwrap();
    paused.guard.pause().unwrap();
    let stopped_at = Instant::now();
    let new = wait::poll(SETTLE, || async {
        c.leaderships()
            .await
            .into_values()
            .find(|v| v.node_id != old.node_id && v.token.is_some_and(|t| t > old.term))
    })
    .await
    .expect("timed out waiting for a new established leader");
    eprintln!(
        "SIGSTOP to new established leader: {:?} (--tick-ms 20)",
        stopped_at.elapsed()
    );
    assert_eq!(new.token, Some(new.term));

    paused.guard.resume().unwrap();
    let resumed = wait::poll(SETTLE, || async {
        paused.leadership().await.filter(|v| {
            v.role == Role::Follower
                && v.term >= new.term
                && v.token.is_none()
                && (v.leader_id.is_some() || v.term > new.term)
        })
    })
    .await
    .expect("timed out waiting for the old leader to follow the new term");
    if resumed.term == new.term {
        assert_eq!(
            resumed.leader_id,
            Some(new.node_id),
            "in the new term the old leader follows the new leader"
        );
    }
    assert_ne!(
        resumed.leader_id,
        Some(old.node_id),
        "it never names itself"
    );
    settled_leader(&c, &ids, SETTLE, "the cluster to settle again").await;
}

/// Goal: a node killed with SIGKILL and restarted keeps its hard state: its term never
/// goes back. Method: settle, SIGKILL all three nodes at once (so no peer can teach a
/// restarted node its old term), restart them, and check every first answer's term and
/// the next leader's term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_nodes_restart_with_their_term() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path());
    let ids = c.ids();
    let before = settled_leader(&c, &ids, SETTLE, "a settled leader").await;
    let terms = c.leaderships().await;
    assert_eq!(terms.len(), ids.len(), "every node answers");
    for node in &mut c.nodes {
        node.kill9();
    }
    for node in &mut c.nodes {
        node.restart().unwrap();
    }
    for (id, view) in terms {
        let node = c.node(id).unwrap();
        let first = wait::poll(SETTLE, || node.leadership())
            .await
            .expect("timed out waiting for the restarted node to answer");
        assert!(
            first.term >= view.term,
            "node {id} restarted at term {} after reaching term {}",
            first.term,
            view.term
        );
    }
    let after = settled_leader(&c, &ids, SETTLE, "a settled leader after restart").await;
    assert!(
        after.term > before.term,
        "new leader's term {} is not above {}",
        after.term,
        before.term
    );
}

/// Goal: SIGTERM on the leader hands leadership over and exits 0. Method: send SIGTERM,
/// wait for exit, check the other two settle on a higher term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_leader_hands_over_and_exits_cleanly() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path());
    let ids = c.ids();
    let old = settled_leader(&c, &ids, SETTLE, "a settled leader").await;
    let node = c.node_mut(old.node_id).unwrap();
    node.guard.signal(Signal::SIGTERM).unwrap();
    let status = node.guard.wait_exit(SETTLE).unwrap();
    assert_eq!(status, Some(0), "the leader exited with {status:?}");
    let others: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|&id| id != old.node_id)
        .collect();
    let new = settled_leader(&c, &others, SETTLE, "the others to settle").await;
    assert!(new.term > old.term);
    c.node_mut(old.node_id).unwrap().restart().unwrap();
}

/// Goal: transfer and resign over the HTTP API move leadership and raise the term.
/// Method: POST /v1/transfer to a follower, then POST /v1/resign on the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_and_resign_over_http_move_leadership() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path());
    let ids = c.ids();
    let old = settled_leader(&c, &ids, SETTLE, "a settled leader").await;
    let target = *ids.iter().find(|&&id| id != old.node_id).unwrap();
    let done = api(&c, old.node_id).transfer(target).await.unwrap();
    assert_eq!((done.from, done.to), (old.node_id, target));
    assert!(done.term > old.term);
    let now = settled_leader(&c, &ids, SETTLE, "the target to settle").await;
    assert_eq!(now.node_id, target);

    let refused = api(&c, old.node_id).resign().await.unwrap_err();
    assert_eq!(
        refused.status(),
        Some(StatusCode::CONFLICT),
        "a follower cannot resign: {refused}"
    );
    let resigned = api(&c, target).resign().await.unwrap();
    assert_eq!(resigned.from, target);
    let after = settled_leader(&c, &ids, SETTLE, "a settled leader after resign").await;
    assert_ne!(after.node_id, target);
    assert!(after.term > now.term);
}

/// Goal: the long poll answers when the term passes `after_term`, and after the timeout
/// otherwise. Method: poll a follower with the current term and a short timeout (answers
/// late, same term), then start a 5 s long poll, make the leader resign, and see it
/// answer before its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_answers_on_term_change_or_timeout() {
    /// The long poll's timeout: well past the resignations below.
    const LONG_POLL: Duration = Duration::from_secs(5);
    /// How long the leader is asked to resign, again after a refused transfer.
    const RESIGN_WITHIN: Duration = Duration::from_secs(4);
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path());
    let ids = c.ids();
    let leader = settled_leader(&c, &ids, SETTLE, "a settled leader").await;
    let follower = *ids.iter().find(|&&id| id != leader.node_id).unwrap();
    let started = Instant::now();
    let same = api(&c, follower)
        .leader_after(leader.term, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(same.term, leader.term, "nothing changed: {same:?}");

    let poller = api(&c, follower).clone();
    let after = leader.term;
    let poll = tokio::spawn(async move {
        let started = Instant::now();
        let answer = poller.leader_after(after, LONG_POLL).await;
        (started.elapsed(), answer)
    });
    // Give the long poll time to reach the node before the term changes: it must be
    // waiting, not answered at once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    // raft may refuse or abandon a transfer (409), as it did once to a follower still
    // catching up just after the first election; the term change is what matters here,
    // so the leader is asked again until one goes through.
    wait::poll(RESIGN_WITHIN, || async {
        api(&c, leader.node_id).resign().await.ok()
    })
    .await
    .expect("timed out waiting for the leader to hand over");
    let (elapsed, view) = poll.await.unwrap();
    let view = view.unwrap();
    assert!(view.term > leader.term, "{view:?}");
    assert!(elapsed < LONG_POLL, "long poll waited {elapsed:?}");
}

/// Goal: configuration errors exit 2 with a message naming the bad field. Method: start
/// `palisade node` with a bad election timeout and with a missing id.
#[test]
fn config_errors_exit_2_naming_the_field() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let base = [
        "node",
        "--peers",
        "1=127.0.0.1:1,2=127.0.0.1:2",
        "--api",
        "127.0.0.1:0",
    ];
    let cases: [(&[&str], &str); 2] = [
        (&["--id", "1", "--election-ticks", "1"], "--election-ticks"),
        (&["--election-ticks", "5"], "--id"),
    ];
    for (extra, field) in cases {
        let out = std::process::Command::new(crate::PALISADE)
            .args(base)
            .arg("--data-dir")
            .arg(dir.path())
            .args(extra)
            .env_remove("PALISADE_ID")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(field), "{extra:?}: {stderr}");
    }
}
