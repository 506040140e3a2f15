//! The meta commands (memcached 1.6 protocol.txt, "Meta Commands"): mg, ms,
//! md, ma, me (mn is answered in `exec`), and the `stats` views.
//!
//! Supported flags: mg `b c E f h k l O q s t u v N R T`; ms
//! `b c C E F I k O q T M` (modes E A P R S); md `b C I k O q T`; ma
//! `b c C E N J D T M q O t v k` (modes I + D -). `E<cas>` gives a modified
//! item that CAS value instead of a fresh one. `h`, `l` and the win token
//! (`W`, `Z`) come from the store's access state (`granary_store::Access`);
//! stale items (`I`, `X`) are marked in their records.
//!
//! Flags are checked as memcached checks them, the same way for every meta
//! command ([`flags`]): a letter memcached does not know (`x` and `S`
//! among them) is refused with `CLIENT_ERROR invalid flag`, a repeated one
//! with `CLIENT_ERROR duplicate flag`, a numeric token that does not parse
//! with memcached's message for that letter, even where the command does
//! not use it; a known letter the command has no use for (`v` on ms, `h`
//! on ma, the proxy's `P` and `L`, ...) is accepted and ignored, as
//! memcached ignores it, so clients that send one set of flags with every
//! command work unchanged. See docs/MEMCACHE.md.

use crate::exec::{arith, key_ok, parse, touch_item, version, Arith, Conn, Step};
use crate::server::Ctx;
use granary_store::{Access, Change, Cond, Item, ItemMeta, PutOutcome};
use std::sync::atomic::Ordering::Relaxed;

/// A parsed flag: its letter and token (possibly empty).
struct Flag<'t> {
    c: u8,
    tok: &'t [u8],
}

/// Every flag letter memcached 1.6's meta commands know (its
/// `_meta_flag_preparse`), and `E`, which later memcached versions added.
const KNOWN_FLAGS: &[u8] = b"bcCDEfFhIJklLMNOPqRstTuv";

/// Most flags one meta command takes (memcached's `MFLAG_MAX_OPT_LENGTH`
/// of 20 tokens, less the command, the key and the terminal token; ms
/// counts its data length as a flag).
const FLAGS_MAX: usize = 17;

/// md's and ma's message for every error their flags have (memcached's).
const FLAG_ERROR_MD_MA: &str = "invalid or duplicate flag";

/// Longest opaque token, its `O` included (memcached's
/// `MFLAG_MAX_OPAQUE_LENGTH`).
const OPAQUE_BYTES_MAX: usize = 32;

/// Check a meta command's flags as memcached does for every meta command,
/// and keep those among `used`, the letters this command acts on or
/// echoes, in their order. Err(message): a letter memcached does not know
/// ("invalid flag"), a letter given twice ("duplicate flag", also for any
/// byte past ASCII, as memcached), or a numeric token that does not parse
/// (the message memcached gives for that letter; the last one wins, as in
/// memcached, but an invalid or repeated letter ends the check at once).
fn flags<'t>(t: &[&'t [u8]], used: &[u8]) -> Result<Vec<Flag<'t>>, &'static str> {
    let mut seen = [false; 128];
    let mut out: Vec<Flag<'t>> = Vec::with_capacity(t.len());
    let mut bad = None;
    for f in t {
        let (c, tok) = (f[0], &f[1..]);
        if c >= 127 || seen[c as usize] {
            return Err("duplicate flag");
        }
        seen[c as usize] = true;
        let fails = match c {
            b'N' | b'T' | b'R' => parse::<i64>(tok).is_none().then_some("bad token in command line format"),
            b'C' | b'E' => parse::<u64>(tok).is_none().then_some("bad token in command line format"),
            b'F' => parse::<u64>(tok).is_none().then_some("bad command line format"),
            b'M' => (tok.len() != 1).then_some("incorrect length for M token"),
            b'J' => parse::<u64>(tok).is_none().then_some("invalid numeric initial value"),
            b'D' => parse::<u64>(tok).is_none().then_some("invalid numeric delta value"),
            c if KNOWN_FLAGS.contains(&c) => None,
            _ => return Err("invalid flag"),
        };
        bad = fails.or(bad);
        if used.contains(&c) {
            out.push(Flag { c, tok });
        }
    }
    match bad {
        Some(m) => Err(m),
        None => Ok(out),
    }
}

/// Whether the opaque token (if any) is within [`OPAQUE_BYTES_MAX`].
fn opaque_ok(fl: &[Flag<'_>]) -> bool {
    !matches!(tok(fl, b'O'), Some(o) if o.len() >= OPAQUE_BYTES_MAX)
}

fn has(fl: &[Flag<'_>], c: u8) -> bool {
    fl.iter().any(|f| f.c == c)
}

fn tok<'t>(fl: &[Flag<'t>], c: u8) -> Option<&'t [u8]> {
    fl.iter().find(|f| f.c == c).map(|f| f.tok)
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

#[cfg(test)]
fn b64_encode(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize]);
            } else {
                out.push(b'=');
            }
        }
    }
    out
}

fn b64_decode(s: &[u8]) -> Option<Vec<u8>> {
    if s.is_empty() || !s.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for (ci, c) in s.chunks(4).enumerate() {
        let last = ci == s.len() / 4 - 1;
        let pad = c.iter().rev().take_while(|&&x| x == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &x in &c[..4 - pad] {
            n = n << 6 | B64.iter().position(|&y| y == x)? as u32;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

/// Seconds left before `meta.expires` (-1: never).
fn ttl_left(ctx: &Ctx, meta: &ItemMeta) -> i64 {
    if meta.expires == 0 {
        -1
    } else {
        (meta.expires as i64 - ctx.store.now() as i64).max(0)
    }
}

impl Conn<'_> {
    /// The key of a meta command, base64-decoded with `b`; a key that does
    /// not decode gets `CLIENT_ERROR <undecodable>` (memcached decodes the
    /// key in its flag check, so md and ma answer with their one message
    /// for flag errors, mg and ms with `error decoding key`).
    fn meta_key(&mut self, raw: &[u8], b: bool, undecodable: &str) -> Option<Vec<u8>> {
        if raw.len() > crate::limits::KEY_BYTES_MAX || (!b && !key_ok(raw)) {
            self.client_error("bad command line format");
            return None;
        }
        if !b {
            return Some(raw.to_vec());
        }
        match b64_decode(raw) {
            Some(k) if !k.is_empty() => Some(k),
            _ => {
                self.client_error(undecodable);
                None
            }
        }
    }

    /// Append the return flags `want` asks for (in its order), then `extra`.
    /// `h` and `l` come from `acc`, the item's access state before this
    /// request.
    fn ret_flags(&mut self, fl: &[Flag<'_>], raw_key: &[u8], it: Option<&Item>, acc: Option<&Access>, extra: &str) {
        for f in fl {
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
                    self.out.extend_from_slice(b" k");
                    self.out.extend_from_slice(raw_key);
                    continue;
                }
                (b'O', _) => {
                    self.out.extend_from_slice(b" O");
                    self.out.extend_from_slice(f.tok);
                    continue;
                }
                _ => continue,
            };
            self.out.extend_from_slice(s.as_bytes());
        }
        // memcached marks a returned base64 key last.
        if has(fl, b'b') && has(fl, b'k') {
            self.out.extend_from_slice(b" b");
        }
        self.out.extend_from_slice(extra.as_bytes());
    }

    /// A hit: `VA <len> <flags>` and the value with `v`, else `HD <flags>`.
    fn meta_hit(&mut self, fl: &[Flag<'_>], raw_key: &[u8], it: &Item, acc: Option<&Access>, extra: &str) {
        let v = has(fl, b'v');
        if v {
            self.out.extend_from_slice(format!("VA {}", it.value.len()).as_bytes());
        } else {
            self.out.extend_from_slice(b"HD");
        }
        self.ret_flags(fl, raw_key, Some(it), acc, extra);
        self.out.extend_from_slice(b"\r\n");
        if v {
            self.out.extend_from_slice(&it.value);
            self.out.extend_from_slice(b"\r\n");
        }
    }

    /// A reply code with the opaque and key flags echoed.
    fn meta_code(&mut self, code: &str, fl: &[Flag<'_>], raw_key: &[u8], it: Option<&Item>) {
        self.out.extend_from_slice(code.as_bytes());
        self.ret_flags(fl, raw_key, it, None, "");
        self.out.extend_from_slice(b"\r\n");
    }

    pub(crate) async fn meta(&mut self, cmd: &[u8], t: &[&[u8]], line_len: usize, rest: &[u8]) -> Step {
        if cmd != b"ms" {
            self.ctx.stats.cmd_meta.fetch_add(1, Relaxed);
        }
        let Some(&raw_key) = t.get(1) else {
            if cmd == b"me" {
                self.client_error("bad command line format");
            } else {
                self.error();
            }
            return Step::Consumed(line_len);
        };
        match cmd {
            b"mg" => self.mg(raw_key, &t[2..]).await,
            b"md" => self.md(raw_key, &t[2..]).await,
            b"ma" => self.ma(raw_key, &t[2..]).await,
            b"me" => self.me(raw_key).await,
            _ => return self.ms(raw_key, &t[2..], line_len, rest).await,
        }
        Step::Consumed(line_len)
    }

    async fn mg(&mut self, raw_key: &[u8], t: &[&[u8]]) {
        if t.len() > FLAGS_MAX {
            return self.client_error("options flags are too long");
        }
        let fl = match flags(t, b"bcEfhklOqstuvNRT") {
            Ok(fl) => fl,
            Err(m) => return self.client_error(m),
        };
        if !opaque_ok(&fl) {
            return self.client_error("opaque token too long");
        }
        let Some(key) = self.meta_key(raw_key, has(&fl, b'b'), "error decoding key") else { return };
        let new_cas = match tok(&fl, b'E').map(parse::<u64>) {
            Some(None) => return self.client_error("bad token in command line format"),
            e => e.flatten(),
        };
        let (recache, ttl) = (tok(&fl, b'R').map(parse::<i64>), tok(&fl, b'T').map(parse::<i64>));
        if matches!(recache, Some(None)) || matches!(ttl, Some(None)) {
            return self.client_error("bad token in command line format");
        }
        let (recache, ttl) = (recache.flatten(), ttl.flatten());
        self.ctx.stats.cmd_get.fetch_add(1, Relaxed);
        // The win token goes to the first reader of a stale item, or (R) of
        // one with less than that many seconds to live.
        let now = self.ctx.store.now() as i64;
        let want_win = |it: &Item| {
            it.meta.stale || recache.is_some_and(|r| it.meta.expires != 0 && (it.meta.expires as i64 - now) < r)
        };
        let mut got = self.ctx.store.get_item_access_async(&key, !has(&fl, b'u'), want_win).await;
        if let (Ok(Some(ia)), Some(ttl)) = (&mut got, ttl) {
            // T: touch after the read, keeping the access state it saw.
            self.ctx.stats.cmd_touch.fetch_add(1, Relaxed);
            match touch_item(self.ctx, &key, self.expires(ttl), new_cas, false).await {
                Ok(Some(it)) => ia.item = it,
                Ok(None) => got = Ok(None),
                Err(e) => got = Err(e),
            }
        }
        match got {
            Ok(Some(ia)) => {
                self.ctx.stats.get_hits.fetch_add(1, Relaxed);
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
                self.meta_hit(&fl, raw_key, &ia.item, Some(&ia.prior), &extra);
            }
            Ok(None) => {
                self.ctx.stats.get_misses.fetch_add(1, Relaxed);
                if let Some(n) = tok(&fl, b'N') {
                    // Vivify: create an empty item; this client "wins" (W)
                    // and is expected to fill it; later readers see Z.
                    let Some(ttl) = parse::<i64>(n) else {
                        return self.client_error("bad token in command line format");
                    };
                    let meta = ItemMeta::new(0, self.expires(ttl));
                    match self
                        .ctx
                        .store
                        .put_item_won_async(&key, b"", meta, Cond::Absent, new_cas, !has(&fl, b'u'))
                        .await
                    {
                        Ok((PutOutcome::Stored, cas)) => {
                            let it = Item { value: Vec::new(), meta, cas };
                            let acc = Access { fetched: false, last_access: self.ctx.store.now(), win_sent: false };
                            return self.meta_hit(&fl, raw_key, &it, Some(&acc), " W");
                        }
                        Ok(_) => {}
                        Err(e) => return self.server_error(&e),
                    }
                }
                if !has(&fl, b'q') {
                    self.meta_code("EN", &fl, raw_key, None);
                }
            }
            Err(e) => self.server_error(&e),
        }
    }

    async fn ms(&mut self, raw_key: &[u8], t: &[&[u8]], line_len: usize, rest: &[u8]) -> Step {
        // memcached's bound on a data length (the text commands' too).
        let Some(len) = t.first().and_then(|x| parse::<i64>(x)).filter(|l| (0..=i32::MAX as i64 - 2).contains(l))
        else {
            self.client_error("bad command line format");
            return Step::Consumed(line_len);
        };
        let len = len as usize;
        // (memcached checks the count before the data length, and then
        // leaves the data line to be read as a command; it is swallowed
        // here, as after the other errors.)
        let fl = match flags(&t[1..], b"bcCEFIkOqTM") {
            Ok(_) if t.len() > FLAGS_MAX => Err("options flags too long"),
            Ok(fl) if !opaque_ok(&fl) => Err("opaque token too long"),
            r => r,
        };
        let fl = match fl {
            Ok(fl) => fl,
            Err(m) => {
                self.client_error(m);
                self.swallow = len + 2;
                return Step::Consumed(line_len);
            }
        };
        let Some(key) = self.meta_key(raw_key, has(&fl, b'b'), "error decoding key") else {
            self.swallow = len + 2;
            return Step::Consumed(line_len);
        };
        let mode = tok(&fl, b'M').and_then(|m| m.first().copied()).unwrap_or(b'S');
        if len > self.ctx.cfg.item_bytes_max {
            self.ctx.stats.cmd_set.fetch_add(1, Relaxed);
            self.ctx.stats.cmd_meta.fetch_add(1, Relaxed);
            self.too_large();
            self.swallow = len + 2;
            // As memcached: a failed set drops the old value.
            if mode.eq_ignore_ascii_case(&b'S') {
                let _ = self.ctx.store.delete_async(&key).await;
            }
            return Step::Consumed(line_len);
        }
        if rest.len() < len + 2 {
            return Step::NeedMore;
        }
        self.ctx.stats.cmd_set.fetch_add(1, Relaxed);
        self.ctx.stats.cmd_meta.fetch_add(1, Relaxed);
        let consumed = line_len + len + 2;
        if &rest[len..len + 2] != b"\r\n" {
            self.client_error("bad data chunk");
            return Step::Consumed(consumed);
        }
        let data = &rest[..len];
        let num = |c: u8| tok(&fl, c).map(parse::<u64>);
        let (flags_v, ttl, cas, new_cas) = (num(b'F'), tok(&fl, b'T').map(parse::<i64>), num(b'C'), num(b'E'));
        if matches!(ttl, Some(None)) || matches!(cas, Some(None)) || matches!(new_cas, Some(None)) {
            self.client_error("bad token in command line format");
            return Step::Consumed(consumed);
        }
        // memcached parses flags as an unsigned long and keeps 32 bits (as
        // the text commands do).
        let Some(user_flags) = flags_v.unwrap_or(Some(0)).map(|f| f as u32) else {
            self.client_error("bad command line format");
            return Step::Consumed(consumed);
        };
        let meta = ItemMeta::new(user_flags, self.expires(ttl.flatten().unwrap_or(0)));
        let (cas, new_cas) = (cas.flatten(), new_cas.flatten());
        let result = match mode {
            // I with C: a CAS value older than the item's still stores the
            // value, as stale, keeping the item's expiry (memcached's
            // "set-to-invalid"); a newer one, or 0, is EX. (Set and replace
            // modes: C makes both a CAS store.)
            b'S' | b's' | b'R' | b'r' if has(&fl, b'I') && cas.is_some() => {
                let c = cas.unwrap_or(0);
                self.ctx
                    .store
                    .update_async(&key, |it| {
                        let meta = match it {
                            None => return (Change::Keep, PutOutcome::NotFound),
                            Some(it) if c == it.cas => meta,
                            // (C0 is never older: memcached answers EX.)
                            Some(it) if c != 0 && c < it.cas => {
                                ItemMeta { expires: it.meta.expires, stale: true, ..meta }
                            }
                            Some(_) => return (Change::Keep, PutOutcome::Exists),
                        };
                        let value = data.to_vec();
                        let change = match new_cas {
                            Some(cas) => Change::PutCas { value, meta, cas },
                            None => Change::Put { value, meta },
                        };
                        (change, PutOutcome::Stored)
                    })
                    .await
            }
            b'S' | b's' | b'E' | b'e' | b'R' | b'r' => {
                // An add ignores C (as memcached).
                let cond = match (mode.to_ascii_uppercase(), cas) {
                    (b'E', _) => Cond::Absent,
                    (_, Some(c)) => Cond::Cas(c),
                    (b'R', None) => Cond::Present,
                    _ => Cond::Always,
                };
                match new_cas {
                    Some(e) => self.ctx.store.put_item_with_cas_async(&key, data, meta, cond, e).await,
                    None => self.ctx.store.put_item_async(&key, data, meta, cond).await,
                }
                .map(|(o, c)| (o, Some(c)))
            }
            b'A' | b'a' | b'P' | b'p' => {
                let append = mode.eq_ignore_ascii_case(&b'A');
                let max = self.ctx.cfg.item_bytes_max;
                self.ctx
                    .store
                    .update_async(&key, |it| match it {
                        None => (Change::Keep, PutOutcome::NotFound),
                        // C0 checks nothing here (memcached's append).
                        Some(it) if cas.is_some_and(|c| c != 0 && c != it.cas) => (Change::Keep, PutOutcome::Exists),
                        Some(it) if it.value.len() + data.len() > max => (Change::Keep, PutOutcome::NotFound),
                        Some(it) => {
                            let v =
                                if append { [&it.value[..], data].concat() } else { [data, &it.value[..]].concat() };
                            // A new item (memcached): not stale.
                            let meta = ItemMeta { stale: false, ..it.meta };
                            let change = match new_cas {
                                Some(cas) => Change::PutCas { value: v, meta, cas },
                                None => Change::Put { value: v, meta },
                            };
                            (change, PutOutcome::Stored)
                        }
                    })
                    .await
            }
            _ => {
                self.client_error("invalid mode for ms M token");
                return Step::Consumed(consumed);
            }
        };
        match result {
            Ok((PutOutcome::Stored, new_cas)) => {
                self.ctx.stats.total_items.fetch_add(1, Relaxed);
                if !has(&fl, b'q') {
                    let it = Item { value: data.to_vec(), meta, cas: new_cas.unwrap_or(0) };
                    self.meta_code("HD", &fl, raw_key, Some(&it));
                }
            }
            // Not stored: memcached echoes `c` as c0. NF only where C made
            // a set or replace a CAS store (an append's miss is NS).
            Ok((outcome, _)) => {
                let none = Item { value: Vec::new(), meta: ItemMeta::new(0, 0), cas: 0 };
                let code = match (outcome, cas.is_some(), mode.to_ascii_uppercase()) {
                    (PutOutcome::Exists, true, b'S' | b'R' | b'A' | b'P') => "EX",
                    (PutOutcome::NotFound, true, b'S' | b'R') => "NF",
                    _ => "NS",
                };
                self.meta_code(code, &fl, raw_key, Some(&none))
            }
            Err(e) => self.server_error(&e),
        }
        Step::Consumed(consumed)
    }

    async fn md(&mut self, raw_key: &[u8], t: &[&[u8]]) {
        if t.len() > FLAGS_MAX {
            return self.client_error("options flags too long");
        }
        let fl = match flags(t, b"bCIkOqT") {
            Ok(fl) => fl,
            // memcached's md and ma have one message for every flag error.
            Err(_) => return self.client_error(FLAG_ERROR_MD_MA),
        };
        if !opaque_ok(&fl) {
            return self.client_error("opaque token too long");
        }
        let Some(key) = self.meta_key(raw_key, has(&fl, b'b'), FLAG_ERROR_MD_MA) else { return };
        let (cas, ttl) = (tok(&fl, b'C').map(parse::<u64>), tok(&fl, b'T').map(parse::<i64>));
        if matches!(cas, Some(None)) || matches!(ttl, Some(None)) {
            return self.client_error(FLAG_ERROR_MD_MA);
        }
        let (cas, ttl) = (cas.flatten(), ttl.flatten());
        let r = match (cas, has(&fl, b'I')) {
            (None, false) => self.ctx.store.delete_async(&key).await.map(|found| if found { "HD" } else { "NF" }),
            (cas, invalidate) => {
                // I: the item stays, marked stale, with a new CAS value (and
                // the expiry T gives); its win token goes to the next reader.
                let new_exp = ttl.map(|t| self.expires(t));
                self.ctx
                    .store
                    .update_async(&key, |it| match it {
                        None => (Change::Keep, "NF"),
                        Some(it) if cas.is_some_and(|c| c != it.cas) => (Change::Keep, "EX"),
                        Some(it) if invalidate => {
                            let meta = ItemMeta { stale: true, expires: new_exp.unwrap_or(it.meta.expires), ..it.meta };
                            (Change::Invalidate { value: it.value.clone(), meta }, "HD")
                        }
                        Some(_) => (Change::Delete, "HD"),
                    })
                    .await
                    .map(|(r, _)| r)
            }
        };
        match r {
            Ok(code) => {
                let c = if code == "HD" { &self.ctx.stats.delete_hits } else { &self.ctx.stats.delete_misses };
                c.fetch_add(1, Relaxed);
                if !(has(&fl, b'q') && code == "HD") {
                    self.meta_code(code, &fl, raw_key, None);
                }
            }
            Err(e) => self.server_error(&e),
        }
    }

    async fn ma(&mut self, raw_key: &[u8], t: &[&[u8]]) {
        if t.len() > FLAGS_MAX {
            return self.client_error("options flags too long");
        }
        let fl = match flags(t, b"bcCENJDTMqOtvk") {
            Ok(fl) => fl,
            Err(_) => return self.client_error(FLAG_ERROR_MD_MA),
        };
        if !opaque_ok(&fl) {
            return self.client_error("opaque token too long");
        }
        let Some(key) = self.meta_key(raw_key, has(&fl, b'b'), FLAG_ERROR_MD_MA) else { return };
        let num = |c: u8| tok(&fl, c).map(parse::<u64>);
        let (cas, initial, delta, new_cas) = (num(b'C'), num(b'J'), num(b'D'), num(b'E'));
        let (viv, ttl) = (tok(&fl, b'N').map(parse::<i64>), tok(&fl, b'T').map(parse::<i64>));
        if [cas, initial, delta, new_cas].iter().any(|x| matches!(x, Some(None)))
            || [viv, ttl].iter().any(|x| matches!(x, Some(None)))
        {
            return self.client_error(FLAG_ERROR_MD_MA);
        }
        let incr = match tok(&fl, b'M').and_then(|m| m.first().copied()) {
            None | Some(b'I' | b'i' | b'+') => true,
            Some(b'D' | b'd' | b'-') => false,
            Some(_) => return self.client_error("invalid mode for ma M token"),
        };
        let delta = delta.flatten().unwrap_or(1);
        let new_exp = ttl.flatten().map(|t| self.expires(t));
        let new_cas = new_cas.flatten();
        // C0 checks nothing (memcached's incr and decr).
        let cas = cas.flatten().filter(|&c| c != 0);
        let mut r = arith(self.ctx, &key, incr, delta, cas, new_exp, new_cas).await;
        let mut vivified = false;
        if let (Ok(Arith::NotFound), Some(Some(viv_ttl))) = (&r, viv) {
            let n = initial.flatten().unwrap_or(0);
            let meta = ItemMeta::new(0, self.expires(viv_ttl));
            let put = match new_cas {
                Some(c) => {
                    self.ctx.store.put_item_with_cas_async(&key, n.to_string().as_bytes(), meta, Cond::Absent, c).await
                }
                None => self.ctx.store.put_item_async(&key, n.to_string().as_bytes(), meta, Cond::Absent).await,
            };
            r = match put {
                Ok((PutOutcome::Stored, c)) => {
                    vivified = true;
                    Ok(Arith::Done(n, c, meta))
                }
                // Someone else created it meanwhile: apply the delta to theirs.
                Ok(_) => arith(self.ctx, &key, incr, delta, cas, new_exp, new_cas).await,
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
                match (has(&fl, b'q') && !vivified, has(&fl, b'v')) {
                    (true, _) => {}
                    (false, true) => self.meta_hit(&fl, raw_key, &it, None, ""),
                    (false, false) => self.meta_code("HD", &fl, raw_key, Some(&it)),
                }
            }
            Ok(Arith::NotFound) => {
                let counter = if incr { &self.ctx.stats.incr_misses } else { &self.ctx.stats.decr_misses };
                counter.fetch_add(1, Relaxed);
                self.meta_code("NF", &fl, raw_key, None);
            }
            Ok(Arith::CasMismatch) => self.meta_code("EX", &fl, raw_key, None),
            Ok(Arith::NonNumeric) => self.client_error("cannot increment or decrement non-numeric value"),
            Err(e) => self.server_error(&e),
        }
    }

    async fn me(&mut self, raw_key: &[u8]) {
        let Some(key) = self.meta_key(raw_key, false, "error decoding key") else { return };
        match self.ctx.store.get_item_access_async(&key, false, |_| false).await {
            Ok(Some(ia)) => {
                let it = &ia.item;
                let exp = ttl_left(self.ctx, &it.meta);
                let la = self.ctx.store.now().saturating_sub(ia.prior.last_access);
                let fetch = if ia.prior.fetched { "yes" } else { "no" };
                self.out.extend_from_slice(b"ME ");
                self.out.extend_from_slice(raw_key);
                let s = format!(" exp={exp} la={la} cas={} fetch={fetch} cls=1 size={}\r\n", it.cas, it.value.len());
                self.out.extend_from_slice(s.as_bytes());
            }
            Ok(None) => self.reply("EN"),
            Err(e) => self.server_error(&e),
        }
    }
}

type Lines = Vec<(String, String)>;

/// The process's user and system CPU time, as memcached prints them
/// (seconds.microseconds).
fn rusage() -> (String, String) {
    // SAFETY: getrusage fills the zeroed struct it is given; RUSAGE_SELF
    // is always valid.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| format!("{}.{:06}", t.tv_sec, t.tv_usec);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// `stats`: memcached's general fields that apply, then Granary's own.
pub(crate) fn general_stats(ctx: &Ctx) -> Lines {
    let s = &ctx.stats;
    let rusage = rusage();
    let st = ctx.store.stats();
    let g = |a: &std::sync::atomic::AtomicU64| a.load(Relaxed).to_string();
    let mut v: Lines = vec![
        ("pid".into(), std::process::id().to_string()),
        ("uptime".into(), ctx.uptime().to_string()),
        ("time".into(), ctx.store.now().to_string()),
        ("version".into(), version()),
        ("pointer_size".into(), (8 * std::mem::size_of::<usize>()).to_string()),
        ("rusage_user".into(), rusage.0),
        ("rusage_system".into(), rusage.1),
        ("max_connections".into(), ctx.cfg.max_connections.to_string()),
        ("threads".into(), ctx.threads.to_string()),
        ("curr_connections".into(), s.connections.open().to_string()),
        ("total_connections".into(), g(&s.total_connections)),
        ("rejected_connections".into(), g(&s.rejected_connections)),
        // The listener is never paused: connections past the limit are
        // accepted and closed (rejected_connections).
        ("accepting_conns".into(), "1".into()),
        ("listen_disabled_num".into(), "0".into()),
        ("idle_kicks".into(), g(&s.idle_kicks)),
        ("cmd_get".into(), g(&s.cmd_get)),
        ("cmd_set".into(), g(&s.cmd_set)),
        ("cmd_flush".into(), g(&s.cmd_flush)),
        ("cmd_touch".into(), g(&s.cmd_touch)),
        ("cmd_meta".into(), g(&s.cmd_meta)),
        ("get_hits".into(), g(&s.get_hits)),
        ("get_misses".into(), g(&s.get_misses)),
        ("delete_misses".into(), g(&s.delete_misses)),
        ("delete_hits".into(), g(&s.delete_hits)),
        ("incr_misses".into(), g(&s.incr_misses)),
        ("incr_hits".into(), g(&s.incr_hits)),
        ("decr_misses".into(), g(&s.decr_misses)),
        ("decr_hits".into(), g(&s.decr_hits)),
        ("cas_misses".into(), g(&s.cas_misses)),
        ("cas_hits".into(), g(&s.cas_hits)),
        ("cas_badval".into(), g(&s.cas_badval)),
        ("touch_hits".into(), g(&s.touch_hits)),
        ("touch_misses".into(), g(&s.touch_misses)),
        ("bytes_read".into(), g(&s.bytes_read)),
        ("bytes_written".into(), g(&s.bytes_written)),
        ("limit_maxbytes".into(), st.device_bytes.to_string()),
        ("curr_items".into(), st.keys.to_string()),
        ("total_items".into(), g(&s.total_items)),
        ("bytes".into(), st.live_bytes.to_string()),
        ("evictions".into(), st.gc.evicted_values.to_string()),
        ("expired_unfetched".into(), st.gc.expired.to_string()),
        ("protocol_errors".into(), g(&s.protocol_errors)),
        ("store_too_large".into(), g(&s.store_too_large)),
        ("store_no_memory".into(), g(&s.store_no_memory)),
    ];
    v.extend([
        ("granary_device_bytes".into(), st.device_bytes.to_string()),
        ("granary_segment_bytes".into(), st.segment_bytes.to_string()),
        ("granary_segments".into(), st.segments.to_string()),
        ("granary_segments_free".into(), st.segments_free.to_string()),
        ("granary_gc_victims".into(), st.gc.victims.to_string()),
        ("granary_gc_records_relocated".into(), st.gc.records_relocated.to_string()),
        ("granary_evicted_segments".into(), st.gc.evicted_segments.to_string()),
        ("granary_write_amplification".into(), format!("{:.3}", st.write_amplification())),
        ("granary_device_read_bytes".into(), st.io.read_bytes.to_string()),
        ("granary_device_written_bytes".into(), st.io.written_bytes.to_string()),
        ("granary_index_entries".into(), (st.keys + st.tombstones).to_string()),
        ("granary_index_slots".into(), st.index.slots.to_string()),
        ("granary_index_memory_bytes".into(), st.index.memory_bytes.to_string()),
        ("granary_index_resizes".into(), st.index.grows.to_string()),
        ("granary_checkpoints".into(), st.checkpoints.written.to_string()),
        ("granary_recovery_millis".into(), st.recovery.millis.to_string()),
        ("granary_conn_buffer_bytes_max".into(), g(&s.conn_buffer_bytes_max)),
        ("granary_conns_waiting_to_send".into(), g(&s.conns_waiting_to_send)),
        ("granary_zero_copy_sets".into(), g(&s.zero_copy_sets)),
        ("granary_zero_copy_gets".into(), g(&s.zero_copy_gets)),
    ]);
    v
}

/// `stats latency` (Granary's own): for each command that ran, and for
/// device reads, writes and flushes, the count, mean and the 50th, 99th
/// and 99.9th percentiles in microseconds. Percentiles are the upper bound
/// of their histogram bucket (the buckets of `/metrics`).
pub(crate) fn latency_stats(ctx: &Ctx) -> Lines {
    let io = ctx.store.stats().io;
    let mut v = Lines::new();
    let commands = crate::server::COMMANDS.iter().zip(ctx.stats.latency.iter()).map(|(c, h)| (*c, h.snapshot()));
    let device =
        [("device_read", io.read_latency), ("device_write", io.write_latency), ("device_flush", io.flush_latency)];
    for (name, s) in commands.chain(device) {
        if s.count() == 0 {
            continue;
        }
        let us = |q: f64| match s.quantile_ns(q) {
            Some(u64::MAX) => "inf".to_string(),
            Some(ns) => format!("{:.1}", ns as f64 / 1e3),
            None => "0".to_string(),
        };
        v.push((format!("{name}:count"), s.count().to_string()));
        v.push((format!("{name}:mean_us"), format!("{:.1}", s.mean_ns() as f64 / 1e3)));
        v.push((format!("{name}:p50_us"), us(0.5)));
        v.push((format!("{name}:p99_us"), us(0.99)));
        v.push((format!("{name}:p999_us"), us(0.999)));
    }
    v
}

/// `stats settings`.
pub(crate) fn settings_stats(ctx: &Ctx) -> Lines {
    let c = &ctx.cfg;
    vec![
        ("maxbytes".into(), ctx.store.stats().device_bytes.to_string()),
        ("maxconns".into(), c.max_connections.to_string()),
        ("tcpport".into(), c.listen.port().to_string()),
        ("interface".into(), c.listen.ip().to_string()),
        ("num_threads".into(), ctx.threads.to_string()),
        ("item_size_max".into(), c.item_bytes_max.to_string()),
        ("evictions".into(), if ctx.evicting { "on" } else { "off" }.into()),
        ("cas_enabled".into(), "yes".into()),
        ("binding_protocol".into(), "ascii".into()),
    ]
}

/// `stats items`: Granary has no slab classes; one class stands for all.
pub(crate) fn items_stats(ctx: &Ctx) -> Lines {
    let st = ctx.store.stats();
    vec![
        ("items:1:number".into(), st.keys.to_string()),
        ("items:1:evicted".into(), st.gc.evicted_values.to_string()),
        ("items:1:expired_unfetched".into(), st.gc.expired.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_rejects_garbage() {
        for s in [&b"a"[..], b"ab", b"abc", b"abcd", b"\x00\xff\x10 key"] {
            assert_eq!(b64_decode(&b64_encode(s)).as_deref(), Some(s));
        }
        assert_eq!(b64_encode(b"foo"), b"Zm9v");
        assert_eq!(b64_encode(b"fo"), b"Zm8=");
        assert_eq!(b64_decode(b"Zm9v!"), None);
        assert_eq!(b64_decode(b"Zm=v"), None);
        assert_eq!(b64_decode(b"Zg=="), Some(b"f".to_vec()));
        assert_eq!(b64_decode(b""), None);
    }
}
