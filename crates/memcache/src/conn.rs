//! One connection: its input buffer, its reply buffer and its socket (a
//! [`Session`] of the shared lifecycle), and the request loop that frames
//! and parses each request, reads its data block (into the input buffer,
//! or for a large value straight into the engine's record buffer), has the
//! executor run it, and sends the replies.
//!
//! Its first byte chooses its protocol for good: [`binary::MAGIC_REQUEST`]
//! the binary protocol (`crate::binary`), anything else the text one.
//!
//! A connection reads into its input buffer, executes every complete
//! request in it in order (pipelining), buffers the replies and sends them
//! once the input holds no further complete request (or the reply buffer
//! passes [`OUT_FLUSH_BYTES`]).
//!
//! With an auth file (memcached's `-Y`) a connection speaks only the text
//! protocol, and runs nothing before its authentication `set` is accepted
//! (`Conn::step_auth`).
//!
//! Invariants:
//! - its memory stays within one request line, one value and the reply
//!   buffer ([`crate::limits::connection_bytes_bound`]), tracked in
//!   `conn_buffer_bytes_max`;
//! - every byte received is counted in `bytes_read` and every idle timeout
//!   in `idle_kicks` (by [`Session::recv`], and here around the zero-copy
//!   receive, which reads the socket itself);
//! - replies buffered before a wait for more input (a value being
//!   received) are sent first, so a client never waits on its own replies;
//! - once the listener drains, what was read is executed and answered and
//!   nothing more is read.

use crate::binary;
use crate::context::{command_index, Ctx};
use crate::exec::{Exec, GetReq, PendingPut, Sink};
use crate::limits::*;
use crate::parse::{self, Frame, ParseError, Request};
use granary_server::{Session, Stream};
use granary_store::{PutBuf, ReceiveEnd, ValueBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// What one step did with the input.
enum Step {
    /// The first n bytes were one request (or data skipped): done.
    Consumed(usize),
    /// No complete request yet: read more.
    NeedMore,
    /// Close the connection after sending what is buffered.
    Close,
    /// The first n bytes were a storage command with a large value: the
    /// request loop receives the value into [`Conn::receiving`]'s record
    /// buffer; the next step checks its "\r\n" and stores it.
    Receive(usize),
}

/// A large value being received, with what its latency is counted under.
struct Receiving {
    put: PendingPut,
    /// The command's index in `COMMANDS`, and when its line was executed.
    cmd: usize,
    started: Instant,
}

/// The reply buffer and the socket it is sent on: the executor's [`Sink`].
struct Output<'a> {
    ctx: &'a Ctx,
    stream: &'a Stream,
    buf: Vec<u8>,
    /// A send failed: the connection is gone.
    dead: bool,
    /// Bytes the request loop holds for input (buffer and read chunk), for
    /// the memory high-water mark.
    input_bytes: usize,
}

impl Output<'_> {
    /// Note the connection's buffer memory in the high-water mark.
    fn account(&self) {
        self.ctx.stats.buffer_bytes(self.input_bytes + self.buf.capacity());
    }
}

impl Sink for Output<'_> {
    fn out(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    async fn flush(&mut self) -> bool {
        self.account();
        if self.buf.is_empty() || self.dead {
            return !self.dead;
        }
        let stream = self.stream;
        let n = self.buf.len();
        self.ctx.stats.bytes_written.fetch_add(n as u64, Relaxed);
        // Most replies fit the socket buffer: one direct send, no ring trip.
        let sent = match stream.try_send(&self.buf) {
            Ok(k) => k,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted => 0,
            Err(_) => {
                self.dead = true;
                return false;
            }
        };
        if sent == n {
            self.buf.clear();
            return true;
        }
        // The rest through the ring, waiting for room in the socket.
        let _waiting = granary_rt::net::GaugeHold::new(&self.ctx.stats.conns_waiting_to_send);
        let mut out = std::mem::take(&mut self.buf);
        let mut off = sent;
        let mut ok = true;
        while ok && off < n {
            let (r, o) = stream.send_from(out, off).await;
            out = o;
            match r {
                Ok(0) => ok = false,
                Ok(k) => off += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => ok = false,
            }
        }
        out.clear();
        if out.capacity() <= 4 * OUT_FLUSH_BYTES {
            self.buf = out; // reuse the allocation
        }
        self.dead = !ok;
        ok
    }

    async fn send_value(&mut self, vb: ValueBuf) -> bool {
        if !self.flush().await {
            return false;
        }
        self.ctx.stats.zero_copy_gets.fetch_add(1, Relaxed);
        let n = vb.len();
        // One direct send first, as for the reply buffer; the rest
        // through the ring, counted as waiting for the client.
        let mut off = match self.stream.try_send(vb.value()) {
            Ok(k) => k,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => 0,
            Err(_) => {
                self.dead = true;
                return false;
            }
        };
        let _waiting = (off < n).then(|| granary_rt::net::GaugeHold::new(&self.ctx.stats.conns_waiting_to_send));
        let mut vb = vb;
        while off < n {
            let (r, b) = self.stream.send_from(vb, off).await;
            vb = b;
            match r {
                Ok(k) if k > 0 => off += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                _ => {
                    self.dead = true;
                    return false;
                }
            }
        }
        self.ctx.stats.bytes_written.fetch_add(n as u64, Relaxed);
        true
    }
}

/// A connection's state between steps.
struct Conn<'a> {
    ctx: &'a Ctx,
    out: Output<'a>,
    /// Bytes of a refused value still to skip.
    swallow: usize,
    /// A large value being received (see [`Step::Receive`]).
    receiving: Option<Receiving>,
    /// The connection's protocol, chosen by its first byte: binary if it
    /// is [`binary::MAGIC_REQUEST`] (memcached's negotiation), and kept.
    binary: Option<bool>,
    /// Whether the connection may run commands: true from the start
    /// without an auth file, else once its authentication `set` is
    /// accepted.
    authenticated: bool,
    /// The length of the data block (with its "\r\n") of an
    /// authentication `set` whose line was read.
    auth_pending: Option<usize>,
    /// The text request at the start of the input is not looked at again
    /// before this many bytes have come: its line and data block, once its
    /// line was read and its data is short. 0: no such wait.
    waiting: usize,
    /// Bytes at the start of the input already looked at for a line end,
    /// none found ([`parse::frame_from`]); 0 once a line is read.
    scanned: usize,
}

impl Conn<'_> {
    /// Execute the next request in `buf`.
    async fn step(&mut self, buf: &[u8]) -> Step {
        if self.swallow > 0 {
            let n = self.swallow.min(buf.len());
            self.swallow -= n;
            return if n == 0 { Step::NeedMore } else { Step::Consumed(n) };
        }
        if self.receiving.as_ref().is_some_and(|r| r.put.pb.is_full()) {
            if buf.len() < 2 {
                return Step::NeedMore;
            }
            let Receiving { put, cmd, started } = self.receiving.take().expect("checked above");
            let noreply = put.noreply;
            Exec::new(self.ctx, &mut self.out, noreply).finish_put(put, &buf[..2]).await;
            self.ctx.stats.latency[cmd].since(started);
            return self.unless_gone(Step::Consumed(2));
        }
        if !self.authenticated {
            return self.step_auth(buf);
        }
        if *self.binary.get_or_insert(buf[0] == binary::MAGIC_REQUEST) {
            return self.step_binary(buf).await;
        }
        // A request that arrives in pieces is parsed once its line is
        // whole and once more when its data is: not once per piece (a
        // client dribbling a long line or a large value would make each
        // piece cost the whole line's parse).
        if buf.len() < self.waiting {
            return Step::NeedMore;
        }
        self.waiting = 0;
        let (line, line_len) = match parse::frame_from(buf, self.scanned) {
            Frame::Line(line, n) => {
                self.scanned = 0;
                (line, n)
            }
            Frame::Incomplete => {
                self.scanned = buf.len();
                return Step::NeedMore;
            }
            Frame::TooLong => {
                Exec::new(self.ctx, &mut self.out, false).refuse_line(None, ParseError::LineTooLong);
                return Step::Close;
            }
        };
        let parsed = parse::parse(line);
        if matches!(parsed.request, Ok(Request::Get { touch: None, .. })) {
            if let Some(n) = self.pipelined_gets(buf, &parsed, line_len).await {
                return self.unless_gone(Step::Consumed(n));
            }
        }
        let rest = &buf[line_len..];
        let started = Instant::now();
        let mut exec = Exec::new(self.ctx, &mut self.out, parsed.noreply);
        let step = match &parsed.request {
            Err(e) => {
                exec.refuse_line(parsed.cmd, *e);
                self.swallow = parsed.skip;
                Step::Consumed(line_len)
            }
            Ok(req) => match req.data_len() {
                None if exec.run(req, &[]).await => Step::Consumed(line_len),
                None => Step::Close,
                Some(len) => {
                    if let Some(skip) = exec.oversized(req).await {
                        self.swallow = skip;
                        Step::Consumed(line_len)
                    } else if rest.len() < len + 2 {
                        match exec.zero_copy(req) {
                            Some(put) => {
                                let cmd = command_index(parsed.cmd.unwrap_or_default());
                                self.receiving = Some(Receiving { put, cmd, started: Instant::now() });
                                Step::Receive(line_len)
                            }
                            None => {
                                self.waiting = line_len + len + 2;
                                Step::NeedMore
                            }
                        }
                    } else {
                        exec.run(req, &rest[..len + 2]).await;
                        Step::Consumed(line_len + len + 2)
                    }
                }
            },
        };
        if let (Step::Consumed(_) | Step::Close, Some(cmd)) = (&step, parsed.cmd) {
            self.ctx.stats.latency[command_index(cmd)].since(started);
        }
        self.unless_gone(step)
    }

    /// When plain retrievals (`get`/`gets`, no touch) follow `first` (the
    /// first `first_len` bytes of `buf`) as complete lines, answer them all
    /// as one group ([`Exec::get_group`]: their reads together, their
    /// replies in order), and return the bytes they took; None when
    /// `first` is alone.
    async fn pipelined_gets(&mut self, buf: &[u8], first: &parse::Parsed<'_>, first_len: usize) -> Option<usize> {
        let mut used = first_len;
        let mut more = Vec::new();
        let mut keys = match &first.request {
            Ok(Request::Get { keys, .. }) => keys.len(),
            _ => 0,
        };
        while let Frame::Line(line, n) = parse::frame(&buf[used..]) {
            if 1 + more.len() >= PIPELINED_GETS_MAX || keys >= PIPELINED_GET_KEYS_MAX {
                break;
            }
            // Anything but a retrieval ends the group unparsed (the next
            // step parses it).
            if !(line.starts_with(b"get ") || line.starts_with(b"gets ")) {
                break;
            }
            let p = parse::parse(line);
            let Ok(Request::Get { touch: None, keys: k, .. }) = &p.request else { break };
            keys += k.len();
            more.push(p);
            used += n;
        }
        if more.is_empty() {
            return None;
        }
        let reqs: Vec<GetReq<'_>> = std::iter::once(first)
            .chain(more.iter())
            .map(|p| match &p.request {
                Ok(Request::Get { keys, cas, bad_key, .. }) => GetReq { keys, with_cas: *cas, bad_key: *bad_key },
                _ => unreachable!("only plain retrievals are grouped"),
            })
            .collect();
        self.ctx.stats.pipelined_gets.fetch_add(reqs.len() as u64, Relaxed);
        Exec::new(self.ctx, &mut self.out, false).get_group(&reqs, Some(Instant::now())).await;
        Some(used)
    }

    /// Execute the next binary request in `buf` (no zero-copy path: a
    /// request and its value are in the input buffer, bounded by the
    /// header, extras, a key and the item size limit).
    async fn step_binary(&mut self, buf: &[u8]) -> Step {
        let started = Instant::now();
        let mut exec = Exec::new(self.ctx, &mut self.out, false);
        let step = match binary::frame(buf, self.ctx.cfg.item_bytes_max) {
            binary::Frame::Incomplete => return Step::NeedMore,
            binary::Frame::Request(p, n) if is_get(&p) && get_follows(&buf[n..], self.ctx.cfg.item_bytes_max) => {
                // Gets pipelined right after this one are answered with it.
                let mut gets = vec![p];
                let mut used = n;
                while let binary::Frame::Request(q, m) = binary::frame(&buf[used..], self.ctx.cfg.item_bytes_max) {
                    if !is_get(&q) || gets.len() >= PIPELINED_GETS_MAX {
                        break;
                    }
                    gets.push(q);
                    used += m;
                }
                self.ctx.stats.pipelined_gets.fetch_add(gets.len() as u64, Relaxed);
                exec.bin_get_group(&gets, started).await;
                Step::Consumed(used)
            }
            binary::Frame::Request(p, n) => {
                let go = exec.binary(&p).await;
                self.ctx.stats.latency[command_index(p.op.command_name().as_bytes())].since(started);
                if go {
                    Step::Consumed(n)
                } else {
                    Step::Close
                }
            }
            binary::Frame::Skip { h, status, op, key, consumed, skip } => {
                exec.bin_refuse(&h, status, op, key).await;
                self.swallow = skip;
                Step::Consumed(consumed)
            }
            binary::Frame::Close { h, status } => {
                if let Some(st) = status {
                    exec.bin_error(&h, st);
                }
                Step::Close
            }
        };
        self.unless_gone(step)
    }

    /// The next step of a connection that has not authenticated, as
    /// memcached 1.6 with `-Y`: a line of at least five words whose first
    /// is `set` and fifth a length announces a data block `<user> <pass>`
    /// (more words are ignored) answered `STORED` if the auth file lists
    /// that pair; any other line is answered `CLIENT_ERROR
    /// unauthenticated` (and dropped, its data block too, if it has one,
    /// being read as lines).
    fn step_auth(&mut self, buf: &[u8]) -> Step {
        let reply = |c: &mut Self, msg: &str| {
            c.out.buf.extend_from_slice(msg.as_bytes());
            c.out.buf.extend_from_slice(b"\r\n");
        };
        if let Some(need) = self.auth_pending {
            if buf.len() < need {
                return Step::NeedMore;
            }
            self.auth_pending = None;
            let stats = &self.ctx.stats;
            if &buf[need - 2..need] != b"\r\n" {
                stats.protocol_errors.fetch_add(1, Relaxed);
                reply(self, "CLIENT_ERROR bad command line termination");
                return Step::Consumed(need);
            }
            let mut words = buf[..need - 2].split(|&b| b == b' ').filter(|w| !w.is_empty());
            let (Some(user), Some(pass)) = (words.next(), words.next()) else {
                stats.protocol_errors.fetch_add(1, Relaxed);
                reply(self, "CLIENT_ERROR bad authentication token format");
                return Step::Consumed(need);
            };
            stats.auth_cmds.fetch_add(1, Relaxed);
            let users = self.ctx.cfg.auth.as_ref().expect("unauthenticated only with an auth file");
            if users.check(user, pass) {
                self.authenticated = true;
                reply(self, "STORED");
            } else {
                stats.auth_errors.fetch_add(1, Relaxed);
                tracing::debug!("memcache authentication refused");
                reply(self, "CLIENT_ERROR authentication failure");
            }
            return Step::Consumed(need);
        }
        let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
            return if buf.len() > AUTH_LINE_BYTES_MAX { Step::Close } else { Step::NeedMore };
        };
        let line = &buf[..nl];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let words: Vec<&[u8]> = line.split(|&b| b == b' ').filter(|w| !w.is_empty()).take(5).collect();
        let len = words.get(4).and_then(|w| std::str::from_utf8(w).ok()).and_then(|w| w.parse::<u32>().ok());
        match len {
            Some(len) if words.len() == 5 && words[0] == b"set" => {
                if len as usize > AUTH_TOKEN_BYTES_MAX {
                    self.ctx.stats.protocol_errors.fetch_add(1, Relaxed);
                    reply(self, "CLIENT_ERROR bad authentication token format");
                    return Step::Close;
                }
                self.auth_pending = Some(len as usize + 2);
            }
            _ => {
                self.ctx.stats.protocol_errors.fetch_add(1, Relaxed);
                reply(self, "CLIENT_ERROR unauthenticated");
            }
        }
        Step::Consumed(nl + 1)
    }

    /// `step`, or Close if a send failed meanwhile.
    fn unless_gone(&self, step: Step) -> Step {
        if self.out.dead {
            Step::Close
        } else {
            step
        }
    }
}

/// Receive the rest of a value from the socket into its record buffer;
/// None if the connection ended or idled out.
async fn receive_value(session: &Session, pb: PutBuf) -> Option<PutBuf> {
    let r = pb.receive(session.stream(), session.idle_timeout(), |n| session.count_read(n)).await;
    if matches!(r, Err(ReceiveEnd::Idle)) {
        session.count_idle_kick();
    }
    r.ok()
}

/// One connection's request loop, until the client closes, a send fails,
/// `quit`, a line too long, the idle timeout or a drain.
pub(crate) async fn serve(session: &Session, ctx: &Ctx) {
    // Buffers grow with what comes and go while the client is idle.
    let out = Output { ctx, stream: session.stream(), buf: Vec::new(), dead: false, input_bytes: 0 };
    // With an auth file the connection speaks only the text protocol, as
    // memcached with `-Y`.
    let auth = ctx.cfg.auth.is_some();
    let mut conn = Conn {
        ctx,
        out,
        swallow: 0,
        receiving: None,
        binary: auth.then_some(false),
        authenticated: !auth,
        auth_pending: None,
        waiting: 0,
        scanned: 0,
    };
    let mut input: Vec<u8> = Vec::new();
    loop {
        let mut pos = 0;
        let mut close = false;
        while pos < input.len() {
            match conn.step(&input[pos..]).await {
                Step::Consumed(n) => pos += n,
                Step::Receive(n) => {
                    // A large value: what is buffered goes into the record
                    // buffer, the rest comes straight from the socket.
                    pos += n;
                    let mut r = conn.receiving.take().expect("Receive leaves a value being received");
                    let take = (input.len() - pos).min(r.put.pb.value_len() - r.put.pb.filled());
                    r.put.pb.fill_from(&input[pos..pos + take]);
                    pos += take;
                    if !r.put.pb.is_full() {
                        input.clear();
                        pos = 0;
                        // Earlier pipelined replies go out before the wait.
                        if !conn.out.flush().await {
                            return;
                        }
                        match receive_value(session, r.put.pb).await {
                            Some(pb) => r.put.pb = pb,
                            None => return,
                        }
                    }
                    conn.receiving = Some(r);
                }
                Step::NeedMore => break,
                Step::Close => {
                    close = true;
                    break;
                }
            }
            conn.out.account();
            if conn.out.buf.len() >= OUT_FLUSH_BYTES && !conn.out.flush().await {
                return;
            }
        }
        input.drain(..pos);
        if !conn.out.flush().await || close {
            return;
        }
        // Ends the session once the listener drains: what was read is
        // done; read no more.
        if conn.out.buf.capacity() > granary_server::OUTPUT_KEEP_BYTES {
            conn.out.buf = Vec::new();
        }
        if session.recv_into(&mut input).await.is_err() {
            return;
        }
        conn.out.input_bytes = input.capacity() + granary_server::READ_CHUNK_BYTES;
        conn.out.account();
    }
}

/// Whether a binary request is a get (get, getq, getk, getkq).
fn is_get(p: &binary::Packet<'_>) -> bool {
    matches!(p.op, binary::Op::Get { .. })
}

/// Whether `buf` starts with a whole binary get (values of at most
/// `item_bytes_max` bytes allowed, as the connection frames them).
fn get_follows(buf: &[u8], item_bytes_max: usize) -> bool {
    matches!(binary::frame(buf, item_bytes_max), binary::Frame::Request(q, _) if is_get(&q))
}
