//! Admission and eviction policies of the DRAM tier ([`crate::tier`]):
//! byte-bounded caches of values keyed by a 64-bit key hash.
//!
//! - [`S3Fifo`] (Yang et al., SOSP 2023): a small FIFO (a tenth of the
//!   bytes) that new items enter, a main FIFO with 2-bit access counts
//!   (CLOCK-like reinsertion), and a ghost FIFO of the hashes recently
//!   evicted from the small one. An item leaving the small FIFO moves to
//!   the main one only if it was read while there; an item whose hash is
//!   in the ghost enters the main FIFO directly. A one-pass scan therefore
//!   only churns the small FIFO. The tier uses this one ([`Policy`]).
//! - [`Sieve`] (Zhang et al., NSDI 2024): one FIFO, a visited bit per item
//!   and a hand that moves from the oldest item towards the newest,
//!   evicting the first unvisited one; kept for the measurement that chose
//!   between them (`tier_policy::tests::hit_ratios`, numbers in
//!   docs/ARCHITECTURE.md, "DRAM tier").
//!
//! [`S3Fifo::get`] takes `&self`, so that readers of one tier shard share
//! its lock: an item's access count is an atomic byte, written only when
//! it changes (it saturates at [`FREQ_MAX`], so a hot item's hits only read
//! it). Racing readers may lose increments, which only leaves a count
//! lower than the reads it saw: a count is a hint of reuse, never a
//! bound, and eviction (under the write lock) reads it exactly.
//!
//! Invariants (both): `bytes()` is the sum of the sizes of the items held
//! and, after every `insert`, at most the capacity; an item larger than the
//! capacity is never held; a hash is held at most once (`insert` replaces).
//! S3-FIFO's queues hold at most about twice as many positions as items
//! (a removed item's position is dropped when eviction reaches it, or by
//! compacting the queues when removals left too many).
//! Callers hash keys well (the tier passes the engine's key hash); the maps
//! use the hash as it is.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// The policy the tier uses, chosen by measurement (module docs).
pub(crate) type Policy<V> = S3Fifo<V>;

/// A hasher for keys that are hashes already.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        // The key hash's high bits pick the tier shard; mix so the map's
        // buckets see the others too.
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IdMap<T> = HashMap<u64, T, BuildHasherDefault<IdHasher>>;

/// Highest access count of an item in the main FIFO.
const FREQ_MAX: u8 = 3;

struct Slot<V> {
    h: u64,
    bytes: u64,
    /// Bumped every time the slot is freed: queue positions of an item
    /// removed meanwhile are recognised and skipped.
    gen: u32,
    /// The access count (module docs: written by readers too).
    freq: AtomicU8,
    main: bool,
    val: Option<V>,
}

/// S3-FIFO over byte sizes (module docs).
pub(crate) struct S3Fifo<V> {
    cap: u64,
    small_cap: u64,
    map: IdMap<u32>,
    slots: Vec<Slot<V>>,
    free: Vec<u32>,
    small: VecDeque<(u32, u32)>,
    main: VecDeque<(u32, u32)>,
    small_bytes: u64,
    main_bytes: u64,
    /// Hashes evicted from the small FIFO, oldest first, each with the
    /// number it was pushed as; `ghost_at` maps a hash to its newest push.
    ghost: VecDeque<(u64, u64)>,
    ghost_at: IdMap<u64>,
    ghost_pushes: u64,
}

impl<V> S3Fifo<V> {
    pub(crate) fn new(cap: u64) -> S3Fifo<V> {
        S3Fifo {
            cap,
            small_cap: cap / 10,
            map: IdMap::default(),
            slots: Vec::new(),
            free: Vec::new(),
            small: VecDeque::new(),
            main: VecDeque::new(),
            small_bytes: 0,
            main_bytes: 0,
            ghost: VecDeque::new(),
            ghost_at: IdMap::default(),
            ghost_pushes: 0,
        }
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.small_bytes + self.main_bytes
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The item of `h`, counted as read: its count is raised unless it
    /// is at [`FREQ_MAX`] already (no write then).
    pub(crate) fn get(&self, h: u64) -> Option<&V> {
        let &i = self.map.get(&h)?;
        let s = &self.slots[i as usize];
        let f = s.freq.load(Relaxed);
        if f < FREQ_MAX {
            s.freq.store(f + 1, Relaxed);
        }
        s.val.as_ref()
    }

    /// The item of `h`, not counted as read.
    pub(crate) fn peek(&self, h: u64) -> Option<&V> {
        self.map.get(&h).and_then(|&i| self.slots[i as usize].val.as_ref())
    }

    /// The item of `h`, to change in place (its size unchanged), not
    /// counted as read.
    pub(crate) fn peek_mut(&mut self, h: u64) -> Option<&mut V> {
        let &i = self.map.get(&h)?;
        self.slots[i as usize].val.as_mut()
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, h: u64) -> bool {
        self.map.contains_key(&h)
    }

    /// Hold `v` (of `bytes`) for `h`, replacing what `h` held; evicts as
    /// needed and hands the evicted items to `evicted`. An item larger
    /// than the capacity is not held (false).
    pub(crate) fn insert(&mut self, h: u64, v: V, bytes: u64, mut evicted: impl FnMut(V)) -> bool {
        self.remove(h);
        if bytes > self.cap {
            return false;
        }
        let to_main = self.ghost_at.remove(&h).is_some();
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { h: 0, bytes: 0, gen: 0, freq: AtomicU8::new(0), main: false, val: None });
                (self.slots.len() - 1) as u32
            }
        };
        let s = &mut self.slots[i as usize];
        (s.h, s.bytes, *s.freq.get_mut(), s.main, s.val) = (h, bytes, 0, to_main, Some(v));
        let pos = (i, s.gen);
        if to_main {
            self.main.push_back(pos);
            self.main_bytes += bytes;
        } else {
            self.small.push_back(pos);
            self.small_bytes += bytes;
        }
        self.map.insert(h, i);
        while self.bytes() > self.cap {
            if let Some(v) = self.evict_one() {
                evicted(v);
            }
        }
        self.compact_if_sparse();
        true
    }

    /// Drop `h`'s item (a write of its key); returns it. An item of the
    /// main FIFO leaves its hash in the ghost, so that the key's next
    /// version, when admitted, goes back to the main FIFO.
    pub(crate) fn remove(&mut self, h: u64) -> Option<V> {
        let i = self.map.remove(&h)?;
        let main = self.slots[i as usize].main;
        let v = self.free_slot(i);
        if main {
            self.push_ghost(h);
        }
        // The item's queue position stays until eviction pops it, which a
        // cache under its capacity never does: bound the positions left.
        if self.small.len() + self.main.len() > 2 * self.map.len() + 32 {
            let slots = &self.slots;
            self.small.retain(|&pos| Self::current_in(slots, pos));
            self.main.retain(|&pos| Self::current_in(slots, pos));
        }
        self.compact_if_sparse();
        Some(v)
    }

    /// Give back the memory of the slots, map entries, queue positions and
    /// ghost entries that fewer, larger items left unused (the bytes bound
    /// counts an item's share of them, [`crate::tier::ITEM_OVERHEAD_BYTES`],
    /// while it is held; a shard once full of small items kept their
    /// slots and maps' capacity after larger ones replaced them), once
    /// free slots are most of them: the live slots are renumbered in
    /// order, and every structure shrinks to what it holds. Amortised: it
    /// runs again only after as many slots are freed.
    fn compact_if_sparse(&mut self) {
        if self.free.len() <= 2 * self.map.len() + 64 {
            return;
        }
        let mut renumber = vec![u32::MAX; self.slots.len()];
        let mut n = 0u32;
        for (i, s) in self.slots.iter().enumerate() {
            if s.val.is_some() {
                renumber[i] = n;
                n += 1;
            }
        }
        let slots = &self.slots;
        let moved = |pos: &mut (u32, u32)| {
            let keep = Self::current_in(slots, *pos);
            pos.0 = renumber[pos.0 as usize];
            keep
        };
        self.small.retain_mut(moved);
        self.main.retain_mut(moved);
        self.slots.retain(|s| s.val.is_some());
        for i in self.map.values_mut() {
            *i = renumber[*i as usize];
        }
        self.free = Vec::new();
        // The ghost down to as many hashes as items held, oldest out first
        // (as `push_ghost` keeps it; evictions from the main FIFO push
        // none, so it may hold more until then).
        while self.ghost_at.len() > self.map.len().max(16) {
            let Some((old, n)) = self.ghost.pop_front() else { break };
            if self.ghost_at.get(&old) == Some(&n) {
                self.ghost_at.remove(&old);
            }
        }
        let ghost_at = &self.ghost_at;
        self.ghost.retain(|(h, n)| ghost_at.get(h) == Some(n));
        self.slots.shrink_to_fit();
        self.map.shrink_to_fit();
        self.small.shrink_to_fit();
        self.main.shrink_to_fit();
        self.ghost.shrink_to_fit();
        self.ghost_at.shrink_to_fit();
    }

    /// Hand `f` each item held (none counted as read), in no particular
    /// order, until it returns false; false if it did.
    pub(crate) fn visit(&self, mut f: impl FnMut(&V) -> bool) -> bool {
        self.map.values().filter_map(|&i| self.slots[i as usize].val.as_ref()).all(&mut f)
    }

    /// Drop every item `keep` refuses; returns how many went.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&V) -> bool) -> usize {
        let gone: Vec<u64> = self
            .map
            .iter()
            .filter(|&(_, &i)| !self.slots[i as usize].val.as_ref().is_some_and(&mut keep))
            .map(|(&h, _)| h)
            .collect();
        for &h in &gone {
            self.remove(h);
        }
        gone.len()
    }

    fn free_slot(&mut self, i: u32) -> V {
        let s = &mut self.slots[i as usize];
        if s.main {
            self.main_bytes -= s.bytes;
        } else {
            self.small_bytes -= s.bytes;
        }
        s.gen = s.gen.wrapping_add(1);
        self.free.push(i);
        s.val.take().expect("a held slot has its value")
    }

    /// Whether a queue position is still its item's.
    fn current(&self, pos: (u32, u32)) -> bool {
        Self::current_in(&self.slots, pos)
    }

    fn current_in(slots: &[Slot<V>], (i, gen): (u32, u32)) -> bool {
        let s = &slots[i as usize];
        s.gen == gen && s.val.is_some()
    }

    /// One step of eviction: an item out (Some), or an item moved or
    /// reinserted (None).
    fn evict_one(&mut self) -> Option<V> {
        if self.small_bytes > self.small_cap || self.main_bytes == 0 {
            let pos = self.small.pop_front()?;
            if !self.current(pos) {
                return None;
            }
            let s = &mut self.slots[pos.0 as usize];
            if *s.freq.get_mut() > 0 {
                // Read while in the small FIFO: into the main one.
                (*s.freq.get_mut(), s.main) = (0, true);
                let b = s.bytes;
                self.small_bytes -= b;
                self.main_bytes += b;
                self.main.push_back(pos);
                return None;
            }
            let h = s.h;
            self.map.remove(&h);
            let v = self.free_slot(pos.0);
            self.push_ghost(h);
            Some(v)
        } else {
            let pos = self.main.pop_front()?;
            if !self.current(pos) {
                return None;
            }
            let s = &mut self.slots[pos.0 as usize];
            if *s.freq.get_mut() > 0 {
                *s.freq.get_mut() -= 1;
                self.main.push_back(pos);
                return None;
            }
            let h = s.h;
            self.map.remove(&h);
            Some(self.free_slot(pos.0))
        }
    }

    /// Remember `h` as evicted; the ghost holds as many hashes as the
    /// cache holds items (at least 16).
    fn push_ghost(&mut self, h: u64) {
        self.ghost_pushes += 1;
        self.ghost.push_back((h, self.ghost_pushes));
        self.ghost_at.insert(h, self.ghost_pushes);
        while self.ghost_at.len() > self.map.len().max(16) {
            let Some((old, n)) = self.ghost.pop_front() else { break };
            if self.ghost_at.get(&old) == Some(&n) {
                self.ghost_at.remove(&old);
            }
        }
        // Entries superseded by a later push of their hash (or consumed by
        // an insert) stay in the deque until they reach its front: bound it.
        if self.ghost.len() > 4 * self.ghost_at.len().max(16) {
            let at = &self.ghost_at;
            self.ghost.retain(|(h, n)| at.get(h) == Some(n));
        }
    }

    #[cfg(test)]
    fn in_main(&self, h: u64) -> bool {
        self.map.get(&h).is_some_and(|&i| self.slots[i as usize].main)
    }

    #[cfg(test)]
    fn in_ghost(&self, h: u64) -> bool {
        self.ghost_at.contains_key(&h)
    }
}

#[cfg(test)]
const NIL: u32 = u32::MAX;

#[cfg(test)]
struct Node<V> {
    h: u64,
    bytes: u64,
    visited: bool,
    /// Towards the newest item, and towards the oldest.
    newer: u32,
    older: u32,
    val: Option<V>,
}

/// SIEVE over byte sizes (module docs); built for the tests' measurement.
#[cfg(test)]
pub(crate) struct Sieve<V> {
    cap: u64,
    bytes: u64,
    map: IdMap<u32>,
    nodes: Vec<Node<V>>,
    free: Vec<u32>,
    newest: u32,
    oldest: u32,
    hand: u32,
}

#[cfg(test)]
impl<V> Sieve<V> {
    pub(crate) fn new(cap: u64) -> Sieve<V> {
        Sieve {
            cap,
            bytes: 0,
            map: IdMap::default(),
            nodes: Vec::new(),
            free: Vec::new(),
            newest: NIL,
            oldest: NIL,
            hand: NIL,
        }
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn get(&mut self, h: u64) -> Option<&mut V> {
        let &i = self.map.get(&h)?;
        let n = &mut self.nodes[i as usize];
        n.visited = true;
        n.val.as_mut()
    }

    pub(crate) fn insert(&mut self, h: u64, v: V, bytes: u64, mut evicted: impl FnMut(V)) -> bool {
        self.remove(h);
        if bytes > self.cap {
            return false;
        }
        while self.bytes + bytes > self.cap {
            let victim = self.victim();
            // The hand stays where the victim was: at the next newer item.
            self.hand = self.nodes[victim as usize].newer;
            let vh = self.nodes[victim as usize].h;
            self.map.remove(&vh);
            evicted(self.unlink(victim));
        }
        let node = Node { h, bytes, visited: false, newer: NIL, older: self.newest, val: Some(v) };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        if self.newest != NIL {
            self.nodes[self.newest as usize].newer = i;
        }
        self.newest = i;
        if self.oldest == NIL {
            self.oldest = i;
        }
        self.bytes += bytes;
        self.map.insert(h, i);
        true
    }

    pub(crate) fn remove(&mut self, h: u64) -> Option<V> {
        let i = self.map.remove(&h)?;
        Some(self.unlink(i))
    }

    /// The first unvisited item from the hand towards the newest
    /// (wrapping to the oldest), clearing visited bits on the way.
    fn victim(&mut self) -> u32 {
        let mut p = if self.hand == NIL { self.oldest } else { self.hand };
        loop {
            let n = &mut self.nodes[p as usize];
            if !n.visited {
                return p;
            }
            n.visited = false;
            p = if n.newer == NIL { self.oldest } else { n.newer };
        }
    }

    fn unlink(&mut self, i: u32) -> V {
        let (newer, older) = (self.nodes[i as usize].newer, self.nodes[i as usize].older);
        if self.hand == i {
            self.hand = newer;
        }
        match newer {
            NIL => self.newest = older,
            n => self.nodes[n as usize].older = older,
        }
        match older {
            NIL => self.oldest = newer,
            o => self.nodes[o as usize].newer = newer,
        }
        let n = &mut self.nodes[i as usize];
        self.bytes -= n.bytes;
        self.free.push(i);
        n.val.take().expect("a linked node has its value")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loadgen::Zipf;
    use granary_io::SimRng;

    /// Uniform in [0, 1) from the seeded generator.
    fn unit(rng: &mut SimRng) -> f64 {
        (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Scrambled Zipfian keys: ranks from [`Zipf`] scattered over the
    /// key space by a hash, as YCSB's scrambled Zipfian does.
    fn zipf_key(z: &Zipf, rng: &mut SimRng) -> u64 {
        z.rank(unit(rng)).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5555
    }

    /// A shard once full of small items, then of a few large ones, holds
    /// slots, map entries, queue positions and ghost entries for about
    /// as many items as it holds (it kept those of every small item: up to
    /// about its capacity again in memory the bytes bound does not count).
    #[test]
    fn memory_follows_the_items_held() {
        let mut c: S3Fifo<Box<[u8]>> = S3Fifo::new(1 << 20);
        let add = |c: &mut S3Fifo<Box<[u8]>>, h: u64, len: usize, read: bool| {
            c.insert(h, vec![h as u8; len].into(), len as u64 + 256, drop);
            if read {
                c.get(h);
            }
        };
        // Twice as many small items as fit, one in three never read (so
        // the small FIFO evicts them into the ghost).
        for h in 0..8_000 {
            add(&mut c, h, 1, h % 3 != 0);
        }
        assert!(c.len() > 3_000 && c.ghost_at.len() > 100, "{} items, {} ghosts", c.len(), c.ghost_at.len());
        for h in 10_000..10_100 {
            add(&mut c, h, 64 << 10, true);
        }
        let n = c.len();
        assert!(n > 0 && n < 20, "{n} items");
        // Free slots are at most twice the items held (and 64) after each
        // change: with the items' own slots, three times.
        let bound = 3 * n + 64;
        assert!(c.slots.len() <= bound, "{} slots for {n} items", c.slots.len());
        assert!(c.map.capacity() <= 2 * bound, "a map of {} for {n} items", c.map.capacity());
        assert!(c.small.len() + c.main.len() <= 2 * bound);
        assert!(c.ghost_at.len() <= n.max(16), "{} ghosts for {n} items", c.ghost_at.len());
        assert!(c.ghost.capacity() <= 8 * bound && c.ghost_at.capacity() <= 2 * bound);
        // Every item held still reads as itself.
        for h in 10_000..10_100 {
            if let Some(v) = c.peek(h) {
                assert!(v.len() == 64 << 10 && v[0] == h as u8, "item {h}");
            }
        }
        // Slots are taken again, in the renumbered order.
        for h in 20_000..20_050 {
            add(&mut c, h, 1, true);
            assert_eq!(c.peek(h).map(|v| v[0]), Some(h as u8));
        }
    }

    /// A cache under test: get, and insert on a miss.
    trait Sim {
        fn access(&mut self, h: u64, bytes: u64) -> bool;
    }
    impl Sim for S3Fifo<()> {
        fn access(&mut self, h: u64, bytes: u64) -> bool {
            self.get(h).is_some() || !self.insert(h, (), bytes, |_| {})
        }
    }
    impl Sim for Sieve<()> {
        fn access(&mut self, h: u64, bytes: u64) -> bool {
            self.get(h).is_some() || !self.insert(h, (), bytes, |_| {})
        }
    }

    /// LRU, the baseline a scan defeats (a map of last-use stamps).
    struct Lru {
        cap: u64,
        bytes: u64,
        clock: u64,
        at: HashMap<u64, (u64, u64)>,
        order: std::collections::BTreeMap<u64, u64>,
    }
    impl Sim for Lru {
        fn access(&mut self, h: u64, bytes: u64) -> bool {
            self.clock += 1;
            if let Some((t, b)) = self.at.get_mut(&h) {
                self.order.remove(t);
                *t = self.clock;
                self.order.insert(self.clock, h);
                let _ = b;
                return true;
            }
            while self.bytes + bytes > self.cap {
                let Some((_, old)) = self.order.pop_first() else { break };
                self.bytes -= self.at.remove(&old).map_or(0, |(_, b)| b);
            }
            self.at.insert(h, (self.clock, bytes));
            self.order.insert(self.clock, h);
            self.bytes += bytes;
            false
        }
    }

    /// Hit ratios of `c` over a Zipfian(0.99) trace of `requests` over
    /// `keys` keys of 1 KiB. With `scan`, the middle half of the trace
    /// interleaves a one-pass scan: each Zipfian request is followed by a
    /// read of a key never read before (and never again). Returns the hit
    /// ratio of the Zipfian requests after the first quarter (warm-up),
    /// and of those in the middle half alone.
    fn replay(c: &mut impl Sim, seed: u64, keys: u64, requests: u64, scan: bool) -> (f64, f64) {
        let z = Zipf::new(keys, 0.99);
        let mut rng = SimRng::new(seed);
        let (mut hits, mut counted, mut mid_hits, mut mid) = (0u64, 0u64, 0u64, 0u64);
        for r in 0..requests {
            let middle = (requests / 4..3 * requests / 4).contains(&r);
            let hit = c.access(zipf_key(&z, &mut rng), 1024);
            if middle && scan {
                c.access(u64::MAX - r, 1024);
            }
            if r >= requests / 4 {
                counted += 1;
                hits += hit as u64;
            }
            if middle {
                mid += 1;
                mid_hits += hit as u64;
            }
        }
        (hits as f64 / counted as f64, mid_hits as f64 / mid as f64)
    }

    /// The measurement that chose the tier's policy: S3-FIFO and SIEVE on
    /// Zipfian(0.99) with and without a one-pass scan, the cache holding
    /// 10% and 1% of the keys. Prints the hit ratios (run with
    /// `--ignored --nocapture`); numbers in docs/ARCHITECTURE.md.
    #[test]
    #[ignore]
    fn hit_ratios() {
        let (keys, requests) = (200_000u64, 2_000_000u64);
        println!("cache  scan   s3fifo         sieve          lru            (after warm-up, during the scan)");
        for frac in [10u64, 100] {
            let cap = keys * 1024 / frac;
            for scan in [false, true] {
                let s3 = replay(&mut S3Fifo::new(cap), 7, keys, requests, scan);
                let sv = replay(&mut Sieve::new(cap), 7, keys, requests, scan);
                let lru = Lru { cap, bytes: 0, clock: 0, at: HashMap::new(), order: Default::default() };
                let lr = replay(&mut { lru }, 7, keys, requests, scan);
                println!(
                    "1/{frac:<4} {scan:<5}  {:.4} {:.4}  {:.4} {:.4}  {:.4} {:.4}",
                    s3.0, s3.1, sv.0, sv.1, lr.0, lr.1
                );
            }
        }
    }

    #[test]
    fn both_bound_their_bytes_and_drop_what_does_not_fit() {
        let seed = 0x51ee_d5ee_d000 ^ std::process::id() as u64;
        let mut rng = SimRng::new(seed);
        let mut s3 = S3Fifo::<u64>::new(10_000);
        let mut sv = Sieve::<u64>::new(10_000);
        let (mut held3, mut heldv) = (std::collections::HashMap::new(), std::collections::HashMap::new());
        for _ in 0..20_000 {
            let h = rng.below(500);
            let b = 1 + rng.below(700);
            match rng.below(4) {
                0 => {
                    assert_eq!(s3.remove(h).is_some(), held3.remove(&h).is_some(), "seed {seed}");
                    assert_eq!(sv.remove(h).is_some(), heldv.remove(&h).is_some(), "seed {seed}");
                }
                1 => {
                    let _ = (s3.get(h), sv.get(h));
                }
                _ => {
                    held3.remove(&h);
                    heldv.remove(&h);
                    assert!(s3.insert(h, b, b, |v| assert!(held3.values().any(|&x| x == v), "seed {seed}")));
                    held3.insert(h, b);
                    held3.retain(|k, _| s3.contains(*k));
                    assert!(sv.insert(h, b, b, |_| {}));
                    heldv.insert(h, b);
                    heldv.retain(|k, _| sv.map.contains_key(k));
                }
            }
            assert!(s3.bytes() <= 10_000 && sv.bytes() <= 10_000, "seed {seed}");
            assert_eq!(s3.bytes(), held3.values().sum::<u64>(), "seed {seed}");
            assert_eq!(sv.bytes(), heldv.values().sum::<u64>(), "seed {seed}");
            assert_eq!((s3.len(), sv.len()), (held3.len(), heldv.len()), "seed {seed}");
            for (&h, &b) in &held3 {
                assert_eq!(s3.peek(h), Some(&b), "seed {seed}");
            }
        }
        assert!(!s3.insert(1, 0, 10_001, |_| {}) && !s3.contains(1));
        assert!(!sv.insert(1, 0, 10_001, |_| {}));
    }

    #[test]
    fn s3fifo_keeps_what_was_read_and_admits_ghosts_to_main() {
        // 10 items of 100 bytes: the small FIFO holds 100 bytes.
        let mut c = S3Fifo::<u64>::new(1_000);
        for h in 0..10 {
            assert!(c.insert(h, h, 100, |_| panic!("room for ten")));
        }
        assert!(c.get(3).is_some());
        let mut out = Vec::new();
        c.insert(10, 10, 100, |v| out.push(v));
        // The oldest unread item went first, into the ghost.
        assert_eq!(out, [0]);
        assert!(c.in_ghost(0) && !c.in_main(3));
        // A one-pass scan evicts only unread items: 3 moved to main.
        for h in 100..200 {
            c.insert(h, h, 100, |v| out.push(v));
        }
        assert!(c.in_main(3));
        assert!(!out.contains(&3));
        assert_eq!(c.bytes(), 1_000);
        // Evicted from small into the ghost: reinserted, it goes to main.
        let ghost = *out.iter().rev().find(|&&h| c.in_ghost(h)).expect("a ghost");
        c.insert(ghost, ghost, 100, |_| {});
        assert!(c.in_main(ghost));
        // A removed item's queue position is skipped, not reused; removed
        // from main, its next version goes back to main.
        assert_eq!(c.remove(3), Some(3));
        assert!(!c.contains(3) && c.in_ghost(3));
        c.insert(3, 33, 100, |_| {});
        assert!(c.in_main(3));
        assert_eq!(c.remove(3), Some(33));
        for h in 300..400 {
            c.insert(h, h, 100, |_| {});
        }
        assert!(c.bytes() <= 1_000);
    }

    /// Items replaced or removed while the cache is under its capacity
    /// (a hot set that fits, written again and again) leave no queue
    /// positions behind without bound: the queues stay within a few times
    /// the items held, in the small FIFO and the main one alike.
    #[test]
    fn s3fifo_queues_stay_bounded_by_the_items_held() {
        let mut c = S3Fifo::<u64>::new(1 << 20);
        for h in 0..10 {
            c.insert(h, h, 100, |_| {});
        }
        // Into the main FIFO: read in the small one, then pushed out of it
        // by large items, which then go, leaving the cache under its
        // capacity (where nothing pops the queues).
        c.get(5);
        for h in 10..22 {
            c.insert(h, h, 100_000, |_| {});
        }
        assert!(c.in_main(5));
        for h in 10..22 {
            c.remove(h);
        }
        for n in 0..100_000u64 {
            let h = [1, 5, n % 10][(n % 3) as usize];
            c.insert(h, n, 100, |_| {});
            if n % 7 == 0 && ![1, 5].contains(&(n % 10)) {
                c.remove(n % 10);
            }
            let queued = c.small.len() + c.main.len();
            assert!(queued <= 4 * c.len() + 64, "{queued} queue positions for {} items after {n} writes", c.len());
        }
        assert!(c.bytes() <= 1 << 20);
        assert_eq!((c.peek(1), c.peek(5)), (Some(&99_999), Some(&99_997)), "the latest writes");
    }

    /// Reads through a shared reference, from several threads at once,
    /// count as reads: the items read survive a scan, the others do not;
    /// a count saturates at `FREQ_MAX`.
    #[test]
    fn s3fifo_reads_through_a_shared_reference_count() {
        let mut c = S3Fifo::<u64>::new(1_000);
        for h in 0..10 {
            assert!(c.insert(h, h, 100, |_| panic!("room for ten")));
        }
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| {
                    for _ in 0..1_000 {
                        for h in (0..10).step_by(2) {
                            assert_eq!(c.get(h), Some(&h));
                        }
                    }
                });
            }
        });
        for h in 0..10 {
            let f = c.slots[c.map[&h] as usize].freq.load(Relaxed);
            assert_eq!(f, if h % 2 == 0 { FREQ_MAX } else { 0 }, "item {h}");
        }
        let mut out = Vec::new();
        for h in 100..130 {
            c.insert(h, h, 100, |v| out.push(v));
        }
        for h in 0..10 {
            assert_eq!(c.contains(h), h % 2 == 0, "item {h}: evicted {out:?}");
        }
    }

    #[test]
    fn sieve_evicts_unvisited_from_the_hand() {
        let mut c = Sieve::<u64>::new(300);
        for h in 0..3 {
            c.insert(h, h, 100, |_| panic!("room for three"));
        }
        c.get(0);
        let mut out = Vec::new();
        c.insert(3, 3, 100, |v| out.push(v));
        // 0 (oldest) was visited: spared, and 1 went.
        assert_eq!(out, [1]);
        c.insert(4, 4, 100, |v| out.push(v));
        assert_eq!(out, [1, 2]);
        c.insert(5, 5, 100, |v| out.push(v));
        // The hand goes on towards the newest; 0 waits for it to come
        // round again (its bit cleared on the first pass).
        assert_eq!(out, [1, 2, 3]);
        c.insert(6, 6, 100, |v| out.push(v));
        assert_eq!(out, [1, 2, 3, 4]);
        assert!(c.map.contains_key(&0));
    }
}
