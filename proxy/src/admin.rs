//! The admin API: read and advance fences, Prometheus metrics, health.
//!
//! - `GET /v1/fences` -> `{"fences":[{"scope":"default","token":5}, ...]}`
//! - `GET /v1/fences/{scope}` -> `{"scope":"default","token":5}` (0 when never seen)
//! - `POST /v1/fences/{scope}` with `{"token":N}` -> advances without a write; 409 if N
//!   is below the fence. It answers 200 only once no lower-token write of the scope is
//!   still in flight (503 if they do not finish within the barrier timeout; the fence is
//!   raised either way), so a new leader that has announced knows its predecessor is done.
//! - `GET /metrics`, `GET /healthz`.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::json;

use crate::body::{ProxyBody, full, ok_json};
use crate::config::validate_scope;
use crate::error::{ProxyError, problem_response};
use crate::fencing::Fencer;

/// Largest admin request body: `{"token":18446744073709551615}` with room to spare.
const ADMIN_BODY_BYTES_MAX: usize = 4096;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdvanceBody {
    token: u64,
}

/// Serves one admin request.
pub(crate) async fn handle(
    fencer: Arc<Fencer>,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, std::convert::Infallible> {
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    let result = match (&method, path.as_str()) {
        (&Method::GET, "/healthz") => Ok(text(StatusCode::OK, "ok\n")),
        (&Method::GET, "/metrics") => {
            Ok(text(StatusCode::OK, crate::metrics::prometheus().render()))
        }
        (&Method::GET, "/v1/fences") => {
            let fences: Vec<_> = fencer
                .register()
                .list()
                .into_iter()
                .map(|(scope, token)| json!({"scope": scope, "token": token}))
                .collect();
            Ok(ok_json(&json!({"fences": fences})))
        }
        (_, p) if p.starts_with("/v1/fences/") => {
            let scope = p.trim_start_matches("/v1/fences/").to_owned();
            fence(&fencer, &method, scope, request.into_body()).await
        }
        _ => Ok(not_found(&method, &path)),
    };
    Ok(result.unwrap_or_else(ProxyError::into_response))
}

async fn fence(
    fencer: &Arc<Fencer>,
    method: &Method,
    scope: String,
    body: Incoming,
) -> Result<Response<ProxyBody>, ProxyError> {
    validate_scope(&scope).map_err(|reason| ProxyError::BadScope { reason })?;
    match *method {
        Method::GET => {
            let token = fencer.register().current(&scope);
            Ok(ok_json(&json!({"scope": scope, "token": token})))
        }
        Method::POST => {
            let bytes = Limited::new(body, ADMIN_BODY_BYTES_MAX)
                .collect()
                .await
                .map_err(|e| ProxyError::BadRequest(format!("cannot read body: {e}")))?
                .to_bytes();
            let AdvanceBody { token } = serde_json::from_slice(&bytes).map_err(|e| {
                ProxyError::BadRequest(format!("body must be {{\"token\": <u64>}}: {e}"))
            })?;
            // The same admission as a write: raise the fence, then wait at the barrier.
            let admitted = fencer.admit(&scope, token).await?;
            let advanced = admitted.raised;
            drop(admitted);
            Ok(ok_json(
                &json!({"scope": scope, "token": token, "advanced": advanced}),
            ))
        }
        _ => Err(ProxyError::MethodNotAllowed {
            method: method.to_string(),
        }),
    }
}

fn not_found(method: &Method, path: &str) -> Response<ProxyBody> {
    problem_response(
        StatusCode::NOT_FOUND,
        &json!({
            "type": "https://palisade.invalid/problems/not-found",
            "title": "Not Found",
            "status": 404,
            "detail": format!("no admin endpoint {method} {path}; see GET /v1/fences, GET|POST /v1/fences/{{scope}}, GET /metrics, GET /healthz"),
        }),
    )
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<ProxyBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}
