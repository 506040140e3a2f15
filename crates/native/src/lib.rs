//! Granary's native protocol server (docs/PROTOCOL.md): the listener, the
//! per-connection loop with pipelining, the execution of requests against
//! the engine, limits and counters.
//!
//! One accept loop (on executor 0) admits connections and hands them to
//! the executors in turn. A connection is served by three kinds of tasks
//! on its executor: a reader that parses frames and starts requests in order,
//! one task per request (so pipelined requests run concurrently and reach
//! the device together), and a writer that sends responses as they are
//! ready. Requests start in order and a request waits for every earlier
//! one it conflicts with (one writes a key the other touches, or either is
//! a barrier), so a connection observes its requests' effects in the order
//! it sent them, while independent requests overlap. See [`limits`] for
//! the memory a connection may hold.

pub mod limits;

use granary_proto::{self as proto, ClientHello, Header, Op, PutMode, Request, ServerHello, Status};
use granary_rt::latency::Histogram;
use granary_rt::net::{Connections, GaugeHold, TcpListener, TcpStream};
use granary_rt::{Runtime, RuntimeConfig};
use granary_store::{Error as StoreError, PutBuf, Store, ValueBuf};
use limits::*;
use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// How long [`Server::shutdown`] waits for connections to finish.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How the native server runs.
#[derive(Debug, Clone)]
pub struct NativeConfig {
    pub listen: SocketAddr,
    /// Executor threads when the server makes its own runtime; 0 = one per core.
    pub threads: usize,
    pub max_connections: usize,
    /// Largest value accepted (bounded by what the store's segments hold).
    pub value_bytes_max: u32,
    /// Close a connection that sends nothing for this long; None = never.
    pub idle_timeout: Option<Duration>,
}

impl Default for NativeConfig {
    fn default() -> Self {
        NativeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], proto::DEFAULT_PORT)),
            threads: 0,
            max_connections: CONNECTIONS_DEFAULT,
            value_bytes_max: VALUE_BYTES_DEFAULT,
            idle_timeout: None,
        }
    }
}

/// Counters of the native server.
#[derive(Default, Debug)]
pub struct NativeStats {
    /// Open connections, for the drain at shutdown.
    pub connections: Arc<Connections>,
    pub total_connections: AtomicU64,
    pub rejected_connections: AtomicU64,
    /// Connections closed for a malformed or oversized frame.
    pub bad_frames: AtomicU64,
    pub gets: AtomicU64,
    pub get_hits: AtomicU64,
    pub puts: AtomicU64,
    pub deletes: AtomicU64,
    pub multi_gets: AtomicU64,
    pub batches: AtomicU64,
    pub nops: AtomicU64,
    pub stats: AtomicU64,
    /// Responses with an error status.
    pub errors: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Connections closed by the idle timeout.
    pub idle_kicks: AtomicU64,
    /// Latency per opcode, indexed by `op as usize - 1` (see
    /// [`NativeStats::op_latency`]): from the frame's decoding to its
    /// response being queued for the writer, waits behind conflicting
    /// requests and the connection's limits included.
    pub latency: [Histogram; 7],
    /// The most buffer memory one connection has held: input, request
    /// bodies in flight, queued and sending responses. See
    /// [`limits::connection_bytes_bound`].
    pub conn_buffer_bytes_max: AtomicU64,
    /// Connections whose writer waits for the client to read.
    pub conns_waiting_to_send: AtomicU64,
    /// GET values sent from the device's read buffer, and PUT values
    /// received into the buffer the device writes (no copy).
    pub zero_copy_gets: AtomicU64,
    pub zero_copy_puts: AtomicU64,
    /// Connections that start no request until their client reads the
    /// responses waiting ([`OUT_HIGH_BYTES`]).
    pub conns_paused: AtomicU64,
}

/// Every opcode, in the order of [`NativeStats::latency`].
pub const OPS: [Op; 7] = [Op::Get, Op::Put, Op::Delete, Op::MultiGet, Op::Batch, Op::Nop, Op::Stats];

impl NativeStats {
    /// The latency histogram of `op`.
    pub fn op_latency(&self, op: Op) -> &Histogram {
        &self.latency[op as usize - 1]
    }

    fn buffer_bytes(&self, bytes: usize) {
        granary_rt::net::raise_high_water(&self.conn_buffer_bytes_max, bytes as u64);
    }
}

struct Ctx {
    store: Arc<Store>,
    cfg: NativeConfig,
    frame_max: u32,
    stats: Arc<NativeStats>,
    started: Instant,
    /// Hands accepted connections to the executors.
    spawner: granary_rt::Spawner,
}

/// A running native server.
pub struct Server {
    ctx: Arc<Ctx>,
    addr: SocketAddr,
    rt: Option<Arc<Runtime>>,
    listener: std::net::TcpListener,
}

impl Server {
    /// Bind and serve `store` on a runtime of its own.
    pub fn start(store: Arc<Store>, cfg: NativeConfig) -> io::Result<Server> {
        let rc = RuntimeConfig {
            threads: if cfg.threads == 0 { RuntimeConfig::default().threads } else { cfg.threads },
            name: "granary-native".into(),
            ..RuntimeConfig::default()
        };
        let rt = Arc::new(Runtime::new(rc)?);
        Server::start_on(store, cfg, rt)
    }

    /// Bind and serve `store` on `rt` (shared with other listeners).
    pub fn start_on(store: Arc<Store>, cfg: NativeConfig, rt: Arc<Runtime>) -> io::Result<Server> {
        let listener = granary_rt::net::bind_listener(cfg.listen)?;
        Server::start_with_listener(store, cfg, rt, listener)
    }

    /// Serve `store` on `rt` from a listener the caller bound (so it can
    /// check every address before it creates a data file).
    pub fn start_with_listener(
        store: Arc<Store>,
        cfg: NativeConfig,
        rt: Arc<Runtime>,
        listener: std::net::TcpListener,
    ) -> io::Result<Server> {
        // With a short key; a long key leaves a little less room, which the
        // engine enforces per request (VALUE_TOO_LARGE).
        let engine_max = store.value_bytes_max(1);
        if cfg.value_bytes_max == 0 || cfg.value_bytes_max > proto::VALUE_BYTES_LIMIT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("largest value {} is not in 1..={}", cfg.value_bytes_max, proto::VALUE_BYTES_LIMIT),
            ));
        }
        if cfg.value_bytes_max as u64 > engine_max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "largest value {} exceeds what this store's segments hold ({engine_max} bytes); \
                     create the store with larger segments",
                    cfg.value_bytes_max
                ),
            ));
        }
        let addr = listener.local_addr()?;
        let ctx = Arc::new(Ctx {
            frame_max: proto::frame_bytes_max(cfg.value_bytes_max),
            store,
            cfg,
            stats: Arc::new(NativeStats::default()),
            started: Instant::now(),
            spawner: rt.spawner(),
        });
        rt.spawn_on(0, accept_loop(TcpListener::from_std(listener.try_clone()?), ctx.clone()));
        tracing::debug!(%addr, "native server listening");
        Ok(Server { ctx, addr, rt: Some(rt), listener })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stats(&self) -> &NativeStats {
        &self.ctx.stats
    }

    /// The counters, shareable (e.g. with a metrics endpoint).
    pub fn shared_stats(&self) -> Arc<NativeStats> {
        self.ctx.stats.clone()
    }

    /// Stop accepting, let every connection finish the requests it has
    /// read (responses sent), then close. Waits at most [`DRAIN_TIMEOUT`];
    /// returns the connections still open then (cancelled with the runtime
    /// if this server owns it).
    pub fn shutdown(mut self) -> usize {
        let left = self.ctx.stats.connections.drain(self.listener.as_raw_fd(), DRAIN_TIMEOUT);
        if left > 0 {
            tracing::warn!(connections = left, "native connections still busy after the drain timeout are closed");
        }
        self.rt.take();
        left
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.ctx.stats.connections.stop_accepting(self.listener.as_raw_fd());
        self.rt.take();
    }
}

/// The listener's accept loop (on executor 0): connections are admitted
/// in the order they were accepted (a limit refuses the latest), then
/// served by the executors in turn, as the Memcache listener does.
async fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>) {
    for turn in 0usize.. {
        let accepted = listener.accept().await;
        if ctx.stats.connections.stopping() {
            return;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "native accept failed");
                granary_rt::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Counted and registered until its task ends, before the stream
        // closes: the tuple drops the registration first if the task is
        // dropped unpolled, and `_open` is declared after `stream` below.
        let (open, n) = ctx.stats.connections.admit(stream.raw_fd());
        let accepted = (open, stream);
        let c = ctx.clone();
        // Connection tasks are not Send (they share the stream with Rc):
        // what crosses cores is the accepted stream; its task starts there.
        let task = move || async move {
            let (open, stream) = accepted;
            let stream = Rc::new(stream);
            let _open = open;
            if n > c.cfg.max_connections {
                c.stats.rejected_connections.fetch_add(1, Relaxed);
                let _ = hello(&stream, &c, Status::Busy).await;
                return;
            }
            c.stats.total_connections.fetch_add(1, Relaxed);
            if !c.stats.connections.stopping() {
                serve(stream.clone(), &c).await;
            }
        };
        let core = turn % ctx.spawner.cores();
        if granary_rt::current_core() == Some(core) {
            granary_rt::spawn(task());
        } else {
            ctx.spawner.spawn_on(core, async move {
                granary_rt::spawn(task());
            });
        }
    }
}

/// Read the client's hello and answer with `status` (or
/// `UnsupportedVersion`); Ok(true) if the connection goes on.
async fn hello(stream: &TcpStream, ctx: &Ctx, status: Status) -> io::Result<bool> {
    let mut got = Vec::with_capacity(proto::CLIENT_HELLO_BYTES);
    let read = async {
        while got.len() < proto::CLIENT_HELLO_BYTES {
            let (r, b) = stream.recv(vec![0u8; proto::CLIENT_HELLO_BYTES - got.len()]).await;
            match r? {
                0 => return Ok(false),
                n => got.extend_from_slice(&b[..n]),
            }
        }
        Ok::<bool, io::Error>(true)
    };
    match granary_rt::timeout(HELLO_TIMEOUT, read).await {
        Ok(Ok(true)) => {}
        Ok(r) => return r,
        Err(_) => {
            tracing::info!("native connection closed: no hello within {HELLO_TIMEOUT:?}");
            return Ok(false);
        }
    }
    let mut arr = [0u8; proto::CLIENT_HELLO_BYTES];
    arr.copy_from_slice(&got);
    let client = match ClientHello::decode(&arr) {
        Ok(c) => c,
        Err(e) => {
            ctx.stats.bad_frames.fetch_add(1, Relaxed);
            tracing::info!(error = %e, "native connection closed: bad hello");
            return Ok(false);
        }
    };
    let (version, status) = match (client.agree(), status) {
        (Some(v), s) => (v, s),
        (None, _) => (0, Status::UnsupportedVersion),
    };
    let sh = ServerHello {
        version,
        status,
        key_bytes_max: proto::KEY_BYTES_MAX as u32,
        value_bytes_max: ctx.cfg.value_bytes_max,
        frame_bytes_max: ctx.frame_max,
    };
    let (r, _) = stream.send_all(sh.encode().to_vec()).await;
    r?;
    if status == Status::UnsupportedVersion {
        tracing::info!(
            min = client.min_version,
            max = client.max_version,
            "native connection closed: no common version"
        );
    }
    Ok(status == Status::Ok)
}

/// A wake-up between tasks of one executor.
#[derive(Default)]
struct Notify {
    set: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Notify {
    fn notify(&self) {
        self.set.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
    async fn wait(&self) {
        std::future::poll_fn(|cx| {
            if self.set.replace(false) {
                Poll::Ready(())
            } else {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// A request being executed: what later requests must not overtake.
struct Flight {
    seq: u64,
    keys: Vec<u64>,
    write: bool,
    barrier: bool,
    body_bytes: usize,
}

impl Flight {
    /// Keys are sorted: a check costs (smaller count) x log(larger count).
    fn conflicts(&self, o: &Flight) -> bool {
        if self.barrier || o.barrier {
            return true;
        }
        if !(self.write || o.write) {
            return false;
        }
        let (small, large) = if self.keys.len() <= o.keys.len() { (self, o) } else { (o, self) };
        small.keys.iter().any(|k| large.keys.binary_search(k).is_ok())
    }
}

/// What the reader does with the next request.
#[derive(PartialEq, Eq)]
enum Admit {
    Start,
    /// Behind earlier requests (conflict, or the in-flight limits).
    Wait,
    /// Until the client reads the responses waiting.
    Paused,
}

/// Responses waiting to be sent: bytes, with large values spliced in at
/// offsets of them, sent from the buffers the device read them into.
#[derive(Default)]
struct Out {
    bytes: Vec<u8>,
    /// (offset in `bytes` the value goes before, value), in order.
    values: std::collections::VecDeque<(usize, ValueBuf)>,
    value_bytes: usize,
}

impl Out {
    fn len(&self) -> usize {
        self.bytes.len() + self.value_bytes
    }
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Memory held (the values' bytes, the byte buffer's capacity).
    fn memory(&self) -> usize {
        self.bytes.capacity() + self.value_bytes
    }
    fn push_value(&mut self, v: ValueBuf) {
        self.value_bytes += v.len();
        self.values.push_back((self.bytes.len(), v));
    }
    /// Append another response queue after this one.
    fn append(&mut self, o: Out) {
        let base = self.bytes.len();
        self.bytes.extend_from_slice(&o.bytes);
        self.value_bytes += o.value_bytes;
        self.values.extend(o.values.into_iter().map(|(at, v)| (base + at, v)));
    }
    fn clear(&mut self) {
        self.bytes.clear();
        self.values.clear();
        self.value_bytes = 0;
    }
}

/// One connection's shared state.
struct Conn {
    stream: Rc<TcpStream>,
    out: RefCell<Out>,
    flights: RefCell<Vec<Flight>>,
    /// Wakes the reader (a request ended, the writer drained).
    reader: Notify,
    /// Wakes the writer (responses are waiting, or the end).
    writer: Notify,
    /// The reader is done; the writer exits once the output is sent.
    ending: Cell<bool>,
    /// Sending failed; nothing more is sent.
    broken: Cell<bool>,
    /// Bytes the reader holds (input buffer and read chunk).
    input_bytes: Cell<usize>,
    /// Capacity of the buffer the writer is sending.
    sending_bytes: Cell<usize>,
}

impl Conn {
    /// Note the connection's buffer memory in the high-water mark.
    fn account(&self, stats: &NativeStats) {
        let out = self.out.borrow().memory();
        stats.buffer_bytes(self.input_bytes.get() + self.inflight_bytes() + out + self.sending_bytes.get());
    }
    fn inflight_bytes(&self) -> usize {
        self.flights.borrow().iter().map(|f| f.body_bytes).sum()
    }
    /// Whether `f` may start, or why it must wait.
    fn admit(&self, f: &Flight) -> Admit {
        // A client not reading its responses: start nothing until the
        // writer has handed them to the socket.
        if self.out.borrow().len() >= OUT_HIGH_BYTES {
            return Admit::Paused;
        }
        let flights = self.flights.borrow();
        if flights.is_empty() {
            return Admit::Start;
        }
        if flights.len() >= INFLIGHT_MAX
            || self.inflight_bytes() + f.body_bytes > INFLIGHT_BYTES_MAX
            || flights.iter().any(|o| o.conflicts(f))
        {
            return Admit::Wait;
        }
        Admit::Start
    }
    fn finish(&self, seq: u64) {
        self.flights.borrow_mut().retain(|f| f.seq != seq);
        self.reader.notify();
        self.writer.notify();
    }
}

/// Frame-level failure: answer with an error frame, log, close.
fn bad_frame(conn: &Conn, ctx: &Ctx, status: Status, id: u64, why: &str) {
    ctx.stats.bad_frames.fetch_add(1, Relaxed);
    let peer = conn.stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    tracing::info!(%peer, reason = why, "native connection closed: bad frame");
    proto::encode_response(&mut conn.out.borrow_mut().bytes, Op::Nop, status, id, why.as_bytes());
}

async fn serve(stream: Rc<TcpStream>, ctx: &Arc<Ctx>) {
    match hello(&stream, ctx, Status::Ok).await {
        Ok(true) => {}
        _ => return,
    }
    let conn = Rc::new(Conn {
        stream,
        out: RefCell::new(Out::default()),
        flights: RefCell::new(Vec::new()),
        reader: Notify::default(),
        writer: Notify::default(),
        ending: Cell::new(false),
        broken: Cell::new(false),
        input_bytes: Cell::new(0),
        sending_bytes: Cell::new(0),
    });
    let writer = granary_rt::spawn(write_loop(conn.clone(), ctx.clone()));
    read_loop(&conn, ctx).await;
    // Let started requests finish, then the writer sends what is left.
    while !conn.flights.borrow().is_empty() {
        conn.reader.wait().await;
    }
    conn.ending.set(true);
    conn.writer.notify();
    let _ = writer.await;
}

/// What a started request executes: a whole frame, or a PUT whose value
/// was received straight into the record buffer the device writes.
enum Job {
    Frame(Vec<u8>),
    Put { pb: PutBuf, mode: PutMode },
}

/// A zero-copy PUT's frame: enough of the body is in `rest` to know the
/// key, and the value is large enough to take that path. None: the normal
/// path handles the frame (including every malformed case).
fn zero_copy_put<'a>(ctx: &Ctx, h: &Header, rest: &'a [u8]) -> Option<Option<(&'a [u8], usize, PutMode)>> {
    if h.op != Op::Put || (h.len as usize) < ZERO_COPY_MIN_BYTES + 4 {
        return None;
    }
    let mode = PutMode::from_u8(h.flags).ok()?;
    let body = &rest[proto::HEADER_BYTES..];
    if body.len() < 4 {
        return Some(None); // read more
    }
    let kl = u32::from_le_bytes([body[0], body[1], body[2], body[3]]) as usize;
    if kl == 0 || kl > proto::KEY_BYTES_MAX || 4 + kl > h.len as usize {
        return None;
    }
    let value_len = h.len as usize - 4 - kl;
    if value_len < ZERO_COPY_MIN_BYTES || value_len > ctx.cfg.value_bytes_max as usize {
        return None;
    }
    if body.len() < 4 + kl {
        return Some(None);
    }
    Some(Some((&body[4..4 + kl], value_len, mode)))
}

/// Receive the rest of `pb`'s value from the socket, straight into it;
/// None if the connection ended (closed, error, idle timeout).
async fn receive_into(conn: &Conn, ctx: &Ctx, pb: PutBuf) -> Option<PutBuf> {
    let r = pb
        .receive(&conn.stream, ctx.cfg.idle_timeout, |n| {
            ctx.stats.bytes_read.fetch_add(n as u64, Relaxed);
        })
        .await;
    if matches!(r, Err(granary_store::ReceiveEnd::Idle)) {
        ctx.stats.idle_kicks.fetch_add(1, Relaxed);
    }
    r.ok()
}

/// Wait until `flight` may start, then run `job` in a task of its own.
/// False if the connection broke meanwhile.
async fn start_request(conn: &Rc<Conn>, ctx: &Arc<Ctx>, h: Header, job: Job, flight: Flight, started: Instant) -> bool {
    loop {
        let admit = conn.admit(&flight);
        if admit == Admit::Start || conn.broken.get() {
            break;
        }
        let _paused = (admit == Admit::Paused).then(|| GaugeHold::new(&ctx.stats.conns_paused));
        conn.reader.wait().await;
    }
    if conn.broken.get() {
        return false;
    }
    let seq = flight.seq;
    conn.flights.borrow_mut().push(flight);
    let (c, x) = (conn.clone(), ctx.clone());
    granary_rt::spawn(async move {
        // Ends the flight however the task ends.
        struct Done(Rc<Conn>, u64);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0.finish(self.1);
            }
        }
        let done = Done(c, seq);
        let mut resp = Out::default();
        match job {
            Job::Frame(body) => execute(&x, h, &body, &mut resp).await,
            Job::Put { pb, mode } => {
                let outcome = do_put_buf(&x, pb, mode).await;
                proto::encode_response(&mut resp.bytes, h.op, outcome.0, h.id, &outcome.1);
            }
        }
        done.0.out.borrow_mut().append(resp);
        x.stats.op_latency(h.op).since(started);
        done.0.account(&x.stats);
    });
    conn.account(&ctx.stats);
    true
}

async fn read_loop(conn: &Rc<Conn>, ctx: &Arc<Ctx>) {
    let mut input: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    let mut seq = 0u64;
    conn.input_bytes.set(input.capacity() + chunk.len());
    loop {
        // Parse every complete frame in the input.
        let mut pos = 0;
        loop {
            let rest = &input[pos..];
            if rest.len() < proto::HEADER_BYTES {
                break;
            }
            let h = match Header::decode(rest, ctx.frame_max) {
                Ok(h) => h,
                Err(e) => {
                    let status =
                        if Header::peek_len(rest) > ctx.frame_max { Status::FrameTooLarge } else { Status::BadFrame };
                    bad_frame(conn, ctx, status, Header::peek_id(rest), &e.0);
                    return;
                }
            };
            let started = Instant::now();
            // A large PUT: its value goes from the socket into the record
            // buffer the device writes, not through the input buffer.
            let mut put = None;
            match zero_copy_put(ctx, &h, rest) {
                Some(None) => break, // its key is not in yet
                Some(Some((key, value_len, mode))) => {
                    if let Ok(mut pb) = ctx.store.new_put_buf(key, value_len) {
                        let body_at = proto::HEADER_BYTES + 4 + key.len();
                        let have = (rest.len() - body_at).min(value_len);
                        pb.fill_from(&rest[body_at..body_at + have]);
                        pos += body_at + have;
                        put = Some((pb, mode));
                    }
                }
                None => {}
            }
            let (job, flight) = match put {
                Some((pb, mode)) => {
                    conn.input_bytes.set(input.capacity() + chunk.len() + pb.value_len());
                    let Some(pb) = receive_into(conn, ctx, pb).await else { return };
                    let keys = vec![key_hash(pb.key())];
                    let flight = Flight { seq, keys, write: true, barrier: false, body_bytes: pb.value_len() };
                    (Job::Put { pb, mode }, flight)
                }
                None => {
                    let total = proto::HEADER_BYTES + h.len as usize;
                    if rest.len() < total {
                        // The buffer grows as the body arrives (never ahead of it).
                        break;
                    }
                    let body = rest[proto::HEADER_BYTES..total].to_vec();
                    let flight = match Request::decode(&h, &body) {
                        Ok(req) => flight_of(&req, seq, body.len()),
                        Err(e) => {
                            bad_frame(conn, ctx, Status::BadFrame, h.id, &format!("{}: {}", h.op.name(), e.0));
                            return;
                        }
                    };
                    pos += total;
                    (Job::Frame(body), flight)
                }
            };
            if !start_request(conn, ctx, h, job, flight, started).await {
                return;
            }
            seq += 1;
        }
        input.drain(..pos);
        // Draining for shutdown: what was read is done; read no more.
        if ctx.stats.connections.stopping() {
            return;
        }
        let r = match conn.stream.recv_within(chunk, ctx.cfg.idle_timeout).await {
            Ok((r, c)) => {
                chunk = c;
                r
            }
            Err(_) => {
                ctx.stats.idle_kicks.fetch_add(1, Relaxed);
                return;
            }
        };
        match r {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                ctx.stats.bytes_read.fetch_add(n as u64, Relaxed);
                input.extend_from_slice(&chunk[..n]);
                conn.input_bytes.set(input.capacity() + chunk.len());
                conn.account(&ctx.stats);
            }
        }
    }
}

/// A byte range of a `Vec`, as a buffer the ring can send from.
struct Part {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

// SAFETY: start <= end <= buf.len() (set by the writer from offsets into
// the buffer); the Vec's heap buffer does not move with the Part.
unsafe impl granary_rt::IoBuf for Part {
    fn stable_ptr(&mut self) -> *mut u8 {
        self.buf[self.start..].as_mut_ptr()
    }
    fn buf_len(&self) -> usize {
        self.end - self.start
    }
}

/// A buffer the writer sends: its bytes, readable for a direct send.
trait View: granary_rt::IoBuf {
    fn view(&self) -> &[u8];
}

impl View for Part {
    fn view(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }
}

impl View for ValueBuf {
    fn view(&self) -> &[u8] {
        self.value()
    }
}

/// Send all of `b`: directly when the socket takes it, through the ring
/// (waiting for room) otherwise. False if the connection failed.
async fn send_view<B: View>(conn: &Conn, ctx: &Ctx, mut b: B) -> (bool, B) {
    let n = b.view().len();
    let mut off = match conn.stream.try_send(b.view()) {
        Ok(k) => k,
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => 0,
        Err(_) => return (false, b),
    };
    if off < n {
        let _waiting = GaugeHold::new(&ctx.stats.conns_waiting_to_send);
        while off < n {
            let (r, back) = conn.stream.send_from(b, off).await;
            b = back;
            match r {
                Ok(0) => return (false, b),
                Ok(k) => off += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return (false, b),
            }
        }
    }
    (true, b)
}

async fn write_loop(conn: Rc<Conn>, ctx: Arc<Ctx>) {
    let mut spare = Out::default();
    loop {
        if conn.out.borrow().is_empty() {
            if conn.ending.get() {
                return;
            }
            conn.writer.wait().await;
            continue;
        }
        spare.clear();
        std::mem::swap(&mut *conn.out.borrow_mut(), &mut spare);
        conn.sending_bytes.set(spare.memory());
        conn.account(&ctx.stats);
        conn.reader.notify();
        let total = spare.len();
        // The bytes, with the large values spliced in where they go.
        let mut buf = std::mem::take(&mut spare.bytes);
        let mut at = 0;
        let mut ok = true;
        let mut values = std::mem::take(&mut spare.values).into_iter();
        loop {
            let next = values.next();
            let end = next.as_ref().map_or(buf.len(), |(o, _)| *o);
            if end > at {
                let (sent, p) = send_view(&conn, &ctx, Part { buf, start: at, end }).await;
                buf = p.buf;
                at = end;
                if !sent {
                    ok = false;
                    break;
                }
            }
            let Some((_, v)) = next else { break };
            if !send_view(&conn, &ctx, v).await.0 {
                ok = false;
                break;
            }
        }
        if !ok {
            conn.broken.set(true);
            conn.reader.notify();
            return;
        }
        ctx.stats.bytes_written.fetch_add(total as u64, Relaxed);
        // A burst's buffer is not kept: the queue and this one would
        // both hold its size for the life of the connection.
        spare.bytes = if buf.capacity() > OUT_HIGH_BYTES { Vec::new() } else { buf };
        spare.clear();
        conn.sending_bytes.set(spare.memory());
    }
}

fn key_hash(k: &[u8]) -> u64 {
    granary_format::hash::key_hash(k)
}

fn flight_of(req: &Request, seq: u64, body_bytes: usize) -> Flight {
    let (keys, write, barrier) = match req {
        Request::Get(k) => (vec![key_hash(k)], false, false),
        Request::Put { key, .. } => (vec![key_hash(key)], true, false),
        Request::Delete(k) => (vec![key_hash(k)], true, false),
        Request::MultiGet(ks) => (ks.iter().map(|k| key_hash(k)).collect(), false, false),
        Request::Batch(ops) => {
            (ops.iter().map(|o| key_hash(o.key())).collect(), ops.iter().any(|o| o.is_write()), false)
        }
        Request::Stats => (Vec::new(), false, false),
        Request::Nop => (Vec::new(), false, true),
    };
    let mut keys = keys;
    keys.sort_unstable();
    keys.dedup();
    Flight { seq, keys, write, barrier, body_bytes }
}

/// The status and message a store error maps to.
fn status_of(e: &StoreError) -> Status {
    match e {
        StoreError::KeyLength { .. } | StoreError::ReservedKey => Status::KeyInvalid,
        StoreError::ValueTooLarge { .. } => Status::ValueTooLarge,
        StoreError::NoSpace { .. } | StoreError::IndexFull(_) => Status::NoSpace,
        StoreError::Poisoned { .. } => Status::ReadOnly,
        StoreError::Io { .. } | StoreError::Device(_) => Status::IoError,
        StoreError::Corruption { .. } => Status::Corruption,
        _ => Status::Internal,
    }
}

/// Outcome of one key operation: status and bytes (value or message).
type Outcome = (Status, Vec<u8>);

fn failed(ctx: &Ctx, e: StoreError) -> Outcome {
    let s = status_of(&e);
    if matches!(s, Status::IoError | Status::Corruption | Status::Internal | Status::ReadOnly) {
        tracing::warn!(error = %e, "native request failed");
    }
    ctx.stats.errors.fetch_add(1, Relaxed);
    (s, e.to_string().into_bytes())
}

async fn do_get(ctx: &Ctx, key: &[u8]) -> Outcome {
    ctx.stats.gets.fetch_add(1, Relaxed);
    match ctx.store.get_async(key).await {
        Ok(Some(v)) => {
            ctx.stats.get_hits.fetch_add(1, Relaxed);
            (Status::Ok, v)
        }
        Ok(None) => (Status::NotFound, Vec::new()),
        Err(e) => failed(ctx, e),
    }
}

async fn do_put(ctx: &Ctx, key: &[u8], value: &[u8], mode: PutMode) -> Outcome {
    ctx.stats.puts.fetch_add(1, Relaxed);
    if value.len() > ctx.cfg.value_bytes_max as usize {
        ctx.stats.errors.fetch_add(1, Relaxed);
        let msg = format!("value of {} bytes exceeds the server's limit of {}", value.len(), ctx.cfg.value_bytes_max);
        return (Status::ValueTooLarge, msg.into_bytes());
    }
    let m = match mode {
        PutMode::Upsert => granary_store::PutMode::Upsert,
        PutMode::CreateOnly => granary_store::PutMode::CreateOnly,
        PutMode::ReplaceOnly => granary_store::PutMode::ReplaceOnly,
    };
    match ctx.store.put_with_async(key, value, m).await {
        Ok(granary_store::PutOutcome::Stored) => (Status::Ok, Vec::new()),
        Ok(granary_store::PutOutcome::Exists) => (Status::Exists, Vec::new()),
        Ok(granary_store::PutOutcome::NotFound) => (Status::NotFound, Vec::new()),
        Err(e) => failed(ctx, e),
    }
}

/// A PUT whose value was received into its record buffer.
async fn do_put_buf(ctx: &Ctx, pb: PutBuf, mode: PutMode) -> Outcome {
    ctx.stats.puts.fetch_add(1, Relaxed);
    ctx.stats.zero_copy_puts.fetch_add(1, Relaxed);
    let cond = match mode {
        PutMode::Upsert => granary_store::Cond::Always,
        PutMode::CreateOnly => granary_store::Cond::Absent,
        PutMode::ReplaceOnly => granary_store::Cond::Present,
    };
    match ctx.store.put_buf_async(pb, granary_store::ItemMeta::default(), cond).await {
        Ok((granary_store::PutOutcome::Stored, _)) => (Status::Ok, Vec::new()),
        Ok((granary_store::PutOutcome::Exists, _)) => (Status::Exists, Vec::new()),
        Ok((granary_store::PutOutcome::NotFound, _)) => (Status::NotFound, Vec::new()),
        Err(e) => failed(ctx, e),
    }
}

async fn do_delete(ctx: &Ctx, key: &[u8]) -> Outcome {
    ctx.stats.deletes.fetch_add(1, Relaxed);
    match ctx.store.delete_async(key).await {
        Ok(true) => (Status::Ok, Vec::new()),
        Ok(false) => (Status::NotFound, Vec::new()),
        Err(e) => failed(ctx, e),
    }
}

/// Execute one (already validated) request and append its response.
async fn execute(ctx: &Ctx, h: Header, body: &[u8], resp: &mut Out) {
    let req = match Request::decode(&h, body) {
        Ok(r) => r,
        // Decoded once already by the reader; cannot fail here.
        Err(e) => return proto::encode_response(&mut resp.bytes, h.op, Status::Internal, h.id, e.0.as_bytes()),
    };
    let single = |out: &mut Vec<u8>, (s, b): Outcome| proto::encode_response(out, h.op, s, h.id, &b);
    let out = &mut resp.bytes;
    match req {
        Request::Get(k) => {
            // The value is sent from the buffer it was read into when it
            // is large enough for that to beat a copy.
            ctx.stats.gets.fetch_add(1, Relaxed);
            match ctx.store.get_buf_async(k).await {
                Ok(Some(v)) => {
                    ctx.stats.get_hits.fetch_add(1, Relaxed);
                    if v.len() >= ZERO_COPY_MIN_BYTES {
                        proto::encode_response_header(out, h.op, Status::Ok, h.id, v.len());
                        resp.push_value(v);
                        ctx.stats.zero_copy_gets.fetch_add(1, Relaxed);
                    } else {
                        proto::encode_response(out, h.op, Status::Ok, h.id, v.value());
                    }
                }
                Ok(None) => single(out, (Status::NotFound, Vec::new())),
                Err(e) => single(out, failed(ctx, e)),
            }
        }
        Request::Put { key, value, mode } => single(out, do_put(ctx, key, value, mode).await),
        Request::Delete(k) => single(out, do_delete(ctx, k).await),
        Request::MultiGet(keys) => {
            ctx.stats.multi_gets.fetch_add(1, Relaxed);
            let mut b = Vec::new();
            proto::encode_count(&mut b, keys.len());
            let n = keys.len();
            for (i, k) in keys.into_iter().enumerate() {
                let (s, v) = do_get(ctx, k).await;
                push_entry(ctx, &mut b, s, &v, n - i - 1);
            }
            proto::encode_response(out, h.op, Status::Ok, h.id, &b);
        }
        Request::Batch(ops) => {
            ctx.stats.batches.fetch_add(1, Relaxed);
            let mut b = Vec::new();
            proto::encode_count(&mut b, ops.len());
            let n = ops.len();
            for (i, o) in ops.into_iter().enumerate() {
                let (s, v) = match o {
                    proto::BatchOp::Get(k) => do_get(ctx, k).await,
                    proto::BatchOp::Put { key, value, mode } => do_put(ctx, key, value, mode).await,
                    proto::BatchOp::Delete(k) => do_delete(ctx, k).await,
                };
                push_entry(ctx, &mut b, s, &v, n - i - 1);
            }
            proto::encode_response(out, h.op, Status::Ok, h.id, &b);
        }
        Request::Nop => {
            ctx.stats.nops.fetch_add(1, Relaxed);
            proto::encode_response(out, h.op, Status::Ok, h.id, &[]);
        }
        Request::Stats => {
            ctx.stats.stats.fetch_add(1, Relaxed);
            let mut b = Vec::new();
            proto::encode_stats(&mut b, &stats_pairs(ctx));
            proto::encode_response(out, h.op, Status::Ok, h.id, &b);
        }
    }
}

/// Append an MGET/BATCH entry, keeping room for the `after` entries still
/// to come (5 bytes each at least). A value that would take the response
/// past the frame limit is replaced by a `VALUE_TOO_LARGE` entry (fetch it
/// alone), whose message is dropped too if even that does not fit.
fn push_entry(ctx: &Ctx, body: &mut Vec<u8>, s: Status, v: &[u8], after: usize) {
    let max = ctx.frame_max as usize;
    let room = |extra: usize| body.len() + 4 + 5 + extra + 5 * after <= max;
    if room(v.len()) {
        return proto::encode_entry(body, s, v);
    }
    ctx.stats.errors.fetch_add(1, Relaxed);
    let msg = format!("this value would take the response past the frame limit of {max} bytes; get it alone");
    let msg: &[u8] = if room(msg.len()) { msg.as_bytes() } else { &[] };
    proto::encode_entry(body, Status::ValueTooLarge, msg);
}

fn stats_pairs(ctx: &Ctx) -> Vec<(String, String)> {
    let s = &ctx.stats;
    let st = ctx.store.stats();
    let mut v: Vec<(String, String)> = Vec::new();
    let mut add = |k: &str, x: String| v.push((k.to_string(), x));
    add("version", env!("CARGO_PKG_VERSION").to_string());
    add("uptime", ctx.started.elapsed().as_secs().to_string());
    add("curr_connections", s.connections.open().to_string());
    add("total_connections", s.total_connections.load(Relaxed).to_string());
    add("rejected_connections", s.rejected_connections.load(Relaxed).to_string());
    add("bad_frames", s.bad_frames.load(Relaxed).to_string());
    add("idle_kicks", s.idle_kicks.load(Relaxed).to_string());
    add("cmd_get", s.gets.load(Relaxed).to_string());
    add("get_hits", s.get_hits.load(Relaxed).to_string());
    add("cmd_put", s.puts.load(Relaxed).to_string());
    add("cmd_delete", s.deletes.load(Relaxed).to_string());
    add("cmd_mget", s.multi_gets.load(Relaxed).to_string());
    add("cmd_batch", s.batches.load(Relaxed).to_string());
    add("cmd_nop", s.nops.load(Relaxed).to_string());
    add("errors", s.errors.load(Relaxed).to_string());
    add("bytes_read", s.bytes_read.load(Relaxed).to_string());
    add("bytes_written", s.bytes_written.load(Relaxed).to_string());
    add("conn_buffer_bytes_max", s.conn_buffer_bytes_max.load(Relaxed).to_string());
    add("conns_waiting_to_send", s.conns_waiting_to_send.load(Relaxed).to_string());
    add("conns_paused", s.conns_paused.load(Relaxed).to_string());
    add("zero_copy_gets", s.zero_copy_gets.load(Relaxed).to_string());
    add("zero_copy_puts", s.zero_copy_puts.load(Relaxed).to_string());
    for op in OPS {
        let l = s.op_latency(op).snapshot();
        if l.count() > 0 {
            let name = op.name().to_ascii_lowercase();
            add(&format!("latency_{name}_count"), l.count().to_string());
            add(&format!("latency_{name}_mean_us"), format!("{:.1}", l.mean_ns() as f64 / 1e3));
            let us = |q: f64| l.quantile_ns(q).map_or(0.0, |ns| ns as f64 / 1e3);
            add(&format!("latency_{name}_p99_us"), format!("{:.1}", us(0.99)));
        }
    }
    add("value_bytes_max", ctx.cfg.value_bytes_max.to_string());
    add("keys", st.keys.to_string());
    add("segments", st.segments.to_string());
    add("segments_free", st.segments_free.to_string());
    add("live_bytes", st.live_bytes.to_string());
    add("write_amplification", format!("{:.3}", st.write_amplification()));
    add("evicting", (ctx.store.evicts() as u8).to_string());
    v
}
