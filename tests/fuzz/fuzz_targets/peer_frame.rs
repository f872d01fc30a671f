//! Peer frames through the inbound connection's framing and checks, the election loop's
//! guard, and into a raft-rs `RawNode` (node 1 of voters 1, 2, 3, with the node's own raft
//! settings and in-memory storage, its `Ready`s handled in the documented order).
//!
//! Each input is a sequence of operations: a chunk of wire bytes from peer 0 to 3 (split
//! into length-prefixed frames, decoded, checked by the transport for that peer, then by
//! the guard against the node's current state, then stepped), ticks, a campaign, or a
//! proposal.
//!
//! Property: anything the transport's check and the guard let through cannot make raft
//! panic, whatever state earlier messages brought the node to.
#![no_main]

use std::collections::BTreeSet;
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use palisade_election::fuzzing::{LocalState, check_frame, guard_check, read_frames};
use palisade_election::{MAX_TERM_GAP_DEFAULT, NodeConfig};
use raft::RawNode;
use raft::eraftpb::ConfState;
use raft::storage::MemStorage;

/// This node.
const ME: u64 = 1;
/// The cluster's voters.
const VOTERS: [u64; 3] = [1, 2, 3];
/// Operations per input, at most.
const OPS_MAX: usize = 64;
/// Ticks one tick operation runs, at most.
const TICKS_MAX: u8 = 32;

static RAFT_CONFIG: LazyLock<raft::Config> = LazyLock::new(|| {
    let config = NodeConfig {
        id: ME,
        peers: VOTERS
            .iter()
            .map(|&id| (id, format!("127.0.0.1:{}", 7000 + id)))
            .collect(),
        ..NodeConfig::default()
    };
    config.raft_config()
});

static LOGGER: LazyLock<slog::Logger> =
    LazyLock::new(|| slog::Logger::root(slog::Discard, slog::o!()));

fn local_state(node: &RawNode<MemStorage>) -> LocalState {
    let r = &node.raft;
    LocalState {
        id: ME,
        term: r.term,
        leader_id: r.leader_id,
        last_index: r.raft_log.last_index(),
    }
}

/// Handles a `Ready` as the election loop does, with in-memory storage: snapshot,
/// entries and hard state persisted before `advance`, then the commit index; messages
/// are dropped (raft resends), committed entries are not applied.
fn on_ready(node: &mut RawNode<MemStorage>) {
    if !node.has_ready() {
        return;
    }
    let store = node.raft.raft_log.store.clone();
    let mut ready = node.ready();
    let _ = ready.take_messages();
    if !ready.snapshot().is_empty() {
        let _ = store.wl().apply_snapshot(ready.snapshot().clone());
    }
    let _ = ready.take_committed_entries();
    if !ready.entries().is_empty() {
        store
            .wl()
            .append(ready.entries())
            .expect("raft's entries append in order");
    }
    if let Some(hard_state) = ready.hs() {
        store.wl().set_hardstate(hard_state.clone());
    }
    let _ = ready.take_persisted_messages();
    let mut light = node.advance(ready);
    if let Some(commit) = light.commit_index() {
        store.wl().mut_hard_state().set_commit(commit);
    }
    let _ = light.take_messages();
    let _ = light.take_committed_entries();
    node.advance_apply();
}

fuzz_target!(|data: &[u8]| {
    let storage = MemStorage::new_with_conf_state(ConfState::from((VOTERS.to_vec(), vec![])));
    let Ok(mut node) = RawNode::new(&RAFT_CONFIG, storage, &LOGGER) else {
        panic!("the node's raft config is refused");
    };
    let voters: BTreeSet<u64> = VOTERS.into_iter().collect();
    let mut rest = data;
    for _ in 0..OPS_MAX {
        let Some((&op, tail)) = rest.split_first() else {
            break;
        };
        rest = tail;
        match op % 4 {
            0 => {
                // A chunk of wire bytes: peer, u16 length, bytes.
                let [peer, hi, lo, tail @ ..] = rest else {
                    break;
                };
                let len = usize::from(u16::from_be_bytes([*hi, *lo])).min(tail.len());
                let (chunk, tail) = tail.split_at(len);
                rest = tail;
                for frame in read_frames(chunk) {
                    let Ok(Some(message)) = check_frame(&frame, u64::from(*peer % 4), ME) else {
                        continue;
                    };
                    let me = local_state(&node);
                    if guard_check(&voters, MAX_TERM_GAP_DEFAULT, &message, me).is_ok() {
                        let _ = node.step(message);
                        on_ready(&mut node);
                    }
                }
            }
            1 => {
                let ticks = rest.first().map_or(1, |n| n % TICKS_MAX);
                rest = rest.get(1..).unwrap_or_default();
                for _ in 0..ticks {
                    node.tick();
                }
                on_ready(&mut node);
            }
            2 => {
                let _ = node.campaign();
                on_ready(&mut node);
            }
            _ => {
                let _ = node.propose(Vec::new(), b"entry".to_vec());
                on_ready(&mut node);
            }
        }
    }
});
