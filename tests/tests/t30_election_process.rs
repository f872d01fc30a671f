//! Election with real `palisade node` processes on 127.0.0.1: real sockets, real fsyncs,
//! real signals (SIGSTOP, SIGCONT, SIGKILL, SIGTERM). Short ticks (`--tick-ms 20`, so an
//! election timeout of 200-400 ms) keep the suite fast; one test measures failover at the
//! default settings.
//!
//! Needs the `palisade` binary: `cargo build -p palisade-cli` first (or set `PALISADE_BIN`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

mod common_node;

use std::time::{Duration, Instant};

use common_node::{NodeCluster, get_leader, palisade_bin, wait_until};
use nix::sys::signal::Signal;

/// Flags for a fast cluster.
const FAST: &[&str] = &["--tick-ms", "20"];
/// Generous deadline for anything that takes a few election timeouts.
const SETTLE: Duration = Duration::from_secs(15);

/// Goal: three processes elect exactly one established leader that the others follow.
/// Method: start three nodes and poll their `/v1/leader` until settled.
#[test]
fn three_processes_elect_one_established_leader() {
    let c = NodeCluster::start(3, FAST);
    let ids = c.ids();
    let leader = wait_until(SETTLE, "a settled leader", || c.settled_leader(&ids));
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
#[test]
fn stopped_leader_is_replaced_and_resumes_as_follower_of_new_term() {
    let mut c = NodeCluster::start(3, FAST);
    let ids = c.ids();
    let old = wait_until(SETTLE, "a settled leader", || c.settled_leader(&ids));
    c.node(old.node_id).signal(Signal::SIGSTOP);
    let stopped_at = Instant::now();
    let others: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|&id| id != old.node_id)
        .collect();
    let new = wait_until(SETTLE, "a new established leader", || {
        c.views(&others)
            .into_iter()
            .find(|v| v.token.is_some_and(|t| t > old.term))
    });
    eprintln!(
        "SIGSTOP to new established leader: {:?} (--tick-ms 20)",
        stopped_at.elapsed()
    );
    assert_eq!(new.token, Some(new.term));

    c.node(old.node_id).signal(Signal::SIGCONT);
    let resumed = wait_until(SETTLE, "the old leader to follow the new term", || {
        get_leader(c.api(old.node_id))
            .filter(|v| v.role == "follower" && v.term >= new.term && v.token.is_none())
    });
    assert!(resumed.leader_id.is_some() || resumed.term > new.term);
    wait_until(SETTLE, "the cluster to settle again", || {
        c.settled_leader(&ids)
    });
}

/// Goal: a node killed with SIGKILL and restarted keeps its hard state: its term never
/// goes back. Method: settle, SIGKILL all three nodes at once (so no peer can teach a
/// restarted node its old term), restart them, and check every first answer's term and
/// the next leader's term.
#[test]
fn killed_nodes_restart_with_their_term() {
    let mut c = NodeCluster::start(3, FAST);
    let ids = c.ids();
    let before = wait_until(SETTLE, "a settled leader", || c.settled_leader(&ids));
    let terms: Vec<(u64, u64)> = ids
        .iter()
        .map(|&id| (id, get_leader(c.api(id)).expect("node answers").term))
        .collect();
    for &id in &ids {
        c.node(id).signal(Signal::SIGKILL);
    }
    for &id in &ids {
        c.restart(id);
    }
    for (id, term) in terms {
        let first = wait_until(SETTLE, "the restarted node to answer", || {
            get_leader(c.api(id))
        });
        assert!(
            first.term >= term,
            "node {id} restarted at term {} after reaching term {term}",
            first.term
        );
    }
    let after = wait_until(SETTLE, "a settled leader after restart", || {
        c.settled_leader(&ids)
    });
    assert!(
        after.term > before.term,
        "new leader's term {} is not above {}",
        after.term,
        before.term
    );
}

/// Goal: SIGTERM on the leader hands leadership over and exits 0. Method: send SIGTERM,
/// wait for exit, check the other two settle on a higher term.
#[test]
fn terminated_leader_hands_over_and_exits_cleanly() {
    let mut c = NodeCluster::start(3, FAST);
    let ids = c.ids();
    let old = wait_until(SETTLE, "a settled leader", || c.settled_leader(&ids));
    let mut proc = c.take(old.node_id);
    proc.signal(Signal::SIGTERM);
    let status = wait_until(SETTLE, "the leader to exit", || proc.try_exit());
    assert!(status.success(), "leader exited with {status}");
    let others: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|&id| id != old.node_id)
        .collect();
    let new = wait_until(SETTLE, "the others to settle", || c.settled_leader(&others));
    assert!(new.term > old.term);
    c.respawn(old.node_id);
}

/// Goal: transfer and resign over the HTTP API move leadership and raise the term.
/// Method: POST /v1/transfer to a follower, then POST /v1/resign on the new leader.
#[test]
fn transfer_and_resign_over_http_move_leadership() {
    let c = NodeCluster::start(3, FAST);
    let ids = c.ids();
    let old = wait_until(SETTLE, "a settled leader", || c.settled_leader(&ids));
    let target = *ids.iter().find(|&&id| id != old.node_id).unwrap();
    let (status, body) = common_node::http(
        c.api(old.node_id),
        "POST",
        "/v1/transfer",
        &format!("{{\"to\":{target}}}"),
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let done: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(done["to"], target);
    assert!(done["term"].as_u64().unwrap() > old.term);
    let now = wait_until(SETTLE, "the target to settle", || c.settled_leader(&ids));
    assert_eq!(now.node_id, target);

    let (status, body) = common_node::http(c.api(old.node_id), "POST", "/v1/resign", "").unwrap();
    assert_eq!(status, 409, "a follower cannot resign: {body}");
    let (status, body) = common_node::http(c.api(target), "POST", "/v1/resign", "").unwrap();
    assert_eq!(status, 200, "{body}");
    let after = wait_until(SETTLE, "a settled leader after resign", || {
        c.settled_leader(&ids)
    });
    assert_ne!(after.node_id, target);
    assert!(after.term > now.term);
}

/// Goal: the long poll answers when the term passes `after_term`, and after the timeout
/// otherwise. Method: poll a follower with the current term and a short timeout (answers
/// late, same term), then start a long poll, transfer leadership, and see it answer early.
#[test]
fn long_poll_answers_on_term_change_or_timeout() {
    let c = NodeCluster::start(3, FAST);
    let ids = c.ids();
    let leader = wait_until(SETTLE, "a settled leader", || c.settled_leader(&ids));
    let follower = *ids.iter().find(|&&id| id != leader.node_id).unwrap();
    let started = Instant::now();
    let (status, body) = common_node::http(
        c.api(follower),
        "GET",
        &format!("/v1/leader?after_term={}&timeout_ms=300", leader.term),
        "",
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(started.elapsed() >= Duration::from_millis(250));

    let api = c.api(follower);
    let term = leader.term;
    let poll = std::thread::spawn(move || {
        let started = Instant::now();
        let answer = common_node::http(
            api,
            "GET",
            &format!("/v1/leader?after_term={term}&timeout_ms=900"),
            "",
        );
        (started.elapsed(), answer)
    });
    std::thread::sleep(Duration::from_millis(100));
    let (status, body) =
        common_node::http(c.api(leader.node_id), "POST", "/v1/resign", "").unwrap();
    assert_eq!(status, 200, "{body}");
    let (elapsed, answer) = poll.join().unwrap();
    let (status, body) = answer.unwrap();
    assert_eq!(status, 200, "{body}");
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(view["term"].as_u64().unwrap() > term, "{body}");
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
        let out = std::process::Command::new(palisade_bin())
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
