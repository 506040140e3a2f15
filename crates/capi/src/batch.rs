//! Atomic batches: puts (with modes, metadata and CAS conditions), deletes
//! (plain or by CAS value) and conditions alone over keys of any
//! namespaces of one store, committed all or nothing.
//!
//! A `granary_batch` gathers its operations itself (copies of the keys and
//! values, and engine namespace handles) and gives them to the engine's
//! batch at commit. It holds the store's shared state, so `granary_close`
//! refuses to close the store under it (`GRANARY_EBUSY`); every namespace
//! handle given to it is checked to be of that store (`GRANARY_EINVAL`
//! otherwise). Commit and abort free it.

use crate::args;
use crate::kv::{granary_item, put_cond};
use crate::ns::granary_ns;
use crate::status::{granary_status, guard, guard_void, Fail, Res};
use crate::store::{granary_store, Shared};
use ::granary_store::{BatchOp, BatchOutcome, Cond, ItemMeta, Namespace, PutOutcome, BATCH_OPS_MAX};
use std::sync::Arc;

/// An atomic batch being built (`granary_batch_begin`), freed by
/// `granary_batch_commit` or `granary_batch_abort`.
///
/// Thread safety: one call at a time on a batch (it may move between
/// threads); other threads may use the store meanwhile. While it is open,
/// `granary_close` of its store returns `GRANARY_EBUSY`.
#[allow(non_camel_case_types)]
pub struct granary_batch {
    shared: Arc<Shared>,
    ops: Vec<(Namespace, Vec<u8>, BatchOp)>,
}

impl granary_batch {
    /// The engine namespace of `ns` (NULL: the default one), checked to be
    /// of this batch's store.
    fn namespace(&self, ns: Option<&granary_ns>) -> Res<Namespace> {
        match ns {
            None => Ok(self.shared.default_ns.clone()),
            Some(h) if h.store_id == self.shared.id => Ok(h.ns.clone()),
            Some(_) => Err(Fail::inval("the namespace handle is of another store than the batch")),
        }
    }

    fn push(&mut self, ns: Namespace, key: &[u8], op: BatchOp) -> Res {
        if self.ops.len() >= BATCH_OPS_MAX {
            let msg = format!("a batch holds at most {BATCH_OPS_MAX} operations");
            return Err(Fail::new(granary_status::GRANARY_EBATCH, msg));
        }
        check_key_len(key)?;
        self.ops.push((ns, key.to_vec(), op));
        Ok(())
    }
}

/// A key longer than any the engine stores is refused before it is
/// copied (a copy of a caller's huge length could exhaust memory, which
/// aborts the process); the rest of the key's checks are the commit's.
fn check_key_len(key: &[u8]) -> Res {
    if key.len() > ::granary_store::KEY_BYTES_MAX {
        let max = ::granary_store::KEY_BYTES_MAX;
        return Err(::granary_store::Error::KeyLength { len: key.len(), min: 1, max }.into());
    }
    Ok(())
}

/// A value longer than the store holds for `key` in `ns` is refused before
/// it is copied, as `granary_put` refuses it.
fn check_value_len(ns: &Namespace, key: &[u8], value: &[u8]) -> Res {
    check_key_len(key)?;
    let max = ns.value_bytes_max(key.len());
    if value.len() as u64 > max {
        return Err(::granary_store::Error::ValueTooLarge { len: value.len() as u64, max }.into());
    }
    Ok(())
}

/// Begin an empty batch on `store`: on `GRANARY_OK`, `*out` is the batch;
/// otherwise NULL. Nothing is written until `granary_batch_commit`.
/// Thread-safe (each thread may build batches of its own).
///
/// # Safety
///
/// `store` is NULL or a live handle; `out` points to a writable
/// `granary_batch *`. NULL for either: `GRANARY_EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn granary_batch_begin(
    store: *const granary_store,
    out: *mut *mut granary_batch,
) -> granary_status {
    guard(|| {
        // SAFETY: each pointer as the caller promised (see # Safety).
        let (out, s) = unsafe { (args::out_handle(out, "out")?, args::handle(store, "store")?) };
        *out = Box::into_raw(Box::new(granary_batch { shared: s.shared.clone(), ops: Vec::new() }));
        Ok(())
    })
}

/// Add a put of `key` = `value` in namespace `ns` (NULL: the default
/// namespace) to the batch, as `mode` (a `granary_put_mode`) says: the
/// mode's condition is checked at commit, and if it fails nothing of the
/// batch is applied. The bytes are copied. A value longer than the store
/// holds for the key is refused here (`GRANARY_ETOOLARGE`, as
/// `granary_put`), as is a key over 65,536 bytes (`GRANARY_EKEY`), before
/// anything is copied; the keys' other checks are the commit's. A key may
/// appear once per batch. `GRANARY_EBATCH` past the batch's limit of
/// operations (1024).
///
/// # Safety
///
/// `batch` is NULL or a live batch used by no other call now; `ns` is NULL
/// or a live namespace handle; `key` and `value` point to `key_len` and
/// `value_len` readable bytes (each NULL only with a length of 0). A NULL
/// `batch`, or a NULL buffer with a length: `GRANARY_EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn granary_batch_put(
    batch: *mut granary_batch,
    ns: *const granary_ns,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
    mode: u32,
) -> granary_status {
    // SAFETY: the caller's promises, passed on (no item: flags 0, no
    // expiry, and mode GRANARY_PUT_CAS refused).
    unsafe { granary_batch_put_item(batch, ns, key, key_len, value, value_len, mode, std::ptr::null()) }
}

/// Add a delete of `key` in namespace `ns` (NULL: the default namespace)
/// to the batch (a key holding no value is no failure: nothing to do).
///
/// # Safety
///
/// As for `granary_batch_put`, without the value.
#[no_mangle]
pub unsafe extern "C" fn granary_batch_delete(
    batch: *mut granary_batch,
    ns: *const granary_ns,
    key: *const u8,
    key_len: usize,
) -> granary_status {
    guard(|| {
        // SAFETY: each pointer as the caller promised (see # Safety).
        let (b, ns, key) =
            unsafe { (args::handle_mut(batch, "batch")?, ns.as_ref(), args::bytes(key, key_len, "key")?) };
        let ns = b.namespace(ns)?;
        b.push(ns, key, BatchOp::Delete)
    })
}

/// Operations added to the batch so far (0 for NULL).
///
/// # Safety
///
/// `batch` is NULL or a live batch used by no other call now.
#[no_mangle]
pub unsafe extern "C" fn granary_batch_len(batch: *const granary_batch) -> usize {
    // SAFETY: NULL or live, by the caller's promise.
    unsafe { batch.as_ref() }.map_or(0, |b| b.ops.len())
}

/// Add a put of `key` = `value` in namespace `ns` (NULL: the default
/// namespace) with `item`'s flags and expiry (NULL: none), as `mode` says:
/// `granary_batch_put`'s modes, and `GRANARY_PUT_CAS`, the condition that
/// the key holds a value whose CAS value is `item->cas` (`item` NULL:
/// `GRANARY_EINVAL`). Conditions are checked at commit.
///
/// # Safety
///
/// As for `granary_batch_put`; `item` is NULL or points to a
/// `granary_item`.
#[no_mangle]
// The arguments of the C call, one by one.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn granary_batch_put_item(
    batch: *mut granary_batch,
    ns: *const granary_ns,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
    mode: u32,
    item: *const granary_item,
) -> granary_status {
    guard(|| {
        // SAFETY: each pointer as the caller promised (see # Safety).
        let (b, ns, key, value, item) = unsafe {
            (
                args::handle_mut(batch, "batch")?,
                ns.as_ref(),
                args::bytes(key, key_len, "key")?,
                args::bytes(value, value_len, "value")?,
                item.as_ref(),
            )
        };
        let it = item.copied().unwrap_or_default();
        let cond = put_cond(mode, item.map(|i| i.cas))?;
        let ns = b.namespace(ns)?;
        check_value_len(&ns, key, value)?;
        let (value, meta) = (value.to_vec(), ItemMeta::new(it.flags, it.expires));
        let op = match cond {
            Cond::Always => BatchOp::Put { value, meta },
            Cond::Absent => BatchOp::PutAbsent { value, meta },
            Cond::Present => BatchOp::PutPresent { value, meta },
            Cond::Cas(cas) => BatchOp::Cas { cas, value, meta },
        };
        b.push(ns, key, op)
    })
}

/// Add a delete of `key` in namespace `ns` (NULL: the default namespace)
/// under the condition that it holds a value whose CAS value is `cas`
/// (checked at commit: a key holding another CAS value, or none, fails
/// the commit with `GRANARY_ECONFLICT`).
///
/// # Safety
///
/// As for `granary_batch_delete`.
#[no_mangle]
pub unsafe extern "C" fn granary_batch_delete_cas(
    batch: *mut granary_batch,
    ns: *const granary_ns,
    key: *const u8,
    key_len: usize,
    cas: u64,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { push_key_op(batch, ns, key, key_len, BatchOp::DeleteCas { cas }) })
}

/// Add a condition alone, writing nothing, on `key` in namespace `ns`
/// (NULL: the default namespace): at commit, the key holds a value whose
/// CAS value is `cas`, else the commit fails with `GRANARY_ECONFLICT` and
/// applies nothing (Redis WATCH). The key cannot be written by the same
/// batch (a key appears once per batch).
///
/// # Safety
///
/// As for `granary_batch_delete`.
#[no_mangle]
pub unsafe extern "C" fn granary_batch_check_cas(
    batch: *mut granary_batch,
    ns: *const granary_ns,
    key: *const u8,
    key_len: usize,
    cas: u64,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { push_key_op(batch, ns, key, key_len, BatchOp::Check { cas: Some(cas) }) })
}

/// Add a condition alone, writing nothing: at commit, `key` in namespace
/// `ns` (NULL: the default namespace) holds no value, else the commit
/// fails with `GRANARY_ECONFLICT` and applies nothing.
///
/// # Safety
///
/// As for `granary_batch_delete`.
#[no_mangle]
pub unsafe extern "C" fn granary_batch_check_absent(
    batch: *mut granary_batch,
    ns: *const granary_ns,
    key: *const u8,
    key_len: usize,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { push_key_op(batch, ns, key, key_len, BatchOp::Check { cas: None }) })
}

/// Add `op` of `key` in `ns` (NULL: the default namespace) to `batch`.
///
/// # Safety
///
/// As for `granary_batch_delete`.
unsafe fn push_key_op(
    batch: *mut granary_batch,
    ns: *const granary_ns,
    key: *const u8,
    key_len: usize,
    op: BatchOp,
) -> Res {
    // SAFETY: each pointer as the caller promised.
    let (b, ns, key) = unsafe { (args::handle_mut(batch, "batch")?, ns.as_ref(), args::bytes(key, key_len, "key")?) };
    let ns = b.namespace(ns)?;
    b.push(ns, key, op)
}

/// Commit the batch: every operation applied, or none. `GRANARY_OK`: all
/// applied, durable as the store's durability option says, and no reader
/// sees some of them without the others. `GRANARY_ECONFLICT`: the
/// condition of operation number `*failed_op` (counted from 0 in the order
/// added) failed, and nothing was applied; the message says how. Any other
/// status: nothing was applied. The batch is freed whatever the status
/// (but `GRANARY_EINVAL` for a NULL batch).
///
/// # Safety
///
/// `batch` is NULL or a live batch used by no other call now, and not
/// used after this call; `failed_op` is NULL or points to a writable
/// `size_t`, written only with `GRANARY_ECONFLICT`.
#[no_mangle]
pub unsafe extern "C" fn granary_batch_commit(batch: *mut granary_batch, failed_op: *mut usize) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { commit(batch, std::ptr::null_mut(), 0, failed_op) })
}

/// `granary_batch_commit`, and on `GRANARY_OK` each operation's new CAS
/// value: `cas[i]` for operation `i` (counted from 0 in the order added)
/// while `i < cas_len`; 0 for a delete or a condition alone. `cas` is
/// untouched by any other status.
///
/// # Safety
///
/// As for `granary_batch_commit`; `cas` points to `cas_len` writable
/// `uint64_t` (NULL only with `cas_len` 0).
#[no_mangle]
pub unsafe extern "C" fn granary_batch_commit_cas(
    batch: *mut granary_batch,
    cas: *mut u64,
    cas_len: usize,
    failed_op: *mut usize,
) -> granary_status {
    // SAFETY: the caller's promises, passed on.
    guard(|| unsafe { commit(batch, cas, cas_len, failed_op) })
}

/// Commit `batch` (freeing it), its CAS values to `cas[..cas_len]`.
///
/// # Safety
///
/// As for `granary_batch_commit_cas`.
unsafe fn commit(batch: *mut granary_batch, cas: *mut u64, cas_len: usize, failed_op: *mut usize) -> Res {
    if batch.is_null() {
        return Err(Fail::inval("batch is NULL"));
    }
    // SAFETY: made by `Box::into_raw` in `granary_batch_begin`, live,
    // and not used again, as the caller promised.
    let granary_batch { shared, ops } = *unsafe { Box::from_raw(batch) };
    if cas.is_null() && cas_len != 0 {
        return Err(Fail::inval(format!("cas is NULL but its length is {cas_len}")));
    }
    if cas_len > isize::MAX as usize / 8 {
        return Err(Fail::inval(format!("the length of cas ({cas_len}) is larger than any array")));
    }
    let mut b = shared.store.batch();
    for (ns, key, op) in ops {
        b.op(&ns, &key, op);
    }
    match b.commit()? {
        BatchOutcome::Committed { cas: values } => {
            if cas_len > 0 {
                // SAFETY: non-NULL and in range (checked above), writable
                // for `cas_len` values by the caller's promise.
                let out = unsafe { std::slice::from_raw_parts_mut(cas, cas_len) };
                for (o, v) in out.iter_mut().zip(values) {
                    *o = v;
                }
            }
            Ok(())
        }
        BatchOutcome::ConditionFailed { op, outcome } => {
            // SAFETY: NULL or writable, by the caller's promise.
            unsafe { args::set_opt(failed_op, op) };
            let why = match outcome {
                PutOutcome::Exists => "its key holds a value (or one of another CAS value)",
                PutOutcome::NotFound => "its key holds no value",
                PutOutcome::Stored => "its condition failed",
            };
            let msg = format!("operation {op} of the batch was refused ({why}): nothing was applied");
            Err(Fail::new(granary_status::GRANARY_ECONFLICT, msg))
        }
    }
}

/// Discard the batch: nothing of it is applied, and it is freed. NULL is
/// ignored.
///
/// # Safety
///
/// `batch` is NULL or a live batch used by no other call now, and not
/// used after this call.
#[no_mangle]
pub unsafe extern "C" fn granary_batch_abort(batch: *mut granary_batch) {
    guard_void(|| {
        if !batch.is_null() {
            // SAFETY: made by `Box::into_raw` in `granary_batch_begin`,
            // live, and not used again, as the caller promised.
            drop(unsafe { Box::from_raw(batch) });
        }
    })
}
