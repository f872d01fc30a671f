//! The embedded object store.

use std::sync::Arc;

/// Default bound on one object's size: 16 MiB.
pub const OBJECT_BYTES_MAX_DEFAULT: u64 = 16 * 1024 * 1024;

/// One stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// The fencing token of the write that stored it.
    pub token: u64,
    /// The body.
    pub body: Vec<u8>,
}

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The key.
    pub key: String,
    /// The fencing token of the write that stored it.
    pub token: u64,
    /// Body size in bytes.
    pub size: u64,
}

/// Why an object operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectError {
    /// The body is over the configured bound.
    #[error("object {key} is {size} bytes, over the limit of {max} bytes")]
    TooLarge {
        /// The key.
        key: String,
        /// The body size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// redb failed.
    #[error("object storage error: {0}")]
    Storage(String),
}

/// Key to object, durable in redb. Cheap to clone.
#[derive(Clone)]
pub struct ObjectStore {
    _db: Arc<redb::Database>,
}

impl ObjectStore {
    /// Opens the store in `db`; bodies over `object_bytes_max` are refused.
    pub fn open(db: Arc<redb::Database>, object_bytes_max: u64) -> Result<Self, crate::OpenError> {
        let _ = (db, object_bytes_max);
        todo!("helper S")
    }
    /// The configured size bound.
    pub fn object_bytes_max(&self) -> u64 {
        todo!("helper S")
    }
    /// Stores `body` under `key`, recording `token`; durable (fsynced) before it returns.
    pub fn put(&self, key: &str, token: u64, body: &[u8]) -> Result<(), ObjectError> {
        let _ = (key, token, body);
        todo!("helper S")
    }
    /// Reads `key`.
    pub fn get(&self, key: &str) -> Result<Option<Object>, ObjectError> {
        let _ = key;
        todo!("helper S")
    }
    /// Removes `key`; durable before it returns. Reports whether it existed.
    pub fn delete(&self, key: &str) -> Result<bool, ObjectError> {
        let _ = key;
        todo!("helper S")
    }
    /// Up to `limit` keys starting with `prefix`, in key order.
    pub fn list(&self, prefix: &str, limit: usize) -> Result<Vec<ObjectMeta>, ObjectError> {
        let _ = (prefix, limit);
        todo!("helper S")
    }
}
