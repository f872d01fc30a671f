//! The proxies: the real admission of `palisade_proxy` (fence check, durable raise on
//! redb, in-flight barrier) over a fence register on in-memory redb that outlives
//! crashes; and behind each, a storage model that applies the writes it receives, in
//! arrival order, checking the tokens as it goes.
//!
//! A request's life at a proxy is one task in the proxy's task set: admission, the hop to
//! the storage, the apply, the hop back, then the in-flight guard is dropped. A crash
//! aborts every such task at its next await, as a killed process stops: a write still on
//! its way to the storage is lost with the connection, one already applied stays applied.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_proxy::ProxyError;
use palisade_proxy::fuzzing::Fences;
use palisade_storage::FenceRegister;
use redb::backends::InMemoryBackend;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::knobs::NAMED_SCOPES;
use crate::knobs::{
    ANNOUNCE_DELAY_MS, ANNOUNCE_LOSS_P, BARRIER_TIMEOUT_MS, HOP_DELAY_MS, HOP_STALL_MS,
    HOP_STALL_P, PROXY_COUNT, SCOPES_MAX,
};
use crate::sim::{SCOPE, Sim};
use crate::world::{World, lock};

/// How a write ended, as its worker sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Applied by the storage and answered.
    Applied,
    /// Refused with this HTTP status (409 stale, 503 barrier deadline, ...).
    Refused(u16),
    /// No answer: the proxy was down or crashed with the request (indeterminate).
    Lost,
}

/// One proxy: its durable fences, its running admission, its requests in flight.
struct Proxy {
    /// The fence register's redb, in memory; it outlives crashes, as a disk would.
    db: Arc<redb::Database>,
    /// The running admission; `None` while the proxy is down.
    fences: Option<Arc<Fences>>,
    /// Requests in flight (aborted on a crash).
    tasks: JoinSet<()>,
}

/// Every proxy.
pub struct Proxies {
    proxies: Vec<Mutex<Proxy>>,
}

/// Opens the admission over `db`, as a proxy does at start.
fn open(db: &Arc<redb::Database>) -> Result<Arc<Fences>, String> {
    let register = FenceRegister::open(Arc::clone(db), SCOPES_MAX).map_err(|e| e.to_string())?;
    let barrier = Duration::from_millis(BARRIER_TIMEOUT_MS);
    Ok(Arc::new(Fences::new_inline(register, barrier)))
}

impl Proxies {
    /// [`PROXY_COUNT`] proxies, down until [`Sim::start_proxy`].
    pub fn new() -> Self {
        let proxies = (0..PROXY_COUNT)
            .map(|_| {
                #[allow(clippy::expect_used)] // An in-memory database cannot fail.
                let db = redb::Database::builder()
                    .create_with_backend(InMemoryBackend::new())
                    .expect("an in-memory redb");
                Mutex::new(Proxy {
                    db: Arc::new(db),
                    fences: None,
                    tasks: JoinSet::new(),
                })
            })
            .collect();
        Self { proxies }
    }

    /// The ids of the proxies.
    pub fn ids(&self) -> Vec<u64> {
        (0..self.proxies.len() as u64).collect()
    }

    /// The running admission of proxy `p`.
    fn fences(&self, p: u64) -> Option<Arc<Fences>> {
        lock(&self.proxies[p as usize]).fences.clone()
    }

    /// Checks the fence of every simulated scope (the cluster's and the named ones) at
    /// every running proxy.
    pub fn check_fences(&self, world: &World, when: &str) {
        for p in self.ids() {
            if let Some(fences) = self.fences(p) {
                for scope in scopes() {
                    world.check_fence(p, scope, fences.register().current(scope), when);
                }
            }
        }
    }
}

/// Every scope the simulation writes in: the cluster's own, then the named ones.
pub fn scopes() -> impl Iterator<Item = &'static str> {
    std::iter::once(SCOPE).chain(NAMED_SCOPES)
}

/// A drawn hop delay: usually short, sometimes stalled.
fn hop_ms(world: &World) -> u64 {
    let ms = world.dice.draw(HOP_DELAY_MS);
    if world.dice.chance(HOP_STALL_P) {
        ms + world.dice.draw(HOP_STALL_MS)
    } else {
        ms
    }
}

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

impl Sim {
    /// Starts (or restarts) proxy `p` on its durable fences, and checks what it read back.
    pub fn start_proxy(self: &Arc<Self>, p: u64) {
        let mut proxy = lock(&self.proxies.proxies[p as usize]);
        if proxy.fences.is_some() {
            return;
        }
        match open(&proxy.db) {
            Ok(fences) => {
                let read: Vec<(&str, u64)> = scopes()
                    .map(|scope| (scope, fences.register().current(scope)))
                    .collect();
                proxy.fences = Some(fences);
                drop(proxy);
                self.world
                    .log(&format!("proxy p{p} started, fences {read:?}"));
                for (scope, fence) in read {
                    self.world
                        .check_fence(p, scope, fence, "read back at start");
                }
            }
            Err(err) => {
                drop(proxy);
                self.world
                    .violation(&format!("proxy p{p} cannot start: {err}"));
            }
        }
    }

    /// Crashes proxy `p`: every request in flight there stops where it is.
    pub fn crash_proxy(self: &Arc<Self>, p: u64) {
        let mut proxy = lock(&self.proxies.proxies[p as usize]);
        if proxy.fences.take().is_none() {
            return;
        }
        proxy.tasks.abort_all();
        drop(proxy);
        self.world.log(&format!("proxy p{p} crashed"));
    }

    /// Runs `request` as one of proxy `p`'s requests in flight; `None` when it is down.
    fn spawn_at(&self, p: u64, request: impl FnOnce(Arc<Fences>) -> futures_task::Request) -> bool {
        let mut proxy = lock(&self.proxies.proxies[p as usize]);
        let Some(fences) = proxy.fences.clone() else {
            return false;
        };
        // Reap the finished ones, so the set holds only what is in flight.
        while proxy.tasks.try_join_next().is_some() {}
        proxy.tasks.spawn(request(fences));
        true
    }

    /// Sends the write `what` with `token` of `scope` to proxy `p`, and waits for its
    /// answer: admission, the hop to the storage, the apply, the hop back.
    pub async fn write(
        self: &Arc<Self>,
        p: u64,
        scope: &'static str,
        token: u64,
        what: String,
    ) -> Answer {
        let (tx, rx) = oneshot::channel();
        let sim = Arc::clone(self);
        let sent = self.spawn_at(p, move |fences| {
            Box::pin(async move {
                let answer = sim.admit_and_forward(&fences, p, scope, token, &what).await;
                let _ = tx.send(answer);
            })
        });
        if !sent {
            return Answer::Lost;
        }
        rx.await.unwrap_or(Answer::Lost)
    }

    /// The proxy's side of one write.
    async fn admit_and_forward(
        &self,
        fences: &Fences,
        p: u64,
        scope: &str,
        token: u64,
        what: &str,
    ) -> Answer {
        let admitted = match fences.admit(scope, token).await {
            Ok(admitted) => admitted,
            Err(err) => {
                self.world.log(&format!(
                    "p{p} refused {what} token {token} of {scope}: {}",
                    refusal(&err)
                ));
                self.world
                    .check_fence(p, scope, fences.register().current(scope), "after refusal");
                return Answer::Refused(err.status().as_u16());
            }
        };
        let fence = fences.register().current(scope);
        self.world.log(&format!(
            "p{p} admitted {what} token {token} of {scope} (fence {fence}, raised {})",
            admitted.raised
        ));
        self.world.check_fence(p, scope, fence, "after admission");
        sleep_ms(hop_ms(&self.world)).await;
        // The storage applies the write as it arrives.
        self.world.check_apply(p, scope, token, what);
        {
            let mut stats = self.world.stats();
            if scope == SCOPE {
                stats.applied += 1;
            } else {
                stats.named_applied += 1;
            }
        }
        self.world.log(&format!(
            "storage of p{p} applied {what} token {token} of {scope}"
        ));
        sleep_ms(hop_ms(&self.world)).await;
        drop(admitted);
        Answer::Applied
    }

    /// The announcer's part, modelled: node `node`'s new `token` of `scope` (a term of
    /// the cluster's scope, or a named scope's grant) is posted to every proxy's admin API
    /// (an advance, admitted like a write), each after a drawn delay, some lost on the way.
    pub fn announce(self: &Arc<Self>, node: u64, scope: &'static str, token: u64) {
        for p in self.proxies.ids() {
            if self.world.dice.chance(ANNOUNCE_LOSS_P) {
                self.world.log(&format!(
                    "announce of {scope} {token} by node {node} to p{p} lost"
                ));
                continue;
            }
            let delay = self.world.dice.draw(ANNOUNCE_DELAY_MS);
            let sim = Arc::clone(self);
            tokio::spawn(async move {
                sleep_ms(delay).await;
                let sim2 = Arc::clone(&sim);
                sim.spawn_at(p, move |fences| {
                    Box::pin(async move {
                        let outcome = match fences.admit(scope, token).await {
                            Ok(a) => format!("advanced (raised {})", a.raised),
                            Err(err) => refusal(&err),
                        };
                        sim2.world.log(&format!(
                            "p{p} announce of {scope} {token} by node {node}: {outcome}"
                        ));
                        sim2.world.check_fence(
                            p,
                            scope,
                            fences.register().current(scope),
                            "after announce",
                        );
                    })
                });
            });
        }
    }
}

/// A refusal for the trace: its status and kind.
fn refusal(err: &ProxyError) -> String {
    let status = err.status().as_u16();
    match err {
        ProxyError::Stale { .. } => format!("{status} stale"),
        ProxyError::BarrierTimeout { .. } => format!("{status} barrier timeout"),
        other => format!("{status} {other}"),
    }
}

/// The boxed future type of a proxy's request task.
mod futures_task {
    use std::future::Future;
    use std::pin::Pin;

    /// One request's task at a proxy.
    pub type Request = Pin<Box<dyn Future<Output = ()> + Send>>;
}
