//! The `granary` command line: create, put, get, del, stat and verify on a
//! store in a file or block device; get, put and del also on a server
//! (`--server HOST:PORT`, the native protocol); serve; benchmarks.
//!
//! Exit codes: 0 success; 1 the key is absent (`get`, `del`) or `verify`
//! found problems; 2 an error (bad arguments, IO, corruption), printed as one
//! line on stderr.

mod metrics;
mod serve;
mod size;

use clap::{Parser, Subcommand, ValueEnum};
use granary_store::io::OpenMode;
use granary_store::{CreateOptions, Durability, OpenOptions, ProgressHook, PutMode, PutOutcome, Stats, Store};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;

/// `granary --version`: the crate version and the git commit built from.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (git ", env!("GRANARY_GIT_HASH"), ")");

#[derive(Parser)]
#[command(name = "granary", version = VERSION, about = "Granary: a key-value store and cache for NVMe SSDs")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct DeviceArgs {
    /// Store file or block device.
    path: PathBuf,
    /// Use the page cache instead of direct IO (for filesystems without O_DIRECT).
    #[arg(long)]
    buffered: bool,
    /// Ignore index checkpoints on open: rebuild the index by scanning the whole log.
    #[arg(long)]
    no_checkpoint: bool,
}

/// Where `get`, `put` and `del` go: a local store (PATH, the first
/// positional argument) or a server's native protocol port.
#[derive(clap::Args, Clone)]
struct TargetArgs {
    /// A server's native protocol address (HOST:PORT, default port 43345).
    #[arg(long, value_name = "HOST:PORT")]
    server: Option<String>,
    /// Request timeout in milliseconds with --server.
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
    /// Use the page cache instead of direct IO (local store only).
    #[arg(long)]
    buffered: bool,
    /// Ignore index checkpoints on open (local store only).
    #[arg(long)]
    no_checkpoint: bool,
}

/// A resolved target.
enum Target {
    Local(DeviceArgs),
    Remote(granary_client::Client),
}

impl TargetArgs {
    /// Split ARGS into the target and the rest (`want` = how many follow
    /// PATH: at least `min`).
    fn resolve(
        self,
        mut args: Vec<std::ffi::OsString>,
        min: usize,
        max: usize,
    ) -> Result<(Target, Vec<std::ffi::OsString>), String> {
        let usage = |form: &str| format!("expected {form}");
        match self.server {
            Some(s) => {
                if args.len() < min || args.len() > max {
                    return Err(usage("KEY [VALUE] after --server HOST:PORT"));
                }
                if self.buffered || self.no_checkpoint {
                    return Err("--buffered and --no-checkpoint apply to a local store, not --server".into());
                }
                let addr = if s.contains(':') { s.clone() } else { format!("{s}:{}", granary_proto::DEFAULT_PORT) };
                let cfg = granary_client::ClientConfig {
                    timeout: std::time::Duration::from_millis(self.timeout_ms.max(1)),
                    connections: 1,
                };
                let c = granary_client::Client::connect(addr.as_str(), cfg).map_err(|e| format!("{addr}: {e}"))?;
                Ok((Target::Remote(c), args))
            }
            None => {
                if args.len() < min + 1 || args.len() > max + 1 {
                    return Err(usage("PATH KEY [VALUE] (or --server HOST:PORT KEY [VALUE])"));
                }
                let path = PathBuf::from(args.remove(0));
                Ok((
                    Target::Local(DeviceArgs { path, buffered: self.buffered, no_checkpoint: self.no_checkpoint }),
                    args,
                ))
            }
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a store in a new file (preallocated), on a block device, or on a
    /// RAID-0 stripe set (PATH a comma-separated list of files or devices).
    Create {
        #[command(flatten)]
        dev: DeviceArgs,
        /// Size of a new file, e.g. 1G, 512MiB (ignored for block devices).
        #[arg(long, value_parser = size::parse)]
        size: Option<u64>,
        /// Segment size, a power of two (default: 1/64 of the device, 1 MiB..1 GiB).
        #[arg(long, value_parser = size::parse)]
        segment_size: Option<u64>,
        /// Grain size in bytes: 512 or 4096 (default: the device's block size).
        #[arg(long)]
        grain: Option<u32>,
        /// Stripe unit of a stripe set, a power of two of at least 4 KiB
        /// (default: 128 KiB).
        #[arg(long, value_parser = size::parse)]
        stripe_size: Option<u64>,
        /// Succeed without changes if PATH already holds a Granary store.
        #[arg(long)]
        if_absent: bool,
    },
    /// Store a value: from the argument, or from stdin when absent or "-".
    /// `granary put PATH KEY [VALUE]`, or `granary put --server HOST:PORT KEY [VALUE]`.
    Put {
        #[command(flatten)]
        target: TargetArgs,
        /// [PATH] KEY [VALUE]: PATH only without --server.
        #[arg(value_name = "ARGS", required = true, num_args = 1..=3)]
        args: Vec<std::ffi::OsString>,
        /// upsert (default), add (only if absent) or replace (only if present).
        #[arg(long, value_enum, default_value = "upsert")]
        mode: Mode,
        /// fdatasync after the write (survives power loss on drives without PLP; local only).
        #[arg(long)]
        flush: bool,
    },
    /// Print a value to stdout; exit 1 if the key is absent.
    /// `granary get PATH KEY`, or `granary get --server HOST:PORT KEY`.
    Get {
        #[command(flatten)]
        target: TargetArgs,
        /// [PATH] KEY: PATH only without --server.
        #[arg(value_name = "ARGS", required = true, num_args = 1..=2)]
        args: Vec<std::ffi::OsString>,
    },
    /// Delete a key; exit 1 if it was absent.
    /// `granary del PATH KEY`, or `granary del --server HOST:PORT KEY`.
    Del {
        #[command(flatten)]
        target: TargetArgs,
        /// [PATH] KEY: PATH only without --server.
        #[arg(value_name = "ARGS", required = true, num_args = 1..=2)]
        args: Vec<std::ffi::OsString>,
        /// fdatasync after the write (local only).
        #[arg(long)]
        flush: bool,
    },
    /// Print geometry, space, index and recovery figures.
    Stat {
        #[command(flatten)]
        dev: DeviceArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check every record and the index; exit 1 if anything is wrong.
    Verify {
        #[command(flatten)]
        dev: DeviceArgs,
    },
    /// Write generated keys: key-<i> gets a value naming i and the round
    /// (for drills and benchmarks). With --ack, each acknowledged write is
    /// printed to stdout as "<round> <i>" once it is on the device.
    Load {
        #[command(flatten)]
        dev: DeviceArgs,
        /// Keys per round (e.g. 100K).
        #[arg(long, default_value = "100K", value_parser = parse_count)]
        keys: u64,
        /// Value size in bytes.
        #[arg(long, default_value_t = 100)]
        value_bytes: usize,
        /// Rounds: each overwrites every key with the round's value.
        #[arg(long, default_value_t = 1)]
        rounds: u64,
        /// Number of the first round.
        #[arg(long, default_value_t = 1)]
        first_round: u64,
        /// Print "<round> <i>" to stdout after each acknowledged write.
        #[arg(long)]
        ack: bool,
        /// fdatasync every write (survives power loss on drives without PLP).
        #[arg(long)]
        flush: bool,
        /// Background index checkpoint every this many milliseconds (0: only at the end).
        #[arg(long, default_value_t = 60_000)]
        checkpoint_ms: u64,
    },
    /// Serve a store over the Memcache protocol (text and meta commands)
    /// until SIGTERM/SIGINT; a missing data file is created.
    Serve(serve::ServeArgs),
    /// Benchmarks that compare Granary with a peer in the same run.
    #[command(subcommand)]
    Bench(BenchCmd),
}

#[derive(Subcommand)]
enum BenchCmd {
    /// The DRAM index against dashmap and sharded RwLock<hashbrown::HashMap>.
    Index {
        /// Keys to insert and look up (e.g. 50M).
        #[arg(long, default_value = "50M", value_parser = parse_count)]
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
    /// Load N keys, then time a clean restart (checkpoint) and a crash
    /// recovery (full log scan) against fio's sequential read of the file.
    Recovery {
        /// The data file to create (kept for inspection; remove it after).
        #[arg(long, default_value = "granary-data/bench-recovery.db")]
        path: PathBuf,
        /// Keys to load (e.g. 10M).
        #[arg(long, default_value = "10M", value_parser = parse_count)]
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
    #[arg(long, default_value = "200K", value_parser = parse_count)]
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
    #[arg(long, default_value = "200K", value_parser = parse_count)]
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
    #[arg(long, default_value = "100K", value_parser = parse_count)]
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

/// A count with an optional decimal suffix: 50M = 50,000,000.
fn parse_count(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.trim().to_ascii_uppercase().as_str() {
        t if t.ends_with('K') => (t[..t.len() - 1].to_string(), 1_000),
        t if t.ends_with('M') => (t[..t.len() - 1].to_string(), 1_000_000),
        t if t.ends_with('G') => (t[..t.len() - 1].to_string(), 1_000_000_000),
        t => (t.to_string(), 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a count (examples: 1000, 50M)"))?;
    match n.checked_mul(mult) {
        Some(v) if v > 0 => Ok(v),
        _ => Err(format!("count {s:?} is out of range")),
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    Upsert,
    Add,
    Replace,
}

fn mode(buffered: bool) -> OpenMode {
    if buffered {
        OpenMode::Buffered
    } else {
        OpenMode::Direct
    }
}

/// Open for writing (`flush`: durability mode; GC runs so a full store can
/// make room) or, with `read_only`, without GC (reads must not set off
/// background writes).
fn open_store(dev: &DeviceArgs, flush: bool, read_only: bool) -> Result<Store, String> {
    let durability = if flush { Durability::Flush } else { Durability::Direct };
    let mut opts = OpenOptions {
        durability,
        gc: !read_only,
        progress: progress_bar(),
        use_checkpoint: !dev.no_checkpoint,
        ..OpenOptions::default()
    };
    if read_only {
        // Reads write no checkpoints (recovery may still clear torn records).
        opts.checkpoint_interval = None;
        opts.checkpoint_on_close = false;
    }
    Store::open_path(&dev.path, mode(dev.buffered), &opts).map_err(|e| e.to_string())
}

/// A progress bar for recovery's log scan when stderr is a terminal (logs
/// report progress otherwise). Drawn only once the scan has taken a moment.
fn progress_bar() -> Option<ProgressHook> {
    progress_bar_for("recovering", true)
}

/// Block SIGTERM and SIGINT in this thread (and every thread started
/// after): `granary serve` receives them with `sigwait`, and the zero fill
/// of a new file ([`fill_progress`]) stops when one is pending.
pub(crate) fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use;
    // pthread_sigmask only reads the set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// SIGTERM or SIGINT when one is pending (blocked by
/// [`block_stop_signals`] and not yet received).
fn pending_stop_signal() -> Option<&'static str> {
    // SAFETY: sigpending fills the set it is given; sigismember reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        if libc::sigpending(&mut set) != 0 {
            return None;
        }
        if libc::sigismember(&set, libc::SIGTERM) == 1 {
            Some("SIGTERM")
        } else if libc::sigismember(&set, libc::SIGINT) == 1 {
            Some("SIGINT")
        } else {
            None
        }
    }
}

/// Progress of a new file's zero fill (`FileDevice::create_with_progress`):
/// a bar on a terminal, else a log line at the start, every few seconds and
/// at the end. A pending SIGTERM or SIGINT (blocked by the caller with
/// [`block_stop_signals`]) stops the fill with an error; the creation then
/// removes the file, so an interrupted start leaves nothing behind.
pub(crate) fn fill_progress() -> impl Fn(u64, u64) -> std::io::Result<()> {
    let bar = progress_bar_for("writing zeros", true);
    let started = std::time::Instant::now();
    let logged = std::cell::Cell::new(0u64);
    move |done, total| {
        if let Some(sig) = pending_stop_signal() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Interrupted,
                format!(
                    "creation stopped by {sig} while writing zeros over the new file ({} of {} MiB); \
                     the file is removed",
                    done >> 20,
                    total >> 20
                ),
            ));
        }
        if let Some(b) = &bar {
            (b.0)(done, total);
            return Ok(());
        }
        let secs = started.elapsed().as_secs();
        if done == 0 || (done >= total && secs >= 1) || secs >= logged.get() + 5 {
            logged.set(secs);
            tracing::info!(done, total, secs, "writing zeros over the new data file (once, so that no write waits for ext4 to convert a preallocated extent)");
        }
        Ok(())
    }
}

/// A progress bar labelled `label` when stderr is a terminal, drawn once
/// the work has taken half a second; units are bytes or plain steps.
fn progress_bar_for(label: &'static str, bytes: bool) -> Option<ProgressHook> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let started = std::time::Instant::now();
    let bar: std::sync::Mutex<Option<indicatif::ProgressBar>> = std::sync::Mutex::new(None);
    Some(ProgressHook(std::sync::Arc::new(move |done, total| {
        let mut b = bar.lock().unwrap_or_else(|e| e.into_inner());
        if b.is_none() && started.elapsed().as_millis() >= 500 && done < total {
            let pb = indicatif::ProgressBar::new(total);
            let template = if bytes {
                format!("{label} {{bar:40}} {{bytes}}/{{total_bytes}} {{bytes_per_sec}} eta {{eta}}")
            } else {
                format!("{label} {{bar:40}} {{pos}}/{{len}} eta {{eta}}")
            };
            if let Ok(style) = indicatif::ProgressStyle::with_template(&template) {
                pb.set_style(style);
            }
            *b = Some(pb);
        }
        if let Some(pb) = b.as_ref() {
            pb.set_position(done);
            if done >= total {
                pb.finish_and_clear();
            }
        }
    })))
}

/// `granary create` without `--if-absent` over a file that exists: say what
/// is there and what to do, instead of the system's bare "File exists".
/// Block devices (and links to them) are created over: that is how a store
/// is put on one. Anything else that is not a regular file is refused
/// unread (a FIFO would block the read).
fn refuse_existing(spec: &granary_store::io::DeviceSpec) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    for p in spec.paths() {
        // Follows links, as the device code does.
        let Ok(meta) = std::fs::metadata(p) else { continue };
        if meta.file_type().is_block_device() {
            continue;
        }
        if !meta.is_file() {
            return Err(format!("{}: exists and is not a regular file or a block device", p.display()));
        }
        let mut head = Vec::with_capacity(8);
        let read = std::fs::File::open(p).and_then(|f| std::io::Read::read_to_end(&mut f.take(8), &mut head));
        let what = match read {
            Ok(8) if head[..] == granary_store::io::file::UNFINISHED_MAGIC => {
                "holds an earlier creation that was interrupted before the store was written (it holds \
                 nothing), or one still running: `granary create --if-absent` (or `granary serve`) removes \
                 and makes it again unless another process holds it"
            }
            Ok(8)
                if head[..] == granary_format::superblock::SUPERBLOCK_MAGIC.to_le_bytes()
                    || head[..] == granary_store::io::stripe::LABEL_MAGIC =>
            {
                "already holds a Granary store: left as it is (`--if-absent` accepts an existing store; \
                 remove the file to start over)"
            }
            Ok(_) => "exists and is not a Granary store: not overwritten",
            Err(e) => return Err(format!("{}: exists and cannot be read: {e}", p.display())),
        };
        return Err(format!("{}: {what}", p.display()));
    }
    Ok(())
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    match cli.cmd {
        Cmd::Serve(a) => run_serve(serve::Config::resolve(&a)?),
        Cmd::Create { dev, size, segment_size, grain, stripe_size, if_absent } => {
            let spec = granary_store::io::DeviceSpec::parse(&dev.path).map_err(|e| e.to_string())?;
            if if_absent && spec.remove_unfinished().map_err(|e| e.to_string())? {
                eprintln!(
                    "{}: an earlier creation was interrupted before the store was written (it held \
                     nothing): removed, creating it again",
                    dev.path.display()
                );
            }
            let exists = spec.exists().map_err(|e| e.to_string())?;
            if if_absent && exists {
                let store = open_store(&dev, false, true)?;
                println!("{} already holds a store; left as it is", dev.path.display());
                drop(store);
                return Ok(ExitCode::SUCCESS);
            }
            if !if_absent {
                refuse_existing(&spec)?;
            }
            for p in spec.paths() {
                if let Some(parent) = p.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
                }
            }
            // Ctrl-C during the zero fill stops it and removes the file
            // (blocked only here: opening an existing store above stays
            // interruptible as any command).
            block_stop_signals();
            let opts = CreateOptions { grain_bytes: grain, segment_bytes: segment_size, index_table_homes: None };
            let all_block = spec.paths().iter().all(|p| {
                use std::os::unix::fs::FileTypeExt;
                std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device())
            });
            let size = match size {
                Some(s) => s,
                None if all_block => 0,
                None => return Err("--size is required to create a store in a file".into()),
            };
            let stripe = match stripe_size {
                None => granary_store::io::stripe::STRIPE_BYTES_DEFAULT,
                Some(s) => u32::try_from(s).map_err(|_| format!("--stripe-size {s} is too large"))?,
            };
            let d = spec
                .create_with_progress(
                    size,
                    stripe,
                    mode(dev.buffered),
                    granary_store::io::IoBackend::Sync,
                    &fill_progress(),
                )
                .map_err(|e| e.to_string())?;
            let store = Store::create(d, &opts, &OpenOptions::default())
                .inspect_err(|_| spec.remove_files())
                .map_err(|e| e.to_string())?;
            let st = store.stats();
            println!(
                "created {}: {} segments of {}, {}-byte grains, values up to {}",
                st.device,
                st.segments,
                size::human(st.segment_bytes),
                st.grain_bytes,
                size::human(st.value_bytes_max)
            );
            store.close().map_err(|e| e.to_string())?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Put { target, args, mode: m, flush } => {
            let (target, mut args) = target.resolve(args, 1, 2)?;
            if flush && matches!(target, Target::Remote(_)) {
                return Err("--flush applies to a local store; a server's durability is its own setting".into());
            }
            let key = args.remove(0);
            let value = match args.pop() {
                Some(v) if v != "-" => v.as_bytes().to_vec(),
                _ => {
                    let mut buf = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut buf)
                        .map_err(|e| format!("cannot read the value from stdin: {e}"))?;
                    buf
                }
            };
            let stored = match target {
                Target::Local(dev) => {
                    let store = open_store(&dev, flush, false)?;
                    let pm = match m {
                        Mode::Upsert => PutMode::Upsert,
                        Mode::Add => PutMode::CreateOnly,
                        Mode::Replace => PutMode::ReplaceOnly,
                    };
                    let outcome = store.put_with(key.as_bytes(), &value, pm).map_err(|e| e.to_string())?;
                    store.close().map_err(|e| e.to_string())?;
                    outcome == PutOutcome::Stored
                }
                Target::Remote(c) => {
                    let pm = match m {
                        Mode::Upsert => granary_client::PutMode::Upsert,
                        Mode::Add => granary_client::PutMode::CreateOnly,
                        Mode::Replace => granary_client::PutMode::ReplaceOnly,
                    };
                    c.put_with(key.as_bytes(), &value, pm).map_err(|e| e.to_string())?
                }
            };
            match (stored, m) {
                (true, _) => Ok(ExitCode::SUCCESS),
                (false, Mode::Add) => {
                    eprintln!("granary: not stored: key exists (--mode add)");
                    Ok(ExitCode::from(1))
                }
                (false, _) => {
                    eprintln!("granary: not stored: key not found (--mode replace)");
                    Ok(ExitCode::from(1))
                }
            }
        }
        Cmd::Get { target, args } => {
            let (target, args) = target.resolve(args, 1, 1)?;
            let key = &args[0];
            let v = match target {
                Target::Local(dev) => {
                    let store = open_store(&dev, false, true)?;
                    store.get(key.as_bytes()).map_err(|e| e.to_string())?
                }
                Target::Remote(c) => c.get(key.as_bytes()).map_err(|e| e.to_string())?,
            };
            match v {
                Some(v) => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&v).and_then(|_| out.flush()).map_err(|e| format!("cannot write to stdout: {e}"))?;
                    Ok(ExitCode::SUCCESS)
                }
                None => {
                    eprintln!("granary: key not found: {}", key.to_string_lossy());
                    Ok(ExitCode::from(1))
                }
            }
        }
        Cmd::Del { target, args, flush } => {
            let (target, args) = target.resolve(args, 1, 1)?;
            if flush && matches!(target, Target::Remote(_)) {
                return Err("--flush applies to a local store; a server's durability is its own setting".into());
            }
            let key = &args[0];
            let existed = match target {
                Target::Local(dev) => {
                    let store = open_store(&dev, flush, false)?;
                    let existed = store.delete(key.as_bytes()).map_err(|e| e.to_string())?;
                    store.close().map_err(|e| e.to_string())?;
                    existed
                }
                Target::Remote(c) => c.delete(key.as_bytes()).map_err(|e| e.to_string())?,
            };
            if existed {
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("granary: key not found: {}", key.to_string_lossy());
                Ok(ExitCode::from(1))
            }
        }
        Cmd::Load { dev, keys, value_bytes, rounds, first_round, ack, flush, checkpoint_ms } => {
            let durability = if flush { Durability::Flush } else { Durability::Direct };
            let opts = OpenOptions {
                durability,
                use_checkpoint: !dev.no_checkpoint,
                checkpoint_interval: (checkpoint_ms > 0).then(|| std::time::Duration::from_millis(checkpoint_ms)),
                progress: progress_bar(),
                ..OpenOptions::default()
            };
            let store = Store::open_path(&dev.path, mode(dev.buffered), &opts).map_err(|e| e.to_string())?;
            load(&store, keys, value_bytes, first_round, rounds, ack)?;
            store.close().map_err(|e| e.to_string())?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Stat { dev, json } => {
            let store = open_store(&dev, false, true)?;
            let st = store.stats();
            if json {
                println!("{}", stats_json(&st));
            } else {
                print_stats(&st);
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench(cmd) => bench(cmd),
        Cmd::Verify { dev } => {
            let store = open_store(&dev, false, true)?;
            let r = match progress_bar_for("verifying", false) {
                Some(p) => store.verify_with_progress(&p),
                None => store.verify(),
            }
            .map_err(|e| e.to_string())?;
            println!(
                "checked {} index entries ({} values, {} tombstones) and {} records in {} segments in {} ms",
                r.entries_checked, r.values, r.tombstones, r.records_scanned, r.segments_scanned, r.millis
            );
            for e in &r.errors {
                println!("error: {e}");
            }
            if r.is_clean() {
                println!("ok: no problems found");
                Ok(ExitCode::SUCCESS)
            } else {
                println!("FAILED: {} problems found", r.error_count);
                Ok(ExitCode::from(1))
            }
        }
    }
}

fn bench(cmd: BenchCmd) -> Result<ExitCode, String> {
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

/// `granary load`: rounds of generated writes, acknowledgements on stdout,
/// progress on a terminal (a bar) or in the log (every few seconds).
fn load(store: &Store, keys: u64, value_bytes: usize, first: u64, rounds: u64, ack: bool) -> Result<(), String> {
    use std::io::IsTerminal;
    let total = keys.saturating_mul(rounds);
    let bar = (std::io::stderr().is_terminal() && !ack).then(|| indicatif::ProgressBar::new(total));
    let mut out = std::io::stdout().lock();
    let mut last_log = std::time::Instant::now();
    let mut done = 0u64;
    for round in first..first.saturating_add(rounds) {
        for i in 0..keys {
            let (k, v) = (granary_bench::load::load_key(i), granary_bench::load::load_value(i, round, value_bytes));
            store.put(&k, &v).map_err(|e| e.to_string())?;
            if ack {
                writeln!(out, "{round} {i}").and_then(|()| out.flush()).map_err(|e| format!("stdout: {e}"))?;
            }
            done += 1;
            if let Some(b) = &bar {
                if done.is_multiple_of(1024) {
                    b.set_position(done);
                }
            } else if last_log.elapsed().as_secs() >= 5 {
                tracing::info!(done, total, "load in progress");
                last_log = std::time::Instant::now();
            }
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(())
}

fn print_stats(st: &Stats) {
    println!("device            {}", st.device);
    println!("device size       {}", size::human(st.device_bytes));
    println!("grain             {} B", st.grain_bytes);
    println!(
        "segments          {} of {} ({} free, {} open, {} closed)",
        st.segments,
        size::human(st.segment_bytes),
        st.segments_free,
        st.segments_open,
        st.segments_closed
    );
    println!("keys              {}", st.keys);
    println!(
        "gc                {} segments reclaimed, {} records relocated, {} tombstones dropped (starts below {} free segments, stops at {})",
        st.gc.victims, st.gc.records_relocated, st.gc.tombstones_dropped, st.gc_watermarks.0, st.gc_watermarks.1
    );
    println!("tombstones        {}", st.tombstones);
    println!("live bytes        {}", size::human(st.live_bytes));
    println!("max value         {}", size::human(st.value_bytes_max));
    println!(
        "index             {} entries, {} tables, {} slots, {} of DRAM",
        st.index.entries,
        st.index.tables,
        st.index.slots,
        size::human(st.index.memory_bytes)
    );
    let r = &st.recovery;
    if r.checkpoint_id != 0 {
        println!(
            "recovery          checkpoint {} ({} entries, {} stale dropped, {} ms){}",
            r.checkpoint_id,
            r.checkpoint_entries,
            r.checkpoint_dropped,
            r.checkpoint_millis,
            if r.clean_shutdown { ", clean shutdown: no log replayed" } else { "" }
        );
    } else {
        println!("recovery          no valid checkpoint: the whole log was scanned");
    }
    println!(
        "log scan          {} segments, {} records, {} damaged, {} torn, {} read in {} ms ({:.0} MB/s, {} threads); open took {} ms",
        r.segments_scanned,
        r.records,
        r.damaged_records,
        r.torn_records,
        size::human(r.bytes_read),
        r.scan_millis,
        r.scan_mb_per_s(),
        r.threads,
        r.millis
    );
    println!("checkpoint        current {} on {} segments", st.checkpoints.current_id, st.segments_index);
}

fn stats_json(st: &Stats) -> serde_json::Value {
    let r = &st.recovery;
    serde_json::json!({
        "device": st.device,
        "device_bytes": st.device_bytes,
        "grain_bytes": st.grain_bytes,
        "segment_bytes": st.segment_bytes,
        "segments": st.segments,
        "segments_free": st.segments_free,
        "segments_open": st.segments_open,
        "segments_closed": st.segments_closed,
        "segments_index": st.segments_index,
        "keys": st.keys,
        "tombstones": st.tombstones,
        "live_bytes": st.live_bytes,
        "value_bytes_max": st.value_bytes_max,
        "index": {
            "entries": st.index.entries,
            "tables": st.index.tables,
            "slots": st.index.slots,
            "memory_bytes": st.index.memory_bytes,
            "grows": st.index.grows,
        },
        "recovery": {
            "segments_scanned": r.segments_scanned,
            "records": r.records,
            "damaged_records": r.damaged_records,
            "torn_records": r.torn_records,
            "skipped_grains": r.skipped_grains,
            "bytes_read": r.bytes_read,
            "millis": r.millis,
            "scan_millis": r.scan_millis,
            "scan_mb_per_s": r.scan_mb_per_s(),
            "threads": r.threads,
            "checkpoint_id": r.checkpoint_id,
            "checkpoint_session": r.checkpoint_session,
            "checkpoint_entries": r.checkpoint_entries,
            "checkpoint_dropped": r.checkpoint_dropped,
            "checkpoint_millis": r.checkpoint_millis,
            "clean_shutdown": r.clean_shutdown,
        },
        "checkpoints": {
            "current_id": st.checkpoints.current_id,
            "segments": st.segments_index,
            "written": st.checkpoints.written,
            "failed": st.checkpoints.failed,
        },
        "session": st.session,
    })
}

fn main() -> ExitCode {
    // Internal errors are reported as one line, never a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("granary: internal error: {info}; please report this");
    }));
    let cli = Cli::parse();
    // `serve` may ask for JSON logs (flag or configuration file).
    let mut json_logs = std::env::var("GRANARY_LOG_FORMAT").is_ok_and(|v| v == "json");
    let cli = match cli {
        Cli { cmd: Cmd::Serve(a) } => match serve::Config::resolve(&a) {
            Ok(c) => {
                json_logs |= c.log_format == serve::LogFormat::Json;
                init_logging(json_logs);
                return finish(run_serve(c));
            }
            Err(msg) => {
                eprintln!("granary: error: {msg}");
                return ExitCode::from(2);
            }
        },
        other => other,
    };
    init_logging(json_logs);
    finish(run(cli))
}

/// Logs on stderr: text (colored on a terminal) or one JSON object per line.
fn init_logging(json: bool) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("GRANARY_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "warn,granary_store=info,granary_memcache=info,granary_native=info,granary=info",
        )
    });
    let b = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter);
    if json {
        b.json().init();
    } else {
        b.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

fn run_serve(c: serve::Config) -> Result<ExitCode, String> {
    if c.print {
        print!("{}", c.to_toml());
        return Ok(ExitCode::SUCCESS);
    }
    serve::run(c, progress_bar())?;
    Ok(ExitCode::SUCCESS)
}

fn finish(r: Result<ExitCode, String>) -> ExitCode {
    match r {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("granary: error: {msg}");
            ExitCode::from(2)
        }
    }
}
