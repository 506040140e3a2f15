//! The DRAM tier: hot values kept in DRAM in front of the device
//! ([`crate::OpenOptions::dram_tier_bytes`]), so a GET that hits it does no
//! device read.
//!
//! Items are the stored keys (a namespace's id and the user key, so
//! identity is (namespace, key)) with a copy of the value, its metadata and
//! where its record lies: the location (`pba`), the segment's stamp when
//! it was written, and its sequence number. The tier is sharded by key
//! hash, a mutex per shard, each shard a [`crate::tier_policy::Policy`]
//! (S3-FIFO) bounded by its share of the bytes.
//!
//! Freshness rule: the tier never serves a value older than the device's.
//! A hit is served only when, checked after the lookup, the index still
//! points at the item's location under the key's hash and the segment
//! there still has the item's stamp (it was not reclaimed and reused since
//! the record was read): then the record at that location is the key's
//! current version, which is the value held (records are never changed in
//! place). Anything else is a miss, and the item is dropped. Writers and GC
//! also drop a key's item under its stripe after changing its index entry
//! (`invalidate`), and a namespace's items go when it is dropped or
//! truncated, so DRAM is not held by items that can no longer be served.
//! Expiry and `flush_all` are checked on every hit from the item's
//! expiry time and sequence number, as for a record read from the device.
//!
//! Memory: an item counts its key, its value and [`ITEM_OVERHEAD_BYTES`]
//! (the map slot, the queue positions, the item's header and allocations);
//! each shard holds at most its share of the configured bytes, and an item
//! larger than an eighth of that share is not admitted.

use crate::tier_policy::Policy;
use crate::types::ItemMeta;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

/// DRAM an item holds beyond its key and value, rounded up: the policy's
/// slot (32 bytes) and map entry (about 20), its queue positions (about
/// 12), the ghost's entry for an item (about 35: the ghost holds as many
/// hashes as the tier holds items), the shared item (`Hot` in its `Arc`,
/// about 100 with the allocator's rounding) and the key's and value's
/// allocations' bookkeeping (about 32).
pub const ITEM_OVERHEAD_BYTES: u64 = 256;

/// Shards of the tier (a power of two).
const SHARDS: usize = 64;

/// An item may take at most this fraction of its shard's share (larger
/// values are not admitted): one large value must not empty a shard of its
/// hot items, and a large value's device read is bandwidth more than
/// latency, where DRAM saves less.
const ITEM_MAX_PER_SHARD: u64 = 8;

/// A value held in DRAM, shared with the readers it was handed to.
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
        (self.key.len() + self.value.len()) as u64 + ITEM_OVERHEAD_BYTES
    }
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
    items: Policy<Arc<Hot>>,
}

/// The tier of an open store; `None` of it when it is off.
pub(crate) struct Tier {
    limit: u64,
    /// The largest item admitted (`ITEM_MAX_PER_SHARD`).
    item_max: u64,
    shards: Box<[Mutex<Shard>]>,
    pub counters: TierCounters,
}

impl Tier {
    /// A tier of at most `limit` bytes; None for 0 (off).
    pub(crate) fn new(limit: u64) -> Option<Tier> {
        if limit == 0 {
            return None;
        }
        let per = limit / SHARDS as u64;
        let shards = (0..SHARDS).map(|_| Mutex::new(Shard { items: Policy::new(per) })).collect();
        Some(Tier { limit, item_max: per / ITEM_MAX_PER_SHARD, shards, counters: TierCounters::default() })
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    fn shard(&self, h: u64) -> MutexGuard<'_, Shard> {
        // The high bits: the index's home slot uses the low ones.
        self.shards[(h >> 58) as usize % SHARDS].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The item held for `key` (of hash `h`), counted as read by the
    /// policy; the caller checks it is still current (module docs).
    pub(crate) fn get(&self, key: &[u8], h: u64) -> Option<Arc<Hot>> {
        let mut s = self.shard(h);
        let hot = s.items.get(h)?;
        (*hot.key == *key).then(|| hot.clone())
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
        if s.items.insert(h, Arc::new(hot), bytes, |_| evicted += 1) {
            self.counters.admissions.fetch_add(1, Relaxed);
        }
        drop(s);
        if evicted > 0 {
            self.counters.evictions.fetch_add(evicted, Relaxed);
        }
    }

    /// Whether an item of `key` is held (not counted as a read).
    pub(crate) fn holds(&self, key: &[u8], h: u64) -> bool {
        self.shard(h).items.peek(h).is_some_and(|hot| *hot.key == *key)
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
        let mut s = self.shard(h);
        if s.items.peek(h).is_some_and(|hot| *hot.key == *key) {
            s.items.remove(h);
        }
    }

    /// Drop `hot` if it is still the item held for its key.
    pub(crate) fn drop_item(&self, h: u64, hot: &Arc<Hot>) {
        let mut s = self.shard(h);
        if s.items.peek(h).is_some_and(|held| Arc::ptr_eq(held, hot)) {
            s.items.remove(h);
        }
    }

    /// Hand `f` each item held, a shard at a time under its lock (so `f`
    /// must be quick), until it returns false. Not counted as reads.
    pub(crate) fn visit(&self, mut f: impl FnMut(&Hot) -> bool) {
        for s in self.shards.iter() {
            if !s.lock().unwrap_or_else(|e| e.into_inner()).items.visit(|hot| f(hot)) {
                return;
            }
        }
    }

    /// Drop every item whose stored key `gone` says so (a namespace
    /// dropped or truncated).
    pub(crate) fn drop_keys(&self, gone: impl Fn(&[u8]) -> bool) {
        for s in self.shards.iter() {
            s.lock().unwrap_or_else(|e| e.into_inner()).items.retain(|hot| !gone(&hot.key));
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
            let s = s.lock().unwrap_or_else(|e| e.into_inner());
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
        // More than an eighth of a shard's 4096 bytes: not admitted.
        t.admit(7, hot(b"big", 4096 / 8, 1));
        assert!(t.get(b"big", 7).is_none());
        assert_eq!(t.counters.admissions.load(Relaxed), 0);
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
        assert_eq!(c.admissions.load(Relaxed) - c.evictions.load(Relaxed), items);
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
}
