//! Atomic batches on the device: the records of a batch carry
//! [`FLAG_BATCH`](crate::record::FLAG_BATCH) and are followed, in the same
//! segment and the same write, by one **commit record**: a value record of
//! the engine's reserved key [`COMMIT_KEY`] whose value ([`Commit`]) names
//! the batch (its first sequence number and its record count) and vouches
//! for each of its records (a CRC32C over their header checksums, in
//! order). Recovery applies a batch's records only when the commit record
//! that follows them checks out; otherwise (a crash before the write
//! completed) none of them. The commit record itself is never indexed.
//!
//! Value layout (little-endian, 24 bytes): magic `GCMT` u32, version u16
//! (1), flags u16 (0), records u32, first_seq u64, members_crc u32.

use crate::bytes::*;
use crate::checksum::crc32c_append;
use crate::error::FormatError;

/// The reserved key of commit records.
pub const COMMIT_KEY: &[u8] = b"\0granary.commit";
/// "GCMT" as a little-endian u32.
pub const COMMIT_MAGIC: u32 = u32::from_le_bytes(*b"GCMT");
pub const COMMIT_VERSION: u16 = 1;
/// Bytes of a commit record's value.
pub const COMMIT_BYTES: usize = 24;

/// What a commit record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// Records of the batch (at least 1); they precede the commit record.
    pub records: u32,
    /// Sequence number of the first; the others follow it one by one, and
    /// the commit record's own is the next.
    pub first_seq: u64,
    /// CRC32C of the records' header checksums, in order ([`members_crc`]).
    pub members_crc: u32,
}

/// The checksum a commit record keeps of its batch's records, from their
/// stored header checksums in order.
pub fn members_crc(header_crcs: impl IntoIterator<Item = u32>) -> u32 {
    header_crcs.into_iter().fold(0, |c, h| crc32c_append(c, &h.to_le_bytes()))
}

impl Commit {
    pub fn encode(&self) -> [u8; COMMIT_BYTES] {
        let mut b = [0u8; COMMIT_BYTES];
        put_u32(&mut b, 0, COMMIT_MAGIC);
        put_u16(&mut b, 4, COMMIT_VERSION);
        put_u32(&mut b, 8, self.records);
        put_u64(&mut b, 12, self.first_seq);
        put_u32(&mut b, 20, self.members_crc);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Commit, FormatError> {
        const W: &str = "commit record";
        if b.len() != COMMIT_BYTES {
            return Err(FormatError::BadField { what: W, field: "value_len", value: b.len() as u64 });
        }
        let magic = u32_at(b, 0);
        if magic != COMMIT_MAGIC {
            return Err(FormatError::BadMagic { what: W, found: magic as u64 });
        }
        let version = u16_at(b, 4) as u32;
        if version != COMMIT_VERSION as u32 {
            return Err(FormatError::UnsupportedVersion { what: W, found: version, supported: COMMIT_VERSION as u32 });
        }
        if u16_at(b, 6) != 0 {
            return Err(FormatError::BadField { what: W, field: "flags", value: u16_at(b, 6) as u64 });
        }
        let c = Commit { records: u32_at(b, 8), first_seq: u64_at(b, 12), members_crc: u32_at(b, 20) };
        if c.records == 0 {
            return Err(FormatError::BadField { what: W, field: "records", value: 0 });
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let c = Commit { records: 3, first_seq: 77, members_crc: members_crc([1, 2, 3]) };
        assert_eq!(Commit::decode(&c.encode()).unwrap(), c);
        assert_ne!(members_crc([1, 2, 3]), members_crc([1, 3, 2]), "order counts");
        let mut b = c.encode();
        b[4] = 2;
        assert!(matches!(Commit::decode(&b), Err(FormatError::UnsupportedVersion { found: 2, .. })));
        let mut b = c.encode();
        b[6] = 1;
        assert!(matches!(Commit::decode(&b), Err(FormatError::BadField { field: "flags", .. })));
        let mut b = c.encode();
        b[8..12].fill(0);
        assert!(matches!(Commit::decode(&b), Err(FormatError::BadField { field: "records", .. })));
        assert!(Commit::decode(&c.encode()[..20]).is_err());
    }
}
