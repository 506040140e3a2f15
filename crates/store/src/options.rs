//! Options for creating and opening a store, and the default geometry.

use granary_format::limits::*;
use granary_format::superblock::{INDEX_TABLE_LOG2_MAX, INDEX_TABLE_LOG2_MIN};
use granary_index::TABLES_LOG2_MAX;

/// When a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// When the direct write completes: the record is on the device and
    /// survives a process crash; a drive with a volatile write cache and no
    /// power-loss protection may still lose it on power failure.
    #[default]
    Direct,
    /// After the write, an fdatasync: the record survives power loss too.
    Flush,
}

/// Geometry chosen when a store is created. `None` picks the default.
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    /// 512 or 4096; default: the device's block size (at least 512).
    pub grain_bytes: Option<u32>,
    /// Power of two; default: 1/64 of the device, between 1 MiB and 1 GiB.
    pub segment_bytes: Option<u64>,
    /// log2 of the slots per index table; default: enough for one record per
    /// grain of the device at 75% occupancy with 256 tables.
    pub index_table_log2: Option<u32>,
}

/// Options for an open store.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    pub durability: Durability,
}

/// Default segment size for a data area of `data_bytes`.
pub fn default_segment_bytes(data_bytes: u64) -> u64 {
    let target = (data_bytes / SEGMENT_COUNT_DEFAULT_MIN).max(1);
    let pow = 1u64 << (63 - target.leading_zeros());
    pow.clamp(1 << 20, SEGMENT_BYTES_DEFAULT_MAX)
}

/// Default index table size (log2 of slots) for `data_bytes` of `grain_bytes` grains.
pub fn default_index_table_log2(data_bytes: u64, grain_bytes: u32) -> u32 {
    let max_records = data_bytes / grain_bytes as u64;
    let per_table = (max_records >> TABLES_LOG2_MAX) * 4 / 3;
    let log2 = 64 - per_table.max(1).leading_zeros();
    log2.clamp(INDEX_TABLE_LOG2_MIN, INDEX_TABLE_LOG2_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_scale_with_device() {
        assert_eq!(default_segment_bytes(1 << 30), 16 << 20);
        assert_eq!(default_segment_bytes(8 << 20), 1 << 20);
        assert_eq!(default_segment_bytes(1 << 50), 1 << 30);
        // 1 GiB of 512 B grains: 2 Mi records over 256 tables at 75% -> 2^14 slots.
        assert_eq!(default_index_table_log2(1 << 30, 512), 14);
        assert_eq!(
            default_index_table_log2(1 << 20, 4096),
            INDEX_TABLE_LOG2_MIN
        );
    }
}
