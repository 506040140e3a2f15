//! Key scans: a cursor over the keys of one namespace (`granary_scan_open`,
//! `granary_ns_scan_open`, `granary_scan_next`, `granary_scan_close`).
//!
//! A `granary_scan` holds the engine's namespace handle, the engine's scan
//! cursor ([`Namespace::scan`]) and the page of keys it read last; `next`
//! hands out the page's keys one by one and reads the next page when the
//! page is used up, until the engine's cursor comes back to 0. The key a
//! call hands out lives in the handle's page, so it stays valid until the
//! handle's next call. The engine's guarantees are the scan's: every key
//! present for the whole scan comes once, a key that comes was live when
//! checked, keys written or deleted meanwhile may come or not; writers,
//! GC and other scans run meanwhile, and no lock is held between calls.

use crate::args;
use crate::ns::granary_ns;
use crate::status::{granary_status, guard, guard_void, Fail, Res};
use crate::store::{granary_store, Gate};
use ::granary_store::Namespace;
use std::sync::Arc;

/// Keys a page of a scan aims for: enough to amortize a page's walk,
/// few enough that a page's copies stay small.
const PAGE_KEYS: usize = 256;

/// A scan of the keys of one namespace (`granary_scan_open`,
/// `granary_ns_scan_open`), freed by `granary_scan_close`.
///
/// Thread safety: one call at a time on a scan (it may move between
/// threads); other threads may use the store meanwhile, writes included.
#[allow(non_camel_case_types)]
pub struct granary_scan {
    ns: Namespace,
    /// The store's (`store::Shared::gate`).
    gate: Arc<Gate>,
    /// The keys of the page read last, and how many were handed out.
    page: Vec<Vec<u8>>,
    at: usize,
    /// The engine's cursor of the next page.
    cursor: u64,
    /// The engine gave its last page (cursor 0 after the first one).
    last_page: bool,
}

impl granary_scan {
    fn new(ns: Namespace, gate: Arc<Gate>) -> granary_scan {
        granary_scan { ns, gate, page: Vec::new(), at: 0, cursor: 0, last_page: false }
    }

    /// The next key, or None once the scan is complete (and on every call
    /// after); else `Closed` once the store is closed and
    /// `NoSuchNamespace` once the namespace is dropped, even with keys of
    /// a page read before left.
    fn next(&mut self) -> Res<Option<&[u8]>> {
        if self.last_page && self.at >= self.page.len() {
            return Ok(None);
        }
        {
            let ns = self.gate.call(&self.ns);
            if ns.is_closed() {
                return Err(::granary_store::Error::Closed.into());
            }
            if ns.is_dropped() {
                return Err(::granary_store::Error::NoSuchNamespace { name: ns.name().into() }.into());
            }
        }
        // Each page walks homes the earlier ones did not, so the pages end
        // (an empty page with a cursor other than 0 only goes on).
        while self.at >= self.page.len() {
            if self.last_page {
                return Ok(None);
            }
            let page = self.gate.call(&self.ns).scan(self.cursor, PAGE_KEYS)?;
            self.page = page.keys;
            self.at = 0;
            self.cursor = page.cursor;
            self.last_page = page.cursor == 0;
        }
        self.at += 1;
        Ok(Some(&self.page[self.at - 1]))
    }
}

/// Begin a scan of the keys of the store's default namespace: on
/// `GRANARY_OK`, `*out` is the scan (read it with `granary_scan_next`,
/// free it with `granary_scan_close`); otherwise NULL. Nothing is read
/// until the first `granary_scan_next`. Thread-safe.
///
/// # Safety
///
/// `store` is NULL or a live handle; `out` points to a writable
/// `granary_scan *`. NULL for either: `GRANARY_EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn granary_scan_open(store: *const granary_store, out: *mut *mut granary_scan) -> granary_status {
    guard(|| {
        // SAFETY: each pointer as the caller promised (see # Safety).
        let (out, s) = unsafe { (args::out_handle(out, "out")?, args::handle(store, "store")?) };
        *out = Box::into_raw(Box::new(granary_scan::new(s.shared.default_ns.clone(), s.shared.gate.clone())));
        Ok(())
    })
}

/// `granary_scan_open` over the keys of the handle's namespace. The scan
/// does not need the namespace handle afterwards (it may be closed first).
/// `GRANARY_ECLOSED` once the handle's store is closed.
///
/// # Safety
///
/// `ns` is NULL or a live namespace handle; `out` as for
/// `granary_scan_open`.
#[no_mangle]
pub unsafe extern "C" fn granary_ns_scan_open(ns: *const granary_ns, out: *mut *mut granary_scan) -> granary_status {
    guard(|| {
        // SAFETY: each pointer as the caller promised (see # Safety).
        let (out, h) = unsafe { (args::out_handle(out, "out")?, args::handle(ns, "ns")?) };
        // A handle that outlived its store answers as its other calls do.
        if h.gate.call(&h.ns).is_closed() {
            return Err(::granary_store::Error::Closed.into());
        }
        *out = Box::into_raw(Box::new(granary_scan::new(h.ns.clone(), h.gate.clone())));
        Ok(())
    })
}

/// The scan's next key: `GRANARY_OK` with `*key` pointing to its
/// `*key_len` bytes, which belong to the scan and stay valid until the
/// scan's next call (`granary_scan_next` or `granary_scan_close`): copy
/// them to keep them. `GRANARY_ENOTFOUND` once every key has come (and on
/// every call after), with `*key` NULL and `*key_len` 0. Keys come in no
/// particular order; every key present for the whole scan comes exactly
/// once, a key that comes was live when checked, and keys written or
/// deleted during the scan may come or not. `GRANARY_ECLOSED` once the
/// store is closed, `GRANARY_ENONAMESPACE` once the namespace is dropped.
///
/// # Safety
///
/// `scan` is NULL or a live scan used by no other call now; `key` and
/// `key_len` point to writable objects of their types. A NULL that breaks
/// these rules is `GRANARY_EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn granary_scan_next(
    scan: *mut granary_scan,
    key: *mut *const u8,
    key_len: *mut usize,
) -> granary_status {
    guard(|| {
        // SAFETY: each pointer as the caller promised (see # Safety).
        let (s, key, key_len) =
            unsafe { (args::handle_mut(scan, "scan")?, args::out(key, "key")?, args::out(key_len, "key_len")?) };
        *key = std::ptr::null();
        *key_len = 0;
        match s.next()? {
            Some(k) => {
                *key = k.as_ptr();
                *key_len = k.len();
                Ok(())
            }
            None => Err(Fail::fixed(granary_status::GRANARY_ENOTFOUND, c"the scan is complete: no more keys")),
        }
    })
}

/// Free a scan (whether complete or not). NULL is ignored. No other call
/// on it may run during this one or start after it.
///
/// # Safety
///
/// `scan` is NULL or a live scan.
#[no_mangle]
pub unsafe extern "C" fn granary_scan_close(scan: *mut granary_scan) {
    guard_void(|| {
        if !scan.is_null() {
            // SAFETY: made by `Box::into_raw` above and live, as the caller
            // promised; the caller makes no other call on it.
            drop(unsafe { Box::from_raw(scan) });
        }
    })
}
