//! Opening a database file, and refusing one that was lost.
//!
//! A fence register or a raft log that silently starts empty is the one failure fencing
//! cannot survive: a proxy whose `proxy.redb` is gone would admit any token again, and a
//! node whose `raft.redb` is gone could vote twice in a term. So a database is created
//! only once, at first start, and a marker file beside it ([`MARKER_SUFFIX`]) records that
//! it exists. From then on a missing, empty or unreadable file is an error
//! ([`OpenError::Lost`], [`OpenError::Damaged`]) with the recovery steps, never a fresh
//! start. Removing the marker is the explicit act that allows a new, empty database.

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
    /// The database existed (its marker says so) but is now missing or empty: starting
    /// with a new one would forget every fence or vote it held.
    #[error(
        "database {path} is {what}, but {marker} shows that it existed: refusing to start \
         with a new, empty one, which would forget what it held. Restore the file from a \
         backup; or, knowing what is lost (see the recovery steps in the docs), remove \
         {marker} to start with an empty database"
    )]
    Lost {
        /// The database file.
        path: PathBuf,
        /// The marker file that shows it existed.
        marker: PathBuf,
        /// What is wrong with it: "missing" or "empty (0 bytes)".
        what: &'static str,
    },
    /// The file is there but redb cannot read it (damaged or not a database).
    #[error(
        "database {path} is damaged or not a Palisade database ({detail}): refusing to \
         start. Restore it from a backup; starting over needs the file and {marker} removed, \
         and forgets what it held"
    )]
    Damaged {
        /// The database file.
        path: PathBuf,
        /// The marker file beside it.
        marker: PathBuf,
        /// What redb reported.
        detail: String,
    },
    /// The marker beside a new database could not be written.
    #[error("cannot write {path}: {source}")]
    Marker {
        /// The marker file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// The marker written beside a database at its creation: `proxy.redb` has
/// `proxy.redb.created`. Its presence means "this database existed": a missing or empty
/// database is then an error, not a fresh start.
pub const MARKER_SUFFIX: &str = ".created";

/// The second marker, written once the database holds state that must never be lost
/// (a raft log with a configuration): `raft.redb.holds-state`. A database that opens
/// but reads back as empty while this marker exists was reset by damage (redb may fall
/// back to an older, empty commit when the newest one is unreadable).
pub const STATE_MARKER_SUFFIX: &str = ".holds-state";

/// Checks the database at `path` against its state marker: `holds_state` says whether
/// what was read from it holds state. With state, the marker is written (durably) if it
/// is missing; without state while the marker exists, [`OpenError::Lost`]: the file
/// opened but lost what it held.
pub fn check_holds_state(path: &Path, holds_state: bool) -> Result<(), OpenError> {
    let mut name = path.as_os_str().to_owned();
    name.push(STATE_MARKER_SUFFIX);
    let marker = PathBuf::from(name);
    match (holds_state, marker.exists()) {
        (true, false) => write_marker(&marker, path.parent().filter(|d| !d.as_os_str().is_empty())),
        (false, true) => Err(OpenError::Lost {
            path: path.to_path_buf(),
            marker,
            what: "without the state it held (damaged, or replaced by an empty one)",
        }),
        _ => Ok(()),
    }
}

/// The highest raft term a log has held, kept in a small file beside it
/// (`raft.redb.term`). redb keeps two commit slots and falls back to the older one when
/// the newest cannot be read, so a damaged `raft.redb` can open as an *older* log with a
/// lower term: a node that started from it could vote, or lead, twice in one term. The
/// record catches that: a log whose term is below the recorded one is [`OpenError::Lost`].
/// It is written after the log's own commit, so a crash between the two leaves the
/// record behind the log, never ahead of it.
#[derive(Debug)]
pub struct TermRecord {
    path: PathBuf,
    term: u64,
}

/// The suffix of the term record's file.
pub const TERM_RECORD_SUFFIX: &str = ".term";

impl TermRecord {
    /// Reads the record beside the database at `db` (0 when there is none yet).
    pub fn open(db: &Path) -> Result<Self, OpenError> {
        let mut name = db.as_os_str().to_owned();
        name.push(TERM_RECORD_SUFFIX);
        let path = PathBuf::from(name);
        let term = match std::fs::read_to_string(&path) {
            Ok(text) => text.trim().parse().map_err(|_| OpenError::Damaged {
                path: path.clone(),
                marker: marker_path(db),
                detail: format!("the term record holds {:?}, not a number", text.trim()),
            })?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => 0,
            Err(source) => return Err(OpenError::Marker { path, source }),
        };
        Ok(Self { path, term })
    }

    /// Checks that the log at `db`, whose stored term is `stored`, is not behind the record.
    pub fn check(&self, db: &Path, stored: u64) -> Result<(), OpenError> {
        if stored < self.term {
            return Err(OpenError::Lost {
                path: db.to_path_buf(),
                marker: self.path.clone(),
                what: "behind the raft term it reached (damaged: an older commit was read back)",
            });
        }
        Ok(())
    }

    /// Records `term` durably when it is above the recorded one (written to a temporary
    /// file, fsynced, renamed over the record, the directory fsynced).
    pub fn record(&mut self, term: u64) -> std::io::Result<()> {
        use std::io::Write as _;
        if term <= self.term {
            return Ok(());
        }
        let tmp = self.path.with_extension("term.tmp");
        let mut file = std::fs::File::create(&tmp)?;
        writeln!(file, "{term}")?;
        file.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        self.term = term;
        Ok(())
    }
}

/// The marker file of the database at `path`.
pub fn marker_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(MARKER_SUFFIX);
    PathBuf::from(name)
}

/// Opens the redb file at `path`, creating it (with its parent directory and its marker)
/// only if it never existed.
///
/// - No file and no marker: a first start. The file is created, then the marker
///   (fsynced, with its directory), so that from then on the file's loss is noticed.
/// - A marker, and the file missing or 0 bytes: [`OpenError::Lost`].
/// - A 0-byte file without a marker: also [`OpenError::Lost`]; redb never leaves one, so
///   it is a truncated database whose marker was lost too, or a file made by hand.
/// - A file redb cannot read (or panics on): [`OpenError::Damaged`], never a panic.
/// - A readable file without a marker (made by a version without markers): opened, and
///   the marker written.
///
/// The fence and object tables are created here, in one write transaction, when the file
/// lacks them, so that later read transactions never meet a missing table. A file left
/// behind by a killed process is repaired by redb before this returns.
pub fn open_database(path: &Path) -> Result<Arc<redb::Database>, OpenError> {
    // `Path::parent` is `Some("")` for a bare file name; there is nothing to create then.
    let dir = path.parent().filter(|dir| !dir.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).map_err(|source| OpenError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let marker = marker_path(path);
    let had_marker = marker.exists();
    let lost = |what| OpenError::Lost {
        path: path.to_path_buf(),
        marker: marker.clone(),
        what,
    };
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() && meta.len() == 0 => return Err(lost("empty (0 bytes)")),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound && had_marker => {
            return Err(lost("missing"));
        }
        _ => {}
    }
    let db = without_panics(path, &marker, || {
        let db = redb::Database::create(path).map_err(|source| OpenError::Database {
            path: path.to_path_buf(),
            source,
        })?;
        create_tables(&db)?;
        Ok(db)
    })?;
    if !had_marker {
        write_marker(&marker, dir)?;
    }
    Ok(Arc::new(db))
}

/// Runs `open`, turning a panic inside redb (which it may raise on a file damaged
/// mid-way, where its checks expected an invariant to hold) into [`OpenError::Damaged`].
/// A storage or corruption error redb reports is `Damaged` too.
pub fn without_panics<T>(
    path: &Path,
    marker: &Path,
    open: impl FnOnce() -> Result<T, OpenError>,
) -> Result<T, OpenError> {
    let damaged = |detail: String| OpenError::Damaged {
        path: path.to_path_buf(),
        marker: marker.to_path_buf(),
        detail,
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(open)) {
        Ok(Err(OpenError::Database {
            source: redb::DatabaseError::Storage(err),
            ..
        })) if is_damage(&err) => Err(damaged(err.to_string())),
        Ok(Err(OpenError::Load(detail))) => Err(damaged(detail)),
        Ok(result) => result,
        Err(panic) => Err(damaged(format!(
            "redb panicked while reading it: {}",
            panic_detail(panic.as_ref())
        ))),
    }
}

/// The message of a caught panic (its `&str` or `String` payload), or "" when it has none.
pub(crate) fn panic_detail(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// Whether redb's error says the file's contents are wrong (rather than, say, that the
/// disk or the permissions failed): corruption, or bytes that are not a redb file.
fn is_damage(err: &redb::StorageError) -> bool {
    match err {
        redb::StorageError::Corrupted(_) => true,
        redb::StorageError::Io(io) => io.kind() == std::io::ErrorKind::InvalidData,
        _ => false,
    }
}

/// Writes the marker of a database that now exists, durably: the file's contents and its
/// directory entry are fsynced, so a crash right after leaves either no marker (and a
/// database, which the next start opens and marks) or both.
fn write_marker(marker: &Path, dir: Option<&Path>) -> Result<(), OpenError> {
    use std::io::Write as _;
    let error = |source| OpenError::Marker {
        path: marker.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::create(marker).map_err(error)?;
    file.write_all(
        b"This file shows that the database beside it exists. Palisade refuses to start \
          when the database is then missing or empty. Remove this file only to start over \
          with an empty database, knowing what that forgets.\n",
    )
    .map_err(error)?;
    file.sync_all().map_err(error)?;
    let dir = dir.unwrap_or_else(|| Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(error)
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

    /// Goal: a database that existed and was then truncated to 0 bytes, or removed, is
    /// refused with [`OpenError::Lost`] naming the marker, and never reopened as a new one;
    /// removing the marker (the explicit act) lets a new one be created. Method: create,
    /// truncate, open; remove, open; remove the marker, open.
    #[test]
    fn lost_database_is_refused_until_its_marker_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.redb");
        drop(open_database(&path).unwrap());
        assert!(
            marker_path(&path).exists(),
            "the first start writes the marker"
        );

        std::fs::File::create(&path).unwrap(); // truncate to 0 bytes
        let err = open_database(&path).unwrap_err();
        assert!(
            matches!(
                err,
                OpenError::Lost {
                    what: "empty (0 bytes)",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("proxy.redb.created"), "{err}");
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            0,
            "nothing was created"
        );

        std::fs::remove_file(&path).unwrap();
        let err = open_database(&path).unwrap_err();
        assert!(
            matches!(
                err,
                OpenError::Lost {
                    what: "missing",
                    ..
                }
            ),
            "{err}"
        );
        assert!(!path.exists(), "nothing was created");

        std::fs::remove_file(marker_path(&path)).unwrap();
        drop(open_database(&path).unwrap());
        assert!(marker_path(&path).exists());
    }

    /// Goal: the term record only grows, survives a reopen, and refuses a log whose term is
    /// behind it (an older commit read back), naming the record; a record that is not a
    /// number is `Damaged`. Method: record 3, 7, 5; reopen; check 6 and 7; garble it.
    #[test]
    fn term_record_refuses_a_log_behind_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("raft.redb");
        let mut record = TermRecord::open(&db).unwrap();
        record.check(&db, 0).unwrap();
        for term in [3, 7, 5] {
            record.record(term).unwrap();
        }
        let record = TermRecord::open(&db).unwrap();
        record.check(&db, 7).unwrap();
        let err = record.check(&db, 6).unwrap_err();
        assert!(matches!(err, OpenError::Lost { .. }), "{err}");
        assert!(err.to_string().contains("raft.redb.term"), "{err}");
        std::fs::write(dir.path().join("raft.redb.term"), "seven").unwrap();
        let err = TermRecord::open(&db).unwrap_err();
        assert!(matches!(err, OpenError::Damaged { .. }), "{err}");
    }

    /// Goal: a 0-byte file with no marker is refused too (redb never leaves one).
    #[test]
    fn empty_file_without_a_marker_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.redb");
        std::fs::File::create(&path).unwrap();
        let err = open_database(&path).unwrap_err();
        assert!(matches!(err, OpenError::Lost { .. }), "{err}");
    }

    /// Goal: a database zeroed in the middle is a clear [`OpenError::Damaged`] (or, where
    /// redb still reads it, opens), never a panic out of `open_database`; a file of
    /// garbage is `Damaged`. Method: fill a database, zero its second half, open; then
    /// write random bytes over a whole file, open.
    #[test]
    fn damaged_database_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.redb");
        {
            let db = open_database(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut table = txn.open_table(OBJECTS).unwrap();
                for i in 0..2_000u32 {
                    table
                        .insert(
                            format!("key-{i}").as_str(),
                            (1, u64::from(i), vec![7u8; 512].as_slice()),
                        )
                        .unwrap();
                }
            }
            txn.commit().unwrap();
        }
        let len = std::fs::metadata(&path).unwrap().len();
        let mut bytes = std::fs::read(&path).unwrap();
        for b in &mut bytes[(len / 2) as usize..] {
            *b = 0;
        }
        std::fs::write(&path, &bytes).unwrap();
        match open_database(&path) {
            Ok(_) | Err(OpenError::Damaged { .. }) => {}
            Err(other) => panic!("expected Damaged, got {other}"),
        }

        let garbage: Vec<u8> = (0..65_536u32)
            .map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes()[1])
            .collect();
        std::fs::write(&path, garbage).unwrap();
        let err = open_database(&path).unwrap_err();
        assert!(matches!(err, OpenError::Damaged { .. }), "{err}");
        assert!(err.to_string().contains("damaged"), "{err}");
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
