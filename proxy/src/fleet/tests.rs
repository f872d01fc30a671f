//! The fleet's unit tests: admission under the lease, the overrun check, and how a
//! renewal round asks the nodes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use palisade_client::NodeApi;
use palisade_protocol::Scope;
use palisade_protocol::lease::{LeaseGrant, LeaseRequest, NOT_LEADER, UNKNOWN_PROXY};
use tokio::sync::watch;
use tokio::time::Instant;

use super::admission::check_overrun;
use super::renewer::{RENEW_HEDGE_MS, Refusal, first_grant};
use super::{Admission, Lease, Renewer};
use crate::error::ProxyError;
use crate::fencing::Fencer;

/// A fencer in fleet mode over a fresh database.
fn fleet_fencer(dir: &tempfile::TempDir, renew_ms: u64) -> (Arc<Fencer>, Arc<Lease>) {
    let db = palisade_storage::open_database(&dir.path().join("f.redb")).unwrap();
    let register = palisade_storage::FenceRegister::open(db, 100).unwrap();
    let lease = Arc::new(Lease::new(
        Duration::from_millis(renew_ms),
        Duration::from_millis(500),
    ));
    let fencer = Fencer::new(register, Duration::from_secs(5));
    (Arc::new(fencer), lease)
}

/// Admits a fenced request as the data path does in fleet mode.
async fn admit(
    fencer: &Arc<Fencer>,
    lease: &Lease,
    scope: &str,
    token: u64,
) -> Result<Admission, ProxyError> {
    Admission::admit(fencer, Some(lease), scope, token).await
}

#[expect(
    clippy::unnecessary_wraps,
    reason = "a round's result, as the source answers"
)]
fn grant(term: u64, lease_ms: u64) -> Result<LeaseGrant, String> {
    Ok(LeaseGrant {
        scope: Scope::new("s").unwrap(),
        term,
        leader_id: 1,
        lease_ms,
    })
}

/// A fake lease source: answers every demand with a round whose result the test
/// sets, and counts the rounds.
struct FakeSource {
    answer: Arc<std::sync::Mutex<Result<LeaseGrant, String>>>,
    rounds: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeSource {
    fn start(fencer: &Arc<Fencer>, lease: &Arc<Lease>, answer: Result<LeaseGrant, String>) -> Self {
        let answer = Arc::new(std::sync::Mutex::new(answer));
        let rounds = Arc::new(AtomicUsize::new(0));
        let (f, l, a, r) = (
            Arc::clone(fencer),
            Arc::clone(lease),
            Arc::clone(&answer),
            Arc::clone(&rounds),
        );
        let task = tokio::spawn(async move {
            loop {
                l.demand.notified().await;
                let round = l.begin_round();
                let result = a.lock().unwrap().clone();
                r.fetch_add(1, Ordering::SeqCst);
                l.finish_round(&f, round, result).await;
            }
        });
        Self {
            answer,
            rounds,
            task,
        }
    }

    fn answer(&self, answer: Result<LeaseGrant, String>) {
        *self.answer.lock().unwrap() = answer;
    }

    fn rounds(&self) -> usize {
        self.rounds.load(Ordering::SeqCst)
    }
}

/// Goal: with no lease a write waits for a renewal and is admitted at the granted
/// term; while the lease holds, equal tokens pass without renewing; once it lapses
/// and renewals fail, writes are 503 lease-expired naming the cause, and with no
/// answer at all 503 naming the renewal timeout.
/// Method: a fake lease source granting term 5 for 1 s, then failing, then stopped;
/// paused time moved past the lease (the fence is raised to 5 before pausing, so no
/// blocking fsync runs while time is paused).
#[tokio::test]
async fn equal_token_needs_a_valid_lease_and_a_lapsed_one_is_503() {
    let dir = tempfile::tempdir().unwrap();
    let (fencer, lease) = fleet_fencer(&dir, 200);
    drop(fencer.admit("s", 5).await.unwrap());
    tokio::time::pause();
    let source = FakeSource::start(&fencer, &lease, grant(5, 1_000));

    let admitted = admit(&fencer, &lease, "s", 5).await.unwrap();
    assert!(admitted.forward_until().is_some());
    drop(admitted);
    assert_eq!(source.rounds(), 1);
    for _ in 0..10 {
        drop(admit(&fencer, &lease, "s", 5).await.unwrap());
    }
    assert_eq!(
        source.rounds(),
        1,
        "equal tokens under a valid lease renew nothing"
    );
    assert!(lease.view().valid);

    source.answer(Err("all nodes unreachable".into()));
    tokio::time::advance(Duration::from_millis(1_001)).await;
    assert!(!lease.view().valid);
    let err = admit(&fencer, &lease, "s", 5).await.err().unwrap();
    assert!(
        matches!(&err, ProxyError::LeaseExpired { presented: 5, reason, .. }
        if reason.contains("all nodes unreachable")),
        "{err}"
    );
    assert_eq!(err.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(err.reason(), "lease-expired");

    source.task.abort();
    let err = admit(&fencer, &lease, "s", 5).await.err().unwrap();
    assert!(
        matches!(&err, ProxyError::LeaseExpired { reason, .. }
        if reason.contains("limits.lease_renew_timeout_ms")),
        "{err}"
    );
    assert!(
        fencer.busy_scopes() == 0,
        "refused writes leave nothing in flight"
    );
}

/// Goal: a burst of writes with a token above the lease's term makes one renewal
/// (single flight), the grant raises the fence durably, and then a lower token is
/// stale and a higher one never issued (409 both).
/// Method: lease at 5; the source now grants 6; 20 concurrent writes of 6; then 5
/// and 7.
#[tokio::test]
async fn higher_token_renews_once_for_a_burst_and_raises_the_fence() {
    let dir = tempfile::tempdir().unwrap();
    let (fencer, lease) = fleet_fencer(&dir, 5_000);
    let source = FakeSource::start(&fencer, &lease, grant(5, 60_000));
    drop(admit(&fencer, &lease, "s", 5).await.unwrap());
    assert_eq!(fencer.fence_register().current("s"), 5);
    source.answer(grant(6, 60_000));
    let before = source.rounds();
    let writes: Vec<_> = (0..20)
        .map(|_| {
            let (f, l) = (Arc::clone(&fencer), Arc::clone(&lease));
            tokio::spawn(async move { admit(&f, &l, "s", 6).await.map(drop) })
        })
        .collect();
    for w in writes {
        w.await.unwrap().unwrap();
    }
    // One round for the burst, and at most one more from a demand stored while it
    // was under way.
    assert!(
        source.rounds() - before <= 2,
        "{} rounds",
        source.rounds() - before
    );
    assert_eq!(fencer.fence_register().current("s"), 6);
    assert_eq!(lease.view().term, 6);

    let err = admit(&fencer, &lease, "s", 5).await.err().unwrap();
    assert!(
        matches!(
            err,
            ProxyError::Stale {
                presented: 5,
                current: 6,
                ..
            }
        ),
        "{err}"
    );
    let err = admit(&fencer, &lease, "s", 7).await.err().unwrap();
    assert!(
        matches!(
            err,
            ProxyError::NotIssued {
                presented: 7,
                current: 6,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.status(), http::StatusCode::CONFLICT);
    assert_eq!(
        fencer.fence_register().current("s"),
        6,
        "an unissued token moves nothing"
    );
}

/// Goal: a token above the lease's term with a failed renewal is 503, not 409: the
/// cluster may have moved on without this proxy hearing of it. And a scope other
/// than the cluster's is refused with 403 foreign-scope.
/// Method: lease at 5, the source fails, write 6; write to scope `t`.
#[tokio::test]
async fn failed_renewal_for_a_higher_token_is_503_and_other_scopes_are_403() {
    let dir = tempfile::tempdir().unwrap();
    let (fencer, lease) = fleet_fencer(&dir, 5_000);
    let source = FakeSource::start(&fencer, &lease, grant(5, 60_000));
    drop(admit(&fencer, &lease, "s", 5).await.unwrap());
    source.answer(Err("node 2: not leader".into()));
    let err = admit(&fencer, &lease, "s", 6).await.err().unwrap();
    assert!(
        matches!(&err, ProxyError::LeaseExpired { presented: 6, reason, .. }
        if reason.contains("not leader")),
        "{err}"
    );
    assert_eq!(fencer.fence_register().current("s"), 5);
    let err = admit(&fencer, &lease, "t", 5).await.err().unwrap();
    assert!(
        matches!(&err, ProxyError::ForeignScope { cluster_scope, .. } if cluster_scope == "s"),
        "{err}"
    );
    assert_eq!(err.status(), http::StatusCode::FORBIDDEN);
    // The admin advance (an announce) needs no lease.
    drop(fencer.admit("s", 9).await.unwrap());
    assert_eq!(fencer.fence_register().current("s"), 9);
}

/// Goal: a grant of a new term raises the fence only once the lower-token write in
/// flight is done (the barrier), and only then publishes the term.
/// Method: hold an admitted write of 5, finish a round granting 6 in a task; show it
/// has not finished while 5 is held (a negative check, so a fixed wait), release 5.
#[tokio::test]
async fn new_term_is_published_after_lower_writes_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let (fencer, lease) = fleet_fencer(&dir, 5_000);
    let round = lease.begin_round();
    lease.finish_round(&fencer, round, grant(5, 60_000)).await;
    let held = admit(&fencer, &lease, "s", 5).await.unwrap();
    let (f, l) = (Arc::clone(&fencer), Arc::clone(&lease));
    let round = lease.begin_round();
    let round = tokio::spawn(async move { l.finish_round(&f, round, grant(6, 60_000)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!round.is_finished());
    assert_eq!(
        lease.view().term,
        5,
        "the new term waits for the write in flight"
    );
    drop(held);
    round.await.unwrap();
    assert_eq!(lease.view().term, 6);
    assert_eq!(lease.view().renewals, 2);
}

/// Goal: a write that completes after its lease's expiry plus the write bound is an
/// overrun; one that completes in time is not.
/// Method: paused time; check deadlines either side.
#[tokio::test(start_paused = true)]
async fn overrun_is_a_write_completing_past_lease_plus_bound() {
    let lease = Lease::new(Duration::from_secs(1), Duration::from_millis(500));
    lease.publish(3, 1, lease.now_ns() + 1_000_000_000);
    let lands_by = lease.expiry(lease.current().unwrap()) + lease.write_bound;
    tokio::time::advance(Duration::from_millis(1_400)).await;
    assert!(!check_overrun(lands_by, "s", 3));
    tokio::time::advance(Duration::from_millis(200)).await;
    assert!(check_overrun(lands_by, "s", 3));
}

/// A fake cluster for [`first_grant`]: what each node answers at a given moment
/// after the round started, and how often each was asked.
struct FakeNodes {
    start: Instant,
    asked: Arc<Vec<AtomicUsize>>,
}

/// What a fake node does when asked.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Never answers (a paused or dead node).
    Paused,
    /// Refuses with this kind until the given moment after the start, then grants
    /// `term` after 5 ms (a leader's round).
    LeaderFrom(&'static str, Duration, u64),
}

impl FakeNodes {
    fn new(count: usize) -> Self {
        Self {
            start: Instant::now(),
            asked: Arc::new((0..count).map(|_| AtomicUsize::new(0)).collect()),
        }
    }

    fn asked(&self, index: usize) -> usize {
        self.asked[index].load(Ordering::SeqCst)
    }

    /// The `ask` of [`first_grant`] over `nodes`.
    fn ask(
        &self,
        nodes: Vec<Behaviour>,
    ) -> impl Fn(
        usize,
        Duration,
    ) -> std::pin::Pin<
        Box<dyn Future<Output = Result<LeaseGrant, Refusal>> + Send + 'static>,
    > {
        let (start, asked) = (self.start, Arc::clone(&self.asked));
        move |index, timeout| {
            let behaviour = nodes[index];
            let asked = Arc::clone(&asked);
            Box::pin(async move {
                asked[index].fetch_add(1, Ordering::SeqCst);
                let answer = async {
                    match behaviour {
                        Behaviour::Paused => std::future::pending().await,
                        Behaviour::LeaderFrom(kind, from, term) => {
                            if start.elapsed() < from {
                                Err((kind, format!("node {index}: {kind}")))
                            } else {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                                Ok(grant(term, 3_000).unwrap())
                            }
                        }
                    }
                };
                tokio::time::timeout(timeout, answer)
                    .await
                    .unwrap_or_else(|_| Err(("unreachable", "timed out".to_owned())))
            })
        }
    }
}

const HEDGE: Duration = Duration::from_millis(RENEW_HEDGE_MS);
const TIMEOUT: Duration = Duration::from_millis(crate::config::LEASE_RENEW_TIMEOUT_MS_DEFAULT);
const NEVER: Duration = Duration::from_secs(3_600);
const NOW: Duration = Duration::ZERO;

/// Goal: a paused node asked first costs a timer renewal the hedge delay, not the
/// renewal timeout; a renewal a request waits for asks every node at once, so the
/// paused node costs it nothing; a node asked first that refuses at once makes the
/// others be asked at once.
/// Method: paused time; node 0 never answers, node 1 leads (grants 5 ms after being
/// asked), node 2 answers not-leader; the moment of the grant is exact.
#[tokio::test(start_paused = true)]
async fn a_paused_node_costs_the_hedge_or_nothing() {
    use Behaviour::{LeaderFrom, Paused};
    let cluster = vec![
        Paused,
        LeaderFrom(NOT_LEADER, NOW, 4),
        LeaderFrom(NOT_LEADER, NEVER, 0),
    ];
    let nodes = FakeNodes::new(3);
    let got = first_grant(3, Some(0), HEDGE, TIMEOUT, nodes.ask(cluster.clone())).await;
    assert_eq!(got.unwrap().0, 1);
    assert_eq!(nodes.start.elapsed(), HEDGE + Duration::from_millis(5));
    assert_eq!((nodes.asked(0), nodes.asked(1)), (1, 1));

    let nodes = FakeNodes::new(3);
    let got = first_grant(3, None, HEDGE, TIMEOUT, nodes.ask(cluster.clone())).await;
    assert_eq!(got.unwrap(), (1, grant(4, 3_000).unwrap()));
    assert_eq!(nodes.start.elapsed(), Duration::from_millis(5));

    let nodes = FakeNodes::new(3);
    let got = first_grant(3, Some(2), HEDGE, TIMEOUT, nodes.ask(cluster)).await;
    assert_eq!(got.unwrap().0, 1);
    assert_eq!(
        nodes.start.elapsed(),
        Duration::from_millis(5),
        "a refusal of the node asked first hedges at once"
    );
}

/// Goal: a round under way during an election is granted by the new leader within
/// the round, not after it failed: nodes that answer not-leader are asked again
/// with backoff, a few times, while the old leader never answers.
/// Method: paused time; node 0 never answers, node 1 leads from 400 ms, node 2
/// never leads; every node is asked at once.
#[tokio::test(start_paused = true)]
async fn a_round_during_an_election_is_granted_by_the_new_leader() {
    use Behaviour::{LeaderFrom, Paused};
    let nodes = FakeNodes::new(3);
    let cluster = vec![
        Paused,
        LeaderFrom(NOT_LEADER, Duration::from_millis(400), 5),
        LeaderFrom(NOT_LEADER, NEVER, 0),
    ];
    let got = first_grant(3, None, HEDGE, TIMEOUT, nodes.ask(cluster)).await;
    assert_eq!(got.unwrap(), (1, grant(5, 3_000).unwrap()));
    let waited = nodes.start.elapsed();
    assert!(
        waited > Duration::from_millis(400) && waited < TIMEOUT,
        "{waited:?}"
    );
    assert_eq!(
        nodes.asked(0),
        1,
        "a node that has not answered is not asked again"
    );
    assert!(
        (2..=8).contains(&nodes.asked(2)),
        "refusing nodes are asked again with backoff: {}",
        nodes.asked(2)
    );
}

/// Goal: a round in which no node grants fails at the renewal timeout at the latest,
/// naming each node's last answer; refusals no retry can change (unknown-proxy,
/// leases-off) are not asked again, and end the round at once when every node gave
/// one.
/// Method: paused time; one cluster with a paused node, one refusing this proxy.
#[tokio::test(start_paused = true)]
async fn a_round_without_a_grant_fails_naming_every_node() {
    use Behaviour::{LeaderFrom, Paused};
    let nodes = FakeNodes::new(2);
    let cluster = vec![Paused, LeaderFrom(NOT_LEADER, NEVER, 0)];
    let answers = first_grant(2, Some(0), HEDGE, TIMEOUT, nodes.ask(cluster))
        .await
        .unwrap_err();
    assert_eq!(nodes.start.elapsed(), TIMEOUT);
    assert_eq!(answers.len(), 2);
    assert_eq!(answers[0].1, "unreachable");
    assert!(
        answers[0].2.contains("lease_renew_timeout_ms"),
        "{}",
        answers[0].2
    );
    assert_eq!(answers[1].1, NOT_LEADER);

    let nodes = FakeNodes::new(3);
    let cluster = vec![LeaderFrom(UNKNOWN_PROXY, NEVER, 0); 3];
    let answers = first_grant(3, None, HEDGE, TIMEOUT, nodes.ask(cluster))
        .await
        .unwrap_err();
    assert_eq!(nodes.start.elapsed(), Duration::ZERO);
    assert!(
        answers
            .iter()
            .all(|(_, reason, _)| *reason == UNKNOWN_PROXY)
    );
    assert_eq!(
        (nodes.asked(0), nodes.asked(1), nodes.asked(2)),
        (1, 1, 1),
        "asked once each"
    );
}

/// A fake node API on 127.0.0.1 for the renewal task: `POST /v1/lease` grants the
/// term in `term` for 3 s (renewed every second), or never answers while it is 0 (a
/// paused node). It keeps every request it received.
async fn fake_node(
    term: Arc<AtomicU64>,
    received: Arc<std::sync::Mutex<Vec<LeaseRequest>>>,
) -> String {
    let app = axum::Router::new().route(
        palisade_protocol::lease::LEASE_PATH,
        axum::routing::post(move |axum::Json(request): axum::Json<LeaseRequest>| {
            let term = term.load(Ordering::SeqCst);
            received.lock().unwrap().push(request);
            async move {
                if term == 0 {
                    std::future::pending::<()>().await;
                }
                axum::Json(grant(term, 3_000).unwrap())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// Goal: a write with a token above the lease's term does not wait for a timer
/// renewal stuck on a paused node: its own renewal replaces it, asks every node at
/// once, is marked urgent, and the write is admitted within the renewal timeout.
/// Method: two fake nodes; B grants term 5 (so B is asked first from then on) while A
/// hangs; then B hangs and A grants 6; once a timer renewal has reached B, a write of
/// 6 is made; the first request A gets after that must be urgent (the timer renewal
/// would reach A only after its hedge, not urgent), and the write is admitted.
#[tokio::test]
async fn a_write_renewal_replaces_a_timer_renewal_stuck_on_a_paused_node() {
    let dir = tempfile::tempdir().unwrap();
    let (fencer, lease) = fleet_fencer(&dir, 1_000);
    let (a_term, b_term) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(5)));
    let (a_got, b_got) = (Arc::default(), Arc::default());
    let a = fake_node(Arc::clone(&a_term), Arc::clone(&a_got)).await;
    let b = fake_node(Arc::clone(&b_term), Arc::clone(&b_got)).await;
    let renewer = Renewer {
        lease: Arc::clone(&lease),
        fencer: Arc::clone(&fencer),
        nodes: vec![NodeApi::new(&a).unwrap(), NodeApi::new(&b).unwrap()],
        name: "http://127.0.0.1:1".to_owned(),
    };
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(renewer.run(stopped));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while lease.view().term != 5 {
        assert!(std::time::Instant::now() < deadline, "no grant of term 5");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    b_term.store(0, Ordering::SeqCst);
    a_term.store(6, Ordering::SeqCst);
    let asked_a = a_got.lock().unwrap().len();
    let asked_b = b_got.lock().unwrap().len();
    while b_got.lock().unwrap().len() == asked_b {
        assert!(
            std::time::Instant::now() < deadline,
            "no timer renewal reached B"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = std::time::Instant::now();
    let admitted = admit(&fencer, &lease, "s", 6).await;
    let waited = started.elapsed();
    assert!(admitted.is_ok(), "{:?}", admitted.err());
    assert!(waited < lease.renew_timeout, "the write waited {waited:?}");
    // The timer renewal would ask A only after the hedge (500 ms), not urgent: the
    // first request A sees is the write's own renewal.
    assert!(
        a_got.lock().unwrap()[asked_a].urgent,
        "A was first asked by the write's renewal, not by the timer renewal's hedge"
    );
    stop.send(true).unwrap();
    task.await.unwrap();
}

/// Goal: a cluster whose nodes grant no leases (started without `--lease-ms`) is named
/// as such, `--lease-ms` included, in the lease's refusal (which `/healthz` and the
/// status page show) and in every 503 a write then gets, also one whose own wait ended
/// on the renewal timeout; a grant clears it.
/// Method: a fake node answering 409 `leases-off`; run the renewal task; write twice;
/// then the node grants; wait for the refusal to clear.
#[tokio::test]
async fn a_cluster_without_leases_is_named_in_every_503_until_it_grants() {
    let dir = tempfile::tempdir().unwrap();
    let (fencer, lease) = fleet_fencer(&dir, 300);
    let term = Arc::new(AtomicU64::new(0));
    let serving = Arc::clone(&term);
    let app = axum::Router::new().route(
        palisade_protocol::lease::LEASE_PATH,
        axum::routing::post(move || {
            let term = serving.load(Ordering::SeqCst);
            async move {
                if term == 0 {
                    let problem = palisade_protocol::Problem::new(
                        http::StatusCode::CONFLICT,
                        palisade_protocol::lease::LEASES_OFF,
                        "node 1 runs without --lease-ms",
                    );
                    return Err(palisade_server::ApiProblem::from(problem));
                }
                Ok(axum::Json(grant(term, 3_000).unwrap()))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let renewer = Renewer {
        lease: Arc::clone(&lease),
        fencer: Arc::clone(&fencer),
        nodes: vec![NodeApi::new(&url).unwrap()],
        name: "http://127.0.0.1:1".to_owned(),
    };
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(renewer.run(stopped));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while lease.refusal().is_none() {
        assert!(std::time::Instant::now() < deadline, "no refusal recorded");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let refusal = lease.refusal().unwrap();
    assert!(
        refusal.contains("--lease-ms") && refusal.contains(&url),
        "{refusal}"
    );
    assert_eq!(lease.view().refusal.as_deref(), Some(refusal.as_str()));
    for _ in 0..2 {
        let err = admit(&fencer, &lease, "s", 1).await.err().unwrap();
        assert!(matches!(err, ProxyError::LeaseExpired { .. }), "{err}");
        assert!(err.to_string().contains(&refusal), "{err}");
    }
    term.store(4, Ordering::SeqCst);
    while lease.refusal().is_some() {
        assert!(std::time::Instant::now() < deadline, "the refusal stayed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(admit(&fencer, &lease, "s", 4).await.is_ok());
    stop.send(true).unwrap();
    task.await.unwrap();
}

/// Goal: each kind of setup refusal is named in the lease's refusal with what to fix: no
/// leases (`--lease-ms`), not listed (`--announce`), and a credential the nodes refuse for
/// this proxy's lease (the `proxy-NAME` certificate its entry names); none, no refusal.
#[test]
fn setup_refusals_name_what_to_fix() {
    let nodes = |n: &str| vec![n.to_owned()];
    let proxy = "http://127.0.0.1:8081";
    assert_eq!(super::renewer::refusal(&[], &[], &[], proxy), None);
    let off = super::renewer::refusal(&nodes("n1"), &[], &[], proxy).unwrap();
    assert!(off.contains("--lease-ms") && off.contains("n1"), "{off}");
    let unknown = super::renewer::refusal(&[], &nodes("n2"), &[], proxy).unwrap();
    assert!(
        unknown.contains("--announce") && unknown.contains(proxy),
        "{unknown}"
    );
    let forbidden = super::renewer::refusal(&[], &[], &nodes("n3"), proxy).unwrap();
    assert!(
        forbidden.contains("forbidden-role")
            && forbidden.contains("proxy-NAME")
            && forbidden.contains("n3"),
        "{forbidden}"
    );
}
