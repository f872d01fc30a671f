//! The CPU time of other processes over the measured window (`--pid`), from Linux's
//! `/proc/PID/stat`: user plus system time of every thread the process has had, exited
//! threads included (the kernel folds them into the process's totals), in clock ticks.

use serde::Serialize;

/// Clock ticks per second in `/proc/PID/stat`: Linux's `USER_HZ`, fixed at 100 in the
/// kernel's user-space ABI whatever the kernel's internal tick rate.
const USER_HZ: u32 = 100;

/// One process's CPU time at one moment, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sample {
    pid: i32,
    ticks: u64,
}

/// What one process used over the window.
#[derive(Debug, Serialize, PartialEq)]
pub(super) struct Usage {
    pub(super) pid: i32,
    /// CPU seconds (user + system) over the measured window.
    pub(super) cpu_s: f64,
    /// CPU microseconds per answered request; absent when nothing was answered.
    pub(super) us_per_request: Option<f64>,
}

/// Reads the CPU time of each of `pids` now.
pub(super) fn sample(pids: &[i32]) -> Result<Vec<Sample>, crate::Failure> {
    pids.iter()
        .map(|&pid| {
            let path = format!("/proc/{pid}/stat");
            let stat = std::fs::read_to_string(&path).map_err(|e| {
                crate::Failure::Runtime(format!("--pid {pid}: cannot read {path}: {e}"))
            })?;
            let ticks = ticks_of_stat(&stat).ok_or_else(|| {
                crate::Failure::Runtime(format!("--pid {pid}: cannot parse {path}"))
            })?;
            Ok(Sample { pid, ticks })
        })
        .collect()
}

/// The CPU each process used between `start` and `end`, and per request.
pub(super) fn usage(pids: &[i32], start: &[Sample], end: &[Sample], answered: u64) -> Vec<Usage> {
    let tick_s = clock_tick_s();
    pids.iter()
        .zip(start.iter().zip(end))
        .map(|(&pid, (a, b))| {
            let cpu_s = ticks_f64(b.ticks.saturating_sub(a.ticks)) * tick_s;
            Usage {
                pid,
                cpu_s,
                us_per_request: (answered > 0).then(|| cpu_s * 1e6 / ticks_f64(answered)),
            }
        })
        .collect()
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line. The command name (field
/// 2) is in parentheses and may itself hold spaces or parentheses, so fields are counted
/// from the last `)`.
fn ticks_of_stat(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // After the name: field 3 (state) is the first; utime and stime are fields 14, 15.
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Seconds per clock tick.
fn clock_tick_s() -> f64 {
    1.0 / f64::from(USER_HZ)
}

/// A tick or request count as `f64`; both stay far below 2^52.
#[allow(clippy::cast_precision_loss)]
fn ticks_f64(n: u64) -> f64 {
    n as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: utime + stime are found after a command name holding spaces and parentheses.
    /// Method: a real-format stat line with utime 120 and stime 35.
    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let stat = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 900 0 0 0 120 35 0 0 20 0 \
                    3 0 12345 1000000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0";
        assert_eq!(ticks_of_stat(stat), Some(155));
        assert_eq!(ticks_of_stat("garbage"), None);
    }

    /// Goal: this process's own CPU time can be sampled and only grows; the per-request
    /// figure divides by the answered count. Method: sample, burn some CPU, sample again.
    #[test]
    fn own_process_cpu_rises_and_divides_by_requests() {
        let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        let start = sample(&[me]).unwrap_or_else(|_| panic!("own /proc/self/stat"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(300);
        let mut x = 0_u64;
        while std::time::Instant::now() < deadline {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let end = sample(&[me]).unwrap_or_else(|_| panic!("own /proc/self/stat"));
        let used = usage(&[me], &start, &end, 1000);
        assert_eq!(used.len(), 1);
        assert!(
            used[0].cpu_s > 0.0,
            "300 ms of spinning used no CPU: {used:?}"
        );
        let per = used[0].us_per_request.unwrap_or_default();
        assert!((per - used[0].cpu_s * 1000.0).abs() < 1e-6);
        assert!(sample(&[i32::MAX]).is_err(), "a pid that does not exist");
    }
}
