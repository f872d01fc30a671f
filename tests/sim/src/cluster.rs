//! The nodes: real `palisade_election` nodes on in-memory redb over the in-memory network,
//! started, crashed and restarted on their durable state, watched, partitioned, asked to
//! hand leadership over, and changed in membership.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_election::{
    Leadership, MemNetwork, Node, NodeConfig, NodeHandle, ScopesService, StartOptions,
};
use palisade_protocol::MemberList;
use redb::backends::InMemoryBackend;

use crate::knobs::{ELECTION_TICKS_RANGE, HEARTBEAT_TICKS, JOIN_ID_FIRST, NAMED_SCOPES, TICK_MS};
use crate::sim::{SCOPE, Sim};
use crate::world::{World, lock};

/// Longest the simulation waits on a node's own operation (a transfer, a membership
/// change) before giving up on it: a few election timeouts.
const NODE_OP_TIMEOUT_MS: u64 = 5_000;
/// Peer addresses are well-formed but never dialled (the network is in memory): member
/// `id` is at this port plus `id`.
const PEER_PORT_BASE: u64 = 7000;
/// While a crash waits for the node's other users (a transfer, a membership change) to
/// let go of its handle, it checks again this often.
const CRASH_RETRY_MS: u64 = 5;

/// Where a member is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Up,
    Crashed,
    /// Removed from the cluster and stopped for good.
    Removed,
}

/// One member: its configuration, its durable state, and its running node.
struct Slot {
    config: NodeConfig,
    /// The raft log's redb, in memory; it outlives crashes, as a disk would.
    db: Arc<redb::Database>,
    /// The member list it joined with (members added at run time).
    join: Option<MemberList>,
    node: Option<Arc<NodeHandle>>,
    life: Life,
    /// Starts so far, to tell one run of the node from the next in the trace.
    incarnation: u64,
}

/// The cluster's members and their network.
pub struct Cluster {
    pub net: MemNetwork,
    slots: Mutex<BTreeMap<u64, Slot>>,
    /// The next id to add (ids are never reused).
    next_id: Mutex<u64>,
    /// A membership change is under way (one at a time).
    pub changing: Mutex<bool>,
}

/// A redb database in memory.
fn memory_db() -> Arc<redb::Database> {
    #[allow(clippy::expect_used)] // An in-memory database cannot fail to be created.
    let db = redb::Database::builder()
        .create_with_backend(InMemoryBackend::new())
        .expect("an in-memory redb");
    Arc::new(db)
}

/// Node `id`'s configuration with `peers`, its election timeout drawn from the seed.
fn config(world: &World, id: u64, peers: &[u64]) -> NodeConfig {
    NodeConfig {
        id,
        peers: peers
            .iter()
            .map(|&p| (p, format!("127.0.0.1:{}", PEER_PORT_BASE + p)))
            .collect(),
        tick_ms: TICK_MS,
        election_ticks: world.dice.draw(ELECTION_TICKS_RANGE),
        heartbeat_ticks: HEARTBEAT_TICKS,
        // Scores would re-draw election timeouts from an unseeded RNG.
        score_oracle: None,
        ..NodeConfig::default()
    }
}

impl Cluster {
    /// `n` members with ids 1..=n, not started.
    pub fn new(world: &World, n: u64) -> Self {
        let ids: Vec<u64> = (1..=n).collect();
        let net = MemNetwork::new();
        let dice = Arc::clone(&world.dice);
        net.set_fault_hook(Arc::new(move |_, _| dice.fate()));
        let slots = ids
            .iter()
            .map(|&id| {
                let slot = Slot {
                    config: config(world, id, &ids),
                    db: memory_db(),
                    join: None,
                    node: None,
                    life: Life::Crashed,
                    incarnation: 0,
                };
                (id, slot)
            })
            .collect();
        Self {
            net,
            slots: Mutex::new(slots),
            next_id: Mutex::new(JOIN_ID_FIRST),
            changing: Mutex::new(false),
        }
    }

    /// Members not removed, running or not.
    pub fn members(&self) -> Vec<u64> {
        lock(&self.slots)
            .iter()
            .filter(|(_, s)| s.life != Life::Removed)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Every id ever started (removed ones included), for partitions.
    pub fn all_ids(&self) -> Vec<u64> {
        lock(&self.slots).keys().copied().collect()
    }

    /// Members that are down (crashed, not removed).
    pub fn crashed(&self) -> Vec<u64> {
        lock(&self.slots)
            .iter()
            .filter(|(_, s)| s.life == Life::Crashed)
            .map(|(&id, _)| id)
            .collect()
    }

    /// The running node `id`.
    pub fn node(&self, id: u64) -> Option<Arc<NodeHandle>> {
        lock(&self.slots).get(&id).and_then(|s| s.node.clone())
    }

    /// Node `id`'s leadership now, if it runs.
    pub fn leadership(&self, id: u64) -> Option<Leadership> {
        self.node(id).map(|n| *n.leadership().borrow())
    }

    /// The running nodes that hold a token now.
    pub fn token_holders(&self) -> Vec<u64> {
        lock(&self.slots)
            .iter()
            .filter_map(|(&id, s)| s.node.as_ref().map(|n| (id, n.leadership())))
            .filter(|(_, l)| l.borrow().token.is_some())
            .map(|(id, _)| id)
            .collect()
    }
}

impl Sim {
    /// Starts node `id` (first start or restart) on its durable state, and watches it.
    pub async fn boot(self: &Arc<Self>, id: u64) {
        let (config, db, join, incarnation) = {
            let mut slots = lock(&self.cluster.slots);
            let Some(slot) = slots.get_mut(&id) else {
                return;
            };
            if slot.life != Life::Crashed {
                return;
            }
            slot.incarnation += 1;
            // Claimed before the start so that nothing boots it twice meanwhile.
            slot.life = Life::Up;
            (
                slot.config.clone(),
                Arc::clone(&slot.db),
                slot.join.clone(),
                slot.incarnation,
            )
        };
        let options = StartOptions {
            join,
            ..StartOptions::default()
        };
        match Node::start_in_memory_with(config, db, &self.cluster.net, options).await {
            Ok(node) => {
                let rx = node.leadership();
                let scopes = node.scopes();
                if let Some(slot) = lock(&self.cluster.slots).get_mut(&id) {
                    slot.node = Some(Arc::new(node));
                }
                self.world
                    .log(&format!("node {id} started (#{incarnation})"));
                tokio::spawn(Arc::clone(self).watch(id, rx, scopes));
            }
            Err(err) => {
                if let Some(slot) = lock(&self.cluster.slots).get_mut(&id) {
                    slot.life = Life::Crashed;
                }
                self.world.log(&format!("node {id} failed to start: {err}"));
            }
        }
    }

    /// Crashes node `id`: its loop stops; what its raft log committed stays.
    pub async fn crash(self: &Arc<Self>, id: u64) {
        self.stop_node(id, Life::Crashed).await;
    }

    /// Stops node `id` and leaves it in `life`.
    async fn stop_node(self: &Arc<Self>, id: u64, life: Life) {
        let node = {
            let mut slots = lock(&self.cluster.slots);
            let Some(slot) = slots.get_mut(&id) else {
                return;
            };
            if slot.life == Life::Removed {
                return;
            }
            slot.life = life;
            slot.node.take()
        };
        let Some(mut node) = node else {
            return;
        };
        // A transfer or membership change may still hold the handle; each is bounded by
        // NODE_OP_TIMEOUT_MS.
        let node = loop {
            match Arc::try_unwrap(node) {
                Ok(node) => break node,
                Err(shared) => {
                    node = shared;
                    tokio::time::sleep(Duration::from_millis(CRASH_RETRY_MS)).await;
                }
            }
        };
        let outcome = node.stop().await;
        self.world
            .log(&format!("node {id} stopped ({life:?}): {outcome:?}"));
    }

    /// Follows one run of node `id`: logs each change of its leadership, checks that no
    /// two nodes hold one token, and announces each new token to the proxies; and, while
    /// it is the established leader, announces each named scope's grant it applies (the
    /// modelled announcer: the node's own fencer, with an empty announce list, marks
    /// every grant fenced at once), every held grant again in a new term, as the fencer
    /// starts over.
    ///
    /// One task for both watches: tokio wakes the waiters of one watch channel in a
    /// random order, so two tasks of the simulation waiting on one channel would not
    /// replay.
    async fn watch(
        self: Arc<Self>,
        id: u64,
        mut rx: tokio::sync::watch::Receiver<Leadership>,
        mut scopes: ScopesService,
    ) {
        let mut last = None;
        let mut announced: BTreeSet<(&'static str, u64)> = BTreeSet::new();
        let mut term = None;
        loop {
            let l = *rx.borrow_and_update();
            let now = (l.term, l.role, l.leader_id, l.token);
            if last != Some(now) {
                last = Some(now);
                self.world.log(&format!(
                    "node {id}: term {} {:?} leader {:?} token {:?}",
                    l.term, l.role, l.leader_id, l.token
                ));
                if let Some(token) = l.token
                    && self.world.check_holder(token, id)
                {
                    self.world.stats().tokens += 1;
                    self.announce(id, SCOPE, token);
                }
            }
            if l.established != term {
                term = l.established;
                announced.clear();
            }
            if l.established.is_some() {
                for view in scopes.held().unwrap_or_default() {
                    let scope = NAMED_SCOPES.into_iter().find(|s| *s == view.scope);
                    if let (Some(scope), Some(token)) = (scope, view.token)
                        && announced.insert((scope, token))
                    {
                        self.world
                            .log(&format!("node {id} announces {scope} token {token}"));
                        self.announce(id, scope, token);
                    }
                }
            }
            // Biased: tokio's random pick between ready branches would differ per run.
            tokio::select! {
                biased;
                changed = rx.changed() => if changed.is_err() { return },
                changed = scopes.changed() => if changed.is_err() { return },
            }
        }
    }

    /// Asks the leader `from` to hand leadership to `to`, and logs the outcome.
    pub async fn transfer(self: &Arc<Self>, from: u64, to: u64) {
        let Some(node) = self.cluster.node(from) else {
            return;
        };
        self.world.log(&format!("transfer {from} -> {to} asked"));
        let timeout = Duration::from_millis(NODE_OP_TIMEOUT_MS);
        let outcome = tokio::time::timeout(timeout, node.transfer(to)).await;
        drop(node);
        let outcome = match outcome {
            Ok(Ok(t)) => format!("done: {} -> {} term {}", t.from, t.to, t.term),
            Ok(Err(err)) => format!("refused: {err}"),
            Err(_) => "no answer in time".to_owned(),
        };
        self.world
            .log(&format!("transfer {from} -> {to} {outcome}"));
    }

    /// Adds a new member through node `via`, then starts it joining with the list the
    /// cluster answered.
    pub async fn add_member(self: &Arc<Self>, via: u64) {
        let Some(node) = self.cluster.node(via) else {
            return;
        };
        let id = {
            let mut next = lock(&self.cluster.next_id);
            *next += 1;
            *next - 1
        };
        let peer = format!("127.0.0.1:{}", PEER_PORT_BASE + id);
        self.world.log(&format!("add member {id} via {via} asked"));
        let timeout = Duration::from_millis(NODE_OP_TIMEOUT_MS);
        let outcome = tokio::time::timeout(timeout, node.add_member(id, peer)).await;
        drop(node);
        match outcome {
            Ok(Ok(list)) => {
                self.world.log(&format!("add member {id} applied"));
                let slot = Slot {
                    config: config(&self.world, id, &[id]),
                    db: memory_db(),
                    join: Some(list),
                    node: None,
                    life: Life::Crashed,
                    incarnation: 0,
                };
                lock(&self.cluster.slots).insert(id, slot);
                self.boot(id).await;
            }
            Ok(Err(err)) => self.world.log(&format!("add member {id} refused: {err}")),
            // The change may still commit; the id is then a member that never starts,
            // which the cluster must survive like a lost machine.
            Err(_) => self
                .world
                .log(&format!("add member {id} not answered in time")),
        }
    }

    /// Removes member `id` through node `via`; once applied, stops it for good.
    pub async fn remove_member(self: &Arc<Self>, via: u64, id: u64) {
        let Some(node) = self.cluster.node(via) else {
            return;
        };
        self.world
            .log(&format!("remove member {id} via {via} asked"));
        let timeout = Duration::from_millis(NODE_OP_TIMEOUT_MS);
        let outcome = tokio::time::timeout(timeout, node.remove_member(id)).await;
        drop(node);
        match outcome {
            Ok(Ok(_)) => {
                self.world.log(&format!("remove member {id} applied"));
                self.stop_node(id, Life::Removed).await;
            }
            Ok(Err(err)) => self
                .world
                .log(&format!("remove member {id} refused: {err}")),
            Err(_) => self
                .world
                .log(&format!("remove member {id} not answered in time")),
        }
    }
}
