//! `granary-bench churn`: keep a store busy with overwrites long after it
//! is full, and check it never loses data.
//!
//! Fill the store to a target share of live data, then overwrite keys
//! drawn uniformly or from a Zipfian distribution (random sizes, some
//! deletes) until N times the device size has been written; read every key
//! back at the end. Reports write amplification (device bytes written /
//! user bytes written) and throughput over time, as a human line per
//! interval and as JSON. [`run_matrix`] runs it for several utilisations
//! and GC policies in one go, beside the analytic bound of greedy
//! cleaning under uniform writes ([`greedy_uniform_wa`]). [`run_burst`]
//! is the burst workload: SETs in bursts between quiet periods on a cache,
//! for each policy of GC's low watermark.

use granary_store::io::{Device, MemDevice, OpenMode, SimRng, ZonedDevice};
use granary_store::loadgen;
use granary_store::{CreateOptions, GcPolicy, OpenOptions, Store, Watermark};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone)]
pub struct ChurnOptions {
    /// A new file to create (removed afterwards); None: an in-memory device.
    pub path: Option<PathBuf>,
    pub size_bytes: u64,
    pub segment_bytes: u64,
    /// Share of the device filled with live data before the churn (0..1).
    pub utilization: f64,
    /// Device sizes of user data to write during the churn.
    pub overwrite: f64,
    pub value_min: usize,
    pub value_max: usize,
    /// Percent of churn operations that are deletes.
    pub delete_percent: u64,
    pub seed: u64,
    /// Seconds between progress samples.
    pub interval: Duration,
    pub progress: bool,
    /// Which keys the churn overwrites.
    pub dist: Dist,
    /// GC's victim choice and hot/cold separation.
    pub gc: GcChoice,
    /// On the emulated zoned device (`granary_io::ZonedDevice`, in
    /// memory): zones of a segment each, the store in zoned mode, GC
    /// freeing by zone resets.
    pub zoned: bool,
    /// Grain size (None: the device's block size, at least 512).
    pub grain_bytes: Option<u32>,
}

/// How churn picks the key of each operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Dist {
    Uniform,
    /// YCSB's scrambled Zipfian with this constant (0.99 in YCSB).
    Zipf(f64),
}

impl Dist {
    pub fn name(self) -> String {
        match self {
            Dist::Uniform => "uniform".into(),
            Dist::Zipf(t) => format!("zipf {t}"),
        }
    }
}

/// A GC configuration under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcChoice {
    pub policy: GcPolicy,
    pub hot_cold: bool,
    /// SepBIT placement of user writes (`OpenOptions::gc_sepbit`, which
    /// implies the hot/cold relocation streams).
    pub sepbit: bool,
}

impl GcChoice {
    /// `greedy`, `cost-benefit`, each with an optional `+hot-cold` or
    /// `+sepbit`.
    pub fn parse(s: &str) -> Option<GcChoice> {
        let (p, hot_cold, sepbit) = if let Some(p) = s.strip_suffix("+hot-cold") {
            (p, true, false)
        } else if let Some(p) = s.strip_suffix("+sepbit") {
            (p, false, true)
        } else {
            (s, false, false)
        };
        Some(GcChoice { policy: GcPolicy::parse(p)?, hot_cold, sepbit })
    }

    pub fn name(self) -> String {
        let suffix = match (self.hot_cold, self.sepbit) {
            (_, true) => "+sepbit",
            (true, false) => "+hot-cold",
            (false, false) => "",
        };
        format!("{}{suffix}", self.policy.name())
    }
}

impl Default for GcChoice {
    /// The store's defaults.
    fn default() -> Self {
        let o = OpenOptions::default();
        GcChoice { policy: o.gc_policy, hot_cold: o.gc_hot_cold, sepbit: o.gc_sepbit }
    }
}

/// YCSB's scrambled Zipfian: ranks from [`loadgen::Zipf`] hashed over the
/// keys, so the hot keys are not the first ones written.
struct Zipf(loadgen::Zipf);

impl Zipf {
    fn new(n: u64, theta: f64) -> Zipf {
        Zipf(loadgen::Zipf::new(n, theta))
    }

    /// A rank in 0..n (0 the most frequent).
    fn rank(&self, rng: &mut SimRng) -> u64 {
        self.0.rank((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }

    fn key(&self, rng: &mut SimRng) -> u64 {
        let mut x = self.rank(rng).wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (x ^ (x >> 31)) % self.0.n()
    }
}

/// Write amplification of greedy cleaning under uniform random overwrites
/// with `u` of the space live, in the limit of large segments (Desnoyers,
/// "Analytic modeling of SSD write performance", SYSTOR 2012, where greedy
/// converges to FIFO cleaning): a victim still holds the share `x` of live
/// data that solves `x = exp(-(1 - x) / u)`, and each byte freed costs
/// `1 / (1 - x)` bytes written.
pub fn greedy_uniform_wa(u: f64) -> f64 {
    let mut x = 0.5f64;
    // A contraction for u < 1: converges from any start in (0, 1).
    for _ in 0..10_000 {
        let next = (-(1.0 - x) / u).exp();
        if (next - x).abs() < 1e-12 {
            break;
        }
        x = next;
    }
    1.0 / (1.0 - x)
}

impl Default for ChurnOptions {
    fn default() -> Self {
        ChurnOptions {
            path: None,
            size_bytes: 64 << 20,
            segment_bytes: 1 << 20,
            utilization: 0.8,
            overwrite: 10.0,
            value_min: 100,
            value_max: 16_000,
            delete_percent: 10,
            seed: 1,
            interval: Duration::from_secs(1),
            progress: true,
            dist: Dist::Uniform,
            gc: GcChoice::default(),
            zoned: false,
            grain_bytes: None,
        }
    }
}

/// One progress sample.
#[derive(Debug, Clone)]
pub struct Sample {
    pub secs: f64,
    pub user_bytes: u64,
    pub device_bytes: u64,
    pub ops: u64,
    pub free_segments: u64,
    pub gc_victims: u64,
}

/// The outcome.
#[derive(Debug, Clone)]
pub struct ChurnReport {
    pub keys: u64,
    pub fill_secs: f64,
    pub churn_secs: f64,
    pub churn_ops: u64,
    pub churn_user_bytes: u64,
    pub churn_device_bytes: u64,
    /// Device bytes / user bytes during the churn phase.
    pub write_amplification: f64,
    pub gc: granary_store::GcStats,
    pub samples: Vec<Sample>,
    /// Zone resets during the churn (zoned runs).
    pub zone_resets: Option<u64>,
    /// Keys whose value did not read back as written (must be 0).
    pub mismatches: u64,
}

fn key(k: u64) -> Vec<u8> {
    format!("churn-{k:010}").into_bytes()
}

/// Deterministic content of a key at a version.
fn value(k: u64, version: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    let mut rng = SimRng::new(k.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ version);
    while v.len() < len {
        v.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Run the churn; errors are one-line messages.
pub fn run(o: &ChurnOptions) -> Result<ChurnReport, String> {
    if !(0.05..=0.95).contains(&o.utilization) {
        return Err(format!("utilization {} is outside 0.05..0.95", o.utilization));
    }
    if o.value_min == 0 || o.value_min > o.value_max {
        return Err("value sizes need 1 <= min <= max".into());
    }
    if let Dist::Zipf(t) = o.dist {
        if !(0.0..1.0).contains(&t) || t == 0.0 {
            return Err(format!("zipf constant {t} is outside (0, 1)"));
        }
    }
    let create =
        CreateOptions { grain_bytes: o.grain_bytes, segment_bytes: Some(o.segment_bytes), index_table_homes: None };
    let opts = OpenOptions {
        gc_policy: o.gc.policy,
        gc_hot_cold: o.gc.hot_cold,
        gc_sepbit: o.gc.sepbit,
        ..OpenOptions::default()
    };
    let mut zoned = None;
    let store = match &o.path {
        Some(_) if o.zoned => return Err("the zoned device is emulated in memory: no --path".into()),
        Some(p) => Store::create_path(p, o.size_bytes, OpenMode::Direct, &create, &opts),
        None if o.zoned => {
            // Zones of a segment; the ones before the first segment (1 MiB)
            // conventional, for the superblocks.
            let z = o.segment_bytes;
            if z == 0 || !(1u64 << 20).is_multiple_of(z) {
                return Err(format!("--zoned needs a segment size dividing 1 MiB, not {z}"));
            }
            let lead = ((1 << 20) / z) as usize;
            let dev = Arc::new(ZonedDevice::new((o.size_bytes / z) as usize, z, 8, 8).with_conventional(lead));
            zoned = Some(dev.clone());
            Store::create(dev, &create, &opts)
        }
        None => {
            let dev: Arc<dyn Device> = Arc::new(MemDevice::new(o.size_bytes));
            Store::create(dev, &create, &opts)
        }
    }
    .map_err(|e| e.to_string())?;
    let resets_before = zoned.as_ref().map_or(0, |d| d.resets());
    let mut result = churn(&store, o);
    if let (Some(d), Ok(r)) = (&zoned, &mut result) {
        r.zone_resets = Some(d.resets() - resets_before);
        if d.violations() > 0 {
            return Err(format!("{} writes broke a zone rule", d.violations()));
        }
    }
    drop(store);
    if let Some(p) = &o.path {
        let _ = std::fs::remove_file(p);
    }
    result
}

fn churn(store: &Store, o: &ChurnOptions) -> Result<ChurnReport, String> {
    let mut rng = SimRng::new(o.seed);
    let span = (o.value_max - o.value_min + 1) as u64;
    let size = |rng: &mut SimRng| o.value_min + rng.below(span) as usize;
    let mut model: HashMap<u64, (u64, usize)> = HashMap::new();
    let target = (store.stats().segments * store.superblock().segment_bytes) as f64 * o.utilization;

    let started = Instant::now();
    let mut keys = 0u64;
    while (store.stats().live_bytes as f64) < target {
        let len = size(&mut rng);
        store.put(&key(keys), &value(keys, 0, len)).map_err(|e| format!("fill: {e}"))?;
        model.insert(keys, (0, len));
        keys += 1;
    }
    let fill_secs = started.elapsed().as_secs_f64();
    if o.progress {
        eprintln!("churn: filled {keys} keys to {:.0}% live in {fill_secs:.1} s", o.utilization * 100.0);
    }

    let zipf = match o.dist {
        Dist::Zipf(t) => Some(Zipf::new(keys, t)),
        Dist::Uniform => None,
    };
    let base = store.stats();
    let budget = (o.size_bytes as f64 * o.overwrite) as u64;
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut next_sample = o.interval;
    let (mut ops, mut user) = (0u64, 0u64);
    let mut version = 0u64;
    while user < budget {
        let k = match &zipf {
            Some(z) => z.key(&mut rng),
            None => rng.below(keys),
        };
        version += 1;
        if rng.below(100) < o.delete_percent {
            store.delete(&key(k)).map_err(|e| format!("delete: {e}"))?;
            model.remove(&k);
            user += key(k).len() as u64;
        } else {
            let len = size(&mut rng);
            store.put(&key(k), &value(k, version, len)).map_err(|e| format!("put: {e}"))?;
            model.insert(k, (version, len));
            user += (key(k).len() + len) as u64;
        }
        ops += 1;
        if started.elapsed() >= next_sample {
            next_sample += o.interval;
            let st = store.stats();
            let s = Sample {
                secs: started.elapsed().as_secs_f64(),
                user_bytes: user,
                device_bytes: st.io.written_bytes - base.io.written_bytes,
                ops,
                free_segments: st.segments_free,
                gc_victims: st.gc.victims - base.gc.victims,
            };
            if o.progress {
                eprintln!(
                    "churn: {:6.1} s  {:5.1}% written  {:8.0} ops/s  {:7.1} MB/s user  WA {:.2}  free segments {}",
                    s.secs,
                    100.0 * user as f64 / budget as f64,
                    ops as f64 / s.secs,
                    user as f64 / s.secs / 1e6,
                    s.device_bytes as f64 / user.max(1) as f64,
                    s.free_segments
                );
            }
            samples.push(s);
        }
    }
    let churn_secs = started.elapsed().as_secs_f64();
    let st = store.stats();
    let mut mismatches = 0;
    for k in 0..keys {
        let want = model.get(&k).map(|&(v, l)| value(k, v, l));
        if store.get(&key(k)).map_err(|e| format!("check: {e}"))? != want {
            mismatches += 1;
        }
    }
    let device = st.io.written_bytes - base.io.written_bytes;
    Ok(ChurnReport {
        keys,
        fill_secs,
        churn_secs,
        churn_ops: ops,
        churn_user_bytes: user,
        churn_device_bytes: device,
        write_amplification: device as f64 / user.max(1) as f64,
        gc: granary_store::GcStats {
            victims: st.gc.victims - base.gc.victims,
            records_relocated: st.gc.records_relocated - base.gc.records_relocated,
            bytes_relocated: st.gc.bytes_relocated - base.gc.bytes_relocated,
            bytes_relocated_cold: st.gc.bytes_relocated_cold - base.gc.bytes_relocated_cold,
            tombstones_dropped: st.gc.tombstones_dropped - base.gc.tombstones_dropped,
            nothing_to_reclaim: st.gc.nothing_to_reclaim - base.gc.nothing_to_reclaim,
            expired: st.gc.expired - base.gc.expired,
            evicted_segments: st.gc.evicted_segments - base.gc.evicted_segments,
            evicted_values: st.gc.evicted_values - base.gc.evicted_values,
            sparse_victims: st.gc.sparse_victims - base.gc.sparse_victims,
            summary_victims: st.gc.summary_victims - base.gc.summary_victims,
            compacted: st.gc.compacted - base.gc.compacted,
            sparse_fallbacks: st.gc.sparse_fallbacks - base.gc.sparse_fallbacks,
            namespace_records_dropped: st.gc.namespace_records_dropped - base.gc.namespace_records_dropped,
        },
        samples,
        zone_resets: None,
        mismatches,
    })
}

/// The human summary.
pub fn render(o: &ChurnOptions, r: &ChurnReport) -> String {
    format!(
        "churn on {} of {} MiB ({} MiB segments), {:.0}% live, {:.1}x overwritten, {} keys, GC {}\n\
         keys {}  ops {}  {:.0} ops/s  {:.1} MB/s user  write amplification {:.2}\n\
         GC: {} segments reclaimed, {} records ({} MiB) relocated, {} tombstones dropped{}\n\
         check: {} of {} keys wrong\n",
        device_name(o),
        o.size_bytes >> 20,
        o.segment_bytes >> 20,
        o.utilization * 100.0,
        o.overwrite,
        o.dist.name(),
        o.gc.name(),
        r.keys,
        r.churn_ops,
        r.churn_ops as f64 / r.churn_secs,
        r.churn_user_bytes as f64 / r.churn_secs / 1e6,
        r.write_amplification,
        r.gc.victims,
        r.gc.records_relocated,
        r.gc.bytes_relocated >> 20,
        r.gc.tombstones_dropped,
        r.zone_resets.map_or(String::new(), |z| format!(
            ", {z} zone resets ({:.0} per user GB)",
            z as f64 / (r.churn_user_bytes.max(1) as f64 / 1e9)
        )),
        r.mismatches,
        r.keys
    )
}

fn device_name(o: &ChurnOptions) -> &'static str {
    match (&o.path, o.zoned) {
        (Some(_), _) => "a file",
        (None, true) => "the emulated zoned device",
        (None, false) => "memory",
    }
}

/// Machine-readable results.
pub fn to_json(o: &ChurnOptions, r: &ChurnReport) -> serde_json::Value {
    let samples: Vec<_> = r
        .samples
        .iter()
        .map(|s| {
            serde_json::json!({
                "secs": s.secs, "user_bytes": s.user_bytes, "device_bytes": s.device_bytes,
                "ops": s.ops, "free_segments": s.free_segments, "gc_victims": s.gc_victims,
            })
        })
        .collect();
    serde_json::json!({
        "benchmark": "churn",
        "device": match (&o.path, o.zoned) {
            (Some(_), _) => "file",
            (None, true) => "zoned",
            (None, false) => "memory",
        },
        "zone_resets": r.zone_resets,
        "grain_bytes": o.grain_bytes,
        "size_bytes": o.size_bytes,
        "segment_bytes": o.segment_bytes,
        "utilization": o.utilization,
        "overwrite": o.overwrite,
        "dist": o.dist.name(),
        "gc_policy": o.gc.policy.name(),
        "gc_hot_cold": o.gc.hot_cold,
        "gc_sepbit": o.gc.sepbit,
        "keys": r.keys,
        "churn_ops": r.churn_ops,
        "churn_secs": r.churn_secs,
        "ops_per_s": r.churn_ops as f64 / r.churn_secs,
        "write_amplification": r.write_amplification,
        "gc": {
            "victims": r.gc.victims, "records_relocated": r.gc.records_relocated,
            "bytes_relocated": r.gc.bytes_relocated, "bytes_relocated_cold": r.gc.bytes_relocated_cold,
            "tombstones_dropped": r.gc.tombstones_dropped,
        },
        "mismatches": r.mismatches,
        "samples": samples,
    })
}

/// One cell of [`run_matrix`].
#[derive(Debug, Clone)]
pub struct MatrixRun {
    pub options: ChurnOptions,
    pub report: ChurnReport,
}

/// Run the churn of `base` at each utilisation with each GC choice (same
/// seed, so the same operations), in that order.
pub fn run_matrix(base: &ChurnOptions, utils: &[f64], gcs: &[GcChoice]) -> Result<Vec<MatrixRun>, String> {
    let mut out = Vec::new();
    // With --zoned each configuration runs on memory, then zoned, both
    // with the emulated device's 4 KiB blocks as grains (like for like).
    let devices: &[bool] = if base.zoned { &[false, true] } else { &[false] };
    let grain_bytes = if base.zoned { Some(base.grain_bytes.unwrap_or(4096)) } else { base.grain_bytes };
    for &utilization in utils {
        for &gc in gcs {
            for &zoned in devices {
                let options = ChurnOptions { utilization, gc, zoned, grain_bytes, ..base.clone() };
                if base.progress {
                    eprintln!(
                        "churn: {:.0}% live, {} keys, GC {}{}",
                        utilization * 100.0,
                        base.dist.name(),
                        gc.name(),
                        if zoned { ", zoned" } else { "" }
                    );
                }
                let report = run(&options)?;
                out.push(MatrixRun { options, report });
            }
        }
    }
    Ok(out)
}

/// The table of a matrix: write amplification, against the first GC
/// choice at the same utilisation, and throughput.
pub fn render_matrix(runs: &[MatrixRun]) -> String {
    let Some(first) = runs.first() else { return String::new() };
    let o = &first.options;
    let mut s = format!(
        "churn on {} of {} MiB ({} MiB segments), {:.1}x overwritten, {} keys, {}% deletes\n",
        if o.path.is_some() {
            "a file"
        } else if o.zoned {
            "memory and the emulated zoned device"
        } else {
            "memory"
        },
        o.size_bytes >> 20,
        o.segment_bytes >> 20,
        o.overwrite,
        o.dist.name(),
        o.delete_percent
    );
    s += &format!(
        "{:>5}  {:<24} {:>7} {:>9} {:>10} {:>9} {:>9} {:>13}  {}\n",
        "live", "GC", "WA", "vs first", "ops/s", "MB/s", "victims", "resets/userGB", "check"
    );
    for r in runs {
        let same_util = runs.iter().find(|x| x.options.utilization == r.options.utilization).expect("r itself");
        s += &format!(
            "{:>4.0}%  {:<24} {:>7.2} {:>8.2}x {:>10.0} {:>9.1} {:>9} {:>13}  {}\n",
            r.options.utilization * 100.0,
            r.options.gc.name() + if r.options.zoned { " zoned" } else { "" },
            r.report.write_amplification,
            r.report.write_amplification / same_util.report.write_amplification,
            r.report.churn_ops as f64 / r.report.churn_secs,
            r.report.churn_user_bytes as f64 / r.report.churn_secs / 1e6,
            r.report.gc.victims,
            r.report.zone_resets.map_or("-".to_string(), |z| format!(
                "{:.0}",
                z as f64 / (r.report.churn_user_bytes.max(1) as f64 / 1e9)
            )),
            if r.report.mismatches == 0 { "ok".to_string() } else { format!("{} wrong", r.report.mismatches) }
        );
    }
    let mut utils: Vec<f64> = runs.iter().map(|r| r.options.utilization).collect();
    utils.dedup();
    s += "analytic WA of greedy under uniform writes (large segments, no deletes):";
    for u in utils {
        s += &format!("  {:.0}%: {:.2}", u * 100.0, greedy_uniform_wa(u));
    }
    s += "\n";
    s
}

/// Machine-readable results of a matrix.
pub fn matrix_to_json(runs: &[MatrixRun]) -> serde_json::Value {
    let cells: Vec<_> = runs
        .iter()
        .map(|r| {
            let mut j = to_json(&r.options, &r.report);
            j["greedy_uniform_wa"] = greedy_uniform_wa(r.options.utilization).into();
            j
        })
        .collect();
    serde_json::json!({ "benchmark": "churn", "runs": cells })
}

/// `granary-bench churn --burst`: bursts of SETs between quiet periods on
/// a cache (cache mode: GC evicts), with each low watermark policy.
#[derive(Debug, Clone)]
pub struct BurstOptions {
    /// A new file to create (removed afterwards); None: an in-memory device.
    pub path: Option<PathBuf>,
    pub size_bytes: u64,
    pub segment_bytes: u64,
    /// Keys: this many times what the device holds (a cache never holds all).
    pub key_factor: f64,
    pub value_min: usize,
    pub value_max: usize,
    pub bursts: u64,
    /// Device sizes written by each burst, as SETs with no pause.
    pub burst_share: f64,
    /// Quiet time after each burst, during which GETs are paced.
    pub quiet: Duration,
    /// GETs issued in each quiet period (the hit ratio).
    pub quiet_gets: u64,
    /// Zipfian constant of the keys SET and read.
    pub theta: f64,
    pub seed: u64,
    pub progress: bool,
}

impl Default for BurstOptions {
    fn default() -> Self {
        BurstOptions {
            path: None,
            size_bytes: 64 << 20,
            segment_bytes: 1 << 20,
            key_factor: 2.0,
            value_min: 100,
            value_max: 16_000,
            bursts: 20,
            burst_share: 0.25,
            quiet: Duration::from_millis(500),
            quiet_gets: 20_000,
            theta: 0.99,
            seed: 1,
            progress: true,
        }
    }
}

/// The outcome of one watermark policy.
#[derive(Debug, Clone)]
pub struct BurstReport {
    pub watermark: Watermark,
    /// SET latency during bursts, microseconds: median, p99, p99.9, max.
    pub set_p50_us: f64,
    pub set_p99_us: f64,
    pub set_p999_us: f64,
    pub set_max_us: f64,
    pub sets: u64,
    pub burst_secs: f64,
    pub gets: u64,
    pub hits: u64,
    pub evicted_values: u64,
    pub evicted_segments: u64,
    /// The low watermark at the end of a burst and of a quiet period
    /// (the last ones).
    pub low_after_burst: usize,
    pub low_after_quiet: usize,
    /// Bytes written to the device over the bursts and quiet periods per
    /// byte SET (GC's relocations and headers included).
    pub write_amplification: f64,
    /// Free segments when a burst began (mean over the bursts).
    pub free_before_burst: f64,
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

/// Run the bursts once per watermark policy, same seed.
pub fn run_burst(o: &BurstOptions, marks: &[Watermark]) -> Result<Vec<BurstReport>, String> {
    if o.value_min == 0 || o.value_min > o.value_max || o.bursts == 0 || !(0.0..1.0).contains(&o.theta) {
        return Err("burst: value sizes need 1 <= min <= max, bursts >= 1, zipf constant in (0, 1)".into());
    }
    marks.iter().map(|&w| burst_one(o, w)).collect()
}

fn burst_one(o: &BurstOptions, watermark: Watermark) -> Result<BurstReport, String> {
    let create = CreateOptions { grain_bytes: None, segment_bytes: Some(o.segment_bytes), index_table_homes: None };
    let opts = OpenOptions { evict: true, gc_watermark: watermark, ..OpenOptions::default() };
    let store = match &o.path {
        Some(p) => Store::create_path(p, o.size_bytes, OpenMode::Direct, &create, &opts),
        None => {
            let dev: Arc<dyn Device> = Arc::new(MemDevice::new(o.size_bytes));
            Store::create(dev, &create, &opts)
        }
    }
    .map_err(|e| e.to_string())?;
    let r = bursts(&store, o, watermark);
    drop(store);
    if let Some(p) = &o.path {
        let _ = std::fs::remove_file(p);
    }
    r
}

fn bursts(store: &Store, o: &BurstOptions, watermark: Watermark) -> Result<BurstReport, String> {
    let mut rng = SimRng::new(o.seed);
    let span = (o.value_max - o.value_min + 1) as u64;
    let mean = (o.value_min + o.value_max) as f64 / 2.0;
    let keys = ((o.size_bytes as f64 * o.key_factor / mean) as u64).max(2);
    let zipf = Zipf::new(keys, o.theta);
    let set = |rng: &mut SimRng, k: u64| -> Result<u64, String> {
        let len = o.value_min + rng.below(span) as usize;
        store.put(&key(k), &value(k, 0, len)).map_err(|e| format!("set: {e}"))?;
        Ok((key(k).len() + len) as u64)
    };
    // Warm up: fill the cache past its size, so GC evicts from then on.
    let mut written = 0u64;
    while written < o.size_bytes * 3 / 2 {
        let k = zipf.key(&mut rng);
        written += set(&mut rng, k)?;
    }
    let base = store.stats();
    let (mut user_bytes, mut free_before) = (0u64, 0u64);
    let mut lat = Vec::new();
    let (mut gets, mut hits, mut burst_secs) = (0u64, 0u64, 0.0);
    let (mut low_after_burst, mut low_after_quiet) = (0, 0);
    let per_burst = (o.size_bytes as f64 * o.burst_share) as u64;
    for b in 0..o.bursts {
        free_before += store.stats().segments_free;
        let started = Instant::now();
        let mut bytes = 0;
        while bytes < per_burst {
            let k = zipf.key(&mut rng);
            let t = Instant::now();
            let n = set(&mut rng, k)?;
            bytes += n;
            user_bytes += n;
            lat.push(t.elapsed().as_nanos() as u64);
        }
        burst_secs += started.elapsed().as_secs_f64();
        low_after_burst = store.stats().gc_watermarks.0;
        // Quiet: paced GETs over the period.
        let quiet = Instant::now();
        let step = o.quiet / o.quiet_gets.max(1) as u32;
        for i in 0..o.quiet_gets {
            let k = zipf.key(&mut rng);
            gets += 1;
            if store.get(&key(k)).map_err(|e| format!("get: {e}"))?.is_some() {
                hits += 1;
            }
            let due = step * (i as u32 + 1);
            if let Some(wait) = due.checked_sub(quiet.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        if let Some(rest) = o.quiet.checked_sub(quiet.elapsed()) {
            std::thread::sleep(rest);
        }
        low_after_quiet = store.stats().gc_watermarks.0;
        if o.progress {
            eprintln!(
                "burst {}: {b}/{}  low watermark {low_after_burst} after the burst, {low_after_quiet} after the quiet",
                watermark.name(),
                o.bursts
            );
        }
    }
    let st = store.stats();
    lat.sort_unstable();
    Ok(BurstReport {
        watermark,
        set_p50_us: percentile(&lat, 0.5),
        set_p99_us: percentile(&lat, 0.99),
        set_p999_us: percentile(&lat, 0.999),
        set_max_us: lat.last().map_or(0.0, |&x| x as f64 / 1000.0),
        sets: lat.len() as u64,
        burst_secs,
        gets,
        hits,
        evicted_values: st.gc.evicted_values - base.gc.evicted_values,
        evicted_segments: st.gc.evicted_segments - base.gc.evicted_segments,
        low_after_burst,
        low_after_quiet,
        write_amplification: (st.io.written_bytes - base.io.written_bytes) as f64 / user_bytes.max(1) as f64,
        free_before_burst: free_before as f64 / o.bursts as f64,
    })
}

/// The table of a burst run; the first policy is the reference.
pub fn render_burst(o: &BurstOptions, rs: &[BurstReport]) -> String {
    let mut s = format!(
        "bursts on a cache in {} of {} MiB ({} MiB segments): {} bursts of {:.0}% of the device in SETs, \
         {} ms quiet with {} GETs, zipf {} keys\n",
        if o.path.is_some() { "a file" } else { "memory" },
        o.size_bytes >> 20,
        o.segment_bytes >> 20,
        o.bursts,
        o.burst_share * 100.0,
        o.quiet.as_millis(),
        o.quiet_gets,
        o.theta
    );
    s += &format!(
        "{:<10} {:>9} {:>9} {:>10} {:>10} {:>9} {:>10} {:>9} {:>12} {:>10} {:>5}\n",
        "watermark",
        "SET p50",
        "SET p99",
        "p99 vs 1st",
        "SET p99.9",
        "hit ratio",
        "evictions",
        "SETs/s",
        "low b/q",
        "free start",
        "WA"
    );
    let first = rs.first().map_or(1.0, |r| r.set_p99_us.max(1e-9));
    for r in rs {
        s += &format!(
            "{:<10} {:>7.1}us {:>7.1}us {:>9.2}x {:>8.1}us {:>8.1}% {:>10} {:>9.0} {:>12} {:>10.1} {:>5.2}\n",
            r.watermark.name(),
            r.set_p50_us,
            r.set_p99_us,
            r.set_p99_us / first,
            r.set_p999_us,
            100.0 * r.hits as f64 / r.gets.max(1) as f64,
            r.evicted_values,
            r.sets as f64 / r.burst_secs.max(1e-9),
            format!("{}/{}", r.low_after_burst, r.low_after_quiet),
            r.free_before_burst,
            r.write_amplification
        );
    }
    s
}

/// Machine-readable results of a burst run.
pub fn burst_to_json(o: &BurstOptions, rs: &[BurstReport]) -> serde_json::Value {
    let runs: Vec<_> = rs
        .iter()
        .map(|r| {
            serde_json::json!({
                "watermark": r.watermark.name(), "set_p50_us": r.set_p50_us, "set_p99_us": r.set_p99_us,
                "set_p999_us": r.set_p999_us, "set_max_us": r.set_max_us, "sets": r.sets,
                "sets_per_s": r.sets as f64 / r.burst_secs.max(1e-9), "gets": r.gets, "hits": r.hits,
                "hit_ratio": r.hits as f64 / r.gets.max(1) as f64, "evicted_values": r.evicted_values,
                "evicted_segments": r.evicted_segments, "low_after_burst": r.low_after_burst,
                "low_after_quiet": r.low_after_quiet, "free_before_burst": r.free_before_burst,
                "write_amplification": r.write_amplification,
            })
        })
        .collect();
    serde_json::json!({
        "benchmark": "churn-burst",
        "device": if o.path.is_some() { "file" } else { "memory" },
        "size_bytes": o.size_bytes, "segment_bytes": o.segment_bytes, "bursts": o.bursts,
        "burst_share": o.burst_share, "quiet_ms": o.quiet.as_millis() as u64, "theta": o.theta,
        "runs": runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_churn_checks_every_key_and_reports_amplification() {
        let o = ChurnOptions {
            size_bytes: 16 << 20,
            segment_bytes: 256 << 10,
            overwrite: 3.0,
            value_max: 8000,
            interval: Duration::from_millis(20),
            progress: false,
            ..ChurnOptions::default()
        };
        let r = run(&o).unwrap();
        assert_eq!(r.mismatches, 0);
        assert!(r.gc.victims > 0, "{:?}", r.gc);
        assert!(r.write_amplification > 1.0, "{}", r.write_amplification);
        assert!(render(&o, &r).contains("write amplification"));
        assert_eq!(to_json(&o, &r)["mismatches"], 0);
    }

    /// `--zoned`: each configuration on memory, then on the emulated
    /// zoned device, where GC frees by zone resets and no write breaks a
    /// zone rule (a violation fails the run).
    #[test]
    fn zoned_runs_beside_conventional_ones_and_count_resets() {
        let o = ChurnOptions {
            size_bytes: 16 << 20,
            segment_bytes: 256 << 10,
            overwrite: 2.0,
            value_max: 8000,
            interval: Duration::from_millis(20),
            progress: false,
            zoned: true,
            ..ChurnOptions::default()
        };
        let runs = run_matrix(&o, &[0.8], &[GcChoice::default()]).unwrap();
        assert_eq!(runs.iter().map(|r| r.options.zoned).collect::<Vec<_>>(), [false, true]);
        let (mem, zoned) = (&runs[0].report, &runs[1].report);
        assert_eq!((mem.mismatches, zoned.mismatches), (0, 0));
        assert_eq!(mem.zone_resets, None);
        let resets = zoned.zone_resets.unwrap();
        assert!(resets >= zoned.gc.victims && zoned.gc.victims > 0, "{resets} resets, {:?}", zoned.gc);
        assert!(render_matrix(&runs).contains("cost-benefit zoned"));
        assert_eq!(to_json(&runs[1].options, zoned)["device"], "zoned");
        let bad = ChurnOptions { segment_bytes: 3 << 20, ..o.clone() };
        assert!(run(&bad).unwrap_err().contains("dividing 1 MiB"));
    }

    #[test]
    fn matrix_runs_every_policy_and_zipf_skews_the_keys() {
        let o = ChurnOptions {
            size_bytes: 16 << 20,
            segment_bytes: 256 << 10,
            overwrite: 2.0,
            value_max: 8000,
            interval: Duration::from_millis(20),
            progress: false,
            dist: Dist::Zipf(0.99),
            ..ChurnOptions::default()
        };
        let gcs: Vec<GcChoice> = ["greedy", "cost-benefit", "cost-benefit+hot-cold", "greedy+hot-cold"]
            .iter()
            .map(|s| GcChoice::parse(s).unwrap())
            .collect();
        let runs = run_matrix(&o, &[0.5, 0.8], &gcs).unwrap();
        assert_eq!(runs.len(), 8);
        for r in &runs {
            assert_eq!(r.report.mismatches, 0, "{}", r.options.gc.name());
            assert!(r.report.gc.victims > 0, "{}: {:?}", r.options.gc.name(), r.report.gc);
        }
        let table = render_matrix(&runs);
        assert!(table.contains("cost-benefit+hot-cold") && table.contains("analytic"), "{table}");
        assert_eq!(matrix_to_json(&runs)["runs"].as_array().unwrap().len(), 8);
    }

    #[test]
    fn zipf_draws_ranks_by_power_law() {
        let z = Zipf::new(1000, 0.99);
        let mut rng = SimRng::new(7);
        let mut counts = vec![0u64; 1000];
        for _ in 0..100_000 {
            counts[z.rank(&mut rng) as usize] += 1;
        }
        // Rank 0 is drawn about 1/zeta(1000) of the time (13%), and twice
        // as often as rank 1 (2^0.99).
        let p0 = counts[0] as f64 / 100_000.0;
        assert!((p0 - 1.0 / z.0.zetan()).abs() < 0.01, "{p0} vs {}", 1.0 / z.0.zetan());
        assert!(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500], "{:?}", &counts[..12]);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let k = z.key(&mut rng);
            assert!(k < 1000);
            seen.insert(k);
        }
        assert!(seen.len() > 300, "scrambled keys cover much of the range: {}", seen.len());
    }

    #[test]
    fn greedy_bound_matches_the_known_curve() {
        // x = exp(-(1 - x) / u) at u = 0.8: x = 0.6286, WA 2.69.
        let wa = greedy_uniform_wa(0.8);
        assert!((wa - 2.69).abs() < 0.01, "{wa}");
        assert!(greedy_uniform_wa(0.5) < greedy_uniform_wa(0.8));
        assert!(greedy_uniform_wa(0.9) > 5.0, "{}", greedy_uniform_wa(0.9));
        let x = 1.0 - 1.0 / wa;
        assert!((x - (-(1.0 - x) / 0.8f64).exp()).abs() < 1e-9);
    }

    #[test]
    fn bursts_run_under_each_watermark() {
        let o = BurstOptions {
            size_bytes: 16 << 20,
            segment_bytes: 256 << 10,
            bursts: 3,
            quiet: Duration::from_millis(20),
            quiet_gets: 200,
            progress: false,
            ..BurstOptions::default()
        };
        let marks = [Watermark::Fixed, Watermark::Queue, Watermark::Doubling, Watermark::Compact];
        let rs = run_burst(&o, &marks).unwrap();
        assert_eq!(rs.len(), 4);
        for r in &rs {
            assert!(r.sets > 0 && r.gets == 600, "{r:?}");
            // Compaction may make the bursts' room from garbage alone.
            assert!(r.evicted_segments > 0 || r.watermark == Watermark::Compact, "a cache past its size evicts: {r:?}");
            assert!(r.set_p50_us <= r.set_p99_us && r.set_p99_us <= r.set_max_us, "{r:?}");
            assert!(r.write_amplification >= 1.0, "records are written whole: {r:?}");
        }
        let table = render_burst(&o, &rs);
        assert!(table.contains("doubling") && table.contains("compact"), "{table}");
        assert_eq!(burst_to_json(&o, &rs)["runs"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn bad_options_are_refused() {
        let o = ChurnOptions { utilization: 1.5, ..ChurnOptions::default() };
        assert!(run(&o).unwrap_err().contains("utilization"));
    }
}
