//! Granary's NBD server (docs/NBD.md): block exports over the Network
//! Block Device protocol, built on the listener and connection lifecycle
//! every protocol server shares (`granary_server`: accept, connection
//! limit, idle timeout, drain).
//!
//! Modules, each depending only on those below it:
//!
//! - `server`: [`Server`], the protocol plugged into `granary_server` (a
//!   connection over the limit has each option refused with a reason);
//! - `handshake`: the fixed newstyle negotiation, up to the export the
//!   client chose;
//! - `conn`: transmission on one connection: the reader, which admits
//!   requests within the connection's limits and starts each in a task of
//!   its own, and the writer, which sends replies as they complete;
//! - `exec`: one request run against its export, as block operations that
//!   run concurrently;
//! - `stats`: the counters as a metrics registry;
//! - [`export`]: the [`Exports`] and [`Export`] traits the server serves,
//!   [`mem`]: an in-memory implementation, and [`store_export`]: the
//!   engine's block namespaces;
//! - [`proto`]: the protocol's constants and messages; [`limits`]: every
//!   bound, as named constants.
//!
//! This root holds only the types every module shares: [`NbdConfig`] and
//! [`NbdStats`].
//!
//! Ordering and durability: the requests of a connection run concurrently
//! and are answered as they complete (the protocol lets replies come out
//! of order, matched by their cookie); the protocol leaves overlapping
//! requests in flight together unordered, and the client orders what it
//! needs by waiting for replies. A write is answered once the export has
//! acknowledged each of its blocks; with `NBD_CMD_FLAG_FUA` the export's
//! sync runs before the answer; `NBD_CMD_FLUSH` is the export's sync,
//! which covers every write acknowledged before it on any connection.

pub mod export;
pub mod limits;
pub mod mem;
pub mod proto;

mod conn;
mod exec;
#[doc(hidden)]
pub mod fuzzing;
mod handshake;
mod server;
mod stats;
pub mod store_export;

pub use export::{Export, ExportInfo, Exports, Geometry};
pub use granary_server::DRAIN_TIMEOUT;
pub use mem::{MemExport, MemExports};
pub use proto::DEFAULT_PORT;
pub use server::Server;

use granary_server::ListenerStats;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// How the NBD server runs.
#[derive(Debug, Clone)]
pub struct NbdConfig {
    pub listen: SocketAddr,
    /// Executor threads when the server makes its own runtime; 0 = one per core.
    pub threads: usize,
    pub max_connections: usize,
    /// Close a connection that sends nothing for this long; None = never
    /// (a mounted file system may send nothing for hours).
    pub idle_timeout: Option<Duration>,
}

impl Default for NbdConfig {
    fn default() -> Self {
        NbdConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)),
            threads: 0,
            max_connections: limits::CONNECTIONS_DEFAULT,
            idle_timeout: None,
        }
    }
}

/// Counters of the NBD server.
#[derive(Default, Debug)]
pub struct NbdStats {
    /// The lifecycle's counters, kept by `granary_server`: open connections
    /// (for the drain at shutdown), connections served and refused, idle
    /// kicks, bytes received.
    pub listener: Arc<ListenerStats>,
    /// Connections that chose an export and entered transmission.
    pub handshakes: AtomicU64,
    /// Requests by command.
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub trims: AtomicU64,
    pub write_zeroes: AtomicU64,
    pub flushes: AtomicU64,
    pub caches: AtomicU64,
    /// Export bytes returned by READs and stored by WRITEs.
    pub read_bytes: AtomicU64,
    pub written_bytes: AtomicU64,
    /// Blocks written partially (a read-modify-write under the block's
    /// lock), by unaligned WRITEs and WRITE_ZEROES.
    pub partial_blocks: AtomicU64,
    /// Syncs run for FLUSH and FUA.
    pub syncs: AtomicU64,
    /// Replies with an error (invalid requests and failed operations).
    pub errors: AtomicU64,
    /// Connections closed for malformed input (a bad magic, unknown client
    /// flags, an oversized WRITE or option, a stalled handshake).
    pub protocol_errors: AtomicU64,
    /// Bytes sent to clients.
    pub bytes_sent: AtomicU64,
    /// The most requests one connection has had admitted at once.
    pub inflight_max: AtomicU64,
}
