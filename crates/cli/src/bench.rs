//! `granary-bench`: the benchmarks, each comparing Granary with a peer in
//! the same run (fio, dashmap and hashbrown, memcached and extstore, the
//! embedded engine). A binary of its own so that `granary` links none of
//! the peers; docs/BENCHMARKS.md has the figures and how to read them.

use clap::{Parser, Subcommand};
use granary_cli::{logging, size};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "granary-bench",
    version = env!("CARGO_PKG_VERSION"),
    about = "Granary's benchmarks: each compares Granary with a peer in the same run"
)]
struct Cli {
    #[command(subcommand)]
    cmd: BenchCmd,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// The DRAM index against dashmap and sharded RwLock<hashbrown::HashMap>.
    Index {
        /// Keys to insert and look up (e.g. 50M).
        #[arg(long, default_value = "50M", value_parser = size::count)]
        items: u64,
        /// Thread counts to run, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        threads: Vec<usize>,
        /// Lookup rounds, alternating between the structures; each reports
        /// its median round.
        #[arg(long, default_value_t = granary_bench::index::DEFAULT_ROUNDS)]
        rounds: usize,
        /// Also write the results as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Overwrite a full store many times over; report write amplification
    /// and throughput, and check every key at the end.
    Churn(ChurnArgs),
    /// GET/PUT at queue depths 1..128 on a real file, sync and io_uring
    /// backends, against fio on the same file in the same run.
    Device(DeviceBenchArgs),
    /// The native protocol over loopback against the embedded engine on
    /// the same store, at several pipeline depths.
    Native(NativeBenchArgs),
    /// A Memcache load generator: `granary serve` against memcached (DRAM)
    /// and memcached with extstore on the same disk, in one run.
    Memcache(MemcacheBenchArgs),
    /// Atomic batches of 1..64 puts at queue depth 1 against single puts
    /// and RocksDB's WriteBatch(sync) in the same run; then a namespace of
    /// N keys dropped (its time and IO), GC's sweep of its records, and the
    /// index's DRAM per key in a namespace against the default one.
    Txn {
        /// The data file to create (removed at the end).
        #[arg(long, default_value = "granary-data/bench-txn.db")]
        path: PathBuf,
        /// Keys in the namespace dropped (e.g. 1M).
        #[arg(long, default_value = "1M", value_parser = size::count)]
        keys: u64,
        /// Value size in bytes (of the namespace's keys).
        #[arg(long, default_value_t = 100)]
        value_bytes: usize,
        /// Puts per batch, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
        batches: Vec<usize>,
        /// Seconds per batch point.
        #[arg(long, default_value_t = 3.0)]
        secs: f64,
        /// Skip the RocksDB peer.
        #[arg(long)]
        no_rocksdb: bool,
        /// Insert keys never written before instead of overwriting 100K.
        #[arg(long)]
        new_keys: bool,
        /// Size of the batches' data file (e.g. 2G).
        #[arg(long, default_value = "2G", value_parser = size::parse)]
        size: u64,
        /// Also write the results as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Load N keys, then time a clean restart (checkpoint) and a crash
    /// recovery (full log scan) against fio's sequential read of the file.
    Recovery {
        /// The data file to create (kept for inspection; remove it after).
        #[arg(long, default_value = "granary-data/bench-recovery.db")]
        path: PathBuf,
        /// Keys to load (e.g. 10M).
        #[arg(long, default_value = "10M", value_parser = size::count)]
        keys: u64,
        /// Value size in bytes.
        #[arg(long, default_value_t = 100)]
        value_bytes: usize,
        /// Grain size (512 or 4096).
        #[arg(long, default_value_t = 512)]
        grain: u32,
        /// Loader threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Skip the fio reference run.
        #[arg(long)]
        no_fio: bool,
        /// Also write the results as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct MemcacheBenchArgs {
    /// Peers, comma-separated: granary, memcached, extstore,
    /// extstore-capped (extstore in a memory cgroup of --memory-mib + 64 MiB,
    /// its page cache included; needs root) (each started for the run), or
    /// at=IP:PORT for a server already running.
    #[arg(long, value_delimiter = ',', default_value = "memcached,extstore,granary")]
    peers: Vec<String>,
    /// Client connections (one thread each).
    #[arg(long, default_value_t = 32)]
    conns: usize,
    /// Distinct keys (all loaded first).
    #[arg(long, default_value = "200K", value_parser = size::count)]
    keys: u64,
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    /// Percent of requests that are GETs (the rest are SETs).
    #[arg(long, default_value_t = 90)]
    get_percent: u32,
    /// Key distribution: uniform, or zipf (exponent 0.99).
    #[arg(long, default_value = "uniform")]
    dist: String,
    /// Seconds of measured load per peer.
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    /// Open loop at this many requests per second in all (default: closed loop).
    #[arg(long)]
    rate: Option<f64>,
    /// Memory of memcached and of memcached+extstore, MiB.
    #[arg(long, default_value_t = 1024)]
    memory_mib: u64,
    /// Size of Granary's data file and of extstore's file.
    #[arg(long, default_value = "4G", value_parser = size::parse)]
    disk: u64,
    /// Directory of the data files (on the disk under test).
    #[arg(long, default_value = "granary-data")]
    dir: PathBuf,
    /// Threads of every server.
    #[arg(long, default_value_t = 2)]
    server_threads: usize,
    /// Skip memcaslap.
    #[arg(long)]
    no_memcaslap: bool,
    /// Skip the device reference (fio's machine CPU per 4 KiB direct read,
    /// and the throughput ceiling it puts on a server that reads the device
    /// for every GET).
    #[arg(long)]
    no_device_ref: bool,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(clap::Args)]
struct DeviceBenchArgs {
    /// The data file to create (removed afterwards).
    #[arg(long, default_value = "granary-data/bench-device.db")]
    path: PathBuf,
    /// Its size.
    #[arg(long, default_value = "4G", value_parser = size::parse)]
    size: u64,
    /// Keys to load before measuring.
    #[arg(long, default_value = "200K", value_parser = size::count)]
    keys: u64,
    /// Value size in bytes (4000: value, key and header fill one 4 KiB
    /// block, the IO size fio uses).
    #[arg(long, default_value_t = 4000)]
    value_bytes: usize,
    /// Grain size of the store (512 or 4096; on ext4, writes smaller than
    /// the filesystem block are serialized by the kernel).
    #[arg(long, default_value_t = 4096)]
    grain: u32,
    /// Queue depths, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64,128")]
    depths: Vec<usize>,
    /// Seconds per measured point.
    #[arg(long, default_value_t = 2.0)]
    secs: f64,
    /// Backends to measure: sync, uring, uring-zc (the zero-copy API), mem.
    #[arg(long, value_delimiter = ',', default_value = "sync,uring,uring-zc,mem")]
    backends: Vec<String>,
    /// Executors (cores) for the uring backend.
    #[arg(long, default_value_t = 1)]
    cores: usize,
    /// Set up the executors' rings with IORING_SETUP_DEFER_TASKRUN.
    #[arg(long)]
    defer_taskrun: bool,
    /// Microseconds an idle executor polls before sleeping in the kernel.
    #[arg(long, default_value_t = 20)]
    spin_us: u64,
    /// Microseconds an executor polls before sleeping while file IO it
    /// submitted is in flight.
    #[arg(long, default_value_t = granary_rt::SPIN_IO_US_DEFAULT)]
    spin_io_us: u64,
    /// Do not register the buffer arena with the rings (plain reads and
    /// writes instead of READ_FIXED/WRITE_FIXED).
    #[arg(long)]
    no_fixed_buffers: bool,
    /// Skip fio (no reference, no ratios).
    #[arg(long)]
    no_fio: bool,
    /// PUT points write keys not in the store yet (inserts, no old version
    /// to read) instead of overwriting loaded keys; they stay, so size the
    /// file for them.
    #[arg(long)]
    new_keys: bool,
    /// DRAM for blind overwrites in every store (e.g. 64M; 0 = off)
    /// [default: the store's: 64M on the file, off on the in-memory device].
    #[arg(long = "blind-overwrite-mem", value_parser = size::parse)]
    blind_overwrite_mem: Option<u64>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(clap::Args)]
struct NativeBenchArgs {
    /// The data file to create (removed afterwards).
    #[arg(long, default_value = "granary-data/bench-native.db")]
    path: PathBuf,
    /// Its size.
    #[arg(long, default_value = "2G", value_parser = size::parse)]
    size: u64,
    /// Keys to load before measuring.
    #[arg(long, default_value = "100K", value_parser = size::count)]
    keys: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 1000)]
    value_bytes: usize,
    /// Pipeline depths (requests in flight on the one connection), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    depths: Vec<usize>,
    /// Seconds per measured point.
    #[arg(long, default_value_t = 2.0)]
    secs: f64,
    /// Executors serving the embedded tasks and the server.
    #[arg(long, default_value_t = 1)]
    cores: usize,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(clap::Args)]
struct ChurnArgs {
    /// A new file to run on (created, removed afterwards); default: memory.
    #[arg(long)]
    path: Option<PathBuf>,
    /// Device size.
    #[arg(long, default_value = "64M", value_parser = size::parse)]
    size: u64,
    /// Segment size.
    #[arg(long, default_value = "1M", value_parser = size::parse)]
    segment_size: u64,
    /// Share of the device filled with live data first (0.05..0.95).
    #[arg(long, default_value_t = 0.8)]
    util: f64,
    /// Device sizes of user data to write during the churn.
    #[arg(long, default_value_t = 10.0)]
    overwrite: f64,
    /// Smallest and largest value, in bytes.
    #[arg(long, default_value_t = 100)]
    value_min: usize,
    #[arg(long, default_value_t = 16000)]
    value_max: usize,
    /// Percent of churn operations that are deletes.
    #[arg(long, default_value_t = 10)]
    delete_percent: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn run(cmd: BenchCmd) -> Result<ExitCode, String> {
    match cmd {
        BenchCmd::Index { items, threads, rounds, json } => {
            if threads.is_empty() || threads.contains(&0) {
                return Err("--threads needs positive thread counts, e.g. 1,2".into());
            }
            if rounds == 0 {
                return Err("--rounds needs at least one round".into());
            }
            let opts = granary_bench::index::IndexBenchOptions {
                items,
                threads,
                rounds,
                settle: granary_bench::index::SETTLE_LIMIT,
                progress: true,
            };
            let results = granary_bench::index::run(&opts);
            print!("{}", granary_bench::index::render(&results));
            if let Some(path) = json {
                write_json(&path, &granary_bench::index::to_json(&opts, &results))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchCmd::Churn(a) => {
            let o = granary_bench::churn::ChurnOptions {
                path: a.path,
                size_bytes: a.size,
                segment_bytes: a.segment_size,
                utilization: a.util,
                overwrite: a.overwrite,
                value_min: a.value_min,
                value_max: a.value_max,
                delete_percent: a.delete_percent.min(100),
                seed: a.seed,
                interval: std::time::Duration::from_secs(1),
                progress: true,
            };
            let r = granary_bench::churn::run(&o)?;
            print!("{}", granary_bench::churn::render(&o, &r));
            if let Some(path) = a.json {
                write_json(&path, &granary_bench::churn::to_json(&o, &r))?;
            }
            if r.mismatches > 0 {
                return Err(format!("{} keys read back wrong after the churn", r.mismatches));
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchCmd::Memcache(a) => {
            use granary_bench::memcache::{KeyDist, McBenchOptions};
            let dist = match a.dist.as_str() {
                "uniform" => KeyDist::Uniform,
                "zipf" => KeyDist::Zipf(0.99),
                d => return Err(format!("unknown --dist {d:?}: uniform or zipf")),
            };
            if a.conns == 0 || a.conns > 4096 || a.keys == 0 || a.get_percent > 100 || a.secs.is_nan() || a.secs <= 0.0
            {
                return Err("need 1..=4096 connections, at least one key, --get-percent 0..=100, --secs > 0".into());
            }
            let o = McBenchOptions {
                peers: a.peers,
                conns: a.conns,
                keys: a.keys,
                value_bytes: a.value_bytes,
                get_percent: a.get_percent,
                dist,
                secs: a.secs,
                rate: a.rate.filter(|r| *r > 0.0),
                memory_mib: a.memory_mib,
                disk_bytes: a.disk,
                dir: a.dir,
                server_threads: a.server_threads,
                memcaslap: !a.no_memcaslap,
                device_ref: !a.no_device_ref,
                seed: 1,
            };
            let r = granary_bench::memcache::run(&o)?;
            print!("{}", granary_bench::memcache::render(&o, &r));
            if let Some(path) = a.json {
                write_json(&path, &granary_bench::memcache::to_json(&o, &r))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchCmd::Recovery { path, keys, value_bytes, grain, threads, no_fio, json } => {
            if ![512, 4096].contains(&grain) {
                return Err("--grain must be 512 or 4096".into());
            }
            let o = granary_bench::recovery::RecoveryBenchOptions {
                path,
                keys,
                value_bytes,
                grain,
                threads: threads.clamp(1, 64),
                fio: !no_fio,
            };
            let v = granary_bench::recovery::run(&o)?;
            if let Some(path) = json {
                write_json(&path, &v)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchCmd::Txn { path, keys, value_bytes, batches, secs, no_rocksdb, new_keys, size, json } => {
            if batches.is_empty() || batches.iter().any(|&b| b == 0 || b > granary_store::BATCH_OPS_MAX) {
                return Err(format!("--batches needs sizes from 1 to {}", granary_store::BATCH_OPS_MAX));
            }
            if !(0.1..=600.0).contains(&secs) {
                return Err("--secs must be between 0.1 and 600".into());
            }
            let o = granary_bench::txn::TxnBenchOptions {
                path,
                keys: keys.max(1),
                value_bytes,
                batches,
                secs,
                rocksdb: !no_rocksdb,
                new_keys,
                size_bytes: size,
            };
            let v = granary_bench::txn::run(&o)?;
            if let Some(path) = json {
                write_json(&path, &v)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchCmd::Native(a) => {
            if a.depths.is_empty() || a.depths.contains(&0) || a.depths.iter().any(|&d| d > 1024) {
                return Err("--depths needs pipeline depths between 1 and 1024, e.g. 1,16,64".into());
            }
            if !(0.1..=600.0).contains(&a.secs) {
                return Err("--secs must be between 0.1 and 600".into());
            }
            let o = granary_bench::native::NativeBenchOptions {
                path: a.path,
                size_bytes: a.size,
                keys: a.keys,
                value_bytes: a.value_bytes,
                depths: a.depths,
                secs: a.secs,
                cores: a.cores.max(1),
                ..Default::default()
            };
            let r = granary_bench::native::run(&o)?;
            print!("{}", granary_bench::native::render(&o, &r));
            if let Some(path) = a.json {
                write_json(&path, &granary_bench::native::to_json(&o, &r))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchCmd::Device(a) => {
            if a.depths.is_empty() || a.depths.contains(&0) || a.depths.iter().any(|&d| d > 1024) {
                return Err("--depths needs queue depths between 1 and 1024, e.g. 1,8,128".into());
            }
            if let Some(b) = a.backends.iter().find(|b| !matches!(b.as_str(), "sync" | "uring" | "uring-zc" | "mem")) {
                return Err(format!("unknown backend {b:?}: choose among sync, uring, uring-zc, mem"));
            }
            if !(0.1..=600.0).contains(&a.secs) {
                return Err("--secs must be between 0.1 and 600".into());
            }
            let o = granary_bench::device::DeviceBenchOptions {
                path: a.path,
                size_bytes: a.size,
                keys: a.keys,
                value_bytes: a.value_bytes,
                grain_bytes: a.grain,
                depths: a.depths,
                secs: a.secs,
                backends: a.backends,
                cores: a.cores.max(1),
                defer_taskrun: a.defer_taskrun,
                spin: std::time::Duration::from_micros(a.spin_us.min(1_000_000)),
                spin_io: std::time::Duration::from_micros(a.spin_io_us.min(1_000_000)),
                registered_buffers: !a.no_fixed_buffers,
                fio: !a.no_fio,
                new_keys: a.new_keys,
                blind_overwrite_bytes: a.blind_overwrite_mem.map(|b| usize::try_from(b).unwrap_or(usize::MAX)),
                ..Default::default()
            };
            let r = granary_bench::device::run(&o)?;
            print!("{}", granary_bench::device::render(&o, &r));
            if let Some(path) = a.json {
                write_json(&path, &granary_bench::device::to_json(&o, &r))?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Write a benchmark's JSON result and say where.
fn write_json(path: &std::path::Path, v: &serde_json::Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(v).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

fn main() -> ExitCode {
    logging::one_line_panics("granary-bench");
    let cli = Cli::parse();
    logging::init(std::env::var("GRANARY_LOG_FORMAT").is_ok_and(|v| v == "json"));
    logging::finish("granary-bench", run(cli.cmd))
}
