//! [`NodeApi`]: a client of an election node's HTTP API: its view of leadership
//! ([`LeaderView`], with the long poll), leadership transfer, membership changes, health,
//! and the test faults of its peer links. The answers are the protocol's types.

use std::time::Duration;

use http::Method;
use palisade_protocol::admin::HEALTHZ_PATH;
use palisade_protocol::headers::JSON;
use palisade_protocol::lease::{LEASE_PATH, LeaseGrant, LeaseRequest};
use palisade_protocol::node::{
    LEADER_PATH, MEMBERS_PATH, RESIGN_PATH, TEST_FAULTS_PATH, TRANSFER_PATH,
};
use palisade_protocol::{
    FaultSpec, Health, LeaderView, LongPoll, MemberAdd, MemberList, MemberRemove, Role,
    TransferRequest, Transferred,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::ClientError;
use crate::source::Leadership;
use crate::transport::{ClientTls, Endpoint, Failure, millis};

mod scopes;

pub use scopes::{CAMPAIGN_WAIT_MS_MAX, SESSION_ID_BYTES_MAX, valid_session_id};

/// Longest a plain `GET /v1/leader` (or another read) may take: the node answers from
/// memory, so a slower answer means the node is paused, overloaded or gone.
pub const NODE_REQUEST_TIMEOUT_MS: u64 = 2_000;
/// Longest a long poll may ask the node to wait. Longer waits only delay noticing a node
/// that is paused or gone.
pub const LONG_POLL_WAIT_MS_MAX: u64 = 60_000;
/// How much longer than the asked wait a long poll may take before the node counts as
/// unreachable: the node answers at the end of the wait, plus transport time.
pub const LONG_POLL_SLACK_MS: u64 = 1_000;
/// Longest a leadership transfer may take: the node answers once the new leader is
/// elected, which takes a few election timeouts at most.
pub const TRANSFER_TIMEOUT_MS: u64 = 15_000;
/// Longest a membership change may take: the node answers once it applied the change
/// (it gives up itself after 10 s, the election crate's `MEMBER_CHANGE_TIMEOUT_MS`), so
/// this leaves room for the transport.
pub const MEMBER_CHANGE_TIMEOUT_MS: u64 = 15_000;

impl From<&LeaderView> for Leadership {
    /// What a node's answer means for a client of this node: a token (with its proof,
    /// when the node signs tokens) only on the established leader; raft's "no leader"
    /// (0) as `None`.
    fn from(view: &LeaderView) -> Self {
        let leader_id = view.leader_id.filter(|id| *id != 0);
        match (view.role, view.token) {
            (Role::Leader, Some(token)) => {
                Leadership::leader(token, view.term, leader_id).with_proof(view.proof.as_deref())
            }
            (Role::Leader, None) => Leadership::establishing(view.term, leader_id),
            _ => Leadership::not_leader(view.term, leader_id),
        }
    }
}

/// Whether the node leads but has not yet applied an entry of its term, so its token is
/// about to appear without a change of term or role.
pub fn is_establishing(view: &LeaderView) -> bool {
    view.role == Role::Leader && view.token.is_none()
}

/// A client of one node's HTTP API. Cheap to clone.
#[derive(Clone)]
pub struct NodeApi {
    endpoint: Endpoint,
}

impl std::fmt::Debug for NodeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.endpoint.fmt_client("NodeApi", f)
    }
}

impl NodeApi {
    /// A client of the node API at `url` (`http://host:port` or `https://host:port`).
    pub fn new(url: &str) -> Result<Self, ClientError> {
        Self::with_tls(url, &ClientTls::default())
    }

    /// Like [`new`](Self::new), with TLS settings for an `https://` URL.
    pub fn with_tls(url: &str, tls: &ClientTls) -> Result<Self, ClientError> {
        Ok(Self {
            endpoint: Endpoint::new(url, tls, NODE_REQUEST_TIMEOUT_MS)?,
        })
    }

    /// Limits plain calls to `timeout` instead of [`NODE_REQUEST_TIMEOUT_MS`] (a caller
    /// that polls nodes that may be paused wants a short one): reads, and the session
    /// calls (open, keepalive, revoke, resign). Long polls, campaigns and transfers keep
    /// their own limits.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.endpoint.timeout = timeout;
        self
    }

    /// The node's base URL.
    pub fn url(&self) -> String {
        self.endpoint.base.as_str().to_owned()
    }

    /// `GET /v1/leader`: the node's view now.
    #[tracing::instrument(skip(self), fields(node = %self.endpoint.base.as_str()))]
    pub async fn leader(&self) -> Result<LeaderView, ClientError> {
        self.read(LEADER_PATH, self.endpoint.timeout).await
    }

    /// `GET /v1/leader?after_term=N&timeout_ms=T`: the long poll. Answers once the
    /// node's term is above `after_term` or its view changes, or after `timeout_ms`
    /// (capped at [`LONG_POLL_WAIT_MS_MAX`]).
    #[tracing::instrument(skip(self), fields(node = %self.endpoint.base.as_str()))]
    pub async fn poll(&self, poll: LongPoll) -> Result<LeaderView, ClientError> {
        if !poll.is_poll() {
            return self.leader().await;
        }
        let poll = LongPoll {
            timeout_ms: poll.timeout_ms.map(|ms| ms.min(LONG_POLL_WAIT_MS_MAX)),
            ..poll
        };
        let wait_ms = poll.timeout_ms.unwrap_or(LONG_POLL_WAIT_MS_MAX);
        let path = format!("{LEADER_PATH}?{}", poll.to_query());
        self.read(&path, Duration::from_millis(wait_ms + LONG_POLL_SLACK_MS))
            .await
    }

    /// [`poll`](Self::poll) after `after_term` for at most `wait`.
    pub async fn leader_after(
        &self,
        after_term: u64,
        wait: Duration,
    ) -> Result<LeaderView, ClientError> {
        self.poll(LongPoll {
            after_term: Some(after_term),
            timeout_ms: Some(millis(wait)),
        })
        .await
    }

    /// `POST /v1/transfer`: hands leadership to node `to`; answers once it leads.
    pub async fn transfer(&self, to: u64) -> Result<Transferred, ClientError> {
        self.post(
            TRANSFER_PATH,
            Some(&TransferRequest { to }),
            TRANSFER_TIMEOUT_MS,
        )
        .await
    }

    /// `POST /v1/resign`: hands leadership to the best other voter.
    pub async fn resign(&self) -> Result<Transferred, ClientError> {
        self.post::<(), _>(RESIGN_PATH, None, TRANSFER_TIMEOUT_MS)
            .await
    }

    /// `POST /v1/lease`: asks the node for a fleet lease for the proxy named in `request`,
    /// waiting at most `timeout`. A follower answers 503 of kind `not-leader`, a proxy the
    /// cluster does not list 403 `unknown-proxy`: both come back as
    /// [`ClientError::Status`] with the problem.
    pub async fn lease(
        &self,
        request: &LeaseRequest,
        timeout: Duration,
    ) -> Result<LeaseGrant, ClientError> {
        self.post(LEASE_PATH, Some(request), millis(timeout)).await
    }

    /// `GET /v1/members`: the cluster's members as this node applied them.
    pub async fn members(&self) -> Result<MemberList, ClientError> {
        self.read(MEMBERS_PATH, self.endpoint.timeout).await
    }

    /// `POST /v1/members`: adds member `id` at peer address `peer` (`HOST:PORT`) as a
    /// learner (the leader promotes it to voter once it has caught up); answers the
    /// members once the node applied the change. A refusal (a removed id, a change
    /// already in progress, ...) is [`ClientError::Status`] with the problem.
    pub async fn add_member(&self, id: u64, peer: &str) -> Result<MemberList, ClientError> {
        let add = MemberAdd {
            id,
            peer: peer.to_owned(),
        };
        self.post(MEMBERS_PATH, Some(&add), MEMBER_CHANGE_TIMEOUT_MS)
            .await
    }

    /// `DELETE /v1/members/{id}`: removes member `id` (never the leader); its id is never
    /// accepted again. Answers like [`NodeApi::add_member`]. Refused (409) when fewer
    /// than three voters would remain (see [`NodeApi::remove_member_forced`]) or the
    /// voters left would have no reachable quorum.
    pub async fn remove_member(&self, id: u64) -> Result<MemberList, ClientError> {
        let path = format!("{MEMBERS_PATH}/{id}");
        self.send::<(), _>(Method::DELETE, &path, None, MEMBER_CHANGE_TIMEOUT_MS)
            .await
    }

    /// [`NodeApi::remove_member`] with `{"force":true}`: even when fewer than three voters
    /// remain (never without a reachable quorum).
    pub async fn remove_member_forced(&self, id: u64) -> Result<MemberList, ClientError> {
        let path = format!("{MEMBERS_PATH}/{id}");
        let body = MemberRemove { force: true };
        self.send(Method::DELETE, &path, Some(&body), MEMBER_CHANGE_TIMEOUT_MS)
            .await
    }

    /// `GET /healthz`.
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.read(HEALTHZ_PATH, self.endpoint.timeout).await
    }

    /// `GET /v1/test/faults`: the faults of the node's peer links (404 unless the node
    /// runs with test faults on).
    pub async fn faults(&self) -> Result<FaultSpec, ClientError> {
        self.read(TEST_FAULTS_PATH, self.endpoint.timeout).await
    }

    /// `POST /v1/test/faults`: replaces the faults of the node's peer links; an empty
    /// [`FaultSpec`] heals them. Returns the faults now in force.
    pub async fn set_faults(&self, faults: &FaultSpec) -> Result<FaultSpec, ClientError> {
        self.post(
            TEST_FAULTS_PATH,
            Some(faults),
            millis(self.endpoint.timeout).max(NODE_REQUEST_TIMEOUT_MS),
        )
        .await
    }

    /// A GET whose every failure means "no answer from the node": it is unreachable.
    async fn read<T: DeserializeOwned>(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<T, ClientError> {
        let url = self.endpoint.base.join(path)?;
        let request = self
            .endpoint
            .transport
            .request(Method::GET, url)
            .header(http::header::ACCEPT, JSON);
        match self.endpoint.transport.exchange(request, timeout).await {
            Ok(answer) => answer.json(),
            Err(Failure::Timeout(after)) => Err(ClientError::Unreachable {
                url: self.url(),
                attempts: 1,
                reason: format!("no answer within {} ms", millis(after)),
            }),
            Err(Failure::Broken(reason)) => Err(ClientError::Unreachable {
                url: self.url(),
                attempts: 1,
                reason,
            }),
            Err(failure) => Err(failure.into_error(self.endpoint.base.as_str(), &Method::GET)),
        }
    }

    /// A POST: a failure after sending leaves its outcome unknown.
    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: Option<&B>,
        timeout_ms: u64,
    ) -> Result<T, ClientError> {
        self.send(Method::POST, path, body, timeout_ms).await
    }

    /// A request that changes something: a failure after sending leaves its outcome
    /// unknown.
    async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        timeout_ms: u64,
    ) -> Result<T, ClientError> {
        let url = self.endpoint.base.join(path)?;
        let mut request = self
            .endpoint
            .transport
            .request(method.clone(), url)
            .header(http::header::ACCEPT, JSON);
        if let Some(body) = body {
            request = request.json(body);
        }
        self.endpoint
            .transport
            .exchange(request, Duration::from_millis(timeout_ms))
            .await
            .map_err(|f| f.into_error(self.endpoint.base.as_str(), &method))?
            .json()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a node's answer maps to the leadership a client may act on: a token only on
    /// the established leader, none while establishing or following, raft's 0 as "no
    /// leader". Method: map parsed answers.
    #[test]
    fn answers_map_to_leadership() {
        let leader: LeaderView = serde_json::from_str(
            r#"{"node_id":1,"scope":"default","term":7,"leader_id":1,"role":"leader","token":7,"announced":true}"#,
        )
        .unwrap();
        assert_eq!(Leadership::from(&leader), Leadership::leader(7, 7, Some(1)));
        let establishing: LeaderView = serde_json::from_str(
            r#"{"node_id":1,"scope":"default","term":8,"leader_id":1,"role":"leader","token":null,"announced":false}"#,
        )
        .unwrap();
        assert!(is_establishing(&establishing));
        let seen = Leadership::from(&establishing);
        assert!(seen.is_leader);
        assert_eq!(seen.write_token(), None);
        let follower: LeaderView = serde_json::from_str(
            r#"{"node_id":2,"scope":"default","term":8,"leader_id":0,"role":"follower","token":null,"announced":false}"#,
        )
        .unwrap();
        assert_eq!(Leadership::from(&follower), Leadership::not_leader(8, None));
    }

    /// Goal: the leader view's proof reaches the client with the token, and a proof on a
    /// view without a token (a node that should not send one) is not taken.
    /// Method: map a signed leader's answer and a follower's answer carrying a proof.
    #[test]
    fn the_proof_of_a_leader_view_is_kept_with_its_token() {
        let leader: LeaderView = serde_json::from_str(
            r#"{"node_id":1,"scope":"default","term":7,"leader_id":1,"role":"leader","token":7,"announced":true,"proof":"c2ln"}"#,
        )
        .unwrap();
        assert_eq!(Leadership::from(&leader).write_proof(), Some("c2ln"));
        let follower: LeaderView = serde_json::from_str(
            r#"{"node_id":2,"scope":"default","term":7,"leader_id":1,"role":"follower","token":null,"announced":false,"proof":"c2ln"}"#,
        )
        .unwrap();
        assert_eq!(Leadership::from(&follower).proof, None);
    }
}
