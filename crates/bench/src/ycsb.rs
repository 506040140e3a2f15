//! `granary-bench ycsb`: YCSB through go-ycsb's redis binding, and
//! redis-benchmark, against `granary serve`'s Redis protocol (RESP)
//! listener and redis-server, in one run.
//!
//! For each peer and each record layout of go-ycsb's redis binding
//! (`redis.datatype=string`: a record is one JSON string, GET/SET;
//! `redis.datatype=hash`: a record is a hash of its fields, HSET/HMGET) the
//! benchmark starts the server fresh as a child process on free loopback
//! ports below 32768, reads its resident memory (VmRSS), loads the records
//! with `go-ycsb load`, reads VmRSS again (the difference over the records
//! is the resident memory per record), then runs the workloads with
//! `go-ycsb run` in the order A, B, C, F, D (D inserts new records, so it
//! comes last), and stops the server by its PID. Then, unless told not
//! to, it starts each peer fresh once more and runs redis-benchmark
//! (`-t ping,set,get,incr,mset`, 50 clients, `-P 1` and `-P 16`).
//!
//! Peers ([`PEERS`]):
//! - `granary`: `granary serve --no-evict` (store mode: nothing is
//!   evicted), writes acknowledged before they are synced (the default).
//! - `granary-flush`: the same with `--flush` (fdatasync before each
//!   acknowledgement): durable, like `redis-always`.
//! - `granary-lru4x`: `granary` run in a memory cgroup of the DRAM
//!   `redis-lru4x` is given (its `maxmemory`) plus
//!   [`crate::memcache::CGROUP_SLACK_MIB`]: the flash scenario, where the
//!   data set is 4x the memory. Its DRAM tier (`-m`) is half of that
//!   share and its blind-overwrite budget a quarter.
//! - `redis-always`: redis-server, `appendonly yes`, `appendfsync always`.
//! - `redis-everysec`: `appendonly yes`, `appendfsync everysec`.
//! - `redis-none`: no persistence (`appendonly no`, `save ""`).
//! - `redis-lru4x`: `redis-none` with `maxmemory` a quarter of the data
//!   set (records x the record's bytes, key included, as the datatype
//!   stores it) and `maxmemory-policy allkeys-lru`.
//! - `at=IP:PORT`: a RESP server already running (no memory figures; its
//!   data is dropped with FLUSHALL before each datatype's load).
//!
//! Hits: go-ycsb's string layout reports a GET of a missing key as a
//! READ_ERROR (go-redis's `redis: nil`), so its hits are the READ count.
//! Its hash layout cannot see a miss: HMGET of a missing key answers an
//! array of nils and the binding drops the conversion error, so such a
//! read counts as a READ. For the hash layout the hit ratio is the
//! server's own (`INFO stats`: `keyspace_hits`, `keyspace_misses`, read
//! before and after each workload; HSET does not count in them), and
//! unknown where the server does not report them.
//!
//! Throughput is go-ycsb's TOTAL line: successful database calls per
//! second (a read-modify-write of workload F counts as its read and its
//! update). Workload E (short range scans) is left out: the redis binding
//! has no scan (it would need a sorted index beside the records), and
//! Granary is a hash store with no ordered range scan to offer.

use crate::child::granary_serving;
use crate::child::{spawn_logged, tail, ChildServer};
use crate::memcache::{join_cgroup, which, MemCgroup, CGROUP_SLACK_MIB};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The peers this benchmark starts itself.
pub const PEERS: [&str; 7] =
    ["granary", "granary-flush", "granary-lru4x", "redis-always", "redis-everysec", "redis-none", "redis-lru4x"];

/// The order workloads run in: D inserts records, so it comes last.
pub const RUN_ORDER: [char; 5] = ['a', 'b', 'c', 'f', 'd'];

/// go-ycsb's key: the table, a slash, "user" and a hash of the record
/// number (usually 19 digits): `usertable/user6284781860667377211`.
pub const KEY_BYTES: usize = 33;

/// go-ycsb's operationcount with `--secs` (the run is ended by SIGINT).
const OPERATIONS_UNBOUNDED: u64 = 1 << 40;

/// go-redis's read and write timeout (its default, 3 s, fails slow
/// replies of a server whose disk stalls instead of measuring them).
const CLIENT_TIMEOUT: &str = "30s";

/// How long a peer may take to answer PING after it was started (a new
/// Granary data file is written once with zeros at creation).
const START_TIMEOUT: Duration = Duration::from_secs(300);

/// go-ycsb's redis binding's record layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Datatype {
    /// The record as one JSON string (fields base64-encoded): SET, GET.
    String,
    /// The record as a hash of its fields: HSET, HMGET.
    Hash,
}

impl Datatype {
    pub fn name(self) -> &'static str {
        match self {
            Datatype::String => "string",
            Datatype::Hash => "hash",
        }
    }

    pub fn parse(s: &str) -> Result<Datatype, String> {
        match s {
            "string" => Ok(Datatype::String),
            "hash" => Ok(Datatype::Hash),
            _ => Err(format!("unknown datatype {s:?}: string or hash (go-ycsb's redis.datatype)")),
        }
    }
}

/// Which keys the workloads A, B, C and F draw (D's is always `latest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distribution {
    /// YCSB's core workloads' (zipfian, constant 0.99).
    Zipfian,
    Uniform,
    /// What go-ycsb's workload files say (uniform, in v1.0.3).
    File,
}

impl Distribution {
    pub fn parse(s: &str) -> Result<Distribution, String> {
        match s {
            "zipfian" => Ok(Distribution::Zipfian),
            "uniform" => Ok(Distribution::Uniform),
            "file" => Ok(Distribution::File),
            _ => Err(format!("unknown distribution {s:?}: zipfian, uniform or file")),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Distribution::Zipfian => "zipfian",
            Distribution::Uniform => "uniform",
            Distribution::File => "the workload files'",
        }
    }
}

#[derive(Debug, Clone)]
pub struct YcsbOptions {
    /// Peers, in the order they run: names from [`PEERS`] or `at=IP:PORT`.
    pub peers: Vec<String>,
    /// Workloads among a, b, c, d, f (run in [`RUN_ORDER`]).
    pub workloads: Vec<char>,
    pub datatypes: Vec<Datatype>,
    pub records: u64,
    /// Operations per workload (ignored with `secs`).
    pub operations: u64,
    /// Seconds per workload instead of a count of operations.
    pub secs: Option<f64>,
    /// go-ycsb's threads (each with its own connection).
    pub threads: usize,
    pub field_count: usize,
    pub field_bytes: usize,
    pub distribution: Distribution,
    /// Data files, server logs and go-ycsb's outputs.
    pub dir: PathBuf,
    /// go-ycsb (default: target/go-ycsb/go-ycsb, as scripts/go-ycsb.sh builds it).
    pub go_ycsb: Option<PathBuf>,
    /// go-ycsb's workload files (default: `workloads/` beside the binary).
    pub workloads_dir: Option<PathBuf>,
    /// `granary` (default: beside this executable, `GRANARY_BIN`, PATH).
    pub granary: Option<PathBuf>,
    /// Size of Granary's data file (default: [`YcsbOptions::granary_size`]).
    pub granary_size: Option<u64>,
    /// `granary serve -t` (0: its default, one executor per core).
    pub server_threads: usize,
    pub redis_benchmark: bool,
    /// redis-benchmark's requests per test at `-P 1`; `-P 16` sends 10x.
    pub rb_requests: u64,
    pub rb_clients: usize,
    /// redis-benchmark's `-r` (0: not given: its few fixed keys, so every
    /// client writes the same key).
    pub rb_keyspace: u64,
    /// The peer ratios are taken to (the `-lru4x` peers: to `redis-lru4x`).
    pub baseline: String,
}

impl Default for YcsbOptions {
    fn default() -> Self {
        YcsbOptions {
            peers: PEERS.iter().map(|s| s.to_string()).collect(),
            workloads: RUN_ORDER.to_vec(),
            datatypes: vec![Datatype::String, Datatype::Hash],
            records: 100_000,
            operations: 100_000,
            secs: None,
            threads: 32,
            field_count: 10,
            field_bytes: 100,
            distribution: Distribution::Zipfian,
            dir: PathBuf::from("granary-data"),
            go_ycsb: None,
            workloads_dir: None,
            granary: None,
            granary_size: None,
            server_threads: 0,
            redis_benchmark: true,
            rb_requests: 100_000,
            rb_clients: 50,
            rb_keyspace: 0,
            baseline: "redis-none".into(),
        }
    }
}

impl YcsbOptions {
    /// Bytes of one record's value as the datatype stores it: the string
    /// layout is Go's JSON of a `map[string][]byte` (base64 values), the
    /// hash layout the field names and values.
    pub fn value_bytes(&self, dt: Datatype) -> usize {
        let names: usize = (0..self.field_count).map(|i| format!("field{i}").len()).sum();
        match dt {
            Datatype::Hash => names + self.field_count * self.field_bytes,
            // {"field0":"<base64>",...}: braces, commas, and per field its
            // name, four quotes and a colon.
            Datatype::String => {
                let b64 = 4 * self.field_bytes.div_ceil(3);
                2 + self.field_count.saturating_sub(1) + names + self.field_count * (5 + b64)
            }
        }
    }

    /// A record's bytes, key included.
    pub fn record_bytes(&self, dt: Datatype) -> usize {
        KEY_BYTES + self.value_bytes(dt)
    }

    /// The memory the -lru4x peers are given for the data: a quarter of
    /// the data set. redis-lru4x's maxmemory is this plus what it uses
    /// empty; granary-lru4x's cgroup this plus
    /// [`crate::memcache::CGROUP_SLACK_MIB`].
    pub fn lru_bytes(&self, dt: Datatype) -> u64 {
        self.records * self.record_bytes(dt) as u64 / 4
    }

    /// Granary's data file: 4x the data set with each record rounded up to
    /// 512 bytes (plus 128 of header), and room for workload D's inserts;
    /// at least 256 MiB.
    pub fn granary_size(&self) -> u64 {
        if let Some(s) = self.granary_size {
            return s;
        }
        let rec = self.datatypes.iter().map(|&d| self.record_bytes(d)).max().unwrap_or(1024) as u64 + 128;
        let rec = rec.div_ceil(512) * 512;
        let inserts = if self.secs.is_some() { self.records / 4 } else { self.operations / 10 };
        let bytes = 4 * (self.records + inserts) * rec;
        bytes.max(256 << 20).div_ceil(1 << 20) << 20
    }

    /// The workloads asked for, in [`RUN_ORDER`].
    pub fn run_order(&self) -> Vec<char> {
        RUN_ORDER.iter().copied().filter(|w| self.workloads.contains(w)).collect()
    }
}

/// One line of go-ycsb's summary: an operation (READ, UPDATE, INSERT,
/// READ_MODIFY_WRITE, TOTAL, and `<OP>_ERROR` for failed calls).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpStats {
    pub op: String,
    /// Seconds from this operation's first measurement to the summary.
    pub secs: f64,
    pub count: u64,
    pub ops_per_sec: f64,
    pub avg_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub p9999_us: f64,
}

/// The summary lines of go-ycsb's output (its `plain` output style):
///
/// `READ   - Takes(s): 1.3, Count: 9997, OPS: 7591.1, Avg(us): 339, Min(us): 30, Max(us): 19951, 50th(us): 207, 90th(us): 478, 95th(us): 855, 99th(us): 3755, 99.9th(us): 8471, 99.99th(us): 15743`
///
/// Other lines (properties, progress) are skipped.
pub fn parse_summary(text: &str) -> Vec<OpStats> {
    text.lines().filter_map(parse_summary_line).collect()
}

fn parse_summary_line(line: &str) -> Option<OpStats> {
    let (op, rest) = line.split_once(" - ")?;
    let op = op.trim();
    let rest = rest.trim();
    if op.is_empty() || op.contains(char::is_whitespace) || !rest.starts_with("Takes(s):") {
        return None;
    }
    let mut fields = std::collections::HashMap::new();
    for kv in rest.split(", ") {
        let (k, v) = kv.split_once(':')?;
        fields.insert(k.trim(), v.trim().parse::<f64>().ok()?);
    }
    let f = |k: &str| fields.get(k).copied();
    Some(OpStats {
        op: op.to_string(),
        secs: f("Takes(s)")?,
        count: f("Count")? as u64,
        ops_per_sec: f("OPS")?,
        avg_us: f("Avg(us)")?,
        min_us: f("Min(us)")?,
        max_us: f("Max(us)")?,
        p50_us: f("50th(us)")?,
        p90_us: f("90th(us)")?,
        p95_us: f("95th(us)")?,
        p99_us: f("99th(us)")?,
        p999_us: f("99.9th(us)")?,
        p9999_us: f("99.99th(us)")?,
    })
}

/// Seconds of go-ycsb's `Run finished, takes 1.317455111s` line (a Go
/// duration: `1m2.5s`, `419.278332ms`, `950µs`).
pub fn parse_run_finished(text: &str) -> Option<f64> {
    let d = text.lines().rev().find_map(|l| l.trim().strip_prefix("Run finished, takes "))?;
    parse_go_duration(d.trim())
}

/// A Go `time.Duration`'s String(): numbers with units h, m, s, ms, us/µs, ns.
pub fn parse_go_duration(s: &str) -> Option<f64> {
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += n * unit;
        rest = &rest[unit_end..];
    }
    Some(total)
}

/// One go-ycsb run (a load, or a workload).
#[derive(Debug, Clone, Default)]
pub struct WorkloadResult {
    /// 'a'..'f', or 'l' for the load.
    pub workload: char,
    pub ops: Vec<OpStats>,
    /// go-ycsb's `Run finished, takes` (connections included).
    pub wall_secs: Option<f64>,
    /// The server's `keyspace_hits` and `keyspace_misses` over the run,
    /// where it reports them.
    pub server_hits: Option<u64>,
    pub server_misses: Option<u64>,
}

impl WorkloadResult {
    pub fn op(&self, name: &str) -> Option<&OpStats> {
        self.ops.iter().find(|o| o.op == name)
    }

    fn count(&self, name: &str) -> u64 {
        self.op(name).map_or(0, |o| o.count)
    }

    /// Successful calls per second (go-ycsb's TOTAL).
    pub fn ops_per_sec(&self) -> f64 {
        self.op("TOTAL").map_or(0.0, |o| o.ops_per_sec)
    }

    /// Seconds the TOTAL count took (its count over its rate).
    pub fn secs(&self) -> f64 {
        match self.op("TOTAL") {
            Some(t) if t.ops_per_sec > 0.0 => t.count as f64 / t.ops_per_sec,
            Some(t) => t.secs,
            None => 0.0,
        }
    }

    /// Failed calls (every `*_ERROR` line; READ_MODIFY_WRITE's own line
    /// is not a call of its own).
    pub fn errors(&self) -> u64 {
        self.ops.iter().filter(|o| o.op.ends_with("_ERROR") && o.op != "READ_MODIFY_WRITE_ERROR").map(|o| o.count).sum()
    }

    /// Reads that found their record, and reads in all; None where a miss
    /// cannot be told from a hit (the hash layout on a server that does
    /// not report `keyspace_hits`).
    pub fn read_hits(&self, dt: Datatype) -> Option<(u64, u64)> {
        let (reads, failed) = (self.count("READ"), self.count("READ_ERROR"));
        if reads + failed == 0 {
            return None;
        }
        match dt {
            // A READ_ERROR is a miss (or, rarely, a failed call: a timeout).
            Datatype::String => Some((reads, reads + failed)),
            Datatype::Hash => {
                let (h, m) = (self.server_hits?, self.server_misses?);
                let ratio = if h + m == 0 { 0.0 } else { h as f64 / (h + m) as f64 };
                Some(((reads as f64 * ratio).round() as u64, reads + failed))
            }
        }
    }

    pub fn hit_ratio(&self, dt: Datatype) -> Option<f64> {
        self.read_hits(dt).map(|(h, n)| h as f64 / n.max(1) as f64)
    }

    /// Reads that found their record, per second.
    pub fn hits_per_sec(&self, dt: Datatype) -> Option<f64> {
        let (h, _) = self.read_hits(dt)?;
        Some(h as f64 / self.secs().max(1e-9))
    }
}

/// One peer's runs on one datatype.
#[derive(Debug, Clone)]
pub struct DatatypeResult {
    pub datatype: Datatype,
    pub load: Option<WorkloadResult>,
    /// The server's VmRSS before and after the load, KiB.
    pub rss_before_kib: Option<u64>,
    pub rss_after_load_kib: Option<u64>,
    pub workloads: Vec<WorkloadResult>,
    /// redis-lru4x's maxmemory (a quarter of the data set plus its memory
    /// used empty); granary-lru4x's cgroup limit.
    pub maxmemory: Option<u64>,
    pub cgroup_limit: Option<u64>,
    /// The cgroup's peak charge at the end, MiB.
    pub cgroup_peak_mib: Option<f64>,
    /// What failed, where something did (the runs before it are kept).
    pub error: Option<String>,
}

impl DatatypeResult {
    fn new(datatype: Datatype) -> DatatypeResult {
        DatatypeResult {
            datatype,
            load: None,
            rss_before_kib: None,
            rss_after_load_kib: None,
            workloads: Vec::new(),
            maxmemory: None,
            cgroup_limit: None,
            cgroup_peak_mib: None,
            error: None,
        }
    }

    /// Resident bytes per record the load added.
    pub fn rss_per_record(&self, records: u64) -> Option<f64> {
        let (a, b) = (self.rss_after_load_kib?, self.rss_before_kib?);
        Some(a.saturating_sub(b) as f64 * 1024.0 / records.max(1) as f64)
    }

    pub fn workload(&self, w: char) -> Option<&WorkloadResult> {
        self.workloads.iter().find(|r| r.workload == w)
    }
}

/// One redis-benchmark test.
#[derive(Debug, Clone, PartialEq)]
pub struct RbResult {
    pub pipeline: usize,
    /// PING_INLINE, PING_MBULK, SET, GET, INCR, "MSET (10 keys)".
    pub test: String,
    pub rps: f64,
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// redis-benchmark's `--csv` output:
///
/// ```text
/// "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
/// "SET","769230.75","0.794","0.208","0.503","4.471","4.727","4.887"
/// ```
///
/// The header and other lines (a warning that CONFIG GET failed) are skipped.
pub fn parse_rb_csv(text: &str, pipeline: usize) -> Vec<RbResult> {
    text.lines()
        .filter(|l| l.starts_with('"'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(|x| x.trim().trim_matches('"')).collect();
            if f.len() < 8 || f[0] == "test" {
                return None;
            }
            let n = |i: usize| f[i].parse::<f64>().ok();
            Some(RbResult {
                pipeline,
                test: f[0].to_string(),
                rps: n(1)?,
                avg_ms: n(2)?,
                p50_ms: n(4)?,
                p99_ms: n(6)?,
                max_ms: n(7)?,
            })
        })
        .collect()
}

/// One peer's results.
#[derive(Debug, Clone)]
pub struct PeerResult {
    pub peer: String,
    pub datatypes: Vec<DatatypeResult>,
    pub redis_benchmark: Vec<RbResult>,
    pub redis_benchmark_error: Option<String>,
}

impl PeerResult {
    pub fn datatype(&self, dt: Datatype) -> Option<&DatatypeResult> {
        self.datatypes.iter().find(|d| d.datatype == dt)
    }

    pub fn errors(&self) -> impl Iterator<Item = &str> {
        self.datatypes.iter().filter_map(|d| d.error.as_deref()).chain(self.redis_benchmark_error.as_deref())
    }
}

#[derive(Debug, Clone, Default)]
pub struct YcsbReport {
    pub peers: Vec<PeerResult>,
}

impl YcsbReport {
    pub fn peer(&self, name: &str) -> Option<&PeerResult> {
        self.peers.iter().find(|p| p.peer == name)
    }

    /// Every failure, as `peer: what`.
    pub fn failures(&self) -> Vec<String> {
        self.peers.iter().flat_map(|p| p.errors().map(move |e| format!("{}: {e}", p.peer))).collect()
    }
}

/// The external programs a run needs.
#[derive(Debug, Clone)]
pub struct Tools {
    pub go_ycsb: PathBuf,
    pub workloads: PathBuf,
    pub redis_server: Option<PathBuf>,
    pub redis_benchmark: Option<PathBuf>,
    pub granary: Option<PathBuf>,
}

fn is_granary(peer: &str) -> bool {
    peer.starts_with("granary")
}

fn is_lru(peer: &str) -> bool {
    peer.ends_with("-lru4x")
}

/// Check the peers' names and find every program the run needs, before
/// anything starts: a missing one fails the run at once, not an hour in.
pub fn find_tools(o: &YcsbOptions) -> Result<Tools, String> {
    for p in &o.peers {
        if !PEERS.contains(&p.as_str()) && !p.starts_with("at=") {
            return Err(format!("unknown peer {p:?}: {} or at=IP:PORT", PEERS.join(", ")));
        }
    }
    let go_ycsb = match &o.go_ycsb {
        Some(p) => p.clone(),
        None => default_go_ycsb().ok_or(
            "no go-ycsb: build it with scripts/go-ycsb.sh (into target/go-ycsb/go-ycsb) or give --go-ycsb PATH",
        )?,
    };
    if !go_ycsb.is_file() {
        return Err(format!("go-ycsb {} does not exist: build it with scripts/go-ycsb.sh", go_ycsb.display()));
    }
    let workloads = match &o.workloads_dir {
        Some(d) => d.clone(),
        None => go_ycsb.parent().unwrap_or(Path::new(".")).join("workloads"),
    };
    if let Some(w) = o.run_order().into_iter().chain(['a']).find(|w| !workloads.join(format!("workload{w}")).is_file())
    {
        return Err(format!(
            "no go-ycsb workload file {}: scripts/go-ycsb.sh copies them beside the binary; or give --workloads-dir",
            workloads.join(format!("workload{w}")).display()
        ));
    }
    let redis_server = if o.peers.iter().any(|p| p.starts_with("redis")) {
        Some(which("redis-server").ok_or("redis-server is not installed (apt-get install redis-server)")?)
    } else {
        None
    };
    let redis_benchmark = if o.redis_benchmark {
        Some(which("redis-benchmark").ok_or("redis-benchmark is not installed (apt-get install redis-tools)")?)
    } else {
        None
    };
    let granary = match o.peers.iter().any(|p| is_granary(p)) {
        true => Some(granary_serving(
            o.granary.as_deref(),
            "--resp-port",
            "no Redis protocol listener: build a granary with it, or leave the granary peers out \
             (--peers redis-none,redis-always,...)",
        )?),
        false => None,
    };
    Ok(Tools { go_ycsb, workloads, redis_server, redis_benchmark, granary })
}

/// target/go-ycsb/go-ycsb beside this executable's target folder (cargo's
/// target/release/granary-bench), or under the current folder, or
/// `go-ycsb` on PATH.
fn default_go_ycsb() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok();
    let beside = exe.as_deref().and_then(Path::parent).and_then(Path::parent).map(|t| t.join("go-ycsb/go-ycsb"));
    beside
        .into_iter()
        .chain([PathBuf::from("target/go-ycsb/go-ycsb")])
        .find(|p| p.is_file())
        .or_else(|| which("go-ycsb"))
}

// ---------------------------------------------------------------- RESP

/// A RESP2 reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

/// Send one command (as an array of bulk strings) and read its reply.
pub fn resp_call(addr: SocketAddr, args: &[&str]) -> std::io::Result<Resp> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.set_write_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        req.extend_from_slice(a.as_bytes());
        req.extend_from_slice(b"\r\n");
    }
    (&s).write_all(&req)?;
    read_resp(&mut BufReader::new(s))
}

/// Read one RESP2 value.
pub fn read_resp(r: &mut impl BufRead) -> std::io::Result<Resp> {
    let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(line.len().min(1));
    let int = |s: &str| s.parse::<i64>().map_err(|_| bad(format!("bad RESP length or integer {line:?}")));
    Ok(match kind {
        "+" => Resp::Simple(rest.to_string()),
        "-" => Resp::Error(rest.to_string()),
        ":" => Resp::Int(int(rest)?),
        "$" => match int(rest)? {
            n if n < 0 => Resp::Bulk(None),
            n => {
                let mut b = vec![0; n as usize + 2];
                r.read_exact(&mut b)?;
                b.truncate(n as usize);
                Resp::Bulk(Some(b))
            }
        },
        "*" => match int(rest)? {
            n if n < 0 => Resp::Array(None),
            n => Resp::Array(Some((0..n).map(|_| read_resp(r)).collect::<Result<_, _>>()?)),
        },
        _ => return Err(bad(format!("not a RESP reply: {line:?}"))),
    })
}

/// A field (`name:value`) of an INFO reply.
pub fn info_field(info: &str, name: &str) -> Option<u64> {
    info.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
}

/// The server's `keyspace_hits` and `keyspace_misses` (INFO stats), where
/// it reports them.
fn keyspace_stats(addr: SocketAddr) -> (Option<u64>, Option<u64>) {
    match resp_call(addr, &["INFO", "stats"]) {
        Ok(Resp::Bulk(Some(b))) => {
            let text = String::from_utf8_lossy(&b);
            (info_field(&text, "keyspace_hits"), info_field(&text, "keyspace_misses"))
        }
        _ => (None, None),
    }
}

// ------------------------------------------------------------- servers

/// A started server, killed (by its PID) on drop, its data removed; or
/// one already running (no child).
struct Server {
    /// The process and its data; first, so that it is killed and reaped
    /// before the cgroup is removed.
    proc: ChildServer,
    /// Its RESP listener.
    addr: SocketAddr,
    cgroup: Option<MemCgroup>,
}

fn free_port() -> Result<u16, String> {
    granary_rt::net::free_low_port().map_err(|e| format!("no free port: {e}"))
}

/// Give redis-server `addr` a quarter of the data set beyond the memory
/// it uses empty (`used_memory`: about 1 MiB; without it a small data set
/// leaves no room at all and every write is refused): the maxmemory set.
fn set_maxmemory(addr: SocketAddr, data_quarter: u64) -> Result<u64, String> {
    let used = match resp_call(addr, &["INFO", "memory"]) {
        Ok(Resp::Bulk(Some(b))) => info_field(&String::from_utf8_lossy(&b), "used_memory"),
        _ => None,
    }
    .ok_or("INFO memory has no used_memory")?;
    let max = used + data_quarter;
    match resp_call(addr, &["CONFIG", "SET", "maxmemory", &max.to_string()]) {
        Ok(Resp::Simple(_)) => Ok(max),
        other => Err(format!("CONFIG SET maxmemory {max} answered {other:?}")),
    }
}

/// Start `name` fresh for datatype `dt` (whose size sets the -lru4x
/// peers' memory) and wait until it answers PING.
fn start_server(name: &str, o: &YcsbOptions, tools: &Tools, dt: Datatype) -> Result<Server, String> {
    if let Some(a) = name.strip_prefix("at=") {
        let addr: SocketAddr = a.parse().map_err(|e| format!("{e} (at=IP:PORT)"))?;
        let server = Server { proc: ChildServer::new(name, None, Vec::new(), None), addr, cgroup: None };
        match resp_call(addr, &["PING"]) {
            Ok(Resp::Simple(s)) if s == "PONG" => {}
            other => return Err(format!("{name} does not answer PING with PONG: {other:?}")),
        }
        match resp_call(addr, &["FLUSHALL"]) {
            Ok(Resp::Simple(_)) => {}
            other => eprintln!("bench ycsb: {name}: FLUSHALL answered {other:?}; loading over its data"),
        }
        return Ok(server);
    }
    std::fs::create_dir_all(&o.dir).map_err(|e| format!("cannot create {}: {e}", o.dir.display()))?;
    let port = free_port()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut cgroup = None;
    let (mut cmd, data) = if is_granary(name) {
        let data = o.dir.join(format!("ycsb-{name}.db"));
        let _ = std::fs::remove_file(&data);
        // The Memcache listener cannot be turned off: a port of its own.
        let mc_port = loop {
            let p = free_port()?;
            if p != port {
                break p;
            }
        };
        let mut c = Command::new(tools.granary.as_ref().ok_or("no granary binary")?);
        c.args(["serve", "--data"]).arg(&data).args(["--size", &o.granary_size().to_string()]);
        c.args(["-l", "127.0.0.1", "-p", &mc_port.to_string(), "--no-native"]);
        c.args(["--resp-port", &port.to_string(), "--no-evict"]);
        if name == "granary-flush" {
            c.arg("--flush");
        }
        if o.server_threads > 0 {
            c.args(["-t", &o.server_threads.to_string()]);
        }
        if is_lru(name) {
            // Its DRAM tier (`-m`) takes half of the data's share and its
            // blind-overwrite budget a quarter, so that the process stays
            // within the cgroup: their defaults (64 MiB each) exceed the
            // share of a small data set, and the cgroup would kill it.
            let mib = (o.lru_bytes(dt) >> 20).max(4);
            c.args(["-m", &(mib / 2).to_string(), "--blind-overwrite-mem", &format!("{}m", mib / 4)]);
            let cg = MemCgroup::create(name, o.lru_bytes(dt) + (CGROUP_SLACK_MIB << 20))?;
            let procs = cg.procs()?;
            use std::os::unix::process::CommandExt;
            // SAFETY: the closure runs in the child between fork and exec
            // and makes only async-signal-safe calls (join_cgroup).
            unsafe { c.pre_exec(move || join_cgroup(&procs)) };
            cgroup = Some(cg);
        }
        (c, vec![data])
    } else {
        let dir = o.dir.join(format!("ycsb-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut c = Command::new(tools.redis_server.as_ref().ok_or("no redis-server")?);
        c.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--dir"]).arg(&dir);
        c.args(["--daemonize", "no", "--logfile", ""]);
        match name {
            "redis-always" => c.args(["--appendonly", "yes", "--appendfsync", "always"]),
            "redis-everysec" => c.args(["--appendonly", "yes", "--appendfsync", "everysec"]),
            _ => c.args(["--appendonly", "no"]),
        };
        if is_lru(name) {
            // maxmemory is set once it is up (set_maxmemory).
            c.args(["--maxmemory-policy", "allkeys-lru"]);
        }
        (c, vec![dir])
    };
    let log = o.dir.join(format!("ycsb-{name}.log"));
    let child = spawn_logged(name, &mut cmd, &log)?;
    let mut proc = ChildServer::new(name, Some(child), data, Some(log));
    proc.wait_ready(
        START_TIMEOUT,
        &format!("answer PING on {addr}"),
        || matches!(resp_call(addr, &["PING"]), Ok(Resp::Simple(s)) if s == "PONG"),
    )?;
    Ok(Server { proc, addr, cgroup })
}

// ------------------------------------------------------------- clients

/// Wait for `child` at most until `deadline`, then kill it.
fn wait_until(child: &mut Child, deadline: Instant) -> Result<std::process::ExitStatus, String> {
    loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("timed out".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// go-ycsb's `load` (`workload` None) or `run` of a workload against
/// `addr`; its output kept in `out`.
fn go_ycsb(
    o: &YcsbOptions,
    tools: &Tools,
    addr: SocketAddr,
    dt: Datatype,
    workload: Option<char>,
    out: &Path,
) -> Result<WorkloadResult, String> {
    let w = workload.unwrap_or('a');
    let mut c = Command::new(&tools.go_ycsb);
    c.arg(if workload.is_some() { "run" } else { "load" }).arg("redis");
    c.arg("-P").arg(tools.workloads.join(format!("workload{w}")));
    let mut props: Vec<(&str, String)> = vec![
        ("redis.addr", addr.to_string()),
        ("redis.datatype", dt.name().into()),
        ("redis.read_timeout", CLIENT_TIMEOUT.into()),
        ("redis.write_timeout", CLIENT_TIMEOUT.into()),
        ("recordcount", o.records.to_string()),
        ("threadcount", o.threads.to_string()),
        ("fieldcount", o.field_count.to_string()),
        ("fieldlength", o.field_bytes.to_string()),
    ];
    if workload.is_some() {
        let ops = if o.secs.is_some() { OPERATIONS_UNBOUNDED } else { o.operations };
        props.push(("operationcount", ops.to_string()));
        // D draws the latest inserted records: its definition.
        if w != 'd' {
            match o.distribution {
                Distribution::Zipfian => {
                    props.push(("requestdistribution", "zipfian".into()));
                    // go-ycsb's zipfian key range ends at recordcount
                    // (inclusive), a record never loaded: end it a record
                    // earlier.
                    props.push(("insertcount", (o.records - 1).to_string()));
                }
                Distribution::Uniform => props.push(("requestdistribution", "uniform".into())),
                Distribution::File => {}
            }
        }
    }
    for (k, v) in &props {
        c.arg("-p").arg(format!("{k}={v}"));
    }
    let file = std::fs::File::create(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    let mut child = c.stdout(file).stderr(err).spawn().map_err(|e| format!("go-ycsb: {e}"))?;
    let status = match (workload, o.secs) {
        (Some(_), Some(secs)) => {
            // Run for `secs`, then SIGINT: go-ycsb cancels its workers and
            // prints its summary.
            let stop = Instant::now() + Duration::from_secs_f64(secs);
            let mut ended = child.try_wait().map_err(|e| e.to_string())?;
            while Instant::now() < stop && ended.is_none() {
                std::thread::sleep(Duration::from_millis(20));
                ended = child.try_wait().map_err(|e| e.to_string())?;
            }
            match ended {
                // Ended by itself (reaped: its PID may be another's now).
                Some(status) => Ok(status),
                None => {
                    // SAFETY: kill(2) of our own child's PID, not yet
                    // reaped (its last try_wait found it running).
                    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
                    wait_until(&mut child, Instant::now() + Duration::from_secs(60))
                }
            }
        }
        _ => child.wait().map_err(|e| e.to_string()),
    }
    .map_err(|e| format!("go-ycsb: {e}"))?;
    let text = std::fs::read_to_string(out).unwrap_or_default();
    let ops = parse_summary(&text);
    if ops.iter().all(|s| s.op != "TOTAL") {
        let failed: Vec<String> = ops.iter().map(|s| format!("{} {}", s.op, s.count)).collect();
        return Err(format!(
            "go-ycsb {} ({status}): no call succeeded{}; {} ends:\n{}",
            if workload.is_some() { "run" } else { "load" },
            if failed.is_empty() { String::new() } else { format!(" ({})", failed.join(", ")) },
            out.display(),
            tail(out, 10)
        ));
    }
    Ok(WorkloadResult {
        workload: workload.unwrap_or('l'),
        ops,
        wall_secs: parse_run_finished(&text),
        server_hits: None,
        server_misses: None,
    })
}

/// redis-benchmark at one pipeline depth.
fn redis_benchmark(o: &YcsbOptions, tools: &Tools, addr: SocketAddr, pipeline: usize) -> Result<Vec<RbResult>, String> {
    let bin = tools.redis_benchmark.as_ref().ok_or("no redis-benchmark")?;
    let n = if pipeline > 1 { o.rb_requests * 10 } else { o.rb_requests };
    let out = o.dir.join(format!("ycsb-redis-benchmark-P{pipeline}.csv"));
    let file = std::fs::File::create(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(bin);
    cmd.args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string(), "-c", &o.rb_clients.to_string()]).args([
        "-n",
        &n.to_string(),
        "-t",
        "ping,set,get,incr,mset",
        "-P",
        &pipeline.to_string(),
        "--csv",
    ]);
    if o.rb_keyspace > 0 {
        cmd.args(["-r", &o.rb_keyspace.to_string()]);
    }
    let mut child =
        cmd.stdin(Stdio::null()).stdout(file).stderr(err).spawn().map_err(|e| format!("redis-benchmark: {e}"))?;
    // It waits for ever on a server that stopped answering: a deadline of
    // two minutes and 1000 requests a second for each of its six tests.
    let deadline = Instant::now() + Duration::from_secs(120 + 6 * n / 1000);
    let status = wait_until(&mut child, deadline).map_err(|e| format!("redis-benchmark -P {pipeline}: {e}"))?;
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    let r = parse_rb_csv(&text, pipeline);
    if r.is_empty() || !status.success() {
        return Err(format!("redis-benchmark -P {pipeline} ({status}) printed no results:\n{text}"));
    }
    Ok(r)
}

// ----------------------------------------------------------------- run

/// Run the comparison; progress on stderr. A peer that fails is recorded
/// (its error in the report) and the run goes on with the next.
pub fn run(o: &YcsbOptions) -> Result<YcsbReport, String> {
    let tools = find_tools(o)?;
    std::fs::create_dir_all(&o.dir).map_err(|e| format!("cannot create {}: {e}", o.dir.display()))?;
    let mut report = YcsbReport::default();
    for name in &o.peers {
        let mut peer = PeerResult {
            peer: name.clone(),
            datatypes: Vec::new(),
            redis_benchmark: Vec::new(),
            redis_benchmark_error: None,
        };
        for &dt in &o.datatypes {
            let mut r = DatatypeResult::new(dt);
            if let Err(e) = run_datatype(o, &tools, name, dt, &mut r) {
                eprintln!("bench ycsb: {name}: {}: FAILED: {e}", dt.name());
                r.error = Some(format!("{}: {e}", dt.name()));
            }
            peer.datatypes.push(r);
        }
        // redis-benchmark's key space is a few keys: an -lru4x peer would
        // repeat its base peer.
        if tools.redis_benchmark.is_some() && !is_lru(name) {
            if let Err(e) = run_redis_benchmark(o, &tools, name, &mut peer.redis_benchmark) {
                eprintln!("bench ycsb: {name}: redis-benchmark: FAILED: {e}");
                peer.redis_benchmark_error = Some(format!("redis-benchmark: {e}"));
            }
        }
        report.peers.push(peer);
    }
    Ok(report)
}

fn run_datatype(
    o: &YcsbOptions,
    tools: &Tools,
    name: &str,
    dt: Datatype,
    r: &mut DatatypeResult,
) -> Result<(), String> {
    let d = dt.name();
    eprintln!("bench ycsb: {name}: {d}: starting");
    let mut server = start_server(name, o, tools, dt)?;
    if is_lru(name) {
        if is_granary(name) {
            r.cgroup_limit = Some(o.lru_bytes(dt) + (CGROUP_SLACK_MIB << 20));
        } else {
            r.maxmemory = Some(set_maxmemory(server.addr, o.lru_bytes(dt)).map_err(|e| server.proc.failed(e))?);
        }
    }
    let out = |phase: &str| o.dir.join(format!("ycsb-{name}-{d}-{phase}.txt"));
    r.rss_before_kib = server.proc.rss_kib();
    eprintln!(
        "bench ycsb: {name}: {d}: loading {} records of {} B ({} threads)",
        o.records,
        o.record_bytes(dt),
        o.threads
    );
    let load = go_ycsb(o, tools, server.addr, dt, None, &out("load")).map_err(|e| server.proc.failed(e))?;
    server.proc.check_alive()?;
    r.rss_after_load_kib = server.proc.rss_kib();
    eprintln!("bench ycsb: {name}: {d}: loaded, {:.0} inserts/s, {} errors", load.ops_per_sec(), load.errors());
    r.load = Some(load);
    for w in o.run_order() {
        let what = match o.secs {
            Some(s) => format!("{s} s"),
            None => format!("{} operations", o.operations),
        };
        eprintln!("bench ycsb: {name}: {d}: workload {}: {what}", w.to_ascii_uppercase());
        let (h0, m0) = keyspace_stats(server.addr);
        let mut res = go_ycsb(o, tools, server.addr, dt, Some(w), &out(&format!("workload{w}")))
            .map_err(|e| server.proc.failed(e))?;
        server.proc.check_alive()?;
        let (h1, m1) = keyspace_stats(server.addr);
        res.server_hits = h1.zip(h0).map(|(b, a)| b.saturating_sub(a));
        res.server_misses = m1.zip(m0).map(|(b, a)| b.saturating_sub(a));
        eprintln!(
            "bench ycsb: {name}: {d}: workload {}: {:.0} ops/s, p99 {} us, {} errors{}",
            w.to_ascii_uppercase(),
            res.ops_per_sec(),
            res.op("TOTAL").map_or(0.0, |t| t.p99_us),
            res.errors(),
            res.hit_ratio(dt).map_or(String::new(), |h| format!(", {:.1}% of reads hit", 100.0 * h))
        );
        r.workloads.push(res);
    }
    r.cgroup_peak_mib = server.cgroup.as_ref().and_then(MemCgroup::peak_mib);
    Ok(())
}

fn run_redis_benchmark(o: &YcsbOptions, tools: &Tools, name: &str, into: &mut Vec<RbResult>) -> Result<(), String> {
    eprintln!("bench ycsb: {name}: redis-benchmark: starting");
    let mut server = start_server(name, o, tools, Datatype::String)?;
    for p in [1, 16] {
        eprintln!("bench ycsb: {name}: redis-benchmark -c {} -P {p}", o.rb_clients);
        let r = redis_benchmark(o, tools, server.addr, p).map_err(|e| server.proc.failed(e))?;
        server.proc.check_alive()?;
        into.extend(r);
    }
    Ok(())
}

// -------------------------------------------------------------- report

/// The peer a row's ratios are taken to: `redis-lru4x` for the -lru4x
/// peers (their hit reads per second), else `o.baseline`.
fn base_of<'a>(o: &'a YcsbOptions, peer: &str) -> &'a str {
    if is_lru(peer) {
        "redis-lru4x"
    } else {
        &o.baseline
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

use crate::report::fmt_opt;
pub use crate::report::Target;

/// The targets of the issue, for the peers and workloads this run has:
/// YCSB A and B, granary-flush >= 2x redis-always, granary >= 0.5x
/// redis-none, granary-lru4x >= 3x redis-lru4x's hit reads per second;
/// resident memory per record <= 1/10 of redis-none's.
pub fn targets(o: &YcsbOptions, report: &YcsbReport) -> Vec<Target> {
    let mut t = Vec::new();
    let wl = |p: &str, dt: Datatype, w: char| report.peer(p)?.datatype(dt)?.workload(w).cloned();
    for &dt in &o.datatypes {
        for w in ['a', 'b'] {
            let up = w.to_ascii_uppercase();
            let d = dt.name();
            for (g, r, bound) in [("granary-flush", "redis-always", 2.0), ("granary", "redis-none", 0.5)] {
                if let (Some(a), Some(b)) = (wl(g, dt, w), wl(r, dt, w)) {
                    if let Some(v) = ratio(Some(a.ops_per_sec()), Some(b.ops_per_sec())) {
                        t.push(Target { what: format!("{up} {d}: {g} / {r} ops/s"), value: v, bound, at_least: true });
                    }
                }
            }
            if let (Some(a), Some(b)) = (wl("granary-lru4x", dt, w), wl("redis-lru4x", dt, w)) {
                if let Some(v) = ratio(a.hits_per_sec(dt), b.hits_per_sec(dt)) {
                    t.push(Target {
                        what: format!("{up} {d}: granary-lru4x / redis-lru4x hit reads/s"),
                        value: v,
                        bound: 3.0,
                        at_least: true,
                    });
                }
            }
        }
        let mem = |p: &str| report.peer(p)?.datatype(dt)?.rss_per_record(o.records);
        if let Some(v) = ratio(mem("granary"), mem("redis-none")) {
            t.push(Target {
                what: format!("{}: granary / redis-none resident bytes per record", dt.name()),
                value: v,
                bound: 0.1,
                at_least: false,
            });
        }
    }
    t
}

pub fn render(o: &YcsbOptions, report: &YcsbReport) -> String {
    let mut s = format!(
        "ycsb (go-ycsb, redis binding): {} records of {} x {} B; {}; {} threads; A/B/C/F keys {} (D: latest)\n",
        o.records,
        o.field_count,
        o.field_bytes,
        match o.secs {
            Some(secs) => format!("{secs} s per workload"),
            None => format!("{} operations per workload", o.operations),
        },
        o.threads,
        o.distribution.name(),
    );
    s += &format!(
        "ratios: ops/s to {}; the -lru4x peers: hit reads/s to redis-lru4x. ops/s and latencies: go-ycsb's TOTAL \
         (successful calls; F's read-modify-write counts as its read and its update)\n",
        o.baseline
    );
    for &dt in &o.datatypes {
        s += &format!(
            "\ndatatype {} ({} B a record with its key; a quarter of the data set: {:.1} MiB)\n",
            dt.name(),
            o.record_bytes(dt),
            o.lru_bytes(dt) as f64 / (1 << 20) as f64
        );
        s += &format!(
            "{:<15} {:>4} {:>9} {:>7} {:>7} {:>8} {:>9} {:>7} {:>7} {:>9}\n",
            "peer", "wl", "ops/s", "ratio", "p50 us", "p99 us", "p99.9 us", "errors", "hit%", "hits/s"
        );
        for p in &report.peers {
            let Some(d) = p.datatype(dt) else { continue };
            let base = report.peer(base_of(o, &p.peer)).and_then(|b| b.datatype(dt));
            if let Some(l) = &d.load {
                s += &format!(
                    "{:<15} {:>4} {:>9.0} {:>7} {:>7.0} {:>8.0} {:>9.0} {:>7}\n",
                    p.peer,
                    "load",
                    l.ops_per_sec(),
                    fmt_opt(
                        ratio(Some(l.ops_per_sec()), base.and_then(|b| b.load.as_ref()).map(|b| b.ops_per_sec())),
                        2
                    ),
                    l.op("TOTAL").map_or(0.0, |t| t.p50_us),
                    l.op("TOTAL").map_or(0.0, |t| t.p99_us),
                    l.op("TOTAL").map_or(0.0, |t| t.p999_us),
                    l.errors(),
                );
            }
            for w in &d.workloads {
                let b = base.and_then(|b| b.workload(w.workload));
                let r = if is_lru(&p.peer) {
                    ratio(w.hits_per_sec(dt), b.and_then(|b| b.hits_per_sec(dt)))
                } else {
                    ratio(Some(w.ops_per_sec()), b.map(|b| b.ops_per_sec()))
                };
                let t = w.op("TOTAL");
                s += &format!(
                    "{:<15} {:>4} {:>9.0} {:>7} {:>7.0} {:>8.0} {:>9.0} {:>7} {:>7} {:>9}\n",
                    p.peer,
                    w.workload.to_ascii_uppercase(),
                    w.ops_per_sec(),
                    fmt_opt(r, 2),
                    t.map_or(0.0, |t| t.p50_us),
                    t.map_or(0.0, |t| t.p99_us),
                    t.map_or(0.0, |t| t.p999_us),
                    w.errors(),
                    fmt_opt(w.hit_ratio(dt).map(|h| 100.0 * h), 1),
                    fmt_opt(w.hits_per_sec(dt), 0),
                );
            }
            if let Some(e) = &d.error {
                s += &format!("{:<15} FAILED: {}\n", p.peer, e.lines().next().unwrap_or(""));
            }
        }
    }
    s += &format!(
        "\nresident memory (VmRSS) after the load, and what the load added per record (ratio to {})\n",
        o.baseline
    );
    s += &format!(
        "{:<15} {:<8} {:>9} {:>10} {:>7} {:>11} {:>13}\n",
        "peer", "datatype", "RSS MiB", "B/record", "ratio", "limit MiB", "cgroup peak"
    );
    for p in &report.peers {
        for d in &p.datatypes {
            let per = d.rss_per_record(o.records);
            let base =
                report.peer(&o.baseline).and_then(|b| b.datatype(d.datatype)).and_then(|b| b.rss_per_record(o.records));
            s += &format!(
                "{:<15} {:<8} {:>9} {:>10} {:>7} {:>11} {:>13}\n",
                p.peer,
                d.datatype.name(),
                fmt_opt(d.rss_after_load_kib.map(|k| k as f64 / 1024.0), 1),
                fmt_opt(per, 0),
                fmt_opt(ratio(per, base), 3),
                fmt_opt(d.maxmemory.or(d.cgroup_limit).map(|b| b as f64 / (1 << 20) as f64), 1),
                fmt_opt(d.cgroup_peak_mib, 1),
            );
        }
    }
    let rb: Vec<&PeerResult> = report.peers.iter().filter(|p| !p.redis_benchmark.is_empty()).collect();
    if !rb.is_empty() {
        let tests: Vec<String> = {
            let mut t: Vec<String> = Vec::new();
            for r in rb.iter().flat_map(|p| &p.redis_benchmark) {
                if !t.contains(&r.test) {
                    t.push(r.test.clone());
                }
            }
            t
        };
        s += &format!(
            "\nredis-benchmark, {} clients, {}: requests/s (ratio to {}); -n {} at -P 1, {} at -P 16\n",
            o.rb_clients,
            if o.rb_keyspace > 0 {
                format!("keys from -r {}", o.rb_keyspace)
            } else {
                "its own keys (one per test)".into()
            },
            o.baseline,
            o.rb_requests,
            o.rb_requests * 10
        );
        s += &format!("{:<15} {:>3}", "peer", "P");
        for t in &tests {
            s += &format!(" {:>20}", t.replace(" (10 keys)", ""));
        }
        s += "\n";
        let rps = |p: &PeerResult, pl: usize, t: &str| {
            p.redis_benchmark.iter().find(|r| r.pipeline == pl && r.test == t).map(|r| r.rps)
        };
        for pl in [1, 16] {
            for p in &rb {
                s += &format!("{:<15} {:>3}", p.peer, pl);
                for t in &tests {
                    let v = rps(p, pl, t);
                    let r = ratio(v, report.peer(&o.baseline).and_then(|b| rps(b, pl, t)));
                    s += &format!(" {:>20}", format!("{} ({})", fmt_opt(v, 0), fmt_opt(r, 2)));
                }
                s += "\n";
            }
        }
    }
    s += &crate::report::render_targets(&targets(o, report));
    for f in report.failures() {
        s += &format!("FAILED {} (the whole message above, on stderr)\n", f.lines().next().unwrap_or(""));
    }
    s
}

fn op_json(s: &OpStats) -> serde_json::Value {
    serde_json::json!({
        "op": s.op, "secs": s.secs, "count": s.count, "ops_per_sec": s.ops_per_sec,
        "us": {"avg": s.avg_us, "min": s.min_us, "max": s.max_us, "p50": s.p50_us, "p90": s.p90_us,
               "p95": s.p95_us, "p99": s.p99_us, "p999": s.p999_us, "p9999": s.p9999_us},
    })
}

fn workload_json(w: &WorkloadResult, dt: Datatype) -> serde_json::Value {
    let t = w.op("TOTAL");
    serde_json::json!({
        "workload": if w.workload == 'l' { "load".to_string() } else { w.workload.to_ascii_uppercase().to_string() },
        "ops_per_sec": w.ops_per_sec(), "secs": w.secs(), "wall_secs": w.wall_secs, "errors": w.errors(),
        "p50_us": t.map(|t| t.p50_us), "p99_us": t.map(|t| t.p99_us), "p999_us": t.map(|t| t.p999_us),
        "read_hits": w.read_hits(dt).map(|h| h.0), "reads": w.read_hits(dt).map(|h| h.1),
        "hit_ratio": w.hit_ratio(dt), "hit_reads_per_sec": w.hits_per_sec(dt),
        "server_keyspace_hits": w.server_hits, "server_keyspace_misses": w.server_misses,
        "ops": w.ops.iter().map(op_json).collect::<Vec<_>>(),
    })
}

pub fn to_json(o: &YcsbOptions, report: &YcsbReport) -> serde_json::Value {
    serde_json::json!({
        "benchmark": "ycsb",
        "client": "go-ycsb (redis binding)",
        "records": o.records, "operations": o.operations, "secs": o.secs, "threads": o.threads,
        "field_count": o.field_count, "field_bytes": o.field_bytes,
        "distribution": format!("{:?}", o.distribution).to_lowercase(),
        "workloads": o.run_order().iter().map(|w| w.to_ascii_uppercase().to_string()).collect::<Vec<_>>(),
        "record_bytes": o.datatypes.iter().map(|&d| (d.name().to_string(), serde_json::json!(o.record_bytes(d))))
            .collect::<serde_json::Map<_, _>>(),
        "granary_size": o.granary_size(), "server_threads": o.server_threads, "baseline": o.baseline,
        "peers": report.peers.iter().map(|p| serde_json::json!({
            "peer": p.peer,
            "datatypes": p.datatypes.iter().map(|d| serde_json::json!({
                "datatype": d.datatype.name(),
                "rss_before_kib": d.rss_before_kib, "rss_after_load_kib": d.rss_after_load_kib,
                "rss_bytes_per_record": d.rss_per_record(o.records),
                "maxmemory": d.maxmemory, "cgroup_limit": d.cgroup_limit, "cgroup_peak_mib": d.cgroup_peak_mib,
                "load": d.load.as_ref().map(|l| workload_json(l, d.datatype)),
                "workloads": d.workloads.iter().map(|w| workload_json(w, d.datatype)).collect::<Vec<_>>(),
                "error": d.error,
            })).collect::<Vec<_>>(),
            "redis_benchmark": {
                "clients": o.rb_clients, "keyspace": o.rb_keyspace,
                "results": p.redis_benchmark.iter().map(|r| serde_json::json!({
                    "pipeline": r.pipeline, "test": r.test, "rps": r.rps, "avg_ms": r.avg_ms,
                    "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "max_ms": r.max_ms,
                })).collect::<Vec<_>>(),
                "error": p.redis_benchmark_error,
            },
        })).collect::<Vec<_>>(),
        "targets": targets(o, report).iter().map(|t| serde_json::json!({
            "what": t.what, "value": t.value, "bound": t.bound,
            "at_least": t.at_least, "met": t.met(),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// go-ycsb v1.0.3's output of `run redis -P workloads/workloada` with
    /// the string datatype against redis-server 7.0, zipfian keys over
    /// [0, recordcount] (key `recordcount` was never loaded: its three
    /// errors), the property lines cut.
    const RUN_A: &str = r#"Using request distribution 'zipfian' a keyrange of [0 10000]
Setting redis.pool_size=8 (from <threadcount>) given you haven't specified a value.
Using the redis datatype: string
***************** properties *****************
"recordcount"="10000"
"redis.datatype"="string"
**********************************************
**********************************************
Run finished, takes 1.317455111s
READ   - Takes(s): 1.3, Count: 9997, OPS: 7591.1, Avg(us): 339, Min(us): 30, Max(us): 19951, 50th(us): 207, 90th(us): 478, 95th(us): 855, 99th(us): 3755, 99.9th(us): 8471, 99.99th(us): 15743
READ_ERROR - Takes(s): 0.7, Count: 1, OPS: 1.4, Avg(us): 59, Min(us): 59, Max(us): 59, 50th(us): 59, 90th(us): 59, 95th(us): 59, 99th(us): 59, 99.9th(us): 59, 99.99th(us): 59
TOTAL  - Takes(s): 1.3, Count: 19997, OPS: 15182.6, Avg(us): 504, Min(us): 30, Max(us): 23759, 50th(us): 285, 90th(us): 788, 95th(us): 1692, 99th(us): 4859, 99.9th(us): 11215, 99.99th(us): 17327
UPDATE - Takes(s): 1.3, Count: 10000, OPS: 7591.7, Avg(us): 669, Min(us): 55, Max(us): 23759, 50th(us): 427, 90th(us): 1039, 95th(us): 2551, 99th(us): 5359, 99.9th(us): 12071, 99.99th(us): 17327
UPDATE_ERROR - Takes(s): 1.2, Count: 2, OPS: 1.6, Avg(us): 366, Min(us): 246, Max(us): 486, 50th(us): 246, 90th(us): 486, 95th(us): 486, 99th(us): 486, 99.9th(us): 486, 99.99th(us): 486
"#;

    /// Workload F (read-modify-write) with the string datatype, half of
    /// its keys never loaded: each missing read is a READ_ERROR.
    const RUN_F: &str = r#"Using request distribution 'uniform' a keyrange of [0 19999]
Using the redis datatype: string
**********************************************
Run finished, takes 1.272656478s
READ   - Takes(s): 1.3, Count: 10037, OPS: 7888.4, Avg(us): 322, Min(us): 31, Max(us): 15703, 50th(us): 234, 90th(us): 538, 95th(us): 641, 99th(us): 2813, 99.9th(us): 8231, 99.99th(us): 13319
READ_ERROR - Takes(s): 1.3, Count: 9963, OPS: 7831.3, Avg(us): 306, Min(us): 20, Max(us): 15719, 50th(us): 221, 90th(us): 517, 95th(us): 619, 99th(us): 3033, 99.9th(us): 8415, 99.99th(us): 11207
READ_MODIFY_WRITE - Takes(s): 1.3, Count: 9956, OPS: 7824.4, Avg(us): 649, Min(us): 21, Max(us): 31551, 50th(us): 364, 90th(us): 1158, 95th(us): 1820, 99th(us): 5075, 99.9th(us): 13327, 99.99th(us): 22607
TOTAL  - Takes(s): 1.3, Count: 15052, OPS: 11827.6, Avg(us): 431, Min(us): 31, Max(us): 18543, 50th(us): 274, 90th(us): 688, 95th(us): 1099, 99th(us): 3669, 99.9th(us): 9887, 99.99th(us): 15703
UPDATE - Takes(s): 1.3, Count: 5015, OPS: 3942.7, Avg(us): 648, Min(us): 54, Max(us): 18543, 50th(us): 478, 90th(us): 1135, 95th(us): 1357, 99th(us): 4903, 99.9th(us): 11367, 99.99th(us): 16103
"#;

    /// A load, and a run ended by SIGINT (`--secs`).
    const LOAD: &str = "Run finished, takes 419.278332ms
INSERT - Takes(s): 0.4, Count: 10000, OPS: 23895.6, Avg(us): 311, Min(us): 24, Max(us): 8043, 50th(us): 232, 90th(us): 378, 95th(us): 541, 99th(us): 4007, 99.9th(us): 5719, 99.99th(us): 7979
TOTAL  - Takes(s): 0.4, Count: 10000, OPS: 23888.8, Avg(us): 311, Min(us): 24, Max(us): 8043, 50th(us): 232, 90th(us): 378, 95th(us): 541, 99th(us): 4007, 99.9th(us): 5719, 99.99th(us): 7979
";
    const SIGINT: &str = "**********************************************

Got signal [interrupt] to exit.
**********************************************
Run finished, takes 1.961425742s
READ   - Takes(s): 2.0, Count: 65058, OPS: 33173.5, Avg(us): 118, Min(us): 20, Max(us): 11807, 50th(us): 90, 90th(us): 151, 95th(us): 173, 99th(us): 509, 99.9th(us): 4651, 99.99th(us): 8591
TOTAL  - Takes(s): 2.0, Count: 65058, OPS: 33171.9, Avg(us): 118, Min(us): 20, Max(us): 11807, 50th(us): 90, 90th(us): 151, 95th(us): 173, 99th(us): 509, 99.9th(us): 4651, 99.99th(us): 8591
";

    #[test]
    fn parses_go_ycsb_summary_lines() {
        let ops = parse_summary(RUN_A);
        let names: Vec<&str> = ops.iter().map(|o| o.op.as_str()).collect();
        assert_eq!(names, ["READ", "READ_ERROR", "TOTAL", "UPDATE", "UPDATE_ERROR"]);
        let t = &ops[2];
        assert_eq!(
            *t,
            OpStats {
                op: "TOTAL".into(),
                secs: 1.3,
                count: 19997,
                ops_per_sec: 15182.6,
                avg_us: 504.0,
                min_us: 30.0,
                max_us: 23759.0,
                p50_us: 285.0,
                p90_us: 788.0,
                p95_us: 1692.0,
                p99_us: 4859.0,
                p999_us: 11215.0,
                p9999_us: 17327.0,
            }
        );
        let w = WorkloadResult { workload: 'a', ops, wall_secs: parse_run_finished(RUN_A), ..Default::default() };
        assert_eq!(w.ops_per_sec(), 15182.6);
        assert!((w.secs() - 19997.0 / 15182.6).abs() < 1e-9);
        assert_eq!(w.errors(), 3);
        assert_eq!(w.wall_secs, Some(1.317455111));
        // The string layout: a READ_ERROR is a miss.
        assert_eq!(w.read_hits(Datatype::String), Some((9997, 9998)));
        // The hash layout: misses only from the server's counters.
        assert_eq!(w.read_hits(Datatype::Hash), None);
    }

    #[test]
    fn read_modify_write_is_not_an_extra_call() {
        let w = WorkloadResult { workload: 'f', ops: parse_summary(RUN_F), ..Default::default() };
        assert_eq!(w.op("READ_MODIFY_WRITE").map(|o| o.count), Some(9956));
        // TOTAL = READ + UPDATE (the read-modify-writes' included).
        assert_eq!(w.op("TOTAL").unwrap().count, 10037 + 5015);
        assert_eq!(w.errors(), 9963);
        let (hits, reads) = w.read_hits(Datatype::String).unwrap();
        assert_eq!((hits, reads), (10037, 20000));
        assert!((w.hit_ratio(Datatype::String).unwrap() - 0.50185).abs() < 1e-9);
        let per_sec = w.hits_per_sec(Datatype::String).unwrap();
        assert!((per_sec - 10037.0 / (15052.0 / 11827.6)).abs() < 1e-6, "{per_sec}");
    }

    #[test]
    fn hash_hits_come_from_the_server() {
        let mut w = WorkloadResult { workload: 'c', ops: parse_summary(SIGINT), ..Default::default() };
        assert_eq!(w.read_hits(Datatype::Hash), None);
        (w.server_hits, w.server_misses) = (Some(750), Some(250));
        assert_eq!(w.read_hits(Datatype::Hash), Some(((65058.0f64 * 0.75).round() as u64, 65058)));
        (w.server_hits, w.server_misses) = (Some(0), Some(0));
        assert_eq!(w.read_hits(Datatype::Hash), Some((0, 65058)));
    }

    #[test]
    fn parses_loads_and_interrupted_runs() {
        let l = parse_summary(LOAD);
        assert_eq!(l.len(), 2);
        assert_eq!((l[0].op.as_str(), l[0].count, l[0].p999_us), ("INSERT", 10000, 5719.0));
        assert_eq!(parse_run_finished(LOAD), Some(0.419278332));
        let s = parse_summary(SIGINT);
        assert_eq!(s.iter().map(|o| o.count).collect::<Vec<_>>(), [65058, 65058]);
        assert!((parse_run_finished(SIGINT).unwrap() - 1.961425742).abs() < 1e-12);
    }

    #[test]
    fn other_lines_are_skipped() {
        for l in [
            "",
            "Run finished, takes 1s",
            "\"operationcount\"=\"1000\"",
            "READ - something else",
            "READ - Takes(s): x, Count: 1",
            "READ - Takes(s): 1.0, Count: 5",
            "create db redis failed NOPROTO unsupported protocol version",
        ] {
            assert!(parse_summary(l).is_empty(), "{l:?}");
        }
    }

    #[test]
    fn go_durations() {
        let near = |s: &str, want: f64| {
            let got = parse_go_duration(s).unwrap_or_else(|| panic!("{s:?} did not parse"));
            assert!((got - want).abs() <= want * 1e-12, "{s:?}: {got} != {want}");
        };
        near("1.5s", 1.5);
        near("1m2.5s", 62.5);
        near("1h0m1s", 3601.0);
        near("3.721224ms", 0.003721224);
        near("950µs", 0.00095);
        near("950us", 0.00095);
        near("12ns", 12e-9);
        near("0s", 0.0);
        for bad in ["", "5 s", "5", "s", "1.5x"] {
            assert_eq!(parse_go_duration(bad), None, "{bad:?}");
        }
    }

    /// redis-benchmark 7.0.15's `--csv` output against a server that
    /// refused CONFIG GET (its warning line is skipped).
    #[test]
    fn parses_redis_benchmark_csv() {
        let text = r#""test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"PING_INLINE","465116.25","1.496","0.216","0.543","8.135","8.911","9.103"
"PING_MBULK","465116.25","1.406","0.080","0.543","5.087","6.807","6.999"
"SET","769230.75","0.794","0.208","0.503","4.471","4.727","4.887"
"GET","512820.50","1.016","0.120","0.391","4.095","4.479","4.503"
"INCR","526315.81","1.062","0.128","0.407","4.927","6.423","6.455"
"MSET (10 keys)","263157.91","2.852","0.320","2.599","6.159","7.231","7.495"
WARNING: Could not fetch server CONFIG
"#;
        let r = parse_rb_csv(text, 16);
        assert_eq!(r.len(), 6);
        assert_eq!(
            r[5],
            RbResult {
                pipeline: 16,
                test: "MSET (10 keys)".into(),
                rps: 263157.91,
                avg_ms: 2.852,
                p50_ms: 2.599,
                p99_ms: 7.231,
                max_ms: 7.495
            }
        );
        assert_eq!(r.iter().map(|r| r.test.as_str()).collect::<Vec<_>>()[..2], ["PING_INLINE", "PING_MBULK"]);
    }

    #[test]
    fn record_sizes_match_what_redis_stored() {
        let o = YcsbOptions::default();
        // STRLEN of a record go-ycsb loaded with 10 fields of 100 bytes.
        assert_eq!(o.value_bytes(Datatype::String), 1481);
        assert_eq!(o.value_bytes(Datatype::Hash), 10 * (6 + 100));
        assert_eq!(o.record_bytes(Datatype::String), 1481 + KEY_BYTES);
        let one = YcsbOptions { field_count: 1, field_bytes: 2, ..YcsbOptions::default() };
        // {"field0":"AAA="}
        assert_eq!(one.value_bytes(Datatype::String), r#"{"field0":"AAA="}"#.len());
        assert_eq!(o.lru_bytes(Datatype::String), 100_000 * (1481 + KEY_BYTES as u64) / 4);
        let size = o.granary_size();
        assert!(size >= 4 * 100_000 * 1514 && size % (1 << 20) == 0, "{size}");
    }

    #[test]
    fn workloads_run_in_order_with_d_last() {
        let o = YcsbOptions { workloads: vec!['d', 'f', 'a'], ..YcsbOptions::default() };
        assert_eq!(o.run_order(), ['a', 'f', 'd']);
    }

    #[test]
    fn resp_replies_are_read() {
        let mut r = BufReader::new(
            &b"+PONG\r\n-ERR unknown command 'HELLO'\r\n:42\r\n$-1\r\n$5\r\nab\r\nc\r\n*2\r\n$1\r\nx\r\n*-1\r\n"[..],
        );
        assert_eq!(read_resp(&mut r).unwrap(), Resp::Simple("PONG".into()));
        assert_eq!(read_resp(&mut r).unwrap(), Resp::Error("ERR unknown command 'HELLO'".into()));
        assert_eq!(read_resp(&mut r).unwrap(), Resp::Int(42));
        assert_eq!(read_resp(&mut r).unwrap(), Resp::Bulk(None));
        assert_eq!(read_resp(&mut r).unwrap(), Resp::Bulk(Some(b"ab\r\nc".to_vec())));
        assert_eq!(
            read_resp(&mut r).unwrap(),
            Resp::Array(Some(vec![Resp::Bulk(Some(b"x".to_vec())), Resp::Array(None)]))
        );
        assert!(read_resp(&mut r).is_err(), "end of input");
        assert!(read_resp(&mut BufReader::new(&b"?what\r\n"[..])).is_err());
    }

    #[test]
    fn info_fields() {
        let info = "# Stats\r\ntotal_connections_received:3\r\nkeyspace_hits:35096\r\nkeyspace_misses:10154\r\n";
        assert_eq!(info_field(info, "keyspace_hits"), Some(35096));
        assert_eq!(info_field(info, "keyspace_misses"), Some(10154));
        assert_eq!(info_field(info, "keyspace"), None);
    }

    #[test]
    fn targets_compare_the_named_peers() {
        let o = YcsbOptions {
            datatypes: vec![Datatype::String],
            workloads: vec!['a'],
            records: 1000,
            ..Default::default()
        };
        let wl = |ops: f64, reads: u64, misses: u64| WorkloadResult {
            workload: 'a',
            ops: vec![
                OpStats { op: "TOTAL".into(), count: 1000, ops_per_sec: ops, ..Default::default() },
                OpStats { op: "READ".into(), count: reads, ..Default::default() },
                OpStats { op: "READ_ERROR".into(), count: misses, ..Default::default() },
            ],
            ..Default::default()
        };
        let peer = |name: &str, w: WorkloadResult, rss: (u64, u64)| PeerResult {
            peer: name.into(),
            datatypes: vec![DatatypeResult {
                workloads: vec![w],
                rss_before_kib: Some(rss.0),
                rss_after_load_kib: Some(rss.1),
                ..DatatypeResult::new(Datatype::String)
            }],
            redis_benchmark: Vec::new(),
            redis_benchmark_error: None,
        };
        let report = YcsbReport {
            peers: vec![
                peer("redis-none", wl(1000.0, 500, 0), (8000, 10000)),
                peer("granary", wl(600.0, 500, 0), (8000, 8100)),
                peer("redis-lru4x", wl(1000.0, 100, 400), (0, 0)),
                peer("granary-lru4x", wl(500.0, 500, 0), (0, 0)),
            ],
        };
        let t = targets(&o, &report);
        let find = |s: &str| t.iter().find(|t| t.what.contains(s)).unwrap_or_else(|| panic!("{s}: {t:?}"));
        let g = find("granary / redis-none ops/s");
        assert!((g.value - 0.6).abs() < 1e-9 && g.met());
        // 250 hits/s at 500 ops/s over 1000 calls against 100 hits/s.
        let l = find("hit reads/s");
        assert!((l.value - 2.5).abs() < 1e-9 && !l.met(), "{l:?}");
        let m = find("resident bytes per record");
        assert!((m.value - 0.05).abs() < 1e-9 && m.met());
        assert!(t.iter().all(|t| !t.what.contains("granary-flush")), "no such peer in the run");
        // The table and the JSON hold them too.
        let text = render(&o, &report);
        assert!(text.contains("MISSED") && text.contains("met"), "{text}");
        assert_eq!(to_json(&o, &report)["targets"].as_array().unwrap().len(), t.len());
    }
}
