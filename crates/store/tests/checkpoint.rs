//! Index checkpoints: clean restarts read no log, crashes after a checkpoint
//! replay what came later, damaged checkpoints fall back, checkpoints run
//! beside writers, and IO errors (EIO, failed flush) poison writes only.

mod common;

use granary_store::io::{Device, FaultDevice, OpKind, OpenMode, TestDevice};
use granary_store::{CreateOptions, Durability, Error, OpenOptions, Store};
use std::collections::HashMap;
use std::sync::Arc;

/// In memory, an O_DIRECT file on io_uring with GRANARY_TEST_BACKEND=uring,
/// or an emulated zoned device of [`create_opts`]'s segments with
/// GRANARY_TEST_BACKEND=zoned.
fn test_device(size: u64) -> Arc<TestDevice> {
    let dev = TestDevice::new(size, std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    dev.shape_zones(create_opts().segment_bytes.unwrap());
    Arc::new(dev)
}

fn create_opts() -> CreateOptions {
    CreateOptions { grain_bytes: Some(512), segment_bytes: Some(256 << 10), index_table_homes: Some(64) }
}

fn opts() -> OpenOptions {
    OpenOptions { checkpoint_interval: None, ..OpenOptions::default() }
}

fn key(i: u64) -> Vec<u8> {
    format!("k{i:05}").into_bytes()
}

fn val(i: u64, v: u64) -> Vec<u8> {
    format!("{i}-{v}-").repeat(1 + (i as usize * 7 + v as usize) % 40).into_bytes()
}

/// Every key of `model` (and only those) in `s`.
fn check_values(s: &Store, model: &HashMap<u64, u64>, keys: u64) {
    for i in 0..keys {
        assert_eq!(s.get(&key(i)).unwrap(), model.get(&i).map(|&v| val(i, v)), "key {i}");
    }
    assert_eq!(s.stats().keys, model.len() as u64);
}

fn check(s: &Store, model: &HashMap<u64, u64>, keys: u64) {
    check_values(s, model, keys);
    let r = s.verify().unwrap();
    assert!(r.is_clean(), "{:?}", r.errors);
}

#[test]
fn clean_close_restarts_from_the_checkpoint_without_reading_the_log() {
    let dev = test_device(32 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts()).unwrap();
    let mut model = HashMap::new();
    for i in 0..2000 {
        s.put(&key(i), &val(i, 1)).unwrap();
        model.insert(i, 1);
    }
    for i in (0..2000).step_by(3) {
        assert!(s.delete(&key(i)).unwrap());
        model.remove(&i);
    }
    s.close().unwrap();
    let reads_before = dev.counters().snapshot().read_bytes;
    let s = Store::open(dev.clone(), &opts()).unwrap();
    let r = s.stats().recovery;
    assert!(r.clean_shutdown, "{r:?}");
    assert_ne!(r.checkpoint_id, 0);
    assert_eq!(r.segments_scanned, 0, "no log replayed");
    assert_eq!(r.checkpoint_entries, 2000, "values and tombstones");
    // Opening read headers and the checkpoint, far less than the log.
    let read = dev.counters().snapshot().read_bytes - reads_before;
    assert!(read < 1 << 20, "a clean open read {read} bytes");
    check(&s, &model, 2000);

    // Writes after a clean restart, then a crash: they are replayed, even
    // though the clean checkpoint is still the newest.
    for i in 0..500 {
        s.put(&key(i), &val(i, 2)).unwrap();
        model.insert(i, 2);
    }
    drop(s);
    let s = Store::open(dev.clone(), &opts()).unwrap();
    let r = s.stats().recovery;
    assert!(!r.clean_shutdown && r.checkpoint_id != 0 && r.segments_scanned > 0, "{r:?}");
    check(&s, &model, 2000);
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_an_older_one_or_a_scan() {
    let dev = test_device(32 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts()).unwrap();
    let mut model = HashMap::new();
    for i in 0..1500 {
        s.put(&key(i), &val(i, 1)).unwrap();
        model.insert(i, 1);
    }
    s.close().unwrap();
    let s = Store::open(dev.clone(), &opts()).unwrap();
    let first = s.stats().recovery.checkpoint_id;
    for i in 0..700 {
        s.put(&key(i), &val(i, 2)).unwrap();
        model.insert(i, 2);
    }
    let ck = s.checkpoint().unwrap();
    assert!(ck.current_id > first);
    let seg = s.stats().segment_bytes;
    drop(s);
    // Flip a byte in the body of the newest checkpoint.
    let sb_seg_off = |i: u64| (1u64 << 20) + i * seg;
    let mut hit = false;
    dev.with_bytes_mut(|b| {
        for i in 0..b.len() as u64 / seg - 4 {
            let o = sb_seg_off(i) as usize;
            // Segment header: kind at byte 6 (2 = index), alloc_seq at 8.
            let kind = b[o + 6];
            let alloc = u64::from_le_bytes(b[o + 8..o + 16].try_into().unwrap());
            if b[o..o + 4] == *b"GSEG" && kind == 2 && alloc == ck.current_id {
                b[o + 512 * 3 + 5] ^= 0xFF; // in the body
                hit = true;
            }
        }
    });
    assert!(hit, "found the newest checkpoint");
    let s = Store::open(dev.clone(), &opts()).unwrap();
    let r = s.stats().recovery;
    assert!(r.checkpoint_id != ck.current_id, "the damaged checkpoint was not used: {r:?}");
    assert!(r.segments_scanned > 0);
    check(&s, &model, 1500);
}

#[test]
fn checkpoints_run_beside_writers_and_gc() {
    let dev = test_device(8 << 20);
    let s = Arc::new(Store::create(dev.clone(), &create_opts(), &opts()).unwrap());
    let threads = 3u64;
    let per = 400u64;
    // Checkpoints written so far: the writers wait for the first before
    // their fifth round and the second before their ninth (bounded), so
    // checkpoints fall between writes however the threads are scheduled.
    let written = std::sync::atomic::AtomicU64::new(0);
    let models: Vec<HashMap<u64, u64>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let s = s.clone();
                let written = &written;
                sc.spawn(move || {
                    let mut m = HashMap::new();
                    for v in 1..=12u64 {
                        let want = match v {
                            5 => 1,
                            9 => 2,
                            _ => 0,
                        };
                        common::wait_until(|| written.load(std::sync::atomic::Ordering::SeqCst) >= want);
                        for j in 0..per {
                            let i = t * per + j;
                            if (i + v).is_multiple_of(5) {
                                s.delete(&key(i)).unwrap();
                                m.remove(&i);
                            } else {
                                s.put(&key(i), &val(i, v)).unwrap();
                                m.insert(i, v);
                            }
                        }
                    }
                    m
                })
            })
            .collect();
        while hs.iter().any(|h| !h.is_finished()) {
            match s.checkpoint() {
                Ok(_) => _ = written.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
                Err(Error::NoSpace { .. }) => {}
                Err(e) => panic!("checkpoint: {e}"),
            }
        }
        let written = written.load(std::sync::atomic::Ordering::SeqCst);
        assert!(written >= 2, "checkpoints ran during the writes: {written}");
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let model: HashMap<u64, u64> = models.into_iter().flatten().collect();
    assert!(s.stats().gc.victims > 0, "GC ran");
    s.checkpoint().ok();
    drop(s); // crash
    let s = Store::open(dev.clone(), &opts()).unwrap();
    assert_ne!(s.stats().recovery.checkpoint_id, 0);
    check(&s, &model, threads * per);
    // Same answer from a full scan.
    drop(s);
    let s = Store::open(dev.clone(), &OpenOptions { use_checkpoint: false, ..opts() }).unwrap();
    assert_eq!(s.stats().recovery.checkpoint_id, 0);
    check(&s, &model, threads * per);
}

#[test]
fn failed_flush_poisons_writes_reads_go_on_and_reopen_heals() {
    let dev = Arc::new(FaultDevice::new(16 << 20, 9));
    let flush = OpenOptions { durability: Durability::Flush, ..opts() };
    let s = Store::create(dev.clone(), &create_opts(), &flush).unwrap();
    s.put(b"a", b"1").unwrap();
    dev.fail_nth(OpKind::Flush, 0, false);
    let err = s.put(b"b", b"2").unwrap_err();
    assert!(matches!(err, Error::Io { op: "flush", .. }), "{err}");
    let err = s.put(b"c", b"3").unwrap_err();
    assert!(matches!(err, Error::Poisoned { .. }) && err.to_string().contains("flush"), "{err}");
    assert!(matches!(s.checkpoint(), Err(Error::Poisoned { .. })));
    assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    // Closing a poisoned store writes no checkpoint and reports nothing new.
    drop(s);
    let s = Store::open(dev.clone(), &flush).unwrap();
    s.put(b"c", b"3").unwrap();
    assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    // EIO in the middle of a checkpoint: the checkpoint fails, the store
    // refuses writes, and the previous state is intact after a reopen.
    dev.fail_nth(OpKind::Write, 1, false);
    assert!(matches!(s.checkpoint(), Err(Error::Io { .. })));
    assert!(matches!(s.put(b"d", b"4"), Err(Error::Poisoned { .. })));
    drop(s);
    let s = Store::open(dev.clone(), &flush).unwrap();
    assert_eq!(s.get(b"c").unwrap().as_deref(), Some(&b"3"[..]));
    assert!(s.verify().unwrap().is_clean());
}

#[test]
fn log_scan_reads_headers_and_keys_of_large_values_only() {
    if common::skip_zoned("4 MiB segments (for 1.9 MB values): they start at 1 MiB, which 4 MiB zones do not divide") {
        return;
    }
    let dev = test_device(128 << 20);
    let create = CreateOptions { grain_bytes: Some(4096), segment_bytes: Some(4 << 20), index_table_homes: Some(64) };
    let s = Store::create(dev.clone(), &create, &opts()).unwrap();
    let big = |i: u64| vec![i as u8; 1_900_000 + i as usize];
    for i in 0..40 {
        s.put(&key(i), &big(i)).unwrap();
    }
    let written = s.stats().io.written_bytes;
    drop(s);
    let s = Store::open(dev.clone(), &OpenOptions { use_checkpoint: false, ..opts() }).unwrap();
    let r = s.stats().recovery;
    assert!(r.bytes_read * 2 < written, "the scan read {} of {} bytes written: {r:?}", r.bytes_read, written);
    for i in 0..40 {
        assert_eq!(s.get(&key(i)).unwrap(), Some(big(i)), "key {i}");
    }
    assert!(s.verify().unwrap().is_clean());
}

/// A scan-based open (checkpoints ignored, or the newest one unreadable for
/// a moment) must not resume the segment a still-valid clean checkpoint
/// says needs no replay, or a crash loses its writes at the next
/// checkpoint-based open.
#[test]
fn regression_writes_after_a_scan_based_open_survive_a_clean_checkpoint() {
    let dev = test_device(16 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts()).unwrap();
    for i in 0..50 {
        s.put(&key(i), &val(i, 1)).unwrap();
    }
    s.close().unwrap(); // clean checkpoint
    let s = Store::open(dev.clone(), &OpenOptions { use_checkpoint: false, ..opts() }).unwrap();
    s.put(&key(1), &val(1, 2)).unwrap();
    assert!(s.delete(&key(2)).unwrap());
    drop(s); // crash
    let s = Store::open(dev.clone(), &opts()).unwrap();
    assert!(!s.stats().recovery.clean_shutdown);
    assert_eq!(s.get(&key(1)).unwrap(), Some(val(1, 2)));
    assert_eq!(s.get(&key(2)).unwrap(), None);
}

/// A store on a RAID-0 stripe set named by a comma-separated path: created,
/// written, closed, reopened with its members named in another order, and
/// crash-recovered (checkpoints ignored: the log scan reads across members).
#[test]
fn store_on_a_stripe_set_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let m: Vec<String> = (0..3).map(|i| dir.path().join(format!("m{i}")).display().to_string()).collect();
    let path = std::path::PathBuf::from(m.join(","));
    let create = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: Some(64) };
    let s = Store::create_path(&path, 24 << 20, OpenMode::Direct, &create, &OpenOptions::default()).unwrap();
    assert!(s.stats().device.starts_with("RAID-0 of 3 members"), "{}", s.stats().device);
    let val = |i: usize| vec![(i % 251) as u8; 100 + (i * 37) % 3000];
    for i in 0..2000 {
        s.put(format!("k{i}").as_bytes(), &val(i)).unwrap();
    }
    s.close().unwrap();
    let other_order = std::path::PathBuf::from(format!("{},{},{}", m[2], m[0], m[1]));
    let s = Store::open_path(&other_order, OpenMode::Direct, &OpenOptions::default()).unwrap();
    assert!(s.stats().recovery.clean_shutdown);
    for i in (0..2000).step_by(7) {
        assert_eq!(s.get(format!("k{i}").as_bytes()).unwrap(), Some(val(i)), "key {i}");
    }
    drop(s);
    let scan = OpenOptions { use_checkpoint: false, ..OpenOptions::default() };
    let s = Store::open_path(&path, OpenMode::Direct, &scan).unwrap();
    assert_eq!(s.stats().keys, 2000);
    assert!(s.verify().unwrap().is_clean());
    drop(s);
    // A missing member is named.
    let two = std::path::PathBuf::from(format!("{},{}", m[0], m[1]));
    let e = Store::open_path(&two, OpenMode::Direct, &OpenOptions::default()).err().unwrap().to_string();
    assert!(e.contains("missing member(s) 2"), "{e}");
}

/// A store of 1,200 keys closed cleanly, opened once from its checkpoint:
/// the device, the model of its values, the checkpoint's id.
fn checkpointed_store() -> (Arc<TestDevice>, HashMap<u64, u64>, u64) {
    let dev = test_device(32 << 20);
    let s = Store::create(dev.clone(), &create_opts(), &opts()).unwrap();
    let mut model = HashMap::new();
    for i in 0..1200 {
        s.put(&key(i), &val(i, 1)).unwrap();
        model.insert(i, 1);
    }
    s.close().unwrap();
    let s = Store::open(dev.clone(), &opts()).unwrap();
    let id = s.stats().recovery.checkpoint_id;
    assert!(id != 0 && s.stats().recovery.segments_scanned == 0);
    (dev, model, id)
}

/// Run `patch` on the device's bytes with the offsets of checkpoint
/// `id`'s first segment and of its manifest (grain 1), then seal the
/// manifest's CRC again (at 124, over 0..124 and 128..its length, which is
/// at 84); exactly one manifest must be found.
fn patch_checkpoint(dev: &TestDevice, id: u64, patch: impl FnMut(&mut [u8], usize, usize)) {
    assert_eq!(patch_checkpoint_if_present(dev, id, patch), 1, "found the checkpoint's manifest");
}

/// [`patch_checkpoint`] if checkpoint `id` is still on the device: how
/// many manifests were patched (0 or 1).
fn patch_checkpoint_if_present(dev: &TestDevice, id: u64, mut patch: impl FnMut(&mut [u8], usize, usize)) -> usize {
    use granary_format::checksum::{crc32c, crc32c_append};
    let seg = create_opts().segment_bytes.unwrap();
    let mut patched = 0;
    dev.with_bytes_mut(|b| {
        for i in 0..b.len() as u64 / seg - 4 {
            let o = ((1u64 << 20) + i * seg) as usize;
            let alloc = u64::from_le_bytes(b[o + 8..o + 16].try_into().unwrap());
            if b[o..o + 4] == *b"GSEG" && b[o + 6] == 2 && alloc == id {
                let m = o + 512;
                patch(b, o, m);
                let len = u32::from_le_bytes(b[m + 84..m + 88].try_into().unwrap()) as usize;
                let crc = crc32c_append(crc32c(&b[m..m + 124]), &b[m + 128..m + len]);
                b[m + 124..m + 128].copy_from_slice(&crc.to_le_bytes());
                patched += 1;
            }
        }
    });
    patched
}

/// Open `dev` (on a thread of its own: an open that never returns fails
/// the test) and expect checkpoint `id` refused, the log scanned, every
/// value of `model` there, and `verify` naming the checkpoint when
/// `verify_names_it` (a manifest that does not decode names none).
fn assert_refused_and_scanned(dev: &Arc<TestDevice>, id: u64, model: &HashMap<u64, u64>, verify_names_it: bool) {
    let (tx, rx) = std::sync::mpsc::channel();
    let d = dev.clone();
    std::thread::spawn(move || tx.send(Store::open(d, &opts()).map_err(|e| e.to_string())));
    let s = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("the open returned").unwrap();
    let r = s.stats().recovery;
    assert!(r.checkpoint_id != id && r.segments_scanned > 0, "the damaged checkpoint was not used: {r:?}");
    check_values(&s, model, 1200);
    // Until a checkpoint replaces it, verify names it (one that does not
    // decode is no checkpoint at all).
    // On a zoned device this open (for writing) reset the zones of the
    // refused checkpoint, free to it: nothing is left to name.
    let r = s.verify().unwrap();
    let named = verify_names_it && dev.zoned().is_none();
    assert_eq!(r.checkpoint_unusable, None);
    assert_eq!(r.errors.len(), named as usize, "{:?}", r.errors);
    assert!(r.errors.iter().all(|e| e.contains(&format!("checkpoint {id} "))), "{:?}", r.errors);
}

/// A checkpoint of an older version (2: index entries whose hop-hint bits
/// were record-size bits) is refused by name, even with a valid checksum,
/// and the store rebuilds its index by a log scan with every value.
#[test]
fn an_older_checkpoint_version_is_refused_and_the_log_is_scanned() {
    let (dev, model, id) = checkpointed_store();
    // The manifest's version at 4.
    patch_checkpoint(&dev, id, |b, _, m| {
        assert_eq!(u16::from_le_bytes([b[m + 4], b[m + 5]]), 3, "this build writes version 3");
        b[m + 4..m + 6].copy_from_slice(&2u16.to_le_bytes());
    });
    assert_refused_and_scanned(&dev, id, &model, false);
}

/// A checkpoint of a version this build does not read (another build's)
/// counts in the replay floor by its id: this build's writes after its
/// scan-based open must not go into a segment tail that checkpoint would
/// not replay, or the build that reads it loses them after a crash (here:
/// the version patched to a newer one, then back, as that build finds it).
#[test]
fn writes_after_refusing_another_version_s_checkpoint_survive_it() {
    let (dev, mut model, id) = checkpointed_store();
    let set_version =
        |v: u16| patch_checkpoint_if_present(&dev, id, |b, _, m| b[m + 4..m + 6].copy_from_slice(&v.to_le_bytes()));
    assert_eq!(set_version(4), 1);
    let s = Store::open(dev.clone(), &opts()).unwrap();
    assert_ne!(s.stats().recovery.checkpoint_id, id);
    s.put(&key(1), &val(1, 2)).unwrap();
    model.insert(1, 2);
    assert!(s.delete(&key(2)).unwrap());
    model.remove(&2);
    drop(s); // crash
             // The checkpoint's segments were free to this build: they may have
             // been written over (then the other build scans the log).
    let present = set_version(3) == 1;
    let s = Store::open(dev.clone(), &opts()).unwrap();
    assert_eq!(s.stats().recovery.checkpoint_id == id, present);
    check_values(&s, &model, 1200);
}

/// A checkpoint whose checksums hold but one of whose entries names a home
/// past the index table's is refused (no hash reaches such a home), and
/// the store rebuilds its index by a log scan with every value. Before, the
/// load spun forever placing that entry.
#[test]
fn a_checkpoint_entry_past_the_table_is_refused_and_the_log_is_scanned() {
    use granary_format::checksum::crc32c;
    let (dev, model, id) = checkpointed_store();
    let seg = create_opts().segment_bytes.unwrap() as usize;
    patch_checkpoint(&dev, id, |b, o, m| {
        let (body, body_end) = body_of(b, o, m, seg);
        b[body + 8..body + 12].copy_from_slice(&0xFFFF_0000u32.to_le_bytes()); // the first item's home
        let crc = crc32c(&b[body..body_end]);
        b[m + 80..m + 84].copy_from_slice(&crc.to_le_bytes());
    });
    assert_refused_and_scanned(&dev, id, &model, true);
}

/// The body of the checkpoint whose first segment is at `o` and manifest
/// at `m` (as [`patch_checkpoint`] gives them), in a store of `seg`-byte
/// segments: its start and end, checked against the manifest's CRC.
fn body_of(b: &[u8], o: usize, m: usize, seg: usize) -> (usize, usize) {
    use granary_format::checksum::crc32c;
    // Entries at 56, segment_count at 76, body_crc at 80; the body after
    // the grains a manifest of every segment may take.
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let entries = u64::from_le_bytes(b[m + 56..m + 64].try_into().unwrap()) as usize;
    let segments = u32_at(b, m + 76) as usize;
    let body = o + 512 * (1 + (128 + 12 * segments).div_ceil(512));
    let body_end = body + 16 * entries;
    assert!(body_end <= o + seg, "the body lies in the first segment");
    assert_eq!(crc32c(&b[body..body_end]), u32_at(b, m + 80), "found the body");
    (body, body_end)
}

/// `verify` reports the newest checkpoint when it fails its checks (a
/// body byte flipped, so its checksum fails; a manifest of another
/// geometry, its own checksum holding): damage, since the body is flushed
/// before the manifest is written, which opens skip (scanning the log
/// here); listed, not an error, on a zoned device, where the manifest goes
/// first. Before, verify said nothing of it; then, for a while, a refusal
/// before the body's first chunk was read (the geometry, a read error)
/// was listed rather than reported.
#[test]
fn verify_reports_a_damaged_newest_checkpoint() {
    type Damage = fn(&mut [u8], usize, usize, usize);
    let flip_body: Damage = |b, o, m, seg| {
        let (body, _) = body_of(b, o, m, seg);
        b[body + 3] ^= 0x10; // an item's entry; the body's CRC left as it was
    };
    let other_geometry: Damage = |b, _, m, _| b[m + 68] ^= 1; // table_homes
    for (damage, says) in [(flip_body, "body checksum mismatch"), (other_geometry, "was written for another geometry")]
    {
        let (dev, model, id) = checkpointed_store();
        let seg = create_opts().segment_bytes.unwrap() as usize;
        // Opened as `granary verify` opens it: nothing written.
        let inspect = OpenOptions { clear_torn: false, gc: false, checkpoint_on_close: false, ..opts() };
        let report = Store::open(dev.clone(), &inspect).unwrap().verify().unwrap();
        assert!(report.is_clean(), "{:?}", report.errors);
        patch_checkpoint(&dev, id, |b, o, m| damage(b, o, m, seg));
        let s = Store::open(dev.clone(), &inspect).unwrap();
        assert_ne!(s.stats().recovery.checkpoint_id, id, "the open skipped it");
        let report = s.verify().unwrap();
        let named = format!("checkpoint {id} {says}");
        if dev.zoned().is_some() {
            // Manifest first there: a crash leaves such a checkpoint, so it
            // is listed, not an error.
            assert!(report.is_clean(), "{:?}", report.errors);
            assert!(report.checkpoint_unusable.as_ref().is_some_and(|c| c.contains(&named)), "{report:?}");
        } else {
            assert!(report.errors.iter().any(|e| e.contains(&named)), "{says}: {:?}", report.errors);
            assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
            assert_eq!(report.checkpoint_unusable, None);
        }
        check_values(&s, &model, 1200);
    }
}

/// A checkpoint placed by another key hash than the superblock names ends
/// the search for one: with an older checkpoint of this hash still on the
/// device (its release lost), the open scans the log rather than load the
/// older one (whatever wrote the newer one did not keep the older one's
/// replay floor), and every value is there. Before, the older one loaded.
#[test]
fn a_checkpoint_of_another_hash_makes_the_open_scan_not_load_an_older_one() {
    let (dev, mut model, id) = checkpointed_store();
    let seg = create_opts().segment_bytes.unwrap() as usize;
    let mut kept = None;
    patch_checkpoint(&dev, id, |b, o, _| kept = Some((o, b[o..o + seg].to_vec())));
    let s = Store::open(dev.clone(), &opts()).unwrap();
    for i in 0..50 {
        s.put(&key(i), &val(i, 2)).unwrap();
        model.insert(i, 2);
    }
    s.close().unwrap();
    // Opened to read its id, closed without another.
    let look = OpenOptions { checkpoint_on_close: false, ..opts() };
    let newer = Store::open(dev.clone(), &look).unwrap().stats().recovery.checkpoint_id;
    assert!(newer > id, "a newer checkpoint ({newer} after {id})");
    // The older checkpoint back, as if its release had been lost; the
    // newer one's hash check another store's.
    let (o, bytes) = kept.unwrap();
    dev.with_bytes_mut(|b| b[o..o + seg].copy_from_slice(&bytes));
    patch_checkpoint(&dev, newer, |b, _, m| b[m + 88] ^= 2);
    let s = Store::open(dev.clone(), &opts()).unwrap();
    let r = s.stats().recovery;
    assert!(r.checkpoint_id == 0 && r.segments_scanned > 0, "a checkpoint was loaded: {r:?}");
    check(&s, &model, 1200);
}
