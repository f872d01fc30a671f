//! Membership changes in an in-process cluster over the in-memory network, on tokio's
//! paused clock: adding a member that joins with an empty log (it catches up from a
//! snapshot), removing one, refusing a reused id, and a node whose storage was wiped
//! stopping instead of panicking.

use std::collections::BTreeMap;
use std::future::ready;
use std::sync::Arc;
use std::time::Duration;

use palisade_cluster::wait;
use palisade_election::{
    MemNetwork, MemberError, Node, NodeConfig, NodeError, NodeHandle, Role, StartOptions,
};
use palisade_protocol::MemberList;

use crate::support::{self, memory_db as mem_db};

pub(crate) const TICK_MS: u64 = 100;
/// Longest any step here may take in virtual time: a few election timeouts.
pub(crate) const STEP: Duration = Duration::from_secs(30);

/// Node `id` of the voters `ids`, ticking every [`TICK_MS`] with an election timeout of 10
/// ticks.
pub(crate) fn config(id: u64, ids: &[u64]) -> NodeConfig {
    NodeConfig {
        tick_ms: TICK_MS,
        election_ticks: 10,
        ..support::config(id, ids)
    }
}

/// Starts node `id` on `net` with an empty log, joining the cluster whose member `list`
/// (which names it) a member answered.
pub(crate) async fn start_joining(id: u64, list: MemberList, net: &MemNetwork) -> NodeHandle {
    Node::start_in_memory_with(
        config(id, &[id]),
        mem_db(),
        net,
        StartOptions {
            join: Some(list),
            ..StartOptions::default()
        },
    )
    .await
    .unwrap()
}

fn leader_of(nodes: &BTreeMap<u64, NodeHandle>) -> Option<u64> {
    nodes.iter().find_map(|(&id, n)| {
        let l = *n.leadership().borrow();
        (l.role == Role::Leader && l.token.is_some()).then_some(id)
    })
}

async fn start_three(net: &MemNetwork) -> BTreeMap<u64, NodeHandle> {
    start_three_on(net).await.0
}

/// Three nodes, and their databases (to restart one on its own).
async fn start_three_on(
    net: &MemNetwork,
) -> (
    BTreeMap<u64, NodeHandle>,
    BTreeMap<u64, Arc<redb::Database>>,
) {
    let mut nodes = BTreeMap::new();
    let mut dbs = BTreeMap::new();
    for id in 1..=3 {
        let db = mem_db();
        let n = Node::start_in_memory(config(id, &[1, 2, 3]), db.clone(), net)
            .await
            .unwrap();
        nodes.insert(id, n);
        dbs.insert(id, db);
    }
    wait::poll(STEP, || ready(leader_of(&nodes)))
        .await
        .expect("a leader");
    (nodes, dbs)
}

/// Goal: a member added through a follower joins with an empty log, learns the members
/// from a snapshot, and becomes a voter everywhere; removing it marks its id removed, and
/// adding that id again is refused. Method: three nodes; add node 4 through a follower;
/// start node 4 with only itself in `--peers` and the join list; wait until every node
/// lists 4 as a voter; remove 4 through the leader; add 4 again.
#[tokio::test(start_paused = true)]
async fn joined_member_catches_up_from_a_snapshot_and_removed_id_is_never_reused() {
    let net = MemNetwork::new();
    let mut nodes = start_three(&net).await;
    let leader = leader_of(&nodes).unwrap();
    let follower = *nodes.keys().find(|&&id| id != leader).unwrap();
    let list = nodes[&follower]
        .add_member(4, "127.0.0.1:7004".to_owned())
        .await
        .unwrap();
    assert!(list.members.iter().any(|m| m.id == 4), "{list:?}");
    nodes.insert(4, start_joining(4, list, &net).await);
    wait::poll(STEP, || {
        let voter_everywhere = nodes.values().all(|n| {
            let m = n.members().borrow().clone();
            m.members.iter().any(|m| m.id == 4 && m.voter) && !m.joint
        });
        let led = nodes[&4].leadership().borrow().leader_id.is_some();
        ready((voter_everywhere && led).then_some(()))
    })
    .await
    .expect("node 4 a voter everywhere with a leader");
    assert!(
        nodes[&4]
            .metrics_text()
            .contains("palisade_node_snapshots_applied_total{node_id=\"4\"} 1"),
        "{}",
        nodes[&4].metrics_text()
    );
    let leader = leader_of(&nodes).unwrap();
    let after = nodes[&leader].remove_member(4).await.unwrap();
    assert_eq!(after.removed, vec![4]);
    assert_eq!(
        nodes[&leader]
            .add_member(4, "127.0.0.1:7014".to_owned())
            .await,
        Err(MemberError::Reused { id: 4 })
    );
    // Three voters: removing the leader without force is refused before leadership moves.
    assert!(matches!(
        nodes[&leader].remove_member(leader).await,
        Err(MemberError::BelowSafeMinimum { .. })
    ));
    assert_eq!(leader_of(&nodes), Some(leader), "leadership did not move");
    for (_, n) in nodes {
        n.stop().await.unwrap();
    }
}

/// Goal: a node restarted under its old id with a wiped log stops with `StorageLost`
/// (never a raft panic), and the others keep their leader. Method: three nodes; stop a
/// follower; start it again on a new empty database; wait for its loop to end.
#[tokio::test(start_paused = true)]
async fn wiped_follower_stops_with_storage_lost() {
    let net = MemNetwork::new();
    let mut nodes = start_three(&net).await;
    let leader = leader_of(&nodes).unwrap();
    let term = nodes[&leader].leadership().borrow().term;
    let follower = *nodes.keys().find(|&&id| id != leader).unwrap();
    nodes.remove(&follower).unwrap().stop().await.unwrap();
    net.detach(follower);
    let mut wiped = Node::start_in_memory(config(follower, &[1, 2, 3]), mem_db(), &net)
        .await
        .unwrap();
    let outcome = tokio::time::timeout(STEP, wiped.wait()).await.unwrap();
    match outcome {
        Err(NodeError::StorageLost { id, .. }) => assert_eq!(id, follower),
        other => panic!("expected StorageLost, got {other:?}"),
    }
    let message = outcome_message(follower);
    assert!(message.contains("palisade member remove"), "{message}");
    let l = *nodes[&leader].leadership().borrow();
    assert_eq!((l.term, l.role), (term, Role::Leader));
    for (_, n) in nodes {
        n.stop().await.unwrap();
    }
}

fn outcome_message(id: u64) -> String {
    NodeError::StorageLost {
        id,
        leader_id: 1,
        commit: 3,
        last_index: 0,
    }
    .to_string()
}

/// Goal: a restarted member starts from its stored members table, not from `--peers`,
/// and a log that belongs to another node is refused with the field named. Method: add
/// member 4 (never started); restart a follower on its database with its original
/// three-node `--peers` and check it lists 4; then start id 9 on that database.
#[tokio::test(start_paused = true)]
async fn restart_uses_the_stored_members_and_a_foreign_log_is_refused() {
    let net = MemNetwork::new();
    let (mut nodes, dbs) = start_three_on(&net).await;
    let leader = leader_of(&nodes).unwrap();
    nodes[&leader]
        .add_member(4, "127.0.0.1:7004".to_owned())
        .await
        .unwrap();
    let follower = *nodes.keys().find(|&&id| id != leader).unwrap();
    wait::poll(STEP, || {
        let m = nodes[&follower].members().borrow().clone();
        ready((m.members.iter().any(|m| m.id == 4) && !m.joint).then_some(()))
    })
    .await
    .expect("the follower applied the change");
    nodes.remove(&follower).unwrap().stop().await.unwrap();
    net.detach(follower);
    let again = Node::start_in_memory(config(follower, &[1, 2, 3]), dbs[&follower].clone(), &net)
        .await
        .unwrap();
    let ids: Vec<u64> = again
        .members()
        .borrow()
        .members
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(ids, vec![1, 2, 3, 4]);
    again.stop().await.unwrap();
    net.detach(follower);
    let err = Node::start_in_memory(config(9, &[9]), dbs[&follower].clone(), &net)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        err.is_config() && text.contains("another node or cluster"),
        "{text}"
    );
    for (_, n) in nodes {
        n.stop().await.unwrap();
    }
}

/// Goal: a follower asked to remove itself answers once it applied its removal, and the
/// rest of the cluster goes on with the two others; going below three voters needs force.
/// Method: three nodes; a follower removes itself without force (refused), then with
/// force; wait until the leader lists two members.
#[tokio::test(start_paused = true)]
async fn follower_removing_itself_answers_and_the_others_go_on() {
    let net = MemNetwork::new();
    let nodes = start_three(&net).await;
    let leader = leader_of(&nodes).unwrap();
    let follower = *nodes.keys().find(|&&id| id != leader).unwrap();
    assert_eq!(
        nodes[&follower].remove_member(follower).await,
        Err(MemberError::BelowSafeMinimum {
            id: follower,
            voters: 2
        })
    );
    let list = nodes[&follower]
        .remove_member_forced(follower)
        .await
        .unwrap();
    assert!(list.removed.contains(&follower), "{list:?}");
    wait::poll(STEP, || {
        let m = nodes[&leader].members().borrow().clone();
        ready((m.members.len() == 2 && !m.joint).then_some(()))
    })
    .await
    .expect("the leader left the joint configuration");
    assert!(nodes[&leader].leadership().borrow().token.is_some());
    for (_, n) in nodes {
        n.stop().await.unwrap();
    }
}
