//! Shared set-up of the NBD tests: a server over in-memory exports on a
//! loopback port below the ephemeral range, a raw protocol client, and the
//! peer tools (libnbd's, QEMU's), run with a time limit.

#![allow(dead_code)]

use granary_nbd::proto::*;
use granary_nbd::{MemExport, MemExports, NbdConfig, Server};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The export every test serves, and its geometry.
pub const DISK: &str = "disk";
pub const DISK_BYTES: u64 = 16 << 20;
pub const BLOCK: u32 = 4096;

pub struct Fixture {
    pub exports: Arc<MemExports>,
    pub disk: Arc<MemExport>,
    pub server: Option<Server>,
    pub addr: SocketAddr,
}

impl Fixture {
    /// Exports `disk` (16 MiB in 4 KiB blocks) and `small` (1 MiB in 64
    /// KiB blocks), served with `cfg` on a free low port.
    pub fn with(cfg: NbdConfig) -> Fixture {
        let exports = Arc::new(MemExports::new());
        let disk = exports.add(DISK, DISK_BYTES, BLOCK);
        exports.add("small", 1 << 20, 64 << 10);
        let cfg = NbdConfig { listen: ([127, 0, 0, 1], granary_rt::net::free_low_port().unwrap()).into(), ..cfg };
        let server = Server::start(exports.clone(), cfg).unwrap();
        let addr = server.local_addr();
        Fixture { exports, disk, server: Some(server), addr }
    }

    pub fn new() -> Fixture {
        Fixture::with(NbdConfig { threads: 2, ..NbdConfig::default() })
    }

    pub fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `nbd://` URI of export `name`.
    pub fn uri(&self, name: &str) -> String {
        format!("nbd://127.0.0.1:{}/{name}", self.port())
    }

    /// A raw client after the greeting and the client flags.
    pub fn raw(&self, client_flags: u32) -> Raw {
        let mut r = Raw::connect(self.addr);
        r.greeting();
        r.send(&client_flags.to_be_bytes());
        r
    }

    /// A raw client in transmission on `name`, via `NBD_OPT_GO` (asking
    /// for the block sizes if `block_size`).
    pub fn go(&self, name: &str, block_size: bool) -> Raw {
        let mut r = self.raw(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        let infos: &[u16] = if block_size { &[INFO_BLOCK_SIZE] } else { &[] };
        r.option(OPT_GO, &info_request(name, infos));
        let replies = r.option_replies(OPT_GO);
        assert_eq!(replies.last().unwrap().0, REP_ACK, "GO {name}: {replies:?}");
        r
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

/// The data of an `NBD_OPT_INFO` or `NBD_OPT_GO`.
pub fn info_request(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

/// A raw NBD connection.
pub struct Raw {
    pub s: TcpStream,
}

impl Raw {
    pub fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_nodelay(true).unwrap();
        Raw { s }
    }

    pub fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap();
    }

    pub fn read(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.s.read_exact(&mut b).unwrap();
        b
    }

    /// Read the greeting and check it.
    pub fn greeting(&mut self) {
        let g = self.read(GREETING_BYTES);
        assert_eq!(be64(&g[..8]), NBDMAGIC);
        assert_eq!(be64(&g[8..16]), IHAVEOPT);
        assert_eq!(u16::from_be_bytes([g[16], g[17]]), FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    }

    pub fn option(&mut self, option: u32, data: &[u8]) {
        self.send(&option_bytes(option, data));
    }

    /// [`Raw::option`] for an option the server may close the connection
    /// on before reading all of it: a write that meets the closed
    /// connection (EPIPE, ECONNRESET) is not an error here.
    pub fn option_may_close(&mut self, option: u32, data: &[u8]) {
        match self.s.write_all(&option_bytes(option, data)) {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset) => {}
            Err(e) => panic!("sending option {option}: {e}"),
        }
    }

    /// One option reply: (reply type, data); checks the magic and option.
    pub fn option_reply(&mut self, option: u32) -> (u32, Vec<u8>) {
        let h = self.read(20);
        assert_eq!(be64(&h[..8]), OPTION_REPLY_MAGIC);
        assert_eq!(be32(&h[8..12]), option);
        let kind = be32(&h[12..16]);
        let len = be32(&h[16..20]) as usize;
        (kind, self.read(len))
    }

    /// Option replies up to the final one (an ACK or an error).
    pub fn option_replies(&mut self, option: u32) -> Vec<(u32, Vec<u8>)> {
        let mut all = Vec::new();
        loop {
            let r = self.option_reply(option);
            let last = r.0 == REP_ACK || r.0 & (1 << 31) != 0;
            all.push(r);
            if last {
                return all;
            }
        }
    }

    pub fn request(&mut self, flags: u16, kind: u16, cookie: u64, offset: u64, len: u32, data: &[u8]) {
        let r = Request { magic: REQUEST_MAGIC, flags, kind, cookie, offset, len };
        let mut b = r.encode().to_vec();
        b.extend_from_slice(data);
        self.send(&b);
    }

    /// A simple reply's header: (error, cookie).
    pub fn reply(&mut self) -> (u32, u64) {
        let h = self.read(REPLY_BYTES);
        assert_eq!(be32(&h[..4]), SIMPLE_REPLY_MAGIC);
        (be32(&h[4..8]), be64(&h[8..16]))
    }

    /// Send one request and read its reply (`read`: the data length a
    /// successful READ returns): (error, data).
    pub fn call(&mut self, flags: u16, kind: u16, offset: u64, len: u32, data: &[u8]) -> (u32, Vec<u8>) {
        self.request(flags, kind, 7, offset, len, data);
        let (e, cookie) = self.reply();
        assert_eq!(cookie, 7);
        let body = if kind == CMD_READ && e == 0 { self.read(len as usize) } else { Vec::new() };
        (e, body)
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.call(0, CMD_WRITE, offset, data.len() as u32, data).0
    }

    pub fn read_at(&mut self, offset: u64, len: u32) -> Vec<u8> {
        let (e, d) = self.call(0, CMD_READ, offset, len, &[]);
        assert_eq!(e, 0, "READ {offset}+{len}");
        d
    }

    /// Whether the server closed the connection (end of stream within the
    /// read timeout).
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        match self.s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

/// An option request as the client sends it.
fn option_bytes(option: u32, data: &[u8]) -> Vec<u8> {
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// Bytes `len` of a pattern seeded by `seed` (xorshift; reproducible).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Whether the tests that need peer tools must run (scripts/test.sh
/// installs them and sets this); otherwise they are skipped when missing.
pub fn require_peers() -> bool {
    std::env::var_os("GRANARY_REQUIRE_PEERS").is_some()
}

/// The path of `tool` if installed.
pub fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| std::path::Path::new(d).join(tool)).find(|p| p.is_file())
}

/// `tool`, or None (and a note) when it is missing and peers are optional.
pub fn peer(tool: &str) -> Option<PathBuf> {
    match which(tool) {
        Some(p) => Some(p),
        None if require_peers() => panic!("{tool} is required (scripts/test.sh installs it)"),
        None => {
            eprintln!("skipped: {tool} is not installed (scripts/test.sh installs it)");
            None
        }
    }
}

/// The system Python with libnbd's bindings (`python3-libnbd`; a `python3`
/// earlier on PATH may be another Python without them), or None (and a
/// note) when missing and peers are optional.
pub fn python_nbd() -> Option<PathBuf> {
    let py = PathBuf::from("/usr/bin/python3");
    let ok = Command::new(&py)
        .args(["-c", "import nbd"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    match ok {
        true => Some(py),
        false if require_peers() => panic!("python3-libnbd is required (scripts/test.sh installs it)"),
        false => {
            eprintln!("skipped: /usr/bin/python3 cannot import nbd (python3-libnbd is not installed)");
            None
        }
    }
}

/// Run `cmd` for at most `limit` (killed then); its output. Panics if it
/// ran over.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    let shown = format!("{cmd:?}");
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // Drain the pipes on threads so a chatty child never blocks.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{shown} ran over {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: t_out.join().unwrap(), stderr: t_err.join().unwrap() }
}

/// [`run_bounded`], asserting success; its stdout.
pub fn run_ok(cmd: &mut Command, limit: Duration) -> String {
    let shown = format!("{cmd:?}");
    let o = run_bounded(cmd, limit);
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{shown} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}
