//! Announce entries: the one rule for naming a proxy a node fences on election, checked in
//! one place for the `--announce` flag, the config file's `announce` key and
//! `POST /v1/announce`.
//!
//! An entry is `URL` or `NAME=URL`:
//! - `NAME`, when given, is the proxy's credential name: [`PROXY_NAME_PREFIX`] followed by
//!   1 to [`PROXY_NAME_SUFFIX_CHARS_MAX`] characters of `[A-Za-z0-9._-]` (the name of the
//!   proxy role's certificate).
//! - `URL` is the proxy's admin base URL: `http://` or `https://`, a host (a DNS name, a
//!   dotted-quad IPv4 address or a bracketed IPv6 address), an optional port (1 to
//!   65535) and an optional path prefix. User information (`user:password@`), a query
//!   and a fragment are refused: a client would drop or mangle them, so an entry with one
//!   would name a proxy other than the one the operator meant, or none.
//!
//! [`parse_announce_entry`] answers the entry in its normal form ([`AnnounceEntry`]): the
//! scheme and host in lower case, the scheme's default port dropped, no trailing `/`.
//! Two entries name the same proxy exactly when their normal URLs are equal
//! ([`AnnounceEntry::url`]); [`parse_announce_list`] refuses a list that names one twice.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Longest entry, in bytes: a base URL has no business being longer, and the entry is
/// stored in every node's members table.
pub const ANNOUNCE_ENTRY_BYTES_MAX: usize = 2_048;

/// How a proxy's credential name starts.
pub const PROXY_NAME_PREFIX: &str = "proxy-";

/// Most characters after [`PROXY_NAME_PREFIX`] in a proxy's name.
pub const PROXY_NAME_SUFFIX_CHARS_MAX: usize = 64;

/// The fence a proxy is raised to when it leaves a cluster's announce list: above every
/// term a leader will ever hold, so the proxy refuses every write of the scope until an
/// operator resets its fence (`POST /v1/fences/{scope}/reset`).
pub const RETIRED_FENCE: u64 = u64::MAX;

/// Most characters of an entry quoted back in an error.
const ENTRY_SHOWN_CHARS_MAX: usize = 128;

/// One announce entry in its normal form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AnnounceEntry {
    /// The proxy's credential name (`proxy-...`), when the entry gave one.
    pub name: Option<String>,
    /// The admin base URL, normalised: lower-case scheme and host, no default port, no
    /// trailing `/`. Compare proxies by this field.
    pub url: String,
}

impl fmt::Display for AnnounceEntry {
    /// The entry as it is stored and listed: `NAME=URL` or `URL`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "{name}={}", self.url),
            None => f.write_str(&self.url),
        }
    }
}

impl FromStr for AnnounceEntry {
    type Err = AnnounceEntryError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse_announce_entry(text)
    }
}

/// Why a string is not an announce entry; its `Display` quotes the entry (user
/// information replaced, long entries cut) and says what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnounceEntryError {
    /// The entry as given, safe to show: user information replaced by `***`, cut after
    /// 128 characters.
    pub entry: String,
    /// What is wrong with it.
    pub fault: AnnounceEntryFault,
}

/// What is wrong with an announce entry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AnnounceEntryFault {
    /// The empty string.
    Empty,
    /// Longer than [`ANNOUNCE_ENTRY_BYTES_MAX`].
    TooLong {
        /// Its length in bytes.
        bytes: usize,
    },
    /// White space, a control character or a character outside ASCII.
    BadChar {
        /// The first such character.
        found: char,
    },
    /// `NAME=` is not a proxy name.
    BadName {
        /// The name as given.
        name: String,
    },
    /// Not `http://` or `https://`.
    Scheme,
    /// `user:password@` before the host.
    UserInfo,
    /// A `?query`.
    Query,
    /// A `#fragment`.
    Fragment,
    /// No host.
    NoHost,
    /// A host that is no DNS name, dotted-quad IPv4 address or bracketed IPv6 address.
    BadHost {
        /// The host as given.
        host: String,
    },
    /// A port that is not 1 to 65535.
    BadPort {
        /// The port as given.
        port: String,
    },
    /// A character a path prefix may not hold, a `%` not followed by two hex digits, an
    /// empty segment or a `.` or `..` segment.
    BadPath {
        /// The path as given.
        path: String,
    },
    /// The list names this proxy (the same normal URL, or the same name) twice.
    Duplicate {
        /// The earlier entry naming it.
        first: String,
    },
}

impl fmt::Display for AnnounceEntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use AnnounceEntryFault as F;
        write!(f, "announce entry {:?} ", self.entry)?;
        match &self.fault {
            F::Empty => write!(f, "is empty; expected URL or NAME=URL"),
            F::TooLong { bytes } => write!(
                f,
                "is {bytes} bytes, longer than {ANNOUNCE_ENTRY_BYTES_MAX}"
            ),
            F::BadChar { found } => write!(
                f,
                "has {found:?}; white space, control and non-ASCII characters are refused \
                 (give an international host name in its xn-- form)"
            ),
            F::BadName { name } => write!(
                f,
                "names proxy {name:?}; a proxy name is {PROXY_NAME_PREFIX} followed by 1 to \
                 {PROXY_NAME_SUFFIX_CHARS_MAX} of A-Z a-z 0-9 . _ -"
            ),
            F::Scheme => write!(f, "must be an http:// or https:// URL"),
            F::UserInfo => write!(
                f,
                "has user information (user:password@); give the admin credential with \
                 --announce-token-file, never in the URL"
            ),
            F::Query => write!(f, "has a query (?...); an admin base URL has none"),
            F::Fragment => write!(f, "has a fragment (#...); an admin base URL has none"),
            F::NoHost => write!(f, "has no host"),
            F::BadHost { host } => write!(
                f,
                "has host {host:?}, which is no DNS name, dotted-quad IPv4 address or \
                 [IPv6] address"
            ),
            F::BadPort { port } => write!(f, "has port {port:?}; expected 1 to 65535"),
            F::BadPath { path } => write!(
                f,
                "has path {path:?}; a path prefix is /-separated non-empty segments of URL \
                 characters (%XX escapes allowed), none of them . or .."
            ),
            F::Duplicate { first } => write!(f, "names the same proxy as {first:?}"),
        }
    }
}

impl std::error::Error for AnnounceEntryError {}

/// Parses and checks one announce entry (`URL` or `NAME=URL`), answering its normal form.
pub fn parse_announce_entry(text: &str) -> Result<AnnounceEntry, AnnounceEntryError> {
    let fail = |fault| AnnounceEntryError {
        entry: shown(text),
        fault,
    };
    if text.is_empty() {
        return Err(fail(AnnounceEntryFault::Empty));
    }
    if text.len() > ANNOUNCE_ENTRY_BYTES_MAX {
        return Err(fail(AnnounceEntryFault::TooLong { bytes: text.len() }));
    }
    if let Some(found) = text
        .chars()
        .find(|c| !c.is_ascii() || c.is_ascii_whitespace() || c.is_ascii_control())
    {
        return Err(fail(AnnounceEntryFault::BadChar { found }));
    }
    // `NAME=` comes before the scheme; a `=` after it belongs to the URL.
    let scheme_at = text.find("://");
    let (name, url) = match (text.find('='), scheme_at) {
        (Some(eq), Some(at)) if eq < at => (Some(&text[..eq]), &text[eq + 1..]),
        (Some(eq), None) => (Some(&text[..eq]), &text[eq + 1..]),
        _ => (None, text),
    };
    if let Some(name) = name
        && !is_proxy_name(name)
    {
        return Err(fail(AnnounceEntryFault::BadName {
            name: name.to_owned(),
        }));
    }
    let url = parse_url(url).map_err(fail)?;
    Ok(AnnounceEntry {
        name: name.map(str::to_owned),
        url,
    })
}

/// Parses every entry of a list and refuses one that names a proxy (its normal URL, or
/// its name) an earlier entry names. The number of entries is the caller's limit.
pub fn parse_announce_list<S: AsRef<str>>(
    entries: &[S],
) -> Result<Vec<AnnounceEntry>, AnnounceEntryError> {
    let mut parsed: Vec<AnnounceEntry> = Vec::with_capacity(entries.len());
    for text in entries {
        let entry = parse_announce_entry(text.as_ref())?;
        let same = parsed
            .iter()
            .find(|p| p.url == entry.url || (p.name.is_some() && p.name == entry.name));
        if let Some(first) = same {
            return Err(AnnounceEntryError {
                entry: shown(text.as_ref()),
                fault: AnnounceEntryFault::Duplicate {
                    first: first.to_string(),
                },
            });
        }
        parsed.push(entry);
    }
    Ok(parsed)
}

/// Whether `name` is a proxy's credential name: `proxy-[A-Za-z0-9._-]{1,64}`.
pub fn is_proxy_name(name: &str) -> bool {
    name.strip_prefix(PROXY_NAME_PREFIX).is_some_and(|rest| {
        (1..=PROXY_NAME_SUFFIX_CHARS_MAX).contains(&rest.len())
            && rest.bytes().all(crate::scope::is_scope_byte)
    })
}

/// The normal form of an admin base URL, or what is wrong with it.
fn parse_url(url: &str) -> Result<String, AnnounceEntryFault> {
    let (scheme, rest) = url.split_once("://").ok_or(AnnounceEntryFault::Scheme)?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => "80",
        "https" => "443",
        _ => return Err(AnnounceEntryFault::Scheme),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    // Refused before anything else: these are what a client would silently drop.
    if authority.contains('@') {
        return Err(AnnounceEntryFault::UserInfo);
    }
    if tail.contains('?') {
        return Err(AnnounceEntryFault::Query);
    }
    if tail.contains('#') {
        return Err(AnnounceEntryFault::Fragment);
    }
    let (host, port) = split_authority(authority)?;
    let host = normal_host(host)?;
    let port = match port {
        None => None,
        Some(p) if is_port(p) => Some(p.trim_start_matches('0')).filter(|p| *p != default_port),
        Some(p) => {
            return Err(AnnounceEntryFault::BadPort { port: p.to_owned() });
        }
    };
    let path = tail.trim_end_matches('/');
    if !is_path_prefix(path) {
        return Err(AnnounceEntryFault::BadPath {
            path: tail.to_owned(),
        });
    }
    Ok(match port {
        Some(port) => format!("{scheme}://{host}:{port}{path}"),
        None => format!("{scheme}://{host}{path}"),
    })
}

/// `host` and the port after its `:`, if any (an IPv6 host is bracketed).
fn split_authority(authority: &str) -> Result<(&str, Option<&str>), AnnounceEntryFault> {
    if authority.is_empty() {
        return Err(AnnounceEntryFault::NoHost);
    }
    if authority.starts_with('[') {
        let close = authority
            .find(']')
            .ok_or_else(|| AnnounceEntryFault::BadHost {
                host: authority.to_owned(),
            })?;
        let (host, after) = authority.split_at(close + 1);
        return match after {
            "" => Ok((host, None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((host, Some(port))),
                None => Err(AnnounceEntryFault::BadHost {
                    host: authority.to_owned(),
                }),
            },
        };
    }
    Ok(match authority.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    })
}

/// The host in lower case (an IPv6 address in its canonical text), or why it is none.
fn normal_host(host: &str) -> Result<String, AnnounceEntryFault> {
    let bad = || AnnounceEntryFault::BadHost {
        host: host.to_owned(),
    };
    if host.is_empty() {
        return Err(AnnounceEntryFault::NoHost);
    }
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or_else(bad)?;
        let ip: Ipv6Addr = inner.parse().map_err(|_| bad())?;
        return Ok(format!("[{ip}]"));
    }
    let host = host.to_ascii_lowercase();
    let labels_ok = host.trim_end_matches('.').split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !label.starts_with('-')
            && !label.ends_with('-')
    });
    if !labels_ok {
        return Err(bad());
    }
    // A host whose last label starts with a digit is an IPv4 address to URL parsers
    // (which also read `127.1` and `0x7f.1` as addresses): only the dotted quad is
    // accepted, so that every client reads the same address.
    let last = host.trim_end_matches('.').rsplit('.').next().unwrap_or("");
    if last.starts_with(|c: char| c.is_ascii_digit()) && host.parse::<Ipv4Addr>().is_err() {
        return Err(bad());
    }
    Ok(host)
}

/// Whether `port` is 1 to 65535 in decimal digits.
fn is_port(port: &str) -> bool {
    !port.is_empty()
        && port.len() <= 5
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u16>().is_ok_and(|p| p > 0)
}

/// Whether `path` (without its trailing `/`) is empty or `/`-separated non-empty segments
/// of URL path characters, none of them `.` or `..`.
fn is_path_prefix(path: &str) -> bool {
    if path.is_empty() {
        return true;
    }
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    rest.split('/')
        .all(|segment| !matches!(segment, "" | "." | "..") && is_path_segment(segment))
}

/// URL path characters (RFC 3986 `pchar`), with `%` only as the start of a `%XX` escape.
fn is_path_segment(segment: &str) -> bool {
    let bytes = segment.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = bytes.get(i + 1..i + 3);
            if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                return false;
            }
            i += 3;
            continue;
        }
        let allowed = crate::uri::is_unreserved_or_sub_delim(b) || matches!(b, b':' | b'@');
        if !allowed {
            return false;
        }
        i += 1;
    }
    true
}

/// `text` safe to quote back: user information replaced by `***`, cut after
/// [`ENTRY_SHOWN_CHARS_MAX`] characters.
fn shown(text: &str) -> String {
    let mut text = text.to_owned();
    if let Some(at) = text.find("://") {
        let start = at + 3;
        let authority_end = text[start..]
            .find(['/', '?', '#'])
            .map_or(text.len(), |i| start + i);
        if let Some(userinfo) = text[start..authority_end].rfind('@') {
            text.replace_range(start..start + userinfo, "***");
        }
    }
    match text.char_indices().nth(ENTRY_SHOWN_CHARS_MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(text: &str) -> AnnounceEntryFault {
        parse_announce_entry(text).unwrap_err().fault
    }

    /// Goal: every form an admin base URL takes today parses, to one normal form.
    /// Method: one case per spelling, with the normal URL expected.
    #[test]
    fn admin_base_urls_parse_to_their_normal_form() {
        for (text, url) in [
            ("http://127.0.0.1:9001", "http://127.0.0.1:9001"),
            ("http://127.0.0.1:9001/", "http://127.0.0.1:9001"),
            ("HTTP://Proxy.Example:9001//", "http://proxy.example:9001"),
            (
                "https://proxy.example:443/admin/",
                "https://proxy.example/admin",
            ),
            ("http://proxy.example:80", "http://proxy.example"),
            ("http://proxy.example:0080", "http://proxy.example"),
            ("http://[::1]:9001", "http://[::1]:9001"),
            ("http://[0:0:0:0:0:0:0:1]:9001", "http://[::1]:9001"),
            (
                "http://a_b.example/p%2Fq/x=y",
                "http://a_b.example/p%2Fq/x=y",
            ),
        ] {
            let entry = parse_announce_entry(text).unwrap();
            assert_eq!(entry.url, url, "{text}");
            assert_eq!(entry.name, None);
            assert_eq!(entry.to_string(), url);
        }
        let named = parse_announce_entry("proxy-a.1=http://127.0.0.1:9001/").unwrap();
        assert_eq!(named.name.as_deref(), Some("proxy-a.1"));
        assert_eq!(named.url, "http://127.0.0.1:9001");
        assert_eq!(named.to_string(), "proxy-a.1=http://127.0.0.1:9001");
        assert_eq!("proxy-a.1=http://127.0.0.1:9001".parse(), Ok(named));
    }

    /// Goal: what a client would drop or misread is refused up front, each with its
    /// reason. Method: hostile spellings, one per rule.
    #[test]
    fn hostile_entries_are_refused_with_their_reason() {
        use AnnounceEntryFault as F;
        for (text, want) in [
            ("http://u:p@127.0.0.1:1", F::UserInfo),
            ("http://u@127.0.0.1:1/", F::UserInfo),
            ("http://@127.0.0.1:1", F::UserInfo),
            ("http://127.0.0.1:1/#frag", F::Fragment),
            ("http://127.0.0.1:1#", F::Fragment),
            ("http://127.0.0.1:1?q", F::Query),
            ("http://127.0.0.1:1/a?", F::Query),
            ("ftp://127.0.0.1:1", F::Scheme),
            ("127.0.0.1:1", F::Scheme),
            ("proxy-a=127.0.0.1:1", F::Scheme),
            ("http://", F::NoHost),
            ("http:///admin", F::NoHost),
            ("http://:9001", F::NoHost),
            ("http://127.0.0.1:0", F::BadPort { port: "0".into() }),
            (
                "http://127.0.0.1:65536",
                F::BadPort {
                    port: "65536".into(),
                },
            ),
            (
                "http://127.0.0.1:",
                F::BadPort {
                    port: String::new(),
                },
            ),
            ("http://127.0.0.1:1:2", F::BadPort { port: "1:2".into() }),
            (
                "http://127.1:9001",
                F::BadHost {
                    host: "127.1".into(),
                },
            ),
            (
                "http://0x7f.1:9001",
                F::BadHost {
                    host: "0x7f.1".into(),
                },
            ),
            (
                "http://a..b:9001",
                F::BadHost {
                    host: "a..b".into(),
                },
            ),
            ("http://-a:9001", F::BadHost { host: "-a".into() }),
            (
                "http://a\\b:9001",
                F::BadHost {
                    host: "a\\b".into(),
                },
            ),
            (
                "http://[::1:9001",
                F::BadHost {
                    host: "[::1:9001".into(),
                },
            ),
            (
                "http://[zz]:9001",
                F::BadHost {
                    host: "[zz]".into(),
                },
            ),
            (
                "http://h/a/../b",
                F::BadPath {
                    path: "/a/../b".into(),
                },
            ),
            (
                "http://h/./b",
                F::BadPath {
                    path: "/./b".into(),
                },
            ),
            (
                "http://h/a//b",
                F::BadPath {
                    path: "/a//b".into(),
                },
            ),
            (
                "http://h/%zz",
                F::BadPath {
                    path: "/%zz".into(),
                },
            ),
            (
                "http://h/a\"b",
                F::BadPath {
                    path: "/a\"b".into(),
                },
            ),
            ("http://h:1 ", F::BadChar { found: ' ' }),
            ("http://h:1\n", F::BadChar { found: '\n' }),
            ("http://h\u{e9}:1", F::BadChar { found: '\u{e9}' }),
            ("", F::Empty),
            (
                "=http://h:1",
                F::BadName {
                    name: String::new(),
                },
            ),
            (
                "proxy-=http://h:1",
                F::BadName {
                    name: "proxy-".into(),
                },
            ),
            (
                "node-a=http://h:1",
                F::BadName {
                    name: "node-a".into(),
                },
            ),
            (
                "proxy-a/b=http://h:1",
                F::BadName {
                    name: "proxy-a/b".into(),
                },
            ),
        ] {
            assert_eq!(fault(text), want, "{text:?}");
        }
        let long_name = format!("proxy-{}=http://h:1", "a".repeat(65));
        assert!(matches!(fault(&long_name), F::BadName { .. }));
        let ok_name = format!("proxy-{}=http://h:1", "a".repeat(64));
        assert!(parse_announce_entry(&ok_name).is_ok());
        let long = format!("http://h/{}", "a".repeat(ANNOUNCE_ENTRY_BYTES_MAX));
        assert_eq!(
            fault(&long),
            F::TooLong {
                bytes: ANNOUNCE_ENTRY_BYTES_MAX + 9
            }
        );
    }

    /// Goal: an error quotes the entry without its password and says what is wrong.
    /// Method: display the errors of user information and of a long entry.
    #[test]
    fn errors_hide_credentials_and_name_the_entry() {
        let err = parse_announce_entry("http://admin:s3cret@10.0.0.1:9001").unwrap_err();
        let text = err.to_string();
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("http://***@10.0.0.1:9001"), "{text}");
        assert!(text.contains("user information"), "{text}");
        let err = parse_announce_entry(&format!("http://h/{}", "a".repeat(4000))).unwrap_err();
        assert!(err.to_string().len() < 300, "{err}");
    }

    /// Goal: a list names each proxy once, by normal URL and by name. Method: lists
    /// with the same proxy spelled twice, and one with the same name twice.
    #[test]
    fn lists_refuse_the_same_proxy_twice() {
        let ok = parse_announce_list(&["http://a:1", "proxy-b=http://b:1"]).unwrap();
        assert_eq!(ok.len(), 2);
        let err = parse_announce_list(&["http://a:1", "HTTP://A:1/"]).unwrap_err();
        assert_eq!(
            err.fault,
            AnnounceEntryFault::Duplicate {
                first: "http://a:1".into()
            }
        );
        let err = parse_announce_list(&["proxy-a=http://a:1", "proxy-a=http://b:1"]).unwrap_err();
        assert!(matches!(err.fault, AnnounceEntryFault::Duplicate { .. }));
        assert!(parse_announce_list(&["http://a:1", "http://b:1?x"]).is_err());
        assert!(parse_announce_list::<&str>(&[]).unwrap().is_empty());
    }
}
