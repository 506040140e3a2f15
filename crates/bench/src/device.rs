//! `granary-bench device`: the engine against the raw device (as the uDepot
//! paper measures its engine against what the device delivers).
//!
//! Loads N random 8–32 byte keys with V-byte values into a store on a real
//! O_DIRECT file, then measures random GETs and random PUTs (overwrites of
//! loaded keys) at each queue depth, for each backend:
//! - `sync`: the synchronous API with one thread per in-flight request (the
//!   paper's set-up for its synchronous backends), pread/pwrite;
//! - `uring`: the async API on a `granary-rt` executor, one task per
//!   in-flight request, IO through the executor's io_uring;
//! - `uring-zc`: as `uring`, with the zero-copy API (`get_buf_async`, and
//!   `new_put_buf` + `put_buf_async`), as a server uses it;
//! - `mem`: the synchronous API on an in-memory device, one thread: the
//!   software ceiling per core, with and without the zero-copy API; one op
//!   in [`MEM_LATENCY_SAMPLE`] is timed there (the clock would cost a visible
//!   share of every op);
//!   then the async API on one executor with a task per GET in flight, at
//!   each depth ([`MEM_RT`]), where the device's reads and the index
//!   lookups yield so that the tasks' memory misses overlap.
//!
//! Every Granary point also carries the store's own device IO during it
//! ([`DeviceIo`]: reads, group writes, and the overwrites that read nothing,
//! `granary_store::OpenOptions::blind_overwrite_bytes`).
//!
//! The executors register the buffer arena with their rings (fixed
//! buffers) unless `registered_buffers` is off.
//!
//! In the same run, on the same file, `fio` (io_uring engine, direct, 4 KiB
//! random read and random write, one job at the same depths) gives the
//! device's reference, and every Granary line carries its ratio to fio.
//! fio's random reads run twice, before the Granary backends (over the
//! loaded store's file, which reading leaves as it is) and after them, and
//! the reference is the two pooled ([`pooled`]): a virtual disk's speed
//! can drift over minutes, and a reference taken only at the end would
//! carry that drift into every ratio. Its random writes run once, at the end, after a
//! sequential fill and a wait for a quiet machine
//! ([`crate::mem::wait_for_quiet`]: the in-memory device's memory was just
//! freed). Each point runs for a bounded time and a bounded
//! operation count.

use granary_rt::{Runtime, RuntimeConfig};
use granary_store::io::{Device, FileDevice, IoBackend, MemDevice, OpenMode};
use granary_store::{Cond, CreateOptions, ItemMeta, OpenOptions, Store};
use hdrhistogram::Histogram;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct DeviceBenchOptions {
    /// The data file (created; removed at the end).
    pub path: PathBuf,
    pub size_bytes: u64,
    pub keys: u64,
    pub value_bytes: usize,
    pub grain_bytes: u32,
    pub depths: Vec<usize>,
    /// Time per measured point.
    pub secs: f64,
    /// Operation cap per point.
    pub max_ops: u64,
    pub backends: Vec<String>,
    /// Executors for the uring backend.
    pub cores: usize,
    /// Executors' rings with IORING_SETUP_DEFER_TASKRUN.
    pub defer_taskrun: bool,
    /// Executors' spin before sleeping.
    pub spin: Duration,
    /// Executors' spin before sleeping while file IO is in flight.
    pub spin_io: Duration,
    /// Register the buffer arena with the rings (fixed buffers).
    pub registered_buffers: bool,
    pub fio: bool,
    /// PUT points write keys not in the store yet (inserts: no old version
    /// to read) instead of overwriting loaded ones.
    pub new_keys: bool,
    /// `OpenOptions::blind_overwrite_bytes` of every store (None: the
    /// store's default, on for files and off in memory).
    pub blind_overwrite_bytes: Option<usize>,
    pub seed: u64,
    pub progress: bool,
}

impl Default for DeviceBenchOptions {
    fn default() -> Self {
        DeviceBenchOptions {
            path: PathBuf::from("granary-data/bench-device.db"),
            size_bytes: 4 << 30,
            keys: 200_000,
            value_bytes: 4000,
            grain_bytes: 4096,
            depths: vec![1, 2, 4, 8, 16, 32, 64, 128],
            secs: 2.0,
            max_ops: 2_000_000,
            backends: vec!["sync".into(), "uring".into(), "uring-zc".into(), "mem".into()],
            cores: 1,
            defer_taskrun: false,
            spin: RuntimeConfig::default().spin,
            spin_io: RuntimeConfig::default().spin_io,
            registered_buffers: true,
            fio: true,
            new_keys: false,
            blind_overwrite_bytes: None,
            seed: 1,
            progress: true,
        }
    }
}

/// One measured point.
#[derive(Debug, Clone)]
pub struct Point {
    pub system: String,
    pub op: &'static str,
    pub depth: usize,
    pub ops: u64,
    pub secs: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
    /// The store's own device IO during the point (Granary's points).
    pub device: Option<DeviceIo>,
}

impl Point {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }
}

/// What the store asked of its device during a point, from its IO
/// counters: how a PUT's cost splits between reads (GC's, and overwrites
/// past the blind-overwrite cap read the key's current record) and group
/// writes, and how many overwrites read nothing. Latencies are the device's
/// (the in-memory device times nothing: 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceIo {
    pub reads_per_s: f64,
    pub read_mean_us: f64,
    pub writes_per_s: f64,
    pub write_mean_us: f64,
    /// Mean bytes per write, KiB.
    pub write_kib: f64,
    /// Overwrites that read nothing (blind overwrites), per second.
    pub blind_per_s: f64,
}

impl DeviceIo {
    fn between(sa: &granary_store::Stats, sb: &granary_store::Stats, secs: f64) -> DeviceIo {
        let (a, b) = (&sa.io, &sb.io);
        let (reads, writes) = (b.reads - a.reads, b.writes - a.writes);
        let mean_us = |sum_a: u64, sum_b: u64, n: u64| (sum_b - sum_a) as f64 / n.max(1) as f64 / 1000.0;
        DeviceIo {
            reads_per_s: reads as f64 / secs.max(1e-9),
            read_mean_us: mean_us(a.read_latency.sum_ns, b.read_latency.sum_ns, reads),
            writes_per_s: writes as f64 / secs.max(1e-9),
            write_mean_us: mean_us(a.write_latency.sum_ns, b.write_latency.sum_ns, writes),
            write_kib: (b.written_bytes - a.written_bytes) as f64 / writes.max(1) as f64 / 1024.0,
            blind_per_s: (sb.blind_overwrites - sa.blind_overwrites) as f64 / secs.max(1e-9),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct DeviceBenchReport {
    pub points: Vec<Point>,
    pub fio_version: Option<String>,
    pub record_bytes: u64,
}

/// The seeded generator of a workload, as a closure drawing the next number.
pub(crate) fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut rng = granary_store::io::SimRng::new(seed);
    move || rng.next_u64()
}

/// Key `i`: 8 to 32 bytes, derived from i (so any thread can name it).
/// The first 8 bytes are i itself, so keys are unique at every length.
pub(crate) fn key(i: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(32);
    key_into(i, &mut k);
    k
}

/// [`key`] into a buffer the caller reuses.
pub(crate) fn key_into(i: u64, k: &mut Vec<u8>) {
    k.clear();
    k.extend_from_slice(&i.to_le_bytes());
    k.resize(8 + (i.wrapping_mul(0x9E37_79B9) % 25) as usize, b'k');
}

pub(crate) fn hist() -> Histogram<u64> {
    // 1 ns to 60 s: a stalled disk's seconds-long ops stay in the tail.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// Shared state of one measured point.
pub(crate) struct Run {
    stop: AtomicBool,
    ops: AtomicU64,
    errors: AtomicU64,
    max_ops: u64,
    hist: Mutex<Histogram<u64>>,
}

impl Run {
    pub(crate) fn new(max_ops: u64) -> Arc<Run> {
        Arc::new(Run {
            stop: AtomicBool::new(false),
            ops: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            max_ops,
            hist: Mutex::new(hist()),
        })
    }
    /// Record one op started at `t0`; false once the point should end. An
    /// op slower than the histogram's 60 s bound counts as 60 s (a stalled
    /// disk must show in the tail, not vanish from it).
    pub(crate) fn done_one(&self, h: &mut Histogram<u64>, t0: Instant, ok: bool) -> bool {
        h.saturating_record(t0.elapsed().as_nanos() as u64);
        self.done_untimed(ok)
    }
    /// Count one op whose latency was not taken (see [`MEM_LATENCY_SAMPLE`]).
    pub(crate) fn done_untimed(&self, ok: bool) -> bool {
        if !ok {
            self.errors.fetch_add(1, Relaxed);
        }
        self.ops.fetch_add(1, Relaxed) + 1 < self.max_ops && !self.stop.load(Relaxed)
    }
    /// Wait until `secs` after `start` (or the op cap), then tell workers to stop.
    pub(crate) fn stop_after(&self, start: Instant, secs: f64) {
        let deadline = start + Duration::from_secs_f64(secs);
        while Instant::now() < deadline && self.ops.load(Relaxed) < self.max_ops {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.stop.store(true, Relaxed);
    }
    pub(crate) fn merge(&self, h: &Histogram<u64>) {
        self.hist.lock().unwrap().add(h).expect("same bounds");
    }
    pub(crate) fn point(&self, system: &str, op: &'static str, depth: usize, secs: f64) -> Point {
        let h = self.hist.lock().unwrap();
        Point {
            system: system.into(),
            op,
            depth,
            ops: self.ops.load(Relaxed),
            secs,
            p50_us: h.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: h.value_at_quantile(0.99) as f64 / 1000.0,
            errors: self.errors.load(Relaxed),
            device: None,
        }
    }
}

/// Keys handed out to PUTs of new keys so far (process-wide, so no two
/// points and no two workers write the same new key).
static NEW_KEYS: AtomicU64 = AtomicU64::new(0);

/// The key index a PUT point writes next: a loaded key drawn by `next`, or
/// with `new_keys` one past every loaded key not handed out before.
fn put_key(o: &DeviceBenchOptions, next: &mut impl FnMut() -> u64) -> u64 {
    if o.new_keys {
        o.keys + NEW_KEYS.fetch_add(1, Relaxed)
    } else {
        next() % o.keys
    }
}

pub(crate) fn value_of(v: usize, i: u64, round: u64) -> Vec<u8> {
    let b = (i ^ round) as u8;
    vec![b; v]
}

/// Measure one op at one depth with `depth` threads on the sync API.
/// On the in-memory device, one op in this many is timed: an op takes about
/// a microsecond there, and timing one takes two clock reads, which would
/// noticeably lower the software ceiling being measured. Latency
/// percentiles come from the sample.
pub const MEM_LATENCY_SAMPLE: u64 = 16;

/// The in-memory points on one executor: the async API, a task per GET in
/// flight at each depth (`get`, and `get_buf` for the zero-copy API).
pub const MEM_RT: &str = "granary-mem-rt";

/// Measure one op with `depth` threads, each running ops back to back;
/// every `sample`th op of each thread is timed.
fn run_threads(
    store: &Arc<Store>,
    o: &DeviceBenchOptions,
    op: &'static str,
    depth: usize,
    system: &str,
    sample: u64,
) -> Point {
    let run = Run::new(o.max_ops);
    let before = store.stats();
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..depth {
            let (store, run) = (store.clone(), run.clone());
            s.spawn(move || {
                let mut next = rng(o.seed ^ ((t as u64 + 1) * 7919));
                let mut h = hist();
                let value = value_of(o.value_bytes, t as u64, 1);
                let mut k = Vec::with_capacity(32);
                for n in 0u64.. {
                    let i = if op.starts_with("put") { put_key(o, &mut next) } else { next() % o.keys };
                    key_into(i, &mut k);
                    let t0 = n.is_multiple_of(sample).then(Instant::now);
                    let ok = match op {
                        "get" => store.get(&k).map(|v| v.is_some()).unwrap_or(false),
                        // Zero-copy: the value stays in the buffer it was read into.
                        "get_buf" => store.get_buf(&k).map(|v| v.is_some()).unwrap_or(false),
                        // Zero-copy: the value is written into the record buffer
                        // (as a server receives it), which goes to the device.
                        "put_buf" => store.new_put_buf(&k, value.len()).is_ok_and(|mut pb| {
                            pb.fill_from(&value);
                            store.put_buf(pb, ItemMeta::default(), Cond::Always).is_ok()
                        }),
                        _ => store.put(&k, &value).is_ok(),
                    };
                    let more = match t0 {
                        Some(t0) => run.done_one(&mut h, t0, ok),
                        None => run.done_untimed(ok),
                    };
                    if !more {
                        break;
                    }
                }
                run.merge(&h);
            });
        }
        run.stop_after(start, o.secs);
    });
    let secs = start.elapsed().as_secs_f64();
    let device = Some(DeviceIo::between(&before, &store.stats(), secs));
    Point { device, ..run.point(system, op, depth, secs) }
}

/// The reference of the in-memory points: one thread reading `bytes` at
/// random `bytes`-aligned offsets within the first `span` bytes of `dev`
/// (as many bytes as the loaded records) straight from the device, one
/// buffer reused. Reported as system `mem-read`, op `get`.
fn device_reads(dev: &dyn Device, o: &DeviceBenchOptions, bytes: usize, span: u64) -> Point {
    let run = Run::new(o.max_ops);
    let slots = (span / bytes as u64).max(1);
    let start = Instant::now();
    std::thread::scope(|s| {
        let reader = run.clone();
        s.spawn(move || {
            let run = reader;
            let mut next = rng(o.seed ^ 0x6d65_6d72);
            let mut h = hist();
            let mut buf = Some(granary_store::io::AlignedBuf::zeroed(bytes));
            for n in 0u64.. {
                let offset = (next() % slots) * bytes as u64;
                let t0 = n.is_multiple_of(MEM_LATENCY_SAMPLE).then(Instant::now);
                let (b, r) = dev.read_at(buf.take().expect("the buffer comes back"), offset);
                buf = Some(b);
                let more = match t0 {
                    Some(t0) => run.done_one(&mut h, t0, r.is_ok()),
                    None => run.done_untimed(r.is_ok()),
                };
                if !more {
                    break;
                }
            }
            run.merge(&h);
        });
        run.stop_after(start, o.secs);
    });
    run.point("mem-read", "get", 1, start.elapsed().as_secs_f64())
}

/// Measure one op at one depth with `depth` tasks on the runtime.
pub(crate) fn run_tasks(
    store: &Arc<Store>,
    rt: &Runtime,
    o: &DeviceBenchOptions,
    op: &'static str,
    depth: usize,
) -> Point {
    run_tasks_sampled(store, rt, o, op, depth, false, "granary-uring", 1)
}

thread_local! {
    /// The latencies of the bench tasks an executor thread runs: one
    /// histogram per core, not per task (128 tasks' histograms of ~250 KiB
    /// each would make every record a cache miss).
    static EXECUTOR_HIST: std::cell::RefCell<Option<Histogram<u64>>> = const { std::cell::RefCell::new(None) };
}

/// [`run_tasks`], with the zero-copy API (`get_buf_async`, `put_buf_async`)
/// when `zero_copy`, reported as `system`, timing one op in `sample` of
/// each task (see [`MEM_LATENCY_SAMPLE`]).
#[allow(clippy::too_many_arguments)]
fn run_tasks_sampled(
    store: &Arc<Store>,
    rt: &Runtime,
    o: &DeviceBenchOptions,
    op: &'static str,
    depth: usize,
    zero_copy: bool,
    system: &'static str,
    sample: u64,
) -> Point {
    let run = Run::new(o.max_ops);
    let before = store.stats();
    let start = Instant::now();
    let handles: Vec<_> = (0..depth)
        .map(|t| {
            let (store, run) = (store.clone(), run.clone());
            let (seed, keys, vbytes) = (o.seed ^ ((t as u64 + 1) * 7919), o.keys, o.value_bytes);
            let o = o.clone();
            rt.spawn(async move {
                let mut next = rng(seed);
                let value = value_of(vbytes, t as u64, 2);
                let mut k = Vec::with_capacity(32);
                for n in 0u64.. {
                    let i = if op == "put" { put_key(&o, &mut next) } else { next() % keys };
                    key_into(i, &mut k);
                    let t0 = n.is_multiple_of(sample).then(Instant::now);
                    let ok = match (op, zero_copy) {
                        ("get", false) => store.get_async(&k).await.map(|v| v.is_some()).unwrap_or(false),
                        ("get", true) | ("get_buf", _) => {
                            store.get_buf_async(&k).await.map(|v| v.is_some()).unwrap_or(false)
                        }
                        (_, false) => store.put_async(&k, &value).await.is_ok(),
                        (_, true) => match store.new_put_buf(&k, value.len()) {
                            Ok(mut pb) => {
                                pb.fill_from(&value);
                                store.put_buf_async(pb, ItemMeta::default(), Cond::Always).await.is_ok()
                            }
                            Err(_) => false,
                        },
                    };
                    if let Some(t0) = t0 {
                        let ns = t0.elapsed().as_nanos() as u64;
                        EXECUTOR_HIST.with(|h| h.borrow_mut().get_or_insert_with(hist).saturating_record(ns));
                    }
                    if !run.done_untimed(ok) {
                        break;
                    }
                }
            })
        })
        .collect();
    run.stop_after(start, o.secs);
    for h in handles {
        let _ = h.join();
    }
    let secs = start.elapsed().as_secs_f64();
    let device = Some(DeviceIo::between(&before, &store.stats(), secs));
    for core in 0..rt.cores() {
        let run = run.clone();
        let _ = rt
            .spawn_on(core, async move {
                if let Some(h) = EXECUTOR_HIST.with(|h| h.borrow_mut().take()) {
                    run.merge(&h);
                }
            })
            .join();
    }
    Point { device, ..run.point(system, op, depth, secs) }
}

pub(crate) fn load(store: &Arc<Store>, rt: &Runtime, o: &DeviceBenchOptions) -> Result<(), String> {
    let tasks = 64u64;
    let done = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (store, done) = (store.clone(), done.clone());
            let (keys, vbytes) = (o.keys, o.value_bytes);
            rt.spawn(async move {
                let mut i = t;
                while i < keys {
                    store.put_async(&key(i), &value_of(vbytes, i, 0)).await.map_err(|e| e.to_string())?;
                    done.fetch_add(1, Relaxed);
                    i += tasks;
                }
                Ok::<(), String>(())
            })
        })
        .collect();
    let progress = crate::progress::Progress::new("loading keys", o.keys, o.progress);
    while handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(20));
        progress.inc(done.load(Relaxed) - progress.done());
    }
    progress.inc(done.load(Relaxed) - progress.done());
    progress.finish();
    for h in handles {
        h.join().map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// Run fio with direct IO through io_uring on `path`, plus `args`; its JSON report.
pub(crate) fn fio_json(path: &Path, args: &[&str]) -> Result<serde_json::Value, String> {
    let out = Command::new("fio")
        .args([&format!("--filename={}", path.display()), "--direct=1", "--ioengine=io_uring", "--output-format=json"])
        .args(args)
        .output()
        .map_err(|e| format!("cannot run fio: {e}"))?;
    if !out.status.success() {
        return Err(format!("fio failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("cannot parse fio's JSON output: {e}"))
}

fn fio_run(path: &Path, rw: &str, depth: usize, secs: f64, size: u64) -> Result<Point, String> {
    let v = fio_json(
        path,
        &[
            "--name=granary-ref",
            &format!("--rw={rw}"),
            "--bs=4k",
            &format!("--iodepth={depth}"),
            "--numjobs=1",
            &format!("--size={size}"),
            &format!("--runtime={}", secs.ceil() as u64),
            "--time_based",
            "--randrepeat=0",
            "--norandommap",
            "--lat_percentiles=1",
        ],
    )?;
    let job = &v["jobs"][0];
    let side = if rw == "randread" { &job["read"] } else { &job["write"] };
    let ios = side["total_ios"].as_u64().unwrap_or(0);
    let runtime_ms = side["runtime"].as_f64().unwrap_or(0.0);
    // Total latency (fio's `lat`: submission + completion), as Granary's
    // is measured from the call to its return. fio's default `clat` starts
    // after the submitting system call, which it leaves out (`slat`, a
    // sizeable part of a random read at queue depth 1).
    let pct = &side["lat_ns"]["percentile"];
    let p = |k: &str| pct[k].as_f64().unwrap_or(0.0) / 1000.0;
    Ok(Point {
        system: "fio".into(),
        op: if rw == "randread" { "get" } else { "put" },
        depth,
        ops: ios,
        secs: runtime_ms / 1000.0,
        p50_us: p("50.000000"),
        p99_us: p("99.000000"),
        errors: 0,
        device: None,
    })
}

pub(crate) fn fill_with_fio(path: &Path, size: u64) -> Result<(), String> {
    let out = Command::new("fio")
        .args([
            "--name=granary-fill",
            &format!("--filename={}", path.display()),
            "--direct=1",
            "--ioengine=io_uring",
            "--rw=write",
            "--bs=1M",
            "--iodepth=16",
            &format!("--size={size}"),
        ])
        .output()
        .map_err(|e| format!("cannot run fio: {e}"))?;
    if !out.status.success() {
        return Err(format!("fio fill failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

/// fio's version, installing fio with apt-get when it is missing.
pub fn ensure_fio() -> Result<String, String> {
    let have = || Command::new("fio").arg("--version").output().ok().filter(|o| o.status.success());
    if have().is_none() {
        eprintln!("fio not found; installing it with apt-get");
        let st = Command::new("sh")
            .args(["-c", "apt-get install -y fio >/dev/null 2>&1 || (apt-get update >/dev/null 2>&1 && apt-get install -y fio >/dev/null 2>&1)"])
            .status()
            .map_err(|e| format!("cannot run apt-get: {e}"))?;
        if !st.success() {
            return Err("fio is missing and apt-get could not install it".into());
        }
    }
    let o = have().ok_or("fio still not runnable")?;
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

pub fn run(o: &DeviceBenchOptions) -> Result<DeviceBenchReport, String> {
    let open_opts = OpenOptions { blind_overwrite_bytes: o.blind_overwrite_bytes, ..OpenOptions::default() };
    let mut report = DeviceBenchReport::default();
    let key_avg = 20u64;
    report.record_bytes = (48 + key_avg + o.value_bytes as u64).next_multiple_of(o.grain_bytes as u64);
    if o.fio {
        report.fio_version = Some(ensure_fio()?);
    }
    if let Some(dir) = o.path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let _ = std::fs::remove_file(&o.path);
    let create = CreateOptions { grain_bytes: Some(o.grain_bytes), segment_bytes: None, index_table_homes: None };
    let needs = o.keys * report.record_bytes * 2;
    if needs > o.size_bytes {
        return Err(format!(
            "{} keys of {} B need about {} MiB (twice the data, for overwrites); --size is {} MiB",
            o.keys,
            o.value_bytes,
            needs >> 20,
            o.size_bytes >> 20
        ));
    }
    let result = (|| -> Result<(), String> {
        // Created written once from end to end (FileDevice::create), as
        // fio's sequential fill does before fio's runs.
        let bar = crate::progress::Progress::new("writing the file once (MiB)", o.size_bytes >> 20, o.progress);
        let dev = FileDevice::create_with_progress(&o.path, o.size_bytes, OpenMode::Direct, &|done, _| {
            bar.inc((done >> 20).saturating_sub(bar.done()));
            Ok(())
        })
        .map_err(|e| e.to_string())?
        .with_backend(IoBackend::Uring);
        bar.finish();
        let store = Arc::new(Store::create(Arc::new(dev), &create, &open_opts).map_err(|e| e.to_string())?);
        let cfg = RuntimeConfig {
            threads: o.cores,
            defer_taskrun: o.defer_taskrun,
            spin: o.spin,
            spin_io: o.spin_io,
            registered_buffer_bytes: if o.registered_buffers {
                RuntimeConfig::default().registered_buffer_bytes
            } else {
                0
            },
            ..Default::default()
        };
        let rt = Runtime::new(cfg).map_err(|e| e.to_string())?;
        load(&store, &rt, o)?;
        Arc::try_unwrap(store).map_err(|_| "store still shared".to_string())?.close().map_err(|e| e.to_string())?;
        if o.fio {
            // fio's first random reads: over the loaded file, which they
            // leave as it is (see the module doc).
            for &d in &o.depths {
                let mut p = fio_run(&o.path, "randread", d, o.secs, o.size_bytes)?;
                p.system = FIO_FIRST.into();
                progress_at_depth(o, "get", d, &p);
                report.points.push(p);
            }
        }
        // Each backend on the store reopened with its device: `sync` is
        // pread/pwrite (an io_uring device would send even synchronous calls
        // through a private ring), the others the executors' rings.
        for b in o.backends.iter().filter(|b| b.as_str() != "mem") {
            let backend = if b == "sync" { IoBackend::Sync } else { IoBackend::Uring };
            let dev = FileDevice::open(&o.path, OpenMode::Direct).map_err(|e| e.to_string())?.with_backend(backend);
            let store = Arc::new(Store::open(Arc::new(dev), &open_opts).map_err(|e| e.to_string())?);
            for op in ["get", "put"] {
                for &d in &o.depths {
                    let p = match b.as_str() {
                        "sync" => run_threads(&store, o, op, d, "granary-sync", 1),
                        "uring" => run_tasks(&store, &rt, o, op, d),
                        "uring-zc" => run_tasks_sampled(&store, &rt, o, op, d, true, "granary-uring-zc", 1),
                        _ => continue,
                    };
                    progress_at_depth(o, op, d, &p);
                    report.points.push(p);
                }
            }
            Arc::try_unwrap(store).map_err(|_| "store still shared".to_string())?.close().map_err(|e| e.to_string())?;
        }
        drop(rt);
        if o.backends.iter().any(|b| b == "mem") {
            let mem: Arc<dyn Device> =
                Arc::new(MemDevice::new_huge(((o.keys * report.record_bytes * 2) + (64 << 20)).max(256 << 20)));
            let store = Arc::new(Store::create(mem.clone(), &create, &open_opts).map_err(|e| e.to_string())?);
            for i in 0..o.keys {
                store.put(&key(i), &value_of(o.value_bytes, i, 0)).map_err(|e| e.to_string())?;
            }
            for op in ["get", "get_buf", "put", "put_buf"] {
                let p = run_threads(&store, o, op, 1, "granary-mem", MEM_LATENCY_SAMPLE);
                if o.progress {
                    eprintln!("{:<16} {op} 1 thread {:>9.0} ops/s", p.system, p.ops_per_sec());
                }
                report.points.push(p);
            }
            // The async API on one executor, a task per GET in flight: the
            // in-memory device's reads and the index lookups yield, so the
            // memory misses of the tasks overlap (`Device::in_memory`).
            let rt = Runtime::new(RuntimeConfig { threads: 1, ..Default::default() }).map_err(|e| e.to_string())?;
            for (op, zero_copy) in [("get", false), ("get_buf", true)] {
                for &d in &o.depths {
                    let p = run_tasks_sampled(&store, &rt, o, op, d, zero_copy, MEM_RT, MEM_LATENCY_SAMPLE);
                    if o.progress {
                        eprintln!("{MEM_RT:<16} {op} qd{d:<3} {:>9.0} ops/s p50 {:.2} us", p.ops_per_sec(), p.p50_us);
                    }
                    report.points.push(p);
                }
            }
            drop(rt);
            // The in-memory device's own reads, as fio is the file's: what
            // a GET would make if the record's copy were all it did.
            let span = o.keys * report.record_bytes;
            let p = device_reads(&*mem, o, report.record_bytes as usize, span);
            if o.progress {
                eprintln!("{:<16} read 1 thread {:>9.0} ops/s", p.system, p.ops_per_sec());
            }
            report.points.push(p);
        }
        if o.fio {
            // Write the whole file first: reads of never-written (unwritten
            // extent) blocks are answered by the filesystem without device IO.
            fill_with_fio(&o.path, o.size_bytes)?;
            // The in-memory device's gigabytes were just freed: in a VM that
            // hands freed memory back to the host, the kernel takes every
            // CPU for tens of milliseconds at a time while it does.
            crate::mem::wait_for_quiet(Duration::from_secs(60));
            for (op, rw) in [("get", "randread"), ("put", "randwrite")] {
                for &d in &o.depths {
                    let mut p = fio_run(&o.path, rw, d, o.secs, o.size_bytes)?;
                    if op == "get" {
                        p.system = FIO_LAST.into();
                    }
                    progress_at_depth(o, op, d, &p);
                    if let Some(first) = (op == "get").then(|| find(&report, FIO_FIRST, "get", d)).flatten() {
                        let both = pooled(first, &p);
                        report.points.push(both);
                    }
                    report.points.push(p);
                }
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&o.path);
    result.map(|()| report)
}

/// With `--progress`, a point's line at queue depth `d`: its system, `op`,
/// rate and median latency.
fn progress_at_depth(o: &DeviceBenchOptions, op: &str, d: usize, p: &Point) {
    if o.progress {
        eprintln!("{:<16} {op} qd{d:<3} {:>9.0} ops/s p50 {:.1} us", p.system, p.ops_per_sec(), p.p50_us);
    }
}

/// Systems of fio's random reads before and after the Granary backends;
/// the reference (`fio`) pools the two.
pub const FIO_FIRST: &str = "fio-first";
pub const FIO_LAST: &str = "fio-last";

/// The `fio` reference point of two runs of the same job: their operations
/// over their time together, and the mean of their percentiles.
pub fn pooled(a: &Point, b: &Point) -> Point {
    Point {
        system: "fio".into(),
        op: a.op,
        depth: a.depth,
        ops: a.ops + b.ops,
        secs: a.secs + b.secs,
        p50_us: (a.p50_us + b.p50_us) / 2.0,
        p99_us: (a.p99_us + b.p99_us) / 2.0,
        errors: a.errors + b.errors,
        device: None,
    }
}

fn find<'a>(r: &'a DeviceBenchReport, system: &str, op: &str, depth: usize) -> Option<&'a Point> {
    r.points.iter().find(|p| p.system == system && p.op == op && p.depth == depth)
}

pub fn render(o: &DeviceBenchOptions, r: &DeviceBenchReport) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "granary-bench device: {} keys, {} B values ({} B records, {} B grains), {:.1} s per point, uring on {} core(s){}{}\n",
        o.keys,
        o.value_bytes,
        r.record_bytes,
        o.grain_bytes,
        o.secs,
        o.cores,
        if o.defer_taskrun { ", DEFER_TASKRUN" } else { "" },
        if o.registered_buffers { ", fixed buffers" } else { ", no fixed buffers" }
    ));
    s.push_str(if o.new_keys {
        "PUTs write new keys (inserts: no old version to read)\n"
    } else {
        "PUTs overwrite loaded keys (blind overwrites: no read of the old version while links fit in DRAM)\n"
    });
    if let Some(v) = &r.fio_version {
        s.push_str(&format!("reference: {v}, io_uring, direct, 4 KiB random, 1 job\n"));
    }
    for op in ["get", "put"] {
        s.push_str(&format!(
            "\n{:>5}  {:<16} {:>10} {:>9} {:>9} {:>8}\n",
            "qd",
            if op == "get" { "GET" } else { "PUT" },
            "ops/s",
            "p50 us",
            "p99 us",
            "x fio"
        ));
        for &d in &o.depths {
            let fio = find(r, "fio", op, d);
            for sys in ["granary-sync", "granary-uring", "granary-uring-zc", "fio", FIO_FIRST, FIO_LAST] {
                if let Some(p) = find(r, sys, op, d) {
                    let ratio = match fio {
                        Some(f) if sys != "fio" && f.ops_per_sec() > 0.0 => {
                            format!("{:.2}", p.ops_per_sec() / f.ops_per_sec())
                        }
                        _ => "".into(),
                    };
                    s.push_str(&format!(
                        "{:>5}  {:<16} {:>10.0} {:>9.1} {:>9.1} {:>8}{}\n",
                        d,
                        sys,
                        p.ops_per_sec(),
                        p.p50_us,
                        p.p99_us,
                        ratio,
                        if p.errors > 0 { format!("  ({} errors)", p.errors) } else { String::new() }
                    ));
                }
            }
        }
    }
    let put_io: Vec<&Point> = r
        .points
        .iter()
        .filter(|p| p.op == "put" && p.system.starts_with("granary-") && !in_memory(p) && p.device.is_some())
        .collect();
    if !put_io.is_empty() {
        s.push_str(
            "\nthe device during the PUT points: reads (GC's, and overwrites that read the current record), group writes, blind overwrites\n",
        );
    }
    for p in put_io {
        let d = p.device.expect("filtered");
        s.push_str(&format!(
            "{:>5}  {:<16} {:>9.0} reads/s (mean {:.0} us) {:>8.0} writes/s of {:.1} KiB (mean {:.0} us) {:>8.0} blind/s\n",
            p.depth,
            p.system,
            d.reads_per_s,
            d.read_mean_us,
            d.writes_per_s,
            d.write_kib,
            d.write_mean_us,
            d.blind_per_s
        ));
    }
    let reads = find(r, "mem-read", "get", 1).map(|p| p.ops_per_sec()).filter(|&x| x > 0.0);
    // The synchronous points (one thread), then those on one executor.
    for sys in ["granary-mem", MEM_RT] {
        for p in r.points.iter().filter(|p| p.system == sys) {
            let on = if sys == MEM_RT { format!("1 executor, {} tasks", p.depth) } else { "1 thread".into() };
            s.push_str(&format!(
                "\nin-memory device, {on}: {} {:.0} ops/s (p50 {:.2} us)",
                p.op.to_uppercase(),
                p.ops_per_sec(),
                p.p50_us
            ));
            if let (Some(x), true) = (reads, p.op.starts_with("get")) {
                s.push_str(&format!(", {:.2}x the device's own reads", p.ops_per_sec() / x));
            }
        }
    }
    if let Some(p) = find(r, "mem-read", "get", 1) {
        s.push_str(&format!(
            "\nin-memory device, 1 thread: its own {} B reads at random {:.0} ops/s (p50 {:.2} us), the ceiling of a GET",
            r.record_bytes,
            p.ops_per_sec(),
            p.p50_us
        ));
    }
    s.push('\n');
    s
}

/// Whether a point ran on the in-memory device (no fio ratio).
fn in_memory(p: &Point) -> bool {
    p.system.starts_with("granary-mem") || p.system == "mem-read"
}

pub fn to_json(o: &DeviceBenchOptions, r: &DeviceBenchReport) -> serde_json::Value {
    json!({
        "bench": "device",
        "keys": o.keys,
        "value_bytes": o.value_bytes,
        "grain_bytes": o.grain_bytes,
        "record_bytes": r.record_bytes,
        "secs_per_point": o.secs,
        "uring_cores": o.cores,
        "defer_taskrun": o.defer_taskrun,
        "spin_us": o.spin.as_micros() as u64,
        "spin_io_us": o.spin_io.as_micros() as u64,
        "registered_buffers": o.registered_buffers,
        "put_keys": if o.new_keys { "new" } else { "existing" },
        "blind_overwrite_bytes": o.blind_overwrite_bytes,
        "fio_version": r.fio_version,
        "points": r.points.iter().map(|p| {
            let fio = find(r, "fio", p.op, p.depth).map(|f| f.ops_per_sec());
            json!({
                "system": p.system, "op": p.op, "depth": p.depth, "ops": p.ops, "secs": p.secs,
                "ops_per_sec": p.ops_per_sec(), "p50_us": p.p50_us, "p99_us": p.p99_us, "errors": p.errors,
                "ratio_to_fio": fio.filter(|_| p.system != "fio" && !in_memory(p)).map(|f| p.ops_per_sec() / f),
                "device_io": p.device.map(|d| json!({
                    "reads_per_s": d.reads_per_s, "read_mean_us": d.read_mean_us,
                    "writes_per_s": d.writes_per_s, "write_mean_us": d.write_mean_us, "write_kib": d.write_kib,
                    "blind_overwrites_per_s": d.blind_per_s,
                })),
                "ratio_to_mem_read": find(r, "mem-read", "get", 1)
                    .filter(|_| in_memory(p) && p.system != "mem-read" && p.op.starts_with("get"))
                    .map(|m| p.ops_per_sec() / m.ops_per_sec().max(1e-9)),
            })
        }).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An op slower than the histogram's bound stays in it (at the bound),
    /// so a point whose only ops stalled still has latencies.
    #[test]
    fn a_stalled_op_is_counted_at_the_bound() {
        let run = Run::new(10);
        let mut h = hist();
        let long_ago = Instant::now().checked_sub(Duration::from_secs(120)).expect("the clock is past 120 s");
        assert!(run.done_one(&mut h, long_ago, true));
        run.merge(&h);
        let p = run.point("granary-sync", "put", 1, 0.1);
        assert_eq!(p.ops, 1);
        assert!(p.p50_us >= 59_000_000.0, "counted at about 60 s: {}", p.p50_us);
    }

    /// The reference pools fio's two read runs: their operations over
    /// their time together (not the mean of the two rates), and the mean
    /// of their percentiles.
    #[test]
    fn the_fio_reference_pools_its_two_runs() {
        let pt = |system: &str, ops, secs, p50_us, p99_us| Point {
            system: system.into(),
            op: "get",
            depth: 32,
            ops,
            secs,
            p50_us,
            p99_us,
            errors: 0,
            device: None,
        };
        let (a, b) = (pt(FIO_FIRST, 180_000, 2.0, 300.0, 500.0), pt(FIO_LAST, 160_000, 1.0, 200.0, 700.0));
        let r = pooled(&a, &b);
        assert_eq!((r.system.as_str(), r.op, r.depth), ("fio", "get", 32));
        assert!((r.ops_per_sec() - 340_000.0 / 3.0).abs() < 1e-6, "{}", r.ops_per_sec());
        assert_eq!((r.p50_us, r.p99_us), (250.0, 600.0));
    }
}
