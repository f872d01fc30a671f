//! A request body from hyper's HTTP/1 server, read through [`RequestBody`] inside a
//! [`Relayed`] connection, as the proxy serves one: the stale wake-up of hyper's body
//! channel is dropped, and no live one is.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use palisade_server::wake::Relayed;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{BodyLimits, RequestBody};

const DEADLINE: Duration = Duration::from_secs(10);

pin_project_lite::pin_project! {
    /// Counts the polls of the future it wraps.
    struct Counted<F> {
        #[pin]
        inner: F,
        polls: Arc<AtomicUsize>,
    }
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        this.polls.fetch_add(1, Ordering::Relaxed);
        this.inner.poll(cx)
    }
}

/// Reads a body whole through a [`RequestBody`], marked as hyper's HTTP/1 body or not;
/// answers with the number of bytes read.
async fn read_whole(
    request: Request<Incoming>,
    drop_stale_wakes: bool,
) -> Result<Response<Full<Bytes>>, Infallible> {
    // Timeouts longer than the test's deadline: a stalled body must not be rescued by
    // the idle timer's wake-up.
    let limits = BodyLimits::new(None, 6 * DEADLINE, 6 * DEADLINE, 1 << 20);
    let mut body = RequestBody::new(request.into_body(), &limits, None, None);
    if drop_stale_wakes {
        body.drop_stale_wakes();
    }
    let mut read = 0;
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.expect("the body reads without a fault");
        read += frame.data_ref().map_or(0, Bytes::len);
    }
    Ok(Response::new(Full::new(Bytes::from(read.to_string()))))
}

/// Serves one connection as the proxy does (in a [`Relayed`] task), sends it
/// `requests`, each written whole with one `write`, and returns each answer's body and
/// how often the connection's future was polled.
async fn serve(requests: &[Vec<u8>], drop_stale_wakes: bool) -> (Vec<String>, usize) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let polls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&polls);
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.expect("accept");
        let connection = http1::Builder::new().serve_connection(
            TokioIo::new(stream),
            service_fn(move |request| read_whole(request, drop_stale_wakes)),
        );
        let served = Counted {
            inner: Relayed::new(connection),
            polls: counted,
        };
        served.await.expect("the connection is served");
    });
    let mut client = TcpStream::connect(addr).await.expect("connect");
    let mut answers = Vec::new();
    for request in requests {
        client.write_all(request).await.expect("write");
        answers.push(read_answer(&mut client).await);
    }
    drop(client);
    tokio::time::timeout(DEADLINE, server)
        .await
        .expect("the connection ends with its client")
        .expect("the server task ran");
    (answers, polls.load(Ordering::Relaxed))
}

/// Reads one answer of `Content-Length` framing; returns its body.
async fn read_answer(client: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(DEADLINE, client.read(&mut buf))
            .await
            .expect("an answer within the deadline")
            .expect("read");
        assert!(n > 0, "the connection closed before the answer");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|line| line.strip_prefix("content-length: "))
                .expect("a content-length")
                .parse()
                .expect("a number");
            if got.len() >= end + 4 + len {
                return text[end + 4..end + 4 + len].to_owned();
            }
        }
    }
}

fn put(body_len: usize) -> Vec<u8> {
    let mut request =
        format!("PUT /k HTTP/1.1\r\nhost: x\r\ncontent-length: {body_len}\r\n\r\n").into_bytes();
    request.resize(request.len() + body_len, b'x');
    request
}

/// Goal: a body that comes with its head costs its connection one poll, not two: the
/// wake-up hyper's channel sends for a sender already gone is dropped. Fails if the
/// wake-up passes (or if hyper stops sending it: then `drop_stale_wakes` is no longer
/// needed, and the difference is 0).
/// Method: 20 PUTs of 1 KiB on one keep-alive connection, served in a `Relayed` task,
/// the body read through `RequestBody` marked as hyper's or not; the polls counted.
#[tokio::test]
async fn a_body_that_came_with_its_head_costs_no_extra_poll() {
    const REQUESTS: usize = 20;
    let requests = vec![put(1024); REQUESTS];
    let (answers, plain) = serve(&requests, false).await;
    assert_eq!(answers, vec!["1024"; REQUESTS]);
    let (answers, muffled) = serve(&requests, true).await;
    assert_eq!(answers, vec!["1024"; REQUESTS]);
    assert!(
        plain >= muffled + REQUESTS,
        "polls: {plain} as they come, {muffled} with the stale wake-up dropped"
    );
}

/// Goal: no live wake-up is dropped. A chunked body whose chunks all arrive in one
/// read leaves the dispatcher waiting for the service to take each chunk: only the
/// channel's wake-up, taken inside `muffled`, brings it back to send the next. Were it
/// dropped, the body would never end and the answer would miss the deadline.
/// Method: two PUTs of 8 chunks of 256 bytes, each written whole at once, then a PUT of
/// known length on the same connection.
#[tokio::test]
async fn every_live_wake_up_still_passes() {
    let mut chunked = b"PUT /k HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..8 {
        chunked.extend_from_slice(b"100\r\n");
        chunked.extend_from_slice(&[b'y'; 256]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (answers, _) = serve(&[chunked.clone(), chunked.clone(), put(10)], true).await;
    assert_eq!(answers, ["2048", "2048", "10"]);
}
