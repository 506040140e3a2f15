//! `granary-bench churn`: keep a store busy with overwrites long after it
//! is full, and check it never loses data.
//!
//! Fill the store to a target share of live data, then overwrite random
//! keys (random sizes, some deletes) until N times the device size has been
//! written; read every key back at the end. Reports write amplification
//! (device bytes written / user bytes written) and throughput over time,
//! as a human line per interval and as JSON.

use granary_store::io::{Device, MemDevice, OpenMode, SimRng};
use granary_store::{CreateOptions, OpenOptions, Store};
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
    let create = CreateOptions { grain_bytes: None, segment_bytes: Some(o.segment_bytes), index_table_homes: None };
    let store = match &o.path {
        Some(p) => Store::create_path(p, o.size_bytes, OpenMode::Direct, &create, &OpenOptions::default()),
        None => {
            let dev: Arc<dyn Device> = Arc::new(MemDevice::new(o.size_bytes));
            Store::create(dev, &create, &OpenOptions::default())
        }
    }
    .map_err(|e| e.to_string())?;
    let result = churn(&store, o);
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

    let base = store.stats();
    let budget = (o.size_bytes as f64 * o.overwrite) as u64;
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut next_sample = o.interval;
    let (mut ops, mut user) = (0u64, 0u64);
    let mut version = 0u64;
    while user < budget {
        let k = rng.below(keys);
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
            tombstones_dropped: st.gc.tombstones_dropped - base.gc.tombstones_dropped,
            nothing_to_reclaim: st.gc.nothing_to_reclaim - base.gc.nothing_to_reclaim,
            expired: st.gc.expired - base.gc.expired,
            evicted_segments: st.gc.evicted_segments - base.gc.evicted_segments,
            evicted_values: st.gc.evicted_values - base.gc.evicted_values,
            sparse_victims: st.gc.sparse_victims - base.gc.sparse_victims,
            sparse_fallbacks: st.gc.sparse_fallbacks - base.gc.sparse_fallbacks,
            namespace_records_dropped: st.gc.namespace_records_dropped - base.gc.namespace_records_dropped,
        },
        samples,
        mismatches,
    })
}

/// The human summary.
pub fn render(o: &ChurnOptions, r: &ChurnReport) -> String {
    format!(
        "churn on {} of {} MiB ({} MiB segments), {:.0}% live, {:.1}x overwritten\n\
         keys {}  ops {}  {:.0} ops/s  {:.1} MB/s user  write amplification {:.2}\n\
         GC: {} segments reclaimed, {} records ({} MiB) relocated, {} tombstones dropped\n\
         check: {} of {} keys wrong\n",
        if o.path.is_some() { "a file" } else { "memory" },
        o.size_bytes >> 20,
        o.segment_bytes >> 20,
        o.utilization * 100.0,
        o.overwrite,
        r.keys,
        r.churn_ops,
        r.churn_ops as f64 / r.churn_secs,
        r.churn_user_bytes as f64 / r.churn_secs / 1e6,
        r.write_amplification,
        r.gc.victims,
        r.gc.records_relocated,
        r.gc.bytes_relocated >> 20,
        r.gc.tombstones_dropped,
        r.mismatches,
        r.keys
    )
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
        "device": if o.path.is_some() { "file" } else { "memory" },
        "size_bytes": o.size_bytes,
        "segment_bytes": o.segment_bytes,
        "utilization": o.utilization,
        "overwrite": o.overwrite,
        "keys": r.keys,
        "churn_ops": r.churn_ops,
        "churn_secs": r.churn_secs,
        "ops_per_s": r.churn_ops as f64 / r.churn_secs,
        "write_amplification": r.write_amplification,
        "gc": {
            "victims": r.gc.victims, "records_relocated": r.gc.records_relocated,
            "bytes_relocated": r.gc.bytes_relocated, "tombstones_dropped": r.gc.tombstones_dropped,
        },
        "mismatches": r.mismatches,
        "samples": samples,
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

    #[test]
    fn bad_options_are_refused() {
        let o = ChurnOptions { utilization: 1.5, ..ChurnOptions::default() };
        assert!(run(&o).unwrap_err().contains("utilization"));
    }
}
