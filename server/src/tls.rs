//! TLS material for the control plane: PEM files into rustls configurations, always with
//! the `ring` provider, so every listener and every peer link of Palisade builds its TLS
//! the same way.
//!
//! - [`load_certs`], [`load_key`], [`load_roots`]: PEM files, each error naming the file.
//! - [`acceptor`]: a server configuration for an HTTP/1.1 control-plane listener, with
//!   client certificates from a CA required when one is given.
//! - [`provider`]: the crypto provider every configuration here uses.
//! - [`dns_names`], [`credential`]: the DNS names of a client's verified certificate,
//!   which carry its role on the node API (`palisade_protocol::roles`).

use std::path::Path;
use std::sync::Arc;

use palisade_protocol::Credential;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;

/// Why TLS material could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsFileError {
    /// A PEM file could not be read, or holds nothing usable.
    #[error("{what} {path}: {reason}")]
    Pem {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// rustls refused the material (a key that does not match its certificate, a CA
    /// that is not one, ...).
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client verifier could not be built from the CA file.
    #[error("client CA {path}: {reason}")]
    ClientCa {
        /// The CA file.
        path: String,
        /// What went wrong.
        reason: String,
    },
}

/// The crypto provider of every Palisade TLS configuration: `ring`, named explicitly so
/// that no other provider linked into a binary changes what is negotiated.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pem_error(what: &'static str, path: &Path, reason: &dyn std::fmt::Display) -> TlsFileError {
    TlsFileError::Pem {
        what,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Every certificate in the PEM file at `path`, in order; at least one.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let what = "certificate file";
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(what, path, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(what, path, &e))?;
    if certs.is_empty() {
        return Err(pem_error(what, path, &"no PEM certificate found"));
    }
    Ok(certs)
}

/// The private key in the PEM file at `path` (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsFileError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| pem_error("private key file", path, &e))
}

/// A root store holding every certificate of the PEM file at `path`.
pub fn load_roots(path: &Path) -> Result<rustls::RootCertStore, TlsFileError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| pem_error("CA certificate file", path, &e))?;
    }
    Ok(roots)
}

/// A verifier that requires a client certificate issued by a CA of `roots`.
pub fn client_verifier(
    roots: rustls::RootCertStore,
    ca: &Path,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsFileError> {
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| TlsFileError::ClientCa {
            path: ca.display().to_string(),
            reason: e.to_string(),
        })
}

/// The TLS acceptor of an HTTP/1.1 control-plane listener: the certificate chain in
/// `cert` with its key in `key`; with `client_ca`, every client must present a
/// certificate issued by a CA in that file (mutual TLS), and a handshake without one
/// fails.
pub fn acceptor(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<TlsAcceptor, TlsFileError> {
    let chain = load_certs(cert)?;
    let key = load_key(key)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        Some(ca) => builder.with_client_cert_verifier(client_verifier(load_roots(ca)?, ca)?),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key)?;
    // The control-plane stack serves HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The DNS subject alternative names of `cert`, in its order; none when it has no such
/// extension. An error when it does not parse as X.509 (a certificate rustls verified
/// always does).
pub fn dns_names(cert: &CertificateDer<'_>) -> Result<Vec<String>, String> {
    use x509_parser::extensions::GeneralName;
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| format!("the certificate does not parse: {e}"))?;
    let san = parsed
        .subject_alternative_name()
        .map_err(|e| format!("its subject alternative names do not parse: {e}"))?;
    Ok(san
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::DNSName(dns) => Some((*dns).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default())
}

/// The credential a TLS client proved: the DNS names of the leaf among `certs` (the
/// chain it presented, which the handshake verified against the client CA). `None`
/// without a certificate; a leaf that does not parse is logged and holds no name.
pub fn credential(certs: Option<&[CertificateDer<'_>]>) -> Option<Credential> {
    let leaf = certs?.first()?;
    let names = dns_names(leaf).unwrap_or_else(|err| {
        tracing::warn!(cause = %err, "a verified client certificate's names could not be read; it holds no role");
        Vec::new()
    });
    Some(Credential::from_names(names))
}
