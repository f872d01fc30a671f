//! The audit trail: one JSON line per event that changed or refused a fence, written by
//! `palisade proxy --audit-log FILE` and `palisade node --audit-log FILE`, read back by
//! `palisade audit FILE`.
//!
//! Each line is one [`AuditRecord`]. Fields that do not apply to an event are left out,
//! never written as `null`; a reader ignores fields it does not know, so new fields can
//! be added without breaking old readers. Times are RFC 3339 in UTC with milliseconds
//! (`2026-11-23T16:38:10.123Z`), written and parsed by [`rfc3339`] and [`parse_rfc3339`].
//!
//! The file is rotated by size: when the next line would take it over its limit, `FILE`
//! becomes `FILE.1`, `FILE.1` becomes `FILE.2`, and so on, and the oldest beyond the
//! number kept is deleted ([`rotated_path`] names them). A reader goes from the highest
//! number down to `FILE` to see the events in the order they were written.
//!
//! Records any client can cause without holding a token (a proxy's refusals of a
//! missing or invalid proof) are *noise*: they go to a second file, [`noise_path`] (`FILE.noise`), rotated the same way but on its own, so that a
//! flood of them can never rotate a record of `FILE` out. At most a few per kind and
//! second are written in full; the rest are counted, and one [`event::SUPPRESSED`]
//! record per kind says how many. A reader merges both files by time.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Default size at which an audit file is rotated: large enough for about half a million
/// rejections, small enough to open in an editor.
pub const AUDIT_LOG_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;
/// Default number of rotated files kept besides the current one, so that the trail keeps
/// at least this many times the size limit of history before the oldest is deleted.
pub const AUDIT_LOG_KEEP_DEFAULT: u32 = 4;

/// The `event` values of an [`AuditRecord`].
pub mod event {
    /// A proxy refused a fenced request: a stale token (or a missing or invalid proof).
    /// Fields: scope, presented, current, peer, method, path, reason.
    pub const REJECTION: &str = "rejection";
    /// A proxy raised a fence. Fields: scope, presented (the new fence), previous.
    pub const RAISE: &str = "raise";
    /// An operator reset a fence. Fields: scope, presented (the new fence), previous,
    /// reason.
    pub const RESET: &str = "reset";
    /// A term announced to a proxy. On the proxy: scope, presented, current (the fence
    /// after it), outcome (`advanced`, `unchanged`, `refused`), peer. On the node:
    /// `node_id`, term, scope, proxy, outcome (`accepted`, `refused`, `retrying`), reason.
    pub const ANNOUNCE: &str = "announce";
    /// A node saw the cluster's membership change. Fields: `node_id`, term, reason (what
    /// changed).
    pub const MEMBERSHIP: &str = "membership";
    /// A leadership transfer asked of a node's API. Fields: `node_id`, term, current (the
    /// target node), outcome, reason.
    pub const TRANSFER: &str = "transfer";
    /// A node refused a request of its API for the client certificate's role (403
    /// `forbidden-role`). Fields: `node_id`, term, peer, method, path, outcome (the
    /// credential's role, or `none`), reason (the problem's detail: the role needed and
    /// the credential's names).
    pub const FORBIDDEN: &str = "forbidden";
    /// Records were dropped because the writer fell behind (its queue was full). Field:
    /// dropped (how many since the last such record).
    pub const DROPPED: &str = "dropped";
    /// Noise records counted but not written in full (past the rate written per kind),
    /// in the noise file. Fields: reason (their kind, e.g. `missing-proof`), dropped (how
    /// many since the last such record of that kind).
    pub const SUPPRESSED: &str = "suppressed";
}

/// One line of an audit log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// When it happened, RFC 3339 in UTC.
    pub time: String,
    /// What happened: one of [`event`].
    pub event: String,
    /// The fencing scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The token a request or announcement presented (for a raise or reset: the new
    /// fence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presented: Option<u64>,
    /// The fence it met (for a rejection: the fence that refused it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<u64>,
    /// The fence before a raise or reset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<u64>,
    /// The client's IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// The request's method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The request's path (without the query).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The node that wrote the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<u64>,
    /// The node's raft term when it wrote the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
    /// The proxy an announcement went to (its admin URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    /// How it ended (see [`event`] for the values of each event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// Why: the error, or the operator's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Records dropped before this one ([`event::DROPPED`]), or noise records of one
    /// kind counted and not written ([`event::SUPPRESSED`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped: Option<u64>,
}

impl AuditRecord {
    /// A record of `event` at `time`, with no other field set.
    pub fn new(event: &str, time: SystemTime) -> Self {
        Self {
            time: rfc3339(time),
            event: event.to_owned(),
            ..Self::default()
        }
    }

    /// The record's time, parsed; `None` when the line's time is not RFC 3339.
    pub fn at(&self) -> Option<SystemTime> {
        parse_rfc3339(&self.time).ok()
    }
}

/// `text` cut to at most `max` bytes, at a character boundary: for the fields of a
/// record that a client controls (a path, an error's detail), so that one record stays
/// small whatever was sent.
pub fn cut_to_bytes(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The path of the `n`th rotated file of `path` (`FILE.n`); `n` = 0 is `path` itself.
pub fn rotated_path(path: &Path, n: u32) -> PathBuf {
    if n == 0 {
        return path.to_owned();
    }
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// The noise file of the audit log at `path` (`FILE.noise`): see the module docs. Its
/// rotated files are [`rotated_path`] of it (`FILE.noise.1`, ...).
pub fn noise_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".noise");
    PathBuf::from(name)
}

/// `time` as RFC 3339 in UTC with milliseconds: `2026-11-23T16:38:10.123Z`. Times before
/// 1970 are written as the epoch (no audit event predates its writer), and so are times
/// past the year 9999, which no clock reads.
pub fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let at = i64::try_from(since.as_secs())
        .ok()
        .and_then(|secs| OffsetDateTime::from_unix_timestamp(secs).ok())
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        since.subsec_millis()
    )
}

/// Parses an RFC 3339 time: `YYYY-MM-DDTHH:MM:SS`, optional fraction, then `Z` or an
/// offset `±HH:MM`. The error names the text and says what was wrong.
pub fn parse_rfc3339(text: &str) -> Result<SystemTime, String> {
    let bad = |what: &dyn std::fmt::Display| {
        format!("{text:?} is not an RFC 3339 time ({what}); e.g. 2026-11-23T16:38:10Z")
    };
    let at = OffsetDateTime::parse(text, &Rfc3339).map_err(|err| bad(&err))?;
    if at < OffsetDateTime::UNIX_EPOCH {
        return Err(bad(&"before 1970"));
    }
    Ok(SystemTime::from(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a cut never splits a character and never exceeds the bound.
    /// Method: cut ASCII and a two-byte character at and around the bound.
    #[test]
    fn cut_to_bytes_keeps_characters_whole() {
        assert_eq!(cut_to_bytes("abcdef", 10), "abcdef");
        assert_eq!(cut_to_bytes("abcdef", 3), "abc");
        // "é" is two bytes: a bound inside it drops it whole.
        assert_eq!(cut_to_bytes("aé", 2), "a");
        assert_eq!(cut_to_bytes("aé", 3), "aé");
        assert_eq!(cut_to_bytes("é", 0), "");
    }

    /// Goal: times round-trip through RFC 3339 text, and known instants print as
    /// expected (the epoch, a leap day, the end of a year). Method: format and parse.
    #[test]
    fn rfc3339_round_trips_and_prints_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = UNIX_EPOCH + Duration::from_millis(951_782_400_123);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.123Z");
        let eoy = UNIX_EPOCH + Duration::from_secs(1_798_761_599);
        assert_eq!(rfc3339(eoy), "2026-12-31T23:59:59.000Z");
        for t in [UNIX_EPOCH, leap, eoy] {
            assert_eq!(parse_rfc3339(&rfc3339(t)).unwrap(), t);
        }
        assert_eq!(
            parse_rfc3339("2026-12-31T23:59:59Z").unwrap(),
            parse_rfc3339("2027-01-01T00:59:59+01:00").unwrap()
        );
    }

    /// Goal: malformed times are refused with a message naming the text.
    /// Method: parse a few bad strings.
    #[test]
    fn bad_times_are_refused_with_the_text_named() {
        for bad in [
            "",
            "2026-11-23",
            "2026-13-01T00:00:00Z",
            "2026-11-23T00:00:00",
            "2026-11-23T00:00:00+0100",
            "1969-12-31T23:59:59Z",
            "2026-11-23T00:00:00.Z",
        ] {
            let err = parse_rfc3339(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }

    /// Goal: a record leaves out the fields it does not have, and reads back equal.
    /// Method: serialize a rejection, check the JSON, parse it back.
    #[test]
    fn record_omits_absent_fields_and_round_trips() {
        let mut r = AuditRecord::new(event::REJECTION, UNIX_EPOCH);
        r.scope = Some("jobs".into());
        r.presented = Some(1);
        r.current = Some(2);
        let line = serde_json::to_string(&r).unwrap();
        assert_eq!(
            line,
            r#"{"time":"1970-01-01T00:00:00.000Z","event":"rejection","scope":"jobs","presented":1,"current":2}"#
        );
        assert_eq!(serde_json::from_str::<AuditRecord>(&line).unwrap(), r);
        assert_eq!(
            rotated_path(Path::new("/a/b.log"), 2),
            Path::new("/a/b.log.2")
        );
    }
}
