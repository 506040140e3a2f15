//! Unit and model tests of the index, driven by chosen hashes.

use crate::*;
use granary_format::hash::{fingerprint, SLOT_BITS};
use proptest::prelude::*;
use std::collections::HashMap;

/// A hash with the given home slot and tag.
fn h(home: u64, tag: u8) -> u64 {
    home | ((tag as u64) << SLOT_BITS)
}

fn small(table_log2: u32, region_log2: u32) -> Index {
    Index::new(IndexConfig {
        table_log2,
        region_log2,
        initial_tables_log2: 0,
    })
}

fn pbas(idx: &Index, hash: u64) -> Vec<u64> {
    idx.lookup(hash)
        .as_slice()
        .iter()
        .map(|e| e.pba())
        .collect()
}

#[test]
fn insert_lookup_replace_remove() {
    let idx = small(8, 5);
    idx.insert(h(3, 7), 2, 100).unwrap();
    idx.insert(h(3, 8), 1, 101).unwrap();
    assert_eq!(pbas(&idx, h(3, 7)), vec![100]);
    assert!(idx.replace(h(3, 7), 100, 0, 200));
    let c = idx.lookup(h(3, 7));
    assert_eq!(c.as_slice().len(), 1);
    assert!(c.as_slice()[0].is_tombstone());
    assert!(
        !idx.replace(h(3, 7), 100, 1, 300),
        "stale pba must not match"
    );
    assert!(idx.remove(h(3, 7), 200));
    assert!(pbas(&idx, h(3, 7)).is_empty());
    assert_eq!(pbas(&idx, h(3, 8)), vec![101]);
    assert_eq!(idx.stats().entries, 1);
}

/// DESIGN §10: lookup stopped at the first free slot, so a purge could hide a
/// live key. Deleting one key must never hide another in its neighbourhood.
#[test]
fn regression_hole_does_not_hide_later_entry() {
    let idx = small(8, 5);
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
    let idx = small(7, 5);
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
    assert_eq!(
        idx.stats().grows,
        0,
        "displacement, not growth, must make room"
    );
    // Every entry still within H of its home.
    idx.for_each(|_, e| assert!(e.neigh_off() < 32));
}

#[test]
fn full_neighbourhood_grows_then_reports_full_at_max_directory() {
    let idx = small(6, 5);
    // 33 keys with one home and one tag can never share a neighbourhood,
    // whatever the directory size: growth runs to 256 tables, then Full.
    for i in 0..32 {
        idx.insert(h(5, 9), 1, i).unwrap();
    }
    let err = idx.insert(h(5, 9), 1, 99).unwrap_err();
    assert!(matches!(err, IndexError::Full { tables: 256, .. }), "{err}");
    assert!(err.to_string().contains("index full"));
    let st = idx.stats();
    assert_eq!((st.tables, st.grows), (256, 8));
    assert_eq!(pbas(&idx, h(5, 9)).len(), 32);
}

#[test]
fn growth_splits_by_tag_and_keeps_every_entry() {
    let idx = small(6, 5); // 64 homes per table: grows soon
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut all = Vec::new();
    for pba in 0..3000u64 {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let hash = rng >> 7;
        idx.insert(hash, 1, pba).unwrap();
        all.push((hash, pba));
    }
    assert!(idx.stats().grows >= 4);
    for (hash, pba) in &all {
        assert!(pbas(&idx, *hash).contains(pba));
    }
    // Fingerprints rebuilt from positions match the hashes inserted.
    let mut seen: HashMap<u64, u64> = HashMap::new();
    idx.for_each(|fp, e| {
        seen.insert(e.pba(), fp);
    });
    assert_eq!(seen.len(), all.len());
    for (hash, pba) in &all {
        let want = fingerprint(hash & 63, granary_format::hash::tag(*hash));
        assert_eq!(seen[pba], want);
    }
}

#[test]
fn concurrent_inserts_and_lookups() {
    let idx = std::sync::Arc::new(small(8, 5));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let idx = idx.clone();
            std::thread::spawn(move || {
                for i in 0..2000u64 {
                    let pba = t * 1_000_000 + i;
                    let hash = xorshift(pba + 1);
                    idx.insert(hash, 1, pba).unwrap();
                    assert!(pbas(&idx, hash).contains(&pba));
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
            assert!(pbas(&idx, xorshift(pba + 1)).contains(&pba));
        }
    }
}

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
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
        let idx = small(6, 5);
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
    }
}
