//! Entry points for the fuzz targets in `tests/fuzz`, compiled only with the `fuzzing`
//! feature. Each is a thin handle on the proxy's own code, never a copy of it: the
//! classifier and path normaliser, the admin app, the data path's service on any byte
//! stream, the fencer, and the upstream hop's HTTP/1.1 codec (answer heads and chunked
//! bodies). Nothing here is part of the proxy's API.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use hyper_util::rt::TokioIo;
use palisade_storage::FenceRegister;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::admin::AdminState;
use crate::auth::{AdminAuth, AdminToken};
use crate::config::ProxyConfig;
use crate::error::ProxyError;
use crate::fencing::Fencer;
use crate::routing::Class;
use crate::server::Peer;
use crate::service::{Backend, Shared};
use crate::upstream::HttpUpstream;
use crate::upstream::h1::codec;
use crate::{StartError, routing};

/// What [`Classifier::classify`] decided for a request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// A fenced write (by method or route), as opposed to a read.
    pub write: bool,
    /// The scope the request is fenced in.
    pub scope: String,
}

/// The data path's classifier, built from a configuration as the proxy builds it.
pub struct Classifier(routing::Classifier);

impl Classifier {
    /// The classifier of `config` (which the caller has validated).
    pub fn new(config: &ProxyConfig) -> Self {
        Self(routing::Classifier::new(config))
    }

    /// Read or write, and the scope, of a request head; `Err` is the refusal's message.
    pub fn classify(&self, parts: &Parts) -> Result<Decision, String> {
        self.0
            .classify(parts)
            .map(|d| Decision {
                write: d.class == Class::Write,
                scope: d.scope.into_owned(),
            })
            .map_err(|e| e.to_string())
    }
}

/// The normalised form of a raw path, as routes see it; `Err` is the refusal's message.
pub fn normalise(raw: &str) -> Result<String, String> {
    routing::normalise(raw).map_err(|e| e.to_string())
}

/// The admin API's router over `register`, behind `admin_token` when given, with no
/// lease, no proof keys and no audit log.
pub fn admin_app(register: FenceRegister, admin_token: Option<&[u8]>) -> axum::Router {
    let fencer = Arc::new(Fencer::new(register, Duration::from_millis(100)));
    crate::admin::app(AdminState {
        fencer,
        lease: None,
        proofs: None,
        auth: Arc::new(AdminAuth {
            token: admin_token.map(AdminToken::new),
            metrics_public: false,
        }),
        upstream: "fuzz upstream".to_owned(),
        admin_addr: "127.0.0.1:0".to_owned(),
    })
}

/// The data path (classify, fence, forward) of a proxy whose upstream is
/// `config.upstream`, fencing in `register`, served on any byte stream.
pub struct DataPath {
    shared: Arc<Shared>,
}

impl DataPath {
    /// The data path of `config` (validated by the caller; `upstream` must be set).
    pub fn new(config: &ProxyConfig, register: FenceRegister) -> Result<Self, StartError> {
        let url = config.upstream.as_deref().ok_or_else(|| {
            StartError::Config(crate::config::ConfigError::Invalid {
                field: "upstream".to_owned(),
                reason: "the fuzzing data path needs an HTTP upstream".to_owned(),
            })
        })?;
        let backend = Backend::Http(Box::new(HttpUpstream::new(url, config)?));
        let fencer = Arc::new(Fencer::new(
            register,
            Duration::from_millis(config.limits.barrier_timeout_ms),
        ));
        let shared = Shared::new(config, fencer, None, None, backend);
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// Serves one HTTP/1 connection on `io` from a client at `peer`, with the proxy's own
    /// request handler, until the connection ends.
    pub async fn serve_http1<I>(&self, io: I, peer: SocketAddr) -> hyper::Result<()>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let shared = Arc::clone(&self.shared);
        let peer = Arc::new(Peer {
            forwarded_for: http::HeaderValue::from_str(&peer.ip().to_string()).ok(),
        });
        let service = hyper::service::service_fn(move |request| {
            crate::service::handle(Arc::clone(&shared), request, Arc::clone(&peer))
        });
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades()
            .await
    }
}

/// The fencer: admission (fence check and in-flight barrier) and resets.
pub struct Fences(Arc<Fencer>);

/// An admitted request: holding it keeps its token in flight.
pub struct Admitted {
    /// Whether admitting it raised the fence.
    pub raised: bool,
    _guard: crate::fencing::InflightGuard,
}

impl Fences {
    /// A fencer over `register`, waiting at most `barrier_timeout` at its barrier.
    pub fn new(register: FenceRegister, barrier_timeout: Duration) -> Self {
        Self(Arc::new(Fencer::new(register, barrier_timeout)))
    }

    /// [`Fences::new`] committing raises on the caller's task rather than the blocking
    /// pool: for the deterministic simulation (`tests/sim`), over an in-memory redb.
    pub fn new_inline(register: FenceRegister, barrier_timeout: Duration) -> Self {
        Self(Arc::new(
            Fencer::new(register, barrier_timeout).with_inline_commit(),
        ))
    }

    /// Admits a request of `scope` with `token`, as the data path does.
    pub async fn admit(&self, scope: &str, token: u64) -> Result<Admitted, ProxyError> {
        let admitted = self.0.admit(scope, token).await?;
        Ok(Admitted {
            raised: admitted.raised,
            _guard: admitted.guard,
        })
    }

    /// Resets the fence of `scope` to `token`, as the admin API does; the fence it had.
    pub async fn reset(&self, scope: &str, token: u64) -> Result<u64, ProxyError> {
        self.0.reset(scope, token).await
    }

    /// The register the fencer admits through.
    pub fn register(&self) -> &FenceRegister {
        self.0.fence_register()
    }
}

/// Longest answer head the upstream hop's HTTP/1.1 codec reads, in bytes.
pub const ANSWER_HEAD_BYTES_MAX: usize = codec::RESPONSE_HEAD_BYTES_MAX;

/// Most header lines in an answer head, or in a chunked answer's trailers.
pub const ANSWER_HEADERS_MAX: usize = codec::RESPONSE_HEADERS_MAX;

/// Longest size line of one chunk, extensions included.
pub const CHUNK_LINE_BYTES_MAX: usize = codec::CHUNK_LINE_BYTES_MAX;

/// Longest trailer section of a chunked answer, in bytes.
pub const TRAILER_BYTES_MAX: usize = codec::TRAILER_BYTES_MAX;

/// How the codec frames an answer's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerFraming {
    /// No body.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunked.
    Chunked,
    /// Until the upstream closes the connection.
    Close,
}

/// An upstream answer's head, as the proxy's own HTTP/1.1 client parsed it.
#[derive(Debug)]
pub struct AnswerHead {
    /// The status code.
    pub status: http::StatusCode,
    /// HTTP/1.1 or HTTP/1.0.
    pub version: http::Version,
    /// Every header line, in order.
    pub headers: http::HeaderMap,
    /// How the body is framed.
    pub framing: AnswerFraming,
    /// Whether the connection may carry another request after this answer.
    pub keep_alive: bool,
    /// The bytes the head took at the start of the buffer.
    pub len: usize,
}

/// Parses an upstream answer's head at the start of `buf`, for a request of `method`,
/// with the codec's `parse_head`: `Ok(None)` while not all of it has arrived, `Err` the
/// refusal's message.
pub fn parse_answer_head(buf: &[u8], method: &http::Method) -> Result<Option<AnswerHead>, String> {
    let Some((head, len)) = codec::parse_head(buf, method).map_err(|e| e.0)? else {
        return Ok(None);
    };
    Ok(Some(AnswerHead {
        status: head.status,
        version: head.version,
        headers: head.headers,
        framing: match head.framing {
            codec::ResponseFraming::Empty => AnswerFraming::Empty,
            codec::ResponseFraming::Length(len) => AnswerFraming::Length(len),
            codec::ResponseFraming::Chunked => AnswerFraming::Chunked,
            codec::ResponseFraming::Close => AnswerFraming::Close,
        },
        keep_alive: head.keep_alive,
        len,
    }))
}

/// Whether the exchange parses an answer head arriving in `buf` again, after the last
/// attempt found it partial at `parsed` bytes (0 before the first): the codec's
/// `worth_parsing`.
pub fn worth_parsing_answer_head(buf: &[u8], parsed: usize) -> bool {
    codec::worth_parsing(buf, parsed)
}

/// What [`ChunkedBody::decode`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum ChunkedPiece {
    /// Some of a chunk's data.
    Data(bytes::Bytes),
    /// The trailers; the body has ended.
    Trailers(http::HeaderMap),
    /// The body has ended (no trailers).
    End,
    /// More bytes are needed.
    More,
}

/// The codec's chunked body decoder, which takes what it decodes from the front of a
/// buffer.
#[derive(Debug, Default)]
pub struct ChunkedBody(codec::ChunkedDecoder);

impl ChunkedBody {
    /// Decodes from the front of `buf`; `Err` is the refusal's message.
    pub fn decode(&mut self, buf: &mut bytes::BytesMut) -> Result<ChunkedPiece, String> {
        Ok(match self.0.decode(buf).map_err(|e| e.0)? {
            codec::Decoded::Data(data) => ChunkedPiece::Data(data),
            codec::Decoded::Trailers(trailers) => ChunkedPiece::Trailers(trailers),
            codec::Decoded::End => ChunkedPiece::End,
            codec::Decoded::More => ChunkedPiece::More,
        })
    }
}
