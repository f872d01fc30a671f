//! The announce list's entries in the log: a normal entry replacing the `--announce`
//! list, written on top of the list it was computed against, and the list's rules
//! ([`check_announce`]).

use super::MemberError;

/// How the data of a normal entry that replaces the `--announce` list starts; a version
/// and a newline follow. Version 1 (written by older nodes) lists the entries one per
/// line and applies unconditionally; version 2 is JSON (`AnnounceData`): the entries and
/// the list they replace, and applies only on top of that list.
pub(crate) const ANNOUNCE_ENTRY_PREFIX: &[u8] = b"palisade-announce ";
/// The version 1 announce entry's first line.
const ANNOUNCE_V1: &[u8] = b"palisade-announce 1\n";
/// The version 2 announce entry's first line.
const ANNOUNCE_V2: &[u8] = b"palisade-announce 2\n";

/// The JSON of a version 2 announce entry.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AnnounceData {
    /// The members table's announce list the change was computed against (`None`: the
    /// cluster never replaced its flags' list).
    base: Option<Vec<String>>,
    /// The new list, in normal form.
    proxies: Vec<String>,
}

/// Where a committed announce list change applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AppliesOn {
    /// Whatever the list is: a version 1 entry.
    AnyList,
    /// Only where the members table's announce list is this one (`None`: the cluster
    /// never replaced its flags' list): the removed proxies were retired against it.
    List(Option<Vec<String>>),
}

/// A committed announce list change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AnnounceListChange {
    /// Where it applies.
    pub(crate) applies_on: AppliesOn,
    /// The new list, in normal form.
    pub(crate) proxies: Vec<String>,
}

/// The entry data that replaces the announce list with `proxies` where the members
/// table's announce list is `base`.
pub(crate) fn announce_entry(proxies: &[String], base: Option<&[String]>) -> Vec<u8> {
    let data = AnnounceData {
        base: base.map(<[String]>::to_vec),
        proxies: proxies.to_vec(),
    };
    let mut bytes = ANNOUNCE_V2.to_vec();
    // Strings and lists of strings always serialise.
    bytes.extend(serde_json::to_vec(&data).unwrap_or_default());
    bytes
}

/// The change an entry's data carries, `None` when it is not an announce entry.
pub(crate) fn decode_announce_entry(
    data: &[u8],
) -> Option<Result<AnnounceListChange, MemberError>> {
    if !data.starts_with(ANNOUNCE_ENTRY_PREFIX) {
        return None;
    }
    let invalid = |detail: String| MemberError::Invalid { detail };
    let decoded = if let Some(rest) = data.strip_prefix(ANNOUNCE_V1) {
        std::str::from_utf8(rest)
            .map_err(|e| invalid(format!("announce entry is not UTF-8: {e}")))
            .map(|text| AnnounceListChange {
                applies_on: AppliesOn::AnyList,
                proxies: text.lines().map(str::to_owned).collect(),
            })
    } else if let Some(rest) = data.strip_prefix(ANNOUNCE_V2) {
        serde_json::from_slice::<AnnounceData>(rest)
            .map_err(|e| invalid(format!("announce entry is not its JSON: {e}")))
            .map(|d| AnnounceListChange {
                applies_on: AppliesOn::List(d.base),
                proxies: d.proxies,
            })
    } else {
        Err(invalid("announce entry of an unknown version".to_owned()))
    };
    Some(decoded.and_then(|mut change| {
        change.proxies = check_announce(&change.proxies)?;
        Ok(change)
    }))
}

// Every entry an announce list accepts fits the members table's announce lines.
const _: () = assert!(
    palisade_protocol::announce::ANNOUNCE_ENTRY_BYTES_MAX
        <= palisade_storage::ANNOUNCE_URL_BYTES_MAX
);

/// An announce list holds at most [`crate::config::ANNOUNCE_URLS_MAX`] entries, each
/// checked by [`palisade_protocol::announce::parse_announce_entry`], none naming a proxy
/// twice, as `--announce` must; answers them in normal form.
pub(crate) fn check_announce(proxies: &[String]) -> Result<Vec<String>, MemberError> {
    if proxies.len() > crate::config::ANNOUNCE_URLS_MAX {
        return Err(MemberError::Invalid {
            detail: format!(
                "the announce list names {} proxies, the limit is {}",
                proxies.len(),
                crate::config::ANNOUNCE_URLS_MAX
            ),
        });
    }
    palisade_protocol::announce::parse_announce_list(proxies)
        .map(|entries| entries.iter().map(ToString::to_string).collect())
        .map_err(|err| MemberError::Invalid {
            detail: err.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a version 2 entry carries its list in normal form and the list it applies
    /// on top of, `None` included; a version 1 entry (older nodes) still decodes, without
    /// a base; anything else under the prefix is refused. Method: round trips, then a
    /// v1 entry, a bad entry in each version and an unknown version.
    #[test]
    fn announce_entries_round_trip_with_their_base() {
        let proxies = vec!["http://a:1".to_owned(), "proxy-b=http://b:1".to_owned()];
        for base in [None, Some(vec![]), Some(vec!["http://c:1".to_owned()])] {
            let data = announce_entry(&proxies, base.as_deref());
            assert!(data.starts_with(ANNOUNCE_ENTRY_PREFIX));
            let change = decode_announce_entry(&data).unwrap().unwrap();
            assert_eq!(change.applies_on, AppliesOn::List(base));
            assert_eq!(change.proxies, proxies);
        }
        let v1 = b"palisade-announce 1\nHTTP://A:1/\nhttp://b:1\n";
        let change = decode_announce_entry(v1).unwrap().unwrap();
        assert_eq!(change.applies_on, AppliesOn::AnyList);
        assert_eq!(change.proxies, ["http://a:1", "http://b:1"]);
        let bad_v1 = b"palisade-announce 1\nhttp://u:p@a:1\n";
        assert!(decode_announce_entry(bad_v1).unwrap().is_err());
        let bad_v2 = announce_entry(&["http://a:1/#f".to_owned()], None);
        assert!(decode_announce_entry(&bad_v2).unwrap().is_err());
        assert!(
            decode_announce_entry(b"palisade-announce 9\n")
                .unwrap()
                .is_err()
        );
        assert!(
            decode_announce_entry(b"palisade-announce 2\n{")
                .unwrap()
                .is_err()
        );
        assert!(decode_announce_entry(b"").is_none());
        assert!(decode_announce_entry(b"other").is_none());
    }

    /// Goal: the list's rule answers the normal form and refuses a proxy twice and a list
    /// over the limit. Method: one list each.
    #[test]
    fn check_announce_normalises_and_bounds_the_list() {
        assert_eq!(
            check_announce(&["HTTPS://P.example:443/x/".to_owned()]).unwrap(),
            ["https://p.example/x"]
        );
        let twice = ["http://a:1".to_owned(), "http://a:1/".to_owned()];
        assert!(matches!(
            check_announce(&twice),
            Err(MemberError::Invalid { detail }) if detail.contains("same proxy")
        ));
        let many = vec!["http://a:1".to_owned(); crate::config::ANNOUNCE_URLS_MAX + 1];
        assert!(matches!(
            check_announce(&many),
            Err(MemberError::Invalid { detail }) if detail.contains("limit")
        ));
    }
}
