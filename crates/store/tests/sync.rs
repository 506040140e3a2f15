//! The durability barrier, `Store::sync`, on the fault device: one flush;
//! every write acknowledged before it survives a power loss in `Direct`
//! mode (where nothing else flushes them), also after GC has moved it; a
//! failed flush poisons the store (reads go on).

use granary_store::block::block_key;
use granary_store::io::{CrashKind, FaultDevice, OpKind, SimRng};
use granary_store::loadgen::{load_key, load_value};
use granary_store::{Background, CreateOptions, Durability, Entropy, Error, OpenOptions, Store};
use std::sync::Arc;

fn create_opts() -> CreateOptions {
    CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), index_table_homes: Some(256) }
}

/// `Direct` mode (writes are not flushed one by one), no background
/// threads.
fn opts() -> OpenOptions {
    OpenOptions {
        background: Background::Manual,
        durability: Durability::Direct,
        entropy: Entropy::seeded(7),
        ..Default::default()
    }
}

/// A power loss now: the next write fails, and the media keeps what the
/// last flush covered and, of each write since, a seeded choice.
fn power_loss(s: Store, dev: &FaultDevice) {
    dev.plan_crash(0, CrashKind::Power);
    assert!(s.put(b"the write that meets the crash", b"x").is_err());
    drop(s);
    dev.restart();
}

#[test]
fn sync_is_one_flush_and_a_failed_one_poisons_the_store() {
    let dev = Arc::new(FaultDevice::new(4 << 20, 1));
    let s = Store::create(dev.clone(), &create_opts(), &opts()).unwrap();
    s.put(b"k", b"v").unwrap();
    let flushes = || s.stats().io.flushes;
    let before = flushes();
    s.sync().unwrap();
    granary_rt::block_on(s.sync_async()).unwrap();
    assert_eq!(flushes() - before, 2);

    dev.fail_nth(OpKind::Flush, 0, false);
    let err = s.sync().unwrap_err();
    assert!(matches!(err, Error::Io { op: "flush", .. }), "{err}");
    // Poisoned: writes and later syncs are refused (a flush that succeeds
    // after a failure does not make what failed durable); reads go on.
    assert!(matches!(s.put(b"k2", b"v"), Err(Error::Poisoned { .. })));
    assert!(matches!(s.sync(), Err(Error::Poisoned { .. })));
    assert_eq!(s.get(b"k").unwrap().unwrap(), b"v");
    // A touching read (memcache mg ... T) cannot touch, but a miss is
    // still a miss.
    assert!(matches!(s.touch_item_access(b"k", true, |_| false, 1, None), Err(Error::Poisoned { .. })));
    assert!(s.touch_item_access(b"absent", true, |_| false, 1, None).unwrap().is_none());
    drop(s);
    dev.restart();
    let s = Store::open(dev, &opts()).unwrap();
    assert_eq!(s.get(b"k").unwrap().unwrap(), b"v");
    s.sync().unwrap();
}

/// Blocks written then synced survive a power loss whatever the drive
/// keeps of the writes since; without the sync, some seed loses one (so
/// the check can fail).
#[test]
fn synced_writes_survive_a_power_loss() {
    let mut lost_without_sync = 0;
    for seed in 0..40 {
        for sync in [true, false] {
            let dev = Arc::new(FaultDevice::new(4 << 20, seed));
            let s = Store::create(dev.clone(), &create_opts(), &opts()).unwrap();
            let disk = s.create_export("disk", 1 << 20, 512).unwrap();
            for n in 0..40 {
                disk.put(&block_key(n), &load_value(n, seed, 512)).unwrap();
            }
            if sync {
                s.sync().unwrap();
            }
            // Writes after the barrier may be lost; those before may not.
            for n in 40..60 {
                disk.put(&block_key(n), &load_value(n, seed, 512)).unwrap();
            }
            drop(disk);
            power_loss(s, &dev);
            let s = Store::open(dev.clone(), &opts()).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            let Ok(disk) = s.namespace("disk") else {
                // Its catalog record was never flushed either.
                assert!(!sync, "seed {seed}: a synced export is gone");
                lost_without_sync += 40;
                continue;
            };
            for n in 0..40 {
                let got = disk.get(&block_key(n)).unwrap();
                if sync {
                    assert_eq!(got, Some(load_value(n, seed, 512)), "seed {seed}: block {n}");
                } else if got.is_none() {
                    lost_without_sync += 1;
                }
            }
            s.verify().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        }
    }
    assert!(lost_without_sync > 0, "the power loss never dropped an unsynced write: the test proves nothing");
}

/// GC moves synced blocks (their segments are mostly garbage) and frees
/// their segments, without flushing its copies in `Direct` mode; a power
/// loss after that still finds every synced block, because GC flushes
/// before it frees a segment.
#[test]
fn synced_writes_survive_gc_moving_them_before_a_power_loss() {
    for seed in 0..30 {
        let dev = Arc::new(FaultDevice::new(4 << 20, seed));
        let s = Store::create(dev.clone(), &create_opts(), &opts()).unwrap();
        let disk = s.create_export("disk", 1 << 20, 512).unwrap();
        // Blocks among writes of other keys, overwritten later at random:
        // the blocks' segments end up mostly garbage (1 record in 7 is a
        // block), while the other keys keep about half the device live, so
        // GC has to take the blocks' segments and move them (writers run
        // GC themselves in manual mode).
        let mut rng = SimRng::new(seed);
        let mut other = |s: &Store, i: u64| {
            let k = rng.below(1000);
            s.put(&load_key(k), &load_value(k, i, 900)).unwrap();
        };
        for n in 0..40 {
            disk.put(&block_key(n), &load_value(n, seed, 512)).unwrap();
            for i in 0..6 {
                other(&s, i);
            }
        }
        s.sync().unwrap();
        let before = s.stats().gc;
        for i in 0..4000 {
            other(&s, i);
        }
        let gc = s.stats().gc;
        assert!(gc.records_relocated - before.records_relocated >= 40, "seed {seed}: {gc:?}");
        drop(disk);
        power_loss(s, &dev);
        let s = Store::open(dev.clone(), &opts()).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let disk = s.namespace("disk").unwrap();
        for n in 0..40 {
            assert_eq!(disk.get(&block_key(n)).unwrap(), Some(load_value(n, seed, 512)), "seed {seed}: block {n}");
        }
        s.verify().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
}
