//! Inserts into Granary's index from one or more threads, untimed per insert: the
//! index's own insert rate, pre-sized and growing (docs/BENCHMARKS-HISTORY.md,
//! "Index"). `granary-bench index` times every insert for its latency
//! percentiles, which costs a clock read per insert on top.
//!
//! `cargo run --release -p granary-bench --example index_inserts -- [ITEMS] [ROUNDS] [THREADS]`
//!
//! Each round inserts ITEMS (default 20 M) random hashes from THREADS
//! threads (default 2) into a pre-sized
//! index, then into one that starts with one table and grows to 16, and
//! prints the rates; compare within one run.

use granary_index::{Index, IndexConfig};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::time::Instant;

/// Millions of inserts per second of `hashes` into a fresh index with
/// `2^initial_log2` of its 16 tables, from `threads` threads.
fn rate(hashes: &[u64], initial_log2: u32, threads: usize) -> f64 {
    // As `granary-bench index`: 16 tables hold every item at 85%.
    let homes = (hashes.len() as f64 / 16.0 / 0.85) as u32 + 1;
    let idx = Index::new(IndexConfig::with_tables(homes.max(64), initial_log2));
    let started = Instant::now();
    std::thread::scope(|s| {
        for part in hashes.chunks(hashes.len().div_ceil(threads).max(1)) {
            let idx = &idx;
            s.spawn(move || {
                for (i, &h) in part.iter().enumerate() {
                    idx.insert(h, 1, i as u64).expect("sized for every item");
                }
            });
        }
    });
    hashes.len() as f64 / started.elapsed().as_secs_f64() / 1e6
}

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("a number"));
    let items = args.next().unwrap_or(20_000_000);
    let rounds = args.next().unwrap_or(3);
    let threads = args.next().unwrap_or(2).max(1);
    let mut rng = Pcg64Mcg::seed_from_u64(0);
    let hashes: Vec<u64> = (0..items).map(|_| rng.random()).collect();
    println!("{items} inserts from {threads} thread(s), M/s");
    for round in 1..=rounds {
        let presized = rate(&hashes, 4, threads);
        let growing = rate(&hashes, 0, threads);
        println!("round {round}: pre-sized {presized:.2}, growing {growing:.2}");
    }
}
