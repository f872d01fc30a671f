//! Defence in depth, over real sockets in plaintext loopback mode: hand-made peer frames
//! that would panic raft-rs, or move the term far ahead, or make a follower take over, are
//! dropped before raft sees them; every node keeps running and the term does not move.
//!
//! In plaintext a new connection never replaces a peer's live one, so the forger claims
//! the id of a configured voter that is not running (voter 4 of four; three run, which is
//! a quorum): exactly the position of a local process in plaintext loopback mode.

use std::future::ready;

use palisade_cluster::wait;
use palisade_election::{Leadership, Node, NodeConfig, NodeHandle};
use raft::eraftpb::MessageType;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

use crate::support::{SETTLE_TIMEOUT, hello_frame, loopback_peers, raft_frame};

/// Connects to `node`'s peer port claiming to be `claimed`, and sends `frames`.
async fn send_as(node: &NodeHandle, claimed: u64, frames: &[Vec<u8>]) {
    let mut stream = TcpStream::connect(node.peer_addr().unwrap()).await.unwrap();
    stream
        .write_all(&hello_frame(claimed, node.id()))
        .await
        .unwrap();
    for f in frames {
        // The node may already have closed a refused connection; that is an outcome too.
        if stream.write_all(f).await.is_err() {
            return;
        }
    }
    let _ = stream.flush().await;
}

/// Waits until `node`'s metrics show a drop counted for `reason`.
async fn wait_for_drop(node: &NodeHandle, reason: &str) {
    let needle = format!("reason=\"{reason}\"");
    wait::poll(SETTLE_TIMEOUT, || {
        let counted = node.metrics_text().lines().any(|l| {
            l.starts_with("palisade_node_peer_messages_dropped_total") && l.contains(&needle)
        });
        ready(counted.then_some(()))
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "timed out waiting for node {} to count a {reason} drop",
            node.id()
        )
    });
}

/// Goal: a forged heartbeat with commit 10^9, one with term 2^64-2, one 1,001 terms
/// ahead, and a forged `MsgTimeoutNow` (from a non-peer id, and from a peer that is not
/// the leader) leave every node running with the term unchanged.
/// Method: voters 1-4 on loopback, 1-3 running; once a leader is settled, connect to a
/// follower's and the leader's peer port with a hand-made hello claiming voter 4 (and
/// once claiming the non-peer 9) and send the frames; wait until each drop is counted;
/// then check every node's loop is alive and every term is the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_peer_frames_leave_every_node_running_with_the_term_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let peers = loopback_peers(4);
    let mut nodes = Vec::new();
    for id in 1..=3 {
        let config = NodeConfig {
            id,
            peers: peers.clone(),
            data_dir: dir.path().join(format!("node{id}")),
            tick_ms: 50,
            election_ticks: 20,
            ..NodeConfig::default()
        };
        nodes.push(Node::start(config).await.unwrap());
    }
    let settled = |nodes: &[NodeHandle]| -> Option<(u64, u64)> {
        let views: Vec<Leadership> = nodes.iter().map(|n| *n.leadership().borrow()).collect();
        let leader = views.iter().find(|l| l.token.is_some())?;
        let all_follow = views
            .iter()
            .all(|l| l.term == leader.term && l.leader_id == leader.leader_id);
        all_follow.then(|| (leader.leader_id.unwrap(), leader.term))
    };
    let (leader, term) = wait::poll(SETTLE_TIMEOUT, || ready(settled(&nodes)))
        .await
        .expect("a leader to settle");
    let followers: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    let node = |id: u64| &nodes[usize::try_from(id - 1).unwrap()];

    // At a follower, posing as voter 4 (a peer, but not the leader).
    let (target, other) = (followers[0], 4);
    let hb_commit = raft_frame(
        MessageType::MsgHeartbeat,
        other,
        target,
        term,
        1_000_000_000,
    );
    let hb_overflow = raft_frame(MessageType::MsgHeartbeat, other, target, u64::MAX - 1, 0);
    let hb_far = raft_frame(MessageType::MsgHeartbeat, other, target, term + 1_001, 0);
    let timeout_now = raft_frame(MessageType::MsgTimeoutNow, other, target, term, 0);
    send_as(
        node(target),
        other,
        &[hb_commit, hb_overflow, hb_far, timeout_now],
    )
    .await;
    // A non-peer id: refused at the handshake, and its MsgTimeoutNow goes nowhere.
    let stranger = raft_frame(MessageType::MsgTimeoutNow, 9, target, term, 0);
    send_as(node(target), 9, &[stranger]).await;
    for reason in [
        "commit_beyond_log",
        "term_overflow",
        "term_too_far_ahead",
        "timeout_now_not_from_leader",
    ] {
        wait_for_drop(node(target), reason).await;
    }

    // At the leader, posing as voter 4 too.
    let hb_commit = raft_frame(
        MessageType::MsgHeartbeat,
        other,
        leader,
        term,
        1_000_000_000,
    );
    let hb_overflow = raft_frame(MessageType::MsgHeartbeat, other, leader, u64::MAX - 1, 0);
    send_as(node(leader), other, &[hb_commit, hb_overflow]).await;
    wait_for_drop(node(leader), "commit_beyond_log").await;
    wait_for_drop(node(leader), "term_overflow").await;

    for n in &nodes {
        let rx = n.leadership();
        assert!(
            rx.has_changed().is_ok(),
            "node {}'s election loop is still running",
            n.id()
        );
        let l = *rx.borrow();
        assert_eq!(l.term, term, "node {}'s term did not move", n.id());
    }
    assert_eq!(
        node(leader).leadership().borrow().token,
        Some(term),
        "the leader still holds its token"
    );
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}
