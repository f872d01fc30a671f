//! A raft cluster (raft-rs 0.7) whose established leader's term is the fencing token.
//!
//! Each node runs one election loop that owns its `RawNode`, persists raft state in redb
//! (`palisade_storage::RaftLog`), talks to its peers over TCP, and publishes its view of
//! leadership on a `tokio::sync::watch`. A leader holds a token (its term) only once it is
//! *established*: it has applied an entry of its own term, so it knows everything earlier
//! leaders committed. It loses the token the moment it steps down or starts handing
//! leadership over. With `announce` URLs configured, a new token is pushed to every proxy
//! (`POST /v1/fences/<scope>`) so the previous leader is fenced out at once. With fleet
//! leases (`lease_ms` > 0) the node grants leases to those proxies and holds a new token
//! back until every proxy accepted it or every older lease has certainly expired.
//!
//! Embedding:
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use palisade_election::{Node, NodeConfig};
//! let config = NodeConfig {
//!     id: 1,
//!     peers: [(1, "127.0.0.1:7001".to_owned())].into_iter().collect(),
//!     data_dir: "/var/lib/palisade/node1".into(),
//!     ..NodeConfig::default()
//! };
//! let node = Node::start(config).await?;
//! let mut leadership = node.leadership();
//! let token = leadership.wait_for(|l| l.token.is_some()).await?.token;
//! println!("fencing token {token:?}");
//! node.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//! The modules form floors: each imports only from the floors below it, and no two files
//! import each other except the election loop's own `impl` blocks inside `node`
//! (`.ci/election-imports.py` shows the import graph's cycles).
//!
//! The ground floor, what everything else is written in terms of:
//! - `config`: [`NodeConfig`], declared once: its limits and defaults (the peer transport's
//!   too), its TOML file, validation naming the bad field, and the rules of `--join`.
//! - `leadership`: [`Leadership`], what the watch channel publishes, and the raft-role
//!   mapping to the API's [`Role`].
//! - `members`: the rules of membership changes, the conf changes that carry them, and
//!   the members table they produce (the loop's side is `node`'s `membership`, the HTTP
//!   side `api`'s `members`).
//! - `metrics`: the node's own Prometheus recorder and metric handles.
//! - `scopes`: named leaderships: the replicated state of sessions and scopes and the one
//!   function that changes it (the tokens' argument is there), their raft entries, the
//!   leader's session deadlines (`lessor`) and the limits.
//! - `tls`: mutual TLS of the peer links and the API (`--cert`, `--key`, `--ca`): the
//!   certificate names `node-<id>`, checked at start, by dialers and by acceptors.
//!
//! The peers and the election:
//! - `transport`: the peer protocol (length-prefixed prost frames carrying protobuf raft
//!   messages, and score frames), inbound checks, the TCP transport, its test faults (drop
//!   or delay per peer, off unless enabled), and the in-memory test network. It delivers
//!   its own `Inbound` type; it knows nothing of the loop.
//! - `score`: leaders placed by score (`--score-oracle`): the oracles and their settings
//!   (`score/mod.rs`, which the configuration uses), sharing scores with the peers, the
//!   election timeout by rank, and resignation to a better follower (`score::board`, the
//!   loop's score state).
//! - `node`: the election loop that owns the `RawNode` and handles each `Ready` in the
//!   order raft-rs documents, [`NodeHandle`], and the errors. Its `lease_rounds` is the
//!   loop's side of fleet leases, its `membership` the loop's side of membership changes,
//!   its `scopes` the loop's side of named leaderships, and its `scopes_service`
//!   [`ScopesService`] ([`NodeHandle::scopes`]): named leaderships in process, the rules
//!   the HTTP routes and embedding applications (the simulation) share, with their
//!   [`ScopeError`].
//!
//! What runs around the loop, talking to it through its inbox and its watch channels:
//! - `announce`: fencing the configured proxies when this node becomes established, with
//!   `palisade_client`'s admin client and backoff policy; the announcers follow the
//!   announce list the loop publishes; a proxy leaving the list is retired first.
//! - `audit`: what the node remembers for people (the announce state per proxy) and
//!   writes to its audit log (announces, transfers, membership changes).
//! - `announce`'s `grants`: fence on grant, raising every announce proxy's fence to each
//!   named scope's new token before the campaign that asked for it answers.
//! - `api`: the HTTP API on axum, one file per concern: `/v1/leader` with long poll,
//!   `/v1/sessions` and `/v1/scopes` (named leaderships, over [`ScopesService`]),
//!   `/v1/transfer`, `/v1/resign`, `/v1/lease` (`api`'s `lease`: fleet leases for the
//!   `--announce` proxies), `/v1/members`, `/v1/announce`, `/metrics`, `/healthz`, the
//!   status page at `GET /`, and the test-fault route when enabled.
//! - `token_source`: [`NodeHandleSource`], a `palisade_client::TokenSource` over an
//!   in-process node's leadership watch.
//!
//! Beside the floors:
//! - `deterministic`: the simulation's switch (`tests/sim`), per thread: raft-log writes
//!   inline, a fixed election timeout, and session ids and request numbers from a counter.
//! - `fuzzing` (only with the `fuzzing` feature): handles on the peer frame checks, the
//!   loop's guard and the node API's router for the fuzz targets in `tests/fuzz`.
//!
//! The top floor:
//! - `start`: [`Node::start`], the composition root: it prepares the secrets, the members
//!   table and the `RawNode`, binds the transport and the API, runs the announcers, and
//!   spawns the loop.
#![deny(missing_docs)]

mod announce;
mod api;
mod audit;
mod config;
mod deterministic;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod leadership;
mod members;
mod metrics;
mod node;
mod scopes;
mod score;
mod start;
mod tls;
mod token_source;
pub mod transport;

pub use announce::{
    ANNOUNCE_BACKOFF_MAX_MS, ANNOUNCE_BACKOFF_MIN_MS, ANNOUNCE_TIMEOUT_MS, RETIRE_TIMEOUT_MS,
};
pub use api::{
    API_BODY_BYTES_MAX, API_CONNECTION_CLOSES, API_CONNECTIONS_MAX, API_DRAIN_TIMEOUT_MS,
    API_HEADER_TIMEOUT_MS, API_KEEPALIVE_TIMEOUT_MS, LEASE_BUSY, LEASE_PENDING_MAX, LEASE_TIMEOUT,
    LEASE_WAIT_TIMEOUT_MS, LONG_POLL_RETRY_AFTER_S, LONG_POLL_TIMEOUT_MS_DEFAULT,
    LONG_POLL_TIMEOUT_MS_MAX, LONG_POLLS_MAX, LONG_POLLS_PER_CLIENT_MAX,
};
pub use config::{
    ANNOUNCE_URLS_MAX, AUDIT_LOG_BYTES_MIN, ConfigError, ConfigFileError, ELECTION_TICKS_DEFAULT,
    ELECTION_TICKS_MAX, FRAME_BYTES_MAX, HEARTBEAT_TICKS_DEFAULT, JoinError,
    LEASE_DRIFT_PPM_DEFAULT, LEASE_DRIFT_PPM_LIMIT, LEASE_HEARTBEATS_MIN, LEASE_MS_MAX,
    LEASE_MS_MIN, LEASE_WRITE_BOUND_MS_DEFAULT, MAX_TERM_GAP_DEFAULT, NodeConfig, NodeTls,
    PEER_QUEUE_MAX, PEERS_MAX, RAFT_INFLIGHT_MSGS_MAX, RAFT_MSG_BYTES_MAX, SCORE_ABS_MAX,
    TICK_MS_DEFAULT, TICK_MS_MAX, TICK_MS_MIN, parse_api, parse_peers, split_host_port,
};
#[doc(hidden)]
pub use deterministic::set_deterministic;
pub use leadership::{Leadership, ReleasedBy, TOKEN_PROOF_BYTES, TokenProof};
pub use members::{
    MEMBER_CHANGE_TIMEOUT_MS, MEMBERS_MAX, MemberError, PROMOTE_LAG_ENTRIES_MAX, VOTERS_SAFE_MIN,
};
pub use node::{
    INBOX_MAX, KEY_FILE_BYTES_MAX, LEASE_GATHER_LEASE_DIVISOR, LEASE_GATHER_MS_MAX,
    LEASE_ROUND_TIMEOUT_MS, LeaseError, NodeError, NodeHandle, ScopeError, ScopesService,
    TERM_ACCEPTED_MAX, TRANSFER_TIMEOUT_ELECTIONS, TransferError,
};
/// The wire types of the node API, defined once in `palisade_protocol` and re-exported
/// here so embedders need not name that crate.
pub use palisade_protocol::{
    FaultSpec, Health, LeaderView, LongPoll, Problem, Role, SCOPE_BYTES_MAX, Scope,
    TransferRequest, Transferred,
};
pub use scopes::Refusal;
pub use score::{
    SCORE_HOLD_MS_DEFAULT, SCORE_HOLD_MS_MAX, SCORE_LEASE_GRACE_TICKS, SCORE_MARGIN_DEFAULT,
    SCORE_ORACLE_DEFAULT, SCORE_ORACLE_OFF, SCORE_RANK_SLOT_TICKS, SCORE_SHARE_TICKS,
    SCORE_STALE_ELECTIONS, ScoreOracle,
};
pub use start::{Node, StartError, StartOptions};
pub use token_source::NodeHandleSource;
pub use transport::faults::FAULT_DELAY_MS_MAX;
pub use transport::mem::MemNetwork;
