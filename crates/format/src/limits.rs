//! Every bound of the format, as a named constant with its unit last, and the
//! relations between them checked at compile time.

/// Smallest key, in bytes.
pub const KEY_BYTES_MIN: usize = 1;
/// Largest key, in bytes (64 KiB).
pub const KEY_BYTES_MAX: usize = 64 * 1024;
/// Largest value, in bytes (4 GiB). A record must also fit in one segment,
/// so the effective limit of a store is `min(VALUE_BYTES_MAX, segment bytes -
/// segment header - record header - key)`.
pub const VALUE_BYTES_MAX: u64 = 4 * 1024 * 1024 * 1024;

/// Grain sizes a store may use (the device's logical block size or a multiple).
pub const GRAIN_BYTES_ALLOWED: [u32; 2] = [512, 4096];
/// Bytes of the superblock structure (one copy occupies one 4 KiB block).
pub const SUPERBLOCK_BYTES: usize = 128;
/// Device offsets of the two superblock copies.
pub const SUPERBLOCK_OFFSETS: [u64; 2] = [0, 4096];
/// Device offset where segment 0 starts; everything before holds superblocks.
pub const DATA_OFFSET_BYTES: u64 = 1024 * 1024;

/// Smallest segment (tests use small ones), in bytes.
pub const SEGMENT_BYTES_MIN: u64 = 64 * 1024;
/// Largest segment, in bytes. Large enough for a 4 GiB value.
pub const SEGMENT_BYTES_MAX: u64 = 8 * 1024 * 1024 * 1024;
/// Default segment size on large devices, in bytes.
pub const SEGMENT_BYTES_DEFAULT_MAX: u64 = 1024 * 1024 * 1024;
/// A device is split into at least this many segments by default.
pub const SEGMENT_COUNT_DEFAULT_MIN: u64 = 64;
/// Bytes of the segment header structure (it occupies the segment's first grain).
pub const SEGMENT_HEADER_BYTES: usize = 64;

/// Bytes of a record header.
pub const RECORD_HEADER_BYTES: usize = 48;

/// Bits of the grain address (pba) in an index entry: 2^36 grains, 32 TiB
/// with 512-byte grains and 256 TiB with 4 KiB grains.
pub const PBA_BITS: u32 = 36;
/// Extra fingerprint bits of the key hash kept in an index entry, beside
/// the 8-bit tag (which also picks the table, so filters less as the
/// directory grows): they cut the candidates a lookup must read by 16x.
pub const FP_BITS: u32 = 4;
/// Largest grain address; all ones marks a free index entry.
pub const PBA_MAX: u64 = (1 << PBA_BITS) - 2;
/// Bits of the record size (in grains) in an index entry.
pub const KV_SIZE_BITS: u32 = 9;
/// Bits of an index entry's slot word that belong to the slot, not the
/// entry: the hop hint of the neighbourhood whose home the slot is (how
/// many cache lines past the home's a lookup must read; see
/// `granary_index::table`). In checkpoints these bits are 0.
pub const HINT_BITS: u32 = 2;
/// Record sizes, in grains, at or above this value are stored as this value,
/// and the reader learns the real size from the record header (a second read).
pub const KV_SIZE_GRAINS_MAX: u32 = (1 << KV_SIZE_BITS) - 1;

const _: () = assert!(SUPERBLOCK_BYTES <= 512);
const _: () = assert!(SUPERBLOCK_OFFSETS[1] as usize >= SUPERBLOCK_BYTES);
const _: () = assert!(SUPERBLOCK_OFFSETS[1] + 4096 <= DATA_OFFSET_BYTES);
const _: () = assert!(SEGMENT_HEADER_BYTES <= 512);
const _: () = assert!(RECORD_HEADER_BYTES <= 512);
const _: () = assert!(SEGMENT_BYTES_MIN.is_power_of_two() && SEGMENT_BYTES_MAX.is_power_of_two());
const _: () = assert!(DATA_OFFSET_BYTES.is_multiple_of(4096));
// A 4 GiB value with the largest key fits in the largest segment.
const _: () = assert!(VALUE_BYTES_MAX + KEY_BYTES_MAX as u64 + RECORD_HEADER_BYTES as u64 + 4096 <= SEGMENT_BYTES_MAX);

/// Bytes of a record holding `key_len` and `value_len` bytes, before padding.
pub const fn record_bytes(key_len: usize, value_len: u64) -> u64 {
    RECORD_HEADER_BYTES as u64 + key_len as u64 + value_len
}

/// Whole grains needed for `bytes`.
pub const fn grains_for(bytes: u64, grain_bytes: u32) -> u64 {
    bytes.div_ceil(grain_bytes as u64)
}
