//! Namespaces: independent key spaces with their own options and counts,
//! dropped and truncated in O(1), freed by GC, never coming back after a
//! crash, a restart or a checkpoint load; and stores written before them
//! opening unchanged (a committed fixture). Exports (block namespaces):
//! their kind kept across restarts and crashes, bad geometry refused,
//! never evicted, unwritten blocks read with no IO.

mod common;

use granary_store::block::block_key;
use granary_store::io::{CrashKind, FaultDevice, SimRng};
use granary_store::loadgen::{load_key, load_value};
use granary_store::{
    Background, Change, Clock, Cond, CreateOptions, Durability, Entropy, Error, ItemMeta, NamespaceKind, NamespaceMode,
    NamespaceOptions, OpenOptions, PutMode, PutOutcome, Rekeyed, Store, DEFAULT_NAMESPACE,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
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

/// Deterministic opens: no background threads, a clock the test moves.
fn opts(now: &Arc<AtomicU32>, evict: bool) -> OpenOptions {
    let now = now.clone();
    OpenOptions {
        background: Background::Manual,
        clock: Clock(Arc::new(move || now.load(Relaxed))),
        evict,
        entropy: Entropy::seeded(7),
        ..Default::default()
    }
}

fn clock() -> Arc<AtomicU32> {
    Arc::new(AtomicU32::new(1_000_000))
}

#[test]
fn a_key_is_its_namespace_and_its_bytes() {
    let now = clock();
    let s = Store::create(device(8 << 20), &create_opts(), &opts(&now, false)).unwrap();
    let a = s.create_namespace("a", NamespaceOptions::default()).unwrap();
    let b = s.create_namespace("b", NamespaceOptions::default()).unwrap();
    s.put(b"k", b"default").unwrap();
    a.put(b"k", b"in a").unwrap();
    b.put(b"k", b"in b").unwrap();
    assert_eq!(s.get(b"k").unwrap().unwrap(), b"default");
    assert_eq!(a.get(b"k").unwrap().unwrap(), b"in a");
    assert_eq!(b.get(b"k").unwrap().unwrap(), b"in b");
    assert!(a.delete(b"k").unwrap());
    assert_eq!(a.get(b"k").unwrap(), None);
    assert_eq!(b.get(b"k").unwrap().unwrap(), b"in b");
    assert_eq!(s.get(b"k").unwrap().unwrap(), b"default");
    // In a namespace, a key may start with the engine's reserved prefix.
    a.put(b"\0granary.x", b"mine").unwrap();
    assert_eq!(a.get(b"\0granary.x").unwrap().unwrap(), b"mine");
    assert!(matches!(s.put(b"\0granary.x", b"no"), Err(Error::ReservedKey)));
    assert_eq!(s.namespace(DEFAULT_NAMESPACE).unwrap().get(b"k").unwrap().unwrap(), b"default");

    let list = s.namespaces();
    let names: Vec<&str> = list.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["default", "a", "b"]);
    let by = |n: &str| list.iter().find(|x| x.name == n).unwrap().clone();
    assert_eq!((by("default").keys, by("a").keys, by("b").keys), (1, 1, 1));
    assert_eq!(by("a").value_bytes, 512, "one record of one grain");
    assert_eq!((by("a").sets, by("a").deletes, by("a").gets, by("a").hits), (2, 1, 3, 2));
    assert!(matches!(s.create_namespace("a", NamespaceOptions::default()), Err(Error::NamespaceExists { .. })));
    assert!(matches!(s.create_namespace("no/slash", NamespaceOptions::default()), Err(Error::BadNamespace { .. })));
    assert!(matches!(s.namespace("nope"), Err(Error::NoSuchNamespace { .. })));
    s.verify().unwrap();
}

#[test]
fn drop_writes_only_the_catalog_and_its_keys_never_come_back() {
    let now = clock();
    let dev = device(16 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts(&now, false)).unwrap();
    let ns = s.create_namespace("gone", NamespaceOptions::default()).unwrap();
    for i in 0..2_000 {
        ns.put(&load_key(i), &load_value(i, 1, 100)).unwrap();
    }
    s.put(b"stays", b"1").unwrap();
    let before = s.stats().io;
    s.drop_namespace("gone").unwrap();
    let after = s.stats().io;
    // One record (the catalog), whatever the namespace holds; at most one
    // read (the catalog it replaces).
    assert_eq!(after.writes - before.writes, 1, "{before:?} -> {after:?}");
    assert!(after.reads - before.reads <= 1, "{before:?} -> {after:?}");
    assert!(matches!(ns.get(&load_key(1)), Err(Error::NoSuchNamespace { .. })));
    assert!(matches!(s.namespace("gone"), Err(Error::NoSuchNamespace { .. })));
    // The same name again: an empty namespace.
    let again = s.create_namespace("gone", NamespaceOptions::default()).unwrap();
    assert_eq!(again.get(&load_key(1)).unwrap(), None);
    assert_eq!(again.stats().unwrap().keys, 0);
    again.put(b"new", b"2").unwrap();
    drop(again);

    // A crash (no clean close), then a clean restart.
    drop(s);
    let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
    let again = s.namespace("gone").unwrap();
    assert_eq!(again.get(&load_key(1)).unwrap(), None);
    assert_eq!(again.get(b"new").unwrap().unwrap(), b"2");
    assert_eq!(again.stats().unwrap().keys, 1);
    assert_eq!(s.get(b"stays").unwrap().unwrap(), b"1");
    s.checkpoint().unwrap();
    s.close().unwrap();
    let s = Store::open(dev, &opts(&now, false)).unwrap();
    assert!(s.stats().recovery.checkpoint_id != 0, "loaded its clean checkpoint");
    let again = s.namespace("gone").unwrap();
    assert_eq!(again.get(&load_key(1)).unwrap(), None);
    assert_eq!(again.stats().unwrap().keys, 1);
    s.verify().unwrap();
}

#[test]
fn gc_frees_a_dropped_namespace_without_relocating_it() {
    let now = clock();
    let dev = device(4 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts(&now, false)).unwrap();
    let ns = s.create_namespace("big", NamespaceOptions::default()).unwrap();
    let mut n = 0;
    // Fill most of the device with the namespace's keys.
    while s.stats().segments_free > 12 {
        ns.put(&load_key(n), &load_value(n, 1, 400)).unwrap();
        n += 1;
    }
    s.put(b"keep", b"me").unwrap();
    let full = s.stats();
    s.drop_namespace("big").unwrap();
    // A crash before GC ran: the catalog says a sweep is due, and the
    // next open queues it.
    drop(ns);
    drop(s);
    let s = Store::open(dev, &opts(&now, false)).unwrap();
    assert_eq!(s.stats().keys, full.keys, "still indexed until GC sweeps");
    while s.gc_step() {}
    let st = s.stats();
    assert_eq!(st.gc.namespace_records_dropped, n, "{:?}", st.gc);
    assert_eq!(st.gc.records_relocated, 0, "{:?}", st.gc);
    // The engine's own keys (the catalog) and `keep` are what is left.
    assert_eq!(st.keys, full.keys - n);
    assert!(st.live_bytes < full.live_bytes / 10, "{} of {}", st.live_bytes, full.live_bytes);
    // Writes fill the device again: GC reclaims the swept segments.
    for j in 0..(n * 2) {
        s.put(format!("d{}", j % 50).as_bytes(), &[7u8; 400]).unwrap();
        s.gc_step();
    }
    assert_eq!(s.get(b"keep").unwrap().unwrap(), b"me");
    assert!(s.stats().gc.records_relocated <= 100, "{:?}", s.stats().gc);
    s.verify().unwrap();
}

/// A dropped namespace's records still on the device after its sweep
/// finished (GC had not reclaimed their segments) are indexed again by a
/// recovery's scan after a later crash: the open sees their namespace is
/// gone and sweeps again, so they neither count as keys nor pin their
/// segments as live.
#[test]
fn a_crash_after_a_finished_sweep_sweeps_again() {
    let now = clock();
    let dev = device(4 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts(&now, false)).unwrap();
    let ns = s.create_namespace("big", NamespaceOptions::default()).unwrap();
    let n = 2000;
    for i in 0..n {
        ns.put(&load_key(i), &load_value(i, 1, 400)).unwrap();
    }
    s.put(b"keep", b"me").unwrap();
    let full = s.stats();
    drop(ns);
    s.drop_namespace("big").unwrap();
    while s.gc_step() {}
    assert_eq!(s.stats().keys, full.keys - n, "swept");
    s.close().unwrap();
    let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
    s.put(b"after", b"the close").unwrap();
    let keys = s.stats().keys;
    drop(s); // a crash: the recovery scans the log
    let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
    while s.gc_step() {}
    let st = s.stats();
    assert_eq!(st.keys, keys, "the dropped namespace's records came back as keys");
    assert!(st.live_bytes < full.live_bytes / 10, "{} of {} bytes live", st.live_bytes, full.live_bytes);
    assert_eq!(s.get(b"keep").unwrap().unwrap(), b"me");
    assert_eq!(s.get(b"after").unwrap().unwrap(), b"the close");
    assert!(matches!(s.namespace("big"), Err(Error::NoSuchNamespace { .. })));
    s.verify().unwrap();
}

/// On a store of small segments the catalog (one record) stops fitting
/// before the namespace limit: a create past that point is refused as a
/// bad namespace saying why, every namespace made before stays, and the
/// clean close (whose totals record grows with them too) and a reopen work.
#[test]
fn namespaces_past_what_one_record_holds_are_refused_with_the_reason() {
    let now = clock();
    let dev = device(32 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts(&now, false)).unwrap();
    let name = |i: usize| format!("{i:04}-{}", "n".repeat(59));
    let mut made = 0;
    let err = loop {
        match s.create_namespace(&name(made), NamespaceOptions::default()) {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 4096, "64 KiB segments held every namespace");
    };
    assert!(matches!(&err, Error::BadNamespace { why, .. } if why.contains("no longer fit")), "{err}");
    assert!(made > 100, "{made}");
    s.close().unwrap();
    let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
    assert_eq!(s.namespaces().len(), made + 1, "the default namespace and every one made");
    s.namespace(&name(made - 1)).unwrap().put(b"k", b"v").unwrap();
}

/// A handle's own drop, truncate and flush_all act on its namespace only:
/// once it is dropped they fail with `NoSuchNamespace`, and a namespace
/// created since under the same name is left alone.
#[test]
fn a_handles_drop_and_truncate_never_reach_a_namespace_made_since_under_its_name() {
    let now = clock();
    let s = Store::create(device(8 << 20), &create_opts(), &opts(&now, false)).unwrap();
    let old = s.create_namespace("n", NamespaceOptions::default()).unwrap();
    old.put(b"k", b"old").unwrap();
    old.truncate().unwrap();
    assert_eq!(old.get(b"k").unwrap(), None, "a truncate through the handle empties it");
    old.put(b"k", b"old").unwrap();
    old.drop_namespace().unwrap();
    let new = s.create_namespace("n", NamespaceOptions::default()).unwrap();
    new.put(b"k", b"new").unwrap();
    let gone = |r: Result<(), Error>| matches!(r, Err(Error::NoSuchNamespace { .. }));
    assert!(gone(old.drop_namespace()), "the old handle's drop");
    assert!(gone(old.truncate()), "the old handle's truncate");
    assert!(gone(old.flush_all().map(|_| ())), "the old handle's flush_all");
    assert!(matches!(old.get(b"k"), Err(Error::NoSuchNamespace { .. })));
    assert_eq!(new.get(b"k").unwrap().unwrap(), b"new", "the new namespace is untouched");
    assert_eq!(s.namespace("n").unwrap().stats().unwrap().keys, 1);
    // The default namespace's handle truncates (flush) but never drops.
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    s.put(b"k", b"d").unwrap();
    assert!(matches!(d.drop_namespace(), Err(Error::BadNamespace { .. })));
    d.truncate().unwrap();
    assert_eq!(s.get(b"k").unwrap(), None);
    // A key length no record holds has room for no value (no overflow).
    assert_eq!(new.value_bytes_max(usize::MAX), 0);
    assert_eq!(s.value_bytes_max(usize::MAX), 0);
    // After the store closes, a handle's calls say so.
    s.close().unwrap();
    assert!(matches!(new.stats(), Err(Error::Closed)));
    assert!(matches!(new.drop_namespace(), Err(Error::Closed)));
}

#[test]
fn truncate_empties_a_namespace_and_keeps_its_options() {
    let now = clock();
    let dev = device(8 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts(&now, false)).unwrap();
    let o =
        NamespaceOptions { mode: NamespaceMode::Store, default_ttl_secs: 50, max_keys: Some(10), ..Default::default() };
    let ns = s.create_namespace("t", o).unwrap();
    let other = s.create_namespace("o", NamespaceOptions::default()).unwrap();
    ns.put(b"k", b"v").unwrap();
    other.put(b"k", b"w").unwrap();
    s.put(b"k", b"x").unwrap();
    let id = ns.stats().unwrap().id;
    s.truncate("t").unwrap();
    assert_eq!(ns.get(b"k").unwrap(), None, "the handle follows the new id");
    assert_ne!(ns.stats().unwrap().id, id);
    assert_eq!(ns.options(), o);
    assert_eq!(ns.stats().unwrap().keys, 0);
    assert_eq!(other.get(b"k").unwrap().unwrap(), b"w");
    // flush_all on a namespace is a truncate of it; on the default
    // namespace it hides the default namespace's values only.
    other.flush_all().unwrap();
    assert_eq!(other.get(b"k").unwrap(), None);
    ns.put(b"k2", b"v2").unwrap();
    s.flush_all().unwrap();
    assert_eq!(s.get(b"k").unwrap(), None);
    assert_eq!(ns.get(b"k2").unwrap().unwrap(), b"v2");
    drop(s);
    let s = Store::open(dev, &opts(&now, false)).unwrap();
    assert_eq!(s.namespace("t").unwrap().get(b"k").unwrap(), None);
    assert_eq!(s.namespace("t").unwrap().get(b"k2").unwrap().unwrap(), b"v2");
    assert_eq!(s.namespace("t").unwrap().options(), o);
}

#[test]
fn quotas_refuse_what_does_not_fit_and_default_ttl_expires() {
    let now = clock();
    let s = Store::create(device(8 << 20), &create_opts(), &opts(&now, false)).unwrap();
    let o = NamespaceOptions { max_keys: Some(3), max_bytes: Some(4 * 512), ..Default::default() };
    let ns = s.create_namespace("q", o).unwrap();
    for k in [b"a", b"b", b"c"] {
        ns.put(k, b"small").unwrap();
    }
    let err = ns.put(b"d", b"small").unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded { what: "keys", limit: 3, .. }), "{err}");
    // An overwrite replaces what its key holds: it fits.
    ns.put(b"a", b"again").unwrap();
    // Bytes: a value of two grains over a one-grain one takes 4 grains.
    ns.put(b"a", &[1u8; 600]).unwrap();
    let err = ns.put(b"b", &[1u8; 600]).unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded { what: "bytes", .. }), "{err}");
    assert!(ns.delete(b"c").unwrap());
    ns.put(b"d", b"small").unwrap();
    assert_eq!(ns.stats().unwrap().keys, 3);

    let t = s.create_namespace("ttl", NamespaceOptions { default_ttl_secs: 10, ..Default::default() }).unwrap();
    t.put(b"k", b"v").unwrap();
    let meta = ItemMeta { expires: now.load(Relaxed) + 100, ..Default::default() };
    t.put_item(b"own", b"v", meta, PutMode::Upsert.into()).unwrap();
    now.fetch_add(11, Relaxed);
    assert_eq!(t.get(b"k").unwrap(), None, "the default TTL expired it");
    assert_eq!(t.get(b"own").unwrap().unwrap(), b"v", "its own expiry time wins");

    // Expired values count until they leave the index; an overwrite of
    // one is charged its growth only, as any overwrite.
    let o = NamespaceOptions { max_keys: Some(2), default_ttl_secs: 10, ..Default::default() };
    let e = s.create_namespace("expiring", o).unwrap();
    e.put(b"a", b"v").unwrap();
    e.put(b"b", b"v").unwrap();
    now.fetch_add(11, Relaxed);
    assert_eq!(e.get(b"a").unwrap(), None);
    e.put(b"a", b"again").unwrap();
    let err = e.put(b"c", b"v").unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded { what: "keys", limit: 2, .. }), "{err}");
    assert_eq!(e.stats().unwrap().keys, 2);
}

/// At a quota, a conditional write whose condition fails answers as it
/// would without a quota (`Exists`, `NotFound`: memcache's NOT_STORED and
/// EXISTS), not `QuotaExceeded`, and a cache namespace evicts nothing for it.
#[test]
fn a_write_whose_condition_fails_at_the_quota_answers_the_condition() {
    let now = clock();
    let s = Store::create(device(8 << 20), &create_opts(), &opts(&now, true)).unwrap();
    for mode in [NamespaceMode::Store, NamespaceMode::Cache] {
        let o = NamespaceOptions { mode, max_keys: Some(3), max_bytes: Some(4 * 512), ..Default::default() };
        let ns = s.create_namespace(&format!("{mode:?}"), o).unwrap();
        for k in [b"a", b"b", b"c"] {
            ns.put(k, b"small").unwrap();
        }
        let big = [1u8; 1200];
        let cond_put = |key: &[u8], value: &[u8], cond: Cond| ns.put_item(key, value, ItemMeta::default(), cond);
        // Past the keys quota, on a key that is not there.
        assert_eq!(cond_put(b"d", b"small", Cond::Present).unwrap().0, PutOutcome::NotFound, "{mode:?}");
        assert_eq!(cond_put(b"d", b"small", Cond::Cas(1)).unwrap().0, PutOutcome::NotFound, "{mode:?}");
        // Past the bytes quota, on a key that is there.
        assert_eq!(cond_put(b"a", &big, Cond::Absent).unwrap().0, PutOutcome::Exists, "{mode:?}");
        let (_, cas) = ns.get_item(b"a").unwrap().map(|i| ((), i.cas)).unwrap();
        assert_eq!(cond_put(b"a", &big, Cond::Cas(cas + 1)).unwrap().0, PutOutcome::Exists, "{mode:?}");
        let st = ns.stats().unwrap();
        assert_eq!((st.keys, st.evictions), (3, 0), "{mode:?}: nothing written or evicted");
        for k in [b"a", b"b", b"c"] {
            assert_eq!(ns.get(k).unwrap().as_deref(), Some(&b"small"[..]), "{mode:?}");
        }
        // A write whose condition holds is still held to the quota.
        match mode {
            NamespaceMode::Store => {
                let r = cond_put(b"a", &big, Cond::Cas(cas));
                assert!(matches!(r, Err(Error::QuotaExceeded { what: "bytes", .. })), "{r:?}");
            }
            _ => {
                assert_eq!(cond_put(b"e", &big, Cond::Absent).unwrap().0, PutOutcome::Stored);
                assert!(ns.stats().unwrap().evictions > 0, "a cache evicts for a write that happens");
            }
        }
    }
}

/// A read-modify-write (`update`) that writes a new value is held to the
/// namespace's quota and gets its default TTL, as a put is.
#[test]
fn update_is_held_to_the_quota_and_gets_the_default_ttl() {
    let now = clock();
    let s = Store::create(device(8 << 20), &create_opts(), &opts(&now, false)).unwrap();
    let o = NamespaceOptions { max_keys: Some(3), default_ttl_secs: 60, ..Default::default() };
    let ns = s.create_namespace("u", o).unwrap();
    for k in [b"a", b"b", b"c"] {
        ns.put(k, b"v").unwrap();
    }
    let put = |_: Option<&granary_store::Item>| (Change::Put { value: b"new".to_vec(), meta: ItemMeta::default() }, ());
    let err = ns.update(b"d", put).unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded { what: "keys", limit: 3, .. }), "{err}");
    assert_eq!(ns.get(b"d").unwrap(), None);
    // An overwrite fits, and expires with the default TTL.
    ns.update(b"a", put).unwrap();
    assert_eq!(ns.get(b"a").unwrap().unwrap(), b"new");
    now.fetch_add(61, Relaxed);
    assert_eq!(ns.get(b"a").unwrap(), None, "the default TTL expired the updated value");
}

/// A value larger than a cache namespace's whole byte quota (or a batch of
/// them) is refused at once: nothing of the namespace is evicted for it.
#[test]
fn a_value_larger_than_the_quota_is_refused_without_evicting() {
    let now = clock();
    let s = Store::create(device(8 << 20), &create_opts(), &opts(&now, true)).unwrap();
    let o = NamespaceOptions { mode: NamespaceMode::Cache, max_bytes: Some(8 * 512), ..Default::default() };
    let ns = s.create_namespace("c", o).unwrap();
    for i in 0..5u64 {
        ns.put(&load_key(i), b"small").unwrap();
    }
    let err = ns.put(b"big", &[7u8; 16 * 512]).unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded { what: "bytes", .. }), "{err}");
    let mut batch = s.batch();
    for i in 100..120u64 {
        batch.put(&ns, &load_key(i), &[1u8; 400]);
    }
    assert!(matches!(batch.commit(), Err(Error::QuotaExceeded { what: "bytes", .. })));
    for i in 0..5u64 {
        assert_eq!(ns.get(&load_key(i)).unwrap().as_deref(), Some(&b"small"[..]), "key {i} kept");
    }
    assert_eq!(ns.stats().unwrap().evictions, 0);
    // An update past the quota makes room as a put does: the namespace
    // evicts its own oldest values and the write goes through.
    for i in 200..220u64 {
        let put =
            |_: Option<&granary_store::Item>| (Change::Put { value: vec![3u8; 400], meta: ItemMeta::default() }, ());
        ns.update(&load_key(i), put).unwrap();
        assert!(ns.stats().unwrap().value_bytes <= 8 * 512, "{i}: {:?}", ns.stats().unwrap());
    }
    assert_eq!(ns.get(&load_key(219)).unwrap().unwrap(), vec![3u8; 400]);
    assert!(ns.stats().unwrap().evictions > 0);
}

#[test]
fn a_store_mode_namespace_is_never_evicted() {
    let now = clock();
    let s = Store::create(device(3 << 20), &create_opts(), &opts(&now, true)).unwrap();
    let kept =
        s.create_namespace("kept", NamespaceOptions { mode: NamespaceMode::Store, ..Default::default() }).unwrap();
    let cache = s.create_namespace("cache", NamespaceOptions::default()).unwrap();
    for i in 0..100 {
        kept.put(&load_key(i), &load_value(i, 1, 400)).unwrap();
    }
    // Many times the device in cache values: GC evicts.
    for i in 0..20_000 {
        cache.put(&load_key(i), &load_value(i, 1, 400)).unwrap();
        if i % 64 == 0 {
            s.gc_step();
        }
    }
    let st = cache.stats().unwrap();
    assert!(st.evictions > 0, "{st:?}");
    assert!(st.keys < 20_000);
    for i in 0..100 {
        assert_eq!(kept.get(&load_key(i)).unwrap().unwrap(), load_value(i, 1, 400), "key {i}");
    }
    assert_eq!(kept.stats().unwrap().evictions, 0);
    s.verify().unwrap();
}

/// An export is a namespace of kind `Block`: its geometry is reported by
/// its handle, `namespaces` and `exports`, and kept by the catalog across a
/// clean restart and a crash (the open then scans the log); a truncate
/// keeps it, a drop removes it.
#[test]
fn an_export_keeps_its_kind_across_a_restart_and_a_crash() {
    let now = clock();
    let dev = device(8 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts(&now, false)).unwrap();
    let kind = NamespaceKind::Block { size_bytes: 1 << 20, block_bytes: 4096 };
    let disk = s.create_export("disk", 1 << 20, 4096).unwrap();
    s.create_namespace("kv", NamespaceOptions::default()).unwrap();
    assert_eq!(disk.kind(), kind);
    assert_eq!(disk.options().mode, NamespaceMode::Store);
    assert_eq!(kind.blocks(), 256);
    for n in [0u64, 3, 255] {
        disk.put(&block_key(n), &load_value(n, 1, 4096)).unwrap();
    }
    let check = |s: &Store, want_blocks: &[u64]| {
        let disk = s.namespace("disk").unwrap();
        assert_eq!(disk.kind(), kind);
        for n in 0..256 {
            let want = want_blocks.contains(&n).then(|| load_value(n, 1, 4096));
            assert_eq!(disk.get(&block_key(n)).unwrap(), want, "block {n}");
        }
        let exports = s.exports();
        assert_eq!(exports.len(), 1, "{exports:?}");
        assert_eq!((exports[0].name.as_str(), exports[0].options.kind), ("disk", kind));
        assert_eq!(exports[0].keys, want_blocks.len() as u64);
        let kinds: Vec<(String, NamespaceKind)> =
            s.namespaces().into_iter().map(|n| (n.name, n.options.kind)).collect();
        let want = [("default", NamespaceKind::Kv), ("disk", kind), ("kv", NamespaceKind::Kv)];
        assert_eq!(kinds, want.map(|(n, k)| (n.to_string(), k)));
    };
    check(&s, &[0, 3, 255]);
    drop(disk);
    s.close().unwrap();

    let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
    assert!(s.stats().recovery.checkpoint_id != 0, "a clean restart");
    check(&s, &[0, 3, 255]);
    s.namespace("disk").unwrap().put(&block_key(7), &load_value(7, 1, 4096)).unwrap();
    // A crash: the open rebuilds the index by a log scan, the catalog with it.
    drop(s);
    let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
    assert_eq!(s.stats().recovery.checkpoint_id, 0, "a log scan");
    check(&s, &[0, 3, 7, 255]);

    s.truncate("disk").unwrap();
    check(&s, &[]);
    s.drop_namespace("disk").unwrap();
    assert!(s.exports().is_empty());
    assert!(matches!(s.namespace("disk"), Err(Error::NoSuchNamespace { .. })));
    s.verify().unwrap();
    s.close().unwrap();
    let s = Store::open(dev, &opts(&now, false)).unwrap();
    assert!(s.exports().is_empty());
    assert_eq!(s.namespaces().len(), 2);
}

/// An export holds only whole blocks under its blocks' keys: a write
/// through any KV path (put, update, put_many, a batch, a zero-copy
/// buffer) of another key or of a partial block is refused with
/// `BadNamespace` and writes nothing (a 2-byte value under block 0's key
/// was stored, and the block server read it as a partial block).
#[test]
fn an_export_takes_only_whole_blocks_under_block_keys() {
    let now = clock();
    let s = Store::create(device(8 << 20), &create_opts(), &opts(&now, false)).unwrap();
    let disk = s.create_export("disk", 1 << 20, 4096).unwrap();
    let refused = |r: Result<(), Error>, why: &str| match r {
        Err(Error::BadNamespace { name, why: got }) => {
            assert_eq!(name, "disk");
            assert!(got.contains(why), "{got:?} lacks {why:?}")
        }
        r => panic!("{r:?}"),
    };
    let block = vec![7u8; 4096];
    refused(disk.put(b"k", &block), "not a key of 1 bytes");
    refused(disk.put(&block_key(256), &block), "below 256");
    refused(disk.put(&block_key(0), b"hi"), "not 2 bytes");
    refused(disk.put_many(&[(&block_key(1)[..], &block[..]), (&block_key(2)[..], b"hi")]), "not 2 bytes");
    refused(
        disk.update(&block_key(0), |_| (Change::Put { value: b"hi".to_vec(), meta: ItemMeta::default() }, ()))
            .map(|_| ()),
        "not 2 bytes",
    );
    refused(disk.new_put_buf(&block_key(0), 100).map(|_| ()), "not 100 bytes");
    let mut b = s.batch();
    b.put(&disk, &block_key(3), b"hi");
    refused(b.commit().map(|_| ()), "not 2 bytes");
    let mut b = s.batch();
    b.delete(&disk, b"name");
    refused(b.commit().map(|_| ()), "not a key of 4 bytes");
    refused(disk.get(b"k").map(|_| ()), "not a key of 1 bytes");
    assert_eq!(s.exports()[0].keys, 0, "nothing was written");
    // Whole blocks are taken, by every path.
    disk.put(&block_key(255), &block).unwrap();
    disk.put_many(&[(&block_key(1)[..], &block[..])]).unwrap();
    disk.delete(&block_key(1)).unwrap();
    assert_eq!(disk.get(&block_key(255)).unwrap(), Some(block));
}

/// Geometry an export cannot have, and options it cannot take, are
/// refused with `BadNamespace` saying why, and create nothing.
#[test]
fn bad_export_geometry_and_options_are_refused() {
    let now = clock();
    let s = Store::create(device(8 << 20), &create_opts(), &opts(&now, false)).unwrap();
    let refused = |r: Result<granary_store::Namespace, Error>, why: &str| match r {
        Err(Error::BadNamespace { why: got, .. }) => assert!(got.contains(why), "{got:?} lacks {why:?}"),
        Err(e) => panic!("{e}"),
        Ok(ns) => panic!("created {:?}", ns.kind()),
    };
    for bs in [0, 256, 1000, 3000, 4097, 128 << 10] {
        refused(s.create_export("e", 1 << 20, bs), "a power of two from 512 to 65536");
    }
    // 64 KiB segments: a block of 65536 bytes does not fit one value.
    refused(s.create_export("e", 1 << 20, 65536), "this store holds values up to");
    for size in [0, 4095, 4096 + 512] {
        refused(s.create_export("e", size, 4096), "a positive multiple of its block size 4096");
    }
    refused(s.create_export("e", u64::MAX - 4095, 4096), "at most 9223372036854775808 bytes");
    let block = NamespaceKind::Block { size_bytes: 1 << 20, block_bytes: 4096 };
    let export = NamespaceOptions { mode: NamespaceMode::Store, kind: block, ..Default::default() };
    refused(s.create_namespace("e", NamespaceOptions { mode: NamespaceMode::Cache, ..export }), "mode is store");
    for o in [
        NamespaceOptions { max_keys: Some(10), ..export },
        NamespaceOptions { max_bytes: Some(1 << 20), ..export },
        NamespaceOptions { default_ttl_secs: 60, ..export },
    ] {
        refused(s.create_namespace("e", o), "no quota and no default TTL");
    }
    refused(s.create_export("a b", 1 << 20, 4096), "a name holds only");
    assert_eq!(s.namespaces().len(), 1, "nothing was created");
    // The largest export and the smallest block are fine.
    s.create_export("huge", 1 << 63, 32 << 10).unwrap();
    s.create_export("small", 512, 512).unwrap();
    s.create_namespace("e", export).unwrap();
    assert!(matches!(s.create_export("e", 1 << 20, 4096), Err(Error::NamespaceExists { .. })));
    assert!(matches!(s.create_export("default", 1 << 20, 4096), Err(Error::NamespaceExists { .. })));
    assert_eq!(s.exports().iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["e", "huge", "small"]);
}

/// In a store that evicts, an export's blocks are relocated, never
/// evicted: a cache namespace written many times over loses values, the
/// export none.
#[test]
fn an_export_is_never_evicted() {
    let now = clock();
    let s = Store::create(device(3 << 20), &create_opts(), &opts(&now, true)).unwrap();
    let disk = s.create_export("disk", 100 * 512, 512).unwrap();
    let cache = s.create_namespace("cache", NamespaceOptions::default()).unwrap();
    for n in 0..100 {
        disk.put(&block_key(n), &load_value(n, 1, 512)).unwrap();
    }
    for i in 0..20_000 {
        cache.put(&load_key(i), &load_value(i, 1, 400)).unwrap();
        if i % 64 == 0 {
            s.gc_step();
        }
    }
    let st = cache.stats().unwrap();
    assert!(st.evictions > 0 && st.keys < 20_000, "{st:?}");
    for n in 0..100 {
        assert_eq!(disk.get(&block_key(n)).unwrap().unwrap(), load_value(n, 1, 512), "block {n}");
    }
    assert_eq!(disk.stats().unwrap().evictions, 0);
    assert!(s.stats().gc.records_relocated > 0, "the blocks were moved, not dropped: {:?}", s.stats().gc);
    s.verify().unwrap();
}

/// A block never written has no index entry: its GET answers "absent"
/// (zeros, for a block server) with no device IO. A trimmed block keeps
/// its tombstone until GC drops it: its GET reads that one grain.
#[test]
fn an_unwritten_block_reads_as_absent_with_no_io() {
    let now = clock();
    let s = Store::create(device(8 << 20), &create_opts(), &opts(&now, false)).unwrap();
    let disk = s.create_export("disk", 1 << 30, 4096).unwrap();
    for n in 0..64 {
        disk.put(&block_key(n * 2), &load_value(n, 1, 4096)).unwrap();
    }
    let reads = || s.stats().io.reads;
    let before = reads();
    for n in 0..64 {
        assert_eq!(disk.get(&block_key(n * 2 + 1)).unwrap(), None);
    }
    for n in 1000..2000 {
        assert_eq!(disk.get(&block_key(n)).unwrap(), None);
    }
    assert_eq!(reads() - before, 0, "absent blocks cost no IO");
    assert!(disk.delete(&block_key(0)).unwrap());
    let before = reads();
    assert_eq!(disk.get(&block_key(0)).unwrap(), None);
    assert_eq!(reads() - before, 1, "a trimmed block reads its tombstone");
}

/// The counts after each kind of open equal the counts before it.
#[test]
fn counts_hold_across_a_clean_restart_and_a_crash() {
    let now = clock();
    let dev = device(16 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts(&now, false)).unwrap();
    let a = s.create_namespace("a", NamespaceOptions::default()).unwrap();
    let b = s.create_namespace("b", NamespaceOptions::default()).unwrap();
    for i in 0..300 {
        a.put(&load_key(i), &load_value(i, 1, 10 + i as usize)).unwrap();
        if i % 3 == 0 {
            b.put(&load_key(i), b"b").unwrap();
        }
        if i % 7 == 0 {
            s.put(&load_key(i), b"d").unwrap();
        }
    }
    for i in 0..50 {
        a.delete(&load_key(i)).unwrap();
    }
    let counts = |s: &Store| -> Vec<(String, u64, u64)> {
        s.namespaces().into_iter().map(|n| (n.name, n.keys, n.value_bytes)).collect()
    };
    let want = counts(&s);
    assert_eq!(want[1].1, 250);
    // A checkpoint, more writes, a crash: the open cannot trust the
    // checkpoint's counts, and scans.
    s.checkpoint().unwrap();
    b.put(b"late", b"x").unwrap();
    let want_crash = counts(&s);
    drop((a, b));
    drop(s);
    let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
    assert_eq!(s.stats().recovery.checkpoint_id, 0, "a log scan");
    assert_eq!(counts(&s), want_crash);
    // A clean close, then an open that takes the counts it wrote.
    s.close().unwrap();
    let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
    let r = s.stats().recovery;
    assert!(r.checkpoint_id != 0 && r.clean_shutdown, "{r:?}");
    assert_eq!(counts(&s), want_crash);
    assert_ne!(want, want_crash);
    s.close().unwrap();
}

/// A store written before namespaces (superblock version 1) opens with its
/// keys in the default namespace, and turns namespaces on when it gets one.
#[test]
fn a_store_from_before_namespaces_opens_unchanged() {
    let dev = device(V1_FIXTURE_BYTES);
    dev.with_bytes_mut(write_v1_fixture);
    let now = clock();
    let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
    assert_eq!((s.superblock().version, s.superblock().flags), (1, 0));
    // Written before secret seeds: its keys hash with the public seed, as
    // the index its checkpoint holds placed them (a lookup under any other
    // seed would miss).
    assert_eq!(s.superblock().key_hasher(), granary_format::hash::KeyHasher::PUBLIC);
    assert_ne!(s.stats().recovery.checkpoint_id, 0, "the fixture's index came from its checkpoint");
    let check = check_v1_fixture;
    check(&s);
    let list = s.namespaces();
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].name.as_str(), list[0].keys), ("default", 41));
    s.verify().unwrap();
    // Untouched, it stays version 1 on the device.
    s.close().unwrap();
    let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
    assert_eq!(s.superblock().version, 1);
    s.create_namespace("new", NamespaceOptions::default()).unwrap().put(b"k", b"v").unwrap();
    s.close().unwrap();
    let s = Store::open(dev, &opts(&now, false)).unwrap();
    assert_eq!((s.superblock().version, s.superblock().flags), (2, granary_format_flag_namespaces()));
    check(&s);
    assert_eq!(s.namespace("new").unwrap().get(b"k").unwrap().unwrap(), b"v");
    assert_eq!(s.namespaces()[0].keys, 41);
    s.verify().unwrap();
}

fn granary_format_flag_namespaces() -> u32 {
    1
}

/// The committed fixture's device size.
const V1_FIXTURE_BYTES: u64 = 1536 << 10;

/// Write the committed fixture (a store written before namespaces and
/// before secret hash seeds, closed cleanly: its index in a checkpoint)
/// into a device's bytes.
fn write_v1_fixture(bytes: &mut [u8]) {
    let text = include_str!("fixtures/v1-store.hex");
    let size: u64 = text.lines().find_map(|l| l.strip_prefix("# size ")).unwrap().parse().unwrap();
    assert_eq!(size, V1_FIXTURE_BYTES);
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (off, hex) = line.split_once(' ').unwrap();
        let off: usize = off.parse().unwrap();
        for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
            bytes[off + i] = u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap();
        }
    }
}

/// The fixture's keys hold what it was written with.
fn check_v1_fixture(s: &Store) {
    for i in 0..40 {
        let want = match i {
            7 => None,
            0..10 => Some(load_value(i, 2, 40)),
            _ => Some(load_value(i, 1, 40)),
        };
        assert_eq!(s.get(&load_key(i)).unwrap(), want, "key {i}");
    }
    assert_eq!(s.get(b"plain").unwrap().unwrap(), b"hello");
    assert_eq!(s.get(b"\\0granary.nx").unwrap().unwrap(), b"x");
}

/// `granary rekey`'s engine: a store from before secret hash seeds gets
/// one (superblock hash algorithm 2, version 2), keeps every key (its
/// index rebuilt by a log scan under the new seed, then checkpointed, so
/// the next open loads a checkpoint placed by it), and a second re-key
/// does nothing.
#[test]
fn a_store_from_before_secret_seeds_is_rekeyed() {
    // The fixture is a store of a conventional device (in memory whatever
    // the backend: the zoned emulation would not see its zones written).
    let dev = Arc::new(FaultDevice::new(V1_FIXTURE_BYTES, 1));
    dev.with_bytes_mut(write_v1_fixture);
    let now = clock();
    let done = Store::rekey(dev.clone(), &opts(&now, false)).unwrap();
    assert!(matches!(done, Rekeyed::Done { checkpoint_segments: 1.., keys: 41 }), "{done:?}");
    let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
    let sb = s.superblock().clone();
    assert_eq!((sb.version, sb.hash_algo), (2, granary_format::hash::KEY_HASH_ALGO_XXH3_64_SECRET));
    assert_ne!(sb.key_hasher(), granary_format::hash::KeyHasher::PUBLIC);
    assert_ne!(s.stats().recovery.checkpoint_id, 0, "the re-key's closing checkpoint");
    check_v1_fixture(&s);
    assert!(s.verify().unwrap().is_clean());
    s.close().unwrap();
    assert_eq!(Store::rekey(dev.clone(), &opts(&now, false)).unwrap(), Rekeyed::Already);
    assert_eq!(Store::open(dev.clone(), &opts(&now, false)).unwrap().superblock().hash_seed, sb.hash_seed);
    // Copy B as a crash between the two copies leaves it (the fixture's,
    // public seed): the next re-key makes it copy A's again.
    let mut fixture = vec![0u8; V1_FIXTURE_BYTES as usize];
    write_v1_fixture(&mut fixture);
    dev.with_bytes_mut(|bytes| bytes[4096..8192].copy_from_slice(&fixture[4096..8192]));
    // A rewrite that fails fails the re-key (its exit status says so).
    dev.fail_nth(granary_store::io::OpKind::Write, 0, false);
    assert!(Store::rekey(dev.clone(), &opts(&now, false)).is_err(), "a failed copy-B rewrite was not reported");
    assert_eq!(Store::rekey(dev.clone(), &opts(&now, false)).unwrap(), Rekeyed::Already);
    let (a, b) = dev.with_bytes_mut(|bytes| (bytes[..4096].to_vec(), bytes[4096..8192].to_vec()));
    assert_eq!(a, b, "copy B was not rewritten");
    // Copy B left behind and copy A then lost: the store opens under the
    // public seed, and the checkpoint the new seed placed is not loaded.
    dev.with_bytes_mut(|bytes| {
        bytes[4096..8192].copy_from_slice(&fixture[4096..8192]);
        bytes[..4096].fill(0);
    });
    let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
    assert_eq!(s.superblock().key_hasher(), granary_format::hash::KeyHasher::PUBLIC);
    assert_eq!(s.stats().recovery.checkpoint_id, 0, "a checkpoint of the other seed was loaded");
    check_v1_fixture(&s);
}

/// A re-key of a store closed cleanly whose newest segments hold a record
/// failing its checksum (damage: no write was in flight) is refused with
/// nothing changed: its log scan would clear the record as a crash's torn
/// write, bringing back the key's older value. The key still reports the
/// corruption, as `verify` does.
#[test]
fn a_rekey_refuses_a_store_with_a_damaged_record_in_its_tail() {
    let dev = Arc::new(FaultDevice::new(V1_FIXTURE_BYTES, 1));
    dev.with_bytes_mut(write_v1_fixture);
    let now = clock();
    // Key 3's second version (written last: in the newest user segment).
    let value = load_value(3, 2, 40);
    let (at, flipped) = dev.with_bytes_mut(|bytes| {
        let at = bytes.windows(value.len()).rposition(|w| w == &value[..]).expect("key 3's value") + value.len() / 2;
        bytes[at] ^= 0x40;
        (at, bytes[at])
    });
    let refused = Store::rekey(dev.clone(), &opts(&now, false));
    assert!(
        matches!(&refused, Err(Error::Corruption { detail, .. }) if detail.contains("granary verify")),
        "{refused:?}"
    );
    let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
    assert_eq!(s.superblock().key_hasher(), granary_format::hash::KeyHasher::PUBLIC);
    assert!(matches!(s.get(&load_key(3)), Err(Error::Corruption { .. })), "the damaged value was cleared");
    assert!(!s.verify().unwrap().is_clean());
    drop(s);
    assert_eq!(dev.with_bytes_mut(|bytes| bytes[at]), flipped, "the damaged record was overwritten");
}

/// A checkpoint is loaded only under the key hash that placed it: with
/// the superblock's seed changed (another secret one, or the public one)
/// the open scans the log instead, finds every key, and its own next
/// checkpoint loads. Before checkpoints recorded their hash, the other
/// seed's lookups missed every key.
#[test]
fn a_checkpoint_placed_by_another_key_hash_is_not_loaded() {
    let now = clock();
    for public in [false, true] {
        let dev = device(8 << 20);
        let s = Store::create(dev.clone(), &create_opts(), &opts(&now, false)).unwrap();
        for i in 0..200 {
            s.put(&load_key(i), &load_value(i, 1, 100)).unwrap();
        }
        s.close().unwrap();
        let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
        assert_ne!(s.stats().recovery.checkpoint_id, 0, "public {public}: the close's checkpoint");
        s.close().unwrap();
        patch_superblock(&dev, |sb| match public {
            true => (sb.hash_algo, sb.hash_seed) = (granary_format::hash::KEY_HASH_ALGO_XXH3_64, 0),
            false => sb.hash_seed ^= 1,
        });
        let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
        assert_eq!(s.stats().recovery.checkpoint_id, 0, "public {public}: the checkpoint was loaded");
        for i in 0..200 {
            assert_eq!(s.get(&load_key(i)).unwrap(), Some(load_value(i, 1, 100)), "public {public}: key {i}");
        }
        s.close().unwrap();
        let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
        assert_ne!(s.stats().recovery.checkpoint_id, 0, "public {public}: its own checkpoint");
        assert!(s.verify().unwrap().is_clean());
    }
}

/// The same on this backend (the emulated zoned device with
/// `GRANARY_TEST_BACKEND=zoned`, where the checkpoint's zones are reset): a
/// store made now, its superblock copies patched to the public seed (its
/// checkpoint, placed by its secret seed, would then be misread: an open
/// refuses it by the hash it records, and the re-key drops it).
#[test]
fn a_store_patched_to_the_public_seed_is_rekeyed_on_its_backend() {
    let now = clock();
    let dev = device(8 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts(&now, false)).unwrap();
    for i in 0..200 {
        s.put(&load_key(i), &load_value(i, 1, 100)).unwrap();
    }
    s.close().unwrap();
    let old = seed_of(&dev);
    patch_superblock(&dev, |sb| (sb.hash_algo, sb.hash_seed) = (granary_format::hash::KEY_HASH_ALGO_XXH3_64, 0));
    // A device that cannot hold the store (its superblock says it was made
    // on a larger one) is refused before anything is written.
    patch_superblock(&dev, |sb| sb.device_bytes += 1 << 20);
    let before = dev.with_bytes_mut(|bytes| bytes.to_vec());
    let refused = Store::rekey(dev.clone(), &opts(&now, false));
    assert!(matches!(refused, Err(Error::InvalidOptions(_))), "{refused:?}");
    assert!(dev.with_bytes_mut(|bytes| *bytes == before[..]), "a refused re-key wrote");
    patch_superblock(&dev, |sb| sb.device_bytes -= 1 << 20);
    let done = Store::rekey(dev.clone(), &opts(&now, false)).unwrap();
    assert!(matches!(done, Rekeyed::Done { checkpoint_segments: 1.., keys: 200 }), "{done:?}");
    let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
    assert_eq!(s.superblock().hash_algo, granary_format::hash::KEY_HASH_ALGO_XXH3_64_SECRET);
    assert_ne!(s.superblock().hash_seed, old);
    assert_ne!(s.stats().recovery.checkpoint_id, 0, "the re-key's closing checkpoint");
    for i in 0..200 {
        assert_eq!(s.get(&load_key(i)).unwrap(), Some(load_value(i, 1, 100)), "key {i}");
    }
    assert!(s.verify().unwrap().is_clean());
}

/// Change both superblock copies of the store on `dev` with `f`.
fn patch_superblock(dev: &granary_store::io::TestDevice, f: impl Fn(&mut granary_format::Superblock)) {
    dev.with_bytes_mut(|bytes| {
        let mut sb = granary_format::Superblock::decode(&bytes[..4096]).unwrap();
        f(&mut sb);
        for off in [0, 4096] {
            sb.encode(&mut bytes[off..off + 4096]);
        }
    });
}

/// The key hash seed of the store on `dev`.
fn seed_of(dev: &granary_store::io::TestDevice) -> u64 {
    dev.with_bytes_mut(|bytes| granary_format::Superblock::decode(&bytes[..4096]).unwrap().hash_seed)
}

/// A re-key cut short by a crash at any of its writes (a process crash
/// keeps the writes made; a power cut only the flushed ones) leaves a
/// store that opens with every key, under whichever seed its superblock
/// names, and a second re-key finishes the job. Before the superblock
/// names the new seed, no checkpoint of the old one is left to load.
/// Eight device seeds a crash point: a power cut keeps a seeded subset of
/// the unflushed writes' sectors.
#[test]
fn a_rekey_cut_short_by_a_crash_loses_nothing() {
    let now = clock();
    let mut finished = false;
    for (writes, variant) in (0..64u64).flat_map(|w| (0..8u64).map(move |v| (w, v))) {
        for kind in [CrashKind::Process, CrashKind::Power] {
            let dev = Arc::new(FaultDevice::new(V1_FIXTURE_BYTES, writes * 8 + variant));
            dev.with_bytes_mut(write_v1_fixture);
            dev.plan_crash(writes, kind);
            let r = Store::rekey(dev.clone(), &opts(&now, false));
            let crashed = dev.crashed();
            assert!(crashed || r.is_ok(), "writes {writes}, variant {variant}, {kind:?}: {r:?}");
            finished |= !crashed;
            dev.restart();
            let s = Store::open(dev.clone(), &opts(&now, false))
                .unwrap_or_else(|e| panic!("writes {writes}, variant {variant}, {kind:?}: {e}"));
            check_v1_fixture(&s);
            assert!(s.verify().unwrap().is_clean(), "writes {writes}, variant {variant}, {kind:?}");
            drop(s);
            // The open made copy B copy A's where the crash came between them.
            let (a, b) = dev.with_bytes_mut(|bytes| (bytes[..128].to_vec(), bytes[4096..4096 + 128].to_vec()));
            assert_eq!(a, b, "writes {writes}, variant {variant}, {kind:?}: the open left copy B behind");
            // Another seed than the first run's would draw.
            Store::rekey(dev.clone(), &OpenOptions { entropy: Entropy::seeded(8), ..opts(&now, false) }).unwrap();
            // Both superblock copies name the secret seed.
            let (a, b) = dev.with_bytes_mut(|bytes| (bytes[..128].to_vec(), bytes[4096..4096 + 128].to_vec()));
            assert_eq!(a, b, "writes {writes}, variant {variant}, {kind:?}: the superblock copies differ");
            let s = Store::open(dev.clone(), &opts(&now, false)).unwrap();
            assert_eq!(s.superblock().hash_algo, granary_format::hash::KEY_HASH_ALGO_XXH3_64_SECRET);
            check_v1_fixture(&s);
        }
    }
    assert!(finished, "no crash point was past the re-key's last write");
}

/// A closed store's handles refuse calls.
#[test]
fn a_handle_outliving_its_store_is_refused() {
    let now = clock();
    let s = Store::create(device(8 << 20), &create_opts(), &opts(&now, false)).unwrap();
    let ns = s.create_namespace("n", NamespaceOptions::default()).unwrap();
    s.close().unwrap();
    assert!(matches!(ns.put(b"k", b"v"), Err(Error::Closed)));
    assert!(matches!(ns.get(b"k"), Err(Error::Closed)));
}

/// What a namespace of the model holds: its current generation's keys.
#[derive(Default, Clone)]
struct ModelNs {
    keys: HashMap<u64, u64>,
}

/// Crashes anywhere among writes, creates, drops and truncates (torn and
/// lost writes included): after every recovery, no key of a dropped or
/// truncated generation is readable, and every acknowledged write of a
/// live namespace is.
#[test]
fn crashes_never_bring_a_dropped_namespace_back() {
    let seeds: u64 = std::env::var("GRANARY_NS_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    for seed in 0..seeds {
        if let Err(e) = std::panic::catch_unwind(|| one_crash(seed)) {
            eprintln!("namespace crash simulation failed with seed {seed} (rerun: GRANARY_NS_SEEDS)");
            std::panic::resume_unwind(e);
        }
    }
}

/// A power cut in direct mode (writes acknowledged before any flush) may
/// lose any write made since the last flush, but never the catalog record
/// that gave a namespace its id while keeping a write under that id: the
/// next create would be given the id again and read those keys. The
/// catalog is flushed when a namespace change returns, so the namespace
/// is always there after the cut, and a namespace created then is empty.
#[test]
fn a_power_cut_never_hands_a_lost_namespaces_keys_to_a_new_one() {
    let seeds: u64 = std::env::var("GRANARY_NS_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(64);
    for seed in 0..seeds {
        let now = clock();
        let dev = Arc::new(FaultDevice::new(4 << 20, seed));
        let open = OpenOptions { durability: Durability::Direct, ..opts(&now, false) };
        let s = Store::create(dev.clone(), &create_opts(), &open).unwrap();
        let a = s.create_namespace("a", NamespaceOptions::default()).unwrap();
        a.put(b"k", b"secret").unwrap();
        let t = s.create_namespace("t", NamespaceOptions::default()).unwrap();
        t.put(b"old", b"before the truncate").unwrap();
        s.truncate("t").unwrap();
        t.put(b"k", b"after the truncate").unwrap();
        dev.plan_crash(0, CrashKind::Power);
        assert!(s.put(b"x", b"the write the power cut tears").is_err(), "seed {seed}");
        drop((a, t, s));
        dev.restart();
        let s = Store::open(dev.clone(), &open).unwrap_or_else(|e| panic!("seed {seed}: reopen: {e}"));
        let a = s.namespace("a").unwrap_or_else(|e| panic!("seed {seed}: namespace a was lost: {e}"));
        assert!(matches!(a.get(b"k").unwrap().as_deref(), None | Some(b"secret")), "seed {seed}");
        let t = s.namespace("t").unwrap();
        assert_eq!(t.get(b"old").unwrap(), None, "seed {seed}: the truncate was lost");
        for name in ["b", "c"] {
            let n = s.create_namespace(name, NamespaceOptions::default()).unwrap();
            assert_eq!(n.get(b"k").unwrap(), None, "seed {seed}: new namespace {name} reads another's key");
            assert_eq!(n.stats().unwrap().keys, 0, "seed {seed}: new namespace {name} counts another's keys");
        }
        s.verify().unwrap();
    }
}

fn one_crash(seed: u64) {
    let mut rng = SimRng::new(seed);
    let dev = Arc::new(FaultDevice::new(4 << 20, seed));
    let now = clock();
    // A process crash keeps every completed write; a power cut keeps the
    // flushed ones (so the store flushes each write).
    let (kind, durability) = if seed.is_multiple_of(2) {
        (CrashKind::Process, Durability::Direct)
    } else {
        (CrashKind::Power, Durability::Flush)
    };
    let open = OpenOptions { durability, ..opts(&now, false) };
    let s = Store::create(dev.clone(), &create_opts(), &open).unwrap();
    let names = ["n0", "n1", "n2"];
    let mut model: HashMap<&str, ModelNs> = HashMap::new();
    // Values written to generations since dropped: they must never read back.
    let mut dead: Vec<(&str, u64, u64)> = Vec::new();
    // An operation the crash cut short: its namespace may or may not have
    // changed.
    let mut unsure: Option<&str> = None;
    dev.plan_crash(rng.below(400), kind);
    let mut version = 0u64;
    'ops: for _ in 0..400 {
        version += 1;
        let name = names[rng.below(3) as usize];
        let roll = rng.below(100);
        let r = if roll < 6 {
            match s.create_namespace(name, NamespaceOptions::default()) {
                Ok(_) => {
                    model.insert(name, ModelNs::default());
                    Ok(())
                }
                Err(Error::NamespaceExists { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        } else if roll < 9 {
            match s.drop_namespace(name) {
                Ok(()) => {
                    if let Some(m) = model.remove(name) {
                        dead.extend(m.keys.iter().map(|(k, v)| (name, *k, *v)));
                    }
                    Ok(())
                }
                Err(Error::NoSuchNamespace { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        } else if roll < 11 {
            match s.truncate(name) {
                Ok(()) => {
                    if let Some(m) = model.get_mut(name) {
                        dead.extend(m.keys.drain().map(|(k, v)| (name, k, v)));
                    }
                    Ok(())
                }
                Err(Error::NoSuchNamespace { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        } else {
            let Ok(ns) = s.namespace(name) else { continue };
            let k = rng.below(30);
            match ns.put(&load_key(k), &load_value(k, version, 60)) {
                Ok(()) => {
                    model.get_mut(name).expect("a live namespace").keys.insert(k, version);
                    Ok(())
                }
                Err(e) => Err(e),
            }
        };
        if let Err(e) = r {
            match e {
                Error::Io { .. } | Error::Poisoned { .. } => {
                    unsure = Some(name);
                    break 'ops;
                }
                e => panic!("seed {seed}: {e}"),
            }
        }
        if rng.below(40) == 0 {
            let _ = s.checkpoint();
        }
        if rng.below(20) == 0 {
            s.gc_step();
        }
        if dev.crashed() {
            break;
        }
    }
    drop(s);
    dev.restart();
    let s = Store::open(dev.clone(), &open).unwrap_or_else(|e| panic!("seed {seed}: reopen: {e}"));
    for (name, k, v) in &dead {
        // The name may hold a later generation (created again): that one
        // must not show the old value.
        if let Ok(ns) = s.namespace(name) {
            let got = ns.get(&load_key(*k)).unwrap();
            assert_ne!(got, Some(load_value(*k, *v, 60)), "seed {seed}: {name}/{k} of a dropped generation came back");
        }
    }
    for (name, m) in &model {
        if Some(*name) == unsure {
            continue;
        }
        let ns = s.namespace(name).unwrap_or_else(|e| panic!("seed {seed}: namespace {name}: {e}"));
        for (k, v) in &m.keys {
            assert_eq!(ns.get(&load_key(*k)).unwrap(), Some(load_value(*k, *v, 60)), "seed {seed}: {name}/{k}");
        }
    }
    s.verify().unwrap_or_else(|e| panic!("seed {seed}: verify: {e}"));
}

/// In a store that evicts, a namespace in mode `cache` at its quota evicts
/// its own oldest values so that the write goes through, and leaves other
/// namespaces alone; one in mode `store` keeps refusing. After a crash no
/// key reads an older value than it had (an overwritten key evicted is
/// replaced by a tombstone), and no key present before is lost.
#[test]
fn a_cache_namespace_at_its_quota_evicts_its_own_values() {
    let now = clock();
    let dev = device(8 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts(&now, true)).unwrap();
    let q = s.create_namespace("q", NamespaceOptions { max_keys: Some(64), ..Default::default() }).unwrap();
    let bytes = s.create_namespace("b", NamespaceOptions { max_bytes: Some(40 * 512), ..Default::default() }).unwrap();
    let other = s.create_namespace("other", NamespaceOptions::default()).unwrap();
    let strict = NamespaceOptions { mode: NamespaceMode::Store, max_keys: Some(64), ..Default::default() };
    let strict = s.create_namespace("strict", strict).unwrap();
    // Key 0 is overwritten: its last version supersedes the first.
    q.put(&load_key(0), b"first").unwrap();
    for i in 0..400u64 {
        q.put(&load_key(i), &load_value(i, 1, 300)).unwrap();
        // One to three grains a value.
        bytes.put(&load_key(i), &load_value(i, 1, 100 + (i as usize % 3) * 512)).unwrap();
        other.put(&load_key(i), b"o").unwrap();
        if i < 64 {
            strict.put(&load_key(i), b"s").unwrap();
        }
        let (qs, bs) = (q.stats().unwrap(), bytes.stats().unwrap());
        assert!(qs.keys <= 64, "{i}: {qs:?}");
        assert!(bs.value_bytes <= 40 * 512, "{i}: {bs:?}");
    }
    let err = strict.put(&load_key(64), b"s").unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded { what: "keys", limit: 64, .. }), "{err}");
    let present = |s: &Store, name: &str, value: &dyn Fn(u64) -> Vec<u8>| -> Vec<u64> {
        let ns = s.namespace(name).unwrap();
        (0..400u64)
            .filter(|&i| match ns.get(&load_key(i)).unwrap() {
                Some(v) => {
                    assert_eq!(v, value(i), "{name} key {i}");
                    true
                }
                None => false,
            })
            .collect()
    };
    let q_value = |i| load_value(i, 1, 300);
    let b_value = |i| load_value(i, 1, 100 + (i as usize % 3) * 512);
    let in_q = present(&s, "q", &q_value);
    let in_b = present(&s, "b", &b_value);
    let qs = q.stats().unwrap();
    assert_eq!(in_q.len() as u64, qs.keys);
    assert!(
        in_q.contains(&399) && !in_q.contains(&0) && !in_q.contains(&1),
        "the newest kept, the oldest evicted: {in_q:?}"
    );
    assert!(in_b.contains(&399) && !in_b.contains(&0), "{in_b:?}");
    assert!(qs.evictions >= 400 - 64, "{qs:?}");
    // An eviction's tombstone (key 0's: an older version is on the
    // device) is the engine's write, not a user's delete.
    assert_eq!(s.stats().deletes, 0);
    assert_eq!(present(&s, "other", &|_| b"o".to_vec()).len(), 400);
    assert_eq!(strict.stats().unwrap().keys, 64);
    // A batch into the full namespace makes room for itself too.
    let mut batch = s.batch();
    for i in 1000..1010 {
        batch.put(&q, &load_key(i), b"batch");
    }
    assert!(matches!(batch.commit().unwrap(), granary_store::BatchOutcome::Committed { .. }));
    assert!(q.stats().unwrap().keys <= 64);
    assert_eq!(q.get(&load_key(1009)).unwrap().unwrap(), b"batch");
    let in_q = present(&s, "q", &q_value);
    // A crash: values evicted with no IO may come back (they were their
    // keys' only versions), nothing older than what was read comes back.
    drop((q, bytes, other, strict));
    drop(s);
    let s = Store::open(dev, &opts(&now, true)).unwrap();
    let after = present(&s, "q", &q_value);
    assert!(in_q.iter().all(|i| after.contains(i)), "{in_q:?} then {after:?}");
    assert!(!after.contains(&0), "key 0's eviction was a tombstone");
    assert_eq!(present(&s, "other", &|_| b"o".to_vec()).len(), 400);
    // A write evicts what came back.
    let q = s.namespace("q").unwrap();
    q.put(b"again", b"x").unwrap();
    assert!(q.stats().unwrap().keys <= 64);
    s.close().unwrap();
}

/// A run of PUTs (`put_many`) counts each key once, as single PUTs would:
/// the store's puts and user bytes and the namespace's sets, new keys
/// and overwrites (blind ones included).
#[test]
fn a_run_of_puts_counts_each_key_once() {
    let now = clock();
    let o = OpenOptions { blind_overwrite_bytes: Some(1 << 20), ..opts(&now, false) };
    let s = Store::create(device(8 << 20), &create_opts(), &o).unwrap();
    let a = s.create_namespace("a", NamespaceOptions::default()).unwrap();
    let b = s.create_namespace("b", NamespaceOptions::default()).unwrap();
    let keys: Vec<Vec<u8>> = (0..40u32).map(|i| format!("key-{i}").into_bytes()).collect();
    let value = vec![7u8; 300];
    let items: Vec<(&[u8], &[u8])> = keys.iter().map(|k| (&k[..], &value[..])).collect();
    let figures =
        |ns: &granary_store::Namespace| (s.stats().puts, s.stats().user_bytes_written, ns.stats().unwrap().sets);
    let delta =
        |before: (u64, u64, u64), after: (u64, u64, u64)| (after.0 - before.0, after.1 - before.1, after.2 - before.2);
    for round in 0..2 {
        // The same keys one PUT at a time in a namespace of a name as long.
        let before = figures(&b);
        for &(k, v) in &items {
            b.put(k, v).unwrap();
        }
        let single = delta(before, figures(&b));
        assert_eq!((single.0, single.2), (40, 40));
        let before = figures(&a);
        a.put_many(&items).unwrap();
        assert_eq!(delta(before, figures(&a)), single, "round {round}");
    }
    assert!(s.stats().blind_overwrites > 0, "the overwrites took the blind path");
}

/// A cache namespace at its quota evicts values that head blind
/// overwrites' links (every key overwritten once since its first value):
/// the link is settled first. They were skipped, so such a namespace
/// refused every new key until a checkpoint or GC settled the links.
#[test]
fn a_cache_namespace_at_its_quota_evicts_values_that_head_links() {
    let now = clock();
    let o = OpenOptions { blind_overwrite_bytes: Some(1 << 20), ..opts(&now, true) };
    let dev = device(8 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &o).unwrap();
    let q = s.create_namespace("q", NamespaceOptions { max_keys: Some(16), ..Default::default() }).unwrap();
    for round in [&b"first"[..], b"second"] {
        for i in 0..16 {
            q.put(&load_key(i), round).unwrap();
        }
    }
    assert!(s.stats().unsettled_links >= 16, "the overwrites were blind: {}", s.stats().unsettled_links);
    for i in 16..32 {
        q.put(&load_key(i), b"new").unwrap();
        assert!(q.stats().unwrap().keys <= 16, "key {i}");
    }
    let read = |s: &Store| {
        let q = s.namespace("q").unwrap();
        let mut present = 0;
        for i in 0..32 {
            if let Some(v) = q.get(&load_key(i)).unwrap() {
                assert_eq!(v, if i < 16 { &b"second"[..] } else { b"new" }, "key {i}");
                present += 1;
            }
        }
        present
    };
    assert!((1..=16).contains(&read(&s)));
    assert_eq!(q.get(&load_key(31)).unwrap().as_deref(), Some(&b"new"[..]), "the last write is kept");
    drop(q);
    s.close().unwrap();
    let s = Store::open(dev, &o).unwrap();
    assert!((1..=16).contains(&read(&s)), "an evicted value came back");
}
