//! Granary's on-device formats, with no IO.
//!
//! This crate owns every byte layout that reaches the device: the
//! [`superblock`], the [`segment`] header, the [`record`] codec, index
//! [`checkpoint`] manifests and items, segment [`summary`] regions, the
//! [`checksum`] and the key [`hash`], and the [`limits`] that bound them.
//! `docs/FORMAT.md` is the prose version of this crate; offsets in code are
//! built from the previous offset so the two read alike.
//!
//! Everything is little-endian. Every decoder rejects what it does not
//! understand (unknown magic, version, flag bits, or reserved bytes that are
//! not zero) with a [`FormatError`] that says which field was wrong.

pub mod batch;
mod bytes;
pub mod checkpoint;
pub mod checksum;
pub mod error;
pub mod hash;
pub mod limits;
pub mod record;
pub mod segment;
pub mod summary;
pub mod superblock;

pub use error::FormatError;
pub use record::{RecordHeader, RecordKind};
pub use segment::{SegmentHeader, SegmentKind};
pub use superblock::Superblock;
