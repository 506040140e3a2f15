//! How a Redis value is kept in one engine record (docs/RESP.md,
//! "Records"): its type and the millisecond part of its expiry live in the
//! item's flags, its expiry's seconds in the item's expiry, and a hash's
//! fields are encoded in the value.
//!
//! Flags: `0` is a string with no millisecond part (what a memcache or
//! native client writes reads as a string). Otherwise the top byte is
//! [`MAGIC`], bits 8..18 the expiry's milliseconds past its second, and
//! the low byte the type: [`KIND_STRING`] or [`KIND_HASH`]. Any other
//! value of the top byte reads as a string (a memcache client's flags);
//! an unknown type under [`MAGIC`] is refused (`WRONGTYPE`).
//!
//! Expiry: the engine's is whole unix seconds and makes a value absent
//! from that second. A Redis expiry at `ms` milliseconds is stored as
//! second `ceil(ms / 1000)` (so the engine never drops a value early) with
//! `ms % 1000` in the flags; a reader treats the value as absent from `ms`
//! on. An expiry past what the engine's seconds hold (year 2106) is stored
//! as the last second it holds.
//!
//! Hash encoding, version 1: the byte 1, then for each field in insertion
//! order its length (u32 little-endian), its bytes, its value's length
//! (u32 LE) and bytes. A decoder refuses another version or a truncated
//! encoding.

use granary_store::{Item, ItemMeta};
use std::collections::{HashMap, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

/// Top byte of the flags of a value the RESP server typed.
pub const MAGIC: u32 = 0x52 << 24;
pub const KIND_STRING: u32 = 0;
pub const KIND_HASH: u32 = 1;
/// The hash encoding's version byte.
pub const HASH_V1: u8 = 1;

/// A value's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    String,
    Hash,
    /// Typed by a newer server: every command refuses it.
    Unknown(u8),
}

impl Kind {
    /// TYPE's answer.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::String => "string",
            Kind::Hash => "hash",
            Kind::Unknown(_) => "unknown",
        }
    }
}

/// A value as the commands see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rec {
    pub kind: Kind,
    /// A string's bytes, or a hash's encoding.
    pub value: Vec<u8>,
    /// Unix milliseconds from which it is absent; 0 = never.
    pub expire_ms: u64,
}

/// Unix milliseconds now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The last millisecond the engine's expiry seconds can hold.
pub(crate) const EXPIRE_MS_MAX: u64 = u32::MAX as u64 * 1000;

impl Rec {
    pub(crate) fn string(value: Vec<u8>) -> Rec {
        Rec { kind: Kind::String, value, expire_ms: 0 }
    }

    /// The record of an engine item.
    pub(crate) fn of_item(item: &Item) -> Rec {
        let (kind, expire_ms) = Rec::type_and_expiry(&item.meta);
        Rec { kind, value: item.value.clone(), expire_ms }
    }

    /// [`Rec::of_item`] taking the item's value instead of copying it.
    pub(crate) fn from_item(item: Item) -> Rec {
        let (kind, expire_ms) = Rec::type_and_expiry(&item.meta);
        Rec { kind, value: item.value, expire_ms }
    }

    /// The type and expiry (unix ms; 0 = never) an item's metadata holds.
    fn type_and_expiry(meta: &ItemMeta) -> (Kind, u64) {
        let flags = meta.flags;
        let secs = meta.expires as u64;
        if flags & 0xff00_0000 != MAGIC {
            return (Kind::String, secs * 1000);
        }
        let rem = ((flags >> 8) & 0x3ff) as u64;
        let expire_ms = match (secs, rem) {
            (0, _) => 0,
            (s, 0) => s * 1000,
            (s, r) => (s - 1) * 1000 + r,
        };
        let kind = match flags & 0xff {
            KIND_STRING => Kind::String,
            KIND_HASH => Kind::Hash,
            k => Kind::Unknown(k as u8),
        };
        (kind, expire_ms)
    }

    /// Whether it has expired at `now` (unix ms).
    pub(crate) fn expired(&self, now: u64) -> bool {
        self.expire_ms != 0 && now >= self.expire_ms
    }

    /// The engine metadata that stores its type and expiry.
    pub(crate) fn meta(&self) -> ItemMeta {
        let ms = self.expire_ms.min(EXPIRE_MS_MAX);
        let (secs, rem) = if ms == 0 { (0, 0) } else { (ms.div_ceil(1000), ms % 1000) };
        let kind = match self.kind {
            Kind::String => KIND_STRING,
            Kind::Hash => KIND_HASH,
            Kind::Unknown(k) => k as u32,
        };
        let flags = if kind == KIND_STRING && rem == 0 { 0 } else { MAGIC | (rem as u32) << 8 | kind };
        ItemMeta::new(flags, secs as u32)
    }
}

/// A hash's fields in insertion order.
///
/// A lookup scans the fields, unless the hash was indexed
/// ([`Hash::indexed`]): a command with many field arguments indexes it
/// first, so that its cost stays linear in its arguments and the hash's
/// fields (a scan per argument would let one HSET or HMGET of a few
/// hundred thousand fields hold its key and its executor for minutes).
#[derive(Debug, Clone, Default)]
pub(crate) struct Hash {
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// Each field's position in `fields`, when indexed.
    index: Option<HashMap<Vec<u8>, usize>>,
}

impl PartialEq for Hash {
    fn eq(&self, other: &Hash) -> bool {
        self.fields == other.fields
    }
}

impl Eq for Hash {}

/// Field arguments from which a command indexes its hash first: below,
/// a scan per argument costs less than building the index.
pub(crate) const INDEX_FROM_ARGS: usize = 8;

/// Why a hash's encoding was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct BadHash;

impl Hash {
    pub(crate) fn decode(b: &[u8]) -> Result<Hash, BadHash> {
        let Some((&HASH_V1, mut rest)) = b.split_first() else {
            return Err(BadHash);
        };
        let mut fields = Vec::new();
        let take = |rest: &mut &[u8]| -> Result<Vec<u8>, BadHash> {
            let (len, r) = rest.split_first_chunk::<4>().ok_or(BadHash)?;
            let len = u32::from_le_bytes(*len) as usize;
            let (v, r) = r.split_at_checked(len).ok_or(BadHash)?;
            *rest = r;
            Ok(v.to_vec())
        };
        while !rest.is_empty() {
            let f = take(&mut rest)?;
            let v = take(&mut rest)?;
            fields.push((f, v));
        }
        Ok(Hash { fields, index: None })
    }

    /// This hash with its fields indexed when a command is to look up
    /// `args` fields of it, at least [`INDEX_FROM_ARGS`].
    pub(crate) fn indexed(mut self, args: usize) -> Hash {
        if args >= INDEX_FROM_ARGS && self.index.is_none() {
            let index = self.fields.iter().enumerate().map(|(i, (f, _))| (f.clone(), i)).collect();
            self.index = Some(index);
        }
        self
    }

    fn position(&self, field: &[u8]) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(field).copied(),
            None => self.fields.iter().position(|(f, _)| f == field),
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let n = 1 + self.fields.iter().map(|(f, v)| 8 + f.len() + v.len()).sum::<usize>();
        let mut b = Vec::with_capacity(n);
        b.push(HASH_V1);
        for (f, v) in &self.fields {
            b.extend_from_slice(&(f.len() as u32).to_le_bytes());
            b.extend_from_slice(f);
            b.extend_from_slice(&(v.len() as u32).to_le_bytes());
            b.extend_from_slice(v);
        }
        b
    }

    /// Bytes its encoding takes.
    pub(crate) fn encoded_len(&self) -> usize {
        1 + self.fields.iter().map(|(f, v)| 8 + f.len() + v.len()).sum::<usize>()
    }

    pub(crate) fn get(&self, field: &[u8]) -> Option<&[u8]> {
        self.position(field).map(|i| &self.fields[i].1[..])
    }

    /// Set `field`; true if it is new.
    pub(crate) fn set(&mut self, field: &[u8], value: &[u8]) -> bool {
        match self.position(field) {
            Some(i) => {
                self.fields[i].1 = value.to_vec();
                false
            }
            None => {
                if let Some(index) = &mut self.index {
                    index.insert(field.to_vec(), self.fields.len());
                }
                self.fields.push((field.to_vec(), value.to_vec()));
                true
            }
        }
    }

    /// Remove every field of `fields` (each at most once); how many were
    /// there. One pass over the hash for many fields, keeping the order of
    /// those left.
    pub(crate) fn remove_all(&mut self, fields: &[&[u8]]) -> usize {
        let before = self.fields.len();
        if fields.len() < INDEX_FROM_ARGS {
            for f in fields {
                if let Some(i) = self.position(f) {
                    self.fields.remove(i);
                    self.index = None;
                }
            }
        } else {
            let gone: HashSet<&[u8]> = fields.iter().copied().collect();
            self.fields.retain(|(f, _)| !gone.contains(&f[..]));
            self.index = None;
        }
        before - self.fields.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(meta: ItemMeta) -> Item {
        Item { value: b"v".to_vec(), meta, cas: 1 }
    }

    #[test]
    fn expiry_round_trips_to_the_millisecond() {
        for ms in [0, 1000, 1001, 1_700_000_000_999, 1_700_000_000_000, 1_700_000_000_500] {
            for kind in [Kind::String, Kind::Hash] {
                let r = Rec { kind, value: b"v".to_vec(), expire_ms: ms };
                let m = r.meta();
                assert_eq!(Rec::of_item(&item(m)), r, "{ms} {kind:?}");
                // The engine never drops it before its millisecond.
                assert!(ms == 0 || m.expires as u64 * 1000 >= ms);
            }
        }
        // A plain string with whole-second expiry keeps memcache's flags 0.
        assert_eq!(Rec { kind: Kind::String, value: vec![], expire_ms: 5000 }.meta(), ItemMeta::new(0, 5));
        // Flags a memcache client set read as a string.
        let r = Rec::of_item(&item(ItemMeta::new(0x1234, 7)));
        assert_eq!((r.kind, r.expire_ms), (Kind::String, 7000));
        assert_eq!(Rec::of_item(&item(ItemMeta::new(MAGIC | 9, 0))).kind, Kind::Unknown(9));
    }

    #[test]
    fn hash_encoding_round_trips_and_refuses_garbage() {
        let mut h = Hash::default();
        assert!(h.set(b"a", b"1"));
        assert!(h.set(b"", b""));
        assert!(!h.set(b"a", b"2"));
        let e = h.encode();
        assert_eq!(e.len(), h.encoded_len());
        assert_eq!(Hash::decode(&e), Ok(h.clone()));
        assert_eq!(Hash::decode(&e[..e.len() - 1]), Err(BadHash));
        assert_eq!(Hash::decode(&[2]), Err(BadHash));
        assert_eq!(Hash::decode(&[]), Err(BadHash));
        assert_eq!(h.remove_all(&[b"a"]), 1);
        assert_eq!(h.remove_all(&[b"a"]), 0);
        assert_eq!(h.get(b""), Some(&b""[..]));
    }

    /// An indexed hash answers as a scanned one: lookups, sets of new and
    /// present fields, removals of many fields (duplicates counted once)
    /// keeping the order of the rest.
    #[test]
    fn an_indexed_hash_answers_as_a_scanned_one() {
        let names: Vec<Vec<u8>> = (0..40).map(|i| format!("f{i}").into_bytes()).collect();
        let mut plain = Hash::default();
        for (i, f) in names.iter().enumerate() {
            plain.set(f, i.to_string().as_bytes());
        }
        let mut fast = Hash::decode(&plain.encode()).unwrap().indexed(INDEX_FROM_ARGS);
        assert!(fast.index.is_some() && plain.index.is_none());
        for h in [&mut plain, &mut fast] {
            assert_eq!(h.get(b"f7"), Some(&b"7"[..]));
            assert_eq!(h.get(b"nope"), None);
            assert!(!h.set(b"f3", b"three"));
            assert!(h.set(b"new", b"n"));
            assert_eq!(h.get(b"new"), Some(&b"n"[..]));
        }
        assert_eq!(plain, fast);
        let gone: Vec<&[u8]> = [&b"f1"[..], b"f2", b"f2", b"absent", b"f30", b"new", b"f0", b"f9", b"f10"].to_vec();
        assert_eq!(plain.remove_all(&gone[..2]) + plain.remove_all(&gone[2..]), 7);
        assert_eq!(fast.remove_all(&gone), 7);
        assert_eq!(plain, fast);
        assert_eq!(fast.fields.first().map(|(f, _)| &f[..]), Some(&b"f3"[..]));
        let fast = fast.indexed(INDEX_FROM_ARGS);
        assert_eq!((fast.get(b"f31"), fast.get(b"f30")), (Some(&b"31"[..]), None));
    }
}
