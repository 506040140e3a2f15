//! The NBD server's counters as a metrics registry: each declared once,
//! with its `stats` name, its help and its Prometheus family.
//!
//! Invariant: a name once reported keeps its meaning (scripts and
//! dashboards read them).

use crate::NbdStats;
use granary_rt::metrics::{Kind, Registry};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

impl NbdStats {
    /// The server's counters, as `/metrics` exports them.
    pub fn registry(&self) -> Registry {
        let mut r = Registry::new();
        let g = |a: &AtomicU64| a.load(Relaxed);
        self.listener.register("nbd", &mut r);
        r.counter(
            "handshakes",
            "granary_nbd_handshakes_total",
            "NBD connections that chose an export.",
            g(&self.handshakes),
        );
        for (name, command, v) in [
            ("cmd_read", "read", &self.reads),
            ("cmd_write", "write", &self.writes),
            ("cmd_trim", "trim", &self.trims),
            ("cmd_write_zeroes", "write_zeroes", &self.write_zeroes),
            ("cmd_flush", "flush", &self.flushes),
            ("cmd_cache", "cache", &self.caches),
        ] {
            r.export(
                name,
                "NBD requests by command.",
                Kind::Counter,
                "granary_nbd_requests_total",
                Some(("command", command)),
                g(v).into(),
            );
        }
        for (name, dir, v) in
            [("read_bytes", "read", &self.read_bytes), ("written_bytes", "written", &self.written_bytes)]
        {
            r.export(
                name,
                "Export bytes read and written by NBD requests.",
                Kind::Counter,
                "granary_nbd_export_bytes_total",
                Some(("dir", dir)),
                g(v).into(),
            );
        }
        for (name, dir, v) in
            [("bytes_read", "read", &self.listener.bytes_read), ("bytes_written", "written", &self.bytes_sent)]
        {
            r.export(
                name,
                "NBD bytes received and sent.",
                Kind::Counter,
                "granary_nbd_bytes_total",
                Some(("dir", dir)),
                g(v).into(),
            );
        }
        r.counter(
            "partial_blocks",
            "granary_nbd_partial_blocks_total",
            "Blocks written partially by read-modify-write (unaligned NBD writes and zeroes).",
            g(&self.partial_blocks),
        )
        .counter("syncs", "granary_nbd_syncs_total", "Syncs run for NBD FLUSH and FUA.", g(&self.syncs))
        .counter("errors", "granary_nbd_errors_total", "NBD replies with an error.", g(&self.errors))
        .counter(
            "protocol_errors",
            "granary_nbd_protocol_errors_total",
            "NBD connections closed for malformed input.",
            g(&self.protocol_errors),
        )
        .gauge(
            "inflight_max",
            "granary_nbd_connection_inflight_max",
            "Most requests one NBD connection has had in flight.",
            g(&self.inflight_max),
        );
        r
    }
}
