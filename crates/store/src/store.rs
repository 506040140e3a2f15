//! The store handle and the engine state.
//!
//! [`Store`] owns the engine state ([`Core`], shared with the background
//! threads) and those threads. `Core` is the engine's shared parts (log,
//! space, keys, counters; [`Parts`]) plus the write path's and the
//! background work's own state; GC, checkpoints, recovery and `verify`
//! are given the parts they work on, never `Core`. `Core`'s methods are
//! split by role: `open` creates and opens a store, `read` is the read
//! path, `write` the write path; here are the state itself, the key checks
//! both paths share, the figures and `verify`, and the [`Store`] API over
//! all of it.
//!
//! The paths are written once, as async functions: on a `granary-rt`
//! executor with the io_uring backend their device operations go to the
//! executor's ring and other tasks run meanwhile; the synchronous API runs
//! the same functions with [`granary_rt::block_on`], where the device
//! answers at once and only a contended stripe lock or a wait for space
//! parks the thread. Both are generated from one declaration per call
//! (`engine_calls!`). Stripe locks are async-aware (`async_lock`), so a task
//! waiting for one yields its executor instead of blocking it. Do not call
//! the synchronous API from an executor thread: it would block that
//! executor until the call completes.

use crate::access::{Clock0, ItemAccess};
use crate::checkpoint::Checkpoints;
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::gc::{Gc, GcCounters};
use crate::keys::Keys;
use crate::log::Log;
use crate::namespace::{NamespaceKind, NamespaceMode, NamespaceOptions, NamespaceStats, Namespaces, NsRef, NsState};
use crate::nskey::{stored_key, DEFAULT_NS, NS_KEY_OVERHEAD};
use crate::options::ProgressHook;
use crate::parts::Parts;
use crate::space::Space;
use crate::types::{
    Change, Cond, GcPause, Item, ItemMeta, PutMode, PutOutcome, RecoveryReport, ScanPage, Stats, RESERVED_KEY_PREFIX,
};
use crate::verify::VerifyReport;
use crate::zerocopy::{PutBuf, ValueBuf};
use granary_format::limits::*;
use granary_format::record::RecordHeader;
use granary_format::Superblock;
use granary_index::Entry;
use granary_io::AlignedBuf;
use granary_rt::block_on;
use std::borrow::Cow;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

pub(crate) use crate::nskey::FLUSH_FLOOR_KEY;

/// The current version of a key found on the device.
pub(crate) struct Found {
    pub entry: Entry,
    pub hdr: RecordHeader,
    pub buf: AlignedBuf,
    /// The head through whose link the version was found: a blind
    /// overwrite of another key displaced it from the index.
    pub via: Option<u64>,
}

/// Tells the checkpoint thread to stop: a flag and its condvar.
pub(crate) type StopSignal = (Mutex<bool>, Condvar);

/// An open store. Share it between threads by reference or `Arc`.
pub struct Store {
    pub(crate) core: Arc<Core>,
    pub(crate) gc: Option<JoinHandle<()>>,
    pub(crate) checkpointer: Option<(Arc<StopSignal>, JoinHandle<()>)>,
    pub(crate) checkpoint_on_close: bool,
}

/// The engine state, shared by the store's users and its background
/// threads: the shared parts (log, space, keys, counters: what GC,
/// checkpoints and recovery work on, see [`Parts`]) and the state of the
/// write path and of the background work.
pub(crate) struct Core {
    pub(crate) log: Log,
    pub(crate) space: Space,
    pub(crate) keys: Keys,
    pub(crate) counters: Counters,
    pub(crate) recovery: Mutex<RecoveryReport>,
    pub(crate) gc_counters: GcCounters,
    /// Held by GC while it reclaims a segment and by `verify` throughout,
    /// so verify never sees records move under it.
    pub(crate) gc_lock: Mutex<()>,
    /// Held by [`Store::settle_links`]: one settling of every link at a
    /// time (each takes up to 16 threads of reads; a second would read
    /// the same links again).
    pub(crate) settling: Mutex<()>,
    pub(crate) checkpoints: Checkpoints,
    pub(crate) clock: crate::options::Clock,
    /// Cache mode (see [`OpenOptions::evict`](crate::OpenOptions::evict)).
    pub(crate) evict: bool,
    /// [`crate::Background::Manual`]: no GC thread; writers run GC
    /// themselves when they need room, and internal pools use one thread.
    pub(crate) manual: bool,
    /// Serialises `flush_all`s, so the floor stored last is the highest.
    pub(crate) flush_lock: async_lock::Mutex<()>,
    /// Group commit of user writes
    /// ([`OpenOptions::coalesce_writes`](crate::OpenOptions::coalesce_writes)).
    pub(crate) coalesce: bool,
    /// Access words kept
    /// ([`OpenOptions::track_access`](crate::OpenOptions::track_access)),
    /// relative to the open.
    pub(crate) track_access: bool,
    pub(crate) access_clock: Clock0,
    pub(crate) coalescer: crate::coalesce::Coalescer,
    /// The namespaces ([`crate::namespace`]).
    pub(crate) namespaces: Namespaces,
    /// Set when the store is closed or dropped: a [`Namespace`] handle
    /// that outlives it refuses calls.
    pub(crate) closed: AtomicBool,
    /// This engine, as the `Arc` its store holds (set once it is shared):
    /// for work that must outlive the future that started it.
    pub(crate) me: std::sync::OnceLock<std::sync::Weak<Core>>,
    /// Such work still running ([`crate::detach`]).
    pub(crate) detached: crate::detach::Detached,
}

/// The engine's calls that do IO, each declared once: the declaration
/// `fn name / name_async(&self, args) -> R = core_fn;` makes the blocking
/// method `name`, which runs `Core::core_fn`'s future to completion on this
/// thread (never call it on an executor: it blocks it), and the async one
/// `name_async`, for executors (with the io_uring backend its IO goes
/// through the executor's ring). The engine itself is written once, async.
///
/// Each call is made twice: on [`Store`], in the default namespace, and on
/// [`Namespace`], in that namespace.
macro_rules! engine_calls {
    ($(
        $(#[doc = $doc:expr])*
        fn $name:ident / $name_async:ident $(<$g:ident>)? (&self $(, $arg:ident : $ty:ty)* $(,)?) -> $ret:ty = $call:ident;
    )*) => {
        impl Store {
            $(
                $(#[doc = $doc])*
                #[doc = ""]
                #[doc = "In the default namespace."]
                pub fn $name $(<$g>)? (&self $(, $arg: $ty)*) -> $ret {
                    block_on(self.core.$call(&self.core.namespaces.default, $($arg),*))
                }

                #[doc = concat!("[`Store::", stringify!($name), "`] as a future.")]
                pub async fn $name_async $(<$g>)? (&self $(, $arg: $ty)*) -> $ret {
                    self.core.$call(&self.core.namespaces.default, $($arg),*).await
                }
            )*
        }

        impl Namespace {
            $(
                $(#[doc = $doc])*
                #[doc = ""]
                #[doc = "In this namespace."]
                pub fn $name $(<$g>)? (&self $(, $arg: $ty)*) -> $ret {
                    self.check_open()?;
                    block_on(self.core.$call(&self.state, $($arg),*))
                }

                #[doc = concat!("[`Namespace::", stringify!($name), "`] as a future.")]
                pub async fn $name_async $(<$g>)? (&self $(, $arg: $ty)*) -> $ret {
                    self.check_open()?;
                    self.core.$call(&self.state, $($arg),*).await
                }
            )*
        }
    };
}

impl crate::detach::Shared for Core {
    fn shared(&self) -> Option<Arc<Core>> {
        self.me.get().and_then(std::sync::Weak::upgrade)
    }

    fn detached(&self) -> &crate::detach::Detached {
        &self.detached
    }
}

impl crate::coalesce::WriteEngine for Core {
    fn coalescer(&self) -> &crate::coalesce::Coalescer {
        &self.coalescer
    }

    fn space(&self) -> &crate::space::Space {
        &self.space
    }

    fn device(&self) -> &dyn granary_io::Device {
        self.log.dev.as_ref()
    }

    fn durability(&self) -> crate::options::Durability {
        self.log.durability
    }

    fn poison(&self, err: Error) {
        self.log.poison(err);
    }
}

impl Core {
    /// A user's key in `ns`, checked, in the form it is stored in, and the
    /// counters of `ns`'s current id.
    pub(crate) fn scoped<'k, 'n>(&self, ns: &'n NsState, key: &'k [u8]) -> Result<(Cow<'k, [u8]>, NsRef<'n>)> {
        let (id, c) = ns.current_ref()?;
        ns.check_block_key(key)?;
        Ok((self.stored_as(id, key)?, c))
    }

    /// The stored form of user key `key` in the namespace of id `id`.
    pub(crate) fn stored_as<'k>(&self, id: u32, key: &'k [u8]) -> Result<Cow<'k, [u8]>> {
        if id == DEFAULT_NS {
            Self::check_user_key(key)?;
            return Ok(Cow::Borrowed(key));
        }
        let stored = stored_key(id, key);
        if key.is_empty() || stored.len() > KEY_BYTES_MAX {
            let max = KEY_BYTES_MAX - NS_KEY_OVERHEAD;
            return Err(Error::KeyLength { len: key.len(), min: KEY_BYTES_MIN, max });
        }
        Ok(Cow::Owned(stored))
    }

    /// The bytes a read of `key`'s record will hold, from the index alone
    /// (no IO): its largest candidate's size, 0 without one. A hint (a
    /// candidate may be another key's, and the key may change before a
    /// read), for callers that bound the reads they keep in flight.
    pub(crate) fn size_hint(&self, ns: &NsState, key: &[u8]) -> Result<u64> {
        let (key, _) = self.scoped(ns, key)?;
        let h = self.keys.hash(&key);
        let grains = self.keys.index.lookup(h).as_slice().iter().map(|e| e.kv_size()).max().unwrap_or(0);
        if grains == KV_SIZE_GRAINS_MAX {
            // Too large for the entry's size field: at most a segment.
            return Ok(self.log.sb.segment_grains() * self.log.grain());
        }
        Ok(grains as u64 * self.log.grain())
    }

    /// Largest value this store accepts with a key of `key_len` bytes.
    pub fn value_bytes_max(&self, key_len: usize) -> u64 {
        crate::options::value_bytes_max_for(self.log.sb.segment_bytes, self.log.sb.grain_bytes, key_len)
    }

    fn check_key(key: &[u8]) -> Result<()> {
        if !(KEY_BYTES_MIN..=KEY_BYTES_MAX).contains(&key.len()) {
            return Err(Error::KeyLength { len: key.len(), min: KEY_BYTES_MIN, max: KEY_BYTES_MAX });
        }
        Ok(())
    }

    /// A user's key: in length and outside the reserved namespace.
    pub(crate) fn check_user_key(key: &[u8]) -> Result<()> {
        Self::check_key(key)?;
        if key.starts_with(RESERVED_KEY_PREFIX) {
            return Err(Error::ReservedKey);
        }
        Ok(())
    }

    /// The shared parts, for GC, checkpoints, recovery and link settling.
    pub(crate) fn parts(&self) -> Parts<'_> {
        Parts { log: &self.log, space: &self.space, keys: &self.keys, counters: &self.counters, manual: self.manual }
    }

    /// GC's handles.
    pub(crate) fn collector(&self) -> Gc<'_> {
        Gc { parts: self.parts(), stats: &self.gc_counters, lock: &self.gc_lock, clock: &self.clock, evict: self.evict }
    }

    /// Write a checkpoint of the index now (see [`Checkpoints::write`]).
    ///
    /// Zoned mode writes them only where the device allows one more open
    /// zone than the segment streams need ([`Space::checkpoints_refused`]).
    ///
    /// [`Space::checkpoints_refused`]: crate::space::Space::checkpoints_refused
    pub(crate) fn write_checkpoint(&self, clean: bool) -> Result<crate::types::CheckpointStats> {
        if let Some(why) = self.space.checkpoints_refused() {
            return Err(Error::InvalidOptions(why));
        }
        self.checkpoints.write(self.parts(), &self.clock, clean)
    }

    /// Figures of the store now.
    pub fn stats(&self) -> Stats {
        let (free, open, closed, index_segs) = self.space.counts();
        let links = self.keys.links.usage();
        let (room_waits, room_wait_us) = self.space.room_waits();
        let c = &self.counters;
        Stats {
            device: self.log.dev.describe(),
            device_bytes: self.log.sb.device_bytes,
            grain_bytes: self.log.sb.grain_bytes,
            segment_bytes: self.log.sb.segment_bytes,
            segments: self.log.sb.segment_count,
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
            next_seq: self.log.next_seq.load(Relaxed),
            io: self.log.dev.counters().snapshot(),
            index: self.keys.index.stats(),
            recovery: self.recovery.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            value_bytes_max: self.value_bytes_max(1),
            gc: self.gc_counters.snapshot(),
            segments_opened: self.space.horizon(),
            short_segments_opened: self.space.short_segments_opened(),
            summaries_written: self.space.summaries_written().0,
            summary_bytes_written: self.space.summaries_written().1,
            room_waits,
            room_wait_us,
            gc_watermarks: self.space.watermarks(),
            gc_rates: self.space.rates(),
            gc_settings: self.space.settings(),
            checkpoints: self.checkpoints.stats(),
            session: self.checkpoints.session,
            write_groups: self.coalescer.groups.load(Relaxed),
            grouped_records: self.coalescer.records.load(Relaxed),
            combined_puts: self.keys.combine.combined.load(Relaxed),
            combined_updates: self.keys.combine.combined_updates.load(Relaxed),
            blind_overwrites: c.blind.load(Relaxed),
            unsettled_links: links.0,
            link_bytes: links.1,
            dram: self.keys.tier.as_ref().map(|t| t.stats()).unwrap_or_default(),
            read_only: self.log.poisoned(),
        }
    }

    /// Check every index entry against its record and scan every segment.
    /// GC waits meanwhile, and checkpoints while it reads the newest.
    pub fn verify(&self, progress: Option<&crate::options::ProgressHook>) -> Result<VerifyReport> {
        let _no_gc = self.gc_lock.lock().unwrap_or_else(|e| e.into_inner());
        crate::verify::verify(self.parts(), &self.checkpoints, progress)
    }
}

engine_calls! {
    /// The value of `key`, or None if absent or deleted.
    fn get / get_async(&self, key: &[u8]) -> Result<Option<Vec<u8>>> = get;

    /// Insert or overwrite.
    fn put / put_async(&self, key: &[u8], value: &[u8]) -> Result<()> = put;

    /// Unconditional PUTs of distinct keys, sharing device writes
    /// ([`crate::run`]); not atomic.
    fn put_many / put_many_async(&self, items: &[(&[u8], &[u8])]) -> Result<()> = put_many;

    /// GETs sharing device reads ([`crate::run`]): `each(i, value)` for
    /// every `keys[i]` that holds a value, in no particular order.
    fn get_many / get_many_async(&self, keys: &[&[u8]], each: impl FnMut(usize, &[u8])) -> Result<()> = get_many;

    /// PUT with a mode; returns whether it stored.
    fn put_with / put_with_async(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<PutOutcome> = put_with;

    /// Delete `key`; returns whether it was present.
    fn delete / delete_async(&self, key: &[u8]) -> Result<bool> = delete;

    /// The value of `key` with its metadata and CAS value; None if absent,
    /// deleted or expired.
    fn get_item / get_item_async(&self, key: &[u8]) -> Result<Option<Item>> = get_item;

    /// The item of `key` with its access state before this read (memcache
    /// `h`, `l`, win token); see [`crate::OpenOptions::track_access`]. The
    /// read marks the item read, and in cache mode its segment recently
    /// used, unless `!bump` (memcache's `u`); it is handed the item's win
    /// token (`won`) when `want_win(item)` holds and no earlier reader had
    /// it.
    fn get_item_access / get_item_access_async(
        &self,
        key: &[u8],
        bump: bool,
        want_win: impl Fn(&Item) -> bool,
    ) -> Result<Option<ItemAccess>> = get_item_access;

    /// [`Store::get_item_access`] and a touch of the item found (its new
    /// expiry `expires`, and the CAS value `new_cas` when given, else its
    /// own), under the key's lock: no write of the key comes between the
    /// two (memcache's `mg ... T`). The item returned is the one touched.
    fn touch_item_access / touch_item_access_async(
        &self,
        key: &[u8],
        bump: bool,
        want_win: impl Fn(&Item) -> bool + Send + Sync,
        expires: u32,
        new_cas: Option<u64>,
    ) -> Result<Option<ItemAccess>> = touch_item_access;

    /// The item of `key` with its access state, for an inspection (a key
    /// dump, memcache `me`): not counted as a GET, not touching what cache
    /// eviction follows, not offered to the DRAM tier, and marking nothing.
    fn peek_item_access / peek_item_access_async(&self, key: &[u8]) -> Result<Option<ItemAccess>> = peek_item_access;

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
    /// not filled are zeros). A buffer made for this namespace before a
    /// truncate is written into it as it is now; one made by another store
    /// is refused (`InvalidOptions`), one made for another namespace (a
    /// dropped one too) with `NoSuchNamespace`.
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

    /// A page of the keys (Redis SCAN, KEYS): `cursor` 0 starts a scan,
    /// each page's cursor continues it, and a page whose cursor is 0 ends
    /// it; `count` is how many keys a page aims for. Every key present for
    /// the whole scan is returned (at most once), each key returned was live
    /// when checked, and a page's keys are distinct; GC, index growth and
    /// writers may run meanwhile. The cursor is a home slot of the index
    /// (`scan.rs`); one past the last home slot, which no page gives,
    /// returns an empty page with cursor 0.
    fn scan / scan_async(&self, cursor: u64, count: usize) -> Result<ScanPage> = scan;

    /// A live key (Redis RANDOMKEY): the first found walking the index from
    /// a place picked by `seed`, wrapping around; None when there is none.
    fn random_key / random_key_async(&self, seed: u64) -> Result<Option<Vec<u8>>> = random_key;

    /// Hide every value written so far, persistently (memcache
    /// `flush_all`): in the default namespace by a floor of sequence
    /// numbers (returned); in another namespace by truncating it (its new
    /// id is returned).
    fn flush_all / flush_all_async(&self) -> Result<u64> = flush_all;
}

impl Store {
    /// Create namespace `name` ([`crate::namespace`]): durable when this
    /// returns. The first one turns on the store's namespaces flag (a
    /// build older than namespaces then refuses the store).
    pub fn create_namespace(&self, name: &str, options: NamespaceOptions) -> Result<Namespace> {
        block_on(self.create_namespace_async(name, options))
    }

    /// [`Store::create_namespace`] as a future (for executors: the
    /// blocking call would block one).
    pub async fn create_namespace_async(&self, name: &str, options: NamespaceOptions) -> Result<Namespace> {
        let state = self.core.create_namespace(name, options).await?;
        Ok(Namespace { core: self.core.clone(), state })
    }

    /// A handle on namespace `name` (`"default"`: the keys of the plain
    /// [`Store`] calls). Cheap; it works until the store is closed.
    pub fn namespace(&self, name: &str) -> Result<Namespace> {
        Ok(Namespace { core: self.core.clone(), state: self.core.namespaces.get(name)? })
    }

    /// Every namespace (the default one first) with its figures.
    pub fn namespaces(&self) -> Vec<NamespaceStats> {
        let mut all: Vec<NamespaceStats> = self.core.namespaces.all().iter().filter_map(|s| s.stats().ok()).collect();
        all.sort_by_key(|s| (s.id != DEFAULT_NS, s.name.clone()));
        all
    }

    /// Drop namespace `name`, in O(1): one catalog record is written, its
    /// keys read as gone at once (handles on it fail with
    /// `NoSuchNamespace`), and GC frees their space as it meets them. A
    /// namespace created later with the same name is empty.
    pub fn drop_namespace(&self, name: &str) -> Result<()> {
        block_on(self.core.drop_namespace(name, None))
    }

    /// [`Store::drop_namespace`] as a future.
    pub async fn drop_namespace_async(&self, name: &str) -> Result<()> {
        self.core.drop_namespace(name, None).await
    }

    /// Empty namespace `name`, in O(1) like a drop, keeping it and its
    /// options (the default namespace: `flush_all`).
    pub fn truncate(&self, name: &str) -> Result<()> {
        block_on(self.core.truncate_namespace(name, None)).map(|_| ())
    }

    /// Create export `name`: a namespace of kind
    /// [`NamespaceKind::Block`], a block device of `size_bytes` in blocks
    /// of `block_bytes` (block `n` under [`crate::block::block_key`]`(n)`),
    /// mode `store`, no quota, no default TTL. Refused (`BadNamespace`)
    /// unless the block size is a power of two from 512 to 65536 that one
    /// value of this store holds, and the size a positive multiple of it of
    /// at most 2^63 ([`crate::namespace::check_options`]). Dropped and
    /// truncated as any namespace.
    pub fn create_export(&self, name: &str, size_bytes: u64, block_bytes: u32) -> Result<Namespace> {
        block_on(self.create_export_async(name, size_bytes, block_bytes))
    }

    /// [`Store::create_export`] as a future.
    pub async fn create_export_async(&self, name: &str, size_bytes: u64, block_bytes: u32) -> Result<Namespace> {
        let options = NamespaceOptions {
            mode: NamespaceMode::Store,
            kind: NamespaceKind::Block { size_bytes, block_bytes },
            ..Default::default()
        };
        self.create_namespace_async(name, options).await
    }

    /// The exports (the namespaces of kind [`NamespaceKind::Block`]) with
    /// their figures, by name.
    pub fn exports(&self) -> Vec<NamespaceStats> {
        self.namespaces().into_iter().filter(|s| s.options.kind.is_block()).collect()
    }

    /// The durability barrier: when it returns Ok, every write acknowledged
    /// before the call (in any namespace, by any thread) survives a power
    /// loss, whatever the durability mode: one flush of the device
    /// (fdatasync of a file or block device), which covers every write that
    /// has completed, and an acknowledged write has. It stays durable: GC
    /// never frees the segment of a record it moved before the copy is
    /// flushed (`Space::free_segment`). It is what a block server's FLUSH
    /// or a database's commit needs in `Direct` mode, where writes are not
    /// flushed one by one.
    ///
    /// A failed flush poisons the store, as a failed write does (the device
    /// may have dropped writes it had acknowledged, so later writes and
    /// syncs are refused until the store is reopened and recovered); a
    /// sync of a store already poisoned returns `Poisoned`, since a flush
    /// succeeding after a failure does not make the failed writes durable.
    pub fn sync(&self) -> Result<()> {
        self.core.sync()
    }

    /// [`Store::sync`] as a future. On an executor with the io_uring
    /// backend the flush goes through its ring, as group commit's flushes
    /// do in `Flush` mode: the executor serves its other tasks meanwhile.
    pub async fn sync_async(&self) -> Result<()> {
        self.core.sync_async().await
    }
}

/// A handle on one namespace of a store ([`Store::namespace`],
/// [`Store::create_namespace`]): the store's calls, on that namespace's
/// keys. Cloned cheaply and sent between threads; calls fail with
/// [`Error::NoSuchNamespace`] once the namespace is dropped, and with
/// [`Error::Closed`] once the store is closed. A truncate does not
/// invalidate it.
#[derive(Clone)]
pub struct Namespace {
    core: Arc<Core>,
    pub(crate) state: Arc<NsState>,
}

impl Namespace {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// Whether it is a namespace of the store `core` runs.
    pub(crate) fn is_of(&self, core: &Arc<Core>) -> bool {
        Arc::ptr_eq(&self.core, core)
    }

    /// Its options.
    pub fn options(&self) -> NamespaceOptions {
        self.state.options
    }

    /// Unix seconds by its store's clock (the one expiry is judged by).
    pub fn now(&self) -> u32 {
        self.core.clock.now()
    }

    /// Its kind: a key space, or an export and its geometry.
    pub fn kind(&self) -> NamespaceKind {
        self.state.options.kind
    }

    pub(crate) fn state(&self) -> Arc<NsState> {
        self.state.clone()
    }

    /// Its figures now.
    pub fn stats(&self) -> Result<NamespaceStats> {
        self.check_open()?;
        self.state.stats()
    }

    /// Drop its namespace ([`Store::drop_namespace`]); `NoSuchNamespace`
    /// if it was dropped already, even when a namespace of its name was
    /// created since (that one is left alone).
    pub fn drop_namespace(&self) -> Result<()> {
        self.check_open()?;
        block_on(self.core.drop_namespace(&self.state.name, Some(&self.state)))
    }

    /// Empty its namespace ([`Store::truncate`]; the handle stays valid),
    /// with [`Namespace::drop_namespace`]'s check.
    pub fn truncate(&self) -> Result<()> {
        self.check_open()?;
        block_on(self.core.truncate_namespace(&self.state.name, Some(&self.state))).map(|_| ())
    }

    /// Whether its namespace was dropped (its calls fail with
    /// `NoSuchNamespace`; a namespace created since under the same name is
    /// another one: [`Store::namespace`] gives a handle on it).
    pub fn is_dropped(&self) -> bool {
        self.state.is_dropped()
    }

    /// Whether its store was closed (its calls fail with `Closed`).
    pub fn is_closed(&self) -> bool {
        self.check_open().is_err()
    }

    /// Hand `f` each of its keys whose values the DRAM tier holds, with
    /// its item's value length and expiry time (0: none), in no particular
    /// order, until `f` returns false; none with the tier off. Not counted
    /// as reads. Items expired or flushed, and items no longer current (a
    /// GET would drop them: their key was written, deleted or evicted since)
    /// are left out; a key written meanwhile may come or not. `f` runs
    /// under a tier shard's read lock, which writers of that shard wait
    /// for: it must be quick, and must not call the store (a GET of a key
    /// of the same shard could wait for that lock).
    pub fn visit_dram(&self, mut f: impl FnMut(&[u8], usize, u32) -> bool) -> Result<()> {
        let (id, _) = self.state.current_ref()?;
        let Some(tier) = &self.core.keys.tier else { return Ok(()) };
        let now = self.core.clock.now();
        tier.visit(|hot| {
            let mine = crate::nskey::owner(&hot.key) == crate::nskey::Owner::Ns(id);
            if !mine
                || self.core.log.hidden_at(hot.seq, hot.meta.expires, &hot.key, now)
                || !self.core.is_current(self.core.keys.hash(&hot.key), hot.pba, hot.stamp)
            {
                return true;
            }
            f(crate::nskey::user_key(id, &hot.key), hot.value.len(), hot.meta.expires)
        });
        Ok(())
    }

    /// [`Store::value_size_hint`] for a key of this namespace.
    pub fn value_size_hint(&self, key: &[u8]) -> Result<u64> {
        self.check_open()?;
        self.core.size_hint(&self.state, key)
    }

    /// Largest value it accepts with a key of `key_len` bytes.
    pub fn value_bytes_max(&self, key_len: usize) -> u64 {
        let overhead = match self.state.current() {
            Ok((DEFAULT_NS, _)) => 0,
            _ => NS_KEY_OVERHEAD,
        };
        self.core.value_bytes_max(key_len.saturating_add(overhead))
    }

    /// [`Store::new_put_buf`] for a key of this namespace.
    pub fn new_put_buf(&self, key: &[u8], value_len: usize) -> Result<PutBuf> {
        self.check_open()?;
        self.core.new_put_buf(&self.state, key, value_len)
    }

    fn check_open(&self) -> Result<()> {
        match self.core.closed.load(Relaxed) {
            true => Err(Error::Closed),
            false => Ok(()),
        }
    }
}

/// Read-modify-writes, made by hand: the async form's bound on `f`
/// differs from the blocking one's (see [`Store::update_async`]).
macro_rules! update_calls {
    ($t:ty, $ns:ident, $what:literal, $check:ident) => {
        impl $t {
            #[doc = concat!("Read-modify-write of one key ", $what, " (append, increment, touch,")]
            /// delete by CAS...): `f` sees the current item and decides;
            /// see [`Change`]. Returns `f`'s answer and the new CAS value
            /// if a value was written.
            ///
            /// `f` may run more than once, and on another thread: a write
            /// of the same key that this one queued behind may call it, to
            /// carry its change in its own record (so `f` and its answer
            /// are `Send`). It runs under the key's lock: it must be quick,
            /// must not wait for a lock its caller may hold, and must not
            /// call the store.
            pub fn update<R: Send>(
                &self,
                key: &[u8],
                f: impl FnMut(Option<&Item>) -> (Change, R) + Send,
            ) -> Result<(R, Option<u64>)> {
                $check(self)?;
                // SAFETY: block_on pins the future on this thread and drops
                // it before it returns (or while unwinding): it is never
                // leaked, so nothing `f` borrows goes away while it waits.
                block_on(unsafe { self.core.update($ns(self), key, f) })
            }

            #[doc = concat!("[`", stringify!($t), "::update`] as a future; `f` owns what it uses")]
            /// (`'static`): a write on another thread may call it while
            /// this future waits, and a future may be leaked
            /// (`mem::forget`) rather than dropped, so `f` must not borrow
            /// what could go away meanwhile. For a function that borrows,
            #[doc = concat!("[`", stringify!($t), "::update_borrowing_async`].")]
            ///
            /// ```
            /// # use granary_store::{Change, Store};
            /// # async fn f(s: &Store) {
            /// let add = 5u64; // moved in
            /// let _ = s.update_async(b"k", move |_| (Change::Keep, add)).await;
            /// # }
            /// ```
            ///
            /// A function that borrows is refused:
            ///
            /// ```compile_fail
            /// # use granary_store::{Change, Store};
            /// # async fn f(s: &Store) {
            /// let add = vec![5u64];
            /// let borrowed = &add;
            /// let _ = s.update_async(b"k", move |_| (Change::Keep, borrowed[0])).await;
            /// # }
            /// ```
            pub async fn update_async<R: Send>(
                &self,
                key: &[u8],
                f: impl FnMut(Option<&Item>) -> (Change, R) + Send + 'static,
            ) -> Result<(R, Option<u64>)> {
                $check(self)?;
                // SAFETY: `f` borrows nothing; it and the slot of its answer
                // live in this future, which, once polled, is pinned: leaked,
                // its memory stays allocated (Pin's drop guarantee), so a
                // later call touches only live memory.
                unsafe { self.core.update($ns(self), key, f) }.await
            }

            #[doc = concat!("[`", stringify!($t), "::update_async`] for a function that borrows.")]
            ///
            /// # Safety
            ///
            /// The future must be run to completion or dropped before
            /// anything `f` borrows goes away: never leaked (`mem::forget`,
            /// a leaked box or reference cycle) while its borrows end,
            /// because a write of the same key on another thread may call
            /// `f` while the future waits.
            pub async unsafe fn update_borrowing_async<R: Send>(
                &self,
                key: &[u8],
                f: impl FnMut(Option<&Item>) -> (Change, R) + Send,
            ) -> Result<(R, Option<u64>)> {
                $check(self)?;
                // SAFETY: forwarded to the caller.
                unsafe { self.core.update($ns(self), key, f) }.await
            }
        }
    };
}

fn default_ns(s: &Store) -> &NsState {
    &s.core.namespaces.default
}

fn ns_state(n: &Namespace) -> &NsState {
    &n.state
}

fn store_open(_: &Store) -> Result<()> {
    Ok(())
}

fn namespace_open(n: &Namespace) -> Result<()> {
    n.check_open()
}

update_calls!(Store, default_ns, "in the default namespace", store_open);
update_calls!(Namespace, ns_state, "in this namespace", namespace_open);

impl Store {
    /// A record buffer for `key` and a value of `value_len` bytes, the
    /// buffer the device will write: fill its value (directly, or by
    /// receiving into it), then write it with [`Store::put_buf`]. Fails
    /// for a bad key or a value larger than the store holds.
    pub fn new_put_buf(&self, key: &[u8], value_len: usize) -> Result<PutBuf> {
        self.core.new_put_buf(&self.core.namespaces.default, key, value_len)
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
        &self.core.log.sb
    }

    /// Largest value this store accepts with a key of `key_len` bytes.
    pub fn value_bytes_max(&self, key_len: usize) -> u64 {
        self.core.value_bytes_max(key_len)
    }

    /// The bytes a read of `key`'s record will hold in DRAM (key, value and
    /// header, in whole grains), from the index alone: no device IO, 0 when
    /// the index has no entry that may be the key's. A hint, not a promise
    /// (another key's entry may share its fingerprint; a write may change
    /// it before a read): servers use it to bound the reads one request
    /// keeps in flight. In the default namespace.
    pub fn value_size_hint(&self, key: &[u8]) -> Result<u64> {
        self.core.size_hint(&self.core.namespaces.default, key)
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
        self.core.closed.store(true, Relaxed);
        // Writes whose callers dropped them midway end first
        // ([`crate::detach`]); an executor thread (even in a `block_on`)
        // cannot wait for those handed to it, which run on after.
        if granary_rt::current_core().is_none() {
            self.core.detached.wait_idle();
        }
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
        crate::gc::poll(self.core.collector())
    }

    /// Whether blind overwrites have left links not yet settled: until
    /// they are, a key that collided with another key's fingerprint is
    /// missing from the key counts (store-wide and its namespace's), which
    /// counted its write as an overwrite ([`crate::links`]).
    pub fn has_unsettled_links(&self) -> bool {
        !self.core.keys.links.is_empty()
    }

    /// Settle every link blind overwrites left, by reading the records
    /// they displaced, so that the key counts are exact; returns how many
    /// were other keys' (counted again). Blocking, with threads of its
    /// own: never call it on an executor (it takes key locks that
    /// executor tasks hold across IO). One runs at a time: a call made
    /// while another runs waits for it, then settles what is left.
    pub fn settle_links(&self) -> Result<u64> {
        let _one = self.core.settling.lock().unwrap_or_else(|e| e.into_inner());
        crate::settle::resolve_all(self.core.parts()).map(|r| r.live)
    }

    /// Write an index checkpoint now (writers go on meanwhile). Recovery
    /// then loads it and replays only the log written since. In zoned mode
    /// `InvalidOptions` where the device allows no open and active zone
    /// beyond two per segment stream (docs/ARCHITECTURE.md, "Zoned mode").
    pub fn checkpoint(&self) -> Result<crate::types::CheckpointStats> {
        self.core.write_checkpoint(false)
    }

    /// Stop GC, write a clean checkpoint (unless disabled in the open
    /// options), flush and close. Callers must have finished their
    /// operations (`close` takes the store by value, so none can start;
    /// a [`Namespace`] handle's calls still running must end or be dropped
    /// first). Writes whose futures were dropped midway end first
    /// (docs/ARCHITECTURE.md, "Writes whose futures are dropped"), except
    /// on an executor's thread. Dropping a store without calling this is a
    /// crash as far as the device is concerned, which recovery handles.
    /// Either way the device's lock is let go ([`granary_io::Device::release`];
    /// not on an executor's thread) even while handles remain.
    pub fn close(mut self) -> Result<()> {
        self.stop_gc();
        // A checkpoint that cannot be written (no free segment, IO error)
        // is logged by `write`; the next open replays more log instead.
        // With no free segment, GC (stopped now) reclaims one or two here
        // and the checkpoint is tried once more.
        let mut ckpt = self.close_checkpoint();
        if matches!(ckpt, Err(Error::NoSpace { .. })) {
            self.core.space.writes_after_gc();
            if crate::gc::reclaim_at_close(self.core.collector(), 2) > 0 {
                ckpt = self.close_checkpoint();
            }
        }
        self.core.log.dev.flush().map_err(|source| Error::Io { op: "flush", offset: 0, source })?;
        match ckpt {
            Err(e @ Error::Io { .. }) => Err(e),
            _ => Ok(()),
        }
    }

    /// The clean checkpoint `close` writes (with the namespaces' totals
    /// first), unless disabled or the store refuses writes.
    fn close_checkpoint(&self) -> Result<()> {
        if self.checkpoint_on_close
            && self.core.log.check_writable().is_ok()
            && self.core.space.checkpoints_refused().is_none()
        {
            // Every namespace's counts, for the open that loads this
            // checkpoint (`catalog::restore_totals`); without them the
            // next open of a store with namespaces scans the log.
            let totals = match self.core.has_feature(granary_format::superblock::FLAG_NAMESPACES) {
                true => {
                    // Nothing else writes now: GC has stopped, handles
                    // refuse calls, and `close` owns the store.
                    self.core.space.writes_after_gc();
                    // Settle blind overwrites' links first: a displaced
                    // record of another key counts that key again in its
                    // namespace, which the totals must include (the
                    // checkpoint would settle them only after).
                    crate::settle::resolve_all(self.core.parts())
                        .and_then(|_| block_on(self.core.note_sweep_done()))
                        .and_then(|()| block_on(self.core.write_totals()))
                }
                false => Ok(()),
            };
            match totals {
                Ok(()) => self.core.write_checkpoint(true).map(|_| ()),
                Err(e) => Err(e),
            }
        } else {
            Ok(())
        }
    }
}

impl Drop for Store {
    /// After `close` (or in place of it: a crash as far as the device is
    /// concerned), another open of the device may begin even while
    /// [`Namespace`] handles keep this store's memory: their calls fail
    /// with `Closed`. On an executor's thread writes handed to it may
    /// still run (`stop_gc`), so the device stays held there.
    fn drop(&mut self) {
        self.stop_gc();
        if granary_rt::current_core().is_none() {
            self.core.log.dev.release();
        }
    }
}
