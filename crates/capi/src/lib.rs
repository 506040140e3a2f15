//! Granary's C API: the embedded engine ([`granary_store`]) behind opaque
//! handles, for C, C++, Go (cgo), Zig and anything else that calls C.
//! The header is `include/granary.h`, generated from this crate by
//! cbindgen (`tests/header.rs` checks it is current); docs/C.md is the
//! guide.
//!
//! Modules:
//! - `status`: the status codes, the thread-local last error message, and
//!   `guard`, which every exported function runs its body in.
//! - `args`: checking pointers, lengths, names and handles from C.
//! - `store`: the store handle: options, create, open, close, sync, stats,
//!   verify.
//! - `kv`: get, put and delete on the default namespace, plain and with
//!   an item's flags, expiry and CAS value.
//! - `ns`: namespace handles, create/drop/list, exports, and the data
//!   calls on them.
//! - `batch`: atomic batches, with CAS conditions.
//! - `scan`: cursors over the keys of a namespace.
//!
//! Rules every exported function keeps:
//! - No panic crosses into C: `status::guard` catches it and returns
//!   `GRANARY_EPANIC` with its message.
//! - Every pointer is checked before use (`args`): NULL where the contract
//!   does not allow it, or a length no object can have, is
//!   `GRANARY_EINVAL`. Keys, values, names and paths are a pointer and a
//!   length, never NUL-terminated.
//! - What the library allocates, it frees: handles by their close, commit
//!   or abort call, values of `granary_get_alloc` by `granary_free`.
//! - A store handle and namespace handles may be used from many threads at
//!   once; a batch or a scan by one thread at a time; each handle's last call is the
//!   one that frees it.

// In the order the header lists their functions (cbindgen follows it).
pub mod status;

pub mod store;

pub mod kv;

pub mod ns;

pub mod batch;

pub mod scan;

mod args;

pub use batch::granary_batch;
pub use kv::{granary_item, granary_put_mode};
pub use ns::{granary_ns, granary_ns_info, granary_ns_mode, granary_ns_options};
pub use scan::granary_scan;
pub use status::granary_status;
pub use store::{granary_durability, granary_options, granary_stats, granary_store, granary_verify_report};

/// The thread-safety the header promises, checked: store and namespace
/// handles are used from many threads at once, a batch moves between
/// threads.
const _: fn() = || {
    fn shared_between_threads<T: Send + Sync>() {}
    fn moved_between_threads<T: Send>() {}
    shared_between_threads::<granary_store>();
    shared_between_threads::<granary_ns>();
    moved_between_threads::<granary_batch>();
    moved_between_threads::<granary_scan>();
};
