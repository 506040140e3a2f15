//! Granary's embedded key-value engine.
//!
//! A [`Store`] keeps one [`granary_index::Index`] entry per key in DRAM and
//! every record on a [`granary_io::Device`]. Module roles:
//!
//! - [`error`]: the engine's error type.
//! - [`options`]: create- and open-time options, geometry defaults.
//! - `space`: segments and grains: sequential allocation in the open
//!   segment, per-segment live bytes and stamps.
//! - `log`: reading the log back: segment headers, the segment scanner
//!   and its read-ahead (used by recovery, GC, checkpoints and verify).
//! - `recover`: rebuilding the index on open: checkpoint load, then a
//!   parallel scan of the log it does not cover (or of all of it).
//! - [`checkpoint`]: index checkpoints, written in the background and at
//!   close; finding the newest valid one.
//! - `gc`: reclaiming segments: victims, relocation, tombstones.
//! - `coalesce`: write coalescing (group commit) of user writes.
//! - `store`: the read and write paths.
//! - `access`: per-item access state (fetched, last access, win token) in
//!   the index's access words, for memcache's meta flags.
//! - `verify`: the offline consistency check.
//! - [`zerocopy`]: values read into and written from the device's buffers.
//! - [`provision`]: open the store on a path, or create it there.
//! - [`loadgen`]: the generated keys and values of `granary load`.
//!
//! Invariants the engine keeps (and where): a record is on the device before
//! its index entry points at it (`store::commit`); mutations of one key are
//! serialised by a striped key lock and get increasing sequence numbers, and
//! the highest sequence number wins in recovery (`recover::apply`); every
//! record read back is checked against its checksums, its segment's stamp and
//! the size its index entry gives (`store::read_record`).

mod access;
pub mod checkpoint;
mod coalesce;
pub mod error;
mod gc;
mod links;
pub mod loadgen;
mod log;
pub mod options;
pub mod provision;
mod recover;
mod space;
mod store;
mod verify;
pub mod zerocopy;

pub use access::{Access, ItemAccess};
pub use checkpoint::CheckpointStats;
pub use error::{Error, Result};
pub use gc::GcStats;
pub use links::{BLIND_OVERWRITE_BYTES_DEFAULT, LINK_OVERHEAD_BYTES};
pub use options::{Background, Clock, CreateOptions, Durability, Entropy, OpenOptions, ProgressHook};
pub use provision::{provision, IfPresent, NewStore, Provisioned, Site};
pub use recover::RecoveryReport;
pub use store::{Change, Cond, GcPause, Item, ItemMeta, PutMode, PutOutcome, Stats, Store, RESERVED_KEY_PREFIX};
pub use verify::VerifyReport;
pub use zerocopy::{PutBuf, ReceiveEnd, ValueBuf};

pub use granary_io as io;

#[cfg(test)]
mod cache_tests;
#[cfg(test)]
mod tests;
