//! `granary-bench txn`: namespaces and (to come) atomic batches.
//!
//! Measured now: **dropping a namespace** that holds N keys (default 1 M,
//! 100-byte values) in a store on a file with direct IO: how long
//! `drop_namespace` takes and what IO it does (the target: under 10 ms,
//! only the catalog written), then how long GC's sweep takes to let go of
//! the namespace's records (index entries gone, their bytes no longer live,
//! so GC reclaims their segments as it needs room); and the index's DRAM
//! per key with the keys in a namespace against the same keys in the
//! default namespace of a second store (namespaces add none).
//!
//! Atomic batches (commit rate and latency against RocksDB's WriteBatch)
//! come with the batches themselves.

use granary_store::io::{FileDevice, OpenMode};
use granary_store::loadgen::{load_key, load_value};
use granary_store::{CreateOptions, NamespaceOptions, OpenOptions, Store};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct TxnBenchOptions {
    /// The data file (created, then removed at the end).
    pub path: PathBuf,
    pub keys: u64,
    pub value_bytes: usize,
}

impl Default for TxnBenchOptions {
    fn default() -> Self {
        TxnBenchOptions { path: PathBuf::from("granary-data/bench-txn.db"), keys: 1_000_000, value_bytes: 100 }
    }
}

/// A store on a new file at `path` sized for `keys` keys, loaded with them
/// in `namespace` (None: the default namespace); returns the store and
/// the index's bytes per key.
fn loaded(o: &TxnBenchOptions, namespace: Option<&str>) -> Result<(Store, f64), String> {
    let _ = std::fs::remove_file(&o.path);
    let record = granary_format::limits::record_bytes(16 + granary_store::NS_KEY_OVERHEAD, o.value_bytes as u64);
    let per_key = granary_format::limits::grains_for(record, 512) * 512;
    let size = (o.keys * per_key * 2 + (256 << 20)).next_multiple_of(1 << 20);
    let dev = FileDevice::create(&o.path, size, OpenMode::Direct).map_err(|e| e.to_string())?;
    let create = CreateOptions { grain_bytes: Some(512), ..CreateOptions::default() };
    let open = OpenOptions { checkpoint_interval: None, ..OpenOptions::default() };
    let store = Store::create(Arc::new(dev), &create, &open).map_err(|e| e.to_string())?;
    let ns = match namespace {
        Some(n) => store.create_namespace(n, NamespaceOptions::default()).map_err(|e| e.to_string())?,
        None => store.namespace(granary_store::DEFAULT_NAMESPACE).map_err(|e| e.to_string())?,
    };
    let started = Instant::now();
    let mut last = Instant::now();
    std::thread::scope(|s| -> Result<(), String> {
        let threads = 4u64;
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let ns = ns.clone();
                s.spawn(move || -> Result<(), String> {
                    let mut i = t;
                    while i < o.keys {
                        ns.put(&load_key(i), &load_value(i, 1, o.value_bytes)).map_err(|e| e.to_string())?;
                        i += threads;
                    }
                    Ok(())
                })
            })
            .collect();
        while hs.iter().any(|h| !h.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            if last.elapsed() >= Duration::from_secs(2) {
                eprintln!("  loading: {} keys in {:.0} s", store.stats().keys, started.elapsed().as_secs_f64());
                last = Instant::now();
            }
        }
        for h in hs {
            h.join().expect("loader")?;
        }
        Ok(())
    })?;
    let st = store.stats();
    let per_key = st.index.memory_bytes as f64 / st.keys.max(1) as f64;
    Ok((store, per_key))
}

/// Run the benchmark; prints a human summary and returns the JSON.
pub fn run(o: &TxnBenchOptions) -> Result<serde_json::Value, String> {
    if let Some(parent) = o.path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    eprintln!("txn: {} keys in the default namespace (the DRAM reference)", o.keys);
    let (reference, default_per_key) = loaded(o, None)?;
    drop(reference);
    eprintln!("txn: {} keys in a namespace, then drop it", o.keys);
    let (store, ns_per_key) = loaded(o, Some("bench"))?;
    let before = store.stats();
    let started = Instant::now();
    store.drop_namespace("bench").map_err(|e| e.to_string())?;
    let drop_secs = started.elapsed().as_secs_f64();
    let after = store.stats();
    // GC's sweep runs in the background: wait until every record of the
    // namespace is let go (bounded: the sweep reads the log once).
    let swept_at = Instant::now();
    let deadline = swept_at + Duration::from_secs(600);
    while store.stats().gc.namespace_records_dropped < o.keys {
        if Instant::now() > deadline {
            return Err("the sweep did not finish in 600 s".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let sweep_secs = swept_at.elapsed().as_secs_f64();
    let swept = store.stats();
    let _ = std::fs::remove_file(&o.path);
    let io = |a: &granary_store::io::IoCountersSnapshot, b: &granary_store::io::IoCountersSnapshot| {
        serde_json::json!({
            "reads": b.reads - a.reads,
            "writes": b.writes - a.writes,
            "bytes_written": b.written_bytes - a.written_bytes,
        })
    };
    let v = serde_json::json!({
        "keys": o.keys,
        "value_bytes": o.value_bytes,
        "index_bytes_per_key_default_namespace": default_per_key,
        "index_bytes_per_key_namespace": ns_per_key,
        "drop_ms": drop_secs * 1e3,
        "drop_io": io(&before.io, &after.io),
        "sweep_secs": sweep_secs,
        "sweep_io": io(&after.io, &swept.io),
        "live_bytes_before": before.live_bytes,
        "live_bytes_after_sweep": swept.live_bytes,
    });
    println!("namespace drop, {} keys of {} bytes:", o.keys, o.value_bytes);
    println!(
        "  drop_namespace        {:.3} ms, {} writes ({} bytes), {} reads",
        drop_secs * 1e3,
        after.io.writes - before.io.writes,
        after.io.written_bytes - before.io.written_bytes,
        after.io.reads - before.io.reads
    );
    println!(
        "  GC sweep              {:.2} s to let go of every record; live bytes {} -> {}",
        sweep_secs, before.live_bytes, swept.live_bytes
    );
    println!("  index DRAM per key    {ns_per_key:.2} B in a namespace, {default_per_key:.2} B in the default one");
    Ok(v)
}
