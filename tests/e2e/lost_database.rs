//! A lost database is never a fresh one: a `proxy.redb` or `raft.redb` that existed and is
//! now empty stops the process with a clear error and the recovery steps, and a damaged
//! `raft.redb` is an error, not a panic. Real processes: each is started once so that its
//! database and the marker beside it exist, stopped, damaged on disk, and started again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use palisade_cluster::{free_port, wait};

/// Long enough for a process to start (or refuse to) on a busy machine.
const START: Duration = Duration::from_secs(20);

/// `palisade proxy` on free loopback ports, with its data in `dir`.
fn proxy(dir: &Path) -> Command {
    let mut cmd = Command::new(crate::use_tested_binary());
    cmd.arg("proxy")
        .args(["--listen", &format!("127.0.0.1:{}", free_port().unwrap())])
        .args([
            "--admin-listen",
            &format!("127.0.0.1:{}", free_port().unwrap()),
        ])
        .arg("--data-dir")
        .arg(dir);
    cmd
}

/// A one-node `palisade node` on free loopback ports, with its data in `dir`, and the
/// URL of its API.
fn node(dir: &Path) -> (Command, String) {
    let api = format!("127.0.0.1:{}", free_port().unwrap());
    let mut cmd = Command::new(crate::use_tested_binary());
    cmd.arg("node")
        .args(["--id", "1"])
        .args(["--peers", &format!("1=127.0.0.1:{}", free_port().unwrap())])
        .args(["--api", &api])
        .arg("--data-dir")
        .arg(dir);
    (cmd, format!("http://{api}"))
}

/// Starts `cmd`, waits until `db` and its marker exist (and, for a node, until it leads
/// with a token: its log then holds its first entries), then stops it with SIGTERM.
async fn create_then_stop(mut cmd: Command, db: &Path, node_api: Option<&str>) {
    // The marker's name is part of what the error tells an operator: `FILE.created`.
    let marker = PathBuf::from(format!("{}.created", db.display()));
    let mut child: Child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let made = wait::poll(START, || {
        std::future::ready((db.exists() && marker.exists()).then_some(()))
    })
    .await;
    let led = match node_api {
        Some(url) => {
            let api = palisade_client::NodeApi::new(url).unwrap();
            wait::poll(START, || async {
                api.leader().await.ok().and_then(|v| v.token)
            })
            .await
            .is_some()
        }
        None => true,
    };
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let _ = child.wait();
    assert!(led, "the node never led with a token");
    assert!(
        made.is_some(),
        "{} and its marker were never created",
        db.display()
    );
}

/// Starts `cmd` and waits for it to exit on its own; answers its exit code and stderr.
/// Stderr goes to a file, not a pipe: a pipe nobody reads while waiting could fill and
/// block the process (a panic's backtrace is long).
async fn refused(mut cmd: Command) -> (Option<i32>, String) {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::from(log.reopen().unwrap()))
        .spawn()
        .unwrap();
    let exited = wait::poll(START, || std::future::ready(child.try_wait().unwrap())).await;
    let stderr = std::fs::read_to_string(log.path()).unwrap_or_default();
    let Some(status) = exited else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the process did not stop within {START:?}: it runs on a lost database\n{stderr}");
    };
    (status.code(), stderr)
}

/// Goal: a proxy whose `proxy.redb` existed and was truncated to 0 bytes refuses to start
/// (exit 1) naming the file, the marker and what to do, and creates nothing; the same
/// for the file removed. Method: start, stop, truncate, start; remove, start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_with_an_emptied_database_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let db: PathBuf = dir.path().join("proxy.redb");
    create_then_stop(proxy(dir.path()), &db, None).await;

    std::fs::File::create(&db).unwrap();
    let (code, stderr) = refused(proxy(dir.path())).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("empty (0 bytes)") && stderr.contains("proxy.redb.created"),
        "{stderr}"
    );
    assert!(stderr.contains("refusing to start"), "{stderr}");
    assert_eq!(
        std::fs::metadata(&db).unwrap().len(),
        0,
        "nothing was created"
    );

    std::fs::remove_file(&db).unwrap();
    let (code, stderr) = refused(proxy(dir.path())).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("is missing"), "{stderr}");
    assert!(!db.exists(), "nothing was created");
}

/// Goal: a node whose `raft.redb` existed and was truncated to 0 bytes refuses to start,
/// and one whose `raft.redb` was zeroed in its second half stops with a clear error, never
/// a panic's exit code (101), and never starts from an older commit with a lower term
/// (redb falls back to its older commit slot when the newest is unreadable; the term
/// record beside the log catches that). Method: start a one-node cluster, stop it, damage, start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_with_an_emptied_or_damaged_log_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("raft.redb");
    let (cmd, api) = node(dir.path());
    create_then_stop(cmd, &db, Some(&api)).await;
    let bytes = std::fs::read(&db).unwrap();

    std::fs::File::create(&db).unwrap();
    let (code, stderr) = refused(node(dir.path()).0).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("empty (0 bytes)") && stderr.contains("raft.redb.created"),
        "{stderr}"
    );

    let mut zeroed = bytes.clone();
    let half = zeroed.len() / 2;
    zeroed[half..].fill(0);
    std::fs::write(&db, &zeroed).unwrap();
    let (code, stderr) = refused(node(dir.path()).0).await;
    assert_ne!(code, Some(101), "a panic's exit: {stderr}");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("damaged") || stderr.contains("corrupt") || stderr.contains("behind"),
        "{stderr}"
    );
}
