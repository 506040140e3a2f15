//! Granary's benchmarks. Each compares Granary against a named peer in the
//! same run and reports ratios, never absolute targets: machines differ.
//!
//! - [`index`]: the DRAM index against `dashmap` and sharded
//!   `RwLock<hashbrown::HashMap>` (`granary-bench index`).
//! - [`churn`]: overwrites far past a full device, GC's write amplification
//!   and the data check (`granary-bench churn`). Its peer is the ideal: every
//!   byte written once (write amplification 1).
//! - [`device`]: GET/PUT at queue depths 1..128 on both IO backends against
//!   fio on the same file (`granary-bench device`).
//! - [`native`]: the native protocol over loopback against the embedded
//!   engine on the same store (`granary-bench native`).
//! - [`recovery`]: clean restart and crash recovery of a loaded store, the
//!   scan rate against fio's sequential read (`granary-bench recovery`).
//! - [`progress`]: progress bars and log lines of long phases.
//! - [`report`]: the targets and number formatting the comparison
//!   reports share.
//! - `child`: the server processes the peer benchmarks start, and what
//!   they read of a process (log, memory, CPU time).
//! - [`memcache`]: the Memcache load generator, and `granary serve` against
//!   memcached and memcached+extstore in one run (`granary-bench memcache`).
//! - [`ycsb`]: YCSB (go-ycsb's redis binding) and redis-benchmark against
//!   `granary serve`'s Redis protocol listener and redis-server in one run
//!   (`granary-bench ycsb`).
//! - [`nbd`]: fio's NBD engine against `granary serve`'s block export,
//!   `nbdkit file` on the same disk, and fio on a file (the device), in one
//!   run (`granary-bench nbd`).

mod child;
pub mod churn;
pub mod device;
pub mod index;
pub mod mem;
pub mod memcache;
pub mod native;
pub mod nbd;
pub mod progress;
pub mod recovery;
pub mod report;
pub mod soak;
pub mod txn;
pub mod ycsb;
