//! The store's live counters of keys and operations: atomics bumped on
//! the paths that change them, read by `Store::stats`. A key's current
//! version is counted once, as a value or as a tombstone.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters of keys and operations.
#[derive(Default)]
pub(crate) struct Counters {
    pub keys: AtomicU64,
    pub tombstones: AtomicU64,
    pub user_bytes: AtomicU64,
    pub gets: AtomicU64,
    pub get_hits: AtomicU64,
    /// PUTs that replaced their key's candidate without reading it.
    pub blind: AtomicU64,
    pub puts: AtomicU64,
    pub deletes: AtomicU64,
}

impl Counters {
    /// A key's current version went from one kind to another.
    pub(crate) fn replaced(&self, was_tombstone: bool, is_tombstone: bool) {
        match (was_tombstone, is_tombstone) {
            (false, true) => {
                self.keys.fetch_sub(1, Relaxed);
                self.tombstones.fetch_add(1, Relaxed);
            }
            (true, false) => {
                self.tombstones.fetch_sub(1, Relaxed);
                self.keys.fetch_add(1, Relaxed);
            }
            _ => {}
        }
    }

    /// A key got its first indexed version.
    pub(crate) fn added(&self, is_tombstone: bool) {
        let c = if is_tombstone { &self.tombstones } else { &self.keys };
        c.fetch_add(1, Relaxed);
    }
}
