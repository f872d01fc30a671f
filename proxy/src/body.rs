//! The one response body type the proxy returns, and helpers to build it.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};

/// A response body: either the upstream's streamed body or one the proxy made.
pub type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// A body from bytes the proxy already has.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A 200 response with a JSON body.
pub fn ok_json(value: &serde_json::Value) -> http::Response<ProxyBody> {
    let mut response = http::Response::new(full(Bytes::from(value.to_string())));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}
