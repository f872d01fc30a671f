//! What every simulated actor shares: the seeded dice, the virtual clock, the trace, and
//! the invariants' memory.

use std::collections::BTreeMap;
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
