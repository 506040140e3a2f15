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
    /// Memcache, RESP and native clients against `granary serve` (store
    /// mode), SIGKILLed and restarted every few seconds; every key checked
    /// against a model of the acknowledged writes after each restart.
    Soak(SoakArgs),
    /// The native protocol over loopback against the embedded engine on
    /// the same store, at several pipeline depths.
    Native(NativeBenchArgs),
    /// A Memcache load generator: `granary serve` against memcached (DRAM)
    /// and memcached with extstore on the same disk, in one run.
    Memcache(MemcacheBenchArgs),
    /// YCSB (go-ycsb's redis binding; workloads A, B, C, F, D; string and
    /// hash records) and redis-benchmark against `granary serve`'s Redis
    /// protocol listener and redis-server (AOF always, everysec, none; and
    /// a data set 4x the memory), in one run.
    Ycsb(YcsbBenchArgs),
    /// fio (ioengine=nbd) against `granary serve`'s NBD export, `nbdkit
    /// file` on a file on the same disk, and fio directly on a file (the
    /// device's limit), in one run: 4 KiB random read and write at queue
    /// depths 1 and 32, 1 MiB sequential read and write; and Granary's
    /// index DRAM per written block.
    Nbd(NbdBenchArgs),
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
    /// Granary's DRAM tier of hot values (its -m), MiB [default: a tenth
    /// of the data set, keys and values].
    #[arg(long)]
    granary_mib: Option<u64>,
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
struct YcsbBenchArgs {
    /// Peers, comma-separated, each started fresh for each datatype:
    /// granary (`serve --no-evict`), granary-flush (and `--flush`),
    /// granary-lru4x (granary in a memory cgroup of a quarter of the data
    /// set and 64 MiB more, its -m half that quarter; needs root), redis-always (appendonly,
    /// appendfsync always), redis-everysec (appendfsync everysec),
    /// redis-none (no persistence), redis-lru4x (no persistence, maxmemory
    /// a quarter of the data set beyond its empty use, allkeys-lru); or
    /// at=IP:PORT, a RESP server already running.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "granary,granary-flush,granary-lru4x,redis-always,redis-everysec,redis-none,redis-lru4x"
    )]
    peers: Vec<String>,
    /// YCSB workloads among a, b, c, d, f, comma-separated; they run in the
    /// order A, B, C, F, D (D inserts). E (range scans) is not offered: the
    /// redis binding has no scan and Granary has no ordered keys.
    #[arg(long, value_delimiter = ',', default_value = "a,b,c,d,f")]
    workloads: Vec<String>,
    /// go-ycsb's redis.datatype: string (a JSON string per record: GET,
    /// SET) and/or hash (HSET, HMGET), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "string,hash")]
    datatypes: Vec<String>,
    /// Records loaded (e.g. 1M).
    #[arg(long, default_value = "100K", value_parser = size::count)]
    records: u64,
    /// Operations per workload.
    #[arg(long, default_value = "100K", value_parser = size::count)]
    operations: u64,
    /// Seconds per workload instead of --operations (go-ycsb is stopped
    /// with SIGINT and prints what it did).
    #[arg(long)]
    secs: Option<f64>,
    /// go-ycsb threads (one connection each).
    #[arg(long, default_value_t = 32)]
    threads: usize,
    /// Fields per record (YCSB's fieldcount).
    #[arg(long, default_value_t = 10)]
    field_count: usize,
    /// Bytes per field (YCSB's fieldlength): 10 x 100 B is YCSB's 1 KiB record.
    #[arg(long, default_value_t = 100)]
    field_bytes: usize,
    /// Keys of workloads A, B, C and F: zipfian (YCSB's), uniform, or file
    /// (go-ycsb's workload files: uniform). D reads the latest records.
    #[arg(long, default_value = "zipfian")]
    distribution: String,
    /// Directory of the data files, server logs and go-ycsb outputs.
    #[arg(long, default_value = "granary-data")]
    dir: PathBuf,
    /// The go-ycsb binary [default: target/go-ycsb/go-ycsb, built by scripts/go-ycsb.sh].
    #[arg(long)]
    go_ycsb: Option<PathBuf>,
    /// go-ycsb's workload files [default: workloads/ beside the binary].
    #[arg(long)]
    workloads_dir: Option<PathBuf>,
    /// The granary binary [default: beside this executable, else GRANARY_BIN, else PATH].
    #[arg(long)]
    granary: Option<PathBuf>,
    /// Size of Granary's data file [default: 4x the data set, records
    /// rounded up to 512 B, at least 256M].
    #[arg(long, value_parser = size::parse)]
    granary_size: Option<u64>,
    /// `granary serve -t` (0: its default, one executor per core).
    #[arg(long, default_value_t = 0)]
    server_threads: usize,
    /// Skip redis-benchmark.
    #[arg(long)]
    no_redis_benchmark: bool,
    /// redis-benchmark's requests per test at -P 1 (-P 16 sends 10x).
    #[arg(long, default_value = "100K", value_parser = size::count)]
    rb_requests: u64,
    /// redis-benchmark's clients.
    #[arg(long, default_value_t = 50)]
    rb_clients: usize,
    /// redis-benchmark's `-r`: keys drawn from this many (0: its own few
    /// keys, every client writing the same one).
    #[arg(long, default_value_t = 0)]
    rb_keyspace: u64,
    /// The peer ratios are taken to (the -lru4x peers': redis-lru4x).
    #[arg(long, default_value = "redis-none")]
    baseline: String,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(clap::Args)]
struct NbdBenchArgs {
    /// Size of the data set: Granary's export (its store is twice that and
    /// 256 MiB more), nbdkit's file and fio's file; a multiple of 1 MiB.
    #[arg(long, default_value = "1G", value_parser = size::parse)]
    size: u64,
    /// Seconds per job.
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    /// Directory of the data files, server logs and fio's JSON (on the disk under test).
    #[arg(long, default_value = "granary-data")]
    dir: PathBuf,
    /// Peers, comma-separated, in the order they run: granary (`serve
    /// --nbd-port`), granary-flush (and `--flush`: fdatasync before each
    /// acknowledgement), nbdkit (`nbdkit file`, cache=none fadvise=random),
    /// file (fio on a file, io_uring, O_DIRECT).
    #[arg(long, value_delimiter = ',', default_value = "granary,nbdkit,file")]
    peers: Vec<String>,
    /// fio jobs, comma-separated, as RW-BS-qdN (RW: read, write, randread,
    /// randwrite); random jobs are compared with nbdkit, sequential ones
    /// with file.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "randread-4k-qd1,randread-4k-qd32,read-1m-qd8,randwrite-4k-qd1,randwrite-4k-qd32,write-1m-qd8"
    )]
    jobs: Vec<String>,
    /// Block size of Granary's export (`granary export create --block-size`):
    /// a power of two from 512 to 64K.
    #[arg(long, default_value = "4096", value_parser = size::parse)]
    block_size: u64,
    /// The granary binary [default: beside this executable, else GRANARY_BIN, else PATH].
    #[arg(long)]
    granary: Option<PathBuf>,
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
    /// Shares of the device filled with live data first (0.05..0.95); each
    /// is a run, e.g. 0.5,0.8,0.9.
    #[arg(long, value_delimiter = ',', default_value = "0.8")]
    util: Vec<f64>,
    /// Keys overwritten: uniform, or zipf (YCSB's scrambled Zipfian).
    #[arg(long, default_value = "uniform")]
    dist: String,
    /// The Zipfian constant of `--dist zipf`.
    #[arg(long, default_value_t = 0.99)]
    zipf_theta: f64,
    /// GC configurations to compare, each a run at every `--util`:
    /// greedy or cost-benefit, each optionally +hot-cold or +sepbit (the
    /// store's default: cost-benefit).
    #[arg(long, value_delimiter = ',', default_value = "greedy,cost-benefit,cost-benefit+hot-cold")]
    gc: Vec<String>,
    /// The burst workload instead: a cache (GC evicts) gets bursts of SETs
    /// between quiet periods; SET latency during bursts, hit ratio and
    /// evictions for each `--watermark` policy.
    #[arg(long)]
    burst: bool,
    /// With --burst: GC low watermark policies to compare (fixed, queue,
    /// doubling, compact).
    #[arg(long, value_delimiter = ',', default_value = "fixed,queue,doubling,compact")]
    watermark: Vec<String>,
    /// With --burst: number of bursts.
    #[arg(long, default_value_t = 20)]
    bursts: u64,
    /// With --burst: device sizes of SETs in each burst.
    #[arg(long, default_value_t = 0.25)]
    burst_share: f64,
    /// With --burst: quiet milliseconds after each burst (GETs paced over it).
    #[arg(long, default_value_t = 500)]
    quiet_ms: u64,
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
    /// Run each configuration on memory and then on the emulated zoned
    /// device (zones of a segment; the store in zoned mode): write
    /// amplification and zone resets per user GB side by side.
    #[arg(long)]
    zoned: bool,
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
        BenchCmd::Churn(a) if a.burst => {
            let marks = a
                .watermark
                .iter()
                .map(|w| {
                    granary_store::Watermark::parse(w)
                        .ok_or(format!("--watermark {w:?}: fixed, queue, doubling or compact"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let o = granary_bench::churn::BurstOptions {
                path: a.path,
                size_bytes: a.size,
                segment_bytes: a.segment_size,
                value_min: a.value_min,
                value_max: a.value_max,
                bursts: a.bursts,
                burst_share: a.burst_share,
                quiet: std::time::Duration::from_millis(a.quiet_ms),
                theta: a.zipf_theta,
                seed: a.seed,
                ..granary_bench::churn::BurstOptions::default()
            };
            let rs = granary_bench::churn::run_burst(&o, &marks)?;
            print!("{}", granary_bench::churn::render_burst(&o, &rs));
            if let Some(path) = a.json {
                write_json(&path, &granary_bench::churn::burst_to_json(&o, &rs))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchCmd::Churn(a) => {
            use granary_bench::churn::{Dist, GcChoice};
            let dist = match a.dist.as_str() {
                "uniform" => Dist::Uniform,
                "zipf" => Dist::Zipf(a.zipf_theta),
                d => return Err(format!("--dist {d:?}: uniform or zipf")),
            };
            let gcs =
                a.gc.iter()
                    .map(|g| {
                        GcChoice::parse(g)
                            .ok_or(format!("--gc {g:?}: greedy or cost-benefit, optionally +hot-cold or +sepbit"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
            if gcs.is_empty() || a.util.is_empty() {
                return Err("--gc and --util need at least one value".into());
            }
            let o = granary_bench::churn::ChurnOptions {
                path: a.path,
                size_bytes: a.size,
                segment_bytes: a.segment_size,
                utilization: a.util[0],
                overwrite: a.overwrite,
                value_min: a.value_min,
                value_max: a.value_max,
                delete_percent: a.delete_percent.min(100),
                seed: a.seed,
                interval: std::time::Duration::from_secs(1),
                progress: true,
                dist,
                gc: gcs[0],
                zoned: a.zoned,
                grain_bytes: None,
            };
            let runs = granary_bench::churn::run_matrix(&o, &a.util, &gcs)?;
            for r in &runs {
                print!("{}", granary_bench::churn::render(&r.options, &r.report));
            }
            print!("\n{}", granary_bench::churn::render_matrix(&runs));
            if let Some(path) = a.json {
                write_json(&path, &granary_bench::churn::matrix_to_json(&runs))?;
            }
            let wrong: u64 = runs.iter().map(|r| r.report.mismatches).sum();
            if wrong > 0 {
                return Err(format!("{wrong} keys read back wrong after the churn"));
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
                granary_mib: a.granary_mib,
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
        BenchCmd::Ycsb(a) => {
            use granary_bench::ycsb::{Datatype, Distribution, YcsbOptions};
            let mut workloads = Vec::new();
            for w in &a.workloads {
                match w.to_ascii_lowercase().as_str() {
                    w @ ("a" | "b" | "c" | "d" | "f") => workloads.push(w.chars().next().unwrap_or('a')),
                    "e" => {
                        return Err("workload E needs ordered range scans: go-ycsb's redis binding has no scan \
                                    and Granary is a hash store (docs/BENCHMARKS.md)"
                            .into())
                    }
                    w => return Err(format!("unknown workload {w:?}: a, b, c, d or f")),
                }
            }
            let datatypes = a.datatypes.iter().map(|d| Datatype::parse(d)).collect::<Result<Vec<_>, _>>()?;
            if workloads.is_empty() || datatypes.is_empty() || a.peers.is_empty() {
                return Err("need at least one peer, workload and datatype".into());
            }
            let threads = a.threads as u64;
            if a.threads == 0 || a.threads > 4096 || a.records < threads.max(2) || a.operations < threads {
                return Err("need 1..=4096 threads, and at least as many records (2 or more) and operations".into());
            }
            if a.secs.is_some_and(|s| !(0.1..=3600.0).contains(&s)) {
                return Err("--secs must be between 0.1 and 3600".into());
            }
            if a.field_count == 0 || a.field_bytes == 0 || a.rb_clients == 0 || a.rb_requests == 0 {
                return Err("--field-count, --field-bytes, --rb-clients and --rb-requests must be positive".into());
            }
            let o = YcsbOptions {
                peers: a.peers,
                workloads,
                datatypes,
                records: a.records,
                operations: a.operations,
                secs: a.secs,
                threads: a.threads,
                field_count: a.field_count,
                field_bytes: a.field_bytes,
                distribution: Distribution::parse(&a.distribution)?,
                dir: a.dir,
                go_ycsb: a.go_ycsb,
                workloads_dir: a.workloads_dir,
                granary: a.granary,
                granary_size: a.granary_size,
                server_threads: a.server_threads,
                redis_benchmark: !a.no_redis_benchmark,
                rb_requests: a.rb_requests,
                rb_clients: a.rb_clients,
                rb_keyspace: a.rb_keyspace,
                baseline: a.baseline,
            };
            let r = granary_bench::ycsb::run(&o)?;
            print!("{}", granary_bench::ycsb::render(&o, &r));
            if let Some(path) = a.json {
                write_json(&path, &granary_bench::ycsb::to_json(&o, &r))?;
            }
            let failed = r.failures();
            if !failed.is_empty() {
                return Err(format!("{} of the runs failed (above)", failed.len()));
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchCmd::Nbd(a) => {
            use granary_bench::nbd::{Job, NbdBenchOptions};
            let o = NbdBenchOptions {
                peers: a.peers,
                jobs: a.jobs.iter().map(|j| Job::parse(j)).collect::<Result<Vec<_>, _>>()?,
                size: a.size,
                secs: a.secs,
                block_size: a.block_size,
                dir: a.dir,
                granary: a.granary,
            };
            o.check()?;
            let r = granary_bench::nbd::run(&o)?;
            print!("{}", granary_bench::nbd::render(&o, &r));
            if let Some(path) = a.json {
                write_json(&path, &granary_bench::nbd::to_json(&o, &r))?;
            }
            let failed = r.failures();
            if !failed.is_empty() {
                return Err(format!("{} of the peers failed (above)", failed.len()));
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
        BenchCmd::Soak(a) => {
            let secs = a.seconds.unwrap_or(a.minutes * 60.0);
            if !(secs > 0.0 && secs.is_finite() && a.kill_every_secs > 0.0) {
                return Err("--minutes/--seconds and --kill-every-secs must be positive".into());
            }
            let granary = match a.granary {
                Some(g) => g,
                None => std::env::current_exe().map_err(|e| e.to_string())?.with_file_name("granary"),
            };
            let seed = a.seed.unwrap_or_else(|| {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
            });
            let o = granary_bench::soak::SoakOptions {
                granary,
                dir: a.dir,
                duration: std::time::Duration::from_secs_f64(secs),
                kill_every: std::time::Duration::from_secs_f64(a.kill_every_secs),
                keys: a.keys,
                seed,
            };
            let r = granary_bench::soak::run(&o).map_err(|e| format!("soak (seed {seed}): {e}"))?;
            println!("{}", serde_json::to_string_pretty(&granary_bench::soak::to_json(&o, &r)).unwrap_or_default());
            print!("{}", granary_bench::soak::render(&o, &r));
            if let Some(path) = a.json {
                write_json(&path, &granary_bench::soak::to_json(&o, &r))?;
            }
            if !r.lost.is_empty() {
                return Err(format!("soak (seed {seed}): acknowledged writes lost or changed:\n{}", r.lost.join("\n")));
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
#[derive(clap::Args)]
struct SoakArgs {
    /// How long to run.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// How long to run, in seconds (overrides --minutes; for short runs).
    #[arg(long)]
    seconds: Option<f64>,
    /// Mean time between SIGKILLs (each seeded within half to 1.5 times it).
    #[arg(long, default_value_t = 10.0)]
    kill_every_secs: f64,
    /// Keys per protocol.
    #[arg(long, default_value_t = 2000)]
    keys: u64,
    /// Where the store file goes (removed at the end).
    #[arg(long, default_value = "granary-soak")]
    dir: PathBuf,
    /// The `granary` binary (default: beside this one).
    #[arg(long)]
    granary: Option<PathBuf>,
    /// The workload's seed (default: from the clock; printed either way).
    #[arg(long)]
    seed: Option<u64>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn write_json(path: &std::path::Path, v: &serde_json::Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(v).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

fn main() -> ExitCode {
    logging::one_line_panics("granary-bench");
    let cli = Cli::parse();
    logging::init(logging::env_json());
    logging::finish("granary-bench", run(cli.cmd))
}
