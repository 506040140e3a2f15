//! Resident memory of this process (read from `/proc/self/statm`), giving
//! freed memory back, and waiting out the machine's work on it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Resident bytes now (0 where /proc is unavailable).
pub fn rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/statm") else { return 0 };
    let pages: u64 = s.split_whitespace().nth(1).and_then(|x| x.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf(_SC_PAGESIZE) has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * if page > 0 { page as u64 } else { 4096 }
}

/// Return freed heap memory to the kernel, so RSS reflects live data.
pub fn trim() {
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A probe that sees no clock step longer than this was not stalled.
/// Idle, a probe sees steps of a few milliseconds (ticks, other
/// processes); the stalls that follow a large free are several times
/// longer.
pub const STALL: Duration = Duration::from_millis(8);
/// Quiet for this long means done: longer than the 2 s between the passes
/// of the kernel's free-page reporting.
pub const QUIET: Duration = Duration::from_secs(4);

/// Wait, at most `limit`, until no CPU of this machine stalls for [`QUIET`]:
/// one thread per CPU spins reading the clock, and any step longer than
/// [`STALL`] restarts the quiet period. Returns what it saw.
///
/// Why: freeing gigabytes in a VM with free-page reporting (virtio-balloon)
/// starts kernel work that hands the memory back to the host in passes
/// every 2 s, and each pass can take every CPU for tens of milliseconds;
/// after freeing gigabytes such stalls go on for seconds. A benchmark that frees
/// one structure and then times the next one's inserts would charge those
/// stalls to the next one.
pub fn wait_for_quiet(limit: Duration) -> Quiet {
    let started = Instant::now();
    if limit.is_zero() {
        return Quiet::default();
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Nanoseconds since `started` of the latest stall seen; stalls seen;
    // the longest, in nanoseconds.
    let last_stall = AtomicU64::new(0);
    let (stalls, longest) = (AtomicU64::new(0), AtomicU64::new(0));
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for probe in 0..cpus {
            let (last_stall, stop, stalls, longest) = (&last_stall, &stop, &stalls, &longest);
            s.spawn(move || {
                let mut prev = Instant::now();
                while !stop.load(Relaxed) {
                    let now = Instant::now();
                    if now - prev > STALL {
                        last_stall.fetch_max((now - started).as_nanos() as u64, Relaxed);
                        stalls.fetch_add(1, Relaxed);
                        longest.fetch_max((now - prev).as_nanos() as u64, Relaxed);
                    }
                    prev = now;
                    // Probe 0 decides (a thread sleeping to decide would
                    // itself take a probe's CPU when it wakes).
                    if probe == 0 {
                        let quiet = (now - started).saturating_sub(Duration::from_nanos(last_stall.load(Relaxed)));
                        if quiet >= QUIET || now - started >= limit {
                            stop.store(true, Relaxed);
                        }
                    }
                }
            });
        }
    });
    Quiet {
        waited: started.elapsed(),
        stalls: stalls.into_inner(),
        longest: Duration::from_nanos(longest.into_inner()),
    }
}

/// What [`wait_for_quiet`] saw.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Quiet {
    pub waited: Duration,
    /// Clock steps longer than [`STALL`], over all probes.
    pub stalls: u64,
    pub longest: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wait ends at its limit when that comes before a quiet period
    /// could, and a zero limit does not wait.
    #[test]
    fn the_wait_for_quiet_is_bounded() {
        assert_eq!(wait_for_quiet(Duration::ZERO), Quiet::default());
        let limit = Duration::from_millis(200);
        let waited = wait_for_quiet(limit).waited;
        assert!(waited >= limit && waited < QUIET, "waited {waited:?}");
    }
}
