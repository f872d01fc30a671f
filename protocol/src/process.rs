//! What a `palisade` process and the process that started it agree on: the lines it
//! prints on stdout when it is ready or stopped at a failpoint, the environment
//! variables that switch test behaviour on, and the `event` field of the log lines
//! that tests read.

use std::fmt;
use std::net::SocketAddr;

/// Names the failpoints at which the process prints a [`FailpointStop`] line and stops
/// itself with `SIGSTOP` (test builds only).
pub const FAILPOINT_STOP_ENV: &str = "PALISADE_FAILPOINT_STOP";
/// `1` turns on the node's peer-link test faults and `/v1/test/faults`.
pub const TEST_FAULTS_ENV: &str = "PALISADE_TEST_FAULTS";
/// With a number N, `palisade node` keeps only N raft entries behind the applied index and
/// compacts once N more accumulated (end-to-end tests of snapshots only).
pub const TEST_LOG_RETAINED_ENV: &str = "PALISADE_TEST_LOG_RETAINED";
/// The demo's worker process prints this line once it is ready.
pub const WORKER_READY_LINE: &str = "palisade demo-worker ready";

/// The structured log field that names an event tests and tools may key on.
pub const EVENT_FIELD: &str = "event";

/// Log events, the values of [`EVENT_FIELD`]. Every one of them is logged with the
/// node's current `term`, which is already durable when it is logged.
pub mod events {
    /// A node started (after loading its raft state).
    pub const NODE_STARTED: &str = "node-started";
    /// A node's role, term or known leader changed.
    pub const LEADERSHIP_CHANGED: &str = "leadership-changed";
    /// A leader became established: its term is now a fencing token.
    pub const LEADER_ESTABLISHED: &str = "leader-established";
    /// Every configured proxy accepted the token.
    pub const TOKEN_ANNOUNCED: &str = "token-announced";
    /// A leader running with fleet leases released its token for writing; field `by`:
    /// `announce` (every proxy accepted the term) or `lease-expiry` (the release wait
    /// passed first).
    pub const TOKEN_RELEASED: &str = "token-released";
    /// A leader started handing leadership to a follower whose score stayed above its
    /// own by more than the margin for longer than the hold time (fields `to`,
    /// `own_score`, `to_score`, `oracle`).
    pub const SCORE_TRANSFER: &str = "score-transfer";
    /// A proxy refused a write with a stale token.
    pub const STALE_REJECTED: &str = "stale-rejected";
    /// A proxy raised a fence.
    pub const FENCE_RAISED: &str = "fence-raised";
    /// An operator reset a fence (possibly down).
    pub const FENCE_RESET: &str = "fence-reset";
    /// A proxy refused a token whose proof was missing or invalid.
    pub const PROOF_REJECTED: &str = "proof-rejected";
    /// A node API refused a request for its client certificate's role (403
    /// `forbidden-role`; fields `route`, `method`, `peer`, `detail`).
    pub const ROLE_FORBIDDEN: &str = "role-forbidden";
    /// A proxy in fleet mode could not renew its lease (no node granted it, or one
    /// refused it), logged with the cause.
    pub const LEASE_REFUSED: &str = "lease-refused";
    /// A proxy in fleet mode saw a write complete after its lease expired plus the
    /// configured write bound: the one window the lease does not cover.
    pub const LEASE_OVERRUN: &str = "lease-overrun";
    /// A node applied a membership change (fields `change`: `add`, `remove` or
    /// `leave-joint`; `member_id`, `peer`, `index`, `voters`).
    pub const MEMBERSHIP_CHANGED: &str = "membership-changed";
    /// A node refused to go on because its storage lost entries the cluster had
    /// acknowledged (its data directory was wiped or replaced); it stops with exit code 1.
    pub const STORAGE_LOST: &str = "storage-lost";
    /// A node installed a snapshot from the leader (field `index`).
    pub const SNAPSHOT_APPLIED: &str = "snapshot-applied";
    /// A node applied a new `--announce` proxy list agreed through raft (fields `index`,
    /// `proxies`).
    pub const ANNOUNCE_CHANGED: &str = "announce-changed";
}

/// `palisade proxy listening on ADDR (admin ADDR)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyReady {
    /// The client listener.
    pub listen: SocketAddr,
    /// The admin listener.
    pub admin: SocketAddr,
}

const PROXY_READY_PREFIX: &str = "palisade proxy listening on ";

impl ProxyReady {
    /// Reads the line, or `None` when it is not this line.
    pub fn parse(line: &str) -> Option<Self> {
        let rest = line.trim().strip_prefix(PROXY_READY_PREFIX)?;
        let (listen, rest) = rest.split_once(" (admin ")?;
        let admin = rest.strip_suffix(')')?;
        Some(Self {
            listen: listen.parse().ok()?,
            admin: admin.parse().ok()?,
        })
    }
}

impl fmt::Display for ProxyReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PROXY_READY_PREFIX}{} (admin {})",
            self.listen, self.admin
        )
    }
}

/// `palisade node ID listening on ADDR (raft ADDR)`; an address the node does not have
/// is written `-`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeReady {
    /// The node id.
    pub id: u64,
    /// The API listener.
    pub api: Option<SocketAddr>,
    /// The peer (raft) listener.
    pub peer: Option<SocketAddr>,
}

const NODE_READY_PREFIX: &str = "palisade node ";

impl NodeReady {
    /// Reads the line, or `None` when it is not this line.
    pub fn parse(line: &str) -> Option<Self> {
        let rest = line.trim().strip_prefix(NODE_READY_PREFIX)?;
        let (id, rest) = rest.split_once(" listening on ")?;
        let (api, rest) = rest.split_once(" (raft ")?;
        let peer = rest.strip_suffix(')')?;
        let addr = |s: &str| -> Option<Option<SocketAddr>> {
            if s == "-" {
                Some(None)
            } else {
                s.parse().ok().map(Some)
            }
        };
        Some(Self {
            id: id.parse().ok()?,
            api: addr(api)?,
            peer: addr(peer)?,
        })
    }
}

impl fmt::Display for NodeReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |a: Option<SocketAddr>| a.map_or_else(|| "-".to_owned(), |a| a.to_string());
        write!(
            f,
            "{NODE_READY_PREFIX}{} listening on {} (raft {})",
            self.id,
            show(self.api),
            show(self.peer)
        )
    }
}

/// `palisade failpoint NAME reached (pid PID)`: printed just before the process stops
/// itself at a failpoint named in [`FAILPOINT_STOP_ENV`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailpointStop {
    /// The failpoint.
    pub name: String,
    /// The stopped process.
    pub pid: u32,
}

const FAILPOINT_PREFIX: &str = "palisade failpoint ";

impl FailpointStop {
    /// Reads the line, or `None` when it is not this line.
    pub fn parse(line: &str) -> Option<Self> {
        let rest = line.trim().strip_prefix(FAILPOINT_PREFIX)?;
        let (name, rest) = rest.split_once(" reached (pid ")?;
        let pid = rest.strip_suffix(')')?.parse().ok()?;
        Some(Self {
            name: name.to_owned(),
            pid,
        })
    }
}

impl fmt::Display for FailpointStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{FAILPOINT_PREFIX}{} reached (pid {})",
            self.name, self.pid
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: every line reads back what wrote it, and other lines are not taken for it.
    /// Method: display, parse, compare; parse near-misses.
    #[test]
    fn lines_round_trip() {
        let p = ProxyReady {
            listen: "127.0.0.1:5".parse().unwrap(),
            admin: "[::1]:6".parse().unwrap(),
        };
        assert_eq!(ProxyReady::parse(&p.to_string()), Some(p));
        assert_eq!(
            ProxyReady::parse("palisade proxy listening on x (admin y)"),
            None
        );
        let n = NodeReady {
            id: 3,
            api: Some("127.0.0.1:7".parse().unwrap()),
            peer: None,
        };
        assert_eq!(
            n.to_string(),
            "palisade node 3 listening on 127.0.0.1:7 (raft -)"
        );
        assert_eq!(NodeReady::parse(&n.to_string()), Some(n));
        assert_eq!(NodeReady::parse(&p.to_string()), None);
        let f = FailpointStop {
            name: "proxy-before-forward".into(),
            pid: 42,
        };
        assert_eq!(FailpointStop::parse(&f.to_string()), Some(f));
        assert_eq!(FailpointStop::parse("palisade failpoint x reached"), None);
    }
}
