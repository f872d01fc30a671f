//! The error body of every Palisade API: `application/problem+json` (RFC 9457).

use http::StatusCode;
use serde::{Deserialize, Serialize};

/// The base of every problem `type` URI; the last segment names the problem
/// (`.../problems/stale-token`), and is stable: clients and metrics key on it.
pub const PROBLEM_TYPE_BASE: &str = "https://palisade.invalid/problems/";

/// The problem kinds (the last segment of a problem's `type`) that the proxy and the
/// control-plane servers answer with. Clients and metrics key on them, so each is spelled
/// once, here. The fleet lease's kinds are in [`crate::lease`].
pub mod kind {
    /// A write without `Fencing-Token` (400).
    pub const MISSING_TOKEN: &str = "missing-token";
    /// A fenced request without `Fencing-Token-Proof` at a proxy that checks proofs (401).
    pub const MISSING_PROOF: &str = "missing-proof";
    /// A `Fencing-Token-Proof` that is malformed or does not sign this scope and token
    /// (401).
    pub const INVALID_PROOF: &str = "invalid-proof";
    /// A `Fencing-Token` that is not one decimal u64 (400).
    pub const BAD_TOKEN: &str = "bad-token";
    /// A scope name outside the contract (400).
    pub const BAD_SCOPE: &str = "bad-scope";
    /// A path whose meaning depends on how it is decoded (400).
    pub const BAD_PATH: &str = "bad-path";
    /// CONNECT, or an upgrade on a route that does not allow it (405).
    pub const TUNNEL_REFUSED: &str = "tunnel-refused";
    /// A new scope when the proxy already holds its limit of scopes.
    pub const SCOPES_FULL: &str = "scopes-full";
    /// A token below the scope's fence (409).
    pub const STALE_TOKEN: &str = "stale-token";
    /// Fleet mode: a token above the term the cluster granted a lease for.
    pub const TOKEN_NOT_ISSUED: &str = "token-not-issued";
    /// Fleet mode: a fenced request of a scope other than the cluster's.
    pub const FOREIGN_SCOPE: &str = "foreign-scope";
    /// Lower-token writes (or, for a reset, the scope's writes) were still in flight at
    /// the barrier's deadline (503).
    pub const BARRIER_TIMEOUT: &str = "barrier-timeout";
    /// A body over its limit (413).
    pub const BODY_TOO_LARGE: &str = "body-too-large";
    /// A request head over its limit (431).
    pub const HEAD_TOO_LARGE: &str = "head-too-large";
    /// The client did not send its body in time (408).
    pub const BODY_TIMEOUT: &str = "body-timeout";
    /// The client's body could not be read.
    pub const BODY_READ: &str = "body-read";
    /// A request the resource cannot use (400).
    pub const BAD_REQUEST: &str = "bad-request";
    /// A `Connection` header that names a header which frames, targets or fences the
    /// request (`Content-Length`, `Host`, `Fencing-Token`, ...): a proxy would drop it
    /// before forwarding and so change the request (400).
    pub const BAD_CONNECTION: &str = "bad-connection";
    /// A request whose target host is ambiguous or missing: `Host` repeated, malformed,
    /// absent on HTTP/1.1, or different from an absolute-form target's authority (400).
    pub const BAD_HOST: &str = "bad-host";
    /// A `Transfer-Encoding` other than a single `chunked` (gzip, compress, ...), which
    /// the proxy would otherwise have to drop or decode (501).
    pub const UNSUPPORTED_TRANSFER_CODING: &str = "unsupported-transfer-coding";
    /// A GET or HEAD request that carries a body on a route without `read_bodies` (400).
    pub const BODY_ON_READ: &str = "body-on-read";
    /// Requests without a fencing token whose bodies are still arriving already hold
    /// their share of the upstream's slots (503).
    pub const UNFENCED_STREAMS_FULL: &str = "unfenced-streams-full";
    /// Nothing at this path or key (404).
    pub const NOT_FOUND: &str = "not-found";
    /// The resource does not take this method (405).
    pub const METHOD_NOT_ALLOWED: &str = "method-not-allowed";
    /// No response head from the upstream in time (504).
    pub const UPSTREAM_TIMEOUT: &str = "upstream-timeout";
    /// The upstream could not be reached or broke the exchange (502).
    pub const UPSTREAM_ERROR: &str = "upstream-error";
    /// The proxy's own storage failed; nothing was forwarded (500).
    pub const STORAGE_ERROR: &str = "storage-error";
    /// The proxy is shutting down or otherwise cannot take work (503).
    pub const UNAVAILABLE: &str = "unavailable";
    /// A control-plane request body that is not the JSON the endpoint takes.
    pub const BAD_BODY: &str = "bad-body";
    /// A control-plane query string that is not the one the endpoint takes (400).
    pub const BAD_QUERY: &str = "bad-query";
    /// A control-plane listener at its connection limit with every connection busy (503).
    pub const TOO_MANY_CONNECTIONS: &str = "too-many-connections";
    /// A long poll of the node API over its limit, for its client or in all (429, with
    /// `retry-after`).
    pub const TOO_MANY_LONG_POLLS: &str = "too-many-long-polls";
    /// A node API request whose client certificate's role does not allow it (403); the
    /// detail names the role needed and the credential (`crate::roles`).
    pub const FORBIDDEN_ROLE: &str = "forbidden-role";

    // The node API's kinds (membership, transfers, the announce list, test faults).
    /// Test faults body that is not a valid fault specification (400).
    pub const BAD_FAULTS: &str = "bad-faults";
    /// The node's election loop stopped; it cannot answer (503).
    pub const NODE_STOPPED: &str = "node-stopped";
    /// A member id or peer address that is not valid (400).
    pub const BAD_MEMBER: &str = "bad-member";
    /// A member id that was removed before: ids are never reused (409).
    pub const MEMBER_ID_REUSED: &str = "member-id-reused";
    /// The id is already a member (409).
    pub const ALREADY_MEMBER: &str = "already-member";
    /// The peer address is another member's (409).
    pub const PEER_IN_USE: &str = "peer-in-use";
    /// No member with this id (404).
    pub const NOT_A_MEMBER: &str = "not-a-member";
    /// The cluster is at its member limit (409).
    pub const TOO_MANY_MEMBERS: &str = "too-many-members";
    /// Another membership change is under way (409).
    pub const MEMBERSHIP_CHANGE_PENDING: &str = "membership-change-pending";
    /// Removing the leader before leadership moved (409; the node moves it first).
    pub const MEMBER_IS_LEADER: &str = "member-is-leader";
    /// The change would leave no voter (409).
    pub const LAST_VOTER: &str = "last-voter";
    /// The learner is already a voter (409).
    pub const ALREADY_VOTER: &str = "already-voter";
    /// The learner has not caught up, so it is not promoted (409).
    pub const LEARNER_NOT_CAUGHT_UP: &str = "learner-not-caught-up";
    /// A removal that would leave fewer than three voters, without `force` (409).
    pub const VOTERS_BELOW_THREE: &str = "voters-below-three";
    /// The voters left would have no reachable quorum (409).
    pub const QUORUM_UNREACHABLE: &str = "quorum-unreachable";
    /// Removing the leader: leadership could not be moved off it (503).
    pub const LEADER_NOT_MOVED: &str = "leader-not-moved";
    /// No leader is known to take the change (503).
    pub const NO_LEADER: &str = "no-leader";
    /// raft refused the proposal (503).
    pub const PROPOSAL_REFUSED: &str = "proposal-refused";
    /// The change was not applied in time (504).
    pub const MEMBER_CHANGE_TIMEOUT: &str = "member-change-timeout";
    /// The announce list cannot change with fleet leases (409).
    pub const ANNOUNCE_FIXED: &str = "announce-fixed";
    /// A transfer to a node that is not a voter (404 or 409).
    pub const UNKNOWN_NODE: &str = "unknown-node";
    /// No other voter to hand leadership to (409).
    pub const NO_CANDIDATE: &str = "no-candidate";
    /// raft refused the leadership transfer (409).
    pub const TRANSFER_REFUSED: &str = "transfer-refused";
    /// Another transfer or an election came first (409).
    pub const TRANSFER_SUPERSEDED: &str = "transfer-superseded";
    /// The transfer's outcome was not known in time (504).
    pub const TRANSFER_TIMEOUT: &str = "transfer-timeout";
    /// An announce entry that is not `URL` or `NAME=URL` as the rules say (400).
    pub const BAD_ANNOUNCE: &str = "bad-announce";
    /// A proxy removed from the announce list could not be retired first (409).
    pub const PROXY_NOT_RETIRED: &str = "proxy-not-retired";
    /// The announce list changed under the request (409).
    pub const ANNOUNCE_CHANGED: &str = "announce-changed";
    /// A fence reset on a proxy without an admin token (403).
    pub const RESET_DISABLED: &str = "reset-disabled";
    /// An admin API request without the right bearer token (401).
    pub const UNAUTHORIZED: &str = "unauthorized";

    // Named leaderships (sessions and scopes on the node API).
    /// 404: no live session has this id (never opened, revoked or expired).
    pub const UNKNOWN_SESSION: &str = "unknown-session";
    /// 400: a session TTL outside the node's bounds.
    pub const BAD_TTL: &str = "bad-ttl";
    /// 507: the cluster holds its limit of live sessions.
    pub const TOO_MANY_SESSIONS: &str = "too-many-sessions";
    /// 507: the cluster holds its limit of scopes held or waited for.
    pub const TOO_MANY_SCOPES: &str = "too-many-scopes";
    /// 507: the scope has its limit of waiting sessions.
    pub const TOO_MANY_WAITERS: &str = "too-many-waiters";
    /// 507: the session holds or waits for its limit of scopes.
    pub const SESSION_SCOPES_FULL: &str = "session-scopes-full";
    /// 403: the session was opened by another client identity.
    pub const SESSION_OWNER: &str = "session-owner";
    /// 429: keepalives for one session faster than the node's limit.
    pub const KEEPALIVE_TOO_FAST: &str = "keepalive-too-fast";
    /// 409: the campaign's timeout passed while another session held the scope; the
    /// session no longer waits for it.
    pub const CAMPAIGN_TIMEOUT: &str = "campaign-timeout";
    /// 503: the session holds the scope, but not every announce proxy fences it yet;
    /// campaign again to get the grant once they do.
    pub const FENCE_PENDING: &str = "fence-pending";
    /// 409: the cluster's own scope (`--scope`) is held by the raft leader's term.
    pub const CLUSTER_SCOPE: &str = "cluster-scope";
    /// 501: this cluster cannot grant named scopes (it runs fleet leases).
    pub const SCOPES_UNAVAILABLE: &str = "scopes-unavailable";
}

/// An RFC 9457 problem, with the extension members Palisade's answers use.
///
/// Fencing rejections carry `scope`, `presented` and `current`; node API errors carry
/// `node_id` and, when known, `leader_id` (where to retry).
/// A member that does not apply is left out, never written as `null`, and reads back
/// as `None` when absent (serde's rule for `Option` members).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// `https://palisade.invalid/problems/<kind>`.
    #[serde(rename = "type")]
    pub type_uri: String,
    /// A short, human summary of the problem class.
    pub title: String,
    /// The HTTP status, repeated in the body.
    pub status: u16,
    /// What happened in this case, with the numbers.
    pub detail: String,
    /// The fencing scope concerned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The token the request presented.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presented: Option<u64>,
    /// The scope's current fence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<u64>,
    /// The node that answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<u64>,
    /// The leader that node knows, where a request should go instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_id: Option<u64>,
}

impl Problem {
    /// A problem of kind `kind` (the last segment of its `type`), titled with the status'
    /// canonical reason.
    pub fn new(status: StatusCode, kind: &str, detail: impl Into<String>) -> Self {
        Self {
            type_uri: format!("{PROBLEM_TYPE_BASE}{kind}"),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
            scope: None,
            presented: None,
            current: None,
            node_id: None,
            leader_id: None,
        }
    }

    /// Replaces the title.
    #[must_use]
    pub fn with_title(mut self, title: impl Into<String>) -> Self {
        self.title = title.into();
        self
    }

    /// Adds the fencing members.
    #[must_use]
    pub fn with_fence(mut self, scope: &str, presented: u64, current: u64) -> Self {
        self.scope = Some(scope.to_owned());
        self.presented = Some(presented);
        self.current = Some(current);
        self
    }

    /// Adds the node members.
    #[must_use]
    pub fn with_node(mut self, node_id: u64, leader_id: Option<u64>) -> Self {
        self.node_id = Some(node_id);
        self.leader_id = leader_id;
        self
    }

    /// The kind: the last segment of `type` (`stale-token`), or the whole `type` when it
    /// is not one of Palisade's.
    pub fn kind(&self) -> &str {
        self.type_uri
            .strip_prefix(PROBLEM_TYPE_BASE)
            .unwrap_or(&self.type_uri)
    }

    /// The status as an [`StatusCode`] (500 if the body held a number that is not one).
    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.kind(), self.detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a fencing problem renders the RFC 9457 members plus scope/presented/current,
    /// and nothing that is unset; it reads back the same.
    /// Method: serialize, inspect, deserialize.
    #[test]
    fn fencing_problem_round_trips() {
        let p =
            Problem::new(StatusCode::CONFLICT, "stale-token", "stale").with_fence("default", 3, 7);
        let v: serde_json::Value = serde_json::to_value(&p).unwrap();
        assert_eq!(v["type"], "https://palisade.invalid/problems/stale-token");
        assert_eq!(v["title"], "Conflict");
        assert_eq!(v["status"], 409);
        assert_eq!(v["current"], 7);
        assert!(v.get("node_id").is_none(), "{v}");
        let back: Problem = serde_json::from_value(v).unwrap();
        assert_eq!(back, p);
        assert_eq!(back.kind(), "stale-token");
        assert_eq!(back.status_code(), StatusCode::CONFLICT);
    }
}
