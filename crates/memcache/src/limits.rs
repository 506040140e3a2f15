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

/// Default maximum of simultaneous connections (memcached's `-c` default).
pub const CONNECTIONS_DEFAULT: usize = 1024;

/// Bytes read from a socket at a time.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Replies buffered before they are sent even if more pipelined requests
/// are waiting. A connection's memory is bounded by this, plus one request
/// line, plus one value (the largest item).
pub const OUT_FLUSH_BYTES: usize = 256 * 1024;

/// Seconds: an exptime above this is an absolute unix time, at or below a
/// relative one (memcached's REALTIME_MAXDELTA, 30 days).
pub const RELATIVE_EXPTIME_MAX: i64 = 60 * 60 * 24 * 30;
