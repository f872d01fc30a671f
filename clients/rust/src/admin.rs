//! [`ProxyAdmin`]: a client of the proxy's admin API, to read fences and to advance one
//! without a write (how a new leader fences out its predecessor at once).

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use serde::{Deserialize, Serialize};

use crate::client::{fenced_error, validate_scope};
use crate::error::ClientError;
use crate::http::{BaseUrl, Failure, Transport, millis};
use crate::node::parse_json;

/// Longest an admin call may take: reads are answered from memory, an advance is one
/// fsync.
pub const ADMIN_TIMEOUT_MS: u64 = 5_000;

/// One scope's fence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// The scope.
    pub scope: String,
    /// The highest token the proxy has admitted (0 when never seen).
    pub token: u64,
}

/// The answer to an advance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advanced {
    /// The scope.
    pub scope: String,
    /// The token asked for; the fence is now at least this.
    pub token: u64,
    /// Whether the fence moved (false: it was already at `token`).
    pub advanced: bool,
}

#[derive(Deserialize)]
struct FenceList {
    fences: Vec<Fence>,
}

/// A client of one proxy's admin API. Cheap to clone.
#[derive(Clone)]
pub struct ProxyAdmin {
    base: BaseUrl,
    transport: Transport,
}

impl std::fmt::Debug for ProxyAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyAdmin")
            .field("url", &self.base.as_str())
            .finish_non_exhaustive()
    }
}

impl ProxyAdmin {
    /// A client of the admin API at `url` (`http://host:port`).
    pub fn new(url: &str) -> Result<Self, ClientError> {
        Ok(Self {
            base: BaseUrl::parse(url)?,
            transport: Transport::new(),
        })
    }

    /// `GET /v1/fences`: every scope's fence.
    #[tracing::instrument(skip(self), fields(admin = %self.base.as_str()))]
    pub async fn fences(&self) -> Result<Vec<Fence>, ClientError> {
        let list: FenceList = self.call(Method::GET, "/v1/fences", None).await?;
        Ok(list.fences)
    }

    /// `GET /v1/fences/{scope}`: one scope's fence.
    #[tracing::instrument(skip(self), fields(admin = %self.base.as_str()))]
    pub async fn fence(&self, scope: &str) -> Result<Fence, ClientError> {
        validate_scope(scope)?;
        self.call(Method::GET, &format!("/v1/fences/{scope}"), None)
            .await
    }

    /// `POST /v1/fences/{scope}`: raises the fence to `token` without a write. A token
    /// below the fence is [`ClientError::Fenced`].
    #[tracing::instrument(skip(self), fields(admin = %self.base.as_str()))]
    pub async fn advance(&self, scope: &str, token: u64) -> Result<Advanced, ClientError> {
        validate_scope(scope)?;
        let body = serde_json::json!({ "token": token }).to_string();
        self.call(
            Method::POST,
            &format!("/v1/fences/{scope}"),
            Some((body, token, scope)),
        )
        .await
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        advance: Option<(String, u64, &str)>,
    ) -> Result<T, ClientError> {
        let uri = self.base.join(path)?;
        let mut builder = Request::builder()
            .method(method.clone())
            .uri(uri)
            .header(http::header::ACCEPT, "application/json");
        let mut body = Bytes::new();
        if let Some((json, _, _)) = &advance {
            builder = builder.header(http::header::CONTENT_TYPE, "application/json");
            body = Bytes::from(json.clone());
        }
        let request = builder
            .body(Full::new(body))
            .map_err(|e| ClientError::InvalidRequest(e.to_string()))?;
        let timeout = Duration::from_millis(ADMIN_TIMEOUT_MS);
        let answer = self
            .transport
            .exchange(request, timeout)
            .await
            .map_err(|failure| match failure {
                Failure::Connect(reason) => ClientError::Unreachable {
                    url: self.base.as_str(),
                    attempts: 1,
                    reason,
                },
                Failure::Timeout(after) => ClientError::Indeterminate {
                    method: method.clone(),
                    attempts: 1,
                    reason: format!("no answer within {} ms", millis(after)),
                },
                Failure::Broken(reason) => ClientError::Indeterminate {
                    method: method.clone(),
                    attempts: 1,
                    reason,
                },
                Failure::TooLarge => {
                    ClientError::InvalidResponse("admin answer is too large".to_owned())
                }
            })?;
        if answer.status == StatusCode::CONFLICT
            && let Some((_, token, scope)) = advance
            && let Some(fenced) = fenced_error(&answer, token, scope)
        {
            return Err(fenced);
        }
        parse_json(&answer)
    }
}
