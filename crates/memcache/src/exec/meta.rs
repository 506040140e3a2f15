//! The executor's meta commands (memcached 1.6 protocol.txt, "Meta
//! Commands"): mg, ms, md, ma, me (mn is answered with the text commands).
//! Their flags arrive checked by the parser (`crate::parse`); here is what
//! they mean.
//!
//! Supported flags: mg `b c E f h k l O q s t u v N R T`; ms
//! `b c C E F I k O q T M` (modes E A P R S); md `b C I k O q T`; ma
//! `b c C E N J D T M q O t v k` (modes I + D -). `E<cas>` gives a modified
//! item that CAS value instead of a fresh one. `h`, `l` and the win token
//! (`W`, `Z`) come from the store's access state (`granary_store::Access`);
//! stale items (`I`, `X`) are marked in their records. A known letter the
//! command has no use for is ignored, as memcached ignores it. See
//! docs/MEMCACHE.md.
//!
//! Invariants: return flags are written in the order the client gave
//! them, with a base64 key's `b` last (memcached's order); `q` hides only
//! the replies memcached hides (HD of ms and md, a success of ma but for
//! a created counter, EN of mg; an mg hit is answered); an mg whose `N`
//! loses the creation to another client answers the item that client made.

use super::{arith, Arith, Exec, Sink};
use crate::context::Ctx;
use crate::parse::{self, Flags, Meta, MsMode, Request};
use granary_store::{Access, Change, Cond, Item, ItemMeta, PutOutcome};
use std::sync::atomic::Ordering::Relaxed;

/// Seconds left before `meta.expires` (-1: never).
fn ttl_left(ctx: &Ctx, meta: &ItemMeta) -> i64 {
    if meta.expires == 0 {
        -1
    } else {
        (meta.expires as i64 - ctx.store.now() as i64).max(0)
    }
}

impl<S: Sink> Exec<'_, S> {
    /// Append the return flags `fl` asks for (in its order), then `extra`.
    /// `h` and `l` come from `acc`, the item's access state before this
    /// request.
    fn ret_flags(&mut self, fl: &Flags<'_>, raw_key: &[u8], it: Option<&Item>, acc: Option<&Access>, extra: &str) {
        for f in &fl.0 {
            let s = match (f.c, it) {
                (b'h', Some(_)) => match acc {
                    Some(a) => format!(" h{}", a.fetched as u8),
                    None => continue,
                },
                (b'l', Some(_)) => match acc {
                    Some(a) => format!(" l{}", self.ctx.store.now().saturating_sub(a.last_access)),
                    None => continue,
                },
                (b'c', Some(it)) => format!(" c{}", it.cas),
                (b'f', Some(it)) => format!(" f{}", it.meta.flags),
                (b's', Some(it)) => format!(" s{}", it.value.len()),
                (b't', Some(it)) => format!(" t{}", ttl_left(self.ctx, &it.meta)),
                (b'k', _) => {
                    self.out().extend_from_slice(b" k");
                    self.out().extend_from_slice(raw_key);
                    continue;
                }
                (b'O', _) => {
                    self.out().extend_from_slice(b" O");
                    self.out().extend_from_slice(f.tok);
                    continue;
                }
                _ => continue,
            };
            self.out().extend_from_slice(s.as_bytes());
        }
        // memcached marks a returned base64 key last.
        if fl.has(b'b') && fl.has(b'k') {
            self.out().extend_from_slice(b" b");
        }
        self.out().extend_from_slice(extra.as_bytes());
    }

    /// A hit: `VA <len> <flags>` and the value with `v`, else `HD <flags>`.
    fn meta_hit(&mut self, fl: &Flags<'_>, raw_key: &[u8], it: &Item, acc: Option<&Access>, extra: &str) {
        let v = fl.has(b'v');
        if v {
            self.out().extend_from_slice(format!("VA {}", it.value.len()).as_bytes());
        } else {
            self.out().extend_from_slice(b"HD");
        }
        self.ret_flags(fl, raw_key, Some(it), acc, extra);
        self.out().extend_from_slice(b"\r\n");
        if v {
            self.out().extend_from_slice(&it.value);
            self.out().extend_from_slice(b"\r\n");
        }
    }

    /// A reply code with the opaque and key flags echoed.
    fn meta_code(&mut self, code: &str, fl: &Flags<'_>, raw_key: &[u8], it: Option<&Item>) {
        self.out().extend_from_slice(code.as_bytes());
        self.ret_flags(fl, raw_key, it, None, "");
        self.out().extend_from_slice(b"\r\n");
    }

    pub(super) async fn mg(
        &mut self,
        m: &Meta<'_>,
        new_cas: Option<u64>,
        recache: Option<i64>,
        ttl: Option<i64>,
        vivify: Option<i64>,
    ) {
        self.ctx.stats.cmd_meta.fetch_add(1, Relaxed);
        let (fl, key, raw_key) = (&m.flags, &m.key[..], m.raw_key);
        // Counted as memcached counts an mg: a touch only (`cmd_touch`,
        // `touch_hits`) when T found the item (or vivified it), else a GET
        // (`cmd_get`, `get_hits` or `get_misses`; a miss with T too).
        let touching = ttl.is_some();
        let count = |s: &crate::ServerStats, found: bool| {
            if found && touching {
                s.cmd_touch.fetch_add(1, Relaxed);
                s.touch_hits.fetch_add(1, Relaxed);
            } else {
                s.cmd_get.fetch_add(1, Relaxed);
                (if found { &s.get_hits } else { &s.get_misses }).fetch_add(1, Relaxed);
            }
        };
        // The win token goes to the first reader of a stale item, or (R) of
        // one with less than that many seconds to live.
        let now = self.ctx.store.now() as i64;
        let want_win = |it: &Item| {
            it.meta.stale || recache.is_some_and(|r| it.meta.expires != 0 && (it.meta.expires as i64 - now) < r)
        };
        // Once more after a vivify that another client's creation beat:
        // then the item it made is read and answered (memcached looks up
        // and creates under one lock, so the loser sees the item, with Z).
        let mut raced = false;
        loop {
            // T: the read and the touch under the key's lock, as memcached
            // does both under its item lock (no write comes between them).
            let got = match ttl {
                Some(ttl) => {
                    let expires = self.expires(ttl);
                    self.ctx.ns.touch_item_access_async(key, !fl.has(b'u'), &want_win, expires, new_cas).await
                }
                None => self.ctx.ns.get_item_access_async(key, !fl.has(b'u'), &want_win).await,
            };
            match got {
                Ok(Some(ia)) => {
                    count(&self.ctx.stats, true);
                    // memcached's order: Z (a token was already sent), X
                    // (stale), W (this client won the token).
                    let mut extra = String::new();
                    if ia.prior.win_sent {
                        extra.push_str(" Z");
                    }
                    if ia.item.meta.stale {
                        extra.push_str(" X");
                    }
                    if ia.won {
                        extra.push_str(" W");
                    }
                    return self.meta_hit(fl, raw_key, &ia.item, Some(&ia.prior), &extra);
                }
                Ok(None) => {
                    if let Some(ttl) = vivify.filter(|_| !raced) {
                        // Vivify: create an empty item; this client "wins"
                        // (W) and is expected to fill it; later readers see Z.
                        let meta = ItemMeta::new(0, self.expires(ttl));
                        let put = self.ctx.ns.put_item_won_async(key, b"", meta, Cond::Absent, new_cas, !fl.has(b'u'));
                        match put.await {
                            Ok((PutOutcome::Stored, cas)) => {
                                count(&self.ctx.stats, true);
                                let it = Item { value: Vec::new(), meta, cas };
                                let acc = Access { fetched: false, last_access: self.ctx.store.now(), win_sent: false };
                                return self.meta_hit(fl, raw_key, &it, Some(&acc), " W");
                            }
                            Ok(_) => {
                                raced = true;
                                continue;
                            }
                            Err(e) => {
                                count(&self.ctx.stats, false);
                                return self.server_error(&e);
                            }
                        }
                    }
                    count(&self.ctx.stats, false);
                    if !fl.has(b'q') {
                        self.meta_code("EN", fl, raw_key, None);
                    }
                    return;
                }
                Err(e) => return self.server_error(&e),
            }
        }
    }

    /// ms with its data block (the value and its line end).
    pub(super) async fn ms(&mut self, req: &Request<'_>, block: &[u8]) {
        let Request::Ms { m, mode, user_flags, ttl, cas, new_cas, .. } = req else {
            unreachable!("ms runs only an ms request")
        };
        let (fl, key, raw_key, cas, new_cas) = (&m.flags, &m.key[..], m.raw_key, *cas, *new_cas);
        self.ctx.stats.cmd_set.fetch_add(1, Relaxed);
        self.ctx.stats.cmd_meta.fetch_add(1, Relaxed);
        // memcached checks the mode once the data block is read, before
        // its line end.
        let mode = match *mode {
            Ok(mode) => mode,
            Err(e) => return self.refuse(e),
        };
        let data = match parse::value(block) {
            Ok(data) => data,
            Err(e) => return self.refuse(e),
        };
        let meta = ItemMeta::new(*user_flags, self.expires(ttl.unwrap_or(0)));
        let result = match mode {
            // I with C: a CAS value older than the item's still stores the
            // value, as stale, keeping the item's expiry (memcached's
            // "set-to-invalid"); a newer one, or 0, is EX. (Set and replace
            // modes: C makes both a CAS store.)
            MsMode::Set | MsMode::Replace if fl.has(b'I') && cas.is_some() => {
                let c = cas.unwrap_or(0);
                // SAFETY: the request's bytes it borrows live in the connection's task, which
                // awaits this in place and is never leaked.
                unsafe {
                    self.ctx.ns.update_borrowing_async(key, |it| {
                        let value = data.to_vec();
                        let change = match it {
                            None => return (Change::Keep, PutOutcome::NotFound),
                            Some(it) if c == it.cas => match new_cas {
                                Some(cas) => Change::PutCas { value, meta, cas },
                                None => Change::Put { value, meta },
                            },
                            // (C0 is never older: memcached answers EX.) The
                            // item's own expiry, none included: not the
                            // namespace's default TTL a `Put` of 0 gets.
                            Some(it) if c != 0 && c < it.cas => {
                                let meta = ItemMeta { expires: it.meta.expires, stale: true, ..meta };
                                Change::Derive { value, meta, cas: new_cas }
                            }
                            Some(_) => return (Change::Keep, PutOutcome::Exists),
                        };
                        (change, PutOutcome::Stored)
                    })
                }
                .await
            }
            MsMode::Set | MsMode::Add | MsMode::Replace => {
                // An add ignores C (as memcached).
                let cond = match (mode, cas) {
                    (MsMode::Add, _) => Cond::Absent,
                    (_, Some(c)) => Cond::Cas(c),
                    (MsMode::Replace, None) => Cond::Present,
                    _ => Cond::Always,
                };
                match new_cas {
                    Some(e) => self.ctx.ns.put_item_with_cas_async(key, data, meta, cond, e).await,
                    None => self.ctx.ns.put_item_async(key, data, meta, cond).await,
                }
                .map(|(o, c)| (o, Some(c)))
            }
            MsMode::Append | MsMode::Prepend => {
                let append = mode == MsMode::Append;
                let max = self.ctx.cfg.item_bytes_max;
                // SAFETY: the request's bytes it borrows live in the connection's task, which
                // awaits this in place and is never leaked.
                unsafe {
                    self.ctx.ns.update_borrowing_async(key, |it| match it {
                        None => (Change::Keep, PutOutcome::NotFound),
                        // C0 checks nothing here (memcached's append).
                        Some(it) if cas.is_some_and(|c| c != 0 && c != it.cas) => (Change::Keep, PutOutcome::Exists),
                        Some(it) if it.value.len() + data.len() > max => (Change::Keep, PutOutcome::NotFound),
                        Some(it) => {
                            let v =
                                if append { [&it.value[..], data].concat() } else { [data, &it.value[..]].concat() };
                            // A new item (memcached): not stale.
                            let meta = ItemMeta { stale: false, ..it.meta };
                            (Change::Derive { value: v, meta, cas: new_cas }, PutOutcome::Stored)
                        }
                    })
                }
                .await
            }
        };
        match result {
            Ok((PutOutcome::Stored, new_cas)) => {
                self.ctx.stats.total_items.fetch_add(1, Relaxed);
                if !fl.has(b'q') {
                    let it = Item { value: data.to_vec(), meta, cas: new_cas.unwrap_or(0) };
                    self.meta_code("HD", fl, raw_key, Some(&it));
                }
            }
            // Not stored: memcached echoes `c` as c0. NF only where C made
            // a set or replace a CAS store (an append's miss is NS).
            Ok((outcome, _)) => {
                let none = Item { value: Vec::new(), meta: ItemMeta::new(0, 0), cas: 0 };
                let code = match (outcome, cas.is_some(), mode) {
                    (PutOutcome::Exists, true, MsMode::Set | MsMode::Replace | MsMode::Append | MsMode::Prepend) => {
                        "EX"
                    }
                    (PutOutcome::NotFound, true, MsMode::Set | MsMode::Replace) => "NF",
                    _ => "NS",
                };
                self.meta_code(code, fl, raw_key, Some(&none))
            }
            Err(e) => self.server_error(&e),
        }
    }

    pub(super) async fn md(&mut self, m: &Meta<'_>, cas: Option<u64>, ttl: Option<i64>) {
        self.ctx.stats.cmd_meta.fetch_add(1, Relaxed);
        let (fl, key, raw_key) = (&m.flags, &m.key[..], m.raw_key);
        let r = match (cas, fl.has(b'I')) {
            (None, false) => self.ctx.ns.delete_async(key).await.map(|found| if found { "HD" } else { "NF" }),
            (cas, invalidate) => {
                // I: the item stays, marked stale, with a new CAS value (and
                // the expiry T gives); its win token goes to the next reader.
                let new_exp = ttl.map(|t| self.expires(t));
                // SAFETY: the request's bytes it borrows live in the connection's task, which
                // awaits this in place and is never leaked.
                unsafe {
                    self.ctx.ns.update_borrowing_async(key, |it| match it {
                        None => (Change::Keep, "NF"),
                        Some(it) if cas.is_some_and(|c| c != it.cas) => (Change::Keep, "EX"),
                        Some(it) if invalidate => {
                            let meta = ItemMeta { stale: true, expires: new_exp.unwrap_or(it.meta.expires), ..it.meta };
                            (Change::Invalidate { value: it.value.clone(), meta }, "HD")
                        }
                        Some(_) => (Change::Delete, "HD"),
                    })
                }
                .await
                .map(|(r, _)| r)
            }
        };
        match r {
            Ok(code) => {
                let c = if code == "HD" { &self.ctx.stats.delete_hits } else { &self.ctx.stats.delete_misses };
                c.fetch_add(1, Relaxed);
                if !(fl.has(b'q') && code == "HD") {
                    self.meta_code(code, fl, raw_key, None);
                }
            }
            Err(e) => self.server_error(&e),
        }
    }

    pub(super) async fn ma(&mut self, req: &Request<'_>) {
        let Request::Ma { m, incr, delta, initial, vivify, ttl, cas, new_cas } = req else {
            unreachable!("ma runs only an ma request")
        };
        self.ctx.stats.cmd_meta.fetch_add(1, Relaxed);
        let (fl, key, raw_key, incr, new_cas) = (&m.flags, &m.key[..], m.raw_key, *incr, *new_cas);
        let delta = delta.unwrap_or(1);
        let new_exp = ttl.map(|t| self.expires(t));
        // C0 checks nothing (memcached's incr and decr).
        let cas = cas.filter(|&c| c != 0);
        let mut r = arith(self.ctx, key, incr, delta, cas, new_exp, new_cas).await;
        let mut vivified = false;
        if let (Ok(Arith::NotFound), Some(viv_ttl)) = (&r, *vivify) {
            let n = initial.unwrap_or(0);
            let meta = ItemMeta::new(0, self.expires(viv_ttl));
            let put = match new_cas {
                Some(c) => {
                    self.ctx.ns.put_item_with_cas_async(key, n.to_string().as_bytes(), meta, Cond::Absent, c).await
                }
                None => self.ctx.ns.put_item_async(key, n.to_string().as_bytes(), meta, Cond::Absent).await,
            };
            r = match put {
                Ok((PutOutcome::Stored, c)) => {
                    vivified = true;
                    Ok(Arith::Done(n, c, meta))
                }
                // Someone else created it meanwhile: apply the delta to theirs.
                Ok(_) => arith(self.ctx, key, incr, delta, cas, new_exp, new_cas).await,
                Err(e) => Err(e),
            };
        }
        match r {
            Ok(Arith::Done(n, c, meta)) => {
                let counter = if incr { &self.ctx.stats.incr_hits } else { &self.ctx.stats.decr_hits };
                counter.fetch_add(1, Relaxed);
                let it = Item { value: n.to_string().into_bytes(), meta, cas: c };
                // q hides a success (as memcached), with or without v, but
                // for the creation of a missing item (N), which memcached
                // answers whatever q says.
                match (fl.has(b'q') && !vivified, fl.has(b'v')) {
                    (true, _) => {}
                    (false, true) => self.meta_hit(fl, raw_key, &it, None, ""),
                    (false, false) => self.meta_code("HD", fl, raw_key, Some(&it)),
                }
            }
            Ok(Arith::NotFound) => {
                let counter = if incr { &self.ctx.stats.incr_misses } else { &self.ctx.stats.decr_misses };
                counter.fetch_add(1, Relaxed);
                self.meta_code("NF", fl, raw_key, None);
            }
            Ok(Arith::CasMismatch) => self.meta_code("EX", fl, raw_key, None),
            Ok(Arith::NonNumeric) => self.client_error("cannot increment or decrement non-numeric value"),
            Err(e) => self.server_error(&e),
        }
    }

    /// me: the item's metadata; not counted as a read.
    pub(super) async fn me(&mut self, key: &[u8]) {
        self.ctx.stats.cmd_meta.fetch_add(1, Relaxed);
        match self.ctx.ns.peek_item_access_async(key).await {
            Ok(Some(ia)) => {
                let it = &ia.item;
                let exp = ttl_left(self.ctx, &it.meta);
                let la = self.ctx.store.now().saturating_sub(ia.prior.last_access);
                let fetch = if ia.prior.fetched { "yes" } else { "no" };
                let s = format!(" exp={exp} la={la} cas={} fetch={fetch} cls=1 size={}\r\n", it.cas, it.value.len());
                let out = self.out();
                out.extend_from_slice(b"ME ");
                out.extend_from_slice(key);
                out.extend_from_slice(s.as_bytes());
            }
            Ok(None) => self.reply("EN"),
            Err(e) => self.server_error(&e),
        }
    }
}
