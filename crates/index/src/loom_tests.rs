//! Model checks of the index's lock, seqlock and migration protocol with
//! loom: built with `--cfg loom` (the index's atomics and locks are then
//! loom's, see `sync`), run by `scripts/loom.sh`. The index is the real
//! one; only the primitives differ. Each test builds a tiny index holding
//! a few entries, lets two threads race (a lockless lookup or a writer
//! against a writer that migrates regions of a grow, or that starts the
//! grow), and checks every outcome loom can produce, up to its preemption
//! bound.
//!
//! Geometry: 64 homes and 32-slot regions, so a table has three regions
//! (slots 0-31, 32-63, 64-94); writers homed at 0 or 1 lock regions 0 and
//! 1, writers homed at 40 regions 1 and 2. After one grow, bit 0 of an
//! entry's tag picks its table: odd tags move to the new table.

use crate::*;
use granary_format::hash::SLOT_BITS;
use std::sync::Arc;

const HOMES: u32 = 64;

/// A hash with the given home slot and tag.
fn h(home: u64, tag: u8) -> u64 {
    let slot_bits = (home << SLOT_BITS).div_ceil(HOMES as u64);
    slot_bits | ((tag as u64) << SLOT_BITS)
}

/// One table holding `(home, tag, pba)` entries.
fn tiny(entries: &[(u64, u8, u64)]) -> Arc<Index> {
    let idx = Index::new(IndexConfig {
        table_homes: HOMES,
        region_log2: 5,
        initial_tables_log2: 0,
        grow_load_percent: 100,
        access_words: false,
    });
    for &(home, tag, pba) in entries {
        idx.insert(h(home, tag), 1, pba).unwrap();
    }
    Arc::new(idx)
}

fn pbas(idx: &Index, hash: u64) -> Vec<u64> {
    idx.lookup(hash).as_slice().iter().map(|e| e.pba()).collect()
}

/// Loom's settings here: a preemption bound (`LOOM_MAX_PREEMPTIONS`,
/// default 2), and room for the set-ups' many atomic operations.
fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b.max_branches = 100_000;
    b
}

/// Run `f` under loom with a preemption bound (`LOOM_MAX_PREEMPTIONS`,
/// default 2 here), and check loom explored more than one interleaving.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let b = builder();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r = runs.clone();
    let start = std::time::Instant::now();
    b.check(move || {
        let n = r.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n.is_multiple_of(100_000) && n > 0 {
            eprintln!("  {n} interleavings, {:.0?}", start.elapsed());
        }
        f()
    });
    let runs = runs.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("loom explored {runs} interleavings in {:.1?}", start.elapsed());
    // A check that ran once checked nothing.
    assert!(runs > 1, "loom explored a single interleaving");
}

/// A lockless lookup racing the migration of its regions (by a writer homed
/// next to it) finds each key exactly once: the moving one (tag 3) in the
/// old table or in the new one, never in both or neither.
#[test]
fn a_lookup_racing_the_migration_of_its_regions_finds_its_key_once() {
    model(|| {
        let idx = tiny(&[(0, 2, 1002), (0, 3, 1003)]);
        idx.start_grow();
        let writer = {
            let idx = idx.clone();
            loom::thread::spawn(move || idx.insert(h(1, 5), 1, 2005).unwrap())
        };
        assert_eq!(pbas(&idx, h(0, 3)), vec![1003], "a moving entry was missed or seen twice");
        writer.join().unwrap();
        assert_eq!(pbas(&idx, h(0, 3)), vec![1003]);
        assert_eq!(pbas(&idx, h(0, 2)), vec![1002]);
        assert_eq!(pbas(&idx, h(1, 5)), vec![2005]);
    });
}

/// A grow published while a writer in other regions replaces and removes
/// entries: every write lands once, whichever side of the grow it falls
/// on, and the grower's own insert too.
#[test]
fn writes_racing_the_start_of_a_grow_lose_nothing() {
    model(|| {
        let idx = tiny(&[(0, 2, 1002), (40, 5, 5000), (40, 6, 6000)]);
        let grower = {
            let idx = idx.clone();
            loom::thread::spawn(move || {
                idx.start_grow();
                idx.insert(h(0, 9), 1, 2009).unwrap();
            })
        };
        assert!(idx.replace(h(40, 5), 5000, 1, 5001));
        assert!(idx.remove(h(40, 6), 6000));
        grower.join().unwrap();
        let st = idx.stats();
        assert_eq!((st.tables, st.entries), (2, 3));
        assert_eq!(pbas(&idx, h(40, 5)), vec![5001]);
        assert!(pbas(&idx, h(40, 6)).is_empty());
        assert_eq!(pbas(&idx, h(0, 9)), vec![2009]);
        assert_eq!(pbas(&idx, h(0, 2)), vec![1002]);
    });
}

/// A lookup racing the start of a grow and the migration of its home's
/// regions (an odd tag: the entry moves to the new table). A lookup that
/// read the state before the grow and its regions' versions after the
/// migration would scan the old table alone and miss the entry: the
/// state's check makes it look again.
#[test]
fn a_lookup_racing_the_start_of_a_grow_finds_the_entry_it_moved() {
    model(|| {
        let idx = tiny(&[(0, 3, 1003)]);
        let grower = {
            let idx = idx.clone();
            loom::thread::spawn(move || {
                idx.start_grow();
                idx.insert(h(0, 9), 1, 2009).unwrap();
            })
        };
        assert_eq!(pbas(&idx, h(0, 3)), vec![1003]);
        grower.join().unwrap();
    });
}

/// A lookup of home 20, whose entry sits in slot 32 (region 1; slots 20
/// to 31 are taken), racing a writer homed at 40 that holds regions 1 and
/// 2 only and migrates them, moving that entry to the new table. Only the
/// second region's version tells the lookup to look again.
#[test]
fn a_lookup_racing_a_migration_of_its_second_region_finds_the_entry() {
    model(|| {
        let mut entries: Vec<(u64, u8, u64)> = (20..32).map(|home| (home, 2, 100 + home)).collect();
        entries.push((20, 1, 777));
        let idx = tiny(&entries);
        idx.start_grow();
        let writer = {
            let idx = idx.clone();
            loom::thread::spawn(move || idx.insert(h(40, 2), 1, 4002).unwrap())
        };
        assert_eq!(pbas(&idx, h(20, 1)), vec![777]);
        writer.join().unwrap();
    });
}

/// Two writers sharing region 1 during a migration, each migrating the
/// regions it locks: a replace of an entry that moves, and an insert homed
/// in the regions before. Both land once, in the table the tag picks, and
/// after both the migration is done.
#[test]
fn writers_sharing_a_region_during_a_migration_land_once() {
    model(|| {
        let idx = tiny(&[(40, 7, 7000), (0, 2, 1002)]);
        idx.start_grow();
        let other = {
            let idx = idx.clone();
            loom::thread::spawn(move || idx.insert(h(0, 4), 1, 1004).unwrap())
        };
        assert!(idx.replace(h(40, 7), 7000, 1, 7001));
        other.join().unwrap();
        let st = idx.stats();
        assert_eq!((st.tables, st.entries, st.resizing), (2, 3, false));
        assert_eq!(pbas(&idx, h(40, 7)), vec![7001]);
        assert_eq!(pbas(&idx, h(0, 4)), vec![1004]);
        assert_eq!(pbas(&idx, h(0, 2)), vec![1002]);
    });
}

/// The hopscotch set-up of `tests::displacement_crosses_one_region_boundary`
/// (no migration): homes 0-43 one entry each, homes 20-27 one more each,
/// so home 20's neighbourhood [20, 52) is full and an insert homed at 20
/// must move an entry into slot 52 (region 1) to make room.
fn packed() -> Arc<Index> {
    let idx = tiny(&[]);
    for home in 0..44u64 {
        idx.insert(h(home, home as u8), 1, home).unwrap();
    }
    for i in 0..8 {
        idx.insert(h(20 + i, 250), 1, 100 + i).unwrap();
    }
    idx
}

/// The entries of `idx` as (pba, hash-free position: home + offset).
fn positions(idx: &Index) -> std::collections::HashMap<u64, (usize, usize)> {
    let mut m = std::collections::HashMap::new();
    idx.for_each(|home, e| {
        m.insert(e.pba(), (home, home + e.neigh_off() as usize));
    });
    m
}

/// The hash of the entry `packed` gave pba `pba`.
fn packed_hash(pba: u64) -> u64 {
    if pba < 100 {
        h(pba, pba as u8)
    } else {
        h(20 + pba - 100, 250)
    }
}

/// A lockless lookup racing a displacement that moves its key (a hopscotch
/// insert across a region boundary, no grow) finds it exactly once.
#[test]
fn a_lookup_racing_the_displacement_of_its_key_finds_it_once() {
    // Which entry the insert moves: found once, in a model of one thread
    // (loom's atomics exist only inside a model).
    let moved = Arc::new(std::sync::Mutex::new(Vec::new()));
    let m = moved.clone();
    builder().check(move || {
        let idx = packed();
        let before = positions(&idx);
        idx.insert(h(20, 251), 1, 999).unwrap();
        assert_eq!(idx.stats().grows, 0, "displacement, not growth, must make room");
        let after = positions(&idx);
        *m.lock().unwrap() = before.into_iter().filter(|(pba, pos)| after[pba] != *pos).map(|(pba, _)| pba).collect();
    });
    let moved = moved.lock().unwrap().clone();
    assert!(!moved.is_empty(), "the insert moved no entry");
    // The entry moved last ends furthest from where it was: check the
    // first one moved, which crosses into region 1.
    let pba = *moved.iter().max_by_key(|&&p| p).unwrap();
    model(move || {
        let idx = packed();
        let writer = {
            let idx = idx.clone();
            loom::thread::spawn(move || idx.insert(h(20, 251), 1, 999).unwrap())
        };
        assert_eq!(pbas(&idx, packed_hash(pba)), vec![pba], "a displaced entry was missed or seen twice");
        writer.join().unwrap();
        assert_eq!(pbas(&idx, packed_hash(pba)), vec![pba]);
        assert_eq!(pbas(&idx, h(20, 251)), vec![999]);
    });
}

/// A lockless lookup racing the removal of another key of its
/// neighbourhood (the hole it leaves, concurrent form of
/// `tests::regression_hole_does_not_hide_later_entry`) and an insert
/// filling a hole before it: the lookup finds its key exactly once.
#[test]
fn a_lookup_racing_removes_and_inserts_beside_its_key_finds_it_once() {
    model(|| {
        let idx = tiny(&[(10, 1, 1000), (10, 1, 1001), (10, 2, 2000)]);
        let writer = {
            let idx = idx.clone();
            loom::thread::spawn(move || {
                assert!(idx.remove(h(10, 1), 1000));
                idx.insert(h(10, 3), 1, 3000).unwrap();
            })
        };
        assert_eq!(pbas(&idx, h(10, 2)), vec![2000], "an entry was hidden or seen twice");
        writer.join().unwrap();
        assert_eq!(pbas(&idx, h(10, 1)), vec![1001]);
        assert_eq!(pbas(&idx, h(10, 3)), vec![3000]);
        assert_eq!(pbas(&idx, h(10, 2)), vec![2000]);
    });
}
