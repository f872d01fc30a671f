//! Test-only fault injection in the TCP transport: drop or delay raft traffic per peer,
//! switched at runtime, so end-to-end tests can partition real `palisade node` processes
//! without root.
//!
//! It is off unless the node was started with [`NodeConfig::test_faults`]
//! (`palisade node` sets it only when the environment variable `PALISADE_TEST_FAULTS=1`
//! is present). Off, the control route of the node API answers 404 and the send path pays
//! one relaxed atomic load.
//!
//! - **Drop** a peer: this node discards what it would send to that peer *and* what it
//!   receives from it, so setting `drop` on one side cuts the link both ways. Dropped
//!   sends are reported to raft as queued (a black hole, as a partition looks at first).
//! - **Delay** a peer: what this node sends to that peer waits `delay_ms` before being
//!   written, in order (a slow link in one direction; set it on both sides for both).
//!
//! [`NodeConfig::test_faults`]: crate::NodeConfig::test_faults

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

pub use palisade_protocol::FaultSpec;
use palisade_protocol::process::TEST_FAULTS_ENV;

/// Longest delay a link may be given: a minute is far beyond any election timeout, so a
/// larger value is certainly a mistake.
pub const FAULT_DELAY_MS_MAX: u64 = 60_000;

/// What to do with one outgoing message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outbound {
    /// Send it now.
    Pass,
    /// Discard it.
    Drop,
    /// Send it after this delay.
    Delay(Duration),
}

/// The fault state of one node's transport. Shared by the send path, the peer readers and
/// the API.
#[derive(Debug)]
pub struct LinkFaults {
    /// Whether faults may be set at all (fixed at start).
    enabled: bool,
    /// Whether any fault is set now. Invariant: false whenever `enabled` is false; read
    /// with one relaxed load on every send and receipt, so the common case costs nothing
    /// more. A relaxed load is enough: a fault switched on a few messages late is still a
    /// fault, and the spec itself is read under the mutex.
    active: AtomicBool,
    /// This node and its peers, to refuse specs naming anyone else.
    me: u64,
    peers: BTreeSet<u64>,
    spec: Mutex<FaultSpec>,
}

/// Why a fault spec was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FaultError {
    /// The node was not started with test faults.
    #[error("test faults are disabled: start the node with {TEST_FAULTS_ENV}=1")]
    Disabled,
    /// A spec names a node that is not a peer of this one.
    #[error("node {id} is not a peer of node {me}")]
    UnknownPeer {
        /// The id given.
        id: u64,
        /// This node.
        me: u64,
    },
    /// A delay is over [`FAULT_DELAY_MS_MAX`].
    #[error("delay of {delay_ms} ms to node {id} is over the limit of {FAULT_DELAY_MS_MAX} ms")]
    DelayTooLong {
        /// The peer.
        id: u64,
        /// The delay given.
        delay_ms: u64,
    },
}

impl LinkFaults {
    /// The fault state of node `me` with `peers` (self included or not); `enabled` decides
    /// whether [`set`](Self::set) is allowed.
    pub fn new(enabled: bool, me: u64, peers: impl IntoIterator<Item = u64>) -> Self {
        Self {
            enabled,
            active: AtomicBool::new(false),
            me,
            peers: peers.into_iter().filter(|&p| p != me).collect(),
            spec: Mutex::new(FaultSpec::default()),
        }
    }

    /// Whether faults may be set.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    fn lock(&self) -> MutexGuard<'_, FaultSpec> {
        // Nothing panics while the lock is held; a poisoned spec is still whole.
        self.spec.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The faults now in force.
    pub fn get(&self) -> FaultSpec {
        self.lock().clone()
    }

    /// Replaces every fault with `spec` (an empty spec heals every link).
    pub fn set(&self, spec: FaultSpec) -> Result<FaultSpec, FaultError> {
        if !self.enabled {
            return Err(FaultError::Disabled);
        }
        for &id in spec.drop.iter().chain(spec.delay_ms.keys()) {
            if !self.peers.contains(&id) {
                return Err(FaultError::UnknownPeer { id, me: self.me });
            }
        }
        if let Some((&id, &delay_ms)) = spec.delay_ms.iter().find(|(_, d)| **d > FAULT_DELAY_MS_MAX)
        {
            return Err(FaultError::DelayTooLong { id, delay_ms });
        }
        let mut current = self.lock();
        *current = spec.clone();
        self.active.store(!spec.is_empty(), Ordering::Relaxed);
        Ok(spec)
    }

    /// What to do with a message to `peer`.
    #[inline]
    pub(crate) fn outbound(&self, peer: u64) -> Outbound {
        if !self.active.load(Ordering::Relaxed) {
            return Outbound::Pass;
        }
        let spec = self.lock();
        if spec.drop.contains(&peer) {
            return Outbound::Drop;
        }
        match spec.delay_ms.get(&peer) {
            Some(&ms) if ms > 0 => Outbound::Delay(Duration::from_millis(ms)),
            _ => Outbound::Pass,
        }
    }

    /// Whether a message received from `peer` must be discarded.
    #[inline]
    pub(crate) fn drops_from(&self, peer: u64) -> bool {
        self.active.load(Ordering::Relaxed) && self.lock().drop.contains(&peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a disabled layer refuses specs and never injects. Method: set on a disabled
    /// layer, then ask about a peer.
    #[test]
    fn disabled_faults_refuse_and_pass_everything() {
        let f = LinkFaults::new(false, 1, [1, 2, 3]);
        let spec = FaultSpec {
            drop: [2].into(),
            ..FaultSpec::default()
        };
        assert_eq!(f.set(spec), Err(FaultError::Disabled));
        assert_eq!(f.outbound(2), Outbound::Pass);
        assert!(!f.drops_from(2));
    }

    /// Goal: drops cut both directions, delays one, and an empty spec heals. Method: set,
    /// check each peer, heal, check again.
    #[test]
    fn drops_and_delays_apply_per_peer_until_healed() {
        let f = LinkFaults::new(true, 1, [1, 2, 3]);
        f.set(FaultSpec {
            drop: [2].into(),
            delay_ms: [(3, 200)].into(),
        })
        .unwrap();
        assert_eq!(f.outbound(2), Outbound::Drop);
        assert!(f.drops_from(2));
        assert_eq!(f.outbound(3), Outbound::Delay(Duration::from_millis(200)));
        assert!(!f.drops_from(3));
        f.set(FaultSpec::default()).unwrap();
        assert_eq!(f.outbound(2), Outbound::Pass);
        assert!(!f.drops_from(2));
    }

    /// Goal: specs naming strangers, this node, or absurd delays are refused whole.
    #[test]
    fn bad_specs_are_refused_and_change_nothing() {
        let f = LinkFaults::new(true, 1, [1, 2, 3]);
        let stranger = FaultSpec {
            drop: [9].into(),
            ..FaultSpec::default()
        };
        assert_eq!(
            f.set(stranger),
            Err(FaultError::UnknownPeer { id: 9, me: 1 })
        );
        let me = FaultSpec {
            drop: [1].into(),
            ..FaultSpec::default()
        };
        assert!(f.set(me).is_err());
        let slow = FaultSpec {
            delay_ms: [(2, FAULT_DELAY_MS_MAX + 1)].into(),
            ..FaultSpec::default()
        };
        assert!(matches!(f.set(slow), Err(FaultError::DelayTooLong { .. })));
        assert_eq!(f.get(), FaultSpec::default());
        assert_eq!(f.outbound(2), Outbound::Pass);
    }

    /// Goal: the wire format is the documented one. Method: parse the README's example.
    #[test]
    fn spec_parses_from_the_documented_json() {
        let spec: FaultSpec =
            serde_json::from_str(r#"{"drop":[2,3],"delay_ms":{"2":200}}"#).unwrap();
        assert_eq!(spec.drop, [2, 3].into());
        assert_eq!(spec.delay_ms, [(2, 200)].into());
        assert!(serde_json::from_str::<FaultSpec>(r#"{"dorp":[2]}"#).is_err());
    }
}
