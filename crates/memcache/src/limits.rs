//! The server's limits. docs/MEMCACHE.md lists them with memcached's.

/// Longest key of the text and meta protocols (memcached's KEY_MAX_LENGTH).
pub const KEY_BYTES_MAX: usize = 250;

/// Default largest value (memcached's `-I` default).
pub const ITEM_BYTES_DEFAULT: usize = 1 << 20;

/// Largest value `--max-item-size` may allow (the store's segments must be
/// large enough to hold it too).
pub const ITEM_BYTES_LIMIT: usize = 1 << 30;

/// Longest request line (command, keys and flags, without data). A longer
/// line without a newline gets `CLIENT_ERROR line too long` and the
/// connection is closed. Large enough for a multi-get of 256 full keys.
pub const LINE_BYTES_MAX: usize = 64 * 1024;

/// Largest data block of the authentication `set` (`<user> <pass>`) a
/// connection that has not authenticated may announce; a larger one gets
/// `CLIENT_ERROR bad authentication token format` and the connection is
/// closed (memcached would read it whole).
pub const AUTH_TOKEN_BYTES_MAX: usize = 4096;

/// Longest line a connection that has not authenticated may send without
/// a newline before it is closed (memcached's 2048-byte rule).
pub const AUTH_LINE_BYTES_MAX: usize = 2048;

/// Default maximum of simultaneous connections (memcached's `-c` default).
pub const CONNECTIONS_DEFAULT: usize = 1024;

/// Bytes read from a socket at a time.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Replies buffered before they are sent even if more pipelined requests
/// are waiting. A connection's memory is bounded by this, plus one request
/// line, plus one value (the largest item).
pub const OUT_FLUSH_BYTES: usize = 256 * 1024;

/// Values of at least this many bytes skip the connection's buffers: a
/// storage command's value is received from the socket straight into the
/// engine's record buffer, and a `get`'s value is sent from the buffer the
/// device read it into. Smaller values are copied (a copy of a few KiB
/// costs less than an extra send or receive).
pub const ZERO_COPY_MIN_BYTES: usize = 16 * 1024;

/// Longest header line of a value reply (`VALUE key flags bytes cas`, or
/// `VA` with meta flags, the key and an opaque included).
pub const REPLY_HEADER_BYTES_MAX: usize = 1024;

/// The most buffer memory one connection holds with values of at most
/// `item_bytes_max` bytes: the read chunk; the input buffer, which holds
/// at most one request line and one value plus a chunk (a `Vec` may have
/// up to twice the capacity it needs); and the reply buffer, which is sent
/// once it passes [`OUT_FLUSH_BYTES`], so holds at most that plus one
/// reply (twice, for the same reason). Memory held by the engine for the
/// value being read or written is not included (a value of at least
/// [`ZERO_COPY_MIN_BYTES`] lives only there: the bound is then loose), nor
/// are the values a multi-get's reads hold ([`multi_get_bytes`]). With the default 1 MiB
/// items it is about 4.9 MiB.
pub const fn connection_bytes_bound(item_bytes_max: usize) -> usize {
    READ_CHUNK_BYTES
        + 2 * (LINE_BYTES_MAX + 2 + item_bytes_max + READ_CHUNK_BYTES)
        + 2 * (OUT_FLUSH_BYTES + REPLY_HEADER_BYTES_MAX + item_bytes_max)
}

/// Reads a multi-get (`get` or `gets` of several keys) keeps in flight at
/// once: its keys are read together, as a device serves many reads in about
/// the time of one, and answered in their order.
pub const MULTI_GET_READS: usize = 16;

/// The records a multi-get's reads hold together (their sizes as the index
/// gives them when each read starts) stay within this, or within the
/// largest item allowed if that is larger; a record larger than the budget
/// is read alone. So a multi-get holds, beside the connection's buffers,
/// about the budget's worth of values: it is a bound on the sizes the
/// index gave, and a value rewritten larger while its read is queued is
/// read at its new size.
pub const MULTI_GET_BYTES_MIN: usize = 256 * 1024;

/// The byte budget of a multi-get's reads with items of at most
/// `item_bytes_max` bytes.
pub const fn multi_get_bytes(item_bytes_max: usize) -> u64 {
    if item_bytes_max > MULTI_GET_BYTES_MIN {
        item_bytes_max as u64
    } else {
        MULTI_GET_BYTES_MIN as u64
    }
}

/// Requests pipelined one after another that are answered as one group
/// (plain `get`/`gets` lines, or binary gets): at most this many, and a
/// text group takes no further line once it holds [`PIPELINED_GET_KEYS_MAX`]
/// keys (its first line is always taken whole). The rest of the pipeline
/// forms the next group, so what one group holds beside the input buffer
/// (its parsed requests) stays small however long the pipeline.
pub const PIPELINED_GETS_MAX: usize = 64;

/// Keys a text group of pipelined gets takes more lines up to.
pub const PIPELINED_GET_KEYS_MAX: usize = 1024;

/// Seconds: an exptime above this is an absolute unix time, at or below a
/// relative one (memcached's REALTIME_MAXDELTA, 30 days).
pub const RELATIVE_EXPTIME_MAX: i64 = 60 * 60 * 24 * 30;

/// Most reply bytes of one `stats cachedump` (its `END` included):
/// memcached's cap (2 MiB, `item_cachedump`'s `memlimit`). A limit of 0
/// lists keys up to it; keys past it are left out.
pub const CACHEDUMP_BYTES_MAX: usize = 2 * 1024 * 1024;

/// Keys asked of the engine's scan per page by `stats cachedump` and
/// `lru_crawler metadump`: a dump holds at most one page of keys at a
/// time (the reply buffer is sent past [`OUT_FLUSH_BYTES`]).
pub const DUMP_SCAN_KEYS: usize = 256;
