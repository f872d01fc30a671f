//! A small HTTP client: one request over a fresh connection, the whole answer back.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;

use crate::{ClusterError, Result};

/// Longest one request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A whole response.
#[derive(Debug)]
pub struct Answer {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON, or `Null` when it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// A header as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(ToOwned::to_owned)
    }
}

/// Sends one request. `headers` are appended in order, so a header may be repeated.
pub async fn try_send(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Result<Answer> {
    try_send_within(method, url, headers, body, REQUEST_TIMEOUT).await
}

/// Like [`try_send`], with a timeout of the caller's choosing.
pub async fn try_send_within(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
    timeout: Duration,
) -> Result<Answer> {
    let err = |cause: String| ClusterError::Http {
        url: url.to_owned(),
        cause,
    };
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http();
    let mut builder = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let request = builder
        .body(Full::new(body.into()))
        .map_err(|e| err(e.to_string()))?;
    let response = tokio::time::timeout(timeout, client.request(request))
        .await
        .map_err(|_| err(format!("timed out after {timeout:?}")))?
        .map_err(|e| err(format!("{e:?}")))?;
    let (parts, body) = response.into_parts();
    let body = tokio::time::timeout(timeout, body.collect())
        .await
        .map_err(|_| err(format!("body timed out after {timeout:?}")))?
        .map_err(|e| err(e.to_string()))?
        .to_bytes();
    Ok(Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// [`try_send`] that panics on transport errors: for tests.
pub async fn send(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    match try_send(method, url, headers, body).await {
        Ok(a) => a,
        Err(e) => panic!("{e}"),
    }
}

/// A PUT with a fencing token, panicking on transport errors: for tests.
pub async fn put(url: &str, token: u64, body: &str) -> Answer {
    let t = token.to_string();
    send(Method::PUT, url, &[("fencing-token", &t)], body.to_owned()).await
}
