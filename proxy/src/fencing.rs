//! Admission of fenced requests: the fence check and the per-scope in-flight barrier.
//!
//! The rule the upstream relies on: it never applies a write with a lower token after one
//! with a higher token of the same scope. Two mechanisms give it:
//!
//! 1. The fence. A request whose token is below the scope's fence is rejected; a higher
//!    token raises the fence (fsynced) before anything is forwarded.
//! 2. The barrier. A request enters the in-flight set *before* it reads the fence, and
//!    is forwarded only once no lower-token request of its scope is still in flight.
//!
//! Entering the set before reading the fence closes the race between a lower request
//! that read the fence just before a higher request raised it: either the higher request
//! sees the lower one in flight and waits for it, or the lower one reads the raised fence
//! and is rejected. Both sides go through the same per-scope mutex, which orders them.
//!
//! A reset (the admin API's audited recovery, the one way a fence goes down) marks the
//! scope as resetting, so that new requests wait instead of joining the set, waits until
//! the set is empty, writes the new fence, and clears the mark. No request is in flight
//! while the fence moves down, so none admitted at the old fence reaches the upstream
//! after one admitted at the new.
//!
//! The [`FenceRegister`] (storage's durable table of fences) is a noun here; the verb for
//! a request joining the in-flight set is *track*.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dashmap::DashMap;
use palisade_protocol::DEFAULT_SCOPE;
use palisade_protocol::process::events;
use palisade_storage::{Advance, AdvanceError, FenceRegister};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::audit::Activity;
use crate::error::ProxyError;
use crate::metrics as m;

/// Admits fenced requests. Cheap to share behind an `Arc`.
pub(crate) struct Fencer {
    register: FenceRegister,
    /// The in-flight set of `default`, the scope most requests have, kept for the
    /// proxy's life: tracking a request there needs no map lookup, no allocation and no
    /// removal when the scope goes idle.
    default: Arc<ScopeInflight>,
    /// Every other scope to its in-flight set. An entry exists only while something is
    /// in flight; idle entries are removed so that unbounded scope names cannot grow
    /// memory. Scope names can be the client's (`Fencing-Scope`), so the hasher is
    /// foldhash with a random seed per map: fast, and without the fixed seed that would
    /// let a client pick names that all collide.
    inflight: DashMap<Box<str>, Arc<ScopeInflight>, foldhash::fast::RandomState>,
    barrier_timeout: Duration,
    /// What the status page and the audit log are told (raises, barrier waits).
    activity: Arc<Activity>,
    /// Commit raises on the caller's task instead of the blocking pool: only for the
    /// deterministic simulation (`tests/sim`, through the `fuzzing` handles), whose redb
    /// is in memory and whose one thread must not depend on when a pool thread finishes.
    inline_commit: bool,
}

/// The fenced requests of one scope that are admitted or waiting, by token.
struct ScopeInflight {
    /// The scope's name, for the guards of its requests (so they need no copy of it).
    scope: Box<str>,
    state: Mutex<InflightState>,
    /// Woken when a request leaves the set while someone waits for that (a reset under
    /// way, or a barrier waiter: see [`InflightState::waiting`]), and when a reset ends.
    left: Notify,
}

/// What one mutex guards for a scope.
#[derive(Default)]
struct InflightState {
    /// Token to the number of requests holding it. Invariant: no zero counts.
    tokens: BTreeMap<u64, usize>,
    /// A reset of the scope is under way: new requests wait for it to end.
    resetting: bool,
    /// Requests waiting at the barrier for lower tokens to leave ([`BarrierWait`]).
    ///
    /// A request leaving the set wakes `left` only when this is above zero or a reset is
    /// under way: waking it takes `left`'s lock, which every data-path thread would
    /// otherwise take for every fenced request. Whoever waits counts itself here, under
    /// this mutex, before it enables its notification and looks at the set again, so a
    /// request leaving either sees the count or left before that look.
    waiting: usize,
}

impl InflightState {
    /// Nothing in flight and no reset: the scope's entry can go.
    fn is_idle(&self) -> bool {
        self.tokens.is_empty() && !self.resetting
    }
}

impl ScopeInflight {
    fn new(scope: &str) -> Arc<Self> {
        Arc::new(Self {
            scope: scope.into(),
            state: Mutex::default(),
            left: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, InflightState> {
        // The critical sections below cannot panic half-way, so a poisoned lock still
        // guards a consistent state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lowest token in flight, if any.
    fn lowest(&self) -> Option<u64> {
        self.lock().tokens.keys().next().copied()
    }
}

/// Proof that a request is tracked in flight. Dropping it (when the upstream has
/// answered, or the request failed) lets higher-token requests of the scope proceed.
pub(crate) struct InflightGuard {
    fencer: Arc<Fencer>,
    token: u64,
    set: Arc<ScopeInflight>,
}

impl InflightGuard {
    /// The scope the request is in flight in.
    pub(crate) fn scope(&self) -> &str {
        &self.set.scope
    }

    /// The token the request holds in flight.
    pub(crate) fn token(&self) -> u64 {
        self.token
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let wake = {
            let mut state = self.set.lock();
            if let Some(count) = state.tokens.get_mut(&self.token) {
                *count -= 1;
                if *count == 0 {
                    state.tokens.remove(&self.token);
                }
            }
            state.resetting || state.waiting > 0
        };
        if wake {
            self.set.left.notify_waiters();
        }
        self.fencer.remove_if_idle(&self.set);
    }
}

/// A request counted in [`InflightState::waiting`] for as long as it waits at the
/// barrier, however the wait ends (admitted, timed out, or its future dropped).
struct BarrierWait<'a> {
    set: &'a ScopeInflight,
}

impl<'a> BarrierWait<'a> {
    fn new(set: &'a ScopeInflight) -> Self {
        set.lock().waiting += 1;
        Self { set }
    }
}

impl Drop for BarrierWait<'_> {
    fn drop(&mut self) {
        self.set.lock().waiting -= 1;
    }
}

/// A reset's mark on its scope. Dropping it (when the reset is written, or gave up)
/// lets the scope's requests in again.
struct ResetClaim {
    fencer: Arc<Fencer>,
    set: Arc<ScopeInflight>,
}

impl Drop for ResetClaim {
    fn drop(&mut self) {
        self.set.lock().resetting = false;
        self.set.left.notify_waiters();
        self.fencer.remove_if_idle(&self.set);
    }
}

/// What admission decided for an admitted request.
pub(crate) struct Admitted {
    /// Held until the upstream has answered; dropping it lets higher tokens pass.
    pub guard: InflightGuard,
    /// Whether this request raised the fence.
    pub raised: bool,
}

impl Fencer {
    pub(crate) fn new(register: FenceRegister, barrier_timeout: Duration) -> Self {
        Self {
            register,
            default: ScopeInflight::new(DEFAULT_SCOPE),
            inflight: DashMap::default(),
            barrier_timeout,
            activity: Arc::default(),
            inline_commit: false,
        }
    }

    /// Commits raises inline (see `inline_commit`). For the simulation only.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn with_inline_commit(mut self) -> Self {
        self.inline_commit = true;
        self
    }

    /// Reports raises and barrier waits to `activity` (the status page, the audit log).
    pub(crate) fn with_activity(mut self, activity: Arc<Activity>) -> Self {
        self.activity = activity;
        self
    }

    /// The proxy's recent activity, which the data path and admin API report to.
    pub(crate) fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }

    /// Per scope with requests in flight: how many, and how many of them wait at the
    /// barrier (hold a token above the scope's lowest in flight). For the status page.
    pub(crate) fn in_flight(&self) -> Vec<(String, u64, u64)> {
        // One `lock()` per set and count: the lock is not reentrant, and a guard that is a
        // temporary lives to the end of its statement, so a second `lock()` there would
        // block this thread for good, and then every request of the scope.
        let count = |set: &ScopeInflight| {
            let state = set.lock();
            let lowest = state.tokens.keys().next().copied();
            let (mut all, mut waiting) = (0u64, 0u64);
            for (token, count) in &state.tokens {
                all += *count as u64;
                if Some(*token) != lowest {
                    waiting += *count as u64;
                }
            }
            (set.scope.to_string(), all, waiting, state.is_idle())
        };
        // `default` is listed, as the others are, only while it is busy.
        let (scope, all, waiting, idle) = count(&self.default);
        let default = (!idle).then_some((scope, all, waiting));
        default
            .into_iter()
            .chain(self.inflight.iter().map(|entry| {
                let (scope, all, waiting, _) = count(entry.value());
                (scope, all, waiting)
            }))
            .collect()
    }

    /// Scopes with something in flight or a reset under way.
    #[cfg(test)]
    pub(crate) fn busy_scopes(&self) -> usize {
        self.inflight.len() + usize::from(!self.default.lock().is_idle())
    }

    /// The durable table of fences (for the admin API).
    pub(crate) fn fence_register(&self) -> &FenceRegister {
        &self.register
    }

    /// Admits a request with `token` in `scope`, or says why not. On success nothing
    /// with a lower token of the scope is in flight, and the fence is at most `token`,
    /// durably.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        scope: &str,
        token: u64,
    ) -> Result<Admitted, ProxyError> {
        // One reading of the clock serves both the deadline and the wait reported: the
        // poll's (a deadline a few microseconds early only gives up sooner).
        let started = palisade_server::clock::tokio_now();
        let deadline = started + self.barrier_timeout;
        // Phase 1: enter the in-flight set, before reading the fence (see the module docs).
        let guard = self
            .track_in_flight(scope, token, started, deadline)
            .await?;

        // Phase 2: the fence check. Equal and lower tokens are answered from memory.
        let current = self.register.current(scope);
        if token < current {
            return Err(stale(scope, token, current));
        }
        let raised = if token > current {
            self.raise(scope, token).await?
        } else {
            false
        };

        // Phase 3: the barrier. Wait until no lower token of this scope is in flight.
        self.wait_for_lower(&guard, started, deadline).await?;
        Ok(Admitted { guard, raised })
    }

    /// Sets the fence of `scope` to `token`, lower included, once none of the scope's
    /// requests is in flight, and returns the fence it had. New requests of the scope
    /// wait meanwhile. Past the barrier timeout it gives up (503) and changes nothing.
    pub(crate) async fn reset(
        self: &Arc<Self>,
        scope: &str,
        token: u64,
    ) -> Result<u64, ProxyError> {
        let started = Instant::now();
        let deadline = started + self.barrier_timeout;
        let claim = self.with_set(scope, |set| {
            let mut state = set.lock();
            if state.resetting {
                return Err(ProxyError::Unavailable(format!(
                    "a reset of scope {scope} is already under way"
                )));
            }
            state.resetting = true;
            drop(state);
            Ok(ResetClaim {
                fencer: Arc::clone(self),
                set: Arc::clone(set),
            })
        })?;
        loop {
            let left = claim.set.left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            if claim.set.lock().tokens.is_empty() {
                break;
            }
            if tokio::time::timeout_at(deadline, left).await.is_err() {
                return Err(ProxyError::ResetTimeout {
                    scope: scope.to_owned(),
                    presented: token,
                    current: self.register.current(scope),
                    waited_ms: elapsed_ms(started),
                });
            }
        }
        let register = self.register.clone();
        let scope_owned = scope.to_owned();
        // The claim moves into the blocking task: if the caller goes away, the write
        // still finishes before any request of the scope is let in.
        tokio::task::spawn_blocking(move || {
            let previous = register.reset(&scope_owned, token);
            drop(claim);
            previous
        })
        .await
        .map_err(|e| ProxyError::Storage(format!("fence reset task failed: {e}")))?
        .map_err(advance_error)
    }

    /// Runs `f` on the in-flight set of `scope`, made if there is none, while the set
    /// cannot be removed: `default`'s never is, and another scope's is held in the map
    /// (under its shard's lock, read or write) for the whole of `f`, which
    /// [`remove_if_idle`](Self::remove_if_idle) needs to write-lock. So whatever `f`
    /// adds to the set is seen by any removal that follows.
    fn with_set<T>(&self, scope: &str, f: impl FnOnce(&Arc<ScopeInflight>) -> T) -> T {
        if scope == DEFAULT_SCOPE {
            return f(&self.default);
        }
        // Most requests of a busy scope find its set: a read lock and no allocation.
        if let Some(entry) = self.inflight.get(scope) {
            return f(entry.value());
        }
        let entry = self
            .inflight
            .entry(scope.into())
            .or_insert_with(|| ScopeInflight::new(scope));
        f(entry.value())
    }

    /// Removes the scope's entry if nothing is in flight and no reset holds it
    /// (`default`'s stays). `remove_if` holds the shard's write lock, and tracking adds
    /// under a lock of the same shard ([`with_set`](Self::with_set)), so no request can
    /// enter a set that is being removed.
    fn remove_if_idle(&self, set: &Arc<ScopeInflight>) {
        if Arc::ptr_eq(set, &self.default) {
            return;
        }
        self.inflight
            .remove_if(&*set.scope, |_, set| set.lock().is_idle());
    }

    /// Raises the fence to `token` (fsynced).
    async fn raise(&self, scope: &str, token: u64) -> Result<bool, ProxyError> {
        let register = self.register.clone();
        let scope_owned = scope.to_owned();
        fail::fail_point!("proxy-before-fence-commit");
        let advance = if self.inline_commit {
            let advance = register.advance(&scope_owned, token);
            // The commit waited for the disk in this poll: later readings of the
            // clock in it must not predate it.
            palisade_server::clock::forget();
            advance
        } else {
            tokio::task::spawn_blocking(move || register.advance(&scope_owned, token))
                .await
                .map_err(|e| ProxyError::Storage(format!("fence advance task failed: {e}")))?
        }
        .map_err(advance_error)?;
        fail::fail_point!("proxy-after-fence-commit");
        match advance {
            Advance::Raised { previous } => {
                metrics::counter!(m::FENCE_ADVANCES).increment(1);
                // `absolute` keeps the maximum, so callers racing here never move it down.
                metrics::counter!(m::FENCE_COMMITS).absolute(self.register.commits());
                tracing::info!(
                    event = events::FENCE_RAISED,
                    scope,
                    token,
                    previous,
                    "fence raised"
                );
                self.activity.raised(scope, token, previous);
                Ok(true)
            }
            Advance::Unchanged => Ok(false),
            Advance::Stale { current } => Err(stale(scope, token, current)),
        }
    }

    /// Adds the request to its scope's in-flight set until the returned guard drops.
    /// While a reset of the scope is under way it waits for it (up to `deadline`).
    async fn track_in_flight(
        self: &Arc<Self>,
        scope: &str,
        token: u64,
        started: Instant,
        deadline: tokio::time::Instant,
    ) -> Result<InflightGuard, ProxyError> {
        loop {
            let tracked = self.with_set(scope, |set| {
                let mut state = set.lock();
                if state.resetting {
                    return Err(Arc::clone(set));
                }
                *state.tokens.entry(token).or_insert(0) += 1;
                Ok(Arc::clone(set))
            });
            let set = match tracked {
                Ok(set) => {
                    return Ok(InflightGuard {
                        fencer: Arc::clone(self),
                        token,
                        set,
                    });
                }
                Err(set) => set,
            };
            let ended = set.left.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if !set.lock().resetting {
                continue;
            }
            tracing::debug!(scope, token, "waiting for a reset of the scope to end");
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return Err(ProxyError::Unavailable(format!(
                    "scope {scope} is being reset; token {token} waited {} ms for it to end",
                    elapsed_ms(started)
                )));
            }
        }
    }

    async fn wait_for_lower(
        &self,
        guard: &InflightGuard,
        started: Instant,
        deadline: tokio::time::Instant,
    ) -> Result<(), ProxyError> {
        // Nothing lower in flight (the usual case): admitted without touching `left`.
        if guard
            .set
            .lowest()
            .is_none_or(|lowest| lowest >= guard.token)
        {
            return Ok(());
        }
        // Counted before the checks below, so that every request leaving from now on
        // wakes `left`.
        let _waiting = BarrierWait::new(&guard.set);
        let mut counted = false;
        loop {
            // Create and enable the notification before checking, so a request leaving
            // between the check and the await still wakes us.
            let left = guard.set.left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            match guard.set.lowest() {
                Some(lowest) if lowest < guard.token => {}
                _ => return Ok(()),
            }
            if !counted {
                counted = true;
                metrics::counter!(m::BARRIER_WAITS).increment(1);
                self.activity.barrier_wait();
                tracing::debug!(
                    scope = guard.scope(),
                    token = guard.token,
                    "waiting for lower-token writes in flight"
                );
            }
            if tokio::time::timeout_at(deadline, left).await.is_err() {
                return Err(ProxyError::BarrierTimeout {
                    scope: guard.scope().to_owned(),
                    presented: guard.token,
                    current: self.register.current(guard.scope()),
                    waited_ms: elapsed_ms(started),
                });
            }
        }
    }
}

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The register's refusal as the proxy's: a full scope table is the client's doing (it
/// named a new scope) and says so with 507, not a storage failure.
fn advance_error(err: AdvanceError) -> ProxyError {
    match err {
        AdvanceError::ScopeLimit { scope, scopes_max } => {
            ProxyError::ScopesFull { scope, scopes_max }
        }
        err => ProxyError::Storage(err.to_string()),
    }
}

fn stale(scope: &str, presented: u64, current: u64) -> ProxyError {
    ProxyError::Stale {
        scope: scope.to_owned(),
        presented,
        current,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fencer(dir: &tempfile::TempDir, barrier_ms: u64) -> Arc<Fencer> {
        let db = palisade_storage::open_database(&dir.path().join("f.redb")).unwrap();
        let register = FenceRegister::open(db, 100).unwrap();
        Arc::new(Fencer::new(register, Duration::from_millis(barrier_ms)))
    }

    /// Goal: once a token is admitted a lower one is stale, an equal one passes without a
    /// raise, and a scope with nothing in flight leaves no entry behind.
    /// Method: admit 5, then 4 and 5, and inspect the in-flight map.
    #[tokio::test]
    async fn lower_token_is_rejected_after_higher_is_admitted() {
        let dir = tempfile::tempdir().unwrap();
        let f = fencer(&dir, 1000);
        let a = f.admit("s", 5).await.unwrap();
        assert!(a.raised);
        drop(a);
        let err = f.admit("s", 4).await.err().unwrap();
        assert!(matches!(
            err,
            ProxyError::Stale {
                presented: 4,
                current: 5,
                ..
            }
        ));
        let equal = f.admit("s", 5).await.unwrap();
        assert!(!equal.raised);
        assert!(f.inflight.contains_key("s"));
        drop(equal);
        assert!(
            !f.inflight.contains_key("s"),
            "idle scope entries are removed"
        );
    }

    /// Goal: a higher token waits at the barrier while a lower one is in flight, and
    /// proceeds once it leaves; the fence moves at once all the same.
    /// Method: hold token 1, admit 2 in a task; show that it has not finished after a
    /// while (a negative check, so a fixed wait), then release 1 and await 2.
    #[tokio::test]
    async fn higher_token_waits_for_lower_in_flight_then_proceeds() {
        let dir = tempfile::tempdir().unwrap();
        let f = fencer(&dir, 5000);
        let low = f.admit("s", 1).await.unwrap();
        let f2 = Arc::clone(&f);
        let high = tokio::spawn(async move { f2.admit("s", 2).await.map(|a| a.raised) });
        // Show that the higher request does not get through while the lower is in flight.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!high.is_finished());
        // Meanwhile the fence already moved, so a new lower request is rejected.
        assert!(matches!(
            f.admit("s", 1).await,
            Err(ProxyError::Stale { .. })
        ));
        drop(low);
        let raised = tokio::time::timeout(Duration::from_secs(5), high)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(raised);
    }

    /// Goal: under concurrency on several threads, no request is admitted while a lower
    /// token of its scope is admitted and unfinished, and no waiter misses its wake-up
    /// (a request leaving wakes the barrier only while someone counts as waiting, so a
    /// lost wake-up would show as a `BarrierTimeout`).
    /// Method: 4 worker threads, 100 tokens in turn, 4 requests each, every request
    /// holding its admission for a short sleep or a few yields; the next token's requests
    /// start as soon as one of the previous token's is admitted, so they raise the fence
    /// and wait at the barrier while the previous ones are held. Every admission checks a
    /// record of the admitted ones; a refusal may only be `Stale` (a request of a token
    /// that arrived after the next one raised the fence).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_requests_never_overtake_a_lower_token_nor_miss_a_wake_up() {
        let dir = tempfile::tempdir().unwrap();
        let f = fencer(&dir, 5000);
        let admitted: Arc<std::sync::Mutex<BTreeMap<u64, usize>>> = Arc::default();
        let (entered, mut entries) = tokio::sync::mpsc::unbounded_channel::<(u64, bool)>();
        let mut tasks = Vec::new();
        for token in 1..=100u64 {
            for i in 0..4u64 {
                let f = Arc::clone(&f);
                let admitted = Arc::clone(&admitted);
                let entered = entered.clone();
                tasks.push(tokio::spawn(async move {
                    let admission = match f.admit("s", token).await {
                        Ok(admission) => admission,
                        Err(ProxyError::Stale { .. }) => {
                            let _ = entered.send((token, false));
                            return false;
                        }
                        Err(err) => panic!("token {token}: {err}"),
                    };
                    {
                        let mut held = admitted.lock().unwrap();
                        if let Some((&lowest, _)) = held.iter().next() {
                            assert!(lowest >= token, "token {token} admitted while {lowest} was");
                        }
                        *held.entry(token).or_insert(0) += 1;
                    }
                    let _ = entered.send((token, true));
                    if i % 2 == 0 {
                        tokio::time::sleep(Duration::from_micros(300)).await;
                    } else {
                        for _ in 0..=i {
                            tokio::task::yield_now().await;
                        }
                    }
                    {
                        let mut held = admitted.lock().unwrap();
                        let count = held.get_mut(&token).unwrap();
                        *count -= 1;
                        if *count == 0 {
                            held.remove(&token);
                        }
                    }
                    drop(admission);
                    true
                }));
            }
            // Until one of this token's requests is admitted (or all four refused).
            let mut refused = 0;
            loop {
                match tokio::time::timeout(Duration::from_secs(10), entries.recv()).await {
                    Ok(Some((of, _))) if of != token => {}
                    Ok(Some((_, true))) => break,
                    Ok(Some((_, false))) => {
                        refused += 1;
                        assert!(refused < 4, "token {token}: all four refused");
                    }
                    Ok(None) | Err(_) => panic!("token {token}: no request was admitted"),
                }
            }
        }
        let mut passed = 0;
        for task in tasks {
            passed += usize::from(
                tokio::time::timeout(Duration::from_secs(10), task)
                    .await
                    .expect("a request never finished")
                    .unwrap(),
            );
        }
        // At least one per token (the loop above waited for it).
        assert!(passed >= 100, "only {passed} of 400 requests were admitted");
        assert_eq!(f.busy_scopes(), 0, "the scope stayed busy");
    }

    /// Goal: past the barrier timeout a waiting request fails with `BarrierTimeout` and
    /// leaves the in-flight set.
    /// Method: hold token 1 with a 50 ms barrier, admit 2.
    #[tokio::test]
    async fn barrier_deadline_answers_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let f = fencer(&dir, 50);
        let _low = f.admit("s", 1).await.unwrap();
        let err = f.admit("s", 2).await.err().unwrap();
        assert!(
            matches!(err, ProxyError::BarrierTimeout { presented: 2, .. }),
            "{err}"
        );
        // The failed request left the set: only the lower one is still in flight.
        assert_eq!(f.inflight.get("s").unwrap().lowest(), Some(1));
    }

    /// Goal: the status page's count of requests in flight answers while the default
    /// scope is busy, and counts each scope's requests and those waiting at its barrier.
    /// (It once locked `default` twice in one statement, the first guard a temporary
    /// still alive, and so deadlocked its thread and then every request of the scope.)
    /// Method: hold token 1 of `default`, and tokens 1 and 2 of `s` (2 waits at the
    /// barrier); count on a thread of its own, within a deadline; release and count again.
    #[tokio::test]
    async fn in_flight_counts_a_busy_default_scope_without_deadlocking() {
        let dir = tempfile::tempdir().unwrap();
        let f = fencer(&dir, 5000);
        let default = f.admit(DEFAULT_SCOPE, 1).await.unwrap();
        let low = f.admit("s", 1).await.unwrap();
        let f2 = Arc::clone(&f);
        let high = tokio::spawn(async move { f2.admit("s", 2).await.map(|a| a.raised) });
        let deadline = Instant::now() + Duration::from_secs(5);
        while f.inflight.get("s").map(|set| set.lock().tokens.len()) != Some(2) {
            assert!(Instant::now() < deadline, "token 2 never entered the set");
            tokio::task::yield_now().await;
        }

        let count = |f: &Arc<Fencer>| {
            let (tx, rx) = std::sync::mpsc::channel();
            let f = Arc::clone(f);
            std::thread::spawn(move || {
                let mut counted = f.in_flight();
                counted.sort();
                let _ = tx.send(counted);
            });
            rx.recv_timeout(Duration::from_secs(5))
        };
        let Ok(counted) = count(&f) else {
            // The counting thread holds `default`'s lock for good: dropping the guard
            // would block this thread too.
            std::mem::forget(default);
            panic!("in_flight() did not answer within 5 s with the default scope busy");
        };
        assert_eq!(
            counted,
            [(DEFAULT_SCOPE.to_owned(), 1, 0), ("s".to_owned(), 2, 1)]
        );

        drop(default);
        drop(low);
        let raised = tokio::time::timeout(Duration::from_secs(5), high)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(raised);
        assert!(count(&f).unwrap().is_empty());
    }

    /// Waits, with a deadline, until `scope` is marked as resetting.
    async fn until_resetting(f: &Arc<Fencer>, scope: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f
            .inflight
            .get(scope)
            .is_some_and(|set| set.lock().resetting)
        {
            assert!(Instant::now() < deadline, "the reset never started");
            tokio::task::yield_now().await;
        }
    }

    /// Goal: a reset waits for the scope's requests in flight, holds new requests of the
    /// scope until it is written (then they meet the reset fence), and leaves other
    /// scopes alone.
    /// Method: hold token 9, reset to 3 in a task, admit 9 again in another; show that
    /// neither finishes while 9 is held (a negative check, so a fixed wait), that another
    /// scope is admitted meanwhile, then release and await both.
    #[tokio::test]
    async fn reset_waits_for_in_flight_and_holds_new_requests() {
        let dir = tempfile::tempdir().unwrap();
        let f = fencer(&dir, 5000);
        let held = f.admit("s", 9).await.unwrap();
        let f2 = Arc::clone(&f);
        let reset = tokio::spawn(async move { f2.reset("s", 3).await });
        until_resetting(&f, "s").await;
        let f3 = Arc::clone(&f);
        let newcomer = tokio::spawn(async move { f3.admit("s", 9).await.map(|a| a.raised) });
        drop(f.admit("t", 1).await.unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!reset.is_finished() && !newcomer.is_finished());
        assert_eq!(f.fence_register().current("s"), 9);
        drop(held);
        assert_eq!(reset.await.unwrap().unwrap(), 9);
        assert!(
            newcomer.await.unwrap().unwrap(),
            "after the reset to 3, token 9 raises the fence again"
        );
        assert!(
            !f.inflight.contains_key("s"),
            "idle scope entries are removed"
        );
    }

    /// Goal: a reset that times out changes nothing and lets requests in again; a second
    /// reset of a scope being reset is refused rather than queued.
    /// Method: hold token 4 with a 50 ms barrier, reset twice at once, then admit.
    #[tokio::test]
    async fn reset_timeout_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let f = fencer(&dir, 50);
        let held = f.admit("s", 4).await.unwrap();
        let (first, second) = tokio::join!(f.reset("s", 1), f.reset("s", 2));
        assert!(
            matches!(first, Err(ProxyError::ResetTimeout { current: 4, .. })),
            "{first:?}"
        );
        assert!(
            matches!(second, Err(ProxyError::Unavailable(_))),
            "{second:?}"
        );
        assert_eq!(f.fence_register().current("s"), 4);
        drop(held);
        assert!(!f.admit("s", 4).await.unwrap().raised);
        assert!(!f.inflight.contains_key("s"));
    }

    /// Goal: a new scope past `scopes_max` is a 507 scopes-full that names the limit and
    /// leaves nothing in flight, while a reserved scope still rises.
    /// Method: a register of one scope with `default` reserved; admit `a`, then `b`,
    /// then `default`.
    #[tokio::test]
    async fn full_scope_table_is_507_and_reserved_scopes_still_rise() {
        let dir = tempfile::tempdir().unwrap();
        let db = palisade_storage::open_database(&dir.path().join("f.redb")).unwrap();
        let register = FenceRegister::open_reserved(db, 1, ["default".to_owned()]).unwrap();
        let f = Arc::new(Fencer::new(register, Duration::from_secs(1)));
        drop(f.admit("a", 1).await.unwrap());
        let err = f.admit("b", 1).await.err().unwrap();
        assert!(
            matches!(&err, ProxyError::ScopesFull { scope, scopes_max: 1 } if scope == "b"),
            "{err:?}"
        );
        assert_eq!(err.status(), http::StatusCode::INSUFFICIENT_STORAGE);
        assert_eq!(err.reason(), "scopes-full");
        assert!(err.to_string().contains("limits.scopes_max"), "{err}");
        assert!(!f.inflight.contains_key("b"));
        assert!(f.admit("default", 2).await.unwrap().raised);
    }
}
