//! File descriptors: a proxy configured for `limits.connections_max` client connections
//! must be able to hold that many sockets, plus its admin connections, its upstream
//! connections and its own files. Many systems start processes with a soft
//! `RLIMIT_NOFILE` of 1,024, below what the default limits need, and the proxy would then
//! fail accepts with EMFILE long before its own limit, refusing clients with no answer.
//! So at start the soft limit is raised to what the configuration needs (as nginx's
//! `worker_rlimit_nofile` does), within the hard limit; a hard limit below the need is a
//! configuration error, refused with the numbers.

use crate::config::Limits;

/// Descriptors the proxy needs besides connections: its two listeners, the database
/// file, standard streams and logs, key and certificate files read at start, and the
/// resolver's sockets, with room to spare.
pub const FD_RESERVE: u64 = 64;

/// Descriptors the configured limits need: client, admin and upstream connections (in
/// flight and idle in the pool) plus [`FD_RESERVE`].
#[must_use]
pub fn needed(limits: &Limits) -> u64 {
    [
        limits.connections_max,
        limits.admin_connections_max,
        limits.upstream_requests_max,
        limits.upstream_idle_per_host,
    ]
    .iter()
    .map(|&n| u64::try_from(n).unwrap_or(u64::MAX))
    .fold(FD_RESERVE, u64::saturating_add)
}

/// Why the descriptor limit could not be made to fit the configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FdLimitError {
    /// The hard limit is below what the configured limits need.
    #[error(
        "the configured limits need {needed} file descriptors (limits.connections_max + \
         limits.admin_connections_max + limits.upstream_requests_max + \
         limits.upstream_idle_per_host + {FD_RESERVE} for listeners and files), but the hard \
         RLIMIT_NOFILE is {hard}; raise it (ulimit -Hn, systemd's LimitNOFILE=) or lower \
         those limits"
    )]
    HardLimit {
        /// What the limits need.
        needed: u64,
        /// The hard limit.
        hard: u64,
    },
    /// The limit could not be read or set.
    #[error("cannot raise RLIMIT_NOFILE from {soft} to {needed}: {source}")]
    System {
        /// The soft limit found.
        soft: u64,
        /// What the limits need.
        needed: u64,
        /// The cause.
        source: std::io::Error,
    },
}

/// Raises the soft `RLIMIT_NOFILE` to what `limits` need when it is below; leaves it
/// alone otherwise. Returns the soft limit in force afterwards.
#[cfg(unix)]
pub fn ensure(limits: &Limits) -> Result<u64, FdLimitError> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let needed = needed(limits);
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| FdLimitError::System {
        soft: 0,
        needed,
        source: e.into(),
    })?;
    if soft >= needed {
        return Ok(soft);
    }
    if hard < needed {
        return Err(FdLimitError::HardLimit { needed, hard });
    }
    setrlimit(Resource::RLIMIT_NOFILE, needed, hard).map_err(|e| FdLimitError::System {
        soft,
        needed,
        source: e.into(),
    })?;
    tracing::info!(
        from = soft,
        to = needed,
        hard,
        "raised the soft RLIMIT_NOFILE to what the connection limits need"
    );
    Ok(needed)
}

/// Elsewhere the limit is the system's business; nothing to raise.
#[cfg(not(unix))]
pub fn ensure(limits: &Limits) -> Result<u64, FdLimitError> {
    Ok(needed(limits))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the default limits need more than the common soft limit of 1,024, so the
    /// raise is needed, and the sum names every connection kind.
    /// Method: compute the need of the defaults and of a changed config.
    #[test]
    fn default_limits_need_more_than_1024_descriptors() {
        let limits = Limits::default();
        assert_eq!(
            needed(&limits),
            1024 + 64 + 256 + 256 + FD_RESERVE,
            "client + admin + upstream in flight + upstream idle + reserve"
        );
        let more = Limits {
            connections_max: 10_000,
            ..Limits::default()
        };
        assert_eq!(needed(&more), needed(&limits) + 10_000 - 1024);
    }

    /// Goal: after `ensure`, this process's soft limit covers what the limits need (or
    /// the refusal names the hard limit).
    /// Method: ensure the defaults' need, then read the limit back.
    #[cfg(unix)]
    #[test]
    fn ensure_leaves_the_soft_limit_at_or_above_the_need() {
        use nix::sys::resource::{Resource, getrlimit};
        let limits = Limits::default();
        match ensure(&limits) {
            Ok(soft) => {
                assert!(soft >= needed(&limits));
                let (now, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
                assert!(now >= needed(&limits), "soft limit {now}");
            }
            Err(FdLimitError::HardLimit { needed: n, hard }) => {
                assert!(hard < n, "refused only when the hard limit is short");
            }
            Err(e) => panic!("{e}"),
        }
    }
}
