//! The engine's state about keys, all in DRAM: the index, the stripe locks
//! that serialise changes of one key, the links of blind overwrites
//! ([`crate::links`]), the keys with versions on the device the index does
//! not point at ([`DroppedKeys`]) and the watch a sparse GC read keeps on
//! its victim ([`SparseWatch`]) and the namespace ids that are live
//! ([`crate::nskey::NsTable`]), and the atomic batches whose keys are being
//! made visible ([`Publishing`]), and the writes of one key waiting to be
//! combined ([`crate::combine`]).
//!
//! Invariants: every change of a key's index entries, links or dropped
//! versions is made under the key's stripe, and keys that can be
//! candidates of each other (same home slot and key tag) share a stripe
//! ([`stripe_for`]), so a writer holds the stripe of every key a link it
//! makes or settles concerns. Readers take no stripe.

use granary_index::Index;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

/// Number of key stripe locks serialising mutations of one key. A run of
/// PUTs holds its keys' stripes across its device write, and takes them
/// in order, holding those it has while it waits for the next: so this
/// many that runs of 16 keys in flight together rarely share one (two
/// share none about 98% of the time; with 1,024 stripes 78%, and a run
/// waiting for one stripe holds up every run waiting for those it holds).
/// 16 bytes each, 256 KiB in all.
pub(crate) const KEY_STRIPES: usize = 16384;

/// The stripe of a key of hash `h` whose home slot is `home`: a function
/// of its fingerprint (home slot and key tag) only, so that the keys a
/// blind overwrite may displace share the writer's stripe
/// ([`crate::links`]).
pub(crate) fn stripe_for(home: usize, h: u64) -> usize {
    let fp = granary_format::hash::fingerprint(home as u64, granary_format::hash::key_tag(h));
    (fp.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - KEY_STRIPES.trailing_zeros())) as usize
}

/// The key-side state of an open store.
pub(crate) struct Keys {
    /// The store's key hash (its superblock's algorithm and seed): every
    /// key is hashed with it, never with the public seed.
    pub hasher: granary_format::hash::KeyHasher,
    pub index: Index,
    stripes: Box<[async_lock::Mutex<()>]>,
    /// Entries displaced by blind overwrites, not yet settled.
    pub links: crate::links::Links,
    /// Keys whose value GC is dropping from a segment not yet free on the
    /// device: a new value of such a key supersedes a version still on the
    /// device, though none is indexed.
    pub dropped: DroppedKeys,
    /// Changes to the segment a GC reads sparsely.
    pub watch: SparseWatch,
    /// The namespace ids that are live.
    pub ns: crate::nskey::NsTable,
    /// Atomic batches being made visible (`crate::batch`).
    pub publishing: Publishing,
    /// The DRAM tier of hot values, when on ([`crate::tier`]): a key's
    /// item is dropped under its stripe whenever its index entry changes.
    pub tier: Option<crate::tier::Tier>,
    /// PUTs and read-modify-writes waiting for their key's stripe, to be
    /// carried by the next write of their key ([`crate::combine`]).
    pub combine: crate::combine::Combiner,
}

impl Keys {
    pub(crate) fn new(
        hasher: granary_format::hash::KeyHasher,
        index: Index,
        links: crate::links::Links,
        tier: Option<crate::tier::Tier>,
    ) -> Keys {
        Keys {
            hasher,
            index,
            stripes: (0..KEY_STRIPES).map(|_| async_lock::Mutex::new(())).collect(),
            links,
            dropped: DroppedKeys::default(),
            watch: SparseWatch::new(),
            ns: crate::nskey::NsTable::new(),
            publishing: Publishing::default(),
            tier,
            combine: Default::default(),
        }
    }

    /// `key`'s hash in this store.
    #[inline]
    pub(crate) fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash(key)
    }

    /// The stripe lock index of hash `h`: keys that are candidates of
    /// each other (same home slot and key tag) share it.
    pub(crate) fn stripe_of(&self, h: u64) -> usize {
        stripe_for(self.index.home(h), h)
    }

    /// Take stripe `i`, blocking the thread (GC, off any executor).
    pub(crate) fn lock_stripe(&self, i: usize) -> async_lock::MutexGuard<'_, ()> {
        // Uncontended (the usual case): no event listener set up.
        self.stripes[i].try_lock().unwrap_or_else(|| self.stripes[i].lock_blocking())
    }

    /// Take stripe `i` if it is free now.
    pub(crate) fn try_lock_stripe(&self, i: usize) -> Option<async_lock::MutexGuard<'_, ()>> {
        self.stripes[i].try_lock()
    }

    /// Take the stripe of hash `h`, blocking the thread (off any executor).
    pub(crate) fn lock_key(&self, h: u64) -> async_lock::MutexGuard<'_, ()> {
        self.lock_stripe(self.stripe_of(h))
    }

    /// Take stripe `i`, yielding the executor while it waits.
    pub(crate) async fn stripe_at(&self, i: usize) -> async_lock::MutexGuard<'_, ()> {
        self.stripes[i].lock().await
    }

    /// Drop `key`'s DRAM tier item (its index entry changed); the caller
    /// holds its stripe.
    pub(crate) fn invalidate(&self, key: &[u8], h: u64) {
        if let Some(t) = &self.tier {
            t.invalidate(key, h);
        }
    }

    /// GC moved `key`'s record of sequence number `seq` from `from` to
    /// `to` (locations with their segments' stamps): its DRAM tier item
    /// follows ([`crate::tier::Tier::moved`]); the caller holds its stripe.
    pub(crate) fn moved(&self, key: &[u8], h: u64, seq: u64, from: (u64, u32), to: (u64, u32)) {
        if let Some(t) = &self.tier {
            t.moved(key, h, seq, from, to);
        }
    }

    /// Take the stripe of hash `h`, yielding the executor while it waits.
    pub(crate) async fn stripe(&self, h: u64) -> async_lock::MutexGuard<'_, ()> {
        self.stripes[self.stripe_of(h)].lock().await
    }
}

#[cfg(test)]
thread_local! {
    /// Runs as [`DroppedKeys::freed`] begins, on its thread (tests).
    #[allow(clippy::type_complexity)]
    pub(crate) static ON_FREED: std::cell::RefCell<Option<Box<dyn FnMut(u32)>>> = const { std::cell::RefCell::new(None) };
}

/// Hashes of keys that have a version in a segment which the index no
/// longer points at, per segment, until that segment is free on the
/// device: values GC dropped from a victim (see `gc::drop_value`), values it
/// copied out of a victim (the original stays beside the copy, with the
/// same sequence number, until the victim is freed), copies of one
/// record that recovery found twice (a crash between a copy and the
/// victim's free), and records a write may have left unindexed (its
/// future dropped while they were written or indexed:
/// `write::Unindexed`). Such a version could come back after a crash, so a new
/// value of the key carries the supersedes flag and a delete writes a
/// tombstone even when the index holds nothing for the key; and index
/// checkpoints replay these segments (`checkpoint::write`), so the next
/// recovery finds the versions again. A victim whose reclaim failed (no
/// room to relocate, an IO error) keeps its entries until a later reclaim
/// frees it. Writers check it on every write, so the empty case is one
/// atomic load, and a key none of whose hash's slot is listed too (the
/// list can hold a write's strays for long: no lock is taken for keys
/// not in it).
pub(crate) struct DroppedKeys {
    sets: std::sync::Mutex<std::collections::HashMap<u32, std::collections::HashSet<u64>>>,
    len: std::sync::atomic::AtomicUsize,
    /// Listed (segment, hash) pairs by [`DroppedKeys::slot`] of the hash.
    slots: Box<[std::sync::atomic::AtomicU32]>,
}

/// Slots of [`DroppedKeys::slots`].
const DROPPED_SLOTS: usize = 1024;

impl Default for DroppedKeys {
    fn default() -> DroppedKeys {
        DroppedKeys {
            sets: Default::default(),
            len: Default::default(),
            slots: (0..DROPPED_SLOTS).map(|_| Default::default()).collect(),
        }
    }
}

impl DroppedKeys {
    fn slot(&self, h: u64) -> &std::sync::atomic::AtomicU32 {
        &self.slots[(h >> 40) as usize % DROPPED_SLOTS]
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u32, std::collections::HashSet<u64>>> {
        self.sets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record that segment `v` holds a version of the key of hash `h`
    /// which the index does not point at; the caller holds its key's
    /// stripe (or, in recovery, nothing else runs).
    pub(crate) fn insert(&self, v: u32, h: u64) {
        self.insert_all(v, [h]);
    }

    pub(crate) fn insert_all(&self, v: u32, hs: impl IntoIterator<Item = u64>) {
        let mut s = self.lock();
        let set = s.entry(v).or_default();
        for h in hs {
            if set.insert(h) {
                self.slot(h).fetch_add(1, Relaxed);
            }
        }
        self.len.store(s.values().map(|x| x.len()).sum(), Relaxed);
    }

    /// The segments listed.
    pub(crate) fn segments(&self) -> Vec<u32> {
        self.lock().keys().copied().collect()
    }

    /// Whether `h` was dropped from a victim not yet free; the caller holds
    /// its key's stripe, which orders this after the insert made under it.
    pub(crate) fn contains(&self, h: u64) -> bool {
        self.len.load(Relaxed) != 0 && self.slot(h).load(Relaxed) != 0 && self.lock().values().any(|x| x.contains(&h))
    }

    /// Victim `v` is free on the device: its dropped values are gone.
    pub(crate) fn freed(&self, v: u32) {
        #[cfg(test)]
        ON_FREED.with(|hook| {
            if let Some(f) = hook.borrow_mut().as_mut() {
                f(v)
            }
        });
        let mut s = self.lock();
        if let Some(gone) = s.remove(&v) {
            for h in gone {
                self.slot(h).fetch_sub(1, Relaxed);
            }
        }
        self.len.store(s.values().map(|x| x.len()).sum(), Relaxed);
    }

    /// Hashes held, for tests.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Relaxed)
    }
}

/// Tells a sparse reclaim whether a record of its victim was put back in
/// the index (a link settled: the displaced record was another key's)
/// while it read. Without that, a record's entry only ever leaves the
/// index, and a record the reads miss is garbage: not seen by the walk
/// means absent at some point of it, so absent ever after; linked at the
/// end means displaced while indexed, so linked at the first look at the
/// links (displaced before it), at the second (displaced during the walk),
/// or indexed throughout the walk (displaced after it). A record put back
/// breaks that (displaced during the walk, put back, displaced again
/// between the final look's two reads): the victim falls back to a scan.
///
/// The two sides order themselves like Dekker's: the reclaim publishes its
/// victim, then (a full fence) reads the links and the index; a settle
/// changes the index, then (a full fence) reads the victim, and if it is
/// its record's segment, marks the watch touched, then (a release fence)
/// changes the segment's live bytes. So either the reclaim's reads see the
/// change, or the settle marks the watch; and a reclaim whose final read of
/// the live bytes sees the settle's change (then an acquire fence) sees the
/// mark. A settle still running at the end holds a stripe, which the
/// reclaim waits for before its final look.
#[derive(Default)]
pub(crate) struct SparseWatch {
    /// The victim being read sparsely, or `u64::MAX`.
    victim: AtomicU64,
    touched: std::sync::atomic::AtomicBool,
}

impl SparseWatch {
    pub(crate) fn new() -> SparseWatch {
        SparseWatch { victim: AtomicU64::new(u64::MAX), touched: Default::default() }
    }

    pub(crate) fn start(&self, v: u32) -> WatchGuard<'_> {
        use std::sync::atomic::{fence, Ordering::SeqCst};
        SPARSE_READER.with(|r| r.set(true));
        self.touched.store(false, SeqCst);
        self.victim.store(v as u64, SeqCst);
        fence(SeqCst);
        WatchGuard(self)
    }

    /// A settle, under its stripe, has just put an entry of segment `seg`
    /// back in the index, and is about to add to the segment's live bytes.
    pub(crate) fn changed(&self, seg: u32) {
        use std::sync::atomic::{fence, Ordering::SeqCst};
        fence(SeqCst);
        // The reclaim's own changes (settling a link into its victim while
        // it reads) are of records it handles itself.
        if self.victim.load(SeqCst) == seg as u64 && !SPARSE_READER.with(|r| r.get()) {
            self.touched.store(true, SeqCst);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
    }

    /// Whether the victim was touched (after the final reads).
    pub(crate) fn touched(&self) -> bool {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        self.touched.load(std::sync::atomic::Ordering::SeqCst)
    }
}

thread_local! {
    /// Set on the thread of a reclaim that watches its victim.
    static SPARSE_READER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Ends a watch.
pub(crate) struct WatchGuard<'a>(&'a SparseWatch);

impl Drop for WatchGuard<'_> {
    fn drop(&mut self) {
        self.0.victim.store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
        SPARSE_READER.with(|r| r.set(false));
    }
}

/// The batches whose records the index is being pointed at: a reader that
/// reads one of their records waits until its batch is done.
#[derive(Default)]
pub(crate) struct Publishing {
    /// (first, last) sequence numbers of each batch being published.
    ranges: Mutex<Vec<(u64, u64)>>,
    len: AtomicUsize,
}

/// A batch being published ([`Publishing::start`]): its entry is removed
/// when this is dropped, also if the commit's future is (no reader waits
/// for it forever).
#[must_use]
pub(crate) struct PublishingEntry<'a>(&'a Publishing, u64);

impl Drop for PublishingEntry<'_> {
    fn drop(&mut self) {
        self.0.end(self.1);
    }
}

impl Publishing {
    pub(crate) fn start(&self, first: u64, last: u64) -> PublishingEntry<'_> {
        let mut r = self.ranges.lock().unwrap_or_else(|e| e.into_inner());
        r.push((first, last));
        self.len.store(r.len(), Relaxed);
        PublishingEntry(self, first)
    }

    fn end(&self, first: u64) {
        let mut r = self.ranges.lock().unwrap_or_else(|e| e.into_inner());
        r.retain(|&(f, _)| f != first);
        self.len.store(r.len(), std::sync::atomic::Ordering::Release);
    }

    fn busy(&self, seq: u64) -> bool {
        self.len.load(std::sync::atomic::Ordering::Acquire) != 0
            && self.ranges.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|&(f, l)| (f..=l).contains(&seq))
    }

    /// Wait while the batch of the record of sequence number `seq` is
    /// being published (a few index updates, no IO).
    pub(crate) async fn wait(&self, seq: u64) {
        while self.busy(seq) {
            if granary_rt::on_runtime() {
                granary_rt::yield_now().await;
            } else {
                std::thread::yield_now();
            }
        }
    }
}
