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
//! module only fixes the bytes, so that both sides agree by construction.

/// The domain-separation prefix of every signed token, versioned.
pub const PROOF_DOMAIN: &[u8] = b"palisade fencing token proof v1\0";

/// Longest `Fencing-Token-Proof` value accepted: an Ed25519 signature is 64 bytes, 86
/// characters of unpadded base64url; anything much longer is not a proof and is refused
/// before decoding.
pub const PROOF_CHARS_MAX: usize = 128;

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
}
