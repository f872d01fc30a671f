//! Palisade's control-plane server runtime, shared by the proxy's admin API and the node
//! API so that both answer with the same error bodies, parse bodies and queries the same
//! way and apply the same accept-loop policy. The proxy's data port uses its connection
//! bookkeeping too.
//!
//! The wire contract these servers speak (paths, headers, problem kinds, request and
//! response types, the audit line) is `palisade-protocol`'s; this crate holds only the
//! machinery that serves it: axum, hyper, tokio and rustls live here, not in the
//! protocol crate, so that clients never pull them in.
//!
//! The data path does not use the axum stack: it stays on raw hyper, where every
//! allocation on the request path is chosen by hand; only [`Connections`] is shared.
//!
//! # Layout
//! - `api`: the axum side: [`ApiProblem`] (a problem+json response), the [`ApiJson`] and
//!   [`ApiQuery`] extractors that reject with one, and [`finish`] (404/405 answers and
//!   the body limit every control-plane router gets).
//! - `serve`: [`serve`] and [`serve_tls`], the accept loop of a control-plane listener
//!   under its [`ControlLimits`]: connection limit with idle-first eviction, 503 when
//!   every connection is busy, header and keep-alive timeouts, graceful drain.
//! - `conns`: [`Connections`], the connection table behind every listener: timeouts
//!   counted from accept, idle-first eviction, request counting, release and park.
//! - `tls`: PEM files into rustls configurations, and the acceptor of a control-plane
//!   listener with optional mutual TLS.
//! - `roles`: a request's credential ([`roles::Caller`], put there by [`serve_tls`]) and
//!   [`roles::require_roles`], the route middleware that admits some roles and answers
//!   403 problem+json to the rest.
//! - `audit`: [`audit::AuditLog`], the audit log's writer (a bounded queue and a thread
//!   that appends and rotates; security records and rate-limited noise in two files);
//!   the line it writes is `palisade_protocol::audit`'s.
//! - `html`: the status pages' escaping, page frame and times.
//! - `clock`: [`clock::now`], one reading of the clock per poll of a connection's task.
//! - `wake`: [`wake::Relayed`] and [`wake::poll_http1_body`], which drop the stale wake-up
//!   hyper's HTTP/1 body channel sends a connection's task.
//! - `timer`: [`LazyTimer`] and [`LazySleep`], hyper's timer and a connection's deadlines,
//!   moved later without touching tokio's timer wheel; [`Recycling`], whose sleeps reuse
//!   the timers of those dropped before them.
#![deny(missing_docs)]

mod api;
pub mod audit;
pub mod clock;
mod conns;
pub mod html;
pub mod roles;
mod scoped;
mod serve;
mod timer;
pub mod tls;
pub mod wake;

pub use api::{ApiJson, ApiProblem, ApiQuery, finish};
pub use conns::{
    ADMISSION_RECHECK_MS, Admitted, BodyRefused, CONTROL_BODY_BYTES_MAX,
    CONTROL_REQUEST_TIMEOUT_MS, CloseHook, CloseReason, ConnPolicy, Connections, InFlight,
    Releasable, RequestTracker, Served, Stopped, TrackedBody, read_body,
};
pub use serve::{ACCEPT_BACKOFF_MS, ControlLimits, serve, serve_tls};
pub use timer::{LazySleep, LazyTimer, Recycling, SPARE_TIMERS_MAX};
