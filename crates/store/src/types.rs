//! The public value types of the store's API: what a write is given
//! ([`ItemMeta`], [`PutMode`], [`Cond`], [`Change`]), what a read or a write
//! returns ([`Item`], [`PutOutcome`], [`ScanPage`]), the figures of an open store
//! ([`Stats`], with [`RecoveryReport`], [`GcStats`] and [`CheckpointStats`]), the guard that pauses GC ([`GcPause`]) and the engine's
//! reserved key namespace ([`RESERVED_KEY_PREFIX`]).
//!
//! They hold values only: what the engine does with them is in `read` and
//! `write`. Rules they carry: a CAS value is unique in the store, unchanged
//! by GC and stable across restarts; user keys never start with
//! [`RESERVED_KEY_PREFIX`] (every user call refuses them); an expired value
//! counts as absent for every [`Cond`].

use granary_index::IndexStats;
use granary_io::IoCountersSnapshot;
use std::sync::MutexGuard;

/// Keys starting with these bytes are the engine's own (user keys with this
/// prefix are refused): NUL cannot start a memcache text-protocol key.
pub const RESERVED_KEY_PREFIX: &[u8] = b"\0granary.";

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

impl From<PutMode> for Cond {
    fn from(m: PutMode) -> Cond {
        match m {
            PutMode::Upsert => Cond::Always,
            PutMode::CreateOnly => Cond::Absent,
            PutMode::ReplaceOnly => Cond::Present,
        }
    }
}

/// When a conditional write ([`Store::put_item`](crate::Store::put_item)) goes ahead. "Present"
/// means a value that has not expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cond {
    Always,
    /// Only if absent (expired counts as absent); else `Exists`.
    Absent,
    /// Only if present; else `NotFound`.
    Present,
    /// Only if present with this CAS value; `Exists` if present with
    /// another, `NotFound` if absent.
    Cas(u64),
}

/// One page of a key scan ([`Store::scan`](crate::Store::scan)).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScanPage {
    /// Keys of the namespace, each live when it was checked; distinct
    /// within the page (a key may come again in a later page).
    pub keys: Vec<Vec<u8>>,
    /// The cursor of the next page; 0 once the scan is complete.
    pub cursor: u64,
}

/// Metadata stored with a value: opaque flags, an expiry time and the
/// stale mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ItemMeta {
    pub flags: u32,
    /// Unix seconds from which the value reads as absent; 0 = never.
    pub expires: u32,
    /// Invalidated (memcache `md ... I`): still read, marked stale, until a
    /// new value replaces it (record version 4, FORMAT.md).
    pub stale: bool,
}

impl ItemMeta {
    /// Flags and expiry of a fresh (not stale) item.
    pub fn new(flags: u32, expires: u32) -> ItemMeta {
        ItemMeta { flags, expires, stale: false }
    }
}

/// A value as read, with its metadata and CAS value. The CAS value is the
/// record's sequence number: unique in the store, unchanged by GC and
/// stable across restarts; every write of a key gives it a new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub value: Vec<u8>,
    pub meta: ItemMeta,
    pub cas: u64,
}

/// What [`Store::update`](crate::Store::update)'s function decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Write nothing.
    Keep,
    /// Write this value (a new CAS value).
    Put { value: Vec<u8>, meta: ItemMeta },
    /// Write this value with this CAS value (chosen by the client); stored
    /// in the record (FORMAT.md, explicit CAS).
    PutCas { value: Vec<u8>, meta: ItemMeta, cas: u64 },
    /// A new item made from the one read (memcache's append and prepend,
    /// an incr or decr whose result is longer): written as `Put` (or as
    /// `PutCas` with `cas`), but with `meta`'s expiry as given, 0 meaning
    /// none, never the namespace's default TTL (`Put`'s 0): the item read
    /// had an expiry of its own.
    Derive { value: Vec<u8>, meta: ItemMeta, cas: Option<u64> },
    /// The same item with new metadata (a touch): written with its CAS
    /// value `cas` like `PutCas`, and keeping its access state
    /// ([`crate::Access`]); counted as a read when `fetch`.
    Touch { value: Vec<u8>, meta: ItemMeta, cas: u64, fetch: bool },
    /// The same item with a new value written over it (memcache's incr
    /// and decr when the result fits the old value, which memcached
    /// rewrites in place): a new CAS value (`cas`, chosen by the client,
    /// or a fresh one), its access state ([`crate::Access`]) kept.
    Rewrite { value: Vec<u8>, meta: ItemMeta, cas: Option<u64> },
    /// The same item invalidated (`meta.stale` set by the caller, memcache
    /// `md ... I`): a new CAS value, its access state kept but its win
    /// token released.
    Invalidate { value: Vec<u8>, meta: ItemMeta },
    /// Delete the key (a tombstone if a version is indexed).
    Delete,
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
    /// Segments holding the current index checkpoint.
    pub segments_index: u64,
    /// Keys with a value. A blind overwrite counts as an overwrite; if it
    /// displaced another key (a fingerprint collision), that key is counted
    /// again when its link is settled (GC, a checkpoint, `verify`).
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
    pub gc: GcStats,
    /// Segments opened for writing since the store was created (each wrote
    /// a header).
    pub segments_opened: u64,
    /// Of those, segments of the short-lived user stream opened since the
    /// store was opened (SepBIT placement, `OpenOptions::gc_sepbit`).
    pub short_segments_opened: u64,
    /// Segment summaries written since the store was opened, and their
    /// bytes (counted in `io.written_bytes` too).
    pub summaries_written: u64,
    pub summary_bytes_written: u64,
    /// User writes that waited for GC to free room since the store was
    /// opened (with `Background::Manual`: that ran GC for it), and the
    /// microseconds they waited together.
    pub room_waits: u64,
    pub room_wait_us: u64,
    /// GC starts below `.0` free segments and stops at `.1` (now: the
    /// adaptive watermarks move, [`crate::Watermark`]).
    pub gc_watermarks: (usize, usize),
    /// Segments user writes fill and GC reclaims per second, averaged
    /// (what [`crate::Watermark::Queue`] follows); None until measured.
    pub gc_rates: Option<(f64, f64)>,
    /// GC's configuration as this open runs it.
    pub gc_settings: GcSettings,
    pub checkpoints: CheckpointStats,
    /// Random id of this open session (written into its checkpoints).
    pub session: u64,
    /// Write coalescing: group writes issued, and the user records they
    /// carried (records per write = the second over the first).
    pub write_groups: u64,
    pub grouped_records: u64,
    /// PUTs written by another PUT of their key that claimed them while
    /// they waited for its stripe: one record for several
    /// (`crate::combine`).
    pub combined_puts: u64,
    /// Read-modify-writes (INCR, APPEND...) answered by another of their
    /// key that called their function on the item as the changes before
    /// left it and took their change (a change that kept the item
    /// included; written in one record, or none when nothing changed)
    /// (`crate::combine`).
    pub combined_updates: u64,
    /// Overwrites that replaced their key's one index candidate without
    /// reading it ([`OpenOptions::blind_overwrite_bytes`](crate::OpenOptions::blind_overwrite_bytes)).
    pub blind_overwrites: u64,
    /// Entries those displaced that are not settled yet, and the DRAM
    /// their links hold.
    pub unsettled_links: u64,
    pub link_bytes: u64,
    /// The DRAM tier of hot values ([`OpenOptions::dram_tier_bytes`](crate::OpenOptions::dram_tier_bytes)).
    pub dram: DramStats,
    /// Why the store refuses writes (read-only until reopened), once a
    /// device write or flush failed; None while it is writable.
    pub read_only: Option<String>,
}

/// GC's configuration in effect ([`crate::OpenOptions`]'s `gc_policy`,
/// `gc_hot_cold`, `gc_watermark` and `discard`, the last resolved for the
/// device).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcSettings {
    pub policy: crate::GcPolicy,
    pub hot_cold: bool,
    /// SepBIT placement of user writes (`gc_sepbit`; off in zoned mode).
    pub sepbit: bool,
    pub watermark: crate::Watermark,
    /// Whether freed segments are discarded now: `Discard::Auto` resolved
    /// for the device, and false once a discard failed.
    pub discard: bool,
}

/// Figures of the DRAM tier (all 0 when it is off).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DramStats {
    /// The configured bound.
    pub limit_bytes: u64,
    /// DRAM its items hold: keys, values and per-item overhead.
    pub bytes: u64,
    pub items: u64,
    /// GETs served from it, and GETs it could not serve (absent, or no
    /// longer current).
    pub hits: u64,
    pub misses: u64,
    /// Values it took in (read on a miss, or written over an item it
    /// held), and items its policy evicted.
    pub admissions: u64,
    pub evictions: u64,
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

/// GC is paused while this lives (see [`Store::pause_gc`](crate::Store::pause_gc)).
pub struct GcPause<'a> {
    pub(crate) _guard: MutexGuard<'a, ()>,
}

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
    /// Atomic batches the log scan applied (their commit record checked
    /// out), and those it dropped (records with no commit record after
    /// them: a crash before the batch was acknowledged).
    pub batches_applied: u64,
    pub batches_dropped: u64,
}

impl RecoveryReport {
    pub(crate) fn add(&mut self, o: &RecoveryReport) {
        self.segments_scanned += o.segments_scanned;
        self.records += o.records;
        self.damaged_records += o.damaged_records;
        self.torn_records += o.torn_records;
        self.skipped_grains += o.skipped_grains;
        self.bytes_read += o.bytes_read;
        self.windows_read_ahead += o.windows_read_ahead;
        self.batches_applied += o.batches_applied;
        self.batches_dropped += o.batches_dropped;
    }

    /// Log scan rate in MB/s (0 when nothing was scanned).
    pub fn scan_mb_per_s(&self) -> f64 {
        if self.scan_millis == 0 {
            return 0.0;
        }
        (self.bytes_read as f64 / 1e6) / (self.scan_millis as f64 / 1e3)
    }
}

/// What GC has done since the store was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcStats {
    /// Segments reclaimed.
    pub victims: u64,
    pub records_relocated: u64,
    pub bytes_relocated: u64,
    /// Of those, bytes relocated to the cold streams (hot/cold separation;
    /// with SepBIT placement, the streams by age).
    pub bytes_relocated_cold: u64,
    pub tombstones_dropped: u64,
    /// Times GC was asked for space and found no segment worth reclaiming.
    pub nothing_to_reclaim: u64,
    /// Expired values GC replaced with tombstones (store mode) or dropped
    /// (cache mode).
    pub expired: u64,
    /// Cache mode: segments evicted whole, and the live values they held.
    pub evicted_segments: u64,
    pub evicted_values: u64,
    /// Victims read sparsely (only the records the index or a link points
    /// at) instead of scanned whole.
    pub sparse_victims: u64,
    /// Victims read by their segment summary: only the records it says
    /// are live or may be, none of those displaced by their own key's
    /// overwrite (not counted in `sparse_victims`).
    pub summary_victims: u64,
    /// Sparse reclaims that found something changed and scanned after all.
    pub sparse_fallbacks: u64,
    /// Of the victims, segments [`crate::Watermark::Compact`]'s compaction
    /// reclaimed ahead of need (at most 4/5 live, relocated, never evicted).
    pub compacted: u64,
    /// Records of dropped or truncated namespaces GC let go (never
    /// relocated).
    pub namespace_records_dropped: u64,
}

/// What checkpoints have done since the store was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Checkpoints written.
    pub written: u64,
    /// Checkpoints that could not be written (no free segment, IO error).
    pub failed: u64,
    /// Id (alloc_seq of its first segment) of the current checkpoint; 0 if none.
    pub current_id: u64,
    /// Entries and bytes of the last checkpoint written, and how long it took.
    pub last_entries: u64,
    pub last_bytes: u64,
    pub last_millis: u64,
}
