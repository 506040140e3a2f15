//! `granary-bench native`: the native protocol over loopback against the
//! embedded engine on the same store, in the same run.
//!
//! Loads N keys into a store on a real O_DIRECT file (io_uring backend),
//! then for each pipeline depth measures random GETs and random PUTs
//! (overwrites of loaded keys):
//! - `embedded`: the engine's async API, `depth` tasks on a `granary-rt`
//!   executor (as `granary-bench device`'s uring backend);
//! - `native`: `granary-native` serving the store on the same executors,
//!   and one client connection from a client thread keeping `depth`
//!   requests in flight (a new request is sent as the oldest is answered;
//!   its latency is taken when the client sees it).
//!
//! Each native line carries its ratio to the embedded line of the same op
//! and depth: the cost of the protocol, the loopback network and the
//! client. Each point runs a bounded time and a bounded operation count.

use crate::device::{self, hist, key, rng, value_of, DeviceBenchOptions, Point, Run};
use granary_client::{Connection, Request, Status};
use granary_native::NativeConfig;
use granary_rt::{Runtime, RuntimeConfig};
use granary_store::io::{FileDevice, IoBackend, OpenMode};
use granary_store::{CreateOptions, OpenOptions, Store};
use serde_json::json;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct NativeBenchOptions {
    pub path: PathBuf,
    pub size_bytes: u64,
    pub keys: u64,
    pub value_bytes: usize,
    pub depths: Vec<usize>,
    pub secs: f64,
    pub max_ops: u64,
    /// Executors serving both the embedded tasks and the server.
    pub cores: usize,
    pub seed: u64,
    pub progress: bool,
}

impl Default for NativeBenchOptions {
    fn default() -> Self {
        NativeBenchOptions {
            path: PathBuf::from("granary-data/bench-native.db"),
            size_bytes: 2 << 30,
            keys: 100_000,
            value_bytes: 1000,
            depths: vec![1, 4, 16, 64],
            secs: 2.0,
            max_ops: 2_000_000,
            cores: 1,
            seed: 1,
            progress: true,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct NativeBenchReport {
    pub points: Vec<Point>,
}

/// One native point: a client thread with `depth` requests in flight.
fn run_native(conn: &Connection, o: &NativeBenchOptions, op: &'static str, depth: usize) -> Point {
    let run = Run::new(o.max_ops);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(o.secs);
    let mut next = rng(o.seed ^ 0xABCD ^ depth as u64);
    let mut h = hist();
    let value = value_of(o.value_bytes, 3, 3);
    let mut inflight = VecDeque::with_capacity(depth);
    let mut go = true;
    loop {
        while go && inflight.len() < depth {
            let k = key(next() % o.keys);
            let req = match op {
                "get" => Request::Get(&k),
                _ => Request::Put { key: &k, value: &value, mode: granary_client::PutMode::Upsert },
            };
            match conn.send(&req) {
                Ok(p) => inflight.push_back((p, Instant::now())),
                Err(_) => {
                    go = false;
                }
            }
        }
        let Some((p, t0)) = inflight.pop_front() else { break };
        let ok = matches!(p.wait(), Ok(r) if r.status == Status::Ok);
        if !run.done_one(&mut h, t0, ok) || Instant::now() >= deadline {
            go = false;
        }
    }
    run.merge(&h);
    run.point("native", op, depth, start.elapsed().as_secs_f64())
}

pub fn run(o: &NativeBenchOptions) -> Result<NativeBenchReport, String> {
    let mut report = NativeBenchReport::default();
    if let Some(dir) = o.path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let _ = std::fs::remove_file(&o.path);
    let record = (48 + 20 + o.value_bytes as u64).next_multiple_of(4096);
    if o.keys * record * 2 > o.size_bytes {
        return Err(format!(
            "{} keys of {} B need about {} MiB (twice the data, for overwrites); --size is {} MiB",
            o.keys,
            o.value_bytes,
            (o.keys * record * 2) >> 20,
            o.size_bytes >> 20
        ));
    }
    let dev_opts = DeviceBenchOptions {
        keys: o.keys,
        value_bytes: o.value_bytes,
        secs: o.secs,
        max_ops: o.max_ops,
        seed: o.seed,
        progress: o.progress,
        ..DeviceBenchOptions::default()
    };
    let result = (|| -> Result<(), String> {
        let dev = FileDevice::create(&o.path, o.size_bytes, OpenMode::Direct)
            .map_err(|e| e.to_string())?
            .with_backend(IoBackend::Uring);
        let create = CreateOptions { grain_bytes: Some(4096), ..CreateOptions::default() };
        let store =
            Arc::new(Store::create(Arc::new(dev), &create, &OpenOptions::default()).map_err(|e| e.to_string())?);
        let rt = Arc::new(
            Runtime::new(RuntimeConfig { threads: o.cores, name: "bench-native".into(), ..Default::default() })
                .map_err(|e| e.to_string())?,
        );
        device::load(&store, &rt, &dev_opts)?;
        let cfg = NativeConfig {
            listen: "127.0.0.1:0".parse().expect("address"),
            value_bytes_max: store.value_bytes_max(1).min(1 << 20) as u32,
            ..NativeConfig::default()
        };
        let server = granary_native::Server::start_on(store.clone(), cfg, rt.clone()).map_err(|e| e.to_string())?;
        let conn = Connection::connect(server.local_addr(), Duration::from_secs(30)).map_err(|e| e.to_string())?;
        for op in ["get", "put"] {
            for &d in &o.depths {
                let mut e = device::run_tasks(&store, &rt, &dev_opts, op, d);
                e.system = "embedded".into();
                let n = run_native(&conn, o, op, d);
                if o.progress {
                    for p in [&e, &n] {
                        eprintln!(
                            "{:<9} {op} depth {d:<3} {:>9.0} ops/s p50 {:.1} us",
                            p.system,
                            p.ops_per_sec(),
                            p.p50_us
                        );
                    }
                }
                report.points.push(e);
                report.points.push(n);
            }
        }
        drop(conn);
        server.shutdown();
        drop(rt);
        Arc::try_unwrap(store).map_err(|_| "store still shared".to_string())?.close().map_err(|e| e.to_string())?;
        Ok(())
    })();
    let _ = std::fs::remove_file(&o.path);
    result.map(|()| report)
}

fn find<'a>(r: &'a NativeBenchReport, system: &str, op: &str, depth: usize) -> Option<&'a Point> {
    r.points.iter().find(|p| p.system == system && p.op == op && p.depth == depth)
}

pub fn render(o: &NativeBenchOptions, r: &NativeBenchReport) -> String {
    let mut s = format!(
        "native protocol over loopback vs the embedded engine: {} keys, {}-byte values, {} executor(s)\n\
         {:<4} {:>5} | {:>11} {:>9} {:>9} | {:>11} {:>9} {:>9} | {:>6}\n",
        o.keys,
        o.value_bytes,
        o.cores,
        "op",
        "depth",
        "embedded/s",
        "p50 us",
        "p99 us",
        "native/s",
        "p50 us",
        "p99 us",
        "ratio"
    );
    for op in ["get", "put"] {
        for &d in &o.depths {
            let (Some(e), Some(n)) = (find(r, "embedded", op, d), find(r, "native", op, d)) else { continue };
            s.push_str(&format!(
                "{op:<4} {d:>5} | {:>11.0} {:>9.1} {:>9.1} | {:>11.0} {:>9.1} {:>9.1} | {:>6.2}\n",
                e.ops_per_sec(),
                e.p50_us,
                e.p99_us,
                n.ops_per_sec(),
                n.p50_us,
                n.p99_us,
                n.ops_per_sec() / e.ops_per_sec().max(1e-9)
            ));
        }
    }
    s
}

pub fn to_json(o: &NativeBenchOptions, r: &NativeBenchReport) -> serde_json::Value {
    let points: Vec<_> = r
        .points
        .iter()
        .map(|p| {
            let ratio = (p.system == "native")
                .then(|| find(r, "embedded", p.op, p.depth))
                .flatten()
                .map(|e| p.ops_per_sec() / e.ops_per_sec().max(1e-9));
            json!({
                "system": p.system, "op": p.op, "depth": p.depth, "ops": p.ops, "secs": p.secs,
                "ops_per_sec": p.ops_per_sec(), "p50_us": p.p50_us, "p99_us": p.p99_us,
                "errors": p.errors, "ratio_to_embedded": ratio,
            })
        })
        .collect();
    json!({
        "bench": "native",
        "keys": o.keys, "value_bytes": o.value_bytes, "cores": o.cores, "depths": o.depths,
        "secs_per_point": o.secs, "points": points,
    })
}
