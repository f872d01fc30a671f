//! The launcher's one raw HTTP helper: a request with exactly the headers given (a
//! repeated `Fencing-Token`, a malformed one, none at all), over a fresh connection, the
//! whole answer back. Tests need it to send what a well-behaved client never would; every
//! ordinary call (leadership, fences, faults, advance) goes through `palisade_client`'s
//! typed APIs instead.

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use palisade_protocol::Problem;

use crate::{ClusterError, Result};

/// Longest one request may take by default.
pub const REQUEST_TIMEOUT_MS: u64 = 30_000;

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

    /// The body as a problem+json [`Problem`], when it is one.
    pub fn problem(&self) -> Option<Problem> {
        serde_json::from_slice(&self.body).ok()
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

/// The shared raw client: no pooled connections (each request opens its own, so a
/// restarted proxy is never reached through a dead one), no proxy from the environment,
/// no redirects, no TLS roots (the raw helper speaks plain HTTP to local processes).
fn raw_client() -> std::result::Result<&'static reqwest::Client, String> {
    static CLIENT: OnceLock<std::result::Result<reqwest::Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .no_proxy()
                .redirect(reqwest::redirect::Policy::none())
                .tls_built_in_native_certs(false)
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Sends one request. `headers` are appended in order, so a header may be repeated.
pub async fn try_send(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Result<Answer> {
    try_send_within(
        method,
        url,
        headers,
        body,
        Duration::from_millis(REQUEST_TIMEOUT_MS),
    )
    .await
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
    let client = raw_client().map_err(err)?;
    let mut request = client.request(method, url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let work = async {
        let response = request.body(body.into()).send().await.map_err(|e| {
            err(
                std::iter::successors(Some(&e as &(dyn std::error::Error + 'static)), |e| {
                    e.source()
                })
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(": "),
            )
        })?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response
            .bytes()
            .await
            .map_err(|e| err(format!("reading the body: {e}")))?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| err(format!("timed out after {timeout:?}")))?
}
