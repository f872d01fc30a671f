//! Opening a database file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

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
pub fn open_database(path: &Path) -> Result<Arc<redb::Database>, OpenError> {
    let _ = path;
    todo!("helper S")
}
