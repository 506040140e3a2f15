//! Blind overwrites: index entries an unconditional PUT displaced without
//! reading them, kept in DRAM until they are known dead or restored.
//!
//! **Why.** The index keeps fingerprints, not keys (as uDepot's does), so an
//! overwrite must tell the key's current version from another key that
//! shares its fingerprint: uDepot reads the candidate's record first.
//! That is one random read per overwrite, and on a device whose reads and
//! writes share one budget of IOs per second it caps overwrites at the
//! read rate. A blind overwrite skips the read: when the key's
//! neighbourhood has exactly one candidate, the new record replaces it in
//! the index at once, and a [`Link`] from the new entry (the *head*) keeps
//! the displaced entry and the head's key.
//!
//! **Exactness.** Nothing is guessed. The displaced record is almost always
//! the key's previous version; if it is another key (a fingerprint
//! collision), that key is still found and is put back in the index:
//! - a lookup that reads a head and finds another key follows its link and
//!   reads the displaced record too (`Core::find`, in `read`);
//! - GC, scanning the displaced record's segment, compares its key with the
//!   head's key, kept here: the same key means dead (the link goes), another
//!   key means live (it is indexed again and relocated as usual);
//! - a checkpoint and `verify` first resolve every link by reading the
//!   displaced record's key ([`crate::settle::resolve_all`]);
//! - a writer that finds its key through a link indexes it again before it
//!   replaces it.
//!
//! A second blind overwrite of the same key sees the head's link, whose key
//! is its own: the head is then known dead, and the link moves to the new
//! head unchanged. So a link never points at another head, chains never
//! form, and one key holds at most one link however often it is written.
//!
//! **Locks.** Every key that can be a candidate of another (same home slot
//! and key tag) has the same stripe lock ([`crate::keys::Keys::stripe_of`]),
//! so whoever changes a head or its link holds the stripe of every key the
//! link may concern. Readers take no stripe: a link is added before the
//! index points at its head and removed only after the displaced entry is
//! indexed again (or known dead), so a reader always finds one or the other.
//!
//! **Memory.** A link costs its key plus [`LINK_OVERHEAD_BYTES`]; the total
//! is capped by [`crate::OpenOptions::blind_overwrite_bytes`]. Past the cap,
//! overwrites read the old version as uDepot does. Links are not persisted:
//! recovery by log scan orders versions by sequence number, and checkpoints
//! are written with no link left unresolved.
//!
//! This module is the links' table; settling them (reading a displaced
//! record and deciding) is [`crate::settle`]'s.

use granary_index::Entry;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

/// DRAM a link costs besides its key: a hash-map slot (head to link, with
/// its control byte and spare capacity), a B-tree slot (displaced location
/// to link, with node slack), the shared link, and the allocator's
/// overhead on the link's and the key's blocks. Measured by
/// `tests/link_memory.rs` at 137-147 bytes with 24-byte keys (glibc's
/// chunk sizes counted), rounded up.
pub const LINK_OVERHEAD_BYTES: usize = 160;

/// Default of [`crate::OpenOptions::blind_overwrite_bytes`]: 64 MiB, about
/// 350,000 links of 32-byte keys.
pub const BLIND_OVERWRITE_BYTES_DEFAULT: usize = 64 << 20;

/// What a blind overwrite displaced.
#[derive(Debug)]
pub(crate) struct Link {
    /// The entry the head replaced (a value of exactly known size).
    pub old: Entry,
    /// The head's key.
    pub key: Box<[u8]>,
    /// The displaced entry's access word (`OpenOptions::track_access`),
    /// given back to it if it is indexed again.
    pub aux: AtomicU32,
    /// The head the table files the link under for its displaced
    /// location ([`Links::of_old`]): set by the table, under its lock, as
    /// the link is added or moves on; while a move is under way the link
    /// has a second head (an alias) that this does not name.
    head: AtomicU64,
}

impl Link {
    /// A link to add: `old` displaced by a record of `key`.
    pub(crate) fn new(old: Entry, key: &[u8]) -> Link {
        Link { old, key: key.into(), aux: AtomicU32::new(0), head: AtomicU64::new(0) }
    }

    /// The head it is filed under for its displaced location.
    fn head(&self) -> u64 {
        self.head.load(Relaxed)
    }
}

/// A link as the map holds it: shared, so that a lookup copies no key.
pub(crate) type LinkRef = Arc<Link>;

/// The hash of a head location for [`Inner::by_head`]: its grain number
/// mixed (the SplitMix64 finaliser), a few cycles where the default
/// SipHash takes tens on each of the few look-ups a write makes. The
/// locations are the store's own, not chosen by a client, so a keyed hash
/// buys nothing here.
#[derive(Default)]
struct LocHasher(u64);

impl Hasher for LocHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed (`write_u64`); any other input still
        // hashes, byte by byte.
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3).rotate_left(5);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
}

#[derive(Default)]
struct Inner {
    /// Head location to its link.
    by_head: HashMap<u64, LinkRef, BuildHasherDefault<LocHasher>>,
    /// Displaced location to its link, in location order (GC asks for
    /// the links into one segment). The link names its head
    /// ([`Link::head`]), so a link moving on to a new head changes a
    /// field, not this tree.
    by_old: BTreeMap<u64, LinkRef>,
    bytes: usize,
}

impl Inner {
    /// [`Links::insert`], the lock held.
    fn add(&mut self, head: u64, link: LinkRef) {
        self.bytes += cost(&link);
        link.head.store(head, Relaxed);
        let displaced = self.by_old.insert(link.old.pba(), link.clone());
        debug_assert!(displaced.is_none(), "two links of one displaced record at {}", link.old.pba());
        if let Some(prev) = self.by_head.insert(head, link) {
            // A location is reused only after GC freed its segment, which
            // removed or moved every link of a head in it.
            self.bytes -= cost(&prev);
            debug_assert!(false, "a link replaced another at head {head}");
        }
    }

    /// [`Links::remove`], the lock held.
    fn drop_head(&mut self, head: u64) -> Option<LinkRef> {
        let link = self.by_head.remove(&head)?;
        // Not an alias in the middle of a move (`carry`): the link goes.
        if link.head() == head {
            self.by_old.remove(&link.old.pba());
            self.bytes -= cost(&link);
        }
        Some(link)
    }
}

/// One blind overwrite of a batch ([`Links::start_blind`]): the index
/// moves from `from` (the key's one candidate) to `to` (its new record).
pub(crate) struct BlindStep {
    pub from: u64,
    pub to: u64,
    /// The link to add at `to` (`from` heads no link); None: `from` heads
    /// this key's own link, which moves to `to`.
    pub new: Option<LinkRef>,
}

/// The links of one store.
pub(crate) struct Links {
    inner: Mutex<Inner>,
    len: AtomicUsize,
    cap_bytes: usize,
}

/// Ask the CPU to load the cache line at `p` (a hint: nothing is read,
/// nothing can fault).
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it never faults and changes no memory.
    // SSE is part of the x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

fn cost(l: &Link) -> usize {
    l.key.len() + LINK_OVERHEAD_BYTES
}

impl Links {
    pub(crate) fn new(cap_bytes: usize) -> Links {
        Links { inner: Mutex::new(Inner::default()), len: AtomicUsize::new(0), cap_bytes }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether blind overwrites are on at all.
    pub(crate) fn enabled(&self) -> bool {
        self.cap_bytes != 0
    }

    /// Whether a new link for a key of `key_len` bytes fits under the cap.
    pub(crate) fn has_room(&self, key_len: usize) -> bool {
        self.enabled() && self.lock().bytes + key_len + LINK_OVERHEAD_BYTES <= self.cap_bytes
    }

    /// Links held, and their DRAM bytes.
    pub(crate) fn usage(&self) -> (u64, u64) {
        let i = self.lock();
        (i.by_old.len() as u64, i.bytes as u64)
    }

    /// Whether no link is held (one atomic load).
    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Relaxed) == 0
    }

    /// The link of head `head`, if any.
    pub(crate) fn of_head(&self, head: u64) -> Option<LinkRef> {
        if self.is_empty() {
            return None;
        }
        self.lock().by_head.get(&head).cloned()
    }

    /// The head that displaced location `old`, and its link.
    pub(crate) fn of_old(&self, old: u64) -> Option<(u64, LinkRef)> {
        if self.is_empty() {
            return None;
        }
        let link = self.lock().by_old.get(&old)?.clone();
        Some((link.head(), link))
    }

    /// Add `link` for head `head` (the caller holds the stripe and points
    /// the index at `head` after this).
    pub(crate) fn insert(&self, head: u64, link: LinkRef) {
        let mut i = self.lock();
        i.add(head, link);
        self.len.store(i.by_old.len(), Relaxed);
    }

    /// Remove the link of head `head`; returns it.
    pub(crate) fn remove(&self, head: u64) -> Option<LinkRef> {
        if self.is_empty() {
            return None;
        }
        let mut i = self.lock();
        let link = i.drop_head(head);
        self.len.store(i.by_old.len(), Relaxed);
        link
    }

    /// Remove the links of displaced locations `olds` (records known dead:
    /// whatever head each link moved to since), under one lock. The caller
    /// holds the stripes of their keys.
    pub(crate) fn forget_displaced(&self, olds: impl IntoIterator<Item = u64>) {
        if self.is_empty() {
            return;
        }
        let mut i = self.lock();
        for old in olds {
            if let Some(head) = i.by_old.get(&old).map(|l| l.head()) {
                i.drop_head(head);
            }
        }
        self.len.store(i.by_old.len(), Relaxed);
    }

    /// The links whose displaced record lies in grains `lo..hi`.
    pub(crate) fn displacing_in(&self, lo: u64, hi: u64) -> Vec<LinkRef> {
        if self.is_empty() {
            return Vec::new();
        }
        let i = self.lock();
        i.by_old.range(lo..hi).map(|(_, link)| link.clone()).collect()
    }

    /// Make `to` a second head of `from`'s link (before the index moves
    /// from one to the other); false if `from` has none.
    pub(crate) fn alias(&self, from: u64, to: u64) -> bool {
        if self.is_empty() {
            return false;
        }
        let mut i = self.lock();
        let Some(link) = i.by_head.get(&from).cloned() else { return false };
        let prev = i.by_head.insert(to, link);
        debug_assert!(prev.is_none(), "a link replaced another at head {to}");
        true
    }

    /// The index moved from `from` to `to`, its alias: `to` alone heads the
    /// link now.
    pub(crate) fn moved(&self, from: u64, to: u64) {
        let mut i = self.lock();
        if let Some(link) = i.by_head.remove(&from) {
            link.head.store(to, Relaxed);
        }
    }

    /// The index did not move: drop the alias `to`.
    pub(crate) fn unalias(&self, to: u64) {
        self.lock().by_head.remove(&to);
    }

    /// Record the displaced entry's access word, read as the index moved.
    pub(crate) fn set_aux(&self, head: u64, aux: u32) {
        if let Some(l) = self.lock().by_head.get(&head) {
            l.aux.store(aux, Relaxed);
        }
    }

    /// For each blind overwrite a batch may make, `(head, key)` (each head
    /// once: `Core::look_up_all` leaves a head two keys share out), under
    /// one lock for the whole batch: whether it may replace `head` without
    /// reading it (`Core::blind_ok`), and how. `Some(true)`: `head` heads a
    /// link of this very key, which moves on; `Some(false)`: `head` heads
    /// none, and the batch's new links so far leave room for this one;
    /// None: not blindly.
    pub(crate) fn blind_ok_all(&self, cands: &[(u64, &[u8])]) -> Vec<Option<bool>> {
        debug_assert!(
            {
                let mut heads: Vec<u64> = cands.iter().map(|c| c.0).collect();
                heads.sort_unstable();
                heads.windows(2).all(|w| w[0] != w[1])
            },
            "a head twice in one group"
        );
        let i = self.lock();
        let mut bytes = i.bytes;
        // Every head's link is found, and its key's first bytes asked for,
        // before any key is compared: the table's slot, the link and its
        // key are each a cache miss of their own in a table of many links,
        // and in separate passes one key's misses overlap the others'
        // instead of following them.
        let found: Vec<Option<&Link>> = cands.iter().map(|&(head, _)| i.by_head.get(&head).map(|l| &**l)).collect();
        for l in found.iter().flatten() {
            prefetch(l.key.as_ptr());
        }
        cands
            .iter()
            .zip(found)
            .map(|(&(_, key), l)| match l {
                Some(l) => (*l.key == *key).then_some(true),
                None if self.enabled() && bytes + key.len() + LINK_OVERHEAD_BYTES <= self.cap_bytes => {
                    bytes += key.len() + LINK_OVERHEAD_BYTES;
                    Some(false)
                }
                None => None,
            })
            .collect()
    }

    /// A batch's blind overwrites, before the index moves from each step's
    /// `from` to its `to`, under one lock: a step with a new link adds it
    /// at `to` ([`Links::insert`]); one without carries `from`'s link, if
    /// any, to `to` as a second head ([`Links::alias`]; false where there
    /// was none). The caller holds every key's stripe.
    pub(crate) fn start_blind(&self, steps: &[BlindStep]) -> Vec<bool> {
        let mut i = self.lock();
        let aliased = steps
            .iter()
            .map(|s| match &s.new {
                Some(link) => {
                    i.add(s.to, link.clone());
                    false
                }
                None => match i.by_head.get(&s.from).cloned() {
                    Some(link) => {
                        let prev = i.by_head.insert(s.to, link);
                        debug_assert!(prev.is_none(), "a link replaced another at head {}", s.to);
                        true
                    }
                    None => false,
                },
            })
            .collect();
        self.len.store(i.by_old.len(), Relaxed);
        aliased
    }

    /// After the index moved (`done[n]`) or not for each step of
    /// [`Links::start_blind`], under one lock: a new link gets the displaced
    /// entry's access word, or goes if its head was not indexed; a carried
    /// link stays at `to` alone ([`Links::moved`]), or at `from` alone
    /// ([`Links::unalias`]).
    pub(crate) fn finish_blind(&self, steps: &[BlindStep], aliased: &[bool], done: &[bool], aux: &[u32]) {
        let mut i = self.lock();
        for (n, s) in steps.iter().enumerate() {
            match (&s.new, done[n]) {
                (Some(link), true) => link.aux.store(aux[n], Relaxed),
                (Some(_), false) => {
                    i.drop_head(s.to);
                }
                (None, true) if aliased[n] => {
                    if let Some(link) = i.by_head.remove(&s.from) {
                        link.head.store(s.to, Relaxed);
                    }
                }
                (None, false) if aliased[n] => {
                    i.by_head.remove(&s.to);
                }
                (None, _) => {}
            }
        }
        self.len.store(i.by_old.len(), Relaxed);
    }

    /// Every link, for [`crate::settle::resolve_all`].
    pub(crate) fn snapshot(&self) -> Vec<(u64, LinkRef)> {
        let i = self.lock();
        i.by_old.values().map(|l| (l.head(), l.clone())).collect()
    }
}
