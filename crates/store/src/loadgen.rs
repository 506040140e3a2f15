//! Generated keys and values: what `granary load` writes, what the crash
//! drills check it acknowledged, and what the benchmarks load. Kept in the
//! engine crate so that the `granary` binary and the benchmarks share them
//! without one depending on the other.
//!
//! Key `i` is `key-<i, 12 digits>`; value `(i, round)` repeats `i:round:`
//! to the requested length, so a value names the key and the round that
//! wrote it, and a value that was never written cannot pass for one.

/// The key of item `i`.
pub fn load_key(i: u64) -> Vec<u8> {
    format!("key-{i:012}").into_bytes()
}

/// The value item `i` gets in `round`: `len` bytes (at least the tag's).
pub fn load_value(i: u64, round: u64, len: usize) -> Vec<u8> {
    let tag = format!("{i}:{round}:");
    tag.bytes().cycle().take(len.max(tag.len())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_name_key_and_round() {
        assert_eq!(load_key(7), b"key-000000000007");
        assert_eq!(load_value(7, 3, 10), b"7:3:7:3:7:");
        assert_ne!(load_value(7, 3, 100), load_value(7, 4, 100));
        assert_ne!(load_value(7, 3, 100), load_value(8, 3, 100));
        assert_eq!(load_value(123, 45, 0), b"123:45:");
    }
}
