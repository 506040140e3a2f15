//! Blind overwrites: index entries an unconditional PUT displaced without
//! reading them, kept in DRAM until they are known dead or restored.
//!
//! **Why.** The index keeps fingerprints, not keys (uDepot §4.2), so an
//! overwrite must tell the key's current version from another key that
//! shares its fingerprint: uDepot reads the candidate's record first (§4.5).
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
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

/// DRAM a link costs besides its key: a hash-map slot (head to link, with
/// its control byte and spare capacity), a B-tree slot (displaced location
/// to head, with node slack), the shared link, and the allocator's
/// overhead on the link's and the key's blocks. Measured by
/// `tests/link_memory.rs` at 142-153 bytes with 24-byte keys (glibc),
/// rounded up.
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
}

/// A link as the map holds it: shared, so that a lookup copies no key.
pub(crate) type LinkRef = Arc<Link>;

#[derive(Default)]
struct Inner {
    /// Head location to its link.
    by_head: HashMap<u64, LinkRef>,
    /// Displaced location to its head, in location order (GC asks for
    /// the links into one segment).
    by_old: BTreeMap<u64, u64>,
    bytes: usize,
}

/// The links of one store.
pub(crate) struct Links {
    inner: Mutex<Inner>,
    len: AtomicUsize,
    cap_bytes: usize,
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
        let i = self.lock();
        let head = *i.by_old.get(&old)?;
        Some((head, i.by_head[&head].clone()))
    }

    /// Add `link` for head `head` (the caller holds the stripe and points
    /// the index at `head` after this).
    pub(crate) fn insert(&self, head: u64, link: LinkRef) {
        let mut i = self.lock();
        i.bytes += cost(&link);
        i.by_old.insert(link.old.pba(), head);
        if let Some(prev) = i.by_head.insert(head, link) {
            // A location is reused only after GC freed its segment, which
            // removed or moved every link of a head in it.
            i.bytes -= cost(&prev);
            debug_assert!(false, "a link replaced another at head {head}");
        }
        self.len.store(i.by_old.len(), Relaxed);
    }

    /// Remove the link of head `head`; returns it.
    pub(crate) fn remove(&self, head: u64) -> Option<LinkRef> {
        if self.is_empty() {
            return None;
        }
        let mut i = self.lock();
        let link = i.by_head.remove(&head)?;
        // Not an alias in the middle of a move (`carry`): the link goes.
        if i.by_old.get(&link.old.pba()) == Some(&head) {
            i.by_old.remove(&link.old.pba());
            i.bytes -= cost(&link);
        }
        self.len.store(i.by_old.len(), Relaxed);
        Some(link)
    }

    /// The links whose displaced record lies in grains `lo..hi`.
    pub(crate) fn displacing_in(&self, lo: u64, hi: u64) -> Vec<LinkRef> {
        if self.is_empty() {
            return Vec::new();
        }
        let i = self.lock();
        i.by_old.range(lo..hi).map(|(_, head)| i.by_head[head].clone()).collect()
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
            i.by_old.insert(link.old.pba(), to);
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

    /// Every link, for [`crate::settle::resolve_all`].
    pub(crate) fn snapshot(&self) -> Vec<(u64, LinkRef)> {
        let i = self.lock();
        i.by_old.values().map(|h| (*h, i.by_head[h].clone())).collect()
    }
}
