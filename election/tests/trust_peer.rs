//! Defence in depth, over real sockets in plaintext loopback mode: hand-made peer frames
//! that would panic raft-rs, or move the term far ahead, or make a follower take over, are
//! dropped before raft sees them; every node keeps running and the term does not move.
//!
//! In plaintext a new connection never replaces a peer's live one, so the forger claims
//! the id of a configured voter that is not running (voter 4 of four; three run, which is
//! a quorum): exactly the position of a local process in plaintext loopback mode.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::collections::BTreeMap;
use std::time::Duration;

use palisade_election::{Leadership, Node, NodeConfig, NodeHandle};
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

/// Longest wait for a leader, or for a drop to be counted.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

/// The first frame of a peer connection, as the transport defines it (fields 1-3).
#[derive(Clone, PartialEq, prost::Message)]
struct Hello {
    #[prost(uint32, tag = "1")]
    protocol: u32,
    #[prost(uint64, tag = "2")]
    from: u64,
    #[prost(uint64, tag = "3")]
    to: u64,
}

/// Every later frame: routing and a protobuf raft message.
#[derive(Clone, PartialEq, prost::Message)]
struct PeerFrame {
    #[prost(uint64, tag = "1")]
    from: u64,
    #[prost(uint64, tag = "2")]
    to: u64,
    #[prost(bytes = "vec", tag = "3")]
    payload: Vec<u8>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A frame: u32 big-endian length, then the body.
fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

fn raft_frame(kind: MessageType, from: u64, to: u64, term: u64, commit: u64) -> Vec<u8> {
    let mut m = Message::default();
    m.set_msg_type(kind);
    (m.from, m.to, m.term, m.commit) = (from, to, term, commit);
    let payload = m.write_to_bytes().unwrap();
    frame(&PeerFrame { from, to, payload }.encode_to_vec())
}

/// Connects to `node`'s peer port claiming to be `claimed`, and sends `frames`.
async fn send_as(node: &NodeHandle, claimed: u64, frames: &[Vec<u8>]) {
    let mut stream = TcpStream::connect(node.peer_addr().unwrap()).await.unwrap();
    let hello = Hello {
        protocol: 1,
        from: claimed,
        to: node.id(),
    };
    stream
        .write_all(&frame(&hello.encode_to_vec()))
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
    tokio::time::timeout(SETTLE_TIMEOUT, async {
        while !node.metrics_text().lines().any(|l| {
            l.starts_with("palisade_node_peer_messages_dropped_total") && l.contains(&needle)
        }) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("node {} counted a {reason} drop", node.id()));
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
    let peers: BTreeMap<u64, String> = (1..=4)
        .map(|id| (id, format!("127.0.0.1:{}", free_port())))
        .collect();
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
    let (leader, term) = tokio::time::timeout(SETTLE_TIMEOUT, async {
        loop {
            if let Some(s) = settled(&nodes) {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a leader settled within the deadline");
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
