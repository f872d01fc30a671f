//! One request through the proxy ([`FencedRequest`]), its successful answer
//! ([`FencedResponse`]), and how methods and statuses are classified.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode};

/// The request header that makes a POST or PATCH safe to retry: the storage behind the
/// proxy applies a key at most once.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// One request to send through the proxy: method, path (with an optional query) under
/// the proxy's base URL, headers, body.
#[derive(Debug, Clone)]
pub struct FencedRequest {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// The first invalid header given, reported when the request is sent.
    pub(crate) invalid: Option<String>,
}

impl FencedRequest {
    /// A request with no body.
    pub fn new(method: Method, path: impl Into<String>) -> Self {
        Self {
            method,
            path: path.into(),
            headers: HeaderMap::new(),
            body: Bytes::new(),
            invalid: None,
        }
    }

    /// `GET path`.
    pub fn get(path: impl Into<String>) -> Self {
        Self::new(Method::GET, path)
    }

    /// `PUT path` with `body`.
    pub fn put(path: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Self::new(Method::PUT, path).body(body)
    }

    /// `POST path` with `body`.
    pub fn post(path: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Self::new(Method::POST, path).body(body)
    }

    /// `DELETE path`.
    pub fn delete(path: impl Into<String>) -> Self {
        Self::new(Method::DELETE, path)
    }

    /// Sets the body.
    #[must_use]
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// Appends a header. An invalid name or value is reported when the request is sent.
    /// `Fencing-Token` and `Fencing-Token-Proof` are the client's to set (from its token
    /// source) and are replaced.
    #[must_use]
    pub fn header(mut self, name: &str, value: &str) -> Self {
        match (
            HeaderName::try_from(name),
            HeaderValue::try_from(value.to_owned()),
        ) {
            (Ok(name), Ok(value)) => {
                self.headers.append(name, value);
            }
            (Err(e), _) => {
                self.invalid
                    .get_or_insert_with(|| format!("header name {name:?}: {e}"));
            }
            (_, Err(e)) => {
                self.invalid
                    .get_or_insert_with(|| format!("header {name} value {value:?}: {e}"));
            }
        }
        self
    }

    /// Sets `Idempotency-Key`, which makes a POST or PATCH retryable.
    #[must_use]
    pub fn idempotency_key(self, key: &str) -> Self {
        self.header(IDEMPOTENCY_KEY, key)
    }

    /// The method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The path.
    pub fn path(&self) -> &str {
        &self.path
    }
}

/// A successful (2xx) answer.
#[derive(Debug, Clone)]
pub struct FencedResponse {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
    /// The token this request carried, if it was fenced.
    pub sent_token: Option<u64>,
    /// Attempts it took (1 when the first succeeded).
    pub attempts: u32,
}

impl FencedResponse {
    /// The `Fencing-Token` of the answer: the embedded store reports the token that wrote
    /// the object.
    pub fn stored_token(&self) -> Option<u64> {
        palisade_protocol::parse_token_header(&self.headers)
            .ok()
            .flatten()
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Whether the proxy fences `method` by default.
pub fn is_write(method: &Method) -> bool {
    matches!(
        *method,
        Method::PUT | Method::POST | Method::PATCH | Method::DELETE
    )
}

/// Whether repeating `method` has the effect of sending it once (RFC 9110 9.2.2).
pub(crate) fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE
    )
}

/// Statuses that say "try again": the gateway could not get an answer (502, 504) or the
/// proxy could not take the request now (503, with `Retry-After`).
pub(crate) fn is_retryable_status(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: writes, idempotent methods and retryable statuses are told apart as the
    /// client's retry rules need. Method: classify examples.
    #[test]
    fn methods_are_classified() {
        assert!(is_write(&Method::PATCH) && !is_write(&Method::GET));
        assert!(is_idempotent(&Method::PUT) && !is_idempotent(&Method::POST));
        assert!(is_retryable_status(StatusCode::SERVICE_UNAVAILABLE));
        assert!(!is_retryable_status(StatusCode::CONFLICT));
    }

    /// Goal: an invalid header is kept for reporting at send, not dropped silently.
    /// Method: build a request with a bad header name.
    #[test]
    fn invalid_headers_are_reported_at_send() {
        let request = FencedRequest::put("k", "x").header("bad header", "v");
        assert!(request.invalid.is_some());
    }
}
