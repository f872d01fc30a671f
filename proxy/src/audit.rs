//! What the proxy remembers for people: the recent rejections, when each fence was last
//! raised, barrier waits and the upstream's health, shown on the status page, and the
//! same events written to the audit log (`audit_log`) when one is configured.
//!
//! Every hook here is called on the data path or the admin path and returns at once: the
//! counters are atomics, the rings and the raise times sit behind short mutexes never
//! held across an await, and an audit record goes on the writer's bounded queue or is
//! counted as dropped ([`palisade_server::audit`]).
//!
//! A refusal any client can cause without holding a token (a missing or invalid proof)
//! is noise: it is rate-limited before its record is built (past the limit it is only
//! counted, and the audit log's `suppressed` records say how many), it goes to the audit
//! log's noise file, and it has its own ring on the status page. So a flood of unproven
//! requests pushes a stale-token rejection neither out of the audit log nor off the
//! status page.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderValue, Method};
use palisade_protocol::AuditRecord;
use palisade_protocol::audit::{event, rfc3339};
use palisade_protocol::status::UpstreamStatus;
use palisade_server::audit::{AuditLog, NoiseLimiter};

use crate::error::ProxyError;

/// Rejections the status page keeps of each class, newest first: this many stale-token
/// rejections, and apart from them this many of the missing or invalid proofs written in
/// full (so that a flood of the second never pushes the first out). Enough to see a
/// pattern (one stale writer, or many), few enough that the page stays one screen of
/// table; the audit log keeps all of them.
pub const REJECTIONS_KEPT: usize = 50;
/// Scopes whose last raise time is remembered. The fence register holds at most
/// `limits.scopes_max` scopes plus the reserved ones; past this many the page shows no
/// time for the others rather than growing without bound.
pub const RAISE_TIMES_SCOPES_MAX: usize = 16_384;
/// Longest request path kept in a rejection record, in bytes: a path is the client's to
/// choose, so it is cut (at a character boundary) rather than stored whole.
pub const AUDIT_PATH_BYTES_MAX: usize = 512;

/// The proxy's recent activity, and its audit log.
pub(crate) struct Activity {
    started: SystemTime,
    audit: Option<AuditLog>,
    /// The audit log's noise limit, or one of its own without a log: the unproven ring is
    /// fed at the rate the log writes.
    noise: Arc<NoiseLimiter>,
    /// Stale-token rejections.
    rejections: Mutex<VecDeque<AuditRecord>>,
    /// Missing and invalid proofs admitted by `noise`.
    unproven: Mutex<VecDeque<AuditRecord>>,
    rejections_total: AtomicU64,
    /// Scope to (when, the fence before) of its last raise by this process.
    raises: Mutex<HashMap<String, (SystemTime, u64)>>,
    barrier_waits: AtomicU64,
    answered: AtomicU64,
    /// Milliseconds since the epoch of the last answer (0: none yet).
    last_answer_ms: AtomicU64,
    failed: AtomicU64,
    last_failure: Mutex<Option<(SystemTime, String)>>,
}

impl Default for Activity {
    fn default() -> Self {
        Self::new(None)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each critical section below is a push or an insert that cannot panic half-way.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Activity {
    pub(crate) fn new(audit: Option<AuditLog>) -> Self {
        let noise = audit.as_ref().map_or_else(
            || Arc::new(NoiseLimiter::default()),
            |log| Arc::clone(log.noise()),
        );
        Self {
            started: SystemTime::now(),
            audit,
            noise,
            rejections: Mutex::new(VecDeque::with_capacity(REJECTIONS_KEPT)),
            unproven: Mutex::new(VecDeque::with_capacity(REJECTIONS_KEPT)),
            rejections_total: AtomicU64::new(0),
            raises: Mutex::new(HashMap::new()),
            barrier_waits: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            last_answer_ms: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            last_failure: Mutex::new(None),
        }
    }

    /// One data-path request's result: an answer from the upstream (or the embedded
    /// store), a failed forward, or a refusal before forwarding.
    pub(crate) fn observe<B>(
        &self,
        result: &Result<http::Response<B>, ProxyError>,
        forwarding: bool,
        method: &Method,
        uri: &http::Uri,
        peer: &crate::server::Peer,
    ) {
        match result {
            Ok(_) => self.answered(),
            Err(err) if forwarding => match err.cause() {
                crate::error::Cause::Client => self.answered(),
                crate::error::Cause::Upstream | crate::error::Cause::Internal => {
                    self.upstream_failed(err);
                }
            },
            Err(err) => self.refused(err, method, uri.path(), peer.forwarded_for.as_ref()),
        }
    }

    /// A refusal on the data path: stale tokens and missing or invalid proofs are
    /// recorded (the refusals that concern fencing); other errors are the client's
    /// malformed requests and only counted in the metrics. A missing or invalid proof is
    /// noise (see the module docs): past its rate it is counted and nothing is built.
    pub(crate) fn refused(
        &self,
        err: &ProxyError,
        method: &Method,
        path: &str,
        peer: Option<&HeaderValue>,
    ) {
        let (scope, presented, current, noise) = match err {
            ProxyError::Stale {
                scope,
                presented,
                current,
            } => (scope, *presented, Some(*current), false),
            ProxyError::MissingProof { scope, presented }
            | ProxyError::InvalidProof {
                scope, presented, ..
            } => (scope, *presented, None, true),
            _ => return,
        };
        self.rejections_total.fetch_add(1, Ordering::Relaxed);
        if noise && !self.noise.admit(err.reason()) {
            return;
        }
        let mut record = AuditRecord::new(event::REJECTION, SystemTime::now());
        record.scope = Some(scope.clone());
        record.presented = Some(presented);
        record.current = current;
        record.method = Some(method.as_str().to_owned());
        record.path =
            Some(palisade_protocol::audit::cut_to_bytes(path, AUDIT_PATH_BYTES_MAX).to_owned());
        record.peer = peer.and_then(|p| p.to_str().ok()).map(str::to_owned);
        record.reason = Some(err.reason().to_owned());
        {
            let mut ring = lock(if noise {
                &self.unproven
            } else {
                &self.rejections
            });
            if ring.len() == REJECTIONS_KEPT {
                ring.pop_back();
            }
            ring.push_front(record.clone());
        }
        match (&self.audit, noise) {
            (Some(log), true) => log.record_noise(record),
            (Some(log), false) => log.record(record),
            (None, _) => {}
        }
    }

    /// A fence raised (fsynced) by a write, an advance or a fleet renewal.
    pub(crate) fn raised(&self, scope: &str, token: u64, previous: u64) {
        let now = SystemTime::now();
        {
            let mut raises = lock(&self.raises);
            if raises.len() < RAISE_TIMES_SCOPES_MAX || raises.contains_key(scope) {
                raises.insert(scope.to_owned(), (now, previous));
            }
        }
        let mut record = AuditRecord::new(event::RAISE, now);
        record.scope = Some(scope.to_owned());
        record.presented = Some(token);
        record.previous = Some(previous);
        self.audit(record);
    }

    /// An operator's reset.
    pub(crate) fn reset(&self, scope: &str, token: u64, previous: u64, reason: &str) {
        let mut record = AuditRecord::new(event::RESET, SystemTime::now());
        record.scope = Some(scope.to_owned());
        record.presented = Some(token);
        record.previous = Some(previous);
        record.reason = Some(reason.to_owned());
        self.audit(record);
    }

    /// An advance on the admin API (a node announcing its term, or an operator): its
    /// outcome `advanced`, `unchanged` or `refused`, and the fence it left.
    pub(crate) fn announced(
        &self,
        scope: &str,
        token: u64,
        outcome: &str,
        current: u64,
        peer: Option<SocketAddr>,
        reason: Option<String>,
    ) {
        let mut record = AuditRecord::new(event::ANNOUNCE, SystemTime::now());
        record.scope = Some(scope.to_owned());
        record.presented = Some(token);
        record.current = Some(current);
        record.outcome = Some(outcome.to_owned());
        record.peer = peer.map(|p| p.ip().to_string());
        record.reason = reason;
        self.audit(record);
    }

    /// A request waited at the barrier.
    pub(crate) fn barrier_wait(&self) {
        self.barrier_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// The upstream answered a forwarded request.
    pub(crate) fn answered(&self) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        self.last_answer_ms.store(
            u64::try_from(now.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// A forwarded request got no answer (or the embedded store failed).
    pub(crate) fn upstream_failed(&self, err: &ProxyError) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        *lock(&self.last_failure) = Some((SystemTime::now(), err.to_string()));
    }

    fn audit(&self, record: AuditRecord) {
        if let Some(log) = &self.audit {
            log.record(record);
        }
    }

    // Read side, for the status page.

    pub(crate) fn started(&self) -> SystemTime {
        self.started
    }

    pub(crate) fn audit_log(&self) -> Option<&AuditLog> {
        self.audit.as_ref()
    }

    /// The rejections kept, both rings, newest first.
    pub(crate) fn rejections(&self) -> Vec<AuditRecord> {
        let mut all: Vec<AuditRecord> = lock(&self.rejections).iter().cloned().collect();
        all.extend(lock(&self.unproven).iter().cloned());
        // RFC 3339 times of one format sort as text; the sort is stable, so each ring's
        // own order holds among equal times.
        all.sort_by(|a, b| b.time.cmp(&a.time));
        all
    }

    pub(crate) fn rejections_total(&self) -> u64 {
        self.rejections_total.load(Ordering::Relaxed)
    }

    /// When `scope` was last raised by this process, and from what.
    pub(crate) fn last_raise(&self, scope: &str) -> Option<(SystemTime, u64)> {
        lock(&self.raises).get(scope).copied()
    }

    pub(crate) fn barrier_waits(&self) -> u64 {
        self.barrier_waits.load(Ordering::Relaxed)
    }

    pub(crate) fn upstream(&self, target: String) -> UpstreamStatus {
        let last_answer_ms = self.last_answer_ms.load(Ordering::Relaxed);
        let failure = lock(&self.last_failure).clone();
        UpstreamStatus {
            target,
            answered: self.answered.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            last_answer_at: (last_answer_ms > 0)
                .then(|| rfc3339(UNIX_EPOCH + Duration::from_millis(last_answer_ms))),
            last_failure_at: failure.as_ref().map(|(at, _)| rfc3339(*at)),
            last_failure: failure.map(|(_, cause)| cause),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stale(presented: u64) -> ProxyError {
        ProxyError::Stale {
            scope: "jobs".into(),
            presented,
            current: 9,
        }
    }

    /// Goal: the rejection ring keeps the newest `REJECTIONS_KEPT`, newest first, counts
    /// all of them, and records only fencing refusals. Method: refuse 60 stale writes and
    /// one malformed request, read the ring.
    #[test]
    fn ring_keeps_the_newest_rejections_first() {
        let a = Activity::default();
        for t in 0..60 {
            a.refused(&stale(t), &Method::PUT, "/k", None);
        }
        a.refused(&ProxyError::MissingToken, &Method::PUT, "/k", None);
        let ring = a.rejections();
        assert_eq!(ring.len(), REJECTIONS_KEPT);
        assert_eq!(ring[0].presented, Some(59));
        assert_eq!(ring[REJECTIONS_KEPT - 1].presented, Some(10));
        assert_eq!(a.rejections_total(), 60);
        assert_eq!(ring[0].current, Some(9));
        assert_eq!(ring[0].method.as_deref(), Some("PUT"));
    }

    /// Goal: a flood of missing proofs neither pushes a stale-token rejection off the
    /// page nor is built past the noise rate, and every refusal is counted. Method:
    /// refuse one stale write, then 1,000 writes without a proof; read the rings.
    #[test]
    fn unproven_flood_keeps_the_stale_rejection_and_counts_everything() {
        let a = Activity::default();
        a.refused(&stale(3), &Method::PUT, "/k", None);
        let missing = ProxyError::MissingProof {
            scope: "jobs".into(),
            presented: 7,
        };
        for _ in 0..1000 {
            a.refused(&missing, &Method::PUT, "/k", None);
        }
        let ring = a.rejections();
        assert_eq!(a.rejections_total(), 1001);
        let stale: Vec<_> = ring
            .iter()
            .filter(|r| r.reason.as_deref() == Some("stale-token"))
            .collect();
        assert_eq!(stale.len(), 1, "{ring:?}");
        let unproven = ring.len() - 1;
        assert!((1..=REJECTIONS_KEPT).contains(&unproven), "{unproven} kept");
        assert!(a.noise.suppressed() >= 1000 - REJECTIONS_KEPT as u64);
    }

    /// Goal: a hostile path is cut to `AUDIT_PATH_BYTES_MAX` bytes at a character
    /// boundary. Method: refuse a write whose path is 1,000 two-byte characters.
    #[test]
    fn long_paths_are_cut_at_a_character_boundary() {
        let a = Activity::default();
        let path = "é".repeat(1000);
        a.refused(&stale(1), &Method::PUT, &path, None);
        let kept = a.rejections()[0].path.clone().unwrap();
        assert_eq!(kept.len(), AUDIT_PATH_BYTES_MAX);
        assert!(path.starts_with(&kept));
    }
}
