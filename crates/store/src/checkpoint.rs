//! Index checkpoints (the DRAM index saved on the device, so an open
//! replays only the log written after one instead of scanning it all):
//! writing them while the store runs, and finding the newest valid one on
//! open.
//!
//! **Writing** ([`Checkpoints::write`]). Record what the checkpoint covers
//! (`Space::capture_for_checkpoint`: the alloc_seq from which KV segments
//! must be replayed, and every KV segment's alloc_seq), then walk the index
//! ([`granary_index::Index::for_each`], region by region under the region
//! locks: writers wait for one region at most, never for the checkpoint),
//! take free segments (never GC's reserve) and write the items, flush,
//! write the manifest, flush again, and only then free the previous
//! checkpoint's segments. A crash at any point leaves the previous
//! checkpoint valid, or the new one. Zoned mode writes the manifest
//! before the body instead, each segment in order at its zone's write
//! pointer (`write_zoned`); a manifest whose body is incomplete fails
//! the body checksum (or misses a segment) and is not loaded.
//!
//! **Why a fuzzy walk is enough.** Every record in a segment below
//! `replay_from` was indexed before the walk began, so the walk sees it or
//! what replaced it; everything else is replayed from the log. An item can
//! still be stale: its segment may have been reclaimed by GC (relocated
//! records land in segments that are replayed; dead ones need no entry) or
//! reused. The loader therefore keeps an item only if its segment is still
//! a KV segment with the alloc_seq the checkpoint recorded, and below
//! `replay_from` (items in replayed segments come back by the replay).
//!
//! **Clean shutdown** is never assumed: the close writes a checkpoint
//! flagged clean with nothing to replay, and the next open calls the
//! shutdown clean only if that manifest and its body pass their checksums
//! and no KV segment was opened after it. A store reopened from a clean
//! checkpoint starts a new segment for its writes, so whatever it writes is
//! replayed if it crashes before its own next checkpoint.

use crate::error::{Error, Result};
use crate::log::{Headers, Log};
use crate::options::Clock;
use crate::parts::Parts;
use crate::space::Space;
use crate::types::CheckpointStats;
use granary_format::checkpoint::{Item, Manifest, ITEM_BYTES};
use granary_format::checksum::crc32c_append;
use granary_format::limits::{grains_for, KV_SIZE_GRAINS_MAX};
use granary_format::Superblock;
use granary_index::Entry;
use granary_io::{AlignedBuf, Device};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

/// Bytes written or read per IO while moving a checkpoint body.
const CHECKPOINT_IO_BYTES: usize = 1 << 20;

#[derive(Default)]
pub(crate) struct CheckpointCounters {
    written: AtomicU64,
    failed: AtomicU64,
    last_entries: AtomicU64,
    last_bytes: AtomicU64,
    last_millis: AtomicU64,
}

/// The checkpoint the store relies on now: its segments (freed when a newer
/// one is complete), and the state it captured (to skip a checkpoint when
/// nothing changed since).
#[derive(Default)]
pub(crate) struct Current {
    pub id: u64,
    pub segs: Vec<u32>,
    pub next_seq: u64,
    pub next_alloc_seq: u64,
}

impl CheckpointCounters {
    pub(crate) fn snapshot(&self, current_id: u64) -> CheckpointStats {
        CheckpointStats {
            written: self.written.load(Relaxed),
            failed: self.failed.load(Relaxed),
            current_id,
            last_entries: self.last_entries.load(Relaxed),
            last_bytes: self.last_bytes.load(Relaxed),
            last_millis: self.last_millis.load(Relaxed),
        }
    }
}

/// Where the body of a checkpoint goes: a sequence of (device offset, bytes) runs.
fn body_runs(sb: &Superblock, segs: &[u32], manifest_grains: u64, body_bytes: u64) -> Vec<(u64, u64)> {
    let g = sb.grain_bytes as u64;
    let mut runs = Vec::new();
    let mut left = body_bytes;
    for (i, &seg) in segs.iter().enumerate() {
        let first = if i == 0 { 1 + manifest_grains } else { 1 };
        let room = (sb.segment_grains() - first) * g;
        let n = left.min(room);
        if n > 0 {
            runs.push((sb.segment_offset(seg) + first * g, n));
        }
        left -= n;
    }
    debug_assert_eq!(left, 0);
    runs
}

/// Grains the manifest of a store with `segments` segments may need.
fn manifest_grains(sb: &Superblock) -> u64 {
    let n = sb.segment_count as usize;
    grains_for(Manifest::bytes_for(n, n) as u64, sb.grain_bytes)
}

/// Segments a body of `body_bytes` needs, the manifest in the first.
fn segments_needed(sb: &Superblock, body_bytes: u64) -> Option<usize> {
    let g = sb.grain_bytes as u64;
    let per = (sb.segment_grains() - 1) * g;
    let mg = manifest_grains(sb) * g;
    if mg >= per {
        return None;
    }
    Some(((body_bytes + mg).div_ceil(per)).max(1) as usize)
}

/// The checkpoints of an open store.
#[derive(Default)]
pub(crate) struct Checkpoints {
    /// The checkpoint relied on now; held while one is written.
    pub current: Mutex<Current>,
    pub counters: CheckpointCounters,
    /// Random id of this open session, written into checkpoints.
    pub session: u64,
}

impl Checkpoints {
    pub(crate) fn new(session: u64) -> Checkpoints {
        Checkpoints { session, ..Default::default() }
    }

    /// The checkpoint in use, held: no checkpoint is written (nor an
    /// older one's segments freed) meanwhile (`verify`, while it reads the
    /// segment headers and the newest checkpoint).
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Figures of the checkpoints written since the open.
    pub(crate) fn stats(&self) -> CheckpointStats {
        let id = self.lock().id;
        self.counters.snapshot(id)
    }

    /// Write a checkpoint of the index now. `clean`: the store is closing
    /// and no writer runs (the caller guarantees it).
    pub(crate) fn write(&self, p: Parts<'_>, clock: &Clock, clean: bool) -> Result<CheckpointStats> {
        let mut cur = self.lock();
        let started = Instant::now();
        let r = write_locked(p, self.session, clock, &mut cur, clean);
        let c = &self.counters;
        match &r {
            Ok((entries, bytes)) => {
                c.written.fetch_add(1, Relaxed);
                c.last_entries.store(*entries, Relaxed);
                c.last_bytes.store(*bytes, Relaxed);
                let millis = started.elapsed().as_millis() as u64;
                c.last_millis.store(millis, Relaxed);
                if millis >= 1000 {
                    tracing::info!(id = cur.id, entries, bytes, millis, clean, "index checkpoint written");
                } else {
                    tracing::debug!(id = cur.id, entries, bytes, millis, clean, "index checkpoint written");
                }
            }
            Err(e) => {
                c.failed.fetch_add(1, Relaxed);
                tracing::warn!(error = %e, "index checkpoint not written; recovery falls back to the previous one or a log scan");
            }
        }
        let id = cur.id;
        r.map(|_| c.snapshot(id))
    }

    /// Whether the store changed since the current checkpoint.
    pub(crate) fn stale(&self, p: Parts<'_>) -> bool {
        let cur = self.lock();
        cur.id == 0 || cur.next_seq != p.log.next_seq.load(Relaxed) || cur.next_alloc_seq != p.space.horizon() + 1
    }

    /// The checkpoint a recovery loaded is the current one.
    pub(crate) fn loaded(&self, id: u64, segs: Vec<u32>) {
        *self.lock() = Current { id, segs, next_seq: 0, next_alloc_seq: 0 };
    }
}

fn write_locked(p: Parts<'_>, session: u64, clock: &Clock, cur: &mut Current, clean: bool) -> Result<(u64, u64)> {
    p.log.check_writable()?;
    let sb = &p.log.sb;
    let g = sb.grain_bytes as u64;
    let (replay_from, next_alloc_seq, seg_alloc) = p.space.capture_for_checkpoint(clean);
    let next_seq = p.log.next_seq.load(Relaxed);
    // Entries displaced by blind overwrites are settled by reading them, so
    // that the walk finds every live version in the index. Links made
    // after this (heads written after the capture) are handled below.
    // One whose displaced record cannot be read stays: its segment is
    // replayed (below).
    let resolved = crate::settle::resolve_all(p)?;
    if resolved.live != 0 || !resolved.unreadable.is_empty() {
        tracing::info!(
            live = resolved.live,
            unreadable = resolved.unreadable.len(),
            "checkpoint: records displaced by blind overwrites of colliding keys indexed again"
        );
    }
    let mut walked: Vec<(usize, Entry)> = Vec::with_capacity(p.keys.index.stats().entries as usize + 1024);
    let mut replay_from = replay_from;
    let tables_log2 = p.keys.index.for_each(|home, e| {
        walked.push((home, e));
        // A head still linked: the entry it displaced is written as an
        // item of its own, and the head's segment is replayed, so that
        // recovery reads both and keeps the newer version of each key.
        if let Some(link) = p.keys.links.of_head(e.pba()) {
            // (One whose displaced record cannot be read: no item, which
            // a recovery would read to compare and fail on; its segment is
            // replayed instead, and the scan skips it as a log scan does.)
            let unreadable = resolved.unreadable_at.contains(&link.old.pba());
            if !unreadable {
                walked.push((home, link.old));
            }
            let mut segs = vec![p.log.sb.segment_of(e.pba())];
            if unreadable {
                segs.push(p.log.sb.segment_of(link.old.pba()));
            }
            for seg in segs {
                let a = p.space.alloc_seq(seg);
                if a != 0 {
                    replay_from = replay_from.min(a);
                }
            }
        }
    });
    // Segments holding versions the index does not point at (values GC
    // dropped or copied out of a victim not yet freed): replayed, so the
    // next recovery knows those versions are there. Read after the walk: a
    // copy the walk saw was listed before it was indexed.
    let replay_from = p
        .keys
        .dropped
        .segments()
        .into_iter()
        .map(|s| p.space.alloc_seq(s))
        .filter(|&a| a != 0)
        .fold(replay_from, u64::min);
    // Sizes the entries do not give (tombstones, huge records) are read
    // from the record headers now, off the index locks. A record that moved
    // meanwhile fails its stamp check: size 0, the loader reads it if the
    // item is still kept.
    let items: Vec<Item> = walked
        .iter()
        .map(|&(home, e)| {
            let grains = match e.kv_size() {
                n if n != 0 && n != KV_SIZE_GRAINS_MAX => n,
                _ => p.read_record(e, false).map(|(h, _)| h.grains(sb.grain_bytes) as u32).unwrap_or(0),
            };
            Item { entry: e.0, home: home as u32, grains }
        })
        .collect();
    drop(walked);
    let body_bytes = (items.len() * ITEM_BYTES) as u64;
    let Some(n) = segments_needed(sb, body_bytes) else {
        return Err(Error::InvalidOptions(format!(
            "a checkpoint manifest for {} segments does not fit in one segment of {} bytes",
            sb.segment_count, sb.segment_bytes
        )));
    };
    let taken = p.space.take_index_segments(n)?;
    // What `stale` compares with: the allocation counter after our own segments.
    let next_alloc_after = p.space.horizon() + 1;
    let segs: Vec<u32> = taken.iter().map(|t| t.0).collect();
    let id = taken[0].1;
    let manifest = |body_crc| Manifest {
        clean,
        id,
        session,
        replay_from,
        next_seq,
        next_alloc_seq,
        created_unix_ms: clock.unix_ms(),
        entries: items.len() as u64,
        tables_log2,
        table_homes: sb.index_table_homes,
        body_crc,
        hash_check: sb.hash_check(),
        body_segments: segs.clone(),
        seg_alloc: seg_alloc.clone(),
    };
    let written = match p.space.zoned() {
        true => write_zoned(p.space, p.log, &taken, &items, manifest),
        false => write_body_and_manifest(p.log, &segs, &items, manifest),
    };
    if let Err(e) = written {
        p.space.release_index_segments(&segs).ok();
        // A failed write or flush means the device is failing: refuse writes.
        return Err(p.log.poison_io(e));
    }
    let old = std::mem::replace(cur, Current { id, segs, next_seq, next_alloc_seq: next_alloc_after });
    if let Err(e) = p.space.release_index_segments(&old.segs) {
        tracing::warn!(error = %e, "could not free the previous checkpoint's segments");
    }
    Ok((items.len() as u64, body_bytes + manifest_grains(sb) * g))
}

/// Encodes a checkpoint's items in order and writes them, run by run.
#[derive(Default)]
struct BodyWriter {
    /// Next item to encode.
    next: usize,
    /// Encoded bytes not yet written.
    pending: Vec<u8>,
    /// Checksum of the bytes written so far.
    crc: u32,
}

impl BodyWriter {
    /// Write the next `len` bytes of the body at `offset`, in IOs of at
    /// most [`CHECKPOINT_IO_BYTES`], in order.
    fn write_run(&mut self, log: &Log, items: &[Item], offset: u64, len: u64) -> Result<()> {
        let sb = &log.sb;
        let g = sb.grain_bytes as u64;
        let mut done = 0u64;
        while done < len {
            let chunk = (len - done).min(CHECKPOINT_IO_BYTES as u64) as usize;
            while self.pending.len() < chunk && self.next < items.len() {
                let mut b = [0u8; ITEM_BYTES];
                items[self.next].encode(&mut b);
                self.pending.extend_from_slice(&b);
                self.next += 1;
            }
            let padded = grains_for(chunk as u64, sb.grain_bytes) * g;
            let mut buf = AlignedBuf::zeroed(padded as usize);
            buf[..chunk].copy_from_slice(&self.pending[..chunk]);
            self.crc = crc32c_append(self.crc, &self.pending[..chunk]);
            self.pending.drain(..chunk);
            let at = offset + done;
            let (_, r) = log.dev.write_at(buf, at);
            r.map_err(|source| Error::Io { op: "checkpoint write", offset: at, source })?;
            done += chunk as u64;
        }
        Ok(())
    }
}

/// Write the manifest (`mg` grains) into the first grains after the
/// header of `seg`, the checkpoint's first segment.
fn write_manifest(log: &Log, seg: u32, mg: u64, m: Manifest) -> Result<()> {
    let g = log.sb.grain_bytes as u64;
    let mut buf = AlignedBuf::zeroed((mg * g) as usize);
    m.encode(&mut buf);
    let at = log.sb.segment_offset(seg) + g;
    let (_, r) = log.dev.write_at(buf, at);
    r.map_err(|source| Error::Io { op: "checkpoint manifest write", offset: at, source })
}

fn flush(log: &Log) -> Result<()> {
    log.dev.flush().map_err(|source| Error::Io { op: "flush", offset: 0, source })
}

fn write_body_and_manifest(
    log: &Log,
    segs: &[u32],
    items: &[Item],
    manifest: impl FnOnce(u32) -> Manifest,
) -> Result<()> {
    let mg = manifest_grains(&log.sb);
    let body_bytes = (items.len() * ITEM_BYTES) as u64;
    let mut body = BodyWriter::default();
    for (offset, len) in body_runs(&log.sb, segs, mg, body_bytes) {
        body.write_run(log, items, offset, len)?;
    }
    flush(log)?;
    write_manifest(log, segs[0], mg, manifest(body.crc))?;
    flush(log)
}

/// Zoned mode: the checkpoint's segments (`taken`: segment and alloc_seq,
/// headers not yet written) written one after another, each in order from
/// its header, at its zone's write pointer, and finished before the next
/// (so a checkpoint holds one open zone at a time): the first segment's
/// header, the manifest, the body. The manifest cannot follow the body
/// here (it lies before it, behind the write pointer once the body is
/// written), so it is written first, its body checksum computed from the
/// items beforehand; a crash before the body is complete leaves a
/// manifest whose body fails that checksum, or whose later segments carry
/// no header of the checkpoint, and the loader falls back to the previous
/// checkpoint (not freed until this one is complete) or a log scan.
fn write_zoned(
    space: &Space,
    log: &Log,
    taken: &[(u32, u64)],
    items: &[Item],
    manifest: impl FnOnce(u32) -> Manifest,
) -> Result<()> {
    let sb = &log.sb;
    let mg = manifest_grains(sb);
    let body_bytes = (items.len() * ITEM_BYTES) as u64;
    let mut crc = 0u32;
    let mut b = [0u8; ITEM_BYTES];
    for it in items {
        it.encode(&mut b);
        crc = crc32c_append(crc, &b);
    }
    let segs: Vec<u32> = taken.iter().map(|t| t.0).collect();
    let runs = body_runs(sb, &segs, mg, body_bytes);
    let id = taken[0].1;
    let mut manifest = Some(manifest);
    let mut body = BodyWriter::default();
    for &(seg, alloc_seq) in taken {
        space.write_index_header(seg, alloc_seq, id)?;
        if let Some(m) = manifest.take() {
            write_manifest(log, seg, mg, m(crc))?;
        }
        let (start, end) = (sb.segment_offset(seg), sb.segment_offset(seg) + sb.segment_bytes);
        for &(offset, len) in runs.iter().filter(|r| (start..end).contains(&r.0)) {
            body.write_run(log, items, offset, len)?;
        }
        space.finish_index_segment(seg);
    }
    debug_assert_eq!(body.crc, crc);
    flush(log)
}

/// A checkpoint read back and checked.
pub(crate) struct Loaded {
    pub manifest: Manifest,
    pub items: Vec<Item>,
    pub bytes_read: u64,
}

/// The manifests of the checkpoints on the device, newest first; whether
/// some manifest could not be read (an IO error: it might load on a later
/// open); and the highest id of a checkpoint of a version this build does
/// not read (another build may load it: its replay floor is at most its
/// id, since its segments were taken after it captured the floor). A
/// manifest that decodes wrong otherwise, or was never written, can never
/// load.
fn manifests(dev: &dyn Device, sb: &Superblock, headers: &Headers, quiet: bool) -> (Vec<Manifest>, bool, u64) {
    let g = sb.grain_bytes as u64;
    let mut candidates = Vec::new();
    let mut unreadable = false;
    let mut foreign = 0;
    for (seg, h) in &headers.index {
        if h.first_seq != h.alloc_seq {
            continue; // not a checkpoint's first segment
        }
        let offset = sb.segment_offset(*seg) + g;
        let (buf, r) = dev.read_at(AlignedBuf::zeroed((manifest_grains(sb) * g) as usize), offset);
        if let Err(e) = r {
            if !quiet {
                tracing::warn!(segment = seg, error = %e, "unreadable checkpoint manifest");
            }
            unreadable = true;
            continue;
        }
        match Manifest::decode(&buf) {
            Ok(m) if m.id == h.alloc_seq && m.body_segments.first() == Some(seg) => candidates.push(m),
            Ok(_) if quiet => {}
            Ok(_) => tracing::warn!(segment = seg, "checkpoint manifest does not match its segment; ignored"),
            // A checkpoint whose manifest was never written (a crash).
            Err(granary_format::FormatError::BadMagic { found: 0, .. }) => {}
            // Another build's checkpoint (a version this one does not
            // read): a later open by that build may load it, so the floor
            // counts it by its id, an upper bound of its replay floor.
            Err(e @ granary_format::FormatError::UnsupportedVersion { .. }) => {
                if !quiet {
                    tracing::warn!(segment = seg, error = %e, "checkpoint manifest of another version; not loaded");
                }
                foreign = foreign.max(h.alloc_seq);
            }
            Err(_) if quiet => {}
            Err(e) => tracing::warn!(segment = seg, error = %e, "checkpoint manifest rejected"),
        }
    }
    candidates.sort_by_key(|m| std::cmp::Reverse(m.id));
    (candidates, unreadable, foreign)
}

/// Read the checkpoint manifests on the device once, for an open: with
/// `load`, the newest checkpoint whose manifest, segments and body all
/// check out. Also the *replay floor*: the highest `replay_from` of every
/// checkpoint some open could load (0 if there is none; another build's
/// counted by its id), or `None` if a manifest could not be read. Whichever checkpoint a later open loads, it
/// replays every KV segment whose alloc_seq is at least the floor:
/// recovery resumes writing in such a segment's tail only (see `recover`).
/// (The lowest would not do: an older checkpoint still on the device, its
/// release lost, replays from further back than the newest one does.)
pub(crate) fn find(dev: &dyn Device, sb: &Superblock, headers: &Headers, load: bool) -> (Option<Loaded>, Option<u64>) {
    let (candidates, unreadable, foreign) = manifests(dev, sb, headers, !load);
    let floor = (!unreadable).then(|| candidates.iter().map(|m| m.replay_from).max().unwrap_or(0).max(foreign));
    if !load {
        return (None, floor);
    }
    for m in candidates {
        // Placed by another key hash than the superblock names (a copy
        // that lagged behind a re-key, or a build between): the view of
        // the seed changed since, and an older checkpoint of this hash is
        // no safer (a build that could not read this one did not keep the
        // older one's floor). Scan.
        if m.hash_check != sb.hash_check() {
            tracing::warn!(
                checkpoint = m.id,
                "checkpoint placed by another key hash than the superblock names; scanning the log"
            );
            return (None, floor);
        }
        match self::load(dev, sb, headers, m) {
            Ok(l) => return (Some(l), floor),
            Err(e) => tracing::warn!(error = %e, "checkpoint rejected; trying an older one or a log scan"),
        }
    }
    (None, floor)
}

fn load(dev: &dyn Device, sb: &Superblock, headers: &Headers, m: Manifest) -> Result<Loaded> {
    let mut body = Vec::new();
    let bytes_read = read_checked(dev, sb, headers, &m, |chunk| {
        // Called once the entry count is known to fit the segments.
        if body.is_empty() {
            body.reserve_exact(m.entries as usize * ITEM_BYTES);
        }
        body.extend_from_slice(chunk)
    })?;
    let items: Vec<Item> = body.chunks_exact(ITEM_BYTES).map(Item::decode).collect();
    Ok(Loaded { manifest: m, items, bytes_read })
}

/// Why the newest checkpoint would not load ([`check_newest`]).
pub(crate) struct Refused {
    pub id: u64,
    pub why: String,
    /// Damage where the body is flushed before the manifest: every check
    /// it fails (its geometry, its size, a read, its checksum, an item)
    /// but a body segment no longer its own.
    pub damage: bool,
}

/// A body segment of checkpoint `m` whose header no longer names it.
fn foreign_segment(headers: &Headers, m: &Manifest) -> Option<u32> {
    m.body_segments.iter().copied().find(|&seg| !headers.index.iter().any(|(s, h)| *s == seg && h.first_seq == m.id))
}

/// For `verify`: the newest checkpoint an open would try first, checked
/// as its load checks it (read a chunk at a time, not held), and why it
/// fails; None where it would load, where there is none, or where the open
/// would scan without trying it (placed by another key hash: a re-key's
/// crash leaves that, not damage). The caller holds the checkpoints
/// ([`Checkpoints::lock`]) from the reading of `headers` on, so none is
/// written or freed meanwhile.
pub(crate) fn check_newest(dev: &dyn Device, sb: &Superblock, headers: &Headers) -> Option<Refused> {
    let (candidates, ..) = manifests(dev, sb, headers, true);
    let m = candidates.into_iter().next()?;
    if m.hash_check != sb.hash_check() {
        return None;
    }
    if let Some(seg) = foreign_segment(headers, &m) {
        let why = format!("segment {seg} of checkpoint {} no longer belongs to it", m.id);
        return Some(Refused { id: m.id, why, damage: false });
    }
    let why = match read_checked(dev, sb, headers, &m, |_| {}).err()? {
        Error::Corruption { detail, .. } => detail,
        e => e.to_string(),
    };
    Some(Refused { id: m.id, why, damage: true })
}

/// Check checkpoint `m` as a load must: its geometry, its segments, then
/// its body read from the device a chunk at a time and handed to `take`,
/// against its checksum and the rules every item keeps. Returns the
/// body's length.
fn read_checked(
    dev: &dyn Device,
    sb: &Superblock,
    headers: &Headers,
    m: &Manifest,
    mut take: impl FnMut(&[u8]),
) -> Result<u64> {
    let bad = |detail: String| Error::Corruption { offset: sb.segment_offset(m.body_segments[0]), detail };
    if m.table_homes != sb.index_table_homes || m.seg_alloc.len() as u64 != sb.segment_count {
        return Err(bad(format!("checkpoint {} was written for another geometry", m.id)));
    }
    if let Some(seg) = foreign_segment(headers, m) {
        return Err(bad(format!("segment {seg} of checkpoint {} no longer belongs to it", m.id)));
    }
    let body_bytes = m.entries.checked_mul(ITEM_BYTES as u64).ok_or_else(|| bad("entry count overflows".into()))?;
    let g = sb.grain_bytes as u64;
    let runs = body_runs_checked(sb, &m.body_segments, manifest_grains(sb), body_bytes)
        .ok_or_else(|| bad(format!("checkpoint {} claims more entries than its segments hold", m.id)))?;
    let mut crc = 0u32;
    let mut item_error: Option<String> = None;
    let mut check_item = |it: Item| {
        if item_error.is_some() {
            return;
        }
        if !Entry(it.entry).is_well_formed() {
            item_error = Some(format!(
                "checkpoint {} holds an index entry with its hop-hint bits set ({:#018x})",
                m.id, it.entry
            ));
        } else if it.home as u64 >= m.table_homes as u64 {
            // No hash reaches a home past the table's: such an entry could
            // never be found (and the index's placement assumes its homes
            // exist).
            item_error = Some(format!(
                "checkpoint {} holds an index entry at home {} of a table of {} homes",
                m.id, it.home, m.table_homes
            ));
        }
    };
    for (offset, len) in runs {
        let mut done = 0;
        while done < len {
            let chunk = (len - done).min(CHECKPOINT_IO_BYTES as u64);
            let padded = grains_for(chunk, sb.grain_bytes) * g;
            let at = offset + done;
            let (buf, r) = dev.read_at(AlignedBuf::zeroed(padded as usize), at);
            r.map_err(|source| Error::Io { op: "checkpoint read", offset: at, source })?;
            let bytes = &buf[..chunk as usize];
            crc = crc32c_append(crc, bytes);
            take(bytes);
            // Whole items: a run is whole grains (of at least 512 bytes)
            // or the body's end, and a chunk a MiB of it.
            debug_assert_eq!(bytes.len() % ITEM_BYTES, 0);
            bytes.chunks_exact(ITEM_BYTES).for_each(|b| check_item(Item::decode(b)));
            done += chunk;
        }
    }
    if crc != m.body_crc {
        return Err(bad(format!(
            "checkpoint {} body checksum mismatch (stored {:#010x}, computed {crc:#010x})",
            m.id, m.body_crc
        )));
    }
    match item_error {
        Some(detail) => Err(bad(detail)),
        None => Ok(body_bytes),
    }
}

/// [`body_runs`], or None if the segments cannot hold the body.
pub(crate) fn body_runs_checked(sb: &Superblock, segs: &[u32], mg: u64, body_bytes: u64) -> Option<Vec<(u64, u64)>> {
    let g = sb.grain_bytes as u64;
    let room = (sb.segment_grains() - 1) * g * segs.len() as u64;
    // Checked: a manifest's entry count is the device's word (its checksum
    // holds for whatever wrote it), and a sum that wrapped would pass.
    let fits = body_bytes.checked_add(mg * g).is_some_and(|total| total <= room);
    (mg * g < (sb.segment_grains() - 1) * g && fits).then(|| body_runs(sb, segs, mg, body_bytes))
}
