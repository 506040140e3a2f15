//! Tests of the DRAM tier in the engine ([`crate::tier`]): hits skip the
//! device, and no path that changes a key (put, delete, read-modify-write,
//! batch, expiry, `flush_all`, namespace truncate and drop, GC relocation
//! and eviction, a restart) lets it serve a value older than the device's,
//! including under concurrent writers, readers and GC.

use crate::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::tests::ClockFixture as Fixture;

/// This suite's fixture: stores with a 1 MiB tier.
fn fixture(size: u64) -> Fixture {
    Fixture { tier_bytes: 1 << 20, ..Fixture::new(size) }
}

/// Read `key` twice, the second time from the tier; returns the value.
fn warm(s: &Store, key: &[u8]) -> Vec<u8> {
    let v = s.get(key).unwrap().expect("present");
    let hits = s.stats().dram.hits;
    assert_eq!(s.get(key).unwrap().as_deref(), Some(&v[..]));
    assert_eq!(s.stats().dram.hits, hits + 1, "the second read of {key:?} is a tier hit");
    v
}

fn segment_of(s: &Store, key: &[u8]) -> u32 {
    let f = granary_rt::block_on(s.core.find(key, s.core.keys.hash(key), false, true)).unwrap().unwrap();
    s.core.log.sb.segment_of(f.entry.pba())
}

/// Fill segments with other keys until the one being written changes.
fn roll(s: &Store, tag: &str) {
    let before = s.core.space.used_segments().len();
    let mut i = 0;
    while s.core.space.used_segments().len() == before {
        s.put(format!("{tag}-{i}").as_bytes(), &[1u8; 900]).unwrap();
        i += 1;
    }
}

/// `get_many` counts one tier miss per key it reads from the device, the
/// keys its plan leaves to the single GET's path too (a deleted key's
/// tombstone here; it counted two).
#[test]
fn get_many_counts_one_miss_per_key() {
    let f = fixture(8 << 20);
    let s = f.create(256 << 10, true, false);
    s.put(b"gone", b"v").unwrap();
    assert!(s.delete(b"gone").unwrap());
    s.put(b"here", b"v").unwrap();
    let (misses, gets) = (s.stats().dram.misses, s.stats().gets);
    let mut got = Vec::new();
    s.get_many(&[b"gone", b"here"], |i, v| got.push((i, v.to_vec()))).unwrap();
    assert_eq!(got, [(1, b"v".to_vec())]);
    assert_eq!((s.stats().dram.misses, s.stats().gets), (misses + 2, gets + 2));
}

#[test]
fn hits_skip_the_device_and_every_write_is_seen() {
    let f = fixture(8 << 20);
    let s = f.create(256 << 10, true, false);
    s.put(b"k", b"v1").unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v1"[..]));
    let reads = s.stats().io.reads;
    warm(&s, b"k");
    for _ in 0..10 {
        assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v1"[..]));
        let vb = s.get_buf(b"k").unwrap().unwrap();
        assert!(vb.from_dram());
        assert_eq!(vb.value(), b"v1");
        assert_eq!(s.get_item(b"k").unwrap().unwrap().value, b"v1");
    }
    assert_eq!(s.stats().io.reads, reads, "hits read nothing from the device");
    let st = s.stats().dram;
    assert_eq!(st.items, 1);
    assert_eq!(st.bytes, 1 + 2 + crate::TIER_ITEM_OVERHEAD_BYTES);
    assert!(st.admissions >= 1 && st.hits >= 31);

    // Each kind of write: the next read sees it. A put of a key the tier
    // holds puts the new value there (served with no device read).
    s.put(b"k", b"v2").unwrap();
    let (hits, reads) = (s.stats().dram.hits, s.stats().io.reads);
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v2"[..]));
    assert_eq!((s.stats().dram.hits, s.stats().io.reads), (hits + 1, reads));
    warm(&s, b"k");
    s.update(b"k", |it| {
        let mut v = it.unwrap().value.clone();
        v.extend_from_slice(b"+");
        (Change::Put { value: v, meta: ItemMeta::default() }, ())
    })
    .unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v2+"[..]));
    warm(&s, b"k");
    let (_, cas) = s.put_item(b"k", b"v3", ItemMeta::new(9, 0), Cond::Always).unwrap();
    let it = s.get_item(b"k").unwrap().unwrap();
    assert_eq!((it.value.as_slice(), it.meta.flags, it.cas), (&b"v3"[..], 9, cas));
    warm(&s, b"k");
    let it = s.get_item(b"k").unwrap().unwrap();
    assert_eq!((it.value.as_slice(), it.meta.flags, it.cas), (&b"v3"[..], 9, cas));
    let ns = s.namespace(DEFAULT_NAMESPACE).unwrap();
    let mut b = s.batch();
    b.put(&ns, b"k", b"v4").put(&ns, b"other", b"o");
    b.commit().unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v4"[..]));
    warm(&s, b"k");
    let mut b = s.batch();
    b.delete(&ns, b"k");
    b.commit().unwrap();
    assert_eq!(s.get(b"k").unwrap(), None);
    s.put(b"k", b"v5").unwrap();
    warm(&s, b"k");
    assert!(s.delete(b"k").unwrap());
    assert_eq!(s.get(b"k").unwrap(), None);
    assert_eq!(s.get_buf(b"k").unwrap().map(|v| v.value().to_vec()), None);
    assert_eq!(s.stats().dram.items, 0, "`other` was never read, `k` is deleted");
    s.close().unwrap();
}

#[test]
fn expiry_and_flush_all_hide_held_values() {
    let f = fixture(8 << 20);
    let s = f.create(256 << 10, true, false);
    let t0 = s.now();
    s.put_item(b"ttl", b"soon gone", ItemMeta::new(0, t0 + 5), Cond::Always).unwrap();
    s.put(b"kept", b"forever").unwrap();
    warm(&s, b"ttl");
    warm(&s, b"kept");
    f.now.fetch_add(5, Relaxed);
    assert_eq!(s.get(b"ttl").unwrap(), None, "an expired value is not served from DRAM");
    assert_eq!(s.get(b"kept").unwrap().as_deref(), Some(&b"forever"[..]));
    s.flush_all().unwrap();
    assert_eq!(s.get(b"kept").unwrap(), None, "a flushed value is not served from DRAM");
    s.put(b"kept", b"again").unwrap();
    assert_eq!(warm(&s, b"kept"), b"again");
    s.close().unwrap();
}

#[test]
fn namespace_truncate_and_drop_leave_nothing_to_serve() {
    let f = fixture(8 << 20);
    let s = f.create(256 << 10, true, false);
    let ns = s.create_namespace("n", NamespaceOptions::default()).unwrap();
    ns.put(b"k", b"in n").unwrap();
    s.put(b"k", b"in default").unwrap();
    for _ in 0..3 {
        assert_eq!(ns.get(b"k").unwrap().as_deref(), Some(&b"in n"[..]));
        assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"in default"[..]));
    }
    assert_eq!(s.stats().dram.items, 2, "(namespace, key) is the identity");
    s.truncate("n").unwrap();
    assert_eq!(ns.get(b"k").unwrap(), None);
    assert_eq!(s.stats().dram.items, 1, "the truncated namespace's items went");
    ns.put(b"k", b"after").unwrap();
    assert_eq!(ns.get(b"k").unwrap().as_deref(), Some(&b"after"[..]));
    assert_eq!(ns.get(b"k").unwrap().as_deref(), Some(&b"after"[..]));
    s.drop_namespace("n").unwrap();
    assert!(ns.get(b"k").is_err());
    let ns = s.create_namespace("n", NamespaceOptions::default()).unwrap();
    assert_eq!(ns.get(b"k").unwrap(), None, "a new namespace of the same name starts empty");
    assert_eq!(s.stats().dram.items, 1);
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"in default"[..]));
    s.close().unwrap();
}

#[test]
fn gc_relocation_and_eviction_are_seen() {
    // Store mode: relocation moves a held value; it reads the same.
    let f = fixture(16 << 20);
    let s = f.create(256 << 10, false, false);
    s.put(b"moved", b"value").unwrap();
    warm(&s, b"moved");
    let v = segment_of(&s, b"moved");
    roll(&s, "a");
    roll(&s, "b");
    crate::gc::reclaim(s.core.collector(), v, false).unwrap();
    assert_ne!(segment_of(&s, b"moved"), v);
    // The tier's item followed the record: the next read is a hit.
    let (hits, reads) = (s.stats().dram.hits, s.stats().io.reads);
    assert_eq!(s.get(b"moved").unwrap().as_deref(), Some(&b"value"[..]));
    assert_eq!((s.stats().dram.hits, s.stats().io.reads), (hits + 1, reads), "a hit after the relocation");
    assert_eq!(warm(&s, b"moved"), b"value");
    s.close().unwrap();

    // Cache mode: eviction drops a held value; it reads as absent. So does
    // the value of a key written twice, which eviction replaces by a
    // tombstone (an older version is on the device); the tier lists
    // neither.
    let f = fixture(16 << 20);
    let s = f.create(256 << 10, false, true);
    s.put(b"evicted", b"value").unwrap();
    s.put(b"twice", b"1").unwrap();
    s.put(b"twice", b"2").unwrap();
    warm(&s, b"evicted");
    warm(&s, b"twice");
    let v = segment_of(&s, b"evicted");
    assert_eq!(segment_of(&s, b"twice"), v);
    roll(&s, "a");
    roll(&s, "b");
    let items = s.stats().dram.items;
    crate::gc::reclaim(s.core.collector(), v, true).unwrap();
    assert!(s.stats().gc.evicted_values >= 2);
    assert_eq!(s.stats().dram.items, items - 2, "GC's eviction dropped the tier's items");
    let mut listed = Vec::new();
    s.namespace(crate::DEFAULT_NAMESPACE)
        .unwrap()
        .visit_dram(|k, _, _| {
            listed.push(k.to_vec());
            true
        })
        .unwrap();
    assert!(!listed.iter().any(|k| k == b"evicted" || k == b"twice"), "the tier lists evicted keys: {listed:?}");
    assert_eq!(s.get(b"evicted").unwrap(), None, "an evicted value is not served from DRAM");
    assert_eq!(s.get(b"twice").unwrap(), None, "an evicted value is not served from DRAM");
    s.close().unwrap();
}

#[test]
fn a_restart_starts_empty_with_everything_readable() {
    let f = fixture(8 << 20);
    let s = f.create(256 << 10, true, false);
    for i in 0..200u32 {
        s.put(format!("k{i}").as_bytes(), &i.to_le_bytes()).unwrap();
    }
    for i in 0..200u32 {
        warm(&s, format!("k{i}").as_bytes());
    }
    assert_eq!(s.stats().dram.items, 200);
    s.close().unwrap();
    let s = Store::open(f.dev.clone(), &f.opts(true, false)).unwrap();
    assert_eq!(s.stats().dram, DramStats { limit_bytes: 1 << 20, ..DramStats::default() });
    for i in 0..200u32 {
        assert_eq!(s.get(format!("k{i}").as_bytes()).unwrap(), Some(i.to_le_bytes().to_vec()));
    }
    s.close().unwrap();
}

#[test]
fn off_by_default() {
    let (_dev, s) = crate::tests::mem_store(8 << 20, 256 << 10, 512);
    s.put(b"k", b"v").unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    assert_eq!(s.stats().dram, DramStats::default());
    assert!(!s.get_buf(b"k").unwrap().unwrap().from_dram());
}

/// xorshift64*.
fn next(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// One writer per key writes ops 1, 2, ... (a put of version `i`, or every
/// fifth op a delete) and publishes each once acknowledged; readers check
/// every read against the ops acknowledged around it: a value is a put no
/// older than the last op acknowledged before the read began, and no newer
/// than the one in flight when it ended; absence needs a delete among
/// those; and one reader never sees a key's versions go back. GC runs
/// meanwhile (relocating and reclaiming under the tier's items), with a
/// tier small enough to evict. After the writers end, every key reads its
/// final version.
#[test]
fn concurrent_readers_never_see_an_older_version() {
    let seed = std::env::var("TIER_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    let f = fixture(8 << 20);
    let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(256 << 10), index_table_homes: Some(256) };
    // Four shards of 64 KiB, about 200 churn keys' items: their reads evict.
    let opts = OpenOptions { dram_tier_bytes: 256 << 10, ..f.opts(true, false) };
    f.dev.shape_zones(256 << 10);
    let s = Arc::new(Store::create(f.dev.clone(), &c, &opts).unwrap());
    const KEYS: usize = 8;
    const WRITERS: usize = 2;
    const OPS: u64 = 3_001;
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));
    let is_delete = |op: u64| op.is_multiple_of(5);
    let key = |k: usize| format!("key-{k}").into_bytes();
    let value = |op: u64| {
        let mut v = op.to_le_bytes().to_vec();
        v.resize(200 + (op as usize % 7) * 100, op as u8);
        v
    };
    let mut threads = Vec::new();
    for w in 0..WRITERS {
        let (s, acked) = (s.clone(), acked.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = seed ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9);
            for op in 1..=OPS {
                for k in (w..KEYS).step_by(WRITERS) {
                    if is_delete(op) {
                        s.delete(&key(k)).unwrap();
                    } else {
                        s.put(&key(k), &value(op)).unwrap();
                    }
                    acked[k].store(op, Relaxed);
                }
                if next(&mut rng).is_multiple_of(8) {
                    // Churn other keys, so GC has work under the tier.
                    let i = next(&mut rng) % 2_000;
                    s.put(format!("churn-{i}").as_bytes(), &[3u8; 1000]).unwrap();
                }
            }
        }));
    }
    let mut readers = Vec::new();
    for r in 0..3u64 {
        let (s, acked, done) = (s.clone(), acked.clone(), done.clone());
        readers.push(std::thread::spawn(move || {
            let mut rng = seed ^ (r + 100).wrapping_mul(0x2545_F491);
            let mut seen = [0u64; KEYS];
            let mut reads = 0u64;
            // Bounded: the writers' end, or a read count far past it.
            while !done.load(Relaxed) && reads < 10_000_000 {
                if next(&mut rng).is_multiple_of(4) {
                    let i = next(&mut rng) % 2_000;
                    let _ = s.get(format!("churn-{i}").as_bytes()).unwrap();
                    continue;
                }
                let k = (next(&mut rng) % KEYS as u64) as usize;
                let before = acked[k].load(Relaxed);
                let got = if next(&mut rng).is_multiple_of(2) {
                    s.get(&key(k)).unwrap()
                } else {
                    s.get_buf(&key(k)).unwrap().map(|v| v.value().to_vec())
                };
                let in_flight = acked[k].load(Relaxed) + 1;
                reads += 1;
                match got {
                    Some(v) => {
                        let op = u64::from_le_bytes(v[..8].try_into().unwrap());
                        assert_eq!(v, value(op), "seed {seed}: key {k}: a torn value");
                        assert!(!is_delete(op), "seed {seed}");
                        assert!(
                            op >= before && op <= in_flight,
                            "seed {seed}: key {k}: read version {op}, acknowledged {before} before the read"
                        );
                        assert!(op >= seen[k], "seed {seed}: key {k}: version {op} after {}", seen[k]);
                        seen[k] = op;
                    }
                    None => assert!(
                        before == 0 || (before..=in_flight).any(is_delete),
                        "seed {seed}: key {k}: absent, with version {before} acknowledged before the read"
                    ),
                }
            }
            reads
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    done.store(true, Relaxed);
    let reads: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
    let last = (1..=OPS).rev().find(|&op| !is_delete(op)).unwrap();
    let last_is_put = !is_delete(OPS);
    for k in 0..KEYS {
        for _ in 0..2 {
            let got = s.get(&key(k)).unwrap();
            if last_is_put {
                assert_eq!(got, Some(value(last)), "seed {seed}: key {k}: not the final version");
            } else {
                assert_eq!(got, None, "seed {seed}: key {k}: deleted last");
            }
        }
    }
    let st = s.stats();
    assert!(reads > 0 && st.dram.hits > 0 && st.dram.evictions > 0, "seed {seed}: {:?}", st.dram);
    assert!(st.dram.bytes <= st.dram.limit_bytes, "seed {seed}: {:?}", st.dram);
    Arc::try_unwrap(s).ok().expect("the only handle").close().unwrap();
}

/// An inspection's read (a key dump, memcache `me`) is not a GET: the
/// store's, the namespace's and the DRAM tier's figures stay as they were
/// and the tier is offered nothing (a dump of every key must not fill it
/// with cold items), while the item and its access state read as
/// `get_item_access` gives them.
#[test]
fn a_peek_is_not_a_get() {
    let f = fixture(16 << 20);
    let s = f.create(256 << 10, false, true);
    for i in 0..50u32 {
        s.put(format!("k{i}").as_bytes(), &[i as u8; 100]).unwrap();
    }
    let ns = s.namespace(crate::DEFAULT_NAMESPACE).unwrap();
    let figures = |s: &Store| {
        let (st, n) = (s.stats(), ns.stats().unwrap());
        (st.gets, st.get_hits, st.dram.misses, st.dram.admissions, st.dram.items, n.gets, n.hits)
    };
    let before = figures(&s);
    for i in 0..50u32 {
        let ia = s.peek_item_access(format!("k{i}").as_bytes()).unwrap().unwrap();
        assert_eq!(ia.item.value, vec![i as u8; 100]);
        assert!(!ia.won);
    }
    assert!(s.peek_item_access(b"absent").unwrap().is_none());
    assert_eq!(figures(&s), before);
    // The access state a peek reads is what a read that marks nothing
    // reads, and the peek left it as it was.
    let peeked = s.peek_item_access(b"k2").unwrap().unwrap().prior;
    assert_eq!(s.get_item_access(b"k2", false, |_| false).unwrap().unwrap().prior, peeked);
    let before = figures(&s);
    // A GET after it still counts, and is offered to the tier.
    assert!(s.get(b"k1").unwrap().is_some());
    assert_eq!(s.stats().gets, before.0 + 1);
    assert_eq!(s.stats().dram.admissions, before.3 + 1);
}
