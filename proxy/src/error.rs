//! Every way a proxied request can fail, who caused it, and its one HTTP answer.
//!
//! Errors are answered as `application/problem+json` (RFC 9457): [`ProxyError::to_problem`]
//! is the one mapping from an error to its [`Problem`], used by the data path and the
//! admin API alike. Fencing errors also carry `scope`, `presented` and `current`, and the
//! `Fencing-Token-Current` header.

use http::{HeaderValue, Response, StatusCode, header};
use palisade_protocol::headers::{FENCING_TOKEN_CURRENT, PROBLEM_JSON};
use palisade_protocol::lease::LEASE_EXPIRED;
use palisade_protocol::problem::kind;
use palisade_protocol::{Problem, TokenError};

use crate::body::{ProxyBody, full};
use crate::proof::ProofFault;

/// Who caused an error: decides the status class and the log level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The request was wrong or not allowed (4xx).
    Client,
    /// The upstream failed or was too slow (502/504).
    Upstream,
    /// The proxy itself could not do its job (500/503).
    Internal,
}

/// Why a request was not forwarded, or failed after forwarding.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// A write without `Fencing-Token`.
    #[error("missing Fencing-Token header on a fenced request")]
    MissingToken,
    /// A `Fencing-Token` that is not one decimal u64.
    #[error("invalid Fencing-Token: {reason}")]
    BadToken {
        /// What is wrong with it.
        reason: TokenError,
    },
    /// A fenced request without `Fencing-Token-Proof`, at a proxy that checks proofs.
    #[error(
        "missing Fencing-Token-Proof: this proxy admits token {presented} for scope {scope} only with the cluster's proof"
    )]
    MissingProof {
        /// The scope.
        scope: String,
        /// The token the request carried.
        presented: u64,
    },
    /// A `Fencing-Token-Proof` that is malformed or not the cluster's signature of
    /// exactly this scope and token.
    #[error("invalid proof for token {presented} of scope {scope}: {fault}")]
    InvalidProof {
        /// The scope.
        scope: String,
        /// The token the request carried.
        presented: u64,
        /// What is wrong with the proof.
        fault: ProofFault,
    },
    /// A scope name outside the contract.
    #[error("invalid scope: {reason}")]
    BadScope {
        /// What is wrong with it.
        reason: String,
    },
    /// A path whose meaning depends on how it is decoded (`%2F`, `%00`, a dot segment
    /// above the root, bad percent-encoding): refused, since the storage might read it
    /// differently from the route that fenced it.
    #[error("ambiguous path: {reason}")]
    BadPath {
        /// What is ambiguous about it.
        reason: String,
    },
    /// CONNECT, or an upgrade on a route that does not allow it.
    #[error("{reason}")]
    NotTunnelled {
        /// Why the tunnel is refused, and how to allow it where that is possible.
        reason: String,
    },
    /// `limits.scopes_max` scopes exist and the request names a new one.
    #[error(
        "scope {scope} is new, and the proxy already remembers its limit of {scopes_max} scopes (limits.scopes_max)"
    )]
    ScopesFull {
        /// The new scope.
        scope: String,
        /// The limit.
        scopes_max: usize,
    },
    /// The token is below the scope's fence.
    #[error("stale fencing token {presented} for scope {scope}: current is {current}")]
    Stale {
        /// The scope.
        scope: String,
        /// The token the request carried.
        presented: u64,
        /// The scope's fence.
        current: u64,
    },
    /// Fleet mode: a token above the term the cluster granted a lease for, just
    /// confirmed by a renewal. The cluster has not issued it.
    #[error(
        "fencing token {presented} for scope {scope} is above the cluster's current term {current}: the cluster has not issued it"
    )]
    NotIssued {
        /// The scope.
        scope: String,
        /// The token the request carried.
        presented: u64,
        /// The term the cluster's lease names (the scope's fence).
        current: u64,
    },
    /// Fleet mode: a fenced request of a scope other than the cluster's. The fleet
    /// follows one cluster, whose lease covers only its own scope.
    #[error(
        "scope {scope} is not fenced by this proxy's cluster, whose scope is {cluster_scope}: in fleet mode only the cluster's scope takes fenced requests"
    )]
    ForeignScope {
        /// The scope.
        scope: String,
        /// The cluster's scope.
        cluster_scope: String,
    },
    /// Fleet mode: no valid lease, and a renewal failed or did not finish in time.
    /// Nothing was forwarded.
    #[error("no valid lease for token {presented} of scope {scope}: {reason}")]
    LeaseExpired {
        /// The scope.
        scope: String,
        /// The token the request carried.
        presented: u64,
        /// Why there is no lease (the last renewal's failure, or the wait's limit).
        reason: String,
    },
    /// Lower-token writes were still in flight at the deadline.
    #[error(
        "fencing token {presented} for scope {scope} waited {waited_ms} ms for lower-token writes still in flight"
    )]
    BarrierTimeout {
        /// The scope.
        scope: String,
        /// The token the request carried.
        presented: u64,
        /// The scope's fence.
        current: u64,
        /// How long it waited.
        waited_ms: u64,
    },
    /// A reset waited past the barrier timeout for the scope's writes in flight; the
    /// fence is unchanged.
    #[error(
        "reset of scope {scope} to {presented} waited {waited_ms} ms for writes still in flight; the fence is unchanged at {current}"
    )]
    ResetTimeout {
        /// The scope.
        scope: String,
        /// The token the reset asked for.
        presented: u64,
        /// The scope's fence, unchanged.
        current: u64,
        /// How long it waited.
        waited_ms: u64,
    },
    /// The body is over `limits.body_bytes_max`, or over the embedded store's
    /// `limits.object_bytes_max`.
    #[error("request body is over the limit of {max} bytes ({field})")]
    BodyTooLarge {
        /// The limit.
        max: u64,
        /// The configuration field that sets it.
        field: &'static str,
    },
    /// The request head is over `limits.header_bytes_max`.
    #[error(
        "request head of {bytes} bytes is over the limit of {max} bytes (limits.header_bytes_max)"
    )]
    HeadTooLarge {
        /// The head's size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// The client did not send its body in time.
    #[error("request body not received within {timeout_ms} ms")]
    BodyTimeout {
        /// The limit.
        timeout_ms: u64,
    },
    /// The client's body could not be read.
    #[error("cannot read request body: {0}")]
    BodyRead(String),
    /// The path is not usable (the embedded store wants a key).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// A `Connection` header naming a header that frames, targets or fences the
    /// request: forwarding it would mean dropping that header, so the request is refused.
    #[error("{reason}")]
    BadConnection {
        /// Which header is named, and why it cannot be dropped.
        reason: String,
    },
    /// The target host is ambiguous or missing: `Host` repeated, malformed, absent on
    /// HTTP/1.1, or different from the absolute-form target's authority.
    #[error("{reason}")]
    BadHost {
        /// What is wrong with it.
        reason: String,
    },
    /// A `Transfer-Encoding` other than a single `chunked`.
    #[error(
        "Transfer-Encoding {codings:?} is not supported: the proxy forwards only bodies sent plain or with the single coding chunked, and would otherwise have to drop or decode the others"
    )]
    UnsupportedTransferCoding {
        /// The codings as sent (every `Transfer-Encoding` line, joined).
        codings: String,
    },
    /// A GET or HEAD with a body, on a route that does not take one.
    #[error(
        "a {method} request carries no body here: {path:?} is covered by no route with read_bodies = true"
    )]
    BodyOnRead {
        /// The method.
        method: String,
        /// The request's path.
        path: String,
    },
    /// The body did not arrive, as far as it is read before the request takes an
    /// upstream slot, within `limits.body_arrival_timeout_ms`.
    #[error(
        "request body did not arrive within {timeout_ms} ms (limits.body_arrival_timeout_ms); nothing was forwarded"
    )]
    BodyArrivalTimeout {
        /// The limit.
        timeout_ms: u64,
    },
    /// `limits.unfenced_streams_max` requests without a fencing token were streaming
    /// their bodies to the upstream, and none finished in time.
    #[error(
        "{max} requests without a fencing token are streaming their bodies to the upstream (limits.unfenced_streams_max) and none finished within {waited_ms} ms"
    )]
    UnfencedStreamsFull {
        /// The limit.
        max: usize,
        /// How long this request waited.
        waited_ms: u64,
    },
    /// The embedded store has nothing at this key.
    #[error("no object at {key}")]
    NotFound {
        /// The key.
        key: String,
    },
    /// The resource does not take this method.
    #[error("method {method} is not allowed here; allowed: {allowed}")]
    MethodNotAllowed {
        /// The method.
        method: String,
        /// The methods the resource takes, as an `Allow` header value.
        allowed: &'static str,
    },
    /// No response head from the upstream in time.
    #[error("upstream did not answer within {timeout_ms} ms")]
    UpstreamTimeout {
        /// The limit.
        timeout_ms: u64,
    },
    /// The upstream could not be reached or broke the exchange.
    #[error("upstream error: {0}")]
    Upstream(String),
    /// The proxy's own storage failed; nothing was forwarded.
    #[error("storage error: {0}")]
    Storage(String),
    /// The proxy is shutting down or otherwise cannot take work.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

impl ProxyError {
    /// Who caused it.
    pub fn cause(&self) -> Cause {
        match self {
            Self::MissingToken
            | Self::MissingProof { .. }
            | Self::InvalidProof { .. }
            | Self::BadToken { .. }
            | Self::BadScope { .. }
            | Self::BadPath { .. }
            | Self::NotTunnelled { .. }
            | Self::ScopesFull { .. }
            | Self::Stale { .. }
            | Self::NotIssued { .. }
            | Self::ForeignScope { .. }
            | Self::BodyTooLarge { .. }
            | Self::HeadTooLarge { .. }
            | Self::BodyTimeout { .. }
            | Self::BodyRead(_)
            | Self::BadRequest(_)
            | Self::BadConnection { .. }
            | Self::BadHost { .. }
            | Self::UnsupportedTransferCoding { .. }
            | Self::BodyOnRead { .. }
            | Self::BodyArrivalTimeout { .. }
            | Self::NotFound { .. }
            | Self::MethodNotAllowed { .. } => Cause::Client,
            Self::UpstreamTimeout { .. } | Self::Upstream(_) => Cause::Upstream,
            Self::BarrierTimeout { .. }
            | Self::ResetTimeout { .. }
            | Self::LeaseExpired { .. }
            | Self::UnfencedStreamsFull { .. }
            | Self::Storage(_)
            | Self::Unavailable(_) => Cause::Internal,
        }
    }

    /// The one HTTP status for this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingToken => StatusCode::PRECONDITION_REQUIRED,
            Self::MissingProof { .. } | Self::InvalidProof { .. } => StatusCode::UNAUTHORIZED,
            Self::BadToken { .. }
            | Self::BadScope { .. }
            | Self::BadPath { .. }
            | Self::BadRequest(_)
            | Self::BadConnection { .. }
            | Self::BadHost { .. }
            | Self::BodyOnRead { .. }
            | Self::BodyRead(_) => StatusCode::BAD_REQUEST,
            Self::UnsupportedTransferCoding { .. } => StatusCode::NOT_IMPLEMENTED,
            Self::Stale { .. } | Self::NotIssued { .. } => StatusCode::CONFLICT,
            Self::ForeignScope { .. } => StatusCode::FORBIDDEN,
            Self::ScopesFull { .. } => StatusCode::INSUFFICIENT_STORAGE,
            Self::BarrierTimeout { .. }
            | Self::ResetTimeout { .. }
            | Self::LeaseExpired { .. }
            | Self::UnfencedStreamsFull { .. }
            | Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::HeadTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::BodyTimeout { .. } | Self::BodyArrivalTimeout { .. } => {
                StatusCode::REQUEST_TIMEOUT
            }
            Self::NotFound { .. } => StatusCode::NOT_FOUND,
            Self::NotTunnelled { .. } | Self::MethodNotAllowed { .. } => {
                StatusCode::METHOD_NOT_ALLOWED
            }
            Self::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::Upstream(_) => StatusCode::BAD_GATEWAY,
            Self::Storage(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A short stable name, used as the metrics `reason` label and the problem `type`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingToken => kind::MISSING_TOKEN,
            Self::MissingProof { .. } => kind::MISSING_PROOF,
            Self::InvalidProof { .. } => kind::INVALID_PROOF,
            Self::BadToken { .. } => kind::BAD_TOKEN,
            Self::BadScope { .. } => kind::BAD_SCOPE,
            Self::BadPath { .. } => kind::BAD_PATH,
            Self::NotTunnelled { .. } => kind::TUNNEL_REFUSED,
            Self::ScopesFull { .. } => kind::SCOPES_FULL,
            Self::Stale { .. } => kind::STALE_TOKEN,
            Self::NotIssued { .. } => kind::TOKEN_NOT_ISSUED,
            Self::ForeignScope { .. } => kind::FOREIGN_SCOPE,
            Self::LeaseExpired { .. } => LEASE_EXPIRED,
            Self::BarrierTimeout { .. } | Self::ResetTimeout { .. } => kind::BARRIER_TIMEOUT,
            Self::BodyTooLarge { .. } => kind::BODY_TOO_LARGE,
            Self::HeadTooLarge { .. } => kind::HEAD_TOO_LARGE,
            Self::BodyTimeout { .. } | Self::BodyArrivalTimeout { .. } => kind::BODY_TIMEOUT,
            Self::BodyRead(_) => kind::BODY_READ,
            Self::BadRequest(_) => kind::BAD_REQUEST,
            Self::BadConnection { .. } => kind::BAD_CONNECTION,
            Self::BadHost { .. } => kind::BAD_HOST,
            Self::UnsupportedTransferCoding { .. } => kind::UNSUPPORTED_TRANSFER_CODING,
            Self::BodyOnRead { .. } => kind::BODY_ON_READ,
            Self::UnfencedStreamsFull { .. } => kind::UNFENCED_STREAMS_FULL,
            Self::NotFound { .. } => kind::NOT_FOUND,
            Self::MethodNotAllowed { .. } => kind::METHOD_NOT_ALLOWED,
            Self::UpstreamTimeout { .. } => kind::UPSTREAM_TIMEOUT,
            Self::Upstream(_) => kind::UPSTREAM_ERROR,
            Self::Storage(_) => kind::STORAGE_ERROR,
            Self::Unavailable(_) => kind::UNAVAILABLE,
        }
    }

    /// The error as problem+json: the one mapping from an error to its answer body.
    /// The kind is [`reason`](Self::reason), the detail the error's message, and the
    /// fencing errors add `scope`, `presented` and `current` (a proof error the first
    /// two: the proxy does not tell an unproven client the fence).
    pub fn to_problem(&self) -> Problem {
        let mut problem = Problem::new(self.status(), self.reason(), self.to_string());
        match self {
            Self::MissingProof { scope, presented }
            | Self::InvalidProof {
                scope, presented, ..
            }
            | Self::LeaseExpired {
                scope, presented, ..
            } => {
                problem.scope = Some(scope.clone());
                problem.presented = Some(*presented);
                problem
            }
            Self::Stale {
                scope,
                presented,
                current,
            }
            | Self::NotIssued {
                scope,
                presented,
                current,
            }
            | Self::BarrierTimeout {
                scope,
                presented,
                current,
                ..
            }
            | Self::ResetTimeout {
                scope,
                presented,
                current,
                ..
            } => problem.with_fence(scope, *presented, *current),
            _ => problem,
        }
    }

    /// The data path's answer: the problem+json body of [`to_problem`](Self::to_problem)
    /// as a hyper response, with `Fencing-Token-Current` when the problem names the
    /// scope's fence, `Retry-After` on a 503, and `Allow` on a 405.
    pub fn into_response(self) -> Response<ProxyBody> {
        let mut response = problem_response(&self.to_problem());
        if let Self::MethodNotAllowed { allowed, .. } = self {
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allowed));
        }
        response
    }
}

/// A problem as a hyper response. The headers are the ones the control plane's axum
/// answer of a [`Problem`] carries, so a client reads a rejection the same way from the
/// data path and from the admin API.
fn problem_response(problem: &Problem) -> Response<ProxyBody> {
    // Serializing a struct of strings and integers cannot fail; an empty body would
    // still carry the status and headers.
    let body = serde_json::to_vec(problem).unwrap_or_default();
    let mut response = Response::new(full(body));
    *response.status_mut() = problem.status_code();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    if let Some(current) = problem.current {
        headers.insert(FENCING_TOKEN_CURRENT, HeaderValue::from(current));
    }
    if problem.status_code() == StatusCode::SERVICE_UNAVAILABLE {
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// Goal: a stale rejection answers 409 problem+json with the numbers in the body and
    /// the fence in `Fencing-Token-Current`.
    /// Method: render a `Stale` error and read the response back.
    #[tokio::test]
    async fn stale_answer_carries_numbers_and_header() {
        let err = ProxyError::Stale {
            scope: "default".into(),
            presented: 3,
            current: 7,
        };
        assert_eq!(err.cause(), Cause::Client);
        let response = err.into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[FENCING_TOKEN_CURRENT], "7");
        assert_eq!(response.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["status"], 409);
        assert_eq!(v["scope"], "default");
        assert_eq!(v["presented"], 3);
        assert_eq!(v["current"], 7);
        assert!(v["detail"].as_str().unwrap().contains("current is 7"));
        assert_eq!(
            v["type"], "https://palisade.invalid/problems/stale-token",
            "{v}"
        );
    }

    /// Goal: a barrier timeout is a 503 that says when to retry and carries the fence; a
    /// 405 names the allowed methods.
    /// Method: render both errors and inspect the heads.
    #[test]
    fn retry_after_and_allow_headers() {
        let barrier = ProxyError::BarrierTimeout {
            scope: "s".into(),
            presented: 2,
            current: 2,
            waited_ms: 9,
        }
        .into_response();
        assert_eq!(barrier.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(barrier.headers()[header::RETRY_AFTER], "1");
        assert_eq!(barrier.headers()[FENCING_TOKEN_CURRENT], "2");
        let method = ProxyError::MethodNotAllowed {
            method: "PATCH".into(),
            allowed: "GET, PUT",
        };
        assert_eq!(
            method.to_string(),
            "method PATCH is not allowed here; allowed: GET, PUT"
        );
        let response = method.into_response();
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(response.headers()[header::ALLOW], "GET, PUT");
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
    }

    /// Goal: every error has its one status.
    /// Method: check the statuses of a sample of errors.
    #[test]
    fn each_error_has_its_status() {
        assert_eq!(
            ProxyError::MissingToken.status(),
            StatusCode::PRECONDITION_REQUIRED
        );
        assert_eq!(
            ProxyError::BadToken {
                reason: TokenError::Empty
            }
            .status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            ProxyError::BarrierTimeout {
                scope: String::new(),
                presented: 1,
                current: 1,
                waited_ms: 1
            }
            .status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            ProxyError::BodyTooLarge {
                max: 1,
                field: "limits.body_bytes_max"
            }
            .status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }

    /// Goal: a proof refusal is a 401 problem of its own kind that names the scope and
    /// the presented token but not the fence (an unproven client is not told it), and
    /// says what is wrong with the proof.
    /// Method: render both proof errors.
    #[test]
    fn proof_refusals_are_401_without_the_fence() {
        let missing = ProxyError::MissingProof {
            scope: "jobs".into(),
            presented: 7,
        };
        let invalid = ProxyError::InvalidProof {
            scope: "jobs".into(),
            presented: 7,
            fault: ProofFault::Malformed(palisade_protocol::proof::ProofDecodeError::NotBase64),
        };
        for (err, kind) in [(missing, "missing-proof"), (invalid, "invalid-proof")] {
            assert_eq!(err.cause(), Cause::Client);
            let problem = err.to_problem();
            assert_eq!(problem.status_code(), StatusCode::UNAUTHORIZED);
            assert_eq!(problem.kind(), kind);
            assert_eq!(problem.scope.as_deref(), Some("jobs"));
            assert_eq!((problem.presented, problem.current), (Some(7), None));
            let response = err.into_response();
            assert!(response.headers().get(FENCING_TOKEN_CURRENT).is_none());
        }
        let invalid = ProxyError::InvalidProof {
            scope: "jobs".into(),
            presented: 7,
            fault: ProofFault::Malformed(palisade_protocol::proof::ProofDecodeError::NotBase64),
        };
        assert_eq!(
            invalid.to_string(),
            "invalid proof for token 7 of scope jobs: Fencing-Token-Proof is not unpadded base64url"
        );
    }
}
