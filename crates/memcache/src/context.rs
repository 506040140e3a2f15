//! What every connection of one server shares: its configuration
//! ([`ServerConfig`]), its counters ([`ServerStats`]) and the store, as one
//! [`Ctx`]. Defined below the executor and the connection, which read
//! them, and re-exported by `server`, which creates them.
//!
//! Invariants: counters only grow (`stats reset` answers `RESET` and
//! leaves them, so `/metrics` counters stay monotonic); the connection
//! counters are the listener's ([`ListenerStats`]), counted by the shared
//! lifecycle, never by this crate but for a zero-copy receive (see
//! `conn`).

use crate::limits::*;
use granary_rt::latency::Histogram;
use granary_server::ListenerStats;
use granary_store::{Namespace, Store};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on (memcached's `-l` and `-p`).
    pub listen: SocketAddr,
    /// Executor threads (memcached's `-t`); 0 = one per core.
    pub threads: usize,
    /// Simultaneous connections (memcached's `-c`); more are refused with
    /// `SERVER_ERROR too many open connections`.
    pub max_connections: usize,
    /// Largest value accepted (memcached's `-I`).
    pub item_bytes_max: usize,
    /// Close a connection that sends nothing for this long (memcached's
    /// `idle_timeout`); None = never.
    pub idle_timeout: Option<Duration>,
    /// The store's namespace this listener serves (its keys, its `stats`
    /// counts; `flush_all` truncates it).
    pub namespace: String,
    /// What the `shutdown` command calls to stop the server (memcached's
    /// `-A`); it must return at once and have the stop happen elsewhere
    /// (`granary serve` raises SIGTERM, its ordinary clean stop). None:
    /// `shutdown` is refused with `ERROR: shutdown not enabled`.
    pub shutdown: Option<fn()>,
    /// memcached's `-Y` auth file: set, a connection must authenticate
    /// (a `set` whose data is `<user> <pass>`) before any other command,
    /// and the binary protocol is not served (docs/SECURITY.md).
    pub auth: Option<Arc<granary_server::auth::UserFile>>,
    /// Speak TLS with these settings (docs/SECURITY.md); None: plain TCP.
    pub tls: Option<granary_server::tls::TlsConfig>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 11211)),
            threads: 0,
            max_connections: CONNECTIONS_DEFAULT,
            item_bytes_max: ITEM_BYTES_DEFAULT,
            idle_timeout: None,
            namespace: granary_store::DEFAULT_NAMESPACE.into(),
            shutdown: None,
            auth: None,
            tls: None,
        }
    }
}

/// Counters, with memcached's names where they exist.
#[derive(Default, Debug)]
pub struct ServerStats {
    /// The connection lifecycle's counters: open connections
    /// (`curr_connections`), `total_connections`, `rejected_connections`,
    /// `idle_kicks` and `bytes_read`.
    pub listener: Arc<ListenerStats>,
    pub cmd_get: AtomicU64,
    pub cmd_set: AtomicU64,
    pub cmd_flush: AtomicU64,
    pub cmd_touch: AtomicU64,
    pub cmd_meta: AtomicU64,
    pub get_hits: AtomicU64,
    pub get_misses: AtomicU64,
    pub delete_hits: AtomicU64,
    pub delete_misses: AtomicU64,
    pub incr_hits: AtomicU64,
    pub incr_misses: AtomicU64,
    pub decr_hits: AtomicU64,
    pub decr_misses: AtomicU64,
    pub cas_hits: AtomicU64,
    pub cas_misses: AtomicU64,
    pub cas_badval: AtomicU64,
    pub touch_hits: AtomicU64,
    pub touch_misses: AtomicU64,
    pub bytes_written: AtomicU64,
    pub protocol_errors: AtomicU64,
    /// Authentication attempts, and those refused (memcached's
    /// `auth_cmds`, `auth_errors`).
    pub auth_cmds: AtomicU64,
    pub auth_errors: AtomicU64,
    pub total_items: AtomicU64,
    /// Stores refused as larger than the item size limit (`SERVER_ERROR
    /// object too large for cache`).
    pub store_too_large: AtomicU64,
    /// Stores refused for want of space (store mode full: `SERVER_ERROR
    /// out of memory storing object`).
    pub store_no_memory: AtomicU64,
    /// Latency of each command, from its parse to its reply being
    /// buffered (or sent, for a multi-get that sends as it goes), indexed
    /// as [`COMMANDS`]. A storage command is timed once its data is in.
    pub latency: [Histogram; COMMANDS.len()],
    /// The most buffer memory one connection has held (input, read chunk
    /// and replies); bounded by [`connection_bytes_bound`].
    pub conn_buffer_bytes_max: AtomicU64,
    /// Connections waiting for their client to read replies before they
    /// read more requests.
    pub conns_waiting_to_send: AtomicU64,
    /// Storage commands whose value was received straight into the record
    /// buffer, and `get` values sent from the read buffer
    /// ([`ZERO_COPY_MIN_BYTES`] and more).
    pub zero_copy_sets: AtomicU64,
    pub zero_copy_gets: AtomicU64,
    /// Retrievals answered in a group with the ones pipelined right after
    /// them (their reads together): text `get`/`gets` (`Exec::get_group`)
    /// and binary gets (`Exec::bin_get_group`).
    pub pipelined_gets: AtomicU64,
}

/// Commands timed by [`ServerStats::latency`]; `other` takes `version`,
/// `verbosity`, `stats`, `quit` and unknown commands.
pub const COMMANDS: [&str; 22] = [
    "get",
    "gets",
    "gat",
    "gats",
    "set",
    "add",
    "replace",
    "append",
    "prepend",
    "cas",
    "delete",
    "incr",
    "decr",
    "touch",
    "flush_all",
    "mg",
    "ms",
    "md",
    "ma",
    "mn",
    "me",
    "other",
];

/// The index of a command in [`COMMANDS`].
pub(crate) fn command_index(cmd: &[u8]) -> usize {
    COMMANDS.iter().position(|c| c.as_bytes() == cmd).unwrap_or(COMMANDS.len() - 1)
}

impl ServerStats {
    /// The latency histogram of command `name` (one of [`COMMANDS`]).
    pub fn command_latency(&self, name: &str) -> Option<&Histogram> {
        COMMANDS.iter().position(|c| *c == name).map(|i| &self.latency[i])
    }

    pub(crate) fn buffer_bytes(&self, bytes: usize) {
        granary_rt::net::raise_high_water(&self.conn_buffer_bytes_max, bytes as u64);
    }
}

/// What every connection shares.
pub(crate) struct Ctx {
    pub store: Arc<Store>,
    /// The namespace served: every key command goes to it.
    pub ns: Namespace,
    pub cfg: ServerConfig,
    pub stats: Arc<ServerStats>,
    pub started: Instant,
    /// Unix time at start (memcached's process_started, for exptimes).
    pub started_unix: u32,
    pub threads: usize,
    /// The store evicts when full (cache mode); shown by `stats settings`.
    pub evicting: bool,
    /// The delayed `flush_all` pending, if any (memcached keeps one flush
    /// time, which the last `flush_all` sets).
    pub delayed_flush: Arc<DelayedFlush>,
}

/// The one delayed `flush_all` of a server: each `flush_all` replaces the
/// time of the one pending (an immediate flush cancels it), and one timer
/// task at most runs for it, however many requests set it. The task wakes
/// at least every [`DelayedFlush::TICK`] to see the time the last request
/// set, and ends once nothing is pending.
#[derive(Default)]
pub(crate) struct DelayedFlush {
    state: std::sync::Mutex<FlushTimer>,
}

#[derive(Default)]
struct FlushTimer {
    /// When the pending flush is due; None: none pending.
    due: Option<Instant>,
    /// A timer task is alive (it clears this, under the lock, as it ends).
    running: bool,
}

impl DelayedFlush {
    /// Longest sleep of the timer task between looks at the due time.
    pub const TICK: Duration = Duration::from_secs(1);

    fn state(&self) -> std::sync::MutexGuard<'_, FlushTimer> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Forget the pending flush (a `flush_all` that flushes now).
    pub fn cancel(&self) {
        self.state().due = None;
    }

    /// Flush `ns` at `due` instead of at any time set before; starts the
    /// timer task on this executor if none is alive.
    pub fn set(self: &Arc<Self>, due: Instant, ns: &Namespace) {
        let mut s = self.state();
        s.due = Some(due);
        if !s.running {
            s.running = true;
            drop(s);
            // Owned by the task, so dropped with it even if never polled.
            let mut timer = Timer { of: self.clone(), ended: false };
            let ns = ns.clone();
            granary_rt::spawn(async move { timer.run(ns).await });
        }
    }

    /// Whether a timer task is alive (`stats`: `granary_flush_timers`).
    pub fn timers(&self) -> u64 {
        u64::from(self.state().running)
    }
}

/// The timer task of a [`DelayedFlush`]. A task dropped before it ends
/// (its executor stopping, even before its first poll) or whose flush
/// panics clears the `running` mark, so a later delayed flush starts a
/// timer again (a time set meanwhile waits for that one); a task that
/// ends clears it itself, under the lock, with nothing due.
struct Timer {
    of: Arc<DelayedFlush>,
    ended: bool,
}

impl Drop for Timer {
    fn drop(&mut self) {
        if !self.ended {
            self.of.state().running = false;
        }
    }
}

impl Timer {
    async fn run(&mut self, ns: Namespace) {
        loop {
            let left = {
                let mut s = self.of.state();
                let Some(due) = s.due else {
                    s.running = false;
                    self.ended = true;
                    return;
                };
                let left = due.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    s.due = None;
                }
                left
            };
            if left.is_zero() {
                if let Err(e) = ns.flush_all_async().await {
                    tracing::warn!(error = %e, "delayed flush_all failed");
                }
            } else {
                granary_rt::sleep(left.min(DelayedFlush::TICK)).await;
            }
        }
    }
}

impl Ctx {
    /// Seconds since the server started.
    pub fn uptime(&self) -> u64 {
        self.started.elapsed().as_secs()
    }
}
