//! Settling the links of blind overwrites ([`crate::links`]): reading a
//! displaced record and deciding whether it is dead (its key is the head's:
//! the link goes) or another key's (indexed again first, then the link
//! goes). GC settles the links it meets, writers and readers settle the
//! ones on their key's path, checkpoints and `verify` settle them all
//! ([`resolve_all`]).
//!
//! Invariant: whoever settles a link holds the stripe of the displaced
//! key, which is the head's key's stripe too (see [`crate::keys`]).

use crate::counters::Counted;
use crate::error::{Error, Result};
use crate::links::Link;
use crate::parts::Parts;
use granary_format::record;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

/// Settle one link whose displaced record was read: same key as the head,
/// it is dead and the link goes; another key, that key is indexed again
/// first (its bytes live again) and then the link goes. The caller holds
/// the stripe of `h` (the displaced key's hash; the head's stripe too).
/// Returns whether the displaced record is live.
pub(crate) fn settle(p: Parts<'_>, head: u64, link: &Link, displaced_key: &[u8], h: u64) -> Result<bool> {
    if *displaced_key == *link.key {
        p.keys.links.remove(head);
        return Ok(false);
    }
    let e = link.old;
    let grains = e.kv_size() as u64;
    p.keys
        .index
        .insert_with(h, grains, e.pba(), link.aux.load(Relaxed))
        .map_err(|err| p.log.poison(Error::IndexFull(err)))?;
    p.keys.watch.changed(p.log.sb.segment_of(e.pba()));
    p.space.add_live(p.log.sb.segment_of(e.pba()), grains * p.log.grain());
    // The blind overwrite counted the head as replacing this record; it
    // was another key's, so the head's key is one more value (of this
    // record's size, the rest was counted then), and this key is
    // unchanged.
    p.counters.added(&link.key, Counted::new(false, grains * p.log.grain()));
    p.keys.links.remove(head);
    Ok(true)
}

/// Move the link of head `from` to head `to`, around the index change
/// `replace` (which must succeed: the caller holds the stripe): the link is
/// at both heads while the index changes.
pub(crate) fn carry(p: Parts<'_>, from: u64, to: u64, replace: impl FnOnce() -> bool) -> bool {
    if !p.keys.links.alias(from, to) {
        return replace();
    }
    let done = replace();
    if done {
        p.keys.links.moved(from, to);
    } else {
        p.keys.links.unalias(to);
    }
    done
}

/// What [`resolve_all`] found.
#[derive(Debug, Default)]
pub(crate) struct Resolved {
    /// Displaced records that were another key's, indexed again.
    pub live: u64,
    /// Links left in place because their displaced record could not be
    /// read (a corrupt header): what was wrong with each; `verify` reports
    /// them.
    pub unreadable: Vec<String>,
    /// Those links' displaced records (their block addresses): a
    /// checkpoint replays their segments instead of writing them as items
    /// (an item a recovery must read to compare fails the open; a replay
    /// skips the record as a log scan does).
    pub unreadable_at: Vec<u64>,
}

/// Resolve every link by reading its displaced record's key (checkpoints
/// and `verify`, off any executor). Links added meanwhile are left alone.
pub(crate) fn resolve_all(p: Parts<'_>) -> Result<Resolved> {
    let links = p.keys.links.snapshot();
    if links.is_empty() {
        return Ok(Resolved::default());
    }
    let started = std::time::Instant::now();
    let live = AtomicUsize::new(0);
    let next = AtomicUsize::new(0);
    let first_err = Mutex::new(None);
    let unreadable = Mutex::new((Vec::new(), Vec::new()));
    // Reads are independent: several threads keep the device busy.
    let threads = p.threads(RESOLVE_THREADS).min(links.len());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let n = next.fetch_add(1, Relaxed);
                let Some((_, link)) = links.get(n) else { return };
                match resolve_one(p, link) {
                    Ok(true) => {
                        live.fetch_add(1, Relaxed);
                    }
                    Ok(false) => {}
                    Err(e @ Error::Corruption { .. }) => {
                        tracing::warn!(error = %e, "the record a blind overwrite displaced cannot be read; its link stays");
                        let mut u = unreadable.lock().unwrap_or_else(|e| e.into_inner());
                        u.0.push(e.to_string());
                        u.1.push(link.old.pba());
                    }
                    Err(e) => {
                        first_err.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = first_err.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let live = live.into_inner() as u64;
    tracing::debug!(
        links = links.len(),
        live,
        millis = started.elapsed().as_millis() as u64,
        "blind overwrites resolved"
    );
    let (unreadable, unreadable_at) = unreadable.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok(Resolved { live, unreadable, unreadable_at })
}

/// Threads [`resolve_all`] reads with.
const RESOLVE_THREADS: usize = 16;

pub(crate) fn resolve_one(p: Parts<'_>, link: &Link) -> Result<bool> {
    // Read first, off the stripe, so writers of the key do not wait for
    // the IO; a failed read is tried again under the stripe (the link may
    // have been settled, and its segment reused, meanwhile).
    let early = p.read_record(link.old, false).ok();
    // The head's stripe is the displaced key's too (see the module doc).
    let _stripe = p.keys.lock_key(p.keys.hash(&link.key));
    // The link now: GC may have settled it, or moved its head meanwhile.
    let Some((now_head, now)) = p.keys.links.of_old(link.old.pba()) else { return Ok(false) };
    // What was read is still the record there if its segment was not
    // reused since (a reuse changes the segment's stamp).
    let seg = p.log.sb.segment_of(now.old.pba());
    let (hdr, buf) = match early {
        Some((hdr, buf)) if now.old == link.old && hdr.seg_stamp == p.space.stamp(seg) => (hdr, buf),
        _ => p.read_record(now.old, false)?,
    };
    let key = record::key_of(&hdr, &buf);
    settle(p, now_head, &now, key, p.keys.hash(key))
}
