//! `granary-bench memcache`: a Memcache load generator, and the comparison
//! of `granary serve` with memcached (DRAM) and memcached with extstore on
//! the same disk, in one run.
//!
//! For each peer the benchmark starts the server as a child process on a
//! free loopback port (`granary serve` from this executable; `memcached`
//! from PATH), loads every key once, then drives it for a fixed time with N
//! connections (one thread each): GETs and SETs in the given ratio, keys
//! uniform or zipfian, values of a fixed size. Closed loop (each connection
//! sends its next request when the previous reply arrives) or open loop (a
//! fixed request rate; latency counted from the intended send time, so a
//! slow server cannot hide its queueing). Latencies go to HDR histograms.
//! Optionally `memcaslap` (libmemcached-tools) drives each peer too, as an
//! independent client. Results: a table with ratios to memcached, and JSON.
//!
//! `extstore-capped` is extstore run in a memory cgroup of `--memory-mib`
//! plus [`CGROUP_SLACK_MIB`]: the page cache of its file is charged to the
//! cgroup, so its reads go to the disk once the memory it was given is
//! full, as Granary's (direct IO) always do. Plain `extstore` may keep its
//! whole file in the machine's page cache.
//!
//! Besides each server's own CPU, the benchmark reads the whole machine's
//! busy CPU time (`/proc/stat`) over each measured phase: on a machine
//! whose cores the client shares with the server, that total per operation
//! is what throughput is made of. With the device reference (on unless
//! `--no-device-ref`), it also measures, with fio on a file in `--dir`, the
//! machine's CPU per 4 KiB direct random read, and prints the *ceiling*
//! that cost puts on a server that reads the device for every GET and is
//! otherwise as cheap as memcached: memcached's machine CPU per operation
//! divided by that plus one device read per GET.

use crate::child::{cpu_secs, parse_status_kib, tail, ChildServer};
use granary_store::loadgen;
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Memory a capped peer's cgroup allows beyond `--memory-mib`: memcached's
/// hash table, connection buffers and thread stacks, outside its `-m`.
pub const CGROUP_SLACK_MIB: u64 = 64;

/// How keys are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDist {
    Uniform,
    /// Zipfian with this exponent (YCSB uses 0.99).
    Zipf(f64),
}

#[derive(Debug, Clone)]
pub struct McBenchOptions {
    /// Peers to measure: granary, memcached, extstore, extstore-capped
    /// (started here), or `at=IP:PORT` (a server already running).
    pub peers: Vec<String>,
    pub conns: usize,
    pub keys: u64,
    pub value_bytes: usize,
    /// Percent of requests that are GETs.
    pub get_percent: u32,
    pub dist: KeyDist,
    pub secs: f64,
    /// Open loop: total requests per second (None: closed loop).
    pub rate: Option<f64>,
    /// Memory given to memcached and to memcached+extstore (MiB).
    pub memory_mib: u64,
    /// Granary's DRAM tier (its `-m`, MiB); None: a tenth of the data set
    /// ([`McBenchOptions::granary_dram_mib`]).
    pub granary_mib: Option<u64>,
    /// Size of Granary's data file and of extstore's file.
    pub disk_bytes: u64,
    /// Where the data files go (on the disk under test).
    pub dir: PathBuf,
    /// Server threads of every peer.
    pub server_threads: usize,
    /// Also run memcaslap against each peer.
    pub memcaslap: bool,
    /// Measure the machine's CPU per device read with fio (see the module doc).
    pub device_ref: bool,
    pub seed: u64,
}

impl Default for McBenchOptions {
    fn default() -> Self {
        McBenchOptions {
            peers: vec!["memcached".into(), "extstore".into(), "granary".into()],
            conns: 32,
            keys: 200_000,
            value_bytes: 1024,
            get_percent: 90,
            dist: KeyDist::Uniform,
            secs: 10.0,
            rate: None,
            memory_mib: 1024,
            granary_mib: None,
            disk_bytes: 4 << 30,
            dir: PathBuf::from("granary-data"),
            server_threads: 2,
            memcaslap: true,
            device_ref: true,
            seed: 1,
        }
    }
}

impl McBenchOptions {
    /// The `-m` Granary is given: as asked, else a tenth of the data set
    /// (keys and values), rounded up to a MiB.
    pub fn granary_dram_mib(&self) -> u64 {
        self.granary_mib.unwrap_or_else(|| {
            let data = self.keys.saturating_mul(key(0).len() as u64 + self.value_bytes as u64);
            (data / 10).div_ceil(1 << 20).max(1)
        })
    }
}

/// One peer's results.
#[derive(Debug, Clone, Default)]
pub struct PeerResult {
    pub peer: String,
    pub ops: u64,
    pub secs: f64,
    pub gets: u64,
    pub hits: u64,
    pub errors: u64,
    /// Latency percentiles in microseconds: p50, p99, p99.9, max.
    pub get_us: [f64; 4],
    pub set_us: [f64; 4],
    pub load_secs: f64,
    /// memcaslap's ops/s, when it ran.
    pub memcaslap_ops: Option<f64>,
    /// CPU time (user + system, all its threads) the server process spent
    /// per operation of the measured phase, in microseconds; for servers
    /// this run started (not `at=` peers). Interrupts and softirqs are
    /// charged to whichever task the CPU was running, so this is an
    /// approximation; on a machine shared with the client it is steadier
    /// than throughput.
    pub server_cpu_us_per_op: Option<f64>,
    /// The server's context switches (voluntary and not, all threads) per
    /// operation over the measured phase.
    pub server_switches_per_op: Option<f64>,
    /// The whole machine's busy CPU time (every core: client, server,
    /// kernel, interrupts; `/proc/stat`) per operation of the measured
    /// phase, in microseconds.
    pub machine_cpu_us_per_op: Option<f64>,
    /// The server's peak resident memory (VmHWM) at the end of the measured
    /// phase, MiB; and, for a capped peer, the peak its cgroup was charged
    /// (resident memory plus the page cache of its files), MiB.
    pub server_peak_rss_mib: Option<f64>,
    pub cgroup_peak_mib: Option<f64>,
    /// Granary's DRAM tier over the measured phase: the share of GETs it
    /// served (`granary_dram_hits` over hits and misses, from `stats`);
    /// None for peers without one.
    pub dram_hit_ratio: Option<f64>,
}

impl PeerResult {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }
    pub fn hit_ratio(&self) -> f64 {
        self.hits as f64 / self.gets.max(1) as f64
    }
}

/// Zipfian ranks ([`loadgen::Zipf`]) scattered over the key space.
struct Zipf(loadgen::Zipf);

impl Zipf {
    fn new(n: u64, theta: f64) -> Zipf {
        Zipf(loadgen::Zipf::new(n, theta))
    }

    fn sample(&self, u: f64) -> u64 {
        // Scatter ranks so hot keys are not neighbours (a multiplicative
        // hash of the rank, not a generator).
        self.0.rank(u).wrapping_mul(0x9E37_79B9_7F4A_7C15) % self.0.n()
    }
}

fn key(i: u64) -> String {
    format!("bench:{i:012}")
}

/// A started server, killed on drop, its files removed (or one already
/// running: no child).
struct Peer {
    /// The process, its files and the log its stderr goes to.
    server: ChildServer,
    addr: SocketAddr,
    /// Its memory cgroup, removed after the process (field order: dropped
    /// after `server` has killed and reaped the child).
    cgroup: Option<MemCgroup>,
}

/// A memory cgroup (v1 `memory` hierarchy, or v2 with the memory
/// controller) that limits a peer and the page cache it fills.
pub(crate) struct MemCgroup {
    dir: PathBuf,
    /// The peak-usage file: v1 `memory.max_usage_in_bytes`, v2 `memory.peak`.
    peak: &'static str,
}

impl MemCgroup {
    pub(crate) fn create(name: &str, bytes: u64) -> Result<MemCgroup, String> {
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let v2 = Path::new("/sys/fs/cgroup");
        let (root, limit, peak) = if v1.join("memory.limit_in_bytes").exists() || v1.join("cgroup.procs").exists() {
            (v1, "memory.limit_in_bytes", "memory.max_usage_in_bytes")
        } else if std::fs::read_to_string(v2.join("cgroup.controllers")).is_ok_and(|c| c.contains("memory")) {
            // The children of the root get the controller only once the
            // root's subtree_control enables it.
            let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+memory");
            (v2, "memory.max", "memory.peak")
        } else {
            return Err("extstore-capped needs a memory cgroup (cgroup v1 `memory` mounted at \
                        /sys/fs/cgroup/memory, or cgroup v2 with the memory controller)"
                .into());
        };
        let dir = root.join(format!("granary-bench-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create cgroup {}: {e} (run as root)", dir.display()))?;
        let cg = MemCgroup { dir, peak };
        std::fs::write(cg.dir.join(limit), bytes.to_string())
            .map_err(|e| format!("cannot limit cgroup {} to {bytes} bytes: {e}", cg.dir.display()))?;
        // No swap either, where the kernel accounts it (v1: memory + swap
        // no more than the memory limit, set after it; v2: no swap).
        let (swap, value) = if root == v1 {
            ("memory.memsw.limit_in_bytes", bytes.to_string())
        } else {
            ("memory.swap.max", "0".into())
        };
        if cg.dir.join(swap).exists() {
            std::fs::write(cg.dir.join(swap), &value)
                .map_err(|e| format!("cannot set {swap} of cgroup {} to {value}: {e}", cg.dir.display()))?;
        }
        Ok(cg)
    }

    /// Its `cgroup.procs`, as a C string for the child to write before exec.
    pub(crate) fn procs(&self) -> Result<std::ffi::CString, String> {
        std::ffi::CString::new(self.dir.join("cgroup.procs").into_os_string().into_encoded_bytes())
            .map_err(|e| e.to_string())
    }

    /// The peak charge, or (kernels before 5.19 have no v2 `memory.peak`)
    /// the charge now.
    pub(crate) fn peak_mib(&self) -> Option<f64> {
        let read = |f: &str| -> Option<u64> { std::fs::read_to_string(self.dir.join(f)).ok()?.trim().parse().ok() };
        let now = if self.peak == "memory.peak" { "memory.current" } else { "memory.usage_in_bytes" };
        let b = read(self.peak).or_else(|| read(now))?;
        Some(b as f64 / (1 << 20) as f64)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // Empty once its process is reaped; the page cache it was charged
        // moves to the parent.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Put the calling process in the cgroup whose `cgroup.procs` is `procs`:
/// for `pre_exec`, so only async-signal-safe calls (open, write, close).
pub(crate) fn join_cgroup(procs: &std::ffi::CStr) -> std::io::Result<()> {
    // SAFETY: open with a NUL-terminated path and constant flags.
    let fd = unsafe { libc::open(procs.as_ptr(), libc::O_WRONLY) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // "0" names the writing process itself (v1 and v2).
    // SAFETY: write of a 1-byte static buffer to the fd just opened.
    let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
    let err = std::io::Error::last_os_error();
    // SAFETY: close of the fd this function opened.
    unsafe { libc::close(fd) };
    if n == 1 {
        Ok(())
    } else {
        Err(err)
    }
}

/// Peak resident memory (VmHWM) of process `pid`, MiB.
fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(parse_status_kib(&status, "VmHWM")? as f64 / 1024.0)
}

impl Peer {
    /// `e`, with the last lines of the server's log when there is one.
    fn failed(&self, name: &str, e: String) -> String {
        let Some(log) = &self.server.log else { return format!("{name}: {e}") };
        format!("{name}: {e}\n{name}'s log {} ends:\n{}", log.display(), tail(log, 20))
    }
}

/// Busy CPU seconds of the whole machine so far, all cores (`/proc/stat`).
pub fn machine_busy_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    parse_busy_ticks(&stat).map(|t| t as f64 / hz.max(1) as f64)
}

/// Busy ticks of the first (`cpu `, all cores) line of a `/proc/stat` text:
/// user + nice + system + irq + softirq. Idle, iowait and steal (time the
/// hypervisor gave to others) are not this machine's work; guest time is
/// already inside user.
fn parse_busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let at = |i: usize| f.get(i).copied();
    Some(at(0)? + at(1)? + at(2)? + at(5)? + at(6)?)
}

/// The machine's CPU cost of one 4 KiB direct random read, measured with
/// fio (io_uring, queue depth [`DEVICE_REF_DEPTH`]) on a file in the data
/// directory, fio's own user-space time left out: the part of a GET no
/// server that reads the device can avoid (submission, the virtual disk's
/// doorbell and interrupt, completion).
#[derive(Debug, Clone, Copy)]
pub struct DeviceRef {
    pub reads_per_sec: f64,
    pub machine_cpu_us_per_read: f64,
}

/// Queue depth of the device reference: about the reads a 32-connection
/// closed loop keeps in flight.
pub const DEVICE_REF_DEPTH: usize = 32;
/// Size of the device reference's file.
pub const DEVICE_REF_FILE_BYTES: u64 = 1 << 30;
/// Seconds of the device reference's random reads.
pub const DEVICE_REF_SECS: u64 = 5;

/// Run the device reference (fio, installed when missing) on a new file
/// in `dir`, removed afterwards.
pub fn device_ref(dir: &Path) -> Result<DeviceRef, String> {
    crate::device::ensure_fio()?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join("bench-memcache-fio.db");
    struct Remove<'a>(&'a Path);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _remove = Remove(&path);
    crate::device::fill_with_fio(&path, DEVICE_REF_FILE_BYTES)?;
    let busy0 = machine_busy_secs().ok_or("cannot read /proc/stat")?;
    let v = crate::device::fio_json(
        &path,
        &[
            "--name=granary-read-cost",
            "--rw=randread",
            "--bs=4k",
            &format!("--iodepth={DEVICE_REF_DEPTH}"),
            &format!("--size={DEVICE_REF_FILE_BYTES}"),
            &format!("--runtime={DEVICE_REF_SECS}"),
            "--time_based",
            "--randrepeat=0",
            "--norandommap",
        ],
    )?;
    let busy = machine_busy_secs().ok_or("cannot read /proc/stat")? - busy0;
    let job = &v["jobs"][0];
    let read = &job["read"];
    let ios = read["total_ios"].as_u64().filter(|&n| n > 0).ok_or("fio reported no reads")?;
    let secs = read["runtime"].as_f64().unwrap_or(0.0) / 1000.0;
    // fio's own user-space time is not part of a read's cost: left out.
    let fio_user = job["usr_cpu"].as_f64().unwrap_or(0.0) / 100.0 * secs;
    Ok(DeviceRef {
        reads_per_sec: ios as f64 / secs.max(1e-9),
        machine_cpu_us_per_read: (busy - fio_user).max(0.0) * 1e6 / ios as f64,
    })
}

/// The throughput ratio to memcached that a server reading the device once
/// per GET cannot pass on a machine whose CPU is the bound, if it is
/// otherwise exactly as cheap as memcached: memcached's machine CPU per
/// operation `m_us`, over that plus the device read's `read_us` on the
/// `get_share` of operations that are GETs.
pub fn ceiling(m_us: f64, read_us: f64, get_share: f64) -> f64 {
    m_us / (m_us + read_us * get_share)
}

/// Context switches of process `pid` so far, voluntary and involuntary,
/// summed over its threads (`/proc/PID/task/*/status`).
fn switches(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut n = 0;
    for t in tasks.flatten() {
        // A thread that ended meanwhile has no status: skip it.
        if let Ok(status) = std::fs::read_to_string(t.path().join("status")) {
            n += parse_switches(&status)?;
        }
    }
    Some(n)
}

/// `voluntary_ctxt_switches` + `nonvoluntary_ctxt_switches` of a
/// `/proc/PID/status` text; None if either is missing.
fn parse_switches(status: &str) -> Option<u64> {
    let field =
        |name: &str| status.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse::<u64>().ok());
    Some(field("voluntary_ctxt_switches")? + field("nonvoluntary_ctxt_switches")?)
}

/// The `granary` binary the Granary peer runs: `GRANARY_BIN` if set, else
/// the `granary` built beside this benchmark's own binary (cargo puts both
/// in one folder), else the one on PATH.
pub(crate) fn granary_exe() -> Result<std::path::PathBuf, String> {
    if let Some(p) = std::env::var_os("GRANARY_BIN") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let beside = exe.with_file_name("granary");
    if beside.is_file() {
        return Ok(beside);
    }
    which("granary").ok_or_else(|| {
        format!(
            "no `granary` binary beside {} nor on PATH: build it (cargo build --release -p granary-cli) or set GRANARY_BIN",
            exe.display()
        )
    })
}

fn free_port() -> Result<u16, String> {
    granary_rt::net::free_low_port().map_err(|e| format!("no free port: {e}"))
}

fn start_peer(name: &str, o: &McBenchOptions) -> Result<Peer, String> {
    if let Some(a) = name.strip_prefix("at=") {
        let addr: SocketAddr = a.parse().map_err(|e| format!("peer {name:?}: {e} (at=IP:PORT)"))?;
        TcpStream::connect(addr).map_err(|e| format!("peer {name:?}: cannot connect: {e}"))?;
        return Ok(Peer { server: ChildServer::new(name, None, Vec::new(), None), addr, cgroup: None });
    }
    std::fs::create_dir_all(&o.dir).map_err(|e| format!("cannot create {}: {e}", o.dir.display()))?;
    let port = free_port()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let threads = o.server_threads.to_string();
    let mem = o.memory_mib.to_string();
    let mut cgroup = None;
    let (mut cmd, files) = match name {
        "granary" => {
            let data = o.dir.join("bench-memcache-granary.db");
            let _ = std::fs::remove_file(&data);
            let mut c = Command::new(granary_exe()?);
            c.args(["serve", "--data"]).arg(&data).args(["--size", &o.disk_bytes.to_string()]);
            c.args(["-p", &port.to_string(), "-t", &threads, "-c", "4096", "--no-native", "--no-resp"]);
            c.args(["-m", &o.granary_dram_mib().to_string()]);
            (c, vec![data])
        }
        "memcached" | "extstore" | "extstore-capped" => {
            let bin =
                crate::memcache::which("memcached").ok_or("memcached is not installed (apt-get install memcached)")?;
            let mut c = Command::new(bin);
            c.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0", "-t", &threads, "-m", &mem, "-c", "4096"]);
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } == 0 {
                c.args(["-u", "root"]);
            }
            let mut files = Vec::new();
            if name != "memcached" {
                let f = o.dir.join("bench-memcache-extstore");
                let _ = std::fs::remove_file(&f);
                let gib = (o.disk_bytes >> 30).max(1);
                // Flush items to the file as soon as possible and move slab
                // pages to the small headers left in RAM: with the defaults
                // (flush only under memory pressure, slow page moves) the
                // headers' slab class stays small and most of a dataset 4x
                // its memory is evicted (most GETs then miss; docs/BENCHMARKS.md); with
                // these it holds the whole dataset (docs/BENCHMARKS.md).
                let opts = format!(
                    "ext_path={}:{gib}G,ext_item_age=0,slab_automove=2,slab_automove_freeratio=0.05",
                    f.display()
                );
                c.args(["-o", &opts]);
                files.push(f);
            }
            if name == "extstore-capped" {
                let cg = MemCgroup::create(name, (o.memory_mib + CGROUP_SLACK_MIB) << 20)?;
                let procs = cg.procs()?;
                use std::os::unix::process::CommandExt;
                // SAFETY: the closure runs in the child between fork and
                // exec and makes only async-signal-safe calls (join_cgroup).
                unsafe { c.pre_exec(move || join_cgroup(&procs)) };
                cgroup = Some(cg);
            }
            (c, files)
        }
        other => {
            return Err(format!("unknown peer {other:?} (granary, memcached, extstore, extstore-capped, at=IP:PORT)"))
        }
    };
    // The server's own output goes to a log next to its data, kept after
    // the run (its tail is printed when the peer fails).
    let log = o.dir.join(format!("bench-memcache-{name}.log"));
    let err = std::fs::File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let child = cmd.stdout(Stdio::null()).stderr(err).spawn().map_err(|e| format!("starting {name}: {e}"))?;
    let server = ChildServer::new(name, Some(child), files, Some(log));
    let mut peer = Peer { server, addr, cgroup };
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        if let Some(Ok(Some(st))) = peer.server.child.as_mut().map(|c| c.try_wait()) {
            return Err(peer.failed(name, format!("exited at start-up: {st}")));
        }
        if Instant::now() > deadline {
            return Err(peer.failed(name, format!("did not listen on {addr} within 30 s")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = &mut peer;
    Ok(peer)
}

pub(crate) fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| std::path::Path::new(d).join(tool)).find(|p| p.is_file())
}

struct Conn {
    w: TcpStream,
    r: BufReader<TcpStream>,
    line: String,
    sink: Vec<u8>,
}

impl Conn {
    fn new(addr: SocketAddr) -> std::io::Result<Conn> {
        let w = TcpStream::connect(addr)?;
        w.set_nodelay(true)?;
        w.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Conn { r: BufReader::new(w.try_clone()?), w, line: String::new(), sink: Vec::new() })
    }

    fn read_line(&mut self) -> std::io::Result<&str> {
        self.line.clear();
        if self.r.read_line(&mut self.line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(self.line.trim_end())
    }

    /// Read a SET's reply: Ok(true) for STORED.
    fn set_reply(&mut self) -> std::io::Result<bool> {
        Ok(self.read_line()? == "STORED")
    }

    /// Read a GET's reply: Ok(hit).
    fn get_reply(&mut self) -> std::io::Result<bool> {
        let line = self.read_line()?.to_string();
        if line == "END" {
            return Ok(false);
        }
        let len: usize = line
            .strip_prefix("VALUE ")
            .and_then(|l| l.split(' ').nth(2))
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("unexpected reply {line:?}")))?;
        self.sink.resize(len + 2, 0);
        self.r.read_exact(&mut self.sink)?;
        let end = self.read_line()?;
        if end != "END" {
            return Err(std::io::Error::other(format!("unexpected reply {end:?}")));
        }
        Ok(true)
    }
}

/// memcached's transient refusal while its slab mover frees pages (seen
/// with extstore during loads that fill its memory).
const OUT_OF_MEMORY: &str = "SERVER_ERROR out of memory";

/// Retries of refused loads each loader thread may spend, in all; one
/// every [`LOAD_RETRY_PAUSE`], so a server that stays full fails the load
/// within about 20 s instead of hanging it.
const LOAD_RETRY_BUDGET: u32 = 1000;
const LOAD_RETRY_PAUSE: Duration = Duration::from_millis(20);

/// Set `k` again until the server stores it, pausing between tries, out of
/// the thread's `budget`.
fn retry_set(c: &mut Conn, k: &str, value: &[u8], budget: &mut u32) -> std::io::Result<()> {
    loop {
        if *budget == 0 {
            return Err(std::io::Error::other(format!(
                "load: {} after {LOAD_RETRY_BUDGET} retries",
                c.line.trim_end()
            )));
        }
        *budget -= 1;
        std::thread::sleep(LOAD_RETRY_PAUSE);
        let mut req = format!("set {k} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
        c.w.write_all(&req)?;
        if c.set_reply()? {
            return Ok(());
        }
        if !c.line.starts_with(OUT_OF_MEMORY) {
            return Err(std::io::Error::other(format!("load: {}", c.line.trim_end())));
        }
    }
}

/// Set every key once, `conns` connections in parallel, pipelined.
fn load(addr: SocketAddr, o: &McBenchOptions, value: &[u8]) -> Result<f64, String> {
    let t0 = Instant::now();
    let progress = std::sync::Arc::new(crate::progress::Progress::new("loading keys", o.keys, true));
    let threads: Vec<_> = (0..o.conns.min(8))
        .map(|t| {
            let (n, keys, value) = (o.conns.min(8) as u64, o.keys, value.to_vec());
            let progress = progress.clone();
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut c = Conn::new(addr)?;
                let mine: Vec<u64> = (t as u64..keys).step_by(n as usize).collect();
                let mut retry_budget = LOAD_RETRY_BUDGET;
                for batch in mine.chunks(64) {
                    let mut req = Vec::new();
                    for &i in batch {
                        req.extend_from_slice(format!("set {} 0 0 {}\r\n", key(i), value.len()).as_bytes());
                        req.extend_from_slice(&value);
                        req.extend_from_slice(b"\r\n");
                    }
                    c.w.write_all(&req)?;
                    let mut refused = Vec::new();
                    for &i in batch {
                        if !c.set_reply()? {
                            if !c.line.starts_with(OUT_OF_MEMORY) {
                                return Err(std::io::Error::other(format!("load: {}", c.line.trim_end())));
                            }
                            refused.push(i);
                        }
                    }
                    for i in refused {
                        retry_set(&mut c, &key(i), &value, &mut retry_budget)?;
                    }
                    progress.inc(batch.len() as u64);
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "loader thread panicked")?.map_err(|e| format!("load: {e}"))?;
    }
    progress.finish();
    Ok(t0.elapsed().as_secs_f64())
}

struct Measured {
    ops: u64,
    gets: u64,
    hits: u64,
    errors: u64,
    get: Histogram<u64>,
    set: Histogram<u64>,
}

/// The highest latency recorded as itself (60 s); slower replies count at it.
const LATENCY_BOUND_US: u64 = 60_000_000;

impl Measured {
    fn new() -> Measured {
        // Bounded (1 us to 60 s): `saturating_record` clamps to the bound
        // instead of resizing, and an auto-resizing histogram's first bound
        // is 2047 us, which would clamp every slower reply to 2047.
        let h = || Histogram::new_with_bounds(1, LATENCY_BOUND_US, 3).expect("histogram bounds");
        Measured { ops: 0, gets: 0, hits: 0, errors: 0, get: h(), set: h() }
    }
}

fn drive(addr: SocketAddr, o: &McBenchOptions, value: &[u8]) -> Result<(Measured, f64), String> {
    let zipf = match o.dist {
        KeyDist::Zipf(theta) => Some(std::sync::Arc::new(Zipf::new(o.keys, theta))),
        KeyDist::Uniform => None,
    };
    let start = Instant::now() + Duration::from_millis(50);
    let end = start + Duration::from_secs_f64(o.secs);
    let interval = o.rate.map(|r| Duration::from_secs_f64(o.conns as f64 / r));
    let threads: Vec<_> = (0..o.conns)
        .map(|t| {
            let (o, value, zipf) = (o.clone(), value.to_vec(), zipf.clone());
            std::thread::spawn(move || -> std::io::Result<Measured> {
                let mut c = Conn::new(addr)?;
                let mut rng = Pcg64Mcg::seed_from_u64(o.seed ^ (t as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
                let mut m = Measured::new();
                let mut req = Vec::with_capacity(value.len() + 64);
                // Sleep, not spin, to the start: the machine's CPU per
                // operation counts from before the threads start.
                if let Some(wait) = start.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                // Open loop: connections spread their sends over the
                // interval rather than sending together.
                let mut next = start + interval.map_or(Duration::ZERO, |iv| iv * t as u32 / o.conns.max(1) as u32);
                loop {
                    let sent_at = match interval {
                        Some(iv) => {
                            // Open loop: wait for the intended time; latency
                            // counts from it even if we are late.
                            let now = Instant::now();
                            if next > now {
                                std::thread::sleep(next - now);
                            }
                            let at = next;
                            next += iv;
                            at
                        }
                        None => Instant::now(),
                    };
                    if sent_at >= end {
                        break;
                    }
                    let k = match &zipf {
                        Some(z) => z.sample(rng.random()),
                        None => rng.random_range(0..o.keys),
                    };
                    let is_get = rng.random_range(0..100) < o.get_percent as u64;
                    req.clear();
                    if is_get {
                        req.extend_from_slice(format!("get {}\r\n", key(k)).as_bytes());
                        c.w.write_all(&req)?;
                        m.gets += 1;
                        if c.get_reply()? {
                            m.hits += 1;
                        }
                    } else {
                        req.extend_from_slice(format!("set {} 0 0 {}\r\n", key(k), value.len()).as_bytes());
                        req.extend_from_slice(&value);
                        req.extend_from_slice(b"\r\n");
                        c.w.write_all(&req)?;
                        if !c.set_reply()? {
                            // Refused: an error, not a served operation
                            // (neither counted nor timed).
                            m.errors += 1;
                            continue;
                        }
                    }
                    let us = sent_at.elapsed().as_micros() as u64;
                    let h = if is_get { &mut m.get } else { &mut m.set };
                    h.saturating_record(us.max(1));
                    m.ops += 1;
                }
                Ok(m)
            })
        })
        .collect();
    let mut total = Measured::new();
    let mut joined = Vec::with_capacity(threads.len());
    for t in threads {
        joined.push(t.join().map_err(|_| "client thread panicked")?.map_err(|e| format!("client: {e}"))?);
    }
    // The time the operations took: an open loop whose server falls
    // behind runs past `secs`, and its rate is what was served, not what
    // was offered.
    let secs = start.elapsed().as_secs_f64().max(o.secs);
    for m in joined {
        total.ops += m.ops;
        total.gets += m.gets;
        total.hits += m.hits;
        total.errors += m.errors;
        total.get.add(&m.get).map_err(|e| e.to_string())?;
        total.set.add(&m.set).map_err(|e| e.to_string())?;
    }
    Ok((total, secs))
}

fn pcts(h: &Histogram<u64>) -> [f64; 4] {
    if h.is_empty() {
        return [0.0; 4];
    }
    [h.value_at_quantile(0.5), h.value_at_quantile(0.99), h.value_at_quantile(0.999), h.max()].map(|v| v as f64)
}

/// memcaslap against `addr` (its default mix: 90% get, 1 KiB values,
/// 64-byte keys): ops/s.
fn memcaslap(addr: SocketAddr, o: &McBenchOptions) -> Result<f64, String> {
    let bin = which("memcaslap").ok_or("memcaslap is not installed (apt-get install libmemcached-tools)")?;
    let out = Command::new(bin)
        .args(["-s", &addr.to_string(), "-T", "2", "-c", &o.conns.to_string()])
        .args(["-t", &format!("{}s", o.secs.ceil() as u64), "-X", &o.value_bytes.to_string()])
        .output()
        .map_err(|e| format!("memcaslap: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "Run time: 10.0s Ops: 1234 TPS: 123 Net_rate: ..."
    text.lines()
        .rfind(|l| l.starts_with("Run time"))
        .and_then(|l| l.split("TPS:").nth(1))
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| format!("memcaslap printed no result:\n{text}"))
}

/// A run's results.
#[derive(Debug, Clone, Default)]
pub struct McReport {
    pub peers: Vec<PeerResult>,
    /// The device reference, when measured.
    pub device: Option<DeviceRef>,
}

impl McReport {
    /// [`ceiling`] for this run: from memcached's machine CPU per operation
    /// and the device reference, when both were measured.
    pub fn ceiling(&self, o: &McBenchOptions) -> Option<f64> {
        let m = self.peers.iter().find(|p| p.peer == "memcached")?.machine_cpu_us_per_op?;
        Some(ceiling(m, self.device?.machine_cpu_us_per_read, o.get_percent as f64 / 100.0))
    }
}

/// Run the comparison; prints progress to stderr.
pub fn run(o: &McBenchOptions) -> Result<McReport, String> {
    let peers = run_peers(o)?;
    let device = if o.device_ref {
        eprintln!(
            "bench memcache: device reference: fio, 4 KiB direct random reads at depth {DEVICE_REF_DEPTH}, {DEVICE_REF_SECS} s"
        );
        Some(device_ref(&o.dir)?)
    } else {
        None
    };
    Ok(McReport { peers, device })
}

fn run_peers(o: &McBenchOptions) -> Result<Vec<PeerResult>, String> {
    let value: Vec<u8> = (0..o.value_bytes).map(|i| b'a' + (i % 26) as u8).collect();
    let mut results = Vec::new();
    for name in &o.peers {
        eprintln!("bench memcache: {name}: starting");
        let peer = start_peer(name, o)?;
        eprintln!("bench memcache: {name}: loading {} keys of {} bytes", o.keys, o.value_bytes);
        let load_secs = load(peer.addr, o, &value).map_err(|e| peer.failed(name, e))?;
        eprintln!("bench memcache: {name}: {} s of load with {} connections", o.secs, o.conns);
        let pid = peer.server.pid();
        let (cpu0, sw0) = (pid.and_then(cpu_secs), pid.and_then(switches));
        let busy0 = machine_busy_secs();
        let dram0 = dram_counts(peer.addr);
        let (m, secs) = drive(peer.addr, o, &value).map_err(|e| peer.failed(name, e))?;
        let dram_hit_ratio = match (dram_counts(peer.addr), dram0) {
            (Some((h1, m1)), Some((h0, m0))) if h1 + m1 > h0 + m0 => {
                Some((h1 - h0) as f64 / ((h1 - h0) + (m1 - m0)) as f64)
            }
            _ => None,
        };
        let machine_cpu_us_per_op = match (machine_busy_secs(), busy0) {
            (Some(b), Some(a)) if m.ops > 0 => Some((b - a) * 1e6 / m.ops as f64),
            _ => None,
        };
        let server_cpu_us_per_op = match (pid.and_then(cpu_secs), cpu0) {
            (Some(b), Some(a)) if m.ops > 0 => Some((b - a) * 1e6 / m.ops as f64),
            _ => None,
        };
        let server_switches_per_op = match (pid.and_then(switches), sw0) {
            (Some(b), Some(a)) if m.ops > 0 => Some(b.saturating_sub(a) as f64 / m.ops as f64),
            _ => None,
        };
        let server_peak_rss_mib = pid.and_then(peak_rss_mib);
        let cgroup_peak_mib = peer.cgroup.as_ref().and_then(MemCgroup::peak_mib);
        let memcaslap_ops = if o.memcaslap {
            eprintln!("bench memcache: {name}: memcaslap");
            Some(memcaslap(peer.addr, o).map_err(|e| peer.failed(name, e))?)
        } else {
            None
        };
        drop(peer);
        results.push(PeerResult {
            peer: name.clone(),
            ops: m.ops,
            secs,
            gets: m.gets,
            hits: m.hits,
            errors: m.errors,
            get_us: pcts(&m.get),
            set_us: pcts(&m.set),
            load_secs,
            memcaslap_ops,
            server_cpu_us_per_op,
            server_switches_per_op,
            machine_cpu_us_per_op,
            server_peak_rss_mib,
            cgroup_peak_mib,
            dram_hit_ratio,
        });
    }
    Ok(results)
}

/// `granary_dram_hits` and `granary_dram_misses` from a server's `stats`
/// (None: not Granary, or no answer).
fn dram_counts(addr: SocketAddr) -> Option<(u64, u64)> {
    let mut c = Conn::new(addr).ok()?;
    c.w.write_all(b"stats\r\n").ok()?;
    let (mut hits, mut misses) = (None, None);
    loop {
        let line = c.read_line().ok()?;
        if line == "END" {
            break;
        }
        let mut f = line.split(' ');
        match (f.next(), f.next(), f.next()) {
            (Some("STAT"), Some("granary_dram_hits"), Some(v)) => hits = v.parse().ok(),
            (Some("STAT"), Some("granary_dram_misses"), Some(v)) => misses = v.parse().ok(),
            (Some("STAT"), _, _) => {}
            _ => return None,
        }
    }
    Some((hits?, misses?))
}

pub fn render(o: &McBenchOptions, report: &McReport) -> String {
    let r = &report.peers;
    let base = r.iter().find(|p| p.peer == "memcached").map(|p| p.ops_per_sec());
    let mut s = format!(
        "memcache: {} keys x {} B, {}% get, {:?}, {} connections, {}, {} s\n",
        o.keys,
        o.value_bytes,
        o.get_percent,
        o.dist,
        o.conns,
        o.rate.map_or("closed loop".to_string(), |r| format!("open loop {r:.0}/s")),
        o.secs
    );
    if o.peers.iter().any(|p| p == "granary") {
        s += &format!(
            "granary: -m {} (MiB of DRAM tier); memcached and extstore: -m {}\n",
            o.granary_dram_mib(),
            o.memory_mib
        );
    }
    s += &format!(
        "{:<15} {:>10} {:>7} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>8} {:>11}\n",
        "peer",
        "ops/s",
        "ratio",
        "hit%",
        "get p50",
        "get p99",
        "set p99",
        "max us",
        "cpu us/op",
        "mach us/op",
        "cs/op",
        "mem MiB",
        "memcaslap/s"
    );
    for p in r {
        let ratio = base.map_or("-".to_string(), |b| format!("{:.2}", p.ops_per_sec() / b));
        s += &format!(
            "{:<15} {:>10.0} {:>7} {:>7.1}% {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>9} {:>10} {:>7} {:>8} {:>11}\n",
            p.peer,
            p.ops_per_sec(),
            ratio,
            100.0 * p.hit_ratio(),
            p.get_us[0],
            p.get_us[1],
            p.set_us[1],
            p.get_us[3].max(p.set_us[3]),
            p.server_cpu_us_per_op.map_or("-".into(), |v| format!("{v:.1}")),
            p.machine_cpu_us_per_op.map_or("-".into(), |v| format!("{v:.1}")),
            p.server_switches_per_op.map_or("-".into(), |v| format!("{v:.2}")),
            p.cgroup_peak_mib.or(p.server_peak_rss_mib).map_or("-".into(), |v| format!("{v:.0}")),
            p.memcaslap_ops.map_or("-".into(), |v| format!("{v:.0}")),
        );
    }
    for p in r {
        if let Some(h) = p.dram_hit_ratio {
            s += &format!("{}: {:.1}% of GETs served from its DRAM tier\n", p.peer, 100.0 * h);
        }
    }
    if let Some(d) = report.device {
        s += &format!(
            "device reference (fio, 4 KiB direct random reads, depth {DEVICE_REF_DEPTH}): {:.0} reads/s, {:.1} us of machine CPU per read\n",
            d.reads_per_sec, d.machine_cpu_us_per_read
        );
    }
    if let Some(c) = report.ceiling(o) {
        s += &format!(
            "ceiling for a server that reads the device once per GET and is otherwise as cheap as memcached: {c:.2}x memcached\n"
        );
    }
    s
}

pub fn to_json(o: &McBenchOptions, report: &McReport) -> serde_json::Value {
    let r = &report.peers;
    serde_json::json!({
        "benchmark": "memcache",
        "keys": o.keys, "value_bytes": o.value_bytes, "get_percent": o.get_percent,
        "dist": format!("{:?}", o.dist), "conns": o.conns, "secs": o.secs, "rate": o.rate,
        "memory_mib": o.memory_mib, "granary_mib": o.granary_dram_mib(), "server_threads": o.server_threads,
        "peers": r.iter().map(|p| serde_json::json!({
            "peer": p.peer, "ops_per_sec": p.ops_per_sec(), "ops": p.ops, "gets": p.gets, "hits": p.hits,
            "hit_ratio": p.hit_ratio(), "errors": p.errors, "load_secs": p.load_secs,
            "get_us": {"p50": p.get_us[0], "p99": p.get_us[1], "p999": p.get_us[2], "max": p.get_us[3]},
            "set_us": {"p50": p.set_us[0], "p99": p.set_us[1], "p999": p.set_us[2], "max": p.set_us[3]},
            "memcaslap_ops_per_sec": p.memcaslap_ops,
            "server_cpu_us_per_op": p.server_cpu_us_per_op,
            "server_switches_per_op": p.server_switches_per_op,
            "machine_cpu_us_per_op": p.machine_cpu_us_per_op,
            "server_peak_rss_mib": p.server_peak_rss_mib,
            "cgroup_peak_mib": p.cgroup_peak_mib,
            "dram_hit_ratio": p.dram_hit_ratio,
        })).collect::<Vec<_>>(),
        "device_ref": report.device.map(|d| serde_json::json!({
            "depth": DEVICE_REF_DEPTH, "reads_per_sec": d.reads_per_sec,
            "machine_cpu_us_per_read": d.machine_cpu_us_per_read,
        })),
        "ceiling_vs_memcached": report.ceiling(o),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_add_both_kinds() {
        let status = "Name:\tgranary-0\nvoluntary_ctxt_switches:\t40539\nnonvoluntary_ctxt_switches:\t97972\n";
        assert_eq!(parse_switches(status), Some(40539 + 97972));
        assert_eq!(parse_switches("voluntary_ctxt_switches:\t3\n"), None, "both are needed");
        // The process itself is a live example.
        assert!(switches(std::process::id()).is_some());
    }

    #[test]
    fn slow_replies_keep_their_latency() {
        // A 5 s reply and one past the bound: the first is recorded as
        // itself (an auto-resizing histogram would clamp it to 2047 us), the second at the bound.
        let mut m = Measured::new();
        m.get.saturating_record(5_000_000);
        assert!(m.get.max() >= 4_990_000, "max {}", m.get.max());
        m.set.saturating_record(LATENCY_BOUND_US * 10);
        assert!(m.set.max() >= LATENCY_BOUND_US * 99 / 100, "max {}", m.set.max());
        assert_eq!(m.set.len(), 1);
    }

    #[test]
    fn machine_busy_time_leaves_out_idle_iowait_and_steal() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let stat = "cpu  100 2 30 5000 40 6 7 800 0 0\ncpu0 50 1 15 2500 20 3 3 400 0 0\nintr 1\n";
        assert_eq!(parse_busy_ticks(stat), Some(100 + 2 + 30 + 6 + 7));
        assert_eq!(parse_busy_ticks("cpu  1 2 3\n"), None, "a short line is refused");
        assert_eq!(parse_busy_ticks("cpu0 1 2 3 4 5 6 7 8\n"), None, "only the all-cores line counts");
        let a = machine_busy_secs().expect("this machine's /proc/stat");
        let b = machine_busy_secs().expect("this machine's /proc/stat");
        assert!(b >= a && a > 0.0, "{a} then {b}");
    }

    #[test]
    fn the_ceiling_adds_one_device_read_per_get() {
        // 25 us per memcached operation, 5 us per device read: every
        // operation a GET gives 25 / 30; 90% GETs 25 / 29.5.
        assert!((ceiling(25.0, 5.0, 1.0) - 25.0 / 30.0).abs() < 1e-12);
        assert!((ceiling(25.0, 5.0, 0.9) - 25.0 / 29.5).abs() < 1e-12);
        assert_eq!(ceiling(25.0, 0.0, 0.9), 1.0, "a free device read costs nothing");
        let o = McBenchOptions::default();
        let peer = |name: &str, m: Option<f64>| PeerResult {
            peer: name.into(),
            machine_cpu_us_per_op: m,
            ..PeerResult::default()
        };
        let device = Some(DeviceRef { reads_per_sec: 80_000.0, machine_cpu_us_per_read: 5.0 });
        let report = McReport { peers: vec![peer("granary", Some(40.0)), peer("memcached", Some(25.0))], device };
        assert!((report.ceiling(&o).unwrap() - 25.0 / 29.5).abs() < 1e-12, "memcached's figure, not granary's");
        assert!(McReport { device: None, ..report.clone() }.ceiling(&o).is_none());
        assert!(McReport { peers: vec![peer("granary", Some(40.0))], ..report }.ceiling(&o).is_none());
    }

    #[test]
    fn peak_rss_is_read_from_status() {
        let mib = peak_rss_mib(std::process::id()).expect("this process's own VmHWM");
        // A test binary holds at least a few hundred KiB, far less than 1 TiB.
        assert!(mib > 0.1 && mib < 1e6, "{mib}");
        assert_eq!(peak_rss_mib(u32::MAX), None);
    }

    /// A stand-in memcache server for one connection: every GET answered
    /// `END` after `delay`, every SET `SERVER_ERROR`; ends when the
    /// client closes.
    fn fake_server(delay: Duration) -> (SocketAddr, std::thread::JoinHandle<()>) {
        let l = granary_rt::net::bind_low_port([127, 0, 0, 1].into()).unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            let mut line = String::new();
            while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                let reply: &[u8] = if line.starts_with("get ") {
                    std::thread::sleep(delay);
                    b"END\r\n"
                } else {
                    let mut data = String::new();
                    let _ = r.read_line(&mut data);
                    b"SERVER_ERROR out of memory storing object\r\n"
                };
                if w.write_all(reply).is_err() {
                    break;
                }
                line.clear();
            }
        });
        (addr, t)
    }

    /// An open loop (`--rate`) whose server falls behind reports what was
    /// served: the time the operations took, not the offered rate (5,000
    /// GETs offered in 0.1 s to a server taking 2 ms each were reported
    /// as 5,000 ops/s).
    #[test]
    fn an_open_loop_reports_what_was_served() {
        let (addr, server) = fake_server(Duration::from_millis(2));
        let o = McBenchOptions { conns: 1, rate: Some(5_000.0), secs: 0.1, get_percent: 100, ..Default::default() };
        let (m, secs) = drive(addr, &o, b"v").unwrap();
        server.join().unwrap();
        assert_eq!(m.ops, 500, "every operation offered in the window is sent");
        let rate = m.ops as f64 / secs;
        assert!(rate < 600.0, "{rate} ops/s from a server serving 500/s at most ({secs} s)");
    }

    /// A refused SET is an error, not a served operation.
    #[test]
    fn refused_sets_are_errors_not_operations() {
        let (addr, server) = fake_server(Duration::ZERO);
        let o = McBenchOptions { conns: 1, secs: 0.05, get_percent: 0, ..Default::default() };
        let (m, _) = drive(addr, &o, b"v").unwrap();
        server.join().unwrap();
        assert!(m.errors > 0);
        assert_eq!((m.ops, m.set.len()), (0, 0), "{} errors", m.errors);
    }

    #[test]
    fn zipf_is_skewed_and_in_range() {
        let z = Zipf::new(10_000, 0.99);
        let mut rng = Pcg64Mcg::seed_from_u64(7);
        let mut counts = vec![0u32; 10_000];
        for _ in 0..100_000 {
            let k = z.sample(rng.random());
            counts[k as usize] += 1;
        }
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let top10: u32 = counts[..10].iter().sum();
        // Uniform would give the top 10 keys about 0.1% of draws.
        assert!(top10 > 10_000, "top 10 keys drew {top10} of 100000");
        assert!(counts[9_999] < 10);
    }
}
