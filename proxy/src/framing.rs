//! The request's framing and target, checked from the head before anything reads it:
//! what a client sends is forwarded as it is, or refused. Never altered silently.
//!
//! A proxy that reads a message one way and forwards it another is how requests are
//! smuggled past it, and how data is lost unnoticed. So, with the reasons next to each
//! rule:
//! - **`Connection` may not name a header that frames, targets or fences the request.**
//!   Every header `Connection` names is hop-by-hop and must be dropped before
//!   forwarding (RFC 9110 §7.6.1). Dropping `Content-Length` would cut the body off
//!   (the upstream stored 0 of 5 bytes), dropping `Host` would send the request to
//!   another site, dropping `Fencing-Token` would hide the token from the storage. Such
//!   a request is refused with 400 `bad-connection`; see [`check_connection`] for the
//!   list. `keep-alive`, `close`, `upgrade`, `TE`, `HTTP2-Settings` and names of the
//!   proxy's own hop-by-hop headers stay allowed: dropping them changes nothing the
//!   upstream reads.
//! - **One `Host`, well formed, agreeing with the target.** A repeated `Host`, one that
//!   is not an authority, none at all on HTTP/1.1, or an absolute-form target
//!   (`PUT http://a/x`, every HTTP/2 request) whose authority differs from `Host`:
//!   400 `bad-host` (RFC 9112 §3.2 asks a server to refuse the first three). The
//!   proxy routes by path, the upstream may route by host: two hosts in one request
//!   mean two readings of it.
//! - **Only `chunked`, once.** hyper reads a body whose last transfer coding is
//!   `chunked` and leaves the codings before it (`gzip, chunked`) undone; the proxy
//!   re-frames the body for its own hop, so they would be lost. Anything but one
//!   `chunked` is 501 `unsupported-transfer-coding` (RFC 9112 §6.1). hyper itself
//!   refuses, with 400 and no problem body, a coding list that does not end in
//!   `chunked`, and any `Transfer-Encoding` on HTTP/1.0.
//! - **GET and HEAD carry no body** unless their route has `read_bodies = true`:
//!   400 `body-on-read`. A body has no meaning on them (RFC 9110 §9.3.1), some servers
//!   read the next request from it, and an anonymous read that trickles a body would
//!   otherwise hold an upstream connection.
//!
//! Each check is a few comparisons on headers most requests do not have: nothing is
//! allocated unless the request is refused.

use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use palisade_protocol::headers::{FENCING_SCOPE, FENCING_TOKEN, FENCING_TOKEN_PROOF};

use crate::error::ProxyError;

/// Checks the head's framing and target: `Transfer-Encoding`, `Host` and `Connection`.
/// `decided_by` are further headers the proxy decides on (the method overrides), which
/// `Connection` may not name either.
pub(crate) fn check_head(parts: &Parts, decided_by: &[HeaderName]) -> Result<(), ProxyError> {
    check_transfer_coding(&parts.headers)?;
    check_host(parts)?;
    check_connection(&parts.headers, decided_by)
}

/// Refuses a GET or HEAD that carries a body (a `Content-Length` above 0, a chunked
/// body, HTTP/2 DATA) unless its route takes one.
pub(crate) fn check_body(parts: &Parts, has_body: bool, allowed: bool) -> Result<(), ProxyError> {
    if has_body && !allowed && matches!(parts.method, Method::GET | Method::HEAD) {
        return Err(ProxyError::BodyOnRead {
            method: parts.method.to_string(),
            path: parts.uri.path().to_owned(),
        });
    }
    Ok(())
}

/// Refuses every `Transfer-Encoding` but a single `chunked`.
fn check_transfer_coding(headers: &HeaderMap) -> Result<(), ProxyError> {
    match unsupported_codings(headers) {
        None => Ok(()),
        Some(codings) => Err(ProxyError::UnsupportedTransferCoding { codings }),
    }
}

/// The `Transfer-Encoding` lines, joined, when they name anything but a single
/// `chunked` (empty list elements aside, which a recipient must accept: RFC 9110
/// §5.6.1). The upstream's answers are held to the same rule.
pub(crate) fn unsupported_codings(headers: &HeaderMap) -> Option<String> {
    let mut lines = headers.get_all(header::TRANSFER_ENCODING).iter();
    // Most requests have no `Transfer-Encoding`: nothing more to look at.
    let first = lines.next()?;
    let lines: Vec<&[u8]> = std::iter::once(first)
        .chain(lines)
        .map(HeaderValue::as_bytes)
        .collect();
    unsupported_codings_in(&lines)
}

/// [`unsupported_codings`] of the `Transfer-Encoding` lines given.
pub(crate) fn unsupported_codings_in(lines: &[&[u8]]) -> Option<String> {
    let mut codings = lines
        .iter()
        .flat_map(|line| tokens(line))
        .filter(|t| !t.is_empty());
    match (codings.next(), codings.next()) {
        (None, _) => None,
        (Some(coding), None) if coding.eq_ignore_ascii_case(b"chunked") => None,
        _ => Some(
            lines
                .iter()
                .map(|line| String::from_utf8_lossy(line))
                .collect::<Vec<_>>()
                .join(", "),
        ),
    }
}

/// Refuses a repeated, malformed or (on HTTP/1.1) missing `Host`, and one that differs
/// from the target's authority.
///
/// A CONNECT names a host as its target (authority form), not a resource of this one:
/// it is refused by classification (405) whatever its `Host`, so it is left to that.
fn check_host(parts: &Parts) -> Result<(), ProxyError> {
    if parts.method == Method::CONNECT {
        return Ok(());
    }
    let mut lines = parts.headers.get_all(header::HOST).iter();
    let authority = parts.uri.authority();
    let host = match (lines.next(), lines.next()) {
        (Some(_), Some(_)) => {
            return Err(bad_host(
                "Host is repeated: the request names more than one host".to_owned(),
            ));
        }
        (Some(host), None) => host,
        (None, _) if parts.version == http::Version::HTTP_11 && authority.is_none() => {
            return Err(bad_host(
                "an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)".to_owned(),
            ));
        }
        // HTTP/1.0, or a target that names its host: that one is forwarded as `Host`.
        (None, _) => return Ok(()),
    };
    if !is_authority(host.as_bytes()) {
        return Err(bad_host(format!(
            "Host {host:?} is not a host[:port] (RFC 9112 §3.2)"
        )));
    }
    if let Some(authority) = authority
        && !authority
            .as_str()
            .as_bytes()
            .eq_ignore_ascii_case(host.as_bytes())
    {
        return Err(bad_host(format!(
            "the target names host {:?} and Host names {host:?}: send one host, or the \
             same in both",
            authority.as_str()
        )));
    }
    Ok(())
}

/// Whether `value` can be a `Host`: a non-empty `host[:port]` of the bytes a URI's
/// authority allows (RFC 3986 §3.2), with no userinfo (`@`). Not a full parse: the
/// point is that no separator (`/`, `?`, `#`, space) or control byte gets through to an
/// upstream that routes by host.
fn is_authority(value: &[u8]) -> bool {
    !value.is_empty()
        && value.iter().all(|&b| {
            palisade_protocol::uri::is_unreserved_or_sub_delim(b)
                || matches!(b, b':' | b'[' | b']' | b'%')
        })
}

/// Headers that `Connection` may not name: dropping one changes how the message is
/// framed (`Content-Length`, `Transfer-Encoding`, `Trailer`, whose list hyper needs to
/// forward trailers), where it goes (`Host`), or what the proxy fenced it by. The whole
/// `Content-` family is refused too (below): those fields describe the body
/// (`Content-Range` turns a write into a partial one), never a hop.
static END_TO_END: [HeaderName; 7] = [
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::TRAILER,
    header::HOST,
    FENCING_TOKEN,
    FENCING_TOKEN_PROOF,
    FENCING_SCOPE,
];

/// Refuses a `Connection` header that names a header the request cannot lose: one of
/// [`END_TO_END`], any `Content-*` field, or one of `decided_by`.
///
/// It runs on every request, so the usual values (`keep-alive`, `close`, each whole)
/// are compared once and not split.
fn check_connection(headers: &HeaderMap, decided_by: &[HeaderName]) -> Result<(), ProxyError> {
    for value in headers.get_all(header::CONNECTION) {
        let value = value.as_bytes();
        if value.eq_ignore_ascii_case(b"keep-alive") || value.eq_ignore_ascii_case(b"close") {
            continue;
        }
        for token in tokens(value) {
            let named = |name: &HeaderName| token.eq_ignore_ascii_case(name.as_str().as_bytes());
            let content = token
                .get(..8)
                .is_some_and(|start| start.eq_ignore_ascii_case(b"content-"));
            if content || END_TO_END.iter().any(named) || decided_by.iter().any(named) {
                let token = String::from_utf8_lossy(token);
                return Err(ProxyError::BadConnection {
                    reason: format!(
                        "Connection names {token}, which the proxy would then have to drop \
                         before forwarding; {token} frames, targets or fences the request, \
                         so it cannot be hop-by-hop"
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The comma-separated tokens of a header value, spaces around them trimmed.
fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(<[u8]>::trim_ascii)
}

fn bad_host(reason: String) -> ProxyError {
    ProxyError::BadHost { reason }
}

#[cfg(test)]
mod tests;
