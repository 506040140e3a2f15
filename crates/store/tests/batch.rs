//! Atomic batches: all or nothing, conditions checked at commit, limits
//! refused with nothing applied, readers never seeing half a batch, and a
//! crash anywhere (torn and lost writes included) leaving every batch
//! whole or absent.

mod common;

use granary_store::io::{CrashKind, FaultDevice, SimRng};
use granary_store::{
    Background, BatchOp, BatchOutcome, Clock, Cond, CreateOptions, Durability, Entropy, Error, ItemMeta,
    NamespaceOptions, OpenOptions, PutOutcome, Store, BATCH_OPS_MAX, DEFAULT_NAMESPACE,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::Arc;

/// A device for a store of [`create_opts`]'s segments: in memory, or the
/// emulated zoned device with `GRANARY_TEST_BACKEND=zoned` (the crash
/// cases keep their simulated devices).
fn device(size: u64) -> Arc<granary_store::io::TestDevice> {
    common::test_device(size, create_opts().segment_bytes.unwrap())
}

fn create_opts() -> CreateOptions {
    CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), index_table_homes: Some(256) }
}

/// Deterministic opens; blind overwrites on (the in-memory devices leave
/// them off by default), so batches take the no-read path for keys with
/// one candidate.
fn opts(durability: Durability) -> OpenOptions {
    let now = Arc::new(AtomicU32::new(1_000_000));
    OpenOptions {
        background: Background::Manual,
        clock: Clock(Arc::new(move || now.load(Relaxed))),
        durability,
        entropy: Entropy::seeded(3),
        blind_overwrite_bytes: Some(1 << 20),
        ..Default::default()
    }
}

/// A batch's delete of a key already deleted (its version a tombstone)
/// writes nothing and counts no delete, as a single delete (with blind
/// overwrites off: a blind one writes without reading); one of an
/// expired value writes its tombstone but is not a namespace's delete.
/// (It wrote a second tombstone and counted a delete each time.)
#[test]
fn a_batch_delete_of_a_deleted_key_writes_nothing() {
    let now = Arc::new(AtomicU32::new(1_000_000));
    let clock = now.clone();
    // Reads before writing (a blind delete writes without knowing).
    let o = OpenOptions {
        clock: Clock(Arc::new(move || clock.load(Relaxed))),
        blind_overwrite_bytes: Some(0),
        ..opts(Durability::Direct)
    };
    let s = Store::create(device(8 << 20), &create_opts(), &o).unwrap();
    let u = s.create_namespace("u", NamespaceOptions::default()).unwrap();
    u.put(b"k", b"v").unwrap();
    assert!(u.delete(b"k").unwrap());
    let deletes = |s: &Store| s.namespaces().into_iter().find(|n| n.name == "u").unwrap().deletes;
    let before = (s.stats().deletes, deletes(&s), s.stats().tombstones);
    assert_eq!(before.1, 1);
    let mut b = s.batch();
    b.delete(&u, b"k").put(&u, b"other", b"x");
    assert!(matches!(b.commit().unwrap(), BatchOutcome::Committed { .. }));
    assert_eq!((s.stats().deletes, deletes(&s), s.stats().tombstones), before, "a second tombstone");
    // An expired value: its tombstone is written, no namespace delete counted.
    u.put_item(b"e", b"v", ItemMeta { expires: 1_000_010, ..ItemMeta::default() }, Cond::Always).unwrap();
    now.store(1_000_020, Relaxed);
    let mut b = s.batch();
    b.delete(&u, b"e");
    assert!(matches!(b.commit().unwrap(), BatchOutcome::Committed { .. }));
    assert_eq!((s.stats().deletes, deletes(&s)), (before.0 + 1, 1));
    assert_eq!(u.get(b"e").unwrap(), None);
}

/// A namespace handle of another store is refused, nothing applied: its
/// id names another namespace here (two stores' first namespaces share
/// id 1: the key landed in this store's namespace).
#[test]
fn a_batch_refuses_a_namespace_of_another_store() {
    let s1 = Store::create(device(8 << 20), &create_opts(), &opts(Durability::Direct)).unwrap();
    let s2 = Store::create(device(8 << 20), &create_opts(), &opts(Durability::Direct)).unwrap();
    let a = s1.create_namespace("a", NamespaceOptions::default()).unwrap();
    let b = s2.create_namespace("b", NamespaceOptions::default()).unwrap();
    let d2 = s2.namespace(DEFAULT_NAMESPACE).unwrap();
    let mut batch = s2.batch();
    batch.put(&d2, b"mine", b"1").put(&a, b"k", b"v");
    let e = batch.commit().unwrap_err();
    assert!(matches!(e, Error::BadBatch(_)) && e.to_string().contains("another store"), "{e}");
    let mut batch = s2.batch();
    batch.put(&a, b"k", b"v");
    assert!(matches!(granary_rt::block_on(batch.commit_async()), Err(Error::BadBatch(_))));
    assert_eq!(b.get(b"k").unwrap(), None);
    assert_eq!(s2.get(b"mine").unwrap(), None);
    assert_eq!(a.get(b"k").unwrap(), None);
}

#[test]
fn a_batch_applies_every_operation_or_none() {
    let s = Store::create(device(8 << 20), &create_opts(), &opts(Durability::Direct)).unwrap();
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    let u = s.create_namespace("users", NamespaceOptions::default()).unwrap();
    s.put(b"gone", b"x").unwrap();
    let mut b = s.batch();
    b.put(&d, b"a", b"1").put(&u, b"a", b"2").delete(&d, b"gone").put_absent(&u, b"new", b"3").delete(&d, b"never");
    let cas = match b.commit().unwrap() {
        BatchOutcome::Committed { cas } => cas,
        o => panic!("{o:?}"),
    };
    assert_eq!(cas.len(), 5);
    assert_eq!((cas[2], cas[4]), (0, 0), "deletes have no CAS value");
    assert_eq!(s.get(b"a").unwrap().unwrap(), b"1");
    assert_eq!(u.get(b"a").unwrap().unwrap(), b"2");
    assert_eq!(s.get(b"gone").unwrap(), None);
    assert_eq!(u.get_item(b"new").unwrap().unwrap().cas, cas[3]);

    // A failed condition: nothing of the batch is applied.
    let mut b = s.batch();
    b.put(&d, b"a", b"changed").put_absent(&u, b"new", b"again").put(&u, b"z", b"z");
    assert_eq!(b.commit().unwrap(), BatchOutcome::ConditionFailed { op: 1, outcome: PutOutcome::Exists });
    assert_eq!(s.get(b"a").unwrap().unwrap(), b"1");
    assert_eq!(u.get(b"z").unwrap(), None);
    let mut b = s.batch();
    b.cas(&u, b"a", cas[1] + 1000, b"no").put(&d, b"a", b"changed");
    assert_eq!(b.commit().unwrap(), BatchOutcome::ConditionFailed { op: 0, outcome: PutOutcome::Exists });
    let mut b = s.batch();
    b.op(&u, b"absent", BatchOp::PutPresent { value: b"v".to_vec(), meta: ItemMeta::default() });
    assert_eq!(b.commit().unwrap(), BatchOutcome::ConditionFailed { op: 0, outcome: PutOutcome::NotFound });
    // The right CAS value commits.
    let mut b = s.batch();
    b.cas(&u, b"a", cas[1], b"cas").put(&d, b"a", b"changed");
    assert!(matches!(b.commit().unwrap(), BatchOutcome::Committed { .. }));
    assert_eq!((u.get(b"a").unwrap().unwrap(), s.get(b"a").unwrap().unwrap()), (b"cas".to_vec(), b"changed".to_vec()));
    s.verify().unwrap();
}

#[test]
fn limits_are_refused_with_nothing_applied() {
    let s = Store::create(device(8 << 20), &create_opts(), &opts(Durability::Direct)).unwrap();
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    let mut b = s.batch();
    b.put(&d, b"k", b"1").put(&d, b"k", b"2");
    assert!(matches!(b.commit(), Err(Error::BadBatch(why)) if why.contains("twice")));
    let mut b = s.batch();
    for i in 0..=BATCH_OPS_MAX {
        b.put(&d, format!("k{i}").as_bytes(), b"v");
    }
    assert!(matches!(b.commit(), Err(Error::BadBatch(why)) if why.contains("at most")));
    let mut b = s.batch();
    for i in 0..20 {
        b.put(&d, format!("big{i}").as_bytes(), &[1u8; 4000]);
    }
    assert!(matches!(b.commit(), Err(Error::BadBatch(why)) if why.contains("one segment")));
    assert_eq!(s.get(b"k").unwrap(), None);
    assert_eq!(s.get(b"big0").unwrap(), None);
    assert_eq!(s.stats().keys, 0);
}

/// A batch's value written without an expiry gets its namespace's default
/// TTL, as a PUT does; one added with `op_exact` is written as given (0:
/// none), whatever the operation.
#[test]
fn a_batch_gives_the_default_ttl_unless_an_operation_is_exact() {
    let s = Store::create(device(8 << 20), &create_opts(), &opts(Durability::Direct)).unwrap();
    let t = s.create_namespace("t", NamespaceOptions { default_ttl_secs: 100, ..Default::default() }).unwrap();
    let now = s.now();
    t.put(b"c", b"0").unwrap();
    let cas = t.get_item(b"c").unwrap().unwrap().cas;
    let meta = ItemMeta::default();
    let v = || b"v".to_vec();
    let mut b = s.batch();
    b.op(&t, b"a", BatchOp::Put { value: v(), meta }).op_exact(&t, b"b", BatchOp::Put { value: v(), meta });
    b.op_exact(&t, b"c", BatchOp::Cas { cas, value: v(), meta });
    b.op_exact(&t, b"d", BatchOp::PutAbsent { value: v(), meta: ItemMeta { expires: now + 7, ..meta } });
    b.op(&t, b"e", BatchOp::PutAbsent { value: v(), meta: ItemMeta { expires: now + 7, ..meta } });
    assert!(matches!(b.commit().unwrap(), BatchOutcome::Committed { .. }));
    let expires = |k: &[u8]| t.get_item(k).unwrap().unwrap().meta.expires;
    assert_eq!(expires(b"a"), now + 100);
    assert_eq!((expires(b"b"), expires(b"c")), (0, 0));
    assert_eq!((expires(b"d"), expires(b"e")), (now + 7, now + 7));
}

/// A namespace's quota counts a batch's earlier writes for its later ones.
#[test]
fn a_batch_is_held_to_its_namespaces_quotas() {
    let s = Store::create(device(8 << 20), &create_opts(), &opts(Durability::Direct)).unwrap();
    let q = s.create_namespace("q", NamespaceOptions { max_keys: Some(2), ..Default::default() }).unwrap();
    let mut b = s.batch();
    b.put(&q, b"a", b"1").put(&q, b"b", b"2").put(&q, b"c", b"3");
    assert!(matches!(b.commit(), Err(Error::QuotaExceeded { what: "keys", limit: 2, .. })));
    assert_eq!(q.stats().unwrap().keys, 0, "nothing applied");
    let mut b = s.batch();
    b.put(&q, b"a", b"1").put(&q, b"b", b"2");
    assert!(matches!(b.commit().unwrap(), BatchOutcome::Committed { .. }));
    let mut b = s.batch();
    b.put_absent(&q, b"c", b"3");
    assert!(matches!(b.commit(), Err(Error::QuotaExceeded { .. })));
    let mut b = s.batch();
    b.delete(&q, b"twice").delete(&q, b"twice");
    assert!(matches!(b.commit(), Err(Error::BadBatch(why)) if why.contains("\"twice\"")), "the key is named as text");
}

/// A batch's write of a key whose last version is a tombstone adds a key
/// for the later writes' quota checks, as a single write counts it (each
/// was taken for an overwrite: a batch passed `max_keys` by one key less
/// than it held tombstones). Its overwrites of values, expired ones
/// included, add none.
#[test]
fn a_batch_counts_writes_over_tombstones_as_new_keys() {
    let s = Store::create(device(8 << 20), &create_opts(), &opts(Durability::Direct)).unwrap();
    let q = s.create_namespace("q", NamespaceOptions { max_keys: Some(2), ..Default::default() }).unwrap();
    for k in [&b"b"[..], b"c"] {
        q.put(k, b"old").unwrap();
        assert!(q.delete(k).unwrap());
    }
    q.put(b"a", b"1").unwrap();
    let mut b = s.batch();
    b.put(&q, b"b", b"2").put(&q, b"c", b"3");
    assert!(matches!(b.commit(), Err(Error::QuotaExceeded { what: "keys", limit: 2, .. })));
    let mut b = s.batch();
    b.put_absent(&q, b"b", b"2").put_absent(&q, b"c", b"3");
    assert!(matches!(b.commit(), Err(Error::QuotaExceeded { what: "keys", limit: 2, .. })));
    assert_eq!(q.stats().unwrap().keys, 1, "nothing applied");
    // Overwrites of values the counters count add no key.
    q.put(b"b", b"2").unwrap();
    let mut b = s.batch();
    b.put(&q, b"a", b"x").put(&q, b"b", b"y");
    assert!(matches!(b.commit().unwrap(), BatchOutcome::Committed { .. }));
    assert_eq!(q.stats().unwrap().keys, 2);
}

/// In a cache namespace at its `max_keys` quota, a batch of writes that
/// need their keys present (CAS, replace-only) adds no key, so evicts
/// nothing before it commits, as their single writes would not (counted
/// as new keys, they evicted the oldest value, their own CAS target).
#[test]
fn a_batch_of_cas_writes_at_a_cache_quota_evicts_nothing() {
    let s = Store::create(device(8 << 20), &create_opts(), &OpenOptions { evict: true, ..opts(Durability::Direct) })
        .unwrap();
    let q = s.create_namespace("q", NamespaceOptions { max_keys: Some(2), ..Default::default() }).unwrap();
    let (_, cas) = q.put_item(b"a", b"1", ItemMeta::default(), Cond::Always).unwrap();
    q.put(b"b", b"2").unwrap();
    let mut b = s.batch();
    b.cas(&q, b"a", cas, b"x").op(&q, b"b", BatchOp::PutPresent { value: b"y".to_vec(), meta: ItemMeta::default() });
    assert!(matches!(b.commit().unwrap(), BatchOutcome::Committed { .. }));
    assert_eq!((q.get(b"a").unwrap().as_deref(), q.get(b"b").unwrap().as_deref()), (Some(&b"x"[..]), Some(&b"y"[..])));
    assert_eq!(q.stats().unwrap().keys, 2);
}

/// A reader that saw one key of a batch never sees an older value of
/// another key of it afterwards.
#[test]
fn readers_never_see_half_a_batch() {
    let s = Arc::new(Store::create(device(32 << 20), &create_opts(), &opts(Durability::Direct)).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicBool::new(false));
    let reader = {
        let (s, stop, started) = (s.clone(), stop.clone(), started.clone());
        std::thread::spawn(move || {
            let mut checks = 0u64;
            while !stop.load(Relaxed) {
                let version =
                    |k: &[u8]| s.get(k).unwrap().map_or(0, |v| u64::from_le_bytes(v[..8].try_into().unwrap()));
                let a = version(b"a");
                let b = version(b"b");
                assert!(b >= a, "read a at version {a}, then b at the older {b}");
                checks += 1;
                started.store(true, Relaxed);
            }
            checks
        })
    };
    // The batches start once the reader reads (bounded), however the
    // threads are scheduled.
    common::wait_until(|| started.load(Relaxed));
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    for v in 1..=3_000u64 {
        let mut b = s.batch();
        // `a` is published first: a reader that saw its new value must not
        // find `b` older.
        b.put(&d, b"a", &v.to_le_bytes()).put(&d, b"b", &v.to_le_bytes());
        assert!(matches!(b.commit().unwrap(), BatchOutcome::Committed { .. }));
        if v % 64 == 0 {
            s.gc_step();
        }
    }
    stop.store(true, Relaxed);
    assert!(reader.join().unwrap() > 0);
}

/// A store whose clock the test moves (deterministic opens as [`opts`]).
fn store_with_clock() -> (Store, Arc<AtomicU32>) {
    let now = Arc::new(AtomicU32::new(1_000_000));
    let clock = {
        let now = now.clone();
        Clock(Arc::new(move || now.load(Relaxed)))
    };
    let o = OpenOptions { clock, ..opts(Durability::Direct) };
    (Store::create(device(8 << 20), &create_opts(), &o).unwrap(), now)
}

fn committed(o: BatchOutcome) -> Vec<u64> {
    match o {
        BatchOutcome::Committed { cas } => cas,
        o => panic!("not committed: {o:?}"),
    }
}

/// `Check`: the key's live version has the CAS value given, or (None) the
/// key holds no live value; each failure names its operation and outcome,
/// and nothing of the batch is applied.
#[test]
fn a_check_passes_or_fails_the_batch() {
    let (s, now) = store_with_clock();
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    let u = s.create_namespace("users", NamespaceOptions::default()).unwrap();
    s.put(b"k", b"v").unwrap();
    let cas = s.get_item(b"k").unwrap().unwrap().cas;

    // Passing: the right CAS value, and an absent key checked absent.
    let mut b = s.batch();
    b.check(&d, b"k", Some(cas)).check(&u, b"k", None).put(&u, b"out", b"1");
    let got = committed(b.commit().unwrap());
    assert_eq!(got.len(), 3);
    assert_eq!((got[0], got[1]), (0, 0), "checks have no CAS value");
    assert_eq!(u.get_item(b"out").unwrap().unwrap().cas, got[2]);
    assert_eq!(s.get_item(b"k").unwrap().unwrap().cas, cas, "a check writes nothing to its key");

    // Failing, each way; the batch's write is not applied.
    let fails = |check: Option<u64>, key: &[u8], outcome: PutOutcome| {
        let mut b = s.batch();
        b.put(&u, b"out", b"2").check(&d, key, check);
        assert_eq!(b.commit().unwrap(), BatchOutcome::ConditionFailed { op: 1, outcome }, "{check:?} {key:?}");
        assert_eq!(u.get(b"out").unwrap().unwrap(), b"1", "nothing applied");
    };
    fails(Some(cas + 1), b"k", PutOutcome::Exists);
    fails(None, b"k", PutOutcome::Exists);
    fails(Some(cas), b"absent", PutOutcome::NotFound);

    // An expired value is no value.
    let meta = ItemMeta { expires: 1_000_010, ..Default::default() };
    s.put_item(b"ttl", b"v", meta, granary_store::Cond::Always).unwrap();
    let ttl_cas = s.get_item(b"ttl").unwrap().unwrap().cas;
    fails(None, b"ttl", PutOutcome::Exists);
    now.store(1_000_010, Relaxed);
    fails(Some(ttl_cas), b"ttl", PutOutcome::NotFound);
    let mut b = s.batch();
    b.check(&d, b"ttl", None);
    committed(b.commit().unwrap());
    s.verify().unwrap();
}

/// A batch of checks alone takes its keys' stripes and checks them, and
/// writes nothing at all: no record, no commit record, no sequence number.
#[test]
fn a_batch_of_checks_writes_nothing() {
    let (s, _) = store_with_clock();
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    s.put(b"a", b"1").unwrap();
    let cas = s.get_item(b"a").unwrap().unwrap().cas;
    let (writes, seq) = (s.stats().io.writes, s.stats().next_seq);
    let mut b = s.batch();
    b.check(&d, b"a", Some(cas)).check(&d, b"b", None);
    assert_eq!(committed(b.commit().unwrap()), vec![0, 0]);
    let mut b = s.batch();
    b.check(&d, b"a", None);
    assert_eq!(b.commit().unwrap(), BatchOutcome::ConditionFailed { op: 0, outcome: PutOutcome::Exists });
    assert_eq!((s.stats().io.writes, s.stats().next_seq), (writes, seq), "a batch of checks wrote");
}

/// `DeleteCas` deletes only the version it names.
#[test]
fn delete_cas_deletes_only_the_version_named() {
    let (s, _) = store_with_clock();
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    s.put(b"k", b"v1").unwrap();
    let old = s.get_item(b"k").unwrap().unwrap().cas;
    s.put(b"k", b"v2").unwrap();
    let cas = s.get_item(b"k").unwrap().unwrap().cas;
    let mut b = s.batch();
    b.put(&d, b"other", b"x").delete_cas(&d, b"k", old);
    assert_eq!(b.commit().unwrap(), BatchOutcome::ConditionFailed { op: 1, outcome: PutOutcome::Exists });
    let mut b = s.batch();
    b.delete_cas(&d, b"absent", cas);
    assert_eq!(b.commit().unwrap(), BatchOutcome::ConditionFailed { op: 0, outcome: PutOutcome::NotFound });
    assert_eq!((s.get(b"k").unwrap().unwrap(), s.get(b"other").unwrap()), (b"v2".to_vec(), None));
    let mut b = s.batch();
    b.delete_cas(&d, b"k", cas).put(&d, b"other", b"x");
    let got = committed(b.commit().unwrap());
    assert_eq!(got[0], 0, "a delete has no CAS value");
    assert_eq!((s.get(b"k").unwrap(), s.get(b"other").unwrap()), (None, Some(b"x".to_vec())));
    let mut b = s.batch();
    b.delete_cas(&d, b"k", cas);
    assert_eq!(b.commit().unwrap(), BatchOutcome::ConditionFailed { op: 0, outcome: PutOutcome::NotFound });
    s.verify().unwrap();
    // The delete is durable: a crash and recovery keep it.
    let dev = device(8 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts(Durability::Direct)).unwrap();
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    s.put(b"k", b"v").unwrap();
    let cas = s.get_item(b"k").unwrap().unwrap().cas;
    let mut b = s.batch();
    b.delete_cas(&d, b"k", cas).check(&d, b"w", None).put(&d, b"p", b"1");
    committed(b.commit().unwrap());
    drop(d);
    drop(s);
    let s = Store::open(dev, &OpenOptions { use_checkpoint: false, ..opts(Durability::Direct) }).unwrap();
    assert_eq!((s.get(b"k").unwrap(), s.get(b"p").unwrap()), (None, Some(b"1".to_vec())));
    assert_eq!(s.get(b"w").unwrap(), None);
    assert!(s.verify().unwrap().is_clean());
}

/// Batches of shrinking and growing sizes on one thread (each encoded
/// into the buffer the last one left, bytes of the larger ones still in
/// it): every batch reads back, and recovery by log scan finds each whole.
#[test]
fn batches_of_varying_size_on_one_thread_recover_whole() {
    let dev = device(8 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts(Durability::Direct)).unwrap();
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    let mut want: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    // Sizes in grains per record: large, then small, then large again.
    for (round, (keys, value_bytes)) in
        [(12u64, 3000usize), (3, 10), (1, 700), (12, 1500), (2, 4000)].into_iter().enumerate()
    {
        let mut b = s.batch();
        for k in 0..keys {
            let key = format!("r{round}-k{k}").into_bytes();
            let v = [b'a' + (round as u8), value_bytes.max(1) as u8].repeat(value_bytes / 2 + 1);
            b.put(&d, &key, &v);
            want.insert(key, v);
        }
        committed(b.commit().unwrap());
        for (k, v) in &want {
            assert_eq!(s.get(k).unwrap().as_ref(), Some(v), "round {round}: key {}", k.escape_ascii());
        }
    }
    drop(d);
    drop(s);
    let s = Store::open(dev, &OpenOptions { use_checkpoint: false, ..opts(Durability::Direct) }).unwrap();
    for (k, v) in &want {
        assert_eq!(s.get(k).unwrap().as_ref(), Some(v), "after recovery: key {}", k.escape_ascii());
    }
    assert!(s.verify().unwrap().is_clean());
}

/// WATCH over MULTI/EXEC: a write between the read and the commit fails
/// the batch (the key changed, was created, or was deleted).
#[test]
fn a_write_between_read_and_commit_fails_the_batch() {
    let (s, _) = store_with_clock();
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    s.put(b"w", b"1").unwrap();
    let seen = s.get_item(b"w").unwrap().unwrap().cas;
    s.put(b"w", b"2").unwrap(); // another client
    let mut b = s.batch();
    b.check(&d, b"w", Some(seen)).put(&d, b"out", b"x");
    assert_eq!(b.commit().unwrap(), BatchOutcome::ConditionFailed { op: 0, outcome: PutOutcome::Exists });
    let mut b = s.batch();
    b.put(&d, b"out", b"x").delete_cas(&d, b"w", seen);
    assert_eq!(b.commit().unwrap(), BatchOutcome::ConditionFailed { op: 1, outcome: PutOutcome::Exists });
    // Watched absent, then created.
    assert!(s.get_item(b"n").unwrap().is_none());
    s.put(b"n", b"new").unwrap();
    let mut b = s.batch();
    b.check(&d, b"n", None).put(&d, b"out", b"x");
    assert_eq!(b.commit().unwrap(), BatchOutcome::ConditionFailed { op: 0, outcome: PutOutcome::Exists });
    // Watched present, then deleted.
    let seen = s.get_item(b"w").unwrap().unwrap().cas;
    s.delete(b"w").unwrap();
    let mut b = s.batch();
    b.check(&d, b"w", Some(seen)).put(&d, b"out", b"x");
    assert_eq!(b.commit().unwrap(), BatchOutcome::ConditionFailed { op: 0, outcome: PutOutcome::NotFound });
    assert_eq!(s.get(b"out").unwrap(), None);
}

/// Write skew: two clients each read both keys and turn their own off only
/// if the other's is still on, checking the other's version at commit.
/// Both commit at once (a barrier between the reads and the commits): the
/// checks hold at the commit point only if they hold the checked key's
/// stripe, so exactly one commits and one key stays on.
#[test]
fn concurrent_checks_prevent_write_skew() {
    let s = Arc::new(Store::create(device(8 << 20), &create_opts(), &opts(Durability::Direct)).unwrap());
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    let keys: [&[u8]; 2] = [b"alice", b"bob"];
    for round in 0..200 {
        for k in keys {
            s.put(k, b"on").unwrap();
        }
        let barrier = std::sync::Barrier::new(2);
        let outcomes: Vec<BatchOutcome> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..2)
                .map(|me| {
                    let (s, d, barrier) = (&s, &d, &barrier);
                    sc.spawn(move || {
                        let mine = s.get_item(keys[me]).unwrap().unwrap();
                        let other = s.get_item(keys[1 - me]).unwrap().unwrap();
                        assert_eq!(other.value, b"on");
                        barrier.wait();
                        let mut b = s.batch();
                        b.check(d, keys[1 - me], Some(other.cas)).cas(d, keys[me], mine.cas, b"off");
                        b.commit().unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ok = outcomes.iter().filter(|o| matches!(o, BatchOutcome::Committed { .. })).count();
        assert_eq!(ok, 1, "round {round}: {outcomes:?}");
        let failed = outcomes.iter().find(|o| !matches!(o, BatchOutcome::Committed { .. })).unwrap();
        assert_eq!(failed, &BatchOutcome::ConditionFailed { op: 0, outcome: PutOutcome::Exists }, "round {round}");
        let on = keys.iter().filter(|k| s.get(k).unwrap().unwrap() == b"on").count();
        assert_eq!(on, 1, "round {round}");
    }
}

/// The model of one key: its acknowledged version, or absent.
type Model = HashMap<u64, Option<u64>>;

fn key(k: u64) -> Vec<u8> {
    format!("key{k}").into_bytes()
}

fn value(k: u64, v: u64) -> Vec<u8> {
    let mut b = v.to_le_bytes().to_vec();
    b.extend(std::iter::repeat_n(k as u8, 40 + (k as usize % 7) * 90));
    b
}

/// Crashes anywhere among batches (with conditions, over two namespaces),
/// ordinary writes, drops and re-creations of a namespace, checkpoints and
/// GC (no key of a dropped generation may come back): after recovery every acknowledged batch is whole,
/// every batch cut short is whole or absent, and nothing else changed.
#[test]
fn crashes_leave_every_batch_whole_or_absent() {
    let seeds: u64 = std::env::var("GRANARY_BATCH_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let mut applied = 0;
    for seed in 0..seeds {
        match std::panic::catch_unwind(|| one_crash(seed)) {
            Ok(a) => applied += a,
            Err(e) => {
                eprintln!("batch crash simulation failed with seed {seed} (rerun: GRANARY_BATCH_SEEDS)");
                std::panic::resume_unwind(e);
            }
        }
    }
    assert!(applied > seeds / 10, "recoveries applied {applied} batches from the log in {seeds} seeds");
}

/// One seed; returns the batches its recovery applied from the log.
fn one_crash(seed: u64) -> u64 {
    let mut rng = SimRng::new(seed);
    let (kind, durability) = if seed.is_multiple_of(2) {
        (CrashKind::Process, Durability::Direct)
    } else {
        (CrashKind::Power, Durability::Flush)
    };
    let dev = Arc::new(FaultDevice::new(2 << 20, seed));
    let s = Store::create(dev.clone(), &create_opts(), &opts(durability)).unwrap();
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    // Keys 0..12 are the default namespace's, 12..24 namespace "a"'s,
    // which is dropped and created again now and then.
    let mut a = s.create_namespace("a", NamespaceOptions::default()).unwrap();
    let mut model: Model = HashMap::new();
    // A drop and re-creation of "a" the crash cut short.
    let mut cut_drop = false;
    // The batch the crash cut short: (key, version or delete) of each op.
    let mut cut: Option<Vec<(u64, Option<u64>)>> = None;
    dev.plan_crash(rng.below(60), kind);
    for version in 1..=40u64 {
        if rng.below(25) == 0 {
            let r = s.drop_namespace("a").and_then(|()| s.create_namespace("a", NamespaceOptions::default()));
            match r {
                Ok(ns) => {
                    a = ns;
                    model.retain(|&k, _| k < 12);
                }
                Err(Error::Io { .. } | Error::Poisoned { .. }) => {
                    cut_drop = true;
                    break;
                }
                Err(e) => panic!("seed {seed}: {e}"),
            }
            if dev.crashed() {
                break;
            }
            continue;
        }
        if rng.below(4) == 0 {
            // An ordinary write among the batches.
            let k = rng.below(24);
            let ns = if k < 12 { &d } else { &a };
            match ns.put(&key(k), &value(k, version)) {
                Ok(()) => {
                    model.insert(k, Some(version));
                }
                Err(Error::Io { .. } | Error::Poisoned { .. }) => {
                    cut = Some(vec![(k, Some(version))]);
                    break;
                }
                Err(e) => panic!("seed {seed}: {e}"),
            }
            if dev.crashed() {
                break;
            }
            continue;
        }
        let ops = 1 + rng.below(6);
        let mut b = s.batch();
        let mut want = Vec::new();
        // Every operation's key, checks' included (they write nothing, so
        // they are not in `want`).
        let mut op_keys = Vec::new();
        let mut keys = std::collections::HashSet::new();
        for _ in 0..ops {
            let k = rng.below(24);
            if !keys.insert(k) {
                continue;
            }
            op_keys.push(k);
            let ns = if k < 12 { &d } else { &a };
            match rng.below(12) {
                10 => {
                    // A check writes no record: the commit record vouches
                    // for the others only.
                    b.check(ns, &key(k), None);
                }
                0 | 1 => {
                    b.delete(ns, &key(k));
                    want.push((k, None));
                }
                2 => {
                    b.put_absent(ns, &key(k), &value(k, version));
                    want.push((k, Some(version)));
                }
                _ => {
                    b.put(ns, &key(k), &value(k, version));
                    want.push((k, Some(version)));
                }
            }
        }
        match b.commit() {
            Ok(BatchOutcome::Committed { .. }) => {
                for (k, v) in want {
                    model.insert(k, v);
                }
            }
            Ok(BatchOutcome::ConditionFailed { op, outcome }) => {
                // A put_absent or a check of absence of a key the model
                // holds: it must have failed.
                assert_eq!(outcome, PutOutcome::Exists, "seed {seed}");
                let k = op_keys[op];
                assert!(model.get(&k).copied().flatten().is_some(), "seed {seed}: condition on key {k}");
            }
            Err(Error::Io { .. } | Error::Poisoned { .. }) => {
                cut = Some(want);
                break;
            }
            Err(e) => panic!("seed {seed}: {e}"),
        }
        match rng.below(12) {
            0 => {
                let _ = s.checkpoint();
            }
            1 | 2 => {
                s.gc_step();
            }
            _ => {}
        }
        if dev.crashed() {
            break;
        }
    }
    drop((d, a));
    drop(s);
    dev.restart();
    let s = Store::open(dev.clone(), &opts(durability)).unwrap_or_else(|e| panic!("seed {seed}: reopen: {e}"));
    let read = |k: u64| -> Option<u64> {
        let got = if k < 12 {
            s.get(&key(k))
        } else {
            match s.namespace("a") {
                Ok(a) => a.get(&key(k)),
                // The crash fell between the drop and the re-creation.
                Err(Error::NoSuchNamespace { .. }) if cut_drop => Ok(None),
                Err(e) => Err(e),
            }
        };
        got.unwrap_or_else(|e| panic!("seed {seed}: key {k}: {e}"))
            .map(|v| u64::from_le_bytes(v[..8].try_into().unwrap()))
    };
    if cut_drop {
        // The drop happened or not: "a"'s keys as the model says, or none.
        let kept = (12..24).all(|k| read(k) == model.get(&k).copied().flatten());
        let gone = (12..24).all(|k| read(k).is_none());
        assert!(kept || gone, "seed {seed}: the cut drop left half of namespace a");
        if gone {
            model.retain(|&k, _| k < 12);
        }
    }
    // The cut batch: all of it or none of it.
    let mut cut_applied = None;
    if let Some(ops) = &cut {
        let applied = ops.iter().all(|&(k, v)| read(k) == v);
        let absent = ops.iter().all(|&(k, _)| read(k) == model.get(&k).copied().flatten());
        assert!(applied || absent, "seed {seed}: half of the cut batch {ops:?} is there");
        cut_applied = Some(applied);
    }
    for k in 0..24 {
        let touched = cut.as_ref().is_some_and(|ops| ops.iter().any(|&(c, _)| c == k));
        let want = match cut.as_ref().and_then(|ops| ops.iter().find(|&&(c, _)| c == k)) {
            Some(&(_, v)) if cut_applied == Some(true) => v,
            _ => model.get(&k).copied().flatten(),
        };
        assert_eq!(read(k), want, "seed {seed}: key {k} (in the cut batch: {touched})");
    }
    s.verify().unwrap_or_else(|e| panic!("seed {seed}: verify: {e}"));
    s.stats().recovery.batches_applied
}

/// Repeated process crashes on one device among batches and single
/// writes: a crash can leave a batch's records whole with no commit record
/// after them, and writes then resume right after those records, so the
/// next batch's records follow them in the log. After each restart every
/// acknowledged batch is whole (its commit record vouches for its own
/// records, not the cut one's before them), the cut batch whole or absent.
#[test]
fn batches_after_a_batch_cut_short_survive_later_crashes() {
    let seeds: u64 = std::env::var("GRANARY_BATCH_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000) / 20;
    let (mut applied, mut dropped) = (0, 0);
    for seed in 0..seeds.max(1) {
        match std::panic::catch_unwind(|| crash_cycles(seed)) {
            Ok((a, d)) => (applied, dropped) = (applied + a, dropped + d),
            Err(e) => {
                eprintln!(
                    "batch crash cycles failed with seed {seed} (rerun: GRANARY_BATCH_SEEDS={} \
                     cargo test -p granary-store --test batch batches_after_a_batch_cut_short)",
                    (seed + 1) * 20
                );
                std::panic::resume_unwind(e);
            }
        }
    }
    assert!(applied > seeds && dropped > 0, "{applied} batches applied, {dropped} dropped in {seeds} seeds");
}

/// One seed: six crashes in a row; (batches applied, batches dropped) by
/// the recoveries.
fn crash_cycles(seed: u64) -> (u64, u64) {
    const KEYS: u64 = 16;
    let mut rng = SimRng::new(seed ^ 0xba7c);
    let dev = Arc::new(FaultDevice::new(4 << 20, seed));
    let mut s = Store::create(dev.clone(), &create_opts(), &opts(Durability::Direct)).unwrap();
    let mut model: Model = HashMap::new();
    let (mut version, mut applied, mut dropped) = (0, 0, 0);
    for cycle in 0..6 {
        let ctx = format!("seed {seed} cycle {cycle}");
        dev.plan_crash(rng.below(40), CrashKind::Process);
        let mut cut: Vec<(u64, Option<u64>)> = Vec::new();
        for _ in 0..60 {
            version += 1;
            let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
            if rng.below(4) == 0 {
                let k = rng.below(KEYS);
                match s.put(&key(k), &value(k, version)) {
                    Ok(()) => {
                        model.insert(k, Some(version));
                    }
                    Err(Error::Io { .. } | Error::Poisoned { .. }) => {
                        cut = vec![(k, Some(version))];
                        break;
                    }
                    Err(e) => panic!("{ctx}: {e}"),
                }
                continue;
            }
            let mut b = s.batch();
            let mut want: Vec<(u64, Option<u64>)> = Vec::new();
            for _ in 0..1 + rng.below(5) {
                let k = rng.below(KEYS);
                if want.iter().any(|&(o, _)| o == k) {
                    continue;
                }
                if rng.below(5) == 0 {
                    b.delete(&d, &key(k));
                    want.push((k, None));
                } else {
                    b.put(&d, &key(k), &value(k, version));
                    want.push((k, Some(version)));
                }
            }
            match b.commit() {
                Ok(BatchOutcome::Committed { .. }) => model.extend(want),
                Ok(o) => panic!("{ctx}: {o:?}"),
                Err(Error::Io { .. } | Error::Poisoned { .. }) => {
                    cut = want;
                    break;
                }
                Err(e) => panic!("{ctx}: {e}"),
            }
        }
        drop(s);
        dev.restart();
        s = Store::open(dev.clone(), &opts(Durability::Direct)).unwrap_or_else(|e| panic!("{ctx}: reopen: {e}"));
        let rec = s.stats().recovery;
        (applied, dropped) = (applied + rec.batches_applied, dropped + rec.batches_dropped);
        let read = |k: u64| {
            let v = s.get(&key(k)).unwrap_or_else(|e| panic!("{ctx}: key {k}: {e}"));
            v.map(|v| u64::from_le_bytes(v[..8].try_into().unwrap()))
        };
        // The cut writes that change their key: all landed or none.
        let changed: Vec<(u64, Option<u64>)> =
            cut.iter().copied().filter(|&(k, v)| v != model.get(&k).copied().flatten()).collect();
        let landed = changed.iter().filter(|&&(k, v)| read(k) == v).count();
        assert!(landed == 0 || landed == changed.len(), "{ctx}: half of the cut writes {changed:?} landed");
        if landed > 0 {
            model.extend(changed);
        }
        for k in 0..KEYS {
            assert_eq!(read(k), model.get(&k).copied().flatten(), "{ctx}: key {k} (cut: {cut:?})");
        }
    }
    s.verify().unwrap_or_else(|e| panic!("seed {seed}: verify: {e}"));
    (applied, dropped)
}

/// A committed batch whose commit record's value is damaged on the media
/// (outside the newest segments, where no crash tears: bit rot) is applied
/// after a log-scan recovery by the sequence numbers of the records before
/// the commit record, whose header still names it: it was dropped, and
/// every key of the acknowledged batch silently went back to its older
/// version.
#[test]
fn a_batch_whose_commit_record_rots_stays_applied() {
    let dev = device(8 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts(Durability::Direct)).unwrap();
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    s.put(b"a", b"old a").unwrap();
    s.put(b"b", b"old b").unwrap();
    let mut b = s.batch();
    b.put(&d, b"a", b"new a").put(&d, b"b", b"new b");
    assert!(matches!(b.commit().unwrap(), BatchOutcome::Committed { .. }));
    // The batch's segment three segments back: out of the user stream's
    // two newest, where recovery forgives torn records.
    let used = s.stats().segments_opened;
    let mut i = 0u64;
    while s.stats().segments_opened < used + 3 {
        s.put(&key(i), &vec![b'f'; 4000]).unwrap();
        i += 1;
    }
    drop(d);
    drop(s); // a crash: the open scans the log
    let commit_key = granary_format::batch::COMMIT_KEY;
    dev.with_bytes_mut(|bytes| {
        let at = bytes.windows(commit_key.len()).position(|w| w == commit_key).expect("the commit record");
        bytes[at + commit_key.len() + 3] ^= 0x10;
    });
    let s = Store::open(dev.clone(), &opts(Durability::Direct)).unwrap();
    let rec = s.stats().recovery;
    assert_eq!(rec.checkpoint_id, 0, "a log scan");
    assert!(rec.damaged_records >= 1, "{rec:?}");
    assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"new a"[..]));
    assert_eq!(s.get(b"b").unwrap().as_deref(), Some(&b"new b"[..]));
    assert_eq!(rec.batches_applied, 1, "{rec:?}");
}
