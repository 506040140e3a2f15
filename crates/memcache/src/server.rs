//! The Memcache server: the memcache protocol plugged into the shared
//! listener and connection lifecycle (`granary_server`: accept on one
//! executor in order, connection limit, spread over the executors, idle
//! timeout, draining shutdown), with its configuration and counters.
//!
//! Invariants: a connection over the limit gets memcached's `SERVER_ERROR
//! too many open connections` and is closed; an admitted one is served by
//! [`crate::conn`] until it ends; a server only starts with an item size
//! limit the store's segments can hold.

use crate::conn;
use crate::context::Ctx;
use crate::limits::*;
use granary_rt::{Runtime, RuntimeConfig};
use granary_server::{Listener, ListenerConfig, Protocol, Session, Stream};
use granary_store::Store;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

pub use crate::context::{ServerConfig, ServerStats, COMMANDS};
/// How long [`Server::shutdown`] waits for connections to finish the
/// requests they are executing.
pub use granary_server::DRAIN_TIMEOUT;

/// memcached's answer to a connection over the limit.
const REFUSED: &[u8] = b"SERVER_ERROR too many open connections\r\n";

/// The memcache protocol, as the lifecycle serves it.
struct Memcache {
    ctx: Arc<Ctx>,
}

impl Protocol for Memcache {
    async fn serve(self: Arc<Self>, session: Session) {
        conn::serve(&session, &self.ctx).await
    }

    async fn refuse(self: Arc<Self>, stream: Rc<Stream>) {
        let _ = stream.send_all(REFUSED.to_vec()).await;
    }
}

/// A running server. Dropping it (or [`Server::shutdown`]) stops every
/// executor; connections are closed.
pub struct Server {
    ctx: Arc<Ctx>,
    listener: Listener,
}

impl Server {
    /// Bind and start serving `store` on a runtime of its own.
    pub fn start(store: Arc<Store>, cfg: ServerConfig) -> io::Result<Server> {
        let rt = Arc::new(Runtime::new(RuntimeConfig::with_threads(cfg.threads, "granary-mc"))?);
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
        let ns = store.namespace(&cfg.namespace).map_err(|e| {
            let hint = "create it first (`granary ns create`)";
            io::Error::new(io::ErrorKind::NotFound, format!("memcache listener {}: {e}; {hint}", cfg.listen))
        })?;
        let engine_max = ns.value_bytes_max(KEY_BYTES_MAX) as usize;
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
        granary_server::auth::warn_if_exposed("memcache", std_listener.local_addr()?, cfg.auth.is_some());
        let threads = rt.cores();
        let now = store.now();
        let evicting = store.evicts();
        let lcfg = ListenerConfig {
            max_connections: cfg.max_connections,
            idle_timeout: cfg.idle_timeout,
            name: "memcache",
            tls: cfg.tls.clone(),
        };
        let ctx = Arc::new(Ctx {
            store,
            ns,
            cfg,
            stats: Arc::new(ServerStats::default()),
            started: Instant::now(),
            started_unix: now,
            threads,
            evicting,
            delayed_flush: Default::default(),
        });
        let protocol = Arc::new(Memcache { ctx: ctx.clone() });
        let listener = Listener::start(rt, std_listener, lcfg, protocol, ctx.stats.listener.clone())?;
        tracing::debug!(addr = %listener.local_addr(), threads, "memcache server listening");
        Ok(Server { ctx, listener })
    }

    /// The address it listens on (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
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
    pub fn shutdown(self) -> usize {
        self.listener.shutdown(DRAIN_TIMEOUT)
    }
}
