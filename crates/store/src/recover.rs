//! Recovery: rebuild the index by scanning the log (docs/ARCHITECTURE.md,
//! "Recovery and index checkpoints").
//!
//! 1. Read every segment header. Segments with a valid KV header of this
//!    device are in use; everything else is free.
//! 2. Scan the used segments (in parallel). [`crate::log::SegmentScanner`] reads
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
//!    (`keys::DroppedKeys`).
//! 6. Writes resume in the tail of the newest segment of each stream when
//!    every checkpoint on the device replays it (`Rebuild::resume_tails`);
//!    otherwise user writes start a new segment, and so does relocation
//!    when GC next needs one.

use crate::checkpoint::{Checkpoints, Loaded};
use crate::counters::Counted;
use crate::error::{Error, Result};
use crate::log::{Headers, ReadAhead, Scanned, SegmentScanner};
use crate::nskey::{owner, Owner, DEFAULT_NS};
use crate::options::OpenOptions;
use crate::parts::Parts;
use crate::space::SegmentFound;
use crate::types::RecoveryReport;
use granary_format::batch::{members_crc, Commit, COMMIT_BYTES, COMMIT_KEY};
use granary_format::limits::*;
use granary_format::record::{self, RecordHeader};
use granary_format::segment::{SegmentHeader, Stream};
use granary_format::Superblock;
use granary_index::Entry;
use granary_io::AlignedBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

/// Most threads a recovery uses.
pub const RECOVERY_THREADS_MAX: usize = 16;

/// Writes can be in flight only in this many newest segments.
pub const TORN_TAIL_SEGMENTS: usize = 2;

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

/// The records of an atomic batch a scanner has met, waiting for the commit
/// record that must follow them.
#[derive(Default)]
struct PendingBatch {
    records: Vec<(Scanned, std::ops::Range<usize>)>,
    keys: Vec<u8>,
    header_crcs: Vec<u32>,
}

impl PendingBatch {
    fn hold(&mut self, rec: Scanned, key: &[u8], header_crc: u32) {
        let range = self.keys.len()..self.keys.len() + key.len();
        self.keys.extend_from_slice(key);
        self.records.push((rec, range));
        self.header_crcs.push(header_crc);
    }

    /// Whether `c` vouches for the last of the held records (as
    /// [`PendingBatch::vouched`] would take them).
    fn vouches_last(&self, c: Commit) -> bool {
        let before = self.records.len().saturating_sub(c.records as usize);
        let seqs_follow = self.records[before..]
            .iter()
            .enumerate()
            .all(|(i, (r, _))| c.first_seq.checked_add(i as u64) == Some(r.hdr.seq));
        self.records.len() - before == c.records as usize
            && seqs_follow
            && members_crc(self.header_crcs[before..].iter().copied()) == c.members_crc
    }

    /// The held records `commit` vouches for: the last of them, as many as
    /// it counts, if their sequence numbers follow from its first and their
    /// header checksums match. Records held before those belong to a batch
    /// a crash cut short (its records written, its commit record not) that
    /// writes resumed after: they are dropped (the bool says so).
    fn vouched(mut self, commit: Option<Commit>) -> (Option<PendingBatch>, bool) {
        let Some(c) = commit else { return (None, false) };
        let before = self.records.len().saturating_sub(c.records as usize);
        self.records.drain(..before);
        self.header_crcs.drain(..before);
        let ok = self.vouches(c);
        (ok.then_some(self), before > 0)
    }

    /// For a commit record whose value is damaged (its header, whose
    /// checksum holds, names it a commit record of sequence number
    /// `commit_seq`: the batch was committed), the held records its value
    /// cannot vouch for: the last of them whose sequence numbers run up to
    /// `commit_seq - 1` one by one, as a batch's do (every open leaves a
    /// number unused, so such a run never reaches back into a batch a
    /// crash cut short). Dropping them would silently take back an
    /// acknowledged batch; records held before belong to a batch a crash
    /// cut short (the bool says so).
    fn by_seq(mut self, commit_seq: u64) -> (Option<PendingBatch>, bool) {
        let n = self.records.len();
        let run = (0..n)
            .rev()
            .take_while(|&j| self.records[j].0.hdr.seq.checked_add((n - j) as u64) == Some(commit_seq))
            .count();
        let before = n - run;
        self.records.drain(..before);
        self.header_crcs.drain(..before);
        ((run > 0).then_some(self), before > 0)
    }

    fn vouches(&self, c: Commit) -> bool {
        let seqs_follow =
            self.records.iter().enumerate().all(|(i, (r, _))| c.first_seq.checked_add(i as u64) == Some(r.hdr.seq));
        self.records.len() as u64 == c.records as u64
            && seqs_follow
            && members_crc(self.header_crcs.iter().copied()) == c.members_crc
    }
}

/// Records a scanner collects before applying them (see the scan loop).
const SCAN_BATCH: usize = 16;

/// A record's key, its hash and its segment, for `Rebuild::apply`.
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
/// The default namespace's values and their bytes are batched the same
/// way; other namespaces' are counted at once (few stores have many).
#[derive(Default)]
struct Added {
    keys: u64,
    tombstones: u64,
    live: u64,
    default_values: u64,
    default_value_bytes: u64,
}

impl Added {
    /// `key` indexed for the first time, by `new`.
    fn new_key(&mut self, p: &Parts<'_>, key: &[u8], new: Counted) {
        self.live = self.live.wrapping_add(new.bytes);
        if new.tombstone {
            self.tombstones = self.tombstones.wrapping_add(1);
            return;
        }
        self.keys = self.keys.wrapping_add(1);
        self.value(p, key, 1, new.bytes);
    }

    /// `key`'s version `old` replaced by `new`.
    fn replaced(&mut self, p: &Parts<'_>, key: &[u8], old: Counted, new: Counted) {
        match (old.tombstone, new.tombstone) {
            (false, true) => {
                self.keys = self.keys.wrapping_sub(1);
                self.tombstones = self.tombstones.wrapping_add(1);
            }
            (true, false) => {
                self.tombstones = self.tombstones.wrapping_sub(1);
                self.keys = self.keys.wrapping_add(1);
            }
            _ => {}
        }
        let (k0, b0): (u64, u64) = if old.tombstone { (0, 0) } else { (1, old.bytes) };
        let (k1, b1): (u64, u64) = if new.tombstone { (0, 0) } else { (1, new.bytes) };
        self.value(p, key, k1.wrapping_sub(k0), b1.wrapping_sub(b0));
    }

    /// Values and value bytes (wrapping deltas) of `key`'s namespace.
    fn value(&mut self, p: &Parts<'_>, key: &[u8], keys: u64, bytes: u64) {
        match owner(key) {
            Owner::Ns(DEFAULT_NS) => {
                self.default_values = self.default_values.wrapping_add(keys);
                self.default_value_bytes = self.default_value_bytes.wrapping_add(bytes);
            }
            Owner::Ns(id) => {
                // Made for every id met: the catalog, read after the
                // recovery, keeps the live ones.
                let c = p.counters.ns_of(id);
                c.keys.fetch_add(keys, Relaxed);
                c.value_bytes.fetch_add(bytes, Relaxed);
            }
            Owner::Engine => {}
        }
    }

    fn flush(&mut self, p: &Parts<'_>, seg: u32) {
        p.space.add_live_wrapping(seg, self.live);
        p.counters.keys.fetch_add(self.keys, Relaxed);
        p.counters.tombstones.fetch_add(self.tombstones, Relaxed);
        p.counters.default_ns.keys.fetch_add(self.default_values, Relaxed);
        p.counters.default_ns.value_bytes.fetch_add(self.default_value_bytes, Relaxed);
        *self = Added::default();
    }
}

/// A recovery, working on the engine's parts (it dereferences to them).
pub(crate) struct Rebuild<'a>(pub Parts<'a>);

impl<'a> std::ops::Deref for Rebuild<'a> {
    type Target = Parts<'a>;

    fn deref(&self) -> &Parts<'a> {
        &self.0
    }
}

impl Rebuild<'_> {
    /// Rebuild the index: from `loaded` (a checkpoint, which becomes `ck`'s
    /// current one) plus a replay of the KV segments it does not cover, or
    /// from a scan of every KV segment. Called once, by `open`, on an empty
    /// index, with the headers it read and the replay floor of the
    /// checkpoints on the device (`checkpoint::find`).
    pub(crate) fn run(
        &self,
        ck: &Checkpoints,
        headers: Headers,
        loaded: Option<Loaded>,
        floor: Option<u64>,
        opts: &OpenOptions,
    ) -> Result<RecoveryReport> {
        let started = Instant::now();
        let Headers { kv: used, index: _, max_alloc, damaged: _ } = headers;
        let found: Vec<SegmentFound> = used
            .iter()
            .map(|(s, _)| SegmentFound { seg: s.seg, alloc_seq: s.alloc_seq, stream: s.stream, first_seq: s.first_seq })
            .collect();
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
            self.uncount_loaded_floor();
        }
        // The newest TORN_TAIL_SEGMENTS of each stream may hold torn writes.
        let mut in_tail = vec![false; used.len()];
        for stream in Stream::ALL {
            let mine: Vec<usize> = (0..used.len()).filter(|&i| used[i].1.stream == stream).collect();
            for &i in mine.iter().rev().take(TORN_TAIL_SEGMENTS) {
                in_tail[i] = true;
            }
        }
        let replay: Vec<usize> = (0..used.len()).filter(|&i| used[i].0.alloc_seq >= replay_from).collect();
        let total_bytes = replay.len() as u64 * self.log.sb.segment_bytes;
        let next = AtomicUsize::new(0);
        let max_seq_seen = AtomicU64::new(max_seq);
        let shared = Mutex::new((RecoveryReport::default(), Instant::now(), 0u64));
        let ends: Vec<AtomicU64> = used.iter().map(|_| AtomicU64::new(0)).collect();
        let hashes = KeyHashes::new(&self.log.sb, replay.iter().map(|&i| used[i].0.seg));
        // The scanners' own key stripes (no user operation runs yet): plain
        // mutexes, cheaper uncontended than the store's async ones.
        let stripes: Vec<Mutex<()>> = (0..crate::keys::KEY_STRIPES).map(|_| Mutex::new(())).collect();
        let scan_all = |ahead: &mut ReadAhead| -> Result<()> {
            let mut mine = RecoveryReport::default();
            loop {
                let k = next.fetch_add(1, Relaxed);
                let Some(&i) = replay.get(k) else { break };
                let (s, _) = &used[i];
                let mut scan =
                    SegmentScanner::new(self.log.dev.as_ref(), &self.log.sb, self.log.seed, s.seg, s.alloc_seq as u32)
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
                // The records of an atomic batch met so far, held until its
                // commit record vouches for them (then applied) or does not
                // follow (then dropped: the batch was never acknowledged).
                let mut txn = PendingBatch::default();
                let mut more = true;
                while more {
                    match scan.next_record()? {
                        Some(rec) => {
                            seg_max_seq = seg_max_seq.max(rec.hdr.seq);
                            end = end.max(rec.grain + rec.hdr.grains(self.log.sb.grain_bytes));
                            if rec.intact {
                                mine.records += 1;
                            } else if in_tail[i] {
                                mine.torn_records += 1;
                                if opts.clear_torn {
                                    self.neutralise_torn(s.seg, rec.grain)?;
                                } else {
                                    self.space.keep_torn(s.seg, rec.grain);
                                }
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
                            let bytes = scan.bytes_at(rec.grain);
                            let key = record::key_of(&rec.hdr, bytes);
                            if rec.hdr.batch {
                                txn.hold(rec, key, record::stored_header_crc(bytes));
                                continue;
                            }
                            if key == COMMIT_KEY {
                                // A commit record is one grain; a longer
                                // value (not one this engine wrote) may run
                                // past the bytes read: no commit.
                                let start = rec.hdr.value_start();
                                let commit = bytes
                                    .get(start..start + rec.hdr.user_value_len() as usize)
                                    .filter(|v| v.len() == COMMIT_BYTES)
                                    .and_then(|v| Commit::decode(v).ok());
                                let held = std::mem::take(&mut txn);
                                let had = !held.records.is_empty();
                                let vouches = commit.is_some_and(|c| held.vouches_last(c));
                                let (vouched, cut_short) = if !rec.intact && !vouches {
                                    // Damaged where no crash tears (outside
                                    // the tail): the batch was committed.
                                    tracing::error!(
                                        segment = s.seg,
                                        grain = rec.grain,
                                        seq = rec.hdr.seq,
                                        "a commit record's value is damaged: its batch is applied by the \
                                         sequence numbers of the records before it"
                                    );
                                    held.by_seq(rec.hdr.seq)
                                } else {
                                    held.vouched(commit)
                                };
                                if cut_short {
                                    mine.batches_dropped += 1;
                                }
                                if let Some(members) = vouched {
                                    // Applied in log order: what the scan
                                    // gathered before the batch, then it.
                                    for (rec, key, h) in batch.drain(..) {
                                        let k = Applied { key: &keys[key], h, seg: s.seg };
                                        self.apply(&scan, &rec, k, &hashes, &mut added, &stripes)?;
                                    }
                                    keys.clear();
                                    for (rec, range) in &members.records {
                                        let key = &members.keys[range.clone()];
                                        let k = Applied { key, h: self.keys.hash(key), seg: s.seg };
                                        self.apply(&scan, rec, k, &hashes, &mut added, &stripes)?;
                                    }
                                    mine.batches_applied += 1;
                                } else if had {
                                    mine.batches_dropped += 1;
                                }
                                continue;
                            }
                            if !txn.records.is_empty() {
                                // A batch with no commit record after it.
                                txn = PendingBatch::default();
                                mine.batches_dropped += 1;
                            }
                            let h = self.keys.hash(key);
                            self.keys.index.prefetch(h);
                            batch.push((rec, keys.len()..keys.len() + key.len(), h));
                            keys.extend_from_slice(key);
                            if batch.len() < SCAN_BATCH {
                                continue;
                            }
                        }
                        None => {
                            if !txn.records.is_empty() {
                                txn = PendingBatch::default();
                                mine.batches_dropped += 1;
                            }
                            more = false
                        }
                    }
                    for (rec, key, h) in batch.drain(..) {
                        let k = Applied { key: &keys[key], h, seg: s.seg };
                        self.apply(&scan, &rec, k, &hashes, &mut added, &stripes)?;
                    }
                    keys.clear();
                }
                max_seq_seen.fetch_max(seg_max_seq, Relaxed);
                // A segment with a summary was full: writes never resume
                // there (what they wrote would not be in its summary).
                let end = if scan.summary_at.is_some() { self.log.sb.segment_grains() } else { end };
                ends[i].store(end, Relaxed);
                added.flush(self, s.seg);
                mine.segments_scanned += 1;
                mine.skipped_grains += scan.skipped_grains;
                mine.bytes_read += scan.bytes_read;
                mine.windows_read_ahead += scan.windows_read_ahead;
                let mut sh = shared.lock().unwrap_or_else(|e| e.into_inner());
                sh.2 += self.log.sb.segment_bytes;
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
                let mut ahead = ReadAhead::start(rs, self.log.dev.as_ref());
                scan_all(&mut ahead)
            })
        };
        // Said only when there is a log to scan (a new or cleanly closed
        // store has none).
        if !replay.is_empty() {
            tracing::info!(segments = replay.len(), total_mb = total_bytes >> 20, "recovery: log scan started");
        }
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
        // One sequence number left unused at every open: the records of a
        // batch a crash cut short (its commit record never written) are
        // never followed by numbers that continue theirs, so a run of
        // numbers never crosses a crash (a damaged commit record's batch
        // is taken by such a run: `PendingBatch::by_seq`).
        self.log.next_seq.store(max_seq_seen.load(Relaxed) + 2, Relaxed);
        self.resume_tails(&used, &replay, &ends, floor);
        if let Some(l) = loaded {
            let m = &l.manifest;
            report.clean_shutdown = m.clean && replay.is_empty();
            ck.loaded(m.id, ckpt_segs);
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
        Ok(report)
    }

    /// Put a checkpoint's items into the (empty) index: those whose segment
    /// is still the KV segment the checkpoint saw and is not replayed.
    /// A checkpoint's items do not say their owner: its load counted them
    /// all as the default namespace's values, the flush floor (an engine
    /// key, which a log scan leaves out) too if it was among them. Taken
    /// back out here, before the replay (which counts engine keys as
    /// nothing, whatever version it meets).
    fn uncount_loaded_floor(&self) {
        let g = self.log.grain();
        for e in self.keys.index.lookup(self.keys.hash(crate::nskey::FLUSH_FLOOR_KEY)).as_slice() {
            if e.is_tombstone() {
                continue;
            }
            let Ok((hdr, buf)) = self.read_record(*e, false) else { continue };
            if record::key_of(&hdr, &buf) == crate::nskey::FLUSH_FLOOR_KEY {
                let c = &self.counters.default_ns;
                c.keys.fetch_sub(1, Relaxed);
                c.value_bytes.fetch_sub(hdr.grains(self.log.sb.grain_bytes) * g, Relaxed);
                return;
            }
        }
    }

    fn load_checkpoint(
        &self,
        l: &Loaded,
        used: &[(SegmentFound, SegmentHeader)],
        threads: usize,
        report: &mut RecoveryReport,
    ) -> Result<()> {
        let started = Instant::now();
        let m = &l.manifest;
        let mut now = vec![0u64; self.log.sb.segment_count as usize];
        for (s, _) in used {
            now[s.seg as usize] = s.alloc_seq;
        }
        let g = self.log.sb.grain_bytes;
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
                        let (mut n, mut values, mut tombs, mut value_bytes) = (0u64, 0u64, 0u64, 0u64);
                        let mut live: std::collections::HashMap<u32, u64> = Default::default();
                        let mut keep = Vec::with_capacity(items.len());
                        for it in items {
                            let e = Entry(it.entry);
                            // Nothing of a record lies before the first
                            // segment (a damaged item would wrap segment_of).
                            if e.is_free() || e.pba() > PBA_MAX || e.pba() * (g as u64) < DATA_OFFSET_BYTES {
                                continue;
                            }
                            let seg = self.log.sb.segment_of(e.pba());
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
                                value_bytes += grains * g as u64;
                            }
                            n += 1;
                        }
                        self.keys.index.restore_batch(&keep).map_err(Error::IndexFull)?;
                        for (seg, bytes) in live {
                            self.space.add_live(seg, bytes);
                        }
                        self.counters.keys.fetch_add(values, Relaxed);
                        self.counters.tombstones.fetch_add(tombs, Relaxed);
                        // The items do not say their namespace: counted as
                        // the default one's, which a store without
                        // namespaces is right about but for the flush
                        // floor, an engine key taken back out after (one
                        // with namespaces sets every namespace's counts from
                        // the totals of its clean close: see `namespace`).
                        self.counters.default_ns.keys.fetch_add(values, Relaxed);
                        self.counters.default_ns.value_bytes.fetch_add(value_bytes, Relaxed);
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
    /// segment: without this, each crash would leave the open segments'
    /// tails unused until GC reclaimed them, and a cache crashed repeatedly
    /// during GC could run out of free segments. Records
    /// appended get new sequence numbers, so versions still order by
    /// sequence number; the segment stays the newest of its stream, so the
    /// torn-write rule still covers the writes in flight at a crash. Only
    /// streams this open writes to (the options may have changed since):
    /// a tail reopened in another would stay open for good, pinning every
    /// checkpoint's replay floor and the tombstone horizon, and GC never
    /// reclaims an open segment.
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
        for stream in Stream::ALL.into_iter().filter(|&s| self.space.writes_to(s)) {
            let Some(i) = (0..used.len()).rev().find(|&i| used[i].1.stream == stream) else { continue };
            let (s, _) = &used[i];
            let end = ends[i].load(Relaxed);
            if !replay.contains(&i) || s.alloc_seq < floor || end == 0 || end >= self.log.sb.segment_grains() {
                continue;
            }
            if self.space.zoned() && !self.zoned_tail_writable(s.seg, end) {
                continue;
            }
            self.space.reopen(s.seg, stream, end);
            tracing::debug!(segment = s.seg, ?stream, grain = end, "writes resume in the tail of the newest segment");
        }
    }

    /// Zoned mode: whether writes may resume in `seg` at grain `end`: no
    /// torn record in it (the open reclaims such a segment) and its write
    /// pointer there (a torn write's prefix may lie beyond).
    fn zoned_tail_writable(&self, seg: u32, end: u64) -> bool {
        if self.space.is_torn(seg) {
            return false;
        }
        let at = self.space.pba(seg, end) * self.log.grain();
        matches!(self.log.dev.write_pointer(at), Ok(wp) if wp == at)
    }

    /// Zero the first grain of a torn record so later scans skip it too,
    /// even once its segment is no longer among the newest. Zoned mode
    /// cannot write behind a write pointer: the segment is noted instead,
    /// and the open reclaims it (`Store::open`), so the torn record is
    /// gone before its segment leaves the newest of its stream.
    fn neutralise_torn(&self, seg: u32, grain: u64) -> Result<()> {
        if self.space.zoned() {
            tracing::warn!(segment = seg, grain, "torn record ignored; its segment is reclaimed (zoned mode)");
            self.space.note_torn(seg);
            return Ok(());
        }
        let pba = self.space.pba(seg, grain);
        let offset = pba * self.log.grain();
        tracing::warn!(segment = seg, grain, offset, "torn record ignored and cleared");
        let (_, r) = self.log.dev.write_at(AlignedBuf::zeroed(self.log.grain() as usize), offset);
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
        let g = self.log.sb.grain_bytes;
        let Applied { key, h, seg } = k;
        // Scanners run in parallel: the key's stripe keeps its versions in order.
        let _stripe =
            stripes[crate::keys::stripe_for(self.keys.index.home(h), h)].lock().unwrap_or_else(|e| e.into_inner());
        let pba = self.space.pba(seg, rec.grain);
        let grains = rec.hdr.grains(g);
        let kv_size = if rec.hdr.is_tombstone() { 0 } else { grains };
        let cands = match self.keys.index.insert_if_no_candidates(h, kv_size, pba).map_err(Error::IndexFull)? {
            Some(c) => c,
            None => {
                // A key not seen before (the usual case): indexed in one pass.
                hashes.insert(pba, h);
                added.new_key(self, key, Counted::new(rec.hdr.is_tombstone(), grains * g as u64));
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
                    // A checkpoint's entry whose record became unreadable
                    // fails the open: its key and sequence number are
                    // unknown, so neither keeping both nor replacing it is
                    // sure to keep the newer version (a GC copy replayed
                    // here keeps its old sequence number). `--no-checkpoint`
                    // (a log scan) opens such a store.
                    let (ch, buf) = self.read_record(e, false)?;
                    let m = record::key_of(&ch, &buf) == key;
                    (ch, m)
                }
            };
            if !ckey_match {
                continue;
            }
            let old_seg = self.log.sb.segment_of(e.pba());
            // Two copies of one record: a crash after GC copied it and before
            // it freed the victim. The copy (in the newer segment) is
            // indexed; the other stays on the device until its segment is
            // freed, so it is listed (see DroppedKeys).
            let copy = rec.hdr.seq == chdr.seq && e.pba() != pba;
            let copy_here = copy && self.space.alloc_seq(seg) > self.space.alloc_seq(old_seg);
            if copy {
                self.keys.dropped.insert(if copy_here { old_seg } else { seg }, h);
            }
            if rec.hdr.seq > chdr.seq || copy_here {
                let replaced = self.keys.index.replace(h, e.pba(), kv_size, pba);
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
                let old = Counted::new(chdr.is_tombstone(), old_bytes);
                added.replaced(self, key, old, Counted::new(rec.hdr.is_tombstone(), grains * g as u64));
            }
            return Ok(());
        }
        self.keys.index.insert(h, kv_size, pba).map_err(Error::IndexFull)?;
        hashes.insert(pba, h);
        added.new_key(self, key, Counted::new(rec.hdr.is_tombstone(), grains * g as u64));
        Ok(())
    }
}
