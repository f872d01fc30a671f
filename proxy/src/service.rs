//! One client request through the proxy, in fixed phases sharing one context:
//! parse, classify, check the proof, read body, fence, forward, respond, log.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Incoming};
use palisade_protocol::headers::{FENCING_SCOPE, FENCING_TOKEN, FENCING_TOKEN_PROOF};
use palisade_protocol::process::events;
use palisade_protocol::{DEFAULT_SCOPE, Scope, parse_token_header};
use palisade_storage::ObjectStore;

use crate::body::ProxyBody;
use crate::config::{ProxyConfig, Route};
use crate::error::{Cause, ProxyError};
use crate::fencing::Fencer;
use crate::metrics as m;
use crate::proof::ProofVerifier;
use crate::server::Peer;
use crate::upstream::HttpUpstream;

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
    pub(crate) backend: Backend,
    /// Checks token proofs, when `token_pub` is set.
    proofs: Option<Arc<ProofVerifier>>,
    write_methods: Vec<Method>,
    /// Routes, longest prefix first, so the first match is the most specific.
    routes: Vec<Route>,
    fence_reads: bool,
    client_scopes: bool,
    strip_token: bool,
    body_bytes_max: u64,
    body_read_timeout: Duration,
}

impl Shared {
    pub(crate) fn new(
        config: &ProxyConfig,
        fencer: Arc<Fencer>,
        proofs: Option<Arc<ProofVerifier>>,
        backend: Backend,
    ) -> Self {
        let mut routes = config.routes.clone();
        routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        Self {
            fencer,
            backend,
            proofs,
            write_methods: config.write_methods(),
            routes,
            fence_reads: config.fence_reads,
            client_scopes: config.client_scopes,
            strip_token: config.strip_token,
            body_bytes_max: config.limits.body_bytes_max,
            body_read_timeout: Duration::from_millis(config.limits.body_read_timeout_ms),
        }
    }
}

/// Read or write, as the configured write methods decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Read,
    Write,
}

impl Class {
    fn label(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
        }
    }
}

/// The per-request context the phases fill in.
struct Ctx {
    started: Instant,
    method: Method,
    class: Class,
    fenced: bool,
    scope: String,
    token: Option<u64>,
    /// Whether this request raised the scope's fence.
    raised: bool,
    /// Whether the request was handed to the backend. An error after that is the
    /// backend's, not a refusal by the proxy, and is counted as such.
    forwarding: bool,
}

/// Serves one request. Never fails: every error becomes its problem+json answer.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    peer: Arc<Peer>,
) -> Result<Response<ProxyBody>, std::convert::Infallible> {
    let started = Instant::now();
    let method = request.method().clone();
    let class = if shared.write_methods.contains(&method) {
        Class::Write
    } else {
        Class::Read
    };
    let mut ctx = Ctx {
        started,
        fenced: class == Class::Write || shared.fence_reads,
        method,
        class,
        scope: String::new(),
        token: None,
        raised: false,
        forwarding: false,
    };
    let result = run_phases(Arc::clone(&shared), &mut ctx, request, peer).await;
    Ok(respond_and_log(&ctx, result))
}

async fn run_phases(
    shared: Arc<Shared>,
    ctx: &mut Ctx,
    request: Request<Incoming>,
    peer: Arc<Peer>,
) -> Result<Response<ProxyBody>, ProxyError> {
    // Phase: parse and classify. Scope and token come from the head alone, so bad
    // requests are refused before their body is read.
    let (mut parts, body) = request.into_parts();
    ctx.scope = resolve_scope(&shared, parts.uri.path(), &parts.headers)?;
    ctx.token = token_of(&parts.headers)?;
    if ctx.fenced && ctx.token.is_none() {
        return Err(ProxyError::MissingToken);
    }

    // Phase: check the proof, before anything can move the fence or wait at the barrier
    // (a forged token must not raise it), and before the body is read (a forger does not
    // get the proxy to hold its body). Equal tokens with the same proof are a lookup.
    if let (true, Some(token), Some(proofs)) = (ctx.fenced, ctx.token, &shared.proofs) {
        proofs.check_header(&ctx.scope, token, &parts.headers)?;
    }

    // Phase: read the body whole, bounded in size and time.
    let body = read_body(&shared, body).await?;

    // Phase: fence. Hold the in-flight guard until the upstream has answered.
    let admitted = match (ctx.fenced, ctx.token) {
        (true, Some(token)) => {
            let admitted = shared.fencer.admit(&ctx.scope, token).await?;
            ctx.raised = admitted.raised;
            Some(admitted)
        }
        _ => None,
    };
    if shared.strip_token {
        parts.headers.remove(FENCING_TOKEN);
        parts.headers.remove(FENCING_TOKEN_PROOF);
    }

    // Phase: forward, in a task of its own. If the client goes away, hyper drops this
    // future; the forward must not be cancelled with it, because the upstream may still
    // apply the write. The task keeps the in-flight guard until the upstream has
    // answered (or timed out), so higher tokens keep waiting for it.
    let token = ctx.token;
    ctx.forwarding = true;
    let forward = tokio::spawn(async move {
        fail::fail_point!("proxy-before-forward");
        let response = match &shared.backend {
            Backend::Http(upstream) => upstream.forward(parts, body, &peer).await,
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
        drop(admitted);
        response
    });
    forward
        .await
        .map_err(|e| ProxyError::Unavailable(format!("forwarding task failed: {e}")))?
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
    let elapsed_ms = ctx.started.elapsed().as_secs_f64() * 1000.0;
    let class = ctx.class.label();
    let token = ctx.token;
    let scope = ctx.scope.as_str();
    let err = match result {
        Ok(response) => {
            count_forwarded(ctx.class);
            tracing::debug!(
                scope, token, outcome = "forwarded", raised = ctx.raised, method = %ctx.method,
                status = response.status().as_u16(), elapsed_ms, "request"
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
                status = err.status().as_u16(), cause = %err, elapsed_ms, "request"
            );
        }
        (true, Cause::Upstream | Cause::Internal) => {
            metrics::counter!(m::REQUESTS, "class" => class, "outcome" => "failed").increment(1);
            metrics::counter!(m::UPSTREAM_ERRORS, "reason" => reason).increment(1);
            tracing::warn!(
                scope, token, outcome = "failed", method = %ctx.method, cause = %err, elapsed_ms, "request"
            );
        }
        (false, Cause::Client) => {
            metrics::counter!(m::REQUESTS, "class" => class, "outcome" => "rejected").increment(1);
            metrics::counter!(m::REJECTIONS, "reason" => reason).increment(1);
            if matches!(err, ProxyError::Stale { .. }) {
                tracing::info!(
                    event = events::STALE_REJECTED, scope, token, outcome = "rejected",
                    method = %ctx.method, cause = %err, elapsed_ms, "request"
                );
            } else if matches!(
                err,
                ProxyError::MissingProof { .. } | ProxyError::InvalidProof { .. }
            ) {
                tracing::warn!(
                    event = events::PROOF_REJECTED, scope, token, outcome = "rejected",
                    method = %ctx.method, cause = %err, elapsed_ms, "request"
                );
            } else {
                tracing::info!(
                    scope, token, outcome = "rejected", method = %ctx.method, cause = %err, elapsed_ms, "request"
                );
            }
        }
        (false, Cause::Upstream | Cause::Internal) => {
            metrics::counter!(m::REQUESTS, "class" => class, "outcome" => "failed").increment(1);
            metrics::counter!(m::REJECTIONS, "reason" => reason).increment(1);
            tracing::warn!(
                scope, token, outcome = "failed", method = %ctx.method, cause = %err, elapsed_ms, "request"
            );
        }
    }
    err.into_response()
}

fn count_forwarded(class: Class) {
    let handles = m::hot_path_handles();
    match class {
        Class::Read => handles.forwarded_read.increment(1),
        Class::Write => handles.forwarded_write.increment(1),
    }
}

/// The request's scope: its route's, else the client's `Fencing-Scope` (if allowed),
/// else `default`. A `Fencing-Scope` that contradicts the route, or that is sent when
/// client scopes are off, is refused rather than silently ignored.
fn resolve_scope(shared: &Shared, path: &str, headers: &HeaderMap) -> Result<String, ProxyError> {
    let mut values = headers.get_all(FENCING_SCOPE).iter();
    let header = match (values.next(), values.next()) {
        (None, _) => None,
        (Some(_), Some(_)) => {
            return Err(ProxyError::BadScope {
                reason: "Fencing-Scope header is repeated".to_owned(),
            });
        }
        (Some(v), None) => Some(v.to_str().map_err(|_| ProxyError::BadScope {
            reason: "Fencing-Scope is not ASCII".to_owned(),
        })?),
    };
    let route = shared.routes.iter().find(|r| path.starts_with(&r.prefix));
    let scope = match (route, header) {
        (Some(route), Some(h)) if h != route.scope => {
            return Err(ProxyError::BadScope {
                reason: format!(
                    "Fencing-Scope {h:?} contradicts scope {:?} of route {:?}",
                    route.scope, route.prefix
                ),
            });
        }
        (Some(route), _) => route.scope.clone(),
        (None, Some(_)) if !shared.client_scopes => {
            return Err(ProxyError::BadScope {
                reason: "client-chosen scopes are disabled (client_scopes = false)".to_owned(),
            });
        }
        (None, Some(h)) => h.to_owned(),
        (None, None) => DEFAULT_SCOPE.to_owned(),
    };
    Scope::check(&scope).map_err(|reason| ProxyError::BadScope {
        reason: reason.to_string(),
    })?;
    Ok(scope)
}

/// The request's `Fencing-Token`, parsed by the protocol's one rule; a bad one is 400.
fn token_of(headers: &HeaderMap) -> Result<Option<u64>, ProxyError> {
    parse_token_header(headers).map_err(|reason| ProxyError::BadToken { reason })
}

async fn read_body(shared: &Shared, body: Incoming) -> Result<Bytes, ProxyError> {
    let max = shared.body_bytes_max;
    if body.size_hint().lower() > max {
        return Err(ProxyError::BodyTooLarge { max });
    }
    let limit = usize::try_from(max).unwrap_or(usize::MAX);
    let collected = tokio::time::timeout(
        shared.body_read_timeout,
        Limited::new(body, limit).collect(),
    )
    .await
    .map_err(|_| ProxyError::BodyTimeout {
        timeout_ms: u64::try_from(shared.body_read_timeout.as_millis()).unwrap_or(u64::MAX),
    })?;
    match collected {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ProxyError::BodyTooLarge { max })
        }
        Err(e) => Err(ProxyError::BodyRead(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};

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

    fn shared(routes: Vec<Route>, client_scopes: bool) -> Shared {
        let dir = tempfile::tempdir().unwrap();
        let db = palisade_storage::open_database(&dir.path().join("x.redb")).unwrap();
        let register = palisade_storage::FenceRegister::open(db.clone(), 10).unwrap();
        let store = ObjectStore::open(db, 10).unwrap();
        let config = ProxyConfig {
            client_scopes,
            routes,
            ..ProxyConfig::default()
        };
        Shared::new(
            &config,
            Arc::new(Fencer::new(register, Duration::from_secs(1))),
            None,
            Backend::Embedded(store),
        )
    }

    /// Goal: the longest matching route decides the scope; a client scope is taken only
    /// where no route applies, and must follow the scope rule.
    /// Method: resolve paths and headers against two nested routes.
    #[test]
    fn scope_resolution_prefers_the_longest_route() {
        let s = shared(
            vec![
                Route {
                    prefix: "/a".into(),
                    scope: "short".into(),
                },
                Route {
                    prefix: "/a/b".into(),
                    scope: "long".into(),
                },
            ],
            true,
        );
        assert_eq!(resolve_scope(&s, "/a/b/c", &headers(&[])).unwrap(), "long");
        assert_eq!(resolve_scope(&s, "/a/x", &headers(&[])).unwrap(), "short");
        assert_eq!(
            resolve_scope(&s, "/z", &headers(&[])).unwrap(),
            DEFAULT_SCOPE
        );
        assert_eq!(
            resolve_scope(&s, "/z", &headers(&[(FENCING_SCOPE, "mine")])).unwrap(),
            "mine"
        );
        assert!(resolve_scope(&s, "/a/b", &headers(&[(FENCING_SCOPE, "mine")])).is_err());
        assert!(resolve_scope(&s, "/z", &headers(&[(FENCING_SCOPE, "no spaces")])).is_err());
    }

    /// Goal: with `client_scopes = false` a `Fencing-Scope` is refused, not ignored.
    /// Method: resolve with and without the header.
    #[test]
    fn client_scopes_can_be_disabled() {
        let s = shared(vec![], false);
        assert!(resolve_scope(&s, "/z", &headers(&[(FENCING_SCOPE, "mine")])).is_err());
        assert_eq!(
            resolve_scope(&s, "/z", &headers(&[])).unwrap(),
            DEFAULT_SCOPE
        );
    }
}
