//! [`NodeApi`]: a client of an election node's HTTP API (`GET /v1/leader`, and its long
//! poll), and [`NodeLeader`], the node's answer.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use serde::{Deserialize, Serialize};

use crate::error::ClientError;
use crate::http::{Answer, BaseUrl, Failure, Transport, millis};
use crate::source::Leadership;

/// Longest a plain `GET /v1/leader` may take: the node answers from memory, so a slower
/// answer means the node is paused, overloaded or gone.
pub const NODE_REQUEST_TIMEOUT_MS: u64 = 2_000;
/// Longest a long poll may ask the node to wait. Longer waits only delay noticing a node
/// that is paused or gone.
pub const LONG_POLL_WAIT_MS_MAX: u64 = 60_000;
/// How much longer than the asked wait a long poll may take before the node counts as
/// unreachable: the node answers at the end of the wait, plus transport time.
pub const LONG_POLL_SLACK_MS: u64 = 1_000;

/// A node's role in the raft group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The leader of its term (established only once `token` is set).
    Leader,
    /// A follower.
    Follower,
    /// A candidate in an election.
    Candidate,
    /// A role this client does not know (a newer node); treated as "not leader".
    #[serde(other)]
    Other,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Leader => "leader",
            Self::Follower => "follower",
            Self::Candidate => "candidate",
            Self::Other => "other",
        })
    }
}

/// The answer of `GET /v1/leader`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLeader {
    /// The answering node.
    pub node_id: u64,
    /// The fencing scope the node's group elects a leader for.
    pub scope: String,
    /// The node's current raft term.
    pub term: u64,
    /// The leader the node knows of (`null`, or 0 in raft's terms, when none).
    pub leader_id: Option<u64>,
    /// The node's role.
    pub role: Role,
    /// The fencing token: set only on the established leader, and then equal to `term`.
    pub token: Option<u64>,
    /// Whether every proxy the node announces to has accepted the token.
    #[serde(default)]
    pub announced: bool,
}

impl NodeLeader {
    /// The leader id, with raft's "none" (0) as `None`.
    pub fn leader(&self) -> Option<u64> {
        self.leader_id.filter(|id| *id != 0)
    }

    /// What this answer means for a client of this node.
    pub fn leadership(&self) -> Leadership {
        match (self.role, self.token) {
            (Role::Leader, Some(token)) => Leadership::leader(token, self.term, self.leader()),
            (Role::Leader, None) => Leadership {
                is_leader: true,
                ..Leadership::not_leader(self.term, self.leader())
            },
            _ => Leadership::not_leader(self.term, self.leader()),
        }
    }

    /// Whether this node leads but has not yet applied an entry of its term, so its token
    /// is about to appear without a change of term or role.
    pub fn is_establishing(&self) -> bool {
        self.role == Role::Leader && self.token.is_none()
    }
}

/// A client of one node's HTTP API. Cheap to clone.
#[derive(Clone)]
pub struct NodeApi {
    base: BaseUrl,
    transport: Transport,
}

impl std::fmt::Debug for NodeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeApi")
            .field("url", &self.base.as_str())
            .finish_non_exhaustive()
    }
}

impl NodeApi {
    /// A client of the node API at `url` (`http://host:port`).
    pub fn new(url: &str) -> Result<Self, ClientError> {
        Ok(Self {
            base: BaseUrl::parse(url)?,
            transport: Transport::new(),
        })
    }

    /// The node's base URL.
    pub fn url(&self) -> String {
        self.base.as_str()
    }

    /// `GET /v1/leader`: the node's view now.
    #[tracing::instrument(skip(self), fields(node = %self.base.as_str()))]
    pub async fn leader(&self) -> Result<NodeLeader, ClientError> {
        self.get("/v1/leader", Duration::from_millis(NODE_REQUEST_TIMEOUT_MS))
            .await
    }

    /// `GET /v1/leader?after_term=N&timeout_ms=T`: waits until the node's term is above
    /// `after_term` or its role changes, or `wait` (at most [`LONG_POLL_WAIT_MS_MAX`])
    /// has passed; then the node's view.
    #[tracing::instrument(skip(self), fields(node = %self.base.as_str()))]
    pub async fn leader_after(
        &self,
        after_term: u64,
        wait: Duration,
    ) -> Result<NodeLeader, ClientError> {
        let wait_ms = millis(wait).min(LONG_POLL_WAIT_MS_MAX);
        let path = format!("/v1/leader?after_term={after_term}&timeout_ms={wait_ms}");
        self.get(&path, Duration::from_millis(wait_ms + LONG_POLL_SLACK_MS))
            .await
    }

    async fn get(&self, path: &str, timeout: Duration) -> Result<NodeLeader, ClientError> {
        let uri = self.base.join(path)?;
        let request = Request::builder()
            .method(Method::GET)
            .uri(uri)
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::new()))
            .map_err(|e| ClientError::InvalidRequest(e.to_string()))?;
        let answer = self
            .transport
            .exchange(request, timeout)
            .await
            .map_err(|f| self.failure(f))?;
        parse_json(&answer)
    }

    fn failure(&self, failure: Failure) -> ClientError {
        match failure {
            Failure::Connect(reason) | Failure::Broken(reason) => ClientError::Unreachable {
                url: self.base.as_str(),
                attempts: 1,
                reason,
            },
            Failure::Timeout(after) => ClientError::Unreachable {
                url: self.base.as_str(),
                attempts: 1,
                reason: format!("no answer within {} ms", millis(after)),
            },
            Failure::TooLarge => ClientError::InvalidResponse(format!(
                "answer from {} is over {} bytes",
                self.base.as_str(),
                crate::http::RESPONSE_BYTES_MAX
            )),
        }
    }
}

/// The JSON body of a 2xx answer, or the error the answer stands for.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    answer: &Answer,
) -> Result<T, ClientError> {
    if answer.status != StatusCode::OK {
        return Err(ClientError::Status {
            status: answer.status,
            detail: answer.detail(),
        });
    }
    serde_json::from_slice(&answer.body).map_err(|e| {
        ClientError::InvalidResponse(format!("{e}: {}", String::from_utf8_lossy(&answer.body)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_and_map_to_leadership() {
        let leader: NodeLeader = serde_json::from_str(
            r#"{"node_id":1,"scope":"default","term":7,"leader_id":1,"role":"leader","token":7,"announced":true}"#,
        )
        .unwrap();
        assert_eq!(leader.leadership(), Leadership::leader(7, 7, Some(1)));
        let establishing: NodeLeader = serde_json::from_str(
            r#"{"node_id":1,"scope":"default","term":8,"leader_id":1,"role":"leader","token":null,"announced":false}"#,
        )
        .unwrap();
        assert!(establishing.is_establishing());
        assert_eq!(establishing.leadership().write_token(), None);
        let follower: NodeLeader = serde_json::from_str(
            r#"{"node_id":2,"scope":"default","term":8,"leader_id":0,"role":"follower","token":null,"announced":false}"#,
        )
        .unwrap();
        assert_eq!(follower.leadership(), Leadership::not_leader(8, None));
        let odd: NodeLeader = serde_json::from_str(
            r#"{"node_id":2,"scope":"s","term":1,"leader_id":null,"role":"learner","token":null}"#,
        )
        .unwrap();
        assert_eq!(odd.role, Role::Other);
    }
}
