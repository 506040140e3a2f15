//! A failing device under `granary serve`, on every protocol (memcache
//! text, RESP, native, NBD): the server runs with its device wrapped in
//! the fault-injecting one (`GRANARY_FAULT_SOCKET`, docs/FAULTS.md), and the
//! test sets faults through the control socket while clients work.
//!
//! - A read error fails the request that met it, with the protocol's error,
//!   and the same connection goes on to read other keys.
//! - A write error makes the store read-only: writes are refused on every
//!   protocol, reads are served, stats and /metrics say so; a restart on a
//!   healthy device finds every acknowledged write with its value.
//! - A device that stops answering: the request waits, the server stays up,
//!   and once the device is released the request completes.
//!
//! Values come from a seed, printed when a test fails; `GRANARY_FUZZ_SEED=S`
//! reruns one. Every wait is bounded.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

const START_LIMIT: Duration = Duration::from_secs(90);
const IO_LIMIT: Duration = Duration::from_secs(30);
const BLOCK: usize = 4096;

fn port() -> u16 {
    granary_rt::net::free_low_port().unwrap()
}

fn granary(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_granary")).args(args).env_remove("GRANARY_LOG").output().unwrap();
    assert!(out.status.success(), "granary {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A seed from the environment or the clock, printed if the test fails.
struct Seed(u64);

impl Seed {
    fn new() -> Seed {
        let s = std::env::var("GRANARY_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
        });
        Seed(s)
    }
}

impl Drop for Seed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("seed: GRANARY_FUZZ_SEED={}", self.0);
        }
    }
}

use common::Rng;

impl Rng {
    /// A printable value of 1 to `max` bytes.
    fn value(&mut self, max: u64) -> Vec<u8> {
        let n = 1 + self.next() % max;
        (0..n).map(|_| b'a' + (self.next() % 26) as u8).collect()
    }
}

// ---------------------------------------------------------------------
// The server

struct Serve {
    child: Child,
    mc: u16,
    resp: u16,
    native: u16,
    nbd: u16,
    metrics: u16,
    control: PathBuf,
    log: Arc<Mutex<String>>,
}

impl Serve {
    /// `granary serve` over `data` with every listener, its device wrapped
    /// for fault injection when `faults` (control socket in `dir`).
    /// A start just after a SIGKILL may find the store's lock still held
    /// for a moment (the old process's io_uring teardown): tried again.
    fn start(data: &Path, dir: &Path, faults: bool) -> Serve {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            match Serve::try_start(data, dir, faults) {
                Ok(s) => return s,
                Err(log) if log.contains("in use by another process") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(log) => panic!("granary serve did not start:\n{log}"),
            }
        }
    }

    fn try_start(data: &Path, dir: &Path, faults: bool) -> Result<Serve, String> {
        let (mc, resp, native, nbd, metrics) = (port(), port(), port(), port(), port());
        let control = dir.join("fault.sock");
        let mut cmd = common::granary(&[]);
        // `-m 0`: no DRAM tier, so every GET reads the device and meets
        // the faults this test injects (a tier would serve hot keys).
        cmd.args(["serve", "--data", data.to_str().unwrap(), "-t", "2", "--max-item-size", "65536", "-m", "0"])
            .args(["-p", &mc.to_string(), "--resp-port", &resp.to_string()])
            .args(["--native-port", &native.to_string(), "--nbd-port", &nbd.to_string()])
            .args(["--metrics", &format!("127.0.0.1:{metrics}")])
            .env_remove("GRANARY_FAULT_SOCKET")
            .stdin(Stdio::null());
        if faults {
            cmd.env("GRANARY_FAULT_SOCKET", &control);
        }
        let ready = |line: &str| line.contains("serving the native protocol");
        let common::Started { child, all: log, .. } = common::start(&mut cmd, ready, START_LIMIT)?;
        Ok(Serve { child, mc, resp, native, nbd, metrics, control, log })
    }

    /// One control command; panics unless the reply is "ok...".
    fn fault(&self, cmd: &str) -> String {
        let mut s = UnixStream::connect(&self.control).unwrap();
        s.set_read_timeout(Some(IO_LIMIT)).unwrap();
        writeln!(s, "{cmd}").unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        assert!(line.starts_with("ok"), "fault {cmd:?}: {line}");
        line.trim_end().to_string()
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Send `sig` and wait (bounded) for the exit.
    fn signal(mut self, sig: i32) -> std::process::ExitStatus {
        // SAFETY: kill with the PID of our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, sig) };
        let deadline = Instant::now() + IO_LIMIT;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(Instant::now() < deadline, "no exit within {IO_LIMIT:?} of signal {sig}:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn metrics(&self) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.metrics)).unwrap();
        s.set_read_timeout(Some(IO_LIMIT)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn native(&self) -> granary_client::Client {
        granary_client::Client::connect(("127.0.0.1", self.native), granary_client::ClientConfig::default()).unwrap()
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

/// A new store at `data` with one NBD export, `blocks` (4 KiB blocks).
fn new_store(data: &Path) {
    let p = data.to_str().unwrap();
    granary(&["create", p, "--size", "64M"]);
    granary(&["export", "create", p, "blocks", "--size", "1M", "--block-size", "4096"]);
}

// ---------------------------------------------------------------------
// Clients

/// Memcache text protocol over one connection.
struct Mc {
    r: BufReader<TcpStream>,
}

impl Mc {
    fn connect(port: u16) -> Mc {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(IO_LIMIT)).unwrap();
        Mc { r: BufReader::new(s) }
    }
    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).unwrap();
        assert!(l.ends_with("\r\n"), "memcache connection closed or cut: {l:?}");
        l.trim_end().to_string()
    }
    fn send(&mut self, b: &[u8]) {
        self.r.get_mut().write_all(b).unwrap();
    }
    /// `set`'s reply line.
    fn set(&mut self, k: &str, v: &[u8]) -> String {
        let mut req = format!("set {k} 0 0 {}\r\n", v.len()).into_bytes();
        req.extend_from_slice(v);
        req.extend_from_slice(b"\r\n");
        self.send(&req);
        self.line()
    }
    /// The value, None on a miss, Err(line) on an error reply.
    fn get(&mut self, k: &str) -> Result<Option<Vec<u8>>, String> {
        self.send(format!("get {k}\r\n").as_bytes());
        let l = self.line();
        if l == "END" {
            return Ok(None);
        }
        let Some(n) = l.strip_prefix(&format!("VALUE {k} 0 ")) else { return Err(l) };
        let mut v = vec![0; n.parse::<usize>().unwrap() + 2];
        self.r.read_exact(&mut v).unwrap();
        v.truncate(v.len() - 2);
        assert_eq!(self.line(), "END");
        Ok(Some(v))
    }
    fn stat(&mut self, name: &str) -> String {
        self.send(b"stats\r\n");
        let mut found = None;
        loop {
            let l = self.line();
            if l == "END" {
                break;
            }
            if let Some(v) = l.strip_prefix(&format!("STAT {name} ")) {
                found = Some(v.to_string());
            }
        }
        found.unwrap_or_else(|| panic!("no stat {name}"))
    }
}

/// RESP over one connection.
struct Resp {
    r: BufReader<TcpStream>,
}

#[derive(Debug, PartialEq)]
enum Reply {
    Simple(String),
    Error(String),
    Bulk(Option<Vec<u8>>),
    Int(i64),
}

impl Resp {
    fn connect(port: u16) -> Resp {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(IO_LIMIT)).unwrap();
        Resp { r: BufReader::new(s) }
    }
    fn call(&mut self, args: &[&[u8]]) -> Reply {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a);
            req.extend_from_slice(b"\r\n");
        }
        self.r.get_mut().write_all(&req).unwrap();
        let mut l = String::new();
        self.r.read_line(&mut l).unwrap();
        let l = l.trim_end();
        let (t, rest) = l.split_at(1);
        match t {
            "+" => Reply::Simple(rest.into()),
            "-" => Reply::Error(rest.into()),
            ":" => Reply::Int(rest.parse().unwrap()),
            "$" if rest == "-1" => Reply::Bulk(None),
            "$" => {
                let mut v = vec![0; rest.parse::<usize>().unwrap() + 2];
                self.r.read_exact(&mut v).unwrap();
                v.truncate(v.len() - 2);
                Reply::Bulk(Some(v))
            }
            _ => panic!("unexpected RESP reply {l:?}"),
        }
    }
}

/// The NBD transmission phase over one connection (fixed newstyle
/// handshake, NBD_OPT_GO, simple replies).
struct Nbd {
    s: TcpStream,
    cookie: u64,
}

impl Nbd {
    fn connect(port: u16, export: &str) -> Nbd {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(IO_LIMIT)).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..16], b"NBDMAGICIHAVEOPT");
        // Fixed newstyle, no zeroes.
        s.write_all(&3u32.to_be_bytes()).unwrap();
        let mut opt = Vec::new();
        opt.extend_from_slice(b"IHAVEOPT");
        opt.extend_from_slice(&7u32.to_be_bytes()); // NBD_OPT_GO
        opt.extend_from_slice(&(4 + export.len() as u32 + 2).to_be_bytes());
        opt.extend_from_slice(&(export.len() as u32).to_be_bytes());
        opt.extend_from_slice(export.as_bytes());
        opt.extend_from_slice(&0u16.to_be_bytes());
        s.write_all(&opt).unwrap();
        loop {
            let mut h = [0u8; 20];
            s.read_exact(&mut h).unwrap();
            let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
            let mut data = vec![0; len];
            s.read_exact(&mut data).unwrap();
            match kind {
                1 => break, // NBD_REP_ACK
                3 => {}     // NBD_REP_INFO
                k => panic!("NBD_OPT_GO refused: reply {k:#x} {}", String::from_utf8_lossy(&data)),
            }
        }
        Nbd { s, cookie: 0 }
    }

    fn request(&mut self, kind: u16, offset: u64, len: u32, data: &[u8]) -> u32 {
        self.cookie += 1;
        let mut r = Vec::new();
        r.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        r.extend_from_slice(&0u16.to_be_bytes());
        r.extend_from_slice(&kind.to_be_bytes());
        r.extend_from_slice(&self.cookie.to_be_bytes());
        r.extend_from_slice(&offset.to_be_bytes());
        r.extend_from_slice(&len.to_be_bytes());
        r.extend_from_slice(data);
        self.s.write_all(&r).unwrap();
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), 0x6744_6698);
        assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), self.cookie);
        u32::from_be_bytes(h[4..8].try_into().unwrap())
    }

    /// A block's bytes, or the NBD error.
    fn read(&mut self, block: u64) -> Result<Vec<u8>, u32> {
        match self.request(0, block * BLOCK as u64, BLOCK as u32, &[]) {
            0 => {
                let mut v = vec![0; BLOCK];
                self.s.read_exact(&mut v).unwrap();
                Ok(v)
            }
            e => Err(e),
        }
    }

    /// Write then flush one block; the NBD error of the first that fails.
    fn write(&mut self, block: u64, data: &[u8]) -> Result<(), u32> {
        match self.request(1, block * BLOCK as u64, BLOCK as u32, data) {
            0 => {}
            e => return Err(e),
        }
        match self.request(3, 0, 0, &[]) {
            0 => Ok(()),
            e => Err(e),
        }
    }
}

fn nbd_block(tag: &str, rng: &mut Rng) -> Vec<u8> {
    let mut b: Vec<u8> = (0..BLOCK).map(|_| b'a' + (rng.next() % 26) as u8).collect();
    b[100..100 + tag.len()].copy_from_slice(tag.as_bytes());
    b
}

const EIO: u32 = 5;

/// What each protocol was acknowledged: key -> value (NBD: block -> bytes).
#[derive(Default)]
struct Model {
    mc: BTreeMap<String, Vec<u8>>,
    resp: BTreeMap<String, Vec<u8>>,
    native: BTreeMap<String, Vec<u8>>,
    nbd: BTreeMap<u64, Vec<u8>>,
}

/// Write `n` keys per protocol (and `n` NBD blocks) with seeded values.
fn fill(s: &Serve, rng: &mut Rng, n: usize, m: &mut Model) {
    let mut mc = Mc::connect(s.mc);
    let mut resp = Resp::connect(s.resp);
    let native = s.native();
    let mut nbd = Nbd::connect(s.nbd, "blocks");
    for i in 0..n {
        let (k, v) = (format!("mc-{i}"), rng.value(3000));
        assert_eq!(mc.set(&k, &v), "STORED");
        m.mc.insert(k, v);
        let (k, v) = (format!("rs-{i}"), rng.value(3000));
        assert_eq!(resp.call(&[b"SET", k.as_bytes(), &v]), Reply::Simple("OK".into()));
        m.resp.insert(k, v);
        let (k, v) = (format!("nv-{i}"), rng.value(3000));
        native.put(k.as_bytes(), &v).unwrap();
        m.native.insert(k, v);
        let b = nbd_block(&format!("block-{i}"), rng);
        nbd.write(i as u64, &b).unwrap();
        m.nbd.insert(i as u64, b);
    }
}

/// Every acknowledged write reads back, on its own protocol, over new
/// connections.
fn verify(s: &Serve, m: &Model) {
    let native = s.native();
    check(&mut Mc::connect(s.mc), &mut Resp::connect(s.resp), &native, &mut Nbd::connect(s.nbd, "blocks"), m);
}

/// Every acknowledged write reads back over these connections.
fn check(mc: &mut Mc, resp: &mut Resp, native: &granary_client::Client, nbd: &mut Nbd, m: &Model) {
    for (k, v) in &m.mc {
        assert_eq!(mc.get(k).unwrap().as_ref(), Some(v), "memcache {k}");
    }
    for (k, v) in &m.resp {
        assert_eq!(resp.call(&[b"GET", k.as_bytes()]), Reply::Bulk(Some(v.clone())), "resp {k}");
    }
    for (k, v) in &m.native {
        assert_eq!(native.get(k.as_bytes()).unwrap().as_ref(), Some(v), "native {k}");
    }
    for (b, v) in &m.nbd {
        assert!(nbd.read(*b).unwrap() == *v, "nbd block {b}");
    }
}

/// A test's state besides its server: the seed (printed on failure), its
/// generator, the store file and the model of acknowledged writes.
struct Fixture {
    seed: Seed,
    rng: Rng,
    dir: tempfile::TempDir,
    data: PathBuf,
    m: Model,
}

/// A new store served with faults injectable, and `n` keys (and blocks)
/// written per protocol.
fn start_filled(n: usize) -> (Fixture, Serve) {
    let seed = Seed::new();
    let mut rng = Rng(seed.0);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("g.db");
    new_store(&data);
    let s = Serve::start(&data, dir.path(), true);
    let mut m = Model::default();
    fill(&s, &mut rng, n, &mut m);
    (Fixture { seed, rng, dir, data, m }, s)
}

fn server_status(e: granary_client::Error) -> granary_client::Status {
    match e {
        granary_client::Error::Server { status, .. } => status,
        e => panic!("expected a server error status, got {e}"),
    }
}

// ---------------------------------------------------------------------
// Tests

#[test]
fn a_read_error_fails_that_request_and_the_connection_goes_on() {
    let (Fixture { seed: _seed, mut rng, dir: _dir, data: _data, m }, s) = start_filled(8);
    // The records of these keys (and the NBD block tagged so) are the bad
    // sectors: only reads that meet them fail.
    let mut mc = Mc::connect(s.mc);
    let mut resp = Resp::connect(s.resp);
    let native = s.native();
    let mut nbd = Nbd::connect(s.nbd, "blocks");
    assert_eq!(mc.set("victim-mc", b"lost-for-now"), "STORED");
    assert_eq!(resp.call(&[b"SET", b"victim-rs", b"lost-for-now"]), Reply::Simple("OK".into()));
    native.put(b"victim-nv", b"lost-for-now").unwrap();
    let bad = nbd_block("victim-nbd", &mut rng);
    nbd.write(100, &bad).unwrap();
    s.fault("read-eio match victim-");

    let e = mc.get("victim-mc").unwrap_err();
    assert!(e.starts_with("SERVER_ERROR") && e.contains("read failed"), "{e}");
    let e = match resp.call(&[b"GET", b"victim-rs"]) {
        Reply::Error(e) => e,
        r => panic!("RESP GET of a bad record: {r:?}"),
    };
    assert!(e.starts_with("ERR") && e.contains("read failed"), "{e}");
    assert_eq!(server_status(native.get(b"victim-nv").unwrap_err()), granary_client::Status::IoError);
    assert_eq!(nbd.read(100), Err(EIO));
    // The same connections read every other key.
    check(&mut mc, &mut resp, &native, &mut nbd, &m);
    // A read error does not make the store read-only.
    assert_eq!(mc.stat("granary_read_only"), "0");
    assert_eq!(mc.set("after-read-error", b"x"), "STORED");
    assert!(s.fault("status").contains("failed_writes=0"));

    // The sectors answer again: the records were never damaged.
    s.fault("read-eio off");
    assert_eq!(mc.get("victim-mc").unwrap().as_deref(), Some(&b"lost-for-now"[..]));
    assert_eq!(resp.call(&[b"GET", b"victim-rs"]), Reply::Bulk(Some(b"lost-for-now".to_vec())));
    assert_eq!(native.get(b"victim-nv").unwrap().as_deref(), Some(&b"lost-for-now"[..]));
    assert!(nbd.read(100).unwrap() == bad);
    // Every read fails: the server answers each with an error and stays up.
    s.fault("read-eio all");
    assert!(mc.get("mc-0").unwrap_err().starts_with("SERVER_ERROR"));
    assert!(matches!(resp.call(&[b"GET", b"rs-0"]), Reply::Error(_)));
    assert_eq!(nbd.read(0), Err(EIO));
    s.fault("read-eio off");
    verify(&s, &m);
    let st = s.signal(15);
    assert!(st.success(), "SIGTERM: {st}");
}

#[test]
fn a_write_error_makes_the_store_read_only_and_a_restart_recovers_every_acknowledged_write() {
    let (Fixture { seed: _seed, mut rng, dir, data, m }, s) = start_filled(12);
    let mut mc = Mc::connect(s.mc);
    let mut resp = Resp::connect(s.resp);
    let native = s.native();
    let mut nbd = Nbd::connect(s.nbd, "blocks");
    assert_eq!(mc.stat("granary_read_only"), "0");

    s.fault("write-eio on");
    // The first write meets the failure; every later one is refused by
    // the read-only store, the device's trouble over or not.
    let e = mc.set("refused-mc", b"never");
    assert!(e.starts_with("SERVER_ERROR"), "{e}");
    s.fault("write-eio off");
    let e = mc.set("refused-mc", b"never");
    assert!(e.starts_with("SERVER_ERROR") && e.contains("refuses writes"), "{e}");
    match resp.call(&[b"SET", b"refused-rs", b"never"]) {
        Reply::Error(e) => assert!(e.starts_with("ERR") && e.contains("refuses writes"), "{e}"),
        r => panic!("RESP SET on a read-only store: {r:?}"),
    }
    assert!(matches!(resp.call(&[b"DEL", b"rs-0"]), Reply::Error(_)));
    assert_eq!(server_status(native.put(b"refused-nv", b"never").unwrap_err()), granary_client::Status::ReadOnly);
    assert_eq!(nbd.write(0, &nbd_block("refused-nbd", &mut rng)), Err(EIO));
    // Reads are served, on the same connections.
    check(&mut mc, &mut resp, &native, &mut nbd, &m);
    assert_eq!(mc.get("refused-mc").unwrap(), None);
    // The state is visible: memcache stats, native stats, /metrics; and
    // logged once.
    assert_eq!(mc.stat("granary_read_only"), "1");
    let ro = native.stats().unwrap().into_iter().find(|(k, _)| k == "read_only").map(|(_, v)| v);
    assert_eq!(ro.as_deref(), Some("1"));
    match resp.call(&[b"INFO", b"stats"]) {
        Reply::Bulk(Some(info)) => {
            let info = String::from_utf8(info).unwrap();
            assert!(info.contains("granary_read_only:1\r\n"), "{info}");
        }
        r => panic!("INFO: {r:?}"),
    }
    let metrics = s.metrics();
    assert!(metrics.lines().any(|l| l == "granary_store_read_only 1"), "{metrics}");
    let log = s.log();
    assert_eq!(log.matches("the store is read-only until reopened").count(), 1, "{log}");
    drop((mc, resp, native, nbd));

    // A stop of a read-only server ends (its checkpoint cannot be written).
    let _ = s.signal(15);
    let s = Serve::start(&data, dir.path(), false);
    verify(&s, &m);
    let mut mc = Mc::connect(s.mc);
    assert_eq!(mc.stat("granary_read_only"), "0");
    assert_eq!(mc.get("refused-mc").unwrap(), None);
    assert_eq!(mc.set("after-restart", b"ok"), "STORED");
    let st = s.signal(15);
    assert!(st.success(), "SIGTERM: {st}");
}

#[test]
fn a_write_error_then_sigkill_loses_nothing_acknowledged() {
    let (Fixture { seed: _seed, rng: _rng, dir, data, m }, s) = start_filled(10);
    s.fault("write-eio on");
    let mut mc = Mc::connect(s.mc);
    for i in 0..4 {
        assert!(mc.set(&format!("refused-{i}"), b"never").starts_with("SERVER_ERROR"));
    }
    let _ = s.signal(9);
    let s = Serve::start(&data, dir.path(), true);
    verify(&s, &m);
    let st = s.signal(15);
    assert!(st.success(), "SIGTERM: {st}");
}

#[test]
fn a_device_that_stops_answering_holds_requests_until_released() {
    let (Fixture { seed: _seed, rng: _rng, dir, data, mut m }, s) = start_filled(4);

    s.fault("hang");
    let (mc_port, native_port) = (s.mc, s.native);
    let want_mc = m.mc["mc-1"].clone();
    let want_nv = m.native["nv-2"].clone();
    let held_get = std::thread::spawn(move || Mc::connect(mc_port).get("mc-1"));
    let held_put = std::thread::spawn(move || {
        let c = granary_client::Client::connect(
            ("127.0.0.1", native_port),
            granary_client::ClientConfig { timeout: IO_LIMIT, connections: 1, ..Default::default() },
        )
        .unwrap();
        c.put(b"written-while-hung", b"late").and_then(|()| c.get(b"nv-2"))
    });
    let resp_port = s.resp;
    let want_rs = m.resp["rs-0"].clone();
    let held_resp = std::thread::spawn(move || Resp::connect(resp_port).call(&[b"GET", b"rs-0"]));
    assert_eq!(s.fault("wait-held 3"), "ok");
    // The server is up: a request that needs no device IO is answered.
    let mut other = Mc::connect(s.mc);
    other.send(b"version\r\n");
    assert!(other.line().starts_with("VERSION"));
    s.fault("release");
    assert_eq!(held_get.join().unwrap().unwrap(), Some(want_mc));
    assert_eq!(held_put.join().unwrap().unwrap(), Some(want_nv));
    assert_eq!(held_resp.join().unwrap(), Reply::Bulk(Some(want_rs)));

    // Slow device: answers come, late.
    s.fault("delay-ms 20");
    assert_eq!(other.get("mc-3").unwrap().as_ref(), Some(&m.mc["mc-3"]));
    assert_eq!(other.set("written-slowly", b"slow"), "STORED");
    s.fault("delay-ms 0");
    m.mc.insert("written-slowly".into(), b"slow".to_vec());
    m.native.insert("written-while-hung".into(), b"late".to_vec());
    verify(&s, &m);
    let st = s.signal(15);
    assert!(st.success(), "SIGTERM: {st}");
    let s = Serve::start(&data, dir.path(), false);
    verify(&s, &m);
    let st = s.signal(15);
    assert!(st.success(), "SIGTERM: {st}");
}
