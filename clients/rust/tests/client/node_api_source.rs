//! `NodeApiSource` against a scripted node: a small HTTP server that answers
//! `GET /v1/leader` with the long poll as the contract describes, so these tests do not
//! depend on a real raft group.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use palisade_client::{LeaderView, Leadership, NodeApiSource, Role, Scope, TokenSource};
use palisade_cluster::wait;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Longest any expected change may take to be seen.
const SEEN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq)]
struct View {
    term: u64,
    role: Role,
    token: Option<u64>,
    /// While true the node accepts connections but never answers (a paused process).
    hung: bool,
}

/// What the scripted node answered: whether the request was a long poll, and the token
/// in the answer.
type Answers = Arc<std::sync::Mutex<Vec<(bool, Option<u64>)>>>;

/// A scripted node API; stops (connections refused) when dropped or `stop`ped.
struct FakeNode {
    addr: SocketAddr,
    view: Arc<watch::Sender<View>>,
    answers: Answers,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl FakeNode {
    async fn start(initial: View) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let view = Arc::new(watch::channel(initial).0);
        let shared = Arc::clone(&view);
        let answers = Answers::default();
        let log = Arc::clone(&answers);
        // Connections live in a JoinSet owned by the server task, so aborting the task
        // closes them too (pooled keep-alive connections included).
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let view = Arc::clone(&shared);
                let log = Arc::clone(&log);
                connections.spawn(async move {
                    let service =
                        service_fn(move |req| answer(Arc::clone(&view), Arc::clone(&log), req));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            view,
            answers,
            task: Some(task),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn set(&self, view: View) {
        self.view.send_replace(view);
    }

    fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `GET /v1/leader[?after_term=N&timeout_ms=T]`: answers at once, or for the long poll
/// as soon as the term is above N or the role or token differs from those at arrival,
/// or after T ms (as the node does).
async fn answer(
    view: Arc<watch::Sender<View>>,
    answers: Answers,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let query: HashMap<String, u64> = request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect();
    let mut rx = view.subscribe();
    if rx.borrow().hung {
        std::future::pending::<()>().await;
    }
    let long_poll = query.contains_key("after_term");
    if let (Some(&after), Some(&timeout_ms)) = (query.get("after_term"), query.get("timeout_ms")) {
        let (role_at_arrival, token_at_arrival) = (rx.borrow().role, rx.borrow().token);
        let _ = tokio::time::timeout(
            Duration::from_millis(timeout_ms),
            rx.wait_for(|v| {
                v.term > after || v.role != role_at_arrival || v.token != token_at_arrival || v.hung
            }),
        )
        .await;
        if rx.borrow().hung {
            std::future::pending::<()>().await;
        }
    }
    let v = rx.borrow().clone();
    answers
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((long_poll, v.token));
    let body = LeaderView {
        node_id: 1,
        scope: Scope::default(),
        term: v.term,
        leader_id: Some(if v.role == Role::Leader { 1 } else { 2 }),
        role: v.role,
        token: v.token,
        announced: v.token.is_some(),
        proof: None,
        lease_ms: None,
        released: None,
        scores: None,
        score_oracle: None,
    };
    let body = serde_json::to_vec(&body).unwrap();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = StatusCode::OK;
    Ok(response)
}

fn follower(term: u64) -> View {
    View {
        term,
        role: Role::Follower,
        token: None,
        hung: false,
    }
}

fn leader(term: u64, token: Option<u64>) -> View {
    View {
        term,
        role: Role::Leader,
        token,
        hung: false,
    }
}

/// Waits until `source`'s leadership passes `check`, within [`SEEN_TIMEOUT`].
async fn seen(source: &NodeApiSource, what: &str, check: impl Fn(&Leadership) -> bool) {
    let passed = wait::poll(SEEN_TIMEOUT, || async {
        check(&source.current().await).then_some(())
    })
    .await;
    if passed.is_none() {
        let last = source.current().await;
        panic!("timed out waiting for {what}; last {last:?}");
    }
}

/// Goal: a follower has no token; a leader that becomes established gets its token
/// although neither term nor role changes; losing the leadership is seen long before the
/// long poll's wait ends, because the node answers the long poll at once.
/// Method: script a node through follower, establishing, leader, follower.
#[tokio::test]
async fn source_follows_election_establishment_and_loss() {
    let node = FakeNode::start(follower(1)).await;
    // A long wait, so only the long poll answering early can explain quick updates.
    let source = NodeApiSource::start_with_wait(&node.url(), Duration::from_secs(30)).unwrap();
    let first = source.current().await;
    assert_eq!(first, Leadership::not_leader(1, Some(2)));

    node.set(leader(2, None));
    seen(&source, "leader, not established", |l| {
        l.is_leader && l.token.is_none()
    })
    .await;
    assert_eq!(source.current().await.write_token(), None);

    let started = Instant::now();
    node.set(leader(2, Some(2)));
    let led = tokio::time::timeout(SEEN_TIMEOUT, source.wait_for_leader())
        .await
        .expect("established leadership seen");
    assert_eq!(led.write_token(), Some(2));

    // `join!` polls `changed()` first, so it has subscribed before the node changes.
    let (lost, ()) = tokio::join!(
        tokio::time::timeout(SEEN_TIMEOUT, source.changed()),
        async { node.set(follower(3)) }
    );
    let lost = lost.expect("loss seen");
    assert_eq!(lost.write_token(), None);
    assert_eq!(lost.term, 3);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "changes were seen through the long poll, not its 30 s wait"
    );
}

/// Goal: a leader's token reaches the source through a long poll that the node answers
/// when the token appears, not through a plain poll some interval later (the failover
/// measured from outside waited about 20 ms for it).
/// Method: script a leader without a token, then give it one; the answer that carried
/// the token must have been a long poll.
#[tokio::test]
async fn the_token_of_an_establishing_leader_comes_through_a_long_poll() {
    let node = FakeNode::start(leader(2, None)).await;
    let source = NodeApiSource::start_with_wait(&node.url(), Duration::from_secs(30)).unwrap();
    seen(&source, "leader, not established", |l| {
        l.is_leader && l.token.is_none()
    })
    .await;
    node.set(leader(2, Some(2)));
    let led = tokio::time::timeout(SEEN_TIMEOUT, source.wait_for_leader())
        .await
        .expect("established leadership seen");
    assert_eq!(led.write_token(), Some(2));
    let answers = node
        .answers
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let first_with_token = answers
        .iter()
        .find(|(_, token)| token.is_some())
        .expect("an answer with the token");
    assert!(
        first_with_token.0,
        "the token came in a plain poll; answers: {answers:?}"
    );
}

/// Goal: a node that refuses connections, or accepts them and never answers (paused), is
/// "not leader" for the source; it leads again once the node answers.
/// Method: hang the scripted node, resume it, then stop it.
#[tokio::test]
async fn unreachable_or_paused_node_counts_as_not_leader() {
    let mut node = FakeNode::start(leader(4, Some(4))).await;
    let source = NodeApiSource::start_with_wait(&node.url(), Duration::from_millis(300)).unwrap();
    assert_eq!(source.current().await.write_token(), Some(4));

    // Paused: the long poll's wait plus slack passes without an answer.
    node.set(View {
        hung: true,
        ..leader(4, Some(4))
    });
    seen(&source, "a paused node to count as not leader", |l| {
        l.write_token().is_none()
    })
    .await;
    assert!(source.unreachable().is_some());
    node.set(leader(4, Some(4)));
    seen(&source, "the resumed node's leadership", |l| {
        l.write_token() == Some(4)
    })
    .await;

    // Gone: connections refused.
    node.stop();
    seen(&source, "a stopped node to count as not leader", |l| {
        l.write_token().is_none()
    })
    .await;
    assert_eq!(source.current().await.term, 4, "the last term is kept");
}

/// Goal: after a proxy reports fence 6, the node's token 4 is no longer offered, even
/// though the node still says it leads; a later term's token 6 is.
/// Method: mark the source at 6, then move the scripted node to term 6.
#[tokio::test]
async fn marked_source_waits_for_a_token_at_the_fence() {
    let node = FakeNode::start(leader(4, Some(4))).await;
    let source = NodeApiSource::start(&node.url()).unwrap();
    assert_eq!(source.current().await.write_token(), Some(4));
    source.mark_not_leader(6);
    let now = source.current().await;
    assert_eq!(now.write_token(), None);
    assert!(!now.is_leader);

    node.set(leader(5, Some(5)));
    node.set(follower(5));
    node.set(leader(6, Some(6)));
    let led = tokio::time::timeout(SEEN_TIMEOUT, source.wait_for_leader())
        .await
        .expect("token 6 offered");
    assert_eq!(led.write_token(), Some(6));
}

/// Goal: a source pointed at nothing reports "not leader" after its first failed attempt
/// rather than blocking. Method: a closed port, and a deadline on `current`.
#[tokio::test]
async fn source_without_a_node_reports_not_leader() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let source = NodeApiSource::start(&url).unwrap();
    let started = Instant::now();
    assert_eq!(source.current().await.write_token(), None);
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(source.unreachable().is_some());
}
