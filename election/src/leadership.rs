//! What a node knows about leadership, published on a `tokio::sync::watch` after every
//! cycle of the election loop.

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

/// Why a leader's token was released (made available to write with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ReleasedBy {
    /// Leases are off: the token is released the moment the leader is established.
    Establishment,
    /// Every `--announce` proxy accepted the new term (at once when none is configured).
    Announce,
    /// The release wait passed (`lease_ms * (1 + drift) + write bound` since
    /// establishment, on this node's monotonic clock) before every proxy accepted it.
    LeaseExpiry,
}

impl ReleasedBy {
    /// The name used in logs (`by`) and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Establishment => "establishment",
            Self::Announce => "announce",
            Self::LeaseExpiry => "lease-expiry",
        }
    }
}

impl std::fmt::Display for ReleasedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One node's view of leadership.
///
/// Invariants (kept by the election loop, the only writer):
/// - `established` is `Some(term)` only while this node is the leader of `term`, has
///   applied an entry of `term`, and is not transferring leadership;
/// - `token` is `Some(term)` only while `established` is `Some(term)`, and only once the
///   token is released (`released_by`): at establishment when leases are off; with
///   leases on (`lease_ms` > 0), once every configured proxy accepted the term or once the
///   release wait passed since establishment, whichever is first. Without leases `token`
///   and `established` are always equal;
/// - `released_by` is `Some` exactly while `token` is `Some`;
/// - `announced` is true only while `established` is `Some`, and only once every
///   configured proxy accepted that term (at once when none is configured);
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
    /// The fencing token this node may use: its term while it is the established leader
    /// and the token is released.
    pub token: Option<u64>,
    /// Whether every configured proxy accepted the established term.
    pub announced: bool,
    /// The proof of `token`: the cluster key's signature over
    /// `palisade_protocol::proof::proof_message(scope, token)`.
    pub proof: Option<TokenProof>,
    /// The term this node is the established leader of, released or not: what the
    /// announcer announces.
    #[serde(default)]
    pub established: Option<u64>,
    /// Why `token` was released; `None` while it is not.
    #[serde(default)]
    pub released_by: Option<ReleasedBy>,
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
            established: None,
            released_by: None,
        }
    }
}

/// Length of an Ed25519 signature in bytes.
pub const TOKEN_PROOF_BYTES: usize = palisade_protocol::proof::PROOF_BYTES;

/// A token proof: an Ed25519 signature. Kept as bytes so that [`Leadership`] stays `Copy`;
/// shown and serialized as base64url without padding, the wire form of
/// `Fencing-Token-Proof`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenProof(pub [u8; TOKEN_PROOF_BYTES]);

impl TokenProof {
    /// The wire form: base64url without padding (86 characters).
    pub fn encode(&self) -> String {
        palisade_protocol::proof::encode_proof(&self.0)
    }

    /// Parses the wire form; `None` unless it is exactly 64 bytes of unpadded base64url.
    pub fn decode(text: &str) -> Option<Self> {
        palisade_protocol::proof::decode_proof(text.as_bytes())
            .ok()
            .map(Self)
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
