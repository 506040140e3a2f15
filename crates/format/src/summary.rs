//! Segment summaries: the key of every record of a KV segment, kept in the
//! segment's last grains, so GC can tell which key a record holds without
//! reading the record (it needs that for every record a blind overwrite
//! displaced: the same key means the record is dead).
//!
//! A summary is a hint written once a segment is full and every write to
//! it has completed; a segment may have none (the writer gave up on it, a
//! crash came first, an older build or zoned mode wrote it) and readers
//! then read the records themselves. What a summary says is exact: it is
//! built from the records as they were written into this use of the
//! segment, and it is accepted only with this use's stamp and its
//! checksums holding.
//!
//! Layout: the *region* is the last `region_grains` grains of the segment.
//!
//! ```text
//! region offset      size  field
//! 0                    40  block (below)
//! 40        entries_bytes  entries, in increasing grain order
//! ...                      zeros
//! region_len - 40      40  the same block again (the segment's last bytes)
//! ```
//!
//! Block (little-endian): magic `GSUM` u32, version u16 (1), flags u16
//! (0), stamp u32 (the segment's), count u32 (entries), region_grains u32,
//! records_end u32 (the grain where the segment's records end: every
//! record starts below it), entries_bytes u32, entries_crc u32
//! (`crc32c(seed, entries)`), reserved u32 (0), block_crc u32
//! (`crc32c(seed, block[0..36])`); `seed` is the record seed.
//! Entry: grain u32 (the record's first grain, counted from the segment's
//! start, at least 1), key_len u16 (1..=65535), the key.
//!
//! The leading block lets a scan of the segment stop where the records end
//! (nothing after it is a record); the trailing one lets GC find the
//! summary by reading the segment's last grain.

use crate::bytes::*;
use crate::checksum::crc32c_append;
use crate::error::FormatError;

/// "GSUM" as a little-endian u32.
pub const SUMMARY_MAGIC: u32 = u32::from_le_bytes(*b"GSUM");
pub const SUMMARY_VERSION: u16 = 1;
/// Bytes of a summary block.
pub const SUMMARY_BLOCK_BYTES: usize = 40;
/// Bytes an entry takes besides its key.
pub const SUMMARY_ENTRY_OVERHEAD: u64 = 6;
/// A summary takes at most 1/N of its segment; a segment whose records'
/// keys would need more gets none.
pub const SUMMARY_SHARE: u64 = 64;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = OFF_MAGIC + 4;
const OFF_FLAGS: usize = OFF_VERSION + 2;
const OFF_STAMP: usize = OFF_FLAGS + 2;
const OFF_COUNT: usize = OFF_STAMP + 4;
const OFF_REGION: usize = OFF_COUNT + 4;
const OFF_RECORDS_END: usize = OFF_REGION + 4;
const OFF_ENTRIES_BYTES: usize = OFF_RECORDS_END + 4;
const OFF_ENTRIES_CRC: usize = OFF_ENTRIES_BYTES + 4;
const OFF_RESERVED: usize = OFF_ENTRIES_CRC + 4;
const OFF_BLOCK_CRC: usize = OFF_RESERVED + 4;
const _: () = assert!(OFF_BLOCK_CRC + 4 == SUMMARY_BLOCK_BYTES);

const W: &str = "segment summary";

/// Bytes the entry of a record with a key of `key_len` bytes takes, or
/// None if such a key cannot be listed (longer than 65535 bytes).
pub fn entry_bytes(key_len: usize) -> Option<u64> {
    (1..=u16::MAX as usize).contains(&key_len).then_some(SUMMARY_ENTRY_OVERHEAD + key_len as u64)
}

/// Grains of a region holding `entries_bytes` of entries (saturating: a
/// caller counts a key no summary can list as `u64::MAX` bytes).
pub fn region_grains(entries_bytes: u64, grain_bytes: u32) -> u64 {
    (2 * SUMMARY_BLOCK_BYTES as u64).saturating_add(entries_bytes).div_ceil(grain_bytes as u64)
}

/// The largest region a segment of `segment_bytes` may have, in grains.
pub fn region_grains_max(segment_bytes: u64, grain_bytes: u32) -> u64 {
    segment_bytes / SUMMARY_SHARE / grain_bytes as u64
}

/// A summary block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub stamp: u32,
    pub count: u32,
    pub region_grains: u32,
    pub records_end: u32,
    pub entries_bytes: u32,
    pub entries_crc: u32,
}

impl Block {
    fn encode(&self, seed: u32, out: &mut [u8]) {
        let b = &mut out[..SUMMARY_BLOCK_BYTES];
        b.fill(0);
        put_u32(b, OFF_MAGIC, SUMMARY_MAGIC);
        put_u16(b, OFF_VERSION, SUMMARY_VERSION);
        put_u32(b, OFF_STAMP, self.stamp);
        put_u32(b, OFF_COUNT, self.count);
        put_u32(b, OFF_REGION, self.region_grains);
        put_u32(b, OFF_RECORDS_END, self.records_end);
        put_u32(b, OFF_ENTRIES_BYTES, self.entries_bytes);
        put_u32(b, OFF_ENTRIES_CRC, self.entries_crc);
        let crc = crc32c_append(seed, &b[..OFF_BLOCK_CRC]);
        put_u32(b, OFF_BLOCK_CRC, crc);
    }

    /// Decode a block (its checksum with the record seed `seed`); the
    /// caller checks its stamp and where it lies.
    pub fn decode(seed: u32, b: &[u8]) -> Result<Block, FormatError> {
        if b.len() < SUMMARY_BLOCK_BYTES {
            return Err(FormatError::Truncated { what: W, need: SUMMARY_BLOCK_BYTES, have: b.len() });
        }
        let magic = u32_at(b, OFF_MAGIC);
        if magic != SUMMARY_MAGIC {
            return Err(FormatError::BadMagic { what: W, found: magic as u64 });
        }
        let stored = u32_at(b, OFF_BLOCK_CRC);
        let computed = crc32c_append(seed, &b[..OFF_BLOCK_CRC]);
        if stored != computed {
            return Err(FormatError::Checksum { what: W, stored, computed });
        }
        let version = u16_at(b, OFF_VERSION);
        if version != SUMMARY_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: W,
                found: version as u32,
                supported: SUMMARY_VERSION as u32,
            });
        }
        let flags = u16_at(b, OFF_FLAGS);
        if flags != 0 {
            return Err(FormatError::BadField { what: W, field: "flags", value: flags as u64 });
        }
        if u32_at(b, OFF_RESERVED) != 0 {
            return Err(FormatError::BadField { what: W, field: "reserved", value: u32_at(b, OFF_RESERVED) as u64 });
        }
        let block = Block {
            stamp: u32_at(b, OFF_STAMP),
            count: u32_at(b, OFF_COUNT),
            region_grains: u32_at(b, OFF_REGION),
            records_end: u32_at(b, OFF_RECORDS_END),
            entries_bytes: u32_at(b, OFF_ENTRIES_BYTES),
            entries_crc: u32_at(b, OFF_ENTRIES_CRC),
        };
        if block.region_grains == 0 {
            return Err(FormatError::BadField { what: W, field: "region_grains", value: 0 });
        }
        Ok(block)
    }

    /// Whether this block, found at grain `at` of a segment of
    /// `segment_grains` with stamp `stamp`, heads a summary of it.
    pub fn heads(&self, stamp: u32, at: u64, segment_grains: u64) -> bool {
        self.stamp == stamp && at + self.region_grains as u64 == segment_grains && self.records_end as u64 <= at
    }
}

/// One entry: a record's first grain in the segment and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    pub grain: u32,
    pub key: &'a [u8],
}

/// Encode the region of a summary: `entries` (sorted by grain, strictly
/// increasing, each below `records_end`; keys that [`entry_bytes`]
/// accepts) of a segment with stamp `stamp`, in whole grains.
pub fn encode(seed: u32, stamp: u32, records_end: u32, entries: &[Entry<'_>], grain_bytes: u32) -> Vec<u8> {
    let entries_bytes: u64 = entries.iter().map(|e| entry_bytes(e.key.len()).expect("a listable key")).sum();
    let grains = region_grains(entries_bytes, grain_bytes);
    let len = (grains * grain_bytes as u64) as usize;
    let mut out = vec![0u8; len];
    let mut at = SUMMARY_BLOCK_BYTES;
    for e in entries {
        put_u32(&mut out, at, e.grain);
        put_u16(&mut out, at + 4, e.key.len() as u16);
        out[at + 6..at + 6 + e.key.len()].copy_from_slice(e.key);
        at += 6 + e.key.len();
    }
    let block = Block {
        stamp,
        count: entries.len() as u32,
        region_grains: grains as u32,
        records_end,
        entries_bytes: entries_bytes as u32,
        entries_crc: crc32c_append(seed, &out[SUMMARY_BLOCK_BYTES..at]),
    };
    block.encode(seed, &mut out[..SUMMARY_BLOCK_BYTES]);
    block.encode(seed, &mut out[len - SUMMARY_BLOCK_BYTES..]);
    out
}

/// The block at the end of a segment's last grain (`last_grain`), if it
/// ends a summary of a segment of `segment_grains` with stamp `stamp`.
pub fn trailer(seed: u32, stamp: u32, segment_grains: u64, last_grain: &[u8]) -> Result<Block, FormatError> {
    if last_grain.len() < SUMMARY_BLOCK_BYTES {
        return Err(FormatError::Truncated { what: W, need: SUMMARY_BLOCK_BYTES, have: last_grain.len() });
    }
    let block = Block::decode(seed, &last_grain[last_grain.len() - SUMMARY_BLOCK_BYTES..])?;
    let at = segment_grains.checked_sub(block.region_grains as u64);
    // Never more than a writer may write: a block whose checksum holds
    // but which names a larger region is refused before it is read.
    let max = region_grains_max(segment_grains.saturating_mul(last_grain.len() as u64), last_grain.len() as u32);
    match at {
        Some(at) if block.heads(stamp, at, segment_grains) && at >= 1 && block.region_grains as u64 <= max => Ok(block),
        _ if block.stamp != stamp => Err(FormatError::BadField { what: W, field: "stamp", value: block.stamp as u64 }),
        _ => Err(FormatError::BadField { what: W, field: "region_grains", value: block.region_grains as u64 }),
    }
}

/// Decode a whole region (`region`, `trailer.region_grains` grains, read
/// after [`trailer`] accepted its last block): both blocks equal, the
/// entries' checksum holding, every entry well formed, in increasing
/// grain order and below `records_end`.
pub fn decode<'a>(seed: u32, trailer: &Block, region: &'a [u8]) -> Result<Vec<Entry<'a>>, FormatError> {
    let len = region.len();
    if len < 2 * SUMMARY_BLOCK_BYTES {
        return Err(FormatError::Truncated { what: W, need: 2 * SUMMARY_BLOCK_BYTES, have: len });
    }
    let head = Block::decode(seed, region)?;
    if head != *trailer || region[..SUMMARY_BLOCK_BYTES] != region[len - SUMMARY_BLOCK_BYTES..] {
        return Err(FormatError::BadField { what: W, field: "leading block", value: head.stamp as u64 });
    }
    let end = SUMMARY_BLOCK_BYTES + head.entries_bytes as usize;
    if end > len - SUMMARY_BLOCK_BYTES {
        return Err(FormatError::BadField { what: W, field: "entries_bytes", value: head.entries_bytes as u64 });
    }
    let body = &region[SUMMARY_BLOCK_BYTES..end];
    let computed = crc32c_append(seed, body);
    if computed != head.entries_crc {
        return Err(FormatError::Checksum { what: W, stored: head.entries_crc, computed });
    }
    // At most one entry per 7 bytes, whatever `count` says.
    let mut out = Vec::with_capacity((head.count as usize).min(body.len() / 7));
    let mut at = 0;
    let mut last = 0u32;
    while at < body.len() {
        if body.len() - at < SUMMARY_ENTRY_OVERHEAD as usize {
            return Err(FormatError::Truncated { what: W, need: 6, have: body.len() - at });
        }
        let grain = u32_at(body, at);
        let key_len = u16_at(body, at + 4) as usize;
        if grain <= last || grain >= head.records_end {
            return Err(FormatError::BadField { what: W, field: "grain", value: grain as u64 });
        }
        if key_len == 0 || body.len() - at - 6 < key_len {
            return Err(FormatError::BadField { what: W, field: "key_len", value: key_len as u64 });
        }
        out.push(Entry { grain, key: &body[at + 6..at + 6 + key_len] });
        last = grain;
        at += 6 + key_len;
    }
    if out.len() != head.count as usize {
        return Err(FormatError::BadField { what: W, field: "count", value: head.count as u64 });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: u32 = 0x1234_5678;

    fn sample() -> Vec<u8> {
        let entries =
            [Entry { grain: 1, key: b"alpha" }, Entry { grain: 3, key: b"b" }, Entry { grain: 9, key: &[7u8; 300] }];
        encode(SEED, 42, 12, &entries, 512)
    }

    #[test]
    fn a_region_reads_back_from_its_last_grain() {
        let r = sample();
        assert_eq!(r.len() % 512, 0);
        let grains = r.len() as u64 / 512;
        let seg_grains = 128;
        let t = trailer(SEED, 42, seg_grains, &r[r.len() - 512..]).unwrap();
        assert_eq!(t.region_grains as u64, grains);
        assert_eq!(t.records_end, 12);
        let e = decode(SEED, &t, &r).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!((e[0].grain, e[0].key), (1, &b"alpha"[..]));
        assert_eq!((e[2].grain, e[2].key.len()), (9, 300));
        // The leading block heads the region where a scan meets it.
        let head = Block::decode(SEED, &r).unwrap();
        assert!(head.heads(42, seg_grains - grains, seg_grains));
        assert!(!head.heads(43, seg_grains - grains, seg_grains), "another use of the segment");
        assert!(!head.heads(42, seg_grains - grains - 1, seg_grains), "not where it says it ends");
    }

    #[test]
    fn an_empty_summary_is_a_summary() {
        let r = encode(SEED, 7, 1, &[], 4096);
        assert_eq!(r.len(), 4096);
        let t = trailer(SEED, 7, 64, &r).unwrap();
        assert!(decode(SEED, &t, &r).unwrap().is_empty());
    }

    #[test]
    fn refusals() {
        let r = sample();
        let last = |b: &[u8]| b[b.len() - 512..].to_vec();
        let t = trailer(SEED, 42, 128, &last(&r)).unwrap();
        // Another use of the segment, another seed (store), a region past
        // the segment's start.
        assert!(matches!(trailer(SEED, 41, 128, &last(&r)), Err(FormatError::BadField { field: "stamp", .. })));
        assert!(matches!(trailer(SEED + 1, 42, 128, &last(&r)), Err(FormatError::Checksum { .. })));
        assert!(trailer(SEED, 42, t.region_grains as u64, &last(&r)).is_err());
        // A region larger than a 64th of the segment (no writer writes
        // one), its checksums holding.
        let keys: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 60]).collect();
        let many: Vec<Entry<'_>> =
            keys.iter().enumerate().map(|(i, k)| Entry { grain: 1 + i as u32, key: k }).collect();
        let big = encode(SEED, 42, 50, &many, 512);
        assert!(big.len() / 512 > 2);
        let e = trailer(SEED, 42, 128, &last(&big)).unwrap_err();
        assert!(matches!(e, FormatError::BadField { field: "region_grains", .. }), "{e}");
        assert!(trailer(SEED, 42, 128 * 4, &last(&big)).is_ok(), "a 64th of a larger segment");
        // Any byte of the entries, or of the leading block.
        for i in [SUMMARY_BLOCK_BYTES, SUMMARY_BLOCK_BYTES + 5, 2] {
            let mut b = r.clone();
            b[i] ^= 1;
            assert!(decode(SEED, &t, &b).is_err(), "byte {i} flipped");
        }
        // Unknown version or flags (checksums recomputed).
        for (off, field) in [(OFF_VERSION, 2u16), (OFF_FLAGS, 1)] {
            let mut b = [0u8; SUMMARY_BLOCK_BYTES];
            b.copy_from_slice(&r[..SUMMARY_BLOCK_BYTES]);
            put_u16(&mut b, off, field);
            let crc = crc32c_append(SEED, &b[..OFF_BLOCK_CRC]);
            put_u32(&mut b, OFF_BLOCK_CRC, crc);
            let e = Block::decode(SEED, &b).unwrap_err();
            assert!(matches!(e, FormatError::UnsupportedVersion { .. } | FormatError::BadField { field: "flags", .. }));
        }
        // Entries out of order, or at or past records_end.
        let r = encode(SEED, 42, 12, &[Entry { grain: 3, key: b"x" }, Entry { grain: 2, key: b"y" }], 512);
        let t = trailer(SEED, 42, 128, &r).unwrap();
        assert!(matches!(decode(SEED, &t, &r), Err(FormatError::BadField { field: "grain", .. })));
        let r = encode(SEED, 42, 3, &[Entry { grain: 3, key: b"x" }], 512);
        let t = trailer(SEED, 42, 128, &r).unwrap();
        assert!(matches!(decode(SEED, &t, &r), Err(FormatError::BadField { field: "grain", .. })));
    }

    #[test]
    fn sizes() {
        assert_eq!(entry_bytes(8), Some(14));
        assert_eq!(entry_bytes(0), None);
        assert_eq!(entry_bytes(65536), None);
        assert_eq!(region_grains(0, 512), 1);
        assert_eq!(region_grains(512 - 80, 512), 1);
        assert_eq!(region_grains(512 - 79, 512), 2);
        assert_eq!(region_grains_max(1 << 20, 4096), 4);
        assert_eq!(region_grains(u64::MAX, 512), u64::MAX / 512 + 1, "saturates");
    }
}
