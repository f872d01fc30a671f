//! Roles on a control-plane listener: the credential of each request, [`Caller`] (the
//! extractor that reads it) and [`require_roles`], the middleware a router puts on a route
//! so that only some roles reach it, answering everyone else 403 problem+json
//! (`forbidden-role`) that names the role needed and the credential.
//!
//! [`crate::serve_tls`] puts a [`PeerCredential`] into every request of a connection
//! whose client presented a certificate the acceptor verified: the certificate's DNS
//! names, whose prefixes are its roles (`palisade_protocol::roles`). A plaintext
//! listener, and a request built in a test, carries none. Whether roles are enforced at
//! all is the router's choice ([`RoleRule::enforced`]): a plaintext listener cannot tell
//! one caller from another, so it enforces nothing.

use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts, MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use http::request::Parts;
use palisade_protocol::process::events;
use palisade_protocol::roles::forbidden;
use palisade_protocol::{Credential, CredentialRole, Problem};

use crate::api::ApiProblem;

/// The credential of the connection a request came on (a request extension).
#[derive(Debug, Clone)]
pub struct PeerCredential(pub Arc<Credential>);

/// The credential of the request's connection: `None` on a plaintext connection or one
/// without a client certificate.
#[derive(Debug, Clone, Default)]
pub struct Caller(pub Option<Arc<Credential>>);

impl Caller {
    /// The caller of a request with these extensions.
    pub fn of(extensions: &http::Extensions) -> Self {
        Self(extensions.get::<PeerCredential>().map(|c| Arc::clone(&c.0)))
    }

    /// Whether its credential carries one of `roles`.
    pub fn has_any(&self, roles: &[CredentialRole]) -> bool {
        self.0.as_ref().is_some_and(|c| c.has_any(roles))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Infallible> {
        Ok(Self::of(&parts.extensions))
    }
}

/// A request refused for its credential's role, as a [`RefusalHook`] sees it.
#[derive(Debug)]
pub struct Refusal<'a> {
    /// The route: its path template (`/v1/members/{id}`), so that a label made of it has
    /// as many values as the router has routes; the path itself without a matched route.
    pub route: &'a str,
    /// The request's method.
    pub method: &'a http::Method,
    /// The request's path.
    pub path: &'a str,
    /// The client's address, when the listener recorded it.
    pub peer: Option<SocketAddr>,
    /// The credential the request came with; `None` without a client certificate.
    pub credential: Option<&'a Credential>,
    /// The 403 problem that answers it.
    pub problem: Problem,
}

/// Told of every refusal (to count and record it); returns the problem to answer with,
/// the refusal's own or one with more members (the node answering).
pub type RefusalHook = Arc<dyn Fn(Refusal<'_>) -> Problem + Send + Sync>;

/// Which roles a route admits, and whether they are enforced: the state of
/// [`require_roles`].
#[derive(Clone)]
pub struct RoleRule {
    /// The roles admitted: a credential carrying any of them passes.
    pub needed: &'static [CredentialRole],
    /// Whether roles are enforced at all; when not (plaintext), every request passes.
    pub enforced: bool,
    /// Told of each refusal; `None`: the refusal's problem is answered as it is.
    pub on_refusal: Option<RefusalHook>,
}

impl fmt::Debug for RoleRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoleRule")
            .field("needed", &self.needed)
            .field("enforced", &self.enforced)
            .field("on_refusal", &self.on_refusal.is_some())
            .finish()
    }
}

impl RoleRule {
    /// A rule admitting `needed`, enforced when `enforced`, telling `on_refusal`.
    pub fn new(
        needed: &'static [CredentialRole],
        enforced: bool,
        on_refusal: Option<RefusalHook>,
    ) -> Self {
        Self {
            needed,
            enforced,
            on_refusal,
        }
    }

    /// Whether a request of `caller` passes this rule's roles.
    pub fn admits(&self, caller: &Caller) -> bool {
        !self.enforced || caller.has_any(self.needed)
    }

    /// Refuses the request whose head is `parts` (method, URI and extensions): the 403
    /// problem naming the roles needed and the caller's credential (with `why`, what else
    /// the credential lacks), after the hook was told.
    pub fn refuse(&self, parts: &RequestHead<'_>, why: Option<&str>) -> ApiProblem {
        let caller = Caller::of(parts.extensions);
        let path = parts.uri.path();
        let what = format!("{} {path}", parts.method);
        let problem = forbidden(&what, self.needed, caller.0.as_deref(), why);
        let route = parts
            .extensions
            .get::<MatchedPath>()
            .map_or(path, MatchedPath::as_str);
        let refusal = Refusal {
            route,
            method: parts.method,
            path,
            peer: parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0),
            credential: caller.0.as_deref(),
            problem,
        };
        tracing::warn!(
            event = events::ROLE_FORBIDDEN,
            route,
            method = %parts.method,
            peer = %refusal.peer.map_or_else(|| "unknown".to_owned(), |p| p.to_string()),
            detail = %refusal.problem.detail,
            "refused for the credential's role"
        );
        ApiProblem(match &self.on_refusal {
            Some(hook) => hook(refusal),
            None => refusal.problem,
        })
    }
}

/// What [`RoleRule::refuse`] reads of a request: its method, URI and extensions.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    /// The method.
    pub method: &'a http::Method,
    /// The URI.
    pub uri: &'a http::Uri,
    /// The extensions (the credential, the matched route, the client's address).
    pub extensions: &'a http::Extensions,
}

impl<'a> RequestHead<'a> {
    /// The head of `request`.
    pub fn of<B>(request: &'a http::Request<B>) -> Self {
        Self {
            method: request.method(),
            uri: request.uri(),
            extensions: request.extensions(),
        }
    }
}

/// The middleware of a route that admits the roles of its [`RoleRule`]: a request whose
/// credential carries none of them (or that has none) is answered 403 problem+json and
/// never reaches the handler. Put it on a route with
/// `axum::middleware::from_fn_with_state(rule, require_roles)` as a route layer, so that
/// unknown paths and methods keep their 404 and 405.
pub async fn require_roles(State(rule): State<RoleRule>, request: Request, next: Next) -> Response {
    if rule.admits(&Caller::of(request.extensions())) {
        return next.run(request).await;
    }
    rule.refuse(&RequestHead::of(&request), None)
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Router;
    use axum::middleware::from_fn_with_state;
    use axum::routing::get;
    use http::StatusCode;
    use http_body_util::BodyExt as _;
    use palisade_protocol::problem::kind;
    use tower::ServiceExt as _;

    use super::*;

    const OPERATOR: &[CredentialRole] = &[CredentialRole::Operator];

    fn app(enforced: bool, refusals: Arc<AtomicUsize>) -> Router {
        let hook: RefusalHook = Arc::new(move |r: Refusal<'_>| {
            assert_eq!(r.route, "/v1/x/{id}");
            refusals.fetch_add(1, Ordering::SeqCst);
            r.problem.with_node(9, None)
        });
        let rule = RoleRule::new(OPERATOR, enforced, Some(hook));
        Router::new().route(
            "/v1/x/{id}",
            get(|| async { "ok" }).route_layer(from_fn_with_state(rule, require_roles)),
        )
    }

    async fn call(app: Router, names: Option<&[&str]>) -> (StatusCode, String) {
        let mut request = http::Request::builder()
            .uri("/v1/x/1")
            .body(axum::body::Body::empty())
            .unwrap();
        if let Some(names) = names {
            request
                .extensions_mut()
                .insert(PeerCredential(Arc::new(Credential::from_names(names))));
        }
        let response = app.oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Goal: an enforced rule admits a credential of its role only; a writer and a
    /// request without a credential get 403 `forbidden-role` naming the role needed and
    /// the credential, through the hook (which saw the route's template); unenforced,
    /// every request passes. Method: a one-route router through `oneshot`.
    #[tokio::test]
    async fn enforced_rules_admit_their_roles_only() {
        let refusals = Arc::new(AtomicUsize::new(0));
        let enforced = app(true, Arc::clone(&refusals));
        let (status, body) = call(enforced.clone(), Some(&["operator-ops"])).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
        let (status, body) = call(enforced.clone(), Some(&["writer-app", "localhost"])).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        let problem: Problem = serde_json::from_str(&body).unwrap();
        assert_eq!(problem.kind(), kind::FORBIDDEN_ROLE);
        assert_eq!(problem.node_id, Some(9), "the hook's problem is answered");
        assert!(
            problem.detail.contains("operator (operator-<name>)"),
            "{body}"
        );
        assert!(problem.detail.contains("writer-app"), "{body}");
        let (status, _) = call(enforced, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(refusals.load(Ordering::SeqCst), 2);

        let open = app(false, Arc::clone(&refusals));
        assert_eq!(call(open.clone(), None).await.0, StatusCode::OK);
        assert_eq!(call(open, Some(&["writer-app"])).await.0, StatusCode::OK);
        assert_eq!(refusals.load(Ordering::SeqCst), 2);
    }
}
