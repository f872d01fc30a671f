//! The Rust client of Palisade: writes through a fencing proxy that carry the writer's
//! fencing token, and stop as soon as someone else leads.
//!
//! A worker asks a [`TokenSource`] whether it is the established leader and with which
//! token; a [`FencedClient`] attaches that token to every write, refuses to send a write
//! while the source says "not leader" ([`ClientError::NotLeader`]), and turns the proxy's
//! 409 into [`ClientError::Fenced`], marking the source "not leader" so that the worker
//! stops. A request that timed out is [`ClientError::Indeterminate`]: it may have been
//! applied.
//!
//! Every client here ([`FencedClient`], [`ProxyAdmin`], [`NodeApi`], [`NodeApiSource`])
//! runs on one reqwest transport with rustls: `http://` and `https://` URLs, the system's
//! roots plus any CA or client certificate given in a [`ClientTls`]; a failed handshake
//! is [`ClientError::Tls`], never retried.
//!
//! ```text
//! worker ──> FencedClient ──(Fencing-Token[-Proof], Fencing-Scope)──> palisade proxy ──> storage
//!               │   ▲                                             │
//!               │   └── 409 Fenced{current} ──> mark "not leader" ┘
//!               └── TokenSource: StaticToken | NodeApiSource ──(long poll)──> palisade node
//! ```
//!
//! # Example: charge each expiring subscription exactly once
//!
//! A billing worker runs beside each election node; only the leader's worker charges.
//! Charging a subscription is writing `charges/<subscription-id>` through the proxy with
//! the leader's token. Before reading anything the worker claims the scope with a write of
//! its own: the proxy lets that write through only once every write of an older leader
//! still in flight has landed, and raises the fence so none can land later. So what the
//! worker reads afterwards is final, and "not there yet" means "not charged".
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use palisade_client::{ClientError, FencedClient, NodeApiSource, StatusCode, TokenSource};
//!
//! /// A subscription whose billing period ends today, from the application's database.
//! struct Subscription {
//!     id: String,
//!     amount_cents: u64,
//! }
//!
//! async fn expiring_subscriptions() -> Vec<Subscription> {
//!     Vec::new() // The application's own query.
//! }
//!
//! /// Charges every expiring subscription that has no charge yet. Returns at the first
//! /// error: `Fenced` or `NotLeader` mean that another worker leads now.
//! async fn billing_run(client: &FencedClient) -> Result<u32, ClientError> {
//!     client.put("billing/claim", "claimed").await?;
//!     let mut charged = 0;
//!     for subscription in expiring_subscriptions().await {
//!         let key = format!("charges/{}", subscription.id);
//!         match client.get(&key).await {
//!             Ok(_) => continue, // Charged already, by this worker or a predecessor.
//!             Err(e) if e.status() == Some(StatusCode::NOT_FOUND) => {}
//!             Err(e) => return Err(e),
//!         }
//!         let charge = format!(
//!             r#"{{"subscription":"{}","amount_cents":{}}}"#,
//!             subscription.id, subscription.amount_cents
//!         );
//!         client.put(&key, charge).await?;
//!         charged += 1;
//!     }
//!     Ok(charged)
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // The election node this worker runs beside, and the proxy in front of storage.
//!     let source = Arc::new(NodeApiSource::start("http://127.0.0.1:7001")?);
//!     let client = FencedClient::builder("http://127.0.0.1:8080", source.clone())
//!         .scope("billing")
//!         .build()?;
//!     loop {
//!         let leadership = source.wait_for_leader().await;
//!         eprintln!("leading with token {:?}: billing run", leadership.token);
//!         match billing_run(&client).await {
//!             Ok(charged) => {
//!                 eprintln!("charged {charged} subscriptions");
//!                 tokio::time::sleep(Duration::from_secs(60)).await;
//!             }
//!             // Another worker leads: stop at once and wait to lead again.
//!             Err(e) if e.is_leadership_lost() => eprintln!("stopped: {e}"),
//!             // The charge may or may not have landed; the next run's read tells.
//!             Err(e) if e.is_indeterminate() => eprintln!("will check again: {e}"),
//!             Err(e) => return Err(e.into()),
//!         }
//!     }
//! }
//! ```
//!
//! # Layout
//! - `source`: the [`TokenSource`] trait, the [`Leadership`] it reports, and
//!   [`StaticToken`].
//! - `node_source`: [`NodeApiSource`], a token source that long-polls a node's HTTP API in
//!   a background task.
//! - `node`: [`NodeApi`], a client of a node's API (leadership, long poll, transfer,
//!   health, test faults); `node/scopes.rs` adds its named leaderships (sessions,
//!   campaigns, resignations, scope reads).
//! - `session`: [`Session`], a named-leadership session kept alive in the background
//!   against a cluster's nodes, and its loss rule ([`SessionLoss`]).
//! - `request`: [`FencedRequest`] and [`FencedResponse`], and how methods are classified.
//! - `client`: [`FencedClient`], the fenced HTTP client, and its builder.
//! - `admin`: [`ProxyAdmin`], a client of the proxy's admin API (read, advance or reset
//!   fences; optional bearer token).
//! - `error`: [`ClientError`].
//! - `transport`: the shared reqwest transport: [`ClientTls`], base URLs, one exchange
//!   with a deadline and a body limit.
//! - [`backoff`]: the one backoff policy (exponential with jitter, on `backon`) and
//!   `Retry-After`.
//!
//! An application that runs its election node in-process uses
//! `palisade_election::NodeHandleSource`, which implements [`TokenSource`].
//!
//! The wire types come from `palisade_protocol` and are re-exported here: [`LeaderView`],
//! [`Role`], [`FenceView`], [`FenceList`], [`AdvanceResponse`], [`Transferred`],
//! [`Health`], [`FaultSpec`], [`LongPoll`], [`Scope`], [`Problem`], [`ResetResponse`],
//! and the named leaderships' [`SessionView`], [`SessionRevoked`], [`SessionList`],
//! [`SessionEntry`], [`Grant`], [`Resigned`], [`ScopeView`], [`ScopeList`].
//!
//! # Named leaderships
//!
//! A [`Session`] holds named scopes: it is opened on the cluster's leader with a TTL,
//! kept alive in the background, and campaigns for a scope; the grant carries the
//! scope's fencing token (and its proof) for the writes made while holding it. The
//! session is trusted only until [`Session::trusted_until`]; past it (or once the
//! cluster forgets it) [`Session::lost`] resolves and the holder must stop.
//!
//! ```no_run
//! use std::time::Duration;
//! use palisade_client::Session;
//!
//! # async fn example() -> Result<(), palisade_client::ClientError> {
//! let session = Session::builder(["http://127.0.0.1:7001", "http://127.0.0.1:7002"])
//!     .ttl(Duration::from_secs(10))
//!     .open()
//!     .await?;
//! let grant = session.campaign("nightly-report", Duration::from_secs(60)).await?;
//! tokio::select! {
//!     loss = session.lost() => eprintln!("stop at once: {loss}"),
//!     () = async { /* the work, with grant.token on every write */ } => {
//!         session.resign("nightly-report").await?;
//!     }
//! }
//! # let _ = grant;
//! session.revoke().await?;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod admin;
pub mod backoff;
mod client;
mod error;
mod node;
mod node_source;
mod request;
mod session;
mod source;
mod transport;

pub use ::http::{Method, StatusCode};
pub use admin::{ADMIN_TIMEOUT_MS, ProxyAdmin};
pub use client::{
    BACKOFF_INITIAL_MS, BACKOFF_MAX_MS, FencedClient, FencedClientBuilder, REQUEST_TIMEOUT_MS,
    RETRIES_MAX, RETRY_AFTER_MAX_MS,
};
pub use error::ClientError;
pub use node::{
    CAMPAIGN_WAIT_MS_MAX, LONG_POLL_SLACK_MS, LONG_POLL_WAIT_MS_MAX, MEMBER_CHANGE_TIMEOUT_MS,
    NODE_REQUEST_TIMEOUT_MS, NodeApi, SESSION_ID_BYTES_MAX, TRANSFER_TIMEOUT_MS, is_establishing,
    valid_session_id,
};
pub use node_source::{
    ESTABLISH_POLL_MS, FIRST_ANSWER_TIMEOUT_MS, LONG_POLL_WAIT_MS, NodeApiSource, PLAIN_POLL_MS,
    RECONNECT_BACKOFF_MAX_MS,
};
pub use palisade_protocol::scopes::{
    Grant, Resigned, ScopeList, ScopeView, SessionEntry, SessionList, SessionRevoked, SessionView,
};
pub use palisade_protocol::{
    AdvanceResponse, FaultSpec, FenceList, FenceView, Health, LeaderView, LongPoll, Member,
    MemberAdd, MemberList, MemberRemove, MemberRole, Problem, ResetResponse, Role, Scope,
    Transferred,
};
pub use request::{FencedRequest, FencedResponse, IDEMPOTENCY_KEY, is_write};
pub use session::{
    DRIFT_PPM_DEFAULT, KEEPALIVES_PER_TTL, SESSION_CALL_TIMEOUT_MS, SESSION_NODES_MAX,
    SESSION_OPEN_TIMEOUT_MS, SESSION_RETRY_MAX_MS, SESSION_RETRY_MIN_MS, Session, SessionBuilder,
    SessionLoss,
};
pub use source::{BoxFuture, LEADER_POLL_MS, Leadership, StaticToken, TokenSource};
pub use transport::{CONNECT_TIMEOUT_MS, ClientTls, RESPONSE_BYTES_MAX};
