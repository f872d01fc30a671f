//! The admin API's credential: a bearer token read from a file, checked by one axum
//! middleware layer in front of every admin route.
//!
//! With `admin_token_file` set, every admin route but `GET /healthz` (and `GET /metrics`
//! when `admin_metrics_public`) needs `Authorization: Bearer <token>`. One route is let
//! through to its handler: `POST /v1/fences/{scope}`, an advance, which may carry a token
//! proof instead (an election node announcing its token needs no shared secret); the
//! handler then requires either a valid proof or the bearer token
//! ([`crate::admin`]'s `authorize_advance`).
//!
//! The token is kept only as its SHA-256 digest, and a presented token is compared by
//! digest in constant time: the time a comparison takes tells an attacker nothing about
//! the token, not even its length.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use palisade_protocol::Problem;
use palisade_protocol::admin::{HEALTHZ_PATH, METRICS_PATH};
use palisade_server::ApiProblem;
use ring::digest::{SHA256, digest};

use crate::config::{ADMIN_TOKEN_BYTES_MIN, ConfigError};

/// Largest admin token file read, in bytes: a token is a line of text; a larger file is
/// not one.
pub const ADMIN_TOKEN_FILE_BYTES_MAX: u64 = 4096;

/// The admin route whose handler decides its own authorization (an advance, which a
/// valid proof authorizes).
pub(crate) const ADVANCE_ROUTE: &str = "/v1/fences/{scope}";

/// Why an admin request was refused before it reached its handler's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// No `Authorization` header.
    #[error("no Authorization header: this admin API requires `Authorization: Bearer <token>`")]
    NoHeader,
    /// More than one `Authorization` header.
    #[error("the Authorization header is repeated; send exactly one")]
    Repeated,
    /// An `Authorization` header of another scheme, or without a token.
    #[error("not a Bearer credential: the Authorization header must be `Bearer <token>`")]
    NotBearer,
    /// A bearer token that is not the admin token.
    #[error("wrong admin token")]
    WrongToken,
    /// A reset at a proxy without an admin token.
    #[error(
        "resets are disabled: a reset needs the admin credential, and this proxy has none (start it with --admin-token-file)"
    )]
    ResetDisabled,
}

impl AuthError {
    /// The problem kind.
    pub fn kind(self) -> &'static str {
        match self {
            Self::ResetDisabled => palisade_protocol::problem::kind::RESET_DISABLED,
            _ => palisade_protocol::problem::kind::UNAUTHORIZED,
        }
    }
}

impl IntoResponse for AuthError {
    fn into_response(self) -> Response {
        let status = match self {
            Self::ResetDisabled => StatusCode::FORBIDDEN,
            _ => StatusCode::UNAUTHORIZED,
        };
        let mut response =
            ApiProblem(Problem::new(status, self.kind(), self.to_string())).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// The admin bearer token, as its SHA-256 digest.
pub(crate) struct AdminToken {
    digest: [u8; 32],
}

impl AdminToken {
    /// Reads `path` (field `admin_token_file`): its trimmed contents are the token.
    pub(crate) fn load(path: &Path) -> Result<Self, ConfigError> {
        let bad = |reason: String| ConfigError::File {
            field: "admin_token_file",
            path: path.to_owned(),
            reason,
        };
        let bytes = crate::proof::read_bounded(path, ADMIN_TOKEN_FILE_BYTES_MAX).map_err(bad)?;
        let token = bytes.trim_ascii();
        if token.is_empty() {
            return Err(bad("is empty".into()));
        }
        if token.len() < ADMIN_TOKEN_BYTES_MIN {
            return Err(bad(format!(
                "the token is {} bytes; it must be at least {ADMIN_TOKEN_BYTES_MIN}",
                token.len()
            )));
        }
        if let Some(at) = token.iter().position(|b| !b.is_ascii_graphic()) {
            return Err(bad(format!(
                "byte {at} of the token is not visible ASCII, so it could not be sent in an Authorization header"
            )));
        }
        warn_if_shared(path);
        Ok(Self::new(token))
    }

    /// The token `secret`.
    pub(crate) fn new(secret: &[u8]) -> Self {
        Self {
            digest: sha256(secret),
        }
    }

    /// Checks the request's `Authorization: Bearer <token>`.
    pub(crate) fn check(&self, headers: &HeaderMap) -> Result<(), AuthError> {
        let mut values = headers.get_all(header::AUTHORIZATION).iter();
        let value = match (values.next(), values.next()) {
            (None, _) => return Err(AuthError::NoHeader),
            (Some(_), Some(_)) => return Err(AuthError::Repeated),
            (Some(value), None) => value.as_bytes(),
        };
        let (scheme, credential) = value
            .iter()
            .position(|&b| b == b' ')
            .map_or((value, &[][..]), |at| value.split_at(at));
        let credential = credential.trim_ascii();
        if !scheme.eq_ignore_ascii_case(b"bearer") || credential.is_empty() {
            return Err(AuthError::NotBearer);
        }
        if digests_equal(&sha256(credential), &self.digest) {
            Ok(())
        } else {
            Err(AuthError::WrongToken)
        }
    }
}

/// Who may use the admin API: the token (none: everyone) and whether `/metrics` is
/// public.
pub(crate) struct AdminAuth {
    pub(crate) token: Option<AdminToken>,
    pub(crate) metrics_public: bool,
}

/// The middleware layer: refuses a request without the admin credential, except the
/// open routes and the advance route (whose handler decides).
pub(crate) async fn require_admin(
    State(auth): State<Arc<AdminAuth>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &auth.token else {
        return next.run(request).await;
    };
    let method = request.method();
    let reading = method == Method::GET || method == Method::HEAD;
    let path = request.uri().path();
    let open = (reading && path == HEALTHZ_PATH)
        || (reading && auth.metrics_public && path == METRICS_PATH)
        || (method == Method::POST
            && request
                .extensions()
                .get::<MatchedPath>()
                .is_some_and(|matched| matched.as_str() == ADVANCE_ROUTE));
    if open {
        return next.run(request).await;
    }
    match token.check(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(err) => {
            tracing::warn!(method = %request.method(), path = %request.uri().path(), cause = %err,
                "admin request refused");
            err.into_response()
        }
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, bytes).as_ref());
    out
}

/// Compares two digests in time that does not depend on where they differ.
fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let difference = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    std::hint::black_box(difference) == 0
}

/// Warns when the token file can be read by other users: they could use the admin API.
fn warn_if_shared(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(path = %path.display(), mode = format!("{:o}", meta.permissions().mode() & 0o777),
                "the admin token file is readable by other users; chmod 600 it");
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&'static str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::AUTHORIZATION, HeaderValue::from_static(v));
        }
        h
    }

    /// Goal: only exactly the token passes; every other shape names what is wrong.
    /// Method: check headers against the token `0123456789abcdef0123`.
    #[test]
    fn only_the_exact_bearer_token_passes() {
        let token = AdminToken::new(b"0123456789abcdef0123");
        assert_eq!(
            token.check(&headers(&["Bearer 0123456789abcdef0123"])),
            Ok(())
        );
        assert_eq!(
            token.check(&headers(&["bearer   0123456789abcdef0123"])),
            Ok(())
        );
        for (values, expected) in [
            (&[][..], AuthError::NoHeader),
            (
                &["Bearer 0123456789abcdef0123", "Bearer x"][..],
                AuthError::Repeated,
            ),
            (
                &["Basic MDEyMzQ1Njc4OWFiY2RlZjAxMjM="][..],
                AuthError::NotBearer,
            ),
            (&["Bearer"][..], AuthError::NotBearer),
            (&["Bearer "][..], AuthError::NotBearer),
            (&["0123456789abcdef0123"][..], AuthError::NotBearer),
            (&["Bearer 0123456789abcdef012"][..], AuthError::WrongToken),
            (&["Bearer 0123456789abcdef01234"][..], AuthError::WrongToken),
            (&["Bearer 0123456789ABCDEF0123"][..], AuthError::WrongToken),
            (
                &["Bearer 0123456789abcdef0123 x"][..],
                AuthError::WrongToken,
            ),
        ] {
            assert_eq!(token.check(&headers(values)), Err(expected), "{values:?}");
        }
    }

    /// Goal: a token file is trimmed, and one too short, empty, binary or huge is
    /// refused naming the field, the file and why.
    /// Method: write each file and load it.
    #[test]
    fn token_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, bytes: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            path
        };
        let good = AdminToken::load(&write("good", b"  0123456789abcdef\n")).unwrap();
        assert_eq!(good.check(&headers(&["Bearer 0123456789abcdef"])), Ok(()));
        let huge = vec![b'a'; ADMIN_TOKEN_FILE_BYTES_MAX as usize + 1];
        for (name, bytes, expected) in [
            ("empty", &b" \n"[..], "is empty"),
            ("short", &b"0123456789abcde\n"[..], "15 bytes"),
            ("binary", &b"0123456789\x01abcdef"[..], "not visible ASCII"),
            ("spaced", &b"01234567 89abcdef"[..], "not visible ASCII"),
            ("huge", &huge[..], "over 4096 bytes"),
        ] {
            let path = write(name, bytes);
            let err = AdminToken::load(&path).err().unwrap().to_string();
            assert!(err.contains("admin_token_file"), "{name}: {err}");
            assert!(err.contains(&path.display().to_string()), "{name}: {err}");
            assert!(err.contains(expected), "{name}: {err}");
        }
        let missing = dir.path().join("missing");
        let err = AdminToken::load(&missing).err().unwrap().to_string();
        assert!(err.contains("cannot read it"), "{err}");
    }
}
