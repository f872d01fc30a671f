//! Where a failover's time goes, from the nodes' own logs: `palisade bench failover`
//! reads the lines the nodes write at each step of taking over (`role changed` to a
//! candidate, `became leader`, `established leader`, `term announced to every proxy`)
//! and times each from the `SIGSTOP`, by the wall-clock timestamps the nodes' log lines
//! carry. The nodes and the bench run on one machine, so they read the same clock.
//!
//! Polling the nodes cannot see these steps apart: the vote round and establishment take
//! a few milliseconds on loopback, less than one poll interval.

use std::time::SystemTime;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The moments of one takeover, in milliseconds after the pause (`None`: not logged).
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize)]
#[expect(
    clippy::struct_field_names,
    reason = "the JSON keys name their unit, as the bench's other moments do"
)]
pub(super) struct Steps {
    /// The first node other than the paused one starts to campaign (pre-vote or vote):
    /// the end of detection.
    pub campaign_ms: Option<f64>,
    /// The new leader's raft says it leads `term`: the end of the election.
    pub leader_ms: Option<f64>,
    /// It applied an entry of its term, so it holds the token: the end of establishment.
    pub established_ms: Option<f64>,
    /// Every proxy acknowledged the new term: the end of the announce.
    pub announced_ms: Option<f64>,
}

/// The steps of the takeover to `term` after `paused_at`, from the log texts of the nodes
/// other than the paused one (each node's whole stderr so far).
pub(super) fn steps(logs: &[String], paused_at: SystemTime, term: u64) -> Steps {
    let mut steps = Steps::default();
    let after = |line: &str| -> Option<f64> {
        let at = timestamp(line)?;
        let ms = at.duration_since(paused_at).ok()?.as_secs_f64() * 1000.0;
        Some(ms)
    };
    let earliest = |slot: &mut Option<f64>, ms: f64| {
        if slot.is_none_or(|t| ms < t) {
            *slot = Some(ms);
        }
    };
    let term_field = format!("term={term}");
    for log in logs {
        for raw in log.lines() {
            let line = palisade_cluster::without_ansi(raw);
            let Some(ms) = after(&line) else { continue };
            let has_term = line.split_whitespace().any(|w| w == term_field);
            if line.contains("role changed") && line.contains("role=candidate") {
                // A campaign can start in the old term (pre-vote keeps it) or in the
                // new one; either ends detection, if it is after the pause.
                earliest(&mut steps.campaign_ms, ms);
            } else if !has_term {
                // A step of another term.
            } else if line.contains(" became leader ") || line.ends_with(" became leader") {
                earliest(&mut steps.leader_ms, ms);
            } else if line.contains("established leader") {
                earliest(&mut steps.established_ms, ms);
            } else if line.contains("term announced to every proxy") {
                earliest(&mut steps.announced_ms, ms);
            }
        }
    }
    steps
}

/// The line's leading RFC 3339 timestamp, as the node's text log writes it.
fn timestamp(line: &str) -> Option<SystemTime> {
    let first = line.split_whitespace().next()?;
    OffsetDateTime::parse(first, &Rfc3339)
        .ok()
        .map(SystemTime::from)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(text: &str) -> SystemTime {
        timestamp(text).expect("a timestamp")
    }

    #[test]
    fn the_steps_come_from_coloured_and_plain_lines_after_the_pause() {
        let paused = at("2026-11-27T09:01:50.625000Z");
        // One node's log, as written to a file (colour codes included), with a campaign of
        // the first election before the pause, which must not count.
        let node2 = "\u{1b}[2m2026-11-27T09:01:49.608989Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m x: role changed \u{1b}[3mevent\u{1b}[0m\u{1b}[2m=\u{1b}[0m\"leadership-changed\" term=0 role=candidate previous=follower
\u{1b}[2m2026-11-27T09:01:51.125000Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m x: role changed event=\"leadership-changed\" \u{1b}[3mterm\u{1b}[0m\u{1b}[2m=\u{1b}[0m1 \u{1b}[3mrole\u{1b}[0m\u{1b}[2m=\u{1b}[0mcandidate previous=follower
2026-11-27T09:01:51.129000Z  INFO slog: became leader at term 2 slog.target=\"raft::raft\"
2026-11-27T09:01:51.129100Z  INFO x: became leader event=\"leadership-changed\" term=2
2026-11-27T09:01:51.129800Z  INFO x: established leader: token available event=\"leader-established\" term=2 token=2
2026-11-27T09:01:51.131100Z  INFO x: term announced to every proxy event=\"token-announced\" term=2 token=2
2026-11-27T09:01:52.000000Z  INFO x: became leader event=\"leadership-changed\" term=3
";
        // Another node campaigned later, and never won.
        let node3 = "2026-11-27T09:01:51.200000Z  INFO x: role changed term=1 role=candidate previous=follower\n";
        let s = steps(&[node2.to_owned(), node3.to_owned()], paused, 2);
        let near = |v: Option<f64>, want: f64| v.is_some_and(|v| (v - want).abs() < 0.01);
        assert!(near(s.campaign_ms, 500.0), "{s:?}");
        assert!(near(s.leader_ms, 504.1), "{s:?}");
        assert!(near(s.established_ms, 504.8), "{s:?}");
        assert!(near(s.announced_ms, 506.1), "{s:?}");
    }

    #[test]
    fn steps_of_another_term_or_before_the_pause_are_not_taken() {
        let paused = at("2026-11-27T09:00:00Z") + Duration::from_secs(10);
        let log = "2026-11-27T09:00:05Z  INFO x: became leader term=2\n\
                   2026-11-27T09:00:11Z  INFO x: became leader term=3\n\
                   not a log line at all\n";
        assert_eq!(steps(&[log.to_owned()], paused, 2), Steps::default());
        let s = steps(&[log.to_owned()], paused, 3);
        assert_eq!(s.leader_ms, Some(1000.0));
        assert_eq!(s.campaign_ms, None);
    }
}
