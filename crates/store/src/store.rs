//! The store: create/open, and the read and write paths.
//!
//! GET: hash the key, collect the index entries whose home and tag match,
//! read each candidate record (one IO of the entry's size, a second one only
//! for records too large for the entry's size field), compare the full key.
//!
//! PUT/DELETE: take the key's stripe lock (which serialises mutations of one
//! key, so conditional modes are exact and sequence numbers of one key only
//! grow), find the current version, decide by mode, take a sequence number,
//! allocate grains, write the record out of place, then point the index at
//! it. The call returns only once the record is on the device (and flushed,
//! with [`Durability::Flush`]). A failed write or flush poisons the store:
//! it refuses further writes until reopened; reads go on.

use crate::error::{Error, Result};
use crate::options::{
    default_index_table_homes, default_segment_bytes, CreateOptions, Durability, OpenOptions,
};
use crate::recover::RecoveryReport;
use crate::space::{Loc, Space};
use crate::verify::VerifyReport;
use granary_format::checksum::record_seed;
use granary_format::hash::{key_hash, KEY_HASH_ALGO_XXH3_64};
use granary_format::limits::*;
use granary_format::record::{self, RecordHeader};
use granary_format::{FormatError, Superblock};
use granary_index::{Entry, Index, IndexConfig, IndexStats};
use granary_io::{AlignedBuf, Device, FileDevice, IoCountersSnapshot, OpenMode};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Number of key stripe locks serialising mutations of one key.
const KEY_STRIPES: usize = 1024;

/// How a PUT treats an existing key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PutMode {
    /// Insert or overwrite.
    #[default]
    Upsert,
    /// Only if the key is absent (memcache `add`).
    CreateOnly,
    /// Only if the key is present (memcache `replace`).
    ReplaceOnly,
}

/// What a PUT did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    Stored,
    /// CreateOnly found the key present; nothing written.
    Exists,
    /// ReplaceOnly found the key absent; nothing written.
    NotFound,
}

/// Figures of an open store.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub device: String,
    pub device_bytes: u64,
    pub grain_bytes: u32,
    pub segment_bytes: u64,
    pub segments: u64,
    pub segments_free: u64,
    pub segments_open: u64,
    pub segments_closed: u64,
    /// Keys with a value.
    pub keys: u64,
    /// Deleted keys whose tombstone is still current.
    pub tombstones: u64,
    /// Bytes (whole grains) of the records the index points at.
    pub live_bytes: u64,
    /// Key and value bytes of successful PUTs, and key bytes of DELETEs.
    pub user_bytes_written: u64,
    pub gets: u64,
    pub get_hits: u64,
    pub puts: u64,
    pub deletes: u64,
    pub next_seq: u64,
    pub io: IoCountersSnapshot,
    pub index: IndexStats,
    pub recovery: RecoveryReport,
    pub value_bytes_max: u64,
}

impl Stats {
    /// Device bytes written per user byte written (0 before any write).
    pub fn write_amplification(&self) -> f64 {
        if self.user_bytes_written == 0 {
            0.0
        } else {
            self.io.written_bytes as f64 / self.user_bytes_written as f64
        }
    }
}

/// The current version of a key found on the device.
pub(crate) struct Found {
    pub entry: Entry,
    pub hdr: RecordHeader,
    pub buf: AlignedBuf,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub keys: AtomicU64,
    pub tombstones: AtomicU64,
    pub user_bytes: AtomicU64,
    pub gets: AtomicU64,
    pub get_hits: AtomicU64,
    pub puts: AtomicU64,
    pub deletes: AtomicU64,
}

/// An open store. Cheap to share between threads by reference or `Arc`.
pub struct Store {
    pub(crate) dev: Arc<dyn Device>,
    pub(crate) sb: Superblock,
    pub(crate) seed: u32,
    pub(crate) index: Index,
    pub(crate) space: Space,
    pub(crate) next_seq: AtomicU64,
    pub(crate) counters: Counters,
    pub(crate) recovery: Mutex<RecoveryReport>,
    durability: Durability,
    stripes: Box<[Mutex<()>]>,
    poisoned: OnceLock<String>,
}

fn random_uuid() -> Result<[u8; 16]> {
    let mut u = [0u8; 16];
    let mut got = 0;
    while got < u.len() {
        // SAFETY: writes at most u.len() - got bytes into u[got..].
        let n = unsafe { libc::getrandom(u[got..].as_mut_ptr().cast(), u.len() - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::Device(e));
        }
        got += n as usize;
    }
    u[6] = (u[6] & 0x0f) | 0x40; // RFC 4122 version 4
    u[8] = (u[8] & 0x3f) | 0x80;
    Ok(u)
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Store {
    /// Format `dev` as a new, empty store and open it.
    pub fn create(dev: Arc<dyn Device>, opts: &CreateOptions, open: &OpenOptions) -> Result<Store> {
        let sb = Self::geometry(dev.as_ref(), opts)?;
        let mut buf = AlignedBuf::zeroed(4096);
        sb.encode(&mut buf);
        for &offset in &SUPERBLOCK_OFFSETS {
            let (b, r) = dev.write_at(buf, offset);
            r.map_err(|source| Error::Io {
                op: "write of the superblock",
                offset,
                source,
            })?;
            buf = b;
        }
        dev.flush().map_err(|source| Error::Io {
            op: "flush",
            offset: 0,
            source,
        })?;
        tracing::info!(device = %dev.describe(), segments = sb.segment_count, segment_bytes = sb.segment_bytes,
            grain_bytes = sb.grain_bytes, "created store");
        Self::open(dev, open)
    }

    fn geometry(dev: &dyn Device, opts: &CreateOptions) -> Result<Superblock> {
        let bad = |s: String| Err(Error::InvalidOptions(s));
        let grain = opts.grain_bytes.unwrap_or(dev.block_bytes().max(512));
        if !GRAIN_BYTES_ALLOWED.contains(&grain) {
            return bad(format!(
                "grain size {grain} is not one of {GRAIN_BYTES_ALLOWED:?}"
            ));
        }
        if grain < dev.block_bytes() {
            return bad(format!(
                "grain size {grain} is smaller than the device's {}-byte blocks",
                dev.block_bytes()
            ));
        }
        let size = dev.size_bytes();
        let data = size.saturating_sub(DATA_OFFSET_BYTES);
        let segment_bytes = opts
            .segment_bytes
            .unwrap_or_else(|| default_segment_bytes(data));
        let segment_count = data / segment_bytes.max(1);
        if segment_count < 2 {
            return bad(format!(
                "a device of {size} bytes holds fewer than two segments of {segment_bytes} bytes \
                 (after {DATA_OFFSET_BYTES} bytes for superblocks); use a larger device or smaller segments"
            ));
        }
        let sb = Superblock {
            uuid: random_uuid()?,
            grain_bytes: grain,
            hash_algo: KEY_HASH_ALGO_XXH3_64,
            segment_bytes,
            segment_count,
            device_bytes: size,
            index_table_homes: opts
                .index_table_homes
                .unwrap_or_else(|| default_index_table_homes(data, grain)),
            created_unix_ms: now_unix_ms(),
        };
        if let Err((field, value)) = sb.validate() {
            return bad(format!("{field} = {value} is out of range"));
        }
        Ok(sb)
    }

    /// Open an existing store and rebuild its index from the log.
    pub fn open(dev: Arc<dyn Device>, opts: &OpenOptions) -> Result<Store> {
        let sb = Self::read_superblock(dev.as_ref())?;
        if sb.device_bytes > dev.size_bytes() {
            return Err(Error::InvalidOptions(format!(
                "the store was created on {} bytes but the device has only {}",
                sb.device_bytes,
                dev.size_bytes()
            )));
        }
        if sb.grain_bytes < dev.block_bytes() {
            return Err(Error::InvalidOptions(format!(
                "the store's {}-byte grains are smaller than this device's {}-byte blocks",
                sb.grain_bytes,
                dev.block_bytes()
            )));
        }
        let store = Store {
            seed: record_seed(&sb.uuid),
            index: Index::new(IndexConfig::new(sb.index_table_homes)),
            space: Space::new(dev.clone(), sb.clone(), opts.durability),
            next_seq: AtomicU64::new(1),
            counters: Counters::default(),
            recovery: Mutex::new(RecoveryReport::default()),
            durability: opts.durability,
            stripes: (0..KEY_STRIPES).map(|_| Mutex::new(())).collect(),
            poisoned: OnceLock::new(),
            dev,
            sb,
        };
        store.recover()?;
        Ok(store)
    }

    fn read_superblock(dev: &dyn Device) -> Result<Superblock> {
        let mut first_err = None;
        for (i, &offset) in SUPERBLOCK_OFFSETS.iter().enumerate() {
            let (buf, r) = dev.read_at(AlignedBuf::zeroed(4096), offset);
            r.map_err(|source| Error::Io {
                op: "read of the superblock",
                offset,
                source,
            })?;
            match Superblock::decode(&buf) {
                Ok(sb) => {
                    if i > 0 {
                        tracing::warn!(error = %first_err.as_ref().unwrap(), "first superblock copy unreadable; using the second");
                    }
                    return Ok(sb);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        Err(Error::NotAStore(first_err.unwrap_or(
            FormatError::BadMagic {
                what: "superblock",
                found: 0,
            },
        )))
    }

    /// Create a store in a new file of `size_bytes` (preallocated).
    pub fn create_path(
        path: &Path,
        size_bytes: u64,
        mode: OpenMode,
        opts: &CreateOptions,
        open: &OpenOptions,
    ) -> Result<Store> {
        let dev = FileDevice::create(path, size_bytes, mode).map_err(Error::Device)?;
        Self::create(Arc::new(dev), opts, open).inspect_err(|_| {
            let _ = std::fs::remove_file(path);
        })
    }

    /// Open a store on a file or block device.
    pub fn open_path(path: &Path, mode: OpenMode, open: &OpenOptions) -> Result<Store> {
        let dev = FileDevice::open(path, mode).map_err(Error::Device)?;
        Self::open(Arc::new(dev), open)
    }

    /// Largest value this store accepts with a key of `key_len` bytes.
    pub fn value_bytes_max(&self, key_len: usize) -> u64 {
        let record_max = (self.sb.segment_grains() - 1) * self.sb.grain_bytes as u64;
        (record_max - RECORD_HEADER_BYTES as u64 - key_len as u64).min(VALUE_BYTES_MAX)
    }

    fn check_key(key: &[u8]) -> Result<()> {
        if !(KEY_BYTES_MIN..=KEY_BYTES_MAX).contains(&key.len()) {
            return Err(Error::KeyLength {
                len: key.len(),
                min: KEY_BYTES_MIN,
                max: KEY_BYTES_MAX,
            });
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<()> {
        match self.poisoned.get() {
            Some(cause) => Err(Error::Poisoned {
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    fn poison(&self, err: Error) -> Error {
        let _ = self.poisoned.set(err.to_string());
        tracing::error!(error = %err, "device failure: the store now refuses writes until reopened");
        err
    }

    fn stripe(&self, h: u64) -> MutexGuard<'_, ()> {
        let i = ((h >> 40) as usize) % KEY_STRIPES;
        self.stripes[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn grain(&self) -> u64 {
        self.sb.grain_bytes as u64
    }

    fn io_read(&self, grains: u64, pba: u64) -> Result<AlignedBuf> {
        let offset = pba * self.grain();
        let (buf, r) = self
            .dev
            .read_at(AlignedBuf::zeroed((grains * self.grain()) as usize), offset);
        r.map_err(|source| Error::Io {
            op: "read",
            offset,
            source,
        })?;
        Ok(buf)
    }

    /// Read the record an entry points at and check it against the entry,
    /// its segment's stamp and its header checksum; with `full`, read all of
    /// it and check the whole-record checksum too.
    pub(crate) fn read_record(&self, e: Entry, full: bool) -> Result<(RecordHeader, AlignedBuf)> {
        let offset = e.pba() * self.grain();
        let corrupt = |detail: String| Error::Corruption { offset, detail };
        let seg = self.sb.segment_of(e.pba());
        let seg_start = self.space.pba(seg, 0);
        let seg_end = seg_start + self.sb.segment_grains();
        let hint = match e.kv_size() {
            0 => 1,
            n if n == KV_SIZE_GRAINS_MAX => 1,
            n => n as u64,
        };
        if e.pba() + hint > seg_end || e.pba() == seg_start {
            return Err(corrupt(format!(
                "index entry {e:?} points outside a segment's records"
            )));
        }
        let mut buf = self.io_read(hint, e.pba())?;
        let hdr = RecordHeader::decode(&buf).map_err(|fe| corrupt(fe.to_string()))?;
        let stamp = self.space.stamp(seg);
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
            return Err(corrupt(format!(
                "record of {grains} grains does not match its index entry {e:?}"
            )));
        }
        let need = if full {
            grains
        } else {
            grains_for(
                (RECORD_HEADER_BYTES + hdr.key_len as usize) as u64,
                self.sb.grain_bytes,
            )
        };
        if need > hint {
            buf = self.io_read(need, e.pba())?;
        }
        record::verify_header_crc(self.seed, &hdr, &buf).map_err(|fe| corrupt(fe.to_string()))?;
        if full {
            record::verify_crc(self.seed, &hdr, &buf).map_err(|fe| corrupt(fe.to_string()))?;
        }
        Ok((hdr, buf))
    }

    /// Find the current version of `key`. A candidate whose record is
    /// unreadable is skipped; if no candidate matches and one was unreadable,
    /// `strict` returns that error (the key may have been the unreadable one).
    pub(crate) fn find(
        &self,
        key: &[u8],
        h: u64,
        full: bool,
        strict: bool,
    ) -> Result<Option<Found>> {
        let mut unreadable = None;
        for &entry in self.index.lookup(h).as_slice() {
            match self.read_record(entry, false) {
                Ok((hdr, buf)) => {
                    if record::key_of(&hdr, &buf) != key {
                        continue;
                    }
                    if full {
                        let (hdr, buf) = self.read_record(entry, true)?;
                        return Ok(Some(Found { entry, hdr, buf }));
                    }
                    return Ok(Some(Found { entry, hdr, buf }));
                }
                Err(e @ Error::Corruption { .. }) => {
                    tracing::warn!(error = %e, "unreadable index candidate");
                    unreadable = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        match unreadable {
            Some(e) if strict => Err(e),
            _ => Ok(None),
        }
    }

    /// The value of `key`, or None if absent or deleted.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Self::check_key(key)?;
        self.counters.gets.fetch_add(1, Relaxed);
        let h = key_hash(key);
        let found = self.find(key, h, false, true)?;
        let Some(f) = found else { return Ok(None) };
        if f.hdr.is_tombstone() {
            return Ok(None);
        }
        // Small records were read whole by `find`; check all of it now.
        let (hdr, buf) = if f.buf.len() as u64 >= f.hdr.record_bytes() {
            let offset = f.entry.pba() * self.grain();
            record::verify_crc(self.seed, &f.hdr, &f.buf).map_err(|fe| Error::Corruption {
                offset,
                detail: fe.to_string(),
            })?;
            (f.hdr, f.buf)
        } else {
            self.read_record(f.entry, true)?
        };
        self.counters.get_hits.fetch_add(1, Relaxed);
        Ok(Some(record::value_of(&hdr, &buf).to_vec()))
    }

    /// Insert or overwrite.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.put_with(key, value, PutMode::Upsert).map(|_| ())
    }

    /// PUT with a mode; returns whether it stored.
    pub fn put_with(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<PutOutcome> {
        Self::check_key(key)?;
        let max = self.value_bytes_max(key.len());
        if value.len() as u64 > max {
            return Err(Error::ValueTooLarge {
                len: value.len() as u64,
                max,
            });
        }
        self.check_writable()?;
        let h = key_hash(key);
        let _stripe = self.stripe(h);
        let existing = self.find(key, h, false, false)?;
        let live = existing.as_ref().is_some_and(|f| !f.hdr.is_tombstone());
        match mode {
            PutMode::CreateOnly if live => return Ok(PutOutcome::Exists),
            PutMode::ReplaceOnly if !live => return Ok(PutOutcome::NotFound),
            _ => {}
        }
        let seq = self.next_seq.fetch_add(1, Relaxed);
        let hdr = RecordHeader::value(key.len(), value.len() as u64, seq, 0);
        let loc = self.write_record(hdr, key, value)?;
        self.commit(key, h, existing, loc, false)?;
        self.counters.puts.fetch_add(1, Relaxed);
        self.counters
            .user_bytes
            .fetch_add((key.len() + value.len()) as u64, Relaxed);
        Ok(PutOutcome::Stored)
    }

    /// Delete `key`; returns whether it was present. Writes a tombstone only
    /// when it was.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        Self::check_key(key)?;
        self.check_writable()?;
        let h = key_hash(key);
        let _stripe = self.stripe(h);
        let Some(f) = self.find(key, h, false, false)? else {
            return Ok(false);
        };
        if f.hdr.is_tombstone() {
            return Ok(false);
        }
        let seq = self.next_seq.fetch_add(1, Relaxed);
        let old_seg = self.sb.segment_of(f.entry.pba());
        let hdr = RecordHeader::tombstone(key.len(), seq, 0, old_seg, self.space.stamp(old_seg));
        let loc = self.write_record(hdr, key, &[])?;
        self.commit(key, h, Some(f), loc, true)?;
        self.counters.deletes.fetch_add(1, Relaxed);
        self.counters
            .user_bytes
            .fetch_add(key.len() as u64, Relaxed);
        Ok(true)
    }

    /// Allocate, encode (with the segment's stamp) and write one record.
    pub(crate) fn write_record(
        &self,
        mut hdr: RecordHeader,
        key: &[u8],
        value: &[u8],
    ) -> Result<Loc> {
        let grains = hdr.grains(self.sb.grain_bytes);
        let loc = self
            .space
            .alloc(grains, self.next_seq.load(Relaxed))
            .map_err(|e| match e {
                Error::Io { .. } => self.poison(e),
                e => e,
            })?;
        hdr.seg_stamp = loc.stamp;
        let mut buf = AlignedBuf::zeroed((grains * self.grain()) as usize);
        hdr.encode(self.seed, key, value, &mut buf);
        let offset = loc.pba * self.grain();
        let (_, r) = self.dev.write_at(buf, offset);
        r.map_err(|source| {
            self.poison(Error::Io {
                op: "write",
                offset,
                source,
            })
        })?;
        if self.durability == Durability::Flush {
            self.dev.flush().map_err(|source| {
                self.poison(Error::Io {
                    op: "flush",
                    offset,
                    source,
                })
            })?;
        }
        Ok(loc)
    }

    /// Point the index at a record just written, replacing `existing`.
    fn commit(
        &self,
        key: &[u8],
        h: u64,
        mut existing: Option<Found>,
        loc: Loc,
        tombstone: bool,
    ) -> Result<()> {
        let kv_size = if tombstone { 0 } else { loc.grains };
        let g = self.grain();
        loop {
            match &existing {
                Some(f) => {
                    if self.index.replace(h, f.entry.pba(), kv_size, loc.pba) {
                        self.space.sub_live(
                            self.sb.segment_of(f.entry.pba()),
                            f.hdr.grains(self.sb.grain_bytes) * g,
                        );
                        let c = &self.counters;
                        match (f.hdr.is_tombstone(), tombstone) {
                            (false, true) => {
                                c.keys.fetch_sub(1, Relaxed);
                                c.tombstones.fetch_add(1, Relaxed);
                            }
                            (true, false) => {
                                c.tombstones.fetch_sub(1, Relaxed);
                                c.keys.fetch_add(1, Relaxed);
                            }
                            _ => {}
                        }
                        break;
                    }
                    // The entry moved under us (only a relocation can do that
                    // while we hold the key's stripe): find it again.
                    existing = self.find(key, h, false, false)?;
                }
                None => {
                    if let Err(e) = self.index.insert(h, kv_size, loc.pba) {
                        // The record is on the device but cannot be indexed;
                        // refuse further writes rather than diverge from the log.
                        return Err(self.poison(Error::IndexFull(e)));
                    }
                    if tombstone {
                        self.counters.tombstones.fetch_add(1, Relaxed);
                    } else {
                        self.counters.keys.fetch_add(1, Relaxed);
                    }
                    break;
                }
            }
        }
        self.space.add_live(loc.seg, loc.grains * g);
        Ok(())
    }

    /// Figures of the store now.
    pub fn stats(&self) -> Stats {
        let (free, open, closed) = self.space.counts();
        let c = &self.counters;
        Stats {
            device: self.dev.describe(),
            device_bytes: self.sb.device_bytes,
            grain_bytes: self.sb.grain_bytes,
            segment_bytes: self.sb.segment_bytes,
            segments: self.sb.segment_count,
            segments_free: free,
            segments_open: open,
            segments_closed: closed,
            keys: c.keys.load(Relaxed),
            tombstones: c.tombstones.load(Relaxed),
            live_bytes: self.space.live_bytes(),
            user_bytes_written: c.user_bytes.load(Relaxed),
            gets: c.gets.load(Relaxed),
            get_hits: c.get_hits.load(Relaxed),
            puts: c.puts.load(Relaxed),
            deletes: c.deletes.load(Relaxed),
            next_seq: self.next_seq.load(Relaxed),
            io: self.dev.counters().snapshot(),
            index: self.index.stats(),
            recovery: self
                .recovery
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            value_bytes_max: self.value_bytes_max(1),
        }
    }

    /// The superblock (geometry and identity).
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// Check every index entry against its record and scan every segment.
    pub fn verify(&self) -> Result<VerifyReport> {
        crate::verify::verify(self)
    }

    /// Flush and close. Dropping a store without calling this is a crash as
    /// far as the device is concerned, which recovery handles.
    pub fn close(self) -> Result<()> {
        self.dev.flush().map_err(|source| Error::Io {
            op: "flush",
            offset: 0,
            source,
        })
    }
}
