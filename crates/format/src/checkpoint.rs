//! Index checkpoints: the manifest and the entry items (docs/FORMAT.md, "Index
//! checkpoint").
//!
//! A checkpoint lives in one or more segments whose headers say
//! `kind = 2` (index) and whose `first_seq` field holds the checkpoint id
//! (the `alloc_seq` of its first segment). The first segment holds the
//! manifest at grain 1, padded to whole grains; the body (the items) follows
//! it and continues from grain 1 of each further segment, in the order the
//! manifest lists them.
//!
//! Manifest (little-endian; 128 fixed bytes, then two arrays):
//!
//! ```text
//! off size field
//!   0    4 magic          "GCKP"
//!   4    2 version        3 (2: entries with an 11-bit kv_size, no hint
//!                         bits; 1: entries with 40-bit pba, no fp)
//!   6    2 flags          bit 0: clean (written by a clean close)
//!   8    8 id             alloc_seq of the checkpoint's first segment
//!  16    8 session        random id of the open session that wrote it
//!  24    8 replay_from    KV segments with alloc_seq >= this are replayed
//!  32    8 next_seq       the store's next record sequence number
//!  40    8 next_alloc_seq the next segment alloc_seq at capture
//!  48    8 created_unix_ms
//!  56    8 entries        number of 16-byte items in the body
//!  64    4 tables_log2    index tables when captured
//!  68    4 table_homes    home slots per table (must match the superblock)
//!  72    4 body_segments  n, segments holding the body (the first included)
//!  76    4 segment_count  the store's segment count
//!  80    4 body_crc       CRC32C of the body bytes
//!  84    4 manifest_bytes 128 + 4 n + 8 segment_count
//!  88    8 hash_check     the key hash the entries were placed by
//!                         (`Superblock::hash_check`): 0 under the public
//!                         seed, else a hash of a fixed key with the
//!                         store's seed (never 0)
//!  96   28 reserved       0
//! 124    4 crc32c         over bytes 0..124 and 128..manifest_bytes
//! 128  4 n body segment indexes (u32), first one first
//! ...  8 s alloc_seq of every segment when the checkpoint began (0 = not
//!         a KV segment in use)
//! ```
//!
//! Item (16 bytes): `entry u64` (the index entry as it was in DRAM, its
//! neighbourhood offset included, its slot's hop-hint bits 0: the loader
//! puts it back in the same slot when the slot is free), `home u32` (its home slot in its table),
//! `grains u32` (the record's size in grains, 0 if the writer did not learn
//! it).

use crate::bytes::*;
use crate::checksum::{crc32c, crc32c_append};
use crate::error::FormatError;

/// "GCKP" as a little-endian u32.
pub const CHECKPOINT_MAGIC: u32 = u32::from_le_bytes(*b"GCKP");
/// The checkpoint version this build writes and reads. Versions 1 and 2
/// held index entries of older layouts (1: 40-bit pba, no fp bits; 2: an
/// 11-bit kv_size where the hop hint bits now are): such a checkpoint is
/// refused by name and the store rebuilds its index by a log scan.
pub const CHECKPOINT_VERSION: u16 = 3;
/// Bytes of the manifest's fixed part.
pub const MANIFEST_FIXED_BYTES: usize = 128;
/// Bytes of one body item.
pub const ITEM_BYTES: usize = 16;
/// Flag: written by a clean close.
pub const FLAG_CLEAN: u16 = 1;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 4;
const OFF_FLAGS: usize = 6;
const OFF_ID: usize = 8;
const OFF_SESSION: usize = 16;
const OFF_REPLAY_FROM: usize = 24;
const OFF_NEXT_SEQ: usize = 32;
const OFF_NEXT_ALLOC: usize = 40;
const OFF_CREATED: usize = 48;
const OFF_ENTRIES: usize = 56;
const OFF_TABLES_LOG2: usize = 64;
const OFF_HOMES: usize = 68;
const OFF_BODY_SEGS: usize = 72;
const OFF_SEG_COUNT: usize = 76;
const OFF_BODY_CRC: usize = 80;
const OFF_MANIFEST_BYTES: usize = 84;
const OFF_HASH_CHECK: usize = 88;
const OFF_RESERVED: usize = 96;
const OFF_CRC: usize = 124;
const _: () = assert!(OFF_CRC + 4 == MANIFEST_FIXED_BYTES);

/// A decoded checkpoint manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub clean: bool,
    pub id: u64,
    pub session: u64,
    pub replay_from: u64,
    pub next_seq: u64,
    pub next_alloc_seq: u64,
    pub created_unix_ms: u64,
    pub entries: u64,
    pub tables_log2: u32,
    pub table_homes: u32,
    pub body_crc: u32,
    /// Which key hash placed the entries ([`crate::Superblock::hash_check`]):
    /// a loader refuses a checkpoint whose value is not its superblock's.
    pub hash_check: u64,
    /// Segments holding the body, the first (manifest) segment first.
    pub body_segments: Vec<u32>,
    /// alloc_seq of every KV segment in use when the checkpoint began.
    pub seg_alloc: Vec<u64>,
}

impl Manifest {
    /// Encoded size in bytes.
    pub fn encoded_bytes(&self) -> usize {
        Self::bytes_for(self.body_segments.len(), self.seg_alloc.len())
    }

    /// Encoded size of a manifest with `n` body segments and `segments` segments.
    pub fn bytes_for(n: usize, segments: usize) -> usize {
        MANIFEST_FIXED_BYTES + 4 * n + 8 * segments
    }

    /// Encode into the first [`Manifest::encoded_bytes`] of `out`.
    pub fn encode(&self, out: &mut [u8]) {
        let len = self.encoded_bytes();
        let b = &mut out[..len];
        b.fill(0);
        put_u32(b, OFF_MAGIC, CHECKPOINT_MAGIC);
        put_u16(b, OFF_VERSION, CHECKPOINT_VERSION);
        put_u16(b, OFF_FLAGS, if self.clean { FLAG_CLEAN } else { 0 });
        put_u64(b, OFF_ID, self.id);
        put_u64(b, OFF_SESSION, self.session);
        put_u64(b, OFF_REPLAY_FROM, self.replay_from);
        put_u64(b, OFF_NEXT_SEQ, self.next_seq);
        put_u64(b, OFF_NEXT_ALLOC, self.next_alloc_seq);
        put_u64(b, OFF_CREATED, self.created_unix_ms);
        put_u64(b, OFF_ENTRIES, self.entries);
        put_u32(b, OFF_TABLES_LOG2, self.tables_log2);
        put_u32(b, OFF_HOMES, self.table_homes);
        put_u32(b, OFF_BODY_SEGS, self.body_segments.len() as u32);
        put_u32(b, OFF_SEG_COUNT, self.seg_alloc.len() as u32);
        put_u32(b, OFF_BODY_CRC, self.body_crc);
        put_u32(b, OFF_MANIFEST_BYTES, len as u32);
        put_u64(b, OFF_HASH_CHECK, self.hash_check);
        let mut off = MANIFEST_FIXED_BYTES;
        for &s in &self.body_segments {
            put_u32(b, off, s);
            off += 4;
        }
        for &a in &self.seg_alloc {
            put_u64(b, off, a);
            off += 8;
        }
        let crc = crc32c_append(crc32c(&b[..OFF_CRC]), &b[MANIFEST_FIXED_BYTES..]);
        put_u32(b, OFF_CRC, crc);
    }

    /// Decode and validate a manifest. Bytes that do not start with the
    /// checkpoint magic give [`FormatError::BadMagic`] (not a manifest).
    pub fn decode(b: &[u8]) -> Result<Manifest, FormatError> {
        const W: &str = "checkpoint manifest";
        let truncated = |need| FormatError::Truncated { what: W, need, have: b.len() };
        if b.len() < MANIFEST_FIXED_BYTES {
            return Err(truncated(MANIFEST_FIXED_BYTES));
        }
        let magic = u32_at(b, OFF_MAGIC);
        if magic != CHECKPOINT_MAGIC {
            return Err(FormatError::BadMagic { what: W, found: magic as u64 });
        }
        let version = u16_at(b, OFF_VERSION);
        if version != CHECKPOINT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: W,
                found: version as u32,
                supported: CHECKPOINT_VERSION as u32,
            });
        }
        let n = u32_at(b, OFF_BODY_SEGS) as usize;
        let segments = u32_at(b, OFF_SEG_COUNT) as usize;
        let len = u32_at(b, OFF_MANIFEST_BYTES) as usize;
        if n == 0 || n > segments || len != Self::bytes_for(n, segments) {
            return Err(FormatError::BadField { what: W, field: "manifest_bytes", value: len as u64 });
        }
        if b.len() < len {
            return Err(truncated(len));
        }
        let stored = u32_at(b, OFF_CRC);
        let computed = crc32c_append(crc32c(&b[..OFF_CRC]), &b[MANIFEST_FIXED_BYTES..len]);
        if stored != computed {
            return Err(FormatError::Checksum { what: W, stored, computed });
        }
        let flags = u16_at(b, OFF_FLAGS);
        if flags & !FLAG_CLEAN != 0 {
            return Err(FormatError::BadField { what: W, field: "flags", value: flags as u64 });
        }
        if b[OFF_RESERVED..OFF_CRC].iter().any(|&x| x != 0) {
            return Err(FormatError::BadField { what: W, field: "reserved", value: 1 });
        }
        let tables_log2 = u32_at(b, OFF_TABLES_LOG2);
        if tables_log2 > crate::hash::TAG_BITS {
            return Err(FormatError::BadField { what: W, field: "tables_log2", value: tables_log2 as u64 });
        }
        let mut off = MANIFEST_FIXED_BYTES;
        let mut body_segments = Vec::with_capacity(n);
        for _ in 0..n {
            body_segments.push(u32_at(b, off));
            off += 4;
        }
        let mut seg_alloc = Vec::with_capacity(segments);
        for _ in 0..segments {
            seg_alloc.push(u64_at(b, off));
            off += 8;
        }
        Ok(Manifest {
            clean: flags & FLAG_CLEAN != 0,
            id: u64_at(b, OFF_ID),
            session: u64_at(b, OFF_SESSION),
            replay_from: u64_at(b, OFF_REPLAY_FROM),
            next_seq: u64_at(b, OFF_NEXT_SEQ),
            next_alloc_seq: u64_at(b, OFF_NEXT_ALLOC),
            created_unix_ms: u64_at(b, OFF_CREATED),
            entries: u64_at(b, OFF_ENTRIES),
            tables_log2,
            table_homes: u32_at(b, OFF_HOMES),
            body_crc: u32_at(b, OFF_BODY_CRC),
            hash_check: u64_at(b, OFF_HASH_CHECK),
            body_segments,
            seg_alloc,
        })
    }
}

/// One body item: an index entry (raw u64), its home slot, its record's grains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item {
    pub entry: u64,
    pub home: u32,
    pub grains: u32,
}

impl Item {
    pub fn encode(&self, out: &mut [u8]) {
        put_u64(out, 0, self.entry);
        put_u32(out, 8, self.home);
        put_u32(out, 12, self.grains);
    }

    pub fn decode(b: &[u8]) -> Item {
        Item { entry: u64_at(b, 0), home: u32_at(b, 8), grains: u32_at(b, 12) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            clean: true,
            id: 77,
            session: 0xdead_beef_1234,
            replay_from: 70,
            next_seq: 1_000_001,
            next_alloc_seq: 78,
            created_unix_ms: 1_700_000_000_000,
            entries: 12345,
            tables_log2: 3,
            table_homes: 9638,
            body_crc: 0xabcd,
            hash_check: 0x1234_5679,
            body_segments: vec![5, 9, 2],
            seg_alloc: vec![0, 3, 4, 0, 70, 0, 0, 71, 0, 0],
        }
    }

    #[test]
    fn manifest_round_trip() {
        let m = sample();
        let mut b = vec![0u8; 4096];
        m.encode(&mut b);
        assert_eq!(Manifest::decode(&b).unwrap(), m);
        let mut unclean = m.clone();
        unclean.clean = false;
        unclean.encode(&mut b);
        assert_eq!(Manifest::decode(&b).unwrap(), unclean);
    }

    #[test]
    fn manifest_rejects_corruption_and_unknowns() {
        let m = sample();
        let mut good = vec![0u8; 4096];
        m.encode(&mut good);
        // Any flipped byte of the encoded manifest is caught.
        for i in 0..m.encoded_bytes() {
            let mut b = good.clone();
            b[i] ^= 0x10;
            assert!(Manifest::decode(&b).is_err(), "flip at {i} accepted");
        }
        assert!(matches!(Manifest::decode(&[0u8; 4096]), Err(FormatError::BadMagic { found: 0, .. })));
        assert!(matches!(Manifest::decode(&good[..100]), Err(FormatError::Truncated { .. })));
        // Another version (older, newer) is refused by name, even with a
        // valid checksum.
        for v in [1u16, 2, 4] {
            let mut b = good.clone();
            put_u16(&mut b, OFF_VERSION, v);
            let crc = crc32c_append(crc32c(&b[..OFF_CRC]), &b[MANIFEST_FIXED_BYTES..m.encoded_bytes()]);
            put_u32(&mut b, OFF_CRC, crc);
            assert!(
                matches!(Manifest::decode(&b), Err(FormatError::UnsupportedVersion { found, .. }) if found == v as u32)
            );
        }
        // Unknown flag bits too.
        let mut b = good.clone();
        put_u16(&mut b, OFF_FLAGS, 4);
        let crc = crc32c_append(crc32c(&b[..OFF_CRC]), &b[MANIFEST_FIXED_BYTES..m.encoded_bytes()]);
        put_u32(&mut b, OFF_CRC, crc);
        assert!(matches!(Manifest::decode(&b), Err(FormatError::BadField { field: "flags", .. })));
    }

    #[test]
    fn item_round_trip() {
        let it = Item { entry: 0x07ff_ffff_1234_5678, home: 9637, grains: 511 };
        let mut b = [0u8; ITEM_BYTES];
        it.encode(&mut b);
        assert_eq!(Item::decode(&b), it);
    }
}
