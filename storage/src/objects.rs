//! The embedded object store.
//!
//! # Durability
//! [`ObjectStore::put`] and [`ObjectStore::delete`] commit with
//! [`redb::Durability::Immediate`]: the change is fsynced before they return, so an
//! acknowledged write or delete survives a crash. Reads see the last committed state.

use std::sync::Arc;

use redb::{Durability, ReadableDatabase, ReadableTable, TableError};

use crate::tables::{OBJECT_COUNTERS, OBJECTS};

/// The key in [`OBJECT_COUNTERS`] of the last write's revision.
const REVISION: &str = "revision";

/// Default bound on one object's size: 16 MiB.
pub const OBJECT_BYTES_MAX_DEFAULT: u64 = 16 * 1024 * 1024;

/// One stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// The fencing token of the write that stored it.
    pub token: u64,
    /// The store-wide revision of the write that stored it: puts are numbered 1, 2, 3, ...
    /// in the order they were applied, so revisions give the apply order across keys.
    pub revision: u64,
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
    /// The store-wide revision of the write that stored it (see [`Object::revision`]).
    pub revision: u64,
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
///
/// Durability: `put` and `delete` are fsynced (`Durability::Immediate`) before they return.
#[derive(Clone)]
pub struct ObjectStore {
    db: Arc<redb::Database>,
    /// Bodies larger than this are refused before any I/O.
    object_bytes_max: u64,
}

impl ObjectStore {
    /// Opens the store in `db`; bodies over `object_bytes_max` are refused.
    pub fn open(db: Arc<redb::Database>, object_bytes_max: u64) -> Result<Self, crate::OpenError> {
        // Nothing to load: objects are read from redb on demand. A file without the table
        // reads as empty, and the first `put` creates the table.
        Ok(Self {
            db,
            object_bytes_max,
        })
    }
    /// The configured size bound.
    pub fn object_bytes_max(&self) -> u64 {
        self.object_bytes_max
    }
    /// Stores `body` under `key`, recording `token` and the next store-wide revision, which
    /// it returns; durable (fsynced) before it returns.
    pub fn put(&self, key: &str, token: u64, body: &[u8]) -> Result<u64, ObjectError> {
        // `usize` is at most 64 bits on every supported target, so this never saturates.
        let size = u64::try_from(body.len()).unwrap_or(u64::MAX);
        if size > self.object_bytes_max {
            return Err(ObjectError::TooLarge {
                key: key.to_owned(),
                size,
                max: self.object_bytes_max,
            });
        }
        let txn = self.begin_durable_write()?;
        let revision = {
            let mut counters = txn.open_table(OBJECT_COUNTERS).map_err(storage_error)?;
            let last = counters
                .get(REVISION)
                .map_err(storage_error)?
                .map_or(0, |v| v.value());
            let revision = last + 1;
            counters.insert(REVISION, revision).map_err(storage_error)?;
            let mut table = txn.open_table(OBJECTS).map_err(storage_error)?;
            table
                .insert(key, (token, revision, body))
                .map_err(storage_error)?;
            revision
        };
        txn.commit().map_err(storage_error)?;
        tracing::debug!(key, token, revision, size, "object stored");
        Ok(revision)
    }
    /// Reads `key`.
    pub fn get(&self, key: &str) -> Result<Option<Object>, ObjectError> {
        let txn = self.db.begin_read().map_err(storage_error)?;
        let table = match txn.open_table(OBJECTS) {
            Ok(table) => table,
            Err(TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(err) => return Err(storage_error(err)),
        };
        let object = table.get(key).map_err(storage_error)?.map(|stored| {
            let (token, revision, body) = stored.value();
            Object {
                token,
                revision,
                body: body.to_vec(),
            }
        });
        Ok(object)
    }
    /// Removes `key`; durable before it returns. Reports whether it existed.
    pub fn delete(&self, key: &str) -> Result<bool, ObjectError> {
        let txn = self.begin_durable_write()?;
        let existed = {
            let mut table = txn.open_table(OBJECTS).map_err(storage_error)?;
            table.remove(key).map_err(storage_error)?.is_some()
        };
        // Committed even when nothing was removed: cheap, and it keeps one path.
        txn.commit().map_err(storage_error)?;
        tracing::debug!(key, existed, "object deleted");
        Ok(existed)
    }
    /// Up to `limit` keys starting with `prefix`, in key order.
    pub fn list(&self, prefix: &str, limit: usize) -> Result<Vec<ObjectMeta>, ObjectError> {
        let mut listed = Vec::new();
        if limit == 0 {
            return Ok(listed);
        }
        let txn = self.db.begin_read().map_err(storage_error)?;
        let table = match txn.open_table(OBJECTS) {
            Ok(table) => table,
            Err(TableError::TableDoesNotExist(_)) => return Ok(listed),
            Err(err) => return Err(storage_error(err)),
        };
        // Keys sharing a prefix are contiguous in key order and start at the prefix
        // itself, so the scan starts there and stops at the first key without it.
        for row in table.range(prefix..).map_err(storage_error)? {
            let (key, stored) = row.map_err(storage_error)?;
            let key = key.value();
            if !key.starts_with(prefix) {
                break;
            }
            let (token, revision, body) = stored.value();
            listed.push(ObjectMeta {
                key: key.to_owned(),
                token,
                revision,
                size: u64::try_from(body.len()).unwrap_or(u64::MAX),
            });
            if listed.len() >= limit {
                break;
            }
        }
        Ok(listed)
    }

    fn begin_durable_write(&self) -> Result<redb::WriteTransaction, ObjectError> {
        let mut txn = self.db.begin_write().map_err(storage_error)?;
        txn.set_durability(Durability::Immediate)
            .map_err(storage_error)?;
        Ok(txn)
    }
}

/// Renders a redb error.
fn storage_error(err: impl std::fmt::Display) -> ObjectError {
    ObjectError::Storage(err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::open_database;

    fn store(dir: &tempfile::TempDir, object_bytes_max: u64) -> ObjectStore {
        let db = open_database(&dir.path().join("objects.redb")).unwrap();
        ObjectStore::open(db, object_bytes_max).unwrap()
    }

    /// Goal: a stored object reads back with its body and the token of its write, and an
    /// overwrite replaces both. Method: put, get, put again, get.
    #[test]
    fn put_then_get_returns_body_and_token() {
        let dir = tempfile::tempdir().unwrap();
        let objects = store(&dir, OBJECT_BYTES_MAX_DEFAULT);
        assert_eq!(objects.get("k").unwrap(), None);
        assert_eq!(objects.put("k", 7, b"hello").unwrap(), 1);
        assert_eq!(
            objects.get("k").unwrap(),
            Some(Object {
                token: 7,
                revision: 1,
                body: b"hello".to_vec()
            })
        );
        assert_eq!(objects.put("k", 8, b"").unwrap(), 2);
        assert_eq!(
            objects.get("k").unwrap(),
            Some(Object {
                token: 8,
                revision: 2,
                body: Vec::new()
            })
        );
    }

    /// Goal: delete removes the object and reports whether it existed.
    /// Method: delete a present key twice, then read it.
    #[test]
    fn delete_reports_whether_the_key_existed() {
        let dir = tempfile::tempdir().unwrap();
        let objects = store(&dir, OBJECT_BYTES_MAX_DEFAULT);
        objects.put("k", 1, b"x").unwrap();
        assert!(objects.delete("k").unwrap());
        assert!(!objects.delete("k").unwrap());
        assert_eq!(objects.get("k").unwrap(), None);
    }

    /// Goal: bodies over the bound are refused and nothing is stored; a body exactly at
    /// the bound is accepted. Method: bound 4, put 5 bytes, then 4 bytes.
    #[test]
    fn body_over_limit_is_refused_and_not_stored() {
        let dir = tempfile::tempdir().unwrap();
        let objects = store(&dir, 4);
        assert_eq!(objects.object_bytes_max(), 4);
        let err = objects.put("big", 1, b"12345").unwrap_err();
        assert!(
            matches!(err, ObjectError::TooLarge { ref key, size: 5, max: 4 } if key == "big"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "object big is 5 bytes, over the limit of 4 bytes"
        );
        assert_eq!(objects.get("big").unwrap(), None);
        objects.put("big", 1, b"1234").unwrap();
        assert_eq!(objects.get("big").unwrap().unwrap().body, b"1234");
    }

    /// Goal: listing returns only keys with the prefix, in key order, with token and size,
    /// and at most `limit` of them. Method: keys around the prefix boundary on both sides.
    #[test]
    fn list_returns_prefixed_keys_in_order_up_to_limit() {
        let dir = tempfile::tempdir().unwrap();
        let objects = store(&dir, OBJECT_BYTES_MAX_DEFAULT);
        for (key, token, body) in [
            ("a/2", 2, &b"bb"[..]),
            ("a", 9, b"no"),
            ("a/1", 1, b"a"),
            ("a/3", 3, b"ccc"),
            ("a0", 9, b"no"),
            ("b/1", 9, b"no"),
            ("0", 9, b"no"),
        ] {
            objects.put(key, token, body).unwrap();
        }
        // Revisions follow the order of the puts above: a/2 was first, 0 was seventh.
        let meta = |key: &str, token, revision, size| ObjectMeta {
            key: key.to_owned(),
            token,
            revision,
            size,
        };
        assert_eq!(
            objects.list("a/", 100).unwrap(),
            vec![
                meta("a/1", 1, 3, 1),
                meta("a/2", 2, 1, 2),
                meta("a/3", 3, 4, 3)
            ]
        );
        assert_eq!(
            objects.list("a/", 2).unwrap(),
            vec![meta("a/1", 1, 3, 1), meta("a/2", 2, 1, 2)]
        );
        assert!(objects.list("a/", 0).unwrap().is_empty());
        assert!(objects.list("c", 100).unwrap().is_empty());
        assert_eq!(objects.list("", 100).unwrap().len(), 7);
        assert_eq!(objects.list("", 3).unwrap()[0], meta("0", 9, 7, 2));
    }

    /// Goal: acknowledged puts and deletes are on disk. Method: write, delete, drop every
    /// handle, reopen the file and read.
    #[test]
    fn objects_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let objects = store(&dir, OBJECT_BYTES_MAX_DEFAULT);
            objects.put("kept", 5, b"body").unwrap();
            objects.put("gone", 6, b"body").unwrap();
            objects.delete("gone").unwrap();
        }
        let objects = store(&dir, OBJECT_BYTES_MAX_DEFAULT);
        assert_eq!(
            objects.get("kept").unwrap(),
            Some(Object {
                token: 5,
                revision: 1,
                body: b"body".to_vec()
            })
        );
        assert_eq!(objects.get("gone").unwrap(), None);
        assert_eq!(
            objects.put("next", 7, b"").unwrap(),
            3,
            "the revision counter survives reopening; deletes do not reuse revisions"
        );
    }

    /// Goal: a file without the object table reads as empty and the first put creates it.
    /// Method: a bare `redb::Database`, not `open_database`.
    #[test]
    fn store_without_object_table_reads_empty() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(redb::Database::create(dir.path().join("bare.redb")).unwrap());
        let objects = ObjectStore::open(db, OBJECT_BYTES_MAX_DEFAULT).unwrap();
        assert_eq!(objects.get("k").unwrap(), None);
        assert!(objects.list("", 10).unwrap().is_empty());
        objects.put("k", 1, b"v").unwrap();
        assert_eq!(objects.list("", 10).unwrap().len(), 1);
    }
}
