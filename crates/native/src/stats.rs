//! The STATS opcode's pairs: the server's counters (declared once in
//! [`NativeStats::registry`], which `/metrics` renders too), its latency
//! per opcode, and the store's figures, as (name, value) text.
//!
//! Invariant: the names are a contract with clients and scripts
//! (docs/PROTOCOL.md): a name once reported keeps its meaning; the
//! lifecycle counters keep their names although `granary_server` keeps
//! them now.

use crate::{NativeStats, OPS};
use granary_rt::metrics::{Kind, Registry};
use granary_store::Store;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

impl NativeStats {
    /// The server's counters, each declared once with its STATS name, its
    /// help and its Prometheus family: what STATS reports and `/metrics`
    /// exports.
    pub fn registry(&self) -> Registry {
        let mut r = Registry::new();
        let g = |a: &AtomicU64| a.load(Relaxed);
        let l = &self.listener;
        self.listener.register("native", &mut r);
        r.counter(
            "bad_frames",
            "granary_native_bad_frames_total",
            "Native connections closed for a malformed frame.",
            g(&self.bad_frames),
        )
        .counter(
            "auth_failures",
            "granary_native_auth_failures_total",
            "Native hellos refused for a missing or wrong token.",
            g(&self.auth_failures),
        );
        for (name, op, v) in [
            ("cmd_get", "get", &self.gets),
            ("cmd_put", "put", &self.puts),
            ("cmd_delete", "delete", &self.deletes),
            ("cmd_mget", "mget", &self.multi_gets),
            ("cmd_batch", "batch", &self.batches),
            ("cmd_nop", "nop", &self.nops),
            ("cmd_stats", "stats", &self.stats),
            ("cmd_ns_create", "ns_create", &self.ns_creates),
            ("cmd_ns_drop", "ns_drop", &self.ns_drops),
            ("cmd_ns_truncate", "ns_truncate", &self.ns_truncates),
            ("cmd_ns_list", "ns_list", &self.ns_lists),
            ("cmd_ns_stats", "ns_stats", &self.ns_stats),
            ("cmd_txn", "txn", &self.txns),
        ] {
            r.export(
                name,
                "Native requests by opcode (MGET and BATCH count once, their keys as get/put/delete too; a TXN counts once).",
                Kind::Counter,
                "granary_native_requests_total",
                Some(("op", op)),
                g(v).into(),
            );
        }
        r.counter(
            "txn_condition_failed",
            "granary_native_txn_condition_failed_total",
            "Native TXNs whose condition failed (EXISTS or NOT_FOUND): nothing applied.",
            g(&self.txn_condition_failed),
        );
        r.counter("get_hits", "granary_native_get_hits_total", "Native GETs that found a value.", g(&self.get_hits))
            .counter(
                "errors",
                "granary_native_errors_total",
                "Native responses with an error status.",
                g(&self.errors),
            );
        for (name, dir, v) in
            [("bytes_read", "read", g(&l.bytes_read)), ("bytes_written", "written", g(&self.bytes_written))]
        {
            r.export(
                name,
                "Native bytes received and sent.",
                Kind::Counter,
                "granary_native_bytes_total",
                Some(("dir", dir)),
                v.into(),
            );
        }
        r.gauge(
            "conn_buffer_bytes_max",
            "granary_native_connection_buffer_bytes_max",
            "Most buffer memory one native connection has held.",
            g(&self.conn_buffer_bytes_max),
        )
        .gauge(
            "conns_waiting_to_send",
            "granary_native_connections_waiting_to_send",
            "Native connections waiting for their client to read.",
            g(&self.conns_waiting_to_send),
        )
        .gauge(
            "conns_paused",
            "granary_native_connections_paused",
            "Native connections starting no request until their client reads.",
            g(&self.conns_paused),
        );
        for (name, dir, v) in
            [("zero_copy_gets", "get", &self.zero_copy_gets), ("zero_copy_puts", "put", &self.zero_copy_puts)]
        {
            r.export(
                name,
                "Native values received into or sent from the engine's buffers without a copy.",
                Kind::Counter,
                "granary_native_zero_copy_total",
                Some(("dir", dir)),
                g(v).into(),
            );
        }
        r
    }
}

/// What STATS reports, in order: the version and uptime, the server's
/// counters ([`NativeStats::registry`]), the latency per opcode, the
/// server's value limit, then every figure of the store
/// ([`granary_store::Stats::registry`]), those whose names the server's own
/// take prefixed `store_` (`get_hits` is the server's GETs that hit,
/// `store_get_hits` the store's of every protocol; `value_bytes_max` the
/// server's limit, `store_value_bytes_max` the store's): each name once,
/// as clients fold the pairs into a map.
pub(crate) fn pairs(s: &NativeStats, store: &Store, started: Instant, value_bytes_max: u32) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = vec![
        ("version".into(), env!("CARGO_PKG_VERSION").to_string()),
        ("uptime".into(), started.elapsed().as_secs().to_string()),
    ];
    v.extend(s.registry().pairs());
    let mut add = |k: &str, x: String| v.push((k.to_string(), x));
    for op in OPS {
        let l = s.op_latency(op).snapshot();
        if l.count() > 0 {
            let name = op.name().to_ascii_lowercase();
            add(&format!("latency_{name}_count"), l.count().to_string());
            add(&format!("latency_{name}_mean_us"), format!("{:.1}", l.mean_ns() as f64 / 1e3));
            let us = |q: f64| l.quantile_ns(q).map_or(0.0, |ns| ns as f64 / 1e3);
            add(&format!("latency_{name}_p99_us"), format!("{:.1}", us(0.99)));
        }
    }
    add("value_bytes_max", value_bytes_max.to_string());
    add("evicting", (store.evicts() as u8).to_string());
    let taken: std::collections::HashSet<String> = v.iter().map(|(k, _)| k.clone()).collect();
    let store_pairs = store.stats().registry().pairs().into_iter();
    v.extend(store_pairs.map(|(k, x)| if taken.contains(&k) { (format!("store_{k}"), x) } else { (k, x) }));
    v
}
