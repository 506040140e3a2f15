//! The store handle: options, create, open, close, and the store-wide
//! calls (sync, stats, verify).
//!
//! A `granary_store` owns an `Arc<Shared>`: the open [`Store`], a handle on
//! its default namespace (what the plain `granary_get`/`put`/`delete` act
//! on) and the store's id. Open batches hold a clone of the `Arc` (a commit
//! needs the store), so `granary_close` refuses (`GRANARY_EBUSY`) while one
//! is open instead of closing under it; namespace handles hold the engine's
//! own handle, which refuses calls once the store is closed
//! (`GRANARY_ECLOSED`). Ids are unique in the process, so a namespace
//! handle of one store is never taken for one of another, even one opened
//! later at the same address.

use crate::args;
use crate::status::{granary_status, guard, Fail, Res};
use ::granary_store::io::{IoBackend, MemDevice, OpenMode};
use ::granary_store::{
    CreateOptions, Durability, IfPresent, Namespace, NewStore, OpenOptions, Site, Store, DEFAULT_NAMESPACE,
};
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// An open store. Made by `granary_create`, `granary_create_memory` or
/// `granary_open`; freed by `granary_close`.
///
/// Thread safety: every call taking a `granary_store *` may be made from
/// any number of threads at once, except `granary_close`, which must be the
/// last call on the handle: none may run during it or start after it.
#[allow(non_camel_case_types)]
pub struct granary_store {
    pub(crate) shared: Arc<Shared>,
}

/// What a store handle and its open batches share.
pub(crate) struct Shared {
    pub store: Store,
    /// The default namespace: the keys of the `granary_*` data calls.
    pub default_ns: Namespace,
    /// Unique among the stores this process opened.
    pub id: u64,
    /// Held by the calls of the store's namespace handles and scans,
    /// which may run on other threads while `granary_close` runs: the
    /// close waits for those under way (the engine's close requires that
    /// none runs) and later ones find the store closed.
    pub gate: Arc<Gate>,
}

/// See [`Shared::gate`].
#[derive(Default)]
pub(crate) struct Gate(std::sync::RwLock<()>);

impl Gate {
    /// Hold the gate for one call on `ns`.
    pub(crate) fn call<'a>(&'a self, ns: &'a Namespace) -> Held<'a> {
        Held { ns, _call: self.0.read().unwrap_or_else(|e| e.into_inner()) }
    }
}

/// A namespace for the length of one call, the store's close held off.
pub(crate) struct Held<'a> {
    ns: &'a Namespace,
    _call: std::sync::RwLockReadGuard<'a, ()>,
}

impl std::ops::Deref for Held<'_> {
    type Target = Namespace;
    fn deref(&self) -> &Namespace {
        self.ns
    }
}

static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(1);

/// When a write is acknowledged (`granary_options.durability`).
#[allow(non_camel_case_types)]
#[repr(C)]
pub enum granary_durability {
    /// When the write reaches the device (survives a process crash; a
    /// drive's volatile cache may lose it on power failure). The default.
    GRANARY_DURABILITY_DIRECT = 0,
    /// After the write, a flush of the device: survives power loss too.
    GRANARY_DURABILITY_FLUSH = 1,
}

/// Options of `granary_create`, `granary_create_memory` and `granary_open`.
/// Fill one with `granary_options_init`, then change the fields you need.
/// Its layout, as every struct's here, is this version's: a program runs
/// with the library of the header it was compiled against (docs/C.md,
/// "Versions").
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct granary_options {
    /// A `granary_durability`.
    pub durability: u32,
    /// Nonzero: go through the page cache instead of O_DIRECT (for
    /// filesystems without O_DIRECT, such as tmpfs). Files only.
    pub buffered: u32,
    /// Nonzero: cache mode: when space runs low, the least recently used
    /// data of namespaces in cache mode is evicted instead of writes being
    /// refused with `GRANARY_ENOSPACE`.
    pub evict: u32,
    /// At creation: the allocation unit, 512 or 4096 (0: the device's
    /// block size).
    pub grain_bytes: u32,
    /// At creation: the segment size, a power of two (0: 1/64 of the
    /// device, between 1 MiB and 1 GiB). The largest value is a little
    /// under one segment.
    pub segment_bytes: u64,
}

/// What the engine takes for `o` (defaults for NULL).
fn engine_options(o: Option<&granary_options>) -> Res<(OpenMode, CreateOptions, OpenOptions)> {
    let o = o.copied().unwrap_or_default();
    let durability = match o.durability {
        0 => Durability::Direct,
        1 => Durability::Flush,
        d => return Err(Fail::inval(format!("durability {d} is not a granary_durability (0 or 1)"))),
    };
    let mode = if o.buffered != 0 { OpenMode::Buffered } else { OpenMode::Direct };
    let create = CreateOptions {
        grain_bytes: (o.grain_bytes != 0).then_some(o.grain_bytes),
        segment_bytes: (o.segment_bytes != 0).then_some(o.segment_bytes),
        index_table_homes: None,
    };
    let open = OpenOptions { durability, evict: o.evict != 0, ..OpenOptions::default() };
    Ok((mode, create, open))
}

/// Hand `store` to C as a new handle in `*out`.
fn hand_out(store: Store, out: &mut *mut granary_store) -> Res {
    let default_ns = store.namespace(DEFAULT_NAMESPACE)?;
    let id = NEXT_STORE_ID.fetch_add(1, Relaxed);
    let shared = Arc::new(Shared { store, default_ns, id, gate: Arc::default() });
    *out = Box::into_raw(Box::new(granary_store { shared }));
    Ok(())
}

/// Fill `*options` with the defaults: direct writes, O_DIRECT, store mode
/// (no eviction), default geometry.
///
/// # Safety
///
/// `options` is NULL (`GRANARY_EINVAL`) or points to a writable
/// `granary_options`.
#[no_mangle]
pub unsafe extern "C" fn granary_options_init(options: *mut granary_options) -> granary_status {
    guard(|| {
        // SAFETY: NULL or writable, by the caller's promise.
        *unsafe { args::out(options, "options") }? = granary_options::default();
        Ok(())
    })
}

/// Create a new store in a file of `size_bytes` (preallocated; its parent
/// folders are made), or on a block device (used whole), at the path of
/// `path_len` bytes at `path` (not NUL-terminated). Refused if the path
/// holds anything but a block device. On `GRANARY_OK`, `*out` is the open
/// store, to be closed with `granary_close`; on failure `*out` is NULL and
/// any file made is removed.
///
/// `options` may be NULL (the defaults). Blocks until the file is filled
/// and the store written.
///
/// # Safety
///
/// `path` points to `path_len` readable bytes; `options` is NULL or points
/// to a `granary_options`; `out` points to a writable `granary_store *`.
/// NULL for `path` (with a length) or `out` is `GRANARY_EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn granary_create(
    path: *const u8,
    path_len: usize,
    size_bytes: u64,
    options: *const granary_options,
    out: *mut *mut granary_store,
) -> granary_status {
    guard(|| {
        // SAFETY: each pointer as the caller promised (see # Safety).
        let out = unsafe { args::out_handle(out, "out") }?;
        // SAFETY: as above.
        let (path, o) = unsafe { (args::path(path, path_len)?, options.as_ref()) };
        let (mode, create, open) = engine_options(o)?;
        let new = NewStore {
            size_bytes,
            stripe_bytes: ::granary_store::io::stripe::STRIPE_BYTES_DEFAULT,
            create,
            fill_progress: &|_, _| Ok(()),
        };
        let store = Site::inspect(path, IfPresent::Refuse)?.create(mode, IoBackend::Sync, &new, &open)?.store;
        hand_out(store, out)
    })
}

/// Create a new store in memory, `size_bytes` large (a multiple of 512,
/// allocated at once; `GRANARY_ENOSPACE` if it cannot be): for tests and
/// measurements; its data is gone when it is closed. `options`' `buffered` is ignored. Otherwise as
/// `granary_create`.
///
/// # Safety
///
/// As for `granary_create` (without the path).
#[no_mangle]
pub unsafe extern "C" fn granary_create_memory(
    size_bytes: u64,
    options: *const granary_options,
    out: *mut *mut granary_store,
) -> granary_status {
    guard(|| {
        // SAFETY: each pointer as the caller promised (see # Safety).
        let (out, o) = unsafe { (args::out_handle(out, "out")?, options.as_ref()) };
        let (_, create, open) = engine_options(o)?;
        let dev = MemDevice::try_new(size_bytes).map_err(|e| match e.kind() {
            std::io::ErrorKind::OutOfMemory => Fail::new(granary_status::GRANARY_ENOSPACE, e.to_string()),
            _ => Fail::inval(e.to_string()),
        })?;
        let store = Store::create(Arc::new(dev), &create, &open)?;
        hand_out(store, out)
    })
}

/// Open the store at the path of `path_len` bytes at `path` (a file, a
/// block device, or a stripe set: members separated by commas), rebuilding
/// its index (from its last checkpoint and the log written since).
/// `GRANARY_ENOTSTORE` if nothing is there or what is there is not a store.
/// `options` may be NULL; its geometry fields are ignored. On `GRANARY_OK`,
/// `*out` is the open store, to be closed with `granary_close`; otherwise
/// NULL.
///
/// A store is open in one handle at a time: the device is locked while it
/// is open, and a second open of it (by any process) is `GRANARY_EIO`.
///
/// # Safety
///
/// As for `granary_create`.
#[no_mangle]
pub unsafe extern "C" fn granary_open(
    path: *const u8,
    path_len: usize,
    options: *const granary_options,
    out: *mut *mut granary_store,
) -> granary_status {
    guard(|| {
        // SAFETY: each pointer as the caller promised (see # Safety).
        let out = unsafe { args::out_handle(out, "out") }?;
        // SAFETY: as above.
        let (path, o) = unsafe { (args::path(path, path_len)?, options.as_ref()) };
        let (mode, _, open) = engine_options(o)?;
        let site = Site::inspect(path, IfPresent::Open)?;
        if !site.holds_store() {
            let msg = format!("{}: no store here (granary_create makes one)", path.display());
            return Err(Fail::new(granary_status::GRANARY_ENOTSTORE, msg));
        }
        hand_out(site.open(mode, IoBackend::Sync, &open)?.store, out)
    })
}

/// Close the store: stop its background work, write a checkpoint (so the
/// next open is fast), flush the device, and free the handle.
///
/// `GRANARY_EBUSY` while a batch of the store is open (commit or abort it
/// first): the store then stays open and the handle valid. Otherwise the
/// handle is freed whatever the status (an IO error at close is reported,
/// and the next open recovers from the log). Calls on the store's
/// namespace handles and scans under way on other threads end first (and
/// those starting meanwhile wait for the close); the handles stay to be
/// freed with `granary_ns_close` and `granary_scan_close`, and their calls
/// then return `GRANARY_ECLOSED`.
/// The device's lock is let go when this returns (another open may
/// begin), whatever handles are left.
///
/// Thread safety: no other call on this handle may run during this one or
/// start after it.
///
/// # Safety
///
/// `store` is NULL (`GRANARY_EINVAL`) or a live handle.
#[no_mangle]
pub unsafe extern "C" fn granary_close(store: *mut granary_store) -> granary_status {
    guard(|| {
        // SAFETY: NULL or live, by the caller's promise.
        let s = unsafe { args::handle(store, "store") }?;
        if Arc::strong_count(&s.shared) > 1 {
            return Err(Fail::new(
                granary_status::GRANARY_EBUSY,
                "a batch of this store is still open: commit or abort it before closing the store",
            ));
        }
        // SAFETY: the handle was made by `Box::into_raw` in `hand_out` and
        // is live; the caller makes no other call on it from now on.
        let s = unsafe { Box::from_raw(store) };
        match Arc::try_unwrap(s.shared) {
            Ok(shared) => {
                drop(shared.default_ns);
                // Namespace and scan calls under way end first.
                let gate = shared.gate.clone();
                let _closing = gate.0.write().unwrap_or_else(|e| e.into_inner());
                shared.store.close()?;
                Ok(())
            }
            // Only open batches share the store, and there were none; a
            // batch freed meanwhile only lowers the count.
            Err(_) => Err(Fail::new(granary_status::GRANARY_EOTHER, "the store was still shared when closed")),
        }
    })
}

/// The durability barrier: when it returns `GRANARY_OK`, every write
/// acknowledged before the call (by any thread, in any namespace) survives
/// a power loss, whatever the durability option. Thread-safe.
///
/// # Safety
///
/// `store` is NULL (`GRANARY_EINVAL`) or a live handle.
#[no_mangle]
pub unsafe extern "C" fn granary_sync(store: *const granary_store) -> granary_status {
    guard(|| {
        // SAFETY: NULL or live, by the caller's promise.
        let s = unsafe { args::handle(store, "store") }?;
        Ok(s.shared.store.sync()?)
    })
}

/// Figures of an open store (`granary_stats_get`). `granary_stats_each`
/// gives every figure the engine keeps, by name.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct granary_stats {
    /// Keys with a value, in all namespaces, the engine's own included
    /// (its namespace catalog); `granary_ns_stats` counts one namespace's.
    pub keys: u64,
    /// Deleted keys whose tombstone is still current.
    pub tombstones: u64,
    /// Bytes of the records the index points at (whole grains).
    pub live_bytes: u64,
    /// Size of the device, of a segment, and segments in all and free.
    pub device_bytes: u64,
    pub segment_bytes: u64,
    pub segments: u64,
    pub segments_free: u64,
    /// Largest value the store holds (with a short key).
    pub value_bytes_max: u64,
    /// Since the store was opened: engine operations.
    pub gets: u64,
    pub get_hits: u64,
    pub puts: u64,
    pub deletes: u64,
    /// Key and value bytes of successful puts, and device bytes written
    /// (their ratio is the write amplification).
    pub user_bytes_written: u64,
    pub device_bytes_written: u64,
}

/// Fill `*out` with the store's figures now. Thread-safe.
///
/// # Safety
///
/// `store` is NULL or a live handle; `out` is NULL or points to a writable
/// `granary_stats` (NULL for either: `GRANARY_EINVAL`).
#[no_mangle]
pub unsafe extern "C" fn granary_stats_get(store: *const granary_store, out: *mut granary_stats) -> granary_status {
    guard(|| {
        // SAFETY: each pointer as the caller promised (see # Safety).
        let (s, out) = unsafe { (args::handle(store, "store")?, args::out(out, "out")?) };
        let st = s.shared.store.stats();
        *out = granary_stats {
            keys: st.keys,
            tombstones: st.tombstones,
            live_bytes: st.live_bytes,
            device_bytes: st.device_bytes,
            segment_bytes: st.segment_bytes,
            segments: st.segments,
            segments_free: st.segments_free,
            value_bytes_max: st.value_bytes_max,
            gets: st.gets,
            get_hits: st.get_hits,
            puts: st.puts,
            deletes: st.deletes,
            user_bytes_written: st.user_bytes_written,
            device_bytes_written: st.io.written_bytes,
        };
        Ok(())
    })
}

/// Called by `granary_stats_each` with each figure: its name and its value
/// as text (a number, `true`/`false`, or words), neither NUL-terminated,
/// both valid only during the call. Return 0 to go on, anything else to
/// stop.
#[allow(non_camel_case_types)]
pub type granary_stat_visitor = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        name: *const c_char,
        name_len: usize,
        value: *const c_char,
        value_len: usize,
    ) -> i32,
>;

/// Call `visit(ctx, ...)` with every figure of the store, in the order
/// `granary stat` prints them (the same names), on this thread, until it
/// returns nonzero. Thread-safe (the visitor runs on the calling thread).
///
/// # Safety
///
/// `store` is NULL or a live handle; `visit` is NULL or a function of that
/// type; `ctx` is passed to it unread. NULL `store` or `visit`:
/// `GRANARY_EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn granary_stats_each(
    store: *const granary_store,
    visit: granary_stat_visitor,
    ctx: *mut c_void,
) -> granary_status {
    guard(|| {
        // SAFETY: NULL or live, by the caller's promise.
        let s = unsafe { args::handle(store, "store") }?;
        let visit = visit.ok_or_else(|| Fail::inval("visit is NULL"))?;
        let registry = s.shared.store.stats().registry();
        for m in registry.metrics() {
            let value = m.value.to_string();
            // SAFETY: the visitor is the caller's function of this type;
            // both texts outlive the call.
            let stop = unsafe { visit(ctx, m.name.as_ptr().cast(), m.name.len(), value.as_ptr().cast(), value.len()) };
            if stop != 0 {
                break;
            }
        }
        Ok(())
    })
}

/// What `granary_verify` checked and found.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct granary_verify_report {
    /// Index entries read back and checked against their records.
    pub entries_checked: u64,
    pub values: u64,
    pub tombstones: u64,
    /// Segments and records scanned.
    pub segments_scanned: u64,
    pub records_scanned: u64,
    /// Records whose body failed its checksum.
    pub damaged_records: u64,
    /// Inconsistencies found (0: the store is consistent).
    pub errors: u64,
}

/// Check every index entry against its record and scan every segment
/// (what `granary verify` does; GC waits meanwhile). `GRANARY_OK` when the
/// store is consistent; `GRANARY_ECORRUPT` when errors were found (the
/// message lists the first ones); another status if the check could not
/// run. `report` may be NULL; otherwise it is filled in whenever the check
/// ran. Thread-safe.
///
/// # Safety
///
/// `store` is NULL (`GRANARY_EINVAL`) or a live handle; `report` is NULL
/// or points to a writable `granary_verify_report`.
#[no_mangle]
pub unsafe extern "C" fn granary_verify(
    store: *const granary_store,
    report: *mut granary_verify_report,
) -> granary_status {
    guard(|| {
        // SAFETY: NULL or live, by the caller's promise.
        let s = unsafe { args::handle(store, "store") }?;
        let r = s.shared.store.verify()?;
        let out = granary_verify_report {
            entries_checked: r.entries_checked,
            values: r.values,
            tombstones: r.tombstones,
            segments_scanned: r.segments_scanned,
            records_scanned: r.records_scanned,
            damaged_records: r.damaged_records,
            errors: r.error_count,
        };
        // SAFETY: NULL or writable, by the caller's promise.
        unsafe { args::set_opt(report, out) };
        if r.is_clean() {
            return Ok(());
        }
        let msg = format!("verify found {} errors; the first: {}", r.error_count, r.errors.join("; "));
        Err(Fail::new(granary_status::GRANARY_ECORRUPT, msg))
    })
}
