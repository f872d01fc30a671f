//! The embedded object store's answers, on the proxy's client listener when it runs
//! without an upstream.
//!
//! - `PUT|POST /some/key` -> [`StoredObject`] (what was stored, with its revision).
//! - `GET /prefix/?list[&limit=N]` -> [`KeyList`].
//! - `GET /some/key` -> the body, with `Fencing-Token` and `Palisade-Revision` headers.

use serde::{Deserialize, Serialize};

/// One object's metadata: the answer to a put, and one entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredObject {
    /// The key: the request path without its leading `/`.
    pub key: String,
    /// The fencing token of the write that stored it.
    pub token: u64,
    /// The store-wide revision of that write: puts are numbered 1, 2, 3, ... in the order
    /// they were applied, across keys.
    pub revision: u64,
    /// Body size in bytes.
    pub size: u64,
}

/// `GET /prefix/?list`: the keys under a prefix, in key order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KeyList {
    /// The objects, at most the listing's limit.
    pub keys: Vec<StoredObject>,
    /// Whether the limit cut the listing short.
    pub truncated: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a listing reads and writes the JSON the store has always answered.
    /// Method: parse an example, write it back.
    #[test]
    fn key_list_matches_the_wire() {
        let text = r#"{"keys":[{"key":"a/b","token":4,"revision":2,"size":5}],"truncated":false}"#;
        let list: KeyList = serde_json::from_str(text).unwrap();
        assert_eq!(list.keys[0].revision, 2);
        assert_eq!(serde_json::to_string(&list).unwrap(), text);
    }
}
