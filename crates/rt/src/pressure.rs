//! Whether the machine's CPUs are contended, from the kernel's pressure
//! stall information (`/proc/pressure/cpu`, "some": time in which at least
//! one runnable task waited for a CPU). An executor spins (polls instead of
//! sleeping in the kernel) only while this is low: a spin on a contended
//! machine takes the CPU from a task that waits for it, and where clients
//! share the executors' cores, from the very clients whose requests it
//! waits for (docs/BENCHMARKS.md, "CPU per request (memcache)").
//!
//! Invariants: the file is read at most once per [`PRESSURE_PERIOD`] per
//! executor (one `pread` of a descriptor kept open); without it (a kernel
//! without PSI, `psi=0`, an unreadable or unexpected file) the CPUs never
//! read as contended, so the executors spin as configured.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// How often an executor reads the pressure (and how far back the share
/// it acts on looks).
pub const PRESSURE_PERIOD: Duration = Duration::from_millis(100);

/// The CPUs count as contended over a period when tasks waited for a CPU
/// for at least this share of it, in percent.
pub const CONTENDED_STALL_PCT: u64 = 10;

/// One executor's view of the CPU pressure.
pub(crate) struct CpuPressure {
    file: Option<File>,
    /// When it was last read, and the stall total then (µs).
    last: Option<(Instant, u64)>,
    contended: bool,
}

impl CpuPressure {
    /// Reading `/proc/pressure/cpu`, if the kernel has it.
    pub(crate) fn open() -> CpuPressure {
        CpuPressure { file: File::open("/proc/pressure/cpu").ok(), last: None, contended: false }
    }

    /// Whether tasks waited for a CPU for [`CONTENDED_STALL_PCT`] of the
    /// last period; the file is read again once `now` is a period past
    /// the last read.
    pub(crate) fn contended(&mut self, now: Instant) -> bool {
        let Some(file) = &self.file else { return false };
        if let Some((at, _)) = self.last {
            if now.saturating_duration_since(at) < PRESSURE_PERIOD {
                return self.contended;
            }
        }
        let mut buf = [0u8; 256];
        let Some(total) = file.read_at(&mut buf, 0).ok().and_then(|n| some_total_us(&buf[..n])) else {
            // Not what this reads: spin as configured from now on.
            self.file = None;
            self.contended = false;
            return false;
        };
        if let Some((at, prev)) = self.last {
            let wall = now.saturating_duration_since(at).as_micros() as u64;
            self.contended = stalled(total.saturating_sub(prev), wall);
        }
        self.last = Some((now, total));
        self.contended
    }
}

/// The "some" line's `total=` (µs of stall since boot) of a pressure file.
fn some_total_us(text: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?;
    let some = text.lines().find(|l| l.starts_with("some "))?;
    some.split(' ').find_map(|w| w.strip_prefix("total="))?.parse().ok()
}

/// Whether `stall_us` of stall in `wall_us` passes [`CONTENDED_STALL_PCT`].
fn stalled(stall_us: u64, wall_us: u64) -> bool {
    wall_us > 0 && stall_us.saturating_mul(100) >= wall_us.saturating_mul(CONTENDED_STALL_PCT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_some_total_is_read_from_the_kernel_s_format() {
        let text = b"some avg10=99.34 avg60=98.77 avg300=97.93 total=13165296533\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(some_total_us(text), Some(13_165_296_533));
        assert_eq!(some_total_us(b"full avg10=0.00 total=5\n"), None);
        assert_eq!(some_total_us(b"some avg10=0.00 total=x\n"), None);
        assert_eq!(some_total_us(b""), None);
    }

    #[test]
    fn contended_from_the_share_of_the_period_stalled() {
        assert!(!stalled(0, 100_000));
        assert!(!stalled(9_999, 100_000));
        assert!(stalled(10_000, 100_000));
        assert!(stalled(200_000, 100_000), "stall summed over CPUs may pass the wall time");
        assert!(!stalled(5, 0), "no time passed: no verdict");
    }

    #[test]
    fn without_a_pressure_file_the_cpus_are_never_contended() {
        let mut p = CpuPressure { file: None, last: None, contended: true };
        assert!(!p.contended(Instant::now()));
    }

    /// On a kernel with PSI, the first read gives no verdict (there is no
    /// period yet), and reads within a period keep the last verdict.
    #[test]
    fn the_file_is_read_once_a_period() {
        let mut p = CpuPressure::open();
        let t0 = Instant::now();
        assert!(!p.contended(t0));
        if p.file.is_none() {
            return; // no PSI here: nothing more to check
        }
        let first = p.last.expect("read").1;
        assert!(!p.contended(t0 + PRESSURE_PERIOD / 2));
        assert_eq!(p.last.map(|l| l.0), Some(t0), "not read again within the period");
        p.contended(t0 + PRESSURE_PERIOD);
        let (at, total) = p.last.expect("read");
        assert_eq!(at, t0 + PRESSURE_PERIOD);
        assert!(total >= first, "the stall total only grows");
    }
}
