//! Recovery: rebuild the index by scanning the log (DESIGN §6).
//!
//! 1. Read every segment header. Segments with a valid KV header of this
//!    device are in use; everything else is free.
//! 2. Scan the used segments (in parallel). [`SegmentScanner`] reads
//!    each in large sequential windows (outside the tail segments, skipping
//!    the rest of any value that runs past a window: only headers and keys
//!    are needed) and yields, at grain boundaries, every
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
//! 5. Two copies of one record (equal sequence numbers: a crash between
//!    GC's copy and the free of its victim): the one in the newer segment
//!    is indexed, the other listed until its segment is freed
//!    (`gc::DroppedKeys`).
//! 6. Writes resume in the tail of the newest segment of each stream when
//!    every checkpoint on the device replays it ([`Core::resume_tails`]);
//!    otherwise user writes start a new segment, and so does relocation
//!    when GC next needs one.

use crate::checkpoint::{Current, Loaded};
use crate::error::{Error, Result};
use crate::options::OpenOptions;
use crate::space::SegmentFound;
use crate::store::Core;
use granary_format::hash::key_hash;
use granary_format::limits::*;
use granary_format::record::{self, RecordHeader};
use granary_format::segment::{SegmentHeader, SegmentKind, Stream};
use granary_format::{FormatError, Superblock};
use granary_index::Entry;
use granary_io::{AlignedBuf, Device};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

/// Most threads a recovery uses.
pub const RECOVERY_THREADS_MAX: usize = 16;

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
    /// Scan windows that a read-ahead had already read.
    pub windows_read_ahead: u64,
    /// Whole open, and the log scan part of it.
    pub millis: u64,
    pub scan_millis: u64,
    /// Threads that loaded and scanned.
    pub threads: u64,
    /// The checkpoint loaded (its id; 0: none, the whole log was scanned).
    pub checkpoint_id: u64,
    /// The session that wrote it.
    pub checkpoint_session: u64,
    /// Its entries put in the index, and those dropped as stale.
    pub checkpoint_entries: u64,
    pub checkpoint_dropped: u64,
    pub checkpoint_bytes: u64,
    pub checkpoint_millis: u64,
    /// The checkpoint was written by a clean close and nothing was written
    /// after it (checked, not assumed): no log was replayed.
    pub clean_shutdown: bool,
}

impl RecoveryReport {
    fn add(&mut self, o: &RecoveryReport) {
        self.segments_scanned += o.segments_scanned;
        self.records += o.records;
        self.damaged_records += o.damaged_records;
        self.torn_records += o.torn_records;
        self.skipped_grains += o.skipped_grains;
        self.bytes_read += o.bytes_read;
        self.windows_read_ahead += o.windows_read_ahead;
    }

    /// Log scan rate in MB/s (0 when nothing was scanned).
    pub fn scan_mb_per_s(&self) -> f64 {
        if self.scan_millis == 0 {
            return 0.0;
        }
        (self.bytes_read as f64 / 1e6) / (self.scan_millis as f64 / 1e3)
    }
}

/// 16 bits of the key hash of every record the scan indexed, by grain
/// address: candidates sharing a key's home and tag (frequent once the
/// directory has many tables, whose selector bits the tag repeats) are told
/// apart without reading them from the device. One array of `u16` per
/// replayed segment, a slot per grain (2 bytes a grain: 4 MiB per GiB of
/// log with 512-byte grains), written in scan order, so recording costs a
/// sequential store rather than a hash-map insert. 0 means "not known"
/// (a candidate then has its key read, as does one whose 16 bits match by
/// chance). Lives for one recovery.
pub(crate) struct KeyHashes {
    segs: Vec<Option<Box<[std::sync::atomic::AtomicU16]>>>,
    grain_bytes: u64,
    segment_bytes: u64,
}

impl KeyHashes {
    fn new(sb: &Superblock, replayed: impl Iterator<Item = u32>) -> KeyHashes {
        let mut segs: Vec<Option<Box<[std::sync::atomic::AtomicU16]>>> = (0..sb.segment_count).map(|_| None).collect();
        for seg in replayed {
            let zeroed: Box<[u16]> = vec![0u16; sb.segment_grains() as usize].into_boxed_slice();
            // SAFETY: AtomicU16 has the size, alignment and bit validity of
            // u16 (std documents this).
            segs[seg as usize] =
                Some(unsafe { Box::from_raw(Box::into_raw(zeroed) as *mut [std::sync::atomic::AtomicU16]) });
        }
        KeyHashes { segs, grain_bytes: sb.grain_bytes as u64, segment_bytes: sb.segment_bytes }
    }

    /// The 16 bits kept of a key hash (never 0).
    fn bits(h: u64) -> u16 {
        ((h >> 48) as u16).max(1)
    }

    fn slot(&self, pba: u64) -> Option<&std::sync::atomic::AtomicU16> {
        let off = (pba * self.grain_bytes).checked_sub(DATA_OFFSET_BYTES)?;
        let seg = self.segs.get((off / self.segment_bytes) as usize)?.as_ref()?;
        seg.get(((off % self.segment_bytes) / self.grain_bytes) as usize)
    }

    /// Whether the record at `pba` is known to hold a key whose hash is not `h`.
    fn differs(&self, pba: u64, h: u64) -> bool {
        self.slot(pba).map(|s| s.load(Relaxed)).is_some_and(|b| b != 0 && b != Self::bits(h))
    }

    fn insert(&self, pba: u64, h: u64) {
        if let Some(s) = self.slot(pba) {
            s.store(Self::bits(h), Relaxed);
        }
    }
}

/// Records a scanner collects before applying them (see the scan loop).
const SCAN_BATCH: usize = 16;

/// A record's key, its hash and its segment, for [`Core::apply`].
struct Applied<'k> {
    key: &'k [u8],
    h: u64,
    seg: u32,
}

/// New keys a scanner indexed in its current segment, and that segment's
/// live bytes: added to the store's shared counters once per segment, not
/// per record (shared atomics, and neighbouring segments' live counters on
/// one cache line, would bounce between the scanners; the counters wrap,
/// so a replacement subtracting first is fine).
#[derive(Default)]
struct Added {
    keys: u64,
    tombstones: u64,
    live: u64,
}

impl Added {
    /// A key indexed for the first time, by a record of `bytes`.
    fn new_key(&mut self, bytes: u64, tombstone: bool) {
        self.live += bytes;
        if tombstone {
            self.tombstones += 1;
        } else {
            self.keys += 1;
        }
    }

    fn flush(&mut self, core: &Core, seg: u32) {
        core.space.add_live_wrapping(seg, self.live);
        core.counters.keys.fetch_add(self.keys, Relaxed);
        core.counters.tombstones.fetch_add(self.tombstones, Relaxed);
        *self = Added::default();
    }
}

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
        let ahead = self.ahead.as_ref().and_then(|ra| ra.pending()).map(|(off, len)| {
            let a = (off - seg_off) / g;
            (a, a + len as u64 / g)
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
}

/// Read and classify every segment header.
pub(crate) fn read_segment_headers(dev: &dyn Device, sb: &Superblock) -> Result<Headers> {
    let g = sb.grain_bytes as usize;
    let mut used = Vec::new();
    let mut index = Vec::new();
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
                    SegmentKind::Index => index.push((seg, h)),
                    // A reclaimed segment holds nothing current.
                    SegmentKind::Free => {}
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
    Ok(Headers { kv: used, index, max_alloc })
}

impl Core {
    /// Rebuild the index: from `loaded` (a checkpoint) plus a replay of the
    /// KV segments it does not cover, or from a scan of every KV segment.
    /// Called once, by `open`, with the headers it read and the replay
    /// floor of the checkpoints on the device (`checkpoint::find`).
    pub(crate) fn recover(
        &self,
        headers: Headers,
        loaded: Option<Loaded>,
        floor: Option<u64>,
        opts: &OpenOptions,
    ) -> Result<()> {
        let started = Instant::now();
        let Headers { kv: used, index: _, max_alloc } = headers;
        let found: Vec<SegmentFound> =
            used.iter().map(|(s, _)| SegmentFound { seg: s.seg, alloc_seq: s.alloc_seq }).collect();
        let ckpt_segs: Vec<u32> = loaded.as_ref().map(|l| l.manifest.body_segments.clone()).unwrap_or_default();
        self.space.install(&found, &ckpt_segs, max_alloc);
        let threads = match opts.recovery_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()).min(RECOVERY_THREADS_MAX),
            n => n.min(RECOVERY_THREADS_MAX),
        };
        let mut report = RecoveryReport { threads: threads as u64, ..Default::default() };
        let replay_from = loaded.as_ref().map_or(0, |l| l.manifest.replay_from);
        let mut max_seq = used.iter().map(|(_, h)| h.first_seq.saturating_sub(1)).max().unwrap_or(0);
        if let Some(l) = &loaded {
            self.load_checkpoint(l, &used, threads, &mut report)?;
            max_seq = max_seq.max(l.manifest.next_seq.saturating_sub(1));
        }
        // The newest TORN_TAIL_SEGMENTS of each stream may hold torn writes.
        let mut in_tail = vec![false; used.len()];
        for stream in [Stream::User, Stream::Relocation] {
            let mine: Vec<usize> = (0..used.len()).filter(|&i| used[i].1.stream == stream).collect();
            for &i in mine.iter().rev().take(TORN_TAIL_SEGMENTS) {
                in_tail[i] = true;
            }
        }
        let replay: Vec<usize> = (0..used.len()).filter(|&i| used[i].0.alloc_seq >= replay_from).collect();
        let total_bytes = replay.len() as u64 * self.sb.segment_bytes;
        let next = AtomicUsize::new(0);
        let max_seq_seen = AtomicU64::new(max_seq);
        let shared = Mutex::new((RecoveryReport::default(), Instant::now(), 0u64));
        let ends: Vec<AtomicU64> = used.iter().map(|_| AtomicU64::new(0)).collect();
        let hashes = KeyHashes::new(&self.sb, replay.iter().map(|&i| used[i].0.seg));
        // The scanners' own key stripes (no user operation runs yet): plain
        // mutexes, cheaper uncontended than the store's async ones.
        let stripes: Vec<Mutex<()>> = (0..crate::store::KEY_STRIPES).map(|_| Mutex::new(())).collect();
        let scan_all = |ahead: &mut ReadAhead| -> Result<()> {
            let mut mine = RecoveryReport::default();
            loop {
                let k = next.fetch_add(1, Relaxed);
                let Some(&i) = replay.get(k) else { break };
                let (s, _) = &used[i];
                let mut scan = SegmentScanner::new(self.dev.as_ref(), &self.sb, self.seed, s.seg, s.alloc_seq as u32)
                    .reading_ahead(ahead);
                if !in_tail[i] {
                    // No write can be torn here: values need not be read.
                    scan = scan.skipping_values();
                }
                // Kept per segment, not per record: one shared atomic per
                // record would bounce its cache line between the scanners.
                let mut seg_max_seq = 0;
                // Where the segment's last record (torn ones included) ends.
                let mut end = 1;
                let mut added = Added::default();
                // Records are applied in batches: each one's index
                // neighbourhood is prefetched when it is read, so the
                // batch's cache misses overlap (the index lookups were
                // most of the scan's time). Order within a scanner is kept.
                let (mut batch, mut keys) = (Vec::with_capacity(SCAN_BATCH), Vec::new());
                let mut more = true;
                while more {
                    match scan.next_record()? {
                        Some(rec) => {
                            seg_max_seq = seg_max_seq.max(rec.hdr.seq);
                            end = end.max(rec.grain + rec.hdr.grains(self.sb.grain_bytes));
                            if rec.intact {
                                mine.records += 1;
                            } else if in_tail[i] {
                                mine.torn_records += 1;
                                self.neutralise_torn(s.seg, rec.grain)?;
                                continue;
                            } else {
                                mine.damaged_records += 1;
                                tracing::warn!(
                                    segment = s.seg,
                                    grain = rec.grain,
                                    seq = rec.hdr.seq,
                                    "damaged record (body checksum mismatch); its key will report corruption"
                                );
                            }
                            let key = record::key_of(&rec.hdr, scan.bytes_at(rec.grain));
                            let h = key_hash(key);
                            self.index.prefetch(h);
                            batch.push((rec, keys.len()..keys.len() + key.len(), h));
                            keys.extend_from_slice(key);
                            if batch.len() < SCAN_BATCH {
                                continue;
                            }
                        }
                        None => more = false,
                    }
                    for (rec, key, h) in batch.drain(..) {
                        let k = Applied { key: &keys[key], h, seg: s.seg };
                        self.apply(&scan, &rec, k, &hashes, &mut added, &stripes)?;
                    }
                    keys.clear();
                }
                max_seq_seen.fetch_max(seg_max_seq, Relaxed);
                ends[i].store(end, Relaxed);
                added.flush(self, s.seg);
                mine.segments_scanned += 1;
                mine.skipped_grains += scan.skipped_grains;
                mine.bytes_read += scan.bytes_read;
                mine.windows_read_ahead += scan.windows_read_ahead;
                let mut sh = shared.lock().unwrap_or_else(|e| e.into_inner());
                sh.2 += self.sb.segment_bytes;
                if let Some(p) = &opts.progress {
                    (p.0)(sh.2, total_bytes);
                }
                if sh.1.elapsed().as_secs() >= 2 {
                    tracing::info!(
                        scanned_mb = sh.2 >> 20,
                        total_mb = total_bytes >> 20,
                        "recovery: log scan in progress"
                    );
                    sh.1 = Instant::now();
                }
            }
            let mut sh = shared.lock().unwrap_or_else(|e| e.into_inner());
            sh.0.add(&mine);
            Ok(())
        };
        // Each scanner with a helper thread reading its next window.
        let work = || {
            std::thread::scope(|rs| {
                let mut ahead = ReadAhead::start(rs, self.dev.as_ref());
                scan_all(&mut ahead)
            })
        };
        tracing::info!(segments = replay.len(), total_mb = total_bytes >> 20, "recovery: log scan started");
        let scan_started = Instant::now();
        let results: Vec<Result<()>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..threads.min(replay.len()).max(1)).map(|_| sc.spawn(work)).collect();
            hs.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        });
        results.into_iter().collect::<Result<Vec<()>>>()?;
        let scanned = shared.into_inner().unwrap_or_else(|e| e.into_inner()).0;
        report.add(&scanned);
        report.scan_millis = scan_started.elapsed().as_millis() as u64;
        self.space.install(&found, &ckpt_segs, max_alloc);
        self.next_seq.store(max_seq_seen.load(Relaxed) + 1, Relaxed);
        self.resume_tails(&used, &replay, &ends, floor);
        if let Some(l) = loaded {
            let m = &l.manifest;
            report.clean_shutdown = m.clean && replay.is_empty();
            let mut cur = self.checkpoint.lock().unwrap_or_else(|e| e.into_inner());
            *cur = Current { id: m.id, segs: ckpt_segs, next_seq: 0, next_alloc_seq: 0 };
        }
        report.millis = started.elapsed().as_millis() as u64;
        if report.torn_records > 0 {
            tracing::warn!(torn = report.torn_records, "ignored records torn by a crash (never acknowledged)");
        }
        // Quick recoveries (every CLI call) stay quiet; long ones report.
        let keys = self.counters.keys.load(Relaxed);
        let mb_per_s = report.scan_mb_per_s();
        let (segments, records, millis, mb_read, checkpoint, clean) = (
            report.segments_scanned,
            report.records,
            report.millis,
            report.bytes_read >> 20,
            report.checkpoint_id,
            report.clean_shutdown,
        );
        if millis >= 1000 {
            tracing::info!(checkpoint, clean, segments, records, keys, millis, mb_read, mb_per_s, "recovered index");
        } else {
            tracing::debug!(checkpoint, clean, segments, records, keys, millis, mb_read, mb_per_s, "recovered index");
        }
        *self.recovery.lock().unwrap_or_else(|e| e.into_inner()) = report;
        Ok(())
    }

    /// Put a checkpoint's items into the (empty) index: those whose segment
    /// is still the KV segment the checkpoint saw and is not replayed.
    fn load_checkpoint(
        &self,
        l: &Loaded,
        used: &[(SegmentFound, SegmentHeader)],
        threads: usize,
        report: &mut RecoveryReport,
    ) -> Result<()> {
        let started = Instant::now();
        let m = &l.manifest;
        let mut now = vec![0u64; self.sb.segment_count as usize];
        for (s, _) in used {
            now[s.seg as usize] = s.alloc_seq;
        }
        let g = self.sb.grain_bytes;
        let kept = AtomicU64::new(0);
        let chunk = l.items.len().div_ceil(threads.max(1)).max(1);
        let results: Vec<Result<()>> = std::thread::scope(|sc| {
            let hs: Vec<_> = l
                .items
                .chunks(chunk)
                .map(|items| {
                    let (now, kept) = (&now, &kept);
                    sc.spawn(move || -> Result<()> {
                        // Counted locally and added once: shared counters
                        // bounced between cores cost more than the inserts.
                        let (mut n, mut values, mut tombs) = (0u64, 0u64, 0u64);
                        let mut live: std::collections::HashMap<u32, u64> = Default::default();
                        let mut keep = Vec::with_capacity(items.len());
                        for it in items {
                            let e = Entry(it.entry);
                            if e.is_free() || e.pba() > PBA_MAX {
                                continue;
                            }
                            let seg = self.sb.segment_of(e.pba());
                            let Some(&a) = now.get(seg as usize) else { continue };
                            if a == 0 || a != m.seg_alloc[seg as usize] || a >= m.replay_from {
                                continue;
                            }
                            let grains = match it.grains {
                                0 => match self.read_record(e, false) {
                                    Ok((h, _)) => h.grains(g),
                                    Err(err) => {
                                        tracing::warn!(error = %err, "checkpoint entry points at an unreadable record");
                                        (e.kv_size() as u64).max(1)
                                    }
                                },
                                n => n as u64,
                            };
                            keep.push((it.home as usize, e));
                            *live.entry(seg).or_default() += grains * g as u64;
                            if e.is_tombstone() {
                                tombs += 1;
                            } else {
                                values += 1;
                            }
                            n += 1;
                        }
                        self.index.restore_batch(&keep).map_err(Error::IndexFull)?;
                        for (seg, bytes) in live {
                            self.space.add_live(seg, bytes);
                        }
                        self.counters.keys.fetch_add(values, Relaxed);
                        self.counters.tombstones.fetch_add(tombs, Relaxed);
                        kept.fetch_add(n, Relaxed);
                        Ok(())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        });
        results.into_iter().collect::<Result<Vec<()>>>()?;
        report.checkpoint_id = m.id;
        report.checkpoint_session = m.session;
        report.checkpoint_entries = kept.load(Relaxed);
        report.checkpoint_dropped = l.items.len() as u64 - report.checkpoint_entries;
        report.checkpoint_bytes = l.bytes_read;
        report.checkpoint_millis = started.elapsed().as_millis() as u64;
        Ok(())
    }

    /// Resume writing in the tail of the newest segment of each stream, where
    /// it is safe: the segment was scanned whole by this recovery (so
    /// nothing past `ends` holds a record of its current use: new records
    /// there can never be confused with older ones), and every checkpoint
    /// on the device replays it (`floor`: whichever checkpoint a later
    /// open loads, what is appended now is replayed; a clean checkpoint,
    /// which replays nothing, rules it out). A crash then costs no
    /// segment: without this, each crash left the open segments' tails
    /// unused until GC reclaimed them, and a cache crashed repeatedly
    /// during GC could run out of free segments (DESIGN §6). Records
    /// appended get new sequence numbers, so versions still order by
    /// sequence number; the segment stays the newest of its stream, so the
    /// torn-write rule still covers the writes in flight at a crash.
    fn resume_tails(
        &self,
        used: &[(SegmentFound, SegmentHeader)],
        replay: &[usize],
        ends: &[AtomicU64],
        floor: Option<u64>,
    ) {
        let Some(floor) = floor else {
            tracing::info!("a checkpoint manifest could not be read: writes start new segments");
            return;
        };
        for stream in [Stream::User, Stream::Relocation] {
            let Some(i) = (0..used.len()).rev().find(|&i| used[i].1.stream == stream) else { continue };
            let (s, _) = &used[i];
            let end = ends[i].load(Relaxed);
            if !replay.contains(&i) || s.alloc_seq < floor || end == 0 || end >= self.sb.segment_grains() {
                continue;
            }
            self.space.reopen(s.seg, stream, end);
            tracing::debug!(segment = s.seg, ?stream, grain = end, "writes resume in the tail of the newest segment");
        }
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
    fn apply(
        &self,
        scan: &SegmentScanner<'_>,
        rec: &Scanned,
        k: Applied<'_>,
        hashes: &KeyHashes,
        added: &mut Added,
        stripes: &[Mutex<()>],
    ) -> Result<()> {
        let g = self.sb.grain_bytes;
        let Applied { key, h, seg } = k;
        // Scanners run in parallel: the key's stripe keeps its versions in order.
        let _stripe =
            stripes[crate::store::stripe_for(self.index.home(h), h)].lock().unwrap_or_else(|e| e.into_inner());
        let pba = self.space.pba(seg, rec.grain);
        let grains = rec.hdr.grains(g);
        let kv_size = if rec.hdr.is_tombstone() { 0 } else { grains };
        let cands = match self.index.insert_if_no_candidates(h, kv_size, pba).map_err(Error::IndexFull)? {
            Some(c) => c,
            None => {
                // A key not seen before (the usual case): indexed in one pass.
                hashes.insert(pba, h);
                added.new_key(grains * g as u64, rec.hdr.is_tombstone());
                return Ok(());
            }
        };
        for &e in cands.as_slice() {
            // A candidate applied by this scan whose full key hash differs
            // holds another key: no need to read it.
            if hashes.differs(e.pba(), h) {
                continue;
            }
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
            let old_seg = self.sb.segment_of(e.pba());
            // Two copies of one record: a crash after GC copied it and before
            // it freed the victim. The copy (in the newer segment) is
            // indexed; the other stays on the device until its segment is
            // freed, so it is listed (see DroppedKeys).
            let copy = rec.hdr.seq == chdr.seq && e.pba() != pba;
            let copy_here = copy && self.space.alloc_seq(seg) > self.space.alloc_seq(old_seg);
            if copy {
                self.dropped.insert(if copy_here { old_seg } else { seg }, h);
            }
            if rec.hdr.seq > chdr.seq || copy_here {
                let replaced = self.index.replace(h, e.pba(), kv_size, pba);
                assert!(replaced, "entry vanished while its stripe was held");
                hashes.insert(pba, h);
                let old_bytes = chdr.grains(g) * g as u64;
                if old_seg == seg {
                    // Added by this scanner, in this segment, not flushed yet.
                    added.live -= old_bytes;
                } else {
                    // Its scanner may not have flushed that segment's
                    // bytes yet: the counter may dip below zero meanwhile.
                    self.space.sub_live_wrapping(old_seg, old_bytes);
                }
                added.live += grains * g as u64;
                self.counters.replaced(chdr.is_tombstone(), rec.hdr.is_tombstone());
            }
            return Ok(());
        }
        self.index.insert(h, kv_size, pba).map_err(Error::IndexFull)?;
        hashes.insert(pba, h);
        added.new_key(grains * g as u64, rec.hdr.is_tombstone());
        Ok(())
    }
}
