//! The data calls, get, put and delete, once over an engine namespace
//! handle, and their exported forms on the store's default namespace
//! (`granary_get`, ...). `ns.rs` exports the same calls on a namespace
//! handle (`granary_ns_get`, ...).
//!
//! Buffer rules, the same for every call: a key or value is a pointer and
//! a length (any bytes, never NUL-terminated); a pointer may be NULL only
//! with a length of 0. A value read into the caller's buffer is copied
//! only when it fits whole: a buffer too small is left untouched and told
//! the length it needs.

use crate::args;
use crate::status::{granary_status, guard, Fail, Res};
use crate::store::granary_store;
use ::granary_store::{Namespace, PutMode, PutOutcome};

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
}

pub(crate) fn put_mode(mode: u32) -> Res<PutMode> {
    match mode {
        0 => Ok(PutMode::Upsert),
        1 => Ok(PutMode::CreateOnly),
        2 => Ok(PutMode::ReplaceOnly),
        m => Err(Fail::inval(format!("put mode {m} is not a granary_put_mode (0, 1 or 2)"))),
    }
}

fn not_found() -> Fail {
    Fail::fixed(granary_status::GRANARY_ENOTFOUND, c"the key holds no value")
}

/// Read `key` into the `*len` bytes at `buf`; `*len` becomes the value's
/// length when it is found (also when it does not fit).
///
/// # Safety
///
/// `key` as [`args::bytes`]; `buf` NULL or `*len` writable bytes; `len`
/// NULL or writable.
pub(crate) unsafe fn get(ns: &Namespace, key: *const u8, key_len: usize, buf: *mut u8, len: *mut usize) -> Res {
    // SAFETY: each pointer as the caller promised.
    let (key, len) = unsafe { (args::bytes(key, key_len, "key")?, args::out(len, "len")?) };
    // SAFETY: as the caller promised.
    let dst = unsafe { args::bytes_mut(buf, *len, "buf") }?;
    let v = ns.get_buf(key)?.ok_or_else(not_found)?;
    let value = v.value();
    *len = value.len();
    if value.len() > dst.len() {
        let msg = format!("the value is {} bytes, the buffer {}: call again with a larger one", value.len(), dst.len());
        return Err(Fail::new(granary_status::GRANARY_ETOOSMALL, msg));
    }
    dst[..value.len()].copy_from_slice(value);
    Ok(())
}

/// Read `key` into a new allocation (`granary_free` frees it).
///
/// # Safety
///
/// `key` as [`args::bytes`]; `value` and `len` NULL or writable.
pub(crate) unsafe fn get_alloc(
    ns: &Namespace,
    key: *const u8,
    key_len: usize,
    value: *mut *mut u8,
    len: *mut usize,
) -> Res {
    // SAFETY: each pointer as the caller promised.
    let (value, len) = unsafe { (args::out_handle(value, "value")?, args::out(len, "len")?) };
    *len = 0;
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
    match ns.put_with(key, value, put_mode(mode)?)? {
        PutOutcome::Stored => Ok(()),
        PutOutcome::Exists => {
            Err(Fail::fixed(granary_status::GRANARY_EEXISTS, c"the key holds a value (mode GRANARY_PUT_CREATE_ONLY)"))
        }
        PutOutcome::NotFound => Err(Fail::fixed(
            granary_status::GRANARY_ENOTFOUND,
            c"the key holds no value (mode GRANARY_PUT_REPLACE_ONLY)",
        )),
    }
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
    guard(|| unsafe { get(default_ns(store)?, key, key_len, buf, len) })
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
    guard(|| unsafe { get_alloc(default_ns(store)?, key, key_len, value, value_len) })
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
