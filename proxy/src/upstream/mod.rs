//! Where admitted requests go: an HTTP(S) upstream through a pooled client, or the
//! embedded object store in-process.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Uri, header};
use http_body_util::BodyExt;
use hyper::upgrade::OnUpgrade;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::Semaphore;

use crate::StartError;
use crate::body::ProxyBody;
use crate::config::ConfigError;
use crate::config::{ProxyConfig, UpstreamHost};
use crate::error::ProxyError;
use crate::metrics as m;
use crate::server::Peer;
use crate::stream::{BodyFault, Exchange, RequestBody};
use crate::tls;

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1). Pre-built names:
/// removing by `&str` would parse and hash the name on every request.
///
/// `Trailer` is not among them: it describes the message, not the hop, and hyper sends
/// an HTTP/1 chunked message's trailers only when `Trailer` declares them. `TE` is, but
/// its `trailers` token is carried over (see [`HttpUpstream::forward`]). `Expect` is
/// answered by the proxy itself (hyper sends `100 Continue` when the body is first read,
/// after admission), so it is not passed on either.
static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::EXPECT,
];

/// `X-Forwarded-For`.
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// An HTTP(S) upstream.
pub(crate) struct HttpUpstream {
    client: Client<HttpsConnector<HttpConnector>, RequestBody>,
    /// Scheme and authority of the base URL.
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    /// `Host` for `upstream_host = "upstream"`: the base URL's authority. `None` (the
    /// default, `"client"`): the client's `Host` is forwarded unchanged.
    host: Option<HeaderValue>,
    /// `trusted_proxies`: peers whose `X-Forwarded-For` is appended to.
    trusted_proxies: Vec<IpAddr>,
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
        let authority = parts.authority.ok_or_else(|| bad_url(base, &"no host"))?;
        let host = match config.upstream_host {
            UpstreamHost::Client => None,
            UpstreamHost::Upstream => {
                Some(HeaderValue::from_str(authority.as_str()).map_err(|e| bad_url(base, &e))?)
            }
        };
        Ok(Self {
            client,
            scheme: parts.scheme.unwrap_or(http::uri::Scheme::HTTP),
            authority,
            host,
            trusted_proxies: config.trusted_proxies.clone(),
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
    ///
    /// The body streams while this waits. The upstream's timeout counts from the body's
    /// last progress (`exchange`), not from the start, so a long upload is not cut off
    /// for its length; a body whose client stalls is cut off by its own idle timeout. A
    /// body cut off before the upstream answered is answered with the body's fault (413,
    /// 408, 400), as the upstream never saw a whole request.
    ///
    /// `upgrade` is the client connection's upgrade, for a request its route lets
    /// upgrade: the request goes with its `Upgrade` header, and when the upstream
    /// switches protocols (101) the answer comes with the [`Tunnel`] to run between the
    /// two upgraded connections.
    pub(crate) async fn forward(
        &self,
        mut parts: http::request::Parts,
        body: RequestBody,
        exchange: Option<&Arc<Exchange>>,
        peer: &Peer,
        upgrade: Option<OnUpgrade>,
    ) -> Result<(Response<ProxyBody>, Option<Tunnel>), ProxyError> {
        let cannot =
            |e: http::Error| ProxyError::BadRequest(format!("cannot build upstream URI: {e}"));
        // Without a base path (the usual case) the client's path and query go as they
        // are, shared rather than copied.
        let path_and_query = match parts.uri.path_and_query() {
            Some(pq) if self.base_path.is_empty() => pq.clone(),
            pq => PathAndQuery::try_from(format!(
                "{}{}",
                self.base_path,
                pq.map_or("/", PathAndQuery::as_str)
            ))
            .map_err(|e| cannot(e.into()))?,
        };
        let uri = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path_and_query)
            .build()
            .map_err(cannot)?;
        let te_trailers = wants_trailers(&parts.headers);
        let protocol = upgrade
            .is_some()
            .then(|| parts.headers.get(header::UPGRADE).cloned())
            .flatten();
        strip_hop_by_hop(&mut parts.headers);
        if let Some(protocol) = protocol {
            // The one hop-by-hop exchange passed on: the route allows it.
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            parts.headers.insert(header::UPGRADE, protocol);
        }
        if te_trailers {
            // The client takes response trailers: ask the upstream for them on this hop.
            parts
                .headers
                .insert(header::TE, HeaderValue::from_static("trailers"));
        }
        self.set_host(&mut parts);
        self.set_forwarded_for(&mut parts.headers, peer);
        let mut request = Request::from_parts(parts, body);
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
        let result = self.send(request, exchange).await;
        m::hot_path_handles()
            .upstream_seconds
            .record(started.elapsed().as_secs_f64());
        let response = result
            .ok_or(ProxyError::UpstreamTimeout { timeout_ms })?
            .map_err(|e| match BodyFault::find(&e) {
                // The client's body failed, not the upstream: answer with its fault.
                Some(fault) => fault.to_proxy_error(),
                None => ProxyError::Upstream(error_chain(&e)),
            })?;
        let (mut parts, body) = response.into_parts();
        let switched = parts.status == http::StatusCode::SWITCHING_PROTOCOLS;
        let tunnel = match (switched, upgrade) {
            (true, Some(client)) => {
                let upstream = parts.extensions.remove::<OnUpgrade>().ok_or_else(|| {
                    ProxyError::Upstream(
                        "101 from the upstream without an upgradable connection".to_owned(),
                    )
                })?;
                Some(Tunnel { client, upstream })
            }
            (true, None) => {
                return Err(ProxyError::Upstream(
                    "the upstream switched protocols (101) for a request that asked for no upgrade"
                        .to_owned(),
                ));
            }
            (false, _) => None,
        };
        let protocol = tunnel
            .as_ref()
            .and_then(|_| parts.headers.get(header::UPGRADE).cloned());
        strip_hop_by_hop(&mut parts.headers);
        if let Some(protocol) = protocol {
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            parts.headers.insert(header::UPGRADE, protocol);
        }
        Ok((Response::from_parts(parts, body.boxed()), tunnel))
    }
}

/// The two upgraded connections of a request whose upstream switched protocols (101):
/// bytes are copied both ways until either side closes.
pub(crate) struct Tunnel {
    client: OnUpgrade,
    upstream: OnUpgrade,
}

impl Tunnel {
    /// Copies both ways until either side closes or fails; the caller holds the
    /// request's in-flight guard meanwhile.
    pub(crate) async fn run(self) {
        let (client, upstream) = tokio::join!(self.client, self.upstream);
        let (client, upstream) = match (client, upstream) {
            (Ok(c), Ok(u)) => (c, u),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(cause = %e, "upgrade failed; no tunnel");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut upstream = TokioIo::new(upstream);
        match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok((up, down)) => tracing::debug!(up, down, "tunnel closed"),
            Err(e) => tracing::debug!(cause = %e, "tunnel ended with an error"),
        }
    }
}

impl HttpUpstream {
    /// Sends the request and waits for the response head, until the upstream has been
    /// quiet for the upstream timeout: no answer and no body taken for that long. `None`
    /// is that timeout.
    async fn send(
        &self,
        request: Request<RequestBody>,
        exchange: Option<&Arc<Exchange>>,
    ) -> Option<Result<Response<hyper::body::Incoming>, hyper_util::client::legacy::Error>> {
        let start = tokio::time::Instant::now();
        let mut send = std::pin::pin!(self.client.request(request));
        loop {
            let deadline = match exchange {
                Some(exchange) => exchange.upstream_deadline(self.timeout),
                None => Some(start + self.timeout),
            };
            // While the body waits for its client, the body's idle timeout applies, not
            // this one; look again a timeout later.
            let wake = deadline.unwrap_or_else(|| tokio::time::Instant::now() + self.timeout);
            tokio::select! {
                result = &mut send => return Some(result),
                () = tokio::time::sleep_until(wake) => {}
            }
            let now = tokio::time::Instant::now();
            let late = match exchange {
                Some(exchange) => exchange
                    .upstream_deadline(self.timeout)
                    .is_some_and(|d| d <= now),
                None => true,
            };
            if late {
                return None;
            }
        }
    }

    /// `Host`: the client's, unchanged, by default (an HTTP/2 client's `:authority`
    /// when it sent no `Host`); the upstream's authority with `upstream_host = "upstream"`.
    fn set_host(&self, parts: &mut http::request::Parts) {
        if let Some(host) = &self.host {
            parts.headers.insert(header::HOST, host.clone());
        } else if !parts.headers.contains_key(header::HOST)
            && let Some(authority) = parts.uri.authority()
            && let Ok(value) = HeaderValue::from_str(authority.as_str())
        {
            parts.headers.insert(header::HOST, value);
        }
    }

    /// `X-Forwarded-For`: the peer's IP, replacing whatever the client claimed, unless
    /// the peer is a trusted proxy, whose value is kept and appended to.
    fn set_forwarded_for(&self, headers: &mut HeaderMap, peer: &Peer) {
        let Some(ip) = &peer.forwarded_for else {
            headers.remove(&X_FORWARDED_FOR);
            return;
        };
        if self.is_trusted(ip) {
            headers.append(X_FORWARDED_FOR.clone(), ip.clone());
        } else {
            headers.insert(X_FORWARDED_FOR.clone(), ip.clone());
        }
    }

    fn is_trusted(&self, ip: &HeaderValue) -> bool {
        !self.trusted_proxies.is_empty()
            && ip
                .to_str()
                .ok()
                .and_then(|s| s.parse::<IpAddr>().ok())
                .is_some_and(|ip| self.trusted_proxies.contains(&ip))
    }
}

/// Whether the client's `TE` accepts trailers.
fn wants_trailers(headers: &HeaderMap) -> bool {
    headers.get_all(header::TE).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',').any(|t| {
                t.split(';')
                    .next()
                    .is_some_and(|t| t.trim().eq_ignore_ascii_case("trailers"))
            })
        })
    })
}

/// Removes hop-by-hop headers, including any named by `Connection`.
///
/// It runs twice per request (on the request and on the response), so it only compares:
/// each name present is compared with the list and with the tokens of `Connection`, and
/// only names found present are removed, one lookup each. Most requests have none; most
/// responses have `Connection: keep-alive` alone. Nothing is allocated and no name is
/// parsed or hashed for a header that is not there.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Owned (a reference count), so the map can change while its tokens are consulted.
    let connection = headers.get(header::CONNECTION).cloned();
    let tokens = connection.as_ref().and_then(|v| v.to_str().ok());
    let hop_by_hop = |name: &HeaderName| {
        HOP_BY_HOP.contains(name)
            || tokens.is_some_and(|tokens| {
                tokens
                    .split(',')
                    .any(|token| token.trim().eq_ignore_ascii_case(name.as_str()))
            })
    };
    while let Some(name) = headers.keys().find(|name| hop_by_hop(name)).cloned() {
        headers.remove(&name);
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

    /// Goal: hop-by-hop headers (`Expect` and `TE` included), and headers named by
    /// `Connection` (in any case, with spaces around), are never forwarded; the fencing
    /// token and `Trailer` are.
    /// Method: strip a header map holding both kinds.
    #[test]
    fn hop_by_hop_headers_and_connection_named_ones_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret,X-Other , close"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("x-other", HeaderValue::from_static("2"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("expect", HeaderValue::from_static("100-continue"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("trailer", HeaderValue::from_static("x-checksum"));
        h.insert(FENCING_TOKEN, HeaderValue::from_static("5"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h[FENCING_TOKEN], "5");
        assert_eq!(
            h["trailer"], "x-checksum",
            "Trailer describes the message, not the hop"
        );
    }

    /// Goal: `TE: trailers` is recognised in any case and among other codings, and only
    /// the `trailers` token counts.
    /// Method: test header values.
    #[test]
    fn te_trailers_is_recognised() {
        let te = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("te", HeaderValue::from_static(v));
            wants_trailers(&h)
        };
        assert!(te("trailers"));
        assert!(te("gzip, Trailers"));
        assert!(!te("gzip"));
        assert!(!te("trailersx"));
        assert!(!wants_trailers(&HeaderMap::new()));
    }
}
