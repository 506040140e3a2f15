//! A namespace's quotas (values, bytes): writes are checked against them,
//! and at the limit a namespace in mode `cache`, in a store that evicts
//! ([`crate::OpenOptions::evict`]), evicts its own values to make room,
//! where one in mode `store`, or in a store that does not evict, refuses
//! the write ([`Error::QuotaExceeded`]).
//!
//! **Checking.** A quota is checked before the write, with no lock, from
//! the namespace's counters: writes running at once may each pass it by
//! one value. At the limit, an overwrite counts as replacing what its key
//! holds now (one read of it). A batch is checked at its commit point,
//! each write counting the batch's earlier ones (`Core::check_quota_after`).
//!
//! **Evicting at the quota.** The index keeps no keys, so a namespace's
//! values are found on the device: segments are read one at a time in the
//! order GC's eviction takes them (least recently touched first, as
//! [`Space::eviction_order`](crate::space::Space::eviction_order) has
//! them; the open segments last), and each value of the namespace that
//! the index still points at leaves it as GC's eviction makes values
//! leave: dropped with no IO when it is its key's only version on the
//! device (and listed in [`DroppedKeys`](crate::keys::DroppedKeys) until
//! its segment is free, so a later write of the key supersedes it and a
//! delete writes a tombstone), replaced by a tombstone when an older
//! version may remain (its `supersedes` flag), so none comes back after a
//! crash. Each value is taken under its key's stripe, awaited: a writer
//! evicts before it takes its own stripes (a batch before its commit
//! point), so it never waits for itself. A value heading a blind
//! overwrite's link has its link settled first (a read of the record it
//! displaced; a value whose displaced record cannot be read is left
//! alone), as GC does: a namespace whose keys are all overwritten
//! blindly would otherwise have nothing to evict. Values of other
//! namespaces are never touched. One pass goes
//! on until the namespace is 1/[`EVICT_SLACK`] of its quota below the
//! limit besides the new value(s), so that a namespace written at its
//! quota reads the log once per that share of its quota, not at every
//! write. A pass that finds nothing more to evict leaves the write
//! refused.
//!
//! The segments are read on the writer's thread (blocking reads, as GC's
//! scans are): the cost of keeping no key in DRAM.

use crate::counters::{Counted, NsCounters};
use crate::error::{Error, Result};
use crate::log::SegmentScanner;
use crate::namespace::{NamespaceMode, NamespaceOptions, NsState};
use crate::nskey::{owner, Owner};
use crate::store::{Core, Found};
use crate::types::Cond;
use granary_format::record::{self, RecordHeader};
use granary_io::AlignedBuf;
use std::sync::atomic::Ordering::Relaxed;

/// A pass of eviction at a quota frees this share (1/N) of the quota
/// beyond what the write needs.
pub(crate) const EVICT_SLACK: u64 = 32;

/// A value of the namespace found in a segment: where, its stored key, its
/// header.
struct Candidate {
    pba: u64,
    key: Vec<u8>,
    hdr: RecordHeader,
}

/// The namespace id a stored key belongs to (engine keys: the default's).
pub(crate) fn id_of(stored: &[u8]) -> u32 {
    match owner(stored) {
        Owner::Ns(id) => id,
        Owner::Engine => crate::nskey::DEFAULT_NS,
    }
}

impl Core {
    /// Refuse a value of `grains` for `key` (stored form) that would take
    /// `ns` past a quota; in a cache, evict `ns`'s own values first (see
    /// the module doc). A write whose condition `cond` fails on what the
    /// key holds is let through (it writes nothing: the write's own check
    /// answers `Exists` or `NotFound`, as without a quota), and evicts
    /// nothing. The caller holds no stripe.
    pub(crate) async fn check_quota(
        &self,
        ns: &NsState,
        c: &NsCounters,
        key: &[u8],
        grains: u64,
        cond: Cond,
    ) -> Result<()> {
        match self.check_quota_after(ns, c, key, grains, (0, 0)).await {
            Err(Error::QuotaExceeded { .. }) if cond != Cond::Always && self.condition_fails(key, cond).await? => {
                Ok(())
            }
            Err(Error::QuotaExceeded { .. }) if self.evicts_at_quota(ns) => {
                self.evict_for_quota(ns, id_of(key), c, 1, grains * self.log.grain()).await?;
                self.check_quota_after(ns, c, key, grains, (0, 0)).await
            }
            r => r,
        }
    }

    /// Whether a write of `key` (stored form) on condition `cond` would
    /// find it unmet now ([`Core::unmet`]).
    async fn condition_fails(&self, key: &[u8], cond: Cond) -> Result<bool> {
        let existing = self.find(key, self.keys.hash(key), false, false).await?;
        let live = existing.as_ref().filter(|f| self.is_live(f, self.clock.now()));
        Ok(Self::unmet(cond, live).is_some())
    }

    /// Whether `ns` evicts its own values at its quota rather than refuse
    /// writes: mode `cache` in a store that evicts.
    pub(crate) fn evicts_at_quota(&self, ns: &NsState) -> bool {
        self.evict && ns.options.mode == NamespaceMode::Cache && ns.options.has_quota()
    }

    /// [`Core::check_quota`] as if `ahead` (values, bytes) were added to
    /// the namespace first (the earlier writes of the same batch), with no
    /// eviction (a batch checks under its stripes).
    pub(crate) async fn check_quota_after(
        &self,
        ns: &NsState,
        c: &NsCounters,
        key: &[u8],
        grains: u64,
        ahead: (u64, u64),
    ) -> Result<()> {
        let NamespaceOptions { max_keys, max_bytes, .. } = ns.options;
        if max_keys.is_none() && max_bytes.is_none() {
            return Ok(());
        }
        let new_bytes = grains * self.log.grain();
        // The counters wrap: a blind overwrite that displaced another
        // namespace's value counts its bytes out of this one until its
        // link settles, which may take it below zero for a while.
        let (keys, bytes) = (
            crate::counters::not_below_zero(c.keys.load(Relaxed)).saturating_add(ahead.0),
            crate::counters::not_below_zero(c.value_bytes.load(Relaxed)).saturating_add(ahead.1),
        );
        let fits = |keys: u64, bytes: u64| {
            if max_keys.is_some_and(|m| keys > m) {
                Some(("keys", max_keys.unwrap_or(0)))
            } else if max_bytes.is_some_and(|m| bytes > m) {
                Some(("bytes", max_bytes.unwrap_or(0)))
            } else {
                None
            }
        };
        if fits(keys.saturating_add(1), bytes.saturating_add(new_bytes)).is_none() {
            return Ok(());
        }
        // At the limit: an overwrite replaces what its key holds now, as
        // the counters count it (any value indexed, expired ones too).
        let h = self.keys.hash(key);
        let (old_keys, old_bytes) = match self.find(key, h, false, false).await? {
            Some(f) if !f.hdr.is_tombstone() => (1, f.hdr.grains(self.log.sb.grain_bytes) * self.log.grain()),
            _ => (0, 0),
        };
        match fits(
            keys.saturating_add(1).saturating_sub(old_keys),
            bytes.saturating_add(new_bytes).saturating_sub(old_bytes),
        ) {
            Some((what, limit)) => Err(Error::QuotaExceeded { name: ns.name.clone(), what, limit }),
            None => Ok(()),
        }
    }

    /// Evict `ns`'s own values until `keys` more values of `bytes` more
    /// bytes fit under its quotas with 1/[`EVICT_SLACK`] of them to spare,
    /// or nothing more is found; returns the values evicted. The caller
    /// holds no stripe.
    ///
    /// Values that could not fit even in an empty namespace (more than its
    /// quotas on their own) are refused at once, evicting nothing.
    /// `id` and `c` are the namespace's id and counters as the write that
    /// asks took them (a truncate meanwhile gives the namespace a new id
    /// and counters: the old generation's values are not evicted for, nor
    /// the new one's by, a write of the old one).
    pub(crate) async fn evict_for_quota(
        &self,
        ns: &NsState,
        id: u32,
        c: &NsCounters,
        keys: u64,
        bytes: u64,
    ) -> Result<u64> {
        if ns.current()?.0 != id {
            // Truncated since: the old generation's values are on their way
            // out (a sweep), and the new one's are not the writer's to evict.
            return Ok(0);
        }
        let NamespaceOptions { max_keys, max_bytes, .. } = ns.options;
        if let Some(m) = max_keys.filter(|&m| keys > m) {
            return Err(Error::QuotaExceeded { name: ns.name.clone(), what: "keys", limit: m });
        }
        if let Some(m) = max_bytes.filter(|&m| bytes > m) {
            return Err(Error::QuotaExceeded { name: ns.name.clone(), what: "bytes", limit: m });
        }
        let target = |max: Option<u64>, need: u64| max.map(|m| m.saturating_sub(need + m / EVICT_SLACK));
        let (keys_at, bytes_at) = (target(max_keys, keys), target(max_bytes, bytes));
        let done = || {
            keys_at.is_none_or(|t| crate::counters::not_below_zero(c.keys.load(Relaxed)) <= t)
                && bytes_at.is_none_or(|t| crate::counters::not_below_zero(c.value_bytes.load(Relaxed)) <= t)
        };
        let mut evicted = 0;
        for (seg, alloc) in self.space.quota_eviction_order() {
            if done() {
                break;
            }
            let stamp = self.space.stamp(seg);
            let Some(found) = self.values_of_in(id, seg, alloc, stamp) else { continue };
            for v in found {
                if done() {
                    break;
                }
                match self.evict_one(seg, stamp, v).await {
                    Ok(true) => evicted += 1,
                    Ok(false) => {}
                    // No room for a tombstone: what was evicted stays so,
                    // and the write is refused if still past the quota.
                    Err(Error::NoSpace { .. }) => return Ok(evicted),
                    Err(e) => return Err(e),
                }
            }
        }
        if evicted > 0 {
            tracing::debug!(namespace = %ns.name, evicted, "evicted at the namespace's quota");
        }
        Ok(evicted)
    }

    /// The values of namespace `id` in segment `seg` (if it still holds
    /// what it held at `alloc`) that the index points at, in log order;
    /// None if the segment is gone or cannot be read (a read error is
    /// GC's to report).
    fn values_of_in(&self, id: u32, seg: u32, alloc: u64, stamp: u32) -> Option<Vec<Candidate>> {
        if !self.space.holds(seg, alloc) {
            return None;
        }
        let mut scan = SegmentScanner::new(self.log.dev.as_ref(), &self.log.sb, self.log.seed, seg, stamp);
        let mut found = Vec::new();
        loop {
            let rec = match scan.next_record() {
                Ok(Some(rec)) => rec,
                Ok(None) => return Some(found),
                // What was found before stays worth evicting.
                Err(_) => return Some(found),
            };
            if rec.hdr.is_tombstone() || !rec.intact {
                continue;
            }
            let key = record::key_of(&rec.hdr, scan.bytes_at(rec.grain));
            let pba = self.space.pba(seg, rec.grain);
            if owner(key) == Owner::Ns(id) && self.keys.index.contains(self.keys.hash(key), pba) {
                found.push(Candidate { pba, key: key.to_vec(), hdr: rec.hdr });
            }
        }
    }

    /// Evict value `v` of segment `seg` (stamp `stamp` when it was read),
    /// under its key's stripe, if the index still points at it; whether
    /// it left the index.
    async fn evict_one(&self, seg: u32, stamp: u32, v: Candidate) -> Result<bool> {
        let (key, h) = (&v.key[..], self.keys.hash(&v.key));
        let _stripe = self.keys.stripe(h).await;
        // Under the stripe neither a write nor GC moves the key's entry, so
        // an index that points at `pba` of an unchanged segment points at
        // the record read.
        if self.space.stamp(seg) != stamp || !self.keys.index.contains(h, v.pba) {
            return Ok(false);
        }
        // A head's link is settled first (as GC does): the record it
        // displaced is read, and indexed again if it is another key's live
        // value. Under the head's stripe, which is the displaced key's too.
        // A displaced record that cannot be read leaves its head alone (as
        // `resolve_all` leaves its link): this write evicts others.
        if let Some(link) = self.keys.links.of_head(v.pba) {
            let (hdr, buf) = match self.log.read_record_async(&self.space, link.old, false).await {
                Ok(read) => read,
                Err(e) => {
                    tracing::debug!(error = %e, "quota eviction skips a value whose displaced record cannot be read");
                    return Ok(false);
                }
            };
            let displaced = record::key_of(&hdr, &buf);
            crate::settle::settle(self.parts(), v.pba, &link, displaced, self.keys.hash(displaced))?;
        }
        let bytes = v.hdr.grains(self.log.sb.grain_bytes) * self.log.grain();
        let fetched = crate::gc::read_since_written(&self.keys, h, v.pba);
        if v.hdr.supersedes {
            // An older version may remain on the device: a tombstone
            // stands for this one.
            let Some(&entry) = self.keys.index.lookup(h).as_slice().iter().find(|e| e.pba() == v.pba) else {
                return Ok(false);
            };
            let f = Found { entry, hdr: v.hdr, buf: AlignedBuf::zeroed(0), via: None };
            // The engine's write, not a user's delete (figures).
            self.write_tombstone_of(key, h, Some(f), false).await?;
        } else {
            if !self.keys.index.remove(h, v.pba) {
                return Ok(false);
            }
            self.keys.invalidate(key, h);
            // Until `seg` is free on the device this version is still there.
            self.keys.dropped.insert(seg, h);
            self.space.sub_live(seg, bytes);
            self.counters.removed(key, Counted::new(false, bytes));
        }
        crate::gc::count_leaving(self.collector(), key, false, fetched);
        Ok(true)
    }
}
