//! Tests of cache semantics in the engine: metadata and CAS values,
//! conditional writes, expiry (with a manual clock, never sleeping),
//! read-modify-write, GC of expired values, and cache-mode eviction.

use crate::*;
use granary_io::MemDevice;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::tests::ClockFixture as Fixture;

fn meta(flags: u32, expires: u32) -> ItemMeta {
    ItemMeta::new(flags, expires)
}

#[test]
fn meta_and_cas_round_trip_and_survive_a_crash() {
    let f = Fixture::new(8 << 20);
    let s = f.create(1 << 20, true, false);
    let (o, cas1) = s.put_item(b"k", b"v1", meta(0xdead_beef, 0), Cond::Always).unwrap();
    assert_eq!(o, PutOutcome::Stored);
    assert_ne!(cas1, 0);
    let it = s.get_item(b"k").unwrap().unwrap();
    assert_eq!((it.value.as_slice(), it.meta, it.cas), (&b"v1"[..], meta(0xdead_beef, 0), cas1));
    // CAS: a stale value is refused, the current one succeeds with a new CAS.
    assert_eq!(s.put_item(b"k", b"x", meta(1, 0), Cond::Cas(cas1 + 1000)).unwrap(), (PutOutcome::Exists, 0));
    let (o, cas2) = s.put_item(b"k", b"v2", meta(7, 0), Cond::Cas(cas1)).unwrap();
    assert_eq!(o, PutOutcome::Stored);
    assert!(cas2 > cas1);
    assert_eq!(s.put_item(b"k", b"x", meta(1, 0), Cond::Cas(cas1)).unwrap().0, PutOutcome::Exists);
    assert_eq!(s.put_item(b"nope", b"x", meta(1, 0), Cond::Cas(cas1)).unwrap().0, PutOutcome::NotFound);
    assert_eq!(s.put_item(b"nope", b"x", meta(1, 0), Cond::Present).unwrap().0, PutOutcome::NotFound);
    assert_eq!(s.put_item(b"k", b"x", meta(1, 0), Cond::Absent).unwrap().0, PutOutcome::Exists);
    let s = f.reopen(s, true);
    let it = s.get_item(b"k").unwrap().unwrap();
    assert_eq!((it.value.as_slice(), it.meta, it.cas), (&b"v2"[..], meta(7, 0), cas2));
    // New writes get CAS values above every recovered one.
    let (_, cas3) = s.put_item(b"other", b"y", meta(0, 0), Cond::Always).unwrap();
    assert!(cas3 > cas2);
    s.close().unwrap();
}

/// Explicit CAS values (a touch keeping its CAS, a client's chosen one):
/// read back by every path (item, zero-copy buffer, the CAS check of a
/// write, which reads only the record's head for a large value), kept
/// across a clean restart, a log scan and GC relocation.
#[test]
fn explicit_cas_values_are_kept_everywhere() {
    let f = Fixture::new(16 << 20);
    let s = f.create(1 << 20, true, false);
    let big: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
    assert_eq!(s.put_item_with_cas(b"k", b"v1", meta(3, 0), Cond::Always, 777).unwrap(), (PutOutcome::Stored, 777));
    assert_eq!(s.put_item_with_cas(b"big", &big, meta(4, 0), Cond::Always, 1 << 40).unwrap().1, 1 << 40);
    let check = |s: &Store| {
        let it = s.get_item(b"k").unwrap().unwrap();
        assert_eq!((it.value.as_slice(), it.meta, it.cas), (&b"v1"[..], meta(3, 0), 777));
        let vb = s.get_buf(b"k").unwrap().unwrap();
        assert_eq!((vb.value(), vb.len(), vb.cas), (&b"v1"[..], 2, 777));
        let it = s.get_item(b"big").unwrap().unwrap();
        assert_eq!((&it.value, it.cas), (&big, 1 << 40));
        assert_eq!(s.get_buf(b"big").unwrap().unwrap().value(), &big[..]);
    };
    check(&s);
    // The CAS check of a write compares the explicit value.
    assert_eq!(s.put_item(b"big", b"x", meta(0, 0), Cond::Cas(5)).unwrap().0, PutOutcome::Exists);
    // A touch that keeps the CAS value.
    let (_, cas) = s
        .update(b"k", |it| {
            let it = it.unwrap();
            (Change::PutCas { value: it.value.clone(), meta: meta(3, 0), cas: it.cas }, ())
        })
        .unwrap();
    assert_eq!(cas, Some(777));
    check(&s);
    let s = f.reopen(s, false);
    check(&s);
    let s = f.reopen(s, true);
    check(&s);
    drop(s);
    let s = Store::open(f.dev.clone(), &f.opts(true, false)).unwrap();
    // Churn until GC has relocated both records.
    let pba_of = |s: &Store, k: &[u8]| s.core.keys.index.lookup(s.core.keys.hash(k)).as_slice()[0].pba();
    let before = (pba_of(&s, b"k"), pba_of(&s, b"big"));
    let mut i = 0u64;
    let mut rng = granary_io::SimRng::new(1);
    let moved = |s: &Store| pba_of(s, b"k") != before.0 && pba_of(s, b"big") != before.1;
    while !moved(&s) && i < 200_000 {
        let x = rng.next_u64();
        s.put(format!("churn-{}", x % 2000).as_bytes(), &[i as u8; 3000]).unwrap();
        i += 1;
    }
    assert!(moved(&s), "GC relocated both records");
    check(&s);
    assert!(s.verify().unwrap().is_clean());
    // A CAS write with the explicit value succeeds, and the new version has
    // a fresh CAS value again.
    let (o, c) = s.put_item(b"big", b"new", meta(0, 0), Cond::Cas(1 << 40)).unwrap();
    assert_eq!(o, PutOutcome::Stored);
    assert_eq!(s.get_item(b"big").unwrap().unwrap().cas, c);
    assert_ne!(c, 1 << 40);
}

#[test]
fn expiry_follows_the_clock() {
    let f = Fixture::new(8 << 20);
    let s = f.create(1 << 20, true, false);
    let t0 = s.now();
    s.put_item(b"k", b"v", meta(3, t0 + 10), Cond::Always).unwrap();
    f.advance(9);
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    f.advance(1);
    assert_eq!(s.get_item(b"k").unwrap(), None, "expired at its expiry second");
    // Expired counts as absent for conditions and deletes.
    assert_eq!(s.put_item(b"k", b"x", meta(0, 0), Cond::Present).unwrap().0, PutOutcome::NotFound);
    assert!(!s.delete(b"k").unwrap());
    s.put_item(b"k", b"v", meta(3, t0 + 20), Cond::Always).unwrap();
    f.advance(100);
    assert_eq!(s.put_item(b"k", b"new", meta(0, 0), Cond::Absent).unwrap().0, PutOutcome::Stored);
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"new"[..]));
    s.close().unwrap();
}

#[test]
fn update_reads_modifies_and_writes_under_the_key_lock() {
    let f = Fixture::new(8 << 20);
    let s = Arc::new(f.create(1 << 20, true, false));
    // Absent: the function sees None and may decline.
    let (r, cas) = s.update(b"n", |it| (Change::Keep, it.is_none())).unwrap();
    assert!(r && cas.is_none());
    s.put(b"n", b"0").unwrap();
    // Concurrent increments lose nothing.
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let s = s.clone();
            std::thread::spawn(move || {
                for _ in 0..50 {
                    s.update(b"n", |it| {
                        let n: u64 = std::str::from_utf8(&it.unwrap().value).unwrap().parse().unwrap();
                        (Change::Put { value: (n + 1).to_string().into_bytes(), meta: ItemMeta::default() }, ())
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(s.get(b"n").unwrap().as_deref(), Some(&b"200"[..]));
    let (_, cas) = s.update(b"n", |_| (Change::Delete, ())).unwrap();
    assert!(cas.is_none());
    assert_eq!(s.get(b"n").unwrap(), None);
    assert_eq!(s.stats().tombstones, 1);
}

/// Fill the open user segment so the next write opens a new one.
fn roll(s: &Store, tag: &str) {
    let before = s.core.space.used_segments().len();
    let mut i = 0;
    while s.core.space.used_segments().len() == before {
        s.put(format!("{tag}-{i}").as_bytes(), &[1u8; 900]).unwrap();
        i += 1;
    }
}

/// The indexed version of `key` (any key, reserved ones included).
fn found(s: &Store, key: &[u8]) -> crate::store::Found {
    granary_rt::block_on(s.core.find(key, s.core.keys.hash(key), false, true)).unwrap().expect("indexed")
}

/// A store of 256 KiB segments with access tracking (memcache's `h`, `l`,
/// win token and fetched mark), GC by hand, evicting when `evict`.
fn tracked(f: &Fixture, evict: bool) -> Store {
    let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(256 << 10), index_table_homes: Some(256) };
    let o = OpenOptions { track_access: true, ..f.opts(false, evict) };
    f.dev.shape_zones(256 << 10);
    Store::create(f.dev.clone(), &c, &o).unwrap()
}

fn segment_of(s: &Store, key: &[u8]) -> u32 {
    let f = found(s, key);
    assert!(!f.hdr.is_tombstone());
    s.core.log.sb.segment_of(f.entry.pba())
}

#[test]
fn gc_replaces_expired_values_by_tombstones_so_no_older_version_returns() {
    let f = Fixture::new(8 << 20);
    let s = f.create(256 << 10, false, false);
    let t0 = s.now();
    s.put(b"k", b"old, never expires").unwrap();
    roll(&s, "a");
    s.put_item(b"k", b"new, expires", meta(0, t0 + 5), Cond::Always).unwrap();
    let v = segment_of(&s, b"k");
    roll(&s, "b");
    f.advance(5);
    crate::gc::reclaim(s.core.collector(), v, false).unwrap();
    let st = s.stats();
    assert_eq!(st.gc.expired, 1);
    assert_eq!(st.tombstones, 1);
    assert_eq!(s.get(b"k").unwrap(), None);
    // A crash and a full scan: the old version is still on the device, the
    // tombstone keeps it dead.
    let s = f.reopen(s, true);
    assert_eq!(s.get(b"k").unwrap(), None, "an expired key came back with an older value");
    assert!(s.verify().unwrap().is_clean());
}

/// Four closed segments, oldest first, each starting with the key
/// `first-<n>`, then two more so that they are old enough for GC's age
/// rule: the four segments.
fn four_old_segments(s: &Store) -> Vec<u32> {
    let mut segs = Vec::new();
    for r in 0..4 {
        s.put(format!("first-{r}").as_bytes(), b"v").unwrap();
        segs.push(segment_of(s, format!("first-{r}").as_bytes()));
        roll(s, &format!("r{r}"));
    }
    roll(s, "tail");
    roll(s, "tail2");
    segs
}

#[test]
fn eviction_takes_the_least_recently_used_segment_without_writing() {
    let f = Fixture::new(16 << 20);
    let s = f.create(256 << 10, false, true);
    let segs = four_old_segments(&s);
    // Reading from the oldest segment makes the second oldest the LRU one.
    assert!(s.get(b"first-0").unwrap().is_some());
    let age = crate::gc::age(s.core.log.sb.segment_count);
    let (victim, evict) = s.core.space.pick_victim(age, true).unwrap();
    assert!(evict, "a full segment is evicted, not relocated");
    assert_eq!(victim, segs[1]);
    let written = s.stats().io.written_bytes;
    crate::gc::reclaim(s.core.collector(), victim, true).unwrap();
    let st = s.stats();
    assert!(st.gc.evicted_values > 100, "{:?}", st.gc);
    assert_eq!(st.gc.evicted_segments, 1);
    assert_eq!(st.gc.records_relocated, 0);
    // Only the victim's free header was written (zoned mode: nothing, its
    // zone is reset).
    let header = if s.core.space.zoned() { 0 } else { 512 };
    assert_eq!(st.io.written_bytes - written, header);
    assert_eq!(s.get(b"first-1").unwrap(), None);
    assert!(s.get(b"first-0").unwrap().is_some());
    assert!(s.get(b"first-2").unwrap().is_some());
    assert!(s.verify().unwrap().is_clean());
}

/// A read that does not bump (memcache `mg` with `u`) leaves its
/// segment's recency as it was, from the device and from the DRAM tier;
/// one that bumps makes it recent.
#[test]
fn a_read_without_bump_leaves_its_segment_least_recently_used() {
    for tier in [0, 1 << 20] {
        let mut f = Fixture::new(16 << 20);
        f.tier_bytes = tier;
        let s = f.create(256 << 10, false, true);
        let segs = four_old_segments(&s);
        let age = crate::gc::age(s.core.log.sb.segment_count);
        let victim = || s.core.space.pick_victim(age, true).unwrap().0;
        // Twice: the second read of a tier finds the item the first admitted.
        for _ in 0..2 {
            let got = s.get_item_access(b"first-0", false, |_| false).unwrap().unwrap();
            assert_eq!(got.item.value, b"v");
            assert_eq!(victim(), segs[0], "tier {tier}: a read without bump made its segment recent");
        }
        assert!(s.get_item_access(b"first-0", true, |_| false).unwrap().is_some());
        assert_eq!(victim(), segs[1], "tier {tier}: a read with bump left its segment least recent");
        s.close().unwrap();
    }
}

/// Of the values GC finds expired or evicts, those no read fetched since
/// they were written are counted apart (memcache's `expired_unfetched`
/// and `evicted_unfetched`): values dropped outright, values replaced by
/// a tombstone (an older version is on the device), and an eviction.
#[test]
fn values_leaving_unread_are_counted_apart() {
    let f = Fixture::new(16 << 20);
    let s = tracked(&f, true);
    let t0 = s.now();
    // Older versions of the x- keys, so their expiry writes tombstones.
    for k in ["x-read", "x-unread"] {
        s.put(k.as_bytes(), b"old").unwrap();
    }
    roll(&s, "a");
    for k in ["e-read", "e-unread", "x-read", "x-unread"] {
        s.put_item(k.as_bytes(), b"expires", meta(0, t0 + 5), Cond::Always).unwrap();
    }
    let v = segment_of(&s, b"e-read");
    assert_eq!(v, segment_of(&s, b"x-unread"));
    for k in ["e-read", "x-read"] {
        assert!(s.get(k.as_bytes()).unwrap().is_some());
    }
    roll(&s, "b");
    roll(&s, "c");
    f.advance(5);
    crate::gc::reclaim(s.core.collector(), v, false).unwrap();
    let ns = s.namespace(DEFAULT_NAMESPACE).unwrap().stats().unwrap();
    assert_eq!((ns.expirations, ns.expired_unfetched), (4, 2), "{ns:?}");
    assert_eq!((ns.evictions, ns.evicted_unfetched), (0, 0), "{ns:?}");
    // An eviction of a segment with one value read.
    s.put(b"kept-read", b"v").unwrap();
    let w = segment_of(&s, b"kept-read");
    assert!(s.get_item_access(b"kept-read", true, |_| false).unwrap().is_some());
    roll(&s, "d");
    roll(&s, "e");
    roll(&s, "f");
    crate::gc::reclaim(s.core.collector(), w, true).unwrap();
    let ns = s.namespace(DEFAULT_NAMESPACE).unwrap().stats().unwrap();
    assert!(ns.evictions > 10, "{ns:?}");
    assert_eq!(ns.evicted_unfetched, ns.evictions - 1, "{ns:?}");
    assert_eq!(s.get(b"kept-read").unwrap(), None);
    s.close().unwrap();
}

#[test]
fn cache_mode_never_runs_out_of_space_and_keeps_hot_keys() {
    let f = Fixture::new(8 << 20);
    let s = f.create(256 << 10, true, true);
    let hot: Vec<String> = (0..20).map(|i| format!("hot-{i}")).collect();
    for k in &hot {
        s.put(k.as_bytes(), &[7u8; 900]).unwrap();
    }
    // Three times the device in cold writes, reading the hot keys as we go.
    let cold = 3 * (8 << 20) / 1024;
    for i in 0..cold {
        s.put(format!("cold-{i}").as_bytes(), &[1u8; 900]).unwrap();
        if i % 16 == 0 {
            for k in &hot {
                assert!(s.get(k.as_bytes()).unwrap().is_some(), "hot key {k} evicted at cold write {i}");
            }
        }
    }
    let st = s.stats();
    assert!(st.gc.evicted_segments > 0, "{:?}", st.gc);
    assert!(s.get(format!("cold-{}", cold - 1).as_bytes()).unwrap().is_some());
    assert!(s.verify().unwrap().is_clean());
}

#[test]
fn flush_all_hides_earlier_values_persistently_and_gc_reclaims_them() {
    let f = Fixture::new(8 << 20);
    let s = f.create(256 << 10, false, false);
    s.put(b"before", b"1").unwrap();
    let v = segment_of(&s, b"before");
    s.flush_all().unwrap();
    assert_eq!(s.get(b"before").unwrap(), None);
    // A flushed key counts as absent: add succeeds.
    assert_eq!(s.put_item(b"before", b"2", meta(0, 0), Cond::Absent).unwrap().0, PutOutcome::Stored);
    s.put(b"after", b"3").unwrap();
    assert!(matches!(s.put(b"\0granary.flush_floor", b"x"), Err(Error::ReservedKey)));
    assert!(matches!(s.get(b"\0granary.x"), Err(Error::ReservedKey)));
    let s = f.reopen(s, true);
    assert_eq!(s.get(b"before").unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(s.get(b"after").unwrap().as_deref(), Some(&b"3"[..]));
    s.delete(b"before").unwrap();
    let s = f.reopen(s, false);
    // The floor came back: a value from before it stays hidden, and GC
    // does not relocate it.
    roll(&s, "x");
    roll(&s, "y");
    crate::gc::reclaim(s.core.collector(), v, false).unwrap();
    assert_eq!(s.get(b"after").unwrap().as_deref(), Some(&b"3"[..]));
    assert_eq!(s.get(b"before").unwrap(), None);
    assert!(s.verify().unwrap().is_clean());
}

#[test]
fn eviction_never_drops_the_flush_floor() {
    let f = Fixture::new(16 << 20);
    let s = f.create(256 << 10, false, true);
    s.put(b"old", b"1").unwrap();
    roll(&s, "x"); // "old" stays behind in an earlier segment
    s.flush_all().unwrap();
    let v = segment_of(&s, b"\0granary.flush_floor");
    assert_ne!(v, segment_of(&s, b"old"));
    roll(&s, "a");
    roll(&s, "b");
    crate::gc::reclaim(s.core.collector(), v, true).unwrap();
    assert_eq!(s.stats().gc.evicted_segments, 1);
    let s = f.reopen(s, true);
    assert_eq!(s.get(b"old").unwrap(), None, "the flush floor was evicted: a flushed key came back");
}

/// A gate the writes of a [`crate::tests::HookedDevice`] wait at while
/// it is closed.
#[derive(Default)]
struct Gate {
    closed: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
    waiting: std::sync::atomic::AtomicUsize,
}

impl Gate {
    fn pass(&self) {
        self.waiting.fetch_add(1, Relaxed);
        let mut c = self.closed.lock().unwrap();
        while *c {
            c = self.cv.wait(c).unwrap();
        }
        drop(c);
        self.waiting.fetch_sub(1, Relaxed);
    }
}

/// Writes that arrive while a write is in flight share the next one, also
/// small records built in their own buffers (the zero-copy API).
#[test]
fn concurrent_puts_share_one_device_write() {
    for zero_copy in [false, true] {
        concurrent_puts_share_one_device_write_with(zero_copy);
    }
}

fn concurrent_puts_share_one_device_write_with(zero_copy: bool) {
    let gate = Arc::new(Gate::default());
    let g = gate.clone();
    let dev = Arc::new(crate::tests::HookedDevice {
        inner: MemDevice::new(8 << 20),
        before_write: move |_, _| {
            g.pass();
            None
        },
    });
    let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: Some(256) };
    let s = Arc::new(Store::create(dev.clone(), &c, &OpenOptions { gc: false, ..OpenOptions::default() }).unwrap());
    s.put(b"warm", b"up").unwrap(); // opens the segment
    let base = s.stats();
    *gate.closed.lock().unwrap() = true;
    let put = |k: &'static str| {
        let s = s.clone();
        std::thread::spawn(move || {
            if zero_copy {
                let mut pb = s.new_put_buf(k.as_bytes(), k.len()).unwrap();
                pb.fill_from(k.as_bytes());
                s.put_buf(pb, ItemMeta::default(), Cond::Always).unwrap();
            } else {
                s.put(k.as_bytes(), k.as_bytes()).unwrap();
            }
        })
    };
    let first = put("first");
    // Bounded waits on conditions (not on time): the first write is at the gate.
    let wait_for = |what: &str, cond: &dyn Fn() -> bool| {
        for _ in 0..100_000 {
            if cond() {
                return;
            }
            std::thread::yield_now();
        }
        panic!("{what} never happened");
    };
    wait_for("the first write at the gate", &|| gate.waiting.load(Relaxed) == 1);
    let others: Vec<_> = ["a", "b", "c", "d"].into_iter().map(put).collect();
    wait_for("four records in the next group", &|| s.stats().grouped_records == base.grouped_records + 5);
    *gate.closed.lock().unwrap() = false;
    gate.cv.notify_all();
    first.join().unwrap();
    for t in others {
        t.join().unwrap();
    }
    let st = s.stats();
    assert_eq!(
        st.write_groups - base.write_groups,
        2,
        "the first write, then one for the four others (zero-copy {zero_copy})"
    );
    assert_eq!(st.io.writes - base.io.writes, 2);
    for k in ["first", "a", "b", "c", "d"] {
        assert_eq!(s.get(k.as_bytes()).unwrap().as_deref(), Some(k.as_bytes()));
    }
}

/// Eviction of a value that superseded an older version writes a
/// tombstone, so the older version cannot come back after a crash; a value
/// that is its key's only version is dropped without any write.
#[test]
fn eviction_tombstones_only_values_with_older_versions() {
    let f = Fixture::new(16 << 20);
    let s = f.create(256 << 10, false, true);
    s.put(b"over", b"old version").unwrap();
    roll(&s, "a"); // the old version stays behind in an earlier segment
    s.put(b"over", b"new version").unwrap();
    s.put(b"once", b"only version").unwrap();
    let v = segment_of(&s, b"over");
    assert_eq!(v, segment_of(&s, b"once"));
    roll(&s, "b");
    roll(&s, "c");
    let before = s.stats();
    crate::gc::reclaim(s.core.collector(), v, true).unwrap();
    let st = s.stats();
    // One tombstone for "over"; "once" and the fillers of the victim are dropped.
    assert_eq!(st.tombstones - before.tombstones, 1);
    assert!(st.gc.evicted_values - before.gc.evicted_values > 2);
    assert_eq!(s.get(b"over").unwrap(), None);
    assert_eq!(s.get(b"once").unwrap(), None);
    // A crash and a full scan: "old version" is still on the device.
    let s = f.reopen(s, true);
    assert_eq!(s.get(b"over").unwrap(), None, "an evicted key came back with an older version");
    assert_eq!(s.get(b"once").unwrap(), None);
    assert!(s.verify().unwrap().is_clean());
}

#[test]
fn an_expired_value_without_older_versions_is_dropped_without_a_write() {
    let f = Fixture::new(8 << 20);
    let s = f.create(256 << 10, false, false);
    let t0 = s.now();
    s.put_item(b"k", b"only", meta(0, t0 + 5), Cond::Always).unwrap();
    let v = segment_of(&s, b"k");
    roll(&s, "a");
    roll(&s, "b");
    f.advance(5);
    crate::gc::reclaim(s.core.collector(), v, false).unwrap();
    let st = s.stats();
    assert_eq!(st.gc.expired, 1);
    assert_eq!(st.tombstones, 0, "no tombstone for a key with no older version");
    let s = f.reopen(s, true);
    assert_eq!(s.get(b"k").unwrap(), None);
}

/// While GC drops values from a victim not yet free on the device, a new
/// value of such a key is marked as superseding (the dropped version is
/// still there), so its own eviction later writes a tombstone.
#[test]
fn a_value_written_while_its_old_version_is_being_dropped_supersedes_it() {
    let f = Fixture::new(8 << 20);
    let s = f.create(256 << 10, false, true);
    s.put(b"k", b"only version").unwrap();
    let first = found(&s, b"k");
    assert!(!first.hdr.supersedes);
    let (v, len) = (s.core.log.sb.segment_of(first.entry.pba()), first.hdr.grains(512) * 512);
    assert!(drop_k(&s, v, first.entry.pba(), len));
    s.put(b"k", b"written during the drop").unwrap();
    assert!(found(&s, b"k").hdr.supersedes, "the dropped version is still on the device");
    s.core.keys.dropped.freed(v);
    s.put(b"fresh", b"x").unwrap();
    assert!(!found(&s, b"fresh").hdr.supersedes);
}

/// Dropped values stay listed until *their* victim is free: reclaiming
/// another segment (or a reclaim of theirs that failed, which must not clear
/// the list: crash seed 1735550203 in cache mode) must not forget them, or
/// a later delete writes no tombstone and a crash brings the value back.
/// GC's eviction of key `k`'s value at `pba` in segment `v` (`len` bytes),
/// listed until `v` is free; whether it was indexed.
fn drop_k(s: &Store, v: u32, pba: u64, len: u64) -> bool {
    crate::gc::drop_value(s.core.collector(), v, b"k", pba, crate::counters::Counted::new(false, len), true).unwrap()
}

#[test]
fn dropped_values_stay_listed_until_their_own_victim_is_free() {
    let f = Fixture::new(8 << 20);
    let (s, _, first, v, len) = cache_with_one_value(&f);
    // Another closed segment, reclaimed in full while `v` is not.
    roll(&s, "a");
    s.put(b"other", b"x").unwrap();
    let w = segment_of(&s, b"other");
    roll(&s, "b");
    roll(&s, "c");
    assert_ne!(v, w);
    assert!(drop_k(&s, v, first.entry.pba(), len));
    crate::gc::reclaim(s.core.collector(), w, false).unwrap();
    assert_eq!(s.core.keys.dropped.len(), 1, "freeing another victim keeps v's dropped values");
    assert!(!s.delete(b"k").unwrap(), "the value was already gone");
    assert_eq!(s.stats().tombstones, 1, "a tombstone covers the copy still in v");
    let s = f.reopen(s, true);
    assert_eq!(s.get(b"k").unwrap(), None, "a deleted key came back");
}

/// A victim's dropped values stop being listed before the victim is on
/// the free list: a writer that allocated it at once could list a new
/// value of it, which a later clearing would erase (then a delete of that
/// key writes no tombstone, and a crash brings its value back).
#[test]
fn dropped_values_are_forgotten_before_their_victim_can_be_allocated() {
    let f = Fixture::new(8 << 20);
    let (s, _, first, v, len) = cache_with_one_value(&f);
    roll(&s, "a");
    roll(&s, "b");
    assert!(drop_k(&s, v, first.entry.pba(), len));
    let core = s.core.clone();
    let seen = std::rc::Rc::new(std::cell::Cell::new(None));
    let saw = seen.clone();
    crate::keys::ON_FREED.set(Some(Box::new(move |seg| {
        if seg == v {
            saw.set(Some(core.space.used_segments().contains(&v)));
        }
    })));
    let reclaimed = crate::gc::reclaim(s.core.collector(), v, false);
    crate::keys::ON_FREED.take();
    reclaimed.unwrap();
    assert_eq!(seen.get(), Some(true), "the victim was allocatable before its listing ended");
    assert_eq!(s.core.keys.dropped.len(), 0);
}

/// A crash after GC copied a value and before it freed the victim leaves
/// two copies of one record. Recovery lists the one it does not index, so
/// once the indexed copy is evicted (no tombstone: it superseded nothing)
/// a delete still writes a tombstone; and a checkpoint replays the listed
/// segment, so a recovery from it lists the copy again. Without this a
/// deleted key came back (the cache crash loop, seed 1819242436).
#[test]
fn a_copy_left_beside_its_original_by_a_crash_is_listed_until_freed() {
    let f = Fixture::new(8 << 20);
    let (s, h, _, v, _) = cache_with_one_value(&f);
    roll(&s, "a");
    roll(&s, "b");
    let (off, len) = (s.core.log.sb.segment_offset(v) as usize, s.core.log.sb.segment_bytes as usize);
    let saved = f.dev.with_bytes_mut(|b| b[off..off + len].to_vec());
    crate::gc::reclaim(s.core.collector(), v, false).unwrap();
    assert_ne!(segment_of(&s, b"k"), v, "k was copied out of its segment");
    drop(s);
    // The crash came before the victim's free header reached the device.
    f.dev.with_bytes_mut(|b| b[off..off + len].copy_from_slice(&saved));
    let cache = |use_checkpoint| OpenOptions { use_checkpoint, ..f.opts(false, true) };
    let s = Store::open(f.dev.clone(), &cache(false)).unwrap();
    // Every value of v was copied (k and the fillers of `roll`).
    assert!(s.core.keys.dropped.contains(h), "recovery lists the copy it does not index");
    s.checkpoint().unwrap();
    drop(s);
    let s = Store::open(f.dev.clone(), &cache(true)).unwrap();
    assert_ne!(s.stats().recovery.checkpoint_id, 0);
    assert!(s.core.keys.dropped.contains(h), "the checkpoint did not replay the segment of the other copy");
    let e = found(&s, b"k");
    let seg = s.core.log.sb.segment_of(e.entry.pba());
    assert!(!e.hdr.supersedes);
    assert!(drop_k(&s, seg, e.entry.pba(), e.hdr.grains(512) * 512));
    assert!(!s.delete(b"k").unwrap(), "the value was already gone");
    assert_eq!(s.stats().tombstones, 1, "a tombstone covers the copies left on the device");
    let s = f.reopen(s, true);
    assert_eq!(s.get(b"k").unwrap(), None, "a deleted key came back");
}

/// A cache's cleaning (relocating a victim's live values) never takes the
/// last free segment: evictions need it for their tombstones. With it
/// spent by cleanings that failed half-way, a cache ended with no free
/// segment and every eviction needing a write, and refused writes (crash
/// simulation seed 1735556583).
#[test]
fn a_caches_cleaning_leaves_the_last_free_segment_to_evictions() {
    let f = Fixture::new(8 << 20);
    let s = f.create(256 << 10, true, true);
    let _paused = s.pause_gc();
    s.put(b"k", b"first").unwrap();
    s.put(b"k", b"second, supersedes the first").unwrap();
    let v = segment_of(&s, b"k");
    roll(&s, "a");
    roll(&s, "b");
    // Spend the free segments down to one (relocation space nobody writes).
    let grains = s.core.log.sb.segment_grains() - 1;
    while s.stats().segments_free > 1 {
        let loc = s.core.space.alloc(crate::space::Purpose::Relocate, grains, 0, 1).unwrap();
        s.core.space.done(loc.seg);
    }
    assert!(
        matches!(crate::gc::reclaim(s.core.collector(), v, false), Err(Error::NoSpace { .. })),
        "cleaning took the last segment"
    );
    assert_eq!(s.stats().segments_free, 1);
    crate::gc::reclaim(s.core.collector(), v, true).unwrap();
    assert_eq!(s.stats().segments_free, 1, "the eviction wrote its tombstone in the last segment and freed its victim");
    assert_eq!(s.get(b"k").unwrap(), None);
    drop(_paused);
    let s = f.reopen(s, true);
    assert_eq!(s.get(b"k").unwrap(), None, "the evicted key's older version came back");
}

/// A cache store (GC off) holding `k` once: the store, `k`'s hash, its
/// indexed version, that version's segment and its bytes.
fn cache_with_one_value(f: &Fixture) -> (Store, u64, crate::store::Found, u32, u64) {
    let s = f.create(256 << 10, false, true);
    s.put(b"k", b"value").unwrap();
    let first = found(&s, b"k");
    let (v, len) = (s.core.log.sb.segment_of(first.entry.pba()), first.hdr.grains(512) * 512);
    let h = s.core.keys.hash(b"k");
    (s, h, first, v, len)
}

/// A delete while GC is dropping the key's value (its segment not yet
/// free) writes a tombstone, so a crash then cannot bring the value back.
#[test]
fn a_delete_during_the_drop_of_its_value_leaves_a_tombstone() {
    let f = Fixture::new(8 << 20);
    let (s, _, first, v, len) = cache_with_one_value(&f);
    assert!(drop_k(&s, v, first.entry.pba(), len));
    assert!(!s.delete(b"k").unwrap(), "the value was already gone");
    assert_eq!(s.stats().tombstones, 1);
    // Crash before the victim was freed: the value is still on the device.
    let s = f.reopen(s, true);
    assert_eq!(s.get(b"k").unwrap(), None, "a deleted key came back");
}

/// The same through `update`: a change to Delete of a key whose value GC
/// is dropping (the closure sees it absent) writes the tombstone too.
#[test]
fn an_update_deleting_during_the_drop_of_its_value_leaves_a_tombstone() {
    let f = Fixture::new(8 << 20);
    let (s, _, first, v, len) = cache_with_one_value(&f);
    assert!(drop_k(&s, v, first.entry.pba(), len));
    let (seen, cas) = s.update(b"k", |it| (Change::Delete, it.is_some())).unwrap();
    assert!(!seen && cas.is_none(), "the value was already gone");
    assert_eq!(s.stats().tombstones, 1);
    let s = f.reopen(s, true);
    assert_eq!(s.get(b"k").unwrap(), None, "a deleted key came back");
}

/// The access state (with `track_access`) follows an item through GC
/// relocation and a touch, starts over with a new value, and the win token
/// goes to one reader; the stale mark is in the record, so it survives a
/// relocation, a crash and a full log scan.
#[test]
fn access_state_and_stale_marks_follow_items() {
    let f = Fixture::new(8 << 20);
    let s = tracked(&f, false);
    let t0 = s.now();
    let stale = ItemMeta { stale: true, ..meta(5, 0) };
    s.put_item(b"k", b"v", meta(1, 0), Cond::Always).unwrap();
    s.put_item(b"s", b"old", stale, Cond::Always).unwrap();
    let read = |s: &Store, k: &[u8], bump: bool, win: bool| s.get_item_access(k, bump, |_| win).unwrap().unwrap();
    f.advance(3);
    let a = read(&s, b"k", true, false);
    assert_eq!((a.prior, a.won), (Access { fetched: false, last_access: t0, win_sent: false }, false));
    f.advance(2);
    // A plain read bumps too; a read without bump leaves it; one reader wins.
    assert!(s.get_item(b"k").unwrap().is_some());
    f.advance(4);
    let a = read(&s, b"k", false, true);
    assert_eq!((a.prior, a.won), (Access { fetched: true, last_access: t0 + 5, win_sent: false }, true));
    let a = read(&s, b"k", true, true);
    assert_eq!((a.prior.win_sent, a.prior.last_access, a.won), (true, t0 + 5, false));
    // GC relocates both records: state and mark move with them.
    let v = segment_of(&s, b"k");
    assert_eq!(v, segment_of(&s, b"s"));
    roll(&s, "fill");
    let pba = found(&s, b"k").entry.pba();
    crate::gc::reclaim(s.core.collector(), v, false).unwrap();
    assert_ne!(found(&s, b"k").entry.pba(), pba, "relocated");
    let a = read(&s, b"k", false, false);
    assert_eq!(a.prior, Access { fetched: true, last_access: t0 + 9, win_sent: true });
    let it = s.get_item(b"s").unwrap().unwrap();
    assert_eq!((it.value.as_slice(), it.meta), (&b"old"[..], stale));
    // A touch keeps the state (counting as a read with `fetch`); a new
    // value starts over; an invalidation keeps it but frees the token.
    f.advance(1);
    s.update(b"k", |it| {
        let it = it.unwrap();
        (Change::Touch { value: it.value.clone(), meta: meta(1, t0 + 1000), cas: it.cas, fetch: false }, ())
    })
    .unwrap();
    assert_eq!(read(&s, b"k", false, false).prior, Access { fetched: true, last_access: t0 + 9, win_sent: true });
    // A rewrite (an incr that fits in place) keeps it too, with a new CAS.
    let cas = read(&s, b"k", false, false).item.cas;
    s.update(b"k", |it| (Change::Rewrite { value: b"new".to_vec(), meta: it.unwrap().meta, cas: None }, ())).unwrap();
    let a = read(&s, b"k", false, false);
    assert_eq!(a.prior, Access { fetched: true, last_access: t0 + 9, win_sent: true });
    assert!(a.item.cas > cas && a.item.value == b"new");
    s.update(b"k", |it| {
        let it = it.unwrap();
        (Change::Invalidate { value: it.value.clone(), meta: ItemMeta { stale: true, ..it.meta } }, ())
    })
    .unwrap();
    let a = read(&s, b"k", false, true);
    assert_eq!((a.prior.win_sent, a.prior.fetched, a.won, a.item.meta.stale), (false, true, true, true));
    s.put(b"k", b"new").unwrap();
    let a = read(&s, b"k", false, false);
    assert_eq!((a.prior, a.item.meta.stale), (Access { fetched: false, last_access: t0 + 10, win_sent: false }, false));
    // Crash and full scan: marks from the records, access state reset.
    let s = f.reopen(s, true);
    assert!(s.get_item(b"s").unwrap().unwrap().meta.stale);
    assert!(!s.get_item(b"k").unwrap().unwrap().meta.stale);
    assert!(s.verify().unwrap().is_clean());
}

/// Fill a store-mode device of nine 64 KiB segments, after `first` wrote
/// its keys: 120 keys, every other one written again, then new keys until
/// no segment is free (none is empty; the first ones are about half live).
/// Then crash, reopen as a cache, and write 20 new keys: every write must
/// succeed, by evicting.
fn full_device_reopened_as_a_cache_takes_writes(first: impl Fn(&Store)) {
    let f = Fixture::new((1 << 20) + 9 * (64 << 10));
    let s = f.create(64 << 10, false, false);
    let segments = s.superblock().segment_count;
    assert!(segments <= 10, "{segments} segments");
    let v = [5u8; 1500];
    first(&s);
    for n in 0..120u64 {
        s.put(format!("k{n}").as_bytes(), &v).unwrap();
    }
    for n in (0..120u64).step_by(2) {
        s.put(format!("k{n}").as_bytes(), &v).unwrap();
    }
    for n in 120.. {
        match s.put(format!("k{n}").as_bytes(), &v) {
            Ok(()) => {}
            Err(Error::NoSpace { .. }) => break,
            Err(e) => panic!("filling: {e}"),
        }
    }
    assert_eq!(s.stats().segments_free, 0);
    drop(s); // a crash: no checkpoint
             // Full after recovery too (seen with GC off: with it on, GC may evict
             // before the figure is read).
    let s = Store::open(f.dev.clone(), &f.opts(false, false)).unwrap();
    assert_eq!(s.stats().segments_free, 0);
    drop(s); // a crash again
    let s = Store::open(f.dev.clone(), &f.opts(true, true)).unwrap();
    for j in 0..20 {
        s.put(format!("new-{j}").as_bytes(), &v)
            .unwrap_or_else(|e| panic!("write {j} after reopening as a cache: {e}; {:?}", s.stats().gc));
    }
    assert!(s.stats().gc.evicted_segments > 0, "{:?}", s.stats().gc);
    assert!(s.verify().unwrap().is_clean());
}

/// Cache mode on a device with no free segment left: GC's first choice
/// (relocating a half-empty segment) has no room to write, so it evicts
/// that segment instead of refusing the writer. (Found by the crash
/// simulation: a cache reopened on a full device answered NoSpace.)
#[test]
fn a_full_cache_evicts_when_relocation_has_no_room() {
    full_device_reopened_as_a_cache_takes_writes(|_| {});
}

/// As above, but evicting the least recently used segment writes too (it
/// holds a value that superseded an older version, which must leave a
/// tombstone), and there is no room for that write either: GC evicts a
/// segment whose eviction writes nothing instead of refusing the writer.
#[test]
fn a_full_cache_evicts_a_segment_that_needs_no_write() {
    full_device_reopened_as_a_cache_takes_writes(|s| {
        s.put(b"twice", &[5u8; 1500]).unwrap();
        s.put(b"twice", &[5u8; 1500]).unwrap();
    });
}

/// A key displaced by a colliding key's blind overwrite has no index entry
/// (no access word) until its link is settled: a reader wanting the win
/// token gets it, as without tracking; once settled, the key's access state
/// is the one it had before.
#[test]
fn access_state_survives_a_colliding_blind_overwrite() {
    let f = Fixture::new(8 << 20);
    let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(256 << 10), index_table_homes: Some(64) };
    let o = OpenOptions {
        track_access: true,
        checkpoint_interval: None,
        blind_overwrite_bytes: crate::tests::BLIND,
        ..f.opts(false, false)
    };
    f.dev.shape_zones(256 << 10);
    let s = Store::create(f.dev.clone(), &c, &o).unwrap();
    let keys = crate::tests::colliding_keys(s.core.keys.hasher, 2);
    let (a, b) = (&keys[0][..], &keys[1][..]);
    let t0 = s.now();
    s.put(a, b"a1").unwrap();
    f.advance(3);
    let read = |k: &[u8], win: bool| s.get_item_access(k, true, |_| win).unwrap().unwrap();
    assert!(!read(a, false).prior.fetched);
    s.put(b, b"b1").unwrap();
    assert_eq!(s.stats().unsettled_links, 1, "b did not displace a blindly");
    let r = read(a, true);
    assert_eq!((r.item.value.as_slice(), r.won), (&b"a1"[..], true), "a displaced key's reader did not get the token");
    s.checkpoint().unwrap();
    assert_eq!(s.stats().unsettled_links, 0);
    let r = read(a, false);
    assert_eq!(r.prior, Access { fetched: true, last_access: t0 + 3, win_sent: false }, "a's access state was lost");
}

/// `Watermark::Compact` between bursts: GC reclaims segments holding
/// garbage by relocating their live values, evicting none, so every key
/// keeps its latest value while free space grows; the fixed watermark
/// leaves the same store alone (it is above its low watermark).
#[test]
fn compaction_makes_room_from_garbage_and_evicts_nothing() {
    let seed = 7;
    let value = |k: u64, v: u64| -> Vec<u8> {
        let mut b = format!("{k}/{v}/").into_bytes();
        b.resize(3000, (k + v) as u8);
        b
    };
    for mark in [Watermark::Fixed, Watermark::Compact] {
        let dev = Arc::new(MemDevice::new(16 << 20));
        let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(256 << 10), index_table_homes: Some(256) };
        let o =
            OpenOptions { evict: true, background: Background::Manual, gc_watermark: mark, ..OpenOptions::default() };
        let s = Store::create(dev, &c, &o).unwrap();
        let mut rng = granary_io::SimRng::new(seed);
        let mut version = vec![0u64; 1000];
        for (k, &v) in version.iter().enumerate() {
            s.put(format!("key-{k}").as_bytes(), &value(k as u64, v)).unwrap();
        }
        // Overwrite random keys until few segments are free (fewer than
        // any target compaction may have), but not below the low
        // watermark: no GC has run.
        let mut n = 0;
        while s.stats().segments_free > 6 {
            let k = rng.below(1000);
            version[k as usize] += 1;
            s.put(format!("key-{k}").as_bytes(), &value(k, version[k as usize])).unwrap();
            n += 1;
            assert!(n < 100_000, "seed {seed}: the store never filled");
        }
        let before = s.stats();
        assert_eq!(before.gc.victims, 0, "seed {seed}: {:?}", before.gc);
        s.core.space.end_burst();
        let mut steps = 0;
        while s.gc_step() {
            steps += 1;
            assert!(steps < 10_000, "seed {seed}: {mark:?}: GC never stops");
        }
        let after = s.stats();
        for (k, &v) in version.iter().enumerate() {
            let got = s.get(format!("key-{k}").as_bytes()).unwrap();
            assert_eq!(got, Some(value(k as u64, v)), "seed {seed}: {mark:?}: key {k}");
        }
        assert_eq!((after.gc.evicted_values, after.gc.evicted_segments), (0, 0), "seed {seed}: {mark:?}");
        if mark == Watermark::Compact {
            assert!(after.gc.compacted > 0 && after.gc.compacted == after.gc.victims, "seed {seed}: {:?}", after.gc);
            assert!(after.gc.records_relocated > 0, "seed {seed}: {:?}", after.gc);
            assert!(after.segments_free > before.segments_free, "seed {seed}: {before:?} {after:?}");
            assert!(after.segments_free <= after.segments / 2, "seed {seed}: at most half: {after:?}");
        } else {
            assert_eq!(steps, 0, "seed {seed}: the fixed watermark waits for its low watermark");
            assert_eq!(after.segments_free, before.segments_free);
        }
        assert!(s.verify().unwrap().is_clean(), "seed {seed}: {mark:?}");
    }
}

/// A write that finds no room waits for GC (with `Background::Manual`,
/// runs it) and is counted, with the time it waited; a store that has
/// room counts none.
#[test]
fn writes_that_wait_for_room_are_counted() {
    let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(256 << 10), index_table_homes: Some(256) };
    let o = OpenOptions { evict: true, background: Background::Manual, ..OpenOptions::default() };
    let s = Store::create(Arc::new(MemDevice::new(8 << 20)), &c, &o).unwrap();
    let v = vec![1u8; 3000];
    s.put(b"first", &v).unwrap();
    assert_eq!(s.stats().room_waits, 0);
    // 20,000 values of 3 KB: eight times the device.
    let waited = (0..20_000u32).find(|i| {
        s.put(format!("k{i}").as_bytes(), &v).unwrap();
        s.stats().room_waits > 0
    });
    assert!(waited.is_some(), "an 8 MiB cache took 60 MB and no write waited for room");
    assert!(s.stats().gc.victims > 0);
}
