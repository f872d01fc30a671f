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
        (Some(v), None) => parse_token(v.to_str().map_err(|_| TokenError::NotAscii)?).map(Some),
    }
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
}
