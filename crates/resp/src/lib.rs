//! Granary's Redis protocol server (docs/RESP.md): RESP2, and RESP3 after
//! `HELLO 3`, with Redis 7's string, key, hash and transaction commands,
//! on the listener and connection lifecycle every protocol server shares
//! (`granary_server`: accept, connection limit, idle timeout, drain).
//!
//! Modules, each depending only on those below it:
//!
//! - `server`: [`Server`], the protocol plugged into `granary_server` (a
//!   refused connection gets Redis's `max number of clients reached`);
//! - `conn`: one connection: reading, framing, pipelining, MULTI's queue
//!   and WATCH, replies sent in order;
//! - `exec`: one command run: the table of commands (name, arity, flags,
//!   keys: what COMMAND reports), argument checks, Redis's replies and
//!   errors;
//! - `keys`: the keyspace as commands see it: one database directly, or a
//!   transaction's overlay committed as one atomic engine batch;
//! - `value`: how a Redis value (type, millisecond expiry, a hash's
//!   fields) is kept in one engine record;
//! - `parse`, `reply`: the wire format in and out; `glob`: MATCH and KEYS
//!   patterns; `float`: INCRBYFLOAT's arithmetic, bit for bit as Redis
//!   computes it (x87 80-bit long double); [`limits`]: every bound, named.
//!
//! [`acl`]: the users AUTH checks (an ACL file, or `requirepass`).
//!
//! Databases: `SELECT n` addresses the namespace `db<n>`, created on first
//! use; a connection starts in database 0.

pub mod limits;

pub mod acl;
mod conn;
mod exec;
mod float;
#[doc(hidden)]
pub mod fuzzing;
mod glob;
mod keys;
mod parse;
mod reply;
mod server;
mod value;

pub use granary_server::DRAIN_TIMEOUT;
pub use server::Server;

use granary_server::ListenerStats;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// How the RESP server runs.
#[derive(Debug, Clone)]
pub struct RespConfig {
    pub listen: SocketAddr,
    /// Executor threads when the server makes its own runtime; 0 = one per core.
    pub threads: usize,
    pub max_connections: usize,
    /// Largest string or hash (`proto-max-bulk-len`), within what the
    /// store's segments hold.
    pub value_bytes_max: u32,
    /// Close a connection that sends nothing for this long; None = never.
    pub idle_timeout: Option<Duration>,
    /// Databases SELECT accepts.
    pub databases: usize,
    /// Redis's `requirepass`: the password of the user `default`. Set, a
    /// connection must `AUTH` (or `HELLO ... AUTH`) before any other
    /// command (docs/SECURITY.md); None: every connection is the
    /// `default` user, as Redis without a password.
    pub requirepass: Option<Vec<u8>>,
    /// Redis's `aclfile`, read ([`acl::Acl::read`]): its users replace
    /// `requirepass` (the two cannot both be set; the server refuses to
    /// start). None: the `default` user only.
    pub acl: Option<Arc<acl::Acl>>,
    /// Speak TLS with these settings (docs/SECURITY.md); None: plain TCP.
    pub tls: Option<granary_server::tls::TlsConfig>,
}

impl Default for RespConfig {
    fn default() -> Self {
        RespConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], limits::DEFAULT_PORT)),
            threads: 0,
            max_connections: limits::CONNECTIONS_DEFAULT,
            value_bytes_max: 1 << 20,
            idle_timeout: None,
            databases: limits::DATABASES_DEFAULT,
            requirepass: None,
            acl: None,
            tls: None,
        }
    }
}

/// Counters of the RESP server (INFO's stats section).
#[derive(Default, Debug)]
pub struct RespStats {
    /// The lifecycle's counters, kept by `granary_server`.
    pub listener: Arc<ListenerStats>,
    /// Commands run (queued ones counted when EXEC runs them).
    pub commands: AtomicU64,
    /// Error replies sent.
    pub errors: AtomicU64,
    /// Connections closed for a protocol error.
    pub protocol_errors: AtomicU64,
    /// Reads of one key that found a value, and that did not.
    pub keyspace_hits: AtomicU64,
    pub keyspace_misses: AtomicU64,
    /// EXECs and multi-key commands committed as one batch, those run
    /// again because a key they read changed, and EXECs aborted by WATCH.
    pub txn_commits: AtomicU64,
    pub txn_retries: AtomicU64,
    pub txn_aborts: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Connections that ever sent HELLO 3.
    pub resp3_connections: AtomicU64,
    /// Connection ids (CLIENT ID) handed out.
    pub next_client_id: AtomicU64,
    /// AUTH and HELLO ... AUTH refused for a wrong user or password.
    pub auth_failures: AtomicU64,
}

impl RespStats {
    /// The server's counters for `/metrics`, each declared once with its
    /// INFO name (where INFO has it), its help and its Prometheus family.
    pub fn registry(&self) -> granary_rt::metrics::Registry {
        use std::sync::atomic::Ordering::Relaxed;
        let mut r = granary_rt::metrics::Registry::new();
        self.listener.register("resp", &mut r);
        let g = |a: &AtomicU64| a.load(Relaxed);
        r.counter(
            "total_commands_processed",
            "granary_resp_commands_total",
            "Redis protocol commands run (queued ones when EXEC runs them).",
            g(&self.commands),
        )
        .counter("total_error_replies", "granary_resp_error_replies_total", "Error replies sent.", g(&self.errors))
        .counter(
            "protocol_errors",
            "granary_resp_protocol_errors_total",
            "Connections closed for a protocol error.",
            g(&self.protocol_errors),
        )
        .counter(
            "keyspace_hits",
            "granary_resp_keyspace_hits_total",
            "Reads of a key that found it.",
            g(&self.keyspace_hits),
        )
        .counter(
            "keyspace_misses",
            "granary_resp_keyspace_misses_total",
            "Reads of a key that did not find it.",
            g(&self.keyspace_misses),
        )
        .counter(
            "txn_commits",
            "granary_resp_txn_commits_total",
            "EXECs and multi-key commands committed as one batch.",
            g(&self.txn_commits),
        )
        .counter(
            "txn_retries",
            "granary_resp_txn_retries_total",
            "Transactions run again because a key they read changed before their batch committed.",
            g(&self.txn_retries),
        )
        .counter(
            "txn_watch_aborts",
            "granary_resp_txn_watch_aborts_total",
            "EXECs aborted by WATCH.",
            g(&self.txn_aborts),
        )
        .counter(
            "granary_auth_failures",
            "granary_resp_auth_failures_total",
            "AUTH and HELLO AUTH refused for a wrong user or password.",
            g(&self.auth_failures),
        )
        .counter(
            "total_net_output_bytes",
            "granary_resp_bytes_written_total",
            "Bytes sent to clients.",
            g(&self.bytes_written),
        );
        r
    }
}
