//! What every simulated actor shares: the seeded dice, the virtual clock, the trace, and
//! the invariants' memory.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use palisade_election::transport::mem::Fate;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::time::Instant;

use crate::knobs::{LOSS_P, NET_DELAY_MS};
use crate::trace::Trace;

/// Locks `m`; nothing panics while these locks are held, so a poisoned one still guards
/// whole data (and a panic fails the run anyway).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The state of the raft network as a whole, which the fault schedule changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weather {
    /// Every message delivered at once.
    Calm,
    /// Messages lost with probability [`LOSS_P`].
    Lossy,
    /// Messages delayed (and so reordered) by [`NET_DELAY_MS`].
    Slow,
    /// Both.
    Stormy,
}

/// Every random decision of a run, from its seed. Drawn in the order the single-threaded
/// runtime runs the actors, which is itself fixed: so one seed is one run.
pub struct Dice {
    rng: Mutex<StdRng>,
    weather: Mutex<Weather>,
}

impl Dice {
    fn new(seed: u64) -> Self {
        Self {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            weather: Mutex::new(Weather::Calm),
        }
    }

    /// A number in `[lo, hi)` (or `lo` when the range is empty).
    pub fn draw(&self, (lo, hi): (u64, u64)) -> u64 {
        if hi <= lo {
            return lo;
        }
        lock(&self.rng).random_range(lo..hi)
    }

    /// True with probability `p`.
    pub fn chance(&self, p: f64) -> bool {
        lock(&self.rng).random_bool(p)
    }

    /// One of `items`, which must not be empty.
    pub fn pick<T: Copy>(&self, items: &[T]) -> T {
        items[self.draw((0, items.len() as u64)) as usize]
    }

    pub fn set_weather(&self, weather: Weather) {
        *lock(&self.weather) = weather;
    }

    pub fn weather(&self) -> Weather {
        *lock(&self.weather)
    }

    /// The fate of one raft message in the current weather (the network's fault hook).
    pub fn fate(&self) -> Fate {
        let weather = self.weather();
        let lossy = matches!(weather, Weather::Lossy | Weather::Stormy);
        let slow = matches!(weather, Weather::Slow | Weather::Stormy);
        if lossy && self.chance(LOSS_P) {
            return Fate::Lose;
        }
        if slow {
            return Fate::Delay(Duration::from_millis(self.draw(NET_DELAY_MS)));
        }
        Fate::Deliver
    }
}

/// What the checks remember between steps.
#[derive(Default)]
pub struct Memory {
    /// Per proxy and scope: the highest token its storage applied.
    pub applied_max: BTreeMap<(u64, String), u64>,
    /// Per proxy and scope: the highest fence seen there.
    pub fence_max: BTreeMap<(u64, String), u64>,
    /// Per token of the cluster's scope: the node that held it.
    pub holders: BTreeMap<u64, u64>,
    /// Per session id of named leaderships: what its client believes (see
    /// [`ClientView`]). A session leaves once its client knows it is lost or its trust
    /// ended.
    pub sessions: BTreeMap<String, ClientView>,
    /// Per named scope: the last grant a client received while it trusted its session,
    /// as `(token, session)`.
    pub last_grant: BTreeMap<String, (u64, String)>,
    /// Double holds already reported (scope and the two sessions), so that one overlap is
    /// one violation rather than one per check.
    pub reported: BTreeSet<(String, String, String)>,
}

/// What a named-leaderships client believes about one of its sessions.
#[derive(Debug, Clone)]
pub struct ClientView {
    /// The holder (client) that opened it.
    pub holder: u64,
    /// The end of its trust, in virtual microseconds: the send time of its last answered
    /// keepalive (or of its open) plus the TTL less the drift bound.
    pub trusted_until_us: u64,
    /// The grant it holds and uses: scope and token.
    pub grant: Option<(String, u64)>,
}

/// Counts for the run's summary line.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Writes the storages applied.
    pub applied: u64,
    /// Writes a proxy refused as stale (409).
    pub stale: u64,
    /// Writes refused at the barrier's deadline (503), or cut off by a proxy crash.
    pub unavailable: u64,
    /// Distinct tokens held by established leaders.
    pub tokens: u64,
    /// Faults injected.
    pub faults: u64,
    /// Named leaderships: sessions opened.
    pub sessions: u64,
    /// Named leaderships: sessions lost while their holder kept them alive (404 on a
    /// keepalive: expired by the leader) or whose trust ran out first.
    pub sessions_lost: u64,
    /// Named leaderships: grants received while the session was trusted.
    pub grants: u64,
    /// Named leaderships: campaigns that timed out waiting (409 `campaign-timeout`).
    pub campaign_timeouts: u64,
    /// Named leaderships: writes the storages applied.
    pub named_applied: u64,
    /// Named leaderships: writes a proxy refused as stale (409).
    pub named_stale: u64,
}

/// The world of one run.
pub struct World {
    pub dice: Arc<Dice>,
    start: Instant,
    trace: Mutex<Trace>,
    pub memory: Mutex<Memory>,
    pub stats: Mutex<Stats>,
}

impl World {
    pub fn new(seed: u64) -> Self {
        Self {
            dice: Arc::new(Dice::new(seed)),
            start: Instant::now(),
            trace: Mutex::new(Trace::default()),
            memory: Mutex::new(Memory::default()),
            stats: Mutex::new(Stats::default()),
        }
    }

    /// Virtual microseconds since the run began.
    pub fn now_us(&self) -> u64 {
        self.us_at(Instant::now())
    }

    /// Virtual microseconds from the run's start to `at`.
    pub fn us_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.start).as_micros()).unwrap_or(u64::MAX)
    }

    /// Virtual milliseconds since the run began.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Records a step.
    pub fn log(&self, what: &str) {
        let at = self.now_ms();
        lock(&self.trace).event(at, what);
    }

    /// Records a broken invariant.
    pub fn violation(&self, what: &str) {
        let at = self.now_ms();
        lock(&self.trace).violation(at, what);
    }

    pub fn trace(&self) -> MutexGuard<'_, Trace> {
        lock(&self.trace)
    }

    pub fn stats(&self) -> MutexGuard<'_, Stats> {
        lock(&self.stats)
    }

    /// Sleeps a duration drawn from `range`.
    pub async fn sleep_drawn(&self, range: (u64, u64)) {
        let ms = self.dice.draw(range);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    /// Invariant: per proxy and scope, the storage never applies a token below one it
    /// applied before. Called at each apply, with the write's token.
    pub fn check_apply(&self, proxy: u64, scope: &str, token: u64, what: &str) {
        let mut memory = lock(&self.memory);
        let max = memory
            .applied_max
            .entry((proxy, scope.to_owned()))
            .or_insert(0);
        let before = *max;
        *max = before.max(token);
        drop(memory);
        if token < before {
            self.violation(&format!(
                "storage of p{proxy} applied {what} with token {token} of scope {scope} after token {before}"
            ));
        }
    }

    /// Invariants on a fence read at proxy `proxy`: it never moves backwards, and it is at
    /// least every token its storage applied.
    pub fn check_fence(&self, proxy: u64, scope: &str, fence: u64, when: &str) {
        let mut memory = lock(&self.memory);
        let key = (proxy, scope.to_owned());
        let applied = memory.applied_max.get(&key).copied().unwrap_or(0);
        let max = memory.fence_max.entry(key).or_insert(0);
        let before = *max;
        *max = before.max(fence);
        drop(memory);
        if fence < before {
            self.violation(&format!(
                "fence of scope {scope} at p{proxy} went back from {before} to {fence} ({when})"
            ));
        }
        if fence < applied {
            self.violation(&format!(
                "fence of scope {scope} at p{proxy} is {fence}, below token {applied} its storage applied ({when})"
            ));
        }
    }

    /// Invariant: at most one holder per token of the cluster's scope (one established
    /// leader per term). Returns whether the token is new.
    pub fn check_holder(&self, token: u64, node: u64) -> bool {
        let mut memory = lock(&self.memory);
        match memory.holders.get(&token) {
            Some(&holder) if holder != node => {
                drop(memory);
                self.violation(&format!(
                    "token {token} held by node {node} while node {holder} held it"
                ));
                false
            }
            Some(_) => false,
            None => {
                memory.holders.insert(token, node);
                true
            }
        }
    }
}

/// The invariants of named leaderships, on what the clients believe.
impl World {
    /// Holder `holder` opened `session`, which it trusts until `trusted_until_us`.
    pub fn session_opened(&self, session: &str, holder: u64, trusted_until_us: u64) {
        lock(&self.memory).sessions.insert(
            session.to_owned(),
            ClientView {
                holder,
                trusted_until_us,
                grant: None,
            },
        );
        self.stats().sessions += 1;
    }

    /// An answered keepalive of `session` extends its trust to `until_us`; then checks
    /// that no scope has two holders.
    pub fn session_trusted(&self, session: &str, until_us: u64) {
        if let Some(view) = lock(&self.memory).sessions.get_mut(session) {
            view.trusted_until_us = view.trusted_until_us.max(until_us);
        }
        self.check_named_holders("after a keepalive");
    }

    /// Whether the client still trusts `session` now.
    pub fn trusts(&self, session: &str) -> bool {
        let now = self.now_us();
        lock(&self.memory)
            .sessions
            .get(session)
            .is_some_and(|v| now < v.trusted_until_us)
    }

    /// The client knows `session` is lost or gave it up: it no longer believes anything
    /// of it.
    pub fn session_ended(&self, session: &str) {
        lock(&self.memory).sessions.remove(session);
    }

    /// The client of `session` stops using its grant (before it resigns, revokes, or
    /// once a proxy refused it as stale).
    pub fn grant_released(&self, session: &str) {
        if let Some(view) = lock(&self.memory).sessions.get_mut(session) {
            view.grant = None;
        }
    }

    /// The client of `session` received a grant of `scope` with `token`. Used only while
    /// it trusts the session (answers whether it does). Invariants: per scope, the grants
    /// received rise (a session granted again may get its own token again); and no other
    /// session's client trusts a grant of the scope now.
    pub fn grant_received(&self, session: &str, scope: &str, token: u64) -> bool {
        let now = self.now_us();
        let mut memory = lock(&self.memory);
        let Some(view) = memory.sessions.get_mut(session) else {
            return false;
        };
        if now >= view.trusted_until_us {
            return false;
        }
        view.grant = Some((scope.to_owned(), token));
        let last = memory
            .last_grant
            .insert(scope.to_owned(), (token, session.to_owned()));
        drop(memory);
        self.stats().grants += 1;
        if let Some((before, by)) = last
            && (token < before || (token == before && by != session))
        {
            self.violation(&format!(
                "grant of {scope} with token {token} to session {session} after token \
                 {before} to session {by}"
            ));
        }
        self.check_named_holders("at a grant");
        true
    }

    /// Invariant: at most one holder per named scope: no two sessions' clients trust a
    /// grant of one scope at once. Sessions whose trust ended are forgotten.
    pub fn check_named_holders(&self, when: &str) {
        let now = self.now_us();
        let mut memory = lock(&self.memory);
        memory.sessions.retain(|_, v| now < v.trusted_until_us);
        let mut by_scope: BTreeMap<&str, Vec<(&str, &ClientView)>> = BTreeMap::new();
        for (id, view) in &memory.sessions {
            if let Some((scope, _)) = &view.grant {
                by_scope.entry(scope).or_default().push((id, view));
            }
        }
        let mut found = Vec::new();
        for (scope, holders) in by_scope {
            for (i, (a, va)) in holders.iter().enumerate() {
                for (b, vb) in &holders[i + 1..] {
                    found.push((
                        scope.to_owned(),
                        (*a).to_owned(),
                        (*b).to_owned(),
                        format!(
                            "scope {scope} held at once by session {a} of h{} (token {:?}, \
                         trusted until {} us) and session {b} of h{} (token {:?}, trusted \
                         until {} us) ({when})",
                            va.holder,
                            va.grant.as_ref().map(|g| g.1),
                            va.trusted_until_us,
                            vb.holder,
                            vb.grant.as_ref().map(|g| g.1),
                            vb.trusted_until_us,
                        ),
                    ));
                }
            }
        }
        let fresh: Vec<String> = found
            .into_iter()
            .filter_map(|(scope, a, b, what)| memory.reported.insert((scope, a, b)).then_some(what))
            .collect();
        drop(memory);
        for what in fresh {
            self.violation(&what);
        }
    }
}
