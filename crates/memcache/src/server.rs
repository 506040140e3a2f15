//! The Memcache listener: one accept loop per executor on a shared
//! listening socket (each connection stays on the core that accepted it),
//! the per-connection request loop, configuration and counters.
//!
//! A connection reads into its input buffer, executes every complete
//! request in it in order (pipelining), buffers the replies and sends them
//! once the input holds no further complete request (or the reply buffer
//! passes [`OUT_FLUSH_BYTES`]). Its memory stays within one request line,
//! one value and the reply buffer (see [`crate::limits`]).

use crate::exec::{Conn, Step};
use crate::limits::*;
use granary_rt::net::{TcpListener, TcpStream};
use granary_rt::{Runtime, RuntimeConfig};
use granary_store::Store;
use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
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
    pub curr_connections: AtomicUsize,
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
    /// Connections closed by the idle timeout.
    pub idle_kicks: AtomicU64,
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
    /// Set by [`Server::shutdown`]: accept loops stop.
    stopping: AtomicBool,
    /// Descriptors of open connections, to end their reads at shutdown.
    conns: Mutex<HashSet<RawFd>>,
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
        let std_listener = std::net::TcpListener::bind(cfg.listen)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {}: {e}", cfg.listen)))?;
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
            stopping: AtomicBool::new(false),
            conns: Mutex::new(HashSet::new()),
        });
        for core in 0..rt.cores() {
            let l = TcpListener::from_std(std_listener.try_clone()?);
            let c = ctx.clone();
            rt.spawn_on(core, accept_loop(l, c));
        }
        tracing::info!(%addr, threads, "memcache server listening");
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
    /// [`DRAIN_TIMEOUT`]; what is still running then is cancelled (a
    /// cancelled write was never acknowledged). Returns the connections
    /// cancelled.
    pub fn shutdown(mut self) -> usize {
        let ctx = &self.ctx;
        ctx.stopping.store(true, Relaxed);
        // SAFETY: shutdown(2) on descriptors we own (the listener, and
        // connections still registered: a connection deregisters before
        // its descriptor is closed, under the same lock).
        unsafe {
            libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR);
            for &fd in ctx.conns.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                libc::shutdown(fd, libc::SHUT_RD);
            }
        }
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        while ctx.stats.curr_connections.load(Relaxed) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        let left = ctx.stats.curr_connections.load(Relaxed);
        if left > 0 {
            tracing::warn!(connections = left, "connections still busy after the drain timeout are closed");
            for &fd in ctx.conns.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                // SAFETY: as above; sends blocked on a client that does not
                // read fail, and those connections end.
                unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            }
        }
        self.rt.take();
        left
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Accept loops end (they may run on a runtime shared with others).
        self.ctx.stopping.store(true, Relaxed);
        // SAFETY: shutdown(2) on the listener we own.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        self.rt.take();
    }
}

async fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>) {
    loop {
        let accepted = listener.accept().await;
        if ctx.stopping.load(Relaxed) {
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
        let n = ctx.stats.curr_connections.fetch_add(1, Relaxed) + 1;
        if n > ctx.cfg.max_connections {
            ctx.stats.curr_connections.fetch_sub(1, Relaxed);
            ctx.stats.rejected_connections.fetch_add(1, Relaxed);
            let _ = stream.send_all(b"SERVER_ERROR too many open connections\r\n".to_vec()).await;
            continue;
        }
        ctx.stats.total_connections.fetch_add(1, Relaxed);
        let c = ctx.clone();
        granary_rt::spawn(async move {
            // Deregistered and counted down however the task ends (a panic
            // included), before the stream (declared first) is closed.
            struct Open<'a>(&'a Ctx, RawFd);
            impl Drop for Open<'_> {
                fn drop(&mut self) {
                    self.0.conns.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.1);
                    self.0.stats.curr_connections.fetch_sub(1, Relaxed);
                }
            }
            let stream = stream;
            let fd = stream.raw_fd();
            c.conns.lock().unwrap_or_else(|e| e.into_inner()).insert(fd);
            let _open = Open(&c, fd);
            // A shutdown that ran before the registration missed this one.
            if !c.stopping.load(Relaxed) {
                serve(&stream, &c).await;
            }
        });
    }
}

/// One connection's request loop.
async fn serve(stream: &TcpStream, ctx: &Ctx) {
    let mut conn = Conn::new(ctx, stream);
    let mut input: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    loop {
        let mut pos = 0;
        let mut close = false;
        while pos < input.len() {
            match conn.step(&input[pos..]).await {
                Step::Consumed(n) => pos += n,
                Step::NeedMore => break,
                Step::Close => {
                    close = true;
                    break;
                }
            }
            if conn.out.len() >= OUT_FLUSH_BYTES && !conn.send().await {
                return;
            }
        }
        input.drain(..pos);
        if !conn.send().await || close {
            return;
        }
        // Draining for shutdown: what was read is done; read no more.
        if ctx.stopping.load(Relaxed) {
            return;
        }
        let r = match ctx.cfg.idle_timeout {
            None => {
                let (r, c) = stream.recv(chunk).await;
                chunk = c;
                r
            }
            Some(d) => match granary_rt::timeout(d, stream.recv(chunk)).await {
                Ok((r, c)) => {
                    chunk = c;
                    r
                }
                Err(_) => {
                    // The cancelled receive keeps its buffer until the
                    // kernel lets go of it; the connection ends here.
                    ctx.stats.idle_kicks.fetch_add(1, Relaxed);
                    return;
                }
            },
        };
        match r {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                ctx.stats.bytes_read.fetch_add(n as u64, Relaxed);
                input.extend_from_slice(&chunk[..n]);
            }
        }
    }
}
