//! Where admitted requests go: an HTTP(S) upstream through the proxy's own connection
//! pool ([`pool`]), or the embedded object store in-process.
//!
//! The request head is prepared once per request with as little work as the common case
//! allows: the client's origin-form URI goes on unchanged when the upstream URL has no
//! base path, and hop-by-hop headers are found by comparing names, not by parsing.

mod deadline;
pub(crate) mod h1;
mod pool;

pub(crate) use pool::set_thread_shard;

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::Either;

use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::sync::Semaphore;

use self::deadline::Deadlined;
use self::pool::{Checkout, Pool, PooledBody, Sender};

use crate::StartError;
use crate::body::ProxyBody;
use crate::config::ConfigError;
use crate::config::{Http1Client, ProxyConfig, UpstreamHost};
use crate::error::ProxyError;
use crate::metrics as m;
use crate::server::Peer;
use crate::stream::{BodyFault, Exchange, UpstreamBody};
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
    /// Its connections.
    pool: Arc<Pool>,
    /// Scheme and authority of the base URL.
    scheme: Scheme,
    authority: http::uri::Authority,
    /// `Host` for `upstream_host = "upstream"`: the base URL's authority. `None` (the
    /// default, `"client"`): the client's `Host` is forwarded unchanged.
    host: Option<HeaderValue>,
    /// `Host` for a request that has none at all (an HTTP/1.0 client): the upstream's
    /// host, with its port unless it is the scheme's default.
    fallback_host: HeaderValue,
    /// The request target of a `CONNECT`: the upstream's authority.
    connect_target: Uri,
    /// `trusted_proxies`: peers whose `X-Forwarded-For` is appended to.
    trusted_proxies: Vec<IpAddr>,
    /// Path of the base URL without a trailing slash ("" for the root).
    base_path: String,
    /// Requests that cannot upgrade go through the proxy's own HTTP/1 exchange
    /// ([`h1`]): a plain `http://` upstream, with `upstream_http1_client = "own"`.
    own_http1: bool,
    timeout: Duration,
    /// One permit per request in flight to the upstream (`limits.upstream_requests_max`).
    /// async-lock's rather than tokio's: every data-path thread takes and gives one per
    /// request, and tokio's takes its waiters' mutex at each release, a lock the threads
    /// shared; this one's release is an atomic add, with a notification only when some
    /// request waits. Unlike tokio's it is not first-come first-served while the limit is
    /// reached: a request arriving as a permit frees can take it before one that waits,
    /// which then waits on, at most `permit_timeout` as before.
    permits: async_lock::Semaphore,
    requests_max: usize,
    /// How long a request may wait for a permit: part of getting a connection, so
    /// `limits.upstream_connect_timeout_ms`.
    permit_timeout: Duration,
    /// One permit per request without a fencing token whose body is still arriving when
    /// it goes upstream (`limits.unfenced_streams_max`), taken before its slot: slow
    /// anonymous bodies can hold no more slots than this, and the rest stay free for
    /// fenced writes.
    unfenced_streams: Semaphore,
    unfenced_streams_max: usize,
}

impl HttpUpstream {
    /// Builds the connection pool for `config.upstream`.
    /// The URL was checked by [`ProxyConfig::validate`]; a URL that still does not parse
    /// is a configuration error naming `upstream`.
    pub(crate) fn new(base: &str, config: &ProxyConfig) -> Result<Self, StartError> {
        let limits = &config.limits;
        let uri: Uri = base
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad_url(base, &e))?;
        let parts = uri.into_parts();
        let authority = parts.authority.ok_or_else(|| bad_url(base, &"no host"))?;
        let scheme = parts.scheme.unwrap_or(Scheme::HTTP);
        let host = match config.upstream_host {
            UpstreamHost::Client => None,
            UpstreamHost::Upstream => {
                Some(HeaderValue::from_str(authority.as_str()).map_err(|e| bad_url(base, &e))?)
            }
        };
        let default_port = if scheme == Scheme::HTTPS { 443 } else { 80 };
        let fallback_host = match authority.port_u16() {
            Some(port) if port != default_port => HeaderValue::from_str(authority.as_str()),
            _ => HeaderValue::from_str(authority.host()),
        }
        .map_err(|e| bad_url(base, &e))?;
        let connect_target = Uri::try_from(authority.as_str()).map_err(|e| bad_url(base, &e))?;
        let tls = if scheme == Scheme::HTTPS {
            tls::client_config(config.upstream_ca.as_deref())?
        } else {
            // Unused for `http://`; an empty root store reads no files.
            rustls::ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        };
        let pool = Pool::new(
            &scheme,
            &authority,
            tls,
            Duration::from_millis(limits.upstream_connect_timeout_ms),
            limits.upstream_idle_per_host,
            config.data_threads(),
        )?;
        let own_http1 = scheme == Scheme::HTTP && config.upstream_http1_client == Http1Client::Own;
        Ok(Self {
            pool: Arc::new(pool),
            own_http1,
            scheme,
            authority,
            host,
            fallback_host,
            connect_target,
            trusted_proxies: config.trusted_proxies.clone(),
            base_path: parts
                .path_and_query
                .map(|p| p.path().trim_end_matches('/').to_owned())
                .unwrap_or_default(),
            timeout: Duration::from_millis(limits.upstream_timeout_ms),
            permits: async_lock::Semaphore::new(limits.upstream_requests_max),
            requests_max: limits.upstream_requests_max,
            permit_timeout: Duration::from_millis(limits.upstream_connect_timeout_ms),
            unfenced_streams: Semaphore::new(limits.unfenced_streams_max()),
            unfenced_streams_max: limits.unfenced_streams_max(),
        })
    }

    /// The request as it goes upstream, from the client's `parts` and `body`: hop-by-hop
    /// headers stripped, `Host`, `X-Forwarded-For` and the request target set for the
    /// upstream, and `Upgrade` passed on when `upgrade` (the route lets this request
    /// upgrade).
    ///
    /// Apart from [`HttpUpstream::forward`], and not async: a future keeps room for
    /// every value it holds across an await, and its arguments stay there even once moved
    /// on, so building the request in the future would keep `parts` twice for as long as
    /// the request is in flight.
    pub(crate) fn prepare(
        &self,
        mut parts: http::request::Parts,
        body: UpstreamBody,
        peer: &Peer,
        upgrade: bool,
    ) -> Result<Request<UpstreamBody>, ProxyError> {
        let te_trailers = wants_trailers(&parts.headers);
        let protocol = upgrade
            .then(|| parts.headers.get(header::UPGRADE).cloned())
            .flatten();
        strip_hop_by_hop(&mut parts.headers);
        // The one hop-by-hop exchange passed on: the route allows it.
        pass_upgrade(&mut parts.headers, protocol);
        if te_trailers {
            // The client takes response trailers: ask the upstream for them on this hop.
            parts
                .headers
                .insert(header::TE, HeaderValue::from_static("trailers"));
        }
        self.set_host(&mut parts);
        self.set_forwarded_for(&mut parts.headers, peer);
        // The request line of an HTTP/1 upstream needs only the path and query (the
        // `Host` header is set apart). An HTTP/1 client's origin-form target already is
        // that, and goes on as it is, shared rather than copied, unless the upstream URL
        // has a base path. An HTTP/2 client's absolute URI is cut down to it.
        if parts.method == Method::CONNECT {
            parts.uri = self.connect_target.clone();
        } else if !self.base_path.is_empty() {
            let pq = parts.uri.path_and_query().map_or("/", PathAndQuery::as_str);
            let joined = PathAndQuery::try_from(format!("{}{pq}", self.base_path))
                .map_err(|e| ProxyError::BadRequest(format!("cannot build upstream URI: {e}")))?;
            parts.uri = Uri::from(joined);
        } else if parts.uri.scheme().is_some() || parts.uri.authority().is_some() {
            parts.uri = parts
                .uri
                .path_and_query()
                .cloned()
                .map_or_else(Uri::default, Uri::from);
        }
        parts.version = http::Version::HTTP_11;
        Ok(Request::from_parts(parts, body))
    }

    /// Sends a [prepared](HttpUpstream::prepare) request upstream and returns its
    /// response once its head arrived.
    ///
    /// The body streams while this waits. The upstream's timeout counts from the body's
    /// last progress (`exchange`), not from the start, so a long upload is not cut off
    /// for its length; a body whose client stalls is cut off by its own idle timeout. A
    /// body cut off before the upstream answered is answered with the body's fault (413,
    /// 408, 400), as the upstream never saw a whole request.
    ///
    /// `upgrade` is the client connection's upgrade, for a request its route lets
    /// upgrade: when the upstream switches protocols (101) the answer comes with the
    /// [`Tunnel`] to run between the two upgraded connections.
    ///
    /// `unfenced_stream`: the request has no fencing token and its body is still
    /// arriving; it takes one of `limits.unfenced_streams_max` permits before its slot,
    /// and holds both until the answer's head.
    #[expect(
        clippy::manual_async_fn,
        reason = "an `async fn` keeps its arguments twice"
    )]
    pub(crate) fn forward(
        &self,
        request: Request<UpstreamBody>,
        exchange: Option<&Arc<Exchange>>,
        upgrade: Option<OnUpgrade>,
        unfenced_stream: bool,
    ) -> impl Future<Output = Result<(Response<ProxyBody>, Option<Tunnel>), ProxyError>> {
        // Not an `async fn`, which would keep `request` twice in its future (as passed,
        // and bound again inside) for as long as the request is in flight.
        async move {
            let timeout_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
            let busy = || {
                ProxyError::Unavailable(format!(
                    "{} requests are in flight to the upstream and none finished within {} ms",
                    self.requests_max,
                    self.permit_timeout.as_millis()
                ))
            };
            let _stream = if unfenced_stream {
                Some(self.unfenced_stream_permit().await?)
            } else {
                None
            };
            // A free permit (the usual case) is taken without starting a timer.
            let _permit = match self.permits.try_acquire() {
                Some(permit) => permit,
                None => tokio::time::timeout(self.permit_timeout, self.permits.acquire())
                    .await
                    .map_err(|_| busy())?,
            };
            // A request that may upgrade needs hyper's upgrade support.
            let own = self.own_http1 && upgrade.is_none() && request.method() != Method::CONNECT;
            let started = palisade_server::clock::tokio_now();
            let result = self.send(request, exchange, started, own).await;
            m::hot_path_handles().upstream_seconds.record(
                palisade_server::clock::tokio_now()
                    .saturating_duration_since(started)
                    .as_secs_f64(),
            );
            let (response, mut conn) =
                match result.ok_or(ProxyError::UpstreamTimeout { timeout_ms })?? {
                    Answer::Hyper(response, conn) => (response, conn),
                    Answer::Own(response) => {
                        let (parts, body) = response.into_parts();
                        if parts.status == http::StatusCode::SWITCHING_PROTOCOLS {
                            return Err(unasked_upgrade());
                        }
                        // Its hop-by-hop headers were left out as its head was parsed.
                        return Ok((Response::from_parts(parts, body.boxed()), None));
                    }
                };
            let (mut parts, body) = response.into_parts();
            refuse_transfer_codings(&parts.headers)?;
            let switched = parts.status == http::StatusCode::SWITCHING_PROTOCOLS;
            let tunnel = match (switched, upgrade) {
                (true, Some(client)) => {
                    let upstream = parts.extensions.remove::<OnUpgrade>().ok_or_else(|| {
                        ProxyError::Upstream(
                            "101 from the upstream without an upgradable connection".to_owned(),
                        )
                    })?;
                    Some(Tunnel {
                        client,
                        upstream,
                        _sender: conn.take(),
                    })
                }
                (true, None) => return Err(unasked_upgrade()),
                (false, _) => None,
            };
            let protocol = tunnel
                .as_ref()
                .and_then(|_| parts.headers.get(header::UPGRADE).cloned());
            strip_hop_by_hop(&mut parts.headers);
            pass_upgrade(&mut parts.headers, protocol);
            let body = match (&tunnel, conn) {
                // An HTTP/1 connection goes back to the pool when this body has ended.
                (None, Some(Sender::Http1(sender))) => {
                    PooledBody::new(body, Some((Arc::clone(&self.pool), sender)))
                }
                _ => PooledBody::new(body, None),
            };
            Ok((Response::from_parts(parts, body.boxed()), tunnel))
        }
    }
}

/// What came back from the upstream: an answer from a connection hyper runs (with its
/// sending half, to pool or to keep for a tunnel), or one from the proxy's own exchange.
enum Answer {
    Hyper(Response<Incoming>, Option<Sender>),
    Own(Response<h1::OwnBody>),
}

/// The answer of the proxy's own exchange.
fn own_answer(answer: Result<Response<h1::OwnBody>, ProxyError>) -> Result<Answer, ProxyError> {
    answer.map(Answer::Own)
}

/// A 101 to a request that asked for no upgrade.
fn unasked_upgrade() -> ProxyError {
    ProxyError::Upstream(
        "the upstream switched protocols (101) for a request that asked for no upgrade".to_owned(),
    )
}

/// The two upgraded connections of a request whose upstream switched protocols (101):
/// bytes are copied both ways until either side closes.
pub(crate) struct Tunnel {
    client: OnUpgrade,
    upstream: OnUpgrade,
    /// The upstream connection's sending half, kept until the tunnel ends so that its
    /// connection is not told to close before the upgrade has taken it over.
    _sender: Option<Sender>,
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
    /// A permit of `limits.unfenced_streams_max`: at once when one is free, else within
    /// the connect timeout, like a slot.
    async fn unfenced_stream_permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>, ProxyError> {
        if let Ok(permit) = self.unfenced_streams.try_acquire() {
            return Ok(permit);
        }
        let full = || ProxyError::UnfencedStreamsFull {
            max: self.unfenced_streams_max,
            waited_ms: u64::try_from(self.permit_timeout.as_millis()).unwrap_or(u64::MAX),
        };
        tokio::time::timeout(self.permit_timeout, self.unfenced_streams.acquire())
            .await
            .map_err(|_| full())?
            .map_err(|_| full())
    }

    /// Sends the request and waits for the response head, until the upstream has been
    /// quiet for the upstream timeout: no answer and no body taken for that long. `None`
    /// is that timeout. Getting a connection counts as part of the wait.
    ///
    /// Not an `async fn`: the exchange's future is made here and held once, inline in
    /// [`Deadlined`], instead of being moved into a second future of its own.
    fn send<'a>(
        &'a self,
        request: Request<UpstreamBody>,
        exchange: Option<&'a Arc<Exchange>>,
        start: tokio::time::Instant,
        own: bool,
    ) -> impl Future<Output = Option<Result<Answer, ProxyError>>> + 'a {
        let timeout = self.timeout;
        let late = move || match exchange {
            Some(exchange) => exchange.upstream_deadline(timeout),
            None => Some(start + timeout),
        };
        Deadlined::new(self.exchange(request, own), late, timeout)
    }

    /// Takes a connection and sends the request on it.
    ///
    /// A pooled connection can turn out closed (the upstream closed it while it was
    /// idle) after it was taken: hyper then hands the request back unsent, and it is
    /// tried again on another connection. Only then: once hyper has begun writing a
    /// request, it does not hand it back, and the request is never sent twice. A new
    /// connection that fails is the upstream's failure, not tried again.
    ///
    /// With `own`, the proxy's own HTTP/1 exchange sends it, on a connection checked
    /// open before the request is written ([`h1`]).
    ///
    /// Not an `async fn`: each way is a future of its own, made here, so that a request
    /// on one does not carry the other's room, and neither keeps `request` twice.
    fn exchange(
        &self,
        request: Request<UpstreamBody>,
        own: bool,
    ) -> impl Future<Output = Result<Answer, ProxyError>> + '_ {
        if !own {
            return Either::Right(self.exchange_hyper(request));
        }
        // A pooled connection (the usual case) is taken without an await, and the
        // exchange's future is all this holds. A dial is boxed: a request that finds a
        // connection should not carry the dial's room, nor the request a second time.
        Either::Left(match self.pool.take_idle_own() {
            Some(conn) => Either::Left(h1::exchange(conn, request, &self.pool).map(own_answer)),
            None => Either::Right(Box::pin(async move {
                let conn = self.pool.dial_own().await?;
                own_answer(h1::exchange(conn, request, &self.pool).await)
            })),
        })
    }

    /// [`exchange`](Self::exchange) on a connection hyper runs.
    #[expect(
        clippy::manual_async_fn,
        reason = "an `async fn` keeps its arguments twice"
    )]
    fn exchange_hyper(
        &self,
        mut request: Request<UpstreamBody>,
    ) -> impl Future<Output = Result<Answer, ProxyError>> + '_ {
        async move {
            loop {
                let Checkout { sender, reused } = self.pool.take().await?;
                let (sent, sender) = match sender {
                    Sender::Http1(mut h1) => {
                        (h1.try_send_request(request).await, Sender::Http1(h1))
                    }
                    Sender::Http2(mut h2) => {
                        // HTTP/2 carries the target as `:scheme`, `:authority` and `:path`.
                        let path = request.uri().path_and_query().cloned();
                        *request.uri_mut() = self.absolute(path);
                        (h2.try_send_request(request).await, Sender::Http2(h2))
                    }
                };
                match sent {
                    Ok(response) => return Ok(Answer::Hyper(response, Some(sender))),
                    Err(mut e) => match e.take_message() {
                        Some(mut unsent) if reused => {
                            tracing::debug!(cause = %e.error(), "pooled upstream connection closed before the request was sent; trying another");
                            if let Sender::Http2(_) = sender {
                                let path = unsent.uri().path_and_query().cloned();
                                *unsent.uri_mut() = path.map_or_else(Uri::default, Uri::from);
                            }
                            request = unsent;
                        }
                        _ => {
                            let e = e.into_error();
                            return Err(match BodyFault::find(&e) {
                                // The client's body failed, not the upstream: answer with
                                // its fault.
                                Some(fault) => fault.to_proxy_error(),
                                None => ProxyError::Upstream(error_chain(&e)),
                            });
                        }
                    },
                }
            }
        }
    }

    /// The upstream's absolute URI for `path`, for HTTP/2.
    fn absolute(&self, path: Option<PathAndQuery>) -> Uri {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(path.unwrap_or_else(|| PathAndQuery::from_static("/")));
        // Scheme, authority and path each parsed already: the parts always make a URI.
        Uri::from_parts(parts).unwrap_or_default()
    }

    /// `Host`: the client's, unchanged, by default (an HTTP/2 client's `:authority`
    /// when it sent no `Host`); the upstream's authority with `upstream_host = "upstream"`.
    /// Runs before the URI is cut down to its path.
    fn set_host(&self, parts: &mut http::request::Parts) {
        if let Some(host) = &self.host {
            parts.headers.insert(header::HOST, host.clone());
        } else if parts.headers.contains_key(header::HOST) {
            // The client's, checked (`framing::check_host`): it goes on as it is.
        } else if let Some(authority) = parts.uri.authority()
            && let Ok(value) = HeaderValue::from_str(authority.as_str())
        {
            parts.headers.insert(header::HOST, value);
        } else {
            // HTTP/1.1 requires `Host`: a client that sent none (HTTP/1.0) gets the
            // upstream's.
            parts
                .headers
                .insert(header::HOST, self.fallback_host.clone());
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

/// Refuses an answer whose body has transfer codings besides `chunked` (`gzip,
/// chunked`): hyper undoes only `chunked`, and the proxy re-frames the body for its own
/// hop, so the other codings would be lost and the client would get bytes it cannot
/// read. Most answers have no `Transfer-Encoding` or just `chunked`: one lookup.
fn refuse_transfer_codings(headers: &HeaderMap) -> Result<(), ProxyError> {
    match crate::framing::unsupported_codings(headers) {
        None => Ok(()),
        Some(codings) => Err(ProxyError::Upstream(format!(
            "the upstream's answer has Transfer-Encoding {codings:?}; the proxy forwards \
             only chunked, and would have to drop the other codings"
        ))),
    }
}

/// Whether the client's `TE` accepts trailers. Most requests have no `TE`: one lookup.
fn wants_trailers(headers: &HeaderMap) -> bool {
    headers.get_all(header::TE).iter().any(|v| {
        tokens(v.as_bytes()).any(|t| {
            let coding = t.split(|&b| b == b';').next().unwrap_or_default();
            trim(coding).eq_ignore_ascii_case(b"trailers")
        })
    })
}

/// The comma-separated tokens of a header value, spaces around them trimmed.
fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(trim)
}

fn trim(token: &[u8]) -> &[u8] {
    token.trim_ascii()
}

/// Puts back the upgrade that [`strip_hop_by_hop`] removed, for an exchange whose route
/// allows upgrades (`protocol` is its `Upgrade` value; `None`: nothing to pass on).
fn pass_upgrade(headers: &mut HeaderMap, protocol: Option<HeaderValue>) {
    if let Some(protocol) = protocol {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, protocol);
    }
}

/// Removes hop-by-hop headers, including any named by `Connection`.
///
/// It runs twice per request (on the request and on the response), so the common case
/// only compares: a `Connection` header that names nothing beyond `keep-alive`, `close`
/// or other names already on the list (the usual case, checked once per value) adds no
/// names, and then each name present is compared with the fixed list alone. Only
/// names found present are removed, one lookup each. Only a `Connection` that names
/// other headers has its names parsed, once.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let mut named: Vec<HeaderName> = Vec::new();
    for value in headers.get_all(header::CONNECTION) {
        let value = value.as_bytes();
        // The usual values, whole: nothing to split.
        if value.eq_ignore_ascii_case(b"keep-alive") || value.eq_ignore_ascii_case(b"close") {
            continue;
        }
        for token in tokens(value) {
            let known = token.is_empty()
                || token.eq_ignore_ascii_case(b"close")
                || HOP_BY_HOP
                    .iter()
                    .any(|name| token.eq_ignore_ascii_case(name.as_str().as_bytes()));
            if !known && let Ok(name) = HeaderName::from_bytes(token) {
                named.push(name);
            }
        }
    }
    while let Some(name) = headers
        .keys()
        .find(|name| HOP_BY_HOP.contains(name))
        .cloned()
    {
        headers.remove(&name);
    }
    // Each name `Connection` lists is removed by one lookup. Matching every header
    // against the list instead would let a client that lists thousands of names (as many
    // as `limits.header_bytes_max` holds) and sends many headers make each of its
    // requests cost their product.
    for name in &named {
        headers.remove(name);
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

    /// Goal: a hostile `Connection` list (thousands of names, most of them absent, some
    /// repeated) still removes exactly the headers it names and nothing else.
    /// Method: 3,000 names, of which `x-h0` to `x-h49` are among 100 headers sent; strip.
    #[test]
    fn a_long_connection_list_removes_exactly_the_named_headers() {
        let mut h = HeaderMap::new();
        let list: Vec<String> = (0..3_000).map(|i| format!("x-h{}", i % 1_500)).collect();
        h.insert(
            "connection",
            HeaderValue::from_str(&list[..].join(",")).unwrap(),
        );
        for i in 0..50 {
            h.insert(
                HeaderName::from_bytes(format!("x-h{i}").as_bytes()).unwrap(),
                HeaderValue::from_static("named"),
            );
            h.insert(
                HeaderName::from_bytes(format!("x-kept{i}").as_bytes()).unwrap(),
                HeaderValue::from_static("kept"),
            );
        }
        strip_hop_by_hop(&mut h);
        assert_eq!(
            h.len(),
            50,
            "only the 50 unnamed headers stay: {:?}",
            h.keys()
        );
        assert!(h.values().all(|v| v == "kept"));
    }

    /// Goal: a `Connection` header naming only `keep-alive` or `close` (any case) adds
    /// nothing to remove, and one spread over several header lines has every line's
    /// names removed.
    /// Method: strip header maps with such `Connection` values.
    #[test]
    fn connection_tokens_on_every_line_count_and_plain_keep_alive_removes_only_itself() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("Keep-Alive"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h["x-kept"], "1");

        let mut h = HeaderMap::new();
        h.append("connection", HeaderValue::from_static("close"));
        h.append("connection", HeaderValue::from_static("x-first"));
        h.append("connection", HeaderValue::from_static(" , X-Second"));
        h.insert("x-first", HeaderValue::from_static("1"));
        h.insert("x-second", HeaderValue::from_static("2"));
        h.insert("x-kept", HeaderValue::from_static("3"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h["x-kept"], "3");
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
