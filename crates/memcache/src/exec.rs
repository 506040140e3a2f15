//! The executor: runs one parsed [`Request`] (with its data block, for a
//! storage command) against the store and writes memcached's reply bytes
//! into the connection's reply buffer, through a [`Sink`]. It owns no
//! socket and no input: the connection frames and parses requests, reads
//! data blocks, and sends what the sink buffers. The meta commands are in
//! [`meta`], the binary protocol's requests in [`binary`], both part of the
//! executor.
//!
//! Replies follow memcached 1.6's text protocol (protocol.txt) byte for
//! byte, including its errors: `ERROR` for an unknown command, `CLIENT_ERROR
//! ...` for a malformed one, `SERVER_ERROR ...` when the store fails.
//! Storage commands whose value is larger than the configured maximum get
//! `SERVER_ERROR object too large for cache` and their data is skipped
//! ("swallowed") as memcached does; the connection goes on.
//!
//! Invariants:
//! - a request with `noreply` gets no reply at all, errors included (as
//!   memcached), but is counted like any other;
//! - every `ERROR` and `CLIENT_ERROR` counts one `protocol_errors`;
//! - a reply buffer past [`OUT_FLUSH_BYTES`] is sent before the next value
//!   of a multi-get is added, so it holds at most that plus one value.

use crate::context::{command_index, Ctx};
use crate::limits::*;
use crate::parse::{self, Crawler, ParseError, Request, StatsKind, Storage};
use crate::stats;
use granary_store::{Change, Cond, Error, Item, ItemMeta, PutBuf, PutOutcome, ValueBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

mod binary;
mod dump;
mod meta;

/// Where the executor's replies go: the connection's reply buffer, and
/// the sends a request may need before it is done (a multi-get sends as
/// it goes; a large value is sent from the buffer the device read it into).
pub(crate) trait Sink {
    /// The reply buffer.
    fn out(&mut self) -> &mut Vec<u8>;

    /// Send what is buffered; false once the connection is gone.
    async fn flush(&mut self) -> bool;

    /// Send what is buffered, then `value` from its own buffer (no copy);
    /// false once the connection is gone.
    async fn send_value(&mut self, value: ValueBuf) -> bool;
}

/// A storage command whose value is received into its record buffer (from
/// [`ZERO_COPY_MIN_BYTES`] on): [`Exec::zero_copy`] creates it, the
/// connection fills `pb` from its input and the socket, and
/// [`Exec::finish_put`] checks the line end and stores it.
pub(crate) struct PendingPut {
    pub pb: PutBuf,
    meta: ItemMeta,
    cond: Cond,
    /// The command ended in `noreply`.
    pub noreply: bool,
}

/// One plain retrieval of a group ([`Exec::get_group`]).
pub(crate) struct GetReq<'k> {
    pub keys: &'k [&'k [u8]],
    /// `gets`: the replies carry CAS values.
    pub with_cas: bool,
    /// A key over the limit followed `keys` (see `parse::Request::Get`).
    pub bad_key: bool,
}

/// One request's execution: what the server shares, where the replies go,
/// and whether they are suppressed.
pub(crate) struct Exec<'a, S> {
    ctx: &'a Ctx,
    io: &'a mut S,
    /// The request ends in `noreply`: every reply to it is suppressed.
    noreply: bool,
}

impl<'a, S: Sink> Exec<'a, S> {
    pub fn new(ctx: &'a Ctx, io: &'a mut S, noreply: bool) -> Exec<'a, S> {
        Exec { ctx, io, noreply }
    }

    fn out(&mut self) -> &mut Vec<u8> {
        self.io.out()
    }

    fn reply(&mut self, s: &str) {
        if self.noreply {
            return;
        }
        let out = self.io.out();
        out.extend_from_slice(s.as_bytes());
        out.extend_from_slice(b"\r\n");
    }

    /// A request refused: memcached's reply, counted as a protocol error.
    fn refuse(&mut self, e: ParseError) {
        self.ctx.stats.protocol_errors.fetch_add(1, Relaxed);
        self.reply(e.reply());
    }

    /// A line the parser refused (`cmd`: its command token). mg, md, ma
    /// and me count in `cmd_meta` even when refused (ms only once its data
    /// is in).
    pub fn refuse_line(&mut self, cmd: Option<&[u8]>, e: ParseError) {
        if matches!(cmd, Some(b"mg" | b"md" | b"ma" | b"me")) {
            self.ctx.stats.cmd_meta.fetch_add(1, Relaxed);
        }
        self.refuse(e);
    }

    fn client_error(&mut self, msg: &str) {
        self.ctx.stats.protocol_errors.fetch_add(1, Relaxed);
        self.reply(&format!("CLIENT_ERROR {msg}"));
    }

    /// memcached's reply to a value over the item size limit, counted.
    fn too_large(&mut self) {
        self.ctx.stats.store_too_large.fetch_add(1, Relaxed);
        self.reply("SERVER_ERROR object too large for cache");
    }

    /// memcached's reply to a store failure.
    fn server_error(&mut self, e: &Error) {
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
                // A read-only store (`Poisoned`) logged its cause once: its
                // refusals are not logged again per request.
                if matches!(e, Error::Io { .. } | Error::Corruption { .. }) {
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
    fn expires(&self, exptime: i64) -> u32 {
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

    /// Before the data block of a storage request is read: a value over
    /// the item size limit is refused at once (memcached's order), and a
    /// failed set drops the old value, so no stale data outlives it.
    /// Some(bytes of input to skip): the refused data block.
    pub async fn oversized(&mut self, req: &Request<'_>) -> Option<usize> {
        let (len, key, drops_old, meta) = match req {
            Request::Store { kind, key, len, .. } => (*len, *key, *kind == Storage::Set, false),
            Request::Ms { m, len, mode, .. } => (*len, &m.key[..], *mode == Ok(parse::MsMode::Set), true),
            _ => return None,
        };
        if len <= self.ctx.cfg.item_bytes_max {
            return None;
        }
        self.ctx.stats.cmd_set.fetch_add(1, Relaxed);
        if meta {
            self.ctx.stats.cmd_meta.fetch_add(1, Relaxed);
        }
        self.too_large();
        if drops_old {
            let _ = self.ctx.ns.delete_async(key).await;
        }
        Some(len + 2)
    }

    /// A text storage command whose value ([`ZERO_COPY_MIN_BYTES`] or
    /// more) goes from the socket straight into a record buffer; None for
    /// the copying path (append and prepend, which read the old value, and
    /// a key or size the engine refuses, reported once the data is in).
    pub fn zero_copy(&self, req: &Request<'_>) -> Option<PendingPut> {
        let Request::Store { kind, key, flags, exptime, len, cas } = *req else { return None };
        if len < ZERO_COPY_MIN_BYTES || matches!(kind, Storage::Append | Storage::Prepend) {
            return None;
        }
        let pb = self.ctx.ns.new_put_buf(key, len).ok()?;
        let cond = match kind {
            Storage::Add => Cond::Absent,
            Storage::Replace => Cond::Present,
            Storage::Cas => Cond::Cas(cas),
            _ => Cond::Always,
        };
        Some(PendingPut { pb, meta: ItemMeta::new(flags, self.expires(exptime)), cond, noreply: self.noreply })
    }

    /// Run `req`; `block` is its data block (the value and its line end)
    /// for a storage command, empty otherwise. False: close the connection
    /// once the replies are sent (`quit`).
    pub async fn run(&mut self, req: &Request<'_>, block: &[u8]) -> bool {
        match req {
            Request::Get { keys, cas, touch, bad_key } => self.get(keys, *cas, *touch, *bad_key).await,
            Request::Store { kind, key, flags, exptime, cas, .. } => {
                self.storage(*kind, key, *flags, *exptime, *cas, block).await
            }
            Request::Delete { key } => self.delete(key).await,
            Request::Arith { key, incr, delta } => self.arith(key, *incr, *delta).await,
            Request::Touch { key, exptime } => self.touch(key, *exptime).await,
            Request::FlushAll { delay } => self.flush_all(*delay).await,
            Request::Version => self.reply(&format!("VERSION {}", stats::version())),
            // Accepted and ignored: logging is configured with GRANARY_LOG.
            Request::Verbosity => self.reply("OK"),
            Request::Stats(StatsKind::CacheDump { class, limit }) => self.cachedump(*class, *limit).await,
            Request::Stats(StatsKind::CacheDumpDram { limit }) => self.cachedump_dram(*limit).await,
            Request::Stats(kind) => self.stats(*kind),
            Request::LruCrawler(Crawler::Metadump { all }) => self.metadump(*all).await,
            Request::LruCrawler(Crawler::Ok) => self.reply("OK"),
            Request::Shutdown { mode_ok } => match self.ctx.cfg.shutdown {
                None => self.refuse(ParseError::ShutdownNotEnabled),
                Some(_) if !mode_ok => self.refuse(ParseError::ShutdownMode),
                Some(stop) => {
                    // As memcached: no reply; the server stops, draining
                    // this connection with the others.
                    tracing::info!("memcache shutdown command: stopping");
                    stop();
                }
            },
            Request::Quit => return false,
            Request::Mn => {
                self.ctx.stats.cmd_meta.fetch_add(1, Relaxed);
                self.reply("MN")
            }
            Request::Mg { m, new_cas, recache, ttl, vivify } => self.mg(m, *new_cas, *recache, *ttl, *vivify).await,
            Request::Ms { .. } => self.ms(req, block).await,
            Request::Md { m, cas, ttl } => self.md(m, *cas, *ttl).await,
            Request::Ma { .. } => self.ma(req).await,
            Request::Me { key } => self.me(key).await,
        }
        true
    }

    async fn get(&mut self, keys: &[&[u8]], with_cas: bool, touch: Option<i64>, bad_key: bool) {
        if keys.len() > 1 && touch.is_none() {
            return self.multi_get(keys, with_cas, bad_key).await;
        }
        let expires = touch.map(|e| self.expires(e));
        // A touching get (gat, gats) counts as a touch only, as memcached
        // counts it (`cmd_touch`, `touch_hits`, `touch_misses`).
        for &key in keys {
            let Some(exp) = expires else {
                self.ctx.stats.cmd_get.fetch_add(1, Relaxed);
                // Served from the buffer the device read the value into.
                match self.ctx.ns.get_buf_async(key).await {
                    Ok(Some(vb)) => {
                        self.ctx.stats.get_hits.fetch_add(1, Relaxed);
                        // A request with a refused key answers its error
                        // alone, as memcached does.
                        if !bad_key && !self.value_buf(key, vb, with_cas).await {
                            return;
                        }
                        if self.out().len() >= OUT_FLUSH_BYTES && !self.io.flush().await {
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
                    self.ctx.stats.touch_hits.fetch_add(1, Relaxed);
                    if !bad_key {
                        self.value_line(key, &it, with_cas);
                    }
                    // A multi-get of large items sends as it goes, so its
                    // reply never holds more than OUT_FLUSH_BYTES + one item.
                    if self.out().len() >= OUT_FLUSH_BYTES && !self.io.flush().await {
                        return;
                    }
                }
                Ok(None) => {
                    self.ctx.stats.touch_misses.fetch_add(1, Relaxed);
                }
                Err(e) => return self.server_error(&e),
            }
        }
        if bad_key {
            return self.refuse(ParseError::BadFormat);
        }
        self.reply("END");
    }

    /// `get`/`gets` of several keys: [`Exec::get_group`] of one request.
    async fn multi_get(&mut self, keys: &[&[u8]], with_cas: bool, bad_key: bool) {
        self.get_group(&[GetReq { keys, with_cas, bad_key }], None).await;
    }

    /// Plain retrievals (`get`/`gets`, no touch) answered together, as one
    /// multi-get or a run of them pipelined one after another: their keys'
    /// reads run together, up to [`MULTI_GET_READS`] at once and
    /// [`multi_get_bytes`] of records (sized by the index), and each
    /// request's replies go out in its keys' order, the requests in theirs.
    /// Only reads are grouped: no write of this connection comes between
    /// them, so starting a read before the replies ahead of it are sent
    /// changes nothing a client can tell. A read that fails ends its request
    /// with the error a single GET gets; the next requests are answered.
    /// With `started`, each request's latency is counted when it is
    /// answered (the caller counts a request on its own).
    pub async fn get_group(&mut self, reqs: &[GetReq<'_>], started: Option<Instant>) {
        let ctx = self.ctx;
        let mut reads = granary_rt::Window::new(MULTI_GET_READS, multi_get_bytes(ctx.cfg.item_bytes_max));
        let mut queued = reqs.iter().enumerate().flat_map(|(r, q)| q.keys.iter().map(move |&k| (r, k)));
        let mut next = queued.next();
        // Per request: keys not answered yet, and whether a read failed.
        let mut left: Vec<usize> = reqs.iter().map(|q| q.keys.len()).collect();
        let mut failed = vec![false; reqs.len()];
        let mut answered = 0;
        loop {
            while answered < reqs.len() && left[answered] == 0 {
                let q = &reqs[answered];
                if failed[answered] {
                    // Its error was its last line.
                } else if q.bad_key {
                    self.refuse(ParseError::BadFormat);
                } else {
                    self.reply("END");
                }
                if let Some(t) = started {
                    let name: &[u8] = if q.with_cas { b"gets" } else { b"get" };
                    ctx.stats.latency[command_index(name)].since(t);
                }
                answered += 1;
            }
            // Misses' ENDs and errors count too: a group of many requests
            // may answer without a hit for long.
            if self.out().len() >= OUT_FLUSH_BYTES && !self.io.flush().await {
                return;
            }
            while let Some((r, key)) = next {
                // A key the store refuses is asked anyway: its read
                // answers with the error a single GET gets.
                let hint = ctx.ns.value_size_hint(key).unwrap_or(0);
                if !reads.has_room(hint) {
                    break;
                }
                reads.push(async move { (r, key, ctx.ns.get_buf_async(key).await) }, hint);
                next = queued.next();
            }
            let Some((r, key, got)) = reads.next().await else { break };
            left[r] -= 1;
            if failed[r] {
                continue;
            }
            ctx.stats.cmd_get.fetch_add(1, Relaxed);
            match got {
                Ok(Some(vb)) => {
                    ctx.stats.get_hits.fetch_add(1, Relaxed);
                    if !reqs[r].bad_key && !self.value_buf(key, vb, reqs[r].with_cas).await {
                        return;
                    }
                }
                Ok(None) => {
                    ctx.stats.get_misses.fetch_add(1, Relaxed);
                }
                Err(e) => {
                    // Every earlier request is answered (outputs come in
                    // order), so the error lands in this one's place.
                    self.server_error(&e);
                    failed[r] = true;
                }
            }
        }
    }

    /// A `VALUE` reply from the read buffer: copied into the reply buffer,
    /// or, from [`ZERO_COPY_MIN_BYTES`] on, sent from the read buffer
    /// itself after what is buffered. False if the connection is gone.
    async fn value_buf(&mut self, key: &[u8], vb: ValueBuf, with_cas: bool) -> bool {
        let head = if with_cas {
            format!(" {} {} {}\r\n", vb.meta.flags, vb.len(), vb.cas)
        } else {
            format!(" {} {}\r\n", vb.meta.flags, vb.len())
        };
        let out = self.out();
        out.extend_from_slice(b"VALUE ");
        out.extend_from_slice(key);
        out.extend_from_slice(head.as_bytes());
        if vb.len() < ZERO_COPY_MIN_BYTES {
            out.extend_from_slice(vb.value());
        } else if !self.io.send_value(vb).await {
            return false;
        }
        self.out().extend_from_slice(b"\r\n");
        true
    }

    fn value_line(&mut self, key: &[u8], it: &Item, with_cas: bool) {
        let head = if with_cas {
            format!(" {} {} {}\r\n", it.meta.flags, it.value.len(), it.cas)
        } else {
            format!(" {} {}\r\n", it.meta.flags, it.value.len())
        };
        let out = self.out();
        out.extend_from_slice(b"VALUE ");
        out.extend_from_slice(key);
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(&it.value);
        out.extend_from_slice(b"\r\n");
    }

    /// set/add/replace/append/prepend/cas with their data block.
    async fn storage(&mut self, kind: Storage, key: &[u8], flags: u32, exptime: i64, cas: u64, block: &[u8]) {
        self.ctx.stats.cmd_set.fetch_add(1, Relaxed);
        let data = match parse::value(block) {
            Ok(data) => data,
            Err(e) => return self.refuse(e),
        };
        let meta = ItemMeta::new(flags, self.expires(exptime));
        let r = match kind {
            Storage::Set => self.put(key, data, meta, Cond::Always).await,
            Storage::Add => self.put(key, data, meta, Cond::Absent).await,
            Storage::Replace => self.put(key, data, meta, Cond::Present).await,
            Storage::Cas => self.put(key, data, meta, Cond::Cas(cas)).await,
            Storage::Append | Storage::Prepend => {
                let append = kind == Storage::Append;
                let max = self.ctx.cfg.item_bytes_max;
                // SAFETY: the request's bytes it borrows live in the connection's task, which
                // awaits this in place and is never leaked.
                let r = unsafe {
                    self.ctx.ns.update_borrowing_async(key, |it| match it {
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
                            let meta = ItemMeta { stale: false, ..it.meta };
                            (Change::Derive { value: v, meta, cas: None }, Ok(true))
                        }
                    })
                }
                .await;
                match r {
                    Ok((Ok(true), _)) => {
                        // A new item linked, as memcached counts it.
                        self.ctx.stats.total_items.fetch_add(1, Relaxed);
                        Ok("STORED")
                    }
                    Ok((Ok(false), _)) => Ok("NOT_STORED"),
                    Ok((Err(()), _)) => Err(Error::ValueTooLarge { len: 0, max: max as u64 }),
                    Err(e) => Err(e),
                }
            }
        };
        match r {
            Ok(s) => self.reply(s),
            Err(e) => self.server_error(&e),
        }
    }

    /// The value of a [`PendingPut`] is in; `end` is the two bytes after
    /// it: check that they end the block, and store it.
    pub async fn finish_put(&mut self, p: PendingPut, end: &[u8]) {
        self.ctx.stats.cmd_set.fetch_add(1, Relaxed);
        if let Err(e) = parse::value(end) {
            return self.refuse(e);
        }
        self.ctx.stats.zero_copy_sets.fetch_add(1, Relaxed);
        let r = self.ctx.ns.put_buf_async(p.pb, p.meta, p.cond).await;
        match r.map(|(outcome, _)| self.put_reply(p.cond, outcome)) {
            Ok(s) => self.reply(s),
            Err(e) => self.server_error(&e),
        }
    }

    async fn put(&mut self, key: &[u8], data: &[u8], meta: ItemMeta, cond: Cond) -> Result<&'static str, Error> {
        let (outcome, _) = self.ctx.ns.put_item_async(key, data, meta, cond).await?;
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

    async fn delete(&mut self, key: &[u8]) {
        match self.ctx.ns.delete_async(key).await {
            Ok(found) => {
                let c = if found { &self.ctx.stats.delete_hits } else { &self.ctx.stats.delete_misses };
                c.fetch_add(1, Relaxed);
                self.reply(if found { "DELETED" } else { "NOT_FOUND" });
            }
            Err(e) => self.server_error(&e),
        }
    }

    /// `incr|decr <key> <delta>`.
    async fn arith(&mut self, key: &[u8], incr: bool, delta: u64) {
        match arith(self.ctx, key, incr, delta, None, None, None).await {
            Ok(Arith::Done(n, ..)) => {
                let c = if incr { &self.ctx.stats.incr_hits } else { &self.ctx.stats.decr_hits };
                c.fetch_add(1, Relaxed);
                self.reply(&n.to_string());
            }
            Ok(Arith::NotFound) => {
                let c = if incr { &self.ctx.stats.incr_misses } else { &self.ctx.stats.decr_misses };
                c.fetch_add(1, Relaxed);
                self.reply("NOT_FOUND");
            }
            Ok(Arith::NonNumeric) => self.client_error("cannot increment or decrement non-numeric value"),
            Ok(Arith::CasMismatch) => self.reply("EXISTS"),
            Err(e) => self.server_error(&e),
        }
    }

    /// `touch <key> <exptime>`.
    async fn touch(&mut self, key: &[u8], exptime: i64) {
        self.ctx.stats.cmd_touch.fetch_add(1, Relaxed);
        let exp = self.expires(exptime);
        match touch_item(self.ctx, key, exp, None, true).await {
            Ok(Some(_)) => {
                self.ctx.stats.touch_hits.fetch_add(1, Relaxed);
                self.reply("TOUCHED");
            }
            Ok(None) => {
                self.ctx.stats.touch_misses.fetch_add(1, Relaxed);
                self.reply("NOT_FOUND");
            }
            Err(e) => self.server_error(&e),
        }
    }

    /// `flush_all [delay]`: with a delay, the flush happens then (a timer
    /// on this executor; a restart before it forgets it).
    async fn flush_all(&mut self, delay: i64) {
        match self.flush_after(delay).await {
            Ok(()) => self.reply("OK"),
            Err(e) => self.server_error(&e),
        }
    }

    /// Flush the namespace now, or (`delay` > 0, an exptime) then; counted.
    /// As memcached keeps one flush time, each `flush_all` replaces a
    /// delayed one still pending (from any connection): one timer per
    /// server ([`DelayedFlush`](crate::context::DelayedFlush)), whatever the number of requests. An
    /// absolute time before the server started flushes nothing but still
    /// replaces the pending one (memcached's flush time is then before
    /// every item); one since then, now included, flushes before the reply.
    async fn flush_after(&mut self, delay: i64) -> Result<(), Error> {
        self.ctx.stats.cmd_flush.fetch_add(1, Relaxed);
        if delay > 0 {
            let at = self.expires(delay) as i64;
            let now = self.ctx.store.now() as i64;
            if delay > RELATIVE_EXPTIME_MAX && at == 1 {
                self.ctx.delayed_flush.cancel();
                return Ok(()); // `expires`: before the start
            }
            if at > now {
                let due = std::time::Instant::now() + std::time::Duration::from_secs((at - now) as u64);
                self.ctx.delayed_flush.set(due, &self.ctx.ns);
                return Ok(());
            }
        }
        self.ctx.delayed_flush.cancel();
        self.ctx.ns.flush_all_async().await?;
        Ok(())
    }

    fn stats(&mut self, kind: StatsKind) {
        let lines = match kind {
            StatsKind::General => stats::general(self.ctx),
            StatsKind::Settings => stats::settings(self.ctx),
            StatsKind::Items => stats::items(self.ctx),
            StatsKind::Latency => stats::latency(self.ctx),
            StatsKind::Slabs => stats::slabs(),
            StatsKind::Reset => return self.reply("RESET"),
            // Granary records no per-prefix statistics (memcached's
            // `-D`): on and off are accepted, and a dump is empty.
            StatsKind::DetailSet => return self.reply("OK"),
            StatsKind::DetailDump => return self.reply("END"),
            StatsKind::CacheDump { .. } | StatsKind::CacheDumpDram { .. } => unreachable!("run() dumps"),
        };
        for (k, v) in lines {
            self.reply(&format!("STAT {k} {v}"));
        }
        self.reply("END");
    }
}

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
        .ns
        .update_async(key, move |it| match it {
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

/// incr/decr (and `ma`) with memcached's rules: incr wraps at 2^64, decr
/// stops at 0, the value must be a number ([`counter_value`]); flags and
/// expiry are kept. Like memcached, a result shorter than the old value is
/// padded with spaces to the old length. With `cas`, only if the item's
/// CAS value matches; with `expires`, the item gets that expiry in the
/// same write; the new version gets the CAS value `new_cas` if given (meta
/// `E`), else a fresh one.
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
        .ns
        .update_async(key, move |it| {
            let Some(it) = it else { return (Change::Keep, Arith::NotFound) };
            // memcached refuses an empty value before it checks the CAS
            // value (do_add_delta).
            if it.value.is_empty() {
                return (Change::Keep, Arith::NonNumeric);
            }
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
                (Change::Derive { value: v, meta, cas: new_cas }, meta)
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
/// optional sign, decimal digits, then the value's end, white space or a NUL
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
    // A NUL ends the number too (memcached's strtoull stops there: a C
    // client storing strlen + 1 bytes).
    if end == 0 || matches!(v.get(end), Some(b) if !space(b) && *b != 0) {
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
            (b"5\0", Some(5)),
            (b"5\0ab", Some(5)),
            (b"\x005", None),
        ];
        for &(v, want) in cases {
            assert_eq!(counter_value(v), want, "value {:?}", String::from_utf8_lossy(v));
        }
    }
}
