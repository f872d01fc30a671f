//! Token proofs: the proxy's public keys, and the check that a fenced request's token was
//! signed by the cluster for exactly its scope.
//!
//! A node holding the cluster's signing key signs
//! [`proof_message`]`(scope, token)` with Ed25519 and publishes the signature with its
//! token; clients send it, base64url without padding, in `Fencing-Token-Proof`. With
//! `token_pub` configured, the proxy admits a fenced request only if that signature
//! verifies under one of its keys (several keys allow rotation). So a client that
//! invents a token, even the maximum, cannot move a fence: it cannot sign it.
//!
//! # Cost
//! A signature is verified once per (scope, token, proof): per scope the proxy remembers
//! the last proof that verified, as the header's text. The next request of the scope
//! with the same token and the same text is admitted by one map lookup and two
//! comparisons, with no decoding, no signature work and no allocation. A different text
//! or token is verified in full and, if good, replaces the entry.

use std::path::{Path, PathBuf};

use dashmap::DashMap;
use http::HeaderMap;
use palisade_protocol::headers::FENCING_TOKEN_PROOF;
use palisade_protocol::proof::{ProofDecodeError, decode_proof, proof_message};
use ring::signature::{ED25519, UnparsedPublicKey};
use rustls_pki_types::pem::{PemObject, SectionKind};

use crate::config::ConfigError;
use crate::error::ProxyError;

/// Scopes whose last verified proof is remembered. Only proofs that verified are
/// remembered, so only the cluster's key can fill it; past it, an arbitrary entry is
/// dropped for the new one (that scope's next request verifies again). Concurrent
/// inserts may pass the bound by the number of requests verifying at that moment.
pub const PROOF_CACHE_SCOPES_MAX: usize = 10_000;

/// Largest public key file read, in bytes: a PEM Ed25519 public key is about 113 bytes;
/// anything far larger is not one, and is refused without being read whole.
pub const KEY_FILE_BYTES_MAX: u64 = 64 * 1024;

/// The DER prefix of an Ed25519 `SubjectPublicKeyInfo`: SEQUENCE, `AlgorithmIdentifier`
/// (OID 1.3.101.112), BIT STRING of 33 bytes with no unused bits. The 32 key bytes follow.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];
/// An Ed25519 public key, in bytes.
const ED25519_KEY_BYTES: usize = 32;
/// A signature as unpadded base64url: `ceil(64 * 4 / 3)` characters.
const PROOF_TEXT_CHARS: usize = 86;

/// Why a proof was refused. The detail of a 401 `invalid-proof`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProofFault {
    /// The header was sent more than once.
    #[error("Fencing-Token-Proof is repeated")]
    Repeated,
    /// The header is not a proof's text form (too long, not unpadded base64url, or not
    /// a signature's length).
    #[error(transparent)]
    Malformed(#[from] ProofDecodeError),
    /// A signature, but not the cluster's for this scope and token.
    #[error(
        "Fencing-Token-Proof does not verify for this scope and token under any of the {keys} configured keys"
    )]
    DoesNotVerify {
        /// How many keys were tried.
        keys: usize,
    },
}

/// The last proof that verified for a scope.
struct Verified {
    token: u64,
    /// The header's text, exactly as it verified.
    text: [u8; PROOF_TEXT_CHARS],
}

/// The proxy's public keys and its memory of proofs that verified. Shared by the data
/// path and the admin API.
pub(crate) struct ProofVerifier {
    /// Raw Ed25519 public keys; a proof passes if any one verifies it.
    keys: Vec<[u8; ED25519_KEY_BYTES]>,
    verified: DashMap<String, Verified>,
}

impl ProofVerifier {
    /// Loads every file of `paths` (field `token_pub`); none may be bad.
    pub(crate) fn load(paths: &[PathBuf]) -> Result<Self, ConfigError> {
        let keys = paths
            .iter()
            .map(|path| load_public_key(path))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(keys))
    }

    /// A verifier over raw Ed25519 public keys.
    pub(crate) fn new(keys: Vec<[u8; ED25519_KEY_BYTES]>) -> Self {
        Self {
            keys,
            verified: DashMap::new(),
        }
    }

    /// Checks the `Fencing-Token-Proof` of a fenced request with `token` in `scope`:
    /// 401 `missing-proof` without one, 401 `invalid-proof` for one that does not verify.
    pub(crate) fn check_header(
        &self,
        scope: &str,
        token: u64,
        headers: &HeaderMap,
    ) -> Result<(), ProxyError> {
        let mut values = headers.get_all(FENCING_TOKEN_PROOF).iter();
        let text = match (values.next(), values.next()) {
            (None, _) => {
                return Err(ProxyError::MissingProof {
                    scope: scope.to_owned(),
                    presented: token,
                });
            }
            (Some(_), Some(_)) => Err(ProofFault::Repeated),
            (Some(value), None) => Ok(value.as_bytes()),
        };
        text.and_then(|text| self.check(scope, token, text))
            .map_err(|fault| ProxyError::InvalidProof {
                scope: scope.to_owned(),
                presented: token,
                fault,
            })
    }

    /// Checks a proof given as text (the header's value, or an advance's `proof`).
    pub(crate) fn check(&self, scope: &str, token: u64, text: &[u8]) -> Result<(), ProofFault> {
        // The hot path: the same token with the same text as last time for this scope.
        if let Some(last) = self.verified.get(scope)
            && last.token == token
            && last.text.as_slice() == text
        {
            return Ok(());
        }
        let signature = decode_proof(text)?;
        let message = proof_message(scope, token);
        let verifies = self.keys.iter().any(|key| {
            UnparsedPublicKey::new(&ED25519, key)
                .verify(&message, &signature)
                .is_ok()
        });
        if !verifies {
            return Err(ProofFault::DoesNotVerify {
                keys: self.keys.len(),
            });
        }
        self.remember(scope, token, text);
        Ok(())
    }

    /// Forgets what verified for `scope` (after a reset of its fence).
    pub(crate) fn forget(&self, scope: &str) {
        self.verified.remove(scope);
    }

    fn remember(&self, scope: &str, token: u64, text: &[u8]) {
        // Only canonical 86-character texts decode to a 64-byte signature, so this holds
        // for every proof that verified.
        let Ok(text) = <[u8; PROOF_TEXT_CHARS]>::try_from(text) else {
            return;
        };
        if let Some(mut last) = self.verified.get_mut(scope) {
            *last = Verified { token, text };
            return;
        }
        if self.verified.len() >= PROOF_CACHE_SCOPES_MAX {
            // Take the key out first: removing while an iterator guard is held would
            // deadlock on its shard.
            let victim = self.verified.iter().next().map(|entry| entry.key().clone());
            if let Some(victim) = victim {
                self.verified.remove(&victim);
            }
        }
        self.verified
            .insert(scope.to_owned(), Verified { token, text });
    }
}

/// One `token_pub` file: a PEM `PUBLIC KEY` holding an Ed25519 `SubjectPublicKeyInfo`,
/// and nothing else.
fn load_public_key(path: &Path) -> Result<[u8; ED25519_KEY_BYTES], ConfigError> {
    let bad = |reason: String| ConfigError::File {
        field: "token_pub",
        path: path.to_owned(),
        reason,
    };
    let pem = read_bounded(path, KEY_FILE_BYTES_MAX).map_err(bad)?;
    let mut sections = Vec::new();
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(&pem) {
        sections.push(section.map_err(|err| bad(format!("not valid PEM: {err}")))?);
    }
    let der = match sections.as_slice() {
        [(SectionKind::PublicKey, der)] => der,
        [] => return Err(bad("holds no PEM section; expected one PUBLIC KEY".into())),
        [(kind, _)] => {
            return Err(bad(format!(
                "holds a PEM {kind:?} section; expected one PUBLIC KEY (token.pub, not token.key)"
            )));
        }
        more => {
            return Err(bad(format!(
                "holds {} PEM sections; expected exactly one PUBLIC KEY (give each key its own --token-pub)",
                more.len()
            )));
        }
    };
    der.strip_prefix(ED25519_SPKI_PREFIX.as_slice())
        .and_then(|key| <[u8; ED25519_KEY_BYTES]>::try_from(key).ok())
        .ok_or_else(|| {
            bad(format!(
                "the PUBLIC KEY is not an Ed25519 key ({} bytes of DER; an Ed25519 key is {})",
                der.len(),
                ED25519_SPKI_PREFIX.len() + ED25519_KEY_BYTES
            ))
        })
}

/// Reads a small file whole, refusing one over `max` bytes without reading it all.
pub(crate) fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|err| format!("cannot read it: {err}"))?;
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| format!("cannot read it: {err}"))?;
    if bytes.len() as u64 > max {
        return Err(format!("is over {max} bytes"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use palisade_protocol::proof::PROOF_CHARS_MAX;
    use ring::rand::SystemRandom;
    use ring::signature::{Ed25519KeyPair, KeyPair as _};

    use super::*;

    fn key_pair() -> Ed25519KeyPair {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        Ed25519KeyPair::from_pkcs8_maybe_unchecked(pkcs8.as_ref()).unwrap()
    }

    fn public(pair: &Ed25519KeyPair) -> [u8; 32] {
        pair.public_key().as_ref().try_into().unwrap()
    }

    fn sign(pair: &Ed25519KeyPair, scope: &str, token: u64) -> String {
        palisade_protocol::proof::encode_proof(pair.sign(&proof_message(scope, token)).as_ref())
    }

    /// Goal: a proof passes for exactly its scope and token and only under a configured
    /// key; each malformed text is refused with its own fault.
    /// Method: check a good proof, then the same proof for another token and scope, one
    /// by an unknown key, and hostile texts.
    #[test]
    fn proofs_pass_only_for_their_scope_and_token() {
        let pair = key_pair();
        let verifier = ProofVerifier::new(vec![public(&pair)]);
        let good = sign(&pair, "jobs", 7);
        assert_eq!(good.len(), PROOF_TEXT_CHARS);
        verifier.check("jobs", 7, good.as_bytes()).unwrap();
        let does_not_verify = Err(ProofFault::DoesNotVerify { keys: 1 });
        assert_eq!(verifier.check("jobs", 8, good.as_bytes()), does_not_verify);
        assert_eq!(verifier.check("other", 7, good.as_bytes()), does_not_verify);
        let stranger = sign(&key_pair(), "jobs", 7);
        assert_eq!(
            verifier.check("jobs", 7, stranger.as_bytes()),
            does_not_verify
        );
        assert_eq!(
            verifier.check("jobs", 7, b"!!not base64!!"),
            Err(ProofFault::Malformed(ProofDecodeError::NotBase64))
        );
        assert_eq!(
            verifier.check("jobs", 7, format!("{good}=").as_bytes()),
            Err(ProofFault::Malformed(ProofDecodeError::NotBase64)),
            "padding is refused"
        );
        assert_eq!(
            verifier.check("jobs", 7, &good.as_bytes()[..80]),
            Err(ProofFault::Malformed(ProofDecodeError::WrongLength {
                bytes: 60
            }))
        );
        assert_eq!(
            verifier.check("jobs", 7, b""),
            Err(ProofFault::Malformed(ProofDecodeError::WrongLength {
                bytes: 0
            }))
        );
        assert_eq!(
            verifier.check("jobs", 7, "é".repeat(43).as_bytes()),
            Err(ProofFault::Malformed(ProofDecodeError::NotBase64)),
            "non-ASCII bytes are not base64url"
        );
        let long = "A".repeat(PROOF_CHARS_MAX);
        assert_eq!(
            verifier.check("jobs", 7, long.as_bytes()),
            Err(ProofFault::Malformed(ProofDecodeError::WrongLength {
                bytes: 96
            }))
        );
        let longer = "A".repeat(PROOF_CHARS_MAX + 1);
        assert_eq!(
            verifier.check("jobs", 7, longer.as_bytes()),
            Err(ProofFault::Malformed(ProofDecodeError::TooLong {
                chars: 129
            }))
        );
        // The good proof still passes, from the cache, after all of that.
        verifier.check("jobs", 7, good.as_bytes()).unwrap();
    }

    /// Goal: the cache admits only what verified: a cached (token, text) never lets a
    /// different token or text through, and forgetting a scope makes it verify again.
    /// Method: verify, then present the cached text with another token and a changed
    /// character; forget and verify again.
    #[test]
    fn the_cache_never_widens_what_passes() {
        let pair = key_pair();
        let verifier = ProofVerifier::new(vec![public(&pair)]);
        let good = sign(&pair, "s", 3);
        verifier.check("s", 3, good.as_bytes()).unwrap();
        assert!(verifier.verified.contains_key("s"));
        assert!(verifier.check("s", 4, good.as_bytes()).is_err());
        let mut tampered = good.clone().into_bytes();
        tampered[10] = if tampered[10] == b'A' { b'B' } else { b'A' };
        assert!(verifier.check("s", 3, &tampered).is_err());
        verifier.forget("s");
        assert!(!verifier.verified.contains_key("s"));
        verifier.check("s", 3, good.as_bytes()).unwrap();
    }

    /// Goal: with two keys (rotation) a proof by either passes.
    /// Method: sign with each of two configured keys.
    #[test]
    fn either_key_of_a_rotation_verifies() {
        let (old, new) = (key_pair(), key_pair());
        let verifier = ProofVerifier::new(vec![public(&old), public(&new)]);
        verifier
            .check("s", 1, sign(&old, "s", 1).as_bytes())
            .unwrap();
        verifier
            .check("s", 2, sign(&new, "s", 2).as_bytes())
            .unwrap();
    }

    /// Goal: the cache stays bounded however many scopes verify, and keeps the newest.
    /// Method: remember proofs of more scopes than the bound (the step after a signature
    /// verified; signing 10,000 proofs would only slow the test).
    #[test]
    fn the_cache_is_bounded() {
        let verifier = ProofVerifier::new(Vec::new());
        let text = [b'A'; PROOF_TEXT_CHARS];
        for i in 0..PROOF_CACHE_SCOPES_MAX + 10 {
            verifier.remember(&format!("s{i}"), 1, &text);
        }
        assert_eq!(verifier.verified.len(), PROOF_CACHE_SCOPES_MAX);
        let newest = format!("s{}", PROOF_CACHE_SCOPES_MAX + 9);
        assert_eq!(verifier.check(&newest, 1, &text), Ok(()));
    }

    /// Goal: every bad key file is refused with the file named and why: missing, empty,
    /// a private key, two keys, a non-Ed25519 key, garbage, and an oversized file; a good
    /// one loads the raw key.
    /// Method: write each file and load it.
    #[test]
    fn bad_key_files_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let pair = key_pair();
        let spki: Vec<u8> = [ED25519_SPKI_PREFIX.as_slice(), pair.public_key().as_ref()].concat();
        let pem = |label: &str, der: &[u8]| {
            format!(
                "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
                base64::engine::general_purpose::STANDARD.encode(der)
            )
        };
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let good = write("good.pub", &pem("PUBLIC KEY", &spki));
        let loaded = ProofVerifier::load(std::slice::from_ref(&good)).unwrap();
        assert_eq!(loaded.keys, vec![public(&pair)]);

        let cases = [
            ("missing.pub", None, "cannot read it"),
            ("empty.pub", Some(String::new()), "no PEM section"),
            (
                "private.pub",
                Some(pem("PRIVATE KEY", &spki)),
                "not token.key",
            ),
            (
                "two.pub",
                Some(format!("{0}{0}", pem("PUBLIC KEY", &spki))),
                "2 PEM sections",
            ),
            (
                "rsa.pub",
                Some(pem("PUBLIC KEY", &[0x30, 0x03, 0x02, 0x01, 0x00])),
                "not an Ed25519 key",
            ),
            (
                "garbage.pub",
                Some("-----BEGIN PUBLIC KEY-----\n!!!\n".to_owned()),
                "not valid PEM",
            ),
            (
                "huge.pub",
                Some("x".repeat(KEY_FILE_BYTES_MAX as usize + 1)),
                "over 65536 bytes",
            ),
        ];
        for (name, text, expected) in cases {
            let path = match text {
                Some(text) => write(name, &text),
                None => dir.path().join(name),
            };
            let err = ProofVerifier::load(&[good.clone(), path.clone()])
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains("token_pub"), "{name}: {err}");
            assert!(err.contains(&path.display().to_string()), "{name}: {err}");
            assert!(err.contains(expected), "{name}: {err}");
        }
    }
}
