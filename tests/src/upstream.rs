//! The recording upstream: an HTTP backend that logs every request it applies, in apply
//! order, so tests check what really reached the storage rather than what clients believe.
//!
//! A test can hold requests for a path at the upstream ([`RecordingUpstream::hold`]):
//! they arrive, wait at the gate, and are applied (recorded) only when released. That
//! keeps a write in flight for as long as a test needs.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
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
    /// The body.
    pub body: Bytes,
}

#[derive(Default)]
struct State {
    applied: Mutex<Vec<Applied>>,
    /// Paths whose requests wait until their gate turns true.
    gates: Mutex<HashMap<String, watch::Sender<bool>>>,
    /// Requests that arrived (whether or not yet applied), in arrival order.
    arrived: Mutex<Vec<Applied>>,
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
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(State::default());
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
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let applied = Applied {
        method: parts.method.to_string(),
        path: path.clone(),
        token: parts
            .headers
            .get("fencing-token")
            .map(|v| v.to_str().unwrap_or("<non-ascii>").to_owned()),
        body,
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
    state.applied.lock().unwrap().push(applied);
    let mut response = Response::new(Full::new(Bytes::from_static(b"applied\n")));
    *response.status_mut() = StatusCode::OK;
    Ok(response)
}
