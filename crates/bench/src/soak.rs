//! `granary-bench soak`: a mixed workload over memcache text, RESP and the
//! native protocol against `granary serve` (store mode, `--no-evict`), with
//! the server SIGKILLed and restarted every few seconds, and every key
//! checked against a model of what was acknowledged after each restart.
//!
//! The model: each protocol has its own keys (`m:`, `r:`, `n:`); for each
//! key, the last acknowledged value (None: deleted or never set), and the
//! values of operations that were sent but not answered when the server
//! died (either outcome is allowed: the write may or may not have reached
//! the log). Within a server's life a read must return exactly the
//! acknowledged value; after a restart, the acknowledged value or one of
//! the unanswered ones, which then becomes the acknowledged value. Anything
//! else is a lost or corrupted acknowledged write, and fails the run.

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// What a soak runs.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// The `granary` binary.
    pub granary: PathBuf,
    /// Where the store file goes (removed at the end).
    pub dir: PathBuf,
    pub duration: Duration,
    /// Mean time between kills (each one seeded within half to 1.5 times it).
    pub kill_every: Duration,
    /// Keys per protocol.
    pub keys: u64,
    pub seed: u64,
}

/// What a soak did.
#[derive(Debug, Default, Clone)]
pub struct SoakReport {
    pub seconds: f64,
    pub kills: u64,
    /// Operations answered, per protocol (memcache, RESP, native).
    pub ops: [u64; 3],
    pub acked_writes: u64,
    /// Keys checked after restarts (all of them, every restart).
    pub verified: u64,
    /// Unanswered writes found applied / not applied after a restart.
    pub unanswered_applied: u64,
    pub unanswered_dropped: u64,
    /// Mismatches: acknowledged writes lost or changed (the run fails).
    pub lost: Vec<String>,
}

const PROTOCOLS: [&str; 3] = ["memcache", "resp", "native"];
const IO_LIMIT: Duration = Duration::from_secs(20);
const START_LIMIT: Duration = Duration::from_secs(120);

#[derive(Debug, Default, Clone)]
struct KeyState {
    acked: Option<Vec<u8>>,
    /// Outcomes of unanswered operations (None: a delete).
    maybe: Vec<Option<Vec<u8>>>,
}

type Model = BTreeMap<String, KeyState>;

struct Server {
    child: Child,
    ports: [u16; 3],
    log: Arc<std::sync::Mutex<String>>,
}

impl Server {
    fn start(o: &SoakOptions, data: &std::path::Path) -> Result<Server, String> {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            match Server::try_start(o, data) {
                Ok(s) => return Ok(s),
                // The killed process's lock can outlive it for a moment.
                Err(e) if e.contains("in use by another process") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn try_start(o: &SoakOptions, data: &std::path::Path) -> Result<Server, String> {
        let port = || granary_rt::net::free_low_port().map_err(|e| e.to_string());
        let ports = [port()?, port()?, port()?];
        let mut child = Command::new(&o.granary)
            .args(["serve", "--data", &data.to_string_lossy(), "--size", "256M", "--no-evict", "-t", "2"])
            .args(["--max-item-size", "65536", "-p", &ports[0].to_string()])
            .args(["--resp-port", &ports[1].to_string(), "--native-port", &ports[2].to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", o.granary.display()))?;
        let log = Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let err = BufReader::new(child.stderr.take().ok_or("no stderr")?);
        let l2 = log.clone();
        std::thread::spawn(move || {
            for line in err.lines() {
                let Ok(line) = line else { break };
                let up = line.contains("serving the native protocol");
                if let Ok(mut l) = l2.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
                if up {
                    let _ = tx.send(());
                }
            }
        });
        match rx.recv_timeout(START_LIMIT) {
            Ok(()) => Ok(Server { child, ports, log }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!("granary serve did not start:\n{}", log.lock().map(|l| l.clone()).unwrap_or_default()))
            }
        }
    }

    fn kill(&mut self, sig: i32) -> Result<(), String> {
        // SAFETY: kill with the PID of our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, sig) };
        self.child.wait().map(|_| ()).map_err(|e| e.to_string())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One protocol's connection: set, get, delete; Err on a broken
/// connection (the server died), panics never.
enum Conn {
    Text(BufReader<TcpStream>),
    Resp(BufReader<TcpStream>),
    Native(granary_client::Client),
}

fn io<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn line(r: &mut BufReader<TcpStream>) -> Result<String, String> {
    let mut l = String::new();
    r.read_line(&mut l).map_err(io)?;
    if !l.ends_with("\r\n") {
        return Err(format!("connection cut: {l:?}"));
    }
    Ok(l.trim_end().to_string())
}

fn bulk(r: &mut BufReader<TcpStream>, n: usize) -> Result<Vec<u8>, String> {
    let mut v = vec![0; n + 2];
    r.read_exact(&mut v).map_err(io)?;
    v.truncate(n);
    Ok(v)
}

impl Conn {
    fn open(proto: usize, port: u16) -> Result<Conn, String> {
        if proto == 2 {
            let cfg = granary_client::ClientConfig { timeout: IO_LIMIT, connections: 1, ..Default::default() };
            return granary_client::Client::connect(("127.0.0.1", port), cfg).map(Conn::Native).map_err(io);
        }
        let s = TcpStream::connect(("127.0.0.1", port)).map_err(io)?;
        s.set_read_timeout(Some(IO_LIMIT)).map_err(io)?;
        let r = BufReader::new(s);
        Ok(if proto == 0 { Conn::Text(r) } else { Conn::Resp(r) })
    }

    fn resp_call(r: &mut BufReader<TcpStream>, args: &[&[u8]]) -> Result<String, String> {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a);
            req.extend_from_slice(b"\r\n");
        }
        r.get_mut().write_all(&req).map_err(io)?;
        line(r)
    }

    fn set(&mut self, k: &str, v: &[u8]) -> Result<(), String> {
        match self {
            Conn::Text(r) => {
                let mut req = format!("set {k} 0 0 {}\r\n", v.len()).into_bytes();
                req.extend_from_slice(v);
                req.extend_from_slice(b"\r\n");
                r.get_mut().write_all(&req).map_err(io)?;
                match line(r)?.as_str() {
                    "STORED" => Ok(()),
                    l => Err(format!("set {k}: {l}")),
                }
            }
            Conn::Resp(r) => match Conn::resp_call(r, &[b"SET", k.as_bytes(), v])?.as_str() {
                "+OK" => Ok(()),
                l => Err(format!("SET {k}: {l}")),
            },
            Conn::Native(c) => c.put(k.as_bytes(), v).map_err(io),
        }
    }

    fn delete(&mut self, k: &str) -> Result<(), String> {
        match self {
            Conn::Text(r) => {
                r.get_mut().write_all(format!("delete {k}\r\n").as_bytes()).map_err(io)?;
                match line(r)?.as_str() {
                    "DELETED" | "NOT_FOUND" => Ok(()),
                    l => Err(format!("delete {k}: {l}")),
                }
            }
            Conn::Resp(r) => match Conn::resp_call(r, &[b"DEL", k.as_bytes()])? {
                l if l.starts_with(':') => Ok(()),
                l => Err(format!("DEL {k}: {l}")),
            },
            Conn::Native(c) => c.delete(k.as_bytes()).map(|_| ()).map_err(io),
        }
    }

    fn get(&mut self, k: &str) -> Result<Option<Vec<u8>>, String> {
        match self {
            Conn::Text(r) => {
                r.get_mut().write_all(format!("get {k}\r\n").as_bytes()).map_err(io)?;
                let l = line(r)?;
                if l == "END" {
                    return Ok(None);
                }
                let n = l
                    .strip_prefix(&format!("VALUE {k} 0 "))
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| format!("get {k}: {l}"))?;
                let v = bulk(r, n)?;
                match line(r)?.as_str() {
                    "END" => Ok(Some(v)),
                    l => Err(format!("get {k}: {l}")),
                }
            }
            Conn::Resp(r) => {
                let l = Conn::resp_call(r, &[b"GET", k.as_bytes()])?;
                match l.strip_prefix('$') {
                    Some("-1") => Ok(None),
                    Some(n) => bulk(r, n.parse().map_err(io)?).map(Some),
                    None => Err(format!("GET {k}: {l}")),
                }
            }
            Conn::Native(c) => c.get(k.as_bytes()).map_err(io),
        }
    }
}

fn value(rng: &mut Pcg64Mcg) -> Vec<u8> {
    let n = rng.random_range(1..2048usize);
    (0..n).map(|_| rng.random_range(b'a'..=b'z')).collect()
}

/// Work on one protocol until `stop` or the connection breaks; the
/// operations answered, or a mismatch.
fn work(
    proto: usize,
    port: u16,
    model: &mut Model,
    keys: u64,
    rng: &mut Pcg64Mcg,
    stop: &AtomicBool,
    r: &mut SoakReport,
) -> Result<(), String> {
    let Ok(mut c) = Conn::open(proto, port) else { return Ok(()) };
    let prefix = ["m", "r", "n"][proto];
    while !stop.load(SeqCst) {
        let k = format!("{prefix}:{}", rng.random_range(0..keys));
        let st = model.entry(k.clone()).or_default();
        match rng.random_range(0..10u32) {
            0..=4 => {
                let v = value(rng);
                match c.set(&k, &v) {
                    Ok(()) => {
                        st.acked = Some(v);
                        st.maybe.clear();
                        r.acked_writes += 1;
                    }
                    Err(_) => {
                        st.maybe.push(Some(v));
                        return Ok(());
                    }
                }
            }
            5 => match c.delete(&k) {
                Ok(()) => {
                    st.acked = None;
                    st.maybe.clear();
                    r.acked_writes += 1;
                }
                Err(_) => {
                    st.maybe.push(None);
                    return Ok(());
                }
            },
            _ => match c.get(&k) {
                Ok(got) if st.maybe.is_empty() && got != st.acked => {
                    return Err(format!(
                        "{} {k}: read {} bytes, acknowledged {} bytes",
                        PROTOCOLS[proto],
                        got.map_or(-1, |v| v.len() as i64),
                        st.acked.as_ref().map_or(-1, |v| v.len() as i64)
                    ))
                }
                Ok(_) => {}
                Err(_) => return Ok(()),
            },
        }
        r.ops[proto] += 1;
    }
    Ok(())
}

/// After a restart: every key of `model` reads back as acknowledged (or as
/// one of its unanswered operations left it).
fn verify(proto: usize, port: u16, model: &mut Model, r: &mut SoakReport) -> Result<(), String> {
    let mut c = Conn::open(proto, port)?;
    for (k, st) in model.iter_mut() {
        let got = c.get(k)?;
        r.verified += 1;
        if got == st.acked {
            if !st.maybe.is_empty() {
                r.unanswered_dropped += 1;
            }
        } else if st.maybe.contains(&got) {
            r.unanswered_applied += 1;
            st.acked = got;
        } else {
            r.lost.push(format!(
                "{} {k}: read {} bytes after a restart, acknowledged {} bytes",
                PROTOCOLS[proto],
                got.as_ref().map_or(-1, |v| v.len() as i64),
                st.acked.as_ref().map_or(-1, |v| v.len() as i64)
            ));
        }
        st.maybe.clear();
    }
    Ok(())
}

/// Run the soak. Err when the server could not be run; a report with
/// `lost` not empty when an acknowledged write was lost.
pub fn run(o: &SoakOptions) -> Result<SoakReport, String> {
    std::fs::create_dir_all(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let data = o.dir.join(format!("soak-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&data);
    let mut rng = Pcg64Mcg::seed_from_u64(o.seed);
    let mut models: Vec<Model> = vec![Model::new(); 3];
    let mut r = SoakReport::default();
    let started = Instant::now();
    let result = (|| -> Result<(), String> {
        let mut server = Server::start(o, &data)?;
        loop {
            let left = o.duration.saturating_sub(started.elapsed());
            let jitter = rng.random_range(0.5..1.5);
            let life = o.kill_every.mul_f64(jitter).min(left);
            let stop = Arc::new(AtomicBool::new(false));
            let ports = server.ports;
            let keys = o.keys;
            let handles: Vec<_> = std::mem::take(&mut models)
                .into_iter()
                .enumerate()
                .map(|(p, mut m)| {
                    let stop = stop.clone();
                    let mut wrng = Pcg64Mcg::seed_from_u64(rng.random());
                    std::thread::spawn(move || {
                        let mut wr = SoakReport::default();
                        let res = work(p, ports[p], &mut m, keys, &mut wrng, &stop, &mut wr);
                        (m, wr, res)
                    })
                })
                .collect();
            std::thread::sleep(life);
            let last = started.elapsed() >= o.duration;
            if last {
                stop.store(true, SeqCst);
            }
            server.kill(libc::SIGKILL)?;
            r.kills += 1;
            stop.store(true, SeqCst);
            let mut mismatch = None;
            for h in handles {
                let (m, wr, res) = h.join().map_err(|_| "a worker panicked".to_string())?;
                models.push(m);
                for p in 0..3 {
                    r.ops[p] += wr.ops[p];
                }
                r.acked_writes += wr.acked_writes;
                if let Err(e) = res {
                    mismatch = Some(e);
                }
            }
            if let Some(e) = mismatch {
                r.lost.push(e);
            }
            server = Server::start(o, &data)?;
            for (p, m) in models.iter_mut().enumerate() {
                verify(p, server.ports[p], m, &mut r)
                    .map_err(|e| format!("{e}\n{}", server.log.lock().map(|l| l.clone()).unwrap_or_default()))?;
            }
            if last || !r.lost.is_empty() {
                server.kill(libc::SIGTERM)?;
                return Ok(());
            }
        }
    })();
    r.seconds = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&data);
    result.map(|()| r)
}

/// The report as JSON.
pub fn to_json(o: &SoakOptions, r: &SoakReport) -> serde_json::Value {
    serde_json::json!({
        "seed": o.seed,
        "seconds": r.seconds,
        "kill_every_seconds": o.kill_every.as_secs_f64(),
        "keys_per_protocol": o.keys,
        "kills": r.kills,
        "ops": { "memcache": r.ops[0], "resp": r.ops[1], "native": r.ops[2] },
        "acked_writes": r.acked_writes,
        "verified_reads": r.verified,
        "unanswered_applied": r.unanswered_applied,
        "unanswered_dropped": r.unanswered_dropped,
        "lost": r.lost.len(),
        "lost_detail": r.lost,
    })
}

/// A one-paragraph summary.
pub fn render(o: &SoakOptions, r: &SoakReport) -> String {
    format!(
        "soak (seed {}): {:.1} s, {} SIGKILLs and restarts, {} memcache + {} RESP + {} native operations, \
         {} acknowledged writes, {} keys verified after restarts ({} unanswered writes applied, {} not); \
         lost or changed acknowledged writes: {}\n",
        o.seed,
        r.seconds,
        r.kills,
        r.ops[0],
        r.ops[1],
        r.ops[2],
        r.acked_writes,
        r.verified,
        r.unanswered_applied,
        r.unanswered_dropped,
        r.lost.len()
    )
}
