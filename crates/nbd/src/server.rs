//! The NBD server: the protocol plugged into the shared listener lifecycle
//! (`granary_server`), which accepts, limits, spreads, times out and
//! drains connections. An admitted connection negotiates (`handshake`)
//! and then transmits (`conn`); one over the limit has its options
//! refused with the reason (`handshake::refuse`).
//!
//! Invariant: the server holds no state of its own between connections
//! but the counters; every connection opens its export by name, so
//! exports added or removed while it runs are seen by the next handshake.

use crate::conn;
use crate::export::Exports;
use crate::handshake::{self, End};
use crate::{NbdConfig, NbdStats, DRAIN_TIMEOUT};
use granary_rt::{Runtime, RuntimeConfig};
use granary_server::{Listener, ListenerConfig, Protocol, Session, Stream};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// The NBD protocol over exports `X`, as the listener serves it.
struct Nbd<X> {
    exports: Arc<X>,
    stats: Arc<NbdStats>,
}

impl<X: Exports> Protocol for Nbd<X> {
    async fn serve(self: Arc<Self>, session: Session) {
        let target = match handshake::negotiate(&session, &*self.exports, &self.stats).await {
            Ok(t) => t,
            Err(End::Closed) => return,
            Err(End::Protocol(why)) => {
                self.stats.protocol_errors.fetch_add(1, Relaxed);
                let peer = session.stream().peer_addr().map(|a| a.to_string()).unwrap_or_default();
                tracing::info!(%peer, why, "NBD connection closed in the handshake");
                return;
            }
        };
        self.stats.handshakes.fetch_add(1, Relaxed);
        conn::transmit(session, target, self.stats.clone()).await
    }

    async fn refuse(self: Arc<Self>, stream: Rc<Stream>) {
        handshake::refuse(&stream, &self.stats).await
    }
}

/// A running NBD server.
pub struct Server {
    listener: Listener,
    stats: Arc<NbdStats>,
}

impl Server {
    /// Bind and serve `exports` on a runtime of its own.
    pub fn start<X: Exports>(exports: Arc<X>, cfg: NbdConfig) -> io::Result<Server> {
        let rt = Arc::new(Runtime::new(RuntimeConfig::with_threads(cfg.threads, "granary-nbd"))?);
        Server::start_on(exports, cfg, rt)
    }

    /// Bind and serve `exports` on `rt` (shared with other listeners;
    /// `cfg.threads` is then ignored).
    pub fn start_on<X: Exports>(exports: Arc<X>, cfg: NbdConfig, rt: Arc<Runtime>) -> io::Result<Server> {
        let listener = granary_rt::net::bind_listener(cfg.listen)?;
        Server::start_with_listener(exports, cfg, rt, listener)
    }

    /// Serve `exports` on `rt` from a listener the caller bound (so it can
    /// check every address before it creates a data file).
    pub fn start_with_listener<X: Exports>(
        exports: Arc<X>,
        cfg: NbdConfig,
        rt: Arc<Runtime>,
        listener: std::net::TcpListener,
    ) -> io::Result<Server> {
        let stats = Arc::new(NbdStats::default());
        let lc = ListenerConfig {
            max_connections: cfg.max_connections,
            idle_timeout: cfg.idle_timeout,
            name: "nbd",
            // NBD stays plain TCP (docs/SECURITY.md).
            tls: None,
        };
        let protocol = Arc::new(Nbd { exports, stats: stats.clone() });
        let listener = Listener::start(rt, listener, lc, protocol, stats.listener.clone())?;
        tracing::debug!(addr = %listener.local_addr(), "NBD server listening");
        Ok(Server { listener, stats })
    }

    /// The address it listens on (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// The counters.
    pub fn stats(&self) -> &NbdStats {
        &self.stats
    }

    /// The counters, shareable (e.g. with a metrics endpoint).
    pub fn shared_stats(&self) -> Arc<NbdStats> {
        self.stats.clone()
    }

    /// Stop accepting, let every connection finish the requests it has
    /// read (replies sent), then close. Waits at most [`DRAIN_TIMEOUT`];
    /// returns the connections still open then (a write cancelled with them
    /// was never acknowledged).
    pub fn shutdown(self) -> usize {
        self.listener.shutdown(DRAIN_TIMEOUT)
    }
}
