//! The embedded object store as the proxy's backing storage, served in-process.
//!
//! `PUT /any/path` stores the body, `GET` returns it with `Fencing-Token` set to the token
//! that wrote it, `DELETE` removes it, `GET /prefix/?list` lists keys. The key is the
//! path without its leading `/`. Every put gets the next store-wide revision, so a
//! listing shows the order in which writes were applied (`revision`), across keys.
//!
//! The store holds objects whole, so it is the one place the proxy reads a body whole:
//! up to `limits.object_bytes_max` (413 naming that field past it), under the same idle
//! timeout and buffer budget as a streamed body.

use bytes::Bytes;
use http::{HeaderValue, Method, Response, StatusCode, header};
use http_body_util::BodyExt;
use palisade_protocol::headers::{FENCING_TOKEN, REVISION};
use palisade_protocol::{KeyList, StoredObject};
use palisade_storage::{ObjectError, ObjectStore};

use crate::body::{ProxyBody, full, ok_json};
use crate::error::ProxyError;
use crate::stream::{BodyFault, UpstreamBody};

/// The methods the store takes, as an `Allow` header value.
const METHODS_ALLOWED: &str = "GET, HEAD, PUT, POST, DELETE";

/// Most keys one listing returns; `?list&limit=N` may ask for fewer.
pub const LIST_KEYS_MAX: usize = 1000;

/// Serves one admitted request from the store. `token` is the request's fencing token
/// (always present on writes, which are fenced).
pub(crate) async fn serve(
    store: &ObjectStore,
    method: &Method,
    path: &str,
    query: Option<&str>,
    token: Option<u64>,
    body: UpstreamBody,
) -> Result<Response<ProxyBody>, ProxyError> {
    let key = path.trim_start_matches('/').to_owned();
    let list = query.and_then(list_limit);
    if let (Some(limit), &Method::GET) = (list, method) {
        let store = store.clone();
        let keys = blocking(move || store.list(&key, limit)).await?;
        let truncated = keys.len() == limit;
        let keys = keys
            .into_iter()
            .map(|m| StoredObject {
                key: m.key,
                token: m.token,
                revision: m.revision,
                size: m.size,
            })
            .collect();
        return Ok(ok_json(&KeyList { keys, truncated }));
    }
    if key.is_empty() {
        return Err(ProxyError::BadRequest(
            "the embedded store needs a key: use /some/key, or GET /prefix/?list".to_owned(),
        ));
    }
    match *method {
        Method::PUT | Method::POST => {
            // Writes are fenced, so they always carry a token; 0 only if fencing of this
            // method was configured off, which validate() does not forbid.
            let token = token.unwrap_or(0);
            let body = read_whole(body).await?;
            let size = body.len() as u64;
            let store = store.clone();
            let key_owned = key.clone();
            let revision = blocking(move || store.put(&key_owned, token, &body)).await?;
            Ok(ok_json(&StoredObject {
                key,
                token,
                revision,
                size,
            }))
        }
        Method::DELETE => {
            let store = store.clone();
            let key_owned = key.clone();
            if blocking(move || store.delete(&key_owned)).await? {
                let mut response = Response::new(full(Bytes::new()));
                *response.status_mut() = StatusCode::NO_CONTENT;
                Ok(response)
            } else {
                Err(ProxyError::NotFound { key })
            }
        }
        Method::GET | Method::HEAD => {
            let store = store.clone();
            let key_owned = key.clone();
            let object = blocking(move || store.get(&key_owned))
                .await?
                .ok_or(ProxyError::NotFound { key })?;
            let length = object.body.len();
            let body = if method == Method::HEAD {
                Bytes::new()
            } else {
                Bytes::from(object.body)
            };
            let mut response = Response::new(full(body));
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
            headers.insert(FENCING_TOKEN, HeaderValue::from(object.token));
            headers.insert(REVISION, HeaderValue::from(object.revision));
            Ok(response)
        }
        _ => Err(ProxyError::MethodNotAllowed {
            method: method.to_string(),
            allowed: METHODS_ALLOWED,
        }),
    }
}

/// Reads a body whole; the body's own limits (`limits.object_bytes_max` here) bound it.
async fn read_whole(body: UpstreamBody) -> Result<Bytes, ProxyError> {
    body.collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .map_err(|fault: BodyFault| fault.to_proxy_error())
}

/// `Some(limit)` when the query asks for a listing (`list`, optionally `limit=N`).
fn list_limit(query: &str) -> Option<usize> {
    let mut list = false;
    let mut limit = LIST_KEYS_MAX;
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "list" => list = true,
            "limit" => {
                if let Ok(n) = value.parse::<usize>() {
                    limit = n.clamp(1, LIST_KEYS_MAX);
                }
            }
            _ => {}
        }
    }
    list.then_some(limit)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ObjectError> + Send + 'static,
) -> Result<T, ProxyError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ProxyError::Storage(format!("object store task failed: {e}")))?
        .map_err(|e| match e {
            ObjectError::TooLarge { max, .. } => ProxyError::BodyTooLarge {
                max,
                field: "limits.object_bytes_max",
            },
            other => ProxyError::Storage(other.to_string()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: `?list` asks for a listing, `limit` is clamped to the maximum, and other
    /// queries are not listings.
    /// Method: parse query strings.
    #[test]
    fn list_query_is_parsed() {
        assert_eq!(list_limit("list"), Some(LIST_KEYS_MAX));
        assert_eq!(list_limit("list&limit=5"), Some(5));
        assert_eq!(list_limit("limit=5&list="), Some(5));
        assert_eq!(list_limit("list&limit=999999"), Some(LIST_KEYS_MAX));
        assert_eq!(list_limit("x=1"), None);
    }
}
