//! Accepting the data path's connections: TLS, HTTP/1.1 and h2c, the connection limit,
//! timeouts on request heads, and graceful shutdown. The admin API is served by the
//! protocol crate's control-plane accept loop instead (see `admin`).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;

use crate::body::ProxyBody;
use crate::metrics as m;

/// Pause after a failed accept (for example EMFILE), so the loop does not spin.
const ACCEPT_BACKOFF_MS: u64 = 50;

/// The client at the other end of a connection, worked out once per connection rather
/// than once per request.
pub(crate) struct Peer {
    /// Its IP as an `X-Forwarded-For` value.
    pub forwarded_for: Option<http::HeaderValue>,
}

impl Peer {
    fn new(addr: SocketAddr) -> Self {
        Self {
            forwarded_for: http::HeaderValue::from_str(&addr.ip().to_string()).ok(),
        }
    }
}

/// How one listener treats its connections.
#[derive(Clone)]
pub(crate) struct ListenerSettings {
    /// Name in logs and in the connections gauge (`client`).
    pub name: &'static str,
    pub connections_max: usize,
    pub header_read_timeout: Duration,
    pub header_bytes_max: usize,
    pub h2_streams_max: u32,
    pub drain_timeout: Duration,
    pub tls: Option<TlsAcceptor>,
}

/// Serves `listener` until `shutdown` turns true, then stops accepting and waits up to
/// the drain timeout for open connections to finish their in-flight requests.
pub(crate) async fn serve<H, F>(
    listener: TcpListener,
    settings: ListenerSettings,
    mut shutdown: watch::Receiver<bool>,
    handler: H,
) where
    H: Fn(Request<Incoming>, Arc<Peer>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<ProxyBody>, Infallible>> + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .max_buf_size(settings.header_bytes_max)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(settings.header_bytes_max).unwrap_or(u32::MAX))
        .max_concurrent_streams(settings.h2_streams_max);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(settings.connections_max));

    loop {
        // Wait for a free connection slot first, so excess clients queue in the kernel's
        // backlog instead of holding memory here.
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = shutdown.changed() => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(listener = settings.name, cause = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_BACKOFF_MS)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let client = Arc::new(Peer::new(peer));
        let service = service_fn(move |req| handler(req, Arc::clone(&client)));
        let builder = Arc::clone(&builder);
        let watcher = graceful.watcher();
        let settings = settings.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let gauge = metrics::gauge!(m::CONNECTIONS, "listener" => settings.name);
            gauge.increment(1.0);
            let result = match &settings.tls {
                None => {
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    watcher.watch(conn.into_owned()).await
                }
                Some(acceptor) => {
                    match tokio::time::timeout(
                        settings.header_read_timeout,
                        acceptor.accept(stream),
                    )
                    .await
                    {
                        Ok(Ok(tls)) => {
                            let conn = builder.serve_connection(TokioIo::new(tls), service);
                            watcher.watch(conn.into_owned()).await
                        }
                        Ok(Err(e)) => Err(e.into()),
                        Err(_) => Err("TLS handshake timed out".into()),
                    }
                }
            };
            if let Err(e) = result {
                tracing::debug!(listener = settings.name, %peer, cause = %e, "connection ended with an error");
            }
            gauge.decrement(1.0);
        });
    }
    drop(listener);
    let open = graceful.count();
    tracing::info!(
        listener = settings.name,
        open,
        "stopped accepting; draining connections"
    );
    tokio::select! {
        () = graceful.shutdown() => tracing::info!(listener = settings.name, "drained"),
        () = tokio::time::sleep(settings.drain_timeout) => {
            tracing::warn!(listener = settings.name, "drain timeout reached; closing remaining connections");
        }
    }
}
