//! `granary serve --metrics ADDR`: the Prometheus text endpoint
//! (`GET /metrics`), served by a task on the server's own runtime (no
//! second async runtime). It renders each component's registry of
//! figures (`registry()` of the memcache, native, RESP and NBD servers and of the
//! store's `Stats`), the latency histograms and the executors' counters;
//! nothing is computed on the request path of the servers.

use granary_memcache::ServerStats;
use granary_native::NativeStats;
use granary_rt::latency::Snapshot;
use granary_rt::net::{TcpListener, TcpStream};
use granary_rt::Runtime;
use granary_store::Store;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Longest HTTP request head read; longer requests get 431 and a close.
pub const REQUEST_HEAD_MAX: usize = 8 * 1024;
/// A client that has not sent its request head by then is disconnected.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once (each may wait [`REQUEST_TIMEOUT`] for its
/// request, and each page is rendered on the executor that accepts every
/// listener's connections): more are closed at once, so a flood of them
/// holds neither descriptors nor that executor.
pub const SCRAPES_MAX: usize = 16;

/// What the endpoint reports.
#[derive(Clone)]
pub struct Sources {
    pub store: Arc<Store>,
    pub memcache: Arc<ServerStats>,
    pub native: Option<Arc<NativeStats>>,
    pub resp: Option<Arc<granary_resp::RespStats>>,
    pub nbd: Option<Arc<granary_nbd::NbdStats>>,
    /// The server's executors.
    pub runtime: Option<granary_rt::StatsReader>,
}

/// Serve on `rt` from a bound listener; returns its address.
pub fn serve(l: std::net::TcpListener, src: Sources, rt: &Runtime) -> std::io::Result<SocketAddr> {
    let bound = l.local_addr()?;
    let listener = TcpListener::from_std(l);
    rt.spawn_on(0, async move {
        let serving = Arc::new(AtomicUsize::new(0));
        loop {
            let Ok((s, _)) = listener.accept().await else {
                granary_rt::sleep(Duration::from_millis(10)).await;
                continue;
            };
            if serving.load(Relaxed) >= SCRAPES_MAX {
                drop(s);
                continue;
            }
            // Counted down however the task ends (dropped unpolled too).
            serving.fetch_add(1, Relaxed);
            let served = Served(serving.clone());
            let src = src.clone();
            granary_rt::spawn(async move {
                let _served = served;
                let _ = granary_rt::timeout(REQUEST_TIMEOUT, answer(&s, &src)).await;
            });
        }
    });
    Ok(bound)
}

/// A connection the endpoint serves, counted while it lives.
struct Served(Arc<AtomicUsize>);

impl Drop for Served {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
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

/// The metrics page.
pub fn render(src: &Sources) -> String {
    let mut o = Out(String::new());
    let st = src.store.stats();
    let m = &src.memcache;
    // Each component's figures are declared once, with their `stats`
    // names, by the component (`registry()`); latency histograms beside.
    m.registry().render_prometheus(&mut o.0);
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
    if let Some(n) = &src.native {
        n.registry().render_prometheus(&mut o.0);
        let ops: Vec<_> = granary_native::OPS
            .iter()
            .map(|&op| (format!("op=\"{}\"", op.name().to_ascii_lowercase()), n.op_latency(op).snapshot()))
            .collect();
        o.histogram(
            "granary_native_request_duration_seconds",
            "Native request latency, from decoding to response queued (waits for conflicting requests included).",
            &ops,
        );
    }
    if let Some(r) = &src.resp {
        r.registry().render_prometheus(&mut o.0);
    }
    if let Some(b) = &src.nbd {
        b.registry().render_prometheus(&mut o.0);
    }
    // The store's figures, declared once (`granary_store::Stats::registry`).
    st.registry().render_prometheus(&mut o.0);
    o.histogram(
        "granary_device_io_duration_seconds",
        "Device operation latency (io_uring: from submission to completion).",
        &[
            ("op=\"read\"".to_string(), st.io.read_latency),
            ("op=\"write\"".to_string(), st.io.write_latency),
            ("op=\"flush\"".to_string(), st.io.flush_latency),
        ],
    );
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
    o.0
}
