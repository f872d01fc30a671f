//! The axum side of the control plane: problem+json errors, the extractors that reject
//! with them, and [`finish`], which every control-plane router goes through.

use axum::Router;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Request};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use palisade_protocol::Problem;
use palisade_protocol::headers::{FENCING_TOKEN_CURRENT, PROBLEM_JSON};
use palisade_protocol::problem::kind;

/// A [`Problem`] as an axum response: `application/problem+json` with the problem's
/// status, `Fencing-Token-Current` when it names the current fence, and `Retry-After: 1`
/// on a 503. Handlers return it as their error; every [`Problem`] converts into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiProblem(pub Problem);

impl From<Problem> for ApiProblem {
    fn from(problem: Problem) -> Self {
        Self(problem)
    }
}

impl From<ApiProblem> for Problem {
    fn from(problem: ApiProblem) -> Self {
        problem.0
    }
}

impl IntoResponse for ApiProblem {
    fn into_response(self) -> Response {
        let problem = self.0;
        let status = problem.status_code();
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(current) = problem.current {
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
    type Rejection = ApiProblem;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiProblem> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => {
                let status = rejection.status();
                let problem_kind = if status == StatusCode::PAYLOAD_TOO_LARGE {
                    kind::BODY_TOO_LARGE
                } else {
                    kind::BAD_BODY
                };
                Err(Problem::new(status, problem_kind, rejection.body_text()).into())
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
    type Rejection = ApiProblem;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiProblem> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Self(value)),
            Err(rejection) => Err(Problem::new(
                StatusCode::BAD_REQUEST,
                kind::BAD_QUERY,
                rejection.body_text(),
            )
            .into()),
        }
    }
}

/// Longest plain-text rejection read back to become a problem's detail; axum's are one
/// line (a longer one is cut there).
const REJECTION_BYTES_MAX: usize = 1024;

/// An answer of axum's own, a plain-text rejection of an extractor the handler did not
/// wrap (a path segment whose percent-decoding is not UTF-8, for `Path<String>`), as the
/// problem+json every control-plane answer is: the same status, its text as the detail.
async fn rejection_as_problem(response: Response) -> Response {
    let status = response.status();
    let plain = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain"));
    if !plain || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let body = axum::body::to_bytes(response.into_body(), REJECTION_BYTES_MAX).await;
    let detail = body.map_or_else(
        |_| status.canonical_reason().unwrap_or("rejected").to_owned(),
        |bytes| String::from_utf8_lossy(&bytes).into_owned(),
    );
    let kind = if status.is_client_error() {
        kind::BAD_REQUEST
    } else {
        kind::UNAVAILABLE
    };
    ApiProblem(Problem::new(status, kind, detail)).into_response()
}

/// Finishes a control-plane router: problem+json for unknown paths (404, naming the
/// API), for methods a path does not take (405) and for axum's own rejections, and the
/// request body limit.
pub fn finish(router: Router, api: &'static str, body_bytes_max: usize) -> Router {
    router
        .fallback(move |request: Request| async move {
            ApiProblem(Problem::new(
                StatusCode::NOT_FOUND,
                kind::NOT_FOUND,
                format!(
                    "{} {} is not part of the {api}",
                    request.method(),
                    request.uri().path()
                ),
            ))
        })
        .method_not_allowed_fallback(move |request: Request| async move {
            ApiProblem(Problem::new(
                StatusCode::METHOD_NOT_ALLOWED,
                kind::METHOD_NOT_ALLOWED,
                format!(
                    "{} does not take {} in the {api}",
                    request.uri().path(),
                    request.method()
                ),
            ))
        })
        .layer(axum::middleware::map_response(rejection_as_problem))
        .layer(DefaultBodyLimit::max(body_bytes_max))
}

#[cfg(test)]
mod tests {
    use axum::routing::{get, post};
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    use super::*;

    #[derive(serde::Deserialize, serde::Serialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        token: u64,
    }

    fn app() -> Router {
        let router = Router::new()
            .route("/v1/x", get(|| async { "ok" }))
            .route(
                "/v1/echo",
                post(|ApiJson(body): ApiJson<Body>| async move { ApiJson(body) }),
            )
            .route(
                "/v1/items/{id}",
                get(|axum::extract::Path(id): axum::extract::Path<String>| async move { id }),
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

    /// Goal: a rejection axum makes itself, in plain text, is answered as problem+json
    /// with its status and text (found by the `api_bodies` fuzz target: `DELETE
    /// /v1/members/31%ce` on the node API was a plain-text 400); a plain-text success
    /// is left alone. Method: a `Path<String>` route called with a segment whose
    /// percent-decoding is not UTF-8, then with a good one.
    #[tokio::test]
    async fn axum_rejections_are_problems() {
        let (s, k, b) = call("GET", "/v1/items/31%ce", "").await;
        assert_eq!(
            (s, k.as_str()),
            (StatusCode::BAD_REQUEST, PROBLEM_JSON),
            "{b}"
        );
        let problem: Problem = serde_json::from_str(&b).unwrap();
        assert!(problem.type_uri.ends_with(kind::BAD_REQUEST), "{b}");
        assert!(b.contains("UTF-8"), "{b}");
        let (s, k, b) = call("GET", "/v1/items/31", "").await;
        assert_eq!((s, b.as_str()), (StatusCode::OK, "31"));
        assert!(k.starts_with("text/plain"), "{k}");
    }
}
