//! The synchronisation primitives the index is built on: std's, or loom's
//! when the crate is built with `--cfg loom`, so the model-checking tests
//! (`loom_tests`, run by `scripts/loom.sh`) explore the interleavings of the
//! real lock, seqlock and migration code rather than of a copy of it.

#[cfg(loom)]
pub(crate) use loom::{
    hint::spin_loop,
    sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize},
    sync::{Mutex, MutexGuard},
};
#[cfg(not(loom))]
pub(crate) use std::{
    hint::spin_loop,
    sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize},
    sync::{Mutex, MutexGuard},
};

/// The pointer in `p`, with exclusive access (no atomic operation needed).
pub(crate) fn take_ptr<T>(p: &mut AtomicPtr<T>) -> *mut T {
    #[cfg(loom)]
    return p.with_mut(|p| *p);
    #[cfg(not(loom))]
    *p.get_mut()
}
