//! `granary-bench txn`: atomic batches and namespaces.
//!
//! **Batches**: on a store in a file with direct IO, one commit at a time
//! (queue depth 1), batches of 1, 4, 16 and 64 puts of 1 KiB values over
//! 100,000 keys (fewer on a small data file), for a few seconds each: commits/s and the median and 99th
//! percentile commit latency; the same puts one by one (the latency of one
//! put). The keys are written once first, so every put overwrites, alone
//! or in a batch; the points take turns in slices of a quarter second, so
//! the disk's drift during a run weighs on each alike. And in the same run
//! RocksDB's WriteBatch with sync (its write-ahead log fsynced at each
//! commit), built from the C peer in `crates/bench/peers` against Debian's
//! librocksdb (installed with apt-get when missing) on the same
//! filesystem. Granary runs in `Flush` mode
//! (fdatasync at each commit: RocksDB's durability) and in its default
//! `Direct` mode (a commit is durable when its write completes on a device
//! without a volatile cache). With `--new-keys` every put inserts a key
//! never written before (no blind overwrite, no candidate in the index;
//! nothing is loaded first).
//!
//! **Dropping a namespace** that holds N keys (default 1 M,
//! 100-byte values) in a store on a file with direct IO: how long
//! `drop_namespace` takes and what IO it does (the target: under 10 ms,
//! only the catalog written), then how long GC's sweep takes to let go of
//! the namespace's records (index entries gone, their bytes no longer live,
//! so GC reclaims their segments as it needs room); and the index's DRAM
//! per key with the keys in a namespace against the same keys in the
//! default namespace of a second store (namespaces add none).
//!

use granary_store::io::{FileDevice, OpenMode};
use granary_store::loadgen::{load_key, load_value};
use granary_store::{BatchOutcome, CreateOptions, Durability, NamespaceOptions, OpenOptions, Store};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct TxnBenchOptions {
    /// The data file (created, then removed at the end).
    pub path: PathBuf,
    /// Keys in the namespace dropped.
    pub keys: u64,
    pub value_bytes: usize,
    /// Batch sizes to commit (puts per batch).
    pub batches: Vec<usize>,
    /// Seconds per batch point.
    pub secs: f64,
    /// Run the RocksDB peer.
    pub rocksdb: bool,
    /// Write keys never written before (inserts), instead of overwriting
    /// 100,000 keys at random.
    pub new_keys: bool,
    /// Size of the batches' data file.
    pub size_bytes: u64,
}

impl Default for TxnBenchOptions {
    fn default() -> Self {
        TxnBenchOptions {
            path: PathBuf::from("granary-data/bench-txn.db"),
            keys: 1_000_000,
            value_bytes: 100,
            batches: vec![1, 4, 16, 64],
            secs: 3.0,
            rocksdb: true,
            new_keys: false,
            size_bytes: 2 << 30,
        }
    }
}

/// Keys the batches write over, at most.
const BATCH_KEYS: u64 = 100_000;

/// Keys the batches write over: [`BATCH_KEYS`], or fewer on a data file
/// too small to hold them loaded four times over (the log's room for the
/// overwrites until GC reclaims), 1,536 bytes a record of a 1 KiB value.
fn batch_keys(o: &TxnBenchOptions) -> u64 {
    BATCH_KEYS.min(o.size_bytes / (4 * 1536)).max(1)
}

/// Value size of the batches' puts.
const BATCH_VALUE_BYTES: usize = 1024;
/// Puts per batch when the keys are loaded before the points.
const LOAD_BATCH: u64 = 64;
/// The points' turns (`granary_batches`): each runs this long at a time.
const SLICE_SECS: f64 = 0.25;

/// One batch point: commits/s and latency percentiles.
fn point(system: &str, what: &str, batch: usize, commits: u64, secs: f64, p50: f64, p99: f64) -> serde_json::Value {
    println!(
        "  {system:<16} {what:<14} {batch:>3} puts   {:>9.0} commits/s  {:>9.0} puts/s   p50 {p50:>7.1} us  p99 {p99:>7.1} us",
        commits as f64 / secs,
        (commits * batch as u64) as f64 / secs
    );
    serde_json::json!({
        "system": system, "mode": what, "batch": batch, "commits": commits, "secs": secs,
        "commits_per_s": commits as f64 / secs, "p50_us": p50, "p99_us": p99,
    })
}

/// Granary's batch points in `durability` mode, and the single put.
fn granary_batches(o: &TxnBenchOptions, durability: Durability) -> Result<Vec<serde_json::Value>, String> {
    let _ = std::fs::remove_file(&o.path);
    let dev = FileDevice::create(&o.path, o.size_bytes, OpenMode::Direct).map_err(|e| e.to_string())?;
    let create = CreateOptions { grain_bytes: Some(512), ..CreateOptions::default() };
    let open = OpenOptions { durability, checkpoint_interval: None, ..OpenOptions::default() };
    let store = Store::create(Arc::new(dev), &create, &open).map_err(|e| e.to_string())?;
    let ns = store.namespace(granary_store::DEFAULT_NAMESPACE).map_err(|e| e.to_string())?;
    let value = vec![b'v'; BATCH_VALUE_BYTES];
    let mode = if durability == Durability::Flush { "flush" } else { "direct" };
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let (new_keys, mut fresh) = (o.new_keys, 0u64);
    // Inserts take the next unused keys (a batch of n the next n); else a
    // random one of the batch keys (a batch of n the n after it).
    let keys = batch_keys(o);
    let mut next_key = move |n: u64| {
        if new_keys {
            fresh += n;
            return fresh - n;
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % keys
    };
    if !new_keys {
        // Every key written once first, so single puts and batches alike
        // overwrite (a put of a key never written takes no blind
        // overwrite's link and is cheaper).
        for start in (0..keys).step_by(LOAD_BATCH as usize) {
            let mut b = store.batch();
            for k in start..(start + LOAD_BATCH).min(keys) {
                b.put(&ns, &load_key(k), &value);
            }
            b.commit().map_err(|e| e.to_string())?;
        }
    }
    // One put, then each batch size: the points take turns, a slice of
    // `SLICE_SECS` each, until each has had `secs`, so that a drift of the
    // disk's speed during the run weighs on all of them alike.
    let sizes: Vec<usize> = std::iter::once(1).chain(o.batches.iter().copied()).collect();
    let mut hists = Vec::new();
    for _ in &sizes {
        hists.push(hdrhistogram::Histogram::<u64>::new(3).map_err(|e| e.to_string())?);
    }
    let mut spent = vec![0f64; sizes.len()];
    let rounds = (o.secs / SLICE_SECS).ceil().max(1.0) as usize;
    let slice = Duration::from_secs_f64(o.secs / rounds as f64);
    for _ in 0..rounds {
        for (p, &size) in sizes.iter().enumerate() {
            let started = Instant::now();
            let until = started + slice;
            while Instant::now() < until {
                let t = Instant::now();
                if p == 0 {
                    store.put(&load_key(next_key(1)), &value).map_err(|e| e.to_string())?;
                } else {
                    let start = next_key(size as u64);
                    let mut b = store.batch();
                    for i in 0..size as u64 {
                        let k = if new_keys { start + i } else { (start + i) % keys };
                        b.put(&ns, &load_key(k), &value);
                    }
                    match b.commit().map_err(|e| e.to_string())? {
                        BatchOutcome::Committed { .. } => {}
                        o => return Err(format!("batch not committed: {o:?}")),
                    }
                }
                hists[p].record(t.elapsed().as_nanos() as u64).map_err(|e| e.to_string())?;
            }
            spent[p] += started.elapsed().as_secs_f64();
        }
    }
    let mut out = Vec::new();
    for ((&size, h), secs) in sizes.iter().zip(&hists).zip(spent) {
        let what = if out.is_empty() { format!("{mode} put") } else { format!("{mode} batch") };
        let (p50, p99) = (h.value_at_quantile(0.5) as f64 / 1e3, h.value_at_quantile(0.99) as f64 / 1e3);
        out.push(point("granary", &what, size, h.len(), secs, p50, p99));
    }
    drop(store);
    let _ = std::fs::remove_file(&o.path);
    Ok(out)
}

/// The RocksDB peer's points (built from `peers/rocksdb_batch.c`).
fn rocksdb_batches(o: &TxnBenchOptions) -> Result<Vec<serde_json::Value>, String> {
    if std::process::Command::new("sh")
        .args(["-c", "dpkg -s librocksdb-dev >/dev/null 2>&1"])
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        eprintln!("librocksdb-dev not found; installing it with apt-get");
        let ok = std::process::Command::new("sh")
            .args(["-c", "apt-get install -y librocksdb-dev >/dev/null 2>&1 || (apt-get update >/dev/null 2>&1 && apt-get install -y librocksdb-dev >/dev/null 2>&1)"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            return Err("librocksdb-dev is missing and apt-get could not install it (or pass --no-rocksdb)".into());
        }
    }
    let dir = o.path.with_extension("rocksdb");
    let bin = o.path.with_extension("rocksdb-peer");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/peers/rocksdb_batch.c");
    let built = std::process::Command::new("cc")
        .args(["-O2", src, "-lrocksdb", "-o"])
        .arg(&bin)
        .status()
        .map_err(|e| format!("cannot run cc: {e}"))?;
    if !built.success() {
        return Err("the RocksDB peer did not build (cc with -lrocksdb)".into());
    }
    let mut out = Vec::new();
    for &size in &o.batches {
        let _ = std::fs::remove_dir_all(&dir);
        let run = std::process::Command::new(&bin)
            .arg(&dir)
            .args([size.to_string(), BATCH_VALUE_BYTES.to_string(), o.secs.to_string(), batch_keys(o).to_string()])
            .output()
            .map_err(|e| format!("cannot run the RocksDB peer: {e}"))?;
        if !run.status.success() {
            return Err(format!("the RocksDB peer failed: {}", String::from_utf8_lossy(&run.stderr)));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&run.stdout).map_err(|e| format!("the RocksDB peer's output: {e}"))?;
        let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
        out.push(point("rocksdb", "sync batch", size, f("commits") as u64, f("secs"), f("p50_us"), f("p99_us")));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&bin);
    Ok(out)
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
    println!("atomic batches of {BATCH_VALUE_BYTES}-byte puts over {} keys, one commit at a time:", batch_keys(o));
    let mut batches = granary_batches(o, Durability::Flush)?;
    batches.extend(granary_batches(o, Durability::Direct)?);
    if o.rocksdb {
        batches.extend(rocksdb_batches(o)?);
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
        "batches": batches,
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
