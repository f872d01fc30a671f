//! A `palisade proxy` child.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::Duration;

use palisade_client::{ProxyAdmin, backoff};
use palisade_protocol::process::{FailpointStop, ProxyReady};

use crate::process::{ChildGuard, Launch, Lines, spawn_until};
use crate::{ClusterError, Result};

/// Timeout of one admin query: short, so a paused proxy reads as "no answer".
pub const ADMIN_QUERY_TIMEOUT_MS: u64 = 500;

/// Attempts to start a restarted proxy on its old ports: right after a `kill -9` the
/// kernel may still hold a port for a moment.
const RESTART_ATTEMPTS: usize = 20;
/// First wait before starting a restarted proxy again on ports still held.
const RESTART_BACKOFF_MIN_MS: u64 = 50;
/// Longest wait (before jitter) between two such attempts; with 20 attempts they span
/// several seconds, far longer than the kernel holds a port of a killed process.
const RESTART_BACKOFF_MAX_MS: u64 = 400;

/// A running `palisade proxy`.
pub struct ProxyProcess {
    /// The process.
    pub guard: ChildGuard,
    /// Client address.
    pub addr: SocketAddr,
    /// Admin address.
    pub admin: SocketAddr,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its directory (logs; data in `data/`).
    dir: PathBuf,
    /// How it was started, to restart it the same way.
    launch: Launch,
    /// Its stdout after the ready line (failpoint lines, for instance).
    lines: Lines,
    /// A client of its admin API; restarts keep the ports, so it stays valid.
    admin_client: ProxyAdmin,
    /// The admin bearer token its admin client sends, if any.
    bearer: Option<String>,
}

impl ProxyProcess {
    /// Starts a proxy on free loopback ports with its data in `dir/data` and its log in
    /// `dir` (created if missing). `extra` are further flags (`--upstream URL`, `--config FILE`, ...).
    pub fn start(dir: &Path, extra: &[&str]) -> Result<Self> {
        Self::start_with(dir, "127.0.0.1:0", "127.0.0.1:0", extra, &[])
    }

    /// Starts a proxy listening on `listen` and `admin` (port 0: a free port), with extra
    /// environment `env` (`FAILPOINTS`, `PALISADE_FAILPOINT_STOP`).
    pub fn start_with(
        dir: &Path,
        listen: &str,
        admin: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        Self::start_in(dir, listen, admin, extra, env, &[])
    }

    /// [`start_with`](Self::start_with), run through the command `prefix` (`ip netns
    /// exec NS`: a proxy in a network namespace of its own); empty: run directly.
    pub fn start_in(
        dir: &Path,
        listen: &str,
        admin: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        prefix: &[String],
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|source| ClusterError::Io {
            what: format!("create {}", dir.display()),
            source,
        })?;
        let data_dir = dir.join("data");
        let mut args: Vec<String> = ["proxy", "--listen", listen, "--admin-listen", admin]
            .iter()
            .map(ToString::to_string)
            .collect();
        args.push("--data-dir".to_owned());
        args.push(data_dir.display().to_string());
        args.extend(extra.iter().map(ToString::to_string));
        let launch = Launch {
            args,
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            prefix: prefix.to_vec(),
        };
        let (guard, addr, admin, lines) = Self::spawn(dir, &launch, None)?;
        let admin_client = admin_client(admin)?;
        Ok(Self {
            guard,
            addr,
            admin,
            data_dir,
            dir: dir.to_owned(),
            launch,
            lines,
            admin_client,
            bearer: None,
        })
    }

    /// Makes the admin client send `Authorization: Bearer <token>` (a proxy started with
    /// `--admin-token-file`), now and after restarts.
    pub fn set_admin_bearer(&mut self, token: &str) {
        self.admin_client = self.admin_client.clone().with_bearer(token);
        self.bearer = Some(token.to_owned());
    }

    /// Spawns the proxy and waits for its ready line. With `known` addresses (a restart
    /// on the ports of the first start), a failpoint stop line before the ready line
    /// counts as started too: a proxy restarted with `PALISADE_FAILPOINT_STOP` serves
    /// before it prints its ready line, so a request arriving at once (a worker's retry,
    /// a node's announce) can stop it at the failpoint first. That line is then the first
    /// of [`ProxyProcess::lines`].
    fn spawn(
        dir: &Path,
        launch: &Launch,
        known: Option<(SocketAddr, SocketAddr)>,
    ) -> Result<(ChildGuard, SocketAddr, SocketAddr, Lines)> {
        static STARTS: AtomicUsize = AtomicUsize::new(0);
        let n = STARTS.fetch_add(1, Ordering::Relaxed);
        let log = dir.join(format!("proxy-{n}.log"));
        let stops = known.is_some();
        let ready = move |line: &str| {
            ProxyReady::parse(line).is_some() || (stops && FailpointStop::parse(line).is_some())
        };
        let (guard, line, lines) = spawn_until(launch, &log, ready, "proxy")?;
        if let Some(ready) = ProxyReady::parse(&line) {
            return Ok((guard, ready.listen, ready.admin, Lines::new(lines)));
        }
        match known {
            Some((addr, admin)) if FailpointStop::parse(&line).is_some() => {
                Ok((guard, addr, admin, Lines::with_first(line, lines)))
            }
            _ => Err(ClusterError::NotReady {
                what: format!("proxy (unreadable ready line {line:?})"),
                timeout_ms: 0,
                log_tail: guard.log_tail(),
            }),
        }
    }

    /// `kill -9`s the proxy (if running) and starts it again on the same data directory
    /// and the same ports (so the nodes' `--announce` URLs still reach it), with the same
    /// flags and the environment `env` instead of the first start's.
    pub fn restart_with_env(&mut self, env: &[(&str, &str)]) -> Result<()> {
        self.guard.kill9();
        let mut launch = self.launch.clone();
        for (i, flag) in [(2, self.addr), (4, self.admin)] {
            if let Some(arg) = launch.args.get_mut(i) {
                *arg = flag.to_string();
            }
        }
        launch.env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut delays = backoff::delays(
            Duration::from_millis(RESTART_BACKOFF_MIN_MS),
            Duration::from_millis(RESTART_BACKOFF_MAX_MS),
        )
        .take(RESTART_ATTEMPTS - 1);
        let (guard, addr, admin, lines) = loop {
            match Self::spawn(&self.dir, &launch, Some((self.addr, self.admin))) {
                Ok(started) => break started,
                // The old ports may still be held for a moment after the kill.
                Err(ClusterError::NotReady { log_tail, .. })
                    if log_tail.contains("ddress already in use")
                        && let Some(delay) = delays.next() =>
                {
                    std::thread::sleep(delay);
                }
                Err(e) => return Err(e),
            }
        };
        if admin != self.admin {
            self.admin_client = admin_client(admin)?;
            if let Some(token) = &self.bearer {
                self.admin_client = self.admin_client.clone().with_bearer(token);
            }
        }
        self.guard = guard;
        self.addr = addr;
        self.admin = admin;
        self.lines = lines;
        self.launch = launch;
        Ok(())
    }

    /// [`restart_with_env`](Self::restart_with_env) with no extra environment.
    pub fn restart(&mut self) -> Result<()> {
        self.restart_with_env(&[])
    }

    /// Its stdout lines after the ready line (for instance a failpoint's stop line).
    pub fn lines(&self) -> &Lines {
        &self.lines
    }

    /// `http://ADDR` + `path` on the client listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `http://ADMIN` + `path` on the admin listener.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// A client of the admin API (fences, advance, health), each call limited to
    /// [`ADMIN_QUERY_TIMEOUT_MS`].
    pub fn admin_client(&self) -> &ProxyAdmin {
        &self.admin_client
    }

    /// The proxy's fence for `scope` (0 when never seen), or `None` if it does not
    /// answer within [`ADMIN_QUERY_TIMEOUT_MS`].
    pub async fn fence(&self, scope: &str) -> Option<u64> {
        self.admin_client.fence(scope).await.ok().map(|f| f.token)
    }
}

/// A client of the admin API at `admin`, each call limited to [`ADMIN_QUERY_TIMEOUT_MS`].
fn admin_client(admin: SocketAddr) -> Result<ProxyAdmin> {
    let url = format!("http://{admin}");
    ProxyAdmin::new(&url)
        .map(|client| client.timeout(Duration::from_millis(ADMIN_QUERY_TIMEOUT_MS)))
        .map_err(|source| ClusterError::Client {
            what: format!("a client of the proxy's admin API at {url}"),
            source,
        })
}
