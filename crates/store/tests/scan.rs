//! Key scans (`Store::scan`, `Namespace::scan`) and `random_key`: every key
//! present for the whole scan is returned, no key that is not live, a page's
//! keys distinct, each namespace's keys only; while writers, GC, index
//! growth and blind overwrites' links change the index under the scan.

mod common;

use granary_io::SimRng;
use granary_store::{
    Background, Clock, Cond, CreateOptions, Entropy, Error, ItemMeta, Namespace, NamespaceOptions, OpenOptions,
    ScanPage, Store, DEFAULT_NAMESPACE,
};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// Every page of a full scan by `page` (from cursor 0 until cursor 0),
/// each checked for duplicates within it.
fn pages(mut page: impl FnMut(u64) -> ScanPage, mut between: impl FnMut(usize)) -> Vec<ScanPage> {
    let (mut out, mut cursor) = (Vec::new(), 0);
    loop {
        let p = page(cursor);
        let distinct: HashSet<&Vec<u8>> = p.keys.iter().collect();
        assert_eq!(distinct.len(), p.keys.len(), "a page repeats a key (page {})", out.len());
        cursor = p.cursor;
        out.push(p);
        if cursor == 0 {
            return out;
        }
        between(out.len());
    }
}

/// The keys of a full scan of `ns` by pages of about `count`, with no key
/// twice (in a page or across pages).
fn scan_all(ns: &Namespace, count: usize) -> HashSet<Vec<u8>> {
    let mut all = HashSet::new();
    for p in pages(|c| ns.scan(c, count).unwrap(), |_| {}) {
        for k in p.keys {
            assert!(all.insert(k.clone()), "{:?} returned twice", String::from_utf8_lossy(&k));
        }
    }
    all
}

/// Sets its flag when dropped: a writer thread told to stop when the
/// scanning thread is done, or panics (a scoped thread's scope would
/// otherwise wait for the writer for ever).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
    }
}

fn keys(prefix: &str, n: usize) -> HashSet<Vec<u8>> {
    (0..n).map(|i| format!("{prefix}{i}").into_bytes()).collect()
}

/// A store whose clock the test sets.
fn store_with_clock(dev_bytes: u64, create: &CreateOptions) -> (Store, Arc<AtomicU32>) {
    let now = Arc::new(AtomicU32::new(1_000_000));
    let clock = {
        let now = now.clone();
        Clock(Arc::new(move || now.load(Relaxed)))
    };
    let open = OpenOptions { clock, entropy: Entropy::seeded(1), ..OpenOptions::default() };
    (Store::create(common::test_device(dev_bytes, create.segment_bytes.unwrap()), create, &open).unwrap(), now)
}

fn small_grains() -> CreateOptions {
    CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: None }
}

/// 20,000 keys in three namespaces (two of them sharing user keys): each
/// namespace's scan returns exactly its keys, whatever the page size, and
/// never the engine's own (the catalog, the flush floor).
#[test]
fn a_scan_returns_exactly_each_namespaces_keys() {
    let (s, _) = store_with_clock(64 << 20, &small_grains());
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    let a = s.create_namespace("a", NamespaceOptions::default()).unwrap();
    let b = s.create_namespace("b", NamespaceOptions::default()).unwrap();
    let (want_d, want_a, want_b) = (keys("d-", 8000), keys("k", 7000), keys("k", 5000));
    for k in &want_d {
        s.put(k, b"v").unwrap();
    }
    for k in &want_a {
        a.put(k, b"va").unwrap();
    }
    for k in &want_b {
        b.put(k, b"vb").unwrap();
    }
    // An empty flush of the default namespace: its floor is an engine key.
    s.put(b"gone", b"v").unwrap();
    s.flush_all().unwrap();
    for k in &want_d {
        s.put(k, b"v2").unwrap();
    }
    assert!(s.stats().index.grows > 0);
    assert_eq!(scan_all(&d, 10), want_d);
    assert_eq!(scan_all(&a, 100), want_a);
    assert_eq!(scan_all(&b, 1000), want_b);
    assert_eq!(scan_all(&b, 1), want_b);
    // The default namespace's scan on the store; pages of about `count`.
    let ps = pages(|c| s.scan(c, 500).unwrap(), |_| {});
    assert!(ps.len() >= 8, "{} pages of about 500 of 8000 keys", ps.len());
    let got: HashSet<Vec<u8>> = ps.into_iter().flat_map(|p| p.keys).collect();
    assert_eq!(got, want_d);
    // The async calls give the same.
    let p = granary_rt::block_on(a.scan_async(0, 50)).unwrap();
    assert_eq!(p, a.scan(0, 50).unwrap());
    let p = granary_rt::block_on(s.scan_async(0, 50)).unwrap();
    assert_eq!(p, s.scan(0, 50).unwrap());
}

/// Deleted and expired keys, and those a flush, a truncate or a drop
/// hid, are not returned.
#[test]
fn deleted_expired_and_flushed_keys_are_not_returned() {
    let (s, now) = store_with_clock(16 << 20, &small_grains());
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    let t = s.create_namespace("ttl", NamespaceOptions { default_ttl_secs: 5, ..Default::default() }).unwrap();
    let mut live = HashSet::new();
    for i in 0..1200u32 {
        let k = format!("k{i}").into_bytes();
        match i % 4 {
            0 => {
                s.put(&k, b"v").unwrap();
                assert!(s.delete(&k).unwrap());
            }
            1 => {
                let meta = ItemMeta { expires: 1_000_010, ..Default::default() };
                s.put_item(&k, b"v", meta, Cond::Always).unwrap();
            }
            _ => {
                s.put(&k, b"v").unwrap();
                live.insert(k.clone());
            }
        }
        t.put(&k, b"v").unwrap();
    }
    assert_eq!(scan_all(&d, 64).len(), 900, "before expiry: the live and the expiring");
    assert_eq!(scan_all(&t, 64).len(), 1200);
    now.store(1_000_010, Relaxed);
    assert_eq!(scan_all(&d, 64), live);
    assert!(scan_all(&t, 64).is_empty(), "the namespace's default TTL passed");
    assert_eq!(s.random_key(7).unwrap().map(|k| live.contains(&k)), Some(true));
    assert_eq!(t.random_key(7).unwrap(), None);
    s.flush_all().unwrap();
    assert!(scan_all(&d, 64).is_empty(), "flushed");
    t.put(b"x", b"v").unwrap();
    assert_eq!(scan_all(&t, 64).len(), 1);
    s.truncate("ttl").unwrap();
    assert!(scan_all(&t, 64).is_empty(), "truncated");
    s.drop_namespace("ttl").unwrap();
    assert!(matches!(t.scan(0, 10), Err(Error::NoSuchNamespace { .. })));
    assert!(matches!(t.random_key(1), Err(Error::NoSuchNamespace { .. })));
}

/// A cursor no page gave (past the last home slot) is an empty last page.
#[test]
fn an_invalid_cursor_is_an_empty_last_page() {
    let (s, _) = store_with_clock(8 << 20, &small_grains());
    for i in 0..100 {
        s.put(format!("k{i}").as_bytes(), b"v").unwrap();
    }
    let homes = s.superblock().index_table_homes as u64;
    for c in [homes, homes + 1, u64::MAX] {
        assert_eq!(s.scan(c, 10).unwrap(), ScanPage { keys: Vec::new(), cursor: 0 });
    }
    // The last valid cursor is the last home: a page, and the end.
    assert_eq!(s.scan(homes - 1, 1000).unwrap().cursor, 0);
}

/// Writers running throughout scans (new keys, overwrites, blind ones
/// among them, deletes), with the GC thread relocating records under them:
/// every key present throughout is returned, once, and only keys present
/// during the scan (never one deleted before it began).
#[test]
fn keys_written_during_a_scan_do_not_break_it() {
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(128 << 10), index_table_homes: Some(64) };
    let open = OpenOptions {
        blind_overwrite_bytes: Some(granary_store::BLIND_OVERWRITE_BYTES_DEFAULT),
        ..OpenOptions::default()
    };
    let s = Store::create(common::test_device(8 << 20, create.segment_bytes.unwrap()), &create, &open).unwrap();
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    let stable = keys("stable-", 3000);
    let deleted = keys("deleted-", 500);
    for k in stable.iter().chain(&deleted) {
        s.put(k, b"v").unwrap();
    }
    for k in &deleted {
        s.delete(k).unwrap();
    }
    let stop = AtomicBool::new(false);
    let rounds = AtomicU64::new(0);
    let relocated = s.stats().gc.records_relocated;
    std::thread::scope(|sc| {
        let writer = sc.spawn(|| {
            let mut rng = SimRng::new(3);
            let mut i = 0u64;
            while !stop.load(Relaxed) {
                let k = format!("stable-{}", rng.below(3000));
                s.put(k.as_bytes(), &[1u8; 300]).unwrap();
                // At most 1,000 of them at a time.
                s.put(format!("new-{i}").as_bytes(), b"n").unwrap();
                if i >= 1000 {
                    s.delete(format!("new-{}", i - 1000).as_bytes()).unwrap();
                }
                i += 1;
                rounds.store(i, Relaxed);
            }
            i
        });
        let stopper = StopOnDrop(&stop);
        // Scans until GC has relocated records and the writer overwritten
        // keys under them (a few scans at least; bounded in time, not in
        // scans, so a writer or GC thread slow to be scheduled still gets
        // there).
        let started = Instant::now();
        let mut scans = 0;
        while scans < 3
            || ((s.stats().gc.records_relocated == relocated || s.stats().blind_overwrites == 0)
                && started.elapsed() < common::WAIT_LIMIT)
        {
            let got = scan_all(&d, 20);
            let missing = stable.difference(&got).count();
            assert_eq!(missing, 0, "scan {scans}: {missing} stable keys missing");
            for k in &got {
                assert!(
                    stable.contains(k) || k.starts_with(b"new-"),
                    "{:?} was not present",
                    String::from_utf8_lossy(k)
                );
            }
            scans += 1;
        }
        drop(stopper);
        assert!(writer.join().unwrap() > 0);
    });
    assert!(s.stats().gc.records_relocated > relocated, "GC relocated nothing during the scans");
    assert!(s.stats().blind_overwrites > 0);
}

/// A few keys overwritten as fast as a writer can (blindly, so their
/// entries and links change all the time), and others now and then, while
/// GC relocates them: scans meet entries that change between their reads
/// of a fingerprint's records and the check after, read again, and still
/// return every key, once.
#[test]
fn keys_overwritten_throughout_a_scan_are_each_returned() {
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), index_table_homes: Some(64) };
    let open = OpenOptions {
        blind_overwrite_bytes: Some(granary_store::BLIND_OVERWRITE_BYTES_DEFAULT),
        ..OpenOptions::default()
    };
    let s = Store::create(common::test_device(4 << 20, create.segment_bytes.unwrap()), &create, &open).unwrap();
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    let hot: Vec<Vec<u8>> = keys("hot-", 64).into_iter().collect();
    let cold: Vec<Vec<u8>> = keys("cold-", 200).into_iter().collect();
    for k in hot.iter().chain(&cold) {
        s.put(k, b"v").unwrap();
    }
    let all: HashSet<Vec<u8>> = hot.iter().chain(&cold).cloned().collect();
    let stop = AtomicBool::new(false);
    let rounds = AtomicU64::new(0);
    std::thread::scope(|sc| {
        let writer = sc.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Relaxed) {
                for k in &hot {
                    s.put(k, &n.to_le_bytes()).unwrap();
                }
                // A live record in most segments, for GC to relocate.
                s.put(&cold[n as usize % cold.len()], &n.to_le_bytes()).unwrap();
                n += 1;
                rounds.store(n, Relaxed);
            }
            n
        });
        let stopper = StopOnDrop(&stop);
        // 2,000 scans at least, and on until GC has relocated records and
        // the writer has gone round a few times (bounded in time).
        let started = Instant::now();
        let mut scans = 0;
        while scans < 2000
            || ((s.stats().gc.records_relocated == 0 || rounds.load(Relaxed) < 10)
                && started.elapsed() < common::WAIT_LIMIT)
        {
            let got = scan_all(&d, 8);
            let missing: Vec<_> = all.difference(&got).map(|k| String::from_utf8_lossy(k).into_owned()).collect();
            assert!(missing.is_empty() && got.len() == all.len(), "scan {scans}: missing {missing:?}");
            scans += 1;
        }
        drop(stopper);
        assert!(writer.join().unwrap() > 0);
    });
    assert!(s.stats().gc.records_relocated > 0);
}

/// A scan whose pages are interleaved with GC reclaiming segments (the
/// records of the keys scanned relocated), with overwrites (blind ones, so
/// links come and go) and with inserts that double the index's tables:
/// every key present throughout is returned, each once.
#[test]
fn a_scan_survives_gc_and_index_growth() {
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(128 << 10), index_table_homes: Some(64) };
    let open = OpenOptions {
        background: Background::Manual,
        entropy: Entropy::seeded(5),
        blind_overwrite_bytes: Some(granary_store::BLIND_OVERWRITE_BYTES_DEFAULT),
        checkpoint_interval: None,
        ..OpenOptions::default()
    };
    let s = Store::create(common::test_device(8 << 20, create.segment_bytes.unwrap()), &create, &open).unwrap();
    let stable: Vec<Vec<u8>> = (0..2000).map(|i| format!("stable-{i}").into_bytes()).collect();
    for k in &stable {
        s.put(k, &[0u8; 200]).unwrap();
    }
    let mut rng = SimRng::new(11);
    let before = s.stats();
    let mut fresh = 0;
    let mut seen = HashSet::new();
    let ps = pages(
        |c| s.scan(c, 20).unwrap(),
        |_| {
            for _ in 0..100 {
                let k = &stable[rng.below(stable.len() as u64) as usize];
                s.put(k, &[1u8; 200]).unwrap();
            }
            for _ in 0..100 {
                s.put(format!("new-{fresh}").as_bytes(), b"n").unwrap();
                fresh += 1;
            }
            for _ in 0..4 {
                s.gc_step();
            }
        },
    );
    for p in &ps {
        for k in &p.keys {
            assert!(seen.insert(k.clone()), "{:?} returned twice", String::from_utf8_lossy(k));
        }
    }
    let after = s.stats();
    assert!(ps.len() > 10, "{} pages", ps.len());
    assert!(after.index.grows > before.index.grows, "the index did not grow during the scan");
    assert!(after.gc.records_relocated > before.gc.records_relocated, "GC relocated nothing during the scan");
    assert!(after.blind_overwrites > before.blind_overwrites);
    for k in &stable {
        assert!(seen.contains(k), "{:?} missing", String::from_utf8_lossy(k));
    }
    for k in &seen {
        assert!(k.starts_with(b"stable-") || k.starts_with(b"new-"));
    }
    assert!(s.verify().unwrap().is_clean());
}

/// Keys reachable only through a blind overwrite's link (the entry of a
/// key displaced by another key's overwrite with the same home slot and
/// key tag) are returned, and the scan settles nothing.
#[test]
fn keys_displaced_by_blind_overwrites_are_returned() {
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), index_table_homes: Some(64) };
    let open = OpenOptions {
        blind_overwrite_bytes: Some(granary_store::BLIND_OVERWRITE_BYTES_DEFAULT),
        gc: false,
        checkpoint_on_close: false,
        checkpoint_interval: None,
        ..OpenOptions::default()
    };
    let s = Store::create(common::test_device(16 << 20, create.segment_bytes.unwrap()), &create, &open).unwrap();
    let groups = common::colliding_groups(s.superblock().key_hasher(), "blind-", 6, 2);
    // Each group's first key, then its second: the second's one candidate
    // is the first's entry, which it displaces blindly.
    for k in groups.iter().step_by(2).chain(groups.iter().skip(1).step_by(2)) {
        s.put(k, k).unwrap();
    }
    let st = s.stats();
    assert_eq!((st.blind_overwrites, st.unsettled_links), (6, 6), "the second keys did not displace the first");
    let want: HashSet<Vec<u8>> = groups.iter().cloned().collect();
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    for count in [1, 5, 100] {
        assert_eq!(scan_all(&d, count), want, "count {count}");
    }
    assert_eq!(s.stats().unsettled_links, 6, "a scan settled links");
    // A displaced key deleted: gone from the scan, its head's key kept.
    s.delete(&groups[0]).unwrap();
    let mut want = want;
    want.remove(&groups[0]);
    assert_eq!(scan_all(&d, 3), want);
}

/// `random_key`: None for an empty namespace (other namespaces' keys and
/// the engine's own do not count), a live key of the namespace otherwise,
/// spread over the keys by seed.
#[test]
fn random_key_finds_a_live_key_or_none() {
    let (s, _) = store_with_clock(16 << 20, &small_grains());
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    let a = s.create_namespace("a", NamespaceOptions::default()).unwrap();
    let b = s.create_namespace("b", NamespaceOptions::default()).unwrap();
    assert_eq!(s.random_key(1).unwrap(), None, "only the catalog, an engine key");
    let want = keys("k", 1000);
    for k in &want {
        a.put(k, b"v").unwrap();
    }
    for seed in 0..20 {
        assert_eq!(d.random_key(seed).unwrap(), None);
        assert_eq!(b.random_key(seed).unwrap(), None);
    }
    let mut picked = HashSet::new();
    for seed in 0..200 {
        let k = a.random_key(seed).unwrap().expect("a key");
        assert!(want.contains(&k));
        picked.insert(k);
    }
    assert!(picked.len() > 50, "200 seeds picked {} keys of 1000", picked.len());
    // One key among many of other namespaces: found from any seed.
    b.put(b"only", b"v").unwrap();
    for seed in 0..20 {
        assert_eq!(b.random_key(seed).unwrap().as_deref(), Some(&b"only"[..]));
    }
    assert_eq!(granary_rt::block_on(b.random_key_async(3)).unwrap().as_deref(), Some(&b"only"[..]));
    b.delete(b"only").unwrap();
    assert_eq!(b.random_key(5).unwrap(), None);
}
