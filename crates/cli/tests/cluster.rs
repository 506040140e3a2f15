//! Granary nodes behind twemproxy (Debian's `nutcracker`), started and
//! stopped by scripts/cluster.sh (docs/CLUSTER.md):
//!
//! - placement: keys written through the proxy (memcache text and RESP)
//!   are on the node the Rust client's nutcracker ring names and on no
//!   other, for 3 named and 5 unnamed nodes with weights; keys the sharded
//!   client writes over the native protocol read back through the proxy;
//! - a SIGKILLed node is ejected by the `auto_eject_hosts` pool after
//!   `server_failure_limit` failures, only its keys miss meanwhile, and it
//!   rejoins warm (every write acknowledged before the kill is back);
//! - a rolling restart of every node under a write load through the pool
//!   without ejection (store mode) loses no acknowledged write;
//! - `MODE=4x scripts/bench-cluster.sh` (granary against memcached nodes on
//!   a preloaded data set that fits their memory and one 4x it) runs end to
//!   end on tiny sizes.
//!
//! scripts/test.sh installs nutcracker; without it these tests are skipped
//! unless GRANARY_REQUIRE_PEERS is set. Keys carry a seed printed at the start (`GRANARY_CLUSTER_SEED=S` reruns
//! with it). Every wait polls with a bound on time.

use granary_client::ketama::Ketama;
use granary_client::{ClientConfig, ShardedClient};
use granary_store::io::SimRng;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/cluster.sh");

/// `server_failure_limit` and `server_retry_timeout` of the pools.
const FAILURE_LIMIT: usize = 2;
const RETRY_MS: u64 = 1000;

fn seed() -> u64 {
    let seed = std::env::var("GRANARY_CLUSTER_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("cluster test seed {seed} (rerun: GRANARY_CLUSTER_SEED={seed} cargo test -p granary-cli --test cluster)");
    seed
}

fn node_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, i as u8 + 1)
}

/// A port of the low range free on every address of `ips` a moment ago.
fn port_free_on(ips: &[Ipv4Addr]) -> u16 {
    for _ in 0..200 {
        let first = granary_rt::net::bind_low_port(ips[0].into()).unwrap();
        let port = first.local_addr().unwrap().port();
        if ips[1..].iter().all(|&ip| TcpListener::bind((ip, port)).is_ok()) {
            return port;
        }
    }
    panic!("no port free on every one of {ips:?}");
}

/// A cluster made by `scripts/cluster.sh up`, brought down on drop.
struct Cluster {
    dir: tempfile::TempDir,
    n: usize,
    mc_port: u16,
    resp_port: u16,
    native_port: u16,
    /// The memcache pools: with `auto_eject_hosts` and without (store).
    proxy_mc: SocketAddr,
    proxy_store: SocketAddr,
    proxy_resp: SocketAddr,
    stats: SocketAddr,
}

/// Whether nutcracker is here (Debian puts it in /usr/sbin, which
/// cluster.sh adds to PATH); panics if it is required and missing.
fn have_nutcracker() -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).chain(["/usr/sbin", "/sbin"].map(PathBuf::from));
    if dirs.into_iter().any(|d| d.join("nutcracker").is_file()) {
        return true;
    }
    assert!(std::env::var_os("GRANARY_REQUIRE_PEERS").is_none(), "nutcracker is missing (scripts/test.sh installs it)");
    eprintln!("skipped: nutcracker is missing");
    false
}

impl Cluster {
    /// None (the test is skipped) without nutcracker. `server_conns`: the
    /// proxy's connections to each node (`--server-connections`).
    fn up(n: usize, weights: &[u32], names: bool, server_conns: usize) -> Option<Cluster> {
        let (c, args) = Cluster::planned(n, weights, names, server_conns)?;
        c.script(&args.iter().map(String::as_str).collect::<Vec<_>>());
        Some(c)
    }

    /// A cluster's ports and `cluster.sh up` arguments, not started yet.
    fn planned(n: usize, weights: &[u32], names: bool, server_conns: usize) -> Option<(Cluster, Vec<String>)> {
        if !have_nutcracker() {
            return None;
        }
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let ips: Vec<Ipv4Addr> = (0..=n).map(node_ip).collect();
        let local = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let [mc_port, resp_port, native_port] = [(); 3].map(|_| port_free_on(&ips));
        let [pm, ps, pr, st] = [(); 4].map(|_| granary_rt::net::free_low_port().unwrap());
        let c = Cluster {
            dir,
            n,
            mc_port,
            resp_port,
            native_port,
            proxy_mc: local(pm),
            proxy_store: local(ps),
            proxy_resp: local(pr),
            stats: local(st),
        };
        let weights: Vec<String> = weights.iter().map(u32::to_string).collect();
        let mut args = vec!["up".to_string(), n.to_string(), "--weights".into(), weights.join(",")];
        for (flag, v) in [
            ("--mc-port", mc_port),
            ("--resp-port", resp_port),
            ("--native-port", native_port),
            ("--proxy-mc-port", pm),
            ("--proxy-store-port", ps),
            ("--proxy-resp-port", pr),
            ("--stats-port", st),
        ] {
            args.extend([flag.to_string(), v.to_string()]);
        }
        args.extend(["--store", "--size", "64M", "--retry-ms", &RETRY_MS.to_string()].map(String::from));
        args.extend(["--failure-limit".to_string(), FAILURE_LIMIT.to_string()]);
        args.extend(["--server-connections".to_string(), server_conns.to_string()]);
        if !names {
            args.push("--no-names".into());
        }
        Some((c, args))
    }

    /// Run `cluster.sh ARGS --dir DIR`.
    fn try_script(&self, args: &[&str]) -> std::process::Output {
        Command::new("bash")
            .arg(SCRIPT)
            .args(args)
            .arg("--dir")
            .arg(self.dir.path())
            .env("GRANARY_BIN", env!("CARGO_BIN_EXE_granary"))
            .output()
            .unwrap()
    }

    /// Run `cluster.sh ARGS --dir DIR`; panics on failure.
    fn script(&self, args: &[&str]) {
        let out = self.try_script(args);
        assert!(
            out.status.success(),
            "cluster.sh {args:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The `servers:` lines of pool `pool` in the generated configuration.
    fn pool_lines(&self, pool: &str) -> Vec<String> {
        let conf = std::fs::read_to_string(self.dir.path().join("nutcracker.yml")).unwrap();
        let mut lines = conf.lines().skip_while(|l| *l != format!("{pool}:")).skip(1);
        let mut out = Vec::new();
        for l in lines.by_ref().skip_while(|l| l.trim() != "servers:").skip(1) {
            match l.trim().strip_prefix("- ") {
                Some(s) => out.push(s.to_string()),
                None => break,
            }
        }
        assert_eq!(out.len(), self.n, "pool {pool} in\n{conf}");
        out
    }

    /// nutcracker's ring of pool `pool`.
    fn ring(&self, pool: &str) -> Ketama {
        Ketama::twemproxy_lines(&self.pool_lines(pool)).unwrap()
    }

    /// Node `i`'s (0-based) memcache address.
    fn node_mc(&self, i: usize) -> SocketAddr {
        SocketAddr::new(node_ip(i + 1).into(), self.mc_port)
    }

    fn node_resp(&self, i: usize) -> SocketAddr {
        SocketAddr::new(node_ip(i + 1).into(), self.resp_port)
    }

    fn natives(&self) -> Vec<String> {
        (0..self.n).map(|i| format!("{}:{}", node_ip(i + 1), self.native_port)).collect()
    }

    /// Node `i`'s (0-based) figures in pool `pool` of the proxy's stats.
    fn server_stats(&self, pool: &str, i: usize) -> serde_json::Value {
        let mut s = TcpStream::connect(self.stats).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let name = self.pool_lines(pool)[i].split_once(' ').map(|(_, n)| n.to_string());
        let name = name.unwrap_or_else(|| format!("{}:{}", node_ip(i + 1), self.mc_port));
        v[pool][&name].clone()
    }

    fn node_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("node-{}", i + 1))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(SCRIPT).args(["down", "--dir"]).arg(self.dir.path()).output();
    }
}

/// A memcache text connection (through the proxy, which has no meta
/// commands: replies are read by their shape). Reconnects after an error.
struct Mc {
    addr: SocketAddr,
    conn: Option<BufReader<TcpStream>>,
}

#[derive(Debug, PartialEq)]
enum Got {
    Value(Vec<u8>),
    Miss,
    /// A SERVER_ERROR line (the proxy could not reach the node) or a broken
    /// connection.
    Error(String),
}

impl Mc {
    fn new(addr: SocketAddr) -> Mc {
        Mc { addr, conn: None }
    }

    fn conn(&mut self) -> std::io::Result<&mut BufReader<TcpStream>> {
        if self.conn.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(10))?;
            s.set_read_timeout(Some(Duration::from_secs(30)))?;
            self.conn = Some(BufReader::new(s));
        }
        Ok(self.conn.as_mut().unwrap())
    }

    fn line(r: &mut BufReader<TcpStream>) -> std::io::Result<String> {
        let mut l = String::new();
        if r.read_line(&mut l)? == 0 {
            return Err(std::io::Error::other("connection closed"));
        }
        Ok(l.trim_end().to_string())
    }

    fn set_io(&mut self, key: &str, value: &[u8]) -> std::io::Result<String> {
        let c = self.conn()?;
        let mut req = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
        c.get_mut().write_all(&req)?;
        Mc::line(c)
    }

    /// Whether the set was acknowledged (STORED); the reply otherwise.
    fn set(&mut self, key: &str, value: &[u8]) -> Result<(), String> {
        match self.set_io(key, value) {
            Ok(l) if l == "STORED" => Ok(()),
            Ok(l) => Err(l),
            Err(e) => {
                self.conn = None;
                Err(e.to_string())
            }
        }
    }

    fn get_io(&mut self, key: &str) -> std::io::Result<Got> {
        let c = self.conn()?;
        c.get_mut().write_all(format!("get {key}\r\n").as_bytes())?;
        let l = Mc::line(c)?;
        if l == "END" {
            return Ok(Got::Miss);
        }
        let Some(len) = l.strip_prefix("VALUE ").and_then(|h| h.split(' ').nth(2)).and_then(|n| n.parse().ok()) else {
            return Ok(Got::Error(l));
        };
        let mut v = vec![0u8; len + 2];
        c.read_exact(&mut v)?;
        v.truncate(len);
        let end = Mc::line(c)?;
        assert_eq!(end, "END", "after the value of {key}");
        Ok(Got::Value(v))
    }

    fn get(&mut self, key: &str) -> Got {
        match self.get_io(key) {
            Ok(g) => g,
            Err(e) => {
                self.conn = None;
                Got::Error(e.to_string())
            }
        }
    }
}

/// A RESP command's reply line (and bulk body), read by shape.
fn resp_call(addr: SocketAddr, args: &[&[u8]]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        req.extend_from_slice(a);
        req.extend_from_slice(b"\r\n");
    }
    s.write_all(&req).unwrap();
    let mut r = BufReader::new(s);
    let mut head = String::new();
    r.read_line(&mut head).unwrap();
    match head.strip_prefix('$').map(|n| n.trim_end().parse::<i64>().unwrap()) {
        Some(n) if n >= 0 => {
            let mut v = vec![0u8; n as usize + 2];
            r.read_exact(&mut v).unwrap();
            v.truncate(n as usize);
            v
        }
        Some(_) => b"(nil)".to_vec(),
        None => head.trim_end().as_bytes().to_vec(),
    }
}

/// Poll `f` until it returns Some, for `secs` seconds at most.
fn poll<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn keys(seed: u64, n: usize) -> Vec<String> {
    let mut rng = SimRng::new(seed);
    (0..n).map(|i| format!("k{:x}-{i}", rng.next_u64() % 1_000_000)).collect()
}

/// Every key written through the proxy is on the node the client's ring
/// names and on no other; the sharded client finds it too, and what the
/// client writes reads back through the proxy.
fn placement(n: usize, weights: &[u32], names: bool, server_conns: usize) {
    let seed = seed();
    let Some(c) = Cluster::up(n, weights, names, server_conns) else { return };
    let conf = std::fs::read_to_string(c.dir.path().join("nutcracker.yml")).unwrap();
    let line = format!("  server_connections: {server_conns}");
    assert_eq!(conf.lines().filter(|l| *l == line).count(), 3, "every pool has {line:?}:\n{conf}");
    let ring = c.ring("granary_mc");
    let mut per = vec![0usize; n];
    let mut proxy = Mc::new(c.proxy_mc);
    let mut nodes: Vec<Mc> = (0..n).map(|i| Mc::new(c.node_mc(i))).collect();
    let ks = keys(seed, 400);
    for (i, k) in ks.iter().enumerate() {
        assert_eq!(proxy.set(k, format!("v{i}").as_bytes()), Ok(()), "set {k} through the proxy");
    }
    let client = ShardedClient::twemproxy(&c.natives(), &c.pool_lines("granary_mc"), ClientConfig::default()).unwrap();
    for (i, k) in ks.iter().enumerate() {
        let owner = ring.server_of(k.as_bytes()).unwrap();
        assert_eq!(client.server_of(k.as_bytes()), owner);
        per[owner] += 1;
        for (j, node) in nodes.iter_mut().enumerate() {
            let want = if j == owner { Got::Value(format!("v{i}").into_bytes()) } else { Got::Miss };
            assert_eq!(node.get(k), want, "seed {seed}: {k} on node {} (the ring names {})", j + 1, owner + 1);
        }
        assert_eq!(client.get(k.as_bytes()).unwrap(), Some(format!("v{i}").into_bytes()), "seed {seed}: {k}");
    }
    eprintln!("{n} nodes, weights {weights:?}: keys per node {per:?}");
    assert!(per.iter().all(|&p| p > 0), "every node holds keys: {per:?}");
    // The other way: the client writes (native protocol), the proxy reads.
    for k in &ks[..100] {
        client.put(k.as_bytes(), format!("native {k}").as_bytes()).unwrap();
        assert_eq!(proxy.get(k), Got::Value(format!("native {k}").into_bytes()), "seed {seed}: {k}");
    }
    // The RESP pool places keys alike: the same server names and weights.
    assert_eq!(
        c.pool_lines("granary_resp").iter().map(|l| l.rsplit_once(':').unwrap().1.to_string()).collect::<Vec<_>>(),
        c.pool_lines("granary_mc").iter().map(|l| l.rsplit_once(':').unwrap().1.to_string()).collect::<Vec<_>>(),
    );
    let resp_ring = c.ring("granary_resp");
    for k in &ks[..60] {
        assert_eq!(resp_call(c.proxy_resp, &[b"SET", k.as_bytes(), b"r"]), b"+OK");
        let owner = resp_ring.server_of(k.as_bytes()).unwrap();
        if names {
            assert_eq!(owner, ring.server_of(k.as_bytes()).unwrap(), "named servers: one owner in both pools");
        }
        for j in 0..n {
            let want: &[u8] = if j == owner { b"r" } else { b"(nil)" };
            assert_eq!(resp_call(c.node_resp(j), &[b"GET", k.as_bytes()]), want, "seed {seed}: {k} on node {}", j + 1);
        }
    }
}

#[test]
fn keys_through_the_proxy_are_where_the_client_ring_says_3_named_nodes() {
    placement(3, &[1, 2, 1], true, 1);
}

#[test]
fn keys_through_the_proxy_are_where_the_client_ring_says_5_unnamed_nodes_3_connections_each() {
    placement(5, &[2, 1, 3, 1, 1], false, 3);
}

/// `up` refuses a port another process serves already, a node's or the
/// proxy's, and leaves nothing running: it waited for the port to accept
/// connections, met the other process's listener and reported a cluster
/// whose server had failed to bind.
#[test]
fn up_refuses_a_port_another_process_serves() {
    let Some((c, args)) = Cluster::planned(1, &[1], true, 1) else { return };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for taken in [c.proxy_mc, c.node_mc(0)] {
        // (The node the last round started and stopped may hold its port
        // a moment longer: bound with retries, bounded.)
        let other = poll(&format!("{taken} free"), 10, || TcpListener::bind(taken).ok());
        let out = c.try_script(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "up with {taken} taken: {stderr}");
        assert!(stderr.contains(&format!("{taken} is served by another process")), "{stderr}");
        drop(other);
        // (A node's is node-N/pid, the proxy's nutcracker.pid.)
        let pids: Vec<_> = walk_files(c.dir.path())
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "pid") || p.file_name().is_some_and(|n| n == "pid"))
            .collect();
        assert!(pids.is_empty(), "{pids:?} left after a failed up");
    }
    // With the ports free again, it starts.
    c.script(&args);
    assert_eq!(Mc::new(c.proxy_mc).set("k", b"v"), Ok(()));
}

/// Every file under `dir`.
fn walk_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The ejecting pool: a SIGKILLed node is ejected after
/// `server_failure_limit` failed requests; meanwhile only its keys miss
/// and writes of its keys go to the node the ring without it names; after
/// its restart, it rejoins warm.
#[test]
fn a_killed_node_is_ejected_then_rejoins_warm() {
    let seed = seed();
    let n = 3;
    let Some(c) = Cluster::up(n, &[1, 1, 1], true, 1) else { return };
    let ring = c.ring("granary_mc");
    let mut proxy = Mc::new(c.proxy_mc);
    let ks = keys(seed, 300);
    for (i, k) in ks.iter().enumerate() {
        assert_eq!(proxy.set(k, format!("v{i}").as_bytes()), Ok(()));
    }
    let dead = 1;
    let owned = |k: &String| ring.server_of(k.as_bytes()) == Some(dead);
    let theirs: Vec<&String> = ks.iter().filter(|k| owned(k)).collect();
    assert!(theirs.len() > 20, "seed {seed}: node {} owns {} keys", dead + 1, theirs.len());
    c.script(&["kill", &(dead + 1).to_string()]);

    // Until the proxy ejects it, the node's keys fail; at most
    // server_failure_limit requests fail (the proxy's own connection to the
    // node breaking may count as one).
    let mut errors = 0;
    let mut i = 0;
    poll("ejection", 30, || {
        let k = theirs[i % theirs.len()];
        i += 1;
        match proxy.get(k) {
            Got::Error(e) => {
                errors += 1;
                assert!(errors <= FAILURE_LIMIT, "seed {seed}: {errors} errors before ejection (last: {e})");
                None
            }
            Got::Miss => Some(()),
            Got::Value(v) => panic!("seed {seed}: {k} read {v:?} from a killed node"),
        }
    });
    let ejected_at = poll("the proxy's stats report the ejection", 30, || {
        let at = c.server_stats("granary_mc", dead)["server_ejected_at"].as_u64().unwrap_or(0);
        (at > 0).then_some(at)
    });
    eprintln!("node {} ejected after {errors} failed request(s), at {ejected_at}", dead + 1);

    // Ejected: every other key reads its value, the node's keys miss (or
    // fail, when the proxy happens to be retrying the node after
    // server_retry_timeout).
    for (i, k) in ks.iter().enumerate() {
        let got = proxy.get(k);
        if owned(k) {
            assert!(matches!(got, Got::Miss | Got::Error(_)), "seed {seed}: {k} of the killed node reads {got:?}");
        } else {
            assert_eq!(
                got,
                Got::Value(format!("v{i}").into_bytes()),
                "seed {seed}: {k} while node {} is out",
                dead + 1
            );
        }
    }
    // A write of its key meanwhile goes where the ring of the others says.
    let live: Vec<String> =
        c.pool_lines("granary_mc").into_iter().enumerate().filter(|&(i, _)| i != dead).map(|(_, l)| l).collect();
    let without = Ketama::twemproxy_lines(&live).unwrap();
    let moved = theirs[0];
    poll("a write while the node is out", 30, || proxy.set(moved, b"written while ejected").ok());
    let stand_in = without.server_of(moved.as_bytes()).unwrap();
    let stand_in = if stand_in >= dead { stand_in + 1 } else { stand_in };
    assert_eq!(Mc::new(c.node_mc(stand_in)).get(moved), Got::Value(b"written while ejected".to_vec()));

    // Back on its data file: after server_retry_timeout the proxy uses it
    // again, and every write acknowledged before the kill is there.
    c.script(&["start", &(dead + 1).to_string()]);
    let started = Instant::now();
    let probe = theirs[1];
    let want = format!("v{}", ks.iter().position(|k| k == probe).unwrap()).into_bytes();
    poll("the node's keys through the proxy again", 30, || {
        (proxy.get(probe) == Got::Value(want.clone())).then_some(())
    });
    eprintln!(
        "node {}'s keys served through the proxy {:?} after its restart (server_retry_timeout {RETRY_MS} ms)",
        dead + 1,
        started.elapsed()
    );
    for (i, k) in ks.iter().enumerate() {
        // The write acknowledged while its node was out stays on the
        // stand-in, hidden by the node's own older copy: an ejecting pool
        // is a cache's (docs/CLUSTER.md); the store pool does not eject.
        assert_eq!(proxy.get(k), Got::Value(format!("v{i}").into_bytes()), "seed {seed}: {k} after the restart");
    }
}

/// The last acknowledged value of each key and the values written after
/// it that failed (a failed write may have been applied).
#[derive(Default)]
struct Acked {
    last: Option<String>,
    unsure: Vec<String>,
}

/// Every node restarted in turn (SIGKILL for odd ones, SIGTERM for even
/// ones, each on its data file) while writers set keys through the pool
/// without ejection: a write to a node that is down fails (never
/// acknowledged); every acknowledged write is readable afterwards through
/// the proxy and on its node.
#[test]
fn rolling_restart_under_load_loses_no_acknowledged_write() {
    let seed = seed();
    let n = 3;
    let Some(c) = Cluster::up(n, &[1, 1, 1], true, 1) else { return };
    let c = Arc::new(c);
    let ring = c.ring("granary_store");
    let ks = Arc::new(keys(seed, 600));
    let stop = Arc::new(AtomicBool::new(false));
    let acks_per_node: Arc<Vec<AtomicUsize>> = Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect());
    // Writer w writes the keys at positions w, w + WRITERS, ...: one
    // writer per key, so its record of what was acknowledged is in order.
    const WRITERS: u64 = 2;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (c, ks, stop, acks, ring) = (c.clone(), ks.clone(), stop.clone(), acks_per_node.clone(), ring.clone());
            std::thread::spawn(move || {
                let mut rng = SimRng::new(seed ^ (w + 1));
                let mut mc = Mc::new(c.proxy_store);
                let mine: Vec<&String> = ks.iter().skip(w as usize).step_by(WRITERS as usize).collect();
                let mut state: HashMap<String, Acked> = HashMap::new();
                let deadline = Instant::now() + Duration::from_secs(300);
                let mut done = 0u64;
                // Bounded in count and time; the test stops it sooner.
                while !stop.load(Relaxed) && done < 2_000_000 && Instant::now() < deadline {
                    let k = mine[rng.below(mine.len() as u64) as usize];
                    let v = format!("w{w}-{done}");
                    done += 1;
                    let e = state.entry(k.clone()).or_default();
                    match mc.set(k, v.as_bytes()) {
                        Ok(()) => {
                            e.last = Some(v);
                            e.unsure.clear();
                            acks[ring.server_of(k.as_bytes()).unwrap()].fetch_add(1, Relaxed);
                        }
                        Err(_) => e.unsure.push(v),
                    }
                }
                (done, state)
            })
        })
        .collect();

    // Progress of the writers, not time, paces the restarts.
    let wait_acks = |node: usize, more: usize| {
        let from = acks_per_node[node].load(Relaxed);
        poll(&format!("{more} acknowledged writes to node {}", node + 1), 120, || {
            (acks_per_node[node].load(Relaxed) >= from + more).then_some(())
        });
    };
    for i in 0..n {
        wait_acks(i, 200);
        if i % 2 == 0 {
            c.script(&["kill", &(i + 1).to_string()]);
            c.script(&["start", &(i + 1).to_string()]);
        } else {
            c.script(&["restart", &(i + 1).to_string()]);
        }
        // Writes to it are acknowledged again: the pool reconnected.
        wait_acks(i, 200);
    }
    stop.store(true, Relaxed);
    let mut total = 0;
    let mut st = HashMap::new();
    for w in writers {
        let (done, state) = w.join().unwrap();
        total += done;
        st.extend(state);
    }
    let acked: usize = acks_per_node.iter().map(|a| a.load(Relaxed)).sum();
    eprintln!("{total} writes, {acked} acknowledged, over a rolling restart of {n} nodes");

    let mut proxy = Mc::new(c.proxy_store);
    let mut nodes: Vec<Mc> = (0..n).map(|i| Mc::new(c.node_mc(i))).collect();
    let mut checked = 0;
    for (k, a) in st.iter() {
        let Some(last) = &a.last else { continue };
        let owner = ring.server_of(k.as_bytes()).unwrap();
        for got in [proxy.get(k), nodes[owner].get(k)] {
            let Got::Value(v) = got else {
                panic!("seed {seed}: {k} (last acknowledged {last}) reads {got:?}; logs in {:?}", c.node_dir(owner))
            };
            let v = String::from_utf8(v).unwrap();
            assert!(
                v == *last || a.unsure.contains(&v),
                "seed {seed}: {k} reads {v}, acknowledged {last} (later failed writes {:?})",
                a.unsure
            );
        }
        checked += 1;
    }
    assert!(checked > ks.len() / 2, "seed {seed}: only {checked} keys acknowledged");
}

/// `MODE=4x scripts/bench-cluster.sh` on tiny sizes: 2 memcached nodes of
/// 4 MiB and 2 granary nodes behind nutcracker, a data set of half their
/// memory and one of 4x it, each preloaded through the proxy and driven
/// for a second. Its JSON has both cases and engines; granary (whose data
/// files hold the whole data set) hits every GET, memcached at most about a
/// quarter of them in the 4x case, since its memory holds that much.
#[test]
fn bench_mode_4x_runs_end_to_end() {
    if !have_nutcracker() {
        return;
    }
    let memcached =
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).any(|d| d.join("memcached").is_file());
    if !memcached {
        assert!(std::env::var_os("GRANARY_REQUIRE_PEERS").is_none(), "memcached is missing");
        eprintln!("skipped: memcached is missing");
        return;
    }
    let n = 2;
    let ips: Vec<Ipv4Addr> = (0..=n).map(node_ip).collect();
    let out = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut cmd = Command::new("bash");
    cmd.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/bench-cluster.sh"));
    let vars =
        ["MC_PORT", "RESP_PORT", "NATIVE_PORT", "PROXY_MC_PORT", "PROXY_RESP_PORT", "PROXY_STORE_PORT", "STATS_PORT"];
    let mut ports = Vec::new();
    for _ in 0..1000 {
        let p = port_free_on(&ips);
        if !ports.contains(&p) {
            ports.push(p);
        }
        if ports.len() == vars.len() {
            break;
        }
    }
    assert_eq!(ports.len(), vars.len(), "no {} distinct free ports", vars.len());
    for (var, port) in vars.iter().zip(&ports) {
        cmd.env(var, port.to_string());
    }
    let out_dir = out.path().to_str().unwrap();
    let json = out.path().join("4x.json");
    let run = cmd
        .envs([("MODE", "4x"), ("NODES", "2"), ("MEM_MIB", "4"), ("SECS", "1"), ("CONC", "4"), ("OUT", out_dir)])
        .env("JSON", &json)
        .env("GRANARY_BIN", env!("CARGO_BIN_EXE_granary"))
        .env("BENCH_BIN", env!("CARGO_BIN_EXE_granary-bench"))
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "bench-cluster.sh MODE=4x: {}\n{text}", run.status);
    eprintln!("{text}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.iter().map(|c| c["case"].as_str().unwrap()).collect::<Vec<_>>(), ["fit", "4x"], "{v}");
    for c in cases {
        for engine in ["memcached", "granary"] {
            let p = &c["engines"][engine];
            assert!(p["ops"].as_u64().unwrap() > 0, "{engine} served nothing: {c}");
            let ratio = p["hit_ratio"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&ratio), "{c}");
        }
        let granary = &c["engines"]["granary"];
        assert!(granary["hit_ratio"].as_f64().unwrap() > 0.99, "granary missed: {c}");
        assert_eq!(granary["errors"].as_u64(), Some(0), "{c}");
        assert!(c["ops_ratio"].as_f64().unwrap() > 0.0 && c["hits_ratio"].as_f64().unwrap() > 0.0, "{c}");
    }
    let m4x = cases[1]["engines"]["memcached"]["hit_ratio"].as_f64().unwrap();
    assert!(m4x < 0.5, "memcached holds at most about a quarter of a data set 4x its memory, hit {m4x}");
    // Every process the run started was stopped.
    let pids: Vec<_> = std::fs::read_dir(out.path().join("cluster")).unwrap().flatten().collect();
    for e in pids.iter().filter(|e| e.path().is_dir()) {
        assert!(!e.path().join("pid").exists(), "{:?} still has a pid file", e.path());
    }
}
