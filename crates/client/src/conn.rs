//! One multiplexed connection: many requests in flight, responses matched
//! by id.
//!
//! Senders encode their frame and write it under the connection's write
//! lock (a blocking write, which waits only while the socket's send buffer
//! is full; the server keeps reading while it works). A reader thread per
//! connection reads responses and completes the waiting request: its
//! future is woken, or its blocked caller released. The reader also
//! enforces deadlines: it wakes every [`TICK`] and fails requests past
//! theirs with [`Error::Timeout`]; a late response to such a request is
//! dropped. When the connection breaks, every waiting request fails with
//! [`Error::Disconnected`] and the connection is marked dead (a pool then
//! replaces it).

use crate::Error;
use granary_proto::{self as proto, ClientHello, Request, Response, ServerHello, Status};
use std::collections::HashMap;
use std::future::Future;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How often the reader checks deadlines while waiting for responses.
pub const TICK: Duration = Duration::from_millis(20);

struct SlotState {
    result: Option<Result<Response, Error>>,
    waker: Option<Waker>,
}

struct Slot {
    state: Mutex<SlotState>,
    cond: Condvar,
    deadline: Instant,
}

impl Slot {
    fn complete(&self, r: Result<Response, Error>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.result.is_none() {
            s.result = Some(r);
        }
        let w = s.waker.take();
        drop(s);
        self.cond.notify_all();
        if let Some(w) = w {
            // The caller's waker runs on the connection's reader thread,
            // which alone sweeps deadlines and marks the connection dead:
            // a waker that panics (an executor gone) must not end it, or
            // every request on the connection would wait for ever.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.wake())).is_err() {
                tracing::warn!("a request's waker panicked; its connection goes on");
            }
        }
    }
}

struct Table {
    slots: HashMap<u64, Arc<Slot>>,
    next_id: u64,
    /// Why the connection is dead, once it is.
    dead: Option<String>,
}

/// The sending half of a connection: the socket, or TLS over it.
enum Wire {
    Plain(TcpStream),
    Tls(crate::tls::WriteHalf),
}

impl Wire {
    fn tcp(&self) -> &TcpStream {
        match self {
            Wire::Plain(s) => s,
            Wire::Tls(t) => t.tcp(),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Wire::Plain(s) => s.write_all(buf),
            Wire::Tls(t) => t.write_all(buf),
        }
    }
}

/// The receiving half of a connection.
enum ReadWire {
    Plain(TcpStream),
    Tls(crate::tls::ReadHalf),
}

impl Read for ReadWire {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ReadWire::Plain(s) => s.read(buf),
            ReadWire::Tls(t) => t.read(buf),
        }
    }
}

struct Shared {
    addr: SocketAddr,
    writer: Mutex<(Wire, Vec<u8>)>,
    table: Mutex<Table>,
    hello: ServerHello,
    timeout: Duration,
    closing: AtomicBool,
}

impl Shared {
    /// Mark dead and fail every waiting request.
    fn kill(&self, why: String) {
        let slots: Vec<Arc<Slot>> = {
            let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            if t.dead.is_none() {
                t.dead = Some(why.clone());
            }
            t.slots.drain().map(|(_, s)| s).collect()
        };
        for s in slots {
            s.complete(Err(Error::Disconnected(why.clone())));
        }
    }
}

/// A connection to one server.
pub struct Connection {
    shared: Arc<Shared>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// Read the server's hello, failing at once (not at the timeout) when its
/// first bytes are not the protocol's magic: a foreign server (memcached,
/// Redis, HTTP) answers the client's hello with an error line and waits.
fn read_server_hello(s: &mut impl Read, addr: SocketAddr) -> Result<[u8; proto::SERVER_HELLO_BYTES], Error> {
    let mut b = [0u8; proto::SERVER_HELLO_BYTES];
    let mut got = 0;
    while got < b.len() {
        let n = match s.read(&mut b[got..]) {
            Ok(0) => return Err(Error::Handshake(format!("{addr} closed the connection during the handshake"))),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(Error::Timeout)
            }
            Err(e) => return Err(Error::Connect(addr, e)),
        };
        got += n;
        let seen = got.min(proto::MAGIC.len());
        if b[..seen] != proto::MAGIC[..seen] {
            let shown = String::from_utf8_lossy(&b[..got]);
            return Err(Error::Handshake(format!(
                "{addr} is not a Granary native-protocol server (it answered the hello with {:?})",
                shown.trim_end()
            )));
        }
    }
    Ok(b)
}

impl Connection {
    /// Connect, shake hands (offering every version this build speaks:
    /// the server picks the highest it speaks too), and start the reader.
    /// `timeout` bounds the connect, the handshake and every request.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<Connection, Error> {
        Connection::connect_with(addr, timeout, ClientHello::default())
    }

    /// [`Connection::connect`] offering the versions of `offer` only (say,
    /// `max_version: 1` to speak as a version 1 client; within what this
    /// build speaks).
    pub fn connect_with(addr: SocketAddr, timeout: Duration, offer: ClientHello) -> Result<Connection, Error> {
        Connection::connect_offering(addr, timeout, offer, None)
    }

    /// [`Connection::connect`] with the token a server started with
    /// `--native-token` requires (docs/PROTOCOL.md, "Handshake"); a
    /// server that requires none ignores it.
    pub fn connect_with_token(addr: SocketAddr, timeout: Duration, token: &[u8]) -> Result<Connection, Error> {
        Connection::connect_offering(addr, timeout, ClientHello::default(), Some(token))
    }

    /// [`Connection::connect_with`], with a token if `token` is Some (1 to
    /// [`proto::HELLO_TOKEN_BYTES_MAX`] bytes).
    pub fn connect_offering(
        addr: SocketAddr,
        timeout: Duration,
        offer: ClientHello,
        token: Option<&[u8]>,
    ) -> Result<Connection, Error> {
        Connection::connect_over(addr, timeout, offer, token, None)
    }

    /// [`Connection::connect_offering`], over TLS when `tls` is Some (a
    /// server started with `--tls-cert`; docs/SECURITY.md).
    pub fn connect_over(
        addr: SocketAddr,
        timeout: Duration,
        offer: ClientHello,
        token: Option<&[u8]>,
        tls: Option<&crate::Tls>,
    ) -> Result<Connection, Error> {
        if let Some(t) = token {
            if !(1..=proto::HELLO_TOKEN_BYTES_MAX).contains(&t.len()) {
                return Err(Error::Handshake(format!(
                    "a token is 1 to {} bytes, not {}",
                    proto::HELLO_TOKEN_BYTES_MAX,
                    t.len()
                )));
            }
        }
        let s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| Error::Connect(addr, e))?;
        s.set_nodelay(true).map_err(Error::Io)?;
        s.set_read_timeout(Some(timeout)).map_err(Error::Io)?;
        s.set_write_timeout(Some(timeout)).map_err(Error::Io)?;
        let (mut s, mut rs) = match tls {
            None => {
                let rs = s.try_clone().map_err(Error::Io)?;
                (Wire::Plain(s), ReadWire::Plain(rs))
            }
            Some(t) => {
                let (w, r) = t.connect(addr, s)?;
                (Wire::Tls(w), ReadWire::Tls(r))
            }
        };
        let mut hello_bytes = match token {
            Some(t) => offer.encode_with_token(t.len()).to_vec(),
            None => offer.encode().to_vec(),
        };
        hello_bytes.extend_from_slice(token.unwrap_or_default());
        s.write_all(&hello_bytes).map_err(|e| Error::Connect(addr, e))?;
        let b = read_server_hello(&mut rs, addr)?;
        let hello = ServerHello::decode(&b).map_err(|e| Error::Handshake(format!("{addr}: {e}")))?;
        let offered = offer.min_version.max(proto::VERSION_MIN)..=offer.max_version.min(proto::VERSION);
        match hello.status {
            Status::Ok if offered.contains(&hello.version) => {}
            Status::Ok => return Err(Error::Handshake(format!("{addr} chose unknown version {}", hello.version))),
            Status::Busy => return Err(Error::Handshake(format!("{addr} is at its connection limit"))),
            Status::Unauthorized if token.is_none() => {
                return Err(Error::Handshake(format!(
                    "{addr} requires a token (ClientConfig::token, granary --native-token)"
                )))
            }
            Status::Unauthorized => return Err(Error::Handshake(format!("{addr} refused the token"))),
            s => return Err(Error::Handshake(format!("{addr} refused the handshake: {s}"))),
        }
        // The read half's clone shares the socket's options.
        s.tcp().set_read_timeout(Some(TICK)).map_err(Error::Io)?;
        let shared = Arc::new(Shared {
            addr,
            writer: Mutex::new((s, Vec::new())),
            table: Mutex::new(Table { slots: HashMap::new(), next_id: 1, dead: None }),
            hello,
            timeout,
            closing: AtomicBool::new(false),
        });
        let sh = shared.clone();
        let reader = std::thread::Builder::new()
            .name("granary-client".into())
            .spawn(move || read_loop(rs, sh))
            .map_err(Error::Io)?;
        Ok(Connection { shared, reader: Some(reader) })
    }

    /// The server's limits from its hello.
    pub fn server_hello(&self) -> &ServerHello {
        &self.shared.hello
    }

    /// The protocol version the connection speaks (version 1: the default
    /// namespace only).
    pub fn version(&self) -> u16 {
        self.shared.hello.version
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// False once the connection broke.
    pub fn is_alive(&self) -> bool {
        self.shared.table.lock().unwrap_or_else(|e| e.into_inner()).dead.is_none()
    }

    /// Requests waiting for a response.
    pub fn in_flight(&self) -> usize {
        self.shared.table.lock().unwrap_or_else(|e| e.into_inner()).slots.len()
    }

    /// Check a request naming namespace `ns` against the connection's
    /// version and the server's limits before sending it.
    fn check(&self, ns: &[u8], req: &Request) -> Result<(), Error> {
        let h = &self.shared.hello;
        let op = req.op();
        // A later version's opcode, or TXN operation kind (delete_cas).
        if req.since() > proto::VERSION_NAMESPACES && req.since() > h.version {
            let what = match req {
                Request::Txn(ops) if op.since() <= h.version => {
                    match ops.iter().position(|o| o.write.since() > h.version) {
                        Some(i) => format!("TXN operation {i} ({})", ops[i].write.name()),
                        None => op.name().to_string(),
                    }
                }
                _ => op.name().to_string(),
            };
            return Err(Error::Protocol(format!(
                "{} speaks protocol version {}, and {what} needs version {}",
                self.shared.addr,
                h.version,
                req.since()
            )));
        }
        if op.since() > h.version || (!ns.is_empty() && h.version < proto::VERSION_NAMESPACES) {
            return Err(Error::Protocol(format!(
                "{} speaks protocol version {}, which has no namespaces ({} needs version {})",
                self.shared.addr,
                h.version,
                if ns.is_empty() {
                    op.name().to_string()
                } else {
                    format!("namespace {:?}", String::from_utf8_lossy(ns))
                },
                proto::VERSION_NAMESPACES
            )));
        }
        if !ns.is_empty() && !op.names_namespace() {
            return Err(Error::Protocol(format!("{} names no namespace", op.name())));
        }
        if ns.len() > proto::NAMESPACE_NAME_MAX {
            return Err(Error::TooLarge { what: "namespace name", len: ns.len(), max: proto::NAMESPACE_NAME_MAX });
        }
        let keys: Vec<&[u8]> = match req {
            Request::Get(k) | Request::Delete(k) | Request::Gets(k) => vec![k],
            Request::Put { key, .. } | Request::DeleteCas { key, .. } => vec![key],
            Request::MultiGet(ks) => ks.clone(),
            Request::Batch(ops) => ops.iter().map(|o| o.key()).collect(),
            Request::Txn(ops) => ops.iter().map(|o| o.key).collect(),
            _ => vec![],
        };
        if let Request::Txn(ops) = req {
            if ops.len() > proto::TXN_OPS_MAX {
                return Err(Error::TooLarge { what: "operation count", len: ops.len(), max: proto::TXN_OPS_MAX });
            }
            if let Some(o) = ops.iter().find(|o| o.ns.len() > proto::NAMESPACE_NAME_MAX) {
                return Err(Error::TooLarge {
                    what: "namespace name",
                    len: o.ns.len(),
                    max: proto::NAMESPACE_NAME_MAX,
                });
            }
        }
        for k in keys {
            if k.is_empty() || k.len() > h.key_bytes_max as usize {
                return Err(Error::TooLarge { what: "key", len: k.len(), max: h.key_bytes_max as usize });
            }
        }
        let values: Vec<usize> = match req {
            Request::Put { value, .. } => vec![value.len()],
            Request::Batch(ops) => ops
                .iter()
                .filter_map(|o| match o {
                    proto::BatchOp::Put { value, .. } => Some(value.len()),
                    _ => None,
                })
                .collect(),
            Request::Txn(ops) => ops.iter().map(|o| o.write.value().len()).collect(),
            _ => vec![],
        };
        for v in values {
            if v > h.value_bytes_max as usize {
                return Err(Error::TooLarge { what: "value", len: v, max: h.value_bytes_max as usize });
            }
        }
        if matches!(req, Request::MultiGet(_) | Request::Batch(_)) {
            let n = match req {
                Request::MultiGet(k) => k.len(),
                Request::Batch(o) => o.len(),
                _ => 0,
            };
            if n > proto::MULTI_OPS_MAX {
                return Err(Error::TooLarge { what: "operation count", len: n, max: proto::MULTI_OPS_MAX });
            }
        }
        let body = ns.len() + req.body_len();
        if body > h.frame_bytes_max as usize {
            return Err(Error::TooLarge { what: "request frame", len: body, max: h.frame_bytes_max as usize });
        }
        Ok(())
    }

    /// Send a request now (in the default namespace); the returned
    /// [`Pending`] resolves to its response (await it, or
    /// [`Pending::wait`]). Sending several before waiting pipelines them.
    pub fn send(&self, req: &Request) -> Result<Pending, Error> {
        self.send_in(b"", req)
    }

    /// [`Connection::send`] naming namespace `ns` (version 2): where a key
    /// request's keys are, or the namespace an `NS_*` request acts on.
    /// Empty, or `"default"`, is the default namespace.
    pub fn send_in(&self, ns: &[u8], req: &Request) -> Result<Pending, Error> {
        // A version 1 server knows the default namespace by no name.
        let ns = if ns == proto::DEFAULT_NAMESPACE.as_bytes() && self.version() < proto::VERSION_NAMESPACES {
            &b""[..]
        } else {
            ns
        };
        self.check(ns, req)?;
        let slot = Arc::new(Slot {
            state: Mutex::new(SlotState { result: None, waker: None }),
            cond: Condvar::new(),
            deadline: deadline_after(self.shared.timeout),
        });
        let id = {
            let mut t = self.shared.table.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(why) = &t.dead {
                return Err(Error::Disconnected(why.clone()));
            }
            let id = t.next_id;
            t.next_id += 1;
            t.slots.insert(id, slot.clone());
            id
        };
        let mut w = self.shared.writer.lock().unwrap_or_else(|e| e.into_inner());
        // While this waited for the writer, the request may have been
        // failed (timed out by the sweep, or disconnected by another
        // send's failure): such a request is not sent afterwards (a later
        // write of the same key would be undone by it). One that times out
        // during its own write may still reach the server, as any request
        // that times out may have run.
        if !self.shared.table.lock().unwrap_or_else(|e| e.into_inner()).slots.contains_key(&id) {
            return Ok(Pending { slot });
        }
        let (stream, buf) = &mut *w;
        buf.clear();
        req.encode_in(ns, id, buf);
        if let Err(e) = stream.write_all(buf) {
            // A partly written frame leaves the stream unusable: shut it
            // while holding the writer, so that no other frame follows
            // the part (the server would take it for the rest). Killed
            // first, so that waiting requests learn this reason rather
            // than the reader's end of stream.
            let why = match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => "send timed out".to_string(),
                _ => format!("send failed: {e}"),
            };
            self.shared.kill(why.clone());
            let _ = stream.tcp().shutdown(std::net::Shutdown::Both);
            drop(w);
            return Err(Error::Disconnected(why));
        }
        if buf.capacity() > 1 << 20 {
            *buf = Vec::new();
        }
        Ok(Pending { slot })
    }

    /// Send and wait.
    pub fn call(&self, req: &Request) -> Result<Response, Error> {
        self.send(req)?.wait()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shared.closing.store(true, Relaxed);
        let w = self.shared.writer.lock().unwrap_or_else(|e| e.into_inner());
        let _ = w.0.tcp().shutdown(std::net::Shutdown::Both);
        drop(w);
        self.shared.kill("connection closed by the client".into());
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// A request sent and not yet answered.
pub struct Pending {
    slot: Arc<Slot>,
}

impl Pending {
    /// Block until the response (or the timeout, or a disconnect).
    pub fn wait(self) -> Result<Response, Error> {
        let mut s = self.slot.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = s.result.take() {
                return r;
            }
            s = self.slot.cond.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Future for Pending {
    type Output = Result<Response, Error>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.slot.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = s.result.take() {
            return Poll::Ready(r);
        }
        s.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

fn read_loop(mut s: ReadWire, sh: Arc<Shared>) {
    let why = match read_frames(&mut s, &sh) {
        Ok(()) => "the server closed the connection".to_string(),
        Err(e) => e,
    };
    if !sh.closing.load(Relaxed) {
        tracing::debug!(addr = %sh.addr, reason = %why, "connection ended");
    }
    sh.kill(why);
}

/// Read responses until the stream ends (Ok) or fails (the reason).
fn read_frames(s: &mut ReadWire, sh: &Shared) -> Result<(), String> {
    let frame_max = sh.hello.frame_bytes_max;
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut last_sweep = Instant::now();
    loop {
        // Complete every whole frame in the buffer.
        let mut pos = 0;
        while buf.len() - pos >= proto::HEADER_BYTES {
            let (h, status) =
                Response::decode_header(&buf[pos..], frame_max).map_err(|e| format!("bad response: {e}"))?;
            let total = proto::HEADER_BYTES + h.len as usize;
            if buf.len() - pos < total {
                buf.reserve(total - (buf.len() - pos));
                break;
            }
            let body = buf[pos + proto::HEADER_BYTES..pos + total].to_vec();
            pos += total;
            let slot = sh.table.lock().unwrap_or_else(|e| e.into_inner()).slots.remove(&h.id);
            // The server closes a connection whose frame it rejects: it reads
            // nothing more, so the connection is dead from here (requests
            // sent after it would never run).
            let rejected = status == Status::BadFrame || status == Status::FrameTooLarge;
            match slot {
                Some(slot) if rejected => {
                    // Dead before the caller wakes, so it never takes this
                    // connection from the pool again.
                    let why = format!("the server rejected a frame: {}", String::from_utf8_lossy(&body));
                    sh.kill(why.clone());
                    slot.complete(Ok(Response { id: h.id, op: h.op, status, body }));
                    return Err(why);
                }
                Some(slot) => slot.complete(Ok(Response { id: h.id, op: h.op, status, body })),
                None if rejected => {
                    return Err(format!("the server rejected a frame: {}", String::from_utf8_lossy(&body)));
                }
                // A response to a request that timed out.
                None => {}
            }
        }
        buf.drain(..pos);
        if last_sweep.elapsed() >= TICK {
            last_sweep = Instant::now();
            sweep(sh);
        }
        match s.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("receive failed: {e}")),
        }
    }
}

/// `now + timeout`; a timeout past what an `Instant` holds (as
/// `Duration::MAX`, meaning no timeout) is a century.
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout).or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400))).unwrap_or(now)
}

/// Fail requests past their deadline.
fn sweep(sh: &Shared) {
    let now = Instant::now();
    let expired: Vec<Arc<Slot>> = {
        let mut t = sh.table.lock().unwrap_or_else(|e| e.into_inner());
        let ids: Vec<u64> = t.slots.iter().filter(|(_, s)| s.deadline <= now).map(|(&id, _)| id).collect();
        ids.iter().filter_map(|id| t.slots.remove(id)).collect()
    };
    for s in expired {
        s.complete(Err(Error::Timeout));
    }
}
