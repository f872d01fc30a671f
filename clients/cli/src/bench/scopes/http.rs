//! The one HTTP/1.1 client both targets are driven through, so that the load generator
//! costs the same per request whichever server it loads: JSON bodies in and out, a pool
//! of keep-alive connections per server, and dedicated connections for streamed answers
//! (etcd's watches).

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpStream;

use crate::Failure;

/// Most idle connections kept per server: above the most requests one run has in flight
/// at once (the keepalive workers, or the contenders' long polls), so that a steady run
/// opens no connection after its start.
const IDLE_CONNECTIONS_MAX: usize = 1024;
/// Longest a TCP connect to a server on loopback may take.
const CONNECT_TIMEOUT_MS: u64 = 2_000;

/// An answer: its status and its whole body.
pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) body: Bytes,
}

impl Answer {
    /// The body as `T`, or a failure naming `what` and the answer.
    pub(super) fn json<T: DeserializeOwned>(&self, what: &str) -> Result<T, Failure> {
        if !self.status.is_success() {
            return Err(Failure::Runtime(format!(
                "{what}: {} {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )));
        }
        serde_json::from_slice(&self.body).map_err(|e| {
            Failure::Runtime(format!(
                "{what}: cannot parse {:?}: {e}",
                String::from_utf8_lossy(&self.body)
            ))
        })
    }
}

/// A client of one server (`http://host:port`).
pub(super) struct Http {
    addr: SocketAddr,
    authority: HeaderValue,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl Http {
    /// A client of the server at `url`, resolved once.
    pub(super) async fn new(url: &str) -> Result<Self, Failure> {
        let addr = super::super::args::resolve(url).await?;
        let authority = HeaderValue::from_str(&addr.to_string())
            .map_err(|e| Failure::Usage(format!("{url}: {e}")))?;
        Ok(Self {
            addr,
            authority,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// The server's `host:port`.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sends `method path` with `body` as JSON (none when `None`), on a pooled
    /// connection, and reads the answer whole within `timeout`.
    pub(super) async fn call<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<Answer, Failure> {
        let request = self.request(method, path, body)?;
        let mut sender = self.checkout().await?;
        let exchange = async {
            sender
                .ready()
                .await
                .map_err(|e| format!("connection not ready: {e}"))?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| format!("request failed: {e}"))?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("reading the answer failed: {e}"))?
                .to_bytes();
            Ok::<_, String>(Answer { status, body })
        };
        let answer = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| {
                Failure::Runtime(format!(
                    "{path} at {}: no answer within {timeout:?}",
                    self.addr
                ))
            })?
            .map_err(|e| Failure::Runtime(format!("{path} at {}: {e}", self.addr)))?;
        self.checkin(sender);
        Ok(answer)
    }

    /// Sends `POST path` with `body` on a connection of its own and returns the answer's
    /// body unread, for a server that streams its answer (the connection closes when the
    /// body is dropped).
    pub(super) async fn stream<B: Serialize>(
        &self,
        path: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<Incoming, Failure> {
        let request = self.request(Method::POST, path, Some(body))?;
        let mut sender = self.connect().await?;
        let response = tokio::time::timeout(timeout, sender.send_request(request))
            .await
            .map_err(|_| Failure::Runtime(format!("{path}: no answer within {timeout:?}")))?
            .map_err(|e| Failure::Runtime(format!("{path} at {}: {e}", self.addr)))?;
        if !response.status().is_success() {
            return Err(Failure::Runtime(format!(
                "{path} at {}: {}",
                self.addr,
                response.status()
            )));
        }
        Ok(response.into_body())
    }

    fn request<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<Request<Full<Bytes>>, Failure> {
        let bytes = match body {
            Some(b) => {
                Bytes::from(serde_json::to_vec(b).map_err(|e| Failure::Runtime(e.to_string()))?)
            }
            None => Bytes::new(),
        };
        let mut request = Request::new(Full::new(bytes.clone()));
        *request.method_mut() = method;
        *request.uri_mut() = path
            .parse()
            .map_err(|e| Failure::Runtime(format!("path {path:?}: {e}")))?;
        let headers = request.headers_mut();
        headers.insert(header::HOST, self.authority.clone());
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
        if body.is_some() {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        Ok(request)
    }

    /// An idle connection that is still open, or a new one.
    async fn checkout(&self) -> Result<SendRequest<Full<Bytes>>, Failure> {
        loop {
            let pooled = self.idle.lock().map_or(None, |mut idle| idle.pop());
            match pooled {
                Some(sender) if !sender.is_closed() => return Ok(sender),
                Some(_) => {}
                None => return self.connect().await,
            }
        }
    }

    /// Puts a connection back for the next request, unless the pool is full.
    fn checkin(&self, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < IDLE_CONNECTIONS_MAX
        {
            idle.push(sender);
        }
    }

    /// Opens one connection and drives it on its own task; it ends when its sender is
    /// dropped or the server closes it.
    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, Failure> {
        let addr = self.addr;
        let stream = tokio::time::timeout(
            Duration::from_millis(CONNECT_TIMEOUT_MS),
            TcpStream::connect(addr),
        )
        .await
        .map_err(|_| Failure::Runtime(format!("connect {addr}: timed out")))?
        .map_err(|e| Failure::Runtime(format!("connect {addr}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| Failure::Runtime(format!("handshake {addr}: {e}")))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }
}

/// Reads the next newline-delimited JSON message of a streamed answer (etcd's gateway
/// ends each with `\n`), keeping what follows it in `pending`; `None` when the stream
/// ended.
pub(super) async fn next_line(
    body: &mut Incoming,
    pending: &mut Vec<u8>,
) -> Result<Option<Vec<u8>>, Failure> {
    loop {
        if let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return Ok(Some(line));
        }
        match body.frame().await {
            None => return Ok(None),
            Some(Err(e)) => return Err(Failure::Runtime(format!("reading a stream: {e}"))),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    pending.extend_from_slice(&data);
                }
            }
        }
    }
}
