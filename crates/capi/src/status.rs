//! Status codes, the calling thread's last error message, and the guard
//! every exported function runs its body in.
//!
//! Invariants: no panic leaves an exported function (the guard catches it
//! and returns [`granary_status::GRANARY_EPANIC`]); every call that returns
//! a status other than `GRANARY_OK` has first stored a message for it in
//! the thread-local slot that `granary_last_error_message` reads; a call
//! that succeeds leaves the slot as it was (as `errno` is), so the success
//! path allocates nothing for messages.

use ::granary_store::Error;
use std::borrow::Cow;
use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What a call did: `GRANARY_OK`, one of the expected outcomes of a
/// request (`GRANARY_ENOTFOUND`, `GRANARY_EEXISTS`, `GRANARY_ETOOSMALL`,
/// `GRANARY_ECONFLICT`), or an error. Every value other than `GRANARY_OK`
/// comes with a message: `granary_last_error_message`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum granary_status {
    /// Success.
    GRANARY_OK = 0,
    /// The key holds no value (absent, deleted or expired): a get, a
    /// delete (`granary_delete_cas` too), or a put in mode
    /// `GRANARY_PUT_REPLACE_ONLY` or `GRANARY_PUT_CAS`. Nothing written.
    /// Also a scan that gave every key (`granary_scan_next`).
    GRANARY_ENOTFOUND = 1,
    /// A put in mode `GRANARY_PUT_CREATE_ONLY` found the key present, or
    /// a put in mode `GRANARY_PUT_CAS` or `granary_delete_cas` found
    /// another CAS value. Nothing written.
    GRANARY_EEXISTS = 2,
    /// The caller's buffer is smaller than the value; the length it needs
    /// was written to the length argument and the buffer was not touched.
    GRANARY_ETOOSMALL = 3,
    /// A condition of an atomic batch failed: nothing of it was applied
    /// (`granary_batch_commit` says which operation).
    GRANARY_ECONFLICT = 4,
    /// A bad argument: a NULL pointer, a length that does not fit, an
    /// unknown mode, a name that is not UTF-8, a handle of another store,
    /// or options the engine refuses.
    GRANARY_EINVAL = 10,
    /// The key is empty, too long, or in the engine's reserved range.
    GRANARY_EKEY = 11,
    /// The value is larger than one record of this store holds.
    GRANARY_ETOOLARGE = 12,
    /// The store (or its index) is full.
    GRANARY_ENOSPACE = 13,
    /// The write would take its namespace past its quota; nothing written.
    GRANARY_EQUOTA = 14,
    /// No namespace of that name (never created, or dropped).
    GRANARY_ENONAMESPACE = 15,
    /// A namespace of that name exists already.
    GRANARY_ENAMESPACEEXISTS = 16,
    /// A namespace name or option the store does not take.
    GRANARY_EBADNAMESPACE = 17,
    /// An atomic batch the store does not take (too many operations, too
    /// large, a key twice); nothing applied.
    GRANARY_EBATCH = 18,
    /// `granary_close` while a batch of the store is still open; the
    /// store stays open.
    GRANARY_EBUSY = 19,
    /// The store was closed (a namespace handle that outlived it).
    GRANARY_ECLOSED = 20,
    /// The device failed an operation, or could not be opened or created.
    GRANARY_EIO = 30,
    /// The path or device does not hold a Granary store this build reads.
    GRANARY_ENOTSTORE = 31,
    /// Data read back from the device failed its checks (or `granary_verify`
    /// found errors).
    GRANARY_ECORRUPT = 32,
    /// An earlier device failure: the store refuses writes until reopened.
    GRANARY_EPOISONED = 33,
    /// A bug: the library panicked. The message says where; the call had
    /// no effect or an unknown part of it.
    GRANARY_EPANIC = 40,
    /// An engine error this version of the API has no code for.
    GRANARY_EOTHER = 41,
}

use granary_status::*;

/// A status and its message: what a failed call returns and records.
pub(crate) struct Fail {
    pub code: granary_status,
    pub msg: Cow<'static, CStr>,
}

/// `Result` of the functions under the exported ones.
pub(crate) type Res<T = ()> = Result<T, Fail>;

impl Fail {
    pub fn new(code: granary_status, msg: impl Into<String>) -> Fail {
        Fail { code, msg: Cow::Owned(to_cstring(msg.into())) }
    }

    /// A failure whose message is fixed (no allocation: the not-found
    /// path of a GET is a hot one).
    pub fn fixed(code: granary_status, msg: &'static CStr) -> Fail {
        Fail { code, msg: Cow::Borrowed(msg) }
    }

    pub fn inval(msg: impl Into<String>) -> Fail {
        Fail::new(GRANARY_EINVAL, msg)
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        let code = match &e {
            Error::Io { .. } | Error::Device(_) => GRANARY_EIO,
            Error::NotAStore(_) => GRANARY_ENOTSTORE,
            Error::InvalidOptions(_) => GRANARY_EINVAL,
            Error::KeyLength { .. } | Error::ReservedKey => GRANARY_EKEY,
            Error::ValueTooLarge { .. } => GRANARY_ETOOLARGE,
            Error::NoSpace { .. } | Error::IndexFull(_) => GRANARY_ENOSPACE,
            Error::Corruption { .. } => GRANARY_ECORRUPT,
            Error::Poisoned { .. } => GRANARY_EPOISONED,
            Error::NoSuchNamespace { .. } => GRANARY_ENONAMESPACE,
            Error::NamespaceExists { .. } => GRANARY_ENAMESPACEEXISTS,
            Error::BadNamespace { .. } => GRANARY_EBADNAMESPACE,
            Error::QuotaExceeded { .. } => GRANARY_EQUOTA,
            Error::Closed => GRANARY_ECLOSED,
            Error::BadBatch(_) => GRANARY_EBATCH,
            _ => GRANARY_EOTHER,
        };
        Fail::new(code, e.to_string())
    }
}

/// `s` as a C string: interior NULs (an engine message quoting a key)
/// become `\0` so the message is never cut short.
fn to_cstring(s: String) -> CString {
    match CString::new(s) {
        Ok(c) => c,
        Err(e) => {
            let s = String::from_utf8_lossy(&e.into_vec()).replace('\0', "\\0");
            CString::new(s).unwrap_or_default()
        }
    }
}

thread_local! {
    /// The message of the last call on this thread that did not return
    /// `GRANARY_OK`.
    static LAST_ERROR: RefCell<Cow<'static, CStr>> = const { RefCell::new(Cow::Borrowed(c"no error")) };
}

fn record(msg: Cow<'static, CStr>) {
    // `try_with`: a call made while the thread is being torn down (from
    // another thread-local's destructor) still returns its status.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = msg);
}

/// Run an exported function's body: its result as a status, its failure's
/// message recorded, and a panic caught and turned into `GRANARY_EPANIC`.
pub(crate) fn guard(f: impl FnOnce() -> Res) -> granary_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => GRANARY_OK,
        Ok(Err(fail)) => {
            record(fail.msg);
            fail.code
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with no message".to_string());
            record(Cow::Owned(to_cstring(format!("internal error (a bug in granary, please report it): {what}"))));
            GRANARY_EPANIC
        }
    }
}

/// [`guard`] for functions with no status to return (the ones that free):
/// a panic is swallowed (and its message recorded).
pub(crate) fn guard_void(f: impl FnOnce()) {
    let _ = guard(|| {
        f();
        Ok(())
    });
}

/// The message of the last call on this thread that returned a status
/// other than `GRANARY_OK` ("no error" before any did): what went wrong
/// and what to do about it, NUL-terminated, in UTF-8.
///
/// Ownership and lifetime: the text belongs to the library and stays valid
/// until the next granary call on this thread; copy it to keep it. Never
/// free it. A successful call leaves it unchanged.
///
/// Thread safety: each thread has its own message; callable from any thread.
///
/// # Safety
///
/// `len` is NULL or points to a writable `size_t`, which receives the
/// message's length in bytes (without the NUL).
#[no_mangle]
pub unsafe extern "C" fn granary_last_error_message(len: *mut usize) -> *const c_char {
    let r = catch_unwind(|| {
        LAST_ERROR
            .try_with(|slot| {
                let slot = slot.borrow();
                (slot.as_ptr(), slot.to_bytes().len())
            })
            .unwrap_or((c"the thread is exiting".as_ptr(), 21))
    });
    let (p, n) = r.unwrap_or((c"internal error".as_ptr(), 14));
    if !len.is_null() {
        // SAFETY: the caller passes NULL or a writable size_t.
        unsafe { *len = n };
    }
    p
}

/// The name of status `code` (`"GRANARY_ENOTFOUND"`), NUL-terminated;
/// `"GRANARY_UNKNOWN"` for a number that is not a status. The text is
/// static: never freed, valid for ever. Thread-safe.
#[no_mangle]
pub extern "C" fn granary_status_name(code: i32) -> *const c_char {
    let name: &'static CStr = match code {
        0 => c"GRANARY_OK",
        1 => c"GRANARY_ENOTFOUND",
        2 => c"GRANARY_EEXISTS",
        3 => c"GRANARY_ETOOSMALL",
        4 => c"GRANARY_ECONFLICT",
        10 => c"GRANARY_EINVAL",
        11 => c"GRANARY_EKEY",
        12 => c"GRANARY_ETOOLARGE",
        13 => c"GRANARY_ENOSPACE",
        14 => c"GRANARY_EQUOTA",
        15 => c"GRANARY_ENONAMESPACE",
        16 => c"GRANARY_ENAMESPACEEXISTS",
        17 => c"GRANARY_EBADNAMESPACE",
        18 => c"GRANARY_EBATCH",
        19 => c"GRANARY_EBUSY",
        20 => c"GRANARY_ECLOSED",
        30 => c"GRANARY_EIO",
        31 => c"GRANARY_ENOTSTORE",
        32 => c"GRANARY_ECORRUPT",
        33 => c"GRANARY_EPOISONED",
        40 => c"GRANARY_EPANIC",
        41 => c"GRANARY_EOTHER",
        _ => c"GRANARY_UNKNOWN",
    };
    name.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        // SAFETY: NULL length; the pointer is read before any other call.
        unsafe { CStr::from_ptr(granary_last_error_message(std::ptr::null_mut())) }.to_string_lossy().into_owned()
    }

    #[test]
    fn panic_becomes_a_status_with_its_message() {
        let code = guard(|| panic!("boom {}", 7));
        assert_eq!(code, GRANARY_EPANIC);
        assert!(last().contains("boom 7"), "{}", last());
    }

    #[test]
    fn success_keeps_the_last_message() {
        assert_eq!(guard(|| Err(Fail::inval("first"))), GRANARY_EINVAL);
        assert_eq!(guard(|| Ok(())), GRANARY_OK);
        assert_eq!(last(), "first");
    }

    #[test]
    fn nul_in_a_message_is_escaped() {
        assert_eq!(guard(|| Err(Fail::inval("a\0b"))), GRANARY_EINVAL);
        assert_eq!(last(), "a\\0b");
    }

    #[test]
    fn every_status_has_its_name() {
        let all = [
            GRANARY_OK,
            GRANARY_ENOTFOUND,
            GRANARY_EEXISTS,
            GRANARY_ETOOSMALL,
            GRANARY_ECONFLICT,
            GRANARY_EINVAL,
            GRANARY_EKEY,
            GRANARY_ETOOLARGE,
            GRANARY_ENOSPACE,
            GRANARY_EQUOTA,
            GRANARY_ENONAMESPACE,
            GRANARY_ENAMESPACEEXISTS,
            GRANARY_EBADNAMESPACE,
            GRANARY_EBATCH,
            GRANARY_EBUSY,
            GRANARY_ECLOSED,
            GRANARY_EIO,
            GRANARY_ENOTSTORE,
            GRANARY_ECORRUPT,
            GRANARY_EPOISONED,
            GRANARY_EPANIC,
            GRANARY_EOTHER,
        ];
        for s in all {
            // SAFETY: the names are static C strings.
            let name = unsafe { CStr::from_ptr(granary_status_name(s as i32)) }.to_str().unwrap();
            assert_eq!(name, format!("{s:?}"));
        }
        // SAFETY: as above.
        let unknown = unsafe { CStr::from_ptr(granary_status_name(-1)) };
        assert_eq!(unknown.to_str().unwrap(), "GRANARY_UNKNOWN");
    }
}
