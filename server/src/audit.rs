//! The audit log's writer, shared by the proxy and the node: a bounded queue in front of
//! a thread of its own that appends one JSON line per [`AuditRecord`] and rotates the
//! files by size (the format and the rotation rule: [`palisade_protocol::audit`]).
//!
//! Two files, two budgets. Security records (stale-token rejections, raises, resets,
//! announces, transfers, membership changes, role refusals) go to `FILE`. Noise, the
//! records any client can cause without holding a token (a proxy's refusals of a missing
//! or invalid proof; a node's API refuses roles only to holders of a certificate of the
//! cluster CA, so it writes none), goes to `FILE.noise` ([`noise_path`]), rotated on its
//! own under the same size limit and count.
//! Noise is also rate-limited before it is built ([`NoiseLimiter`]): at most
//! [`AUDIT_NOISE_PER_SECOND_MAX`] records of a kind a second are written in full, the
//! rest counted and summarised by one [`event::SUPPRESSED`] record per kind and
//! [`AUDIT_SUMMARY_INTERVAL_MS`]. So a flood of noise can neither rotate a security record
//! out of `FILE` nor, by filling the queue, have one dropped: the queue takes at most a
//! few dozen noise records a second.
//!
//! Recording never blocks and never waits for the disk: the caller puts the record on the
//! queue if there is room, and otherwise counts it as dropped. The writer writes an
//! [`event::DROPPED`] record with the count (to `FILE`) before the next record it writes,
//! so the gap shows in the file too. Lines are flushed whenever the queue runs empty, not
//! fsynced: the audit trail records what happened for people, and fencing never depends
//! on it.

mod noise;

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant, SystemTime};

use palisade_protocol::audit::{AuditRecord, event, noise_path, rotated_path};

pub use noise::{AUDIT_NOISE_KINDS_MAX, AUDIT_NOISE_PER_SECOND_MAX, NoiseLimiter, OTHER_KIND};

/// Records that may wait for the writer. At a few hundred bytes each this is at most a
/// few MiB; a burst larger than this (a flood of stale writes on a slow disk) is counted
/// and dropped rather than held in memory or allowed to slow the data path.
pub const AUDIT_QUEUE_MAX: usize = 8192;
/// How often the writer turns the counts of suppressed noise into `suppressed` records:
/// at most one per kind this often, so a flood that never stops adds one line a second
/// per kind, and the count of a flood that stopped is on disk within this time.
pub const AUDIT_SUMMARY_INTERVAL_MS: u64 = 1_000;

/// Where and how an audit log is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// The file of security records; noise goes to [`noise_path`] of it.
    pub path: PathBuf,
    /// Rotate a file when the next line would take it over this size.
    pub bytes_max: u64,
    /// Rotated files kept besides the current one, for each of the two files.
    pub keep: u32,
}

/// What the queue carries: a record and its file.
type Queued = (Class, AuditRecord);

/// Which file, and which budget, a record goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Security,
    Noise,
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
    tx: SyncSender<Queued>,
    counters: Arc<Counters>,
    noise: Arc<NoiseLimiter>,
    path: PathBuf,
}

impl AuditLog {
    /// Opens (creating or appending to) the file and starts the writer thread. Fails when
    /// the file cannot be opened, so a bad path stops the process at start rather than
    /// losing the trail silently. The noise file is opened when the first noise record
    /// is written.
    pub fn open(config: &AuditConfig) -> std::io::Result<Self> {
        let (log, writer, rx) = Self::unstarted(config, AUDIT_QUEUE_MAX)?;
        std::thread::Builder::new()
            .name("audit-log".to_owned())
            .spawn(move || writer.run(&rx))?;
        Ok(log)
    }

    /// The log, its writer and the writer's queue of `capacity`, before the writer runs.
    fn unstarted(
        config: &AuditConfig,
        capacity: usize,
    ) -> std::io::Result<(Self, Writer, Receiver<Queued>)> {
        let security = Sink::open(config.path.clone())?;
        let (tx, rx) = std::sync::mpsc::sync_channel(capacity);
        let counters = Arc::new(Counters::default());
        let noise = Arc::new(NoiseLimiter::default());
        let writer = Writer {
            config: config.clone(),
            security,
            noise: Sink::unopened(noise_path(&config.path)),
            counters: Arc::clone(&counters),
            limiter: Arc::clone(&noise),
            dropped_seen: 0,
            summarised_at: Instant::now(),
        };
        let log = Self {
            tx,
            counters,
            noise,
            path: config.path.clone(),
        };
        Ok((log, writer, rx))
    }

    /// Queues a security record for writing, or counts it as dropped when the queue is
    /// full. Never blocks.
    pub fn record(&self, record: AuditRecord) {
        self.queue(Class::Security, record);
    }

    /// Queues a noise record for the noise file, or counts it as dropped. The caller
    /// asks [`NoiseLimiter::admit`] of [`AuditLog::noise`] first, and builds and records
    /// the record only when admitted. Never blocks.
    pub fn record_noise(&self, record: AuditRecord) {
        self.queue(Class::Noise, record);
    }

    fn queue(&self, class: Class, record: AuditRecord) {
        match self.tx.try_send((class, record)) {
            Ok(()) => {
                self.counters.queued.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The rate limit on this log's noise, whose refusals its writer summarises.
    pub fn noise(&self) -> &Arc<NoiseLimiter> {
        &self.noise
    }

    /// The file of security records.
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
            suppressed: self.noise.suppressed(),
        }
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// One of the two files and its rotations.
struct Sink {
    path: PathBuf,
    /// `None` until the first line (the noise file) or after a failed rotation.
    out: Option<BufWriter<File>>,
    /// Bytes in the current file.
    size: u64,
}

impl Sink {
    fn open(path: PathBuf) -> std::io::Result<Self> {
        let mut sink = Self::unopened(path);
        sink.reopen()?;
        Ok(sink)
    }

    fn unopened(path: PathBuf) -> Self {
        Self {
            path,
            out: None,
            size: 0,
        }
    }

    fn reopen(&mut self) -> std::io::Result<()> {
        let file = open_append(&self.path)?;
        self.size = file.metadata()?.len();
        self.out = Some(BufWriter::new(file));
        Ok(())
    }

    /// Appends `line`, rotating first when it would take the file over `bytes_max`.
    fn write(&mut self, line: &[u8], bytes_max: u64, keep: u32) -> std::io::Result<()> {
        if self.out.is_none() {
            self.reopen()?;
        }
        let len = line.len() as u64;
        if self.size > 0 && self.size + len > bytes_max {
            self.rotate(keep)?;
        }
        let Some(out) = &mut self.out else {
            return Err(std::io::Error::other("the audit file is not open"));
        };
        out.write_all(line)?;
        self.size += len;
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.out {
            Some(out) => out.flush(),
            None => Ok(()),
        }
    }

    /// `FILE.(keep-1)` to `FILE.keep`, ..., `FILE` to `FILE.1`, then a new `FILE`. With
    /// `keep` = 0 the current file is truncated instead.
    fn rotate(&mut self, keep: u32) -> std::io::Result<()> {
        self.flush()?;
        self.out = None;
        if keep > 0 {
            // The oldest beyond `keep` goes; a missing one is fine (not yet rotated).
            let _ = std::fs::remove_file(rotated_path(&self.path, keep));
            for n in (0..keep).rev() {
                let from = rotated_path(&self.path, n);
                if from.exists() {
                    std::fs::rename(&from, rotated_path(&self.path, n + 1))?;
                }
            }
        } else {
            std::fs::remove_file(&self.path)?;
        }
        self.reopen()
    }
}

struct Writer {
    config: AuditConfig,
    security: Sink,
    noise: Sink,
    counters: Arc<Counters>,
    limiter: Arc<NoiseLimiter>,
    /// The dropped count already reported in the file.
    dropped_seen: u64,
    /// When the suppressed counts were last written.
    summarised_at: Instant,
}

impl Writer {
    fn run(mut self, rx: &Receiver<Queued>) {
        let interval = Duration::from_millis(AUDIT_SUMMARY_INTERVAL_MS);
        loop {
            let wait = interval.saturating_sub(self.summarised_at.elapsed());
            match rx.recv_timeout(wait) {
                Ok((class, record)) => {
                    self.take(class, &record);
                    // Drain what is queued, then flush once: a burst is written in large
                    // blocks, and a quiet log is on disk (in the page cache) as soon as
                    // it is written.
                    while let Ok((class, record)) = rx.try_recv() {
                        self.take(class, &record);
                        self.summarise_when_due(interval);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.summarise_when_due(interval);
            self.flush();
        }
        self.note_drops();
        self.summarise();
        self.flush();
    }

    fn take(&mut self, class: Class, record: &AuditRecord) {
        self.note_drops();
        self.write(class, record);
    }

    fn flush(&mut self) {
        for sink in [&mut self.security, &mut self.noise] {
            if let Err(err) = sink.flush() {
                tracing::warn!(path = %sink.path.display(), cause = %err, "audit log flush failed");
            }
        }
    }

    fn summarise_when_due(&mut self, interval: Duration) {
        if self.summarised_at.elapsed() >= interval {
            self.summarise();
        }
    }

    /// Writes one `suppressed` record per kind of noise refused since the last time.
    fn summarise(&mut self) {
        self.summarised_at = Instant::now();
        for (kind, count) in self.limiter.take() {
            let mut record = AuditRecord::new(event::SUPPRESSED, SystemTime::now());
            record.reason = Some(kind.to_owned());
            record.dropped = Some(count);
            self.write(Class::Noise, &record);
        }
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
            self.write(Class::Security, &record);
        }
    }

    fn write(&mut self, class: Class, record: &AuditRecord) {
        let mut line = match serde_json::to_vec(record) {
            Ok(line) => line,
            Err(err) => {
                self.fail(&self.config.path, &err);
                return;
            }
        };
        line.push(b'\n');
        let sink = match class {
            Class::Security => &mut self.security,
            Class::Noise => &mut self.noise,
        };
        if let Err(err) = sink.write(&line, self.config.bytes_max, self.config.keep) {
            let path = sink.path.clone();
            self.fail(&path, &err);
        }
    }

    fn fail(&self, path: &Path, err: &dyn std::fmt::Display) {
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(path = %path.display(), cause = %err, "audit record not written");
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant, UNIX_EPOCH};

    use super::*;

    /// A log `audit.log` in `dir`.
    fn config_in(dir: &tempfile::TempDir, bytes_max: u64, keep: u32) -> AuditConfig {
        AuditConfig {
            path: dir.path().join("audit.log"),
            bytes_max,
            keep,
        }
    }

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
        let config = config_in(&dir, 1024, 20);
        let path = config.path.clone();
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
        let config = config_in(&dir, 300, 1);
        let path = config.path.clone();
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
        let config = config_in(&dir, 1 << 20, 1);
        let path = config.path.clone();
        let (log, writer, rx) = AuditLog::unstarted(&config, 2).unwrap();
        for i in 0..5u64 {
            let mut r = AuditRecord::new(event::REJECTION, UNIX_EPOCH);
            r.presented = Some(i);
            log.record(r);
        }
        assert_eq!((log.queued(), log.dropped()), (2, 3));
        drop(log);
        writer.run(&rx);
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

    /// Goal: noise goes to its own file and rotates there, so however much of it is
    /// written, the security record in `FILE` stays. Method: a 1 KiB limit with `keep`
    /// = 1; one security record, then 200 noise records (past the rate limit: written
    /// straight to the queue); read both files.
    #[test]
    fn noise_rotates_its_own_file_and_never_the_security_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = config_in(&dir, 1024, 1);
        let path = config.path.clone();
        let (log, writer, rx) = AuditLog::unstarted(&config, 1000).unwrap();
        let mut stale = AuditRecord::new(event::REJECTION, UNIX_EPOCH);
        stale.reason = Some("stale-token".to_owned());
        log.record(stale.clone());
        for i in 0..200u64 {
            let mut r = AuditRecord::new(event::REJECTION, UNIX_EPOCH);
            r.reason = Some("missing-proof".to_owned());
            r.presented = Some(i);
            log.record_noise(r);
        }
        drop(log);
        writer.run(&rx);
        assert_eq!(lines(&path), [stale]);
        let noise = noise_path(&path);
        let last = lines(&noise).last().and_then(|r| r.presented);
        assert_eq!(last, Some(199));
        assert!(rotated_path(&noise, 1).exists(), "the noise file rotated");
        assert!(!rotated_path(&noise, 2).exists());
        assert!(!rotated_path(&path, 1).exists(), "FILE never rotated");
    }

    /// Goal: past the rate limit, noise is counted, not written, and one `suppressed`
    /// record per kind says how many, so that the records written in full plus the
    /// counts add up to every record offered. Method: offer 100 records of one kind
    /// through the log's limiter; read the noise file.
    #[test]
    fn noise_past_the_rate_is_counted_in_a_suppressed_record() {
        let dir = tempfile::tempdir().unwrap();
        let config = config_in(&dir, 1 << 20, 1);
        let path = config.path.clone();
        let (log, writer, rx) = AuditLog::unstarted(&config, 1000).unwrap();
        for i in 0..100u64 {
            if log.noise().admit("missing-proof") {
                let mut r = AuditRecord::new(event::REJECTION, UNIX_EPOCH);
                r.presented = Some(i);
                log.record_noise(r);
            }
        }
        let suppressed = log.status().suppressed;
        assert!(
            suppressed >= 100 - 2 * AUDIT_NOISE_PER_SECOND_MAX,
            "{suppressed}"
        );
        drop(log);
        writer.run(&rx);
        let records = lines(&noise_path(&path));
        let full = records
            .iter()
            .filter(|r| r.event == event::REJECTION)
            .count() as u64;
        let summaries: Vec<&AuditRecord> = records
            .iter()
            .filter(|r| r.event == event::SUPPRESSED)
            .collect();
        assert_eq!(summaries.len(), 1, "{records:?}");
        assert_eq!(summaries[0].reason.as_deref(), Some("missing-proof"));
        assert_eq!(summaries[0].dropped, Some(suppressed));
        assert_eq!(full + suppressed, 100);
        assert!(lines(&path).is_empty());
    }
}
