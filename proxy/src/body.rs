//! The one response body type the proxy returns, and helpers to build it.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};

/// What a response body can fail with, once its head has been answered: the upstream's
/// connection failing or closing mid-body, or the body's framing turning out wrong.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// From an upstream connection hyper runs (HTTP/2, TLS, upgrades).
    #[error(transparent)]
    Hyper(#[from] hyper::Error),
    /// From an upstream HTTP/1 connection the proxy runs itself.
    #[error("upstream body: {0}")]
    Upstream(String),
}

/// A response body: either the upstream's streamed body or one the proxy made.
pub type ProxyBody = BoxBody<Bytes, BodyError>;

/// A body from bytes the proxy already has.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A 200 response with `value` as its JSON body.
pub fn ok_json(value: &impl serde::Serialize) -> http::Response<ProxyBody> {
    // The bodies are the protocol's plain structs of strings and integers, which always
    // serialize; an empty body would still be answered with its status.
    let mut response = http::Response::new(full(serde_json::to_vec(value).unwrap_or_default()));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(palisade_protocol::headers::JSON),
    );
    response
}
