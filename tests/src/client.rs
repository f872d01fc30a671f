//! Raw HTTP for tests: `palisade_cluster`'s one raw helper, which sends exactly the headers
//! given (a repeated or malformed `Fencing-Token`, none at all), with shorthands that panic
//! with the cause when the exchange itself fails.

use http::Method;
use palisade_protocol::headers;

pub use palisade_cluster::client::{Answer, try_send, try_send_within};

/// Sends one request and returns the whole answer, or panics with the cause.
pub async fn send(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl AsRef<[u8]>,
) -> Answer {
    let body = bytes::Bytes::copy_from_slice(body.as_ref());
    try_send(method.clone(), url, headers, body)
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// A PUT of `body` to `url` with `Fencing-Token: token`, or panics with the cause.
pub async fn put(url: &str, token: u64, body: impl AsRef<[u8]>) -> Answer {
    let token = token.to_string();
    send(
        Method::PUT,
        url,
        &[(headers::FENCING_TOKEN.as_str(), &token)],
        body,
    )
    .await
}
