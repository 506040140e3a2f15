//! The `stats` command's renderings: memcached's general fields that apply
//! and Granary's own (`stats`), `stats settings`, `stats items`, `stats
//! slabs` and Granary's `stats latency`, as name and value pairs the
//! executor writes as `STAT` lines. Reads the counters and the store's
//! statistics; changes nothing.

use crate::context::{Ctx, ServerStats};
use granary_rt::metrics::{Kind, Registry};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The version string `version` and `stats` report.
pub(crate) fn version() -> String {
    format!("1.6.0-granary-{}", env!("CARGO_PKG_VERSION"))
}

/// `STAT` lines: name and value.
pub(crate) type Lines = Vec<(String, String)>;

/// The process's user and system CPU time, as memcached prints them
/// (seconds.microseconds).
fn rusage() -> (String, String) {
    // SAFETY: getrusage fills the zeroed struct it is given; RUSAGE_SELF
    // is always valid.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| format!("{}.{:06}", t.tv_sec, t.tv_usec);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

impl ServerStats {
    /// The server's counters, each declared once with its `stats` name
    /// (memcached's where it has one), its help and its Prometheus family:
    /// what `stats` prints and `/metrics` exports.
    pub fn registry(&self) -> Registry {
        let mut r = Registry::new();
        let g = |a: &AtomicU64| a.load(Relaxed);
        let l = &self.listener;
        self.listener.register("memcache", &mut r);
        for (name, cmd, v) in [
            ("cmd_get", "get", &self.cmd_get),
            ("cmd_set", "set", &self.cmd_set),
            ("cmd_flush", "flush", &self.cmd_flush),
            ("cmd_touch", "touch", &self.cmd_touch),
            ("cmd_meta", "meta", &self.cmd_meta),
        ] {
            r.export(
                name,
                "Memcache commands by kind.",
                Kind::Counter,
                "granary_memcache_commands_total",
                Some(("cmd", cmd)),
                g(v).into(),
            );
        }
        for (name, result, v) in [
            ("get_hits", "get_hit", &self.get_hits),
            ("get_misses", "get_miss", &self.get_misses),
            ("delete_misses", "delete_miss", &self.delete_misses),
            ("delete_hits", "delete_hit", &self.delete_hits),
            ("incr_misses", "incr_miss", &self.incr_misses),
            ("incr_hits", "incr_hit", &self.incr_hits),
            ("decr_misses", "decr_miss", &self.decr_misses),
            ("decr_hits", "decr_hit", &self.decr_hits),
            ("cas_misses", "cas_miss", &self.cas_misses),
            ("cas_hits", "cas_hit", &self.cas_hits),
            ("cas_badval", "cas_badval", &self.cas_badval),
            ("touch_hits", "touch_hit", &self.touch_hits),
            ("touch_misses", "touch_miss", &self.touch_misses),
        ] {
            r.export(
                name,
                "Memcache command results.",
                Kind::Counter,
                "granary_memcache_results_total",
                Some(("result", result)),
                g(v).into(),
            );
        }
        for (name, dir, v) in
            [("bytes_read", "read", g(&l.bytes_read)), ("bytes_written", "written", g(&self.bytes_written))]
        {
            r.export(
                name,
                "Memcache bytes received and sent.",
                Kind::Counter,
                "granary_memcache_bytes_total",
                Some(("dir", dir)),
                v.into(),
            );
        }
        r.counter("total_items", "granary_memcache_items_stored_total", "Items stored.", g(&self.total_items))
            .counter(
                "protocol_errors",
                "granary_memcache_protocol_errors_total",
                "Memcache protocol errors.",
                g(&self.protocol_errors),
            )
            .counter(
                "granary_pipelined_gets",
                "granary_memcache_pipelined_gets_total",
                "Retrievals (text get/gets, binary gets) answered together with the ones pipelined after them (their reads in flight together).",
                g(&self.pipelined_gets),
            )
            .counter(
                "auth_cmds",
                "granary_memcache_auth_commands_total",
                "Authentication attempts (the auth file's set).",
                g(&self.auth_cmds),
            )
            .counter(
                "auth_errors",
                "granary_memcache_auth_errors_total",
                "Authentication attempts refused.",
                g(&self.auth_errors),
            );
        for (name, reason, v) in [
            ("store_too_large", "too_large", &self.store_too_large),
            ("store_no_memory", "no_memory", &self.store_no_memory),
        ] {
            r.export(
                name,
                "Memcache stores refused: larger than the item size limit, or no room in a full store.",
                Kind::Counter,
                "granary_memcache_stores_refused_total",
                Some(("reason", reason)),
                g(v).into(),
            );
        }
        r.gauge(
            "granary_conn_buffer_bytes_max",
            "granary_memcache_connection_buffer_bytes_max",
            "Most buffer memory one Memcache connection has held.",
            g(&self.conn_buffer_bytes_max),
        )
        .gauge(
            "granary_conns_waiting_to_send",
            "granary_memcache_connections_waiting_to_send",
            "Memcache connections waiting for their client to read.",
            g(&self.conns_waiting_to_send),
        );
        for (name, dir, v) in [
            ("granary_zero_copy_sets", "set", &self.zero_copy_sets),
            ("granary_zero_copy_gets", "get", &self.zero_copy_gets),
        ] {
            r.export(
                name,
                "Memcache values received into or sent from the engine's buffers without a copy.",
                Kind::Counter,
                "granary_memcache_zero_copy_total",
                Some(("dir", dir)),
                g(v).into(),
            );
        }
        r
    }
}

/// `stats`: memcached's process fields, the server's counters
/// ([`ServerStats::registry`]), memcached's item fields from the served
/// namespace (`curr_items`, `bytes`: its values and their records' bytes),
/// then every figure of the store ([`granary_store::Stats::registry`]) as
/// `granary_<name>` (dots as underscores).
pub(crate) fn general(ctx: &Ctx) -> Lines {
    let rusage = rusage();
    let st = ctx.store.stats();
    let ns = ns_stats(ctx);
    let mut v: Lines = vec![
        ("pid".into(), std::process::id().to_string()),
        ("uptime".into(), ctx.uptime().to_string()),
        ("time".into(), ctx.store.now().to_string()),
        ("version".into(), version()),
        ("pointer_size".into(), (8 * std::mem::size_of::<usize>()).to_string()),
        ("rusage_user".into(), rusage.0),
        ("rusage_system".into(), rusage.1),
        ("max_connections".into(), ctx.cfg.max_connections.to_string()),
        ("threads".into(), ctx.threads.to_string()),
        // The listener is never paused: connections past the limit are
        // accepted and closed (rejected_connections).
        ("accepting_conns".into(), "1".into()),
        ("listen_disabled_num".into(), "0".into()),
    ];
    v.extend(ctx.stats.registry().pairs());
    v.extend([
        ("limit_maxbytes".into(), st.device_bytes.to_string()),
        ("curr_items".into(), ns.keys.to_string()),
        ("bytes".into(), ns.value_bytes.to_string()),
        ("evictions".into(), ns.evictions.to_string()),
        ("expired_unfetched".into(), ns.expired_unfetched.to_string()),
        ("evicted_unfetched".into(), ns.evicted_unfetched.to_string()),
        ("granary_namespace".into(), ns.name.clone()),
        ("granary_flush_timers".into(), ctx.delayed_flush.timers().to_string()),
    ]);
    v.extend(
        st.registry().pairs().into_iter().map(|(name, value)| (format!("granary_{}", name.replace('.', "_")), value)),
    );
    v
}

/// `stats latency` (Granary's own): for each command that ran, and for
/// device reads, writes and flushes, the count, mean and the 50th, 99th
/// and 99.9th percentiles in microseconds. Percentiles are the upper bound
/// of their histogram bucket (the buckets of `/metrics`).
pub(crate) fn latency(ctx: &Ctx) -> Lines {
    let io = ctx.store.stats().io;
    let mut v = Lines::new();
    let commands = crate::context::COMMANDS.iter().zip(ctx.stats.latency.iter()).map(|(c, h)| (*c, h.snapshot()));
    let device =
        [("device_read", io.read_latency), ("device_write", io.write_latency), ("device_flush", io.flush_latency)];
    for (name, s) in commands.chain(device) {
        if s.count() == 0 {
            continue;
        }
        let us = |q: f64| match s.quantile_ns(q) {
            Some(u64::MAX) => "inf".to_string(),
            Some(ns) => format!("{:.1}", ns as f64 / 1e3),
            None => "0".to_string(),
        };
        v.push((format!("{name}:count"), s.count().to_string()));
        v.push((format!("{name}:mean_us"), format!("{:.1}", s.mean_ns() as f64 / 1e3)));
        v.push((format!("{name}:p50_us"), us(0.5)));
        v.push((format!("{name}:p99_us"), us(0.99)));
        v.push((format!("{name}:p999_us"), us(0.999)));
    }
    v
}

/// `stats settings`.
pub(crate) fn settings(ctx: &Ctx) -> Lines {
    let c = &ctx.cfg;
    vec![
        ("maxbytes".into(), ctx.store.stats().device_bytes.to_string()),
        ("maxconns".into(), c.max_connections.to_string()),
        ("tcpport".into(), c.listen.port().to_string()),
        ("interface".into(), c.listen.ip().to_string()),
        ("num_threads".into(), ctx.threads.to_string()),
        ("item_size_max".into(), c.item_bytes_max.to_string()),
        ("evictions".into(), if ctx.evicting { "on" } else { "off" }.into()),
        ("cas_enabled".into(), "yes".into()),
        ("binding_protocol".into(), "ascii".into()),
    ]
}

/// `stats items`: Granary has no slab classes; one class stands for all.
pub(crate) fn items(ctx: &Ctx) -> Lines {
    let ns = ns_stats(ctx);
    vec![
        ("items:1:number".into(), ns.keys.to_string()),
        ("items:1:evicted".into(), ns.evictions.to_string()),
        ("items:1:expired_unfetched".into(), ns.expired_unfetched.to_string()),
        ("items:1:evicted_unfetched".into(), ns.evicted_unfetched.to_string()),
    ]
}

/// The served namespace's figures (zeros, with its name, once it was
/// dropped under the listener).
fn ns_stats(ctx: &Ctx) -> granary_store::NamespaceStats {
    ctx.ns.stats().unwrap_or_else(|_| granary_store::NamespaceStats {
        name: ctx.ns.name().to_string(),
        id: 0,
        options: ctx.ns.options(),
        keys: 0,
        value_bytes: 0,
        gets: 0,
        hits: 0,
        misses: 0,
        sets: 0,
        deletes: 0,
        evictions: 0,
        expirations: 0,
        evicted_unfetched: 0,
        expired_unfetched: 0,
    })
}

/// `stats slabs`: there are no slab classes.
pub(crate) fn slabs() -> Lines {
    vec![("active_slabs".into(), "0".into()), ("total_malloced".into(), "0".into())]
}
