//! `granary serve` as a process on a real file: it serves memcache on the
//! given port, stops cleanly on SIGTERM (the next start is a clean restart
//! that reads no log), and after SIGKILL comes back with every
//! acknowledged write (warm restart after a crash).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;

struct Serve {
    child: Child,
    port: u16,
    native_port: u16,
    /// The Redis protocol's port (unless `--no-resp`).
    resp_port: u16,
    /// stderr up to the "serving" line.
    log: String,
    /// stderr lines after it.
    later: std::sync::mpsc::Receiver<String>,
}

fn free_port() -> u16 {
    granary_rt::net::free_low_port().unwrap()
}

impl Serve {
    /// Start `granary serve` and wait for its "serving" line.
    fn start(data: &Path) -> Serve {
        Serve::start_with(data, &[])
    }

    fn start_with(data: &Path, extra: &[&str]) -> Serve {
        let port = free_port();
        let native_port = free_port();
        let port_s = port.to_string();
        let mut args = vec!["serve", "--data", data.to_str().unwrap(), "--size", "64M", "-p", &port_s, "-t", "2"];
        let native_s = native_port.to_string();
        if !extra.contains(&"--no-native") {
            args.extend(["--native-port", &native_s]);
        }
        let resp_port = free_port();
        let resp_s = resp_port.to_string();
        if !extra.contains(&"--no-resp") {
            args.extend(["--resp-port", &resp_s]);
        }
        args.extend(extra);
        // Every listener is up: the native line comes last (or the memcache
        // line, with --no-native).
        let common::Started { child, log, later, .. } = spawn_until(&args, |line| {
            line.contains("serving the native protocol") || (line.contains("serving") && extra.contains(&"--no-native"))
        });
        Serve { child, port, native_port, resp_port, log, later }
    }

    /// Wait (60 s at most) for a stderr line containing `pat`.
    fn wait_for_line(&self, pat: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.later.recv_timeout(left) {
                Ok(l) if l.contains(pat) => return l,
                Ok(_) => {}
                Err(e) => panic!("no line with {pat:?} from granary serve: {e}"),
            }
        }
    }

    /// Send `sig` without waiting for the process.
    fn send_signal(&self, sig: i32) {
        // SAFETY: kill with a pid of our own child.
        unsafe { libc_kill(self.child.id() as i32, sig) };
    }

    fn call(&self, req: &[u8]) -> Vec<u8> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(req).unwrap();
        s.write_all(b"mn\r\n").unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        while !got.ends_with(b"MN\r\n") {
            // A read with a timeout set fails with EINTR when this process
            // is stopped and continued meanwhile (signal(7)): read again.
            let n = match s.read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => r.unwrap(),
            };
            assert!(n > 0, "connection closed");
            got.extend_from_slice(&buf[..n]);
        }
        got.truncate(got.len() - 4);
        got
    }

    fn signal(mut self, sig: i32) -> std::process::ExitStatus {
        // SAFETY: kill with a pid of our own child.
        unsafe { libc_kill(self.child.id() as i32, sig) };
        self.child.wait().unwrap()
    }
}

/// Start `granary ARGS` (log level info) and wait (bounded) for the first
/// stderr line for which `until` holds.
fn spawn_until(args: &[&str], until: impl Fn(&str) -> bool) -> common::Started {
    common::start_or_panic(&mut common::granary(args), until, common::START_LIMIT)
}

/// A failed test must not leave its server running.
impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;
const SIGINT: i32 = 2;
const SIGCONT: i32 = 18;
const SIGSTOP: i32 = 19;

fn stat(s: &Serve, name: &str) -> String {
    let out = String::from_utf8(s.call(b"stats\r\n")).unwrap();
    let prefix = format!("STAT {name} ");
    out.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("no {name} in stats")).to_string()
}

#[test]
fn sigterm_is_a_clean_stop_and_sigkill_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("sub/cache.db");
    let s = Serve::start(&data);
    assert!(data.exists(), "the data file (and its directory) is created");
    let mut req = Vec::new();
    for i in 0..500 {
        req.extend_from_slice(format!("set key-{i} {i} 0 7\r\nvalue-{}\r\n", i % 10).as_bytes());
    }
    assert_eq!(s.call(&req), b"STORED\r\n".repeat(500));
    let gets = s.call(b"gets key-7\r\n");
    let status = s.signal(SIGTERM);
    assert!(status.success(), "SIGTERM exits 0, got {status:?}");

    let s = Serve::start(&data);
    assert_eq!(s.call(b"gets key-7\r\n"), gets, "flags, value and CAS value survive");
    assert_eq!(stat(&s, "curr_items"), "500");
    s.call(b"flush_all\r\n");
    assert_eq!(s.call(b"get key-1\r\n"), b"END\r\n");
    for i in 0..100 {
        assert_eq!(s.call(format!("set new-{i} 0 0 1\r\nx\r\n").as_bytes()), b"STORED\r\n");
    }
    assert!(!s.signal(SIGKILL).success());

    // After a crash: everything acknowledged is there, the flush still holds.
    let s = Serve::start(&data);
    for i in 0..100 {
        assert_eq!(
            s.call(format!("get new-{i}\r\n").as_bytes()),
            format!("VALUE new-{i} 0 1\r\nx\r\nEND\r\n").as_bytes()
        );
    }
    assert_eq!(s.call(b"get key-1\r\n"), b"END\r\n");
    assert!(s.signal(SIGTERM).success());
}

/// With `-A`, the Memcache `shutdown` command stops the server as SIGTERM
/// does: exit 0, "stopped cleanly", and a clean restart with every value.
/// A second `shutdown` (another connection's) changes nothing: it must not
/// be the second SIGTERM that means "stop now, uncleanly".
#[test]
fn memcache_shutdown_with_a_stops_cleanly() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("cache.db");
    let mut s = Serve::start_with(&data, &["-A"]);
    assert_eq!(s.call(b"set k 3 0 2\r\nhi\r\n"), b"STORED\r\n");
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut again = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    c.write_all(b"shutdown\r\n").unwrap();
    let _ = again.write_all(b"shutdown\r\n");
    s.wait_for_line("stopped cleanly");
    assert!(s.child.wait().unwrap().success(), "shutdown exits 0");
    // No reply, as memcached: the connection is closed.
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{rest:?}");

    let s = Serve::start(&data);
    assert_eq!(s.call(b"get k\r\n"), b"VALUE k 3 2\r\nhi\r\nEND\r\n");
    assert_eq!(s.call(b"shutdown\r\n"), b"ERROR: shutdown not enabled\r\n");
    assert!(s.signal(SIGTERM).success());
}

/// SIGINT (Ctrl-C) stops the server as SIGTERM does: exit 0, a
/// checkpoint, and a clean restart with every value.
#[test]
fn sigint_is_a_clean_stop_too() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("int.db");
    let metrics = format!("127.0.0.1:{}", free_port());
    let s = Serve::start_with(&data, &["--metrics", &metrics]);
    let mut req = Vec::new();
    for i in 0..50 {
        req.extend_from_slice(format!("set int-{i} {i} 0 3\r\nv{:02}\r\n", i).as_bytes());
    }
    assert_eq!(s.call(&req), b"STORED\r\n".repeat(50));
    assert_eq!(s.signal(SIGINT).code(), Some(0), "SIGINT exits 0");

    let metrics = format!("127.0.0.1:{}", free_port());
    let s = Serve::start_with(&data, &["--metrics", &metrics]);
    let (_, page) = http_get(&metrics, "/metrics");
    assert_eq!(sample(&page, "granary_recovery_clean"), 1.0, "the restart after SIGINT is clean");
    assert_eq!(sample(&page, "granary_store_keys"), 50.0);
    assert_eq!(s.call(b"get int-42\r\n"), b"VALUE int-42 42 3\r\nv42\r\nEND\r\n");
    assert_eq!(s.signal(SIGTERM).code(), Some(0));
}

#[test]
fn the_sync_io_backend_serves_too() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("sync.db");
    let s = Serve::start_with(&data, &["--io", "sync", "--no-evict"]);
    assert_eq!(s.call(b"set k 3 0 2\r\nhi\r\nget k\r\n"), b"STORED\r\nVALUE k 3 2\r\nhi\r\nEND\r\n");
    assert_eq!(stat(&s, "curr_items"), "1");
    assert!(s.signal(SIGTERM).success());
    let s = Serve::start(&data);
    assert_eq!(s.call(b"get k\r\n"), b"VALUE k 3 2\r\nhi\r\nEND\r\n");
    assert!(s.signal(SIGTERM).success());
}

/// GC's settings reach the store: the defaults, then each flag, then the
/// same from a `--config` file, as `stats` reports them
/// (`granary_gc_policy`, `granary_gc_hot_cold`, `granary_gc_watermark`,
/// `granary_gc_discard`: `discard auto` resolves to off on a file).
#[test]
fn gc_settings_reach_the_store_and_stats_report_them() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("gc.db");
    let gc_stats = |s: &Serve| {
        ["granary_gc_policy", "granary_gc_hot_cold", "granary_gc_sepbit", "granary_gc_watermark", "granary_gc_discard"]
            .map(|n| stat(s, n))
    };
    let s = Serve::start(&data);
    assert_eq!(gc_stats(&s), ["cost-benefit", "0", "0", "fixed", "0"]);
    assert!(s.signal(SIGTERM).success());
    let flags = ["--gc-policy", "greedy", "--gc-hot-cold", "--gc-watermark", "doubling", "--discard", "on"];
    let s = Serve::start_with(&data, &flags);
    assert_eq!(gc_stats(&s), ["greedy", "1", "0", "doubling", "1"]);
    assert!(s.signal(SIGTERM).success());
    // SepBIT implies hot/cold relocation.
    let s = Serve::start_with(&data, &["--gc-sepbit"]);
    assert_eq!(gc_stats(&s), ["cost-benefit", "1", "1", "fixed", "0"]);
    assert!(s.signal(SIGTERM).success());
    let file = dir.path().join("gc.toml");
    std::fs::write(&file, "gc_policy = \"greedy\"\ngc_sepbit = true\ngc_watermark = \"queue\"\ndiscard = \"off\"\n")
        .unwrap();
    let s = Serve::start_with(&data, &["--config", file.to_str().unwrap()]);
    assert_eq!(gc_stats(&s), ["greedy", "1", "1", "queue", "0"]);
    assert!(s.signal(SIGTERM).success());
}

/// `--data a,b` serves from a RAID-0 stripe set (the files created half
/// the size each), and after SIGKILL a restart with the members named the
/// other way round brings back every acknowledged value, also one that
/// spans stripes.
#[test]
fn a_stripe_set_serves_and_comes_back_after_a_crash() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (a, b) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let set = std::path::PathBuf::from(format!("{},{}", a.display(), b.display()));
    let s = Serve::start(&set);
    let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut req = format!("set big 1 0 {}\r\n", big.len()).into_bytes();
    req.extend_from_slice(&big);
    req.extend_from_slice(b"\r\nset k 0 0 5\r\nhello\r\n");
    assert_eq!(s.call(&req), b"STORED\r\nSTORED\r\n");
    for m in [&a, &b] {
        let len = std::fs::metadata(m).unwrap().len();
        assert!(len > 32 << 20 && len < 33 << 20, "{} is {len} bytes", m.display());
    }
    assert!(!s.signal(SIGKILL).success());
    let s = Serve::start(&std::path::PathBuf::from(format!("{},{}", b.display(), a.display())));
    assert_eq!(s.call(b"get k\r\n"), b"VALUE k 0 5\r\nhello\r\nEND\r\n");
    let got = s.call(b"get big\r\n");
    let head = format!("VALUE big 1 {}\r\n", big.len());
    assert_eq!(&got[..head.len()], head.as_bytes());
    assert_eq!(&got[head.len()..head.len() + big.len()], &big[..]);
    assert!(s.signal(SIGTERM).success());
}

/// A short `granary-bench memcache` (2000 keys of 100 bytes, 4
/// connections, 0.5 s, no memcaslap, no device reference) with `args`,
/// its files in `dir`:
/// its output, which must say it succeeded, and its JSON report.
fn bench_memcache(dir: &std::path::Path, args: &[&str]) -> (std::process::Output, serde_json::Value) {
    let json = dir.join("r.json");
    let out = Command::new(env!("CARGO_BIN_EXE_granary-bench"))
        .args(["memcache", "--keys", "2000", "--conns", "4", "--secs", "0.5", "--no-memcaslap"])
        .args(["--value-bytes", "100", "--no-device-ref"])
        .args(args)
        .arg("--dir")
        .arg(dir)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (out, serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap())
}

#[test]
fn bench_memcache_drives_granary_serve_and_reports_json() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (out, v) = bench_memcache(dir.path(), &["--peers", "granary", "--disk", "64M", "--dist", "zipf"]);
    let p = &v["peers"][0];
    assert_eq!(p["peer"], "granary");
    assert!(p["ops"].as_u64().unwrap() > 0);
    assert_eq!(p["hit_ratio"].as_f64().unwrap(), 1.0, "every key was loaded first");
    assert_eq!(p["errors"].as_u64().unwrap(), 0);
    // The server's CPU and context switches over the measured phase: a
    // server that served requests used some of both.
    assert!(p["server_cpu_us_per_op"].as_f64().is_some(), "{p}");
    assert!(p["server_switches_per_op"].as_f64().unwrap() > 0.0, "{p}");
    // The whole machine's CPU per operation includes the server's own
    // (halved: the two are read a moment apart, in 10 ms ticks).
    let machine = p["machine_cpu_us_per_op"].as_f64().unwrap();
    assert!(machine > 0.0 && machine >= p["server_cpu_us_per_op"].as_f64().unwrap() * 0.5, "{p}");
    assert!(v["device_ref"].is_null() && v["ceiling_vs_memcached"].is_null(), "--no-device-ref");
    assert!(String::from_utf8_lossy(&out.stdout).contains("granary"));
    // Granary's DRAM tier is a tenth of the data set, at least 1 MiB, and
    // serves some of the Zipfian GETs.
    assert!(v["granary_mib"].as_u64().unwrap() >= 1, "{v}");
    assert!(p["dram_hit_ratio"].as_f64().is_some_and(|h| h > 0.0 && h <= 1.0), "{p}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("granary: -m {} ", v["granary_mib"])));
    // The data file is removed afterwards.
    assert!(!dir.path().join("bench-memcache-granary.db").exists());
}

/// The device reference: fio's machine CPU per 4 KiB direct read on a
/// file in the data directory (removed afterwards), and the ceiling it
/// puts on a server that reads the device per GET, from memcached's
/// machine CPU per operation. Needs memcached and fio (scripts/test.sh
/// installs both); skipped without them unless GRANARY_REQUIRE_PEERS is set.
#[test]
fn bench_memcache_measures_the_device_read_and_the_ceiling_it_sets() {
    let on_path = |tool: &str| {
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
    };
    let (memcached, fio) = (on_path("memcached"), on_path("fio"));
    if !(memcached && fio) {
        assert!(std::env::var_os("GRANARY_REQUIRE_PEERS").is_none(), "memcached and fio are required");
        eprintln!("skipped: needs memcached ({memcached}) and fio ({fio})");
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let json = dir.path().join("r.json");
    let out = Command::new(env!("CARGO_BIN_EXE_granary-bench"))
        .args(["memcache", "--keys", "2000", "--conns", "4", "--secs", "0.5", "--no-memcaslap"])
        .args(["--value-bytes", "100", "--peers", "memcached", "--memory-mib", "64", "--dir"])
        .arg(dir.path())
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let d = &v["device_ref"];
    assert!(d["reads_per_sec"].as_f64().unwrap() > 0.0, "{d}");
    assert!(d["machine_cpu_us_per_read"].as_f64().unwrap() > 0.0, "{d}");
    // memcached's figure and the device's: a ratio strictly between 0 and 1.
    let c = v["ceiling_vs_memcached"].as_f64().unwrap();
    assert!(c > 0.0 && c < 1.0, "{c}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("device reference") && text.contains("ceiling"), "{text}");
    assert!(!dir.path().join("bench-memcache-fio.db").exists(), "the reference's file is removed");
}

/// The capped extstore peer runs memcached in a memory cgroup: its peak
/// charge (page cache included) is reported and stays within the limit,
/// and the cgroup is removed afterwards. Needs memcached, root and a
/// memory cgroup hierarchy; skipped (with a line saying so) without them.
#[test]
fn bench_memcache_caps_extstore_in_a_memory_cgroup() {
    let has_memcached =
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("memcached").is_file()));
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let v1 = std::path::Path::new("/sys/fs/cgroup/memory");
    // A child cgroup with a memory limit must be possible here (not so in
    // some containers, whose cgroup v2 root cannot delegate the controller).
    let cgroups = root && {
        let v2 = std::path::Path::new("/sys/fs/cgroup");
        let (base, limit) = if v1.join("cgroup.procs").exists() {
            (v1, "memory.limit_in_bytes")
        } else {
            let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+memory");
            (v2, "memory.max")
        };
        let probe = base.join(format!("granary-probe-{}", std::process::id()));
        let ok = std::fs::create_dir(&probe).is_ok() && std::fs::write(probe.join(limit), "134217728").is_ok();
        let _ = std::fs::remove_dir(&probe);
        ok
    };
    if !has_memcached && std::env::var_os("GRANARY_REQUIRE_PEERS").is_some() {
        panic!("memcached is required (scripts/test.sh installs it)");
    }
    if !(has_memcached && root && cgroups) {
        eprintln!("skipped: needs memcached ({has_memcached}), root ({root}) and a memory cgroup ({cgroups})");
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (_, v) = bench_memcache(dir.path(), &["--peers", "extstore-capped", "--disk", "1G", "--memory-mib", "64"]);
    let p = &v["peers"][0];
    assert_eq!(p["peer"], "extstore-capped");
    assert!(p["ops"].as_u64().unwrap() > 0, "{p}");
    let peak = p["cgroup_peak_mib"].as_f64().unwrap_or_else(|| panic!("no cgroup peak: {p}"));
    assert!(peak > 0.0 && peak <= 64.0 + 64.0, "peak {peak} MiB beyond the 128 MiB limit");
    assert!(p["server_peak_rss_mib"].as_f64().unwrap() > 0.0, "{p}");
    let root = if v1.exists() { v1 } else { std::path::Path::new("/sys/fs/cgroup") };
    let left: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("granary-bench-extstore-capped-"))
        .collect();
    assert!(left.is_empty(), "cgroups left behind: {left:?}");
}

fn granary(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_granary")).args(args).output().unwrap()
}

/// `granary serve --data DATA --size 64M EXTRA..` fails saying `want`,
/// and no data file is created.
fn refused_before_the_store(data: &Path, extra: &[&str], want: &str) {
    let mut args = vec!["serve", "--data", data.to_str().unwrap(), "--size", "64M"];
    args.extend(extra.iter().copied());
    let o = granary(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains(want), "{args:?}: {err}");
    assert!(!data.exists(), "no data file is created");
}

/// Two listeners given one port are refused before the data file is
/// created (their sockets could both bind; only listening would clash).
#[test]
fn two_listeners_on_one_port_are_refused_before_the_store() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("g.db");
    let p = free_port().to_string();
    let metrics = format!("127.0.0.1:{p}");
    for (extra, want) in [
        (vec!["-p", &p, "--native-port", &p], "the memcache port (-p) and --native-port are both port"),
        (vec!["--native-port", &p, "--resp-port", &p], "--native-port and --resp-port are both port"),
        (vec!["-p", &p, "--metrics", &metrics], "the memcache port (-p) and --metrics are both port"),
    ] {
        refused_before_the_store(&data, &extra, want);
    }
}

/// A setting for a listener that is off is refused, naming both, before
/// the data file is created: it would do nothing (a token or password
/// meant to guard a listener never silently ignored).
#[test]
fn settings_for_a_listener_that_is_off_are_refused() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("g.db");
    let d = data.to_str().unwrap();
    for (extra, want) in [
        (
            &["--no-native", "--native-token", "t0ken"][..],
            "native_token has no effect with the native listener off (native = false, --no-native)",
        ),
        (&["--no-native", "--native-port", "12000"], "native_port has no effect with the native listener off"),
        (
            &["--no-resp", "--requirepass", "pw"],
            "requirepass has no effect with the RESP listener off (resp = false, --no-resp)",
        ),
        (&["--no-resp", "--resp-port", "12001"], "resp_port has no effect with the RESP listener off"),
        (&["--no-resp", "--aclfile", "/nonexistent"], "aclfile has no effect with the RESP listener off"),
    ] {
        refused_before_the_store(&data, extra, want);
    }
    // Either alone is fine: the configuration prints; and a flag unsets
    // a file's value, as the error says.
    // A file (named `name`, holding `text`) whose setting `--no-resp`
    // leaves without effect: refused, with the flag that unsets it.
    let refused_with_advice = |name: &str, text: &str, key: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        let o = granary(&["serve", "--data", d, "--config", file.to_str().unwrap(), "--no-resp", "--print-config"]);
        let err = String::from_utf8_lossy(&o.stderr);
        let advice = format!("`--{} \"\"` unsets a file's {key}", key.replace('_', "-"));
        assert!(!o.status.success() && err.contains(&advice), "{err}");
        file
    };
    let shared = refused_with_advice("shared.toml", "requirepass = \"pw\"\nnative_token = \"t0ken\"\n", "requirepass");
    let s = shared.to_str().unwrap();
    // The same for a path setting: its flag takes an empty path.
    let acl = refused_with_advice("acl.toml", "aclfile = \"/etc/granary/users.acl\"\n", "aclfile");
    let a = acl.to_str().unwrap();
    let o = granary(&["serve", "--data", d, "--config", a, "--no-resp", "--aclfile", "", "--print-config"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("aclfile = \"\"\n"), "{out}");
    // An empty store path, from a flag or the file, is refused as such.
    let empty = dir.path().join("empty.toml");
    std::fs::write(&empty, "data = \"\"\n").unwrap();
    for args in [&["serve", "--data", ""][..], &["serve", "--config", empty.to_str().unwrap()]] {
        let o = granary(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("data: the store's path is empty"), "{args:?}: {err}");
    }
    for extra in [
        &["--no-native"][..],
        &["--native-token", "t0ken"],
        &["--no-resp"],
        &["--requirepass", "pw"],
        &["--config", s, "--no-resp", "--requirepass", "", "--no-native", "--native-token", ""],
    ] {
        let mut args = vec!["serve", "--data", d, "--print-config"];
        args.extend(extra.iter().copied());
        let o = granary(&args);
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

/// A stop signal during the zero fill of a new data file (seconds per
/// GiB-sized file, minutes for a large one) stops the creation and removes
/// the file, for `granary serve` (SIGTERM) and `granary create` (SIGINT,
/// Ctrl-C); a second server started meanwhile is refused (the new file is
/// locked from the start); and the path is free for the next start. After
/// a SIGKILL in the fill, the next start creates the file again. During
/// the fill the server's port refuses connections (bound, not listening).
#[test]
fn a_stop_signal_during_the_zero_fill_removes_the_new_file() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("big.db");
    let d = data.to_str().unwrap();
    // 4 GiB: seconds of writing, so the stop below lands inside the fill.
    let port = free_port().to_string();
    let serve = ["serve", "--data", d, "--size", "4G", "-p", &port, "-t", "1", "--no-native", "--no-resp"];
    let create = ["create", d, "--size", "4G"];
    for (args, sig, name) in [(&serve[..], SIGTERM, "SIGTERM"), (&create[..], SIGINT, "SIGINT")] {
        let common::Started { mut child, mut log, later, .. } =
            spawn_until(args, |line| line.contains("writing zeros over the new data file"));
        // Stopped at once (the fill takes seconds), so the checks below and
        // the signal all come inside the fill, however long they take;
        // continued after the signal, which it finds pending.
        // SAFETY: kill with a pid of our own child.
        unsafe { libc_kill(child.id() as i32, SIGSTOP) };
        if name == "SIGTERM" {
            // The port is taken (bound) but not listened on until the
            // store is ready: a client is refused, not left waiting.
            let early = TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap()));
            assert_eq!(early.err().map(|e| e.kind()), Some(std::io::ErrorKind::ConnectionRefused));
            let second = granary(&["serve", "--data", d, "-p", &free_port().to_string(), "--no-native", "--no-resp"]);
            let text = String::from_utf8_lossy(&second.stderr);
            assert!(!second.status.success() && text.contains("in use by another process"), "{text}");
        }
        // SAFETY: kill with a pid of our own child.
        unsafe {
            libc_kill(child.id() as i32, sig);
            libc_kill(child.id() as i32, SIGCONT);
        }
        // Bounded: a fill that ignored the signal would go on serving.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{args:?} did not exit within 60 s of {name}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        log.push_str(&common::rest(&later, common::START_LIMIT));
        // An error exit (not death by the signal), after the clean-up.
        assert_eq!(status.code(), Some(2), "{args:?}: {log}");
        assert!(log.contains(&format!("creation stopped by {name} while writing zeros")), "{args:?}: {log}");
        assert!(!data.exists(), "{args:?} left {}", data.display());
    }
    let s = Serve::start(&data);
    assert_eq!(s.call(b"set k 0 0 1\r\nv\r\n"), b"STORED\r\n");
    assert_eq!(s.signal(SIGTERM).code(), Some(0));
    std::fs::remove_file(&data).unwrap();
    // SIGKILL cannot be caught: the file stays, marked as an unfinished
    // creation, and the next start removes it and creates it again.
    let mut child = spawn_until(&serve, |line| line.contains("writing zeros over the new data file")).child;
    // SAFETY: kill with a pid of our own child.
    unsafe { libc_kill(child.id() as i32, SIGSTOP) };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(data.exists(), "a kill -9 leaves the file");
    let common::Started { child, log, later, .. } = spawn_until(&serve, |l| l.contains("serving"));
    assert!(log.contains("an earlier creation was interrupted"), "{log}");
    let s = Serve { child, port: port.parse().unwrap(), native_port: 0, resp_port: 0, log: String::new(), later };
    assert_eq!(s.call(b"set k 0 0 1\r\nv\r\n"), b"STORED\r\n");
    assert_eq!(s.signal(SIGTERM).code(), Some(0));
}

/// SIGINT while a restart after a crash scans the log stops the process at
/// once (exit 2, as a crash); the next start recovers everything.
#[test]
fn a_stop_signal_during_recovery_stops_and_the_next_start_recovers() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("rec.db");
    let d = data.to_str().unwrap();
    let port = free_port().to_string();
    let serve = ["serve", "--data", d, "--size", "1G", "-p", &port, "-t", "2", "--no-native", "--no-resp"];
    let common::Started { child, later, .. } = spawn_until(&serve, |l| l.contains("serving"));
    let s = Serve { child, port: port.parse().unwrap(), native_port: 0, resp_port: 0, log: String::new(), later };
    // ~600 MB of records: the log scan after the crash reads many times.
    let value = "v".repeat(4000);
    for chunk in 0..30 {
        let mut req = Vec::new();
        for i in chunk * 5000..(chunk + 1) * 5000 {
            req.extend_from_slice(format!("set rec-{i} 0 0 4000 noreply\r\n{value}\r\n").as_bytes());
        }
        assert_eq!(s.call(&req), b"");
    }
    assert!(!s.signal(SIGKILL).success());

    // The restart's device waits 20 ms per operation from the first (so
    // the scan takes seconds), and once the scan has started its next read
    // is held: the signal lands inside the scan whatever the machine's speed.
    let control = dir.path().join("fault.sock");
    let mut cmd = common::granary(&serve);
    cmd.env("GRANARY_FAULT_SOCKET", &control).env("GRANARY_FAULT_INIT", "delay-ms 20");
    let common::Started { mut child, mut log, later, .. } =
        common::start_or_panic(&mut cmd, |l| l.contains("recovery: log scan started"), common::START_LIMIT);
    for c in ["hang", "wait-held 1"] {
        common::fault_at(&control, c, common::START_LIMIT);
    }
    // SAFETY: kill with a pid of our own child.
    unsafe { libc_kill(child.id() as i32, SIGINT) };
    let status = child.wait().unwrap();
    log.push_str(&common::rest(&later, common::START_LIMIT));
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("stopped by SIGINT while opening the store"), "{log}");
    assert!(!log.contains("store open"), "the signal landed after the recovery: {log}");

    let common::Started { child, log, later, .. } = spawn_until(&serve, |l| l.contains("serving"));
    // How long the whole scan took (the window the signal had).
    eprintln!("{}", log.lines().filter(|l| l.contains("recovered index")).collect::<Vec<_>>().join("\n"));
    let s = Serve { child, port: port.parse().unwrap(), native_port: 0, resp_port: 0, log, later };
    assert_eq!(stat(&s, "curr_items"), "150000");
    assert_eq!(s.call(b"get rec-149999\r\n"), format!("VALUE rec-149999 0 4000\r\n{value}\r\nEND\r\n").as_bytes());
    assert_eq!(s.signal(SIGTERM).code(), Some(0));
}

#[test]
fn cli_get_put_del_against_a_server_over_the_native_protocol() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let s = Serve::start(&dir.path().join("n.db"));
    let addr = format!("127.0.0.1:{}", s.native_port);
    let o = granary(&["put", "--server", &addr, "greeting", "hello"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = granary(&["get", "--server", &addr, "greeting"]);
    assert_eq!((o.status.code(), &o.stdout[..]), (Some(0), &b"hello"[..]));
    // The same store behind both listeners.
    assert_eq!(s.call(b"get greeting\r\n"), b"VALUE greeting 0 5\r\nhello\r\nEND\r\n");
    let o = granary(&["put", "--server", &addr, "--mode", "add", "greeting", "again"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(granary(&["del", "--server", &addr, "greeting"]).status.code(), Some(0));
    assert_eq!(granary(&["del", "--server", &addr, "greeting"]).status.code(), Some(1));
    let o = granary(&["get", "--server", &addr, "greeting"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("key not found"));
    // Usage errors and an unreachable server: exit 2 with a clear line.
    let o = granary(&["get", "--server", &addr, "a", "b"]);
    assert_eq!(o.status.code(), Some(2));
    let dead = format!("127.0.0.1:{}", free_port());
    let o = granary(&["get", "--server", &dead, "k"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot connect"), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(s.signal(SIGTERM).code(), Some(0));
}

/// `granary batch --server` commits as one TXN (all or nothing, a failed
/// condition named, exit 1), and `get`/`put`/`del --ns --server` reach a
/// namespace's keys.
#[test]
fn cli_batch_and_ns_against_a_server_over_the_native_protocol() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let s = Serve::start(&dir.path().join("b.db"));
    let addr = format!("127.0.0.1:{}", s.native_port);
    let c = granary_client::Client::connect(addr.as_str(), granary_client::ClientConfig::default()).unwrap();
    c.ns_create("users", granary_client::NamespaceOptions::default()).unwrap();
    let text = |o: &std::process::Output| String::from_utf8_lossy(&o.stdout).into_owned();
    let err = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();

    // put/get/del --ns through the server.
    let o = granary(&["put", "--server", &addr, "--ns", "users", "k", "in users"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(granary(&["put", "--server", &addr, "k", "in default"]).status.success());
    let o = granary(&["get", "--server", &addr, "--ns", "users", "k"]);
    assert_eq!((o.status.code(), &o.stdout[..]), (Some(0), &b"in users"[..]));
    assert_eq!(c.ns("users").get(b"k").unwrap().as_deref(), Some(&b"in users"[..]));
    assert_eq!(granary(&["get", "--server", &addr, "k"]).stdout, b"in default");
    assert_eq!(granary(&["put", "--server", &addr, "--ns", "users", "--mode", "add", "k", "x"]).status.code(), Some(1));
    assert_eq!(granary(&["del", "--server", &addr, "--ns", "users", "k"]).status.code(), Some(0));
    assert_eq!(granary(&["get", "--server", &addr, "--ns", "users", "k"]).status.code(), Some(1));
    let o = granary(&["get", "--server", &addr, "--ns", "nope", "k"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("NO_SUCH_NAMESPACE"), "{}", err(&o));

    // batch --server: committed, then a failed condition with nothing applied.
    let batch = |input: &[u8]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_granary"))
            .args(["batch", "--server", &addr, "--print-cas"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    };
    let o = batch(b"put users a \"1 2\"\nput-absent default a 3\ndel default k\n");
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let out = text(&o);
    assert_eq!(out.lines().next(), Some("committed 3"), "{out}");
    assert_eq!(out.lines().count(), 4, "a CAS value per operation: {out}");
    assert_eq!(c.ns("users").get(b"a").unwrap().as_deref(), Some(&b"1 2"[..]));
    assert_eq!(c.get(b"a").unwrap().as_deref(), Some(&b"3"[..]));
    assert_eq!(c.get(b"k").unwrap(), None);
    let o = batch(b"put users b 1\nput-absent users a again\n");
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert_eq!(text(&o), "condition failed: op 2 (put-absent users a, line 2): exists\n");
    assert_eq!(c.ns("users").get(b"b").unwrap(), None, "nothing applied");
    let o = batch(b"put users b 1\nput nope b 2\n");
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("line 2: server error NO_SUCH_NAMESPACE: no namespace \"nope\""), "{}", err(&o));
    assert_eq!(c.ns("users").get(b"b").unwrap(), None, "nothing applied");
    let st: std::collections::HashMap<String, String> = c.stats().unwrap().into_iter().collect();
    assert_eq!((st["cmd_txn"].as_str(), st["txn_condition_failed"].as_str()), ("3", "1"));
    drop(c);
    assert_eq!(s.signal(SIGTERM).code(), Some(0));
}

/// GET `path` from an HTTP endpoint: (status line, body).
fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: granary\r\n\r\n").as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The value of one sample of the metrics page.
fn sample(page: &str, name_and_labels: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name_and_labels).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name_and_labels} in\n{page}"))
        .parse()
        .unwrap()
}

/// A memcache `set` of `key` to `value` (flags 0, no expiry), its line
/// and its data block.
fn set_request(key: &str, value: &[u8]) -> Vec<u8> {
    let mut req = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
    req.extend_from_slice(value);
    req.extend_from_slice(b"\r\n");
    req
}

#[test]
fn a_second_signal_during_the_drain_exits_at_once_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("twice.db");
    let s = Serve::start(&data);
    let big = vec![b'b'; 512 << 10];
    let req = [set_request("big", &big), set_request("a", b"x")].concat();
    assert_eq!(s.call(&req), b"STORED\r\nSTORED\r\n");
    // A client that reads none of its 200 MiB of replies keeps its
    // connection busy, so the drain would wait for it (5 s at most).
    let mut stuck = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    stuck.write_all(&b"get big\r\n".repeat(400)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while stat(&s, "granary_conns_waiting_to_send") == "0" {
        assert!(std::time::Instant::now() < deadline, "the server never waited for the stuck client");
        std::thread::sleep(Duration::from_millis(5));
    }
    s.send_signal(SIGTERM);
    s.wait_for_line("draining connections");
    // The second signal ends the drain at once: exit 130, no checkpoint
    // (a drain that ran its course would exit 0).
    assert_eq!(s.signal(SIGTERM).code(), Some(130));
    drop(stuck);
    let metrics = format!("127.0.0.1:{}", free_port());
    let s = Serve::start_with(&data, &["--metrics", &metrics]);
    let (_, page) = http_get(&metrics, "/metrics");
    assert_eq!(sample(&page, "granary_recovery_clean"), 0.0, "a checkpoint was written after the second signal");
    let got = s.call(b"get a\r\nget big\r\n");
    let mut want = b"VALUE a 0 1\r\nx\r\nEND\r\n".to_vec();
    want.extend_from_slice(format!("VALUE big 0 {}\r\n", big.len()).as_bytes());
    want.extend_from_slice(&big);
    want.extend_from_slice(b"\r\nEND\r\n");
    assert!(got == want, "acknowledged values lost after the second signal");
    assert_eq!(s.signal(SIGTERM).code(), Some(0));
}

#[test]
fn config_file_flags_metrics_limits_and_clean_restart() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("cfg.db");
    let metrics = format!("127.0.0.1:{}", free_port());
    let conf = dir.path().join("granary.toml");
    // port 1 is overridden by the -p flag the fixture passes.
    std::fs::write(
        &conf,
        format!(
            "port = 1\nmetrics = \"{metrics}\"\nconn_limit = 3\nmax_item_size = \"100k\"\n\
             log_format = \"json\"\nevict = false\nio_spin_us = 50\nio_submit_early = false\n"
        ),
    )
    .unwrap();
    let conf_s = conf.to_str().unwrap();

    // --print-config shows the merge: flag over file over default.
    let o = granary(&["serve", "--config", conf_s, "-p", "4242", "--print-config"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let printed = String::from_utf8(o.stdout).unwrap();
    for line in [
        "port = 4242",
        &format!("metrics = \"{metrics}\""),
        "conn_limit = 3",
        "max_item_size = 102400",
        "evict = false",
        "native_port = 43345",
        "log_format = \"json\"",
        "io_spin_us = 50",
        "io_submit_early = false",
    ] {
        assert!(printed.lines().any(|l| l == line), "{line:?} missing from\n{printed}");
    }
    // What it prints reads back as the same configuration.
    let again = dir.path().join("again.toml");
    std::fs::write(&again, &printed).unwrap();
    let o = granary(&["serve", "--config", again.to_str().unwrap(), "--print-config"]);
    assert_eq!(String::from_utf8(o.stdout).unwrap(), printed);
    // GRANARY_LOG_FORMAT stands in for the default: the flag and the file
    // win over it.
    let with_env = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_granary")).args(args).env("GRANARY_LOG_FORMAT", "json").output();
        String::from_utf8(o.unwrap().stdout).unwrap()
    };
    let format = |printed: String| printed.lines().find(|l| l.starts_with("log_format")).unwrap_or("").to_string();
    assert_eq!(format(with_env(&["serve", "--print-config"])), "log_format = \"json\"");
    assert_eq!(format(with_env(&["serve", "--print-config", "--log-format", "text"])), "log_format = \"text\"");
    let text = dir.path().join("text.toml");
    std::fs::write(&text, "log_format = \"text\"\n").unwrap();
    let from_file = with_env(&["serve", "--config", text.to_str().unwrap(), "--print-config"]);
    assert_eq!(format(from_file), "log_format = \"text\"");
    // A bad file is one clear line.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "port = 1\nbogus = true\n").unwrap();
    let o = granary(&["serve", "--config", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("line 2") && err.contains("bogus") && err.lines().count() == 1, "{err}");
    // An out-of-range spin is refused, not clamped.
    let o = granary(&["serve", "--config", conf_s, "--io-spin-us", "1000001", "--print-config"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("io_spin_us"), "{}", String::from_utf8_lossy(&o.stderr));

    let s = Serve::start_with(&data, &["--config", conf_s]);
    // JSON logs: the store-open line is one JSON object.
    assert!(s.log.lines().any(|l| l.starts_with('{') && l.contains("store open")), "no JSON log line in:\n{}", s.log);
    let (status, page) = http_get(&metrics, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let sets0 = sample(&page, "granary_memcache_commands_total{cmd=\"set\"}");
    let puts0 = sample(&page, "granary_store_operations_total{op=\"put\"}");
    let set_lat0 = sample(&page, "granary_memcache_command_duration_seconds_count{cmd=\"set\"}");
    assert_eq!(s.call(b"set a 0 0 1\r\nx\r\nset b 0 0 1\r\ny\r\n"), b"STORED\r\nSTORED\r\n");
    let native = format!("127.0.0.1:{}", s.native_port);
    assert!(granary(&["put", "--server", &native, "n", "v"]).status.success());
    let (_, page) = http_get(&metrics, "/metrics");
    assert_eq!(sample(&page, "granary_memcache_commands_total{cmd=\"set\"}"), sets0 + 2.0);
    assert_eq!(sample(&page, "granary_native_requests_total{op=\"put\"}"), 1.0);
    // The Redis protocol's counters: one inline PING.
    let mut r = TcpStream::connect(("127.0.0.1", s.resp_port)).unwrap();
    r.write_all(b"PING\r\n").unwrap();
    let mut pong = [0u8; 7];
    r.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"+PONG\r\n");
    let (_, page) = http_get(&metrics, "/metrics");
    assert_eq!(sample(&page, "granary_resp_commands_total"), 1.0);
    assert_eq!(sample(&page, "granary_resp_connections_total"), 1.0);
    assert_eq!(sample(&page, "granary_store_operations_total{op=\"put\"}"), puts0 + 3.0);
    assert_eq!(sample(&page, "granary_store_keys"), 3.0);
    assert!(sample(&page, "granary_device_bytes_total{dir=\"written\"}") > 0.0);
    assert!(sample(&page, "granary_index_memory_bytes") > 0.0);
    assert!(page.contains("# TYPE granary_memcache_commands_total counter"));
    // The executors' counters, one series per core: they served requests.
    assert!(sample(&page, "granary_rt_polls_total{core=\"0\"}") > 0.0);
    assert!(page.lines().any(|l| l.starts_with("granary_rt_io_spins_skipped_total{core=\"0\"} ")));
    assert!(page.contains("# TYPE granary_rt_file_ios_in_flight gauge"));
    // Latency histograms: one observation per command, request and device
    // operation, cumulative buckets ending in +Inf = count.
    let set_count = "granary_memcache_command_duration_seconds_count{cmd=\"set\"}";
    assert_eq!(sample(&page, set_count), set_lat0 + 2.0);
    assert_eq!(
        sample(&page, "granary_memcache_command_duration_seconds_bucket{cmd=\"set\",le=\"+Inf\"}"),
        sample(&page, set_count)
    );
    assert!(sample(&page, "granary_memcache_command_duration_seconds_sum{cmd=\"set\"}") > 0.0);
    assert_eq!(sample(&page, "granary_native_request_duration_seconds_count{op=\"put\"}"), 1.0);
    assert_eq!(sample(&page, "granary_native_request_duration_seconds_count{op=\"get\"}"), 0.0);
    for op in ["read", "write"] {
        let ops = sample(&page, &format!("granary_device_operations_total{{op=\"{op}\"}}"));
        let timed = sample(&page, &format!("granary_device_io_duration_seconds_count{{op=\"{op}\"}}"));
        assert_eq!(timed, ops, "device {op}s timed");
    }
    assert!(sample(&page, "granary_device_io_duration_seconds_count{op=\"write\"}") > 0.0);
    let latency = String::from_utf8(s.call(b"stats latency\r\n")).unwrap();
    assert!(latency.contains("STAT set:count ") && latency.contains("STAT device_write:p99_us "), "{latency}");
    assert!(latency.ends_with("END\r\n"), "{latency}");
    assert!(sample(&page, "granary_memcache_connection_buffer_bytes_max") > 0.0);
    assert_eq!(stat(&s, "cmd_set"), (sets0 as u64 + 2).to_string());
    assert_eq!(stat(&s, "granary_index_memory_bytes"), sample(&page, "granary_index_memory_bytes").to_string());
    assert_eq!(http_get(&metrics, "/nope").0, "HTTP/1.1 404 Not Found");
    // Connections that send nothing: the endpoint serves 16 at once and
    // closes the others at once (not after the 10 s request timeout).
    let silent: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(&metrics).unwrap()).collect();
    let mut b = [0u8; 1];
    let mut extra = TcpStream::connect(&metrics).unwrap();
    extra.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(matches!(extra.read(&mut b), Ok(0)), "a scrape past the 16 served at once was kept waiting");
    drop(silent);
    // Those gone, scrapes are served again (the count drops as the
    // endpoint sees them close: a bounded retry).
    let served = (0..200).any(|_| {
        let mut c = TcpStream::connect(&metrics).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"GET /nope HTTP/1.1\r\n\r\n").unwrap();
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got);
        let ok = got.starts_with(b"HTTP/1.1 404");
        if !ok {
            std::thread::sleep(Duration::from_millis(20));
        }
        ok
    });
    assert!(served, "no scrape served after the silent connections closed");
    // A value of 16 KiB and more is sent from the engine's read buffer.
    let zc0 = sample(&http_get(&metrics, "/metrics").1, "granary_memcache_zero_copy_total{dir=\"get\"}");
    let mut big = b"set big 0 0 20000\r\n".to_vec();
    big.extend_from_slice(&[b'z'; 20000]);
    big.extend_from_slice(b"\r\n");
    assert_eq!(s.call(&big), b"STORED\r\n");
    assert_eq!(s.call(b"get big\r\n").len(), "VALUE big 0 20000\r\n".len() + 20000 + 7);
    let (_, page2) = http_get(&metrics, "/metrics");
    assert_eq!(sample(&page2, "granary_memcache_zero_copy_total{dir=\"get\"}"), zc0 + 1.0);
    assert_eq!(sample(&page2, "granary_native_zero_copy_total{dir=\"put\"}"), 0.0);
    assert_eq!(s.call(b"delete big\r\n"), b"DELETED\r\n");

    // Limits from the file: item size, then connections.
    let big = format!("set big 0 0 200000\r\n{}\r\n", "x".repeat(200_000));
    assert!(String::from_utf8(s.call(big.as_bytes())).unwrap().starts_with("SERVER_ERROR object too large"));
    let held: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(("127.0.0.1", s.port)).unwrap()).collect();
    // The three held connections are counted once the server has accepted
    // them; a fourth is refused (retry until the count is reached, bounded).
    let mut refused = false;
    for _ in 0..200 {
        let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.write_all(b"version\r\n").unwrap();
        let mut buf = [0u8; 128];
        let n = c.read(&mut buf).unwrap_or(0);
        if buf[..n].starts_with(b"SERVER_ERROR too many open connections") {
            refused = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(refused, "a fourth connection was served past conn_limit = 3");
    drop(held);
    assert_eq!(s.signal(SIGTERM).code(), Some(0));

    // The restart after SIGTERM is clean: the index comes from the
    // checkpoint, no log scan.
    let s = Serve::start_with(&data, &["--config", conf_s]);
    let (_, page) = http_get(&metrics, "/metrics");
    assert_eq!(sample(&page, "granary_recovery_clean"), 1.0);
    assert_eq!(sample(&page, "granary_store_keys"), 3.0);
    assert_eq!(s.signal(SIGTERM).code(), Some(0));
}

#[test]
fn idle_connections_are_closed_after_the_timeout() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let s = Serve::start_with(&dir.path().join("idle.db"), &["--idle-timeout", "1"]);
    let closed_by_server = |port: u16, hello: &[u8]| {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        c.write_all(hello).unwrap();
        let mut got = Vec::new();
        // Reads until the server closes (EOF); a read timeout fails the test.
        c.read_to_end(&mut got).map(|_| got)
    };
    // Memcache: one request answered, then silence: closed.
    let got = closed_by_server(s.port, b"version\r\n").expect("memcache connection was not closed");
    assert!(got.starts_with(b"VERSION "), "{got:?}");
    // Native: after the hello, silence: closed.
    let mut hello = b"GRNY".to_vec();
    hello.extend_from_slice(&[1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let got = closed_by_server(s.native_port, &hello).expect("native connection was not closed");
    assert_eq!(got.len(), 24, "the server hello, then the close");
    assert_eq!(stat(&s, "idle_kicks"), "1");
    assert_eq!(s.signal(SIGTERM).code(), Some(0));
}

/// Every listener is bound before the data file is made: a port in use
/// (memcache's or the native protocol's) fails the start with a clear
/// error and leaves no new file behind.
#[test]
fn a_port_in_use_fails_the_start_before_any_file_is_made() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("new/store.db");
    let d = data.to_str().unwrap();
    let busy = granary_rt::net::bind_low_port([127, 0, 0, 1].into()).unwrap();
    let busy_port = busy.local_addr().unwrap().port().to_string();
    let free = free_port().to_string();
    for (port, native) in [(&busy_port, &free), (&free, &busy_port)] {
        let o = granary(&["serve", "--data", d, "--size", "64M", "-p", port, "--native-port", native, "--no-resp"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(&format!("cannot listen on 127.0.0.1:{busy_port}")), "{err}");
        assert!(!data.exists(), "a failed start left {d} behind");
        assert!(!err.contains("writing zeros"), "the file was filled before the bind failed: {err}");
    }
}

/// `serve` of a new 64 MiB store at `d` with memcache alone on `port`,
/// and `extra` flags.
fn serve_new<'a>(d: &'a str, port: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["serve", "--data", d, "--size", "64M"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["-p", port, "--no-native", "--no-resp"]);
    args
}

/// A start that fails after it created the data file (here: the memcache
/// listener's namespace does not exist, found once the store is open)
/// removes the file; an existing store is left as it was.
#[test]
fn a_start_that_fails_after_creating_the_file_removes_it() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("new.db");
    let d = data.to_str().unwrap();
    let port = free_port().to_string();
    let args = serve_new(d, &port, &["--memcache-namespace", "nosuch"]);
    let o = granary(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("nosuch") && err.contains("granary ns create"), "{err}");
    assert!(!data.exists(), "the failed start left {d} behind: {err}");
    // The same failure over an existing store leaves the store alone.
    assert!(granary(&["create", d, "--size", "64M"]).status.success());
    let o = granary(&args);
    assert_eq!(o.status.code(), Some(2));
    assert!(data.exists(), "an existing store was removed");
}

/// An item size that segments of the size asked for cannot hold is refused
/// before a new store's file is made (and filled); over an existing store
/// whose segments are too small, once it is open, leaving it alone.
#[test]
fn an_item_size_the_segments_cannot_hold_is_refused() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("new.db");
    let d = data.to_str().unwrap();
    let port = free_port().to_string();
    let args = serve_new(d, &port, &["--segment-size", "1M", "-I", "4m"]);
    let o = granary(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("give a --segment-size of at least 8.0 MiB"), "{err}");
    assert!(!data.exists(), "the refused start left {d} behind: {err}");
    assert!(granary(&["create", d, "--size", "64M", "--segment-size", "1M"]).status.success());
    let args = ["serve", "--data", d, "-I", "4m", "-p", &port, "--no-native", "--no-resp"];
    let o = granary(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("exceeds what this store's segments hold"), "{err}");
    // -I set to the default is a choice too: refused the same way.
    let args = ["serve", "--data", d, "-I", "1m", "-p", &port, "--no-native", "--no-resp"];
    let o = granary(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("exceeds what this store's segments hold"), "{err}");
    assert!(data.exists(), "an existing store was removed");
}

/// A store with 1 MiB segments (as the Python and C bindings make) is
/// served with the defaults: the largest item, not set, becomes what the
/// segments hold, said in `stats settings` and the log; an item of that size is
/// stored and one a byte larger is refused as too large.
#[test]
fn a_store_whose_segments_hold_less_than_the_default_item_is_served() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("small-segments.db");
    let o = granary(&["create", data.to_str().unwrap(), "--size", "64M", "--segment-size", "1M"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = Serve::start(&data);
    let stats = String::from_utf8(s.call(b"stats settings\r\n")).unwrap();
    let max: usize = stats
        .lines()
        .find_map(|l| l.strip_prefix("STAT item_size_max "))
        .unwrap_or_else(|| panic!("no item_size_max: {stats}"))
        .parse()
        .unwrap();
    assert!(max < 1 << 20 && max > 1000 * 1024, "item_size_max {max}");
    assert_eq!(s.call(&set_request("fits", &vec![b'v'; max])), b"STORED\r\n");
    let over = s.call(&set_request("over", &vec![b'v'; max + 1]));
    assert!(over.starts_with(b"SERVER_ERROR object too large"), "{}", String::from_utf8_lossy(&over));
    assert_eq!(s.call(b"get fits\r\n").len(), max + "VALUE fits 0 \r\n\r\nEND\r\n".len() + max.to_string().len());
    let said = s.log.matches("largest item: what this store's segments hold").count();
    assert_eq!(said, 1, "{}", s.log);
    assert_eq!(s.signal(SIGTERM).code(), Some(0));
    // --print-config leaves it unset (a comment), so its output serves the
    // same store too.
    let o = granary(&["serve", "--data", data.to_str().unwrap(), "--print-config"]);
    let printed = String::from_utf8(o.stdout).unwrap();
    assert!(printed.contains("# max_item_size: not set") && !printed.contains("\nmax_item_size ="), "{printed}");
    let file = dir.path().join("printed.toml");
    std::fs::write(&file, &printed).unwrap();
    let s = Serve::start_with(&data, &["--config", file.to_str().unwrap()]);
    assert_eq!(s.signal(SIGTERM).code(), Some(0));
    // A store serve creates with such segments is served the same way.
    let new = dir.path().join("new-small-segments.db");
    let s = Serve::start_with(&new, &["--segment-size", "1M"]);
    assert_eq!(s.call(&set_request("fits", &vec![b'v'; max])), b"STORED\r\n");
    assert_eq!(s.signal(SIGTERM).code(), Some(0));
}

/// A store `granary create` makes in a small file with the defaults is
/// served with the defaults: its segments hold the default 1 MiB items.
/// Before, a file under 128 MiB got 1 MiB segments and serve refused its
/// default -I ("exceeds what this store's segments hold").
#[test]
fn a_store_created_with_the_defaults_is_served_with_them() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("small.db");
    let o = granary(&["create", data.to_str().unwrap(), "--size", "64M"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = Serve::start(&data);
    assert_eq!(s.call(&set_request("big", &vec![b'v'; 1 << 20])), b"STORED\r\n");
    assert_eq!(s.signal(SIGTERM).code(), Some(0));
}

/// SIGKILL while clients commit transactions over the native protocol:
/// each client writes one version to its four keys (two in a namespace,
/// two in the default one) per transaction; after every kill, each
/// client's four keys hold one and the same version, at least the last it
/// saw committed and at most the last it sent.
#[test]
fn sigkill_during_concurrent_transactions_leaves_each_whole() {
    use granary_client::{Client, ClientConfig};
    use granary_proto::{TxnOp, TxnOutcome};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;
    const CLIENTS: usize = 3;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("txn.db");
    let d = data.to_str().unwrap();
    let create = ["create", d, "--size", "64M", "--segment-size", "4M"];
    for args in [&create[..], &["ns", "create", d, "a", "--mode", "store"][..]] {
        let out = granary(args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let key = |c: usize, i: usize| format!("client{c}-key{i}").into_bytes();
    let ns_of = |i: usize| if i.is_multiple_of(2) { "a" } else { "" };
    let value = |v: u64| {
        let mut b = v.to_le_bytes().to_vec();
        b.resize(300, b'x');
        b
    };
    // Per client: the last version seen committed, and the last sent.
    let mut committed = [0u64; CLIENTS];
    let mut sent = [0u64; CLIENTS];
    let mut total = 0;
    for cycle in 0..3u64 {
        let s = Serve::start_with(&data, &["--no-evict"]);
        let stop = Arc::new(AtomicBool::new(false));
        // Commits this cycle, per client.
        let commits: Arc<Vec<AtomicU64>> = Arc::new((0..CLIENTS).map(|_| AtomicU64::new(0)).collect());
        let threads: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (stop, port, first) = (stop.clone(), s.native_port, sent[c] + 1);
                let commits = commits.clone();
                std::thread::spawn(move || {
                    let cfg =
                        ClientConfig { timeout: Duration::from_secs(5), connections: 1, ..ClientConfig::default() };
                    let client = Client::connect(format!("127.0.0.1:{port}").as_str(), cfg).unwrap();
                    let (mut done, mut tried) = (first - 1, first - 1);
                    for v in first.. {
                        if stop.load(Relaxed) || v > first + 100_000 {
                            break;
                        }
                        let keys: Vec<Vec<u8>> = (0..4).map(|i| key(c, i)).collect();
                        let val = value(v);
                        let ops: Vec<TxnOp> = (0..4).map(|i| TxnOp::put(ns_of(i), &keys[i], &val)).collect();
                        tried = v;
                        match client.txn(&ops) {
                            Ok(TxnOutcome::Committed { .. }) => {
                                done = v;
                                commits[c].fetch_add(1, Relaxed);
                            }
                            Ok(o) => panic!("client {c}: {o:?}"),
                            Err(_) => break, // the server is gone
                        }
                    }
                    (done, tried)
                })
            })
            .collect();
        // The kill comes after every client has committed (however slow
        // the start), then a while longer, so transactions are in flight.
        let all_committed = common::wait_until(Duration::from_secs(60), || commits.iter().all(|n| n.load(Relaxed) > 0));
        assert!(all_committed, "cycle {cycle}: a client committed nothing in 60 s");
        std::thread::sleep(Duration::from_millis(50 + 100 * cycle));
        s.signal(9);
        stop.store(true, Relaxed);
        for (c, t) in threads.into_iter().enumerate() {
            let (done, tried) = t.join().unwrap();
            total += done - committed[c].min(done);
            committed[c] = committed[c].max(done);
            sent[c] = sent[c].max(tried);
        }
        let opts = granary_store::OpenOptions { checkpoint_interval: None, ..Default::default() };
        let store = granary_store::Store::open_path(&data, granary_store::io::OpenMode::Direct, &opts)
            .unwrap_or_else(|e| panic!("cycle {cycle}: reopen: {e}"));
        let a = store.namespace("a").unwrap();
        for c in 0..CLIENTS {
            let versions: Vec<u64> = (0..4usize)
                .map(|i| {
                    let got = if i.is_multiple_of(2) { a.get(&key(c, i)) } else { store.get(&key(c, i)) };
                    got.unwrap().map_or(0, |v| u64::from_le_bytes(v[..8].try_into().unwrap()))
                })
                .collect();
            assert!(
                versions.iter().all(|&v| v == versions[0]),
                "cycle {cycle}: client {c}'s keys differ: {versions:?}"
            );
            assert!(
                committed[c] <= versions[0] && versions[0] <= sent[c],
                "cycle {cycle}: client {c} holds {}, committed {}, sent {}",
                versions[0],
                committed[c],
                sent[c]
            );
            // What recovery kept is the client's state now.
            committed[c] = versions[0];
        }
        assert!(store.verify().unwrap().is_clean());
        store.close().unwrap();
    }
    assert!(total > 0, "no transaction was committed before the kills");
}

/// `granary-bench ycsb`'s arguments are checked before anything starts:
/// workload E (range scans) is refused with the reason, as are unknown
/// peers and datatypes, and a go-ycsb that is not there.
#[test]
fn bench_ycsb_refuses_what_it_cannot_run() {
    let bench = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_granary-bench")).arg("ycsb").args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(bench(&["--workloads", "a,e"]).contains("workload E needs ordered range scans"));
    assert!(bench(&["--datatypes", "json"]).contains("unknown datatype"));
    let missing = ["--go-ycsb", "/nonexistent/go-ycsb"];
    assert!(bench(&[&["--peers", "redis-none,valkey"][..], &missing].concat()).contains("unknown peer \"valkey\""));
    assert!(bench(&[&["--peers", "redis-none"][..], &missing].concat()).contains("scripts/go-ycsb.sh"));
}

/// go-ycsb (scripts/go-ycsb.sh builds it into target/go-ycsb) loads and
/// runs workloads A and D on both record layouts against redis-server
/// with no persistence, with a quarter of the data's memory, and against
/// `granary serve`'s RESP listener, and redis-benchmark runs against the
/// first and the last: every figure is in the JSON.
/// Skipped (with a line saying so) without go-ycsb or redis-server.
#[test]
fn bench_ycsb_runs_go_ycsb_and_redis_benchmark_against_redis_and_granary() {
    let on_path = |tool: &str| {
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
    };
    let go_ycsb = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/go-ycsb/go-ycsb");
    let go_ycsb = std::env::var_os("GO_YCSB").map(std::path::PathBuf::from).unwrap_or(go_ycsb);
    let (redis, benchmark, ycsb) = (on_path("redis-server"), on_path("redis-benchmark"), go_ycsb.is_file());
    if !(redis && benchmark && ycsb) {
        eprintln!(
            "skipped: needs redis-server ({redis}) and redis-benchmark ({benchmark}) (apt-get install redis-server), \
             and go-ycsb at {} ({ycsb}; scripts/go-ycsb.sh, or GO_YCSB=PATH)",
            go_ycsb.display()
        );
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let json = dir.path().join("r.json");
    let out = Command::new(env!("CARGO_BIN_EXE_granary-bench"))
        .args(["ycsb", "--peers", "redis-none,redis-lru4x,granary", "--workloads", "d,a", "--records", "2000"])
        .args(["--operations", "2000", "--threads", "4", "--rb-requests", "2000", "--rb-clients", "8", "--go-ycsb"])
        .arg(&go_ycsb)
        .arg("--dir")
        .arg(dir.path())
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["workloads"], serde_json::json!(["A", "D"]), "D runs last");
    let none = &v["peers"][0];
    assert_eq!(none["peer"], "redis-none");
    for (i, dt) in ["string", "hash"].iter().enumerate() {
        let d = &none["datatypes"][i];
        assert_eq!(d["datatype"], *dt);
        assert_eq!(d["load"]["ops"].as_array().unwrap().iter().find(|o| o["op"] == "INSERT").unwrap()["count"], 2000);
        // Redis holds a record of about 1.1-1.5 KB in more than that.
        let per = d["rss_bytes_per_record"].as_f64().unwrap();
        assert!(per > 500.0 && per < 20_000.0, "{dt}: {per} B per record");
        for w in d["workloads"].as_array().unwrap() {
            assert!(w["ops_per_sec"].as_f64().unwrap() > 0.0, "{w}");
            assert_eq!(w["errors"], 0, "{w}");
            assert_eq!(w["hit_ratio"].as_f64(), Some(1.0), "every record is there: {w}");
            assert!(w["p99_us"].as_f64().unwrap() >= w["p50_us"].as_f64().unwrap(), "{w}");
        }
    }
    // A quarter of the data's memory: reads miss, and the string layout's
    // misses are READ_ERRORs; the hash layout's come from INFO stats.
    let lru = &v["peers"][1];
    for d in lru["datatypes"].as_array().unwrap() {
        assert!(d["maxmemory"].as_u64().unwrap() > 0, "{d}");
        let a = &d["workloads"][0];
        let hit = a["hit_ratio"].as_f64().unwrap();
        assert!(hit > 0.0 && hit < 0.9, "{}: {hit}", d["datatype"]);
    }
    // Granary through its RESP listener: every record read back, no error.
    let granary = &v["peers"][2];
    assert_eq!(granary["peer"], "granary");
    for d in granary["datatypes"].as_array().unwrap() {
        for w in d["workloads"].as_array().unwrap() {
            assert!(w["ops_per_sec"].as_f64().unwrap() > 0.0, "{w}");
            assert_eq!(w["errors"], 0, "{w}");
            assert_eq!(w["hit_ratio"].as_f64(), Some(1.0), "every record is there: {w}");
        }
    }
    assert_eq!(granary["redis_benchmark"]["results"].as_array().unwrap().len(), 12);
    let rb = none["redis_benchmark"]["results"].as_array().unwrap();
    assert_eq!(rb.len(), 12, "six tests at -P 1 and -P 16: {rb:?}");
    assert!(rb.iter().all(|r| r["rps"].as_f64().unwrap() > 0.0));
    assert!(lru["redis_benchmark"]["results"].as_array().unwrap().is_empty(), "not run on an -lru4x peer");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("datatype string") && text.contains("redis-benchmark"), "{text}");
    // The servers' data folders are removed; their logs are kept.
    assert!(!dir.path().join("ycsb-redis-none").exists());
    assert!(dir.path().join("ycsb-redis-none.log").exists());
}

/// `-m` sizes the DRAM tier: repeated GETs of a key are its hits, a SET is
/// seen by the next GET, and its figures are in `stats` (`granary_dram_*`)
/// and on /metrics.
#[test]
fn dram_tier_serves_repeated_gets_and_reports_its_figures() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("tier.db");
    let metrics = format!("127.0.0.1:{}", free_port());
    let s = Serve::start_with(&data, &["-m", "8", "--metrics", &metrics]);
    let num = |name: &str| stat(&s, name).parse::<u64>().unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(num("granary_dram_limit_bytes"), 8 << 20);
    assert_eq!(s.call(b"set k 0 0 5\r\nhello\r\n"), b"STORED\r\n");
    let (hits, reads) = (num("granary_dram_hits"), num("granary_io_reads"));
    for _ in 0..5 {
        assert_eq!(s.call(b"get k\r\n"), b"VALUE k 0 5\r\nhello\r\nEND\r\n");
    }
    // The first GET reads the device and admits the value; the rest hit.
    assert_eq!(num("granary_dram_hits"), hits + 4);
    assert_eq!(num("granary_io_reads"), reads + 1);
    assert_eq!(num("granary_dram_items"), 1);
    assert!(num("granary_dram_admissions") >= 1 && num("granary_dram_misses") >= 1);
    assert!(num("granary_dram_bytes") > 6);
    assert_eq!(num("granary_dram_evictions"), 0);
    assert_eq!(s.call(b"set k 0 0 3\r\nnew\r\nget k\r\n"), b"STORED\r\nVALUE k 0 3\r\nnew\r\nEND\r\n");
    let (_, page) = http_get(&metrics, "/metrics");
    assert!(sample(&page, "granary_dram_hits_total") >= 4.0);
    assert_eq!(sample(&page, "granary_dram_limit_bytes"), (8 << 20) as f64);
    assert!(page.contains("# TYPE granary_dram_bytes gauge"));
    assert_eq!(s.signal(SIGTERM).code(), Some(0));
}
