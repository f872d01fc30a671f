//! One client request through the proxy, in fixed phases sharing one context:
//! parse, classify, check the proof, fence, forward (streaming the body), respond, log.
//!
//! Everything before forwarding uses the request head alone. The body is not polled
//! until the request is admitted, so a refused write is answered before its client sends
//! any body (hyper sends `100 Continue` only when the body is first polled).

use std::borrow::Cow;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::Either;
use http::{HeaderMap, Method, Request, Response};
use hyper::body::{Body, Incoming};
use palisade_protocol::headers::{FENCING_TOKEN, FENCING_TOKEN_PROOF};
use palisade_protocol::parse_token_header;
use palisade_protocol::process::events;
use palisade_storage::ObjectStore;

use crate::body::ProxyBody;
use crate::config::ProxyConfig;
use crate::error::{Cause, ProxyError};
use crate::fencing::Fencer;
use crate::fleet::{Admission, Lease};
use crate::framing;
use crate::metrics as m;
use crate::proof::ProofVerifier;
use crate::routing::{Class, Classifier};
use crate::server::Peer;
use crate::stream::{BodyLimits, Exchange, RequestBody, UpstreamBody};
use crate::upstream::HttpUpstream;

/// Log lines a second, at most, for requests refused for a missing or invalid proof:
/// anyone can cause those without a credential, so past this rate the line is skipped
/// (every refusal is still counted in the metrics, and the audit log summarises them).
pub const PROOF_LOG_LINES_PER_SECOND_MAX: u64 = 100;

/// The limiter of those log lines ([`PROOF_LOG_LINES_PER_SECOND_MAX`]).
static PROOF_LOG_NOISE: std::sync::LazyLock<palisade_server::audit::NoiseLimiter> =
    std::sync::LazyLock::new(|| {
        palisade_server::audit::NoiseLimiter::new(PROOF_LOG_LINES_PER_SECOND_MAX)
    });

/// Where admitted requests go.
pub(crate) enum Backend {
    /// An HTTP(S) upstream.
    Http(Box<HttpUpstream>),
    /// The embedded object store.
    Embedded(ObjectStore),
}

/// What every request shares: configuration, the fencer, the backend.
pub(crate) struct Shared {
    pub(crate) fencer: Arc<Fencer>,
    /// Fleet mode: the lease fenced requests are admitted under too.
    lease: Option<Arc<Lease>>,
    pub(crate) backend: Backend,
    /// Checks token proofs, when `token_pub` is set.
    proofs: Option<Arc<ProofVerifier>>,
    /// Read or write, and the scope, from the request head.
    classifier: Classifier,
    fence_reads: bool,
    strip_token: bool,
    /// `limits.header_bytes_max`: hyper's buffer is larger (see the listener), so the
    /// head limit is checked here.
    head_bytes_max: usize,
    /// What every streamed body obeys.
    body_limits: BodyLimits,
}

impl Shared {
    pub(crate) fn new(
        config: &ProxyConfig,
        fencer: Arc<Fencer>,
        lease: Option<Arc<Lease>>,
        proofs: Option<Arc<ProofVerifier>>,
        backend: Backend,
    ) -> Self {
        Self {
            fencer,
            lease,
            backend,
            proofs,
            classifier: Classifier::new(config),
            fence_reads: config.fence_reads,
            strip_token: config.strip_token,
            head_bytes_max: config.limits.header_bytes_max,
            body_limits: BodyLimits::new(
                config.limits.body_bytes_max,
                Duration::from_millis(config.limits.body_idle_timeout_ms),
                Duration::from_millis(config.limits.body_arrival_timeout_ms),
                config.limits.body_buffer_bytes_max,
            ),
        }
    }

    /// The size limit a body is held to, and the field that sets it: the embedded store's
    /// object limit (it holds objects whole), else the operator's optional cap.
    fn body_max(&self) -> Option<(u64, &'static str)> {
        match &self.backend {
            Backend::Embedded(store) => Some((store.object_bytes_max(), "limits.object_bytes_max")),
            Backend::Http(_) => self
                .body_limits
                .max
                .map(|max| (max, "limits.body_bytes_max")),
        }
    }
}

/// The per-request context the phases fill in.
struct Ctx {
    started: Instant,
    method: Method,
    class: Class,
    fenced: bool,
    /// Borrowed for `default`: no allocation for the scope most requests have.
    scope: Cow<'static, str>,
    token: Option<u64>,
    /// Whether this request raised the scope's fence.
    raised: bool,
    /// Whether the request was handed to the backend. An error after that is the
    /// backend's, not a refusal by the proxy, and is counted as such.
    forwarding: bool,
}

/// Serves one request. Never fails: every error becomes its problem+json answer.
///
/// hyper keeps the future this returns in a box of its own per connection, made as
/// the connection opens and moved into at every request, so its size is memory every
/// connection holds and bytes every request copies. Hence functions that return a
/// future rather than `async fn`s, here and in what it awaits: an `async fn` keeps each
/// argument twice in its future (as passed, and bound again inside). And work that needs
/// no await is done before the future is made, so the future holds its result, not
/// its inputs as well (`docs/benchmarks.md`, eleventh pass).
pub(crate) fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    peer: Arc<Peer>,
) -> impl Future<Output = Result<Response<ProxyBody>, std::convert::Infallible>> {
    // The poll's reading of the clock: see `palisade_server::clock`. hyper calls this
    // in the poll that read the head.
    let started = palisade_server::clock::now();
    let ctx = Ctx {
        started,
        fenced: false,
        method: request.method().clone(),
        class: Class::Write,
        scope: Cow::Borrowed(""),
        token: None,
        raised: false,
        forwarding: false,
    };
    // For the status page and the audit log (a refusal names its path and peer). A
    // clone of the URI shares its bytes: no copy on the request path.
    let uri = request.uri().clone();
    let phases = run_phases(Arc::clone(&shared), ctx, request, Arc::clone(&peer));
    // A combinator, not an `async` block: the phases' future is held once, in place.
    phases.map(move |(mut ctx, result)| {
        if let Err(err) = &result {
            ctx.forwarding = reached_upstream(&ctx, err);
        }
        (shared.fencer.activity()).observe(&result, ctx.forwarding, &ctx.method, &uri, &peer);
        Ok(respond_and_log(&ctx, result))
    })
}

/// The phases of one request, each filling in `ctx`, which comes back with the result.
///
/// Parsing, classifying and the checks of the head need no await: they run here, as the
/// request arrives, and only what fencing and forwarding need goes into the future.
fn run_phases(
    shared: Arc<Shared>,
    mut ctx: Ctx,
    request: Request<Incoming>,
    peer: Arc<Peer>,
) -> impl Future<Output = (Ctx, Result<Response<ProxyBody>, ProxyError>)> {
    match check(&shared, &mut ctx, request) {
        Ok(checked) => Either::Left(admit_and_forward(shared, ctx, checked, peer)),
        Err(e) => Either::Right(std::future::ready((ctx, Err(e)))),
    }
}

/// A request whose head passed every check, ready for the fence.
struct Checked {
    parts: http::request::Parts,
    body: Incoming,
    /// The size limit its body is held to, and the field that sets it.
    body_max: Option<(u64, &'static str)>,
    /// The client connection's upgrade, on a route that allows upgrades.
    upgrade: Option<hyper::upgrade::OnUpgrade>,
}

/// Phases before the fence: parse and classify the head, check it and the proof.
fn check(
    shared: &Shared,
    ctx: &mut Ctx,
    request: Request<Incoming>,
) -> Result<Checked, ProxyError> {
    // Phase: parse and classify. Scope and token come from the head alone, so bad
    // requests are refused before their body is read. The framing comes first: a
    // request the proxy would have to alter to forward is refused as it is.
    let (mut parts, body) = request.into_parts();
    check_head_size(&parts, shared.head_bytes_max)?;
    framing::check_head(&parts, shared.classifier.override_headers())?;
    let decision = shared.classifier.classify(&parts)?;
    // An upgrade its route allows: the client connection's upgrade goes with the
    // request (taken now, before the parts move), to be tunnelled if the upstream
    // switches.
    let upgrade = if decision.upgrade {
        if matches!(shared.backend, Backend::Embedded(_)) {
            return Err(ProxyError::NotTunnelled {
                reason: "the embedded object store takes no upgrades".to_owned(),
            });
        }
        parts.extensions.remove::<hyper::upgrade::OnUpgrade>()
    } else {
        None
    };
    ctx.class = decision.class;
    ctx.fenced = decision.class == Class::Write || shared.fence_reads;
    ctx.scope = decision.scope;
    ctx.token = token_of(&parts.headers)?;
    if ctx.fenced && ctx.token.is_none() {
        return Err(ProxyError::MissingToken);
    }
    // A GET or HEAD body, on a route that takes none, is refused before its body is
    // read, with the head's other refusals (a fenced GET without a token is 428).
    framing::check_body(&parts, !body.is_end_stream(), decision.read_bodies)?;

    // Phase: check the proof, before anything can move the fence or wait at the
    // barrier (a forged token must not raise it), and before the body is read (a
    // forger does not get the proxy to hold its body). Equal tokens with the same
    // proof are a lookup.
    if let (true, Some(token), Some(proofs)) = (ctx.fenced, ctx.token, &shared.proofs) {
        proofs.check_header(&ctx.scope, token, &parts.headers)?;
    }

    // A body whose declared length is over the limit is refused now, before
    // admission, so it neither raises the fence nor gets `100 Continue`. A chunked
    // body is held to the limit while it streams.
    let body_max = shared.body_max();
    if let Some((max, field)) = body_max
        && body.size_hint().lower() > max
    {
        return Err(ProxyError::BodyTooLarge { max, field });
    }
    Ok(Checked {
        parts,
        body,
        body_max,
        upgrade,
    })
}

/// Phases from the fence on: admit, then forward.
#[expect(
    clippy::manual_async_fn,
    reason = "an `async fn` keeps its arguments twice"
)]
fn admit_and_forward(
    shared: Arc<Shared>,
    mut ctx: Ctx,
    checked: Checked,
    peer: Arc<Peer>,
) -> impl Future<Output = (Ctx, Result<Response<ProxyBody>, ProxyError>)> {
    async move {
        // Phase: fence, from the head alone (in fleet mode also under the lease, checked
        // last). The in-flight guard is held until the upstream has answered and the
        // body is done with.
        let admitted = match (ctx.fenced, ctx.token) {
            (true, Some(token)) => {
                let lease = shared.lease.as_deref();
                match Admission::admit(&shared.fencer, lease, &ctx.scope, token).await {
                    Ok(admitted) => {
                        ctx.raised = admitted.raised();
                        Some(admitted)
                    }
                    Err(e) => return (ctx, Err(e)),
                }
            }
            _ => None,
        };
        let Checked {
            mut parts,
            body,
            body_max,
            upgrade,
        } = checked;
        if shared.strip_token {
            parts.headers.remove(FENCING_TOKEN);
            parts.headers.remove(FENCING_TOKEN_PROOF);
        }

        // Phase: forward, streaming the body. The forward runs in the connection's own
        // task (no task of its own and no hand-off per request), but once started it is
        // never cancelled: if the client goes away, hyper drops this future, and
        // `Forward` then moves the forward into a task of its own, because the upstream
        // may still apply the write. The forward keeps the in-flight guard until the
        // upstream has answered (or timed out), and a body still streaming keeps it
        // until it is done (a client that goes away mid-body fails it, which ends the
        // upstream exchange), so higher tokens keep waiting for both.
        ctx.forwarding = true;
        let outgoing = Outgoing {
            parts,
            body,
            body_max,
            admitted,
            token: ctx.token,
            upgrade,
        };
        let result = Forward::new(forward(shared, peer, outgoing)).await;
        (ctx, result)
    }
}

/// An admitted request on its way to the backend.
struct Outgoing {
    parts: http::request::Parts,
    body: Incoming,
    /// The size limit its body is held to, and the field that sets it.
    body_max: Option<(u64, &'static str)>,
    /// Its in-flight guard, for a fenced request.
    admitted: Option<Admission>,
    token: Option<u64>,
    /// The client connection's upgrade, on a route that allows upgrades.
    upgrade: Option<hyper::upgrade::OnUpgrade>,
}

/// Sends an admitted request to the backend and waits for its answer; run to the end
/// whatever the client does (see [`Forward`]).
fn forward(
    shared: Arc<Shared>,
    peer: Arc<Peer>,
    outgoing: Outgoing,
) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>> {
    // Not an `async fn`: see `handle`. What needs no await is done before the future
    // is made, so the future holds the body's box and the guard, not the `Outgoing`
    // they came from as well.
    // Without a fencing token, a body still arriving once read ahead takes one of the
    // upstream slots kept for such bodies (`limits.unfenced_streams_max`).
    let unfenced = outgoing.admitted.is_none();
    // Fleet mode: until when the forward may run (the lease's end).
    let forward_until = outgoing
        .admitted
        .as_ref()
        .and_then(Admission::forward_until);
    // A body that is empty from the start (most reads) needs no shared state: the
    // guard stays with this future.
    let (mut exchange, mut admitted) = if outgoing.body.is_end_stream() {
        (None, outgoing.admitted)
    } else {
        (Some(Exchange::new(outgoing.admitted)), None)
    };
    // Boxed from the start, as it goes upstream: the future holds a pointer, not the
    // body's few hundred bytes.
    let mut body: UpstreamBody = Box::pin(RequestBody::new(
        outgoing.body,
        &shared.body_limits,
        outgoing.body_max,
        exchange.clone(),
    ));
    if let Some(at) = forward_until {
        body.set_forward_until(at);
    }
    if outgoing.parts.version <= http::Version::HTTP_11 {
        body.drop_stale_wakes();
    }
    let Outgoing {
        parts,
        token,
        upgrade,
        ..
    } = outgoing;
    async move {
        fail::fail_point!("proxy-before-forward");
        if exchange.is_some() {
            body.read_ahead().await;
            // A body that failed before anything was sent (a client that stalled or
            // left, a body over its limit) is answered here: the upstream never sees
            // the request, and its connection is not broken off mid-request.
            if let Some(fault) = body.fault_ahead() {
                return Err(fault.to_proxy_error());
            }
        }
        let response = match &shared.backend {
            Backend::Http(upstream) => {
                let upgrades = upgrade.is_some();
                let stream = unfenced && body.still_arriving();
                let sent = match upstream.prepare(parts, body, &peer, upgrades) {
                    Ok(request) => {
                        upstream
                            .forward(request, exchange.as_ref(), upgrade, stream)
                            .await
                    }
                    Err(e) => Err(e),
                };
                match sent {
                    Ok((response, Some(tunnel))) => {
                        // The tunnel carries whatever the client sends next, so it
                        // holds the in-flight guard for as long as it is open.
                        let held = (exchange.take(), admitted.take());
                        tokio::spawn(async move {
                            tunnel.run().await;
                            drop(held);
                        });
                        Ok(response)
                    }
                    Ok((response, None)) => Ok(response),
                    Err(e) => {
                        // No answer (a timeout, a broken connection): the storage may
                        // still apply the write, so in fleet mode it stays in flight
                        // until it can no longer land. The guard is in `admitted` or in
                        // the exchange, never in both.
                        Admission::keep_while_it_may_land(&mut admitted);
                        if let Some(exchange) = &exchange {
                            exchange.keep_while_it_may_land();
                        }
                        Err(e)
                    }
                }
            }
            Backend::Embedded(store) => {
                crate::embedded::serve(
                    store,
                    &parts.method,
                    parts.uri.path(),
                    parts.uri.query(),
                    token,
                    body,
                )
                .await
            }
        };
        fail::fail_point!("proxy-after-forward");
        drop(exchange);
        drop(admitted);
        response
    }
}

/// The type of a started forward.
type ForwardFuture = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, ProxyError>> + Send>>;

/// A forward that has started, polled by the connection's task, which never cancels it.
///
/// A forward may not be cancelled once it started: the upstream may already have the
/// request and apply the write, and the in-flight guard it holds must stay held until
/// that is settled. Running it in a task of its own per request guarantees that, but
/// costs a task, a hand-off and a wake-up per request. So it runs where the request
/// is served, and only when that future is dropped before the forward ended (hyper
/// drops it when the client goes away) is the rest of the forward moved into a task of
/// its own, to run to its end exactly as it would have.
///
/// A panic in the forward is caught and answered as 503 (`unavailable`), as a panic in
/// a task of its own was, instead of taking the client's connection down unanswered.
struct Forward {
    /// `None` once it ended.
    inner: Option<ForwardFuture>,
}

impl Forward {
    fn new(
        forward: impl Future<Output = Result<Response<ProxyBody>, ProxyError>> + Send + 'static,
    ) -> Self {
        Self {
            inner: Some(Box::pin(forward)),
        }
    }
}

impl Future for Forward {
    type Output = Result<Response<ProxyBody>, ProxyError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(Err(ProxyError::Unavailable(
                "the forward was polled after it ended".to_owned(),
            )));
        };
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| inner.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(result)) => {
                self.inner = None;
                Poll::Ready(result)
            }
            Err(panic) => {
                self.inner = None;
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".to_owned());
                Poll::Ready(Err(ProxyError::Unavailable(format!(
                    "the forward panicked: {message}"
                ))))
            }
        }
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        // The client went away while the forward was under way. It runs on in a task of
        // its own, holding its in-flight guard until it ends. Without a runtime (the
        // process is stopping) nothing could run it, and the guard goes with it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            tracing::debug!("the client went away during its forward; the forward runs on");
            runtime.spawn(async move {
                let _ = inner.await;
            });
        }
    }
}

/// Phase: respond and log. Counts the outcome and writes one log event.
///
/// An error before forwarding is a refusal by the proxy, counted in `REJECTIONS` by
/// reason. After forwarding, a failure of the backend (the HTTP upstream, or the embedded
/// store's own storage) is counted in `UPSTREAM_ERRORS`, and an answer the embedded store
/// gives as an error (404 for a missing key, 405) counts as forwarded, as an HTTP
/// upstream's 404 does.
fn respond_and_log(
    ctx: &Ctx,
    result: Result<Response<ProxyBody>, ProxyError>,
) -> Response<ProxyBody> {
    fail::fail_point!("proxy-before-reply");
    // `elapsed_ms` is a field of every event below, and tracing evaluates fields only
    // when the event is enabled: a forwarded request at the default level reads no clock
    // here.
    let class = ctx.class.label();
    let token = ctx.token;
    let scope = &*ctx.scope;
    let err = match result {
        Ok(response) => {
            count_forwarded(ctx.class);
            tracing::debug!(
                scope, token, outcome = "forwarded", raised = ctx.raised, method = %ctx.method,
                status = response.status().as_u16(), elapsed_ms = elapsed_ms(ctx.started), "request"
            );
            return response;
        }
        Err(err) => err,
    };
    let reason = err.reason();
    match (ctx.forwarding, err.cause()) {
        (true, Cause::Client) => {
            count_forwarded(ctx.class);
            tracing::debug!(
                scope, token, outcome = "forwarded", raised = ctx.raised, method = %ctx.method,
                status = err.status().as_u16(), cause = %err, elapsed_ms = elapsed_ms(ctx.started), "request"
            );
        }
        (true, Cause::Upstream | Cause::Internal) => {
            metrics::counter!(m::REQUESTS, "class" => class, "outcome" => "failed").increment(1);
            metrics::counter!(m::UPSTREAM_ERRORS, "reason" => reason).increment(1);
            tracing::warn!(
                scope, token, outcome = "failed", method = %ctx.method, cause = %err, elapsed_ms = elapsed_ms(ctx.started), "request"
            );
        }
        (false, Cause::Client) => {
            metrics::counter!(m::REQUESTS, "class" => class, "outcome" => "rejected").increment(1);
            metrics::counter!(m::REJECTIONS, "reason" => reason).increment(1);
            if matches!(err, ProxyError::Stale { .. }) {
                tracing::info!(
                    event = events::STALE_REJECTED, scope, token, outcome = "rejected",
                    method = %ctx.method, cause = %err, elapsed_ms = elapsed_ms(ctx.started), "request"
                );
            } else if matches!(
                err,
                ProxyError::MissingProof { .. } | ProxyError::InvalidProof { .. }
            ) {
                // Anyone can send these without a credential: past the noise rate the
                // line is skipped (the rejection is still counted in the metrics), so a
                // flood cannot fill the disk with log lines.
                if PROOF_LOG_NOISE.admit(events::PROOF_REJECTED) {
                    tracing::warn!(
                        event = events::PROOF_REJECTED, scope, token, outcome = "rejected",
                        method = %ctx.method, cause = %err, elapsed_ms = elapsed_ms(ctx.started), "request"
                    );
                }
            } else {
                tracing::info!(
                    scope, token, outcome = "rejected", method = %ctx.method, cause = %err, elapsed_ms = elapsed_ms(ctx.started), "request"
                );
            }
        }
        (false, Cause::Upstream | Cause::Internal) => {
            metrics::counter!(m::REQUESTS, "class" => class, "outcome" => "failed").increment(1);
            metrics::counter!(m::REJECTIONS, "reason" => reason).increment(1);
            tracing::warn!(
                scope, token, outcome = "failed", method = %ctx.method, cause = %err, elapsed_ms = elapsed_ms(ctx.started), "request"
            );
        }
    }
    err.into_response()
}

/// Whether a request that failed with `err` was handed to the backend. Some errors are
/// met during the forward but before the upstream was sent anything (the body did not
/// arrive in time; no slot for a streaming body without a token): those are refusals.
fn reached_upstream(ctx: &Ctx, err: &ProxyError) -> bool {
    ctx.forwarding
        && !matches!(
            err,
            ProxyError::BodyArrivalTimeout { .. } | ProxyError::UnfencedStreamsFull { .. }
        )
}

/// Milliseconds since `started`, for the request's log event.
fn elapsed_ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1000.0
}

fn count_forwarded(class: Class) {
    let handles = m::hot_path_handles();
    match class {
        Class::Read => handles.forwarded_read.increment(1),
        Class::Write => handles.forwarded_write.increment(1),
    }
}

/// Refuses an HTTP/1 request head over `limits.header_bytes_max` (431), counted as it
/// was sent: the request line and each header line with their separators. HTTP/2 heads
/// are bounded by the connection's `max_header_list_size` instead.
fn check_head_size(parts: &http::request::Parts, max: usize) -> Result<(), ProxyError> {
    if parts.version >= http::Version::HTTP_2 {
        return Ok(());
    }
    // "METHOD SP target SP HTTP/1.1 CRLF", then "name: value CRLF" each, then CRLF.
    let line = parts.method.as_str().len()
        + parts.uri.path_and_query().map_or(1, |p| p.as_str().len())
        + 12;
    let bytes = parts.headers.iter().fold(line + 2, |sum, (name, value)| {
        sum + name.as_str().len() + value.len() + 4
    });
    if bytes > max {
        return Err(ProxyError::HeadTooLarge { bytes, max });
    }
    Ok(())
}

/// The request's `Fencing-Token`, parsed by the protocol's one rule; a bad one is 400.
fn token_of(headers: &HeaderMap) -> Result<Option<u64>, ProxyError> {
    parse_token_header(headers).map_err(|reason| ProxyError::BadToken { reason })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};

    /// The size of the future `f` returns, from its type alone (nothing is called).
    fn output_size<A, B, C, F>(_: fn(A, B, C) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Goal: a request's futures stay small, as every request in flight holds them: the
    /// service's future (in a box hyper keeps per connection, idle or not, and moves
    /// into at every request) and the forward's (boxed per request). No argument is kept
    /// twice, as an `async fn` would keep it, nor a future an `async` block was given and
    /// awaits, nor the request body inline, nor what the head's checks only read.
    /// 1,208 and 1,680 bytes in a test build, from 1,768 and 2,504 (and 2,064 and 3,632
    /// before that). The bounds are the allocator's size classes they fall in now (1.25
    /// and 1.75 KiB; they were in the 2 and 2.5 KiB classes). Method: the sizes of the two
    /// futures' types.
    #[test]
    fn a_request_future_keeps_no_argument_twice() {
        let handle = output_size(handle);
        let forward = output_size(forward);
        eprintln!("handle: {handle} bytes, forward: {forward} bytes");
        assert!(handle <= 1280, "handle: {handle} bytes");
        assert!(forward <= 1792, "forward: {forward} bytes");
    }

    fn headers(pairs: &[(HeaderName, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(k.clone(), HeaderValue::from_static(v));
        }
        h
    }

    /// Goal: the data path refuses a bad `Fencing-Token` with 400 bad-token and a message
    /// that names the header and the value, and takes a good one.
    /// Method: map header maps through `token_of`.
    #[test]
    fn bad_tokens_are_400_with_the_value_named() {
        assert_eq!(token_of(&headers(&[])).unwrap(), None);
        assert_eq!(
            token_of(&headers(&[(FENCING_TOKEN, "18446744073709551615")])).unwrap(),
            Some(u64::MAX)
        );
        let err = token_of(&headers(&[(FENCING_TOKEN, "18446744073709551616")])).unwrap_err();
        assert_eq!(err.status(), http::StatusCode::BAD_REQUEST);
        assert_eq!(err.reason(), "bad-token");
        assert_eq!(
            err.to_string(),
            "invalid Fencing-Token: \"18446744073709551616\" overflows u64"
        );
        let err = token_of(&headers(&[(FENCING_TOKEN, "1"), (FENCING_TOKEN, "1")])).unwrap_err();
        assert!(err.to_string().contains("repeated"), "{err}");
    }

    /// Goal: a forward that started runs to its end when the future serving the request
    /// is dropped (the client went away), so the upstream exchange and the in-flight
    /// guard it holds are not cut short.
    /// Method: a forward that waits for a signal and then reports; poll it once, drop
    /// it, send the signal, and wait (with a deadline) for its report.
    #[tokio::test]
    async fn a_forward_runs_on_when_its_client_goes_away() {
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let mut forward = Forward::new(async move {
            let _ = go_rx.await;
            let _ = done_tx.send("ended");
            Ok(crate::body::ok_json(&"ok"))
        });
        let waker = std::task::Waker::noop();
        assert!(
            Pin::new(&mut forward)
                .poll(&mut Context::from_waker(waker))
                .is_pending()
        );
        drop(forward);
        go_tx.send(()).unwrap();
        let report = tokio::time::timeout(Duration::from_secs(10), done_rx)
            .await
            .expect("the dropped forward did not run on");
        assert_eq!(report.unwrap(), "ended");
    }

    /// Goal: a panic in a forward is answered 503 naming it, instead of taking the
    /// client's connection down unanswered.
    /// Method: await a forward that panics.
    #[tokio::test]
    async fn a_panic_in_a_forward_is_answered_503() {
        fn fails() -> Result<Response<ProxyBody>, ProxyError> {
            panic!("failpoint proxy-before-forward panic");
        }
        let err = Forward::new(async { fails() }).await.unwrap_err();
        assert_eq!(err.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            err.to_string()
                .contains("failpoint proxy-before-forward panic"),
            "{err}"
        );
    }
}
