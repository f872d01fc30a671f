//! The proxy's configuration: a TOML file, overridden by command-line flags.
//!
//! Every limit is a field with a safe default, so a proxy started with no file at all is
//! bounded in memory, connections and time.

use std::net::SocketAddr;
use std::path::PathBuf;

use palisade_protocol::Scope;
use serde::{Deserialize, Serialize};

/// Default client listener.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:8080";
/// Default admin listener.
pub const ADMIN_LISTEN_DEFAULT: &str = "127.0.0.1:8081";
/// hyper refuses an HTTP/1 read buffer below this, so it is the floor for `header_bytes_max`.
pub const HEADER_BYTES_MIN: usize = 8192;
/// Shortest admin token accepted, in bytes: 16 random bytes are beyond guessing, and a
/// shorter secret is most likely a placeholder.
pub const ADMIN_TOKEN_BYTES_MIN: usize = 16;

/// The safe methods (RFC 9110 §9.2.1) that are reads by default.
pub const READ_METHODS_DEFAULT: [&str; 3] = ["GET", "HEAD", "OPTIONS"];
/// The method-override headers in common use (Rails, Google APIs, ASP.NET).
pub const METHOD_OVERRIDE_HEADERS_DEFAULT: [&str; 3] = [
    "X-HTTP-Method-Override",
    "X-HTTP-Method",
    "X-Method-Override",
];
/// Default of `limits.body_buffer_bytes_max`: 32 MiB over all connections.
pub const BODY_BUFFER_BYTES_MAX_DEFAULT: u64 = 32 * 1024 * 1024;
/// Most data-path threads `reuseport_threads` accepts: far above any core count this
/// runs on, low enough that a typo cannot start thousands of threads and sockets.
pub const REUSEPORT_THREADS_MAX: usize = 256;

/// Default of `limits.admin_connections_max`.
pub const ADMIN_CONNECTIONS_MAX_DEFAULT: usize = 64;
/// Default of `lease_write_bound_ms`: the same default as the nodes' `--lease-write-bound-ms`.
pub const LEASE_WRITE_BOUND_MS_DEFAULT: u64 = 500;
/// Default of `limits.lease_renew_timeout_ms`.
pub const LEASE_RENEW_TIMEOUT_MS_DEFAULT: u64 = 1_000;
/// Default of `limits.admin_header_read_timeout_ms`.
pub const ADMIN_HEADER_READ_TIMEOUT_MS_DEFAULT: u64 = 2_000;

/// Why a configuration is unusable. Each message names the field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("invalid config file {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause, naming the field.
        source: toml::de::Error,
    },
    /// A file a field names (a key, a token) is missing or unusable.
    #[error("invalid config: {field}: {path}: {reason}")]
    File {
        /// The field, as written in the TOML file.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A field has a value that breaks a rule.
    #[error("invalid config: {field}: {reason}")]
    Invalid {
        /// The field, as written in the TOML file.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Smallest `audit_log_bytes_max`: a few records' worth; a smaller file would rotate at
/// every line.
pub const AUDIT_LOG_BYTES_MIN: u64 = 1024;

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
    /// [`ADMIN_TOKEN_BYTES_MIN`] bytes). When set, every admin route but `/healthz`
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
    /// Serve the client listener with this many OS threads, each with its own
    /// single-threaded runtime and its own listening socket on `listen` (`SO_REUSEPORT`:
    /// the kernel spreads new connections across them), as event-loop-per-core servers
    /// do: a connection stays on the thread that accepted it, so no worker steals or
    /// wakes another. `limits.connections_max` is split across the threads (each admits
    /// at most `ceil(connections_max / reuseport_threads)`); every other limit is
    /// unchanged. The admin API, fleet lease renewal and the async runtime's other work
    /// stay on the main runtime. 0 (the default): the client listener is served by the
    /// main runtime. At most [`REUSEPORT_THREADS_MAX`].
    pub reuseport_threads: usize,
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
    /// Scope name, by the rule of [`Scope`]: 1-128 of `[A-Za-z0-9._-]`. Exactly one of
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

/// Limits. Each bounds something a client or an upstream could otherwise grow without end.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Client connections open at once. At the limit, connections that are idle or have
    /// not sent a request head yet are closed to make room; if none is, accepts wait.
    /// With `reuseport_threads`, each thread admits at most its share, rounded up.
    pub connections_max: usize,
    /// Time a client has to send a complete request head, counted from accept (or from
    /// the end of the previous response on a keep-alive connection), in milliseconds.
    pub header_read_timeout_ms: u64,
    /// Largest request head (HTTP/1 buffer; HTTP/2 header list), in bytes. Larger: 431.
    pub header_bytes_max: usize,
    /// Keep-alive connections idle for this long are closed, in milliseconds. At
    /// `connections_max`, idle ones are closed first anyway, so new clients are served.
    pub keepalive_timeout_ms: u64,
    /// A client connection whose writes make no progress for this long is closed, in
    /// milliseconds: a client that stops reading its response would otherwise hold its
    /// connection, and the upstream connection the response comes from, for ever.
    pub client_write_timeout_ms: u64,
    /// Largest request body, in bytes; larger: 413. Absent (the default): no cap, since
    /// bodies stream to the upstream after admission and are never held whole.
    pub body_bytes_max: Option<u64>,
    /// Time a body may go without progress (no bytes from the client), in milliseconds.
    /// Slower: the request is cut off (408 when no answer has been sent yet).
    pub body_idle_timeout_ms: u64,
    /// Body bytes held by the proxy at once, over all connections: read from clients but
    /// not yet taken by the upstream. At the cap, connections wait before reading more.
    pub body_buffer_bytes_max: u64,
    /// Connections open at once on the admin listener. Its own limit, so the data port
    /// cannot lock the operator or the announce out.
    pub admin_connections_max: usize,
    /// Time an admin connection has to send a request head, counted from accept, in
    /// milliseconds. Short: an admin client sends its request at once.
    pub admin_header_read_timeout_ms: u64,
    /// Time to get a connection to the upstream (a free slot under
    /// `upstream_requests_max`, then the TCP and TLS handshake), in milliseconds.
    pub upstream_connect_timeout_ms: u64,
    /// Time from forwarding a request until the upstream's response head, in milliseconds.
    pub upstream_timeout_ms: u64,
    /// Idle pooled upstream connections per host. The default is
    /// `upstream_requests_max`'s: a pool capped below the connections its load keeps busy
    /// closes some of those that come back and dials others, over and over.
    pub upstream_idle_per_host: usize,
    /// Requests in flight to the upstream at once, and so upstream connections open at
    /// once. More wait for a slot, up to `upstream_connect_timeout_ms`, then get 503.
    pub upstream_requests_max: usize,
    /// How long a higher-token write waits for lower-token writes still in flight before
    /// it is answered 503, in milliseconds.
    pub barrier_timeout_ms: u64,
    /// On SIGTERM/SIGINT, how long in-flight requests may run before the proxy exits.
    pub drain_timeout_ms: u64,
    /// Distinct fencing scopes the proxy will remember. `default` and the scopes named by
    /// routes are always available; past the limit a new scope is refused (507).
    pub scopes_max: usize,
    /// Largest object in the embedded store, in bytes (it holds objects whole); larger:
    /// 413 naming this limit. Not a limit on an HTTP upstream's bodies.
    pub object_bytes_max: u64,
    /// Concurrent HTTP/2 streams per client connection.
    pub h2_streams_max: u32,
    /// Fleet mode: how long a write waits for a lease renewal (when the lease lapsed, or
    /// its token is above the lease's term) before it is answered 503 `lease-expired`;
    /// also the bound on each renewal request to one node, in milliseconds.
    pub lease_renew_timeout_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections_max: 1024,
            header_read_timeout_ms: 10_000,
            header_bytes_max: 16 * 1024,
            keepalive_timeout_ms: 60_000,
            client_write_timeout_ms: 60_000,
            body_bytes_max: None,
            body_idle_timeout_ms: 30_000,
            body_buffer_bytes_max: BODY_BUFFER_BYTES_MAX_DEFAULT,
            admin_connections_max: ADMIN_CONNECTIONS_MAX_DEFAULT,
            admin_header_read_timeout_ms: ADMIN_HEADER_READ_TIMEOUT_MS_DEFAULT,
            upstream_connect_timeout_ms: 5_000,
            upstream_timeout_ms: 30_000,
            // With 64 (the earlier default), 1,000 busy clients made the pool dial a new
            // connection for 1 request in 11: each request's slot is freed when its
            // response head arrives, its connection only when the body has ended, so
            // connections come back in bursts above the cap and are closed. At 14,000
            // requests a second that is 1,200 closed connections a second, each 60 s in
            // TIME_WAIT: more than the 28,232 ephemeral ports a Linux host has by default
            // towards one upstream address.
            upstream_idle_per_host: 256,
            upstream_requests_max: 256,
            barrier_timeout_ms: 5_000,
            drain_timeout_ms: 10_000,
            scopes_max: palisade_storage::SCOPES_MAX_DEFAULT,
            object_bytes_max: palisade_storage::OBJECT_BYTES_MAX_DEFAULT,
            h2_streams_max: 256,
            lease_renew_timeout_ms: LEASE_RENEW_TIMEOUT_MS_DEFAULT,
        }
    }
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
            reuseport_threads: 0,
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
    /// Reads a TOML file. Fields it leaves out keep their defaults.
    pub fn from_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })
    }

    /// Checks every field and every relation between fields; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.reuseport_threads > REUSEPORT_THREADS_MAX {
            return Err(invalid(
                "reuseport_threads",
                format!(
                    "{} threads; at most {REUSEPORT_THREADS_MAX} (0 turns the mode off)",
                    self.reuseport_threads
                ),
            ));
        }
        if let Some(upstream) = &self.upstream {
            let uri: http::Uri = upstream
                .parse()
                .map_err(|e| invalid("upstream", format!("{upstream:?} is not a URL: {e}")))?;
            match uri.scheme_str() {
                Some("http" | "https") => {}
                _ => {
                    return Err(invalid(
                        "upstream",
                        format!("{upstream:?} must start with http:// or https://"),
                    ));
                }
            }
            if uri.authority().is_none() {
                return Err(invalid("upstream", format!("{upstream:?} has no host")));
            }
            if uri.query().is_some() {
                return Err(invalid("upstream", "a base URL cannot have a query"));
            }
        }
        if self.audit_log.is_some() && self.audit_log_bytes_max < AUDIT_LOG_BYTES_MIN {
            return Err(invalid(
                "audit_log_bytes_max",
                format!(
                    "{} bytes; at least {AUDIT_LOG_BYTES_MIN}, so that a file holds more than a few records",
                    self.audit_log_bytes_max
                ),
            ));
        }
        if self.upstream_ca.is_some() && self.upstream.is_none() {
            return Err(invalid("upstream_ca", "set, but there is no upstream"));
        }
        if self.write_methods.is_some() {
            return Err(invalid(
                "write_methods",
                "replaced by read_methods: every method not listed in read_methods is a fenced write",
            ));
        }
        for m in &self.read_methods {
            http::Method::from_bytes(m.as_bytes())
                .map_err(|_| invalid("read_methods", format!("{m:?} is not an HTTP method")))?;
            if m.eq_ignore_ascii_case("CONNECT") {
                return Err(invalid(
                    "read_methods",
                    "CONNECT opens a tunnel; it cannot be a read",
                ));
            }
        }
        for h in &self.method_override_headers {
            http::HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                invalid(
                    "method_override_headers",
                    format!("{h:?} is not a header name"),
                )
            })?;
        }
        for (i, r) in self.routes.iter().enumerate() {
            let field = |name: &str| format!("routes[{i}].{name}");
            if !r.prefix.starts_with('/') {
                return Err(invalid(
                    field("prefix"),
                    format!("{:?} must start with /", r.prefix),
                ));
            }
            // Routes match the normalised path, so a prefix in any other spelling could
            // never match and would silently route nothing.
            match crate::routing::normalise(&r.prefix) {
                Ok(normal) if normal == r.prefix => {}
                Ok(normal) => {
                    return Err(invalid(
                        field("prefix"),
                        format!(
                            "{:?} is not normalised: write it as {normal:?} (requests are \
                             matched on their normalised path)",
                            r.prefix
                        ),
                    ));
                }
                Err(err) => {
                    return Err(invalid(
                        field("prefix"),
                        format!("{:?} can never match: {err}", r.prefix),
                    ));
                }
            }
            match (&r.scope, r.scope_segment) {
                (Some(scope), None) => Scope::check(scope)
                    .map_err(|reason| invalid(field("scope"), reason.to_string()))?,
                (None, Some(0)) => {
                    return Err(invalid(field("scope_segment"), "segments count from 1"));
                }
                (None, Some(_)) => {}
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        field("scope"),
                        "set either scope or scope_segment, not both",
                    ));
                }
                (None, None) => {
                    return Err(invalid(
                        field("scope"),
                        "a route needs scope or scope_segment",
                    ));
                }
            }
            if let Some(prefix) = &r.client_scope_prefix {
                if !self.client_scopes {
                    return Err(invalid(
                        field("client_scope_prefix"),
                        "set, but client_scopes is false",
                    ));
                }
                if prefix.is_empty() || !prefix.bytes().all(palisade_protocol::scope::is_scope_byte)
                {
                    return Err(invalid(
                        field("client_scope_prefix"),
                        format!("{prefix:?} must be a non-empty start of a scope name"),
                    ));
                }
            }
            let same = |o: &Route| {
                if r.case_insensitive || o.case_insensitive {
                    o.prefix.eq_ignore_ascii_case(&r.prefix)
                } else {
                    o.prefix == r.prefix
                }
            };
            if self.routes[..i].iter().any(same) {
                return Err(invalid(
                    field("prefix"),
                    format!("{:?} appears twice", r.prefix),
                ));
            }
        }
        if self.admin_metrics_public && self.admin_token_file.is_none() {
            return Err(invalid(
                "admin_metrics_public",
                "set, but there is no admin_token_file: without one every admin route is public",
            ));
        }
        if self.listen == self.admin_listen && self.listen.port() != 0 {
            return Err(invalid("admin_listen", "must differ from listen"));
        }
        self.validate_fleet()?;
        self.limits.validate()
    }

    /// The fleet fields: node URLs, the fleet name, the cluster TLS files.
    fn validate_fleet(&self) -> Result<(), ConfigError> {
        for (i, url) in self.cluster.iter().enumerate() {
            check_base_url(&format!("cluster[{i}]"), url)?;
            if self.cluster[..i].contains(url) {
                return Err(invalid(
                    format!("cluster[{i}]"),
                    format!("{url:?} appears twice"),
                ));
            }
        }
        if self.cluster.is_empty() {
            if self.fleet_name.is_some() {
                return Err(invalid(
                    "fleet_name",
                    "set, but cluster is empty (not in fleet mode)",
                ));
            }
            if self.cluster_tls.is_some() {
                return Err(invalid(
                    "cluster_tls",
                    "set, but cluster is empty (not in fleet mode)",
                ));
            }
        }
        if let Some(name) = &self.fleet_name {
            check_base_url("fleet_name", name)?;
        }
        if let Some(tls) = &self.cluster_tls
            && tls.cert.is_some() != tls.key.is_some()
        {
            return Err(invalid(
                "cluster_tls.cert",
                "cert and key go together: set both or neither",
            ));
        }
        if self.lease_write_bound_ms == 0 {
            return Err(invalid(
                "lease_write_bound_ms",
                "must be greater than 0 (a write always takes some time to complete)",
            ));
        }
        Ok(())
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

/// An `http://` or `https://` URL with a host and no query, or the error naming `field`.
fn check_base_url(field: &str, url: &str) -> Result<(), ConfigError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| invalid(field, format!("{url:?} is not a URL: {e}")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(invalid(
            field,
            format!("{url:?} must start with http:// or https://"),
        ));
    }
    if uri.authority().is_none() {
        return Err(invalid(field, format!("{url:?} has no host")));
    }
    if uri.query().is_some() {
        return Err(invalid(field, format!("{url:?} cannot have a query")));
    }
    Ok(())
}

impl Limits {
    fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("limits.connections_max", self.connections_max as u64),
            ("limits.header_read_timeout_ms", self.header_read_timeout_ms),
            ("limits.keepalive_timeout_ms", self.keepalive_timeout_ms),
            (
                "limits.client_write_timeout_ms",
                self.client_write_timeout_ms,
            ),
            ("limits.body_idle_timeout_ms", self.body_idle_timeout_ms),
            ("limits.body_buffer_bytes_max", self.body_buffer_bytes_max),
            (
                "limits.admin_connections_max",
                self.admin_connections_max as u64,
            ),
            (
                "limits.admin_header_read_timeout_ms",
                self.admin_header_read_timeout_ms,
            ),
            (
                "limits.upstream_connect_timeout_ms",
                self.upstream_connect_timeout_ms,
            ),
            ("limits.upstream_timeout_ms", self.upstream_timeout_ms),
            (
                "limits.upstream_requests_max",
                self.upstream_requests_max as u64,
            ),
            ("limits.barrier_timeout_ms", self.barrier_timeout_ms),
            ("limits.scopes_max", self.scopes_max as u64),
            ("limits.object_bytes_max", self.object_bytes_max),
            ("limits.h2_streams_max", u64::from(self.h2_streams_max)),
            ("limits.lease_renew_timeout_ms", self.lease_renew_timeout_ms),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(invalid(field, "must be greater than 0"));
            }
        }
        if self.header_bytes_max < HEADER_BYTES_MIN {
            return Err(invalid(
                "limits.header_bytes_max",
                format!(
                    "{} is below the minimum of {HEADER_BYTES_MIN}",
                    self.header_bytes_max
                ),
            ));
        }
        if self.body_bytes_max == Some(0) {
            return Err(invalid(
                "limits.body_bytes_max",
                "must be greater than 0 (leave it out for no cap)",
            ));
        }
        if u32::try_from(self.header_bytes_max).is_err() {
            return Err(invalid("limits.header_bytes_max", "must fit in 32 bits"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a proxy started with no file at all has a valid configuration.
    /// Method: validate the defaults and read back the default addresses.
    #[test]
    fn defaults_are_valid() {
        let c = ProxyConfig::default();
        c.validate().unwrap();
        assert_eq!(c.listen.to_string(), LISTEN_DEFAULT);
        assert_eq!(c.admin_listen.to_string(), ADMIN_LISTEN_DEFAULT);
    }

    /// Goal: the audit log's settings read from TOML, and a size limit below
    /// `AUDIT_LOG_BYTES_MIN` is refused naming `audit_log_bytes_max`.
    /// Method: parse a file with the three fields; validate, then shrink the limit.
    #[test]
    fn audit_log_settings_parse_and_a_tiny_limit_is_refused() {
        let mut c = toml::from_str::<ProxyConfig>(
            "audit_log = \"/var/log/p.audit\"\naudit_log_bytes_max = 4096\naudit_log_keep = 2\n",
        )
        .unwrap();
        assert_eq!(
            (
                c.audit_log.as_deref(),
                c.audit_log_bytes_max,
                c.audit_log_keep
            ),
            (Some(std::path::Path::new("/var/log/p.audit")), 4096, 2)
        );
        c.validate().unwrap();
        c.audit_log_bytes_max = AUDIT_LOG_BYTES_MIN - 1;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("audit_log_bytes_max"), "{err}");
    }

    /// Goal: a misspelt field is an error naming it, not silently ignored.
    /// Method: parse TOML with `listn`.
    #[test]
    fn unknown_field_is_refused_by_name() {
        let err = toml::from_str::<ProxyConfig>("listn = \"127.0.0.1:1\"").unwrap_err();
        assert!(err.to_string().contains("listn"), "{err}");
    }

    /// Goal: a bad value is refused with the field it is in, and route scopes follow the
    /// protocol's one scope rule.
    /// Method: validate configs with a small header limit, bad and over-long route
    /// scopes, and a non-HTTP upstream.
    #[test]
    fn bad_values_name_their_field() {
        let mut c = ProxyConfig::default();
        c.limits.header_bytes_max = 100;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("limits.header_bytes_max"), "{err}");

        // No write timeout at all would let a client that reads nothing hold its
        // connection for ever; 0 is refused, not taken as "none".
        let mut c = ProxyConfig::default();
        c.limits.client_write_timeout_ms = 0;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("limits.client_write_timeout_ms"), "{err}");

        let c = ProxyConfig {
            routes: vec![Route {
                prefix: "/a".into(),
                scope: Some("bad scope".into()),
                ..Route::default()
            }],
            ..ProxyConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("routes[0].scope"), "{err}");
        let c = ProxyConfig {
            routes: vec![Route {
                prefix: "/a".into(),
                scope: Some("x".repeat(palisade_protocol::SCOPE_BYTES_MAX + 1)),
                ..Route::default()
            }],
            ..ProxyConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("routes[0].scope") && err.contains("129 bytes"),
            "{err}"
        );

        for (prefix, want) in [
            ("/%62illing/", "\"/billing/\""),
            ("//a", "\"/a\""),
            ("/a%2Fb", "never match"),
        ] {
            let c = ProxyConfig {
                routes: vec![Route {
                    prefix: prefix.into(),
                    scope: Some("a".into()),
                    ..Route::default()
                }],
                ..ProxyConfig::default()
            };
            let err = c.validate().unwrap_err().to_string();
            assert!(
                err.contains("routes[0].prefix") && err.contains(want),
                "{err}"
            );
        }

        let c = ProxyConfig {
            upstream: Some("ftp://x".into()),
            ..ProxyConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("upstream"));
    }

    /// Goal: the fleet fields are checked and their errors name the field: node URLs,
    /// duplicates, fleet settings without a cluster, half a client certificate.
    /// Method: validate configs with each mistake, then a good one and its fleet name.
    #[test]
    fn fleet_fields_name_their_field() {
        let fleet = |f: fn(&mut ProxyConfig)| {
            let mut c = ProxyConfig {
                cluster: vec!["http://127.0.0.1:7001".into()],
                ..ProxyConfig::default()
            };
            f(&mut c);
            c.validate().err().map(|e| e.to_string())
        };
        assert_eq!(fleet(|_| {}), None);
        let err = fleet(|c| c.cluster.push("ftp://x".into())).unwrap();
        assert!(err.contains("cluster[1]"), "{err}");
        let err = fleet(|c| c.cluster.push("http://127.0.0.1:7001".into())).unwrap();
        assert!(err.contains("cluster[1]") && err.contains("twice"), "{err}");
        let err = fleet(|c| c.fleet_name = Some("nope".into())).unwrap();
        assert!(err.contains("fleet_name"), "{err}");
        let err = fleet(|c| {
            c.cluster_tls = Some(ClusterTlsConfig {
                cert: Some("c.pem".into()),
                ..ClusterTlsConfig::default()
            });
        })
        .unwrap();
        assert!(err.contains("cluster_tls.cert"), "{err}");
        let err = fleet(|c| c.limits.lease_renew_timeout_ms = 0).unwrap();
        assert!(err.contains("limits.lease_renew_timeout_ms"), "{err}");
        let err = fleet(|c| c.lease_write_bound_ms = 0).unwrap();
        assert!(err.contains("lease_write_bound_ms"), "{err}");
        let standalone = ProxyConfig {
            fleet_name: Some("http://p1".into()),
            ..ProxyConfig::default()
        };
        let err = standalone.validate().unwrap_err().to_string();
        assert!(
            err.contains("fleet_name") && err.contains("cluster is empty"),
            "{err}"
        );
        let admin: SocketAddr = "127.0.0.1:9001".parse().unwrap();
        assert_eq!(
            ProxyConfig::default().fleet_name_for(admin),
            "http://127.0.0.1:9001"
        );
    }
}
