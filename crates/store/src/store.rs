//! The store: create/open, and the read and write paths.
//!
//! GET: hash the key, collect the index entries whose home and tag match,
//! read each candidate record (one IO of the entry's size, a second one only
//! for records too large for the entry's size field), compare the full key.
//!
//! PUT/DELETE: wait, holding nothing, until there is room; take the key's
//! stripe lock (which serialises mutations of one key, and GC relocation of
//! it, so conditional modes are exact and sequence numbers of one key only
//! grow), find the current version, decide by mode, take a sequence number,
//! allocate grains, write the record out of place, then point the index at
//! it. The call returns only once the record is on the device (and flushed,
//! with [`Durability::Flush`]). A failed write or flush poisons the store:
//! it refuses further writes until reopened; reads go on.
//!
//! Readers hold no lock across IO, so GC may move a record and reuse its
//! segment between a lookup and the read. Every read is therefore validated
//! afterwards: the entries it relied on must still be in the index, or it
//! starts over.
//!
//! The paths are written once, as async functions: on a `granary-rt`
//! executor with the io_uring backend their device operations go to the
//! executor's ring and other tasks run meanwhile; the synchronous API runs
//! the same functions with [`granary_rt::block_on`], where the device
//! answers at once and only a contended stripe lock or a wait for space
//! parks the thread. Stripe locks are async-aware (`async_lock`), so a task
//! waiting for one yields its executor instead of blocking it. Do not call
//! the synchronous API from an executor thread: it would block that
//! executor until the call completes.
//!
//! [`Store`] owns the engine state ([`Core`], shared with the GC thread)
//! and the GC thread itself.

use crate::access::{Clock0, ItemAccess, Policy};
use crate::error::{Error, Result};
use crate::options::{
    default_index_table_homes, default_segment_bytes, CreateOptions, Durability, OpenOptions, ProgressHook,
};
use crate::recover::RecoveryReport;
use crate::space::{Loc, Purpose, Space};
use crate::verify::VerifyReport;
use crate::zerocopy::{PutBuf, ValueBuf};
use granary_format::checksum::record_seed;
use granary_format::hash::{key_hash, KEY_HASH_ALGO_XXH3_64};
use granary_format::limits::*;
use granary_format::record::{self, RecordHeader};
use granary_format::{FormatError, Superblock};
use granary_index::{Entry, Index, IndexConfig, IndexStats};
use granary_io::{AlignedBuf, Device, DeviceSpec, IoBackend, IoCountersSnapshot, OpenMode};
use granary_rt::block_on;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

/// Keys starting with these bytes are the engine's own (user keys with this
/// prefix are refused): NUL cannot start a memcache text-protocol key.
pub const RESERVED_KEY_PREFIX: &[u8] = b"\0granary.";

/// The reserved key holding the flush floor (see [`Store::flush_all`]).
const FLUSH_FLOOR_KEY: &[u8] = b"\0granary.flush_floor";

/// What a new version of a key carries besides its value.
#[derive(Clone, Copy)]
struct Version {
    meta: ItemMeta,
    /// An explicit CAS value (else the sequence number is).
    cas: Option<u64>,
    policy: Policy,
}

/// What a writer holding a key's stripe knows of the key's current version.
enum Prior {
    /// Found (or known absent) before the write.
    Known(Option<Found>),
    /// Not read yet: found while the new version is written.
    Unread,
    /// Not read at all: the key's one candidate, replaced blindly and
    /// linked ([`crate::links`]).
    Blind(Entry),
}

/// Run two futures on this task at once; both outputs when both are done.
async fn join2<A: std::future::Future, B: std::future::Future>(a: A, b: B) -> (A::Output, B::Output) {
    use std::task::Poll;
    let (mut a, mut b) = (std::pin::pin!(a), std::pin::pin!(b));
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(|cx| {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        match (ra.is_some(), rb.is_some()) {
            (true, true) => Poll::Ready((ra.take().unwrap(), rb.take().unwrap())),
            _ => Poll::Pending,
        }
    })
    .await
}

/// The access policy of tombstones and of internal writes.
const FRESH: Policy = Policy::Fresh;

/// Number of key stripe locks serialising mutations of one key.
pub(crate) const KEY_STRIPES: usize = 1024;

/// The stripe of a key of hash `h` whose home slot is `home`: a function
/// of its fingerprint (home slot and key tag) only, so that the keys a
/// blind overwrite may displace share the writer's stripe
/// ([`crate::links`]).
pub(crate) fn stripe_for(home: usize, h: u64) -> usize {
    let fp = granary_format::hash::fingerprint(home as u64, granary_format::hash::key_tag(h));
    (fp.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - KEY_STRIPES.trailing_zeros())) as usize
}

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

/// When a conditional write ([`Store::put_item`]) goes ahead. "Present"
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

/// What [`Store::update`]'s function decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Write nothing.
    Keep,
    /// Write this value (a new CAS value).
    Put { value: Vec<u8>, meta: ItemMeta },
    /// Write this value with this CAS value (chosen by the client); stored
    /// in the record (FORMAT.md, explicit CAS).
    PutCas { value: Vec<u8>, meta: ItemMeta, cas: u64 },
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
    pub gc: crate::gc::GcStats,
    /// Segments opened for writing since the store was created (each wrote
    /// a header).
    pub segments_opened: u64,
    /// GC starts below `.0` free segments and stops at `.1`.
    pub gc_watermarks: (usize, usize),
    pub checkpoints: crate::checkpoint::CheckpointStats,
    /// Random id of this open session (written into its checkpoints).
    pub session: u64,
    /// Write coalescing: group writes issued, and the user records they
    /// carried (records per write = the second over the first).
    pub write_groups: u64,
    pub grouped_records: u64,
    /// Overwrites that replaced their key's one index candidate without
    /// reading it ([`OpenOptions::blind_overwrite_bytes`]).
    pub blind_overwrites: u64,
    /// Entries those displaced that are not settled yet, and the DRAM
    /// their links hold.
    pub unsettled_links: u64,
    pub link_bytes: u64,
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
/// The value of a record to write: borrowed bytes, encoded (copied) into
/// the write buffer; or a record already built in place in an aligned
/// buffer ([`crate::PutBuf`]), written as it is. The buffer is taken only
/// while the write runs and given back, so a retry can use it again.
pub(crate) enum Payload<'a> {
    Slice(&'a [u8]),
    Owned { buf: &'a mut Option<AlignedBuf>, value_len: u64 },
}

impl Payload<'_> {
    pub fn value_len(&self) -> u64 {
        match self {
            Payload::Slice(v) => v.len() as u64,
            Payload::Owned { value_len, .. } => *value_len,
        }
    }
    pub fn reborrow(&mut self) -> Payload<'_> {
        match self {
            Payload::Slice(v) => Payload::Slice(v),
            Payload::Owned { buf, value_len } => Payload::Owned { buf, value_len: *value_len },
        }
    }
}

pub(crate) struct Found {
    pub entry: Entry,
    pub hdr: RecordHeader,
    pub buf: AlignedBuf,
    /// The head through whose link the version was found: a blind
    /// overwrite of another key displaced it from the index.
    pub via: Option<u64>,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub keys: AtomicU64,
    pub tombstones: AtomicU64,
    pub user_bytes: AtomicU64,
    pub gets: AtomicU64,
    pub get_hits: AtomicU64,
    /// PUTs that replaced their key's candidate without reading it.
    pub blind: AtomicU64,
    pub puts: AtomicU64,
    pub deletes: AtomicU64,
}

impl Counters {
    /// A key's current version went from one kind to another.
    pub(crate) fn replaced(&self, was_tombstone: bool, is_tombstone: bool) {
        match (was_tombstone, is_tombstone) {
            (false, true) => {
                self.keys.fetch_sub(1, Relaxed);
                self.tombstones.fetch_add(1, Relaxed);
            }
            (true, false) => {
                self.tombstones.fetch_sub(1, Relaxed);
                self.keys.fetch_add(1, Relaxed);
            }
            _ => {}
        }
    }

    /// A key got its first indexed version.
    pub(crate) fn added(&self, is_tombstone: bool) {
        let c = if is_tombstone { &self.tombstones } else { &self.keys };
        c.fetch_add(1, Relaxed);
    }
}

/// Tells the checkpoint thread to stop: a flag and its condvar.
type StopSignal = (Mutex<bool>, Condvar);

/// An open store. Share it between threads by reference or `Arc`.
pub struct Store {
    pub(crate) core: Arc<Core>,
    gc: Option<JoinHandle<()>>,
    checkpointer: Option<(Arc<StopSignal>, JoinHandle<()>)>,
    checkpoint_on_close: bool,
}

/// The engine state, shared by the store's users and its GC thread.
pub(crate) struct Core {
    pub(crate) dev: Arc<dyn Device>,
    pub(crate) sb: Superblock,
    pub(crate) seed: u32,
    pub(crate) index: Index,
    pub(crate) space: Space,
    pub(crate) next_seq: AtomicU64,
    pub(crate) counters: Counters,
    pub(crate) recovery: Mutex<RecoveryReport>,
    pub(crate) durability: Durability,
    stripes: Box<[async_lock::Mutex<()>]>,
    poisoned: OnceLock<String>,
    pub(crate) gc_counters: crate::gc::GcCounters,
    /// Held by GC while it reclaims a segment and by `verify` throughout,
    /// so verify never sees records move under it.
    pub(crate) gc_lock: Mutex<()>,
    /// Random id of this open session, written into checkpoints.
    pub(crate) session: u64,
    /// The checkpoint relied on now; held while one is written.
    pub(crate) checkpoint: Mutex<crate::checkpoint::Current>,
    pub(crate) checkpoint_counters: crate::checkpoint::CheckpointCounters,
    pub(crate) clock: crate::options::Clock,
    /// Cache mode (see [`OpenOptions::evict`]).
    pub(crate) evict: bool,
    /// [`crate::Background::Manual`]: no GC thread; writers run GC
    /// themselves when they need room, and internal pools use one thread.
    pub(crate) manual: bool,
    /// Values with a sequence number at or below this were flushed
    /// ([`Store::flush_all`]): they read as absent and GC drops them.
    pub(crate) flush_floor: AtomicU64,
    /// Serialises `flush_all`s, so the floor stored last is the highest.
    flush_lock: async_lock::Mutex<()>,
    /// Keys whose value GC is dropping from a segment not yet free on the
    /// device: a new value of such a key supersedes a version still on the
    /// device, though none is indexed (see `gc::drop_value`).
    pub(crate) dropped: crate::gc::DroppedKeys,
    /// Entries displaced by blind overwrites, not yet verified.
    pub(crate) links: crate::links::Links,
    /// Changes to the segment a GC reads sparsely ([`crate::gc::SparseWatch`]).
    pub(crate) sparse_watch: crate::gc::SparseWatch,
    /// Group commit of user writes ([`OpenOptions::coalesce_writes`]).
    coalesce: bool,
    /// Access words kept ([`OpenOptions::track_access`]), relative to the open.
    track_access: bool,
    access_clock: Clock0,
    coalescer: crate::coalesce::Coalescer,
}

/// The engine's calls that do IO, each declared once: the declaration
/// `fn name / name_async(&self, args) -> R = core_fn;` makes the blocking
/// method `name`, which runs `Core::core_fn`'s future to completion on this
/// thread (never call it on an executor: it blocks it), and the async one
/// `name_async`, for executors (with the io_uring backend its IO goes
/// through the executor's ring). The engine itself is written once, async.
macro_rules! engine_calls {
    ($(
        $(#[doc = $doc:expr])*
        fn $name:ident / $name_async:ident $(<$g:ident>)? (&self $(, $arg:ident : $ty:ty)* $(,)?) -> $ret:ty = $call:ident;
    )*) => {
        impl Store {
            $(
                $(#[doc = $doc])*
                pub fn $name $(<$g>)? (&self $(, $arg: $ty)*) -> $ret {
                    block_on(self.core.$call($($arg),*))
                }

                #[doc = concat!("[`Store::", stringify!($name), "`] as a future.")]
                pub async fn $name_async $(<$g>)? (&self $(, $arg: $ty)*) -> $ret {
                    self.core.$call($($arg),*).await
                }
            )*
        }
    };
}

impl Store {
    /// Format `dev` as a new, empty store and open it.
    pub fn create(dev: Arc<dyn Device>, opts: &CreateOptions, open: &OpenOptions) -> Result<Store> {
        let sb = Self::geometry(dev.as_ref(), opts, open)?;
        let mut buf = AlignedBuf::zeroed(4096);
        sb.encode(&mut buf);
        for &offset in &SUPERBLOCK_OFFSETS {
            let (b, r) = dev.write_at(buf, offset);
            r.map_err(|source| Error::Io { op: "write of the superblock", offset, source })?;
            buf = b;
        }
        dev.flush().map_err(|source| Error::Io { op: "flush", offset: 0, source })?;
        tracing::debug!(device = %dev.describe(), segments = sb.segment_count, segment_bytes = sb.segment_bytes,
            grain_bytes = sb.grain_bytes, "created store");
        Self::open(dev, open)
    }

    fn geometry(dev: &dyn Device, opts: &CreateOptions, open: &OpenOptions) -> Result<Superblock> {
        let bad = |s: String| Err(Error::InvalidOptions(s));
        let grain = opts.grain_bytes.unwrap_or(dev.block_bytes().max(512));
        if !GRAIN_BYTES_ALLOWED.contains(&grain) {
            return bad(format!("grain size {grain} is not one of {GRAIN_BYTES_ALLOWED:?}"));
        }
        if grain < dev.block_bytes() {
            return bad(format!("grain size {grain} is smaller than the device's {}-byte blocks", dev.block_bytes()));
        }
        let size = dev.size_bytes();
        let data = size.saturating_sub(DATA_OFFSET_BYTES);
        let segment_bytes = opts.segment_bytes.unwrap_or_else(|| default_segment_bytes(data));
        let segment_count = data / segment_bytes.max(1);
        if segment_count < 2 {
            return bad(format!(
                "a device of {size} bytes holds fewer than two segments of {segment_bytes} bytes \
                 (after {DATA_OFFSET_BYTES} bytes for superblocks); use a larger device or smaller segments"
            ));
        }
        let sb = Superblock {
            uuid: open.entropy.draw().map_err(Error::Device)?,
            grain_bytes: grain,
            hash_algo: KEY_HASH_ALGO_XXH3_64,
            segment_bytes,
            segment_count,
            device_bytes: size,
            index_table_homes: opts.index_table_homes.unwrap_or_else(|| default_index_table_homes(data, grain)),
            created_unix_ms: open.clock.unix_ms(),
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
        let headers = crate::log::read_segment_headers(dev.as_ref(), &sb)?;
        let (loaded, floor) = crate::checkpoint::find(dev.as_ref(), &sb, &headers, opts.use_checkpoint);
        let mut index_cfg = match &loaded {
            Some(l) => IndexConfig::with_tables(sb.index_table_homes, l.manifest.tables_log2),
            None => IndexConfig::new(sb.index_table_homes),
        };
        index_cfg.access_words = opts.track_access;
        let mut session = [0u8; 8];
        session.copy_from_slice(&opts.entropy.draw().map_err(Error::Device)?[..8]);
        let core = Core {
            seed: record_seed(&sb.uuid),
            index: Index::new(index_cfg),
            space: Space::new(dev.clone(), sb.clone(), opts.durability, opts.gc),
            next_seq: AtomicU64::new(1),
            counters: Counters::default(),
            recovery: Mutex::new(RecoveryReport::default()),
            durability: opts.durability,
            stripes: (0..KEY_STRIPES).map(|_| async_lock::Mutex::new(())).collect(),
            poisoned: OnceLock::new(),
            gc_counters: Default::default(),
            gc_lock: Mutex::new(()),
            session: u64::from_le_bytes(session),
            checkpoint: Mutex::new(Default::default()),
            checkpoint_counters: Default::default(),
            clock: opts.clock.clone(),
            evict: opts.evict,
            flush_floor: AtomicU64::new(0),
            flush_lock: async_lock::Mutex::new(()),
            dropped: Default::default(),
            links: crate::links::Links::new(opts.blind_overwrite_bytes.unwrap_or(if dev.in_memory() {
                0
            } else {
                crate::links::BLIND_OVERWRITE_BYTES_DEFAULT
            })),
            sparse_watch: crate::gc::SparseWatch::new(),
            coalesce: opts.coalesce_writes,
            manual: opts.background == crate::Background::Manual,
            coalescer: Default::default(),
            track_access: opts.track_access,
            access_clock: Clock0 { base: opts.clock.now() },
            dev,
            sb,
        };
        core.recover(headers, loaded, floor, opts)?;
        if let Some(f) = block_on(core.read_item(FLUSH_FLOOR_KEY))? {
            let floor = f.value.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
            core.flush_floor.store(floor.unwrap_or(0), Relaxed);
        }
        let core = Arc::new(core);
        let threads = opts.background == crate::Background::Threads;
        let gc = if opts.gc && threads {
            let c = core.clone();
            let handle = std::thread::Builder::new()
                .name("granary-gc".into())
                .spawn(move || crate::gc::run(&c))
                .map_err(Error::Device)?;
            Some(handle)
        } else {
            None
        };
        let checkpointer = match opts.checkpoint_interval.filter(|_| threads) {
            Some(every) => {
                let stop = Arc::new((Mutex::new(false), Condvar::new()));
                let (c, st) = (core.clone(), stop.clone());
                let handle = std::thread::Builder::new()
                    .name("granary-ckpt".into())
                    .spawn(move || checkpoint_loop(&c, &st, every))
                    .map_err(Error::Device)?;
                Some((stop, handle))
            }
            None => None,
        };
        Ok(Store { core, gc, checkpointer, checkpoint_on_close: opts.checkpoint_on_close })
    }

    fn read_superblock(dev: &dyn Device) -> Result<Superblock> {
        let mut first_err = None;
        for (i, &offset) in SUPERBLOCK_OFFSETS.iter().enumerate() {
            let (buf, r) = dev.read_at(AlignedBuf::zeroed(4096), offset);
            r.map_err(|source| Error::Io { op: "read of the superblock", offset, source })?;
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
        Err(Error::NotAStore(first_err.unwrap_or(FormatError::BadMagic { what: "superblock", found: 0 })))
    }

    /// Create a store in a new file of `size_bytes` (preallocated), or on a
    /// RAID-0 stripe set when `path` lists members separated by commas
    /// ([`granary_io::DeviceSpec`]; files of `size_bytes` in all, default
    /// stripe unit). Files it created are removed if creation fails.
    pub fn create_path(
        path: &Path,
        size_bytes: u64,
        mode: OpenMode,
        opts: &CreateOptions,
        open: &OpenOptions,
    ) -> Result<Store> {
        let spec = DeviceSpec::parse(path).map_err(Error::Device)?;
        let dev = spec
            .create(size_bytes, granary_io::stripe::STRIPE_BYTES_DEFAULT, mode, IoBackend::Sync)
            .map_err(Error::Device)?;
        Self::create(dev, opts, open).inspect_err(|_| spec.remove_files())
    }

    /// Open a store on a file, a block device or a stripe set (members
    /// separated by commas, in any order).
    pub fn open_path(path: &Path, mode: OpenMode, open: &OpenOptions) -> Result<Store> {
        let dev = DeviceSpec::parse(path).and_then(|s| s.open(mode, IoBackend::Sync)).map_err(Error::Device)?;
        Self::open(dev, open)
    }
}

impl Core {
    /// Largest value this store accepts with a key of `key_len` bytes.
    pub fn value_bytes_max(&self, key_len: usize) -> u64 {
        let record_max = (self.sb.segment_grains() - 1) * self.sb.grain_bytes as u64;
        (record_max - RECORD_HEADER_BYTES as u64 - key_len as u64).min(VALUE_BYTES_MAX)
    }

    /// Wait (with no key stripe held) until a write of `grains` is likely
    /// to find room: GC's thread makes it, or, with
    /// [`crate::Background::Manual`], this writer runs GC itself.
    async fn await_room(&self, purpose: Purpose, grains: u64) -> Result<()> {
        if !self.manual {
            return self.space.await_room(purpose, grains).await;
        }
        let mut asked = None;
        loop {
            if let Some(r) = self.space.room_now(purpose, grains, &mut asked) {
                return r;
            }
            if !crate::gc::poll(self) {
                // Asked, and GC has nothing to do: no room will come.
                return self.space.room_now(purpose, grains, &mut asked).unwrap_or(Err(Error::NoSpace {
                    needed_bytes: grains * self.sb.grain_bytes as u64,
                    segments: self.sb.segment_count,
                }));
            }
        }
    }

    fn check_key(key: &[u8]) -> Result<()> {
        if !(KEY_BYTES_MIN..=KEY_BYTES_MAX).contains(&key.len()) {
            return Err(Error::KeyLength { len: key.len(), min: KEY_BYTES_MIN, max: KEY_BYTES_MAX });
        }
        Ok(())
    }

    /// A user's key: in length and outside the reserved namespace.
    fn check_user_key(key: &[u8]) -> Result<()> {
        Self::check_key(key)?;
        if key.starts_with(RESERVED_KEY_PREFIX) {
            return Err(Error::ReservedKey);
        }
        Ok(())
    }

    /// Hide every value written so far (memcache `flush_all`): they read as
    /// absent and GC reclaims them. The floor is stored under a reserved
    /// key, so it holds across restarts. Returns the floor.
    pub async fn flush_all(&self) -> Result<u64> {
        let _one_at_a_time = self.flush_lock.lock().await;
        let floor = self.next_seq.fetch_add(1, Relaxed);
        // Stored first, then applied: until the new floor record is on the
        // device, the old one must not read as flushed (GC would drop it).
        let v = Version { meta: ItemMeta::default(), cas: None, policy: FRESH };
        self.write_item(FLUSH_FLOOR_KEY, Payload::Slice(&floor.to_le_bytes()), v, Cond::Always).await?;
        self.flush_floor.fetch_max(floor, Relaxed);
        Ok(floor)
    }

    /// Whether a value with this header was hidden by expiry or a flush.
    pub(crate) fn hidden(&self, hdr: &RecordHeader, now: u32) -> bool {
        hdr.expired_at(now) || hdr.seq <= self.flush_floor.load(Relaxed)
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        match self.poisoned.get() {
            Some(cause) => Err(Error::Poisoned { cause: cause.clone() }),
            None => Ok(()),
        }
    }

    pub(crate) fn poison(&self, err: Error) -> Error {
        let _ = self.poisoned.set(err.to_string());
        tracing::error!(error = %err, "device failure: the store now refuses writes until reopened");
        err
    }

    /// The stripe lock index of hash `h`: keys that are candidates of
    /// each other (same home slot and key tag) share it.
    pub(crate) fn stripe_of(&self, h: u64) -> usize {
        stripe_for(self.index.home(h), h)
    }

    /// Take stripe `i`, blocking the thread (GC, off any executor).
    pub(crate) fn lock_stripe(&self, i: usize) -> async_lock::MutexGuard<'_, ()> {
        // Uncontended (the usual case): no event listener set up.
        self.stripes[i].try_lock().unwrap_or_else(|| self.stripes[i].lock_blocking())
    }

    async fn stripe(&self, h: u64) -> async_lock::MutexGuard<'_, ()> {
        self.stripes[self.stripe_of(h)].lock().await
    }

    pub(crate) fn grain(&self) -> u64 {
        self.sb.grain_bytes as u64
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
    pub(crate) fn read_record(&self, e: Entry, full: bool) -> Result<(RecordHeader, AlignedBuf)> {
        block_on(self.read_record_async(e, full))
    }

    /// [`Core::read_record`], asynchronously.
    pub(crate) async fn read_record_async(&self, e: Entry, full: bool) -> Result<(RecordHeader, AlignedBuf)> {
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
            return Err(corrupt(format!("index entry {e:?} points outside a segment's records")));
        }
        let mut buf = self.io_read(hint, e.pba()).await?;
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

    /// Find the current version of `key`, reading the whole record with
    /// `full`. A candidate whose record is unreadable is skipped; if no
    /// candidate matches and one was unreadable, `strict` returns that error
    /// (the key may have been the unreadable one). The entries relied on are
    /// checked to still be in the index after the reads; if one is gone, GC
    /// or a writer moved it meanwhile and the search starts over. A whole
    /// record's checksum is checked after that check, so that the check's
    /// index reads overlap the record's copy still arriving (in-memory
    /// device) and a record that moved is never checked at all. On an
    /// executor over the in-memory device the lookup's line is asked for
    /// and the task yields first ([`Device::in_memory`]), for every caller
    /// (GETs, and the writes that look up the current version, some with
    /// the key's stripe lock held).
    pub(crate) async fn find(&self, key: &[u8], h: u64, full: bool, strict: bool) -> Result<Option<Found>> {
        if self.dev.in_memory() && granary_rt::on_runtime() {
            // The lookup's cache miss overlaps other tasks' work, as the
            // record's copy does (`Device::in_memory`).
            self.index.prefetch(h);
            granary_rt::yield_now().await;
        }
        'retry: loop {
            let cands = self.index.lookup(h);
            let mut unreadable = None;
            let mut found = None;
            let mut other_key = false;
            for &entry in cands.as_slice() {
                match self.read_record_async(entry, false).await {
                    Ok((hdr, buf)) => {
                        if record::key_of(&hdr, &buf) == key {
                            found = Some(Found { entry, hdr, buf, via: None });
                            break;
                        }
                    }
                    Err(e @ Error::Corruption { .. }) => unreadable = Some(e),
                    Err(e) => return Err(e),
                }
                // Not the key (or unreadable): another key's blind
                // overwrite may have displaced it ([`crate::links`]).
                other_key = true;
                let Some(link) = self.links.of_head(entry.pba()) else { continue };
                match self.read_record_async(link.old, false).await {
                    Ok((hdr, buf)) if record::key_of(&hdr, &buf) == key => {
                        found = Some(Found { entry: link.old, hdr, buf, via: Some(entry.pba()) });
                        break;
                    }
                    Ok(_) => {}
                    Err(e @ Error::Corruption { .. }) => unreadable = Some(e),
                    Err(e) => return Err(e),
                }
            }
            let still = match &found {
                Some(f) => self.still_found(h, f),
                // A link settled meanwhile may have put the key back in
                // the index after the lookup: then the candidates changed.
                None if other_key => self.same_candidates(h, cands.as_slice()),
                None => self.still_indexed(h, cands.as_slice()),
            };
            if !still {
                continue 'retry;
            }
            let Some(f) = found else {
                if let Some(e) = &unreadable {
                    tracing::warn!(error = %e, "unreadable index candidate");
                }
                return match unreadable {
                    Some(e) if strict => Err(e),
                    _ => Ok(None),
                };
            };
            if !full {
                return Ok(Some(f));
            }
            let offset = f.entry.pba() * self.grain();
            if f.buf.len() as u64 >= f.hdr.record_bytes() {
                record::verify_crc(self.seed, &f.hdr, &f.buf)
                    .map_err(|fe| Error::Corruption { offset, detail: fe.to_string() })?;
                if f.hdr.damaged_copy {
                    let detail = "record was damaged before GC relocated it".to_string();
                    return Err(Error::Corruption { offset, detail });
                }
                return Ok(Some(f));
            }
            // The rest of a record larger than its first read: read whole
            // and checked, and relied on only if still current after it.
            let whole = self.read_record_async(f.entry, true).await;
            if !self.still_found(h, &f) {
                continue 'retry;
            }
            let (hdr, buf) = whole?;
            return Ok(Some(Found { entry: f.entry, hdr, buf, via: f.via }));
        }
    }

    /// Whether `h`'s candidates are exactly `cands` (in any order).
    fn same_candidates(&self, h: u64, cands: &[Entry]) -> bool {
        let now = self.index.lookup(h);
        now.as_slice().len() == cands.len() && cands.iter().all(|e| now.as_slice().contains(e))
    }

    /// Whether a found version is still where it was found: in the index,
    /// or still displaced by the head it was found through (or put back
    /// in the index since).
    fn still_found(&self, h: u64, f: &Found) -> bool {
        let pba = f.entry.pba();
        match f.via {
            None => self.index.contains(h, pba),
            Some(head) => {
                let linked = self.links.of_head(head).is_some_and(|l| l.old.pba() == pba);
                (linked && self.index.contains(h, head)) || self.index.contains(h, pba)
            }
        }
    }

    /// Whether every one of `entries` is in the index under hash `h`.
    /// One entry (a found record, the common case) is asked with
    /// [`Index::contains`](granary_index::Index::contains), which gathers no
    /// candidates: the record at that location under `h` is the one read
    /// (a location is reused only once GC has moved every entry out of its
    /// segment). None (no candidate at the lookup) needs no second look:
    /// the key was absent then.
    fn still_indexed(&self, h: u64, entries: &[Entry]) -> bool {
        match entries {
            [] => true,
            [e] => self.index.contains(h, e.pba()),
            _ => {
                let now = self.index.lookup(h);
                entries.iter().all(|e| now.as_slice().contains(e))
            }
        }
    }

    /// Whether a found version is a value that has not expired.
    fn is_live(&self, f: &Found, now: u32) -> bool {
        !f.hdr.is_tombstone() && !self.hidden(&f.hdr, now)
    }

    /// The value of `key`, or None if absent, deleted or expired.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.get_item(key).await?.map(|i| i.value))
    }

    /// The value of `key` with its metadata and CAS value.
    pub async fn get_item(&self, key: &[u8]) -> Result<Option<Item>> {
        Self::check_user_key(key)?;
        self.read_item(key).await
    }

    /// [`Core::get_item`] without the reserved-namespace check.
    async fn read_item(&self, key: &[u8]) -> Result<Option<Item>> {
        Ok(self.read_live(key, true).await?.as_ref().map(Self::item_of))
    }

    /// A GET's lookup: the whole record of `key`'s live value, counted
    /// and (cache mode) touching its segment; with `bump` (and access
    /// tracking), marked as read now.
    async fn read_live(&self, key: &[u8], bump: bool) -> Result<Option<Found>> {
        self.counters.gets.fetch_add(1, Relaxed);
        let h = key_hash(key);
        let Some(f) = self.find(key, h, true, true).await? else { return Ok(None) };
        // The clock is read only when something needs it (a clock read is
        // a visible share of an in-memory GET): a record without an expiry time is live at
        // any `now`, and 0 stands in for it then.
        let now = if f.hdr.expires != 0 || (bump && self.track_access) { self.clock.now() } else { 0 };
        if !self.is_live(&f, now) {
            return Ok(None);
        }
        self.counters.get_hits.fetch_add(1, Relaxed);
        if self.evict {
            self.space.touch(self.sb.segment_of(f.entry.pba()));
        }
        if bump && self.track_access {
            let c = self.access_clock;
            self.index.access(h, f.entry.pba(), |w| c.bumped(w, now));
        }
        Ok(Some(f))
    }

    /// The item of `key` with its access state before this read: marked
    /// read unless `!bump` (memcache `u`), and handed the item's win token
    /// when `want_win(item)` and no reader had it yet. Without access
    /// tracking the state reads "never read, accessed now, no token" and
    /// every reader that wants the token wins it.
    pub async fn get_item_access(
        &self,
        key: &[u8],
        bump: bool,
        want_win: impl Fn(&Item) -> bool,
    ) -> Result<Option<ItemAccess>> {
        Self::check_user_key(key)?;
        let Some(f) = self.read_live(key, false).await? else { return Ok(None) };
        let item = Self::item_of(&f);
        let want = want_win(&item);
        let now = self.clock.now();
        let fresh = crate::Access { fetched: false, last_access: now, win_sent: false };
        // Found through a blind overwrite's link, it has no index entry (so
        // no access word) until the link is settled: read as untracked.
        if !self.track_access || f.via.is_some() {
            return Ok(Some(ItemAccess { item, prior: fresh, won: want }));
        }
        let c = self.access_clock;
        let old = self.index.access(key_hash(key), f.entry.pba(), |w| {
            let w2 = if bump { c.bumped(w, now) } else { w };
            if want && !Clock0::is_won(w) {
                Clock0::won(w2)
            } else {
                w2
            }
        });
        // None: a writer replaced the version just read; it reads as new.
        let (prior, won) = match old {
            Some(w) => (c.decode(w), want && !Clock0::is_won(w)),
            None => (fresh, false),
        };
        Ok(Some(ItemAccess { item, prior, won }))
    }

    /// The value of `key` in the buffer it was read into (zero-copy).
    pub async fn get_buf(&self, key: &[u8]) -> Result<Option<ValueBuf>> {
        Self::check_user_key(key)?;
        let Some(f) = self.read_live(key, true).await? else { return Ok(None) };
        Ok(Some(ValueBuf {
            start: f.hdr.value_start(),
            len: f.hdr.user_value_len() as usize,
            meta: ItemMeta { flags: f.hdr.user_flags, expires: f.hdr.expires, stale: f.hdr.stale },
            cas: record::cas_of(&f.hdr, &f.buf),
            buf: f.buf,
        }))
    }

    /// A record buffer for `key` with room for a value of `value_len`
    /// bytes, to fill and then write with [`Core::put_buf`].
    pub fn new_put_buf(&self, key: &[u8], value_len: usize) -> Result<PutBuf> {
        Self::check_user_key(key)?;
        let max = self.value_bytes_max(key.len());
        if value_len as u64 > max {
            return Err(Error::ValueTooLarge { len: value_len as u64, max });
        }
        let grains = grains_for(record_bytes(key.len(), value_len as u64), self.sb.grain_bytes);
        let mut buf = AlignedBuf::zeroed((grains * self.grain()) as usize);
        buf[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + key.len()].copy_from_slice(key);
        Ok(PutBuf::new(buf, key.len(), value_len))
    }

    /// Write the record built in `pb` (its key, its value as filled).
    pub async fn put_buf(&self, mut pb: PutBuf, meta: ItemMeta, cond: Cond) -> Result<(PutOutcome, u64)> {
        let key = pb.key().to_vec();
        Self::check_user_key(&key)?;
        let value_len = pb.value_len as u64;
        let v = Version { meta, cas: None, policy: Policy::new_item(&meta) };
        self.write_item(&key, Payload::Owned { buf: &mut pb.buf, value_len }, v, cond).await
    }

    fn item_of(f: &Found) -> Item {
        Item {
            value: record::value_of(&f.hdr, &f.buf).to_vec(),
            meta: ItemMeta { flags: f.hdr.user_flags, expires: f.hdr.expires, stale: f.hdr.stale },
            cas: record::cas_of(&f.hdr, &f.buf),
        }
    }

    /// Grains of a value record of `value_len` bytes for `key` (with an
    /// explicit CAS value when `cas` is given); refuses one the store
    /// cannot hold.
    fn value_grains(&self, key: &[u8], value_len: u64, cas: Option<u64>) -> Result<u64> {
        let len = value_len + if cas.is_some() { record::EXPLICIT_CAS_BYTES as u64 } else { 0 };
        let max = self.value_bytes_max(key.len());
        if len > max {
            return Err(Error::ValueTooLarge { len: value_len, max });
        }
        Ok(grains_for(record_bytes(key.len(), len), self.sb.grain_bytes))
    }

    /// PUT with a mode; returns whether it stored.
    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.put_with(key, value, PutMode::Upsert).await.map(|_| ())
    }

    pub async fn put_with(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<PutOutcome> {
        Ok(self.put_item(key, value, ItemMeta::default(), mode.into()).await?.0)
    }

    /// Conditional PUT with metadata; on `Stored`, also the new CAS value
    /// (0 otherwise).
    pub async fn put_item(&self, key: &[u8], value: &[u8], meta: ItemMeta, cond: Cond) -> Result<(PutOutcome, u64)> {
        self.put_user_item(key, value, Version { meta, cas: None, policy: Policy::new_item(&meta) }, cond).await
    }

    /// A user key's PUT of a value slice as `v` says.
    async fn put_user_item(&self, key: &[u8], value: &[u8], v: Version, cond: Cond) -> Result<(PutOutcome, u64)> {
        Self::check_user_key(key)?;
        self.write_item(key, Payload::Slice(value), v, cond).await
    }

    /// [`Core::put_item`] giving the new version the CAS value `cas`
    /// instead of its sequence number (memcache `ms ... E<cas>`).
    pub async fn put_item_with_cas(
        &self,
        key: &[u8],
        value: &[u8],
        meta: ItemMeta,
        cond: Cond,
        cas: u64,
    ) -> Result<(PutOutcome, u64)> {
        self.put_user_item(key, value, Version { meta, cas: Some(cas), policy: Policy::new_item(&meta) }, cond).await
    }

    /// [`Core::put_item`] (or with a chosen CAS value) whose new version
    /// has its win token already handed out (memcache's vivify on miss:
    /// the client that created it is the one to fill it), and is marked
    /// read when `read`.
    pub async fn put_item_won(
        &self,
        key: &[u8],
        value: &[u8],
        meta: ItemMeta,
        cond: Cond,
        cas: Option<u64>,
        read: bool,
    ) -> Result<(PutOutcome, u64)> {
        self.put_user_item(key, value, Version { meta, cas, policy: Policy::Vivified { read } }, cond).await
    }

    /// [`Core::put_item`] without the reserved-namespace check.
    async fn write_item(
        &self,
        key: &[u8],
        mut value: Payload<'_>,
        v: Version,
        cond: Cond,
    ) -> Result<(PutOutcome, u64)> {
        let grains = self.value_grains(key, value.value_len(), v.cas)?;
        let h = key_hash(key);
        loop {
            self.check_writable()?;
            self.await_room(Purpose::Put, grains).await.map_err(|e| self.check_writable().err().unwrap_or(e))?;
            let _stripe = self.stripe(h).await;
            let prior = if cond == Cond::Always {
                // An unconditional PUT needs the current version only to
                // replace its entry: it is read while the new one is
                // written, if the index has a candidate for it at all.
                match self.index.lookup(h).as_slice() {
                    [] => Prior::Known(None),
                    &[e] if self.blind_ok(e, key) => Prior::Blind(e),
                    _ => Prior::Unread,
                }
            } else {
                let existing = self.find(key, h, false, false).await?;
                let live = existing.as_ref().filter(|f| self.is_live(f, self.clock.now()));
                match (cond, live) {
                    (Cond::Absent, Some(_)) => return Ok((PutOutcome::Exists, 0)),
                    (Cond::Present | Cond::Cas(_), None) => return Ok((PutOutcome::NotFound, 0)),
                    (Cond::Cas(c), Some(f)) if record::cas_of(&f.hdr, &f.buf) != c => {
                        return Ok((PutOutcome::Exists, 0))
                    }
                    _ => {}
                }
                Prior::Known(existing)
            };
            match self.write_value(key, h, value.reborrow(), prior, v).await {
                Err(Error::NoSpace { .. }) => continue, // raced for the last room: wait again
                r => return r.map(|cas| (PutOutcome::Stored, cas)),
            }
        }
    }

    /// Write a new version of `key` (under its stripe) replacing its
    /// current one, `prior`; returns its CAS value: `v.cas` when given
    /// (stored in the record before the value), else its sequence number.
    async fn write_value(&self, key: &[u8], h: u64, value: Payload<'_>, prior: Prior, v: Version) -> Result<u64> {
        let Version { meta, cas, policy } = v;
        let seq = self.next_seq.fetch_add(1, Relaxed);
        let value_len = value.value_len();
        let with_cas;
        let (payload, hdr) = match (cas, value) {
            (Some(c), Payload::Slice(v)) => {
                with_cas = [c.to_le_bytes().as_slice(), v].concat();
                let hdr = RecordHeader::value(key.len(), with_cas.len() as u64, seq, 0).with_explicit_cas();
                (Payload::Slice(&with_cas), hdr)
            }
            (Some(_), Payload::Owned { .. }) => unreachable!("record buffers are written without an explicit CAS"),
            (None, value) => (value, RecordHeader::value(key.len(), value_len, seq, 0)),
        };
        // An unread prior counts as present: a candidate is the key but for
        // a rare fingerprint collision, and the flag is then only cautious.
        let supersedes = !matches!(prior, Prior::Known(None)) || self.dropped.contains(h);
        let hdr = hdr.with_meta(meta.flags, meta.expires).with_stale(meta.stale).with_supersedes(supersedes);
        let write = self.write_record_async(Purpose::Put, hdr, key, payload);
        let (loc, existing) = match prior {
            Prior::Known(existing) => (write.await?, existing),
            Prior::Blind(e) => {
                let loc = write.await?;
                let committed = self.commit_blind(key, h, e, loc, policy).await;
                self.space.done(loc.seg);
                committed?;
                self.counters.puts.fetch_add(1, Relaxed);
                self.counters.user_bytes.fetch_add(key.len() as u64 + value_len, Relaxed);
                return Ok(cas.unwrap_or(seq));
            }
            Prior::Unread => match join2(write, self.find(key, h, false, false)).await {
                (Ok(loc), Ok(existing)) => (loc, existing),
                (Ok(loc), Err(e)) => {
                    // Written but not indexed: the running store keeps the
                    // old version; the PUT reports the error (after a crash
                    // the new one may be what recovery finds, as with any
                    // write that failed midway).
                    self.space.done(loc.seg);
                    return Err(e);
                }
                (Err(e), _) => return Err(e),
            },
        };
        let committed = self.commit(key, h, existing, loc, false, policy).await;
        self.space.done(loc.seg);
        committed?;
        self.counters.puts.fetch_add(1, Relaxed);
        self.counters.user_bytes.fetch_add(key.len() as u64 + value_len, Relaxed);
        Ok(cas.unwrap_or(seq))
    }

    /// Write a tombstone for `key` (under its stripe) replacing `existing`
    /// (None: the key has no indexed version, but one is still on the device).
    async fn write_tombstone(&self, key: &[u8], h: u64, existing: Option<Found>) -> Result<()> {
        let seq = self.next_seq.fetch_add(1, Relaxed);
        // Under the stripe no relocation of this key can run, so every
        // older version of it lies in a segment at or below the horizon.
        let hdr = RecordHeader::tombstone(key.len(), seq, 0, self.space.horizon());
        let loc = self.write_record_async(Purpose::Delete, hdr, key, Payload::Slice(&[])).await?;
        let committed = self.commit(key, h, existing, loc, true, FRESH).await;
        self.space.done(loc.seg);
        committed?;
        self.counters.deletes.fetch_add(1, Relaxed);
        self.counters.user_bytes.fetch_add(key.len() as u64, Relaxed);
        Ok(())
    }

    /// Read-modify-write of one key: `f` sees the current item (None if
    /// absent, deleted or expired) while no other write of the key can run,
    /// and says what to write and what to return. Returns `f`'s answer and,
    /// if it wrote a value, the new CAS value. `f` may run more than once
    /// (when the store had to wait for space); only its last answer counts.
    pub async fn update<R>(
        &self,
        key: &[u8],
        mut f: impl FnMut(Option<&Item>) -> (Change, R),
    ) -> Result<(R, Option<u64>)> {
        Self::check_user_key(key)?;
        let h = key_hash(key);
        let mut need = 1;
        loop {
            self.check_writable()?;
            self.await_room(Purpose::Put, need).await.map_err(|e| self.check_writable().err().unwrap_or(e))?;
            let _stripe = self.stripe(h).await;
            let existing = self.find(key, h, true, true).await?;
            let item = existing.as_ref().filter(|x| self.is_live(x, self.clock.now())).map(Self::item_of);
            let (change, r) = f(item.as_ref());
            let policy = match &change {
                Change::Touch { fetch, .. } => Policy::Touch { fetch: *fetch },
                Change::Rewrite { .. } => Policy::Touch { fetch: false },
                Change::Invalidate { .. } => Policy::Invalidate,
                Change::Put { meta, .. } | Change::PutCas { meta, .. } => Policy::new_item(meta),
                Change::Keep | Change::Delete => FRESH,
            };
            let written = match change {
                Change::Keep => return Ok((r, None)),
                Change::Put { value, meta } | Change::Invalidate { value, meta } => {
                    need = self.value_grains(key, value.len() as u64, None)?;
                    let v = Version { meta, cas: None, policy };
                    self.write_value(key, h, Payload::Slice(&value), Prior::Known(existing), v).await.map(Some)
                }
                Change::Rewrite { value, meta, cas } => {
                    need = self.value_grains(key, value.len() as u64, cas)?;
                    let v = Version { meta, cas, policy };
                    self.write_value(key, h, Payload::Slice(&value), Prior::Known(existing), v).await.map(Some)
                }
                Change::PutCas { value, meta, cas } | Change::Touch { value, meta, cas, .. } => {
                    need = self.value_grains(key, value.len() as u64, Some(cas))?;
                    let v = Version { meta, cas: Some(cas), policy };
                    self.write_value(key, h, Payload::Slice(&value), Prior::Known(existing), v).await.map(Some)
                }
                Change::Delete => match existing {
                    Some(x) if !x.hdr.is_tombstone() => {
                        need = grains_for(record_bytes(key.len(), 0), self.sb.grain_bytes);
                        self.write_tombstone(key, h, Some(x)).await.map(|()| None)
                    }
                    _ => return Ok((r, None)),
                },
            };
            match written {
                Err(Error::NoSpace { .. }) => continue,
                w => return w.map(|cas| (r, cas)),
            }
        }
    }

    /// Delete `key`; returns whether it was present (an expired value was
    /// not, but is deleted all the same). Writes a tombstone only when a
    /// value was indexed.
    pub async fn delete(&self, key: &[u8]) -> Result<bool> {
        Self::check_user_key(key)?;
        let h = key_hash(key);
        let grains = grains_for(record_bytes(key.len(), 0), self.sb.grain_bytes);
        loop {
            self.check_writable()?;
            self.await_room(Purpose::Delete, grains).await.map_err(|e| self.check_writable().err().unwrap_or(e))?;
            let _stripe = self.stripe(h).await;
            let (existing, live) = match self.find(key, h, false, false).await? {
                Some(f) if f.hdr.is_tombstone() => return Ok(false),
                Some(f) => {
                    let live = self.is_live(&f, self.clock.now());
                    (Some(f), live)
                }
                // GC is dropping the key's value from a segment not yet
                // free on the device: without a tombstone that value would
                // come back after a crash.
                None if self.dropped.contains(h) => (None, false),
                None => return Ok(false),
            };
            match self.write_tombstone(key, h, existing).await {
                Err(Error::NoSpace { .. }) => continue,
                r => return r.map(|()| live),
            }
        }
    }

    /// Allocate, encode (with the segment's stamp) and write one record.
    /// On success the caller indexes it and then calls `space.done`.
    #[cfg(test)]
    pub(crate) fn write_record(&self, purpose: Purpose, hdr: RecordHeader, key: &[u8], value: &[u8]) -> Result<Loc> {
        block_on(self.write_record_async(purpose, hdr, key, Payload::Slice(value)))
    }

    /// [`Core::write_record`], asynchronously.
    pub(crate) async fn write_record_async(
        &self,
        purpose: Purpose,
        mut hdr: RecordHeader,
        key: &[u8],
        value: Payload<'_>,
    ) -> Result<Loc> {
        if self.coalesce && matches!(purpose, Purpose::Put | Purpose::Delete) {
            let next_seq = self.next_seq.load(Relaxed);
            let (dev, g) = (self.dev.as_ref(), self.grain());
            let r = self
                .coalescer
                .write(&self.space, dev, self.durability, purpose, self.seed, g, next_seq, hdr, key, value)
                .await;
            return r.map_err(|e| match e {
                Error::Io { .. } => self.poison(e),
                e => e,
            });
        }
        let grains = hdr.grains(self.sb.grain_bytes);
        let loc = self.space.alloc(purpose, grains, self.next_seq.load(Relaxed)).map_err(|e| match e {
            Error::Io { .. } => self.poison(e),
            e => e,
        })?;
        hdr.seg_stamp = loc.stamp;
        let (buf, owned) = match value {
            Payload::Slice(value) => {
                let mut buf = AlignedBuf::zeroed((grains * self.grain()) as usize);
                hdr.encode(self.seed, key, value, &mut buf);
                (buf, None)
            }
            Payload::Owned { buf, .. } => {
                let mut b = buf.take().expect("a record buffer");
                hdr.encode_in_place(self.seed, &mut b);
                (b, Some(buf))
            }
        };
        let offset = loc.pba * self.grain();
        let (buf, r) = self.dev.write_at_async(buf, offset).await;
        if let Some(slot) = owned {
            *slot = Some(buf);
        }
        let written = r.map_err(|source| Error::Io { op: "write", offset, source }).and_then(|()| {
            if self.durability == Durability::Flush {
                self.dev.flush().map_err(|source| Error::Io { op: "flush", offset, source })?;
            }
            Ok(())
        });
        if let Err(e) = written {
            self.space.done(loc.seg);
            return Err(self.poison(e));
        }
        Ok(loc)
    }

    /// Point the index at a record just written, replacing `existing`.
    /// The new entry's access word follows `policy`.
    async fn commit(
        &self,
        key: &[u8],
        h: u64,
        mut existing: Option<Found>,
        loc: Loc,
        tombstone: bool,
        policy: Policy,
    ) -> Result<()> {
        let kv_size = if tombstone { 0 } else { loc.grains };
        let g = self.grain();
        let (c, now) = (self.access_clock, self.clock.now());
        loop {
            if let Some(head) = existing.as_ref().and_then(|f| f.via) {
                // Found through a blind overwrite's link: back in the index
                // first, then replaced as usual.
                let pba = existing.as_ref().map(|f| f.entry.pba());
                if let Some(link) = self.links.of_head(head).filter(|l| Some(l.old.pba()) == pba) {
                    crate::links::settle(self, head, &link, key, h)?;
                }
                if let Some(f) = existing.as_mut() {
                    f.via = None;
                }
            }
            match &existing {
                Some(f) => {
                    let from = f.entry.pba();
                    let replace = || self.index.replace_with(h, from, kv_size, loc.pba, |w| c.apply(policy, w, now));
                    if crate::links::carry(self, from, loc.pba, replace) {
                        self.space.sub_live(self.sb.segment_of(f.entry.pba()), f.hdr.grains(self.sb.grain_bytes) * g);
                        self.counters.replaced(f.hdr.is_tombstone(), tombstone);
                        break;
                    }
                    // The entry moved under us (only a relocation can do that
                    // while we hold the key's stripe): find it again.
                    existing = self.find(key, h, false, false).await?;
                }
                None => {
                    if let Err(e) = self.index.insert_with(h, kv_size, loc.pba, c.apply(policy, 0, now)) {
                        // The record is on the device but cannot be indexed;
                        // refuse further writes rather than diverge from the log.
                        return Err(self.poison(Error::IndexFull(e)));
                    }
                    self.counters.added(tombstone);
                    break;
                }
            }
        }
        self.space.add_live(loc.seg, loc.grains * g);
        Ok(())
    }

    /// Whether an unconditional PUT of `key` may replace its one
    /// candidate `e` without reading it ([`crate::links`]): a value of
    /// known size, either the head of a link of this very key (then known
    /// to be its current version) or unlinked with room for a new link.
    fn blind_ok(&self, e: Entry, key: &[u8]) -> bool {
        if !self.links.enabled() || e.is_tombstone() || e.kv_size() == KV_SIZE_GRAINS_MAX {
            return false;
        }
        match self.links.of_head(e.pba()) {
            Some(l) => *l.key == *key,
            None => self.links.has_room(key.len()),
        }
    }

    /// Point the index at a record just written over `e` without reading
    /// it, linking the two (under the key's stripe: `e` cannot change).
    async fn commit_blind(&self, key: &[u8], h: u64, e: Entry, loc: Loc, policy: Policy) -> Result<()> {
        let g = self.grain();
        let (c, now) = (self.access_clock, self.clock.now());
        let replace = || self.index.replace_with(h, e.pba(), loc.grains, loc.pba, |w| c.apply(policy, w, now));
        let replaced = if self.links.of_head(e.pba()).is_some() {
            // The head of this key's own link (`blind_ok`): `e` is this
            // key's version, and the link moves on to the new head.
            crate::links::carry(self, e.pba(), loc.pba, replace)
        } else {
            let link = crate::links::Link { old: e, key: key.into(), aux: Default::default() };
            self.links.insert(loc.pba, std::sync::Arc::new(link));
            let mut old_aux = 0;
            let done = self.index.replace_with(h, e.pba(), loc.grains, loc.pba, |w| {
                old_aux = w;
                c.apply(policy, w, now)
            });
            if done {
                self.links.set_aux(loc.pba, old_aux);
            } else {
                self.links.remove(loc.pba);
            }
            done
        };
        if !replaced {
            // Not expected under the stripe; the careful way then.
            let existing = self.find(key, h, false, false).await?;
            return self.commit(key, h, existing, loc, false, policy).await;
        }
        self.space.sub_live(self.sb.segment_of(e.pba()), e.kv_size() as u64 * g);
        self.space.add_live(loc.seg, loc.grains * g);
        self.counters.blind.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Figures of the store now.
    pub fn stats(&self) -> Stats {
        let (free, open, closed, index_segs) = self.space.counts();
        let links = self.links.usage();
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
            segments_index: index_segs,
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
            recovery: self.recovery.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            value_bytes_max: self.value_bytes_max(1),
            gc: self.gc_counters.snapshot(),
            segments_opened: self.space.horizon(),
            gc_watermarks: self.space.watermarks(),
            checkpoints: {
                let id = self.checkpoint.lock().unwrap_or_else(|e| e.into_inner()).id;
                self.checkpoint_counters.snapshot(id)
            },
            session: self.session,
            write_groups: self.coalescer.groups.load(Relaxed),
            grouped_records: self.coalescer.records.load(Relaxed),
            blind_overwrites: c.blind.load(Relaxed),
            unsettled_links: links.0,
            link_bytes: links.1,
        }
    }

    /// Check every index entry against its record and scan every segment.
    /// GC waits meanwhile.
    pub fn verify(&self, progress: Option<&crate::options::ProgressHook>) -> Result<VerifyReport> {
        let _no_gc = self.gc_lock.lock().unwrap_or_else(|e| e.into_inner());
        crate::verify::verify(self, progress)
    }
}

engine_calls! {
    /// The value of `key`, or None if absent or deleted.
    fn get / get_async(&self, key: &[u8]) -> Result<Option<Vec<u8>>> = get;

    /// Insert or overwrite.
    fn put / put_async(&self, key: &[u8], value: &[u8]) -> Result<()> = put;

    /// PUT with a mode; returns whether it stored.
    fn put_with / put_with_async(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<PutOutcome> = put_with;

    /// Delete `key`; returns whether it was present.
    fn delete / delete_async(&self, key: &[u8]) -> Result<bool> = delete;

    /// The value of `key` with its metadata and CAS value; None if absent,
    /// deleted or expired.
    fn get_item / get_item_async(&self, key: &[u8]) -> Result<Option<Item>> = get_item;

    /// The item of `key` with its access state before this read (memcache
    /// `h`, `l`, win token); see [`crate::OpenOptions::track_access`]. The
    /// read marks the item read unless `!bump`; it is handed the item's win
    /// token (`won`) when `want_win(item)` holds and no earlier reader had
    /// it.
    fn get_item_access / get_item_access_async(
        &self,
        key: &[u8],
        bump: bool,
        want_win: impl Fn(&Item) -> bool,
    ) -> Result<Option<ItemAccess>> = get_item_access;

    /// [`Store::put_item`] (with a chosen CAS value when `cas` is given)
    /// whose new version starts with its win token handed out: memcache's
    /// vivify on miss, where the creator is the one to fill it; marked read
    /// (by that creator) when `read`.
    fn put_item_won / put_item_won_async(
        &self,
        key: &[u8],
        value: &[u8],
        meta: ItemMeta,
        cond: Cond,
        cas: Option<u64>,
        read: bool,
    ) -> Result<(PutOutcome, u64)> = put_item_won;

    /// The value of `key` (with its metadata and CAS value) in the aligned
    /// buffer it was read into: no copy. None if absent, deleted or
    /// expired.
    fn get_buf / get_buf_async(&self, key: &[u8]) -> Result<Option<ValueBuf>> = get_buf;

    /// Write the record built in `pb` ([`Store::new_put_buf`]):
    /// [`Store::put_item`] without copying the value (bytes of the value
    /// not filled are zeros).
    fn put_buf / put_buf_async(&self, pb: PutBuf, meta: ItemMeta, cond: Cond) -> Result<(PutOutcome, u64)> = put_buf;

    /// Conditional PUT with metadata: `Stored` with the new CAS value, or
    /// `Exists`/`NotFound` (and 0) when `cond` does not hold. An expired
    /// value counts as absent.
    fn put_item / put_item_async(
        &self,
        key: &[u8],
        value: &[u8],
        meta: ItemMeta,
        cond: Cond,
    ) -> Result<(PutOutcome, u64)> = put_item;

    /// [`Store::put_item`] with a chosen CAS value for the new version
    /// (instead of its sequence number); returns that CAS value on `Stored`.
    /// CAS values chosen this way are the caller's to keep unique.
    fn put_item_with_cas / put_item_with_cas_async(
        &self,
        key: &[u8],
        value: &[u8],
        meta: ItemMeta,
        cond: Cond,
        cas: u64,
    ) -> Result<(PutOutcome, u64)> = put_item_with_cas;

    /// Read-modify-write of one key (append, increment, touch, delete by
    /// CAS...): `f` sees the current item and decides; see [`Change`].
    /// Returns `f`'s answer and the new CAS value if a value was written.
    fn update / update_async<R>(
        &self,
        key: &[u8],
        f: impl FnMut(Option<&Item>) -> (Change, R),
    ) -> Result<(R, Option<u64>)> = update;

    /// Hide every value written so far, persistently (memcache
    /// `flush_all`); see [`Core::flush_all`].
    fn flush_all / flush_all_async(&self) -> Result<u64> = flush_all;
}

impl Store {
    /// A record buffer for `key` and a value of `value_len` bytes, the
    /// buffer the device will write: fill its value (directly, or by
    /// receiving into it), then write it with [`Store::put_buf`]. Fails
    /// for a bad key or a value larger than the store holds.
    pub fn new_put_buf(&self, key: &[u8], value_len: usize) -> Result<PutBuf> {
        self.core.new_put_buf(key, value_len)
    }

    /// Whether the store evicts when full (cache mode).
    pub fn evicts(&self) -> bool {
        self.core.evict
    }

    /// Unix seconds by the store's clock (the one expiry is judged by).
    pub fn now(&self) -> u32 {
        self.core.clock.now()
    }

    /// Figures of the store now.
    pub fn stats(&self) -> Stats {
        self.core.stats()
    }

    /// The superblock (geometry and identity).
    pub fn superblock(&self) -> &Superblock {
        &self.core.sb
    }

    /// Largest value this store accepts with a key of `key_len` bytes.
    pub fn value_bytes_max(&self, key_len: usize) -> u64 {
        self.core.value_bytes_max(key_len)
    }

    /// Check every index entry against its record and scan every segment.
    pub fn verify(&self) -> Result<VerifyReport> {
        self.core.verify(None)
    }

    /// [`Store::verify`], reporting (steps done, steps) to `progress` as it
    /// goes (a step: an index entry checked or a segment scanned).
    pub fn verify_with_progress(&self, progress: &ProgressHook) -> Result<VerifyReport> {
        self.core.verify(Some(progress))
    }

    /// Pause GC until the guard is dropped: it finishes the segment it is
    /// reclaiming and starts no other. Figures read meanwhile are
    /// consistent with each other. Writers that need GC to make room wait
    /// too, so do not write from the thread holding the guard on a full store.
    pub fn pause_gc(&self) -> GcPause<'_> {
        GcPause { _guard: self.core.gc_lock.lock().unwrap_or_else(|e| e.into_inner()) }
    }

    fn stop_gc(&mut self) {
        if let Some((stop, h)) = self.checkpointer.take() {
            *stop.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
            stop.1.notify_all();
            if h.join().is_err() {
                tracing::error!("the checkpoint thread panicked");
            }
        }
        self.core.space.shutdown();
        if let Some(h) = self.gc.take() {
            if h.join().is_err() {
                tracing::error!("the GC thread panicked");
            }
        }
    }

    /// Run the GC work due now on this thread: one reclaim, if free space
    /// is below GC's watermark or a writer asked for room; whether it ran
    /// one. For [`crate::Background::Manual`], where no GC thread runs (a
    /// simulation calls it at chosen points).
    pub fn gc_step(&self) -> bool {
        crate::gc::poll(&self.core)
    }

    /// Write an index checkpoint now (writers go on meanwhile). Recovery
    /// then loads it and replays only the log written since.
    pub fn checkpoint(&self) -> Result<crate::checkpoint::CheckpointStats> {
        crate::checkpoint::write(&self.core, false)
    }

    /// Stop GC, write a clean checkpoint (unless disabled in the open
    /// options), flush and close. Callers must have finished their
    /// operations (`close` takes the store by value, so none can start).
    /// Dropping a store without calling this is a crash as far as the
    /// device is concerned, which recovery handles.
    pub fn close(mut self) -> Result<()> {
        self.stop_gc();
        // A checkpoint that cannot be written (no free segment, IO error)
        // is logged by `write`; the next open replays more log instead.
        let ckpt = if self.checkpoint_on_close && self.core.check_writable().is_ok() {
            crate::checkpoint::write(&self.core, true).map(|_| ())
        } else {
            Ok(())
        };
        self.core.dev.flush().map_err(|source| Error::Io { op: "flush", offset: 0, source })?;
        match ckpt {
            Err(e @ Error::Io { .. }) => Err(e),
            _ => Ok(()),
        }
    }
}

/// The background checkpoint thread: a checkpoint every `every` while the
/// store changes, until told to stop.
fn checkpoint_loop(core: &Core, stop: &StopSignal, every: std::time::Duration) {
    let mut stopped = stop.0.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let deadline = std::time::Instant::now() + every;
        while !*stopped {
            let now = std::time::Instant::now();
            if now >= deadline {
                break;
            }
            stopped = stop.1.wait_timeout(stopped, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        if *stopped {
            return;
        }
        drop(stopped);
        if core.check_writable().is_ok() && crate::checkpoint::stale(core) {
            // Failures are logged and counted; the next round tries again.
            let _ = crate::checkpoint::write(core, false);
        }
        stopped = stop.0.lock().unwrap_or_else(|e| e.into_inner());
    }
}

/// GC is paused while this lives (see [`Store::pause_gc`]).
pub struct GcPause<'a> {
    _guard: MutexGuard<'a, ()>,
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop_gc();
    }
}
