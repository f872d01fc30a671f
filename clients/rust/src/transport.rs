//! The HTTP transport every typed client shares: reqwest with rustls, base URLs, one
//! exchange with a deadline and a body limit, and what a failed exchange tells about the
//! request's fate.

use std::error::Error as StdError;
use std::path::Path;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, StatusCode};
use palisade_protocol::Problem;
use serde::de::DeserializeOwned;

use crate::error::ClientError;

/// Longest a TCP connect (and TLS handshake) may take. Loopback and LAN connects take
/// microseconds to milliseconds; past this the host is down or unreachable, and nothing
/// was sent.
pub const CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Largest response body read into memory: the embedded store's default object limit
/// (16 MiB) twice over, so no legal object is refused.
pub const RESPONSE_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Idle pooled connections kept per host: a worker talks to one proxy and one node.
const POOL_IDLE_PER_HOST_MAX: usize = 8;
/// How long an idle pooled connection is kept, below common server idle timeouts.
const POOL_IDLE_TIMEOUT_MS: u64 = 30_000;

/// TLS settings of a client: certificate authorities to trust besides the system's, and
/// an optional client certificate for mutual TLS. The default trusts the system's roots
/// only. Used by every typed client ([`FencedClient`](crate::FencedClient),
/// [`ProxyAdmin`](crate::ProxyAdmin), [`NodeApi`](crate::NodeApi),
/// [`NodeApiSource`](crate::NodeApiSource)); plain `http://` URLs ignore it.
#[derive(Clone, Default)]
pub struct ClientTls {
    roots: Vec<reqwest::Certificate>,
    identity: Option<reqwest::Identity>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("extra_roots", &self.roots.len())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

impl ClientTls {
    /// The system's roots only.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also trusts every certificate in the PEM file at `path` (a private CA, or a
    /// self-signed server certificate).
    pub fn trust_pem_file(self, path: impl AsRef<Path>) -> Result<Self, ClientError> {
        let path = path.as_ref();
        let pem = read_file(path, "CA certificate")?;
        self.trust_pem(&pem).map_err(|e| match e {
            ClientError::Tls { reason, .. } => ClientError::Tls {
                url: path.display().to_string(),
                reason,
            },
            other => other,
        })
    }

    /// Also trusts every certificate in `pem`.
    pub fn trust_pem(mut self, pem: &[u8]) -> Result<Self, ClientError> {
        let certificates = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| tls_setup(&e))?;
        if certificates.is_empty() {
            return Err(ClientError::Tls {
                url: "(CA bundle)".to_owned(),
                reason: "no PEM certificate in the CA bundle".to_owned(),
            });
        }
        self.roots.extend(certificates);
        Ok(self)
    }

    /// Presents the client certificate chain in `cert` with its private key in `key`
    /// (PEM files), for a server that requires mutual TLS.
    pub fn identity_pem_files(
        mut self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self, ClientError> {
        let mut pem = read_file(cert.as_ref(), "client certificate")?;
        pem.push(b'\n');
        pem.extend(read_file(key.as_ref(), "client key")?);
        self.identity = Some(reqwest::Identity::from_pem(&pem).map_err(|e| tls_setup(&e))?);
        Ok(self)
    }
}

fn read_file(path: &Path, what: &str) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path).map_err(|e| ClientError::Tls {
        url: path.display().to_string(),
        reason: format!("cannot read the {what}: {e}"),
    })
}

fn tls_setup(error: &reqwest::Error) -> ClientError {
    ClientError::Tls {
        url: "(TLS settings)".to_owned(),
        reason: chain(error),
    }
}

/// A base URL: `http://host:port` or `https://host:port` with an optional path prefix.
/// A URL without a scheme is taken as `http://`.
#[derive(Debug, Clone)]
pub(crate) struct BaseUrl {
    /// `scheme://host:port` plus the path prefix, without a trailing `/`.
    base: String,
}

impl BaseUrl {
    pub(crate) fn parse(url: &str) -> Result<Self, ClientError> {
        let invalid = |reason: &str| ClientError::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let with_scheme = if url.contains("://") {
            url.to_owned()
        } else {
            format!("http://{url}")
        };
        let parsed = reqwest::Url::parse(&with_scheme).map_err(|e| invalid(&e.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(invalid("the scheme must be http:// or https://"));
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(invalid("no host"));
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(invalid("a base URL has no query or fragment"));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(invalid("a base URL has no user name or password"));
        }
        let mut base = parsed.to_string();
        while base.ends_with('/') {
            base.pop();
        }
        Ok(Self { base })
    }

    /// The full URL of `path` (with or without its leading `/`, optionally with a
    /// query) under this base.
    pub(crate) fn join(&self, path: &str) -> Result<reqwest::Url, ClientError> {
        let full = format!("{}/{}", self.base, path.trim_start_matches('/'));
        if path
            .chars()
            .any(|c| c.is_ascii_whitespace() || c.is_ascii_control())
        {
            return Err(ClientError::InvalidRequest(format!(
                "path {path:?} is not a valid URI path (percent-encode spaces and other reserved characters)"
            )));
        }
        reqwest::Url::parse(&full).map_err(|e| {
            ClientError::InvalidRequest(format!("path {path:?} is not a valid URI path: {e}"))
        })
    }

    /// The base as text, for messages.
    pub(crate) fn as_str(&self) -> &str {
        &self.base
    }
}

/// A whole answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Answer {
    /// The body as a problem+json [`Problem`], if it is one.
    pub(crate) fn problem(&self) -> Option<Problem> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The problem's `detail`, else the body as text, else the status's reason.
    pub(crate) fn detail(&self) -> String {
        if let Some(problem) = self.problem() {
            return problem.detail;
        }
        let text = String::from_utf8_lossy(&self.body).trim().to_owned();
        if text.is_empty() {
            self.status
                .canonical_reason()
                .unwrap_or("no detail")
                .to_owned()
        } else {
            text
        }
    }

    /// The error this non-2xx answer stands for, when it is not a fencing rejection.
    pub(crate) fn status_error(&self) -> ClientError {
        ClientError::Status {
            status: self.status,
            detail: self.detail(),
            problem: self.problem().map(Box::new),
        }
    }

    /// The JSON body of a 2xx answer, or the error the answer stands for.
    pub(crate) fn json<T: DeserializeOwned>(&self) -> Result<T, ClientError> {
        if !self.status.is_success() {
            return Err(self.status_error());
        }
        serde_json::from_slice(&self.body).map_err(|e| {
            ClientError::InvalidResponse(format!("{e}: {}", String::from_utf8_lossy(&self.body)))
        })
    }
}

/// Why an exchange produced no whole answer.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No connection: nothing was sent.
    Connect(String),
    /// The TLS handshake failed (untrusted or invalid certificate): nothing was sent, and
    /// trying again will not help.
    Tls(String),
    /// No whole answer within the deadline: the request may have been applied.
    Timeout(Duration),
    /// The exchange broke after connecting: the request may have been applied.
    Broken(String),
    /// The answer's body is over [`RESPONSE_BYTES_MAX`].
    TooLarge,
    /// The request could not be built (a header or URL reqwest refuses): nothing was sent.
    Invalid(String),
}

impl Failure {
    /// The error for a call that is not retried and whose failures all mean "no answer"
    /// (reads of the admin and node APIs).
    pub(crate) fn into_error(self, url: &str, method: &Method) -> ClientError {
        match self {
            Failure::Connect(reason) => ClientError::Unreachable {
                url: url.to_owned(),
                attempts: 1,
                reason,
            },
            Failure::Tls(reason) => ClientError::Tls {
                url: url.to_owned(),
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
            Failure::TooLarge => ClientError::InvalidResponse(format!(
                "answer from {url} is over {RESPONSE_BYTES_MAX} bytes"
            )),
            Failure::Invalid(reason) => ClientError::InvalidRequest(reason),
        }
    }
}

/// One HTTP API a typed client talks to ([`ProxyAdmin`](crate::ProxyAdmin),
/// [`NodeApi`](crate::NodeApi)): its base URL, the transport, and the limit on a plain
/// call. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub(crate) base: BaseUrl,
    pub(crate) transport: Transport,
    /// Longest a plain call may take; calls that wait on purpose carry their own limit.
    pub(crate) timeout: Duration,
}

impl Endpoint {
    /// The API at `url` (`http://host:port` or `https://host:port`), with TLS settings
    /// for an `https://` URL and `timeout_ms` on a plain call.
    pub(crate) fn new(url: &str, tls: &ClientTls, timeout_ms: u64) -> Result<Self, ClientError> {
        Ok(Self {
            base: BaseUrl::parse(url)?,
            transport: Transport::new(tls)?,
            timeout: Duration::from_millis(timeout_ms),
        })
    }

    /// `Debug` of a client of this API, named `name`: the URL only, so that a credential
    /// the client holds is never shown.
    pub(crate) fn fmt_client(
        &self,
        name: &str,
        f: &mut std::fmt::Formatter<'_>,
    ) -> std::fmt::Result {
        f.debug_struct(name)
            .field("url", &self.base.as_str())
            .finish_non_exhaustive()
    }
}

/// A pooled HTTP/1 and HTTP/2 client with rustls. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Transport {
    client: reqwest::Client,
}

impl Transport {
    pub(crate) fn new(tls: &ClientTls) -> Result<Self, ClientError> {
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
            .tcp_nodelay(true)
            .pool_max_idle_per_host(POOL_IDLE_PER_HOST_MAX)
            .pool_idle_timeout(Duration::from_millis(POOL_IDLE_TIMEOUT_MS))
            // A fencing client talks to its proxy and nodes directly: an HTTP proxy from
            // the environment would sit between a write and its fence unseen.
            .no_proxy()
            // Redirects would resend a write to a place the caller did not name.
            .redirect(reqwest::redirect::Policy::none());
        for root in &tls.roots {
            builder = builder.add_root_certificate(root.clone());
        }
        if let Some(identity) = &tls.identity {
            builder = builder.identity(identity.clone());
        }
        let client = builder.build().map_err(|e| tls_setup(&e))?;
        Ok(Self { client })
    }

    /// A request builder for `method url`.
    pub(crate) fn request(&self, method: Method, url: reqwest::Url) -> reqwest::RequestBuilder {
        self.client.request(method, url)
    }

    /// Sends `request` and reads the whole answer, all within `timeout`.
    pub(crate) async fn exchange(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Answer, Failure> {
        let work =
            async {
                let mut response = request.send().await.map_err(|e| classify(&e))?;
                let status = response.status();
                let headers = std::mem::take(response.headers_mut());
                let mut body = BytesMut::new();
                while let Some(chunk) = response.chunk().await.map_err(|e| {
                    Failure::Broken(format!("reading the response body: {}", chain(&e)))
                })? {
                    if body.len() + chunk.len() > RESPONSE_BYTES_MAX {
                        return Err(Failure::TooLarge);
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(Answer {
                    status,
                    headers,
                    body: body.freeze(),
                })
            };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| Failure::Timeout(timeout))?
    }
}

/// What a reqwest error says about the request's fate.
fn classify(error: &reqwest::Error) -> Failure {
    let text = chain(error);
    if is_tls_error(error) {
        Failure::Tls(text)
    } else if error.is_connect() {
        Failure::Connect(text)
    } else if error.is_builder() {
        Failure::Invalid(text)
    } else {
        // Anything after connecting may have reached the server.
        Failure::Broken(text)
    }
}

/// Whether a rustls error is somewhere in `error`'s sources: a certificate the client
/// does not trust, or a handshake that failed.
fn is_tls_error(error: &(dyn StdError + 'static)) -> bool {
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = current {
        if is_rustls(e) {
            return true;
        }
        current = e.source();
    }
    false
}

/// Whether `e` is a rustls error, possibly inside `io::Error`s (the TLS stream and the
/// connector each wrap it in one), which do not list the error they wrap among their
/// sources.
fn is_rustls(e: &(dyn StdError + 'static)) -> bool {
    if e.downcast_ref::<rustls::Error>().is_some() {
        return true;
    }
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        return io.get_ref().is_some_and(|inner| is_rustls(inner));
    }
    false
}

/// An error and its sources, `outer: inner: innermost`: reqwest's own message alone
/// ("error sending request") does not say what happened.
pub(crate) fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let next = e.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = e.source();
    }
    text
}

/// Milliseconds of a duration, saturating, for messages and wire fields.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: base URLs keep their scheme and prefix and join paths as given; unusable
    /// URLs are refused. Method: parse and join examples.
    #[test]
    fn base_urls_join_paths() {
        let base = BaseUrl::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            base.join("charges/s-1").unwrap().as_str(),
            "http://127.0.0.1:8080/charges/s-1"
        );
        assert_eq!(
            base.join("/ledger/?list").unwrap().as_str(),
            "http://127.0.0.1:8080/ledger/?list"
        );
        let bare = BaseUrl::parse("localhost:9000/store/").unwrap();
        assert_eq!(
            bare.join("/a").unwrap().as_str(),
            "http://localhost:9000/store/a"
        );
        let tls = BaseUrl::parse("https://proxy.example:8443").unwrap();
        assert_eq!(
            tls.join("k").unwrap().as_str(),
            "https://proxy.example:8443/k"
        );
        assert!(base.join("has space").is_err());
        assert!(BaseUrl::parse("ftp://x:1").is_err());
        assert!(BaseUrl::parse("http://x:1/?q").is_err());
        assert!(BaseUrl::parse("not a url").is_err());
    }

    /// Goal: a CA bundle without certificates is refused at once, not at the first
    /// request. Method: trust an empty PEM.
    #[test]
    fn empty_ca_bundle_is_refused() {
        let err = ClientTls::new().trust_pem(b"").unwrap_err();
        assert!(matches!(err, ClientError::Tls { .. }), "{err}");
    }
}
