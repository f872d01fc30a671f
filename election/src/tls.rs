//! Mutual TLS of a node: its peer links and its API.
//!
//! One certificate per node, issued by the cluster CA and naming `node-<id>` (a DNS
//! subject alternative name), serves three purposes:
//!
//! - Dialing a peer, the node presents it and checks that the peer's certificate comes
//!   from the CA and names `node-<peer id>` ([`NodeTlsMaterial::peer_connector`]).
//! - Accepting a peer, the node requires a certificate from the CA
//!   ([`NodeTlsMaterial::peer_acceptor`]); once the peer's hello names its id, the
//!   transport checks that the certificate names that id ([`check_peer_certificate`]).
//! - The API is HTTPS and every call needs a client certificate from the CA, whatever
//!   its name ([`NodeTlsMaterial::api_acceptor`]).
//!
//! Everything is checked when the node starts: unreadable files, a key that does not
//! match, and a certificate that does not name this node or was not issued by the CA
//! are configuration errors, not handshake failures at the first election.

use std::sync::Arc;

use palisade_server::tls::{
    TlsFileError, acceptor, client_verifier, load_certs, load_key, load_roots, provider,
};
use rustls::client::{Resumption, verify_server_cert_signed_by_trust_anchor, verify_server_name};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::{NoServerSessionStorage, ParsedCertificate};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::config::{ConfigError, NodeTls};

/// The TLS configurations of one node, built from its [`NodeTls`] files.
#[derive(Clone)]
pub(crate) struct NodeTlsMaterial {
    /// Accepts peer connections: a client certificate from the CA is required.
    pub peer_acceptor: TlsAcceptor,
    /// Dials peers: presents this node's certificate, verifies the peer's against the CA
    /// and the name `node-<peer id>`.
    pub peer_connector: TlsConnector,
    /// Serves the API: HTTP/1.1, a client certificate from the CA required.
    pub api_acceptor: TlsAcceptor,
}

/// The name a node's certificate carries: `node-<id>`.
pub(crate) fn node_name(id: u64) -> String {
    format!("node-{id}")
}

/// The server name a dialer verifies for `peer`.
pub(crate) fn peer_server_name(peer: u64) -> Result<ServerName<'static>, std::io::Error> {
    ServerName::try_from(node_name(peer))
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
}

/// Checks that `cert`, the certificate an authenticated peer presented, names the node
/// `peer` it claims to be. The chain was verified against the CA in the handshake; this
/// is the identity check on top. `None` (no certificate) is refused.
pub(crate) fn check_peer_certificate(
    cert: Option<&CertificateDer<'_>>,
    peer: u64,
) -> Result<(), String> {
    let cert = cert.ok_or_else(|| "the connection presented no certificate".to_owned())?;
    let parsed = ParsedCertificate::try_from(cert)
        .map_err(|e| format!("the peer certificate does not parse: {e}"))?;
    let name = peer_server_name(peer).map_err(|e| e.to_string())?;
    verify_server_name(&parsed, &name).map_err(|_| {
        format!(
            "the peer's certificate does not name {}, the node it claims to be",
            node_name(peer)
        )
    })
}

/// Reads and checks the node's TLS files and builds its configurations. Every error is a
/// [`ConfigError`] naming the file's field (`cert`, `key` or `ca`).
pub(crate) fn load(id: u64, tls: &NodeTls) -> Result<NodeTlsMaterial, ConfigError> {
    let field = |field: &'static str| move |e: TlsFileError| ConfigError::new(field, e.to_string());
    let chain = load_certs(&tls.cert).map_err(field("cert"))?;
    let key = load_key(&tls.key).map_err(field("key"))?;
    let roots = load_roots(&tls.ca).map_err(field("ca"))?;
    check_own_certificate(id, tls, &chain, &roots)?;

    let server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::new("cert", e.to_string()))?
        .with_client_cert_verifier(client_verifier(roots.clone(), &tls.ca).map_err(field("ca"))?)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(|e| ConfigError::new("key", format!("{}: {e}", tls.key.display())))?;
    let mut server = server;
    // Peers reconnect rarely: no session resumption, so every connection shows its
    // certificate and goes through the full check.
    server.send_tls13_tickets = 0;
    server.session_storage = Arc::new(NoServerSessionStorage {});

    let mut client = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::new("cert", e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| ConfigError::new("key", format!("{}: {e}", tls.key.display())))?;
    client.resumption = Resumption::disabled();

    let api_acceptor = acceptor(&tls.cert, &tls.key, Some(&tls.ca)).map_err(field("cert"))?;
    Ok(NodeTlsMaterial {
        peer_acceptor: TlsAcceptor::from(Arc::new(server)),
        peer_connector: TlsConnector::from(Arc::new(client)),
        api_acceptor,
    })
}

/// This node's certificate must name `node-<id>` and chain to the CA: else every peer
/// would refuse it, and it is better to say so at start.
fn check_own_certificate(
    id: u64,
    tls: &NodeTls,
    chain: &[CertificateDer<'static>],
    roots: &rustls::RootCertStore,
) -> Result<(), ConfigError> {
    let cert_error = |message: String| ConfigError::new("cert", message);
    let Some((leaf, intermediates)) = chain.split_first() else {
        return Err(cert_error(format!(
            "{} holds no certificate",
            tls.cert.display()
        )));
    };
    let parsed = ParsedCertificate::try_from(leaf)
        .map_err(|e| cert_error(format!("{}: {e}", tls.cert.display())))?;
    verify_server_name(
        &parsed,
        &peer_server_name(id).map_err(|e| cert_error(e.to_string()))?,
    )
    .map_err(|_| {
        cert_error(format!(
            "{} does not name {} (this node's id {id}); peers would refuse it",
            tls.cert.display(),
            node_name(id)
        ))
    })?;
    verify_server_cert_signed_by_trust_anchor(
        &parsed,
        roots,
        intermediates,
        UnixTime::now(),
        provider().signature_verification_algorithms.all,
    )
    .map_err(|e| {
        cert_error(format!(
            "{} is not valid under the CA in {}: {e}",
            tls.cert.display(),
            tls.ca.display()
        ))
    })
}

/// The node's TLS material when `config.tls` is set; otherwise `None`, with a warning
/// when `insecure` lets plaintext leave loopback.
pub(crate) fn prepare(
    config: &crate::config::NodeConfig,
) -> Result<Option<NodeTlsMaterial>, ConfigError> {
    if let Some(tls) = &config.tls {
        return load(config.id, tls).map(Some);
    }
    if config.insecure {
        tracing::warn!(
            node_id = config.id,
            "--insecure: peer links and the node API are plaintext and unauthenticated; \
             anyone who reaches them can impersonate a peer or steer the leader"
        );
    }
    Ok(None)
}
