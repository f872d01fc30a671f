//! [`FencedClient`]: HTTP requests through a Palisade proxy with the token attached to
//! writes, refused locally when not leading, stopped for good on a fencing rejection.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Method, StatusCode};
use palisade_protocol::headers::{
    FENCING_SCOPE, FENCING_TOKEN, FENCING_TOKEN_CURRENT, FENCING_TOKEN_PROOF,
};
use palisade_protocol::{DEFAULT_SCOPE, Scope, parse_token};

use crate::backoff;
use crate::error::ClientError;
use crate::request::{
    FencedRequest, FencedResponse, IDEMPOTENCY_KEY, is_idempotent, is_retryable_status, is_write,
};
use crate::source::{StaticToken, TokenSource};
use crate::transport::{
    Answer, BaseUrl, ClientTls, Failure, RESPONSE_BYTES_MAX, Transport, millis,
};

/// Default limit on one attempt, from sending to the whole answer. Above the proxy's
/// default barrier wait (5 s), so that a barrier 503 is seen as such and not as a timeout.
pub const REQUEST_TIMEOUT_MS: u64 = 10_000;
/// Default number of retries after the first attempt, for requests that may be retried.
pub const RETRIES_MAX: u32 = 3;
/// Default first backoff between attempts (before jitter); doubles each time.
pub const BACKOFF_INITIAL_MS: u64 = 100;
/// Default longest backoff between attempts, before jitter.
pub const BACKOFF_MAX_MS: u64 = 2_000;
/// Longest a server's `Retry-After` is honoured; the proxy asks for 1 s.
pub const RETRY_AFTER_MAX_MS: u64 = 5_000;

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
    tls: ClientTls,
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

    /// Backoff between attempts: [`backoff::exponential`] from `initial`, doubling up to
    /// `max`, each delay plus up to as much again of jitter (defaults
    /// [`BACKOFF_INITIAL_MS`], [`BACKOFF_MAX_MS`]). A server's `Retry-After` (up to
    /// [`RETRY_AFTER_MAX_MS`]) is waited for when it is longer.
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

    /// TLS settings for an `https://` proxy URL (extra trusted CAs, a client
    /// certificate). The default trusts the system's roots.
    #[must_use]
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = tls;
        self
    }

    /// Checks the URL and scope and builds the client.
    pub fn build(self) -> Result<FencedClient, ClientError> {
        let scope = self.scope.map(scope_of).transpose()?;
        Ok(FencedClient {
            base: BaseUrl::parse(&self.url)?,
            scope,
            source: self.source,
            transport: Transport::new(&self.tls)?,
            options: self.options,
        })
    }
}

/// An HTTP client for one proxy and one scope that fences its writes.
///
/// - Writes (PUT, POST, PATCH, DELETE) carry `Fencing-Token` from the [`TokenSource`],
///   read before every attempt, and `Fencing-Token-Proof` whenever the source has the
///   token's proof (a proxy run with `--token-pub` admits no token without one). When the source reports no established leadership the
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
    scope: Option<Scope>,
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
    /// A builder for a client of the proxy at `proxy_url` (`http://host:port` or
    /// `https://host:port`, optionally with a path prefix) taking tokens from `source`.
    pub fn builder(proxy_url: &str, source: Arc<dyn TokenSource>) -> FencedClientBuilder {
        FencedClientBuilder {
            url: proxy_url.to_owned(),
            source,
            scope: None,
            tls: ClientTls::default(),
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
        self.scope.as_ref().map(Scope::as_str)
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
        method = %request.method, path = %request.path, scope = self.scope().unwrap_or("-")))]
    pub async fn send(&self, request: FencedRequest) -> Result<FencedResponse, ClientError> {
        if let Some(reason) = &request.invalid {
            return Err(ClientError::InvalidRequest(reason.clone()));
        }
        let url = self.base.join(&request.path)?;
        let fenced = is_write(&request.method) || self.options.fence_reads;
        let retryable =
            is_idempotent(&request.method) || request.headers.contains_key(IDEMPOTENCY_KEY);
        let attempts_max = if retryable {
            self.options.retries_max.saturating_add(1)
        } else {
            1
        };
        let mut delays = backoff::delays(self.options.backoff_initial, self.options.backoff_max);
        let mut attempt: u32 = 0;
        let mut last: Option<Outcome> = None;
        loop {
            attempt += 1;
            let (token, proof) = if fenced {
                let leadership = self.source.current().await;
                match leadership.write_token() {
                    Some(token) => (Some(token), leadership.write_proof().map(str::to_owned)),
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
                (None, None)
            };
            let http_request =
                self.build_request(&request, url.clone(), token, proof.as_deref())?;
            // Failpoint (compiled in only with the `failpoints` feature): between reading
            // the token and sending the write, the window in which a GC pause makes a
            // leader stale. `return` fails the write unsent; tests also stop the whole
            // process here (see the README's Tests section).
            fail::fail_point!("client-before-send", fenced, |arg: Option<String>| {
                Err(ClientError::Unreachable {
                    url: self.base.as_str().to_owned(),
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
                Ok(answer) => return Err(answer.status_error()),
                Err(Failure::Connect(reason)) => Outcome::Unreachable(reason),
                Err(Failure::Tls(reason)) => {
                    // As below: an earlier attempt that may have been applied keeps the
                    // call indeterminate.
                    return Err(match last {
                        Some(Outcome::Indeterminate(earlier)) => ClientError::Indeterminate {
                            method: request.method.clone(),
                            attempts: attempt,
                            reason: format!("{earlier}; then TLS failed: {reason}"),
                        },
                        _ => ClientError::Tls {
                            url: self.base.as_str().to_owned(),
                            reason,
                        },
                    });
                }
                Err(Failure::Invalid(reason)) => return Err(ClientError::InvalidRequest(reason)),
                Err(Failure::Timeout(after)) => {
                    Outcome::Indeterminate(format!("no answer within {} ms", millis(after)))
                }
                Err(Failure::Broken(reason)) => Outcome::Indeterminate(reason),
                Err(Failure::TooLarge) => {
                    return Err(ClientError::InvalidResponse(format!(
                        "response body is over {RESPONSE_BYTES_MAX} bytes"
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
            let mut delay = delays.next().unwrap_or(self.options.backoff_max);
            if let Outcome::Status(answer) = &outcome
                && let Some(asked) =
                    backoff::retry_after(&answer.headers, Duration::from_millis(RETRY_AFTER_MAX_MS))
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
        url: reqwest::Url,
        token: Option<u64>,
        proof: Option<&str>,
    ) -> Result<reqwest::RequestBuilder, ClientError> {
        let mut headers = request.headers.clone();
        // The token and its proof are the source's to set, together: a proof left over
        // from the caller's headers could pair with another token.
        headers.remove(FENCING_TOKEN);
        headers.remove(FENCING_TOKEN_PROOF);
        if let Some(token) = token {
            headers.insert(FENCING_TOKEN, HeaderValue::from(token));
            if let Some(proof) = proof {
                let value = HeaderValue::try_from(proof).map_err(|e| {
                    ClientError::InvalidRequest(format!(
                        "the token source's proof is not a header value: {e}"
                    ))
                })?;
                headers.insert(FENCING_TOKEN_PROOF, value);
            }
        }
        if let Some(scope) = &self.scope {
            let value = HeaderValue::try_from(scope.as_str())
                .map_err(|e| ClientError::InvalidRequest(format!("scope {scope:?}: {e}")))?;
            headers.insert(FENCING_SCOPE, value);
        }
        Ok(self
            .transport
            .request(request.method.clone(), url)
            .headers(headers)
            .body(request.body.clone()))
    }

    /// A 409: a fencing rejection (mark the source, report the numbers), or a conflict of
    /// the storage's own, passed on as a status.
    fn conflict(&self, answer: &Answer, token: Option<u64>) -> ClientError {
        let scope = self.scope().unwrap_or(DEFAULT_SCOPE);
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
        answer.status_error()
    }

    fn final_error(&self, method: &Method, attempts: u32, outcome: Outcome) -> ClientError {
        match outcome {
            Outcome::Unreachable(reason) => ClientError::Unreachable {
                url: self.base.as_str().to_owned(),
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
            Outcome::Status(answer) => answer.status_error(),
        }
    }
}

/// A fencing rejection in `answer`, if it is one: the proxy's rejections carry
/// `Fencing-Token-Current` and a problem+json body with `scope`, `presented`, `current`.
/// A 409 without either is the storage's own conflict, not a fencing one.
pub(crate) fn fenced_error(answer: &Answer, presented: u64, scope: &str) -> Option<ClientError> {
    let header_current = answer
        .headers
        .get(FENCING_TOKEN_CURRENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_token(v).ok());
    let problem = answer.problem();
    let current = problem
        .as_ref()
        .and_then(|p| p.current)
        .or(header_current)?;
    let (scope, presented) = match problem {
        Some(p) => (
            p.scope.unwrap_or_else(|| scope.to_owned()),
            p.presented.unwrap_or(presented),
        ),
        None => (scope.to_owned(), presented),
    };
    Some(ClientError::Fenced {
        scope,
        presented,
        current,
    })
}

/// A scope name checked against the contract's rule ([`Scope::new`]).
pub(crate) fn scope_of(name: impl Into<String>) -> Result<Scope, ClientError> {
    Scope::new(name).map_err(|e| ClientError::InvalidRequest(e.to_string()))
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;
    use palisade_protocol::Problem;

    use super::*;

    fn answer(status: StatusCode, current: Option<&str>, body: &str) -> Answer {
        let mut headers = HeaderMap::new();
        if let Some(current) = current {
            headers.insert(
                FENCING_TOKEN_CURRENT,
                HeaderValue::try_from(current).unwrap(),
            );
        }
        Answer {
            status,
            headers,
            body: Bytes::from(body.to_owned()),
        }
    }

    /// Goal: a proxy's fencing rejection is read with its numbers (from the problem body
    /// or, failing that, the header), and a storage conflict is not taken for one.
    /// Method: three 409 answers.
    #[test]
    fn fencing_rejections_are_told_from_storage_conflicts() {
        let body = serde_json::to_string(
            &Problem::new(StatusCode::CONFLICT, "stale-token", "stale").with_fence("billing", 3, 5),
        )
        .unwrap();
        let problem = answer(StatusCode::CONFLICT, Some("5"), &body);
        let Some(ClientError::Fenced {
            scope,
            presented,
            current,
        }) = fenced_error(&problem, 3, "default")
        else {
            panic!("not fenced");
        };
        assert_eq!((scope.as_str(), presented, current), ("billing", 3, 5));

        let header_only = answer(StatusCode::CONFLICT, Some("9"), "");
        assert!(matches!(
            fenced_error(&header_only, 4, "jobs"),
            Some(ClientError::Fenced { ref scope, presented: 4, current: 9 }) if scope == "jobs"
        ));

        let storage = answer(StatusCode::CONFLICT, None, "version mismatch");
        assert!(fenced_error(&storage, 4, "jobs").is_none());
    }

    /// Goal: the token and its proof are the source's alone: a caller's own
    /// `Fencing-Token-Proof` is replaced (or dropped when the source has none), and a
    /// proof that cannot be a header value (a forged leader view with a line break) is
    /// refused before anything is sent. Method: build requests directly.
    #[test]
    fn the_proof_header_is_the_sources_alone() {
        let client = FencedClient::with_token("http://127.0.0.1:1", 3).unwrap();
        let url = client.base.join("k").unwrap();
        let planted = FencedRequest::put("k", "v").header("fencing-token-proof", "planted");
        let headers = |proof: Option<&str>| {
            client
                .build_request(&planted, url.clone(), Some(3), proof)
                .unwrap()
                .build()
                .unwrap()
                .headers()
                .clone()
        };
        let with = headers(Some("c2ln"));
        assert_eq!(with.get_all(FENCING_TOKEN_PROOF).iter().count(), 1);
        assert_eq!(with[FENCING_TOKEN_PROOF], "c2ln");
        assert!(headers(None).get(FENCING_TOKEN_PROOF).is_none());
        let bad = client.build_request(&planted, url, Some(3), Some("ab\r\nX-Evil: 1"));
        assert!(matches!(bad, Err(ClientError::InvalidRequest(_))));
    }

    /// Goal: the builder refuses a scope the contract forbids before anything is sent.
    /// Method: build clients with a good and a bad scope.
    #[test]
    fn builder_checks_the_scope() {
        let source: Arc<dyn TokenSource> = Arc::new(StaticToken::new(1));
        let good = FencedClient::builder("http://127.0.0.1:1", source.clone())
            .scope("billing.eu-1_a")
            .build()
            .unwrap();
        assert_eq!(good.scope(), Some("billing.eu-1_a"));
        let bad = FencedClient::builder("http://127.0.0.1:1", source)
            .scope("bad scope")
            .build()
            .unwrap_err();
        assert!(matches!(bad, ClientError::InvalidRequest(_)), "{bad}");
    }
}
