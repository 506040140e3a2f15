//! The segment header: the first grain of every segment that has been used.
//!
//! Layout (64 bytes, little-endian):
//!
//! ```text
//! off size field
//!   0    4 magic          "GSEG"
//!   4    2 version        1
//!   6    1 kind           1 = KV log, 2 = index checkpoint, 3 = free (reclaimed)
//!   7    1 stream         0 = user writes, 1 = GC relocation, 2 = cold (relocated
//!                         again), 3 = short-lived user writes, 4 = older and
//!                         5 = oldest relocated (3 to 5: SepBIT placement)
//!   8    8 alloc_seq      store-wide counter, +1 each time a segment is opened
//!  16   16 uuid           the device UUID (from the superblock)
//!  32    4 grain_bytes
//!  36    4 segment_index
//!  40    8 segment_bytes
//!  48    8 first_seq      the store's next record sequence number when opened
//!  56    4 reserved       0
//!  60    4 crc32c         over bytes 0..60
//! ```
//!
//! A segment with no valid header (zeroed, torn, another store's UUID) is
//! free; one whose magic and checksum hold but which names a version,
//! kind or stream this build does not know (or a non-zero reserved field)
//! is a newer build's, and the store refuses to open (the caller tells it
//! by [`uuid_field`]). Records carry the low 32 bits of their segment's `alloc_seq` (the
//! *stamp*), so records left from an earlier use of the same segment are
//! never mistaken for current ones.

use crate::bytes::*;
use crate::checksum::crc32c;
use crate::error::FormatError;
use crate::limits::SEGMENT_HEADER_BYTES;

/// "GSEG" as a little-endian u32.
pub const SEGMENT_MAGIC: u32 = u32::from_le_bytes(*b"GSEG");
/// The segment header version this build writes and reads.
pub const SEGMENT_VERSION: u16 = 1;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = OFF_MAGIC + 4;
const OFF_KIND: usize = OFF_VERSION + 2;
const OFF_STREAM: usize = OFF_KIND + 1;
const OFF_ALLOC_SEQ: usize = OFF_STREAM + 1;
const OFF_UUID: usize = OFF_ALLOC_SEQ + 8;
const OFF_GRAIN: usize = OFF_UUID + 16;
const OFF_INDEX: usize = OFF_GRAIN + 4;
const OFF_SEGMENT_BYTES: usize = OFF_INDEX + 4;
const OFF_FIRST_SEQ: usize = OFF_SEGMENT_BYTES + 8;
const OFF_RESERVED: usize = OFF_FIRST_SEQ + 8;
const OFF_CRC: usize = OFF_RESERVED + 4;
const _: () = assert!(OFF_CRC + 4 == SEGMENT_HEADER_BYTES);

/// The store UUID at its place in a segment header `b` (at least
/// [`SEGMENT_HEADER_BYTES`]), whether or not the header decodes: tells a
/// header of this store that names what this build does not know from
/// another store's leftovers.
pub fn uuid_field(b: &[u8]) -> [u8; 16] {
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&b[OFF_UUID..OFF_UUID + 16]);
    uuid
}

/// What a segment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentKind {
    /// Records of the key-value log.
    Kv = 1,
    /// An index checkpoint.
    Index = 2,
    /// Reclaimed by GC; holds nothing current.
    Free = 3,
}

/// Which writer appends to a KV segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// PUTs and DELETEs from users.
    User = 0,
    /// Records relocated by GC.
    Relocation = 1,
    /// Records GC relocated again out of a segment it had written itself
    /// (they survived two collections: cold data), kept apart from those
    /// relocated for the first time.
    Cold = 2,
    /// User PUTs expected to die young (SepBIT placement): overwrites of a
    /// version that itself lived shorter than a recent segment's lifetime.
    /// The other user writes stay in [`Stream::User`].
    UserShort = 3,
    /// SepBIT placement: records GC relocates out of a segment that is not
    /// short-lived user writes, aged between 4 and 16 times the short-lived
    /// stream's segment lifetime (younger ones go to [`Stream::Cold`]).
    Older = 4,
    /// SepBIT placement: such records older than that.
    Oldest = 5,
}

impl Stream {
    /// Every stream, in their numbers' order.
    pub const ALL: [Stream; 6] =
        [Stream::User, Stream::Relocation, Stream::Cold, Stream::UserShort, Stream::Older, Stream::Oldest];

    /// Whether user writes (rather than GC) append to the stream.
    pub fn is_user(self) -> bool {
        matches!(self, Stream::User | Stream::UserShort)
    }
}

/// The decoded segment header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentHeader {
    pub kind: SegmentKind,
    pub stream: Stream,
    pub alloc_seq: u64,
    pub uuid: [u8; 16],
    pub grain_bytes: u32,
    pub segment_index: u32,
    pub segment_bytes: u64,
    pub first_seq: u64,
}

impl SegmentHeader {
    /// The stamp records written into this segment carry.
    pub fn stamp(&self) -> u32 {
        self.alloc_seq as u32
    }

    /// Encode into the first [`SEGMENT_HEADER_BYTES`] of `out`.
    pub fn encode(&self, out: &mut [u8]) {
        let b = &mut out[..SEGMENT_HEADER_BYTES];
        b.fill(0);
        put_u32(b, OFF_MAGIC, SEGMENT_MAGIC);
        put_u16(b, OFF_VERSION, SEGMENT_VERSION);
        b[OFF_KIND] = self.kind as u8;
        b[OFF_STREAM] = self.stream as u8;
        put_u64(b, OFF_ALLOC_SEQ, self.alloc_seq);
        b[OFF_UUID..OFF_UUID + 16].copy_from_slice(&self.uuid);
        put_u32(b, OFF_GRAIN, self.grain_bytes);
        put_u32(b, OFF_INDEX, self.segment_index);
        put_u64(b, OFF_SEGMENT_BYTES, self.segment_bytes);
        put_u64(b, OFF_FIRST_SEQ, self.first_seq);
        let crc = crc32c(&b[..OFF_CRC]);
        put_u32(b, OFF_CRC, crc);
    }

    /// Decode and validate a header. A zeroed grain is reported as
    /// [`FormatError::BadMagic`] with `found == 0`, which callers treat as a
    /// never-used segment.
    pub fn decode(b: &[u8]) -> Result<SegmentHeader, FormatError> {
        const W: &str = "segment header";
        if b.len() < SEGMENT_HEADER_BYTES {
            return Err(FormatError::Truncated { what: W, need: SEGMENT_HEADER_BYTES, have: b.len() });
        }
        let magic = u32_at(b, OFF_MAGIC);
        if magic != SEGMENT_MAGIC {
            return Err(FormatError::BadMagic { what: W, found: magic as u64 });
        }
        let stored = u32_at(b, OFF_CRC);
        let computed = crc32c(&b[..OFF_CRC]);
        if stored != computed {
            return Err(FormatError::Checksum { what: W, stored, computed });
        }
        let version = u16_at(b, OFF_VERSION);
        if version != SEGMENT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: W,
                found: version as u32,
                supported: SEGMENT_VERSION as u32,
            });
        }
        let kind = match b[OFF_KIND] {
            1 => SegmentKind::Kv,
            2 => SegmentKind::Index,
            3 => SegmentKind::Free,
            k => return Err(FormatError::BadField { what: W, field: "kind", value: k as u64 }),
        };
        let stream = match b[OFF_STREAM] {
            0 => Stream::User,
            1 => Stream::Relocation,
            2 => Stream::Cold,
            3 => Stream::UserShort,
            4 => Stream::Older,
            5 => Stream::Oldest,
            s => return Err(FormatError::BadField { what: W, field: "stream", value: s as u64 }),
        };
        if u32_at(b, OFF_RESERVED) != 0 {
            return Err(FormatError::BadField { what: W, field: "reserved", value: u32_at(b, OFF_RESERVED) as u64 });
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[OFF_UUID..OFF_UUID + 16]);
        Ok(SegmentHeader {
            kind,
            stream,
            alloc_seq: u64_at(b, OFF_ALLOC_SEQ),
            uuid,
            grain_bytes: u32_at(b, OFF_GRAIN),
            segment_index: u32_at(b, OFF_INDEX),
            segment_bytes: u64_at(b, OFF_SEGMENT_BYTES),
            first_seq: u64_at(b, OFF_FIRST_SEQ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SegmentHeader {
        SegmentHeader {
            kind: SegmentKind::Kv,
            stream: Stream::User,
            alloc_seq: 0x1_0000_0005,
            uuid: [9; 16],
            grain_bytes: 4096,
            segment_index: 17,
            segment_bytes: 1 << 30,
            first_seq: 99,
        }
    }

    #[test]
    fn round_trip_and_stamp() {
        let mut b = [0u8; 512];
        sample().encode(&mut b);
        let h = SegmentHeader::decode(&b).unwrap();
        assert_eq!(h, sample());
        assert_eq!(h.stamp(), 5);
    }

    #[test]
    fn every_stream_round_trips_and_an_unknown_one_is_refused() {
        for stream in Stream::ALL {
            let mut b = [0u8; 512];
            SegmentHeader { stream, ..sample() }.encode(&mut b);
            assert_eq!(SegmentHeader::decode(&b).unwrap().stream, stream);
        }
        let mut b = [0u8; 512];
        sample().encode(&mut b);
        b[OFF_STREAM] = Stream::ALL.len() as u8;
        let crc = crc32c(&b[..OFF_CRC]);
        put_u32(&mut b, OFF_CRC, crc);
        assert!(matches!(SegmentHeader::decode(&b), Err(FormatError::BadField { field: "stream", .. })));
    }

    #[test]
    fn zeroed_grain_is_bad_magic_zero() {
        assert_eq!(SegmentHeader::decode(&[0u8; 64]), Err(FormatError::BadMagic { what: "segment header", found: 0 }));
    }

    #[test]
    fn rejects_corruption_and_unknown_kind() {
        let mut b = [0u8; 512];
        sample().encode(&mut b);
        let mut c = b;
        c[20] ^= 0x40;
        assert!(matches!(SegmentHeader::decode(&c), Err(FormatError::Checksum { .. })));
        let mut k = b;
        k[OFF_KIND] = 9;
        let crc = crc32c(&k[..OFF_CRC]);
        put_u32(&mut k, OFF_CRC, crc);
        assert!(matches!(SegmentHeader::decode(&k), Err(FormatError::BadField { field: "kind", .. })));
    }
}
