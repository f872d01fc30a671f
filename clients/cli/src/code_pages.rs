//! The binary's code pages, kept resident only where they run.
//!
//! One `palisade` binary holds every subcommand (the raft node, the proxy, the clients,
//! the benchmark), 12 MiB of machine code, of which a proxy runs a small part. Each
//! page of it the proxy touches is mapped with its neighbours: on a page fault in a
//! file mapping the kernel maps, besides the page, those of the 64 KiB around it that
//! are in the page cache (`fault_around_bytes`), and code is spread thinly enough that
//! start-up alone left nearly all 12 MiB resident: a proxy at rest held 13.5 MB, 11.8 of
//! them the binary's pages.
//!
//! Once the proxy is up, [`shed`] drops the binary's read-only pages from the process
//! (`MADV_DONTNEED`): its code, and the read-only data before it (the relocation and
//! symbol tables only the dynamic loader reads, constants, unwinding tables). The pages
//! the proxy goes on using fault back in from the page cache; with `MADV_RANDOM` first,
//! a page not in the cache is read alone, without read-ahead. Fault-around still maps
//! cached neighbours, so under load part of the code comes back (on 2 cores, at the
//! peak of 1,000 busy connections, 8 of its 12 MiB).
//!
//! Dropping a page of a private file mapping discards what the process wrote to it, so
//! only mappings that hold none are dropped: read-only ones whose `/proc/self/smaps`
//! entry counts no anonymous (copied on write) pages. That leaves out the relocated data
//! (`.data.rel.ro`, read-only once relocated, but written by the loader first); being
//! read-only, a chosen mapping cannot gain such pages after the check.

use std::path::Path;

/// Drops the resident pages of this executable's unwritten read-only mappings and has
/// their later faults read no further ahead. Returns the bytes the advice covered.
pub(crate) fn shed() -> Result<usize, String> {
    let exe = std::fs::read_link("/proc/self/exe")
        .map_err(|e| format!("cannot read /proc/self/exe: {e}"))?;
    let smaps = std::fs::read_to_string("/proc/self/smaps")
        .map_err(|e| format!("cannot read /proc/self/smaps: {e}"))?;
    let mut covered = 0;
    for (start, end) in unwritten_mappings(&smaps, &exe) {
        advise(start, end - start)?;
        covered += end - start;
    }
    Ok(covered)
}

/// One mapping of `/proc/self/smaps`, as far as [`unwritten_mappings`] needs it.
struct Mapping<'a> {
    start: usize,
    end: usize,
    perms: &'a str,
    path: Option<&'a str>,
    /// `Anonymous:` in KiB; `None` until its line is read.
    anonymous_kib: Option<u64>,
}

impl Mapping<'_> {
    fn is_unwritten_part_of(&self, exe: &Path) -> bool {
        matches!(self.perms, "r-xp" | "r--p")
            && self.path.is_some_and(|p| Path::new(p) == exe)
            && self.anonymous_kib == Some(0)
            && self.end > self.start
    }
}

/// The address ranges of `exe`'s read-only private mappings in `smaps` (the text of
/// `/proc/self/smaps`) that hold no page the process wrote. A mapping whose
/// `Anonymous:` line is missing is left out, and so is every mapping when the path does
/// not match as one word (a path with a space, or a binary replaced on disk, which
/// smaps shows as "(deleted)"): nothing is shed then.
fn unwritten_mappings(smaps: &str, exe: &Path) -> Vec<(usize, usize)> {
    let mut chosen = Vec::new();
    let mut current: Option<Mapping<'_>> = None;
    for line in smaps.lines() {
        if let Some(kib) = line.strip_prefix("Anonymous:") {
            if let Some(m) = &mut current {
                m.anonymous_kib = kib.trim().trim_end_matches("kB").trim().parse().ok();
            }
        } else if let Some(m) = header(line) {
            chosen.extend(current.replace(m).filter(|m| m.is_unwritten_part_of(exe)));
        }
    }
    chosen.extend(current.filter(|m| m.is_unwritten_part_of(exe)));
    chosen.into_iter().map(|m| (m.start, m.end)).collect()
}

/// A mapping's header line: "start-end perms offset dev inode [path]".
fn header(line: &str) -> Option<Mapping<'_>> {
    let mut fields = line.split_ascii_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?;
    if perms.len() != 4 {
        return None;
    }
    let path = fields.nth(3);
    Some(Mapping {
        start,
        end,
        perms,
        path,
        anonymous_kib: None,
    })
}

/// `MADV_RANDOM`, then `MADV_DONTNEED`, on `len` bytes at `start`.
#[allow(unsafe_code)]
fn advise(start: usize, len: usize) -> Result<(), String> {
    for (advice, name) in [
        (libc::MADV_RANDOM, "MADV_RANDOM"),
        (libc::MADV_DONTNEED, "MADV_DONTNEED"),
    ] {
        // SAFETY: the range is one whole mapping of this executable, as the kernel
        // listed it, so it is page-aligned and mapped. MADV_RANDOM is a hint.
        // MADV_DONTNEED on a private file mapping loses only pages this process wrote
        // (copied on write), and the mapping is read-only and held none when smaps was
        // read (`unwritten_mappings`), nor can it gain one since: the next access maps
        // the same bytes again from the file.
        let done = unsafe { libc::madvise(start as *mut libc::c_void, len, advice) };
        if done != 0 {
            return Err(format!(
                "madvise({name}) on the code at {start:#x} ({len} bytes): {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: only the binary's own read-only mappings that hold no written page are
    /// advised, never its writable or relocated data, nor another file's code. Method:
    /// an smaps text with each kind of mapping.
    #[test]
    fn only_the_executables_unwritten_read_only_mappings_are_chosen() {
        let smaps = "\
55d0c0000000-55d0c0100000 r--p 00000000 fd:01 123 /usr/bin/palisade
Rss:                 800 kB
Anonymous:             0 kB
55d0c0100000-55d0c0d00000 r-xp 00100000 fd:01 123 /usr/bin/palisade
Anonymous:             0 kB
55d0c0d00000-55d0c0f00000 r--p 00d00000 fd:01 123 /usr/bin/palisade
Anonymous:           340 kB
55d0c0f00000-55d0c0f10000 rw-p 00f00000 fd:01 123 /usr/bin/palisade
Anonymous:             0 kB
55d0c0f10000-55d0c0f20000 r--p 00f10000 fd:01 123 /usr/bin/palisade
7f0000000000-7f0000100000 r-xp 00000000 fd:01 456 /usr/lib/libc.so.6
Anonymous:             0 kB
7f0000200000-7f0000300000 rw-p 00000000 00:00 0
Anonymous:            12 kB
7ffd00000000-7ffd00001000 r-xp 00000000 00:00 0 [vdso]
Anonymous:             0 kB
";
        assert_eq!(
            unwritten_mappings(smaps, Path::new("/usr/bin/palisade")),
            vec![
                (0x55d0_c000_0000, 0x55d0_c010_0000),
                (0x55d0_c010_0000, 0x55d0_c0d0_0000)
            ]
        );
        // A binary replaced on disk since it started: nothing is chosen.
        let replaced = "\
55d0c0100000-55d0c0d00000 r-xp 00100000 fd:01 123 /usr/bin/palisade (deleted)
Anonymous:             0 kB
";
        assert!(unwritten_mappings(replaced, Path::new("/usr/bin/palisade (deleted)")).is_empty());
    }

    /// The resident KiB of this executable's code mapping, from `/proc/self/smaps`.
    fn resident_code_kib() -> u64 {
        let exe = std::fs::read_link("/proc/self/exe").expect("exe");
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let mut in_code = false;
        let mut kib = 0;
        for line in smaps.lines() {
            if let Some(rss) = line.strip_prefix("Rss:") {
                if in_code {
                    kib += rss
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .unwrap_or(0);
                }
            } else if let Some(m) = header(line) {
                in_code = m.perms == "r-xp" && m.path.is_some_and(|p| Path::new(p) == exe);
            }
        }
        kib
    }

    /// Goal: shedding drops resident code and is safe while the code runs. Method: this
    /// test binary's resident code before and after [`shed`]; then code runs again (a
    /// formatted string, a sort) and its results are checked.
    #[test]
    fn code_runs_on_after_its_pages_are_shed() {
        let before = resident_code_kib();
        let covered = shed().expect("shed");
        let after = resident_code_kib();
        eprintln!("resident code: {before} KiB before, {after} KiB after");
        assert!(covered > 0, "no code mapping found");
        assert!(
            after < before,
            "resident code did not drop: {before} KiB before, {after} KiB after"
        );
        let mut v: Vec<u32> = (0..1000).rev().collect();
        v.sort_unstable();
        assert_eq!(format!("{}-{}", v[0], v[999]), "0-999");
    }
}
