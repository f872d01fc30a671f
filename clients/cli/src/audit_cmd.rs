//! `palisade audit FILE`: reads an audit log written with `--audit-log` (and its rotated
//! siblings `FILE.N` .. `FILE.1`, oldest first, so events come out in the order they were
//! written), and its noise file `FILE.noise` with its own rotated siblings, merged with
//! the first by time; filters them, and prints a table or JSON lines.

use std::fs::File;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use clap::Args;
use palisade_protocol::AuditRecord;
use palisade_protocol::audit::{noise_path, parse_rfc3339, rotated_path};

use crate::Failure;
use crate::client_cmds::{print_json, print_line};

/// Most rotated siblings looked for (`FILE.1` .. `FILE.N`): far above any `audit_log_keep`
/// worth setting, and a bound on the files one command opens.
pub(crate) const AUDIT_ROTATED_FILES_MAX: u32 = 1000;
/// Longest line read as a record, in bytes; a longer one is not one of ours and is
/// skipped with a warning (the writer's longest records are a few KiB).
pub(crate) const AUDIT_LINE_BYTES_MAX: usize = 64 * 1024;

/// Read an audit log (`--audit-log` of `palisade proxy` or `palisade node`), filtered.
#[derive(Args)]
pub(crate) struct AuditArgs {
    /// The audit log; its rotated siblings (FILE.1, FILE.2, ...) and its noise file
    /// (FILE.noise, FILE.noise.1, ...: missing or invalid proofs) are read too.
    file: PathBuf,
    /// Only events of this scope.
    #[arg(long)]
    scope: Option<String>,
    /// Only events involving this token (presented, current or previous fence, or the
    /// node's term).
    #[arg(long, value_name = "N")]
    token: Option<u64>,
    /// Only events of this kind (rejection, raise, reset, announce, membership,
    /// transfer, forbidden, dropped, suppressed).
    #[arg(long, value_name = "EVENT")]
    event: Option<String>,
    /// Only events at or after this time (RFC 3339, e.g. 2026-11-23T16:00:00Z).
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    since: Option<SystemTime>,
    /// Only events before this time (RFC 3339).
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    until: Option<SystemTime>,
    /// Print the matching records as JSON lines, as they are in the file.
    #[arg(long)]
    json: bool,
}

fn parse_time(text: &str) -> Result<SystemTime, String> {
    parse_rfc3339(text)
}

impl AuditArgs {
    fn keeps(&self, r: &AuditRecord) -> bool {
        if self
            .scope
            .as_ref()
            .is_some_and(|s| r.scope.as_ref() != Some(s))
        {
            return false;
        }
        if self.event.as_ref().is_some_and(|e| &r.event != e) {
            return false;
        }
        if let Some(t) = self.token
            && ![r.presented, r.current, r.previous, r.term].contains(&Some(t))
        {
            return false;
        }
        if self.since.is_some() || self.until.is_some() {
            // A record without a readable time cannot be placed in a window.
            let Some(at) = r.at() else { return false };
            if self.since.is_some_and(|since| at < since)
                || self.until.is_some_and(|until| at >= until)
            {
                return false;
            }
        }
        true
    }
}

/// The files of one chain, oldest first: `FILE.N` .. `FILE.1`, then `FILE` (when it
/// exists: a noise file is created by its first record).
fn files_of(path: &Path) -> Vec<PathBuf> {
    let mut rotated: Vec<PathBuf> = (1..=AUDIT_ROTATED_FILES_MAX)
        .map(|n| rotated_path(path, n))
        .take_while(|p| p.exists())
        .collect();
    rotated.reverse();
    if path.exists() {
        rotated.push(path.to_owned());
    }
    rotated
}

/// `palisade audit`.
pub(crate) fn run(args: &AuditArgs) -> Result<(), Failure> {
    if !args.file.exists() {
        return Err(Failure::Usage(format!(
            "{}: no such audit log (give the FILE of --audit-log)",
            args.file.display()
        )));
    }
    let (matched, skipped) = read(args)?;
    if args.json {
        for r in &matched {
            print_json(r)?;
        }
    } else {
        print_table(&matched)?;
    }
    if skipped > 0 {
        eprintln!("palisade audit: {skipped} lines were not audit records");
    }
    Ok(())
}

/// The records of the log and its noise file that pass the filters, oldest first, and
/// how many lines were not records (each named on stderr).
fn read(args: &AuditArgs) -> Result<(Vec<AuditRecord>, u64), Failure> {
    let (records, skipped) = read_chain(args, &args.file)?;
    let (noise, noise_skipped) = read_chain(args, &noise_path(&args.file))?;
    Ok((merge_by_time(records, noise), skipped + noise_skipped))
}

/// Two lists in the order they were written, merged by time: each keeps its own order,
/// and of equal times the first list's record comes first. Times are RFC 3339 in UTC of
/// one length, as the writer writes them, so they compare as text; a line with another
/// time still comes out, placed by its text.
fn merge_by_time(a: Vec<AuditRecord>, b: Vec<AuditRecord>) -> Vec<AuditRecord> {
    let mut merged = Vec::with_capacity(a.len() + b.len());
    let mut b = b.into_iter().peekable();
    for record in a {
        while let Some(next) = b.next_if(|n| n.time < record.time) {
            merged.push(next);
        }
        merged.push(record);
    }
    merged.extend(b);
    merged
}

/// The records of one chain of files ([`files_of`]) that pass the filters, oldest first,
/// and how many lines were not records.
fn read_chain(args: &AuditArgs, file: &Path) -> Result<(Vec<AuditRecord>, u64), Failure> {
    let mut matched = Vec::new();
    let mut skipped = 0u64;
    for path in files_of(file) {
        let file = File::open(&path)
            .map_err(|e| Failure::Runtime(format!("cannot read {}: {e}", path.display())))?;
        for (n, line) in BufReader::new(file).split(b'\n').enumerate() {
            let line =
                line.map_err(|e| Failure::Runtime(format!("cannot read {}: {e}", path.display())))?;
            if line.is_empty() {
                continue;
            }
            let record = if line.len() > AUDIT_LINE_BYTES_MAX {
                None
            } else {
                serde_json::from_slice::<AuditRecord>(&line).ok()
            };
            match record {
                Some(r) if args.keeps(&r) => matched.push(r),
                Some(_) => {}
                None => {
                    skipped += 1;
                    eprintln!(
                        "palisade audit: {}:{}: not an audit record; skipped",
                        path.display(),
                        n + 1
                    );
                }
            }
        }
    }
    Ok((matched, skipped))
}

fn print_table(records: &[AuditRecord]) -> Result<(), Failure> {
    print_line(&format!(
        "{:<24} {:<11} {:<16} {}",
        "TIME (UTC)", "EVENT", "SCOPE", "DETAILS"
    ))?;
    for r in records {
        let time = r.time.replace('T', " ").trim_end_matches('Z').to_owned();
        print_line(&format!(
            "{:<24} {:<11} {:<16} {}",
            time,
            r.event,
            r.scope.as_deref().unwrap_or("-"),
            details(r)
        ))?;
    }
    let n = records.len();
    print_line(&format!("{n} event{}", if n == 1 { "" } else { "s" }))
}

/// The record's other fields, `name=value`, in a fixed order.
fn details(r: &AuditRecord) -> String {
    let mut parts = Vec::new();
    let mut num = |name: &str, v: Option<u64>| {
        if let Some(v) = v {
            parts.push(format!("{name}={v}"));
        }
    };
    num("presented", r.presented);
    num("current", r.current);
    num("previous", r.previous);
    num("node", r.node_id);
    num("term", r.term);
    num("dropped", r.dropped);
    let mut text = |name: &str, v: &Option<String>| {
        if let Some(v) = v {
            // Control characters would let a client's path forge table lines.
            let clean: String = v
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect();
            parts.push(format!("{name}={clean}"));
        }
    };
    text("outcome", &r.outcome);
    text("peer", &r.peer);
    text("method", &r.method);
    text("path", &r.path);
    text("proxy", &r.proxy);
    text("reason", &r.reason);
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> AuditArgs {
        args_for("/tmp/none", extra)
    }

    fn args_for(file: &str, extra: &[&str]) -> AuditArgs {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: AuditArgs,
        }
        let mut argv = vec!["audit", file];
        argv.extend_from_slice(extra);
        Cli::parse_from(argv).a
    }

    fn record(time: &str, scope: &str, presented: u64) -> AuditRecord {
        AuditRecord {
            time: time.to_owned(),
            event: "rejection".to_owned(),
            scope: Some(scope.to_owned()),
            presented: Some(presented),
            current: Some(presented + 1),
            ..AuditRecord::default()
        }
    }

    /// Goal: each filter keeps exactly the records it names; the time window is
    /// [since, until). Method: filter a few records.
    #[test]
    fn filters_keep_what_they_name() {
        let a = record("2026-11-23T10:00:00.000Z", "jobs", 3);
        let b = record("2026-11-23T11:00:00.000Z", "other", 7);
        assert!(args(&["--scope", "jobs"]).keeps(&a));
        assert!(!args(&["--scope", "jobs"]).keeps(&b));
        assert!(args(&["--token", "4"]).keeps(&a), "current matches");
        assert!(!args(&["--token", "5"]).keeps(&a));
        assert!(!args(&["--since", "2026-11-23T10:30:00Z"]).keeps(&a));
        assert!(args(&["--since", "2026-11-23T10:30:00Z"]).keeps(&b));
        assert!(!args(&["--until", "2026-11-23T11:00:00Z"]).keeps(&b));
        assert!(args(&["--event", "rejection"]).keeps(&a));
        assert!(!args(&["--event", "raise"]).keeps(&a));
    }

    /// Goal: a path with a newline cannot forge a table line. Method: render details.
    #[test]
    fn control_characters_are_not_printed() {
        let mut r = record("2026-11-23T10:00:00.000Z", "jobs", 3);
        r.path = Some("/a\nforged".to_owned());
        assert!(!details(&r).contains('\n'));
    }

    /// Goal: lines that are not records (garbage, a truncated line, one over
    /// `AUDIT_LINE_BYTES_MAX`) are skipped and counted, and the records around them are
    /// read, the rotated file's first. Method: write `FILE.1` and `FILE` by hand, read.
    #[test]
    fn hostile_lines_are_skipped_and_rotated_files_come_first() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("audit.log");
        let line =
            |t: u64| serde_json::to_string(&record("2026-11-23T10:00:00.000Z", "jobs", t)).unwrap();
        std::fs::write(rotated_path(&file, 1), format!("{}\nnot json\n", line(1))).unwrap();
        let huge = format!(
            "{{\"time\":\"{}\",\"event\":\"x\"}}",
            "x".repeat(AUDIT_LINE_BYTES_MAX)
        );
        std::fs::write(&file, format!("{huge}\n{}\n{{\"time\":\"2026", line(2))).unwrap();
        let (records, skipped) = read(&args_for(file.to_str().unwrap(), &[])).unwrap();
        let tokens: Vec<Option<u64>> = records.iter().map(|r| r.presented).collect();
        assert_eq!(tokens, [Some(1), Some(2)]);
        assert_eq!(skipped, 3);
    }

    /// Goal: the noise file and its rotated siblings are read too, merged with the
    /// security records by time, each file's order kept. Method: write `FILE.1`, `FILE`,
    /// `FILE.noise.1` and `FILE.noise` by hand with interleaved times; read.
    #[test]
    fn noise_files_are_merged_by_time() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("audit.log");
        let noise = noise_path(&file);
        let line = |second: u64, t: u64| {
            let time = format!("2026-11-23T10:00:{second:02}.000Z");
            serde_json::to_string(&record(&time, "jobs", t)).unwrap() + "\n"
        };
        std::fs::write(rotated_path(&file, 1), line(1, 1)).unwrap();
        std::fs::write(&file, line(3, 3) + &line(5, 5)).unwrap();
        std::fs::write(rotated_path(&noise, 1), line(0, 10) + &line(2, 12)).unwrap();
        std::fs::write(&noise, line(3, 13) + &line(6, 16)).unwrap();
        let (records, skipped) = read(&args_for(file.to_str().unwrap(), &[])).unwrap();
        let tokens: Vec<Option<u64>> = records.iter().map(|r| r.presented).collect();
        assert_eq!(
            tokens,
            [10, 1, 12, 3, 13, 5, 16].map(Some),
            "times 0 1 2 3 3 5 6, FILE's first of the two at 3"
        );
        assert_eq!(skipped, 0);
    }
}
