//! `granary-bench nbd`: fio's NBD engine (`ioengine=nbd`, libnbd over
//! loopback TCP) against `granary serve --nbd-port`'s block export, against
//! `nbdkit file` serving a file on the same disk, and fio directly on a
//! file in the same folder (io_uring, O_DIRECT: the device's limit), in one
//! run.
//!
//! For each peer, in the order given, the benchmark prepares its data (a
//! new Granary store with one export of `--size`, or a preallocated file of
//! `--size`), starts its server as a child process on free loopback ports
//! below 32768, writes the whole data set once (one sequential pass of
//! 1 MiB writes at queue depth 8: the *preconditioning*), then runs each
//! fio job for `--secs` and stops the server by its PID and removes its
//! data. The preconditioning matters: a Granary block never written has no
//! index entry and reads as zeros without any IO, and a preallocated file's
//! unwritten extents read as zeros without IO as well, so reads of a fresh
//! device would measure nothing.
//!
//! Peers ([`PEERS`]):
//! - `granary`: `granary serve` (O_DIRECT, io_uring; writes acknowledged
//!   once on the device, not synced: Granary's default), the export created
//!   with `granary export create` (4 KiB blocks) before it starts.
//! - `granary-flush`: the same with `--flush` (fdatasync before each
//!   acknowledgement).
//! - `nbdkit`: `nbdkit file` on a preallocated file, `cache=none
//!   fadvise=random`: nbdkit's file plugin has no O_DIRECT; `cache=none`
//!   drops the pages of every read after it and writes back and drops those
//!   of every write (sync_file_range in a window of 8), and
//!   `fadvise=random` turns off read-ahead, so neither reads nor writes are
//!   served from DRAM. Writes are not synced (no FUA or FLUSH is sent), as
//!   with `granary`.
//! - `file`: no server: fio on a preallocated file, `ioengine=io_uring`,
//!   `direct=1`; what the disk does under the same jobs.
//!
//! Jobs ([`DEFAULT_JOBS`]) are named `RW-BS-qdN` (`randread-4k-qd32`); RW is
//! read, write, randread or randwrite. Random jobs' ratios are taken to
//! `nbdkit`, sequential jobs' to `file` ([`Job::baseline`]).
//!
//! Granary's DRAM: the server's metrics endpoint (`--metrics`), read with
//! the export created and nothing written, and again after the
//! preconditioning: index entries (one per written block, none per unwritten
//! one), index memory (`granary_index_memory_bytes`: the tables, 8-byte
//! entries and `serve`'s 4-byte access word per slot), and the server's
//! VmRSS.

use crate::child::granary_serving;
use crate::child::{cpu_secs, spawn_logged, ChildServer};
use crate::memcache::{machine_busy_secs, which};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The peers this benchmark knows.
pub const PEERS: [&str; 4] = ["granary", "granary-flush", "nbdkit", "file"];

/// The peers of a run by default (`granary-flush` is asked for by name).
pub const DEFAULT_PEERS: [&str; 3] = ["granary", "nbdkit", "file"];

/// The jobs of a run by default, in the order they run.
pub const DEFAULT_JOBS: [&str; 6] =
    ["randread-4k-qd1", "randread-4k-qd32", "read-1m-qd8", "randwrite-4k-qd1", "randwrite-4k-qd32", "write-1m-qd8"];

/// The name of Granary's export (nbdkit ignores the name it is asked for).
pub const EXPORT_NAME: &str = "bench";

/// The export's block size by default: the page and file system block
/// size clients use.
pub const BLOCK_BYTES: u64 = 4096;

/// Room in Granary's store beyond twice the export: segment headers, the
/// open segments, index checkpoints.
pub const STORE_MARGIN_BYTES: u64 = 256 << 20;

/// The preconditioning pass: sequential writes of this size ...
pub const PRECONDITION_BS: u64 = 1 << 20;
/// ... at this queue depth.
pub const PRECONDITION_DEPTH: usize = 8;

/// The largest block size of a job (NBD's request limit of Granary's server).
pub const BS_MAX: u64 = 32 << 20;

/// How long a server may take to listen after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The percentiles fio is asked for.
const PERCENTILES: [f64; 3] = [50.0, 99.0, 99.9];

// ----------------------------------------------------------------- jobs

/// fio's `rw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rw {
    Read,
    Write,
    RandRead,
    RandWrite,
}

impl Rw {
    pub fn fio(self) -> &'static str {
        match self {
            Rw::Read => "read",
            Rw::Write => "write",
            Rw::RandRead => "randread",
            Rw::RandWrite => "randwrite",
        }
    }

    pub fn is_write(self) -> bool {
        matches!(self, Rw::Write | Rw::RandWrite)
    }

    pub fn is_random(self) -> bool {
        matches!(self, Rw::RandRead | Rw::RandWrite)
    }
}

/// One fio job: the pattern, the block size, the queue depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    pub rw: Rw,
    pub bs: u64,
    pub iodepth: usize,
}

impl Job {
    /// `randread-4k-qd32`: RW (read, write, randread, randwrite), a block
    /// size (bytes, or with k or m: a multiple of 512 up to 32m), the queue
    /// depth (1 to 1024).
    pub fn parse(s: &str) -> Result<Job, String> {
        let bad = |why: &str| format!("bad job {s:?}: {why} (RW-BS-qdN, e.g. randread-4k-qd32)");
        let parts: Vec<&str> = s.trim().split('-').collect();
        let [rw, bs, qd] = parts[..] else { return Err(bad("three fields")) };
        let rw = match rw.to_ascii_lowercase().as_str() {
            "read" => Rw::Read,
            "write" => Rw::Write,
            "randread" => Rw::RandRead,
            "randwrite" => Rw::RandWrite,
            _ => return Err(bad("RW is read, write, randread or randwrite")),
        };
        let bs_lc = bs.to_ascii_lowercase();
        let (digits, unit) = match bs_lc.strip_suffix('k') {
            Some(d) => (d, 1u64 << 10),
            None => match bs_lc.strip_suffix('m') {
                Some(d) => (d, 1 << 20),
                None => (bs_lc.as_str(), 1),
            },
        };
        let bs = digits.parse::<u64>().ok().and_then(|n| n.checked_mul(unit)).ok_or_else(|| bad("block size"))?;
        if bs == 0 || !bs.is_multiple_of(512) || bs > BS_MAX {
            return Err(bad("the block size is a multiple of 512 up to 32m"));
        }
        let iodepth = qd
            .to_ascii_lowercase()
            .strip_prefix("qd")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| (1..=1024).contains(n))
            .ok_or_else(|| bad("qdN with N from 1 to 1024"))?;
        Ok(Job { rw, bs, iodepth })
    }

    /// The job's name, as [`Job::parse`] reads it: `read-1m-qd8`.
    pub fn name(&self) -> String {
        format!("{}-{}-qd{}", self.rw.fio(), fmt_bs(self.bs), self.iodepth)
    }

    /// The peer its ratios are taken to: random IO to `nbdkit` (the
    /// server), sequential IO to `file` (the device).
    pub fn baseline(&self) -> &'static str {
        if self.rw.is_random() {
            "nbdkit"
        } else {
            "file"
        }
    }
}

/// 4096 as `4k`, 1 MiB as `1m`, 1536 as `1536`.
fn fmt_bs(bs: u64) -> String {
    if bs.is_multiple_of(1 << 20) {
        format!("{}m", bs >> 20)
    } else if bs.is_multiple_of(1024) {
        format!("{}k", bs >> 10)
    } else {
        bs.to_string()
    }
}

#[derive(Debug, Clone)]
pub struct NbdBenchOptions {
    /// Peers, in the order they run: names from [`PEERS`].
    pub peers: Vec<String>,
    /// Jobs, in the order they run.
    pub jobs: Vec<Job>,
    /// The export's (and the files') size: a multiple of 1 MiB.
    pub size: u64,
    /// Seconds per job.
    pub secs: f64,
    /// Granary's export's block size (`granary export create --block-size`):
    /// a power of two from 512 to 64 KiB.
    pub block_size: u64,
    /// Data files, server logs and fio's outputs.
    pub dir: PathBuf,
    /// `granary` (default: beside this executable, `GRANARY_BIN`, PATH).
    pub granary: Option<PathBuf>,
}

impl Default for NbdBenchOptions {
    fn default() -> Self {
        NbdBenchOptions {
            peers: DEFAULT_PEERS.iter().map(|s| s.to_string()).collect(),
            jobs: DEFAULT_JOBS.iter().map(|j| Job::parse(j).expect("a default job")).collect(),
            size: 1 << 30,
            secs: 10.0,
            block_size: BLOCK_BYTES,
            dir: PathBuf::from("granary-data"),
            granary: None,
        }
    }
}

impl NbdBenchOptions {
    /// Granary's store: twice the export (records of a 4 KiB block take
    /// 4.5 KiB in 512-byte grains, and random overwrites need free space
    /// for GC to work in) and [`STORE_MARGIN_BYTES`].
    pub fn store_size(&self) -> u64 {
        (2 * self.size + STORE_MARGIN_BYTES).div_ceil(1 << 20) << 20
    }

    /// Blocks of the export (every one written by the preconditioning).
    pub fn blocks(&self) -> u64 {
        self.size / self.block_size
    }

    /// The options' errors, before anything starts.
    pub fn check(&self) -> Result<(), String> {
        if self.size < (16 << 20) || !self.size.is_multiple_of(1 << 20) {
            return Err(format!("--size must be a multiple of 1 MiB, at least 16 MiB (got {})", self.size));
        }
        if !self.block_size.is_power_of_two() || !(512..=65536).contains(&self.block_size) {
            return Err(format!("--block-size must be a power of two from 512 to 64K (got {})", self.block_size));
        }
        if !(0.1..=3600.0).contains(&self.secs) {
            return Err("--secs must be between 0.1 and 3600".into());
        }
        if self.peers.is_empty() || self.jobs.is_empty() {
            return Err("need at least one peer and one job".into());
        }
        for p in &self.peers {
            if !PEERS.contains(&p.as_str()) {
                return Err(format!("unknown peer {p:?}: {}", PEERS.join(", ")));
            }
        }
        if let Some(j) = self.jobs.iter().find(|j| j.bs > self.size) {
            return Err(format!("job {} has blocks larger than --size", j.name()));
        }
        Ok(())
    }
}

// ------------------------------------------------------------ fio output

/// One direction (read or write) of a fio job's JSON report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FioDir {
    pub io_bytes: u64,
    pub total_ios: u64,
    pub iops: f64,
    pub bw_bytes: f64,
    /// Milliseconds this direction ran.
    pub runtime_ms: u64,
    /// Total latency (submission to completion, `lat_ns`), microseconds;
    /// completion latency (`clat_ns`) where fio gave no `lat_ns` percentiles.
    pub mean_us: f64,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    pub max_us: f64,
}

/// One job of a fio JSON report (`--output-format=json`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FioJob {
    pub name: String,
    /// fio's error number (0: none).
    pub error: i64,
    pub read: FioDir,
    pub write: FioDir,
    /// fio's own CPU, percent of the job's runtime.
    pub usr_cpu: f64,
    pub sys_cpu: f64,
    pub job_runtime_ms: u64,
}

impl FioJob {
    /// The direction the job's pattern does.
    pub fn dir(&self, rw: Rw) -> &FioDir {
        if rw.is_write() {
            &self.write
        } else {
            &self.read
        }
    }

    /// fio's CPU seconds over the job.
    pub fn cpu_secs(&self) -> f64 {
        (self.usr_cpu + self.sys_cpu) / 100.0 * self.job_runtime_ms as f64 / 1000.0
    }
}

/// The jobs of fio's JSON report. Lines before the JSON (fio's NBD engine
/// prints `fio: connected to NBD server` on stdout) are skipped.
pub fn parse_fio_json(text: &str) -> Result<Vec<FioJob>, String> {
    let start = if text.starts_with('{') {
        0
    } else {
        text.find("\n{").map(|i| i + 1).ok_or_else(|| format!("no JSON in fio's output: {}", first_line(text)))?
    };
    let v: serde_json::Value =
        serde_json::from_str(&text[start..]).map_err(|e| format!("fio's JSON does not parse: {e}"))?;
    let jobs = v["jobs"].as_array().ok_or("fio's JSON has no jobs")?;
    jobs.iter().map(parse_fio_job).collect()
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

fn parse_fio_job(j: &serde_json::Value) -> Result<FioJob, String> {
    let name = j["jobname"].as_str().ok_or("a fio job without a jobname")?.to_string();
    Ok(FioJob {
        error: j["error"].as_i64().unwrap_or(0),
        read: parse_fio_dir(&j["read"]).map_err(|e| format!("{name}: read: {e}"))?,
        write: parse_fio_dir(&j["write"]).map_err(|e| format!("{name}: write: {e}"))?,
        usr_cpu: j["usr_cpu"].as_f64().unwrap_or(0.0),
        sys_cpu: j["sys_cpu"].as_f64().unwrap_or(0.0),
        job_runtime_ms: j["job_runtime"].as_u64().unwrap_or(0),
        name,
    })
}

fn parse_fio_dir(d: &serde_json::Value) -> Result<FioDir, String> {
    if !d.is_object() {
        return Err("missing".into());
    }
    let num = |k: &str| d[k].as_f64().ok_or_else(|| format!("no {k}"));
    // `lat_ns` has percentiles with --lat_percentiles=1; else `clat_ns` has
    // them (fio's default).
    let lat = if d["lat_ns"]["percentile"].is_object() || !d["clat_ns"]["percentile"].is_object() {
        &d["lat_ns"]
    } else {
        &d["clat_ns"]
    };
    let pct = |p: f64| {
        lat["percentile"].as_object()?.iter().find_map(|(k, v)| {
            let at: f64 = k.parse().ok()?;
            ((at - p).abs() < 1e-6).then(|| v.as_f64()).flatten().map(|ns| ns / 1000.0)
        })
    };
    Ok(FioDir {
        io_bytes: num("io_bytes")? as u64,
        total_ios: num("total_ios")? as u64,
        iops: num("iops")?,
        bw_bytes: num("bw_bytes")?,
        runtime_ms: num("runtime")? as u64,
        mean_us: lat["mean"].as_f64().unwrap_or(0.0) / 1000.0,
        p50_us: pct(PERCENTILES[0]),
        p99_us: pct(PERCENTILES[1]),
        p999_us: pct(PERCENTILES[2]),
        max_us: lat["max"].as_f64().unwrap_or(0.0) / 1000.0,
    })
}

// -------------------------------------------------------------- results

/// One fio job against one peer.
#[derive(Debug, Clone, PartialEq)]
pub struct JobResult {
    /// The job's name (`precondition` for the write pass).
    pub name: String,
    pub job: Job,
    pub fio: FioDir,
    /// fio's CPU seconds over the job.
    pub fio_cpu_secs: f64,
    /// The server's CPU seconds (user and system, all threads) over the job.
    pub server_cpu_secs: Option<f64>,
    /// The whole machine's busy CPU seconds over the job (all cores; other
    /// processes included).
    pub machine_busy_secs: Option<f64>,
    /// Wall-clock seconds of fio's run (start and connection included).
    pub wall_secs: f64,
    /// Granary's device IO over the job (its metrics), where it has them.
    pub device: Option<DeviceIo>,
}

/// Granary's device counters (`granary_device_operations_total`,
/// `granary_device_bytes_total`, `granary_gc_relocated_bytes_total`), or
/// their growth over a job.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DeviceIo {
    pub reads: f64,
    pub writes: f64,
    pub flushes: f64,
    pub read_bytes: f64,
    pub written_bytes: f64,
    pub gc_relocated_bytes: f64,
}

impl DeviceIo {
    fn from_page(page: &str) -> Option<DeviceIo> {
        Some(DeviceIo {
            reads: sample(page, "granary_device_operations_total{op=\"read\"}")?,
            writes: sample(page, "granary_device_operations_total{op=\"write\"}")?,
            flushes: sample(page, "granary_device_operations_total{op=\"flush\"}").unwrap_or(0.0),
            read_bytes: sample(page, "granary_device_bytes_total{dir=\"read\"}")?,
            written_bytes: sample(page, "granary_device_bytes_total{dir=\"written\"}")?,
            gc_relocated_bytes: sample(page, "granary_gc_relocated_bytes_total").unwrap_or(0.0),
        })
    }

    fn since(self, before: DeviceIo) -> DeviceIo {
        DeviceIo {
            reads: self.reads - before.reads,
            writes: self.writes - before.writes,
            flushes: self.flushes - before.flushes,
            read_bytes: self.read_bytes - before.read_bytes,
            written_bytes: self.written_bytes - before.written_bytes,
            gc_relocated_bytes: self.gc_relocated_bytes - before.gc_relocated_bytes,
        }
    }
}

impl JobResult {
    pub fn iops(&self) -> f64 {
        self.fio.iops
    }

    /// MB/s (10^6 bytes).
    pub fn mb_per_sec(&self) -> f64 {
        self.fio.bw_bytes / 1e6
    }

    fn per_io_us(&self, secs: Option<f64>) -> Option<f64> {
        let s = secs?;
        (self.fio.total_ios > 0).then(|| s * 1e6 / self.fio.total_ios as f64)
    }

    /// The server's CPU microseconds per IO.
    pub fn server_cpu_us_per_io(&self) -> Option<f64> {
        self.per_io_us(self.server_cpu_secs)
    }

    /// The machine's busy CPU microseconds per IO (fio's, the server's and
    /// the kernel's: loopback TCP, the device's submissions and interrupts).
    pub fn machine_cpu_us_per_io(&self) -> Option<f64> {
        self.per_io_us(self.machine_busy_secs)
    }

    pub fn fio_cpu_us_per_io(&self) -> Option<f64> {
        self.per_io_us(Some(self.fio_cpu_secs))
    }

    /// The server's device reads and writes per fio IO.
    pub fn device_ios_per_io(&self) -> Option<(f64, f64)> {
        let d = self.device?;
        let n = self.fio.total_ios.max(1) as f64;
        Some((d.reads / n, d.writes / n))
    }

    /// The server's device bytes (read, written) per byte fio moved.
    pub fn device_bytes_per_byte(&self) -> Option<(f64, f64)> {
        let d = self.device?;
        let n = self.fio.io_bytes.max(1) as f64;
        Some((d.read_bytes / n, d.written_bytes / n))
    }
}

/// Granary's index and memory with the export created and nothing written,
/// and after the preconditioning wrote every block once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dram {
    pub blocks_written: u64,
    pub entries_before: Option<f64>,
    pub entries_after: Option<f64>,
    pub index_bytes_before: Option<f64>,
    pub index_bytes_after: Option<f64>,
    pub slots_after: Option<f64>,
    pub occupancy_after: Option<f64>,
    /// Blind overwrites' links not settled yet (`granary_unsettled_links`):
    /// a block whose fingerprint collided with another block's index entry
    /// is held by a link (and its bytes, `granary_link_bytes`) until GC or a
    /// checkpoint puts it back in the index.
    pub links_after: Option<f64>,
    pub link_bytes_after: Option<f64>,
    pub rss_before_kib: Option<u64>,
    pub rss_after_kib: Option<u64>,
}

fn sub(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? - b?)
}

impl Dram {
    /// Index entries and unsettled links the preconditioning added per
    /// block it wrote (1: one per written block).
    pub fn entries_per_written_block(&self) -> Option<f64> {
        let added = sub(self.entries_after, self.entries_before)? + self.links_after.unwrap_or(0.0);
        Some(added / self.blocks_written.max(1) as f64)
    }

    /// Index DRAM per written block, after the preconditioning
    /// (`granary_index_memory_bytes` over the blocks written).
    pub fn index_bytes_per_written_block(&self) -> Option<f64> {
        Some(self.index_bytes_after? / self.blocks_written.max(1) as f64)
    }

    /// The index's and the links' DRAM per written block.
    pub fn dram_bytes_per_written_block(&self) -> Option<f64> {
        Some((self.index_bytes_after? + self.link_bytes_after.unwrap_or(0.0)) / self.blocks_written.max(1) as f64)
    }

    /// Index DRAM per slot (the 8-byte entry and serve's 4-byte access word).
    pub fn index_bytes_per_slot(&self) -> Option<f64> {
        Some(self.index_bytes_after? / self.slots_after.filter(|s| *s > 0.0)?)
    }

    /// The index's 8-byte entry per slot at the 85% occupancy the index
    /// doubles at: the design figure (~9.4 B per key), to compare with.
    pub fn design_entry_bytes() -> f64 {
        8.0 / 0.85
    }

    /// VmRSS the preconditioning added per written block.
    pub fn rss_bytes_per_written_block(&self) -> Option<f64> {
        let (a, b) = (self.rss_after_kib?, self.rss_before_kib?);
        Some((a as f64 - b as f64) * 1024.0 / self.blocks_written.max(1) as f64)
    }
}

/// One peer's results.
#[derive(Debug, Clone, Default)]
pub struct PeerResult {
    pub peer: String,
    pub precondition: Option<JobResult>,
    pub dram: Option<Dram>,
    pub jobs: Vec<JobResult>,
    /// What failed, where something did (the jobs before it are kept).
    pub error: Option<String>,
}

impl PeerResult {
    pub fn job(&self, job: &Job) -> Option<&JobResult> {
        self.jobs.iter().find(|r| r.job == *job)
    }
}

#[derive(Debug, Clone, Default)]
pub struct NbdReport {
    pub peers: Vec<PeerResult>,
    /// `fio --version`, `nbdkit --version`.
    pub fio_version: String,
    pub nbdkit_version: Option<String>,
}

impl NbdReport {
    pub fn peer(&self, name: &str) -> Option<&PeerResult> {
        self.peers.iter().find(|p| p.peer == name)
    }

    /// Every failure, as `peer: what`.
    pub fn failures(&self) -> Vec<String> {
        self.peers.iter().filter_map(|p| p.error.as_ref().map(|e| format!("{}: {e}", p.peer))).collect()
    }

    /// A job's IOPS ratio to its baseline peer (the same as the MB/s ratio).
    pub fn ratio(&self, peer: &str, job: &Job) -> Option<f64> {
        let a = self.peer(peer)?.job(job)?.iops();
        let b = self.peer(job.baseline())?.job(job)?.iops();
        (b > 0.0).then(|| a / b)
    }
}

// ---------------------------------------------------------------- tools

/// The external programs a run needs.
#[derive(Debug, Clone)]
pub struct Tools {
    pub fio: PathBuf,
    pub nbdkit: Option<PathBuf>,
    pub granary: Option<PathBuf>,
}

fn is_granary(peer: &str) -> bool {
    peer.starts_with("granary")
}

/// Find every program the run needs, before anything starts.
pub fn find_tools(o: &NbdBenchOptions) -> Result<Tools, String> {
    o.check()?;
    let fio = which("fio").ok_or("fio is not installed (apt-get install fio)")?;
    let over_nbd = o.peers.iter().any(|p| p != "file");
    if over_nbd {
        let help = Command::new(&fio).arg("--enghelp=nbd").output().map_err(|e| format!("cannot run fio: {e}"))?;
        if !help.status.success() || !String::from_utf8_lossy(&help.stdout).contains("uri") {
            return Err("this fio has no NBD engine (ioengine=nbd, fio 3.19 or later built with libnbd)".into());
        }
    }
    let nbdkit = if o.peers.iter().any(|p| p == "nbdkit") {
        Some(which("nbdkit").ok_or("nbdkit is not installed (apt-get install nbdkit), or leave the peer out")?)
    } else {
        None
    };
    let granary = match o.peers.iter().any(|p| is_granary(p)) {
        true => Some(granary_serving(
            o.granary.as_deref(),
            "--nbd-port",
            "no NBD listener: build it (cargo build --release -p granary-cli), or leave the granary peers out",
        )?),
        false => None,
    };
    Ok(Tools { fio, nbdkit, granary })
}

fn version(tool: &Path) -> String {
    Command::new(tool)
        .arg("--version")
        .output()
        .ok()
        .map(|o| first_line(&String::from_utf8_lossy(&o.stdout)).trim().to_string())
        .unwrap_or_default()
}

// ---------------------------------------------------------------- peers

/// Where fio sends its IO.
#[derive(Debug, Clone)]
enum IoTarget {
    /// `ioengine=nbd`, this URI.
    Nbd(String),
    /// `ioengine=io_uring`, `direct=1`, this file.
    File(PathBuf),
}

/// A peer ready for fio: its server (killed by its PID on drop) and data
/// (removed on drop).
struct Peer {
    server: ChildServer,
    target: IoTarget,
    metrics: Option<SocketAddr>,
}

/// `n` distinct free loopback ports below 32768.
fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    let mut ports = Vec::with_capacity(n);
    while ports.len() < n {
        let p = granary_rt::net::free_low_port().map_err(|e| format!("no free port: {e}"))?;
        if !ports.contains(&p) {
            ports.push(p);
        }
    }
    Ok(ports)
}

/// A new file of `size` bytes, its blocks allocated (fallocate), so that
/// the preconditioning pass writes into allocated space.
fn preallocate(path: &Path, size: u64) -> Result<(), String> {
    let _ = std::fs::remove_file(path);
    let f = std::fs::File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fallocate on a file descriptor we own, open for writing.
    let rc = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, size as libc::off_t) };
    if rc != 0 {
        return Err(format!(
            "cannot allocate {} bytes for {}: {}",
            size,
            path.display(),
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    Ok(())
}

/// Run a short command to its end; its output on failure.
fn run_tool(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// Wait until `addr` accepts a connection (the server listens once it is
/// ready), or the server exits, or [`START_TIMEOUT`] passes.
fn wait_listening(peer: &mut Peer, addr: SocketAddr) -> Result<(), String> {
    peer.server.wait_ready(START_TIMEOUT, &format!("listen on {addr}"), || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
    })
}

/// Prepare `name`'s data and start its server.
fn start_peer(name: &str, o: &NbdBenchOptions, tools: &Tools) -> Result<Peer, String> {
    let log = o.dir.join(format!("nbd-{name}.log"));
    match name {
        "file" => {
            let path = o.dir.join("nbd-file.dat");
            let peer = Peer {
                server: ChildServer::new(name, None, vec![path.clone()], None),
                target: IoTarget::File(path.clone()),
                metrics: None,
            };
            preallocate(&path, o.size)?;
            Ok(peer)
        }
        "nbdkit" => {
            let path = o.dir.join("nbd-nbdkit.img");
            let mut peer = Peer {
                server: ChildServer::new(name, None, vec![path.clone()], Some(log.clone())),
                target: IoTarget::File(path.clone()),
                metrics: None,
            };
            preallocate(&path, o.size)?;
            let port = free_ports(1)?[0];
            let mut c = Command::new(tools.nbdkit.as_ref().ok_or("no nbdkit")?);
            c.args(["--foreground", "--exit-with-parent", "--ipaddr", "127.0.0.1", "--port", &port.to_string()]);
            c.arg("file").arg(format!("file={}", path.display())).args(["cache=none", "fadvise=random"]);
            peer.server.child = Some(spawn_logged(name, c.stdin(Stdio::null()), &log)?);
            peer.target = IoTarget::Nbd(format!("nbd://127.0.0.1:{port}/{EXPORT_NAME}"));
            wait_listening(&mut peer, SocketAddr::from(([127, 0, 0, 1], port)))?;
            Ok(peer)
        }
        _ => {
            let g = tools.granary.as_ref().ok_or("no granary binary")?;
            let data = o.dir.join(format!("nbd-{name}.db"));
            let _ = std::fs::remove_file(&data);
            let mut peer = Peer {
                server: ChildServer::new(name, None, vec![data.clone()], Some(log.clone())),
                target: IoTarget::File(data.clone()),
                metrics: None,
            };
            run_tool(
                Command::new(g).arg("create").arg(&data).args(["--size", &o.store_size().to_string()]),
                "granary create",
            )?;
            run_tool(
                Command::new(g).args(["export", "create"]).arg(&data).arg(EXPORT_NAME).args([
                    "--size",
                    &o.size.to_string(),
                    "--block-size",
                    &o.block_size.to_string(),
                ]),
                "granary export create",
            )?;
            let [mc, nbd, metrics] = free_ports(3)?[..] else { unreachable!("three ports") };
            let metrics = SocketAddr::from(([127, 0, 0, 1], metrics));
            let mut c = Command::new(g);
            c.args(["serve", "--data"]).arg(&data);
            // The Memcache listener cannot be turned off: a port of its own.
            c.args(["-l", "127.0.0.1", "-p", &mc.to_string(), "--no-native", "--no-resp"]);
            c.args(["--nbd-port", &nbd.to_string(), "--metrics", &metrics.to_string()]);
            if name == "granary-flush" {
                c.arg("--flush");
            }
            peer.server.child = Some(spawn_logged(name, c.stdin(Stdio::null()), &log)?);
            peer.target = IoTarget::Nbd(format!("nbd://127.0.0.1:{nbd}/{EXPORT_NAME}"));
            peer.metrics = Some(metrics);
            // The metrics listener is the last to listen.
            wait_listening(&mut peer, metrics)?;
            wait_listening(&mut peer, SocketAddr::from(([127, 0, 0, 1], nbd)))?;
            Ok(peer)
        }
    }
}

// -------------------------------------------------------------- metrics

/// GET /metrics of a Granary server: its Prometheus text.
pub fn scrape(addr: SocketAddr) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| format!("metrics {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: granary\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("metrics {addr}: {e}"))?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| format!("metrics {addr}: {e}"))?;
    let (head, body) = out.split_once("\r\n\r\n").ok_or_else(|| format!("metrics {addr}: not an HTTP response"))?;
    if !first_line(head).contains(" 200") {
        return Err(format!("metrics {addr}: {}", first_line(head)));
    }
    Ok(body.to_string())
}

/// The value of an unlabelled sample of a Prometheus text.
pub fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Granary's device counters, where it serves metrics.
fn device_figures(peer: &Peer) -> Option<DeviceIo> {
    let page = scrape(peer.metrics?).map_err(|e| eprintln!("bench nbd: {e}")).ok()?;
    DeviceIo::from_page(&page)
}

/// Granary's index figures: entries, memory bytes, slots, occupancy,
/// unsettled links, link bytes.
fn index_figures(peer: &Peer) -> [Option<f64>; 6] {
    let Some(page) = peer.metrics.and_then(|m| scrape(m).map_err(|e| eprintln!("bench nbd: {e}")).ok()) else {
        return [None; 6];
    };
    [
        "granary_index_entries",
        "granary_index_memory_bytes",
        "granary_index_slots",
        "granary_index_occupancy",
        "granary_unsettled_links",
        "granary_link_bytes",
    ]
    .map(|n| sample(&page, n))
}

// ------------------------------------------------------------------ fio

/// Run one fio job against `target`: time-based for `secs`, or one pass
/// over the whole data set (`secs` None). Its JSON is kept in `out`.
fn fio(
    tools: &Tools,
    target: &IoTarget,
    name: &str,
    job: &Job,
    size: u64,
    secs: Option<f64>,
    out: &Path,
) -> Result<(FioJob, f64), String> {
    let mut c = Command::new(&tools.fio);
    c.arg(format!("--name={name}"));
    match target {
        IoTarget::Nbd(uri) => c.args(["--ioengine=nbd".to_string(), format!("--uri={uri}")]),
        IoTarget::File(p) => c.args(["--ioengine=io_uring", "--direct=1"]).arg(format!("--filename={}", p.display())),
    };
    c.arg(format!("--rw={}", job.rw.fio()))
        .arg(format!("--bs={}", job.bs))
        .arg(format!("--iodepth={}", job.iodepth))
        .arg(format!("--size={size}"))
        .args(["--numjobs=1", "--lat_percentiles=1", "--percentile_list=50:99:99.9", "--output-format=json"])
        .arg(format!("--output={}", out.display()));
    if job.rw.is_random() {
        // Uniform offsets over the whole data set, different each run.
        c.args(["--norandommap", "--randrepeat=0"]);
    }
    let deadline = match secs {
        Some(s) => {
            c.args(["--time_based".to_string(), format!("--runtime={}ms", (s * 1000.0).round() as u64)]);
            Duration::from_secs_f64(s + 120.0)
        }
        // A pass at 1 MB/s or faster.
        None => Duration::from_secs(120 + size / 1_000_000),
    };
    let err_path = out.with_extension("err");
    let err = std::fs::File::create(&err_path).map_err(|e| format!("cannot create {}: {e}", err_path.display()))?;
    let errs = err.try_clone().map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut child = c.stdin(Stdio::null()).stdout(err).stderr(errs).spawn().map_err(|e| format!("fio: {e}"))?;
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            break st;
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("fio {name}: still running after {deadline:?}; killed"));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let wall = start.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(out).unwrap_or_default();
    let msgs = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_file(&err_path);
    let parsed = parse_fio_json(&text);
    let job_out = match parsed {
        Ok(mut jobs) if status.success() && jobs.len() == 1 => jobs.remove(0),
        Ok(jobs) => return Err(format!("fio {name} ({status}, {} jobs in its report): {msgs}", jobs.len())),
        Err(e) => return Err(format!("fio {name} ({status}): {e}; fio said: {msgs}")),
    };
    if job_out.error != 0 {
        return Err(format!("fio {name}: error {} ({msgs})", job_out.error));
    }
    if job_out.dir(job.rw).total_ios == 0 {
        return Err(format!("fio {name}: no IO completed ({msgs})"));
    }
    Ok((job_out, wall))
}

/// One measured fio job, with the server's and the machine's CPU over it.
fn measure(
    o: &NbdBenchOptions,
    tools: &Tools,
    peer: &mut Peer,
    name: &str,
    job: &Job,
    secs: Option<f64>,
) -> Result<JobResult, String> {
    let out = o.dir.join(format!("nbd-{}-{name}.json", peer.server.name));
    let pid = peer.server.pid();
    let dev0 = device_figures(peer);
    let (cpu0, busy0) = (pid.and_then(cpu_secs), machine_busy_secs());
    let (f, wall) = fio(tools, &peer.target, name, job, o.size, secs, &out).map_err(|e| peer.server.failed(e))?;
    let (cpu1, busy1) = (pid.and_then(cpu_secs), machine_busy_secs());
    peer.server.check_alive()?;
    let device = device_figures(peer).zip(dev0).map(|(b, a)| b.since(a));
    Ok(JobResult {
        name: name.to_string(),
        job: *job,
        fio: f.dir(job.rw).clone(),
        fio_cpu_secs: f.cpu_secs(),
        server_cpu_secs: sub(cpu1, cpu0),
        machine_busy_secs: sub(busy1, busy0),
        wall_secs: wall,
        device,
    })
}

// ------------------------------------------------------------------ run

/// Run the comparison; progress on stderr. A peer that fails is recorded
/// (its error in the report) and the run goes on with the next.
pub fn run(o: &NbdBenchOptions) -> Result<NbdReport, String> {
    let tools = find_tools(o)?;
    std::fs::create_dir_all(&o.dir).map_err(|e| format!("cannot create {}: {e}", o.dir.display()))?;
    let mut report = NbdReport {
        peers: Vec::new(),
        fio_version: version(&tools.fio),
        nbdkit_version: tools.nbdkit.as_deref().map(version),
    };
    for name in &o.peers {
        let mut r = PeerResult { peer: name.clone(), ..Default::default() };
        if let Err(e) = run_peer(o, &tools, name, &mut r) {
            eprintln!("bench nbd: {name}: FAILED: {e}");
            r.error = Some(e);
        }
        report.peers.push(r);
    }
    Ok(report)
}

fn run_peer(o: &NbdBenchOptions, tools: &Tools, name: &str, r: &mut PeerResult) -> Result<(), String> {
    eprintln!("bench nbd: {name}: starting");
    let mut peer = start_peer(name, o, tools)?;
    let mut dram = is_granary(name).then(|| Dram { blocks_written: o.blocks(), ..Default::default() });
    if let Some(d) = dram.as_mut() {
        [d.entries_before, d.index_bytes_before, ..] = index_figures(&peer);
        d.rss_before_kib = peer.server.rss_kib();
    }
    let pass = Job { rw: Rw::Write, bs: PRECONDITION_BS, iodepth: PRECONDITION_DEPTH };
    eprintln!(
        "bench nbd: {name}: preconditioning: writing all {:.1} MiB once ({} B writes, queue depth {})",
        o.size as f64 / (1 << 20) as f64,
        pass.bs,
        pass.iodepth
    );
    let pre = measure(o, tools, &mut peer, "precondition", &pass, None)?;
    eprintln!("bench nbd: {name}: preconditioned at {:.0} MB/s", pre.mb_per_sec());
    r.precondition = Some(pre);
    if let Some(d) = dram.as_mut() {
        [d.entries_after, d.index_bytes_after, d.slots_after, d.occupancy_after, d.links_after, d.link_bytes_after] =
            index_figures(&peer);
        d.rss_after_kib = peer.server.rss_kib();
        eprintln!(
            "bench nbd: {name}: index: {} entries ({} before), {} B per written block, VmRSS {} MiB",
            fmt_opt(d.entries_after, 0),
            fmt_opt(d.entries_before, 0),
            fmt_opt(d.index_bytes_per_written_block(), 1),
            fmt_opt(d.rss_after_kib.map(|k| k as f64 / 1024.0), 1)
        );
    }
    r.dram = dram;
    for job in &o.jobs {
        let jn = job.name();
        eprintln!("bench nbd: {name}: {jn}: {} s", o.secs);
        let res = measure(o, tools, &mut peer, &jn, job, Some(o.secs))?;
        eprintln!(
            "bench nbd: {name}: {jn}: {:.0} IOPS, {:.1} MB/s, p50 {} us, p99 {} us{}",
            res.iops(),
            res.mb_per_sec(),
            fmt_opt(res.fio.p50_us, 0),
            fmt_opt(res.fio.p99_us, 0),
            res.server_cpu_us_per_io().map_or(String::new(), |c| format!(", server {c:.1} CPU us/IO"))
        );
        r.jobs.push(res);
    }
    Ok(())
}

// --------------------------------------------------------------- report

use crate::report::fmt_opt;
pub use crate::report::Target;

/// The issue's targets, for the peers and jobs this run has: 4 KiB random
/// read and write at queue depth 32, `granary` >= 1.0x `nbdkit`; 1 MiB
/// sequential read and write, `granary` >= 0.8x `file`; one index entry per
/// written block and none per unwritten one.
pub fn targets(o: &NbdBenchOptions, report: &NbdReport) -> Vec<Target> {
    let mut t = Vec::new();
    for job in &o.jobs {
        let bound = match (job.rw.is_random(), job.bs, job.iodepth) {
            (true, 4096, 32) => 1.0,
            (false, b, _) if b == 1 << 20 => 0.8,
            _ => continue,
        };
        if let Some(v) = report.ratio("granary", job) {
            t.push(Target {
                what: format!(
                    "{}: granary / {} {}",
                    job.name(),
                    job.baseline(),
                    if job.rw.is_random() { "IOPS" } else { "MB/s" }
                ),
                value: v,
                bound,
                at_least: true,
            });
        }
    }
    if let Some(d) = report.peer("granary").and_then(|p| p.dram.as_ref()) {
        if let Some(v) = d.entries_per_written_block() {
            t.push(Target {
                what: "granary: index entries (and unsettled links) per written block".into(),
                value: v,
                bound: 1.0,
                at_least: false,
            });
        }
        if let Some(before) = d.entries_before {
            t.push(Target {
                what: format!("granary: index entries per unwritten block (before any write; {} blocks)", o.blocks()),
                value: before / o.blocks().max(1) as f64,
                bound: 0.001,
                at_least: false,
            });
        }
    }
    t
}

pub fn render(o: &NbdBenchOptions, report: &NbdReport) -> String {
    let mut s = format!(
        "nbd: {:.1} MiB data set ({} KiB blocks on Granary's export); {} s per job; {} (the NBD peers: ioengine=nbd over \
         loopback TCP; file: io_uring, O_DIRECT); data in {}\n",
        o.size as f64 / (1 << 20) as f64,
        o.block_size as f64 / 1024.0,
        o.secs,
        report.fio_version,
        o.dir.display()
    );
    s += &format!(
        "every peer's data set written once first ({} B sequential writes, queue depth {}); ratios: random jobs to \
         nbdkit ({}: cache=none fadvise=random), sequential jobs to file; latency: fio's total (submission to \
         completion); CPU: microseconds per IO of the server and of the whole machine (both cores, fio and the kernel \
         included)\n",
        PRECONDITION_BS,
        PRECONDITION_DEPTH,
        report.nbdkit_version.as_deref().unwrap_or("nbdkit")
    );
    s += &format!(
        "\n{:<14} {:<18} {:>8} {:>8} {:>6} {:>8} {:>8} {:>9} {:>8} {:>8}\n",
        "peer", "job", "IOPS", "MB/s", "ratio", "p50 us", "p99 us", "p99.9 us", "srv us", "host us"
    );
    let row = |peer: &str, r: &JobResult, ratio: Option<f64>| {
        format!(
            "{:<14} {:<18} {:>8.0} {:>8.1} {:>6} {:>8} {:>8} {:>9} {:>8} {:>8}\n",
            peer,
            r.name,
            r.iops(),
            r.mb_per_sec(),
            fmt_opt(ratio, 2),
            fmt_opt(r.fio.p50_us, 0),
            fmt_opt(r.fio.p99_us, 0),
            fmt_opt(r.fio.p999_us, 0),
            fmt_opt(r.server_cpu_us_per_io(), 1),
            fmt_opt(r.machine_cpu_us_per_io(), 1),
        )
    };
    for job in &o.jobs {
        for p in &report.peers {
            if let Some(r) = p.job(job) {
                s += &row(&p.peer, r, report.ratio(&p.peer, job));
            }
        }
    }
    for p in &report.peers {
        if let Some(r) = &p.precondition {
            s += &row(&p.peer, r, None);
        }
    }
    for p in &report.peers {
        if let Some(e) = &p.error {
            s += &format!("{:<14} FAILED: {}\n", p.peer, first_line(e));
        }
    }
    let dev: Vec<(&str, &JobResult)> = report
        .peers
        .iter()
        .flat_map(|p| p.precondition.iter().chain(&p.jobs).map(move |r| (p.peer.as_str(), r)))
        .filter(|(_, r)| r.device.is_some())
        .collect();
    if !dev.is_empty() {
        s += "\nGranary's device IO per fio IO and per byte fio moved (its metrics; GC's relocations included)\n";
        s += &format!(
            "{:<14} {:<18} {:>10} {:>11} {:>10} {:>11} {:>8} {:>8}\n",
            "peer", "job", "reads/IO", "writes/IO", "read B/B", "written B/B", "GC MB", "flushes"
        );
        for (peer, r) in dev {
            let (Some((rd, wr)), Some((rb, wb)), Some(d)) =
                (r.device_ios_per_io(), r.device_bytes_per_byte(), r.device)
            else {
                continue;
            };
            s += &format!(
                "{:<14} {:<18} {:>10.2} {:>11.3} {:>10.3} {:>11.3} {:>8.1} {:>8.0}\n",
                peer,
                r.name,
                rd,
                wr,
                rb,
                wb,
                d.gc_relocated_bytes / 1e6,
                d.flushes
            );
        }
    }
    let dram: Vec<(&str, &Dram)> =
        report.peers.iter().filter_map(|p| p.dram.as_ref().map(|d| (p.peer.as_str(), d))).collect();
    if !dram.is_empty() {
        s += &format!(
            "\nGranary's DRAM, the export created and nothing written -> after the preconditioning wrote all {} blocks \
             (design: {:.1} B of 8-byte index entry per block at the index's 85% occupancy; serve adds a 4-byte \
             access word per slot)\n",
            o.blocks(),
            Dram::design_entry_bytes()
        );
        s += &format!(
            "{:<14} {:>17} {:>6} {:>9} {:>13} {:>8} {:>7} {:>6} {:>10} {:>15} {:>9}\n",
            "peer",
            "index entries",
            "links",
            "per block",
            "index MiB",
            "B/block",
            "B/slot",
            "occ.",
            "+links B/b",
            "VmRSS MiB",
            "RSS B/blk"
        );
        for (peer, d) in dram {
            let mib = |b: Option<f64>| fmt_opt(b.map(|b| b / (1 << 20) as f64), 2);
            let kib = |k: Option<u64>| fmt_opt(k.map(|k| k as f64 / 1024.0), 1);
            s += &format!(
                "{:<14} {:>17} {:>6} {:>9} {:>13} {:>8} {:>7} {:>6} {:>10} {:>15} {:>9}\n",
                peer,
                format!("{} -> {}", fmt_opt(d.entries_before, 0), fmt_opt(d.entries_after, 0)),
                fmt_opt(d.links_after, 0),
                fmt_opt(d.entries_per_written_block(), 4),
                format!("{} -> {}", mib(d.index_bytes_before), mib(d.index_bytes_after)),
                fmt_opt(d.index_bytes_per_written_block(), 2),
                fmt_opt(d.index_bytes_per_slot(), 2),
                fmt_opt(d.occupancy_after, 3),
                fmt_opt(d.dram_bytes_per_written_block(), 2),
                format!("{} -> {}", kib(d.rss_before_kib), kib(d.rss_after_kib)),
                fmt_opt(d.rss_bytes_per_written_block(), 1),
            );
        }
    }
    s += &crate::report::render_targets(&targets(o, report));
    for f in report.failures() {
        s += &format!("FAILED {} (the whole message above, on stderr)\n", first_line(&f));
    }
    s
}

fn job_json(o: &NbdBenchOptions, report: &NbdReport, peer: &str, r: &JobResult) -> serde_json::Value {
    let ratio = (r.name != "precondition").then(|| report.ratio(peer, &r.job)).flatten();
    serde_json::json!({
        "job": r.name, "rw": r.job.rw.fio(), "bs": r.job.bs, "iodepth": r.job.iodepth,
        "secs": if r.name == "precondition" { None } else { Some(o.secs) },
        "iops": r.iops(), "mb_per_sec": r.mb_per_sec(), "bytes": r.fio.io_bytes, "ios": r.fio.total_ios,
        "runtime_ms": r.fio.runtime_ms, "wall_secs": r.wall_secs,
        "lat_us": {"mean": r.fio.mean_us, "p50": r.fio.p50_us, "p99": r.fio.p99_us, "p999": r.fio.p999_us,
                   "max": r.fio.max_us},
        "ratio": ratio, "ratio_to": (r.name != "precondition").then(|| r.job.baseline()),
        "server_cpu_secs": r.server_cpu_secs, "server_cpu_us_per_io": r.server_cpu_us_per_io(),
        "fio_cpu_secs": r.fio_cpu_secs, "fio_cpu_us_per_io": r.fio_cpu_us_per_io(),
        "machine_busy_secs": r.machine_busy_secs, "machine_cpu_us_per_io": r.machine_cpu_us_per_io(),
        "device": r.device.map(|d| serde_json::json!({
            "reads": d.reads, "writes": d.writes, "flushes": d.flushes, "read_bytes": d.read_bytes,
            "written_bytes": d.written_bytes, "gc_relocated_bytes": d.gc_relocated_bytes,
            "reads_per_io": r.device_ios_per_io().map(|x| x.0), "writes_per_io": r.device_ios_per_io().map(|x| x.1),
            "read_bytes_per_byte": r.device_bytes_per_byte().map(|x| x.0),
            "written_bytes_per_byte": r.device_bytes_per_byte().map(|x| x.1),
        })),
    })
}

pub fn to_json(o: &NbdBenchOptions, report: &NbdReport) -> serde_json::Value {
    serde_json::json!({
        "benchmark": "nbd",
        "fio": report.fio_version, "nbdkit": report.nbdkit_version,
        "size": o.size, "block_bytes": o.block_size, "blocks": o.blocks(), "secs": o.secs,
        "granary_store_size": o.store_size(),
        "precondition": {"rw": "write", "bs": PRECONDITION_BS, "iodepth": PRECONDITION_DEPTH},
        "jobs": o.jobs.iter().map(Job::name).collect::<Vec<_>>(),
        "peers": report.peers.iter().map(|p| serde_json::json!({
            "peer": p.peer,
            "precondition": p.precondition.as_ref().map(|r| job_json(o, report, &p.peer, r)),
            "jobs": p.jobs.iter().map(|r| job_json(o, report, &p.peer, r)).collect::<Vec<_>>(),
            "dram": p.dram.as_ref().map(|d| serde_json::json!({
                "blocks_written": d.blocks_written,
                "index_entries_before": d.entries_before, "index_entries_after": d.entries_after,
                "index_entries_per_written_block": d.entries_per_written_block(),
                "index_bytes_before": d.index_bytes_before, "index_bytes_after": d.index_bytes_after,
                "index_bytes_per_written_block": d.index_bytes_per_written_block(),
                "index_slots_after": d.slots_after, "index_bytes_per_slot": d.index_bytes_per_slot(),
                "index_occupancy_after": d.occupancy_after,
                "unsettled_links_after": d.links_after, "link_bytes_after": d.link_bytes_after,
                "dram_bytes_per_written_block": d.dram_bytes_per_written_block(),
                "design_entry_bytes_at_85pct": Dram::design_entry_bytes(),
                "rss_before_kib": d.rss_before_kib, "rss_after_kib": d.rss_after_kib,
                "rss_bytes_per_written_block": d.rss_bytes_per_written_block(),
            })),
            "error": p.error,
        })).collect::<Vec<_>>(),
        "targets": targets(o, report).iter().map(|t| serde_json::json!({
            "what": t.what, "value": t.value, "bound": t.bound, "at_least": t.at_least, "met": t.met(),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// fio 3.33's stdout for `fio --name=randread-4k-qd32 --ioengine=nbd
    /// --uri=nbd://127.0.0.1:21002/disk --rw=randread --bs=4k --iodepth=32
    /// --size=64M --time_based --runtime=300ms --norandommap --randrepeat=0
    /// --lat_percentiles=1 --percentile_list=50:99:99.9
    /// --output-format=json` against `granary serve` (a debug build), as
    /// captured: the NBD engine's line first, then the report.
    const NBD_RANDREAD: &str = r#"fio: connected to NBD server
{
  "fio version" : "fio-3.33",
  "timestamp" : 1795658389,
  "timestamp_ms" : 1795658389076,
  "time" : "Thu Nov 26 01:59:49 2026",
  "jobs" : [
    {
      "jobname" : "randread-4k-qd32",
      "groupid" : 0,
      "error" : 0,
      "eta" : 2147483647,
      "elapsed" : 1,
      "job options" : {
        "name" : "randread-4k-qd32",
        "ioengine" : "nbd",
        "uri" : "nbd://127.0.0.1:21002/disk",
        "rw" : "randread",
        "bs" : "4k",
        "iodepth" : "32",
        "size" : "64M",
        "runtime" : "300ms",
        "randrepeat" : "0",
        "lat_percentiles" : "1",
        "percentile_list" : "50:99:99.9"
      },
      "read" : {
        "io_bytes" : 13307904,
        "io_kbytes" : 12996,
        "bw_bytes" : 44065907,
        "bw" : 43033,
        "iops" : 10758.278146,
        "runtime" : 302,
        "total_ios" : 3249,
        "short_ios" : 0,
        "drop_ios" : 0,
        "slat_ns" : {
          "min" : 1051,
          "max" : 1305084,
          "mean" : 8154.846722,
          "stddev" : 41669.232567,
          "N" : 3249
        },
        "clat_ns" : {
          "min" : 186116,
          "max" : 14680974,
          "mean" : 2952741.592182,
          "stddev" : 1920622.827108,
          "N" : 3249,
          "percentile" : {
            "50.000000" : 2113536,
            "99.000000" : 10158080,
            "99.900000" : 12779520
          }
        },
        "lat_ns" : {
          "min" : 444069,
          "max" : 14689327,
          "mean" : 2960896.438904,
          "stddev" : 1922354.299756,
          "N" : 3249,
          "percentile" : {
            "50.000000" : 2113536,
            "99.000000" : 10158080,
            "99.900000" : 12779520
          }
        },
        "bw_min" : 0,
        "bw_max" : 0,
        "bw_agg" : 0.000000,
        "bw_mean" : 0.000000,
        "bw_dev" : 0.000000,
        "bw_samples" : 0,
        "iops_min" : 0,
        "iops_max" : 0,
        "iops_mean" : 0.000000,
        "iops_stddev" : 0.000000,
        "iops_samples" : 0
      },
      "write" : {
        "io_bytes" : 0,
        "io_kbytes" : 0,
        "bw_bytes" : 0,
        "bw" : 0,
        "iops" : 0.000000,
        "runtime" : 0,
        "total_ios" : 0,
        "short_ios" : 0,
        "drop_ios" : 0,
        "slat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        },
        "clat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        },
        "lat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        },
        "bw_min" : 0,
        "bw_max" : 0,
        "bw_agg" : 0.000000,
        "bw_mean" : 0.000000,
        "bw_dev" : 0.000000,
        "bw_samples" : 0,
        "iops_min" : 0,
        "iops_max" : 0,
        "iops_mean" : 0.000000,
        "iops_stddev" : 0.000000,
        "iops_samples" : 0
      },
      "trim" : {
        "io_bytes" : 0,
        "io_kbytes" : 0,
        "bw_bytes" : 0,
        "bw" : 0,
        "iops" : 0.000000,
        "runtime" : 0,
        "total_ios" : 0,
        "short_ios" : 0,
        "drop_ios" : 0,
        "slat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        },
        "clat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        },
        "lat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        },
        "bw_min" : 0,
        "bw_max" : 0,
        "bw_agg" : 0.000000,
        "bw_mean" : 0.000000,
        "bw_dev" : 0.000000,
        "bw_samples" : 0,
        "iops_min" : 0,
        "iops_max" : 0,
        "iops_mean" : 0.000000,
        "iops_stddev" : 0.000000,
        "iops_samples" : 0
      },
      "sync" : {
        "total_ios" : 0,
        "lat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        }
      },
      "job_runtime" : 301,
      "usr_cpu" : 3.986711,
      "sys_cpu" : 7.308970,
      "ctx" : 259,
      "majf" : 0,
      "minf" : 73,
      "iodepth_level" : {
        "1" : 0.100000,
        "2" : 0.100000,
        "4" : 0.123115,
        "8" : 0.246230,
        "16" : 0.492459,
        "32" : 99.045860,
        ">=64" : 0.000000
      },
      "latency_depth" : 32,
      "latency_target" : 0,
      "latency_percentile" : 100.000000,
      "latency_window" : 0
    }
  ]
}
"#;

    /// fio 3.33's `--output` file for `--name=write-1m-qd8 --filename=f.dat
    /// --ioengine=io_uring --direct=1 --rw=write --bs=1m --iodepth=8
    /// --size=64M --time_based --runtime=300ms` with `lat_percentiles`
    /// left out (fio's default: completion latency percentiles only), the
    /// read and trim sections and the histograms cut.
    const FILE_WRITE: &str = r#"{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "write-1m-qd8",
      "groupid" : 0,
      "error" : 0,
      "read" : { "io_bytes" : 0, "bw_bytes" : 0, "iops" : 0.000000, "runtime" : 0, "total_ios" : 0,
                 "lat_ns" : { "min" : 0, "max" : 0, "mean" : 0.000000, "stddev" : 0.000000, "N" : 0 } },
      "write" : {
        "io_bytes" : 633339904,
        "io_kbytes" : 618496,
        "bw_bytes" : 2090230706,
        "bw" : 2041240,
        "iops" : 1993.399340,
        "runtime" : 303,
        "total_ios" : 604,
        "short_ios" : 0,
        "drop_ios" : 0,
        "clat_ns" : {
          "min" : 839874,
          "max" : 9185347,
          "mean" : 3921870.877483,
          "stddev" : 902443.774379,
          "N" : 604,
          "percentile" : {
            "50.000000" : 3719168,
            "99.000000" : 7634944,
            "99.900000" : 9240576
          }
        },
        "lat_ns" : {
          "min" : 958250,
          "max" : 9238035,
          "mean" : 3995105.872517,
          "stddev" : 903901.836619,
          "N" : 604
        }
      },
      "job_runtime" : 302,
      "usr_cpu" : 6.953642,
      "sys_cpu" : 8.940397,
      "ctx" : 536
    }
  ],
  "disk_util" : [ { "name" : "vda", "read_ios" : 0, "write_ios" : 418, "util" : 54.098361 } ]
}
"#;

    #[test]
    fn parses_fio_json_after_the_nbd_engines_line() {
        let jobs = parse_fio_json(NBD_RANDREAD).unwrap();
        assert_eq!(jobs.len(), 1);
        let j = &jobs[0];
        assert_eq!((j.name.as_str(), j.error, j.job_runtime_ms), ("randread-4k-qd32", 0, 301));
        assert_eq!(
            j.read,
            FioDir {
                io_bytes: 13307904,
                total_ios: 3249,
                iops: 10758.278146,
                bw_bytes: 44065907.0,
                runtime_ms: 302,
                mean_us: 2960.896438904,
                p50_us: Some(2113.536),
                p99_us: Some(10158.08),
                p999_us: Some(12779.52),
                max_us: 14689.327,
            }
        );
        assert_eq!(j.write.total_ios, 0);
        assert_eq!(j.write.p50_us, None, "no percentiles without IO");
        let randread = Job::parse("randread-4k-qd32").unwrap();
        assert_eq!(j.dir(randread.rw).iops, 10758.278146);
        assert!((j.cpu_secs() - (3.986711 + 7.308970) / 100.0 * 0.301).abs() < 1e-9);
    }

    #[test]
    fn falls_back_to_completion_latency_percentiles() {
        let j = &parse_fio_json(FILE_WRITE).unwrap()[0];
        let w = j.dir(Rw::Write);
        assert_eq!((w.total_ios, w.runtime_ms, w.bw_bytes), (604, 303, 2090230706.0));
        assert_eq!((w.p50_us, w.p99_us, w.p999_us), (Some(3719.168), Some(7634.944), Some(9240.576)));
        assert!((w.mean_us - 3921.870877483).abs() < 1e-9, "clat's mean with clat's percentiles");
        assert_eq!(j.dir(Rw::Read).total_ios, 0);
    }

    #[test]
    fn fio_output_without_json_or_jobs_is_an_error() {
        assert!(parse_fio_json("fio: connected to NBD server\nfio: pid=1, err=5/file:io_u.c\n").is_err());
        assert!(parse_fio_json("{\"fio version\" : \"fio-3.33\"}").unwrap_err().contains("no jobs"));
        assert!(parse_fio_json("{\"jobs\": [{\"jobname\": \"x\"}]}").unwrap_err().contains("x: read"));
        let failed = r#"{"jobs": [{"jobname": "x", "error": 5,
            "read": {"io_bytes": 0, "bw_bytes": 0, "iops": 0, "runtime": 0, "total_ios": 0},
            "write": {"io_bytes": 0, "bw_bytes": 0, "iops": 0, "runtime": 0, "total_ios": 0}}]}"#;
        assert_eq!(parse_fio_json(failed).unwrap()[0].error, 5);
    }

    #[test]
    fn jobs_parse_and_print_their_names() {
        for name in DEFAULT_JOBS {
            assert_eq!(Job::parse(name).unwrap().name(), name);
        }
        assert_eq!(Job::parse("RandWrite-64K-QD4").unwrap(), Job { rw: Rw::RandWrite, bs: 65536, iodepth: 4 });
        assert_eq!(Job::parse("read-1536-qd2").unwrap().name(), "read-1536-qd2");
        assert_eq!(Job::parse("randread-4k-qd32").unwrap().baseline(), "nbdkit");
        assert_eq!(Job::parse("write-1m-qd8").unwrap().baseline(), "file");
        for bad in
            ["randread-4k", "trim-4k-qd1", "read-4x-qd1", "read-100-qd1", "read-64m-qd1", "read-4k-qd0", "read-4k-32"]
        {
            assert!(Job::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn options_are_checked() {
        let o = NbdBenchOptions::default();
        assert!(o.check().is_ok());
        assert_eq!(o.store_size(), (2 << 30) + (256 << 20));
        assert_eq!(o.blocks(), 262144);
        assert!(NbdBenchOptions { size: 10 << 20, ..o.clone() }.check().is_err());
        assert!(NbdBenchOptions { size: (64 << 20) + 4096, ..o.clone() }.check().is_err());
        assert!(NbdBenchOptions { secs: 0.0, ..o.clone() }.check().is_err());
        assert!(NbdBenchOptions { block_size: 3000, ..o.clone() }.check().is_err());
        assert!(NbdBenchOptions { block_size: 128 << 10, ..o.clone() }.check().is_err());
        assert_eq!(NbdBenchOptions { block_size: 64 << 10, ..o.clone() }.blocks(), 16384);
        let e = NbdBenchOptions { peers: vec!["qemu-nbd".into()], ..o.clone() }.check().unwrap_err();
        assert!(e.contains("unknown peer \"qemu-nbd\""), "{e}");
    }

    #[test]
    fn prometheus_samples() {
        let page = "# HELP granary_index_entries Index entries.\n# TYPE granary_index_entries gauge\n\
                    granary_index_entries 16368\ngranary_index_entries_x 1\ngranary_index_memory_bytes 294144\n";
        assert_eq!(sample(page, "granary_index_entries"), Some(16368.0));
        assert_eq!(sample(page, "granary_index_memory_bytes"), Some(294144.0));
        assert_eq!(sample(page, "granary_index_slots"), None);
        let dev = "granary_device_operations_total{op=\"read\"} 111\n\
                   granary_device_operations_total{op=\"write\"} 1041\n\
                   granary_device_operations_total{op=\"flush\"} 2\n\
                   granary_device_bytes_total{dir=\"read\"} 106496\n\
                   granary_device_bytes_total{dir=\"written\"} 75772416\n\
                   granary_gc_relocated_bytes_total 0\n";
        let d = DeviceIo::from_page(dev).unwrap();
        assert_eq!(
            (d.reads, d.writes, d.flushes, d.read_bytes, d.written_bytes),
            (111.0, 1041.0, 2.0, 106496.0, 75772416.0)
        );
        let later = DeviceIo { reads: 1111.0, written_bytes: 75772416.0 + 4096.0, ..d };
        let g = later.since(d);
        assert_eq!((g.reads, g.writes, g.written_bytes), (1000.0, 0.0, 4096.0));
        assert!(DeviceIo::from_page(page).is_none(), "no device counters");
    }

    fn result(name: &str, iops: f64, bw: f64, ios: u64) -> JobResult {
        let job = Job::parse(name).unwrap();
        JobResult {
            name: name.into(),
            job,
            fio: FioDir { iops, bw_bytes: bw, total_ios: ios, p50_us: Some(100.0), ..Default::default() },
            fio_cpu_secs: 0.5,
            server_cpu_secs: Some(1.0),
            machine_busy_secs: Some(2.0),
            wall_secs: 1.0,
            device: None,
        }
    }

    #[test]
    fn ratios_and_targets_compare_the_named_peers() {
        let o = NbdBenchOptions {
            jobs: ["randread-4k-qd32", "randwrite-4k-qd32", "randread-4k-qd1", "write-1m-qd8"]
                .iter()
                .map(|j| Job::parse(j).unwrap())
                .collect(),
            size: 64 << 20,
            ..Default::default()
        };
        let peer = |name: &str, k: f64, dram: Option<Dram>| PeerResult {
            peer: name.into(),
            jobs: vec![
                result("randread-4k-qd32", 1000.0 * k, 4096e3 * k, 1000),
                result("randwrite-4k-qd32", 500.0 * k, 2048e3 * k, 500),
                result("randread-4k-qd1", 100.0 * k, 409.6e3 * k, 100),
                result("write-1m-qd8", 100.0 * k, 104.8576e6 * k, 100),
            ],
            dram,
            ..Default::default()
        };
        let dram = Dram {
            blocks_written: 16384,
            entries_before: Some(2.0),
            entries_after: Some(16386.0),
            index_bytes_before: Some(12288.0),
            index_bytes_after: Some(294144.0),
            slots_after: Some(24448.0),
            occupancy_after: Some(0.67),
            links_after: Some(0.0),
            link_bytes_after: Some(0.0),
            rss_before_kib: Some(10_000),
            rss_after_kib: Some(10_400),
        };
        let report = NbdReport {
            peers: vec![peer("granary", 1.2, Some(dram)), peer("nbdkit", 1.0, None), peer("file", 1.6, None)],
            ..Default::default()
        };
        let rr = Job::parse("randread-4k-qd32").unwrap();
        assert!((report.ratio("granary", &rr).unwrap() - 1.2).abs() < 1e-9);
        assert!((report.ratio("file", &Job::parse("write-1m-qd8").unwrap()).unwrap() - 1.0).abs() < 1e-9);
        let t = targets(&o, &report);
        let find = |s: &str| t.iter().find(|t| t.what.contains(s)).unwrap_or_else(|| panic!("{s}: {t:?}"));
        assert!(find("randread-4k-qd32: granary / nbdkit IOPS").met());
        assert!(find("randwrite-4k-qd32: granary / nbdkit IOPS").met());
        let w = find("write-1m-qd8: granary / file MB/s");
        assert!((w.value - 0.75).abs() < 1e-9 && !w.met(), "{w:?}");
        assert!(t.iter().all(|t| !t.what.contains("qd1")), "no target at queue depth 1");
        assert!(find("unsettled links) per written block").met());
        // A block displaced by a blind overwrite (a fingerprint collision)
        // is held by a link until it is settled: it counts as its entry.
        let mut linked = report.clone();
        let d = linked.peers[0].dram.as_mut().unwrap();
        (d.entries_after, d.links_after, d.link_bytes_after) = (Some(16375.0), Some(11.0), Some(2002.0));
        assert_eq!(d.entries_per_written_block(), Some(1.0));
        assert!((d.dram_bytes_per_written_block().unwrap() - (294144.0 + 2002.0) / 16384.0).abs() < 1e-9);
        // Two entries before any write (the store's own), not one per block.
        assert!(find("per unwritten block").met());
        let mut full = report.clone();
        full.peers[0].dram.as_mut().unwrap().entries_before = Some(16384.0);
        let t2 = targets(&o, &full);
        assert!(!t2.iter().find(|t| t.what.contains("per unwritten block")).unwrap().met());
        let d = report.peer("granary").unwrap().dram.as_ref().unwrap();
        assert!((d.index_bytes_per_written_block().unwrap() - 294144.0 / 16384.0).abs() < 1e-9);
        assert!((d.index_bytes_per_slot().unwrap() - 294144.0 / 24448.0).abs() < 1e-9);
        assert!((d.rss_bytes_per_written_block().unwrap() - 400.0 * 1024.0 / 16384.0).abs() < 1e-9);
        let r = &report.peers[0].jobs[0];
        assert_eq!((r.server_cpu_us_per_io(), r.machine_cpu_us_per_io()), (Some(1000.0), Some(2000.0)));
        let text = render(&o, &report);
        assert!(text.contains("MISSED") && text.contains("met") && text.contains("randwrite-4k-qd32"), "{text}");
        let v = to_json(&o, &report);
        assert_eq!(v["targets"].as_array().unwrap().len(), t.len());
        assert_eq!(v["peers"][0]["jobs"][0]["ratio_to"], "nbdkit");
        assert_eq!(v["peers"][0]["dram"]["index_entries_per_written_block"], 1.0);
    }
}
