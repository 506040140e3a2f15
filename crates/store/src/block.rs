//! The keys of an export's blocks, for a block server (NBD) over a
//! [`NamespaceKind::Block`](crate::NamespaceKind::Block) namespace.
//!
//! Block `n` of an export (bytes `n * block_bytes ..` of the device) is the
//! value of key [`block_key`]`(n)` in the export's namespace: one block,
//! one value of exactly `block_bytes` bytes. A write of a block is a PUT,
//! a trim (discard) a DELETE, and a flush [`Store::sync`](crate::Store::sync).
//!
//! **Unwritten and trimmed blocks read as zeros**: a GET that finds no
//! value is a block of zeros (the server fills it; nothing is stored for
//! it). What such a GET costs the device:
//!
//! - A block never written (or trimmed and since forgotten by GC) has no
//!   index entry, so its GET does **no device IO**: `Core::find` reads only
//!   the records of the index's candidates for the key (entries of its
//!   home slot with its 12-bit key tag), and with none it answers "absent"
//!   at once; the index is in DRAM. The exception is another key with the
//!   same home slot and key tag, about 1 in 4096 per entry of that home
//!   slot: then one read of that record shows it is not this key.
//! - A block trimmed recently (a DELETE of a block that held a value)
//!   keeps a *tombstone* in the index until GC drops it (docs/ARCHITECTURE.md,
//!   "Garbage collection", tombstones' horizon), and a GET reads that
//!   tombstone's record (one grain) before answering "absent". So a trim
//!   frees the block's space at the next GC of its segment, and makes its
//!   reads IO-free only once GC has dropped the tombstone.
//!
//! A block's key is part of the format (an export written by one build is
//! read by another), so [`block_key`] never changes. It is big-endian, so
//! keys compare in block order byte by byte; the engine itself hashes keys
//! and keeps no order (a scan returns them in no particular order).

/// Bytes of a block's key.
pub const BLOCK_KEY_BYTES: usize = 8;

/// The key of block `n`: `n` as 8 big-endian bytes.
pub fn block_key(n: u64) -> [u8; BLOCK_KEY_BYTES] {
    n.to_be_bytes()
}

/// The block number a block key names; None for a key of any other
/// length (not a block's).
pub fn block_of(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_keys_are_big_endian_block_numbers() {
        assert_eq!(block_key(0), [0; 8]);
        assert_eq!(block_key(0x0102_0304_0506_0708), [1, 2, 3, 4, 5, 6, 7, 8]);
        for n in [0, 1, 255, 256, u64::MAX] {
            assert_eq!(block_of(&block_key(n)), Some(n));
        }
        assert_eq!(block_of(b"short"), None);
    }
}
