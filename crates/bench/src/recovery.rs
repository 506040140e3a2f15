//! `granary-bench recovery`: how fast a store comes back.
//!
//! Loads N keys (default 10 M, small values) into a store in a file, then
//! measures, with direct IO:
//!
//! - a background (fuzzy) checkpoint of the loaded index;
//! - a **clean restart**: open after a clean close (checkpoint load, no log
//!   replay; the store checks that nothing was written after the checkpoint);
//! - a **crash recovery**: open without using the checkpoint, i.e. a full
//!   parallel scan of the log, the worst case after a crash;
//!
//! and in the same run `fio` reads the same file sequentially (direct,
//! io_uring, 1 MiB blocks, depth 16): the scan rate is reported as a
//! fraction of that bandwidth.
//!
//! The load goes through the page cache (O_DIRECT writes smaller than the
//! filesystem block are serialised by ext4, see docs/BENCHMARKS-HISTORY.md) and is
//! synced before the measurements, which all use direct IO.

use granary_store::io::{FileDevice, OpenMode};
use granary_store::loadgen::{load_key, load_value};
use granary_store::{CreateOptions, OpenOptions, Store};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct RecoveryBenchOptions {
    pub path: PathBuf,
    pub keys: u64,
    pub value_bytes: usize,
    pub grain: u32,
    /// Loader threads.
    pub threads: usize,
    /// Run fio for the sequential-read reference.
    pub fio: bool,
}

impl Default for RecoveryBenchOptions {
    fn default() -> Self {
        RecoveryBenchOptions {
            path: PathBuf::from("granary-data/bench-recovery.db"),
            keys: 10_000_000,
            value_bytes: 100,
            grain: 512,
            threads: 2,
            fio: true,
        }
    }
}

fn open_opts() -> OpenOptions {
    OpenOptions { checkpoint_interval: None, checkpoint_on_close: false, ..OpenOptions::default() }
}

/// Run the benchmark; prints a human summary to stdout and returns the JSON.
pub fn run(o: &RecoveryBenchOptions) -> Result<serde_json::Value, String> {
    if let Some(parent) = o.path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    let _ = std::fs::remove_file(&o.path);
    let g = o.grain as u64;
    let record = granary_format::limits::record_bytes(16, o.value_bytes as u64);
    let per_key = granary_format::limits::grains_for(record, o.grain) * g;
    // Room for the data, two checkpoints (16 B a key each) and slack.
    let size = ((o.keys * (per_key + 40)) * 5 / 4 + (256 << 20)).next_multiple_of(1 << 20);
    let create = CreateOptions { grain_bytes: Some(o.grain), ..CreateOptions::default() };

    // Load through the page cache, then sync.
    let started = Instant::now();
    let dev = FileDevice::create(&o.path, size, OpenMode::Buffered).map_err(|e| e.to_string())?;
    let store = Store::create(Arc::new(dev), &create, &open_opts()).map_err(|e| e.to_string())?;
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    std::thread::scope(|s| -> Result<(), String> {
        let hs: Vec<_> = (0..o.threads.max(1))
            .map(|_| {
                s.spawn(|| -> Result<(), String> {
                    loop {
                        let start = next.fetch_add(1024, Relaxed);
                        if start >= o.keys {
                            return Ok(());
                        }
                        for i in start..(start + 1024).min(o.keys) {
                            store.put(&load_key(i), &load_value(i, 1, o.value_bytes)).map_err(|e| e.to_string())?;
                        }
                        done.fetch_add((start + 1024).min(o.keys) - start, Relaxed);
                    }
                })
            })
            .collect();
        let progress = crate::progress::Progress::new("bench recovery: loading keys", o.keys, true);
        while hs.iter().any(|h| !h.is_finished()) {
            std::thread::sleep(std::time::Duration::from_millis(100));
            progress.inc(done.load(Relaxed) - progress.done());
        }
        progress.inc(done.load(Relaxed) - progress.done());
        progress.finish();
        for h in hs {
            h.join().map_err(|_| "a loader thread panicked".to_string())??;
        }
        Ok(())
    })?;
    let load_secs = started.elapsed().as_secs_f64();
    let t = Instant::now();
    let ck = store.checkpoint().map_err(|e| format!("checkpoint: {e}"))?;
    let checkpoint_secs = t.elapsed().as_secs_f64();
    let data_bytes = store.stats().segments_closed * store.stats().segment_bytes;
    drop(store); // leaves the checkpoint above in place; the log after it is empty
    {
        // A clean close: reopen and close with a checkpoint, synced.
        let dev = FileDevice::open(&o.path, OpenMode::Buffered).map_err(|e| e.to_string())?;
        let opts = OpenOptions { checkpoint_on_close: true, ..open_opts() };
        Store::open(Arc::new(dev), &opts).and_then(|s| s.close()).map_err(|e| e.to_string())?;
    }
    eprintln!("bench recovery: loaded {} keys in {load_secs:.1} s; measuring restarts", o.keys);

    let open_direct = |opts: &OpenOptions| -> Result<(f64, granary_store::Stats), String> {
        let t = Instant::now();
        let s = Store::open_path(&o.path, OpenMode::Direct, opts).map_err(|e| e.to_string())?;
        let secs = t.elapsed().as_secs_f64();
        let st = s.stats();
        drop(s);
        Ok((secs, st))
    };
    let (clean_secs, clean) = open_direct(&open_opts())?;
    if !clean.recovery.clean_shutdown || clean.keys != o.keys {
        return Err(format!(
            "clean restart did not come back clean: clean_shutdown={} keys={} (want {})",
            clean.recovery.clean_shutdown, clean.keys, o.keys
        ));
    }
    let (scan_secs, scan) = open_direct(&OpenOptions { use_checkpoint: false, ..open_opts() })?;
    if scan.keys != o.keys {
        return Err(format!("log scan found {} keys, want {}", scan.keys, o.keys));
    }
    let scan_mb_s = scan.recovery.scan_mb_per_s();
    let fio_mb_s = if o.fio { Some(fio_seq_read(&o.path, data_bytes.max(1 << 30).min(size))?) } else { None };
    let ratio = fio_mb_s.map(|f| scan_mb_s / f);
    println!(
        "bench recovery: {} keys of {} B values, {}-byte grains, {}",
        o.keys,
        o.value_bytes,
        o.grain,
        o.path.display()
    );
    println!(
        "  load                {load_secs:8.2} s  ({:.0} keys/s, through the page cache)",
        o.keys as f64 / load_secs
    );
    println!(
        "  checkpoint          {checkpoint_secs:8.2} s  ({} entries, {:.0} MB)",
        ck.last_entries,
        ck.last_bytes as f64 / 1e6
    );
    println!(
        "  clean restart       {clean_secs:8.2} s  (checkpoint load {} ms, {} threads)",
        clean.recovery.checkpoint_millis, clean.recovery.threads
    );
    println!(
        "  crash recovery scan {scan_secs:8.2} s  ({:.0} MB scanned at {scan_mb_s:.0} MB/s, {} threads)",
        scan.recovery.bytes_read as f64 / 1e6,
        scan.recovery.threads
    );
    match (fio_mb_s, ratio) {
        (Some(f), Some(r)) => println!("  fio sequential read         {f:.0} MB/s; scan / fio = {r:.2}"),
        _ => println!("  fio skipped"),
    }
    Ok(serde_json::json!({
        "keys": o.keys,
        "value_bytes": o.value_bytes,
        "grain_bytes": o.grain,
        "device_bytes": size,
        "load_secs": load_secs,
        "checkpoint_secs": checkpoint_secs,
        "checkpoint_bytes": ck.last_bytes,
        "clean_restart_secs": clean_secs,
        "clean_restart_checkpoint_millis": clean.recovery.checkpoint_millis,
        "crash_recovery_secs": scan_secs,
        "scan_bytes": scan.recovery.bytes_read,
        "scan_mb_per_s": scan_mb_s,
        "recovery_threads": scan.recovery.threads,
        "fio_seq_read_mb_per_s": fio_mb_s,
        "scan_to_fio": ratio,
    }))
}

/// fio's sequential read bandwidth (MB/s) over the first `bytes` of `path`.
fn fio_seq_read(path: &Path, bytes: u64) -> Result<f64, String> {
    crate::device::ensure_fio()?;
    let v = crate::device::fio_json(
        path,
        &[
            "--name=granary-seqread",
            "--rw=read",
            "--bs=1M",
            "--iodepth=16",
            "--readonly",
            &format!("--size={bytes}"),
            "--runtime=5",
            "--time_based",
        ],
    )?;
    Ok(v["jobs"][0]["read"]["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6)
}
