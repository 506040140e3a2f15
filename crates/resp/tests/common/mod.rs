//! Shared set-up of the RESP server tests: a store on a memory device,
//! a server on a free loopback port below the ephemeral range, and a raw
//! RESP client that sends commands and parses one reply at a time.

#![allow(dead_code)]

use granary_resp::{RespConfig, Server};
use granary_store::io::MemDevice;
use granary_store::{CreateOptions, OpenOptions, Store};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Fixture {
    pub server: Option<Server>,
    pub store: Option<Arc<Store>>,
    pub addr: SocketAddr,
}

impl Fixture {
    /// A 64 MiB store (2 MiB segments) served with `cfg` (its address
    /// replaced by a free loopback port).
    pub fn new(mut cfg: RespConfig) -> Fixture {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let c = CreateOptions { segment_bytes: Some(2 << 20), grain_bytes: Some(512), ..CreateOptions::default() };
        let store = Arc::new(Store::create(dev, &c, &OpenOptions::default()).unwrap());
        cfg.listen = ([127, 0, 0, 1], granary_rt::net::free_low_port().unwrap()).into();
        let server = Server::start(store.clone(), cfg).unwrap();
        Fixture { addr: server.local_addr(), server: Some(server), store: Some(store) }
    }

    pub fn default() -> Fixture {
        Fixture::new(RespConfig { threads: 2, ..RespConfig::default() })
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

/// One reply, as RESP2 or RESP3 sends it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    NilArray,
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
    Set(Vec<Value>),
    Double(String),
    Bool(bool),
    /// RESP3's verbatim string: its format (`txt`) and text.
    Verbatim(String, Vec<u8>),
}

impl Value {
    pub fn bulk(s: &str) -> Value {
        Value::Bulk(s.as_bytes().to_vec())
    }
    pub fn ok() -> Value {
        Value::Simple("OK".into())
    }
    pub fn err(s: &str) -> Value {
        Value::Error(s.into())
    }
    pub fn array(v: &[&str]) -> Value {
        Value::Array(v.iter().map(|s| Value::bulk(s)).collect())
    }
}

pub struct Client {
    pub w: TcpStream,
    pub r: BufReader<TcpStream>,
}

/// A command in RESP's multibulk form.
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut b = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        b.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        b.extend_from_slice(a);
        b.extend_from_slice(b"\r\n");
    }
    b
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let w = TcpStream::connect(addr).unwrap();
        w.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let r = BufReader::new(w.try_clone().unwrap());
        Client { w, r }
    }

    /// Send one command (arguments split on spaces) and read its reply.
    pub fn cmd(&mut self, line: &str) -> Value {
        let args: Vec<&[u8]> = line.split(' ').map(|s| s.as_bytes()).collect();
        self.call(&args)
    }

    pub fn call(&mut self, args: &[&[u8]]) -> Value {
        self.w.write_all(&encode(args)).unwrap();
        self.read()
    }

    pub fn send_raw(&mut self, b: &[u8]) {
        self.w.write_all(b).unwrap();
    }

    /// One reply line without its CRLF. A line that is not UTF-8 (an
    /// error echoing a client's bytes) is kept exact: its bytes, marked.
    fn line(&mut self) -> String {
        let mut l = Vec::new();
        self.r.read_until(b'\n', &mut l).unwrap();
        assert!(l.ends_with(b"\r\n"), "reply line without CRLF: {:?}", String::from_utf8_lossy(&l));
        l.truncate(l.len() - 2);
        String::from_utf8(l).unwrap_or_else(|e| format!("<not UTF-8> {:?}", e.into_bytes()))
    }

    /// Read one reply; None if the server closed the connection.
    pub fn try_read(&mut self) -> Option<Value> {
        let mut first = [0u8; 1];
        match self.r.read(&mut first) {
            Ok(0) => return None,
            Ok(_) => {}
            // Closed with our bytes unread (after a protocol error, QUIT).
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("read: {e}"),
        }
        let l = self.line();
        let n = || l.parse::<i64>().unwrap();
        Some(match first[0] {
            b'+' => Value::Simple(l.clone()),
            b'-' => Value::Error(l.clone()),
            b':' => Value::Int(n()),
            b'$' if n() < 0 => Value::Nil,
            b'$' => {
                let mut b = vec![0u8; n() as usize + 2];
                self.r.read_exact(&mut b).unwrap();
                b.truncate(b.len() - 2);
                Value::Bulk(b)
            }
            b'*' if n() < 0 => Value::NilArray,
            b'*' => Value::Array((0..n()).map(|_| self.read()).collect()),
            b'~' => Value::Set((0..n()).map(|_| self.read()).collect()),
            b'%' => Value::Map((0..n()).map(|_| (self.read(), self.read())).collect()),
            b'_' => Value::Nil,
            b',' => Value::Double(l.clone()),
            b'#' => Value::Bool(l == "t"),
            b'=' => {
                let mut b = vec![0u8; n() as usize + 2];
                self.r.read_exact(&mut b).unwrap();
                b.truncate(b.len() - 2);
                assert!(b.len() >= 4 && b[3] == b':', "verbatim string without its format: {b:?}");
                Value::Verbatim(String::from_utf8_lossy(&b[..3]).into_owned(), b[4..].to_vec())
            }
            c => panic!("unknown reply type {:?}", c as char),
        })
    }

    pub fn read(&mut self) -> Value {
        self.try_read().expect("the server closed the connection")
    }
}

/// Whether the tests that need peer tools (redis-server) must run
/// (scripts/test.sh installs them and sets this); otherwise they are
/// skipped when missing.
pub fn require_peers() -> bool {
    std::env::var_os("GRANARY_REQUIRE_PEERS").is_some()
}

/// The path of `tool` if installed.
pub fn which(tool: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| std::path::Path::new(d).join(tool)).find(|p| p.is_file())
}

/// `tool`, or None (and a note) when it is missing and peers are optional.
pub fn peer(tool: &str) -> Option<std::path::PathBuf> {
    match which(tool) {
        Some(p) => Some(p),
        None if require_peers() => panic!("{tool} is required (scripts/test.sh installs it)"),
        None => {
            eprintln!("skipped: {tool} is not installed (scripts/test.sh installs it)");
            None
        }
    }
}

/// A redis-server 7.0 child with `args` (authentication), on a free low
/// port; killed on drop.
pub struct Redis {
    child: Child,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Redis {
    /// Started with `args`; `login` (a command, split at spaces, answered
    /// `+OK`) authenticates the check that the server answering is this
    /// child (`""`: none needed). None: no redis-server 7.0 here and peers
    /// are optional.
    pub fn start(args: &[&str], login: &str) -> Option<Redis> {
        let bin = peer("redis-server")?;
        for _ in 0..5 {
            let port = granary_rt::net::free_low_port().unwrap();
            let dir = tempfile::tempdir().unwrap();
            let child = Command::new(&bin)
                .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(args)
                .arg("--dir")
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut r = Redis { child, addr: ([127, 0, 0, 1], port).into(), _dir: dir };
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if r.child.try_wait().unwrap().is_some() {
                    break;
                }
                if TcpStream::connect(r.addr).is_ok() {
                    // The server answering is this child (and is 7.0).
                    let mut c = Client::connect(r.addr);
                    if !login.is_empty() {
                        assert_eq!(c.cmd(login), Value::ok());
                    }
                    let Value::Bulk(info) = c.cmd("INFO server") else { break };
                    let info = String::from_utf8_lossy(&info).into_owned();
                    if !info.lines().any(|l| l == format!("process_id:{}", r.child.id())) {
                        break;
                    }
                    if !info.contains("redis_version:7.0.") {
                        assert!(!require_peers(), "redis-server is not 7.0");
                        eprintln!("skipped: redis-server is not 7.0");
                        return None;
                    }
                    return Some(r);
                }
                assert!(Instant::now() < deadline, "redis-server did not start listening on {}", r.addr);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("redis-server did not start on any of 5 free ports");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// HELLO's map, with `id` and `version` (each server's own) blanked.
pub fn normalize(v: Value) -> Value {
    let blank = |k: &Value| matches!(k, Value::Bulk(b) if b == b"id" || b == b"version");
    match v {
        Value::Map(m) => {
            Value::Map(m.into_iter().map(|(k, v)| if blank(&k) { (k, Value::Nil) } else { (k, v) }).collect())
        }
        Value::Array(a) if a.len() == 14 => {
            let mut out = a.clone();
            for i in (0..a.len()).step_by(2) {
                if blank(&a[i]) {
                    out[i + 1] = Value::Nil;
                }
            }
            Value::Array(out)
        }
        v => v,
    }
}

/// Each sequence of commands (split at spaces) on a fresh connection to
/// Granary at `granary` and one to redis-server at `redis`: the replies,
/// [`normalize`]d, must be the same.
pub fn same_replies(granary: SocketAddr, redis: SocketAddr, sequences: &[&[&str]]) {
    for seq in sequences {
        let mut g = Client::connect(granary);
        let mut r = Client::connect(redis);
        for cmd in *seq {
            let args: Vec<&[u8]> = cmd.split(' ').map(|s| s.as_bytes()).collect();
            let want = normalize(r.call(&args));
            let got = normalize(g.call(&args));
            assert_eq!(got, want, "{cmd:?} in {seq:?}");
        }
    }
}

/// redis-cli (`cli`) run against the server at `addr` with the options
/// `extra` and the command `cmd`: its output, stdout trimmed then stderr.
pub fn redis_cli(cli: &std::path::Path, addr: SocketAddr, extra: &[&str], cmd: &[&str]) -> String {
    let o = Command::new(cli)
        .args(["-h", "127.0.0.1", "-p", &addr.port().to_string(), "--no-auth-warning"])
        .args(extra)
        .args(cmd)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string() + &String::from_utf8_lossy(&o.stderr)
}
