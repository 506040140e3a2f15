//! One native connection, from the hello to the close: the reader, which
//! parses frames and starts requests in order; one task per started
//! request (so pipelined requests run concurrently and reach the device
//! together); and the writer, which sends responses as they are ready.
//! All run on the connection's executor and share a [`Conn`].
//!
//! Invariants:
//! - requests start in the order they were sent; one starts only when no
//!   earlier request still running conflicts with it (`exec::Flight`), and
//!   while the connection's in-flight limits allow ([`INFLIGHT_MAX`],
//!   [`INFLIGHT_BYTES_MAX`]; a single larger request runs alone);
//! - nothing starts while [`OUT_HIGH_BYTES`] of responses wait for a
//!   client that does not read (the connection counts in `conns_paused`);
//! - a malformed frame is answered with an error frame, after the
//!   responses of the requests before it, and the connection closes;
//! - a request whose task ends without its response (a panic, which the
//!   executor contains) is never left for the client to wait on: nothing
//!   more starts, the responses of the requests running are sent, and
//!   the connection closes;
//! - at the end (client closed, error, idle timeout, drain) every started
//!   request finishes and its response is sent before the connection
//!   closes, unless sending failed;
//! - the memory a connection holds is bounded as
//!   [`crate::limits::connection_bytes_bound`] states, and its high-water
//!   mark is kept in `conn_buffer_bytes_max`.

use crate::exec::{self, Ctx, Flight, Job, Out, Scope};
use crate::limits::*;
use crate::parse::{self, FrameError, LargePut};
use crate::NativeStats;
use granary_proto::{self as proto, ClientHello, Header, Op, ServerHello, Status};
use granary_rt::net::GaugeHold;
use granary_rt::sync::Notify;
use granary_server::{Session, Stream};
use granary_store::{PutBuf, ReceiveEnd, ValueBuf};
use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

/// Read `n` bytes (None: the client closed first).
async fn read_exact(stream: &Stream, n: usize) -> io::Result<Option<Vec<u8>>> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        let (r, b) = stream.recv(vec![0u8; n - got.len()]).await;
        match r? {
            0 => return Ok(None),
            k => got.extend_from_slice(&b[..k]),
        }
    }
    Ok(Some(got))
}

/// Read the client's hello (and the token it carries, if any) and answer
/// with `status` (or `UnsupportedVersion`, or `Unauthorized` when the
/// server requires a token and the hello carried none or another): the
/// highest version both speak. Ok(Some(that version)) if the connection
/// goes on. A refused connection is answered here too, with `Busy`.
pub(crate) async fn hello(stream: &Stream, ctx: &Ctx, status: Status) -> io::Result<Option<u16>> {
    let read = async {
        let Some(got) = read_exact(stream, proto::CLIENT_HELLO_BYTES).await? else {
            return Ok(None);
        };
        let mut arr = [0u8; proto::CLIENT_HELLO_BYTES];
        arr.copy_from_slice(&got);
        let (client, token_len) = match ClientHello::decode_with_token(&arr) {
            Ok(c) => c,
            Err(e) => return Ok(Some(Err(e))),
        };
        let token = if token_len > 0 {
            match read_exact(stream, token_len).await? {
                Some(t) => Some(t),
                None => return Ok(None),
            }
        } else {
            None
        };
        Ok::<_, io::Error>(Some(Ok((client, token))))
    };
    let (client, token) = match granary_rt::timeout(HELLO_TIMEOUT, read).await {
        Ok(Ok(Some(Ok(h)))) => h,
        Ok(Ok(Some(Err(e)))) => {
            ctx.stats.bad_frames.fetch_add(1, Relaxed);
            tracing::info!(error = %e, "native connection closed: bad hello");
            return Ok(None);
        }
        Ok(r) => return r.map(|_| None),
        Err(_) => {
            tracing::info!("native connection closed: no hello within {HELLO_TIMEOUT:?}");
            return Ok(None);
        }
    };
    let authorized = match (&ctx.token, &token) {
        (None, _) => true,
        (Some(want), Some(got)) => granary_server::auth::secret_eq(want, got),
        (Some(_), None) => false,
    };
    // An unauthorized client learns nothing else (not even whether its
    // versions would do).
    let (version, status) = match (client.agree(), status) {
        (_, Status::Ok) if !authorized => (0, Status::Unauthorized),
        (Some(v), s) => (v, s),
        (None, _) => (0, Status::UnsupportedVersion),
    };
    let sh = ServerHello {
        version,
        status,
        key_bytes_max: proto::KEY_BYTES_MAX as u32,
        value_bytes_max: ctx.limits.value_bytes_max,
        frame_bytes_max: ctx.limits.frame_max,
    };
    let (r, _) = stream.send_all(sh.encode().to_vec()).await;
    r?;
    match status {
        Status::UnsupportedVersion => tracing::info!(
            min = client.min_version,
            max = client.max_version,
            "native connection closed: no common version"
        ),
        Status::Unauthorized => {
            ctx.stats.auth_failures.fetch_add(1, Relaxed);
            tracing::info!(token = token.is_some(), "native connection closed: missing or wrong token");
        }
        _ => {}
    }
    Ok((status == Status::Ok).then_some(version))
}

/// Serve one admitted connection until it ends.
pub(crate) async fn serve(session: Session, ctx: Arc<Ctx>) {
    let version = match hello(session.stream(), &ctx, Status::Ok).await {
        Ok(Some(v)) => v,
        _ => return,
    };
    let conn = Rc::new(Conn {
        session,
        scope: Scope::new(&ctx.store, version),
        out: RefCell::new(Out::default()),
        flights: RefCell::new(Vec::new()),
        reader: Notify::default(),
        writer: Notify::default(),
        ending: Cell::new(false),
        broken: Cell::new(false),
        stopped: Cell::new(false),
        input_bytes: Cell::new(0),
        sending_bytes: Cell::new(0),
    });
    let writer = granary_rt::spawn(write_loop(conn.clone(), ctx.clone()));
    let bad = read_loop(&conn, &ctx).await;
    // Let started requests finish, then the writer sends what is left: a
    // malformed frame's error comes after the responses to every request
    // before it.
    while !conn.flights.borrow().is_empty() {
        conn.reader.wait().await;
    }
    if let Some(e) = bad {
        bad_frame(&conn, &ctx, e);
    }
    conn.ending.set(true);
    conn.writer.notify();
    let _ = writer.await;
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

/// One connection's shared state.
struct Conn {
    /// The socket, with the lifecycle's idle timeout and counters.
    session: Session,
    /// The version spoken, and the namespaces its requests named.
    scope: Scope,
    out: RefCell<Out>,
    /// The requests running, in the order they started.
    flights: RefCell<Vec<Flight>>,
    /// Wakes the reader (a request ended, the writer drained).
    reader: Notify,
    /// Wakes the writer (responses are waiting, or the end).
    writer: Notify,
    /// The reader is done; the writer exits once the output is sent.
    ending: Cell<bool>,
    /// Sending failed; nothing more is sent.
    broken: Cell<bool>,
    /// A request's task ended without its response (it panicked: a bug
    /// the executor contains): nothing more starts, the requests running
    /// finish and their responses are sent, then the connection closes,
    /// so that the client sees the end of the stream rather than wait.
    stopped: Cell<bool>,
    /// Bytes the reader holds (input buffer and read chunk).
    input_bytes: Cell<usize>,
    /// Capacity of the buffer the writer is sending.
    sending_bytes: Cell<usize>,
}

impl Conn {
    fn stream(&self) -> &Stream {
        self.session.stream()
    }
    /// Note the connection's buffer memory in the high-water mark.
    fn account(&self, stats: &NativeStats) {
        let out = self.out.borrow().memory();
        stats.buffer_bytes(self.input_bytes.get() + self.inflight_bytes() + out + self.sending_bytes.get());
    }
    fn inflight_bytes(&self) -> usize {
        self.flights.borrow().iter().map(|f| f.body_bytes).sum()
    }
    /// Whether `f` may start, or why it must wait. This is where a
    /// connection's requests are ordered: `f` waits for every running
    /// request it conflicts with (all of them started before it).
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
fn bad_frame(conn: &Conn, ctx: &Ctx, e: FrameError) {
    ctx.stats.bad_frames.fetch_add(1, Relaxed);
    let peer = conn.stream().peer_addr().map(|a| a.to_string()).unwrap_or_default();
    tracing::info!(%peer, reason = e.reason.as_str(), "native connection closed: bad frame");
    proto::encode_response(&mut conn.out.borrow_mut().bytes, Op::Nop, e.status, e.id, e.reason.as_bytes());
}

/// Receive the rest of `pb`'s value from the socket, straight into it;
/// None if the connection ended (closed, error, idle timeout). The bytes
/// and an idle timeout are counted as [`Session::recv`] counts them.
async fn receive_into(session: &Session, pb: PutBuf) -> Option<PutBuf> {
    let r = pb.receive(session.stream(), session.idle_timeout(), |n| session.count_read(n)).await;
    if matches!(r, Err(ReceiveEnd::Idle)) {
        session.count_idle_kick();
    }
    r.ok()
}

/// Wait until `flight` may start, then run `job` in a task of its own.
/// False if the connection broke meanwhile.
async fn start_request(conn: &Rc<Conn>, ctx: &Arc<Ctx>, h: Header, job: Job, flight: Flight, started: Instant) -> bool {
    loop {
        let admit = conn.admit(&flight);
        if admit == Admit::Start || conn.broken.get() || conn.stopped.get() {
            break;
        }
        let _paused = (admit == Admit::Paused).then(|| GaugeHold::new(&ctx.stats.conns_paused));
        conn.reader.wait().await;
    }
    if conn.broken.get() || conn.stopped.get() {
        return false;
    }
    let seq = flight.seq;
    conn.flights.borrow_mut().push(flight);
    let (c, x) = (conn.clone(), ctx.clone());
    granary_rt::spawn(async move {
        // Ends the flight however the task ends; one that ends without
        // its response stops the connection (`Conn::stopped`).
        struct Done(Rc<Conn>, u64, bool);
        impl Drop for Done {
            fn drop(&mut self) {
                let c = &self.0;
                if !self.2 {
                    // Dropped while unwinding: the task panicked. Otherwise
                    // its runtime is stopping, which ends the connection.
                    if std::thread::panicking() {
                        tracing::warn!("a native request's task panicked before its response: closing its connection");
                    }
                    c.stopped.set(true);
                    // Ends a receive the reader waits in.
                    let _ = c.stream().tcp().shutdown_read();
                }
                c.finish(self.1);
            }
        }
        let mut done = Done(c, seq, false);
        let mut resp = Out::default();
        exec::run(&x, &done.0.scope, h, job, &mut resp).await;
        done.2 = true;
        done.0.out.borrow_mut().append(resp);
        x.stats.op_latency(h.op).since(started);
        done.0.account(&x.stats);
    });
    conn.account(&ctx.stats);
    true
}

/// Read frames and start their requests, in order, until the connection
/// ends or a frame is malformed (returned, for its error frame to follow
/// the responses to the requests before it).
async fn read_loop(conn: &Rc<Conn>, ctx: &Arc<Ctx>) -> Option<FrameError> {
    let session = &conn.session;
    // The input grows with what comes and goes while the client is idle.
    let mut input: Vec<u8> = Vec::new();
    let chunk_bytes = granary_server::READ_CHUNK_BYTES;
    let mut seq = 0u64;
    conn.input_bytes.set(chunk_bytes);
    loop {
        // Start every complete request in the input.
        let mut pos = 0;
        loop {
            let rest = &input[pos..];
            let h = match parse::header(rest, &ctx.limits, conn.scope.version) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => return Some(e),
            };
            let started = Instant::now();
            // A large PUT: its value goes from the socket into the record
            // buffer the device writes, not through the input buffer.
            let mut put = None;
            match parse::large_put(&h, rest, &ctx.limits) {
                LargePut::Incomplete => break,
                LargePut::Yes { ns, key, mode, value_at, value_len } => {
                    // A buffer the store refuses (a reserved key, a
                    // namespace that does not exist yet: an NS_CREATE
                    // before it may not have run) leaves the frame to the
                    // ordinary path, whose response says why.
                    let built = conn.scope.resolve(&ctx.store, ns).ok().and_then(|handle| {
                        // The id first: a truncate between the two makes
                        // the write build the buffer again, never miss it.
                        let id = handle.stats().ok()?.id;
                        let pb = handle.new_put_buf(key, value_len).ok()?;
                        Some((handle, id, pb))
                    });
                    if let Some((handle, id, mut pb)) = built {
                        let have = (rest.len() - value_at).min(value_len);
                        pb.fill_from(&rest[value_at..value_at + have]);
                        pos += value_at + have;
                        put = Some(exec::LargePut { pb, mode, ns: handle, id, name: ns.into(), key: key.into() });
                    }
                }
                LargePut::No => {}
            }
            let (job, flight) = match put {
                Some(mut p) => {
                    conn.input_bytes.set(input.capacity() + chunk_bytes + p.pb.value_len());
                    let pb = receive_into(session, p.pb).await?; // the connection ended
                    p.pb = pb;
                    let flight = Flight::put(&p.name, &p.key, seq, p.pb.value_len());
                    (Job::Put(p), flight)
                }
                None => match parse::request(&h, rest, conn.scope.version) {
                    Ok(Some((ns, req, body))) => {
                        let flight = Flight::of(&req, ns, seq, body.len());
                        pos += parse::frame_len(&h);
                        (Job::Frame(body.to_vec()), flight)
                    }
                    Ok(None) => break,
                    Err(e) => return Some(e),
                },
            };
            if !start_request(conn, ctx, h, job, flight, started).await {
                return None;
            }
            seq += 1;
        }
        input.drain(..pos);
        // Ends the loop once the client closes, the idle timeout passes or
        // the listener drains (what was read is done; nothing more is).
        if session.recv_into(&mut input).await.is_err() {
            return None;
        }
        conn.input_bytes.set(input.capacity() + chunk_bytes);
        conn.account(&ctx.stats);
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
    let mut off = match conn.stream().try_send(b.view()) {
        Ok(k) => k,
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => 0,
        Err(_) => return (false, b),
    };
    if off < n {
        let _waiting = GaugeHold::new(&ctx.stats.conns_waiting_to_send);
        while off < n {
            let (r, back) = conn.stream().send_from(b, off).await;
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

/// Send responses as they are queued, until the reader is done and the
/// queue is empty, or sending fails.
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
