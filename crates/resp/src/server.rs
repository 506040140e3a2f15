//! The RESP server: its configuration checked, the protocol plugged into
//! the shared listener lifecycle (`granary_server`), and the INFO report.
//!
//! Invariants: a connection over the limit gets Redis's `-ERR max number
//! of clients reached` and is closed; a running server's
//! `proto-max-bulk-len` fits what the store's segments hold.

use crate::acl::Acl;
use crate::conn;
use crate::exec::{Client, Ctx};
use crate::{RespConfig, RespStats, DRAIN_TIMEOUT};
use granary_rt::{Runtime, RuntimeConfig};
use granary_server::{Listener, ListenerConfig, Protocol, Session, Stream};
use granary_store::Store;
use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Redis's answer to a connection over `maxclients`.
const REFUSED: &[u8] = b"-ERR max number of clients reached\r\n";

/// The RESP protocol, as the lifecycle serves it.
struct Resp {
    ctx: Arc<Ctx>,
}

impl Protocol for Resp {
    async fn serve(self: Arc<Self>, session: Session) {
        conn::serve(&session, &self.ctx).await
    }

    async fn refuse(self: Arc<Self>, stream: Rc<Stream>) {
        let _ = stream.send_all(REFUSED.to_vec()).await;
    }
}

/// A running RESP server.
pub struct Server {
    listener: Listener,
    stats: Arc<RespStats>,
}

impl Server {
    /// Bind and serve `store` on a runtime of its own.
    pub fn start(store: Arc<Store>, cfg: RespConfig) -> io::Result<Server> {
        let rt = Arc::new(Runtime::new(RuntimeConfig::with_threads(cfg.threads, "granary-resp"))?);
        let listener = granary_rt::net::bind_listener(cfg.listen)?;
        Server::start_with_listener(store, cfg, rt, listener)
    }

    /// Serve `store` on `rt` (shared with other listeners) from a listener
    /// the caller bound.
    pub fn start_with_listener(
        store: Arc<Store>,
        cfg: RespConfig,
        rt: Arc<Runtime>,
        listener: std::net::TcpListener,
    ) -> io::Result<Server> {
        let engine_max = store.value_bytes_max(1);
        if cfg.value_bytes_max == 0 || cfg.value_bytes_max as u64 > engine_max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "largest value {} is not in 1..={engine_max} (what this store's segments hold)",
                    cfg.value_bytes_max
                ),
            ));
        }
        if cfg.databases == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "databases must be at least 1"));
        }
        if cfg.requirepass.is_some() && cfg.acl.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "requirepass and an ACL file cannot both be set: give the default user its password in the ACL file",
            ));
        }
        let users = cfg.acl.clone().unwrap_or_else(|| Arc::new(Acl::with_requirepass(cfg.requirepass.as_deref())));
        // Open to everyone unless the default user needs a password (or is off).
        let authenticated = !users.default_user().needs_no_auth();
        granary_server::auth::warn_if_exposed("resp", listener.local_addr()?, authenticated);
        let stats = Arc::new(RespStats::default());
        let lc = ListenerConfig {
            max_connections: cfg.max_connections,
            idle_timeout: cfg.idle_timeout,
            name: "resp",
            tls: cfg.tls.clone(),
        };
        let ctx = Arc::new(Ctx::new(store, stats.clone(), cfg, users));
        let listener = Listener::start(rt, listener, lc, Arc::new(Resp { ctx }), stats.listener.clone())?;
        Ok(Server { listener, stats })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    pub fn stats(&self) -> &RespStats {
        &self.stats
    }

    /// The counters, shareable (e.g. with a metrics endpoint).
    pub fn shared_stats(&self) -> Arc<RespStats> {
        self.stats.clone()
    }

    /// Stop accepting, let every connection finish what it has read, then
    /// close. Waits at most [`DRAIN_TIMEOUT`]; returns the connections
    /// still open then.
    pub fn shutdown(self) -> usize {
        self.listener.shutdown(DRAIN_TIMEOUT)
    }
}

/// CLIENT INFO's line for `c`.
pub(crate) fn client_line(c: &Client) -> String {
    let s = |v: &Option<Vec<u8>>| v.as_deref().map(String::from_utf8_lossy).unwrap_or_default().into_owned();
    format!(
        "id={} name={} db={} multi={} watch={} resp={} lib-name={} lib-ver={}\n",
        c.id,
        s(&c.name),
        c.db,
        c.multi.as_ref().map_or(-1, |m| m.queue.len() as i64),
        c.watched.len(),
        if c.resp3 { 3 } else { 2 },
        s(&c.lib_name),
        s(&c.lib_ver),
    )
}

/// INFO's text: the sections asked for (all by default), Redis's field
/// names where Redis has the fact, Granary's own under `granary_`.
pub(crate) fn info(ctx: &Ctx, _client: &Client, sections: &[&[u8]]) -> String {
    let want = |name: &str| {
        sections.is_empty()
            || sections.iter().any(|s| {
                let s = String::from_utf8_lossy(s).to_ascii_lowercase();
                s == name || s == "all" || s == "everything" || (s == "default" && name != "commandstats")
            })
    };
    let st = &ctx.stats;
    let store = ctx.store.stats();
    let mut o = String::new();
    let mut section = |name: &str, title: &str, body: &mut dyn FnMut(&mut String)| {
        if want(name) {
            if !o.is_empty() {
                o.push_str("\r\n");
            }
            let _ = write!(o, "# {title}\r\n");
            body(&mut o);
        }
    };
    section("server", "Server", &mut |o| {
        let _ = write!(
            o,
            "redis_version:7.0.0\r\ngranary_version:{}\r\nredis_mode:standalone\r\nos:{}\r\narch_bits:64\r\n\
             process_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\nuptime_in_days:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::process::id(),
            ctx.cfg.listen.port(),
            ctx.started.elapsed().as_secs(),
            ctx.started.elapsed().as_secs() / 86400,
        );
    });
    section("clients", "Clients", &mut |o| {
        let _ = write!(
            o,
            "connected_clients:{}\r\nmaxclients:{}\r\n",
            st.listener.connections.open(),
            ctx.cfg.max_connections
        );
    });
    section("memory", "Memory", &mut |o| {
        let rss = resident_bytes();
        let _ = write!(
            o,
            "used_memory:{rss}\r\nused_memory_rss:{rss}\r\nmaxmemory:0\r\nmaxmemory_policy:{}\r\n\
             granary_index_bytes:{}\r\ngranary_device_bytes:{}\r\n",
            if ctx.store.evicts() { "allkeys-lru" } else { "noeviction" },
            store.index.memory_bytes,
            store.device_bytes,
        );
    });
    section("stats", "Stats", &mut |o| {
        let _ = write!(
            o,
            "total_connections_received:{}\r\ntotal_commands_processed:{}\r\nrejected_connections:{}\r\n\
             total_net_input_bytes:{}\r\ntotal_net_output_bytes:{}\r\nkeyspace_hits:{}\r\nkeyspace_misses:{}\r\n\
             total_error_replies:{}\r\ngranary_protocol_errors:{}\r\ngranary_txn_commits:{}\r\n\
             granary_txn_retries:{}\r\ngranary_txn_watch_aborts:{}\r\ngranary_read_only:{}\r\ngranary_auth_failures:{}\r\n",
            st.listener.total_connections.load(Relaxed),
            st.commands.load(Relaxed),
            st.listener.rejected_connections.load(Relaxed),
            st.listener.bytes_read.load(Relaxed),
            st.bytes_written.load(Relaxed),
            st.keyspace_hits.load(Relaxed),
            st.keyspace_misses.load(Relaxed),
            st.errors.load(Relaxed),
            st.protocol_errors.load(Relaxed),
            st.txn_commits.load(Relaxed),
            st.txn_retries.load(Relaxed),
            st.txn_aborts.load(Relaxed),
            u8::from(store.read_only.is_some()),
            st.auth_failures.load(Relaxed),
        );
    });
    section("keyspace", "Keyspace", &mut |o| {
        for ns in ctx.store.namespaces() {
            // A database's namespace by its exact name (`db03` is not
            // database 3), and not an export that bears one.
            let n = ns.name.strip_prefix("db").and_then(|n| n.parse::<usize>().ok());
            if let Some(n) = n.filter(|&n| ns.name == format!("db{n}") && !ns.options.kind.is_block()) {
                if n < ctx.cfg.databases && ns.keys > 0 {
                    let _ = write!(o, "db{n}:keys={},expires=0,avg_ttl=0\r\n", ns.keys);
                }
            }
        }
    });
    o
}

/// This process's resident memory, bytes (0 if /proc is not readable).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
