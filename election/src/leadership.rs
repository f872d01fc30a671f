//! What a node knows about leadership, published on a `tokio::sync::watch` after every
//! cycle of the election loop.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use palisade_protocol::Role;

/// The API role of a raft state: raft's pre-candidate is reported as `candidate`, since
/// both campaign.
pub(crate) fn role_of(state: raft::StateRole) -> Role {
    match state {
        raft::StateRole::Follower => Role::Follower,
        raft::StateRole::Candidate | raft::StateRole::PreCandidate => Role::Candidate,
        raft::StateRole::Leader => Role::Leader,
    }
}

/// One node's view of leadership.
///
/// Invariants (kept by the election loop, the only writer):
/// - `token` is `Some(term)` only while this node is the leader of `term`, has applied an
///   entry of `term` (it is *established*), and is not transferring leadership;
/// - `announced` is true only while `token` is `Some`, and only once every configured proxy
///   accepted the token (at once when none is configured);
/// - `proof` is `Some` exactly while `token` is `Some` and a signing key is configured, and
///   then signs that token for this node's scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leadership {
    /// The node's current raft term; never decreases, across restarts too.
    pub term: u64,
    /// The leader this node knows for `term`, if any.
    pub leader_id: Option<u64>,
    /// This node's role.
    pub role: Role,
    /// The fencing token this node may use: its term while it is the established leader.
    pub token: Option<u64>,
    /// Whether every configured proxy accepted `token`.
    pub announced: bool,
    /// The proof of `token`: the cluster key's signature over
    /// `palisade_protocol::proof::proof_message(scope, token)`.
    pub proof: Option<TokenProof>,
}

impl Default for Leadership {
    fn default() -> Self {
        Self {
            term: 0,
            leader_id: None,
            role: Role::Follower,
            token: None,
            announced: false,
            proof: None,
        }
    }
}

/// Length of an Ed25519 signature in bytes.
pub const TOKEN_PROOF_BYTES: usize = 64;

/// A token proof: an Ed25519 signature. Kept as bytes so that [`Leadership`] stays `Copy`;
/// shown and serialized as base64url without padding, the wire form of
/// `Fencing-Token-Proof`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenProof(pub [u8; TOKEN_PROOF_BYTES]);

impl TokenProof {
    /// The wire form: base64url without padding (86 characters).
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.0)
    }

    /// Parses the wire form; `None` unless it is exactly 64 bytes of unpadded base64url.
    pub fn decode(text: &str) -> Option<Self> {
        let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
        Some(Self(bytes.try_into().ok()?))
    }
}

impl std::fmt::Debug for TokenProof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenProof({})", self.encode())
    }
}

impl std::fmt::Display for TokenProof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.encode())
    }
}

impl Serialize for TokenProof {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.encode())
    }
}

impl<'de> Deserialize<'de> for TokenProof {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::decode(&text).ok_or_else(|| {
            serde::de::Error::custom("a token proof is 64 bytes of unpadded base64url")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a proof round-trips through its wire form, and odd encodings are refused.
    /// Method: encode, decode; then padded, standard-alphabet, short and long inputs.
    #[test]
    fn proof_wire_form_round_trips_and_refuses_odd_encodings() {
        let proof = TokenProof([0xfb; TOKEN_PROOF_BYTES]);
        let text = proof.encode();
        assert_eq!(text.len(), 86);
        assert!(!text.contains('=') && !text.contains('+') && !text.contains('/'));
        assert_eq!(TokenProof::decode(&text), Some(proof));
        assert_eq!(TokenProof::decode(&format!("{text}==")), None);
        assert_eq!(
            TokenProof::decode(&text.replace('-', "+").replace('_', "/")),
            None
        );
        assert_eq!(TokenProof::decode(&text[..84]), None);
        assert_eq!(TokenProof::decode(&format!("{text}AAAA")), None);
        assert_eq!(TokenProof::decode(""), None);
        let json = serde_json::to_string(&proof).unwrap();
        assert_eq!(serde_json::from_str::<TokenProof>(&json).unwrap(), proof);
    }
}
