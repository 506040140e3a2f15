//! Fuzz targets over every decoder that reads untrusted bytes: the
//! protocol servers' request decoders (memcache text, meta and binary;
//! native frames and hellos, and the replies its client reads; RESP; NBD's
//! handshake and requests), the on-device formats a corrupted device hands
//! the store (records, segment headers and summaries, superblocks,
//! checkpoint manifests and their items, batch commits, the namespace
//! catalog and totals, a stripe set's member labels), and the TOML
//! configuration file.
//!
//! Each target is a plain function of `&[u8]` ([`targets`], listed in
//! [`TARGETS`]): libFuzzer drives them from `fuzz/fuzz_targets/` (nightly,
//! `scripts/fuzz.sh`), and `cargo test` replays the committed corpora
//! (`fuzz/corpus/<target>/`) through them on stable. [`seeds`] builds the
//! seed inputs from the real encoders, so they follow the formats.
//!
//! Invariants: a target panics only when a decoder breaks a promise (a
//! panic or out-of-bounds read inside it, a frame claiming bytes it was not
//! given, a decode-encode-decode round trip that differs); any input the
//! decoders refuse is fine.

pub mod seeds;
pub mod targets;

/// A target: a function of the fuzzer's input.
pub type Target = fn(&[u8]);

/// Every target: its name (the file in `fuzz/fuzz_targets/` and the folder
/// in `fuzz/corpus/`) and its function.
pub const TARGETS: &[(&str, Target)] = &[
    ("memcache_text", targets::memcache_text),
    ("memcache_binary", targets::memcache_binary),
    ("native_frames", targets::native_frames),
    ("native_replies", targets::native_replies),
    ("resp", targets::resp),
    ("nbd_handshake", targets::nbd_handshake),
    ("nbd_requests", targets::nbd_requests),
    ("record", targets::record),
    ("segment_header", targets::segment_header),
    ("summary", targets::summary),
    ("superblock", targets::superblock),
    ("stripe_label", targets::stripe_label),
    ("checkpoint", targets::checkpoint),
    ("catalog", targets::catalog),
    ("config_toml", targets::config_toml),
];
