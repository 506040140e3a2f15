//! One hopscotch table: `slots + H - 1` atomic 8-byte entries and an array of
//! region locks.
//!
//! Invariants:
//! - An entry at slot `s` with offset `o` has home slot `s - o`, `o < H`.
//!   The table has `H - 1` extra slots past the last home, so neighbourhoods
//!   never wrap around.
//! - Every read or write of a slot happens under the lock of the region that
//!   holds the slot. A lookup of home `b` locks the regions of `b` and of
//!   `b + H - 1` (often the same one); an insert locks the region of `b` and
//!   the next one and only touches slots inside those two. So an operation
//!   holds at most two locks, always taken in increasing order, and
//!   displacement never crosses more than two regions.
//! - Lookups scan the whole neighbourhood: deletions leave holes, so the
//!   first free slot says nothing about the slots after it.
//!
//! Slots are atomics only so that they can be shared between threads without
//! `unsafe`; all accesses happen under a region lock, so `Relaxed` suffices
//! (the mutex orders them).

use crate::entry::Entry;
use crate::NEIGHBOURHOOD as H;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

pub(crate) struct Table {
    slots: Box<[AtomicU64]>,
    locks: Box<[Mutex<()>]>,
    region_log2: u32,
}

/// Locks held by one operation: one or two regions, in increasing order.
pub(crate) struct Held<'a> {
    _a: MutexGuard<'a, ()>,
    _b: Option<MutexGuard<'a, ()>>,
    lo: usize,
    hi: usize,
}

fn lock(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    // A panic while holding a region lock leaves no half-written entry
    // (entries are single atomic stores), so a poisoned lock is safe to use.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Table {
    pub(crate) fn new(homes: usize, region_log2: u32) -> Table {
        let len = homes + H - 1;
        let regions = len.div_ceil(1 << region_log2);
        Table {
            slots: (0..len).map(|_| AtomicU64::new(Entry::FREE.0)).collect(),
            locks: (0..regions).map(|_| Mutex::new(())).collect(),
            region_log2,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.slots.len() * 8 + self.locks.len() * std::mem::size_of::<Mutex<()>>()
    }

    pub(crate) fn get(&self, slot: usize) -> Entry {
        Entry(self.slots[slot].load(Relaxed))
    }

    fn set(&self, slot: usize, e: Entry) {
        self.slots[slot].store(e.0, Relaxed)
    }

    fn region(&self, slot: usize) -> usize {
        slot >> self.region_log2
    }

    /// Lock for reading or changing the neighbourhood of `home`.
    pub(crate) fn lock_neighbourhood(&self, home: usize) -> Held<'_> {
        let (ra, rb) = (self.region(home), self.region(home + H - 1));
        self.lock_regions(ra, rb)
    }

    /// Lock for an insert at `home`: its region and the next one.
    pub(crate) fn lock_for_insert(&self, home: usize) -> Held<'_> {
        let ra = self.region(home);
        let rb = (ra + 1).min(self.locks.len() - 1);
        self.lock_regions(ra, rb)
    }

    fn lock_regions(&self, ra: usize, rb: usize) -> Held<'_> {
        debug_assert!(ra <= rb && rb - ra <= 1);
        let a = lock(&self.locks[ra]);
        let b = (rb != ra).then(|| lock(&self.locks[rb]));
        let lo = ra << self.region_log2;
        let hi = ((rb + 1) << self.region_log2).min(self.slots.len());
        Held {
            _a: a,
            _b: b,
            lo,
            hi,
        }
    }

    /// Slots in the neighbourhood of `home` whose entry has that home and tag.
    pub(crate) fn matches(
        &self,
        _held: &Held<'_>,
        home: usize,
        tag: u8,
        mut f: impl FnMut(usize, Entry),
    ) {
        for off in 0..H {
            let e = self.get(home + off);
            if !e.is_free() && e.neigh_off() as usize == off && e.tag() == tag {
                f(home + off, e);
            }
        }
    }

    /// Replace the entry of home `home` that points at `pba`.
    pub(crate) fn replace(
        &self,
        held: &Held<'_>,
        home: usize,
        tag: u8,
        pba: u64,
        new: Entry,
    ) -> bool {
        let mut done = false;
        self.matches(held, home, tag, |slot, e| {
            if !done && e.pba() == pba {
                self.set(slot, new.with_neigh_off((slot - home) as u32));
                done = true;
            }
        });
        done
    }

    /// Free the entry of home `home` that points at `pba`.
    pub(crate) fn remove(&self, held: &Held<'_>, home: usize, tag: u8, pba: u64) -> bool {
        let mut done = false;
        self.matches(held, home, tag, |slot, e| {
            if !done && e.pba() == pba {
                self.set(slot, Entry::FREE);
                done = true;
            }
        });
        done
    }

    /// Insert `new` (its offset is set here) with home `home`, displacing
    /// entries hopscotch-style within the locked regions. Returns false when
    /// no free slot can be brought into the neighbourhood: the caller grows.
    pub(crate) fn insert(&self, held: &Held<'_>, home: usize, new: Entry) -> bool {
        debug_assert!(held.lo <= home && home + H <= held.hi);
        let Some(mut free) = (home..held.hi).find(|&s| self.get(s).is_free()) else {
            return false;
        };
        while free - home >= H {
            // Find the entry furthest from `free` that may move into it: its
            // home must stay within H of `free`, and its slot must be inside
            // the locked regions.
            let first = (free + 1 - H).max(held.lo);
            let movable = (first..free).find_map(|s| {
                let e = self.get(s);
                if e.is_free() {
                    return None;
                }
                let ehome = s - e.neigh_off() as usize;
                (free - ehome < H).then_some((s, e, ehome))
            });
            let Some((s, e, ehome)) = movable else {
                return false;
            };
            self.set(free, e.with_neigh_off((free - ehome) as u32));
            self.set(s, Entry::FREE);
            free = s;
        }
        self.set(free, new.with_neigh_off((free - home) as u32));
        true
    }

    /// Move every entry into `lo` or `hi` by tag bit `bit`, keeping slots.
    /// Needs exclusive access to all three tables (the caller holds the
    /// directory's write lock).
    pub(crate) fn split_into(&self, bit: u32, lo: &Table, hi: &Table) {
        for s in 0..self.slots.len() {
            let e = self.get(s);
            if e.is_free() {
                continue;
            }
            let dest = if (e.tag() >> bit) & 1 == 1 { hi } else { lo };
            dest.set(s, e);
        }
    }
}
