//! Start and control a local Palisade cluster of real processes on loopback: `palisade
//! proxy` and `palisade node` children with free ports and temporary directories, which
//! can be paused (`SIGSTOP`/`SIGCONT`), killed with `SIGKILL`, restarted on the same data
//! (the proxy on the same ports), and partitioned (test faults in the nodes' transport);
//! and a checker of what clients saw against what the storage applied.
//!
//! `palisade demo` runs on it, and so do the end-to-end tests. Every child is killed when
//! its handle is dropped, so a panicking test or an interrupted demo leaves nothing behind.
//!
//! # Layout
//! - `process`: locating the `palisade` binary; [`ChildGuard`]; spawning a child (with
//!   extra environment, or inside a network namespace) and waiting for its ready line;
//!   [`Lines`], its later stdout.
//! - `proxy`: [`ProxyProcess`], a `palisade proxy` child; restart on the same ports.
//! - `node`: [`NodeProcess`], a `palisade node` child, its leadership as JSON, and its
//!   [`LinkFaults`] (drop or delay raft traffic per peer).
//! - `cluster`: [`Cluster`], nodes plus a proxy, with leader queries and partitions.
//! - `worker`: [`worker::WorkerProcess`], the writer beside a node (`palisade
//!   demo-worker`), and its events.
//! - `history`: the history checker: client operations against the apply log.
//! - `client`: a small HTTP client returning status, headers and body.
//! - `wait`: waiting for a condition with a deadline.
#![deny(missing_docs)]

pub mod client;
mod cluster;
pub mod history;
mod node;
mod process;
mod proxy;
pub mod wait;
pub mod worker;

pub use cluster::{Cluster, ClusterOptions, ClusterSpec, NodeHost};
pub use node::{Leadership, LinkFaults, NodeProcess, NodeSpec, TEST_FAULTS_ENV};
pub use process::{
    ChildGuard, Launch, Lines, palisade_bin, require_failpoints, spawn_launch, spawn_until_line,
};
pub use proxy::ProxyProcess;

/// Why a cluster operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The `palisade` binary is not where it should be.
    #[error(
        "the palisade binary is missing at {0}: build it with `cargo build -p palisade-cli`, or set PALISADE_BIN"
    )]
    MissingBinary(std::path::PathBuf),
    /// The `palisade` binary was built without the `failpoints` feature.
    #[error(
        "the palisade binary at {0} has no failpoints compiled in: build it with `cargo test --workspace` (tests/Cargo.toml turns palisade-cli's `failpoints` feature on) or `cargo build -p palisade-cli --features failpoints`; a plain `cargo build` or `cargo test -p palisade-cli` rebuilds it without them"
    )]
    NoFailpoints(std::path::PathBuf),
    /// A child could not be started.
    #[error("cannot start {what}: {source}")]
    Spawn {
        /// The child.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A child did not become ready in time.
    #[error("{what} was not ready within {timeout_ms} ms; last log lines:\n{log_tail}")]
    NotReady {
        /// The child.
        what: String,
        /// The limit.
        timeout_ms: u64,
        /// The end of its stderr log.
        log_tail: String,
    },
    /// A signal could not be sent.
    #[error("cannot send {signal} to {what}: {source}")]
    Signal {
        /// The child.
        what: String,
        /// The signal.
        signal: String,
        /// The cause.
        source: nix::Error,
    },
    /// An HTTP exchange failed.
    #[error("HTTP {url}: {cause}")]
    Http {
        /// The URL.
        url: String,
        /// What went wrong.
        cause: String,
    },
    /// A file or directory operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// Shorthand for this crate's results.
pub type Result<T, E = ClusterError> = std::result::Result<T, E>;

/// A free TCP port on 127.0.0.1, found by binding port 0 and releasing it. Another
/// process could take it before it is used; callers that can, should bind port 0 directly.
pub fn free_port() -> Result<u16> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|source| ClusterError::Io {
            what: "bind a free port".to_owned(),
            source,
        })?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|source| ClusterError::Io {
            what: "read a bound port".to_owned(),
            source,
        })
}
