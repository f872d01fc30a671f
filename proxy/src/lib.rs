//! The fencing reverse proxy.
//!
//! Writes carry a `Fencing-Token`. Per scope the proxy keeps the highest token it has
//! admitted, durably. A lower token is rejected with 409 and never reaches the upstream;
//! a higher one is fsynced before it is forwarded; and a higher-token write waits until
//! lower-token writes still in flight have completed, so the upstream applies writes of
//! a scope in token order.
//!
//! With `token_pub` (the cluster's public keys), a token counts only with its
//! `Fencing-Token-Proof`, the cluster's signature of exactly that scope and token: a
//! token a client made up is refused with 401 before it can move a fence. With
//! `admin_token_file`, the admin API needs `Authorization: Bearer <token>`.
//!
//! ```text
//! client ──> listener (TLS?, h1/h2c, limits) ──> parse ──> classify ──> proof?
//!        ──> fence (track in flight, check/raise fence in redb, barrier), from the head
//!        ──> forward, streaming the body (HTTP(S) upstream, or the embedded object store)
//!        ──> respond, log
//! ```
//!
//! # Layout
//! - `config`: [`ProxyConfig`] and its limits, from TOML and flags, validated
//!   (`config::file`: the file's types; `config::limits`; `config::validate`).
//! - `service`: one request through its phases.
//! - `framing`: the head's framing and target, checked first: a `Connection` naming a
//!   header the request cannot lose, a repeated or contradicting `Host`, transfer
//!   codings other than `chunked`, a body on GET or HEAD; refused, never altered.
//! - `proof`: the public keys, and the check of a token's proof (verified once per
//!   scope, token and proof; then a comparison).
//! - `fencing`: standalone admission: the fence check and the per-scope in-flight
//!   barrier; resets. It knows nothing of leases.
//! - `fleet`: fleet mode (`cluster`), on top of `fencing`: the lease on the cluster's
//!   current term (`fleet::lease`), admission under it and the admission the data path
//!   holds in either mode (`fleet::admission`), the renewal task (`fleet::renewer`).
//! - `stream`: request bodies streamed after admission: size and idle limits, the
//!   shared body buffer budget, read-ahead of small bodies, and what a body shares with
//!   its forward.
//! - `upstream`: forwarding to the HTTP(S) upstream: `Host`, `X-Forwarded-For`,
//!   hop-by-hop headers, trailers, upgrades; `upstream::pool` is its connection pool
//!   (idle HTTP/1 connections on a stack, or one shared HTTP/2 connection).
//! - `embedded`: the embedded object store served in-process.
//! - `admin`: the admin API on axum (fences, advance, reset, metrics, health), served by
//!   the protocol crate's control-plane accept loop.
//! - `audit`: what the proxy remembers for people (recent rejections, raise times,
//!   barrier waits, upstream health) and the audit log it writes them to.
//! - `status_page`: `GET /v1/status` and the HTML status page at `GET /`.
//! - `auth`: the admin API's bearer token and the middleware layer that requires it.
//! - `server`: the data path's listener: TLS, HTTP/1.1 and h2c, connection limits
//!   (through the protocol crate's connection table: timeouts from accept, idle-first
//!   eviction), graceful shutdown. With `reuseport_threads`, the listener hands each
//!   connection to one of that many OS threads, each with its own single-threaded runtime.
//! - `loops`: the data-path threads, each its own runtime, and the hand-off of connections
//!   to them.
//! - `fds`: the file-descriptor limit raised at start to what the limits need.
//! - `tls`: rustls configuration from PEM files.
//! - `error`: [`ProxyError`], who caused it, and its one problem+json answer.
//! - `failpoints`: test-only failpoints of the whole binary, set up from the environment.
//! - `metrics`: metric names and the Prometheus recorder.
//! - `body`: the data path's response body type.
//! - `fuzzing`: handles on the classifier, the admin app, the data path, the fencer and
//!   the upstream answer parser for the fuzz targets in `tests/fuzz`; only with the
//!   `fuzzing` feature.
//!
//! The wire contract (header names, the scope rule, token parsing, problem+json, the
//! admin API's types) is `palisade-protocol`'s; this crate defines none of it.
#![deny(missing_docs)]

mod admin;
mod audit;
mod auth;
mod body;
pub mod config;
mod embedded;
mod error;
pub mod failpoints;
mod fds;
mod fencing;
mod fleet;
mod framing;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod loops;
pub mod metrics;
mod proof;
mod routing;
mod server;
mod service;
mod status_page;
mod stream;
mod tls;
mod upstream;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use audit::{AUDIT_PATH_BYTES_MAX, RAISE_TIMES_SCOPES_MAX, REJECTIONS_KEPT};
pub use auth::{ADMIN_TOKEN_FILE_BYTES_MAX, AuthError};
pub use config::{
    ADMIN_TOKEN_BYTES_MIN, AUDIT_LOG_BYTES_MIN, AdminTlsConfig, ClusterTlsConfig, ConfigError,
    Limits, ProxyConfig, REUSEPORT_THREADS_MAX, Route, RouteClass, TlsConfig, UpstreamHost,
};
pub use embedded::LIST_KEYS_MAX;
pub use error::{Cause, ProxyError};
pub use fds::{FD_RESERVE, FdLimitError};
pub use fleet::{RENEW_INTERVAL_MS_MIN, RENEW_RETRY_MS_MAX, RENEW_RETRY_MS_MIN};
pub use proof::{KEY_FILE_BYTES_MAX, PROOF_CACHE_SCOPES_MAX, ProofFault};
pub use tls::TlsError;

use crate::admin::AdminState;
use crate::auth::{AdminAuth, AdminToken};
use crate::fencing::Fencer;
use crate::proof::ProofVerifier;
use crate::server::ListenerSettings;
use crate::service::{Backend, Shared};

/// The name of the proxy's redb file inside its data directory.
pub const DATABASE_FILE: &str = "proxy.redb";

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The database could not be opened.
    #[error(transparent)]
    Open(#[from] palisade_storage::OpenError),
    /// TLS material is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The file-descriptor limit cannot hold the configured connections.
    #[error(transparent)]
    FileLimit(#[from] FdLimitError),
    /// The audit log could not be opened.
    #[error("cannot open the audit log {path}: {source}")]
    Audit {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A data-path thread (`reuseport_threads`) or its runtime could not start.
    #[error("cannot start data-path thread {index}: {source}")]
    DataThread {
        /// The thread's index, from 0.
        index: usize,
        /// The cause.
        source: std::io::Error,
    },
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

/// A running proxy.
pub struct ProxyHandle {
    /// The bound client address (the real port when the config said port 0).
    pub listen: SocketAddr,
    /// The bound admin address.
    pub admin: SocketAddr,
    /// Where the database lives.
    pub database: PathBuf,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl ProxyHandle {
    /// Starts a graceful shutdown: stop accepting, let in-flight requests finish up to
    /// `limits.drain_timeout_ms`.
    pub fn shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Waits until both listeners have stopped and drained.
    pub async fn wait(mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Validates `config`, loads its keys and admin token, opens the data directory, binds
/// both listeners and starts serving.
pub async fn start(config: ProxyConfig) -> Result<ProxyHandle, StartError> {
    config.validate()?;
    // Before anything opens a descriptor: a limit too small for `connections_max` would
    // fail accepts with EMFILE instead of evicting idle connections.
    fds::ensure(&config.limits)?;
    let proofs = if config.token_pub.is_empty() {
        None
    } else {
        Some(Arc::new(ProofVerifier::load(&config.token_pub)?))
    };
    let auth = Arc::new(AdminAuth {
        token: config
            .admin_token_file
            .as_deref()
            .map(AdminToken::load)
            .transpose()?,
        metrics_public: config.admin_metrics_public,
    });
    // Warned once every trust file has loaded, so a config error is not preceded by it.
    if proofs.is_none() {
        tracing::warn!(
            "no token_pub: token proofs are not checked, so any client can raise fences"
        );
    }
    let limits = &config.limits;
    let database = config.data_dir.join(DATABASE_FILE);
    let db = palisade_storage::open_database(&database)?;
    // `default` and the routes' scopes never count against `limits.scopes_max`, so no
    // flood of client-named scopes can lock them out.
    let register = palisade_storage::FenceRegister::open_reserved(
        Arc::clone(&db),
        limits.scopes_max,
        routing::Classifier::new(&config).reserved_scopes(),
    )?;
    // A register that once held a raised fence and now reads back with none was reset by
    // damage: refuse to start rather than admit any token again. (A fallback to an older,
    // non-empty commit cannot be told apart from the file alone; docs/proxy.md says so.)
    palisade_storage::check_holds_state(
        &database,
        register.list().iter().any(|(_, token)| *token > 0),
    )?;
    let backend = match &config.upstream {
        Some(url) => Backend::Http(Box::new(upstream::HttpUpstream::new(url, &config)?)),
        None => Backend::Embedded(palisade_storage::ObjectStore::open(
            db,
            limits.object_bytes_max,
        )?),
    };
    let tls = match &config.tls {
        Some(t) => Some(tokio_rustls::TlsAcceptor::from(tls::server_config(t)?)),
        None => None,
    };
    if config.admin_tls.is_none() && !config.admin_listen.ip().is_loopback() {
        tracing::warn!(admin = %config.admin_listen,
            "the admin API is plaintext on an address that is not loopback; \
             set [admin_tls] (--admin-cert, --admin-key, --admin-client-ca)");
    }
    let admin_tls = config
        .admin_tls
        .as_ref()
        .map(|t| palisade_server::tls::acceptor(&t.cert, &t.key, t.client_ca.as_deref()))
        .transpose()?;
    // Install the recorder, then bind the hot-path handles to it, before any request.
    metrics::prometheus();
    metrics::hot_path_handles();

    let bind = |addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { addr, source })
    };
    let local = |l: &TcpListener, addr| {
        l.local_addr()
            .map_err(|source| StartError::Bind { addr, source })
    };
    // One socket, bound exclusively, whatever the number of data-path threads: a second
    // proxy started on the same port fails here instead of sharing it (with its own fence,
    // it would admit what this one refuses).
    let client_listener = bind(config.listen).await?;
    let listen = local(&client_listener, config.listen)?;
    let admin_listener = bind(config.admin_listen).await?;
    let admin = local(&admin_listener, config.admin_listen)?;

    let audit = config
        .audit_log
        .as_ref()
        .map(|path| {
            palisade_server::audit::AuditLog::open(&palisade_server::audit::AuditConfig {
                path: path.clone(),
                bytes_max: config.audit_log_bytes_max,
                keep: config.audit_log_keep,
            })
            .map_err(|source| StartError::Audit {
                path: path.clone(),
                source,
            })
        })
        .transpose()?;
    let fencer = Arc::new(
        Fencer::new(register, Duration::from_millis(limits.barrier_timeout_ms))
            .with_activity(Arc::new(audit::Activity::new(audit))),
    );
    // Fleet mode: the lease is built on top of the fencer, which knows nothing of it.
    let fleet = fleet_nodes(&config)?.map(|nodes| {
        let lease = Arc::new(fleet::Lease::new(
            Duration::from_millis(limits.lease_renew_timeout_ms),
            Duration::from_millis(config.lease_write_bound_ms),
        ));
        (lease, nodes)
    });
    let lease = fleet.as_ref().map(|(lease, _)| Arc::clone(lease));
    let admin_state = AdminState {
        fencer: Arc::clone(&fencer),
        lease: lease.clone(),
        proofs: proofs.clone(),
        auth,
        upstream: config
            .upstream
            .clone()
            .unwrap_or_else(|| "embedded object store".to_owned()),
        admin_addr: admin.to_string(),
    };
    let shared = Arc::new(Shared::new(&config, fencer, lease, proofs, backend));
    let (shutdown, shutdown_rx) = watch::channel(false);
    let client_settings = ListenerSettings {
        name: "client",
        connections_max: limits.connections_max,
        header_read_timeout: Duration::from_millis(limits.header_read_timeout_ms),
        keepalive_timeout: Duration::from_millis(limits.keepalive_timeout_ms),
        write_timeout: Duration::from_millis(limits.client_write_timeout_ms),
        header_bytes_max: limits.header_bytes_max,
        h2_streams_max: limits.h2_streams_max,
        drain_timeout: Duration::from_millis(limits.drain_timeout_ms),
        tls,
        upgrades: config.routes.iter().any(|r| r.upgrade),
    };
    let admin_limits = admin::limits(limits, client_settings.drain_timeout);
    let mut tasks = JoinSet::new();
    let loops = match config.data_threads() {
        0 => None,
        threads => Some(loops::start(threads, &mut tasks)?),
    };
    {
        let shared = Arc::clone(&shared);
        let (loops, stop) = loops.unzip();
        let serve = server::serve(
            client_listener,
            client_settings.clone(),
            shutdown_rx.clone(),
            loops,
            move |req, peer| {
                loops::count_request();
                service::handle(Arc::clone(&shared), req, peer)
            },
        );
        tasks.spawn(async move {
            serve.await;
            // Drained (or past the drain timeout): the data-path threads may stop.
            if let Some(stop) = stop {
                stop.send_replace(true);
            }
        });
    }
    let fleet_name = config.fleet_name_for(admin);
    if fleet.is_some() && config.fleet_name.is_none() && admin.ip().is_unspecified() {
        tracing::warn!(fleet_name = %fleet_name,
            "fleet mode with the admin API on an unspecified address: the nodes' --announce \
             cannot name {fleet_name}, so set --fleet-name to the URL they list");
    }
    if let Some((lease, nodes)) = fleet {
        let renewer = fleet::Renewer {
            lease,
            fencer: Arc::clone(&admin_state.fencer),
            nodes,
            name: fleet_name.clone(),
        };
        tasks.spawn(renewer.run(shutdown_rx.clone()));
    }
    let mut admin_shutdown = shutdown_rx;
    tasks.spawn(palisade_server::serve_tls(
        admin_listener,
        admin::app(admin_state),
        admin_limits,
        admin_tls,
        async move {
            // Both listeners stop on the same signal. A dropped sender (the handle gone)
            // also ends the wait, as it ends the client listener's.
            let _ = admin_shutdown.wait_for(|stop| *stop).await;
        },
    ));
    tracing::info!(%listen, %admin, database = %database.display(),
        upstream = config.upstream.as_deref().unwrap_or("embedded object store"),
        tls = config.tls.is_some(), token_pub_keys = config.token_pub.len(),
        admin_token = config.admin_token_file.is_some(),
        admin_tls = config.admin_tls.is_some(),
        admin_mtls = config.admin_tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        cluster = ?config.cluster, fleet_name = (!config.cluster.is_empty()).then_some(fleet_name.as_str()),
        "proxy started");
    Ok(ProxyHandle {
        listen,
        admin,
        database,
        shutdown,
        tasks,
    })
}

/// Fleet mode: a client of each node's API, with the cluster TLS settings; `None` in
/// standalone mode.
fn fleet_nodes(config: &ProxyConfig) -> Result<Option<Vec<palisade_client::NodeApi>>, StartError> {
    if config.cluster.is_empty() {
        return Ok(None);
    }
    let invalid = |field: &str, err: palisade_client::ClientError| {
        StartError::Config(ConfigError::Invalid {
            field: field.to_owned(),
            reason: err.to_string(),
        })
    };
    let mut tls = palisade_client::ClientTls::new();
    if let Some(cluster_tls) = &config.cluster_tls {
        if let Some(ca) = &cluster_tls.ca {
            tls = tls
                .trust_pem_file(ca)
                .map_err(|e| invalid("cluster_tls.ca", e))?;
        }
        if let (Some(cert), Some(key)) = (&cluster_tls.cert, &cluster_tls.key) {
            tls = tls
                .identity_pem_files(cert, key)
                .map_err(|e| invalid("cluster_tls.cert", e))?;
        }
    }
    config
        .cluster
        .iter()
        .enumerate()
        .map(|(i, url)| {
            palisade_client::NodeApi::with_tls(url, &tls)
                .map_err(|e| invalid(&format!("cluster[{i}]"), e))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use hyper_util::rt::TokioIo;

    /// Goal: an upstream connection dialled from a data-path thread (`reuseport_threads`)
    /// whose thread has ended reads as closed from any other thread, so the upstream pool
    /// drops it instead of sending on it. Method: a thread with its own current-thread
    /// runtime dials a loopback listener, spawns hyper's connection task there and hands
    /// the sender out; the sender is open while the thread runs and closed once the
    /// thread, and with it its runtime, has ended.
    #[test]
    fn a_connection_whose_thread_ended_reads_as_closed() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (sender_tx, sender_rx) = std::sync::mpsc::channel();
        let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
                let (sender, connection) = hyper::client::conn::http1::handshake::<
                    _,
                    http_body_util::Empty<bytes::Bytes>,
                >(TokioIo::new(tcp))
                .await
                .unwrap();
                tokio::spawn(connection);
                sender_tx.send(sender).unwrap();
                // Runs the connection's task until told to end.
                tokio::task::spawn_blocking(move || end_rx.recv())
                    .await
                    .unwrap()
                    .unwrap();
            });
        });
        let (_upstream_side, _) = listener.accept().unwrap();
        let sender = sender_rx.recv().unwrap();
        assert!(!sender.is_closed(), "open while its thread runs");
        end_tx.send(()).unwrap();
        thread.join().unwrap();
        assert!(sender.is_closed(), "closed once its thread has ended");
    }
}
