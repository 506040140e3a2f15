//! The store's live counters of keys and operations: atomics bumped on
//! the paths that change them, read by `Store::stats`. A key's current
//! version is counted once, as a value or as a tombstone, store-wide; and
//! each namespace counts its values and their bytes ([`NsCounters`]), told
//! apart by the stored key ([`crate::nskey::owner`]).
//!
//! Every path that changes which version of a key is indexed reports it
//! here, with the key: [`Counters::added`], [`Counters::replaced`],
//! [`Counters::removed`]. The per-namespace counts wrap (a replacement
//! seen before the addition it follows, in a parallel recovery, dips below
//! zero for a moment).

use crate::nskey::{owner, Owner, DEFAULT_NS};
use crate::types::PutOutcome;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

/// A version of a key as the counters see it: a tombstone, or a value
/// whose record takes `bytes` (whole grains).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counted {
    pub tombstone: bool,
    pub bytes: u64,
}

impl Counted {
    pub(crate) fn new(tombstone: bool, bytes: u64) -> Counted {
        Counted { tombstone, bytes }
    }

    /// (values, value bytes) it adds to its namespace.
    fn ns(self) -> (u64, u64) {
        if self.tombstone {
            (0, 0)
        } else {
            (1, self.bytes)
        }
    }
}

/// One namespace's counters.
#[derive(Debug, Default)]
pub(crate) struct NsCounters {
    /// Values indexed (tombstones are not counted), and their records' bytes.
    pub keys: AtomicU64,
    pub value_bytes: AtomicU64,
    pub gets: AtomicU64,
    pub hits: AtomicU64,
    pub sets: AtomicU64,
    pub deletes: AtomicU64,
    /// Values GC evicted (cache mode) or found expired.
    pub evictions: AtomicU64,
    pub expirations: AtomicU64,
    /// Of those, the ones never read since they were written (or since
    /// the store opened: read state is not persisted).
    pub evicted_unfetched: AtomicU64,
    pub expired_unfetched: AtomicU64,
}

impl NsCounters {
    /// A GET, and whether it found a value.
    pub(crate) fn got(&self, hit: bool) {
        self.gets.fetch_add(1, Relaxed);
        if hit {
            self.hits.fetch_add(1, Relaxed);
        }
    }

    /// Add `old`'s operation counts (not its values and bytes) to these: a
    /// truncate's new generation goes on counting the namespace's
    /// operations since the store was opened.
    pub(crate) fn carry_operations(&self, old: &NsCounters) {
        for (to, from) in [
            (&self.gets, &old.gets),
            (&self.hits, &old.hits),
            (&self.sets, &old.sets),
            (&self.deletes, &old.deletes),
            (&self.evictions, &old.evictions),
            (&self.expirations, &old.expirations),
            (&self.evicted_unfetched, &old.evicted_unfetched),
            (&self.expired_unfetched, &old.expired_unfetched),
        ] {
            to.fetch_add(from.load(Relaxed), Relaxed);
        }
    }

    /// A write's outcome.
    pub(crate) fn stored(&self, outcome: PutOutcome) {
        if outcome == PutOutcome::Stored {
            self.sets.fetch_add(1, Relaxed);
        }
    }

    fn delta(&self, (k0, b0): (u64, u64), (k1, b1): (u64, u64)) {
        if k0 != k1 {
            self.keys.fetch_add(k1.wrapping_sub(k0), Relaxed);
        }
        if b0 != b1 {
            self.value_bytes.fetch_add(b1.wrapping_sub(b0), Relaxed);
        }
    }
}

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
    /// The default namespace's counters.
    pub default_ns: Arc<NsCounters>,
    /// Every other namespace's, by id: those of the catalog, and (during a
    /// recovery, before the catalog is read) any id a record names.
    pub ns: RwLock<HashMap<u32, Arc<NsCounters>>>,
}

impl Counters {
    /// The counters of namespace `id`, made if missing.
    pub(crate) fn ns_of(&self, id: u32) -> Arc<NsCounters> {
        if id == DEFAULT_NS {
            return self.default_ns.clone();
        }
        if let Some(c) = self.ns.read().unwrap_or_else(|e| e.into_inner()).get(&id) {
            return c.clone();
        }
        self.ns.write().unwrap_or_else(|e| e.into_inner()).entry(id).or_default().clone()
    }

    /// Run `f` on the counters of the namespace `key` (a stored key)
    /// belongs to; nothing for the engine's own keys, nor for an id with
    /// no counters (a dropped namespace's).
    pub(crate) fn with_ns(&self, key: &[u8], f: impl FnOnce(&NsCounters)) {
        match owner(key) {
            Owner::Ns(DEFAULT_NS) => f(&self.default_ns),
            Owner::Ns(id) => {
                if let Some(c) = self.ns.read().unwrap_or_else(|e| e.into_inner()).get(&id) {
                    f(c)
                }
            }
            Owner::Engine => {}
        }
    }

    /// `key`'s indexed version was `old` and is now `new`.
    pub(crate) fn replaced(&self, key: &[u8], old: Counted, new: Counted) {
        self.kind_changed(old.tombstone, new.tombstone);
        if old.ns() != new.ns() {
            self.with_ns(key, |c| c.delta(old.ns(), new.ns()));
        }
    }

    /// `key` got its first indexed version, `new`.
    pub(crate) fn added(&self, key: &[u8], new: Counted) {
        let c = if new.tombstone { &self.tombstones } else { &self.keys };
        c.fetch_add(1, Relaxed);
        self.with_ns(key, |c| c.delta((0, 0), new.ns()));
    }

    /// `key`'s indexed version, `old`, left the index with none in its place.
    pub(crate) fn removed(&self, key: &[u8], old: Counted) {
        let c = if old.tombstone { &self.tombstones } else { &self.keys };
        c.fetch_sub(1, Relaxed);
        self.with_ns(key, |c| c.delta(old.ns(), (0, 0)));
    }

    /// Store-wide: a key's current version went from one kind to another.
    fn kind_changed(&self, was_tombstone: bool, is_tombstone: bool) {
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
}

/// A wrapping counter read as a count: one past `i64::MAX` is briefly
/// below zero, read as 0. (A blind overwrite that displaced another
/// namespace's value counts that value out of the writer's namespace until
/// its link settles and counts it back.)
pub(crate) fn not_below_zero(v: u64) -> u64 {
    if v > i64::MAX as u64 {
        0
    } else {
        v
    }
}
