//! The 8-byte index entry: `neigh_off:5 | tag:8 | fp:4 | hint:2 | kv_size:9 | pba:36`.
//!
//! From the most significant bit: the offset of the entry from its home slot
//! (0..32), the key's 8-bit tag and 4 more fingerprint bits (together the
//! 12-bit *key tag*, see `granary_format::hash`), two bits that belong to the
//! slot rather than the entry (the hop hint of the neighbourhood homed at
//! the slot, kept by `table`; always 0 in an `Entry`), the record size in
//! grains, and the grain address of the record. `pba` all ones (with every other field zero) is a
//! free slot. `kv_size == 0` marks a deleted key: the entry points at its
//! tombstone record. `kv_size == KV_SIZE_GRAINS_MAX` means "this many grains
//! or more": the reader learns the real size from the record header.

use granary_format::limits::{FP_BITS, HINT_BITS, KV_SIZE_BITS, KV_SIZE_GRAINS_MAX, PBA_BITS, PBA_MAX};

const PBA_SHIFT: u32 = 0;
const SIZE_SHIFT: u32 = PBA_SHIFT + PBA_BITS;
/// Where a slot's hop hint sits in its stored word.
pub(crate) const HINT_SHIFT: u32 = SIZE_SHIFT + KV_SIZE_BITS;
/// The hop hint bits of a stored slot word.
pub(crate) const HINT_MASK: u64 = ((1 << HINT_BITS) - 1) << HINT_SHIFT;
/// Where the key tag (tag and fp) starts.
pub(crate) const KTAG_SHIFT: u32 = HINT_SHIFT + HINT_BITS;
const TAG_SHIFT: u32 = KTAG_SHIFT + FP_BITS;
pub(crate) const OFF_SHIFT: u32 = TAG_SHIFT + 8;
/// The offset and key tag fields.
pub(crate) const OFF_TAG_MASK: u64 = !0 << KTAG_SHIFT;
const KTAG_MASK: u64 = (1 << (8 + FP_BITS)) - 1;
const _: () = assert!(OFF_SHIFT + 5 == 64);

pub(crate) const PBA_MASK: u64 = (1 << PBA_BITS) - 1;
const SIZE_MASK: u64 = (1 << KV_SIZE_BITS) - 1;

/// One slot of a hopscotch table.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Entry(pub u64);

impl Entry {
    /// The free slot.
    pub const FREE: Entry = Entry(PBA_MASK);

    /// Build an entry from a 12-bit key tag (`granary_format::hash::key_tag`).
    /// `kv_size` is clamped to [`KV_SIZE_GRAINS_MAX`].
    pub fn new(neigh_off: u32, key_tag: u16, kv_size: u64, pba: u64) -> Entry {
        assert!(neigh_off < 32, "neigh_off out of range");
        assert!(pba <= PBA_MAX, "pba out of range");
        assert!((key_tag as u64) <= KTAG_MASK, "key tag out of range");
        let size = kv_size.min(KV_SIZE_GRAINS_MAX as u64);
        Entry(((neigh_off as u64) << OFF_SHIFT) | ((key_tag as u64) << KTAG_SHIFT) | (size << SIZE_SHIFT) | pba)
    }

    /// Whether the hop hint bits, which only a table slot may carry, are 0:
    /// what a checkpoint loader checks before it trusts an entry.
    pub fn is_well_formed(self) -> bool {
        self.0 & HINT_MASK == 0
    }

    pub fn is_free(self) -> bool {
        self == Entry::FREE
    }
    pub fn neigh_off(self) -> u32 {
        (self.0 >> OFF_SHIFT) as u32
    }
    /// The 8-bit tag (it picks the table).
    pub fn tag(self) -> u8 {
        (self.0 >> TAG_SHIFT) as u8
    }
    /// The 12-bit key tag: tag and fp.
    pub fn key_tag(self) -> u16 {
        ((self.0 >> KTAG_SHIFT) & KTAG_MASK) as u16
    }
    /// Record size in grains; 0 = tombstone; [`KV_SIZE_GRAINS_MAX`] = that or more.
    pub fn kv_size(self) -> u32 {
        ((self.0 >> SIZE_SHIFT) & SIZE_MASK) as u32
    }
    pub fn pba(self) -> u64 {
        self.0 & PBA_MASK
    }
    pub fn is_tombstone(self) -> bool {
        !self.is_free() && self.kv_size() == 0
    }
    /// The same entry at another offset from its home.
    pub fn with_neigh_off(self, neigh_off: u32) -> Entry {
        assert!(neigh_off < 32);
        Entry((self.0 & !(0x1f << OFF_SHIFT)) | ((neigh_off as u64) << OFF_SHIFT))
    }
    /// Whether `other` is this entry, wherever it sits from its home (an
    /// insert or a grow may have moved it since it was read): the same
    /// record, key tag and size.
    pub fn same_record(self, other: Entry) -> bool {
        self.with_neigh_off(0) == other.with_neigh_off(0)
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_free() {
            return write!(f, "Entry(free)");
        }
        write!(
            f,
            "Entry(off={}, key_tag={:#05x}, size={}, pba={})",
            self.neigh_off(),
            self.key_tag(),
            self.kv_size(),
            self.pba()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_moved_from_its_home_is_the_same_record() {
        let e = Entry::new(3, 0xABC, 10, 77);
        assert!(e.same_record(e.with_neigh_off(9)));
        assert!(!e.same_record(Entry::new(3, 0xABC, 10, 78)));
        assert!(!e.same_record(Entry::new(3, 0xABD, 10, 77)));
        assert!(!e.same_record(Entry::new(3, 0xABC, 11, 77)));
    }

    #[test]
    fn fields_round_trip() {
        let e = Entry::new(31, 0xABC, 510, PBA_MAX);
        assert_eq!((e.neigh_off(), e.tag(), e.key_tag(), e.kv_size(), e.pba()), (31, 0xAB, 0xABC, 510, PBA_MAX));
        assert!(!e.is_free() && !e.is_tombstone() && e.is_well_formed());
        let e = e.with_neigh_off(3);
        assert_eq!((e.neigh_off(), e.tag(), e.key_tag(), e.kv_size(), e.pba()), (3, 0xAB, 0xABC, 510, PBA_MAX));
        // Every field at its largest, and the layout adds up to 64 bits.
        let e = Entry::new(31, 0xFFF, 1 << 20, PBA_MAX);
        assert_eq!((e.neigh_off(), e.key_tag(), e.kv_size(), e.pba()), (31, 0xFFF, KV_SIZE_GRAINS_MAX, PBA_MAX));
        assert_eq!(5 + 8 + FP_BITS + HINT_BITS + KV_SIZE_BITS + PBA_BITS, 64);
        assert!(e.is_well_formed(), "no field reaches the hint bits");
        assert!(!Entry(e.0 | HINT_MASK).is_well_formed());
    }

    #[test]
    fn large_sizes_clamp_and_zero_is_tombstone() {
        assert_eq!(Entry::new(0, 1, 1 << 20, 5).kv_size(), KV_SIZE_GRAINS_MAX);
        assert!(Entry::new(0, 1, 0, 5).is_tombstone());
        assert!(!Entry::FREE.is_tombstone());
        // The smallest real entry is not free, even at pba 0.
        assert!(!Entry::new(0, 0, 1, 0).is_free());
    }
}
