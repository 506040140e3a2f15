//! The superblock: the store's identity and geometry, kept in two copies.
//!
//! Layout (128 bytes, little-endian), at device offsets 0 and 4096:
//!
//! ```text
//! off size field
//!   0    8 magic            "GRANARY\0"
//!   8    4 format_version   2 (1 is read too: see below)
//!  12    4 flags            bit 0 = namespaces, bit 1 = batches, bit 2 =
//!                           segment summaries, bit 3 = SepBIT streams; others
//!                           zero (version 1: all zero)
//!  16   16 uuid             random, identifies the device
//!  32    4 grain_bytes      512 or 4096
//!  36    4 hash_algo        1 = xxh3-64 with seed KEY_HASH_SEED,
//!                           2 = xxh3-64 with seed hash_seed
//!  40    8 segment_bytes    power of two
//!  48    8 segment_count
//!  56    8 device_bytes     size of the device at creation
//!  64    4 index_table_homes home slots per index table
//!  68    4 reserved         0
//!  72    8 created_unix_ms
//!  80    8 hash_seed        algorithm 2: random, secret; algorithm 1: 0
//!  88   36 reserved         0
//! 124    4 crc32c           over bytes 0..124
//! ```
//!
//! The superblock is written at creation, both copies identical, and
//! rewritten to turn on a feature or to re-key (`granary rekey`) (copy A,
//! flush, copy B, flush; a re-key that finds copy B behind copy A writes B
//! alone), and by an open for writing that finds one copy behind the other
//! or failing its checksum or magic (rewritten from the one it read). Every
//! version keeps the magic at bytes 0..8, the version at 8..12 and the
//! CRC32C at 124..128 over the bytes before it, so a build can tell a
//! damaged copy from a newer one ([`version_field`]). A
//! reader accepts the first copy that decodes, so one torn or rotten copy
//! never bricks the store, and a crash during a rewrite leaves the feature
//! on or off, never half of it.
//!
//! Version 2 defines the feature flags; a version 1 superblock (written
//! before them) reads as version 2 with no flag set, and is written back as
//! version 1 until a feature is turned on. [`FLAG_NAMESPACES`]: the store
//! holds (or held) namespaces besides the default one, whose keys and
//! catalog an older build would take for the engine's own keys; such a
//! build refuses the store by its version.
//!
//! A store created with a secret hash seed (hash algorithm 2) is refused
//! by builds before it (its seed is in bytes they read as reserved, and
//! they know only algorithm 1); they could not place its keys.

use crate::bytes::*;
use crate::checksum::crc32c;
use crate::error::FormatError;
use crate::hash::{KeyHasher, KEY_HASH_ALGO_XXH3_64, KEY_HASH_ALGO_XXH3_64_SECRET};
use crate::limits::*;

/// "GRANARY\0" as a little-endian u64.
pub const SUPERBLOCK_MAGIC: u64 = u64::from_le_bytes(*b"GRANARY\0");
/// The superblock version this build writes.
pub const SUPERBLOCK_VERSION: u32 = 2;
/// The oldest superblock version this build reads.
pub const SUPERBLOCK_VERSION_MIN: u32 = 1;
/// Feature flag: namespaces (version 2).
pub const FLAG_NAMESPACES: u32 = 1;
/// Feature flag: atomic batches (version 2): record version 5 and commit
/// records ([`crate::batch`]) may be on the device.
pub const FLAG_BATCHES: u32 = 2;
/// Feature flag: segment summaries ([`crate::summary`]) may be in the
/// last grains of KV segments. A build without them would take a
/// segment's tail for unused room and could write records there under a
/// summary that no longer tells them.
pub const FLAG_SUMMARIES: u32 = 4;
/// Feature flag: segment headers may name SepBIT's streams (3 to 5,
/// [`crate::segment::Stream::UserShort`] and the older relocation
/// streams). A build without them would not decode those headers.
pub const FLAG_STREAMS: u32 = 8;
/// Every flag this build knows.
const FLAGS_KNOWN: u32 = FLAG_NAMESPACES | FLAG_BATCHES | FLAG_SUMMARIES | FLAG_STREAMS;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = OFF_MAGIC + 8;
const OFF_FLAGS: usize = OFF_VERSION + 4;
const OFF_UUID: usize = OFF_FLAGS + 4;
const OFF_GRAIN: usize = OFF_UUID + 16;
const OFF_HASH: usize = OFF_GRAIN + 4;
const OFF_SEGMENT_BYTES: usize = OFF_HASH + 4;
const OFF_SEGMENT_COUNT: usize = OFF_SEGMENT_BYTES + 8;
const OFF_DEVICE_BYTES: usize = OFF_SEGMENT_COUNT + 8;
const OFF_TABLE_HOMES: usize = OFF_DEVICE_BYTES + 8;
const OFF_RESERVED0: usize = OFF_TABLE_HOMES + 4;
const OFF_CREATED: usize = OFF_RESERVED0 + 4;
const OFF_HASH_SEED: usize = OFF_CREATED + 8;
const OFF_RESERVED1: usize = OFF_HASH_SEED + 8;
const OFF_CRC: usize = SUPERBLOCK_BYTES - 4;
const _: () = assert!(OFF_HASH_SEED == 80 && OFF_RESERVED1 == 88 && OFF_CRC == 124);

/// Fewest home slots per index table.
pub const INDEX_TABLE_HOMES_MIN: u32 = 64;
/// Most home slots per index table: the 27 slot bits of the hash.
pub const INDEX_TABLE_HOMES_MAX: u32 = 1 << crate::hash::SLOT_BITS;

/// The decoded superblock (its `Debug` leaves the hash seed out).
#[derive(Clone, PartialEq, Eq)]
pub struct Superblock {
    /// The version it was read as or will be written as: 1 for a store
    /// written before feature flags existed (and not changed since),
    /// [`SUPERBLOCK_VERSION`] otherwise.
    pub version: u32,
    /// Feature flags ([`FLAG_NAMESPACES`]); none in version 1.
    pub flags: u32,
    pub uuid: [u8; 16],
    pub grain_bytes: u32,
    /// [`KEY_HASH_ALGO_XXH3_64`] or [`KEY_HASH_ALGO_XXH3_64_SECRET`].
    pub hash_algo: u32,
    /// The key hash's seed under algorithm 2 (a secret: never shown); 0
    /// under algorithm 1.
    pub hash_seed: u64,
    pub segment_bytes: u64,
    pub segment_count: u64,
    pub device_bytes: u64,
    pub index_table_homes: u32,
    pub created_unix_ms: u64,
}

impl std::fmt::Debug for Superblock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Superblock")
            .field("version", &self.version)
            .field("flags", &self.flags)
            .field("uuid", &self.uuid)
            .field("grain_bytes", &self.grain_bytes)
            .field("hash_algo", &self.hash_algo)
            .field("hash_seed", &if self.hash_seed == 0 { "0" } else { "(secret)" })
            .field("segment_bytes", &self.segment_bytes)
            .field("segment_count", &self.segment_count)
            .field("device_bytes", &self.device_bytes)
            .field("index_table_homes", &self.index_table_homes)
            .field("created_unix_ms", &self.created_unix_ms)
            .finish()
    }
}

/// The version field of a superblock copy, whether or not the copy
/// decodes (every version keeps it at bytes 8..12): a copy that fails its
/// checksum but names a newer version may be a newer build's format.
/// 0 for fewer than 12 bytes.
pub fn version_field(b: &[u8]) -> u32 {
    b.get(OFF_VERSION..OFF_VERSION + 4).map_or(0, |_| u32_at(b, OFF_VERSION))
}

impl Superblock {
    /// Encode into the first [`SUPERBLOCK_BYTES`] of `out`.
    pub fn encode(&self, out: &mut [u8]) {
        assert!(out.len() >= SUPERBLOCK_BYTES);
        let b = &mut out[..SUPERBLOCK_BYTES];
        b.fill(0);
        put_u64(b, OFF_MAGIC, SUPERBLOCK_MAGIC);
        assert!(self.version == SUPERBLOCK_VERSION || (self.version == 1 && self.flags == 0));
        put_u32(b, OFF_VERSION, self.version);
        put_u32(b, OFF_FLAGS, self.flags);
        b[OFF_UUID..OFF_UUID + 16].copy_from_slice(&self.uuid);
        put_u32(b, OFF_GRAIN, self.grain_bytes);
        put_u32(b, OFF_HASH, self.hash_algo);
        put_u64(b, OFF_SEGMENT_BYTES, self.segment_bytes);
        put_u64(b, OFF_SEGMENT_COUNT, self.segment_count);
        put_u64(b, OFF_DEVICE_BYTES, self.device_bytes);
        put_u32(b, OFF_TABLE_HOMES, self.index_table_homes);
        put_u64(b, OFF_CREATED, self.created_unix_ms);
        put_u64(b, OFF_HASH_SEED, self.hash_seed);
        let crc = crc32c(&b[..OFF_CRC]);
        put_u32(b, OFF_CRC, crc);
    }

    /// Decode and validate one copy.
    pub fn decode(b: &[u8]) -> Result<Superblock, FormatError> {
        const W: &str = "superblock";
        if b.len() < SUPERBLOCK_BYTES {
            return Err(FormatError::Truncated { what: W, need: SUPERBLOCK_BYTES, have: b.len() });
        }
        let magic = u64_at(b, OFF_MAGIC);
        if magic != SUPERBLOCK_MAGIC {
            return Err(FormatError::BadMagic { what: W, found: magic });
        }
        let stored = u32_at(b, OFF_CRC);
        let computed = crc32c(&b[..OFF_CRC]);
        if stored != computed {
            return Err(FormatError::Checksum { what: W, stored, computed });
        }
        let version = u32_at(b, OFF_VERSION);
        if !(SUPERBLOCK_VERSION_MIN..=SUPERBLOCK_VERSION).contains(&version) {
            return Err(FormatError::UnsupportedVersion { what: W, found: version, supported: SUPERBLOCK_VERSION });
        }
        let bad = |field, value: u64| Err(FormatError::BadField { what: W, field, value });
        let flags = u32_at(b, OFF_FLAGS);
        let known = if version == 1 { 0 } else { FLAGS_KNOWN };
        if flags & !known != 0 {
            return bad("flags", flags as u64);
        }
        if u32_at(b, OFF_RESERVED0) != 0 || b[OFF_RESERVED1..OFF_CRC].iter().any(|&x| x != 0) {
            return bad("reserved", 1);
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[OFF_UUID..OFF_UUID + 16]);
        let sb = Superblock {
            version,
            flags,
            uuid,
            grain_bytes: u32_at(b, OFF_GRAIN),
            hash_algo: u32_at(b, OFF_HASH),
            hash_seed: u64_at(b, OFF_HASH_SEED),
            segment_bytes: u64_at(b, OFF_SEGMENT_BYTES),
            segment_count: u64_at(b, OFF_SEGMENT_COUNT),
            device_bytes: u64_at(b, OFF_DEVICE_BYTES),
            index_table_homes: u32_at(b, OFF_TABLE_HOMES),
            created_unix_ms: u64_at(b, OFF_CREATED),
        };
        if let Err((field, value)) = sb.validate() {
            return bad(field, value);
        }
        Ok(sb)
    }

    /// Check the geometry; returns the first field that is out of range.
    pub fn validate(&self) -> Result<(), (&'static str, u64)> {
        if !GRAIN_BYTES_ALLOWED.contains(&self.grain_bytes) {
            return Err(("grain_bytes", self.grain_bytes as u64));
        }
        match self.hash_algo {
            // Algorithm 1's superblocks had these bytes reserved.
            KEY_HASH_ALGO_XXH3_64 if self.hash_seed != 0 => return Err(("hash_seed", 1)),
            KEY_HASH_ALGO_XXH3_64 => {}
            // Secret seeds came after version 2: no version 1 store has one.
            KEY_HASH_ALGO_XXH3_64_SECRET if self.version >= 2 => {}
            other => return Err(("hash_algo", other as u64)),
        }
        if !self.segment_bytes.is_power_of_two()
            || !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&self.segment_bytes)
            || self.segment_bytes < self.grain_bytes as u64 * 4
        {
            return Err(("segment_bytes", self.segment_bytes));
        }
        if self.segment_count == 0 || self.segment_count > u32::MAX as u64 {
            return Err(("segment_count", self.segment_count));
        }
        let end = self.segment_count.checked_mul(self.segment_bytes).and_then(|x| x.checked_add(DATA_OFFSET_BYTES));
        match end {
            Some(end) if end <= self.device_bytes => {}
            _ => return Err(("device_bytes", self.device_bytes)),
        }
        if self.device_bytes / self.grain_bytes as u64 > PBA_MAX {
            return Err(("device_bytes", self.device_bytes));
        }
        if !(INDEX_TABLE_HOMES_MIN..=INDEX_TABLE_HOMES_MAX).contains(&self.index_table_homes) {
            return Err(("index_table_homes", self.index_table_homes as u64));
        }
        Ok(())
    }

    /// The store's key hash (its algorithm and seed).
    pub fn key_hasher(&self) -> KeyHasher {
        match self.hash_algo {
            KEY_HASH_ALGO_XXH3_64_SECRET => KeyHasher::seeded(self.hash_seed),
            _ => KeyHasher::PUBLIC,
        }
    }

    /// What a checkpoint placed by this store's key hash records
    /// (`Manifest::hash_check`): 0 under the public seed (as checkpoints
    /// written before the field), else the hash of a fixed key with the
    /// secret seed, never 0. On the device only, as the seed is.
    pub fn hash_check(&self) -> u64 {
        match self.hash_algo {
            KEY_HASH_ALGO_XXH3_64_SECRET => self.key_hasher().hash(b"granary: checkpoint hash check") | 1,
            _ => 0,
        }
    }

    /// Device offset of segment `seg`.
    pub fn segment_offset(&self, seg: u32) -> u64 {
        DATA_OFFSET_BYTES + seg as u64 * self.segment_bytes
    }

    /// Grains per segment.
    pub fn segment_grains(&self) -> u64 {
        self.segment_bytes / self.grain_bytes as u64
    }

    /// The segment that holds grain address `pba`.
    pub fn segment_of(&self, pba: u64) -> u32 {
        ((pba * self.grain_bytes as u64 - DATA_OFFSET_BYTES) / self.segment_bytes) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            version: SUPERBLOCK_VERSION,
            flags: 0,
            uuid: [7; 16],
            grain_bytes: 512,
            hash_algo: KEY_HASH_ALGO_XXH3_64_SECRET,
            hash_seed: 0x5eed_5eed_5eed_5eed,
            segment_bytes: 1 << 20,
            segment_count: 63,
            device_bytes: 64 << 20,
            index_table_homes: 4000,
            created_unix_ms: 1_700_000_000_000,
        }
    }

    #[test]
    fn round_trip() {
        let mut buf = [0u8; 512];
        sample().encode(&mut buf);
        assert_eq!(Superblock::decode(&buf).unwrap(), sample());
    }

    #[test]
    fn rejects_flipped_byte_and_unknown_version() {
        let mut buf = [0u8; 512];
        sample().encode(&mut buf);
        let mut flipped = buf;
        flipped[40] ^= 1;
        assert!(matches!(Superblock::decode(&flipped), Err(FormatError::Checksum { .. })));

        let mut newer = buf;
        put_u32(&mut newer, OFF_VERSION, 3);
        let crc = crc32c(&newer[..OFF_CRC]);
        put_u32(&mut newer, OFF_CRC, crc);
        let err = Superblock::decode(&newer).unwrap_err();
        assert!(matches!(err, FormatError::UnsupportedVersion { found: 3, .. }), "{err}");
        assert!(err.to_string().contains("version 3"));
    }

    /// Rewrite the version and flags of an encoded copy (checksum fixed).
    fn with(buf: &[u8; 512], version: u32, flags: u32) -> [u8; 512] {
        let mut b = *buf;
        put_u32(&mut b, OFF_VERSION, version);
        put_u32(&mut b, OFF_FLAGS, flags);
        let crc = crc32c(&b[..OFF_CRC]);
        put_u32(&mut b, OFF_CRC, crc);
        b
    }

    #[test]
    fn version_1_reads_with_no_flags_and_flags_need_version_2() {
        // Version 1 knows only the public seed (algorithm 1).
        let public = Superblock { hash_algo: KEY_HASH_ALGO_XXH3_64, hash_seed: 0, ..sample() };
        let mut buf = [0u8; 512];
        public.encode(&mut buf);
        let v1 = Superblock::decode(&with(&buf, 1, 0)).unwrap();
        assert_eq!((v1.version, v1.flags), (1, 0));
        // Written back as it was read.
        let mut again = [0u8; 512];
        v1.encode(&mut again);
        assert_eq!(again, with(&buf, 1, 0));
        // A flag in version 1 is not a known feature.
        let err = Superblock::decode(&with(&buf, 1, FLAG_NAMESPACES)).unwrap_err();
        assert!(matches!(err, FormatError::BadField { field: "flags", .. }), "{err}");
        let v2 = Superblock::decode(&with(&buf, 2, FLAG_NAMESPACES)).unwrap();
        assert_eq!(v2.flags, FLAG_NAMESPACES);
        let v2 = Superblock::decode(&with(&buf, 2, FLAG_SUMMARIES)).unwrap();
        assert_eq!(v2.flags, FLAG_SUMMARIES);
        let v2 = Superblock::decode(&with(&buf, 2, FLAG_STREAMS)).unwrap();
        assert_eq!(v2.flags, FLAG_STREAMS);
        let err = Superblock::decode(&with(&buf, 2, 16)).unwrap_err();
        assert!(matches!(err, FormatError::BadField { field: "flags", value: 16, .. }), "{err}");
        // A secret seed came after version 2: version 1 with it is refused.
        let mut secret = [0u8; 512];
        sample().encode(&mut secret);
        let err = Superblock::decode(&with(&secret, 1, 0)).unwrap_err();
        assert!(matches!(err, FormatError::BadField { field: "hash_algo", value: 2, .. }), "{err}");
    }

    /// Algorithm 2 hashes with the seed it stores; algorithm 1 with the
    /// public one, and its seed bytes must be zero (they were reserved);
    /// an algorithm this build does not know is refused by name. The seed
    /// is not in the superblock's Debug.
    #[test]
    fn the_hash_seed_goes_with_its_algorithm() {
        let sb = sample();
        assert_eq!(sb.key_hasher(), KeyHasher::seeded(0x5eed_5eed_5eed_5eed));
        assert!(!format!("{sb:?}").contains(&0x5eed_5eed_5eed_5eedu64.to_string()));
        assert!(!format!("{sb:?}").to_lowercase().contains("5eed"));
        let mut public = sample();
        public.hash_algo = KEY_HASH_ALGO_XXH3_64;
        assert_eq!(public.validate(), Err(("hash_seed", 1)));
        public.hash_seed = 0;
        let mut buf = [0u8; 512];
        public.encode(&mut buf);
        assert_eq!(Superblock::decode(&buf).unwrap().key_hasher(), KeyHasher::PUBLIC);
        let mut unknown = sample();
        unknown.hash_algo = 3;
        unknown.encode(&mut buf);
        let err = Superblock::decode(&buf).unwrap_err();
        assert!(matches!(err, FormatError::BadField { field: "hash_algo", value: 3, .. }), "{err}");
    }

    #[test]
    fn rejects_bad_geometry() {
        let mut sb = sample();
        sb.segment_count = 64; // 1 MiB + 64 MiB > 64 MiB
        assert_eq!(sb.validate(), Err(("device_bytes", 64 << 20)));
        let mut sb = sample();
        sb.grain_bytes = 1024;
        assert!(sb.validate().is_err());
    }

    #[test]
    fn segment_addressing() {
        let sb = sample();
        let pba = (sb.segment_offset(3) + 5 * 512) / 512;
        assert_eq!(sb.segment_of(pba), 3);
    }
}
