//! Structured protocol fuzzing of a running `granary serve`: on every port
//! (memcache text and binary, native, RESP, NBD), seeded random sessions
//! of valid requests, truncated ones, huge lengths, corrupted ones and
//! random bytes. After each session:
//!
//! - the session's connection either went on answering or was closed by
//!   the server: once the client half-closes, the server closes too within
//!   a bound (a connection that neither answers nor closes fails);
//! - the server survives: a fresh connection still answers, and a model
//!   check of valid writes and reads (on keys, and an export, the fuzzing
//!   never touches; each protocol's keys of its own, as they share the
//!   default namespace) gives the values the model holds;
//! - its resident memory stays below a generous bound.
//!
//! The seed is printed (`GRANARY_PROTO_FUZZ_SEED` replays it); the run is
//! bounded by a session count and a time per port
//! (`GRANARY_PROTO_FUZZ_SESSIONS`, `GRANARY_PROTO_FUZZ_SECS` to run longer).

use granary_memcache::fuzzing::binary_request;
use granary_nbd::proto as nbd;
use granary_proto::{self as proto, BatchOp, ClientHello, PutMode, Request, Status};
use rand::{Rng, RngCore, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

/// How long a session's connection may go without a byte or a close after
/// the client half-closed it.
const CLOSE_LIMIT: Duration = Duration::from_secs(20);
/// Resident memory the server may reach (its store is 64 MiB).
const RSS_LIMIT_KIB: u64 = 1 << 20;
/// Bytes one session sends at most.
const SESSION_BYTES_MAX: usize = 512 << 10;
/// Size of each NBD export.
const EXPORT_BYTES: usize = 1 << 20;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Server {
    child: Child,
    memcache: u16,
    native: u16,
    resp: u16,
    nbd: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn granary(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_granary")).args(args).env_remove("GRANARY_LOG").output().unwrap();
    assert!(out.status.success(), "granary {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl Server {
    /// A 64 MiB store with the exports "fuzz" and "model", served on every
    /// protocol.
    fn start(data: &Path) -> Server {
        let p = data.to_str().unwrap();
        granary(&["create", p, "--size", "64M"]);
        for name in ["fuzz", "model"] {
            granary(&["export", "create", p, name, "--size", "1M", "--block-size", "4096"]);
        }
        let port = || granary_rt::net::free_low_port().unwrap();
        let (memcache, native, resp, nbd) = (port(), port(), port(), port());
        let ports = [memcache, native, resp, nbd].map(|p| p.to_string());
        let mut cmd = common::granary(&["serve", "--data", p, "-t", "2", "-p", &ports[0], "--native-port", &ports[1]]);
        cmd.args(["--resp-port", &ports[2], "--nbd-port", &ports[3], "--max-item-size", "512k"]).stdin(Stdio::null());
        // The native listener starts last.
        let ready = |line: &str| line.contains("serving the native protocol");
        let child = common::start_or_panic(&mut cmd, ready, common::START_LIMIT).child;
        Server { child, memcache, native, resp, nbd }
    }

    fn alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("granary serve died: {status}");
        }
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// How a session's connection ended.
#[derive(Debug)]
enum End {
    /// The server closed it (EOF or a reset), after replying these bytes.
    Closed(usize),
    /// Neither a byte nor a close within [`CLOSE_LIMIT`] after the client
    /// half-closed.
    Hung(usize),
}

/// Send `chunks` on a new connection to `port` while a thread drains the
/// replies, then half-close and wait for the server to close.
fn session(port: u16, chunks: &[Vec<u8>]) -> End {
    let s = connect(port);
    // A server that stops reading without closing fails the session (the
    // reader then sees no close either), rather than blocking the test.
    s.set_write_timeout(Some(CLOSE_LIMIT)).unwrap();
    let mut r = s.try_clone().unwrap();
    r.set_read_timeout(Some(CLOSE_LIMIT)).unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        let mut got = 0;
        loop {
            match r.read(&mut buf) {
                Ok(0) => return End::Closed(got),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return End::Hung(got)
                }
                // A reset: the server closed with input unread.
                Err(_) => return End::Closed(got),
            }
        }
    });
    let mut w = &s;
    for c in chunks {
        // A failed write: the server closed the connection (the reader
        // sees it too).
        if w.write_all(c).is_err() {
            break;
        }
    }
    let _ = s.shutdown(Shutdown::Write);
    reader.join().unwrap()
}

fn read_exact(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).unwrap();
    b
}

fn read_line(s: &mut TcpStream) -> Vec<u8> {
    let mut line = Vec::new();
    while !line.ends_with(b"\r\n") {
        line.push(read_exact(s, 1)[0]);
    }
    line
}

fn value(rng: &mut Pcg64Mcg, max: usize) -> Vec<u8> {
    let n = rng.random_range(0..=max);
    (0..n).map(|_| rng.random_range(b'!'..=b'~')).collect()
}

fn random_bytes(rng: &mut Pcg64Mcg) -> Vec<u8> {
    let mut b = vec![0u8; rng.random_range(1..512)];
    rng.fill_bytes(&mut b);
    b
}

/// A session's chunks: valid requests from `valid`, and with the
/// remaining odds a valid one truncated, one with a byte changed, random
/// bytes, or one of `hostile` (huge lengths and other abuse).
fn mix(
    rng: &mut Pcg64Mcg,
    valid: &dyn Fn(&mut Pcg64Mcg) -> Vec<u8>,
    hostile: &dyn Fn(&mut Pcg64Mcg) -> Vec<u8>,
) -> Vec<Vec<u8>> {
    let mut chunks = Vec::new();
    let mut total = 0;
    for _ in 0..rng.random_range(1..40) {
        let c = match rng.random_range(0..10) {
            0..=4 => valid(rng),
            5 => {
                let mut v = valid(rng);
                v.truncate(rng.random_range(0..=v.len()));
                v
            }
            6 => {
                let mut v = valid(rng);
                if !v.is_empty() {
                    let i = rng.random_range(0..v.len());
                    v[i] = rng.random();
                }
                v
            }
            7 => random_bytes(rng),
            _ => hostile(rng),
        };
        total += c.len();
        if total > SESSION_BYTES_MAX {
            break;
        }
        chunks.push(c);
    }
    chunks
}

// ---------------------------------------------------------------- memcache

const FUZZ_KEYS: u32 = 8;

fn memcache_valid(rng: &mut Pcg64Mcg) -> Vec<u8> {
    let k = format!("f{}", rng.random_range(0..FUZZ_KEYS));
    let v = value(rng, 64);
    let line = match rng.random_range(0..12) {
        0 => format!("set {k} {} {} {}\r\n", rng.random::<u16>(), rng.random_range(0..100), v.len()),
        1 => format!("get {k} f{}\r\n", rng.random_range(0..FUZZ_KEYS)),
        2 => format!("gets {k}\r\n"),
        3 => format!("delete {k}\r\n"),
        4 => format!("incr {k} {}\r\n", rng.random::<u32>()),
        5 => format!("touch {k} {}\r\n", rng.random_range(0..100)),
        6 => format!("ms {k} {} T{} F{}\r\n", v.len(), rng.random_range(0..100), rng.random::<u16>()),
        7 => format!("mg {k} v f t c k\r\n"),
        8 => format!("ma {k} N0 J{} D{}\r\n", rng.random::<u8>(), rng.random::<u8>()),
        9 => format!("md {k} q\r\nmn\r\n"),
        10 => format!("append {k} 0 0 {}\r\n", v.len()),
        _ => ["version\r\n", "stats\r\n", "verbosity 1\r\n", "mn\r\n"][rng.random_range(0..4)].to_string(),
    };
    let mut b = line.into_bytes();
    if b.starts_with(b"set") || b.starts_with(b"ms") || b.starts_with(b"append") {
        b.extend_from_slice(&v);
        b.extend_from_slice(b"\r\n");
    }
    b
}

fn memcache_hostile(rng: &mut Pcg64Mcg) -> Vec<u8> {
    match rng.random_range(0..6) {
        0 => format!("set f1 0 0 {}\r\nabc", [2_147_483_645u64, 4_294_967_295, 1 << 30][rng.random_range(0..3)]).into(),
        1 => format!("set {} 0 0 1\r\nx\r\n", "k".repeat(rng.random_range(240..300))).into(),
        2 => vec![b'a'; rng.random_range(60_000..70_000)],
        3 => format!("get {}\r\n", "f1 ".repeat(rng.random_range(100..3000))).into(),
        4 => format!("ms f1 {} b\r\n", rng.random::<u32>()).into(),
        _ => b"\r\n\r\n\0\0\0\xff\xfe\r\n".to_vec(),
    }
}

fn binary_valid(rng: &mut Pcg64Mcg) -> Vec<u8> {
    let k = format!("f{}", rng.random_range(0..FUZZ_KEYS)).into_bytes();
    let v = value(rng, 64);
    match rng.random_range(0..7) {
        0 => binary_request(0x01, &[0, 0, 0, 1, 0, 0, 0, 0], &k, &v),
        1 => binary_request(0x00, &[], &k, &[]),
        2 => binary_request(0x04, &[], &k, &[]),
        3 => binary_request(0x05, &[0; 20], &k, &[]),
        4 => binary_request(0x0e, &[], &k, &v),
        5 => binary_request(0x1c, &[0, 0, 0, 5], &k, &[]),
        _ => binary_request([0x0a, 0x0b, 0x09][rng.random_range(0..3)], &[], &[], &[]),
    }
}

fn binary_hostile(rng: &mut Pcg64Mcg) -> Vec<u8> {
    let mut h = binary_request(rng.random(), &[], b"f1", &[]);
    match rng.random_range(0..4) {
        // A huge body length.
        0 => h[8..12].copy_from_slice(&rng.random_range(1u32 << 20..u32::MAX).to_be_bytes()),
        // Extras and key longer than the body.
        1 => h[4] = 255,
        // A set of a value over the item size limit, then a little of it.
        2 => {
            h = binary_request(0x01, &[0; 8], b"f1", &[]);
            h[8..12].copy_from_slice(&((8 + 2 + (2 << 20)) as u32).to_be_bytes());
            h.extend_from_slice(&[7; 100]);
        }
        _ => h[0] = rng.random(),
    }
    h
}

/// Set and read back keys only this check writes, over the text protocol.
fn memcache_model(port: u16, rng: &mut Pcg64Mcg, model: &mut HashMap<String, Vec<u8>>) {
    let mut s = connect(port);
    for _ in 0..4 {
        let k = format!("mc-model-{}", rng.random_range(0..16));
        if rng.random_bool(0.5) {
            let v = value(rng, 200);
            s.write_all(&[format!("set {k} 0 0 {}\r\n", v.len()).as_bytes(), &v, b"\r\n"].concat()).unwrap();
            assert_eq!(read_line(&mut s), b"STORED\r\n", "set {k}");
            model.insert(k.clone(), v);
        }
        s.write_all(format!("get {k}\r\n").as_bytes()).unwrap();
        let line = read_line(&mut s);
        match model.get(&k) {
            None => assert_eq!(line, b"END\r\n", "get {k}"),
            Some(v) => {
                assert_eq!(line, format!("VALUE {k} 0 {}\r\n", v.len()).into_bytes(), "get {k}");
                assert_eq!(&read_exact(&mut s, v.len() + 2)[..v.len()], &v[..], "get {k}");
                assert_eq!(read_line(&mut s), b"END\r\n");
            }
        }
    }
}

// ---------------------------------------------------------------- native

fn native_frame(req: &Request<'_>, ns: &[u8], id: u64) -> Vec<u8> {
    let mut b = Vec::new();
    req.encode_in(ns, id, &mut b);
    b
}

fn native_valid(rng: &mut Pcg64Mcg) -> Vec<u8> {
    let k = format!("f{}", rng.random_range(0..FUZZ_KEYS)).into_bytes();
    let k2 = format!("f{}", rng.random_range(0..FUZZ_KEYS)).into_bytes();
    let v = value(rng, 64);
    let id = rng.random();
    let req = match rng.random_range(0..8) {
        0 => Request::Put { key: &k, value: &v, mode: PutMode::Upsert },
        1 => Request::Get(&k),
        2 => Request::Delete(&k),
        3 => Request::MultiGet(vec![&k, &k2]),
        4 => Request::Batch(vec![
            BatchOp::Put { key: &k, value: &v, mode: PutMode::CreateOnly },
            BatchOp::Get(&k2),
            BatchOp::Delete(&k2),
        ]),
        5 => Request::Stats,
        6 => Request::NsList,
        _ => Request::Nop,
    };
    native_frame(&req, b"", id)
}

fn native_hostile(rng: &mut Pcg64Mcg) -> Vec<u8> {
    let mut b = native_frame(&Request::Get(b"f1"), b"", 1);
    match rng.random_range(0..4) {
        // A length over any limit.
        0 => b[0..4].copy_from_slice(&rng.random_range(1u32 << 24..u32::MAX).to_le_bytes()),
        // A PUT announcing 8 MiB, then a little of it.
        1 => {
            b = native_frame(&Request::Put { key: b"f1", value: &[], mode: PutMode::Upsert }, b"", 2);
            let len = u32::from_le_bytes(b[0..4].try_into().unwrap()) + (8 << 20);
            b[0..4].copy_from_slice(&len.to_le_bytes());
            b.extend_from_slice(&[1; 1000]);
        }
        // An unknown opcode, reserved bytes set.
        2 => {
            b[4] = rng.random();
            b[7] = rng.random();
        }
        // A PUT whose key length runs past the body.
        _ => {
            b = native_frame(&Request::Put { key: b"f1", value: b"v", mode: PutMode::Upsert }, b"", 3);
            b[16..20].copy_from_slice(&rng.random_range(3..u32::MAX).to_le_bytes());
        }
    }
    b
}

/// A session's chunks on the native port: a hello (now and then a bad
/// one), then the mix.
fn native_session(rng: &mut Pcg64Mcg) -> Vec<Vec<u8>> {
    let mut hello = ClientHello::default().encode().to_vec();
    if rng.random_range(0..8) == 0 {
        let i = rng.random_range(0..hello.len());
        hello[i] = rng.random();
    }
    let mut chunks = vec![hello];
    chunks.extend(mix(rng, &native_valid, &native_hostile));
    chunks
}

fn native_call(s: &mut TcpStream, req: &Request<'_>, id: u64) -> (Status, Vec<u8>) {
    s.write_all(&native_frame(req, b"", id)).unwrap();
    let h = read_exact(s, proto::HEADER_BYTES);
    let (h, status) = proto::Response::decode_header(&h, u32::MAX).unwrap();
    assert_eq!(h.id, id);
    (status, read_exact(s, h.len as usize))
}

fn native_model(port: u16, rng: &mut Pcg64Mcg, model: &mut HashMap<String, Vec<u8>>) {
    let mut s = connect(port);
    s.write_all(&ClientHello::default().encode()).unwrap();
    let hello = read_exact(&mut s, proto::SERVER_HELLO_BYTES);
    let hello = proto::ServerHello::decode(hello[..].try_into().unwrap()).unwrap();
    assert_eq!(hello.status, Status::Ok);
    for id in 0..4 {
        let k = format!("native-model-{}", rng.random_range(0..16));
        if rng.random_bool(0.5) {
            let v = value(rng, 200);
            let (st, _) =
                native_call(&mut s, &Request::Put { key: k.as_bytes(), value: &v, mode: PutMode::Upsert }, id);
            assert_eq!(st, Status::Ok, "put {k}");
            model.insert(k.clone(), v);
        }
        let (st, body) = native_call(&mut s, &Request::Get(k.as_bytes()), id + 100);
        match model.get(&k) {
            None => assert_eq!(st, Status::NotFound, "get {k}"),
            Some(v) => assert_eq!((st, &body), (Status::Ok, v), "get {k}"),
        }
    }
}

// ---------------------------------------------------------------- RESP

fn multibulk(args: &[&[u8]]) -> Vec<u8> {
    let mut b = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        b.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        b.extend_from_slice(a);
        b.extend_from_slice(b"\r\n");
    }
    b
}

fn resp_valid(rng: &mut Pcg64Mcg) -> Vec<u8> {
    let k = format!("f{}", rng.random_range(0..FUZZ_KEYS)).into_bytes();
    let v = value(rng, 64);
    let n = rng.random::<u16>().to_string().into_bytes();
    match rng.random_range(0..10) {
        0 => multibulk(&[b"SET", &k, &v]),
        1 => multibulk(&[b"GET", &k]),
        2 => multibulk(&[b"DEL", &k, b"f1"]),
        3 => multibulk(&[b"INCRBY", &k, &n]),
        4 => multibulk(&[b"MGET", &k, b"f2", b"f3"]),
        5 => multibulk(&[b"EXPIRE", &k, &n]),
        6 => multibulk(&[b"APPEND", &k, &v]),
        7 => multibulk(&[b"PING"]),
        8 => format!("SET {} \"a\\x41 b\"\r\n", String::from_utf8_lossy(&k)).into_bytes(),
        _ => multibulk(&[b"SELECT", b"1"]),
    }
}

fn resp_hostile(rng: &mut Pcg64Mcg) -> Vec<u8> {
    match rng.random_range(0..6) {
        0 => format!("*{}\r\n", rng.random_range(1u64 << 20..1 << 40)).into(),
        1 => b"*1\r\n$536870912\r\nabc".to_vec(),
        2 => b"*2\r\n$-5\r\n".to_vec(),
        3 => b"SET k \"unbalanced\r\n".to_vec(),
        4 => vec![b'x'; rng.random_range(60_000..70_000)],
        _ => format!("*3\r\n$3\r\nSET\r\n$2\r\nf1\r\n${}\r\n", 64 << 20).into(),
    }
}

fn resp_model(port: u16, rng: &mut Pcg64Mcg, model: &mut HashMap<String, Vec<u8>>) {
    let mut s = connect(port);
    for _ in 0..4 {
        let k = format!("resp-model-{}", rng.random_range(0..16));
        if rng.random_bool(0.5) {
            let v = value(rng, 200);
            s.write_all(&multibulk(&[b"SET", k.as_bytes(), &v])).unwrap();
            assert_eq!(read_line(&mut s), b"+OK\r\n", "SET {k}");
            model.insert(k.clone(), v);
        }
        s.write_all(&multibulk(&[b"GET", k.as_bytes()])).unwrap();
        let line = read_line(&mut s);
        match model.get(&k) {
            None => assert_eq!(line, b"$-1\r\n", "GET {k}"),
            Some(v) => {
                assert_eq!(line, format!("${}\r\n", v.len()).into_bytes(), "GET {k}");
                assert_eq!(&read_exact(&mut s, v.len() + 2)[..v.len()], &v[..], "GET {k}");
            }
        }
    }
}

// ---------------------------------------------------------------- NBD

fn nbd_option(opt: u32, data: &[u8]) -> Vec<u8> {
    let mut b = nbd::IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    [b, data.to_vec()].concat()
}

fn nbd_go(name: &str) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&0u16.to_be_bytes());
    nbd_option(nbd::OPT_GO, &d)
}

fn nbd_request(kind: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    nbd::Request { magic: nbd::REQUEST_MAGIC, flags, kind, cookie, offset, len }.encode().to_vec()
}

fn nbd_valid(rng: &mut Pcg64Mcg) -> Vec<u8> {
    let len = rng.random_range(1..9000u32);
    let offset = rng.random_range(0..(EXPORT_BYTES as u64 - len as u64));
    let cookie = rng.random();
    match rng.random_range(0..5) {
        0 => [nbd_request(nbd::CMD_WRITE, 0, cookie, offset, len), vec![rng.random::<u8>(); len as usize]].concat(),
        1 => nbd_request(nbd::CMD_READ, 0, cookie, offset, len),
        2 => nbd_request(nbd::CMD_TRIM, 0, cookie, offset, len),
        3 => nbd_request(nbd::CMD_WRITE_ZEROES, nbd::CMD_FLAG_FUA, cookie, offset, len),
        _ => nbd_request(nbd::CMD_FLUSH, 0, cookie, 0, 0),
    }
}

fn nbd_hostile(rng: &mut Pcg64Mcg) -> Vec<u8> {
    match rng.random_range(0..5) {
        // A WRITE announcing more than the maximum payload.
        0 => nbd_request(nbd::CMD_WRITE, 0, 1, 0, u32::MAX),
        // A WRITE announcing 8 MiB, then a little of it.
        1 => [nbd_request(nbd::CMD_WRITE, 0, 1, 0, 8 << 20), vec![9; 100]].concat(),
        // Past the end, and an offset that overflows.
        2 => nbd_request(nbd::CMD_READ, 0, 1, u64::MAX - 10, 4096),
        3 => nbd_request(nbd::CMD_WRITE_ZEROES, 0xffff, 1, EXPORT_BYTES as u64, 1 << 30),
        _ => nbd_request(rng.random(), rng.random(), 1, rng.random(), rng.random()),
    }
}

/// An NBD session: the client flags, options (valid and not), and when it
/// chose the export, transmission requests.
fn nbd_session(rng: &mut Pcg64Mcg) -> Vec<Vec<u8>> {
    let flags = (nbd::FLAG_C_FIXED_NEWSTYLE | nbd::FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
    let mut chunks = vec![flags];
    for _ in 0..rng.random_range(0..4) {
        chunks.push(match rng.random_range(0..6) {
            0 => nbd_option(nbd::OPT_LIST, &[]),
            1 => nbd_option(nbd::OPT_INFO, &random_bytes(rng)),
            2 => nbd_option(rng.random(), &random_bytes(rng)),
            // Option data over the limits, then a little of it.
            3 => {
                let mut b = nbd_option(nbd::OPT_GO, &[0; 64]);
                b[12..16].copy_from_slice(&rng.random_range(16u32 << 10..u32::MAX).to_be_bytes());
                b
            }
            4 => random_bytes(rng),
            _ => nbd_option(nbd::OPT_STRUCTURED_REPLY, &[]),
        });
    }
    chunks.push(nbd_go("fuzz"));
    chunks.extend(mix(rng, &nbd_valid, &nbd_hostile));
    chunks
}

/// Negotiate the export "model": the replies up to NBD_OPT_GO's ACK.
fn nbd_open_model(port: u16) -> TcpStream {
    let mut s = connect(port);
    let greeting = read_exact(&mut s, nbd::GREETING_BYTES);
    assert_eq!(greeting, nbd::greeting());
    s.write_all(&(nbd::FLAG_C_FIXED_NEWSTYLE | nbd::FLAG_C_NO_ZEROES).to_be_bytes()).unwrap();
    s.write_all(&nbd_go("model")).unwrap();
    loop {
        let h = read_exact(&mut s, 20);
        let reply = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        read_exact(&mut s, len as usize);
        match reply {
            nbd::REP_ACK => return s,
            nbd::REP_INFO => {}
            r => panic!("NBD_OPT_GO on \"model\": reply {r:#x}"),
        }
    }
}

fn nbd_model(port: u16, rng: &mut Pcg64Mcg, model: &mut [u8]) {
    let mut s = nbd_open_model(port);
    for cookie in 0..4u64 {
        let len = rng.random_range(1..9000usize);
        let offset = rng.random_range(0..EXPORT_BYTES - len);
        if rng.random_bool(0.5) {
            let data = value(rng, len);
            let len = data.len();
            s.write_all(&[&nbd_request(nbd::CMD_WRITE, 0, cookie, offset as u64, len as u32)[..], &data].concat())
                .unwrap();
            if len > 0 {
                let reply = read_exact(&mut s, nbd::REPLY_BYTES);
                assert_eq!(reply, nbd::reply_header(0, cookie), "write at {offset}");
                model[offset..offset + len].copy_from_slice(&data);
            } else {
                // A zero-length request is refused, touching nothing.
                let reply = read_exact(&mut s, nbd::REPLY_BYTES);
                assert_eq!(reply, nbd::reply_header(nbd::EINVAL, cookie));
            }
        }
        s.write_all(&nbd_request(nbd::CMD_READ, 0, cookie + 100, offset as u64, len as u32)).unwrap();
        assert_eq!(read_exact(&mut s, nbd::REPLY_BYTES), nbd::reply_header(0, cookie + 100), "read at {offset}");
        assert!(read_exact(&mut s, len) == model[offset..offset + len], "read at {offset}: not what was written");
    }
    s.write_all(&nbd_request(nbd::CMD_DISC, 0, 0, 0, 0)).unwrap();
}

// ---------------------------------------------------------------- the run

#[test]
fn every_port_survives_seeded_random_sessions_and_keeps_its_data() {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let seed: u64 = env_or("GRANARY_PROTO_FUZZ_SEED", now.as_nanos() as u64);
    let sessions: usize = env_or("GRANARY_PROTO_FUZZ_SESSIONS", 60);
    let per_port = Duration::from_secs(env_or("GRANARY_PROTO_FUZZ_SECS", 3));
    println!("protocol fuzz seed {seed} (GRANARY_PROTO_FUZZ_SEED={seed} replays it)");
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&dir.path().join("store"));
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let (mut mc_model, mut native_model_map, mut resp_model_map) = (HashMap::new(), HashMap::new(), HashMap::new());
    let mut export = vec![0u8; EXPORT_BYTES];
    let mut hung = Vec::new();
    for port_name in ["memcache-text", "memcache-binary", "native", "resp", "nbd"] {
        let started = Instant::now();
        let (mut closed, mut replied) = (0, 0);
        for i in 0..sessions {
            if started.elapsed() > per_port {
                break;
            }
            let (port, chunks) = match port_name {
                "memcache-text" => (server.memcache, mix(&mut rng, &memcache_valid, &memcache_hostile)),
                "memcache-binary" => (server.memcache, mix(&mut rng, &binary_valid, &binary_hostile)),
                "native" => (server.native, native_session(&mut rng)),
                "resp" => (server.resp, mix(&mut rng, &resp_valid, &resp_hostile)),
                _ => (server.nbd, nbd_session(&mut rng)),
            };
            match session(port, &chunks) {
                End::Closed(got) => {
                    closed += 1;
                    replied += got;
                }
                End::Hung(got) => hung.push(format!("{port_name} session {i} ({got} bytes of replies)")),
            }
            server.alive();
            match port_name {
                "memcache-text" | "memcache-binary" => memcache_model(server.memcache, &mut rng, &mut mc_model),
                "native" => native_model(server.native, &mut rng, &mut native_model_map),
                "resp" => resp_model(server.resp, &mut rng, &mut resp_model_map),
                _ => nbd_model(server.nbd, &mut rng, &mut export),
            }
            let rss = server.rss_kib();
            assert!(rss < RSS_LIMIT_KIB, "seed {seed}: server RSS {rss} KiB after {port_name} session {i}");
        }
        println!(
            "{port_name}: {closed} sessions closed cleanly ({replied} bytes of replies), rss {} KiB",
            server.rss_kib()
        );
    }
    assert!(hung.is_empty(), "seed {seed}: connections neither answered nor closed: {hung:?}");
    server.alive();
}
