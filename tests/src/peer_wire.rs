//! A hostile peer: speaks the nodes' peer protocol by hand, as an attacker on the network
//! would, over plain TCP or TLS (with or without a client certificate), to check what a
//! node refuses.
//!
//! The wire, as the election crate writes it (`election/src/transport/`): frames behind a
//! u32 big-endian length; first a `Hello { protocol, from, to }`, then `PeerFrame { from,
//! to, payload }` whose payload is a protobuf-encoded raft `Message`. The two messages
//! are restated here (same tags) because the crate keeps them private: a test that
//! forges frames should not need the node's own code to do it.

use std::sync::Arc;
use std::time::Duration;

use palisade_election::transport::{Hello, PROTOCOL_VERSION, PeerFrame};
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::Message;
pub use raft::eraftpb::MessageType;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::pem::PemObject as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Longest a hostile exchange may take before the test calls it hung.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);

/// `body` behind its u32 big-endian length.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

/// The hello frame claiming to be `from`, calling `to`.
pub fn hello(from: u64, to: u64) -> Vec<u8> {
    frame(
        &Hello {
            protocol: PROTOCOL_VERSION,
            from,
            to,
        }
        .encode_to_vec(),
    )
}

/// A raft message frame of type `kind` from `from` to `to` with `term` and `commit`.
pub fn raft_frame(kind: MessageType, from: u64, to: u64, term: u64, commit: u64) -> Vec<u8> {
    let mut msg = Message::default();
    msg.set_msg_type(kind);
    msg.from = from;
    msg.to = to;
    msg.term = term;
    msg.commit = commit;
    frame(
        &PeerFrame {
            from,
            to,
            payload: msg.write_to_bytes().unwrap(),
            score: None,
        }
        .encode_to_vec(),
    )
}

/// A heartbeat from `from` to `to` at `term` with `commit`.
pub fn heartbeat(from: u64, to: u64, term: u64, commit: u64) -> Vec<u8> {
    raft_frame(MessageType::MsgHeartbeat, from, to, term, commit)
}

/// Depth of the nested-group frames below: RUSTSEC-2024-0437's kind of input (a
/// recursive decoder overflows its stack on it), two bytes a level, well under the
/// node's largest frame (`FRAME_BYTES_MAX`, 4 MiB).
pub const NESTED_GROUPS: usize = 500_000;

/// `depth` start-group tags of the unknown field 100 (`(100 << 3) | 3` = 803, varint
/// `a3 06`), each group left open.
pub fn nested_groups(depth: usize) -> Vec<u8> {
    std::iter::repeat_n([0xa3_u8, 0x06], depth)
        .flatten()
        .collect()
}

/// A heartbeat frame from `from` to `to` at `term` whose raft payload (decoded by
/// protobuf 2) ends in [`NESTED_GROUPS`] nested groups.
pub fn nested_payload_frame(from: u64, to: u64, term: u64) -> Vec<u8> {
    let mut msg = Message::default();
    msg.set_msg_type(MessageType::MsgHeartbeat);
    msg.from = from;
    msg.to = to;
    msg.term = term;
    let mut payload = msg.write_to_bytes().unwrap();
    payload.extend(nested_groups(NESTED_GROUPS));
    frame(
        &PeerFrame {
            from,
            to,
            payload,
            score: None,
        }
        .encode_to_vec(),
    )
}

/// A heartbeat frame whose envelope (`PeerFrame`, decoded by prost) ends in
/// [`NESTED_GROUPS`] nested groups.
pub fn nested_envelope_frame(from: u64, to: u64, term: u64) -> Vec<u8> {
    let mut body = heartbeat(from, to, term, 0).split_off(4);
    body.extend(nested_groups(NESTED_GROUPS));
    frame(&body)
}

/// How a hostile exchange ended.
#[derive(Debug)]
pub enum Outcome {
    /// Every byte was written and the node kept the connection open until we closed it
    /// (it may still have dropped what it read).
    Written,
    /// The node closed or reset the connection, or the TLS handshake failed: the reason.
    Refused(String),
}

/// Writes `bytes` on a plain TCP connection to `addr`, then waits briefly for the node to
/// close it.
pub async fn send_plain(addr: std::net::SocketAddr, bytes: &[u8]) -> Outcome {
    let stream = TcpStream::connect(addr).await.unwrap();
    exchange(stream, bytes).await
}

/// Writes `bytes` on a TLS connection to `addr`, presenting the client certificate
/// `identity` (PEM certificate and key files) or none. The node's certificate is not
/// checked: the attacker does not care who answers, only whether it is let in.
pub async fn send_tls(
    addr: std::net::SocketAddr,
    identity: Option<(&std::path::Path, &std::path::Path)>,
    bytes: &[u8],
) -> Outcome {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)));
    let config = match identity {
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    match tokio::time::timeout(EXCHANGE_TIMEOUT, connector.connect(name, tcp)).await {
        Ok(Ok(tls)) => exchange(tls, bytes).await,
        Ok(Err(e)) => Outcome::Refused(format!("TLS handshake: {e}")),
        Err(_) => Outcome::Refused("TLS handshake timed out".to_owned()),
    }
}

/// Writes, then reads until the node closes (refused) or a short while passes (written).
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, bytes: &[u8]) -> Outcome {
    if let Err(e) = stream.write_all(bytes).await {
        return Outcome::Refused(format!("write: {e}"));
    }
    if let Err(e) = stream.flush().await {
        return Outcome::Refused(format!("flush: {e}"));
    }
    // Nodes never answer on an inbound peer connection, so a read ends only when the node
    // closes it; a refusal of the handshake or of a frame closes it at once.
    let mut buf = [0u8; 256];
    match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buf)).await {
        Ok(Ok(0)) => Outcome::Refused("closed by the node".to_owned()),
        Ok(Ok(n)) => Outcome::Refused(format!("the node sent {n} bytes and closed")),
        Ok(Err(e)) => Outcome::Refused(format!("read: {e}")),
        Err(_) => Outcome::Written,
    }
}

/// Accepts any server certificate (see [`send_tls`]); signatures are still checked, so
/// the handshake itself is real.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
