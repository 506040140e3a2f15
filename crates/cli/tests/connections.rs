//! Load and slow clients against `granary serve` as a process, over
//! memcache, RESP and the native protocol: ten thousand connections held
//! (half idle, half doing checked sets and gets), with the server's
//! resident memory per idle connection and in all measured against the
//! bounds of docs/MEMCACHE.md ("Connections and memory"); and clients that
//! dribble one byte at a time, never read their replies, or half-close,
//! which must neither stall other connections, nor grow the server's
//! memory without bound, nor leave connections behind.
//!
//! `GRANARY_CONNS` (default 10,000, fewer if this process's descriptor
//! hard limit does not allow it) sets the connections of the load test and
//! `GRANARY_CONNS_SECONDS` (default 3) how long its active half works:
//! `GRANARY_CONNS_SECONDS=60 cargo test -p granary-cli --test connections
//! -- --nocapture` is the full run.

use granary_proto::{ClientHello, PutMode, Request, ServerHello, Status, HEADER_BYTES, SERVER_HELLO_BYTES};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

mod common;

/// A read or write that takes this long fails the test (a stalled server).
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// The bound docs/MEMCACHE.md states: resident memory per idle connection.
const IDLE_CONN_BYTES_MAX: u64 = 16 * 1024;

/// The bound of issue 44: server memory beyond the store's for 10,000
/// connections.
const LOAD_EXTRA_BYTES_MAX: u64 = 160 << 20;

/// A `granary serve` process with every protocol on and /metrics.
struct Server {
    child: Child,
    memcache: u16,
    native: u16,
    resp: u16,
    metrics: u16,
}

fn free_port() -> u16 {
    granary_rt::net::free_low_port().unwrap()
}

impl Server {
    fn start(data: &Path, conn_limit: usize) -> Server {
        let (memcache, native, resp, metrics) = (free_port(), free_port(), free_port(), free_port());
        let s = |p: u16| p.to_string();
        let (m, n, r, c) = (s(memcache), s(native), s(resp), conn_limit.to_string());
        let metrics_addr = format!("127.0.0.1:{metrics}");
        let args = [
            "serve",
            "--data",
            data.to_str().unwrap(),
            "--size",
            "64M",
            "-t",
            "2",
            "-p",
            &m,
            "--native-port",
            &n,
            "--resp-port",
            &r,
            "--metrics",
            &metrics_addr,
            "-c",
            &c,
        ];
        // The native line comes last: every listener is up.
        let ready = |line: &str| line.contains("serving the native protocol");
        let child = common::start_or_panic(&mut common::granary(&args), ready, common::START_LIMIT).child;
        Server { child, memcache, native, resp, metrics }
    }

    fn port(&self, p: Proto) -> u16 {
        match p {
            Proto::Memcache => self.memcache,
            Proto::Resp => self.resp,
            Proto::Native => self.native,
        }
    }

    /// The server's resident memory (VmRSS), in bytes.
    fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .map(|v| v.trim().parse().unwrap())
            .expect("VmRSS in /proc/PID/status");
        kib * 1024
    }

    /// The listener's open connections (`curr_connections`), from /metrics.
    fn connections(&self, p: Proto) -> u64 {
        let mut s = TcpStream::connect(("127.0.0.1", self.metrics)).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: granary\r\nConnection: close\r\n\r\n").unwrap();
        let mut page = String::new();
        s.read_to_string(&mut page).unwrap();
        let name = format!("granary_{}_connections ", p.name());
        page.lines()
            .find_map(|l| l.strip_prefix(&name))
            .unwrap_or_else(|| panic!("no {name} in\n{page}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// Poll (every 10 ms, for at most 30 s) until the listener has `want`
    /// open connections; the last count seen.
    fn await_connections(&self, p: Proto, want: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let n = self.connections(p);
            if n == want || Instant::now() > deadline {
                return n;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    Memcache,
    Resp,
    Native,
}

const PROTOS: [Proto; 3] = [Proto::Memcache, Proto::Resp, Proto::Native];

fn resp_command(args: &[&[u8]], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// One native response: its opcode byte, status and body.
fn read_native(s: &mut TcpStream, id: u64) -> (u8, Status, Vec<u8>) {
    let mut h = [0u8; HEADER_BYTES];
    s.read_exact(&mut h).unwrap();
    let len = u32::from_le_bytes(h[0..4].try_into().unwrap()) as usize;
    assert_eq!(u64::from_le_bytes(h[8..16].try_into().unwrap()), id, "native response out of order");
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (h[4], Status::from_u8(h[5]).unwrap(), body)
}

/// Read exactly `want.len()` bytes and compare.
fn expect(s: &mut TcpStream, want: &[u8], what: &str) {
    let mut got = vec![0u8; want.len()];
    s.read_exact(&mut got).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(want), "{what}");
}

impl Proto {
    /// The key of active connection `i`: each protocol its own (they all
    /// serve the store's default namespace).
    fn key(self, i: usize) -> Vec<u8> {
        format!("{}-a{i}", self.name()).into_bytes()
    }

    fn name(self) -> &'static str {
        match self {
            Proto::Memcache => "memcache",
            Proto::Resp => "resp",
            Proto::Native => "native",
        }
    }

    /// Connect (and for the native protocol, exchange hellos).
    fn connect(self, port: u16) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_nodelay(true).unwrap();
        if self == Proto::Native {
            s.write_all(&ClientHello::default().encode()).unwrap();
            let mut b = [0u8; SERVER_HELLO_BYTES];
            s.read_exact(&mut b).unwrap();
            assert_eq!(ServerHello::decode(&b).unwrap().status, Status::Ok, "native hello refused");
        }
        s
    }

    /// A request without data (memcache `mn`, RESP `PING`, native `NOP`).
    fn probe(self, out: &mut Vec<u8>) {
        match self {
            Proto::Memcache => out.extend_from_slice(b"mn\r\n"),
            Proto::Resp => resp_command(&[b"PING"], out),
            Proto::Native => Request::Nop.encode(1, out),
        }
    }

    fn check_probe(self, s: &mut TcpStream) {
        match self {
            Proto::Memcache => expect(s, b"MN\r\n", "memcache mn"),
            Proto::Resp => expect(s, b"+PONG\r\n", "RESP PING"),
            Proto::Native => {
                let (op, st, _) = read_native(s, 1);
                assert_eq!((op, st), (granary_proto::Op::Nop as u8, Status::Ok), "native NOP");
            }
        }
    }

    /// A round trip of [`Proto::probe`].
    fn ping(self, s: &mut TcpStream) {
        let mut b = Vec::new();
        self.probe(&mut b);
        s.write_all(&b).unwrap();
        self.check_probe(s);
    }

    /// A set of `key` to `value` and a get of it, pipelined.
    fn set_get(self, key: &[u8], value: &[u8], out: &mut Vec<u8>) {
        match self {
            Proto::Memcache => {
                out.extend_from_slice(
                    format!("set {} 0 0 {}\r\n", String::from_utf8_lossy(key), value.len()).as_bytes(),
                );
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\nget ");
                out.extend_from_slice(key);
                out.extend_from_slice(b"\r\n");
            }
            Proto::Resp => {
                resp_command(&[b"SET", key, value], out);
                resp_command(&[b"GET", key], out);
            }
            Proto::Native => {
                Request::Put { key, value, mode: PutMode::Upsert }.encode(2, out);
                Request::Get(key).encode(3, out);
            }
        }
    }

    /// The replies of [`Proto::set_get`]: stored, and the value read back.
    fn check_set_get(self, s: &mut TcpStream, key: &[u8], value: &[u8]) {
        match self {
            Proto::Memcache => {
                let mut want = b"STORED\r\nVALUE ".to_vec();
                want.extend_from_slice(key);
                want.extend_from_slice(format!(" 0 {}\r\n", value.len()).as_bytes());
                want.extend_from_slice(value);
                want.extend_from_slice(b"\r\nEND\r\n");
                expect(s, &want, "memcache set and get");
            }
            Proto::Resp => {
                let mut want = format!("+OK\r\n${}\r\n", value.len()).into_bytes();
                want.extend_from_slice(value);
                want.extend_from_slice(b"\r\n");
                expect(s, &want, "RESP SET and GET");
            }
            Proto::Native => {
                let (_, st, _) = read_native(s, 2);
                assert_eq!(st, Status::Ok, "native PUT");
                let (_, st, body) = read_native(s, 3);
                assert_eq!(st, Status::Ok, "native GET");
                assert_eq!(body, value, "native GET returned another value");
            }
        }
    }

    /// A round trip of [`Proto::set_get`].
    fn set_get_checked(self, s: &mut TcpStream, key: &[u8], value: &[u8]) {
        let mut b = Vec::new();
        self.set_get(key, value, &mut b);
        s.write_all(&b).unwrap();
        self.check_set_get(s, key, value);
    }
}

/// Raise this process's descriptor soft limit to its hard limit; the
/// soft limit now.
fn raise_own_fd_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit on a plain-data struct of ours.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        if r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
        }
        r.rlim_cur as u64
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v}: not a number")))
        .unwrap_or(default)
}

/// The value of an active connection's key in one round: its length
/// varies with both.
fn value_of(conn: usize, round: u64) -> Vec<u8> {
    let mut v = format!("v{conn}-{round}-").into_bytes();
    v.resize(16 + (conn * 7 + round as usize * 13) % 200, b'x');
    v
}

/// The load test: N connections (a third per protocol), half idle after
/// one request each, half doing pipelined checked sets and gets for the
/// configured time; memory per idle connection and in all bounded; every
/// connection still open and answering at the end.
#[test]
fn ten_thousand_connections_half_idle_half_active_in_bounded_memory() {
    let fds = raise_own_fd_limit();
    // This process holds every client end, a few descriptors of its own,
    // and the other tests' connections.
    let want = env_or("GRANARY_CONNS", 10_000);
    let total = want.min(fds.saturating_sub(1024)) as usize;
    if total < want as usize {
        eprintln!("connections: only {total} of {want} (this process's descriptor limit is {fds})");
    }
    let per_proto = total / 3;
    let (active_n, idle_n) = (per_proto / 2, per_proto - per_proto / 2);
    let seconds = env_or("GRANARY_CONNS_SECONDS", 3);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let server = Server::start(&dir.path().join("conns.db"), per_proto + 64);
    let rss_start = server.rss();

    // The active half first, warmed by one checked round, so that what
    // the idle half adds is measured on its own.
    let mut active: Vec<(Proto, Vec<TcpStream>)> = Vec::new();
    for p in PROTOS {
        let port = server.port(p);
        let conns: Vec<TcpStream> = (0..active_n)
            .map(|i| {
                let mut s = p.connect(port);
                p.set_get_checked(&mut s, &p.key(i), &value_of(i, 0));
                s
            })
            .collect();
        active.push((p, conns));
    }
    let rss_active = server.rss();

    let mut idle: Vec<(Proto, Vec<TcpStream>)> = Vec::new();
    let mut per_idle = Vec::new();
    for p in PROTOS {
        let port = server.port(p);
        let before = server.rss();
        let conns: Vec<TcpStream> = (0..idle_n)
            .map(|_| {
                let mut s = p.connect(port);
                p.ping(&mut s);
                s
            })
            .collect();
        let after = server.rss();
        assert_eq!(server.connections(p), (active_n + idle_n) as u64, "{p:?}: connections open");
        per_idle.push((p, after.saturating_sub(before) / idle_n.max(1) as u64));
        idle.push((p, conns));
    }

    // The active half works for the configured time, a thread per
    // protocol, every connection with a request in flight at once.
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let workers: Vec<_> = active
        .into_iter()
        .map(|(p, mut conns)| {
            std::thread::spawn(move || {
                let mut rounds = 0u64;
                let mut buf = Vec::new();
                while Instant::now() < deadline || rounds == 0 {
                    rounds += 1;
                    for (i, s) in conns.iter_mut().enumerate() {
                        buf.clear();
                        p.set_get(&p.key(i), &value_of(i, rounds), &mut buf);
                        s.write_all(&buf).unwrap();
                    }
                    for (i, s) in conns.iter_mut().enumerate() {
                        p.check_set_get(s, &p.key(i), &value_of(i, rounds));
                    }
                }
                (p, conns, rounds)
            })
        })
        .collect();
    let mut active = Vec::new();
    for w in workers {
        let (p, conns, rounds) = w.join().unwrap();
        eprintln!("connections: {p:?}: {active_n} active connections did {rounds} rounds of set+get");
        active.push((p, conns));
    }
    let rss_end = server.rss();

    // Every idle connection is still open and answers.
    for (p, conns) in &mut idle {
        for s in conns.iter_mut() {
            p.ping(s);
        }
        assert_eq!(server.connections(*p), (active_n + idle_n) as u64, "{p:?}: connections open at the end");
    }
    let extra = rss_end.saturating_sub(rss_start);
    eprintln!(
        "connections: {} held ({} per protocol, {active_n} active and {idle_n} idle) for {seconds} s: \
         server RSS {} MiB at start, {} MiB with the active ones, {} MiB at the end ({} MiB more)",
        3 * per_proto,
        per_proto,
        rss_start >> 20,
        rss_active >> 20,
        rss_end >> 20,
        extra >> 20
    );
    for (p, b) in &per_idle {
        eprintln!("connections: {p:?}: {b} bytes resident per idle connection");
    }
    for (p, b) in per_idle {
        assert!(b <= IDLE_CONN_BYTES_MAX, "{p:?}: {b} bytes per idle connection, over {IDLE_CONN_BYTES_MAX}");
    }
    assert!(extra < LOAD_EXTRA_BYTES_MAX, "{} connections took {} MiB more", 3 * per_proto, extra >> 20);
    drop(active);
    drop(idle);
}

/// A client that sends a valid request one byte at a time gets its reply,
/// and while it is mid-request another connection's requests are
/// answered.
#[test]
fn a_client_dribbling_one_byte_at_a_time_stalls_no_one() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let server = Server::start(&dir.path().join("dribble.db"), 64);
    for p in PROTOS {
        let port = server.port(p);
        // The native hello is dribbled too.
        let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
        slow.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        slow.set_nodelay(true).unwrap();
        let mut req = Vec::new();
        if p == Proto::Native {
            req.extend_from_slice(&ClientHello::default().encode());
        }
        let value = vec![b'd'; 300];
        p.set_get(b"dribbled", &value, &mut req);
        let half = req.len() / 2;
        for (n, b) in req.iter().enumerate() {
            if n == half {
                // Mid-request: another connection is served.
                let mut other = p.connect(port);
                p.set_get_checked(&mut other, b"other", b"not stalled");
            }
            slow.write_all(std::slice::from_ref(b)).unwrap();
            // The pace of a slow client: each byte its own segment.
            std::thread::sleep(Duration::from_micros(200));
        }
        if p == Proto::Native {
            let mut h = [0u8; SERVER_HELLO_BYTES];
            slow.read_exact(&mut h).unwrap();
            assert_eq!(ServerHello::decode(&h).unwrap().status, Status::Ok);
        }
        p.check_set_get(&mut slow, b"dribbled", &value);
    }
}

/// Wait (at most `limit`) until `s` can take more bytes; false if it
/// cannot within the limit.
fn writable_within(s: &TcpStream, limit: Duration) -> bool {
    let mut pfd = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    // SAFETY: poll on one valid pollfd of ours.
    let r = unsafe { libc::poll(&mut pfd, 1, limit.as_millis() as i32) };
    r > 0
}

/// Clients that pipeline requests for large replies and never read them:
/// the server stops reading from them once their replies wait (so their
/// writes stall), its memory stays bounded, and other connections are
/// served meanwhile; once they close, their connections go.
#[test]
fn clients_that_never_read_cannot_grow_memory_or_stall_others() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let server = Server::start(&dir.path().join("noread.db"), 64);
    const VALUE_BYTES: usize = 8 * 1024;
    const READERS_NOT: usize = 4;
    // Request bytes written per connection unless its writes stall first:
    // well past what the kernel's socket buffers hold (tcp_rmem's and
    // tcp_wmem's maximum, tens of MiB), for replies of many GiB. A second
    // without room to write counts as a stall; a stall not seen is the
    // failure, so a slow machine can only make it pass, never fail.
    const REQUEST_BYTES_MAX: usize = 128 << 20;
    let value = vec![b'n'; VALUE_BYTES];
    for p in PROTOS {
        let mut s = p.connect(server.port(p));
        p.set_get_checked(&mut s, b"big", &value);
    }
    let rss_before = server.rss();
    let mut stalled = Vec::new();
    let mut hogs = Vec::new();
    for p in PROTOS {
        let mut req = Vec::new();
        match p {
            Proto::Memcache => req.extend_from_slice(b"get big\r\n"),
            Proto::Resp => resp_command(&[b"GET", b"big"], &mut req),
            Proto::Native => Request::Get(b"big").encode(9, &mut req),
        }
        // Requests back to back, written as far as the socket takes them
        // (a request may be cut between two writes).
        let batch = req.repeat(1024);
        for _ in 0..READERS_NOT {
            let mut s = p.connect(server.port(p));
            s.set_nonblocking(true).unwrap();
            let mut written = 0usize;
            let mut stall = false;
            while written < REQUEST_BYTES_MAX {
                let at = written % batch.len();
                match s.write(&batch[at..]) {
                    Ok(n) => written += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        // No room: the server stopped reading if none
                        // comes within the second.
                        if !writable_within(&s, Duration::from_secs(1)) {
                            stall = true;
                            break;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => panic!("{p:?}: write failed: {e}"),
                }
            }
            let asked = written / req.len() * VALUE_BYTES;
            stalled.push((p, stall, asked));
            hogs.push(s);
        }
    }
    let rss_hogs = server.rss();
    // Others are served meanwhile.
    for p in PROTOS {
        let mut s = p.connect(server.port(p));
        p.set_get_checked(&mut s, b"beside", b"served");
    }
    let grew = rss_hogs.saturating_sub(rss_before);
    for (p, stall, asked) in &stalled {
        eprintln!("noread: {p:?}: asked for {} MiB of replies, writes stalled: {stall}", asked >> 20);
    }
    eprintln!("noread: server RSS grew {} KiB with {} connections that never read", grew >> 10, hogs.len());
    // The largest per-connection bound (native: responses up to its pause
    // threshold) for every such connection, with room to spare; far below
    // the gigabytes asked for.
    assert!(grew < 256 << 20, "server memory grew {} MiB with clients that never read", grew >> 20);
    for (p, stall, asked) in &stalled {
        assert!(*stall, "{p:?}: the server read requests for {} MiB of replies never read", asked >> 20);
    }
    drop(hogs);
    for p in PROTOS {
        assert_eq!(server.await_connections(p, 0), 0, "{p:?}: connections of clients gone are still open");
    }
}

/// Connections whose client shut down its writing side, closed, or reset
/// are all closed by the server (`curr_connections` goes back down); a
/// half-closed client still gets the replies to what it sent.
#[test]
fn half_open_closed_and_reset_connections_are_cleaned_up() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let server = Server::start(&dir.path().join("halfopen.db"), 256);
    const EACH: usize = 30;
    for p in PROTOS {
        let port = server.port(p);
        let mut conns: Vec<TcpStream> = (0..3 * EACH)
            .map(|_| {
                let mut s = p.connect(port);
                p.ping(&mut s);
                s
            })
            .collect();
        assert_eq!(server.connections(p), (3 * EACH) as u64, "{p:?}: connections open");
        let reset = conns.split_off(2 * EACH);
        let closed = conns.split_off(EACH);
        let mut half = conns;
        drop(closed);
        for s in reset {
            // SO_LINGER 0: the close sends a reset, as from a client that
            // vanished and whose host answers for it.
            let l = libc::linger { l_onoff: 1, l_linger: 0 };
            // SAFETY: setsockopt reads `l` for the call, on our socket.
            let r = unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&l as *const libc::linger).cast(),
                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                )
            };
            assert_eq!(r, 0);
        }
        assert_eq!(server.await_connections(p, EACH as u64), EACH as u64, "{p:?}: closed and reset ones are gone");
        // Half-closed after a request: its reply still comes, then the
        // server closes its end too.
        for s in &mut half {
            let mut b = Vec::new();
            p.probe(&mut b);
            s.write_all(&b).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
        }
        for s in &mut half {
            p.check_probe(s);
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).unwrap();
            assert!(rest.is_empty(), "{p:?}: more after the reply: {rest:?}");
        }
        assert_eq!(server.await_connections(p, 0), 0, "{p:?}: every connection closed");
    }
}

/// A connection limit the descriptor hard limit cannot cover fails the
/// start with an error that says so, before any file is made.
#[test]
fn a_conn_limit_beyond_the_descriptor_hard_limit_fails_the_start() {
    // SAFETY: getrlimit on a plain-data struct of ours.
    let hard = unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        r.rlim_max
    };
    if hard == libc::RLIM_INFINITY || hard > (1 << 40) {
        eprintln!("skipped: no finite descriptor hard limit");
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("nofds.db");
    let limit = hard.to_string();
    let port = free_port().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_granary"))
        .args(["serve", "--data", data.to_str().unwrap(), "--size", "64M", "-p", &port, "--no-native", "--no-resp"])
        .args(["-c", &limit])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started with conn_limit {limit} beyond the hard limit {hard}: {err}");
    assert!(err.contains("file descriptors are needed"), "{err}");
    assert!(err.contains(&format!("conn_limit = {hard}")), "{err}");
    assert!(!data.exists(), "a refused start made {}", data.display());
}
