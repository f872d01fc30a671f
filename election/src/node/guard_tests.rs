//! One test per rule of the guard, each feeding crafted messages to `Guard::check`.

use raft::eraftpb::{ConfState, Entry, Message, MessageType, Snapshot};

use super::*;

fn guard() -> Guard {
    Guard {
        voters: [1, 2, 3].into_iter().collect(),
        max_term_gap: 1_000,
    }
}

/// Node 1 in term 5, following node 2, with 10 entries.
fn me() -> LocalState {
    LocalState {
        id: 1,
        term: 5,
        leader_id: 2,
        last_index: 10,
    }
}

fn msg(kind: MessageType, from: u64, term: u64) -> Message {
    let mut m = Message::default();
    m.set_msg_type(kind);
    m.from = from;
    m.to = 1;
    m.term = term;
    m
}

fn entry(index: u64, term: u64) -> Entry {
    Entry {
        index,
        term,
        ..Entry::default()
    }
}

/// Goal: ordinary traffic from a peer passes every rule.
/// Method: a heartbeat, an append, a vote, an ack and a timeout-now from the leader.
#[test]
fn honest_messages_pass() {
    let mut hb = msg(MessageType::MsgHeartbeat, 2, 5);
    hb.commit = 10;
    let mut app = msg(MessageType::MsgAppend, 2, 5);
    (app.index, app.log_term, app.commit) = (10, 5, 10);
    app.set_entries(vec![entry(11, 5), entry(12, 5)].into());
    let vote = msg(MessageType::MsgRequestVote, 3, 6);
    let mut ack = msg(MessageType::MsgAppendResponse, 3, 5);
    ack.index = 10;
    let timeout = msg(MessageType::MsgTimeoutNow, 2, 5);
    // (A forwarded `MsgTransferLeader` passes only on the leader: see
    // `transfer_leader_to_a_follower_is_dropped`.)
    for m in [hb, app, vote, ack, timeout] {
        assert_eq!(guard().check(&m, &me()), Ok(()), "{m:?}");
    }
}

/// Goal: a sender that is not a voter, or is this node, and a message for another node
/// are dropped. Method: from 9, from 1 (self), and to 3.
#[test]
fn strangers_self_and_misaddressed_messages_are_dropped() {
    let stranger = msg(MessageType::MsgHeartbeat, 9, 5);
    assert_eq!(
        guard().check(&stranger, &me()),
        Err(DropCause::NotAPeer { from: 9 })
    );
    let own = msg(MessageType::MsgHeartbeat, 1, 5);
    assert_eq!(
        guard().check(&own, &me()).unwrap_err().reason(),
        "not_a_peer"
    );
    let mut other = msg(MessageType::MsgHeartbeat, 2, 5);
    other.to = 3;
    assert_eq!(
        guard().check(&other, &me()),
        Err(DropCause::WrongRecipient { to: 3, me: 1 })
    );
}

/// Goal: types peers never send each other are dropped. Method: each local-only type,
/// and read-index traffic, which this node never forwards.
#[test]
fn types_peers_never_send_are_dropped() {
    use MessageType::{
        MsgBeat, MsgCheckQuorum, MsgHup, MsgReadIndex, MsgReadIndexResp, MsgSnapStatus,
        MsgUnreachable,
    };
    for kind in [
        MsgHup,
        MsgBeat,
        MsgUnreachable,
        MsgSnapStatus,
        MsgCheckQuorum,
        MsgReadIndex,
        MsgReadIndexResp,
    ] {
        assert_eq!(
            guard().check(&msg(kind, 2, 5), &me()),
            Err(DropCause::ForbiddenType(kind))
        );
    }
}

/// Goal: a term whose successor overflows is dropped even with an unlimited gap.
/// Method: terms `u64::MAX - 1` and `u64::MAX` with `max_term_gap` = `u64::MAX`.
#[test]
fn terms_that_would_overflow_are_dropped() {
    let g = Guard {
        max_term_gap: u64::MAX,
        ..guard()
    };
    for term in [u64::MAX - 1, u64::MAX] {
        assert_eq!(
            g.check(&msg(MessageType::MsgHeartbeat, 2, term), &me()),
            Err(DropCause::TermOverflow { term })
        );
    }
    assert_eq!(
        g.check(&msg(MessageType::MsgRequestVote, 2, u64::MAX - 2), &me()),
        Ok(())
    );
}

/// Goal: a term more than `max_term_gap` ahead is refused; exactly the gap is accepted.
/// Method: terms 5 + 1000 and 5 + 1001 against a node in term 5.
#[test]
fn terms_far_ahead_are_refused() {
    let ok = msg(MessageType::MsgRequestVote, 3, 1_005);
    assert_eq!(guard().check(&ok, &me()), Ok(()));
    let far = msg(MessageType::MsgRequestVote, 3, 1_006);
    assert_eq!(
        guard().check(&far, &me()),
        Err(DropCause::TermTooFarAhead {
            term: 1_006,
            own: 5,
            gap: 1_000
        })
    );
}

/// Goal: a heartbeat committing past this node's log is dropped (raft-rs panics
/// "`to_commit` out of range"). Method: commit 10^9 and last index + 1.
#[test]
fn heartbeat_commit_beyond_the_log_is_dropped() {
    for commit in [1_000_000_000, 11] {
        let mut hb = msg(MessageType::MsgHeartbeat, 2, 5);
        hb.commit = commit;
        assert_eq!(
            guard().check(&hb, &me()),
            Err(DropCause::CommitBeyondLog {
                commit,
                last_index: 10
            })
        );
    }
}

/// Goal: appends whose entries are not the run after their index are dropped.
/// Method: a gap, a repeat, a backwards run, an overflowing index, an entry term above
/// the message's, a log term above the message's, a term going down.
#[test]
fn inconsistent_appends_are_dropped() {
    let cases: Vec<(u64, u64, Vec<Entry>)> = vec![
        (10, 5, vec![entry(12, 5)]),
        (10, 5, vec![entry(11, 5), entry(11, 5)]),
        (10, 5, vec![entry(9, 5)]),
        (u64::MAX, 5, vec![entry(0, 5)]),
        (10, 5, vec![entry(11, 6)]),
        (10, 6, vec![]),
        (10, 4, vec![entry(11, 5), entry(12, 4)]),
    ];
    for (index, log_term, entries) in cases {
        let mut app = msg(MessageType::MsgAppend, 2, 5);
        (app.index, app.log_term) = (index, log_term);
        app.set_entries(entries.into());
        assert_eq!(
            guard().check(&app, &me()).unwrap_err().reason(),
            "append_inconsistent",
            "{app:?}"
        );
    }
}

/// Goal: an append acknowledgement beyond this node's log is dropped; a rejection is not
/// checked (raft bounds it). Method: index 11 accepted, then rejected.
#[test]
fn acks_beyond_the_log_are_dropped() {
    let mut ack = msg(MessageType::MsgAppendResponse, 3, 5);
    ack.index = 11;
    assert_eq!(
        guard().check(&ack, &me()),
        Err(DropCause::AckBeyondLog {
            index: 11,
            last_index: 10
        })
    );
    ack.reject = true;
    assert_eq!(guard().check(&ack, &me()), Ok(()));
}

/// Goal: a forwarded proposal passes only as one membership or announce list change.
/// Method: a proposal with a plain normal entry, with two conf changes, with none, with a
/// legacy conf change; then one conf change, and one announce list entry.
#[test]
fn proposals_other_than_one_conf_change_are_dropped() {
    use raft::eraftpb::{Entry, EntryType};
    let propose = |types: &[EntryType]| {
        let mut m = msg(MessageType::MsgPropose, 2, 5);
        m.set_entries(
            types
                .iter()
                .map(|&t| {
                    let mut e = Entry::default();
                    e.set_entry_type(t);
                    e
                })
                .collect::<Vec<_>>()
                .into(),
        );
        m
    };
    for bad in [
        &[EntryType::EntryNormal][..],
        &[EntryType::EntryConfChangeV2, EntryType::EntryConfChangeV2][..],
        &[][..],
        &[EntryType::EntryConfChange][..],
    ] {
        assert_eq!(
            guard().check(&propose(bad), &me()),
            Err(DropCause::ProposalNotConfChange)
        );
    }
    assert_eq!(
        guard().check(&propose(&[EntryType::EntryConfChangeV2]), &me()),
        Ok(())
    );
    // A new announce list is a normal entry with its prefix, and passes too.
    let mut announce = propose(&[EntryType::EntryNormal]);
    announce.mut_entries()[0].data = crate::members::announce_entry(&[], None).into();
    assert_eq!(guard().check(&announce, &me()), Ok(()));
}

/// Goal: a snapshot whose membership leaves this node out (or names an id twice) is
/// dropped; one of another membership that includes it passes (it may be joining).
/// Method: voters [2, 3], [2, 3] with learner 4, [1, 2, 3, 3]; then [1, 2, 3, 4] and
/// [3, 1, 2].
#[test]
fn snapshots_without_this_node_are_dropped() {
    let snap = |voters: Vec<u64>, learners: Vec<u64>| {
        let mut cs = ConfState::default();
        cs.set_voters(voters);
        cs.set_learners(learners);
        let mut s = Snapshot::default();
        s.mut_metadata().set_conf_state(cs);
        s.mut_metadata().index = 20;
        s.mut_metadata().term = 5;
        let mut m = msg(MessageType::MsgSnapshot, 2, 5);
        m.set_snapshot(s);
        m
    };
    for (voters, learners) in [
        (vec![2, 3], vec![]),
        (vec![2, 3], vec![4]),
        (vec![1, 2, 3, 3], vec![]),
    ] {
        assert_eq!(
            guard()
                .check(&snap(voters, learners), &me())
                .unwrap_err()
                .reason(),
            "snapshot_membership"
        );
    }
    assert_eq!(guard().check(&snap(vec![3, 1, 2], vec![]), &me()), Ok(()));
    assert_eq!(
        guard().check(&snap(vec![1, 2, 3, 4], vec![]), &me()),
        Ok(())
    );
}

/// Goal: `MsgTimeoutNow` is accepted only from the leader this node follows, in its term.
/// Method: from the other peer, from the leader in a later term, and with no leader known.
#[test]
fn timeout_now_not_from_the_leader_is_dropped() {
    let from_other = msg(MessageType::MsgTimeoutNow, 3, 5);
    assert_eq!(
        guard().check(&from_other, &me()).unwrap_err().reason(),
        "timeout_now_not_from_leader"
    );
    let later = msg(MessageType::MsgTimeoutNow, 2, 6);
    assert!(guard().check(&later, &me()).is_err());
    let leaderless = LocalState {
        leader_id: 0,
        ..me()
    };
    assert!(
        guard()
            .check(&msg(MessageType::MsgTimeoutNow, 2, 5), &leaderless)
            .is_err()
    );
}

/// Goal: a flood of drops of one reason logs at most one warning per interval, and the
/// next warning reports how many were not logged; another reason is not held back.
/// Method: 1,000 drops within one interval, one more after it, one of another reason.
#[test]
fn drop_warnings_are_rate_limited_per_reason() {
    let mut log = DropLog::default();
    let t0 = std::time::Instant::now();
    assert_eq!(log.should_log("commit_beyond_log", t0), Some(0));
    for _ in 0..1_000 {
        assert_eq!(log.should_log("commit_beyond_log", t0), None);
    }
    assert_eq!(log.should_log("term_overflow", t0), Some(0));
    let later = t0 + std::time::Duration::from_millis(DROP_WARN_INTERVAL_MS);
    assert_eq!(log.should_log("commit_beyond_log", later), Some(1_000));
    assert_eq!(log.should_log("commit_beyond_log", later), None);
}

/// Goal: a `MsgTransferLeader` reaches raft only on the leader: a follower would forward
/// it with its term set, which makes raft-rs panic (found by the `peer_frame` fuzz target,
/// input `crash_transfer_leader_to_follower`).
/// Method: the same message to this node as a follower of 2, then as the leader.
#[test]
fn transfer_leader_to_a_follower_is_dropped() {
    let transfer = msg(MessageType::MsgTransferLeader, 3, 5);
    assert_eq!(
        guard().check(&transfer, &me()).unwrap_err().reason(),
        "transfer_not_at_leader"
    );
    let leading = LocalState {
        leader_id: 1,
        ..me()
    };
    assert!(guard().check(&transfer, &leading).is_ok());
}

/// Goal: an append after index `i > 0` that names term 0 for that index is dropped:
/// raft-rs would take it as a match beyond its log and commit past its last index, and
/// panic (found by the `peer_frame` fuzz target: index 64, commit 64, no entries).
/// Method: that append to a node with 10 entries; the same at index 0 passes.
#[test]
fn append_with_term_zero_after_index_zero_is_dropped() {
    let mut app = msg(MessageType::MsgAppend, 2, 5);
    (app.index, app.log_term, app.commit) = (64, 0, 64);
    assert_eq!(
        guard().check(&app, &me()).unwrap_err().reason(),
        "append_inconsistent"
    );
    let mut first = msg(MessageType::MsgAppend, 2, 5);
    (first.index, first.log_term, first.commit) = (0, 0, 0);
    first.set_entries(vec![entry(1, 5)].into());
    assert!(guard().check(&first, &me()).is_ok());
}
