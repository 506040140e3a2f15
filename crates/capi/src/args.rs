//! Checking what C passes in: pointers with their lengths, names, handles
//! and out-parameters.
//!
//! Invariant: every pointer an exported function dereferences goes through
//! one of these first, so a NULL pointer, or a length that no object can
//! have, is `GRANARY_EINVAL` with a message naming the argument, never
//! undefined behaviour. (Whether a non-NULL pointer points at what the
//! contract says cannot be checked: that stays the caller's promise.)

use crate::status::{Fail, Res};

/// `len` bytes at `p`: empty for a length of 0 (whatever `p` is),
/// refused for a NULL `p` with a length, or a length past `isize::MAX`.
///
/// # Safety
///
/// Unless NULL, `p` points to `len` readable bytes that stay unchanged
/// for `'a`.
pub(crate) unsafe fn bytes<'a>(p: *const u8, len: usize, what: &str) -> Res<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Fail::inval(format!("{what} is NULL but its length is {len}")));
    }
    if len > isize::MAX as usize {
        return Err(Fail::inval(format!("the length of {what} ({len}) is larger than any object")));
    }
    // SAFETY: non-NULL, in range, and readable for `len` bytes by the
    // caller's promise.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// `len` writable bytes at `p`, as [`bytes`] checks them.
///
/// # Safety
///
/// Unless NULL, `p` points to `len` writable bytes that nothing else
/// touches for `'a`.
pub(crate) unsafe fn bytes_mut<'a>(p: *mut u8, len: usize, what: &str) -> Res<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    check_mut(p, len, what)?;
    // SAFETY: non-NULL, in range, writable and unaliased by the caller's
    // promise.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

/// [`bytes_mut`]'s checks alone, for a buffer whose slice is made later
/// (after what else may lie in the same bytes was read).
pub(crate) fn check_mut(p: *mut u8, len: usize, what: &str) -> Res<()> {
    if len > 0 && p.is_null() {
        return Err(Fail::inval(format!("{what} is NULL but its length is {len}")));
    }
    if len > isize::MAX as usize {
        return Err(Fail::inval(format!("the length of {what} ({len}) is larger than any object")));
    }
    Ok(())
}

/// A name (a namespace's) given as bytes and a length: UTF-8, not
/// NUL-terminated.
///
/// # Safety
///
/// As for [`bytes`].
pub(crate) unsafe fn name<'a>(p: *const u8, len: usize) -> Res<&'a str> {
    // SAFETY: the caller's promise, passed on.
    let b = unsafe { bytes(p, len, "the name") }?;
    std::str::from_utf8(b).map_err(|_| Fail::inval("the name is not UTF-8"))
}

/// A path given as bytes and a length (any bytes but NUL, as Unix takes).
///
/// # Safety
///
/// As for [`bytes`].
pub(crate) unsafe fn path<'a>(p: *const u8, len: usize) -> Res<&'a std::path::Path> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: the caller's promise, passed on.
    let b = unsafe { bytes(p, len, "the path") }?;
    if b.is_empty() {
        return Err(Fail::inval("the path is empty"));
    }
    if b.contains(&0) {
        return Err(Fail::inval("the path holds a NUL byte"));
    }
    Ok(std::path::Path::new(std::ffi::OsStr::from_bytes(b)))
}

/// The object behind handle `p`.
///
/// # Safety
///
/// Unless NULL, `p` is a live handle of this type (not yet closed or
/// freed), shared for `'a`.
pub(crate) unsafe fn handle<'a, T>(p: *const T, what: &str) -> Res<&'a T> {
    // SAFETY: NULL or live, by the caller's promise.
    unsafe { p.as_ref() }.ok_or_else(|| Fail::inval(format!("{what} is NULL")))
}

/// The object behind handle `p`, for its one user.
///
/// # Safety
///
/// Unless NULL, `p` is a live handle of this type that no other call uses
/// for `'a`.
pub(crate) unsafe fn handle_mut<'a, T>(p: *mut T, what: &str) -> Res<&'a mut T> {
    // SAFETY: NULL or live and unshared, by the caller's promise.
    unsafe { p.as_mut() }.ok_or_else(|| Fail::inval(format!("{what} is NULL")))
}

/// Out-parameter `p`, required.
///
/// # Safety
///
/// Unless NULL, `p` points to a writable `T`.
pub(crate) unsafe fn out<'a, T>(p: *mut T, what: &str) -> Res<&'a mut T> {
    // SAFETY: NULL or writable, by the caller's promise.
    unsafe { p.as_mut() }.ok_or_else(|| Fail::inval(format!("{what} is NULL")))
}

/// Out-parameter `p` for a new handle, required, set to NULL at once so
/// that it is NULL whatever error the call returns.
///
/// # Safety
///
/// Unless NULL, `p` points to a writable pointer.
pub(crate) unsafe fn out_handle<'a, T>(p: *mut *mut T, what: &str) -> Res<&'a mut *mut T> {
    // SAFETY: the caller's promise, passed on.
    let out = unsafe { out(p, what) }?;
    *out = std::ptr::null_mut();
    Ok(out)
}

/// Write `v` to out-parameter `p` when it is not NULL.
///
/// # Safety
///
/// Unless NULL, `p` points to a writable `T`.
pub(crate) unsafe fn set_opt<T>(p: *mut T, v: T) {
    // SAFETY: NULL or writable, by the caller's promise.
    if let Some(slot) = unsafe { p.as_mut() } {
        *slot = v;
    }
}
