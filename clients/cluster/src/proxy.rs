//! A `palisade proxy` child.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::process::{ChildGuard, spawn_until_line};
use crate::{ClusterError, Result};

/// What the proxy prints on stdout once it listens:
/// `palisade proxy listening on ADDR (admin ADDR)`.
pub const READY_LINE: &str = "palisade proxy listening on";

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
}

impl ProxyProcess {
    /// Starts a proxy on free loopback ports with its data in `dir/data` and its log in
    /// `dir` (created if missing). `extra` are further flags (`--upstream URL`, `--config FILE`, ...).
    pub fn start(dir: &Path, extra: &[&str]) -> Result<Self> {
        static STARTS: AtomicUsize = AtomicUsize::new(0);
        std::fs::create_dir_all(dir).map_err(|source| ClusterError::Io {
            what: format!("create {}", dir.display()),
            source,
        })?;
        let data_dir = dir.join("data");
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
        args.push(data_dir.display().to_string());
        args.extend(extra.iter().map(ToString::to_string));
        let n = STARTS.fetch_add(1, Ordering::Relaxed);
        let log = dir.join(format!("proxy-{n}.log"));
        let (guard, line, _) = spawn_until_line(&args, &log, READY_LINE, "proxy")?;
        let (addr, admin) = parse_ready_line(&line).ok_or_else(|| ClusterError::NotReady {
            what: format!("proxy (unreadable ready line {line:?})"),
            timeout_ms: 0,
            log_tail: guard.log_tail(),
        })?;
        Ok(Self {
            guard,
            addr,
            admin,
            data_dir,
        })
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

/// `palisade proxy listening on 127.0.0.1:P (admin 127.0.0.1:Q)` -> the two addresses.
fn parse_ready_line(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let rest = line.split(READY_LINE).nth(1)?;
    let mut words = rest.split_whitespace();
    let addr = words.next()?.parse().ok()?;
    let admin = words.nth(1)?.trim_end_matches(')').parse().ok()?;
    Some((addr, admin))
}

#[cfg(test)]
mod tests {
    #[test]
    fn ready_line_is_parsed() {
        let (a, b) =
            super::parse_ready_line("palisade proxy listening on 127.0.0.1:5 (admin 127.0.0.1:6)")
                .unwrap_or_else(|| panic!("parse"));
        assert_eq!(a.port(), 5);
        assert_eq!(b.port(), 6);
        assert!(super::parse_ready_line("something else").is_none());
    }
}
