//! Garbage collection: reclaim segments whose records were overwritten or
//! deleted (log-structured cleaning, as in uDepot and SALSA), without ever
//! losing or resurrecting data.
//!
//! **When.** A background thread collects when free segments fall below
//! the low watermark and stops at the high one (`Space::gc_wait`), and
//! whenever a writer finds no room and asks. Writers wait for space rather
//! than fail; they get `NoSpace` only when GC finds nothing to reclaim.
//! With [`crate::Watermark::Compact`] it also compacts between bursts of
//! writes ([`compact`]): relocating, never evicting, until there is room
//! for the next burst.
//!
//! **Victim.** Among closed segments, all but the [`age`] most recently
//! closed ones, whose reclaim gains at least 1/16 of a segment, the best
//! by the policy ([`crate::GcPolicy`], `Space::pick_victim`): LFS's
//! cost-benefit `(1 - u) * age / (1 + u)` (the default), or greedy, the
//! fewest live bytes. A just-filled segment is never chosen at once: its
//! data may be about to die anyway.
//!
//! **Room.** Relocation may use every free segment, except in a cache,
//! where cleaning (relocating instead of evicting) leaves the last one to
//! evictions (`Purpose::Clean`): an eviction writes at most a segment of
//! tombstones (each no larger than the record it stands for) and frees its
//! victim, so a cache can always evict.
//!
//! **Relocation.** The victim is read with large sequential reads (the
//! recovery scanner's windows; a helper thread reads the next window while
//! one is parsed, `log::ReadAhead`), or, when little of it can matter,
//! sparsely: only the records the index or a link points at ([`reclaim`]). A record is live if the index still points
//! at its location. Live records are copied, in batches, to the relocation
//! stream (its own open segment, so cold relocated data and hot user writes
//! do not mix), keeping their sequence numbers: each batch takes the stripe
//! locks of its keys in order (so no user write or delete of those keys runs
//! meanwhile), re-checks liveness, writes the batch with as few IOs as its
//! placement allows, and then points the index at the copies. With
//! hot/cold separation (`OpenOptions::gc_hot_cold`), a record older than [`cold_after`]
//! (in sequence numbers, which copies keep) goes to a third stream, the
//! cold one: data that has outlived an average key's lifetime is not
//! mixed with younger survivors, which still die sooner. With SepBIT
//! placement (`OpenOptions::gc_sepbit`) the stream comes from
//! [`Space::relocation_stream`](crate::space::Space::relocation_stream)
//! instead: by the victim's stream and the record's age.
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
//! **Eviction** (cache mode; merged with GC, as in uDepot's cache and
//! DIDACache's quick clean): when
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
//! [`DroppedKeys`](crate::keys::DroppedKeys) until the victim is freed.

use crate::counters::Counted;
use crate::error::{Error, Result};
use crate::log::SegmentScanner;
use crate::nskey::Fate;
use crate::options::Clock;
use crate::parts::Parts;
use crate::settle;
use crate::space::{listed_bytes, GcWork, Purpose, Space};
use crate::types::GcStats;
use granary_format::record::{self, RecordHeader};
use granary_format::segment::Stream;
use granary_format::summary;
use granary_format::superblock::FLAG_SUMMARIES;
use granary_io::AlignedBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Live bytes gathered before a relocation batch is written.
const GC_BATCH_BYTES: usize = 1 << 20;

/// How many of the most recently closed segments GC leaves alone.
pub(crate) fn age(segments: u64) -> u64 {
    (segments / 16).max(1)
}

/// What GC works with: the engine's shared parts (it dereferences to
/// them), its own counters and lock, and the policy it follows.
#[derive(Clone, Copy)]
pub(crate) struct Gc<'a> {
    pub parts: Parts<'a>,
    pub stats: &'a GcCounters,
    /// Held while a segment is reclaimed; `verify` holds it throughout, so
    /// it never sees records move under it.
    pub lock: &'a std::sync::Mutex<()>,
    pub clock: &'a Clock,
    /// Cache mode: evict rather than refuse writers.
    pub evict: bool,
}

impl<'a> std::ops::Deref for Gc<'a> {
    type Target = Parts<'a>;

    fn deref(&self) -> &Parts<'a> {
        &self.parts
    }
}

/// GC counters (see [`GcStats`]).
#[derive(Default)]
pub(crate) struct GcCounters {
    victims: AtomicU64,
    records_relocated: AtomicU64,
    bytes_relocated: AtomicU64,
    bytes_relocated_cold: AtomicU64,
    tombstones_dropped: AtomicU64,
    nothing_to_reclaim: AtomicU64,
    expired: AtomicU64,
    evicted_segments: AtomicU64,
    evicted_values: AtomicU64,
    sparse_victims: AtomicU64,
    summary_victims: AtomicU64,
    sparse_fallbacks: AtomicU64,
    namespace_records_dropped: AtomicU64,
    compacted: AtomicU64,
}

impl GcCounters {
    pub(crate) fn snapshot(&self) -> GcStats {
        GcStats {
            victims: self.victims.load(Relaxed),
            records_relocated: self.records_relocated.load(Relaxed),
            bytes_relocated: self.bytes_relocated.load(Relaxed),
            bytes_relocated_cold: self.bytes_relocated_cold.load(Relaxed),
            tombstones_dropped: self.tombstones_dropped.load(Relaxed),
            nothing_to_reclaim: self.nothing_to_reclaim.load(Relaxed),
            expired: self.expired.load(Relaxed),
            evicted_segments: self.evicted_segments.load(Relaxed),
            evicted_values: self.evicted_values.load(Relaxed),
            sparse_victims: self.sparse_victims.load(Relaxed),
            summary_victims: self.summary_victims.load(Relaxed),
            sparse_fallbacks: self.sparse_fallbacks.load(Relaxed),
            namespace_records_dropped: self.namespace_records_dropped.load(Relaxed),
            compacted: self.compacted.load(Relaxed),
        }
    }
}

/// The GC thread's body; returns when the store closes.
pub(crate) fn run(gc: Gc<'_>) {
    // However this thread ends (a panic included), writers must stop
    // waiting for it: without GC, a full device is simply NoSpace.
    struct Gone<'a>(&'a Space);
    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            self.0.gc_gone();
        }
    }
    let _gone = Gone(gc.space);
    loop {
        match gc.space.gc_wait() {
            GcWork::Exit => return,
            GcWork::Reclaim(req) => step(gc, req),
            GcWork::Sweep(seg, alloc) => sweep(gc, seg, alloc),
            GcWork::Compact => compact(gc),
        }
    }
}

/// GC's work due now, run on the caller's thread
/// ([`crate::Background::Manual`]): one reclaim if any is due; whether it
/// ran one.
pub(crate) fn poll(gc: Gc<'_>) -> bool {
    match gc.space.gc_poll() {
        Some(GcWork::Sweep(seg, alloc)) => {
            sweep(gc, seg, alloc);
            true
        }
        Some(GcWork::Reclaim(req)) => {
            step(gc, req);
            true
        }
        Some(GcWork::Compact) => {
            compact(gc);
            true
        }
        Some(GcWork::Exit) | None => false,
    }
}

/// At close, GC stopped: reclaim up to `n` segments on the caller's
/// thread, ignoring the age gate (a short-lived process may close no
/// segment, so none has aged), for a clean checkpoint that found no free
/// segment. How many were reclaimed.
pub(crate) fn reclaim_at_close(gc: Gc<'_>, n: usize) -> usize {
    let mut done = 0;
    while done < n && gc.log.check_writable().is_ok() {
        let Some((victim, evict)) = gc.space.pick_victim(0, gc.evict) else { break };
        if let Err(e) = reclaim(gc, victim, evict) {
            tracing::debug!(victim, error = %e, "reclaim at close stopped");
            break;
        }
        done += 1;
    }
    done
}

/// One reclaim, answering writers' requests up to `req` if it finds
/// nothing to reclaim.
fn step(gc: Gc<'_>, req: u64) {
    if gc.log.check_writable().is_err() {
        gc.space.gc_found_nothing(req);
        return;
    }
    let _no_verify = gc.lock.lock().unwrap_or_else(|e| e.into_inner());
    // The age gate leaves the newest segments out (their garbage is still
    // growing). But while writers wait for room no segment closes, so the
    // gate never moves: garbage among the newest (overwrites of a few keys
    // on a store full of live data) would stay out of reach and every
    // write get NoSpace. Writers waiting, GC takes those too.
    let picked = gc
        .space
        .pick_victim(age(gc.log.sb.segment_count), gc.evict)
        .or_else(|| gc.space.writers_waiting().then(|| gc.space.pick_victim(0, gc.evict)).flatten());
    let Some((victim, evict)) = picked else {
        gc.stats.nothing_to_reclaim.fetch_add(1, Relaxed);
        gc.space.gc_found_nothing(req);
        return;
    };
    let started = std::time::Instant::now();
    let mut result = reclaim(gc, victim, evict);
    // The segment `result` is about.
    let mut segment = victim;
    if gc.evict && !evict && matches!(result, Err(Error::NoSpace { .. })) {
        // A cache with no room left to relocate into (no free segment:
        // a full device after a restart) evicts the victim instead of
        // refusing writers. Values written once leave it with no IO;
        // what it relocated already stays where it went.
        tracing::info!(victim, "no room to relocate: evicting the segment instead");
        result = reclaim(gc, victim, true);
    }
    if gc.evict && matches!(result, Err(Error::NoSpace { .. })) {
        // Evicting writes too: a tombstone for a value whose older
        // versions may remain, a tombstone still needed, the engine's
        // own keys. With no room for those, a segment whose eviction
        // writes nothing frees one: try the others, least recently
        // used first (each is read once; what the failed ones dropped
        // from the index stays dropped, as evicted). The case of a cache
        // reopened on a device with no free segment.
        for other in gc.space.eviction_order(age(gc.log.sb.segment_count), victim) {
            result = reclaim(gc, other, true);
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
        Ok(()) => gc.space.reclaimed(started.elapsed().as_secs_f64()),
        Err(Error::NoSpace { .. }) => {
            tracing::warn!(victim, "GC has no room left to relocate live data");
            gc.stats.nothing_to_reclaim.fetch_add(1, Relaxed);
            gc.space.gc_found_nothing(req);
        }
        Err(e @ Error::Io { .. }) => {
            // Writers see the store poisoned (not NoSpace) from now on.
            let e = gc.log.poison(e);
            tracing::error!(segment, error = %e, "GC failed");
            gc.space.gc_found_nothing(req);
        }
        Err(e) => {
            // This segment cannot be reclaimed; others may be.
            tracing::error!(segment, error = %e, "GC leaves a segment it cannot reclaim in place");
            gc.space.pin(segment);
        }
    }
}

/// One reclaim of [`crate::Watermark::Compact`]'s compaction: a victim at
/// most 4/5 live, its live data relocated (never evicted), so the free
/// space it makes costs no item. Nothing to do (no such victim, no room
/// to relocate, the store read-only) waits for a segment to close.
fn compact(gc: Gc<'_>) {
    if gc.log.check_writable().is_err() {
        gc.space.compact_found_nothing();
        return;
    }
    let _no_verify = gc.lock.lock().unwrap_or_else(|e| e.into_inner());
    let Some(victim) = gc.space.pick_compaction_victim(age(gc.log.sb.segment_count)) else {
        gc.space.compact_found_nothing();
        return;
    };
    let started = std::time::Instant::now();
    match reclaim(gc, victim, false) {
        Ok(()) => {
            gc.stats.compacted.fetch_add(1, Relaxed);
            gc.space.reclaimed(started.elapsed().as_secs_f64())
        }
        Err(Error::NoSpace { .. }) => gc.space.compact_found_nothing(),
        Err(e @ Error::Io { .. }) => {
            let e = gc.log.poison(e);
            tracing::error!(segment = victim, error = %e, "GC failed");
            gc.space.compact_found_nothing();
        }
        Err(e) => {
            tracing::error!(segment = victim, error = %e, "GC leaves a segment it cannot reclaim in place");
            gc.space.pin(victim);
        }
    }
}

/// Sweep segment `seg` (if it still holds what it held at `alloc`) for
/// records of dropped namespaces the index points at: their entries go,
/// with no IO but the segment's read, and their bytes stop counting as
/// live. A failed read leaves the segment to GC's usual path (it drops
/// such records when it reclaims the segment).
fn sweep(gc: Gc<'_>, seg: u32, alloc: u64) {
    let _no_verify = gc.lock.lock().unwrap_or_else(|e| e.into_inner());
    if !gc.space.holds(seg, alloc) {
        return;
    }
    let g = gc.log.sb.grain_bytes as u64;
    let mut scan = SegmentScanner::new(gc.log.dev.as_ref(), &gc.log.sb, gc.log.seed, seg, gc.space.stamp(seg));
    let mut dropped = 0;
    let result = (|| -> Result<()> {
        while let Some(rec) = scan.next_record()? {
            let len = rec.hdr.grains(gc.log.sb.grain_bytes) * g;
            let key = record::key_of(&rec.hdr, scan.bytes_at(rec.grain));
            if gc.keys.ns.fate(key) != Fate::Dead {
                continue;
            }
            let pba = gc.space.pba(seg, rec.grain);
            if drop_value(gc, seg, key, pba, Counted::new(rec.hdr.is_tombstone(), len), false)? {
                dropped += 1;
            }
        }
        Ok(())
    })();
    gc.stats.namespace_records_dropped.fetch_add(dropped, Relaxed);
    if let Err(e) = result {
        tracing::warn!(segment = seg, error = %e, "sweep for dropped namespaces' records stopped; GC drops them when it reclaims the segment");
    }
}

/// Whether the index still points at `pba` for hash `h`.
fn points_at(gc: Gc<'_>, h: u64, pba: u64) -> bool {
    gc.keys.index.contains(h, pba)
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
    /// The stream it is copied to.
    stream: Stream,
}

/// How old (in sequence numbers) a record must be to count as cold: as
/// many as there are records in the index. Under uniform overwrites a
/// key is rewritten about that often, so a record that outlived it is
/// colder than the average key; one younger than that may still be hot.
fn cold_after(gc: Gc<'_>) -> u64 {
    let c = &gc.counters;
    (c.keys.load(Relaxed) + c.tombstones.load(Relaxed)).max(1)
}

/// Remove the index entry of a live record at `pba` of victim `v` (a
/// value, or any record of a dropped namespace: `what`) without writing
/// anything (cache-mode eviction, expiry, a dropped namespace); whether it
/// was still there. With `listed`, the version is listed in
/// [`DroppedKeys`](crate::keys::DroppedKeys) until `v` is free (not needed
/// for a dropped namespace's keys, which nothing reads or writes again).
pub(crate) fn drop_value(gc: Gc<'_>, v: u32, key: &[u8], pba: u64, what: Counted, listed: bool) -> Result<bool> {
    Ok(drop_value_read(gc, v, key, pba, what, listed)?.is_some())
}

/// [`drop_value`], saying of a value dropped whether it was read since it
/// was written ([`read_since_written`]); None when it was not indexed.
pub(crate) fn drop_value_read(
    gc: Gc<'_>,
    v: u32,
    key: &[u8],
    pba: u64,
    what: Counted,
    listed: bool,
) -> Result<Option<bool>> {
    let h = gc.keys.hash(key);
    let _stripe = gc.keys.lock_key(h);
    if !gc.keys.index.contains(h, pba) {
        // A blind overwrite may have displaced it since the scan: settled
        // now; if it is another key's live value, that is back in the index.
        let live = match gc.keys.links.of_old(pba) {
            Some((head, link)) => settle::settle(gc.parts, head, &link, key, h)?,
            None => false,
        };
        if !live {
            return Ok(None);
        }
    }
    // A head's link goes with it: the record it displaced is settled first
    // (a head carries the supersedes flag, so this is not expected).
    if let Some(link) = gc.keys.links.of_head(pba) {
        let (hdr, buf) = gc.read_record(link.old, false)?;
        let key = record::key_of(&hdr, &buf);
        settle::settle(gc.parts, pba, &link, key, gc.keys.hash(key))?;
    }
    let fetched = read_since_written(gc.keys, h, pba);
    if !gc.keys.index.remove(h, pba) {
        return Ok(None);
    }
    gc.keys.invalidate(key, h);
    // Until `v` is free on the device this version is still there: a new
    // value of the key written meanwhile must carry the supersedes flag,
    // and a delete must write a tombstone.
    if listed {
        gc.keys.dropped.insert(v, h);
    }
    gc.space.sub_live(v, what.bytes);
    gc.counters.removed(key, what);
    Ok(Some(fetched))
}

/// Count a value of `key` that left the index: expired, or evicted;
/// `fetched`: read since it was written ([`read_since_written`]).
pub(crate) fn count_leaving(gc: Gc<'_>, key: &[u8], expired: bool, fetched: bool) {
    let c = if expired { &gc.stats.expired } else { &gc.stats.evicted_values };
    c.fetch_add(1, Relaxed);
    gc.counters.with_ns(key, |n| {
        let c = if expired { &n.expirations } else { &n.evictions };
        c.fetch_add(1, Relaxed);
        if !fetched {
            let c = if expired { &n.expired_unfetched } else { &n.evicted_unfetched };
            c.fetch_add(1, Relaxed);
        }
    });
}

/// Whether the version of key hash `h` indexed at `pba` was read since it
/// was written, by its access word (false without access tracking, or
/// when no entry points there); asked under the key's stripe, before the
/// entry leaves.
pub(crate) fn read_since_written(keys: &crate::keys::Keys, h: u64, pba: u64) -> bool {
    keys.index.access(h, pba, |w| w).is_some_and(crate::access::Clock0::is_fetched)
}

/// Whether the record at `pba` (key `key`, hash `h`) of a victim is live,
/// asked under its stripe: indexed, or displaced by a link that settling
/// now finds it to be another key's (then it is indexed again).
fn settle_displaced(gc: Gc<'_>, h: u64, pba: u64, key: &[u8]) -> Result<bool> {
    let _stripe = gc.keys.lock_key(h);
    if points_at(gc, h, pba) {
        return Ok(true);
    }
    match gc.keys.links.of_old(pba) {
        Some((head, link)) => settle::settle(gc.parts, head, &link, key, h),
        None => Ok(false),
    }
}

#[cfg(test)]
thread_local! {
    /// Runs once, on this thread, after a sparse reclaim's reads (tests).
    pub(crate) static AFTER_SPARSE_READS: std::cell::Cell<Option<Box<dyn FnOnce()>>> = const { std::cell::Cell::new(None) };
    /// Runs once, on this thread, after a summary reclaim asked for the
    /// links into its victim and before it looks at the entries (tests).
    pub(crate) static AFTER_LINKS_ASKED: std::cell::Cell<Option<Box<dyn FnOnce()>>> = const { std::cell::Cell::new(None) };
    /// Runs once, on this thread, after a reclaim's scan (tests).
    pub(crate) static AFTER_SCAN: std::cell::Cell<Option<Box<dyn FnOnce()>>> = const { std::cell::Cell::new(None) };
}

/// A sparse reclaim reads at most this share (1/N) of a victim's bytes.
const SPARSE_SHARE: u64 = 16;

/// A sparse reclaim walks the index only if it has at most one slot per
/// this many bytes of a segment (a walk costs a few ns a slot; a scan
/// reads each byte of the segment once).
const SPARSE_BYTES_PER_SLOT: u64 = 4;

/// What a summary reclaim of victim `v` reads (location, grains: the
/// records its summary lists that the index points at, or that a link
/// displaced for another key), and the records it finds dead without
/// reading (displaced by a link of their own key, as (stripe, location)
/// for [`forget_dead_links`]); None where `v` has no summary, or (unless
/// `force`) where its reads would cost more than a scan.
///
/// The links into the victim are asked first (all at once), then each
/// entry the index: a displaced record indexed again is in the index
/// before its link goes. A link made while the entries are looked at is
/// decided after them (a second ask); what appears later (a link after
/// that, an entry indexed again) is left behind, which the checks after
/// relocation see ([`reclaim_with`]).
#[allow(clippy::type_complexity)]
fn summary_targets(gc: Gc<'_>, v: u32, force: bool) -> Option<(Vec<(u64, u64)>, Vec<(usize, u64)>)> {
    if !gc.space.has_feature(FLAG_SUMMARIES) {
        return None;
    }
    let (region, block) = gc.log.read_summary(v, gc.space.stamp(v))?;
    let entries = match summary::decode(gc.log.seed, &block, &region) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(victim = v, error = %e, "a segment summary does not decode: scanning");
            return None;
        }
    };
    let lo = gc.space.pba(v, 0);
    let (mut targets, mut dead) = (Vec::new(), Vec::new());
    let mut bytes = 0;
    let hi = lo + gc.log.sb.segment_grains();
    // The record's grains: up to the next one's start.
    let grains_of =
        |i: usize| entries.get(i + 1).map_or(block.records_end, |n| n.grain) as u64 - entries[i].grain as u64;
    // Every link into the victim, asked once (in location order, as the
    // entries are) before any entry is looked up in the index.
    let asked = gc.keys.links.displacing_in(lo, hi);
    #[cfg(test)]
    AFTER_LINKS_ASKED.with(|h| h.take().map(|f| f()));
    let mut links = asked.iter().peekable();
    for (i, e) in entries.iter().enumerate() {
        let pba = lo + e.grain as u64;
        let h = gc.keys.hash(e.key);
        while links.next_if(|l| l.old.pba() < pba).is_some() {}
        let wanted = match links.next_if(|l| l.old.pba() == pba) {
            Some(link) if *link.key == *e.key => {
                dead.push((gc.keys.stripe_of(h), pba));
                false
            }
            Some(_) => true,
            None => points_at(gc, h, pba),
        };
        if wanted {
            targets.push((pba, grains_of(i)));
            bytes += grains_of(i) * gc.log.grain();
        }
    }
    // A record whose key was overwritten blindly while the loop ran (its
    // link not asked above, the index no longer at it) is neither: decided
    // now from its new link, as above, rather than left for the check
    // after relocation to fall back to a scan over.
    for link in gc.keys.links.displacing_in(lo, hi) {
        let pba = link.old.pba();
        let new = asked.binary_search_by_key(&pba, |l| l.old.pba()).is_err();
        let Ok(i) = entries.binary_search_by_key(&pba, |e| lo + e.grain as u64) else { continue };
        if !new || targets.binary_search_by_key(&pba, |t| t.0).is_ok() {
            continue;
        }
        if *link.key == *entries[i].key {
            dead.push((gc.keys.stripe_of(gc.keys.hash(entries[i].key)), pba));
        } else {
            let at = targets.partition_point(|t| t.0 < pba);
            targets.insert(at, (pba, grains_of(i)));
            bytes += grains_of(i) * gc.log.grain();
        }
    }
    let seg_bytes = gc.log.sb.segment_bytes;
    let costly = bytes * SPARSE_SHARE > seg_bytes || targets.len() as u64 * SPARSE_SHARE * SPARSE_IO_BYTES > seg_bytes;
    if costly && !force {
        return None;
    }
    Some((targets, dead))
}

/// What one read of a sparse reclaim is counted as, in bytes of a scan.
const SPARSE_IO_BYTES: u64 = 4096;

/// Threads a sparse reclaim reads its records with.
const SPARSE_READERS: usize = 8;

/// How a victim is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadMode {
    /// Sparse when little of it can matter, else a scan.
    Choose,
    /// The whole segment, window by window.
    Scan,
    /// Only the records the index or a link points at.
    #[cfg(test)]
    Sparse,
    /// Only the records its summary says are live or may be (another
    /// key's record displaced by a link); the summary must be there.
    #[cfg(test)]
    Summary,
}

/// Reclaim segment `v`: relocate what is live (or, with `evict`, drop its
/// values from the index), replace expired values by tombstones, drop dead
/// tombstones, free it.
///
/// A victim with little left to look at (its live bytes and the records
/// links displaced in it under 1/[`SPARSE_SHARE`] of it, on an index small
/// enough to walk) is read sparsely: the records the index points at in
/// it (one walk of the index) and those links displaced there, each read
/// on its own. Anything else in it is garbage by definition (neither
/// indexed nor linked), which is all a scan would find too. A sparse
/// reclaim that leaves anything behind (an entry or link that appeared
/// meanwhile) falls back to a scan.
pub(crate) fn reclaim(gc: Gc<'_>, v: u32, evict: bool) -> Result<()> {
    reclaim_with(gc, v, evict, ReadMode::Choose)
}

pub(crate) fn reclaim_with(gc: Gc<'_>, v: u32, evict: bool, mode: ReadMode) -> Result<()> {
    // Watched from before the sparse reads look at the links and the index
    // until the final check (see [`SparseWatch`]).
    let watch = (mode != ReadMode::Scan).then(|| gc.keys.watch.start(v));
    let mut w = Victim::new(gc, v, evict);
    let summed = match mode {
        ReadMode::Choose => summary_targets(gc, v, false),
        #[cfg(test)]
        ReadMode::Summary => Some(summary_targets(gc, v, true).expect("the victim has a summary")),
        _ => None,
    };
    let from_summary = summed.is_some();
    let sparse = match (mode, summed) {
        (_, Some((targets, dead))) => {
            // Displaced by their own key's overwrite: dead, and their
            // links go in the sweep after relocation, as a scan decides.
            w.dead_links = dead;
            Some(targets)
        }
        (ReadMode::Scan, None) => None,
        (ReadMode::Choose, None) => sparse_targets(gc, v, false),
        #[cfg(test)]
        (ReadMode::Sparse, None) => sparse_targets(gc, v, true),
        #[cfg(test)]
        (ReadMode::Summary, None) => unreachable!("checked above"),
    };
    let was_sparse = sparse.is_some();
    // A scan needs no watch.
    let watch = watch.filter(|_| was_sparse);
    match sparse {
        Some(targets) => {
            w.read_sparse(targets)?;
            #[cfg(test)]
            AFTER_SPARSE_READS.with(|h| h.take().map(|f| f()));
        }
        None => {
            std::thread::scope(|sc| {
                // A helper thread reads the next window while this one is parsed.
                let mut ahead = crate::log::ReadAhead::start(sc, gc.log.dev.as_ref());
                w.scan(&mut ahead)
            })?;
            #[cfg(test)]
            AFTER_SCAN.with(|h| h.take().map(|f| f()));
        }
    }
    let Victim { mut batch, purpose, evicted, dead_links, .. } = w;
    relocate(gc, v, purpose, &mut batch)?;
    // A writer that replaced an entry pointing into `v` subtracts the old
    // record's bytes from `v` after updating the index, under its stripe:
    // wait for all such writers, so the live bytes are settled. The links
    // of the records found dead by their own key's overwrite go on the way.
    forget_dead_links(gc, dead_links);
    let lo = gc.space.pba(v, 0);
    let leftover = gc.keys.links.displacing_in(lo, lo + gc.log.sb.segment_grains());
    let left = gc.space.live_of(v);
    if was_sparse && (left != 0 || !leftover.is_empty() || gc.keys.watch.touched()) {
        // Something may have changed after the sparse reads looked (a
        // record of `v` put back in the index, a link or live bytes left):
        // the scan finds whatever it was.
        tracing::debug!(victim = v, left, links = leftover.len(), "sparse reclaim left something: scanning");
        gc.stats.sparse_fallbacks.fetch_add(1, Relaxed);
        drop(watch);
        return reclaim_with(gc, v, evict, ReadMode::Scan);
    }
    // Every link displacing a record of `v` was settled as the scan met
    // it, or when its record was about to be copied or dropped. One left
    // means a path missed it: settle it now (a read) rather than free the
    // record under it, and scan again if that put a live record back.
    let mut rescan = false;
    for link in leftover {
        tracing::warn!(victim = v, displaced = link.old.pba(), "a link into a GC victim was left unsettled");
        debug_assert!(false, "a link into GC victim {v} was left unsettled: {link:?}");
        rescan |= settle::resolve_one(gc.parts, &link)?;
    }
    if rescan {
        drop(watch);
        return reclaim_with(gc, v, evict, ReadMode::Scan);
    }
    if left != 0 {
        // An index entry points at something the scan could not read as a
        // record: keep the segment rather than lose the evidence.
        return Err(Error::Corruption {
            offset: gc.log.sb.segment_offset(v),
            detail: format!("segment {v} keeps {left} live bytes that GC could not read as records"),
        });
    }
    // Only once the free header is on the device (flushed in Flush mode)
    // are the values dropped from `v` gone: their listing ends then, and
    // before `v` is on the free list (a writer that allocated it could
    // list a new value of `v` that this would erase). If reclaim failed
    // above they stay listed until a later reclaim of `v` gets here.
    gc.space.free_segment(v, || gc.keys.dropped.freed(v))?;
    gc.stats.victims.fetch_add(1, Relaxed);
    if from_summary {
        gc.stats.summary_victims.fetch_add(1, Relaxed);
    } else if was_sparse {
        gc.stats.sparse_victims.fetch_add(1, Relaxed);
    }
    if evict {
        gc.stats.evicted_segments.fetch_add(1, Relaxed);
        tracing::debug!(segment = v, values = evicted, "evicted segment");
    }
    Ok(())
}

/// Take every key stripe once (see [`reclaim_with`]), and under each
/// remove the links of `dead` (stripe, displaced location) in it: records
/// a victim's scan found displaced by a blind overwrite of their own key.
/// Such a link is settled (its record dead) but still in the table; the
/// location it names is this victim's, which GC alone frees, so the link
/// found there now is the same one, whatever head it moved to since.
///
/// What matters is that each stripe is taken once after the scan, not the
/// order (GC holds one at a time): the free stripes are taken first and
/// the busy ones come back round, so the sweep waits only for stripes
/// still busy when nothing else is free, not for each writer in stripe
/// order (a run's pieces hold many stripes across their device writes).
fn forget_dead_links(gc: Gc<'_>, mut dead: Vec<(usize, u64)>) {
    dead.sort_unstable();
    let forget = |i: usize| {
        let from = dead.partition_point(|d| d.0 < i);
        let mine = dead[from..].iter().take_while(|d| d.0 == i);
        if mine.clone().next().is_some() {
            gc.keys.links.forget_displaced(mine.map(|&(_, old)| old));
        }
    };
    let mut busy: Vec<usize> = (0..crate::keys::KEY_STRIPES).collect();
    while !busy.is_empty() {
        let before = busy.len();
        busy.retain(|&i| match gc.keys.try_lock_stripe(i) {
            Some(_stripe) => {
                forget(i);
                false
            }
            None => true,
        });
        if busy.len() == before {
            // None came free: wait for the first.
            let i = busy.remove(0);
            let _stripe = gc.keys.lock_stripe(i);
            forget(i);
        }
    }
}

/// The records of victim `v` a sparse reclaim reads (location, grains to
/// read first), or None if a scan is cheaper. `force`: sparse whatever
/// the cost (tests).
fn sparse_targets(gc: Gc<'_>, v: u32, force: bool) -> Option<Vec<(u64, u64)>> {
    let g = gc.log.sb.grain_bytes as u64;
    let seg_bytes = gc.log.sb.segment_bytes;
    let lo = gc.space.pba(v, 0);
    let hi = lo + gc.log.sb.segment_grains();
    let hint = |e: granary_index::Entry| match e.kv_size() {
        0 => 1,
        n if n == granary_format::limits::KV_SIZE_GRAINS_MAX => 1,
        n => n as u64,
    };
    // The links first, then the index: a displaced record indexed again
    // meanwhile is in the index before its link goes.
    let links = gc.keys.links.displacing_in(lo, hi);
    if !force {
        let look = gc.space.live_of(v) + links.iter().map(|l| hint(l.old) * g).sum::<u64>();
        let slots = gc.keys.index.stats().slots;
        if look * SPARSE_SHARE > seg_bytes || slots * SPARSE_BYTES_PER_SLOT > seg_bytes {
            return None;
        }
    }
    let mut targets: Vec<(u64, u64)> = links.iter().map(|l| (l.old.pba(), hint(l.old))).collect();
    gc.keys.index.for_each(|_, e| {
        if (lo..hi).contains(&e.pba()) {
            targets.push((e.pba(), hint(e)));
        }
    });
    // And the links again: one made during the walk displaced a record the
    // walk may have missed.
    targets.extend(gc.keys.links.displacing_in(lo, hi).iter().map(|l| (l.old.pba(), hint(l.old))));
    targets.sort_unstable();
    targets.dedup_by_key(|t| t.0);
    // Counted in IOs too: each read costs the device at least what a scan
    // of 4 KiB does.
    if !force && targets.len() as u64 * SPARSE_SHARE * SPARSE_IO_BYTES > seg_bytes {
        return None;
    }
    Some(targets)
}

/// What [`read_one`] gives.
type OneRead = Result<Option<(RecordHeader, AlignedBuf, bool)>>;

/// One record of a victim, read on its own: its header, its bytes (whole
/// grains), whether its body checksum holds. None where no record of the
/// segment's current use starts there (a scan would skip it too).
fn read_one(gc: Gc<'_>, v: u32, pba: u64, hint: u64) -> OneRead {
    let g = gc.log.sb.grain_bytes as u64;
    let lo = gc.space.pba(v, 0);
    let seg_grains = gc.log.sb.segment_grains();
    let pos = pba - lo;
    let read = |grains: u64| {
        let offset = pba * g;
        let (buf, r) = gc.log.dev.read_at(AlignedBuf::for_read((grains * g) as usize), offset);
        r.map(|()| buf).map_err(|source| Error::Io { op: "GC read", offset, source })
    };
    let hint = hint.clamp(1, seg_grains - pos);
    let mut buf = read(hint)?;
    let hdr = match RecordHeader::decode(&buf) {
        Ok(h) if h.seg_stamp == gc.space.stamp(v) && pos + h.grains(gc.log.sb.grain_bytes) <= seg_grains => h,
        _ => return Ok(None),
    };
    let grains = hdr.grains(gc.log.sb.grain_bytes);
    if grains > hint {
        buf = read(grains)?;
    }
    if record::verify_header_crc(gc.log.seed, &hdr, &buf).is_err() {
        return Ok(None);
    }
    let intact = record::verify_crc(gc.log.seed, &hdr, &buf).is_ok();
    Ok(Some((hdr, buf, intact)))
}

/// A reclaim in progress: what it has decided so far.
struct Victim<'a> {
    gc: Gc<'a>,
    v: u32,
    evict: bool,
    now: u32,
    oldest_other: u64,
    purpose: Purpose,
    /// Hot/cold separation: a record whose sequence number is more than
    /// this many behind the next one goes to the cold stream.
    cold_after: Option<u64>,
    batch: Vec<Pending>,
    batch_bytes: usize,
    evicted: u64,
    /// Records found dead by a link of their own key, as (stripe,
    /// location): their links go in the stripe sweep after the scan
    /// ([`forget_dead_links`]).
    dead_links: Vec<(usize, u64)>,
}

impl<'a> Victim<'a> {
    fn new(gc: Gc<'a>, v: u32, evict: bool) -> Victim<'a> {
        Victim {
            gc,
            v,
            evict,
            now: gc.clock.now(),
            oldest_other: gc.space.oldest_in_use_except(v),
            // A cache's cleaning leaves the last free segment to evictions.
            purpose: if gc.evict && !evict { Purpose::Clean } else { Purpose::Relocate },
            cold_after: (gc.space.hot_cold() && !evict).then(|| cold_after(gc)),
            batch: Vec::new(),
            batch_bytes: 0,
            evicted: 0,
            dead_links: Vec::new(),
        }
    }

    /// Read the whole segment, window by window.
    fn scan(&mut self, ahead: &mut crate::log::ReadAhead) -> Result<()> {
        let gc = self.gc;
        let g = gc.log.sb.grain_bytes as u64;
        let mut scan =
            SegmentScanner::new(gc.log.dev.as_ref(), &gc.log.sb, gc.log.seed, self.v, gc.space.stamp(self.v))
                .reading_ahead(ahead);
        while let Some(rec) = scan.next_record()? {
            let len = (rec.hdr.grains(gc.log.sb.grain_bytes) * g) as usize;
            let bytes = &scan.bytes_at(rec.grain)[..len];
            self.consider(gc.space.pba(self.v, rec.grain), &rec.hdr, bytes, rec.intact)?;
        }
        Ok(())
    }

    /// Read only `targets` (location, grains to read first), several at a
    /// time, and consider them in device order.
    fn read_sparse(&mut self, targets: Vec<(u64, u64)>) -> Result<()> {
        let (gc, v) = (self.gc, self.v);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let slots: Vec<std::sync::Mutex<Option<OneRead>>> =
            targets.iter().map(|_| std::sync::Mutex::new(None)).collect();
        std::thread::scope(|sc| {
            let readers = gc.threads(SPARSE_READERS);
            for _ in 0..readers.min(targets.len()) {
                sc.spawn(|| loop {
                    let i = next.fetch_add(1, Relaxed);
                    let Some(&(pba, hint)) = targets.get(i) else { return };
                    *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(read_one(gc, v, pba, hint));
                });
            }
        });
        for ((pba, _), slot) in targets.iter().zip(slots) {
            let read = slot.into_inner().unwrap_or_else(|e| e.into_inner()).expect("every target was read");
            if let Some((hdr, buf, intact)) = read? {
                let len = (hdr.grains(gc.log.sb.grain_bytes) * gc.log.sb.grain_bytes as u64) as usize;
                self.consider(*pba, &hdr, &buf[..len], intact)?;
            }
        }
        Ok(())
    }

    /// Decide what becomes of the record at `old_pba` (header `hdr`, whole
    /// record `bytes`, body checksum holding or not): nothing (garbage),
    /// dropped, or copied (itself, or a tombstone in its place).
    fn consider(&mut self, old_pba: u64, hdr: &RecordHeader, bytes: &[u8], intact: bool) -> Result<()> {
        let (gc, v) = (self.gc, self.v);
        let g = gc.log.sb.grain_bytes as u64;
        let len = bytes.len();
        let key = record::key_of(hdr, bytes);
        let h = gc.keys.hash(key);
        if !points_at(gc, h, old_pba) {
            // Superseded or deleted: garbage, unless a blind overwrite of
            // another key displaced it (`crate::links`). Not indexed, then
            // not linked, then still not indexed is garbage: a displaced
            // record is linked before it leaves the index, and indexed
            // again before its link goes. Displaced by a write of its own
            // key (the link's key is the record's): garbage too, decided
            // without the stripe, since such a record is never indexed
            // again (a checkpoint settling its link first only removes
            // the link); the link goes in the sweep after the scan, under
            // its stripe (a sequential
            // overwrite leaves whole victims of these, and writers hold
            // the very stripes of the keys they overwrite). Otherwise
            // asked under the stripe.
            let link = gc.keys.links.of_old(old_pba);
            if link.as_ref().is_some_and(|(_, l)| *l.key == *key) {
                self.dead_links.push((gc.keys.stripe_of(h), old_pba));
                return Ok(());
            }
            let garbage = link.is_none() && !points_at(gc, h, old_pba);
            if garbage || !settle_displaced(gc, h, old_pba, key)? {
                return Ok(());
            }
        }
        let fate = gc.keys.ns.fate(key);
        if fate == Fate::Dead {
            // A dropped namespace's key: garbage however it stands.
            let what = Counted::new(hdr.is_tombstone(), len as u64);
            if drop_value(gc, v, key, old_pba, what, false)? {
                gc.stats.namespace_records_dropped.fetch_add(1, Relaxed);
            }
            return Ok(());
        }
        if hdr.is_tombstone() && hdr.tomb_horizon < self.oldest_other {
            let _stripe = gc.keys.lock_key(h);
            // A tombstone heading a link stays until the link is settled:
            // the record it displaced may be another key's.
            if gc.keys.links.of_head(old_pba).is_none() {
                if gc.keys.index.remove(h, old_pba) {
                    gc.space.sub_live(v, len as u64);
                    gc.counters.removed(key, Counted::new(true, len as u64));
                    gc.stats.tombstones_dropped.fetch_add(1, Relaxed);
                }
                return Ok(());
            }
        }
        let damaged = !intact || hdr.damaged_copy;
        let expired = !hdr.is_tombstone() && !damaged && gc.log.hidden(hdr, key, self.now);
        // The engine's own keys (the flush floor, the catalog) never leave,
        // and a namespace in store mode is never evicted.
        let reserved = fate == Fate::Engine;
        let evictable = fate == Fate::Live { evictable: true };
        // A value leaves the index when it expired (or was flushed), or when
        // its segment is evicted. If older versions of its key may remain
        // on the device it becomes a tombstone (else one of them would come
        // back after a crash); if not, it is simply dropped: no IO.
        let leaving = !hdr.is_tombstone() && !reserved && (expired || (self.evict && evictable));
        if leaving && !hdr.supersedes {
            if let Some(fetched) = drop_value_read(gc, v, key, old_pba, Counted::new(false, len as u64), true)? {
                count_leaving(gc, key, expired, fetched);
                self.evicted += 1;
            }
            return Ok(());
        }
        let (hdr, bytes) = if leaving {
            let seq = gc.log.next_seq.fetch_add(1, Relaxed);
            let t = RecordHeader::tombstone(key.len(), seq, 0, gc.space.horizon());
            let mut out = vec![0u8; (t.grains(gc.log.sb.grain_bytes) * g) as usize];
            t.encode(gc.log.seed, key, &[], &mut out);
            (t, out)
        } else {
            (hdr.clone(), bytes.to_vec())
        };
        self.batch_bytes += bytes.len();
        let evicted = leaving && !expired;
        let age = gc.log.next_seq.load(Relaxed).saturating_sub(hdr.seq);
        let stream = match (gc.space.relocation_stream(self.v, hdr.seq), self.cold_after) {
            _ if leaving || self.evict => Stream::Relocation,
            (Some(s), _) => s,
            (None, Some(t)) if age > t => Stream::Cold,
            _ => Stream::Relocation,
        };
        self.batch.push(Pending { h, old_pba, old_len: len as u64, hdr, bytes, damaged, expired, evicted, stream });
        if self.batch_bytes >= GC_BATCH_BYTES {
            relocate(gc, v, self.purpose, &mut self.batch)?;
            self.batch_bytes = 0;
        }
        Ok(())
    }
}

/// Copy a batch of live records of segment `v` to the relocation stream and
/// point the index at the copies.
fn relocate(gc: Gc<'_>, v: u32, purpose: Purpose, batch: &mut Vec<Pending>) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let g = gc.log.sb.grain_bytes as u64;
    let mut stripes: Vec<usize> = batch.iter().map(|p| gc.keys.stripe_of(p.h)).collect();
    stripes.sort_unstable();
    stripes.dedup();
    let _guards: Vec<_> = stripes.iter().map(|&i| gc.keys.lock_stripe(i)).collect();
    let mut kept = Vec::with_capacity(batch.len());
    for p in batch.drain(..) {
        let live = points_at(gc, p.h, p.old_pba)
            // A blind overwrite of another key displaced it since the scan.
            || match gc.keys.links.of_old(p.old_pba) {
                Some((head, link)) => settle::settle(gc.parts, head, &link, record::key_of(&p.hdr, &p.bytes), p.h)?,
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
    gc.keys.dropped.insert_all(v, batch.iter().filter(|p| !p.hdr.is_tombstone()).map(|p| p.h));

    // Place every record; consecutive placements form one write.
    let mut placed = Vec::with_capacity(batch.len());
    let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut alloc_err = None;
    for p in batch.iter_mut() {
        let grains = p.bytes.len() as u64 / g;
        let key = record::key_of(&p.hdr, &p.bytes);
        let loc = match gc.space.alloc_in(purpose, p.stream, grains, listed_bytes([key]), gc.log.next_seq.load(Relaxed))
        {
            Ok(loc) => loc,
            Err(e) => {
                alloc_err = Some(e);
                break;
            }
        };
        record::restamp(gc.log.seed, &p.hdr, &mut p.bytes, loc.stamp, p.damaged);
        match runs.last_mut() {
            Some((start, bytes)) if *start + bytes.len() as u64 / g == loc.pba => bytes.extend_from_slice(&p.bytes),
            _ => runs.push((loc.pba, p.bytes.clone())),
        }
        placed.push(loc);
    }
    let written = write_runs(gc, runs);
    if let Err(e) = written {
        for loc in &placed {
            gc.space.done(loc.seg);
        }
        return Err(e);
    }
    for (p, loc) in batch.iter().zip(&placed) {
        let kv_size = if p.hdr.is_tombstone() { 0 } else { loc.grains };
        let fetched = (p.expired || p.evicted) && read_since_written(gc.keys, p.h, p.old_pba);
        let moved =
            settle::carry(gc.parts, p.old_pba, loc.pba, || gc.keys.index.replace(p.h, p.old_pba, kv_size, loc.pba));
        assert!(moved, "a live record changed while its stripe was held");
        gc.space.sub_live(v, p.old_len);
        gc.space.add_live(loc.seg, p.bytes.len() as u64);
        gc.space.done(loc.seg);
        if p.expired || p.evicted {
            let key = record::key_of(&p.hdr, &p.bytes);
            // Its value is gone: so is the DRAM tier's copy (the stripe is
            // held), as `drop_value` does for a value dropped without a
            // tombstone.
            gc.keys.invalidate(key, p.h);
            gc.counters.replaced(key, Counted::new(false, p.old_len), Counted::new(true, p.bytes.len() as u64));
            count_leaving(gc, key, p.expired, fetched);
        } else {
            // The same version, moved: the tier's copy follows it.
            let key = record::key_of(&p.hdr, &p.bytes);
            gc.keys.moved(key, p.h, p.hdr.seq, (p.old_pba, p.hdr.seg_stamp), (loc.pba, loc.stamp));
            gc.stats.records_relocated.fetch_add(1, Relaxed);
            gc.stats.bytes_relocated.fetch_add(p.bytes.len() as u64, Relaxed);
            if matches!(p.stream, Stream::Cold | Stream::Older | Stream::Oldest) {
                gc.stats.bytes_relocated_cold.fetch_add(p.bytes.len() as u64, Relaxed);
            }
        }
    }
    batch.clear();
    match alloc_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Write relocation runs (each one IO), then flush in `Flush` mode.
fn write_runs(gc: Gc<'_>, runs: Vec<(u64, Vec<u8>)>) -> Result<()> {
    let g = gc.log.sb.grain_bytes as u64;
    for (pba, bytes) in runs {
        let mut buf = AlignedBuf::zeroed(bytes.len());
        buf.copy_from_slice(&bytes);
        let offset = pba * g;
        gc.space.summarize(pba, &buf);
        let (_, r) = gc.log.dev.write_at(buf, offset);
        r.map_err(|source| Error::Io { op: "GC relocation write", offset, source })?;
    }
    gc.log.flush_if_durable(0)
}
