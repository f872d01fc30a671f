//! Opening a database file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::tables::{FENCES, OBJECTS};

/// Why a database or a store in it could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The data directory could not be created.
    #[error("cannot create data directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// redb could not open or create the file.
    #[error("cannot open database {path}: {source}")]
    Database {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: redb::DatabaseError,
    },
    /// A transaction, table or storage error while loading state at start-up.
    #[error("cannot load state from the database: {0}")]
    Load(String),
}

/// Opens (creating if needed, with its parent directory) the redb file at `path`.
///
/// The fence and object tables are created here, in one write transaction, when the file
/// lacks them, so that later read transactions never meet a missing table. A file left
/// behind by a killed process is repaired by redb before this returns.
pub fn open_database(path: &Path) -> Result<Arc<redb::Database>, OpenError> {
    // `Path::parent` is `Some("")` for a bare file name; there is nothing to create then.
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| OpenError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let db = redb::Database::create(path).map_err(|source| OpenError::Database {
        path: path.to_path_buf(),
        source,
    })?;
    create_tables(&db)?;
    Ok(Arc::new(db))
}

/// Creates the tables the stores read, if absent, in one durable write transaction.
fn create_tables(db: &redb::Database) -> Result<(), OpenError> {
    let txn = db.begin_write().map_err(load_error)?;
    txn.open_table(FENCES).map_err(load_error)?;
    txn.open_table(OBJECTS).map_err(load_error)?;
    txn.commit().map_err(load_error)
}

/// Renders a redb error met while loading state at start-up.
pub(crate) fn load_error(err: impl std::fmt::Display) -> OpenError {
    OpenError::Load(err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{ReadableDatabase, ReadableTableMetadata};

    /// Goal: a fresh path in a missing directory opens, and both store tables can be read at
    /// once. Method: open under a nested path, then open each table in a read transaction.
    #[test]
    fn open_creates_directory_and_tables() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir
            .path()
            .join("nested")
            .join("deeper")
            .join("palisade.redb");
        let db = open_database(&path).unwrap();
        assert!(path.exists());
        let txn = db.begin_read().unwrap();
        assert_eq!(txn.open_table(FENCES).unwrap().len().unwrap(), 0);
        assert_eq!(txn.open_table(OBJECTS).unwrap().len().unwrap(), 0);
    }

    /// Goal: a directory where the file should be is reported as a database error naming
    /// the path. Method: open a path that is an existing directory.
    #[test]
    fn open_reports_path_of_unusable_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = open_database(dir.path()).unwrap_err();
        assert!(matches!(err, OpenError::Database { ref path, .. } if path == dir.path()));
        assert!(err.to_string().contains(&dir.path().display().to_string()));
    }
}
