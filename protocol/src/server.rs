//! The control-plane HTTP stack (feature `server`): the proxy's admin API and the node
//! API both run on it, so both have the same error bodies, the same extractors and the
//! same accept-loop policy.
//!
//! - [`Problem`] is an axum response: every error a handler returns is problem+json.
//! - [`ApiJson`] and [`ApiQuery`] are axum's `Json` and `Query` whose rejections are
//!   problem+json naming what was wrong, not axum's plain-text bodies.
//! - [`finish`] adds what every control-plane router needs: problem+json 404 and 405
//!   answers and the request body limit.
//! - [`serve`] is the accept loop: a connection limit (a connection over it is answered
//!   503 at once and closed, so an operator sees why instead of hanging), a time limit
//!   on request heads, and a graceful drain at shutdown.
//!
//! The proxy's data path does not use this: it stays on raw hyper, where every
//! allocation on the request path is chosen by hand.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{ConnectInfo, DefaultBodyLimit, FromRequest, FromRequestParts, Request};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt as _;

use crate::headers::{FENCING_TOKEN_CURRENT, PROBLEM_JSON};
use crate::problem::Problem;

/// Pause after a failed accept (for example EMFILE), so the loop does not spin.
pub const ACCEPT_BACKOFF_MS: u64 = 50;

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status_code();
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(current) = self.current {
            headers.insert(FENCING_TOKEN_CURRENT, HeaderValue::from(current));
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// axum's `Json` extractor, rejecting with problem+json (`bad-body`, or
/// `body-too-large` over the body limit).
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    axum::Json<T>: FromRequest<S, Rejection = JsonRejection>,
    S: Send + Sync,
{
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => {
                let status = rejection.status();
                let kind = if status == StatusCode::PAYLOAD_TOO_LARGE {
                    "body-too-large"
                } else {
                    "bad-body"
                };
                Err(Problem::new(status, kind, rejection.body_text()))
            }
        }
    }
}

impl<T: serde::Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// axum's `Query` extractor, rejecting with problem+json (`bad-query`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    axum::extract::Query<T>: FromRequestParts<S, Rejection = QueryRejection>,
    S: Send + Sync,
{
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &S,
    ) -> Result<Self, Problem> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Self(value)),
            Err(rejection) => Err(Problem::new(
                StatusCode::BAD_REQUEST,
                "bad-query",
                rejection.body_text(),
            )),
        }
    }
}

/// Finishes a control-plane router: problem+json for unknown paths (404, naming the
/// API) and for methods a path does not take (405), and the request body limit.
pub fn finish(router: Router, api: &'static str, body_bytes_max: usize) -> Router {
    router
        .fallback(move |request: Request| async move {
            Problem::new(
                StatusCode::NOT_FOUND,
                "not-found",
                format!(
                    "{} {} is not part of the {api}",
                    request.method(),
                    request.uri().path()
                ),
            )
        })
        .method_not_allowed_fallback(move |request: Request| async move {
            Problem::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                format!(
                    "{} does not take {} in the {api}",
                    request.uri().path(),
                    request.method()
                ),
            )
        })
        .layer(DefaultBodyLimit::max(body_bytes_max))
}

/// The accept-loop policy of one control-plane listener.
#[derive(Debug, Clone)]
pub struct ControlLimits {
    /// The listener's name in logs (`admin`, `node-api`).
    pub name: &'static str,
    /// Connections open at once; one more is answered 503 and closed.
    pub connections_max: usize,
    /// Time a client has to send a whole request head.
    pub header_read_timeout: Duration,
    /// Time in-flight requests get to finish at shutdown.
    pub drain_timeout: Duration,
}

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting and
/// waits up to `limits.drain_timeout` for requests in flight. Handlers can extract the
/// peer's address as `ConnectInfo<SocketAddr>`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ControlLimits,
    shutdown: impl Future<Output = ()> + Send,
) {
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.connections_max));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(err) => {
                    tracing::warn!(listener = limits.name, cause = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_BACKOFF_MS)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            tracing::warn!(listener = limits.name, %peer, limit = limits.connections_max,
                "too many connections; answered 503");
            tokio::spawn(refuse_over_limit(
                stream,
                limits.name,
                limits.connections_max,
            ));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let service =
            hyper::service::service_fn(move |mut request: Request<hyper::body::Incoming>| {
                request
                    .extensions_mut()
                    .insert(ConnectInfo::<SocketAddr>(peer));
                let router = router.clone();
                async move {
                    Ok::<_, Infallible>(
                        router
                            .oneshot(request.map(axum::body::Body::new))
                            .await
                            .into_response(),
                    )
                }
            });
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        let name = limits.name;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(listener = name, %peer, cause = %err, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            listener = limits.name,
            timeout_ms = limits.drain_timeout.as_millis() as u64,
            "requests still running at shutdown; closed"
        );
    }
}

/// Answers a connection over the limit with a 503 problem and closes it, without
/// reading its request: the client learns why, and nothing it sent is acted on.
async fn refuse_over_limit(mut stream: tokio::net::TcpStream, name: &'static str, limit: usize) {
    let problem = Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "too-many-connections",
        format!("the {name} listener has its limit of {limit} connections open; retry shortly"),
    );
    let body = serde_json::to_string(&problem).unwrap_or_default();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: {PROBLEM_JSON}\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}

#[cfg(test)]
mod tests {
    use axum::routing::{get, post};
    use http_body_util::BodyExt as _;

    use super::*;

    #[derive(serde::Deserialize, serde::Serialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        token: u64,
    }

    fn app() -> Router {
        let router = Router::new().route("/v1/x", get(|| async { "ok" })).route(
            "/v1/echo",
            post(|ApiJson(body): ApiJson<Body>| async move { ApiJson(body) }),
        );
        finish(router, "test API", 64)
    }

    async fn call(method: &str, uri: &str, body: &str) -> (StatusCode, String, String) {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(axum::body::Body::from(body.to_owned()))
            .unwrap();
        let response = app().oneshot(request).await.unwrap();
        let status = response.status();
        let kind = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, kind, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Goal: unknown paths, wrong methods, bad and oversized bodies all answer
    /// problem+json with the right status and kind; a good body passes.
    /// Method: call a small router through `oneshot`.
    #[tokio::test]
    async fn control_plane_errors_are_problems() {
        let (s, k, b) = call("GET", "/nope", "").await;
        assert_eq!(
            (s, k.as_str()),
            (StatusCode::NOT_FOUND, PROBLEM_JSON),
            "{b}"
        );
        assert!(b.contains("GET /nope is not part of the test API"), "{b}");
        let (s, k, b) = call("DELETE", "/v1/x", "").await;
        assert_eq!(
            (s, k.as_str()),
            (StatusCode::METHOD_NOT_ALLOWED, PROBLEM_JSON),
            "{b}"
        );
        assert!(b.contains("method-not-allowed"), "{b}");
        let (s, _, b) = call("POST", "/v1/echo", r#"{"token":"x"}"#).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
        assert!(b.contains("bad-body"), "{b}");
        let (s, _, b) = call(
            "POST",
            "/v1/echo",
            &format!("{{\"token\":{}}}", "1".repeat(80)),
        )
        .await;
        assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{b}");
        assert!(b.contains("body-too-large"), "{b}");
        let (s, _, b) = call("POST", "/v1/echo", r#"{"token":5}"#).await;
        assert_eq!((s, b.as_str()), (StatusCode::OK, r#"{"token":5}"#));
    }

    /// Goal: a connection over the limit is told 503 at once instead of hanging.
    /// Method: a limit of 1; hold one connection open, open a second one and read it.
    #[tokio::test]
    async fn connection_over_the_limit_is_answered_503() {
        use tokio::io::AsyncReadExt as _;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = ControlLimits {
            name: "test",
            connections_max: 1,
            header_read_timeout: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(1),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, app(), limits, async {
            let _ = stopped.await;
        }));
        let _held = tokio::net::TcpStream::connect(addr).await.unwrap();
        // The first connection holds the only permit once accepted; retry until the
        // second is refused rather than sleeping for an arbitrary time.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let answer = loop {
            let mut second = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut text = String::new();
            let _ =
                tokio::time::timeout(Duration::from_millis(200), second.read_to_string(&mut text))
                    .await;
            if text.starts_with("HTTP/1.1 503") || tokio::time::Instant::now() > deadline {
                break text;
            }
        };
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
        assert!(answer.contains("too-many-connections"), "{answer}");
        let _ = stop.send(());
        server.await.unwrap();
    }
}
