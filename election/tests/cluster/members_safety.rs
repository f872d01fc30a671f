//! Membership changes that cannot brick the cluster, in process on tokio's paused clock:
//! new members join as learners (unreachable ones never cost the leader its token) and are
//! promoted once caught up; removals keep a reachable quorum and three voters unless
//! forced; a joint configuration left behind is left; a survivor of a cluster that lost
//! its quorum for good restarts alone with `force_new_cluster` and a higher term.

use std::collections::BTreeMap;
use std::future::ready;
use std::sync::Arc;
use std::time::Duration;

use palisade_cluster::wait;
use palisade_election::{MemNetwork, MemberError, Node, NodeConfig, NodeHandle, Role};
use palisade_protocol::MemberRole;
use palisade_storage::RaftLog;
use raft::eraftpb::ConfState;

use crate::members::{STEP, TICK_MS, config, start_joining};
use crate::support::memory_db as mem_db;

/// The established leader's id and token, if exactly one node has a token.
fn token_holder(nodes: &BTreeMap<u64, NodeHandle>) -> Option<(u64, u64)> {
    let holders: Vec<(u64, u64)> = nodes
        .iter()
        .filter_map(|(&id, n)| {
            let l = *n.leadership().borrow();
            (l.role == Role::Leader).then_some(())?;
            Some((id, l.token?))
        })
        .collect();
    (holders.len() == 1).then(|| holders[0])
}

/// Three voters on `net` over the given databases, once one of them holds a token.
async fn start_on(
    net: &MemNetwork,
    dbs: &BTreeMap<u64, Arc<redb::Database>>,
) -> BTreeMap<u64, NodeHandle> {
    let mut nodes = BTreeMap::new();
    for (&id, db) in dbs {
        let n = Node::start_in_memory(config(id, &[1, 2, 3]), db.clone(), net)
            .await
            .unwrap();
        nodes.insert(id, n);
    }
    wait::poll(STEP, || ready(token_holder(&nodes)))
        .await
        .expect("a leader with a token");
    nodes
}

fn three_dbs() -> BTreeMap<u64, Arc<redb::Database>> {
    (1..=3).map(|id| (id, mem_db())).collect()
}

/// The role node `of` shows for member `id`.
fn role(nodes: &BTreeMap<u64, NodeHandle>, of: u64, id: u64) -> Option<MemberRole> {
    let list = nodes[&of].members().borrow().clone();
    list.members
        .iter()
        .find(|m| m.id == id)
        .and_then(|m| m.role)
}

async fn stop_all(nodes: BTreeMap<u64, NodeHandle>) {
    for (_, n) in nodes {
        n.stop().await.unwrap();
    }
}

/// Goal: adding three members that never answer leaves the leader, its term and its token
/// in place (they are learners: the voters do not change), and a real new member added
/// after them catches up and is promoted to voter, while the silent ones stay learners.
/// Method: three nodes; add 4, 5, 6 (never started) through the leader, checking the
/// token and term after each; run a few election timeouts; add 7 and start it with the
/// join list; wait until every node shows 7 a voter; 4, 5, 6 are still learners.
#[tokio::test(start_paused = true)]
async fn unreachable_new_members_never_cost_the_token_and_a_live_one_is_promoted() {
    let net = MemNetwork::new();
    let mut nodes = start_on(&net, &three_dbs()).await;
    let (leader, token) = token_holder(&nodes).unwrap();
    for id in 4..=6 {
        let list = nodes[&leader]
            .add_member(id, format!("127.0.0.1:{}", 7000 + id))
            .await
            .unwrap();
        let added = list.members.iter().find(|m| m.id == id).unwrap();
        assert_eq!(
            (added.voter, added.role),
            (false, Some(MemberRole::Learner))
        );
        assert_eq!(
            token_holder(&nodes),
            Some((leader, token)),
            "after adding {id}"
        );
    }
    tokio::time::sleep(Duration::from_millis(TICK_MS * 10 * 5)).await;
    assert_eq!(token_holder(&nodes), Some((leader, token)));
    let list = nodes[&leader]
        .add_member(7, "127.0.0.1:7007".to_owned())
        .await
        .unwrap();
    nodes.insert(7, start_joining(7, list, &net).await);
    wait::poll(STEP, || {
        let everywhere = nodes
            .keys()
            .all(|&of| role(&nodes, of, 7) == Some(MemberRole::Voter));
        ready(everywhere.then_some(()))
    })
    .await
    .expect("node 7 promoted to voter on every node");
    for id in 4..=6 {
        assert_eq!(role(&nodes, leader, id), Some(MemberRole::Learner));
    }
    assert_eq!(token_holder(&nodes), Some((leader, token)));
    // A learner is removed without force: the voters do not change.
    let list = nodes[&leader].remove_member(4).await.unwrap();
    assert_eq!(list.removed, vec![4]);
    stop_all(nodes).await;
}

/// Goal: a removal that would leave the voters without a reachable quorum is refused with
/// the figures, even forced, and removing the unreachable voter instead is allowed with
/// force. Method: three nodes; cut one follower off; wait two election timeouts; remove
/// the reachable follower with force (refused: 1 of 2 reachable), then the cut one
/// without force (refused: 2 voters left), then with force.
#[tokio::test(start_paused = true)]
async fn removal_without_a_reachable_quorum_is_refused_with_its_figures() {
    let net = MemNetwork::new();
    let nodes = start_on(&net, &three_dbs()).await;
    let (leader, token) = token_holder(&nodes).unwrap();
    let mut followers = nodes.keys().copied().filter(|&id| id != leader);
    let (up, down) = (followers.next().unwrap(), followers.next().unwrap());
    net.set_link(leader, down, false);
    net.set_link(down, leader, false);
    net.set_link(up, down, false);
    net.set_link(down, up, false);
    tokio::time::sleep(Duration::from_millis(TICK_MS * 10 * 2)).await;
    assert_eq!(token_holder(&nodes).map(|(id, _)| id), Some(leader));
    let err = nodes[&leader].remove_member_forced(up).await.unwrap_err();
    assert_eq!(
        err,
        MemberError::QuorumUnreachable {
            change: format!("removing voter {up}"),
            voters: 2,
            quorum: 2,
            reachable: 1,
            unreachable: vec![down],
        }
    );
    assert!(err.to_string().contains("only 1 of them"), "{err}");
    assert!(matches!(
        nodes[&leader].remove_member(down).await,
        Err(MemberError::BelowSafeMinimum { voters: 2, .. })
    ));
    let list = nodes[&leader].remove_member_forced(down).await.unwrap();
    assert_eq!(list.removed, vec![down]);
    assert_eq!(token_holder(&nodes), Some((leader, token)));
    stop_all(nodes).await;
}

/// Goal: a joint configuration left behind (by an older version, without automatic
/// leaving) is left by the leader on its own. Method: write a joint conf state
/// ({1,2,3} incoming, {1,2} outgoing, no auto-leave) into three fresh logs; start them;
/// wait until a node holds a token and every node shows the configuration not joint.
#[tokio::test(start_paused = true)]
async fn a_joint_configuration_left_behind_is_left() {
    let dbs = three_dbs();
    let peers: BTreeMap<u64, String> = (1..=3)
        .map(|id| (id, format!("127.0.0.1:{}", 7000 + id)))
        .collect();
    for db in dbs.values() {
        let log = RaftLog::open(db.clone()).unwrap();
        log.initialize_members(&peers).unwrap();
        let joint = ConfState {
            voters: vec![1, 2, 3],
            voters_outgoing: vec![1, 2],
            auto_leave: false,
            ..ConfState::default()
        };
        log.apply_membership(&joint, &log.members()).unwrap();
    }
    let net = MemNetwork::new();
    let nodes = start_on(&net, &dbs).await;
    wait::poll(STEP, || {
        ready(
            nodes
                .values()
                .all(|n| !n.members().borrow().joint)
                .then_some(()),
        )
    })
    .await
    .expect("the joint configuration left on every node");
    assert!(token_holder(&nodes).is_some());
    stop_all(nodes).await;
}

/// Goal: the survivor of a cluster that lost two of three voters for good has no leader,
/// and restarted with `force_new_cluster` leads alone with a term above every term before,
/// lists the others removed, and accepts new members as learners. Method: three nodes;
/// note the highest term; stop two for good; wait two election timeouts (no token); stop
/// the survivor and start it on its database with the flag; wait for its token.
#[tokio::test(start_paused = true)]
async fn force_new_cluster_brings_a_lone_survivor_back_with_a_higher_term() {
    let net = MemNetwork::new();
    let dbs = three_dbs();
    let mut nodes = start_on(&net, &dbs).await;
    let (_, first) = token_holder(&nodes).unwrap();
    let survivor = 3;
    for id in [1, 2] {
        nodes.remove(&id).unwrap().stop().await.unwrap();
        net.detach(id);
    }
    tokio::time::sleep(Duration::from_millis(TICK_MS * 10 * 3)).await;
    let before = *nodes[&survivor].leadership().borrow();
    assert_eq!(before.token, None, "no token without a quorum");
    let highest = before.term.max(first);
    nodes.remove(&survivor).unwrap().stop().await.unwrap();
    net.detach(survivor);
    let forced = NodeConfig {
        force_new_cluster: true,
        ..config(survivor, &[1, 2, 3])
    };
    let alone = Node::start_in_memory(forced, dbs[&survivor].clone(), &net)
        .await
        .unwrap();
    let token = wait::poll(STEP, || ready(alone.leadership().borrow().token))
        .await
        .expect("the survivor leads alone");
    assert!(
        token > highest,
        "token {token} is above every term before ({highest})"
    );
    let list = alone.members().borrow().clone();
    assert_eq!(list.removed, vec![1, 2]);
    assert_eq!(list.members.len(), 1);
    let list = alone
        .add_member(4, "127.0.0.1:7004".to_owned())
        .await
        .unwrap();
    assert!(
        list.members
            .iter()
            .any(|m| m.id == 4 && m.role == Some(MemberRole::Learner))
    );
    alone.stop().await.unwrap();
}
