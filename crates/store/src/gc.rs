//! Garbage collection: reclaim segments whose records were overwritten or
//! deleted (uDepot §4.1, SALSA), without ever losing or resurrecting data.
//!
//! **When.** A background thread collects when free segments fall below
//! the low watermark and stops at the high one (`Space::gc_wait`), and
//! whenever a writer finds no room and asks. Writers wait for space rather
//! than fail; they get `NoSpace` only when GC finds nothing to reclaim.
//!
//! **Victim.** Greedy on live bytes with aging, as in SALSA's circular
//! buffer: among closed segments, all but the [`age`] most recently closed
//! ones, take the one with the fewest live bytes (the oldest on ties), if
//! reclaiming it gains at least a grain. A just-filled segment is never
//! chosen at once: its data may be about to die anyway.
//!
//! **Room.** Relocation may use every free segment, except in a cache,
//! where cleaning (relocating instead of evicting) leaves the last one to
//! evictions (`Purpose::Clean`): an eviction writes at most a segment of
//! tombstones (each no larger than the record it stands for) and frees its
//! victim, so a cache can always evict.
//!
//! **Relocation.** The victim is read with large sequential reads (the
//! recovery scanner's windows; a helper thread reads the next window while
//! one is parsed, `recover::ReadAhead`). A record is live if the index still points
//! at its location. Live records are copied, in batches, to the relocation
//! stream (its own open segment, so cold relocated data and hot user writes
//! do not mix), keeping their sequence numbers: each batch takes the stripe
//! locks of its keys in order (so no user write or delete of those keys runs
//! meanwhile), re-checks liveness, writes the batch with as few IOs as its
//! placement allows, and then points the index at the copies.
//!
//! **Tombstones.** A tombstone is dropped instead of copied when no older
//! version of its key can be left on the device: its `tomb_horizon` (the
//! highest segment alloc_seq in use when it was written) is below the
//! alloc_seq of every other segment in use. Dead records are never copied,
//! so older versions can only sit in segments at or below the horizon.
//! (Keeping the segment of the deleted version only, as RAMCloud's rule
//! does, is not enough: a version older still may sit in a third segment.)
//!
//! **Expired and flushed values** are garbage too; the value itself is
//! never copied. If older versions of the key may still lie in other
//! segments (the record's `supersedes` flag: the key had, or may have had,
//! an indexed version when the value was written), it is replaced by a
//! tombstone (a new
//! sequence number, written to the relocation stream with the batch), so no
//! older version comes back after a crash; otherwise it is dropped.
//!
//! **Eviction** (cache mode, uDepot §4.8, DIDACache's quick clean): when
//! `Space::pick_victim` chooses to evict, the victim's live values leave
//! the index by the same rule: a value that is its key's only version on
//! the device is dropped with no IO at all; one that superseded an older
//! version becomes a tombstone. Tombstones already in the victim are kept
//! or dropped as above.
//!
//! **Damaged records** (header intact, body checksum wrong) are copied
//! marked as damaged copies (a header flag), so corruption stays reported,
//! and a crash cannot make the copy pass for a torn write.
//!
//! **Freeing.** Once nothing live is left in the victim, its header is
//! rewritten as free on the device (flushed in `Flush` mode), and only then
//! does the segment return to the free list. A crash before that leaves the
//! old records in place beside their copies, which carry the same sequence
//! numbers: recovery indexes the copies and lists the originals in
//! [`DroppedKeys`] until the victim is freed.

use crate::error::{Error, Result};
use crate::recover::SegmentScanner;
use crate::space::{GcWork, Purpose};
use crate::store::Core;
use granary_format::hash::key_hash;
use granary_format::record::{self, RecordHeader};
use granary_io::AlignedBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Live bytes gathered before a relocation batch is written.
const GC_BATCH_BYTES: usize = 1 << 20;

/// How many of the most recently closed segments GC leaves alone.
pub(crate) fn age(segments: u64) -> u64 {
    (segments / 16).max(1)
}

/// Hashes of keys that have a version in a segment which the index no
/// longer points at, per segment, until that segment is free on the
/// device: values GC dropped from a victim (see [`drop_value`]), values it
/// copied out of a victim (the original stays beside the copy, with the
/// same sequence number, until the victim is freed), and copies of one
/// record that recovery found twice (a crash between a copy and the
/// victim's free). Such a version could come back after a crash, so a new
/// value of the key carries the supersedes flag and a delete writes a
/// tombstone even when the index holds nothing for the key; and index
/// checkpoints replay these segments (`checkpoint::write`), so the next
/// recovery finds the versions again. A victim whose reclaim failed (no
/// room to relocate, an IO error) keeps its entries until a later reclaim
/// frees it. Writers check it on every write, so the empty case is one
/// atomic load.
#[derive(Default)]
pub(crate) struct DroppedKeys {
    sets: std::sync::Mutex<std::collections::HashMap<u32, std::collections::HashSet<u64>>>,
    len: std::sync::atomic::AtomicUsize,
}

impl DroppedKeys {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u32, std::collections::HashSet<u64>>> {
        self.sets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record that segment `v` holds a version of the key of hash `h`
    /// which the index does not point at; the caller holds its key's
    /// stripe (or, in recovery, nothing else runs).
    pub(crate) fn insert(&self, v: u32, h: u64) {
        self.insert_all(v, [h]);
    }

    fn insert_all(&self, v: u32, hs: impl IntoIterator<Item = u64>) {
        let mut s = self.lock();
        s.entry(v).or_default().extend(hs);
        self.len.store(s.values().map(|x| x.len()).sum(), Relaxed);
    }

    /// The segments listed.
    pub(crate) fn segments(&self) -> Vec<u32> {
        self.lock().keys().copied().collect()
    }

    /// Whether `h` was dropped from a victim not yet free; the caller holds
    /// its key's stripe, which orders this after the insert made under it.
    pub(crate) fn contains(&self, h: u64) -> bool {
        self.len.load(Relaxed) != 0 && self.lock().values().any(|x| x.contains(&h))
    }

    /// Victim `v` is free on the device: its dropped values are gone.
    pub(crate) fn freed(&self, v: u32) {
        let mut s = self.lock();
        s.remove(&v);
        self.len.store(s.values().map(|x| x.len()).sum(), Relaxed);
    }

    /// Hashes held, for tests.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Relaxed)
    }
}

/// GC counters (see [`GcStats`]).
#[derive(Default)]
pub(crate) struct GcCounters {
    victims: AtomicU64,
    records_relocated: AtomicU64,
    bytes_relocated: AtomicU64,
    tombstones_dropped: AtomicU64,
    nothing_to_reclaim: AtomicU64,
    expired: AtomicU64,
    evicted_segments: AtomicU64,
    evicted_values: AtomicU64,
}

/// What GC has done since the store was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcStats {
    /// Segments reclaimed.
    pub victims: u64,
    pub records_relocated: u64,
    pub bytes_relocated: u64,
    pub tombstones_dropped: u64,
    /// Times GC was asked for space and found no segment worth reclaiming.
    pub nothing_to_reclaim: u64,
    /// Expired values GC replaced with tombstones (store mode) or dropped
    /// (cache mode).
    pub expired: u64,
    /// Cache mode: segments evicted whole, and the live values they held.
    pub evicted_segments: u64,
    pub evicted_values: u64,
}

impl GcCounters {
    pub(crate) fn snapshot(&self) -> GcStats {
        GcStats {
            victims: self.victims.load(Relaxed),
            records_relocated: self.records_relocated.load(Relaxed),
            bytes_relocated: self.bytes_relocated.load(Relaxed),
            tombstones_dropped: self.tombstones_dropped.load(Relaxed),
            nothing_to_reclaim: self.nothing_to_reclaim.load(Relaxed),
            expired: self.expired.load(Relaxed),
            evicted_segments: self.evicted_segments.load(Relaxed),
            evicted_values: self.evicted_values.load(Relaxed),
        }
    }
}

/// The GC thread's body; returns when the store closes.
pub(crate) fn run(core: &Core) {
    // However this thread ends (a panic included), writers must stop
    // waiting for it: without GC, a full device is simply NoSpace.
    struct Gone<'a>(&'a Core);
    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            self.0.space.gc_gone();
        }
    }
    let _gone = Gone(core);
    loop {
        let req = match core.space.gc_wait() {
            GcWork::Exit => return,
            GcWork::Reclaim(req) => req,
        };
        if core.check_writable().is_err() {
            core.space.gc_found_nothing(req);
            continue;
        }
        let _no_verify = core.gc_lock.lock().unwrap_or_else(|e| e.into_inner());
        let Some((victim, evict)) = core.space.pick_victim(age(core.sb.segment_count), core.evict) else {
            core.gc_counters.nothing_to_reclaim.fetch_add(1, Relaxed);
            core.space.gc_found_nothing(req);
            continue;
        };
        let mut result = reclaim(core, victim, evict);
        // The segment `result` is about.
        let mut segment = victim;
        if core.evict && !evict && matches!(result, Err(Error::NoSpace { .. })) {
            // A cache with no room left to relocate into (no free segment:
            // a full device after a restart) evicts the victim instead of
            // refusing writers. Values written once leave it with no IO;
            // what it relocated already stays where it went.
            tracing::info!(victim, "no room to relocate: evicting the segment instead");
            result = reclaim(core, victim, true);
        }
        if core.evict && matches!(result, Err(Error::NoSpace { .. })) {
            // Evicting writes too: a tombstone for a value whose older
            // versions may remain, a tombstone still needed, the engine's
            // own keys. With no room for those, a segment whose eviction
            // writes nothing frees one: try the others, least recently
            // used first (each is read once; what the failed ones dropped
            // from the index stays dropped, as evicted). The case of a cache
            // reopened on a device with no free segment.
            for other in core.space.eviction_order(age(core.sb.segment_count), victim) {
                result = reclaim(core, other, true);
                segment = other;
                if result.is_ok() {
                    tracing::info!(victim, evicted = other, "no room to write for the victim: evicted another segment");
                }
                if !matches!(result, Err(Error::NoSpace { .. })) {
                    break;
                }
            }
        }
        match result {
            Ok(()) => {}
            Err(Error::NoSpace { .. }) => {
                tracing::warn!(victim, "GC has no room left to relocate live data");
                core.gc_counters.nothing_to_reclaim.fetch_add(1, Relaxed);
                core.space.gc_found_nothing(req);
            }
            Err(e @ Error::Io { .. }) => {
                // Writers see the store poisoned (not NoSpace) from now on.
                let e = core.poison(e);
                tracing::error!(segment, error = %e, "GC failed");
                core.space.gc_found_nothing(req);
            }
            Err(e) => {
                // This segment cannot be reclaimed; others may be.
                tracing::error!(segment, error = %e, "GC leaves a segment it cannot reclaim in place");
                core.space.pin(segment);
            }
        }
    }
}

/// Whether the index still points at `pba` for hash `h`.
fn points_at(core: &Core, h: u64, pba: u64) -> bool {
    core.index.contains(h, pba)
}

struct Pending {
    h: u64,
    old_pba: u64,
    /// Bytes (whole grains) of the record in the victim.
    old_len: u64,
    /// What to write: the record itself, or a tombstone for an expired value.
    hdr: RecordHeader,
    bytes: Vec<u8>,
    damaged: bool,
    /// Replaced by a tombstone because it expired, or because its segment
    /// is evicted.
    expired: bool,
    evicted: bool,
}

/// Remove the index entry of a live value at `pba` of victim `v` without
/// writing anything (cache-mode eviction); whether it was still there.
pub(crate) fn drop_value(core: &Core, v: u32, key: &[u8], pba: u64, len: u64) -> Result<bool> {
    let h = key_hash(key);
    let _stripe = core.lock_stripe(core.stripe_of(h));
    if !core.index.contains(h, pba) {
        // A blind overwrite may have displaced it since the scan: settled
        // now; if it is another key's live value, that is back in the index.
        let live = match core.links.of_old(pba) {
            Some((head, link)) => crate::links::settle(core, head, &link, key, h)?,
            None => false,
        };
        if !live {
            return Ok(false);
        }
    }
    // A head's link goes with it: the record it displaced is settled first
    // (a head carries the supersedes flag, so this is not expected).
    if let Some(link) = core.links.of_head(pba) {
        let (hdr, buf) = core.read_record(link.old, false)?;
        let key = record::key_of(&hdr, &buf);
        crate::links::settle(core, pba, &link, key, key_hash(key))?;
    }
    if !core.index.remove(h, pba) {
        return Ok(false);
    }
    // Until `v` is free on the device this version is still there: a new
    // value of the key written meanwhile must carry the supersedes flag,
    // and a delete must write a tombstone.
    core.dropped.insert(v, h);
    core.space.sub_live(v, len);
    core.counters.keys.fetch_sub(1, Relaxed);
    Ok(true)
}

/// Whether the record at `pba` (key `key`, hash `h`) of a victim is live,
/// asked under its stripe: indexed, or displaced by a link that settling
/// now finds it to be another key's (then it is indexed again).
fn settle_displaced(core: &Core, h: u64, pba: u64, key: &[u8]) -> Result<bool> {
    let _stripe = core.lock_stripe(core.stripe_of(h));
    if points_at(core, h, pba) {
        return Ok(true);
    }
    match core.links.of_old(pba) {
        Some((head, link)) => crate::links::settle(core, head, &link, key, h),
        None => Ok(false),
    }
}

/// Reclaim segment `v`: relocate what is live (or, with `evict`, drop its
/// values from the index), replace expired values by tombstones, drop dead
/// tombstones, free it.
pub(crate) fn reclaim(core: &Core, v: u32, evict: bool) -> Result<()> {
    // A helper thread reads the next window while this one is parsed.
    std::thread::scope(|sc| {
        let mut ahead = crate::recover::ReadAhead::start(sc, core.dev.as_ref());
        reclaim_reading_ahead(core, v, evict, &mut ahead)
    })
}

fn reclaim_reading_ahead(core: &Core, v: u32, evict: bool, ahead: &mut crate::recover::ReadAhead) -> Result<()> {
    let g = core.sb.grain_bytes as u64;
    let now = core.clock.now();
    let oldest_other = core.space.oldest_in_use_except(v);
    let mut evicted = 0u64;
    let mut scan =
        SegmentScanner::new(core.dev.as_ref(), &core.sb, core.seed, v, core.space.stamp(v)).reading_ahead(ahead);
    // A cache's cleaning leaves the last free segment to evictions.
    let purpose = if core.evict && !evict { Purpose::Clean } else { Purpose::Relocate };
    let mut batch = Vec::new();
    let mut batch_bytes = 0;
    while let Some(rec) = scan.next_record()? {
        let len = (rec.hdr.grains(core.sb.grain_bytes) * g) as usize;
        let bytes = &scan.bytes_at(rec.grain)[..len];
        let h = key_hash(record::key_of(&rec.hdr, bytes));
        let old_pba = core.space.pba(v, rec.grain);
        if !points_at(core, h, old_pba) {
            // Superseded or deleted: garbage, unless a blind overwrite of
            // another key displaced it (`crate::links`). Not indexed, then
            // not linked, then still not indexed is garbage: a displaced
            // record is linked before it leaves the index, and indexed
            // again before its link goes. Otherwise asked under the stripe.
            let garbage = core.links.of_old(old_pba).is_none() && !points_at(core, h, old_pba);
            if garbage || !settle_displaced(core, h, old_pba, record::key_of(&rec.hdr, bytes))? {
                continue;
            }
        }
        if rec.hdr.is_tombstone() && rec.hdr.tomb_horizon < oldest_other {
            let _stripe = core.lock_stripe(core.stripe_of(h));
            // A tombstone heading a link stays until the link is settled:
            // the record it displaced may be another key's.
            if core.links.of_head(old_pba).is_none() {
                if core.index.remove(h, old_pba) {
                    core.space.sub_live(v, len as u64);
                    core.counters.tombstones.fetch_sub(1, Relaxed);
                    core.gc_counters.tombstones_dropped.fetch_add(1, Relaxed);
                }
                continue;
            }
        }
        let damaged = !rec.intact || rec.hdr.damaged_copy;
        let expired = !rec.hdr.is_tombstone() && !damaged && core.hidden(&rec.hdr, now);
        // The engine's own keys (the flush floor) are never evicted.
        let reserved = record::key_of(&rec.hdr, bytes).starts_with(crate::store::RESERVED_KEY_PREFIX);
        // A value leaves the index when it expired (or was flushed), or when
        // its segment is evicted. If older versions of its key may remain
        // on the device it becomes a tombstone (else one of them would come
        // back after a crash); if not, it is simply dropped: no IO.
        let leaving = !rec.hdr.is_tombstone() && !reserved && (expired || evict);
        if leaving && !rec.hdr.supersedes {
            if drop_value(core, v, record::key_of(&rec.hdr, bytes), old_pba, len as u64)? {
                let c = if expired { &core.gc_counters.expired } else { &core.gc_counters.evicted_values };
                c.fetch_add(1, Relaxed);
                evicted += 1;
            }
            continue;
        }
        let (hdr, bytes) = if leaving {
            let key = record::key_of(&rec.hdr, bytes);
            let seq = core.next_seq.fetch_add(1, Relaxed);
            let t = RecordHeader::tombstone(key.len(), seq, 0, core.space.horizon());
            let mut out = vec![0u8; (t.grains(core.sb.grain_bytes) * g) as usize];
            t.encode(core.seed, key, &[], &mut out);
            (t, out)
        } else {
            (rec.hdr.clone(), bytes.to_vec())
        };
        batch_bytes += bytes.len();
        let evicted_here = leaving && !expired;
        batch.push(Pending { h, old_pba, old_len: len as u64, hdr, bytes, damaged, expired, evicted: evicted_here });
        if batch_bytes >= GC_BATCH_BYTES {
            relocate(core, v, purpose, &mut batch)?;
            batch_bytes = 0;
        }
    }
    relocate(core, v, purpose, &mut batch)?;
    // A writer that replaced an entry pointing into `v` subtracts the old
    // record's bytes from `v` after updating the index, under its stripe:
    // wait for all such writers, so the live bytes are settled.
    for i in 0..crate::store::KEY_STRIPES {
        drop(core.lock_stripe(i));
    }
    // Every link displacing a record of `v` was settled as the scan met
    // it, or when its record was about to be copied or dropped. One left
    // means a path missed it: settle it now (a read) rather than free the
    // record under it, and scan again if that put a live record back.
    let lo = core.space.pba(v, 0);
    let mut rescan = false;
    for link in core.links.displacing_in(lo, lo + core.sb.segment_grains()) {
        tracing::warn!(victim = v, displaced = link.old.pba(), "a link into a GC victim was left unsettled");
        debug_assert!(false, "a link into GC victim {v} was left unsettled: {link:?}");
        rescan |= crate::links::resolve_one(core, &link)?;
    }
    if rescan {
        return reclaim_reading_ahead(core, v, evict, ahead);
    }
    let left = core.space.live_of(v);
    if left != 0 {
        // An index entry points at something the scan could not read as a
        // record: keep the segment rather than lose the evidence.
        return Err(Error::Corruption {
            offset: core.sb.segment_offset(v),
            detail: format!("segment {v} keeps {left} live bytes that GC could not read as records"),
        });
    }
    core.space.free_segment(v)?;
    // Only now (the free header is on the device, flushed in Flush mode)
    // are the values dropped from `v` gone; if reclaim failed above they
    // stay listed until a later reclaim of `v` gets here.
    core.dropped.freed(v);
    core.gc_counters.victims.fetch_add(1, Relaxed);
    if evict {
        core.gc_counters.evicted_segments.fetch_add(1, Relaxed);
        tracing::debug!(segment = v, values = evicted, "evicted segment");
    }
    Ok(())
}

/// Copy a batch of live records of segment `v` to the relocation stream and
/// point the index at the copies.
fn relocate(core: &Core, v: u32, purpose: Purpose, batch: &mut Vec<Pending>) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let g = core.sb.grain_bytes as u64;
    let mut stripes: Vec<usize> = batch.iter().map(|p| core.stripe_of(p.h)).collect();
    stripes.sort_unstable();
    stripes.dedup();
    let _guards: Vec<_> = stripes.iter().map(|&i| core.lock_stripe(i)).collect();
    let mut kept = Vec::with_capacity(batch.len());
    for p in batch.drain(..) {
        let live = points_at(core, p.h, p.old_pba)
            // A blind overwrite of another key displaced it since the scan.
            || match core.links.of_old(p.old_pba) {
                Some((head, link)) => crate::links::settle(core, head, &link, record::key_of(&p.hdr, &p.bytes), p.h)?,
                None => false,
            };
        if live {
            kept.push(p);
        }
    }
    *batch = kept;
    // The originals of the values copied stay in `v` until it is freed.
    // Listed before any copy is indexed, so a checkpoint that sees a copy
    // also sees `v` listed (see [`DroppedKeys`]).
    core.dropped.insert_all(v, batch.iter().filter(|p| !p.hdr.is_tombstone()).map(|p| p.h));

    // Place every record; consecutive placements form one write.
    let mut placed = Vec::with_capacity(batch.len());
    let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut alloc_err = None;
    for p in batch.iter_mut() {
        let grains = p.bytes.len() as u64 / g;
        let loc = match core.space.alloc(purpose, grains, core.next_seq.load(Relaxed)) {
            Ok(loc) => loc,
            Err(e) => {
                alloc_err = Some(e);
                break;
            }
        };
        record::restamp(core.seed, &p.hdr, &mut p.bytes, loc.stamp, p.damaged);
        match runs.last_mut() {
            Some((start, bytes)) if *start + bytes.len() as u64 / g == loc.pba => bytes.extend_from_slice(&p.bytes),
            _ => runs.push((loc.pba, p.bytes.clone())),
        }
        placed.push(loc);
    }
    let written = write_runs(core, runs);
    if let Err(e) = written {
        for loc in &placed {
            core.space.done(loc.seg);
        }
        return Err(e);
    }
    for (p, loc) in batch.iter().zip(&placed) {
        let kv_size = if p.hdr.is_tombstone() { 0 } else { loc.grains };
        let moved =
            crate::links::carry(core, p.old_pba, loc.pba, || core.index.replace(p.h, p.old_pba, kv_size, loc.pba));
        assert!(moved, "a live record changed while its stripe was held");
        core.space.sub_live(v, p.old_len);
        core.space.add_live(loc.seg, p.bytes.len() as u64);
        core.space.done(loc.seg);
        if p.expired || p.evicted {
            core.counters.replaced(false, true);
            let c = if p.expired { &core.gc_counters.expired } else { &core.gc_counters.evicted_values };
            c.fetch_add(1, Relaxed);
        } else {
            core.gc_counters.records_relocated.fetch_add(1, Relaxed);
            core.gc_counters.bytes_relocated.fetch_add(p.bytes.len() as u64, Relaxed);
        }
    }
    batch.clear();
    match alloc_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Write relocation runs (each one IO), then flush in `Flush` mode.
fn write_runs(core: &Core, runs: Vec<(u64, Vec<u8>)>) -> Result<()> {
    let g = core.sb.grain_bytes as u64;
    for (pba, bytes) in runs {
        let mut buf = AlignedBuf::zeroed(bytes.len());
        buf.copy_from_slice(&bytes);
        let offset = pba * g;
        let (_, r) = core.dev.write_at(buf, offset);
        r.map_err(|source| Error::Io { op: "GC relocation write", offset, source })?;
    }
    if core.durability == crate::options::Durability::Flush {
        core.dev.flush().map_err(|source| Error::Io { op: "flush", offset: 0, source })?;
    }
    Ok(())
}
