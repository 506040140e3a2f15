//! Atomic batches: puts, deletes, conditional writes and conditions alone
//! over any keys of any namespaces, committed all or nothing
//! ([`Store::batch`]).
//!
//! **Operations** ([`BatchOp`]): `Put` and `Delete` hold no condition;
//! `PutAbsent`, `PutPresent` and `Cas` write under one; `DeleteCas` deletes
//! under one; `Check` is a condition alone (Redis WATCH over MULTI/EXEC): it
//! writes nothing, but its key's stripe is held and its condition checked at
//! the commit point like any other operation's. An operation that writes
//! nothing (a `Check`, a delete of a key with no version anywhere) has no
//! record and is not one of the commit record's members; a batch in which
//! no operation writes has no commit record either, and one of checks alone
//! writes nothing at all (not even the superblock's batches flag).
//!
//! **Commit** (`Core::commit_batch`):
//! 1. Every key's stripe is taken, in stripe order (so two batches, or a
//!    batch and a single write, never wait for each other in a circle).
//! 2. Each key's current version is looked up and every condition checked;
//!    if one fails, nothing is written and the caller learns which.
//! 3. The records (each marked as a batch's, record version 5) and one
//!    commit record after them ([`granary_format::batch`]) are placed
//!    contiguously in one segment and written with one IO (flushed in
//!    `Flush` mode; `Core::write_encoded`: in zoned mode a group of its own
//!    in the coalescer's allocation order, so it lands at its zone's write
//!    pointer). Only then is the batch durable; a crash before leaves
//!    records with no commit record after them, which recovery drops.
//! 4. The index is pointed at every record while a
//!    [`Publishing`](crate::keys::Publishing) entry
//!    covers the batch's sequence numbers; a reader that reads one of its
//!    records waits until the entry is gone, that is until every key of the
//!    batch points at its new version. So no reader sees one key of a
//!    committed batch and afterwards the old value of another.
//!    Blind overwrites ([`crate::links`]) are decided for the whole batch
//!    with one look at the links' table, and their links added or carried
//!    with one lock before the index moves and one after, not a few locks
//!    per key. A namespace that evicts at its quota ([`crate::quota`]) makes
//!    room for the batch before step 1.
//!
//! GC relocates a batch's records as it does any record, clearing the
//! batch mark on the copy (its batch is committed: only committed records
//! are ever indexed); the commit record is never indexed, so GC drops it.
//!
//! **Expiry**: a value written without one gets its namespace's default
//! TTL, as a PUT does, unless its operation was added with
//! [`Batch::op_exact`] (written as given, 0 being none: a value derived
//! from the key's own, as Redis's PERSIST inside MULTI/EXEC).
//!
//! Limits: [`BATCH_OPS_MAX`] operations, each key once, and the records
//! must fit in one segment (`BadBatch`, nothing applied, past either).

use crate::counters::NsCounters;
use crate::detach::Finish;
use crate::error::{Error, Result};
use crate::namespace::NsState;
use crate::nskey::{owner, user_key, Owner};
use crate::space::{Loc, Purpose};
use crate::store::{Core, Found, Namespace, Store};
use crate::types::{ItemMeta, PutOutcome};
use crate::write::{BlindWrite, Prior, Unindexed};
use granary_format::batch::{members_crc, Commit, COMMIT_BYTES, COMMIT_KEY};
use granary_format::limits::{grains_for, record_bytes};
use granary_format::record::{self, RecordHeader};
use granary_format::superblock::FLAG_BATCHES;
use granary_index::Entry;
use granary_io::AlignedBuf;
use granary_rt::block_on;
use std::borrow::Cow;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Most operations in one batch.
pub const BATCH_OPS_MAX: usize = 1024;

/// One operation of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOp {
    /// Insert or overwrite.
    Put { value: Vec<u8>, meta: ItemMeta },
    /// Only if the key holds no value.
    PutAbsent { value: Vec<u8>, meta: ItemMeta },
    /// Only if the key holds a value.
    PutPresent { value: Vec<u8>, meta: ItemMeta },
    /// Only if the key holds a value whose CAS value is `cas`.
    Cas { cas: u64, value: Vec<u8>, meta: ItemMeta },
    /// Delete (nothing to do if the key holds nothing).
    Delete,
    /// Delete only if the key holds a value whose CAS value is `cas`.
    DeleteCas { cas: u64 },
    /// A condition only, writing nothing: the key holds a value whose CAS
    /// value is `cas` (Some), or holds no value (None).
    Check { cas: Option<u64> },
}

/// What a commit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOutcome {
    /// Every operation applied; each one's new CAS value (0 for a delete
    /// or a check).
    Committed { cas: Vec<u64> },
    /// Operation `op`'s condition failed (`Exists`: the key holds a value,
    /// or another CAS value; `NotFound`: it holds none): nothing applied.
    ConditionFailed { op: usize, outcome: PutOutcome },
}

/// One operation added to a [`Batch`].
pub(crate) struct Queued {
    ns: Arc<NsState>,
    key: Vec<u8>,
    op: BatchOp,
    /// Its metadata is written as given: the namespace's default TTL is
    /// not applied ([`Batch::op_exact`]).
    exact: bool,
}

/// A batch being built ([`Store::batch`]): add operations, then
/// [`Batch::commit`].
pub struct Batch<'s> {
    store: &'s Store,
    ops: Vec<Queued>,
    /// The first namespace handle added that is another store's: the
    /// commit refuses the batch (its id means another namespace here).
    foreign: Option<String>,
}

impl Store {
    /// A new, empty atomic batch on this store.
    pub fn batch(&self) -> Batch<'_> {
        Batch { store: self, ops: Vec::new(), foreign: None }
    }
}

impl Batch<'_> {
    /// Add `op` on `key` of namespace `ns` (a handle of this batch's
    /// store: one of another store makes the commit fail with
    /// [`Error::BadBatch`]).
    ///
    /// A value written without an expiry (0) gets the namespace's default
    /// TTL, if it has one, as a PUT does.
    pub fn op(&mut self, ns: &Namespace, key: &[u8], op: BatchOp) -> &mut Self {
        self.queue(ns, key, op, false)
    }

    /// [`Batch::op`] whose value is written with its metadata exactly as
    /// given: an expiry of 0 is none, never the namespace's default TTL
    /// (a value derived from the key's own, which keeps its expiry, as
    /// `Change::Derive` does for one key; or one whose caller applied the
    /// default itself).
    pub fn op_exact(&mut self, ns: &Namespace, key: &[u8], op: BatchOp) -> &mut Self {
        self.queue(ns, key, op, true)
    }

    fn queue(&mut self, ns: &Namespace, key: &[u8], op: BatchOp, exact: bool) -> &mut Self {
        if self.foreign.is_none() && !ns.is_of(&self.store.core) {
            self.foreign = Some(ns.name().to_string());
        }
        self.ops.push(Queued { ns: ns.state(), key: key.to_vec(), op, exact });
        self
    }

    fn refuse_foreign(&self) -> Result<()> {
        match &self.foreign {
            Some(name) => Err(Error::BadBatch(format!("namespace {name:?} is a handle of another store"))),
            None => Ok(()),
        }
    }

    pub fn put(&mut self, ns: &Namespace, key: &[u8], value: &[u8]) -> &mut Self {
        self.op(ns, key, BatchOp::Put { value: value.to_vec(), meta: ItemMeta::default() })
    }

    pub fn put_absent(&mut self, ns: &Namespace, key: &[u8], value: &[u8]) -> &mut Self {
        self.op(ns, key, BatchOp::PutAbsent { value: value.to_vec(), meta: ItemMeta::default() })
    }

    pub fn cas(&mut self, ns: &Namespace, key: &[u8], cas: u64, value: &[u8]) -> &mut Self {
        self.op(ns, key, BatchOp::Cas { cas, value: value.to_vec(), meta: ItemMeta::default() })
    }

    pub fn delete(&mut self, ns: &Namespace, key: &[u8]) -> &mut Self {
        self.op(ns, key, BatchOp::Delete)
    }

    /// Delete `key` only if it holds a value whose CAS value is `cas`.
    pub fn delete_cas(&mut self, ns: &Namespace, key: &[u8], cas: u64) -> &mut Self {
        self.op(ns, key, BatchOp::DeleteCas { cas })
    }

    /// Commit only if `key` holds a value whose CAS value is `cas` (Some),
    /// or holds no value (None); writes nothing to `key`.
    pub fn check(&mut self, ns: &Namespace, key: &[u8], cas: Option<u64>) -> &mut Self {
        self.op(ns, key, BatchOp::Check { cas })
    }

    /// Operations added so far.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Commit every operation or none; durable when it returns
    /// `Committed`.
    pub fn commit(self) -> Result<BatchOutcome> {
        self.refuse_foreign()?;
        block_on(self.store.core.commit_batch(self.ops))
    }

    /// [`Batch::commit`] as a future. Once polled, the commit runs to its
    /// end even if this future is dropped (a caller's timeout): the batch
    /// is then committed or not, as a whole, and only its outcome is lost.
    pub async fn commit_async(self) -> Result<BatchOutcome> {
        self.refuse_foreign()?;
        let Batch { store, ops, .. } = self;
        let core = store.core.clone();
        let work = async move { core.commit_batch(ops).await };
        Finish::new(&*store.core, Box::pin(work), None).await
    }
}

#[cfg(test)]
thread_local! {
    /// Runs once, on the committing thread, after a batch's first key is
    /// published and before the others are (tests).
    static AFTER_FIRST_PUBLISHED: std::cell::Cell<Option<Box<dyn FnOnce()>>> = const { std::cell::Cell::new(None) };
}

/// Largest record buffer a thread keeps for its next batch.
const SPARE_BYTES_MAX: usize = 256 << 10;

thread_local! {
    /// The record buffer of this thread's last batch (a heap buffer of at
    /// most [`SPARE_BYTES_MAX`]), reused by its next one: a new buffer of
    /// more than a block is cleared by the allocator, which the encoding
    /// then overwrites anyway.
    static SPARE: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

/// A buffer of `len` bytes for a batch's records, which encoding
/// overwrites whole (so what it held before never reaches the device, as
/// with [`AlignedBuf::for_read`]): the thread's spare if it is large enough
/// and no arena of registered memory exists (its chunks come first),
/// else [`AlignedBuf::for_read`]'s.
fn batch_buf(len: usize) -> AlignedBuf {
    if granary_rt::arena::get().is_none() {
        let spare = SPARE.try_with(|s| s.borrow_mut().take()).ok().flatten();
        if let Some(mut b) = spare.filter(|b| b.capacity() >= len) {
            b.set_len(len);
            return b;
        }
    }
    AlignedBuf::for_read(len)
}

/// Keep `buf`, a batch's record buffer written, as the thread's spare.
fn keep_spare(buf: AlignedBuf) {
    if !buf.is_registered() && buf.capacity() <= SPARE_BYTES_MAX {
        let _ = SPARE.try_with(|s| *s.borrow_mut() = Some(buf));
    }
}

/// One operation, resolved: its stored key and what it writes.
struct Resolved {
    ns: Arc<NsState>,
    counters: Arc<NsCounters>,
    key: Vec<u8>,
    h: u64,
    op: BatchOp,
}

impl Resolved {
    /// The value it writes; None for a delete (a tombstone) or a check
    /// (nothing).
    fn value(&self) -> Option<(&[u8], ItemMeta)> {
        match &self.op {
            BatchOp::Put { value, meta }
            | BatchOp::PutAbsent { value, meta }
            | BatchOp::PutPresent { value, meta }
            | BatchOp::Cas { value, meta, .. } => Some((value, *meta)),
            BatchOp::Delete | BatchOp::DeleteCas { .. } | BatchOp::Check { .. } => None,
        }
    }

    /// Whether it may write a record (a check never does).
    fn may_write(&self) -> bool {
        !matches!(self.op, BatchOp::Check { .. })
    }
}

impl Core {
    pub(crate) async fn commit_batch(&self, ops: Vec<Queued>) -> Result<BatchOutcome> {
        if ops.is_empty() {
            return Ok(BatchOutcome::Committed { cas: Vec::new() });
        }
        if ops.len() > BATCH_OPS_MAX {
            return Err(Error::BadBatch(format!("{} operations; a batch holds at most {BATCH_OPS_MAX}", ops.len())));
        }
        let mut resolved = Vec::with_capacity(ops.len());
        for Queued { ns, key, op, exact } in ops {
            // A key of the default namespace is stored as it is. The key's
            // id and the counters are of one generation of the namespace
            // (a truncate meanwhile gives it new ones).
            let (id, counters) = ns.current()?;
            ns.check_block_key(&key)?;
            match &op {
                BatchOp::Put { value, .. }
                | BatchOp::PutAbsent { value, .. }
                | BatchOp::PutPresent { value, .. }
                | BatchOp::Cas { value, .. } => ns.check_block_value(value.len())?,
                _ => {}
            }
            let scoped = match self.stored_as(id, &key)? {
                Cow::Borrowed(_) => None,
                Cow::Owned(stored) => Some(stored),
            };
            let stored = scoped.unwrap_or(key);
            let op = match op {
                op if exact => op,
                BatchOp::Put { value, meta } => BatchOp::Put { value, meta: self.with_default_ttl(&ns, meta) },
                BatchOp::PutAbsent { value, meta } => {
                    BatchOp::PutAbsent { value, meta: self.with_default_ttl(&ns, meta) }
                }
                BatchOp::PutPresent { value, meta } => {
                    BatchOp::PutPresent { value, meta: self.with_default_ttl(&ns, meta) }
                }
                BatchOp::Cas { cas, value, meta } => {
                    BatchOp::Cas { cas, value, meta: self.with_default_ttl(&ns, meta) }
                }
                op @ (BatchOp::Delete | BatchOp::DeleteCas { .. } | BatchOp::Check { .. }) => op,
            };
            resolved.push(Resolved { h: self.keys.hash(&stored), key: stored, ns, counters, op });
        }
        // Each key once: sorted by hash, a key twice lies side by side.
        let mut order: Vec<usize> = (0..resolved.len()).collect();
        order.sort_unstable_by(|&a, &b| (resolved[a].h, &resolved[a].key).cmp(&(resolved[b].h, &resolved[b].key)));
        if let Some(w) = order.windows(2).find(|w| resolved[w[0]].key == resolved[w[1]].key) {
            let r = &resolved[w[1]];
            let key = match owner(&r.key) {
                Owner::Ns(id) => user_key(id, &r.key),
                Owner::Engine => &r.key[..],
            };
            let key = key.escape_ascii();
            return Err(Error::BadBatch(format!("key \"{key}\" of namespace {:?} appears twice", r.ns.name)));
        }
        // Every record's grains (a delete's tombstone counted, though it may
        // write none; a check has none), and the commit record's.
        let g = self.log.grain();
        let mut grains = Vec::with_capacity(resolved.len());
        for r in &resolved {
            grains.push(match r.value() {
                Some((v, _)) => self.value_grains(&r.key, v.len() as u64, None)?,
                None if r.may_write() => grains_for(record_bytes(r.key.len(), 0), self.log.sb.grain_bytes),
                None => 0,
            });
        }
        let commit_grains = grains_for(record_bytes(COMMIT_KEY.len(), COMMIT_BYTES as u64), self.log.sb.grain_bytes);
        let most = grains.iter().sum::<u64>() + commit_grains;
        if most >= self.log.sb.segment_grains() {
            return Err(Error::BadBatch(format!(
                "its records take {} bytes; a batch must fit in one segment ({} bytes)",
                most * g,
                (self.log.sb.segment_grains() - 1) * g
            )));
        }
        // Checks alone write nothing: no feature flag, no room needed.
        let may_write = resolved.iter().any(Resolved::may_write);
        // Deletes alone may take the reserve a DELETE may.
        let purpose = if resolved.iter().any(|r| r.value().is_some()) { Purpose::Put } else { Purpose::Delete };
        if may_write {
            self.enable_feature(FLAG_BATCHES)?;
        }
        // A namespace that evicts at its quota makes room for the batch
        // before its stripes are taken (`crate::quota`).
        self.evict_for_batch(&resolved, &grains).await?;
        loop {
            if may_write {
                self.log.check_writable()?;
                // At most every key and the commit record are listed.
                let listed = crate::space::listed_bytes(resolved.iter().map(|r| &r.key[..]).chain([COMMIT_KEY]));
                let room = self.await_room(purpose, most, listed).await;
                room.map_err(|e| self.log.check_writable().err().unwrap_or(e))?;
            }
            let mut stripes: Vec<usize> = resolved.iter().map(|r| self.keys.stripe_of(r.h)).collect();
            stripes.sort_unstable();
            stripes.dedup();
            let mut _held = Vec::with_capacity(stripes.len());
            for &i in &stripes {
                _held.push(self.keys.stripe_at(i).await);
            }
            match self.commit_locked(&resolved, &grains, commit_grains, purpose).await {
                Err(Error::NoSpace { .. }) => continue, // raced for the last room: wait again
                r => return r,
            }
        }
    }

    /// For each namespace that evicts at its quota ([`Core::evicts_at_quota`])
    /// and would pass it if every value the batch writes there were new
    /// (but those of writes that need the key present, `PutPresent` and
    /// `Cas`, which add no key, as their single writes count them): evict
    /// its own values to make room for them all.
    async fn evict_for_batch(&self, ops: &[Resolved], grains: &[u64]) -> Result<()> {
        let g = self.log.grain();
        let mut need: Vec<(&Resolved, u64, u64)> = Vec::new();
        for (r, &gr) in ops.iter().zip(grains) {
            if r.value().is_none() || !self.evicts_at_quota(&r.ns) {
                continue;
            }
            let key = u64::from(!matches!(r.op, BatchOp::PutPresent { .. } | BatchOp::Cas { .. }));
            match need.iter_mut().find(|(o, ..)| Arc::ptr_eq(&o.counters, &r.counters)) {
                Some(n) => (n.1, n.2) = (n.1 + key, n.2 + gr * g),
                None => need.push((r, key, gr * g)),
            }
        }
        for (r, keys, bytes) in need {
            let (max_keys, max_bytes) = (r.ns.options.max_keys, r.ns.options.max_bytes);
            let c = &r.counters;
            if max_keys.is_some_and(|m| c.keys.load(Relaxed) + keys > m)
                || max_bytes.is_some_and(|m| c.value_bytes.load(Relaxed) + bytes > m)
            {
                self.evict_for_quota(&r.ns, crate::quota::id_of(&r.key), c, keys, bytes).await?;
            }
        }
        Ok(())
    }

    /// Steps 2 to 4 of a commit, the stripes of every key held.
    async fn commit_locked(
        &self,
        ops: &[Resolved],
        grains: &[u64],
        commit_grains: u64,
        purpose: Purpose,
    ) -> Result<BatchOutcome> {
        let now = self.clock.now();
        // What each key holds: read for a condition; for an unconditional
        // write only what the index says, as a single write does (no read
        // unless the key's neighbourhood has several candidates or the
        // links' cap is reached, and then before the batch is written).
        let mut prior: Vec<Prior> = Vec::with_capacity(ops.len());
        // Values and bytes the batch's earlier writes add to each namespace
        // (by its counters), for the quota checks of the later ones: a key
        // for each write of a key the counters count no value of (none
        // indexed, or a tombstone; an expired value is counted until GC
        // meets it), and each record's bytes less the value it replaces.
        // Keyed by the counters' address (as a number: the commit's future
        // stays `Send`).
        let mut ahead: std::collections::HashMap<usize, (u64, u64)> = Default::default();
        let g = self.log.grain();
        // Unconditional writes: what the index holds for each key, as for a
        // single write, with the blind overwrites decided for the whole
        // batch in one pass over the links' table (`own_link`: the key's
        // one candidate heads the key's own link, which moves on).
        // The other operations' keys are looked up too, so that none is
        // the one candidate a blind overwrite of another key would replace.
        let keys: Vec<(u64, &[u8], Option<bool>)> = ops
            .iter()
            .map(|r| {
                let unconditional = matches!(r.op, BatchOp::Put { .. } | BatchOp::Delete);
                (r.h, &r.key[..], unconditional.then(|| r.value().is_some()))
            })
            .collect();
        let (looked, own_link) = self.look_up_all(&keys);
        for (i, (r, looked)) in ops.iter().zip(looked).enumerate() {
            // `counted`: the value of the key the counters count (keys,
            // bytes), which the write replaces.
            let quota = |counted: (u64, u64)| {
                let before = ahead.get(&(Arc::as_ptr(&r.counters) as usize)).copied().unwrap_or((0, 0));
                let added = (1 - counted.0, (grains[i] * g).saturating_sub(counted.1));
                (before, added)
            };
            let counted_of = |f: Option<&Found>| match f {
                Some(f) if !f.hdr.is_tombstone() => (1, f.hdr.grains(self.log.sb.grain_bytes) * g),
                _ => (0, 0),
            };
            if let Some(p) = looked {
                // A key the index cannot settle without a read is read now,
                // before the batch is written: a read that fails then fails
                // the batch with nothing written, where after the write it
                // would leave the batch half published (its records durable
                // and whole after a restart, but some of its keys' old
                // values served until then).
                let p = match p {
                    Prior::Unread => Prior::Known(self.find(&r.key, r.h, false, false).await?),
                    p => p,
                };
                if r.value().is_some() && r.ns.options.has_quota() {
                    let (before, added) = quota(match &p {
                        Prior::Known(f) => counted_of(f.as_ref()),
                        Prior::Blind(e) => (1, e.kv_size() as u64 * g),
                        Prior::Unread => unreachable!("read above"),
                    });
                    self.check_quota_after(&r.ns, &r.counters, &r.key, grains[i], before).await?;
                    ahead.insert(Arc::as_ptr(&r.counters) as usize, (before.0 + added.0, before.1 + added.1));
                }
                prior.push(p);
                continue;
            }
            let existing = self.find(&r.key, r.h, false, false).await?;
            let live = existing.as_ref().filter(|f| self.is_live(f, now));
            let failed = match (&r.op, live) {
                (BatchOp::PutAbsent { .. } | BatchOp::Check { cas: None }, Some(_)) => Some(PutOutcome::Exists),
                (
                    BatchOp::PutPresent { .. }
                    | BatchOp::Cas { .. }
                    | BatchOp::DeleteCas { .. }
                    | BatchOp::Check { cas: Some(_) },
                    None,
                ) => Some(PutOutcome::NotFound),
                (
                    BatchOp::Cas { cas, .. } | BatchOp::DeleteCas { cas } | BatchOp::Check { cas: Some(cas) },
                    Some(f),
                ) if record::cas_of(&f.hdr, &f.buf) != *cas => Some(PutOutcome::Exists),
                _ => None,
            };
            if let Some(outcome) = failed {
                return Ok(BatchOutcome::ConditionFailed { op: i, outcome });
            }
            if r.value().is_some() && r.ns.options.has_quota() {
                let (before, added) = quota(counted_of(existing.as_ref()));
                self.check_quota_after(&r.ns, &r.counters, &r.key, grains[i], before).await?;
                ahead.insert(Arc::as_ptr(&r.counters) as usize, (before.0 + added.0, before.1 + added.1));
            }
            prior.push(Prior::Known(existing));
        }
        // A check writes nothing, nor does a delete of a key with no version
        // anywhere or whose version is a tombstone already, as a single
        // delete (a `DeleteCas` that passed found a live value), unless GC
        // is dropping the key's value (without a tombstone it would come
        // back after a crash).
        let writes: Vec<bool> = ops
            .iter()
            .zip(&prior)
            .map(|(r, p)| {
                let nothing = match p {
                    Prior::Known(None) => true,
                    Prior::Known(Some(f)) => f.hdr.is_tombstone(),
                    Prior::Unread | Prior::Blind(_) => false,
                };
                r.may_write() && (r.value().is_some() || !nothing || self.keys.dropped.contains(r.h))
            })
            .collect();
        // A new key of a crowded fingerprint is refused before anything is
        // written, as a single write's is.
        let written: Vec<(u64, &[u8])> =
            ops.iter().zip(&writes).filter(|(_, &w)| w).map(|(r, _)| (r.h, &r.key[..])).collect();
        let mut priors: Vec<&mut Prior> = prior.iter_mut().zip(&writes).filter(|(_, &w)| w).map(|(p, _)| p).collect();
        self.refuse_crowded(&written, &mut priors).await?;
        let n = writes.iter().filter(|&&w| w).count() as u64;
        if n == 0 {
            return Ok(BatchOutcome::Committed { cas: vec![0; ops.len()] });
        }
        let total =
            ops.iter().zip(grains).zip(&writes).filter(|(_, &w)| w).map(|((_, &g), _)| g).sum::<u64>() + commit_grains;
        let first = self.log.next_seq.fetch_add(n + 1, Relaxed);
        // Encode every record, then the commit record, into one buffer.
        // Encoding writes every byte of it (each record's padding and the
        // commit record's to the end), so the buffer is not cleared first.
        let g = self.log.grain();
        let mut placed: Vec<Option<(Loc, u64)>> = Vec::with_capacity(ops.len());
        let mut seq = first;
        let horizon = self.space.horizon();
        let encode = |loc: &Loc| {
            let mut buf = batch_buf((total * g) as usize);
            let mut at = 0u64;
            let mut header_crcs = Vec::with_capacity(n as usize);
            for ((r, p), (&w, &gr)) in ops.iter().zip(&prior).zip(writes.iter().zip(grains)) {
                if !w {
                    placed.push(None);
                    continue;
                }
                let out = &mut buf[(at * g) as usize..((at + gr) * g) as usize];
                match r.value() {
                    Some((value, meta)) => {
                        // An unread prior counts as present, as for single writes.
                        let supersedes = !matches!(p, Prior::Known(None)) || self.keys.dropped.contains(r.h);
                        let hdr = RecordHeader::value(r.key.len(), value.len() as u64, seq, loc.stamp)
                            .with_meta(meta.flags, meta.expires)
                            .with_stale(meta.stale)
                            .with_supersedes(supersedes)
                            .in_batch();
                        hdr.encode(self.log.seed, &r.key, value, out);
                    }
                    None => {
                        let hdr = RecordHeader::tombstone(r.key.len(), seq, loc.stamp, horizon).in_batch();
                        hdr.encode(self.log.seed, &r.key, &[], out);
                    }
                }
                header_crcs.push(record::stored_header_crc(out));
                placed.push(Some((Loc { pba: loc.pba + at, seg: loc.seg, stamp: loc.stamp, grains: gr }, seq)));
                at += gr;
                seq += 1;
            }
            let commit = Commit { records: n as u32, first_seq: first, members_crc: members_crc(header_crcs) };
            let hdr = RecordHeader::value(COMMIT_KEY.len(), COMMIT_BYTES as u64, seq, loc.stamp);
            hdr.encode(self.log.seed, COMMIT_KEY, &commit.encode(), &mut buf[(at * g) as usize..]);
            buf
        };
        let written = ops.iter().zip(&writes).filter(|(_, &w)| w).map(|(r, _)| &r.key[..]);
        let listed = crate::space::listed_bytes(written.chain([COMMIT_KEY]));
        // Records that may land unindexed (with their commit record, a
        // recovery applies them) are listed ([`Unindexed`]).
        let hs: Vec<u64> = ops.iter().zip(&writes).filter(|(_, &w)| w).map(|(r, _)| r.h).collect();
        let list = |seg: u32| self.keys.dropped.insert_all(seg, hs.iter().copied());
        let (held, buf) = self.write_encoded(purpose, total, listed, n, encode, Some(&list)).await?;
        let mut unindexed = Unindexed::new(Some(&list));
        unindexed.hold(held);
        if let Some(buf) = buf {
            keep_spare(buf);
        }
        // Durable: point the index at every record, readers of them waiting
        // until all are.
        let publishing = self.keys.publishing.start(first, seq);
        let published = self.publish_batch(ops, prior, &own_link, placed).await;
        drop(publishing);
        unindexed.end(published.is_ok());
        Ok(BatchOutcome::Committed { cas: published? })
    }

    /// Point the index at each record written (`placed`) over what its
    /// key held (`prior`); each one's CAS value (0 for a delete or an
    /// operation that wrote nothing). The blind overwrites go first, all at
    /// once ([`Core::publish_blind`]); the order is no reader's business,
    /// the batch's [`Publishing`](crate::keys::Publishing) entry covering
    /// them all. The counters take what was published once for the batch,
    /// not once per key (an error midway still counts the keys published).
    async fn publish_batch(
        &self,
        ops: &[Resolved],
        prior: Vec<Prior>,
        own_link: &[bool],
        placed: Vec<Option<(Loc, u64)>>,
    ) -> Result<Vec<u64>> {
        let mut tally = Tally::default();
        let r = self.publish_counted(ops, prior, own_link, &placed, &mut tally).await;
        tally.add_to(self);
        r
    }

    /// [`Core::publish_batch`], counting into `tally`.
    async fn publish_counted<'a>(
        &self,
        ops: &'a [Resolved],
        prior: Vec<Prior>,
        own_link: &[bool],
        placed: &[Option<(Loc, u64)>],
        tally: &mut Tally<'a>,
    ) -> Result<Vec<u64>> {
        let mut cas = vec![0; ops.len()];
        let mut first = true;
        let mut blind: Vec<(usize, Entry)> = Vec::with_capacity(ops.len());
        for (n, p) in prior.iter().enumerate() {
            if let Prior::Blind(e) = p {
                if placed[n].is_some() {
                    blind.push((n, *e));
                }
            }
        }
        if !blind.is_empty() {
            self.publish_blind(ops, &blind, own_link, placed, &mut first).await?;
            for &(n, _) in &blind {
                // (Not read: counted as live, as it most likely is.)
                cas[n] = tally.published(&ops[n], placed[n], true);
            }
        }
        let now = self.clock.now();
        for (n, (r, p)) in ops.iter().zip(prior).enumerate() {
            let Some((l, _)) = placed[n] else { continue };
            let tombstone = r.value().is_none();
            // A namespace counts the deletes of live values, as a single
            // delete (not of an expired one, nor of one GC dropped).
            let was_live = match &p {
                Prior::Known(Some(f)) => self.is_live(f, now),
                Prior::Known(None) => false,
                Prior::Unread | Prior::Blind(_) => true,
            };
            let policy = Self::policy_of(r);
            match p {
                Prior::Blind(_) => continue, // published above
                Prior::Known(existing) => self.commit(&r.key, r.h, existing, l, tombstone, policy).await?,
                Prior::Unread => {
                    // Not met: a batch reads before it writes (`commit_locked`).
                    debug_assert!(false, "a batch's prior was left unread");
                    let existing = self.find(&r.key, r.h, false, false).await?;
                    self.commit(&r.key, r.h, existing, l, tombstone, policy).await?
                }
            }
            Self::after_published(&mut first);
            cas[n] = tally.published(r, placed[n], was_live);
        }
        Ok(cas)
    }

    /// The access policy of an operation's new record.
    fn policy_of(r: &Resolved) -> crate::access::Policy {
        match r.value() {
            Some((_, meta)) => crate::access::Policy::new_item(&meta),
            None => crate::access::Policy::Fresh,
        }
    }

    /// Runs the test hook after the batch's first key is published.
    fn after_published(first: &mut bool) {
        if std::mem::take(first) {
            #[cfg(test)]
            AFTER_FIRST_PUBLISHED.with(|h| h.take().map(|f| f()));
        }
    }

    /// The blind overwrites of a batch (`blind`: the operation and the
    /// entry its record replaces), all at once ([`Core::commit_blind_all`]).
    async fn publish_blind(
        &self,
        ops: &[Resolved],
        blind: &[(usize, Entry)],
        own_link: &[bool],
        placed: &[Option<(Loc, u64)>],
        first: &mut bool,
    ) -> Result<()> {
        let writes: Vec<BlindWrite> = blind
            .iter()
            .map(|&(n, e)| BlindWrite {
                key: &ops[n].key,
                h: ops[n].h,
                e,
                loc: placed[n].expect("a blind overwrite wrote a record").0,
                policy: Self::policy_of(&ops[n]),
                own_link: own_link[n],
            })
            .collect();
        self.commit_blind_all(&writes, |_| Self::after_published(first)).await
    }
}

/// What a batch published, for the counters, added to them once
/// ([`Tally::add_to`]) instead of once per key.
#[derive(Default)]
struct Tally<'a> {
    puts: u64,
    deletes: u64,
    user_bytes: u64,
    /// Per namespace (by its counters; a batch seldom spans more than
    /// one): sets and deletes.
    ns: Vec<(&'a NsCounters, u64, u64)>,
}

impl<'a> Tally<'a> {
    /// Count operation `r`, its record published at `placed` (a delete of
    /// a value that was live if `was_live`); its CAS value (0 for a
    /// delete). The store counts every tombstone written, a namespace the
    /// deletes of live values (as single deletes do).
    fn published(&mut self, r: &'a Resolved, placed: Option<(Loc, u64)>, was_live: bool) -> u64 {
        let Some((_, seq)) = placed else { return 0 };
        let c: &'a NsCounters = &r.counters;
        let at = match self.ns.iter().position(|&(o, ..)| std::ptr::eq(o, c)) {
            Some(at) => at,
            None => {
                self.ns.push((c, 0, 0));
                self.ns.len() - 1
            }
        };
        match r.value() {
            Some((v, _)) => {
                self.puts += 1;
                self.user_bytes += (r.key.len() + v.len()) as u64;
                self.ns[at].1 += 1;
                seq
            }
            None => {
                self.deletes += 1;
                self.ns[at].2 += u64::from(was_live);
                0
            }
        }
    }

    fn add_to(&self, core: &Core) {
        let add = |c: &std::sync::atomic::AtomicU64, n: u64| {
            if n > 0 {
                c.fetch_add(n, Relaxed);
            }
        };
        add(&core.counters.puts, self.puts);
        add(&core.counters.user_bytes, self.user_bytes);
        add(&core.counters.deletes, self.deletes);
        for &(c, sets, deletes) in &self.ns {
            add(&c.sets, sets);
            add(&c.deletes, deletes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CreateOptions, OpenOptions, DEFAULT_NAMESPACE};

    /// A reader that reads the batch's first key while the second is not
    /// published yet waits, and then reads the second key's new value too.
    #[test]
    fn a_reader_of_a_half_published_batch_waits_for_the_rest() {
        let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(64 << 10), ..Default::default() };
        let dev = crate::tests::test_device(8 << 20);
        dev.shape_zones(64 << 10);
        let s = Arc::new(Store::create(dev, &c, &OpenOptions::default()).unwrap());
        let d = s.namespace(DEFAULT_NAMESPACE).unwrap();
        s.put(b"a", b"old").unwrap();
        s.put(b"b", b"old").unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = {
            let s = s.clone();
            move || {
                let t = std::thread::spawn(move || {
                    let a = s.get(b"a").unwrap().unwrap();
                    let b = s.get(b"b").unwrap().unwrap();
                    tx.send((a, b)).unwrap();
                });
                // Give the reader time to read `a` while `b` is old: with
                // no wait, it would then read `b`'s old value.
                std::thread::sleep(std::time::Duration::from_millis(100));
                drop(t);
            }
        };
        AFTER_FIRST_PUBLISHED.with(|h| h.set(Some(Box::new(reader))));
        let mut b = s.batch();
        b.put(&d, b"a", b"new").put(&d, b"b", b"new");
        assert!(matches!(b.commit().unwrap(), BatchOutcome::Committed { .. }));
        let (a, b) = rx.recv().unwrap();
        assert_eq!((a.as_slice(), b.as_slice()), (&b"new"[..], &b"new"[..]));
    }
}
