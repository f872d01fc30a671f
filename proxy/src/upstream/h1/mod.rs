//! The proxy's own HTTP/1.1 exchange with a plain `http://` upstream, run in the
//! request's own task.
//!
//! With hyper's client, every upstream connection has a task of its own, and each
//! request crosses to it and back through channels: two dispatchers and two task wake-ups
//! per request, about a quarter of the proxy's instructions per request (see
//! `docs/benchmarks.md`). Here the request's task writes the request and reads the
//! answer itself, on a connection it takes from the pool and gives back when the answer's
//! body has ended. hyper still runs the client side, HTTP/2 and TLS upstreams, and every
//! request that may upgrade (`upstream_http1_client = "hyper"` uses it for all).
//!
//! The rules it keeps:
//! - **A request is sent at most once**, as with hyper's client. A pooled connection is
//!   checked before it is used (the upstream may have closed it while idle); once the
//!   first byte of a request is written, a failure is the request's failure (502), never
//!   a retry.
//! - **The body streams both ways.** The request body is written as the client sends it
//!   (framed by its `Content-Length`, or chunked), while the answer is read: an upstream
//!   that answers before taking the whole body (a 413, a 401) is heard at once. The rest
//!   of the body is then not sent (where hyper's client would go on sending it: the
//!   upstream has answered without it), and the connection is closed, not reused.
//! - **A connection is reused only after a whole, well-framed exchange**: the request
//!   body all sent, the answer's body read to its end, nothing extra after it, HTTP/1.1
//!   without `Connection: close`, not a 101.
//! - **The answer is parsed under limits and refused when ambiguous** ([`codec`]).

pub(crate) mod codec;

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, Method, Request, Response, header};
use http_body::{Body, Frame, SizeHint};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use self::codec::{ChunkedDecoder, Decoded, RequestFraming, ResponseFraming, ResponseHead};
use super::pool::Pool;
use crate::body::BodyError;
use crate::error::ProxyError;
use crate::stream::BodyFault;

/// Room made in a connection's read buffer before a read of an answer's head, or of a
/// body of unknown length, in bytes.
const READ_BYTES: usize = 8 * 1024;

/// Most room made before a read of a body of known length: up to its length, so a large
/// body is read in large pieces and a small one does not make a large buffer.
const READ_BYTES_MAX: usize = 64 * 1024;

/// Most buffers handed to one vectored write.
const WRITE_SLICES_MAX: usize = 16;

/// Body bytes queued before a write: what the body has ready, up to this, goes out in
/// one system call with what was queued before it.
const WRITE_COALESCE_BYTES: usize = 64 * 1024;

/// Room for buffers in a request's write queue from the start: the head and a body
/// read ahead whole, or a chunk's size line, data and end, without growing it.
const WRITE_QUEUE_SLOTS: usize = 4;

/// Most interim (1xx) answers skipped before the final one; more fail the exchange.
pub(crate) const INTERIM_RESPONSES_MAX: usize = 16;

/// An HTTP/1.1 connection to the upstream, with what has been read from it and not yet
/// used.
pub(crate) struct Conn {
    io: TcpStream,
    buf: BytesMut,
}

impl Conn {
    pub(super) fn new(io: TcpStream) -> Self {
        Self {
            io,
            buf: BytesMut::new(),
        }
    }

    /// Whether an idle connection can carry a request: the upstream has neither closed
    /// it nor sent anything on it since its last answer.
    ///
    /// No system call unless the runtime saw the socket become readable since its last
    /// read: the reads here leave a socket they drained marked not readable (a short read
    /// drains it), so an idle connection the upstream left alone is known open from that
    /// mark. Only a marked one is read (one byte, which finds the close).
    pub(super) fn is_open(&self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        // No task waits on an idle connection: the no-op waker replaces nothing.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match self.io.poll_read_ready(&mut cx) {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            Poll::Ready(Ok(())) => {
                let mut probe = [0u8; 1];
                matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }

    /// Reads what has arrived into the buffer, with room for about `want` bytes:
    /// `Ok(0)` is the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < want / 4 + 1 {
            self.buf.reserve(want);
        }
        // Through `AsyncRead`, which marks the socket drained after a short read, rather
        // than `try_read_buf`, which leaves it marked readable until a read finds nothing:
        // that read would be one more system call per request.
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)
    }
}

/// Sends `request` on `conn` and returns the answer once its head has arrived; its body
/// reads on from the connection and gives it back to `pool` at its end.
///
/// The request was [prepared](super::HttpUpstream::prepare): hop-by-hop headers are
/// gone, `Host` is set, the target is in origin form.
///
/// Generic over the request body only so that the tests can send bodies of their own;
/// the proxy sends an [`UpstreamBody`](crate::stream::UpstreamBody).
///
/// Not an `async fn`: the request is taken apart and its head written out before the
/// future is made, so the future (inline in every request's) keeps only what the
/// exchange needs, not the request as well.
pub(super) fn exchange<B>(
    conn: Conn,
    request: Request<B>,
    pool: &Arc<Pool>,
) -> impl Future<Output = Result<Response<OwnBody>, ProxyError>> + use<'_, B>
where
    B: Body<Data = Bytes, Error = BodyFault> + Unpin,
{
    let send = Send::new(conn, request);
    async move {
        let mut send = send?;
        let answer = std::future::poll_fn(|cx| send.poll(cx)).await?;
        let body_sent = send.body.is_none() && send.write_failed.is_none();
        let state = match answer.framing {
            ResponseFraming::Empty | ResponseFraming::Length(0) => Reading::Done,
            ResponseFraming::Length(n) => Reading::Length(n),
            ResponseFraming::Chunked => Reading::Chunked(ChunkedDecoder::default()),
            ResponseFraming::Close => Reading::Close,
        };
        let mut response = Response::new(OwnBody {
            conn: Some(send.conn),
            state,
            reusable: answer.keep_alive && body_sent,
            pool: Arc::clone(pool),
        });
        *response.status_mut() = answer.status;
        *response.version_mut() = answer.version;
        *response.headers_mut() = answer.headers;
        Ok(response)
    }
}

/// How the request body goes on this hop, as hyper's client frames it: the client's
/// `Content-Length` when it sent one; none for a body that has already ended; a length
/// the body knows exactly; else chunked, except for GET and HEAD, which send no body.
fn request_framing(
    method: &Method,
    headers: &HeaderMap,
    body: &impl Body,
) -> Result<RequestFraming, ProxyError> {
    if let Some(value) = headers.get(header::CONTENT_LENGTH) {
        // The client side parsed it already, as the body's length.
        let len = value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| ProxyError::BadRequest("Content-Length is not a length".to_owned()))?;
        return Ok(if len == 0 {
            RequestFraming::None
        } else {
            RequestFraming::Length { len, add: false }
        });
    }
    if body.is_end_stream() {
        return Ok(RequestFraming::None);
    }
    if let Some(len) = body.size_hint().exact() {
        return Ok(RequestFraming::Length { len, add: true });
    }
    Ok(match *method {
        Method::GET | Method::HEAD => RequestFraming::None,
        _ => RequestFraming::Chunked,
    })
}

/// The trailer names the request's `Trailer` header declares: only those are sent.
fn declared_trailers(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::TRAILER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

/// A request on its way: the head and body written while the answer is read.
struct Send<B> {
    conn: Conn,
    /// The request's method: the answer to a HEAD has no body.
    method: Method,
    /// The body still to send; `None` once it has ended (or there is none).
    body: Option<B>,
    framing: RequestFraming,
    /// Bytes of a `Content-Length` body not yet taken from the body.
    left: u64,
    /// Trailer names `Trailer` declared, for a chunked body.
    declared: Vec<HeaderName>,
    /// Bytes to write, in order.
    queue: VecDeque<Bytes>,
    /// How many bytes `queue` holds.
    queued: usize,
    /// The write that failed: the upstream may still have answered (early, and then
    /// closed), so its answer is read before this is reported.
    write_failed: Option<io::Error>,
    /// Interim (1xx) answers skipped.
    interim: usize,
    /// How much of `conn.buf` the last parse of the answer head found partial: it is
    /// parsed again once a line has ended after that ([`codec::worth_parsing`]).
    head_parsed: usize,
}

impl<B> Send<B>
where
    B: Body<Data = Bytes, Error = BodyFault> + Unpin,
{
    /// The exchange of `request` on `conn`, its head written out, nothing sent yet.
    fn new(conn: Conn, request: Request<B>) -> Result<Self, ProxyError> {
        let (parts, body) = request.into_parts();
        let framing = request_framing(&parts.method, &parts.headers, &body)?;
        let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let mut head = BytesMut::new();
        codec::encode_head(&mut head, &parts.method, target, &parts.headers, framing);
        let declared = if framing == RequestFraming::Chunked {
            declared_trailers(&parts.headers)
        } else {
            Vec::new()
        };
        let queued = head.len();
        let mut queue = VecDeque::with_capacity(WRITE_QUEUE_SLOTS);
        queue.push_back(head.freeze());
        Ok(Self {
            conn,
            method: parts.method,
            body: (framing != RequestFraming::None).then_some(body),
            framing,
            left: match framing {
                RequestFraming::Length { len, .. } => len,
                _ => 0,
            },
            declared,
            queued,
            queue,
            write_failed: None,
            interim: 0,
            head_parsed: 0,
        })
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<ResponseHead, ProxyError>> {
        loop {
            // What the body has ready goes out with what is queued (the head, first) in
            // one write: a body read ahead whole leaves in the same system call as its
            // head.
            let mut body_waits = false;
            while self.write_failed.is_none()
                && self.queued < WRITE_COALESCE_BYTES
                && let Some(body) = self.body.as_mut()
            {
                match Pin::new(body).poll_frame(cx) {
                    Poll::Ready(frame) => self.take(frame)?,
                    Poll::Pending => {
                        body_waits = true;
                        break;
                    }
                }
            }
            self.poll_write(cx);
            if self.queue.is_empty() && self.body.is_some() && !body_waits {
                // All written, and the body may have more ready.
                continue;
            }
            // Whatever is left waits (the socket or the body will wake this task); the
            // answer may come meanwhile.
            return self.poll_answer(cx);
        }
    }

    /// Writes what is queued until the socket takes no more.
    fn poll_write(&mut self, cx: &mut Context<'_>) {
        while !self.queue.is_empty() && self.write_failed.is_none() {
            let mut slices = [IoSlice::new(&[]); WRITE_SLICES_MAX];
            let mut count = 0;
            for (slice, bytes) in slices.iter_mut().zip(&self.queue) {
                *slice = IoSlice::new(bytes);
                count += 1;
            }
            match Pin::new(&mut self.conn.io).poll_write_vectored(cx, &slices[..count]) {
                Poll::Pending => return,
                Poll::Ready(Ok(0)) => {
                    self.write_failed = Some(io::ErrorKind::WriteZero.into());
                }
                Poll::Ready(Ok(mut n)) => {
                    while n > 0 {
                        let Some(front) = self.queue.front_mut() else {
                            break;
                        };
                        let step = n.min(front.len());
                        front.advance(step);
                        n -= step;
                        self.queued -= step;
                        if front.is_empty() {
                            self.queue.pop_front();
                        }
                    }
                }
                Poll::Ready(Err(e)) => self.write_failed = Some(e),
            }
        }
        if self.write_failed.is_some() {
            // Nothing more goes out on this connection.
            self.queue.clear();
            self.queued = 0;
            self.body = None;
        }
    }

    fn push(&mut self, bytes: Bytes) {
        self.queued += bytes.len();
        self.queue.push_back(bytes);
    }

    /// Queues a frame of the request body, framed for the hop.
    fn take(&mut self, frame: Option<Result<Frame<Bytes>, BodyFault>>) -> Result<(), ProxyError> {
        let frame = match frame {
            None => {
                if self.left > 0 {
                    return Err(ProxyError::Upstream(format!(
                        "the request body ended {} bytes short of its Content-Length",
                        self.left
                    )));
                }
                if self.framing == RequestFraming::Chunked {
                    self.push(codec::last_chunk(None, &[]));
                }
                self.body = None;
                return Ok(());
            }
            // The client's body failed: answer with its fault.
            Some(Err(fault)) => return Err(fault.to_proxy_error()),
            Some(Ok(frame)) => frame,
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if self.framing == RequestFraming::Chunked {
                    let last = codec::last_chunk(frame.trailers_ref(), &self.declared);
                    self.push(last);
                    self.body = None;
                }
                return Ok(());
            }
        };
        if data.is_empty() {
            return Ok(());
        }
        if self.framing == RequestFraming::Chunked {
            self.push(codec::chunk_size_line(data.len()));
            self.push(data);
            self.push(Bytes::from_static(codec::CHUNK_END));
            return Ok(());
        }
        let len = data.len() as u64;
        if len > self.left {
            return Err(ProxyError::Upstream(
                "the request body is longer than its Content-Length".to_owned(),
            ));
        }
        self.left -= len;
        self.push(data);
        if self.left == 0 {
            // The whole length is queued: the body has nothing more to send.
            self.body = None;
        }
        Ok(())
    }

    /// Takes the answer head off the front of the connection's buffer; when it has not
    /// all arrived, notes how much was looked at.
    fn take_head(&mut self) -> Result<Option<ResponseHead>, ProxyError> {
        let taken = codec::take_head(&mut self.conn.buf, &self.method)
            .map_err(|e| ProxyError::Upstream(e.0))?;
        self.head_parsed = if taken.is_none() {
            self.conn.buf.len()
        } else {
            0
        };
        Ok(taken)
    }

    /// Reads until the answer's head (interim answers skipped) has arrived.
    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<Result<ResponseHead, ProxyError>> {
        loop {
            if codec::worth_parsing(&self.conn.buf, self.head_parsed)
                && let Some(head) = self.take_head()?
            {
                if head.status.is_informational()
                    && head.status != http::StatusCode::SWITCHING_PROTOCOLS
                {
                    self.interim += 1;
                    if self.interim > INTERIM_RESPONSES_MAX {
                        return Poll::Ready(Err(ProxyError::Upstream(format!(
                            "the upstream sent over {INTERIM_RESPONSES_MAX} interim answers"
                        ))));
                    }
                    continue;
                }
                return Poll::Ready(Ok(head));
            }
            let read = ready!(self.conn.poll_fill(cx, READ_BYTES));
            match read {
                Ok(0) | Err(_) if self.write_failed.is_some() => {
                    let e = self
                        .write_failed
                        .take()
                        .unwrap_or_else(|| io::ErrorKind::BrokenPipe.into());
                    return Poll::Ready(Err(ProxyError::Upstream(format!(
                        "cannot send the request to the upstream: {e}"
                    ))));
                }
                Ok(0) => {
                    return Poll::Ready(Err(ProxyError::Upstream(
                        "the upstream closed the connection before answering".to_owned(),
                    )));
                }
                Ok(_) => {}
                Err(e) => {
                    return Poll::Ready(Err(ProxyError::Upstream(format!(
                        "cannot read the upstream's answer: {e}"
                    ))));
                }
            }
        }
    }
}

/// Where an answer's body is.
enum Reading {
    /// This many bytes left.
    Length(u64),
    Chunked(ChunkedDecoder),
    /// Until the upstream closes.
    Close,
    /// Ended.
    Done,
}

/// An answer's body, read from its connection in the task that polls it; at its end the
/// connection goes back to the pool when it can carry another request. Dropped before
/// its end, it drops the connection.
pub(crate) struct OwnBody {
    /// `None` once the body has ended or failed.
    conn: Option<Conn>,
    state: Reading,
    /// The connection can carry another request once this body has ended.
    reusable: bool,
    pool: Arc<Pool>,
}

impl OwnBody {
    /// The body has ended: the connection goes back when it can carry another request
    /// (nothing read beyond this answer).
    fn finish(&mut self) {
        self.state = Reading::Done;
        if let Some(conn) = self.conn.take()
            && self.reusable
            && conn.buf.is_empty()
        {
            self.pool.put_own(conn);
        }
    }

    fn fail(&mut self, reason: String) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.conn = None;
        self.state = Reading::Done;
        Poll::Ready(Some(Err(BodyError::Upstream(reason))))
    }
}

impl Body for OwnBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match &mut this.state {
                Reading::Done => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Reading::Length(left) if !conn.buf.is_empty() => {
                    let take =
                        usize::try_from(*left).map_or(conn.buf.len(), |l| l.min(conn.buf.len()));
                    let data = conn.buf.split_to(take).freeze();
                    *left -= take as u64;
                    if *left == 0 {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Reading::Chunked(decoder) => match decoder.decode(&mut conn.buf) {
                    Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Ok(Decoded::Trailers(trailers)) => {
                        this.finish();
                        return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                    }
                    Ok(Decoded::End) => {
                        this.finish();
                        return Poll::Ready(None);
                    }
                    Ok(Decoded::More) => {}
                    Err(e) => return this.fail(e.0),
                },
                Reading::Close if !conn.buf.is_empty() => {
                    let data = conn.buf.split().freeze();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Reading::Length(_) | Reading::Close => {}
            }
            let want = match this.state {
                Reading::Length(left) => usize::try_from(left)
                    .map_or(READ_BYTES_MAX, |l| l.clamp(READ_BYTES, READ_BYTES_MAX)),
                _ => READ_BYTES,
            };
            match ready!(conn.poll_fill(cx, want)) {
                Ok(0) if matches!(this.state, Reading::Close) => {
                    // The close ends this body; the connection goes with it.
                    this.conn = None;
                    this.state = Reading::Done;
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    return this.fail("the upstream closed the connection mid-body".to_owned());
                }
                Ok(_) => {}
                Err(e) => return this.fail(format!("cannot read the upstream's body: {e}")),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, Reading::Done | Reading::Length(0))
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            Reading::Length(n) => SizeHint::with_exact(n),
            Reading::Done => SizeHint::with_exact(0),
            Reading::Chunked(_) | Reading::Close => SizeHint::default(),
        }
    }
}

impl Drop for OwnBody {
    fn drop(&mut self) {
        // A body with nothing to read (a HEAD or 204 answer) leaves its connection
        // reusable, though no one polled it.
        if matches!(self.state, Reading::Done) {
            self.finish();
        }
    }
}

#[cfg(test)]
mod tests;
