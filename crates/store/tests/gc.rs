//! Garbage collection under churn, with and without crashes.
//!
//! Workloads are driven by a seed that is printed when a check fails. The
//! GC thread's timing is not under the seed's control, so a seed fixes the
//! operations and the crash point, not the interleaving.

mod common;

use granary_io::{Device, FaultDevice, MemDevice, SimRng};
use granary_store::{CreateOptions, Discard, Entropy, Error, GcPolicy, OpenOptions, Stats, Store, Watermark};
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

/// In memory, an O_DIRECT file on io_uring with GRANARY_TEST_BACKEND=uring,
/// or an emulated zoned device of `segment`-byte zones with
/// GRANARY_TEST_BACKEND=zoned (the crash cases stay on the simulated memory
/// device).
fn test_device(size: u64, segment: u64) -> Arc<granary_io::TestDevice> {
    let dev = granary_io::TestDevice::new(size, std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    dev.shape_zones(segment);
    Arc::new(dev)
}

fn key(k: u64) -> Vec<u8> {
    format!("key-{k:06}").into_bytes()
}

fn create<D: granary_io::Device>(dev: &Arc<D>, segment: u64) -> Store {
    create_with(dev, segment, &OpenOptions::default())
}

fn create_with<D: granary_io::Device>(dev: &Arc<D>, segment: u64, open: &OpenOptions) -> Store {
    let opts = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(segment), index_table_homes: None };
    Store::create(dev.clone(), &opts, open).unwrap()
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
/// keys and sizes and deletes; under each victim policy, with and without
/// hot/cold separation, and with skewed keys (a quarter of the keys take
/// most writes) as well as uniform ones.
#[test]
fn churn_at_80_percent_keeps_every_key() {
    churn_case(4, GcPolicy::CostBenefit, true, false);
}

#[test]
fn churn_keeps_every_key_under_greedy() {
    churn_case(5, GcPolicy::Greedy, false, false);
}

#[test]
fn churn_keeps_every_key_under_cost_benefit_without_hot_cold() {
    churn_case(6, GcPolicy::CostBenefit, false, true);
}

#[test]
fn churn_with_skewed_keys_keeps_every_key_under_hot_cold() {
    churn_case(7, GcPolicy::CostBenefit, true, true);
    churn_case(8, GcPolicy::Greedy, true, true);
}

/// The adaptive low watermarks move GC's start under the same churn, and
/// compaction relocates between bursts; no key may be lost, and the
/// watermarks reported stay within their bounds.
#[test]
fn churn_keeps_every_key_under_adaptive_watermarks() {
    for (seed, w) in [(9, Watermark::Queue), (10, Watermark::Doubling), (11, Watermark::Compact)] {
        let st = churn_with(seed, GcPolicy::CostBenefit, false, true, w);
        let (low, high) = st.gc_watermarks;
        assert!((4..=16).contains(&low) && high > low, "seed {seed}: {w:?}: {low} {high}");
        let (lambda, mu) = st.gc_rates.expect("measured under churn");
        assert!(lambda > 0.0 && mu > 0.0, "seed {seed}: {lambda} {mu}");
    }
}

/// SepBIT placement (`OpenOptions::gc_sepbit`): user overwrites split
/// between two user streams by the replaced version's age, GC's
/// relocations among four streams by age; every key stays correct, also
/// after a reopen, and both user streams were written.
#[test]
fn churn_with_skewed_keys_keeps_every_key_under_sepbit() {
    if common::skip_zoned("zoned mode ignores SepBIT placement (its streams would need more open zones)") {
        return;
    }
    for (seed, policy, skewed) in
        [(11, GcPolicy::CostBenefit, true), (12, GcPolicy::Greedy, true), (13, GcPolicy::CostBenefit, false)]
    {
        let opts = OpenOptions { gc_policy: policy, gc_sepbit: true, ..OpenOptions::default() };
        let st = churn_opts(seed, &opts, skewed);
        assert!(st.gc_settings.sepbit && st.gc_settings.hot_cold, "seed {seed}: {:?}", st.gc_settings);
        assert!(st.short_segments_opened > 0, "seed {seed}: {st:?}");
        assert!(st.short_segments_opened < st.segments_opened, "seed {seed}: {st:?}");
    }
}

fn churn_case(seed: u64, gc_policy: GcPolicy, gc_hot_cold: bool, skewed: bool) {
    churn_with(seed, gc_policy, gc_hot_cold, skewed, Watermark::Fixed);
}

fn churn_with(seed: u64, gc_policy: GcPolicy, gc_hot_cold: bool, skewed: bool, gc_watermark: Watermark) -> Stats {
    let opts = OpenOptions { gc_policy, gc_hot_cold, gc_watermark, ..OpenOptions::default() };
    let st = churn_opts(seed, &opts, skewed);
    assert_eq!(st.short_segments_opened, 0, "seed {seed}: no SepBIT placement: {st:?}");
    st
}

fn churn_opts(seed: u64, opts: &OpenOptions, skewed: bool) -> Stats {
    let dev = test_device(64 * MIB, MIB);
    // Zoned mode ignores SepBIT (and the separation it implies).
    let zoned = dev.zones().is_some();
    let gc_hot_cold = opts.gc_hot_cold || (opts.gc_sepbit && !zoned);
    // Ids and the key hash's seed drawn from the seed, as the workload.
    let store = create_with(&dev, MIB, &OpenOptions { entropy: Entropy::seeded(seed), ..opts.clone() });
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
        let k = if skewed && rng.below(4) != 0 { rng.below(keys / 4) } else { rng.below(keys) };
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
    // Old records go to the cold stream only with hot/cold separation.
    assert_eq!(gc_hot_cold, st.gc.bytes_relocated_cold > 0, "seed {seed}: {:?}", st.gc);
    check(&store, &model, keys, seed);
    // Device bytes written are exactly: superblocks, segment headers (opened
    // and freed; zoned mode resets a freed segment's zone instead), user
    // records and relocated records.
    let freed_headers = if zoned { 0 } else { st.gc.victims };
    let headers = (st.segments_opened + freed_headers) * 512;
    // Summaries, and the superblock rewrite that turned them on; SepBIT's
    // streams turn their flag on with one more.
    let summaries = st.summary_bytes_written + if st.summaries_written > 0 { 2 * 4096 } else { 0 };
    let streams_flag = if opts.gc_sepbit && !zoned { 2 * 4096 } else { 0 };
    assert_eq!(
        st.io.written_bytes,
        2 * 4096 + headers + user_record_bytes + st.gc.bytes_relocated + summaries + streams_flag,
        "{st:?}"
    );
    let wa = st.write_amplification();
    assert!(wa > 1.0 && wa.is_finite(), "write amplification {wa}");
    let report = store.verify().unwrap();
    assert!(report.is_clean(), "seed {seed}: {:?}", report.errors);
    drop(store);
    let store = open(&dev);
    check(&store, &model, keys, seed);
    assert!(store.verify().unwrap().is_clean());
    st
}

/// A store full of live data returns NoSpace instead of waiting forever,
/// and deleting makes room again.
#[test]
fn full_of_live_data_is_no_space_and_deletes_make_room() {
    let dev = test_device(16 * MIB, 512 * 1024);
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

/// Overwrites of one key on a store otherwise full of live data: the
/// segments they fill are garbage but among the newest, which GC's age
/// gate leaves out. With writers waiting for room no segment closes, so
/// the gate never moved and every PUT got NoSpace with most of the free
/// room reclaimable; GC takes the newest segments too when writers wait.
#[test]
fn overwrites_on_a_nearly_full_store_find_room_in_young_garbage() {
    let dev = test_device(MIB + 64 * 64 * 1024, 64 * 1024);
    let store = create(&dev, 64 * 1024);
    let mut n = 0u64;
    while store.stats().segments_free > 6 {
        store.put(&key(n), &value(n, 0, 1000)).unwrap();
        n += 1;
    }
    for version in 1..=10_000u64 {
        store.put(&key(0), &value(0, version, 1000)).unwrap_or_else(|e| panic!("overwrite {version}: {e}"));
    }
    assert_eq!(store.get(&key(0)).unwrap(), Some(value(0, 10_000, 1000)));
    for k in 1..n {
        assert_eq!(store.get(&key(k)).unwrap(), Some(value(k, 0, 1000)), "key {k}");
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
    let opts = OpenOptions { entropy: Entropy::seeded(seed), ..OpenOptions::default() };
    let store = create_with(&dev, 256 * 1024, &opts);
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
    let store = Store::open(dev.clone(), &opts).unwrap();
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
    let dev = test_device(16 * MIB, 256 * 1024);
    let store = create(&dev, 256 * 1024);
    let st = store.stats();
    assert_eq!(st.segments, 60);
    let (low, high) = st.gc_watermarks;
    assert!(low >= 4 && high > low, "{low} {high}");
    assert_eq!(st.gc, Default::default());
}

/// Overwrite a small store until GC has freed segments; `keys` keys of
/// 3000 bytes, each overwritten `rounds` times, all checked at the end.
fn overwrite_until_gc(store: &Store, keys: u64, rounds: u64) {
    for r in 0..rounds {
        for k in 0..keys {
            store.put(&key(k), &value(k, r, 3000)).unwrap();
        }
    }
    for k in 0..keys {
        assert_eq!(store.get(&key(k)).unwrap(), Some(value(k, rounds - 1, 3000)), "key {k}");
    }
}

/// Freed segments are discarded, whole but for their header, exactly
/// once each; `auto` does it on block devices only, `off` never, `on`
/// everywhere; the data read back is intact (a discarded range reads as
/// zeros on these devices).
#[test]
fn freed_segments_are_discarded_as_configured() {
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(256 << 10), index_table_homes: None };
    for (block, discard, expect) in [
        (true, Discard::Auto, true),
        (false, Discard::Auto, false),
        (true, Discard::Off, false),
        (false, Discard::On, true),
    ] {
        let dev = Arc::new(FaultDevice::new(8 * MIB, 11));
        dev.act_as_block_device(block);
        let store = Store::create(dev.clone(), &create, &OpenOptions { discard, ..OpenOptions::default() }).unwrap();
        overwrite_until_gc(&store, 600, 8);
        // Both read with GC paused: a reclaim between them would discard
        // one segment more than the figures count.
        let (st, discards) = {
            let _quiet = store.pause_gc();
            (store.stats(), dev.discards())
        };
        assert!(st.gc.victims > 0, "{:?}", st.gc);
        if !expect {
            assert!(discards.is_empty(), "{block} {discard:?}: {discards:?}");
            assert_eq!(st.io.discards, 0);
            continue;
        }
        assert_eq!(discards.len() as u64, st.gc.victims, "{block} {discard:?}: one discard per freed segment");
        assert_eq!(st.io.discards, st.gc.victims);
        let seg = st.segment_bytes;
        let first = store.superblock().segment_offset(0);
        for &(offset, len) in &discards {
            assert_eq!(len, seg - 512, "all of the segment but its header");
            assert_eq!((offset - 512 - first) % seg, 0, "starts after a segment's header: {offset}");
        }
        drop(store);
        // Reopened (recovery reads the free headers, and scans nothing
        // discarded as records): every key still there.
        let store = Store::open(dev.clone(), &OpenOptions::default()).unwrap();
        for k in 0..600 {
            assert_eq!(store.get(&key(k)).unwrap(), Some(value(k, 7, 3000)), "key {k} after reopen");
        }
        assert!(store.verify().unwrap().is_clean());
    }
}

/// On a stripe set of files, a freed segment's discard reaches every
/// member: each member's file gets its share of the segment as a hole
/// (its allocated blocks, `st_blocks`, drop), and the members' discarded
/// bytes add up to the set's. Manual GC, so the check runs right after the
/// put during which GC freed a segment, before anything is written over
/// the hole but that put's record.
#[test]
fn a_stripe_set_discards_freed_segments_on_every_member() {
    use granary_io::{FileDevice, OpenMode, StripedDevice};
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let paths: Vec<_> = (0..2).map(|i| dir.path().join(format!("m{i}"))).collect();
    let members: Vec<Arc<dyn Device>> = paths
        .iter()
        .map(|p| Arc::new(FileDevice::create(p, 4 * MIB + 4096, OpenMode::Direct).unwrap()) as Arc<dyn Device>)
        .collect();
    let set = Arc::new(StripedDevice::create(members, 64 << 10).unwrap());
    let create = CreateOptions { grain_bytes: Some(4096), segment_bytes: Some(256 << 10), index_table_homes: None };
    let opts =
        OpenOptions { discard: Discard::On, background: granary_store::Background::Manual, ..OpenOptions::default() };
    let store = Store::create(set.clone(), &create, &opts).unwrap();
    let hole_bytes = |p: &std::path::Path| {
        let m = std::fs::metadata(p).unwrap();
        m.len().saturating_sub(m.blocks() * 512)
    };
    let mut checked = false;
    'work: for r in 0..12 {
        for k in 0..600 {
            let victims = store.stats().gc.victims;
            store.put(&key(k), &value(k, r, 3000)).unwrap();
            let st = store.stats();
            if st.gc.victims == victims {
                continue;
            }
            if st.io.discards != st.gc.victims {
                // A filesystem without hole punching: the first failure
                // turned discards off.
                assert!(!st.gc_settings.discard, "{st:?}");
                return;
            }
            // A segment was just freed and discarded: a quarter of it per
            // member at least, less what this put wrote since.
            for p in &paths {
                let holes = hole_bytes(p);
                assert!(holes >= 64 << 10, "{}: {holes} bytes of holes after {} victims", p.display(), st.gc.victims);
            }
            checked = true;
            break 'work;
        }
    }
    assert!(checked, "GC never freed a segment");
    for r in 0..4 {
        for k in 0..600 {
            store.put(&key(k), &value(k, 100 + r, 3000)).unwrap();
        }
    }
    let st = store.stats();
    assert_eq!(st.io.discards, st.gc.victims, "one discard per freed segment");
    assert_eq!(st.io.discarded_bytes, st.gc.victims * ((256 << 10) - 4096));
    let per_member: Vec<u64> = set.members().iter().map(|m| m.counters().snapshot().discarded_bytes).collect();
    assert!(per_member.iter().all(|&b| b > 0), "{per_member:?}");
    assert_eq!(per_member.iter().sum::<u64>(), st.io.discarded_bytes, "{per_member:?}");
    drop(store);
    let store = Store::open(set.clone(), &OpenOptions::default()).unwrap();
    for k in 0..600 {
        assert_eq!(store.get(&key(k)).unwrap(), Some(value(k, 103, 3000)), "key {k} after reopen");
    }
    assert!(store.verify().unwrap().is_clean());
}

/// The memory device zeroes a discarded range and counts it.
#[test]
fn memory_device_discard_zeroes_and_counts() {
    let dev = MemDevice::new(MIB);
    let mut buf = granary_io::AlignedBuf::zeroed(4096);
    buf.fill(7);
    dev.write_at(buf, 8192).1.unwrap();
    dev.discard(8192, 4096).unwrap();
    let (buf, r) = dev.read_at(granary_io::AlignedBuf::zeroed(4096), 8192);
    r.unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    let c = dev.counters().snapshot();
    assert_eq!((c.discards, c.discarded_bytes), (1, 4096));
    assert!(!dev.discards_by_default());
    assert!(dev.discard(100, 512).is_err(), "misaligned");
}
