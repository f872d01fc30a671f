//! Child processes: locating the binary, guards, and waiting for a ready line.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError, RwLock, mpsc};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use palisade_protocol::process::{FAILPOINT_STOP_ENV, FailpointStop};

use crate::{ClusterError, Result};

/// Longest a child may take to report that it is ready.
pub const START_TIMEOUT_MS: u64 = 30_000;
/// Log lines shown when a child fails.
const LOG_TAIL_LINES: usize = 40;

/// The environment variable naming the `palisade` binary to run.
pub const PALISADE_BIN_ENV: &str = "PALISADE_BIN";

/// The binary set by [`set_palisade_bin`], which wins over everything else.
static EXPLICIT_BIN: RwLock<Option<PathBuf>> = RwLock::new(None);

/// Runs `path` as the `palisade` binary from now on, in this whole process. Tests of the
/// binary's own package pass `env!("CARGO_BIN_EXE_palisade")`: cargo builds that binary
/// for them with the tests' features, so it is never stale and has the failpoints the
/// tests need.
pub fn set_palisade_bin(path: impl Into<PathBuf>) {
    *EXPLICIT_BIN.write().unwrap_or_else(PoisonError::into_inner) = Some(path.into());
}

/// The `palisade` binary to run: the path given to [`set_palisade_bin`] (the demo and
/// `palisade bench failover` give their own executable); else [`PALISADE_BIN_ENV`] if
/// set. Nothing is guessed: a binary found next to a test executable may be stale or
/// built without the features the tests need.
pub fn palisade_bin() -> Result<PathBuf> {
    let explicit = EXPLICIT_BIN
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let chosen = explicit
        .or_else(|| std::env::var_os(PALISADE_BIN_ENV).map(PathBuf::from))
        .ok_or(ClusterError::NoBinary)?;
    if chosen.is_file() {
        Ok(chosen)
    } else {
        Err(ClusterError::MissingBinary(chosen))
    }
}

/// Checks that the `palisade` binary has the failpoints compiled in (the `failpoints`
/// feature, which `cargo test --workspace` turns on): such a binary refuses an unknown
/// name in [`FAILPOINT_STOP_ENV`] with exit 2 before doing anything, while one without
/// ignores the variable. Probed with `palisade fence` against a closed port.
pub fn require_failpoints() -> Result<()> {
    let bin = palisade_bin()?;
    let out = Command::new(&bin)
        .args(["fence", "--admin", "http://127.0.0.1:1"])
        .env(FAILPOINT_STOP_ENV, "no-such-failpoint")
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ClusterError::Spawn {
            what: format!("{} (failpoint probe)", bin.display()),
            source,
        })?;
    if out.status.code() == Some(2)
        && String::from_utf8_lossy(&out.stderr).contains("no-such-failpoint")
    {
        Ok(())
    } else {
        Err(ClusterError::NoFailpoints(bin))
    }
}

/// A child process that gets `SIGKILL` when dropped, so a child (paused or not) never
/// outlives its owner, even when a test panics.
pub struct ChildGuard {
    child: Option<Child>,
    pid: Pid,
    /// What the process is, for messages.
    pub name: String,
    /// Its stderr, redirected to a file.
    pub log: PathBuf,
}

impl ChildGuard {
    /// Wraps a spawned child.
    pub fn new(child: Child, name: impl Into<String>, log: PathBuf) -> Self {
        let pid = Pid::from_raw(child.id().cast_signed());
        Self {
            child: Some(child),
            pid,
            name: name.into(),
            log,
        }
    }

    /// The process id.
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Whether it has not been killed or reaped yet.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends a signal.
    pub fn signal(&self, signal: Signal) -> Result<()> {
        kill(self.pid, signal).map_err(|source| ClusterError::Signal {
            what: self.name.clone(),
            signal: signal.to_string(),
            source,
        })
    }

    /// Pauses the process with `SIGSTOP`: a GC pause, as the kernel sees it.
    pub fn pause(&self) -> Result<()> {
        self.signal(Signal::SIGSTOP)
    }

    /// Resumes a paused process with `SIGCONT`.
    pub fn resume(&self) -> Result<()> {
        self.signal(Signal::SIGCONT)
    }

    /// Whether the kernel reports the process stopped (`T` in `/proc/PID/stat`): paused
    /// by [`pause`](Self::pause), or stopped by itself at a failpoint.
    pub fn is_stopped(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|stat| {
                // `PID (COMM) STATE ...`: COMM may hold spaces, so split after the last ')'.
                let (_, rest) = stat.rsplit_once(')')?;
                rest.split_whitespace().next().map(|s| s == "T" || s == "t")
            })
            .unwrap_or(false)
    }

    /// `kill -9`, and reap it. Does nothing if it is already gone. A stopped process dies
    /// where it stands: `SIGKILL` needs no `SIGCONT`, and one sent first would let it run
    /// on for a moment (finish a reply it was stopped before, say).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits up to `timeout` for the process to exit by itself; returns its exit code
    /// (`None` when killed by a signal), or `Err` if it is still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<i32>> {
        let deadline = Instant::now() + timeout;
        let Some(child) = self.child.as_mut() else {
            return Ok(None);
        };
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    self.child = None;
                    return Ok(status.code());
                }
                Ok(None) if Instant::now() < deadline => std::thread::sleep(crate::wait::POLL),
                Ok(None) => {
                    return Err(ClusterError::NotReady {
                        what: format!("{} to exit", self.name),
                        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                        log_tail: self.log_tail(),
                    });
                }
                Err(source) => {
                    return Err(ClusterError::Io {
                        what: format!("wait for {}", self.name),
                        source,
                    });
                }
            }
        }
    }

    /// The stderr log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of the stderr log.
    pub fn log_tail(&self) -> String {
        let log = self.log_text();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "--- last log lines of {} ({}) ---\n{}",
                self.name,
                self.log.display(),
                self.log_tail()
            );
        }
    }
}

/// How to start a `palisade` child: its arguments, extra environment, and an optional
/// command that runs it (`ip netns exec NS` for a node in a network namespace).
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// Arguments after `palisade`.
    pub args: Vec<String>,
    /// Extra environment variables (`PALISADE_TEST_FAULTS=1`, `FAILPOINTS=...`).
    pub env: Vec<(String, String)>,
    /// A command and its arguments that run the binary, which must `exec` it so that the
    /// child's pid is the binary's (as `ip netns exec` does); empty: run it directly.
    pub prefix: Vec<String>,
}

/// `text` without terminal colour codes (`ESC [ ... m`), which the palisade processes'
/// text logs carry even when their stderr is a file: for reading fields out of a log.
pub fn without_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An escape runs to its final letter (`m` for colours).
            for e in chars.by_ref() {
                if e.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Spawns `palisade <args>` with stderr to `log`, and waits for a stdout line containing
/// `marker`. Returns the guard, that line, and a receiver of every later stdout line.
pub fn spawn_until_line(
    args: &[String],
    log: &Path,
    marker: &str,
    name: &str,
) -> Result<(ChildGuard, String, mpsc::Receiver<String>)> {
    let launch = Launch {
        args: args.to_vec(),
        ..Launch::default()
    };
    spawn_launch(&launch, log, marker, name)
}

/// [`spawn_until_line`] with extra environment and an optional command prefix.
pub fn spawn_launch(
    launch: &Launch,
    log: &Path,
    marker: &str,
    name: &str,
) -> Result<(ChildGuard, String, mpsc::Receiver<String>)> {
    let marker = marker.to_owned();
    spawn_until(launch, log, move |line| line.contains(&marker), name)
}

/// Spawns `palisade` as `launch` says, with stderr to `log`, and waits for the first
/// stdout line for which `ready` holds (a line the protocol's `ProxyReady::parse` or
/// `NodeReady::parse` reads, say). Returns the guard, that line, and a receiver of every
/// later stdout line.
pub fn spawn_until(
    launch: &Launch,
    log: &Path,
    ready: impl Fn(&str) -> bool + Send + 'static,
    name: &str,
) -> Result<(ChildGuard, String, mpsc::Receiver<String>)> {
    let bin = palisade_bin()?;
    let io_err = |what: &str, source| ClusterError::Io {
        what: format!("{what} for {name}"),
        source,
    };
    let stderr = std::fs::File::create(log).map_err(|e| io_err("create the log file", e))?;
    let mut command = match launch.prefix.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(&bin);
            c
        }
        None => Command::new(&bin),
    };
    command
        .args(&launch.args)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr);
    let mut child = command.spawn().map_err(|source| ClusterError::Spawn {
        what: format!("{name} ({})", bin.display()),
        source,
    })?;
    let stdout = child.stdout.take();
    let guard = ChildGuard::new(child, name, log.to_owned());
    let (ready_tx, ready_rx) = mpsc::channel();
    let (lines_tx, lines_rx) = mpsc::channel();
    if let Some(stdout) = stdout {
        std::thread::spawn(move || {
            let mut ready_tx = Some(ready_tx);
            for line in BufReader::new(stdout)
                .lines()
                .map_while(std::result::Result::ok)
            {
                if ready_tx.is_some() && ready(&line) {
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(line);
                    }
                } else if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    match ready_rx.recv_timeout(Duration::from_millis(START_TIMEOUT_MS)) {
        Ok(line) => Ok((guard, line, lines_rx)),
        Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {
            Err(ClusterError::NotReady {
                what: name.to_owned(),
                timeout_ms: START_TIMEOUT_MS,
                log_tail: guard.log_tail(),
            })
        }
    }
}

/// A child's stdout lines after its ready line, shareable between tasks.
#[derive(Debug)]
pub struct Lines(Mutex<mpsc::Receiver<String>>, Mutex<Option<String>>);

impl Lines {
    /// Wraps the receiver [`spawn_launch`] returned.
    pub fn new(rx: mpsc::Receiver<String>) -> Self {
        Self(Mutex::new(rx), Mutex::new(None))
    }

    /// Wraps the receiver, with `first` read before anything it holds (a line the
    /// launcher took for the ready line).
    pub fn with_first(first: String, rx: mpsc::Receiver<String>) -> Self {
        Self(Mutex::new(rx), Mutex::new(Some(first)))
    }

    /// The next line if one has arrived, without waiting.
    pub fn try_next(&self) -> Option<String> {
        if let Some(first) = self.1.lock().unwrap_or_else(PoisonError::into_inner).take() {
            return Some(first);
        }
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .try_recv()
            .ok()
    }

    /// Every line that has arrived, without waiting.
    pub fn drain(&self) -> Vec<String> {
        std::iter::from_fn(|| self.try_next()).collect()
    }

    /// Every remaining line of a child that has exited or been killed: waits (blocking,
    /// up to `timeout`) until its stdout is closed and read to the end.
    pub fn drain_to_end(&self, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut out: Vec<String> = self
            .1
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .into_iter()
            .collect();
        let rx = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match rx.try_recv() {
                Ok(line) => out.push(line),
                Err(mpsc::TryRecvError::Empty) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                // Closed and read to the end, or out of time.
                Err(mpsc::TryRecvError::Disconnected | mpsc::TryRecvError::Empty) => return out,
            }
        }
    }

    /// Waits (asynchronously, polling) for the line the process prints when it stops at a
    /// failpoint ([`FailpointStop`]), skipping others; `None` after `timeout`.
    pub async fn wait_for_failpoint(&self, timeout: Duration) -> Option<FailpointStop> {
        crate::wait::poll(timeout, || async {
            std::iter::from_fn(|| self.try_next()).find_map(|l| FailpointStop::parse(&l))
        })
        .await
    }

    /// Waits (asynchronously, polling) for a line containing `marker`, skipping others;
    /// `None` after `timeout`.
    pub async fn wait_for(&self, marker: &str, timeout: Duration) -> Option<String> {
        crate::wait::poll(timeout, || async {
            std::iter::from_fn(|| self.try_next()).find(|l| l.contains(marker))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests may unwrap: a failed step panics with its cause.

    use super::*;

    /// Goal: an explicitly named binary wins over every other source, and a missing one is
    /// an error naming its path rather than a guess elsewhere.
    /// Method: name a path that does not exist, then this test executable (a file that
    /// does); read `palisade_bin` after each. This is the only test here that sets the
    /// process-wide path.
    #[test]
    fn explicit_binary_wins_and_a_missing_one_is_named() {
        let missing = std::env::temp_dir().join("no-such-dir-for-palisade/palisade");
        set_palisade_bin(&missing);
        match palisade_bin() {
            Err(ClusterError::MissingBinary(path)) => assert_eq!(path, missing),
            other => panic!("expected MissingBinary, got {other:?}"),
        }
        let existing = std::env::current_exe().unwrap();
        set_palisade_bin(&existing);
        assert_eq!(palisade_bin().unwrap(), existing);
    }
}
