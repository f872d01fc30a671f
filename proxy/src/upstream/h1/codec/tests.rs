//! The codec's rules, one at a time: the request head written, the answer head parsed
//! and its framing decided, chunked bodies decoded whatever way their bytes arrive.

use super::*;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// The request head `encode_head` writes, as text.
fn encoded(method: &Method, target: &str, headers: &HeaderMap, framing: RequestFraming) -> String {
    let mut out = BytesMut::new();
    encode_head(&mut out, method, target, headers, framing);
    String::from_utf8(out.to_vec()).expect("the head is ASCII")
}

/// Headers from `(name, value)` pairs, repeated names appended.
fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).expect("a valid name"),
            HeaderValue::from_str(value).expect("a valid value"),
        );
    }
    map
}

/// The head of `text` answering a GET, which must be complete and valid.
fn head(text: &str) -> (ResponseHead, usize) {
    head_for(text, &Method::GET)
}

/// The head of `text` answering a `method`, which must be complete and valid.
fn head_for(text: &str, method: &Method) -> (ResponseHead, usize) {
    match parse_head(text.as_bytes(), method) {
        Ok(Some(parsed)) => parsed,
        other => panic!("{text:?} did not parse as a whole head: {other:?}"),
    }
}

/// The framing decided for `text` answering a GET, or the refusal.
fn framing_of(text: &str) -> Result<ResponseFraming, CodecError> {
    match parse_head(text.as_bytes(), &Method::GET) {
        Ok(Some((head, _))) => Ok(head.framing),
        Ok(None) => panic!("{text:?} is not a whole head"),
        Err(e) => Err(e),
    }
}

/// An answer head with `lines` (each without its CRLF) after `HTTP/1.1 200 OK`.
fn ok_with(lines: &[&str]) -> String {
    let mut text = String::from("HTTP/1.1 200 OK\r\n");
    for line in lines {
        text.push_str(line);
        text.push_str("\r\n");
    }
    text.push_str("\r\n");
    text
}

/// What a chunked body decoded to.
#[derive(Debug, Default, PartialEq)]
struct Decoding {
    data: Vec<u8>,
    trailers: Option<HeaderMap>,
    /// The decoder said the body ended (`End`, or `Trailers`).
    ended: bool,
    /// The bytes left in the buffer after the last piece.
    left: Vec<u8>,
}

/// Decodes from `buf` until the decoder needs more bytes or the body has ended.
fn drain(
    decoder: &mut ChunkedDecoder,
    buf: &mut BytesMut,
    into: &mut Decoding,
) -> Result<(), CodecError> {
    loop {
        match decoder.decode(buf)? {
            Decoded::Data(data) => {
                assert!(!data.is_empty(), "the decoder returned an empty data piece");
                assert!(
                    !into.ended,
                    "the decoder returned data after the body's end"
                );
                into.data.extend_from_slice(&data);
            }
            Decoded::Trailers(trailers) => {
                assert!(
                    !into.ended,
                    "the decoder returned trailers after the body's end"
                );
                into.trailers = Some(trailers);
                into.ended = true;
            }
            Decoded::End => {
                into.ended = true;
                return Ok(());
            }
            Decoded::More => return Ok(()),
        }
    }
}

/// Feeds `pieces` to one decoder, one after the other, decoding after each.
fn feed(pieces: &[&[u8]]) -> Result<Decoding, CodecError> {
    let mut decoder = ChunkedDecoder::default();
    let mut buf = BytesMut::new();
    let mut decoding = Decoding::default();
    for piece in pieces {
        buf.extend_from_slice(piece);
        drain(&mut decoder, &mut buf, &mut decoding)?;
    }
    decoding.left = buf.to_vec();
    Ok(decoding)
}

/// Feeds `body` one byte at a time.
fn feed_bytewise(body: &[u8]) -> Result<Decoding, CodecError> {
    let pieces: Vec<&[u8]> = body.chunks(1).collect();
    feed(&pieces)
}

/// `body` is refused when it arrives whole, byte by byte, and split in two anywhere.
fn assert_refused(body: &[u8]) {
    assert!(feed(&[body]).is_err(), "{body:?} was accepted whole");
    assert!(
        feed_bytewise(body).is_err(),
        "{body:?} was accepted byte by byte"
    );
    for at in 0..=body.len() {
        assert!(
            feed(&[&body[..at], &body[at..]]).is_err(),
            "{body:?} was accepted split at {at}"
        );
    }
}

/// A body of several chunks, with extensions in both forms, upper- and lower-case hex,
/// a size with leading zeros, and two trailers.
const BODY: &[u8] = b"5;name=value\r\nhello\r\n\
    6 ;x\r\n world\r\n\
    000A\r\n0123456789\r\n\
    b\r\n, and more!\r\n\
    0\r\nExpires: never\r\nX-Sum: abc\r\n\r\n";

/// What [`BODY`] decodes to.
fn body_decoding() -> Decoding {
    Decoding {
        data: b"hello world0123456789, and more!".to_vec(),
        trailers: Some(headers(&[("expires", "never"), ("x-sum", "abc")])),
        ended: true,
        left: Vec::new(),
    }
}

// ---------------------------------------------------------------------------------------
// encode_head
// ---------------------------------------------------------------------------------------

/// Goal: the request line and every header value are written, and the head ends in a
/// blank line. Method: encode a GET with a repeated header and no body framing, and
/// compare the whole text.
#[test]
fn a_request_head_has_its_request_line_every_header_value_and_a_blank_line() {
    let map = headers(&[("host", "up.example"), ("accept", "a/b"), ("accept", "c/d")]);
    let text = encoded(&Method::GET, "/x/y?z=1", &map, RequestFraming::None);
    assert_eq!(
        text,
        "GET /x/y?z=1 HTTP/1.1\r\nhost: up.example\r\naccept: a/b\r\naccept: c/d\r\n\r\n"
    );
}

/// Goal: a length the proxy adds is written as `content-length`, just before the blank
/// line. Method: encode with `Length { add: true }` and compare the whole text.
#[test]
fn an_added_length_is_written_as_content_length() {
    let map = headers(&[("host", "h")]);
    let text = encoded(
        &Method::PUT,
        "/o",
        &map,
        RequestFraming::Length {
            len: 12345,
            add: true,
        },
    );
    assert_eq!(
        text,
        "PUT /o HTTP/1.1\r\nhost: h\r\ncontent-length: 12345\r\n\r\n"
    );
}

/// Goal: a length the client's headers already carry is not written a second time.
/// Method: encode with `Length { add: false }` and headers holding `content-length`,
/// and count its lines.
#[test]
fn a_length_not_added_is_not_written_again() {
    let map = headers(&[("host", "h"), ("content-length", "7")]);
    let text = encoded(
        &Method::PUT,
        "/o",
        &map,
        RequestFraming::Length { len: 7, add: false },
    );
    assert_eq!(
        text,
        "PUT /o HTTP/1.1\r\nhost: h\r\ncontent-length: 7\r\n\r\n"
    );
    assert_eq!(text.matches("content-length").count(), 1);
}

/// Goal: a chunked request says so, and a request without a body has no framing header.
/// Method: encode the same head with `Chunked` and with `None`, and compare the texts.
#[test]
fn a_chunked_request_says_so_and_one_without_a_body_has_no_framing_header() {
    let map = headers(&[("host", "h")]);
    let chunked = encoded(&Method::POST, "/", &map, RequestFraming::Chunked);
    assert_eq!(
        chunked,
        "POST / HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    let none = encoded(&Method::DELETE, "/", &map, RequestFraming::None);
    assert_eq!(none, "DELETE / HTTP/1.1\r\nhost: h\r\n\r\n");
}

/// Goal: the head is appended after what the buffer already holds (a pipelined request
/// is not overwritten). Method: encode into a buffer that has bytes, and check both.
#[test]
fn a_request_head_is_appended_to_the_buffer() {
    let mut out = BytesMut::from(&b"before"[..]);
    encode_head(
        &mut out,
        &Method::GET,
        "/",
        &HeaderMap::new(),
        RequestFraming::None,
    );
    assert_eq!(&out[..], b"beforeGET / HTTP/1.1\r\n\r\n");
}

/// Goal: what `encode_head` writes is a well-formed request to an HTTP/1.1 parser, with
/// the same method, target and headers. Method: parse it back with httparse.
#[test]
fn an_encoded_request_head_parses_back_to_the_same_request() {
    let map = headers(&[("host", "h"), ("x-a", "1"), ("x-a", "2"), ("x-b", "three")]);
    let mut out = BytesMut::new();
    encode_head(
        &mut out,
        &Method::PATCH,
        "/p?q",
        &map,
        RequestFraming::Length { len: 3, add: true },
    );
    let mut lines = [httparse::EMPTY_HEADER; 16];
    let mut request = httparse::Request::new(&mut lines);
    assert_eq!(
        request.parse(&out).expect("a well-formed head"),
        httparse::Status::Complete(out.len())
    );
    assert_eq!(request.method, Some("PATCH"));
    assert_eq!(request.path, Some("/p?q"));
    assert_eq!(request.version, Some(1));
    let parsed: Vec<(&str, &[u8])> = request.headers.iter().map(|h| (h.name, h.value)).collect();
    assert_eq!(
        parsed,
        [
            ("host", &b"h"[..]),
            ("x-a", b"1"),
            ("x-a", b"2"),
            ("x-b", b"three"),
            ("content-length", b"3"),
        ]
    );
}

// ---------------------------------------------------------------------------------------
// chunk_size_line and last_chunk
// ---------------------------------------------------------------------------------------

/// Goal: a chunk's size line is its length in hex, then CRLF. Method: compare the lines
/// of a few lengths.
#[test]
fn a_chunk_size_line_is_the_length_in_hex() {
    assert_eq!(&chunk_size_line(1)[..], b"1\r\n");
    assert_eq!(&chunk_size_line(26)[..], b"1a\r\n");
    assert_eq!(&chunk_size_line(4096)[..], b"1000\r\n");
    assert_eq!(CHUNK_END, b"\r\n");
}

/// Goal: the last chunk carries only the trailers that `Trailer` declared; without any,
/// it is `0` and a blank line. Method: write trailers with one name declared and one
/// not, and with none.
#[test]
fn only_declared_trailers_are_written_in_the_last_chunk() {
    let trailers = headers(&[("x-sum", "abc"), ("x-other", "no"), ("x-sum", "def")]);
    let declared = [HeaderName::from_static("x-sum")];
    assert_eq!(
        &last_chunk(Some(&trailers), &declared)[..],
        b"0\r\nx-sum: abc\r\nx-sum: def\r\n\r\n"
    );
    assert_eq!(&last_chunk(Some(&trailers), &[])[..], b"0\r\n\r\n");
    assert_eq!(&last_chunk(None, &declared)[..], b"0\r\n\r\n");
}

/// Goal: what the encoding side writes, the decoder reads back: the same data, and the
/// declared trailers. Method: frame three chunks with `chunk_size_line`, `CHUNK_END` and
/// `last_chunk`, then decode them.
#[test]
fn an_encoded_chunked_body_decodes_to_its_data_and_declared_trailers() {
    let chunks: [&[u8]; 3] = [b"first", &[b'x'; 300], b"!"];
    let mut body = BytesMut::new();
    for chunk in chunks {
        body.extend_from_slice(&chunk_size_line(chunk.len()));
        body.extend_from_slice(chunk);
        body.extend_from_slice(CHUNK_END);
    }
    let trailers = headers(&[("x-sum", "1"), ("x-hidden", "2")]);
    body.extend_from_slice(&last_chunk(
        Some(&trailers),
        &[HeaderName::from_static("x-sum")],
    ));
    let decoded = feed(&[&body]).expect("a valid body");
    assert_eq!(decoded.data, chunks.concat());
    assert_eq!(decoded.trailers, Some(headers(&[("x-sum", "1")])));
    assert!(decoded.ended);
    assert!(decoded.left.is_empty());
}

// ---------------------------------------------------------------------------------------
// parse_head: the head itself
// ---------------------------------------------------------------------------------------

/// Goal: the names matched as they are read exactly as `HeaderName::from_bytes` reads
/// them, and every other spelling (other cases, near misses, invalid names) is left to
/// it, with its answer.
/// Method: each matched spelling, its other cases, each with a byte more or less, and
/// strings that are not names; compare with `from_bytes`.
#[test]
fn header_names_matched_as_sent_read_as_from_bytes_reads_them() {
    let spellings = [
        "Date",
        "Server",
        "Content-Type",
        "Content-Length",
        "Connection",
        "Transfer-Encoding",
        "ETag",
        "Etag",
        "Last-Modified",
        "Accept-Ranges",
        "Cache-Control",
        "Location",
        "Vary",
        "X-Amz-Request-Id",
    ];
    let mut checked = 0;
    for spelling in spellings {
        let variants = [
            spelling.to_owned(),
            spelling.to_ascii_lowercase(),
            spelling.to_ascii_uppercase(),
            format!("{spelling}s"),
            spelling[1..].to_owned(),
            format!("{spelling}:"),
            format!(" {spelling}"),
        ];
        for variant in &variants {
            let ours = header_name(variant.as_bytes()).ok();
            let theirs = HeaderName::from_bytes(variant.as_bytes()).ok();
            assert_eq!(ours, theirs, "{variant:?}");
            checked += 1;
        }
    }
    for raw in [&b""[..], b"\xff", b"Date\0", b"Content Length"] {
        assert_eq!(
            header_name(raw).ok(),
            HeaderName::from_bytes(raw).ok(),
            "{raw:?}"
        );
    }
    assert!(checked >= 90, "{checked}");
}

/// Goal: a whole head gives its status, version and every header value, and its length
/// is that of the head alone: the body's bytes after it are left for the body. Method:
/// parse a head followed by body bytes.
#[test]
fn a_whole_head_gives_its_status_headers_and_length_and_leaves_the_body() {
    let head_text = "HTTP/1.1 201 Created\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\n";
    let buf = format!("{head_text}hello");
    let (head, len) = head(&buf);
    assert_eq!(head.status, StatusCode::CREATED);
    assert_eq!(head.version, Version::HTTP_11);
    assert_eq!(len, head_text.len());
    assert_eq!(&buf.as_bytes()[len..], b"hello");
    assert_eq!(head.headers["content-length"], "5");
    let values: Vec<_> = head.headers.get_all("x-a").iter().collect();
    assert_eq!(values, ["1", "2"]);
    assert_eq!(head.headers.len(), 3);
    assert_eq!(head.framing, ResponseFraming::Length(5));
    assert!(head.keep_alive);
}

/// Goal: `take_head` splits the head off the connection's buffer and shares its bytes:
/// every header value lies in the buffer's own memory (no copy per line), the body's
/// bytes stay in the buffer, and a head not all arrived leaves the buffer as it was.
/// Method: take a head followed by body bytes from a `BytesMut`, and compare where the
/// values lie; then take from a buffer holding only part of a head.
#[test]
fn take_head_shares_the_buffer_and_leaves_the_body() {
    let text = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: one\r\nDate: now\r\n\r\nhello";
    let mut buf = BytesMut::from(&text[..]);
    let memory = buf.as_ptr() as usize..buf.as_ptr() as usize + text.len();
    let head = take_head(&mut buf, &Method::GET)
        .expect("a valid head")
        .expect("a whole head");
    assert_eq!(&buf[..], b"hello");
    assert_eq!(head.headers.len(), 3);
    for value in head.headers.values() {
        let at = value.as_bytes().as_ptr() as usize;
        assert!(
            memory.contains(&at),
            "{value:?} was copied out of the buffer"
        );
    }
    assert_eq!(head.headers["x-a"], "one");
    assert_eq!(head.headers["date"], "now");

    let mut partial = BytesMut::from(&text[..30]);
    assert!(matches!(take_head(&mut partial, &Method::GET), Ok(None)));
    assert_eq!(&partial[..], &text[..30]);
}

/// Goal: a value is located in the head only when it lies within it; empty values of
/// any spelling are taken as empty, and anything else is refused, never sliced. Method:
/// locate slices inside, at the edges of and outside a buffer; then take heads whose
/// empty values are written in several ways.
#[test]
fn values_are_located_only_within_the_head() {
    let buf = b"0123456789";
    let start = buf.as_ptr() as usize;
    assert_eq!(within(start, 10, &buf[2..5]), Ok(2..5));
    assert_eq!(within(start, 10, &buf[7..]), Ok(7..10));
    assert_eq!(within(start, 10, &buf[3..3]), Ok(0..0));
    assert!(within(start, 6, &buf[4..8]).is_err(), "past the head's end");
    assert!(
        within(start + 1, 10, &buf[0..2]).is_err(),
        "before the head"
    );
    assert!(within(start, 10, b"elsewhere").is_err());
    for empty in ["X-E:", "X-E: ", "X-E:\t", "X-E: \t "] {
        let text = format!("HTTP/1.1 204 No Content\r\n{empty}\r\n\r\n");
        let (head, len) = head(&text);
        assert_eq!(len, text.len());
        assert_eq!(head.headers["x-e"], "", "{empty:?}");
    }
}

/// Goal: a head that has not all arrived is waited for, never refused nor taken as
/// whole, wherever it was cut. Method: parse every proper prefix of a valid head.
#[test]
fn every_proper_prefix_of_a_head_is_not_yet_a_head() {
    let text = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding-Not: x\r\n\
        X-Empty:\r\nConnection: keep-alive\r\n\r\n";
    assert!(matches!(parse_head(text, &Method::GET), Ok(Some((_, len))) if len == text.len()));
    for at in 0..text.len() {
        match parse_head(&text[..at], &Method::GET) {
            Ok(None) => {}
            other => panic!("the prefix of {at} bytes gave {other:?}"),
        }
    }
}

/// How a trickled head ended: the parse that was not partial (the head's length, or
/// the refusal), and the bytes fed by then.
type Ended = (Result<usize, CodecError>, usize);

/// Feeds `text` one byte at a time as the exchange reads it, parsing only when
/// `worth_parsing` says so: the parses made, and how the head ended, if it did.
fn trickle(text: &[u8]) -> (usize, Option<Ended>) {
    let (mut parses, mut parsed) = (0, 0);
    for fed in 1..=text.len() {
        let buf = &text[..fed];
        if !worth_parsing(buf, parsed) {
            continue;
        }
        parses += 1;
        match parse_head(buf, &Method::GET) {
            Ok(None) => parsed = fed,
            Ok(Some((_, len))) => return (parses, Some((Ok(len), fed))),
            Err(e) => return (parses, Some((Err(e), fed))),
        }
    }
    (parses, None)
}

/// Goal: a head that trickles in a byte per read is parsed about once per line, not
/// once per byte (whose cost would grow with the square of its length), and is still
/// found whole at its last byte; a head that never ends a line is still refused at
/// `RESPONSE_HEAD_BYTES_MAX`, and a malformed one by the end of its line. Method: feed
/// heads a byte at a time and count the parses.
#[test]
fn a_head_trickled_a_byte_at_a_time_is_parsed_once_per_line() {
    let value = "v".repeat(500);
    let lines: Vec<String> = (0..100).map(|i| format!("X-H{i}: {value}")).collect();
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let text = ok_with(&refs);
    let (parses, outcome) = trickle(text.as_bytes());
    assert!(matches!(outcome, Some((Ok(len), fed)) if len == text.len() && fed == text.len()));
    // The first byte, then the status line, each header line and the empty line: one
    // parse each.
    assert!(
        parses <= lines.len() + 3,
        "{parses} parses for {} lines",
        lines.len()
    );

    let mut endless = b"HTTP/1.1 200 OK\r\nX-Long: ".to_vec();
    endless.resize(RESPONSE_HEAD_BYTES_MAX + 10, b'a');
    let (parses, outcome) = trickle(&endless);
    assert!(matches!(outcome, Some((Err(_), fed)) if fed == RESPONSE_HEAD_BYTES_MAX + 1));
    assert_eq!(
        parses, 3,
        "the first byte, the status line, the head over its limit"
    );

    let malformed = b"HTTP/1.1 2x0 OK\r\n\r\n";
    let (_, outcome) = trickle(malformed);
    assert!(
        matches!(outcome, Some((Err(_), fed)) if fed <= 17),
        "not refused by the end of its first line: {outcome:?}"
    );
}

/// Goal: a head that has not ended within `RESPONSE_HEAD_BYTES_MAX` bytes is refused,
/// not waited for; up to the limit it is waited for. Method: parse a head cut short at
/// the limit and one byte beyond it.
#[test]
fn a_partial_head_longer_than_the_limit_is_refused() {
    let mut text = b"HTTP/1.1 200 OK\r\nX-Long: ".to_vec();
    text.resize(RESPONSE_HEAD_BYTES_MAX, b'a');
    assert!(matches!(parse_head(&text, &Method::GET), Ok(None)));
    text.push(b'a');
    assert!(parse_head(&text, &Method::GET).is_err());
}

/// Goal: a whole head longer than `RESPONSE_HEAD_BYTES_MAX` is refused too, though it
/// arrived at once. Method: parse a complete head of two long header lines.
#[test]
fn a_whole_head_longer_than_the_limit_is_refused() {
    let long = "a".repeat(RESPONSE_HEAD_BYTES_MAX / 2);
    let text = ok_with(&[&format!("X-A: {long}"), &format!("X-B: {long}")]);
    assert!(text.len() > RESPONSE_HEAD_BYTES_MAX);
    assert!(parse_head(text.as_bytes(), &Method::GET).is_err());
}

/// Goal: at most `RESPONSE_HEADERS_MAX` header lines are taken. Method: parse a head
/// with exactly that many lines, then one with one more.
#[test]
fn more_header_lines_than_the_limit_are_refused() {
    let lines: Vec<String> = (0..=RESPONSE_HEADERS_MAX)
        .map(|i| format!("X-H{i}: {i}"))
        .collect();
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let (head, _) = head(&ok_with(&refs[..RESPONSE_HEADERS_MAX]));
    assert_eq!(head.headers.len(), RESPONSE_HEADERS_MAX);
    assert!(parse_head(ok_with(&refs).as_bytes(), &Method::GET).is_err());
}

/// Goal: a status line that is not one is refused, not waited on. Method: parse heads
/// whose status line has a bad code, version or protocol name.
#[test]
fn a_malformed_status_line_is_refused() {
    for text in [
        "HTTP/1.1 2x0 OK\r\n\r\n",
        "HTTP/1.1 20 OK\r\n\r\n",
        "HTTP/1.1 000 OK\r\n\r\n",
        "HTTP/1.1 099 Low\r\n\r\n",
        "HTTP/2.0 200 OK\r\n\r\n",
        "HTTP/1.1200 OK\r\n\r\n",
        "ICY 200 OK\r\n\r\n",
        "<html>\r\n\r\n",
    ] {
        assert!(
            parse_head(text.as_bytes(), &Method::GET).is_err(),
            "{text:?} was not refused"
        );
    }
}

/// Goal: an HTTP/1.0 answer is read as one, and its connection is not kept. Method:
/// parse an HTTP/1.0 answer with a `Content-Length`.
#[test]
fn an_http_1_0_answer_does_not_keep_its_connection() {
    let (head, _) = head("HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\n");
    assert_eq!(head.version, Version::HTTP_10);
    assert_eq!(head.framing, ResponseFraming::Length(5));
    assert!(!head.keep_alive);
}

// ---------------------------------------------------------------------------------------
// parse_head: framing
// ---------------------------------------------------------------------------------------

/// Goal: an answer to HEAD has no body, whatever its `Content-Length` or
/// `Transfer-Encoding` say. Method: parse such answers for a HEAD request, and the same
/// one for a GET.
#[test]
fn an_answer_to_head_has_no_body_whatever_its_framing_headers_say() {
    for lines in [
        &["Content-Length: 5"][..],
        &["Transfer-Encoding: chunked"],
        &[],
    ] {
        let (head, _) = head_for(&ok_with(lines), &Method::HEAD);
        assert_eq!(head.framing, ResponseFraming::Empty, "{lines:?}");
    }
    let (head, _) = head_for(&ok_with(&["Content-Length: 5"]), &Method::HEAD);
    assert!(head.keep_alive);
    assert_eq!(
        framing_of(&ok_with(&["Content-Length: 5"])),
        Ok(ResponseFraming::Length(5))
    );
}

/// Goal: 1xx, 204 and 304 answers have no body, even with a `Content-Length`. Method:
/// parse each with one.
#[test]
fn informational_no_content_and_not_modified_answers_have_no_body() {
    for status in ["100 Continue", "101 Switching Protocols", "103 Early Hints"] {
        let text = format!("HTTP/1.1 {status}\r\n\r\n");
        assert_eq!(framing_of(&text), Ok(ResponseFraming::Empty), "{status}");
    }
    for status in ["204 No Content", "304 Not Modified"] {
        let text = format!("HTTP/1.1 {status}\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(framing_of(&text), Ok(ResponseFraming::Empty), "{status}");
        assert!(head(&text).0.keep_alive, "{status}");
    }
}

/// Goal: a connection whose upstream answered 101 is never taken for another request:
/// it speaks another protocol from then on. Method: parse a 101 with and without
/// `Connection: upgrade`, and a 100 for comparison.
#[test]
fn a_connection_that_switched_protocols_is_not_kept_alive() {
    assert!(
        !head("HTTP/1.1 101 Switching Protocols\r\n\r\n")
            .0
            .keep_alive
    );
    assert!(
        !head("HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: x\r\n\r\n")
            .0
            .keep_alive
    );
    assert!(head("HTTP/1.1 100 Continue\r\n\r\n").0.keep_alive);
}

/// Goal: a `Content-Length` frames the body by that many bytes. Method: parse answers
/// with lengths 0, 5, a long one and one with leading zeros.
#[test]
fn a_content_length_frames_the_body_by_its_length() {
    assert_eq!(
        framing_of(&ok_with(&["Content-Length: 5"])),
        Ok(ResponseFraming::Length(5))
    );
    assert_eq!(
        framing_of(&ok_with(&["Content-Length: 0"])),
        Ok(ResponseFraming::Length(0))
    );
    assert_eq!(
        framing_of(&ok_with(&["Content-Length: 0007"])),
        Ok(ResponseFraming::Length(7))
    );
    assert_eq!(
        framing_of(&ok_with(&["Content-Length: 9999999999999999999"])),
        Ok(ResponseFraming::Length(9_999_999_999_999_999_999))
    );
}

/// Goal: the same length repeated, in a list or on several lines, is one length.
/// Method: parse `5, 5`, two lines of `5`, and both at once.
#[test]
fn a_content_length_repeated_with_the_same_value_is_that_length() {
    for lines in [
        &["Content-Length: 5, 5"][..],
        &["Content-Length: 5", "Content-Length: 5"],
        &["Content-Length: 5,5", "Content-Length: 5"],
    ] {
        assert_eq!(
            framing_of(&ok_with(lines)),
            Ok(ResponseFraming::Length(5)),
            "{lines:?}"
        );
    }
}

/// Goal: a `Content-Length` that is not one decimal length, the same everywhere, is
/// refused. Method: parse differing values (in a list and on two lines), a sign, a
/// space inside, an empty value, an empty list element, a non-digit and 20 digits.
#[test]
fn a_content_length_that_is_not_one_plain_length_is_refused() {
    for lines in [
        &["Content-Length: 5, 6"][..],
        &["Content-Length: 5", "Content-Length: 6"],
        &["Content-Length: +5"],
        &["Content-Length: -1"],
        &["Content-Length: 5 5"],
        &["Content-Length:"],
        &["Content-Length: 5,"],
        &["Content-Length: 0x5"],
        &["Content-Length: 12345678901234567890"],
        &["Content-Length: 99999999999999999999"],
    ] {
        assert!(framing_of(&ok_with(lines)).is_err(), "{lines:?}");
    }
}

/// Goal: `Transfer-Encoding: chunked` frames the body in chunks, in any case, and the
/// connection is kept. Method: parse answers with `chunked` and `Chunked`.
#[test]
fn transfer_encoding_chunked_frames_the_body_in_chunks() {
    for value in ["chunked", "Chunked", "CHUNKED"] {
        let (head, _) = head(&ok_with(&[&format!("Transfer-Encoding: {value}")]));
        assert_eq!(head.framing, ResponseFraming::Chunked, "{value}");
        assert!(head.keep_alive, "{value}");
    }
}

/// Goal: an answer framed both ways is refused, whichever header comes first. Method:
/// parse `Transfer-Encoding: chunked` with a `Content-Length` before and after it.
#[test]
fn chunked_with_a_content_length_is_refused() {
    assert!(
        framing_of(&ok_with(&[
            "Transfer-Encoding: chunked",
            "Content-Length: 5"
        ]))
        .is_err()
    );
    assert!(
        framing_of(&ok_with(&[
            "Content-Length: 5",
            "Transfer-Encoding: chunked"
        ]))
        .is_err()
    );
}

/// Goal: a transfer coding other than one `chunked` is refused: the proxy would have
/// to drop the others. Method: parse `gzip, chunked`, `chunked` twice (in a list and on
/// two lines), and `gzip` alone.
#[test]
fn transfer_codings_besides_one_chunked_are_refused() {
    for lines in [
        &["Transfer-Encoding: gzip, chunked"][..],
        &["Transfer-Encoding: chunked, chunked"],
        &["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"],
        &["Transfer-Encoding: gzip"],
        &["Transfer-Encoding: chunked, gzip"],
    ] {
        assert!(framing_of(&ok_with(lines)).is_err(), "{lines:?}");
    }
}

/// Goal: a `Transfer-Encoding` that names no coding at all is refused: it does not say
/// `chunked`, and RFC 9112 §6.3 would read such an answer until the close, so taking it
/// as chunked reads a body other than the one another reader would. Method: parse
/// answers whose `Transfer-Encoding` is empty or an empty list.
#[test]
fn a_transfer_encoding_naming_no_coding_is_refused() {
    for lines in [&["Transfer-Encoding:"][..], &["Transfer-Encoding: ,"]] {
        assert!(framing_of(&ok_with(lines)).is_err(), "{lines:?}");
    }
}

/// Goal: an answer with neither framing header runs until the close, so its connection
/// is not kept. Method: parse an HTTP/1.1 200 without either.
#[test]
fn an_answer_without_framing_headers_runs_until_the_close() {
    let (head, _) = head(&ok_with(&["Server: x"]));
    assert_eq!(head.framing, ResponseFraming::Close);
    assert!(!head.keep_alive);
}

// ---------------------------------------------------------------------------------------
// parse_head: keep_alive
// ---------------------------------------------------------------------------------------

/// Goal: an HTTP/1.1 answer with a framed body keeps its connection. Method: parse
/// answers framed by length and chunks, and one with `Connection: keep-alive`.
#[test]
fn an_http_1_1_answer_with_a_framed_body_keeps_its_connection() {
    for lines in [
        &["Content-Length: 5"][..],
        &["Transfer-Encoding: chunked"],
        &["Content-Length: 0", "Connection: keep-alive"],
    ] {
        assert!(head(&ok_with(lines)).0.keep_alive, "{lines:?}");
    }
}

/// Goal: `Connection: close` ends the connection after the answer, in any case, alone,
/// in a list or on a second line. Method: parse answers framed by length that say so.
#[test]
fn connection_close_in_any_case_or_list_ends_the_connection() {
    for lines in [
        &["Content-Length: 5", "Connection: close"][..],
        &["Content-Length: 5", "Connection: CLOSE"],
        &["Content-Length: 5", "Connection: foo, Close"],
        &["Content-Length: 5", "Connection: close ,foo"],
        &["Content-Length: 5", "Connection: foo", "Connection: close"],
        &["Transfer-Encoding: chunked", "Connection: Close"],
    ] {
        let (head, _) = head(&ok_with(lines));
        assert!(head.framing != ResponseFraming::Close, "{lines:?}");
        assert!(!head.keep_alive, "{lines:?}");
    }
    // A token that only contains the word is not it.
    assert!(
        head(&ok_with(&[
            "Content-Length: 5",
            "Connection: closed, enclose"
        ]))
        .0
        .keep_alive
    );
}

// ---------------------------------------------------------------------------------------
// parse_head: hop-by-hop headers
// ---------------------------------------------------------------------------------------

/// Goal: the answer's hop-by-hop headers are read, not passed on: none of them is in the
/// head's headers, the others all are. Method: parse an answer with every hop-by-hop
/// header and two end-to-end ones.
#[test]
fn hop_by_hop_headers_are_left_out_of_the_head() {
    let (head, _) = head(&ok_with(&[
        "Connection: keep-alive",
        "Keep-Alive: timeout=5",
        "Proxy-Connection: keep-alive",
        "Proxy-Authenticate: Basic",
        "Proxy-Authorization: Basic x",
        "TE: trailers",
        "Transfer-Encoding: chunked",
        "Upgrade: h2c",
        "Expect: 100-continue",
        "Trailer: X-Sum",
        "X-End: 1",
    ]));
    assert_eq!(head.framing, ResponseFraming::Chunked);
    assert!(head.keep_alive);
    let names: Vec<&str> = head.headers.keys().map(HeaderName::as_str).collect();
    assert_eq!(names, ["trailer", "x-end"]);
}

/// Goal: the headers `Connection` names are hop-by-hop too, whichever comes first and
/// in any case, with every value; the ones it does not name stay. Method: parse answers
/// naming `X-A` before and after its lines.
#[test]
fn headers_named_by_connection_are_left_out_of_the_head() {
    for lines in [
        &[
            "Connection: x-a, close",
            "X-A: 1",
            "X-A: 2",
            "X-B: 3",
            "Content-Length: 0",
        ][..],
        &[
            "X-A: 1",
            "X-B: 3",
            "Content-Length: 0",
            "x-a: 2",
            "Connection: X-A",
        ],
        &[
            "X-A: 1",
            "Connection: ,,X-a ,",
            "X-B: 3",
            "X-A: 2",
            "Content-Length: 0",
        ],
    ] {
        let (head, _) = head(&ok_with(lines));
        assert!(!head.headers.contains_key("x-a"), "{lines:?}");
        assert!(!head.headers.contains_key("connection"), "{lines:?}");
        assert_eq!(head.headers["x-b"], "3", "{lines:?}");
        assert_eq!(head.framing, ResponseFraming::Length(0), "{lines:?}");
    }
}

/// Goal: `Connection` cannot take away the length an answer is framed by: an answer
/// whose `Connection` names `Content-Length` is refused (as a request doing so is, with
/// `bad-connection`), or read by its length; never read until the close, nor let through
/// as chunked with a length beside it. Method: parse such answers, with a length alone
/// and with `Transfer-Encoding: chunked` too.
#[test]
fn a_connection_naming_content_length_cannot_change_the_framing() {
    let framing = framing_of(&ok_with(&[
        "Content-Length: 5",
        "Connection: content-length",
    ]));
    assert!(
        matches!(framing, Err(_) | Ok(ResponseFraming::Length(5))),
        "{framing:?}"
    );
    let framing = framing_of(&ok_with(&[
        "Transfer-Encoding: chunked",
        "Content-Length: 5",
        "Connection: Content-Length",
    ]));
    assert!(framing.is_err(), "{framing:?}");
}

// ---------------------------------------------------------------------------------------
// ChunkedDecoder: whole bodies, however they arrive
// ---------------------------------------------------------------------------------------

/// Goal: a body of several chunks, with extensions and trailers, decodes to its data
/// and trailers. Method: feed it whole.
#[test]
fn a_chunked_body_with_extensions_and_trailers_decodes_whole() {
    assert_eq!(feed(&[BODY]), Ok(body_decoding()));
}

/// Goal: the same body decodes the same when its bytes arrive one at a time. Method:
/// append one byte to the buffer, decode until the decoder asks for more, repeat.
#[test]
fn a_chunked_body_decodes_the_same_one_byte_at_a_time() {
    assert_eq!(feed_bytewise(BODY), Ok(body_decoding()));
}

/// Goal: the same body decodes the same wherever it is split. Method: feed it in two
/// pieces, at every split point.
#[test]
fn a_chunked_body_decodes_the_same_split_anywhere() {
    for at in 0..=BODY.len() {
        assert_eq!(
            feed(&[&BODY[..at], &BODY[at..]]),
            Ok(body_decoding()),
            "split at {at}"
        );
    }
}

/// Goal: a body whose trailer section is empty ends with `End`, not with trailers.
/// Method: decode `3\r\nabc\r\n0\r\n\r\n` step by step.
#[test]
fn an_empty_trailer_section_ends_the_body() {
    let mut decoder = ChunkedDecoder::default();
    let mut buf = BytesMut::from(&b"3\r\nabc\r\n0\r\n\r\n"[..]);
    assert_eq!(
        decoder.decode(&mut buf),
        Ok(Decoded::Data(Bytes::from_static(b"abc")))
    );
    assert_eq!(decoder.decode(&mut buf), Ok(Decoded::End));
    assert!(buf.is_empty());
    // Ended stays ended.
    assert_eq!(decoder.decode(&mut buf), Ok(Decoded::End));
}

/// Goal: a body of no chunks at all (the last chunk only) ends at once. Method: decode
/// `0\r\n\r\n` whole and byte by byte.
#[test]
fn a_body_of_only_the_last_chunk_ends_at_once() {
    let expected = Decoding {
        ended: true,
        ..Decoding::default()
    };
    assert_eq!(feed(&[b"0\r\n\r\n"]), Ok(expected));
    let expected = Decoding {
        ended: true,
        ..Decoding::default()
    };
    assert_eq!(feed_bytewise(b"0\r\n\r\n"), Ok(expected));
}

/// Goal: a body that has not ended is never reported ended, nor refused. Method: feed
/// every proper prefix of a valid body and check the decoder waits.
#[test]
fn every_proper_prefix_of_a_body_waits_for_more() {
    for at in 0..BODY.len() {
        let decoded = feed(&[&BODY[..at]]).unwrap_or_else(|e| panic!("prefix {at}: {e}"));
        assert!(!decoded.ended, "the prefix of {at} bytes ended the body");
        assert!(
            body_decoding().data.starts_with(&decoded.data),
            "prefix {at}"
        );
    }
}

/// Goal: the bytes after a body's end are not taken: they stay in the buffer, so the
/// caller sees what the upstream sent beyond the answer. Method: decode bodies (with and
/// without trailers) followed by more bytes, then decode again.
#[test]
fn bytes_after_the_end_of_a_body_stay_in_the_buffer() {
    for (body, trailers) in [
        (&b"2\r\nhi\r\n0\r\n\r\n"[..], None),
        (
            b"2\r\nhi\r\n0\r\nX-T: 1\r\n\r\n",
            Some(headers(&[("x-t", "1")])),
        ),
    ] {
        let garbage = b"HTTP/1.1 200 OK\r\n\r\n5\r\n";
        let whole = [body, &garbage[..]].concat();
        let expected = Decoding {
            data: b"hi".to_vec(),
            trailers,
            ended: true,
            left: garbage.to_vec(),
        };
        assert_eq!(feed(&[&whole]).as_ref(), Ok(&expected));
        assert_eq!(feed_bytewise(&whole).as_ref(), Ok(&expected));

        let mut decoder = ChunkedDecoder::default();
        let mut buf = BytesMut::from(&whole[..]);
        let mut decoding = Decoding::default();
        drain(&mut decoder, &mut buf, &mut decoding).expect("a valid body");
        assert_eq!(decoder.decode(&mut buf), Ok(Decoded::End));
        assert_eq!(&buf[..], garbage);
    }
}

/// Goal: a chunk's data is handed out as it arrives, without waiting for the whole
/// chunk. Method: give the decoder a size line and part of the data.
#[test]
fn a_chunks_data_is_handed_out_as_it_arrives() {
    let mut decoder = ChunkedDecoder::default();
    let mut buf = BytesMut::from(&b"a\r\n0123"[..]);
    assert_eq!(
        decoder.decode(&mut buf),
        Ok(Decoded::Data(Bytes::from_static(b"0123")))
    );
    assert_eq!(decoder.decode(&mut buf), Ok(Decoded::More));
    buf.extend_from_slice(b"456789\r\n0\r\n\r\n");
    assert_eq!(
        decoder.decode(&mut buf),
        Ok(Decoded::Data(Bytes::from_static(b"456789")))
    );
    assert_eq!(decoder.decode(&mut buf), Ok(Decoded::End));
}

/// Goal: leading zeros do not count towards a size's 16 hex digits. Method: decode a
/// size of 19 digits, all but one of them zeros.
#[test]
fn a_chunk_size_with_leading_zeros_is_accepted() {
    let body = b"0000000000000000005\r\nhello\r\n00000000000000000000\r\n\r\n";
    let decoded = feed(&[body]).expect("leading zeros are allowed");
    assert_eq!(decoded.data, b"hello");
    assert!(decoded.ended);
}

/// Goal: the largest size that fits in 64 bits is taken (and its data awaited). Method:
/// decode the size line `ffffffffffffffff` and the start of its data.
#[test]
fn a_chunk_size_of_sixteen_hex_digits_is_accepted() {
    let mut decoder = ChunkedDecoder::default();
    let mut buf = BytesMut::from(&b"FFFFffffFFFFffff;big\r\n"[..]);
    assert_eq!(decoder.decode(&mut buf), Ok(Decoded::More));
    assert!(buf.is_empty());
    buf.extend_from_slice(b"abc");
    assert_eq!(
        decoder.decode(&mut buf),
        Ok(Decoded::Data(Bytes::from_static(b"abc")))
    );
}

/// Goal: a size line of exactly `CHUNK_LINE_BYTES_MAX` bytes is taken. Method: decode a
/// chunk whose extension fills its size line to the limit.
#[test]
fn a_chunk_size_line_at_the_limit_is_accepted() {
    let mut line = b"3;x=".to_vec();
    line.resize(CHUNK_LINE_BYTES_MAX, b'a');
    let body = [&line[..], b"\r\nabc\r\n0\r\n\r\n"].concat();
    let decoded = feed(&[&body]).expect("a line at the limit");
    assert_eq!(decoded.data, b"abc");
    assert!(decoded.ended);
}

/// Goal: the trailers are parsed in any case and keep repeated names. Method: decode a
/// last chunk with an extension and three trailer lines.
#[test]
fn trailers_keep_every_value() {
    let body = b"0;last\r\nX-A: 1\r\nx-a: 2\r\nX-B: three\r\n\r\n";
    let decoded = feed(&[body]).expect("valid trailers");
    let trailers = decoded.trailers.expect("trailers");
    let values: Vec<_> = trailers.get_all("x-a").iter().collect();
    assert_eq!(values, ["1", "2"]);
    assert_eq!(trailers["x-b"], "three");
}

// ---------------------------------------------------------------------------------------
// ChunkedDecoder: refusals
// ---------------------------------------------------------------------------------------

/// Goal: a size line ending in a bare LF is refused, with or without an extension.
/// Method: feed such bodies whole, byte by byte and split anywhere.
#[test]
fn a_chunk_line_ending_in_a_bare_lf_is_refused() {
    assert_refused(b"5\nhello\r\n0\r\n\r\n");
    assert_refused(b"5;a=b\nhello\r\n0\r\n\r\n");
    assert_refused(b"2\r\nhi\r\n0\n\r\n");
}

/// Goal: a chunk's data followed by a bare LF is refused. Method: feed such a body
/// whole, byte by byte and split anywhere.
#[test]
fn a_chunks_data_followed_by_a_bare_lf_is_refused() {
    assert_refused(b"5\r\nhello\n0\r\n\r\n");
}

/// Goal: a CR followed by anything but LF is refused, in a size line and after data.
/// Method: feed such bodies whole, byte by byte and split anywhere.
#[test]
fn a_cr_not_followed_by_lf_is_refused() {
    assert_refused(b"5\rhello\r\n0\r\n\r\n");
    assert_refused(b"5\r\r\nhello\r\n0\r\n\r\n");
    assert_refused(b"5\r\nhello\rX0\r\n\r\n");
    assert_refused(b"5\r\nhello\r\r\n0\r\n\r\n");
}

/// Goal: a chunk's data must be followed by CRLF: a body longer than its size says is
/// refused. Method: feed `5\r\nhelloXX`, whole, byte by byte and split anywhere.
#[test]
fn a_chunks_data_not_followed_by_crlf_is_refused() {
    assert_refused(b"5\r\nhelloXX");
    assert_refused(b"5\r\nhello world\r\n0\r\n\r\n");
}

/// Goal: a size line without hex digits is refused. Method: feed an empty line, an
/// extension alone, a non-hex letter, a sign and a leading space.
#[test]
fn a_chunk_line_without_a_size_is_refused() {
    for body in [
        &b"\r\nhello\r\n"[..],
        b";ext\r\n",
        b"g\r\n",
        b"+5\r\n",
        b"-5\r\n",
        b" 5\r\n",
        b"0x5\r\nhello\r\n",
    ] {
        assert_refused(body);
    }
}

/// Goal: a size followed by anything but whitespace and an extension is refused.
/// Method: feed `5x`, `5 x`, `5,6` and `5 5` size lines.
#[test]
fn a_chunk_line_with_bytes_after_its_size_is_refused() {
    for body in [
        &b"5x\r\n"[..],
        b"5 x\r\n",
        b"5,6\r\n",
        b"5 5\r\n",
        b"5=\r\n",
    ] {
        assert_refused(body);
    }
}

/// Goal: a size that does not fit in 64 bits is refused, not truncated. Method: feed
/// sizes of 17 significant hex digits, with and without leading zeros.
#[test]
fn a_chunk_size_of_seventeen_significant_hex_digits_is_refused() {
    assert_refused(b"10000000000000000\r\n");
    assert_refused(b"0010000000000000000\r\n");
    assert_refused(b"fffffffffffffffff;x\r\n");
}

/// Goal: a size line that has not ended within `CHUNK_LINE_BYTES_MAX` bytes is refused,
/// not buffered without end; up to the limit it is waited for. Method: feed a line of
/// the limit's length without CRLF, then one byte more.
#[test]
fn a_chunk_line_longer_than_the_limit_is_refused() {
    let mut line = b"5;x=".to_vec();
    line.resize(CHUNK_LINE_BYTES_MAX, b'a');
    let waiting = feed(&[&line]).expect("a line at the limit is waited for");
    assert_eq!(waiting.left.len(), CHUNK_LINE_BYTES_MAX);
    line.push(b'a');
    assert!(feed(&[&line]).is_err());
    assert!(feed(&[&line[..100], &line[100..]]).is_err());
}

/// Goal: a size line one byte over the limit is refused even when its CRLF has
/// arrived, rather than waited on while the buffer grows. Method: feed a line of
/// `CHUNK_LINE_BYTES_MAX + 1` bytes, its CRLF and a lot of data, whole and byte by byte.
#[test]
fn a_chunk_line_one_byte_over_the_limit_is_refused_though_its_crlf_arrived() {
    let mut line = b"5;x=".to_vec();
    line.resize(CHUNK_LINE_BYTES_MAX + 1, b'a');
    let body = [&line[..], b"\r\nhello\r\n0\r\n\r\n", &vec![b'z'; 100_000]].concat();
    assert!(feed(&[&body]).is_err(), "whole");
    assert!(
        feed(&[&body[..=line.len()], &body[line.len() + 1..]]).is_err(),
        "the CR last in the first piece"
    );
}

/// Goal: a trailer section that has not ended within `TRAILER_BYTES_MAX` bytes is
/// refused; so is a whole one longer than that. Method: feed a last chunk with a long
/// unfinished trailer, then with a finished one over the limit.
#[test]
fn trailers_longer_than_the_limit_are_refused() {
    let mut open = b"0\r\nX-Long: ".to_vec();
    open.resize(3 + TRAILER_BYTES_MAX, b'a');
    let waiting = feed(&[&open]).expect("trailers at the limit are waited for");
    assert_eq!(waiting.left.len(), TRAILER_BYTES_MAX);
    open.push(b'a');
    assert!(feed(&[&open]).is_err(), "unfinished");
    assert!(
        feed(&[&open[..10], &open[10..]]).is_err(),
        "unfinished, split"
    );

    let whole = [&open[..], b"\r\n\r\n"].concat();
    assert!(feed(&[&whole]).is_err(), "finished");
}

/// Goal: malformed trailers are refused. Method: feed a trailer line without a colon,
/// and one with a space before its colon.
#[test]
fn malformed_trailers_are_refused() {
    assert!(feed(&[b"0\r\nno colon here\r\n\r\n"]).is_err());
    assert!(feed(&[b"0\r\nX-A : 1\r\n\r\n"]).is_err());
}
