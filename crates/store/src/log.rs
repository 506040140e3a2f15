//! The log on the device: reading its segments and records back. Owns
//! what recovery, GC, checkpoints and `verify` all read with:
//!
//! - [`read_segment_headers`]: every segment header, classified (KV
//!   segments in use in allocation order, index segments, the highest
//!   allocation sequence).
//! - [`SegmentScanner`]: one segment read sequentially in large windows,
//!   yielding, at grain boundaries, every record whose header decodes,
//!   whose stamp is the segment's current one and whose header checksum
//!   holds; anything else is skipped a grain at a time.
//! - [`ReadAhead`]: a helper thread that reads a scanner's next window
//!   while the current one is parsed.
//!
//! Invariants: a record is yielded only with its segment's current stamp
//! (a leftover of an earlier use of the segment never passes for a record
//! of this one), and `intact` tells whether its whole-record checksum
//! holds; what to do with a record that is not intact is the caller's
//! rule (recovery's torn-tail rule, GC's and verify's corruption reports).
//! - [`Log`]: the device, its superblock, the record checksum seed, the
//!   sequence numbers, the durability mode and the store's health (a
//!   device failure poisons it: writes are refused until it is reopened);
//!   [`Log::read_record`] reads back the record an index entry points at
//!   and checks it.
//!
//! This module decides nothing about the index.

use crate::error::{Error, Result};
use crate::options::Durability;
use crate::space::{SegmentFound, Space};
use granary_format::limits::*;
use granary_format::record::{self, RecordHeader};
use granary_format::segment::{SegmentHeader, SegmentKind};
use granary_format::summary;
use granary_format::{FormatError, Superblock};
use granary_index::Entry;
use granary_io::{AlignedBuf, Device};
use granary_rt::block_on;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

/// Bytes read per sequential window while scanning.
const SCAN_WINDOW_BYTES: u64 = 1 << 20;

/// A helper thread that reads a scanner's next window while the scanner
/// parses the current one, so the scan's IO and CPU overlap (a scanner
/// otherwise waits for every 1 MiB read, about half of a scan of small
/// records). One outstanding read at a time.
pub(crate) struct ReadAhead {
    tx: Option<std::sync::mpsc::Sender<(u64, AlignedBuf)>>,
    rx: std::sync::mpsc::Receiver<(u64, AlignedBuf, std::io::Result<()>)>,
    /// Offset and length of the read in flight.
    pending: Option<(u64, usize)>,
}

impl ReadAhead {
    /// Start the helper in `scope`; it ends when the `ReadAhead` is dropped.
    pub(crate) fn start<'scope, 'env: 'scope>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        dev: &'env dyn Device,
    ) -> ReadAhead {
        let (tx, requests) = std::sync::mpsc::channel::<(u64, AlignedBuf)>();
        let (done, rx) = std::sync::mpsc::channel();
        scope.spawn(move || {
            for (offset, buf) in requests {
                let (buf, r) = dev.read_at(buf, offset);
                if done.send((offset, buf, r)).is_err() {
                    break;
                }
            }
        });
        ReadAhead { tx: Some(tx), rx, pending: None }
    }

    /// Read `len` bytes at `offset` into `buf` (reused when large enough).
    fn request(&mut self, offset: u64, len: usize, buf: AlignedBuf) {
        self.discard();
        let mut buf = if buf.capacity() >= len { buf } else { AlignedBuf::zeroed(len) };
        buf.set_len(len);
        if self.tx.as_ref().is_some_and(|tx| tx.send((offset, buf)).is_ok()) {
            self.pending = Some((offset, len));
        }
    }

    /// Offset and length of the read in flight.
    fn pending(&self) -> Option<(u64, usize)> {
        self.pending
    }

    /// The read in flight, once done.
    fn take_pending(&mut self) -> Option<(AlignedBuf, std::io::Result<()>)> {
        self.pending.take()?;
        self.rx.recv().ok().map(|(_, buf, r)| (buf, r))
    }

    fn discard(&mut self) {
        if self.pending.take().is_some() {
            let _ = self.rx.recv();
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.discard();
        self.tx = None; // ends the helper's loop
    }
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
    /// Where the scan met the segment's summary (the records end before
    /// it), if it did.
    pub summary_at: Option<u64>,
    pub bytes_read: u64,
    pub windows_read_ahead: u64,
    /// Do not read the rest of a value that does not fit in the window: its
    /// body checksum is then not checked here (reads check it).
    skip_values: bool,
    /// Grains the next window read covers at least: 1 right after a skipped
    /// value larger than a window (probe the next header), else a whole
    /// window.
    next_window: u64,
    /// Reads the next window ahead, when given (see [`ReadAhead`]).
    ahead: Option<&'a mut ReadAhead>,
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
            summary_at: None,
            bytes_read: 0,
            windows_read_ahead: 0,
            skip_values: false,
            next_window: SCAN_WINDOW_BYTES / sb.grain_bytes as u64,
            ahead: None,
        }
    }

    /// Read each next window ahead with `ra` while this one is parsed.
    pub(crate) fn reading_ahead(mut self, ra: &'a mut ReadAhead) -> Self {
        self.ahead = Some(ra);
        self
    }

    /// Read headers and keys only where a value runs past the window (for
    /// recovery of segments where no write can be torn).
    pub(crate) fn skipping_values(mut self) -> Self {
        self.skip_values = true;
        self.next_window = 1; // the first record may be a large one
        self
    }

    fn g(&self) -> u64 {
        self.sb.grain_bytes as u64
    }

    /// Make grains `[start, start + n)` of the segment available in the window.
    fn ensure(&mut self, start: u64, n: u64) -> Result<()> {
        let win_end = self.win_start + self.win_grains;
        if start >= self.win_start && start + n <= win_end {
            return Ok(());
        }
        let (g, seg_grains) = (self.g(), self.sb.segment_grains());
        let full = SCAN_WINDOW_BYTES / g;
        let seg_off = self.sb.segment_offset(self.seg);
        let next_window = std::mem::replace(&mut self.next_window, full);
        // The window read ahead, when it serves this request: as the new
        // window if it holds [start, start + n), or joined to the tail of
        // the current one when a record runs from one into the other.
        // (A read ahead for another segment, left by the scan of the one
        // before, serves nothing here: it may lie before this one.)
        let ahead = self.ahead.as_ref().and_then(|ra| ra.pending()).and_then(|(off, len)| {
            let a = off.checked_sub(seg_off)? / g;
            (a < seg_grains).then(|| (a, a + len as u64 / g))
        });
        if let Some((a, a_end)) = ahead {
            let inside = start >= a && start + n <= a_end;
            let joined = a == win_end && start >= self.win_start && start < win_end && start + n <= a_end;
            // (None: the helper is gone; read as if there were none.)
            let taken = if inside || joined { self.ahead.as_mut().and_then(|ra| ra.take_pending()) } else { None };
            if let Some((buf, r)) = taken {
                r.map_err(|source| Error::Io { op: "read during log scan", offset: seg_off + a * g, source })?;
                self.windows_read_ahead += 1;
                self.bytes_read += buf.len() as u64;
                let spare = if inside {
                    self.win_start = a;
                    std::mem::replace(&mut self.win, buf)
                } else {
                    // Copy the current window's tail from `start` (less than
                    // a record) in front of the window read ahead.
                    let head = &self.win[((start - self.win_start) * g) as usize..(self.win_grains * g) as usize];
                    let mut joined = AlignedBuf::zeroed(head.len() + buf.len());
                    joined[..head.len()].copy_from_slice(head);
                    joined[head.len()..].copy_from_slice(&buf);
                    self.win_start = start;
                    drop(std::mem::replace(&mut self.win, joined));
                    buf
                };
                self.win_grains = self.win.len() as u64 / g;
                self.read_ahead_next(spare);
                return Ok(());
            }
        }
        let want = n.max(next_window).min(seg_grains - start);
        let bytes = (want * g) as usize;
        if let Some(ra) = self.ahead.as_mut() {
            ra.discard();
        }
        let old = std::mem::replace(&mut self.win, AlignedBuf::zeroed(0));
        let mut buf = if old.capacity() >= bytes { old } else { AlignedBuf::zeroed(bytes) };
        buf.set_len(bytes);
        let offset = seg_off + start * g;
        let (buf, r) = self.dev.read_at(buf, offset);
        self.win = buf;
        r.map_err(|source| Error::Io { op: "read during log scan", offset, source })?;
        self.bytes_read += bytes as u64;
        self.win_start = start;
        self.win_grains = want;
        if want == full {
            self.read_ahead_next(AlignedBuf::zeroed(0));
        }
        Ok(())
    }

    /// Ask the read-ahead for the window after the current one (records of
    /// a grain or so continue right there), reusing `spare`'s memory.
    fn read_ahead_next(&mut self, spare: AlignedBuf) {
        let (g, seg_grains) = (self.g(), self.sb.segment_grains());
        let next = self.win_start + self.win_grains;
        let offset = self.sb.segment_offset(self.seg) + next * g;
        if let Some(ra) = self.ahead.as_mut() {
            if next < seg_grains {
                let len = ((SCAN_WINDOW_BYTES / g).min(seg_grains - next) * g) as usize;
                ra.request(offset, len, spare);
            }
        }
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

    /// Whether the segment's summary starts at grain `pos` (in the window).
    fn summary_starts(&self, pos: u64) -> bool {
        let b = self.bytes_at(pos);
        b.starts_with(b"GSUM")
            && summary::Block::decode(self.seed, b).is_ok_and(|s| s.heads(self.stamp, pos, self.sb.segment_grains()))
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
                _ if self.summary_starts(pos) => {
                    // Nothing after it is a record.
                    self.summary_at = Some(pos);
                    self.pos = seg_grains;
                    return Ok(None);
                }
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
            if self.skip_values && pos + grains > self.win_start + self.win_grains {
                self.pos += grains;
                // A value larger than a window: probe the next header with
                // one grain (the next value may be as large). A record that
                // only straddles the window's end: a whole window next
                // (probing there would read each later record of a few
                // grains on its own, one small IO each).
                if grains >= SCAN_WINDOW_BYTES / g as u64 {
                    self.next_window = 1;
                }
                return Ok(Some(Scanned { grain: pos, hdr, intact: true }));
            }
            self.ensure(pos, grains)?;
            let intact = record::verify_crc(self.seed, &hdr, self.bytes_at(pos)).is_ok();
            self.pos += grains;
            return Ok(Some(Scanned { grain: pos, hdr, intact }));
        }
        Ok(None)
    }
}

/// Every segment header read on open, classified.
pub(crate) struct Headers {
    /// KV segments in use, sorted by alloc_seq.
    pub kv: Vec<(SegmentFound, SegmentHeader)>,
    /// Segments holding (parts of) index checkpoints.
    pub index: Vec<(u32, SegmentHeader)>,
    /// The highest alloc_seq of any header (free ones included, so
    /// allocation sequences never repeat).
    pub max_alloc: u64,
    /// Segments whose header is this store's (magic and UUID) but fails
    /// its checksum, with the error: damaged on the media (a header fits
    /// one sector, which a crash leaves whole or unwritten, so no crash
    /// tears one). Such a segment is taken for free: whatever it held is
    /// not indexed, and it is written over when next allocated, so
    /// `verify` reports each.
    pub damaged: Vec<(u32, String)>,
}

/// Read and classify every segment header.
pub(crate) fn read_segment_headers(dev: &dyn Device, sb: &Superblock) -> Result<Headers> {
    let g = sb.grain_bytes as usize;
    let mut used = Vec::new();
    let mut index = Vec::new();
    let mut max_alloc = 0;
    let mut damaged = Vec::new();
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
                    SegmentKind::Kv => used.push((
                        SegmentFound { seg, alloc_seq: h.alloc_seq, stream: h.stream, first_seq: h.first_seq },
                        h,
                    )),
                    SegmentKind::Index => index.push((seg, h)),
                    // A reclaimed segment holds nothing current.
                    SegmentKind::Free => {}
                }
            }
            Ok(_) => {} // another store's leftovers
            Err(FormatError::BadMagic { found: 0, .. }) => {}
            // Magic and checksum hold (they are checked first) but the
            // header names a version, kind or stream this build does not
            // know: a newer build's segment of this store. Taking it for
            // free would lose its records and reuse it.
            Err(e @ (FormatError::UnsupportedVersion { .. } | FormatError::BadField { .. }))
                if granary_format::segment::uuid_field(&buf) == sb.uuid =>
            {
                return Err(Error::Corruption {
                    offset,
                    detail: format!(
                        "segment header of segment {seg}: {e}; written by a newer build? \
                         Refusing to open rather than treat the segment as free"
                    ),
                });
            }
            Err(e) => {
                // Not this store's header (garbage, or a header's write
                // that never reached the media: nothing in the segment
                // was acknowledged, headers go first), or this store's,
                // damaged (listed).
                if granary_format::segment::uuid_field(&buf) == sb.uuid && matches!(e, FormatError::Checksum { .. }) {
                    damaged.push((seg, e.to_string()));
                }
                tracing::warn!(segment = seg, error = %e, "unreadable segment header; treating the segment as free");
            }
        }
    }
    used.sort_by_key(|(s, _)| s.alloc_seq);
    Ok(Headers { kv: used, index, max_alloc, damaged })
}

/// The log of an open store: where records go and how they are read back.
pub(crate) struct Log {
    pub dev: Arc<dyn Device>,
    pub sb: Superblock,
    /// Seed of every record checksum (from the store's UUID).
    pub seed: u32,
    pub durability: Durability,
    /// The sequence number the next record gets.
    pub next_seq: AtomicU64,
    /// Values with a sequence number at or below this were flushed
    /// (`Store::flush_all`): they read as absent and GC drops them.
    pub flush_floor: AtomicU64,
    /// Why the store refuses writes, once a device operation failed.
    poisoned: OnceLock<String>,
    /// Opened for an inspection (`OpenOptions::clear_torn` off): the open
    /// mended nothing a crash left (torn records, zones), so writes are
    /// refused.
    inspecting: std::sync::atomic::AtomicBool,
}

impl Log {
    pub(crate) fn new(dev: Arc<dyn Device>, sb: Superblock, seed: u32, durability: Durability) -> Log {
        Log {
            dev,
            sb,
            seed,
            durability,
            next_seq: AtomicU64::new(1),
            flush_floor: AtomicU64::new(0),
            poisoned: OnceLock::new(),
            inspecting: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(crate) fn grain(&self) -> u64 {
        self.sb.grain_bytes as u64
    }

    /// Whether a value with this header and stored key was hidden by
    /// expiry or by a flush (`flush_all` of the default namespace: the
    /// floor hides its keys only).
    pub(crate) fn hidden(&self, hdr: &RecordHeader, key: &[u8], now: u32) -> bool {
        self.hidden_at(hdr.seq, hdr.expires, key, now)
    }

    /// [`Log::hidden`] of a record of sequence number `seq` and expiry
    /// time `expires` (a DRAM tier item's).
    pub(crate) fn hidden_at(&self, seq: u64, expires: u32, key: &[u8], now: u32) -> bool {
        (expires != 0 && expires <= now)
            || (seq <= self.flush_floor.load(Relaxed)
                && crate::nskey::owner(key) == crate::nskey::Owner::Ns(crate::nskey::DEFAULT_NS))
    }

    /// Err once the store is poisoned.
    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.inspecting.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::InvalidOptions(
                "the store was opened for an inspection (OpenOptions::clear_torn off): it takes no writes".into(),
            ));
        }
        match self.poisoned.get() {
            Some(cause) => Err(Error::Poisoned { cause: cause.clone() }),
            None => Ok(()),
        }
    }

    /// Refuse writes from now on: the store was opened for an inspection.
    pub(crate) fn inspect_only(&self) {
        self.inspecting.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// A device operation failed: refuse writes from now on; returns `err`.
    /// Logged once: the first failure that poisons the store (later ones
    /// are the same device's trouble, and come back to their callers).
    pub(crate) fn poison(&self, err: Error) -> Error {
        if self.poisoned.set(err.to_string()).is_ok() {
            tracing::error!(error = %err, "device failure: the store is read-only until reopened (reads continue)");
        }
        err
    }

    /// [`Log::poison`] for a device error (`Error::Io`); any other error
    /// comes back as it is.
    pub(crate) fn poison_io(&self, err: Error) -> Error {
        match err {
            Error::Io { .. } => self.poison(err),
            e => e,
        }
    }

    /// The summary at the end of segment `seg` (stamp `stamp`), if it has
    /// one whose last block holds: the region's bytes and that block (the
    /// caller decodes the entries, `summary::decode`). A read that fails
    /// is no summary (the caller reads the records instead).
    pub(crate) fn read_summary(&self, seg: u32, stamp: u32) -> Option<(AlignedBuf, summary::Block)> {
        let g = self.sb.grain_bytes as u64;
        let seg_grains = self.sb.segment_grains();
        let read = |grains: u64| {
            let offset = self.sb.segment_offset(seg) + (seg_grains - grains) * g;
            let (buf, r) = self.dev.read_at(AlignedBuf::for_read((grains * g) as usize), offset);
            r.map(|()| buf).map_err(|e| tracing::debug!(segment = seg, error = %e, "a summary read failed"))
        };
        let last = read(1).ok()?;
        let block = summary::trailer(self.seed, stamp, seg_grains, &last).ok()?;
        let region = match block.region_grains {
            1 => last,
            n => read(n as u64).ok()?,
        };
        Some((region, block))
    }

    /// Why the store refuses writes, once poisoned.
    pub(crate) fn poisoned(&self) -> Option<String> {
        self.poisoned.get().cloned()
    }

    /// Flush the device, in `Flush` mode only; `offset` is the write the
    /// flush makes durable (for the error).
    pub(crate) fn flush_if_durable(&self, offset: u64) -> Result<()> {
        if self.durability == Durability::Flush {
            self.dev.flush().map_err(|source| Error::Io { op: "flush", offset, source })?;
        }
        Ok(())
    }

    /// [`Log::flush_if_durable`] as a future ([`Device::flush_async`]).
    pub(crate) async fn flush_if_durable_async(&self, offset: u64) -> Result<()> {
        if self.durability == Durability::Flush {
            self.dev.flush_async().await.map_err(|source| Error::Io { op: "flush", offset, source })?;
        }
        Ok(())
    }

    async fn io_read(&self, grains: u64, pba: u64) -> Result<AlignedBuf> {
        let offset = pba * self.grain();
        let (buf, r) = self.dev.read_at_async(AlignedBuf::for_read((grains * self.grain()) as usize), offset).await;
        r.map_err(|source| Error::Io { op: "read", offset, source })?;
        Ok(buf)
    }

    /// Read the record an entry points at and check it against the entry,
    /// its segment's stamp and its header checksum; with `full`, read all of
    /// it and check the whole-record checksum too.
    pub(crate) fn read_record(&self, space: &Space, e: Entry, full: bool) -> Result<(RecordHeader, AlignedBuf)> {
        block_on(self.read_record_async(space, e, full))
    }

    /// [`Log::read_record`], asynchronously.
    pub(crate) async fn read_record_async(
        &self,
        space: &Space,
        e: Entry,
        full: bool,
    ) -> Result<(RecordHeader, AlignedBuf)> {
        let offset = e.pba() * self.grain();
        let corrupt = |detail: String| Error::Corruption { offset, detail };
        let seg = self.sb.segment_of(e.pba());
        let seg_start = space.pba(seg, 0);
        let seg_end = seg_start + self.sb.segment_grains();
        let hint = match e.kv_size() {
            0 => 1,
            n if n == KV_SIZE_GRAINS_MAX => 1,
            n => n as u64,
        };
        if e.pba() + hint > seg_end || e.pba() == seg_start {
            return Err(corrupt(format!("index entry {e:?} points outside a segment's records")));
        }
        let mut buf = self.io_read(hint, e.pba()).await?;
        let hdr = RecordHeader::decode(&buf).map_err(|fe| corrupt(fe.to_string()))?;
        let stamp = space.stamp(seg);
        if hdr.seg_stamp != stamp {
            return Err(corrupt(format!(
                "record stamp {} does not match segment {seg}'s stamp {stamp} (stale record)",
                hdr.seg_stamp
            )));
        }
        if hdr.is_tombstone() != e.is_tombstone() {
            return Err(corrupt("record kind does not match its index entry".into()));
        }
        let grains = hdr.grains(self.sb.grain_bytes);
        let size_ok = match e.kv_size() {
            0 => true,
            n if n == KV_SIZE_GRAINS_MAX => grains >= n as u64,
            n => grains == n as u64,
        };
        if !size_ok || e.pba() + grains > seg_end {
            return Err(corrupt(format!("record of {grains} grains does not match its index entry {e:?}")));
        }
        let need = if full {
            grains
        } else {
            // The header, the key and an explicit CAS value (see `cas_of`).
            grains_for(record::cas_bytes_needed(&hdr) as u64, self.sb.grain_bytes).min(grains)
        };
        if need > hint {
            buf = self.io_read(need, e.pba()).await?;
        }
        record::verify_header_crc(self.seed, &hdr, &buf).map_err(|fe| corrupt(fe.to_string()))?;
        if full {
            record::verify_crc(self.seed, &hdr, &buf).map_err(|fe| corrupt(fe.to_string()))?;
            if hdr.damaged_copy {
                return Err(corrupt("record was damaged before GC relocated it".into()));
            }
        }
        Ok((hdr, buf))
    }
}
