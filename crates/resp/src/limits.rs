//! The RESP server's limits, each named once. docs/RESP.md lists them next
//! to Redis's.

/// The listener's default port (Redis's is 6379; Granary's RESP listener
/// sits beside a redis-server a user may already run).
pub const DEFAULT_PORT: u16 = 6380;

/// Databases `SELECT` accepts (Redis's `databases` default): database `n`
/// is the namespace `db<n>`.
pub const DATABASES_DEFAULT: usize = 16;

/// Longest inline command (Redis's PROTO_INLINE_MAX_SIZE): a longer line
/// without a newline gets `ERR Protocol error: too big inline request`.
pub const INLINE_BYTES_MAX: usize = 64 * 1024;

/// Most arguments of one command (a multibulk header above it gets
/// `ERR Protocol error: invalid multibulk length`). Redis allows up to
/// 2^31-1; this bound, with [`COMMAND_BYTES_MAX`], bounds a connection's
/// memory.
pub const MULTIBULK_MAX: usize = 1024 * 1024;

/// Most bytes of one command, arguments and framing together (Redis's
/// `client-query-buffer-limit` is 1 GiB). A command past it closes the
/// connection after `ERR Protocol error: command too large`.
pub const COMMAND_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Most arguments of a command from a connection that has not
/// authenticated while a password is required (Redis 6.2.6 and later): a
/// larger multibulk header gets `ERR Protocol error: unauthenticated
/// multibulk length` and the connection closes, so a client that has not
/// logged in cannot make the server hold much.
pub const UNAUTH_MULTIBULK_MAX: usize = 10;

/// Longest argument from such a connection (as Redis): a longer bulk gets
/// `ERR Protocol error: unauthenticated bulk length` and the connection
/// closes.
pub const UNAUTH_BULK_MAX: usize = 16 * 1024;

/// Longest header line of a multibulk or bulk (Redis answers "too big
/// mbulk count string" / "too big bulk count string" past 32 KiB).
pub const HEADER_LINE_MAX: usize = 32 * 1024;

/// Bytes read from a socket at a time.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Replies buffered before they are sent even while more pipelined
/// commands wait.
pub const OUT_FLUSH_BYTES: usize = 256 * 1024;

/// Default simultaneous connections (Redis's `maxclients` default).
pub const CONNECTIONS_DEFAULT: usize = 10_000;

/// Commands queued between MULTI and EXEC. Each EXEC is one engine batch,
/// which holds at most `granary_store::BATCH_OPS_MAX` keys.
pub const MULTI_QUEUE_MAX: usize = 4096;

/// Bytes the commands queued between MULTI and EXEC may hold (their
/// arguments and a `Vec` header each, `exec::queued_bytes`): as much as
/// one command may. A command past it is refused and the transaction
/// aborts (its queue is dropped at once).
pub const MULTI_QUEUE_BYTES_MAX: usize = COMMAND_BYTES_MAX;

/// Keys a connection may WATCH at once.
pub const WATCH_KEYS_MAX: usize = 1024;

/// Times an EXEC (or a multi-key command: MSET, MSETNX, RENAME...) is
/// re-run when a key it read changed before its batch committed (a key it
/// WATCHed changing aborts it instead, as in Redis).
pub const TXN_RETRIES_MAX: usize = 64;

/// Longest client name (CLIENT SETNAME) and library name or version
/// (CLIENT SETINFO).
pub const CLIENT_NAME_MAX: usize = 256;

/// Random picks RANDOMKEY makes before it falls back to a scan for the
/// first live key (a pick whose millisecond expiry has passed is skipped).
pub const RANDOMKEY_PICKS: u64 = 8;

/// Largest SCAN COUNT honoured per call (a larger hint is capped).
pub const SCAN_COUNT_MAX: usize = 100_000;

/// The most bytes one connection's buffers hold beside the reply being
/// built: the read chunk, the input buffer (one command of at most
/// [`COMMAND_BYTES_MAX`] plus a chunk, up to twice that for a `Vec`'s
/// growth), the commands queued by MULTI ([`MULTI_QUEUE_BYTES_MAX`]) and
/// the replies waiting (sent past [`OUT_FLUSH_BYTES`]). One
/// command's reply is built whole before it is sent, so it adds what the
/// command answers: a value or a hash for most, every value asked for an
/// MGET (docs/RESP.md, "Limits").
pub const fn connection_bytes_bound(value_bytes_max: usize) -> usize {
    READ_CHUNK_BYTES
        + 2 * (COMMAND_BYTES_MAX + READ_CHUNK_BYTES)
        + MULTI_QUEUE_BYTES_MAX
        + 2 * (OUT_FLUSH_BYTES + 2 * value_bytes_max)
}

/// Reads one MGET keeps in flight at once outside a transaction (its keys
/// are read together and answered in their order); inside MULTI they are
/// read one by one, through the transaction's view.
pub const MULTI_GET_READS: usize = 16;

/// The records an MGET's reads hold together (their sizes as the index
/// gives them); a larger record is read alone.
pub const MULTI_GET_BYTES: u64 = 256 * 1024;
