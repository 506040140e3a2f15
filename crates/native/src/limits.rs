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

/// Values at least this large travel without a copy: a GET's value is
/// sent from the buffer the device read it into, a PUT's value is received
/// into the buffer the device writes (the engine's zero-copy API). Smaller
/// ones are copied, which costs less than the extra send or receive.
pub const ZERO_COPY_MIN_BYTES: usize = 16 * 1024;

/// Reads one MULTI_GET keeps in flight at once (its keys are read
/// together and answered in their order), within a budget of the
/// response's frame limit in records (their sizes as the index gives
/// them; a larger one is read alone).
pub const MULTI_GET_READS: usize = 16;

/// Namespace handles one connection keeps by name (`exec::Scope`); past
/// this many it forgets them all and looks names up again. A handle is a
/// few dozen bytes and its name at most 64.
pub const NS_HANDLES_MAX: usize = 64;

/// Bytes read from a socket at a time.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// The most buffer memory one connection holds when no request frame is
/// larger than `request_frame_max` bytes and no response larger than
/// `response_max` (a GET's is its value plus a 16-byte header; the
/// frame limit bounds any): the read chunk and the input buffer (a frame
/// plus a chunk; a `Vec` may have up to twice the capacity it needs); the
/// bodies of requests in flight ([`INFLIGHT_BYTES_MAX`], or one frame);
/// and the responses, queued or being sent: requests start only while
/// fewer than [`OUT_HIGH_BYTES`] wait, so at most that plus
/// [`INFLIGHT_MAX`] responses, held by the queue and by the buffer being
/// sent (twice each, for `Vec` growth; a sent buffer larger than
/// [`OUT_HIGH_BYTES`] is freed). Memory the engine holds for a
/// value being read or written is not included.
pub const fn connection_bytes_bound(request_frame_max: usize, response_max: usize) -> usize {
    let input = READ_CHUNK_BYTES + 2 * (request_frame_max + READ_CHUNK_BYTES);
    let bodies = if INFLIGHT_BYTES_MAX > request_frame_max { INFLIGHT_BYTES_MAX } else { request_frame_max };
    let responses = 4 * (OUT_HIGH_BYTES + INFLIGHT_MAX * response_max);
    input + bodies + responses
}
