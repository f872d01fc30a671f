//! The HTTP transport the clients share: base URLs, one exchange with a deadline and a
//! body limit, and what a failed exchange tells about the request's fate.

use std::error::Error as StdError;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;

use crate::error::ClientError;

/// Longest a TCP connect may take. Loopback and LAN connects take microseconds to
/// milliseconds; past this the host is down or unreachable, and nothing was sent.
pub const CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Largest response body read into memory: the embedded store's default object limit
/// (16 MiB) twice over, so no legal object is refused.
pub const RESPONSE_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Idle pooled connections kept per host: a worker talks to one proxy and one node.
const POOL_IDLE_PER_HOST_MAX: usize = 8;
/// How long an idle pooled connection is kept, below common server idle timeouts.
const POOL_IDLE_TIMEOUT_MS: u64 = 30_000;

/// A base URL: `http://host:port` with an optional path prefix. A URL without a scheme
/// is taken as `http://`.
#[derive(Debug, Clone)]
pub(crate) struct BaseUrl {
    /// `http://host:port`.
    origin: String,
    /// The path prefix without a trailing `/` (often empty).
    prefix: String,
}

impl BaseUrl {
    pub(crate) fn parse(url: &str) -> Result<Self, ClientError> {
        let invalid = |reason: &str| ClientError::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let with_scheme = if url.contains("://") {
            url.to_owned()
        } else {
            format!("http://{url}")
        };
        let uri: Uri = with_scheme
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(invalid(
                    "https is not supported by this client yet; use http:// (for example on loopback or inside a trusted network)",
                ));
            }
            _ => return Err(invalid("the scheme must be http://")),
        }
        let authority = uri.authority().ok_or_else(|| invalid("no host"))?;
        if authority.port().is_none() && authority.host().is_empty() {
            return Err(invalid("no host"));
        }
        if uri.query().is_some() {
            return Err(invalid("a base URL has no query"));
        }
        Ok(Self {
            origin: format!("http://{authority}"),
            prefix: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    /// The full URI of `path` (with or without its leading `/`, optionally with a query)
    /// under this base.
    pub(crate) fn join(&self, path: &str) -> Result<Uri, ClientError> {
        let full = format!(
            "{}{}/{}",
            self.origin,
            self.prefix,
            path.trim_start_matches('/')
        );
        full.parse().map_err(|e: http::uri::InvalidUri| {
            ClientError::InvalidRequest(format!(
                "path {path:?} is not a valid URI path (percent-encode spaces and other reserved characters): {e}"
            ))
        })
    }

    /// The base as text, for messages.
    pub(crate) fn as_str(&self) -> String {
        format!("{}{}", self.origin, self.prefix)
    }
}

/// A whole answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Answer {
    /// The problem+json `detail`, else the body as text, else the status's reason.
    pub(crate) fn detail(&self) -> String {
        if let Ok(problem) = serde_json::from_slice::<serde_json::Value>(&self.body)
            && let Some(detail) = problem.get("detail").and_then(serde_json::Value::as_str)
        {
            return detail.to_owned();
        }
        let text = String::from_utf8_lossy(&self.body).trim().to_owned();
        if text.is_empty() {
            self.status
                .canonical_reason()
                .unwrap_or("no detail")
                .to_owned()
        } else {
            text
        }
    }
}

/// Why an exchange produced no whole answer.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No connection: nothing was sent.
    Connect(String),
    /// No whole answer within the deadline: the request may have been applied.
    Timeout(Duration),
    /// The exchange broke after connecting: the request may have been applied.
    Broken(String),
    /// The answer's body is over [`RESPONSE_BYTES_MAX`].
    TooLarge,
}

/// A pooled HTTP/1 client. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Transport {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Transport {
    pub(crate) fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_millis(CONNECT_TIMEOUT_MS)));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(POOL_IDLE_PER_HOST_MAX)
            .pool_idle_timeout(Duration::from_millis(POOL_IDLE_TIMEOUT_MS))
            .build(connector);
        Self { client }
    }

    /// Sends `request` and reads the whole answer, all within `timeout`.
    pub(crate) async fn exchange(
        &self,
        request: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<Answer, Failure> {
        let work = async {
            let response = self.client.request(request).await.map_err(|e| {
                if e.is_connect() {
                    Failure::Connect(chain(&e))
                } else {
                    Failure::Broken(chain(&e))
                }
            })?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, RESPONSE_BYTES_MAX)
                .collect()
                .await
                .map_err(|e| {
                    if e.downcast_ref::<LengthLimitError>().is_some() {
                        Failure::TooLarge
                    } else {
                        Failure::Broken(format!("reading the response body: {e}"))
                    }
                })?
                .to_bytes();
            Ok(Answer {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| Failure::Timeout(timeout))?
    }
}

/// An error and its sources, `outer: inner: innermost`: hyper's own message alone
/// ("client error (Connect)") does not say what happened.
fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// Milliseconds of a duration, saturating, for messages and wire fields.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_join_paths() {
        let base = BaseUrl::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            base.join("charges/s-1").unwrap().to_string(),
            "http://127.0.0.1:8080/charges/s-1"
        );
        assert_eq!(
            base.join("/ledger/?list").unwrap().to_string(),
            "http://127.0.0.1:8080/ledger/?list"
        );
        let bare = BaseUrl::parse("localhost:9000/store/").unwrap();
        assert_eq!(
            bare.join("/a").unwrap().to_string(),
            "http://localhost:9000/store/a"
        );
        assert!(base.join("has space").is_err());
        assert!(BaseUrl::parse("https://x:1").is_err());
        assert!(BaseUrl::parse("ftp://x:1").is_err());
        assert!(BaseUrl::parse("http://x:1/?q").is_err());
        assert!(BaseUrl::parse("not a url").is_err());
    }
}
