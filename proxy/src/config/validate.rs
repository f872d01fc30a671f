//! [`ProxyConfig::validate`]: every field, and every relation between fields, checked
//! with an error that names the field.

use palisade_protocol::Scope;

use super::{AUDIT_LOG_BYTES_MIN, ConfigError, ProxyConfig, REUSEPORT_THREADS_MAX, Route, invalid};

impl ProxyConfig {
    /// Checks every field and every relation between fields; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(threads) = self.reuseport_threads
            && threads > REUSEPORT_THREADS_MAX
        {
            return Err(invalid(
                "reuseport_threads",
                format!(
                    "{threads} threads; at most {REUSEPORT_THREADS_MAX} (0 turns the mode off)"
                ),
            ));
        }
        if let Some(upstream) = &self.upstream {
            let uri: http::Uri = upstream
                .parse()
                .map_err(|e| invalid("upstream", format!("{upstream:?} is not a URL: {e}")))?;
            match uri.scheme_str() {
                Some("http" | "https") => {}
                _ => {
                    return Err(invalid(
                        "upstream",
                        format!("{upstream:?} must start with http:// or https://"),
                    ));
                }
            }
            if uri.authority().is_none() {
                return Err(invalid("upstream", format!("{upstream:?} has no host")));
            }
            if uri.query().is_some() {
                return Err(invalid("upstream", "a base URL cannot have a query"));
            }
        }
        if self.audit_log.is_some() && self.audit_log_bytes_max < AUDIT_LOG_BYTES_MIN {
            return Err(invalid(
                "audit_log_bytes_max",
                format!(
                    "{} bytes; at least {AUDIT_LOG_BYTES_MIN}, so that a file holds more than a few records",
                    self.audit_log_bytes_max
                ),
            ));
        }
        if self.upstream_ca.is_some() && self.upstream.is_none() {
            return Err(invalid("upstream_ca", "set, but there is no upstream"));
        }
        if self.write_methods.is_some() {
            return Err(invalid(
                "write_methods",
                "replaced by read_methods: every method not listed in read_methods is a fenced write",
            ));
        }
        for m in &self.read_methods {
            http::Method::from_bytes(m.as_bytes())
                .map_err(|_| invalid("read_methods", format!("{m:?} is not an HTTP method")))?;
            if m.eq_ignore_ascii_case("CONNECT") {
                return Err(invalid(
                    "read_methods",
                    "CONNECT opens a tunnel; it cannot be a read",
                ));
            }
        }
        for h in &self.method_override_headers {
            http::HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                invalid(
                    "method_override_headers",
                    format!("{h:?} is not a header name"),
                )
            })?;
        }
        self.validate_routes()?;
        if self.admin_metrics_public && self.admin_token_file.is_none() {
            return Err(invalid(
                "admin_metrics_public",
                "set, but there is no admin_token_file: without one every admin route is public",
            ));
        }
        if self.listen == self.admin_listen && self.listen.port() != 0 {
            return Err(invalid("admin_listen", "must differ from listen"));
        }
        self.validate_fleet()?;
        self.limits.validate()
    }

    /// The routes: prefixes (normalised, each once), scopes, client scope prefixes.
    fn validate_routes(&self) -> Result<(), ConfigError> {
        for (i, r) in self.routes.iter().enumerate() {
            let field = |name: &str| format!("routes[{i}].{name}");
            if !r.prefix.starts_with('/') {
                return Err(invalid(
                    field("prefix"),
                    format!("{:?} must start with /", r.prefix),
                ));
            }
            // Routes match the normalised path, so a prefix in any other spelling could
            // never match and would silently route nothing.
            match crate::routing::normalise(&r.prefix) {
                Ok(normal) if normal == r.prefix => {}
                Ok(normal) => {
                    return Err(invalid(
                        field("prefix"),
                        format!(
                            "{:?} is not normalised: write it as {normal:?} (requests are \
                             matched on their normalised path)",
                            r.prefix
                        ),
                    ));
                }
                Err(err) => {
                    return Err(invalid(
                        field("prefix"),
                        format!("{:?} can never match: {err}", r.prefix),
                    ));
                }
            }
            match (&r.scope, r.scope_segment) {
                (Some(scope), None) => Scope::check(scope)
                    .map_err(|reason| invalid(field("scope"), reason.to_string()))?,
                (None, Some(0)) => {
                    return Err(invalid(field("scope_segment"), "segments count from 1"));
                }
                (None, Some(_)) => {}
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        field("scope"),
                        "set either scope or scope_segment, not both",
                    ));
                }
                (None, None) => {
                    return Err(invalid(
                        field("scope"),
                        "a route needs scope or scope_segment",
                    ));
                }
            }
            if let Some(prefix) = &r.client_scope_prefix {
                if !self.client_scopes {
                    return Err(invalid(
                        field("client_scope_prefix"),
                        "set, but client_scopes is false",
                    ));
                }
                if prefix.is_empty() || !prefix.bytes().all(palisade_protocol::scope::is_scope_byte)
                {
                    return Err(invalid(
                        field("client_scope_prefix"),
                        format!("{prefix:?} must be a non-empty start of a scope name"),
                    ));
                }
            }
            let same = |o: &Route| {
                if r.case_insensitive || o.case_insensitive {
                    o.prefix.eq_ignore_ascii_case(&r.prefix)
                } else {
                    o.prefix == r.prefix
                }
            };
            if self.routes[..i].iter().any(same) {
                return Err(invalid(
                    field("prefix"),
                    format!("{:?} appears twice", r.prefix),
                ));
            }
        }
        Ok(())
    }

    /// The fleet fields: node URLs, the fleet name, the cluster TLS files.
    fn validate_fleet(&self) -> Result<(), ConfigError> {
        for (i, url) in self.cluster.iter().enumerate() {
            check_base_url(&format!("cluster[{i}]"), url)?;
            if self.cluster[..i].contains(url) {
                return Err(invalid(
                    format!("cluster[{i}]"),
                    format!("{url:?} appears twice"),
                ));
            }
        }
        if self.cluster.is_empty() {
            if self.fleet_name.is_some() {
                return Err(invalid(
                    "fleet_name",
                    "set, but cluster is empty (not in fleet mode)",
                ));
            }
            if self.cluster_tls.is_some() {
                return Err(invalid(
                    "cluster_tls",
                    "set, but cluster is empty (not in fleet mode)",
                ));
            }
        }
        if let Some(name) = &self.fleet_name {
            check_base_url("fleet_name", name)?;
        }
        if let Some(tls) = &self.cluster_tls
            && tls.cert.is_some() != tls.key.is_some()
        {
            return Err(invalid(
                "cluster_tls.cert",
                "cert and key go together: set both or neither",
            ));
        }
        if self.lease_write_bound_ms == 0 {
            return Err(invalid(
                "lease_write_bound_ms",
                "must be greater than 0 (a write always takes some time to complete)",
            ));
        }
        Ok(())
    }
}

/// An `http://` or `https://` URL with a host and no query, or the error naming `field`.
fn check_base_url(field: &str, url: &str) -> Result<(), ConfigError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| invalid(field, format!("{url:?} is not a URL: {e}")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(invalid(
            field,
            format!("{url:?} must start with http:// or https://"),
        ));
    }
    if uri.authority().is_none() {
        return Err(invalid(field, format!("{url:?} has no host")));
    }
    if uri.query().is_some() {
        return Err(invalid(field, format!("{url:?} cannot have a query")));
    }
    Ok(())
}
