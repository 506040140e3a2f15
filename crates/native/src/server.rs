//! The native server: its configuration checked, the protocol plugged into
//! the shared listener lifecycle (`granary_server`), which accepts, limits,
//! spreads, times out and drains connections. A connection over the limit
//! is answered with a `BUSY` hello; an admitted one is served by `conn`.
//!
//! Invariant: a running server's value limit is within both the protocol's
//! and what the store's segments hold, so every frame the hello announces
//! can be stored (a long key leaves a little less room, which the engine
//! enforces per request with `VALUE_TOO_LARGE`).

use crate::conn;
use crate::exec::Ctx;
use crate::parse::Limits;
use crate::{NativeConfig, NativeStats, DRAIN_TIMEOUT};
use granary_proto::{self as proto, Status};
use granary_rt::{Runtime, RuntimeConfig};
use granary_server::{Listener, ListenerConfig, Protocol, Session, Stream};
use granary_store::Store;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// The native protocol, as the listener serves it.
struct Native {
    ctx: Arc<Ctx>,
}

impl Protocol for Native {
    fn serve(self: Arc<Self>, session: Session) -> impl Future<Output = ()> + 'static {
        conn::serve(session, self.ctx.clone())
    }

    async fn refuse(self: Arc<Self>, stream: Rc<Stream>) {
        let _ = conn::hello(&stream, &self.ctx, Status::Busy).await;
    }
}

/// A running native server.
pub struct Server {
    listener: Listener,
    stats: Arc<NativeStats>,
}

impl Server {
    /// Bind and serve `store` on a runtime of its own.
    pub fn start(store: Arc<Store>, cfg: NativeConfig) -> io::Result<Server> {
        let rt = Arc::new(Runtime::new(RuntimeConfig::with_threads(cfg.threads, "granary-native"))?);
        Server::start_on(store, cfg, rt)
    }

    /// Bind and serve `store` on `rt` (shared with other listeners).
    pub fn start_on(store: Arc<Store>, cfg: NativeConfig, rt: Arc<Runtime>) -> io::Result<Server> {
        let listener = granary_rt::net::bind_listener(cfg.listen)?;
        Server::start_with_listener(store, cfg, rt, listener)
    }

    /// Serve `store` on `rt` from a listener the caller bound (so it can
    /// check every address before it creates a data file).
    pub fn start_with_listener(
        store: Arc<Store>,
        cfg: NativeConfig,
        rt: Arc<Runtime>,
        listener: std::net::TcpListener,
    ) -> io::Result<Server> {
        // With a short key; a long key leaves a little less room.
        let engine_max = store.value_bytes_max(1);
        if cfg.value_bytes_max == 0 || cfg.value_bytes_max > proto::VALUE_BYTES_LIMIT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("largest value {} is not in 1..={}", cfg.value_bytes_max, proto::VALUE_BYTES_LIMIT),
            ));
        }
        if cfg.value_bytes_max as u64 > engine_max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "largest value {} exceeds what this store's segments hold ({engine_max} bytes); \
                     create the store with larger segments",
                    cfg.value_bytes_max
                ),
            ));
        }
        if let Some(t) = &cfg.token {
            if t.is_empty() || t.len() > proto::HELLO_TOKEN_BYTES_MAX {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("the token is {} bytes; a hello carries 1 to {}", t.len(), proto::HELLO_TOKEN_BYTES_MAX),
                ));
            }
        }
        granary_server::auth::warn_if_exposed("native", listener.local_addr()?, cfg.token.is_some());
        let stats = Arc::new(NativeStats::default());
        let ctx = Arc::new(Ctx {
            store,
            limits: Limits {
                frame_max: proto::frame_bytes_max(cfg.value_bytes_max),
                value_bytes_max: cfg.value_bytes_max,
            },
            stats: stats.clone(),
            started: Instant::now(),
            token: cfg.token.clone(),
        });
        let lc = ListenerConfig {
            max_connections: cfg.max_connections,
            idle_timeout: cfg.idle_timeout,
            name: "native",
            tls: cfg.tls.clone(),
        };
        let listener = Listener::start(rt, listener, lc, Arc::new(Native { ctx }), stats.listener.clone())?;
        Ok(Server { listener, stats })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    pub fn stats(&self) -> &NativeStats {
        &self.stats
    }

    /// The counters, shareable (e.g. with a metrics endpoint).
    pub fn shared_stats(&self) -> Arc<NativeStats> {
        self.stats.clone()
    }

    /// Stop accepting, let every connection finish the requests it has
    /// read (responses sent), then close. Waits at most [`DRAIN_TIMEOUT`];
    /// returns the connections still open then (cancelled with the runtime
    /// if this server owns it).
    pub fn shutdown(self) -> usize {
        self.listener.shutdown(DRAIN_TIMEOUT)
    }
}
