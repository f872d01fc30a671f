//! [`ProxyAdmin`]: a client of the proxy's admin API, to read fences and to advance one
//! without a write (how a new leader fences out its predecessor at once). Its answers are
//! the protocol's types.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use palisade_protocol::admin::{
    FENCES_PATH, HEALTHZ_PATH, RESET_REASON_BYTES_MAX, ResetRequest, ResetResponse, fence_path,
    reset_path,
};
use palisade_protocol::headers::JSON;
use palisade_protocol::{AdvanceRequest, AdvanceResponse, FenceList, FenceView, Health};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::client::{fenced_error, scope_of};
use crate::error::ClientError;
use crate::transport::{ClientTls, Endpoint};

/// Longest an admin call may take: reads are answered from memory, an advance is one
/// fsync.
pub const ADMIN_TIMEOUT_MS: u64 = 5_000;

/// A client of one proxy's admin API. Cheap to clone.
#[derive(Clone)]
pub struct ProxyAdmin {
    endpoint: Endpoint,
    /// Sent as `Authorization: Bearer` with every call when set; never shown by `Debug`.
    bearer: Option<Arc<str>>,
}

impl std::fmt::Debug for ProxyAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.endpoint.fmt_client("ProxyAdmin", f)
    }
}

impl ProxyAdmin {
    /// A client of the admin API at `url` (`http://host:port` or `https://host:port`).
    pub fn new(url: &str) -> Result<Self, ClientError> {
        Self::with_tls(url, &ClientTls::default())
    }

    /// Like [`new`](Self::new), with TLS settings for an `https://` URL.
    pub fn with_tls(url: &str, tls: &ClientTls) -> Result<Self, ClientError> {
        Ok(Self {
            endpoint: Endpoint::new(url, tls, ADMIN_TIMEOUT_MS)?,
            bearer: None,
        })
    }

    /// Sends `Authorization: Bearer <token>` with every call, for a proxy started with
    /// `--admin-token-file`.
    #[must_use]
    pub fn with_bearer(mut self, token: &str) -> Self {
        self.bearer = Some(Arc::from(token));
        self
    }

    fn request(&self, method: Method, url: reqwest::Url) -> reqwest::RequestBuilder {
        let request = self.endpoint.transport.request(method, url);
        match &self.bearer {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Limits each call to `timeout` instead of [`ADMIN_TIMEOUT_MS`] (a caller that polls
    /// a proxy that may be paused wants a short one).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.endpoint.timeout = timeout;
        self
    }

    /// The admin API's base URL.
    pub fn url(&self) -> &str {
        self.endpoint.base.as_str()
    }

    /// `GET /v1/fences`: every scope's fence.
    #[tracing::instrument(skip(self), fields(admin = %self.endpoint.base.as_str()))]
    pub async fn fences(&self) -> Result<FenceList, ClientError> {
        self.get(FENCES_PATH).await
    }

    /// `GET /v1/fences/{scope}`: one scope's fence (token 0 when never seen).
    #[tracing::instrument(skip(self), fields(admin = %self.endpoint.base.as_str()))]
    pub async fn fence(&self, scope: &str) -> Result<FenceView, ClientError> {
        self.get(&fence_path(&scope_of(scope)?)).await
    }

    /// `GET /healthz`.
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.get(HEALTHZ_PATH).await
    }

    /// `GET /v1/status`: fences with their last raise, recent rejections, the barrier,
    /// the upstream's health, the lease in fleet mode, the audit log's counters.
    #[tracing::instrument(skip(self), fields(admin = %self.endpoint.base.as_str()))]
    pub async fn status(&self) -> Result<palisade_protocol::ProxyStatus, ClientError> {
        self.get(palisade_protocol::status::STATUS_PATH).await
    }

    /// `POST /v1/fences/{scope}`: raises the fence to `token` without a write. A token
    /// below the fence is [`ClientError::Fenced`].
    #[tracing::instrument(skip(self), fields(admin = %self.endpoint.base.as_str()))]
    pub async fn advance(&self, scope: &str, token: u64) -> Result<AdvanceResponse, ClientError> {
        self.advance_with_proof(scope, token, None).await
    }

    /// Like [`advance`](Self::advance), with the token's proof (base64url), which a proxy
    /// holding the cluster's public key accepts in place of the admin credential.
    #[tracing::instrument(skip(self, proof), fields(admin = %self.endpoint.base.as_str()))]
    pub async fn advance_with_proof(
        &self,
        scope: &str,
        token: u64,
        proof: Option<&str>,
    ) -> Result<AdvanceResponse, ClientError> {
        let scope = scope_of(scope)?;
        let answer = self
            .post(
                &fence_path(&scope),
                &AdvanceRequest {
                    token,
                    proof: proof.map(str::to_owned),
                },
            )
            .await?;
        if answer.status == http::StatusCode::CONFLICT
            && let Some(fenced) = fenced_error(&answer, token, scope.as_str())
        {
            return Err(fenced);
        }
        answer.json()
    }

    /// `POST /v1/fences/{scope}/reset`: sets the fence to `token`, lower included, for
    /// `reason` (logged by the proxy; 1 to `RESET_REASON_BYTES_MAX` bytes, checked here
    /// before anything is sent). Needs the admin credential ([`with_bearer`](Self::with_bearer)).
    #[tracing::instrument(skip(self), fields(admin = %self.endpoint.base.as_str()))]
    pub async fn reset(
        &self,
        scope: &str,
        token: u64,
        reason: &str,
    ) -> Result<ResetResponse, ClientError> {
        let scope = scope_of(scope)?;
        if reason.trim().is_empty() || reason.len() > RESET_REASON_BYTES_MAX {
            return Err(ClientError::InvalidRequest(format!(
                "a reset reason is 1 to {RESET_REASON_BYTES_MAX} bytes of text, not blank; this one is {} bytes",
                reason.len()
            )));
        }
        self.post(
            &reset_path(&scope),
            &ResetRequest {
                token,
                reason: reason.to_owned(),
            },
        )
        .await?
        .json()
    }

    /// One POST of a JSON body; any answer is returned for the caller to read.
    async fn post<B: Serialize>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<crate::transport::Answer, ClientError> {
        let url = self.endpoint.base.join(path)?;
        let request = self
            .request(Method::POST, url)
            .header(http::header::ACCEPT, JSON)
            .json(body);
        self.endpoint
            .transport
            .exchange(request, self.endpoint.timeout)
            .await
            .map_err(|f| f.into_error(self.endpoint.base.as_str(), &Method::POST))
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let url = self.endpoint.base.join(path)?;
        let request = self
            .request(Method::GET, url)
            .header(http::header::ACCEPT, JSON);
        self.endpoint
            .transport
            .exchange(request, self.endpoint.timeout)
            .await
            .map_err(|f| f.into_error(self.endpoint.base.as_str(), &Method::GET))?
            .json()
    }
}
