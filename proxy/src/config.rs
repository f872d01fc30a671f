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
    /// Fence reads (GET, HEAD, ...) too, not just writes.
    pub fence_reads: bool,
    /// Methods that count as writes. Default: POST, PUT, PATCH, DELETE.
    pub write_methods: Vec<String>,
    /// Whether a client may choose its scope with the `Fencing-Scope` header.
    pub client_scopes: bool,
    /// Remove `Fencing-Token` and `Fencing-Token-Proof` before forwarding (default:
    /// forward them unchanged).
    pub strip_token: bool,
    /// Path prefix to scope. The longest matching prefix wins.
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
    /// Limits on everything the outside world can make the proxy hold.
    pub limits: Limits,
}

/// One route: requests whose path starts with `prefix` belong to `scope`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// Path prefix, starting with `/`.
    pub prefix: String,
    /// Scope name, by the rule of [`Scope`]: 1-128 of `[A-Za-z0-9._-]`.
    pub scope: String,
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
    /// Client connections open at once; further accepts wait for a free slot.
    pub connections_max: usize,
    /// Time a client has to send a complete request head (HTTP/1), in milliseconds.
    pub header_read_timeout_ms: u64,
    /// Largest request head (HTTP/1 buffer; HTTP/2 header list), in bytes. Larger: 431.
    pub header_bytes_max: usize,
    /// Largest request body, in bytes. Larger: 413. Bodies are read whole before a write
    /// is admitted, so a slow client never holds a scope's barrier.
    pub body_bytes_max: u64,
    /// Time a client has to send its whole body, in milliseconds. Slower: 408.
    pub body_read_timeout_ms: u64,
    /// Time to get a connection to the upstream (a free slot under
    /// `upstream_requests_max`, then the TCP and TLS handshake), in milliseconds.
    pub upstream_connect_timeout_ms: u64,
    /// Time from forwarding a request until the upstream's response head, in milliseconds.
    pub upstream_timeout_ms: u64,
    /// Idle pooled upstream connections per host.
    pub upstream_idle_per_host: usize,
    /// Requests in flight to the upstream at once, and so upstream connections open at
    /// once. More wait for a slot, up to `upstream_connect_timeout_ms`, then get 503.
    pub upstream_requests_max: usize,
    /// How long a higher-token write waits for lower-token writes still in flight before
    /// it is answered 503, in milliseconds.
    pub barrier_timeout_ms: u64,
    /// On SIGTERM/SIGINT, how long in-flight requests may run before the proxy exits.
    pub drain_timeout_ms: u64,
    /// Distinct fencing scopes the proxy will remember.
    pub scopes_max: usize,
    /// Largest object in the embedded store, in bytes.
    pub object_bytes_max: u64,
    /// Concurrent HTTP/2 streams per client connection.
    pub h2_streams_max: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections_max: 1024,
            header_read_timeout_ms: 10_000,
            header_bytes_max: 16 * 1024,
            body_bytes_max: palisade_storage::OBJECT_BYTES_MAX_DEFAULT,
            body_read_timeout_ms: 30_000,
            upstream_connect_timeout_ms: 5_000,
            upstream_timeout_ms: 30_000,
            upstream_idle_per_host: 64,
            upstream_requests_max: 256,
            barrier_timeout_ms: 5_000,
            drain_timeout_ms: 10_000,
            scopes_max: palisade_storage::SCOPES_MAX_DEFAULT,
            object_bytes_max: palisade_storage::OBJECT_BYTES_MAX_DEFAULT,
            h2_streams_max: 256,
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
            fence_reads: false,
            write_methods: ["POST", "PUT", "PATCH", "DELETE"]
                .iter()
                .map(ToString::to_string)
                .collect(),
            client_scopes: true,
            strip_token: false,
            routes: Vec::new(),
            tls: None,
            admin_tls: None,
            token_pub: Vec::new(),
            admin_token_file: None,
            admin_metrics_public: false,
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
        if self.upstream_ca.is_some() && self.upstream.is_none() {
            return Err(invalid("upstream_ca", "set, but there is no upstream"));
        }
        if self.write_methods.is_empty() {
            return Err(invalid("write_methods", "must name at least one method"));
        }
        for m in &self.write_methods {
            http::Method::from_bytes(m.as_bytes())
                .map_err(|_| invalid("write_methods", format!("{m:?} is not an HTTP method")))?;
        }
        for (i, r) in self.routes.iter().enumerate() {
            if !r.prefix.starts_with('/') {
                return Err(invalid(
                    format!("routes[{i}].prefix"),
                    format!("{:?} must start with /", r.prefix),
                ));
            }
            Scope::check(&r.scope)
                .map_err(|reason| invalid(format!("routes[{i}].scope"), reason.to_string()))?;
            if self.routes[..i].iter().any(|o| o.prefix == r.prefix) {
                return Err(invalid(
                    format!("routes[{i}].prefix"),
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
        self.limits.validate()
    }

    /// The write methods, parsed. Call after [`validate`](Self::validate).
    pub(crate) fn write_methods(&self) -> Vec<http::Method> {
        self.write_methods
            .iter()
            .filter_map(|m| http::Method::from_bytes(m.as_bytes()).ok())
            .collect()
    }
}

impl Limits {
    fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("limits.connections_max", self.connections_max as u64),
            ("limits.header_read_timeout_ms", self.header_read_timeout_ms),
            ("limits.body_read_timeout_ms", self.body_read_timeout_ms),
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

        let c = ProxyConfig {
            routes: vec![Route {
                prefix: "/a".into(),
                scope: "bad scope".into(),
            }],
            ..ProxyConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("routes[0].scope"), "{err}");
        let c = ProxyConfig {
            routes: vec![Route {
                prefix: "/a".into(),
                scope: "x".repeat(palisade_protocol::SCOPE_BYTES_MAX + 1),
            }],
            ..ProxyConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("routes[0].scope") && err.contains("129 bytes"),
            "{err}"
        );

        let c = ProxyConfig {
            upstream: Some("ftp://x".into()),
            ..ProxyConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("upstream"));
    }
}
