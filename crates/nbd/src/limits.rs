//! The NBD server's limits. docs/NBD.md lists them.
//!
//! A connection's memory is bounded by: the read chunk and its input
//! buffer ([`READ_CHUNK_BYTES`] each, plus one request header); during the
//! handshake one option's data ([`OPTION_BYTES_MAX`]; larger data is read
//! and dropped in chunks, never held); and in transmission the payloads of
//! its admitted requests (a WRITE's data, a READ's reply), at most
//! [`INFLIGHT_BYTES_MAX`] together (or one request of at most
//! [`PAYLOAD_BYTES_MAX`] alone), held from admission until the reply has
//! been handed to the socket, plus, per request, the blocks being read or
//! rewritten ([`RUNS_PER_REQUEST`] runs of at most [`RUN_BYTES_MAX`] or
//! [`WRITE_RUN_BYTES_MAX`], and
//! [`BLOCK_OPS_PER_REQUEST`] single blocks at a time), and the writer's buffer
//! of small replies (at most [`INFLIGHT_MAX`] of [`REPLY_COPY_BYTES_MAX`]).

use std::time::Duration;

/// Default maximum of simultaneous NBD connections.
pub const CONNECTIONS_DEFAULT: usize = 1024;

/// The largest payload of one READ or WRITE, advertised as the maximum
/// payload size of `NBD_INFO_BLOCK_SIZE`: 2^25, the size the specification
/// says no server should treat as an attack and most clients cap their
/// requests at. A larger READ is answered `NBD_EINVAL`; a larger WRITE
/// closes the connection (its data cannot be skipped without reading it).
pub const PAYLOAD_BYTES_MAX: u32 = 32 << 20;

/// The minimum block size advertised: 512, the sector clients and kernels
/// address anyway. Smaller writes are served too (by read-modify-write)
/// for clients that did not ask for the constraints.
pub const MIN_BLOCK_BYTES: u32 = 512;

/// The export block sizes served: powers of two from [`MIN_BLOCK_BYTES`]
/// (the preferred size may not be smaller than the minimum) to
/// [`PAYLOAD_BYTES_MAX`] (nor larger than the maximum payload). An export
/// outside them is refused at `NBD_OPT_GO` with `NBD_REP_ERR_POLICY`.
pub const EXPORT_BLOCK_BYTES_MIN: u32 = MIN_BLOCK_BYTES;
pub const EXPORT_BLOCK_BYTES_MAX: u32 = PAYLOAD_BYTES_MAX;

/// Requests of one connection admitted at once (executing, or replied to
/// but not yet sent); the reader reads no further request until one is
/// sent. Above a client's queue depth (fio's iodepth 32, the kernel's 128
/// requests per connection are capped here, not refused).
pub const INFLIGHT_MAX: usize = 64;

/// Payload bytes (WRITE data, READ replies) one connection may hold in
/// admitted requests; a single larger request still runs, alone.
pub const INFLIGHT_BYTES_MAX: usize = 64 << 20;

/// Single-block operations of one request running at once (a TRIM's or
/// WRITE_ZEROES' blocks, the partial edge blocks of a READ or WRITE): a
/// request spanning many blocks reaches the device with this many together.
pub const BLOCK_OPS_PER_REQUEST: usize = 32;

/// Most bytes of one run of whole blocks a READ reads
/// ([`crate::Export::read_blocks`]): a READ is split into runs of at most
/// this, which the export may serve with one device IO each.
pub const RUN_BYTES_MAX: usize = 256 * 1024;

/// Most bytes of one run of whole blocks a WRITE writes
/// ([`crate::Export::write_blocks`]), one device write each. Smaller than
/// a read's: the store holds a run's key stripes (of its 16,384) from its
/// look-ups across its write to its publishing, so runs that share a
/// stripe go one after the other; a run of 16 blocks shares none with
/// another about 98 times in 100 (docs/BENCHMARKS.md, "Where a 1 MiB
/// write waits, timed", and "The 1 MiB write on 16 cores").
pub const WRITE_RUN_BYTES_MAX: usize = 64 * 1024;

/// Runs of one request running at once.
pub const RUNS_PER_REQUEST: usize = 8;

/// Bytes read from a socket at a time in transmission.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Replies up to this size (every reply but a large READ's) are copied
/// into one buffer and sent together, one system call for a burst; larger
/// ones are sent from their own buffer, uncopied.
pub const REPLY_COPY_BYTES_MAX: usize = 16 * 1024;

/// Largest option data read and parsed: an `NBD_OPT_GO` with the longest
/// name the specification allows (4096 bytes) and thousands of information
/// requests fits.
pub const OPTION_BYTES_MAX: u32 = 16 * 1024;

/// Option data up to this size that is larger than [`OPTION_BYTES_MAX`] is
/// read in chunks, dropped, and answered `NBD_REP_ERR_TOO_BIG` (the next
/// option is then read as usual); larger data closes the connection.
pub const OPTION_DISCARD_BYTES_MAX: u32 = 1 << 20;

/// The longest export name (the specification's limit for any string).
pub const EXPORT_NAME_BYTES_MAX: usize = 4096;

/// Options one connection may send before choosing an export; more close
/// it (a client looping in negotiation).
pub const HANDSHAKE_OPTIONS_MAX: usize = 1024;

/// Each handshake message (the client's flags, each option) must arrive
/// within this; a client that stalls in negotiation is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);

/// A connection over the limit is told why (each option it sends is
/// answered `NBD_REP_ERR_POLICY`) for at most this many options and this
/// long, then closed.
pub const REFUSED_OPTIONS_MAX: usize = 16;
pub const REFUSED_TIMEOUT: Duration = Duration::from_secs(5);
