//! The write path: PUTs in all their modes, read-modify-write (`update`),
//! DELETE, `flush_all`, `sync`, and writing one record and indexing it.
//!
//! PUT/DELETE: wait, holding nothing, until there is room; take the key's
//! stripe lock (which serialises mutations of one key, and GC relocation of
//! it, so conditional modes are exact and sequence numbers of one key only
//! grow), find the current version, decide by mode, take a sequence number,
//! allocate grains, write the record out of place, then point the index at
//! it. The call returns only once the record is on the device (and flushed,
//! with [`Durability::Flush`]). A failed write or flush poisons the store:
//! it refuses further writes until reopened; reads go on. `sync` (the
//! durability barrier) is one flush of the device, and poisons the store
//! the same way when it fails.
//!
//! Writes of one key that queue for its stripe are carried by the next
//! write of it ([`crate::combine`]).
//!
//! Invariants: a record is on the device before its index entry points at
//! it (`commit`, `commit_blind`, `commit_blind_all`); an unconditional PUT
//! replaces its key's one candidate without reading it only where
//! `blind_ok` (or, for a batch or a run's piece, `look_up_all`) allows, and
//! then links the entry it displaces ([`crate::links`]).

use crate::access::{Access, ItemAccess, Policy};
use crate::coalesce::{Payload, Stray};
use crate::combine::{Answer, Claimed, ClaimedUpdates, UpdateAnswer, UpdateWaited, Waited};
use crate::counters::Counted;
use crate::detach::{Finish, Orphaned, Shared};
use crate::error::{Error, Result};
use crate::links::BlindStep;
use crate::namespace::NsState;
use crate::nskey::{owner, user_key, Owner, DEFAULT_NS};
use crate::space::{Held, Loc, Purpose};
use crate::store::{Core, Found, FLUSH_FLOOR_KEY};
use crate::types::{Change, Cond, Item, ItemMeta, PutMode, PutOutcome};
use crate::zerocopy::PutBuf;
use granary_format::limits::*;
use granary_format::record::{self, RecordHeader};
use granary_index::{Entry, IndexError, NEIGHBOURHOOD};
use granary_io::AlignedBuf;
#[cfg(test)]
use granary_rt::block_on;
use granary_rt::sync::join2;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// What a new version of a key carries besides its value.
#[derive(Clone, Copy)]
pub(crate) struct Version {
    meta: ItemMeta,
    /// An explicit CAS value (else the sequence number is).
    cas: Option<u64>,
    policy: Policy,
}

/// What a writer holding a key's stripe knows of the key's current version.
pub(crate) enum Prior {
    /// Found (or known absent) before the write.
    Known(Option<Found>),
    /// Not read yet: found while the new version is written.
    Unread,
    /// Not read at all: the key's one candidate, replaced blindly and
    /// linked ([`crate::links`]).
    Blind(Entry),
}

/// One of the blind overwrites of [`Core::commit_blind_all`].
pub(crate) struct BlindWrite<'a> {
    pub key: &'a [u8],
    pub h: u64,
    /// The entry replaced: the key's one candidate, not read.
    pub e: Entry,
    /// The new record, on the device.
    pub loc: Loc,
    /// The new entry's access word follows it.
    pub policy: Policy,
    /// `e` heads this key's own link, which moves on to the new record
    /// ([`Core::look_up_all`]); else a new link is added.
    pub own_link: bool,
}

/// A record's write handed on with its IO in flight: dropped before that
/// IO ends (a runtime shutting down drops what was handed to it), the
/// store is poisoned, and the allocation kept: the IO may still land, so
/// its segment must not be reused (a poisoned store allocates nothing and
/// GC stops).
struct InFlight<'a> {
    log: &'a crate::log::Log,
    offset: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let what = "a write was dropped in flight (its runtime shut down): its outcome is unknown";
        self.log.poison(crate::detach::dropped(self.offset, what));
    }
}

/// Where [`Core::chain`] writes: a user key of a namespace under its
/// stripe.
pub(crate) struct Chain<'a> {
    ns: &'a NsState,
    c: &'a crate::counters::NsCounters,
    key: &'a [u8],
    h: u64,
    purpose: Purpose,
}

/// Whether [`Core::update`] combines a change with those of the same key
/// waiting behind it: one that keeps, replaces, rewrites or deletes the
/// item. A touch or an invalidation keeps the access state of the record
/// it replaces, which a combined record would not follow.
fn chains(change: &Change) -> bool {
    matches!(
        change,
        Change::Keep | Change::Put { .. } | Change::PutCas { .. } | Change::Rewrite { .. } | Change::Delete
    )
}

/// What [`Core::update_marked`] calls under the key's stripe on the live
/// version it read (with the key's hash), before the update's function.
type Mark<'a> = dyn FnMut(u64, &Found, &Item) + Send + 'a;

/// The access policy of tombstones and of internal writes.
const FRESH: Policy = Policy::Fresh;

/// The version an engine key's write gives it.
pub(crate) fn engine_version(meta: ItemMeta) -> Version {
    Version { meta, cas: None, policy: FRESH }
}
impl Core {
    /// Wait (with no key stripe held) until a write of `grains` (with
    /// `listed` bytes of summary entries, `space::listed_bytes`) is likely
    /// to find room: GC's thread makes it, or, with
    /// [`crate::Background::Manual`], this writer runs GC itself.
    pub(crate) async fn await_room(&self, purpose: Purpose, grains: u64, listed: u64) -> Result<()> {
        if !self.manual {
            return self.space.await_room(purpose, grains, listed).await;
        }
        let mut asked = None;
        // Counted as a wait for room, as the GC thread's would be.
        let mut since = None;
        let done = |since: Option<std::time::Instant>, r| {
            if let Some(t) = since {
                self.space.waited_for_room(t);
            }
            r
        };
        loop {
            if let Some(r) = self.space.room_now(purpose, grains, listed, &mut asked) {
                return done(since, r);
            }
            since.get_or_insert_with(std::time::Instant::now);
            if !crate::gc::poll(self.collector()) {
                // Asked, and GC has nothing to do: no room will come.
                let r = self.space.room_now(purpose, grains, listed, &mut asked).unwrap_or(Err(Error::NoSpace {
                    needed_bytes: grains * self.log.sb.grain_bytes as u64,
                    segments: self.log.sb.segment_count,
                }));
                return done(since, r);
            }
        }
    }

    /// Hide every value written so far in `ns` (memcache `flush_all`):
    /// they read as absent and GC reclaims them. In the default namespace
    /// a floor of sequence numbers, stored under a reserved key so it holds
    /// across restarts; returns the floor. In another namespace a truncate;
    /// returns its new id.
    pub async fn flush_all(&self, ns: &Arc<NsState>) -> Result<u64> {
        let (id, _) = ns.current()?;
        if id != DEFAULT_NS {
            return self.truncate_namespace(&ns.name, Some(ns)).await.map(u64::from);
        }
        self.raise_flush_floor().await
    }

    /// [`crate::Store::sync`]: flush the device, poisoning the store if
    /// that fails; refused once the store is poisoned.
    pub(crate) fn sync(&self) -> Result<()> {
        self.log.check_writable()?;
        self.log.dev.flush().map_err(|source| self.log.poison(Error::Io { op: "flush", offset: 0, source }))
    }

    /// [`Core::sync`] as a future ([`granary_io::Device::flush_async`]).
    pub(crate) async fn sync_async(&self) -> Result<()> {
        self.log.check_writable()?;
        self.log.dev.flush_async().await.map_err(|source| self.log.poison(Error::Io { op: "flush", offset: 0, source }))
    }

    /// `flush_all` of the default namespace: a new floor, stored. Runs to
    /// its end once polled (as a catalog change: `catalog.rs`), and may
    /// take the room kept for deletes.
    pub(crate) async fn raise_flush_floor(&self) -> Result<u64> {
        crate::detach::to_the_end!(self, |core| core.raise_flush_floor_now())
    }

    async fn raise_flush_floor_now(&self) -> Result<u64> {
        let _one_at_a_time = self.flush_lock.lock().await;
        let floor = self.log.next_seq.fetch_add(1, Relaxed);
        // Stored first, then applied: until the new floor record is on the
        // device, the old one must not read as flushed (GC would drop it).
        let v = Version { meta: ItemMeta::default(), cas: None, policy: FRESH };
        self.write_item(FLUSH_FLOOR_KEY, Payload::Slice(&floor.to_le_bytes()), v, Cond::Always, Purpose::Delete)
            .await?;
        self.log.flush_floor.fetch_max(floor, Relaxed);
        Ok(floor)
    }

    /// A record buffer for `key` with room for a value of `value_len`
    /// bytes, to fill and then write with [`Core::put_buf`].
    pub fn new_put_buf(&self, ns: &Arc<NsState>, key: &[u8], value_len: usize) -> Result<PutBuf> {
        let (key, _) = self.scoped(ns, key)?;
        ns.check_block_value(value_len)?;
        let key = &key[..];
        let max = self.value_bytes_max(key.len());
        if value_len as u64 > max {
            return Err(Error::ValueTooLarge { len: value_len as u64, max });
        }
        let grains = grains_for(record_bytes(key.len(), value_len as u64), self.log.sb.grain_bytes);
        let mut buf = AlignedBuf::zeroed((grains * self.log.grain()) as usize);
        buf[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + key.len()].copy_from_slice(key);
        let me: std::sync::Weak<dyn std::any::Any + Send + Sync> = match self.me.get() {
            Some(me) => me.clone(),
            None => std::sync::Weak::<()>::new(), // never this engine's address
        };
        Ok(PutBuf::new(buf, key.len(), value_len, me, ns.clone()))
    }

    /// Write the record built in `pb` (its key, its value as filled). A
    /// buffer made for this namespace before a truncate gave it a new id
    /// takes the new id (its key's id bytes are rewritten in place: the
    /// value was received for the namespace, not for one of its
    /// generations); one made by another store, or for another namespace
    /// (a dropped one's included), is refused.
    pub async fn put_buf(&self, ns: &NsState, mut pb: PutBuf, meta: ItemMeta, cond: Cond) -> Result<(PutOutcome, u64)> {
        if !std::ptr::addr_eq(pb.store.as_ptr(), self as *const Core) {
            return Err(Error::InvalidOptions("a record buffer made by another store".into()));
        }
        let (id, c) = ns.current()?;
        if !std::ptr::eq(Arc::as_ptr(&pb.ns), ns) {
            // Built for another namespace.
            return Err(Error::NoSuchNamespace { name: ns.name.clone() });
        }
        if let Owner::Ns(of) = owner(pb.key()) {
            if of != id && of != DEFAULT_NS && id != DEFAULT_NS {
                let at = RECORD_HEADER_BYTES + crate::nskey::NS_KEY_PREFIX.len();
                pb.buf.as_mut().expect("a PutBuf holds its buffer outside the store")[at..at + 4]
                    .copy_from_slice(&id.to_le_bytes());
            }
        }
        let key = pb.key().to_vec();
        let user = match owner(&key) {
            Owner::Ns(of) if of == id => user_key(id, &key),
            _ => return Err(Error::NoSuchNamespace { name: ns.name.clone() }),
        };
        if id == DEFAULT_NS {
            Self::check_user_key(user)?;
        }
        let value_len = pb.value_len as u64;
        let meta = self.with_default_ttl(ns, meta);
        let v = Version { meta, cas: None, policy: Policy::new_item(&meta) };
        if ns.options.has_quota() {
            self.check_quota(ns, &c, &key, self.value_grains(&key, value_len, None)?, cond).await?;
        }
        let r = self.write_item(&key, Payload::Owned { buf: &mut pb.buf, value_len }, v, cond, Purpose::Put).await?;
        c.stored(r.0);
        Ok(r)
    }

    /// Grains of a value record of `value_len` bytes for `key` (with an
    /// explicit CAS value when `cas` is given); refuses one the store
    /// cannot hold.
    pub(crate) fn value_grains(&self, key: &[u8], value_len: u64, cas: Option<u64>) -> Result<u64> {
        let len = value_len + if cas.is_some() { record::EXPLICIT_CAS_BYTES as u64 } else { 0 };
        let max = self.value_bytes_max(key.len());
        if len > max {
            return Err(Error::ValueTooLarge { len: value_len, max });
        }
        Ok(grains_for(record_bytes(key.len(), len), self.log.sb.grain_bytes))
    }

    /// PUT with a mode; returns whether it stored.
    pub async fn put(&self, ns: &NsState, key: &[u8], value: &[u8]) -> Result<()> {
        self.put_with(ns, key, value, PutMode::Upsert).await.map(|_| ())
    }

    pub async fn put_with(&self, ns: &NsState, key: &[u8], value: &[u8], mode: PutMode) -> Result<PutOutcome> {
        Ok(self.put_item(ns, key, value, ItemMeta::default(), mode.into()).await?.0)
    }

    /// Conditional PUT with metadata; on `Stored`, also the new CAS value
    /// (0 otherwise).
    pub async fn put_item(
        &self,
        ns: &NsState,
        key: &[u8],
        value: &[u8],
        meta: ItemMeta,
        cond: Cond,
    ) -> Result<(PutOutcome, u64)> {
        self.put_user_item(ns, key, value, Version { meta, cas: None, policy: Policy::new_item(&meta) }, cond).await
    }

    /// A user key's PUT of a value slice as `v` says, in `ns`: its
    /// default TTL applied, its quota checked, its counters told.
    async fn put_user_item(
        &self,
        ns: &NsState,
        key: &[u8],
        value: &[u8],
        mut v: Version,
        cond: Cond,
    ) -> Result<(PutOutcome, u64)> {
        let (key, c) = self.scoped(ns, key)?;
        ns.check_block_value(value.len())?;
        v.meta = self.with_default_ttl(ns, v.meta);
        if ns.options.has_quota() {
            self.check_quota(ns, &c, &key, self.value_grains(&key, value.len() as u64, v.cas)?, cond).await?;
        }
        let r = self.write_item(&key, Payload::Slice(value), v, cond, Purpose::Put).await?;
        c.stored(r.0);
        Ok(r)
    }

    /// `meta` with `ns`'s default TTL when it sets no expiry time.
    pub(crate) fn with_default_ttl(&self, ns: &NsState, mut meta: ItemMeta) -> ItemMeta {
        let ttl = ns.options.default_ttl_secs;
        if meta.expires == 0 && ttl != 0 {
            meta.expires = self.clock.now().saturating_add(ttl);
        }
        meta
    }

    /// [`Core::put_item`] giving the new version the CAS value `cas`
    /// instead of its sequence number (memcache `ms ... E<cas>`).
    pub async fn put_item_with_cas(
        &self,
        ns: &NsState,
        key: &[u8],
        value: &[u8],
        meta: ItemMeta,
        cond: Cond,
        cas: u64,
    ) -> Result<(PutOutcome, u64)> {
        self.put_user_item(ns, key, value, Version { meta, cas: Some(cas), policy: Policy::new_item(&meta) }, cond)
            .await
    }

    /// [`Core::put_item`] (or with a chosen CAS value) whose new version
    /// has its win token already handed out (memcache's vivify on miss:
    /// the client that created it is the one to fill it), and is marked
    /// read when `read`.
    // The public call's arguments (memcache's vivify-on-miss set) plus the
    // namespace every engine call takes.
    #[allow(clippy::too_many_arguments)]
    pub async fn put_item_won(
        &self,
        ns: &NsState,
        key: &[u8],
        value: &[u8],
        meta: ItemMeta,
        cond: Cond,
        cas: Option<u64>,
        read: bool,
    ) -> Result<(PutOutcome, u64)> {
        self.put_user_item(ns, key, value, Version { meta, cas, policy: Policy::Vivified { read } }, cond).await
    }

    /// [`Core::put_item`] without the reserved-namespace check. `room`:
    /// [`Purpose::Put`] for a write that adds (every user write), or
    /// [`Purpose::Delete`] for an engine record that empties (a namespace's
    /// drop or truncate, a flush floor: a full store can still be
    /// emptied) or that a close or a repair writes (the catalog's sweep
    /// note, the totals, a repaired catalog: small, and once), which may
    /// take the room kept for deletes.
    pub(crate) async fn write_item(
        &self,
        key: &[u8],
        mut value: Payload<'_>,
        v: Version,
        cond: Cond,
        room: Purpose,
    ) -> Result<(PutOutcome, u64)> {
        let grains = self.value_grains(key, value.value_len(), v.cas)?;
        let h = self.keys.hash(key);
        let emptying = room == Purpose::Delete;
        // The stream the write goes to is known only under the stripe: a
        // write refused for room waits for room in that stream's segment.
        let mut room_for = room;
        // An unconditional PUT of a value slice may be combined with the
        // others of its key queued for its stripe ([`crate::combine`]).
        let combines = cond == Cond::Always
            && room == Purpose::Put
            && matches!(value, Payload::Slice(_))
            && !matches!(v.policy, Policy::Vivified { .. });
        loop {
            self.log.check_writable()?;
            let listed = crate::space::listed_bytes([key]);
            self.await_room(room_for, grains, listed)
                .await
                .map_err(|e| self.log.check_writable().err().unwrap_or(e))?;
            let i = self.keys.stripe_of(h);
            let combine = &self.keys.combine;
            let _stripe = match (combines, &value) {
                (true, Payload::Slice(val)) => match self.keys.try_lock_stripe(i) {
                    Some(g) => g,
                    None => match combine.wait(self.keys.stripe_at(i), i, h, key, val, (v.meta, v.cas, v.policy)).await
                    {
                        Waited::Stripe(g) => g,
                        Waited::Answered(Answer::Stored(cas)) => return Ok((PutOutcome::Stored, cas)),
                        // The write that claimed it did not complete.
                        Waited::Answered(Answer::Retry) => continue,
                    },
                },
                _ => self.keys.stripe_at(i).await,
            };
            let mut claimed = if combines { combine.claim(i, h, key) } else { Claimed::none(combine) };
            let (prior, purpose) = if cond == Cond::Always {
                // An unconditional PUT needs the current version only to
                // replace its entry: it is read while the new one is
                // written, if the index has a candidate for it at all.
                let candidates = self.keys.index.lookup(h);
                let purpose = if emptying {
                    Purpose::Delete
                } else {
                    self.space.put_purpose(candidates.as_slice().iter().map(|e| e.pba()))
                };
                let mut prior = match candidates.as_slice() {
                    [] => Prior::Known(None),
                    &[e] if self.blind_ok(e, key) => Prior::Blind(e),
                    _ => Prior::Unread,
                };
                // (Links can at most double what the candidates count.)
                if candidates.as_slice().len() >= NEIGHBOURHOOD / 2 {
                    self.refuse_crowded(&[(h, key)], &mut [&mut prior]).await?;
                }
                (prior, purpose)
            } else {
                let existing = self.find(key, h, false, false).await?;
                let live = existing.as_ref().filter(|f| self.is_live(f, self.clock.now()));
                if let Some(outcome) = Self::unmet(cond, live) {
                    return Ok((outcome, 0));
                }
                let existing = self.refuse_crowded_known(h, key, existing).await?;
                let purpose = if emptying {
                    Purpose::Delete
                } else {
                    self.space.put_purpose(existing.as_ref().map(|f| f.entry.pba()))
                };
                (Prior::Known(existing), purpose)
            };
            if claimed.is_empty() {
                match self.write_value(key, h, value.reborrow(), prior, purpose, v).await {
                    Err(Error::NoSpace { .. }) => room_for = purpose, // raced for the last room: wait again
                    r => return r.map(|cas| (PutOutcome::Stored, cas)),
                }
                continue;
            }
            // This PUT and those claimed but the last are replaced at once:
            // CAS values below the record's (`combine`'s "Order").
            let seq = &self.log.next_seq;
            let mut fresh = |cas: Option<u64>| cas.unwrap_or_else(|| seq.fetch_add(1, Relaxed));
            let own = fresh(v.cas);
            claimed.reserve(&mut fresh);
            let last = claimed.last().expect("claimed one at least");
            // The record counts one PUT and its own bytes (the last one's
            // key and value); the others here.
            let n = claimed.len() as u64;
            let bytes = claimed.bytes() - last.value.len() as u64 + value.value_len();
            let last_v = Version { meta: last.meta, cas: last.cas, policy: last.policy };
            let val = Payload::Slice(&last.value);
            match self.write_value(key, h, val, prior, purpose, last_v).await {
                // Raced for the last room: wait again (those claimed write
                // themselves).
                Err(Error::NoSpace { .. }) => room_for = purpose,
                Err(e) => return Err(e),
                Ok(cas) => {
                    claimed.stored(cas);
                    self.counters.puts.fetch_add(n, Relaxed);
                    self.counters.user_bytes.fetch_add(bytes, Relaxed);
                    return Ok((PutOutcome::Stored, own));
                }
            }
        }
    }

    /// Keys of hash `h`'s fingerprint (home slot and key tag) the index
    /// holds or will hold again: its candidates, and one more for each
    /// that heads a blind overwrite's link (the key it displaced shares
    /// the fingerprint and goes back in the index when the link settles;
    /// a head displaces one key at most).
    pub(crate) fn fingerprint_members(&self, h: u64) -> usize {
        let c = self.keys.index.lookup(h);
        c.as_slice().len() + c.as_slice().iter().filter(|e| self.keys.links.of_head(e.pba()).is_some()).count()
    }

    /// Refuse, before anything is written, any of `keys` (hash, stored
    /// key; under their stripes) that would add an index entry to a
    /// fingerprint already holding as many keys as the index keeps of one
    /// ([`IndexError::Crowded`]): its record could never be indexed, and a
    /// record written but not indexed poisons the store (and its replay
    /// would fail the next open). `priors` are the keys' priors: a known
    /// version adds nothing, nor is a blind overwrite checked (it replaces
    /// a fingerprint's only candidate: never one near full); an unread one of a
    /// crowded fingerprint is read now (a key already there may be
    /// written); keys of one fingerprint in `keys` count together. Every
    /// key of one fingerprint shares one stripe, so no other new key of it
    /// is added meanwhile. Only keys chosen to collide get refused.
    pub(crate) async fn refuse_crowded(&self, keys: &[(u64, &[u8])], priors: &mut [&mut Prior]) -> Result<()> {
        let fingerprint = |h: u64| ((self.keys.index.home(h) as u64) << 16) | granary_format::hash::key_tag(h) as u64;
        // The common case, cheaply: a fingerprint holds at most twice its
        // candidates (each may head one link), and this call adds at most
        // its own keys of one fingerprint; well below the bound, done.
        let (mut most_candidates, mut adding) = (0, 0);
        let mut fps = Vec::new(); // (none allocated for a single key)
        for (&(h, _), p) in keys.iter().zip(priors.iter()) {
            if !matches!(**p, Prior::Blind(_) | Prior::Known(Some(_))) {
                most_candidates = most_candidates.max(self.keys.index.lookup(h).as_slice().len());
                adding += 1;
                if keys.len() > 1 {
                    fps.push(fingerprint(h));
                }
            }
        }
        fps.sort_unstable();
        let most_added = fps.chunk_by(|a, b| a == b).map(<[u64]>::len).max().unwrap_or(adding);
        if most_added == 0 || 2 * most_candidates + most_added < NEIGHBOURHOOD {
            return Ok(());
        }
        // Keys of one fingerprint together (a single key needs no map).
        let mut members: std::collections::HashMap<u64, usize> = Default::default();
        let mut alone;
        for (&(h, key), p) in keys.iter().zip(priors.iter_mut()) {
            let p: &mut Prior = p;
            if matches!(p, Prior::Blind(_) | Prior::Known(Some(_))) {
                continue;
            }
            let n = if keys.len() == 1 {
                alone = self.fingerprint_members(h);
                &mut alone
            } else {
                members.entry(fingerprint(h)).or_insert_with(|| self.fingerprint_members(h))
            };
            if *n >= NEIGHBOURHOOD {
                if matches!(p, Prior::Unread) {
                    *p = Prior::Known(self.find(key, h, false, false).await?);
                }
                if matches!(p, Prior::Known(None)) {
                    return Err(Error::IndexFull(IndexError::Crowded));
                }
                continue;
            }
            // An unread prior may be a key already there: counted as new
            // (cautious; it matters only for a fingerprint about full).
            *n += 1;
        }
        Ok(())
    }

    /// [`Core::refuse_crowded`] of one key whose version is known.
    pub(crate) async fn refuse_crowded_known(
        &self,
        h: u64,
        key: &[u8],
        existing: Option<Found>,
    ) -> Result<Option<Found>> {
        if existing.is_none() {
            self.refuse_crowded(&[(h, key)], &mut [&mut Prior::Known(None)]).await?;
        }
        Ok(existing)
    }

    /// What a write on condition `cond` answers when `live` (the key's
    /// live version, if any) does not meet it; None if it does.
    pub(crate) fn unmet(cond: Cond, live: Option<&Found>) -> Option<PutOutcome> {
        match (cond, live) {
            (Cond::Absent, Some(_)) => Some(PutOutcome::Exists),
            (Cond::Present | Cond::Cas(_), None) => Some(PutOutcome::NotFound),
            (Cond::Cas(c), Some(f)) if record::cas_of(&f.hdr, &f.buf) != c => Some(PutOutcome::Exists),
            _ => None,
        }
    }

    /// Write a new version of `key` (under its stripe) replacing its
    /// current one, `prior`; returns its CAS value: `v.cas` when given
    /// (stored in the record before the value), else its sequence number.
    /// `purpose` is `Put` or `PutShort` ([`crate::space::Space::put_purpose`]),
    /// or `Delete` for an engine record [`Core::write_item`] writes so.
    async fn write_value(
        &self,
        key: &[u8],
        h: u64,
        value: Payload<'_>,
        prior: Prior,
        purpose: Purpose,
        v: Version,
    ) -> Result<u64> {
        let Version { meta, cas, policy } = v;
        let seq = self.log.next_seq.fetch_add(1, Relaxed);
        let value_len = value.value_len();
        // A key the DRAM tier holds keeps its item, with the new value
        // (a hot key that is also written would otherwise miss after each
        // write): a slice's value is at hand; a record buffer's (large
        // values) is not copied, and the write just drops the item.
        let refresh = match (&self.keys.tier, &value) {
            (Some(t), Payload::Slice(v)) if t.holds(key, h) => Some(*v),
            _ => None,
        };
        let with_cas;
        let (payload, hdr) = match (cas, value) {
            (Some(c), Payload::Slice(v)) => {
                with_cas = [c.to_le_bytes().as_slice(), v].concat();
                let hdr = RecordHeader::value(key.len(), with_cas.len() as u64, seq, 0).with_explicit_cas();
                (Payload::Slice(&with_cas), hdr)
            }
            (Some(_), Payload::Owned { .. }) => unreachable!("record buffers are written without an explicit CAS"),
            (None, value) => (value, RecordHeader::value(key.len(), value_len, seq, 0)),
        };
        // An unread prior counts as present: a candidate is the key but for
        // a rare fingerprint collision, and the flag is then only cautious.
        let supersedes = !matches!(prior, Prior::Known(None)) || self.keys.dropped.contains(h);
        let hdr = hdr.with_meta(meta.flags, meta.expires).with_stale(meta.stale).with_supersedes(supersedes);
        // A record that may land without being indexed (this future dropped
        // while it is written or indexed, or an error between the two) is
        // listed as a version of the key the index does not point at: the
        // key's next value then carries the supersedes flag, so it never
        // leaves the index with no tombstone while this one may come back.
        let list = |seg: u32| self.keys.dropped.insert(seg, h);
        let mut unindexed = Unindexed::new(Some(&list));
        let write = self.write_record_async(purpose, hdr, key, payload, Some(&list));
        let (held, existing) = match prior {
            Prior::Known(existing) => (write.await?, existing),
            Prior::Blind(e) => {
                let held = write.await?;
                let loc = held.loc();
                unindexed.hold(held);
                let committed = self.commit_blind(key, h, e, loc, policy).await;
                unindexed.end(committed.is_ok());
                committed?;
                self.refresh_tier(key, h, refresh, meta, cas.unwrap_or(seq), seq, loc);
                self.counters.puts.fetch_add(1, Relaxed);
                self.counters.user_bytes.fetch_add(key.len() as u64 + value_len, Relaxed);
                return Ok(cas.unwrap_or(seq));
            }
            Prior::Unread => match join2(write, self.find(key, h, false, false)).await {
                (Ok(held), Ok(existing)) => (held, existing),
                // Written but not indexed (its allocation released as
                // `held` drops): the running store keeps the old version;
                // the PUT reports the error (after a crash the new one may
                // be what recovery finds, as with any write that failed
                // midway).
                (Ok(held), Err(e)) => {
                    unindexed.hold(held);
                    return Err(e);
                }
                (Err(e), _) => return Err(e),
            },
        };
        let loc = held.loc();
        unindexed.hold(held);
        let committed = self.commit(key, h, existing, loc, false, policy).await;
        unindexed.end(committed.is_ok());
        committed?;
        self.refresh_tier(key, h, refresh, meta, cas.unwrap_or(seq), seq, loc);
        self.counters.puts.fetch_add(1, Relaxed);
        self.counters.user_bytes.fetch_add(key.len() as u64 + value_len, Relaxed);
        Ok(cas.unwrap_or(seq))
    }

    /// After a write of `key` committed at `loc` (under its stripe): the
    /// DRAM tier's item becomes the new version, when `value` is given
    /// (the tier held the key before the write).
    // The new version's fields, as `write_value` has them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn refresh_tier(
        &self,
        key: &[u8],
        h: u64,
        value: Option<&[u8]>,
        meta: ItemMeta,
        cas: u64,
        seq: u64,
        loc: Loc,
    ) {
        let (Some(t), Some(value)) = (&self.keys.tier, value) else { return };
        if !t.fits(key.len(), value.len()) {
            return; // as `refresh` would, without copying the value
        }
        let hot =
            crate::tier::Hot { key: key.into(), value: value.into(), meta, cas, seq, pba: loc.pba, stamp: loc.stamp };
        t.refresh(h, hot);
    }

    /// Write a tombstone for `key` (under its stripe) replacing `existing`
    /// (None: the key has no indexed version, but one is still on the device),
    /// counted as a user's delete.
    pub(crate) async fn write_tombstone(&self, key: &[u8], h: u64, existing: Option<Found>) -> Result<()> {
        self.write_tombstone_of(key, h, existing, true).await
    }

    /// [`Core::write_tombstone`], counted as a user's delete (the store's
    /// deletes and user bytes) only when `user`: an eviction's is the
    /// engine's own.
    pub(crate) async fn write_tombstone_of(
        &self,
        key: &[u8],
        h: u64,
        existing: Option<Found>,
        user: bool,
    ) -> Result<()> {
        let seq = self.log.next_seq.fetch_add(1, Relaxed);
        // Under the stripe no relocation of this key can run, so every
        // older version of it lies in a segment at or below the horizon.
        let hdr = RecordHeader::tombstone(key.len(), seq, 0, self.space.horizon());
        // (A tombstone that lands unindexed hides nothing newer.)
        let held = self.write_record_async(Purpose::Delete, hdr, key, Payload::Slice(&[]), None).await?;
        let committed = self.commit(key, h, existing, held.loc(), true, FRESH).await;
        drop(held);
        committed?;
        if user {
            self.counters.deletes.fetch_add(1, Relaxed);
            self.counters.user_bytes.fetch_add(key.len() as u64, Relaxed);
        }
        Ok(())
    }

    /// Read-modify-write of one key: `f` sees the current item (None if
    /// absent, deleted or expired) while no other write of the key can run,
    /// and says what to write and what to return. Returns `f`'s answer and,
    /// if it wrote a value, the new CAS value. `f` may run more than once
    /// (when the store had to wait for space, or when a write that
    /// combined it with others of the key failed, was dropped or did not
    /// take its change: [`crate::combine`]); only its last answer counts.
    /// It may run on another thread: that of a write of the key it waited
    /// behind, which calls it to carry its change ([`crate::combine`]).
    ///
    /// # Safety
    ///
    /// As [`crate::Store::update_borrowing_async`]: the future is never
    /// leaked while anything `f` borrows goes away.
    pub async unsafe fn update<R: Send>(
        &self,
        ns: &NsState,
        key: &[u8],
        f: impl FnMut(Option<&Item>) -> (Change, R) + Send,
    ) -> Result<(R, Option<u64>)> {
        // SAFETY: as this function's own contract.
        unsafe { self.update_marked(ns, key, f, None) }.await
    }

    /// memcache's `mg ... T`: the item of `key` with its access state
    /// before this read, as [`Core::get_item_access`] gives it, and given
    /// the expiry `expires` (and the CAS value `new_cas`, when given) as a
    /// touch gives it, both under the key's stripe: no write of the key
    /// comes between the read and the touch. The item returned is the one
    /// touched. Counted as a GET (the device's: the DRAM tier is not asked)
    /// and, when found, as a stored value (the touch's write). The version
    /// read is marked (its access word: [`Core::mark_access`]) before the
    /// touch is written, which keeps that word. On a store that refuses
    /// writes, a key with no value is still a miss.
    pub async fn touch_item_access(
        &self,
        ns: &NsState,
        key: &[u8],
        bump: bool,
        want_win: impl Fn(&Item) -> bool + Send + Sync,
        expires: u32,
        new_cas: Option<u64>,
    ) -> Result<Option<ItemAccess>> {
        let (_, c) = self.scoped(ns, key)?;
        self.counters.gets.fetch_add(1, Relaxed);
        if let Err(e) = self.log.check_writable() {
            // Nothing can be touched; a miss is answered as one.
            return match self.peek_item_access(ns, key).await? {
                None => {
                    c.got(false);
                    Ok(None)
                }
                Some(_) => Err(e),
            };
        }
        // The CAS value of the item marked and what its marking said. A
        // touch that waits for room lets the stripe go, and then may find
        // the item again elsewhere (moved by GC, or rewritten by another
        // touch: both keep its CAS value and the access word this marking
        // set): it is not marked twice (that would read its own mark as an
        // earlier reader's). A new value of the key has a new CAS value,
        // and is marked afresh; so is the item if a touch meanwhile gave it
        // a CAS value of the client's choosing (memcache `E`), and a new
        // value given this item's CAS value that way is not marked.
        let mut marked: Option<(u64, (Access, bool))> = None;
        let mut mark = |h: u64, f: &Found, item: &Item| {
            if marked.as_ref().is_some_and(|(cas, _)| *cas == item.cas) {
                return;
            }
            let want = want_win(item);
            marked = Some((item.cas, self.mark_access(h, f.entry.pba(), f.via.is_some(), bump, want)));
        };
        let touch = |it: Option<&Item>| match it {
            None => (Change::Keep, None),
            Some(it) => {
                let meta = ItemMeta { expires, ..it.meta };
                let cas = new_cas.unwrap_or(it.cas);
                (
                    Change::Touch { value: it.value.clone(), meta, cas, fetch: false },
                    Some(Item { value: it.value.clone(), meta, cas }),
                )
            }
        };
        // SAFETY: `touch` borrows only this frame, and the future is
        // awaited here, in place.
        let touched = unsafe { self.update_marked(ns, key, touch, Some(&mut mark)) }.await;
        let (touched, _) = touched?;
        c.got(touched.is_some());
        let Some(item) = touched else { return Ok(None) };
        self.counters.get_hits.fetch_add(1, Relaxed);
        let Some((_, (prior, won))) = marked else { unreachable!("a touched item was marked") };
        Ok(Some(ItemAccess { item, prior, won }))
    }

    /// [`Core::update`], with `mark` (if given) called under the stripe on
    /// the live version found before `f` is (with its key hash); given a
    /// `mark`, the update is not combined with others of the key.
    ///
    /// # Safety
    ///
    /// As [`Core::update`].
    async unsafe fn update_marked<R: Send>(
        &self,
        ns: &NsState,
        key: &[u8],
        mut f: impl FnMut(Option<&Item>) -> (Change, R) + Send,
        mut mark: Option<&mut Mark<'_>>,
    ) -> Result<(R, Option<u64>)> {
        let (key, c) = self.scoped(ns, key)?;
        let key = &key[..];
        let h = self.keys.hash(key);
        let mut need = 1;
        // As in `write_item`: a write refused for room waits for its stream.
        // Until `f` has said what it writes, the room a DELETE may take (the
        // reserve too: a store full of live data can still be emptied); a
        // value then refused room waits for a PUT's.
        let mut room_for = Purpose::Delete;
        // Claimed once and not applied: take the stripe in turn from then on.
        // (A marked update is never combined: its mark runs under the
        // stripe, on the version it reads.)
        let mut alone = mark.is_some();
        loop {
            self.log.check_writable()?;
            let listed = crate::space::listed_bytes([key]);
            self.await_room(room_for, need, listed).await.map_err(|e| self.log.check_writable().err().unwrap_or(e))?;
            let i = self.keys.stripe_of(h);
            let combine = &self.keys.combine;
            // Behind another write of the key: combined with the next one
            // that takes the stripe ([`Core::chain`]), except under a quota,
            // which each change is held to on its own.
            let stripe = match self.keys.try_lock_stripe(i) {
                Some(g) => g,
                None if !alone && !ns.options.has_quota() => {
                    // SAFETY: this future is not leaked while `f`'s borrows
                    // end (this function's contract), nor is the wait
                    // within it: awaited here, in place.
                    let waited = unsafe { combine.wait_update(self.keys.stripe_at(i), i, h, key, &mut f) };
                    match waited.await {
                        UpdateWaited::Stripe(g) => g,
                        UpdateWaited::Done(r, cas) => return Ok((r, cas)),
                        UpdateWaited::Retry => continue,
                        UpdateWaited::Alone => {
                            alone = true;
                            continue;
                        }
                    }
                }
                None => self.keys.stripe_at(i).await,
            };
            let existing = self.find(key, h, true, true).await?;
            let purpose = self.space.put_purpose(existing.as_ref().map(|f| f.entry.pba()));
            let item = existing.as_ref().filter(|x| self.is_live(x, self.clock.now())).map(Self::item_of);
            if let (Some(mark), Some(x), Some(it)) = (mark.as_deref_mut(), &existing, &item) {
                mark(h, x, it);
            }
            let (change, r) = f(item.as_ref());
            let change = self.settled(ns, change);
            match &change {
                Change::Put { value, .. }
                | Change::Invalidate { value, .. }
                | Change::PutCas { value, .. }
                | Change::Rewrite { value, .. }
                | Change::Touch { value, .. } => ns.check_block_value(value.len())?,
                _ => {}
            }
            // (Sized only with a quota: the write below sizes it again.)
            let new_grains = match &change {
                _ if !ns.options.has_quota() => None,
                Change::Put { value, .. } | Change::Invalidate { value, .. } => {
                    Some(self.value_grains(key, value.len() as u64, None)?)
                }
                Change::PutCas { value, cas, .. } => Some(self.value_grains(key, value.len() as u64, Some(*cas))?),
                Change::Rewrite { value, cas, .. } => Some(self.value_grains(key, value.len() as u64, *cas)?),
                _ => None,
            };
            if let Some(grains) = new_grains {
                match self.check_quota_after(ns, &c, key, grains, (0, 0)).await {
                    Err(Error::QuotaExceeded { .. }) if self.evicts_at_quota(ns) => {
                        // Eviction takes stripes: this one is let go first,
                        // and `f` runs again on what the key then holds (an
                        // eviction may have taken the key itself).
                        drop(stripe);
                        self.check_quota(ns, &c, key, grains, Cond::Always).await?;
                        continue;
                    }
                    r => r?,
                }
            }
            if chains(&change) && self.chain_fits(key, &change) && !ns.options.has_quota() {
                let claimed = combine.claim_updates(i, h, key);
                if !claimed.is_empty() {
                    let chain = Chain { ns, c: &c, key, h, purpose };
                    match self.chain(chain, existing, item, change, claimed, &mut need, &mut room_for).await {
                        Err(Error::NoSpace { .. }) => continue,
                        written => return written.map(|cas| (r, cas)),
                    }
                }
            }
            let policy = match &change {
                Change::Touch { fetch, .. } => Policy::Touch { fetch: *fetch },
                Change::Rewrite { .. } => Policy::Touch { fetch: false },
                Change::Invalidate { .. } => Policy::Invalidate,
                Change::Put { meta, .. } | Change::PutCas { meta, .. } => Policy::new_item(meta),
                Change::Keep | Change::Delete => FRESH,
                Change::Derive { .. } => unreachable!("a Derive is made a Put or PutCas above"),
            };
            let deleting = matches!(change, Change::Delete);
            // A delete of a value that was not live is not counted.
            let mut was_live = true;
            let existing = if matches!(change, Change::Keep | Change::Delete) {
                existing
            } else {
                self.refuse_crowded_known(h, key, existing).await?
            };
            let written = match change {
                Change::Keep => return Ok((r, None)),
                Change::Derive { .. } => unreachable!("a Derive is made a Put or PutCas above"),
                Change::Put { value, meta } | Change::Invalidate { value, meta } => {
                    need = self.value_grains(key, value.len() as u64, None)?;
                    let v = Version { meta, cas: None, policy };
                    self.write_value(key, h, Payload::Slice(&value), Prior::Known(existing), purpose, v).await.map(Some)
                }
                Change::Rewrite { value, meta, cas } => {
                    need = self.value_grains(key, value.len() as u64, cas)?;
                    let v = Version { meta, cas, policy };
                    self.write_value(key, h, Payload::Slice(&value), Prior::Known(existing), purpose, v).await.map(Some)
                }
                Change::PutCas { value, meta, cas } | Change::Touch { value, meta, cas, .. } => {
                    need = self.value_grains(key, value.len() as u64, Some(cas))?;
                    let v = Version { meta, cas: Some(cas), policy };
                    self.write_value(key, h, Payload::Slice(&value), Prior::Known(existing), purpose, v).await.map(Some)
                }
                Change::Delete => match existing {
                    Some(x) if !x.hdr.is_tombstone() => {
                        need = grains_for(record_bytes(key.len(), 0), self.log.sb.grain_bytes);
                        was_live = self.is_live(&x, self.clock.now());
                        self.write_tombstone(key, h, Some(x)).await.map(|()| None)
                    }
                    // As `delete`: GC is dropping the key's value from a
                    // segment not yet free on the device, which would come
                    // back after a crash without a tombstone (nothing was
                    // live: no delete is counted).
                    None if self.keys.dropped.contains(h) => {
                        need = grains_for(record_bytes(key.len(), 0), self.log.sb.grain_bytes);
                        was_live = false;
                        let known = self.refuse_crowded_known(h, key, None).await?;
                        self.write_tombstone(key, h, known).await.map(|()| None)
                    }
                    _ => return Ok((r, None)),
                },
            };
            match written {
                Err(Error::NoSpace { .. }) => room_for = if deleting { Purpose::Delete } else { purpose },
                Ok(Some(cas)) => {
                    c.stored(PutOutcome::Stored);
                    return Ok((r, Some(cas)));
                }
                Ok(None) => {
                    if was_live {
                        c.deletes.fetch_add(1, Relaxed);
                    }
                    return Ok((r, None));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether `change`'s value fits a record carrying an explicit CAS
    /// value, as [`Core::chain`] writes (a value within its 8 bytes of the
    /// largest is written on its own).
    fn chain_fits(&self, key: &[u8], change: &Change) -> bool {
        match change {
            Change::Put { value, .. } | Change::PutCas { value, .. } | Change::Rewrite { value, .. } => {
                self.value_grains(key, value.len() as u64, Some(0)).is_ok()
            }
            _ => true,
        }
    }

    /// `change` as [`Core::update`] writes it: a new value gets the
    /// namespace's default TTL, as a put does (a touch, a rewrite, an
    /// invalidation or a value derived from the item keeps the item's own
    /// expiry); a `Derive` is a `Put` (or `PutCas`) keeping its expiry.
    fn settled(&self, ns: &NsState, change: Change) -> Change {
        match change {
            Change::Put { value, meta } => Change::Put { value, meta: self.with_default_ttl(ns, meta) },
            Change::PutCas { value, meta, cas } => Change::PutCas { value, meta: self.with_default_ttl(ns, meta), cas },
            Change::Derive { value, meta, cas: None } => Change::Put { value, meta },
            Change::Derive { value, meta, cas: Some(cas) } => Change::PutCas { value, meta, cas },
            other => other,
        }
    }

    /// [`Core::update`]'s change `first` (of `item`, the live version of
    /// `existing`), then the changes of the read-modify-writes of the key
    /// `claimed` while they waited for its stripe, each one's function
    /// called on the item as the changes before it left it
    /// ([`crate::combine`]): written as one record, the last item (or a
    /// tombstone), under the stripe. Returns the CAS value of the value
    /// `first` wrote, if it wrote one. A change that is not [`chains`] (a
    /// touch, an invalidation), or whose value the store refuses or does
    /// not [`Core::chain_fits`], is not applied: its update runs again on
    /// its own, taking the stripe in turn; a function that panics is
    /// skipped (its panic resumed on its own task); all of them run again
    /// if the write fails.
    ///
    /// The record carries its item's CAS value explicitly: each value of
    /// the chain got a fresh sequence number as its CAS value when made
    /// (the functions after it may have seen it), below the record's own.
    /// Its access state starts afresh when a change made a new item (a
    /// put, or a value after a delete), else (rewrites only) is kept.
    #[allow(clippy::too_many_arguments)] // the chain's key, then what it writes
    async fn chain(
        &self,
        at: Chain<'_>,
        existing: Option<Found>,
        item: Option<Item>,
        first: Change,
        mut claimed: ClaimedUpdates<'_>,
        need: &mut u64,
        room_for: &mut Purpose,
    ) -> Result<Option<u64>> {
        let Chain { ns, c, key, h, purpose } = at;
        let now = self.clock.now();
        let seq = &self.log.next_seq;
        let mut state = item;
        // A change made a new item; a change wrote at all; values written,
        // live values deleted and their user bytes (counted once written).
        let (mut created, mut changed, mut stored, mut deleted) = (false, false, 0u64, 0u64);
        let mut bytes = 0u64;
        let mut apply = |state: &mut Option<Item>, change: Change| -> Option<u64> {
            let (value, meta, cas, new) = match change {
                Change::Keep => return None,
                Change::Delete => {
                    changed = true;
                    if state.take().is_some() {
                        (deleted, bytes) = (deleted + 1, bytes + key.len() as u64);
                    }
                    return None;
                }
                Change::Put { value, meta } => (value, meta, seq.fetch_add(1, Relaxed), true),
                Change::PutCas { value, meta, cas } => (value, meta, cas, true),
                Change::Rewrite { value, meta, cas } => {
                    let new = state.is_none();
                    (value, meta, cas.unwrap_or_else(|| seq.fetch_add(1, Relaxed)), new)
                }
                _ => unreachable!("only changes that chain are applied"),
            };
            (created, changed, stored) = (created || new, true, stored + 1);
            bytes += (key.len() + value.len()) as u64;
            *state = Some(Item { value, meta, cas });
            Some(cas)
        };
        let own = apply(&mut state, first);
        for i in 0..claimed.len() {
            let live = state.clone().filter(|it| it.meta.expires == 0 || it.meta.expires > now);
            let Some(change) = claimed.decide(i, live.as_ref()) else { continue };
            let change = self.settled(ns, change);
            let refused = match &change {
                Change::Put { value, .. } | Change::PutCas { value, .. } | Change::Rewrite { value, .. } => {
                    ns.check_block_value(value.len()).is_err()
                }
                _ => false,
            };
            if refused || !chains(&change) || !self.chain_fits(key, &change) {
                claimed.settle(i, UpdateAnswer::Alone);
                continue;
            }
            let cas = apply(&mut state, change);
            claimed.settle(i, UpdateAnswer::Done(cas));
        }
        let tombstone = grains_for(record_bytes(key.len(), 0), self.log.sb.grain_bytes);
        // What the record itself counts in the store's figures: one value
        // written, or one delete, and its user bytes.
        let (mut counted_put, mut counted_delete, mut counted_bytes) = (0, 0, 0);
        match (&state, existing) {
            _ if !changed => {}
            (Some(it), existing) => {
                *need = self.value_grains(key, it.value.len() as u64, Some(it.cas))?;
                *room_for = purpose;
                let existing = self.refuse_crowded_known(h, key, existing).await?;
                let policy = if created { Policy::new_item(&it.meta) } else { Policy::Touch { fetch: false } };
                let v = Version { meta: it.meta, cas: Some(it.cas), policy };
                self.write_value(key, h, Payload::Slice(&it.value), Prior::Known(existing), purpose, v).await?;
                (counted_put, counted_bytes) = (1, (key.len() + it.value.len()) as u64);
            }
            (None, Some(x)) if !x.hdr.is_tombstone() => {
                (*need, *room_for) = (tombstone, Purpose::Delete);
                self.write_tombstone(key, h, Some(x)).await?;
                (counted_delete, counted_bytes) = (1, key.len() as u64);
            }
            // As in `update`'s delete: a version GC is dropping.
            (None, None) if self.keys.dropped.contains(h) => {
                (*need, *room_for) = (tombstone, Purpose::Delete);
                let known = self.refuse_crowded_known(h, key, None).await?;
                self.write_tombstone(key, h, known).await?;
                (counted_delete, counted_bytes) = (1, key.len() as u64);
            }
            _ => {}
        }
        self.counters.puts.fetch_add(stored.saturating_sub(counted_put), Relaxed);
        self.counters.deletes.fetch_add(deleted.saturating_sub(counted_delete), Relaxed);
        self.counters.user_bytes.fetch_add(bytes.saturating_sub(counted_bytes), Relaxed);
        c.sets.fetch_add(stored, Relaxed);
        c.deletes.fetch_add(deleted, Relaxed);
        claimed.written();
        Ok(own)
    }

    /// Delete `key`; returns whether it was present (an expired value was
    /// not, but is deleted all the same). Writes a tombstone only when a
    /// value was indexed.
    pub async fn delete(&self, ns: &NsState, key: &[u8]) -> Result<bool> {
        let (key, c) = self.scoped(ns, key)?;
        let key = &key[..];
        let h = self.keys.hash(key);
        let grains = grains_for(record_bytes(key.len(), 0), self.log.sb.grain_bytes);
        loop {
            self.log.check_writable()?;
            let listed = crate::space::listed_bytes([key]);
            self.await_room(Purpose::Delete, grains, listed)
                .await
                .map_err(|e| self.log.check_writable().err().unwrap_or(e))?;
            let _stripe = self.keys.stripe(h).await;
            let (existing, live) = match self.find(key, h, false, false).await? {
                Some(f) if f.hdr.is_tombstone() => return Ok(false),
                Some(f) => {
                    let live = self.is_live(&f, self.clock.now());
                    (Some(f), live)
                }
                // GC is dropping the key's value from a segment not yet
                // free on the device: without a tombstone that value would
                // come back after a crash.
                None if self.keys.dropped.contains(h) => (self.refuse_crowded_known(h, key, None).await?, false),
                None => return Ok(false),
            };
            match self.write_tombstone(key, h, existing).await {
                Err(Error::NoSpace { .. }) => continue,
                r => {
                    if live && r.is_ok() {
                        c.deletes.fetch_add(1, Relaxed);
                    }
                    return r.map(|()| live);
                }
            }
        }
    }

    /// Allocate, encode (with the segment's stamp) and write one record.
    /// On success the caller indexes it and then calls `space.done`.
    #[cfg(test)]
    pub(crate) fn write_record(&self, purpose: Purpose, hdr: RecordHeader, key: &[u8], value: &[u8]) -> Result<Loc> {
        block_on(self.write_record_async(purpose, hdr, key, Payload::Slice(value), None)).map(Held::keep)
    }

    /// Allocate, encode (with the segment's stamp) and write one record;
    /// on success the caller indexes it, holding its allocation (released
    /// when dropped). Dropped midway, the write still ends
    /// ([`crate::detach`]) and its allocation is released after it.
    pub(crate) async fn write_record_async(
        &self,
        purpose: Purpose,
        mut hdr: RecordHeader,
        key: &[u8],
        value: Payload<'_>,
        stray: Stray<'_>,
    ) -> Result<Held<'_>> {
        if self.coalesce && matches!(purpose, Purpose::Put | Purpose::PutShort | Purpose::Delete) {
            let next_seq = self.log.next_seq.load(Relaxed);
            let (seed, grain) = (self.log.seed, self.log.grain());
            let r = self.coalescer.write(self, purpose, seed, grain, next_seq, hdr, key, value, stray).await;
            return r.map_err(|e| self.log.poison_io(e));
        }
        let grains = hdr.grains(self.log.sb.grain_bytes);
        let loc = self.alloc_records(purpose, grains, crate::space::listed_bytes([key]))?;
        // Dropped before the write has ended, the record may still land.
        let mut unindexed = Unindexed::new(stray);
        unindexed.seg = Some(loc.seg);
        hdr.seg_stamp = loc.stamp;
        let (buf, owned) = match value {
            Payload::Slice(value) => {
                let mut buf = AlignedBuf::zeroed((grains * self.log.grain()) as usize);
                hdr.encode(self.log.seed, key, value, &mut buf);
                (buf, None)
            }
            Payload::Owned { buf, .. } => {
                let mut b = buf.take().expect("a record buffer");
                hdr.encode_in_place(self.log.seed, &mut b);
                (b, Some(buf))
            }
        };
        let (buf, written) = match self.shared() {
            Some(core) => {
                let work = async move {
                    let offset = loc.pba * core.log.grain();
                    let in_flight = InFlight { log: &core.log, offset };
                    let (buf, r) = core.write_records("write", buf, &loc).await;
                    std::mem::forget(in_flight);
                    (buf, r, loc)
                };
                // Handed on, a written record's allocation is released once
                // the IO has ended (`write_records` released a failed one).
                let orphaned: Orphaned<Core, (AlignedBuf, Result<()>, Loc)> = |core, (_, r, loc)| {
                    if r.is_ok() {
                        core.space.done(loc.seg);
                    }
                };
                let (buf, r, _) = Finish::new(self, Box::pin(work), Some(orphaned)).await;
                (buf, r)
            }
            None => self.write_records("write", buf, &loc).await,
        };
        if let Some(slot) = owned {
            *slot = Some(buf);
        }
        unindexed.seg = None;
        written.map(|()| Held::new(&self.space, loc))
    }

    /// Grains for records of `purpose`, `grains` of them (`listed`: their
    /// summary entries' bytes, `space::listed_bytes`), in one piece of the
    /// log; a device error poisons the store.
    pub(crate) fn alloc_records(&self, purpose: Purpose, grains: u64, listed: u64) -> Result<Loc> {
        self.space.alloc(purpose, grains, listed, self.log.next_seq.load(Relaxed)).map_err(|e| self.log.poison_io(e))
    }

    /// Allocate `grains` for records of `purpose` that `encode` encodes
    /// (given their place) into one buffer, and write it with one IO
    /// (flushed in `Flush` mode): an atomic batch, a run of PUTs. Through
    /// the coalescer ([`Coalescer::write_own`]), as a group of its own
    /// among the single writes' groups: it is counted as pending in its
    /// segment, so no writer opens a segment past it while it is in flight
    /// (the writes a crash can tear stay in the stream's newest segments),
    /// and in zoned mode it is written in allocation order, at its zone's
    /// write pointer. On success the caller indexes the records, holding
    /// the allocation (released when dropped); a device error poisons the
    /// store (and releases the segment). The buffer comes back once
    /// written, for the caller to reuse.
    ///
    /// [`Coalescer::write_own`]: crate::coalesce::Coalescer::write_own
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn write_encoded(
        &self,
        purpose: Purpose,
        grains: u64,
        listed: u64,
        records: u64,
        encode: impl FnOnce(&Loc) -> AlignedBuf,
        stray: Stray<'_>,
    ) -> Result<(Held<'_>, Option<AlignedBuf>)> {
        let next_seq = self.log.next_seq.load(Relaxed);
        let grain = self.log.grain();
        let r = self.coalescer.write_own(self, purpose, grain, next_seq, grains, listed, records, encode, stray).await;
        r.map_err(|e| self.log.poison_io(e))
    }

    /// Write `buf`, the records encoded for `loc` (from
    /// [`Core::alloc_records`]), and flush it in `Flush` mode; `op` names
    /// the write in the error. On failure the store is poisoned and `loc`'s
    /// segment released (`space.done`); on success the caller indexes the
    /// records and then releases it. The buffer comes back either way.
    pub(crate) async fn write_records(&self, op: &'static str, buf: AlignedBuf, loc: &Loc) -> (AlignedBuf, Result<()>) {
        let offset = loc.pba * self.log.grain();
        self.space.summarize(loc.pba, &buf);
        let (buf, r) = self.log.dev.write_at_async(buf, offset).await;
        let written = match r {
            Ok(()) => self.log.flush_if_durable_async(offset).await,
            Err(source) => Err(Error::Io { op, offset, source }),
        };
        if let Err(e) = written {
            self.space.done(loc.seg);
            return (buf, Err(self.log.poison(e)));
        }
        (buf, Ok(()))
    }

    /// Point the index at a record just written, replacing `existing`.
    /// The new entry's access word follows `policy`.
    pub(crate) async fn commit(
        &self,
        key: &[u8],
        h: u64,
        mut existing: Option<Found>,
        loc: Loc,
        tombstone: bool,
        policy: Policy,
    ) -> Result<()> {
        let kv_size = if tombstone { 0 } else { loc.grains };
        let g = self.log.grain();
        let (c, now) = (self.access_clock, self.clock.now());
        loop {
            if let Some(head) = existing.as_ref().and_then(|f| f.via) {
                // Found through a blind overwrite's link: back in the index
                // first, then replaced as usual.
                let pba = existing.as_ref().map(|f| f.entry.pba());
                if let Some(link) = self.keys.links.of_head(head).filter(|l| Some(l.old.pba()) == pba) {
                    crate::settle::settle(self.parts(), head, &link, key, h)?;
                }
                if let Some(f) = existing.as_mut() {
                    f.via = None;
                }
            }
            match &existing {
                Some(f) => {
                    let from = f.entry.pba();
                    let replace =
                        || self.keys.index.replace_with(h, from, kv_size, loc.pba, |w| c.apply(policy, w, now));
                    if crate::settle::carry(self.parts(), from, loc.pba, replace) {
                        let old_bytes = f.hdr.grains(self.log.sb.grain_bytes) * g;
                        self.space.sub_live(self.log.sb.segment_of(f.entry.pba()), old_bytes);
                        let old = Counted::new(f.hdr.is_tombstone(), old_bytes);
                        self.counters.replaced(key, old, Counted::new(tombstone, loc.grains * g));
                        break;
                    }
                    // The entry moved under us (only a relocation can do that
                    // while we hold the key's stripe): find it again.
                    existing = self.find(key, h, false, false).await?;
                }
                None => {
                    if let Err(e) = self.keys.index.insert_with(h, kv_size, loc.pba, c.apply(policy, 0, now)) {
                        // The record is on the device but cannot be indexed;
                        // refuse further writes rather than diverge from the log.
                        return Err(self.log.poison(Error::IndexFull(e)));
                    }
                    self.counters.added(key, Counted::new(tombstone, loc.grains * g));
                    break;
                }
            }
        }
        self.space.add_live(loc.seg, loc.grains * g);
        self.keys.invalidate(key, h);
        Ok(())
    }

    /// Whether an unconditional PUT of `key` may replace its one
    /// candidate `e` without reading it ([`crate::links`]): a value of
    /// known size, either the head of a link of this very key (then known
    /// to be its current version) or unlinked with room for a new link.
    pub(crate) fn blind_ok(&self, e: Entry, key: &[u8]) -> bool {
        if !self.blind_candidate(e) {
            return false;
        }
        match self.keys.links.of_head(e.pba()) {
            Some(l) => *l.key == *key,
            None => self.keys.links.has_room(key.len()),
        }
    }

    /// What [`Core::blind_ok`] asks of the entry alone: blind overwrites
    /// are on, and `e` is a value of exactly known size.
    pub(crate) fn blind_candidate(&self, e: Entry) -> bool {
        self.keys.links.enabled() && !e.is_tombstone() && e.kv_size() != KV_SIZE_GRAINS_MAX
    }

    /// The accounting of a blind overwrite of `key` whose index entry moved
    /// from `e` to the record at `loc` (under its stripe).
    pub(crate) fn blindly_replaced(&self, key: &[u8], h: u64, e: Entry, loc: Loc) {
        self.blindly_replaced_key(key, h, e, loc);
        self.space.add_live(loc.seg, loc.grains * self.log.grain());
        self.counters.blind.fetch_add(1, Relaxed);
    }

    /// [`Core::blindly_replaced`] but for the new record's live bytes and
    /// the count of blind overwrites, which a batch adds once for all its
    /// records (they share one segment).
    pub(crate) fn blindly_replaced_key(&self, key: &[u8], h: u64, e: Entry, loc: Loc) {
        let g = self.log.grain();
        self.space.sub_live(self.log.sb.segment_of(e.pba()), e.kv_size() as u64 * g);
        // Counted as a replacement of this key's version; if `e` was
        // another key's, settling its link counts this key as added then.
        let old = Counted::new(false, e.kv_size() as u64 * g);
        self.counters.replaced(key, old, Counted::new(false, loc.grains * g));
        self.keys.invalidate(key, h);
    }

    /// What the index holds for each key of a group of writes about to be
    /// written together (a batch, a run's piece), and for each whether its
    /// one candidate heads the key's own link (which then moves on). A key
    /// is `(h, key, look)`: `look` None for one whose prior the caller
    /// finds itself (a condition), answered None; Some(may_be_blind) for an
    /// unconditional write. One of those with exactly one candidate that
    /// may be replaced blindly is [`Prior::Blind`] where the links' table,
    /// asked once for the whole group
    /// ([`crate::links::Links::blind_ok_all`]), allows it and no other key
    /// of the group has that candidate too (two keys of one neighbourhood:
    /// replacing it for one would move it under the other), else
    /// [`Prior::Unread`]. The keys' index slots are fetched first, so that
    /// their cache misses overlap instead of following one another.
    pub(crate) fn look_up_all(&self, keys: &[(u64, &[u8], Option<bool>)]) -> (Vec<Option<Prior>>, Vec<bool>) {
        for &(h, _, _) in keys {
            self.keys.index.prefetch(h);
        }
        let found: Vec<_> = keys.iter().map(|&(h, _, _)| self.keys.index.lookup(h)).collect();
        // Every candidate of the group, to tell one no other key shares.
        let mut all: Vec<u64> = found.iter().flat_map(|c| c.as_slice().iter().map(|e| e.pba())).collect();
        all.sort_unstable();
        let shared = |pba: u64| all.partition_point(|&p| p <= pba) - all.partition_point(|&p| p < pba) > 1;
        let mut own_link = vec![false; keys.len()];
        let mut cands = Vec::with_capacity(keys.len());
        let mut looked: Vec<Option<Prior>> = keys
            .iter()
            .zip(&found)
            .map(|(&(_, key, look), c)| {
                let may_be_blind = look?;
                Some(match c.as_slice() {
                    [] => Prior::Known(None),
                    &[e] if may_be_blind && self.blind_candidate(e) && !shared(e.pba()) => {
                        cands.push((e.pba(), key));
                        Prior::Blind(e)
                    }
                    _ => Prior::Unread,
                })
            })
            .collect();
        if !cands.is_empty() {
            // The candidates in key order, as `cands` holds them.
            let blind = looked.iter_mut().zip(&mut own_link).filter(|(p, _)| matches!(p, Some(Prior::Blind(_))));
            for (ok, (p, own)) in self.keys.links.blind_ok_all(&cands).into_iter().zip(blind) {
                match ok {
                    Some(o) => *own = o,
                    None => *p = Some(Prior::Unread),
                }
            }
        }
        (looked, own_link)
    }

    /// Blind overwrites whose records share one segment, as
    /// [`Core::commit_blind`] does each but with the links' table locked
    /// twice for them all, not a few times each: every new link added and
    /// every carried one aliased, then the index moved, then each link
    /// settled at its new head. The caller holds every key's stripe, so no
    /// link of these heads changes meanwhile. `published(k)` runs as the
    /// index moves to `writes[k]`'s record.
    pub(crate) async fn commit_blind_all(
        &self,
        writes: &[BlindWrite<'_>],
        mut published: impl FnMut(usize),
    ) -> Result<()> {
        let steps: Vec<BlindStep> = writes
            .iter()
            .map(|w| BlindStep {
                from: w.e.pba(),
                to: w.loc.pba,
                new: (!w.own_link).then(|| std::sync::Arc::new(crate::links::Link::new(w.e, w.key))),
            })
            .collect();
        let aliased = self.keys.links.start_blind(&steps);
        let (c, now) = (self.access_clock, self.clock.now());
        let mut done = Vec::with_capacity(writes.len());
        let mut aux = vec![0u32; writes.len()];
        for (k, w) in writes.iter().enumerate() {
            let old_aux = &mut aux[k];
            done.push(self.keys.index.replace_with(w.h, w.e.pba(), w.loc.grains, w.loc.pba, |a| {
                *old_aux = a;
                c.apply(w.policy, a, now)
            }));
            if done[k] {
                published(k);
            }
        }
        self.keys.links.finish_blind(&steps, &aliased, &done, &aux);
        // The records share one segment: their live bytes and the count of
        // blind overwrites are added once, before anything below can fail.
        let (mut moved, mut grains, mut seg) = (0u64, 0u64, None);
        for w in writes.iter().zip(&done).filter_map(|(w, &d)| d.then_some(w)) {
            debug_assert!(seg.is_none_or(|s| s == w.loc.seg), "blind writes committed together lie in one segment");
            (moved, grains, seg) = (moved + 1, grains + w.loc.grains, Some(w.loc.seg));
            self.blindly_replaced_key(w.key, w.h, w.e, w.loc);
        }
        if let Some(seg) = seg {
            self.space.add_live(seg, grains * self.log.grain());
            self.counters.blind.fetch_add(moved, Relaxed);
        }
        for (k, w) in writes.iter().enumerate().filter(|&(k, _)| !done[k]) {
            // Not expected under the stripe; the careful way then.
            let existing = self.find(w.key, w.h, false, false).await?;
            self.commit(w.key, w.h, existing, w.loc, false, w.policy).await?;
            published(k);
        }
        Ok(())
    }

    /// Point the index at a record just written over `e` without reading
    /// it, linking the two (under the key's stripe: `e` cannot change).
    pub(crate) async fn commit_blind(&self, key: &[u8], h: u64, e: Entry, loc: Loc, policy: Policy) -> Result<()> {
        let (c, now) = (self.access_clock, self.clock.now());
        let replace = || self.keys.index.replace_with(h, e.pba(), loc.grains, loc.pba, |w| c.apply(policy, w, now));
        let replaced = if self.keys.links.of_head(e.pba()).is_some() {
            // The head of this key's own link (`blind_ok`): `e` is this
            // key's version, and the link moves on to the new head.
            crate::settle::carry(self.parts(), e.pba(), loc.pba, replace)
        } else {
            let link = crate::links::Link::new(e, key);
            self.keys.links.insert(loc.pba, std::sync::Arc::new(link));
            let mut old_aux = 0;
            let done = self.keys.index.replace_with(h, e.pba(), loc.grains, loc.pba, |w| {
                old_aux = w;
                c.apply(policy, w, now)
            });
            if done {
                self.keys.links.set_aux(loc.pba, old_aux);
            } else {
                self.keys.links.remove(loc.pba);
            }
            done
        };
        if !replaced {
            // Not expected under the stripe; the careful way then.
            let existing = self.find(key, h, false, false).await?;
            return self.commit(key, h, existing, loc, false, policy).await;
        }
        self.blindly_replaced(key, h, e, loc);
        Ok(())
    }
}

/// A write's records that may lie on the device without the index
/// pointing at them: while `seg` is set, dropping this lists them through
/// `stray` ([`Stray`]; the writer still holds their keys' stripes), and
/// only then releases their allocation (`held`), so GC cannot free the
/// segment before they are listed.
pub(crate) struct Unindexed<'a> {
    stray: Stray<'a>,
    seg: Option<u32>,
    held: Option<Held<'a>>,
}

impl<'a> Unindexed<'a> {
    pub(crate) fn new(stray: Stray<'a>) -> Unindexed<'a> {
        Unindexed { stray, seg: None, held: None }
    }

    /// The records are written (at `held`), not yet indexed.
    pub(crate) fn hold(&mut self, held: Held<'a>) {
        self.seg = Some(held.loc().seg);
        self.held = Some(held);
    }

    /// Their indexing ended: listed unless `indexed`, then released.
    pub(crate) fn end(mut self, indexed: bool) {
        if indexed {
            self.seg = None;
        }
    }
}

impl Drop for Unindexed<'_> {
    fn drop(&mut self) {
        if let (Some(list), Some(seg)) = (self.stray, self.seg) {
            list(seg);
        }
        // `held` drops after: the allocation is released once listed.
    }
}
