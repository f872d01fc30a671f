//! Clock faults with libfaketime (Debian's `faketime` package): a process whose clocks
//! run fast or slow, or whose wall clock jumps, run through a command prefix
//! (`env LD_PRELOAD=libfaketime.so.1 FAKETIME=...`) that `exec`s the binary, so the
//! child's pid is still the binary's (pauses and `kill -9` reach it).
//!
//! - A **rate** (`FAKETIME="+0 x1.004"`) scales every clock the process reads, the
//!   monotonic one included: tokio's `Instant` and timers, and so a proxy's lease and a
//!   leader's release wait, run at that rate against real time. libfaketime measures the
//!   scaled time from the process's start.
//! - A **wall-clock jump** changes only `CLOCK_REALTIME` (`FAKETIME_DONT_FAKE_MONOTONIC=1`),
//!   as a stepped system clock does: the offset is read from a file the test rewrites
//!   ([`WallClock::set`]), at most [`JUMP_CACHE_S`] seconds after it changed.
//!
//! Where libfaketime is missing, [`libfaketime`] says so and how to install it; the tests
//! that need it are `#[ignore]`d and fail with that message when run with `--ignored`.
//!
//! libfaketime keeps a semaphore and a shared-memory object per process in `/dev/shm`,
//! named by its pid (`sem.faketime_sem_PID`, `faketime_shm_PID`), and removes them only
//! at a clean exit. A process killed with `kill -9` leaves them behind, and a later
//! faked process that gets the same pid exits at once (`shm_open failed: File exists`).
//! So a test unlinks the names of each faked process once it runs ([`forget_names`]:
//! the process keeps what it opened) and [`require_libfaketime`] sweeps those of
//! processes that no longer exist.

use std::path::{Path, PathBuf};
use std::time::Duration;

use palisade_cluster::{Cluster, NodeProcess, ProxyProcess};
use palisade_protocol::FaultSpec;
use palisade_protocol::audit::parse_rfc3339;

/// Names the preload library to use instead of the usual places.
pub const LIBFAKETIME_ENV: &str = "PALISADE_LIBFAKETIME";

/// Where a `make install` from source, or an older layout, puts the preload library;
/// Debian's is `/usr/lib/<multiarch triple>/faketime/`, searched first.
const LIBFAKETIME_PATHS: &[&str] = &[
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];

/// How often a process re-reads its wall-clock offset file, in seconds: a jump takes
/// effect within this long (libfaketime's `FAKETIME_CACHE_DURATION`).
pub const JUMP_CACHE_S: u64 = 1;

/// The path of `libfaketime.so.1`: [`LIBFAKETIME_ENV`] if set, else the first of the
/// usual places that holds it; otherwise why not, with how to install it.
pub fn libfaketime() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(LIBFAKETIME_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "{LIBFAKETIME_ENV}={} names no file",
                path.display()
            ))
        };
    }
    let multiarch = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("faketime/libfaketime.so.1"));
    multiarch
        .chain(LIBFAKETIME_PATHS.iter().map(PathBuf::from))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "libfaketime.so.1 is in neither /usr/lib/*/faketime/ nor {LIBFAKETIME_PATHS:?}: \
                 install Debian's faketime package (apt-get install faketime) or name the \
                 library in {LIBFAKETIME_ENV}"
            )
        })
}

/// [`libfaketime`], or a panic saying what is missing (for the `#[ignore]`d tests).
/// Sweeps the names that processes no longer running left in `/dev/shm` first.
pub fn require_libfaketime() -> PathBuf {
    let lib =
        libfaketime().unwrap_or_else(|why| panic!("the clock-fault tests need libfaketime: {why}"));
    sweep_stale_names();
    lib
}

/// Where libfaketime's per-process objects live.
const SHM_DIR: &str = "/dev/shm";
/// The prefixes of their names, before the pid.
const SHM_PREFIXES: [&str; 2] = ["sem.faketime_sem_", "faketime_shm_"];

/// Unlinks the semaphore and shared-memory names libfaketime made for the running
/// process `pid`, so that nothing is left behind when it is killed. The process keeps
/// the objects it opened; it never opens them by name again.
pub fn forget_names(pid: i32) {
    for prefix in SHM_PREFIXES {
        // Already gone (or never made) is what we want.
        let _ = std::fs::remove_file(Path::new(SHM_DIR).join(format!("{prefix}{pid}")));
    }
}

/// [`forget_names`] of every node and proxy of `cluster` as they run now: call it after
/// each start or restart of a faked process.
pub fn forget_cluster_names(cluster: &Cluster) {
    for node in &cluster.nodes {
        forget_names(node.guard.pid().as_raw());
    }
    for proxy in cluster.proxies() {
        forget_names(proxy.guard.pid().as_raw());
    }
}

/// Removes libfaketime's names whose process no longer exists (no `/proc/PID`).
fn sweep_stale_names() {
    let Ok(entries) = std::fs::read_dir(SHM_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = SHM_PREFIXES
            .iter()
            .find_map(|prefix| name.to_str()?.strip_prefix(prefix)?.parse::<i32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// A command prefix running the binary with every clock at `rate` times real time
/// (`1.004`: 0.4% fast; `0.95`: 5% slow).
pub fn rate_prefix(lib: &Path, rate: f64) -> Vec<String> {
    vec![
        "env".to_owned(),
        "-u".to_owned(),
        "FAKETIME_TIMESTAMP_FILE".to_owned(),
        format!("LD_PRELOAD={}", lib.display()),
        // An offset is required before the rate; "+0" keeps the clocks' readings.
        format!("FAKETIME=+0 x{rate}"),
    ]
}

/// A wall clock a test can step: the offset file of one or more processes run with
/// [`WallClock::prefix`]. Their monotonic clocks are left alone, as a stepped system
/// clock leaves `CLOCK_MONOTONIC` alone.
#[derive(Debug)]
pub struct WallClock {
    file: PathBuf,
}

impl WallClock {
    /// A wall clock at the real time, its offset file in `dir` as `name`.
    pub fn new(dir: &Path, name: &str) -> Self {
        let clock = Self {
            file: dir.join(format!("{name}.faketime")),
        };
        clock.set("+0");
        clock
    }

    /// Steps the wall clock to `offset` from real time, in libfaketime's syntax (`-1h`,
    /// `+1d`, `+0`). The file is replaced whole (written beside, then renamed), so a
    /// process never reads half of it.
    pub fn set(&self, offset: &str) {
        let next = self.file.with_extension("next");
        std::fs::write(&next, format!("{offset}\n")).unwrap();
        std::fs::rename(&next, &self.file).unwrap();
    }

    /// The command prefix running the binary on this wall clock.
    pub fn prefix(&self, lib: &Path) -> Vec<String> {
        vec![
            "env".to_owned(),
            "-u".to_owned(),
            "FAKETIME".to_owned(),
            format!("LD_PRELOAD={}", lib.display()),
            format!("FAKETIME_TIMESTAMP_FILE={}", self.file.display()),
            format!("FAKETIME_CACHE_DURATION={JUMP_CACHE_S}"),
            "FAKETIME_DONT_FAKE_MONOTONIC=1".to_owned(),
        ]
    }
}

/// The signed offset of `seen` (a wall-clock reading of another process) from this
/// process's wall clock now, in seconds (positive: `seen` is ahead).
pub fn offset_s(seen: std::time::SystemTime) -> f64 {
    let now = std::time::SystemTime::now();
    match seen.duration_since(now) {
        Ok(ahead) => ahead.as_secs_f64(),
        Err(behind) => -behind.duration().as_secs_f64(),
    }
}

/// How far `node`'s wall clock is from this process's, in seconds: read from the
/// timestamp of the warning it logs when its test faults are set (a JSON log line), after
/// setting them to `faults` (what the test wants in force there anyway); `None` while
/// that line cannot be read (the node paused, killed or slow to answer).
pub async fn node_wall_offset_s(node: &NodeProcess, faults: &FaultSpec) -> Option<f64> {
    node.set_faults(faults).await.ok()?;
    let logs = node.logs();
    let line = logs
        .iter()
        .rev()
        .flat_map(|log| log.lines().rev())
        .find(|l| l.contains("test faults set"))?;
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let at = parse_rfc3339(v["timestamp"].as_str()?).ok()?;
    Some(offset_s(at))
}

/// How far `proxy`'s wall clock is from this process's, in seconds: its status's `time`;
/// `None` when it does not answer.
pub async fn proxy_wall_offset_s(proxy: &ProxyProcess) -> Option<f64> {
    let status = proxy.admin_client().status().await.ok()?;
    parse_rfc3339(&status.time).ok().map(offset_s)
}

/// Whether `seen_s` (an offset from [`offset_s`]) is `want` (libfaketime's seconds),
/// within `slack` for the time a reading took to arrive.
pub fn offset_is(seen_s: f64, want_s: i64, slack: Duration) -> bool {
    #[allow(clippy::cast_precision_loss)]
    let want = want_s as f64;
    (seen_s - want).abs() <= slack.as_secs_f64()
}
