//! What a token proof signs.
//!
//! A node holding the cluster's signing key proves a fencing token by signing
//! [`proof_message`]`(scope, token)` with Ed25519; clients send the signature, base64url
//! without padding, in `Fencing-Token-Proof`; a proxy holding the public key admits the
//! token only if the signature verifies for exactly that scope and token. The message
//! starts with a fixed domain string, so a signature made with the same key for any other
//! purpose can never pass as a token proof, and the scope is closed by a NUL byte (which a
//! scope cannot contain), so no (scope, token) pair encodes the same bytes as another.
//!
//! Signing and verifying live where the keys are (the election node and the proxy); this
//! module only fixes the bytes and their text form ([`encode_proof`], [`decode_proof`]),
//! so that both sides agree by construction.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The domain-separation prefix of every signed token, versioned.
pub const PROOF_DOMAIN: &[u8] = b"palisade fencing token proof v1\0";

/// Longest `Fencing-Token-Proof` value accepted: an Ed25519 signature is 64 bytes, 86
/// characters of unpadded base64url; anything much longer is not a proof and is refused
/// before decoding.
pub const PROOF_CHARS_MAX: usize = 128;

/// Length of a token proof in bytes: one Ed25519 signature.
pub const PROOF_BYTES: usize = 64;

/// Room to decode any value of up to [`PROOF_CHARS_MAX`] characters without allocating.
const DECODE_BUFFER_BYTES: usize = PROOF_CHARS_MAX * 3 / 4 + 3;

/// Why a `Fencing-Token-Proof` value is not the text form of a proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProofDecodeError {
    /// Longer than any proof; refused before decoding.
    TooLong {
        /// Its length.
        chars: usize,
    },
    /// Not unpadded base64url.
    NotBase64,
    /// Decodes, but not to a signature's length.
    WrongLength {
        /// The decoded length.
        bytes: usize,
    },
}

impl std::fmt::Display for ProofDecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooLong { chars } => write!(
                f,
                "Fencing-Token-Proof is {chars} characters; a proof is at most {PROOF_CHARS_MAX}"
            ),
            Self::NotBase64 => f.write_str("Fencing-Token-Proof is not unpadded base64url"),
            Self::WrongLength { bytes } => write!(
                f,
                "Fencing-Token-Proof decodes to {bytes} bytes; an Ed25519 signature is {PROOF_BYTES}"
            ),
        }
    }
}

impl std::error::Error for ProofDecodeError {}

/// A proof's text form, as sent in `Fencing-Token-Proof`: the signature in base64url
/// without padding (86 characters for an Ed25519 signature).
pub fn encode_proof(signature: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(signature)
}

/// The signature a `Fencing-Token-Proof` value encodes: exactly [`PROOF_BYTES`] bytes of
/// unpadded base64url, at most [`PROOF_CHARS_MAX`] characters. Does not allocate, as a
/// proxy decodes one per fenced request.
pub fn decode_proof(text: &[u8]) -> Result<[u8; PROOF_BYTES], ProofDecodeError> {
    if text.len() > PROOF_CHARS_MAX {
        return Err(ProofDecodeError::TooLong { chars: text.len() });
    }
    let mut buffer = [0u8; DECODE_BUFFER_BYTES];
    let bytes = URL_SAFE_NO_PAD
        .decode_slice(text, &mut buffer)
        .map_err(|_| ProofDecodeError::NotBase64)?;
    buffer
        .get(..bytes)
        .and_then(|decoded| <[u8; PROOF_BYTES]>::try_from(decoded).ok())
        .ok_or(ProofDecodeError::WrongLength { bytes })
}

/// The bytes a token proof signs: the domain, the scope, a NUL, and the token as 8
/// big-endian bytes.
pub fn proof_message(scope: &str, token: u64) -> Vec<u8> {
    let mut message = Vec::with_capacity(PROOF_DOMAIN.len() + scope.len() + 1 + 8);
    message.extend_from_slice(PROOF_DOMAIN);
    message.extend_from_slice(scope.as_bytes());
    message.push(0);
    message.extend_from_slice(&token.to_be_bytes());
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: distinct (scope, token) pairs never sign the same bytes, and the layout is
    /// the documented one.
    /// Method: compare messages that differ only in scope/token boundaries.
    #[test]
    fn messages_are_unambiguous() {
        let m = proof_message("ab", 1);
        assert!(m.starts_with(PROOF_DOMAIN));
        assert_eq!(&m[PROOF_DOMAIN.len()..], b"ab\0\0\0\0\0\0\0\0\x01");
        assert_ne!(proof_message("a", 0x6200), proof_message("ab", 0));
        assert_ne!(proof_message("default", 7), proof_message("default", 8));
        assert_ne!(proof_message("a", 7), proof_message("b", 7));
    }

    /// Goal: a proof's text form is unpadded base64url of exactly 64 bytes and reads back
    /// the same; padding, the standard alphabet, other lengths and over-long values are
    /// refused with the reason.
    /// Method: encode a signature, decode it, then decode variants of its text.
    #[test]
    fn proof_text_round_trips_and_refuses_other_forms() {
        let signature = [0xfb; PROOF_BYTES];
        let text = encode_proof(&signature);
        assert_eq!(text.len(), 86);
        assert_eq!(decode_proof(text.as_bytes()), Ok(signature));
        let padded = format!("{text}==");
        assert_eq!(
            decode_proof(padded.as_bytes()),
            Err(ProofDecodeError::NotBase64)
        );
        let standard = text.replace('-', "+").replace('_', "/");
        assert_eq!(
            decode_proof(standard.as_bytes()),
            Err(ProofDecodeError::NotBase64)
        );
        assert_eq!(
            decode_proof(&text.as_bytes()[..84]),
            Err(ProofDecodeError::WrongLength { bytes: 63 })
        );
        assert_eq!(
            decode_proof(b""),
            Err(ProofDecodeError::WrongLength { bytes: 0 })
        );
        let longest = "A".repeat(PROOF_CHARS_MAX);
        assert_eq!(
            decode_proof(longest.as_bytes()),
            Err(ProofDecodeError::WrongLength { bytes: 96 })
        );
        let longer = "A".repeat(PROOF_CHARS_MAX + 1);
        assert_eq!(
            decode_proof(longer.as_bytes()),
            Err(ProofDecodeError::TooLong { chars: 129 })
        );
    }
}
