//! The binary's code pages, kept resident only where they run.
//!
//! One `palisade` binary holds every subcommand (the raft node, the proxy, the clients,
//! the benchmark), 12 MiB of machine code, of which a proxy runs a small part. Each
//! page of it the proxy touches is mapped with its neighbours: on a page fault in a
//! file mapping the kernel maps, besides the page, those of the 64 KiB around it that
//! are in the page cache (`fault_around_bytes`), and code is spread thinly enough that
//! start-up alone left nearly all 12 MiB resident. That was a fifth of the proxy's RSS
//! under load, and more than the gap to nginx's at 1,000 busy connections.
//!
//! Once the proxy is up, [`shed`] tells the kernel that the code is read at random
//! (`MADV_RANDOM`: no fault-around, no read-ahead) and drops the mapped pages
//! (`MADV_DONTNEED`): the ones the proxy goes on running fault back in, from the page
//! cache, one page at a time. Only the executable mapping is touched: it is never
//! written (no text relocations), so dropping it loses nothing; the binary's writable
//! and relocated data are left alone.

use std::path::PathBuf;

/// Drops the resident pages of this executable's code mappings and has their later
/// faults map one page each. Returns the bytes of code the advice covered.
pub(crate) fn shed() -> Result<usize, String> {
    let exe = std::fs::read_link("/proc/self/exe")
        .map_err(|e| format!("cannot read /proc/self/exe: {e}"))?;
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| format!("cannot read /proc/self/maps: {e}"))?;
    let mut covered = 0;
    for (start, end) in code_mappings(&maps, &exe) {
        advise(start, end - start)?;
        covered += end - start;
    }
    Ok(covered)
}

/// The address ranges of `exe`'s executable, private mappings in `maps` (the text of
/// `/proc/self/maps`).
fn code_mappings(maps: &str, exe: &std::path::Path) -> Vec<(usize, usize)> {
    maps.lines()
        .filter_map(|line| {
            // "start-end perms offset dev inode   path"
            let mut fields = line.split_ascii_whitespace();
            let range = fields.next()?;
            let perms = fields.next()?;
            let path: PathBuf = fields.nth(3)?.into();
            if perms != "r-xp" || path != exe {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            let start = usize::from_str_radix(start, 16).ok()?;
            let end = usize::from_str_radix(end, 16).ok()?;
            (end > start).then_some((start, end))
        })
        .collect()
}

/// `MADV_RANDOM`, then `MADV_DONTNEED`, on `len` bytes at `start`.
#[allow(unsafe_code)]
fn advise(start: usize, len: usize) -> Result<(), String> {
    for (advice, name) in [
        (libc::MADV_RANDOM, "MADV_RANDOM"),
        (libc::MADV_DONTNEED, "MADV_DONTNEED"),
    ] {
        // SAFETY: the range is one whole mapping of this executable's code, as the
        // kernel listed it, so it is page-aligned and mapped. MADV_RANDOM is a hint.
        // MADV_DONTNEED on a private file mapping discards only pages this process
        // changed, and code pages are read-only and never changed (the binary has no
        // text relocations): the next access maps the same bytes again from the file.
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

    /// Goal: only the binary's own executable mapping is advised, never its data, nor
    /// another file's code. Method: a maps text with each kind of line.
    #[test]
    fn only_the_executables_code_mapping_is_chosen() {
        let maps = "\
55d0c0000000-55d0c0100000 r--p 00000000 fd:01 123 /usr/bin/palisade
55d0c0100000-55d0c0d00000 r-xp 00100000 fd:01 123 /usr/bin/palisade
55d0c0d00000-55d0c0f00000 r--p 00d00000 fd:01 123 /usr/bin/palisade
55d0c0f00000-55d0c0f10000 rw-p 00f00000 fd:01 123 /usr/bin/palisade
7f0000000000-7f0000100000 r-xp 00000000 fd:01 456 /usr/lib/libc.so.6
7f0000200000-7f0000300000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00001000 r-xp 00000000 00:00 0 [vdso]
";
        assert_eq!(
            code_mappings(maps, std::path::Path::new("/usr/bin/palisade")),
            vec![(0x55d0_c010_0000, 0x55d0_c0d0_0000)]
        );
    }

    /// The resident KiB of this process's code mappings, from `/proc/self/smaps`.
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
            } else if line.contains('-') && line.split_ascii_whitespace().count() >= 5 {
                in_code = !code_mappings(line, &exe).is_empty();
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
