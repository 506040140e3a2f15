//! The executor's binary protocol requests: a framed [`Packet`] (see
//! `crate::binary`) run against the store with the text commands' engine
//! calls and semantics (CAS values, memcached's exptime rules, flags, the
//! connection's namespace), answered with memcached 1.6's responses.
//!
//! Invariants:
//! - every response echoes the request's opcode and opaque;
//! - a quiet opcode sends nothing on success (get: nothing on a miss
//!   either), its errors as the loud one; quitq closes silently;
//! - a successful store, arithmetic or get-and-touch carries the item's
//!   CAS value; error responses carry memcached's text as their value;
//! - counters and statistics are those of the matching text command.

use super::{arith, touch_item, Arith, Exec, Sink};
use crate::binary::{self, status, Header, Op, Packet, StoreKind};
use crate::context::command_index;
use crate::limits::{multi_get_bytes, MULTI_GET_READS, OUT_FLUSH_BYTES, ZERO_COPY_MIN_BYTES};
use crate::stats;
use granary_store::{Change, Cond, Error, ItemMeta, PutOutcome, ValueBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// A big-endian u32 of `b` at `at` (the caller checked the length).
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A big-endian u64 of `b` at `at` (the caller checked the length).
fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

impl<S: Sink> Exec<'_, S> {
    /// A successful response.
    fn bin_ok(&mut self, h: &Header, cas: u64, extras: &[u8], key: &[u8], value: &[u8]) {
        binary::response(self.out(), h.opcode, h.opaque, status::OK, cas, [extras, key, value]);
    }

    /// An error response with memcached's text; refusals of the request
    /// itself count as protocol errors.
    pub fn bin_error(&mut self, h: &Header, st: u16) {
        if matches!(st, status::EINVAL | status::UNKNOWN_COMMAND) {
            self.ctx.stats.protocol_errors.fetch_add(1, Relaxed);
        }
        let text = status::text(st);
        binary::response(self.out(), h.opcode, h.opaque, st, 0, [b"", b"", text.as_bytes()]);
    }

    /// A request refused before its body is read (the connection skips
    /// it): an unknown opcode, or a value over the item size limit, which
    /// (a set, as memcached) drops the key's old value, so no stale data
    /// outlives it. As memcached 1.6 does for such a request, neither
    /// `cmd_set` nor `store_too_large` counts it.
    pub async fn bin_refuse(&mut self, h: &Header, st: u16, op: Option<Op>, key: &[u8]) {
        if st == status::E2BIG {
            if let Some(Op::Store { kind: StoreKind::Set, .. }) = op {
                let _ = self.ctx.ns.delete_async(key).await;
            }
        }
        self.bin_error(h, st);
    }

    /// A store failure as memcached's status.
    fn bin_store_error(&mut self, h: &Header, e: &Error) {
        let st = match e {
            Error::NoSpace { .. } => {
                self.ctx.stats.store_no_memory.fetch_add(1, Relaxed);
                status::ENOMEM
            }
            Error::ValueTooLarge { .. } => {
                self.ctx.stats.store_too_large.fetch_add(1, Relaxed);
                status::E2BIG
            }
            // The client's key (the engine's reserved prefix): memcached's
            // status for a key it refuses.
            Error::ReservedKey | Error::KeyLength { .. } => status::EINVAL,
            e => {
                // A read-only store (`Poisoned`) logged its cause once: its
                // refusals are not logged again per request.
                if matches!(e, Error::Io { .. } | Error::Corruption { .. }) {
                    tracing::warn!(error = %e, "request failed in the store");
                } else {
                    tracing::debug!(error = %e, "request refused by the store");
                }
                status::EINTERNAL
            }
        };
        self.bin_error(h, st);
    }

    /// Run a binary request. False: close the connection once the
    /// responses are sent (quit).
    pub async fn binary(&mut self, p: &Packet<'_>) -> bool {
        let h = &p.h;
        match p.op {
            Op::Get { quiet, with_key } => self.bin_get(h, p.key, quiet, with_key).await,
            Op::Gat { quiet, with_key } => self.bin_gat(h, p, quiet, with_key, true).await,
            Op::Touch => self.bin_gat(h, p, false, false, false).await,
            Op::Store { kind, quiet } => self.bin_store(h, p, kind, quiet).await,
            Op::Concat { append, quiet } => self.bin_concat(h, p, append, quiet).await,
            Op::Delete { quiet } => self.bin_delete(h, p.key, quiet).await,
            Op::Arith { incr, quiet } => self.bin_arith(h, p, incr, quiet).await,
            Op::Flush { quiet } => {
                let delay = if p.extras.is_empty() { 0 } else { be32(p.extras, 0) as i64 };
                match self.flush_after(delay).await {
                    Ok(()) if quiet => {}
                    Ok(()) => self.bin_ok(h, 0, b"", b"", b""),
                    Err(e) => self.bin_store_error(h, &e),
                }
            }
            // Accepted and ignored: logging is configured with GRANARY_LOG.
            Op::Noop | Op::Verbosity => self.bin_ok(h, 0, b"", b"", b""),
            Op::Version => self.bin_ok(h, 0, b"", b"", stats::version().as_bytes()),
            Op::Stat => self.bin_stat(h, p.key),
            Op::Quit { quiet } => {
                if !quiet {
                    self.bin_ok(h, 0, b"", b"", b"");
                }
                return false;
            }
        }
        true
    }

    async fn bin_get(&mut self, h: &Header, key: &[u8], quiet: bool, with_key: bool) {
        let got = self.ctx.ns.get_buf_async(key).await;
        self.bin_get_reply(h, key, quiet, with_key, got).await;
    }

    /// Gets (get, getq, getk, getkq) pipelined one after another, answered
    /// together: their reads run together ([`MULTI_GET_READS`] at once,
    /// within [`multi_get_bytes`] of records sized by the index) and their
    /// responses go out in order, as `Exec::get_group` does for the text
    /// protocol (a client's quiet multi-get: getkq per key, then a noop).
    /// Each request's latency is counted when it is answered.
    pub async fn bin_get_group(&mut self, reqs: &[Packet<'_>], started: Instant) {
        let ctx = self.ctx;
        let mut reads = granary_rt::Window::new(MULTI_GET_READS, multi_get_bytes(ctx.cfg.item_bytes_max));
        let mut queued = reqs.iter();
        let mut next = queued.next();
        loop {
            while let Some(p) = next {
                let hint = ctx.ns.value_size_hint(p.key).unwrap_or(0);
                if !reads.has_room(hint) {
                    break;
                }
                reads.push(async move { (p, ctx.ns.get_buf_async(p.key).await) }, hint);
                next = queued.next();
            }
            let Some((p, got)) = reads.next().await else { break };
            let Op::Get { quiet, with_key } = p.op else { unreachable!("only gets are grouped") };
            self.bin_get_reply(&p.h, p.key, quiet, with_key, got).await;
            ctx.stats.latency[command_index(p.op.command_name().as_bytes())].since(started);
            if self.out().len() >= OUT_FLUSH_BYTES && !self.io.flush().await {
                return;
            }
        }
    }

    /// A get's response, from what its read found.
    async fn bin_get_reply(
        &mut self,
        h: &Header,
        key: &[u8],
        quiet: bool,
        with_key: bool,
        got: Result<Option<ValueBuf>, Error>,
    ) {
        self.ctx.stats.cmd_get.fetch_add(1, Relaxed);
        match got {
            Ok(Some(vb)) => {
                self.ctx.stats.get_hits.fetch_add(1, Relaxed);
                let k: &[u8] = if with_key { key } else { b"" };
                let flags = vb.meta.flags.to_be_bytes();
                if vb.len() < ZERO_COPY_MIN_BYTES {
                    self.bin_ok(h, vb.cas, &flags, k, vb.value());
                } else {
                    // Sent from the buffer the device read it into.
                    let out = self.out();
                    binary::response_header(out, h.opcode, h.opaque, status::OK, vb.cas, 4, k.len(), vb.len());
                    out.extend_from_slice(&flags);
                    out.extend_from_slice(k);
                    self.io.send_value(vb).await;
                }
            }
            // A reserved key holds no value of a client's: a miss, so a
            // quiet get of one stays quiet.
            Ok(None) | Err(Error::ReservedKey) => {
                self.ctx.stats.get_misses.fetch_add(1, Relaxed);
                self.bin_miss(h, key, quiet, with_key);
            }
            Err(e) => self.bin_store_error(h, &e),
        }
    }

    /// A get's miss: nothing if quiet; the key (getk, gatk), or the text.
    fn bin_miss(&mut self, h: &Header, key: &[u8], quiet: bool, with_key: bool) {
        if quiet {
        } else if with_key {
            binary::response(self.out(), h.opcode, h.opaque, status::KEY_ENOENT, 0, [b"", key, b""]);
        } else {
            self.bin_error(h, status::KEY_ENOENT);
        }
    }

    /// gat, gatq, gatk, gatkq (`value`), and touch (no value).
    async fn bin_gat(&mut self, h: &Header, p: &Packet<'_>, quiet: bool, with_key: bool, value: bool) {
        let exp = self.expires(be32(p.extras, 0) as i64);
        // Counted as a touch only, a gat too, as memcached counts it.
        self.ctx.stats.cmd_touch.fetch_add(1, Relaxed);
        // A touch marks the item fetched, as memcached's does (and the
        // text touch).
        match touch_item(self.ctx, p.key, exp, None, true).await {
            Ok(Some(it)) => {
                self.ctx.stats.touch_hits.fetch_add(1, Relaxed);
                // (A quiet gat hides only a miss, as a quiet get.)
                let k: &[u8] = if with_key { p.key } else { b"" };
                let v: &[u8] = if value { &it.value } else { b"" };
                self.bin_ok(h, it.cas, &it.meta.flags.to_be_bytes(), k, v);
            }
            Ok(None) | Err(Error::ReservedKey) => {
                self.ctx.stats.touch_misses.fetch_add(1, Relaxed);
                self.bin_miss(h, p.key, quiet, with_key);
            }
            Err(e) => self.bin_store_error(h, &e),
        }
    }

    /// set, add, replace: a CAS value in the header makes any of them a
    /// CAS store (memcached).
    async fn bin_store(&mut self, h: &Header, p: &Packet<'_>, kind: StoreKind, quiet: bool) {
        self.ctx.stats.cmd_set.fetch_add(1, Relaxed);
        let meta = ItemMeta::new(be32(p.extras, 0), self.expires(be32(p.extras, 4) as i64));
        let cond = match kind {
            _ if h.cas != 0 => Cond::Cas(h.cas),
            StoreKind::Set => Cond::Always,
            StoreKind::Add => Cond::Absent,
            StoreKind::Replace => Cond::Present,
        };
        match self.ctx.ns.put_item_async(p.key, p.value, meta, cond).await {
            Ok((outcome, cas)) => match self.put_reply(cond, outcome) {
                "STORED" if quiet => {}
                "STORED" => self.bin_ok(h, cas, b"", b"", b""),
                "EXISTS" => self.bin_error(h, status::KEY_EEXISTS),
                "NOT_FOUND" => self.bin_error(h, status::KEY_ENOENT),
                // memcached's mapping of a refused add and replace.
                _ if kind == StoreKind::Add => self.bin_error(h, status::KEY_EEXISTS),
                _ if kind == StoreKind::Replace => self.bin_error(h, status::KEY_ENOENT),
                _ => self.bin_error(h, status::NOT_STORED),
            },
            Err(e) => self.bin_store_error(h, &e),
        }
    }

    /// append, prepend: a missing key, or a result over the item size
    /// limit, is "Not stored."; a CAS value in the header must match.
    async fn bin_concat(&mut self, h: &Header, p: &Packet<'_>, append: bool, quiet: bool) {
        self.ctx.stats.cmd_set.fetch_add(1, Relaxed);
        let (max, data, cas) = (self.ctx.cfg.item_bytes_max, p.value, h.cas);
        // SAFETY: the request's bytes it borrows live in the connection's task, which
        // awaits this in place and is never leaked.
        let r = unsafe {
            self.ctx.ns.update_borrowing_async(p.key, |it| match it {
                None => (Change::Keep, status::NOT_STORED),
                Some(it) if cas != 0 && cas != it.cas => (Change::Keep, status::KEY_EEXISTS),
                // memcached cannot allocate the new item: "Not stored."
                Some(it) if it.value.len() + data.len() > max => (Change::Keep, status::NOT_STORED),
                Some(it) => {
                    let v = if append { [&it.value[..], data].concat() } else { [data, &it.value[..]].concat() };
                    // A new item to memcached: flags and expiry kept, a
                    // stale mark not.
                    (Change::Derive { value: v, meta: ItemMeta { stale: false, ..it.meta }, cas: None }, status::OK)
                }
            })
        }
        .await;
        match r {
            Ok((status::OK, new_cas)) => {
                self.ctx.stats.total_items.fetch_add(1, Relaxed);
                if !quiet {
                    self.bin_ok(h, new_cas.unwrap_or(0), b"", b"", b"");
                }
            }
            Ok((st, _)) => {
                if st == status::E2BIG {
                    self.ctx.stats.store_too_large.fetch_add(1, Relaxed);
                }
                self.bin_error(h, st)
            }
            Err(e) => self.bin_store_error(h, &e),
        }
    }

    /// delete: a CAS value in the header must match.
    async fn bin_delete(&mut self, h: &Header, key: &[u8], quiet: bool) {
        let cas = h.cas;
        let r = if cas == 0 {
            self.ctx.ns.delete_async(key).await.map(|found| if found { status::OK } else { status::KEY_ENOENT })
        } else {
            // SAFETY: the request's bytes it borrows live in the connection's task, which
            // awaits this in place and is never leaked.
            unsafe {
                self.ctx.ns.update_borrowing_async(key, |it| match it {
                    None => (Change::Keep, status::KEY_ENOENT),
                    Some(it) if it.cas != cas => (Change::Keep, status::KEY_EEXISTS),
                    Some(_) => (Change::Delete, status::OK),
                })
            }
            .await
            .map(|(st, _)| st)
        };
        match r {
            Ok(st) => {
                // A CAS mismatch is neither (memcached counts it nowhere).
                match st {
                    status::OK => self.ctx.stats.delete_hits.fetch_add(1, Relaxed),
                    status::KEY_ENOENT => self.ctx.stats.delete_misses.fetch_add(1, Relaxed),
                    _ => 0,
                };
                match st {
                    status::OK if quiet => {}
                    status::OK => self.bin_ok(h, 0, b"", b"", b""),
                    st => self.bin_error(h, st),
                }
            }
            Err(e) => self.bin_store_error(h, &e),
        }
    }

    /// increment, decrement: extras delta, initial, expiration; a missing
    /// counter is created with `initial` unless the expiration is
    /// [`binary::ARITH_NO_CREATE`]. The new value as 8 bytes, big-endian.
    async fn bin_arith(&mut self, h: &Header, p: &Packet<'_>, incr: bool, quiet: bool) {
        let (delta, initial, exptime) = (be64(p.extras, 0), be64(p.extras, 8), be32(p.extras, 16));
        let cas = (h.cas != 0).then_some(h.cas);
        let mut r = arith(self.ctx, p.key, incr, delta, cas, None, None).await;
        if matches!(r, Ok(Arith::NotFound)) {
            // A miss only when not created (memcached counts a created
            // counter as neither).
            if exptime == binary::ARITH_NO_CREATE {
                let miss = if incr { &self.ctx.stats.incr_misses } else { &self.ctx.stats.decr_misses };
                miss.fetch_add(1, Relaxed);
            } else {
                let meta = ItemMeta::new(0, self.expires(exptime as i64));
                let put = self.ctx.ns.put_item_async(p.key, initial.to_string().as_bytes(), meta, Cond::Absent).await;
                r = match put {
                    Ok((PutOutcome::Stored, c)) => {
                        self.ctx.stats.total_items.fetch_add(1, Relaxed);
                        Ok(Arith::Done(initial, c, meta))
                    }
                    // Created by another client meanwhile: apply the delta.
                    Ok(_) => arith(self.ctx, p.key, incr, delta, cas, None, None).await,
                    Err(e) => Err(e),
                };
            }
        } else if matches!(r, Ok(Arith::Done(..))) {
            let hit = if incr { &self.ctx.stats.incr_hits } else { &self.ctx.stats.decr_hits };
            hit.fetch_add(1, Relaxed);
        }
        match r {
            Ok(Arith::Done(..)) if quiet => {}
            Ok(Arith::Done(n, c, _)) => self.bin_ok(h, c, b"", b"", &n.to_be_bytes()),
            Ok(Arith::NotFound) => self.bin_error(h, status::KEY_ENOENT),
            Ok(Arith::NonNumeric) => self.bin_error(h, status::DELTA_BADVAL),
            Ok(Arith::CasMismatch) => self.bin_error(h, status::KEY_EEXISTS),
            Err(e) => self.bin_store_error(h, &e),
        }
    }

    /// stat: each line as a response with its name as key, then one with
    /// an empty key; an unknown group "Not found". As memcached 1.6.18:
    /// `reset`, `settings` and `detail` match as prefixes (`resetX` is a
    /// reset), `detail on`/`off` answer the end alone, `detail dump` an
    /// empty dump, `sizes` that the histogram is off.
    fn bin_stat(&mut self, h: &Header, group: &[u8]) {
        let lines = match group {
            b"" => stats::general(self.ctx),
            g if g.starts_with(b"reset") => Vec::new(),
            g if g.starts_with(b"settings") => stats::settings(self.ctx),
            g if g.starts_with(b"detail") => match &g[b"detail".len()..] {
                r if r.starts_with(b" on") || r.starts_with(b" off") => Vec::new(),
                r if r.starts_with(b" dump") => vec![("detailed".to_string(), "END\r\n".to_string())],
                _ => return self.bin_error(h, status::KEY_ENOENT),
            },
            b"sizes" => vec![("sizes_status".to_string(), "disabled".to_string())],
            b"items" => stats::items(self.ctx),
            b"latency" => stats::latency(self.ctx),
            b"slabs" => stats::slabs(),
            _ => return self.bin_error(h, status::KEY_ENOENT),
        };
        for (k, v) in lines {
            self.bin_ok(h, 0, b"", k.as_bytes(), v.as_bytes());
        }
        self.bin_ok(h, 0, b"", b"", b"");
    }
}
