//! Garbage collection under churn, with and without crashes.
//!
//! Workloads are driven by a seed that is printed when a check fails. The
//! GC thread's timing is not under the seed's control, so a seed fixes the
//! operations and the crash point, not the interleaving.

use granary_io::{MemDevice, SimRng};
use granary_store::{CreateOptions, Error, OpenOptions, Store};
use std::collections::HashMap;
use std::sync::Arc;

const MIB: u64 = 1 << 20;

/// The value of a key at a version: content that tells versions apart.
fn value(key: u64, version: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut rng = SimRng::new(key.wrapping_mul(31).wrapping_add(version));
    while v.len() < len {
        v.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// In memory, or an O_DIRECT file on io_uring with GRANARY_TEST_BACKEND=uring
/// (the crash cases stay on the simulated memory device).
fn test_device(size: u64) -> Arc<granary_io::TestDevice> {
    Arc::new(granary_io::TestDevice::new(size, std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))))
}

fn key(k: u64) -> Vec<u8> {
    format!("key-{k:06}").into_bytes()
}

fn create<D: granary_io::Device>(dev: &Arc<D>, segment: u64) -> Store {
    let opts = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(segment), index_table_homes: None };
    Store::create(dev.clone(), &opts, &OpenOptions::default()).unwrap()
}

fn open<D: granary_io::Device>(dev: &Arc<D>) -> Store {
    Store::open(dev.clone(), &OpenOptions::default()).unwrap()
}

/// Record bytes of one key/value on the device (whole 512 B grains).
fn record_bytes(key_len: usize, value_len: usize) -> u64 {
    (48 + key_len + value_len).div_ceil(512) as u64 * 512
}

/// Model: key -> (version, length) of its current value.
type Model = HashMap<u64, (u64, usize)>;

fn check(store: &Store, model: &Model, keys: u64, seed: u64) {
    for k in 0..keys {
        let got = store.get(&key(k)).unwrap_or_else(|e| panic!("seed {seed}: get key {k}: {e}"));
        let want = model.get(&k).map(|&(ver, len)| value(k, ver, len));
        assert!(
            got == want,
            "seed {seed}: key {k}: got {:?} bytes, want {:?}",
            got.map(|v| v.len()),
            want.map(|v| v.len())
        );
    }
}

/// GC under sustained churn must lose no key: 64 MiB device, 1 MiB
/// segments, 80% live data, then 10x the device overwritten with random
/// keys and sizes and deletes.
#[test]
fn churn_at_80_percent_keeps_every_key() {
    let seed = 4;
    let dev = test_device(64 * MIB);
    let store = create(&dev, MIB);
    let mut rng = SimRng::new(seed);
    let mut model = Model::new();
    let mut user_record_bytes = 0;
    let put = |store: &Store, model: &mut Model, rng: &mut SimRng, k: u64, version: u64, bytes: &mut u64| {
        let len = 100 + rng.below(16_000) as usize;
        store.put(&key(k), &value(k, version, len)).unwrap_or_else(|e| panic!("seed {seed}: put {k}: {e}"));
        model.insert(k, (version, len));
        *bytes += record_bytes(key(k).len(), len);
    };
    // Fill to 80% of the device with live data.
    let mut live = 0u64;
    let mut keys = 0u64;
    while live < 64 * MIB * 8 / 10 {
        put(&store, &mut model, &mut rng, keys, 0, &mut user_record_bytes);
        live += record_bytes(10, model[&keys].1);
        keys += 1;
    }
    // Overwrite 10x the device: mostly same-size-ish overwrites, some
    // deletes and re-inserts, keeping live data near 80%.
    let mut written = 0u64;
    let mut version = 1;
    while written < 10 * 64 * MIB {
        let k = rng.below(keys);
        version += 1;
        if rng.below(10) == 0 {
            if store.delete(&key(k)).unwrap_or_else(|e| panic!("seed {seed}: delete {k}: {e}")) {
                user_record_bytes += record_bytes(key(k).len(), 0);
            }
            model.remove(&k);
        } else {
            let before = user_record_bytes;
            put(&store, &mut model, &mut rng, k, version, &mut user_record_bytes);
            written += user_record_bytes - before;
        }
    }
    let st = {
        let _quiet = store.pause_gc();
        store.stats()
    };
    assert!(st.gc.victims > 100, "GC must have reclaimed many segments: {:?}", st.gc);
    assert!(st.gc.records_relocated > 0 && st.gc.tombstones_dropped > 0, "{:?}", st.gc);
    check(&store, &model, keys, seed);
    // Device bytes written are exactly: superblocks, segment headers (opened
    // and freed), user records and relocated records.
    let headers = (st.segments_opened + st.gc.victims) * 512;
    assert_eq!(st.io.written_bytes, 2 * 4096 + headers + user_record_bytes + st.gc.bytes_relocated, "{st:?}");
    let wa = st.write_amplification();
    assert!(wa > 1.0 && wa.is_finite(), "write amplification {wa}");
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "seed {seed}: {:?}", report.errors);
    drop(store);
    let store = open(&dev);
    check(&store, &model, keys, seed);
    assert!(store.verify().unwrap().is_clean());
}

/// A store full of live data returns NoSpace instead of waiting forever,
/// and deleting makes room again.
#[test]
fn full_of_live_data_is_no_space_and_deletes_make_room() {
    let dev = test_device(16 * MIB);
    let store = create(&dev, 512 * 1024);
    let mut n = 0u64;
    let err = loop {
        match store.put(&key(n), &value(n, 0, 8000)) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::NoSpace { .. }), "{err}");
    for k in (0..n).step_by(2) {
        assert!(store.delete(&key(k)).unwrap());
    }
    for k in 0..n / 4 {
        store.put(&key(n + k), &value(n + k, 0, 8000)).unwrap();
    }
    for k in (1..n).step_by(2) {
        assert_eq!(store.get(&key(k)).unwrap(), Some(value(k, 0, 8000)));
    }
}

/// Crash at a random write while GC runs: after recovery every
/// acknowledged write is there, no deleted key is back, and the one
/// operation that was cut short is either fully there or not at all.
#[test]
fn crashes_during_gc_lose_nothing_acknowledged() {
    let seeds = 24u64;
    let gc_active = (0..seeds).filter(|&seed| crash_case(seed)).count() as u64;
    assert!(gc_active * 4 >= seeds * 3, "GC ran before the crash in only {gc_active} of {seeds} cases");
}

/// One seeded case; returns whether GC had reclaimed segments before the crash.
fn crash_case(seed: u64) -> bool {
    let dev = Arc::new(MemDevice::new(16 * MIB));
    let store = create(&dev, 256 * 1024);
    let mut rng = SimRng::new(seed);
    let keys = 300u64;
    let mut model = Model::new();
    // Fill to ~60%, then churn with a crash somewhere in it.
    for k in 0..keys {
        let len = 1000 + rng.below(30_000) as usize;
        store.put(&key(k), &value(k, 0, len)).unwrap();
        model.insert(k, (0, len));
    }
    let crash_at = 1500 + rng.below(4000);
    dev.crash_after(crash_at, seed);
    let mut cut_short: Option<(u64, Option<(u64, usize)>)> = None;
    for version in 1..20_000u64 {
        let k = rng.below(keys);
        let (result, new) = if rng.below(8) == 0 {
            (store.delete(&key(k)).map(|_| ()), None)
        } else {
            let len = 1000 + rng.below(30_000) as usize;
            (store.put(&key(k), &value(k, version, len)), Some((version, len)))
        };
        match result {
            Ok(()) => match new {
                Some(v) => {
                    model.insert(k, v);
                }
                None => {
                    model.remove(&k);
                }
            },
            Err(Error::Io { .. }) => {
                cut_short = Some((k, new));
                break;
            }
            // GC hit the crash first: nothing was written by this operation.
            Err(Error::Poisoned { .. }) => break,
            Err(e) => panic!("seed {seed}: unexpected error {e}"),
        }
    }
    assert!(dev.crashed(), "seed {seed}: the crash point must be reached");
    let gc_ran = store.stats().gc.victims > 0;
    drop(store);
    dev.restart();
    let store = open(&dev);
    for k in 0..keys {
        let got = store.get(&key(k)).unwrap_or_else(|e| panic!("seed {seed}: get {k}: {e}"));
        let acked = model.get(&k).map(|&(v, l)| value(k, v, l));
        let ok =
            got == acked || matches!(cut_short, Some((ck, new)) if ck == k && got == new.map(|(v, l)| value(k, v, l)));
        assert!(
            ok,
            "seed {seed}: key {k} has {:?} bytes, acknowledged {:?}",
            got.map(|v| v.len()),
            acked.map(|v| v.len())
        );
    }
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "seed {seed}: {:?}", report.errors);
    // The recovered store keeps working, GC included.
    for version in 50_000..50_400u64 {
        let k = rng.below(keys);
        store.put(&key(k), &value(k, version, 20_000)).unwrap_or_else(|e| panic!("seed {seed}: after recovery: {e}"));
    }
    gc_ran
}

#[test]
fn gc_stats_report_segments_and_watermarks() {
    let dev = test_device(16 * MIB);
    let store = create(&dev, 256 * 1024);
    let st = store.stats();
    assert_eq!(st.segments, 60);
    let (low, high) = st.gc_watermarks;
    assert!(low >= 4 && high > low, "{low} {high}");
    assert_eq!(st.gc, Default::default());
}
