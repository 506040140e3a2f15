//! Transmission on one connection, after the handshake: the reader, which
//! decodes requests, admits them within the connection's limits and
//! starts each in a task of its own (so a client's queue of requests
//! reaches the export together); the request tasks (`exec`); and the
//! writer, which sends replies as they complete, in whatever order that
//! is (each carries its request's cookie). All run on the connection's
//! executor and share a [`Conn`].
//!
//! Invariants:
//! - at most [`INFLIGHT_MAX`] requests, holding at most
//!   [`INFLIGHT_BYTES_MAX`] of payload (WRITE data, READ replies; one
//!   larger request runs alone), are admitted at once, from admission
//!   until the writer has handed their reply to the socket; the reader
//!   reads no further request until one leaves, so a client that does not
//!   read its replies stops being read;
//! - a WRITE's data is allocated only once the request is admitted and
//!   its length checked against [`PAYLOAD_BYTES_MAX`];
//! - a malformed request (a bad magic, a WRITE larger than the maximum
//!   payload) ends the reading at once, touching no data: it is counted in
//!   `protocol_errors` and the connection closes once the requests before
//!   it are answered; an unknown command, or a request that fails its
//!   checks, is answered with an error and the connection goes on;
//! - at the end (`NBD_CMD_DISC`, the client closing, an error, the idle
//!   timeout, a drain) every started request runs to its end and its reply
//!   is sent before the connection closes, unless sending failed or a
//!   request task ended without its reply (it panicked: the connection is
//!   then closed at once, so its client is not left waiting).

use crate::exec::{self, Target};
use crate::export::Export;
use crate::limits::*;
use crate::proto::*;
use crate::NbdStats;
use granary_rt::sync::Notify;
use granary_server::Session;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// A reply ready to send, and the payload bytes its request holds.
struct Reply {
    bytes: Vec<u8>,
    charge: usize,
}

/// One connection's shared state.
struct Conn<E> {
    /// The socket, with the lifecycle's idle timeout and counters.
    session: Session,
    target: Target<E>,
    stats: Arc<NbdStats>,
    /// Replies waiting for the writer.
    out: RefCell<VecDeque<Reply>>,
    /// Requests admitted and not yet answered on the socket, and their
    /// payload bytes.
    admitted: Cell<usize>,
    admitted_bytes: Cell<usize>,
    /// Request tasks not yet ended.
    running: Cell<usize>,
    /// Wakes the reader (a reply was sent, a request ended).
    reader: Notify,
    /// Wakes the writer (replies are waiting, or the end).
    writer: Notify,
    /// The reader is done and every request has ended: the writer exits
    /// once the replies are sent.
    ending: Cell<bool>,
    /// Sending failed, or a request ended without its reply; nothing more
    /// is sent or admitted.
    broken: Cell<bool>,
}

impl<E> Conn<E> {
    /// Wait until a request holding `charge` payload bytes may be admitted
    /// and admit it; false if the connection broke meanwhile.
    async fn admit(&self, charge: usize) -> bool {
        loop {
            if self.broken.get() {
                return false;
            }
            let n = self.admitted.get();
            if n == 0 || (n < INFLIGHT_MAX && self.admitted_bytes.get() + charge <= INFLIGHT_BYTES_MAX) {
                break;
            }
            self.reader.wait().await;
        }
        self.admitted.set(self.admitted.get() + 1);
        self.admitted_bytes.set(self.admitted_bytes.get() + charge);
        granary_rt::net::raise_high_water(&self.stats.inflight_max, self.admitted.get() as u64);
        true
    }

    /// A request leaves (its reply sent, or never to be).
    fn release(&self, count: usize, charge: usize) {
        self.admitted.set(self.admitted.get() - count);
        self.admitted_bytes.set(self.admitted_bytes.get() - charge);
        self.reader.notify();
    }
}

/// Counts a request task as running while it lives, however it ends.
struct Running<'a, E>(&'a Conn<E>);

impl<E> Drop for Running<'_, E> {
    fn drop(&mut self) {
        self.0.running.set(self.0.running.get() - 1);
        self.0.reader.notify();
    }
}

/// Serve transmission on `session` for the export the handshake chose,
/// until the connection ends.
pub(crate) async fn transmit<E: Export>(session: Session, target: Target<E>, stats: Arc<NbdStats>) {
    let conn = Rc::new(Conn {
        session,
        target,
        stats,
        out: RefCell::new(VecDeque::new()),
        admitted: Cell::new(0),
        admitted_bytes: Cell::new(0),
        running: Cell::new(0),
        reader: Notify::default(),
        writer: Notify::default(),
        ending: Cell::new(false),
        broken: Cell::new(false),
    });
    let writer = granary_rt::spawn(write_loop(conn.clone()));
    if let Err(why) = read_loop(&conn).await {
        conn.stats.protocol_errors.fetch_add(1, Relaxed);
        let peer = conn.session.stream().peer_addr().map(|a| a.to_string()).unwrap_or_default();
        tracing::info!(%peer, why, "NBD connection closed: malformed request");
    }
    // Let started requests end, then the writer sends what is left.
    while conn.running.get() > 0 {
        conn.reader.wait().await;
    }
    conn.ending.set(true);
    conn.writer.notify();
    let _ = writer.await;
}

/// Start `req` in a task of its own; its reply goes to the writer.
fn start<E: Export>(conn: &Rc<Conn<E>>, req: Request, payload: Option<Vec<u8>>, charge: usize) {
    conn.running.set(conn.running.get() + 1);
    let c = conn.clone();
    granary_rt::spawn(async move {
        let _running = Running(&c);
        let mut unanswered = Unanswered { conn: &c, charge, armed: true };
        let bytes = exec::execute(&c.target, &c.stats, req, payload).await;
        unanswered.armed = false;
        c.out.borrow_mut().push_back(Reply { bytes, charge });
        c.writer.notify();
    });
}

/// A request task that ends without its reply (it panicked, a bug the
/// executor contains, or its runtime stopped) must not leave its client
/// waiting for that reply: the connection ends (the client sees the end
/// of the stream, and the reader's receive ends) and the request's
/// admission is released.
struct Unanswered<'a, E> {
    conn: &'a Conn<E>,
    charge: usize,
    armed: bool,
}

impl<E> Drop for Unanswered<'_, E> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let c = self.conn;
        // Dropped while unwinding: the task panicked (a bug). Otherwise its
        // runtime is stopping, which ends the connection anyway.
        if std::thread::panicking() {
            tracing::warn!("an NBD request's task panicked before its reply: closing its connection");
        }
        c.broken.set(true);
        let _ = c.session.stream().tcp().shutdown_both();
        c.release(1, self.charge);
        c.writer.notify();
    }
}

/// Read requests and start them until the connection ends (`Ok`) or a
/// request is malformed (`Err`, why).
async fn read_loop<E: Export>(conn: &Rc<Conn<E>>) -> Result<(), &'static str> {
    let session = &conn.session;
    let mut input: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    loop {
        let mut pos = 0;
        while input.len() - pos >= REQUEST_BYTES {
            let req = Request::decode(&input[pos..pos + REQUEST_BYTES]);
            if req.magic != REQUEST_MAGIC {
                return Err("bad request magic");
            }
            pos += REQUEST_BYTES;
            match req.kind {
                // What was sent before is answered; nothing after is read.
                CMD_DISC => return Ok(()),
                CMD_WRITE => {
                    if req.len > PAYLOAD_BYTES_MAX {
                        return Err("WRITE larger than the maximum payload");
                    }
                    let len = req.len as usize;
                    if !conn.admit(len).await {
                        return Ok(());
                    }
                    let have = (input.len() - pos).min(len);
                    let mut payload = Vec::with_capacity(len);
                    payload.extend_from_slice(&input[pos..pos + have]);
                    pos += have;
                    if have < len {
                        // The input is used up: the rest of the data goes
                        // from the socket straight into the payload.
                        match receive_rest(session, payload, len).await {
                            Some(p) => payload = p,
                            None => {
                                conn.release(1, len);
                                return Ok(());
                            }
                        }
                    }
                    start(conn, req, Some(payload), len);
                }
                _ => {
                    // Only a READ has a reply payload (a larger one is
                    // refused unread, holding nothing).
                    let charge = match req.kind {
                        CMD_READ if req.len <= PAYLOAD_BYTES_MAX => req.len as usize,
                        _ => 0,
                    };
                    if !conn.admit(charge).await {
                        return Ok(());
                    }
                    start(conn, req, None, charge);
                }
            }
        }
        input.drain(..pos);
        // Ends the loop once the client closes, the idle timeout passes or
        // the listener drains (what was read is done; nothing more is).
        let Ok((n, c)) = session.recv(chunk).await else { return Ok(()) };
        chunk = c;
        input.extend_from_slice(&chunk[..n]);
    }
}

/// The part of a buffer's capacity from `from` to `want`, as a buffer
/// the ring can receive into. On a plain socket it is spare capacity,
/// never zeroed (a WRITE's payload is up to 32 MiB); on TLS, whose
/// receive makes a slice of it, initialised bytes.
struct Tail {
    buf: Vec<u8>,
    from: usize,
    want: usize,
}

// SAFETY: from <= want <= buf.capacity() (`receive_rest` reserves the
// capacity and only moves `from` by what a receive wrote); the pointer is
// into the Vec's heap buffer, which does not move with the Tail (it is not
// reallocated while a receive is in flight). Bytes past the Vec's length
// are uninitialised: a Tail has them only on a plain socket, whose receive
// the kernel writes and nothing reads; on TLS `receive_rest` zeroes the
// whole payload first.
unsafe impl granary_rt::IoBuf for Tail {
    fn stable_ptr(&mut self) -> *mut u8 {
        self.buf.as_mut_ptr().wrapping_add(self.from)
    }
    fn buf_len(&self) -> usize {
        self.want - self.from
    }
}

/// Receive the rest of a WRITE's data (`payload` holds its first bytes)
/// until it is `len` bytes; None if the connection ended meanwhile
/// (closed, failed, idle timeout). Bytes and an idle timeout are counted
/// as [`Session::recv`] counts them.
async fn receive_rest(session: &Session, mut payload: Vec<u8>, len: usize) -> Option<Vec<u8>> {
    let mut have = payload.len();
    if session.stream().is_tls() {
        payload.resize(len, 0);
    } else {
        payload.reserve_exact(len - have);
    }
    while have < len {
        let tail = Tail { buf: payload, from: have, want: len };
        match session.stream().recv_within(tail, session.idle_timeout()).await {
            Err(_) => {
                session.count_idle_kick();
                return None;
            }
            Ok((Ok(0), _)) => return None,
            Ok((Ok(n), mut t)) => {
                session.count_read(n);
                have += n.min(len - have);
                if t.buf.len() < have {
                    // SAFETY: the receive wrote bytes `from..have` (at most
                    // the tail's length, within the capacity), and the
                    // bytes before `from` were initialised already.
                    unsafe { t.buf.set_len(have) };
                }
                payload = t.buf;
            }
            Ok((Err(e), t)) if e.kind() == io::ErrorKind::Interrupted => payload = t.buf,
            Ok((Err(_), _)) => return None,
        }
    }
    Some(payload)
}

/// Send all of `buf`: directly when the socket takes it, through the ring
/// (waiting for room) otherwise. False if the connection failed.
async fn send_buf<E>(conn: &Conn<E>, buf: Vec<u8>) -> (bool, Vec<u8>) {
    let stream = conn.session.stream();
    let n = buf.len();
    let mut off = match stream.try_send(&buf) {
        Ok(k) => k,
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => 0,
        Err(_) => return (false, buf),
    };
    let mut buf = buf;
    while off < n {
        let (r, back) = stream.send_from(buf, off).await;
        buf = back;
        match r {
            Ok(0) => return (false, buf),
            Ok(k) => off += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return (false, buf),
        }
    }
    conn.stats.bytes_sent.fetch_add(n as u64, Relaxed);
    (true, buf)
}

/// Send replies as they are queued, until the connection ends and none is
/// left, or sending fails. Small replies are copied into one buffer and
/// sent together; a large one (a READ's data) goes from its own buffer.
/// Send the replies gathered in `batch` and release what their requests
/// hold (`batched`: their count and payload charge, then zeroed); `batch`
/// is left empty, its allocation kept. False if sending failed.
async fn send_batch<E>(conn: &Conn<E>, batch: &mut Vec<u8>, batched: &mut (usize, usize)) -> bool {
    let (ok, b) = send_buf(conn, std::mem::take(batch)).await;
    if !ok {
        return false;
    }
    *batch = b;
    batch.clear();
    conn.release(batched.0, batched.1);
    *batched = (0, 0);
    true
}

async fn write_loop<E>(conn: Rc<Conn<E>>) {
    let mut batch: Vec<u8> = Vec::new();
    // The count of replies in `batch` and their requests' payload charge.
    let mut batched = (0, 0);
    loop {
        let next = conn.out.borrow_mut().pop_front();
        let Some(reply) = next else {
            if !batch.is_empty() {
                if !send_batch(&conn, &mut batch, &mut batched).await {
                    break;
                }
                // A burst's buffer is not kept for the connection's life.
                if batch.capacity() > REPLY_COPY_BYTES_MAX * INFLIGHT_MAX {
                    batch = Vec::new();
                }
                continue;
            }
            if conn.ending.get() {
                return;
            }
            conn.writer.wait().await;
            continue;
        };
        if reply.bytes.len() <= REPLY_COPY_BYTES_MAX {
            batch.extend_from_slice(&reply.bytes);
            batched.0 += 1;
            batched.1 += reply.charge;
            continue;
        }
        if !batch.is_empty() {
            // The replies before it go first (no reason to delay them).
            if !send_batch(&conn, &mut batch, &mut batched).await {
                break;
            }
        }
        let charge = reply.charge;
        if !send_buf(&conn, reply.bytes).await.0 {
            break;
        }
        conn.release(1, charge);
    }
    conn.broken.set(true);
    conn.reader.notify();
}
