//! The consistency check behind `granary verify`.
//!
//! Checks, in order: every index entry reads back a record whose checksums,
//! stamp and size hold and whose key hashes to the entry's position and tag;
//! the key and tombstone counts and per-segment live bytes agree with the
//! index; every record in every used segment is intact (a record whose
//! header holds but whose body does not is damaged data, whether or not it
//! is still current); every segment summary that decodes names each
//! record the scan finds there, at its grain, with its key (it may list
//! more: a record a power loss took after the summary was written). A
//! summary that does not decode (torn by a crash, or damaged) is counted,
//! not an error: nothing trusts it (GC reads that segment's records).
//! Nor is a superblock copy behind the other or failing its checksum
//! (listed: the next open for writing rewrites it). A segment header of
//! this store that fails its checksum is an error: no crash tears one (it
//! fits one sector), and the store takes its segment for free. So is the
//! newest checkpoint's body failing its checks (it is written and flushed
//! before its manifest, so no crash leaves one): opens skip it; on a zoned
//! device, where the manifest goes first, it is listed, not an error.

use crate::error::Result;
use crate::log::{read_segment_headers, SegmentScanner};
use crate::options::ProgressHook;
use crate::parts::Parts;
use granary_format::hash::key_tag;
use granary_format::record;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// Errors listed in a report at most; the count goes on.
const VERIFY_ERRORS_LISTED_MAX: usize = 100;

#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    pub entries_checked: u64,
    pub values: u64,
    pub tombstones: u64,
    pub segments_scanned: u64,
    pub records_scanned: u64,
    pub damaged_records: u64,
    /// Records torn by a crash that recovery left in place (opened with
    /// `OpenOptions::clear_torn` off): never acknowledged, ignored, not
    /// errors.
    pub torn_records: u64,
    pub skipped_grains: u64,
    /// Segments with a summary, checked against their records.
    pub summaries: u64,
    /// Segments whose summary starts where their records end but does not
    /// decode (a crash tore its write, or its bytes were damaged): unused,
    /// so not an error.
    pub summaries_unusable: u64,
    /// Superblock copies that an open for writing would rewrite from the
    /// one in use (docs/FORMAT.md, "Superblock"), one line each: a copy a
    /// crash left behind, or one failing its checksum or magic. Not errors:
    /// the store reads the other.
    pub superblock_copies_to_mend: Vec<String>,
    /// The newest checkpoint failing its checks where that is no sign of
    /// damage: on a zoned device (its manifest is written before its body,
    /// so a crash leaves one), or a body segment no longer its own. Opens
    /// skip it. A body failing its checks elsewhere is an error.
    pub checkpoint_unusable: Option<String>,
    pub error_count: u64,
    /// The first errors, one line each.
    pub errors: Vec<String>,
    pub millis: u64,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.error_count == 0
    }

    fn error(&mut self, msg: String) {
        self.error_count += 1;
        if self.errors.len() < VERIFY_ERRORS_LISTED_MAX {
            self.errors.push(msg);
        }
    }
}

/// Check the summary of segment `seg` (stamp `stamp`), where a scan met
/// it, against the records the scan `found` (grain, key).
fn check_summary(p: Parts<'_>, seg: u32, stamp: u32, found: &[(u64, Vec<u8>)], r: &mut VerifyReport) {
    let Some((region, block)) = p.log.read_summary(seg, stamp) else {
        r.summaries_unusable += 1;
        return;
    };
    let entries = match granary_format::summary::decode(p.log.seed, &block, &region) {
        Ok(e) => e,
        Err(e) => {
            tracing::info!(segment = seg, error = %e, "verify: a segment summary does not decode (unused)");
            r.summaries_unusable += 1;
            return;
        }
    };
    r.summaries += 1;
    for (grain, key) in found {
        match entries.binary_search_by_key(grain, |e| e.grain as u64) {
            Ok(i) if entries[i].key == &key[..] => {}
            Ok(_) => r.error(format!("segment {seg}: the summary names the record at grain {grain} by another key")),
            Err(_) => r.error(format!("segment {seg}: the summary leaves out the record at grain {grain}")),
        }
    }
}

/// Check the store; `progress` is called with (steps done, steps) where a
/// step is an index entry read or a segment scanned.
pub(crate) fn verify(
    p: Parts<'_>,
    checkpoints: &crate::checkpoint::Checkpoints,
    progress: Option<&ProgressHook>,
) -> Result<VerifyReport> {
    let started = Instant::now();
    let mut r = VerifyReport::default();
    let g = p.log.sb.grain_bytes;
    r.superblock_copies_to_mend = p
        .space
        .with_superblock_now(|sb| crate::Store::superblock_copies_to_mend(p.log.dev.as_ref(), sb))
        .into_iter()
        .map(|(offset, why)| format!("superblock copy at offset {offset}: {why}"))
        .collect();

    // Entries displaced by blind overwrites are settled first, so that the
    // index alone holds every live version.
    for e in crate::settle::resolve_all(p)?.unreadable {
        r.error(format!("a record displaced by a blind overwrite cannot be read: {e}"));
    }
    let mut entries = Vec::new();
    p.keys.index.for_each(|home, e| entries.push((home, e)));
    let (headers, newest) = {
        // No checkpoint is written meanwhile: a newer one frees the
        // newest's segments, which writes may then reuse under the read.
        let _held = checkpoints.lock();
        let headers = read_segment_headers(p.log.dev.as_ref(), &p.log.sb)?;
        let newest = crate::checkpoint::check_newest(p.log.dev.as_ref(), &p.log.sb, &headers);
        (headers, newest)
    };
    for (seg, why) in &headers.damaged {
        r.error(format!(
            "segment {seg}: its header fails its checksum ({why}): damaged; the store takes the segment \
             for free, so records in it are not indexed and are written over when it is reused"
        ));
    }
    let steps = (entries.len() + headers.kv.len()) as u64;
    let report = |done: u64| {
        if let Some(p) = progress {
            (p.0)(done, steps);
        }
    };
    // Read the records in device order.
    entries.sort_unstable_by_key(|(_, e)| e.pba());
    let mut live: HashMap<u32, u64> = HashMap::new();
    let mut last_log = Instant::now();
    for (i, (home, e)) in entries.iter().enumerate() {
        r.entries_checked += 1;
        match p.read_record(*e, true) {
            Ok((hdr, buf)) => {
                let h = p.keys.hash(record::key_of(&hdr, &buf));
                if p.keys.index.home(h) != *home || key_tag(h) != e.key_tag() {
                    r.error(format!("index entry {e:?} sits at home {home} but its key hashes elsewhere"));
                }
                if hdr.seq >= p.log.next_seq.load(Relaxed) {
                    r.error(format!("record at grain {} has sequence number {} beyond the store's", e.pba(), hdr.seq));
                }
                if hdr.is_tombstone() {
                    r.tombstones += 1;
                } else {
                    r.values += 1;
                }
                *live.entry(p.log.sb.segment_of(e.pba())).or_default() += hdr.grains(g) * g as u64;
            }
            Err(err) => r.error(format!("index entry {e:?}: {err}")),
        }
        if last_log.elapsed().as_secs() >= 2 {
            tracing::info!(checked = i + 1, entries = entries.len(), "verify: index entries");
            last_log = Instant::now();
        }
        if i % 1024 == 1023 {
            report(i as u64 + 1);
        }
    }
    report(entries.len() as u64);
    if r.error_count == 0 {
        let (keys, tombs) = (p.counters.keys.load(Relaxed), p.counters.tombstones.load(Relaxed));
        if (keys, tombs) != (r.values, r.tombstones) {
            r.error(format!(
                "counters say {keys} keys and {tombs} tombstones; the index holds {} and {}",
                r.values, r.tombstones
            ));
        }
        for seg in p.space.used_segments() {
            let want = live.get(&seg).copied().unwrap_or(0);
            let have = p.space.live_of(seg);
            if want != have {
                r.error(format!("segment {seg}: live bytes accounted {have}, index says {want}"));
            }
        }
    }

    if let Some(c) = newest {
        if c.damage && !p.space.zoned() {
            r.error(format!(
                "the newest checkpoint is damaged ({}): opens skip it and read an older checkpoint or scan \
                 the log (no data is lost by it)",
                c.why
            ));
        } else {
            // Zoned checkpoints write their manifest before their body: a
            // crash leaves a newest one whose body does not check out.
            r.checkpoint_unusable = Some(format!("checkpoint {}: {}", c.id, c.why));
        }
    }
    let segments = headers.kv;
    for (i, (s, _)) in segments.into_iter().enumerate() {
        let mut scan = SegmentScanner::new(p.log.dev.as_ref(), &p.log.sb, p.log.seed, s.seg, s.alloc_seq as u32);
        let mut found: Vec<(u64, Vec<u8>)> = Vec::new();
        while let Some(rec) = scan.next_record()? {
            r.records_scanned += 1;
            found.push((rec.grain, record::key_of(&rec.hdr, scan.bytes_at(rec.grain)).to_vec()));
            if !rec.intact && p.space.is_kept_torn(s.seg, rec.grain) {
                r.torn_records += 1;
            } else if !rec.intact || rec.hdr.damaged_copy {
                r.damaged_records += 1;
                r.error(format!(
                    "damaged record in segment {} at grain {} (seq {}): body checksum mismatch \
                     (bit rot, or a write torn by a power loss)",
                    s.seg, rec.grain, rec.hdr.seq
                ));
            }
        }
        if scan.summary_at.is_some() {
            check_summary(p, s.seg, s.alloc_seq as u32, &found, &mut r);
        }
        r.segments_scanned += 1;
        r.skipped_grains += scan.skipped_grains;
        report((entries.len() + i + 1) as u64);
        if last_log.elapsed().as_secs() >= 2 {
            tracing::info!(scanned = i + 1, records = r.records_scanned, "verify: segments");
            last_log = Instant::now();
        }
    }
    r.millis = started.elapsed().as_millis() as u64;
    Ok(r)
}
