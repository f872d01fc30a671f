//! [`NodeApi`]'s named leaderships (`palisade_protocol::scopes`): sessions, campaigns,
//! resignations and reads of scopes. One call each, sent once to this node; a
//! [`Session`](crate::Session) adds the keepalives, finding the leader and retrying.
//!
//! Answers that mean something to a caller are typed: 503 `not-leader` is
//! [`ClientError::NodeNotLeader`] (with the leader the node knows), 404
//! `unknown-session` is [`ClientError::UnknownSession`]. Every other error answer is
//! [`ClientError::Status`] with its problem, whose kind ([`ClientError::problem_kind`])
//! tells `campaign-timeout`, `fence-pending`, `bad-ttl`, ... apart.

use std::time::Duration;

use http::Method;
use palisade_protocol::Scope;
use palisade_protocol::lease::NOT_LEADER;
use palisade_protocol::problem::kind::UNKNOWN_SESSION;
use palisade_protocol::scopes::{
    CAMPAIGN_PATH, Grant, KEEPALIVE_PATH, Resigned, SCOPE_PATH, SCOPE_RESIGN_PATH, SCOPES_PATH,
    SESSION_PATH, SESSION_TTL_MS_MAX, SESSION_TTL_MS_MIN, SESSIONS_PATH, ScopeList, ScopeView,
    SessionList, SessionRef, SessionRequest, SessionRevoked, SessionView, ttl_in_bounds,
};

use super::{LONG_POLL_SLACK_MS, LONG_POLL_WAIT_MS_MAX, NodeApi};
use crate::error::ClientError;
use crate::transport::millis;

/// Longest one campaign request asks the node to wait for its scope. A longer wait in
/// one request only delays noticing a leader that moved or a node that paused;
/// [`Session::campaign`](crate::Session::campaign) campaigns again until its own timeout.
pub const CAMPAIGN_WAIT_MS_MAX: u64 = 60_000;
/// Longest session id this client puts in a path. A node's ids are tens of characters;
/// a longer one is not a session id, and is refused rather than sent.
pub const SESSION_ID_BYTES_MAX: usize = 128;

/// Whether `id` can be a session id in a path: 1 to [`SESSION_ID_BYTES_MAX`] of the URI's
/// unreserved characters (`A-Z a-z 0-9 - . _ ~`), and not only dots, which a URL parser
/// would take as `.` or `..` and so send the request elsewhere.
pub fn valid_session_id(id: &str) -> bool {
    (1..=SESSION_ID_BYTES_MAX).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
        && !id.bytes().all(|b| b == b'.')
}

/// `id` as a path segment, or why not.
fn session_segment(id: &str) -> Result<&str, ClientError> {
    if valid_session_id(id) {
        Ok(id)
    } else {
        Err(ClientError::InvalidRequest(format!(
            "session id {id:?} is not 1 to {SESSION_ID_BYTES_MAX} of A-Z a-z 0-9 - . _ ~"
        )))
    }
}

/// `scope` as a path segment, or why not: a scope name, and not `.` or `..`, which a URL
/// parser would resolve as a path step (`/v1/scopes/../campaign` is `/v1/campaign`).
fn scope_segment(scope: &str) -> Result<&str, ClientError> {
    Scope::check(scope).map_err(|e| ClientError::InvalidRequest(e.to_string()))?;
    if scope == "." || scope == ".." {
        return Err(ClientError::InvalidRequest(format!(
            "scope {scope:?} cannot be named in a URL path"
        )));
    }
    Ok(scope)
}

impl NodeApi {
    /// `POST /v1/sessions`: opens a session with `ttl` (whole milliseconds, within
    /// `SESSION_TTL_MS_MIN..=SESSION_TTL_MS_MAX`; outside them nothing is sent). Only the
    /// leader opens sessions: a follower answers [`ClientError::NodeNotLeader`].
    #[tracing::instrument(skip(self), fields(node = %self.endpoint.base.as_str()))]
    pub async fn open_session(&self, ttl: Duration) -> Result<SessionView, ClientError> {
        let ttl_ms = millis(ttl);
        if !ttl_in_bounds(ttl_ms) {
            return Err(ClientError::InvalidRequest(format!(
                "session TTL {ttl_ms} ms is outside {SESSION_TTL_MS_MIN}..={SESSION_TTL_MS_MAX} ms"
            )));
        }
        let result = self
            .send(
                Method::POST,
                SESSIONS_PATH,
                Some(&SessionRequest { ttl_ms }),
                millis(self.endpoint.timeout),
            )
            .await;
        self.typed(result, None)
    }

    /// `POST /v1/sessions/{id}/keepalive`: counts the session's TTL again from the
    /// leader's receipt. [`ClientError::UnknownSession`] means it expired or was revoked:
    /// whatever it held is gone.
    #[tracing::instrument(skip(self), fields(node = %self.endpoint.base.as_str()))]
    pub async fn keepalive(&self, id: &str) -> Result<SessionView, ClientError> {
        let path = KEEPALIVE_PATH.replace("{id}", session_segment(id)?);
        let result = self
            .send::<(), _>(Method::POST, &path, None, millis(self.endpoint.timeout))
            .await;
        self.typed(result, Some(id))
    }

    /// `DELETE /v1/sessions/{id}`: revokes the session and releases what it holds or
    /// waits for.
    #[tracing::instrument(skip(self), fields(node = %self.endpoint.base.as_str()))]
    pub async fn revoke_session(&self, id: &str) -> Result<SessionRevoked, ClientError> {
        let path = SESSION_PATH.replace("{id}", session_segment(id)?);
        let result = self
            .send::<(), _>(Method::DELETE, &path, None, millis(self.endpoint.timeout))
            .await;
        self.typed(result, Some(id))
    }

    /// `GET /v1/sessions`: the live sessions, as this node applied them.
    pub async fn sessions(&self) -> Result<SessionList, ClientError> {
        let result = self.read(SESSIONS_PATH, self.endpoint.timeout).await;
        self.typed(result, None)
    }

    /// `POST /v1/scopes/{scope}/campaign?timeout_ms=T`: asks for `scope` for session
    /// `session`, waiting at most `timeout` (capped at [`CAMPAIGN_WAIT_MS_MAX`]) while
    /// another session holds it. Answers the [`Grant`] once held and fenced by every
    /// announce proxy; the same grant again to a session that holds it already. The
    /// timeout passing first is [`ClientError::Status`] of kind `campaign-timeout` (the
    /// session no longer waits); held but not yet fenced everywhere is `fence-pending`
    /// (campaign again).
    #[tracing::instrument(skip(self), fields(node = %self.endpoint.base.as_str()))]
    pub async fn campaign(
        &self,
        scope: &str,
        session: &str,
        timeout: Duration,
    ) -> Result<Grant, ClientError> {
        let wait_ms = millis(timeout).min(CAMPAIGN_WAIT_MS_MAX);
        let path = format!(
            "{}?timeout_ms={wait_ms}",
            CAMPAIGN_PATH.replace("{scope}", scope_segment(scope)?)
        );
        let body = SessionRef {
            session: session_segment(session)?.to_owned(),
        };
        let limit = wait_ms
            .saturating_add(LONG_POLL_SLACK_MS)
            .max(millis(self.endpoint.timeout));
        let result = self.send(Method::POST, &path, Some(&body), limit).await;
        self.typed(result, Some(session))
    }

    /// `POST /v1/scopes/{scope}/resign`: session `session` gives `scope` up (or stops
    /// waiting for it). Idempotent: `released` is false when it held nothing.
    #[tracing::instrument(skip(self), fields(node = %self.endpoint.base.as_str()))]
    pub async fn resign_scope(&self, scope: &str, session: &str) -> Result<Resigned, ClientError> {
        let path = SCOPE_RESIGN_PATH.replace("{scope}", scope_segment(scope)?);
        let body = SessionRef {
            session: session_segment(session)?.to_owned(),
        };
        let result = self
            .send(
                Method::POST,
                &path,
                Some(&body),
                millis(self.endpoint.timeout),
            )
            .await;
        self.typed(result, Some(session))
    }

    /// `GET /v1/scopes/{scope}`: who holds `scope` now, as this node applied it.
    pub async fn scope(&self, scope: &str) -> Result<ScopeView, ClientError> {
        let path = SCOPE_PATH.replace("{scope}", scope_segment(scope)?);
        let result = self.read(&path, self.endpoint.timeout).await;
        self.typed(result, None)
    }

    /// `GET /v1/scopes/{scope}?after_token=N&timeout_ms=T`: the long poll. Answers once
    /// the scope's token is not `after_token` (`None`: "none held", so it answers once
    /// the scope is held), or after `timeout` (capped at [`LONG_POLL_WAIT_MS_MAX`]) with
    /// the unchanged view.
    pub async fn observe(
        &self,
        scope: &str,
        after_token: Option<u64>,
        timeout: Duration,
    ) -> Result<ScopeView, ClientError> {
        let wait_ms = millis(timeout).min(LONG_POLL_WAIT_MS_MAX);
        let mut path = format!(
            "{}?timeout_ms={wait_ms}",
            SCOPE_PATH.replace("{scope}", scope_segment(scope)?)
        );
        if let Some(token) = after_token {
            path = format!("{path}&after_token={token}");
        }
        let limit = Duration::from_millis(wait_ms.saturating_add(LONG_POLL_SLACK_MS))
            .max(self.endpoint.timeout);
        let result = self.read(&path, limit).await;
        self.typed(result, None)
    }

    /// `GET /v1/scopes`: the held scopes, as this node applied them.
    pub async fn scopes(&self) -> Result<ScopeList, ClientError> {
        let result = self.read(SCOPES_PATH, self.endpoint.timeout).await;
        self.typed(result, None)
    }

    /// The typed form of the answers that mean something to a session's caller: 503
    /// `not-leader` (ask the leader it names) and 404 `unknown-session` (the session is
    /// gone; `id` is the session asked about).
    fn typed<T>(&self, result: Result<T, ClientError>, id: Option<&str>) -> Result<T, ClientError> {
        result.map_err(|error| {
            let Some(problem) = error.problem() else {
                return error;
            };
            match problem.kind() {
                NOT_LEADER => ClientError::NodeNotLeader {
                    url: self.url(),
                    node_id: problem.node_id,
                    // raft's "no leader" is 0.
                    leader_id: problem.leader_id.filter(|id| *id != 0),
                },
                UNKNOWN_SESSION => ClientError::UnknownSession {
                    id: id.unwrap_or_default().to_owned(),
                },
                _ => error,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: only ids and scopes that stay one path segment are put in a path; dot
    /// segments, separators, encodings and oversize values are refused before sending.
    /// Method: check examples, good and hostile.
    #[test]
    fn only_single_segments_go_into_paths() {
        for good in ["s-1", "0f3a.b_c~d", &"x".repeat(SESSION_ID_BYTES_MAX)] {
            assert!(valid_session_id(good), "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a%2Fb",
            "a?b",
            "a#b",
            "a b",
            "é",
            &"x".repeat(SESSION_ID_BYTES_MAX + 1),
        ] {
            assert!(!valid_session_id(bad), "{bad:?}");
            assert!(session_segment(bad).is_err());
        }
        assert_eq!(scope_segment("jobs.nightly").unwrap(), "jobs.nightly");
        for bad in [".", "..", "a/b", "", "a%2e"] {
            assert!(
                matches!(scope_segment(bad), Err(ClientError::InvalidRequest(_))),
                "{bad:?}"
            );
        }
    }

    /// Goal: a TTL outside the contract's bounds is refused before anything is sent.
    /// Method: ask an unreachable node for TTLs just outside the bounds; the error is
    /// about the request, not the connection.
    #[tokio::test]
    async fn out_of_bounds_ttls_are_refused_before_sending() {
        let api = NodeApi::new("http://127.0.0.1:9").unwrap();
        for ms in [SESSION_TTL_MS_MIN - 1, SESSION_TTL_MS_MAX + 1] {
            let err = api
                .open_session(Duration::from_millis(ms))
                .await
                .unwrap_err();
            assert!(matches!(err, ClientError::InvalidRequest(_)), "{err}");
        }
    }
}
