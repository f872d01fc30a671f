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
//! - `process`: locating the `palisade` binary ([`set_palisade_bin`], [`palisade_bin`]);
//!   [`ChildGuard`]; spawning a child (with extra environment, or inside a network
//!   namespace) and waiting for its ready line; [`Lines`], its later stdout.
//! - `proxy`: [`ProxyProcess`], a `palisade proxy` child and its admin client; restart
//!   on the same ports.
//! - `node`: [`NodeProcess`], a `palisade node` child, its leadership ([`LeaderView`])
//!   and its test faults ([`FaultSpec`]: drop or delay raft traffic per peer), through
//!   `palisade_client`'s node API client.
//! - `cluster`: [`Cluster`], nodes plus a proxy or a [`Fleet`] of proxies, with leader
//!   queries and partitions.
//! - `worker`: [`worker::WorkerProcess`], the writer beside a node (`palisade
//!   demo-worker`), and its events.
//! - `history`: the history checker: client operations against the apply log.
//! - `client`: the one raw HTTP helper, for requests with odd headers.
//! - `trust`: [`Pki`], a CA and the certificates it signed (issued in process: the one
//!   CA builder of the tests), and [`Trust`], a secure cluster's keys, certificates and
//!   admin token, made by the binary.
//! - `wait`: waiting for a condition with a deadline, on tokio's clock (the one wait
//!   helper of the workspace).
//!
//! Nothing here panics: the library ships in the `palisade` binary (the demo runs on it).
//! Tests wrap it in panicking shorthands of their own (`palisade-tests`).
#![deny(missing_docs)]

pub mod client;
mod cluster;
pub mod history;
mod node;
mod process;
mod proxy;
mod trust;
pub mod wait;
pub mod worker;

pub use cluster::{Cluster, ClusterOptions, ClusterSpec, Fleet, NodeHost};
pub use node::{NodeProcess, NodeSpec, QUERY_TIMEOUT_MS};
pub use palisade_protocol::{FaultSpec, LeaderView, Role};
pub use process::{
    ChildGuard, Launch, Lines, PALISADE_BIN_ENV, palisade_bin, require_failpoints,
    set_palisade_bin, spawn_launch, spawn_until, spawn_until_line, without_ansi,
};
pub use proxy::{ADMIN_QUERY_TIMEOUT_MS, ProxyProcess};
pub use trust::{OPERATOR_CERT_NAME, Pki, Trust, WRITER_CERT_NAME, proxy_cert_name};

/// Why a cluster operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// No `palisade` binary was named, and this process is not one.
    #[error(
        "no palisade binary to run: call palisade_cluster::set_palisade_bin(env!(\"CARGO_BIN_EXE_palisade\")) in a test of palisade-cli, or set PALISADE_BIN to the binary's path"
    )]
    NoBinary,
    /// The `palisade` binary named is not there.
    #[error(
        "the palisade binary is missing at {0}: build it with `cargo build -p palisade-cli`, or point PALISADE_BIN at it"
    )]
    MissingBinary(std::path::PathBuf),
    /// The `palisade` binary was built without the `failpoints` feature.
    #[error(
        "the palisade binary at {0} has no failpoints compiled in: run the tests of palisade-cli that need them (their dev-dependencies turn the feature on), or build it with `cargo build -p palisade-cli --features failpoints`"
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
    /// A call of a typed API (node, admin) failed.
    #[error("{what}: {source}")]
    Client {
        /// What was asked, of whom.
        what: String,
        /// The client's error.
        source: palisade_client::ClientError,
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
