//! Granary's embedded key-value engine.
//!
//! A [`Store`] keeps one [`granary_index::Index`] entry per key in DRAM and
//! every record on a [`granary_io::Device`]. Module roles:
//!
//! - [`error`]: the engine's error type.
//! - [`options`]: create- and open-time options, geometry defaults.
//! - `space`: segments and grains: sequential allocation in the open
//!   segment, per-segment live bytes and stamps.
//! - `log`: the log on the device (`Log`: device, superblock,
//!   sequence numbers, health) and reading it back: segment headers, the
//!   segment scanner and its read-ahead, checked record reads (used by
//!   recovery, GC, checkpoints, verify and the read path).
//! - `keys`: the key-side DRAM state: the index, the key stripe locks,
//!   the links table, the dropped keys, the sparse-GC watch.
//! - `counters`: the live counters of keys and operations.
//! - `parts`: `Parts`, the borrowed handles (log, space, keys, counters)
//!   that GC, checkpoints, recovery and link settling work on.
//! - `links`: the table of blind overwrites' links; `settle`: settling
//!   them.
//! - `recover`: rebuilding the index on open: checkpoint load, then a
//!   parallel scan of the log it does not cover (or of all of it).
//! - `checkpoint`: index checkpoints, written in the background and at
//!   close; finding the newest valid one.
//! - `gc`: reclaiming segments: victims, relocation, tombstones.
//! - `coalesce`: write coalescing (group commit) of user writes.
//! - `detach`: work that runs to its end once started, even if the future
//!   awaiting it is dropped (a group write, a record's write outside the
//!   coalescer, a batch).
//! - `store`: the [`Store`] handle (its sync and async API) and the engine
//!   state it shares with the background threads (`Core`: the parts, plus
//!   the write path's and the background work's own state).
//! - `types`: the public value types of that API ([`Item`], [`ItemMeta`],
//!   [`Cond`], [`Change`], [`Stats`], ...).
//! - `open`: creating and opening a store, starting its background threads.
//! - `read`: the read path (GETs, finding a key's current version).
//! - `tier`: the DRAM tier of hot values in front of the device (off by
//!   default: [`OpenOptions::dram_tier_bytes`]), and its freshness rule;
//!   `tier_policy`: its admission and eviction policy (S3-FIFO).
//! - `write`: the write path (PUTs, updates, DELETEs, `flush_all`).
//! - `scan`: key scans (Redis SCAN, KEYS, RANDOMKEY): pages of one
//!   namespace's keys under a cursor in home-slot space.
//! - `access`: per-item access state (fetched, last access, win token) in
//!   the index's access words, for memcache's meta flags.
//! - `verify`: the offline consistency check.
//! - [`zerocopy`]: values read into and written from the device's buffers.
//! - [`block`]: the keys of an export's blocks (a block server's view of a
//!   [`NamespaceKind::Block`] namespace).
//! - [`provision`](mod@provision): open the store on a path, or create it there.
//! - [`loadgen`]: the generated keys and values of `granary load`.
//! - `figures`: [`Stats::registry`], the store's figures declared once for
//!   `granary stat`, `/metrics` and memcache `stats`.
//!
//! **Dropped futures.** An async call's future may be dropped before it
//! completes (a caller's timeout): a read then simply stops; a write that
//! has begun runs to its end anyway (its device IO is never dropped midway)
//! and releases what it holds. A dropped [`Batch::commit_async`] commits or
//! not as a whole; a dropped single write (PUT, DELETE, update, a
//! namespace's creation or drop, which write the catalog) may have written
//! its record without the running store applying it, and a dropped run
//! (`put_many`) may have applied some of its keys and not others, so their
//! outcome is unknown: do it again (docs/ARCHITECTURE.md, "Writes whose
//! futures are dropped").
//!
//! Invariants the engine keeps (and where): a record is on the device before
//! its index entry points at it (`write::commit`); mutations of one key are
//! serialised by a striped key lock and get increasing sequence numbers, and
//! the highest sequence number wins in recovery (`recover::apply`); every
//! record read back is checked against its checksums, its segment's stamp and
//! the size its index entry gives (`log::Log::read_record`).
//!
//! Layers (a module uses only those below it; `tests/layers.rs` checks
//! that no module cycle exists): `error`, `options`, `types`, `detach`, `access`,
//! `tier_policy`, `tier`, `zerocopy`; `space`; `log`; `links`, `keys`; `counters`; `parts`;
//! `settle`; `gc`, `checkpoint`; `recover`, `verify`, `coalesce`; and at
//! the top the engine itself: `store` with its `open`, `read`, `write`
//! and `scan`.

mod access;
pub mod batch;
pub mod block;
mod catalog;
mod checkpoint;
mod coalesce;
mod combine;
mod counters;
mod detach;
pub mod error;
mod figures;
#[doc(hidden)]
pub mod fuzzing;
mod gc;
mod keys;
mod links;
pub mod loadgen;
mod log;
pub mod namespace;
mod nskey;
mod open;
pub mod options;
mod parts;
pub mod provision;
mod quota;
mod read;
mod recover;
mod rekey;
pub mod run;
mod scan;
mod settle;
mod space;
mod store;
mod tier;
mod tier_policy;
mod types;
mod verify;
mod write;
pub mod zerocopy;

pub use access::{Access, ItemAccess};
pub use batch::{Batch, BatchOp, BatchOutcome, BATCH_OPS_MAX};
pub use error::{Error, Result};
pub use links::{BLIND_OVERWRITE_BYTES_DEFAULT, LINK_OVERHEAD_BYTES};
pub use namespace::{
    NamespaceKind, NamespaceMode, NamespaceOptions, NamespaceStats, BLOCK_BYTES_DEFAULT, BLOCK_BYTES_MAX,
    BLOCK_BYTES_MIN, DEFAULT_NAMESPACE, EXPORT_BYTES_MAX,
};
pub use nskey::NS_KEY_OVERHEAD;
pub use options::{
    Background, Clock, CreateOptions, Discard, Durability, Entropy, GcPolicy, OpenOptions, ProgressHook, Watermark,
};
pub use provision::{provision, IfPresent, NewStore, Provisioned, Site, Undo};
pub use rekey::Rekeyed;
pub use store::{Namespace, Store};
pub use tier::ITEM_OVERHEAD_BYTES as TIER_ITEM_OVERHEAD_BYTES;
pub use types::{
    Change, CheckpointStats, Cond, DramStats, GcPause, GcSettings, GcStats, Item, ItemMeta, PutMode, PutOutcome,
    RecoveryReport, ScanPage, Stats, RESERVED_KEY_PREFIX,
};
pub use verify::VerifyReport;
pub use zerocopy::{PutBuf, ReceiveEnd, ValueBuf};

/// The longest key the engine stores (a namespace's user keys are
/// [`NS_KEY_OVERHEAD`] shorter), and the longest value of any store (a
/// store holds what fits one of its segments: [`Store::value_bytes_max`]).
pub use granary_format::limits::{KEY_BYTES_MAX, VALUE_BYTES_MAX};

pub use granary_io as io;

#[cfg(test)]
mod cache_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tier_tests;
