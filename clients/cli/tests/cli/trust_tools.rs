//! `palisade keys generate` and `palisade certs generate`, run as a user runs them: the
//! files, their modes, and that what they hold works: the public key verifies what the
//! private key signs, and the certificates chain to the CA with the names asked for, as
//! server and as client certificates (checked with rustls's own verifiers).

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;

use palisade_protocol::proof::proof_message;
use ring::signature::{ED25519, Ed25519KeyPair, UnparsedPublicKey};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{
    CertificateDer, PrivatePkcs8KeyDer, ServerName, SubjectPublicKeyInfoDer, UnixTime,
};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;

use super::{assert_exit, palisade, stderr};

/// The DER prefix of an Ed25519 `SubjectPublicKeyInfo`, as fixed by the key format.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn keys_generate(dir: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["keys", "generate", "--out", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    palisade(&args, &[])
}

fn certs_generate(dir: &Path, names: &str, hosts: Option<&str>) -> std::process::Output {
    let mut args = vec![
        "certs",
        "generate",
        "--out",
        dir.to_str().unwrap(),
        "--names",
        names,
    ];
    if let Some(hosts) = hosts {
        args.extend(["--hosts", hosts]);
    }
    palisade(&args, &[])
}

/// The raw 32 public key bytes of a `token.pub`, checked against the fixed format.
fn public_key(path: &Path) -> Vec<u8> {
    let spki = SubjectPublicKeyInfoDer::from_pem_file(path).unwrap();
    let der: &[u8] = spki.as_ref();
    assert_eq!(der.len(), 44, "an Ed25519 SPKI is 44 bytes");
    assert_eq!(der[..12], SPKI_PREFIX);
    der[12..].to_vec()
}

/// Goal: `keys generate` writes token.key (0600) and token.pub, and a proof signed with
/// the key (as a node signs) verifies with the public key for its scope and token only.
/// Method: generate into a fresh (nested, missing) directory; load both files as the
/// node and proxy formats say; sign and verify with ring.
#[test]
fn keys_generate_writes_a_pair_that_signs_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("a/b");
    let output = keys_generate(&out, &[]);
    assert_exit(&output, 0);
    let key = out.join("token.key");
    let public = out.join("token.pub");
    assert_eq!(mode(&key), 0o600, "the private key is its owner's only");
    assert_eq!(mode(&public), 0o644);
    let pkcs8 = PrivatePkcs8KeyDer::from_pem_file(&key).unwrap();
    let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(pkcs8.secret_pkcs8_der()).unwrap();
    let signature = pair.sign(&proof_message("default", 7));
    let verifier = UnparsedPublicKey::new(&ED25519, public_key(&public));
    assert!(
        verifier
            .verify(&proof_message("default", 7), signature.as_ref())
            .is_ok()
    );
    assert!(
        verifier
            .verify(&proof_message("default", 8), signature.as_ref())
            .is_err()
    );
    assert!(
        verifier
            .verify(&proof_message("other", 7), signature.as_ref())
            .is_err()
    );
}

/// Goal: `keys generate` never overwrites a key by accident: without --force it exits 2
/// and leaves both files as they were; with --force it writes a new pair, 0600 again,
/// and replaces a symlink planted at token.key instead of writing through it.
/// Method: generate twice, then plant a symlink to a victim file and force.
#[test]
fn keys_generate_refuses_to_overwrite_without_force() {
    let dir = tempfile::tempdir().unwrap();
    assert_exit(&keys_generate(dir.path(), &[]), 0);
    let before = std::fs::read(dir.path().join("token.key")).unwrap();
    let again = keys_generate(dir.path(), &[]);
    assert_exit(&again, 2);
    assert!(stderr(&again).contains("--force"), "{}", stderr(&again));
    assert_eq!(std::fs::read(dir.path().join("token.key")).unwrap(), before);

    let victim = dir.path().join("victim");
    std::fs::write(&victim, "untouched").unwrap();
    std::fs::remove_file(dir.path().join("token.key")).unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join("token.key")).unwrap();
    assert_exit(&keys_generate(dir.path(), &["--force"]), 0);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
    let after = std::fs::read(dir.path().join("token.key")).unwrap();
    assert_ne!(after, before, "a new key");
    assert_eq!(mode(&dir.path().join("token.key")), 0o600);
}

/// Goal: --out that is a file, not a directory, is a usage error.
/// Method: point --out at a regular file.
#[test]
fn keys_generate_into_a_file_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, "x").unwrap();
    assert_exit(&keys_generate(&file, &[]), 2);
}

fn verifiers(ca: &Path) -> (Arc<WebPkiServerVerifier>, Arc<dyn ClientCertVerifier>) {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let roots = Arc::new(roots);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .unwrap();
    let client = WebPkiClientVerifier::builder_with_provider(roots, provider)
        .build()
        .unwrap();
    (server, client)
}

fn leaf(dir: &Path, name: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(dir.join(format!("{name}.pem"))).unwrap()
}

/// Goal: `certs generate` writes a CA and a certificate per name (keys 0600), each of
/// which chains to the CA, names itself and every --hosts entry (IP addresses as IP
/// SANs), not another name, and is accepted both as a server and as a client
/// certificate; a certificate from another run's CA is refused.
/// Method: generate two sets; check with rustls's webpki verifiers.
#[test]
fn certs_generate_writes_leaves_that_chain_to_the_ca_with_their_names() {
    let dir = tempfile::tempdir().unwrap();
    let output = certs_generate(
        dir.path(),
        "node-1,node-2,proxy-a,writer-app",
        Some("127.0.0.1,localhost,::1"),
    );
    assert_exit(&output, 0);
    assert_eq!(mode(&dir.path().join("ca.key")), 0o600);
    assert_eq!(mode(&dir.path().join("ca.pem")), 0o644);
    for name in ["node-1", "node-2", "proxy-a", "writer-app"] {
        assert_eq!(mode(&dir.path().join(format!("{name}.key"))), 0o600);
        // The key is one rustls loads.
        let key =
            rustls::pki_types::PrivateKeyDer::from_pem_file(dir.path().join(format!("{name}.key")))
                .unwrap();
        assert!(
            rustls::crypto::ring::sign::any_supported_type(&key).is_ok(),
            "{name}.key is usable"
        );
    }
    let (server, client) = verifiers(&dir.path().join("ca.pem"));
    let now = UnixTime::now();
    let node1 = leaf(dir.path(), "node-1");
    for host in ["node-1", "localhost", "127.0.0.1", "::1"] {
        let name = ServerName::try_from(host).unwrap();
        server
            .verify_server_cert(&node1, &[], &name, &[], now)
            .unwrap_or_else(|e| panic!("node-1.pem for {host}: {e}"));
    }
    for host in ["node-2", "proxy-a", "10.0.0.1"] {
        let name = ServerName::try_from(host).unwrap();
        assert!(
            server
                .verify_server_cert(&node1, &[], &name, &[], now)
                .is_err(),
            "node-1.pem must not pass as {host}"
        );
    }
    for name in ["node-2", "writer-app"] {
        client
            .verify_client_cert(&leaf(dir.path(), name), &[], now)
            .unwrap_or_else(|e| panic!("{name}.pem as a client certificate: {e}"));
    }

    let other = tempfile::tempdir().unwrap();
    assert_exit(&certs_generate(other.path(), "node-1", None), 0);
    let stranger = leaf(other.path(), "node-1");
    assert!(client.verify_client_cert(&stranger, &[], now).is_err());
    let name = ServerName::try_from("node-1").unwrap();
    assert!(
        server
            .verify_server_cert(&stranger, &[], &name, &[], now)
            .is_err()
    );
}

/// Goal: bad names and hosts exit 2 with a message naming the flag, and write nothing;
/// an existing file is not overwritten without --force.
/// Method: odd characters, empty, too long, duplicated, the CA's own name, names without
/// a role prefix, a bad host, a host carrying a role prefix.
#[test]
fn certs_generate_refuses_bad_names() {
    let dir = tempfile::tempdir().unwrap();
    let long = "a".repeat(65);
    let cases: &[(&str, Option<&str>, &str)] = &[
        ("node_1", None, "--names"),
        ("node-1,,node-2", None, "--names"),
        (&long, None, "--names"),
        ("node-1,node-1", None, "twice"),
        ("ca", None, "--names"),
        ("client", None, "carries no role"),
        ("node-1,proxy", None, "carries no role"),
        ("node-1", Some("operator-box"), "--hosts"),
        ("a/../../etc", None, "--names"),
        ("node-1", Some("bad host!"), "--hosts"),
        ("node-1", Some("ex\u{e4}mple.com"), "--hosts"),
    ];
    for (names, hosts, says) in cases {
        let output = certs_generate(dir.path(), names, *hosts);
        assert_exit(&output, 2);
        assert!(
            stderr(&output).contains(says),
            "{names:?} {hosts:?}: {}",
            stderr(&output)
        );
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing was written"
    );
    assert_exit(&certs_generate(dir.path(), "node-1", None), 0);
    let before = std::fs::read(dir.path().join("ca.pem")).unwrap();
    let again = certs_generate(dir.path(), "node-2", None);
    assert_exit(&again, 2);
    assert!(stderr(&again).contains("ca.pem"), "{}", stderr(&again));
    assert_eq!(std::fs::read(dir.path().join("ca.pem")).unwrap(), before);
    assert!(!dir.path().join("node-2.pem").exists());
}
