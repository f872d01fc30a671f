//! [`FencedClient`]: HTTP requests through a Palisade proxy with the token attached to
//! writes, refused locally when not leading, stopped for good on a fencing rejection.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::Full;

use crate::error::ClientError;
use crate::http::{Answer, BaseUrl, Failure, Transport, millis};
use crate::retry::{backoff, retry_after};
use crate::source::{StaticToken, TokenSource};

/// The request header carrying the fencing token (fixed by the contract).
pub const FENCING_TOKEN: &str = "fencing-token";
/// The request header naming the fencing scope (fixed by the contract).
pub const FENCING_SCOPE: &str = "fencing-scope";
/// The response header with the scope's fence on a rejection (fixed by the contract).
pub const FENCING_TOKEN_CURRENT: &str = "fencing-token-current";
/// The request header that makes a POST or PATCH safe to retry: the storage behind the
/// proxy applies a key at most once.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Most bytes in a scope name (the contract: 1-128 of `[A-Za-z0-9._-]`).
pub const SCOPE_BYTES_MAX: usize = 128;

/// Default limit on one attempt, from sending to the whole answer. Above the proxy's
/// default barrier wait (5 s), so that a barrier 503 is seen as such and not as a timeout.
pub const REQUEST_TIMEOUT_MS: u64 = 10_000;
/// Default number of retries after the first attempt, for requests that may be retried.
pub const RETRIES_MAX: u32 = 3;
/// Default first backoff between attempts; doubles each time.
pub const BACKOFF_INITIAL_MS: u64 = 100;
/// Default longest backoff between attempts.
pub const BACKOFF_MAX_MS: u64 = 2_000;
/// Longest a server's `Retry-After` is honoured; the proxy asks for 1 s.
pub const RETRY_AFTER_MAX_MS: u64 = 5_000;

/// One request to send through the proxy: method, path (with an optional query) under
/// the proxy's base URL, headers, body.
#[derive(Debug, Clone)]
pub struct FencedRequest {
    method: Method,
    path: String,
    headers: HeaderMap,
    body: Bytes,
    /// The first invalid header given, reported when the request is sent.
    invalid: Option<String>,
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
    /// `Fencing-Token` is the client's to set and is replaced.
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
        self.headers.get(FENCING_TOKEN)?.to_str().ok()?.parse().ok()
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Limits and behaviour of a [`FencedClient`].
#[derive(Debug, Clone)]
struct Options {
    request_timeout: Duration,
    retries_max: u32,
    backoff_initial: Duration,
    backoff_max: Duration,
    fence_reads: bool,
}

/// Builds a [`FencedClient`].
pub struct FencedClientBuilder {
    url: String,
    source: Arc<dyn TokenSource>,
    scope: Option<String>,
    options: Options,
}

impl FencedClientBuilder {
    /// Sends `Fencing-Scope: scope` (the proxy's default is scope `default`, or what its
    /// routes say).
    #[must_use]
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// Limit on one attempt, from sending to the whole answer
    /// (default [`REQUEST_TIMEOUT_MS`]).
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.options.request_timeout = timeout;
        self
    }

    /// Retries after the first attempt, for requests that may be retried
    /// (default [`RETRIES_MAX`]; 0 disables retries).
    #[must_use]
    pub fn retries(mut self, retries: u32) -> Self {
        self.options.retries_max = retries;
        self
    }

    /// Backoff between attempts: first `initial`, doubling up to `max`
    /// (defaults [`BACKOFF_INITIAL_MS`], [`BACKOFF_MAX_MS`]).
    #[must_use]
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.options.backoff_initial = initial;
        self.options.backoff_max = max.max(initial);
        self
    }

    /// Attaches the token to reads as well, for a proxy run with `fence_reads`; reads then
    /// need the leadership too.
    #[must_use]
    pub fn fence_reads(mut self, fence_reads: bool) -> Self {
        self.options.fence_reads = fence_reads;
        self
    }

    /// Checks the URL and scope and builds the client.
    pub fn build(self) -> Result<FencedClient, ClientError> {
        if let Some(scope) = &self.scope {
            validate_scope(scope)?;
        }
        Ok(FencedClient {
            base: BaseUrl::parse(&self.url)?,
            scope: self.scope,
            source: self.source,
            transport: Transport::new(),
            options: self.options,
        })
    }
}

/// An HTTP client for one proxy and one scope that fences its writes.
///
/// - Writes (PUT, POST, PATCH, DELETE) carry `Fencing-Token` from the [`TokenSource`],
///   read before every attempt. When the source reports no established leadership the
///   write is refused with [`ClientError::NotLeader`] and nothing is sent.
/// - A 409 from the proxy is [`ClientError::Fenced`] with the numbers, and the source is
///   marked "not leader": every later write fails locally with `NotLeader` until the
///   source holds a token of at least the proxy's fence. Rejections are never retried.
/// - GET, HEAD, PUT and DELETE, and any request with an `Idempotency-Key`, are retried
///   up to the configured number of times on connect errors, timeouts and 502/503/504,
///   with jittered exponential backoff (honouring `Retry-After`). Other requests are
///   sent once.
/// - A timeout, or a connection broken after sending, is
///   [`ClientError::Indeterminate`]: the request may have been applied.
///
/// Cheap to clone; clones share the connection pool and the token source.
#[derive(Clone)]
pub struct FencedClient {
    base: BaseUrl,
    scope: Option<String>,
    source: Arc<dyn TokenSource>,
    transport: Transport,
    options: Options,
}

impl std::fmt::Debug for FencedClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedClient")
            .field("proxy", &self.base.as_str())
            .field("scope", &self.scope)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// How one attempt ended, when it did not end the call.
enum Outcome {
    /// Nothing was sent.
    Unreachable(String),
    /// The request may have been applied.
    Indeterminate(String),
    /// A retryable error status.
    Status(Answer),
}

impl FencedClient {
    /// A builder for a client of the proxy at `proxy_url` (`http://host:port`, optionally
    /// with a path prefix) taking tokens from `source`.
    pub fn builder(proxy_url: &str, source: Arc<dyn TokenSource>) -> FencedClientBuilder {
        FencedClientBuilder {
            url: proxy_url.to_owned(),
            source,
            scope: None,
            options: Options {
                request_timeout: Duration::from_millis(REQUEST_TIMEOUT_MS),
                retries_max: RETRIES_MAX,
                backoff_initial: Duration::from_millis(BACKOFF_INITIAL_MS),
                backoff_max: Duration::from_millis(BACKOFF_MAX_MS),
                fence_reads: false,
            },
        }
    }

    /// A client with a fixed token and default settings (scope chosen by the proxy).
    pub fn with_token(proxy_url: &str, token: u64) -> Result<Self, ClientError> {
        Self::builder(proxy_url, Arc::new(StaticToken::new(token))).build()
    }

    /// The token source.
    pub fn source(&self) -> &Arc<dyn TokenSource> {
        &self.source
    }

    /// The scope sent in `Fencing-Scope`, if any.
    pub fn scope(&self) -> Option<&str> {
        self.scope.as_deref()
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<FencedResponse, ClientError> {
        self.send(FencedRequest::get(path)).await
    }

    /// `PUT path` with `body`, fenced.
    pub async fn put(
        &self,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Result<FencedResponse, ClientError> {
        self.send(FencedRequest::put(path, body)).await
    }

    /// `POST path` with `body`, fenced; sent once unless it has an idempotency key.
    pub async fn post(
        &self,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Result<FencedResponse, ClientError> {
        self.send(FencedRequest::post(path, body)).await
    }

    /// `DELETE path`, fenced.
    pub async fn delete(&self, path: &str) -> Result<FencedResponse, ClientError> {
        self.send(FencedRequest::delete(path)).await
    }

    /// Sends `request` with the rules in the type's docs.
    #[tracing::instrument(skip(self, request), fields(
        method = %request.method, path = %request.path, scope = self.scope.as_deref().unwrap_or("-")))]
    pub async fn send(&self, request: FencedRequest) -> Result<FencedResponse, ClientError> {
        if let Some(reason) = &request.invalid {
            return Err(ClientError::InvalidRequest(reason.clone()));
        }
        let uri = self.base.join(&request.path)?;
        let fenced = is_write(&request.method) || self.options.fence_reads;
        let retryable =
            is_idempotent(&request.method) || request.headers.contains_key(IDEMPOTENCY_KEY);
        let attempts_max = if retryable {
            self.options.retries_max.saturating_add(1)
        } else {
            1
        };
        let mut attempt: u32 = 0;
        let mut last: Option<Outcome> = None;
        loop {
            attempt += 1;
            let token = if fenced {
                let leadership = self.source.current().await;
                match leadership.write_token() {
                    Some(token) => Some(token),
                    // A retry whose earlier attempt may have been applied keeps that
                    // outcome: "not leader now" must not hide "maybe written before".
                    None => {
                        return Err(match last {
                            Some(Outcome::Indeterminate(reason)) => ClientError::Indeterminate {
                                method: request.method.clone(),
                                attempts: attempt - 1,
                                reason: format!("{reason}; then the leadership was lost"),
                            },
                            _ => ClientError::NotLeader {
                                term: leadership.term,
                                leader_id: leadership.leader_id,
                            },
                        });
                    }
                }
            } else {
                None
            };
            let http_request = self.build_request(&request, uri.clone(), token)?;
            // Failpoint (compiled in only with the `failpoints` feature): between reading
            // the token and sending the write, the window in which a GC pause makes a
            // leader stale. `return` fails the write unsent; tests also stop the whole
            // process here (see the README's Tests section).
            fail::fail_point!("client-before-send", fenced, |arg: Option<String>| {
                Err(ClientError::Unreachable {
                    url: self.base.as_str(),
                    attempts: attempt,
                    reason: format!(
                        "failpoint client-before-send returned {}",
                        arg.unwrap_or_default()
                    ),
                })
            });
            tracing::debug!(attempt, token, "sending");
            let outcome = match self
                .transport
                .exchange(http_request, self.options.request_timeout)
                .await
            {
                Ok(answer) if answer.status.is_success() => {
                    return Ok(FencedResponse {
                        status: answer.status,
                        headers: answer.headers,
                        body: answer.body,
                        sent_token: token,
                        attempts: attempt,
                    });
                }
                Ok(answer) if answer.status == StatusCode::CONFLICT => {
                    return Err(self.conflict(&answer, token));
                }
                Ok(answer) if is_retryable_status(answer.status) => Outcome::Status(answer),
                Ok(answer) => {
                    return Err(ClientError::Status {
                        status: answer.status,
                        detail: answer.detail(),
                    });
                }
                Err(Failure::Connect(reason)) => Outcome::Unreachable(reason),
                Err(Failure::Timeout(after)) => {
                    Outcome::Indeterminate(format!("no answer within {} ms", millis(after)))
                }
                Err(Failure::Broken(reason)) => Outcome::Indeterminate(reason),
                Err(Failure::TooLarge) => {
                    return Err(ClientError::InvalidResponse(format!(
                        "response body is over {} bytes",
                        crate::http::RESPONSE_BYTES_MAX
                    )));
                }
            };
            // An earlier attempt that may have been applied keeps the call indeterminate
            // even if a later one found nothing to connect to.
            let outcome = match (last, outcome) {
                (Some(Outcome::Indeterminate(earlier)), Outcome::Unreachable(now)) => {
                    Outcome::Indeterminate(format!("{earlier}; then {now}"))
                }
                (_, outcome) => outcome,
            };
            if attempt >= attempts_max {
                return Err(self.final_error(&request.method, attempt, outcome));
            }
            let mut delay = backoff(
                attempt,
                self.options.backoff_initial,
                self.options.backoff_max,
            );
            if let Outcome::Status(answer) = &outcome
                && let Some(asked) =
                    retry_after(&answer.headers, Duration::from_millis(RETRY_AFTER_MAX_MS))
            {
                delay = delay.max(asked);
            }
            tracing::debug!(attempt, delay_ms = millis(delay), "retrying");
            last = Some(outcome);
            tokio::time::sleep(delay).await;
        }
    }

    fn build_request(
        &self,
        request: &FencedRequest,
        uri: http::Uri,
        token: Option<u64>,
    ) -> Result<Request<Full<Bytes>>, ClientError> {
        let mut http_request = Request::builder()
            .method(request.method.clone())
            .uri(uri)
            .body(Full::new(request.body.clone()))
            .map_err(|e| ClientError::InvalidRequest(e.to_string()))?;
        let headers = http_request.headers_mut();
        headers.extend(request.headers.clone());
        headers.remove(FENCING_TOKEN);
        if let Some(token) = token {
            headers.insert(FENCING_TOKEN, HeaderValue::from(token));
        }
        if let Some(scope) = &self.scope {
            let value = HeaderValue::try_from(scope.as_str())
                .map_err(|e| ClientError::InvalidRequest(format!("scope {scope:?}: {e}")))?;
            headers.insert(FENCING_SCOPE, value);
        }
        Ok(http_request)
    }

    /// A 409: a fencing rejection (mark the source, report the numbers), or a conflict of
    /// the storage's own, passed on as a status.
    fn conflict(&self, answer: &Answer, token: Option<u64>) -> ClientError {
        let scope = self.scope.as_deref().unwrap_or(DEFAULT_SCOPE_NAME);
        if let Some(token) = token
            && let Some(fenced) = fenced_error(answer, token, scope)
        {
            if let ClientError::Fenced {
                scope,
                presented,
                current,
            } = &fenced
            {
                tracing::warn!(
                    scope,
                    token = presented,
                    current,
                    "fenced out: a newer leader holds this scope; marking not leader"
                );
                self.source.mark_not_leader(*current);
            }
            return fenced;
        }
        ClientError::Status {
            status: answer.status,
            detail: answer.detail(),
        }
    }

    fn final_error(&self, method: &Method, attempts: u32, outcome: Outcome) -> ClientError {
        match outcome {
            Outcome::Unreachable(reason) => ClientError::Unreachable {
                url: self.base.as_str(),
                attempts,
                reason,
            },
            Outcome::Indeterminate(reason) => ClientError::Indeterminate {
                method: method.clone(),
                attempts,
                reason,
            },
            // The proxy timed out waiting for the upstream: a write may have been applied.
            Outcome::Status(answer)
                if answer.status == StatusCode::GATEWAY_TIMEOUT && is_write(method) =>
            {
                ClientError::Indeterminate {
                    method: method.clone(),
                    attempts,
                    reason: format!("{}: {}", answer.status, answer.detail()),
                }
            }
            Outcome::Status(answer) => ClientError::Status {
                status: answer.status,
                detail: answer.detail(),
            },
        }
    }
}

/// The scope the proxy uses when a request names none and no route matches.
const DEFAULT_SCOPE_NAME: &str = "default";

/// A fencing rejection in `answer`, if it is one: the proxy's rejections carry
/// `Fencing-Token-Current` and a problem+json body with `scope`, `presented`, `current`.
/// A 409 without either is the storage's own conflict, not a fencing one.
pub(crate) fn fenced_error(answer: &Answer, presented: u64, scope: &str) -> Option<ClientError> {
    let header_current = answer
        .headers
        .get(FENCING_TOKEN_CURRENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let problem = serde_json::from_slice::<serde_json::Value>(&answer.body).ok();
    let field = |name: &str| problem.as_ref().and_then(|p| p.get(name));
    let current = field("current")
        .and_then(serde_json::Value::as_u64)
        .or(header_current)?;
    Some(ClientError::Fenced {
        scope: field("scope")
            .and_then(serde_json::Value::as_str)
            .unwrap_or(scope)
            .to_owned(),
        presented: field("presented")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(presented),
        current,
    })
}

/// Checks a scope name against the contract: 1-128 of `[A-Za-z0-9._-]`.
pub fn validate_scope(scope: &str) -> Result<(), ClientError> {
    let ok = !scope.is_empty()
        && scope.len() <= SCOPE_BYTES_MAX
        && scope
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ClientError::InvalidRequest(format!(
            "scope {scope:?}: a scope is 1-{SCOPE_BYTES_MAX} of [A-Za-z0-9._-]"
        )))
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
fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE
    )
}

/// Statuses that say "try again": the gateway could not get an answer (502, 504) or the
/// proxy could not take the request now (503, with `Retry-After`).
fn is_retryable_status(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: StatusCode, headers: &[(&str, &str)], body: &str) -> Answer {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(
                HeaderName::try_from(*k).unwrap(),
                HeaderValue::try_from(*v).unwrap(),
            );
        }
        Answer {
            status,
            headers: map,
            body: Bytes::from(body.to_owned()),
        }
    }

    #[test]
    fn fencing_rejections_are_told_from_storage_conflicts() {
        let problem = answer(
            StatusCode::CONFLICT,
            &[(FENCING_TOKEN_CURRENT, "5")],
            r#"{"status":409,"scope":"billing","presented":3,"current":5}"#,
        );
        let Some(ClientError::Fenced {
            scope,
            presented,
            current,
        }) = fenced_error(&problem, 3, "default")
        else {
            panic!("not fenced");
        };
        assert_eq!((scope.as_str(), presented, current), ("billing", 3, 5));

        let header_only = answer(StatusCode::CONFLICT, &[(FENCING_TOKEN_CURRENT, "9")], "");
        assert!(matches!(
            fenced_error(&header_only, 4, "jobs"),
            Some(ClientError::Fenced { ref scope, presented: 4, current: 9 }) if scope == "jobs"
        ));

        let storage = answer(StatusCode::CONFLICT, &[], "version mismatch");
        assert!(fenced_error(&storage, 4, "jobs").is_none());
    }

    #[test]
    fn scopes_follow_the_contract() {
        assert!(validate_scope("billing.eu-1_a").is_ok());
        assert!(validate_scope("").is_err());
        assert!(validate_scope("bad scope").is_err());
        assert!(validate_scope(&"s".repeat(129)).is_err());
        assert!(validate_scope(&"s".repeat(128)).is_ok());
    }

    #[test]
    fn methods_are_classified() {
        assert!(is_write(&Method::PATCH) && !is_write(&Method::GET));
        assert!(is_idempotent(&Method::PUT) && !is_idempotent(&Method::POST));
        assert!(is_retryable_status(StatusCode::SERVICE_UNAVAILABLE));
        assert!(!is_retryable_status(StatusCode::CONFLICT));
    }

    #[test]
    fn invalid_headers_are_reported_at_send() {
        let request = FencedRequest::put("k", "x").header("bad header", "v");
        assert!(request.invalid.is_some());
    }
}
