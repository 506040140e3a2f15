//! Random 4 KiB copies out of DRAM, with and without the next copies'
//! first lines prefetched: the measurement behind the in-memory device's
//! `READ_PREFETCH_LINES` (docs/BENCHMARKS-HISTORY.md, "In-memory GETs on an
//! executor").
//!
//! `cargo run --release -p granary-bench --example prefetch_copies -- [MIB] [COPIES]`
//!
//! Copies COPIES (default 2 M) blocks of 4 KiB from random places in MIB
//! (default 800, as the benchmark's 200,000 records) of memory on huge
//! pages into a small ring of destinations, first one after the other,
//! then with the first L lines of the copy D places ahead prefetched
//! before each copy, for several D and L. What the prefetch can win is
//! what an executor gains by prefetching a read's lines and running other
//! tasks before the copy.

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::time::Instant;

const BLOCK: usize = 4096;
const LINE: usize = 64;

#[cfg(target_arch = "x86_64")]
fn prefetch(p: *const u8) {
    // SAFETY: a prefetch is a hint: it reads nothing and cannot fault,
    // whatever the address.
    unsafe { std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0) }
}

#[cfg(not(target_arch = "x86_64"))]
fn prefetch(_: *const u8) {}

/// Millions of copies per second with `lines` lines of the copy `ahead`
/// places ahead prefetched before each copy (none when `ahead` is 0).
fn rate(src: &[u8], offsets: &[usize], dst: &mut [u8], ahead: usize, lines: usize) -> f64 {
    let ring = dst.len() / BLOCK;
    let started = Instant::now();
    let mut sum = 0u64;
    for (i, &o) in offsets.iter().enumerate() {
        if ahead > 0 {
            if let Some(&next) = offsets.get(i + ahead) {
                for l in 0..lines {
                    prefetch(src[next + l * LINE..].as_ptr());
                }
            }
        }
        let d = &mut dst[(i % ring) * BLOCK..][..BLOCK];
        d.copy_from_slice(&src[o..o + BLOCK]);
        sum = sum.wrapping_add(d[100] as u64);
    }
    std::hint::black_box(sum);
    offsets.len() as f64 / started.elapsed().as_secs_f64() / 1e6
}

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("a number"));
    let mib = args.next().unwrap_or(800).max(1);
    let copies = args.next().unwrap_or(2_000_000).max(1);
    let size = mib << 20;
    let mut src = vec![0u8; size];
    // Huge pages for the 2 MiB-aligned part (madvise wants an aligned
    // start), as the in-memory device of the benchmark has them.
    const HUGE: usize = 2 << 20;
    let base = src.as_mut_ptr() as usize;
    let (lo, hi) = (base.next_multiple_of(HUGE), (base + size) & !(HUGE - 1));
    if hi > lo {
        // SAFETY: [lo, hi) lies inside the vector's allocation and is
        // page-aligned; the advice changes no contents.
        unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
    }
    for (i, b) in src.iter_mut().enumerate() {
        *b = i as u8;
    }
    let blocks = size / BLOCK;
    let mut rng = Pcg64Mcg::seed_from_u64(0x2545_f491_4f6c_dd1d);
    let offsets: Vec<usize> = (0..copies).map(|_| rng.random_range(0..blocks) * BLOCK).collect();
    let mut dst = vec![0u8; 64 * BLOCK];
    println!("{copies} random {BLOCK} B copies out of {mib} MiB, M copies/s");
    for (ahead, lines) in [(0, 0), (4, 64), (4, 32), (4, 16), (4, 8), (4, 4), (1, 8), (2, 8), (8, 8)] {
        let r = rate(&src, &offsets, &mut dst, ahead, lines);
        if ahead == 0 {
            println!("no prefetch: {r:.2}");
        } else {
            println!("{lines} lines prefetched {ahead} copies ahead: {r:.2}");
        }
    }
}
