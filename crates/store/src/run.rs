//! Runs: many keys of one namespace written with one device IO
//! ([`Core::put_many`]) and read with as few device IOs as their records'
//! places allow ([`Core::get_many`]). A block server's request of many
//! blocks is one run instead of one engine call per block.
//!
//! A run is not atomic: each key's write or read is the one a single PUT
//! or GET would do, with the same guarantees (the key's stripe held from
//! its sequence number to its index entry; a record on the device before
//! its entry points at it; a read validated against the index after it),
//! only sharing the IOs.
//!
//! **Writes.** Every key's stripe is taken, in stripe order (so two runs,
//! or a run and a single write, never wait for each other in a circle),
//! the records are encoded one after another into one buffer and written
//! with one IO to grains allocated together, then each key's entry is
//! pointed at its record as a single unconditional PUT does (blindly where
//! the links' table allows, asked once for the whole piece as for a batch:
//! `Core::look_up_all`, `Core::commit_blind_all`). A run's records are ordinary records: a crash
//! during its IO leaves some of them whole and some torn, none of them
//! acknowledged, which recovery's torn-record rule covers as for any
//! write in flight. A run larger than [`RUN_WRITE_BYTES_MAX`] is written
//! as several such pieces, one after another.
//!
//! A piece is written through the coalescer as a group of its own
//! (`Core::write_encoded`): as soon as it is encoded, beside the other
//! writes in flight (in zoned mode in allocation order, one at a time, at
//! its zone's write pointer), and none opens a segment while an older one
//! still has a write to finish, so the writes a crash can tear lie in the
//! user stream's two newest segments, where recovery's torn-record rule
//! ignores them and its scan finds the intact records after them. What
//! serialises pieces is their keys' stripes, held from their look-ups to
//! their publishing.
//!
//! **Reads.** Each key's one index candidate is planned as a read of the
//! record's size; records lying next to each other in one segment are
//! read with one IO (at most [`RUN_READ_BYTES_MAX`]), all IOs in flight
//! together. Each record read is checked as a single read checks it
//! (stamp, size, kind, checksums, the full key) and relied on only if
//! the index still points at it afterwards. Anything else (no simple
//! candidate, another key's record, a record moved or damaged meanwhile)
//! is read by the single GET's path, which handles every case. With the
//! DRAM tier on, each key asks it first; a record a run reads from the
//! device is not offered to it: a run is a scan (a block device's
//! sequential pass reads each block once), and admitting its records would
//! spend a copy and an admission per key to push out what single GETs keep
//! hot. (Keys a run hands to the single GET's path are offered as any
//! single GET's are.)

use crate::access::Policy;
use crate::error::{Error, Result};
use crate::namespace::NsState;
use crate::read::Use;
use crate::space::{Loc, Purpose};
use crate::store::Core;
use crate::types::{ItemMeta, PutOutcome};
use crate::write::{BlindWrite, Prior, Unindexed};
use granary_format::limits::KV_SIZE_GRAINS_MAX;
use granary_format::record::{self, RecordHeader};
use granary_index::Entry;
use granary_io::AlignedBuf;
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::task::Poll;

/// Most record bytes one write IO of a run carries; a larger run is
/// written in pieces.
pub const RUN_WRITE_BYTES_MAX: u64 = 512 * 1024;

/// Most bytes one read IO of a run reads (adjacent records merged).
pub const RUN_READ_BYTES_MAX: u64 = 1024 * 1024;

/// One key of a run, resolved.
struct Key<'k> {
    key: Cow<'k, [u8]>,
    h: u64,
}

/// One IO's worth of a run of PUTs ([`Core::put_many`]): `keys` with
/// `values`, of `grains` each and `total` together.
struct Piece<'a, 'k> {
    keys: &'a [Key<'k>],
    values: &'a [&'a [u8]],
    grains: &'a [u64],
    total: u64,
    meta: ItemMeta,
    /// The namespace's counters, which count each key once its entry
    /// points at its new record (a piece failing midway counts the keys
    /// it published).
    c: &'a crate::counters::NsCounters,
}

/// Run every future at once on this task; their outputs in order.
async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    let mut left = futs.len();
    std::future::poll_fn(|cx| {
        for (f, out) in futs.iter_mut().zip(outs.iter_mut()) {
            if out.is_none() {
                if let Poll::Ready(v) = f.as_mut().poll(cx) {
                    *out = Some(v);
                    left -= 1;
                }
            }
        }
        if left == 0 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outs.into_iter().map(|o| o.expect("every future ended")).collect()
}

impl Core {
    /// Unconditional PUTs of `items` (key, value) in `ns`, sharing device
    /// writes; returns once every one is on the device (flushed in `Flush`
    /// mode). Not atomic: on an error, some of the items may be stored.
    /// Keys must be distinct (`BadBatch` otherwise, nothing written).
    pub async fn put_many(&self, ns: &NsState, items: &[(&[u8], &[u8])]) -> Result<()> {
        let mut keys = Vec::with_capacity(items.len());
        // The counters of the namespace's generation the keys are stored
        // under (a truncate meanwhile gives it new ones).
        let mut counters = None;
        for &(k, v) in items {
            let (key, c) = self.scoped(ns, k)?;
            counters.get_or_insert(c);
            ns.check_block_value(v.len())?;
            keys.push(Key { h: self.keys.hash(&key), key });
        }
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_unstable_by(|&a, &b| (keys[a].h, &keys[a].key).cmp(&(keys[b].h, &keys[b].key)));
        if order.windows(2).any(|w| keys[w[0]].key == keys[w[1]].key) {
            return Err(Error::BadBatch("a key appears twice in a run of PUTs".into()));
        }
        if ns.options.has_quota() || items.len() == 1 {
            // Quotas are checked one write at a time.
            for &(k, v) in items {
                self.put(ns, k, v).await?;
            }
            return Ok(());
        }
        let meta = self.with_default_ttl(ns, ItemMeta::default());
        let mut grains = Vec::with_capacity(items.len());
        for (k, &(_, v)) in keys.iter().zip(items) {
            grains.push(self.value_grains(&k.key, v.len() as u64, None)?);
        }
        let limit = (RUN_WRITE_BYTES_MAX / self.log.grain()).min(self.log.sb.segment_grains() - 1).max(1);
        let mut start = 0;
        while start < items.len() {
            let mut end = start + 1;
            let mut total = grains[start];
            while end < items.len() && total + grains[end] <= limit {
                total += grains[end];
                end += 1;
            }
            let values: Vec<&[u8]> = items[start..end].iter().map(|&(_, v)| v).collect();
            // A namespace dropped meanwhile takes no more pieces.
            ns.current_ref()?;
            let Some(c) = counters.as_deref() else { break };
            let piece = Piece { keys: &keys[start..end], values: &values, grains: &grains[start..end], total, meta, c };
            self.put_piece(&piece).await?;
            start = end;
        }
        Ok(())
    }

    /// One IO of [`Core::put_many`].
    async fn put_piece(&self, piece: &Piece<'_, '_>) -> Result<()> {
        let mut stripes: Vec<usize> = piece.keys.iter().map(|k| self.keys.stripe_of(k.h)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        loop {
            self.log.check_writable()?;
            let listed = crate::space::listed_bytes(piece.keys.iter().map(|k| &k.key[..]));
            let room = self.await_room(Purpose::Put, piece.total, listed).await;
            room.map_err(|e| self.log.check_writable().err().unwrap_or(e))?;
            let mut _held = Vec::with_capacity(stripes.len());
            for &i in &stripes {
                _held.push(self.keys.stripe_at(i).await);
            }
            match self.put_piece_locked(piece).await {
                Err(Error::NoSpace { .. }) => continue, // raced for the last room: wait again
                r => return r,
            }
        }
    }

    /// [`Core::put_piece`] with every key's stripe held.
    async fn put_piece_locked(&self, piece: &Piece<'_, '_>) -> Result<()> {
        let &Piece { keys, values, grains, total, meta, .. } = piece;
        // The blind overwrites decided for the whole piece in one pass over
        // the links' table, as a batch's are.
        let (looked, own_link) =
            self.look_up_all(&keys.iter().map(|k| (k.h, &k.key[..], Some(true))).collect::<Vec<_>>());
        let mut prior: Vec<Prior> = looked.into_iter().map(|p| p.expect("every key of a run is looked up")).collect();
        // New keys of a crowded fingerprint are refused before anything is
        // written, as a single write's are.
        let hashed: Vec<(u64, &[u8])> = keys.iter().map(|k| (k.h, &k.key[..])).collect();
        self.refuse_crowded(&hashed, &mut prior.iter_mut().collect::<Vec<_>>()).await?;
        let n = keys.len() as u64;
        let first = self.log.next_seq.fetch_add(n, Relaxed);
        let g = self.log.grain();
        let mut locs = Vec::with_capacity(keys.len());
        let encode = |loc: &Loc| {
            // Not zeroed: the records cover it whole, and encoding a record
            // writes each of its bytes (the padding after its value zeroed).
            let mut buf = AlignedBuf::for_read((total * g) as usize);
            let mut at = 0u64;
            for (i, ((k, &v), (&gr, p))) in keys.iter().zip(values).zip(grains.iter().zip(&prior)).enumerate() {
                // An unread prior counts as present, as for single writes.
                let supersedes = !matches!(p, Prior::Known(None)) || self.keys.dropped.contains(k.h);
                let hdr = RecordHeader::value(k.key.len(), v.len() as u64, first + i as u64, loc.stamp)
                    .with_meta(meta.flags, meta.expires)
                    .with_stale(meta.stale)
                    .with_supersedes(supersedes);
                hdr.encode(self.log.seed, &k.key, v, &mut buf[(at * g) as usize..((at + gr) * g) as usize]);
                locs.push(Loc { pba: loc.pba + at, seg: loc.seg, stamp: loc.stamp, grains: gr });
                at += gr;
            }
            buf
        };
        let listed = crate::space::listed_bytes(keys.iter().map(|k| &k.key[..]));
        // Records that may land unindexed are listed ([`Unindexed`]).
        let list = |seg: u32| self.keys.dropped.insert_all(seg, keys.iter().map(|k| k.h));
        let (held, _) = self.write_encoded(Purpose::Put, total, listed, n, encode, Some(&list)).await?;
        let mut unindexed = Unindexed::new(Some(&list));
        unindexed.hold(held);
        let published = self.publish_piece(piece, prior, &own_link, &locs, first).await;
        unindexed.end(published.is_ok());
        published
    }

    /// Point each key's entry at its record just written: the blind
    /// overwrites all at once ([`Core::commit_blind_all`]), then the others
    /// one by one; a key whose value the DRAM tier holds gets its copy
    /// refreshed once its entry moved.
    async fn publish_piece(
        &self,
        piece: &Piece<'_, '_>,
        prior: Vec<Prior>,
        own_link: &[bool],
        locs: &[Loc],
        first: u64,
    ) -> Result<()> {
        let &Piece { keys, values, meta, c, .. } = piece;
        let policy = Policy::new_item(&meta);
        let counted = |i: usize| {
            self.counters.puts.fetch_add(1, Relaxed);
            self.counters.user_bytes.fetch_add((keys[i].key.len() + values[i].len()) as u64, Relaxed);
            c.stored(PutOutcome::Stored);
        };
        let refresh = |i: usize| {
            let seq = first + i as u64;
            self.refresh_tier(&keys[i].key, keys[i].h, Some(values[i]), meta, seq, seq, locs[i]);
        };
        let tier = self.keys.tier.as_ref();
        let held: Vec<bool> = keys.iter().map(|k| tier.is_some_and(|t| t.holds(&k.key, k.h))).collect();
        let mut blind = Vec::with_capacity(keys.len());
        let mut which = Vec::with_capacity(keys.len());
        for (i, p) in prior.iter().enumerate() {
            if let &Prior::Blind(e) = p {
                let (key, h, loc) = (&keys[i].key[..], keys[i].h, locs[i]);
                blind.push(BlindWrite { key, h, e, loc, policy, own_link: own_link[i] });
                which.push(i);
            }
        }
        if !blind.is_empty() {
            self.commit_blind_all(&blind, |k| counted(which[k])).await?;
            for &i in which.iter().filter(|&&i| held[i]) {
                refresh(i);
            }
        }
        for (i, ((k, p), &l)) in keys.iter().zip(prior).zip(locs).enumerate() {
            let (key, h) = (&k.key[..], k.h);
            match p {
                Prior::Blind(_) => continue, // published above
                Prior::Known(existing) => self.commit(key, h, existing, l, false, policy).await?,
                Prior::Unread => {
                    let existing = self.find(key, h, false, false).await?;
                    self.commit(key, h, existing, l, false, policy).await?
                }
            }
            counted(i);
            if held[i] {
                refresh(i);
            }
        }
        Ok(())
    }

    /// GETs of `keys` in `ns`, sharing device reads: `each(i, value)` is
    /// called once for every key `keys[i]` that holds a value, in no
    /// particular order; keys absent, deleted or expired are not.
    pub async fn get_many(&self, ns: &NsState, keys: &[&[u8]], mut each: impl FnMut(usize, &[u8])) -> Result<()> {
        let mut resolved = Vec::with_capacity(keys.len());
        for &k in keys {
            let (key, _) = self.scoped(ns, k)?;
            resolved.push(Key { h: self.keys.hash(&key), key });
        }
        // (pba, grains, key's index, the entry) of each simple candidate.
        let mut plan: Vec<(u64, u64, usize, Entry)> = Vec::with_capacity(keys.len());
        let mut slow: Vec<usize> = Vec::new();
        let mut hits = 0u64;
        let tier = self.keys.tier.as_ref();
        for (i, k) in resolved.iter().enumerate() {
            if let Some(t) = tier {
                self.counters.gets.fetch_add(1, Relaxed);
                match self.read_hot(t, &k.key, k.h, Use::Read) {
                    Some(Some(hot)) => {
                        hits += 1;
                        each(i, &hot.value);
                        continue;
                    }
                    Some(None) => continue,
                    None => {
                        t.counters.misses.fetch_add(1, Relaxed);
                        // Counted: the device read below is not again.
                        self.counters.gets.fetch_sub(1, Relaxed);
                    }
                }
            }
            match self.keys.index.lookup(k.h).as_slice() {
                // No candidate: absent, as `find` would answer.
                [] => {
                    self.counters.gets.fetch_add(1, Relaxed);
                }
                &[e] if !e.is_tombstone() && e.kv_size() != 0 && e.kv_size() != KV_SIZE_GRAINS_MAX => {
                    plan.push((e.pba(), e.kv_size() as u64, i, e))
                }
                _ => slow.push(i),
            }
        }
        plan.sort_unstable_by_key(|p| p.0);
        // Reads: runs of adjacent records of one segment.
        let g = self.log.grain();
        let most = (RUN_READ_BYTES_MAX / g).max(1);
        let mut reads: Vec<(u64, u64, std::ops::Range<usize>)> = Vec::new();
        for (j, &(pba, grains, _, _)) in plan.iter().enumerate() {
            if let Some((start, len, r)) = reads.last_mut() {
                let same_seg = self.log.sb.segment_of(*start) == self.log.sb.segment_of(pba);
                if *start + *len == pba && same_seg && *len + grains <= most {
                    *len += grains;
                    r.end = j + 1;
                    continue;
                }
            }
            reads.push((pba, grains, j..j + 1));
        }
        let bufs = join_all(
            reads
                .iter()
                .map(|&(pba, len, _)| async move {
                    let offset = pba * g;
                    let (buf, r) = self.log.dev.read_at_async(AlignedBuf::for_read((len * g) as usize), offset).await;
                    r.map(|()| buf).map_err(|source| Error::Io { op: "read", offset, source })
                })
                .collect(),
        )
        .await;
        for ((start, _, range), buf) in reads.into_iter().zip(bufs) {
            let buf = buf?;
            for &(pba, grains, i, e) in &plan[range] {
                let from = ((pba - start) * g) as usize;
                let rec = &buf[from..from + (grains * g) as usize];
                let k = &resolved[i];
                let Some(hdr) = self.run_record_ok(e, rec, &k.key) else {
                    slow.push(i);
                    continue;
                };
                // Relied on only if still the key's entry after the read.
                if !self.keys.index.contains(k.h, pba) {
                    slow.push(i);
                    continue;
                }
                if hdr.batch {
                    // Its batch may be half visible still: read once all of it is.
                    self.keys.publishing.wait(hdr.seq).await;
                }
                self.counters.gets.fetch_add(1, Relaxed);
                let now = if hdr.expires != 0 || self.track_access { self.clock.now() } else { 0 };
                if hdr.is_tombstone() || self.log.hidden(&hdr, &k.key, now) {
                    continue;
                }
                self.counters.get_hits.fetch_add(1, Relaxed);
                hits += 1;
                if self.evict {
                    self.space.touch(self.log.sb.segment_of(pba));
                }
                if self.track_access {
                    let c = self.access_clock;
                    self.keys.index.access(k.h, pba, |w| c.bumped(w, now));
                }
                each(i, record::value_of(&hdr, rec));
            }
        }
        // The keys the plan could not serve, by the single GET's path (past
        // the tier, whose miss is counted already).
        for i in slow {
            let k = &resolved[i];
            let live = match tier {
                Some(t) => {
                    self.counters.gets.fetch_add(1, Relaxed);
                    self.read_dev_offered(t, &k.key, k.h, Use::Read).await?
                }
                None => self.read_live(&k.key, Use::Read).await?,
            };
            if let Some(live) = live {
                hits += 1;
                each(i, live.value());
            }
        }
        let (_, c) = ns.current_ref()?;
        for j in 0..keys.len() as u64 {
            c.got(j < hits);
        }
        Ok(())
    }

    /// The header of `rec`, the whole record `e` points at, if it passes
    /// every check a single read makes and holds `key`; None otherwise
    /// (the single path then reads it again and reports what it finds).
    fn run_record_ok(&self, e: Entry, rec: &[u8], key: &[u8]) -> Option<RecordHeader> {
        let seg = self.log.sb.segment_of(e.pba());
        let seg_start = self.space.pba(seg, 0);
        if e.pba() == seg_start || e.pba() + e.kv_size() as u64 > seg_start + self.log.sb.segment_grains() {
            return None;
        }
        let hdr = RecordHeader::decode(rec).ok()?;
        let ok = hdr.seg_stamp == self.space.stamp(seg)
            && hdr.is_tombstone() == e.is_tombstone()
            && hdr.grains(self.log.sb.grain_bytes) == e.kv_size() as u64
            && !hdr.damaged_copy
            && record::verify_header_crc(self.log.seed, &hdr, rec).is_ok()
            && record::key_of(&hdr, rec) == key
            && record::verify_crc(self.log.seed, &hdr, rec).is_ok();
        ok.then_some(hdr)
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::{colliding_keys, mem_store, test_device};
    use crate::{CreateOptions, Error, OpenOptions, Store};
    use granary_io::SimRng;
    use std::collections::HashMap;
    use std::sync::Arc;

    /// What `get_many` hands out, by key index; each key at most once.
    fn get_all(s: &Store, keys: &[&[u8]]) -> HashMap<usize, Vec<u8>> {
        let mut got = HashMap::new();
        s.get_many(keys, |i, v| assert!(got.insert(i, v.to_vec()).is_none(), "key {i} handed out twice")).unwrap();
        got
    }

    /// Runs of PUTs and GETs mixed with single PUTs and DELETEs read back
    /// what a model says, before and after a crash (no close), with
    /// colliding keys (several index candidates), values of many sizes
    /// (runs split in pieces) and segments small enough to fill.
    #[test]
    fn runs_read_and_write_as_single_calls_would() {
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1;
        for (segment, tier) in [(64 << 10, 0), (1 << 20, 0), (1 << 20, 1 << 20)] {
            let dev = test_device(48 << 20);
            dev.shape_zones(segment);
            let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(segment), index_table_homes: Some(64) };
            let o = OpenOptions { dram_tier_bytes: tier, ..OpenOptions::default() };
            let s = Store::create(dev.clone(), &c, &o).unwrap();
            let mut rng = SimRng::new(seed);
            let mut keys: Vec<Vec<u8>> = (0..300u32).map(|i| format!("block-{i}").into_bytes()).collect();
            keys.extend(colliding_keys(s.core.keys.hasher, 4));
            let mut model: HashMap<usize, Vec<u8>> = HashMap::new();
            for step in 0..400 {
                let what = rng.below(10);
                // A random set of distinct keys.
                let n = 1 + rng.below(80) as usize;
                let mut pick: Vec<usize> = (0..n).map(|_| rng.below(keys.len() as u64) as usize).collect();
                pick.sort_unstable();
                pick.dedup();
                match what {
                    0..=3 => {
                        let values: Vec<Vec<u8>> = pick
                            .iter()
                            .map(|_| {
                                let len = [1, 100, 4096, 4096, 9000][rng.below(5) as usize];
                                vec![(rng.below(255) + 1) as u8; len]
                            })
                            .collect();
                        let items: Vec<(&[u8], &[u8])> =
                            pick.iter().zip(&values).map(|(&k, v)| (&keys[k][..], &v[..])).collect();
                        s.put_many(&items).unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
                        for (&k, v) in pick.iter().zip(values) {
                            model.insert(k, v);
                        }
                    }
                    4 => {
                        let v = vec![rng.below(256) as u8; 500];
                        s.put(&keys[pick[0]], &v).unwrap();
                        model.insert(pick[0], v);
                    }
                    5 => {
                        s.delete(&keys[pick[0]]).unwrap();
                        model.remove(&pick[0]);
                    }
                    _ => {
                        let ks: Vec<&[u8]> = pick.iter().map(|&k| &keys[k][..]).collect();
                        let got = get_all(&s, &ks);
                        for (i, &k) in pick.iter().enumerate() {
                            assert_eq!(got.get(&i), model.get(&k), "seed {seed} step {step} key {k}");
                        }
                    }
                }
            }
            drop(s);
            let s = Store::open(dev.clone(), &o).unwrap();
            let all: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
            let got = get_all(&s, &all);
            for (k, key) in keys.iter().enumerate() {
                assert_eq!(got.get(&k), model.get(&k), "seed {seed} after reopen, key {k}");
                assert_eq!(s.get(key).unwrap().as_ref(), model.get(&k), "seed {seed} after reopen, key {k}");
            }
        }
    }

    /// Adjacent records written by one run are read back with one device
    /// read per run, and every key is found.
    #[test]
    fn a_run_written_together_is_read_with_few_ios() {
        if crate::tests::skip_zoned(
            "4 MiB segments (a 1 MiB run in one): they start at 1 MiB, which 4 MiB zones do not divide",
        ) {
            return;
        }
        let (_dev, s) = mem_store(32 << 20, 4 << 20, 512);
        let keys: Vec<[u8; 8]> = (0..256u64).map(|n| n.to_be_bytes()).collect();
        let values: Vec<Vec<u8>> = (0..256).map(|i| vec![i as u8; 4096]).collect();
        let items: Vec<(&[u8], &[u8])> = keys.iter().zip(&values).map(|(k, v)| (&k[..], &v[..])).collect();
        s.put_many(&items).unwrap();
        let before = s.stats().io.reads;
        let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        let got = get_all(&s, &refs);
        let reads = s.stats().io.reads - before;
        assert_eq!(got.len(), 256);
        for (i, v) in values.iter().enumerate() {
            assert_eq!(got[&i], *v);
        }
        // 256 records of 4.5 KiB: 1.15 MiB, in reads of at most 1 MiB.
        assert!(reads <= 4, "{reads} device reads for one run");
    }

    /// A run overwrites its keys blindly as single PUTs do (no read; one
    /// link each, which a further overwrite moves on), up to the links'
    /// cap, past which it reads the old versions; every value reads back
    /// and `verify` finds nothing wrong.
    #[test]
    fn a_run_overwrites_blindly_up_to_the_link_cap() {
        let keys: Vec<String> = (0..8).map(|i| format!("key-{i}")).collect();
        let put_all = |s: &Store, round: usize| {
            let values: Vec<String> = keys.iter().map(|k| format!("{k}-{round}")).collect();
            let items: Vec<(&[u8], &[u8])> =
                keys.iter().zip(&values).map(|(k, v)| (k.as_bytes(), v.as_bytes())).collect();
            s.put_many(&items).unwrap();
        };
        for (cap, links) in [(crate::tests::BLIND, 8), (Some(3 * (crate::LINK_OVERHEAD_BYTES + 5)), 3)] {
            let dev = test_device(16 << 20);
            let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: Some(64) };
            let o = OpenOptions { gc: false, blind_overwrite_bytes: cap, ..OpenOptions::default() };
            let s = Store::create(dev.clone(), &c, &o).unwrap();
            put_all(&s, 1);
            let reads = s.stats().io.reads;
            put_all(&s, 2);
            let st = s.stats();
            assert_eq!((st.blind_overwrites, st.unsettled_links), (links, links), "cap {cap:?}: second run");
            assert_eq!(s.stats().io.reads - reads, 8 - links, "cap {cap:?}: reads of the second run");
            let reads = s.stats().io.reads;
            put_all(&s, 3);
            let st = s.stats();
            // Every key is the one candidate of its neighbourhood: a key
            // heading its own link overwrites blindly again (the link moves).
            assert_eq!(st.unsettled_links, links, "cap {cap:?}: third run");
            assert_eq!(st.blind_overwrites, 2 * links, "cap {cap:?}: third run");
            assert_eq!(s.stats().io.reads - reads, 8 - links, "cap {cap:?}: reads of the third run");
            for k in &keys {
                assert_eq!(s.get(k.as_bytes()).unwrap(), Some(format!("{k}-3").into_bytes()), "cap {cap:?}");
            }
            assert!(s.verify().unwrap().is_clean(), "cap {cap:?}");
            drop(s);
            let s = Store::open(dev.clone(), &o).unwrap();
            for k in &keys {
                assert_eq!(s.get(k.as_bytes()).unwrap(), Some(format!("{k}-3").into_bytes()), "cap {cap:?}: reopened");
            }
        }
    }

    /// In a namespace with a quota too, whose runs are written one key at
    /// a time: the keys are checked before any is.
    #[test]
    fn a_run_with_a_key_twice_writes_nothing() {
        let (_dev, s) = mem_store(8 << 20, 1 << 20, 512);
        let r = s.put_many(&[(b"a", b"1"), (b"b", b"2"), (b"a", b"3")]);
        assert!(matches!(r, Err(Error::BadBatch(_))), "{r:?}");
        assert_eq!(s.get(b"a").unwrap(), None);
        assert_eq!(s.get(b"b").unwrap(), None);
        let q = s.create_namespace("q", crate::NamespaceOptions { max_keys: Some(100), ..Default::default() }).unwrap();
        let r = q.put_many(&[(b"a", b"1"), (b"b", b"2"), (b"a", b"3")]);
        assert!(matches!(r, Err(Error::BadBatch(_))), "with a quota: {r:?}");
        assert_eq!(q.get(b"a").unwrap(), None);
        assert_eq!(q.get(b"b").unwrap(), None);
    }

    /// Holds the first large write (a run's piece) until two segments
    /// have been opened after it, or a second has passed, and counts the
    /// segments opened (their header writes) meanwhile.
    struct HoldFirstPiece {
        segment: u64,
        state: std::sync::Mutex<(u8, u32)>, // (0 none, 1 holding, 2 released; segments opened while holding)
        cond: std::sync::Condvar,
    }

    impl HoldFirstPiece {
        fn before_write(&self, len: usize, offset: u64) {
            let mut st = self.state.lock().unwrap();
            if st.0 == 0 && len >= 32 << 10 {
                st.0 = 1;
                self.cond.notify_all();
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
                while st.1 < 2 {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    st = self.cond.wait_timeout(st, left).unwrap().0;
                }
                st.0 = 2;
            } else if st.0 == 1 && offset >= 1 << 20 && offset.is_multiple_of(self.segment) {
                st.1 += 1;
                self.cond.notify_all();
            }
        }
    }

    /// While a run's piece is being written, single writes open no
    /// segment past the next one: a crash then tears writes only in the
    /// user stream's two newest segments, where recovery forgives them
    /// (a piece written beside the coalescer's groups let them run on).
    #[test]
    fn no_segment_is_opened_past_a_run_piece_in_flight() {
        let segment = 64u64 << 10;
        let hold =
            Arc::new(HoldFirstPiece { segment, state: std::sync::Mutex::new((0, 0)), cond: std::sync::Condvar::new() });
        let h = hold.clone();
        let dev = Arc::new(crate::tests::HookedDevice {
            inner: granary_io::MemDevice::new(16 << 20),
            before_write: move |len, offset| {
                h.before_write(len, offset);
                None
            },
        });
        let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(segment), index_table_homes: Some(64) };
        let s = Arc::new(Store::create(dev.clone(), &c, &OpenOptions { gc: false, ..OpenOptions::default() }).unwrap());
        let keys: Vec<[u8; 8]> = (0..10u64).map(|n| n.to_be_bytes()).collect();
        let value = vec![7u8; 4096];
        std::thread::scope(|sc| {
            let run = sc.spawn(|| {
                let items: Vec<(&[u8], &[u8])> = keys.iter().map(|k| (&k[..], &value[..])).collect();
                s.put_many(&items)
            });
            {
                let mut st = hold.state.lock().unwrap();
                while st.0 == 0 {
                    st = hold.cond.wait_timeout(st, std::time::Duration::from_secs(10)).unwrap().0;
                    assert!(st.0 != 0 || !run.is_finished(), "the run was written without a piece of 32 KiB or more");
                }
            }
            // Enough single writes to fill three segments.
            let singles = sc.spawn(|| (0..45u32).try_for_each(|i| s.put(format!("single-{i}").as_bytes(), &value)));
            run.join().unwrap().unwrap();
            singles.join().unwrap().unwrap();
        });
        let opened = hold.state.lock().unwrap().1;
        assert!(opened <= 1, "{opened} segments opened while a run piece was in flight");
        for k in &keys {
            assert_eq!(s.get(k).unwrap().as_deref(), Some(&value[..]));
        }
    }

    /// The keys of two runs of ten, none shared (each run one piece of
    /// 45 KiB with 4 KiB values and 512-byte grains).
    fn two_runs_of_keys() -> Vec<Vec<[u8; 8]>> {
        (0..2u64).map(|r| (0..10u64).map(|n| (r * 100 + n).to_be_bytes()).collect()).collect()
    }

    /// Runs' pieces are groups of their own, written beside the writes in
    /// flight: a second run's piece reaches the device while the first's
    /// write is still held there, and both runs land.
    #[test]
    fn a_run_piece_is_written_beside_another_in_flight() {
        // (pieces of 32 KiB or more seen, the first is held, the second came while it was)
        let state = Arc::new((std::sync::Mutex::new((0u32, false, false)), std::sync::Condvar::new()));
        let st = state.clone();
        let dev = Arc::new(crate::tests::HookedDevice {
            inner: granary_io::MemDevice::new(16 << 20),
            before_write: move |len: usize, _offset: u64| {
                if len < 32 << 10 {
                    return None;
                }
                let (m, c) = &*st;
                let mut g = m.lock().unwrap();
                g.0 += 1;
                if g.0 == 1 {
                    // Hold the first piece until the second arrives (bounded:
                    // on failure the second waits for this one, for 10 s).
                    g.1 = true;
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                    while g.0 < 2 && std::time::Instant::now() < deadline {
                        g = c.wait_timeout(g, std::time::Duration::from_millis(100)).unwrap().0;
                    }
                    g.1 = false;
                } else if g.0 == 2 {
                    g.2 = g.1;
                    c.notify_all();
                }
                None
            },
        });
        let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: None };
        let s = Store::create(dev.clone(), &c, &OpenOptions { gc: false, ..OpenOptions::default() }).unwrap();
        let value = vec![7u8; 4096];
        let keys = two_runs_of_keys();
        std::thread::scope(|sc| {
            for ks in &keys {
                let (s, value) = (&s, &value);
                sc.spawn(move || {
                    let items: Vec<(&[u8], &[u8])> = ks.iter().map(|k| (&k[..], &value[..])).collect();
                    s.put_many(&items).unwrap();
                });
            }
        });
        let (pieces, _, beside) = *state.0.lock().unwrap();
        assert_eq!(pieces, 2, "each run was written with one piece");
        assert!(beside, "the second piece waited for the first one's write");
        for k in keys.iter().flatten() {
            assert_eq!(s.get(k).unwrap().as_deref(), Some(&value[..]));
        }
    }

    /// Two runs' pieces in flight at once, and a crash that tears the one
    /// allocated first after the second was written and acknowledged: the
    /// reopened store has every key of the second run (its records lie
    /// after the torn ones in the same segment), and of the first run's
    /// keys only ones holding their value (whole records of its prefix).
    #[test]
    fn a_crash_tearing_a_piece_keeps_the_piece_written_after_it() {
        // (pieces of 32 KiB or more seen, the second run returned)
        let state = Arc::new((std::sync::Mutex::new((0u32, false)), std::sync::Condvar::new()));
        let st = state.clone();
        let dev = Arc::new(crate::tests::HookedDevice {
            inner: granary_io::MemDevice::new(16 << 20),
            before_write: move |len: usize, _offset: u64| {
                let (m, c) = &*st;
                let mut g = m.lock().unwrap();
                if len < 32 << 10 {
                    return None;
                }
                g.0 += 1;
                if g.0 != 1 {
                    return None;
                }
                c.notify_all();
                // Bounded: the second run cannot get past this one, for 10 s.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while !g.1 && std::time::Instant::now() < deadline {
                    g = c.wait_timeout(g, std::time::Duration::from_millis(100)).unwrap().0;
                }
                // Half of it and a little more: five whole records of
                // 4.5 KiB and the head of the sixth.
                Some((len / 2 + 1024) / 512 * 512)
            },
        });
        let c = CreateOptions { grain_bytes: Some(512), segment_bytes: Some(1 << 20), index_table_homes: None };
        let o =
            OpenOptions { gc: false, checkpoint_on_close: false, checkpoint_interval: None, ..OpenOptions::default() };
        let s = Store::create(dev.clone(), &c, &o).unwrap();
        let runs = two_runs_of_keys();
        let values = [vec![1u8; 4096], vec![2u8; 4096]];
        let items = |r: usize| -> Vec<(&[u8], &[u8])> { runs[r].iter().map(|k| (&k[..], &values[r][..])).collect() };
        std::thread::scope(|sc| {
            let first = sc.spawn(|| s.put_many(&items(0)));
            {
                let (m, c) = &*state;
                let mut g = m.lock().unwrap();
                while g.0 == 0 {
                    g = c.wait_timeout(g, std::time::Duration::from_secs(10)).unwrap().0;
                    assert!(g.0 != 0 || !first.is_finished(), "the first run was written without a piece of 32 KiB");
                }
            }
            s.put_many(&items(1)).expect("the second run, written beside the first");
            let (m, c) = &*state;
            m.lock().unwrap().1 = true;
            c.notify_all();
            assert!(first.join().unwrap().is_err(), "the torn run was acknowledged");
        });
        drop(s); // the crash
        let s = Store::open(dev.clone(), &o).unwrap();
        assert!(s.stats().recovery.torn_records >= 1, "{:?}", s.stats().recovery);
        for k in &runs[1] {
            assert_eq!(s.get(k).unwrap().as_deref(), Some(&values[1][..]), "a key of the acknowledged run");
        }
        for k in &runs[0] {
            let v = s.get(k).unwrap();
            assert!(v.is_none() || v.as_deref() == Some(&values[0][..]), "a key of the torn run: {v:?}");
        }
        assert!(s.verify().unwrap().is_clean());
        // Writes resume after the records found; all of it survives another reopen.
        s.put(b"after", b"the crash").unwrap();
        drop(s);
        let s = Store::open(dev.clone(), &o).unwrap();
        assert_eq!(s.get(b"after").unwrap().as_deref(), Some(&b"the crash"[..]));
        for k in &runs[1] {
            assert_eq!(s.get(k).unwrap().as_deref(), Some(&values[1][..]));
        }
    }
}
