//! The `palisade` client subcommands (`put`, `get`, `delete`, `fence`, `leader`) as a
//! user runs them: the binary of this build against a real `palisade proxy` started from
//! the same binary, checking stdout, stderr and exit codes; and `palisade lock` against a
//! scripted node (`cli/lock_cmd.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests may unwrap: a failed step panics with its cause.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use palisade_protocol::process::ProxyReady;

#[path = "cli/lock_cmd.rs"]
mod lock_cmd;
#[path = "cli/trust_cmds.rs"]
mod trust_cmds;
#[path = "cli/trust_tools.rs"]
mod trust_tools;

/// Longest the proxy may take to print its listening line.
const START_TIMEOUT: Duration = Duration::from_secs(30);

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// A `palisade proxy` child on free loopback ports; killed when dropped.
struct Proxy {
    child: Child,
    /// `http://ADDR` of the client listener.
    url: String,
    /// `http://ADDR` of the admin API.
    admin: String,
}

impl Proxy {
    fn start(dir: &Path) -> Self {
        Self::start_with(dir, &[])
    }

    /// Like `start`, with `extra` flags.
    fn start_with(dir: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args(["proxy", "--listen", "127.0.0.1:0", "--admin-listen"])
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("proxy.log")).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(ready) = ProxyReady::parse(&line) {
                    let _ = tx.send(ready);
                }
            }
        });
        let ready = rx.recv_timeout(START_TIMEOUT).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!(
                "proxy did not start; its log:\n{}",
                std::fs::read_to_string(dir.join("proxy.log")).unwrap_or_default()
            )
        });
        Self {
            child,
            url: format!("http://{}", ready.listen),
            admin: format!("http://{}", ready.admin),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `palisade ARGS` with the `PALISADE_*` variables of the test's environment
/// removed, plus `env`; stdin is empty.
fn palisade(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command.args(args).stdin(Stdio::null());
    for (key, _) in std::env::vars() {
        if key.starts_with("PALISADE_") {
            command.env_remove(key);
        }
    }
    command.envs(env.iter().copied());
    command.output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[track_caller]
fn assert_exit(output: &Output, code: i32) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        stdout(output),
        stderr(output)
    );
}

/// Goal: `put` stores a body with the token; `get` prints it back byte for byte;
/// `delete` removes it, after which `get` exits 1.
/// Method: run the three commands against a real proxy and check output and exit codes.
#[test]
fn put_get_delete_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(dir.path());
    let p = proxy.url.as_str();

    let put = palisade(
        &[
            "put",
            "charges/sub-1",
            "--data",
            "42 EUR",
            "--token",
            "3",
            "--proxy",
            p,
        ],
        &[],
    );
    assert_exit(&put, 0);
    assert_eq!(
        stdout(&put),
        "ok: PUT /charges/sub-1 with token 3 (200 OK)\n"
    );

    let get = palisade(&["get", "/charges/sub-1", "--proxy", p], &[]);
    assert_exit(&get, 0);
    assert_eq!(stdout(&get), "42 EUR");

    // A body from a file, and the proxy and token from the environment.
    let file = dir.path().join("body.bin");
    std::fs::write(&file, [0_u8, 159, 146, 150]).unwrap();
    let from_file = palisade(
        &["put", "blobs/1", "--file", file.to_str().unwrap()],
        &[("PALISADE_PROXY", p), ("PALISADE_TOKEN", "4")],
    );
    assert_exit(&from_file, 0);
    let got = palisade(&["get", "blobs/1"], &[("PALISADE_PROXY", p)]);
    assert_exit(&got, 0);
    assert_eq!(got.stdout, [0_u8, 159, 146, 150]);

    let deleted = palisade(
        &["delete", "charges/sub-1", "--token", "4", "--proxy", p],
        &[],
    );
    assert_exit(&deleted, 0);
    assert!(stdout(&deleted).starts_with("ok: DELETE /charges/sub-1 with token 4"));
    let gone = palisade(&["get", "charges/sub-1", "--proxy", p], &[]);
    assert_exit(&gone, 1);
    assert!(stderr(&gone).contains("404"), "{}", stderr(&gone));
}

/// Goal: a put with a token below the fence exits 1 and says so, with the numbers.
/// Method: put with token 5, then with 4.
#[test]
fn stale_put_exits_1_with_the_rejection() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(dir.path());
    let p = proxy.url.as_str();
    assert_exit(
        &palisade(
            &["put", "k", "--data", "new", "--token", "5", "--proxy", p],
            &[],
        ),
        0,
    );
    let stale = palisade(
        &["put", "k", "--data", "old", "--token", "3", "--proxy", p],
        &[],
    );
    assert_exit(&stale, 1);
    assert!(
        stderr(&stale).contains("rejected: stale fencing token 3 for scope default, current is 5"),
        "{}",
        stderr(&stale)
    );
    assert_eq!(
        stdout(&palisade(&["get", "k", "--proxy", p], &[])),
        "new",
        "the stale body was not stored"
    );
}

/// Goal: `fence` reads one scope, lists all, advances one, and reports an advance below
/// the fence as a rejection (exit 1). Method: run each form against a real proxy (with
/// client scopes on, for the scoped put).
#[test]
fn fence_reads_lists_and_advances() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start_with(dir.path(), &["--client-scopes"]);
    let a = proxy.admin.as_str();

    let unseen = palisade(&["fence", "billing", "--admin", a], &[]);
    assert_exit(&unseen, 0);
    assert_eq!(stdout(&unseen), "scope billing: fence at token 0\n");

    let advanced = palisade(&["fence", "billing", "--advance", "7", "--admin", a], &[]);
    assert_exit(&advanced, 0);
    assert_eq!(stdout(&advanced), "scope billing: fence advanced to 7\n");
    let again = palisade(
        &["fence", "billing", "--advance", "7"],
        &[("PALISADE_ADMIN", a)],
    );
    assert_exit(&again, 0);
    assert_eq!(stdout(&again), "scope billing: fence already at 7\n");

    let lower = palisade(&["fence", "billing", "--advance", "2", "--admin", a], &[]);
    assert_exit(&lower, 1);
    assert!(
        stderr(&lower).contains("rejected: stale fencing token 2 for scope billing, current is 7"),
        "{}",
        stderr(&lower)
    );

    let list = palisade(&["fence", "--admin", a], &[]);
    assert_exit(&list, 0);
    assert_eq!(stdout(&list), "scope billing: fence at token 7\n");

    // The fence holds against writes too.
    let stale = palisade(
        &[
            "put", "x", "--data", "y", "--token", "6", "--scope", "billing", "--proxy", &proxy.url,
        ],
        &[],
    );
    assert_exit(&stale, 1);
    assert!(
        stderr(&stale).contains("current is 7"),
        "{}",
        stderr(&stale)
    );
}

/// Goal: `--json` output parses, on success and on rejection.
/// Method: parse the stdout of put, get and fence with `--json`, and of a stale put, on
/// a proxy with client scopes on (the puts name a scope).
#[test]
fn json_output_parses() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start_with(dir.path(), &["--client-scopes"]);
    let p = proxy.url.as_str();
    let a = proxy.admin.as_str();
    let json = |output: &Output| -> serde_json::Value {
        serde_json::from_str(stdout(output).trim())
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(output)))
    };

    let put = palisade(
        &[
            "put", "k", "--data", "v", "--token", "2", "--scope", "jobs", "--proxy", p, "--json",
        ],
        &[],
    );
    assert_exit(&put, 0);
    let put = json(&put);
    assert_eq!(put["ok"], true);
    assert_eq!(put["status"], 200);
    assert_eq!(put["token"], 2);
    assert_eq!(put["scope"], "jobs");
    assert_eq!(put["path"], "/k");

    let get = palisade(&["get", "k", "--proxy", p, "--json"], &[]);
    assert_exit(&get, 0);
    let get = json(&get);
    assert_eq!(get["body"], "v");
    assert_eq!(get["token"], 2, "the writer's token, from the store");

    let fence = json(&palisade(&["fence", "jobs", "--admin", a, "--json"], &[]));
    assert_eq!(fence, serde_json::json!({"scope": "jobs", "token": 2}));
    let list = json(&palisade(&["fence", "--admin", a, "--json"], &[]));
    assert_eq!(list["fences"][0]["token"], 2);
    let advanced = json(&palisade(
        &["fence", "jobs", "--advance", "4", "--admin", a, "--json"],
        &[],
    ));
    assert_eq!(advanced["advanced"], true);

    let stale = palisade(
        &[
            "put", "k", "--data", "v", "--token", "3", "--scope", "jobs", "--proxy", p, "--json",
        ],
        &[],
    );
    assert_exit(&stale, 1);
    let stale = json(&stale);
    assert_eq!(stale["ok"], false);
    assert_eq!(stale["rejected"], true);
    assert_eq!(stale["presented"], 3);
    assert_eq!(stale["current"], 4);
    assert_eq!(stale["scope"], "jobs");
}

/// Goal: bad flags and bad values exit 2 with a message; no proxy is needed to tell.
/// Method: run commands with bad arguments and no proxy.
#[test]
fn bad_flags_exit_2() {
    // A valid `put`, to add one bad flag to.
    let put = ["put", "k", "--data", "x", "--token", "1"];
    let bad_proxy = [put.as_slice(), &["--proxy", "ftp://h:1"]].concat();
    let bad_scope = [put.as_slice(), &["--scope", "bad scope!"]].concat();
    assert_usage_errors(&[
        &["put", "k", "--data", "x"],                                // no token
        &["put", "k", "--data", "x", "--token", "-1"],               // negative token
        &["put", "k", "--data", "x", "--token", "abc"],              // not a number
        &["put", "k", "--data", "x", "--file", "f", "--token", "1"], // both bodies
        &bad_proxy,
        &bad_scope,
        &["put", "/", "--data", "x", "--token", "1"], // no key
        &["get", "k", "--no-such-flag"],
        &["fence", "bad scope!", "--admin", "http://127.0.0.1:1"],
        &["leader"], // no --node
        &["leader", "--node", "not a url"],
        &["frobnicate"],
    ]);
}

/// Runs `palisade ARGS` for each of `cases`, which are all usage errors: each must exit 2
/// and say why on stderr.
fn assert_usage_errors(cases: &[&[&str]]) {
    for args in cases {
        let output = palisade(args, &[]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "palisade {args:?}: stdout {} stderr {}",
            stdout(&output),
            stderr(&output)
        );
        assert!(!stderr(&output).is_empty(), "palisade {args:?} says why");
    }
}

/// Goal: runtime failures exit 1: a proxy or node that is not there.
/// Method: point the commands at a closed port.
#[test]
fn unreachable_services_exit_1() {
    // A port that was free a moment ago: connections are refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    for args in [
        vec!["get", "k", "--proxy", &dead],
        vec!["fence", "--admin", &dead],
        vec!["leader", "--node", &dead],
    ] {
        let output = palisade(&args, &[]);
        assert_exit(&output, 1);
        assert!(
            stderr(&output).contains("cannot reach"),
            "{args:?}: {}",
            stderr(&output)
        );
    }
}
