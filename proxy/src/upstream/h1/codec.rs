//! HTTP/1.1 on the upstream hop, as bytes: the request head written, the answer's head
//! parsed and its body's framing decided, chunked bodies encoded and decoded. No I/O:
//! every function here takes and returns buffers, so each rule is tested (and fuzzed)
//! on its own.
//!
//! The upstream is trusted more than a client, but not to be well formed: a broken or
//! hostile answer must never make the proxy read a body other than the one the upstream
//! meant, nor hold unbounded memory. So every size has a named limit, and anything
//! ambiguous is refused rather than guessed (the exchange then fails with 502):
//! - an answer with both `Transfer-Encoding` and `Content-Length`, with differing
//!   `Content-Length` values, or with a coding besides one `chunked`;
//! - a bare LF where CRLF must be, in a chunk's size line or after its data;
//! - a chunk size that does not fit in 64 bits.

use std::fmt::Write as _;
use std::mem::MaybeUninit;
use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version, header};
use smallvec::SmallVec;

use super::super::HOP_BY_HOP;

/// Longest answer head read from the upstream (status line and headers), in bytes.
pub(crate) const RESPONSE_HEAD_BYTES_MAX: usize = 64 * 1024;

/// Most header lines in an answer head, or in the trailers of a chunked answer.
pub(crate) const RESPONSE_HEADERS_MAX: usize = 128;

/// Longest size line of one chunk, extensions included.
pub(crate) const CHUNK_LINE_BYTES_MAX: usize = 4 * 1024;

/// Longest trailer section of a chunked answer, in bytes.
pub(crate) const TRAILER_BYTES_MAX: usize = 64 * 1024;

/// What is wrong with what the upstream sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct CodecError(pub(crate) String);

fn bad(reason: impl Into<String>) -> CodecError {
    CodecError(reason.into())
}

/// How a request body is framed on the upstream hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestFraming {
    /// No body.
    None,
    /// `Content-Length`, from the client's header (already among the headers) or, when
    /// `add` is set, written by the proxy.
    Length { len: u64, add: bool },
    /// `Transfer-Encoding: chunked`, written by the proxy.
    Chunked,
}

/// Writes the request line and headers of a request to `out`, ending with the blank
/// line. `target` is the origin-form target (path and query). The framing header is
/// written here when the proxy adds it; the request's own headers never carry
/// `Transfer-Encoding` (it is hop-by-hop and was removed).
pub(crate) fn encode_head(
    out: &mut BytesMut,
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    framing: RequestFraming,
) {
    let size: usize = headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum();
    out.reserve(method.as_str().len() + target.len() + size + 64);
    out.put_slice(method.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(target.as_bytes());
    out.put_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    match framing {
        RequestFraming::Length { len, add: true } => {
            // Writing into a `BytesMut` cannot fail.
            let _ = write!(out, "content-length: {len}\r\n");
        }
        RequestFraming::Chunked => out.put_slice(b"transfer-encoding: chunked\r\n"),
        RequestFraming::None | RequestFraming::Length { add: false, .. } => {}
    }
    out.put_slice(b"\r\n");
}

/// The size line that goes before a chunk of `len` bytes (`len` above 0).
pub(crate) fn chunk_size_line(len: usize) -> Bytes {
    Bytes::from(format!("{len:x}\r\n"))
}

/// The end of a chunk's data.
pub(crate) const CHUNK_END: &[u8] = b"\r\n";

/// The last chunk and the trailer section of a chunked body: `trailers` are written
/// only when `Trailer` declared them (`declared`), as hyper does.
pub(crate) fn last_chunk(trailers: Option<&HeaderMap>, declared: &[HeaderName]) -> Bytes {
    let mut out = BytesMut::from(&b"0\r\n"[..]);
    for (name, value) in trailers.into_iter().flatten() {
        if declared.contains(name) {
            out.put_slice(name.as_str().as_bytes());
            out.put_slice(b": ");
            out.put_slice(value.as_bytes());
            out.put_slice(b"\r\n");
        }
    }
    out.put_slice(b"\r\n");
    out.freeze()
}

/// How an answer's body is framed (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResponseFraming {
    /// No body: an answer to HEAD, a 1xx, 204 or 304.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunked.
    Chunked,
    /// Everything until the upstream closes the connection.
    Close,
}

/// An answer head, its hop-by-hop headers left out.
#[derive(Debug)]
pub(crate) struct ResponseHead {
    pub(crate) status: StatusCode,
    pub(crate) version: Version,
    pub(crate) headers: HeaderMap,
    pub(crate) framing: ResponseFraming,
    /// The connection may carry another request after this answer's body: HTTP/1.1,
    /// no `Connection: close`, a body that does not end at the close, and not a 101.
    pub(crate) keep_alive: bool,
}

/// Header lines an answer head usually has at most: where they lie is kept on the
/// stack up to this many, and in one allocation beyond.
const HEAD_LINES_INLINE: usize = 24;

/// Takes an answer head, for a request of `method`, off the start of `buf`. `Ok(None)`:
/// not all of it has arrived (and it is still within [`RESPONSE_HEAD_BYTES_MAX`]); `buf`
/// is left as it was. `Ok(Some(head))`: the head's bytes were split off `buf`.
///
/// The head's header values are slices of those bytes, shared rather than copied (one
/// allocation and copy per header line saved): they hold the head's part of the read
/// buffer until the answer's head has been written to the client.
///
/// The head's headers come without the hop-by-hop ones (those of the proxy's list, and
/// any that `Connection` names): they are read for the framing and the connection's
/// reuse in the same pass, and never put in the map, rather than put in and removed.
pub(crate) fn take_head(
    buf: &mut BytesMut,
    method: &Method,
) -> Result<Option<ResponseHead>, CodecError> {
    // Where each line's value lies in the head: the lines borrow `buf`, which must be
    // split before the values can share its bytes.
    let mut located: SmallVec<[(HeaderName, Range<usize>); HEAD_LINES_INLINE]> = SmallVec::new();
    let (len, status, version) = {
        // Left uninitialised: httparse writes only the lines it finds, where filling
        // all 128 (4 KiB) would cost more than parsing a usual head.
        let mut lines =
            [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; RESPONSE_HEADERS_MAX];
        let mut parsed = httparse::Response::new(&mut []);
        let parse = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut parsed,
            buf,
            &mut lines,
        );
        let len = match parse {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() > RESPONSE_HEAD_BYTES_MAX => {
                return Err(bad(format!(
                    "the answer's head is over {RESPONSE_HEAD_BYTES_MAX} bytes"
                )));
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(bad(format!(
                    "the answer has over {RESPONSE_HEADERS_MAX} header lines"
                )));
            }
            Err(e) => return Err(bad(format!("the answer's head is malformed: {e}"))),
        };
        if len > RESPONSE_HEAD_BYTES_MAX {
            return Err(bad(format!(
                "the answer's head is over {RESPONSE_HEAD_BYTES_MAX} bytes"
            )));
        }
        // httparse parsed a status code of three digits.
        let status = StatusCode::from_u16(parsed.code.unwrap_or(0))
            .map_err(|e| bad(format!("the answer's status is not one: {e}")))?;
        let version = match parsed.version {
            Some(1) => Version::HTTP_11,
            _ => Version::HTTP_10,
        };
        let start = buf.as_ptr() as usize;
        for line in &*parsed.headers {
            let name = header_name(line.name.as_bytes()).map_err(|_| {
                bad(format!(
                    "the answer's header name {:?} is invalid",
                    line.name
                ))
            })?;
            located.push((name, within(start, len, line.value)?));
        }
        (len, status, version)
    };
    let bytes = buf.split_to(len).freeze();
    let mut headers = HeaderMap::with_capacity(located.len());
    let mut hop = Hop::default();
    for (name, at) in located.drain(..) {
        if hop.takes(&name, &bytes[at.clone()]) {
            continue;
        }
        let value = HeaderValue::from_maybe_shared(bytes.slice(at))
            .map_err(|_| bad(format!("the answer's header {name} has an invalid value")))?;
        headers.append(name, value);
    }
    // The framing is read from the lines as they came: a header `Connection` names is
    // hop-by-hop, but dropping `Content-Length` would change where the body ends.
    if hop.named.contains(&header::CONTENT_LENGTH) {
        return Err(bad(
            "the answer's Connection names Content-Length: its body's length would be \
             dropped with it",
        ));
    }
    let framing = framing(status, method, &headers, &hop.codings)?;
    for name in &hop.named {
        headers.remove(name);
    }
    // After a 101 the connection speaks another protocol: never HTTP/1 again.
    let keep_alive = version == Version::HTTP_11
        && framing != ResponseFraming::Close
        && !hop.close
        && status != StatusCode::SWITCHING_PROTOCOLS;
    Ok(Some(ResponseHead {
        status,
        version,
        headers,
        framing,
        keep_alive,
    }))
}

/// Where `value`, a slice httparse returned, lies in the head of `len` bytes starting at
/// address `start`. Any empty value is the empty range at 0. A value outside the head
/// cannot come from httparse; it is refused rather than sliced (which would panic).
fn within(start: usize, len: usize, value: &[u8]) -> Result<Range<usize>, CodecError> {
    if value.is_empty() {
        return Ok(0..0);
    }
    (value.as_ptr() as usize)
        .checked_sub(start)
        .filter(|at| at + value.len() <= len)
        .map(|at| at..at + value.len())
        .ok_or_else(|| bad("the answer's head parsed to a value outside it"))
}

/// [`take_head`] on a copy of `buf`, for tests and fuzzing: `Ok(Some((head, len)))`
/// when the head took `len` bytes at its start.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn parse_head(
    buf: &[u8],
    method: &Method,
) -> Result<Option<(ResponseHead, usize)>, CodecError> {
    let mut copy = BytesMut::from(buf);
    let head = take_head(&mut copy, method)?;
    Ok(head.map(|head| (head, buf.len() - copy.len())))
}

/// The name of an answer's header line, as `HeaderName::from_bytes` reads it. The
/// names most answers carry, spelled as servers send them (capitalised or in lower
/// case), are matched as they are: a comparison of a few bytes, where `from_bytes`
/// lower-cases the name into a buffer and looks it up, about 120 instructions a line.
/// Every other spelling goes through `from_bytes`.
fn header_name(raw: &[u8]) -> Result<HeaderName, http::header::InvalidHeaderName> {
    let known = match raw {
        b"Date" | b"date" => header::DATE,
        b"Server" | b"server" => header::SERVER,
        b"Content-Type" | b"content-type" => header::CONTENT_TYPE,
        b"Content-Length" | b"content-length" => header::CONTENT_LENGTH,
        b"Connection" | b"connection" => header::CONNECTION,
        b"Transfer-Encoding" | b"transfer-encoding" => header::TRANSFER_ENCODING,
        b"ETag" | b"Etag" | b"etag" => header::ETAG,
        b"Last-Modified" | b"last-modified" => header::LAST_MODIFIED,
        b"Accept-Ranges" | b"accept-ranges" => header::ACCEPT_RANGES,
        b"Cache-Control" | b"cache-control" => header::CACHE_CONTROL,
        b"Location" | b"location" => header::LOCATION,
        b"Vary" | b"vary" => header::VARY,
        _ => return HeaderName::from_bytes(raw),
    };
    Ok(known)
}

/// Whether an answer head arriving in `buf` is worth parsing: the first time (`parsed`
/// is 0) once anything has arrived; after an attempt that found it partial at `parsed`
/// bytes, once a line has ended since, or once the head is over
/// [`RESPONSE_HEAD_BYTES_MAX`] (then the parse refuses it).
///
/// httparse starts from the beginning each time, so parsing at every read would make a
/// head that trickles in a byte per read cost the square of its length (a 64 KiB head,
/// some two billion bytes read over). Parsing once per line ended bounds it by the
/// lines ([`RESPONSE_HEADERS_MAX`]) times the head's length. What httparse would refuse
/// before a line ends is refused when the line ends.
pub(crate) fn worth_parsing(buf: &[u8], parsed: usize) -> bool {
    // The first attempt needs no look: most answers arrive whole in one read.
    (parsed == 0 && !buf.is_empty())
        || buf.len() > RESPONSE_HEAD_BYTES_MAX
        || buf.get(parsed..).is_some_and(|new| new.contains(&b'\n'))
}

/// What an answer's hop-by-hop headers say, gathered while its headers are read.
#[derive(Default)]
struct Hop<'a> {
    /// The `Transfer-Encoding` lines.
    codings: Vec<&'a [u8]>,
    /// `Connection` lists `close`.
    close: bool,
    /// Other headers `Connection` names: hop-by-hop too, removed from the map.
    named: Vec<HeaderName>,
}

impl<'a> Hop<'a> {
    /// Takes in a hop-by-hop header (then it is not forwarded: `true`); `false` for any
    /// other.
    fn takes(&mut self, name: &HeaderName, value: &'a [u8]) -> bool {
        if *name == header::TRANSFER_ENCODING {
            self.codings.push(value);
        } else if *name == header::CONNECTION {
            for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    self.close = true;
                } else if !token.is_empty()
                    && !HOP_BY_HOP
                        .iter()
                        .any(|known| token.eq_ignore_ascii_case(known.as_str().as_bytes()))
                    && let Ok(named) = HeaderName::from_bytes(token)
                {
                    self.named.push(named);
                }
            }
        } else if !HOP_BY_HOP.contains(name) {
            return false;
        }
        true
    }
}

/// The answer's framing, refusing what could be read two ways. `codings` are its
/// `Transfer-Encoding` lines.
fn framing(
    status: StatusCode,
    method: &Method,
    headers: &HeaderMap,
    codings: &[&[u8]],
) -> Result<ResponseFraming, CodecError> {
    if *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(ResponseFraming::Empty);
    }
    if !codings.is_empty() {
        let named = codings
            .iter()
            .flat_map(|line| line.split(|&b| b == b','))
            .any(|coding| !coding.trim_ascii().is_empty());
        if !named {
            // Other readers take an answer whose Transfer-Encoding names nothing as
            // ending at the close; the proxy refuses to pick a reading.
            return Err(bad("the answer's Transfer-Encoding names no coding"));
        }
        if let Some(codings) = crate::framing::unsupported_codings_in(codings) {
            return Err(bad(format!(
                "the answer has Transfer-Encoding {codings:?}; the proxy forwards only \
                 chunked, and would have to drop the other codings"
            )));
        }
        if headers.contains_key(header::CONTENT_LENGTH) {
            return Err(bad(
                "the answer has both Transfer-Encoding and Content-Length: its body's \
                 length is ambiguous",
            ));
        }
        return Ok(ResponseFraming::Chunked);
    }
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for item in value.as_bytes().split(|&b| b == b',') {
            let len = parse_length(item.trim_ascii()).ok_or_else(|| {
                bad(format!(
                    "the answer's Content-Length {:?} is not a length",
                    String::from_utf8_lossy(value.as_bytes())
                ))
            })?;
            if length.is_some_and(|seen| seen != len) {
                return Err(bad("the answer has differing Content-Length values"));
            }
            length = Some(len);
        }
    }
    Ok(length.map_or(ResponseFraming::Close, ResponseFraming::Length))
}

/// Decimal digits only (no sign, no spaces), at most 19 of them: any such value fits in
/// 64 bits (20 digits could overflow, and no body is that long).
fn parse_length(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// What the chunked decoder found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// Some of a chunk's data.
    Data(Bytes),
    /// The trailers, after the last chunk; the body has ended.
    Trailers(HeaderMap),
    /// The body has ended (no trailers).
    End,
    /// More bytes are needed.
    More,
}

/// Where a chunked body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Expecting a size line.
    Size,
    /// Inside a chunk's data, this much left.
    Data(u64),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: expecting the trailer section.
    Trailers,
    /// Ended.
    Done,
}

/// Decodes a chunked body from the front of a buffer, taking what it decodes.
#[derive(Debug)]
pub(crate) struct ChunkedDecoder {
    state: Chunk,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self { state: Chunk::Size }
    }
}

impl ChunkedDecoder {
    /// Decodes from the front of `buf`; call again while it returns data.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, CodecError> {
        loop {
            match self.state {
                Chunk::Size => {
                    let Some(line) = take_line(buf, CHUNK_LINE_BYTES_MAX, "chunk size line")?
                    else {
                        return Ok(Decoded::More);
                    };
                    let size = chunk_size(&line)?;
                    self.state = if size == 0 {
                        Chunk::Trailers
                    } else {
                        Chunk::Data(size)
                    };
                }
                Chunk::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::More);
                    }
                    let take = usize::try_from(left).map_or(buf.len(), |l| l.min(buf.len()));
                    let data = buf.split_to(take).freeze();
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left)
                    };
                    return Ok(Decoded::Data(data));
                }
                Chunk::DataEnd => {
                    if buf.len() < 2 {
                        // A lone LF is refused as soon as it is seen.
                        if buf.first().is_some_and(|&b| b != b'\r') {
                            return Err(bad("a chunk's data is not followed by CRLF"));
                        }
                        return Ok(Decoded::More);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(bad("a chunk's data is not followed by CRLF"));
                    }
                    let _ = buf.split_to(2);
                    self.state = Chunk::Size;
                }
                Chunk::Trailers => return self.trailers(buf),
                Chunk::Done => return Ok(Decoded::End),
            }
        }
    }

    fn trailers(&mut self, buf: &mut BytesMut) -> Result<Decoded, CodecError> {
        let mut lines = [httparse::EMPTY_HEADER; RESPONSE_HEADERS_MAX];
        let (len, fields) = match httparse::parse_headers(buf, &mut lines) {
            Ok(httparse::Status::Complete((len, fields))) => (len, fields),
            Ok(httparse::Status::Partial) if buf.len() > TRAILER_BYTES_MAX => {
                return Err(bad(format!(
                    "the answer's trailers are over {TRAILER_BYTES_MAX} bytes"
                )));
            }
            Ok(httparse::Status::Partial) => return Ok(Decoded::More),
            Err(e) => return Err(bad(format!("the answer's trailers are malformed: {e}"))),
        };
        if len > TRAILER_BYTES_MAX {
            return Err(bad(format!(
                "the answer's trailers are over {TRAILER_BYTES_MAX} bytes"
            )));
        }
        let mut trailers = HeaderMap::with_capacity(fields.len());
        for field in fields {
            // A trailer the proxy cannot carry is dropped, not fatal: the body is whole.
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(field.name.as_bytes()),
                HeaderValue::from_bytes(field.value),
            ) {
                trailers.append(name, value);
            }
        }
        let _ = buf.split_to(len);
        self.state = Chunk::Done;
        Ok(if trailers.is_empty() {
            Decoded::End
        } else {
            Decoded::Trailers(trailers)
        })
    }
}

/// Takes one CRLF-terminated line off the front of `buf` (without its CRLF). A bare LF,
/// or a CR not followed by LF, is refused; so is a line over `max` bytes.
fn take_line(buf: &mut BytesMut, max: usize, what: &str) -> Result<Option<Bytes>, CodecError> {
    let window = &buf[..buf.len().min(max + 1)];
    let Some(at) = window.iter().position(|&b| b == b'\n' || b == b'\r') else {
        if buf.len() > max {
            return Err(bad(format!("a {what} is over {max} bytes")));
        }
        return Ok(None);
    };
    if window[at] == b'\n' {
        return Err(bad(format!("a {what} ends in a bare LF")));
    }
    match buf.get(at + 1) {
        None => Ok(None),
        Some(b'\n') => {
            let line = buf.split_to(at).freeze();
            let _ = buf.split_to(2);
            Ok(Some(line))
        }
        Some(_) => Err(bad(format!("a {what} has a CR not followed by LF"))),
    }
}

/// The size of a chunk from its size line: hex digits, then optionally extensions after
/// `;` (ignored), spaces or tabs allowed before the `;`.
fn chunk_size(line: &[u8]) -> Result<u64, CodecError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let rest = &line[digits..];
    if digits == 0 {
        return Err(bad("a chunk size line has no size"));
    }
    let rest = rest.trim_ascii_start();
    if !rest.is_empty() && rest[0] != b';' {
        return Err(bad("a chunk size line has bytes after its size"));
    }
    let hex = &line[..digits];
    let hex = &hex[hex.iter().take_while(|&&b| b == b'0').count()..];
    if hex.len() > 16 {
        return Err(bad("a chunk size does not fit in 64 bits"));
    }
    // ASCII hex digits, at most 16 of them: this parse cannot fail.
    Ok(u64::from_str_radix(std::str::from_utf8(hex).unwrap_or("0"), 16).unwrap_or(0))
}

#[cfg(test)]
mod tests;
