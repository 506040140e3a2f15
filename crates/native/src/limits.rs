//! The native server's limits. docs/PROTOCOL.md lists them.
//!
//! A connection's memory is bounded by: its input (one frame: at most the
//! frame limit, `granary_proto::frame_bytes_max(value max)`, which is
//! allocated only once the header announcing it has been checked), the
//! bodies of its in-flight requests ([`INFLIGHT_BYTES_MAX`], or one frame),
//! and its responses: [`OUT_HIGH_BYTES`] waiting to be sent, plus those of
//! at most [`INFLIGHT_MAX`] requests running when the reader stopped, each
//! at most one value (or, for MGET/BATCH, their values).

/// Default maximum of simultaneous native connections; more are answered
/// with a `BUSY` hello and closed.
pub const CONNECTIONS_DEFAULT: usize = 1024;

/// Default largest value of the native protocol.
pub const VALUE_BYTES_DEFAULT: u32 = 1 << 20;

/// Requests of one connection executing at once; further requests wait
/// (the reader stops reading) until one ends.
pub const INFLIGHT_MAX: usize = 64;

/// Request body bytes one connection may hold in executing requests (a
/// single larger request still runs, alone).
pub const INFLIGHT_BYTES_MAX: usize = 8 << 20;

/// Response bytes waiting to be sent above which a connection starts no
/// new request (the client is not reading).
pub const OUT_HIGH_BYTES: usize = 4 << 20;

/// A connection that has not sent its whole hello by then is closed.
pub const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Bytes read from a socket at a time.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;
