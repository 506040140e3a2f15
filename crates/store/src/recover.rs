//! Recovery: rebuild the index by scanning the log (DESIGN §6).
//!
//! 1. Read every segment header. Segments with a valid KV header of this
//!    device are in use; everything else is free.
//! 2. Scan the used segments in allocation order. [`SegmentScanner`] reads
//!    each in large sequential windows and yields, at grain boundaries, every
//!    record whose header decodes, whose stamp is the segment's current one
//!    and whose header checksum holds; anything else is skipped a grain at a
//!    time (holes left by writes that never completed, leftovers of an
//!    earlier use of the segment).
//! 3. Each record is applied by sequence number: for its key, the highest
//!    sequence number wins, whatever the scan order; tombstones are versions
//!    like values, so a delete is never undone by an older value scanned
//!    later.
//! 4. A record whose header holds but whose whole-record checksum fails is
//!    *torn* if it lies in one of the [`TORN_TAIL_SEGMENTS`] newest segments
//!    of its stream (user writes or GC relocation: only there can a write
//!    have been in flight at a crash, and a torn write was never
//!    acknowledged): it is ignored and its first grain zeroed so it stays
//!    ignored. Elsewhere it is *damaged*: it is indexed like any record, so
//!    reading its key reports corruption instead of silently returning an
//!    older value.
//! 5. User writes resume after the last record of the newest user segment;
//!    relocation starts a new segment when GC next needs one.

use crate::error::{Error, Result};
use crate::space::SegmentFound;
use crate::store::Core;
use granary_format::hash::key_hash;
use granary_format::limits::*;
use granary_format::record::{self, RecordHeader};
use granary_format::segment::{SegmentHeader, SegmentKind, Stream};
use granary_format::{FormatError, Superblock};
use granary_io::{AlignedBuf, Device};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// Writes can be in flight only in this many newest segments.
pub const TORN_TAIL_SEGMENTS: usize = 2;
/// Bytes read per sequential window while scanning.
const SCAN_WINDOW_BYTES: u64 = 1 << 20;

/// What the last open found and did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecoveryReport {
    pub segments_scanned: u64,
    /// Records with valid checksums.
    pub records: u64,
    /// Records whose body failed its checksum outside the tail: indexed, reported on read.
    pub damaged_records: u64,
    /// Records whose body failed its checksum in the tail segments: ignored.
    pub torn_records: u64,
    /// Grains that held no record of the segment's current use.
    pub skipped_grains: u64,
    pub bytes_read: u64,
    pub millis: u64,
}

/// Reads one segment sequentially and yields its records.
pub(crate) struct SegmentScanner<'a> {
    dev: &'a dyn Device,
    sb: &'a Superblock,
    seed: u32,
    seg: u32,
    stamp: u32,
    win: AlignedBuf,
    win_start: u64,
    win_grains: u64,
    pos: u64,
    pub skipped_grains: u64,
    pub bytes_read: u64,
}

/// One record found by a scan: its first grain within the segment, its
/// header, and whether its whole-record checksum holds.
pub(crate) struct Scanned {
    pub grain: u64,
    pub hdr: RecordHeader,
    pub intact: bool,
}

impl<'a> SegmentScanner<'a> {
    pub(crate) fn new(dev: &'a dyn Device, sb: &'a Superblock, seed: u32, seg: u32, stamp: u32) -> Self {
        SegmentScanner {
            dev,
            sb,
            seed,
            seg,
            stamp,
            win: AlignedBuf::zeroed(0),
            win_start: 0,
            win_grains: 0,
            pos: 1,
            skipped_grains: 0,
            bytes_read: 0,
        }
    }

    fn g(&self) -> u64 {
        self.sb.grain_bytes as u64
    }

    /// Make grains `[start, start + n)` of the segment available in the window.
    fn ensure(&mut self, start: u64, n: u64) -> Result<()> {
        if start >= self.win_start && start + n <= self.win_start + self.win_grains {
            return Ok(());
        }
        let seg_grains = self.sb.segment_grains();
        let want = n.max(SCAN_WINDOW_BYTES / self.g()).min(seg_grains - start);
        let bytes = (want * self.g()) as usize;
        let buf = std::mem::replace(&mut self.win, AlignedBuf::zeroed(0));
        let mut buf = if buf.capacity() >= bytes { buf } else { AlignedBuf::zeroed(bytes) };
        buf.set_len(bytes);
        let offset = self.sb.segment_offset(self.seg) + start * self.g();
        let (buf, r) = self.dev.read_at(buf, offset);
        self.win = buf;
        r.map_err(|source| Error::Io { op: "read during log scan", offset, source })?;
        self.bytes_read += bytes as u64;
        self.win_start = start;
        self.win_grains = want;
        Ok(())
    }

    /// Bytes of the window from grain `start` (which must be in the window).
    pub(crate) fn bytes_at(&self, start: u64) -> &[u8] {
        let from = ((start - self.win_start) * self.g()) as usize;
        &self.win[from..]
    }

    /// Bytes at grain address `pba` if the window holds `grains` grains there.
    pub(crate) fn window_at(&self, pba: u64, grains: u64) -> Option<&[u8]> {
        let seg_pba = (self.sb.segment_offset(self.seg)) / self.g();
        let start = pba.checked_sub(seg_pba)?;
        (start >= self.win_start && start + grains <= self.win_start + self.win_grains).then(|| self.bytes_at(start))
    }

    /// The next record, or None at the end of the segment.
    pub(crate) fn next_record(&mut self) -> Result<Option<Scanned>> {
        let seg_grains = self.sb.segment_grains();
        let g = self.sb.grain_bytes;
        while self.pos < seg_grains {
            let pos = self.pos;
            self.ensure(pos, 1)?;
            let hdr = match RecordHeader::decode(self.bytes_at(pos)) {
                Ok(h) if h.seg_stamp == self.stamp && pos + h.grains(g) <= seg_grains => h,
                _ => {
                    self.pos += 1;
                    self.skipped_grains += 1;
                    continue;
                }
            };
            let grains = hdr.grains(g);
            self.ensure(pos, grains_for((RECORD_HEADER_BYTES + hdr.key_len as usize) as u64, g))?;
            if record::verify_header_crc(self.seed, &hdr, self.bytes_at(pos)).is_err() {
                self.pos += 1;
                self.skipped_grains += 1;
                continue;
            }
            self.ensure(pos, grains)?;
            let intact = record::verify_crc(self.seed, &hdr, self.bytes_at(pos)).is_ok();
            self.pos += grains;
            return Ok(Some(Scanned { grain: pos, hdr, intact }));
        }
        Ok(None)
    }
}

/// Read and classify every segment header: the used segments sorted by
/// allocation sequence with their headers, and the highest alloc_seq of any
/// header (free ones included, so allocation sequences never repeat).
pub(crate) fn read_segment_headers(
    dev: &dyn Device,
    sb: &Superblock,
) -> Result<(Vec<(SegmentFound, SegmentHeader)>, u64)> {
    let g = sb.grain_bytes as usize;
    let mut used = Vec::new();
    let mut max_alloc = 0;
    for seg in 0..sb.segment_count as u32 {
        let offset = sb.segment_offset(seg);
        let (buf, r) = dev.read_at(AlignedBuf::zeroed(g), offset);
        r.map_err(|source| Error::Io { op: "read of a segment header", offset, source })?;
        match SegmentHeader::decode(&buf) {
            Ok(h) if h.uuid == sb.uuid => {
                max_alloc = max_alloc.max(h.alloc_seq);
                if h.segment_index != seg || h.grain_bytes != sb.grain_bytes || h.segment_bytes != sb.segment_bytes {
                    return Err(Error::Corruption {
                        offset,
                        detail: format!("segment header of segment {seg} disagrees with the superblock: {h:?}"),
                    });
                }
                match h.kind {
                    SegmentKind::Kv => used.push((SegmentFound { seg, alloc_seq: h.alloc_seq }, h)),
                    // Index checkpoints are not written by this version; a
                    // reclaimed segment holds nothing current.
                    SegmentKind::Index | SegmentKind::Free => {}
                }
            }
            Ok(_) => {} // another store's leftovers
            Err(FormatError::BadMagic { found: 0, .. }) => {}
            Err(e) => {
                // A header whose write never completed: no record in the
                // segment was ever acknowledged (headers go first).
                tracing::warn!(segment = seg, error = %e, "unreadable segment header; treating the segment as free");
            }
        }
    }
    used.sort_by_key(|(s, _)| s.alloc_seq);
    Ok((used, max_alloc))
}

impl Core {
    /// Rebuild the index from the log. Called once, by `open`.
    pub(crate) fn recover(&self) -> Result<()> {
        let started = Instant::now();
        let (used, max_alloc) = read_segment_headers(self.dev.as_ref(), &self.sb)?;
        let found: Vec<SegmentFound> =
            used.iter().map(|(s, _)| SegmentFound { seg: s.seg, alloc_seq: s.alloc_seq }).collect();
        self.space.install(&found, max_alloc, None);
        // The newest TORN_TAIL_SEGMENTS of each stream may hold torn writes.
        let mut in_tail = vec![false; used.len()];
        for stream in [Stream::User, Stream::Relocation] {
            let mine: Vec<usize> = (0..used.len()).filter(|&i| used[i].1.stream == stream).collect();
            for &i in mine.iter().rev().take(TORN_TAIL_SEGMENTS) {
                in_tail[i] = true;
            }
        }
        let resume_seg = used.iter().rev().find(|(_, h)| h.stream == Stream::User).map(|(s, _)| s.seg);
        let mut report = RecoveryReport::default();
        let mut max_seq = used.iter().map(|(_, h)| h.first_seq.saturating_sub(1)).max().unwrap_or(0);
        let mut resume = None;
        let total = used.len();
        let mut last_log = Instant::now();
        for (i, (s, _)) in used.iter().enumerate() {
            let tail = in_tail[i];
            let mut scan = SegmentScanner::new(self.dev.as_ref(), &self.sb, self.seed, s.seg, s.alloc_seq as u32);
            let mut end = 1;
            while let Some(rec) = scan.next_record()? {
                end = rec.grain + rec.hdr.grains(self.sb.grain_bytes);
                max_seq = max_seq.max(rec.hdr.seq);
                if rec.intact {
                    report.records += 1;
                } else if tail {
                    report.torn_records += 1;
                    self.neutralise_torn(s.seg, rec.grain)?;
                    continue;
                } else {
                    report.damaged_records += 1;
                    tracing::warn!(
                        segment = s.seg,
                        grain = rec.grain,
                        seq = rec.hdr.seq,
                        "damaged record (body checksum mismatch); its key will report corruption"
                    );
                }
                self.apply(&scan, s.seg, &rec)?;
            }
            report.segments_scanned += 1;
            report.skipped_grains += scan.skipped_grains;
            report.bytes_read += scan.bytes_read;
            if Some(s.seg) == resume_seg {
                resume = Some((s.seg, end));
            }
            if last_log.elapsed().as_secs() >= 2 {
                tracing::info!(scanned = i + 1, segments = total, records = report.records, "recovery in progress");
                last_log = Instant::now();
            }
        }
        self.space.install(&found, max_alloc, resume);
        self.next_seq.store(max_seq + 1, Relaxed);
        report.millis = started.elapsed().as_millis() as u64;
        if report.torn_records > 0 {
            tracing::warn!(torn = report.torn_records, "ignored records torn by a crash (never acknowledged)");
        }
        // Quick recoveries (every CLI call) stay quiet; long ones report.
        let keys = self.counters.keys.load(Relaxed);
        let (segments, records, millis, mb_read) =
            (report.segments_scanned, report.records, report.millis, report.bytes_read >> 20);
        if millis >= 1000 {
            tracing::info!(segments, records, keys, millis, mb_read, "recovered index by log scan");
        } else {
            tracing::debug!(segments, records, keys, millis, mb_read, "recovered index by log scan");
        }
        *self.recovery.lock().unwrap_or_else(|e| e.into_inner()) = report;
        Ok(())
    }

    /// Zero the first grain of a torn record so later scans skip it too,
    /// even once its segment is no longer among the newest.
    fn neutralise_torn(&self, seg: u32, grain: u64) -> Result<()> {
        let pba = self.space.pba(seg, grain);
        let offset = pba * self.grain();
        tracing::warn!(segment = seg, grain, offset, "torn record ignored and cleared");
        let (_, r) = self.dev.write_at(AlignedBuf::zeroed(self.grain() as usize), offset);
        r.map_err(|source| Error::Io { op: "write clearing a torn record", offset, source })
    }

    /// Apply one scanned record: it becomes the key's current version if its
    /// sequence number is higher than the one indexed.
    fn apply(&self, scan: &SegmentScanner<'_>, seg: u32, rec: &Scanned) -> Result<()> {
        let g = self.sb.grain_bytes;
        let bytes = scan.bytes_at(rec.grain);
        let key = record::key_of(&rec.hdr, bytes);
        let h = key_hash(key);
        let pba = self.space.pba(seg, rec.grain);
        let grains = rec.hdr.grains(g);
        let kv_size = if rec.hdr.is_tombstone() { 0 } else { grains };
        for &e in self.index.lookup(h).as_slice() {
            // The candidate was checked when it was applied; read its header
            // and key from the scan window when they are there, else from
            // the device.
            let in_window = scan.window_at(e.pba(), 1).and_then(|b| {
                let ch = RecordHeader::decode(b).ok()?;
                (b.len() >= RECORD_HEADER_BYTES + ch.key_len as usize).then(|| {
                    let m = record::key_of(&ch, b) == key;
                    (ch, m)
                })
            });
            let (chdr, ckey_match) = match in_window {
                Some(x) => x,
                None => {
                    let (ch, buf) = self.read_record(e, false)?;
                    let m = record::key_of(&ch, &buf) == key;
                    (ch, m)
                }
            };
            if !ckey_match {
                continue;
            }
            if rec.hdr.seq > chdr.seq {
                let replaced = self.index.replace(h, e.pba(), kv_size, pba);
                assert!(replaced, "entry vanished during single-threaded recovery");
                self.space.sub_live(self.sb.segment_of(e.pba()), chdr.grains(g) * g as u64);
                self.space.add_live(seg, grains * g as u64);
                self.counters.replaced(chdr.is_tombstone(), rec.hdr.is_tombstone());
            }
            return Ok(());
        }
        self.index.insert(h, kv_size, pba).map_err(Error::IndexFull)?;
        self.space.add_live(seg, grains * g as u64);
        self.counters.added(rec.hdr.is_tombstone());
        Ok(())
    }
}
