//! `Fencing-Token`, `Fencing-Token-Proof` and scope names, from arbitrary bytes.
//!
//! Property: parsing never panics; a token that parses re-renders as the same decimal
//! (ASCII digits, surrounding spaces trimmed, leading zeros aside) and text is refused
//! only when it is not 1 to 20 decimal digits of a u64; a header map parses
//! to a token only when it has exactly one valid value; a proof that decodes encodes back
//! to the same text; a scope name is accepted exactly when it is 1 to 128 bytes of
//! `[A-Za-z0-9._-]`, and a `Scope` built from it reads back unchanged.
#![no_main]

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use palisade_protocol::headers::FENCING_TOKEN;
use palisade_protocol::proof::{PROOF_BYTES, decode_proof, encode_proof};
use palisade_protocol::{SCOPE_BYTES_MAX, Scope, parse_token, parse_token_header};

/// Digits of `u64::MAX`: the longest token text the contract accepts.
const TOKEN_DIGITS_MAX: usize = 20;

/// The contract's scope rule, written out independently of the crate's.
fn contract_scope(name: &str) -> bool {
    (1..=SCOPE_BYTES_MAX).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn check_token(text: &str) {
    let trimmed = text.trim();
    match parse_token(text) {
        Ok(token) => {
            assert!(
                !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()),
                "{text:?} parsed as {token} but is not decimal digits"
            );
            let digits = trimmed.trim_start_matches('0');
            let rendered = token.to_string();
            assert!(
                rendered == digits || (token == 0 && digits.is_empty()),
                "{text:?} parsed as {token}, which renders as {rendered}"
            );
            assert_eq!(
                parse_token(&rendered),
                Ok(token),
                "{rendered:?} does not round-trip"
            );
        }
        Err(_) => {
            // Refused: then it is not a u64 in at most 20 decimal digits (the length of
            // `u64::MAX`; leading zeros count, as the contract's shared cases say).
            let plain = (1..=TOKEN_DIGITS_MAX).contains(&trimmed.len())
                && trimmed.bytes().all(|b| b.is_ascii_digit());
            assert!(
                !plain || trimmed.parse::<u64>().is_err(),
                "{text:?} is a decimal u64 but was refused"
            );
        }
    }
}

fn check_header(values: &[&[u8]]) {
    let mut headers = HeaderMap::new();
    for value in values {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append(FENCING_TOKEN, value);
        }
    }
    let count = headers.get_all(FENCING_TOKEN).iter().count();
    match parse_token_header(&headers) {
        Ok(None) => assert_eq!(count, 0, "{count} values parsed as no token"),
        Ok(Some(token)) => {
            assert_eq!(count, 1, "{count} values parsed as token {token}");
            let value = headers.get(FENCING_TOKEN).map(HeaderValue::to_str);
            let Some(Ok(text)) = value else {
                panic!("a non-ASCII value parsed as token {token}");
            };
            assert_eq!(parse_token(text), Ok(token));
        }
        Err(_) => assert!(count > 0, "an absent header was refused"),
    }
}

fn check_proof(text: &[u8]) {
    if let Ok(signature) = decode_proof(text) {
        assert_eq!(signature.len(), PROOF_BYTES);
        assert_eq!(
            encode_proof(&signature).as_bytes(),
            text,
            "a proof decoded from text that is not its one encoding"
        );
    }
}

fn check_scope(name: &str) {
    let expected = contract_scope(name);
    assert_eq!(
        Scope::check(name).is_ok(),
        expected,
        "scope rule disagrees on {name:?}"
    );
    match Scope::new(name) {
        Ok(scope) => {
            assert!(expected, "{name:?} built a Scope");
            assert_eq!(scope.as_str(), name);
            let json = format!("\"{name}\"");
            let read: Result<Scope, _> = serde_json::from_str(&json);
            assert_eq!(
                read.ok().as_ref(),
                Some(&scope),
                "serde disagrees on {name:?}"
            );
        }
        Err(_) => assert!(!expected, "{name:?} refused"),
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    check_token(&text);
    // Up to three header values, split at NUL bytes.
    let values: Vec<&[u8]> = data.split(|&b| b == 0).take(3).collect();
    check_header(&values);
    check_proof(data);
    check_scope(&text);
    if let Ok(text) = std::str::from_utf8(data) {
        for part in text.split('\n') {
            check_token(part);
            check_scope(part);
        }
    }
});
