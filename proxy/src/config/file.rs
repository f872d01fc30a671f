//! [`ProxyConfig`] and the types of its TOML file, with their defaults.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{
    ADMIN_LISTEN_DEFAULT, ConfigError, LEASE_WRITE_BOUND_MS_DEFAULT, LISTEN_DEFAULT, Limits,
    METHOD_OVERRIDE_HEADERS_DEFAULT, READ_METHODS_DEFAULT,
};

/// Configuration of `palisade proxy`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent switches, one TOML key each"
)]
pub struct ProxyConfig {
    /// Address for client traffic.
    pub listen: SocketAddr,
    /// Address of the admin API (fences, metrics, health).
    pub admin_listen: SocketAddr,
    /// Directory of the proxy's redb file (fences, and the embedded store).
    pub data_dir: PathBuf,
    /// Base URL (`http://` or `https://`) of the storage behind the proxy. When absent,
    /// the embedded object store in `data_dir` serves as the backing storage.
    pub upstream: Option<String>,
    /// PEM file of CA certificates to trust for an `https://` upstream, instead of the
    /// platform's roots.
    pub upstream_ca: Option<PathBuf>,
    /// How the `Host` header reaches the upstream. `client` (the default) forwards the
    /// client's `Host` unchanged, so a client that signs it (S3's `SigV4`) still verifies.
    /// `upstream` replaces it with the upstream URL's authority, for an upstream that
    /// routes by its own name.
    pub upstream_host: UpstreamHost,
    /// What sends requests to a plain `http://` upstream. `own` (the default): the
    /// proxy's own HTTP/1.1 exchange, run in each request's task. `hyper`: hyper's
    /// client, with a task per upstream connection, as before. `https://` upstreams, and
    /// requests that may upgrade, always use hyper's.
    pub upstream_http1_client: Http1Client,
    /// Peers whose `X-Forwarded-For` is kept and appended to. From any other peer the
    /// header is replaced by the peer's own address, so a client cannot forge its origin.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// Fence reads too, not just writes.
    pub fence_reads: bool,
    /// Methods that are reads (compared case-sensitively, as HTTP methods are). Every
    /// other method, any case and any extension (`MOVE`, `COPY`, `put`...), is a fenced
    /// write. Default: GET, HEAD, OPTIONS.
    pub read_methods: Vec<String>,
    /// Replaced by `read_methods`: kept only to refuse it with a message that says so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_methods: Option<Vec<String>>,
    /// Headers that name the method a request really means (`X-HTTP-Method-Override:
    /// DELETE` on a GET). A request carrying one is classified by the method it names.
    pub method_override_headers: Vec<String>,
    /// Whether a client may choose its scope with the `Fencing-Scope` header (off by
    /// default: a client-chosen scope is not tied to the resource it writes, so it could
    /// pick a scope whose fence is lower). Routes can restrict it to a prefix.
    pub client_scopes: bool,
    /// Remove `Fencing-Token` and `Fencing-Token-Proof` before forwarding (default:
    /// forward them unchanged, so a client that signed them still verifies).
    pub strip_token: bool,
    /// Path prefix to scope, matched on the normalised path. The longest matching
    /// prefix wins.
    pub routes: Vec<Route>,
    /// TLS on the client listener. Absent: cleartext (HTTP/1.1 and h2c).
    pub tls: Option<TlsConfig>,
    /// TLS on the admin listener, with mutual TLS when `client_ca` is set. Absent:
    /// cleartext (a warning at start when the admin address is not loopback).
    pub admin_tls: Option<AdminTlsConfig>,
    /// PEM Ed25519 public keys (`token.pub`) of the clusters whose tokens this proxy
    /// admits. When set, a fenced request needs a `Fencing-Token-Proof` that verifies
    /// under one of them for its scope and token; several keys allow a rotation. Empty:
    /// proofs are not checked, and any client can raise a fence.
    pub token_pub: Vec<PathBuf>,
    /// File holding the admin API's bearer token (trimmed; at least
    /// [`ADMIN_TOKEN_BYTES_MIN`](super::ADMIN_TOKEN_BYTES_MIN) bytes). When set, every admin route but `/healthz`
    /// requires `Authorization: Bearer <token>`. Absent: the admin API is open.
    pub admin_token_file: Option<PathBuf>,
    /// Serve `/metrics` without the admin token.
    pub admin_metrics_public: bool,
    /// Fleet mode: the API URLs (`http://` or `https://`) of the election nodes this proxy
    /// follows. With any, the proxy holds a lease on the cluster's current term and admits
    /// fenced requests of the cluster's scope only while it holds one; fenced requests of
    /// any other scope are refused. Empty: standalone, every scope fenced locally.
    pub cluster: Vec<String>,
    /// How the nodes' `--announce` list names this proxy (its admin URL, exactly as
    /// written there); sent with every lease renewal. Absent: `http://<admin address>`
    /// (`https://` with `[admin_tls]`), with the bound port.
    pub fleet_name: Option<String>,
    /// TLS towards `https://` node APIs: the CA that issued their certificates and the
    /// client certificate the nodes require. Absent: the platform's roots, no client
    /// certificate.
    pub cluster_tls: Option<ClusterTlsConfig>,
    /// The nodes' `--lease-write-bound-ms`: how long after its last lease check a write
    /// may take to complete. A write that completes later than its lease's expiry plus
    /// this bound is logged (`lease-overrun`) and counted, in milliseconds.
    pub lease_write_bound_ms: u64,
    /// The audit log: one JSON line per rejection, raise, reset and announce (see
    /// `palisade_protocol::audit`). Absent: none is written.
    pub audit_log: Option<PathBuf>,
    /// Size at which the audit log is rotated (`FILE` becomes `FILE.1`), in bytes.
    pub audit_log_bytes_max: u64,
    /// Rotated audit files kept besides the current one; older ones are deleted.
    pub audit_log_keep: u32,
    /// Serve client connections on this many OS threads, each with its own
    /// single-threaded runtime, as event-loop-per-core servers do: the one client
    /// listener (bound exclusively, so that no other process can share its port) hands
    /// each accepted connection to the threads in turn, and the connection stays on its
    /// thread, so no worker steals or wakes another. Every limit is unchanged. The admin
    /// API, fleet lease renewal, accepting and the async runtime's other work stay on
    /// the main runtime. 0: the client listener's connections are served by the main
    /// runtime, with its work stealing. Absent (the default): one thread per worker thread of the runtime the
    /// proxy starts in (`--worker-threads`, one per CPU unless set). At most
    /// [`REUSEPORT_THREADS_MAX`](super::REUSEPORT_THREADS_MAX). (Named for its first
    /// form, one `SO_REUSEPORT` socket per thread, which let a second process share the
    /// port.)
    pub reuseport_threads: Option<usize>,
    /// Limits on everything the outside world can make the proxy hold.
    pub limits: Limits,
}

/// TLS towards the cluster's node APIs (fleet mode), from PEM files.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterTlsConfig {
    /// CA certificates to trust for the nodes' `https://` APIs, instead of the
    /// platform's roots alone.
    pub ca: Option<PathBuf>,
    /// Client certificate chain presented to the nodes (needs `key`).
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (needs `cert`).
    pub key: Option<PathBuf>,
}

/// One route: requests whose normalised path starts with `prefix` belong to its scope.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Route {
    /// Path prefix, starting with `/`, compared with the normalised path (percent-decoded
    /// unreserved characters, no dot segments, no repeated slashes).
    pub prefix: String,
    /// Scope name, by the rule of [`Scope`](palisade_protocol::Scope): 1-128 of `[A-Za-z0-9._-]`. Exactly one of
    /// `scope` and `scope_segment` is set.
    pub scope: Option<String>,
    /// Take the scope from this path segment (1 is the first), so that every S3 bucket
    /// is its own scope with no configuration per bucket. A request with no such segment,
    /// or one that is not a valid scope name, is refused with 400.
    pub scope_segment: Option<usize>,
    /// `read`: every request of the route is a read whatever its method (RPC-style APIs
    /// whose reads are POSTs, such as etcd's `/v3/kv/range`). `write`: every request is
    /// a fenced write. Absent: by method.
    pub class: Option<RouteClass>,
    /// Match the prefix without regard to ASCII case (for storage that ignores case).
    pub case_insensitive: bool,
    /// With `client_scopes = true`: a `Fencing-Scope` on this route must start with this
    /// prefix, and then names the scope. Absent: the route's scope is the only one.
    pub client_scope_prefix: Option<String>,
    /// Allow `Upgrade` requests (WebSocket and the like) on this route. They are fenced
    /// writes unless `class = "read"`. Off: an upgrade is refused with 405.
    pub upgrade: bool,
    /// Let GET and HEAD requests of this route carry a body (search APIs that take
    /// their query as a GET body). Off: such a request is refused with 400
    /// `body-on-read`, as a GET body has no meaning in HTTP and is a smuggling vector.
    pub read_bodies: bool,
}

/// A route's fixed classification.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RouteClass {
    /// Every request of the route is a read.
    Read,
    /// Every request of the route is a fenced write.
    Write,
}

/// How the `Host` header reaches the upstream.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamHost {
    /// Forward the client's `Host` unchanged.
    #[default]
    Client,
    /// Replace it with the upstream URL's authority.
    Upstream,
}

/// What sends requests to a plain `http://` upstream.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Http1Client {
    /// The proxy's own HTTP/1.1 exchange, in each request's task.
    #[default]
    Own,
    /// hyper's client, with a task per connection.
    Hyper,
}

/// TLS for the client listener, from PEM files.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Certificate chain, PEM.
    pub cert: PathBuf,
    /// Private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// TLS for the admin listener, from PEM files.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminTlsConfig {
    /// Certificate chain, PEM.
    pub cert: PathBuf,
    /// Private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificates, PEM: when set, every admin connection must present a client
    /// certificate one of them issued, or its handshake fails.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            listen: parse_default_addr(LISTEN_DEFAULT),
            admin_listen: parse_default_addr(ADMIN_LISTEN_DEFAULT),
            data_dir: PathBuf::from("palisade-proxy-data"),
            upstream: None,
            upstream_ca: None,
            upstream_host: UpstreamHost::Client,
            upstream_http1_client: Http1Client::Own,
            trusted_proxies: Vec::new(),
            fence_reads: false,
            read_methods: READ_METHODS_DEFAULT
                .iter()
                .map(ToString::to_string)
                .collect(),
            write_methods: None,
            method_override_headers: METHOD_OVERRIDE_HEADERS_DEFAULT
                .iter()
                .map(ToString::to_string)
                .collect(),
            client_scopes: false,
            strip_token: false,
            routes: Vec::new(),
            tls: None,
            admin_tls: None,
            token_pub: Vec::new(),
            admin_token_file: None,
            admin_metrics_public: false,
            cluster: Vec::new(),
            fleet_name: None,
            cluster_tls: None,
            lease_write_bound_ms: LEASE_WRITE_BOUND_MS_DEFAULT,
            audit_log: None,
            audit_log_bytes_max: palisade_protocol::audit::AUDIT_LOG_BYTES_MAX_DEFAULT,
            audit_log_keep: palisade_protocol::audit::AUDIT_LOG_KEEP_DEFAULT,
            reuseport_threads: None,
            limits: Limits::default(),
        }
    }
}

fn parse_default_addr(s: &str) -> SocketAddr {
    // The defaults are literals above; a typo there is a programming error caught by the
    // `defaults_are_valid` test, so falling back to an unspecified address is unreachable.
    s.parse()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
}

impl ProxyConfig {
    /// The data-path threads the client connections are served on: `reuseport_threads`,
    /// or when absent one per worker thread of the current tokio runtime (1 outside
    /// one, or in a current-thread runtime). 0: none, the main runtime serves them.
    pub fn data_threads(&self) -> usize {
        self.reuseport_threads.unwrap_or_else(|| {
            tokio::runtime::Handle::try_current()
                .map_or(1, |runtime| runtime.metrics().num_workers())
                .clamp(1, super::REUSEPORT_THREADS_MAX)
        })
    }

    /// Reads a TOML file. Fields it leaves out keep their defaults.
    pub fn from_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })
    }

    /// Parses the text of a TOML file, as [`from_file`](Self::from_file) does. Not
    /// validated.
    pub fn from_toml_str(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }

    /// The name this proxy gives itself in lease renewals: `fleet_name`, or its admin URL
    /// from the bound admin address.
    pub(crate) fn fleet_name_for(&self, admin: SocketAddr) -> String {
        match &self.fleet_name {
            Some(name) => name.trim_end_matches('/').to_owned(),
            None if self.admin_tls.is_some() => format!("https://{admin}"),
            None => format!("http://{admin}"),
        }
    }

    /// The read methods, parsed. Call after [`validate`](Self::validate).
    pub(crate) fn read_methods(&self) -> Vec<http::Method> {
        self.read_methods
            .iter()
            .filter_map(|m| http::Method::from_bytes(m.as_bytes()).ok())
            .collect()
    }
}
