//! The proxy's configuration: a TOML file, overridden by command-line flags.
//!
//! Every limit is a field with a safe default, so a proxy started with no file at all is
//! bounded in memory, connections and time.
//!
//! # Layout
//! - `file`: [`ProxyConfig`] and the types of its TOML file, with their defaults.
//! - `limits`: [`Limits`], their defaults and their checks.
//! - `validate`: [`ProxyConfig::validate`], every field and relation between fields.
//! - `tests`: the configuration's unit tests.

use std::path::PathBuf;

mod file;
mod limits;
#[cfg(test)]
mod tests;
mod validate;

pub use file::{
    AdminTlsConfig, ClusterTlsConfig, Http1Client, ProxyConfig, Route, RouteClass, TlsConfig,
    UpstreamHost,
};
pub use limits::{
    ADMIN_CONNECTIONS_MAX_DEFAULT, ADMIN_HEADER_READ_TIMEOUT_MS_DEFAULT,
    BODY_ARRIVAL_TIMEOUT_MS_DEFAULT, BODY_BUFFER_BYTES_MAX_DEFAULT, HEADER_BYTES_MIN,
    LEASE_RENEW_TIMEOUT_MS_DEFAULT, Limits,
};

/// Default client listener.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:8080";
/// Default admin listener.
pub const ADMIN_LISTEN_DEFAULT: &str = "127.0.0.1:8081";
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
/// Most data-path threads `reuseport_threads` accepts: far above any core count this
/// runs on, low enough that a typo cannot start thousands of threads and sockets.
pub const REUSEPORT_THREADS_MAX: usize = 256;

/// Default of `lease_write_bound_ms`: the same default as the nodes' `--lease-write-bound-ms`.
pub const LEASE_WRITE_BOUND_MS_DEFAULT: u64 = 500;

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
