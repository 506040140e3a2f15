//! `granary serve --metrics ADDR`: the Prometheus text endpoint
//! (`GET /metrics`), served by a task on the server's own runtime (no
//! second async runtime). It renders the counters the listeners and the
//! store keep; nothing is computed on the request path of the servers.

use granary_memcache::ServerStats;
use granary_native::NativeStats;
use granary_rt::latency::Snapshot;
use granary_rt::net::{TcpListener, TcpStream};
use granary_rt::Runtime;
use granary_store::Store;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Longest HTTP request head read; longer requests get 431 and a close.
pub const REQUEST_HEAD_MAX: usize = 8 * 1024;
/// A client that has not sent its request head by then is disconnected.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the endpoint reports.
#[derive(Clone)]
pub struct Sources {
    pub store: Arc<Store>,
    pub memcache: Arc<ServerStats>,
    pub native: Option<Arc<NativeStats>>,
    /// The server's executors.
    pub runtime: Option<granary_rt::StatsReader>,
}

/// Serve on `rt` from a bound listener; returns its address.
pub fn serve(l: std::net::TcpListener, src: Sources, rt: &Runtime) -> std::io::Result<SocketAddr> {
    let bound = l.local_addr()?;
    let listener = TcpListener::from_std(l);
    rt.spawn_on(0, async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                granary_rt::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let src = src.clone();
            granary_rt::spawn(async move {
                let _ = granary_rt::timeout(REQUEST_TIMEOUT, answer(&s, &src)).await;
            });
        }
    });
    Ok(bound)
}

async fn answer(s: &TcpStream, src: &Sources) {
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > REQUEST_HEAD_MAX {
            let _ =
                s.send_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n\r\n".to_vec()).await;
            return;
        }
        let (r, b) = s.recv(vec![0u8; 2048]).await;
        match r {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&b[..n]),
        }
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, path) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let (status, ctype, body) = if method != b"GET" {
        ("405 Method Not Allowed", "text/plain", "only GET is served\n".to_string())
    } else if path == b"/metrics" {
        ("200 OK", "text/plain; version=0.0.4; charset=utf-8", render(src))
    } else {
        ("404 Not Found", "text/plain", "metrics are at /metrics\n".to_string())
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.send_all(resp.into_bytes()).await;
}

struct Out(String);

impl Out {
    fn metric(&mut self, name: &str, kind: &str, help: &str, samples: &[(&str, f64)]) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
        for (labels, v) in samples {
            if labels.is_empty() {
                let _ = writeln!(self.0, "{name} {v}");
            } else {
                let _ = writeln!(self.0, "{name}{{{labels}}} {v}");
            }
        }
    }
    fn counter(&mut self, name: &str, help: &str, v: u64) {
        self.metric(name, "counter", help, &[("", v as f64)]);
    }
    fn gauge(&mut self, name: &str, help: &str, v: f64) {
        self.metric(name, "gauge", help, &[("", v)]);
    }
    /// A histogram in seconds, one series per label set.
    fn histogram(&mut self, name: &str, help: &str, series: &[(String, Snapshot)]) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} histogram");
        for (labels, s) in series {
            for (le, n) in s.cumulative() {
                let le = if le.is_infinite() { "+Inf".to_string() } else { le.to_string() };
                let _ = writeln!(self.0, "{name}_bucket{{{labels},le=\"{le}\"}} {n}");
            }
            let _ = writeln!(self.0, "{name}_sum{{{labels}}} {}", s.sum_ns as f64 / 1e9);
            let _ = writeln!(self.0, "{name}_count{{{labels}}} {}", s.count());
        }
    }
}

fn g(a: &AtomicU64) -> f64 {
    a.load(Relaxed) as f64
}

/// The metrics page.
pub fn render(src: &Sources) -> String {
    let mut o = Out(String::new());
    let st = src.store.stats();
    let m = &src.memcache;
    o.gauge("granary_memcache_connections", "Open Memcache connections.", m.connections.open() as f64);
    o.counter(
        "granary_memcache_connections_total",
        "Memcache connections accepted.",
        m.total_connections.load(Relaxed),
    );
    o.counter(
        "granary_memcache_rejected_connections_total",
        "Memcache connections refused at the limit.",
        m.rejected_connections.load(Relaxed),
    );
    o.counter(
        "granary_memcache_idle_kicks_total",
        "Memcache connections closed by the idle timeout.",
        m.idle_kicks.load(Relaxed),
    );
    o.metric(
        "granary_memcache_commands_total",
        "counter",
        "Memcache commands by kind.",
        &[
            ("cmd=\"get\"", g(&m.cmd_get)),
            ("cmd=\"set\"", g(&m.cmd_set)),
            ("cmd=\"touch\"", g(&m.cmd_touch)),
            ("cmd=\"flush\"", g(&m.cmd_flush)),
            ("cmd=\"meta\"", g(&m.cmd_meta)),
        ],
    );
    o.metric(
        "granary_memcache_results_total",
        "counter",
        "Memcache command results.",
        &[
            ("result=\"get_hit\"", g(&m.get_hits)),
            ("result=\"get_miss\"", g(&m.get_misses)),
            ("result=\"delete_hit\"", g(&m.delete_hits)),
            ("result=\"delete_miss\"", g(&m.delete_misses)),
            ("result=\"incr_hit\"", g(&m.incr_hits)),
            ("result=\"incr_miss\"", g(&m.incr_misses)),
            ("result=\"decr_hit\"", g(&m.decr_hits)),
            ("result=\"decr_miss\"", g(&m.decr_misses)),
            ("result=\"cas_hit\"", g(&m.cas_hits)),
            ("result=\"cas_miss\"", g(&m.cas_misses)),
            ("result=\"cas_badval\"", g(&m.cas_badval)),
            ("result=\"touch_hit\"", g(&m.touch_hits)),
            ("result=\"touch_miss\"", g(&m.touch_misses)),
        ],
    );
    o.counter("granary_memcache_protocol_errors_total", "Memcache protocol errors.", m.protocol_errors.load(Relaxed));
    let commands: Vec<_> = granary_memcache::COMMANDS
        .iter()
        .zip(m.latency.iter())
        .map(|(c, h)| (format!("cmd=\"{c}\""), h.snapshot()))
        .collect();
    o.histogram(
        "granary_memcache_command_duration_seconds",
        "Memcache command latency, from parse to reply buffered (other = version, verbosity, stats, quit, unknown).",
        &commands,
    );
    o.gauge(
        "granary_memcache_connection_buffer_bytes_max",
        "Most buffer memory one Memcache connection has held.",
        g(&m.conn_buffer_bytes_max),
    );
    o.gauge(
        "granary_memcache_connections_waiting_to_send",
        "Memcache connections waiting for their client to read.",
        g(&m.conns_waiting_to_send),
    );
    o.metric(
        "granary_memcache_bytes_total",
        "counter",
        "Memcache bytes received and sent.",
        &[("dir=\"read\"", g(&m.bytes_read)), ("dir=\"written\"", g(&m.bytes_written))],
    );
    o.metric(
        "granary_memcache_zero_copy_total",
        "counter",
        "Memcache values received into or sent from the engine's buffers without a copy.",
        &[("dir=\"set\"", g(&m.zero_copy_sets)), ("dir=\"get\"", g(&m.zero_copy_gets))],
    );
    if let Some(n) = &src.native {
        o.gauge("granary_native_connections", "Open native connections.", n.connections.open() as f64);
        o.counter(
            "granary_native_connections_total",
            "Native connections accepted.",
            n.total_connections.load(Relaxed),
        );
        o.counter(
            "granary_native_rejected_connections_total",
            "Native connections refused at the limit.",
            n.rejected_connections.load(Relaxed),
        );
        o.counter(
            "granary_native_bad_frames_total",
            "Native connections closed for a malformed frame.",
            n.bad_frames.load(Relaxed),
        );
        o.counter(
            "granary_native_idle_kicks_total",
            "Native connections closed by the idle timeout.",
            n.idle_kicks.load(Relaxed),
        );
        o.metric(
            "granary_native_requests_total",
            "counter",
            "Native requests by opcode (MGET and BATCH count once; their keys count as get/put/delete too).",
            &[
                ("op=\"get\"", g(&n.gets)),
                ("op=\"put\"", g(&n.puts)),
                ("op=\"delete\"", g(&n.deletes)),
                ("op=\"mget\"", g(&n.multi_gets)),
                ("op=\"batch\"", g(&n.batches)),
                ("op=\"nop\"", g(&n.nops)),
                ("op=\"stats\"", g(&n.stats)),
            ],
        );
        o.counter("granary_native_get_hits_total", "Native GETs that found a value.", n.get_hits.load(Relaxed));
        o.counter("granary_native_errors_total", "Native responses with an error status.", n.errors.load(Relaxed));
        let ops: Vec<_> = granary_native::OPS
            .iter()
            .map(|&op| (format!("op=\"{}\"", op.name().to_ascii_lowercase()), n.op_latency(op).snapshot()))
            .collect();
        o.histogram(
            "granary_native_request_duration_seconds",
            "Native request latency, from decoding to response queued (waits for conflicting requests included).",
            &ops,
        );
        o.gauge(
            "granary_native_connection_buffer_bytes_max",
            "Most buffer memory one native connection has held.",
            g(&n.conn_buffer_bytes_max),
        );
        o.gauge(
            "granary_native_connections_waiting_to_send",
            "Native connections waiting for their client to read.",
            g(&n.conns_waiting_to_send),
        );
        o.metric(
            "granary_native_zero_copy_total",
            "counter",
            "Native values received into or sent from the engine's buffers without a copy.",
            &[("dir=\"put\"", g(&n.zero_copy_puts)), ("dir=\"get\"", g(&n.zero_copy_gets))],
        );
        o.gauge(
            "granary_native_connections_paused",
            "Native connections starting no request until their client reads.",
            g(&n.conns_paused),
        );
    }
    o.gauge("granary_store_keys", "Keys with a value.", st.keys as f64);
    o.gauge("granary_store_live_bytes", "Bytes of the records the index points at.", st.live_bytes as f64);
    o.metric(
        "granary_store_operations_total",
        "counter",
        "Engine operations.",
        &[
            ("op=\"get\"", st.gets as f64),
            ("op=\"get_hit\"", st.get_hits as f64),
            ("op=\"put\"", st.puts as f64),
            ("op=\"delete\"", st.deletes as f64),
        ],
    );
    o.metric(
        "granary_store_segments",
        "gauge",
        "Segments by state.",
        &[
            ("state=\"free\"", st.segments_free as f64),
            ("state=\"open\"", st.segments_open as f64),
            ("state=\"closed\"", st.segments_closed as f64),
            ("state=\"index\"", st.segments_index as f64),
        ],
    );
    o.metric(
        "granary_device_operations_total",
        "counter",
        "Device operations.",
        &[
            ("op=\"read\"", st.io.reads as f64),
            ("op=\"write\"", st.io.writes as f64),
            ("op=\"flush\"", st.io.flushes as f64),
        ],
    );
    o.histogram(
        "granary_device_io_duration_seconds",
        "Device operation latency (io_uring: from submission to completion).",
        &[
            ("op=\"read\"".to_string(), st.io.read_latency),
            ("op=\"write\"".to_string(), st.io.write_latency),
            ("op=\"flush\"".to_string(), st.io.flush_latency),
        ],
    );
    o.metric(
        "granary_device_bytes_total",
        "counter",
        "Device bytes read and written.",
        &[("dir=\"read\"", st.io.read_bytes as f64), ("dir=\"written\"", st.io.written_bytes as f64)],
    );
    o.counter("granary_user_bytes_written_total", "Key and value bytes of PUTs and DELETEs.", st.user_bytes_written);
    o.gauge("granary_write_amplification", "Device bytes written per user byte written.", st.write_amplification());
    o.counter("granary_write_groups_total", "Coalesced group writes.", st.write_groups);
    o.counter("granary_grouped_records_total", "Records carried by group writes.", st.grouped_records);
    o.counter("granary_blind_overwrites_total", "Overwrites that did not read the old record.", st.blind_overwrites);
    o.gauge(
        "granary_unsettled_links",
        "Index entries displaced by blind overwrites, not settled yet.",
        st.unsettled_links as f64,
    );
    o.gauge("granary_link_bytes", "DRAM held by unsettled blind-overwrite links.", st.link_bytes as f64);
    o.counter("granary_gc_victims_total", "Segments reclaimed by GC.", st.gc.victims);
    o.counter(
        "granary_gc_sparse_victims_total",
        "Segments GC reclaimed reading only what the index or a link points at.",
        st.gc.sparse_victims,
    );
    o.counter("granary_gc_relocated_records_total", "Records GC moved.", st.gc.records_relocated);
    o.counter("granary_gc_relocated_bytes_total", "Bytes GC moved.", st.gc.bytes_relocated);
    o.counter("granary_gc_expired_total", "Expired or flushed values GC dropped.", st.gc.expired);
    o.counter("granary_evicted_segments_total", "Segments evicted whole (cache mode).", st.gc.evicted_segments);
    o.counter("granary_evicted_values_total", "Values evicted (cache mode).", st.gc.evicted_values);
    o.gauge("granary_index_entries", "Index entries.", st.index.entries as f64);
    o.gauge("granary_index_slots", "Index slots.", st.index.slots as f64);
    o.gauge(
        "granary_index_occupancy",
        "Index entries per slot.",
        if st.index.slots == 0 { 0.0 } else { st.index.entries as f64 / st.index.slots as f64 },
    );
    o.gauge("granary_index_memory_bytes", "DRAM held by the index tables.", st.index.memory_bytes as f64);
    o.counter("granary_index_resizes_total", "Index directory doublings.", st.index.grows);
    if let Some(rt) = &src.runtime {
        let per_core = rt.stats();
        let labels: Vec<String> = (0..per_core.len()).map(|i| format!("core=\"{i}\"")).collect();
        let series = |f: fn(&granary_rt::RuntimeStats) -> u64| -> Vec<(&str, f64)> {
            labels.iter().map(String::as_str).zip(per_core.iter().map(|s| f(s) as f64)).collect()
        };
        o.metric("granary_rt_polls_total", "counter", "Task polls per executor.", &series(|s| s.polls));
        o.metric(
            "granary_rt_sleeps_total",
            "counter",
            "Times an executor blocked in the kernel with nothing to do.",
            &series(|s| s.sleeps),
        );
        o.metric(
            "granary_rt_io_spins_skipped_total",
            "counter",
            "Idle periods with file IO in flight in which an executor slept at once (recent ones mostly outlasted the IO spin).",
            &series(|s| s.io_spins_skipped),
        );
        o.metric(
            "granary_rt_file_ios_in_flight",
            "gauge",
            "File reads and writes in flight per executor.",
            &series(|s| s.file_ios_in_flight),
        );
    }
    o.gauge("granary_recovery_seconds", "Duration of the last open's recovery.", st.recovery.millis as f64 / 1000.0);
    o.gauge(
        "granary_recovery_clean",
        "1 if the last open found a clean shutdown.",
        st.recovery.clean_shutdown as u8 as f64,
    );
    o.0
}
