//! What a node remembers for people, and writes to its audit log (`audit_log`): the
//! announce state per proxy, transfers asked of its API, and membership changes.
//!
//! The hooks never block: the announce board is a short mutex never held across an
//! await, and an audit record goes on the writer's bounded queue or is counted as
//! dropped ([`palisade_server::audit`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use palisade_protocol::audit::event;
use palisade_protocol::{AuditRecord, MemberList};
use palisade_server::audit::{AuditConfig, AuditLog};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::leadership::Leadership;

/// Longest announce error kept per proxy, in bytes: an error message can quote a proxy's
/// answer, which the node does not control.
pub const ANNOUNCE_DETAIL_BYTES_MAX: usize = 512;

/// Longest request path kept in a `forbidden` record, in bytes: the client chose it.
pub const FORBIDDEN_PATH_BYTES_MAX: usize = 512;
/// Longest detail kept in a `forbidden` record, in bytes: it quotes the certificate's
/// names (at most 64, of at most 253 bytes each), which the node does not choose.
pub const FORBIDDEN_DETAIL_BYTES_MAX: usize = 1024;

/// A refused API request, as a `forbidden` audit record shows it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ForbiddenRequest<'a> {
    /// The client's address.
    pub peer: Option<std::net::SocketAddr>,
    /// The request's method.
    pub method: &'a str,
    /// The request's path.
    pub path: &'a str,
    /// The credential's role (`none` without one).
    pub role: &'a str,
    /// The 403 problem's detail.
    pub detail: &'a str,
}

/// How the last announcement to one proxy went.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AnnounceState {
    /// The token (term) announced; `None` before the first.
    pub token: Option<u64>,
    /// `accepted`, `refused`, `retrying`, or `not yet` before the first.
    pub outcome: &'static str,
    /// When the outcome was seen.
    pub at: Option<SystemTime>,
    /// The error of a refusal or a failed attempt.
    pub detail: Option<String>,
    /// Attempts for `token` so far.
    pub attempts: u64,
}

/// A node's observer: the announce board and the audit log.
pub(crate) struct Observer {
    node_id: u64,
    started: SystemTime,
    audit: Option<AuditLog>,
    /// Proxy URL to its announce state; the keys are the configured `--announce` URLs.
    announce: Mutex<BTreeMap<String, AnnounceState>>,
}

/// A proxy's state before its first announcement.
fn not_yet() -> AnnounceState {
    AnnounceState {
        token: None,
        outcome: "not yet",
        at: None,
        detail: None,
        attempts: 0,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each critical section is an insert or a copy that cannot panic half-way.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Observer {
    /// An observer for `node_id` with the configured proxies, writing to `audit`.
    pub(crate) fn new(node_id: u64, proxies: &[String], audit: Option<AuditLog>) -> Self {
        let announce = proxies.iter().map(|url| (url.clone(), not_yet())).collect();
        Self {
            node_id,
            started: SystemTime::now(),
            audit,
            announce: Mutex::new(announce),
        }
    }

    /// One announcement attempt's outcome at `url`: `accepted`, `refused` or `retrying`.
    pub(crate) fn announced(
        &self,
        url: &str,
        scope: &str,
        token: u64,
        outcome: &'static str,
        detail: Option<String>,
    ) {
        let now = SystemTime::now();
        let detail = detail.map(|d| {
            palisade_protocol::audit::cut_to_bytes(&d, ANNOUNCE_DETAIL_BYTES_MAX).to_owned()
        });
        {
            let mut board = lock(&self.announce);
            // A proxy not on the board yet (the announce list changed) is added, up to
            // the announce list's own limit, so the board cannot grow past it.
            if !board.contains_key(url) && board.len() < crate::config::ANNOUNCE_URLS_MAX {
                board.insert(url.to_owned(), not_yet());
            }
            if let Some(state) = board.get_mut(url) {
                let attempts = if state.token == Some(token) {
                    state.attempts + 1
                } else {
                    1
                };
                *state = AnnounceState {
                    token: Some(token),
                    outcome,
                    at: Some(now),
                    detail: detail.clone(),
                    attempts,
                };
            }
        }
        let mut record = self.record(event::ANNOUNCE, now, token);
        record.scope = Some(scope.to_owned());
        record.presented = Some(token);
        record.proxy = Some(url.to_owned());
        record.outcome = Some(outcome.to_owned());
        record.reason = detail;
        self.audit(record);
    }

    /// A transfer asked of this node's API (`to`: the target, `None` for a resign),
    /// with its outcome.
    pub(crate) fn transfer(
        &self,
        term: u64,
        to: Option<u64>,
        outcome: &str,
        reason: Option<String>,
    ) {
        let mut record = self.record(event::TRANSFER, SystemTime::now(), term);
        record.current = to;
        record.outcome = Some(outcome.to_owned());
        record.reason = reason;
        self.audit(record);
    }

    /// The membership this node applied changed; `what` says how.
    pub(crate) fn membership(&self, term: u64, what: String) {
        let mut record = self.record(event::MEMBERSHIP, SystemTime::now(), term);
        record.reason = Some(what);
        self.audit(record);
    }

    /// A request of this node's API refused for its credential's role (403
    /// `forbidden-role`): `role` is the credential's (`none` without one), `detail` the
    /// problem's detail, which names the role needed and the credential.
    pub(crate) fn forbidden(&self, term: u64, request: ForbiddenRequest<'_>) {
        let mut record = self.record(event::FORBIDDEN, SystemTime::now(), term);
        record.peer = request.peer.map(|p| p.ip().to_string());
        record.method = Some(request.method.to_owned());
        record.path = Some(
            palisade_protocol::audit::cut_to_bytes(request.path, FORBIDDEN_PATH_BYTES_MAX)
                .to_owned(),
        );
        record.outcome = Some(request.role.to_owned());
        record.reason = Some(
            palisade_protocol::audit::cut_to_bytes(request.detail, FORBIDDEN_DETAIL_BYTES_MAX)
                .to_owned(),
        );
        self.audit(record);
    }

    fn record(&self, event: &str, at: SystemTime, term: u64) -> AuditRecord {
        let mut record = AuditRecord::new(event, at);
        record.node_id = Some(self.node_id);
        record.term = Some(term);
        record
    }

    fn audit(&self, record: AuditRecord) {
        if let Some(log) = &self.audit {
            log.record(record);
        }
    }

    /// When the node started.
    pub(crate) fn started(&self) -> SystemTime {
        self.started
    }

    /// The announce board, by proxy URL.
    pub(crate) fn announce_states(&self) -> Vec<(String, AnnounceState)> {
        lock(&self.announce)
            .iter()
            .map(|(url, state)| (url.clone(), state.clone()))
            .collect()
    }

    /// The audit log, when one is configured.
    pub(crate) fn audit_log(&self) -> Option<&AuditLog> {
        self.audit.as_ref()
    }
}

/// Opens the configured audit log; a file that cannot be opened is a configuration error
/// naming `audit_log`, so the node does not run without the trail it was asked for.
pub(crate) fn open(config: &crate::NodeConfig) -> Result<Option<AuditLog>, crate::ConfigError> {
    let Some(path) = &config.audit_log else {
        return Ok(None);
    };
    AuditLog::open(&AuditConfig {
        path: path.clone(),
        bytes_max: config.audit_log_bytes_max,
        keep: config.audit_log_keep,
    })
    .map(Some)
    .map_err(|err| {
        crate::ConfigError::new(
            "audit_log",
            format!("cannot open {}: {err}", path.display()),
        )
    })
}

/// Writes a `membership` record whenever the members this node applied change, until
/// `shutdown` or until the loop stops publishing. The members it compares against are
/// read now, when it is called, not when the future first runs.
pub(crate) fn watch_members(
    observer: Arc<Observer>,
    mut members: watch::Receiver<MemberList>,
    leadership: watch::Receiver<Leadership>,
    shutdown: CancellationToken,
) -> impl std::future::Future<Output = ()> {
    let as_map = |list: &MemberList| -> BTreeMap<u64, String> {
        list.members
            .iter()
            .map(|m| (m.id, m.peer.clone()))
            .collect()
    };
    let mut known = as_map(&members.borrow_and_update());
    async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = members.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
            let now = as_map(&members.borrow_and_update());
            if let Some(what) = membership_change(&known, &now) {
                let term = leadership.borrow().term;
                observer.membership(term, what);
            }
            known = now;
        }
    }
}

/// How the member set changed from `old` to `new` (ids with their peers), in words; `None`
/// when it did not.
pub(crate) fn membership_change(
    old: &BTreeMap<u64, String>,
    new: &BTreeMap<u64, String>,
) -> Option<String> {
    let added: Vec<String> = new
        .iter()
        .filter(|(id, _)| !old.contains_key(id))
        .map(|(id, peer)| format!("{id} ({peer})"))
        .collect();
    let removed: Vec<String> = old
        .keys()
        .filter(|id| !new.contains_key(id))
        .map(ToString::to_string)
        .collect();
    let mut parts = Vec::new();
    if !added.is_empty() {
        parts.push(format!("added {}", added.join(", ")));
    }
    if !removed.is_empty() {
        parts.push(format!("removed {}", removed.join(", ")));
    }
    if parts.is_empty() {
        return None;
    }
    let members: Vec<String> = new.keys().map(ToString::to_string).collect();
    Some(format!(
        "{}; members now {}",
        parts.join("; "),
        members.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the board counts attempts per token, starts over for a new token, and takes
    /// a proxy it did not list (the announce list changed). Method: record a few
    /// outcomes.
    #[test]
    fn board_tracks_attempts_per_token_and_takes_new_proxies() {
        let o = Observer::new(1, &["http://p1".to_owned()], None);
        o.announced(
            "http://p1",
            "default",
            3,
            "retrying",
            Some("connection refused".into()),
        );
        o.announced("http://p1", "default", 3, "accepted", None);
        let states = o.announce_states();
        assert_eq!(states.len(), 1);
        assert_eq!(
            (states[0].1.token, states[0].1.outcome, states[0].1.attempts),
            (Some(3), "accepted", 2)
        );
        o.announced("http://p1", "default", 4, "refused", Some("x".repeat(2000)));
        let s = &o.announce_states()[0].1;
        assert_eq!(
            (s.attempts, s.detail.as_ref().map(String::len)),
            (1, Some(ANNOUNCE_DETAIL_BYTES_MAX))
        );
        o.announced("http://p2", "default", 4, "accepted", None);
        assert_eq!(o.announce_states().len(), 2);
        let states = o.announce_states();
        let urls: Vec<&str> = states.iter().map(|(u, _)| u.as_str()).collect();
        assert_eq!(urls, ["http://p1", "http://p2"]);
    }

    /// Goal: a membership change is described by what was added and removed.
    /// Method: diff two member maps.
    #[test]
    fn membership_change_names_added_and_removed_ids() {
        let old: BTreeMap<u64, String> = [(1, "a:1".into()), (2, "a:2".into())].into();
        let new: BTreeMap<u64, String> = [(1, "a:1".into()), (3, "a:3".into())].into();
        assert_eq!(
            membership_change(&old, &new).unwrap(),
            "added 3 (a:3); removed 2; members now 1, 3"
        );
        assert_eq!(membership_change(&old, &old), None);
    }

    /// Goal: a change of the applied members is written to the audit log as a
    /// `membership` record with the node, its term and what changed, against the members
    /// read when the watcher was made. Method: make `watch_members` on a watch channel,
    /// publish a list with a member added, read the file.
    #[tokio::test]
    async fn member_changes_are_written_to_the_audit_log() {
        use palisade_protocol::Member;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.audit");
        let log = AuditLog::open(&AuditConfig {
            path: path.clone(),
            bytes_max: 1 << 20,
            keep: 1,
        })
        .unwrap();
        let observer = Arc::new(Observer::new(7, &[], Some(log)));
        let member = |id: u64| Member {
            id,
            peer: format!("127.0.0.1:{}", 7000 + id),
            voter: true,
            role: None,
        };
        let list = |ids: &[u64]| MemberList {
            members: ids.iter().map(|&id| member(id)).collect(),
            ..MemberList::default()
        };
        let (tx, rx) = watch::channel(list(&[7, 8]));
        let (_ltx, lrx) = watch::channel(Leadership {
            term: 4,
            ..Leadership::default()
        });
        let shutdown = CancellationToken::new();
        let watcher = watch_members(observer, rx, lrx, shutdown.clone());
        let task = tokio::spawn(watcher);
        tx.send(list(&[7, 8, 9])).unwrap();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let records = loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let records: Vec<AuditRecord> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            if !records.is_empty() {
                break records;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no membership record"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        };
        shutdown.cancel();
        task.await.unwrap();
        assert_eq!(records.len(), 1, "{records:?}");
        let r = &records[0];
        assert_eq!(
            (r.event.as_str(), r.node_id, r.term),
            ("membership", Some(7), Some(4))
        );
        assert_eq!(
            r.reason.as_deref(),
            Some("added 9 (127.0.0.1:7009); members now 7, 8, 9")
        );
    }
}
