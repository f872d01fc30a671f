//! The audit log's writer, shared by the proxy and the node: a bounded queue in front of
//! a thread of its own that appends one JSON line per [`AuditRecord`] and rotates the
//! file by size (the format and the rotation rule: [`palisade_protocol::audit`]).
//!
//! Recording never blocks and never waits for the disk: the data path's caller puts the
//! record on the queue if there is room, and otherwise counts it as dropped. The writer
//! writes an [`event::DROPPED`] record with the count before the next record it writes,
//! so the gap shows in the file too. Lines are flushed whenever the queue runs empty, not
//! fsynced: the audit trail records what happened for people, and fencing never depends
//! on it.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use tokio::sync::mpsc;

use palisade_protocol::audit::{AuditRecord, event, rotated_path};

/// Records that may wait for the writer. At a few hundred bytes each this is at most a
/// few MiB; a burst larger than this (a flood of stale writes on a slow disk) is counted
/// and dropped rather than held in memory or allowed to slow the data path.
pub const AUDIT_QUEUE_MAX: usize = 8192;

/// Where and how an audit log is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// The file.
    pub path: PathBuf,
    /// Rotate when the next line would take the file over this size.
    pub bytes_max: u64,
    /// Rotated files kept besides the current one.
    pub keep: u32,
}

/// The writer's counters, shared with whoever shows them.
#[derive(Debug, Default)]
struct Counters {
    queued: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
}

/// A handle to an audit log: cheap to clone; the writer thread ends when the last handle
/// is dropped, after writing what is queued.
#[derive(Debug, Clone)]
pub struct AuditLog {
    tx: mpsc::Sender<AuditRecord>,
    counters: Arc<Counters>,
    path: PathBuf,
}

impl AuditLog {
    /// Opens (creating or appending to) the file and starts the writer thread. Fails when
    /// the file cannot be opened, so a bad path stops the process at start rather than
    /// losing the trail silently.
    pub fn open(config: &AuditConfig) -> std::io::Result<Self> {
        let (log, writer, rx) = Self::unstarted(config, AUDIT_QUEUE_MAX)?;
        std::thread::Builder::new()
            .name("audit-log".to_owned())
            .spawn(move || writer.run(rx))?;
        Ok(log)
    }

    /// The log, its writer and the writer's queue of `capacity`, before the writer runs.
    fn unstarted(
        config: &AuditConfig,
        capacity: usize,
    ) -> std::io::Result<(Self, Writer, mpsc::Receiver<AuditRecord>)> {
        let file = open_append(&config.path)?;
        let size = file.metadata()?.len();
        let (tx, rx) = mpsc::channel(capacity);
        let counters = Arc::new(Counters::default());
        let writer = Writer {
            config: config.clone(),
            out: BufWriter::new(file),
            size,
            counters: Arc::clone(&counters),
            dropped_seen: 0,
        };
        let log = Self {
            tx,
            counters,
            path: config.path.clone(),
        };
        Ok((log, writer, rx))
    }

    /// Queues `record` for writing, or counts it as dropped when the queue is full.
    /// Never blocks.
    pub fn record(&self, record: AuditRecord) {
        match self.tx.try_send(record) {
            Ok(()) => {
                self.counters.queued.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The file written to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records queued since start.
    pub fn queued(&self) -> u64 {
        self.counters.queued.load(Ordering::Relaxed)
    }

    /// Records dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.counters.dropped.load(Ordering::Relaxed)
    }

    /// Records the writer could not write (an I/O error, logged).
    pub fn failed(&self) -> u64 {
        self.counters.failed.load(Ordering::Relaxed)
    }

    /// The counters in the status pages' form.
    pub fn status(&self) -> palisade_protocol::status::AuditStatus {
        palisade_protocol::status::AuditStatus {
            path: self.path.display().to_string(),
            queued: self.queued(),
            dropped: self.dropped(),
            failed: self.failed(),
        }
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

struct Writer {
    config: AuditConfig,
    out: BufWriter<File>,
    /// Bytes in the current file.
    size: u64,
    counters: Arc<Counters>,
    /// The dropped count already reported in the file.
    dropped_seen: u64,
}

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<AuditRecord>) {
        while let Some(record) = rx.blocking_recv() {
            self.note_drops();
            self.write(&record);
            // Flush once the queue is empty: a burst is written in large blocks, and a
            // quiet log is on disk (in the page cache) as soon as it is written.
            if rx.is_empty()
                && let Err(err) = self.out.flush()
            {
                tracing::warn!(path = %self.config.path.display(), cause = %err, "audit log flush failed");
            }
        }
        self.note_drops();
        let _ = self.out.flush();
    }

    /// Writes a `dropped` record when records were dropped since the last one.
    fn note_drops(&mut self) {
        let dropped = self.counters.dropped.load(Ordering::Relaxed);
        if dropped > self.dropped_seen {
            let mut record = AuditRecord::new(event::DROPPED, SystemTime::now());
            record.dropped = Some(dropped - self.dropped_seen);
            record.reason = Some(format!(
                "the audit queue ({AUDIT_QUEUE_MAX} records) was full"
            ));
            self.dropped_seen = dropped;
            self.write(&record);
        }
    }

    fn write(&mut self, record: &AuditRecord) {
        let mut line = match serde_json::to_vec(record) {
            Ok(line) => line,
            Err(err) => {
                self.fail(&err);
                return;
            }
        };
        line.push(b'\n');
        let len = line.len() as u64;
        if self.size > 0
            && self.size + len > self.config.bytes_max
            && let Err(err) = self.rotate()
        {
            self.fail(&err);
        }
        match self.out.write_all(&line) {
            Ok(()) => self.size += len,
            Err(err) => self.fail(&err),
        }
    }

    /// `FILE.(keep-1)` to `FILE.keep`, ..., `FILE` to `FILE.1`, then a new `FILE`. With
    /// `keep` = 0 the current file is truncated instead.
    fn rotate(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        let path = &self.config.path;
        let keep = self.config.keep;
        if keep > 0 {
            // The oldest beyond `keep` goes; a missing one is fine (not yet rotated).
            let _ = std::fs::remove_file(rotated_path(path, keep));
            for n in (0..keep).rev() {
                let from = rotated_path(path, n);
                if from.exists() {
                    std::fs::rename(&from, rotated_path(path, n + 1))?;
                }
            }
        } else {
            std::fs::remove_file(path)?;
        }
        self.out = BufWriter::new(open_append(path)?);
        self.size = 0;
        Ok(())
    }

    fn fail(&self, err: &dyn std::fmt::Display) {
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(path = %self.config.path.display(), cause = %err, "audit record not written");
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant, UNIX_EPOCH};

    use super::*;

    fn lines(path: &Path) -> Vec<AuditRecord> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Goal: the log rotates at its size limit, keeps `keep` old files, and loses no
    /// record that fits: reading the rotated files oldest first gives every record in
    /// order. Method: write 40 records of about 72 bytes with a 1 KiB limit and keep 20,
    /// wait for the writer to finish, read `FILE.N` .. `FILE`.
    #[test]
    fn rotates_at_the_size_limit_and_keeps_every_record_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let config = AuditConfig {
            path: path.clone(),
            bytes_max: 1024,
            keep: 20,
        };
        let log = AuditLog::open(&config).unwrap();
        for i in 0..40u64 {
            let mut r = AuditRecord::new(event::REJECTION, UNIX_EPOCH);
            r.presented = Some(i);
            log.record(r);
        }
        let queued = log.queued();
        drop(log);
        let deadline = Instant::now() + Duration::from_secs(10);
        let read_all = || {
            let mut all = Vec::new();
            for n in (0..=config.keep).rev() {
                all.extend(lines(&rotated_path(&path, n)));
            }
            all
        };
        while read_all().len() < 40 {
            assert!(
                Instant::now() < deadline,
                "writer did not finish: {:?}",
                read_all().len()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(queued, 40);
        let all = read_all();
        let tokens: Vec<u64> = all.iter().filter_map(|r| r.presented).collect();
        assert_eq!(tokens, (0..40).collect::<Vec<_>>());
        assert!(
            rotated_path(&path, 2).exists(),
            "fewer than two rotations (2.8 KiB at 1 KiB each)"
        );
        for n in 0..=config.keep {
            let p = rotated_path(&path, n);
            if let Ok(meta) = std::fs::metadata(&p) {
                assert!(
                    meta.len() <= 1024,
                    "{} is {} bytes",
                    p.display(),
                    meta.len()
                );
            }
        }
    }

    /// Goal: with `keep` = 1 only one old file is kept; the oldest records go.
    /// Method: write enough for several rotations, check `FILE.2` never exists.
    #[test]
    fn rotation_deletes_files_beyond_keep() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let config = AuditConfig {
            path: path.clone(),
            bytes_max: 300,
            keep: 1,
        };
        let log = AuditLog::open(&config).unwrap();
        for i in 0..30u64 {
            let mut r = AuditRecord::new(event::RAISE, UNIX_EPOCH);
            r.presented = Some(i);
            log.record(r);
        }
        drop(log);
        let deadline = Instant::now() + Duration::from_secs(10);
        while lines(&path).last().and_then(|r| r.presented) != Some(29) {
            assert!(Instant::now() < deadline, "writer did not finish");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(rotated_path(&path, 1).exists());
        assert!(!rotated_path(&path, 2).exists());
    }

    /// Goal: recording never blocks: with the writer's queue full a record is counted as
    /// dropped, and the file then says so with a `dropped` record (and its count) before
    /// the next record written. Method: a queue of 2 whose writer has not started; record
    /// 5; start the writer; read the file.
    #[test]
    fn a_full_queue_drops_counts_and_says_so_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let config = AuditConfig {
            path: path.clone(),
            bytes_max: 1 << 20,
            keep: 1,
        };
        let (log, writer, rx) = AuditLog::unstarted(&config, 2).unwrap();
        for i in 0..5u64 {
            let mut r = AuditRecord::new(event::REJECTION, UNIX_EPOCH);
            r.presented = Some(i);
            log.record(r);
        }
        assert_eq!((log.queued(), log.dropped()), (2, 3));
        drop(log);
        writer.run(rx);
        let records = lines(&path);
        let summary: Vec<(&str, Option<u64>, Option<u64>)> = records
            .iter()
            .map(|r| (r.event.as_str(), r.presented, r.dropped))
            .collect();
        assert_eq!(
            summary,
            [
                (event::DROPPED, None, Some(3)),
                (event::REJECTION, Some(0), None),
                (event::REJECTION, Some(1), None),
            ]
        );
    }
}
