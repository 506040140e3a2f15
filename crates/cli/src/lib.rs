//! What the `granary` and `granary-bench` binaries share: sizes and counts
//! on the command line ([`size`]), progress of long work ([`progress`]),
//! the stop signals ([`signals`]), the file-descriptor limit
//! ([`fdlimit`]), logging and the one-line error exit
//! ([`logging`]).
//!
//! The commands themselves live in the binaries: `granary`'s in `main.rs`
//! and `cmd/`, the benchmarks in `bench.rs`, so `granary` links none of the
//! benchmarks' peers.

pub mod fdlimit;
pub mod logging;
pub mod progress;
pub mod signals;
pub mod size;
