//! Trust material for tests: keys and certificates made by the `palisade` binary itself
//! (`palisade keys generate`, `palisade certs generate`), token proofs signed here with the
//! generated key (so tests can forge every wrong proof: another scope's, a lower token's,
//! another key's), admin bearer token files, and the `event` lines of a JSON log.
//!
//! Signing uses exactly the bytes of [`proof_message`], as the nodes do, so a proof made
//! here for the right (scope, token) is one the proxy must admit, and anything else is a
//! forgery it must refuse.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_cluster::Pki;
use palisade_protocol::process::EVENT_FIELD;
pub use palisade_protocol::proof::encode_proof;
use palisade_protocol::proof::proof_message;
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair as _};
use rustls_pki_types::PrivatePkcs8KeyDer;
use rustls_pki_types::pem::PemObject as _;

/// Runs `palisade ARGS` to completion and returns its stdout, or panics with its output.
pub fn run_palisade(args: &[&str]) -> String {
    let bin = palisade_cluster::palisade_bin().unwrap_or_else(|e| panic!("{e}"));
    let output = Command::new(&bin).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "palisade {args:?} exited {:?}\nstdout: {stdout}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The files `palisade keys generate --out DIR` writes.
#[derive(Debug, Clone)]
pub struct TokenKeys {
    /// `token.key`: the private signing key (PKCS#8 PEM), mode 0600.
    pub key: PathBuf,
    /// `token.pub`: the public key (`SubjectPublicKeyInfo` PEM), for `--token-pub`.
    pub public: PathBuf,
}

impl TokenKeys {
    /// Runs `palisade keys generate --out dir` (`dir` created if missing), checks the
    /// files and the key's mode.
    pub fn generate(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        run_palisade(&["keys", "generate", "--out", dir.to_str().unwrap()]);
        let keys = Self {
            key: dir.join("token.key"),
            public: dir.join("token.pub"),
        };
        let mode = std::fs::metadata(&keys.key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "token.key is readable by its owner only");
        assert!(keys.public.exists(), "token.pub was written");
        keys
    }

    /// A signer holding this private key.
    pub fn signer(&self) -> Signer {
        Signer::load(&self.key)
    }

    /// `token.key` as a string, for a flag.
    pub fn key_arg(&self) -> &str {
        self.key.to_str().unwrap()
    }

    /// `token.pub` as a string, for a flag.
    pub fn public_arg(&self) -> &str {
        self.public.to_str().unwrap()
    }
}

/// Makes token proofs with an Ed25519 key, as a node does.
pub struct Signer(Ed25519KeyPair);

impl Signer {
    /// Loads a `token.key` file (PEM "PRIVATE KEY", Ed25519 PKCS#8).
    pub fn load(path: &Path) -> Self {
        let der = PrivatePkcs8KeyDer::from_pem_file(path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der())
            .unwrap_or_else(|e| panic!("{} is not an Ed25519 key: {e}", path.display()));
        Self(pair)
    }

    /// A fresh key no proxy knows: its proofs are well-formed forgeries.
    pub fn stranger() -> Self {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        Self(Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap())
    }

    /// The raw signature over [`proof_message`]`(scope, token)`.
    pub fn sign(&self, scope: &str, token: u64) -> Vec<u8> {
        self.0.sign(&proof_message(scope, token)).as_ref().to_vec()
    }

    /// The proof of `token` in `scope`: the signature, base64url without padding.
    pub fn prove(&self, scope: &str, token: u64) -> String {
        encode_proof(&self.sign(scope, token))
    }

    /// The 32 raw bytes of the public key.
    pub fn public_key(&self) -> Vec<u8> {
        self.0.public_key().as_ref().to_vec()
    }
}

/// Runs `palisade certs generate --out dir --names NAMES --hosts 127.0.0.1,localhost`
/// (`dir` created if missing), checks every file is there, and returns the CA and its
/// certificates.
pub fn generate_certs(dir: &Path, names: &[&str]) -> Pki {
    std::fs::create_dir_all(dir).unwrap();
    run_palisade(&[
        "certs",
        "generate",
        "--out",
        dir.to_str().unwrap(),
        "--names",
        &names.join(","),
        "--hosts",
        "127.0.0.1,localhost",
    ]);
    let pki = Pki::at(dir);
    for file in ["ca.pem", "ca.key"] {
        assert!(dir.join(file).exists(), "{file} was written");
    }
    for name in names {
        assert!(pki.cert(name).exists(), "{name}.pem was written");
        assert!(pki.key(name).exists(), "{name}.key was written");
    }
    pki
}

/// The common name `palisade certs generate` gives its CA.
const GENERATED_CA_COMMON_NAME: &str = "palisade cluster CA";

/// Issues `NAME.pem`/`NAME.key` in `pki`'s directory, signed by the CA that `palisade
/// certs generate` made there, for a name the binary refuses to issue: one without a role
/// prefix, as an existing PKI might issue it. The certificate names `name`, `127.0.0.1`
/// and `localhost`. The CA is rebuilt from `ca.key` with the subject the binary gives it,
/// so its signature verifies under `ca.pem`; a handshake that fails with it means the
/// binary's CA subject changed.
pub fn issue_outside_the_binary(pki: &Pki, name: &str) {
    let ca_key =
        rcgen::KeyPair::from_pem(&std::fs::read_to_string(pki.dir.join("ca.key")).unwrap())
            .unwrap();
    let mut ca_params = rcgen::CertificateParams::default();
    ca_params.distinguished_name = rcgen::DistinguishedName::new();
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, GENERATED_CA_COMMON_NAME);
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![
        name.to_owned(),
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
    ])
    .unwrap();
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    std::fs::write(pki.cert(name), cert.pem()).unwrap();
    std::fs::write(pki.key(name), key.serialize_pem()).unwrap();
}

/// Writes a fresh admin bearer token to `dir/admin.token` (mode 0600) and returns the
/// file and the token.
pub fn admin_token_file(dir: &Path) -> (PathBuf, String) {
    let mut bytes = [0u8; 24];
    ring::rand::SecureRandom::fill(&SystemRandom::new(), &mut bytes).unwrap();
    let token = URL_SAFE_NO_PAD.encode(bytes);
    let path = dir.join("admin.token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    (path, token)
}

/// The JSON log lines (`--log-format json`) of `log` whose [`EVENT_FIELD`] is `event`,
/// as their `fields` objects.
pub fn log_events(log: &str, event: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| v["fields"][EVENT_FIELD].as_str() == Some(event))
        .map(|mut v| v["fields"].take())
        .collect()
}

#[cfg(test)]
mod tests {
    use palisade_protocol::proof::decode_proof;

    use super::*;

    /// Goal: a proof made here verifies with the public key for its exact scope and token
    /// only, and is unpadded base64url of a 64-byte signature.
    /// Method: sign, verify with ring's public-key API against the right and wrong
    /// messages.
    #[test]
    fn proofs_verify_for_their_scope_and_token_only() {
        let signer = Signer::stranger();
        let proof = signer.prove("default", 7);
        assert_eq!(proof.len(), 86, "64 bytes, unpadded base64url");
        assert!(!proof.contains('='));
        let sig = decode_proof(proof.as_bytes()).unwrap();
        let key =
            ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, signer.public_key());
        assert!(key.verify(&proof_message("default", 7), &sig).is_ok());
        assert!(key.verify(&proof_message("default", 8), &sig).is_err());
        assert!(key.verify(&proof_message("other", 7), &sig).is_err());
    }

    /// Goal: event lines are found by their `event` field and nothing else.
    /// Method: a log with a matching line, a non-matching one and prose.
    #[test]
    fn log_events_reads_the_event_field() {
        let log = format!(
            "{}\nnot json\n{}\n",
            serde_json::json!({"fields":{EVENT_FIELD:"fence-reset","reason":"r"}}),
            serde_json::json!({"fields":{EVENT_FIELD:"fence-raised"}}),
        );
        let found = log_events(&log, "fence-reset");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0]["reason"], "r");
    }
}
