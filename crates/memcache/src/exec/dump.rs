//! Key dumps over the engine's key scan: `stats cachedump` and
//! `lru_crawler metadump`, in memcached 1.6.18's formats, and the DRAM
//! tier's keys (`stats cachedump dram`, Granary's). Granary has no
//! slab classes: every key is in class [`ITEM_CLASS`], the one `stats
//! items` reports; other valid classes are empty.
//!
//! Invariants:
//! - a dump holds at most one scan page of keys ([`DUMP_SCAN_KEYS`]) and
//!   sends the reply buffer once it passes [`OUT_FLUSH_BYTES`], so its
//!   memory is bounded whatever the namespace holds; a dump of the DRAM
//!   tier's keys (`stats cachedump dram`) holds no keys, only its reply,
//!   which is at most [`CACHEDUMP_BYTES_MAX`] bytes;
//! - a full dump lists every key present for its whole walk exactly once,
//!   and no key that was never present (the scan's guarantees); a key
//!   deleted between its page and its read is left out;
//! - reading an item for a dump does not mark it fetched nor move its last
//!   access (memcached's crawler does not either);
//! - a `stats cachedump` reply is at most [`CACHEDUMP_BYTES_MAX`] bytes.

use super::{Exec, Sink};
use crate::limits::*;
use crate::parse::ITEM_CLASS;
use granary_store::{Error, ItemAccess};

/// The line that ends a dump.
const END: &[u8] = b"END\r\n";

/// The `ITEM <key> [<bytes> b; <exp> s]` lines of a `stats cachedump`
/// reply: at most `limit` of them (0: no count limit), the reply with its
/// `END` at most [`CACHEDUMP_BYTES_MAX`] bytes.
struct ItemLines {
    limit: u32,
    shown: u32,
    bytes: usize,
}

impl ItemLines {
    fn new(limit: u32) -> ItemLines {
        ItemLines { limit, shown: 0, bytes: END.len() }
    }

    /// Append `key`'s line to `out`; false, with nothing written, once the
    /// reply is full.
    fn push(
        &mut self,
        out: &mut Vec<u8>,
        key: &[u8],
        value_len: impl std::fmt::Display,
        expires: impl std::fmt::Display,
    ) -> bool {
        let tail = format!(" [{value_len} b; {expires} s]\r\n");
        let len = 5 + key.len() + tail.len();
        if (self.limit != 0 && self.shown >= self.limit) || self.bytes + len > CACHEDUMP_BYTES_MAX {
            return false;
        }
        out.extend_from_slice(b"ITEM ");
        out.extend_from_slice(key);
        out.extend_from_slice(tail.as_bytes());
        self.shown += 1;
        self.bytes += len;
        true
    }
}

/// A key as memcached's metadump writes it: bytes other than unreserved
/// URI characters (`A-Z a-z 0-9 - . _ ~`) as `%XX` (upper-case hex).
pub(crate) fn uri_encode(key: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in key {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
        }
    }
}

impl<S: Sink> Exec<'_, S> {
    /// Walk the namespace's keys with the scan, a page at a time, handing
    /// `line` the reply buffer, each live key and its item (read without
    /// marking it); `line` false stops the walk. Ok(false): the
    /// connection is gone.
    async fn walk(&mut self, mut line: impl FnMut(&mut Vec<u8>, &[u8], &ItemAccess) -> bool) -> Result<bool, Error> {
        let mut cursor = 0;
        loop {
            let page = self.ctx.ns.scan_async(cursor, DUMP_SCAN_KEYS).await?;
            for key in &page.keys {
                let Some(ia) = self.ctx.ns.peek_item_access_async(key).await? else {
                    continue;
                };
                if !line(self.io.out(), key, &ia) {
                    return Ok(true);
                }
                if self.io.out().len() > OUT_FLUSH_BYTES && !self.io.flush().await {
                    return Ok(false);
                }
            }
            if page.cursor == 0 {
                return Ok(true);
            }
            cursor = page.cursor;
        }
    }

    /// End a dump: `END`, or memcached's reply to a store failure.
    fn dump_end(&mut self, walked: Result<bool, Error>) {
        match walked {
            Ok(_) => self.io.out().extend_from_slice(END),
            Err(e) => self.server_error(&e),
        }
    }

    /// `stats cachedump <class> <limit>`: `ITEM <key> [<bytes> b; <exp>
    /// s]` for up to `limit` keys (0: no count limit), `<exp>` the unix
    /// time of expiry or 0 for none (memcached 1.6.18), within
    /// [`CACHEDUMP_BYTES_MAX`] bytes; then `END`. Keys in scan order.
    pub(super) async fn cachedump(&mut self, class: u32, limit: u32) {
        if class != ITEM_CLASS {
            return self.io.out().extend_from_slice(END);
        }
        let mut lines = ItemLines::new(limit);
        let walked = self.walk(|out, key, ia| lines.push(out, key, ia.item.value.len(), ia.item.meta.expires)).await;
        self.dump_end(walked);
    }

    /// `stats cachedump dram <limit>`: the keys the DRAM tier holds (the
    /// hot items; none with the tier off), as [`Self::cachedump`] lists
    /// them, up to `limit` (0: no count limit) within
    /// [`CACHEDUMP_BYTES_MAX`] bytes, in no particular order. The lines
    /// are written while the tier is walked (a shard's lock held for
    /// each of its keys' lines), so the reply cap bounds the memory and
    /// the walk both.
    pub(super) async fn cachedump_dram(&mut self, limit: u32) {
        let mut lines = ItemLines::new(limit);
        let out = self.io.out();
        let walked = self.ctx.ns.visit_dram(|key, value_len, expires| lines.push(out, key, value_len, expires));
        self.dump_end(walked.map(|()| true));
    }

    /// `lru_crawler metadump`: for every key when `all`, `key=<uri-encoded
    /// key> exp=<unix expiry or -1> la=<unix last access> cas=<cas>
    /// fetch=<yes|no> cls=1 size=<value bytes>`, each ended by a bare
    /// newline (as memcached), then `END`.
    pub(super) async fn metadump(&mut self, all: bool) {
        if !all {
            return self.io.out().extend_from_slice(END);
        }
        let walked = self
            .walk(|out, key, ia| {
                let it = &ia.item;
                let exp = if it.meta.expires == 0 { -1 } else { it.meta.expires as i64 };
                let fetch = if ia.prior.fetched { "yes" } else { "no" };
                out.extend_from_slice(b"key=");
                uri_encode(key, out);
                let rest = format!(
                    " exp={exp} la={} cas={} fetch={fetch} cls={ITEM_CLASS} size={}\n",
                    ia.prior.last_access,
                    it.cas,
                    it.value.len()
                );
                out.extend_from_slice(rest.as_bytes());
                true
            })
            .await;
        self.dump_end(walked);
    }
}

#[cfg(test)]
mod tests {
    use super::uri_encode;

    #[test]
    fn keys_are_uri_encoded_as_memcached_encodes_them() {
        let mut out = Vec::new();
        uri_encode(b"c%20d a/b~x-y_z.0\x01\xff", &mut out);
        assert_eq!(out, b"c%2520d%20a%2Fb~x-y_z.0%01%FF");
    }
}
