//! `granary serve --nbd-port` over a real store file, driven by real
//! clients and a real file system:
//!
//! - `qemu-io` pattern checks (aligned and unaligned writes, reads that
//!   verify the pattern, write-zeroes, discard) on exports of 4 KiB and 64
//!   KiB blocks, and `nbdcopy` of a 256 MiB random image in and out; the
//!   server is stopped (SIGTERM) and started again, and the patterns and
//!   the image read back the same;
//! - ext4 on the export, through `nbdfuse` (the export as a file in a FUSE
//!   mount) and a loop device: 1,000 files written and fsync'ed, `fsck.ext4
//!   -fn` clean, every file's sha256 the same after a remount;
//! - the same stack with the server killed (SIGKILL) in the middle of a
//!   file-writing workload, three times: after each restart, `fsck.ext4
//!   -fy` replays the journal and fixes nothing but the summary counts,
//!   `fsck.ext4 -fn` is clean, and every file whose fsync returned is
//!   intact.
//!
//! The tools come from libnbd-bin, qemu-utils, fuse3, e2fsprogs and mount
//! (scripts/test.sh installs them). A missing tool skips a test, with the
//! reason printed, unless GRANARY_REQUIRE_PEERS is set; the mount tests are
//! skipped (reason printed) without root, /dev/fuse or a free loop device
//! whatever GRANARY_REQUIRE_PEERS says. The image, file sizes and kill
//! moments come from a seed, printed when a test fails;
//! `GRANARY_FUZZ_SEED=S` reruns one. Every tool run, server start and wait
//! is bounded; a watchdog kills nbdfuse (every request on its mount then
//! fails) if a mount test overruns; a failing test still takes its mount,
//! loop device, FUSE mount and server down.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

/// Time limit of one tool run (mkfs, fsck, nbdcopy, ...).
const TOOL_LIMIT: Duration = Duration::from_secs(90);
/// Time limit of a server start (a start after a crash scans the log).
const START_LIMIT: Duration = Duration::from_secs(90);
/// Time limit of a mount test (its watchdog's): a bound for a hang, far
/// above a slow machine's time (each fsync is an NBD FLUSH and an
/// fdatasync of the store).
const MOUNT_TEST_LIMIT: Duration = Duration::from_secs(400);
const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

// ---------------------------------------------------------------------
// Tools and the environment

/// Where `tool` is: on PATH, else in the sbin and bin directories (a PATH
/// without /sbin still finds losetup and mkfs.ext4).
fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let fixed = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from);
    std::env::split_paths(&path).chain(fixed).map(|d| d.join(name)).find(|p| p.is_file())
}

/// A command running `name`, found as [`tool`] finds it.
fn cmd(name: &str) -> Command {
    Command::new(tool(name).unwrap_or_else(|| name.into()))
}

/// Whether every tool is here; panics if one is missing and
/// GRANARY_REQUIRE_PEERS is set.
fn have(test: &str, tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| tool(t).is_none()).collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os("GRANARY_REQUIRE_PEERS").is_none(),
        "{test}: missing {missing:?} (scripts/test.sh installs them: libnbd-bin, qemu-utils, fuse3, e2fsprogs, mount)"
    );
    eprintln!("{test}: skipped: missing {missing:?}");
    false
}

/// Whether a FUSE mount, a loop device and an ext4 mount can be made here:
/// root, /dev/fuse, the tools (required with GRANARY_REQUIRE_PEERS), and a
/// free loop device (`losetup -f`). Else the reason is printed.
fn can_mount(test: &str) -> bool {
    let skip = |why: String| {
        eprintln!("{test}: skipped: {why}");
        false
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("not root (losetup and mount need it)".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return skip("no /dev/fuse".into());
    }
    let tools = ["nbdfuse", "fusermount3", "losetup", "mkfs.ext4", "fsck.ext4", "mount", "umount"];
    if !have(test, &tools) {
        return false;
    }
    match run(cmd("losetup").arg("-f"), Duration::from_secs(20)) {
        Ok(o) if o.status.success() => true,
        Ok(o) => skip(format!("no loop device: `losetup -f` failed: {}", o.text().trim())),
        Err(e) => skip(format!("no loop device: {e}")),
    }
}

struct Output {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Output {
    fn text(&self) -> String {
        format!("{}{}", String::from_utf8_lossy(&self.stdout), String::from_utf8_lossy(&self.stderr))
    }
}

/// Run `cmd` (stdin closed) for at most `limit`; killed (by its PID) past
/// it.
fn run(cmd: &mut Command, limit: Duration) -> Result<Output, String> {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: cannot start: {e}"))?;
    let collect = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = collect(child.stdout.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let err = collect(child.stderr.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| format!("{what}: {e}"))? {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what}: still running after {limit:?}: killed"));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok(Output { status, stdout: out.join().unwrap(), stderr: err.join().unwrap() })
}

/// Run `cmd` within [`TOOL_LIMIT`]; panics unless it exits 0. Its stdout
/// and stderr.
fn run_ok(cmd: &mut Command) -> String {
    let what = format!("{cmd:?}");
    let o = run(cmd, TOOL_LIMIT).unwrap_or_else(|e| panic!("{e}"));
    assert!(o.status.success(), "{what}: {}:\n{}", o.status, o.text());
    o.text()
}

fn granary(args: &[&str]) -> String {
    run_ok(Command::new(env!("CARGO_BIN_EXE_granary")).args(args).env_remove("GRANARY_LOG"))
}

/// A new store of `store_size` at `data` with `exports` (name, size, block
/// size), made while no server runs.
fn new_store(data: &Path, store_size: &str, exports: &[(&str, &str, &str)]) {
    let p = data.to_str().unwrap();
    granary(&["create", p, "--size", store_size]);
    for (name, size, block) in exports {
        let out = granary(&["export", "create", p, name, "--size", size, "--block-size", block]);
        assert!(out.contains(&format!("created export {name}")), "{out}");
    }
}

/// `granary export list`'s row of `name`: its columns.
fn export_row(data: &Path, name: &str) -> Vec<String> {
    let out = granary(&["export", "list", data.to_str().unwrap()]);
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no export {name} in `granary export list`:\n{out}"));
    line.split_whitespace().map(String::from).collect()
}

// ---------------------------------------------------------------------
// The server

/// `granary serve` over `data` with its NBD listener on a free low port
/// (a new one each start), killed by its PID when dropped.
struct Serve {
    child: Child,
    port: u16,
    log: Arc<Mutex<String>>,
}

impl Serve {
    /// Start it and wait (bounded) for its NBD line. A start just after a
    /// SIGKILL may find the store's lock still held for a moment (the old
    /// process's io_uring teardown): it is tried again.
    fn start(data: &Path) -> Serve {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            match Serve::try_start(data, deadline) {
                Ok(s) => return s,
                Err(log) if log.contains("in use by another process") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(log) => panic!("granary serve over {}:\n{log}", data.display()),
            }
        }
    }

    fn try_start(data: &Path, deadline: Instant) -> Result<Serve, String> {
        let port = granary_rt::net::free_low_port().unwrap();
        let mc = granary_rt::net::free_low_port().unwrap();
        let mut cmd =
            common::granary(&["serve", "--data", data.to_str().unwrap(), "-t", "2", "--no-native", "--no-resp"]);
        cmd.args(["-p", &mc.to_string(), "--nbd-port", &port.to_string()]).stdin(Stdio::null());
        let ready = |line: &str| line.contains("serving block exports over NBD on");
        let left = deadline.saturating_duration_since(Instant::now());
        let s = common::start(&mut cmd, ready, left)?;
        Ok(Serve { child: s.child, port, log: s.all })
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd://127.0.0.1:{}/{export}", self.port)
    }

    /// Send `sig` and wait (bounded) for the process.
    fn signal(&mut self, sig: i32) -> ExitStatus {
        // SAFETY: kill with the PID of our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, sig) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("granary serve did not exit within 30 s of signal {sig}:\n{}", self.log.lock().unwrap());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM: a clean stop, exit 0.
    fn stop(mut self) {
        let st = self.signal(SIGTERM);
        assert!(st.success(), "SIGTERM: {st}:\n{}", self.log.lock().unwrap());
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------------
// Seeds, data, checksums

/// The test's seed: GRANARY_FUZZ_SEED, else the clock. Printed, with how to
/// rerun, when the test fails.
struct Seed {
    seed: u64,
    test: &'static str,
}

impl Seed {
    fn new(test: &'static str) -> Seed {
        let seed = std::env::var("GRANARY_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
                ^ (std::process::id() as u64) << 32
        });
        eprintln!("{test}: seed {seed}");
        Seed { seed, test }
    }
}

impl Drop for Seed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "{} failed with seed {s}: rerun with GRANARY_FUZZ_SEED={s} cargo test -p granary-cli --test nbd {}",
                self.test,
                self.test,
                s = self.seed
            );
        }
    }
}

use common::Rng;

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// SHA-256 (FIPS 180-4) of `data`.
fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
        0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
        0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
        0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
        0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
        0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
        0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] =
        [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for chunk in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, b) in chunk.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh.wrapping_add(s1).wrapping_add(ch).wrapping_add(K[i]).wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (o, x) in out.chunks_exact_mut(4).zip(h) {
        o.copy_from_slice(&x.to_be_bytes());
    }
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn sha256_known_answers() {
    assert_eq!(hex(&sha256(b"")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    assert_eq!(hex(&sha256(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    let long = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    assert_eq!(hex(&sha256(long)), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

/// Whether two files are equal, compared in 1 MiB chunks; else the offset
/// of the first difference.
fn same_files(a: &Path, b: &Path) -> Result<(), String> {
    let (la, lb) = (std::fs::metadata(a).unwrap().len(), std::fs::metadata(b).unwrap().len());
    if la != lb {
        return Err(format!("{} has {la} bytes, {} {lb}", a.display(), b.display()));
    }
    let (mut fa, mut fb) = (File::open(a).unwrap(), File::open(b).unwrap());
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut at = 0u64;
    while at < la {
        let n = (la - at).min(1 << 20) as usize;
        fa.read_exact(&mut ba[..n]).unwrap();
        fb.read_exact(&mut bb[..n]).unwrap();
        if let Some(i) = (0..n).find(|&i| ba[i] != bb[i]) {
            return Err(format!("{} and {} differ at byte {}", a.display(), b.display(), at + i as u64));
        }
        at += n as u64;
    }
    Ok(())
}

// ---------------------------------------------------------------------
// qemu-io and nbdcopy

/// qemu-io's commands on an export of `b` bytes per block: aligned and
/// unaligned writes (inside a block, across block edges, below 512 bytes,
/// which QEMU turns into a read-modify-write of whole sectors, and on
/// sector but not block boundaries, which the server patches), a FUA
/// write, write-zeroes and discard, then the reads that verify them all.
fn qemu_io_writes(b: u64) -> Vec<String> {
    let mut c: Vec<String> = vec![
        "write -P 0xab 0 1M".into(),
        "write -P 0xcd 1000 3000".into(),
        "write -P 0x5a 1536 512".into(),
        "write -P 0x17 5000 20".into(),
        format!("write -P 0x33 {} 1024", 2 * b - 512),
        format!("write -P 0x44 {} {}", 3 * b + 512, 2 * b),
        format!("write -f -P 0x11 2M {}", 4 * b),
        "write -P 0x66 4M 1M".into(),
        "write -z 4M 256k".into(),
        "write -P 0x77 8M 1M".into(),
        "discard 8M 512k".into(),
        "flush".into(),
    ];
    c.extend(qemu_io_reads(b));
    c
}

/// The reads that verify what [`qemu_io_writes`] left, every byte of the
/// first 16 MiB.
fn qemu_io_reads(b: u64) -> Vec<String> {
    const M: u64 = 1 << 20;
    let r = |p: u8, at: u64, end: u64| format!("read -P {p:#04x} {at} {}", end - at);
    vec![
        r(0xab, 0, 1000),
        r(0xcd, 1000, 1536),
        r(0x5a, 1536, 2048),
        r(0xcd, 2048, 4000),
        r(0xab, 4000, 5000),
        r(0x17, 5000, 5020),
        r(0xab, 5020, 2 * b - 512),
        r(0x33, 2 * b - 512, 2 * b + 512),
        r(0xab, 2 * b + 512, 3 * b + 512),
        r(0x44, 3 * b + 512, 5 * b + 512),
        r(0xab, 5 * b + 512, M),
        r(0, M, 2 * M),
        r(0x11, 2 * M, 2 * M + 4 * b),
        r(0, 2 * M + 4 * b, 4 * M),
        r(0, 4 * M, 4 * M + 256 * 1024),
        r(0x66, 4 * M + 256 * 1024, 5 * M),
        r(0, 5 * M, 8 * M),
        r(0, 8 * M, 8 * M + 512 * 1024),
        r(0x77, 8 * M + 512 * 1024, 9 * M),
        r(0, 9 * M, 16 * M),
    ]
}

fn qemu_io(uri: &str, cmds: &[String]) {
    let mut cmd = cmd("qemu-io");
    cmd.args(["-f", "raw", uri]);
    for c in cmds {
        cmd.args(["-c", c]);
    }
    let out = run_ok(&mut cmd);
    // qemu-io exits 0 after a failed command or a pattern mismatch ("Pattern
    // verification failed at offset ..."): its output says.
    let lower = out.to_lowercase();
    assert!(!lower.contains("fail") && !lower.contains("error"), "qemu-io on {uri}:\n{out}");
    let reads = cmds.iter().filter(|c| c.starts_with("read ")).count();
    assert_eq!(out.matches("read ").count(), reads, "qemu-io on {uri}: a read is missing:\n{out}");
}

#[test]
fn qemu_io_patterns_and_nbdcopy_survive_a_restart() {
    const T: &str = "qemu_io_patterns_and_nbdcopy_survive_a_restart";
    if !have(T, &["qemu-io", "nbdcopy", "nbdinfo"]) {
        return;
    }
    let t0 = Instant::now();
    let seed = Seed::new(T);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("store.db");
    new_store(&data, "1G", &[("disk", "256M", "4096"), ("p4k", "16M", "4096"), ("p64k", "16M", "65536")]);
    let img = dir.path().join("in.img");
    {
        let mut rng = Rng(seed.seed);
        let mut f = File::create(&img).unwrap();
        for _ in 0..256 {
            f.write_all(&rng.bytes(1 << 20)).unwrap();
        }
    }

    let s = Serve::start(&data);
    let list = run_ok(cmd("nbdinfo").arg("--list").arg(format!("nbd://127.0.0.1:{}", s.port)));
    for want in ["export=\"disk\"", "export=\"p4k\"", "export=\"p64k\"", "export-size: 268435456"] {
        assert!(list.contains(want), "{want} missing from nbdinfo --list:\n{list}");
    }
    qemu_io(&s.uri("p4k"), &qemu_io_writes(4096));
    qemu_io(&s.uri("p64k"), &qemu_io_writes(65536));
    let t = Instant::now();
    run_ok(cmd("nbdcopy").arg("--flush").arg(&img).arg(s.uri("disk")));
    let copy_in = t.elapsed();
    let out1 = dir.path().join("out1.img");
    let t = Instant::now();
    run_ok(cmd("nbdcopy").arg(s.uri("disk")).arg(&out1));
    let copy_out = t.elapsed();
    same_files(&img, &out1).unwrap();
    s.stop();

    // Stopped: `granary export list` reads the store and lists the export
    // with every block of the random image written (none of its 4 KiB
    // blocks is all zeros), counted exactly across the clean stop, blind
    // overwrites of colliding keys included.
    let row = export_row(&data, "disk");
    assert_eq!(row[row.len() - 4], "65536", "blocks written in disk: {row:?}");

    let s = Serve::start(&data);
    qemu_io(&s.uri("p4k"), &qemu_io_reads(4096));
    qemu_io(&s.uri("p64k"), &qemu_io_reads(65536));
    let out2 = dir.path().join("out2.img");
    run_ok(cmd("nbdcopy").arg(s.uri("disk")).arg(&out2));
    same_files(&img, &out2).unwrap();
    s.stop();
    eprintln!("{T}: 256 MiB in {copy_in:?}, out {copy_out:?}; {:?} in all", t0.elapsed());
}

// ---------------------------------------------------------------------
// ext4 through nbdfuse and a loop device

/// The export mounted as ext4: `nbdfuse` shows it as `fuse/disk`, a loop
/// device over that file, ext4 on the loop device at `mnt`. Drop takes it
/// all down, whatever state it is in: unmounts (lazily if it must), detaches
/// the loop device, unmounts the FUSE file system and reaps nbdfuse (killed
/// by its PID if it does not exit).
///
/// A watchdog bounds everything the test does on the mount: a file system
/// call blocked on a server that stopped answering would never return, so
/// past `limit` the watchdog kills nbdfuse (SIGKILL, by its PID), which
/// aborts the FUSE connection: every blocked and later request fails (EIO
/// up the stack) and the test fails instead of hanging.
struct Stack {
    fuse_dir: PathBuf,
    mnt: PathBuf,
    nbdfuse: Option<Child>,
    /// nbdfuse's PID while it is not reaped, for the watchdog.
    fuse_pid: Arc<Mutex<Option<u32>>>,
    loop_dev: Option<String>,
    mounted: bool,
    /// Dropped with the stack: the watchdog ends.
    _watchdog: mpsc::Sender<()>,
}

impl Stack {
    fn new(dir: &Path, limit: Duration) -> Stack {
        let (fuse_dir, mnt) = (dir.join("fuse"), dir.join("mnt"));
        std::fs::create_dir_all(&fuse_dir).unwrap();
        std::fs::create_dir_all(&mnt).unwrap();
        let fuse_pid: Arc<Mutex<Option<u32>>> = Arc::default();
        let (tx, rx) = mpsc::channel::<()>();
        let pid = fuse_pid.clone();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!("watchdog: the mount test passed {limit:?}");
                abort_fuse(&pid);
            }
        });
        Stack { fuse_dir, mnt, nbdfuse: None, fuse_pid, loop_dev: None, mounted: false, _watchdog: tx }
    }

    /// Kill nbdfuse, which aborts the FUSE connection.
    fn abort(&self) {
        abort_fuse(&self.fuse_pid);
    }

    fn image(&self) -> PathBuf {
        self.fuse_dir.join("disk")
    }

    /// nbdfuse on `uri`, then a loop device over its file.
    fn attach(&mut self, uri: &str) {
        assert!(self.nbdfuse.is_none() && self.loop_dev.is_none());
        let pidfile = self.fuse_dir.with_extension("pid");
        let _ = std::fs::remove_file(&pidfile);
        let mut child = cmd("nbdfuse")
            .arg("-P")
            .arg(&pidfile)
            .arg(self.image())
            .arg(uri)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Drain its stderr (kept for messages on failure).
        let err = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                eprintln!("nbdfuse: {line}");
                log2.lock().unwrap().push_str(&line);
            }
        });
        *self.fuse_pid.lock().unwrap() = Some(child.id());
        self.nbdfuse = Some(child);
        // nbdfuse writes its PID file once it serves the file.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&pidfile).is_ok_and(|s| !s.trim().is_empty()) {
            if let Ok(Some(st)) = self.nbdfuse.as_mut().unwrap().try_wait() {
                panic!("nbdfuse on {uri} exited ({st}): {}", log.lock().unwrap());
            }
            assert!(Instant::now() < deadline, "nbdfuse on {uri}: not ready after 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        // `losetup -f --show` may race another test for the same free
        // device: try again.
        let mut tries = 0;
        let dev = loop {
            let o = run(cmd("losetup").arg("-f").arg("--show").arg(self.image()), TOOL_LIMIT).unwrap();
            if o.status.success() {
                break String::from_utf8(o.stdout).unwrap().trim().to_string();
            }
            tries += 1;
            assert!(tries < 10, "losetup -f --show {}: {}", self.image().display(), o.text());
            std::thread::sleep(Duration::from_millis(100));
        };
        self.loop_dev = Some(dev);
    }

    fn dev(&self) -> &str {
        self.loop_dev.as_deref().unwrap()
    }

    fn mkfs(&self) {
        run_ok(cmd("mkfs.ext4").args(["-q", self.dev()]));
    }

    fn mount(&mut self) {
        run_ok(cmd("mount").args(["-t", "ext4", self.dev()]).arg(&self.mnt));
        self.mounted = true;
    }

    fn umount(&mut self) {
        run_ok(cmd("umount").arg(&self.mnt));
        self.mounted = false;
    }

    /// `fsck.ext4 ARGS DEV`: its exit status and output.
    fn fsck(&self, args: &[&str]) -> (i32, String) {
        let o = run(cmd("fsck.ext4").args(args).arg(self.dev()), TOOL_LIMIT).unwrap();
        (o.status.code().unwrap_or(-1), o.text())
    }

    /// Unmount (lazily if a plain umount fails), detach the loop device,
    /// unmount the FUSE file system and reap nbdfuse; every step bounded,
    /// failures reported, none fatal.
    fn teardown(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        let step = |cmd: &mut Command, problems: &mut Vec<String>| -> bool {
            match run(cmd, Duration::from_secs(30)) {
                Ok(o) if o.status.success() => true,
                Ok(o) => {
                    problems.push(format!("{cmd:?}: {}: {}", o.status, o.text().trim()));
                    false
                }
                Err(e) => {
                    problems.push(e);
                    false
                }
            }
        };
        if self.mounted {
            if !step(cmd("umount").arg(&self.mnt), &mut problems) {
                step(cmd("umount").arg("-l").arg(&self.mnt), &mut problems);
            }
            self.mounted = false;
        }
        if let Some(dev) = self.loop_dev.take() {
            step(cmd("losetup").arg("-d").arg(&dev), &mut problems);
        }
        if let Some(mut child) = self.nbdfuse.take() {
            if !step(cmd("fusermount3").arg("-u").arg(&self.fuse_dir), &mut problems) {
                step(cmd("fusermount3").arg("-uz").arg(&self.fuse_dir), &mut problems);
            }
            *self.fuse_pid.lock().unwrap() = None;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                    _ => {
                        problems.push("nbdfuse did not exit after fusermount3 -u: killed".into());
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        problems
    }

    /// [`Stack::teardown`], which must go without a problem.
    fn detach(&mut self) {
        let problems = self.teardown();
        assert!(problems.is_empty(), "taking the mount down: {problems:#?}");
    }
}

/// Kill nbdfuse (SIGKILL, by its PID) if it runs: its FUSE connection is
/// aborted, every request on it fails.
fn abort_fuse(pid: &Mutex<Option<u32>>) {
    // Under the lock: the PID is not reaped (teardown clears it before
    // reaping), so it is still nbdfuse's.
    if let Some(pid) = *pid.lock().unwrap() {
        eprintln!("killing nbdfuse ({pid}): its FUSE connection is aborted");
        // SAFETY: kill with the PID of our child, not yet reaped.
        unsafe { libc::kill(pid as i32, SIGKILL) };
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        for p in self.teardown() {
            eprintln!("cleanup: {p}");
        }
    }
}

/// A file the workload wrote: its path under the mount, size and sha256.
struct Written {
    rel: String,
    len: usize,
    sha: [u8; 32],
}

/// File `i`'s size: mostly 0..64 KiB, one in 32 from 64 KiB to 2 MiB.
fn file_len(rng: &mut Rng) -> usize {
    if rng.below(32) == 0 {
        (64 << 10) + rng.below(2 << 20) as usize
    } else {
        rng.below(64 << 10) as usize
    }
}

/// Write file `i` (in one of 16 directories) with `len` bytes from `rng`
/// and fsync it.
fn write_file(mnt: &Path, i: usize, rng: &mut Rng) -> std::io::Result<Written> {
    let rel = format!("d{:02}/f{i:05}", i % 16);
    let path = mnt.join(&rel);
    std::fs::create_dir_all(path.parent().unwrap())?;
    let len = file_len(rng);
    let data = rng.bytes(len);
    let mut f = File::create(&path)?;
    f.write_all(&data)?;
    f.sync_all()?;
    Ok(Written { rel, len, sha: sha256(&data) })
}

/// Every file of `files` under `mnt` has its size and sha256.
fn verify(mnt: &Path, files: &[Written]) -> Result<(), String> {
    let mut bad = Vec::new();
    for w in files {
        match std::fs::read(mnt.join(&w.rel)) {
            Ok(d) if d.len() == w.len && sha256(&d) == w.sha => {}
            Ok(d) => bad.push(format!(
                "{}: {} bytes, sha256 {}; wrote {} bytes, sha256 {}",
                w.rel,
                d.len(),
                hex(&sha256(&d)),
                w.len,
                hex(&w.sha)
            )),
            Err(e) => bad.push(format!("{}: {e}", w.rel)),
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("{} of {} files are not as written:\n{}", bad.len(), files.len(), bad.join("\n")))
    }
}

/// The problems `fsck.ext4 -y` fixed (the text before each "...? yes"
/// prompt) other than the free block, free inode and directory counts.
fn unexpected_fixes(out: &str) -> Vec<String> {
    const SUMMARY: [&str; 3] = ["Free blocks count wrong", "Free inodes count wrong", "Directories count wrong"];
    let mut bad = Vec::new();
    let mut prev = "";
    for line in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.ends_with("? yes") {
            // The problem is on the prompt's line, or alone on the line
            // before ("Free blocks count wrong (1, counted=2).\nFix? yes").
            let problem = if line.split_whitespace().count() <= 2 { prev } else { line };
            if !SUMMARY.iter().any(|s| problem.starts_with(s)) {
                bad.push(problem.to_string());
            }
        }
        prev = line;
    }
    bad
}

#[test]
fn fsck_fixes_are_told_apart() {
    let replay = "/dev/loop0: recovering journal\nPass 1: Checking inodes, blocks, and sizes\n\
        Pass 5: Checking group summary information\nFree blocks count wrong (117189, counted=110795).\nFix? yes\n\n\
        Free inodes count wrong for group #0 (8181, counted=8100).\nFix? yes\n";
    assert!(unexpected_fixes(replay).is_empty());
    let lost = "Pass 2: Checking directory structure\nEntry 'f00012' in /d03 (13) has deleted/unused inode 140.  \
        Clear? yes\n\nPass 5: Checking group summary information\nBlock bitmap differences:  -(9266--9281)\nFix? yes\n";
    assert_eq!(
        unexpected_fixes(lost),
        [
            "Entry 'f00012' in /d03 (13) has deleted/unused inode 140.  Clear? yes",
            "Block bitmap differences:  -(9266--9281)"
        ]
    );
}

#[test]
fn ext4_over_nbdfuse_and_a_loop_device_keeps_1000_files() {
    const T: &str = "ext4_over_nbdfuse_and_a_loop_device_keeps_1000_files";
    if !can_mount(T) {
        return;
    }
    let t0 = Instant::now();
    let seed = Seed::new(T);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("store.db");
    new_store(&data, "512M", &[("fs", "256M", "4096")]);
    let s = Serve::start(&data);
    let mut stack = Stack::new(dir.path(), MOUNT_TEST_LIMIT);
    stack.attach(&s.uri("fs"));
    stack.mkfs();
    stack.mount();
    let t = Instant::now();
    let mut rng = Rng(seed.seed);
    let files: Vec<Written> =
        (0..1000).map(|i| write_file(&stack.mnt, i, &mut rng).unwrap_or_else(|e| panic!("file {i}: {e}"))).collect();
    let write_time = t.elapsed();
    let bytes: usize = files.iter().map(|w| w.len).sum();
    stack.umount();
    let (code, out) = stack.fsck(&["-fn"]);
    assert_eq!(code, 0, "fsck.ext4 -fn after a clean unmount:\n{out}");
    stack.mount();
    verify(&stack.mnt, &files).unwrap();
    let names: usize = (0..16).map(|d| std::fs::read_dir(stack.mnt.join(format!("d{d:02}"))).unwrap().count()).sum();
    assert_eq!(names, 1000);
    stack.umount();
    stack.detach();
    s.stop();
    let row = export_row(&data, "fs");
    assert_ne!(row[row.len() - 4], "0", "the store holds no block of fs: {row:?}");
    eprintln!(
        "{T}: 1000 files ({} MiB) written and fsync'ed in {write_time:?}; {:?} in all",
        bytes >> 20,
        t0.elapsed()
    );
}

/// Crash cycles of the SIGKILL test: each one writes on the file system the
/// last one recovered.
const CRASH_CYCLES: usize = 3;

#[test]
fn ext4_over_nbd_survives_a_server_sigkill_mid_workload() {
    const T: &str = "ext4_over_nbd_survives_a_server_sigkill_mid_workload";
    if !can_mount(T) {
        return;
    }
    let t0 = Instant::now();
    let seed = Seed::new(T);
    let mut rng = Rng(seed.seed);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("store.db");
    new_store(&data, "384M", &[("fs", "128M", "4096")]);
    let mut s = Serve::start(&data);
    let mut stack = Stack::new(dir.path(), MOUNT_TEST_LIMIT);
    stack.attach(&s.uri("fs"));
    stack.mkfs();
    stack.mount();
    // Every file whose fsync returned, over all cycles.
    let mut synced: Vec<Written> = Vec::new();
    let mut next_file = 0;
    for cycle in 0..CRASH_CYCLES {
        // Kill after this many fsync'ed files, and this long after.
        let kill_after = 20 + rng.below(180) as usize;
        let kill_delay = Duration::from_micros(rng.below(20_000));
        eprintln!("{T}: cycle {cycle}: SIGKILL after {kill_after} fsync'ed files and {kill_delay:?}");
        let (new, attempted) = crash_mid_workload(&mut stack, &mut s, next_file, kill_after, kill_delay, rng.next());
        next_file = attempted;
        synced.extend(new);

        // Restart; the journal is replayed, then the file system is clean
        // and every fsync'ed file is there.
        let t = Instant::now();
        s = Serve::start(&data);
        let restart = t.elapsed();
        stack.attach(&s.uri("fs"));
        let (code, fy) = stack.fsck(&["-fy"]);
        eprintln!("{T}: cycle {cycle}: restart {restart:?}; fsck.ext4 -fy exited {code}:\n{fy}");
        assert!(code & !3 == 0, "fsck.ext4 -fy after the crash exited {code} (uncorrected errors):\n{fy}");
        assert!(fy.contains("recovering journal"), "fsck.ext4 -fy replayed no journal:\n{fy}");
        // The journal replayed, ext4 is consistent: the only fixes are of
        // the summary counts, which ext4 does not journal. Anything else
        // (bitmap differences, bad directory entries, wrong link counts)
        // means the device lost a write it acknowledged before a flush.
        let bad = unexpected_fixes(&fy);
        assert!(bad.is_empty(), "fsck.ext4 -fy after the crash fixed more than the summary counts: {bad:#?}\n{fy}");
        let (code, fnout) = stack.fsck(&["-fn"]);
        assert_eq!(code, 0, "fsck.ext4 -fn after fsck.ext4 -fy:\n{fnout}\n(-fy said:\n{fy})");
        stack.mount();
        verify(&stack.mnt, &synced).unwrap_or_else(|e| panic!("after crash {cycle}: {e}"));
    }
    stack.umount();
    stack.detach();
    s.stop();
    eprintln!("{T}: {CRASH_CYCLES} crashes, {} files checked; {:?} in all", synced.len(), t0.elapsed());
}

/// Write files `first..` on `stack`'s mount, each fsync'ed, and SIGKILL the
/// server `kill_delay` after the `kill_after`th fsync returned; then take
/// the broken mount down. The files whose fsync returned (every one of
/// them, before or after the kill), and the number after the last file
/// attempted.
fn crash_mid_workload(
    stack: &mut Stack,
    s: &mut Serve,
    first: usize,
    kill_after: usize,
    kill_delay: Duration,
    seed: u64,
) -> (Vec<Written>, usize) {
    let synced: Arc<Mutex<Vec<Written>>> = Arc::default();
    let count = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::channel();
    let worker = {
        let (synced, count, stop, mnt) = (synced.clone(), count.clone(), stop.clone(), stack.mnt.clone());
        let mut rng = Rng(seed);
        std::thread::spawn(move || {
            let mut i = first;
            let end = loop {
                if stop.load(SeqCst) {
                    break "stopped".to_string();
                }
                match write_file(&mnt, i, &mut rng) {
                    Ok(w) => {
                        synced.lock().unwrap().push(w);
                        count.fetch_add(1, SeqCst);
                    }
                    Err(e) => break format!("file {i}: {e}"),
                }
                i += 1;
            };
            let _ = done_tx.send((end, i + 1));
        })
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    while count.load(SeqCst) < kill_after {
        if let Ok((end, _)) = done_rx.try_recv() {
            panic!("the workload ended before the kill: {end}");
        }
        assert!(Instant::now() < deadline, "{} files fsync'ed in 180 s", count.load(SeqCst));
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(kill_delay);
    let killed = s.signal(SIGKILL);
    assert!(!killed.success());
    let at_kill = count.load(SeqCst);
    // Now its writes fail: the workload ends with an error (bounded: if it
    // hangs, the FUSE connection is aborted, which fails every request).
    let (end, attempted) = match done_rx.recv_timeout(Duration::from_secs(30)) {
        Ok(r) => r,
        Err(_) => {
            stop.store(true, SeqCst);
            eprintln!("the workload hangs 30 s after the kill: aborting the FUSE connection");
            stack.abort();
            done_rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("the workload still hangs after the FUSE connection was aborted"))
        }
    };
    worker.join().unwrap();
    let synced = std::mem::take(&mut *synced.lock().unwrap());
    eprintln!("{at_kill} files fsync'ed at the kill, {} in all; the workload ended: {end}", synced.len());
    // Take the broken mount down (a lazy unmount if the plain one fails).
    for p in stack.teardown() {
        eprintln!("taking the mount down after the kill: {p}");
    }
    assert!(!stack.mounted && stack.loop_dev.is_none() && stack.nbdfuse.is_none());
    (synced, attempted)
}
