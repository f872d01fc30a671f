//! The cluster's token signing key (`--token-key`) and the announce bearer token
//! (`--announce-token-file`): loading them at start, and signing token proofs.
//!
//! A proof is Ed25519 over `palisade_protocol::proof::proof_message(scope, token)`; it is
//! computed once per token, when the token becomes available, in the election loop's
//! publish step (signing takes tens of microseconds, so the loop is not held up).

use std::path::Path;

use ring::signature::Ed25519KeyPair;
use rustls_pki_types::PrivatePkcs8KeyDer;
use rustls_pki_types::pem::PemObject as _;
use tracing::warn;

use palisade_protocol::proof::proof_message;

use crate::config::ConfigError;
use crate::leadership::{TOKEN_PROOF_BYTES, TokenProof};

/// Largest key or bearer-token file read, in bytes: a PEM Ed25519 key is about 120 bytes;
/// anything far larger is not one, and is refused before it is read into memory.
pub const KEY_FILE_BYTES_MAX: u64 = 64 * 1024;

/// Signs token proofs for one scope with the cluster key.
pub(crate) struct TokenSigner {
    key: Ed25519KeyPair,
    scope: String,
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSigner")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl TokenSigner {
    /// A signer from PEM text (a `PRIVATE KEY` block holding an Ed25519 PKCS#8 document).
    pub(crate) fn from_pem(pem: &[u8], scope: &str) -> Result<Self, String> {
        let der = PrivatePkcs8KeyDer::from_pem_slice(pem)
            .map_err(|e| format!("holds no PEM PRIVATE KEY block: {e}"))?;
        let key = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der())
            .map_err(|e| format!("is not an Ed25519 PKCS#8 private key: {e}"))?;
        Ok(Self {
            key,
            scope: scope.to_owned(),
        })
    }

    /// Loads the key file named by `--token-key`, warning when others can read it.
    pub(crate) fn load(path: &Path, scope: &str) -> Result<Self, ConfigError> {
        let pem = read_secret_file(path, "token_key")?;
        Self::from_pem(&pem, scope).map_err(|message| {
            ConfigError::new("token_key", format!("{} {message}", path.display()))
        })
    }

    /// The proof of `token` in this signer's scope.
    pub(crate) fn sign(&self, token: u64) -> TokenProof {
        self.sign_scope(&self.scope, token)
    }

    /// The proof of `token` in `scope` (a named scope's grant).
    pub(crate) fn sign_scope(&self, scope: &str, token: u64) -> TokenProof {
        let signature = self.key.sign(&proof_message(scope, token));
        let mut bytes = [0u8; TOKEN_PROOF_BYTES];
        // An Ed25519 signature is always 64 bytes; a mismatch would be a ring bug and
        // leaves the zero array, which no verifier accepts.
        if signature.as_ref().len() == TOKEN_PROOF_BYTES {
            bytes.copy_from_slice(signature.as_ref());
        }
        TokenProof(bytes)
    }
}

/// Reads the bearer token of `--announce-token-file`: the file's text without surrounding
/// whitespace; an empty or non-UTF-8 file is refused.
pub(crate) fn load_bearer(path: &Path) -> Result<String, ConfigError> {
    let bytes = read_secret_file(path, "announce_token_file")?;
    let text = String::from_utf8(bytes).map_err(|_| {
        ConfigError::new(
            "announce_token_file",
            format!("{} is not UTF-8 text", path.display()),
        )
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(ConfigError::new(
            "announce_token_file",
            format!("{} is empty", path.display()),
        ));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::new(
            "announce_token_file",
            format!(
                "{} holds characters a bearer token cannot carry (spaces, control or non-ASCII)",
                path.display()
            ),
        ));
    }
    Ok(token.to_owned())
}

/// Reads a secret file for `field`, refusing one over [`KEY_FILE_BYTES_MAX`] and warning
/// when its mode lets the group or others read it.
fn read_secret_file(path: &Path, field: &'static str) -> Result<Vec<u8>, ConfigError> {
    let fail = |e: std::io::Error| ConfigError::new(field, format!("{}: {e}", path.display()));
    let meta = std::fs::metadata(path).map_err(fail)?;
    if !meta.is_file() {
        return Err(ConfigError::new(
            field,
            format!("{} is not a regular file", path.display()),
        ));
    }
    if meta.len() > KEY_FILE_BYTES_MAX {
        return Err(ConfigError::new(
            field,
            format!(
                "{} is {} bytes, over the limit of {KEY_FILE_BYTES_MAX} bytes",
                path.display(),
                meta.len()
            ),
        ));
    }
    warn_if_shared(path, &meta, field);
    std::fs::read(path).map_err(fail)
}

#[cfg(unix)]
fn warn_if_shared(path: &Path, meta: &std::fs::Metadata, field: &'static str) {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        warn!(
            file = %path.display(),
            field,
            mode = format!("{mode:o}"),
            "secret file is readable by group or others; chmod 600 it"
        );
    }
}

#[cfg(not(unix))]
fn warn_if_shared(_path: &Path, _meta: &std::fs::Metadata, _field: &'static str) {}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{ED25519, KeyPair as _, UnparsedPublicKey};

    fn pem_key() -> Vec<u8> {
        let rng = ring::rand::SystemRandom::new();
        let doc = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let der = PrivatePkcs8KeyDer::from(doc.as_ref().to_vec());
        pem_encode("PRIVATE KEY", der.secret_pkcs8_der())
    }

    fn pem_encode(label: &str, der: &[u8]) -> Vec<u8> {
        use base64::Engine as _;
        let body = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = body
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            lines.join("\n")
        )
        .into_bytes()
    }

    /// Goal: a proof verifies with the public key for exactly its scope and token.
    /// Method: sign token 7 in scope "a"; verify it, then against token 8 and scope "b".
    #[test]
    fn proof_verifies_for_its_scope_and_token_only() {
        let signer = TokenSigner::from_pem(&pem_key(), "a").unwrap();
        let proof = signer.sign(7);
        let public = UnparsedPublicKey::new(&ED25519, signer.key.public_key().as_ref().to_vec());
        assert!(public.verify(&proof_message("a", 7), &proof.0).is_ok());
        assert!(public.verify(&proof_message("a", 8), &proof.0).is_err());
        assert!(public.verify(&proof_message("b", 7), &proof.0).is_err());
        assert_eq!(
            signer.sign(7),
            proof,
            "Ed25519 signatures are deterministic"
        );
    }

    /// Goal: anything but a PEM Ed25519 PKCS#8 key is refused with a reason, naming the
    /// file. Method: garbage, an empty file, a PEM of another label, a PEM of junk DER, an
    /// oversized file, a missing file.
    #[test]
    fn bad_key_files_are_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let cases: [(&str, Vec<u8>); 4] = [
            ("garbage", b"not a key".to_vec()),
            ("empty", Vec::new()),
            ("cert", pem_encode("CERTIFICATE", b"\x30\x03\x02\x01\x00")),
            ("junk", pem_encode("PRIVATE KEY", b"\x30\x03\x02\x01\x00")),
        ];
        for (name, bytes) in cases {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            let err = TokenSigner::load(&path, "s").unwrap_err();
            assert_eq!(err.field, "token_key");
            assert!(err.message.contains(name), "{err}");
        }
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'A'; KEY_FILE_BYTES_MAX as usize + 1]).unwrap();
        assert!(
            TokenSigner::load(&big, "s")
                .unwrap_err()
                .message
                .contains("over the limit")
        );
        let missing = dir.path().join("missing");
        assert!(TokenSigner::load(&missing, "s").is_err());
        let good = dir.path().join("token.key");
        std::fs::write(&good, pem_key()).unwrap();
        TokenSigner::load(&good, "s").unwrap();
    }

    /// Goal: the bearer file is trimmed, and empty or odd contents are refused.
    /// Method: a token with a newline, an empty file, one with an inner space.
    #[test]
    fn bearer_file_is_trimmed_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, "s3cret\n").unwrap();
        assert_eq!(load_bearer(&path).unwrap(), "s3cret");
        std::fs::write(&path, "\n").unwrap();
        assert!(load_bearer(&path).unwrap_err().message.contains("empty"));
        std::fs::write(&path, "a b").unwrap();
        assert_eq!(load_bearer(&path).unwrap_err().field, "announce_token_file");
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert!(load_bearer(&path).is_err());
    }
}
