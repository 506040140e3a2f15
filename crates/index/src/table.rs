//! One hopscotch table: `homes + H - 1` atomic 8-byte slots, and the
//! hopscotch algorithms over a range of slots the caller has locked.
//!
//! Invariants:
//! - An entry at slot `s` with offset `o` has home slot `s - o`, `o < H`.
//!   The table has `H - 1` extra slots past the last home, so neighbourhoods
//!   never wrap around.
//! - Every read or write of a slot happens under the lock of the region that
//!   holds it (the caller's job, see `directory`); so `Relaxed` atomics
//!   suffice, the mutexes order them. Slots are atomics only to be shared
//!   between threads without `unsafe` on every access.
//! - Slots are stored XOR [`Entry::FREE`], so an all-zero slot is free and a
//!   new table is a zeroed allocation: the kernel hands out zero pages
//!   lazily, so allocating even a large table costs almost nothing until it
//!   is written, which keeps growth off the hot path.

use crate::entry::Entry;
use crate::NEIGHBOURHOOD as H;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub(crate) struct Table {
    slots: Box<[AtomicU64]>,
}

/// The slot range `[lo, hi)` an operation has locked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub lo: usize,
    pub hi: usize,
}

impl Table {
    /// A table of free slots for `homes` home slots.
    pub(crate) fn new(homes: usize) -> Table {
        let zeroed: Box<[u64]> = vec![0u64; homes + H - 1].into_boxed_slice();
        // SAFETY: AtomicU64 has the same size, alignment and bit validity as
        // u64 (std documents this), so a boxed slice of u64 is a valid boxed
        // slice of AtomicU64 of the same length; ownership moves with it.
        let slots = unsafe { Box::from_raw(Box::into_raw(zeroed) as *mut [AtomicU64]) };
        Table { slots }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.slots.len() * 8
    }

    pub(crate) fn get(&self, slot: usize) -> Entry {
        Entry(self.slots[slot].load(Relaxed) ^ Entry::FREE.0)
    }

    pub(crate) fn set(&self, slot: usize, e: Entry) {
        self.slots[slot].store(e.0 ^ Entry::FREE.0, Relaxed)
    }

    /// Entries with home `home` and tag `tag`, with their slots. Scans the
    /// whole neighbourhood: deletions leave holes.
    pub(crate) fn matches(&self, home: usize, tag: u8, mut f: impl FnMut(usize, Entry)) {
        for off in 0..H {
            let e = self.get(home + off);
            if !e.is_free() && e.neigh_off() as usize == off && e.tag() == tag {
                f(home + off, e);
            }
        }
    }

    /// Replace (or free, with `new == None`) the entry of home `home` that
    /// points at `pba`.
    pub(crate) fn update(&self, home: usize, tag: u8, pba: u64, new: Option<Entry>) -> bool {
        let mut done = false;
        self.matches(home, tag, |slot, e| {
            if !done && e.pba() == pba {
                let v = new.map_or(Entry::FREE, |n| n.with_neigh_off((slot - home) as u32));
                self.set(slot, v);
                done = true;
            }
        });
        done
    }

    /// Insert `new` (its offset is set here) with home `home`, displacing
    /// entries hopscotch-style within `span`. Returns false when no free
    /// slot can be brought into the neighbourhood: the caller grows.
    pub(crate) fn insert(&self, span: Span, home: usize, new: Entry) -> bool {
        debug_assert!(span.lo <= home && home + H <= span.hi);
        let Some(mut free) = (home..span.hi).find(|&s| self.get(s).is_free()) else {
            return false;
        };
        while free - home >= H {
            // The entry furthest from `free` that may move into it: its home
            // must stay within H of `free`, its slot inside the locked span.
            let first = (free + 1 - H).max(span.lo);
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
}
