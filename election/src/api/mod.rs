//! The node's HTTP API, on axum through `palisade_server` (JSON bodies; every error is an
//! `application/problem+json` [`Problem`](palisade_protocol::Problem) naming this node and,
//! when known, the leader to ask instead):
//!
//! - `GET /v1/leader`: this node's [`LeaderView`](palisade_protocol::LeaderView); with
//!   [`LongPoll`](palisade_protocol::LongPoll) parameters (`?after_term=N&timeout_ms=T`) a
//!   long poll that answers once the term exceeds N or the view changes in any other way
//!   (role, leader, token, announced), or after T ms (at most
//!   [`LONG_POLL_TIMEOUT_MS_MAX`]). `after_term` defaults to the current term, `timeout_ms`
//!   to [`LONG_POLL_TIMEOUT_MS_DEFAULT`]. An unknown parameter is a 400 `bad-query`: a typo
//!   would otherwise turn a long poll into a busy loop.
//! - `POST /v1/transfer` with a [`TransferRequest`](palisade_protocol::TransferRequest):
//!   leadership transfer; waits for the outcome and answers
//!   [`Transferred`](palisade_protocol::Transferred).
//! - `POST /v1/resign`: transfer to the best other voter.
//! - `POST /v1/lease` with a `LeaseRequest`: a fleet lease for an `--announce` proxy (see
//!   `lease` for its answers).
//! - `GET /v1/members`: the members this node applied
//!   ([`MemberList`](palisade_protocol::MemberList)); `POST /v1/members` with a
//!   [`MemberAdd`](palisade_protocol::MemberAdd) adds one, `DELETE /v1/members/{id}`
//!   removes one (never the leader). Both go through raft's joint consensus (a follower
//!   forwards the proposal to the leader) and answer the new list once this node applied
//!   the change, at most [`crate::MEMBER_CHANGE_TIMEOUT_MS`] later. Refusals are 409
//!   problems whose detail says why (a removed id is never accepted again; one change at a
//!   time).
//! - `GET /v1/announce`: the `--announce` proxy list the announcer follows
//!   ([`AnnounceList`](palisade_protocol::AnnounceList)); `POST /v1/announce` with an
//!   [`AnnounceChange`](palisade_protocol::AnnounceChange) retires every proxy it drops,
//!   then replaces the list through raft on every node and answers once this node applied
//!   it (see `announce` for its answers; 409 `announce-fixed` with fleet leases).
//! - `GET /metrics` (Prometheus text), `GET /healthz`
//!   ([`Health`](palisade_protocol::Health); 503 once the election loop stopped).
//! - `GET /`: the status page for people (`status_page`): role, term, leader, members,
//!   scores, the announce state per proxy. Transfers asked here are written to the audit
//!   log.
//! - With mutual TLS (`--cert/--key/--ca`), each route admits only some roles, read from
//!   the client certificate's name (`node-<id>`, `proxy-<name>`, `writer-<name>`,
//!   `operator-<name>`); anyone else is answered 403 `forbidden-role` (see `roles`).
//! - Only on a node started with test faults (`PALISADE_TEST_FAULTS=1`), else 404:
//!   `GET /v1/test/faults` and `POST /v1/test/faults` with a
//!   [`FaultSpec`](palisade_protocol::FaultSpec), which replaces every fault of this node's
//!   links (`{}` heals them); see [`crate::transport::faults`].
//!
//! # Layout
//! - `mod.rs` (this file): the limits, [`serve`], and the router ([`app`]).
//! - `state`: `ApiState`, what every handler shares, with the lease grants' part.
//! - `leader`: `GET /v1/leader` and its long poll.
//! - `long_polls`: the limits on long polls held at once, per client and in all.
//! - `transfer`: `POST /v1/transfer` and `POST /v1/resign`.
//! - `lease`: `POST /v1/lease` (the election loop's side is `crate::node`'s
//!   `lease_rounds`).
//! - `members`: `/v1/members`.
//! - `announce`: `/v1/announce`.
//! - `status_page`: `GET /`, the HTML status page.
//! - `health`: `GET /metrics` and `GET /healthz`.
//! - `faults`: `/v1/test/faults`, only with test faults.
//! - `sessions` and `scopes`: named leaderships: sessions (`/v1/sessions`, keepalives,
//!   revocation) and scopes held through them (`/v1/scopes/{scope}/campaign`, `resign`,
//!   reads and observation long polls, the held list).
//! - `roles`: which role each route admits (mutual TLS only), a node adding only itself,
//!   and the count and audit record of each 403 `forbidden-role`.

mod announce;
mod faults;
mod health;
mod leader;
mod lease;
mod long_polls;
mod members;
mod roles;
mod scopes;
mod sessions;
mod state;
mod status_page;
mod transfer;

pub(crate) use sessions::ScopesApi;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{delete, get, post};
use palisade_protocol::admin::{HEALTHZ_PATH, METRICS_PATH};
use palisade_protocol::lease::LEASE_PATH;
use palisade_protocol::node::{
    ANNOUNCE_PATH, LEADER_PATH, MEMBER_PATH, MEMBERS_PATH, RESIGN_PATH, TEST_FAULTS_PATH,
    TRANSFER_PATH,
};
use palisade_protocol::scopes::{
    CAMPAIGN_PATH, KEEPALIVE_PATH, SCOPE_PATH, SCOPE_RESIGN_PATH, SCOPES_PATH, SESSION_PATH,
    SESSIONS_PATH,
};
use palisade_protocol::status::STATUS_PAGE_PATH;
use palisade_server::{ControlLimits, finish};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

pub use leader::{LONG_POLL_TIMEOUT_MS_DEFAULT, LONG_POLL_TIMEOUT_MS_MAX};
pub use lease::{LEASE_BUSY, LEASE_TIMEOUT, LEASE_WAIT_TIMEOUT_MS};
pub use long_polls::{LONG_POLL_RETRY_AFTER_S, LONG_POLLS_MAX, LONG_POLLS_PER_CLIENT_MAX};
pub use state::LEASE_PENDING_MAX;
pub(crate) use state::{ApiState, LeaseApi};

/// Largest request body accepted (`{"to":N}` needs a few bytes).
pub const API_BODY_BYTES_MAX: usize = 4 * 1024;
/// API connections open at once. At the limit an idle connection is closed to admit a
/// new one (keep-alive connections first, then fresh ones, each the oldest first); only when all are busy (long polls included) is one more answered
/// 503 and closed.
pub const API_CONNECTIONS_MAX: usize = 256;
/// Time a client has, from accept, to finish its TLS handshake and send its request
/// headers. Its clients (peers' tools, proxies, operators) send a small request at once.
pub const API_HEADER_TIMEOUT_MS: u64 = 10_000;
/// Time a keep-alive API connection may stay idle between requests; a long poll is a
/// request in flight, not idle.
pub const API_KEEPALIVE_TIMEOUT_MS: u64 = 30_000;
pub use crate::metrics::API_CONNECTION_CLOSES;
/// Time in-flight requests get to finish at shutdown.
pub const API_DRAIN_TIMEOUT_MS: u64 = 2_000;

/// The API's name in 404 and 405 problems.
const API_NAME: &str = "node API";

/// Serves the API on `listener` until `state.shutdown`, then drains in-flight requests.
/// With `tls` (the node's mutual-TLS acceptor), the API is HTTPS and every connection must
/// present a client certificate from the cluster CA.
pub(crate) async fn serve(listener: TcpListener, state: ApiState, tls: Option<TlsAcceptor>) {
    let shutdown = state.shutdown.clone();
    let limits = ControlLimits {
        name: "node-api",
        connections_max: API_CONNECTIONS_MAX,
        header_read_timeout: Duration::from_millis(API_HEADER_TIMEOUT_MS),
        request_timeout: Duration::from_millis(palisade_server::CONTROL_REQUEST_TIMEOUT_MS),
        keepalive_timeout: Duration::from_millis(API_KEEPALIVE_TIMEOUT_MS),
        drain_timeout: Duration::from_millis(API_DRAIN_TIMEOUT_MS),
        on_close: Some(crate::metrics::api_connection_closed),
    };
    palisade_server::serve_tls(listener, app(state), limits, tls, async move {
        shutdown.cancelled().await;
    })
    .await;
}

/// The node API's routes; the test-fault routes exist only when faults are enabled, so a
/// production node answers 404 there like for any other unknown path.
///
/// Each route admits the roles `roles` lists for it (a route layer, so unknown paths and
/// methods keep their 404 and 405); with `state.roles_enforced` off, every route is open.
pub(crate) fn app(state: ApiState) -> Router {
    use roles::{
        ANY_ROLE, KEEPALIVE_SENDERS, LEADER_READERS, LEASE_HOLDERS, MEMBER_NODES, OPERATORS,
        SESSION_HOLDERS, only,
    };
    let faults_enabled = state.faults.is_some();
    let state = Arc::new(state);
    let s = &state;
    let mut router = Router::new()
        .route(LEADER_PATH, only(s, LEADER_READERS, get(leader::leader)))
        .route(TRANSFER_PATH, only(s, OPERATORS, post(transfer::transfer)))
        .route(RESIGN_PATH, only(s, OPERATORS, post(transfer::resign)))
        .route(LEASE_PATH, only(s, LEASE_HOLDERS, post(lease::lease)))
        .route(
            MEMBERS_PATH,
            only(s, MEMBER_NODES, get(members::members_list))
                .merge(roles::member_add(s, post(members::member_add))),
        )
        .route(
            ANNOUNCE_PATH,
            only(
                s,
                OPERATORS,
                get(announce::announce_list).post(announce::announce_set),
            ),
        )
        .route(
            MEMBER_PATH,
            only(s, OPERATORS, delete(members::member_remove)),
        )
        .route(
            SESSIONS_PATH,
            only(s, SESSION_HOLDERS, get(sessions::list).post(sessions::open)),
        )
        .route(
            SESSION_PATH,
            only(s, SESSION_HOLDERS, delete(sessions::revoke)),
        )
        .route(
            KEEPALIVE_PATH,
            only(s, KEEPALIVE_SENDERS, post(sessions::keepalive)),
        )
        .route(SCOPES_PATH, only(s, LEADER_READERS, get(scopes::list)))
        .route(SCOPE_PATH, only(s, LEADER_READERS, get(scopes::read)))
        .route(
            CAMPAIGN_PATH,
            only(s, SESSION_HOLDERS, post(scopes::campaign)),
        )
        .route(
            SCOPE_RESIGN_PATH,
            only(s, SESSION_HOLDERS, post(scopes::resign)),
        )
        .route(METRICS_PATH, only(s, ANY_ROLE, get(health::metrics)))
        .route(HEALTHZ_PATH, get(health::health))
        .route(
            STATUS_PAGE_PATH,
            only(s, OPERATORS, get(status_page::status_page)),
        );
    if faults_enabled {
        router = router.route(
            TEST_FAULTS_PATH,
            only(
                s,
                OPERATORS,
                get(faults::get_faults).post(faults::set_faults),
            ),
        );
    }
    // The long polls' places (`long_polls`), one table per API.
    let router = router.layer(axum::Extension(Arc::new(long_polls::LongPolls::default())));
    finish(router.with_state(state), API_NAME, API_BODY_BYTES_MAX)
}

#[cfg(test)]
mod tests;
