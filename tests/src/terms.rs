//! Term and fence checks over a whole fault run: no term is held by two established
//! leaders, no node's term goes back (across `kill -9`s too), and the proxy's fence never
//! goes down.
//!
//! Two sources, checked separately: [`Monitor`] polls every node's leadership and the
//! proxy's fence in the background ([`view_violations`]), and [`term_violations`] reads
//! the nodes' JSON logs, which record every established leadership however short, by
//! their structured `event` field. Both report a violation when they saw nothing at all,
//! so that a run whose polls never got through or whose logs hold no events fails
//! instead of passing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_cluster::Cluster;
use palisade_protocol::process::{EVENT_FIELD, events};
use palisade_protocol::{DEFAULT_SCOPE, LeaderView};

/// One node's answer, as the [`Monitor`] saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When.
    pub at: Instant,
    /// What the node said.
    pub leadership: LeaderView,
}

/// Longest one poll of the [`Monitor`] waits for an answer: a paused node must not hold
/// up the polls of the others for long.
const MONITOR_QUERY_TIMEOUT: Duration = Duration::from_millis(500);

/// Polls every node's leadership and the proxy's fence in the background, to check terms
/// and fences over a whole run.
///
/// It keeps only the answers that changed something the checks read: a node's answer is
/// stored when its term or token differs from that node's previous answer, a fence
/// reading when it differs from the previous one. Dropping repeats changes no verdict of
/// [`view_violations`] (which compares each node's answers, and each fence reading, with
/// the one before) and keeps a soak of hours in bounded memory; every answer is still
/// counted.
pub struct Monitor {
    seen: Arc<Mutex<Vec<Seen>>>,
    fences: Arc<Mutex<Vec<u64>>>,
    answers: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Monitor {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Monitor {
    /// Starts polling `cluster`'s nodes (through their API clients, whose addresses
    /// survive restarts) and its proxy's fence every `period`.
    pub fn start(cluster: &Cluster, period: Duration) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let fences = Arc::new(Mutex::new(Vec::new()));
        let answers = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for node in &cluster.nodes {
            let api = node.api().clone().timeout(MONITOR_QUERY_TIMEOUT);
            let seen = Arc::clone(&seen);
            let answers = Arc::clone(&answers);
            tasks.push(tokio::spawn(async move {
                let mut last = None;
                loop {
                    if let Ok(leadership) = api.leader().await {
                        answers.fetch_add(1, Ordering::Relaxed);
                        let now = Some((leadership.term, leadership.token));
                        if now != last {
                            last = now;
                            seen.lock().unwrap().push(Seen {
                                at: Instant::now(),
                                leadership,
                            });
                        }
                    }
                    tokio::time::sleep(period).await;
                }
            }));
        }
        let admin = cluster
            .proxy
            .admin_client()
            .clone()
            .timeout(MONITOR_QUERY_TIMEOUT);
        let fences_task = Arc::clone(&fences);
        tasks.push(tokio::spawn(async move {
            loop {
                if let Ok(fence) = admin.fence(DEFAULT_SCOPE).await {
                    let mut fences = fences_task.lock().unwrap();
                    if fences.last() != Some(&fence.token) {
                        fences.push(fence.token);
                    }
                }
                tokio::time::sleep(period).await;
            }
        }));
        Self {
            seen,
            fences,
            answers,
            tasks,
        }
    }

    /// Every answer so far that changed its node's term or token, in the order each node
    /// gave them.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The established leader as last seen: of each node's latest answer, the one with a
    /// token and the highest term. It may be stale (a node paused or killed since keeps
    /// its last answer); it never waits, unlike asking the nodes.
    pub fn leader(&self) -> Option<LeaderView> {
        let seen = self.seen.lock().unwrap();
        let mut latest: BTreeMap<u64, &LeaderView> = BTreeMap::new();
        for s in seen.iter() {
            latest.insert(s.leadership.node_id, &s.leadership);
        }
        latest
            .into_values()
            .filter(|l| l.token.is_some())
            .max_by_key(|l| l.term)
            .cloned()
    }

    /// Violations in what was seen: a term held by two established leaders, a node whose
    /// term went back, or the proxy's fence going down; and, so that a run in which the
    /// polls never got through cannot pass, no answer from the nodes or no fence reading
    /// at all. With the count of answers (every answer, repeats included).
    pub fn violations(&self) -> (usize, Vec<String>) {
        let seen: Vec<LeaderView> = self.seen().into_iter().map(|s| s.leadership).collect();
        let fences = self.fences.lock().unwrap().clone();
        let mut out = view_violations(&seen, &fences);
        if seen.is_empty() {
            out.push("the monitor got no leadership answer from any node".to_owned());
        }
        if fences.is_empty() {
            out.push("the monitor got no fence reading from the proxy".to_owned());
        }
        (self.answers.load(Ordering::Relaxed), out)
    }
}

/// Violations in leadership answers (each node's in the order it gave them) and in the
/// proxy's fence readings (in order): a term with two established leaders, a node whose
/// term went back, the fence going down.
pub fn view_violations(seen: &[LeaderView], fences: &[u64]) -> Vec<String> {
    let mut out = Vec::new();
    let mut leaders: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    for l in seen {
        if let Some(token) = l.token {
            leaders.entry(token).or_default().insert(l.node_id);
        }
        if let Some(&before) = last.get(&l.node_id)
            && l.term < before
        {
            out.push(format!(
                "node {} answered term {} after term {before}",
                l.node_id, l.term
            ));
        }
        last.insert(l.node_id, l.term);
    }
    for (term, nodes) in leaders {
        if nodes.len() > 1 {
            out.push(format!(
                "term {term} had established leaders {nodes:?} (seen over the API)"
            ));
        }
    }
    for pair in fences.windows(2) {
        if pair[1] < pair[0] {
            out.push(format!(
                "the proxy's fence went down from {} to {}",
                pair[0], pair[1]
            ));
        }
    }
    out
}

/// The node's log events whose `term` the checks read. Every one of them carries a term
/// that is already durable when it is logged (its start loads the stored term; the others
/// are published only after the `Ready` carrying their term is persisted), so a node that
/// logged one of them can never come back from a `kill -9` below it. Lines without an
/// `event` field (raft's own lines, a token withdrawn before its term is persisted) may
/// show a term a `kill -9` loses, rightly, and are not read.
pub const TERM_EVENTS: [&str; 4] = [
    events::NODE_STARTED,
    events::LEADERSHIP_CHANGED,
    events::LEADER_ESTABLISHED,
    events::TOKEN_ANNOUNCED,
];

/// Term violations in the nodes' JSON logs (see [`log_violations`]).
pub fn term_violations(cluster: &Cluster) -> (usize, Vec<String>) {
    let logs: BTreeMap<u64, Vec<String>> =
        cluster.nodes.iter().map(|n| (n.id(), n.logs())).collect();
    log_violations(&logs)
}

/// Term violations in nodes' JSON logs (by node id, one log per start, oldest first),
/// with the number of established leaderships found. Events are recognised by their
/// structured `event` field (names from [`events`]), never by message text:
/// - a term in which two nodes became established leaders ([`events::LEADER_ESTABLISHED`]);
/// - a node that started (after a `kill -9`) at a lower term than one it had logged before
///   (every term in [`TERM_EVENTS`] is already durable when logged);
/// - a start that logged no [`events::NODE_STARTED`]: the checks would otherwise pass on
///   logs that hold no events at all (a changed log format, an empty file).
pub fn log_violations(logs: &BTreeMap<u64, Vec<String>>) -> (usize, Vec<String>) {
    let mut out = Vec::new();
    let mut leaders: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    let mut established = 0;
    if logs.is_empty() {
        out.push("no node logs to check".to_owned());
    }
    for (&id, starts) in logs {
        let mut highest = 0_u64;
        for (start, log) in starts.iter().enumerate() {
            let mut started = false;
            for (event, term) in log.lines().filter_map(term_event) {
                if event == events::NODE_STARTED {
                    started = true;
                    if term < highest {
                        out.push(format!(
                            "node {id} restarted (start {start}) at term {term} after logging term {highest}"
                        ));
                    }
                }
                if event == events::LEADER_ESTABLISHED {
                    established += 1;
                    leaders.entry(term).or_default().insert(id);
                }
                highest = highest.max(term);
            }
            if !started {
                out.push(format!(
                    "node {id} (start {start}) logged no `{EVENT_FIELD}={}` line: its log cannot be checked",
                    events::NODE_STARTED
                ));
            }
        }
    }
    for (term, nodes) in leaders {
        if nodes.len() > 1 {
            out.push(format!(
                "term {term} had established leaders {nodes:?} (from the logs)"
            ));
        }
    }
    (established, out)
}

/// The event name and term of a JSON log line that is one of [`TERM_EVENTS`].
fn term_event(line: &str) -> Option<(&'static str, u64)> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = &v["fields"];
    let name = fields[EVENT_FIELD].as_str()?;
    let event = TERM_EVENTS.into_iter().find(|&e| e == name)?;
    Some((event, fields["term"].as_u64()?))
}

#[cfg(test)]
mod tests {
    use palisade_protocol::Role;

    use super::*;

    fn view(node_id: u64, term: u64, token: Option<u64>) -> LeaderView {
        LeaderView {
            node_id,
            scope: palisade_protocol::Scope::default(),
            term,
            leader_id: None,
            role: if token.is_some() {
                Role::Leader
            } else {
                Role::Follower
            },
            token,
            announced: token.is_some(),
            proof: None,
            lease_ms: None,
            released: None,
            scores: None,
            score_oracle: None,
        }
    }

    /// Goal: each view check fires on a made-up violation and not on a clean run.
    /// Method: hand-made leadership views and fence readings.
    #[test]
    fn view_checks_catch_reused_terms_terms_going_back_and_fences_going_down() {
        let clean = [view(1, 2, Some(2)), view(2, 2, None), view(2, 3, Some(3))];
        assert!(view_violations(&clean, &[1, 2, 2, 3]).is_empty());
        let twice = [view(1, 2, Some(2)), view(2, 2, Some(2))];
        assert!(view_violations(&twice, &[])[0].contains("term 2 had established leaders"));
        let back = [view(1, 5, None), view(1, 4, None)];
        assert!(view_violations(&back, &[])[0].contains("answered term 4 after term 5"));
        assert!(view_violations(&[], &[3, 2])[0].contains("fence went down from 3 to 2"));
    }

    fn line(event: &str, term: u64) -> String {
        serde_json::json!({"level":"INFO","fields":{"message":"prose the checks ignore",EVENT_FIELD:event,"term":term}}).to_string()
    }

    /// Goal: each log check fires on a made-up violation and not on a clean run; lines
    /// without an `event` field are ignored whatever their message says. Method: hand-made
    /// JSON lines in the format of the nodes' logs.
    #[test]
    fn log_checks_catch_reused_terms_and_restarts_at_a_lower_term() {
        let started = |term| line(events::NODE_STARTED, term);
        let established = |term| line(events::LEADER_ESTABLISHED, term);
        let withdrawn = serde_json::json!({"fields":{"message":"token withdrawn","term":9}});
        let clean = BTreeMap::from([
            (
                1,
                vec![
                    [started(0), established(1)].join("\n"),
                    [started(1), withdrawn.to_string()].join("\n"),
                ],
            ),
            (2, vec![[started(0), established(2)].join("\n")]),
        ]);
        assert_eq!(log_violations(&clean), (2, Vec::new()));

        let reused = BTreeMap::from([
            (1, vec![[started(0), established(3)].join("\n")]),
            (2, vec![[started(0), established(3)].join("\n")]),
        ]);
        assert!(log_violations(&reused).1[0].contains("term 3 had established leaders {1, 2}"));

        let lost = BTreeMap::from([(
            1,
            vec![
                [started(0), line(events::LEADERSHIP_CHANGED, 4)].join("\n"),
                started(3),
            ],
        )]);
        assert!(log_violations(&lost).1[0].contains("restarted (start 1) at term 3"));
    }

    /// Goal: logs without events fail the check instead of passing it: prose messages
    /// alone (the old format), an empty log, or no logs at all. Method: check such logs.
    #[test]
    fn log_checks_fail_when_no_events_were_logged() {
        let prose = serde_json::json!({"fields":{"message":"node started","term":1}}).to_string();
        let (count, violations) = log_violations(&BTreeMap::from([(1, vec![prose])]));
        assert_eq!(count, 0);
        assert!(
            violations[0].contains("logged no `event=node-started` line"),
            "{violations:?}"
        );
        let (_, violations) = log_violations(&BTreeMap::from([(1, vec![String::new()])]));
        assert_eq!(violations.len(), 1, "{violations:?}");
        let (_, violations) = log_violations(&BTreeMap::new());
        assert_eq!(violations, vec!["no node logs to check".to_owned()]);
    }
}
