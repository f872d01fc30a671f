//! Child processes: locating the binary, guards, and waiting for a ready line.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{ClusterError, Result};

/// Longest a child may take to report that it is ready.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Log lines shown when a child fails.
const LOG_TAIL_LINES: usize = 40;

/// The `palisade` binary: `PALISADE_BIN` if set; this process itself if it is `palisade`
/// (the demo); else `target/<profile>/palisade` beside a test executable in
/// `target/<profile>/deps/`, because integration tests of another package cannot use
/// `CARGO_BIN_EXE_palisade`.
pub fn palisade_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("PALISADE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|source| ClusterError::Io {
        what: "find the current executable".to_owned(),
        source,
    })?;
    if exe.file_name().is_some_and(|n| n == "palisade") {
        return Ok(exe);
    }
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join("palisade"))
        .unwrap_or_default();
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(ClusterError::MissingBinary(bin))
    }
}

/// A child process that gets `SIGCONT` and `SIGKILL` when dropped, so a paused child
/// never outlives its owner, even when a test panics.
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

    /// `kill -9`, and reap it. Does nothing if it is already gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(self.pid, Signal::SIGCONT);
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

/// Spawns `palisade <args>` with stderr to `log`, and waits for a stdout line containing
/// `marker`. Returns the guard, that line, and a receiver of every later stdout line.
pub fn spawn_until_line(
    args: &[String],
    log: &Path,
    marker: &str,
    name: &str,
) -> Result<(ChildGuard, String, mpsc::Receiver<String>)> {
    let bin = palisade_bin()?;
    let io_err = |what: &str, source| ClusterError::Io {
        what: format!("{what} for {name}"),
        source,
    };
    let stderr = std::fs::File::create(log).map_err(|e| io_err("create the log file", e))?;
    let mut child = Command::new(&bin)
        .args(args)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|source| ClusterError::Spawn {
            what: format!("{name} ({})", bin.display()),
            source,
        })?;
    let stdout = child.stdout.take();
    let guard = ChildGuard::new(child, name, log.to_owned());
    let (ready_tx, ready_rx) = mpsc::channel();
    let (lines_tx, lines_rx) = mpsc::channel();
    let marker_owned = marker.to_owned();
    if let Some(stdout) = stdout {
        std::thread::spawn(move || {
            let mut ready = Some(ready_tx);
            for line in BufReader::new(stdout)
                .lines()
                .map_while(std::result::Result::ok)
            {
                if ready.is_some() && line.contains(&marker_owned) {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(line);
                    }
                } else if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    match ready_rx.recv_timeout(START_TIMEOUT) {
        Ok(line) => Ok((guard, line, lines_rx)),
        Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {
            Err(ClusterError::NotReady {
                what: name.to_owned(),
                timeout_ms: u64::try_from(START_TIMEOUT.as_millis()).unwrap_or(u64::MAX),
                log_tail: guard.log_tail(),
            })
        }
    }
}
