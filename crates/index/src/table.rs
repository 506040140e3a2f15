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

use crate::entry::{Entry, KTAG_SHIFT, OFF_SHIFT, OFF_TAG_MASK};
use crate::NEIGHBOURHOOD as H;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

/// Most entries one table's stash holds; past it, inserts report full.
pub(crate) const STASH_ENTRIES_MAX: usize = 256;

/// Size of a transparent huge page on x86-64 and most arm64 kernels.
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

/// A table's zeroed slots: a heap allocation, or for large tables an
/// anonymous mapping, aligned to a huge page, with huge pages requested.
struct Slots {
    ptr: std::ptr::NonNull<AtomicU64>,
    len: usize,
    /// Bytes mapped (0: a heap allocation of `len` slots).
    mapped: usize,
}

// SAFETY: Slots owns its memory exclusively, like a Box<[AtomicU64]>, and
// AtomicU64 is Sync.
unsafe impl Send for Slots {}
// SAFETY: shared access only hands out &[AtomicU64].
unsafe impl Sync for Slots {}

impl Slots {
    fn zeroed(len: usize) -> Slots {
        let bytes = len * std::mem::size_of::<AtomicU64>();
        if bytes >= HUGE_PAGE_BYTES {
            if let Some(s) = Self::mapped(len, bytes) {
                return s;
            }
        }
        let zeroed: Box<[u64]> = vec![0u64; len].into_boxed_slice();
        let raw = Box::into_raw(zeroed) as *mut AtomicU64;
        Slots { ptr: std::ptr::NonNull::new(raw).expect("Box pointers are non-null"), len, mapped: 0 }
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

impl std::ops::Deref for Slots {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        // SAFETY: ptr points to len zero-initialised (hence valid) AtomicU64s
        // (a zeroed mapping or boxed slice), owned by self. AtomicU64 has the
        // size, alignment and bit validity of u64 (std documents this).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        if self.mapped > 0 {
            // SAFETY: the mapping made in `zeroed`, unmapped once.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
        } else {
            // SAFETY: the boxed slice leaked in `zeroed` (u64 and AtomicU64
            // have the same layout), freed once.
            drop(unsafe {
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr().cast::<u64>(), self.len))
            });
        }
    }
}

/// A stashed entry: its home, the entry and its access word.
pub(crate) type Stashed = (usize, Entry, u32);

pub(crate) struct Table {
    slots: Slots,
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
        let slots = Slots::zeroed(homes + H - 1);
        let regions = slots.len().div_ceil(1 << region_log2);
        // A zeroed Vec of this size comes from the allocator's zeroed
        // pages (calloc), so it costs nothing until touched either.
        let aux: Box<[u32]> = if access_words { vec![0u32; slots.len()].into_boxed_slice() } else { Box::new([]) };
        // SAFETY: AtomicU32 has the size, alignment and bit validity of u32
        // (std documents this), so the boxed slice may be reinterpreted.
        let aux = unsafe { Box::from_raw(Box::into_raw(aux) as *mut [AtomicU32]) };
        Table {
            slots,
            aux,
            stash: Mutex::new(Vec::new()),
            stashed: (0..regions).map(|_| AtomicU32::new(0)).collect(),
            region_log2,
        }
    }

    fn stash(&self) -> MutexGuard<'_, Vec<Stashed>> {
        self.stash.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn has_stashed(&self, home: usize) -> bool {
        self.stashed[home >> self.region_log2].load(Relaxed) > 0
    }

    /// Stashed entries with home `home` and key tag `ktag`.
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
        let mut same = 0;
        self.matches(home, e.key_tag(), |_, _| same += 1);
        let mut st = self.stash();
        same += st.iter().filter(|(h, x, _)| *h == home && x.key_tag() == e.key_tag()).count();
        if st.len() >= STASH_ENTRIES_MAX || same >= H {
            return false;
        }
        st.push((home, e.with_neigh_off(0), aux));
        self.stashed[home >> self.region_log2].fetch_add(1, Relaxed);
        true
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
        self.slots.len()
    }

    /// Whether the slots are a mapping with huge pages requested, starting
    /// on a huge-page boundary.
    #[cfg(test)]
    pub(crate) fn is_mapped(&self) -> bool {
        assert!(self.slots.mapped == 0 || (self.slots.ptr.as_ptr() as usize).is_multiple_of(HUGE_PAGE_BYTES));
        self.slots.mapped > 0
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
        self.set(to, e);
        self.set_aux(to, self.get_aux(from));
        self.set(from, Entry::FREE);
        self.set_aux(from, 0);
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
        Entry(self.slots[slot].load(Relaxed) ^ Entry::FREE.0)
    }

    pub(crate) fn set(&self, slot: usize, e: Entry) {
        self.slots[slot].store(e.0 ^ Entry::FREE.0, Relaxed)
    }

    /// Entries with home `home` and key tag `ktag` (the lookup fast path).
    /// Scans the whole neighbourhood: deletions leave holes.
    pub(crate) fn scan(&self, home: usize, ktag: u16, mut f: impl FnMut(Entry)) {
        self.matches(home, ktag, |_, e| f(e));
    }

    /// Entries with home `home` and key tag `ktag`, with their slots. Scans
    /// the whole neighbourhood: deletions leave holes.
    ///
    /// The neighbourhood's match mask comes from [`hood_mask`] (one vector
    /// pass where the CPU has AVX2); each matching slot is then loaded
    /// again as an atomic and checked once more, so `f` only ever sees
    /// entries that match, even if a writer changed a slot in between (an
    /// optimistic reader then fails its version check and retries).
    pub(crate) fn matches(&self, home: usize, ktag: u16, mut f: impl FnMut(usize, Entry)) {
        let hood: &[AtomicU64; H] = self.slots[home..home + H].try_into().expect("H slots");
        let mut mask = hood_mask(hood, ktag);
        while mask != 0 {
            let off = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            let stored = hood[off].load(Relaxed);
            if slot_matches(stored, off, ktag) {
                f(home + off, Entry(stored ^ Entry::FREE.0));
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
                // Greedy jumps leave entries at the edge of their
                // neighbourhoods, where they cannot move again; search for
                // any chain of moves instead.
                return match self.find_chain(span, home) {
                    Some(slot) => {
                        self.set(slot, new.with_neigh_off((slot - home) as u32));
                        self.set_aux(slot, aux);
                        true
                    }
                    None => false,
                };
            };
            self.move_entry(s, free, e.with_neigh_off((free - ehome) as u32));
            free = s;
        }
        self.set(free, new.with_neigh_off((free - home) as u32));
        self.set_aux(free, aux);
        true
    }

    /// Slow path of `insert`: make a slot of `[home, home + H)` free by any
    /// chain of hopscotch moves inside `[home, span.hi)`, and return it.
    ///
    /// Every move takes the entry at `s` into a hole `f > s` with
    /// `f <= home(s) + H - 1`, so holes only travel left and a hole can reach
    /// `s` iff `s` is free or the nearest slot right of `s` that a hole can
    /// reach is at most `home(s) + H - 1`. One right-to-left pass computes
    /// that for every slot; the chain is then read back left to right and
    /// executed from its free end.
    fn find_chain(&self, span: Span, home: usize) -> Option<usize> {
        let n = span.hi - home;
        let mut reach = vec![false; n];
        let mut nearest: Option<usize> = None;
        for s in (home..span.hi).rev() {
            let e = self.get(s);
            let ok = e.is_free() || nearest.is_some_and(|f| f < s - e.neigh_off() as usize + H);
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

/// Whether the stored slot word `stored` at offset `off` of a neighbourhood
/// holds an entry of that home with key tag `ktag`. Slots are stored XOR
/// [`Entry::FREE`], which flips only pba bits: the offset and key tag bits
/// of a stored word are the entry's, and a free slot is 0.
#[inline]
fn slot_matches(stored: u64, off: usize, ktag: u16) -> bool {
    let want = ((off as u64) << OFF_SHIFT) | ((ktag as u64) << KTAG_SHIFT);
    (stored != 0) & (stored & OFF_TAG_MASK == want)
}

/// Bit `off` set for each slot of `hood` that [`slot_matches`] (offset
/// `off`, key tag `ktag`). Public for `granary bench index`, whose memory
/// floor runs this scan alone over a table of the index's size.
///
/// A lookup is bound by how many lookups' cache misses the CPU overlaps.
/// A scalar scan of the 32 slots is about 200 instructions and 32 loads,
/// enough to keep the next lookup's misses from starting while this one's
/// are outstanding; the AVX2 pass is 8 loads and about 50 instructions
/// (on this project's machine, a random neighbourhood scan took 65 ns
/// instead of 224 ns). The CPU is asked once ([`is_x86_feature_detected`]
/// caches the answer); without AVX2, and under Miri, the scalar scan runs.
#[inline]
pub fn hood_mask(hood: &[AtomicU64; H], ktag: u16) -> u32 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
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
#[cfg(all(target_arch = "x86_64", not(miri)))]
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
    let zero = _mm256_setzero_si256();
    let tag_bits = ((ktag as u64) << KTAG_SHIFT) as i64;
    let off = |o: u64| (o << OFF_SHIFT) as i64;
    // Offsets 0..3 in lane order, then +4 per vector (31 << 59 still fits).
    let mut want = _mm256_add_epi64(_mm256_set1_epi64x(tag_bits), _mm256_set_epi64x(off(3), off(2), off(1), off(0)));
    let step = _mm256_set1_epi64x(off(4));
    let mut mask = 0u32;
    for (i, v) in [v0, v1, v2, v3, v4, v5, v6, v7].into_iter().enumerate() {
        let hit = _mm256_cmpeq_epi64(_mm256_and_si256(v, off_tag), want);
        let free = _mm256_cmpeq_epi64(v, zero);
        let m = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_andnot_si256(free, hit))) as u32;
        mask |= m << (4 * i);
        want = _mm256_add_epi64(want, step);
    }
    mask
}
