//! The DRAM tier: hot values kept in DRAM in front of the device
//! ([`crate::OpenOptions::dram_tier_bytes`]), so a GET that hits it does no
//! device read.
//!
//! Items are the stored keys (a namespace's id and the user key, so
//! identity is (namespace, key)) with a copy of the value, its metadata and
//! where its record lies: the location (`pba`), the segment's stamp when
//! it was written, and its sequence number. The tier is sharded by key
//! hash, each shard a [`crate::tier_policy::Policy`] (S3-FIFO) bounded by
//! its share of the bytes, behind a read-write lock on a cache line of its
//! own.
//!
//! The hit path writes as little shared memory as it can, since the
//! hottest items are read by every executor thread at once: a lookup takes
//! its shard's lock for reading (readers of one shard do not wait for each
//! other), the policy's access count is written only when it changes (it
//! saturates: a hot item's hits only read it, `tier_policy`), and the hit
//! is copied out under the lock ([`Hit`]: the value and what the freshness
//! check and the reply need) rather than handed out shared, so no
//! reference count is raised and dropped on the item's line by every
//! reader. The copy is the value's size (an item is at most an eighth of
//! a shard's share, below), where a shared count costs each hit two atomic
//! writes to a line all readers of the item contend for. The one shared
//! write left on a hit is the read lock's reader count in the shard's
//! lock word. A reader whose copy fails the freshness check drops the item
//! only if it is still the same record (`drop_item`: location, segment
//! stamp and sequence number), never a later version admitted meanwhile.
//!
//! Freshness rule: the tier never serves a value older than the device's.
//! A hit is served only when, checked after the lookup, the index still
//! points at the item's location under the key's hash and the segment
//! there still has the item's stamp (it was not reclaimed and reused since
//! the record was read): then the record at that location is the key's
//! current version, which is the value held (records are never changed in
//! place). Anything else is a miss, and the item is dropped. Writers and GC
//! also drop a key's item under its stripe after changing its index entry
//! (`invalidate`; GC moving the same version moves the item with it:
//! `moved`), and a namespace's items go when it is dropped or
//! truncated, so DRAM is not held by items that can no longer be served;
//! the exception is an operation in flight across the drop or truncate,
//! which resolved the old namespace before it and may admit or refresh an
//! item of it after: that item is served only to operations still on the
//! old namespace (which the device would answer the same), and the policy
//! evicts it as it evicts any item no longer read.
//! Expiry and `flush_all` are checked on every hit from the item's
//! expiry time and sequence number, as for a record read from the device.
//!
//! Memory: an item counts its key, its value and [`ITEM_OVERHEAD_BYTES`]
//! (the map slot, the queue positions, the item's header and allocations);
//! each shard holds at most its share of the configured bytes (64 shards,
//! fewer in a tier under 4 MiB: a share is at least 64 KiB, or the whole
//! tier), and an item larger than an eighth of that share is not admitted
//! (asked before the item, a copy of the value, is made: `fits`).

use crate::tier_policy::Policy;
use crate::types::ItemMeta;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// DRAM an item holds beyond its key and value, rounded up: the policy's
/// slot with the item (`Hot`) in it (about 112 bytes) and map entry (about
/// 20), its queue positions (about 12), the ghost's entry for an item
/// (about 35: the ghost holds as many hashes as the tier holds items), and
/// the key's and value's allocations' bookkeeping and rounding (about 48).
pub const ITEM_OVERHEAD_BYTES: u64 = 256;

/// Shards of the tier at most (a power of two).
const SHARDS: usize = 64;

/// A shard's share of the bytes at least: a smaller tier has fewer shards
/// (one below this), so that its items may be as large as a tier of its
/// size can hold (an eighth of the whole tier below this size).
const SHARD_BYTES_MIN: u64 = 64 << 10;

/// An item may take at most this fraction of its shard's share (larger
/// values are not admitted): one large value must not empty a shard of its
/// hot items, and a large value's device read is bandwidth more than
/// latency, where DRAM saves less.
const ITEM_MAX_PER_SHARD: u64 = 8;

/// A value held in DRAM.
#[derive(Debug)]
pub(crate) struct Hot {
    pub key: Box<[u8]>,
    pub value: Box<[u8]>,
    pub meta: ItemMeta,
    pub cas: u64,
    /// The record's sequence number (for `flush_all`'s floor).
    pub seq: u64,
    /// Where the record lies, and its segment's stamp then.
    pub pba: u64,
    pub stamp: u32,
}

impl Hot {
    fn bytes(&self) -> u64 {
        Self::bytes_of(self.key.len(), self.value.len())
    }

    fn bytes_of(key_len: usize, value_len: usize) -> u64 {
        (key_len + value_len) as u64 + ITEM_OVERHEAD_BYTES
    }
}

/// A hit: a copy of an item's value and of what the freshness check and
/// the reply need, taken under its shard's lock ([`Tier::get`]).
#[derive(Debug)]
pub(crate) struct Hit {
    pub value: Vec<u8>,
    pub meta: ItemMeta,
    pub cas: u64,
    pub seq: u64,
    pub pba: u64,
    pub stamp: u32,
}

/// The tier's counters ([`crate::Stats`]'s `dram_*`).
#[derive(Default)]
pub(crate) struct TierCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub admissions: AtomicU64,
    pub evictions: AtomicU64,
}

struct Shard {
    items: Policy<Hot>,
}

/// A shard's lock on cache lines of its own: a reader's write to one
/// shard's lock word does not take the line of its neighbours' away from
/// their readers.
#[repr(align(128))]
struct Padded(RwLock<Shard>);

/// The tier of an open store; `None` of it when it is off.
pub(crate) struct Tier {
    limit: u64,
    /// The largest item admitted (`ITEM_MAX_PER_SHARD`).
    item_max: u64,
    shards: Box<[Padded]>,
    /// The shard count less one (a power of two: a hash's shard is a mask).
    shard_mask: usize,
    pub counters: TierCounters,
}

impl Tier {
    /// A tier of at most `limit` bytes; None for 0 (off).
    pub(crate) fn new(limit: u64) -> Option<Tier> {
        if limit == 0 {
            return None;
        }
        // A power of two from 1 to SHARDS.
        let n = (limit / SHARD_BYTES_MIN).clamp(1, SHARDS as u64).ilog2();
        let per = limit >> n;
        let shards = (0..1usize << n).map(|_| Padded(RwLock::new(Shard { items: Policy::new(per) }))).collect();
        let (item_max, shard_mask) = (per / ITEM_MAX_PER_SHARD, (1usize << n) - 1);
        Some(Tier { limit, item_max, shards, shard_mask, counters: TierCounters::default() })
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    fn lock(&self, h: u64) -> &RwLock<Shard> {
        // The high bits: the index's home slot uses the low ones.
        &self.shards[(h >> 58) as usize & self.shard_mask].0
    }

    /// `h`'s shard, to read (lookups; the policy's counts are atomic).
    fn read(&self, h: u64) -> RwLockReadGuard<'_, Shard> {
        self.lock(h).read().unwrap_or_else(|e| e.into_inner())
    }

    /// `h`'s shard, to change.
    fn shard(&self, h: u64) -> RwLockWriteGuard<'_, Shard> {
        self.lock(h).write().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the item held for `key` (of hash `h`), counted as read by
    /// the policy; the caller checks it is still current (module docs).
    pub(crate) fn get(&self, key: &[u8], h: u64) -> Option<Hit> {
        let s = self.read(h);
        let hot = s.items.get(h)?;
        (*hot.key == *key).then(|| Hit {
            value: hot.value.to_vec(),
            meta: hot.meta,
            cas: hot.cas,
            seq: hot.seq,
            pba: hot.pba,
            stamp: hot.stamp,
        })
    }

    /// Whether an item of a key of `key_len` bytes and a value of
    /// `value_len` is small enough to be admitted: asked before one is
    /// made (a copy of the value).
    pub(crate) fn fits(&self, key_len: usize, value_len: usize) -> bool {
        Hot::bytes_of(key_len, value_len) <= self.item_max
    }

    /// Hold `hot` (read from the device as `key`'s current version) unless
    /// an item of a later version of the key is held already.
    pub(crate) fn admit(&self, h: u64, hot: Hot) {
        let bytes = hot.bytes();
        if bytes > self.item_max {
            return;
        }
        let mut s = self.shard(h);
        if let Some(old) = s.items.peek(h) {
            if *old.key == *hot.key && old.seq >= hot.seq {
                return;
            }
        }
        let mut evicted = 0;
        if s.items.insert(h, hot, bytes, |_| evicted += 1) {
            self.counters.admissions.fetch_add(1, Relaxed);
        }
        drop(s);
        if evicted > 0 {
            self.counters.evictions.fetch_add(evicted, Relaxed);
        }
    }

    /// Whether an item of `key` is held (not counted as a read).
    pub(crate) fn holds(&self, key: &[u8], h: u64) -> bool {
        self.read(h).items.peek(h).is_some_and(|hot| *hot.key == *key)
    }

    /// Hold `hot`, the version of its key a writer just committed (under
    /// the key's stripe), as the key's item: it replaces any item of an
    /// older version; counted as an admission.
    pub(crate) fn refresh(&self, h: u64, hot: Hot) {
        self.admit(h, hot);
    }

    /// Drop `key`'s item: its index entry changed (called under its
    /// stripe), or the item failed the freshness check.
    pub(crate) fn invalidate(&self, key: &[u8], h: u64) {
        // Most writes are of keys the tier does not hold: they look under
        // the read lock, and leave the shard's readers be. (An item a
        // reader admits after this look is caught by the freshness check.)
        if !self.holds(key, h) {
            return;
        }
        let mut s = self.shard(h);
        if s.items.peek(h).is_some_and(|hot| *hot.key == *key) {
            s.items.remove(h);
        }
    }

    /// GC moved `key`'s record of sequence number `seq` from `from` to
    /// `to` (each a location and its segment's stamp), the same version
    /// (called under its stripe): an item of that very record follows it,
    /// so it stays servable. An item of any other record is left (the
    /// freshness check judges it): one of an older version admitted late,
    /// from a segment since reclaimed and reused, may lie at `from`'s
    /// location too, and moved it would pass that check.
    pub(crate) fn moved(&self, key: &[u8], h: u64, seq: u64, from: (u64, u32), to: (u64, u32)) {
        if !self.holds(key, h) {
            return;
        }
        let mut s = self.shard(h);
        let same = |hot: &&mut Hot| *hot.key == *key && (hot.pba, hot.stamp, hot.seq) == (from.0, from.1, seq);
        if let Some(hot) = s.items.peek_mut(h).filter(same) {
            (hot.pba, hot.stamp) = to;
        }
    }

    /// Drop the item `hit` was copied from if it is still the one held
    /// for its key: the same record (location, segment stamp and sequence
    /// number), not a later version admitted meanwhile.
    pub(crate) fn drop_item(&self, h: u64, hit: &Hit) {
        let same = |held: &Hot| (held.pba, held.stamp, held.seq) == (hit.pba, hit.stamp, hit.seq);
        if !self.read(h).items.peek(h).is_some_and(same) {
            return;
        }
        let mut s = self.shard(h);
        if s.items.peek(h).is_some_and(same) {
            s.items.remove(h);
        }
    }

    /// Hand `f` each item held, a shard at a time under its lock (so `f`
    /// must be quick), until it returns false. Not counted as reads.
    pub(crate) fn visit(&self, mut f: impl FnMut(&Hot) -> bool) {
        for s in self.shards.iter() {
            if !s.0.read().unwrap_or_else(|e| e.into_inner()).items.visit(|hot| f(hot)) {
                return;
            }
        }
    }

    /// Drop every item whose stored key `gone` says so (a namespace
    /// dropped or truncated).
    pub(crate) fn drop_keys(&self, gone: impl Fn(&[u8]) -> bool) {
        for s in self.shards.iter() {
            s.0.write().unwrap_or_else(|e| e.into_inner()).items.retain(|hot| !gone(&hot.key));
        }
    }

    /// Its figures now.
    pub(crate) fn stats(&self) -> crate::types::DramStats {
        let (bytes, items) = self.usage();
        let c = &self.counters;
        crate::types::DramStats {
            limit_bytes: self.limit(),
            bytes,
            items,
            hits: c.hits.load(Relaxed),
            misses: c.misses.load(Relaxed),
            admissions: c.admissions.load(Relaxed),
            evictions: c.evictions.load(Relaxed),
        }
    }

    /// Bytes and items held.
    pub(crate) fn usage(&self) -> (u64, u64) {
        self.shards.iter().fold((0, 0), |(b, n), s| {
            let s = s.0.read().unwrap_or_else(|e| e.into_inner());
            (b + s.items.bytes(), n + s.items.len() as u64)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hot(key: &[u8], value_len: usize, seq: u64) -> Hot {
        Hot {
            key: key.into(),
            value: vec![seq as u8; value_len].into(),
            meta: ItemMeta::default(),
            cas: seq,
            seq,
            pba: seq,
            stamp: 1,
        }
    }

    #[test]
    fn off_at_zero_and_bounded_by_its_bytes() {
        assert!(Tier::new(0).is_none());
        let t = Tier::new(64 * 4096).unwrap();
        // Four shards of 64 KiB: more than an eighth of one is not
        // admitted, nor copied (`fits`).
        assert_eq!(t.shards.len(), 4);
        let big = (64 << 10) / 8 - ITEM_OVERHEAD_BYTES as usize - 3;
        assert!(t.fits(3, big) && !t.fits(3, big + 1));
        t.admit(7, hot(b"big", big + 1, 1));
        assert!(t.get(b"big", 7).is_none());
        assert_eq!(t.counters.admissions.load(Relaxed), 0);
        t.admit(7, hot(b"big", big, 1));
        assert!(t.get(b"big", 7).is_some());
        t.invalidate(b"big", 7);
        for i in 0..10_000u64 {
            let k = i.to_le_bytes();
            let h = granary_format::hash::key_hash(&k);
            t.admit(h, hot(&k, 100, 1));
            assert!(t.get(&k, h).is_some() || t.counters.evictions.load(Relaxed) > 0);
        }
        let (bytes, items) = t.usage();
        assert!(bytes <= t.limit(), "{bytes} > {}", t.limit());
        assert!(items > 0 && bytes == items * (8 + 100 + ITEM_OVERHEAD_BYTES));
        let c = &t.counters;
        assert_eq!(c.admissions.load(Relaxed) - 1 - c.evictions.load(Relaxed), items);
    }

    /// A tier too small for 64 shards of 64 KiB has fewer: its items may
    /// be as large as an eighth of a shard of at least 64 KiB, or of the
    /// whole tier below that (an eighth of a 64th of a 100 KB tier is
    /// smaller than any item).
    #[test]
    fn a_small_tier_has_fewer_shards_and_holds_items_of_its_size() {
        for (limit, shards) in [(100_000u64, 1usize), (1 << 20, 16), (3 << 20, 32), (64 << 20, 64)] {
            let t = Tier::new(limit).unwrap();
            assert_eq!(t.shards.len(), shards, "{limit}");
            let value = (limit / shards as u64 / 8 - ITEM_OVERHEAD_BYTES - 1) as usize;
            t.admit(9, hot(b"k", value, 1));
            assert!(t.get(b"k", 9).is_some(), "{limit}: an item of {value} bytes");
            assert!(t.usage().0 <= limit);
        }
    }

    /// A GC move takes along only the item of the very record moved: not
    /// one of another version, or of a record at the same location in an
    /// earlier use of its segment (another stamp), which moved would pass
    /// the freshness check at the new location.
    #[test]
    fn a_move_takes_only_the_item_of_the_record_moved() {
        let t = Tier::new(1 << 20).unwrap();
        let h = 42;
        t.admit(h, hot(b"k", 10, 5)); // at location 5, stamp 1, seq 5
        let at = |t: &Tier| t.get(b"k", h).map(|hit| (hit.pba, hit.stamp));
        t.moved(b"k", h, 4, (5, 1), (9, 2));
        t.moved(b"k", h, 5, (5, 7), (9, 2));
        t.moved(b"other", h, 5, (5, 1), (9, 2));
        assert_eq!(at(&t), Some((5, 1)), "another record's move left the item");
        t.moved(b"k", h, 5, (5, 1), (9, 2));
        assert_eq!(at(&t), Some((9, 2)));
    }

    #[test]
    fn an_older_version_never_replaces_a_newer_one_and_keys_are_compared() {
        let t = Tier::new(1 << 20).unwrap();
        let h = 42;
        t.admit(h, hot(b"a", 10, 5));
        t.admit(h, hot(b"a", 10, 4));
        assert_eq!(t.get(b"a", h).unwrap().seq, 5);
        // Another key of the same hash is not served for this one.
        assert!(t.get(b"b", h).is_none());
        t.invalidate(b"b", h);
        assert!(t.get(b"a", h).is_some());
        t.invalidate(b"a", h);
        assert!(t.get(b"a", h).is_none());
        t.admit(h, hot(b"a", 10, 6));
        let held = t.get(b"a", h).unwrap();
        t.admit(h, hot(b"a", 10, 7));
        // `held` is no longer the item: dropping it leaves the new one.
        t.drop_item(h, &held);
        assert_eq!(t.get(b"a", h).unwrap().seq, 7);
        let mut seen = Vec::new();
        t.visit(|hot| {
            seen.push(hot.key.to_vec());
            true
        });
        assert_eq!(seen, [b"a".to_vec()]);
        t.drop_keys(|k| k == b"a");
        assert_eq!(t.usage(), (0, 0));
    }

    /// Readers of one hot key on several threads, while a writer replaces
    /// its item with later versions and drops it now and then: every hit
    /// is a whole copy of one version (its value matches its sequence
    /// number), and a reader never sees a version older than one it saw.
    #[test]
    fn concurrent_readers_copy_whole_versions_in_order() {
        let t = Tier::new(1 << 20).unwrap();
        let (key, h) = (b"hot".as_slice(), 9u64 << 58);
        // Version n: 64 to 1087 bytes, each n as u8.
        let version = |n: u64| Hot { value: vec![n as u8; 64 + (n % 1024) as usize].into(), ..hot(key, 0, n) };
        t.admit(h, version(1));
        const VERSIONS: u64 = 20_000;
        let done = AtomicU64::new(0);
        std::thread::scope(|sc| {
            let readers: Vec<_> = (0..3)
                .map(|_| {
                    sc.spawn(|| {
                        let (mut last, mut hits) = (0u64, 0u64);
                        // Bounded: the writer's end, or a read count far past it.
                        // The end is checked after a read, so each reader
                        // reads at least once after the last version.
                        for _ in 0..50_000_000u64 {
                            let end = done.load(Relaxed) == 1;
                            if let Some(hit) = t.get(key, h) {
                                hits += 1;
                                assert_eq!(hit.value, *version(hit.seq).value, "a torn copy of {}", hit.seq);
                                assert_eq!((hit.cas, hit.pba), (hit.seq, hit.seq));
                                assert!(hit.seq >= last, "version {} after {last}", hit.seq);
                                last = hit.seq;
                            }
                            if end {
                                break;
                            }
                        }
                        hits
                    })
                })
                .collect();
            for n in 2..=VERSIONS {
                if n % 97 == 0 {
                    // A reader's check failed: it drops what it copied,
                    // which a later version must survive.
                    let stale =
                        Hit { value: Vec::new(), meta: ItemMeta::default(), cas: 0, seq: n - 2, pba: n - 2, stamp: 1 };
                    t.drop_item(h, &stale);
                    assert_eq!(t.get(key, h).map(|hit| hit.seq), Some(n - 1), "a later version was dropped");
                    t.invalidate(key, h);
                    assert!(!t.holds(key, h));
                }
                t.refresh(h, version(n));
                // An older version offered late is refused.
                t.admit(h, version(n - 1));
            }
            done.store(1, Relaxed);
            let hits: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
            assert!(hits > 0);
        });
        assert_eq!(t.get(key, h).unwrap().seq, VERSIONS);
    }
}
