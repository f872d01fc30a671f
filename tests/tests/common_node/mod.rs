//! Helpers for tests that run real `palisade node` processes on 127.0.0.1.
//!
//! - [`palisade_bin`]: the `palisade` binary next to the test executable
//!   (`target/debug/palisade`), or `$PALISADE_BIN`; fails clearly when it is missing.
//! - [`free_port`]: a port the kernel just handed out (bound, then released).
//! - [`NodeProcess`]: one running node; on drop it is sent SIGCONT (in case a test left it
//!   stopped) and then killed and reaped.
//! - [`NodeCluster`]: N nodes with one peer list, restartable on their data directories; on
//!   a panic it prints the tail of every node's log.
//! - [`get_leader`]: `GET /v1/leader` over a plain socket with short timeouts (a stopped
//!   process accepts connections but never answers).
//! - [`wait_until`]: polls a condition every 20 ms until a deadline.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Poll period of [`wait_until`].
pub const POLL: Duration = Duration::from_millis(20);

/// The `palisade` binary under test.
pub fn palisade_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("PALISADE_BIN") {
        return PathBuf::from(path);
    }
    // target/debug/deps/<test> -> target/debug/palisade
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable has no grandparent directory");
    let bin = dir.join("palisade");
    assert!(
        bin.exists(),
        "the palisade binary is missing at {}; build it first with \
         `cargo build -p palisade-cli` (or set PALISADE_BIN)",
        bin.display()
    );
    bin
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// Polls `cond` every [`POLL`] until it returns `Some`, or panics naming `what` after
/// `within`.
pub fn wait_until<T>(within: Duration, what: &str, mut cond: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = cond() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
}

/// A node's answer to `GET /v1/leader`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct LeaderView {
    pub node_id: u64,
    pub scope: String,
    pub term: u64,
    pub leader_id: Option<u64>,
    pub role: String,
    pub token: Option<u64>,
    pub announced: bool,
}

/// One HTTP/1.1 request with `Connection: close`; returns status and body.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    s.set_write_timeout(Some(Duration::from_secs(1)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no header end in {raw:?}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {head:?}")))?;
    Ok((status, body.to_owned()))
}

/// `GET /v1/leader`, or `None` when the node does not answer in time.
pub fn get_leader(api: SocketAddr) -> Option<LeaderView> {
    let (status, body) = http(api, "GET", "/v1/leader", "").ok()?;
    if status != 200 {
        return None;
    }
    serde_json::from_str(&body).ok()
}

/// One running `palisade node`.
pub struct NodeProcess {
    pub id: u64,
    pub api: SocketAddr,
    child: Child,
}

impl NodeProcess {
    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits i32"))
    }

    pub fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).unwrap_or_else(|e| panic!("{signal} to node {}: {e}", self.id));
    }

    /// Whether the process has exited (and its status, reaped).
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        // A stopped process still dies of SIGKILL, but continue it first so nothing is
        // left half-alive if the kill fails for another reason.
        let _ = kill(self.pid(), Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// N nodes sharing one peer list, each with its own data directory and log file.
pub struct NodeCluster {
    pub dir: tempfile::TempDir,
    pub peers: String,
    pub apis: Vec<(u64, SocketAddr)>,
    pub nodes: Vec<Option<NodeProcess>>,
    pub extra: Vec<String>,
}

impl NodeCluster {
    /// Starts nodes `1..=n` with `extra` flags (e.g. `--tick-ms 20`).
    pub fn start(n: u64, extra: &[&str]) -> Self {
        let bin = palisade_bin();
        check_node_subcommand(&bin);
        let ids: Vec<u64> = (1..=n).collect();
        let peers = ids
            .iter()
            .map(|id| format!("{id}=127.0.0.1:{}", free_port()))
            .collect::<Vec<_>>()
            .join(",");
        let apis = ids
            .iter()
            .map(|&id| (id, SocketAddr::from(([127, 0, 0, 1], free_port()))))
            .collect();
        let mut cluster = NodeCluster {
            dir: tempfile::tempdir().expect("tempdir"),
            peers,
            apis,
            nodes: Vec::new(),
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        };
        for id in ids {
            let node = cluster.spawn(id);
            cluster.nodes.push(Some(node));
        }
        cluster
    }

    pub fn api(&self, id: u64) -> SocketAddr {
        self.apis
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, a)| *a)
            .expect("known node id")
    }

    pub fn ids(&self) -> Vec<u64> {
        self.apis.iter().map(|(id, _)| *id).collect()
    }

    pub fn log_path(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}.log"))
    }

    fn spawn(&self, id: u64) -> NodeProcess {
        let api = self.api(id);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(id))
            .expect("open node log");
        let child = Command::new(palisade_bin())
            .arg("node")
            .args(["--id", &id.to_string()])
            .args(["--peers", &self.peers])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("node-{id}")))
            .args(["--api", &api.to_string()])
            .args(&self.extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start palisade node {id}: {e}"));
        NodeProcess { id, api, child }
    }

    pub fn node(&mut self, id: u64) -> &mut NodeProcess {
        self.nodes[usize::try_from(id - 1).expect("id fits")]
            .as_mut()
            .unwrap_or_else(|| panic!("node {id} is not running"))
    }

    /// Kills node `id` (if running) and starts it again on the same data directory.
    pub fn restart(&mut self, id: u64) {
        let slot = usize::try_from(id - 1).expect("id fits");
        drop(self.nodes[slot].take());
        self.nodes[slot] = Some(self.spawn(id));
    }

    /// Takes node `id` out of the cluster's care (for tests that wait for its exit).
    pub fn take(&mut self, id: u64) -> NodeProcess {
        self.nodes[usize::try_from(id - 1).expect("id fits")]
            .take()
            .unwrap_or_else(|| panic!("node {id} is not running"))
    }

    /// Puts a process back (see [`NodeCluster::take`]) or starts the node anew.
    pub fn respawn(&mut self, id: u64) {
        let slot = usize::try_from(id - 1).expect("id fits");
        self.nodes[slot] = Some(self.spawn(id));
    }

    /// Views of the given nodes that answered.
    pub fn views(&self, ids: &[u64]) -> Vec<LeaderView> {
        ids.iter()
            .filter_map(|&id| get_leader(self.api(id)))
            .collect()
    }

    /// The established leader among `ids`, when exactly one of them holds a token and every
    /// other one of them follows it in the same term.
    pub fn settled_leader(&self, ids: &[u64]) -> Option<LeaderView> {
        let views = self.views(ids);
        if views.len() != ids.len() {
            return None;
        }
        let leaders: Vec<&LeaderView> = views.iter().filter(|v| v.token.is_some()).collect();
        let [leader] = leaders.as_slice() else {
            return None;
        };
        views
            .iter()
            .all(|v| {
                v.node_id == leader.node_id
                    || (v.term == leader.term
                        && v.leader_id == Some(leader.node_id)
                        && v.role == "follower")
            })
            .then(|| (*leader).clone())
    }
}

impl Drop for NodeCluster {
    fn drop(&mut self) {
        // Stop every process first (their drop continues and kills them).
        self.nodes.clear();
        if std::thread::panicking() {
            for (id, _) in &self.apis {
                let log = std::fs::read_to_string(self.log_path(*id)).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("---- node {id} log (last {} lines) ----", tail.len());
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// Fails with a clear message when the binary has no `node` subcommand yet.
fn check_node_subcommand(bin: &Path) {
    let out = Command::new(bin)
        .args(["node", "--help"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} has no working `node` subcommand (exit {:?}): {}",
        bin.display(),
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}
