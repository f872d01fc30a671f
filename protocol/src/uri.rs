//! Character classes of RFC 3986 that more than one validator needs: the announce entry's
//! path and the proxy's check of a `Host` header, so the two never disagree on a byte.

/// Whether `b` is unreserved (`ALPHA / DIGIT / "-" / "." / "_" / "~"`) or a sub-delimiter
/// (`"!" / "$" / "&" / "'" / "(" / ")" / "*" / "+" / "," / ";" / "="`): the bytes that
/// may stand for themselves in a path segment and in a host (RFC 3986 §2.2, §2.3).
pub fn is_unreserved_or_sub_delim(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: exactly the 66 + 11 bytes of the two classes are admitted, and no separator,
    /// space, control byte or non-ASCII byte. Method: every byte value.
    #[test]
    fn admits_exactly_unreserved_and_sub_delims() {
        let admitted: Vec<u8> = (0..=255u8)
            .filter(|&b| is_unreserved_or_sub_delim(b))
            .collect();
        assert_eq!(admitted.len(), 62 + 4 + 11);
        for b in [
            b'/', b'?', b'#', b'@', b':', b'%', b' ', b'[', 0, 0x7f, 0x80,
        ] {
            assert!(!is_unreserved_or_sub_delim(b), "{b:#x}");
        }
    }
}
