//! Shared set-up of the server tests: a store on a memory device with a
//! manual clock, a server on an ephemeral loopback port, and a raw client.

#![allow(dead_code)]

use granary_memcache::{Server, ServerConfig};
use granary_store::io::MemDevice;
use granary_store::{Clock, CreateOptions, OpenOptions, Store};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

pub struct Fixture {
    pub dev: Arc<MemDevice>,
    pub now: Arc<AtomicU32>,
    pub server: Option<Server>,
    pub store: Option<Arc<Store>>,
    pub addr: SocketAddr,
}

pub fn opts(now: &Arc<AtomicU32>, evict: bool) -> OpenOptions {
    let n = now.clone();
    let clock = Clock(Arc::new(move || n.load(Relaxed)));
    OpenOptions { evict, clock, track_access: true, ..OpenOptions::default() }
}

impl Fixture {
    /// A store of `size` bytes (1 MiB segments) served with `cfg` (its
    /// address replaced by a free loopback port below the ephemeral range).
    pub fn new(size: u64, evict: bool, cfg: ServerConfig) -> Fixture {
        let dev = Arc::new(MemDevice::new(size));
        let now = Arc::new(AtomicU32::new(1_800_000_000));
        let c = CreateOptions { segment_bytes: Some(2 << 20), grain_bytes: Some(512), ..CreateOptions::default() };
        let store = Arc::new(Store::create(dev.clone(), &c, &opts(&now, evict)).unwrap());
        let mut f = Fixture { dev, now, server: None, store: None, addr: "127.0.0.1:0".parse().unwrap() };
        f.serve(store, cfg);
        f
    }

    /// [`Fixture::default`] with a DRAM tier of `bytes`.
    pub fn with_dram_tier(bytes: u64) -> Fixture {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let now = Arc::new(AtomicU32::new(1_800_000_000));
        let c = CreateOptions { segment_bytes: Some(2 << 20), grain_bytes: Some(512), ..CreateOptions::default() };
        let o = OpenOptions { dram_tier_bytes: bytes, ..opts(&now, true) };
        let store = Arc::new(Store::create(dev.clone(), &c, &o).unwrap());
        let mut f = Fixture { dev, now, server: None, store: None, addr: "127.0.0.1:0".parse().unwrap() };
        f.serve(store, ServerConfig { threads: 2, ..ServerConfig::default() });
        f
    }

    pub fn default() -> Fixture {
        Fixture::new(64 << 20, true, ServerConfig { threads: 2, ..ServerConfig::default() })
    }

    fn serve(&mut self, store: Arc<Store>, mut cfg: ServerConfig) {
        cfg.listen = ([127, 0, 0, 1], granary_rt::net::free_low_port().unwrap()).into();
        let server = Server::start(store.clone(), cfg).unwrap();
        self.addr = server.local_addr();
        self.server = Some(server);
        self.store = Some(store);
    }

    /// Stop the server and close the store cleanly, then open it again
    /// and serve it (a SIGTERM and restart).
    pub fn restart(&mut self, evict: bool) {
        self.server.take().unwrap().shutdown();
        let store = Arc::try_unwrap(self.store.take().unwrap()).ok().expect("store still shared");
        store.close().unwrap();
        let store = Arc::new(Store::open(self.dev.clone(), &opts(&self.now, evict)).unwrap());
        self.serve(store, ServerConfig { threads: 2, ..ServerConfig::default() });
    }

    pub fn store(&self) -> &Store {
        self.store.as_ref().unwrap()
    }

    pub fn advance(&self, secs: u32) {
        self.now.fetch_add(secs, Relaxed);
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }
}

/// A raw text-protocol connection.
pub struct Client {
    pub s: TcpStream,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_nodelay(true).unwrap();
        Client { s }
    }

    pub fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap();
    }

    /// Send `req` followed by `mn` and read everything up to the `MN` reply:
    /// exactly the replies to `req`, however many (or none).
    pub fn call(&mut self, req: &[u8]) -> Vec<u8> {
        self.send(req);
        self.send(b"mn\r\n");
        self.read_until(b"MN\r\n")
    }

    /// Read until the received bytes end with `end`.
    pub fn read_until(&mut self, end: &[u8]) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        while !got.ends_with(end) {
            let n = self.s.read(&mut buf).expect("reply");
            assert!(n > 0, "connection closed; got so far: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        got.truncate(got.len() - end.len());
        got
    }

    /// Read until the server closes the connection.
    pub fn read_to_close(&mut self) -> Vec<u8> {
        let mut got = Vec::new();
        let _ = self.s.read_to_end(&mut got);
        got
    }
}

/// Whether the tests that need peer tools must run (scripts/test.sh
/// installs them and sets this); otherwise they are skipped when missing.
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
