//! Engine tests that need private access: regressions for known pitfalls of
//! a log-structured store (tombstones, holes, scan order), corruption, torn
//! tails, limits, poisoning, concurrency.

use crate::*;
use granary_format::hash::{key_tag, KeyHasher};
use granary_format::limits::KEY_BYTES_MAX;
use granary_format::record::RecordHeader;
use granary_io::{Device, TestDevice};

use std::sync::Arc;

/// A device for this suite: in memory, or an O_DIRECT file on io_uring
/// with `GRANARY_TEST_BACKEND=uring` (`granary_io::testdev`).
pub(crate) fn test_device(size: u64) -> Arc<TestDevice> {
    Arc::new(TestDevice::new(size, std::path::Path::new(env!("CARGO_MANIFEST_DIR"))))
}

/// Whether the suite runs on the zoned test backend
/// (`GRANARY_TEST_BACKEND=zoned`), where a test that cannot apply skips,
/// saying why on stderr (past the harness's capture).
pub(crate) fn skip_zoned(why: &str) -> bool {
    let zoned = granary_io::TestBackend::from_env() == granary_io::TestBackend::Zoned;
    if zoned {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "skipped on the zoned test backend: {why}");
    }
    zoned
}

/// A test device and a manual clock (seconds, starting at 1,000,000) that
/// the stores opened with [`ClockFixture::opts`] read: the cache and tier
/// suites move time by hand, never sleeping.
pub(crate) struct ClockFixture {
    pub dev: Arc<TestDevice>,
    pub now: Arc<std::sync::atomic::AtomicU32>,
    /// The DRAM tier of the stores opened (`OpenOptions::dram_tier_bytes`).
    pub tier_bytes: u64,
}

impl ClockFixture {
    pub fn new(size: u64) -> ClockFixture {
        ClockFixture {
            dev: test_device(size),
            now: Arc::new(std::sync::atomic::AtomicU32::new(1_000_000)),
            tier_bytes: OpenOptions::default().dram_tier_bytes,
        }
    }

    /// Default options but for the clock, the tier and these switches.
    pub fn opts(&self, gc: bool, evict: bool) -> OpenOptions {
        let now = self.now.clone();
        OpenOptions {
            gc,
            evict,
            clock: Clock(Arc::new(move || now.load(std::sync::atomic::Ordering::Relaxed))),
            dram_tier_bytes: self.tier_bytes,
            ..OpenOptions::default()
        }
    }

    /// A new store of 512-byte grains and `segment`-byte segments.
    pub fn create(&self, segment: u64, gc: bool, evict: bool) -> Store {
        let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(segment), index_table_homes: Some(256) };
        self.dev.shape_zones(segment);
        Store::create(self.dev.clone(), &c, &self.opts(gc, evict)).unwrap()
    }

    /// Open again after a crash (no close, no checkpoint written).
    pub fn reopen(&self, s: Store, scan: bool) -> Store {
        drop(s);
        let o = OpenOptions { use_checkpoint: !scan, ..self.opts(false, false) };
        Store::open(self.dev.clone(), &o).unwrap()
    }

    pub fn advance(&self, secs: u32) {
        self.now.fetch_add(secs, std::sync::atomic::Ordering::Relaxed);
    }
}

pub(crate) fn mem_store(size: u64, segment: u64, grain: u32) -> (Arc<TestDevice>, Store) {
    mem_store_gc(size, segment, grain, true)
}

fn mem_store_gc(size: u64, segment: u64, grain: u32, gc: bool) -> (Arc<TestDevice>, Store) {
    let dev = test_device(size);
    dev.shape_zones(segment);
    let opts = CreateOptions { grain_bytes: Some(grain), segment_bytes: Some(segment), index_table_homes: Some(64) };
    let s = Store::create(dev.clone(), &opts, &OpenOptions { gc, ..OpenOptions::default() }).unwrap();
    (dev, s)
}

fn reopen(dev: &Arc<TestDevice>, s: Store) -> Store {
    drop(s);
    Store::open(dev.clone(), &OpenOptions::default()).unwrap()
}

/// An in-memory device that calls `before_write(len, offset)` before each
/// of its synchronous writes (a test's gate or probe, which may block),
/// all else as the memory device does. The hook returns None to let the
/// write through whole, or `Some(n)` to write only its first `n` bytes
/// (a multiple of 512) and fail it, as a crash during the write would
/// leave the device.
pub(crate) struct HookedDevice<F> {
    pub inner: granary_io::MemDevice,
    pub before_write: F,
}

impl<F: Fn(usize, u64) -> Option<usize> + Send + Sync + 'static> Device for HookedDevice<F> {
    fn read_at(&self, buf: granary_io::AlignedBuf, offset: u64) -> granary_io::IoResult {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: granary_io::AlignedBuf, offset: u64) -> granary_io::IoResult {
        let Some(n) = (self.before_write)(buf.len(), offset) else { return self.inner.write_at(buf, offset) };
        if n > 0 {
            let mut part = granary_io::AlignedBuf::zeroed(n);
            part.copy_from_slice(&buf[..n]);
            let (_, r) = self.inner.write_at(part, offset);
            r.expect("the torn prefix of a write");
        }
        (buf, Err(std::io::Error::other("write torn by the test device")))
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn block_bytes(&self) -> u32 {
        self.inner.block_bytes()
    }
    fn counters(&self) -> &granary_io::IoCounters {
        self.inner.counters()
    }
    fn describe(&self) -> String {
        format!("hooked {}", self.inner.describe())
    }
}

/// Keys sharing home slot and key tag in a store with 64-slot tables whose
/// keys hash with `hasher` (its `core.keys.hasher`).
pub(crate) fn colliding_keys(hasher: KeyHasher, n: usize) -> Vec<Vec<u8>> {
    let mut by_fp: std::collections::HashMap<(usize, u16), Vec<Vec<u8>>> = Default::default();
    for i in 0.. {
        let k = format!("collide-{i}").into_bytes();
        let h = hasher.hash(&k);
        let v = by_fp.entry((granary_index::home_of(h, 64), key_tag(h))).or_default();
        v.push(k);
        if v.len() == n {
            return v.clone();
        }
    }
    unreachable!()
}

/// Append a record with a chosen sequence number, bypassing the index, as
/// GC relocation of an old version would.
fn append_raw(s: &Store, key: &[u8], value: &[u8], seq: u64, tombstone: bool) {
    let hdr = if tombstone {
        RecordHeader::tombstone(key.len(), seq, 0, 0)
    } else {
        RecordHeader::value(key.len(), value.len() as u64, seq, 0)
    };
    let loc = s.core.write_record(crate::space::Purpose::Put, hdr, key, value).unwrap();
    s.core.space.done(loc.seg);
}

/// Fill the open segment so the next record opens a new one.
fn roll_segment(s: &Store) {
    let before = s.core.space.used_segments().len();
    let mut i = 0;
    while s.core.space.used_segments().len() == before {
        s.put(format!("filler-{i}").as_bytes(), &[0u8; 4000]).unwrap();
        i += 1;
    }
}

#[test]
fn basic_modes_and_empty_values() {
    let (_dev, s) = mem_store(16 << 20, 1 << 20, 512);
    assert_eq!(s.get(b"a").unwrap(), None);
    assert_eq!(s.put_with(b"a", b"1", PutMode::ReplaceOnly).unwrap(), PutOutcome::NotFound);
    assert_eq!(s.put_with(b"a", b"1", PutMode::CreateOnly).unwrap(), PutOutcome::Stored);
    assert_eq!(s.put_with(b"a", b"2", PutMode::CreateOnly).unwrap(), PutOutcome::Exists);
    assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(s.put_with(b"a", b"", PutMode::ReplaceOnly).unwrap(), PutOutcome::Stored);
    assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b""[..]));
    assert!(s.delete(b"a").unwrap());
    assert!(!s.delete(b"a").unwrap());
    assert_eq!(s.put_with(b"a", b"3", PutMode::ReplaceOnly).unwrap(), PutOutcome::NotFound);
    assert_eq!(s.put_with(b"a", b"3", PutMode::CreateOnly).unwrap(), PutOutcome::Stored);
    let st = s.stats();
    assert_eq!((st.keys, st.tombstones), (1, 0));
    assert!(s.verify().unwrap().is_clean());
}

/// The size hint is the record's size in whole grains, from the index
/// alone: 0 for a key never written, the value's new size after an
/// overwrite, and per namespace (the same user key elsewhere is another
/// record).
#[test]
fn the_size_hint_is_the_records_grains_without_io() {
    let (_dev, s) = mem_store(16 << 20, 1 << 20, 512);
    assert_eq!(s.value_size_hint(b"k").unwrap(), 0);
    let hint = |len: usize| {
        let record = (granary_format::limits::RECORD_HEADER_BYTES + 1 + len) as u64;
        record.div_ceil(512) * 512
    };
    s.put(b"k", &[7; 3000]).unwrap();
    assert_eq!(s.value_size_hint(b"k").unwrap(), hint(3000));
    s.put(b"k", &[7; 100]).unwrap();
    assert_eq!(s.value_size_hint(b"k").unwrap(), hint(100), "the overwrite's record");
    let ns = s.create_namespace("n", NamespaceOptions::default()).unwrap();
    assert_eq!(ns.value_size_hint(b"k").unwrap(), 0, "another namespace's key");
    ns.put(b"k", &[1; 5000]).unwrap();
    let in_ns = ns.value_size_hint(b"k").unwrap();
    assert!(in_ns >= hint(5000) && in_ns <= hint(5000 + 16), "{in_ns}: the stored key is longer");
    assert_eq!(s.value_size_hint(b"k").unwrap(), hint(100));
    assert!(s.value_size_hint(b"").is_err(), "a key the store refuses is refused here too");
}

/// A deleted key stays deleted after a crash: its tombstone never comes back
/// as a live empty value.
#[test]
fn regression_deleted_key_stays_deleted_after_reopen() {
    let (dev, s) = mem_store(16 << 20, 1 << 20, 512);
    s.put(b"gone", b"value").unwrap();
    s.put(b"kept", b"value").unwrap();
    assert!(s.delete(b"gone").unwrap());
    let s = reopen(&dev, s);
    assert_eq!(s.get(b"gone").unwrap(), None);
    assert_eq!(s.get(b"kept").unwrap().as_deref(), Some(&b"value"[..]));
    assert_eq!((s.stats().keys, s.stats().tombstones), (1, 1));
}

/// An empty value is a value, never a delete, before and after reopen.
#[test]
fn regression_empty_value_survives_reopen_as_empty_value() {
    let (dev, s) = mem_store(16 << 20, 1 << 20, 512);
    s.put(b"empty", b"").unwrap();
    let s = reopen(&dev, s);
    assert_eq!(s.get(b"empty").unwrap(), Some(vec![]));
    assert_eq!(s.stats().keys, 1);
}

/// A purge leaves a hole, and lookup must not stop at the first free slot:
/// deleting keys never hides another key of the same neighbourhood.
#[test]
fn regression_delete_never_hides_a_key_sharing_its_neighbourhood() {
    let (dev, s) = mem_store(16 << 20, 1 << 20, 512);
    let keys = colliding_keys(s.core.keys.hasher, 4);
    for (i, k) in keys.iter().enumerate() {
        s.put(k, format!("v{i}").as_bytes()).unwrap();
    }
    assert!(s.delete(&keys[0]).unwrap());
    assert!(s.delete(&keys[2]).unwrap());
    for s in [&s, &reopen(&dev, Store::open(dev.clone(), &OpenOptions::default()).unwrap())] {
        assert_eq!(s.get(&keys[0]).unwrap(), None);
        assert_eq!(s.get(&keys[1]).unwrap().as_deref(), Some(&b"v1"[..]));
        assert_eq!(s.get(&keys[2]).unwrap(), None);
        assert_eq!(s.get(&keys[3]).unwrap().as_deref(), Some(&b"v3"[..]));
    }
}

/// The recovery winner must not depend on scan order: a newer version in
/// an older segment beats an older version (relocated) in a newer one.
#[test]
fn regression_newer_record_wins_regardless_of_scan_order() {
    let (dev, s) = mem_store(16 << 20, 64 << 10, 512);
    s.put(b"k", b"old").unwrap();
    s.put(b"k", b"new").unwrap();
    let new_seq = s.core.log.next_seq.load(std::sync::atomic::Ordering::Relaxed) - 1;
    roll_segment(&s);
    // An old version lands in a later segment with its old sequence number.
    append_raw(&s, b"k", b"old", new_seq - 1, false);
    let s = reopen(&dev, s);
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"new"[..]));
    assert!(s.verify().unwrap().is_clean());
}

/// Older values must not reappear behind a tombstone: a delete in an older
/// segment beats an older value scanned after it.
#[test]
fn regression_tombstone_beats_older_value_scanned_later() {
    let (dev, s) = mem_store(16 << 20, 64 << 10, 512);
    s.put(b"k", b"old").unwrap();
    let old_seq = s.core.log.next_seq.load(std::sync::atomic::Ordering::Relaxed) - 1;
    assert!(s.delete(b"k").unwrap());
    roll_segment(&s);
    append_raw(&s, b"k", b"old", old_seq, false);
    let s = reopen(&dev, s);
    assert_eq!(s.get(b"k").unwrap(), None);
}

fn flip_byte_of(dev: &TestDevice, s: &Store, key: &[u8], at: usize) {
    let e = s.core.keys.index.lookup(s.core.keys.hash(key)).as_slice()[0];
    let off = (e.pba() * s.core.log.grain()) as usize + at;
    dev.with_bytes_mut(|b| b[off] ^= 0x20);
}

/// A segment header of this store that fails its checksum (damage: no
/// crash tears a one-sector header) makes the open take the segment for
/// free, so its records are not indexed: `verify` names it (it reported
/// a clean store that had lost the segment's keys).
#[test]
fn verify_reports_a_damaged_segment_header() {
    let (dev, s) = mem_store(16 << 20, 64 << 10, 512);
    s.put(b"victim", b"precious value").unwrap();
    let seg = s.core.log.sb.segment_of(s.core.keys.index.lookup(s.core.keys.hash(b"victim")).as_slice()[0].pba());
    roll_segment(&s);
    s.put(b"other", b"fine").unwrap();
    assert!(s.verify().unwrap().is_clean());
    // A byte of the header's alloc_seq.
    let off = s.core.log.sb.segment_offset(seg) as usize + 8;
    drop(s);
    dev.with_bytes_mut(|b| b[off] ^= 0x01);
    // Opened as `granary verify` opens (an open for writing on a zoned
    // device resets the zones of free segments, this one's too).
    let inspect = OpenOptions { clear_torn: false, gc: false, checkpoint_on_close: false, ..OpenOptions::default() };
    let s = Store::open(dev.clone(), &inspect).unwrap();
    assert_eq!(s.get(b"victim").unwrap(), None, "the segment was taken for free");
    let report = s.verify().unwrap();
    assert!(!report.is_clean());
    assert!(
        report.errors.iter().any(|e| e.contains(&format!("segment {seg}: its header fails its checksum"))),
        "{:?}",
        report.errors
    );
    assert_eq!(s.get(b"other").unwrap().as_deref(), Some(&b"fine"[..]));
}

#[test]
fn corruption_is_reported_not_returned() {
    let (dev, s) = mem_store(16 << 20, 1 << 20, 512);
    s.put(b"victim", b"precious value").unwrap();
    s.put(b"other", b"fine").unwrap();
    flip_byte_of(&dev, &s, b"victim", 48 + 6 + 3); // a value byte
    let err = s.get(b"victim").unwrap_err();
    assert!(err.is_corruption(), "{err}");
    assert!(err.to_string().contains("checksum"), "{err}");
    assert_eq!(s.get(b"other").unwrap().as_deref(), Some(&b"fine"[..]));
    let report = s.verify().unwrap();
    assert!(!report.is_clean());
    assert_eq!(report.damaged_records, 1);
}

#[test]
fn corruption_in_an_old_segment_is_reported_after_reopen() {
    let (dev, s) = mem_store(16 << 20, 64 << 10, 512);
    s.put(b"victim", b"precious value").unwrap();
    for _ in 0..3 {
        roll_segment(&s);
    }
    s.put(b"other", b"fine").unwrap();
    flip_byte_of(&dev, &s, b"victim", 48 + 6 + 3);
    let s = reopen(&dev, s);
    assert_eq!(s.stats().recovery.damaged_records, 1);
    assert!(s.get(b"victim").unwrap_err().is_corruption());
    assert_eq!(s.get(b"other").unwrap().as_deref(), Some(&b"fine"[..]));
    assert!(!s.verify().unwrap().is_clean());
}

/// Opened with `clear_torn` off (what `granary verify`, `stat` and `get`
/// do), recovery ignores a torn record without writing: its bytes stay on
/// the device, `verify` counts it as torn (not damaged, not an error),
/// and the next ordinary open clears it.
#[test]
fn an_inspection_leaves_a_torn_record_in_place_and_verify_counts_it() {
    if skip_zoned("zoned mode reclaims a torn record's segment at open") {
        return;
    }
    let (dev, s) = mem_store(16 << 20, 64 << 10, 512);
    s.put(b"k", b"acknowledged").unwrap();
    s.put(b"k", &[7u8; 2000]).unwrap(); // pretend this write was torn
    let torn = s.core.keys.index.lookup(s.core.keys.hash(b"k")).as_slice()[0].pba();
    flip_byte_of(&dev, &s, b"k", 1500);
    drop(s);
    let off = (torn * 512) as usize;
    let before = dev.with_bytes_mut(|b| b[off..off + 512].to_vec());
    let s = Store::open(dev.clone(), &OpenOptions { clear_torn: false, gc: false, ..OpenOptions::default() }).unwrap();
    assert_eq!(s.stats().recovery.torn_records, 1);
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"acknowledged"[..]));
    let report = s.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.errors);
    assert_eq!((report.torn_records, report.damaged_records), (1, 0));
    drop(s);
    assert_eq!(dev.with_bytes_mut(|b| b[off..off + 512].to_vec()), before, "the inspection wrote over the torn record");
    // An ordinary open clears it.
    let s = Store::open(dev.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(s.stats().recovery.torn_records, 1);
    assert!(dev.with_bytes_mut(|b| b[off..off + 512].iter().all(|&x| x == 0)));
    assert_eq!(s.verify().unwrap().torn_records, 0);
}

/// Zoned mode only (None on another backend: only zoned mode reclaims a
/// torn record's segment at open): a store whose key `k` holds
/// "acknowledged" and then a torn record, opened with `opts` while the
/// open's relocating reclaim fails, with a device error (`device`) or for
/// room.
fn opened_with_a_torn_segment(device: bool, opts: OpenOptions) -> Option<(Arc<TestDevice>, Store)> {
    if granary_io::TestBackend::from_env() != granary_io::TestBackend::Zoned {
        return None;
    }
    let (dev, s) = mem_store(16 << 20, 64 << 10, 512);
    s.put(b"k", b"acknowledged").unwrap();
    s.put(b"k", &[7u8; 2000]).unwrap(); // pretend this write was torn
    flip_byte_of(&dev, &s, b"k", 1500);
    drop(s);
    crate::open::TORN_RECLAIM_FAILS.set(Some(device));
    let opened = Store::open(dev.clone(), &opts);
    crate::open::TORN_RECLAIM_FAILS.set(None);
    Some((dev, opened.unwrap()))
}

/// Zoned mode: a segment holding a torn record that the open cannot
/// reclaim leaves the store read-only (writing on would move its stream
/// past it, and a later log scan would take the torn record over the
/// key's acknowledged value); reads still answer, and an open that
/// reclaims it writes again.
#[test]
fn a_torn_segment_the_open_cannot_reclaim_leaves_the_store_read_only() {
    let Some((dev, s)) = opened_with_a_torn_segment(true, OpenOptions { gc: false, ..OpenOptions::default() }) else {
        return;
    };
    assert_eq!(s.stats().recovery.torn_records, 1);
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"acknowledged"[..]));
    let err = s.put(b"other", b"x").unwrap_err();
    assert!(err.to_string().contains("torn record and could not be reclaimed"), "{err}");
    drop(s);
    let s = Store::open(dev.clone(), &OpenOptions::default()).unwrap();
    s.put(b"other", b"x").unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"acknowledged"[..]));
    assert!(s.verify().unwrap().is_clean());
}

/// Zoned mode: a cache whose open finds no room to relocate a torn
/// record's segment evicts the segment instead (as GC does with no room),
/// and stays writable.
#[test]
fn a_cache_without_room_to_relocate_a_torn_segment_evicts_it() {
    let cache = OpenOptions { gc: false, evict: true, ..OpenOptions::default() };
    let Some((_, s)) = opened_with_a_torn_segment(false, cache) else { return };
    assert_eq!(s.stats().recovery.torn_records, 1);
    s.put(b"other", b"x").unwrap();
    // Evicted with its segment (a cache may lose values), never the torn one.
    assert!(matches!(s.get(b"k").unwrap().as_deref(), None | Some(b"acknowledged")));
    assert_eq!(s.get(b"other").unwrap().as_deref(), Some(&b"x"[..]));
}

/// A record torn by a crash in the newest segment was never acknowledged:
/// recovery ignores it (the older value stays), and keeps ignoring it later.
#[test]
fn torn_tail_record_is_ignored_and_stays_ignored() {
    let (dev, s) = mem_store(16 << 20, 64 << 10, 512);
    s.put(b"k", b"acknowledged").unwrap();
    s.put(b"k", &[7u8; 2000]).unwrap(); // pretend this write was torn
    flip_byte_of(&dev, &s, b"k", 1500);
    let s = reopen(&dev, s);
    assert_eq!(s.stats().recovery.torn_records, 1);
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"acknowledged"[..]));
    for _ in 0..3 {
        roll_segment(&s);
    }
    let s = reopen(&dev, s);
    assert_eq!(s.stats().recovery.damaged_records, 0);
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"acknowledged"[..]));
    assert!(s.verify().unwrap().is_clean());
}

fn pba_of_key(s: &Store, key: &[u8]) -> u64 {
    s.core.keys.index.lookup(s.core.keys.hash(key)).as_slice()[0].pba()
}

/// After a crash, writes resume in the tail of the segment that was open,
/// right after its last record (a torn one included), so a crash costs no
/// segment; what they write survives the next crash. Not after a clean
/// close, whose checkpoint would not replay that segment: writes then
/// start a new one.
#[test]
fn writes_resume_in_the_open_segments_tail_after_a_crash_but_not_after_a_clean_close() {
    let (dev, s) = mem_store(16 << 20, 1 << 20, 512);
    s.put(b"a", &[1u8; 3000]).unwrap();
    s.put(b"torn", &[3u8; 2000]).unwrap();
    let (a, torn) = (pba_of_key(&s, b"a"), pba_of_key(&s, b"torn"));
    flip_byte_of(&dev, &s, b"torn", 1500);
    let used = s.core.space.used_segments().len();
    let s = reopen(&dev, s);
    assert_eq!(s.stats().recovery.torn_records, 1);
    s.put(b"b", &[2u8; 3000]).unwrap();
    if s.core.space.zoned() {
        // Zoned mode cannot clear the torn record behind the write
        // pointer: the open reclaimed its segment (`a` relocated, the
        // zone reset), and writes start a segment anew.
        assert!(dev.zoned().unwrap().resets() >= 1, "the torn record's zone was reset");
        assert_ne!(pba_of_key(&s, b"a"), a, "a was relocated");
        assert_ne!(pba_of_key(&s, b"b"), torn + 5, "b was written behind a write pointer");
        assert_eq!(s.get(b"a").unwrap(), Some(vec![1u8; 3000]));
    } else {
        assert_eq!(pba_of_key(&s, b"b"), torn + 5, "b goes right after the torn record (5 grains)");
        assert_eq!(s.core.space.used_segments().len(), used, "the crash cost a segment");
    }
    let s = reopen(&dev, s);
    assert_eq!(s.stats().recovery.torn_records, 0, "the torn record was cleared");
    assert_eq!(s.get(b"a").unwrap(), Some(vec![1u8; 3000]));
    assert_eq!(s.get(b"b").unwrap(), Some(vec![2u8; 3000]));
    assert_eq!(s.get(b"torn").unwrap(), None);
    s.close().unwrap();
    let s = Store::open(dev.clone(), &OpenOptions::default()).unwrap();
    assert!(s.stats().recovery.clean_shutdown);
    s.put(b"c", b"after a clean close").unwrap();
    assert_ne!(segment_of_key(&s, b"c"), s.core.log.sb.segment_of(a), "wrote past a clean checkpoint's replay");
    let s = reopen(&dev, s);
    assert_eq!(s.get(b"b").unwrap(), Some(vec![2u8; 3000]));
    assert_eq!(s.get(b"c").unwrap().as_deref(), Some(&b"after a clean close"[..]));
    assert!(s.verify().unwrap().is_clean());
}

/// The log scan after a crash reads its segments in whole windows, also
/// when records of a few grains straddle a window's end (the rest of such
/// a value is skipped, and the next read must not shrink to one grain, or
/// every later record of the segment becomes a small read of its own).
#[test]
fn the_log_scan_reads_windows_when_records_straddle_them() {
    if skip_zoned("4 MiB segments (the scan's windows): they start at 1 MiB, which 4 MiB zones do not divide") {
        return;
    }
    let (dev, s) = mem_store(64 << 20, 4 << 20, 512);
    for i in 0..10_000u32 {
        s.put(format!("straddle-{i}").as_bytes(), &[i as u8; 4000]).unwrap();
    }
    drop(s);
    let before = dev.counters().snapshot().reads;
    let s = Store::open(dev.clone(), &OpenOptions::default()).unwrap();
    let reads = dev.counters().snapshot().reads - before;
    let r = s.stats().recovery;
    assert_eq!((r.records, r.checkpoint_id), (10_000, 0), "a log scan, no checkpoint: {r:?}");
    assert!(r.segments_scanned >= 9, "{r:?}");
    // 4 windows of 1 MiB a segment, a first one-grain probe, a few joins
    // at window ends: not one read per record (10,000).
    assert!(reads <= r.segments_scanned * 12 + 64, "{reads} device reads for {} segments", r.segments_scanned);
    assert_eq!(s.get(b"straddle-9999").unwrap(), Some(vec![9999u32 as u8; 4000]));
}

/// A checkpoint that does not replay the open segment (here a clean one,
/// still on the device after a crash of the session it opened) rules out
/// resuming there on any later open, whichever checkpoint that open loads.
#[test]
fn writes_never_resume_below_a_checkpoint_still_on_the_device() {
    let (dev, s) = mem_store(16 << 20, 1 << 20, 512);
    s.put(b"a", b"1").unwrap();
    s.close().unwrap();
    // A scan-based open (the clean checkpoint stays valid), a write, a crash.
    let scan = OpenOptions { use_checkpoint: false, ..OpenOptions::default() };
    let s = Store::open(dev.clone(), &scan).unwrap();
    s.put(b"b", b"2").unwrap();
    assert_ne!(segment_of_key(&s, b"b"), segment_of_key(&s, b"a"));
    drop(s);
    let s = Store::open(dev.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(s.get(b"b").unwrap().as_deref(), Some(&b"2"[..]), "the write after the clean checkpoint was lost");
    assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
}

/// Writes resume in a segment's tail only if every checkpoint on the
/// device replays it: here an older checkpoint (a periodic one whose
/// release never reached the device) replays from below the user segment
/// and the newest (a clean close's) replays nothing. A scan-based open
/// that then resumed in the tail would have its write skipped by the next
/// open, which loads the newest checkpoint.
#[test]
fn writes_resume_in_a_tail_only_if_every_checkpoint_replays_it() {
    let (dev, s) = mem_store(16 << 20, 1 << 20, 512);
    s.put(b"a", b"1").unwrap();
    let old = s.checkpoint().unwrap().current_id;
    let sb = s.core.log.sb.clone();
    // The older checkpoint's segments (kind 2, alloc_seq its id), as the
    // device holds them now.
    let kept: Vec<(usize, Vec<u8>)> = dev.with_bytes_mut(|b| {
        (0..sb.segment_count as u32)
            .map(|i| sb.segment_offset(i) as usize)
            .filter(|&o| {
                b[o..o + 4] == *b"GSEG"
                    && b[o + 6] == 2
                    && u64::from_le_bytes(b[o + 8..o + 16].try_into().unwrap()) == old
            })
            .map(|o| (o, b[o..o + sb.segment_bytes as usize].to_vec()))
            .collect()
    });
    assert!(!kept.is_empty(), "found the older checkpoint");
    s.put(b"c", b"3").unwrap();
    s.close().unwrap();
    // The close's checkpoint released the older one; that release is lost.
    dev.with_bytes_mut(|b| {
        for (o, seg) in &kept {
            b[*o..*o + seg.len()].copy_from_slice(seg);
        }
    });
    let scan = OpenOptions { use_checkpoint: false, ..OpenOptions::default() };
    let s = Store::open(dev.clone(), &scan).unwrap();
    s.put(b"b", b"2").unwrap();
    drop(s); // a crash
    let s = Store::open(dev.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(s.get(b"b").unwrap().as_deref(), Some(&b"2"[..]), "the write after the scan-based open was lost");
    assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(s.get(b"c").unwrap().as_deref(), Some(&b"3"[..]));
}

/// A clean close's checkpoint leaves GC's reserve alone although GC has
/// already stopped: taking the last free segments left the next open's GC
/// nowhere to write (a cache then refused writes: crash simulation seed
/// 1735556583).
#[test]
fn a_clean_close_leaves_the_gc_reserve_free() {
    let (dev, s) = mem_store(16 << 20, 1 << 20, 512);
    for n in 0.. {
        match s.put(format!("k{n}").as_bytes(), &[1u8; 4000]) {
            Ok(()) => {}
            Err(Error::NoSpace { .. }) => break,
            Err(e) => panic!("filling: {e}"),
        }
    }
    let free = s.stats().segments_free;
    assert_eq!(free, crate::space::RESERVED_SEGMENTS as u64);
    s.close().unwrap();
    let s = Store::open(dev.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(s.stats().segments_free, free, "the close's checkpoint took GC's reserve");
}

#[test]
fn key_limits() {
    let (_dev, s) = mem_store(16 << 20, 1 << 20, 512);
    let max = vec![b'k'; KEY_BYTES_MAX];
    s.put(&max, b"v").unwrap();
    assert_eq!(s.get(&max).unwrap().as_deref(), Some(&b"v"[..]));
    let over = vec![b'k'; KEY_BYTES_MAX + 1];
    let err = s.put(&over, b"v").unwrap_err();
    assert!(matches!(err, Error::KeyLength { len: 65537, .. }), "{err}");
    assert!(err.to_string().contains("1 to 65536 bytes"));
    assert!(matches!(s.put(b"", b"v"), Err(Error::KeyLength { len: 0, .. })));
    assert!(matches!(s.get(&over), Err(Error::KeyLength { .. })));
}

#[test]
fn value_larger_than_the_device_is_rejected() {
    let (_dev, s) = mem_store(8 << 20, 1 << 20, 512);
    let big = vec![0u8; 9 << 20];
    let writes_before = s.stats().io.writes;
    let err = s.put(b"k", &big).unwrap_err();
    match &err {
        Error::ValueTooLarge { len, max } => assert!(*len == 9 << 20 && *max < 1 << 20),
        e => panic!("unexpected {e}"),
    }
    assert!(err.to_string().contains("values up to"));
    assert_eq!(s.stats().io.writes, writes_before, "nothing written for a rejected value");
}

/// Values too large for the index entry's size field take a second read.
#[test]
fn sixteen_mib_value_round_trips_across_reopen() {
    if skip_zoned("32 MiB segments (for a 16 MiB value): they start at 1 MiB, which 32 MiB zones do not divide") {
        return;
    }
    // Two 32 MiB segments: no room for a GC reserve, so GC is off.
    let (dev, s) = mem_store_gc(72 << 20, 32 << 20, 512, false);
    let value: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8).collect();
    s.put(b"big", &value).unwrap();
    s.put(b"mid", &value[..1_200_000]).unwrap(); // over 2047 grains
                                                 // Around the entry's largest size, 511 grains of 512 bytes (the
                                                 // record adds a 48-byte header and the key).
    let edge = |g: usize| g * 512 - 48 - 4;
    for (k, g) in [(b"e510", 510), (b"e511", 511), (b"e512", 512)] {
        s.put(k, &value[..edge(g)]).unwrap();
        let e = s.core.keys.index.lookup(s.core.keys.hash(k)).as_slice()[0];
        assert_eq!(e.kv_size(), (g as u32).min(granary_format::limits::KV_SIZE_GRAINS_MAX), "{g} grains");
    }
    let e = s.core.keys.index.lookup(s.core.keys.hash(b"big")).as_slice()[0];
    assert_eq!(e.kv_size(), granary_format::limits::KV_SIZE_GRAINS_MAX);
    assert_eq!(s.get(b"big").unwrap().as_deref(), Some(&value[..]));
    let s = reopen(&dev, s);
    assert_eq!(s.get(b"big").unwrap().as_deref(), Some(&value[..]));
    assert_eq!(s.get(b"mid").unwrap().as_deref(), Some(&value[..1_200_000]));
    for (k, g) in [(b"e510", 510), (b"e511", 511), (b"e512", 512)] {
        assert_eq!(s.get(k).unwrap().as_deref(), Some(&value[..edge(g)]), "{g} grains");
    }
    assert!(s.verify().unwrap().is_clean());
}

#[test]
fn full_device_returns_no_space_and_keeps_data() {
    let (dev, s) = mem_store(8 << 20, 1 << 20, 512);
    let mut stored = 0;
    let err = loop {
        match s.put(format!("key-{stored}").as_bytes(), &[1u8; 10_000]) {
            Ok(()) => stored += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::NoSpace { .. }), "{err}");
    assert!(stored > 400, "{stored}");
    assert_eq!(s.get(b"key-0").unwrap().as_deref(), Some(&[1u8; 10_000][..]));
    let s = reopen(&dev, s);
    for i in 0..stored {
        assert!(s.get(format!("key-{i}").as_bytes()).unwrap().is_some(), "key-{i}");
    }
    assert!(matches!(s.put(b"more", &[1u8; 10_000]), Err(Error::NoSpace { .. })));
}

/// A store full of live data can still be emptied through every delete:
/// a read-modify-write that deletes (memcache's CAS delete, an export's
/// trim) and a batch of deletes only may take the reserve a DELETE may.
#[test]
fn a_full_store_takes_deletes_of_every_kind() {
    // Enough segments for a reserve of two (a DELETE may take one of them).
    let (_dev, s) = mem_store(16 << 20, 1 << 20, 512);
    let mut stored = 0;
    for len in [10_000, 1_000, 1] {
        while s.put(format!("key-{stored}").as_bytes(), &vec![1u8; len]).is_ok() {
            stored += 1;
        }
    }
    assert!(matches!(s.put(b"more", b"x"), Err(Error::NoSpace { .. })));
    let ns = s.namespace(DEFAULT_NAMESPACE).unwrap();
    let mut b = s.batch();
    b.delete(&ns, b"key-2").delete(&ns, b"key-3");
    b.commit().unwrap();
    let (gone, _) = s.update(b"key-1", |it| (Change::Delete, it.is_some())).unwrap();
    assert!(gone, "key-1 was there");
    assert!(s.delete(b"key-0").unwrap());
    for i in 0..4 {
        assert_eq!(s.get(format!("key-{i}").as_bytes()).unwrap(), None, "key-{i}");
    }
    assert!(s.get(format!("key-{}", stored - 1).as_bytes()).unwrap().is_some());
}

/// A full store can still be emptied by a namespace's drop or truncate
/// and by `flush_all`: each writes one record, which may take the room
/// kept for deletes.
#[test]
fn a_full_store_can_be_emptied_by_drop_truncate_and_flush_all() {
    for op in ["drop", "truncate", "flush_all"] {
        let (_dev, s) = mem_store(16 << 20, 1 << 20, 512);
        let n = s.create_namespace("n", NamespaceOptions::default()).unwrap();
        let mut stored = 0;
        for len in [10_000, 1_000, 1] {
            while n.put(format!("key-{stored}").as_bytes(), &vec![1u8; len]).is_ok() {
                stored += 1;
            }
        }
        assert!(matches!(s.put(b"more", b"x"), Err(Error::NoSpace { .. })), "{op}: the store is full");
        let r = match op {
            "drop" => s.drop_namespace("n"),
            "truncate" => s.truncate("n"),
            _ => n.flush_all().map(|_| ()),
        };
        r.unwrap_or_else(|e| panic!("{op} of a full store: {e}"));
        assert_eq!(s.namespace("n").map(|n| n.get(b"key-0").unwrap()).ok().flatten(), None, "{op}");
    }
    // The default namespace's floor, likewise.
    let (_dev, s) = mem_store(16 << 20, 1 << 20, 512);
    let mut stored = 0;
    for len in [10_000, 1_000, 1] {
        while s.put(format!("key-{stored}").as_bytes(), &vec![1u8; len]).is_ok() {
            stored += 1;
        }
    }
    s.flush_all().unwrap();
    assert_eq!(s.get(b"key-0").unwrap(), None);
}

/// A truncate empties a namespace but keeps counting its operations since
/// the store was opened (memcache's `evictions` and the namespace's GETs
/// never go backwards).
#[test]
fn a_truncate_keeps_a_namespace_s_operation_counts() {
    let (_dev, s) = mem_store(16 << 20, 1 << 20, 512);
    let n = s.create_namespace("n", NamespaceOptions::default()).unwrap();
    n.put(b"k", b"v").unwrap();
    assert!(n.get(b"k").unwrap().is_some());
    assert!(n.delete(b"k").unwrap());
    n.put(b"k", b"v").unwrap();
    n.truncate().unwrap();
    let st = n.stats().unwrap();
    assert_eq!((st.keys, st.gets, st.hits, st.sets, st.deletes), (0, 1, 1, 2, 1));
    assert!(n.get(b"k").unwrap().is_none());
    assert_eq!((n.stats().unwrap().gets, n.stats().unwrap().hits), (2, 1));
}

/// A record buffer made for a namespace before a truncate (a memcache
/// `flush_all` while a large SET's value was arriving) is written into
/// the namespace as it is now; one of another store is refused (its
/// grains sized it: a store of smaller grains would overrun its
/// allocation with it), as is one of another namespace.
#[test]
fn a_record_buffer_follows_its_namespace_and_stays_in_its_store() {
    let (_dev, s) = mem_store(16 << 20, 1 << 20, 512);
    let n = s.create_namespace("n", NamespaceOptions::default()).unwrap();
    let v = vec![7u8; 20_000];
    let mut pb = n.new_put_buf(b"k", v.len()).unwrap();
    pb.fill_from(&v);
    n.truncate().unwrap();
    n.put_buf(pb, ItemMeta::default(), Cond::Always).unwrap();
    assert_eq!(n.get(b"k").unwrap().as_deref(), Some(&v[..]));
    assert_eq!(n.stats().unwrap().keys, 1);
    let m = s.create_namespace("m", NamespaceOptions::default()).unwrap();
    let pb = n.new_put_buf(b"k", 3).unwrap();
    assert!(matches!(m.put_buf(pb, ItemMeta::default(), Cond::Always), Err(Error::NoSuchNamespace { .. })));
    let (_other_dev, other) = mem_store(16 << 20, 1 << 20, 4096);
    let pb = other.new_put_buf(b"k", 20_000).unwrap();
    let err = s.put_buf(pb, ItemMeta::default(), Cond::Always).unwrap_err();
    assert!(matches!(err, Error::InvalidOptions(ref why) if why.contains("another store")), "{err}");
    assert_eq!(s.get(b"k").unwrap(), None);
}

#[test]
fn failed_write_poisons_until_reopen() {
    let (dev, s) = mem_store(16 << 20, 1 << 20, 512);
    s.put(b"a", b"1").unwrap();
    assert_eq!(s.stats().read_only, None);
    dev.fail_writes(true);
    assert!(matches!(s.put(b"b", b"2"), Err(Error::Io { .. })));
    let cause = s.stats().read_only.expect("read-only after a failed write");
    assert!(cause.contains("write failed"), "{cause}");
    assert!(s.stats().registry().pairs().contains(&("read_only".into(), "1".into())));
    dev.fail_writes(false);
    let err = s.put(b"c", b"3").unwrap_err();
    assert!(matches!(err, Error::Poisoned { .. }), "{err}");
    assert!(matches!(s.delete(b"a"), Err(Error::Poisoned { .. })));
    assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    let s = reopen(&dev, s);
    assert_eq!(s.stats().read_only, None);
    s.put(b"c", b"3").unwrap();
    assert_eq!(s.get(b"b").unwrap(), None);
}

#[test]
fn grain_4096_round_trip() {
    let (dev, s) = mem_store(16 << 20, 1 << 20, 4096);
    for i in 0..300u32 {
        s.put(&i.to_le_bytes(), &vec![i as u8; (i * 37 % 9000) as usize]).unwrap();
    }
    let s = reopen(&dev, s);
    for i in 0..300u32 {
        assert_eq!(s.get(&i.to_le_bytes()).unwrap(), Some(vec![i as u8; (i * 37 % 9000) as usize]));
    }
    assert_eq!(s.superblock().grain_bytes, 4096);
}

#[test]
fn open_rejects_a_device_without_a_store_and_survives_one_bad_superblock() {
    let dev = test_device(8 << 20);
    let err = Store::open(dev.clone(), &OpenOptions::default()).err().unwrap();
    assert!(matches!(err, Error::NotAStore(_)), "{err}");
    assert!(err.to_string().contains("not a usable Granary store"));
    // A zeroed device (never formatted) says so, and what to do; a new
    // file (the io_uring test backend's) still carries the mark of its
    // creation, which says that instead (`open_names_an_interrupted_creation`).
    let expected = match dev.backend() {
        granary_io::TestBackend::Uring => "creation was interrupted",
        _ => "the superblock is zeros",
    };
    assert!(err.to_string().contains(expected), "{err}");

    let (dev, s) = mem_store(8 << 20, 1 << 20, 512);
    s.put(b"k", b"v").unwrap();
    drop(s);
    // Copy A's uuid damaged; an inspection (an open for writing would
    // mend copy A).
    dev.with_bytes_mut(|b| b[20] ^= 0xff);
    let s = Store::open(dev.clone(), &inspection()).unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    drop(s);
    dev.with_bytes_mut(|b| b[4096 + 20] ^= 0xff);
    let err = Store::open(dev.clone(), &OpenOptions::default()).err().unwrap();
    assert!(matches!(err, Error::NotAStore(_)), "{err}");
    assert!(!err.to_string().contains("zeros"), "a damaged store is not called zeros: {err}");
}

/// Options of an inspection, as `granary verify`, `stat` and `get` open a
/// store: nothing written.
fn inspection() -> OpenOptions {
    OpenOptions {
        clear_torn: false,
        gc: false,
        checkpoint_interval: None,
        checkpoint_on_close: false,
        ..OpenOptions::default()
    }
}

/// An open for writing makes both superblock copies the one it reads: a
/// rotten or zeroed copy A, a copy B left behind by a crash between the
/// copies' writes. An inspection writes neither; a copy that may be a
/// newer build's (a version this build does not know, checksummed or not)
/// is left alone.
#[test]
fn an_open_for_writing_mends_the_superblock_copies() {
    let (dev, s) = mem_store(8 << 20, 1 << 20, 512);
    s.put(b"k", b"v").unwrap();
    drop(s);
    let copies = || dev.with_bytes_mut(|b| (b[..4096].to_vec(), b[4096..8192].to_vec()));
    let good = copies().0;
    // Opens, reads the key back, and returns what verify lists.
    let open_checks = |opts: &OpenOptions| {
        let s = Store::open(dev.clone(), opts).unwrap();
        assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
        let r = s.verify().unwrap();
        assert!(r.is_clean(), "{:?}", r.errors);
        r.superblock_copies_to_mend
    };
    type Damage = (&'static str, fn(&mut [u8]));
    let damages: [Damage; 3] = [
        ("copy A rotten", |b| b[20] ^= 0xff),
        ("copy A zeroed", |b| b[..4096].fill(0)),
        ("copy B left behind", |b| {
            let mut sb = granary_format::Superblock::decode(&b[..4096]).unwrap();
            sb.created_unix_ms += 1000;
            sb.encode(&mut b[4096..8192]);
        }),
    ];
    for (what, damage) in damages {
        dev.with_bytes_mut(damage);
        let damaged = copies();
        assert_ne!(damaged, (good.clone(), good.clone()), "{what}");
        let listed = open_checks(&inspection());
        assert_eq!(copies(), damaged, "{what}: an inspection wrote a superblock copy");
        assert_eq!(listed.len(), 1, "{what}: verify lists the copy: {listed:?}");
        assert!(open_checks(&OpenOptions::default()).is_empty(), "{what}: verify after the mend");
        assert_eq!(copies(), (good.clone(), good.clone()), "{what}: not mended");
    }
    // Copy A of a version this build does not know: checksummed (a newer
    // build's), or not (its checksum may be a newer format's).
    for checksummed in [true, false] {
        dev.with_bytes_mut(|b| {
            b[8..12].copy_from_slice(&99u32.to_le_bytes());
            let crc = granary_format::checksum::crc32c(&b[..124]) ^ u32::from(!checksummed);
            b[124..128].copy_from_slice(&crc.to_le_bytes());
        });
        let newer = copies().0;
        assert!(
            open_checks(&OpenOptions::default()).is_empty(),
            "checksummed {checksummed}: verify lists a newer copy"
        );
        assert_eq!(copies(), (newer, good.clone()), "checksummed {checksummed}: a newer build's copy was overwritten");
    }
}

/// The mend is best effort: a rewrite that fails leaves the open going on
/// with the copy it read (and the next open mends); and a running store's
/// verify compares the copies with the superblock as the device holds it
/// now, a feature turned on since the open included.
#[test]
fn a_failed_superblock_mend_is_not_fatal_and_verify_follows_features() {
    let (dev, s) = fault_store(&OpenOptions::default());
    s.put(b"k", b"v").unwrap();
    drop(s);
    let good = dev.with_bytes_mut(|b| b[..128].to_vec());
    dev.with_bytes_mut(|b| b[20] ^= 0xff);
    dev.fail_nth(granary_io::OpKind::Write, 0, false);
    let s = Store::open(dev.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    drop(s);
    assert_ne!(dev.with_bytes_mut(|b| b[..128].to_vec()), good, "the failed write was the mend's");
    let s = Store::open(dev.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(dev.with_bytes_mut(|b| b[..128].to_vec()), good, "the next open mends");
    // A feature turned on by this store (namespaces: a superblock rewrite),
    // then copy B damaged: verify lists it.
    s.create_namespace("n", NamespaceOptions::default()).unwrap();
    assert!(s.verify().unwrap().superblock_copies_to_mend.is_empty());
    dev.with_bytes_mut(|b| b[4096 + 20] ^= 0xff);
    let listed = s.verify().unwrap().superblock_copies_to_mend;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0].contains("offset 4096"), "{listed:?}");
}

/// A file whose creation was killed before the store was written (it still
/// starts with the mark `FileDevice::create` puts first) says so, and that
/// the server and `create --if-absent` start it over themselves.
#[test]
fn open_names_an_interrupted_creation() {
    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let path = dir.path().join("new.db");
    let dev = granary_io::FileDevice::create(&path, 8 << 20, granary_io::OpenMode::Direct).unwrap();
    let err = Store::open(Arc::new(dev), &OpenOptions::default()).err().unwrap();
    assert!(matches!(err, Error::NotAStore(_)), "{err}");
    assert!(err.to_string().contains("creation was interrupted"), "{err}");
    assert!(!err.to_string().contains("zeros"), "{err}");
}

/// Concurrent writers of overlapping keys: the state after reopen equals
/// the state before (the highest sequence number of each key wins in both).
#[test]
fn concurrent_updates_agree_with_recovery() {
    let (dev, s) = mem_store(64 << 20, 1 << 20, 512);
    let s = Arc::new(s);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut rng = granary_io::SimRng::new(t + 1);
                for i in 0..1500u64 {
                    let x = rng.next_u64();
                    let key = format!("k{}", x % 64);
                    if x.is_multiple_of(5) {
                        s.delete(key.as_bytes()).unwrap();
                    } else {
                        s.put(key.as_bytes(), format!("{t}-{i}").as_bytes()).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = Arc::into_inner(s).unwrap();
    let before: Vec<_> = (0..64).map(|k| s.get(format!("k{k}").as_bytes()).unwrap()).collect();
    let st = s.stats();
    assert!(s.verify().unwrap().is_clean());
    let s = reopen(&dev, s);
    let after: Vec<_> = (0..64).map(|k| s.get(format!("k{k}").as_bytes()).unwrap()).collect();
    assert_eq!(before, after);
    assert_eq!((s.stats().keys, s.stats().tombstones), (st.keys, st.tombstones));
    assert_eq!(s.stats().live_bytes, st.live_bytes);
    assert!(s.verify().unwrap().is_clean());
}

#[test]
fn stats_count_user_and_device_bytes() {
    let (_dev, s) = mem_store(16 << 20, 1 << 20, 512);
    let before = s.stats().io.written_bytes;
    s.put(b"key", &[0u8; 100]).unwrap();
    let st = s.stats();
    assert_eq!(st.user_bytes_written, 103);
    // One segment header grain plus one record grain.
    assert_eq!(st.io.written_bytes - before, 1024);
    assert_eq!(st.live_bytes, 512);
    assert!(st.write_amplification() > 1.0);
    assert_eq!(s.core.log.dev.counters().snapshot().written_bytes, st.io.written_bytes);
}

fn store_without_gc(segment: u64) -> (Arc<TestDevice>, Store) {
    let dev = test_device(16 << 20);
    dev.shape_zones(segment);
    let opts = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(segment), index_table_homes: Some(64) };
    let s = Store::create(dev.clone(), &opts, &OpenOptions { gc: false, ..OpenOptions::default() }).unwrap();
    (dev, s)
}

fn segment_of_key(s: &Store, key: &[u8]) -> u32 {
    let e = s.core.keys.index.lookup(s.core.keys.hash(key)).as_slice()[0];
    s.core.log.sb.segment_of(e.pba())
}

/// A version older than the deleted one can sit in a third segment: v1 in
/// A, v2 in B, tombstone in C. Reclaiming B (where the deleted version was)
/// must not let GC drop the tombstone while A still holds v1, or v1 comes
/// back after a restart. The tombstone dies only once A is reclaimed too.
#[test]
fn regression_tombstone_outlives_every_older_version() {
    let (dev, s) = store_without_gc(64 << 10);
    s.put(b"k", b"v1").unwrap();
    let a = segment_of_key(&s, b"k");
    roll_segment(&s);
    s.put(b"k", b"v2").unwrap();
    let b = segment_of_key(&s, b"k");
    roll_segment(&s);
    assert!(s.delete(b"k").unwrap());
    let c = segment_of_key(&s, b"k");
    roll_segment(&s);
    assert!(a != b && b != c);
    crate::gc::reclaim(s.core.collector(), b, false).unwrap();
    crate::gc::reclaim(s.core.collector(), c, false).unwrap();
    assert_eq!(s.stats().gc.tombstones_dropped, 0, "v1 is still in segment {a}");
    assert_eq!(s.stats().tombstones, 1);
    let s = reopen(&dev, s);
    assert_eq!(s.get(b"k").unwrap(), None, "v1 resurrected");
    // Reclaim A and the segment the tombstone was moved to: now it may go.
    crate::gc::reclaim(s.core.collector(), a, false).unwrap();
    let t = segment_of_key(&s, b"k");
    roll_segment(&s);
    crate::gc::reclaim(s.core.collector(), t, false).unwrap();
    assert_eq!(s.stats().gc.tombstones_dropped, 1);
    assert_eq!(s.stats().tombstones, 0);
    let s = reopen(&dev, s);
    assert_eq!(s.get(b"k").unwrap(), None);
    assert!(s.verify().unwrap().is_clean());
}

/// GC copies a damaged record with its damage: reading it still reports
/// corruption instead of returning bytes that were never written.
#[test]
fn gc_keeps_corruption_reported() {
    let (dev, s) = store_without_gc(64 << 10);
    s.put(b"victim", b"precious value").unwrap();
    let seg = segment_of_key(&s, b"victim");
    roll_segment(&s);
    flip_byte_of(&dev, &s, b"victim", 48 + 6 + 3);
    crate::gc::reclaim(s.core.collector(), seg, false).unwrap();
    assert_ne!(segment_of_key(&s, b"victim"), seg);
    assert!(s.get(b"victim").unwrap_err().is_corruption());
    let s = reopen(&dev, s);
    assert!(s.get(b"victim").unwrap_err().is_corruption());
    assert!(!s.verify().unwrap().is_clean());
}

/// A reader whose entry moved (GC relocated the record and the segment was
/// reused) retries instead of reporting a miss or corruption.
#[test]
fn reads_survive_relocation_and_segment_reuse() {
    let (_dev, s) = store_without_gc(64 << 10);
    s.put(b"k", b"value").unwrap();
    let seg = segment_of_key(&s, b"k");
    let stale = s.core.keys.index.lookup(s.core.keys.hash(b"k")).as_slice()[0];
    roll_segment(&s);
    crate::gc::reclaim(s.core.collector(), seg, false).unwrap();
    // Reuse every free segment, the reclaimed one included.
    let mut i = 0;
    while s.core.space.counts().0 > 0 {
        s.put(format!("reuse-{i}").as_bytes(), &[9u8; 4000]).unwrap();
        i += 1;
    }
    // The stale entry now points into another record or a different stamp.
    assert!(s
        .core
        .parts()
        .read_record(stale, true)
        .map(|(h, b)| granary_format::record::key_of(&h, &b) != b"k")
        .unwrap_or(true));
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"value"[..]));
}

/// A writer between writing its record and indexing it holds an allocation
/// in its segment; GC must not pick that segment (it would free it, and the
/// writer would then index a record in a free segment: a lost write).
#[test]
fn regression_gc_never_picks_a_segment_with_a_write_in_flight() {
    let (_dev, s) = store_without_gc(64 << 10);
    let seq = s.core.log.next_seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let loc = s.core.write_record(crate::space::Purpose::Put, RecordHeader::value(1, 1, seq, 0), b"k", b"v").unwrap();
    // Overwrite the fillers, past GC's age limit: every closed segment but
    // the newest holds only garbage, the in-flight one being the oldest.
    let age = crate::gc::age(s.core.log.sb.segment_count);
    for _ in 0..age + 4 {
        roll_segment(&s);
    }
    let victim = s.core.space.pick_victim(age, false).map(|v| v.0);
    assert!(victim.is_some());
    assert_ne!(victim, Some(loc.seg), "picked the segment of an unfinished write");
    s.core.space.done(loc.seg);
    assert_eq!(
        s.core.space.pick_victim(age, false),
        Some((loc.seg, false)),
        "oldest empty segment once the write is done"
    );
}

#[test]
fn zero_copy_puts_and_gets_round_trip_with_and_without_coalescing() {
    for coalesce_writes in [true, false] {
        let dev = test_device(32 << 20);
        let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: Some(64) };
        let o = OpenOptions { coalesce_writes, ..OpenOptions::default() };
        let s = Store::create(dev.clone(), &c, &o).unwrap();
        // Small (joins groups), empty, and larger than a group may copy.
        for (i, len) in [0usize, 1, 100, 4000, 16 * 1024, 100_000].into_iter().enumerate() {
            let key = format!("zc-{i}");
            let value: Vec<u8> = (0..len).map(|j| (j * 7 + i) as u8).collect();
            let mut pb = s.new_put_buf(key.as_bytes(), len).unwrap();
            assert_eq!((pb.key(), pb.value_len(), pb.is_full()), (key.as_bytes(), len, len == 0));
            // Half by receive-style fills, half in place.
            if i % 2 == 0 {
                let cut = len / 3;
                pb.fill_from(&value[..cut]);
                pb.fill_from(&value[cut..]);
                assert!(pb.is_full());
            } else {
                pb.value_mut().copy_from_slice(&value);
            }
            let meta = ItemMeta::new(i as u32, 0);
            let (out, cas) = s.put_buf(pb, meta, Cond::Always).unwrap();
            assert_eq!(out, PutOutcome::Stored);
            let it = s.get_item(key.as_bytes()).unwrap().unwrap();
            assert_eq!((&it.value, it.meta, it.cas), (&value, meta, cas));
            let vb = s.get_buf(key.as_bytes()).unwrap().unwrap();
            assert_eq!((vb.value(), vb.len(), vb.meta, vb.cas), (&value[..], len, meta, cas));
        }
        // Conditions hold as for put_item.
        let pb = s.new_put_buf(b"zc-1", 3).unwrap();
        assert_eq!(s.put_buf(pb, ItemMeta::default(), Cond::Absent).unwrap().0, PutOutcome::Exists);
        let pb = s.new_put_buf(b"nope", 3).unwrap();
        assert_eq!(s.put_buf(pb, ItemMeta::default(), Cond::Present).unwrap().0, PutOutcome::NotFound);
        assert!(s.get_buf(b"nope").unwrap().is_none());
        // A large record is written from its own buffer: one device write.
        let writes = s.stats().io.writes;
        let mut pb = s.new_put_buf(b"big", 64 << 10).unwrap();
        pb.value_mut().fill(9);
        s.put_buf(pb, ItemMeta::default(), Cond::Always).unwrap();
        assert_eq!(s.stats().io.writes, writes + 1);
        // Limits: bad keys and values larger than the store holds.
        assert!(matches!(s.new_put_buf(b"", 1), Err(Error::KeyLength { .. })));
        assert!(matches!(s.new_put_buf(b"\0granary.x", 1), Err(Error::ReservedKey)));
        assert!(matches!(s.new_put_buf(b"k", 2 << 20), Err(Error::ValueTooLarge { .. })));
        // Everything survives a reopen (a log scan or checkpoint).
        let s = reopen(&dev, s);
        assert_eq!(s.get(b"zc-5").unwrap().unwrap().len(), 100_000);
        assert_eq!(s.get(b"big").unwrap().unwrap(), vec![9u8; 64 << 10]);
        assert!(s.verify().unwrap().is_clean());
    }
}

#[test]
fn zero_copy_buffers_expose_their_value_to_the_ring() {
    use granary_rt::IoBuf;
    let (_dev, s) = mem_store(16 << 20, 1 << 20, 512);
    s.put(b"k", b"hello").unwrap();
    let mut vb = s.get_buf(b"k").unwrap().unwrap();
    let (p, n) = (vb.stable_ptr(), vb.buf_len());
    // SAFETY: the IoBuf contract: p is valid for n bytes while vb lives.
    assert_eq!(unsafe { std::slice::from_raw_parts(p, n) }, b"hello");
    // A PutBuf's view is the part of the value not filled yet.
    let mut pb = s.new_put_buf(b"k2", 10).unwrap();
    pb.fill_from(b"abc");
    assert_eq!(pb.buf_len(), 7);
    let p = pb.stable_ptr();
    // SAFETY: p is valid for buf_len() bytes, which we own exclusively.
    unsafe { std::ptr::copy_nonoverlapping(b"defghij".as_ptr(), p, 7) };
    pb.advance(7);
    assert!(pb.is_full());
    s.put_buf(pb, ItemMeta::default(), Cond::Always).unwrap();
    assert_eq!(s.get(b"k2").unwrap().unwrap(), b"abcdefghij");
}

#[test]
fn verify_reports_progress_up_to_every_step() {
    let (_dev, s) = mem_store(16 << 20, 1 << 20, 512);
    for i in 0..3000u32 {
        s.put(format!("k{i}").as_bytes(), &[1u8; 700]).unwrap();
    }
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let rec = seen.clone();
    let hook = ProgressHook(Arc::new(move |done, total| rec.lock().unwrap().push((done, total))));
    let r = s.verify_with_progress(&hook).unwrap();
    assert!(r.is_clean());
    let seen = seen.lock().unwrap();
    let total = r.entries_checked + r.segments_scanned;
    assert!(seen.len() > 3, "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "progress went backwards: {seen:?}");
    assert!(seen.iter().all(|&(_, t)| t == total));
    assert_eq!(seen.last(), Some(&(total, total)));
}

/// A progress hook may read the store's figures (which read the
/// checkpoint in use) while verify runs: verify holds the checkpoints only
/// while it reads the segment headers and the newest checkpoint. Held
/// throughout, such a hook deadlocked (verify runs on a thread of its own
/// here, so a deadlock fails the test instead of hanging it).
#[test]
fn a_verify_progress_hook_may_read_the_stats() {
    let (_dev, s) = mem_store(16 << 20, 1 << 20, 512);
    for i in 0..3000u32 {
        s.put(format!("k{i}").as_bytes(), &[1u8; 700]).unwrap();
    }
    let s = Arc::new(s);
    let (tx, rx) = std::sync::mpsc::channel();
    let verifier = s.clone();
    std::thread::spawn(move || {
        let reader = verifier.clone();
        let hook = ProgressHook(Arc::new(move |_, _| drop(reader.stats())));
        let r = verifier.verify_with_progress(&hook).map(|r| r.is_clean()).map_err(|e| e.to_string());
        tx.send(r).unwrap();
    });
    let r = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("verify returned");
    assert_eq!(r, Ok(true));
}

/// The suite's device is the backend the environment asks for: on the
/// io_uring backend the synchronous API's IO really goes through a ring,
/// on the zoned backend the store runs in zoned mode.
#[test]
fn the_suite_runs_on_the_backend_the_environment_names() {
    let (dev, s) = mem_store(8 << 20, 1 << 20, 512);
    let before = granary_rt::sync_ring::ops();
    s.put(b"k", b"v").unwrap();
    let s = reopen(&dev, s);
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    let ring_ops = granary_rt::sync_ring::ops() - before;
    match granary_io::TestBackend::from_env() {
        granary_io::TestBackend::Sync => assert!(dev.mem().is_some()),
        granary_io::TestBackend::Uring => {
            assert!(dev.mem().is_none() && dev.describe().contains("io_uring"), "{}", dev.describe());
            assert!(ring_ops > 0, "no IO went through a private ring");
        }
        granary_io::TestBackend::Zoned => {
            let zoned = dev.zoned().expect("the emulated zoned device");
            assert!(s.core.space.zoned(), "the store opened in zoned mode");
            assert!(zoned.report().iter().any(|z| z.wp > 0), "the log was written to a sequential zone");
            assert_eq!(dev.zone_violations(), 0);
        }
    }
}

/// A full log scan tells colliding keys apart (by the hash bits it keeps,
/// or by reading their keys) and keeps each key's newest version, across
/// segments, overwrites in one segment, a delete, and 1, 2 or 4 scanner
/// threads; its counts and live bytes agree with the index (verify).
#[test]
fn log_scan_sorts_out_colliding_keys_and_overwrites() {
    let (dev, s) = mem_store_gc(32 << 20, 64 << 10, 512, false);
    let keys = colliding_keys(s.core.keys.hasher, 6);
    for round in 0..3 {
        for (i, k) in keys.iter().enumerate() {
            s.put(k, format!("r{round}-{i}").as_bytes()).unwrap();
            s.put(k, format!("r{round}-{i}b").as_bytes()).unwrap();
        }
        roll_segment(&s);
    }
    assert!(s.delete(&keys[1]).unwrap());
    let fillers = s.stats().keys - 5;
    drop(s);
    for threads in [1, 2, 4] {
        let o = OpenOptions { use_checkpoint: false, recovery_threads: threads, gc: false, ..OpenOptions::default() };
        let s = Store::open(dev.clone(), &o).unwrap();
        assert_eq!(s.stats().recovery.checkpoint_id, 0, "a full scan");
        for (i, k) in keys.iter().enumerate() {
            let want = (i != 1).then(|| format!("r2-{i}b").into_bytes());
            assert_eq!(s.get(k).unwrap(), want, "key {i}, {threads} threads");
        }
        assert_eq!((s.stats().keys, s.stats().tombstones), (fillers + 5, 1));
        let r = s.verify().unwrap();
        assert!(r.is_clean(), "{threads} threads: {:?}", r.errors);
    }
}

/// The log scan's read-ahead (segments of several 1 MiB windows): records
/// of every size, some across window boundaries, large values skipped in
/// old segments and read whole in the tail, all come back from a full
/// scan with 1 and 2 scanners, and most windows were read ahead.
#[test]
fn log_scan_reads_ahead_across_windows() {
    if skip_zoned("4 MiB segments (the scan's windows): they start at 1 MiB, which 4 MiB zones do not divide") {
        return;
    }
    let dev = test_device(96 << 20);
    let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(4 << 20), index_table_homes: Some(4096) };
    let s = Store::create(dev.clone(), &c, &OpenOptions { gc: false, ..OpenOptions::default() }).unwrap();
    let value = |i: u64| -> Vec<u8> {
        let len = match i % 50 {
            0 => 300_000,
            1..=5 => 5_000 + (i as usize * 37) % 3_000,
            _ => (i as usize * 13) % 1_500,
        };
        (0..len).map(|j| (i as usize + j) as u8).collect()
    };
    let n = 12_000u64;
    for i in 0..n {
        s.put(format!("k{i}").as_bytes(), &value(i)).unwrap();
    }
    drop(s);
    for threads in [1, 2] {
        let o = OpenOptions { use_checkpoint: false, recovery_threads: threads, gc: false, ..OpenOptions::default() };
        let s = Store::open(dev.clone(), &o).unwrap();
        let r = s.stats().recovery;
        assert!(r.segments_scanned >= 8, "{r:?}");
        assert!(r.windows_read_ahead >= r.segments_scanned * 2, "{r:?}");
        for i in 0..n {
            assert_eq!(s.get(format!("k{i}").as_bytes()).unwrap(), Some(value(i)), "key {i}, {threads} threads");
        }
        assert!(s.verify().unwrap().is_clean());
    }
}

/// A memory device whose async operations each yield once before they take
/// effect, counting how many reads and writes are in flight at once.
struct Overlapping {
    mem: granary_io::MemDevice,
    reads: std::sync::atomic::AtomicUsize,
    writes: std::sync::atomic::AtomicUsize,
    /// Times a read and a write were in flight together.
    overlaps: std::sync::atomic::AtomicUsize,
}

impl Overlapping {
    fn op<'a>(
        &'a self,
        mine: &'a std::sync::atomic::AtomicUsize,
        other: &'a std::sync::atomic::AtomicUsize,
        f: impl FnOnce() -> granary_io::IoResult + Send + 'a,
    ) -> granary_io::IoFuture<'a> {
        use std::sync::atomic::Ordering::SeqCst;
        granary_io::IoFuture::Pending(Box::pin(async move {
            mine.fetch_add(1, SeqCst);
            if other.load(SeqCst) > 0 {
                self.overlaps.fetch_add(1, SeqCst);
            }
            let mut yielded = false;
            std::future::poll_fn(|cx| {
                if std::mem::replace(&mut yielded, true) {
                    std::task::Poll::Ready(())
                } else {
                    cx.waker().wake_by_ref();
                    std::task::Poll::Pending
                }
            })
            .await;
            let r = f();
            mine.fetch_sub(1, SeqCst);
            r
        }))
    }
}

impl Device for Overlapping {
    fn read_at(&self, buf: granary_io::AlignedBuf, offset: u64) -> granary_io::IoResult {
        self.mem.read_at(buf, offset)
    }
    fn write_at(&self, buf: granary_io::AlignedBuf, offset: u64) -> granary_io::IoResult {
        self.mem.write_at(buf, offset)
    }
    fn read_at_async(&self, buf: granary_io::AlignedBuf, offset: u64) -> granary_io::IoFuture<'_> {
        self.op(&self.reads, &self.writes, move || self.mem.read_at(buf, offset))
    }
    fn write_at_async(&self, buf: granary_io::AlignedBuf, offset: u64) -> granary_io::IoFuture<'_> {
        self.op(&self.writes, &self.reads, move || self.mem.write_at(buf, offset))
    }
    fn flush(&self) -> std::io::Result<()> {
        self.mem.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.mem.size_bytes()
    }
    fn block_bytes(&self) -> u32 {
        self.mem.block_bytes()
    }
    fn counters(&self) -> &granary_io::IoCounters {
        self.mem.counters()
    }
    fn describe(&self) -> String {
        format!("overlap-counting {}", self.mem.describe())
    }
}

/// Without blind overwrites (or past their DRAM cap), an unconditional PUT
/// of an indexed key reads the key's current record while it writes the
/// new one; a conditional PUT reads first (its outcome
/// depends on what it reads). Keys sharing home slot and tag come out right
/// either way, across a restart.
#[test]
fn an_overwrite_reads_the_old_version_while_it_writes_the_new() {
    use std::sync::atomic::Ordering::SeqCst;
    let dev = Arc::new(Overlapping {
        mem: granary_io::MemDevice::new(16 << 20),
        reads: Default::default(),
        writes: Default::default(),
        overlaps: Default::default(),
    });
    let opts = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: Some(64) };
    let no_blind = no_blind_opts();
    let s = Store::create(dev.clone(), &opts, &no_blind).unwrap();
    let keys = colliding_keys(s.core.keys.hasher, 3);
    let put = |k: &[u8], v: &[u8]| granary_rt::block_on(s.put_async(k, v)).unwrap();
    // New keys: the first has no candidate (nothing to read); the others
    // have one that is not them.
    put(&keys[0], b"a0");
    assert_eq!(dev.overlaps.load(SeqCst), 0, "a PUT with no candidate read something");
    put(&keys[1], b"b0");
    put(&keys[2], b"c0");
    let before = dev.overlaps.load(SeqCst);
    assert!(before >= 2, "the candidates of new colliding keys were not read during their writes");
    // Overwrites: each reads while it writes.
    for round in 1..=3 {
        for (i, k) in keys.iter().enumerate() {
            put(k, format!("{i}-{round}").as_bytes());
        }
    }
    assert!(dev.overlaps.load(SeqCst) >= before + 9, "an overwrite read and wrote one after the other");
    // A conditional PUT reads, then writes.
    let at = dev.overlaps.load(SeqCst);
    let r = granary_rt::block_on(s.put_with_async(&keys[1], b"b-replaced", PutMode::ReplaceOnly)).unwrap();
    assert_eq!(r, PutOutcome::Stored);
    assert_eq!(dev.overlaps.load(SeqCst), at, "a conditional PUT wrote before reading");
    let check = |s: &Store| {
        assert_eq!(s.get(&keys[0]).unwrap().as_deref(), Some(&b"0-3"[..]));
        assert_eq!(s.get(&keys[1]).unwrap().as_deref(), Some(&b"b-replaced"[..]));
        assert_eq!(s.get(&keys[2]).unwrap().as_deref(), Some(&b"2-3"[..]));
        assert_eq!(s.stats().keys, 3);
        assert!(s.verify().unwrap().is_clean());
    };
    check(&s);
    drop(s);
    let s = Store::open(dev.clone(), &no_blind).unwrap();
    check(&s);
}

/// A 16 MiB store on a fault-injecting device (512 B grains, 1 MiB
/// segments, 64-slot tables so `colliding_keys` collide), opened with `open`.
fn fault_store(open: &OpenOptions) -> (Arc<granary_io::FaultDevice>, Store) {
    let dev = Arc::new(granary_io::FaultDevice::new(16 << 20, 7));
    let opts = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: Some(64) };
    let s = Store::create(dev.clone(), &opts, open).unwrap();
    (dev, s)
}

/// Blind overwrites off: an overwrite reads the key's old version.
fn no_blind_opts() -> OpenOptions {
    OpenOptions { gc: false, blind_overwrite_bytes: Some(0), ..OpenOptions::default() }
}

/// The read of an overwrite (blind overwrites off) fails after its write
/// went out: the PUT reports the error, the running store keeps serving
/// the old version, stays writable, and a later PUT of the key replaces it.
#[test]
fn an_overwrite_whose_read_fails_keeps_the_old_version() {
    let (dev, s) = fault_store(&no_blind_opts());
    s.put(b"k", b"old").unwrap();
    let writes = dev.counters().snapshot().writes;
    dev.fail_nth(granary_io::OpKind::Read, 0, false);
    let r = granary_rt::block_on(s.put_async(b"k", b"new"));
    assert!(matches!(r, Err(Error::Io { op: "read", .. })), "{r:?}");
    assert_eq!(dev.counters().snapshot().writes, writes + 1, "the new version was not written alongside the read");
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"old"[..]));
    assert_eq!(s.stats().keys, 1);
    granary_rt::block_on(s.put_async(b"k", b"newer")).unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"newer"[..]));
    assert!(s.verify().unwrap().is_clean());
}

/// Group-write statistics count every group and every user record it
/// carried: a single PUT, an atomic batch's records (not its commit
/// record) and a run's keys, each written as one group.
#[test]
fn group_statistics_count_the_records_of_batches_and_runs() {
    let (_dev, s) = mem_store(8 << 20, 1 << 20, 512);
    let ns = s.namespace(DEFAULT_NAMESPACE).unwrap();
    let counts = || {
        let st = s.stats();
        (st.write_groups, st.grouped_records)
    };
    let (g0, r0) = counts();
    s.put(b"single", b"v").unwrap();
    let mut b = s.batch();
    b.put(&ns, b"a", b"1").put(&ns, b"b", b"2").put(&ns, b"c", b"3");
    b.commit().unwrap();
    let items: Vec<(&[u8], &[u8])> = vec![(b"r1", b"x"), (b"r2", b"y"), (b"r3", b"z"), (b"r4", b"w")];
    s.put_many(&items).unwrap();
    let (g, r) = counts();
    assert_eq!((g - g0, r - r0), (3, 1 + 3 + 4), "groups and their records");
}

/// A batch reads what it must read of its keys' old versions before it
/// writes: a read that fails then fails the batch with nothing written, so
/// no reader sees part of it (its first key's new value beside its
/// second's old one), and no restart brings it back.
#[test]
fn a_batch_whose_read_fails_writes_nothing() {
    let (dev, s) = fault_store(&no_blind_opts());
    s.put(b"k", b"old").unwrap();
    let ns = s.namespace(DEFAULT_NAMESPACE).unwrap();
    // The first batch turns the store's batches feature on (a write).
    let mut b = s.batch();
    b.put(&ns, b"first", b"batch");
    b.commit().unwrap();
    let writes = dev.counters().snapshot().writes;
    dev.fail_nth(granary_io::OpKind::Read, 0, false);
    let mut b = s.batch();
    b.put(&ns, b"a", b"new").put(&ns, b"k", b"new");
    let r = b.commit();
    assert!(matches!(r, Err(Error::Io { op: "read", .. })), "{r:?}");
    assert_eq!(dev.counters().snapshot().writes, writes, "the batch was written");
    assert_eq!(s.get(b"a").unwrap(), None, "half of the batch is visible");
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"old"[..]));
    // Nor after a crash.
    drop(ns);
    drop(s);
    let s = Store::open(dev.clone(), &no_blind_opts()).unwrap();
    assert_eq!(s.get(b"a").unwrap(), None, "the failed batch came back after a crash");
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"old"[..]));
    let ns = s.namespace(DEFAULT_NAMESPACE).unwrap();
    let mut b = s.batch();
    b.put(&ns, b"a", b"new").put(&ns, b"k", b"new");
    b.commit().unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"new"[..]));
    assert!(s.verify().unwrap().is_clean());
}

/// A batch of two keys of one neighbourhood (one new, one that has the
/// other's one candidate as its own) reads both before it writes, so a
/// failed read leaves either all of the batch visible or none of it, in
/// whichever order the keys come and whichever read fails.
#[test]
fn a_batch_of_two_keys_of_one_neighbourhood_is_all_or_nothing_when_a_read_fails() {
    for order in 0..2 {
        for failing in 0..4 {
            let (dev, s) = fault_store(&blind_opts());
            let ck = colliding_keys(s.core.keys.hasher, 2);
            let (a, b) = (&ck[0][..], &ck[1][..]);
            s.put(a, b"old").unwrap();
            let ns = s.namespace(DEFAULT_NAMESPACE).unwrap();
            let mut first = s.batch();
            first.put(&ns, b"first", b"batch");
            first.commit().unwrap();
            dev.fail_nth(granary_io::OpKind::Read, failing, false);
            let mut batch = s.batch();
            if order == 0 {
                batch.put(&ns, b, b"new").put(&ns, a, b"new");
            } else {
                batch.put(&ns, a, b"new").put(&ns, b, b"new");
            }
            let r = batch.commit();
            // A failure the batch did not reach fires on a read here once.
            let get = |k: &[u8]| s.get(k).or_else(|_| s.get(k)).unwrap();
            let seen = (get(a), get(b));
            let none = (Some(b"old".to_vec()), None);
            let all = (Some(b"new".to_vec()), Some(b"new".to_vec()));
            assert!(seen == none || seen == all, "order {order}, read {failing} failing ({r:?}): {seen:?}");
            assert_eq!(r.is_ok(), seen == all, "order {order}, read {failing}: {r:?}");
        }
    }
}

/// Blind overwrites on: the in-memory test device leaves them off by default.
pub(crate) const BLIND: Option<usize> = Some(crate::BLIND_OVERWRITE_BYTES_DEFAULT);

/// Options of the blind-overwrite tests: blind overwrites on, no GC thread,
/// no background checkpoint and none at close (a drop is a crash).
/// A blind overwrite's head that is unreadable (damaged) is corruption,
/// not a cue to read what it displaced: that is the key's own older
/// version (a link moves only to newer versions of its key), and a GET
/// returned it, or brought back a deleted key.
#[test]
fn a_damaged_blind_head_is_corruption_not_the_older_version() {
    for delete in [false, true] {
        let (dev, s) = blind_store(1 << 20);
        s.put(b"k", b"v1").unwrap();
        s.put(b"k", b"v2").unwrap();
        if delete {
            assert!(s.delete(b"k").unwrap());
        }
        assert!(s.stats().unsettled_links > 0, "the overwrite went blind");
        flip_byte_of(&dev, &s, b"k", 20);
        let got = s.get(b"k");
        assert!(matches!(&got, Err(e) if e.is_corruption()), "delete {delete}: {got:?}");
    }
}

fn blind_opts() -> OpenOptions {
    OpenOptions {
        blind_overwrite_bytes: BLIND,
        gc: false,
        checkpoint_on_close: false,
        checkpoint_interval: None,
        ..OpenOptions::default()
    }
}

/// A 16 MiB store of 512 B grains, `segment`-byte segments and 64-slot
/// tables (so `colliding_keys` collide), opened with [`blind_opts`].
fn blind_store(segment: u64) -> (Arc<TestDevice>, Store) {
    let dev = test_device(16 << 20);
    dev.shape_zones(segment);
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(segment), index_table_homes: Some(64) };
    let s = Store::create(dev.clone(), &create, &blind_opts()).unwrap();
    (dev, s)
}

/// Two keys of one neighbourhood written together (a run or a batch), one
/// of them new: both see the other's record as their one candidate, but
/// only one may replace it blindly (two links of one displaced record
/// would orphan one). In either order, by a run and by a batch, the links'
/// bytes match their count, every key reads its latest value (with other
/// links about, which lookups then follow), a delete stays deleted, and
/// `verify` is clean, before and after a crash.
#[test]
fn two_keys_of_one_neighbourhood_written_together_do_not_share_a_displaced_record() {
    for (order, via_batch) in [(0, false), (1, false), (0, true), (1, true)] {
        let (dev, s) = blind_store(1 << 20);
        let ck = colliding_keys(s.core.keys.hasher, 2);
        let (a, b) = (&ck[0][..], &ck[1][..]);
        let how = format!("order {order}, batch {via_batch}");
        s.put(a, b"a1").unwrap();
        let mut items: Vec<(&[u8], &[u8])> = vec![(b, b"b1"), (a, b"a2")];
        if order == 1 {
            items.reverse();
        }
        if via_batch {
            let ns = s.namespace(DEFAULT_NAMESPACE).unwrap();
            let mut batch = s.batch();
            for &(k, v) in &items {
                batch.put(&ns, k, v);
            }
            batch.commit().unwrap();
        } else {
            s.put_many(&items).unwrap();
        }
        let links_ok = |s: &Store, when: &str| {
            // Keys a and b have the same length, x is one byte.
            let st = s.stats();
            let (lo, hi) = ((LINK_OVERHEAD_BYTES + 1) as u64, (LINK_OVERHEAD_BYTES + a.len()) as u64);
            let fits = (st.unsettled_links * lo..=st.unsettled_links * hi).contains(&st.link_bytes);
            assert!(fits, "{how}, {when}: {} link bytes for {} links", st.link_bytes, st.unsettled_links);
        };
        links_ok(&s, "after the pair");
        // Other links about: a lookup that meets a head of another key
        // follows its link.
        s.put(b"x", b"x1").unwrap();
        s.put(b"x", b"x2").unwrap();
        assert_eq!(s.get(a).unwrap().as_deref(), Some(&b"a2"[..]), "{how}");
        assert_eq!(s.get(b).unwrap().as_deref(), Some(&b"b1"[..]), "{how}");
        s.put(a, b"a3").unwrap();
        assert!(s.delete(a).unwrap(), "{how}");
        assert_eq!(s.get(a).unwrap(), None, "{how}: the delete did not hold");
        assert_eq!(s.get(b).unwrap().as_deref(), Some(&b"b1"[..]), "{how}");
        links_ok(&s, "after the delete");
        assert!(s.verify().unwrap().is_clean(), "{how}");
        drop(s);
        let s = Store::open(dev.clone(), &blind_opts()).unwrap();
        assert_eq!(s.get(a).unwrap(), None, "{how}: after a crash");
        assert_eq!(s.get(b).unwrap().as_deref(), Some(&b"b1"[..]), "{how}: after a crash");
        assert_eq!(s.get(b"x").unwrap().as_deref(), Some(&b"x2"[..]), "{how}: after a crash");
    }
}

/// Blind overwrites ([`crate::links`]): an overwrite of a key whose
/// neighbourhood holds one candidate reads nothing; a key written again and
/// again holds one link; `verify` settles it; the latest value survives a
/// clean restart and a crash.
#[test]
fn a_blind_overwrite_reads_nothing_and_holds_one_link_per_key() {
    let (dev, s) = blind_store(1 << 20);
    let crashy = blind_opts();
    s.put(b"k", b"v1").unwrap();
    let reads = dev.counters().snapshot().reads;
    for i in 2..=5 {
        s.put(b"k", format!("v{i}").as_bytes()).unwrap();
    }
    assert_eq!(dev.counters().snapshot().reads, reads, "an overwrite read the old version");
    let st = s.stats();
    assert_eq!((st.blind_overwrites, st.unsettled_links, st.keys), (4, 1, 1));
    assert!(st.link_bytes > crate::LINK_OVERHEAD_BYTES as u64);
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v5"[..]));
    // A crash with the link unsettled: the log scan orders the versions.
    drop(s);
    let s = Store::open(dev.clone(), &crashy).unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v5"[..]));
    s.put(b"k", b"v6").unwrap();
    assert_eq!(s.stats().unsettled_links, 1);
    assert!(s.verify().unwrap().is_clean());
    assert_eq!(s.stats().unsettled_links, 0, "verify settles the links first");
    assert_eq!(s.stats().keys, 1);
    let s = reopen(&dev, s);
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v6"[..]));
}

/// Past [`OpenOptions::blind_overwrite_bytes`], overwrites read the old
/// version as uDepot does, and still come out right.
#[test]
fn past_the_link_cap_overwrites_read_the_old_version() {
    let dev = test_device(16 << 20);
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: Some(64) };
    let cap = 3 * (crate::LINK_OVERHEAD_BYTES + 6);
    let open = OpenOptions { gc: false, blind_overwrite_bytes: Some(cap), ..OpenOptions::default() };
    let s = Store::create(dev.clone(), &create, &open).unwrap();
    let keys: Vec<String> = (0..8).map(|i| format!("key-{i}")).collect();
    for k in &keys {
        s.put(k.as_bytes(), b"first").unwrap();
    }
    let reads = dev.counters().snapshot().reads;
    for k in &keys {
        s.put(k.as_bytes(), format!("{k}-second").as_bytes()).unwrap();
    }
    let st = s.stats();
    assert_eq!((st.blind_overwrites, st.unsettled_links), (3, 3), "the cap holds three links of 5-byte keys");
    assert!(dev.counters().snapshot().reads >= reads + 5, "the overwrites past the cap read nothing");
    for k in &keys {
        assert_eq!(s.get(k.as_bytes()).unwrap(), Some(format!("{k}-second").into_bytes()));
    }
    assert!(s.verify().unwrap().is_clean());
}

/// How a test settles a link whose displaced record is another key's.
#[derive(Debug, Clone, Copy)]
enum Settle {
    Get,
    Gc,
    Checkpoint,
    CheckpointThenCrash,
    Crash,
    Delete,
    ReplaceOnly,
    BlindAgain,
}

/// A blind overwrite whose one candidate was another key (same home slot
/// and tag): that key is still found through the link, and every way of
/// settling the link (GC, a checkpoint, a writer of the displaced key, a
/// crash and the log scan or the checkpoint and its replay) keeps both.
#[test]
fn a_blind_overwrite_of_a_colliding_key_loses_nothing() {
    use Settle::*;
    for how in [Get, Gc, Checkpoint, CheckpointThenCrash, Crash, Delete, ReplaceOnly, BlindAgain] {
        let (dev, s) = blind_store(64 << 10);
        let crashy = blind_opts();
        let keys = colliding_keys(s.core.keys.hasher, 2);
        let (a, b) = (&keys[0][..], &keys[1][..]);
        if matches!(how, CheckpointThenCrash) {
            s.put(b"before", b"x").unwrap();
            s.checkpoint().unwrap();
        }
        s.put(a, b"a1").unwrap();
        s.put(b, b"b1").unwrap();
        let st = s.stats();
        assert_eq!((st.blind_overwrites, st.unsettled_links), (1, 1), "{how:?}: b did not displace a blindly");
        assert_eq!(s.get(a).unwrap().as_deref(), Some(&b"a1"[..]), "{how:?}: a not found through the link");
        assert_eq!(s.get(b).unwrap().as_deref(), Some(&b"b1"[..]));
        let mut want_a: Option<&[u8]> = Some(b"a1");
        let mut want_b: &[u8] = b"b1";
        let s = match how {
            Get => s,
            Gc => {
                let f = granary_rt::block_on(s.core.find(a, s.core.keys.hash(a), false, true)).unwrap().unwrap();
                assert!(f.via.is_some(), "a was not found through the link");
                roll_segment(&s);
                let keys_before = s.stats().keys;
                crate::gc::reclaim(s.core.collector(), s.core.log.sb.segment_of(f.entry.pba()), false).unwrap();
                assert_eq!(s.stats().unsettled_links, 0, "GC left the link of a record it moved");
                assert_eq!(s.stats().keys, keys_before + 1, "GC did not count the displaced key again");
                s
            }
            Checkpoint => {
                s.checkpoint().unwrap();
                assert_eq!(s.stats().unsettled_links, 0, "{how:?}");
                assert_eq!(s.stats().keys, 2);
                drop(s);
                Store::open(dev.clone(), &crashy).unwrap()
            }
            CheckpointThenCrash | Crash => {
                drop(s);
                Store::open(dev.clone(), &crashy).unwrap()
            }
            Delete => {
                assert!(s.delete(a).unwrap());
                want_a = None;
                s
            }
            ReplaceOnly => {
                assert_eq!(s.put_with(a, b"a2", PutMode::ReplaceOnly).unwrap(), PutOutcome::Stored);
                want_a = Some(b"a2");
                s
            }
            BlindAgain => {
                s.put(b, b"b2").unwrap();
                let st = s.stats();
                assert_eq!((st.blind_overwrites, st.unsettled_links), (2, 1), "the link did not move to b's new head");
                want_b = b"b2";
                s
            }
        };
        let check = |s: &Store| {
            assert_eq!(s.get(a).unwrap().as_deref(), want_a, "{how:?}: key a");
            assert_eq!(s.get(b).unwrap().as_deref(), Some(want_b), "{how:?}: key b");
        };
        check(&s);
        assert!(s.verify().unwrap().is_clean(), "{how:?}");
        let st = s.stats();
        assert_eq!(st.unsettled_links, 0);
        let want_keys = 1 + want_a.is_some() as u64 + matches!(how, CheckpointThenCrash) as u64;
        assert!(matches!(how, Gc) || st.keys == want_keys, "{how:?}: {} keys, not {want_keys}", st.keys);
        check(&s);
        drop(s);
        let s = Store::open(dev.clone(), &crashy).unwrap();
        check(&s);
    }
}

/// A record displaced by a colliding key's blind overwrite that can no
/// longer be read: a checkpoint still succeeds (the link stays, its entry
/// is written as an item of its own) and `verify` reports it.
#[test]
fn an_unreadable_displaced_record_reports_and_never_blocks_checkpoints() {
    let (dev, s) = blind_store(1 << 20);
    let open = blind_opts();
    let keys = colliding_keys(s.core.keys.hasher, 2);
    let (a, b) = (&keys[0][..], &keys[1][..]);
    s.put(a, b"a1").unwrap();
    let a_pba = s.core.keys.index.lookup(s.core.keys.hash(a)).as_slice()[0].pba();
    s.put(b, b"b1").unwrap();
    assert_eq!(s.stats().unsettled_links, 1);
    // Damage a's record header (its checksum no longer matches).
    let off = (a_pba * s.core.log.grain()) as usize + 20;
    dev.with_bytes_mut(|m| m[off] ^= 0x20);
    assert!(s.get(a).unwrap_err().is_corruption(), "a's damage was not reported");
    assert_eq!(s.get(b).unwrap().as_deref(), Some(&b"b1"[..]));
    s.checkpoint().unwrap();
    assert_eq!(s.stats().unsettled_links, 1, "an unreadable displaced record's link was dropped");
    let report = s.verify().unwrap();
    assert!(report.errors.iter().any(|e| e.contains("blind overwrite")), "{:?}", report.errors);
    // A crash: recovery from the checkpoint still finds b.
    drop(s);
    let s = Store::open(dev.clone(), &open).unwrap();
    assert_eq!(s.get(b).unwrap().as_deref(), Some(&b"b1"[..]));
}

/// The same with the displaced record in an older segment than its head
/// (a key's own older version, dead): the checkpoint replays that segment
/// instead of writing the record as an item, which the recovery read to
/// compare and failed the open on (after a crash or a close).
#[test]
fn an_unreadable_displaced_record_in_an_older_segment_never_fails_an_open() {
    for clean in [false, true] {
        let (dev, s) = blind_store(64 << 10);
        let open = blind_opts();
        s.put(b"k", b"v1").unwrap();
        let old = s.core.keys.index.lookup(s.core.keys.hash(b"k")).as_slice()[0].pba();
        roll_segment(&s);
        s.put(b"k", b"v2").unwrap();
        assert_eq!(s.stats().unsettled_links, 1, "the overwrite went blind");
        let off = (old * s.core.log.grain()) as usize + 20;
        dev.with_bytes_mut(|m| m[off] ^= 0x20);
        s.checkpoint().unwrap();
        if clean {
            s.close().unwrap();
        } else {
            drop(s);
        }
        let s = Store::open(dev.clone(), &open).unwrap_or_else(|e| panic!("clean {clean}: {e}"));
        assert!(s.stats().recovery.checkpoint_id != 0, "from the checkpoint");
        assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v2"[..]));
    }
}

/// A blind overwrite in namespace B that displaced a value of namespace A
/// (their stored keys share a fingerprint) counts that value out of B
/// until its link settles: B's counters go below zero for a while. B's
/// stats read 0 then, and its quota still takes writes (they read as
/// about 2^64 bytes, and B refused every write, or panicked in a debug
/// build).
#[test]
fn a_namespace_briefly_below_zero_reads_as_empty() {
    let (_dev, s) = blind_store(1 << 20);
    let a = s.create_namespace("a", NamespaceOptions::default()).unwrap();
    let quota = NamespaceOptions { max_bytes: Some(64 << 10), ..NamespaceOptions::default() };
    let b = s.create_namespace("b", quota).unwrap();
    let (ida, idb) = (a.stats().unwrap().id, b.stats().unwrap().id);
    // A user key of each whose stored forms share a fingerprint.
    let hasher = s.core.keys.hasher;
    let fp = |id: u32, k: &[u8]| {
        let h = hasher.hash(&crate::nskey::stored_key(id, k));
        (granary_index::home_of(h, 64), key_tag(h))
    };
    let mut seen = std::collections::HashMap::new();
    let (ka, kb) = (0..)
        .find_map(|i| {
            let k = format!("k{i}").into_bytes();
            seen.insert(fp(ida, &k), k.clone());
            seen.get(&fp(idb, &k)).map(|other| (other.clone(), k))
        })
        .unwrap();
    a.put(&ka, &[0u8; 8000]).unwrap();
    let links = s.stats().unsettled_links;
    b.put(&kb, b"x").unwrap();
    assert_eq!(s.stats().unsettled_links, links + 1, "b's write went blind over a's value");
    let st = b.stats().unwrap();
    assert!(st.value_bytes <= 1024 && st.keys <= 1, "{st:?}");
    b.put(b"more", b"y").unwrap();
    assert_eq!(b.get(&kb).unwrap().as_deref(), Some(&b"x"[..]));
    assert_eq!(a.get(&ka).unwrap().as_deref(), Some(&[0u8; 8000][..]));
}

/// GC reads a mostly dead victim sparsely (only what the index or a link
/// points at), by its summary (only what the summary says is live or may
/// be: the colliding key's record, not those displaced by their own key)
/// or scans it whole, with the same outcome: live values moved, a
/// colliding key displaced by a blind overwrite indexed again and moved,
/// tombstones kept, nothing else copied; the same after a restart.
#[test]
fn a_sparse_reclaim_a_summary_reclaim_and_a_scan_leave_the_same_store() {
    use crate::gc::ReadMode;
    let mut outcomes = Vec::new();
    let mut modes = vec![ReadMode::Sparse, ReadMode::Scan];
    if !skip_zoned("zoned mode writes no summaries: no summary reclaim") {
        modes.insert(1, ReadMode::Summary);
    }
    for mode in modes.iter().copied() {
        let (dev, s) = blind_store(64 << 10);
        let open = blind_opts();
        let keys = colliding_keys(s.core.keys.hasher, 2);
        let (a, b) = (&keys[0][..], &keys[1][..]);
        // The victim: 30 values (3 stay, the rest are overwritten or
        // deleted later), a key another key's blind overwrite displaces,
        // and a tombstone.
        for i in 0..30 {
            s.put(format!("k{i}").as_bytes(), &[i as u8; 900]).unwrap();
        }
        s.put(a, b"a1").unwrap();
        s.put(b"gone", b"x").unwrap();
        s.delete(b"gone").unwrap();
        let v = s.core.log.sb.segment_of(s.core.keys.index.lookup(s.core.keys.hash(b"k0")).as_slice()[0].pba());
        roll_segment(&s);
        for i in 3..30 {
            if i % 5 == 0 {
                s.delete(format!("k{i}").as_bytes()).unwrap();
            } else {
                s.put(format!("k{i}").as_bytes(), format!("new {i}").as_bytes()).unwrap();
            }
        }
        s.put(b, b"b1").unwrap(); // displaces a, blindly
                                  // The overwrites of 22 keys and b's each displaced a record of the victim.
        assert_eq!(s.stats().unsettled_links, 23);
        roll_segment(&s);
        crate::gc::reclaim_with(s.core.collector(), v, false, mode).unwrap();
        let st = s.stats();
        assert_eq!(st.gc.sparse_victims, u64::from(mode == ReadMode::Sparse), "{mode:?}");
        assert_eq!(st.gc.summary_victims, u64::from(mode == ReadMode::Summary), "{mode:?}");
        let lo = s.core.space.pba(v, 0);
        let left = s.core.keys.links.displacing_in(lo, lo + s.core.log.sb.segment_grains());
        assert!(left.is_empty(), "{mode:?}: links into the victim were not settled: {left:?}");
        let check = |s: &Store| {
            for i in 0..3 {
                assert_eq!(s.get(format!("k{i}").as_bytes()).unwrap(), Some(vec![i as u8; 900]), "{mode:?} k{i}");
            }
            for i in 3..30 {
                let want = (i % 5 != 0).then(|| format!("new {i}").into_bytes());
                assert_eq!(s.get(format!("k{i}").as_bytes()).unwrap(), want, "{mode:?} k{i}");
            }
            assert_eq!(s.get(a).unwrap().as_deref(), Some(&b"a1"[..]), "{mode:?}: the displaced key was lost");
            assert_eq!(s.get(b).unwrap().as_deref(), Some(&b"b1"[..]));
            assert_eq!(s.get(b"gone").unwrap(), None);
        };
        check(&s);
        assert!(s.verify().unwrap().is_clean(), "{mode:?}");
        let st = s.stats();
        outcomes.push((st.keys, st.tombstones, st.live_bytes, st.gc.records_relocated));
        drop(s);
        let s = Store::open(dev.clone(), &open).unwrap();
        check(&s);
    }
    for (mode, outcome) in modes.iter().zip(&outcomes) {
        assert_eq!(outcome, outcomes.last().unwrap(), "a {mode:?} reclaim and a scan differ");
    }
}

/// A blind store where `n` keys of 900 bytes were written into segment
/// `v`, which was then rolled, and then overwritten blindly elsewhere:
/// (device, store, keys, v); `v`'s records are each displaced by a link
/// of its own key.
fn victim_of_own_key_overwrites(prefix: &str, n: usize) -> (Arc<TestDevice>, Store, Vec<Vec<u8>>, u32) {
    let (dev, s) = blind_store(64 << 10);
    let keys: Vec<Vec<u8>> = (0..n).map(|i| format!("{prefix}{i}").into_bytes()).collect();
    for k in &keys {
        s.put(k, &[1u8; 900]).unwrap();
    }
    let v = s.core.log.sb.segment_of(s.core.keys.index.lookup(s.core.keys.hash(&keys[0])).as_slice()[0].pba());
    roll_segment(&s);
    for k in &keys {
        s.put(k, &[2u8; 900]).unwrap();
    }
    (dev, s, keys, v)
}

/// A victim's records displaced by blind overwrites of their own keys are
/// found dead without their keys' stripes, so a writer holding one (as a
/// run of PUTs does while its write is in flight) does not hold up the
/// scan; their links go in the stripe sweep after it, and every key keeps
/// its new value.
#[test]
fn a_victim_overwritten_by_its_own_keys_is_scanned_without_their_stripes() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let (dev, s, keys, v) = victim_of_own_key_overwrites("own-", 20);
    let lo = s.core.space.pba(v, 0);
    let into_v = || s.core.keys.links.displacing_in(lo, lo + s.core.log.sb.segment_grains());
    let held = into_v().first().map(|l| l.key.to_vec()).expect("a blind overwrite displaced a record of the victim");
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let released = Arc::new(AtomicBool::new(false));
    let scanned_while_held = Arc::new(AtomicBool::new(false));
    std::thread::scope(|sc| {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (s, held, rel) = (&s, &held, released.clone());
        sc.spawn(move || {
            let _stripe = s.core.keys.lock_key(s.core.keys.hash(held));
            ready_tx.send(()).unwrap();
            // Bounded: a scan that waits for this stripe (the failure)
            // gets it after 10 s.
            let _ = rx.recv_timeout(std::time::Duration::from_secs(10));
            rel.store(true, SeqCst);
        });
        ready_rx.recv().unwrap();
        let (flag, rel) = (scanned_while_held.clone(), released.clone());
        crate::gc::AFTER_SCAN.with(|h| {
            h.set(Some(Box::new(move || {
                flag.store(!rel.load(SeqCst), SeqCst);
                let _ = tx.send(());
            })))
        });
        crate::gc::reclaim_with(s.core.collector(), v, false, crate::gc::ReadMode::Scan).unwrap();
    });
    assert!(scanned_while_held.load(SeqCst), "the scan waited for a stripe a writer held");
    assert!(into_v().is_empty(), "links into the freed victim are left");
    assert_eq!(s.stats().unsettled_links, 0);
    for k in &keys {
        assert_eq!(s.get(k).unwrap(), Some(vec![2u8; 900]), "{}", String::from_utf8_lossy(k));
    }
    assert!(s.verify().unwrap().is_clean());
    drop(s);
    let s = Store::open(dev.clone(), &blind_opts()).unwrap();
    for k in &keys {
        assert_eq!(s.get(k).unwrap(), Some(vec![2u8; 900]), "after a crash");
    }
}

/// A value of the largest size a segment holds leaves no room for a
/// summary: its segment goes without one (no debug assertion, no summary
/// that does not fit), and the segments around it keep theirs.
#[test]
fn the_largest_value_leaves_its_segment_without_a_summary() {
    if skip_zoned("zoned mode writes no summaries") {
        return;
    }
    let (_dev, s) = blind_store(64 << 10);
    let max = s.stats().value_bytes_max as usize;
    s.put(b"small", b"v").unwrap();
    // (The largest value is for a key of one byte.)
    s.put(b"h", &vec![7u8; max]).unwrap();
    s.put(b"i", &vec![8u8; max]).unwrap();
    roll_segment(&s);
    roll_segment(&s);
    assert_eq!(s.get(b"h").unwrap(), Some(vec![7u8; max]));
    assert_eq!(s.get(b"i").unwrap(), Some(vec![8u8; max]));
    let report = s.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.errors);
    assert!(report.summaries > 0, "the segments of small records lost their summaries");
}

/// A store created without summaries (as by an older build) has no
/// summaries flag; opened by a build that writes them, it gets the flag
/// on the device with its first summary, not before.
#[test]
fn a_store_without_summaries_gets_the_flag_with_its_first_summary() {
    use granary_format::superblock::FLAG_SUMMARIES;
    if skip_zoned("zoned mode writes no summaries") {
        return;
    }
    let dev = test_device(16 << 20);
    dev.shape_zones(64 << 10);
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), index_table_homes: None };
    let off = OpenOptions { segment_summaries: false, ..blind_opts() };
    let s = Store::create(dev.clone(), &create, &off).unwrap();
    s.put(b"k", b"v").unwrap();
    drop(s);
    let flags = || granary_format::Superblock::decode(&dev.with_bytes_mut(|m| m[..4096].to_vec())).unwrap().flags;
    assert_eq!(flags() & FLAG_SUMMARIES, 0);
    let s = Store::open(dev.clone(), &blind_opts()).unwrap();
    assert!(!s.core.space.has_feature(FLAG_SUMMARIES));
    s.put(b"k2", b"v2").unwrap();
    assert_eq!(flags() & FLAG_SUMMARIES, 0, "turned on before any summary was written");
    roll_segment(&s);
    roll_segment(&s);
    assert!(s.stats().summaries_written > 0);
    assert_ne!(flags() & FLAG_SUMMARIES, 0, "a summary was written but the superblock does not say so");
    assert!(s.verify().unwrap().summaries > 0);
}

/// SepBIT's streams turn on the superblock's streams flag before the
/// first segment header that names one is written (an older build then
/// refuses the store); a store that never used them stays without it.
#[test]
fn the_first_short_lived_segment_turns_the_streams_flag_on() {
    use granary_format::superblock::FLAG_STREAMS;
    if skip_zoned("zoned mode ignores SepBIT placement") {
        return;
    }
    let dev = test_device(16 << 20);
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), index_table_homes: None };
    let flags = || granary_format::Superblock::decode(&dev.with_bytes_mut(|m| m[..4096].to_vec())).unwrap().flags;
    let s = Store::create(dev.clone(), &create, &OpenOptions::default()).unwrap();
    s.put(b"k", b"v1").unwrap();
    s.put(b"k", b"v2").unwrap();
    drop(s);
    assert_eq!(flags() & FLAG_STREAMS, 0, "no SepBIT placement, no short-lived segment");
    let s = Store::open(dev.clone(), &OpenOptions { gc_sepbit: true, ..OpenOptions::default() }).unwrap();
    s.put(b"k", b"v3").unwrap();
    assert_eq!(s.stats().short_segments_opened, 1, "a young version's overwrite goes to the short-lived stream");
    assert_ne!(flags() & FLAG_STREAMS, 0, "a short-lived segment was opened but the superblock does not say so");
    drop(s);
    let s = Store::open(dev.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v3"[..]));
}

/// After a crash, writes resume in the tail of each stream's newest
/// segment, but only in streams the open writes to: a short-lived
/// segment's tail reopened by an open without SepBIT would stay open for
/// good (pinning every checkpoint's replay floor and the tombstone horizon,
/// never reclaimed).
#[test]
fn a_crash_resumes_tails_only_in_streams_the_open_writes_to() {
    if skip_zoned("zoned mode ignores SepBIT placement") {
        return;
    }
    let dev = test_device(16 << 20);
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), index_table_homes: None };
    let sepbit = OpenOptions { gc_sepbit: true, ..OpenOptions::default() };
    let s = Store::create(dev.clone(), &create, &sepbit).unwrap();
    s.put(b"k", b"v1").unwrap();
    s.put(b"k", b"v2").unwrap();
    assert_eq!(s.stats().short_segments_opened, 1);
    drop(s); // a crash
    let s = Store::open(dev.clone(), &sepbit).unwrap();
    assert_eq!(s.core.space.counts().1, 2, "both tails resume with SepBIT");
    drop(s); // a crash again
    let s = Store::open(dev.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(s.core.space.counts().1, 1, "only the user stream's tail resumes without SepBIT");
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v2"[..]));
}

/// A segment header whose magic and checksum hold but which names a
/// stream this build does not know (a newer build's) fails the open,
/// naming the field, instead of being taken for a free segment (which
/// would lose its records).
#[test]
fn a_segment_header_of_a_newer_build_fails_the_open() {
    use granary_format::limits::SEGMENT_HEADER_BYTES;
    let dev = test_device(16 << 20);
    dev.shape_zones(64 << 10);
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), index_table_homes: None };
    let s =
        Store::create(dev.clone(), &create, &OpenOptions { use_checkpoint: false, ..OpenOptions::default() }).unwrap();
    s.put(b"k", b"v").unwrap();
    let seg = s.core.space.used_segments()[0];
    let at = s.core.log.sb.segment_offset(seg) as usize;
    drop(s);
    dev.with_bytes_mut(|m| {
        let h = &mut m[at..at + SEGMENT_HEADER_BYTES];
        assert!(granary_format::segment::SegmentHeader::decode(h).is_ok());
        h[7] = 6; // the stream byte
        let crc = granary_format::checksum::crc32c(&h[..SEGMENT_HEADER_BYTES - 4]);
        h[SEGMENT_HEADER_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
    });
    let e = Store::open(dev.clone(), &OpenOptions { use_checkpoint: false, ..OpenOptions::default() })
        .err()
        .expect("the open must fail");
    assert!(matches!(e, Error::Corruption { .. }) && e.to_string().contains("stream"), "{e}");
}

/// A summary whose bytes changed (bit rot, or a write a crash tore) is
/// counted by `verify` as unusable (not an error: nothing uses it) and
/// never trusted by GC, which reads the victim's records instead.
#[test]
fn a_damaged_summary_is_reported_and_never_trusted() {
    use crate::gc::ReadMode;
    if skip_zoned("zoned mode writes no summaries") {
        return;
    }
    let (dev, s, keys, v) = victim_of_own_key_overwrites("rot", 30);
    // A byte of the first entry's key, in the summary at the victim's end.
    let seg_end = s.core.log.sb.segment_offset(v) + s.core.log.sb.segment_bytes;
    let region = s.core.log.read_summary(v, s.core.space.stamp(v)).expect("the victim has a summary").0;
    let off = (seg_end - region.len() as u64) as usize + granary_format::summary::SUMMARY_BLOCK_BYTES + 6;
    dev.with_bytes_mut(|m| m[off] ^= 0x01);
    let report = s.verify().unwrap();
    assert_eq!(report.summaries_unusable, 1);
    assert!(report.is_clean(), "{:?}", report.errors);
    crate::gc::reclaim_with(s.core.collector(), v, false, ReadMode::Choose).unwrap();
    assert_eq!(s.stats().gc.summary_victims, 0, "a damaged summary was used");
    for k in &keys {
        assert_eq!(s.get(k).unwrap(), Some(vec![2u8; 900]));
    }
}

/// A victim whose every record a blind overwrite of its own key displaced
/// (what a sequential overwrite of an export leaves) is reclaimed by its
/// summary: the summary is read, none of the records, nothing is copied,
/// the links go, and every key keeps its new value, after a restart too.
/// Without summaries the same victim costs a read of each record.
#[test]
fn a_victim_of_own_key_overwrites_is_reclaimed_by_its_summary_without_reading_its_records() {
    use crate::gc::ReadMode;
    if skip_zoned("zoned mode writes no summaries") {
        return;
    }
    for summaries in [true, false] {
        let (dev, s) = {
            let (dev, _) = (test_device(16 << 20), ());
            dev.shape_zones(64 << 10);
            let create =
                CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), index_table_homes: Some(64) };
            let open = OpenOptions { segment_summaries: summaries, ..blind_opts() };
            let s = Store::create(dev.clone(), &create, &open).unwrap();
            (dev, s)
        };
        let keys: Vec<Vec<u8>> = (0..40).map(|i| format!("seq{i}").into_bytes()).collect();
        for k in &keys {
            s.put(k, &[1u8; 900]).unwrap();
        }
        let v = s.core.log.sb.segment_of(s.core.keys.index.lookup(s.core.keys.hash(&keys[0])).as_slice()[0].pba());
        roll_segment(&s);
        // The fillers that closed the victim are overwritten too: nothing
        // in it stays live.
        let fillers: Vec<Vec<u8>> =
            (0..).map(|i| format!("filler-{i}").into_bytes()).take_while(|k| s.get(k).unwrap().is_some()).collect();
        for k in keys.iter().chain(&fillers) {
            s.put(k, &[2u8; 900]).unwrap();
        }
        assert_eq!(s.stats().unsettled_links, 40 + fillers.len() as u64);
        let before = dev.counters().snapshot();
        crate::gc::reclaim_with(s.core.collector(), v, false, ReadMode::Choose).unwrap();
        let read = dev.counters().snapshot().read_bytes - before.read_bytes;
        let st = s.stats();
        assert_eq!(st.gc.records_relocated, 0, "summaries {summaries}");
        let lo = s.core.space.pba(v, 0);
        let left = s.core.keys.links.displacing_in(lo, lo + s.core.log.sb.segment_grains());
        assert!(left.is_empty(), "summaries {summaries}: links into the victim were left: {left:?}");
        if summaries {
            assert_eq!(st.gc.summary_victims, 1);
            // The summary: its last grain, then its region (40 entries of
            // 10 bytes, a few of 14 and two blocks of 40: two grains).
            assert!(read <= 3 * 512, "the summary reclaim read {read} bytes");
        } else {
            assert_eq!(st.gc.summary_victims, 0);
            assert!(read >= 40 * 1024, "without a summary the victim's 40 records cost only {read} bytes of reads");
        }
        for k in &keys {
            assert_eq!(s.get(k).unwrap(), Some(vec![2u8; 900]), "summaries {summaries}");
        }
        // The segment of the new values closes too (with its summary).
        roll_segment(&s);
        let report = s.verify().unwrap();
        assert!(report.is_clean(), "{:?}", report.errors);
        assert_eq!(report.summaries > 0, summaries, "verify checked {} summaries", report.summaries);
        drop(s);
        let s = Store::open(dev.clone(), &OpenOptions { segment_summaries: summaries, ..blind_opts() }).unwrap();
        for k in &keys {
            assert_eq!(s.get(k).unwrap(), Some(vec![2u8; 900]), "summaries {summaries}, after a restart");
        }
        assert_eq!(s.core.space.has_feature(granary_format::superblock::FLAG_SUMMARIES), summaries);
    }
}

/// Writers that outpace GC wait for the room it makes rather than take the
/// room kept for the open segment's summary: under an overwrite that needs
/// GC all along (run only by writers that find no room,
/// `Background::Manual`, so every segment fills while the store is at its
/// reserve), every victim of user records has its summary and is reclaimed
/// by it: a segment that gave its summary up would cost its reclaim a
/// read of every record.
#[test]
fn writers_at_the_reserve_wait_for_gc_rather_than_give_summaries_up() {
    if skip_zoned("zoned mode writes no summaries") {
        return;
    }
    let dev = test_device(8 << 20);
    // Segments of 128 records of 1 KiB, whose short keys' summary fits in
    // its share of the segment.
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(128 << 10), ..CreateOptions::default() };
    let open = OpenOptions { background: Background::Manual, blind_overwrite_bytes: BLIND, ..OpenOptions::default() };
    let s = Store::create(dev.clone(), &create, &open).unwrap();
    let keys: Vec<Vec<u8>> = (0..400).map(|i| format!("k{i}").into_bytes()).collect();
    let value = |pass: u8, i: usize| vec![pass ^ (i as u8); 900];
    // 40 passes of 400 KiB over an 8 MiB store.
    for pass in 0..40u8 {
        for (i, k) in keys.iter().enumerate() {
            s.put(k, &value(pass, i)).unwrap();
        }
    }
    let st = s.stats();
    assert!(st.gc.victims >= 50, "GC reclaimed only {} victims", st.gc.victims);
    assert_eq!(st.gc.records_relocated, 0, "an overwrite leaves nothing live in its victims");
    assert_eq!(
        st.gc.summary_victims, st.gc.victims,
        "victims reclaimed without a summary ({} summaries written)",
        st.summaries_written
    );
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(s.get(k).unwrap(), Some(value(39, i)));
    }
    let report = s.verify().unwrap();
    assert!(report.is_clean(), "{:?}", report.errors);
}

/// The stripe sweep after a scan takes the free stripes first: a writer
/// holding one stripe (a run of PUTs across its device write) does not
/// hold up the removal of the links under the stripes after it, only its
/// own, which goes once the stripe is released.
#[test]
fn the_sweep_after_a_scan_does_not_wait_in_stripe_order() {
    let (_dev, s, keys, v) = victim_of_own_key_overwrites("sweep-", 40);
    let lo = s.core.space.pba(v, 0);
    let into_v = || s.core.keys.links.displacing_in(lo, lo + s.core.log.sb.segment_grains());
    // Two displaced records of the victim: the held key's stripe before the
    // other's.
    let mut links: Vec<_> =
        into_v().iter().map(|l| (s.core.keys.stripe_of(s.core.keys.hash(&l.key)), l.old.pba())).collect();
    links.sort_unstable();
    links.dedup_by_key(|l| l.0);
    assert!(links.len() >= 2, "blind overwrites displaced records under two stripes: {links:?}");
    let ((held, held_old), (_, later_old)) = (links[0], links[links.len() - 1]);
    std::thread::scope(|sc| {
        let stripe = s.core.keys.lock_stripe(held);
        let gc = sc.spawn(|| crate::gc::reclaim_with(s.core.collector(), v, false, crate::gc::ReadMode::Scan));
        // Bounded: a sweep in stripe order never gets past the held stripe.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while s.core.keys.links.of_old(later_old).is_some() {
            assert!(std::time::Instant::now() < deadline, "the sweep waited for the held stripe {held} first");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(s.core.keys.links.of_old(held_old).is_some(), "a link went without its stripe");
        assert!(!gc.is_finished(), "the reclaim ended without the held stripe");
        drop(stripe);
        gc.join().unwrap().unwrap();
    });
    assert!(into_v().is_empty(), "links into the freed victim are left");
    for k in &keys {
        assert_eq!(s.get(k).unwrap(), Some(vec![2u8; 900]), "{}", String::from_utf8_lossy(k));
    }
    assert!(s.verify().unwrap().is_clean());
}

/// Keys of a summary reclaim's victim overwritten blindly while it looks
/// at the summary's entries (after it asked for the links into the victim)
/// are decided from their new links: the reclaim needs no scan, and every
/// key reads its latest value, before and after a crash.
#[test]
fn keys_overwritten_while_a_summary_reclaim_looks_need_no_scan() {
    if skip_zoned("zoned mode writes no summaries: no summary reclaim") {
        return;
    }
    let (dev, s) = blind_store(64 << 10);
    let ck = colliding_keys(s.core.keys.hasher, 2);
    let (a, b) = (ck[0].clone(), ck[1].clone());
    let s = Arc::new(s);
    for i in 0..30 {
        s.put(format!("k{i}").as_bytes(), &[i as u8; 900]).unwrap();
    }
    s.put(&a, b"a1").unwrap();
    let v = s.core.log.sb.segment_of(s.core.keys.index.lookup(s.core.keys.hash(b"k0")).as_slice()[0].pba());
    roll_segment(&s);
    for i in 5..30 {
        s.put(format!("k{i}").as_bytes(), b"new").unwrap();
    }
    roll_segment(&s);
    let (s2, b2) = (s.clone(), b.clone());
    crate::gc::AFTER_LINKS_ASKED.with(|h| {
        h.set(Some(Box::new(move || {
            for i in 0..2 {
                s2.put(format!("k{i}").as_bytes(), b"during").unwrap();
            }
            // Another key displaces a's record, blindly: a stays live.
            s2.put(&b2, b"b1").unwrap();
        })))
    });
    crate::gc::reclaim_with(s.core.collector(), v, false, crate::gc::ReadMode::Summary).unwrap();
    let st = s.stats();
    assert_eq!((st.gc.summary_victims, st.gc.sparse_fallbacks), (1, 0), "the victim was scanned after all");
    let lo = s.core.space.pba(v, 0);
    let left = s.core.keys.links.displacing_in(lo, lo + s.core.log.sb.segment_grains());
    assert!(left.is_empty(), "links into the victim were left: {left:?}");
    let want = |i: usize| match i {
        0..2 => b"during".to_vec(),
        2..5 => vec![i as u8; 900],
        _ => b"new".to_vec(),
    };
    for i in 0..30 {
        assert_eq!(s.get(format!("k{i}").as_bytes()).unwrap(), Some(want(i)), "k{i}");
    }
    assert_eq!(s.get(&a).unwrap().as_deref(), Some(&b"a1"[..]), "the displaced key was lost");
    assert_eq!(s.get(&b).unwrap().as_deref(), Some(&b"b1"[..]));
    assert!(s.verify().unwrap().is_clean());
    drop(s);
    let s = Store::open(dev.clone(), &blind_opts()).unwrap();
    for i in 0..30 {
        assert_eq!(s.get(format!("k{i}").as_bytes()).unwrap(), Some(want(i)), "after a crash: k{i}");
    }
    assert_eq!(s.get(&a).unwrap().as_deref(), Some(&b"a1"[..]), "after a crash");
}

/// A record of a victim put back in the index while a sparse reclaim reads
/// (a colliding key's blind overwrite displaced it, a checkpoint settled
/// the link) makes the reclaim scan the victim after all; the displaced key
/// is kept.
#[test]
fn a_victim_touched_during_a_sparse_reclaim_is_scanned() {
    let (dev, s) = blind_store(64 << 10);
    let keys = colliding_keys(s.core.keys.hasher, 2);
    let (a, b) = (keys[0].clone(), keys[1].clone());
    let open = blind_opts();
    let s = Arc::new(s);
    s.put(&a, b"a1").unwrap();
    let v = s.core.log.sb.segment_of(s.core.keys.index.lookup(s.core.keys.hash(&a)).as_slice()[0].pba());
    roll_segment(&s);
    for i in 0..200 {
        s.put(format!("filler-{i}").as_bytes(), b"dead").unwrap(); // the fillers of v die
    }
    let (s2, b2) = (s.clone(), b.clone());
    crate::gc::AFTER_SPARSE_READS.with(|h| {
        h.set(Some(Box::new(move || {
            // On their own thread: a writer displaces a, blindly, and a
            // checkpoint settles the link, putting a back in the index.
            std::thread::spawn(move || {
                s2.put(&b2, b"b1").unwrap();
                s2.checkpoint().unwrap();
            })
            .join()
            .unwrap();
        })))
    });
    crate::gc::reclaim_with(s.core.collector(), v, false, crate::gc::ReadMode::Sparse).unwrap();
    assert_eq!(s.stats().gc.sparse_victims, 0, "the touched victim was not scanned after all");
    assert_eq!(s.stats().gc.sparse_fallbacks, 1);
    assert_eq!(s.stats().gc.victims, 1);
    assert_eq!(s.get(&a).unwrap().as_deref(), Some(&b"a1"[..]), "the displaced key was lost");
    assert_eq!(s.get(&b).unwrap().as_deref(), Some(&b"b1"[..]));
    assert!(s.verify().unwrap().is_clean());
    drop(s);
    let s = Store::open(dev.clone(), &open).unwrap();
    assert_eq!(s.get(&a).unwrap().as_deref(), Some(&b"a1"[..]));
}

/// Keys found to share one fingerprint (home slot and key tag) of a
/// 64-home table, from "crowd-{i}": the first `n` whose hash matches the
/// first's, hashed with `hasher`. About 2^18 hashes each.
fn crowd(hasher: KeyHasher, n: usize) -> Vec<Vec<u8>> {
    let fp = |k: &[u8]| {
        let h = hasher.hash(k);
        (granary_index::home_of(h, 64), granary_format::hash::key_tag(h))
    };
    let first = fp(b"crowd-0");
    let mut keys = vec![b"crowd-0".to_vec()];
    let mut i = 1u64;
    while keys.len() < n {
        let k = format!("crowd-{i}").into_bytes();
        if fp(&k) == first {
            keys.push(k);
        }
        i += 1;
    }
    keys
}

/// Keys chosen to collide: once as many keys share a fingerprint as the
/// index keeps of one, a new key of it is refused before anything is
/// written (a single put, a conditional put, a read-modify-write, a
/// batch), the store stays writable and reopens, and the keys already
/// there are still read and overwritten. Before, the record was written,
/// its index insert failed after growing the directory to its largest,
/// the store was poisoned, and its replay failed every later open.
#[test]
fn a_new_key_of_a_crowded_fingerprint_is_refused_before_it_is_written() {
    let dev = test_device(16 << 20);
    dev.shape_zones(1 << 20);
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: Some(64) };
    let s = Store::create(dev.clone(), &create, &no_blind_opts()).unwrap();
    let keys = crowd(s.core.keys.hasher, granary_index::NEIGHBOURHOOD + 1);
    let (members, extra) = keys.split_at(granary_index::NEIGHBOURHOOD);
    for k in members {
        s.put(k, k).unwrap();
    }
    let ns = s.namespace(DEFAULT_NAMESPACE).unwrap();
    // The first batch turns the store's batches feature on (a write).
    let mut b = s.batch();
    b.put(&ns, b"first", b"batch");
    b.commit().unwrap();
    let writes = dev.counters().snapshot().writes;
    let crowded = |r: Result<()>| matches!(r, Err(Error::IndexFull(granary_index::IndexError::Crowded)));
    assert!(crowded(s.put(&extra[0], b"x")), "a put");
    assert!(crowded(s.put_with(&extra[0], b"x", PutMode::CreateOnly).map(|_| ())), "an add");
    assert!(crowded(
        s.update(&extra[0], |_| (Change::Put { value: b"x".to_vec(), meta: ItemMeta::default() }, ())).map(|_| ())
    ));
    let mut b = s.batch();
    b.put(&ns, b"plain", b"p").put(&ns, &extra[0], b"x");
    assert!(crowded(b.commit().map(|_| ())), "a batch");
    assert_eq!(dev.counters().snapshot().writes, writes, "something was written");
    // Still writable; the members are read and overwritten.
    s.put(b"plain", b"p").unwrap();
    s.put(&members[3], b"again").unwrap();
    drop(ns);
    drop(s);
    let s = Store::open(dev.clone(), &no_blind_opts()).unwrap();
    assert_eq!(s.get(&members[3]).unwrap().as_deref(), Some(&b"again"[..]));
    for k in &members[4..] {
        assert_eq!(s.get(k).unwrap().as_deref(), Some(&k[..]));
    }
    assert_eq!(s.get(&extra[0]).unwrap(), None);
}

/// The same with blind overwrites on: a key a blind
/// overwrite displaced lives in a link, not in the index, and still counts
/// as a key of its fingerprint (it goes back in the index when the link
/// settles); runs of many keys (`put_many`) are refused as single writes
/// are. Before, the 33rd key was taken (the index showed 31 entries), and
/// settling the displaced key's link failed its insert and poisoned the
/// store.
#[test]
fn keys_displaced_by_blind_overwrites_count_toward_a_crowded_fingerprint() {
    let dev = test_device(16 << 20);
    dev.shape_zones(1 << 20);
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: Some(64) };
    let opts = blind_opts();
    let s = Store::create(dev.clone(), &create, &opts).unwrap();
    let keys = crowd(s.core.keys.hasher, granary_index::NEIGHBOURHOOD + 2);
    let (members, extra) = keys.split_at(granary_index::NEIGHBOURHOOD);
    s.put(&members[0], &members[0]).unwrap();
    // The only candidate, replaced blindly: members[0] goes to a link.
    s.put(&members[1], &members[1]).unwrap();
    assert_eq!(s.stats().blind_overwrites, 1, "{:?}", s.stats());
    for k in &members[2..] {
        s.put(k, k).unwrap();
    }
    let crowded = |r: Result<()>| matches!(r, Err(Error::IndexFull(granary_index::IndexError::Crowded)));
    assert!(crowded(s.put(&extra[0], b"x")), "a put");
    let items: Vec<(&[u8], &[u8])> = vec![(b"plain-run", b"r"), (&extra[1], b"x")];
    assert!(crowded(s.put_many(&items)), "a run");
    // The displaced key goes back in the index; everything is still there.
    assert!(s.settle_links().unwrap() >= 1);
    s.put(b"plain", b"p").unwrap();
    for k in members {
        assert_eq!(s.get(k).unwrap().as_deref(), Some(&k[..]));
    }
    drop(s);
    let s = Store::open(dev.clone(), &opts).unwrap();
    for k in members {
        assert_eq!(s.get(k).unwrap().as_deref(), Some(&k[..]));
    }
    assert_eq!(s.get(&extra[0]).unwrap(), None);
    assert_eq!(s.get(b"plain-run").unwrap(), None, "the refused run wrote nothing");
}

/// A new store hashes keys with a secret seed of its own (hash algorithm
/// 2, the seed in its superblock): keys computed offline to share one
/// fingerprint under the public seed (what a client could find before,
/// and which the index refused past 32) are ordinary keys to it, and the
/// seed stays with the store across a clean reopen (index from its
/// checkpoint) and a crash (index from a log scan). Two stores get two
/// seeds.
#[test]
fn a_new_store_hashes_with_a_secret_seed_of_its_own() {
    let dev = test_device(16 << 20);
    dev.shape_zones(1 << 20);
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: Some(64) };
    // Opened so that a drop is a crash; the OS's random numbers, as a
    // store outside the unit tests draws them.
    let crashy = OpenOptions {
        checkpoint_on_close: false,
        checkpoint_interval: None,
        entropy: crate::Entropy::system(),
        ..no_blind_opts()
    };
    let s = Store::create(dev.clone(), &create, &crashy).unwrap();
    let sb = s.superblock().clone();
    assert_eq!(sb.hash_algo, granary_format::hash::KEY_HASH_ALGO_XXH3_64_SECRET);
    assert_ne!(s.core.keys.hasher, KeyHasher::PUBLIC);
    let other = Store::create(test_device(16 << 20), &create, &crashy).unwrap();
    assert_ne!(other.superblock().hash_seed, sb.hash_seed, "two stores drew one seed");
    let keys = crowd(KeyHasher::PUBLIC, granary_index::NEIGHBOURHOOD + 4);
    for k in &keys {
        s.put(k, k).unwrap();
    }
    let all_there = |s: &Store| {
        for k in &keys {
            assert_eq!(s.get(k).unwrap().as_deref(), Some(&k[..]));
        }
    };
    all_there(&s);
    drop(s);
    let s = Store::open(dev.clone(), &no_blind_opts()).unwrap();
    assert_eq!(s.stats().recovery.checkpoint_id, 0, "a log scan");
    assert_eq!(s.superblock().key_hasher(), sb.key_hasher());
    all_there(&s);
    s.close().unwrap();
    let s = Store::open(dev.clone(), &no_blind_opts()).unwrap();
    assert_ne!(s.stats().recovery.checkpoint_id, 0, "the index came from the checkpoint");
    all_there(&s);
    s.verify().unwrap();
}

/// A manifest's entry count comes from the device: a body size near
/// u64::MAX (its sum with the manifest's grains wrapped past the room
/// check) is refused, so the open scans instead of allocating it.
#[test]
fn a_checkpoint_body_whose_size_wraps_is_refused() {
    let (_dev, s) = mem_store(8 << 20, 64 << 10, 512);
    let sb = &s.core.log.sb;
    assert!(crate::checkpoint::body_runs_checked(sb, &[1, 2], 1, 512).is_some());
    assert!(crate::checkpoint::body_runs_checked(sb, &[1, 2], 1, u64::MAX - 100).is_none());
    assert!(crate::checkpoint::body_runs_checked(sb, &[1, 2], 1, u64::MAX).is_none());
}

/// A memory device whose async writes wait one poll before they take
/// effect: a future polled once and dropped has its write in flight.
struct WritesWaitAPoll(granary_io::MemDevice);

impl Device for WritesWaitAPoll {
    fn read_at(&self, buf: granary_io::AlignedBuf, offset: u64) -> granary_io::IoResult {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: granary_io::AlignedBuf, offset: u64) -> granary_io::IoResult {
        self.0.write_at(buf, offset)
    }
    fn write_at_async(&self, buf: granary_io::AlignedBuf, offset: u64) -> granary_io::IoFuture<'_> {
        let (mut buf, mut polled) = (Some(buf), false);
        granary_io::IoFuture::Pending(Box::pin(std::future::poll_fn(move |cx| {
            if !std::mem::replace(&mut polled, true) {
                cx.waker().wake_by_ref();
                return std::task::Poll::Pending;
            }
            std::task::Poll::Ready(self.0.write_at(buf.take().expect("polled once more"), offset))
        })))
    }
    fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn block_bytes(&self) -> u32 {
        self.0.block_bytes()
    }
    fn counters(&self) -> &granary_io::IoCounters {
        self.0.counters()
    }
    fn describe(&self) -> String {
        "a memory device whose writes wait a poll".into()
    }
}

/// A PUT whose future is dropped while its record is written (a caller's
/// timeout) may still land, unindexed: it is listed as a version of its
/// key the index does not point at, so the key's next value carries the
/// supersedes flag (else that value, expired or evicted, would leave the
/// index with no tombstone, and a crash before the stray record's segment
/// is reclaimed would bring the older value back). Coalesced and not.
#[test]
fn a_put_dropped_while_written_lists_its_record() {
    for coalesce_writes in [true, false] {
        let dev = Arc::new(WritesWaitAPoll(granary_io::MemDevice::new(8 << 20)));
        let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), index_table_homes: Some(64) };
        let o = OpenOptions { coalesce_writes, background: Background::Manual, ..OpenOptions::default() };
        let s = Store::create(dev.clone(), &c, &o).unwrap();
        let h = s.core.keys.hash(b"k");
        let mut put = Box::pin(s.put_async(b"k", b"old"));
        let waker = std::task::Waker::noop();
        let polled = std::future::Future::poll(put.as_mut(), &mut std::task::Context::from_waker(waker));
        assert!(polled.is_pending(), "coalesce {coalesce_writes}: the write waits a poll");
        drop(put);
        assert!(s.core.keys.dropped.contains(h), "coalesce {coalesce_writes}: the stray record is not listed");
        s.put(b"k", b"new").unwrap();
        let new = granary_rt::block_on(s.core.find(b"k", h, false, true)).unwrap().expect("indexed");
        assert!(new.hdr.supersedes, "coalesce {coalesce_writes}");
        assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"new"[..]));
        s.close().unwrap();
    }
}

/// Zoned mode: a segment of the user stream closed while a record of it is
/// written but not yet indexed (held here for good) has its zones
/// finished once its writes have ended, not once that record is indexed:
/// the stream rolled through segment after segment meanwhile, each left
/// open, until the device refused to open another zone (its open-zone
/// limit is the two per stream the store asks for) and the store was
/// poisoned.
#[test]
fn zoned_segments_closed_with_records_unindexed_are_finished() {
    const ZONE: u64 = 64 << 10;
    // Segments start at 1 MiB: 16 zones before them, the first conventional.
    let dev = Arc::new(granary_io::zoned::ZonedDevice::new(16 + 24, ZONE, 4, 4).with_conventional(1));
    let create = CreateOptions { grain_bytes: Some(4096), segment_bytes: Some(ZONE), index_table_homes: Some(64) };
    let opts = OpenOptions { background: Background::Manual, ..OpenOptions::default() };
    let s = Store::create(dev.clone(), &create, &opts).unwrap();
    let big = vec![7u8; 40 << 10];
    for round in 0..6u64 {
        // A record written and never indexed: its allocation stays in flight.
        let key = format!("held-{round}");
        let hdr = RecordHeader::value(key.len(), 1, 1_000_000 + round, 0);
        s.core.write_record(crate::space::Purpose::Put, hdr, key.as_bytes(), b"v").unwrap();
        let before = s.core.space.used_segments().len();
        let mut i = 0;
        while s.core.space.used_segments().len() == before {
            s.put(format!("big-{round}-{i}").as_bytes(), &big).unwrap_or_else(|e| panic!("round {round}: {e}"));
            i += 1;
        }
        let (open, active) = dev.open_and_active();
        assert!(open <= 4 && active <= 4, "round {round}: {open} open, {active} active");
    }
    assert_eq!(dev.violations(), 0, "a zone rule was broken");
}

/// A batch a crash cut short (its records written, its commit record not)
/// followed after the restart by a batch whose commit record later rots:
/// recovery applies the second by the run of sequence numbers before its
/// commit record, and that run stops at the first (every open leaves a
/// number unused). The numbers ran on from the first batch's, and its
/// records were applied with the second's: a batch never acknowledged, and
/// dropped by the restart before, came back.
#[test]
fn a_rotten_commit_never_brings_back_a_batch_a_crash_cut_short() {
    let (dev, s) = mem_store(16 << 20, 64 << 10, 512);
    for k in [&b"a1"[..], b"a2", b"b1", b"b2"] {
        s.put(k, b"old").unwrap();
    }
    // Batch A: two records written, its commit record never.
    let first = s.core.log.next_seq.fetch_add(3, std::sync::atomic::Ordering::Relaxed);
    for (i, k) in [&b"a1"[..], b"a2"].into_iter().enumerate() {
        let mut hdr = RecordHeader::value(k.len(), 4, first + i as u64, 0);
        hdr.batch = true;
        let loc = s.core.write_record(crate::space::Purpose::Put, hdr, k, b"newA").unwrap();
        s.core.space.done(loc.seg);
    }
    drop(s); // the crash
    let s = Store::open(dev.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(s.stats().recovery.batches_dropped, 1);
    assert_eq!(s.get(b"a1").unwrap().as_deref(), Some(&b"old"[..]));
    // Batch B, right after A's records, then three segments of others.
    let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
    let mut b = s.batch();
    b.put(&d, b"b1", b"newB").put(&d, b"b2", b"newB");
    assert!(matches!(b.commit().unwrap(), BatchOutcome::Committed { .. }));
    let opened = s.stats().segments_opened;
    let mut i = 0;
    while s.stats().segments_opened < opened + 3 {
        s.put(format!("filler-{i}").as_bytes(), &[0u8; 4000]).unwrap();
        i += 1;
    }
    drop(d);
    drop(s); // a crash: the next open scans the log
    let commit_key = granary_format::batch::COMMIT_KEY;
    dev.with_bytes_mut(|bytes| {
        let at = bytes.windows(commit_key.len()).position(|w| w == commit_key).expect("B's commit record");
        bytes[at + commit_key.len() + 3] ^= 0x10;
    });
    let s = Store::open(dev.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(s.stats().recovery.checkpoint_id, 0, "a log scan");
    for k in [&b"b1"[..], b"b2"] {
        assert_eq!(s.get(k).unwrap().as_deref(), Some(&b"newB"[..]), "B is applied");
    }
    for k in [&b"a1"[..], b"a2"] {
        assert_eq!(s.get(k).unwrap().as_deref(), Some(&b"old"[..]), "A came back");
    }
}

/// An open that mends nothing a crash left (`clear_torn` off, as the CLI's
/// inspections open) takes no writes: they fail with `InvalidOptions`
/// (on a zoned device one met an unreset zone and poisoned the store).
#[test]
fn an_inspection_takes_no_writes() {
    let (dev, s) = mem_store(8 << 20, 1 << 20, 512);
    s.put(b"k", b"v").unwrap();
    drop(s);
    let s = Store::open(dev.clone(), &inspection()).unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    for r in [s.put(b"k", b"w"), s.delete(b"k").map(|_| ())] {
        assert!(matches!(&r, Err(Error::InvalidOptions(m)) if m.contains("inspection")), "{r:?}");
    }
    drop(s);
    let s = Store::open(dev.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    s.put(b"k", b"w").unwrap();
}
