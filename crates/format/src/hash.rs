//! The key hash and the fingerprint derived from it.
//!
//! The hash is xxh3-64 with a seed the store keeps in its superblock
//! ([`KeyHasher`]): a random secret drawn at creation (hash algorithm 2,
//! [`KEY_HASH_ALGO_XXH3_64_SECRET`]), or, in stores created before secret
//! seeds, the fixed public [`KEY_HASH_SEED`] (algorithm 1). A client that
//! does not know the seed cannot compute keys of one fingerprint offline,
//! so it cannot crowd one (docs/SECURITY.md). Within a store the hash is
//! frozen: index checkpoints and the placement of every key depend on it,
//! so changing the function is a format change. [`tests::golden_values`]
//! pins it.
//!
//! xxh3 is not a keyed pseudo-random function: the secret seed defends
//! against keys chosen in advance, not against an attacker who can learn
//! the seed (it never leaves the store's device: no protocol, statistic
//! or log shows it).
//!
//! Bits of the hash, from the least significant (docs/ARCHITECTURE.md,
//! "The index"):
//! - bits 0..27: the home slot inside a table (only the table's low bits are
//!   used, `hash & (table_slots - 1)`);
//! - bits 27..35: the 8-bit tag; its low bits pick the table in the directory,
//!   all eight are kept in the index entry to filter candidates;
//! - bits 35..39: 4 more fingerprint bits (`fp`), kept in the index entry
//!   only to filter candidates: with many tables most tag bits are spent
//!   choosing the table.
//!
//! The *key tag* is the tag and fp together (12 bits). The 39-bit
//! fingerprint (slot bits + key tag) can be rebuilt from an entry's position
//! and key tag alone, which is what lets the index move entries without
//! reading keys from the device.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Key hash algorithm 1 in the superblock: xxh3-64 with the public
/// [`KEY_HASH_SEED`] (stores created before secret seeds).
pub const KEY_HASH_ALGO_XXH3_64: u32 = 1;
/// Key hash algorithm 2: xxh3-64 with the superblock's secret `hash_seed`.
pub const KEY_HASH_ALGO_XXH3_64_SECRET: u32 = 2;
/// The seed of algorithm 1. Never change it: it is part of the format.
pub const KEY_HASH_SEED: u64 = 0x6772_616e_6172_7931; // "granary1"
/// Number of hash bits used for the home slot inside one table.
pub const SLOT_BITS: u32 = 27;
/// Number of tag bits.
pub const TAG_BITS: u32 = 8;
/// Number of extra fingerprint bits above the tag.
pub const FP_BITS: u32 = crate::limits::FP_BITS;

/// A store's key hash: xxh3-64 with its seed (module docs). Its `Debug`
/// does not show the seed, so logging it keeps the secret.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyHasher {
    seed: u64,
}

impl KeyHasher {
    /// Algorithm 1's hash, with the public seed.
    pub const PUBLIC: KeyHasher = KeyHasher { seed: KEY_HASH_SEED };

    /// Algorithm 2's hash with `seed`.
    pub const fn seeded(seed: u64) -> KeyHasher {
        KeyHasher { seed }
    }

    /// Hash a key.
    #[inline]
    pub fn hash(&self, key: &[u8]) -> u64 {
        xxh3_64_with_seed(key, self.seed)
    }

    /// The seed, to write into a superblock.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if *self == Self::PUBLIC { "KeyHasher(public seed)" } else { "KeyHasher(secret seed)" })
    }
}

/// Hash a key with the public seed (algorithm 1). A store hashes with its
/// own [`KeyHasher`]; this is for what must hash alike everywhere and
/// places nothing on a device (request conflict maps, benchmarks).
pub fn key_hash(key: &[u8]) -> u64 {
    KeyHasher::PUBLIC.hash(key)
}

/// The 27 slot bits of a hash.
pub fn slot_bits(hash: u64) -> u64 {
    hash & ((1 << SLOT_BITS) - 1)
}

/// The 8-bit tag of a hash.
pub fn tag(hash: u64) -> u8 {
    ((hash >> SLOT_BITS) & ((1 << TAG_BITS) - 1)) as u8
}

/// The 4 fingerprint bits above the tag.
pub fn fp(hash: u64) -> u8 {
    ((hash >> (SLOT_BITS + TAG_BITS)) & ((1 << FP_BITS) - 1)) as u8
}

/// The 12-bit key tag: the tag in the high 8 bits, fp in the low 4.
pub fn key_tag(hash: u64) -> u16 {
    ((tag(hash) as u16) << FP_BITS) | fp(hash) as u16
}

/// Rebuild the 39-bit fingerprint from a home slot and a key tag.
pub fn fingerprint(home_slot: u64, key_tag: u16) -> u64 {
    let tag = (key_tag >> FP_BITS) as u64;
    let fp = (key_tag & ((1 << FP_BITS) - 1)) as u64;
    (home_slot & ((1 << SLOT_BITS) - 1)) | (tag << SLOT_BITS) | (fp << (SLOT_BITS + TAG_BITS))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins the hash function: if this fails, the on-device format changed.
    /// The values were computed independently with Python's `xxhash`
    /// package (`xxh3_64_intdigest(key, seed=KEY_HASH_SEED)`).
    #[test]
    fn golden_values() {
        let golden: [(&[u8], u64); 4] = [
            (b"", 0x0956_782e_ac0a_3d9f),
            (b"a", 0x213e_4b21_89e8_ad76),
            (b"granary", 0x0e1a_d01e_2453_c983),
            (b"key:000000000042", 0xbbad_7c2b_29da_31e1),
        ];
        for (key, want) in golden {
            assert_eq!(key_hash(key), want, "hash of {:?}", String::from_utf8_lossy(key));
        }
    }

    /// A seeded hasher is xxh3-64 with that seed, and its Debug keeps the
    /// seed out.
    #[test]
    fn a_seeded_hasher_hashes_with_its_seed_and_does_not_show_it() {
        let h = KeyHasher::seeded(0x0123_4567_89ab_cdef);
        assert_eq!(h.hash(b"granary"), xxh3_64_with_seed(b"granary", 0x0123_4567_89ab_cdef));
        assert_ne!(h.hash(b"granary"), key_hash(b"granary"));
        assert_eq!(KeyHasher::seeded(KEY_HASH_SEED), KeyHasher::PUBLIC);
        let shown = format!("{h:?}");
        assert!(
            !shown.contains("123456789abcdef") && !shown.contains(&0x0123_4567_89ab_cdefu64.to_string()),
            "{shown}"
        );
    }

    #[test]
    fn fingerprint_round_trip() {
        for k in 0..1000u32 {
            let h = key_hash(&k.to_le_bytes());
            assert_eq!(fingerprint(slot_bits(h), key_tag(h)), h & ((1 << 39) - 1));
            assert_eq!((key_tag(h) >> 4) as u8, tag(h));
        }
    }
}
