//! One hopscotch table: `homes + H - 1` atomic 8-byte slots, and the
//! hopscotch algorithms over a range of slots the caller has locked.
//!
//! Invariants:
//! - An entry at slot `s` with offset `o` has home slot `s - o`, `o < H`.
//!   The table has `H - 1` extra slots past the last home, so neighbourhoods
//!   never wrap around.
//! - Every write of a slot happens under the lock of the region that holds
//!   it (the caller's job, see `directory`), between the two version bumps
//!   of that region's seqlock. Writers' reads are under the lock too;
//!   lookups read without it and are ordered by the seqlock (an acquire
//!   load of the versions, a fence, the slot loads, a re-check) together
//!   with each slot being one 8-byte atomic, so a slot is never torn.
//!   Slots are atomics so that those lock-free reads need no `unsafe`.
//! - Slots are stored XOR [`Entry::FREE`], so an all-zero slot is free and a
//!   new table is a zeroed allocation: the kernel hands out zero pages
//!   lazily, so allocating even a large table costs almost nothing until it
//!   is written. `Index::new` faults its first tables in at once
//!   ([`Table::populate`]), off the insert path; a grow's new tables stay
//!   lazy (faulting them in would stall the insert that grows), and the
//!   migrations that fill them fault in their pages.
//! - Tables of [`HUGE_PAGE_BYTES`] and more are anonymous mappings with
//!   transparent huge pages requested (`MADV_HUGEPAGE`): a random lookup in
//!   a table of hundreds of MiB then misses the TLB far less often (the
//!   kernel zeroes 2 MiB at a time, on first touch). Smaller ones are heap
//!   allocations.
//! - With access words on ([`crate::IndexConfig::access_words`]), a
//!   parallel array holds one `u32` per slot for the index's user (the
//!   store keeps an item's fetched bit, last access time and win token
//!   there). It travels with its entry: every displacement, migration and
//!   stash move carries it; a new entry gets the word its writer gives.
//!   Read and written under the same region locks as the slots.
//! - The *stash* holds the rare entries whose neighbourhood has no room
//!   while the index is not loaded enough to grow, or cannot grow any more
//!   (linear neighbourhoods of 32 fail first in the densest window: a few
//!   hundred keys in 2 M slots at 90% occupancy). `stashed[r]`, read and written under region `r`'s lock,
//!   counts stashed entries homed in region `r`, so a lookup looks at the
//!   stash only when its region has any. The stash's own mutex is a leaf:
//!   never held while taking a region lock.
//! - **Hop hints.** Each slot's stored word carries, in two bits that no
//!   entry uses ([`HINT_MASK`]), the hop hint of the neighbourhood whose
//!   home is that slot: how many cache lines past the home's own line hold
//!   its entries (0, 1, 2, or 3 for "any of them", up to the neighbourhood's
//!   last). A lookup reads the home's line, which it needs anyway, and then
//!   only the lines the hint names, instead of all four or five lines of a
//!   32-slot neighbourhood: uDepot keeps entries at 8 bytes by dropping
//!   hopscotch's per-home bitmap, and scans whole neighbourhoods; two bits
//!   taken from the record size keep most lookups to one line. Invariant:
//!   for every entry of home `h` at slot `s` (not stashed), `hint(h) >=
//!   min(3, line(s) - line(h))`, where `line(x) = x / 8`. A hint is raised
//!   whenever an entry is placed or moved, and recomputed when the entry
//!   that set it is removed. It is written under the lock of the home's
//!   region, so a displacement only moves entries whose home lies in the
//!   locked span (never one homed in the region before it). Slot words
//!   are grouped in lines by index: heap tables are 64-byte aligned like
//!   mapped ones, and the slots are padded to a whole line.

use crate::entry::{Entry, HINT_MASK, HINT_SHIFT, KTAG_SHIFT, OFF_SHIFT, OFF_TAG_MASK};
use crate::sync::{AtomicU32, AtomicU64, Mutex, MutexGuard};
use crate::NEIGHBOURHOOD as H;
use std::sync::atomic::Ordering::Relaxed;

/// Most entries one table's stash holds; past it, inserts report full.
pub(crate) const STASH_ENTRIES_MAX: usize = 256;

/// Size of a transparent huge page on x86-64 and most arm64 kernels.
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Slots of one cache line.
pub(crate) const LINE_SLOTS: usize = 8;

/// Under loom: the model's atomics, on the heap (they are not plain
/// words, so neither a zeroed allocation nor a mapping can hold them).
#[cfg(loom)]
struct Slots {
    slots: Box<[AtomicU64]>,
    mapped: usize,
}

#[cfg(loom)]
impl Slots {
    fn zeroed(len: usize) -> Slots {
        Slots { slots: (0..len).map(|_| AtomicU64::new(0)).collect(), mapped: 0 }
    }
}

#[cfg(loom)]
impl std::ops::Deref for Slots {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        &self.slots
    }
}

/// A table's zeroed slots: a 64-byte aligned heap allocation, or for large
/// tables an anonymous mapping, aligned to a huge page, with huge pages
/// requested.
#[cfg(not(loom))]
struct Slots {
    ptr: std::ptr::NonNull<AtomicU64>,
    len: usize,
    /// Bytes mapped (0: a heap allocation of `len` slots).
    mapped: usize,
}

#[cfg(not(loom))]
fn heap_layout(len: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(len * 8, 64).expect("a table's size fits a layout")
}

#[cfg(not(loom))]
// SAFETY: Slots owns its memory exclusively, like a Box<[AtomicU64]>, and
// AtomicU64 is Sync.
unsafe impl Send for Slots {}
#[cfg(not(loom))]
// SAFETY: shared access only hands out &[AtomicU64].
unsafe impl Sync for Slots {}

#[cfg(not(loom))]
impl Slots {
    fn zeroed(len: usize) -> Slots {
        let bytes = len * std::mem::size_of::<AtomicU64>();
        if bytes >= HUGE_PAGE_BYTES {
            if let Some(s) = Self::mapped(len, bytes) {
                return s;
            }
        }
        // SAFETY: the layout has a non-zero size (a table has at least H
        // slots).
        let raw = unsafe { std::alloc::alloc_zeroed(heap_layout(len)) } as *mut AtomicU64;
        let Some(ptr) = std::ptr::NonNull::new(raw) else { std::alloc::handle_alloc_error(heap_layout(len)) };
        Slots { ptr, len, mapped: 0 }
    }

    /// A mapping of `bytes` (rounded to 4 KiB) starting on a huge-page
    /// boundary, so every whole 2 MiB range can be a huge page; the partial
    /// last one keeps small pages, so nothing beyond the table is resident.
    fn mapped(len: usize, bytes: usize) -> Option<Slots> {
        const PAGE: usize = 4096;
        let want = bytes.next_multiple_of(PAGE);
        let reserve = want + HUGE_PAGE_BYTES;
        // SAFETY: an anonymous private mapping; no fixed address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let base = p as usize;
        let start = base.next_multiple_of(HUGE_PAGE_BYTES);
        let (head, tail) = (start - base, base + reserve - (start + want));
        // SAFETY: both ranges lie in the mapping just made, outside
        // [start, start + want), and are page-aligned.
        unsafe {
            if head > 0 {
                libc::munmap(p, head);
            }
            if tail > 0 {
                libc::munmap((start + want) as *mut libc::c_void, tail);
            }
            // A hint: a kernel without THP (or with it off) ignores it.
            libc::madvise(start as *mut libc::c_void, want, libc::MADV_HUGEPAGE);
        }
        let ptr = std::ptr::NonNull::new(start as *mut AtomicU64).expect("a mapping is not at address 0");
        Some(Slots { ptr, len, mapped: want })
    }
}

#[cfg(not(any(loom, miri)))]
impl Slots {
    /// Fault in every page of a mapped table now ([`Table::populate`]);
    /// a heap table's few pages are left to its first writes.
    fn populate(&self) {
        if self.mapped > 0 {
            populate_range(self.ptr.as_ptr() as usize, self.mapped);
        }
    }
}

/// Fault in the whole pages of `[start, start + bytes)`, a range of this
/// process's writable memory, as writes would, without writing: one 2 MiB
/// step at a time, so a thread faulting the same range meanwhile waits for
/// one page at most. `MADV_POPULATE_WRITE` (Linux 5.14); on an older kernel
/// the call fails and the pages stay lazy, as before.
#[cfg(not(any(loom, miri)))]
fn populate_range(start: usize, bytes: usize) {
    const PAGE: usize = 4096;
    let (lo, hi) = (start.next_multiple_of(PAGE), (start + bytes) & !(PAGE - 1));
    let mut at = lo;
    while at < hi {
        let step = (hi - at).min(HUGE_PAGE_BYTES - at % HUGE_PAGE_BYTES);
        // SAFETY: [at, at + step) is page-aligned and lies in memory this
        // process owns and may write; populating changes no contents (a
        // present page is left as it is, a missing one is faulted in as a
        // zero page would be on first write).
        if unsafe { libc::madvise(at as *mut libc::c_void, step, libc::MADV_POPULATE_WRITE) } != 0 {
            return;
        }
        at += step;
    }
}

#[cfg(not(loom))]
impl std::ops::Deref for Slots {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        // SAFETY: ptr points to len zero-initialised (hence valid) AtomicU64s
        // (a zeroed mapping or zeroed allocation), owned by self. AtomicU64 has the
        // size, alignment and bit validity of u64 (std documents this).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

#[cfg(not(loom))]
impl Drop for Slots {
    fn drop(&mut self) {
        if self.mapped > 0 {
            // SAFETY: the mapping made in `zeroed`, unmapped once.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
        } else {
            // SAFETY: the allocation made in `zeroed` with this layout, freed once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), heap_layout(self.len)) };
        }
    }
}

/// A stashed entry: its home, the entry and its access word.
pub(crate) type Stashed = (usize, Entry, u32);

pub(crate) struct Table {
    /// `len` slots padded to whole lines (the padding is never written).
    slots: Slots,
    /// Slots in use: homes + H - 1.
    len: usize,
    /// One access word per slot, or empty when the index keeps none.
    aux: Box<[AtomicU32]>,
    stash: Mutex<Vec<Stashed>>,
    stashed: Box<[AtomicU32]>,
    region_log2: u32,
}

/// The slot range `[lo, hi)` an operation has locked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub lo: usize,
    pub hi: usize,
}

impl Table {
    /// A table of free slots for `homes` home slots, locked in regions of
    /// `2^region_log2` slots.
    pub(crate) fn new(homes: usize, region_log2: u32, access_words: bool) -> Table {
        let len = homes + H - 1;
        let slots = Slots::zeroed(len.next_multiple_of(LINE_SLOTS));
        let regions = len.div_ceil(1 << region_log2);
        // A zeroed Vec of this size comes from the allocator's zeroed
        // pages (calloc), so it costs nothing until touched either.
        #[cfg(not(loom))]
        let aux = {
            let aux: Box<[u32]> = if access_words { vec![0u32; len].into_boxed_slice() } else { Box::new([]) };
            // SAFETY: AtomicU32 has the size, alignment and bit validity of u32
            // (std documents this), so the boxed slice may be reinterpreted.
            unsafe { Box::from_raw(Box::into_raw(aux) as *mut [AtomicU32]) }
        };
        #[cfg(loom)]
        let aux: Box<[AtomicU32]> = (0..if access_words { len } else { 0 }).map(|_| AtomicU32::new(0)).collect();
        Table {
            slots,
            len,
            aux,
            stash: Mutex::new(Vec::new()),
            stashed: (0..regions).map(|_| AtomicU32::new(0)).collect(),
            region_log2,
        }
    }

    /// Fault in the table's memory now (its slots and access words), so
    /// that the inserts that follow do not: a first touch of a huge page
    /// zeroes 2 MiB, and in a VM may wait for the host to back it (inserts
    /// into a fresh pre-sized index then stall for many milliseconds at a
    /// time, several times longer than with the tables populated first).
    /// Called by `Index::new`, off the insert path.
    pub(crate) fn populate(&self) {
        #[cfg(not(any(loom, miri)))]
        {
            self.slots.populate();
            let aux = std::mem::size_of_val(&*self.aux);
            if aux > 0 {
                populate_range(self.aux.as_ptr() as usize, aux);
            }
        }
    }

    fn stash(&self) -> MutexGuard<'_, Vec<Stashed>> {
        self.stash.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slots, padded to whole lines.
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    #[inline]
    pub(crate) fn slots(&self) -> &[AtomicU64] {
        &self.slots
    }

    #[inline]
    pub(crate) fn has_stashed(&self, home: usize) -> bool {
        self.stashed[home >> self.region_log2].load(Relaxed) > 0
    }

    /// Stashed entries with home `home` and key tag `ktag`.
    #[inline]
    pub(crate) fn stash_matches(&self, home: usize, ktag: u16, mut f: impl FnMut(Entry)) {
        if self.has_stashed(home) {
            for &(h, e, _) in self.stash().iter() {
                if h == home && e.key_tag() == ktag {
                    f(e);
                }
            }
        }
    }

    /// Stash `e` (home `home`); false when the stash is full, or when its
    /// home and key tag already have `H` entries (a lookup returns at most `H`).
    pub(crate) fn stash_push(&self, home: usize, e: Entry, aux: u32) -> bool {
        if self.group_len(home, e.key_tag()) >= H {
            return false;
        }
        let mut st = self.stash();
        if st.len() >= STASH_ENTRIES_MAX {
            return false;
        }
        st.push((home, e.with_neigh_off(0), aux));
        self.stashed[home >> self.region_log2].fetch_add(1, Relaxed);
        true
    }

    /// Entries of home `home` and key tag `ktag`, in the table and its
    /// stash (under the home's region lock): at most [`H`], the most a
    /// lookup's candidates hold. Growing never separates them (they share
    /// every tag bit, so they stay in one table, and their home).
    pub(crate) fn group_len(&self, home: usize, ktag: u16) -> usize {
        let mut same = 0;
        self.matches(home, ktag, |_, _| same += 1);
        same + self.stash().iter().filter(|(h, x, _)| *h == home && x.key_tag() == ktag).count()
    }

    /// Stash `e` even past the limit (migration must not lose entries).
    pub(crate) fn stash_push_always(&self, home: usize, e: Entry, aux: u32) {
        self.stash().push((home, e.with_neigh_off(0), aux));
        self.stashed[home >> self.region_log2].fetch_add(1, Relaxed);
    }

    /// Remove and return the stashed entries homed in region `r`.
    pub(crate) fn stash_take_region(&self, r: usize) -> Vec<Stashed> {
        if self.stashed[r].load(Relaxed) == 0 {
            return Vec::new();
        }
        let mut st = self.stash();
        let (taken, kept): (Vec<_>, Vec<_>) = st.drain(..).partition(|(h, _, _)| h >> self.region_log2 == r);
        *st = kept;
        self.stashed[r].store(0, Relaxed);
        taken
    }

    /// Every stashed entry with its home.
    pub(crate) fn stash_entries(&self) -> Vec<(usize, Entry)> {
        self.stash().iter().map(|&(h, e, _)| (h, e)).collect()
    }

    pub(crate) fn stash_len(&self) -> usize {
        self.stash().len()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the slots are a mapping with huge pages requested, starting
    /// on a huge-page boundary.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn is_mapped(&self) -> bool {
        assert!(self.slots.mapped == 0 || (self.slots.ptr.as_ptr() as usize).is_multiple_of(HUGE_PAGE_BYTES));
        self.slots.mapped > 0
    }

    /// Whether this kernel populates on request (`MADV_POPULATE_WRITE`,
    /// Linux 5.14): asked of one page of a fresh mapping.
    #[cfg(all(test, not(loom), not(miri)))]
    pub(crate) fn kernel_populates() -> bool {
        // SAFETY: an anonymous private mapping of one page, advised, then
        // unmapped; nothing else refers to it.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let ok = libc::madvise(p, 4096, libc::MADV_POPULATE_WRITE) == 0;
            libc::munmap(p, 4096);
            ok
        }
    }

    /// Resident and total pages of a mapped table's slots (`mincore`).
    #[cfg(all(test, not(loom), not(miri)))]
    pub(crate) fn resident_pages(&self) -> (usize, usize) {
        const PAGE: usize = 4096;
        let pages = self.slots.mapped / PAGE;
        let mut v = vec![0u8; pages];
        // SAFETY: the mapping [ptr, ptr + mapped) is this table's, page
        // aligned; `v` has one byte per page of it.
        let r = unsafe { libc::mincore(self.slots.ptr.as_ptr().cast(), self.slots.mapped, v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        (v.iter().filter(|&&b| b & 1 != 0).count(), pages)
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.slots.len() * 8
            + self.aux.len() * 4
            + self.stashed.len() * 4
            + self.stash().capacity() * std::mem::size_of::<Stashed>()
    }

    /// The access word of `slot` (0 when the index keeps none).
    pub(crate) fn get_aux(&self, slot: usize) -> u32 {
        self.aux.get(slot).map_or(0, |a| a.load(Relaxed))
    }

    pub(crate) fn set_aux(&self, slot: usize, v: u32) {
        if let Some(a) = self.aux.get(slot) {
            a.store(v, Relaxed)
        }
    }

    /// Move entry `e` (its offset already set for `to`) from slot `from`
    /// to the free slot `to`, with its access word.
    fn move_entry(&self, from: usize, to: usize, e: Entry) {
        self.put(to, e, self.get_aux(from));
        self.set(from, Entry::FREE);
        self.set_aux(from, 0);
    }

    /// Place `e` (its offset set) at slot `slot` with access word `aux`,
    /// raising its home's hop hint. The caller holds the home's region.
    pub(crate) fn put(&self, slot: usize, e: Entry, aux: u32) {
        self.set(slot, e);
        self.set_aux(slot, aux);
        self.raise_hint(slot - e.neigh_off() as usize, hint_need(slot - e.neigh_off() as usize, slot));
    }

    /// The hop hint of the neighbourhood homed at `home`.
    pub(crate) fn hint(&self, home: usize) -> u64 {
        (self.slots[home].load(Relaxed) & HINT_MASK) >> HINT_SHIFT
    }

    /// Make the hop hint of `home` at least `need`.
    pub(crate) fn raise_hint(&self, home: usize, need: u64) {
        let w = self.slots[home].load(Relaxed);
        if (w & HINT_MASK) >> HINT_SHIFT < need {
            self.slots[home].store((w & !HINT_MASK) | (need << HINT_SHIFT), Relaxed);
        }
    }

    /// Set the hop hint of `home` to `hint` (at least what its entries need).
    pub(crate) fn set_hint(&self, home: usize, hint: u64) {
        let w = self.slots[home].load(Relaxed);
        self.slots[home].store((w & !HINT_MASK) | (hint << HINT_SHIFT), Relaxed);
    }

    /// The hop hint `home`'s entries need now (a walk of its whole
    /// neighbourhood).
    pub(crate) fn hint_needed(&self, home: usize) -> u64 {
        (0..H)
            .filter(|&off| {
                let e = self.get(home + off);
                !e.is_free() && e.neigh_off() as usize == off
            })
            .map(|off| hint_need(home, home + off))
            .max()
            .unwrap_or(0)
    }

    /// The access word of the entry of home `home` that points at `pba`,
    /// read without the stash (the lock-free path; None: not found there).
    pub(crate) fn peek_access(&self, home: usize, ktag: u16, pba: u64) -> Option<u32> {
        let mut out = None;
        self.matches(home, ktag, |slot, e| {
            if out.is_none() && e.pba() == pba {
                out = Some(self.get_aux(slot));
            }
        });
        out
    }

    /// Replace the access word of the entry of home `home` that points at
    /// `pba` by `f(old)`; returns the old word, None if no such entry.
    pub(crate) fn access(&self, home: usize, ktag: u16, pba: u64, f: impl FnOnce(u32) -> u32) -> Option<u32> {
        let mut at = None;
        self.matches(home, ktag, |slot, e| {
            if at.is_none() && e.pba() == pba {
                at = Some(slot);
            }
        });
        if let Some(slot) = at {
            let old = self.get_aux(slot);
            self.set_aux(slot, f(old));
            return Some(old);
        }
        if !self.has_stashed(home) {
            return None;
        }
        let mut st = self.stash();
        let x = st.iter_mut().find(|(h, e, _)| *h == home && e.key_tag() == ktag && e.pba() == pba)?;
        let old = x.2;
        x.2 = f(old);
        Some(old)
    }

    /// Prefetch the cache lines of the neighbourhood of `home`.
    pub(crate) fn prefetch(&self, home: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let first = self.slots[home..home + H].as_ptr() as usize;
            let last = first + H * 8 - 1;
            let mut line = first & !63;
            while line <= last {
                // SAFETY: a prefetch is a hint: it never faults and changes
                // no memory; the address lies in this table's slots anyway.
                // SSE is part of the x86-64 baseline.
                unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line as *const i8) };
                line += 64;
            }
            // The stash counter of its region, read by every operation.
            let stashed = &self.stashed[home >> self.region_log2] as *const AtomicU32 as *const i8;
            // SAFETY: as above.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(stashed) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = home;
    }

    pub(crate) fn get(&self, slot: usize) -> Entry {
        entry_of(self.slots[slot].load(Relaxed))
    }

    /// Store `e` at `slot`, keeping the slot's hop hint (which belongs to
    /// the neighbourhood homed there, not to the entry).
    pub(crate) fn set(&self, slot: usize, e: Entry) {
        debug_assert!(e.is_well_formed(), "{e:?} carries hint bits");
        let hint = self.slots[slot].load(Relaxed) & HINT_MASK;
        self.slots[slot].store(((e.0 & !HINT_MASK) ^ Entry::FREE.0) | hint, Relaxed)
    }

    /// Entries with home `home` and key tag `ktag` (the lookup fast path).
    /// Scans the whole neighbourhood: deletions leave holes.
    #[inline]
    pub(crate) fn scan(&self, home: usize, ktag: u16, mut f: impl FnMut(Entry)) {
        self.matches(home, ktag, |_, e| f(e));
    }

    /// Entries with home `home` and key tag `ktag`, with their slots. Reads
    /// the lines of the neighbourhood its hop hint names.
    ///
    /// The match mask comes from [`hinted_mask`] (vector compares where
    /// the CPU has AVX2); each matching slot is then loaded again as an
    /// atomic and checked once more, so `f` only ever sees entries that
    /// match, even if a writer changed a slot in between (an optimistic
    /// reader then fails its version check and retries).
    #[inline]
    pub(crate) fn matches(&self, home: usize, ktag: u16, mut f: impl FnMut(usize, Entry)) {
        let mut mask = hinted_mask(&self.slots, home, ktag);
        while mask != 0 {
            let off = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            let stored = self.slots[home + off].load(Relaxed);
            if slot_matches(stored, off, ktag) {
                f(home + off, entry_of(stored));
            }
        }
    }

    /// Replace (or free, with `new == None`) the entry of home `home` that
    /// points at `pba`, in the neighbourhood or the stash; a replacement's
    /// access word becomes `aux(old word)`.
    pub(crate) fn update(
        &self,
        home: usize,
        ktag: u16,
        pba: u64,
        new: Option<Entry>,
        aux: impl FnOnce(u32) -> u32,
    ) -> bool {
        let mut at = None;
        self.matches(home, ktag, |slot, e| {
            if at.is_none() && e.pba() == pba {
                at = Some(slot);
            }
        });
        if let Some(slot) = at {
            match new {
                Some(n) => {
                    self.set(slot, n.with_neigh_off((slot - home) as u32));
                    self.set_aux(slot, aux(self.get_aux(slot)));
                }
                None => {
                    self.set(slot, Entry::FREE);
                    self.set_aux(slot, 0);
                    // The hint may shrink if this entry was the furthest.
                    let hint = self.hint(home);
                    if hint_need(home, slot) == hint {
                        self.set_hint(home, self.hint_needed(home));
                    }
                }
            }
            return true;
        }
        if !self.has_stashed(home) {
            return false;
        }
        let mut st = self.stash();
        let Some(i) = st.iter().position(|&(h, e, _)| h == home && e.key_tag() == ktag && e.pba() == pba) else {
            return false;
        };
        match new {
            Some(n) => st[i] = (home, n.with_neigh_off(0), aux(st[i].2)),
            None => {
                st.swap_remove(i);
                self.stashed[home >> self.region_log2].fetch_sub(1, Relaxed);
            }
        }
        true
    }

    /// Insert `new` (its offset is set here) with home `home`, displacing
    /// entries hopscotch-style within `span`. Returns false when no free
    /// slot can be brought into the neighbourhood: the caller grows.
    pub(crate) fn insert(&self, span: Span, home: usize, new: Entry, aux: u32) -> bool {
        debug_assert!(span.lo <= home && home + H <= span.hi);
        let Some(mut free) = (home..span.hi).find(|&s| self.get(s).is_free()) else {
            return false;
        };
        // Fast path: classic hopscotch, moving the hole left by the longest
        // jump each time.
        while free - home >= H {
            // The entry furthest from `free` that may move into it: its home
            // must stay within H of `free` and lie inside the locked span
            // (its hop hint is raised).
            let first = (free + 1 - H).max(span.lo);
            let movable = (first..free).find_map(|s| {
                let e = self.get(s);
                if e.is_free() {
                    return None;
                }
                let ehome = s - e.neigh_off() as usize;
                (free - ehome < H && ehome >= span.lo).then_some((s, e, ehome))
            });
            let Some((s, e, ehome)) = movable else {
                // Greedy jumps leave entries at the edge of their
                // neighbourhoods, where they cannot move again; search for
                // any chain of moves instead.
                return match self.find_chain(span, home) {
                    Some(slot) => {
                        self.put(slot, new.with_neigh_off((slot - home) as u32), aux);
                        true
                    }
                    None => false,
                };
            };
            self.move_entry(s, free, e.with_neigh_off((free - ehome) as u32));
            free = s;
        }
        self.put(free, new.with_neigh_off((free - home) as u32), aux);
        true
    }

    /// Slow path of `insert`: make a slot of `[home, home + H)` free by any
    /// chain of hopscotch moves inside `[home, span.hi)`, and return it.
    ///
    /// Every move takes the entry at `s` into a hole `f > s` with
    /// `f <= home(s) + H - 1` (and `home(s)` in the span, for its hint), so
    /// holes only travel left and a hole can reach `s` iff `s` is free or
    /// the nearest slot right of `s` that a hole can reach is at most
    /// `home(s) + H - 1`. One right-to-left pass computes
    /// that for every slot; the chain is then read back left to right and
    /// executed from its free end.
    fn find_chain(&self, span: Span, home: usize) -> Option<usize> {
        let n = span.hi - home;
        let mut reach = vec![false; n];
        let mut nearest: Option<usize> = None;
        for s in (home..span.hi).rev() {
            let e = self.get(s);
            let ehome = s - e.neigh_off() as usize;
            let ok = e.is_free() || (ehome >= span.lo && nearest.is_some_and(|f| f < ehome + H));
            if ok {
                reach[s - home] = true;
                nearest = Some(s);
            }
        }
        let start = (home..home + H).find(|&s| reach[s - home])?;
        let mut chain = vec![start];
        let mut s = start;
        while !self.get(s).is_free() {
            let limit = s - self.get(s).neigh_off() as usize + H - 1;
            let f = (s + 1..=limit.min(span.hi - 1)).find(|&f| reach[f - home]).expect("reachable by construction");
            chain.push(f);
            s = f;
        }
        for w in chain.windows(2).rev() {
            let (s, f) = (w[0], w[1]);
            let e = self.get(s);
            let ehome = s - e.neigh_off() as usize;
            self.move_entry(s, f, e.with_neigh_off((f - ehome) as u32));
        }
        Some(start)
    }
}

/// The hop hint an entry of home `home` at slot `slot` needs.
#[inline]
pub(crate) fn hint_need(home: usize, slot: usize) -> u64 {
    ((slot / LINE_SLOTS - home / LINE_SLOTS) as u64).min(3)
}

/// The entry of a stored slot word: its hint bits dropped, XOR undone.
#[inline]
fn entry_of(stored: u64) -> Entry {
    Entry((stored & !HINT_MASK) ^ Entry::FREE.0)
}

/// Whether the stored slot word `stored` at offset `off` of a neighbourhood
/// holds an entry of that home with key tag `ktag`. Slots are stored XOR
/// [`Entry::FREE`], which flips only pba bits: the offset and key tag bits
/// of a stored word are the entry's, and a free slot is 0 but for its hint.
#[inline]
fn slot_matches(stored: u64, off: usize, ktag: u16) -> bool {
    let want = ((off as u64) << OFF_SHIFT) | ((ktag as u64) << KTAG_SHIFT);
    (stored & !HINT_MASK != 0) & (stored & OFF_TAG_MASK == want)
}

/// The lines (of [`LINE_SLOTS`]) a lookup of `home` reads for hint `hint`.
#[inline]
fn hinted_lines(home: usize, hint: u64) -> usize {
    if hint < 3 {
        hint as usize + 1
    } else {
        (home + H - 1) / LINE_SLOTS - home / LINE_SLOTS + 1
    }
}

/// The 8 slots (one cache line) at `line`, as two vectors of four, read
/// in four aligned 16-byte loads (`vmovdqa`). Intel, AMD and Zhaoxin
/// guarantee an aligned 16-byte `vmovdqa` to be one atomic access on their
/// processors with AVX (see [`aligned_16_byte_loads_are_atomic`]), so there
/// each slot is read whole, old or new value, never torn, as by its own atomic load;
/// 32-byte loads carry no such promise. [`crate::Index::contains`] relies
/// on it: a slot seen holding the entry sought proves the entry was there,
/// with no validation. (Vector loads of atomics written concurrently: see
/// `hood_mask_avx2`.) Against two 32-byte loads they cost nothing with the
/// keys' hashes at hand and about a sixth of a lookup with each hash a
/// cache miss of its own (docs/BENCHMARKS-HISTORY.md, "A present key needs no
/// seqlock").
///
/// # Safety
/// `line` must point at 8 readable slots, 64-byte aligned (a table's
/// lines are: its slots start on a line), and the CPU support AVX.
#[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
#[target_feature(enable = "avx")]
#[inline]
unsafe fn load_line(line: *const AtomicU64) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    debug_assert_eq!(line as usize % 64, 0, "a line starts on a cache line");
    let (a, b);
    // SAFETY: the caller's contract: 64 readable bytes at `line`, aligned
    // (vmovdqa faults on a misaligned address, it never reads one); the
    // block only reads them, touches no stack and no flags.
    unsafe {
        std::arch::asm!(
            "vmovdqa {a:x}, xmmword ptr [{p}]",
            "vmovdqa {t:x}, xmmword ptr [{p} + 16]",
            "vinsertf128 {a:y}, {a:y}, {t:x}, 1",
            "vmovdqa {b:x}, xmmword ptr [{p} + 32]",
            "vmovdqa {t:x}, xmmword ptr [{p} + 48]",
            "vinsertf128 {b:y}, {b:y}, {t:x}, 1",
            a = out(ymm_reg) a,
            b = out(ymm_reg) b,
            t = out(ymm_reg) _,
            p = in(reg) line,
            options(nostack, readonly, preserves_flags),
        );
    }
    (a, b)
}

/// Whether this CPU's vendor guarantees an aligned 16-byte `vmovdqa` to be
/// one atomic access on its processors with AVX: Intel (its SDM, vol. 3A,
/// "Guaranteed Atomic Operations"), AMD and Zhaoxin (confirmed in GCC bug
/// 104688, on which GCC's libatomic and the `portable-atomic` crate base
/// their 16-byte atomic loads). Other vendors: not known, so
/// [`crate::Index::contains`] validates every answer there. Asked once.
#[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
pub(crate) fn aligned_16_byte_loads_are_atomic() -> bool {
    static VENDOR_OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VENDOR_OK.get_or_init(|| {
        // Leaf 0: the vendor string, in EBX, EDX, ECX.
        let r = std::arch::x86_64::__cpuid(0);
        let mut v = [0u8; 12];
        v[..4].copy_from_slice(&r.ebx.to_le_bytes());
        v[4..8].copy_from_slice(&r.edx.to_le_bytes());
        v[8..].copy_from_slice(&r.ecx.to_le_bytes());
        matches!(&v, b"GenuineIntel" | b"AuthenticAMD" | b"  Shanghai  ")
    })
}

/// [`hood_mask`] of the neighbourhood homed at `home` in `slots` (padded
/// to whole lines, starting on a 64-byte boundary as a table's do: the
/// vector scan loads aligned lines), reading only the lines its hop hint
/// names: bit `off` set for each slot `home + off` that [`slot_matches`].
#[inline]
pub(crate) fn hinted_mask(slots: &[AtomicU64], home: usize, ktag: u16) -> u32 {
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above), and `slots` starts
        // on a 64-byte line (this function's contract, which every caller
        // keeps by passing a table's slots).
        return unsafe { hinted_mask_avx2(slots, home, ktag) };
    }
    hinted_mask_scalar(slots, home, ktag)
}

pub(crate) fn hinted_mask_scalar(slots: &[AtomicU64], home: usize, ktag: u16) -> u32 {
    let hint = (slots[home].load(Relaxed) & HINT_MASK) >> HINT_SHIFT;
    let end = ((home / LINE_SLOTS + hinted_lines(home, hint)) * LINE_SLOTS).min(home + H);
    let mut mask = 0u32;
    for (off, slot) in slots[home..end].iter().enumerate() {
        mask |= (slot_matches(slot.load(Relaxed), off, ktag) as u32) << off;
    }
    mask
}

/// [`hinted_mask_scalar`] in two 32-byte vector loads and compares per line.
///
/// # Safety
/// The CPU must support AVX2, and `slots` must start on a 64-byte line
/// (its lines are loaded aligned: a table's slots always do).
#[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
#[target_feature(enable = "avx2")]
unsafe fn hinted_mask_avx2(slots: &[AtomicU64], home: usize, ktag: u16) -> u32 {
    use std::arch::x86_64::*;
    let base = home & !(LINE_SLOTS - 1);
    let d = (home - base) as u64;
    let off_tag = _mm256_set1_epi64x(OFF_TAG_MASK as i64);
    let not_hint = _mm256_set1_epi64x(!HINT_MASK as i64);
    let zero = _mm256_setzero_si256();
    let tag_bits = ((ktag as u64) << KTAG_SHIFT) as i64;
    // The offset field is the word's top 5 bits, so offsets wrap mod 32:
    // slots before the home get offsets that no entry of the home has at
    // that slot, and their bits are shifted out below anyway.
    let off = |o: u64| (o.wrapping_sub(d) << OFF_SHIFT) as i64;
    let mut want = _mm256_add_epi64(_mm256_set1_epi64x(tag_bits), _mm256_set_epi64x(off(3), off(2), off(1), off(0)));
    let step = _mm256_set1_epi64x((4u64 << OFF_SHIFT) as i64);
    let mut mask = 0u64;
    let mut scan = |j: usize, line: &[AtomicU64]| {
        debug_assert_eq!(line.len(), LINE_SLOTS);
        // SAFETY: `line` is 8 slots, 64 readable bytes borrowed from the
        // table; the CPU has AVX2 (this function's contract).
        let (a, b) = unsafe { load_line(line.as_ptr()) };
        for (k, v) in [a, b].into_iter().enumerate() {
            let hit = _mm256_cmpeq_epi64(_mm256_and_si256(v, off_tag), want);
            let free = _mm256_cmpeq_epi64(_mm256_and_si256(v, not_hint), zero);
            let m = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_andnot_si256(free, hit))) as u64;
            mask |= m << (8 * j + 4 * k);
            want = _mm256_add_epi64(want, step);
        }
    };
    // The first two lines always (most neighbourhoods end in them, and
    // their loads need not wait for the hint's), more only when the hint
    // names them: each line read is a cache miss, and the misses of
    // successive lookups overlap only while the CPU's line-fill buffers
    // last. (Slots are padded to whole lines past the last neighbourhood,
    // so two lines from any home's line are in the table.)
    scan(0, &slots[base..base + LINE_SLOTS]);
    scan(1, &slots[base + LINE_SLOTS..base + 2 * LINE_SLOTS]);
    let hint = (slots[home].load(Relaxed) & HINT_MASK) >> HINT_SHIFT;
    let lines = hinted_lines(home, hint);
    if lines > 2 {
        for (j, line) in slots[base..base + lines * LINE_SLOTS].chunks_exact(LINE_SLOTS).enumerate().skip(2) {
            scan(j, line);
        }
    }
    (mask >> d) as u32
}

/// Whether the neighbourhood homed at `home` in `slots` (padded to whole
/// lines) holds, in a slot its hop hint names, an entry of key tag `ktag`
/// pointing at `pba` (`pba <= PBA_MAX`): [`hinted_mask_avx2`] narrowed to
/// that one question, for [`crate::Index::contains`].
///
/// Lookups run in loops of many whose cache misses overlap only while the
/// CPU's instruction window holds several lookups, and a mispredicted
/// branch on a missed line throws the later lookups' work away. So each
/// slot is compared whole (offset, key tag and pba at once; no matching
/// slot is loaded again), and the one branch on the slots asks whether
/// the home's first two lines, always read, hold the entry: they do for
/// nearly every key that is present, so it is predicted; only when they
/// do not is the hop hint read for further lines (7% of homes at 85%
/// occupancy name more than two; branching on the hint first is slower,
/// docs/BENCHMARKS-HISTORY.md, "`contains` in one AVX2 pass"). A free slot never
/// matches: it is stored as 0 (but for its hint), whose pba field would
/// be `pba ^ PBA_MASK`, all ones, which no record has.
///
/// # Safety
/// The CPU must support AVX2, and `slots` must hold the lines of `home`'s
/// neighbourhood and the line after `home`'s: every table's slots do
/// (`Table::new` pads them to whole lines past the last neighbourhood).
/// The slots are reached by pointer, not by slicing: the bounds checks of
/// slicing cost lookups measurable time in this hot loop.
#[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn holds_avx2(slots: &[AtomicU64], home: usize, ktag: u16, pba: u64) -> bool {
    use crate::entry::PBA_MASK;
    use std::arch::x86_64::*;
    debug_assert!(pba < PBA_MASK);
    let base = home & !(LINE_SLOTS - 1);
    let d = (home - base) as u64;
    let fields = _mm256_set1_epi64x((OFF_TAG_MASK | PBA_MASK) as i64);
    // Slot `base + o` matches when its offset is `o - d` (mod 32, as in
    // `hinted_mask_avx2`; slots before the home are shifted out below).
    let off = |o: u64| (o.wrapping_sub(d) << OFF_SHIFT) as i64;
    let key = (((ktag as u64) << KTAG_SHIFT) | (pba ^ PBA_MASK)) as i64;
    let want = _mm256_add_epi64(_mm256_set1_epi64x(key), _mm256_set_epi64x(off(3), off(2), off(1), off(0)));
    let step = _mm256_set1_epi64x((4u64 << OFF_SHIFT) as i64);
    let line_step = _mm256_add_epi64(step, step);
    // Bit `o` set when slot `o` of `line` matches `want` (offsets of the
    // line's first slot in `want`).
    let line_mask = |line: *const AtomicU64, want: __m256i| -> u64 {
        // SAFETY: `line` points at 8 slots, 64 readable bytes of `slots`
        // (the callers' lines, within the bounds of this function's
        // contract); the CPU has AVX2 (this function's contract).
        let (a, b) = unsafe { load_line(line) };
        let ea = _mm256_cmpeq_epi64(_mm256_and_si256(a, fields), want);
        let eb = _mm256_cmpeq_epi64(_mm256_and_si256(b, fields), _mm256_add_epi64(want, step));
        (_mm256_movemask_pd(_mm256_castsi256_pd(ea)) | (_mm256_movemask_pd(_mm256_castsi256_pd(eb)) << 4)) as u64
    };
    debug_assert!(base + 2 * LINE_SLOTS <= slots.len());
    // SAFETY (each use): line `j` of the neighbourhood (`j` < 2, or named by
    // the hint) lies in `slots` (this function's contract).
    let line = |j: usize| unsafe { slots.as_ptr().add(base + j * LINE_SLOTS) };
    // The home's line and the next, always.
    let want1 = _mm256_add_epi64(want, line_step);
    let mut mask = line_mask(line(0), want) | (line_mask(line(1), want1) << LINE_SLOTS);
    if (mask >> d) as u32 != 0 {
        return true;
    }
    // SAFETY: `home` is a slot of the table (this function's contract).
    let hint = (unsafe { slots.get_unchecked(home) }.load(Relaxed) & HINT_MASK) >> HINT_SHIFT;
    let mut w = want1;
    for j in 2..hinted_lines(home, hint) {
        w = _mm256_add_epi64(w, line_step);
        mask |= line_mask(line(j), w) << (LINE_SLOTS * j);
    }
    (mask >> d) as u32 != 0
}

/// Bit `off` set for each slot of `hood` that [`slot_matches`] (offset
/// `off`, key tag `ktag`). Public for `granary-bench index`, whose memory
/// floor runs this scan alone over a table of the index's size.
///
/// A lookup is bound by how many lookups' cache misses the CPU overlaps.
/// A scalar scan of the 32 slots is about 200 instructions and 32 loads,
/// enough to keep the next lookup's misses from starting while this one's
/// are outstanding; the AVX2 pass is 8 loads and about 50 instructions,
/// several times faster on a random neighbourhood (`granary-bench index`'s
/// memory floor measures it). The CPU is asked once ([`is_x86_feature_detected`]
/// caches the answer); without AVX2, and under Miri, the scalar scan runs.
#[inline]
pub fn hood_mask(hood: &[AtomicU64; H], ktag: u16) -> u32 {
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { hood_mask_avx2(hood, ktag) };
    }
    hood_mask_scalar(hood, ktag)
}

pub(crate) fn hood_mask_scalar(hood: &[AtomicU64; H], ktag: u16) -> u32 {
    let mut mask = 0u32;
    for (off, slot) in hood.iter().enumerate() {
        mask |= (slot_matches(slot.load(Relaxed), off, ktag) as u32) << off;
    }
    mask
}

/// [`hood_mask_scalar`] in eight 32-byte vector loads and compares.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
#[target_feature(enable = "avx2")]
unsafe fn hood_mask_avx2(hood: &[AtomicU64; H], ktag: u16) -> u32 {
    use std::arch::x86_64::*;
    const _: () = assert!(H == 32, "eight loads of four slots");
    let p = hood.as_ptr();
    let (v0, v1, v2, v3, v4, v5, v6, v7): (__m256i, __m256i, __m256i, __m256i, __m256i, __m256i, __m256i, __m256i);
    // The slots are loaded in inline assembly, not with `_mm256_loadu_si256`:
    // writers store to them concurrently (with atomics, under their region
    // locks), and a plain Rust load racing with an atomic store is a data
    // race, undefined behaviour, whatever the hardware does. An asm block
    // is opaque to the compiler; at the machine level each 8-byte slot is
    // aligned and lies in one cache line, so the vector load reads every
    // slot as one access, old or new value, never torn (the guarantee the
    // slots' own atomic loads rest on). A value read while a writer is in
    // is stale at worst: `matches` re-loads each hit atomically and
    // re-checks it, and an optimistic reader validates its region versions
    // afterwards, exactly as for scalar loads.
    //
    // SAFETY: `p` points at H = 32 slots, 256 readable bytes borrowed from
    // the table for this call; the block only reads them (`readonly`),
    // touches no stack and no flags. The CPU supports AVX (the caller's
    // contract: AVX2 implies it).
    unsafe {
        std::arch::asm!(
            "vmovdqu {0}, ymmword ptr [{p}]",
            "vmovdqu {1}, ymmword ptr [{p} + 32]",
            "vmovdqu {2}, ymmword ptr [{p} + 64]",
            "vmovdqu {3}, ymmword ptr [{p} + 96]",
            "vmovdqu {4}, ymmword ptr [{p} + 128]",
            "vmovdqu {5}, ymmword ptr [{p} + 160]",
            "vmovdqu {6}, ymmword ptr [{p} + 192]",
            "vmovdqu {7}, ymmword ptr [{p} + 224]",
            out(ymm_reg) v0,
            out(ymm_reg) v1,
            out(ymm_reg) v2,
            out(ymm_reg) v3,
            out(ymm_reg) v4,
            out(ymm_reg) v5,
            out(ymm_reg) v6,
            out(ymm_reg) v7,
            p = in(reg) p,
            options(nostack, readonly, preserves_flags),
        );
    }
    let off_tag = _mm256_set1_epi64x(OFF_TAG_MASK as i64);
    let not_hint = _mm256_set1_epi64x(!HINT_MASK as i64);
    let zero = _mm256_setzero_si256();
    let tag_bits = ((ktag as u64) << KTAG_SHIFT) as i64;
    let off = |o: u64| (o << OFF_SHIFT) as i64;
    // Offsets 0..3 in lane order, then +4 per vector (31 << 59 still fits).
    let mut want = _mm256_add_epi64(_mm256_set1_epi64x(tag_bits), _mm256_set_epi64x(off(3), off(2), off(1), off(0)));
    let step = _mm256_set1_epi64x(off(4));
    let mut mask = 0u32;
    for (i, v) in [v0, v1, v2, v3, v4, v5, v6, v7].into_iter().enumerate() {
        let hit = _mm256_cmpeq_epi64(_mm256_and_si256(v, off_tag), want);
        let free = _mm256_cmpeq_epi64(_mm256_and_si256(v, not_hint), zero);
        let m = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_andnot_si256(free, hit))) as u32;
        mask |= m << (4 * i);
        want = _mm256_add_epi64(want, step);
    }
    mask
}
