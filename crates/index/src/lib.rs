//! The DRAM index (docs/ARCHITECTURE.md, "The index"): uDepot's design, key
//! fingerprints in hopscotch hash tables that grow online, incrementally.
//!
//! [`entry`] owns the 8-byte entry encoding; [`table`] owns one hopscotch
//! table and its lock regions; [`directory`] owns the array of tables, the
//! mapping from a key hash to a table and slot, and growth by doubling.
//!
//! The index never sees keys. It stores, per key, a tag and the location and
//! size of the key's newest record on the device; callers read the record to
//! compare the full key. Because an entry's home slot is `slot - neigh_off`
//! and its tag is stored, the fingerprint of every entry can be rebuilt
//! without IO, which is what lets tables split and entries move freely.

#![cfg_attr(loom, allow(dead_code, unused_imports))]

pub mod directory;
pub mod entry;
mod sync;
pub mod table;

pub use directory::{home_of, Candidates, Index, IndexConfig, IndexError, IndexStats};
pub use entry::Entry;

/// Neighbourhood size H: an entry lives within H slots of its home slot.
pub const NEIGHBOURHOOD: usize = 32;
/// Default slots per lock region.
pub const REGION_SLOTS_LOG2_DEFAULT: u32 = 13;
/// Largest directory: one table per value of the 8-bit tag.
pub const TABLES_LOG2_MAX: u32 = granary_format::hash::TAG_BITS;

const _: () = assert!(NEIGHBOURHOOD == 1 << 5, "neigh_off has 5 bits");
const _: () = assert!((1usize << REGION_SLOTS_LOG2_DEFAULT) >= NEIGHBOURHOOD);

#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(all(test, loom))]
mod loom_tests;
