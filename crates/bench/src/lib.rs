//! Granary's benchmarks. Each compares Granary against a named peer in the
//! same run and reports ratios, never absolute targets: machines differ.
//!
//! - [`index`]: the DRAM index against `dashmap` and sharded
//!   `RwLock<hashbrown::HashMap>` (`granary bench index`).

pub mod index;
pub mod mem;
