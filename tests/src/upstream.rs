//! The recording upstream: an HTTP backend that logs every request it applies, in apply
//! order, so tests check what really reached the storage rather than what clients believe.
//!
//! A test can hold requests for a path at the upstream ([`RecordingUpstream::hold`]):
//! they arrive, wait at the gate, and are applied (recorded) only when released. That
//! keeps a write in flight for as long as a test needs. It can also delay every request
//! under a path prefix ([`RecordingUpstream::delay`]), a slow storage, so a lower-token
//! write is still in flight when a higher one arrives.
//!
//! Each applied write names itself for the history checker: scope (`Fencing-Scope`, else
//! `default`), token (`Fencing-Token`), writer (`X-Writer`) and sequence number (`X-Seq`);
//! [`RecordingUpstream::apply_log`] gives them in apply order.
//!
//! Bodies are read frame by frame: the upstream counts every body byte it receives as it
//! arrives ([`RecordingUpstream::body_bytes`], live, whole or not), keeps each request's
//! headers and trailers, and records a request only once its body is complete; a body
//! that breaks off is counted in [`RecordingUpstream::aborted`] and never applied, as a
//! storage would not apply half a write. Started with
//! [`start_counting`](RecordingUpstream::start_counting), it keeps no bodies, only their
//! length and SHA-256, so gigabytes can pass through it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_cluster::history;
use palisade_cluster::worker::{SEQ_HEADER, WRITER_HEADER};
use palisade_protocol::{DEFAULT_SCOPE, headers};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// One request as the upstream applied it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The `Fencing-Token` header as received, if any.
    pub token: Option<String>,
    /// The body (empty in counting mode).
    pub body: Bytes,
    /// The body's length in bytes.
    pub body_len: u64,
    /// The body's SHA-256 (counting mode only).
    pub body_sha256: Option<[u8; 32]>,
    /// Every header as received.
    pub headers: HeaderMap,
    /// The trailers, if the body ended with any.
    pub trailers: Option<HeaderMap>,
    /// The `Fencing-Scope` header, if any.
    pub scope: Option<String>,
    /// The `X-Writer` header, if any.
    pub writer: Option<String>,
    /// The `X-Seq` header, if any.
    pub seq: Option<String>,
    /// When it arrived, on the upstream's logical clock (shared with `applied_at`).
    pub arrived_at: u64,
    /// When it was applied, on the same clock; 0 while it has only arrived.
    pub applied_at: u64,
}

impl Applied {
    /// Whether this is a write (POST, PUT, PATCH, DELETE).
    pub fn is_write(&self) -> bool {
        matches!(self.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
    }

    /// This write as the history checker sees it. Missing or unreadable headers become
    /// token 0, writer `?` and sequence 0, which the checker reports as a write no
    /// client attempted (or one applied with another token).
    pub fn to_history(&self) -> history::Applied {
        history::Applied {
            scope: self
                .scope
                .clone()
                .unwrap_or_else(|| DEFAULT_SCOPE.to_owned()),
            token: self
                .token
                .as_deref()
                .and_then(|t| t.parse().ok())
                .unwrap_or(0),
            writer: self.writer.clone().unwrap_or_else(|| "?".to_owned()),
            seq: self
                .seq
                .as_deref()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
        }
    }
}

#[derive(Default)]
struct State {
    applied: Mutex<Vec<Applied>>,
    /// Paths whose requests wait until their gate turns true.
    gates: Mutex<HashMap<String, watch::Sender<bool>>>,
    /// Requests that arrived (whether or not yet applied), in arrival order.
    arrived: Mutex<Vec<Applied>>,
    /// Path prefixes whose requests are delayed before being applied.
    delays: Mutex<Vec<(String, Duration)>>,
    /// The logical clock of arrivals and applications (starts at 1).
    clock: std::sync::atomic::AtomicU64,
    /// Keep only the length and hash of bodies.
    counting: bool,
    /// Body bytes received so far, over every request, complete or not.
    body_bytes: AtomicU64,
    /// Requests whose body broke off before its end.
    aborted: AtomicU64,
}

impl State {
    fn tick(&self) -> u64 {
        self.clock
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            .saturating_add(1)
    }
}

/// A running recording upstream; stops when dropped.
pub struct RecordingUpstream {
    /// Its address.
    pub addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RecordingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RecordingUpstream {
    /// Starts on a free loopback port.
    pub async fn start() -> Self {
        Self::start_with(false, std::net::Ipv4Addr::LOCALHOST.into()).await
    }

    /// Starts on a free port of `ip`: the test side of a network of namespaces, for
    /// proxies that run inside one.
    pub async fn start_on(ip: std::net::IpAddr) -> Self {
        Self::start_with(false, ip).await
    }

    /// Starts on a free loopback port, keeping only each body's length and SHA-256.
    pub async fn start_counting() -> Self {
        Self::start_with(true, std::net::Ipv4Addr::LOCALHOST.into()).await
    }

    async fn start_with(counting: bool, ip: std::net::IpAddr) -> Self {
        let listener = TcpListener::bind((ip, 0)).await.expect("bind upstream");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(State {
            counting,
            ..State::default()
        });
        let st = Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let st = Arc::clone(&st);
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(Arc::clone(&st), req));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, state, task }
    }

    /// The base URL, `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Body bytes received so far over every request, whether or not the body completed.
    pub fn body_bytes(&self) -> u64 {
        self.state.body_bytes.load(Ordering::SeqCst)
    }

    /// Requests whose body broke off (never applied).
    pub fn aborted(&self) -> u64 {
        self.state.aborted.load(Ordering::SeqCst)
    }

    /// Everything applied so far, in apply order.
    pub fn applied(&self) -> Vec<Applied> {
        self.state.applied.lock().unwrap().clone()
    }

    /// Everything that arrived so far (applied or held), in arrival order.
    pub fn arrived(&self) -> Vec<Applied> {
        self.state.arrived.lock().unwrap().clone()
    }

    /// From now on, requests for `path` wait at the upstream until [`release`](Self::release).
    pub fn hold(&self, path: &str) {
        let (tx, _) = watch::channel(false);
        self.state.gates.lock().unwrap().insert(path.to_owned(), tx);
    }

    /// The writes applied so far, in apply order, as the history checker takes them.
    pub fn apply_log(&self) -> Vec<history::Applied> {
        self.applied()
            .iter()
            .filter(|a| a.is_write())
            .map(Applied::to_history)
            .collect()
    }

    /// From now on, requests whose path starts with `prefix` wait `delay` after arriving
    /// before they are applied (a slow storage). A zero delay removes the prefix's delay.
    pub fn delay(&self, prefix: &str, delay: Duration) {
        let mut delays = self.state.delays.lock().unwrap();
        delays.retain(|(p, _)| p != prefix);
        if !delay.is_zero() {
            delays.push((prefix.to_owned(), delay));
        }
    }

    /// Lets held requests for `path` (and later ones) through.
    pub fn release(&self, path: &str) {
        if let Some(tx) = self.state.gates.lock().unwrap().remove(path) {
            let _ = tx.send(true);
        }
    }
}

async fn handle(
    state: Arc<State>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, mut body) = request.into_parts();
    let mut kept = Vec::new();
    let mut body_len = 0u64;
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            state.aborted.fetch_add(1, Ordering::SeqCst);
            let mut response = Response::new(Full::new(Bytes::from_static(b"body broke off\n")));
            *response.status_mut() = StatusCode::BAD_REQUEST;
            return Ok(response);
        };
        match frame.into_data() {
            Ok(data) => {
                state
                    .body_bytes
                    .fetch_add(data.len() as u64, Ordering::SeqCst);
                body_len += data.len() as u64;
                if state.counting {
                    hash.update(&data);
                } else {
                    kept.extend_from_slice(&data);
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers = Some(t);
                }
            }
        }
    }
    let body_sha256 = state.counting.then(|| {
        let mut out = [0u8; 32];
        out.copy_from_slice(hash.finish().as_ref());
        out
    });
    let body = Bytes::from(kept);
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let header = |name: &HeaderName| {
        parts
            .headers
            .get(name)
            .map(|v| v.to_str().unwrap_or("<non-ascii>").to_owned())
    };
    let applied = Applied {
        method: parts.method.to_string(),
        path: path.clone(),
        token: header(&headers::FENCING_TOKEN),
        body,
        body_len,
        body_sha256,
        headers: parts.headers.clone(),
        trailers,
        scope: header(&headers::FENCING_SCOPE),
        writer: header(&HeaderName::from_static(WRITER_HEADER)),
        seq: header(&HeaderName::from_static(SEQ_HEADER)),
        arrived_at: state.tick(),
        applied_at: 0,
    };
    state.arrived.lock().unwrap().push(applied.clone());
    let gate = state
        .gates
        .lock()
        .unwrap()
        .get(parts.uri.path())
        .map(watch::Sender::subscribe);
    if let Some(mut gate) = gate {
        let _ = gate.wait_for(|open| *open).await;
    }
    let delay = state
        .delays
        .lock()
        .unwrap()
        .iter()
        .filter(|(prefix, _)| parts.uri.path().starts_with(prefix.as_str()))
        .map(|(_, d)| *d)
        .max();
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    let mut applied = applied;
    {
        // Stamp and record under one lock, so apply order and clock order agree.
        let mut log = state.applied.lock().unwrap();
        applied.applied_at = state.tick();
        log.push(applied);
    }
    let mut response = Response::new(Full::new(Bytes::from_static(b"applied\n")));
    *response.status_mut() = StatusCode::OK;
    Ok(response)
}
