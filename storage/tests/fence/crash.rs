//! Acknowledged raises survive `kill -9`.
//!
//! The parent test re-executes this test binary as a child process that runs only
//! [`CHILD_TEST`], an ignored test (so a normal run reports it as ignored, never as a pass),
//! given its data directory in [`CHILD_ENV`]. The child raises scope [`SCOPE`] to 1, 2, 3, ... and
//! prints each token only after `advance` returned. The parent kills it with SIGKILL after
//! a varying number of printed tokens, reopens the database and checks that every printed
//! token is on disk, then starts the next child from there.
#![cfg(unix)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use palisade_storage::{Advance, FenceRegister, SCOPES_MAX_DEFAULT, open_database};

/// Set (to the data directory) in the child's environment to switch it into child mode.
const CHILD_ENV: &str = "PALISADE_CRASH_CHILD";
/// Set to replay a failing run's kill schedule; the seed is printed by every run.
const SEED_ENV: &str = "PALISADE_CRASH_SEED";
/// The test function that is the child's entry point, by its path in the test binary.
const CHILD_TEST: &str = "crash::crash_child_advances_forever";
/// The fencing scope the child raises.
const SCOPE: &str = "crash";
/// The database file inside the data directory.
const DB_FILE: &str = "fences.redb";
/// What the child prints before each acknowledged token; unlike anything the harness prints.
const ACK_PREFIX: &str = "palisade-crash-acked ";
/// Kill-and-reopen rounds.
const ITERATIONS: usize = 10;
/// Upper bound on acknowledged tokens the parent waits for before a kill.
const ACKS_BEFORE_KILL_MAX: u64 = 40;
/// How long the parent waits for a child to report the tokens it is waiting for.
const CHILD_REPORT_TIMEOUT_MS: u64 = 30_000;
/// How long the parent waits for a killed child's remaining output.
const CHILD_DRAIN_TIMEOUT_MS: u64 = 10_000;
/// A child that is never killed (its parent died) stops by itself after this long.
const CHILD_RUN_MS_MAX: u64 = 120_000;

/// Not a test: the child process of [`acknowledged_advances_survive_kill_9`], which runs
/// it with `--ignored --exact`. It advances [`SCOPE`] forever, printing each acknowledged
/// token. Run without [`CHILD_ENV`] (`cargo test -- --ignored`), it fails, saying so,
/// rather than pass having checked nothing.
#[test]
#[ignore = "child process entry point, run by acknowledged_advances_survive_kill_9"]
fn crash_child_advances_forever() {
    let dir = std::env::var_os(CHILD_ENV).unwrap_or_else(|| {
        panic!(
            "{CHILD_TEST} is the child process of acknowledged_advances_survive_kill_9, not a \
             test: it runs only with {CHILD_ENV} set to a data directory"
        )
    });
    let fences = FenceRegister::open(
        open_database(&Path::new(&dir).join(DB_FILE)).unwrap(),
        SCOPES_MAX_DEFAULT,
    )
    .unwrap();
    let started = Instant::now();
    let mut token = fences.current(SCOPE) + 1;
    // Write to the stdout handle directly, around the test harness's output capture.
    let mut stdout = std::io::stdout().lock();
    while started.elapsed() < Duration::from_millis(CHILD_RUN_MS_MAX) {
        assert_eq!(
            fences.advance(SCOPE, token).unwrap(),
            Advance::Raised {
                previous: token - 1
            }
        );
        let acked = writeln!(stdout, "{ACK_PREFIX}{token}").and_then(|()| stdout.flush());
        if acked.is_err() {
            // The parent is gone; nobody is left to kill this process.
            return;
        }
        token += 1;
    }
}

/// Kills the child when a round ends early, so a failing test leaves no process behind.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Small deterministic generator for the kill schedule (xorshift64).
struct Schedule(u64);

impl Schedule {
    fn acks_before_kill(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        1 + self.0 % ACKS_BEFORE_KILL_MAX
    }
}

/// Starts a child on `dir`, with a thread forwarding its stdout lines.
fn spawn_child(dir: &Path) -> (ChildGuard, Receiver<String>) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            CHILD_TEST,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    (ChildGuard(child), lines_rx)
}

/// The acknowledged tokens seen so far in one round; checks they are consecutive.
struct Acks {
    first: Option<u64>,
    last: Option<u64>,
    count: u64,
}

impl Acks {
    fn record(&mut self, line: &str) {
        // The harness prints "test <name> ... " without a newline before the child's own
        // output, so the marker may start mid-line. Anything without it is harness chatter.
        let Some((_, token)) = line.split_once(ACK_PREFIX) else {
            return;
        };
        let token: u64 = token.parse().unwrap();
        if let Some(last) = self.last {
            assert_eq!(token, last + 1, "the child skipped a token");
        }
        self.first.get_or_insert(token);
        self.last = Some(token);
        self.count += 1;
    }
}

fn stored_fence(dir: &Path) -> u64 {
    let db = open_database(&dir.join(DB_FILE)).unwrap();
    FenceRegister::open(db, SCOPES_MAX_DEFAULT)
        .unwrap()
        .current(SCOPE)
}

/// Goal: every raise acknowledged before a `kill -9` is on disk afterwards, and the fence
/// never goes backwards across crashes. Method: ten rounds of child process, SIGKILL after
/// a varying number of acknowledgements, reopen, compare with the last acknowledged token.
#[test]
fn acknowledged_advances_survive_kill_9() {
    let seed = std::env::var(SEED_ENV).map_or_else(
        |_| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        },
        |seed| seed.parse().unwrap(),
    );
    eprintln!("kill schedule seed: {SEED_ENV}={seed}");
    let mut schedule = Schedule(seed | 1);
    let dir = tempfile::tempdir().unwrap();
    let mut stored_before = 0;

    for round in 0..ITERATIONS {
        let acks_before_kill = schedule.acks_before_kill();
        let (mut child, lines) = spawn_child(dir.path());
        let mut acks = Acks {
            first: None,
            last: None,
            count: 0,
        };

        let deadline = Instant::now() + Duration::from_millis(CHILD_REPORT_TIMEOUT_MS);
        while acks.count < acks_before_kill {
            match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => acks.record(&line),
                Err(RecvTimeoutError::Timeout) => panic!(
                    "round {round}: the child reported {} of {acks_before_kill} advances \
                     within {CHILD_REPORT_TIMEOUT_MS} ms (exit status so far: {:?})",
                    acks.count,
                    child.0.try_wait()
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "round {round}: the child closed stdout after {} of {acks_before_kill} \
                     advances (exit status: {:?})",
                    acks.count,
                    child.0.wait()
                ),
            }
        }

        child.0.kill().unwrap();
        let status = child.0.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "round {round}: the child was not killed by SIGKILL: {status:?}"
        );
        // Tokens still in the pipe were acknowledged before the kill as well.
        let deadline = Instant::now() + Duration::from_millis(CHILD_DRAIN_TIMEOUT_MS);
        loop {
            match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => acks.record(&line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("round {round}: the killed child's stdout did not close")
                }
            }
        }

        let (Some(first), Some(last)) = (acks.first, acks.last) else {
            panic!("round {round}: no acknowledged token recorded");
        };
        let stored = stored_fence(dir.path());
        eprintln!(
            "round {round}: killed after {} acks (wanted {acks_before_kill}), \
             last acked {last}, stored {stored}",
            acks.count
        );
        assert_eq!(
            first,
            stored_before + 1,
            "round {round}: the child did not continue from the stored fence"
        );
        assert!(
            stored >= last,
            "round {round}: acknowledged token {last} lost, the stored fence is {stored}"
        );
        // Beyond the last acknowledgement, only the raise in flight at the kill can exist.
        assert!(
            stored <= last + 1,
            "round {round}: stored fence {stored} is more than one past the last ack {last}"
        );
        assert!(
            stored >= stored_before,
            "round {round}: the fence went backwards"
        );
        stored_before = stored;
    }
}
