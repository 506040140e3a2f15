//! Key scans: the keys of one namespace a page at a time (Redis SCAN and
//! KEYS), and a key found from a chosen place (RANDOMKEY).
//!
//! **Cursor.** A position in home-slot space: the first home slot the next
//! page walks, as a plain `u64` (0: the first page; a page that walks the
//! last home returns 0, the end; one past the last home or beyond is no
//! page: empty, cursor 0). A key's home slot depends only on its hash and
//! the store's home slots per table, fixed when the store is created, so
//! nothing the engine does moves a key to another home: GC rewrites an
//! index entry in place, a grow doubles the tables and moves entries
//! between tables (by tag bits) and within a home's neighbourhood, a blind
//! overwrite displaces an entry behind a head of the same home and key tag
//! ([`crate::links`]), and a settled link puts it back at that home. Each
//! home is walked by exactly one page of a full scan.
//!
//! **A page** walks ranges of homes from the cursor, each sized to hold
//! about `count` entries at the index's load (entries per home), while it
//! has found fewer than `count` keys and walked fewer than
//! [`EXAMINED_PER_KEY`] entries per key asked for (so a namespace with a
//! small share of the store's keys still gets pages of about `count` keys,
//! at a bounded cost). For each range:
//! 1. [`Index::for_each_homed`](granary_index::Index::for_each_homed) gives
//!    the fingerprint (home, key tag) of every entry homed there, each home
//!    read whole at one instant. At every instant a key present has an
//!    entry of its fingerprint, or is displaced by one (the link's head), so
//!    its fingerprint is among them.
//! 2. Each fingerprint's keys: its candidates (what a lookup of a key of
//!    that fingerprint gets), the key of each one's record and of the record
//!    its link displaced; read without locks and then validated as
//!    `Core::find` validates a miss (the same candidates, with the same
//!    links, after the reads; else read again). A key of the fingerprint
//!    present throughout is among them.
//! 3. Keys of other namespaces (another id, a dropped or truncated
//!    generation) and the engine's own reserved keys are left out; each
//!    remaining key is looked up as a GET looks it up, and kept only if its
//!    current version is a value that has not expired (nor been flushed).
//!
//! **Guarantees** (Redis's, and a little more): a key present for the
//! whole of a full scan is returned; a key returned was live when checked,
//! so a key never present is never returned; a key comes at most once in a
//! page, and at most once in a full scan (it has one home, walked once;
//! its fingerprint's keys are deduplicated). Keys written or deleted
//! during the scan may come or not. A page takes no stripe: checking a key
//! is one lookup, as a GET is.

use crate::error::{Error, Result};
use crate::namespace::NsState;
use crate::nskey::{owner, user_key, Owner};
use crate::store::Core;
use crate::types::ScanPage;
use granary_format::record;
use granary_index::Entry;
use std::collections::HashSet;

/// A page walks more homes while it has walked fewer than this many
/// entries per key asked for (and found fewer keys than asked for).
pub(crate) const EXAMINED_PER_KEY: usize = 8;

/// A seed spread over all 64 bits (the SplitMix64 finisher), so nearby
/// seeds pick far-apart homes.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Core {
    /// A page of `ns`'s keys from `cursor` (0: the first page); about
    /// `count` keys (at least one asked for). The page's cursor continues
    /// the scan; 0 when it is complete.
    pub async fn scan(&self, ns: &NsState, cursor: u64, count: usize) -> Result<ScanPage> {
        let homes = self.homes();
        if cursor >= homes as u64 {
            return Ok(ScanPage { keys: Vec::new(), cursor: 0 });
        }
        let (keys, next) = self.scan_homes(ns, cursor as usize, homes, count).await?;
        let cursor = if next >= homes { 0 } else { next as u64 };
        Ok(ScanPage { keys, cursor })
    }

    /// A live key of `ns`: the first page with one, walking from a home
    /// picked by `seed` to the last and then from the first back to it
    /// (one of that page's keys, picked by `seed`); None if `ns` has none.
    pub async fn random_key(&self, ns: &NsState, seed: u64) -> Result<Option<Vec<u8>>> {
        let homes = self.homes();
        let mixed = mix(seed);
        let start = (mixed % homes as u64) as usize;
        for (from, to) in [(start, homes), (0, start)] {
            let mut at = from;
            while at < to {
                let (mut keys, next) = self.scan_homes(ns, at, to, 1).await?;
                if !keys.is_empty() {
                    let pick = (mix(mixed) % keys.len() as u64) as usize;
                    return Ok(Some(keys.swap_remove(pick)));
                }
                at = next;
            }
        }
        Ok(None)
    }

    /// Home slots per index table (fixed for the store's life).
    fn homes(&self) -> usize {
        self.keys.index.config().table_homes as usize
    }

    /// The live keys of `ns` homed from `from` on (below `to`), ranges of
    /// homes walked while fewer than `count` were found (see the module's
    /// "A page"); the keys, and the first home not walked.
    async fn scan_homes(&self, ns: &NsState, from: usize, to: usize, count: usize) -> Result<(Vec<Vec<u8>>, usize)> {
        let (id, _) = ns.current_ref()?;
        let count = count.max(1);
        let homes = self.homes() as u128;
        let entries = self.keys.index.entries().max(1) as u128;
        let span = (count as u128 * homes).div_ceil(entries).clamp(1, homes) as usize;
        let budget = count.saturating_mul(EXAMINED_PER_KEY);
        let (mut keys, mut examined, mut at) = (Vec::new(), 0usize, from);
        while at < to && keys.len() < count && examined < budget {
            let hi = at.saturating_add(span).min(to);
            let mut fingerprints = Vec::new();
            let mut seen = HashSet::new();
            self.keys.index.for_each_homed(at..hi, |home, e| {
                examined += 1;
                if seen.insert((home, e.key_tag())) {
                    fingerprints.push((home, e.key_tag()));
                }
            });
            for (home, key_tag) in fingerprints {
                let now = self.clock.now();
                for stored in self.keys_of(self.keys.index.hash_for(home, key_tag)).await? {
                    if owner(&stored) == Owner::Ns(id) && self.is_live_key(&stored, now).await? {
                        keys.push(user_key(id, &stored).to_vec());
                    }
                }
            }
            at = hi;
        }
        Ok((keys, at))
    }

    /// The distinct keys of the records fingerprint `h` leads to: its
    /// candidates' and those their links displaced (a tombstone's own key
    /// has no value; its link is followed all the same). Read with no lock
    /// and validated like `Core::find`'s miss: if the candidates or their
    /// links changed meanwhile (GC moved a record, a writer replaced one, a
    /// link was settled), read again. A record unreadable though still
    /// indexed is corruption: logged and left out, as `find` leaves out an
    /// unreadable candidate.
    async fn keys_of(&self, h: u64) -> Result<Vec<Vec<u8>>> {
        loop {
            let cands = self.keys.index.lookup(h);
            let mut keys = Vec::new();
            let mut links = Vec::with_capacity(cands.as_slice().len());
            let mut unreadable = None;
            for &e in cands.as_slice() {
                if !e.is_tombstone() {
                    self.read_key(e, &mut keys, &mut unreadable).await?;
                }
                let link = self.keys.links.of_head(e.pba());
                links.push(link.as_ref().map(|l| l.old.pba()));
                if let Some(l) = link {
                    self.read_key(l.old, &mut keys, &mut unreadable).await?;
                }
            }
            let same_links = cands
                .as_slice()
                .iter()
                .zip(&links)
                .all(|(e, old)| self.keys.links.of_head(e.pba()).map(|l| l.old.pba()) == *old);
            if !(same_links && self.same_candidates(h, cands.as_slice())) {
                continue;
            }
            if let Some(e) = unreadable {
                tracing::warn!(error = %e, "a key scan left out an unreadable index candidate");
            }
            keys.sort_unstable();
            keys.dedup();
            return Ok(keys);
        }
    }

    /// Add the key of the record `e` points at to `keys`; a corrupt record
    /// goes to `unreadable` instead.
    async fn read_key(&self, e: Entry, keys: &mut Vec<Vec<u8>>, unreadable: &mut Option<Error>) -> Result<()> {
        match self.log.read_record_async(&self.space, e, false).await {
            Ok((hdr, buf)) => keys.push(record::key_of(&hdr, &buf).to_vec()),
            Err(e @ Error::Corruption { .. }) => *unreadable = Some(e),
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Whether stored key `key`'s current version is a live value at
    /// `now`, looked up as a GET looks it up (a version of a batch still
    /// being published waited for, as a GET waits).
    async fn is_live_key(&self, key: &[u8], now: u32) -> Result<bool> {
        let Some(f) = self.find(key, self.keys.hash(key), false, false).await? else { return Ok(false) };
        if f.hdr.batch {
            self.keys.publishing.wait(f.hdr.seq).await;
        }
        Ok(self.is_live(&f, now))
    }
}
