//! Every way a proxied request can fail, who caused it, and its one HTTP answer.
//!
//! Errors are answered as `application/problem+json` (RFC 9457). Fencing errors also carry
//! `scope`, `presented` and `current`, and the `Fencing-Token-Current` header.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde_json::json;

use crate::body::{ProxyBody, full};

/// The fixed response header that tells a rejected client the scope's current fence.
pub const FENCING_TOKEN_CURRENT: &str = "fencing-token-current";

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
        reason: String,
    },
    /// A scope name outside the contract.
    #[error("invalid scope: {reason}")]
    BadScope {
        /// What is wrong with it.
        reason: String,
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
    /// The body is over `limits.body_bytes_max`.
    #[error("request body is over the limit of {max} bytes")]
    BodyTooLarge {
        /// The limit.
        max: u64,
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
    /// The embedded store has nothing at this key.
    #[error("no object at {key}")]
    NotFound {
        /// The key.
        key: String,
    },
    /// The embedded store does not support this method.
    #[error("method {method} is not supported by the embedded store")]
    MethodNotAllowed {
        /// The method.
        method: String,
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
            | Self::BadToken { .. }
            | Self::BadScope { .. }
            | Self::Stale { .. }
            | Self::BodyTooLarge { .. }
            | Self::BodyTimeout { .. }
            | Self::BodyRead(_)
            | Self::BadRequest(_)
            | Self::NotFound { .. }
            | Self::MethodNotAllowed { .. } => Cause::Client,
            Self::UpstreamTimeout { .. } | Self::Upstream(_) => Cause::Upstream,
            Self::BarrierTimeout { .. } | Self::Storage(_) | Self::Unavailable(_) => {
                Cause::Internal
            }
        }
    }

    /// The one HTTP status for this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingToken => StatusCode::PRECONDITION_REQUIRED,
            Self::BadToken { .. }
            | Self::BadScope { .. }
            | Self::BadRequest(_)
            | Self::BodyRead(_) => StatusCode::BAD_REQUEST,
            Self::Stale { .. } => StatusCode::CONFLICT,
            Self::BarrierTimeout { .. } | Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::NotFound { .. } => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::Upstream(_) => StatusCode::BAD_GATEWAY,
            Self::Storage(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A short stable name, used as the metrics `reason` label and the problem `type`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingToken => "missing-token",
            Self::BadToken { .. } => "bad-token",
            Self::BadScope { .. } => "bad-scope",
            Self::Stale { .. } => "stale-token",
            Self::BarrierTimeout { .. } => "barrier-timeout",
            Self::BodyTooLarge { .. } => "body-too-large",
            Self::BodyTimeout { .. } => "body-timeout",
            Self::BodyRead(_) => "body-read",
            Self::BadRequest(_) => "bad-request",
            Self::NotFound { .. } => "not-found",
            Self::MethodNotAllowed { .. } => "method-not-allowed",
            Self::UpstreamTimeout { .. } => "upstream-timeout",
            Self::Upstream(_) => "upstream-error",
            Self::Storage(_) => "storage-error",
            Self::Unavailable(_) => "unavailable",
        }
    }

    /// The scope's fence, for errors that know it.
    fn current(&self) -> Option<u64> {
        match self {
            Self::Stale { current, .. } | Self::BarrierTimeout { current, .. } => Some(*current),
            _ => None,
        }
    }

    /// The problem+json response.
    pub fn into_response(self) -> Response<ProxyBody> {
        let status = self.status();
        let mut problem = json!({
            "type": format!("https://palisade.invalid/problems/{}", self.reason()),
            "title": status.canonical_reason().unwrap_or("error"),
            "status": status.as_u16(),
            "detail": self.to_string(),
        });
        if let Self::Stale {
            scope,
            presented,
            current,
        }
        | Self::BarrierTimeout {
            scope,
            presented,
            current,
            ..
        } = &self
        {
            problem["scope"] = json!(scope);
            problem["presented"] = json!(presented);
            problem["current"] = json!(current);
        }
        let mut response = problem_response(status, &problem);
        if let Some(current) = self.current() {
            response
                .headers_mut()
                .insert(FENCING_TOKEN_CURRENT, HeaderValue::from(current));
        }
        if matches!(self, Self::BarrierTimeout { .. } | Self::Unavailable(_)) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// A problem+json response with the given body.
pub(crate) fn problem_response(
    status: StatusCode,
    problem: &serde_json::Value,
) -> Response<ProxyBody> {
    let mut response = Response::new(full(Bytes::from(problem.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

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
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["status"], 409);
        assert_eq!(v["scope"], "default");
        assert_eq!(v["presented"], 3);
        assert_eq!(v["current"], 7);
        assert!(v["detail"].as_str().unwrap().contains("current is 7"));
    }

    #[test]
    fn each_error_has_its_status() {
        assert_eq!(
            ProxyError::MissingToken.status(),
            StatusCode::PRECONDITION_REQUIRED
        );
        assert_eq!(
            ProxyError::BadToken {
                reason: String::new()
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
            ProxyError::BodyTooLarge { max: 1 }.status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }
}
