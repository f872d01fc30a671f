//! An upstream's answer, as the proxy's own HTTP/1.1 client reads it
//! (`proxy/src/upstream/h1/codec.rs`): the head parsed and its body's framing decided,
//! then a chunked body decoded, whole and in pieces.
//!
//! The first byte picks the request's method (even: HEAD, odd: GET, so that seeds start
//! with `H` or `G`) and, in its other bits, the largest piece the answer and its body
//! are cut into; the rest is what the upstream sent.
//!
//! Property: nothing panics. A head that parses took at most the input and at most
//! `ANSWER_HEAD_BYTES_MAX` bytes, parses the same without the bytes after it, and is not
//! a head yet when cut shorter; a head still awaited is within that limit. Fed in pieces
//! and parsed only when the exchange would parse it (once a line has ended), a head is
//! found at the same length, one awaited whole is awaited, and one refused whole is
//! never taken. Its headers
//! are the lines the upstream sent (split again here) but the hop-by-hop ones and those
//! `Connection` names. Its framing agrees with those lines: no body exactly for HEAD,
//! 1xx, 204 and 304; chunked only with one `chunked` coding and no `Content-Length`; a
//! length only with no `Transfer-Encoding` and every `Content-Length` element that
//! length; until the close only with neither. The connection is kept exactly when
//! HTTP/1.1, not until the close, and without a `close` token. A chunked body decodes to
//! no more data than the bytes fed; in pieces it decodes to the same data, trailers, end
//! (or refusal) and leftover bytes as whole; and a decoder that waits for more holds no
//! more than its limits allow, even when much more is then given to it.
#![no_main]

use bytes::BytesMut;
use http::{HeaderMap, Method, StatusCode, Version};
use libfuzzer_sys::fuzz_target;
use palisade_proxy::fuzzing::{
    ANSWER_HEAD_BYTES_MAX, AnswerFraming, AnswerHead, CHUNK_LINE_BYTES_MAX, ChunkedBody,
    ChunkedPiece, TRAILER_BYTES_MAX, parse_answer_head, worth_parsing_answer_head,
};

/// The most bytes a chunked decoder may hold while it waits for more: a size line (CR
/// included) or a trailer section, each at its limit.
const WAITING_BYTES_MAX: usize = if CHUNK_LINE_BYTES_MAX + 1 > TRAILER_BYTES_MAX {
    CHUNK_LINE_BYTES_MAX + 1
} else {
    TRAILER_BYTES_MAX
};

/// The hop-by-hop headers the proxy never passes on (`HOP_BY_HOP` in
/// `proxy/src/upstream/mod.rs`).
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "transfer-encoding",
    "upgrade",
    "expect",
];

/// The header lines of a head the codec accepted, split here again: `(name in lower
/// case, value)`; the empty lines before the status line (which httparse skips), the
/// status line and the blank line at the end left out.
fn raw_lines(head: &[u8]) -> Vec<(String, &[u8])> {
    head.split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
        .skip_while(|line| line.is_empty())
        .skip(1)
        .take_while(|line| !line.is_empty())
        .map(|line| {
            let colon = line.iter().position(|&b| b == b':').expect("a header line");
            let name = String::from_utf8_lossy(&line[..colon]).to_ascii_lowercase();
            (name, line[colon + 1..].trim_ascii())
        })
        .collect()
}

/// The comma-separated elements of every raw line of `name`, trimmed, empty ones out.
fn elements<'a>(lines: &[(String, &'a [u8])], name: &str) -> Vec<&'a [u8]> {
    lines
        .iter()
        .filter(|(n, _)| n == name)
        .flat_map(|(_, v)| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|e| !e.is_empty())
        .collect()
}

/// The head's headers, framing and keep-alive, against the lines the upstream sent
/// (`raw`, worked out here again).
fn check_head(head: &AnswerHead, raw: &[u8], method: &Method) {
    let lines = raw_lines(raw);
    let text = String::from_utf8_lossy(raw);
    let has = |name: &str| lines.iter().any(|(n, _)| n == name);
    let (te, cl) = (has("transfer-encoding"), has("content-length"));

    // Hop-by-hop headers, and those `Connection` names (`close` is not a name there),
    // are left out; the rest stay.
    let named: Vec<String> = elements(&lines, "connection")
        .iter()
        .map(|t| String::from_utf8_lossy(t).to_ascii_lowercase())
        .filter(|t| t != "close")
        .collect();
    let kept = lines
        .iter()
        .filter(|(n, _)| !HOP_BY_HOP.contains(&n.as_str()) && !named.contains(n))
        .count();
    assert_eq!(head.headers.len(), kept, "{text:?} gave {head:?}");
    for name in HOP_BY_HOP
        .iter()
        .copied()
        .chain(named.iter().map(String::as_str))
    {
        assert!(!head.headers.contains_key(name), "{name} kept: {head:?}");
    }

    let bodiless = *method == Method::HEAD
        || head.status.is_informational()
        || head.status == StatusCode::NO_CONTENT
        || head.status == StatusCode::NOT_MODIFIED;
    assert_eq!(
        head.framing == AnswerFraming::Empty,
        bodiless,
        "{head:?} for {method}"
    );
    match head.framing {
        AnswerFraming::Empty => {}
        AnswerFraming::Chunked => {
            assert!(!cl, "chunked with a Content-Length: {text:?}");
            let codings = elements(&lines, "transfer-encoding");
            assert!(
                codings.len() == 1 && codings[0].eq_ignore_ascii_case(b"chunked"),
                "chunked, but the codings are {codings:?}: {text:?}"
            );
        }
        AnswerFraming::Length(len) => {
            assert!(!te, "a length with a Transfer-Encoding: {text:?}");
            let lengths: Vec<&[u8]> = lines
                .iter()
                .filter(|(n, _)| n == "content-length")
                .flat_map(|(_, v)| v.split(|&b| b == b','))
                .map(<[u8]>::trim_ascii)
                .collect();
            assert!(!lengths.is_empty(), "a length without a Content-Length");
            for element in lengths {
                assert!(
                    !element.is_empty() && element.iter().all(u8::is_ascii_digit),
                    "Content-Length element {element:?} taken as {len}: {text:?}"
                );
                let value = std::str::from_utf8(element)
                    .ok()
                    .and_then(|t| t.parse().ok());
                assert_eq!(value, Some(len), "Content-Length element {element:?}");
            }
        }
        AnswerFraming::Close => {
            assert!(!te && !cl, "read until the close, but framed: {text:?}");
        }
    }
    let close = elements(&lines, "connection")
        .iter()
        .any(|t| t.eq_ignore_ascii_case(b"close"));
    assert_eq!(
        head.keep_alive,
        head.version == Version::HTTP_11
            && head.framing != AnswerFraming::Close
            && !close
            && head.status != 101,
        "{head:?}"
    );
}

/// What a chunked body decoded to.
#[derive(Debug, Default, PartialEq)]
struct Decoding {
    data: Vec<u8>,
    trailers: Option<HeaderMap>,
    ended: bool,
    refused: bool,
    /// The bytes left in the buffer (after the end, or waiting for more).
    left: Vec<u8>,
}

/// Decodes from `buf` until the decoder waits, ends or refuses.
fn drain(decoder: &mut ChunkedBody, buf: &mut BytesMut, into: &mut Decoding) {
    loop {
        match decoder.decode(buf) {
            Ok(ChunkedPiece::Data(data)) => {
                assert!(!data.is_empty(), "an empty data piece");
                assert!(!into.ended, "data after the end");
                into.data.extend_from_slice(&data);
            }
            Ok(ChunkedPiece::Trailers(trailers)) => {
                assert!(!into.ended, "trailers after the end");
                into.trailers = Some(trailers);
                into.ended = true;
            }
            Ok(ChunkedPiece::End) => {
                into.ended = true;
                return;
            }
            Ok(ChunkedPiece::More) => {
                assert!(
                    buf.len() <= WAITING_BYTES_MAX,
                    "the decoder waits holding {} bytes",
                    buf.len()
                );
                return;
            }
            Err(_) => {
                into.refused = true;
                return;
            }
        }
    }
}

/// Feeds `pieces` to a decoder one after the other; the decoder, the buffer and what
/// they decoded.
fn feed<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> (ChunkedBody, BytesMut, Decoding) {
    let mut decoder = ChunkedBody::default();
    let mut buf = BytesMut::new();
    let mut decoding = Decoding::default();
    for piece in pieces {
        buf.extend_from_slice(piece);
        drain(&mut decoder, &mut buf, &mut decoding);
        if decoding.refused {
            break;
        }
    }
    decoding.left = buf.to_vec();
    (decoder, buf, decoding)
}

/// Pieces of `body` of 1 to `largest` bytes, their sizes drawn from `seed`.
fn pieces(body: &[u8], largest: usize, seed: u8) -> Vec<&[u8]> {
    let mut state = u32::from(seed).wrapping_mul(0x9E37_79B9) | 1;
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let size = (1 + state as usize % largest).min(rest.len());
        let (piece, after) = rest.split_at(size);
        out.push(piece);
        rest = after;
    }
    out
}

/// The chunked body that follows a head (and whatever follows the body), decoded whole
/// and in pieces cut by `selector`.
fn check_chunked(body: &[u8], selector: u8) {
    let largest = usize::from(selector >> 1) + 1;
    let (_, _, whole) = feed([body]);
    let (mut decoder, mut buf, split) = feed(pieces(body, largest, selector));
    for decoding in [&whole, &split] {
        assert!(decoding.data.len() <= body.len(), "more data than bytes");
        assert!(!(decoding.ended && decoding.refused));
    }
    if whole.refused || split.refused {
        assert_eq!(whole.refused, split.refused, "refused only one way");
        assert!(
            whole.data.starts_with(&split.data) || split.data.starts_with(&whole.data),
            "the data before the refusal differs"
        );
    } else {
        assert_eq!(whole, split, "whole and in pieces of up to {largest}");
    }
    // A decoder waiting for more gives a verdict, or takes the bytes as data, before it
    // holds more than its limits: it never waits on a buffer that only grows.
    if !split.ended && !split.refused {
        buf.resize(buf.len() + WAITING_BYTES_MAX + 2, b'a');
        drain(&mut decoder, &mut buf, &mut Decoding::default());
    }
}

/// The answer fed in pieces cut by `selector`, parsed only when the exchange would parse
/// it (`worth_parsing_answer_head`): a head that parses whole is found at the same
/// length; one still awaited whole is awaited in pieces; one refused whole is refused, or
/// still awaited (its bad byte came before a line's end that never arrived).
fn check_trickled(answer: &[u8], method: &Method, selector: u8, whole: Result<Option<usize>, ()>) {
    let largest = usize::from(selector >> 1) + 1;
    let mut parsed = 0;
    let mut fed = 0;
    let mut outcome = Ok(None);
    for piece in pieces(answer, largest, selector) {
        fed += piece.len();
        if !worth_parsing_answer_head(&answer[..fed], parsed) {
            continue;
        }
        match parse_answer_head(&answer[..fed], method) {
            Ok(None) => parsed = fed,
            Ok(Some(head)) => {
                outcome = Ok(Some(head.len));
                break;
            }
            Err(_) => {
                outcome = Err(());
                break;
            }
        }
    }
    match whole {
        Ok(_) => assert_eq!(outcome, whole, "in pieces of up to {largest}"),
        Err(()) => assert!(
            !matches!(outcome, Ok(Some(_))),
            "refused whole, a head in pieces of up to {largest}: {outcome:?}"
        ),
    }
}

/// One input: the method's selector byte, then the upstream's answer.
fn check(data: &[u8]) {
    let Some((&selector, answer)) = data.split_first() else {
        return;
    };
    let method = if selector & 1 == 0 {
        Method::HEAD
    } else {
        Method::GET
    };
    let whole = parse_answer_head(answer, &method);
    let summary = match &whole {
        Ok(head) => Ok(head.as_ref().map(|head| head.len)),
        Err(_) => Err(()),
    };
    check_trickled(answer, &method, selector, summary);
    let head = match whole {
        Ok(Some(head)) => head,
        Ok(None) => {
            assert!(
                answer.len() <= ANSWER_HEAD_BYTES_MAX,
                "a head of {} bytes still awaited",
                answer.len()
            );
            return;
        }
        Err(_) => return,
    };
    assert!(
        head.len > 0 && head.len <= answer.len() && head.len <= ANSWER_HEAD_BYTES_MAX,
        "a head of {} bytes from {}",
        head.len,
        answer.len()
    );
    // The head alone parses the same; cut shorter, it is not a head yet.
    match parse_answer_head(&answer[..head.len], &method) {
        Ok(Some(again)) => {
            assert_eq!(
                (again.status, again.version, &again.headers, again.framing),
                (head.status, head.version, &head.headers, head.framing)
            );
            assert_eq!((again.keep_alive, again.len), (head.keep_alive, head.len));
        }
        other => panic!("the head alone gave {other:?}, not {head:?}"),
    }
    let cut = usize::from(selector) % head.len;
    for shorter in [head.len - 1, head.len / 2, cut] {
        assert!(
            matches!(parse_answer_head(&answer[..shorter], &method), Ok(None)),
            "the first {shorter} bytes of a head of {} are not awaited",
            head.len
        );
    }
    check_head(&head, &answer[..head.len], &method);
    if head.framing == AnswerFraming::Chunked {
        check_chunked(&answer[head.len..], selector);
    }
}

fuzz_target!(|data: &[u8]| check(data));
