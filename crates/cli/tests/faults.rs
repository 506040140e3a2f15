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
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
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
        Serve::start_with(data, dir, faults, &[])
    }

    /// `start`, with `extra` arguments for `granary serve`.
    fn start_with(data: &Path, dir: &Path, faults: bool, extra: &[&str]) -> Serve {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            match Serve::try_start(data, dir, faults, extra) {
                Ok(s) => return s,
                Err(log) if log.contains("in use by another process") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(log) => panic!("granary serve did not start:\n{log}"),
            }
        }
    }

    fn try_start(data: &Path, dir: &Path, faults: bool, extra: &[&str]) -> Result<Serve, String> {
        let (mc, resp, native, nbd, metrics) = (port(), port(), port(), port(), port());
        let control = dir.join("fault.sock");
        let mut cmd = common::granary(&[]);
        // `-m 0`: no DRAM tier, so every GET reads the device and meets
        // the faults this test injects (a tier would serve hot keys).
        cmd.args(["serve", "--data", data.to_str().unwrap(), "-t", "2", "--max-item-size", "65536", "-m", "0"])
            .args(["-p", &mc.to_string(), "--resp-port", &resp.to_string()])
            .args(["--native-port", &native.to_string(), "--nbd-port", &nbd.to_string()])
            .args(["--metrics", &format!("127.0.0.1:{metrics}")])
            .args(extra)
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
        fault_at(&self.control, cmd)
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The log once it holds `text` (its stderr is read by another thread,
    /// which may lag behind the server); waits at most `IO_LIMIT`.
    fn log_with(&self, text: &str) -> String {
        common::wait_until(IO_LIMIT, || self.log().contains(text));
        self.log()
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

/// One command to the control socket at `control`; panics unless the
/// reply is "ok...".
fn fault_at(control: &Path, cmd: &str) -> String {
    common::fault_at(control, cmd, IO_LIMIT)
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
    /// A storage command `head` (its line, without the end) with the data
    /// block `v`: its reply line.
    fn store(&mut self, head: String, v: &[u8]) -> String {
        let mut req = format!("{head}\r\n").into_bytes();
        req.extend_from_slice(v);
        req.extend_from_slice(b"\r\n");
        self.send(&req);
        self.line()
    }
    /// Send the retrieval command `req`: the value, None when its reply
    /// line is `miss`, Err(line) when the line does not start with
    /// `found` (followed by the value's size).
    fn fetch(&mut self, req: String, miss: &str, found: &str) -> Result<Option<Vec<u8>>, String> {
        self.send(req.as_bytes());
        self.fetch_reply(miss, found)
    }
    /// [`Mc::fetch`]'s reading of the reply.
    fn fetch_reply(&mut self, miss: &str, found: &str) -> Result<Option<Vec<u8>>, String> {
        let l = self.line();
        if l == miss {
            return Ok(None);
        }
        let Some(n) = l.strip_prefix(found) else { return Err(l) };
        let mut v = vec![0; n.parse::<usize>().unwrap() + 2];
        self.r.read_exact(&mut v).unwrap();
        v.truncate(v.len() - 2);
        Ok(Some(v))
    }
    /// `set`'s reply line.
    fn set(&mut self, k: &str, v: &[u8]) -> String {
        self.store(format!("set {k} 0 0 {}", v.len()), v)
    }
    /// The value, None on a miss, Err(line) on an error reply.
    fn get(&mut self, k: &str) -> Result<Option<Vec<u8>>, String> {
        self.send(format!("get {k}\r\n").as_bytes());
        self.get_reply(k)
    }
    /// The reply to a `get` of `k` already sent.
    fn get_reply(&mut self, k: &str) -> Result<Option<Vec<u8>>, String> {
        let v = self.fetch_reply("END", &format!("VALUE {k} 0 "))?;
        if v.is_some() {
            assert_eq!(self.line(), "END");
        }
        Ok(v)
    }
    /// A meta `ms` (base64 off, no flags but the size): its reply line.
    fn ms(&mut self, k: &str, v: &[u8]) -> String {
        self.store(format!("ms {k} {}", v.len()), v)
    }
    /// A meta `mg k v`: the value, None on a miss (`EN`), Err(line) on an
    /// error reply.
    fn mg(&mut self, k: &str) -> Result<Option<Vec<u8>>, String> {
        self.fetch(format!("mg {k} v\r\n"), "EN", "VA ")
    }
    /// A meta `md`: its reply line.
    fn md(&mut self, k: &str) -> String {
        self.send(format!("md {k}\r\n").as_bytes());
        self.line()
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

/// The memcache binary protocol over one connection (memcached's
/// protocol_binary.h: 24-byte headers, magic 0x80 / 0x81).
struct Bin {
    s: TcpStream,
    opaque: u32,
}

/// Binary opcodes used here.
const BIN_GET: u8 = 0x00;
const BIN_SET: u8 = 0x01;
const BIN_DELETE: u8 = 0x04;
const BIN_NOOP: u8 = 0x0a;
const BIN_GETK: u8 = 0x0c;
/// Binary statuses: success, not found, memcached's internal error (the
/// store failed: device trouble or a read-only store).
const BIN_OK: u16 = 0x0000;
const BIN_KEY_ENOENT: u16 = 0x0001;
const BIN_EINTERNAL: u16 = 0x0084;

impl Bin {
    fn connect(port: u16) -> Bin {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(IO_LIMIT)).unwrap();
        Bin { s, opaque: 0 }
    }
    /// One request; the response's status and value (extras skipped).
    fn call(&mut self, op: u8, extras: &[u8], key: &[u8], value: &[u8]) -> (u16, Vec<u8>) {
        self.opaque += 1;
        self.s.write_all(&Bin::request(op, extras, key, value, self.opaque)).unwrap();
        let (status, opaque, _key, value) = self.response(op);
        assert_eq!(opaque, self.opaque);
        (status, value)
    }
    /// A request's bytes.
    fn request(op: u8, extras: &[u8], key: &[u8], value: &[u8], opaque: u32) -> Vec<u8> {
        let mut b = vec![0x80, op];
        b.extend_from_slice(&(key.len() as u16).to_be_bytes());
        b.push(extras.len() as u8);
        b.extend_from_slice(&[0, 0, 0]);
        b.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
        b.extend_from_slice(&opaque.to_be_bytes());
        b.extend_from_slice(&0u64.to_be_bytes());
        b.extend_from_slice(extras);
        b.extend_from_slice(key);
        b.extend_from_slice(value);
        b
    }
    /// The next response, to opcode `op`: its status, opaque, key and value.
    fn response(&mut self, op: u8) -> (u16, u32, Vec<u8>, Vec<u8>) {
        let mut h = [0u8; 24];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!((h[0], h[1]), (0x81, op), "binary response header {h:?}");
        let status = u16::from_be_bytes([h[6], h[7]]);
        let opaque = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let (key_len, extras_len) = (u16::from_be_bytes([h[2], h[3]]) as usize, h[4] as usize);
        let mut body = vec![0; u32::from_be_bytes(h[8..12].try_into().unwrap()) as usize];
        self.s.read_exact(&mut body).unwrap();
        let value = body.split_off(extras_len + key_len);
        (status, opaque, body.split_off(extras_len), value)
    }
    /// The value, None on a miss, Err((status, text)) on another status.
    fn get(&mut self, k: &str) -> Result<Option<Vec<u8>>, (u16, String)> {
        match self.call(BIN_GET, &[], k.as_bytes(), &[]) {
            (BIN_OK, v) => Ok(Some(v)),
            (BIN_KEY_ENOENT, _) => Ok(None),
            (st, text) => Err((st, String::from_utf8_lossy(&text).into_owned())),
        }
    }
    /// `set` (flags 0, no expiry): its status.
    fn set(&mut self, k: &str, v: &[u8]) -> u16 {
        self.call(BIN_SET, &[0; 8], k.as_bytes(), v).0
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
    Array(Vec<Reply>),
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
        self.reply()
    }
    fn reply(&mut self) -> Reply {
        let mut l = String::new();
        self.r.read_line(&mut l).unwrap();
        let l = l.trim_end();
        let (t, rest) = l.split_at(1);
        match t {
            "*" => Reply::Array((0..rest.parse::<usize>().unwrap()).map(|_| self.reply()).collect()),
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
    /// Written with meta `ms`, read with `mg`.
    meta: BTreeMap<String, Vec<u8>>,
    /// Written and read over the binary protocol.
    bin: BTreeMap<String, Vec<u8>>,
    resp: BTreeMap<String, Vec<u8>>,
    native: BTreeMap<String, Vec<u8>>,
    nbd: BTreeMap<u64, Vec<u8>>,
}

/// Write `n` keys per protocol (and `n` NBD blocks) with seeded values.
fn fill(s: &Serve, rng: &mut Rng, n: usize, m: &mut Model) {
    fill_tagged(s, rng, "", 0, n, m)
}

/// Write `n` keys per protocol named with `tag`, and NBD blocks `first..first + n`.
fn fill_tagged(s: &Serve, rng: &mut Rng, tag: &str, first: u64, n: usize, m: &mut Model) {
    let mut mc = Mc::connect(s.mc);
    let mut bin = Bin::connect(s.mc);
    let mut resp = Resp::connect(s.resp);
    let native = s.native();
    let mut nbd = Nbd::connect(s.nbd, "blocks");
    for i in 0..n {
        let (k, v) = (format!("{tag}mc-{i}"), rng.value(3000));
        assert_eq!(mc.set(&k, &v), "STORED");
        m.mc.insert(k, v);
        let (k, v) = (format!("{tag}meta-{i}"), rng.value(3000));
        assert_eq!(mc.ms(&k, &v), "HD");
        m.meta.insert(k, v);
        let (k, v) = (format!("{tag}bin-{i}"), rng.value(3000));
        assert_eq!(bin.set(&k, &v), BIN_OK);
        m.bin.insert(k, v);
        let (k, v) = (format!("{tag}rs-{i}"), rng.value(3000));
        assert_eq!(resp.call(&[b"SET", k.as_bytes(), &v]), Reply::Simple("OK".into()));
        m.resp.insert(k, v);
        let (k, v) = (format!("{tag}nv-{i}"), rng.value(3000));
        native.put(k.as_bytes(), &v).unwrap();
        m.native.insert(k, v);
        let (block, b) = (first + i as u64, nbd_block(&format!("block-{tag}{i}"), rng));
        nbd.write(block, &b).unwrap();
        m.nbd.insert(block, b);
    }
}

/// Every acknowledged write reads back, on its own protocol, over new
/// connections.
fn verify(s: &Serve, m: &Model) {
    Conns::new(s).check(m);
}

/// Stop `s` cleanly (SIGTERM), then serve `data` again on a healthy
/// device: every acknowledged write reads back ([`verify`]), and that
/// server stops cleanly too.
fn restart_and_verify(s: Serve, data: &Path, dir: &Path, m: &Model) {
    let st = s.signal(15);
    assert!(st.success(), "SIGTERM: {st}");
    let s = Serve::start(data, dir, false);
    verify(&s, m);
    let st = s.signal(15);
    assert!(st.success(), "SIGTERM: {st}");
}

/// One connection per protocol.
struct Conns {
    mc: Mc,
    bin: Bin,
    resp: Resp,
    native: granary_client::Client,
    nbd: Nbd,
}

impl Conns {
    fn new(s: &Serve) -> Conns {
        Conns {
            mc: Mc::connect(s.mc),
            bin: Bin::connect(s.mc),
            resp: Resp::connect(s.resp),
            native: s.native(),
            nbd: Nbd::connect(s.nbd, "blocks"),
        }
    }
    /// Every acknowledged write reads back over these connections.
    fn check(&mut self, m: &Model) {
        check(&mut self.mc, &mut self.resp, &self.native, &mut self.nbd, m);
        self.check_meta_bin(m);
    }
    /// The meta and binary keys read back (meta over the text connection).
    fn check_meta_bin(&mut self, m: &Model) {
        for (k, v) in &m.meta {
            assert_eq!(self.mc.mg(k).unwrap().as_ref(), Some(v), "meta {k}");
        }
        for (k, v) in &m.bin {
            assert_eq!(self.bin.get(k).unwrap().as_ref(), Some(v), "binary {k}");
        }
    }
}

/// The text, RESP, native and NBD writes read back over these connections.
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

/// `msg` is a memcache text or meta protocol's server error saying `what`.
fn assert_server_error(msg: &str, what: &str) {
    assert!(msg.starts_with("SERVER_ERROR") && msg.contains(what), "expected SERVER_ERROR ... {what} ...: {msg:?}");
}

/// `r` is a RESP error saying `what`.
fn assert_resp_error(r: Reply, what: &str) {
    match r {
        Reply::Error(e) => assert!(e.starts_with("ERR") && e.contains(what), "expected -ERR ... {what} ...: {e:?}"),
        r => panic!("expected a RESP error ({what}), got {r:?}"),
    }
}

#[test]
fn a_read_error_fails_that_request_and_the_connection_goes_on() {
    let (Fixture { seed: _seed, mut rng, dir, data, mut m }, s) = start_filled(8);
    // The records of these keys (and the NBD block tagged so) are the bad
    // sectors: only reads that meet them fail.
    let mut c = Conns::new(&s);
    let victim = b"lost-for-now".to_vec();
    assert_eq!(c.mc.set("victim-mc", &victim), "STORED");
    assert_eq!(c.mc.ms("victim-meta", &victim), "HD");
    assert_eq!(c.bin.set("victim-bin", &victim), BIN_OK);
    assert_eq!(c.resp.call(&[b"SET", b"victim-rs", &victim]), Reply::Simple("OK".into()));
    c.native.put(b"victim-nv", &victim).unwrap();
    let bad = nbd_block("victim-nbd", &mut rng);
    c.nbd.write(100, &bad).unwrap();
    s.fault("read-eio match victim-");

    assert_server_error(&c.mc.get("victim-mc").unwrap_err(), "read failed");
    assert_server_error(&c.mc.mg("victim-meta").unwrap_err(), "read failed");
    assert_eq!(c.bin.get("victim-bin").unwrap_err(), (BIN_EINTERNAL, "Internal error".to_string()));
    assert_resp_error(c.resp.call(&[b"GET", b"victim-rs"]), "read failed");
    assert_eq!(server_status(c.native.get(b"victim-nv").unwrap_err()), granary_client::Status::IoError);
    assert_eq!(c.nbd.read(100), Err(EIO));
    // The same connections read every other key.
    c.check(&m);
    // A read error does not make the store read-only.
    assert_eq!(c.mc.stat("granary_read_only"), "0");
    assert_eq!(c.mc.set("after-read-error", b"x"), "STORED");
    m.mc.insert("after-read-error".into(), b"x".to_vec());
    assert!(s.fault("status").contains("failed_writes=0"));

    // The sectors answer again: the records were never damaged.
    s.fault("read-eio off");
    assert_eq!(c.mc.get("victim-mc").unwrap().as_ref(), Some(&victim));
    m.mc.insert("victim-mc".into(), victim.clone());
    assert_eq!(c.mc.mg("victim-meta").unwrap().as_ref(), Some(&victim));
    m.meta.insert("victim-meta".into(), victim.clone());
    assert_eq!(c.bin.get("victim-bin").unwrap().as_ref(), Some(&victim));
    m.bin.insert("victim-bin".into(), victim.clone());
    assert_eq!(c.resp.call(&[b"GET", b"victim-rs"]), Reply::Bulk(Some(victim.clone())));
    m.resp.insert("victim-rs".into(), victim.clone());
    assert_eq!(c.native.get(b"victim-nv").unwrap().as_ref(), Some(&victim));
    m.native.insert("victim-nv".into(), victim.clone());
    assert!(c.nbd.read(100).unwrap() == bad);
    m.nbd.insert(100, bad);
    // Every read fails: the server answers each with an error and stays up.
    s.fault("read-eio all");
    assert!(c.mc.get("mc-0").unwrap_err().starts_with("SERVER_ERROR"));
    assert!(c.mc.mg("meta-0").unwrap_err().starts_with("SERVER_ERROR"));
    assert_eq!(c.bin.get("bin-0").unwrap_err().0, BIN_EINTERNAL);
    assert!(matches!(c.resp.call(&[b"GET", b"rs-0"]), Reply::Error(_)));
    assert_eq!(server_status(c.native.get(b"nv-0").unwrap_err()), granary_client::Status::IoError);
    assert_eq!(c.nbd.read(0), Err(EIO));
    s.fault("read-eio off");
    c.check(&m);
    drop(c);
    verify(&s, &m);
    restart_and_verify(s, &data, dir.path(), &m);
}

/// Every protocol's writes are refused by a read-only store, each with its
/// protocol's error, and the connections go on.
fn refuses_writes(c: &mut Conns, rng: &mut Rng) {
    assert_server_error(&c.mc.set("refused-mc", b"never"), "refuses writes");
    assert_server_error(&c.mc.ms("refused-meta", b"never"), "refuses writes");
    assert_server_error(&c.mc.md("meta-0"), "refuses writes");
    assert_eq!(c.bin.set("refused-bin", b"never"), BIN_EINTERNAL);
    assert_eq!(c.bin.call(BIN_DELETE, &[], b"bin-0", &[]), (BIN_EINTERNAL, b"Internal error".to_vec()));
    assert_resp_error(c.resp.call(&[b"SET", b"refused-rs", b"never"]), "refuses writes");
    assert!(matches!(c.resp.call(&[b"DEL", b"rs-0"]), Reply::Error(_)));
    assert_eq!(server_status(c.native.put(b"refused-nv", b"never").unwrap_err()), granary_client::Status::ReadOnly);
    assert_eq!(c.nbd.write(0, &nbd_block("refused-nbd", rng)), Err(EIO));
    // The refused writes left nothing.
    assert_eq!(c.mc.get("refused-mc").unwrap(), None);
    assert_eq!(c.mc.mg("refused-meta").unwrap(), None);
    assert_eq!(c.bin.get("refused-bin").unwrap(), None);
    assert_eq!(c.resp.call(&[b"GET", b"refused-rs"]), Reply::Bulk(None));
    assert_eq!(c.native.get(b"refused-nv").unwrap(), None);
}

#[test]
fn a_write_error_makes_the_store_read_only_and_a_restart_recovers_every_acknowledged_write() {
    let (Fixture { seed: _seed, mut rng, dir, data, m }, s) = start_filled(12);
    let mut c = Conns::new(&s);
    assert_eq!(c.mc.stat("granary_read_only"), "0");

    s.fault("write-eio on");
    // The first write meets the failure; every later one is refused by
    // the read-only store, the device's trouble over or not.
    let e = c.mc.set("refused-mc", b"never");
    assert!(e.starts_with("SERVER_ERROR"), "{e}");
    s.fault("write-eio off");
    refuses_writes(&mut c, &mut rng);
    // Reads are served, on the same connections.
    c.check(&m);
    // The state is visible: memcache stats, native stats, /metrics; and
    // logged once.
    assert_eq!(c.mc.stat("granary_read_only"), "1");
    let ro = c.native.stats().unwrap().into_iter().find(|(k, _)| k == "read_only").map(|(_, v)| v);
    assert_eq!(ro.as_deref(), Some("1"));
    match c.resp.call(&[b"INFO", b"stats"]) {
        Reply::Bulk(Some(info)) => {
            let info = String::from_utf8(info).unwrap();
            assert!(info.contains("granary_read_only:1\r\n"), "{info}");
        }
        r => panic!("INFO: {r:?}"),
    }
    let metrics = s.metrics();
    assert!(metrics.lines().any(|l| l == "granary_store_read_only 1"), "{metrics}");
    let log = s.log_with("the store is read-only until reopened");
    assert_eq!(log.matches("the store is read-only until reopened").count(), 1, "{log}");
    drop(c);

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

/// Which protocol's write meets the failing device first.
#[derive(Clone, Copy, Debug)]
enum Writer {
    Text,
    Meta,
    Binary,
    Resp,
    Native,
    Nbd,
}

/// One round on the store of `fx`: serve it (with `extra` arguments and
/// faults injectable), check that everything acknowledged so far reads
/// back, write more on every protocol, then fail the device's writes and
/// let `first` meet the failure with its protocol's error. The store is
/// then read-only on every protocol and serves every read; the server is
/// stopped with `sig` (SIGTERM: its checkpoint fails; SIGKILL).
fn write_error_round(fx: &mut Fixture, round: u64, first: Writer, extra: &[&str], sig: i32) {
    let s = Serve::start_with(&fx.data, fx.dir.path(), true, extra);
    verify(&s, &fx.m);
    fill_tagged(&s, &mut fx.rng, &format!("r{round}-"), 20 + 4 * round, 3, &mut fx.m);
    let mut c = Conns::new(&s);
    s.fault("write-eio on");
    // A background write (GC, a checkpoint) may meet the failure first:
    // then this request is refused by the read-only store, with the same
    // error form.
    let what = format!("round {round}: {first:?} write on {extra:?}");
    let either = |e: &str| e.contains("write failed") || e.contains("refuses writes");
    match first {
        Writer::Text => {
            let e = c.mc.set("refused", b"never");
            assert!(e.starts_with("SERVER_ERROR") && either(&e), "{what}: {e}");
        }
        Writer::Meta => {
            let e = c.mc.ms("refused", b"never");
            assert!(e.starts_with("SERVER_ERROR") && either(&e), "{what}: {e}");
        }
        Writer::Binary => {
            assert_eq!(c.bin.call(BIN_SET, &[0; 8], b"refused", b"never"), (BIN_EINTERNAL, b"Internal error".to_vec()))
        }
        Writer::Resp => match c.resp.call(&[b"SET", b"refused", b"never"]) {
            Reply::Error(e) => assert!(e.starts_with("ERR") && either(&e), "{what}: {e}"),
            r => panic!("{what}: {r:?}"),
        },
        Writer::Native => {
            let st = server_status(c.native.put(b"refused", b"never").unwrap_err());
            assert!(matches!(st, granary_client::Status::IoError | granary_client::Status::ReadOnly), "{what}: {st:?}");
        }
        Writer::Nbd => assert_eq!(c.nbd.write(250, &nbd_block("refused", &mut fx.rng)), Err(EIO), "{what}"),
    }
    s.fault("write-eio off");
    assert!(!s.fault("status").contains("failed_writes=0"), "{what}");
    refuses_writes(&mut c, &mut fx.rng);
    c.check(&fx.m);
    assert_eq!(c.mc.get("refused").unwrap(), None, "{what}");
    assert_eq!(c.mc.stat("granary_read_only"), "1", "{what}");
    let log = s.log_with("the store is read-only until reopened");
    assert_eq!(log.matches("the store is read-only until reopened").count(), 1, "{what}: {log}");
    drop(c);
    let _ = s.signal(sig);
}

/// A store filled on every protocol by a server that is then stopped.
fn stopped_fixture(n: usize) -> Fixture {
    let (fx, s) = start_filled(n);
    let st = s.signal(15);
    assert!(st.success(), "SIGTERM: {st}");
    fx
}

/// After the rounds: a healthy device, every acknowledged write there.
fn healthy_restart(fx: &Fixture, extra: &[&str]) {
    let s = Serve::start_with(&fx.data, fx.dir.path(), false, extra);
    verify(&s, &fx.m);
    let mut mc = Mc::connect(s.mc);
    assert_eq!(mc.stat("granary_read_only"), "0");
    assert_eq!(mc.get("refused").unwrap(), None);
    assert_eq!(mc.ms("after-restart", b"ok"), "HD");
    let st = s.signal(15);
    assert!(st.success(), "SIGTERM: {st}");
}

#[test]
fn a_write_error_met_by_each_protocol_makes_the_store_read_only_and_loses_nothing() {
    let mut fx = stopped_fixture(4);
    let firsts = [Writer::Meta, Writer::Binary, Writer::Resp, Writer::Native, Writer::Nbd];
    for (round, first) in firsts.into_iter().enumerate() {
        write_error_round(&mut fx, round as u64, first, &[], if round % 2 == 0 { 9 } else { 15 });
    }
    healthy_restart(&fx, &[]);
}

#[test]
fn the_sync_io_backend_turns_read_only_on_a_write_error_too() {
    let mut fx = stopped_fixture(4);
    let sync = ["--io", "sync"];
    for (round, first) in [Writer::Text, Writer::Binary, Writer::Nbd].into_iter().enumerate() {
        write_error_round(&mut fx, round as u64, first, &sync, if round % 2 == 0 { 15 } else { 9 });
    }
    healthy_restart(&fx, &sync);
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
    m.native.insert("written-while-hung".into(), b"late".to_vec());
    verify(&s, &m);
    restart_and_verify(s, &data, dir.path(), &m);
}

/// A multi-key read keeps its keys' reads in flight together: with the
/// device hung, one text `get` (then `gets`), 21 binary `getk`s and 21
/// text `get`s of one key pipelined in one write, one RESP MGET and one native multi-get of 20
/// keys and a missing 18th each hold 16 reads at once (the protocols'
/// MULTI_GET_READS; read one by one, they would hold one), and once
/// released each answers every key in its order.
#[test]
fn a_multi_get_holds_its_reads_in_flight_together_and_answers_in_key_order() {
    let (Fixture { seed: _seed, m, dir: _dir, .. }, s) = start_filled(20);
    let keys = |prefix: &str| {
        let mut k: Vec<String> = (0..20).map(|i| format!("{prefix}-{i}")).collect();
        // Past the first 16: a key with no index entry needs no read.
        k.insert(17, format!("{prefix}-absent"));
        k
    };
    let held = |what: &str, run: Box<dyn FnOnce() + Send>| {
        s.fault("hang");
        let t = std::thread::spawn(run);
        assert_eq!(s.fault("wait-held 16"), "ok", "{what}: 16 reads in flight together");
        s.fault("release");
        t.join().unwrap_or_else(|_| panic!("{what}: the reply was wrong (above)"));
    };
    for cmd in ["get", "gets"] {
        let (ks, port) = (keys("mc"), s.mc);
        let want: Vec<(String, Vec<u8>)> =
            ks.iter().filter_map(|k| m.mc.get(k).map(|v| (k.clone(), v.clone()))).collect();
        held(
            cmd,
            Box::new(move || {
                let mut c = Mc::connect(port);
                c.send(format!("{cmd} {}\r\n", ks.join(" ")).as_bytes());
                let mut got = Vec::new();
                loop {
                    let l = c.line();
                    if l == "END" {
                        break;
                    }
                    let f: Vec<&str> = l.split(' ').collect();
                    assert!(f[0] == "VALUE" && f.len() == if cmd == "gets" { 5 } else { 4 }, "{cmd}: {l:?}");
                    let mut v = vec![0; f[3].parse::<usize>().unwrap() + 2];
                    c.r.read_exact(&mut v).unwrap();
                    v.truncate(v.len() - 2);
                    got.push((f[1].to_string(), v));
                }
                assert_eq!(got, want, "{cmd}: every value, in key order");
            }),
        );
    }
    // Binary getk requests of the binary keys, pipelined in one write.
    let (ks, port) = (keys("bin"), s.mc);
    let want: Vec<(u16, Vec<u8>, Vec<u8>)> = ks
        .iter()
        .map(|k| match m.bin.get(k) {
            Some(v) => (BIN_OK, k.as_bytes().to_vec(), v.clone()),
            None => (BIN_KEY_ENOENT, k.as_bytes().to_vec(), Vec::new()),
        })
        .collect();
    held(
        "pipelined binary getk",
        Box::new(move || {
            let mut c = Bin::connect(port);
            let reqs: Vec<u8> = ks
                .iter()
                .enumerate()
                .flat_map(|(i, k)| Bin::request(BIN_GETK, &[], k.as_bytes(), &[], i as u32))
                .collect();
            c.s.write_all(&reqs).unwrap();
            let got: Vec<(u16, Vec<u8>, Vec<u8>)> = (0..ks.len())
                .map(|i| {
                    let (status, opaque, key, value) = c.response(BIN_GETK);
                    assert_eq!(opaque, i as u32, "responses in request order");
                    (status, key, if status == BIN_OK { value } else { Vec::new() })
                })
                .collect();
            assert_eq!(got, want, "pipelined binary getk: every key, in request order");
        }),
    );
    // The same keys, one `get` each, pipelined in one write.
    let (ks, port) = (keys("mc"), s.mc);
    let want: Vec<Option<Vec<u8>>> = ks.iter().map(|k| m.mc.get(k).cloned()).collect();
    held(
        "pipelined gets",
        Box::new(move || {
            let mut c = Mc::connect(port);
            let req: String = ks.iter().map(|k| format!("get {k}\r\n")).collect();
            c.send(req.as_bytes());
            let got: Vec<Option<Vec<u8>>> = ks.iter().map(|k| c.get_reply(k).unwrap()).collect();
            assert_eq!(got, want, "pipelined gets: every value, in request order");
        }),
    );
    let (ks, port) = (keys("rs"), s.resp);
    let want = Reply::Array(ks.iter().map(|k| Reply::Bulk(m.resp.get(k).cloned())).collect());
    held(
        "MGET",
        Box::new(move || {
            let mut args: Vec<&[u8]> = vec![b"MGET"];
            args.extend(ks.iter().map(|k| k.as_bytes()));
            assert_eq!(Resp::connect(port).call(&args), want, "MGET: every value, in key order");
        }),
    );
    let (ks, native) = (keys("nv"), s.native());
    let want: Vec<Option<Vec<u8>>> = ks.iter().map(|k| m.native.get(k).cloned()).collect();
    held(
        "native multi-get",
        Box::new(move || {
            let ks: Vec<&[u8]> = ks.iter().map(|k| k.as_bytes()).collect();
            assert_eq!(native.mget(&ks).unwrap(), want, "native multi-get: every value, in key order");
        }),
    );
}

#[test]
fn nbd_requests_wait_for_a_device_that_stops_answering_while_other_requests_are_answered() {
    let (Fixture { seed: _seed, mut rng, dir, data, mut m }, s) = start_filled(4);
    // Connections made before the hang: the held requests, and the ones
    // that must still be answered.
    let mut reader = Nbd::connect(s.nbd, "blocks");
    let mut writer = Nbd::connect(s.nbd, "blocks");
    let mut meta = Mc::connect(s.mc);
    let mut c = Conns::new(&s);
    let late = nbd_block("written-while-hung", &mut rng);

    s.fault("hang");
    let held_read = std::thread::spawn(move || reader.read(1));
    let block = late.clone();
    let held_write = std::thread::spawn(move || writer.write(200, &block));
    let held_meta = std::thread::spawn(move || meta.mg("meta-2"));
    assert_eq!(s.fault("wait-held 3"), "ok");
    // Requests that need no device IO are answered on every protocol, and
    // a new NBD client completes its handshake.
    c.mc.send(b"version\r\n");
    assert!(c.mc.line().starts_with("VERSION"));
    assert_eq!(c.bin.call(BIN_NOOP, &[], &[], &[]).0, BIN_OK);
    assert_eq!(c.resp.call(&[b"PING"]), Reply::Simple("PONG".into()));
    c.native.ping().unwrap();
    drop(Nbd::connect(s.nbd, "blocks"));
    // Still held: nothing was answered from a device that does not answer.
    assert!(!held_read.is_finished() && !held_write.is_finished() && !held_meta.is_finished());

    s.fault("release");
    assert!(held_read.join().unwrap().unwrap() == m.nbd[&1]);
    assert_eq!(held_write.join().unwrap(), Ok(()));
    m.nbd.insert(200, late);
    assert_eq!(held_meta.join().unwrap().unwrap().as_ref(), Some(&m.meta["meta-2"]));
    // The connections go on.
    c.check(&m);
    drop(c);
    restart_and_verify(s, &data, dir.path(), &m);
}

#[test]
fn injected_latency_slows_requests_but_never_fails_them() {
    let (Fixture { seed: _seed, mut rng, dir, data, mut m }, s) = start_filled(2);
    // Spikes: a delay from the start, then a thread sets a new one (none,
    // or 1 to 50 ms per device operation) every few milliseconds until
    // told to stop (bounded).
    s.fault("delay-ms 5");
    let stop = Arc::new(AtomicBool::new(false));
    let (control, stop2, spike_seed) = (s.control.clone(), stop.clone(), rng.next());
    let spiker = std::thread::spawn(move || {
        let mut rng = Rng(spike_seed);
        let mut spikes = 0;
        while !stop2.load(SeqCst) && spikes < 10_000 {
            let ms = [0, 0, 1, 5, 20, 50][(rng.next() % 6) as usize];
            fault_at(&control, &format!("delay-ms {ms}"));
            // Pacing only: how long each delay setting lasts.
            std::thread::sleep(Duration::from_millis(10));
            spikes += 1;
        }
        spikes
    });
    // Writes and reads on every protocol all succeed (fill and check
    // assert every reply), only later.
    fill_tagged(&s, &mut rng, "slow-", 40, 12, &mut m);
    verify(&s, &m);
    stop.store(true, SeqCst);
    eprintln!("{} delay spikes set during the fill", spiker.join().unwrap());
    s.fault("delay-ms 0");
    assert!(s.fault("status").contains("failed_reads=0 failed_writes=0"));
    assert_eq!(Mc::connect(s.mc).stat("granary_read_only"), "0");
    restart_and_verify(s, &data, dir.path(), &m);
}
