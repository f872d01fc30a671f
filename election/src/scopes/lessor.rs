//! The leader's side of session lifetimes.
//!
//! Only the leader tracks keepalives, in memory and on its monotonic clock; followers do
//! not (their state machine knows each session's TTL, not its deadline). The rules:
//! - A keepalive sets the session's deadline to its TTL from the moment the leader takes
//!   it. Keepalives closer together than [`KEEPALIVE_INTERVAL_MS_MIN`] are refused.
//! - A leader that takes office (a new term) gives every session a full TTL from then
//!   before it may expire any: a failover never expires a client that kept alive with the
//!   old leader, however long the election took (the grace period of etcd's lessor and of
//!   Chubby).
//! - A session past its deadline is proposed for expiry (an entry, applied on every
//!   node); if that entry is not applied within [`EXPIRY_RETRY_MS`] (leadership moved),
//!   it is proposed again while this node still leads.
//!
//! The client's side of the bargain: it treats its session as lost a TTL less the drift
//! bound after it *sent* its last answered keepalive, which is never later than this
//! deadline (`palisade_protocol::scopes::session_trusted_until`).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::limits::{EXPIRIES_PER_TICK_MAX, EXPIRY_RETRY_MS, KEEPALIVE_INTERVAL_MS_MIN};
use super::machine::Machine;

/// One tracked session.
#[derive(Debug, Clone, Copy)]
struct Lifetime {
    deadline: Instant,
    last_keepalive: Option<Instant>,
    /// When an expiry was last proposed for it.
    expiry_proposed: Option<Instant>,
}

/// Why a keepalive was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeepaliveRefused {
    /// The session is not (or no longer) known here.
    Unknown,
    /// Another keepalive came less than [`KEEPALIVE_INTERVAL_MS_MIN`] ago.
    TooFast,
}

/// The leader's deadlines, for the term it leads in.
#[derive(Debug, Default)]
pub(crate) struct Lessor {
    /// The term these deadlines belong to; `None`: not leading.
    term: Option<u64>,
    lifetimes: HashMap<String, Lifetime>,
}

impl Lessor {
    /// This node leads in `term` (established): on a new term, every session of `machine`
    /// gets a full TTL from `now`. Called on every tick while leading; cheap when the term
    /// is the same.
    /// True when `term` is new to it.
    pub(crate) fn lead(&mut self, term: u64, machine: &Machine, now: Instant) -> bool {
        if self.term == Some(term) {
            return false;
        }
        self.term = Some(term);
        self.lifetimes = machine
            .sessions
            .iter()
            .map(|(id, s)| (id.clone(), fresh(now, s.ttl_ms)))
            .collect();
        true
    }

    /// This node does not lead: forget every deadline.
    pub(crate) fn follow(&mut self) {
        self.term = None;
        self.lifetimes.clear();
    }

    /// Whether this lessor tracks deadlines (its node leads).
    pub(crate) fn leading(&self) -> bool {
        self.term.is_some()
    }

    /// A session was opened (applied) while leading: its TTL runs from now.
    pub(crate) fn opened(&mut self, session: &str, ttl_ms: u64, now: Instant) {
        if self.leading() {
            self.lifetimes
                .insert(session.to_owned(), fresh(now, ttl_ms));
        }
    }

    /// A session ended (applied).
    pub(crate) fn ended(&mut self, session: &str) {
        self.lifetimes.remove(session);
    }

    /// A keepalive for `session`, whose TTL is `ttl_ms`, taken at `now`.
    pub(crate) fn keepalive(
        &mut self,
        session: &str,
        ttl_ms: u64,
        now: Instant,
    ) -> Result<(), KeepaliveRefused> {
        let life = self
            .lifetimes
            .get_mut(session)
            .ok_or(KeepaliveRefused::Unknown)?;
        if life.expiry_proposed.is_some() && life.deadline <= now {
            // Already past its deadline and on its way out: no resurrection.
            return Err(KeepaliveRefused::Unknown);
        }
        if life.last_keepalive.is_some_and(|t| {
            now.duration_since(t) < Duration::from_millis(KEEPALIVE_INTERVAL_MS_MIN)
        }) {
            return Err(KeepaliveRefused::TooFast);
        }
        life.last_keepalive = Some(now);
        life.deadline = now + Duration::from_millis(ttl_ms);
        Ok(())
    }

    /// Milliseconds until `session` may be expired, while leading.
    pub(crate) fn remaining_ms(&self, session: &str, now: Instant) -> Option<u64> {
        let life = self.lifetimes.get(session)?;
        Some(
            u64::try_from(life.deadline.saturating_duration_since(now).as_millis())
                .unwrap_or(u64::MAX),
        )
    }

    /// The sessions past their deadline at `now` whose expiry is not proposed yet (or
    /// was proposed more than [`EXPIRY_RETRY_MS`] ago), at most
    /// [`EXPIRIES_PER_TICK_MAX`]; each is marked proposed.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<String> {
        let retry = Duration::from_millis(EXPIRY_RETRY_MS);
        let mut due = Vec::new();
        for (id, life) in &mut self.lifetimes {
            if due.len() >= EXPIRIES_PER_TICK_MAX {
                break;
            }
            let waiting = life
                .expiry_proposed
                .is_some_and(|at| now.duration_since(at) < retry);
            if life.deadline <= now && !waiting {
                life.expiry_proposed = Some(now);
                due.push(id.clone());
            }
        }
        due.sort();
        due
    }
}

fn fresh(now: Instant, ttl_ms: u64) -> Lifetime {
    Lifetime {
        deadline: now + Duration::from_millis(ttl_ms),
        last_keepalive: None,
        expiry_proposed: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scopes::Op;

    fn machine_with(ids: &[&str]) -> Machine {
        let mut m = Machine::default();
        for (i, id) in ids.iter().enumerate() {
            m.apply(
                i as u64 + 1,
                &Op::Open {
                    session: (*id).into(),
                    ttl_ms: 1_000,
                    owner: None,
                },
            );
        }
        m
    }

    /// Goal: a new term gives every session a full TTL from when it took office, however
    /// late that is; keepalives push the deadline; a session past it is due once, and
    /// again only after the retry time.
    /// Method: paused time; lead at t=0 with two sessions; keep one alive at 0.9 s; check
    /// what is due at 1.0 s, 1.5 s and 2.0 s; then a new term at 5 s: nothing due before 6 s.
    #[tokio::test(start_paused = true)]
    async fn deadlines_follow_keepalives_and_a_new_term_grants_a_full_ttl() {
        let m = machine_with(&["a", "b"]);
        let mut lessor = Lessor::default();
        let t0 = Instant::now();
        lessor.lead(1, &m, t0);
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(lessor.keepalive("a", 1_000, at(900)), Ok(()));
        assert_eq!(
            lessor.keepalive("a", 1_000, at(950)),
            Err(KeepaliveRefused::TooFast)
        );
        assert_eq!(lessor.due(at(999)), Vec::<String>::new());
        assert_eq!(lessor.due(at(1_000)), vec!["b".to_owned()]);
        assert_eq!(
            lessor.due(at(1_500)),
            Vec::<String>::new(),
            "proposed already"
        );
        assert_eq!(
            lessor.keepalive("b", 1_000, at(1_500)),
            Err(KeepaliveRefused::Unknown)
        );
        assert_eq!(lessor.due(at(2_000)), vec!["a".to_owned(), "b".to_owned()]);
        lessor.lead(2, &m, at(5_000));
        assert_eq!(
            lessor.due(at(5_999)),
            Vec::<String>::new(),
            "full TTL after a new term"
        );
        assert_eq!(lessor.remaining_ms("a", at(5_500)), Some(500));
        lessor.follow();
        assert!(!lessor.leading() && lessor.due(at(10_000)).is_empty());
    }
}
