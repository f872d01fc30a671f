//! `FencedClient` against a scripted HTTP server: the retry rules (`Retry-After`), what a
//! failure says about a write's fate (indeterminate after sending, unreachable before),
//! and a fencing rejection stopping every later write before it is sent.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use palisade_client::{ClientError, FencedClient, Problem, StaticToken, TokenSource};
use palisade_protocol::headers::{FENCING_TOKEN_CURRENT, PROBLEM_JSON};
use tokio::net::TcpListener;

/// A scripted server; every request to it is counted.
///
/// - `/busy`: the first request gets 503 with `Retry-After: 1`, later ones 200.
/// - `/hang`: never answers.
/// - `/fenced`: 409 with the proxy's stale-token problem (fence 9).
/// - anything else: 200.
struct Script {
    addr: SocketAddr,
    requests: Arc<AtomicU32>,
    task: tokio::task::JoinHandle<()>,
}

impl Script {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicU32::new(0));
        let busy_seen = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&requests);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let counted = Arc::clone(&counted);
                let busy_seen = Arc::clone(&busy_seen);
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        counted.fetch_add(1, Ordering::SeqCst);
                        answer(req, Arc::clone(&busy_seen))
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            requests,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> u32 {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    request: Request<Incoming>,
    busy_seen: Arc<AtomicU32>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let response = match request.uri().path() {
        "/busy" if busy_seen.fetch_add(1, Ordering::SeqCst) == 0 => Response::builder()
            .status(StatusCode::SERVICE_UNAVAILABLE)
            .header(http::header::RETRY_AFTER, "1")
            .body(Full::new(Bytes::new())),
        "/hang" => std::future::pending().await,
        "/fenced" => {
            let problem = Problem::new(StatusCode::CONFLICT, "stale-token", "token 3 < 9")
                .with_fence("default", 3, 9);
            Response::builder()
                .status(StatusCode::CONFLICT)
                .header(FENCING_TOKEN_CURRENT, "9")
                .header(http::header::CONTENT_TYPE, PROBLEM_JSON)
                .body(Full::new(Bytes::from(
                    serde_json::to_vec(&problem).unwrap(),
                )))
        }
        _ => Response::builder().body(Full::new(Bytes::from_static(b"ok"))),
    };
    Ok(response.unwrap())
}

fn client(url: &str, token: u64) -> (Arc<StaticToken>, FencedClient) {
    let source = Arc::new(StaticToken::new(token));
    let client = FencedClient::builder(url, source.clone())
        .backoff(Duration::from_millis(10), Duration::from_millis(20))
        .request_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    (source, client)
}

/// Goal: a 503 with `Retry-After: 1` is retried no sooner than the server asked, and the
/// retry succeeds. Method: PUT to `/busy` with a backoff of 10-20 ms; time the call.
#[tokio::test]
async fn retry_after_is_honoured() {
    let server = Script::start().await;
    let (_, client) = client(&server.url(), 3);
    let started = Instant::now();
    let response = client.put("/busy", "x").await.unwrap();
    assert_eq!(response.attempts, 2);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "retried after {:?}, before the server's Retry-After",
        started.elapsed()
    );
    assert_eq!(server.requests(), 2);
}

/// Goal: a write that was sent and got no answer is indeterminate, not failed.
/// Method: PUT to `/hang` with a 500 ms limit and no retries.
#[tokio::test]
async fn no_answer_after_sending_is_indeterminate() {
    let server = Script::start().await;
    let client = FencedClient::builder(&server.url(), Arc::new(StaticToken::new(3)))
        .request_timeout(Duration::from_millis(300))
        .retries(0)
        .build()
        .unwrap();
    let err = client.put("/hang", "x").await.unwrap_err();
    assert!(err.is_indeterminate(), "{err}");
    assert!(err.to_string().contains("300 ms"), "{err}");
}

/// Goal: a refused connection is "unreachable" (nothing was sent), after every retry.
/// Method: PUT to a port nobody listens on, with 2 retries.
#[tokio::test]
async fn refused_connection_is_unreachable_after_the_retries() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let client = FencedClient::builder(&url, Arc::new(StaticToken::new(3)))
        .backoff(Duration::from_millis(1), Duration::from_millis(2))
        .retries(2)
        .build()
        .unwrap();
    match client.put("/k", "x").await.unwrap_err() {
        ClientError::Unreachable { attempts, .. } => assert_eq!(attempts, 3),
        other => panic!("expected Unreachable, got {other}"),
    }
}

/// Goal: a fencing rejection is reported with its numbers, marks the source, and the next
/// write is refused locally without reaching the server.
/// Method: PUT to `/fenced`, then PUT elsewhere; count the server's requests.
#[tokio::test]
async fn rejection_stops_later_writes_before_sending() {
    let server = Script::start().await;
    let (source, client) = client(&server.url(), 3);
    match client.put("/fenced", "x").await.unwrap_err() {
        ClientError::Fenced {
            presented, current, ..
        } => assert_eq!((presented, current), (3, 9)),
        other => panic!("expected Fenced, got {other}"),
    }
    assert_eq!(server.requests(), 1, "a rejection is never retried");
    assert_eq!(source.current().await.write_token(), None);
    let refused = client.put("/elsewhere", "y").await.unwrap_err();
    assert!(
        matches!(refused, ClientError::NotLeader { .. }),
        "{refused}"
    );
    assert_eq!(server.requests(), 1, "the refused write was not sent");
}
