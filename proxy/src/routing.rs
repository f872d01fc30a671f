//! Classification of a request from its head alone: read or fenced write, and its scope.
//!
//! This is where the proxy fails closed.
//!
//! - **Methods.** Reads are the configured safe methods (`read_methods`, compared
//!   exactly, since methods are case-sensitive); every other method, any case and any
//!   extension, is a fenced write. A method-override header is classified by the method
//!   it names, and the stricter of the two methods wins: an override can make a read a
//!   write, never a write a read.
//! - **Tunnels.** `CONNECT` is refused: a reverse proxy opens no tunnels, and its target
//!   is not a path, so no route can allow it. An upgrade (`Upgrade` on HTTP/1, extended
//!   CONNECT on HTTP/2) is refused unless its route has `upgrade = true`; an offer of
//!   `h2c` alone is ignored, as a server may.
//! - **Paths.** Routes match the normalised path, so that no spelling of a path the
//!   storage reads as the same resource escapes its route: unreserved characters are
//!   percent-decoded, repeated slashes collapsed and dot segments removed. A path whose
//!   meaning depends on decoding or on how the storage treats dot segments and empty
//!   segments is refused with 400 (see [`normalise`] and [`Classifier::classify`]).
//!   The request is forwarded with its original path; only the scope decision uses the
//!   normalised one.

use std::borrow::Cow;

use http::request::Parts;
use http::{HeaderName, Method, header};
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
    /// Borrowed for `default` (most requests), so deciding it allocates nothing.
    pub scope: Cow<'static, str>,
    /// An `Upgrade` request its route allows: the connection is tunnelled after the
    /// response.
    pub upgrade: bool,
    /// The route lets GET and HEAD carry a body (`read_bodies = true`).
    pub read_bodies: bool,
}

/// The classification rules, built once from the configuration.
pub(crate) struct Classifier {
    read_methods: Vec<Method>,
    override_headers: Vec<HeaderName>,
    /// Routes, longest prefix first, so the first match is the most specific.
    routes: Vec<Route>,
    client_scopes: bool,
    fence_reads: bool,
}

/// The outcome of resolving one reading of a path against the routes: which route (by
/// index), and the scope it gives (or why it gives none). Two readings of one path must
/// resolve alike, or the path is ambiguous. The scope borrows from the route or the path.
#[derive(Debug, PartialEq, Eq)]
struct Resolution<'a> {
    route: Option<usize>,
    scope: Result<Cow<'a, str>, String>,
}

impl Classifier {
    pub(crate) fn new(config: &ProxyConfig) -> Self {
        let mut routes = config.routes.clone();
        routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        Self {
            read_methods: config.read_methods(),
            override_headers: config
                .method_override_headers
                .iter()
                .filter_map(|h| HeaderName::from_bytes(h.as_bytes()).ok())
                .collect(),
            routes,
            client_scopes: config.client_scopes,
            fence_reads: config.fence_reads,
        }
    }

    /// The method-override headers: the proxy classifies by them, so they are among the
    /// headers a `Connection` header may not name (see `framing`).
    pub(crate) fn override_headers(&self) -> &[HeaderName] {
        &self.override_headers
    }

    /// The scopes that must always be available whatever `limits.scopes_max` says:
    /// `default` and every scope a route names.
    pub(crate) fn reserved_scopes(&self) -> Vec<String> {
        let mut scopes = vec![DEFAULT_SCOPE.to_owned()];
        scopes.extend(self.routes.iter().filter_map(|r| r.scope.clone()));
        scopes.sort_unstable();
        scopes.dedup();
        scopes
    }

    /// Classifies a request head: refuses tunnels and ambiguous paths, then decides read
    /// or write, and the scope.
    pub(crate) fn classify(&self, parts: &Parts) -> Result<Decision, ProxyError> {
        // HTTP/2's extended CONNECT (RFC 8441) is an upgrade, not a tunnel to a host.
        let extended_connect = parts.extensions.get::<hyper::ext::Protocol>().is_some();
        if parts.method == Method::CONNECT && !extended_connect {
            return Err(ProxyError::NotTunnelled {
                reason: "CONNECT is refused: a reverse proxy opens no tunnels, and no route \
                         can allow one (its target is a host, not a path)"
                    .to_owned(),
            });
        }
        let upgrade_asked = extended_connect || asks_upgrade(&parts.headers);

        let raw = parts.uri.path();
        if raw == "*" {
            // The asterisk form names the server, not a resource: OPTIONS only.
            if parts.method != Method::OPTIONS {
                return Err(bad_path(format!(
                    "the target * is only for OPTIONS, not {}",
                    parts.method
                )));
            }
            let scope = self.scope(None, Ok(Cow::Borrowed(DEFAULT_SCOPE)), client_scope(parts)?)?;
            return self.decide(parts, None, scope, upgrade_asked);
        }
        // Most paths are plain: their one reading is the path itself, resolved in place
        // (see `readings`; this is on every request's path, so it allocates nothing).
        if is_plain(raw) {
            let header = client_scope(parts)?;
            let first = self.resolve(raw);
            let route = first.route.and_then(|i| self.routes.get(i));
            let scope = self.scope(route, first.scope, header)?;
            return self.decide(parts, route, scope, upgrade_asked);
        }
        let paths = all_readings(raw)?;
        let header = client_scope(parts)?;
        let mut resolutions = paths.iter().map(|p| self.resolve(p));
        // `readings` never returns an empty list; the normalised reading comes first.
        let first = resolutions
            .next()
            .ok_or_else(|| bad_path("the path has no reading"))?;
        if resolutions.any(|other| other != first) {
            return Err(bad_path(format!(
                "{raw:?} falls in a different route or scope depending on whether the \
                 storage removes its dot segments and empty segments; send the path \
                 normalised ({:?})",
                paths[0]
            )));
        }
        let route = first.route.and_then(|i| self.routes.get(i));
        let scope = self.scope(route, first.scope, header)?;
        self.decide(parts, route, scope, upgrade_asked)
    }

    /// Finishes a decision once the route is known: the class, the upgrade rule, and the
    /// scope, which is needed only when the request is fenced (`Err` says why the route
    /// gives none).
    fn decide(
        &self,
        parts: &Parts,
        route: Option<&Route>,
        scope: Result<Cow<'static, str>, String>,
        upgrade_asked: bool,
    ) -> Result<Decision, ProxyError> {
        if upgrade_asked && !route.is_some_and(|r| r.upgrade) {
            return Err(ProxyError::NotTunnelled {
                reason: format!(
                    "upgrade requests are refused on {:?}: no route with upgrade = true \
                     covers it",
                    parts.uri.path()
                ),
            });
        }
        let by_method = self.class_of_methods(parts)?;
        let class = match route.and_then(|r| r.class) {
            Some(RouteClass::Read) => Class::Read,
            Some(RouteClass::Write) => Class::Write,
            // An upgraded connection carries whatever the client sends next, so it is
            // fenced unless its route says it only reads.
            None if upgrade_asked => Class::Write,
            None => by_method,
        };
        let fenced = class == Class::Write || self.fence_reads;
        let scope = match scope {
            Ok(scope) => scope,
            Err(reason) if fenced => return Err(bad_scope(reason)),
            // An unfenced read needs no scope (`GET /` lists S3 buckets and has no
            // bucket segment); `default` only labels its log line.
            Err(_) => Cow::Borrowed(DEFAULT_SCOPE),
        };
        Ok(Decision {
            class,
            scope,
            upgrade: upgrade_asked,
            read_bodies: route.is_some_and(|r| r.read_bodies),
        })
    }

    /// Read only when the method and the override it carries (if any) are both reads.
    fn class_of_methods(&self, parts: &Parts) -> Result<Class, ProxyError> {
        let mut named = None;
        // One pass over the request's headers rather than a lookup per override name:
        // heads are small, and comparing names is cheaper than hashing them.
        for (name, value) in &parts.headers {
            if !self.override_headers.contains(name) {
                continue;
            }
            if named.is_some() {
                return Err(ProxyError::BadRequest(format!(
                    "more than one method override ({name} and others): the method the \
                     request means is ambiguous"
                )));
            }
            let method = value
                .to_str()
                .ok()
                .and_then(|v| Method::from_bytes(v.trim().as_bytes()).ok())
                .ok_or_else(|| {
                    ProxyError::BadRequest(format!(
                        "{name} {value:?} is not an HTTP method (method_override_headers)"
                    ))
                })?;
            named = Some(method);
        }
        let is_read = |m: &Method| self.read_methods.contains(m);
        Ok(
            if is_read(&parts.method) && named.as_ref().is_none_or(is_read) {
                Class::Read
            } else {
                Class::Write
            },
        )
    }

    /// The route a reading of the path falls in, and the scope the route gives.
    fn resolve<'a>(&'a self, path: &'a str) -> Resolution<'a> {
        let found = self
            .routes
            .iter()
            .enumerate()
            .find(|(_, r)| prefix_matches(r, path));
        let Some((index, route)) = found else {
            return Resolution {
                route: None,
                scope: Ok(Cow::Borrowed(DEFAULT_SCOPE)),
            };
        };
        let scope = match (&route.scope, route.scope_segment) {
            (Some(fixed), _) => Ok(Cow::Borrowed(fixed.as_str())),
            (None, Some(n)) => segment_scope(path, n).map(Cow::Borrowed),
            // Validation requires one of the two; a route with neither gives no scope.
            (None, None) => Err(format!("route {:?} names no scope", route.prefix)),
        };
        Resolution {
            route: Some(index),
            scope,
        }
    }

    /// The request's scope: its route's, else the client's `Fencing-Scope` (if allowed),
    /// else `default`. A `Fencing-Scope` that contradicts the route, that breaks the scope
    /// rule, or that is sent when client scopes are off, is refused (the outer error) on
    /// every request, reads included, rather than silently ignored. The inner `Err` is a
    /// route that gives no scope for this path (no such segment), which only matters to
    /// a fenced request.
    ///
    /// The scope is checked, and made owned, only at the end: `default`, which most
    /// requests have, is known to be valid and stays borrowed.
    fn scope<'a>(
        &self,
        route: Option<&Route>,
        resolved: Result<Cow<'a, str>, String>,
        header: Option<&'a str>,
    ) -> Result<Result<Cow<'static, str>, String>, ProxyError> {
        let scope: Cow<'a, str> = match (route, header) {
            (None, None) => Cow::Borrowed(DEFAULT_SCOPE),
            // Naming the scope the proxy picks anyway chooses nothing (a client that
            // takes its scope from a node of the `default` scope sends it).
            (None, Some(h)) if h == DEFAULT_SCOPE => Cow::Borrowed(h),
            (None, Some(_)) if !self.client_scopes => {
                return Err(bad_scope(
                    "client-chosen scopes are off: Fencing-Scope is refused unless the proxy \
                     runs with client_scopes = true (--client-scopes); a route can fix the \
                     scope instead",
                ));
            }
            (None, Some(h)) => Cow::Borrowed(h),
            (Some(r), Some(h)) if self.client_scopes && r.client_scope_prefix.is_some() => {
                let prefix = r.client_scope_prefix.as_deref().unwrap_or_default();
                if !h.starts_with(prefix) {
                    return Err(bad_scope(format!(
                        "Fencing-Scope {h:?} does not start with {prefix:?}, the \
                         client_scope_prefix of route {:?}",
                        r.prefix
                    )));
                }
                Cow::Borrowed(h)
            }
            (Some(r), header) => {
                let fixed = match resolved {
                    Ok(fixed) => fixed,
                    Err(reason) => return Ok(Err(reason)),
                };
                // Naming the route's own scope chooses nothing, so it is accepted even
                // with client scopes off.
                if let Some(h) = header
                    && h != &*fixed
                {
                    return Err(bad_scope(format!(
                        "Fencing-Scope {h:?} contradicts scope {fixed:?} of route {:?}",
                        r.prefix
                    )));
                }
                fixed
            }
        };
        if scope == DEFAULT_SCOPE {
            return Ok(Ok(Cow::Borrowed(DEFAULT_SCOPE)));
        }
        Scope::check(&scope).map_err(|reason| bad_scope(reason.to_string()))?;
        Ok(Ok(Cow::Owned(scope.into_owned())))
    }
}

/// Whether an HTTP/1 request asks to switch protocols. An offer of `h2c` alone is not
/// counted: it asks to speak HTTP/2 with the proxy itself on this connection (what
/// `curl --http2` sends in cleartext), and a server may ignore it (RFC 9110 §7.8), as
/// the proxy does: the request is served over HTTP/1.1 and the `Upgrade` header, being
/// hop-by-hop, goes no further. Any other protocol, or an empty offer, is an upgrade.
fn asks_upgrade(headers: &http::HeaderMap) -> bool {
    let mut offers = headers.get_all(header::UPGRADE).iter().peekable();
    if offers.peek().is_none() {
        return false;
    }
    offers.any(|value| {
        value.to_str().map_or(true, |v| {
            v.split(',')
                .map(str::trim)
                .any(|protocol| !protocol.eq_ignore_ascii_case("h2c"))
        })
    })
}

/// The `Fencing-Scope` header, if one was sent (borrowed from the head).
fn client_scope(parts: &Parts) -> Result<Option<&str>, ProxyError> {
    let mut values = parts.headers.get_all(FENCING_SCOPE).iter();
    match (values.next(), values.next()) {
        (None, _) => Ok(None),
        (Some(_), Some(_)) => Err(bad_scope("Fencing-Scope header is repeated")),
        (Some(v), None) => v
            .to_str()
            .map(Some)
            .map_err(|_| bad_scope("Fencing-Scope is not ASCII")),
    }
}

/// Whether the normalised `path` falls under the route's prefix. Plain string prefixes:
/// `/billing` also covers `/billingX`, and `/billing/` is how a route says "the
/// directory". The directory itself belongs to it too: `/billing/` also covers exactly
/// `/billing`, since a write there (`DELETE` or `MOVE` of the DAV collection, S3's
/// `DELETE` of the bucket) reaches everything under it. Paths are ASCII here (anything
/// else stays percent-encoded), so the byte comparison is a character comparison.
fn prefix_matches(route: &Route, path: &str) -> bool {
    let same = |a: &[u8], b: &[u8]| {
        if route.case_insensitive {
            a.eq_ignore_ascii_case(b)
        } else {
            a == b
        }
    };
    let (prefix, path) = (route.prefix.as_bytes(), path.as_bytes());
    let under = path
        .get(..prefix.len())
        .is_some_and(|head| same(head, prefix));
    let directory = match prefix.split_last() {
        Some((b'/', parent)) if !parent.is_empty() => same(path, parent),
        _ => false,
    };
    under || directory
}

/// Segment `n` (1 is the first) of a normalised path, as a scope name.
fn segment_scope(path: &str, n: usize) -> Result<&str, String> {
    let segment = path
        .split('/')
        .skip(1)
        .nth(n.saturating_sub(1))
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            format!("path {path:?} has no segment {n} to take the scope from (scope_segment = {n})")
        })?;
    Scope::check(segment).map_err(|reason| {
        format!(
            "segment {n} of path {path:?} is not a valid scope name (scope_segment = {n}): {reason}"
        )
    })?;
    Ok(segment)
}

/// The readings of a raw path the storage might take, normalised one first: after
/// percent-decoding (the same in every reading), with repeated slashes collapsed then dot
/// segments removed; dot segments removed then slashes collapsed; and literally, with
/// neither. Servers differ on the last two steps (S3 keeps `..` and empty segments in
/// keys; nginx removes them), so a path is only safe to route when every reading falls
/// in the same route and scope. Refuses what no reading can make unambiguous.
fn readings(raw: &str) -> Result<Vec<String>, ProxyError> {
    // Most paths need no decoding and have nothing to remove: their three readings are
    // the path itself, and one scan says so (this is on every request's path).
    if is_plain(raw) {
        return Ok(vec![raw.to_owned()]);
    }
    all_readings(raw)
}

/// [`readings`] worked out in full.
fn all_readings(raw: &str) -> Result<Vec<String>, ProxyError> {
    let decoded = decode(raw)?;
    let segments: Vec<&str> = decoded.split('/').skip(1).collect();
    for segment in &segments {
        // Java servlet containers drop path parameters, so `..;x` is `..` to them.
        let before_params = segment.split(';').next().unwrap_or_default();
        if segment.contains(';') && matches!(before_params, "." | "..") {
            return Err(bad_path(format!(
                "the segment {segment:?} is a dot segment with a parameter, which some \
                 servers read as {before_params:?}"
            )));
        }
    }
    let collapse_first = remove_dots(&collapse(&segments))?;
    let dots_first = collapse(&remove_dots(&segments)?);
    let mut out = vec![join(&collapse_first), join(&dots_first), decoded];
    out.dedup();
    Ok(out)
}

/// Whether every reading of `raw` is `raw` itself: an absolute path of plain bytes, no
/// percent-encoding, no backslash, no path parameter, no empty segment and no dot
/// segment. Such a path is also one `decode` accepts unchanged.
///
/// One pass over the bytes, since this runs on every request: each segment is checked
/// when the `/` after it (or the end) is reached.
fn is_plain(raw: &str) -> bool {
    let bytes = raw.as_bytes();
    if bytes.first() != Some(&b'/') {
        return false;
    }
    // Where the current segment starts (after its `/`).
    let mut start = 1;
    for (i, &b) in bytes.iter().enumerate().skip(1) {
        if !b.is_ascii_graphic() || matches!(b, b'%' | b'\\' | b';') {
            return false;
        }
        if b == b'/' {
            if !plain_segment(&bytes[start..i], false) {
                return false;
            }
            start = i + 1;
        }
    }
    plain_segment(&bytes[start..], true)
}

/// Whether a segment of a plain path is neither a dot segment nor empty (an empty last
/// segment is a trailing slash, which is plain).
fn plain_segment(segment: &[u8], last: bool) -> bool {
    match segment {
        b"" => last,
        b"." | b".." => false,
        _ => true,
    }
}

/// The normalised form of a raw path, as routes see it: percent-decoded unreserved
/// characters, repeated slashes collapsed, dot segments removed. Refuses the same
/// inputs as the classifier.
pub(crate) fn normalise(raw: &str) -> Result<String, ProxyError> {
    readings(raw)?
        .into_iter()
        .next()
        .ok_or_else(|| bad_path("the path has no reading"))
}

/// Percent-decodes the unreserved characters (RFC 3986 §2.3), which every server must
/// read as their plain selves, and upper-cases the hex of the rest. Refuses a path that
/// is not a plain absolute path, and every encoding a server could read as a separator,
/// a terminator or something else than its bytes.
fn decode(raw: &str) -> Result<String, ProxyError> {
    if !raw.starts_with('/') {
        return Err(bad_path(format!(
            "{raw:?} is not an absolute path (the target must be origin-form)"
        )));
    }
    let mut out = String::with_capacity(raw.len());
    // Consecutive encoded bytes of 0x80 and above, checked to be UTF-8 when the run
    // ends: an overlong encoding such as %C0%AF is "/" to some decoders.
    let mut run: Vec<u8> = Vec::new();
    let mut bytes = raw.bytes();
    while let Some(b) = bytes.next() {
        if b != b'%' {
            end_run(&mut run)?;
            if b == b'\\' {
                return Err(bad_path("a raw \\ is a separator to some servers"));
            }
            if b.is_ascii_control() || !b.is_ascii() {
                return Err(bad_path(format!("byte 0x{b:02X} is not allowed in a path")));
            }
            out.push(char::from(b));
            continue;
        }
        let (hi, lo) = (bytes.next(), bytes.next());
        let Some(c) = hi
            .zip(lo)
            .and_then(|(hi, lo)| Some(hex(hi)? << 4 | hex(lo)?))
        else {
            let shown: String = [hi, lo].into_iter().flatten().map(char::from).collect();
            return Err(bad_path(format!("bad percent-encoding \"%{shown}\"")));
        };
        if !c.is_ascii() {
            run.push(c);
            push_encoded(&mut out, c);
            continue;
        }
        end_run(&mut run)?;
        match c {
            b'/' => {
                return Err(bad_path(
                    "an encoded / (%2F) is a separator to some servers",
                ));
            }
            b'\\' => {
                return Err(bad_path(
                    "an encoded \\ (%5C) is a separator to some servers",
                ));
            }
            c if c.is_ascii_control() => {
                return Err(bad_path(format!(
                    "an encoded control byte (%{c:02X}) is a terminator or worse to some servers"
                )));
            }
            c if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') => {
                out.push(char::from(c));
            }
            c => push_encoded(&mut out, c),
        }
    }
    end_run(&mut run)?;
    Ok(out)
}

/// Appends `%XX`, with upper-case hex, so that equal bytes are equal text.
fn push_encoded(out: &mut String, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(byte >> 4)]));
    out.push(char::from(HEX[usize::from(byte & 0x0F)]));
}

/// The value of one hex digit.
fn hex(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Checks that a run of encoded non-ASCII bytes is UTF-8, and empties it.
fn end_run(run: &mut Vec<u8>) -> Result<(), ProxyError> {
    let utf8 = std::str::from_utf8(run).is_ok();
    run.clear();
    if utf8 {
        Ok(())
    } else {
        Err(bad_path(
            "percent-encoded bytes that are not UTF-8 (an overlong encoding can hide a / or a .)",
        ))
    }
}

/// Drops empty segments, but keeps a trailing slash (the last, empty, segment).
fn collapse<'a>(segments: &[&'a str]) -> Vec<&'a str> {
    let last = segments.len().saturating_sub(1);
    segments
        .iter()
        .enumerate()
        .filter(|&(i, s)| !s.is_empty() || i == last)
        .map(|(_, s)| *s)
        .collect()
}

/// Removes `.` and `..` segments (RFC 3986 §5.2.4), refusing a `..` that would climb
/// above the root (the RFC drops it silently; a file server might not).
fn remove_dots<'a>(segments: &[&'a str]) -> Result<Vec<&'a str>, ProxyError> {
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    let last = segments.len().saturating_sub(1);
    for (i, segment) in segments.iter().enumerate() {
        match *segment {
            "." => {}
            ".." => {
                if out.pop().is_none() {
                    return Err(bad_path("a .. segment climbs above the root"));
                }
            }
            s => {
                out.push(s);
                continue;
            }
        }
        // `/a/..` is the directory `/`: the trailing slash stays.
        if i == last {
            out.push("");
        }
    }
    Ok(out)
}

fn join(segments: &[&str]) -> String {
    let mut path = String::with_capacity(segments.iter().map(|s| s.len() + 1).sum());
    for s in segments {
        path.push('/');
        path.push_str(s);
    }
    if path.is_empty() {
        path.push('/');
    }
    path
}

fn bad_scope(reason: impl Into<String>) -> ProxyError {
    ProxyError::BadScope {
        reason: reason.into(),
    }
}

fn bad_path(reason: impl Into<String>) -> ProxyError {
    ProxyError::BadPath {
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests;
