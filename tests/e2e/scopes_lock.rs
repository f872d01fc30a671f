//! `palisade lock` end to end, as the issue's shell scenario: two `palisade lock billing`
//! commands contend through a real cluster and a real proxy; the first holder is paused
//! past its TTL; the second acquires with a higher token that the proxy already fences
//! when its command starts; the first command's write after it resumes is refused with
//! 409; and the first `palisade lock` stops its command and exits 75.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use palisade_cluster::{ClusterOptions, ClusterSpec, wait};
use palisade_tests::fixtures::first_announced_leader;
use palisade_tests::process::start_cluster;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// Generous bound for an election at 20 ms ticks on a loaded 2-core machine.
const ELECTION_TIMEOUT: Duration = Duration::from_secs(20);
/// The sessions' TTL.
const TTL_MS: u64 = 2_000;
/// Bound for anything the scenario waits for (a grant after the TTL, a write, an exit).
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// The command each `palisade lock` runs: says which token it holds, waits for the file
/// `$GO` to appear, writes `billing/$NAME` through the proxy with the lock's token (the
/// environment carries it), says how that went, and waits to be stopped.
const WORKER: &str = r#"echo "holding $PALISADE_TOKEN"
while [ ! -e "$GO" ]; do sleep 0.05; done
"$PALISADE_BIN" put --data x "billing/$NAME" >/dev/null 2>&1
echo "put-exit $?"
sleep 600"#;

/// One `palisade lock` process and the lines it prints (stdout and stderr).
struct Lock {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
    go: PathBuf,
}

impl Lock {
    fn start(dir: &Path, name: &str, nodes: &str, proxy: &str) -> Self {
        let bin = palisade_cluster::palisade_bin().unwrap();
        let go = dir.join(format!("go-{name}"));
        let mut child = Command::new(&bin)
            .args([
                "lock",
                "billing",
                "--node",
                nodes,
                "--ttl-ms",
                &TTL_MS.to_string(),
            ])
            .args(["--grace-ms", "1000", "--", "sh", "-c", WORKER])
            .env("PALISADE_BIN", &bin)
            .env("PALISADE_PROXY", proxy)
            .env("GO", &go)
            .env("NAME", name)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut out = BufReader::new(out).lines();
                while let Ok(Some(line)) = out.next_line().await {
                    let _ = tx.send(line);
                }
            });
        }
        Self {
            child,
            lines,
            seen: Vec::new(),
            go,
        }
    }

    /// The first line (from now on) starting with `prefix`, within [`STEP_TIMEOUT`].
    async fn line(&mut self, prefix: &str) -> String {
        let found = tokio::time::timeout(STEP_TIMEOUT, async {
            while let Some(line) = self.lines.recv().await {
                self.seen.push(line.clone());
                if line.starts_with(prefix) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            _ => panic!("no line starting with {prefix:?}; saw {:#?}", self.seen),
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id().unwrap()).unwrap())
    }

    /// The command's process (it leads its own process group).
    fn command_pid(&self) -> Pid {
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.pid())).unwrap();
        let pid = children
            .split_whitespace()
            .next()
            .expect("the lock has a running command");
        Pid::from_raw(pid.parse().unwrap())
    }
}

/// Goal: the issue's shell scenario, with real processes and signals.
/// Method: three nodes announcing to a proxy; `palisade lock billing` A holds and B
/// waits (TTL 2 s); SIGSTOP A and its command; B's command starts with a higher token,
/// and the proxy's fence for `billing` is that token at that moment; SIGCONT A's command
/// only and let it write: 409 (the put exits non-zero); SIGCONT A: it stops its command
/// and exits 75; B's write is admitted; SIGTERM to B ends its command, and B resigns.
#[tokio::test]
async fn two_locks_contend_and_the_paused_holder_is_fenced_out_and_stopped() {
    crate::use_tested_binary();
    let dir = tempfile::tempdir().unwrap();
    let spec = ClusterSpec {
        nodes: 3,
        node_flags: vec!["--tick-ms".into(), "20".into()],
        proxy_flags: vec!["--client-scopes".into()],
    };
    let cluster = start_cluster(dir.path(), &spec, &ClusterOptions::default());
    first_announced_leader(&cluster, ELECTION_TIMEOUT).await;
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| n.api_url("").trim_end_matches('/').to_owned())
        .collect();
    let nodes = nodes.join(",");
    let proxy = cluster.proxy.url("").trim_end_matches('/').to_owned();

    let mut a = Lock::start(dir.path(), "a", &nodes, &proxy);
    let token_a: u64 = a.line("holding ").await["holding ".len()..]
        .parse()
        .unwrap();
    assert_eq!(cluster.proxy_fence("billing").await, Some(token_a));
    let mut b = Lock::start(dir.path(), "b", &nodes, &proxy);

    // Pause A's whole worker: the lock (no more keepalives) and its command.
    let a_command = a.command_pid();
    kill(a.pid(), Signal::SIGSTOP).unwrap();
    killpg(a_command, Signal::SIGSTOP).unwrap();

    let token_b: u64 = b.line("holding ").await["holding ".len()..]
        .parse()
        .unwrap();
    let fence = cluster.proxy_fence("billing").await;
    assert!(
        token_b > token_a,
        "B's token is higher: {token_b} > {token_a}"
    );
    assert_eq!(
        fence,
        Some(token_b),
        "the proxy fenced B's token before B's command started"
    );

    // A's command wakes first and writes with its old token: refused.
    killpg(a_command, Signal::SIGCONT).unwrap();
    std::fs::write(&a.go, "").unwrap();
    let put = a.line("put-exit ").await;
    assert_ne!(put, "put-exit 0", "A's stale write was refused");
    // Then A's lock wakes, finds its session untrusted, and stops the command.
    kill(a.pid(), Signal::SIGCONT).unwrap();
    let status = tokio::time::timeout(STEP_TIMEOUT, a.child.wait())
        .await
        .expect("A's lock exits")
        .unwrap();
    assert_eq!(
        status.code(),
        Some(75),
        "A's lock exits with the lost status: {:#?}",
        a.seen
    );
    let a_gone = wait::poll(STEP_TIMEOUT, || async {
        kill(a_command, None).is_err().then_some(())
    })
    .await;
    assert!(a_gone.is_some(), "A's command was stopped");

    std::fs::write(&b.go, "").unwrap();
    assert_eq!(
        b.line("put-exit ").await,
        "put-exit 0",
        "B's write was admitted"
    );
    kill(b.pid(), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(STEP_TIMEOUT, b.child.wait())
        .await
        .expect("B's lock exits")
        .unwrap();
    assert!(
        status.code() != Some(75),
        "B was not lost: {status:?} {:#?}",
        b.seen
    );
    let freed = wait::poll(STEP_TIMEOUT, || async {
        let view = palisade_tests::client::send(
            http::Method::GET,
            &cluster.nodes[0].api_url("/v1/scopes/billing"),
            &[],
            "",
        )
        .await
        .json();
        view["session"].is_null().then_some(())
    })
    .await;
    assert!(freed.is_some(), "B resigned when its command ended");
}
