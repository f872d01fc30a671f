//! Named leaderships on the node API: sessions, and scopes held through them.
//!
//! - `POST /v1/sessions` with [`SessionRequest`] -> [`SessionView`].
//! - `POST /v1/sessions/{id}/keepalive` -> [`SessionView`]; an unknown or expired
//!   session is 404 [`kind::UNKNOWN_SESSION`](crate::problem::kind::UNKNOWN_SESSION).
//! - `DELETE /v1/sessions/{id}` -> [`SessionRevoked`]: revokes it and releases what it
//!   holds or waits for.
//! - `GET /v1/sessions` -> [`SessionList`].
//! - `POST /v1/scopes/{scope}/campaign` with [`SessionRef`], optional `?timeout_ms=T`
//!   -> [`Grant`] once the session holds the scope and every announce proxy fences it.
//! - `POST /v1/scopes/{scope}/resign` with [`SessionRef`] -> [`Resigned`].
//! - `GET /v1/scopes/{scope}` -> [`ScopeView`]; with [`ObserveQuery`] a long poll that
//!   answers once the scope's token is no longer `after_token`.
//! - `GET /v1/scopes` -> [`ScopeList`]: the held scopes.
//!
//! Sessions, campaigns, resignations and keepalives are answered by the raft leader; a
//! follower answers 503 `not-leader` with the `leader_id` it knows, so that a client
//! tries the node it names. Reads of scopes are answered by any node from what it
//! applied.

use serde::{Deserialize, Serialize};

/// Sessions: open (`POST`) and list (`GET`).
pub const SESSIONS_PATH: &str = "/v1/sessions";
/// One session: revoke (`DELETE`).
pub const SESSION_PATH: &str = "/v1/sessions/{id}";
/// One session's keepalive (`POST`).
pub const KEEPALIVE_PATH: &str = "/v1/sessions/{id}/keepalive";
/// Held scopes (`GET`).
pub const SCOPES_PATH: &str = "/v1/scopes";
/// One scope: read or observe (`GET`).
pub const SCOPE_PATH: &str = "/v1/scopes/{scope}";
/// Campaign for a scope (`POST`).
pub const CAMPAIGN_PATH: &str = "/v1/scopes/{scope}/campaign";
/// Give a scope up, or stop waiting for it (`POST`).
pub const SCOPE_RESIGN_PATH: &str = "/v1/scopes/{scope}/resign";

/// Shortest session TTL a node accepts: below it a keepalive every third of the TTL
/// would compete with the election's own heartbeats.
pub const SESSION_TTL_MS_MIN: u64 = 1_000;
/// Longest session TTL a node accepts: a session that stops being kept alive holds its
/// scopes at most this long.
pub const SESSION_TTL_MS_MAX: u64 = 300_000;
/// The TTL the clients ask for unless told otherwise.
pub const SESSION_TTL_MS_DEFAULT: u64 = 10_000;
/// How long a campaign waits unless its `timeout_ms` says otherwise.
pub const CAMPAIGN_TIMEOUT_MS_DEFAULT: u64 = 30_000;

/// `POST /v1/sessions`: the TTL asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// Milliseconds without a keepalive after which the leader may expire the session,
    /// within [`SESSION_TTL_MS_MIN`]..=[`SESSION_TTL_MS_MAX`].
    pub ttl_ms: u64,
}

/// A session, as opened or kept alive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionView {
    /// The session's id: opaque, unguessable, never reused.
    pub id: String,
    /// Its TTL, counted again from the leader's receipt of this call.
    pub ttl_ms: u64,
}

/// `DELETE /v1/sessions/{id}`: the session is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRevoked {
    /// The session revoked.
    pub id: String,
    /// The scopes it held, now released (each passed to its next waiter, if any).
    pub released: Vec<String>,
}

/// One session in [`SessionList`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEntry {
    /// The session's id.
    pub id: String,
    /// Its TTL.
    pub ttl_ms: u64,
    /// The client identity that opened it (its certificate's name), when over mTLS.
    pub owner: Option<String>,
    /// Scopes it holds.
    pub holds: Vec<String>,
    /// Scopes it waits for.
    pub waits: Vec<String>,
    /// Milliseconds until the leader may expire it (`None` on a node that is not the
    /// leader, which does not track keepalives).
    pub expires_in_ms: Option<u64>,
}

/// `GET /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionList {
    /// Every live session, by id.
    pub sessions: Vec<SessionEntry>,
}

/// The body of a campaign or a resignation: which session acts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRef {
    /// The session's id.
    pub session: String,
}

/// A campaign's answer: the scope is held by `session` with `token`, and every proxy the
/// cluster announces to already fences the scope at `token`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The scope held.
    pub scope: String,
    /// Its fencing token: higher than every earlier grant of this scope.
    pub token: u64,
    /// The token's proof (base64url Ed25519 over the proof message of scope and token),
    /// when the cluster signs tokens.
    pub proof: Option<String>,
    /// The session holding it.
    pub session: String,
}

/// `POST /v1/scopes/{scope}/resign`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resigned {
    /// The scope.
    pub scope: String,
    /// The session that resigned.
    pub session: String,
    /// Whether the session held the scope (false: it only waited, or neither).
    pub released: bool,
}

/// `GET /v1/scopes/{scope}`: who holds a scope. All three are `null` when nobody does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeView {
    /// The scope.
    pub scope: String,
    /// The holding session.
    pub session: Option<String>,
    /// The holder's token.
    pub token: Option<u64>,
    /// The token's proof, when the cluster signs tokens.
    pub proof: Option<String>,
}

/// `GET /v1/scopes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeList {
    /// The held scopes, by name.
    pub scopes: Vec<ScopeView>,
}

/// The query of `GET /v1/scopes/{scope}` as a long poll: answer once the scope's token
/// is not `after_token` (a grant, a release), or when `timeout_ms` passes (then with the
/// unchanged view).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObserveQuery {
    /// The token the caller knows; absent: "none held".
    pub after_token: Option<u64>,
    /// How long to wait at most.
    pub timeout_ms: Option<u64>,
}

/// The query of a campaign.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CampaignQuery {
    /// How long to wait for the scope at most ([`CAMPAIGN_TIMEOUT_MS_DEFAULT`] when absent).
    pub timeout_ms: Option<u64>,
}

/// Whether `ttl_ms` is a TTL a node accepts.
#[must_use]
pub fn ttl_in_bounds(ttl_ms: u64) -> bool {
    (SESSION_TTL_MS_MIN..=SESSION_TTL_MS_MAX).contains(&ttl_ms)
}

/// The client's side of a session's lifetime: the moment, on the client's own monotonic
/// clock, after which it must treat the session as lost, given that the last keepalive
/// the leader answered was **sent** at `sent` (not received: the leader may have counted
/// its TTL from any moment after the send) and the clock-rate drift bound `drift_ppm`
/// (parts per million that the two clocks may differ in rate). The leader expires the
/// session no earlier than `ttl` of its own time after it received that keepalive; the
/// client's `ttl * (1 - drift)` after the send is no later than that.
#[must_use]
pub fn session_trusted_until(
    sent: std::time::Instant,
    ttl: std::time::Duration,
    drift_ppm: u64,
) -> std::time::Instant {
    let ttl_us = u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX);
    let drift_us = ttl_us.saturating_mul(drift_ppm.min(1_000_000)) / 1_000_000;
    sent + std::time::Duration::from_micros(ttl_us - drift_us)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Goal: the client's trust ends the drift bound before the TTL counted from the
    /// send, never after it, and the bounds of the TTL are those the constants say.
    /// Method: 10 s TTL at 10,000 ppm is 9.9 s; a drift over 100% is capped at 100%.
    #[test]
    fn trust_ends_before_the_ttl_by_the_drift_bound() {
        let sent = Instant::now();
        let ttl = Duration::from_secs(10);
        assert_eq!(
            session_trusted_until(sent, ttl, 10_000) - sent,
            Duration::from_millis(9_900)
        );
        assert_eq!(session_trusted_until(sent, ttl, 2_000_000), sent);
        assert!(ttl_in_bounds(SESSION_TTL_MS_MIN) && ttl_in_bounds(SESSION_TTL_MS_MAX));
        assert!(!ttl_in_bounds(SESSION_TTL_MS_MIN - 1) && !ttl_in_bounds(SESSION_TTL_MS_MAX + 1));
    }

    /// Goal: the wire forms are the contract's: `{"ttl_ms":N}` in, `{"id":..,"ttl_ms":N}`
    /// out, a grant with a `null` proof, and unknown fields refused in requests.
    /// Method: serialise and parse by hand-written JSON.
    #[test]
    fn wire_forms_match_the_contract() {
        let grant = Grant {
            scope: "billing".into(),
            token: 42,
            proof: None,
            session: "s".into(),
        };
        assert_eq!(
            serde_json::to_string(&grant).unwrap(),
            r#"{"scope":"billing","token":42,"proof":null,"session":"s"}"#
        );
        let req: SessionRequest = serde_json::from_str(r#"{"ttl_ms":5000}"#).unwrap();
        assert_eq!(req.ttl_ms, 5_000);
        assert!(serde_json::from_str::<SessionRequest>(r#"{"ttl_ms":1,"x":2}"#).is_err());
        assert!(serde_json::from_str::<SessionRef>(r#"{"session":"a","y":1}"#).is_err());
    }
}
