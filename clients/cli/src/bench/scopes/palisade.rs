//! Palisade's named leaderships over its node API (`docs/scopes.md`): sessions,
//! keepalives, campaigns (the long poll that answers once the scope is held) and
//! resignations, all sent to the established leader, which is the only node that
//! answers them.

use std::time::Duration;

use http::{Method, StatusCode};
use palisade_protocol::scopes::{
    CAMPAIGN_PATH, Grant, KEEPALIVE_PATH, SCOPE_RESIGN_PATH, SESSION_PATH, SESSIONS_PATH,
    SessionList, SessionRef, SessionRequest, SessionView,
};
use palisade_protocol::{LeaderView, Role};

use super::http::Http;
use crate::Failure;

/// How long one campaign request asks the leader to wait: the node's longest. A
/// contender whose wait passes campaigns again at once, so waiting longer only takes
/// more requests.
const CAMPAIGN_WAIT_MS: u64 = 60_000;
/// How much longer than its wait a campaign may take to answer.
const CAMPAIGN_SLACK_MS: u64 = 5_000;

/// The leader of a Palisade cluster.
pub(super) struct Palisade {
    http: Http,
    timeout: Duration,
}

impl Palisade {
    /// Finds the established leader (role leader, with a token) among `endpoints`.
    pub(super) async fn connect(endpoints: &[String], timeout: Duration) -> Result<Self, Failure> {
        let mut seen = Vec::new();
        for url in endpoints {
            let http = Http::new(url).await?;
            let view: LeaderView = match http
                .call::<()>(Method::GET, "/v1/leader", None, timeout)
                .await
            {
                Ok(answer) => answer.json("GET /v1/leader")?,
                Err(e) => {
                    seen.push(format!("{url}: {e}"));
                    continue;
                }
            };
            if view.role == Role::Leader && view.token.is_some() {
                return Ok(Self { http, timeout });
            }
            seen.push(format!("{url}: {:?}, token {:?}", view.role, view.token));
        }
        Err(Failure::Runtime(format!(
            "no established Palisade leader among the endpoints: {}",
            seen.join("; ")
        )))
    }

    /// The leader's address.
    pub(super) fn leader(&self) -> String {
        self.http.addr().to_string()
    }

    /// Opens a session with `ttl`; its id.
    pub(super) async fn open(&self, ttl: Duration) -> Result<String, Failure> {
        let body = SessionRequest {
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        };
        let view: SessionView = self
            .http
            .call(Method::POST, SESSIONS_PATH, Some(&body), self.timeout)
            .await?
            .json("open a session")?;
        Ok(view.id)
    }

    /// Keeps session `id` alive.
    pub(super) async fn keepalive(&self, id: &str) -> Result<(), Failure> {
        let path = KEEPALIVE_PATH.replace("{id}", id);
        let answer = self
            .http
            .call::<()>(Method::POST, &path, None, self.timeout)
            .await?;
        answer.json::<SessionView>("keepalive").map(drop)
    }

    /// Campaigns for `scope` until session `id` holds it; the grant's token.
    pub(super) async fn campaign(&self, scope: &str, id: &str) -> Result<u64, Failure> {
        let path = format!(
            "{}?timeout_ms={CAMPAIGN_WAIT_MS}",
            CAMPAIGN_PATH.replace("{scope}", scope)
        );
        let body = SessionRef {
            session: id.to_owned(),
        };
        let limit = Duration::from_millis(CAMPAIGN_WAIT_MS + CAMPAIGN_SLACK_MS);
        loop {
            let answer = self
                .http
                .call(Method::POST, &path, Some(&body), limit)
                .await?;
            // 409 campaign-timeout: the wait passed and the session no longer waits;
            // campaign again, as a client that still wants the scope would.
            if answer.status == StatusCode::CONFLICT
                && String::from_utf8_lossy(&answer.body).contains("campaign-timeout")
            {
                continue;
            }
            let grant: Grant = answer.json("campaign")?;
            return Ok(grant.token);
        }
    }

    /// Session `id` gives `scope` up.
    pub(super) async fn resign(&self, scope: &str, id: &str) -> Result<(), Failure> {
        let path = SCOPE_RESIGN_PATH.replace("{scope}", scope);
        let body = SessionRef {
            session: id.to_owned(),
        };
        self.http
            .call(Method::POST, &path, Some(&body), self.timeout)
            .await?
            .json::<serde_json::Value>("resign")
            .map(drop)
    }

    /// Ends session `id`, releasing what it holds.
    pub(super) async fn revoke(&self, id: &str) -> Result<(), Failure> {
        let path = SESSION_PATH.replace("{id}", id);
        self.http
            .call::<()>(Method::DELETE, &path, None, self.timeout)
            .await?
            .json::<serde_json::Value>("revoke a session")
            .map(drop)
    }

    /// How many sessions wait for `scope` (its holder not counted).
    pub(super) async fn waiting(&self, scope: &str) -> Result<usize, Failure> {
        let list: SessionList = self
            .http
            .call::<()>(Method::GET, SESSIONS_PATH, None, self.timeout)
            .await?
            .json("list the sessions")?;
        Ok(list
            .sessions
            .iter()
            .filter(|s| s.waits.iter().any(|w| w == scope))
            .count())
    }
}
