//! The record: one version of one key (a value or a tombstone) in the log.
//!
//! Layout (little-endian), padded with zeros to whole grains:
//!
//! ```text
//! off size field
//!   0    4 magic         "GREC"
//!   4    1 version       5 in a record of an atomic batch, else 4 (1 ..= 5 are read: see below)
//!   5    1 flags         bit 0 = tombstone; bit 1 = damaged copy; bit 2 = supersedes
//!                        (values: older versions of the key may remain); bit 3 =
//!                        explicit CAS (values); bit 4 = stale (values); bit 5 =
//!                        batch; others zero
//!   6    2 reserved      0
//!   8    4 key_len       1 ..= 65536
//!  12    4 seg_stamp     low 32 bits of the alloc_seq of the segment holding this copy
//!  16    8 value_len     0 ..= 4 GiB (always 0 for a tombstone)
//!  24    8 seq           store-wide sequence number; unchanged by GC relocation
//!  32    8 tomb_horizon  tombstone: highest segment alloc_seq in use when it was written
//!  32    4 user_flags    value: opaque 32-bit flags stored with it (memcache flags)
//!  36    4 expires       value: unix time in seconds after which it reads as absent; 0 = never
//!  40    4 header_crc    crc32c(seed, bytes 0..40 ++ key)
//!  44    4 crc           crc32c(seed, bytes 0..44 ++ key ++ value)
//!  48    .. key, then value, then zero padding to the next grain
//! ```
//!
//! `seed` is [`crate::checksum::record_seed`] of the device UUID.
//!
//! Two checksums, because they answer two questions. `crc` covers everything
//! and decides whether the record is intact. `header_crc` covers the header
//! and key only, so a reader can tell a record whose identity (key, sequence
//! number, length) is trustworthy but whose value is damaged (bit rot: report
//! corruption) from grains that are not a record at all (skip them).
//!
//! Version 1 wrote zeros at bytes 32..40 of a value record, which version 2
//! reads as no flags and no expiry, so both are accepted. Each later version
//! only adds a flag bit (3: explicit CAS, 4: stale, 5: batch), so every
//! version from 1 to 5 is accepted; this build writes 5 for a record of an
//! atomic batch and 4 for any other. A reader that only knows an older
//! version rejects newer records instead of silently dropping what they
//! carry.
//!
//! An empty value is a value (`flags` bit 0 clear, `value_len` 0); only the
//! tombstone bit makes a delete.

use crate::bytes::*;
use crate::checksum::crc32c_append;
use crate::error::FormatError;
use crate::limits::*;

/// "GREC" as a little-endian u32.
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"GREC");
/// The newest record version this build reads. It writes version 5 only
/// for a record of an atomic batch ([`FLAG_BATCH`]) and version 4
/// otherwise, so a store without batches stays readable by a build that
/// knows version 4.
pub const RECORD_VERSION: u8 = 5;
/// The oldest record version this build reads.
pub const RECORD_VERSION_MIN: u8 = 1;
/// Flag bit: this record is a tombstone.
pub const FLAG_TOMBSTONE: u8 = 1;
/// Flag bit: GC copied this record from one whose body had failed its
/// checksum. The copy's checksums hold (it is what was on the device), but
/// its content is known bad: readers report corruption.
pub const FLAG_DAMAGED_COPY: u8 = 2;
/// Flag bit (values only, record version 2): when this value was written
/// the key had an indexed version, so older versions of the key may remain
/// on the device. A value without it is the only version its key has on
/// the device, so dropping it (cache eviction) needs no tombstone.
pub const FLAG_SUPERSEDES: u8 = 4;

/// Flag bit (values only, record version 3): the first 8 bytes of the
/// value area hold the item's CAS value (u64), set explicitly (a touch that
/// keeps it, a client's chosen value); the user's value follows them and
/// `value_len` counts both. Without it the CAS value is `seq`.
pub const FLAG_EXPLICIT_CAS: u8 = 8;
/// Flag bit (values only, record version 4): the item is stale
/// (memcache's invalidation, `md <key> I`): it still reads, marked as such,
/// until a new value replaces it.
pub const FLAG_STALE: u8 = 16;
/// Flag bit (record version 5): the record belongs to an atomic batch whose
/// commit record ([`crate::batch`]) follows it in the same segment, right
/// after the batch's last record. Recovery applies it only if that commit
/// record is there and vouches for it. A copy GC relocates never carries
/// it: only committed records are ever indexed, so only they are copied.
pub const FLAG_BATCH: u8 = 32;
/// Bytes of an explicit CAS value.
pub const EXPLICIT_CAS_BYTES: usize = 8;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = OFF_MAGIC + 4;
const OFF_FLAGS: usize = OFF_VERSION + 1;
const OFF_RESERVED: usize = OFF_FLAGS + 1;
const OFF_KEY_LEN: usize = OFF_RESERVED + 2;
const OFF_STAMP: usize = OFF_KEY_LEN + 4;
const OFF_VALUE_LEN: usize = OFF_STAMP + 4;
const OFF_SEQ: usize = OFF_VALUE_LEN + 8;
const OFF_TOMB_HORIZON: usize = OFF_SEQ + 8;
const OFF_USER_FLAGS: usize = OFF_TOMB_HORIZON;
const OFF_EXPIRES: usize = OFF_USER_FLAGS + 4;
const OFF_HEADER_CRC: usize = OFF_TOMB_HORIZON + 8;
const OFF_CRC: usize = OFF_HEADER_CRC + 4;
const _: () = assert!(OFF_CRC + 4 == RECORD_HEADER_BYTES);

/// Value or tombstone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    Value,
    Tombstone,
}

/// The decoded fixed part of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: RecordKind,
    pub key_len: u32,
    pub seg_stamp: u32,
    pub value_len: u64,
    pub seq: u64,
    /// Tombstones: every older version of the key lies in a segment whose
    /// alloc_seq is at most this (0 for values).
    pub tomb_horizon: u64,
    /// See [`FLAG_DAMAGED_COPY`].
    pub damaged_copy: bool,
    /// See [`FLAG_SUPERSEDES`].
    pub supersedes: bool,
    /// See [`FLAG_EXPLICIT_CAS`].
    pub explicit_cas: bool,
    /// See [`FLAG_STALE`].
    pub stale: bool,
    /// See [`FLAG_BATCH`].
    pub batch: bool,
    /// Values: opaque flags stored with the value (0 for tombstones).
    pub user_flags: u32,
    /// Values: unix seconds after which the value reads as absent; 0 = never.
    pub expires: u32,
}

impl RecordHeader {
    /// A header for a value record.
    pub fn value(key_len: usize, value_len: u64, seq: u64, seg_stamp: u32) -> RecordHeader {
        RecordHeader {
            kind: RecordKind::Value,
            key_len: key_len as u32,
            seg_stamp,
            value_len,
            seq,
            tomb_horizon: 0,
            damaged_copy: false,
            supersedes: false,
            explicit_cas: false,
            stale: false,
            batch: false,
            user_flags: 0,
            expires: 0,
        }
    }

    /// This header marked as a record of an atomic batch ([`FLAG_BATCH`]).
    pub fn in_batch(mut self) -> RecordHeader {
        self.batch = true;
        self
    }

    /// This value header for a value area holding an explicit CAS value
    /// before the user's value ([`FLAG_EXPLICIT_CAS`]); `value_len` must
    /// count those 8 bytes.
    pub fn with_explicit_cas(mut self) -> RecordHeader {
        debug_assert!(!self.is_tombstone() && self.value_len >= EXPLICIT_CAS_BYTES as u64);
        self.explicit_cas = true;
        self
    }

    /// Bytes of the user's value (the value area less an explicit CAS).
    pub fn user_value_len(&self) -> u64 {
        self.value_len - if self.explicit_cas { EXPLICIT_CAS_BYTES as u64 } else { 0 }
    }

    /// Offset of the user's value in the encoded record.
    pub fn value_start(&self) -> usize {
        RECORD_HEADER_BYTES + self.key_len as usize + if self.explicit_cas { EXPLICIT_CAS_BYTES } else { 0 }
    }

    /// This value header marked as superseding an older version
    /// ([`FLAG_SUPERSEDES`]).
    pub fn with_supersedes(mut self, supersedes: bool) -> RecordHeader {
        debug_assert!(!self.is_tombstone());
        self.supersedes = supersedes;
        self
    }

    /// This value header with user flags and an expiry (unix seconds, 0 = never).
    pub fn with_meta(mut self, user_flags: u32, expires: u32) -> RecordHeader {
        debug_assert!(!self.is_tombstone());
        self.user_flags = user_flags;
        self.expires = expires;
        self
    }

    /// This value header marked stale or not ([`FLAG_STALE`]).
    pub fn with_stale(mut self, stale: bool) -> RecordHeader {
        debug_assert!(!self.is_tombstone() || !stale);
        self.stale = stale;
        self
    }

    /// Whether a value with this header has expired at `now` (unix seconds).
    pub fn expired_at(&self, now: u32) -> bool {
        self.expires != 0 && self.expires <= now
    }

    /// A header for a tombstone written while no segment with an alloc_seq
    /// above `tomb_horizon` was in use.
    pub fn tombstone(key_len: usize, seq: u64, seg_stamp: u32, tomb_horizon: u64) -> RecordHeader {
        // A value header's fields otherwise: no value, no flags, no meta.
        RecordHeader { kind: RecordKind::Tombstone, tomb_horizon, ..RecordHeader::value(key_len, 0, seq, seg_stamp) }
    }

    /// Unpadded bytes of the whole record.
    pub fn record_bytes(&self) -> u64 {
        record_bytes(self.key_len as usize, self.value_len)
    }

    /// Grains the record occupies.
    pub fn grains(&self, grain_bytes: u32) -> u64 {
        grains_for(self.record_bytes(), grain_bytes)
    }

    pub fn is_tombstone(&self) -> bool {
        self.kind == RecordKind::Tombstone
    }

    /// Decode the fixed header, validating every field but not the
    /// checksums (see [`verify_header_crc`] and [`verify_crc`]).
    pub fn decode(b: &[u8]) -> Result<RecordHeader, FormatError> {
        const W: &str = "record header";
        if b.len() < RECORD_HEADER_BYTES {
            return Err(FormatError::Truncated { what: W, need: RECORD_HEADER_BYTES, have: b.len() });
        }
        let magic = u32_at(b, OFF_MAGIC);
        if magic != RECORD_MAGIC {
            return Err(FormatError::BadMagic { what: W, found: magic as u64 });
        }
        if !(RECORD_VERSION_MIN..=RECORD_VERSION).contains(&b[OFF_VERSION]) {
            return Err(FormatError::UnsupportedVersion {
                what: W,
                found: b[OFF_VERSION] as u32,
                supported: RECORD_VERSION as u32,
            });
        }
        let bad = |field, value: u64| Err(FormatError::BadField { what: W, field, value });
        let flags = b[OFF_FLAGS];
        let value_only = FLAG_SUPERSEDES | FLAG_EXPLICIT_CAS | FLAG_STALE;
        if flags & !(FLAG_TOMBSTONE | FLAG_DAMAGED_COPY | FLAG_BATCH | value_only) != 0
            || (flags & value_only != 0 && flags & FLAG_TOMBSTONE != 0)
            || (flags & FLAG_BATCH != 0 && b[OFF_VERSION] < 5)
            || (flags & FLAG_SUPERSEDES != 0 && b[OFF_VERSION] < 2)
            || (flags & FLAG_EXPLICIT_CAS != 0 && b[OFF_VERSION] < 3)
            || (flags & FLAG_STALE != 0 && b[OFF_VERSION] < 4)
        {
            return bad("flags", flags as u64);
        }
        if u16_at(b, OFF_RESERVED) != 0 {
            return bad("reserved", u16_at(b, OFF_RESERVED) as u64);
        }
        let key_len = u32_at(b, OFF_KEY_LEN);
        if !(KEY_BYTES_MIN..=KEY_BYTES_MAX).contains(&(key_len as usize)) {
            return bad("key_len", key_len as u64);
        }
        let value_len = u64_at(b, OFF_VALUE_LEN);
        if value_len > VALUE_BYTES_MAX {
            return bad("value_len", value_len);
        }
        let kind = if flags & FLAG_TOMBSTONE != 0 { RecordKind::Tombstone } else { RecordKind::Value };
        if kind == RecordKind::Tombstone && value_len != 0 {
            return bad("value_len", value_len);
        }
        let tombstone = kind == RecordKind::Tombstone;
        let explicit_cas = flags & FLAG_EXPLICIT_CAS != 0;
        if explicit_cas && value_len < EXPLICIT_CAS_BYTES as u64 {
            return bad("value_len", value_len);
        }
        Ok(RecordHeader {
            kind,
            key_len,
            seg_stamp: u32_at(b, OFF_STAMP),
            value_len,
            seq: u64_at(b, OFF_SEQ),
            tomb_horizon: if tombstone { u64_at(b, OFF_TOMB_HORIZON) } else { 0 },
            damaged_copy: flags & FLAG_DAMAGED_COPY != 0,
            // Version 1 did not record it: assume older versions may remain.
            supersedes: flags & FLAG_SUPERSEDES != 0 || (!tombstone && b[OFF_VERSION] == 1),
            explicit_cas,
            stale: flags & FLAG_STALE != 0,
            batch: flags & FLAG_BATCH != 0,
            user_flags: if tombstone { 0 } else { u32_at(b, OFF_USER_FLAGS) },
            expires: if tombstone { 0 } else { u32_at(b, OFF_EXPIRES) },
        })
    }

    /// Write header, key and value into `out` and zero the padding up to
    /// `out.len()`. `out` must hold at least [`Self::record_bytes`].
    pub fn encode(&self, seed: u32, key: &[u8], value: &[u8], out: &mut [u8]) {
        assert_eq!(key.len(), self.key_len as usize);
        assert_eq!(value.len() as u64, self.value_len);
        let total = self.record_bytes() as usize;
        assert!(out.len() >= total, "record buffer too small");
        let body = &mut out[RECORD_HEADER_BYTES..];
        body[..key.len()].copy_from_slice(key);
        body[key.len()..key.len() + value.len()].copy_from_slice(value);
        self.encode_in_place(seed, out);
    }

    /// Encode the header of a record whose key and value already lie in
    /// `out` at their places (after the header), zero the padding after the
    /// value, and set both checksums: the zero-copy form of
    /// [`RecordHeader::encode`].
    pub fn encode_in_place(&self, seed: u32, out: &mut [u8]) {
        let total = self.record_bytes() as usize;
        assert!(out.len() >= total, "record buffer too small");
        let (head, rest) = out.split_at_mut(RECORD_HEADER_BYTES);
        let (key_len, value_len) = (self.key_len as usize, self.value_len as usize);
        head.fill(0);
        put_u32(head, OFF_MAGIC, RECORD_MAGIC);
        head[OFF_VERSION] = if self.batch { RECORD_VERSION } else { RECORD_VERSION - 1 };
        head[OFF_FLAGS] = if self.is_tombstone() { FLAG_TOMBSTONE } else { 0 }
            | if self.batch { FLAG_BATCH } else { 0 }
            | if self.damaged_copy { FLAG_DAMAGED_COPY } else { 0 }
            | if self.supersedes { FLAG_SUPERSEDES } else { 0 }
            | if self.explicit_cas { FLAG_EXPLICIT_CAS } else { 0 }
            | if self.stale { FLAG_STALE } else { 0 };
        put_u32(head, OFF_KEY_LEN, self.key_len);
        put_u32(head, OFF_STAMP, self.seg_stamp);
        put_u64(head, OFF_VALUE_LEN, self.value_len);
        put_u64(head, OFF_SEQ, self.seq);
        if self.is_tombstone() {
            put_u64(head, OFF_TOMB_HORIZON, self.tomb_horizon);
        } else {
            put_u32(head, OFF_USER_FLAGS, self.user_flags);
            put_u32(head, OFF_EXPIRES, self.expires);
        }
        rest[key_len + value_len..].fill(0);
        let key = &rest[..key_len];
        let header_crc = crc32c_append(crc32c_append(seed, &head[..OFF_HEADER_CRC]), key);
        put_u32(head, OFF_HEADER_CRC, header_crc);
        let body = &rest[..key_len + value_len];
        let crc = crc32c_append(crc32c_append(seed, &head[..OFF_CRC]), body);
        put_u32(head, OFF_CRC, crc);
    }
}

/// Rewrite an encoded, whole record in place for a new segment: set its
/// stamp, clear [`FLAG_BATCH`] (a copy stands alone: its batch was
/// committed) and recompute both checksums. With `damaged` (the original
/// failed its body checksum), the copy is marked [`FLAG_DAMAGED_COPY`], so
/// relocation never turns corruption into data, and a crash cannot make the
/// copy look like a torn write either.
pub fn restamp(seed: u32, h: &RecordHeader, b: &mut [u8], seg_stamp: u32, damaged: bool) {
    let end = h.record_bytes() as usize;
    put_u32(b, OFF_STAMP, seg_stamp);
    b[OFF_FLAGS] &= !FLAG_BATCH;
    if damaged {
        b[OFF_FLAGS] |= FLAG_DAMAGED_COPY;
    }
    let key_end = RECORD_HEADER_BYTES + h.key_len as usize;
    put_u32(b, OFF_HEADER_CRC, record_crc(seed, b, OFF_HEADER_CRC, key_end));
    put_u32(b, OFF_CRC, record_crc(seed, b, OFF_CRC, end));
}

/// The header checksum stored in an encoded record (its identity: header
/// and key), which a batch's commit record vouches for.
pub fn stored_header_crc(b: &[u8]) -> u32 {
    u32_at(b, OFF_HEADER_CRC)
}

/// A record checksum: over the header bytes before its own field at
/// `crc_off` (so `header_crc` is not covered by itself, and `crc` covers
/// `header_crc`), then the record from the key up to `end`.
fn record_crc(seed: u32, b: &[u8], crc_off: usize, end: usize) -> u32 {
    crc32c_append(crc32c_append(seed, &b[..crc_off]), &b[RECORD_HEADER_BYTES..end])
}

/// Check the checksum stored at `crc_off` against [`record_crc`] up to
/// `end`; `b` must hold `end` bytes (else a truncation of `truncated`).
fn verify_record_crc(
    seed: u32,
    b: &[u8],
    crc_off: usize,
    end: usize,
    truncated: &'static str,
    what: &'static str,
) -> Result<(), FormatError> {
    if b.len() < end {
        return Err(FormatError::Truncated { what: truncated, need: end, have: b.len() });
    }
    let computed = record_crc(seed, b, crc_off, end);
    let stored = u32_at(b, crc_off);
    if stored != computed {
        return Err(FormatError::Checksum { what, stored, computed });
    }
    Ok(())
}

/// Check `header_crc`; `b` holds at least the header and the key.
pub fn verify_header_crc(seed: u32, h: &RecordHeader, b: &[u8]) -> Result<(), FormatError> {
    let end = RECORD_HEADER_BYTES + h.key_len as usize;
    verify_record_crc(seed, b, OFF_HEADER_CRC, end, "record key", "record header")
}

/// Check the whole-record `crc`; `b` holds the whole record.
pub fn verify_crc(seed: u32, h: &RecordHeader, b: &[u8]) -> Result<(), FormatError> {
    let end = h.record_bytes() as usize;
    verify_record_crc(seed, b, OFF_CRC, end, "record", "record")
}

/// The key of an encoded record (header already decoded).
pub fn key_of<'a>(h: &RecordHeader, b: &'a [u8]) -> &'a [u8] {
    &b[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + h.key_len as usize]
}

/// The user's value of an encoded record (header already decoded).
pub fn value_of<'a>(h: &RecordHeader, b: &'a [u8]) -> &'a [u8] {
    let start = h.value_start();
    &b[start..start + h.user_value_len() as usize]
}

/// The CAS value of an encoded value record: the explicit one, else its
/// sequence number. `b` holds at least the header, key and
/// [`EXPLICIT_CAS_BYTES`] (see [`cas_bytes_needed`]).
pub fn cas_of(h: &RecordHeader, b: &[u8]) -> u64 {
    if h.explicit_cas {
        u64_at(b, RECORD_HEADER_BYTES + h.key_len as usize)
    } else {
        h.seq
    }
}

/// Bytes from the record's start that [`cas_of`] reads.
pub fn cas_bytes_needed(h: &RecordHeader) -> usize {
    RECORD_HEADER_BYTES + h.key_len as usize + if h.explicit_cas { EXPLICIT_CAS_BYTES } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEED: u32 = 0x1234_5678;

    fn encode(h: &RecordHeader, key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = vec![0xAAu8; h.grains(512) as usize * 512];
        h.encode(SEED, key, value, &mut out);
        out
    }

    /// `h` encoded with `key` and `value`, and its header decoded back,
    /// which must equal `h`.
    fn encode_decode(h: &RecordHeader, key: &[u8], value: &[u8]) -> (Vec<u8>, RecordHeader) {
        let b = encode(h, key, value);
        let d = RecordHeader::decode(&b).unwrap();
        assert_eq!(&d, h);
        (b, d)
    }

    #[test]
    fn empty_value_is_not_a_tombstone() {
        let h = RecordHeader::value(3, 0, 1, 0);
        let b = encode(&h, b"key", b"");
        let d = RecordHeader::decode(&b).unwrap();
        assert_eq!(d.kind, RecordKind::Value);
        assert_eq!(d.value_len, 0);
        verify_crc(SEED, &d, &b).unwrap();
    }

    #[test]
    fn tombstone_round_trip() {
        let h = RecordHeader::tombstone(3, 9, 4, 12);
        let (_, d) = encode_decode(&h, b"key", b"");
        assert!(d.is_tombstone());
    }

    #[test]
    fn padding_is_zeroed() {
        let h = RecordHeader::value(1, 1, 1, 0);
        let b = encode(&h, b"k", b"v");
        assert!(b[50..].iter().all(|&x| x == 0));
    }

    #[test]
    fn crc_covers_key_and_value() {
        let h = RecordHeader::value(3, 5, 1, 0);
        let b = encode(&h, b"key", b"value");
        let mut v = b.clone();
        v[RECORD_HEADER_BYTES + 4] ^= 1; // a value byte
        verify_header_crc(SEED, &h, &v).unwrap();
        assert!(matches!(verify_crc(SEED, &h, &v), Err(FormatError::Checksum { .. })));
        let mut k = b.clone();
        k[RECORD_HEADER_BYTES] ^= 1; // a key byte
        assert!(verify_header_crc(SEED, &h, &k).is_err());
        assert!(verify_crc(SEED, &h, &k).is_err());
        // Another device's seed rejects the record.
        assert!(verify_crc(SEED + 1, &h, &b).is_err());
    }

    #[test]
    fn rejects_unknown_flags_and_versions() {
        let h = RecordHeader::value(3, 5, 1, 0);
        let b = encode(&h, b"key", b"value");
        let mut f = b.clone();
        f[OFF_FLAGS] = 0x80;
        assert!(matches!(RecordHeader::decode(&f), Err(FormatError::BadField { field: "flags", .. })));
        let mut v = b.clone();
        v[OFF_VERSION] = RECORD_VERSION + 1;
        assert!(matches!(RecordHeader::decode(&v), Err(FormatError::UnsupportedVersion { found: 6, .. })));
        v[OFF_VERSION] = 0;
        assert!(matches!(RecordHeader::decode(&v), Err(FormatError::UnsupportedVersion { found: 0, .. })));
        let mut kl = b.clone();
        put_u32(&mut kl, OFF_KEY_LEN, (KEY_BYTES_MAX + 1) as u32);
        assert!(matches!(RecordHeader::decode(&kl), Err(FormatError::BadField { field: "key_len", .. })));
    }

    #[test]
    fn batch_records_are_version_5_and_copies_lose_the_flag() {
        let plain = encode(&RecordHeader::value(3, 5, 1, 0), b"key", b"value");
        assert_eq!(plain[OFF_VERSION], 4, "a record outside a batch stays readable by version 4");
        let h = RecordHeader::value(3, 5, 1, 0).in_batch();
        let (mut b, d) = encode_decode(&h, b"key", b"value");
        assert_eq!((b[OFF_VERSION], d.batch), (5, true));
        let t = RecordHeader::tombstone(3, 9, 0, 1).in_batch();
        assert!(encode_decode(&t, b"key", b"").1.batch);
        // The flag in an older version is refused.
        let mut old = b.clone();
        old[OFF_VERSION] = 4;
        assert!(matches!(RecordHeader::decode(&old), Err(FormatError::BadField { field: "flags", .. })));
        // GC's copy stands alone.
        restamp(SEED, &d, &mut b, 9, false);
        let copy = RecordHeader::decode(&b).unwrap();
        assert!(!copy.batch);
        verify_crc(SEED, &copy, &b).unwrap();
    }

    #[test]
    fn meta_round_trip_and_version_1_reads_as_no_meta() {
        let h = RecordHeader::value(3, 5, 7, 1).with_meta(0xdead_beef, 1_900_000_000).with_supersedes(true);
        let (b, d) = encode_decode(&h, b"key", b"value");
        assert!(!d.expired_at(1_899_999_999));
        assert!(d.expired_at(1_900_000_000));
        verify_crc(SEED, &d, &b).unwrap();
        // A version 1 value record (zeros at 32..40) decodes with no meta.
        let mut v1 = encode(&RecordHeader::value(3, 5, 7, 1), b"key", b"value");
        v1[OFF_VERSION] = 1;
        let d1 = RecordHeader::decode(&v1).unwrap();
        assert_eq!((d1.user_flags, d1.expires), (0, 0));
        assert!(!d1.expired_at(u32::MAX));
        // The supersedes bit is refused on tombstones and in version 1.
        let mut t = encode(&RecordHeader::tombstone(3, 9, 4, 12), b"key", b"");
        t[OFF_FLAGS] |= FLAG_SUPERSEDES;
        assert!(matches!(RecordHeader::decode(&t), Err(FormatError::BadField { field: "flags", .. })));
        let mut o = b.clone();
        o[OFF_VERSION] = 1;
        assert!(matches!(RecordHeader::decode(&o), Err(FormatError::BadField { field: "flags", .. })));
        // The meta is covered by the header checksum.
        let mut m = b.clone();
        m[OFF_EXPIRES] ^= 1;
        assert!(verify_header_crc(SEED, &RecordHeader::decode(&m).unwrap(), &m).is_err());
    }

    #[test]
    fn explicit_cas_sits_before_the_value_and_needs_version_3() {
        let payload = [42u64.to_le_bytes().as_slice(), b"value"].concat();
        let h = RecordHeader::value(3, payload.len() as u64, 7, 1).with_explicit_cas();
        let (b, d) = encode_decode(&h, b"key", &payload);
        assert!(d.explicit_cas);
        assert_eq!((cas_of(&d, &b), value_of(&d, &b), d.user_value_len()), (42, &b"value"[..], 5));
        assert_eq!(cas_bytes_needed(&d), RECORD_HEADER_BYTES + 3 + 8);
        verify_crc(SEED, &d, &b).unwrap();
        // Without the flag the CAS value is the sequence number.
        let plain = encode(&RecordHeader::value(3, 5, 9, 1), b"key", b"value");
        let p = RecordHeader::decode(&plain).unwrap();
        assert_eq!((cas_of(&p, &plain), value_of(&p, &plain)), (9, &b"value"[..]));
        // Refused in version 2, on tombstones, and with no room for the CAS.
        let mut v2 = b.clone();
        v2[OFF_VERSION] = 2;
        assert!(matches!(RecordHeader::decode(&v2), Err(FormatError::BadField { field: "flags", .. })));
        let mut t = encode(&RecordHeader::tombstone(3, 9, 4, 12), b"key", b"");
        t[OFF_FLAGS] |= FLAG_EXPLICIT_CAS;
        assert!(matches!(RecordHeader::decode(&t), Err(FormatError::BadField { field: "flags", .. })));
        let mut short = plain.clone();
        short[OFF_FLAGS] |= FLAG_EXPLICIT_CAS;
        put_u64(&mut short, OFF_VALUE_LEN, 7);
        assert!(matches!(RecordHeader::decode(&short), Err(FormatError::BadField { field: "value_len", .. })));
    }

    #[test]
    fn stale_flag_round_trips_and_needs_version_4() {
        let h = RecordHeader::value(3, 5, 7, 1).with_meta(9, 100).with_stale(true);
        let (b, d) = encode_decode(&h, b"key", b"value");
        assert!(
            d.stale && !RecordHeader::decode(&encode(&h.clone().with_stale(false), b"key", b"value")).unwrap().stale
        );
        verify_crc(SEED, &d, &b).unwrap();
        let mut v3 = b.clone();
        v3[OFF_VERSION] = 3;
        assert!(matches!(RecordHeader::decode(&v3), Err(FormatError::BadField { field: "flags", .. })));
        let mut t = encode(&RecordHeader::tombstone(3, 9, 4, 12), b"key", b"");
        t[OFF_FLAGS] |= FLAG_STALE;
        assert!(matches!(RecordHeader::decode(&t), Err(FormatError::BadField { field: "flags", .. })));
    }

    proptest! {
        #[test]
        fn round_trip(key in proptest::collection::vec(any::<u8>(), 1..300),
                      value in proptest::collection::vec(any::<u8>(), 0..2000),
                      seq in any::<u64>(), stamp in any::<u32>(), fl in any::<u32>(), exp in any::<u32>()) {
            let h = RecordHeader::value(key.len(), value.len() as u64, seq, stamp).with_meta(fl, exp).with_supersedes(seq % 2 == 0);
            let b = encode(&h, &key, &value);
            let d = RecordHeader::decode(&b).unwrap();
            prop_assert_eq!(&d, &h);
            verify_header_crc(SEED, &d, &b).unwrap();
            verify_crc(SEED, &d, &b).unwrap();
            prop_assert_eq!(key_of(&d, &b), &key[..]);
            prop_assert_eq!(value_of(&d, &b), &value[..]);
        }
    }
}
