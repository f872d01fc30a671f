//! Election with real `palisade node` processes on 127.0.0.1: real sockets, real fsyncs,
//! real signals (SIGSTOP, SIGCONT, SIGKILL, SIGTERM), started and controlled through
//! `palisade-cluster`. The nodes do not announce to the cluster's proxy here. Short ticks
//! (`--tick-ms 20`, so an election timeout of 200-400 ms) keep the suite fast.

use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use nix::sys::signal::Signal;
use palisade_cluster::client::{Answer, try_send_within};
use palisade_cluster::{Cluster, ClusterOptions, ClusterSpec, Leadership};
use palisade_tests::wait::until;

/// Generous deadline for anything that takes a few election timeouts.
const SETTLE: Duration = Duration::from_secs(15);
/// Timeout of one API request (a long poll included).
const API_TIMEOUT: Duration = Duration::from_secs(5);

/// Three fast nodes that do not announce (a token then counts as announced at once).
fn start(dir: &std::path::Path) -> Cluster {
    let spec = ClusterSpec {
        nodes: 3,
        node_flags: vec!["--tick-ms".into(), "20".into()],
        proxy_flags: Vec::new(),
    };
    let options = ClusterOptions {
        announce: false,
        ..ClusterOptions::default()
    };
    Cluster::start_with(dir, &spec, &options).unwrap()
}

async fn settled(c: &Cluster, ids: &[u64], what: &str) -> Leadership {
    until(what, SETTLE, || c.settled_leader(ids)).await
}

/// One request to node `id`'s API.
async fn api(c: &Cluster, id: u64, method: Method, path: &str, body: &str) -> Answer {
    let url = c.node(id).unwrap().api_url(path);
    try_send_within(
        method,
        &url,
        &[("content-type", "application/json")],
        body.to_owned(),
        API_TIMEOUT,
    )
    .await
    .unwrap()
}

/// Goal: three processes elect exactly one established leader that the others follow.
/// Method: start three nodes and poll their `/v1/leader` until settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_elect_one_established_leader() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path());
    let leader = settled(&c, &c.ids(), "a settled leader").await;
    assert_eq!(leader.token, Some(leader.term));
    assert_eq!(leader.role, "leader");
    assert!(
        leader.announced,
        "with no --announce a token counts as announced"
    );
    assert_eq!(leader.scope, "default");
}

/// Goal: a paused (SIGSTOP) leader is replaced by a new established leader of a higher
/// term, and once continued (SIGCONT) it reports follower of the new term without a token.
/// Method: stop the leader, poll the other two until one holds a higher token, continue
/// the old leader and poll it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_leader_is_replaced_and_resumes_as_follower_of_new_term() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path());
    let ids = c.ids();
    let old = settled(&c, &ids, "a settled leader").await;
    let paused = c.node(old.node_id).unwrap();
    paused.guard.pause().unwrap();
    let stopped_at = Instant::now();
    let new = until("a new established leader", SETTLE, || async {
        c.leaderships()
            .await
            .into_values()
            .find(|v| v.node_id != old.node_id && v.token.is_some_and(|t| t > old.term))
    })
    .await;
    eprintln!(
        "SIGSTOP to new established leader: {:?} (--tick-ms 20)",
        stopped_at.elapsed()
    );
    assert_eq!(new.token, Some(new.term));

    paused.guard.resume().unwrap();
    let resumed = until("the old leader to follow the new term", SETTLE, || async {
        paused
            .leadership()
            .await
            .filter(|v| v.role == "follower" && v.term >= new.term && v.token.is_none())
    })
    .await;
    assert!(resumed.leader_id != 0 || resumed.term > new.term);
    settled(&c, &ids, "the cluster to settle again").await;
}

/// Goal: a node killed with SIGKILL and restarted keeps its hard state: its term never
/// goes back. Method: settle, SIGKILL all three nodes at once (so no peer can teach a
/// restarted node its old term), restart them, and check every first answer's term and
/// the next leader's term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_nodes_restart_with_their_term() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path());
    let ids = c.ids();
    let before = settled(&c, &ids, "a settled leader").await;
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
        let first = until("the restarted node to answer", SETTLE, || node.leadership()).await;
        assert!(
            first.term >= view.term,
            "node {id} restarted at term {} after reaching term {}",
            first.term,
            view.term
        );
    }
    let after = settled(&c, &ids, "a settled leader after restart").await;
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
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path());
    let ids = c.ids();
    let old = settled(&c, &ids, "a settled leader").await;
    let node = c.node_mut(old.node_id).unwrap();
    node.guard.signal(Signal::SIGTERM).unwrap();
    let status = node.guard.wait_exit(SETTLE).unwrap();
    assert_eq!(status, Some(0), "the leader exited with {status:?}");
    let others: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|&id| id != old.node_id)
        .collect();
    let new = settled(&c, &others, "the others to settle").await;
    assert!(new.term > old.term);
    c.node_mut(old.node_id).unwrap().restart().unwrap();
}

/// Goal: transfer and resign over the HTTP API move leadership and raise the term.
/// Method: POST /v1/transfer to a follower, then POST /v1/resign on the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_and_resign_over_http_move_leadership() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path());
    let ids = c.ids();
    let old = settled(&c, &ids, "a settled leader").await;
    let target = *ids.iter().find(|&&id| id != old.node_id).unwrap();
    let answer = api(
        &c,
        old.node_id,
        Method::POST,
        "/v1/transfer",
        &format!("{{\"to\":{target}}}"),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let done = answer.json();
    assert_eq!(done["to"], target);
    assert!(done["term"].as_u64().unwrap() > old.term);
    let now = settled(&c, &ids, "the target to settle").await;
    assert_eq!(now.node_id, target);

    let answer = api(&c, old.node_id, Method::POST, "/v1/resign", "").await;
    assert_eq!(
        answer.status,
        StatusCode::CONFLICT,
        "a follower cannot resign: {}",
        answer.text()
    );
    let answer = api(&c, target, Method::POST, "/v1/resign", "").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let after = settled(&c, &ids, "a settled leader after resign").await;
    assert_ne!(after.node_id, target);
    assert!(after.term > now.term);
}

/// Goal: the long poll answers when the term passes `after_term`, and after the timeout
/// otherwise. Method: poll a follower with the current term and a short timeout (answers
/// late, same term), then start a long poll, transfer leadership, and see it answer early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_answers_on_term_change_or_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path());
    let ids = c.ids();
    let leader = settled(&c, &ids, "a settled leader").await;
    let follower = *ids.iter().find(|&&id| id != leader.node_id).unwrap();
    let started = Instant::now();
    let answer = api(
        &c,
        follower,
        Method::GET,
        &format!("/v1/leader?after_term={}&timeout_ms=300", leader.term),
        "",
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert!(started.elapsed() >= Duration::from_millis(250));

    let url = c.node(follower).unwrap().api_url(&format!(
        "/v1/leader?after_term={}&timeout_ms=900",
        leader.term
    ));
    let poll = tokio::spawn(async move {
        let started = Instant::now();
        let answer = try_send_within(Method::GET, &url, &[], "", API_TIMEOUT).await;
        (started.elapsed(), answer)
    });
    // Give the long poll time to reach the node before the term changes: it must be
    // waiting, not answered at once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answer = api(&c, leader.node_id, Method::POST, "/v1/resign", "").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let (elapsed, answer) = poll.await.unwrap();
    let answer = answer.unwrap();
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let view = answer.json();
    assert!(
        view["term"].as_u64().unwrap() > leader.term,
        "{}",
        answer.text()
    );
    assert!(
        elapsed < Duration::from_millis(900),
        "long poll waited {elapsed:?}"
    );
}

/// Goal: configuration errors exit 2 with a message naming the bad field. Method: start
/// `palisade node` with a bad election timeout and with a missing id.
#[test]
fn config_errors_exit_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let base = [
        "node",
        "--peers",
        "1=127.0.0.1:1,2=127.0.0.1:2",
        "--api",
        "127.0.0.1:0",
    ];
    let cases: [(&[&str], &str); 2] = [
        (&["--id", "1", "--election-ticks", "1"], "election"),
        (&["--election-ticks", "5"], "id"),
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
