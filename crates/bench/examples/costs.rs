//! Unit costs behind choices on the GET path (docs/BENCHMARKS-HISTORY.md, "Device"):
//! CRC32C of a record with each implementation, and clock reads.
//!
//! `cargo run --release -p granary-bench --example costs`
//!
//! Each figure is the mean over a few million repetitions on one thread;
//! run it on a quiet machine and compare within one run.

use std::hint::black_box;
use std::time::Instant;

const REPS: u32 = 2_000_000;

/// Mean nanoseconds of `f` over [`REPS`] calls.
fn ns(mut f: impl FnMut(u32) -> u32) -> f64 {
    let mut acc = 0u32;
    let t = Instant::now();
    for i in 0..REPS {
        acc ^= f(i);
    }
    black_box(acc);
    t.elapsed().as_nanos() as f64 / REPS as f64
}

fn main() {
    let data: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    println!("CRC32C, ns per call (crc32c crate: CRC instruction; granary: crc-fast folding from 256 B)");
    for len in [32usize, 256, 512, 1024, 4000, 4096] {
        let d = &data[..len];
        let plain = ns(|i| crc32c::crc32c_append(i, black_box(d)));
        let ours = ns(|i| granary_format::checksum::crc32c_append(i, black_box(d)));
        println!("  {len:>5} B: crc32c {plain:>7.1}   granary {ours:>7.1}");
    }
    println!("clock reads, ns per read");
    let pair = ns(|_| black_box(Instant::now()).elapsed().subsec_nanos());
    println!("  Instant::now (monotonic): {:.1}", pair / 2.0);
    let coarse = ns(|_| {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid timespec to write.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
        ts.tv_nsec as u32
    });
    println!("  CLOCK_REALTIME_COARSE:    {coarse:.1}");
}
