//! One connection's protocol state: parse the next request from the input
//! and execute it against the store, appending replies to `out`.
//!
//! Replies follow memcached 1.6's text protocol (protocol.txt) byte for
//! byte, including its errors: `ERROR` for an unknown command, `CLIENT_ERROR
//! ...` for a malformed one, `SERVER_ERROR ...` when the store fails.
//! Storage commands whose value is larger than the configured maximum get
//! `SERVER_ERROR object too large for cache` and their data is skipped
//! ("swallowed") as memcached does; the connection goes on.

use crate::limits::*;
use crate::server::{command_index, Ctx};
use granary_rt::net::TcpStream;
use granary_store::{Change, Cond, Error, Item, ItemMeta, PutBuf, PutOutcome, ValueBuf};
use std::sync::atomic::Ordering::Relaxed;

/// What one step did with the input.
pub(crate) enum Step {
    /// The first n bytes were one request (or data skipped): done.
    Consumed(usize),
    /// No complete request yet: read more.
    NeedMore,
    /// Close the connection after sending what is buffered.
    Close,
    /// The first n bytes were a storage command with a large value: the
    /// connection loop receives the value into `Conn::pending`'s record
    /// buffer; the next step checks its "\r\n" and stores it.
    Receive(usize),
}

/// A storage command whose value is received into its record buffer.
pub(crate) struct PendingPut {
    pub pb: PutBuf,
    meta: ItemMeta,
    cond: Cond,
    noreply: bool,
    /// The command's index in `COMMANDS`, and when its line was parsed.
    cmd: usize,
    started: std::time::Instant,
}

pub(crate) struct Conn<'a> {
    pub ctx: &'a Ctx,
    /// The socket replies go to.
    stream: &'a TcpStream,
    /// A send failed: the connection is gone.
    dead: bool,
    pub out: Vec<u8>,
    /// Bytes of a refused value still to skip.
    pub(crate) swallow: usize,
    /// The current command ends in `noreply`: as in memcached, every reply
    /// to it (errors included) is suppressed.
    noreply: bool,
    /// Bytes the connection loop holds for input (buffer and read chunk),
    /// for the memory high-water mark.
    pub input_bytes: usize,
    /// A large value being received (see [`Step::Receive`]).
    pub(crate) pending: Option<PendingPut>,
}

/// A storage command's kind.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

/// Split a request line into tokens (runs of spaces separate them).
pub(crate) fn tokens(line: &[u8]) -> Vec<&[u8]> {
    line.split(|&b| b == b' ').filter(|t| !t.is_empty()).collect()
}

pub(crate) fn parse<T: std::str::FromStr>(t: &[u8]) -> Option<T> {
    std::str::from_utf8(t).ok()?.parse().ok()
}

/// A key the text protocol accepts: 1..=250 bytes. As in memcached, any
/// other byte than the space (which separates tokens) and the line end may
/// occur: memcaslap's verifying mode, for one, sends control characters.
pub(crate) fn key_ok(k: &[u8]) -> bool {
    !k.is_empty() && k.len() <= KEY_BYTES_MAX
}

impl<'a> Conn<'a> {
    pub fn new(ctx: &'a Ctx, stream: &'a TcpStream) -> Conn<'a> {
        Conn {
            ctx,
            stream,
            dead: false,
            out: Vec::with_capacity(4096),
            swallow: 0,
            noreply: false,
            input_bytes: 0,
            pending: None,
        }
    }

    /// Note the connection's buffer memory in the high-water mark.
    pub fn account(&self) {
        self.ctx.stats.buffer_bytes(self.input_bytes + self.out.capacity());
    }

    /// Send the buffered replies; false if the connection is gone.
    pub async fn send(&mut self) -> bool {
        self.account();
        if self.out.is_empty() || self.dead {
            return !self.dead;
        }
        let stream = self.stream;
        let n = self.out.len();
        self.ctx.stats.bytes_written.fetch_add(n as u64, Relaxed);
        // Most replies fit the socket buffer: one direct send, no ring trip.
        let sent = match stream.try_send(&self.out) {
            Ok(k) => k,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted => 0,
            Err(_) => {
                self.dead = true;
                return false;
            }
        };
        if sent == n {
            self.out.clear();
            return true;
        }
        // The rest through the ring, waiting for room in the socket.
        let _waiting = granary_rt::net::GaugeHold::new(&self.ctx.stats.conns_waiting_to_send);
        let mut out = std::mem::take(&mut self.out);
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
            self.out = out; // reuse the allocation
        }
        self.dead = !ok;
        ok
    }

    pub(crate) fn reply(&mut self, s: &str) {
        if self.noreply {
            return;
        }
        self.out.extend_from_slice(s.as_bytes());
        self.out.extend_from_slice(b"\r\n");
    }

    pub(crate) fn client_error(&mut self, msg: &str) {
        self.ctx.stats.protocol_errors.fetch_add(1, Relaxed);
        self.reply(&format!("CLIENT_ERROR {msg}"));
    }

    pub(crate) fn error(&mut self) {
        self.ctx.stats.protocol_errors.fetch_add(1, Relaxed);
        self.reply("ERROR");
    }

    /// memcached's reply to a value over the item size limit, counted.
    pub(crate) fn too_large(&mut self) {
        self.ctx.stats.store_too_large.fetch_add(1, Relaxed);
        self.reply("SERVER_ERROR object too large for cache");
    }

    /// memcached's reply to a store failure.
    pub(crate) fn server_error(&mut self, e: &Error) {
        match e {
            Error::NoSpace { .. } => {
                self.ctx.stats.store_no_memory.fetch_add(1, Relaxed);
                self.reply("SERVER_ERROR out of memory storing object")
            }
            Error::ValueTooLarge { .. } => self.too_large(),
            e => {
                // Device trouble is the operator's business; a request the
                // store refuses (a reserved key, say) is only the client's,
                // and must not let a client flood the log.
                if matches!(e, Error::Io { .. } | Error::Corruption { .. } | Error::Poisoned { .. }) {
                    tracing::warn!(error = %e, "request failed in the store");
                } else {
                    tracing::debug!(error = %e, "request refused by the store");
                }
                let msg = e.to_string().replace(['\r', '\n'], " ");
                self.reply(&format!("SERVER_ERROR {msg}"));
            }
        }
    }

    /// An exptime of the protocol as the engine's expiry (unix seconds,
    /// 0 = never): memcached's rules.
    pub(crate) fn expires(&self, exptime: i64) -> u32 {
        let now = self.ctx.store.now() as i64;
        let t = if exptime == 0 {
            0
        } else if exptime < 0 {
            1 // already expired
        } else if exptime > RELATIVE_EXPTIME_MAX {
            // Absolute: memcached treats times before its start as expired.
            if exptime <= self.ctx.started_unix as i64 {
                1
            } else {
                exptime
            }
        } else {
            now + exptime
        };
        t.clamp(0, u32::MAX as i64) as u32
    }

    /// Execute the next request in `buf`.
    pub async fn step(&mut self, buf: &[u8]) -> Step {
        if self.swallow > 0 {
            let n = self.swallow.min(buf.len());
            self.swallow -= n;
            return if n == 0 { Step::NeedMore } else { Step::Consumed(n) };
        }
        if self.pending.as_ref().is_some_and(|p| p.pb.is_full()) {
            return self.finish_put(buf).await;
        }
        let Some(nl) = buf.iter().take(LINE_BYTES_MAX + 2).position(|&b| b == b'\n') else {
            if buf.len() > LINE_BYTES_MAX {
                self.client_error("line too long");
                return Step::Close;
            }
            return Step::NeedMore;
        };
        let line_len = nl + 1;
        let line = &buf[..nl];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let t = tokens(line);
        let Some(&cmd) = t.first() else {
            self.error();
            return Step::Consumed(line_len);
        };
        let rest = &buf[line_len..];
        const NOREPLY_CMDS: [&[u8]; 12] = [
            b"set",
            b"add",
            b"replace",
            b"append",
            b"prepend",
            b"cas",
            b"delete",
            b"incr",
            b"decr",
            b"touch",
            b"flush_all",
            b"verbosity",
        ];
        self.noreply = t.len() > 1 && t.last() == Some(&&b"noreply"[..]) && NOREPLY_CMDS.contains(&cmd);
        let start = std::time::Instant::now();
        let step = self.dispatch(cmd, &t, line_len, rest).await;
        if matches!(step, Step::Consumed(_) | Step::Close) {
            self.ctx.stats.latency[command_index(cmd)].since(start);
        }
        self.noreply = false;
        if self.dead {
            return Step::Close;
        }
        step
    }

    async fn dispatch(&mut self, cmd: &[u8], t: &[&[u8]], line_len: usize, rest: &[u8]) -> Step {
        match cmd {
            b"get" => self.get(&t[1..], false, None).await,
            b"gets" => self.get(&t[1..], true, None).await,
            b"gat" | b"gats" if t.len() > 1 => match parse::<i64>(t[1]) {
                // An exptime and no key: memcached answers an empty result.
                Some(_) if t.len() == 2 => self.reply("END"),
                Some(exp) => self.get(&t[2..], cmd == b"gats", Some(exp)).await,
                None => self.client_error("invalid exptime argument"),
            },
            b"gat" | b"gats" => self.error(),
            b"set" => return self.storage(Store::Set, t, line_len, rest).await,
            b"add" => return self.storage(Store::Add, t, line_len, rest).await,
            b"replace" => return self.storage(Store::Replace, t, line_len, rest).await,
            b"append" => return self.storage(Store::Append, t, line_len, rest).await,
            b"prepend" => return self.storage(Store::Prepend, t, line_len, rest).await,
            b"cas" => return self.storage(Store::Cas, t, line_len, rest).await,
            b"delete" => self.delete(t).await,
            b"incr" => self.arith(t, true).await,
            b"decr" => self.arith(t, false).await,
            b"touch" => self.touch(t).await,
            b"flush_all" => self.flush_all(t).await,
            b"version" => self.reply(&format!("VERSION {}", version())),
            b"verbosity" => self.verbosity(&t[1..]),
            b"stats" => self.stats(&t[1..]),
            b"quit" => return Step::Close,
            b"mn" => {
                self.ctx.stats.cmd_meta.fetch_add(1, Relaxed);
                self.reply("MN")
            }
            b"mg" | b"ms" | b"md" | b"ma" | b"me" => return self.meta(cmd, t, line_len, rest).await,
            _ => self.error(),
        }
        Step::Consumed(line_len)
    }

    async fn get(&mut self, keys: &[&[u8]], with_cas: bool, touch: Option<i64>) {
        if keys.is_empty() {
            return self.error();
        }
        let expires = touch.map(|e| self.expires(e));
        for &key in keys {
            if !key_ok(key) {
                return self.client_error("bad command line format");
            }
            self.ctx.stats.cmd_get.fetch_add(1, Relaxed);
            let Some(exp) = expires else {
                // Served from the buffer the device read the value into.
                match self.ctx.store.get_buf_async(key).await {
                    Ok(Some(vb)) => {
                        self.ctx.stats.get_hits.fetch_add(1, Relaxed);
                        if !self.value_buf(key, vb, with_cas).await {
                            return;
                        }
                        if self.out.len() >= OUT_FLUSH_BYTES && !self.send().await {
                            return;
                        }
                    }
                    Ok(None) => {
                        self.ctx.stats.get_misses.fetch_add(1, Relaxed);
                    }
                    Err(e) => return self.server_error(&e),
                }
                continue;
            };
            self.ctx.stats.cmd_touch.fetch_add(1, Relaxed);
            let got = touch_item(self.ctx, key, exp, None, true).await;
            match got {
                Ok(Some(it)) => {
                    self.ctx.stats.get_hits.fetch_add(1, Relaxed);
                    self.ctx.stats.touch_hits.fetch_add(1, Relaxed);
                    self.value_line(key, &it, with_cas);
                    // A multi-get of large items sends as it goes, so its
                    // reply never holds more than OUT_FLUSH_BYTES + one item.
                    if self.out.len() >= OUT_FLUSH_BYTES && !self.send().await {
                        return;
                    }
                }
                Ok(None) => {
                    self.ctx.stats.get_misses.fetch_add(1, Relaxed);
                    self.ctx.stats.touch_misses.fetch_add(1, Relaxed);
                }
                Err(e) => return self.server_error(&e),
            }
        }
        self.reply("END");
    }

    /// A `VALUE` reply from the read buffer: copied into the reply buffer,
    /// or, from [`ZERO_COPY_MIN_BYTES`] on, sent from the read buffer
    /// itself after what is buffered. False if the connection is gone.
    async fn value_buf(&mut self, key: &[u8], vb: ValueBuf, with_cas: bool) -> bool {
        self.out.extend_from_slice(b"VALUE ");
        self.out.extend_from_slice(key);
        let head = if with_cas {
            format!(" {} {} {}\r\n", vb.meta.flags, vb.len(), vb.cas)
        } else {
            format!(" {} {}\r\n", vb.meta.flags, vb.len())
        };
        self.out.extend_from_slice(head.as_bytes());
        if vb.len() < ZERO_COPY_MIN_BYTES {
            self.out.extend_from_slice(vb.value());
        } else {
            if !self.send().await {
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
        }
        self.out.extend_from_slice(b"\r\n");
        true
    }

    fn value_line(&mut self, key: &[u8], it: &Item, with_cas: bool) {
        self.out.extend_from_slice(b"VALUE ");
        self.out.extend_from_slice(key);
        let head = if with_cas {
            format!(" {} {} {}\r\n", it.meta.flags, it.value.len(), it.cas)
        } else {
            format!(" {} {}\r\n", it.meta.flags, it.value.len())
        };
        self.out.extend_from_slice(head.as_bytes());
        self.out.extend_from_slice(&it.value);
        self.out.extend_from_slice(b"\r\n");
    }

    /// set/add/replace/append/prepend/cas: `<cmd> <key> <flags> <exptime>
    /// <bytes> [<cas>] [noreply]` then the data and "\r\n".
    async fn storage(&mut self, kind: Store, t: &[&[u8]], line_len: usize, rest: &[u8]) -> Step {
        let n_args = if kind == Store::Cas { 6 } else { 5 };
        // memcached ignores one extra token that is not "noreply".
        let noreply = self.noreply;
        if t.len() != n_args && t.len() != n_args + 1 {
            self.error();
            return Step::Consumed(line_len);
        }
        let key = t[1];
        // memcached parses flags as an unsigned long and keeps 32 bits.
        let flags = parse::<u64>(t[2]).map(|f| f as u32);
        let exptime = parse::<i64>(t[3]);
        let bytes = parse::<i64>(t[4]);
        let cas = if kind == Store::Cas { parse::<u64>(t[5]) } else { Some(0) };
        let (Some(flags), Some(exptime), Some(bytes), Some(cas)) = (flags, exptime, bytes, cas) else {
            self.client_error("bad command line format");
            return Step::Consumed(line_len);
        };
        if key.len() > KEY_BYTES_MAX || !key_ok(key) || !(0..=i32::MAX as i64 - 2).contains(&bytes) {
            self.client_error("bad command line format");
            return Step::Consumed(line_len);
        }
        let bytes = bytes as usize;
        if bytes > self.ctx.cfg.item_bytes_max {
            self.ctx.stats.cmd_set.fetch_add(1, Relaxed);
            self.too_large();
            self.swallow = bytes + 2;
            // memcached drops the old value of a failed set, so no stale
            // data outlives it.
            if kind == Store::Set {
                let _ = self.ctx.store.delete_async(key).await;
            }
            return Step::Consumed(line_len);
        }
        if rest.len() < bytes + 2 {
            if bytes >= ZERO_COPY_MIN_BYTES && !matches!(kind, Store::Append | Store::Prepend) {
                // A key or size the engine refuses falls back to the copying
                // path, which reports it once the data is in.
                if let Ok(pb) = self.ctx.store.new_put_buf(key, bytes) {
                    let cond = match kind {
                        Store::Add => Cond::Absent,
                        Store::Replace => Cond::Present,
                        Store::Cas => Cond::Cas(cas),
                        _ => Cond::Always,
                    };
                    self.pending = Some(PendingPut {
                        pb,
                        meta: ItemMeta::new(flags, self.expires(exptime)),
                        cond,
                        noreply,
                        cmd: command_index(t[0]),
                        started: std::time::Instant::now(),
                    });
                    return Step::Receive(line_len);
                }
            }
            return Step::NeedMore;
        }
        let consumed = line_len + bytes + 2;
        self.ctx.stats.cmd_set.fetch_add(1, Relaxed);
        if &rest[bytes..bytes + 2] != b"\r\n" {
            self.client_error("bad data chunk");
            return Step::Consumed(consumed);
        }
        let data = &rest[..bytes];
        let meta = ItemMeta::new(flags, self.expires(exptime));
        let r = match kind {
            Store::Set => self.put(key, data, meta, Cond::Always).await,
            Store::Add => self.put(key, data, meta, Cond::Absent).await,
            Store::Replace => self.put(key, data, meta, Cond::Present).await,
            Store::Cas => self.put(key, data, meta, Cond::Cas(cas)).await,
            Store::Append | Store::Prepend => {
                let append = kind == Store::Append;
                let max = self.ctx.cfg.item_bytes_max;
                let r = self
                    .ctx
                    .store
                    .update_async(key, |it| match it {
                        None => (Change::Keep, Ok(false)),
                        Some(it) if it.value.len() + data.len() > max => (Change::Keep, Err(())),
                        Some(it) => {
                            let mut v = Vec::with_capacity(it.value.len() + data.len());
                            if append {
                                v.extend_from_slice(&it.value);
                                v.extend_from_slice(data);
                            } else {
                                v.extend_from_slice(data);
                                v.extend_from_slice(&it.value);
                            }
                            // A new item to memcached: flags and expiry
                            // kept, a stale mark not.
                            (Change::Put { value: v, meta: ItemMeta { stale: false, ..it.meta } }, Ok(true))
                        }
                    })
                    .await;
                match r {
                    Ok((Ok(true), _)) => Ok("STORED"),
                    Ok((Ok(false), _)) => Ok("NOT_STORED"),
                    Ok((Err(()), _)) => Err(Error::ValueTooLarge { len: 0, max: max as u64 }),
                    Err(e) => Err(e),
                }
            }
        };
        match r {
            Ok(_) if noreply => {}
            Ok(s) => self.reply(s),
            Err(e) => self.server_error(&e),
        }
        Step::Consumed(consumed)
    }

    /// The value of a [`Step::Receive`] is in: check its line end, store it.
    async fn finish_put(&mut self, buf: &[u8]) -> Step {
        if buf.len() < 2 {
            return Step::NeedMore;
        }
        let p = self.pending.take().expect("checked by the caller");
        self.noreply = p.noreply;
        self.ctx.stats.cmd_set.fetch_add(1, Relaxed);
        if &buf[..2] != b"\r\n" {
            self.client_error("bad data chunk");
        } else {
            self.ctx.stats.zero_copy_sets.fetch_add(1, Relaxed);
            let r = self.ctx.store.put_buf_async(p.pb, p.meta, p.cond).await;
            match r.map(|(outcome, _)| self.put_reply(p.cond, outcome)) {
                Ok(_) if p.noreply => {}
                Ok(s) => self.reply(s),
                Err(e) => self.server_error(&e),
            }
        }
        self.ctx.stats.latency[p.cmd].since(p.started);
        self.noreply = false;
        if self.dead {
            Step::Close
        } else {
            Step::Consumed(2)
        }
    }

    async fn put(&mut self, key: &[u8], data: &[u8], meta: ItemMeta, cond: Cond) -> Result<&'static str, Error> {
        let (outcome, _) = self.ctx.store.put_item_async(key, data, meta, cond).await?;
        Ok(self.put_reply(cond, outcome))
    }

    /// Count a storage command's outcome; its reply.
    fn put_reply(&self, cond: Cond, outcome: PutOutcome) -> &'static str {
        let s = &self.ctx.stats;
        match (cond, outcome) {
            (Cond::Cas(_), PutOutcome::Stored) => {
                s.cas_hits.fetch_add(1, Relaxed);
                s.total_items.fetch_add(1, Relaxed);
                "STORED"
            }
            (Cond::Cas(_), PutOutcome::Exists) => {
                s.cas_badval.fetch_add(1, Relaxed);
                "EXISTS"
            }
            (Cond::Cas(_), PutOutcome::NotFound) => {
                s.cas_misses.fetch_add(1, Relaxed);
                "NOT_FOUND"
            }
            (_, PutOutcome::Stored) => {
                s.total_items.fetch_add(1, Relaxed);
                "STORED"
            }
            _ => "NOT_STORED",
        }
    }

    /// `delete <key> [0] [noreply]` (the 0 is memcached's legacy hold time).
    async fn delete(&mut self, t: &[&[u8]]) {
        if t.len() < 2 {
            return self.error();
        }
        let noreply = self.noreply;
        let args = &t[1..t.len() - noreply as usize];
        let ok = match args {
            [_] => true,
            [_, z] => *z == b"0",
            _ => false,
        };
        if !ok {
            return self.client_error("bad command line format.  Usage: delete <key> [noreply]");
        }
        let key = args[0];
        if !key_ok(key) {
            return self.client_error("bad command line format");
        }
        match self.ctx.store.delete_async(key).await {
            Ok(found) => {
                let c = if found { &self.ctx.stats.delete_hits } else { &self.ctx.stats.delete_misses };
                c.fetch_add(1, Relaxed);
                if !noreply {
                    self.reply(if found { "DELETED" } else { "NOT_FOUND" });
                }
            }
            Err(e) => self.server_error(&e),
        }
    }

    /// The key, argument and noreply of `<cmd> <key> <arg> [noreply]`, or
    /// None after replying with memcached's error.
    fn key_and_arg<'t>(&mut self, t: &[&'t [u8]]) -> Option<(&'t [u8], &'t [u8], bool)> {
        let noreply = t.len() == 4 && t[3] == b"noreply";
        if t.len() != 3 && !noreply {
            self.error();
            return None;
        }
        if !key_ok(t[1]) {
            self.client_error("bad command line format");
            return None;
        }
        Some((t[1], t[2], noreply))
    }

    /// `incr|decr <key> <delta> [noreply]`.
    async fn arith(&mut self, t: &[&[u8]], incr: bool) {
        let Some((key, arg, noreply)) = self.key_and_arg(t) else { return };
        let Some(delta) = parse::<u64>(arg) else {
            return self.client_error("invalid numeric delta argument");
        };
        match arith(self.ctx, key, incr, delta, None, None, None).await {
            Ok(Arith::Done(n, ..)) => {
                let c = if incr { &self.ctx.stats.incr_hits } else { &self.ctx.stats.decr_hits };
                c.fetch_add(1, Relaxed);
                if !noreply {
                    self.reply(&n.to_string());
                }
            }
            Ok(Arith::NotFound) => {
                let c = if incr { &self.ctx.stats.incr_misses } else { &self.ctx.stats.decr_misses };
                c.fetch_add(1, Relaxed);
                if !noreply {
                    self.reply("NOT_FOUND");
                }
            }
            Ok(Arith::NonNumeric) => self.client_error("cannot increment or decrement non-numeric value"),
            Ok(Arith::CasMismatch) => self.reply("EXISTS"),
            Err(e) => self.server_error(&e),
        }
    }

    /// `touch <key> <exptime> [noreply]`.
    async fn touch(&mut self, t: &[&[u8]]) {
        let Some((key, arg, noreply)) = self.key_and_arg(t) else { return };
        let Some(exptime) = parse::<i64>(arg) else {
            return self.client_error("invalid exptime argument");
        };
        self.ctx.stats.cmd_touch.fetch_add(1, Relaxed);
        let exp = self.expires(exptime);
        match touch_item(self.ctx, key, exp, None, true).await {
            Ok(Some(_)) => {
                self.ctx.stats.touch_hits.fetch_add(1, Relaxed);
                if !noreply {
                    self.reply("TOUCHED");
                }
            }
            Ok(None) => {
                self.ctx.stats.touch_misses.fetch_add(1, Relaxed);
                if !noreply {
                    self.reply("NOT_FOUND");
                }
            }
            Err(e) => self.server_error(&e),
        }
    }

    /// `flush_all [delay] [noreply]`: with a delay, the flush happens then
    /// (a timer on this executor; a restart before it forgets it).
    async fn flush_all(&mut self, t: &[&[u8]]) {
        let noreply = self.noreply;
        if t.len() > 3 {
            return self.error();
        }
        let delay = match t.get(1) {
            None => 0,
            Some(&d) if d == b"noreply" && t.len() == 2 => 0,
            Some(d) => match parse::<i64>(d) {
                Some(d) => d,
                None => return self.client_error("invalid exptime argument"),
            },
        };
        self.ctx.stats.cmd_flush.fetch_add(1, Relaxed);
        if delay > 0 {
            let at = self.expires(delay) as i64;
            let wait = (at - self.ctx.store.now() as i64).max(0) as u64;
            let store = self.ctx.store.clone();
            granary_rt::spawn(async move {
                granary_rt::sleep(std::time::Duration::from_secs(wait)).await;
                if let Err(e) = store.flush_all_async().await {
                    tracing::warn!(error = %e, "delayed flush_all failed");
                }
            });
        } else if let Err(e) = self.ctx.store.flush_all_async().await {
            return self.server_error(&e);
        }
        if !noreply {
            self.reply("OK");
        }
    }

    /// `verbosity <level> [noreply]`: accepted and ignored (logging is
    /// configured with GRANARY_LOG), with memcached's replies.
    fn verbosity(&mut self, args: &[&[u8]]) {
        if args.is_empty() || args.len() > 2 {
            return self.error();
        }
        let noreply = args.last() == Some(&&b"noreply"[..]);
        if args[0] != b"noreply" && parse::<u64>(args[0]).is_none() {
            return self.client_error("bad command line format");
        }
        if !noreply {
            self.reply("OK");
        }
    }

    fn stats(&mut self, args: &[&[u8]]) {
        let lines = match args {
            [] => crate::meta::general_stats(self.ctx),
            [b"settings"] => crate::meta::settings_stats(self.ctx),
            [b"items"] => crate::meta::items_stats(self.ctx),
            [b"latency"] => crate::meta::latency_stats(self.ctx),
            [b"slabs"] => vec![("active_slabs".into(), "0".into()), ("total_malloced".into(), "0".into())],
            [b"reset"] => return self.reply("RESET"),
            _ => return self.error(),
        };
        for (k, v) in lines {
            self.reply(&format!("STAT {k} {v}"));
        }
        self.reply("END");
    }
}

/// The version string `version` and `stats` report.
pub(crate) fn version() -> String {
    format!("1.6.0-granary-{}", env!("CARGO_PKG_VERSION"))
}

/// Set a new expiry on `key`, keeping its value and flags (a new CAS value).
/// Give `key` a new expiry, keeping its value, flags and CAS value (as
/// memcached: a touch is not a modification); `new_cas` (meta `E`) sets
/// the CAS value instead. The item as touched, or None if absent.
pub(crate) async fn touch_item(
    ctx: &Ctx,
    key: &[u8],
    expires: u32,
    new_cas: Option<u64>,
    fetch: bool,
) -> Result<Option<Item>, Error> {
    let (it, _) = ctx
        .store
        .update_async(key, |it| match it {
            None => (Change::Keep, None),
            Some(it) => {
                // The same item (stale mark included), with its access state.
                let meta = ItemMeta { expires, ..it.meta };
                let cas = new_cas.unwrap_or(it.cas);
                (
                    Change::Touch { value: it.value.clone(), meta, cas, fetch },
                    Some(Item { value: it.value.clone(), meta, cas }),
                )
            }
        })
        .await?;
    Ok(it)
}

pub(crate) enum Arith {
    /// The new value, its CAS value and metadata.
    Done(u64, u64, ItemMeta),
    NotFound,
    NonNumeric,
    CasMismatch,
}

/// incr/decr with memcached's rules: incr wraps at 2^64, decr stops at 0,
/// the value must be a decimal number; flags and expiry are kept. Like
/// memcached, a result shorter than the old value is padded with spaces to
/// the old length. With `cas`, only if the item's CAS value matches; with
/// `expires`, the item gets that expiry in the same write.
/// incr/decr (and `ma`): `cas` must match if given; the new version gets
/// the CAS value `new_cas` if given (meta `E`), else a fresh one.
pub(crate) async fn arith(
    ctx: &Ctx,
    key: &[u8],
    incr: bool,
    delta: u64,
    cas: Option<u64>,
    expires: Option<u32>,
    new_cas: Option<u64>,
) -> Result<Arith, Error> {
    let (r, new_cas) = ctx
        .store
        .update_async(key, |it| {
            let Some(it) = it else { return (Change::Keep, Arith::NotFound) };
            if cas.is_some_and(|c| c != it.cas) {
                return (Change::Keep, Arith::CasMismatch);
            }
            let Some(n) = counter_value(&it.value) else {
                return (Change::Keep, Arith::NonNumeric);
            };
            let n = if incr { n.wrapping_add(delta) } else { n.saturating_sub(delta) };
            let mut v = n.to_string().into_bytes();
            let expires = expires.unwrap_or(it.meta.expires);
            let (change, meta) = if v.len() <= it.value.len() {
                // memcached rewrites the item in place, padded with spaces:
                // flags, stale mark and access state (read, token) kept.
                v.resize(it.value.len(), b' ');
                let meta = ItemMeta { expires, ..it.meta };
                (Change::Rewrite { value: v, meta, cas: new_cas }, meta)
            } else {
                // A longer result is a new item to memcached: flags and
                // expiry kept, the stale mark and access state not.
                let meta = ItemMeta { expires, stale: false, ..it.meta };
                let change = match new_cas {
                    Some(cas) => Change::PutCas { value: v, meta, cas },
                    None => Change::Put { value: v, meta },
                };
                (change, meta)
            };
            (change, Arith::Done(n, 0, meta))
        })
        .await?;
    Ok(match r {
        Arith::Done(n, _, meta) => Arith::Done(n, new_cas.unwrap_or(0), meta),
        r => r,
    })
}

/// The number a value holds for incr, decr and ma, read as memcached reads
/// it (C's `strtoull` in its `safe_strtoull`): leading white space, an
/// optional sign, decimal digits, then the value's end or white space
/// (whatever follows that is ignored: memcached pads a shrunk counter with
/// spaces). A value that overflows 64 bits is not a number; a `-` is
/// refused unless the negated number is below 2^63 (`-0` is 0).
pub(crate) fn counter_value(v: &[u8]) -> Option<u64> {
    let space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let v = &v[v.iter().position(|b| !space(b))?..];
    let (neg, v) = match v.first() {
        Some(b'-') => (true, &v[1..]),
        Some(b'+') => (false, &v[1..]),
        _ => (false, v),
    };
    let end = v.iter().position(|b| !b.is_ascii_digit()).unwrap_or(v.len());
    if end == 0 || matches!(v.get(end), Some(b) if !space(b)) {
        return None;
    }
    let n: u64 = std::str::from_utf8(&v[..end]).ok()?.parse().ok()?;
    let n = if neg { n.wrapping_neg() } else { n };
    (!(neg && (n as i64) < 0)).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::counter_value;

    #[test]
    fn counter_values_are_read_as_memcached_reads_them() {
        // Checked against memcached 1.6.18 (incr on each stored value).
        let cases: &[(&[u8], Option<u64>)] = &[
            (b"5", Some(5)),
            (b" 5", Some(5)),
            (b"\t5", Some(5)),
            (b"+12", Some(12)),
            (b"007", Some(7)),
            (b"5 ", Some(5)),
            (b"5  abc", Some(5)),
            (b"18446744073709551615", Some(u64::MAX)),
            (b"18446744073709551616", None),
            (b"-5", None),
            (b"-0", Some(0)),
            (b"", None),
            (b"   ", None),
            (b"12ab", None),
            (b"0x10", None),
            (b"+", None),
            (b"- 5", None),
        ];
        for &(v, want) in cases {
            assert_eq!(counter_value(v), want, "value {:?}", String::from_utf8_lossy(v));
        }
    }
}
