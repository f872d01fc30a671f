//! Leaders placed by score: each node scores itself with an oracle, shares the score with
//! its peers, and the scores decide who campaigns first and when a leader hands over.
//!
//! Scores are on by default ([`SCORE_ORACLE_DEFAULT`], `static`: every node scores its
//! `--score`, 0 unless set, so ranks go by node id); `--score-oracle off`
//! ([`SCORE_ORACLE_OFF`]) turns them off for raft's randomized election.
//!
//! Raft still decides who may win (pre-vote, an up-to-date log, a majority); scores only
//! change timing and raft's own leadership transfer:
//!
//! - **Direction.** A score is an `f64`, and higher is better everywhere. The latency
//!   oracles score `-rtt` in milliseconds, so a node 10 ms from its proxies scores `-10`
//!   and beats one 50 ms away (`-50`), and `--score-margin` is in milliseconds for them.
//! - **Order** ([`order`]): a known score comes before an unknown one; two scores more
//!   than the margin apart are ordered by score; scores within the margin count as equal
//!   and the lower node id comes first.
//! - **Election by rank** ([`timeout`]): a node that is not the leader counts the nodes
//!   it hears from (fresh scores, the leader it follows excluded) that come before it,
//!   where every node whose log is behind the most recent log among them comes after
//!   every up-to-date node. Rank 0 sets raft's election timeout to its minimum,
//!   `election_ticks`, plus [`SCORE_LEASE_GRACE_TICKS`]; rank `r` to `r` slots of
//!   [`SCORE_RANK_SLOT_TICKS`] later plus a random part of less than a slot that only
//!   breaks ties. A node that hears from a
//!   better-ranked peer for the first time since it started restarts its election timer,
//!   so the best node gets its turn even when it started last. While campaigning (for at
//!   most one retry), a node drops pre-vote requests of worse-ranked peers, so a peer
//!   whose ticks lag cannot make the second-best node win (see
//!   `ScoreBoard::refuses_pre_vote`).
//! - **Resignation** ([`resign`]): the leader transfers leadership (raft's transfer, so
//!   the term and the token rise and are announced as usual) to a caught-up follower
//!   whose score has stayed more than the margin above its own for longer than
//!   `--score-hold-ms`. Scores moving within the margin never transfer.
//!
//! # Layout
//! - `mod.rs` (this file): [`ScoreOracle`], its default and `off`, the limits and defaults
//!   (what the configuration needs, so this file imports nothing of the crate but
//!   `timeout`).
//! - `order`: the order of scores with the margin, and a node's rank.
//! - `timeout`: the election timeout of a rank.
//! - `rtt`: round-trip samples and their median; θc for `consensus-latency`.
//! - `probe`: the `storage-rtt` prober, timing `GET /healthz` of each `--announce` proxy.
//! - `resign`: when the leader hands over.
//! - `board`: the election loop's score state: sharing frames, receiving them, setting
//!   the election timeout, deciding resignations, and the leader view's `scores`.

pub(crate) mod board;
mod order;
pub(crate) mod probe;
mod resign;
mod rtt;
mod timeout;

use serde::{Deserialize, Serialize};

/// How a node scores itself (`--score-oracle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ScoreOracle {
    /// The operator's number (`--score`).
    Static,
    /// `-rtt` in milliseconds: the median round trip from this node to its `--announce`
    /// proxies (`GET /healthz`), the worst proxy counting. The leader writes through them,
    /// so this is the score that matters for clients of the leader's worker.
    StorageRtt,
    /// `-θc` in milliseconds: the ⌊n/2⌋+1-th smallest round trip to the voters (this node
    /// counted as 0), that is, the time a quorum takes to answer this node as leader.
    ConsensusLatency,
    /// The baseline of the POLE paper: the leader scores 1, and so does the voter that
    /// follows it in id order (cyclically); every other node scores 0. A failed leader is
    /// succeeded by the next id, and a sitting leader is never asked to hand over.
    Rotating,
}

impl ScoreOracle {
    /// The flag and view spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::StorageRtt => "storage-rtt",
            Self::ConsensusLatency => "consensus-latency",
            Self::Rotating => "rotating",
        }
    }

    /// Every oracle, for help texts and errors.
    pub const ALL: [ScoreOracle; 4] = [
        Self::Static,
        Self::StorageRtt,
        Self::ConsensusLatency,
        Self::Rotating,
    ];
}

impl ScoreOracle {
    /// Parses a `--score-oracle` value: an oracle's name, or [`SCORE_ORACLE_OFF`] for no
    /// oracle (raft's randomized election), which is `None`.
    ///
    /// # Errors
    /// A message naming the value and every accepted one.
    pub fn parse_setting(s: &str) -> Result<Option<Self>, String> {
        if s == SCORE_ORACLE_OFF {
            return Ok(None);
        }
        s.parse::<Self>().map(Some).map_err(|_| {
            let names: Vec<&str> = Self::ALL.iter().map(|o| o.as_str()).collect();
            format!(
                "unknown score oracle {s:?}; expected one of {}, or {SCORE_ORACLE_OFF}",
                names.join(", ")
            )
        })
    }

    /// The `--score-oracle` spelling of a setting: the oracle's name, or
    /// [`SCORE_ORACLE_OFF`].
    pub fn setting_str(setting: Option<Self>) -> &'static str {
        setting.map_or(SCORE_ORACLE_OFF, Self::as_str)
    }
}

/// The `--score-oracle` value (and config value) that turns scores off: no oracle, no
/// score frames, and raft's randomized election timeout in `[election_ticks, 2 *
/// election_ticks)`, which is what the score-based election is measured against.
pub const SCORE_ORACLE_OFF: &str = "off";

/// The default `--score-oracle`: `static`, which with every node at the default
/// `--score 0` ranks nodes by id (the lowest id campaigns first, the next one a rank slot
/// later). That takes raft's random draw out of a failover: the best-ranked follower
/// campaigns exactly `election_ticks + SCORE_LEASE_GRACE_TICKS` ticks after the last
/// heartbeat it heard and wins without a split vote, so the failover time is the
/// election timeout plus a round of votes, not a random 1x to 2x of it. Equal scores
/// never move leadership (a resignation needs a lead of more than the margin), so the
/// default never transfers on its own.
pub const SCORE_ORACLE_DEFAULT: ScoreOracle = ScoreOracle::Static;

/// Serde of the optional oracle of a configuration: `"off"` (or null) is `None`, any other
/// value an oracle's name; `None` is written as `"off"`, so a written configuration reads
/// back as the same setting even though the default is an oracle.
pub(crate) mod setting_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::ScoreOracle;

    // serde's `with` fixes this signature.
    #[allow(clippy::ref_option, clippy::trivially_copy_pass_by_ref)]
    pub(crate) fn serialize<S: Serializer>(
        setting: &Option<ScoreOracle>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(ScoreOracle::setting_str(*setting))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<ScoreOracle>, D::Error> {
        match Option::<String>::deserialize(deserializer)? {
            None => Ok(None),
            Some(name) => ScoreOracle::parse_setting(&name).map_err(serde::de::Error::custom),
        }
    }
}

impl std::fmt::Display for ScoreOracle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ScoreOracle {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|o| o.as_str()).collect();
                format!(
                    "unknown score oracle {s:?}; expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// Default `--score-margin`: below the unit step of `static` and `rotating` scores, and
/// half a millisecond of round trip for the latency oracles (above loopback jitter).
pub const SCORE_MARGIN_DEFAULT: f64 = 0.5;
/// Default `--score-hold-ms`: how long a follower must stay better than the leader by more
/// than the margin before the leader hands over. Each transfer costs a term and a short
/// write pause, so a few seconds keep a passing change from moving leadership.
pub const SCORE_HOLD_MS_DEFAULT: u64 = 3_000;
/// Upper bound of `--score-hold-ms`: an hour is certainly a mistake.
pub const SCORE_HOLD_MS_MAX: u64 = 3_600_000;
/// Scores are sent to every peer once per this many ticks (with the default 100 ms tick,
/// ten frames of a few dozen bytes per peer per second).
pub const SCORE_SHARE_TICKS: u64 = 1;
/// A peer's score is stale (counts as unknown) once nothing was heard from it for this
/// many election timeouts (`election_ticks` ticks): raft's own check-quorum gives up on
/// a silent peer on the same time scale.
pub const SCORE_STALE_ELECTIONS: u64 = 1;
/// Ticks the best-ranked node waits beyond `election_ticks`: followers with check-quorum
/// ignore vote requests until `election_ticks` ticks passed since they heard the leader,
/// and ticks of different nodes are not in phase, so campaigning one tick later finds
/// every peer that heard the same last heartbeat ready to answer (see `timeout`).
pub const SCORE_LEASE_GRACE_TICKS: u64 = 1;
/// The width of one rank's slot of election timeout, in ticks: the best node campaigns
/// at `election_ticks`, the next `SCORE_RANK_SLOT_TICKS` later, and so on. Two ticks (200
/// ms by default) cover a pre-vote and a vote round trip with their fsyncs on a wide-area
/// link, so the best node has won before the next one starts.
pub const SCORE_RANK_SLOT_TICKS: u64 = 2;

/// raft's `max_election_tick` with scores on, for `voters` voters whose minimum is
/// `election_ticks`: room for a slot of [`SCORE_RANK_SLOT_TICKS`] per rank.
pub(crate) fn max_election_tick(election_ticks: usize, voters: usize) -> usize {
    timeout::max_election_tick(
        election_ticks,
        usize::try_from(SCORE_RANK_SLOT_TICKS).unwrap_or(1),
        voters,
    )
}
