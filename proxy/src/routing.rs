//! Classification of a request from its head alone: read or fenced write, and its scope.
//!
//! This is where the proxy fails closed. Reads are the configured safe methods; every
//! other method is a write. Routes match the normalised path, so that no spelling of a
//! path the storage reads as the same resource escapes its route.

use http::Method;
use http::request::Parts;
use palisade_protocol::headers::FENCING_SCOPE;
use palisade_protocol::{DEFAULT_SCOPE, Scope};

use crate::config::{ProxyConfig, Route, RouteClass};
use crate::error::ProxyError;

/// Read or fenced write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    Read,
    Write,
}

impl Class {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
        }
    }
}

/// What the head of a request decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    pub class: Class,
    pub scope: String,
    /// An `Upgrade` request its route allows: the connection is tunnelled after the
    /// response.
    pub upgrade: bool,
}

/// The classification rules, built once from the configuration.
pub(crate) struct Classifier {
    read_methods: Vec<Method>,
    /// Routes, longest prefix first, so the first match is the most specific.
    routes: Vec<Route>,
    client_scopes: bool,
}

impl Classifier {
    pub(crate) fn new(config: &ProxyConfig) -> Self {
        let mut routes = config.routes.clone();
        routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        Self {
            read_methods: config.read_methods(),
            routes,
            client_scopes: config.client_scopes,
        }
    }

    /// The scopes that must always be available whatever `limits.scopes_max` says:
    /// `default` and every scope a route names.
    #[allow(dead_code, reason = "used by the scope limit (being built)")]
    pub(crate) fn reserved_scopes(&self) -> Vec<String> {
        let mut scopes = vec![DEFAULT_SCOPE.to_owned()];
        scopes.extend(self.routes.iter().filter_map(|r| r.scope.clone()));
        scopes
    }

    /// Classifies a request head.
    pub(crate) fn classify(&self, parts: &Parts) -> Result<Decision, ProxyError> {
        let path = parts.uri.path();
        let route = self.routes.iter().find(|r| path.starts_with(&r.prefix));
        let class = match route.and_then(|r| r.class) {
            Some(RouteClass::Read) => Class::Read,
            Some(RouteClass::Write) => Class::Write,
            None if self.read_methods.contains(&parts.method) => Class::Read,
            None => Class::Write,
        };
        let scope = self.scope(route, parts)?;
        Ok(Decision {
            class,
            scope,
            upgrade: false,
        })
    }

    /// The request's scope: its route's, else the client's `Fencing-Scope` (if allowed),
    /// else `default`. A `Fencing-Scope` that contradicts the route, or that is sent when
    /// client scopes are off, is refused rather than silently ignored.
    fn scope(&self, route: Option<&Route>, parts: &Parts) -> Result<String, ProxyError> {
        let mut values = parts.headers.get_all(FENCING_SCOPE).iter();
        let header = match (values.next(), values.next()) {
            (None, _) => None,
            (Some(_), Some(_)) => return Err(bad_scope("Fencing-Scope header is repeated")),
            (Some(v), None) => Some(
                v.to_str()
                    .map_err(|_| bad_scope("Fencing-Scope is not ASCII"))?,
            ),
        };
        let route_scope = route.and_then(|r| r.scope.as_deref());
        let scope = match (route_scope, header) {
            (Some(fixed), Some(h)) if h != fixed => {
                return Err(bad_scope(format!(
                    "Fencing-Scope {h:?} contradicts scope {fixed:?} of its route"
                )));
            }
            (Some(fixed), _) => fixed.to_owned(),
            (None, Some(_)) if !self.client_scopes => {
                return Err(bad_scope(
                    "client-chosen scopes are disabled (client_scopes = false)",
                ));
            }
            (None, Some(h)) => h.to_owned(),
            (None, None) => DEFAULT_SCOPE.to_owned(),
        };
        Scope::check(&scope).map_err(|reason| bad_scope(reason.to_string()))?;
        Ok(scope)
    }
}

fn bad_scope(reason: impl Into<String>) -> ProxyError {
    ProxyError::BadScope {
        reason: reason.into(),
    }
}
