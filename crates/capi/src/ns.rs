//! Namespaces: handles on one namespace of a store (open, create, close),
//! dropping and listing them, exports (namespaces of kind block: create
//! and list), and the data calls on a handle.
//!
//! A `granary_ns` holds the engine's namespace handle, which keeps the
//! engine state alive and refuses calls once its store is closed
//! (`GRANARY_ECLOSED`) or its namespace dropped (`GRANARY_ENONAMESPACE`),
//! and the id of its store, which batches check.

use crate::args;
use crate::kv;
use crate::status::{granary_status, guard, guard_void, Fail, Res};
use crate::store::{granary_store, Gate, Held};
use ::granary_store::{Namespace, NamespaceKind, NamespaceMode, NamespaceOptions, NamespaceStats};
use std::ffi::c_void;
use std::sync::Arc;

/// A handle on one namespace of a store (`granary_ns_open`,
/// `granary_ns_create`), freed by `granary_ns_close`. It may outlive its
/// store (its calls then return `GRANARY_ECLOSED`) and its namespace
/// (`GRANARY_ENONAMESPACE`, also after a namespace of the same name is
/// made again: open a new handle for that one).
///
/// Thread safety: every call taking a `granary_ns *` may be made from any
/// number of threads at once, except `granary_ns_close`, which must be
/// the last call on the handle.
#[allow(non_camel_case_types)]
pub struct granary_ns {
    pub(crate) ns: Namespace,
    /// The id of the store it was opened on (`store::Shared::id`).
    pub(crate) store_id: u64,
    /// The store's (`store::Shared::gate`).
    pub(crate) gate: Arc<Gate>,
}

/// What a namespace does when it or the store is full
/// (`granary_ns_options.mode`).
#[allow(non_camel_case_types)]
#[repr(C)]
pub enum granary_ns_mode {
    /// Its values may be evicted, in a store opened with `evict`. The default.
    GRANARY_NS_CACHE = 0,
    /// Its values are never evicted; writes are refused when the store is full.
    GRANARY_NS_STORE = 1,
}

/// Options of a new namespace (`granary_ns_create`), fixed at creation.
/// All zeros is the default.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct granary_ns_options {
    /// A `granary_ns_mode`.
    pub mode: u32,
    /// Seconds a value lives (0: for ever).
    pub default_ttl_secs: u32,
    /// Most bytes of values it holds (0: no limit); a write past it is
    /// `GRANARY_EQUOTA`.
    pub max_bytes: u64,
    /// Most values it holds (0: no limit), likewise.
    pub max_keys: u64,
}

/// A namespace's options and figures (`granary_ns_list`,
/// `granary_ns_stats`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct granary_ns_info {
    /// Its name, `name_len` bytes of UTF-8, not NUL-terminated; valid as
    /// long as the call that gave it (`granary_ns_list`'s visit) or the
    /// handle (`granary_ns_stats`).
    pub name: *const u8,
    pub name_len: usize,
    /// Its options: a `granary_ns_mode`, the default TTL in seconds, and
    /// its quotas (0: none).
    pub mode: u32,
    pub default_ttl_secs: u32,
    pub max_bytes: u64,
    pub max_keys: u64,
    /// Values it holds, and their records' bytes.
    pub keys: u64,
    pub value_bytes: u64,
    /// Since the store was opened: gets, those that found a value, writes
    /// that stored, deletes that removed a value.
    pub gets: u64,
    pub hits: u64,
    pub sets: u64,
    pub deletes: u64,
    /// An export (a namespace of kind block, `granary_export_create`): the
    /// size of its block device and of its blocks, in bytes. 0 and 0 for
    /// a namespace of keys and values.
    pub export_bytes: u64,
    pub block_bytes: u32,
}

fn info(s: &NamespaceStats, name: &str) -> granary_ns_info {
    let o = &s.options;
    granary_ns_info {
        name: name.as_ptr(),
        name_len: name.len(),
        mode: match o.mode {
            NamespaceMode::Cache => 0,
            NamespaceMode::Store => 1,
        },
        default_ttl_secs: o.default_ttl_secs,
        max_bytes: o.max_bytes.unwrap_or(0),
        max_keys: o.max_keys.unwrap_or(0),
        keys: s.keys,
        value_bytes: s.value_bytes,
        gets: s.gets,
        hits: s.hits,
        sets: s.sets,
        deletes: s.deletes,
        export_bytes: match o.kind {
            NamespaceKind::Block { size_bytes, .. } => size_bytes,
            NamespaceKind::Kv => 0,
        },
        block_bytes: match o.kind {
            NamespaceKind::Block { block_bytes, .. } => block_bytes,
            NamespaceKind::Kv => 0,
        },
    }
}

fn ns_options(o: Option<&granary_ns_options>) -> Res<NamespaceOptions> {
    let o = o.copied().unwrap_or_default();
    let mode = match o.mode {
        0 => NamespaceMode::Cache,
        1 => NamespaceMode::Store,
        m => return Err(Fail::inval(format!("namespace mode {m} is not a granary_ns_mode (0 or 1)"))),
    };
    Ok(NamespaceOptions {
        mode,
        default_ttl_secs: o.default_ttl_secs,
        max_bytes: (o.max_bytes != 0).then_some(o.max_bytes),
        max_keys: (o.max_keys != 0).then_some(o.max_keys),
        ..NamespaceOptions::default()
    })
}

/// Open a handle on namespace `name` (`name_len` bytes, not
/// NUL-terminated; `"default"` is the namespace of the plain data calls):
/// `GRANARY_ENONAMESPACE` if there is none. On `GRANARY_OK`, `*out` is the
/// handle, freed by `granary_ns_close`; otherwise NULL. Cheap; thread-safe.
///
/// # Safety
///
/// `store` is NULL or a live handle; `name` points to `name_len` readable
/// bytes; `out` points to a writable `granary_ns *`. A NULL that breaks
/// these rules is `GRANARY_EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn granary_ns_open(
    store: *const granary_store,
    name: *const u8,
    name_len: usize,
    out: *mut *mut granary_ns,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    unsafe { hand_out_ns(store, name, name_len, out, |s, name| Ok(s.namespace(name)?)) }
}

/// Create namespace `name` (1 to 64 bytes of ASCII letters, digits, `_`,
/// `-` and `.`) with `options` (NULL: the defaults), durable when this
/// returns. `GRANARY_ENAMESPACEEXISTS` if it exists. On `GRANARY_OK`,
/// `*out` is a handle on it, freed by `granary_ns_close`; otherwise NULL.
/// Thread-safe.
///
/// # Safety
///
/// As for `granary_ns_open`; `options` is NULL or points to a
/// `granary_ns_options`.
#[no_mangle]
pub unsafe extern "C" fn granary_ns_create(
    store: *const granary_store,
    name: *const u8,
    name_len: usize,
    options: *const granary_ns_options,
    out: *mut *mut granary_ns,
) -> granary_status {
    // SAFETY: NULL or readable, by the caller's promise.
    let o = unsafe { options.as_ref() };
    // SAFETY: the caller's promises, passed on.
    unsafe { hand_out_ns(store, name, name_len, out, |s, name| Ok(s.create_namespace(name, ns_options(o)?)?)) }
}

/// Drop namespace `name` with all its keys, in constant time (its space is
/// reclaimed in the background): durable when this returns. Handles on it
/// then return `GRANARY_ENONAMESPACE` (they still need `granary_ns_close`).
/// `GRANARY_ENONAMESPACE` if there is none; the default namespace cannot
/// be dropped. Thread-safe.
///
/// # Safety
///
/// `store` is NULL or a live handle; `name` points to `name_len` readable
/// bytes. A NULL that breaks these rules is `GRANARY_EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn granary_ns_drop(
    store: *const granary_store,
    name: *const u8,
    name_len: usize,
) -> granary_status {
    guard(|| {
        // SAFETY: each pointer as the caller promised (see # Safety).
        let (s, name) = unsafe { (args::handle(store, "store")?, args::name(name, name_len)?) };
        Ok(s.shared.store.drop_namespace(name)?)
    })
}

/// Empty namespace `name` in constant time, keeping it and its options
/// (the default namespace: every key written without a namespace). Its
/// keys read as gone at once; handles on it stay valid. Durable when this
/// returns. `GRANARY_ENONAMESPACE` if there is none. Thread-safe.
///
/// # Safety
///
/// As for `granary_ns_drop`.
#[no_mangle]
pub unsafe extern "C" fn granary_ns_truncate(
    store: *const granary_store,
    name: *const u8,
    name_len: usize,
) -> granary_status {
    guard(|| {
        // SAFETY: each pointer as the caller promised (see # Safety).
        let (s, name) = unsafe { (args::handle(store, "store")?, args::name(name, name_len)?) };
        Ok(s.shared.store.truncate(name)?)
    })
}

/// Called by `granary_ns_list` with each namespace; `info` (and its name)
/// is valid only during the call. Return 0 to go on, anything else to stop.
#[allow(non_camel_case_types)]
pub type granary_ns_visitor = Option<unsafe extern "C" fn(ctx: *mut c_void, info: *const granary_ns_info) -> i32>;

/// `visit(ctx, info)` with each namespace `list` gives of the store, on
/// this thread, until it returns nonzero: `granary_ns_list`'s and
/// `granary_export_list`'s work.
///
/// # Safety
///
/// As for `granary_ns_list`.
unsafe fn visit_each(
    store: *const granary_store,
    visit: granary_ns_visitor,
    ctx: *mut c_void,
    list: fn(&::granary_store::Store) -> Vec<NamespaceStats>,
) -> granary_status {
    guard(|| {
        // SAFETY: NULL or live, by the caller's promise.
        let s = unsafe { args::handle(store, "store") }?;
        let visit = visit.ok_or_else(|| Fail::inval("visit is NULL"))?;
        for st in list(&s.shared.store) {
            let i = info(&st, &st.name);
            // SAFETY: the visitor is the caller's function of this type;
            // `i` and the name it points to outlive the call.
            if unsafe { visit(ctx, &i) } != 0 {
                break;
            }
        }
        Ok(())
    })
}

/// Call `visit(ctx, info)` with every namespace of the store (the default
/// one first, then by name), on this thread, until it returns nonzero.
/// Thread-safe.
///
/// # Safety
///
/// `store` is NULL or a live handle; `visit` is NULL or a function of that
/// type; `ctx` is passed to it unread. NULL `store` or `visit`:
/// `GRANARY_EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn granary_ns_list(
    store: *const granary_store,
    visit: granary_ns_visitor,
    ctx: *mut c_void,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    unsafe { visit_each(store, visit, ctx, ::granary_store::Store::namespaces) }
}

/// Fill `*out` with the options and figures of the handle's namespace; its
/// `name` points into the handle (valid until `granary_ns_close`).
/// Thread-safe.
///
/// # Safety
///
/// `ns` is NULL or a live handle; `out` is NULL or points to a writable
/// `granary_ns_info` (NULL for either: `GRANARY_EINVAL`).
#[no_mangle]
pub unsafe extern "C" fn granary_ns_stats(ns: *const granary_ns, out: *mut granary_ns_info) -> granary_status {
    guard(|| {
        // SAFETY: each pointer as the caller promised (see # Safety).
        let (h, out) = unsafe { (args::handle(ns, "ns")?, args::out(out, "out")?) };
        let st = h.gate.call(&h.ns).stats()?;
        *out = info(&st, h.ns.name());
        Ok(())
    })
}

/// Free a namespace handle (the namespace and its keys stay). NULL is
/// ignored. No other call on the handle may run during this one or start
/// after it.
///
/// # Safety
///
/// `ns` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn granary_ns_close(ns: *mut granary_ns) {
    guard_void(|| {
        if !ns.is_null() {
            // SAFETY: made by `Box::into_raw` above and live, as the caller
            // promised; the caller makes no other call on it.
            drop(unsafe { Box::from_raw(ns) });
        }
    })
}

/// The engine handle behind `ns`, for one call.
///
/// # Safety
///
/// `ns` is NULL or a live handle.
unsafe fn handle<'a>(ns: *const granary_ns) -> Res<Held<'a>> {
    // SAFETY: as the caller promised.
    let h = unsafe { args::handle(ns, "ns") }?;
    Ok(h.gate.call(&h.ns))
}

/// `granary_get` in the handle's namespace.
///
/// # Safety
///
/// As for `granary_get`, with `ns` NULL or a live namespace handle.
#[no_mangle]
pub unsafe extern "C" fn granary_ns_get(
    ns: *const granary_ns,
    key: *const u8,
    key_len: usize,
    buf: *mut u8,
    len: *mut usize,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { kv::get(&*handle(ns)?, key, key_len, buf, len, std::ptr::null_mut()) })
}

/// `granary_get_alloc` in the handle's namespace (free the value with
/// `granary_free`).
///
/// # Safety
///
/// As for `granary_get_alloc`, with `ns` NULL or a live namespace handle.
#[no_mangle]
pub unsafe extern "C" fn granary_ns_get_alloc(
    ns: *const granary_ns,
    key: *const u8,
    key_len: usize,
    value: *mut *mut u8,
    value_len: *mut usize,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { kv::get_alloc(|| handle(ns), key, key_len, value, value_len, || Ok(std::ptr::null_mut())) })
}

/// `granary_put` in the handle's namespace (its quotas and default TTL
/// apply).
///
/// # Safety
///
/// As for `granary_put`, with `ns` NULL or a live namespace handle.
#[no_mangle]
pub unsafe extern "C" fn granary_ns_put(
    ns: *const granary_ns,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
    mode: u32,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { kv::put(&*handle(ns)?, key, key_len, value, value_len, mode) })
}

/// `granary_delete` in the handle's namespace.
///
/// # Safety
///
/// As for `granary_delete`, with `ns` NULL or a live namespace handle.
#[no_mangle]
pub unsafe extern "C" fn granary_ns_delete(ns: *const granary_ns, key: *const u8, key_len: usize) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { kv::delete(&*handle(ns)?, key, key_len) })
}

/// `granary_get_item` in the handle's namespace.
///
/// # Safety
///
/// As for `granary_get_item`, with `ns` NULL or a live namespace handle.
#[no_mangle]
pub unsafe extern "C" fn granary_ns_get_item(
    ns: *const granary_ns,
    key: *const u8,
    key_len: usize,
    buf: *mut u8,
    len: *mut usize,
    item: *mut kv::granary_item,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { kv::get(&*handle(ns)?, key, key_len, buf, len, args::out(item, "item")?) })
}

/// `granary_get_item_alloc` in the handle's namespace (free the value with
/// `granary_free`).
///
/// # Safety
///
/// As for `granary_get_item_alloc`, with `ns` NULL or a live namespace
/// handle.
#[no_mangle]
pub unsafe extern "C" fn granary_ns_get_item_alloc(
    ns: *const granary_ns,
    key: *const u8,
    key_len: usize,
    value: *mut *mut u8,
    value_len: *mut usize,
    item: *mut kv::granary_item,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe {
        kv::get_alloc(|| handle(ns), key, key_len, value, value_len, || Ok(args::out(item, "item")? as *mut _))
    })
}

/// `granary_put_item` in the handle's namespace (its quotas apply, and its
/// default TTL to an item whose `expires` is 0).
///
/// # Safety
///
/// As for `granary_put_item`, with `ns` NULL or a live namespace handle.
#[no_mangle]
// The arguments of the C call, one by one.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn granary_ns_put_item(
    ns: *const granary_ns,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
    mode: u32,
    item: *const kv::granary_item,
    cas_out: *mut u64,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { kv::put_item(&*handle(ns)?, key, key_len, value, value_len, mode, item, cas_out) })
}

/// `granary_delete_cas` in the handle's namespace.
///
/// # Safety
///
/// As for `granary_delete_cas`, with `ns` NULL or a live namespace handle.
#[no_mangle]
pub unsafe extern "C" fn granary_ns_delete_cas(
    ns: *const granary_ns,
    key: *const u8,
    key_len: usize,
    cas: u64,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { kv::delete_cas(&*handle(ns)?, key, key_len, cas) })
}

/// Create export `name` (a namespace of kind block: a block device of
/// `size_bytes` in blocks of `block_bytes`, as `granary serve --nbd-port`
/// serves it; mode store, no quota, no TTL), and open a handle on it in
/// `*out` (NULL on failure). `GRANARY_EBADNAMESPACE` unless the block size
/// is a power of two from 512 to 65536 that one value of the store holds
/// and the size a positive multiple of it; `GRANARY_ENAMESPACEEXISTS` if a
/// namespace of that name exists. Dropped and truncated as any namespace
/// (`granary_ns_drop`, `granary_ns_truncate`). Thread-safe.
///
/// # Safety
///
/// As for `granary_ns_create`, without the options.
#[no_mangle]
pub unsafe extern "C" fn granary_export_create(
    store: *const granary_store,
    name: *const u8,
    name_len: usize,
    size_bytes: u64,
    block_bytes: u32,
    out: *mut *mut granary_ns,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    unsafe { hand_out_ns(store, name, name_len, out, |s, name| Ok(s.create_export(name, size_bytes, block_bytes)?)) }
}

/// Call `visit(ctx, info)` with every export of the store (the
/// namespaces of kind block, whose `info->export_bytes` is not 0), by
/// name, on this thread, until it returns nonzero. Thread-safe.
///
/// # Safety
///
/// As for `granary_ns_list`.
#[no_mangle]
pub unsafe extern "C" fn granary_export_list(
    store: *const granary_store,
    visit: granary_ns_visitor,
    ctx: *mut c_void,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    unsafe { visit_each(store, visit, ctx, ::granary_store::Store::exports) }
}

/// A handle in `*out` on the namespace `open` opens or creates by the name
/// `name`: the work of the calls that hand out a namespace handle.
///
/// # Safety
///
/// `store` is NULL or a live handle; `name` as [`args::name`]; `out` is
/// NULL or writable (NULL `store` or `out`: `GRANARY_EINVAL`).
unsafe fn hand_out_ns(
    store: *const granary_store,
    name: *const u8,
    name_len: usize,
    out: *mut *mut granary_ns,
    open: impl FnOnce(&::granary_store::Store, &str) -> Res<Namespace>,
) -> granary_status {
    guard(|| {
        // SAFETY: each pointer as the caller promised (see # Safety).
        let out = unsafe { args::out_handle(out, "out") }?;
        // SAFETY: as above.
        let (s, name) = unsafe { (args::handle(store, "store")?, args::name(name, name_len)?) };
        let ns = open(&s.shared.store, name)?;
        *out = Box::into_raw(Box::new(granary_ns { ns, store_id: s.shared.id, gate: s.shared.gate.clone() }));
        Ok(())
    })
}
