//! Real `palisade` processes: locating the binary, guards, and a proxy launcher.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Longest a process may take to report that it is listening.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The `palisade` binary of this build. Integration tests of another package cannot use
/// `CARGO_BIN_EXE_palisade`, so it is found next to the test executable
/// (`target/<profile>/deps/<test>` -> `target/<profile>/palisade`). `cargo test
/// --workspace` builds it because the CLI package has integration tests of its own.
pub fn palisade_bin() -> PathBuf {
    if let Ok(p) = std::env::var("PALISADE_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let bin = profile_dir.join("palisade");
    assert!(
        bin.exists(),
        "the palisade binary is missing at {}: run `cargo build -p palisade-cli` (or `cargo test --workspace`), or set PALISADE_BIN",
        bin.display()
    );
    bin
}

/// A child process that gets `SIGCONT` and `SIGKILL` when dropped, even when a test
/// panics, and whose stderr log is printed if the test failed.
pub struct ChildGuard {
    child: Option<Child>,
    /// What the process is, for messages.
    pub name: String,
    /// Its stderr, redirected to a file.
    pub log: PathBuf,
}

impl ChildGuard {
    /// Wraps a spawned child.
    pub fn new(child: Child, name: impl Into<String>, log: PathBuf) -> Self {
        Self {
            child: Some(child),
            name: name.into(),
            log,
        }
    }

    /// The process id.
    pub fn pid(&self) -> Pid {
        Pid::from_raw(
            i32::try_from(self.child.as_ref().expect("child").id()).expect("pid fits i32"),
        )
    }

    /// Sends a signal.
    pub fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).unwrap_or_else(|e| panic!("kill -{signal} {}: {e}", self.name));
    }

    /// Pauses the process (a GC pause, as the kernel sees it).
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// Resumes a paused process.
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// `kill -9`, and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id().cast_signed()), Signal::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits for the process to exit by itself, up to `timeout`; returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        let child = self.child.as_mut().expect("child");
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return status.code();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} did not exit within {timeout:?}",
                self.name
            );
            std::thread::sleep(crate::wait::POLL);
        }
    }

    /// The stderr log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("--- last log lines of {} ---", self.name);
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// Spawns `palisade <args>` with stderr to `log` and waits for a stdout line containing
/// `marker`; returns the guard and that line.
pub fn spawn_until_line(
    args: &[String],
    log: &Path,
    marker: &str,
    name: &str,
) -> (ChildGuard, String) {
    let stderr = std::fs::File::create(log).expect("create log file");
    let mut child = Command::new(palisade_bin())
        .args(args)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", palisade_bin().display()));
    let stdout = child.stdout.take().expect("stdout");
    let guard = ChildGuard::new(child, name, log.to_owned());
    let (tx, rx) = mpsc::channel();
    let marker_owned = marker.to_owned();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains(&marker_owned) {
                let _ = tx.send(line);
            }
        }
    });
    match rx.recv_timeout(START_TIMEOUT) {
        Ok(line) => (guard, line),
        Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => panic!(
            "{name} did not print {marker:?} within {START_TIMEOUT:?}; its log:\n{}",
            guard.log_text()
        ),
    }
}

/// A running `palisade proxy`.
pub struct ProxyProcess {
    /// The process.
    pub guard: ChildGuard,
    /// Client address.
    pub addr: SocketAddr,
    /// Admin address.
    pub admin: SocketAddr,
}

impl ProxyProcess {
    /// Starts a proxy on free loopback ports with its data in `dir`. `extra` are further
    /// flags (`--upstream URL`, `--config FILE`, ...).
    pub fn start(dir: &Path, extra: &[&str]) -> Self {
        static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let mut args: Vec<String> = [
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--data-dir",
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        args.push(dir.join("data").display().to_string());
        args.extend(extra.iter().map(ToString::to_string));
        let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = dir.join(format!("proxy-{n}.log"));
        let (guard, line) = spawn_until_line(&args, &log, "palisade proxy listening on", "proxy");
        // "palisade proxy listening on 127.0.0.1:PORT (admin 127.0.0.1:PORT)"
        let words: Vec<&str> = line.split_whitespace().collect();
        let addr = words[4].parse().expect("client address");
        let admin = words[6]
            .trim_end_matches(')')
            .parse()
            .expect("admin address");
        Self { guard, addr, admin }
    }

    /// `http://ADDR` + `path` on the client listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `http://ADMIN` + `path` on the admin listener.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }
}
