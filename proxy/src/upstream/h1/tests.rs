//! The proxy's own HTTP/1 exchange against scripted upstreams over real sockets: what
//! it sends, what it accepts, and when it reuses a connection.

use std::time::Duration;

use http::uri::{Authority, Scheme};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::*;

/// Longest any step here may take.
const DEADLINE: Duration = Duration::from_secs(10);

/// A request body the test feeds by hand; its frames end when the sender is dropped.
struct TestBody {
    rx: mpsc::UnboundedReceiver<Frame<Bytes>>,
    hint: SizeHint,
}

impl Body for TestBody {
    type Data = Bytes;
    type Error = BodyFault;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyFault>>> {
        self.rx.poll_recv(cx).map(|frame| frame.map(Ok))
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

/// A body of `bytes`, all there already.
fn whole(bytes: &'static [u8]) -> TestBody {
    let (tx, rx) = mpsc::unbounded_channel();
    if !bytes.is_empty() {
        tx.send(Frame::data(Bytes::from_static(bytes))).unwrap();
    }
    TestBody {
        rx,
        hint: SizeHint::with_exact(bytes.len() as u64),
    }
}

/// A body of unknown length, fed through the sender.
fn fed() -> (mpsc::UnboundedSender<Frame<Bytes>>, TestBody) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        tx,
        TestBody {
            rx,
            hint: SizeHint::default(),
        },
    )
}

/// A listener for a scripted upstream and a pool of connections to it.
async fn upstream() -> (TcpListener, Arc<Pool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let authority: Authority = listener.local_addr().unwrap().to_string().parse().unwrap();
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let pool = Pool::new(&Scheme::HTTP, &authority, tls, DEADLINE, 8, 1).unwrap();
    (listener, Arc::new(pool))
}

fn request<B>(method: Method, body: B, headers: &[(&'static str, &'static str)]) -> Request<B> {
    let mut request = Request::builder().method(method).uri("/k?x=1");
    request = request.header("host", "storage");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(body).unwrap()
}

/// Reads from `socket` until `buf` holds a request head, then `body` more bytes.
async fn read_request(
    socket: &mut tokio::net::TcpStream,
    buf: &mut Vec<u8>,
    body: usize,
) -> String {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n")
            && buf.len() >= end + 4 + body
        {
            let request: Vec<u8> = buf.drain(..end + 4 + body).collect();
            return String::from_utf8(request).unwrap();
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(DEADLINE, socket.read(&mut chunk))
            .await
            .expect("the request did not arrive")
            .unwrap();
        assert!(n > 0, "the proxy closed before the whole request: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// One exchange with a fresh connection from the pool.
async fn send<B>(pool: &Arc<Pool>, request: Request<B>) -> Result<Response<OwnBody>, ProxyError>
where
    B: Body<Data = Bytes, Error = BodyFault> + Unpin,
{
    let conn = pool.take_own().await.unwrap();
    tokio::time::timeout(DEADLINE, exchange(conn, request, pool))
        .await
        .expect("the exchange did not end")
}

/// The whole body of an answer, and its trailers.
async fn collect(response: Response<OwnBody>) -> (Bytes, Option<HeaderMap>) {
    let collected = tokio::time::timeout(DEADLINE, response.into_body().collect())
        .await
        .expect("the body did not end")
        .unwrap();
    let trailers = collected.trailers().cloned();
    (collected.to_bytes(), trailers)
}

/// Whether another connection is waiting to be accepted, without waiting for one.
fn another_connection(listener: &TcpListener) -> bool {
    futures_util_now(listener.accept())
}

fn futures_util_now<F: Future>(f: F) -> bool {
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    std::pin::pin!(f).poll(&mut cx).is_ready()
}

/// An upstream that answers the request on its first connection with `first` and keeps
/// that connection open, then answers 200 on a second connection: a test whose next
/// request gets its answer shows that the request needed a new connection (on the first
/// one it would wait until the deadline).
fn first_then_second(
    listener: TcpListener,
    first: &'static [u8],
) -> tokio::task::JoinHandle<tokio::net::TcpStream> {
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        read_request(&mut socket, &mut Vec::new(), 0).await;
        socket.write_all(first).await.unwrap();
        let (mut second, _) = listener.accept().await.unwrap();
        read_request(&mut second, &mut Vec::new(), 0).await;
        second
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        socket
    })
}

/// Goal: a request whose body is there already goes out as one message (head, the
/// proxy's `content-length`, body); an answer framed by its length comes back whole, and
/// its connection then carries the next request. Method: an upstream that serves two
/// requests on one connection and checks each.
#[tokio::test]
async fn a_length_framed_exchange_reuses_its_connection() {
    let (listener, pool) = upstream().await;
    let served = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut requests = Vec::new();
        for _ in 0..2 {
            requests.push(read_request(&mut socket, &mut buf, 5).await);
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: 1\r\n\r\nhello")
                .await
                .unwrap();
        }
        (requests, another_connection(&listener))
    });
    for _ in 0..2 {
        let response = send(&pool, request(Method::PUT, whole(b"12345"), &[]))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-a"], "1");
        assert_eq!(response.body().size_hint().exact(), Some(5));
        assert_eq!(collect(response).await.0, "hello");
    }
    let (requests, second) = served.await.unwrap();
    assert!(!second, "a second connection was opened");
    for request in requests {
        assert!(request.starts_with("PUT /k?x=1 HTTP/1.1\r\n"), "{request}");
        assert!(request.contains("host: storage\r\n"), "{request}");
        assert!(
            request.ends_with("content-length: 5\r\n\r\n12345"),
            "{request}"
        );
    }
}

/// Goal: a body of unknown length goes chunked, with its declared trailers only; a
/// chunked answer comes back with its trailers. Method: feed a body in two frames and
/// trailers; the upstream checks the bytes and answers chunked.
#[tokio::test]
async fn chunked_both_ways_with_trailers() {
    let (listener, pool) = upstream().await;
    let served = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let head = read_request(&mut socket, &mut buf, 0).await;
        let body = b"3\r\nabc\r\n2\r\nde\r\n0\r\nx-sum: 9\r\n\r\n";
        while buf.len() < body.len() {
            let mut chunk = [0u8; 1024];
            let n = socket.read(&mut chunk).await.unwrap();
            assert!(n > 0);
            buf.extend_from_slice(&chunk[..n]);
        }
        socket
            .write_all(
                b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n\
                  4\r\nwxyz\r\n1;ext=1\r\n!\r\n0\r\nx-check: ok\r\n\r\n",
            )
            .await
            .unwrap();
        (head, buf)
    });
    let (tx, body) = fed();
    tx.send(Frame::data(Bytes::from_static(b"abc"))).unwrap();
    tx.send(Frame::data(Bytes::from_static(b"de"))).unwrap();
    let mut trailers = HeaderMap::new();
    trailers.insert("x-sum", "9".parse().unwrap());
    trailers.insert("x-undeclared", "1".parse().unwrap());
    tx.send(Frame::trailers(trailers)).unwrap();
    let response = send(&pool, request(Method::POST, body, &[("trailer", "x-sum")]))
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let (data, trailers) = collect(response).await;
    assert_eq!(data, "wxyz!");
    assert_eq!(trailers.unwrap()["x-check"], "ok");
    let (head, body) = served.await.unwrap();
    assert!(head.contains("transfer-encoding: chunked\r\n"), "{head}");
    assert_eq!(body, b"3\r\nabc\r\n2\r\nde\r\n0\r\nx-sum: 9\r\n\r\n");
    drop(tx);
}

/// Goal: an answer without length or chunking ends at the close, and its connection is
/// not pooled; bytes past an answer's length keep its connection out of the pool too.
/// Method: two upstream connections, one of each; after each body, the pool's next
/// connection is a new one.
#[tokio::test]
async fn close_delimited_answers_and_extra_bytes_keep_a_connection_out_of_the_pool() {
    let (listener, pool) = upstream().await;
    let served = tokio::spawn(async move {
        let answers: [&[u8]; 3] = [
            b"HTTP/1.1 200 OK\r\n\r\nuntil the close",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA",
            b"HTTP/1.1 204 No Content\r\n\r\n",
        ];
        for answer in answers {
            let (mut socket, _) = listener.accept().await.unwrap();
            read_request(&mut socket, &mut Vec::new(), 0).await;
            socket.write_all(answer).await.unwrap();
            if answer.starts_with(b"HTTP/1.1 200 OK\r\n\r\n") {
                socket.shutdown().await.unwrap();
            }
            // The socket is kept open until the proxy's next connection arrives, so
            // only the proxy's choice decides whether it dials again.
            std::mem::forget(socket);
        }
    });
    let response = send(&pool, request(Method::GET, whole(b""), &[]))
        .await
        .unwrap();
    assert_eq!(collect(response).await.0, "until the close");
    let response = send(&pool, request(Method::GET, whole(b""), &[]))
        .await
        .unwrap();
    assert_eq!(collect(response).await.0, "ok");
    let response = send(&pool, request(Method::GET, whole(b""), &[]))
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    // Three answers, three connections: the test's upstream accepted each.
    tokio::time::timeout(DEADLINE, served)
        .await
        .unwrap()
        .unwrap();
}

/// Goal: an upstream that answers before taking the whole body is heard at once, while
/// the client's body still waits, and that connection is not reused. Method: a body
/// declaring 1,000 bytes sends 10 and stalls; the upstream answers 413 after the head.
#[tokio::test]
async fn an_early_answer_is_heard_while_the_body_waits() {
    let (listener, pool) = upstream().await;
    let served = first_then_second(
        listener,
        b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0\r\n\r\n",
    );
    let (tx, body) = fed();
    tx.send(Frame::data(Bytes::from(vec![b'a'; 10]))).unwrap();
    let response = send(
        &pool,
        request(Method::PUT, body, &[("content-length", "1000")]),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 413);
    assert!(collect(response).await.0.is_empty());
    // The next request needs a new connection: the upstream accepts it and answers.
    let response = send(&pool, request(Method::GET, whole(b""), &[]))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    tokio::time::timeout(DEADLINE, served)
        .await
        .unwrap()
        .unwrap();
    drop(tx);
}

/// Goal: a request whose connection fails after it was written is the request's
/// failure, never sent again. Method: the upstream reads the request and closes without
/// answering; the exchange fails with 502's error, and no second connection was opened.
#[tokio::test]
async fn a_request_written_is_never_sent_twice() {
    let (listener, pool) = upstream().await;
    let served = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        read_request(&mut socket, &mut Vec::new(), 3).await;
        drop(socket);
        listener
    });
    let Err(err) = send(&pool, request(Method::PUT, whole(b"abc"), &[])).await else {
        panic!("an answer came from an upstream that sent none");
    };
    assert!(
        matches!(&err, ProxyError::Upstream(m) if m.contains("closed the connection before answering")),
        "{err:?}"
    );
    let listener = served.await.unwrap();
    // A retry would have connected before the exchange returned.
    assert!(!another_connection(&listener), "the request was sent again");
}

/// Goal: a pooled connection that the upstream closed while it was idle is never used:
/// the next request gets a new one and succeeds. Method: the upstream accepts a
/// connection and closes it; once it reads as closed it goes into the pool, and an
/// exchange runs.
#[tokio::test]
async fn a_pooled_connection_closed_while_idle_is_not_used() {
    let (listener, pool) = upstream().await;
    let served = tokio::spawn(async move {
        drop(listener.accept().await.unwrap());
        let (mut socket, _) = listener.accept().await.unwrap();
        read_request(&mut socket, &mut Vec::new(), 0).await;
        socket
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .await
            .unwrap();
    });
    let conn = pool.take_own().await.unwrap();
    let start = tokio::time::Instant::now();
    while conn.is_open() {
        assert!(start.elapsed() < DEADLINE, "the close never showed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    pool.put_own(conn);
    let response = send(&pool, request(Method::GET, whole(b""), &[]))
        .await
        .unwrap();
    assert_eq!(collect(response).await.0, "ok");
    tokio::time::timeout(DEADLINE, served)
        .await
        .unwrap()
        .unwrap();
}

/// Goal: answers that are too large or ambiguous fail the exchange with a reason, and
/// interim answers are skipped up to their limit. Method: one upstream connection per
/// scripted answer.
#[tokio::test]
async fn hostile_answers_are_refused_and_interim_ones_skipped() {
    let endless_head = {
        let mut head = b"HTTP/1.1 200 OK\r\nx-filler: ".to_vec();
        head.resize(codec::RESPONSE_HEAD_BYTES_MAX + 100, b'a');
        head
    };
    let interim = |n: usize| {
        let mut answer = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(n);
        answer.extend_from_slice(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
        answer
    };
    let cases: Vec<(Vec<u8>, Option<&str>)> = vec![
        (endless_head, Some("head is over")),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n".to_vec(),
            Some("ambiguous"),
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n".to_vec(),
            Some("differing"),
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n".to_vec(),
            Some("gzip"),
        ),
        (b"HTTP/1.1 2000 OK\r\n\r\n".to_vec(), Some("malformed")),
        (interim(INTERIM_RESPONSES_MAX), None),
        (interim(INTERIM_RESPONSES_MAX + 1), Some("interim")),
    ];
    for (answer, refused) in cases {
        let (listener, pool) = upstream().await;
        let served = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            read_request(&mut socket, &mut Vec::new(), 0).await;
            // The proxy may stop reading (and close) once it has refused the head.
            let _ = socket.write_all(&answer).await;
        });
        let result = send(&pool, request(Method::GET, whole(b""), &[])).await;
        match (refused, result) {
            (None, Ok(response)) => assert_eq!(response.status(), 200),
            (Some(reason), Err(ProxyError::Upstream(m))) => {
                assert!(m.contains(reason), "{m:?} does not say {reason:?}");
            }
            (refused, result) => {
                panic!("expected {refused:?}, got {:?}", result.map(|r| r.status()))
            }
        }
        served.await.unwrap();
    }
}

/// Goal: a chunked answer whose framing breaks mid-body, or that is cut off, fails the
/// body (the client's answer is cut short, never completed with wrong bytes) and its
/// connection is dropped. Method: a bare LF after a chunk; a close mid-length.
#[tokio::test]
async fn a_body_that_breaks_mid_way_fails() {
    let answers: [&[u8]; 2] = [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc",
    ];
    for answer in answers {
        let (listener, pool) = upstream().await;
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            read_request(&mut socket, &mut Vec::new(), 0).await;
            socket.write_all(answer).await.unwrap();
        });
        let response = send(&pool, request(Method::GET, whole(b""), &[]))
            .await
            .unwrap();
        let body = response.into_body().collect();
        let err = tokio::time::timeout(DEADLINE, body)
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(err, BodyError::Upstream(_)), "{err:?}");
    }
}

/// Goal: a connection whose upstream answered 101 (switching it to another protocol) is
/// never put back for the next request, even though the answer has no body. Method: the
/// upstream answers 101 on its first connection and keeps it open; the next request
/// must arrive on a second connection.
#[tokio::test]
async fn a_connection_that_answered_101_is_not_reused() {
    let (listener, pool) = upstream().await;
    let served = first_then_second(
        listener,
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
    );
    let response = send(&pool, request(Method::GET, whole(b""), &[]))
        .await
        .unwrap();
    assert_eq!(response.status(), 101);
    drop(response);
    let response = send(&pool, request(Method::GET, whole(b""), &[]))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    tokio::time::timeout(DEADLINE, served)
        .await
        .unwrap()
        .unwrap();
}

/// Goal: an answer whose head arrives a byte per read (an interim answer first) is read
/// as one answer, its body left whole: parsing only once a line has ended loses nothing
/// between reads. Method: an upstream that writes each byte of its answer on its own,
/// with `TCP_NODELAY` and a yield between writes.
#[tokio::test]
async fn an_answer_trickled_a_byte_at_a_time_is_read_whole() {
    let (listener, pool) = upstream().await;
    let served = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        socket.set_nodelay(true).unwrap();
        read_request(&mut socket, &mut Vec::new(), 0).await;
        let answer: &[u8] =
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 5\r\n\r\nhello";
        for byte in answer {
            socket.write_all(std::slice::from_ref(byte)).await.unwrap();
            socket.flush().await.unwrap();
            tokio::task::yield_now().await;
        }
        socket
    });
    let response = send(&pool, request(Method::GET, whole(b""), &[]))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-a"], "1");
    assert_eq!(collect(response).await.0, "hello");
    drop(served.await.unwrap());
}
