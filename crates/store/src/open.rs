//! Creating and opening a store: the geometry of a new store and its
//! superblock copies, reading them back on open, building the engine state
//! ([`Core`]), rebuilding its index (`recover`), and starting the background
//! threads: GC (`gc::run`) and the checkpoint thread, whose loop is here.
//!
//! Invariants: `create` writes every superblock copy and flushes before it
//! opens the store; `open` uses the first copy that decodes and refuses a
//! device smaller than the store or with blocks larger than its grains;
//! an open that mends what a crash left (`OpenOptions::clear_torn`) then
//! rewrites a copy that lags behind or fails its checksum from the one it
//! uses, never a copy that may be a newer build's. The
//! flush floor ([`Store::flush_all`]) is read back before the store is
//! handed out, so values flushed before a restart stay hidden. Background
//! threads run only with [`crate::Background::Threads`]; `Store::close` and
//! dropping the store stop them.

use crate::access::Clock0;
use crate::checkpoint::Checkpoints;
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::keys::Keys;
use crate::log::Log;
use crate::namespace::{NamespaceMode, Namespaces};
use crate::options::{default_index_table_homes, default_segment_bytes, CreateOptions, OpenOptions};
use crate::space::Space;
use crate::store::{Core, StopSignal, Store, FLUSH_FLOOR_KEY};
use crate::types::RecoveryReport;
use granary_format::checksum::record_seed;
use granary_format::hash::KEY_HASH_ALGO_XXH3_64_SECRET;
use granary_format::limits::*;
use granary_format::superblock::FLAG_NAMESPACES;
use granary_format::{FormatError, Superblock};
use granary_index::{Index, IndexConfig};
use granary_io::{AlignedBuf, Device, DeviceSpec, IoBackend, OpenMode};
use granary_rt::block_on;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};

impl Store {
    /// Format `dev` as a new, empty store and open it.
    pub fn create(dev: Arc<dyn Device>, opts: &CreateOptions, open: &OpenOptions) -> Result<Store> {
        dev.claim().map_err(Error::Device)?;
        let sb = Self::geometry(dev.as_ref(), opts, open)?;
        Self::check_zones(dev.as_ref(), &sb, open)?;
        crate::space::write_superblocks(dev.as_ref(), &sb)?;
        tracing::debug!(device = %dev.describe(), segments = sb.segment_count, segment_bytes = sb.segment_bytes,
            grain_bytes = sb.grain_bytes, "created store");
        Self::open(dev, open)
    }

    fn geometry(dev: &dyn Device, opts: &CreateOptions, open: &OpenOptions) -> Result<Superblock> {
        let draw = || open.entropy.draw().map_err(Error::Device);
        Self::geometry_of(dev.size_bytes(), dev.block_bytes(), opts, open, draw)
    }

    /// Refuse `opts` for a new store of `size` bytes before any file is
    /// made or filled, where [`Store::create`] would refuse them after:
    /// the same checks, for a device of 512-byte blocks (a device with
    /// larger ones may still refuse a grain at creation).
    pub(crate) fn check_geometry(size: u64, opts: &CreateOptions, open: &OpenOptions) -> Result<()> {
        Self::geometry_of(size, 512, opts, open, || Ok([0; 16])).map(|_| ())
    }

    fn geometry_of(
        size: u64,
        block_bytes: u32,
        opts: &CreateOptions,
        open: &OpenOptions,
        mut draw: impl FnMut() -> Result<[u8; 16]>,
    ) -> Result<Superblock> {
        let bad = |s: String| Err(Error::InvalidOptions(s));
        let grain = opts.grain_bytes.unwrap_or(block_bytes.max(512));
        if !GRAIN_BYTES_ALLOWED.contains(&grain) {
            return bad(format!("grain size {grain} is not one of {GRAIN_BYTES_ALLOWED:?}"));
        }
        if grain < block_bytes {
            return bad(format!("grain size {grain} is smaller than the device's {block_bytes}-byte blocks"));
        }
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
            version: granary_format::superblock::SUPERBLOCK_VERSION,
            // Feature flags are turned on with their first use
            // (`Space::enable_feature`), so a store that never used one
            // stays readable by builds without it.
            flags: 0,
            uuid: draw()?,
            grain_bytes: grain,
            // A secret seed: keys chosen to share a fingerprint cannot be
            // computed without it (docs/SECURITY.md).
            hash_algo: KEY_HASH_ALGO_XXH3_64_SECRET,
            hash_seed: u64::from_le_bytes(draw()?[..8].try_into().expect("8 bytes")),
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

    /// Whether `dev` can hold the store `sb` describes, opened with `opts`:
    /// its size, its blocks, its zones. Returns whether it runs zoned.
    pub(crate) fn check_device(dev: &dyn Device, sb: &Superblock, opts: &OpenOptions) -> Result<bool> {
        let zoned = Self::check_zones(dev, sb, opts)?;
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
        Ok(zoned)
    }

    /// Zoned mode (a zoned device, [`Device::zones`]): whether the store's
    /// geometry fits the device's zones. A segment must be one zone, the
    /// superblocks in conventional zones, and
    /// the device must allow two open (and active) zones per segment
    /// stream: a stream's closed segment stays open until its last write
    /// lands, beside the stream's next one. docs/ARCHITECTURE.md, "Zoned
    /// mode".
    fn check_zones(dev: &dyn Device, sb: &Superblock, opts: &OpenOptions) -> Result<bool> {
        let Some(z) = dev.zones() else { return Ok(false) };
        let bad = |s: String| Err(Error::InvalidOptions(format!("zoned device {}: {s}", dev.describe())));
        let first = sb.segment_offset(0);
        // One zone per segment: a write (a group, a relocation run) never
        // crosses a zone boundary, which a zoned device refuses.
        if !first.is_multiple_of(z.zone_bytes) || sb.segment_bytes != z.zone_bytes {
            return bad(format!(
                "segments of {} bytes from offset {first} are not one zone of {} bytes each",
                sb.segment_bytes, z.zone_bytes
            ));
        }
        // Both superblock copies, 4 KiB each.
        let superblocks_end = SUPERBLOCK_OFFSETS[1] + 4096;
        if z.conventional_bytes < superblocks_end || z.conventional_bytes > first {
            return bad(format!(
                "its conventional zones ({} bytes) must hold the two superblocks ({} bytes) and end by the \
                 first segment (offset {first})",
                z.conventional_bytes, superblocks_end
            ));
        }
        let streams = if opts.gc_hot_cold { 3 } else { 2 };
        if z.max_open < 2 * streams || z.max_active < 2 * streams {
            return bad(format!(
                "{} open and {} active zones at most; the store needs {} (two per segment stream)",
                z.max_open,
                z.max_active,
                2 * streams
            ));
        }
        Ok(true)
    }

    /// Open an existing store and rebuild its index from the log.
    pub fn open(dev: Arc<dyn Device>, opts: &OpenOptions) -> Result<Store> {
        // A device a store dropped before let go (`Device::release`).
        dev.claim().map_err(Error::Device)?;
        let core = match Self::open_core(dev.clone(), opts, opts.use_checkpoint)? {
            Some(core) => core,
            None => {
                // A store with namespaces whose checkpoint does not say
                // every namespace's counts (it was not written by a clean
                // close, or the store changed since): a log scan counts
                // them exactly.
                tracing::info!("namespace counts are not in the checkpoint: rebuilding the index by a log scan");
                let scanned = Self::open_core(dev.clone(), opts, false)?;
                scanned.ok_or_else(|| Error::InvalidOptions("a log scan left namespace counts unknown".into()))?
            }
        };
        if opts.clear_torn {
            if let Err(e) = Self::mend_superblocks(dev.as_ref(), &core.log.sb) {
                tracing::warn!(error = %e, "could not rewrite a superblock copy: the store runs on the other");
            }
        }
        let core = Arc::new(core);
        let _ = core.me.set(Arc::downgrade(&core));
        if core.space.zoned() && opts.clear_torn {
            // Torn records recovery could not clear in place: their
            // segments are reclaimed now, before writes start (a cache with
            // no room to relocate into evicts the segment instead, as GC
            // does). One that cannot be leaves the store read-only:
            // writing on would move its stream past it, and a later log
            // scan would take the torn record (its sequence number the
            // newest) over its key's acknowledged version.
            for seg in core.space.take_torn() {
                let gc = core.collector();
                let mut reclaimed = match torn_reclaim_fails() {
                    Some(e) => Err(e),
                    None => crate::gc::reclaim(gc, seg, false),
                };
                if gc.evict && matches!(reclaimed, Err(Error::NoSpace { .. })) {
                    tracing::info!(segment = seg, "no room to relocate a torn record's segment: evicting it");
                    reclaimed = crate::gc::reclaim(gc, seg, true);
                }
                match reclaimed {
                    Ok(()) => tracing::info!(segment = seg, "reclaimed a segment holding a torn record"),
                    Err(e) => {
                        core.log.poison(Error::Corruption {
                            offset: core.log.sb.segment_offset(seg),
                            detail: format!(
                                "segment {seg} holds a torn record and could not be reclaimed ({e}); \
                                 writes are refused until an open reclaims it"
                            ),
                        });
                    }
                }
            }
        }
        let threads = opts.background == crate::Background::Threads;
        let gc = if opts.gc && threads {
            let c = core.clone();
            let handle = std::thread::Builder::new()
                .name("granary-gc".into())
                .spawn(move || crate::gc::run(c.collector()))
                .map_err(Error::Device)?;
            Some(handle)
        } else {
            None
        };
        // No index checkpoints in zoned mode on a device without an open
        // zone to spare for them (`Core::write_checkpoint`).
        let ckpts = core.space.checkpoints_refused().is_none();
        let checkpointer = match opts.checkpoint_interval.filter(|_| threads && ckpts) {
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
        if opts.clear_torn {
            block_on(core.write_repaired_catalog());
        } else {
            // Nothing a crash left was mended (torn records, zones): a
            // write could meet it.
            core.log.inspect_only();
        }
        Ok(Store { core, gc, checkpointer, checkpoint_on_close: opts.checkpoint_on_close })
    }

    /// The engine state of the store on `dev`, its index rebuilt (from a
    /// checkpoint if `use_checkpoint` and one loads); None when the store
    /// has namespaces and the checkpoint loaded does not give their counts.
    fn open_core(dev: Arc<dyn Device>, opts: &OpenOptions, use_checkpoint: bool) -> Result<Option<Core>> {
        let sb = Self::read_superblock(dev.as_ref())?;
        let zoned = Self::check_device(dev.as_ref(), &sb, opts)?;
        let headers = crate::log::read_segment_headers(dev.as_ref(), &sb)?;
        let (loaded, floor) = crate::checkpoint::find(dev.as_ref(), &sb, &headers, use_checkpoint);
        let mut index_cfg = match &loaded {
            Some(l) => IndexConfig::with_tables(sb.index_table_homes, l.manifest.tables_log2),
            None => IndexConfig::new(sb.index_table_homes),
        };
        index_cfg.access_words = opts.track_access;
        let session = opts.entropy.draw_u64().map_err(Error::Device)?;
        let default_mode = if opts.evict { NamespaceMode::Cache } else { NamespaceMode::Store };
        let counters = Counters::default();
        let default_counters = counters.default_ns.clone();
        let links = crate::links::Links::new(opts.blind_overwrite_bytes.unwrap_or(if dev.in_memory() {
            0
        } else {
            crate::links::BLIND_OVERWRITE_BYTES_DEFAULT
        }));
        let core = Core {
            space: Space::new(
                dev.clone(),
                sb.clone(),
                record_seed(&sb.uuid),
                opts.durability,
                crate::space::GcConfig {
                    gc: opts.gc,
                    policy: opts.gc_policy,
                    hot_cold: opts.gc_hot_cold,
                    sepbit: opts.gc_sepbit,
                    watermark: opts.gc_watermark,
                    discard: match opts.discard {
                        crate::Discard::Auto => dev.discards_by_default(),
                        crate::Discard::On => true,
                        crate::Discard::Off => false,
                    },
                    summaries: opts.segment_summaries,
                },
            ),
            keys: Keys::new(
                sb.key_hasher(),
                Index::new(index_cfg),
                links,
                crate::tier::Tier::new(opts.dram_tier_bytes),
            ),
            counters,
            recovery: Mutex::new(RecoveryReport::default()),
            gc_counters: Default::default(),
            gc_lock: Mutex::new(()),
            settling: Mutex::new(()),
            checkpoints: Checkpoints::new(session),
            clock: opts.clock.clone(),
            evict: opts.evict,
            flush_lock: async_lock::Mutex::new(()),
            // Zoned mode writes the user stream in allocation order, which
            // the coalescer's ordered groups give (`Coalescer::ordered`).
            coalesce: opts.coalesce_writes || zoned,
            manual: opts.background == crate::Background::Manual,
            coalescer: Default::default(),
            track_access: opts.track_access,
            access_clock: Clock0 { base: opts.clock.now() },
            log: Log::new(dev, sb.clone(), record_seed(&sb.uuid), opts.durability),
            namespaces: Namespaces::new(default_mode, default_counters),
            closed: AtomicBool::new(false),
            me: Default::default(),
            detached: Default::default(),
        };
        core.coalescer.ordered.store(zoned, Relaxed);
        let report = crate::recover::Rebuild(core.parts()).run(&core.checkpoints, headers, loaded, floor, opts)?;
        // An open that must not write (`clear_torn` off) leaves the zones
        // as they are: nothing is written through them.
        if opts.clear_torn {
            core.space.settle_zones()?;
        }
        let from_checkpoint = report.checkpoint_id != 0;
        *core.recovery.lock().unwrap_or_else(|e| e.into_inner()) = report;
        if let Some(f) = block_on(core.read_item(FLUSH_FLOOR_KEY))? {
            let floor = f.value.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
            core.log.flush_floor.store(floor.unwrap_or(0), Relaxed);
        }
        if core.has_feature(FLAG_NAMESPACES) && from_checkpoint && !block_on(core.restore_totals())? {
            return Ok(None);
        }
        block_on(core.load_catalog())?;
        Ok(Some(core))
    }

    pub(crate) fn read_superblock(dev: &dyn Device) -> Result<Superblock> {
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

    /// The superblock copies an open for writing rewrites from `read`, the
    /// copy it read and runs on (docs/FORMAT.md, "Superblock"), with why:
    /// a copy that decodes but differs (copy B that a crash between the
    /// copies' writes left behind copy A: A is written and flushed first,
    /// so it is the newer), or that fails its checksum or magic in two
    /// reads (rot, a stray write). A copy of a version or with fields this
    /// build does not know, or whose version field (checksummed or not) is
    /// newer than this build's, may be a newer build's: never listed.
    /// Nothing is listed when the first copy that decodes is not `read`:
    /// the device no longer holds what `read` was read from, and no rewrite
    /// from it is safe.
    pub(crate) fn superblock_copies_to_mend(dev: &dyn Device, read: &Superblock) -> Vec<(u64, String)> {
        let copy = |offset: u64| match dev.read_at(AlignedBuf::zeroed(4096), offset) {
            (buf, Ok(())) => (Superblock::decode(&buf), granary_format::superblock::version_field(&buf)),
            (_, Err(_)) => (Err(FormatError::Truncated { what: "superblock", need: 4096, have: 0 }), 0),
        };
        let copies: Vec<_> = SUPERBLOCK_OFFSETS.iter().map(|&offset| copy(offset)).collect();
        if copies.iter().find_map(|(c, _)| c.as_ref().ok()) != Some(read) {
            return Vec::new();
        }
        let newest = granary_format::superblock::SUPERBLOCK_VERSION;
        let mut mend = Vec::new();
        for ((copy_now, version), &offset) in copies.iter().zip(SUPERBLOCK_OFFSETS.iter()) {
            let why = match copy_now {
                Ok(sb) if sb == read => continue,
                Ok(_) => "it lags behind the other (a crash between their writes)".to_string(),
                Err(FormatError::Checksum { .. } | FormatError::BadMagic { .. }) if *version <= newest => {
                    match copy(offset) {
                        (Err(e @ (FormatError::Checksum { .. } | FormatError::BadMagic { .. })), _) => e.to_string(),
                        _ => continue,
                    }
                }
                Err(_) => continue,
            };
            mend.push((offset, why));
        }
        mend
    }

    /// Rewrite the copies [`Store::superblock_copies_to_mend`] lists from
    /// `read`, each flushed, so the store has two good copies again. Each
    /// is tried; the first failure is returned (an open logs it and goes
    /// on with the copy it read; `granary rekey` fails with it).
    pub(crate) fn mend_superblocks(dev: &dyn Device, read: &Superblock) -> Result<()> {
        let mut first_err = None;
        for (offset, why) in Self::superblock_copies_to_mend(dev, read) {
            match crate::space::write_superblock_at(dev, read, offset) {
                Ok(()) => tracing::warn!(offset, "superblock copy rewritten from the other: {why}"),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
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

    /// [`Store::open_path`] for an inspection (`granary get`, `stat`,
    /// `verify`, `ns list`, `ns stat`, `export list`): the device is opened for reading only, under a shared lock
    /// ([`granary_io::FileDevice::open_read_only`]), so a store on a
    /// read-only mount or a file without write permission opens, and
    /// inspections run side by side. `open` must write nothing: no GC, no
    /// checkpoints, `clear_torn` off (refused otherwise); a write through
    /// the store fails.
    pub fn open_path_read_only(path: &Path, mode: OpenMode, open: &OpenOptions) -> Result<Store> {
        if open.gc || open.clear_torn || open.checkpoint_on_close || open.checkpoint_interval.is_some() {
            return Err(Error::InvalidOptions(
                "a read-only open takes no GC, no checkpoints and clear_torn off (it writes nothing)".into(),
            ));
        }
        let dev =
            DeviceSpec::parse(path).and_then(|s| s.open_read_only(mode, IoBackend::Sync)).map_err(Error::Device)?;
        Self::open(dev, open)
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
        if core.log.check_writable().is_ok() && core.checkpoints.stale(core.parts()) {
            // Failures are logged and counted; the next round tries again.
            let _ = core.write_checkpoint(false);
        }
        stopped = stop.0.lock().unwrap_or_else(|e| e.into_inner());
    }
}

#[cfg(test)]
thread_local! {
    /// Makes an open's relocating reclaims of segments holding torn
    /// records fail, on this thread (tests): with a device error (true),
    /// or for room (false: `NoSpace`); None: they run.
    pub(crate) static TORN_RECLAIM_FAILS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// The failure a test asked this thread's opens to give their relocating
/// reclaims of torn segments ([`TORN_RECLAIM_FAILS`]); never outside
/// tests.
fn torn_reclaim_fails() -> Option<Error> {
    #[cfg(test)]
    return TORN_RECLAIM_FAILS.get().map(|device| match device {
        true => Error::Device(std::io::Error::other("failed by the test")),
        false => Error::NoSpace { needed_bytes: 1, segments: 0 },
    });
    #[cfg(not(test))]
    None
}
