//! The replicated state of named leaderships, and the one function that changes it.
//!
//! Every node applies the same committed entries in the same order to a [`Machine`] and
//! gets the same state: nothing here reads a clock, a random number or anything local. The
//! leader's clock decides *when* a session expires (the lessor); the expiry itself is an
//! entry like any other.
//!
//! # Tokens
//! A grant made by the entry at raft index `i` carries the token
//! `max(i, last + 1)`, where `last` is the scope's previous token. Raft indexes of
//! committed entries only grow, are the same on every node and are never reused, across
//! restarts, snapshots, membership changes and leader changes; so every grant's token is
//! above every earlier grant's of the same scope, and in the usual case it is the index
//! itself. The `last + 1` arm exists for a scope whose fence at a proxy was raised above
//! the next index (by an earlier cluster, or by an operator): the fence-on-grant step
//! then proposes a [`Op::Raise`], which grants the same holder again with a token above
//! that fence, so such a scope costs one more round instead of being unusable.
//!
//! A scope's record is dropped once nobody holds or waits for it and its last token is
//! at most the current index (the next grant's index is then above it anyway); a scope
//! raised above the index keeps its record, so its next token stays above the raise.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::entry::{Op, Outcome, Refusal};
use super::limits::{SCOPES_MAX, SCOPES_PER_SESSION_MAX, SESSIONS_MAX, WAITERS_PER_SCOPE_MAX};

/// One live session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    /// Its TTL, in milliseconds of the leader's clock.
    pub ttl_ms: u64,
    /// The identity that opened it (a client certificate's name), when over mTLS: only
    /// that identity may keep it alive, campaign, resign or revoke with it.
    pub owner: Option<String>,
    /// Scopes it holds. Invariant: each names it as `holder`.
    pub holds: BTreeSet<String>,
    /// Scopes it waits for. Invariant: each lists it in `waiters`.
    pub waits: BTreeSet<String>,
}

/// The holder of a scope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Holder {
    /// The holding session.
    pub session: String,
    /// Its token.
    pub token: u64,
}

/// One scope somebody holds, waits for, or raised above the index.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ScopeRecord {
    /// Who holds it.
    pub holder: Option<Holder>,
    /// Sessions waiting, first come first served. Never holds the holder.
    pub waiters: VecDeque<String>,
    /// The token of its last grant (0: none since the record was made).
    pub last_token: u64,
}

/// The whole replicated state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Machine {
    /// The index of the last entry applied to it; entries at or below it are skipped (a
    /// restart replays the log from the compaction boundary).
    pub index: u64,
    /// Live sessions by id.
    pub sessions: BTreeMap<String, SessionRecord>,
    /// Scopes by name.
    pub scopes: BTreeMap<String, ScopeRecord>,
    /// The latest leader's API, as it announced itself (followers forward keepalives
    /// there while that leader leads).
    #[serde(default)]
    pub leader_api: Option<LeaderApi>,
}

/// Where a leader serves its API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LeaderApi {
    /// The leader's raft id.
    pub node_id: u64,
    /// The term it leads in.
    pub term: u64,
    /// Its API's base URL.
    pub url: String,
}

impl Machine {
    /// Decodes a stored state; empty bytes are the empty state.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.is_empty() {
            return Ok(Self::default());
        }
        let machine: Self = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        machine.check()?;
        Ok(machine)
    }

    /// The stored form.
    pub(crate) fn encode(&self) -> Vec<u8> {
        // Serialising maps of strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The holder of `scope`, if any.
    pub(crate) fn holder(&self, scope: &str) -> Option<&Holder> {
        self.scopes.get(scope).and_then(|s| s.holder.as_ref())
    }

    /// Applies the entry at `index`. Entries at or below [`Self::index`] were applied
    /// before a restart and change nothing (`None`).
    pub(crate) fn apply(&mut self, index: u64, op: &Op) -> Option<Outcome> {
        if index <= self.index {
            return None;
        }
        self.index = index;
        Some(match op {
            Op::Open {
                session,
                ttl_ms,
                owner,
            } => self.open(session, *ttl_ms, owner.clone()),
            Op::Revoke { session, .. } => self.revoke(session),
            Op::Campaign { session, scope } => self.campaign(session, scope),
            Op::Resign { session, scope } => self.resign(session, scope),
            Op::Raise {
                session,
                scope,
                above,
            } => self.raise(session, scope, *above),
            Op::LeaderApi { node_id, term, url } => {
                if self.leader_api.as_ref().is_none_or(|l| l.term <= *term) {
                    self.leader_api = Some(LeaderApi {
                        node_id: *node_id,
                        term: *term,
                        url: url.clone(),
                    });
                }
                Outcome::Noted
            }
        })
    }

    fn open(&mut self, session: &str, ttl_ms: u64, owner: Option<String>) -> Outcome {
        if self.sessions.contains_key(session) {
            return Outcome::Refused(Refusal::SessionExists);
        }
        if self.sessions.len() >= SESSIONS_MAX {
            return Outcome::Refused(Refusal::TooManySessions);
        }
        self.sessions.insert(
            session.to_owned(),
            SessionRecord {
                ttl_ms,
                owner,
                holds: BTreeSet::new(),
                waits: BTreeSet::new(),
            },
        );
        Outcome::Opened
    }

    fn revoke(&mut self, session: &str) -> Outcome {
        let Some(record) = self.sessions.remove(session) else {
            return Outcome::Refused(Refusal::UnknownSession);
        };
        for scope in &record.waits {
            if let Some(s) = self.scopes.get_mut(scope) {
                s.waiters.retain(|w| w != session);
            }
            self.drop_if_idle(scope);
        }
        let released: Vec<String> = record.holds.into_iter().collect();
        for scope in &released {
            self.release(scope);
        }
        Outcome::Revoked { released }
    }

    fn campaign(&mut self, session: &str, scope: &str) -> Outcome {
        let Some(record) = self.sessions.get(session) else {
            return Outcome::Refused(Refusal::UnknownSession);
        };
        if record.holds.contains(scope) {
            let token = self.holder(scope).map_or(0, |h| h.token);
            return Outcome::Holding { token };
        }
        if record.waits.contains(scope) {
            return Outcome::Waiting;
        }
        if record.holds.len() + record.waits.len() >= SCOPES_PER_SESSION_MAX {
            return Outcome::Refused(Refusal::SessionScopesFull);
        }
        if !self.scopes.contains_key(scope) && self.scopes.len() >= SCOPES_MAX {
            return Outcome::Refused(Refusal::TooManyScopes);
        }
        let index = self.index;
        let entry = self.scopes.entry(scope.to_owned()).or_default();
        if entry.holder.is_some() {
            if entry.waiters.len() >= WAITERS_PER_SCOPE_MAX {
                return Outcome::Refused(Refusal::TooManyWaiters);
            }
            entry.waiters.push_back(session.to_owned());
            self.session_mut(session).waits.insert(scope.to_owned());
            return Outcome::Waiting;
        }
        let token = index.max(entry.last_token + 1);
        entry.holder = Some(Holder {
            session: session.to_owned(),
            token,
        });
        entry.last_token = token;
        self.session_mut(session).holds.insert(scope.to_owned());
        Outcome::Holding { token }
    }

    fn resign(&mut self, session: &str, scope: &str) -> Outcome {
        let Some(record) = self.sessions.get_mut(session) else {
            return Outcome::Refused(Refusal::UnknownSession);
        };
        if record.waits.remove(scope) {
            if let Some(s) = self.scopes.get_mut(scope) {
                s.waiters.retain(|w| w != session);
            }
            self.drop_if_idle(scope);
            return Outcome::Resigned { released: false };
        }
        if !record.holds.remove(scope) {
            return Outcome::Resigned { released: false };
        }
        self.release(scope);
        Outcome::Resigned { released: true }
    }

    fn raise(&mut self, session: &str, scope: &str, above: u64) -> Outcome {
        let index = self.index;
        let Some(entry) = self.scopes.get_mut(scope) else {
            return Outcome::NotRaised;
        };
        let Some(holder) = entry.holder.as_mut().filter(|h| h.session == session) else {
            return Outcome::NotRaised;
        };
        if holder.token > above {
            return Outcome::Holding {
                token: holder.token,
            };
        }
        // `above` is a proxy's fence: at most u64::MAX - 1 can be passed, and the retired
        // fence (u64::MAX) can never be (the proxy admits nothing any more).
        let Some(token) = above.checked_add(1) else {
            return Outcome::NotRaised;
        };
        let token = token.max(index).max(entry.last_token + 1);
        holder.token = token;
        entry.last_token = token;
        Outcome::Holding { token }
    }

    /// The holder of `scope` lets go: the first waiter, if any, holds it now.
    fn release(&mut self, scope: &str) {
        let index = self.index;
        let next = {
            let Some(entry) = self.scopes.get_mut(scope) else {
                return;
            };
            entry.holder = None;
            entry.waiters.pop_front().inspect(|session| {
                let token = index.max(entry.last_token + 1);
                entry.holder = Some(Holder {
                    session: session.clone(),
                    token,
                });
                entry.last_token = token;
            })
        };
        match next {
            Some(session) => {
                let record = self.session_mut(&session);
                record.waits.remove(scope);
                record.holds.insert(scope.to_owned());
            }
            None => self.drop_if_idle(scope),
        }
    }

    /// Drops the record of a scope nobody holds or waits for, unless its last token is
    /// above the current index (see the module docs).
    fn drop_if_idle(&mut self, scope: &str) {
        let index = self.index;
        if self
            .scopes
            .get(scope)
            .is_some_and(|s| s.holder.is_none() && s.waiters.is_empty() && s.last_token <= index)
        {
            self.scopes.remove(scope);
        }
    }

    fn session_mut(&mut self, session: &str) -> &mut SessionRecord {
        // Callers looked the session up first; a missing one is a broken invariant.
        self.sessions
            .get_mut(session)
            .unwrap_or_else(|| unreachable!("session {session} vanished during an apply"))
    }

    /// Checks the invariants between sessions and scopes (on decode, and in tests).
    pub(crate) fn check(&self) -> Result<(), String> {
        for (name, scope) in &self.scopes {
            if let Some(h) = &scope.holder {
                let holds = self
                    .sessions
                    .get(&h.session)
                    .is_some_and(|s| s.holds.contains(name));
                if !holds || h.token > scope.last_token || scope.waiters.contains(&h.session) {
                    return Err(format!("scope {name}: holder {} out of step", h.session));
                }
            } else if !scope.waiters.is_empty() {
                return Err(format!("scope {name}: waiters without a holder"));
            }
            for w in &scope.waiters {
                if !self.sessions.get(w).is_some_and(|s| s.waits.contains(name)) {
                    return Err(format!("scope {name}: waiter {w} out of step"));
                }
            }
        }
        for (id, s) in &self.sessions {
            for name in &s.holds {
                if self.holder(name).is_none_or(|h| &h.session != id) {
                    return Err(format!("session {id} holds {name} but is not its holder"));
                }
            }
            for name in &s.waits {
                if !self
                    .scopes
                    .get(name)
                    .is_some_and(|r| r.waiters.contains(id))
                {
                    return Err(format!("session {id} waits for {name} but is not queued"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
