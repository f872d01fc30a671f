//! The clients of named leaderships: holders that are not raft members. Each, forever:
//! opens a session at the leader (following a `NotLeader` answer to the leader it names,
//! as the clients do), keeps it alive every third of its TTL in a task of its own,
//! campaigns for one of a few named scopes, and while it trusts its session writes
//! through a random proxy with the grant's token in that scope; sometimes it pauses
//! whole (a GC pause: its keepalives stop too) between checking its trust and sending;
//! then it resigns, revokes, or lets the session lapse.
//!
//! Every call goes through the node's own named-leaderships service
//! (`NodeHandle::scopes`, which the node API's routes call too), with a drawn hop each
//! way. A client trusts its session until the send time of its last answered keepalive
//! (or of its open) plus the TTL less the drift bound: the clients' loss rule
//! (`palisade_protocol::scopes::session_trusted_until`). What each client believes is
//! checked by the world (`World::grant_received`, `World::check_named_holders`); what
//! reached the storages is checked as for the cluster's scope.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_election::{ScopeError, ScopesService};
use palisade_protocol::scopes::session_trusted_until;
use tokio::time::Instant;

use crate::knobs::{
    CALL_POLL_MS, CAMPAIGN_TIMEOUT_MS, CAMPAIGN_TRIES, DRIFT_PPM, HOLD_WRITES, HOLDER_PAUSE_MS,
    HOLDER_PAUSE_P, HOLDER_THINK_MS, HOP_DELAY_MS, KEEPALIVE_DIVISOR, KEEPALIVE_RETRY_MS,
    NAMED_SCOPES, RELEASE_WEIGHTS, SESSION_TTL_MS, THINK_MS,
};
use crate::proxies::Answer;
use crate::sim::Sim;
use crate::world::lock;

/// HTTP 409: the proxy's answer to a token below its fence.
const CONFLICT: u16 = 409;

/// One session of a holder, shared by its main task and its keepalive task.
struct Session {
    id: String,
    ttl: Duration,
    /// The node that answered last: where the next call goes first.
    leader: Mutex<u64>,
    /// The whole client is paused until then (a GC pause): its keepalives wait too.
    frozen_until: Mutex<Instant>,
    /// A keepalive was answered 404: the cluster ended the session.
    lost: Mutex<bool>,
}

impl Session {
    fn leader(&self) -> u64 {
        *lock(&self.leader)
    }

    fn set_leader(&self, id: u64) {
        *lock(&self.leader) = id;
    }

    fn lost(&self) -> bool {
        *lock(&self.lost)
    }

    /// Pauses the whole client for `ms` from now.
    fn freeze(&self, ms: u64) {
        *lock(&self.frozen_until) = Instant::now() + Duration::from_millis(ms);
    }

    /// Waits while the client is paused.
    async fn thaw(&self) {
        loop {
            let until = *lock(&self.frozen_until);
            if until <= Instant::now() {
                return;
            }
            tokio::time::sleep_until(until).await;
        }
    }
}

/// A request in flight at a node; dropped with its client (the connection closes).
struct InFlight(tokio::task::JoinHandle<()>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How a hold ended.
enum HoldEnd {
    /// The client ended the session (revoked, or gave it up after a refusal).
    Ended,
    /// The client stopped keeping it alive; it believes what it held until its trust ends.
    Lapsed,
    /// The session was lost: 404 on a keepalive or a campaign, or its trust ran out.
    Lost,
}

/// The variant of a service error, for the trace.
fn short(err: &ScopeError) -> String {
    let text = format!("{err:?}");
    text.split([' ', '(', '{'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

impl Sim {
    /// Calls `f` on node `first`'s service, after the hop to it, and once more on the
    /// leader a `NotLeader` answer names; the node that answered and its answer, after
    /// the hop back. A node that is down answers `Stopped` (connection refused).
    ///
    /// The call runs as a task of its own (a request in flight at the node), and the
    /// holder looks for its answer every [`CALL_POLL_MS`] on its own timer. The service
    /// waits on the node's watch channels, whose waiters tokio wakes in a random order:
    /// a holder woken by its answer directly would act at a random place among the
    /// other tasks of that instant, and the run would not replay.
    async fn call<T, F, Fut>(&self, first: u64, f: F) -> (u64, Result<T, ScopeError>)
    where
        T: Send + 'static,
        F: Fn(ScopesService) -> Fut,
        Fut: Future<Output = Result<T, ScopeError>> + Send + 'static,
    {
        let mut target = first;
        let mut followed = false;
        loop {
            self.world.sleep_drawn(HOP_DELAY_MS).await;
            // The handle is not kept across the call: a crash must be able to take it.
            let Some(service) = self.cluster.node(target).map(|n| n.scopes()) else {
                return (target, Err(ScopeError::Stopped));
            };
            let answer = Arc::new(Mutex::new(None));
            let slot = Arc::clone(&answer);
            let request = f(service);
            let in_flight = InFlight(tokio::spawn(async move {
                let result = request.await;
                *lock(&slot) = Some(result);
            }));
            let result = loop {
                tokio::time::sleep(Duration::from_millis(CALL_POLL_MS)).await;
                if let Some(result) = lock(&answer).take() {
                    break result;
                }
            };
            drop(in_flight);
            self.world.sleep_drawn(HOP_DELAY_MS).await;
            match result {
                Err(ScopeError::NotLeader {
                    leader_id: Some(leader),
                }) if leader != target && !followed => {
                    followed = true;
                    target = leader;
                }
                other => return (target, other),
            }
        }
    }

    /// A member drawn from the seed, where a client asks when it knows no leader.
    fn any_member(&self) -> Option<u64> {
        let members = self.cluster.members();
        (!members.is_empty()).then(|| self.world.dice.pick(&members))
    }

    /// Holder `h`: forever, a session, a hold, and its end.
    pub async fn holder(self: Arc<Self>, h: u64) {
        let mut seq = 0u64;
        // Where it asks first: the node that answered it last, else its own by position.
        let mut hint: Option<u64> = None;
        loop {
            self.world.sleep_drawn(HOLDER_THINK_MS).await;
            let Some(session) = self.open_session(h, &mut hint).await else {
                continue;
            };
            let session = Arc::new(session);
            let keepalive = tokio::spawn(Arc::clone(&self).keep_alive(h, Arc::clone(&session)));
            let end = self.hold(h, &session, &mut seq).await;
            keepalive.abort();
            hint = Some(session.leader());
            match end {
                HoldEnd::Ended => self.world.session_ended(&session.id),
                HoldEnd::Lapsed => {}
                HoldEnd::Lost => {
                    self.world.stats().sessions_lost += 1;
                    self.world.session_ended(&session.id);
                }
            }
        }
    }

    /// Opens a session with a drawn TTL, at the leader: asked first at `hint`, which
    /// becomes the node that answered, or a drawn member after a failure.
    async fn open_session(&self, h: u64, hint: &mut Option<u64>) -> Option<Session> {
        let members = self.cluster.members();
        if members.is_empty() {
            return None;
        }
        let home = hint.unwrap_or(members[(h as usize) % members.len()]);
        let ttl_ms = self.world.dice.draw(SESSION_TTL_MS);
        let ttl = Duration::from_millis(ttl_ms);
        let sent = Instant::now();
        let (at, result) = self
            .call(home, |s| async move { s.open(ttl_ms, None).await })
            .await;
        match result {
            Ok(view) => {
                let until = self.trust_until(sent, ttl);
                self.world.log(&format!(
                    "h{h} opened session {} (ttl {ttl_ms} ms) at node {at}",
                    view.id
                ));
                self.world.session_opened(&view.id, h, until);
                Some(Session {
                    id: view.id,
                    ttl,
                    leader: Mutex::new(at),
                    frozen_until: Mutex::new(Instant::now()),
                    lost: Mutex::new(false),
                })
            }
            Err(err) => {
                self.world
                    .log(&format!("h{h} open at node {at}: {}", short(&err)));
                *hint = self.any_member();
                None
            }
        }
    }

    /// The end of the trust a keepalive (or open) sent at `sent` gives, in virtual
    /// microseconds: the clients' loss rule.
    fn trust_until(&self, sent: Instant, ttl: Duration) -> u64 {
        let until = session_trusted_until(sent.into_std(), ttl, DRIFT_PPM);
        self.world.us_at(Instant::from_std(until))
    }

    /// Keeps session `s` alive every third of its TTL until it is lost (or the task is
    /// aborted); each answered keepalive extends the client's trust.
    async fn keep_alive(self: Arc<Self>, h: u64, s: Arc<Session>) {
        let period = s.ttl / u32::try_from(KEEPALIVE_DIVISOR).unwrap_or(1);
        let mut wait = period;
        loop {
            tokio::time::sleep(wait).await;
            s.thaw().await;
            let sent = Instant::now();
            let id = s.id.clone();
            let (at, result) = self
                .call(s.leader(), move |svc| {
                    let id = id.clone();
                    async move { svc.keepalive(&id, None).await }
                })
                .await;
            s.thaw().await;
            match result {
                Ok(_) => {
                    s.set_leader(at);
                    let until = self.trust_until(sent, s.ttl);
                    self.world.log(&format!(
                        "h{h} keepalive of {} at node {at}: trusted until {} ms",
                        s.id,
                        until / 1_000
                    ));
                    self.world.session_trusted(&s.id, until);
                    wait = period.saturating_sub(sent.elapsed());
                }
                Err(ScopeError::UnknownSession { .. }) => {
                    self.world
                        .log(&format!("h{h} keepalive of {} at node {at}: lost", s.id));
                    *lock(&s.lost) = true;
                    return;
                }
                Err(err) => {
                    self.world.log(&format!(
                        "h{h} keepalive of {} at node {at}: {}",
                        s.id,
                        short(&err)
                    ));
                    if let Some(other) = self.any_member() {
                        s.set_leader(other);
                    }
                    wait = Duration::from_millis(self.world.dice.draw(KEEPALIVE_RETRY_MS));
                }
            }
        }
    }

    /// Whether the client may still act with `s`.
    fn usable(&self, s: &Session) -> bool {
        !s.lost() && self.world.trusts(&s.id)
    }

    /// Campaigns for a drawn scope, writes with the grant while the session is trusted,
    /// then ends the hold.
    async fn hold(self: &Arc<Self>, h: u64, s: &Session, seq: &mut u64) -> HoldEnd {
        let scope = self.world.dice.pick(&NAMED_SCOPES);
        let token = match self.campaign(h, s, scope).await {
            Ok(Some(token)) => token,
            Ok(None) => return self.release(h, s, None).await,
            Err(end) => return end,
        };
        for _ in 0..self.world.dice.draw(HOLD_WRITES) {
            self.world.sleep_drawn(THINK_MS).await;
            if !self.usable(s) {
                self.world.log(&format!(
                    "h{h} stops writing {scope}: session {} no longer trusted",
                    s.id
                ));
                return HoldEnd::Lost;
            }
            if self.world.dice.chance(HOLDER_PAUSE_P) {
                let ms = self.world.dice.draw(HOLDER_PAUSE_MS);
                self.world.log(&format!(
                    "h{h} pauses {ms} ms holding {scope} token {token}"
                ));
                s.freeze(ms);
                s.thaw().await;
            }
            let p = self.world.dice.pick(&self.proxies.ids());
            *seq += 1;
            let what = format!("h{h}#{seq}");
            self.world
                .log(&format!("{what} sends token {token} of {scope} to p{p}"));
            self.world.sleep_drawn(HOP_DELAY_MS).await;
            let answer = self.write(p, scope, token, what.clone()).await;
            self.world.log(&format!("{what} answered {answer:?}"));
            match answer {
                Answer::Applied => {}
                Answer::Refused(CONFLICT) => {
                    self.world.stats().named_stale += 1;
                    // Fenced out: the grant is over, whatever the client believed.
                    self.world.grant_released(&s.id);
                    return self.release(h, s, None).await;
                }
                Answer::Refused(_) | Answer::Lost => self.world.stats().unavailable += 1,
            }
        }
        self.release(h, s, Some(scope)).await
    }

    /// Campaigns for `scope` with `s`: the token of a grant received while the session
    /// is trusted; `None` when none came (timeout, tries used up); a hold's end when the
    /// session is lost.
    async fn campaign(
        &self,
        h: u64,
        s: &Session,
        scope: &'static str,
    ) -> Result<Option<u64>, HoldEnd> {
        let timeout = Duration::from_millis(self.world.dice.draw(CAMPAIGN_TIMEOUT_MS));
        for _ in 0..CAMPAIGN_TRIES {
            if !self.usable(s) {
                return Err(HoldEnd::Lost);
            }
            self.world.log(&format!(
                "h{h} campaigns for {scope} with {} ({} ms)",
                s.id,
                timeout.as_millis()
            ));
            let id = s.id.clone();
            let (at, result) = self
                .call(s.leader(), move |svc| {
                    let id = id.clone();
                    async move { svc.campaign(scope, &id, None, timeout).await }
                })
                .await;
            match result {
                Ok(grant) => {
                    s.set_leader(at);
                    let used = self.world.grant_received(&s.id, scope, grant.token);
                    self.world.log(&format!(
                        "h{h} granted {scope} token {} by node {at}{}",
                        grant.token,
                        if used {
                            ""
                        } else {
                            " after its trust ended: unused"
                        }
                    ));
                    return if used {
                        Ok(Some(grant.token))
                    } else {
                        Err(HoldEnd::Lost)
                    };
                }
                Err(ScopeError::CampaignTimeout { .. }) => {
                    self.world.stats().campaign_timeouts += 1;
                    self.world
                        .log(&format!("h{h} campaign for {scope} timed out"));
                    return Ok(None);
                }
                Err(ScopeError::UnknownSession { .. }) => {
                    self.world
                        .log(&format!("h{h} campaign for {scope}: session lost"));
                    return Err(HoldEnd::Lost);
                }
                Err(err) => {
                    self.world.log(&format!(
                        "h{h} campaign for {scope} at node {at}: {}",
                        short(&err)
                    ));
                    if !matches!(err, ScopeError::FencePending { .. })
                        && let Some(other) = self.any_member()
                    {
                        s.set_leader(other);
                    }
                    self.world.sleep_drawn(KEEPALIVE_RETRY_MS).await;
                }
            }
        }
        Ok(None)
    }

    /// Ends a hold, by drawn weight: resign `scope` (when it holds one) then revoke or
    /// let the session lapse; revoke; or let it lapse, believing what it holds until its
    /// trust ends.
    async fn release(&self, h: u64, s: &Session, scope: Option<&'static str>) -> HoldEnd {
        let (resign, revoke, lapse) = RELEASE_WEIGHTS;
        let pick = self.world.dice.draw((0, resign + revoke + lapse));
        let id = s.id.clone();
        if let (Some(scope), true) = (scope, pick < resign) {
            // It stops using the grant before it resigns.
            self.world.grant_released(&s.id);
            let (at, result) = self
                .call(s.leader(), |svc| {
                    let id = id.clone();
                    async move { svc.resign(scope, &id, None).await }
                })
                .await;
            let outcome = match result {
                Ok(r) => format!("released {}", r.released),
                Err(err) => short(&err),
            };
            self.world
                .log(&format!("h{h} resigns {scope} at node {at}: {outcome}"));
            if self.world.dice.chance(0.5) {
                self.world.log(&format!("h{h} lets session {id} lapse"));
                return HoldEnd::Lapsed;
            }
        } else if pick >= resign + revoke {
            self.world.log(&format!("h{h} lets session {id} lapse"));
            return HoldEnd::Lapsed;
        }
        self.world.grant_released(&s.id);
        let (at, result) = self
            .call(s.leader(), |svc| {
                let id = id.clone();
                async move { svc.revoke(&id, None).await }
            })
            .await;
        let outcome = match result {
            Ok(r) => format!("released {:?}", r.released),
            Err(err) => short(&err),
        };
        self.world
            .log(&format!("h{h} revokes {id} at node {at}: {outcome}"));
        HoldEnd::Ended
    }
}
