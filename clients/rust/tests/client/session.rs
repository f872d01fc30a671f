//! `Session` and the named-leadership calls of `NodeApi` against scripted nodes: small
//! HTTP servers that answer the session and scope routes as the contract describes
//! (sessions, keepalives, campaigns, `not-leader` with the leader's id), each told how
//! to misbehave, so that these tests do not depend on a real cluster. Time is paused
//! where the claim is about the loss rule's timing, so the checks are exact.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use palisade_client::{
    ClientError, DRIFT_PPM_DEFAULT, Grant, LeaderView, NodeApi, Problem, Role, Scope, ScopeView,
    Session, SessionLoss, SessionView,
};
use palisade_cluster::wait;
use palisade_protocol::lease::NOT_LEADER;
use palisade_protocol::problem::kind::{FENCE_PENDING, UNKNOWN_SESSION};
use palisade_protocol::scopes::{SessionRef, SessionRevoked, session_trusted_until};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until, timeout};

/// Longest any expected outcome may take (tokio time: virtual where time is paused).
const SEEN_TIMEOUT: Duration = Duration::from_secs(30);
/// The TTL the tests ask for: the contract's shortest, so real-time tests stay short.
const TTL: Duration = Duration::from_secs(1);
/// The session id every scripted node hands out.
const SESSION_ID: &str = "s-0001";

/// How a scripted node answers keepalives.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Keepalive {
    /// `{"id":..,"ttl_ms":..}`.
    Answer,
    /// Accepts the request and never answers (a paused leader).
    Hang,
    /// 404 `unknown-session`.
    Unknown,
}

/// What one scripted node says and does.
#[derive(Debug, Clone)]
struct Script {
    node_id: u64,
    /// The leader this node names (itself when it leads); 0 for none.
    leader_id: u64,
    keepalive: Keepalive,
    /// `fence-pending` answers to give before granting a campaign.
    fence_pending: u32,
}

impl Script {
    fn leads(&self) -> bool {
        self.leader_id == self.node_id
    }
}

/// Requests a scripted node received, by route.
#[derive(Debug, Default)]
struct Seen {
    opens: AtomicU64,
    keepalives: AtomicU64,
    campaigns: AtomicU64,
    revokes: AtomicU64,
}

/// A scripted node on 127.0.0.1; stops (connections refused) when dropped.
struct FakeNode {
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeNode {
    async fn start(script: Script) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let script = Arc::new(Mutex::new(script));
        let seen = Arc::new(Seen::default());
        let (shared, counts) = (Arc::clone(&script), Arc::clone(&seen));
        // Connections live in a JoinSet owned by the server task, so aborting the task
        // closes them too.
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (script, seen) = (Arc::clone(&shared), Arc::clone(&counts));
                connections.spawn(async move {
                    let service =
                        service_fn(move |req| answer(Arc::clone(&script), Arc::clone(&seen), req));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            script,
            seen,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn update(&self, change: impl FnOnce(&mut Script)) {
        change(&mut self.script.lock().unwrap());
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A node that leads itself (id `id`) and answers everything.
fn leader(id: u64) -> Script {
    Script {
        node_id: id,
        leader_id: id,
        keepalive: Keepalive::Answer,
        fence_pending: 0,
    }
}

/// A node (id `id`) that follows `leader_id`.
fn follower(id: u64, leader_id: u64) -> Script {
    Script {
        leader_id,
        ..leader(id)
    }
}

fn json(status: StatusCode, body: &impl serde::Serialize) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap())))
        .unwrap()
}

fn problem(status: StatusCode, kind: &str, script: &Script) -> Response<Full<Bytes>> {
    let leader_id = Some(script.leader_id).filter(|id| *id != 0);
    let body = Problem::new(status, kind, kind).with_node(script.node_id, leader_id);
    let mut response = json(status, &body);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        "application/problem+json".parse().unwrap(),
    );
    response
}

/// The node's routes, as the contract gives them.
async fn answer(
    script: Arc<Mutex<Script>>,
    seen: Arc<Seen>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let body = request
        .into_body()
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    let now = script.lock().unwrap().clone();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let leader_only = !matches!(segments.as_slice(), ["v1", "leader"]) && method != Method::GET;
    if leader_only && !now.leads() {
        return Ok(problem(StatusCode::SERVICE_UNAVAILABLE, NOT_LEADER, &now));
    }
    let response = match (&method, segments.as_slice()) {
        (&Method::GET, ["v1", "leader"]) => json(
            StatusCode::OK,
            &LeaderView {
                node_id: now.node_id,
                scope: Scope::default(),
                term: 3,
                leader_id: Some(now.leader_id),
                role: if now.leads() {
                    Role::Leader
                } else {
                    Role::Follower
                },
                token: now.leads().then_some(3),
                announced: true,
                proof: None,
                lease_ms: None,
                released: None,
                scores: None,
                score_oracle: None,
            },
        ),
        (&Method::POST, ["v1", "sessions"]) => {
            seen.opens.fetch_add(1, Ordering::SeqCst);
            let asked: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let view = SessionView {
                id: SESSION_ID.to_owned(),
                ttl_ms: asked["ttl_ms"].as_u64().unwrap(),
            };
            json(StatusCode::OK, &view)
        }
        (&Method::POST, ["v1", "sessions", id, "keepalive"]) => {
            seen.keepalives.fetch_add(1, Ordering::SeqCst);
            match now.keepalive {
                Keepalive::Answer => json(
                    StatusCode::OK,
                    &SessionView {
                        id: (*id).to_owned(),
                        ttl_ms: 1_000,
                    },
                ),
                Keepalive::Hang => std::future::pending().await,
                Keepalive::Unknown => problem(StatusCode::NOT_FOUND, UNKNOWN_SESSION, &now),
            }
        }
        (&Method::DELETE, ["v1", "sessions", id]) => {
            seen.revokes.fetch_add(1, Ordering::SeqCst);
            json(
                StatusCode::OK,
                &SessionRevoked {
                    id: (*id).to_owned(),
                    released: vec!["jobs".to_owned()],
                },
            )
        }
        (&Method::POST, ["v1", "scopes", scope, "campaign"]) => {
            seen.campaigns.fetch_add(1, Ordering::SeqCst);
            let by: SessionRef = serde_json::from_slice(&body).unwrap();
            let pending = {
                let mut script = script.lock().unwrap();
                let pending = script.fence_pending > 0;
                script.fence_pending = script.fence_pending.saturating_sub(1);
                pending
            };
            if pending {
                problem(StatusCode::SERVICE_UNAVAILABLE, FENCE_PENDING, &now)
            } else {
                json(
                    StatusCode::OK,
                    &Grant {
                        scope: (*scope).to_owned(),
                        token: 41,
                        proof: None,
                        session: by.session,
                    },
                )
            }
        }
        (&Method::GET, ["v1", "scopes", scope]) => json(
            StatusCode::OK,
            &ScopeView {
                scope: (*scope).to_owned(),
                session: Some(SESSION_ID.to_owned()),
                token: Some(41),
                proof: None,
            },
        ),
        _ => problem(StatusCode::NOT_FOUND, "not-found", &now),
    };
    Ok(response)
}

/// Goal: a session whose keepalives are never answered is lost no later than the trust
/// the open gave (its send plus the TTL less the drift bound), and not a moment before.
/// Method: paused time; a leader that answers the open and hangs every keepalive; check
/// `is_lost` just before and at `trusted_until`, and that `lost()` resolved by then
/// (within the timer's 1 ms granularity) with the expiry as its cause.
#[tokio::test(start_paused = true)]
async fn an_unanswered_keepalive_loses_the_session_by_trusted_until() {
    let node = FakeNode::start(Script {
        keepalive: Keepalive::Hang,
        ..leader(1)
    })
    .await;
    let before = Instant::now();
    let session = Session::builder([node.url()])
        .ttl(TTL)
        .open()
        .await
        .unwrap();
    let opened = Instant::now();
    let until = Instant::from_std(session.trusted_until());
    let trust = |sent: Instant| {
        Instant::from_std(session_trusted_until(
            sent.into_std(),
            TTL,
            DRIFT_PPM_DEFAULT,
        ))
    };
    assert!(
        trust(before) <= until && until <= trust(opened),
        "the trust counts from the open's send"
    );
    assert!(!session.is_lost());

    sleep_until(until - Duration::from_millis(1)).await;
    assert!(!session.is_lost(), "lost before its trust ran out");
    assert!(
        node.seen.keepalives.load(Ordering::SeqCst) >= 1,
        "keepalives were sent"
    );
    let loss = timeout(SEEN_TIMEOUT, session.lost()).await.unwrap();
    assert!(
        Instant::now() <= until + Duration::from_millis(1),
        "lost() resolved {:?} after trusted_until",
        Instant::now() - until
    );
    assert!(session.is_lost());
    assert!(
        matches!(
            loss,
            SessionLoss::Expired {
                ttl_ms: 1_000,
                last_error: Some(_),
                ..
            }
        ),
        "{loss}"
    );
    assert_eq!(
        Instant::from_std(session.trusted_until()),
        until,
        "an unanswered keepalive gives no trust"
    );
    let err = session
        .campaign("jobs", Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::SessionLost { .. }), "{err}");
}

/// Goal: answered keepalives move the trust forward, each from its own send, so that a
/// session kept alive is never lost. Method: paused time; a leader that answers; after
/// several TTLs the session is still trusted, its trust ends within a TTL of now, and
/// keepalives came about every third of the TTL.
#[tokio::test(start_paused = true)]
async fn answered_keepalives_keep_the_session_trusted() {
    let node = FakeNode::start(leader(1)).await;
    let session = Session::builder([node.url()])
        .ttl(TTL)
        .open()
        .await
        .unwrap();
    let start = Instant::now();
    tokio::select! {
        loss = session.lost() => panic!("lost: {loss}"),
        () = sleep_until(start + 5 * TTL) => {}
    }
    assert!(!session.is_lost());
    let until = Instant::from_std(session.trusted_until());
    assert!(until > Instant::now() && until <= Instant::now() + TTL);
    let keepalives = node.seen.keepalives.load(Ordering::SeqCst);
    assert!(
        (13..=16).contains(&keepalives),
        "{keepalives} keepalives in 5 TTLs"
    );
}

/// Goal: a 404 `unknown-session` loses the session at once, long before its trust would
/// have run out. Method: paused time; a leader that answers the open and then 404s the
/// first keepalive; `lost()` resolves with `Unknown` before `trusted_until`.
#[tokio::test(start_paused = true)]
async fn an_unknown_session_answer_loses_the_session_at_once() {
    let node = FakeNode::start(Script {
        keepalive: Keepalive::Unknown,
        ..leader(1)
    })
    .await;
    let session = Session::builder([node.url()])
        .ttl(TTL)
        .open()
        .await
        .unwrap();
    let until = Instant::from_std(session.trusted_until());
    let loss = timeout(SEEN_TIMEOUT, session.lost()).await.unwrap();
    assert_eq!(loss, SessionLoss::Unknown);
    assert!(
        Instant::now() + TTL / 2 < until,
        "lost at the first keepalive (a third of the TTL), not at the trust's end"
    );
    assert!(session.is_lost());
    assert_eq!(node.seen.keepalives.load(Ordering::SeqCst), 1);
}

/// Goal: the session finds the leader among the nodes, and when the leader moves, a
/// `not-leader` answer naming the new leader moves the keepalives (and campaigns) to
/// that node, mapped from its id to its URL. Method: three nodes, node 2 leads; open,
/// then make node 3 the leader (nodes 1 and 2 answer `not-leader` naming 3); node 3
/// receives the keepalives, the session stays trusted, and a campaign is granted by it.
#[tokio::test(start_paused = true)]
async fn a_not_leader_answer_moves_the_session_to_the_node_named() {
    let nodes = [
        FakeNode::start(follower(1, 2)).await,
        FakeNode::start(leader(2)).await,
        FakeNode::start(follower(3, 2)).await,
    ];
    let session = Session::builder(nodes.iter().map(FakeNode::url))
        .ttl(TTL)
        .open()
        .await
        .unwrap();
    assert_eq!(nodes[1].seen.opens.load(Ordering::SeqCst), 1);
    assert_eq!(
        nodes[0].seen.opens.load(Ordering::SeqCst),
        0,
        "asked the leader first"
    );

    for node in &nodes {
        node.update(|s| s.leader_id = 3);
    }
    let moved = wait::poll(SEEN_TIMEOUT, || {
        std::future::ready((nodes[2].seen.keepalives.load(Ordering::SeqCst) >= 3).then_some(()))
    })
    .await;
    assert!(moved.is_some(), "node 3 never received keepalives");
    assert!(!session.is_lost(), "{:?}", session.loss());
    let grant = session
        .campaign("jobs", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(grant.token, 41);
    assert_eq!(nodes[2].seen.campaigns.load(Ordering::SeqCst), 1);
    assert_eq!(nodes[1].seen.campaigns.load(Ordering::SeqCst), 0);
}

/// Goal: a campaign returns the grant for its scope and session, asking again after
/// `fence-pending` (held, not yet fenced everywhere) within its timeout; revoking asks
/// the leader. Method: a leader that answers `fence-pending` twice before granting.
#[tokio::test(start_paused = true)]
async fn campaign_returns_the_grant_after_fence_pending() {
    let node = FakeNode::start(Script {
        fence_pending: 2,
        ..leader(1)
    })
    .await;
    let session = Session::builder([node.url()])
        .ttl(TTL)
        .open()
        .await
        .unwrap();
    let grant = session
        .campaign("jobs", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        grant,
        Grant {
            scope: "jobs".into(),
            token: 41,
            proof: None,
            session: session.id().to_owned()
        }
    );
    assert_eq!(node.seen.campaigns.load(Ordering::SeqCst), 3);
    let view = session
        .observe("jobs", Some(40), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(view.token, Some(41));
    let revoked = session.revoke().await.unwrap();
    assert_eq!(revoked.released, vec!["jobs".to_owned()]);
    assert_eq!(node.seen.revokes.load(Ordering::SeqCst), 1);
}

/// Goal: a campaign whose scope stays `fence-pending` gives up at its timeout with that
/// answer, not later. Method: paused time; a leader that never stops answering
/// `fence-pending`; the error comes at the timeout.
#[tokio::test(start_paused = true)]
async fn a_campaign_gives_up_at_its_timeout() {
    let node = FakeNode::start(Script {
        fence_pending: u32::MAX,
        ..leader(1)
    })
    .await;
    let session = Session::builder([node.url()])
        .ttl(TTL)
        .open()
        .await
        .unwrap();
    let start = Instant::now();
    let err = session
        .campaign("jobs", Duration::from_secs(2))
        .await
        .unwrap_err();
    assert_eq!(err.problem_kind(), Some(FENCE_PENDING), "{err}");
    let took = Instant::now() - start;
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_millis(2_500),
        "{took:?}"
    );
}

/// Goal: `NodeApi` maps the answers that matter to typed errors: `not-leader` with the
/// leader's id, `unknown-session` with the session's id; and hostile ids and scopes are
/// refused before sending. Method: a follower and a leader that 404s keepalives.
#[tokio::test]
async fn node_api_answers_are_typed() {
    let follower = FakeNode::start(follower(1, 2)).await;
    let api = NodeApi::new(&follower.url()).unwrap();
    let err = api.open_session(TTL).await.unwrap_err();
    let ClientError::NodeNotLeader {
        node_id, leader_id, ..
    } = err
    else {
        panic!("{err}");
    };
    assert_eq!((node_id, leader_id), (Some(1), Some(2)));

    let gone = FakeNode::start(Script {
        keepalive: Keepalive::Unknown,
        ..leader(1)
    })
    .await;
    let api = NodeApi::new(&gone.url()).unwrap();
    let err = api.keepalive("s-9").await.unwrap_err();
    assert!(
        matches!(&err, ClientError::UnknownSession { id } if id == "s-9"),
        "{err}"
    );
    for (id, scope) in [("../../v1/leader", "jobs"), ("s-1", ".."), ("s-1", "a/b")] {
        let err = api
            .campaign(scope, id, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::InvalidRequest(_)), "{err}");
    }
    assert_eq!(gone.seen.campaigns.load(Ordering::SeqCst), 0);
    let view = api.scope("jobs").await.unwrap();
    assert_eq!(view.session.as_deref(), Some(SESSION_ID));
}
