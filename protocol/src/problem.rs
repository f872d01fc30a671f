//! The error body of every Palisade API: `application/problem+json` (RFC 9457).

use http::StatusCode;
use serde::{Deserialize, Serialize};

/// The base of every problem `type` URI; the last segment names the problem
/// (`.../problems/stale-token`), and is stable: clients and metrics key on it.
pub const PROBLEM_TYPE_BASE: &str = "https://palisade.invalid/problems/";

/// An RFC 9457 problem, with the extension members Palisade's answers use.
///
/// Fencing rejections carry `scope`, `presented` and `current`; node API errors carry
/// `node_id` and, when known, `leader_id` (where to retry).
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The token the request presented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presented: Option<u64>,
    /// The scope's current fence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<u64>,
    /// The node that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<u64>,
    /// The leader that node knows, where a request should go instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
