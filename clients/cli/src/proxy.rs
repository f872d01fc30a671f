//! `palisade proxy`: flags and config file into a [`ProxyConfig`], then run until a signal.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use palisade_protocol::process::ProxyReady;
use palisade_proxy::{AdminTlsConfig, ClusterTlsConfig, ProxyConfig, StartError, TlsConfig};

use crate::Failure;

/// Run the fencing reverse proxy. Flags override the config file.
#[derive(Args)]
pub(crate) struct ProxyArgs {
    /// TOML config file (see the README's configuration reference).
    #[arg(long, env = "PALISADE_CONFIG")]
    config: Option<PathBuf>,
    /// Address for client traffic [default: 127.0.0.1:8080].
    #[arg(long, env = "PALISADE_LISTEN")]
    listen: Option<SocketAddr>,
    /// Address of the admin API [default: 127.0.0.1:8081].
    #[arg(long, env = "PALISADE_ADMIN_LISTEN")]
    admin_listen: Option<SocketAddr>,
    /// Directory for the proxy's database (fences, embedded store).
    #[arg(long, env = "PALISADE_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Base URL of the storage behind the proxy (http:// or https://). Absent: the
    /// embedded object store in the data directory.
    #[arg(long, env = "PALISADE_UPSTREAM")]
    upstream: Option<String>,
    /// PEM CA bundle to trust for an https:// upstream instead of the platform's roots.
    #[arg(long, env = "PALISADE_UPSTREAM_CA")]
    upstream_ca: Option<PathBuf>,
    /// Fence reads too, not only writes.
    #[arg(long, env = "PALISADE_FENCE_READS")]
    fence_reads: bool,
    /// Let clients choose their scope with the Fencing-Scope header where no route fixes
    /// it (`client_scopes = true`). Off by default: a client-chosen scope is not tied to the
    /// resource written, so a client could pick a scope whose fence is lower.
    #[arg(long, env = "PALISADE_CLIENT_SCOPES")]
    client_scopes: bool,
    /// PEM certificate chain for TLS on the client listener (needs --tls-key).
    #[arg(long, env = "PALISADE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for TLS on the client listener (needs --tls-cert).
    #[arg(long, env = "PALISADE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM certificate chain for TLS on the admin listener (needs --admin-key).
    #[arg(long, env = "PALISADE_ADMIN_CERT", requires = "admin_key")]
    admin_cert: Option<PathBuf>,
    /// PEM private key for TLS on the admin listener (needs --admin-cert).
    #[arg(long, env = "PALISADE_ADMIN_KEY", requires = "admin_cert")]
    admin_key: Option<PathBuf>,
    /// PEM CA bundle: the admin listener then requires a client certificate it issued
    /// (mutual TLS; needs --admin-cert and --admin-key, or `[admin_tls]` in the file).
    #[arg(long, env = "PALISADE_ADMIN_CLIENT_CA")]
    admin_client_ca: Option<PathBuf>,
    /// PEM Ed25519 public key (token.pub) whose signatures prove tokens; repeat it (or
    /// separate files with commas) to accept several keys during a rotation. With any,
    /// a fenced request needs a valid Fencing-Token-Proof. Replaces the config file's keys.
    #[arg(
        long = "token-pub",
        value_name = "FILE",
        env = "PALISADE_TOKEN_PUB",
        value_delimiter = ','
    )]
    token_pub: Vec<PathBuf>,
    /// File holding the admin API's bearer token (at least 16 bytes). With it, every
    /// admin route but /healthz needs `Authorization: Bearer <token>`.
    #[arg(long, value_name = "FILE", env = "PALISADE_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// Serve /metrics without the admin token.
    #[arg(long, env = "PALISADE_ADMIN_METRICS_PUBLIC")]
    admin_metrics_public: bool,
    /// Fleet mode: the API URLs of the election nodes to follow (comma-separated). The
    /// proxy then admits fenced requests of the cluster's scope only under a lease on its
    /// current term. Replaces the config file's list.
    #[arg(
        long,
        value_name = "URL",
        env = "PALISADE_CLUSTER",
        value_delimiter = ','
    )]
    cluster: Vec<String>,
    /// Fleet mode: this proxy's admin URL exactly as the nodes' --announce lists it
    /// [default: http://<admin address>].
    #[arg(long, value_name = "URL", env = "PALISADE_FLEET_NAME")]
    fleet_name: Option<String>,
    /// Fleet mode: PEM CA bundle to trust for https:// node APIs.
    #[arg(long, value_name = "FILE", env = "PALISADE_CLUSTER_CA")]
    cluster_ca: Option<PathBuf>,
    /// Fleet mode: PEM client certificate for the node APIs (needs --cluster-key).
    #[arg(
        long,
        value_name = "FILE",
        env = "PALISADE_CLUSTER_CERT",
        requires = "cluster_key"
    )]
    cluster_cert: Option<PathBuf>,
    /// Fleet mode: PEM private key of --cluster-cert.
    #[arg(
        long,
        value_name = "FILE",
        env = "PALISADE_CLUSTER_KEY",
        requires = "cluster_cert"
    )]
    cluster_key: Option<PathBuf>,
    /// Fleet mode: the nodes' --lease-write-bound-ms (writes completing later than their
    /// lease plus this are logged as lease-overrun) [default: 500].
    #[arg(long, value_name = "MS", env = "PALISADE_LEASE_WRITE_BOUND_MS")]
    lease_write_bound_ms: Option<u64>,
    /// Audit log: one JSON line per rejection, raise, reset and announce; read it with
    /// `palisade audit FILE`.
    #[arg(long, value_name = "FILE", env = "PALISADE_AUDIT_LOG")]
    audit_log: Option<PathBuf>,
    /// Rotate the audit log when it would grow past this size [default: 67108864].
    #[arg(long, value_name = "BYTES", env = "PALISADE_AUDIT_LOG_BYTES_MAX")]
    audit_log_bytes_max: Option<u64>,
    /// Serve client connections on N threads, each with its own single-threaded runtime
    /// (an event loop per core), handed to them in turn by the one listener on --listen;
    /// 0: the main runtime serves them, with work stealing [default: one per worker
    /// thread, --worker-threads].
    #[arg(long, value_name = "N", env = "PALISADE_REUSEPORT_THREADS")]
    reuseport_threads: Option<usize>,
}

impl ProxyArgs {
    fn into_config(self) -> Result<ProxyConfig, Failure> {
        let mut config = match &self.config {
            Some(path) => {
                ProxyConfig::from_file(path).map_err(|e| Failure::Usage(e.to_string()))?
            }
            None => ProxyConfig::default(),
        };
        if let Some(v) = self.listen {
            config.listen = v;
        }
        if let Some(v) = self.admin_listen {
            config.admin_listen = v;
        }
        if let Some(v) = self.data_dir {
            config.data_dir = v;
        }
        if let Some(v) = self.upstream {
            config.upstream = Some(v);
        }
        if let Some(v) = self.upstream_ca {
            config.upstream_ca = Some(v);
        }
        if self.fence_reads {
            config.fence_reads = true;
        }
        if self.client_scopes {
            config.client_scopes = true;
        }
        if let (Some(cert), Some(key)) = (self.tls_cert, self.tls_key) {
            config.tls = Some(TlsConfig { cert, key });
        }
        if let (Some(cert), Some(key)) = (self.admin_cert, self.admin_key) {
            let client_ca = config.admin_tls.take().and_then(|t| t.client_ca);
            config.admin_tls = Some(AdminTlsConfig {
                cert,
                key,
                client_ca,
            });
        }
        if let Some(ca) = self.admin_client_ca {
            match config.admin_tls.as_mut() {
                Some(admin_tls) => admin_tls.client_ca = Some(ca),
                None => {
                    return Err(Failure::Usage(
                        "--admin-client-ca needs --admin-cert and --admin-key (or [admin_tls] \
                         in the config file): mutual TLS needs the admin listener on TLS"
                            .to_owned(),
                    ));
                }
            }
        }
        if !self.token_pub.is_empty() {
            config.token_pub = self.token_pub;
        }
        if let Some(v) = self.admin_token_file {
            config.admin_token_file = Some(v);
        }
        if self.admin_metrics_public {
            config.admin_metrics_public = true;
        }
        if !self.cluster.is_empty() {
            config.cluster = self.cluster;
        }
        if let Some(v) = self.fleet_name {
            config.fleet_name = Some(v);
        }
        if self.cluster_ca.is_some() || self.cluster_cert.is_some() {
            let tls = config
                .cluster_tls
                .get_or_insert_with(ClusterTlsConfig::default);
            if let Some(ca) = self.cluster_ca {
                tls.ca = Some(ca);
            }
            if let (Some(cert), Some(key)) = (self.cluster_cert, self.cluster_key) {
                tls.cert = Some(cert);
                tls.key = Some(key);
            }
        }
        if let Some(v) = self.lease_write_bound_ms {
            config.lease_write_bound_ms = v;
        }
        if let Some(v) = self.audit_log {
            config.audit_log = Some(v);
        }
        if let Some(v) = self.audit_log_bytes_max {
            config.audit_log_bytes_max = v;
        }
        if let Some(v) = self.reuseport_threads {
            config.reuseport_threads = Some(v);
        }
        Ok(config)
    }
}

/// Runs the proxy until SIGTERM or SIGINT, then drains.
pub(crate) async fn run(args: ProxyArgs) -> Result<(), Failure> {
    let config = args.into_config()?;
    let handle = palisade_proxy::start(config).await.map_err(|e| match e {
        StartError::Config(_) | StartError::Tls(_) => Failure::Usage(e.to_string()),
        _ => Failure::Runtime(e.to_string()),
    })?;
    // A line on stdout that scripts and tests can wait for.
    let ready = ProxyReady {
        listen: handle.listen,
        admin: handle.admin,
    };
    println!("{ready}");
    // Start-up is over: what it ran need not stay resident.
    match crate::code_pages::shed() {
        Ok(bytes) => tracing::debug!(bytes, "code pages shed"),
        Err(e) => tracing::warn!("cannot shed the start-up's code pages: {e}"),
    }
    crate::shutdown_signal().await;
    handle.shutdown();
    handle.wait().await;
    tracing::info!("proxy stopped");
    Ok(())
}
