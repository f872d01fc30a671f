//! `palisade lock` as a user runs it, against a scripted node in this process (no
//! cluster): COMMAND gets the grant in its environment and its exit status is passed
//! on; unanswered keepalives stop COMMAND's process group (SIGTERM, then SIGKILL after
//! the grace period) and exit 75 no earlier than the session's trust allows; a SIGTERM
//! to `palisade lock` reaches COMMAND, after which the scope is resigned and the session
//! revoked.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::BIN;

/// Longest a `palisade lock` run may take to reach an expected state.
const RUN_TIMEOUT: Duration = Duration::from_secs(20);
/// How often a child's exit is polled.
const POLL: Duration = Duration::from_millis(20);
/// The session TTL the tests ask for: the contract's shortest.
const TTL_MS: u64 = 1_000;

/// Requests the scripted node received, by route.
#[derive(Default)]
struct Seen {
    keepalives: AtomicU64,
    resigns: AtomicU64,
    revokes: AtomicU64,
}

/// A node that leads, opens session `s-1`, grants every campaign with token 41, and
/// answers keepalives unless `hang_keepalives` (then it holds them unanswered, like a
/// paused leader). One thread per connection; `Connection: close` answers.
struct FakeNode {
    url: String,
    seen: Arc<Seen>,
}

impl FakeNode {
    fn start(hang_keepalives: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Seen::default());
        let counts = Arc::clone(&seen);
        let hang = Arc::new(AtomicBool::new(hang_keepalives));
        let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (seen, hang, held) =
                    (Arc::clone(&counts), Arc::clone(&hang), Arc::clone(&held));
                std::thread::spawn(move || serve(stream, &seen, &hang, &held));
            }
        });
        Self { url, seen }
    }
}

/// Answers one request on `stream`.
fn serve(mut stream: TcpStream, seen: &Seen, hang: &AtomicBool, held: &Mutex<Vec<TcpStream>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut length = 0_usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0_u8; length];
    let _ = reader.read_exact(&mut body);
    let mut words = request_line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let answer = match (method, segments.as_slice()) {
        ("GET", ["v1", "leader"]) => serde_json::json!({
            "node_id": 1, "scope": "default", "term": 2, "leader_id": 1, "role": "leader",
            "token": 2, "announced": true, "proof": null
        }),
        ("POST", ["v1", "sessions"]) => {
            let asked: serde_json::Value = serde_json::from_slice(&body).unwrap();
            serde_json::json!({"id": "s-1", "ttl_ms": asked["ttl_ms"]})
        }
        ("POST", ["v1", "sessions", id, "keepalive"]) => {
            seen.keepalives.fetch_add(1, Ordering::SeqCst);
            if hang.load(Ordering::SeqCst) {
                held.lock().unwrap().push(stream);
                return;
            }
            serde_json::json!({"id": id, "ttl_ms": TTL_MS})
        }
        ("POST", ["v1", "scopes", scope, "campaign"]) => {
            serde_json::json!({"scope": scope, "token": 41, "proof": null, "session": "s-1"})
        }
        ("POST", ["v1", "scopes", scope, "resign"]) => {
            seen.resigns.fetch_add(1, Ordering::SeqCst);
            serde_json::json!({"scope": scope, "session": "s-1", "released": true})
        }
        ("DELETE", ["v1", "sessions", id]) => {
            seen.revokes.fetch_add(1, Ordering::SeqCst);
            serde_json::json!({"id": id, "released": []})
        }
        _ => serde_json::json!({"unexpected": path}),
    };
    let body = answer.to_string();
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// `palisade lock jobs --node URL --ttl-ms 1000 EXTRA -- sh -c SCRIPT`, its stdout
/// lines on a channel.
fn lock(node: &FakeNode, extra: &[&str], script: &str) -> (Child, mpsc::Receiver<String>) {
    let mut command = Command::new(BIN);
    for (key, _) in std::env::vars() {
        if key.starts_with("PALISADE_") {
            command.env_remove(key);
        }
    }
    let mut child = command
        .args([
            "lock",
            "jobs",
            "--node",
            &node.url,
            "--ttl-ms",
            &TTL_MS.to_string(),
        ])
        .args(extra)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// Waits for `child` to exit within [`RUN_TIMEOUT`]; returns its status and stderr.
fn wait_exit(child: &mut Child) -> (ExitStatus, String) {
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("palisade lock did not exit within {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(POLL);
    };
    let mut stderr = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    (status, stderr)
}

/// The next stdout line, within [`RUN_TIMEOUT`].
fn line(lines: &mpsc::Receiver<String>) -> String {
    lines
        .recv_timeout(RUN_TIMEOUT)
        .expect("a line from the command")
}

/// Goal: COMMAND runs with the scope, the token and an empty proof in its environment,
/// its exit status is `lock`'s, and `lock` resigns and revokes after it.
/// Method: a command that prints the variables and exits 3.
#[test]
fn lock_runs_the_command_with_the_grant_and_passes_its_status_on() {
    let node = FakeNode::start(false);
    let (mut child, lines) = lock(
        &node,
        &[],
        r#"echo "$PALISADE_SCOPE $PALISADE_TOKEN [$PALISADE_PROOF] [${PALISADE_TOKEN_PROOF-unset}]"; exit 3"#,
    );
    assert_eq!(line(&lines), "jobs 41 [] [unset]");
    let (status, stderr) = wait_exit(&mut child);
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("acquired with token 41"), "{stderr}");
    assert_eq!(node.seen.resigns.load(Ordering::SeqCst), 1, "{stderr}");
    assert_eq!(node.seen.revokes.load(Ordering::SeqCst), 1, "{stderr}");
}

/// Goal: when keepalives go unanswered, COMMAND's whole process group is stopped and
/// `lock` exits 75, not before the session's trust (TTL less 1%) ran out; a command
/// that ignores SIGTERM gets SIGKILL after the grace period, its children too.
/// Method: a scripted node that never answers keepalives; a command that ignores
/// SIGTERM, prints its pid and loops on `sleep` children; measure the time to exit and
/// check that the command's process is gone.
#[test]
fn unanswered_keepalives_stop_the_command_and_exit_75() {
    let node = FakeNode::start(true);
    let started = Instant::now();
    let (mut child, lines) = lock(
        &node,
        &["--grace-ms", "300"],
        r#"trap "" TERM; echo $$; while :; do sleep 0.05; done"#,
    );
    let pid: i32 = line(&lines).parse().unwrap();
    let (status, stderr) = wait_exit(&mut child);
    let took = started.elapsed();
    assert_eq!(status.code(), Some(75), "{stderr}");
    assert!(
        took >= Duration::from_millis(TTL_MS * 99 / 100),
        "lost after {took:?}, before the trust could have run out"
    );
    assert!(
        stderr.contains("lost because no keepalive answered"),
        "{stderr}"
    );
    assert!(stderr.contains("SIGKILL"), "{stderr}");
    assert!(node.seen.keepalives.load(Ordering::SeqCst) >= 1);
    assert_eq!(
        kill(Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH),
        "the command still runs"
    );
}

/// Goal: SIGTERM to `palisade lock` reaches COMMAND; once it ends, `lock` exits with its
/// status after resigning the scope and revoking the session.
/// Method: a command that exits 7 on SIGTERM; signal `lock` once the command runs.
#[test]
fn a_signal_to_lock_reaches_the_command_then_lock_cleans_up() {
    let node = FakeNode::start(false);
    let (mut child, lines) = lock(
        &node,
        &[],
        r#"trap "echo term; exit 7" TERM; echo started; while :; do sleep 0.05; done"#,
    );
    assert_eq!(line(&lines), "started");
    kill(
        Pid::from_raw(i32::try_from(child.id()).unwrap()),
        Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(line(&lines), "term");
    let (status, stderr) = wait_exit(&mut child);
    assert_eq!(status.code(), Some(7), "{stderr}");
    assert!(stderr.contains("passing it to the command"), "{stderr}");
    assert_eq!(node.seen.resigns.load(Ordering::SeqCst), 1, "{stderr}");
    assert_eq!(node.seen.revokes.load(Ordering::SeqCst), 1, "{stderr}");
}
