//! The members table of an election cluster: every member's id and peer address, and the
//! ids that were removed (never accepted again).
//!
//! raft's `ConfState` knows only ids; the addresses travel in each conf change's context
//! and end up here. The table is stored next to the raft log (in `RAFT_META`, written in the
//! same transaction as the conf state it belongs to) and is the data of every snapshot, so
//! that a member that catches up from a snapshot (the entries that carried the addresses
//! being compacted away) still learns them.
//!
//! The encoding is a small line-oriented text, versioned by its first line:
//!
//! ```text
//! palisade-members 1
//! index 42
//! member 1 127.0.0.1:7001
//! removed 4 127.0.0.1:7004
//! announce-set
//! announce http://127.0.0.1:9001
//! ```
//!
//! `announce-set` and the `announce` lines appear once the cluster replaced its
//! `--announce` proxy list (`POST /v1/announce`); without them each node uses its flags.

use std::collections::BTreeMap;

/// First line of an encoded table; a different version is refused, not guessed at.
const HEADER: &str = "palisade-members 1";

/// Longest accepted peer address, in bytes: `HOST:PORT` with a DNS name fits easily.
pub const MEMBER_PEER_BYTES_MAX: usize = 300;

/// Longest accepted announce URL, in bytes.
pub const ANNOUNCE_URL_BYTES_MAX: usize = 2_048;

/// Most entries (members and removed ids together) a decoded table may hold: far above
/// any real cluster's history, low enough that a hostile snapshot cannot make a node
/// allocate without bound.
pub const MEMBERS_TABLE_ENTRIES_MAX: usize = 10_000;

/// One id's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRecord {
    /// Its peer address, `HOST:PORT`.
    pub peer: String,
    /// Removed from the cluster: its id is never accepted again. The address is kept so a
    /// member still in the outgoing half of a joint configuration stays reachable.
    pub removed: bool,
}

/// Every id the cluster has known, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MembersTable {
    /// The raft index of the last membership change reflected here (0: the initial
    /// membership from the command line).
    pub index: u64,
    /// Members and removed ids, by id.
    pub records: BTreeMap<u64, MemberRecord>,
    /// The `--announce` proxy list the cluster agreed on, once replaced at run time;
    /// `None`: every node uses its own flags.
    pub announce: Option<Vec<String>>,
}

/// Why a members table does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MembersError {
    /// The first line is not the expected header.
    #[error("members table has header {found:?}, expected {HEADER:?}")]
    Header {
        /// The first line found.
        found: String,
    },
    /// A line does not parse.
    #[error("members table line {line}: {detail}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        detail: String,
    },
    /// More entries than [`MEMBERS_TABLE_ENTRIES_MAX`].
    #[error("members table holds more than {MEMBERS_TABLE_ENTRIES_MAX} entries")]
    TooLarge,
}

impl MembersTable {
    /// The initial table: these members, none removed, at index 0.
    pub fn initial(peers: &BTreeMap<u64, String>) -> Self {
        Self {
            index: 0,
            records: peers
                .iter()
                .map(|(&id, peer)| {
                    (
                        id,
                        MemberRecord {
                            peer: peer.clone(),
                            removed: false,
                        },
                    )
                })
                .collect(),
            announce: None,
        }
    }

    /// Whether the table holds nothing (never written).
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The current members (not removed) and their peer addresses.
    pub fn members(&self) -> BTreeMap<u64, String> {
        self.records
            .iter()
            .filter(|(_, r)| !r.removed)
            .map(|(&id, r)| (id, r.peer.clone()))
            .collect()
    }

    /// The removed ids.
    pub fn removed(&self) -> Vec<u64> {
        self.records
            .iter()
            .filter(|(_, r)| r.removed)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Whether `id` is a current member.
    pub fn is_member(&self, id: u64) -> bool {
        self.records.get(&id).is_some_and(|r| !r.removed)
    }

    /// Whether `id` was removed.
    pub fn is_removed(&self, id: u64) -> bool {
        self.records.get(&id).is_some_and(|r| r.removed)
    }

    /// The text encoding (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut lines = vec![HEADER.to_owned(), format!("index {}", self.index)];
        for (id, r) in &self.records {
            let kind = if r.removed { "removed" } else { "member" };
            lines.push(format!("{kind} {id} {}", r.peer));
        }
        if let Some(urls) = &self.announce {
            lines.push("announce-set".to_owned());
            lines.extend(urls.iter().map(|u| format!("announce {u}")));
        }
        let mut out = lines.join("\n");
        out.push('\n');
        out.into_bytes()
    }

    /// Decodes [`MembersTable::encode`]'s output; anything else is an error.
    pub fn decode(bytes: &[u8]) -> Result<Self, MembersError> {
        let text = std::str::from_utf8(bytes).map_err(|e| MembersError::Line {
            line: 0,
            detail: format!("not UTF-8: {e}"),
        })?;
        let mut lines = text.lines();
        let header = lines.next().unwrap_or_default();
        if header != HEADER {
            return Err(MembersError::Header {
                found: header.chars().take(64).collect(),
            });
        }
        let mut table = Self::default();
        for (n, line) in lines.enumerate() {
            let line_no = n + 2;
            let bad = |detail: String| MembersError::Line {
                line: line_no,
                detail,
            };
            let mut words = line.split(' ');
            match (words.next(), words.next(), words.next(), words.next()) {
                (Some("index"), Some(index), None, None) => {
                    table.index = index
                        .parse()
                        .map_err(|e| bad(format!("index {index:?}: {e}")))?;
                }
                (Some(kind @ ("member" | "removed")), Some(id), Some(peer), None) => {
                    let id: u64 = id.parse().map_err(|e| bad(format!("id {id:?}: {e}")))?;
                    if id == 0 {
                        return Err(bad("id 0 is invalid".to_owned()));
                    }
                    if peer.is_empty() || peer.len() > MEMBER_PEER_BYTES_MAX {
                        return Err(bad(format!(
                            "peer address of {} bytes, expected 1 to {MEMBER_PEER_BYTES_MAX}",
                            peer.len()
                        )));
                    }
                    if table.records.len() >= MEMBERS_TABLE_ENTRIES_MAX {
                        return Err(MembersError::TooLarge);
                    }
                    table.records.insert(
                        id,
                        MemberRecord {
                            peer: peer.to_owned(),
                            removed: kind == "removed",
                        },
                    );
                }
                (Some("announce-set"), None, None, None) => {
                    table.announce.get_or_insert_with(Vec::new);
                }
                (Some("announce"), Some(url), None, None) => {
                    if url.is_empty() || url.len() > ANNOUNCE_URL_BYTES_MAX {
                        return Err(bad(format!(
                            "announce URL of {} bytes, expected 1 to {ANNOUNCE_URL_BYTES_MAX}",
                            url.len()
                        )));
                    }
                    let urls = table.announce.get_or_insert_with(Vec::new);
                    if urls.len() >= MEMBERS_TABLE_ENTRIES_MAX {
                        return Err(MembersError::TooLarge);
                    }
                    urls.push(url.to_owned());
                }
                _ => return Err(bad(format!("unexpected line {line:?}"))),
            }
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a table survives its encoding, removed ids included. Method: encode, decode,
    /// compare; then check the accessors.
    #[test]
    fn table_round_trips_with_removed_ids() {
        let mut t = MembersTable::initial(&BTreeMap::from([
            (1, "127.0.0.1:7001".to_owned()),
            (2, "127.0.0.1:7002".to_owned()),
        ]));
        t.index = 17;
        t.records.insert(
            4,
            MemberRecord {
                peer: "127.0.0.1:7004".to_owned(),
                removed: true,
            },
        );
        let back = MembersTable::decode(&t.encode()).unwrap();
        assert_eq!(back, t);
        // An agreed announce list round-trips too, the empty one included.
        for urls in [vec![], vec!["http://127.0.0.1:9001".to_owned()]] {
            let mut with = t.clone();
            with.announce = Some(urls);
            assert_eq!(MembersTable::decode(&with.encode()).unwrap(), with);
        }
        assert_eq!(back.members().len(), 2);
        assert_eq!(back.removed(), vec![4]);
        assert!(back.is_member(1) && !back.is_member(4) && back.is_removed(4));
    }

    /// Goal: foreign or damaged bytes are refused with the line named, never guessed at.
    /// Method: decode a wrong header, a bad id, id 0 and an unknown line.
    #[test]
    fn damaged_tables_are_refused() {
        assert!(matches!(
            MembersTable::decode(b"something else\n"),
            Err(MembersError::Header { .. })
        ));
        for bad in [
            "palisade-members 1\nmember x 1.2.3.4:5\n",
            "palisade-members 1\nmember 0 1.2.3.4:5\n",
            "palisade-members 1\nvoter 1 1.2.3.4:5\n",
        ] {
            let err = MembersTable::decode(bad.as_bytes()).unwrap_err();
            assert!(
                matches!(err, MembersError::Line { line: 2, .. }),
                "{bad:?}: {err}"
            );
        }
    }
}
