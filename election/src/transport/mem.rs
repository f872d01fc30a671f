//! An in-process network for deterministic tests: nodes started with
//! [`Node::start_in_memory`](crate::Node::start_in_memory) exchange raft messages through a
//! shared [`MemNetwork`], where any directed link can be cut and healed.
//!
//! Messages are delivered synchronously into the receiver's inbox (dropped when it is full
//! or the receiver is not attached), so with tokio's paused clock a whole cluster runs on
//! one thread without real time passing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use raft::eraftpb::Message;

use super::{Delivery, Inbound, PeerInbox, ScoreFrame, Transport};

/// What a fault hook ([`MemNetwork::set_fault_hook`]) decides for one raft message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Delivered now, as without a hook.
    Deliver,
    /// Lost on the wire: the sender is told it was queued, the receiver never sees it.
    Lose,
    /// Delivered after this much (tokio) time, unless the receiver is gone by then.
    Delay(std::time::Duration),
}

/// Decides the fate of each raft message from `from` to `to` on a link that is up; called
/// outside the network's lock, in send order. The simulation (`tests/sim`) draws it from
/// its seed.
pub type FaultHook = Arc<dyn Fn(u64, u64) -> Fate + Send + Sync>;

#[derive(Default)]
struct Net {
    /// Attached nodes by id.
    inboxes: BTreeMap<u64, PeerInbox>,
    /// Directed links `(from, to)` that drop everything.
    cut: BTreeSet<(u64, u64)>,
    /// Messages delivered, by directed link; lets tests show traffic did (not) flow.
    delivered: BTreeMap<(u64, u64), u64>,
    /// Loss and delay per message, when set.
    hook: Option<FaultHook>,
}

/// A shared in-memory network. Cheap to clone; clones are the same network.
#[derive(Clone, Default)]
pub struct MemNetwork {
    net: Arc<Mutex<Net>>,
}

impl std::fmt::Debug for MemNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let net = self.lock();
        f.debug_struct("MemNetwork")
            .field("nodes", &net.inboxes.keys().collect::<Vec<_>>())
            .field("cut", &net.cut)
            .finish()
    }
}

impl MemNetwork {
    /// An empty network with every link up.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Net> {
        // The critical sections do not panic; a poisoned lock still guards consistent data.
        self.net.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn attach(&self, id: u64, inbox: PeerInbox) -> MemTransport {
        self.lock().inboxes.insert(id, inbox.clone());
        MemTransport {
            id,
            net: self.clone(),
            inbox,
        }
    }

    /// Detaches node `id`: messages to it are dropped until a node with that id starts again.
    pub fn detach(&self, id: u64) {
        self.lock().inboxes.remove(&id);
    }

    /// Cuts (`up = false`) or restores the directed link `from -> to`.
    pub fn set_link(&self, from: u64, to: u64, up: bool) {
        let mut net = self.lock();
        if up {
            net.cut.remove(&(from, to));
        } else {
            net.cut.insert((from, to));
        }
    }

    /// Cuts every link, both ways, between `group` and the other nodes in `all`.
    pub fn partition(&self, group: &[u64], all: &[u64]) {
        for &a in group {
            for &b in all.iter().filter(|b| !group.contains(b)) {
                self.set_link(a, b, false);
                self.set_link(b, a, false);
            }
        }
    }

    /// Restores every link.
    pub fn heal(&self) {
        self.lock().cut.clear();
    }

    /// Sets the hook that decides, per raft message, whether it is delivered, lost or
    /// delayed (a delayed message is delivered by a task of its own, on tokio's clock).
    pub fn set_fault_hook(&self, hook: FaultHook) {
        self.lock().hook = Some(hook);
    }

    /// How many messages went over the directed link `from -> to` so far.
    pub fn delivered(&self, from: u64, to: u64) -> u64 {
        self.lock().delivered.get(&(from, to)).copied().unwrap_or(0)
    }
}

/// One node's end of a [`MemNetwork`].
pub(crate) struct MemTransport {
    id: u64,
    net: MemNetwork,
    /// This node's own inbox, to detach only itself on drop (a restarted node with the same
    /// id may already be attached).
    inbox: PeerInbox,
}

impl Transport for MemTransport {
    fn send(&mut self, msg: Message) -> Delivery {
        let to = msg.to;
        let inbox = {
            let net = self.net.lock();
            if net.cut.contains(&(self.id, to)) {
                return Delivery::Unreachable;
            }
            match net.inboxes.get(&to) {
                Some(inbox) => inbox.clone(),
                None => return Delivery::Unreachable,
            }
        };
        // Go through the wire encoding and the same checks as the TCP transport.
        let checked = super::encode_raft(&msg)
            .ok()
            .and_then(|bytes| super::check_inbound(&bytes, self.id, to).ok());
        let Some(msg) = checked else {
            return Delivery::Unreachable;
        };
        let hook = self.net.lock().hook.clone();
        match hook.map_or(Fate::Deliver, |hook| hook(self.id, to)) {
            Fate::Deliver => {}
            Fate::Lose => return Delivery::Queued,
            Fate::Delay(after) => {
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    inbox.try_deliver(Inbound::Raft(Box::new(msg)));
                });
                return Delivery::Queued;
            }
        }
        if inbox.try_deliver(Inbound::Raft(Box::new(msg))) {
            *self.net.lock().delivered.entry((self.id, to)).or_default() += 1;
            Delivery::Queued
        } else {
            Delivery::Unreachable
        }
    }

    fn send_score(&mut self, to: u64, frame: ScoreFrame) -> Delivery {
        let Some(inbox) = self.route(to) else {
            return Delivery::Unreachable;
        };
        // The same check as the TCP reader; score frames are not counted in `delivered`,
        // which tests use to see raft traffic.
        let score = Inbound::Score {
            from: self.id,
            frame,
        };
        if super::check_score(&frame).is_err() || !inbox.try_deliver(score) {
            return Delivery::Unreachable;
        }
        Delivery::Queued
    }
}

impl MemTransport {
    /// The inbox of `to` when the link from this node is up and `to` is attached.
    fn route(&self, to: u64) -> Option<PeerInbox> {
        let net = self.net.lock();
        if net.cut.contains(&(self.id, to)) {
            return None;
        }
        net.inboxes.get(&to).cloned()
    }
}

impl Drop for MemTransport {
    fn drop(&mut self) {
        let mut net = self.net.lock();
        if net
            .inboxes
            .get(&self.id)
            .is_some_and(|attached| attached.same_inbox(&self.inbox))
        {
            net.inboxes.remove(&self.id);
        }
    }
}
