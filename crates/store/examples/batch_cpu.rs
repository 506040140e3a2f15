//! The CPU of a batch commit against single puts, with no device in the
//! way: a store on a [`MemDevice`], 100,000 keys of 1 KiB values loaded,
//! then rounds that alternate single puts and 16-put batches over those keys
//! (blind overwrites, as `granary-bench txn` does on a file), each timed as a
//! whole by the committing thread's CPU time (the machine may be shared:
//! wall time would count other processes) and by the process's (any
//! thread the store wakes). Prints each round and the medians: ns per put,
//! per batch and per key of a batch, and the ratio batch / put.
//!
//! ```sh
//! cargo run --release -p granary-store --example batch_cpu -- [ROUNDS] [OPS_PER_ROUND] [BATCH] [ONLY]
//! ```
//!
//! Defaults: 10 rounds of 2,000 puts and 2,000 batches of 16. With ONLY
//! `batches` (or `puts`) the rounds run only those, for a profile: `perf
//! record --call-graph dwarf` over it shows where a batch's time goes.
//! The device holds the load and about 30,000 batches of 16 before GC
//! must reclaim. Besides the medians it prints the fastest round's thread
//! CPU time. A measurement, not a test: the figures depend on the machine.

use granary_store::io::{AlignedBuf, Device, MemDevice};
use granary_store::loadgen::load_key;
use granary_store::{
    BatchOutcome, CreateOptions, OpenOptions, Store, BLIND_OVERWRITE_BYTES_DEFAULT, DEFAULT_NAMESPACE,
};
use std::sync::Arc;
use std::time::Instant;

/// Keys written over, as in `granary-bench txn`.
const KEYS: u64 = 100_000;
const VALUE_BYTES: usize = 1024;
/// Room for the load and the default rounds (or up to about 30,000
/// batches of 16) without GC.
const DEVICE_BYTES: u64 = 1 << 30;

fn arg(n: usize, default: u64) -> u64 {
    std::env::args().nth(n).map_or(default, |a| a.parse().expect("a number"))
}

/// CPU time of this thread and of the process, in ns.
fn cpu() -> (f64, f64) {
    let read = |clock| {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `t` is a valid timespec for clock_gettime to fill.
        let rc = unsafe { libc::clock_gettime(clock, &mut t) };
        assert_eq!(rc, 0, "clock_gettime");
        t.tv_sec as f64 * 1e9 + t.tv_nsec as f64
    };
    (read(libc::CLOCK_THREAD_CPUTIME_ID), read(libc::CLOCK_PROCESS_CPUTIME_ID))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let (rounds, per_round, batch) = (arg(1, 10), arg(2, 2_000), arg(3, 16));
    let only = std::env::args().nth(4);
    let (do_puts, do_batches) = (only.as_deref() != Some("batches"), only.as_deref() != Some("puts"));
    let create = CreateOptions { grain_bytes: Some(512), ..CreateOptions::default() };
    // Blind overwrites on, as on a file (an in-memory device turns them
    // off by default: there a read costs less than a link).
    let open = OpenOptions {
        checkpoint_interval: None,
        blind_overwrite_bytes: Some(BLIND_OVERWRITE_BYTES_DEFAULT),
        ..OpenOptions::default()
    };
    // Every page of the device touched first, so that the rounds pay no
    // page faults for the log's fresh places (a device's write is a copy).
    let dev = MemDevice::new_huge(DEVICE_BYTES);
    for at in (0..DEVICE_BYTES).step_by(1 << 20) {
        dev.write_at(AlignedBuf::zeroed(1 << 20), at).1.expect("prefault");
    }
    let store = Store::create(Arc::new(dev), &create, &open).expect("store");
    let ns = store.namespace(DEFAULT_NAMESPACE).expect("default namespace");
    let value = vec![b'v'; VALUE_BYTES];
    let keys: Vec<Vec<u8>> = (0..KEYS).map(load_key).collect();
    for k in &keys {
        store.put(k, &value).expect("load");
    }
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % KEYS
    };
    // Per round: thread CPU, process CPU and wall ns per put and per batch.
    let mut rows: Vec<[f64; 6]> = Vec::new();
    let timed = |run: bool, f: &mut dyn FnMut()| {
        let (t0, p0, w0) = (cpu().0, cpu().1, Instant::now());
        for _ in 0..if run { per_round } else { 0 } {
            f();
        }
        let n = per_round as f64;
        let (t1, p1) = cpu();
        ((t1 - t0) / n, (p1 - p0) / n, w0.elapsed().as_nanos() as f64 / n)
    };
    for round in 0..rounds {
        let put = timed(do_puts, &mut || store.put(&keys[next() as usize], &value).expect("put"));
        let bat = timed(do_batches, &mut || {
            let start = next();
            let mut b = store.batch();
            for i in 0..batch {
                b.put(&ns, &keys[((start + i) % KEYS) as usize], &value);
            }
            match b.commit().expect("commit") {
                BatchOutcome::Committed { .. } => {}
                o => panic!("batch not committed: {o:?}"),
            }
        });
        println!(
            "round {round}: thread CPU: put {:.0} ns, batch of {batch} {:.0} ns, ratio {:.2}; process CPU ratio {:.2}; wall ratio {:.2}",
            put.0,
            bat.0,
            bat.0 / put.0,
            bat.1 / put.1,
            bat.2 / put.2
        );
        rows.push([put.0, bat.0, put.1, bat.1, put.2, bat.2]);
    }
    let med = |c: usize| median(&mut rows.iter().map(|r| r[c]).collect::<Vec<_>>());
    for (what, c) in [("thread CPU", 0), ("process CPU", 2), ("wall", 4)] {
        let (p, b) = (med(c), med(c + 1));
        println!(
            "median {what}: put {p:.0} ns, batch of {batch} {b:.0} ns ({:.0} ns a key), ratio {:.2}",
            b / batch as f64,
            b / p
        );
    }
    // The fastest round: on a shared machine other processes only add
    // (their cache misses, their turns on the core), so the least is the
    // steadiest figure of the code's own cost.
    let least = |c: usize| rows.iter().map(|r| r[c]).fold(f64::INFINITY, f64::min);
    let (p, b) = (least(0), least(1));
    println!("least thread CPU: put {p:.0} ns, batch of {batch} {b:.0} ns ({:.0} ns a key)", b / batch as f64);
}
