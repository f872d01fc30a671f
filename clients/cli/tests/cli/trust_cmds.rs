//! The client commands against a secure proxy (`--token-pub`, `--admin-token-file`):
//! `put --proof`, `put --node` (the token, proof and scope of a node's leader view),
//! `fence --advance --proof`, `fence --reset N --reason TEXT` with the admin token, and
//! the usage errors of the new flags.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::Path;

use palisade_protocol::proof::{encode_proof, proof_message};
use ring::signature::Ed25519KeyPair;
use rustls::pki_types::PrivatePkcs8KeyDer;
use rustls::pki_types::pem::PemObject as _;

use super::{Proxy, assert_exit, assert_usage_errors, palisade, stderr, stdout};

const ADMIN_TOKEN: &str = "cli-test-admin-token-0123456789";

/// Signs proofs with the `token.key` that `palisade keys generate` wrote.
fn signer(dir: &Path) -> impl Fn(&str, u64) -> String {
    let der = PrivatePkcs8KeyDer::from_pem_file(dir.join("token.key")).unwrap();
    let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der()).unwrap();
    move |scope, token| encode_proof(pair.sign(&proof_message(scope, token)).as_ref())
}

/// A proxy checking proofs with a fresh key and requiring the admin token; returns it,
/// the signer and the admin token file.
fn secure_proxy(dir: &Path) -> (Proxy, impl Fn(&str, u64) -> String, String) {
    assert_exit(
        &palisade(&["keys", "generate", "--out", dir.to_str().unwrap()], &[]),
        0,
    );
    let token_file = dir.join("admin.token");
    std::fs::write(&token_file, format!("{ADMIN_TOKEN}\n")).unwrap();
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let token_file = token_file.to_str().unwrap().to_owned();
    let public = dir.join("token.pub");
    let proxy = Proxy::start_with(
        dir,
        &[
            "--token-pub",
            public.to_str().unwrap(),
            "--admin-token-file",
            &token_file,
            // A node's scope reaches the proxy as Fencing-Scope (`put --node`).
            "--client-scopes",
        ],
    );
    (proxy, signer(dir), token_file)
}

/// A one-shot node API: answers every request with `view` (JSON), on a thread.
fn fake_node(view: serde_json::Value) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let body = view.to_string();
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

fn fence_of(proxy: &Proxy, scope: &str, token_file: &str) -> String {
    let output = palisade(
        &[
            "fence",
            scope,
            "--admin",
            &proxy.admin,
            "--admin-token-file",
            token_file,
        ],
        &[],
    );
    assert_exit(&output, 0);
    stdout(&output)
}

/// Goal: `put` without a proof is refused by a proof-checking proxy (exit 1, 401), with
/// `--proof` it is admitted, with `--node` the node's token, proof and scope are used;
/// the fence moves only for the admitted writes.
/// Method: a real secure proxy; proofs signed with the generated key; a fake node.
#[test]
fn put_sends_the_proof_given_or_the_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let (proxy, prove, token_file) = secure_proxy(dir.path());
    let bare = palisade(
        &[
            "put", "k", "--data", "x", "--token", "5", "--proxy", &proxy.url,
        ],
        &[],
    );
    assert_exit(&bare, 1);
    assert!(stderr(&bare).contains("401"), "{}", stderr(&bare));
    assert!(fence_of(&proxy, "default", &token_file).contains("token 0"));

    let proof = prove("default", 5);
    let proved = palisade(
        &[
            "put", "k", "--data", "x", "--token", "5", "--proof", &proof, "--proxy", &proxy.url,
        ],
        &[],
    );
    assert_exit(&proved, 0);
    assert!(fence_of(&proxy, "default", &token_file).contains("token 5"));

    let node = fake_node(serde_json::json!({
        "node_id": 2, "scope": "jobs", "term": 9, "leader_id": 2, "role": "leader",
        "token": 9, "announced": true, "proof": prove("jobs", 9),
    }));
    let from_node = palisade(
        &[
            "put", "k", "--data", "y", "--node", &node, "--proxy", &proxy.url,
        ],
        &[],
    );
    assert_exit(&from_node, 0);
    assert!(
        stdout(&from_node).contains("token 9"),
        "{}",
        stdout(&from_node)
    );
    assert!(fence_of(&proxy, "jobs", &token_file).contains("token 9"));

    let wrong_scope = palisade(
        &[
            "put", "k", "--data", "y", "--node", &node, "--scope", "other", "--proxy", &proxy.url,
        ],
        &[],
    );
    assert_exit(&wrong_scope, 2);

    let follower = fake_node(serde_json::json!({
        "node_id": 3, "scope": "jobs", "term": 9, "leader_id": 2, "role": "follower",
        "token": null, "announced": false, "proof": null,
    }));
    let refused = palisade(
        &[
            "put", "k", "--data", "z", "--node", &follower, "--proxy", &proxy.url,
        ],
        &[],
    );
    assert_exit(&refused, 1);
    assert!(
        stderr(&refused).contains("not the established leader"),
        "{}",
        stderr(&refused)
    );
}

/// Goal: `fence --advance` needs a proof or the admin token on a secure proxy, and
/// `fence --reset N --reason TEXT` with the admin token lowers the fence and says from
/// what to what; without the token file it is a usage error naming the flag.
/// Method: a real secure proxy; each command with and without credentials.
#[test]
fn fence_advance_and_reset_use_the_admin_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let (proxy, prove, token_file) = secure_proxy(dir.path());
    let admin = proxy.admin.as_str();
    let anonymous = palisade(&["fence", "--advance", "7", "--admin", admin], &[]);
    assert_exit(&anonymous, 1);
    assert!(stderr(&anonymous).contains("401"), "{}", stderr(&anonymous));

    let proof = prove("default", 7);
    let with_proof = palisade(
        &[
            "fence",
            "--advance",
            "7",
            "--proof",
            &proof,
            "--admin",
            admin,
        ],
        &[],
    );
    assert_exit(&with_proof, 0);
    assert!(fence_of(&proxy, "default", &token_file).contains("token 7"));

    let no_token = palisade(
        &[
            "fence", "--reset", "2", "--reason", "test", "--admin", admin,
        ],
        &[],
    );
    assert_exit(&no_token, 2);
    assert!(
        stderr(&no_token).contains("--admin-token-file"),
        "{}",
        stderr(&no_token)
    );

    let reset = palisade(
        &[
            "fence",
            "--reset",
            "2",
            "--reason",
            "forged raise",
            "--admin",
            admin,
        ],
        &[("PALISADE_ADMIN_TOKEN_FILE", &token_file)],
    );
    assert_exit(&reset, 0);
    assert!(
        stdout(&reset).contains("reset from 7 to 2"),
        "{}",
        stdout(&reset)
    );
    assert!(fence_of(&proxy, "default", &token_file).contains("token 2"));
}

/// Goal: the new flags' misuse exits 2 before anything is sent.
/// Method: contradictory or incomplete combinations, no server.
#[test]
fn trust_flags_misuse_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.token");
    std::fs::write(&empty, "\n").unwrap();
    let empty = empty.to_str().unwrap();
    let dead = "http://127.0.0.1:1";
    let cases: &[&[&str]] = &[
        &["put", "k", "--data", "x"],
        &["put", "k", "--data", "x", "--token", "1", "--node", dead],
        &["put", "k", "--data", "x", "--proof", "abc", "--node", dead],
        &["put", "k", "--data", "x", "--proof", "abc"],
        &["fence", "--reset", "1", "--admin", dead],
        &["fence", "--reason", "why", "--admin", dead],
        &["fence", "--reset", "1", "--advance", "2", "--reason", "r"],
        &[
            "fence",
            "--reset",
            "1",
            "--reason",
            "r",
            "--admin-token-file",
            empty,
        ],
        &[
            "fence",
            "--reset",
            "1",
            "--reason",
            "",
            "--admin-token-file",
            "/nonexistent",
        ],
        &["leader", "--node", dead, "--cert", "/nonexistent"],
        &["leader", "--node", dead, "--ca", "/nonexistent"],
    ];
    assert_usage_errors(cases);
}
