//! Scope names: the one rule, checked in one place.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest scope name, in bytes. Scopes are keys in the proxy's redb table and labels in
/// logs; 128 bytes is room for any naming scheme without letting a client grow them.
pub const SCOPE_BYTES_MAX: usize = 128;

/// The scope of a write that names none.
pub const DEFAULT_SCOPE: &str = "default";

/// A fencing scope: 1 to [`SCOPE_BYTES_MAX`] characters of `[A-Za-z0-9._-]`.
///
/// The invariant holds for every value of the type: the only ways to build one are
/// [`Scope::new`] (and `FromStr`, `TryFrom`, serde), which validate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Scope(String);

/// Why a string is not a scope.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScopeError {
    /// The empty string.
    Empty,
    /// Longer than [`SCOPE_BYTES_MAX`].
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// A character outside `[A-Za-z0-9._-]`.
    BadChar {
        /// The scope as given.
        scope: String,
        /// The first offending character.
        found: char,
    },
}

impl fmt::Display for ScopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "scope is empty"),
            Self::TooLong { len } => {
                write!(f, "scope is {len} bytes, longer than {SCOPE_BYTES_MAX}")
            }
            Self::BadChar { scope, found } => write!(
                f,
                "scope {scope:?} has {found:?}; allowed are A-Z a-z 0-9 . _ -"
            ),
        }
    }
}

impl std::error::Error for ScopeError {}

/// Whether `b` may appear in a scope name: `[A-Za-z0-9._-]`.
pub fn is_scope_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

impl Scope {
    /// Validates `name`.
    pub fn new(name: impl Into<String>) -> Result<Self, ScopeError> {
        let name = name.into();
        Self::check(&name)?;
        Ok(Self(name))
    }

    /// Checks `name` without taking it.
    pub fn check(name: &str) -> Result<(), ScopeError> {
        if name.is_empty() {
            return Err(ScopeError::Empty);
        }
        if name.len() > SCOPE_BYTES_MAX {
            return Err(ScopeError::TooLong { len: name.len() });
        }
        match name
            .chars()
            .find(|&c| !u8::try_from(c).is_ok_and(is_scope_byte))
        {
            Some(found) => Err(ScopeError::BadChar {
                scope: name.to_owned(),
                found,
            }),
            None => Ok(()),
        }
    }

    /// The `default` scope.
    pub fn default_scope() -> Self {
        Self(DEFAULT_SCOPE.to_owned())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl Default for Scope {
    fn default() -> Self {
        Self::default_scope()
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Scope {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for Scope {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Scope {
    type Err = ScopeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for Scope {
    type Error = ScopeError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl TryFrom<&str> for Scope {
    type Error = ScopeError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl From<Scope> for String {
    fn from(s: Scope) -> Self {
        s.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the scope rule accepts exactly 1-128 of `[A-Za-z0-9._-]`.
    /// Method: boundary lengths, every allowed class, and hostile characters.
    #[test]
    fn scope_rule_accepts_exactly_the_contract() {
        for good in [
            "a",
            "default",
            "billing.eu-1_x",
            &"x".repeat(SCOPE_BYTES_MAX),
        ] {
            assert_eq!(
                Scope::new(good).map(Scope::into_string).as_deref(),
                Ok(good)
            );
        }
        assert_eq!(Scope::new(""), Err(ScopeError::Empty));
        assert_eq!(
            Scope::new("x".repeat(SCOPE_BYTES_MAX + 1)),
            Err(ScopeError::TooLong {
                len: SCOPE_BYTES_MAX + 1
            })
        );
        for bad in ["a b", "a/b", "ä", "a\0", "a%2F", "..\n"] {
            let err = Scope::new(bad).unwrap_err();
            assert!(matches!(err, ScopeError::BadChar { .. }), "{bad:?}: {err}");
        }
    }

    /// Goal: serde cannot build a scope that breaks the rule.
    /// Method: deserialize a good and a bad JSON string.
    #[test]
    fn deserializing_validates() {
        let s: Scope = serde_json::from_str("\"jobs\"").unwrap();
        assert_eq!(s.as_str(), "jobs");
        assert!(serde_json::from_str::<Scope>("\"bad scope\"").is_err());
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"jobs\"");
    }
}

#[cfg(test)]
mod shared_cases {
    use super::*;

    /// Goal: the scope rule agrees with the table the Python client is tested against.
    /// Method: every case in `cases.json`.
    #[test]
    fn scope_cases_match_the_shared_table() {
        let cases: serde_json::Value = serde_json::from_str(include_str!("../cases.json")).unwrap();
        let mut checked = 0;
        for case in cases["scopes"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            assert_eq!(
                Scope::check(name).is_ok(),
                case["valid"].as_bool().unwrap(),
                "{name:?}"
            );
            checked += 1;
        }
        assert!(checked >= 8, "the table has only {checked} scope cases");
        let headers = &cases["headers"];
        for (key, name) in [
            ("token", crate::headers::FENCING_TOKEN),
            ("scope", crate::headers::FENCING_SCOPE),
            ("current", crate::headers::FENCING_TOKEN_CURRENT),
            ("proof", crate::headers::FENCING_TOKEN_PROOF),
        ] {
            assert_eq!(
                headers[key].as_str().unwrap().to_ascii_lowercase(),
                name.as_str()
            );
        }
    }
}
