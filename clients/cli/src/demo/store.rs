//! The demo's shared store for a fleet (`palisade demo --proxies N`, N > 1): a plain HTTP
//! object store inside the demo process, in front of which every proxy of the fleet
//! forwards. It fences nothing itself, so whatever it applied is what the fleet admitted,
//! and the verdict judges the fleet alone.
//!
//! `PUT /<key>` records the key and the `Fencing-Token` it came with, in apply order, and
//! answers `{"revision": N}`; anything else is 405. A write without a readable token is
//! recorded with token 0, so the verdict sees it instead of the store hiding it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use palisade_protocol::headers;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::verdict::Entry;

/// The store: its address and everything it applied, in order.
pub(crate) struct DemoStore {
    /// Where it listens (loopback, a free port).
    pub addr: SocketAddr,
    applied: Arc<Mutex<Vec<Entry>>>,
    task: JoinHandle<()>,
}

impl Drop for DemoStore {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DemoStore {
    /// Starts the store on a free loopback port.
    pub(crate) async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let applied: Arc<Mutex<Vec<Entry>>> = Arc::default();
        let log = Arc::clone(&applied);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let service = service_fn(move |req| serve(req, Arc::clone(&log)));
                    // A connection that fails only ends that connection; the proxies open
                    // new ones.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            applied,
            task,
        })
    }

    /// `http://ADDR`, the proxies' `--upstream`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every write it applied under `prefix`, in apply order.
    pub(crate) fn ledger(&self, prefix: &str) -> Vec<Entry> {
        self.applied
            .lock()
            .map(|log| {
                log.iter()
                    .filter(|e| e.key.starts_with(prefix))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

async fn serve(
    req: Request<Incoming>,
    log: Arc<Mutex<Vec<Entry>>>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    if req.method() != Method::PUT {
        return Ok(answer(StatusCode::METHOD_NOT_ALLOWED, "{}".to_owned()));
    }
    let key = req.uri().path().trim_start_matches('/').to_owned();
    let token = req
        .headers()
        .get(headers::FENCING_TOKEN)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // The write is applied once its body has arrived whole, as a store would.
    if req.into_body().collect().await.is_err() {
        return Ok(answer(StatusCode::BAD_REQUEST, "{}".to_owned()));
    }
    let revision = match log.lock() {
        Ok(mut log) => {
            let revision = log.len() as u64 + 1;
            log.push(Entry {
                key,
                token,
                revision,
            });
            revision
        }
        Err(_) => return Ok(answer(StatusCode::INTERNAL_SERVER_ERROR, "{}".to_owned())),
    };
    Ok(answer(
        StatusCode::OK,
        serde_json::json!({ "revision": revision }).to_string(),
    ))
}

fn answer(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}
