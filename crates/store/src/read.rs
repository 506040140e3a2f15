//! The read path: GETs, and the lookup of a key's current version that
//! writes rely on too ([`Core::find`]).
//!
//! GET: hash the key, collect the index entries whose home and tag match,
//! read each candidate record (one IO of the entry's size, a second one only
//! for records too large for the entry's size field), compare the full key.
//!
//! Readers hold no lock across IO, so GC may move a record and reuse its
//! segment between a lookup and the read. Every read is therefore validated
//! afterwards: the entries it relied on must still be in the index, or it
//! starts over.
//!
//! Every record read back is checked against its checksums, its segment's
//! stamp and the size its index entry gives (`Log::read_record`); a
//! record that fails is corruption, never a value.
//!
//! With the DRAM tier on ([`crate::tier`]), a GET first asks it: an item
//! still current by the tier's freshness rule is served with no device
//! read; a miss reads the device and offers the live value it found to the
//! tier (not one found through a blind overwrite's link, whose location
//! the index does not hold).

use crate::access::{Access, Clock0, ItemAccess};
use crate::error::{Error, Result};
use crate::namespace::NsState;
use crate::store::{Core, Found};
use crate::tier::{Hit, Hot};
use crate::types::{Item, ItemMeta};
use crate::zerocopy::{Bytes, ValueBuf};
use granary_format::record::{self, RecordHeader};
use granary_index::Entry;
use std::sync::atomic::Ordering::Relaxed;

/// What a read records of its key's use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    /// A GET: its item is marked read (with access tracking) and, in cache
    /// mode, its segment recently used (eviction takes the least recent).
    Read,
    /// Its segment marked recently used only (the caller marks the item).
    Segment,
    /// Neither (memcache's `u` flag: the item's recency is left as it was).
    Quiet,
}

/// A GET's live version of a key: read from the device, or copied from
/// the DRAM tier.
pub(crate) enum Live {
    Dev(Found),
    Hot(Hit),
}

impl Live {
    /// Where its record lies.
    fn pba(&self) -> u64 {
        match self {
            Live::Dev(f) => f.entry.pba(),
            Live::Hot(h) => h.pba,
        }
    }

    /// Found through a blind overwrite's link (no index entry of its own).
    fn linked(&self) -> bool {
        matches!(self, Live::Dev(f) if f.via.is_some())
    }

    /// Its item (a tier hit's copy is kept, not copied again).
    pub(crate) fn into_item(self) -> Item {
        match self {
            Live::Dev(f) => Core::item_of(&f),
            Live::Hot(h) => Item { value: h.value, meta: h.meta, cas: h.cas },
        }
    }

    /// The value's bytes.
    pub(crate) fn value(&self) -> &[u8] {
        match self {
            Live::Dev(f) => record::value_of(&f.hdr, &f.buf),
            Live::Hot(h) => &h.value,
        }
    }
}

impl Core {
    /// Find the current version of `key`, reading the whole record with
    /// `full`. A candidate whose record is unreadable is skipped; if no
    /// candidate matches and one was unreadable, `strict` returns that error
    /// (the key may have been the unreadable one). The entries relied on are
    /// checked to still be in the index after the reads; if one is gone, GC
    /// or a writer moved it meanwhile and the search starts over. A whole
    /// record's checksum is checked after that check, so that the check's
    /// index reads overlap the record's copy still arriving (in-memory
    /// device) and a record that moved is never checked at all. On an
    /// executor over the in-memory device the lookup's line is asked for
    /// and the task yields first
    /// ([`Device::in_memory`](granary_io::Device::in_memory)), for every
    /// caller (GETs, and the writes that look up the current version, some
    /// with the key's stripe lock held).
    pub(crate) async fn find(&self, key: &[u8], h: u64, full: bool, strict: bool) -> Result<Option<Found>> {
        if self.log.dev.in_memory() && granary_rt::on_runtime() {
            // The lookup's cache miss overlaps other tasks' work, as the
            // record's copy does (`Device::in_memory`).
            self.keys.index.prefetch(h);
            granary_rt::yield_now().await;
        }
        'retry: loop {
            let cands = self.keys.index.lookup(h);
            let mut unreadable = None;
            let mut found = None;
            let mut other_key = false;
            for &entry in cands.as_slice() {
                match self.log.read_record_async(&self.space, entry, false).await {
                    Ok((hdr, buf)) => {
                        if record::key_of(&hdr, &buf) == key {
                            found = Some(Found { entry, hdr, buf, via: None });
                            break;
                        }
                    }
                    Err(e @ Error::Corruption { .. }) => unreadable = Some(e),
                    Err(e) => return Err(e),
                }
                // Not the key (or unreadable): another key's blind
                // overwrite may have displaced it ([`crate::links`]).
                other_key = true;
                let Some(link) = self.keys.links.of_head(entry.pba()) else { continue };
                if *link.key == *key {
                    // The head is this key's (an unreadable one): what it
                    // displaced is this key's older version, dead.
                    continue;
                }
                match self.log.read_record_async(&self.space, link.old, false).await {
                    Ok((hdr, buf)) if record::key_of(&hdr, &buf) == key => {
                        found = Some(Found { entry: link.old, hdr, buf, via: Some(entry.pba()) });
                        break;
                    }
                    Ok(_) => {}
                    Err(e @ Error::Corruption { .. }) => unreadable = Some(e),
                    Err(e) => return Err(e),
                }
            }
            let still = match &found {
                Some(f) => self.still_found(h, f),
                // A link settled meanwhile may have put the key back in
                // the index after the lookup: then the candidates changed.
                None if other_key => self.same_candidates(h, cands.as_slice()),
                None => self.still_indexed(h, cands.as_slice()),
            };
            if !still {
                continue 'retry;
            }
            let Some(f) = found else {
                if let Some(e) = &unreadable {
                    tracing::warn!(error = %e, "unreadable index candidate");
                }
                return match unreadable {
                    Some(e) if strict => Err(e),
                    _ => Ok(None),
                };
            };
            if !full {
                return Ok(Some(f));
            }
            let offset = f.entry.pba() * self.log.grain();
            if f.buf.len() as u64 >= f.hdr.record_bytes() {
                record::verify_crc(self.log.seed, &f.hdr, &f.buf)
                    .map_err(|fe| Error::Corruption { offset, detail: fe.to_string() })?;
                if f.hdr.damaged_copy {
                    let detail = "record was damaged before GC relocated it".to_string();
                    return Err(Error::Corruption { offset, detail });
                }
                return Ok(Some(f));
            }
            // The rest of a record larger than its first read: read whole
            // and checked, and relied on only if still current after it.
            let whole = self.log.read_record_async(&self.space, f.entry, true).await;
            if !self.still_found(h, &f) {
                continue 'retry;
            }
            let (hdr, buf) = whole?;
            return Ok(Some(Found { entry: f.entry, hdr, buf, via: f.via }));
        }
    }

    /// Whether `h`'s candidates are exactly `cands` (in any order).
    pub(crate) fn same_candidates(&self, h: u64, cands: &[Entry]) -> bool {
        let now = self.keys.index.lookup(h);
        // (An entry an insert displaced since is the same candidate.)
        now.as_slice().len() == cands.len() && cands.iter().all(|e| now.as_slice().iter().any(|n| n.same_record(*e)))
    }

    /// Whether a found version is still where it was found: in the index,
    /// or still displaced by the head it was found through (or put back
    /// in the index since).
    fn still_found(&self, h: u64, f: &Found) -> bool {
        let pba = f.entry.pba();
        match f.via {
            None => self.keys.index.contains(h, pba),
            Some(head) => {
                let linked = self.keys.links.of_head(head).is_some_and(|l| l.old.pba() == pba);
                (linked && self.keys.index.contains(h, head)) || self.keys.index.contains(h, pba)
            }
        }
    }

    /// Whether every one of `entries` is in the index under hash `h`.
    /// One entry (a found record, the common case) is asked with
    /// [`Index::contains`](granary_index::Index::contains), which gathers no
    /// candidates: the record at that location under `h` is the one read
    /// (a location is reused only once GC has moved every entry out of its
    /// segment). None (no candidate at the lookup) needs no second look:
    /// the key was absent then.
    fn still_indexed(&self, h: u64, entries: &[Entry]) -> bool {
        match entries {
            [] => true,
            [e] => self.keys.index.contains(h, e.pba()),
            _ => {
                let now = self.keys.index.lookup(h);
                entries.iter().all(|e| now.as_slice().iter().any(|n| n.same_record(*e)))
            }
        }
    }

    /// Whether a found version is a value that has not expired.
    pub(crate) fn is_live(&self, f: &Found, now: u32) -> bool {
        !f.hdr.is_tombstone() && !self.log.hidden(&f.hdr, record::key_of(&f.hdr, &f.buf), now)
    }

    /// The value of `key` in `ns`, or None if absent, deleted or expired.
    pub async fn get(&self, ns: &NsState, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.get_item(ns, key).await?.map(|i| i.value))
    }

    /// The value of `key` in `ns` with its metadata and CAS value.
    pub async fn get_item(&self, ns: &NsState, key: &[u8]) -> Result<Option<Item>> {
        let (key, c) = self.scoped(ns, key)?;
        let found = self.read_live(&key, Use::Read).await?;
        c.got(found.is_some());
        Ok(found.map(Live::into_item))
    }

    /// [`Core::get_item`] without the reserved-namespace check (the
    /// engine's own keys: never through the DRAM tier).
    pub(crate) async fn read_item(&self, key: &[u8]) -> Result<Option<Item>> {
        self.counters.gets.fetch_add(1, Relaxed);
        Ok(self.read_dev(key, self.keys.hash(key), Use::Read).await?.as_ref().map(Self::item_of))
    }

    /// A GET's lookup: `key`'s live value, from the DRAM tier or else the
    /// whole record from the device, counted, and recording the use that
    /// `used` says.
    pub(crate) async fn read_live(&self, key: &[u8], used: Use) -> Result<Option<Live>> {
        self.counters.gets.fetch_add(1, Relaxed);
        let h = self.keys.hash(key);
        let Some(tier) = &self.keys.tier else {
            return Ok(self.read_dev(key, h, used).await?.map(Live::Dev));
        };
        if let Some(hot) = self.read_hot(tier, key, h, used) {
            return Ok(hot.map(Live::Hot));
        }
        tier.counters.misses.fetch_add(1, Relaxed);
        self.read_dev_offered(tier, key, h, used).await
    }

    /// After the DRAM tier missed `key` (counted): its live record from
    /// the device, offered to the tier.
    pub(crate) async fn read_dev_offered(
        &self,
        tier: &crate::tier::Tier,
        key: &[u8],
        h: u64,
        used: Use,
    ) -> Result<Option<Live>> {
        let Some(f) = self.read_dev(key, h, used).await? else { return Ok(None) };
        if f.via.is_none() {
            self.offer_hot(tier, key, h, &f.hdr, &f.buf, f.entry.pba());
        }
        Ok(Some(Live::Dev(f)))
    }

    /// A GET's answer from the DRAM tier: `Some(Some(item))` for an item
    /// still current by the freshness rule, `Some(None)` for one that has
    /// expired (absent), None when the tier has nothing current (the
    /// caller counts the miss and reads the device).
    pub(crate) fn read_hot(&self, tier: &crate::tier::Tier, key: &[u8], h: u64, used: Use) -> Option<Option<Hit>> {
        let bump = used == Use::Read;
        let hot = tier.get(key, h)?;
        if !self.is_current(h, hot.pba, hot.stamp) {
            tier.drop_item(h, &hot);
            return None;
        }
        let seg = self.log.sb.segment_of(hot.pba);
        let now = if hot.meta.expires != 0 || (bump && self.track_access) { self.clock.now() } else { 0 };
        if self.log.hidden_at(hot.seq, hot.meta.expires, key, now) {
            tier.drop_item(h, &hot);
            tier.counters.misses.fetch_add(1, Relaxed);
            return Some(None);
        }
        tier.counters.hits.fetch_add(1, Relaxed);
        self.counters.get_hits.fetch_add(1, Relaxed);
        if self.evict && used != Use::Quiet {
            self.space.touch(seg);
        }
        if bump && self.track_access {
            let c = self.access_clock;
            self.keys.index.access(h, hot.pba, |w| c.bumped(w, now));
        }
        Some(Some(hot))
    }

    /// The DRAM tier's freshness rule (`crate::tier`) for an item of key
    /// hash `h` read from `pba` when its segment had stamp `stamp`: the index
    /// still points there, and then (so a reuse of the segment that a newer
    /// version of the key could land in is seen) the segment there is still
    /// the one the record was read from.
    pub(crate) fn is_current(&self, h: u64, pba: u64, stamp: u32) -> bool {
        let indexed = self.keys.index.contains(h, pba);
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        indexed && self.space.stamp(self.log.sb.segment_of(pba)) == stamp
    }

    /// Offer the DRAM tier the live record `buf` of `key` just read from
    /// the device at `pba` (indexed there, not found through a link).
    pub(crate) fn offer_hot(
        &self,
        tier: &crate::tier::Tier,
        key: &[u8],
        h: u64,
        hdr: &RecordHeader,
        buf: &[u8],
        pba: u64,
    ) {
        let value = record::value_of(hdr, buf);
        if !tier.fits(key.len(), value.len()) {
            return;
        }
        tier.admit(
            h,
            Hot {
                key: key.into(),
                value: value.into(),
                meta: ItemMeta { flags: hdr.user_flags, expires: hdr.expires, stale: hdr.stale },
                cas: record::cas_of(hdr, buf),
                seq: hdr.seq,
                pba,
                stamp: hdr.seg_stamp,
            },
        );
    }

    /// [`Core::read_live`] from the device.
    async fn read_dev(&self, key: &[u8], h: u64, used: Use) -> Result<Option<Found>> {
        let bump = used == Use::Read;
        let Some(f) = self.find(key, h, true, true).await? else { return Ok(None) };
        if f.hdr.batch {
            // Its batch may be half visible still: read once all of it is.
            self.keys.publishing.wait(f.hdr.seq).await;
        }
        // The clock is read only when something needs it (a clock read is
        // a visible share of an in-memory GET): a record without an expiry time is live at
        // any `now`, and 0 stands in for it then.
        let now = if f.hdr.expires != 0 || (bump && self.track_access) { self.clock.now() } else { 0 };
        if !self.is_live(&f, now) {
            return Ok(None);
        }
        self.counters.get_hits.fetch_add(1, Relaxed);
        if self.evict && used != Use::Quiet {
            self.space.touch(self.log.sb.segment_of(f.entry.pba()));
        }
        if bump && self.track_access {
            let c = self.access_clock;
            self.keys.index.access(h, f.entry.pba(), |w| c.bumped(w, now));
        }
        Ok(Some(f))
    }

    /// The item of `key` with its access state before this read: marked
    /// read, and its segment (cache mode) recently used, unless `!bump`
    /// (memcache `u`), and handed the item's win token
    /// when `want_win(item)` and no reader had it yet. Without access
    /// tracking the state reads "never read, accessed now, no token" and
    /// every reader that wants the token wins it.
    pub async fn get_item_access(
        &self,
        ns: &NsState,
        key: &[u8],
        bump: bool,
        want_win: impl Fn(&Item) -> bool,
    ) -> Result<Option<ItemAccess>> {
        let (key, c) = self.scoped(ns, key)?;
        // The item's access word is marked below, with its prior state read.
        let found = self.read_live(&key, if bump { Use::Segment } else { Use::Quiet }).await?;
        c.got(found.is_some());
        let Some(f) = found else { return Ok(None) };
        Ok(Some(self.with_access(self.keys.hash(&key), f, bump, want_win)))
    }

    /// The item `f` found under key hash `h`, with its access state before
    /// this read: marked read when `bump`, and handed the item's win token
    /// when `want_win(item)` and no reader had it yet (neither: nothing is
    /// written).
    fn with_access(&self, h: u64, f: Live, bump: bool, want_win: impl Fn(&Item) -> bool) -> ItemAccess {
        let (pba, linked) = (f.pba(), f.linked());
        let item = f.into_item();
        let want = want_win(&item);
        let (prior, won) = self.mark_access(h, pba, linked, bump, want);
        ItemAccess { item, prior, won }
    }

    /// [`Core::with_access`]'s marking of the version at `pba` (found
    /// through a link when `linked`), whose reader's want of the win token
    /// `want` says: the state before it, and whether it won the token.
    pub(crate) fn mark_access(&self, h: u64, pba: u64, linked: bool, bump: bool, want: bool) -> (Access, bool) {
        let now = self.clock.now();
        let fresh = crate::Access { fetched: false, last_access: now, win_sent: false };
        // Found through a blind overwrite's link, it has no index entry (so
        // no access word) until the link is settled: read as untracked.
        if !self.track_access || linked {
            return (fresh, want);
        }
        let c = self.access_clock;
        let old = self.keys.index.access(h, pba, |w| {
            let w2 = if bump { c.bumped(w, now) } else { w };
            if want && !Clock0::is_won(w) {
                Clock0::won(w2)
            } else {
                w2
            }
        });
        // None: a writer replaced the version just read; it reads as new.
        match old {
            Some(w) => (c.decode(w), want && !Clock0::is_won(w)),
            None => (fresh, false),
        }
    }

    /// An inspection's read of `key` (a key dump, memcache `me`): its live
    /// item with its access state, as [`Core::get_item_access`] gives it
    /// without a bump or a token, but not counted as a GET (the store's,
    /// the namespace's or the DRAM tier's), not touching its segment (a
    /// cache's recency, which eviction follows) and not offered to the
    /// tier (read from the device, whose version the tier's equals): an
    /// inspection of every key leaves the figures and what eviction sees
    /// as they were.
    pub async fn peek_item_access(&self, ns: &NsState, key: &[u8]) -> Result<Option<ItemAccess>> {
        let (key, _) = self.scoped(ns, key)?;
        let h = self.keys.hash(&key);
        let Some(f) = self.find(&key, h, true, true).await? else { return Ok(None) };
        if f.hdr.batch {
            self.keys.publishing.wait(f.hdr.seq).await;
        }
        if !self.is_live(&f, self.clock.now()) {
            return Ok(None);
        }
        Ok(Some(self.with_access(h, Live::Dev(f), false, |_| false)))
    }

    /// The value of `key` in the buffer it was read into (zero-copy).
    pub async fn get_buf(&self, ns: &NsState, key: &[u8]) -> Result<Option<ValueBuf>> {
        let (key, c) = self.scoped(ns, key)?;
        let found = self.read_live(&key, Use::Read).await?;
        c.got(found.is_some());
        let f = match found {
            None => return Ok(None),
            Some(Live::Hot(hot)) => {
                let (len, meta, cas) = (hot.value.len(), hot.meta, hot.cas);
                let buf = Bytes::Owned(hot.value.into_boxed_slice());
                return Ok(Some(ValueBuf { buf, start: 0, len, meta, cas }));
            }
            Some(Live::Dev(f)) => f,
        };
        Ok(Some(ValueBuf {
            start: f.hdr.value_start(),
            len: f.hdr.user_value_len() as usize,
            meta: ItemMeta { flags: f.hdr.user_flags, expires: f.hdr.expires, stale: f.hdr.stale },
            cas: record::cas_of(&f.hdr, &f.buf),
            buf: Bytes::Record(f.buf),
        }))
    }

    pub(crate) fn item_of(f: &Found) -> Item {
        Item {
            value: record::value_of(&f.hdr, &f.buf).to_vec(),
            meta: ItemMeta { flags: f.hdr.user_flags, expires: f.hdr.expires, stale: f.hdr.stale },
            cas: record::cas_of(&f.hdr, &f.buf),
        }
    }
}
