//! `palisade-floor`: a yardstick for the proxy's benchmarks, not a proxy to deploy.
//!
//! It does the least an HTTP/1 fencing proxy on tokio does for an equal-token write:
//! parse the request head (httparse), check its `Fencing-Token` against the highest seen
//! (in memory: nothing here is durable), forward head and body over a kept-alive
//! upstream connection, parse the answer's head and write the answer back. One task per
//! client connection, which owns one upstream connection; one thread.
//!
//! What it leaves out is what palisade's cost per request pays for beyond the floor:
//! hyper's connection state machines and header maps, streaming bodies (it reads each
//! body whole, up to [`BODY_BYTES_MAX`]), chunked bodies (refused), timeouts,
//! classification, the in-flight barrier, metrics, the audit log and the connection
//! table. `tests/bench/proxy.sh` runs it beside nginx and palisade with
//! `BASELINE_BIN=target/release/palisade-floor BASELINE_NAME=floor`;
//! `docs/benchmarks.md` says what it showed.
//!
//! It takes the flags the benchmark scripts give `palisade proxy` (`--listen`,
//! `--admin-listen`, `--upstream http://HOST:PORT`; others are ignored) and prints the
//! same ready line. Its admin port answers 200 to any request, so the scripts' fence
//! set-up passes.

use std::cell::Cell;
use std::process::ExitCode;
use std::rc::Rc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The largest head read, request or answer; a larger one ends the connection.
const HEAD_BYTES_MAX: usize = 64 * 1024;
/// The largest body read, request or answer; a larger one ends the connection.
const BODY_BYTES_MAX: usize = 1024 * 1024;
/// The most header lines in a head.
const HEADERS_MAX: usize = 64;
/// Each connection's read buffer starts at this size and doubles up to the limits above.
const BUFFER_BYTES: usize = 8 * 1024;

/// Headers that belong to one hop (RFC 9110 §7.6.1), not forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Why a connection ended early.
type Failure = &'static str;

/// Parses a head from a buffer, writing it rewritten for the next hop: `None` while
/// incomplete.
type Parse = fn(&[u8], &mut Vec<u8>) -> Result<Option<Head>, Failure>;

/// A parsed head: its length in the buffer, its body's, and (a request's) token.
#[derive(Debug, PartialEq)]
struct Head {
    len: usize,
    body: usize,
    token: Option<u64>,
}

/// Copies the header lines that are not hop-by-hop into `out` and reads the framing:
/// the body's length and the `Fencing-Token`.
fn copy_headers(
    headers: &[httparse::Header<'_>],
    out: &mut Vec<u8>,
) -> Result<(usize, Option<u64>), Failure> {
    let mut body = 0;
    let mut token = None;
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            body = number(h.value).ok_or("a Content-Length that is not a number")?;
            if body > BODY_BYTES_MAX {
                return Err("a body over BODY_BYTES_MAX");
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err("chunked bodies are not handled");
        } else if h.name.eq_ignore_ascii_case("fencing-token") {
            token = Some(number(h.value).ok_or("a Fencing-Token that is not a number")?);
        }
        if HOP_BY_HOP
            .iter()
            .any(|hop| hop.eq_ignore_ascii_case(h.name))
        {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok((body, token))
}

fn number<T: std::str::FromStr>(value: &[u8]) -> Option<T> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// A request head from `buf`, rewritten into `out` for the upstream; `None` while
/// incomplete.
fn parse_request(buf: &[u8], out: &mut Vec<u8>) -> Result<Option<Head>, Failure> {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut request = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(len) =
        request.parse(buf).map_err(|_| "a malformed request head")?
    else {
        return Ok(None);
    };
    out.clear();
    out.extend_from_slice(request.method.ok_or("no method")?.as_bytes());
    out.push(b' ');
    out.extend_from_slice(request.path.ok_or("no target")?.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let (body, token) = copy_headers(request.headers, out)?;
    Ok(Some(Head { len, body, token }))
}

/// An answer's head from `buf`, rewritten into `out` for the client; `None` while
/// incomplete.
fn parse_answer(buf: &[u8], out: &mut Vec<u8>) -> Result<Option<Head>, Failure> {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut answer = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(len) =
        answer.parse(buf).map_err(|_| "a malformed answer head")?
    else {
        return Ok(None);
    };
    let code = answer.code.ok_or("no status")?;
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    // httparse reads exactly three digits.
    out.extend_from_slice(&[
        b'0' + (code / 100) as u8,
        b'0' + (code / 10 % 10) as u8,
        b'0' + (code % 10) as u8,
    ]);
    out.push(b' ');
    out.extend_from_slice(answer.reason.unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let (body, _) = copy_headers(answer.headers, out)?;
    Ok(Some(Head {
        len,
        body,
        token: None,
    }))
}

/// A connection's read side: its buffer and how much of it holds unread bytes.
struct Reader {
    buf: Vec<u8>,
    filled: usize,
}

impl Reader {
    fn new() -> Self {
        Self {
            buf: vec![0; BUFFER_BYTES],
            filled: 0,
        }
    }

    /// Reads until `parse` finds a head and its body is whole; the rewritten head is in
    /// `out`, the body at `buf[head.len..head.len + head.body]`. `None`: the peer closed
    /// between messages.
    async fn message(
        &mut self,
        io: &mut TcpStream,
        out: &mut Vec<u8>,
        parse: Parse,
    ) -> Result<Option<Head>, Failure> {
        loop {
            if self.filled > 0
                && let Some(head) = parse(&self.buf[..self.filled], out)?
            {
                let whole = head.len + head.body;
                if self.buf.len() < whole {
                    self.buf.resize(whole, 0);
                }
                while self.filled < whole {
                    self.fill(io).await?.ok_or("the peer closed mid-body")?;
                }
                return Ok(Some(head));
            }
            if self.filled == self.buf.len() {
                if self.buf.len() >= HEAD_BYTES_MAX {
                    return Err("a head over HEAD_BYTES_MAX");
                }
                self.buf.resize(self.buf.len() * 2, 0);
            }
            if self.fill(io).await?.is_none() {
                return if self.filled == 0 {
                    Ok(None)
                } else {
                    Err("the peer closed mid-head")
                };
            }
        }
    }

    async fn fill(&mut self, io: &mut TcpStream) -> Result<Option<usize>, Failure> {
        let n = io
            .read(&mut self.buf[self.filled..])
            .await
            .map_err(|_| "a read failed")?;
        self.filled += n;
        Ok((n > 0).then_some(n))
    }

    /// Drops the first `n` bytes (a message handled).
    fn consume(&mut self, n: usize) {
        self.buf.copy_within(n..self.filled, 0);
        self.filled -= n;
    }
}

async fn serve(mut client: TcpStream, upstream: &str, fence: &Cell<u64>) -> Result<(), Failure> {
    let mut upstream = TcpStream::connect(upstream)
        .await
        .map_err(|_| "the upstream refused")?;
    upstream.set_nodelay(true).map_err(|_| "setsockopt")?;
    client.set_nodelay(true).map_err(|_| "setsockopt")?;
    let (mut from_client, mut from_upstream) = (Reader::new(), Reader::new());
    let mut out = Vec::with_capacity(BUFFER_BYTES);
    while let Some(head) = from_client
        .message(&mut client, &mut out, parse_request)
        .await?
    {
        let whole = head.len + head.body;
        if let Some(token) = head.token {
            if token < fence.get() {
                client
                    .write_all(b"HTTP/1.1 409 Conflict\r\ncontent-length: 0\r\n\r\n")
                    .await
                    .map_err(|_| "a write failed")?;
                from_client.consume(whole);
                continue;
            }
            fence.set(token);
        }
        out.extend_from_slice(&from_client.buf[head.len..whole]);
        upstream
            .write_all(&out)
            .await
            .map_err(|_| "a write upstream failed")?;
        from_client.consume(whole);
        let answer = from_upstream
            .message(&mut upstream, &mut out, parse_answer)
            .await?
            .ok_or("the upstream closed")?;
        let whole = answer.len + answer.body;
        out.extend_from_slice(&from_upstream.buf[answer.len..whole]);
        client.write_all(&out).await.map_err(|_| "a write failed")?;
        from_upstream.consume(whole);
    }
    Ok(())
}

/// The value after `flag` in `args`.
fn flag(args: &[String], flag: &str) -> Result<String, String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .ok_or_else(|| format!("{flag} is missing"))
}

async fn run(args: &[String]) -> Result<(), String> {
    let listen = flag(args, "--listen")?;
    let admin = flag(args, "--admin-listen")?;
    let upstream = flag(args, "--upstream")?;
    let upstream: Rc<str> = upstream
        .strip_prefix("http://")
        .ok_or("--upstream must be http://HOST:PORT")?
        .trim_end_matches('/')
        .into();
    let listener = TcpListener::bind(&listen)
        .await
        .map_err(|e| format!("{listen}: {e}"))?;
    let admin = TcpListener::bind(&admin)
        .await
        .map_err(|e| format!("{admin}: {e}"))?;
    tokio::task::spawn_local(async move {
        while let Ok((mut stream, _)) = admin.accept().await {
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
                .await;
        }
    });
    println!("palisade proxy listening on {listen} (palisade-floor, a benchmark yardstick)");
    let fence = Rc::new(Cell::new(0));
    loop {
        let (stream, _) = listener
            .accept()
            .await
            .map_err(|e| format!("accept: {e}"))?;
        let (upstream, fence) = (Rc::clone(&upstream), Rc::clone(&fence));
        tokio::task::spawn_local(async move {
            if let Err(why) = serve(stream, &upstream, &fence).await {
                eprintln!("palisade-floor: connection ended: {why}");
            }
        });
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("palisade-floor: {e}");
            return ExitCode::FAILURE;
        }
    };
    match tokio::task::LocalSet::new().block_on(&runtime, run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("palisade-floor: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `message` (a head and a body of `body` bytes) and checks the head given
    /// back for the next hop.
    fn rewritten(parse: Parse, message: &[u8], body: usize, token: Option<u64>, expected: &str) {
        let mut out = Vec::new();
        let len = message.len() - body;
        assert_eq!(
            parse(message, &mut out),
            Ok(Some(Head { len, body, token }))
        );
        assert_eq!(String::from_utf8_lossy(&out), expected);
        assert_eq!(
            parse(&message[..len - 1], &mut out),
            Ok(None),
            "an unfinished head"
        );
    }

    /// Goal: a request is forwarded with its hop-by-hop headers dropped, and its body's
    /// length and token read from the head.
    #[test]
    fn a_request_head_is_rewritten_without_hop_by_hop_headers() {
        rewritten(
            parse_request,
            b"PUT /k HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nContent-Length: 3\r\nFencing-Token: 7\r\n\r\nabc",
            3,
            Some(7),
            "PUT /k HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nFencing-Token: 7\r\n\r\n",
        );
    }

    /// Goal: what the yardstick does not handle ends the connection, never a guess:
    /// chunked bodies, a length that is not a number, a body over the limit, a token
    /// that is not a number.
    #[test]
    fn framing_it_does_not_handle_is_refused() {
        let mut out = Vec::new();
        for head in [
            "PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_owned(),
            "PUT / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n".to_owned(),
            format!(
                "PUT / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
                BODY_BYTES_MAX + 1
            ),
            "PUT / HTTP/1.1\r\nFencing-Token: -1\r\n\r\n".to_owned(),
        ] {
            assert!(
                parse_request(head.as_bytes(), &mut out).is_err(),
                "{head:?}"
            );
        }
    }

    /// Goal: an answer's status line is rebuilt from its code and reason.
    #[test]
    fn an_answer_head_is_rewritten() {
        rewritten(
            parse_answer,
            b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nKeep-Alive: timeout=5\r\n\r\nok",
            2,
            None,
            "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n",
        );
    }

    /// Goal: a head that never ends, or a body longer than its peer sends, ends the
    /// connection at the limit or at the peer's close: the reader neither grows past
    /// `HEAD_BYTES_MAX` nor waits forever for bytes that cannot come.
    #[tokio::test]
    async fn an_endless_head_and_a_short_body_end_the_read() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = tokio::spawn(async move {
            let mut endless = TcpStream::connect(addr).await.unwrap();
            let mut line = b"PUT / HTTP/1.1\r\n".to_vec();
            line.extend(std::iter::repeat_n(b'a', HEAD_BYTES_MAX));
            // The reader stops at its limit and drops the connection: the write may fail.
            let _ = endless.write_all(&line).await;
            let mut short = TcpStream::connect(addr).await.unwrap();
            short
                .write_all(b"PUT / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
                .await
                .unwrap();
        });
        let mut out = Vec::new();
        let (mut endless, _) = listener.accept().await.unwrap();
        let read = Reader::new()
            .message(&mut endless, &mut out, parse_request)
            .await;
        assert_eq!(read, Err("a head over HEAD_BYTES_MAX"));
        drop(endless);
        let (mut short, _) = listener.accept().await.unwrap();
        peer.await.unwrap();
        let read = Reader::new()
            .message(&mut short, &mut out, parse_request)
            .await;
        assert_eq!(read, Err("the peer closed mid-body"));
    }
}
