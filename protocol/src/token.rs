//! Fencing tokens on the wire: exactly one `Fencing-Token` header holding one decimal
//! u64 of ASCII digits. Anything else is refused, never guessed at: a proxy that read
//! `+5`, `5.0` or a second header differently from the client would fence the wrong
//! value.

use std::fmt;

use http::HeaderMap;

use crate::headers::FENCING_TOKEN;

/// Digits in `u64::MAX`; a longer string cannot be a u64 (leading zeros included).
const TOKEN_DIGITS_MAX: usize = 20;

/// Why a `Fencing-Token` value is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenError {
    /// The header appears more than once.
    Repeated,
    /// The value is not visible ASCII.
    NotAscii,
    /// The value is empty (after trimming spaces).
    Empty,
    /// A character other than a decimal digit.
    NotDecimal {
        /// The value as given.
        value: String,
        /// The first offending character.
        found: char,
    },
    /// Above `u64::MAX`.
    Overflow {
        /// The value as given.
        value: String,
    },
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Repeated => write!(f, "Fencing-Token header is repeated"),
            Self::NotAscii => write!(f, "Fencing-Token is not ASCII"),
            Self::Empty => write!(f, "Fencing-Token is empty"),
            Self::NotDecimal { value, found } => {
                write!(f, "{value:?} has {found:?}; expected a decimal u64")
            }
            Self::Overflow { value } => write!(f, "{value:?} overflows u64"),
        }
    }
}

impl std::error::Error for TokenError {}

/// Parses one token value: decimal ASCII digits (surrounding spaces allowed), at most
/// `u64::MAX`.
pub fn parse_token(text: &str) -> Result<u64, TokenError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(TokenError::Empty);
    }
    if let Some(found) = text.chars().find(|c| !c.is_ascii_digit()) {
        return Err(TokenError::NotDecimal {
            value: text.to_owned(),
            found,
        });
    }
    if text.len() > TOKEN_DIGITS_MAX {
        return Err(TokenError::Overflow {
            value: text.to_owned(),
        });
    }
    text.parse::<u64>().map_err(|_| TokenError::Overflow {
        value: text.to_owned(),
    })
}

/// The `Fencing-Token` of a request head: `None` when absent, the token when there is
/// exactly one valid value, an error otherwise.
pub fn parse_token_header(headers: &HeaderMap) -> Result<Option<u64>, TokenError> {
    let mut values = headers.get_all(FENCING_TOKEN).iter();
    match (values.next(), values.next()) {
        (None, _) => Ok(None),
        (Some(_), Some(_)) => Err(TokenError::Repeated),
        (Some(v), None) => match plain_token(v.as_bytes()) {
            Some(token) => Ok(Some(token)),
            None => parse_token(v.to_str().map_err(|_| TokenError::NotAscii)?).map(Some),
        },
    }
}

/// The token of a value that is only digits and at most `u64::MAX`, the form every
/// client sends, read in one pass over its bytes; `None` for anything else, which
/// [`parse_token`] then reads (and refuses, or trims). For every value this reads, it
/// gives what [`parse_token`] gives.
fn plain_token(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > TOKEN_DIGITS_MAX {
        return None;
    }
    value.iter().try_fold(0u64, |token, &byte| {
        let digit = byte.checked_sub(b'0').filter(|d| *d <= 9)?;
        token.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn head(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(FENCING_TOKEN, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    /// Goal: exactly the contract's tokens parse; everything else is refused by name.
    /// Method: the cases in `cases.json`, shared with the Python client's test.
    #[test]
    fn token_cases_match_the_shared_table() {
        let cases: serde_json::Value = serde_json::from_str(include_str!("../cases.json")).unwrap();
        let mut checked = 0;
        for case in cases["tokens"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let got = parse_token(text).ok();
            assert_eq!(got, case["token"].as_u64(), "{text:?}");
            checked += 1;
        }
        assert!(checked >= 8, "the table has only {checked} token cases");
    }

    /// Goal: the header is absent, one value, or refused when repeated or not ASCII.
    /// Method: parse header maps.
    #[test]
    fn header_forms() {
        assert_eq!(parse_token_header(&head(&[])), Ok(None));
        assert_eq!(parse_token_header(&head(&[" 7 "])), Ok(Some(7)));
        assert_eq!(
            parse_token_header(&head(&["1", "2"])),
            Err(TokenError::Repeated)
        );
        let mut h = HeaderMap::new();
        h.insert(FENCING_TOKEN, HeaderValue::from_bytes(b"\xff").unwrap());
        assert_eq!(parse_token_header(&h), Err(TokenError::NotAscii));
    }

    /// Goal: the one-pass read of plain digits never disagrees with `parse_token`: what
    /// it reads, `parse_token` reads the same, and it leaves every other value to it.
    /// Method: the edges (empty, `u64::MAX` and one more, 21 digits with leading zeros,
    /// each byte next to '0' and '9'), then random byte strings of up to 22 bytes,
    /// biased to digits.
    #[test]
    fn the_plain_reading_agrees_with_parse_token() {
        let check = |value: &[u8]| {
            let slow = std::str::from_utf8(value).ok().map(parse_token);
            match plain_token(value) {
                Some(token) => assert_eq!(slow, Some(Ok(token)), "{value:?}"),
                None => assert!(
                    !value.iter().all(u8::is_ascii_digit)
                        || value.is_empty()
                        || !matches!(slow, Some(Ok(_))),
                    "plain digits {value:?} left to the slow path although it reads them"
                ),
            }
        };
        for edge in [
            &b""[..],
            b"0",
            b"18446744073709551615",
            b"18446744073709551616",
            b"99999999999999999999",
            b"000000000000000000001",
            b"/",
            b":",
            b" 7",
            b"7 ",
            b"+7",
            b"-0",
        ] {
            check(edge);
        }
        assert_eq!(plain_token(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(plain_token(b"18446744073709551616"), None);
        // A small generator, seeded: no dependency for one property.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..200_000 {
            let len = usize::try_from(next() % 23).unwrap();
            let value: Vec<u8> = (0..len)
                .map(|_| match next() % 8 {
                    0 => u8::try_from(next() % 256).unwrap(),
                    1 => b' ',
                    _ => b'0' + u8::try_from(next() % 10).unwrap(),
                })
                .collect();
            check(&value);
        }
    }
}
