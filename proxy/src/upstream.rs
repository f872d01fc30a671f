//! Where admitted requests go: an HTTP(S) upstream through a pooled client, or the
//! embedded object store in-process.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, Response, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;

use crate::StartError;
use crate::body::ProxyBody;
use crate::config::ConfigError;
use crate::config::ProxyConfig;
use crate::error::ProxyError;
use crate::metrics as m;
use crate::server::Peer;
use crate::tls;

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1). Pre-built names:
/// removing by `&str` would parse and hash the name on every request.
static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// `X-Forwarded-For`.
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// An HTTP(S) upstream.
pub(crate) struct HttpUpstream {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// Scheme and authority of the base URL.
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    /// Path of the base URL without a trailing slash ("" for the root).
    base_path: String,
    timeout: Duration,
    /// One permit per request in flight to the upstream (`limits.upstream_requests_max`).
    permits: Semaphore,
    requests_max: usize,
    /// How long a request may wait for a permit: part of getting a connection, so
    /// `limits.upstream_connect_timeout_ms`.
    permit_timeout: Duration,
}

impl HttpUpstream {
    /// Builds the pooled client for `config.upstream`.
    /// The URL was checked by [`ProxyConfig::validate`]; a URL that still does not parse
    /// is a configuration error naming `upstream`.
    pub(crate) fn new(base: &str, config: &ProxyConfig) -> Result<Self, StartError> {
        let limits = &config.limits;
        let uri: Uri = base
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad_url(base, &e))?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_millis(
            limits.upstream_connect_timeout_ms,
        )));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls::client_config(config.upstream_ca.as_deref())?)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(limits.upstream_idle_per_host)
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        let parts = uri.into_parts();
        Ok(Self {
            client,
            scheme: parts.scheme.unwrap_or(http::uri::Scheme::HTTP),
            authority: parts.authority.ok_or_else(|| bad_url(base, &"no host"))?,
            base_path: parts
                .path_and_query
                .map(|p| p.path().trim_end_matches('/').to_owned())
                .unwrap_or_default(),
            timeout: Duration::from_millis(limits.upstream_timeout_ms),
            permits: Semaphore::new(limits.upstream_requests_max),
            requests_max: limits.upstream_requests_max,
            permit_timeout: Duration::from_millis(limits.upstream_connect_timeout_ms),
        })
    }

    /// Sends `parts` + `body` upstream and returns its response once its head arrived.
    pub(crate) async fn forward(
        &self,
        mut parts: http::request::Parts,
        body: Bytes,
        peer: &Peer,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let path_and_query = parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        let uri = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(format!("{}{}", self.base_path, path_and_query))
            .build()
            .map_err(|e| ProxyError::BadRequest(format!("cannot build upstream URI: {e}")))?;
        strip_hop_by_hop(&mut parts.headers);
        // The client sets Host from the URI, as nginx's proxy_pass does by default.
        parts.headers.remove(header::HOST);
        if let Some(ip) = &peer.forwarded_for {
            parts.headers.append(X_FORWARDED_FOR.clone(), ip.clone());
        }
        let mut request = Request::from_parts(parts, Full::new(body));
        *request.uri_mut() = uri;
        *request.version_mut() = http::Version::HTTP_11;

        let timeout_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let busy = || {
            ProxyError::Unavailable(format!(
                "{} requests are in flight to the upstream and none finished within {} ms",
                self.requests_max,
                self.permit_timeout.as_millis()
            ))
        };
        let _permit = tokio::time::timeout(self.permit_timeout, self.permits.acquire())
            .await
            .map_err(|_| busy())?
            .map_err(|_| busy())?;
        let started = Instant::now();
        let result = tokio::time::timeout(self.timeout, self.client.request(request)).await;
        m::hot_path_handles()
            .upstream_seconds
            .record(started.elapsed().as_secs_f64());
        let response = result
            .map_err(|_| ProxyError::UpstreamTimeout { timeout_ms })?
            .map_err(|e| ProxyError::Upstream(error_chain(&e)))?;
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        Ok(Response::from_parts(parts, body.boxed()))
    }
}

/// Removes hop-by-hop headers, including any named by `Connection`. Most requests have
/// none, so each name is looked up before anything is removed or allocated.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if let Some(connection) = headers.get(header::CONNECTION) {
        let named: Vec<HeaderName> = connection
            .to_str()
            .unwrap_or("")
            .split(',')
            .filter_map(|s| HeaderName::from_bytes(s.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        if headers.contains_key(name) {
            headers.remove(name);
        }
    }
}

/// An error with its sources, so "connection refused" is not hidden behind "client error".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn bad_url(base: &str, reason: &dyn std::fmt::Display) -> StartError {
    StartError::Config(ConfigError::Invalid {
        field: "upstream".to_owned(),
        reason: format!("{base:?} is not a usable URL: {reason}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use palisade_protocol::headers::FENCING_TOKEN;

    /// Goal: hop-by-hop headers, and headers named by `Connection`, are never forwarded;
    /// the fencing token is.
    /// Method: strip a header map holding both kinds.
    #[test]
    fn hop_by_hop_headers_and_connection_named_ones_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert(FENCING_TOKEN, HeaderValue::from_static("5"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h[FENCING_TOKEN], "5");
    }
}
