//! The metrics recorder keeps every histogram sample until it is drained into its
//! buckets. A scrape of `/metrics` drains them, and so does the upkeep thread the
//! recorder starts with; without that thread, a proxy nobody scraped held each forwarded
//! request's upstream latency sample for good.
//!
//! A test binary of its own: it counts the bytes allocated and not yet freed by the
//! whole process, which only this one test runs in.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use palisade_proxy::metrics::{METRICS_UPKEEP_INTERVAL, UPSTREAM_SECONDS, prometheus};

/// The system allocator, counting the bytes it has handed out and not taken back.
struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
static FREED: AtomicUsize = AtomicUsize::new(0);

/// Bytes allocated and not yet freed.
fn live() -> usize {
    // Freed first: every free follows its allocation, so this never goes below zero.
    let freed = FREED.load(Ordering::SeqCst);
    ALLOCATED.load(Ordering::SeqCst).saturating_sub(freed)
}

#[allow(unsafe_code)]
// SAFETY: every call is passed on to the system allocator unchanged; the counter only
// adds and subtracts the sizes of the layouts it was given.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::SeqCst);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        FREED.fetch_add(layout.size(), Ordering::SeqCst);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Samples recorded: 3.3 MB held until drained (blocks of them with their headers), far
/// above what the rest of the process allocates meanwhile.
const SAMPLES: u32 = 200_000;

/// Samples recorded at each look while waiting, as a proxy under load keeps recording:
/// the recorder frees drained samples through epoch-based reclamation, which moves on
/// as threads record.
const TRICKLE: u32 = 100;

/// Goal: histogram samples are not held for good when nobody scrapes `/metrics`: the
/// memory they take is given back within a few upkeep intervals.
/// Method: install the recorder (which starts the upkeep); note the live bytes; record
/// 200,000 upstream latencies; then, recording 100 more every 20 ms and never
/// rendering, wait with a deadline of ten intervals until the live bytes are back
/// within 256 KiB of the start. Without the upkeep they only grow (3.3 MB at once),
/// and the wait runs out.
#[test]
fn histogram_samples_are_drained_without_a_scrape() {
    let _handle = prometheus();
    let histogram = metrics::histogram!(UPSTREAM_SECONDS);
    let before = live();
    for i in 0..SAMPLES {
        histogram.record(f64::from(i % 1000) / 1e6);
    }
    let recorded = live().saturating_sub(before);
    eprintln!("live bytes after {SAMPLES} samples: {recorded} more than before");
    let deadline = Instant::now() + 10 * METRICS_UPKEEP_INTERVAL;
    let settled = loop {
        let held = live().saturating_sub(before);
        if held < 256 * 1024 {
            break held;
        }
        assert!(
            Instant::now() < deadline,
            "{held} bytes still held {:?} after {SAMPLES} samples were recorded",
            10 * METRICS_UPKEEP_INTERVAL
        );
        std::thread::sleep(Duration::from_millis(20));
        for _ in 0..TRICKLE {
            histogram.record(0.001);
        }
    };
    eprintln!("live bytes once drained: {settled} more than before");
}
