//! rustls configuration: the listener's certificate, and the roots trusted upstream.

use std::path::Path;
use std::sync::Arc;

use palisade_server::tls::{load_certs, load_key, load_roots};

use crate::config::TlsConfig;

/// Why TLS could not be set up: the same error as every other Palisade listener's, naming
/// the file.
pub use palisade_server::tls::TlsFileError as TlsError;

/// The listener's server configuration, offering h2 and http/1.1 by ALPN.
pub fn server_config(tls: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = load_certs(&tls.cert)?;
    let key = load_key(&tls.key)?;
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The client configuration for an `https://` upstream: the CA bundle if one is given,
/// else the platform's roots.
pub fn client_config(ca: Option<&Path>) -> Result<rustls::ClientConfig, TlsError> {
    let roots = if let Some(ca) = ca {
        load_roots(ca)?
    } else {
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for error in &native.errors {
            tracing::warn!(cause = %error, "skipping unreadable platform CA certificate");
        }
        let (added, ignored) = roots.add_parsable_certificates(native.certs);
        tracing::debug!(added, ignored, "loaded platform CA certificates");
        roots
    };
    Ok(rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth())
}
