//! The data calls, get, put and delete (plain, and with an item's flags,
//! expiry and CAS value), once over an engine namespace handle, and their
//! exported forms on the store's default namespace (`granary_get`, ...).
//! `ns.rs` exports the same calls on a namespace handle (`granary_ns_get`,
//! ...).
//!
//! Buffer rules, the same for every call: a key or value is a pointer and
//! a length (any bytes, never NUL-terminated); a pointer may be NULL only
//! with a length of 0. A value read into the caller's buffer is copied
//! only when it fits whole: a buffer too small is left untouched and told
//! the length it needs.

use crate::args;
use crate::status::{granary_status, guard, Fail, Res};
use crate::store::granary_store;
use ::granary_store::{Change, Cond, ItemMeta, Namespace, PutMode, PutOutcome};

/// How a put treats a key that exists (`mode` of the put calls).
#[allow(non_camel_case_types)]
#[repr(C)]
pub enum granary_put_mode {
    /// Insert or overwrite.
    GRANARY_PUT_UPSERT = 0,
    /// Only if the key holds no value, else `GRANARY_EEXISTS` (memcache `add`).
    GRANARY_PUT_CREATE_ONLY = 1,
    /// Only if the key holds a value, else `GRANARY_ENOTFOUND` (memcache
    /// `replace`).
    GRANARY_PUT_REPLACE_ONLY = 2,
    /// Only if the key holds a value whose CAS value is the `cas` of the
    /// `granary_item` given (memcache `cas`): else `GRANARY_EEXISTS` (it
    /// holds another) or `GRANARY_ENOTFOUND` (it holds none). Only for the
    /// calls that take a `granary_item` (`granary_put_item`,
    /// `granary_batch_put_item`); `GRANARY_EINVAL` elsewhere.
    GRANARY_PUT_CAS = 3,
}

/// A value's metadata: what `granary_get_item` reads with the value, and
/// what `granary_put_item` writes with it.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct granary_item {
    /// Opaque to the store (memcache's client flags); 0 by default.
    pub flags: u32,
    /// When the value expires, in Unix seconds (from then on it reads as
    /// absent); 0: never (a put with 0 in a namespace with a default TTL
    /// gets that TTL).
    pub expires: u32,
    /// Read: the value's CAS value, unique in the store and changed by
    /// every write of the key. Put: the CAS value the key must hold, with
    /// mode `GRANARY_PUT_CAS` (ignored with other modes).
    pub cas: u64,
}

/// The engine's condition for put mode `mode` (a `granary_put_mode`),
/// with `cas` the expected CAS value of `GRANARY_PUT_CAS` (None where the
/// call takes none).
pub(crate) fn put_cond(mode: u32, cas: Option<u64>) -> Res<Cond> {
    match (mode, cas) {
        (0, _) => Ok(Cond::Always),
        (1, _) => Ok(Cond::Absent),
        (2, _) => Ok(Cond::Present),
        (3, Some(c)) => Ok(Cond::Cas(c)),
        (3, None) => Err(Fail::inval(
            "put mode GRANARY_PUT_CAS needs a CAS value: use granary_put_item (or granary_batch_put_item) with a granary_item",
        )),
        (m, _) => Err(Fail::inval(format!("put mode {m} is not a granary_put_mode (0 to 3)"))),
    }
}

/// `put_cond` for the calls without a CAS value, as the engine's mode.
pub(crate) fn put_mode(mode: u32) -> Res<PutMode> {
    Ok(match put_cond(mode, None)? {
        Cond::Absent => PutMode::CreateOnly,
        Cond::Present => PutMode::ReplaceOnly,
        _ => PutMode::Upsert,
    })
}

/// The status of a put refused by its condition.
pub(crate) fn refused(outcome: PutOutcome, cond: Cond) -> Res {
    match (outcome, cond) {
        (PutOutcome::Stored, _) => Ok(()),
        (PutOutcome::Exists, Cond::Cas(_)) => {
            Err(Fail::fixed(granary_status::GRANARY_EEXISTS, c"the key holds a value of another CAS value"))
        }
        (PutOutcome::Exists, _) => {
            Err(Fail::fixed(granary_status::GRANARY_EEXISTS, c"the key holds a value (mode GRANARY_PUT_CREATE_ONLY)"))
        }
        (PutOutcome::NotFound, Cond::Cas(_)) => {
            Err(Fail::fixed(granary_status::GRANARY_ENOTFOUND, c"the key holds no value (mode GRANARY_PUT_CAS)"))
        }
        (PutOutcome::NotFound, _) => Err(Fail::fixed(
            granary_status::GRANARY_ENOTFOUND,
            c"the key holds no value (mode GRANARY_PUT_REPLACE_ONLY)",
        )),
    }
}

fn not_found() -> Fail {
    Fail::fixed(granary_status::GRANARY_ENOTFOUND, c"the key holds no value")
}

/// The metadata of a value read.
fn item_of(v: &::granary_store::ValueBuf) -> granary_item {
    granary_item { flags: v.meta.flags, expires: v.meta.expires, cas: v.cas }
}

/// Read `key` into the `*len` bytes at `buf`; `*len` becomes the value's
/// length when it is found (also when it does not fit), and `*item` (when
/// `item` is not NULL) its metadata.
///
/// # Safety
///
/// `key` as [`args::bytes`]; `buf` NULL or `*len` writable bytes; `len`
/// NULL or writable; `item` NULL or writable.
pub(crate) unsafe fn get(
    ns: &Namespace,
    key: *const u8,
    key_len: usize,
    buf: *mut u8,
    len: *mut usize,
    item: *mut granary_item,
) -> Res {
    // SAFETY: each pointer as the caller promised.
    let (key, len) = unsafe { (args::bytes(key, key_len, "key")?, args::out(len, "len")?) };
    // The buffer may hold the key (a caller reusing one for both): its
    // `&mut` slice is made only once the key has been read.
    args::check_mut(buf, *len, "buf")?;
    let v = ns.get_buf(key)?.ok_or_else(not_found)?;
    // SAFETY: as the caller promised; the key is no longer read.
    let dst = unsafe { args::bytes_mut(buf, *len, "buf") }?;
    // SAFETY: NULL or writable, as the caller promised.
    unsafe { args::set_opt(item, item_of(&v)) };
    let value = v.value();
    *len = value.len();
    if value.len() > dst.len() {
        let msg = format!("the value is {} bytes, the buffer {}: call again with a larger one", value.len(), dst.len());
        return Err(Fail::new(granary_status::GRANARY_ETOOSMALL, msg));
    }
    dst[..value.len()].copy_from_slice(value);
    Ok(())
}

/// Read `key` into a new allocation (`granary_free` frees it), and its
/// metadata into `*item` when `item` is not NULL. `ns` and `item` are the
/// caller's checks of its handle and its item pointer: taken after the
/// outputs are cleared, so `*value` is NULL and `*value_len` 0 on any
/// error, as the header promises, a bad handle's included.
///
/// # Safety
///
/// `key` as [`args::bytes`]; `value`, `len` and `item` NULL or writable.
pub(crate) unsafe fn get_alloc<N: std::ops::Deref<Target = Namespace>>(
    ns: impl FnOnce() -> Res<N>,
    key: *const u8,
    key_len: usize,
    value: *mut *mut u8,
    len: *mut usize,
    item: impl FnOnce() -> Res<*mut granary_item>,
) -> Res {
    // Both outputs are cleared before either is checked: one NULL leaves
    // the other cleared too.
    // SAFETY: each pointer NULL or writable, as the caller promised.
    unsafe {
        args::set_opt(len, 0);
        args::set_opt(value, std::ptr::null_mut());
    }
    // SAFETY: each pointer as the caller promised.
    let len = unsafe { args::out(len, "len")? };
    // SAFETY: as the caller promised.
    let value = unsafe { args::out_handle(value, "value")? };
    let (ns, item) = (ns()?, item()?);
    // SAFETY: as the caller promised.
    let key = unsafe { args::bytes(key, key_len, "key") }?;
    let v = ns.get_buf(key)?.ok_or_else(not_found)?;
    let bytes = v.value();
    // At least one byte, so an empty value is a non-NULL pointer too.
    // SAFETY: malloc has no precondition; the result is checked.
    let p = unsafe { libc::malloc(bytes.len().max(1)) }.cast::<u8>();
    if p.is_null() {
        return Err(Fail::new(
            granary_status::GRANARY_ENOSPACE,
            format!("out of memory for a value of {} bytes", bytes.len()),
        ));
    }
    // SAFETY: `p` is a fresh allocation of at least `bytes.len()` bytes,
    // disjoint from `bytes`.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
    *value = p;
    *len = bytes.len();
    // SAFETY: NULL or writable, as the caller promised.
    unsafe { args::set_opt(item, item_of(&v)) };
    Ok(())
}

/// Put `key` = `value` as `mode` says.
///
/// # Safety
///
/// `key` and `value` as [`args::bytes`].
pub(crate) unsafe fn put(
    ns: &Namespace,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
    mode: u32,
) -> Res {
    // SAFETY: each pointer as the caller promised.
    let (key, value) = unsafe { (args::bytes(key, key_len, "key")?, args::bytes(value, value_len, "value")?) };
    let mode = put_mode(mode)?;
    refused(ns.put_with(key, value, mode)?, mode.into())
}

/// Put `key` = `value` with `item`'s flags and expiry (NULL: none), as
/// `mode` says (`GRANARY_PUT_CAS`: only over `item.cas`); the new CAS
/// value to `*cas_out` (when not NULL) once stored.
///
/// # Safety
///
/// `key` and `value` as [`args::bytes`]; `item` NULL or readable;
/// `cas_out` NULL or writable.
// The arguments of the C call, one by one.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn put_item(
    ns: &Namespace,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
    mode: u32,
    item: *const granary_item,
    cas_out: *mut u64,
) -> Res {
    // SAFETY: each pointer as the caller promised.
    let (key, value, item) =
        unsafe { (args::bytes(key, key_len, "key")?, args::bytes(value, value_len, "value")?, item.as_ref()) };
    let it = item.copied().unwrap_or_default();
    let cond = put_cond(mode, item.map(|i| i.cas))?;
    let (outcome, cas) = ns.put_item(key, value, ItemMeta::new(it.flags, it.expires), cond)?;
    refused(outcome, cond)?;
    // SAFETY: NULL or writable, as the caller promised.
    unsafe { args::set_opt(cas_out, cas) };
    Ok(())
}

/// Delete `key` only if it holds a value whose CAS value is `cas`.
///
/// # Safety
///
/// `key` as [`args::bytes`].
pub(crate) unsafe fn delete_cas(ns: &Namespace, key: *const u8, key_len: usize, cas: u64) -> Res {
    // SAFETY: as the caller promised.
    let key = unsafe { args::bytes(key, key_len, "key") }?;
    let (outcome, _) = ns.update(key, |item| match item {
        Some(i) if i.cas == cas => (Change::Delete, PutOutcome::Stored),
        Some(_) => (Change::Keep, PutOutcome::Exists),
        None => (Change::Keep, PutOutcome::NotFound),
    })?;
    refused(outcome, Cond::Cas(cas))
}

/// Delete `key`: `GRANARY_ENOTFOUND` if it held no value.
///
/// # Safety
///
/// `key` as [`args::bytes`].
pub(crate) unsafe fn delete(ns: &Namespace, key: *const u8, key_len: usize) -> Res {
    // SAFETY: as the caller promised.
    let key = unsafe { args::bytes(key, key_len, "key") }?;
    match ns.delete(key)? {
        true => Ok(()),
        false => Err(not_found()),
    }
}

/// The default namespace of store handle `s`.
///
/// # Safety
///
/// `s` is NULL or a live handle.
unsafe fn default_ns<'a>(s: *const granary_store) -> Res<&'a Namespace> {
    // SAFETY: as the caller promised.
    Ok(&unsafe { args::handle(s, "store") }?.shared.default_ns)
}

/// Read the value of `key` (in the default namespace) into the caller's
/// buffer: `*len` is the buffer's size on entry; on `GRANARY_OK` it is the
/// value's length and the value is in `buf[0 .. *len]`. If the value is
/// larger than the buffer: `GRANARY_ETOOSMALL`, `*len` set to the value's
/// length, the buffer untouched (so `*len = 0` with `buf` NULL asks only
/// the length). `GRANARY_ENOTFOUND` if the key holds no value. `*len` is
/// unchanged by any other status.
///
/// Thread-safe. The value is copied: the buffer is the caller's, before
/// and after.
///
/// # Safety
///
/// `store` is NULL or a live handle; `key` points to `key_len` readable
/// bytes (NULL only with `key_len` 0); `len` points to a writable
/// `size_t`; `buf` points to `*len` writable bytes (NULL only with `*len`
/// 0). A NULL that breaks these rules is `GRANARY_EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn granary_get(
    store: *const granary_store,
    key: *const u8,
    key_len: usize,
    buf: *mut u8,
    len: *mut usize,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { get(default_ns(store)?, key, key_len, buf, len, std::ptr::null_mut()) })
}

/// Read the value of `key` (in the default namespace) into memory the
/// library allocates: on `GRANARY_OK`, `*value` points to `*value_len`
/// bytes (never NULL, even for an empty value), which the caller owns and
/// frees with `granary_free`. On any other status `*value` is NULL and
/// `*value_len` 0. `GRANARY_ENOTFOUND` if the key holds no value.
/// Thread-safe.
///
/// # Safety
///
/// `store` is NULL or a live handle; `key` points to `key_len` readable
/// bytes (NULL only with `key_len` 0); `value` and `value_len` point to
/// writable objects of their types. A NULL that breaks these rules is
/// `GRANARY_EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn granary_get_alloc(
    store: *const granary_store,
    key: *const u8,
    key_len: usize,
    value: *mut *mut u8,
    value_len: *mut usize,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { get_alloc(|| default_ns(store), key, key_len, value, value_len, || Ok(std::ptr::null_mut())) })
}

/// Free a value `granary_get_alloc` or `granary_ns_get_alloc` returned.
/// NULL is ignored. Thread-safe (any thread may free it).
///
/// # Safety
///
/// `value` is NULL or a pointer those calls returned, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn granary_free(value: *mut u8) {
    // SAFETY: NULL or malloc'ed by `get_alloc` and not yet freed, as the
    // caller promised; free(NULL) does nothing.
    unsafe { libc::free(value.cast()) }
}

/// Store `value` (`value_len` bytes) under `key` in the default namespace,
/// as `mode` (a `granary_put_mode`) says: `GRANARY_OK` once it is written
/// (durable as the store's durability option says); `GRANARY_EEXISTS` or
/// `GRANARY_ENOTFOUND` when the mode's condition does not hold (nothing
/// written). The bytes are copied: the caller keeps its buffers.
/// Thread-safe: writes of one key are applied in some order, each whole.
///
/// # Safety
///
/// `store` is NULL or a live handle; `key` and `value` point to
/// `key_len` and `value_len` readable bytes (each NULL only with a length
/// of 0). A NULL that breaks these rules is `GRANARY_EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn granary_put(
    store: *const granary_store,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
    mode: u32,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { put(default_ns(store)?, key, key_len, value, value_len, mode) })
}

/// Delete `key` from the default namespace: `GRANARY_OK` if it held a
/// value, `GRANARY_ENOTFOUND` if not. Thread-safe.
///
/// # Safety
///
/// `store` is NULL or a live handle; `key` points to `key_len` readable
/// bytes (NULL only with `key_len` 0). A NULL that breaks these rules is
/// `GRANARY_EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn granary_delete(store: *const granary_store, key: *const u8, key_len: usize) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { delete(default_ns(store)?, key, key_len) })
}

/// `granary_get`, and the value's metadata (flags, expiry, CAS value) in
/// `*item`, written with `GRANARY_OK` and `GRANARY_ETOOSMALL` (the value
/// was found) and untouched otherwise.
///
/// # Safety
///
/// As for `granary_get`; `item` points to a writable `granary_item`
/// (NULL: `GRANARY_EINVAL`).
#[no_mangle]
pub unsafe extern "C" fn granary_get_item(
    store: *const granary_store,
    key: *const u8,
    key_len: usize,
    buf: *mut u8,
    len: *mut usize,
    item: *mut granary_item,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { get(default_ns(store)?, key, key_len, buf, len, args::out(item, "item")?) })
}

/// `granary_get_alloc`, and the value's metadata (flags, expiry, CAS
/// value) in `*item`, written with `GRANARY_OK` only.
///
/// # Safety
///
/// As for `granary_get_alloc`; `item` points to a writable
/// `granary_item` (NULL: `GRANARY_EINVAL`).
#[no_mangle]
pub unsafe extern "C" fn granary_get_item_alloc(
    store: *const granary_store,
    key: *const u8,
    key_len: usize,
    value: *mut *mut u8,
    value_len: *mut usize,
    item: *mut granary_item,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe {
        get_alloc(|| default_ns(store), key, key_len, value, value_len, || Ok(args::out(item, "item")? as *mut _))
    })
}

/// `granary_put` with metadata and CAS: the value is stored with
/// `item->flags` and `item->expires` (`item` NULL: flags 0, no expiry),
/// as `mode` says; with `GRANARY_PUT_CAS`, only if the key holds a value
/// whose CAS value is `item->cas` (`GRANARY_EEXISTS` if it holds another,
/// `GRANARY_ENOTFOUND` if none; `item` NULL: `GRANARY_EINVAL`). On
/// `GRANARY_OK`, `*cas_out` (unless NULL) is the new value's CAS value;
/// it is untouched otherwise. An expiry in the past stores a value that
/// reads as absent at once. Thread-safe; CAS checks and writes of one key
/// are atomic with respect to each other.
///
/// # Safety
///
/// As for `granary_put`; `item` is NULL or points to a `granary_item`;
/// `cas_out` is NULL or points to a writable `uint64_t`.
#[no_mangle]
// The arguments of the C call, one by one.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn granary_put_item(
    store: *const granary_store,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
    mode: u32,
    item: *const granary_item,
    cas_out: *mut u64,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { put_item(default_ns(store)?, key, key_len, value, value_len, mode, item, cas_out) })
}

/// Delete `key` from the default namespace only if it holds a value whose
/// CAS value is `cas`: `GRANARY_OK` if deleted, `GRANARY_EEXISTS` if it
/// holds a value of another CAS value, `GRANARY_ENOTFOUND` if it holds
/// none (nothing deleted). Thread-safe.
///
/// # Safety
///
/// As for `granary_delete`.
#[no_mangle]
pub unsafe extern "C" fn granary_delete_cas(
    store: *const granary_store,
    key: *const u8,
    key_len: usize,
    cas: u64,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { delete_cas(default_ns(store)?, key, key_len, cas) })
}
