//! The Memcache listener: one accept loop (on executor 0) that admits
//! connections in the order they came and hands them to the executors in
//! turn, as memcached's listener hands them to its worker threads (each
//! connection then stays on its core); the per-connection request loop,
//! configuration and counters.
//!
//! A connection reads into its input buffer, executes every complete
//! request in it in order (pipelining), buffers the replies and sends them
//! once the input holds no further complete request (or the reply buffer
//! passes [`OUT_FLUSH_BYTES`]). Its memory stays within one request line,
//! one value and the reply buffer (see [`crate::limits`]).

use crate::exec::{Conn, Step};
use crate::limits::*;
use granary_rt::latency::Histogram;
use granary_rt::net::{Connections, TcpListener, TcpStream};
use granary_rt::{Runtime, RuntimeConfig};
use granary_store::Store;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long [`Server::shutdown`] waits for connections to finish the
/// requests they are executing.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

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
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 11211)),
            threads: 0,
            max_connections: CONNECTIONS_DEFAULT,
            item_bytes_max: ITEM_BYTES_DEFAULT,
            idle_timeout: None,
        }
    }
}

/// Counters, with memcached's names where they exist.
#[derive(Default, Debug)]
pub struct ServerStats {
    /// Open connections (`curr_connections`), for the drain at shutdown.
    pub connections: Arc<Connections>,
    pub total_connections: AtomicU64,
    pub rejected_connections: AtomicU64,
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
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub total_items: AtomicU64,
    /// Stores refused as larger than the item size limit (`SERVER_ERROR
    /// object too large for cache`).
    pub store_too_large: AtomicU64,
    /// Stores refused for want of space (store mode full: `SERVER_ERROR
    /// out of memory storing object`).
    pub store_no_memory: AtomicU64,
    /// Connections closed by the idle timeout.
    pub idle_kicks: AtomicU64,
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
    pub cfg: ServerConfig,
    pub stats: Arc<ServerStats>,
    pub started: Instant,
    /// Unix time at start (memcached's process_started, for exptimes).
    pub started_unix: u32,
    pub threads: usize,
    /// The store evicts when full (cache mode); shown by `stats settings`.
    pub evicting: bool,
    /// Hands accepted connections to the executors.
    spawner: granary_rt::Spawner,
}

impl Ctx {
    /// Seconds since the server started.
    pub fn uptime(&self) -> u64 {
        self.started.elapsed().as_secs()
    }
}

/// A running server. Dropping it (or [`Server::shutdown`]) stops every
/// executor; connections are closed.
pub struct Server {
    ctx: Arc<Ctx>,
    addr: SocketAddr,
    rt: Option<Arc<Runtime>>,
    listener: std::net::TcpListener,
}

impl Server {
    /// Bind and start serving `store` on a runtime of its own.
    pub fn start(store: Arc<Store>, cfg: ServerConfig) -> io::Result<Server> {
        let rc = RuntimeConfig {
            threads: if cfg.threads == 0 { RuntimeConfig::default().threads } else { cfg.threads },
            name: "granary-mc".into(),
            ..RuntimeConfig::default()
        };
        let rt = Arc::new(Runtime::new(rc)?);
        Server::start_on(store, cfg, rt)
    }

    /// Bind and start serving `store` on `rt` (shared with other
    /// listeners; `cfg.threads` is then ignored).
    pub fn start_on(store: Arc<Store>, cfg: ServerConfig, rt: Arc<Runtime>) -> io::Result<Server> {
        let std_listener = granary_rt::net::bind_listener(cfg.listen)?;
        Server::start_with_listener(store, cfg, rt, std_listener)
    }

    /// Serve `store` on `rt` from a listener the caller bound (so it can
    /// check every address before it creates a data file).
    pub fn start_with_listener(
        store: Arc<Store>,
        cfg: ServerConfig,
        rt: Arc<Runtime>,
        std_listener: std::net::TcpListener,
    ) -> io::Result<Server> {
        if cfg.item_bytes_max == 0 || cfg.item_bytes_max > ITEM_BYTES_LIMIT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("max item size {} is not in 1..={ITEM_BYTES_LIMIT}", cfg.item_bytes_max),
            ));
        }
        let engine_max = store.value_bytes_max(KEY_BYTES_MAX) as usize;
        if cfg.item_bytes_max > engine_max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "max item size {} exceeds what this store's segments hold ({engine_max} bytes); \
                     create the store with larger segments",
                    cfg.item_bytes_max
                ),
            ));
        }
        let addr = std_listener.local_addr()?;
        let threads = rt.cores();
        let now = store.now();
        let cfg_evicting = store.evicts();
        let ctx = Arc::new(Ctx {
            store,
            cfg,
            stats: Arc::new(ServerStats::default()),
            started: Instant::now(),
            started_unix: now,
            threads,
            evicting: cfg_evicting,
            spawner: rt.spawner(),
        });
        rt.spawn_on(0, accept_loop(TcpListener::from_std(std_listener.try_clone()?), ctx.clone()));
        tracing::debug!(%addr, threads, "memcache server listening");
        Ok(Server { ctx, addr, rt: Some(rt), listener: std_listener })
    }

    /// The address it listens on (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The counters.
    pub fn stats(&self) -> &ServerStats {
        &self.ctx.stats
    }

    /// The counters, shareable (e.g. with a metrics endpoint).
    pub fn shared_stats(&self) -> Arc<ServerStats> {
        self.ctx.stats.clone()
    }

    /// Stop serving and drain: no new connections; every connection
    /// finishes the requests it has read (their replies are sent), then
    /// sees the end of its input and closes. Waits at most
    /// [`DRAIN_TIMEOUT`]; connections still open then are shut down (a
    /// write cancelled with them was never acknowledged). Returns how many
    /// were left.
    pub fn shutdown(mut self) -> usize {
        let left = self.ctx.stats.connections.drain(self.listener.as_raw_fd(), DRAIN_TIMEOUT);
        if left > 0 {
            tracing::warn!(connections = left, "connections still busy after the drain timeout are closed");
        }
        self.rt.take();
        left
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Accept loops end (they may run on a runtime shared with others).
        self.ctx.stats.connections.stop_accepting(self.listener.as_raw_fd());
        self.rt.take();
    }
}

/// One listener's accept loop. Connections are admitted here, in the
/// order the kernel queued them (so a limit refuses the latest, never one
/// accepted earlier), then served by the executors in turn. Left to the
/// kernel (an accept loop per executor on the shared socket), most
/// connections went to one executor.
async fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>) {
    for turn in 0usize.. {
        let accepted = listener.accept().await;
        if ctx.stats.connections.stopping() {
            return;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                // EMFILE and friends: log and go on (a busy loop is bounded
                // by the failing accept itself).
                tracing::warn!(error = %e, "accept failed");
                granary_rt::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        // Counted and registered until its task ends (or is dropped
        // unpolled by a stopping runtime); a tuple drops its fields in
        // order, so the registration goes before the stream closes.
        let (open, n) = ctx.stats.connections.admit(stream.raw_fd());
        let accepted = (open, stream);
        let c = ctx.clone();
        let task = async move {
            let accepted = accepted;
            let stream = &accepted.1;
            if n > c.cfg.max_connections {
                c.stats.rejected_connections.fetch_add(1, Relaxed);
                let _ = stream.send_all(b"SERVER_ERROR too many open connections\r\n".to_vec()).await;
                return;
            }
            c.stats.total_connections.fetch_add(1, Relaxed);
            // A shutdown that ran before the registration missed this one.
            if !c.stats.connections.stopping() {
                serve(stream, &c).await;
            }
        };
        let core = turn % ctx.spawner.cores();
        if granary_rt::current_core() == Some(core) {
            granary_rt::spawn(task);
        } else {
            ctx.spawner.spawn_on(core, task);
        }
    }
}

/// Receive the rest of a value from the socket into its record buffer;
/// None if the connection ended or idled out.
async fn receive_value(stream: &TcpStream, ctx: &Ctx, pb: granary_store::PutBuf) -> Option<granary_store::PutBuf> {
    let r = pb
        .receive(stream, ctx.cfg.idle_timeout, |n| {
            ctx.stats.bytes_read.fetch_add(n as u64, Relaxed);
        })
        .await;
    if matches!(r, Err(granary_store::ReceiveEnd::Idle)) {
        ctx.stats.idle_kicks.fetch_add(1, Relaxed);
    }
    r.ok()
}

/// One connection's request loop.
async fn serve(stream: &TcpStream, ctx: &Ctx) {
    let mut conn = Conn::new(ctx, stream);
    let mut input: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    conn.input_bytes = input.capacity() + chunk.len();
    loop {
        let mut pos = 0;
        let mut close = false;
        while pos < input.len() {
            match conn.step(&input[pos..]).await {
                Step::Consumed(n) => pos += n,
                Step::Receive(n) => {
                    // A large value: what is buffered goes into the record
                    // buffer, the rest comes straight from the socket.
                    pos += n;
                    let mut p = conn.pending.take().expect("Receive leaves a pending value");
                    let take = (input.len() - pos).min(p.pb.value_len() - p.pb.filled());
                    p.pb.fill_from(&input[pos..pos + take]);
                    pos += take;
                    if !p.pb.is_full() {
                        input.clear();
                        pos = 0;
                        // Earlier pipelined replies go out before the wait.
                        if !conn.send().await {
                            return;
                        }
                        match receive_value(stream, ctx, p.pb).await {
                            Some(pb) => p.pb = pb,
                            None => return,
                        }
                    }
                    conn.pending = Some(p);
                }
                Step::NeedMore => break,
                Step::Close => {
                    close = true;
                    break;
                }
            }
            conn.account();
            if conn.out.len() >= OUT_FLUSH_BYTES && !conn.send().await {
                return;
            }
        }
        input.drain(..pos);
        if !conn.send().await || close {
            return;
        }
        // Draining for shutdown: what was read is done; read no more.
        if ctx.stats.connections.stopping() {
            return;
        }
        let r = match stream.recv_within(chunk, ctx.cfg.idle_timeout).await {
            Ok((r, c)) => {
                chunk = c;
                r
            }
            Err(_) => {
                ctx.stats.idle_kicks.fetch_add(1, Relaxed);
                return;
            }
        };
        match r {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                ctx.stats.bytes_read.fetch_add(n as u64, Relaxed);
                input.extend_from_slice(&chunk[..n]);
                conn.input_bytes = input.capacity() + chunk.len();
                conn.account();
            }
        }
    }
}
