//! Granary's native protocol server (docs/PROTOCOL.md), built on the
//! listener and connection lifecycle every protocol server shares
//! (`granary_server`: accept, connection limit, idle timeout, drain).
//!
//! Modules, each depending only on those below it:
//!
//! - `server`: [`Server`], the protocol plugged into `granary_server`
//!   (a refused connection gets a `BUSY` hello);
//! - `conn`: one connection: the hello, the pipelined request loop, the
//!   writer, zero-copy receives and sends, the pause while the client does
//!   not read;
//! - `exec`: one request run against the store (in the namespace it
//!   names, resolved by the connection's `Scope`), its response encoded;
//!   what a request touches and when two conflict;
//! - `stats`: the STATS opcode's pairs;
//! - `parse`: one frame decoded from the front of the input (for the
//!   protocol version the connection negotiated: 1, or 2 with namespaces),
//!   with the frame-level errors the server answers;
//! - [`limits`]: every bound, as named constants.
//!
//! This root holds only the types every module shares: [`NativeConfig`]
//! and [`NativeStats`].
//!
//! Ordering: a connection's requests start in the order they were sent,
//! each waiting for every earlier one still running that it conflicts with
//! (the rule is `exec::Flight::conflicts`: one writes a key the other
//! touches, or either is a barrier; the waiting is `conn::Conn::admit`), so
//! a connection observes its requests' effects in the order it sent them
//! while independent requests overlap on the device.

pub mod limits;

mod conn;
mod exec;
#[doc(hidden)]
pub mod fuzzing;
mod parse;
mod server;
mod stats;

pub use granary_server::DRAIN_TIMEOUT;
pub use server::Server;

use granary_proto::{self as proto, Op};
use granary_rt::latency::Histogram;
use granary_server::ListenerStats;
use limits::{CONNECTIONS_DEFAULT, VALUE_BYTES_DEFAULT};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// How the native server runs. Its `Debug` never shows the token.
#[derive(Clone)]
pub struct NativeConfig {
    pub listen: SocketAddr,
    /// Executor threads when the server makes its own runtime; 0 = one per core.
    pub threads: usize,
    pub max_connections: usize,
    /// Largest value accepted (bounded by what the store's segments hold).
    pub value_bytes_max: u32,
    /// Close a connection that sends nothing for this long; None = never.
    pub idle_timeout: Option<Duration>,
    /// The token every hello must carry (docs/PROTOCOL.md, "Handshake");
    /// a hello without it, or with another, is answered `UNAUTHORIZED` and
    /// the connection closed. None: no token is required (one sent is
    /// ignored).
    pub token: Option<Vec<u8>>,
    /// Speak TLS with these settings (docs/SECURITY.md); None: plain TCP.
    pub tls: Option<granary_server::tls::TlsConfig>,
}

impl std::fmt::Debug for NativeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeConfig")
            .field("listen", &self.listen)
            .field("threads", &self.threads)
            .field("max_connections", &self.max_connections)
            .field("value_bytes_max", &self.value_bytes_max)
            .field("idle_timeout", &self.idle_timeout)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Default for NativeConfig {
    fn default() -> Self {
        NativeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], proto::DEFAULT_PORT)),
            threads: 0,
            max_connections: CONNECTIONS_DEFAULT,
            value_bytes_max: VALUE_BYTES_DEFAULT,
            idle_timeout: None,
            token: None,
            tls: None,
        }
    }
}

/// Counters of the native server.
#[derive(Default, Debug)]
pub struct NativeStats {
    /// The lifecycle's counters, kept by `granary_server`: open connections
    /// (for the drain at shutdown), connections served and refused, idle
    /// kicks, bytes received.
    pub listener: Arc<ListenerStats>,
    /// Connections closed for a malformed or oversized frame (or hello).
    pub bad_frames: AtomicU64,
    /// Hellos refused `UNAUTHORIZED` (no token, or a wrong one).
    pub auth_failures: AtomicU64,
    pub gets: AtomicU64,
    pub get_hits: AtomicU64,
    pub puts: AtomicU64,
    pub deletes: AtomicU64,
    pub multi_gets: AtomicU64,
    pub batches: AtomicU64,
    pub nops: AtomicU64,
    pub stats: AtomicU64,
    /// The namespace operations (version 2).
    pub ns_creates: AtomicU64,
    pub ns_drops: AtomicU64,
    pub ns_truncates: AtomicU64,
    pub ns_lists: AtomicU64,
    pub ns_stats: AtomicU64,
    /// TXNs (version 2), and those answered `EXISTS` or `NOT_FOUND`: a
    /// condition failed and nothing was applied.
    pub txns: AtomicU64,
    pub txn_condition_failed: AtomicU64,
    /// Responses with an error status.
    pub errors: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Latency per opcode, indexed by `op as usize - 1` (see
    /// [`NativeStats::op_latency`]): from the frame's decoding to its
    /// response being queued for the writer, waits behind conflicting
    /// requests and the connection's limits included.
    pub latency: [Histogram; OPS.len()],
    /// The most buffer memory one connection has held: input, request
    /// bodies in flight, queued and sending responses. See
    /// [`limits::connection_bytes_bound`].
    pub conn_buffer_bytes_max: AtomicU64,
    /// Connections whose writer waits for the client to read.
    pub conns_waiting_to_send: AtomicU64,
    /// GET values sent from the device's read buffer, and PUT values
    /// received into the buffer the device writes (no copy).
    pub zero_copy_gets: AtomicU64,
    pub zero_copy_puts: AtomicU64,
    /// Connections that start no request until their client reads the
    /// responses waiting ([`limits::OUT_HIGH_BYTES`]).
    pub conns_paused: AtomicU64,
}

/// Every opcode, in the order of [`NativeStats::latency`].
pub const OPS: [Op; Op::ALL.len()] = Op::ALL;

// The protocol's namespace limits are the engine's.
const _: () = assert!(proto::NAMESPACE_NAME_MAX == granary_store::namespace::NAMESPACE_NAME_MAX);
const _: () = assert!(proto::NAMESPACES_MAX == granary_store::namespace::NAMESPACES_MAX);
// A TXN is one engine batch: the protocol's limit is the engine's.
const _: () = assert!(proto::TXN_OPS_MAX == granary_store::BATCH_OPS_MAX);

impl NativeStats {
    /// The latency histogram of `op`.
    pub fn op_latency(&self, op: Op) -> &Histogram {
        &self.latency[op as usize - 1]
    }

    /// Note one connection's buffer memory in the high-water mark.
    fn buffer_bytes(&self, bytes: usize) {
        granary_rt::net::raise_high_water(&self.conn_buffer_bytes_max, bytes as u64);
    }
}
