//! In-process clusters over the in-memory network, on tokio's paused clock: time only
//! moves when every task is idle, so ticks, timeouts and partitions play out in virtual
//! time, fast and without depending on the machine's load.
//!
//! Every test records each node's published leadership as it changes and checks, at the
//! end, the two safety claims: at most one leader per term, and a token only on a leader
//! of that very term.

use std::collections::BTreeMap;
use std::future::ready;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_cluster::wait;
use palisade_election::{
    Leadership, MemNetwork, Node, NodeConfig, NodeHandle, Role, TransferError,
};
use tokio::time::Instant;

use crate::support::memory_db;

const TICK_MS: u64 = 100;
const ELECTION_TICKS: u64 = 10;
/// One election timeout (the lower bound of raft's randomized range).
const ELECTION: Duration = Duration::from_millis(TICK_MS * ELECTION_TICKS);

type History = Arc<Mutex<Vec<(u64, Leadership)>>>;

struct Cluster {
    ids: Vec<u64>,
    net: MemNetwork,
    dbs: BTreeMap<u64, Arc<redb::Database>>,
    nodes: BTreeMap<u64, NodeHandle>,
    history: History,
}

fn config(id: u64, ids: &[u64]) -> NodeConfig {
    NodeConfig {
        tick_ms: TICK_MS,
        election_ticks: ELECTION_TICKS,
        ..crate::support::config(id, ids)
    }
}

impl Cluster {
    async fn start(n: u64) -> Self {
        let ids: Vec<u64> = (1..=n).collect();
        let mut cluster = Cluster {
            ids: ids.clone(),
            net: MemNetwork::new(),
            dbs: BTreeMap::new(),
            nodes: BTreeMap::new(),
            history: Arc::default(),
        };
        for &id in &ids {
            cluster.dbs.insert(id, memory_db());
            cluster.boot(id).await;
        }
        cluster
    }

    /// Starts (or restarts) node `id` on its database and records its leadership changes.
    async fn boot(&mut self, id: u64) {
        let node = Node::start_in_memory(config(id, &self.ids), self.dbs[&id].clone(), &self.net)
            .await
            .unwrap();
        let mut rx = node.leadership();
        let history = self.history.clone();
        tokio::spawn(async move {
            loop {
                let l = *rx.borrow_and_update();
                history.lock().unwrap().push((id, l));
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
        self.nodes.insert(id, node);
    }

    fn view(&self, id: u64) -> Leadership {
        *self.nodes[&id].leadership().borrow()
    }

    /// The established leader, if exactly one node holds a token and every other running
    /// node follows it in the same term.
    fn settled_leader(&self) -> Option<(u64, Leadership)> {
        let leaders: Vec<(u64, Leadership)> = self
            .nodes
            .keys()
            .map(|&id| (id, self.view(id)))
            .filter(|(_, l)| l.token.is_some())
            .collect();
        let [(id, l)] = leaders.as_slice() else {
            return None;
        };
        self.nodes
            .keys()
            .all(|&o| {
                let v = self.view(o);
                o == *id
                    || (v.term == l.term && v.leader_id == Some(*id) && v.role == Role::Follower)
            })
            .then_some((*id, *l))
    }

    /// Checks the safety claims over everything published so far.
    fn check_history(&self) {
        let history = self.history.lock().unwrap();
        let mut leader_of_term: BTreeMap<u64, u64> = BTreeMap::new();
        for (id, l) in history.iter() {
            if l.role == Role::Leader {
                let first = *leader_of_term.entry(l.term).or_insert(*id);
                assert_eq!(
                    first, *id,
                    "two leaders in term {}: {first} and {id}",
                    l.term
                );
            }
            if let Some(token) = l.token {
                assert_eq!(
                    token, l.term,
                    "node {id} holds token {token} in term {}",
                    l.term
                );
                assert_eq!(
                    l.role,
                    Role::Leader,
                    "node {id} holds a token as {}",
                    l.role
                );
            }
            assert!(
                l.announced <= l.token.is_some(),
                "node {id} announced without a token"
            );
        }
    }

    async fn stop_all(self) {
        self.check_history();
        for (_, node) in self.nodes {
            node.stop().await.unwrap();
        }
    }
}

/// Goal: a fresh three-node cluster elects exactly one established leader, every node
/// agrees on it, and it stays leader in the same term while nothing fails. Method: start
/// three nodes, wait for a settled leader, let 20 election timeouts pass, compare.
#[tokio::test(start_paused = true)]
async fn three_nodes_elect_one_established_leader_per_term() {
    let c = Cluster::start(3).await;
    let (leader, l) = wait::poll(ELECTION * 10, || ready(c.settled_leader()))
        .await
        .expect("a settled leader");
    assert_eq!(l.token, Some(l.term));
    assert!(l.announced, "with no proxies a token counts as announced");
    tokio::time::sleep(ELECTION * 20).await;
    let (again, l2) = c.settled_leader().expect("still settled");
    assert_eq!(
        (again, l2.term),
        (leader, l.term),
        "a stable cluster changed leader"
    );
    c.stop_all().await;
}

/// Goal: a leader cut off from the majority steps down by check-quorum (without raising
/// its term), and the majority elects a leader of a higher term. Method: partition the
/// leader, wait for both, heal, and see the old leader follow the new term.
#[tokio::test(start_paused = true)]
async fn partitioned_leader_steps_down_and_majority_elects_higher_term() {
    let c = Cluster::start(3).await;
    let (old, l) = wait::poll(ELECTION * 10, || ready(c.settled_leader()))
        .await
        .expect("a settled leader");
    c.net.partition(&[old], &c.ids);
    let cut_at = Instant::now();

    // Watch both at once, noting when the old leader stepped down.
    let mut stepped_down_after = None;
    let (new, nl) = wait::poll(ELECTION * 10, || {
        let v = c.view(old);
        if stepped_down_after.is_none() && v.role != Role::Leader && v.token.is_none() {
            stepped_down_after = Some(cut_at.elapsed());
        }
        let found = c
            .ids
            .iter()
            .filter(|&&id| id != old)
            .map(|&id| (id, c.view(id)))
            .find(|(_, v)| v.token.is_some());
        ready(found.filter(|_| stepped_down_after.is_some()))
    })
    .await
    .expect("step-down and a new leader");
    assert_ne!(new, old);
    assert!(
        nl.term > l.term,
        "new term {} not above {}",
        nl.term,
        l.term
    );
    // check_quorum runs every election timeout and sees the pre-cut traffic once, so the
    // step-down comes within two timeouts (plus the tick it is noticed in).
    let stepped_down_after = stepped_down_after.unwrap();
    assert!(
        stepped_down_after <= ELECTION * 2 + Duration::from_millis(TICK_MS * 2),
        "old leader stepped down only after {stepped_down_after:?}"
    );
    // Pre-vote keeps the isolated node from raising its term.
    assert_eq!(
        c.view(old).term,
        l.term,
        "isolated old leader raised its term"
    );

    c.net.heal();
    wait::poll(ELECTION * 10, || {
        let v = c.view(old);
        ready(
            (v.term == nl.term && v.leader_id == Some(new) && v.role == Role::Follower)
                .then_some(()),
        )
    })
    .await
    .expect("the old leader to follow the new term");
    c.stop_all().await;
}

/// Goal: with pre-vote, a follower that was cut off for a long time rejoins without
/// disrupting the stable leader: no new term anywhere. Method: isolate a follower for 20
/// election timeouts, check it never raised its term, heal, check the leader and term hold.
#[tokio::test(start_paused = true)]
async fn rejoining_node_with_pre_vote_does_not_disrupt_stable_leader() {
    let c = Cluster::start(3).await;
    let (leader, l) = wait::poll(ELECTION * 10, || ready(c.settled_leader()))
        .await
        .expect("a settled leader");
    let lonely = *c.ids.iter().find(|&&id| id != leader).unwrap();
    c.net.partition(&[lonely], &c.ids);
    tokio::time::sleep(ELECTION * 20).await;
    let v = c.view(lonely);
    assert_eq!(
        v.term, l.term,
        "isolated follower raised its term with pre-vote on"
    );
    assert_ne!(v.role, Role::Leader);
    assert_eq!(
        c.view(leader).token,
        Some(l.term),
        "the majority side lost its leader"
    );

    c.net.heal();
    wait::poll(ELECTION * 10, || {
        ready(c.settled_leader().filter(|(id, _)| *id == leader))
    })
    .await
    .expect("the follower to rejoin");
    tokio::time::sleep(ELECTION * 5).await;
    let (still, l2) = c.settled_leader().expect("settled after heal");
    assert_eq!(
        (still, l2.term),
        (leader, l.term),
        "the rejoin disrupted the leader"
    );
    c.stop_all().await;
}

/// Goal: a transfer moves leadership to the named node in a higher term, and the old
/// leader gives up its token. Method: transfer from the leader to a follower through the
/// handle; then resign the new leader and check it lands elsewhere.
#[tokio::test(start_paused = true)]
async fn transfer_moves_leadership_and_raises_term() {
    let c = Cluster::start(3).await;
    let (old, l) = wait::poll(ELECTION * 10, || ready(c.settled_leader()))
        .await
        .expect("a settled leader");
    let target = *c.ids.iter().find(|&&id| id != old).unwrap();
    let done = c.nodes[&old].transfer(target).await.unwrap();
    assert_eq!((done.from, done.to), (old, target));
    assert!(done.term > l.term);
    let (now, nl) = wait::poll(ELECTION * 5, || ready(c.settled_leader()))
        .await
        .expect("the target to settle");
    assert_eq!((now, nl.term), (target, done.term));
    assert_eq!(c.view(old).token, None);

    let resigned = c.nodes[&target].resign().await.unwrap();
    assert_ne!(resigned.to, target);
    assert!(resigned.term > done.term);
    c.stop_all().await;
}

/// Goal: transfer requests are refused with clear reasons when they cannot work. Method:
/// resign on a follower, transfer to an unknown id.
#[tokio::test(start_paused = true)]
async fn transfer_requests_that_cannot_work_are_refused() {
    let c = Cluster::start(3).await;
    let (leader, _) = wait::poll(ELECTION * 10, || ready(c.settled_leader()))
        .await
        .expect("a settled leader");
    let follower = *c.ids.iter().find(|&&id| id != leader).unwrap();
    assert_eq!(
        c.nodes[&follower].resign().await,
        Err(TransferError::NotLeader {
            leader_id: Some(leader)
        })
    );
    assert_eq!(
        c.nodes[&leader].transfer(9).await,
        Err(TransferError::UnknownNode { to: 9 })
    );
    // Asking the current leader to transfer to itself is already done.
    let same = c.nodes[&follower].transfer(leader).await.unwrap();
    assert_eq!(same.to, leader);
    c.stop_all().await;
}

/// Goal: a restarted node keeps its hard state: its term never goes back, and the
/// cluster settles again. Method: stop every node, restart all on the same databases.
#[tokio::test(start_paused = true)]
async fn restart_keeps_hard_state_and_term_never_goes_back() {
    let mut c = Cluster::start(3).await;
    let (_, l) = wait::poll(ELECTION * 10, || ready(c.settled_leader()))
        .await
        .expect("a settled leader");
    let ids = c.ids.clone();
    for id in &ids {
        let node = c.nodes.remove(id).unwrap();
        let rx = node.leadership();
        node.stop().await.unwrap();
        assert!(
            rx.borrow().token.is_none(),
            "a stopped node still shows a token"
        );
    }
    for &id in &ids {
        c.boot(id).await;
        assert!(
            c.view(id).term >= l.term,
            "node {id} restarted in an older term"
        );
    }
    let (_, l2) = wait::poll(ELECTION * 10, || ready(c.settled_leader()))
        .await
        .expect("a settled leader after restart");
    assert!(l2.term > l.term);
    c.stop_all().await;
}

/// Goal: a single-link cut (one direction) is survivable: the cluster still has a leader
/// and safety holds. Method: cut leader -> one follower only; that follower's pre-vote
/// then wins over the other follower, or the leader keeps its quorum; either way the
/// cluster settles after the link heals.
#[tokio::test(start_paused = true)]
async fn one_way_link_cut_keeps_safety_and_cluster_recovers() {
    let c = Cluster::start(3).await;
    let (leader, _) = wait::poll(ELECTION * 10, || ready(c.settled_leader()))
        .await
        .expect("a settled leader");
    let follower = *c.ids.iter().find(|&&id| id != leader).unwrap();
    let before = c.net.delivered(leader, follower);
    c.net.set_link(leader, follower, false);
    tokio::time::sleep(ELECTION * 10).await;
    assert_eq!(
        c.net.delivered(leader, follower),
        before,
        "a cut link delivered"
    );
    assert!(
        c.ids.iter().any(|&id| c.view(id).token.is_some()),
        "no leader with one link cut"
    );
    c.net.heal();
    wait::poll(ELECTION * 10, || ready(c.settled_leader()))
        .await
        .expect("a settled leader after heal");
    c.stop_all().await;
}
