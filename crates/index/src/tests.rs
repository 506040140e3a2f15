//! Unit and model tests of the index, driven by chosen hashes.

use crate::*;
use granary_format::hash::SLOT_BITS;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::collections::HashMap;

/// Home slots of the tables built by `small`.
const HOMES: u32 = 128;

/// A hash with the given home slot (in a table of `HOMES` homes) and tag.
fn h(home: u64, tag: u8) -> u64 {
    let slot_bits = (home << SLOT_BITS).div_ceil(HOMES as u64);
    slot_bits | ((tag as u64) << SLOT_BITS)
}

/// A small index that grows at the first full neighbourhood.
fn small(region_log2: u32) -> Index {
    Index::new(IndexConfig {
        table_homes: HOMES,
        region_log2,
        initial_tables_log2: 0,
        grow_load_percent: 0,
        access_words: false,
    })
}

/// The pbas of `hash`'s candidates; checks on the way that `contains`
/// agrees with `lookup`, on each of them and on a pba that is none of them.
fn pbas(idx: &Index, hash: u64) -> Vec<u64> {
    let got: Vec<u64> = idx.lookup(hash).as_slice().iter().map(|e| e.pba()).collect();
    for &p in &got {
        assert!(idx.contains(hash, p), "contains misses candidate {p} of {hash:#x}");
    }
    let other = got.iter().max().map_or(0, |m| m + 1);
    assert!(!idx.contains(hash, other), "contains finds {other}, not a candidate of {hash:#x}");
    got
}

/// [`pbas`] without the check, for lookups racing writers (which may
/// change the candidates between the two calls).
fn pbas_racy(idx: &Index, hash: u64) -> Vec<u64> {
    idx.lookup(hash).as_slice().iter().map(|e| e.pba()).collect()
}

#[test]
fn insert_lookup_replace_remove() {
    let idx = small(5);
    idx.insert(h(3, 7), 2, 100).unwrap();
    idx.insert(h(3, 8), 1, 101).unwrap();
    assert_eq!(pbas(&idx, h(3, 7)), vec![100]);
    assert!(idx.replace(h(3, 7), 100, 0, 200));
    let c = idx.lookup(h(3, 7));
    assert_eq!(c.as_slice().len(), 1);
    assert!(c.as_slice()[0].is_tombstone());
    assert!(!idx.replace(h(3, 7), 100, 1, 300), "stale pba must not match");
    assert!(idx.remove(h(3, 7), 200));
    assert!(pbas(&idx, h(3, 7)).is_empty());
    assert_eq!(pbas(&idx, h(3, 8)), vec![101]);
    assert_eq!(idx.stats().entries, 1);
}

#[test]
fn contains_never_takes_a_free_slot_for_an_entry() {
    // A free slot is stored as 0; the vector pass compares whole slots, so
    // a query for the pba that free slots encode (all ones, no record's)
    // must not match one, at offset 0 with key tag 0 or anywhere else.
    use granary_format::limits::PBA_MAX;
    let idx = small(5);
    let free_pba = PBA_MAX + 1;
    assert!(!idx.contains(h(3, 0), free_pba));
    idx.insert(h(3, 0), 1, 7).unwrap();
    assert!(idx.contains(h(3, 0), 7));
    assert!(!idx.contains(h(3, 0), free_pba));
    assert!(!idx.contains(h(4, 0), free_pba));
    assert!(!idx.contains(h(3, 0), u64::MAX));
}

/// Lookup must not stop at the first free slot, or a purge could hide a live
/// key: deleting one key must never hide another in its neighbourhood.
#[test]
fn regression_hole_does_not_hide_later_entry() {
    let idx = small(5);
    for i in 0..5 {
        idx.insert(h(10, 1), 1, 1000 + i).unwrap();
    }
    idx.insert(h(10, 2), 1, 2000).unwrap();
    // Punch holes before the last entry.
    assert!(idx.remove(h(10, 1), 1000));
    assert!(idx.remove(h(10, 1), 1002));
    assert_eq!(pbas(&idx, h(10, 2)), vec![2000]);
    let mut left = pbas(&idx, h(10, 1));
    left.sort();
    assert_eq!(left, vec![1001, 1003, 1004]);
}

#[test]
fn displacement_crosses_one_region_boundary() {
    // 32-slot regions; homes 0..=40 packed so that a key with home 20 must
    // displace entries into the next region.
    let idx = small(5);
    let mut want = HashMap::new();
    let mut pba = 0;
    for home in 0..44u64 {
        let hash = h(home, (home % 200) as u8);
        idx.insert(hash, 1, pba).unwrap();
        want.insert(pba, hash);
        pba += 1;
    }
    // Home 20's neighbourhood is [20, 52): full up to slot 43. Fill to 51.
    for i in 0..8 {
        let hash = h(20 + i, 250);
        idx.insert(hash, 1, pba).unwrap();
        want.insert(pba, hash);
        pba += 1;
    }
    // Now an insert at home 20 finds the first free slot at 52 (region 1)
    // and must move an entry back into [20, 52).
    let hash = h(20, 251);
    idx.insert(hash, 1, pba).unwrap();
    want.insert(pba, hash);
    for (pba, hash) in &want {
        assert!(pbas(&idx, *hash).contains(pba), "lost pba {pba}");
    }
    assert_eq!(idx.stats().grows, 0, "displacement, not growth, must make room");
    // Every entry still within H of its home, and covered by its home's hint.
    idx.for_each(|_, e| assert!(e.neigh_off() < 32));
    idx.check_hints();
}

/// 33 keys of one fingerprint (home and key tag) can never be told apart
/// by the index: the 33rd is refused as Crowded at once, without growing
/// (a grow keeps them in one table at one home; growing for them used to
/// run the directory to 256 tables, faulting all of them in, for keys
/// chosen to collide). Keys of the same home and tag but other fp bits
/// still grow the directory to 256 tables (they too keep one table),
/// then fill the stash, then Full.
#[test]
fn a_crowded_fingerprint_is_refused_without_growing_and_full_comes_at_the_largest_directory() {
    let idx = small(5);
    for i in 0..32 {
        idx.insert(h(5, 9), 1, i).unwrap();
    }
    let err = idx.insert(h(5, 9), 1, 99).unwrap_err();
    assert!(matches!(err, IndexError::Crowded), "{err}");
    assert!(err.to_string().contains("fingerprint"), "{err}");
    assert_eq!((idx.stats().tables, idx.stats().grows), (1, 0), "no grow for a crowded fingerprint");
    assert_eq!(pbas(&idx, h(5, 9)).len(), 32);
    let mut stored = 0;
    let err = (0..32 * 15)
        .find_map(|i| {
            let fp = 1 + (i % 15) as u64;
            match idx.insert(h(5, 9) | (fp << (SLOT_BITS + 8)), 1, 1000 + i as u64) {
                Ok(_) => {
                    stored += 1;
                    None
                }
                Err(e) => Some(e),
            }
        })
        .expect("the stash fills");
    assert!(matches!(err, IndexError::Full { tables: 256, .. }), "{err}");
    assert!(err.to_string().contains("index full"));
    assert_eq!((idx.stats().tables, idx.stats().grows), (256, 8));
    assert_eq!(stored, 256, "the largest directory's stash took its 256");
    assert_eq!(pbas(&idx, h(5, 9)).len(), 32);
}

#[test]
fn growth_splits_by_tag_and_keeps_every_entry() {
    let idx = small(5); // 64 homes per table: grows soon
    let mut rng = Pcg64Mcg::seed_from_u64(0x1234_5678_9abc_def0);
    let mut all = Vec::new();
    for pba in 0..3000u64 {
        let hash = rng.random::<u64>() >> 7;
        idx.insert(hash, 1, pba).unwrap();
        all.push((hash, pba));
    }
    assert!(idx.stats().grows >= 4);
    for (hash, pba) in &all {
        assert!(pbas(&idx, *hash).contains(pba));
    }
    // Fingerprints rebuilt from positions (home, tag) match the hashes.
    let mut seen: HashMap<u64, (usize, u8)> = HashMap::new();
    idx.for_each(|home, e| {
        seen.insert(e.pba(), (home, e.tag()));
    });
    assert_eq!(seen.len(), all.len());
    for (hash, pba) in &all {
        assert_eq!(seen[pba], (idx.home(*hash), granary_format::hash::tag(*hash)));
    }
    idx.check_hints();
}

/// A split leaves holes in both halves where the other's entries were; the
/// migration moves each entry homed in its region to the first free slot
/// from its home, so right after a grow no entry has a free slot between
/// its home and itself within its region, and every key is still found.
#[test]
fn growth_moves_entries_toward_their_homes() {
    let idx = Index::new(IndexConfig::with_tables(4096, 0));
    let region_log2 = idx.config().region_log2;
    let mut all = Vec::new();
    let mut rng = Pcg64Mcg::seed_from_u64(0x0dd_ba11);
    while idx.stats().grows == 0 {
        let hash = rng.random::<u64>() >> 7;
        idx.insert(hash, 1, all.len() as u64).unwrap();
        all.push(hash);
    }
    idx.check_hints(); // finishes the migration
    let (mut displaced, mut holes) = (0, 0);
    for t in idx.tables() {
        for s in 0..t.len() {
            let e = t.get(s);
            if e.is_free() || e.neigh_off() == 0 {
                continue;
            }
            let home = s - e.neigh_off() as usize;
            if home >> region_log2 == s >> region_log2 {
                displaced += 1;
                holes += (home..s).filter(|&f| t.get(f).is_free()).count();
            }
        }
    }
    assert!(displaced > 100, "the table filled before it grew: {displaced} entries off their homes");
    assert_eq!(holes, 0, "free slots between entries and their homes after the migration");
    for (pba, hash) in all.iter().enumerate() {
        assert!(pbas(&idx, *hash).contains(&(pba as u64)), "key {pba} lost");
    }
}

#[test]
fn growth_at_table_boundaries() {
    let idx = small(5);
    // 40 keys homed at the last home slot spill into the overflow tail and
    // need a grow; keys homed at slot 0 share nothing with them.
    let mut all = Vec::new();
    for i in 0..40u64 {
        all.push((h(HOMES as u64 - 1, i as u8), i));
        all.push((h(0, i as u8), 1000 + i));
    }
    for (hash, pba) in &all {
        idx.insert(*hash, 1, *pba).unwrap();
    }
    assert!(idx.stats().grows >= 1);
    for (hash, pba) in &all {
        assert_eq!(pbas(&idx, *hash), vec![*pba]);
    }
    let mut last = 0;
    idx.for_each(|home, e| {
        assert!(home == 0 || home == HOMES as usize - 1, "home {home}");
        if home == HOMES as usize - 1 {
            last += 1;
            assert!(e.neigh_off() < 32);
        }
    });
    assert_eq!(last, 40);
}

#[test]
fn lookups_read_old_tables_during_a_migration() {
    let idx = small(5); // 5 regions of 32 slots per table
    for home in [2u64, 40, 70, 100] {
        idx.insert(h(home, 1), 1, home).unwrap();
    }
    // Fill home 5's neighbourhood with tags that split, then one more: the
    // insert grows, and migrates only the regions it holds (0 and 1).
    for i in 0..32u64 {
        idx.insert(h(5, 2 + i as u8), 1, 500 + i).unwrap();
    }
    idx.insert(h(5, 200), 1, 999).unwrap();
    let st = idx.stats();
    assert!(st.resizing, "migration must still be running: {st:?}");
    assert_eq!(st.tables, 2);
    // Entries of regions 2 and 3 are still only in the old table.
    for home in [2u64, 40, 70, 100] {
        assert_eq!(pbas(&idx, h(home, 1)), vec![home]);
    }
    assert_eq!(pbas(&idx, h(5, 200)), vec![999]);
    // Writers in the other regions migrate them (a writer at home 70 holds
    // regions 2 and 3); the migration ends with region 4.
    assert!(idx.replace(h(70, 1), 70, 2, 71));
    assert!(idx.stats().resizing);
    idx.insert(h(127, 1), 1, 127).unwrap();
    assert!(!idx.stats().resizing, "all regions migrated: {:?}", idx.stats());
    for home in [2u64, 40] {
        assert_eq!(pbas(&idx, h(home, 1)), vec![home]);
    }
    assert_eq!(pbas(&idx, h(70, 1)), vec![71]);
    assert_eq!(pbas(&idx, h(100, 1)), vec![100]);
    // The new tables' hints came with the regions: every entry of home 5
    // is found through them.
    idx.check_hints();
    assert_eq!(pbas(&idx, h(5, 200)), vec![999]);
    assert_eq!(idx.stats().entries, 38);
}

/// Threads insert, replace, remove and look up their own keys and race on
/// shared ones while the directory grows from one table to many.
#[test]
fn multithreaded_stress_with_resizes() {
    use std::sync::{Arc, Mutex};
    const THREADS: u64 = 4;
    const OPS: u64 = 6000;
    const SHARED: u64 = 64;
    let idx = Arc::new(small(5));
    // Unrelated keys may share home and tag (the index returns candidates),
    // so a shared key's entry is recognised by its pba: bit 35 set and the
    // key number in bits 24..35. Every successful replace is logged as
    // (old, new); the final pba must end the chain from the first.
    let shared_pba = |k: u64, n: u64| (1u64 << 35) | (k << 24) | n;
    let shared_entry = |idx: &Index, k: u64| -> Vec<u64> {
        pbas_racy(idx, spread(k + 1_000_000)).into_iter().filter(|p| p >> 35 == 1 && (p >> 24) & 0x7ff == k).collect()
    };
    for k in 0..SHARED {
        idx.insert(spread(k + 1_000_000), 1, shared_pba(k, 0)).unwrap();
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let idx = idx.clone();
            let log = log.clone();
            std::thread::spawn(move || {
                let mut mine: HashMap<u64, u64> = HashMap::new();
                let mut rng = Pcg64Mcg::seed_from_u64(t + 7);
                for i in 0..OPS {
                    let x: u64 = rng.random();
                    let pba = (t + 1) * 10_000_000 + i;
                    match x % 8 {
                        0..=3 => {
                            let hash = spread(pba);
                            idx.insert(hash, 1, pba).unwrap();
                            mine.insert(hash, pba);
                        }
                        4 if !mine.is_empty() => {
                            let (&hash, &old) = mine.iter().next().unwrap();
                            assert!(idx.remove(hash, old));
                            mine.remove(&hash);
                        }
                        5 if !mine.is_empty() => {
                            let (&hash, &old) = mine.iter().nth((x as usize / 8) % mine.len()).unwrap();
                            assert!(idx.replace(hash, old, 2, pba));
                            mine.insert(hash, pba);
                        }
                        _ => {
                            let k = (x >> 8) % SHARED;
                            let hash = spread(k + 1_000_000);
                            let c = shared_entry(&idx, k);
                            assert_eq!(c.len(), 1, "shared key {k} must have one entry");
                            let new = shared_pba(k, t * OPS + i + 1);
                            if idx.replace(hash, c[0], 1, new) {
                                log.lock().unwrap().push((k, c[0], new));
                            }
                        }
                    }
                }
                for (hash, pba) in &mine {
                    assert!(pbas_racy(&idx, *hash).contains(pba));
                    assert!(idx.contains(*hash, *pba));
                }
                mine.len() as u64
            })
        })
        .collect();
    let own: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let st = idx.stats();
    assert!(st.grows >= 4, "the test must exercise resizes: {st:?}");
    assert_eq!(st.entries, own + SHARED);
    let log = log.lock().unwrap();
    for k in 0..SHARED {
        let mut next: HashMap<u64, u64> = HashMap::new();
        for &(key, old, new) in log.iter().filter(|e| e.0 == k) {
            assert!(next.insert(old, new).is_none(), "two replaces of the same version of key {key}");
        }
        let mut pba = shared_pba(k, 0);
        while let Some(&n) = next.get(&pba) {
            pba = n;
        }
        assert_eq!(shared_entry(&idx, k), vec![pba], "key {k}");
    }
    idx.check_hints();
}

#[test]
fn concurrent_inserts_and_lookups() {
    let idx = std::sync::Arc::new(small(5));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let idx = idx.clone();
            std::thread::spawn(move || {
                for i in 0..2000u64 {
                    let pba = t * 1_000_000 + i;
                    let hash = spread(pba + 1);
                    idx.insert(hash, 1, pba).unwrap();
                    assert!(pbas_racy(&idx, hash).contains(&pba));
                    assert!(idx.contains(hash, pba));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(idx.stats().entries, 8000);
    for t in 0..4u64 {
        for i in 0..2000u64 {
            let pba = t * 1_000_000 + i;
            assert!(pbas(&idx, spread(pba + 1)).contains(&pba));
        }
    }
}

/// A well-spread 64-bit hash of the integer `k`: the first output of the
/// generator seeded with `k`. Not a bijection, but a collision among the
/// under a million `k`s a test uses is a chance of about 1 in 10^7, and it
/// would show as a failure on every run, not a flaky one.
fn spread(k: u64) -> u64 {
    Pcg64Mcg::seed_from_u64(k).random()
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u64),
    Remove(usize),
    Replace(usize),
}

proptest! {
    /// The index against a model map of pba -> hash, with hashes drawn from a
    /// small space so that homes and tags collide.
    #[test]
    fn model(ops in proptest::collection::vec(prop_oneof![
        (0u64..4096).prop_map(Op::Insert),
        any::<usize>().prop_map(Op::Remove),
        any::<usize>().prop_map(Op::Replace),
    ], 1..400)) {
        let idx = small(5);
        let mut model: Vec<(u64, u64)> = Vec::new(); // (hash, pba)
        let mut next_pba = 0;
        for op in ops {
            match op {
                Op::Insert(x) => {
                    let hash = h(x & 63, (x >> 6) as u8 & 0x3f);
                    idx.insert(hash, 1, next_pba).unwrap();
                    model.push((hash, next_pba));
                    next_pba += 1;
                }
                Op::Remove(i) if !model.is_empty() => {
                    let (hash, pba) = model.swap_remove(i % model.len());
                    prop_assert!(idx.remove(hash, pba));
                }
                Op::Replace(i) if !model.is_empty() => {
                    let i = i % model.len();
                    let (hash, pba) = model[i];
                    prop_assert!(idx.replace(hash, pba, 3, next_pba));
                    model[i].1 = next_pba;
                    next_pba += 1;
                }
                _ => {}
            }
        }
        prop_assert_eq!(idx.stats().entries, model.len() as u64);
        for (hash, pba) in &model {
            let want: Vec<u64> = {
                let mut v: Vec<u64> = model.iter().filter(|(h2, _)| h2 == hash).map(|(_, p)| *p).collect();
                v.sort();
                v
            };
            let mut got = pbas(&idx, *hash);
            got.sort();
            prop_assert_eq!(&got, &want, "hash {:#x} pba {}", hash, pba);
        }
        idx.check_hints();
    }
}

/// At the largest directory, entries whose neighbourhood is full go to the
/// stash; every operation still finds them, and the index fills far beyond
/// what linear neighbourhoods of 32 allow on their own.
#[test]
fn stash_takes_overflow_at_the_largest_directory() {
    let idx = Index::new(IndexConfig {
        table_homes: HOMES,
        region_log2: 5,
        initial_tables_log2: 8,
        grow_load_percent: 0,
        access_words: false,
    });
    let slots = 256 * (HOMES as u64 + 31);
    let mut all = Vec::new();
    let mut rng = Pcg64Mcg::seed_from_u64(99);
    while (all.len() as u64) < slots * 96 / 100 {
        let x: u64 = rng.random();
        idx.insert(x, 1, all.len() as u64).unwrap();
        all.push(x);
    }
    let st = idx.stats();
    assert!(st.stashed > 0, "96% occupancy must overflow some neighbourhood: {st:?}");
    assert_eq!(st.grows, 0);
    for (pba, h) in all.iter().enumerate() {
        assert!(pbas(&idx, *h).contains(&(pba as u64)), "entry {pba} lost");
    }
    let mut visited = 0;
    idx.for_each(|home, e| {
        assert_eq!(home, idx.home(all[e.pba() as usize]));
        visited += 1;
    });
    assert_eq!(visited, all.len());
    // Replace and remove every entry: stashed ones included.
    for (pba, h) in all.iter().enumerate() {
        assert!(idx.replace(*h, pba as u64, 2, pba as u64 + 1_000_000));
    }
    for (pba, h) in all.iter().enumerate() {
        assert!(idx.remove(*h, pba as u64 + 1_000_000));
    }
    assert_eq!((idx.stats().entries, idx.stats().stashed), (0, 0));
}

/// With the default growth load, isolated overflows are stashed instead of
/// doubling the index; growth comes once the load is reached, and stashed
/// entries migrate with their region.
#[test]
fn growth_follows_load_and_migrates_stashed_entries() {
    let idx = Index::new(IndexConfig { region_log2: 5, ..IndexConfig::new(HOMES) });
    // 40 keys with one home: 32 in the neighbourhood, 8 stashed; the table
    // is far below the growth load, so no grow.
    let mut all: Vec<(u64, u64)> = (0..40u64).map(|i| (h(60, i as u8), i)).collect();
    for (hash, pba) in &all {
        idx.insert(*hash, 1, *pba).unwrap();
    }
    assert_eq!((idx.stats().grows, idx.stats().stashed), (0, 8));
    // Fill past the load: the directory grows and migrations move the
    // stashed entries into the (now roomier) new tables.
    let mut rng = Pcg64Mcg::seed_from_u64(5);
    while idx.stats().grows < 3 {
        let x: u64 = rng.random();
        idx.insert(x, 1, 1000 + all.len() as u64).unwrap();
        all.push((x, 1000 + all.len() as u64));
    }
    for (hash, pba) in &all {
        assert!(pbas(&idx, *hash).contains(pba), "lost {pba}");
    }
    let mut n = 0;
    idx.for_each(|_, _| n += 1);
    assert_eq!(n, all.len());
    let st = idx.stats();
    let load = st.entries as f64 / st.slots as f64;
    assert!(load > 0.4, "grew only when loaded: {st:?}");
}

/// A checkpoint walk concurrent with displacing inserts and replaces sees
/// every key present throughout exactly once, and an index rebuilt from it
/// with `hash_for` answers like the original.
#[test]
fn snapshot_sees_each_key_once_under_concurrent_displacement() {
    const N: u64 = 4096;
    let idx = Index::new(IndexConfig {
        table_homes: N as u32,
        region_log2: 5,
        initial_tables_log2: 1,
        grow_load_percent: 100,
        access_words: false,
    });
    let h = |home: u64, tag: u8| ((home << SLOT_BITS).div_ceil(N)) | ((tag as u64) << SLOT_BITS);
    // Stable keys: unique (home, tag 1); dense so inserts displace them.
    let stable: Vec<u64> = (0..N).filter(|i| i % 8 != 0).map(|i| h(i, 1)).collect();
    for (i, &k) in stable.iter().enumerate() {
        idx.insert(k, 1, i as u64).unwrap();
    }
    for round in 0..20u64 {
        let stop = std::sync::atomic::AtomicBool::new(false);
        let mut seen: HashMap<(usize, u8), u32> = HashMap::new();
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut rng = Pcg64Mcg::seed_from_u64(round + 1);
                let mut noise = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let x: u64 = rng.random();
                    // Near region boundaries, in the stable keys' table (odd tags).
                    let home = 256 * (1 + x % 8) - 6 + (x >> 8) % 6;
                    let k = h(home, 3 + 2 * ((x >> 40) as u8 % 100));
                    if idx.insert(k, 1, 1_000_000 + x % 1_000_000).is_ok() {
                        noise.push((k, 1_000_000 + x % 1_000_000));
                    }
                    let i = (x >> 20) as usize % stable.len();
                    let cur = idx.lookup(stable[i]).as_slice().iter().find(|e| e.tag() == 1).unwrap().pba();
                    assert!(idx.replace(stable[i], cur, 1, cur + 10_000));
                    if noise.len() > 250 {
                        for (k, p) in noise.drain(..) {
                            assert!(idx.remove(k, p));
                        }
                    }
                }
                for (k, p) in noise.drain(..) {
                    assert!(idx.remove(k, p));
                }
            });
            idx.for_each(|home, e| {
                if e.tag() == 1 {
                    *seen.entry((home, e.tag())).or_default() += 1;
                }
            });
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        assert_eq!(seen.len(), stable.len(), "round {round}: every stable key seen");
        assert!(seen.values().all(|&c| c == 1), "round {round}: a key seen twice");
    }
    // Rebuild from a quiet snapshot.
    let mut items = Vec::new();
    let log2 = idx.for_each(|home, e| items.push((home, e)));
    let copy = Index::new(IndexConfig::with_tables(N as u32, log2));
    for &(home, e) in &items {
        copy.insert(copy.hash_for(home, e.key_tag()), e.kv_size() as u64, e.pba()).unwrap();
    }
    for &k in &stable {
        assert_eq!(pbas(&copy, k), pbas(&idx, k));
    }
    assert_eq!(copy.stats().entries, idx.stats().entries);
    // And by putting entries back where they were, in two halves from two threads.
    let copy = Index::new(IndexConfig::with_tables(N as u32, log2));
    let (a, b) = items.split_at(items.len() / 2);
    std::thread::scope(|s| {
        s.spawn(|| copy.restore_batch(a).unwrap());
        s.spawn(|| copy.restore_batch(b).unwrap());
    });
    for &k in &stable {
        assert_eq!(pbas(&copy, k), pbas(&idx, k));
    }
    assert_eq!(copy.stats().entries, idx.stats().entries);
    let mut again = Vec::new();
    copy.for_each(|home, e| again.push((home, e)));
    assert_eq!(again, items, "every entry back in its slot");
}

/// With the full directory (256 tables) every tag bit picks the table, so
/// without the fp bits each key's lookup would return every entry sharing
/// its home (about the table's load); the 4 fp bits cut that by 16x. Each
/// candidate costs the store a device read.
#[test]
fn fp_bits_filter_candidates_when_tags_pick_tables() {
    const HOMES_PER_TABLE: u32 = 1024;
    let idx = Index::new(IndexConfig {
        table_homes: HOMES_PER_TABLE,
        region_log2: 10,
        initial_tables_log2: TABLES_LOG2_MAX,
        grow_load_percent: 85,
        access_words: false,
    });
    let keys = 256 * HOMES_PER_TABLE as u64 / 2; // load 0.5
    for k in 0..keys {
        idx.insert(spread(k + 1), 1, k).unwrap();
    }
    let probes = 50_000u64;
    let false_candidates: usize = (0..probes).map(|k| idx.lookup(spread(k + 10_000_000)).as_slice().len()).sum();
    let per_lookup = false_candidates as f64 / probes as f64;
    // Expected about 0.5 / 16 = 0.03; 0.5 without the fp bits.
    assert!(per_lookup < 0.1, "{per_lookup:.3} false candidates per lookup of an absent key");
    // Present keys are all found, and mostly alone.
    let found: usize = (0..10_000u64).map(|k| idx.lookup(spread(k + 1)).as_slice().len()).sum();
    assert!((10_000..11_000).contains(&found), "{found} candidates for 10000 present keys");
}

/// Large tables are mappings (huge pages requested), small ones heap
/// allocations; both start with every slot free and take writes.
#[test]
fn large_tables_are_mapped_and_small_ones_allocated() {
    for homes in [1000usize, 600_000] {
        let t = crate::table::Table::new(homes, 13, false);
        assert_eq!(t.len(), homes + NEIGHBOURHOOD - 1);
        assert!((0..t.len()).step_by(997).all(|s| t.get(s).is_free()));
        let e = Entry::new(0, 0x123, 1, 42);
        t.set(homes - 1, e);
        assert_eq!(t.get(homes - 1), e);
        assert_eq!(t.is_mapped(), homes * 8 >= crate::table::HUGE_PAGE_BYTES);
    }
}

/// A table made by `Index::new` is faulted in there, not by the inserts
/// that follow; `Table::new` alone (as a grow makes its tables) leaves it
/// lazy. Skipped on kernels without `MADV_POPULATE_WRITE` (before 5.14),
/// where tables stay lazy.
#[cfg(not(miri))]
#[test]
fn tables_are_populated_off_the_insert_path() {
    use crate::table::Table;
    if !Table::kernel_populates() {
        eprintln!("MADV_POPULATE_WRITE not supported by this kernel: skipped");
        return;
    }
    let homes = 3 * crate::table::HUGE_PAGE_BYTES / 8; // 6 MiB of slots
    let lazy = Table::new(homes, 13, false);
    let (resident, pages) = lazy.resident_pages();
    assert!(pages >= 1536);
    assert!(resident < pages / 4, "a new table is lazy: {resident} of {pages} pages resident");

    let idx = Index::new(IndexConfig::with_tables(homes as u32, 1));
    for t in idx.tables() {
        let (resident, pages) = t.resident_pages();
        assert_eq!(resident, pages, "Index::new populates its tables");
    }
}

#[derive(Debug, Clone)]
enum AuxOp {
    Insert(u64, u32),
    Remove(usize),
    /// Replace keeping the word (a relocation), or setting a new one.
    Replace(usize, Option<u32>),
    /// `access` adding this to the word.
    Access(usize, u32),
}

/// An index with access words, small enough to grow and stash.
fn small_aux(grow_load_percent: u64) -> Index {
    Index::new(IndexConfig {
        table_homes: HOMES,
        region_log2: 5,
        initial_tables_log2: 0,
        grow_load_percent,
        access_words: true,
    })
}

proptest! {
    /// Access words follow their entries through displacement, growth
    /// (migration) and the stash: every entry's word matches a model.
    #[test]
    fn access_words_follow_entries(grow in prop_oneof![Just(0u64), Just(85u64)], ops in proptest::collection::vec(prop_oneof![
        3 => ((0u64..4096), any::<u32>()).prop_map(|(x, a)| AuxOp::Insert(x, a)),
        1 => any::<usize>().prop_map(AuxOp::Remove),
        1 => (any::<usize>(), proptest::option::of(any::<u32>())).prop_map(|(i, a)| AuxOp::Replace(i, a)),
        1 => (any::<usize>(), 1u32..1000).prop_map(|(i, d)| AuxOp::Access(i, d)),
    ], 1..500)) {
        let idx = small_aux(grow);
        let mut model: Vec<(u64, u64, u32)> = Vec::new(); // (hash, pba, word)
        let mut next_pba = 0;
        for op in ops {
            match op {
                AuxOp::Insert(x, a) => {
                    // Few homes, many tags: dense neighbourhoods displace.
                    let hash = h(x & 15, (x >> 4) as u8);
                    idx.insert_with(hash, 1, next_pba, a).unwrap();
                    model.push((hash, next_pba, a));
                    next_pba += 1;
                }
                AuxOp::Remove(i) if !model.is_empty() => {
                    let (hash, pba, _) = model.swap_remove(i % model.len());
                    prop_assert!(idx.remove(hash, pba));
                }
                AuxOp::Replace(i, a) if !model.is_empty() => {
                    let i = i % model.len();
                    let (hash, pba, old) = model[i];
                    let mut seen = None;
                    let replaced = idx.replace_with(hash, pba, 1, next_pba, |w| {
                        seen = Some(w);
                        a.unwrap_or(w)
                    });
                    prop_assert!(replaced);
                    prop_assert_eq!(seen, Some(old));
                    model[i] = (hash, next_pba, a.unwrap_or(old));
                    next_pba += 1;
                }
                AuxOp::Access(i, d) if !model.is_empty() => {
                    let i = i % model.len();
                    let (hash, pba, old) = model[i];
                    prop_assert_eq!(idx.access(hash, pba, |w| w.wrapping_add(d)), Some(old));
                    model[i].2 = old.wrapping_add(d);
                }
                _ => {}
            }
        }
        for &(hash, pba, word) in &model {
            prop_assert_eq!(idx.access(hash, pba, |w| w), Some(word), "hash {:#x} pba {}", hash, pba);
        }
        prop_assert_eq!(idx.access(h(1, 1), u64::MAX >> 30, |w| w), None);
    }
}

/// Without access words, `access` answers None and tables carry no array.
#[test]
fn access_words_are_off_by_default() {
    let idx = small(5);
    idx.insert_with(h(1, 1), 1, 7, 42).unwrap();
    assert_eq!(idx.access(h(1, 1), 7, |w| w + 1), None);
    let with = small_aux(0);
    with.insert_with(h(1, 1), 1, 7, 42).unwrap();
    assert_eq!(with.stats().memory_bytes, idx.stats().memory_bytes + (HOMES as u64 + 31) * 4);
}

/// Concurrent accessors and inserters while the directory grows: every
/// thread's words end as it left them.
#[test]
fn access_words_survive_concurrent_growth() {
    let idx = std::sync::Arc::new(Index::new(IndexConfig {
        table_homes: 1024,
        region_log2: 7,
        initial_tables_log2: 0,
        grow_load_percent: 85,
        access_words: true,
    }));
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let idx = idx.clone();
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..20_000u64 {
                    let pba = t << 30 | i;
                    let hash = spread(pba + 1);
                    idx.insert_with(hash, 1, pba, i as u32).unwrap();
                    mine.push((hash, pba, i as u32));
                    // Touch an earlier entry of ours while others move it.
                    let j = (spread(i) % mine.len() as u64) as usize;
                    let (hh, pp, w) = mine[j];
                    assert_eq!(idx.access(hh, pp, |x| x + 1), Some(w), "thread {t} entry {j}");
                    mine[j].2 = w + 1;
                }
                for (hash, pba, w) in mine {
                    assert_eq!(idx.access(hash, pba, |x| x), Some(w));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(idx.stats().grows >= 4, "{:?}", idx.stats());
}

/// `insert_if_no_candidates` inserts a hash without candidates, and for
/// one with candidates (same home and key tag) inserts nothing and returns
/// them, stashed ones and those of a region mid-migration included.
#[test]
fn insert_if_no_candidates_inserts_or_returns_them() {
    let idx = small(5);
    assert!(idx.insert_if_no_candidates(h(3, 7), 1, 100).unwrap().is_none());
    let c = idx.insert_if_no_candidates(h(3, 7), 1, 101).unwrap().expect("a candidate");
    assert_eq!(c.as_slice().iter().map(|e| e.pba()).collect::<Vec<_>>(), vec![100]);
    assert_eq!(pbas(&idx, h(3, 7)), vec![100], "nothing inserted");
    assert!(idx.insert_if_no_candidates(h(3, 8), 1, 102).unwrap().is_none());
    assert_eq!(idx.stats().entries, 2);
    // Fill the neighbourhood until the index grows, then ask again: the
    // answer comes from the migrated regions.
    let mut pba = 200;
    while idx.stats().grows == 0 {
        idx.insert(h(3, 9), 1, pba).unwrap();
        pba += 1;
    }
    let c = idx.insert_if_no_candidates(h(3, 7), 1, 999).unwrap().expect("still a candidate");
    assert_eq!(c.as_slice().len(), 1);
    assert!(idx.insert_if_no_candidates(h(3, 10), 1, 1000).unwrap().is_none());
    assert_eq!(pbas(&idx, h(3, 10)), vec![1000]);
}

/// The vector neighbourhood scan agrees with the scalar one on every slot
/// kind: free slots (stored 0, which looks like offset 0 and key tag 0),
/// entries of the home at their offset, entries of other homes (another
/// offset), other key tags, and entries whose pba bits are all ones or zero.
#[test]
fn vector_and_scalar_neighbourhood_scans_agree() {
    use crate::table::{hood_mask, hood_mask_scalar};
    use std::sync::atomic::AtomicU64;
    let mut rng = Pcg64Mcg::seed_from_u64(0x5EED_1234);
    for round in 0..20_000 {
        // Key tags drawn from a few values (0 and the largest included),
        // so that many slots match.
        let x: u64 = rng.random();
        let ktag = [0u16, 1, 0xFFF, (x >> 20) as u16 & 0xFFF][(x % 4) as usize];
        let hood: [AtomicU64; NEIGHBOURHOOD] = std::array::from_fn(|off| {
            let x: u64 = rng.random();
            // Any slot may carry a hop hint (of the home it is); the scan
            // ignores it, and a free slot with one is still free.
            let hint = (x >> 61) << crate::entry::HINT_SHIFT;
            let e = match x % 6 {
                0 => Entry::FREE,
                1 => Entry::new(off as u32, ktag, x >> 40, x >> 28 & 0xF_FFFF_FFFF),
                2 => Entry::new((x >> 8) as u32 % 32, ktag, 1, 5),
                3 => Entry::new(off as u32, (x >> 12) as u16 & 0xFFF, 1, 7),
                4 => Entry::new(off as u32, ktag, 0, granary_format::limits::PBA_MAX),
                _ => Entry::new(off as u32, ktag, 0, 0),
            };
            AtomicU64::new((e.0 ^ Entry::FREE.0) | (hint & crate::entry::HINT_MASK))
        });
        let want = hood_mask_scalar(&hood, ktag);
        // The scalar mask is itself checked against the entry accessors.
        for (off, slot) in hood.iter().enumerate() {
            let stored = slot.load(std::sync::atomic::Ordering::Relaxed);
            let e = Entry((stored & !crate::entry::HINT_MASK) ^ Entry::FREE.0);
            let hit = !e.is_free() && e.neigh_off() as usize == off && e.key_tag() == ktag;
            assert_eq!(want >> off & 1 == 1, hit, "round {round}, offset {off}, entry {e:?}");
        }
        assert_eq!(hood_mask(&hood, ktag), want, "round {round}, key tag {ktag:#x}");
    }
    #[cfg(target_arch = "x86_64")]
    if !std::is_x86_feature_detected!("avx2") {
        eprintln!("no AVX2 on this CPU: only the scalar scan was checked");
    }
}

/// A table's slots for `hinted_scans...`: random entries placed at their
/// offsets, hints set to what the entries need (or more), padded to lines.
fn hinted_slots(rng: &mut Pcg64Mcg, n: usize, ktags: &[u16]) -> LineSlots {
    use crate::entry::{HINT_MASK, HINT_SHIFT};
    use crate::table::hint_need;
    use std::sync::atomic::Ordering::Relaxed;
    let len = n + NEIGHBOURHOOD - 1;
    let slots = LineSlots::new(len);
    let mut need = vec![0u64; len];
    for (s, slot) in slots.iter().enumerate().take(len) {
        let x: u64 = rng.random();
        if x.is_multiple_of(3) {
            continue; // free
        }
        let off = ((x >> 8) as usize % NEIGHBOURHOOD).min(s);
        let home = s - off;
        if home >= n {
            continue; // slots past the last home hold only earlier homes' entries
        }
        let ktag = ktags[(x >> 16) as usize % ktags.len()];
        let e = Entry::new(off as u32, ktag, (x >> 40) & 7, (x >> 24) & 0xFFFF);
        slot.store(e.0 ^ Entry::FREE.0, Relaxed);
        need[home] = need[home].max(hint_need(home, s));
    }
    for (home, &want) in need.iter().enumerate() {
        let x: u64 = rng.random();
        // Sometimes more than needed: a hint is an upper bound.
        let hint = if x.is_multiple_of(5) { 3 } else { want };
        let w = slots[home].load(Relaxed);
        slots[home].store((w & !HINT_MASK) | (hint << HINT_SHIFT), Relaxed);
    }
    slots
}

/// This project's machines are Intel or AMD, where the seqlock-free first
/// pass of `contains` runs (so the tests exercise it).
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[test]
fn the_vendor_check_knows_this_machine() {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let known = cpuinfo.contains("GenuineIntel") || cpuinfo.contains("AuthenticAMD");
    assert_eq!(crate::table::aligned_16_byte_loads_are_atomic(), known);
}

/// Free slots on whole cache lines, 64-byte aligned like a table's (the
/// vector scans load aligned lines).
struct LineSlots(Vec<Line>);

#[repr(C, align(64))]
struct Line([std::sync::atomic::AtomicU64; crate::table::LINE_SLOTS]);

impl LineSlots {
    /// At least `len` free slots, whole lines.
    fn new(len: usize) -> LineSlots {
        use crate::table::LINE_SLOTS;
        LineSlots((0..len.div_ceil(LINE_SLOTS)).map(|_| Line(Default::default())).collect())
    }
}

impl std::ops::Deref for LineSlots {
    type Target = [std::sync::atomic::AtomicU64];
    fn deref(&self) -> &Self::Target {
        // SAFETY: `Line` is `repr(C)`, its only field an array of
        // LINE_SLOTS atomics with no padding (8 x 8 bytes = its 64-byte
        // alignment), so the lines are that many atomics back to back.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), self.0.len() * crate::table::LINE_SLOTS) }
    }
}

/// The hinted scan (vector and scalar) finds exactly what the whole
/// neighbourhood scan finds, for every home of tables of random entries at
/// every alignment, when hints hold their invariant; and it does read only
/// the lines a hint names (a hint set too low hides the entries past it).
#[test]
fn hinted_scans_agree_with_whole_neighbourhood_scans() {
    use crate::entry::{HINT_MASK, HINT_SHIFT};
    use crate::table::{hinted_mask, hinted_mask_scalar, hood_mask, LINE_SLOTS};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let mut rng = Pcg64Mcg::seed_from_u64(0xC0FFEE);
    let ktags = [0u16, 1, 0xFFF, 0x123];
    for round in 0..200 {
        let n = 1 + (spread(round + 1) % 200) as usize;
        let slots = hinted_slots(&mut rng, n, &ktags);
        for home in 0..n {
            let hood: &[AtomicU64; NEIGHBOURHOOD] = slots[home..home + NEIGHBOURHOOD].try_into().unwrap();
            for &ktag in &ktags {
                let want = hood_mask(hood, ktag);
                assert_eq!(hinted_mask_scalar(&slots, home, ktag), want, "round {round}, home {home}, ktag {ktag:#x}");
                assert_eq!(hinted_mask(&slots, home, ktag), want, "round {round}, home {home}, ktag {ktag:#x}");
            }
        }
    }
    // A hint of 1 reads two lines: an entry two lines further is not seen
    // until the hint says 2.
    // (This is why every write keeps the hints.)
    let slots = LineSlots::new(48);
    let home = 8;
    let far = Entry::new(2 * LINE_SLOTS as u32, 0x42, 1, 9);
    slots[home + 2 * LINE_SLOTS].store(far.0 ^ Entry::FREE.0, Relaxed);
    slots[home].store(1 << HINT_SHIFT, Relaxed);
    assert_eq!(slots[home].load(Relaxed) & !HINT_MASK, 0, "the home slot is still free");
    assert_eq!(hinted_mask(&slots, home, 0x42), 0);
    assert_eq!(hinted_mask_scalar(&slots, home, 0x42), 0);
    slots[home].store(2 << HINT_SHIFT, Relaxed);
    assert_eq!(hinted_mask(&slots, home, 0x42), 1 << (2 * LINE_SLOTS));
    assert_eq!(hinted_mask_scalar(&slots, home, 0x42), 1 << (2 * LINE_SLOTS));
}

/// Hints follow the entries of a home: raised by inserts (and by the
/// displacements that push entries further), lowered when the entry that
/// needed the most is removed, and only then.
#[test]
fn hop_hints_rise_with_inserts_and_fall_with_removes() {
    let idx = small(7);
    // Home 16 starts a line. 8 entries fill its line; the 9th goes to the
    // next line, the 17th to the third, the 25th to the fourth.
    let mut hints = Vec::new();
    for i in 0..32u64 {
        idx.insert(h(16, 1 + i as u8), 1, i).unwrap();
        hints.push(idx.hint_of(h(16, 1)));
    }
    assert_eq!(&hints[..8], &[0; 8]);
    assert_eq!(&hints[8..16], &[1; 8]);
    assert_eq!(&hints[16..24], &[2; 8]);
    assert_eq!(&hints[24..], &[3; 8]);
    idx.check_hints();
    // Removing an entry of the first line leaves the hint; removing the
    // furthest ones lowers it to what the rest need.
    assert!(idx.remove(h(16, 1), 0));
    assert_eq!(idx.hint_of(h(16, 1)), 3);
    for i in (8..32u64).rev() {
        assert!(idx.remove(h(16, 1 + i as u8), i));
    }
    assert_eq!(idx.hint_of(h(16, 1)), 0);
    for i in 1..8u64 {
        assert_eq!(pbas(&idx, h(16, 1 + i as u8)), vec![i]);
    }
    idx.check_hints();
}

/// A table filled to 95% by random keys (no growth: the rest is stashed)
/// displaces entries far from their homes; every hint still covers its
/// home's entries, and every key is found through them.
#[test]
fn hop_hints_hold_in_a_densely_displaced_table() {
    for seed in 1..=20u64 {
        let idx = Index::new(IndexConfig {
            table_homes: HOMES,
            region_log2: 5,
            initial_tables_log2: 0,
            grow_load_percent: 100,
            access_words: false,
        });
        let slots = HOMES as u64 + 31;
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        let mut all = Vec::new();
        for pba in 0..slots * 95 / 100 {
            let x: u64 = rng.random();
            let hash = h(x % HOMES as u64, (x >> 20) as u8 & 1);
            if idx.insert(hash, 1, pba).is_ok() {
                all.push((hash, pba));
            }
        }
        assert_eq!(idx.stats().tables, 1, "seed {seed}: no growth");
        idx.check_hints();
        for (hash, pba) in &all {
            assert!(pbas(&idx, *hash).contains(pba), "seed {seed}: pba {pba} lost");
        }
        // Removing half keeps them right too.
        for (hash, pba) in all.iter().step_by(2) {
            assert!(idx.remove(*hash, *pba));
        }
        idx.check_hints();
        for (hash, pba) in all.iter().skip(1).step_by(2) {
            assert!(pbas(&idx, *hash).contains(pba), "seed {seed}: pba {pba} lost after removes");
        }
    }
}

/// Hints stay exact through inserts, displacements and growth: a split
/// recomputes the hints of the homes whose neighbourhood lies inside the
/// region it migrates, so only homes within H of a region's end may keep
/// the (larger) hint of the table before the split.
#[test]
fn hop_hints_are_exact_after_growth_but_at_region_ends() {
    let idx = small(7); // 128-slot regions: 2 per table
    let mut rng = Pcg64Mcg::seed_from_u64(99);
    let mut all = Vec::new();
    for pba in 0..4000u64 {
        let x: u64 = rng.random();
        idx.insert(x >> 7, 1, pba).unwrap();
        all.push((x >> 7, pba));
    }
    assert!(idx.stats().grows >= 4, "{:?}", idx.stats());
    idx.check_hints();
    let loose = idx.loose_hints();
    for &(t, home) in &loose {
        let region_end = (home / 128 + 1) * 128;
        assert!(home + NEIGHBOURHOOD > region_end, "table {t}: home {home}'s hint is loose, far from a region end");
    }
    for (hash, pba) in &all {
        assert!(pbas(&idx, *hash).contains(pba));
    }
}

/// The share of entries beyond their home's first two lines (what a lookup
/// reads before the hop hint), in an index filled to the benchmark's
/// sizing: grown from one table to 16 and pre-sized for 16. Since
/// migrations move entries toward their homes, the grown index is not
/// more displaced than the pre-sized one (without those moves it is about
/// twice as much: 11.7% against 6.1% with 4 M keys). Prints both:
/// `cargo test --release -p granary-index no_more_displaced -- --nocapture`.
#[test]
fn a_grown_index_is_no_more_displaced_than_a_presized_one() {
    let items = 400_000u64;
    let homes = ((items as f64 / 16.0 / 0.85) as u64 + 1) as u32;
    let share = |presized: bool| {
        let idx = Index::new(IndexConfig::with_tables(homes, if presized { 4 } else { 0 }));
        for i in 0..items {
            idx.insert(spread(i + 1), 1, i).unwrap();
        }
        idx.check_hints(); // finishes any migration
        let (mut far, mut n) = (0u64, 0u64);
        for t in idx.tables() {
            for s in 0..t.len() {
                let e = t.get(s);
                if !e.is_free() {
                    n += 1;
                    far += (s / 8 - (s - e.neigh_off() as usize) / 8 >= 2) as u64;
                }
            }
        }
        far as f64 / n as f64
    };
    let (presized, grown) = (share(true), share(false));
    eprintln!("beyond two lines: pre-sized {:.2}%, grown {:.2}%", presized * 100.0, grown * 100.0);
    assert!(grown <= presized * 1.2, "grown {grown:.4} against pre-sized {presized:.4}");
}

/// Walks of ranges of homes, one after another, with inserts between them
/// that grow the directory (and a stash): every entry present throughout
/// is visited exactly once, with its home, by the range holding its home;
/// a quiet index's ranges together are `for_each`.
#[test]
fn walks_of_home_ranges_see_every_entry_once_across_grows() {
    let idx = Index::new(IndexConfig { region_log2: 5, ..IndexConfig::new(HOMES) });
    let mut rng = Pcg64Mcg::seed_from_u64(17);
    let mut all: Vec<u64> = Vec::new();
    for _ in 0..300 {
        let x: u64 = rng.random();
        idx.insert(x, 1, all.len() as u64).unwrap();
        all.push(x);
    }
    // 40 keys of one home: some stashed.
    for i in 0..40u64 {
        idx.insert(h(77, i as u8), 1, all.len() as u64).unwrap();
        all.push(h(77, i as u8));
    }
    assert!(idx.stats().stashed > 0);
    let present = all.len();
    let grows = idx.stats().grows;
    let mut seen = vec![0u32; present];
    let mut lo = 0;
    while lo < HOMES as usize {
        let hi = (lo + 1 + rng.random_range(0..9)).min(HOMES as usize);
        idx.for_each_homed(lo..hi, |home, e| {
            assert!((lo..hi).contains(&home), "home {home} outside {lo}..{hi}");
            if (e.pba() as usize) < present {
                assert_eq!(home, idx.home(all[e.pba() as usize]));
                seen[e.pba() as usize] += 1;
            }
        });
        for _ in 0..40 {
            let x: u64 = rng.random();
            idx.insert(x, 1, all.len() as u64).unwrap();
            all.push(x);
        }
        lo = hi;
    }
    assert!(idx.stats().grows > grows, "no grow between the walks");
    assert!(seen.iter().all(|&n| n == 1), "an entry seen {:?} times", seen.iter().find(|&&n| n != 1));
    // Quiet: the ranges' walks are the whole walk.
    let mut whole = Vec::new();
    idx.for_each(|home, e| whole.push((home, e.pba())));
    let mut ranges = Vec::new();
    for lo in (0..HOMES as usize).step_by(5) {
        idx.for_each_homed(lo..lo + 5, |home, e| ranges.push((home, e.pba())));
    }
    idx.for_each_homed(HOMES as usize..usize::MAX, |_, _| panic!("no home past the last"));
    whole.sort_unstable();
    ranges.sort_unstable();
    assert_eq!(ranges, whole);
    assert_eq!(idx.entries(), whole.len() as u64);
}

/// Walks of ranges of homes concurrent with a writer that inserts (growing
/// the directory), displaces, and replaces the entries of stable keys:
/// every walk sees each stable key homed in its range exactly once, and
/// no other.
#[test]
fn walks_of_home_ranges_under_concurrent_writers_and_grows() {
    let (mut grown, mut walks) = (0, 0);
    for round in 0..10u64 {
        let idx = Index::new(IndexConfig { region_log2: 5, ..IndexConfig::new(HOMES) });
        let mut rng = Pcg64Mcg::seed_from_u64(round);
        // Stable key i: pba i * 1000 + its version (below 1000).
        let stable: Vec<u64> = (0..150).map(|_| rng.random()).collect();
        for (i, &k) in stable.iter().enumerate() {
            idx.insert(k, 1, i as u64 * 1000).unwrap();
        }
        let stop = std::sync::atomic::AtomicBool::new(false);
        let inserted = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut rng = Pcg64Mcg::seed_from_u64(round + 100);
                let mut version = vec![0u64; stable.len()];
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 20_000 {
                    let x: u64 = rng.random();
                    idx.insert(x, 1, 1_000_000 + n).unwrap();
                    let i = (x >> 32) as usize % stable.len();
                    let cur = i as u64 * 1000 + version[i];
                    version[i] = (version[i] + 1) % 1000;
                    assert!(idx.replace(stable[i], cur, 1, i as u64 * 1000 + version[i]));
                    n += 1;
                    inserted.store(n, std::sync::atomic::Ordering::Relaxed);
                }
            });
            let grows = idx.stats().grows;
            let mut lo = 0;
            while lo < HOMES as usize {
                let hi = (lo + 3).min(HOMES as usize);
                let want: Vec<usize> = (0..stable.len()).filter(|&i| (lo..hi).contains(&idx.home(stable[i]))).collect();
                // The range walked again and again while the writer inserts
                // some 300 entries: the directory grows during walks.
                loop {
                    let mut seen = Vec::new();
                    idx.for_each_homed(lo..hi, |home, e| {
                        if e.pba() < 1_000_000 {
                            assert!((lo..hi).contains(&home));
                            seen.push((e.pba() / 1000) as usize);
                        }
                    });
                    seen.sort_unstable();
                    assert_eq!(seen, want, "round {round}, homes {lo}..{hi}");
                    walks += 1;
                    if inserted.load(std::sync::atomic::Ordering::Relaxed) >= 100 * hi as u64 {
                        break;
                    }
                }
                lo = hi;
            }
            grown += idx.stats().grows - grows;
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }
    assert!(grown > 0, "no grow during the walks ({walks} walks)");
}

/// A checkpoint entry at a home past the table's (a damaged checkpoint;
/// the store refuses such a checkpoint first) neither hangs a batch
/// restore nor lands in a slot no hash reaches: it goes through the
/// checked path like any entry that cannot take its slot.
#[test]
fn a_restored_home_past_the_table_neither_hangs_nor_hides() {
    for homes in [128u32, 100] {
        let idx = std::sync::Arc::new(Index::new(IndexConfig { region_log2: 5, ..IndexConfig::new(homes) }));
        let (tx, rx) = std::sync::mpsc::channel();
        let e = Entry::new(0, 0x090, 1, 7);
        let bad = homes as usize + 10;
        let i2 = idx.clone();
        // A thread of its own: one that never returns is left behind and
        // the test fails.
        std::thread::spawn(move || tx.send(i2.restore_batch(&[(3, Entry::new(0, 0x091, 1, 8)), (bad, e)])));
        let r = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("restore_batch returned");
        r.unwrap();
        assert_eq!(idx.entries(), 2);
        idx.for_each(|home, _| assert!(home < homes as usize, "{homes} homes: an entry at home {home}"));
    }
}

/// A group of one fingerprint that is full with some of its entries in the
/// stash stays full when a slot of its neighbourhood frees: the next
/// insert of it is Crowded, not placed (a 33rd entry would be one no
/// lookup returns, hiding a live key).
#[test]
fn a_full_group_with_stashed_entries_takes_no_more_when_a_slot_frees() {
    let idx = small_aux(100);
    let (a, b) = (h(5, 9), h(5, 10));
    for i in 0..20 {
        idx.insert(a, 1, i).unwrap();
    }
    for i in 0..12 {
        idx.insert(b, 1, 100 + i).unwrap();
    }
    for i in 20..32 {
        idx.insert(a, 1, i).unwrap(); // to the stash: the neighbourhood is full
    }
    assert_eq!(idx.stats().grows, 0);
    assert_eq!(pbas(&idx, a).len(), 32);
    assert!(idx.remove(b, 100), "a slot of the neighbourhood frees");
    let err = idx.insert(a, 1, 99).unwrap_err();
    assert!(matches!(err, IndexError::Crowded), "{err}");
    assert_eq!(pbas(&idx, a).len(), 32);
    idx.insert(b, 1, 200).unwrap();
}
