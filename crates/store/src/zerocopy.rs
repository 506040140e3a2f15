//! The zero-copy API: values read into, and written from, the aligned
//! buffers the device uses, so a server can send a value from the buffer
//! it was read into and receive a value into the buffer that is written.
//!
//! - [`ValueBuf`]: a value as read by [`crate::Store::get_buf`]: the
//!   record's buffer, exposing the value's bytes (no copy), or, for a value
//!   the DRAM tier held ([`crate::tier`]), the copy taken of it under the
//!   tier's lock (the tier hands out no shared references: module docs
//!   there). It implements [`granary_rt::IoBuf`] over the value, so the
//!   ring can send it; a server sends directly from [`ValueBuf::value`]
//!   when the socket takes it, and needs the ring only for the rest.
//! - [`PutBuf`]: a record being built by [`crate::Store::new_put_buf`]: an
//!   aligned buffer of the record's size with the key in place and room for
//!   the value, which the caller fills ([`PutBuf::value_mut`], or a receive
//!   through the ring: its [`granary_rt::IoBuf`] is the part of the value
//!   not filled yet). [`crate::Store::put_buf`] writes the record from this
//!   buffer: the header and checksums are set in place, and the buffer goes
//!   to the device as it is (with write coalescing, a record of up to 16
//!   KiB is copied into a group's buffer instead, the group under way or
//!   one it starts: one copy of a few KiB costs less than a device write
//!   of its own).

use crate::types::ItemMeta;
use granary_format::limits::RECORD_HEADER_BYTES;
use granary_io::AlignedBuf;

/// Where a [`ValueBuf`]'s bytes are.
pub(crate) enum Bytes {
    /// The record's buffer as read from the device.
    Record(AlignedBuf),
    /// A copy of a DRAM tier item's value, this buffer's own (`start` is
    /// 0).
    Owned(Box<[u8]>),
}

/// A value read without copying it out of the record's buffer.
pub struct ValueBuf {
    pub(crate) buf: Bytes,
    pub(crate) start: usize,
    pub(crate) len: usize,
    /// Flags and expiry stored with the value.
    pub meta: ItemMeta,
    /// The value's CAS (sequence) number.
    pub cas: u64,
}

impl ValueBuf {
    /// The value's bytes.
    pub fn value(&self) -> &[u8] {
        match &self.buf {
            Bytes::Record(b) => &b[self.start..self.start + self.len],
            Bytes::Owned(b) => b,
        }
    }

    /// Whether the value came from the DRAM tier (no device read).
    pub fn from_dram(&self) -> bool {
        !matches!(self.buf, Bytes::Record(_))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for ValueBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueBuf").field("len", &self.len).field("meta", &self.meta).field("cas", &self.cas).finish()
    }
}

// SAFETY: the value lies within the AlignedBuf (start + len <= buf.len(),
// set by the store from a checked record header), or is the whole of an
// owned copy of a tier item's value (the memory handed out is this
// ValueBuf's alone); either heap allocation does not move when the
// ValueBuf moves and lives until it is dropped.
unsafe impl granary_rt::IoBuf for ValueBuf {
    fn stable_ptr(&mut self) -> *mut u8 {
        let start = self.start;
        match &mut self.buf {
            Bytes::Record(b) => b[start..].as_mut_ptr(),
            Bytes::Owned(b) => b.as_mut_ptr(),
        }
    }
    fn buf_len(&self) -> usize {
        self.len
    }
}

/// A record to write, built in the buffer the device writes from.
pub struct PutBuf {
    /// None only while the store writes it.
    pub(crate) buf: Option<AlignedBuf>,
    pub(crate) key_len: usize,
    pub(crate) value_len: usize,
    filled: usize,
    /// The engine that made it (kept allocated: its address is its
    /// identity; as `Any`, so this module does not name it): its grains
    /// size the buffer, so no other may write it.
    pub(crate) store: std::sync::Weak<dyn std::any::Any + Send + Sync>,
    /// The namespace it was made for (kept alive: its address is its
    /// identity), whose id its key holds.
    pub(crate) ns: std::sync::Arc<crate::namespace::NsState>,
}

impl PutBuf {
    pub(crate) fn new(
        buf: AlignedBuf,
        key_len: usize,
        value_len: usize,
        store: std::sync::Weak<dyn std::any::Any + Send + Sync>,
        ns: std::sync::Arc<crate::namespace::NsState>,
    ) -> PutBuf {
        PutBuf { buf: Some(buf), key_len, value_len, filled: 0, store, ns }
    }

    fn bytes(&self) -> &AlignedBuf {
        self.buf.as_ref().expect("a PutBuf holds its buffer outside the store")
    }

    /// The key as stored, in place in the record: in a namespace other
    /// than the default one, the engine's prefix and the namespace's id,
    /// then the caller's key.
    pub fn key(&self) -> &[u8] {
        &self.bytes()[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + self.key_len]
    }

    /// The value's bytes, to fill (zeros until written).
    pub fn value_mut(&mut self) -> &mut [u8] {
        let start = RECORD_HEADER_BYTES + self.key_len;
        let end = start + self.value_len;
        &mut self.buf.as_mut().expect("a PutBuf holds its buffer outside the store")[start..end]
    }

    pub fn value_len(&self) -> usize {
        self.value_len
    }

    /// Bytes of the value received so far through the [`granary_rt::IoBuf`]
    /// view (which covers the rest); see [`PutBuf::advance`].
    pub fn filled(&self) -> usize {
        self.filled
    }

    /// `n` more bytes of the value were received into the view.
    pub fn advance(&mut self, n: usize) {
        assert!(self.filled + n <= self.value_len, "PutBuf filled past its value");
        self.filled += n;
    }

    /// Append `b` after the bytes filled so far.
    pub fn fill_from(&mut self, b: &[u8]) {
        let at = self.filled;
        self.value_mut()[at..at + b.len()].copy_from_slice(b);
        self.advance(b.len());
    }

    /// Whether every byte of the value was filled (through
    /// [`PutBuf::fill_from`] or receives).
    pub fn is_full(&self) -> bool {
        self.filled == self.value_len
    }
}

impl std::fmt::Debug for PutBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PutBuf")
            .field("key_len", &self.key_len)
            .field("value_len", &self.value_len)
            .field("filled", &self.filled)
            .finish()
    }
}

// SAFETY: the view is the unfilled part of the value, within the buffer
// (filled <= value_len, and the buffer holds the whole record); the heap
// allocation does not move with the PutBuf and lives until it is dropped.
unsafe impl granary_rt::IoBuf for PutBuf {
    fn stable_ptr(&mut self) -> *mut u8 {
        let at = self.filled;
        self.value_mut()[at..].as_mut_ptr()
    }
    fn buf_len(&self) -> usize {
        self.value_len - self.filled
    }
}

/// Why [`PutBuf::receive`] stopped before the value was complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceiveEnd {
    /// The peer closed the connection, or receiving failed.
    Closed,
    /// Nothing arrived for the idle timeout.
    Idle,
}

impl PutBuf {
    /// Receive the rest of the value from `stream` straight into this
    /// buffer (through the executor's ring; under TLS, decrypted into it),
    /// waiting at most `idle` for each chunk; `received(n)` is told the
    /// size of every chunk. On an executor thread only.
    pub async fn receive(
        mut self,
        stream: &impl granary_rt::net::RecvWithin,
        idle: Option<std::time::Duration>,
        mut received: impl FnMut(usize),
    ) -> Result<PutBuf, ReceiveEnd> {
        while !self.is_full() {
            let Ok((r, b)) = stream.recv_within(self, idle).await else { return Err(ReceiveEnd::Idle) };
            self = b;
            match r {
                Ok(0) | Err(_) => return Err(ReceiveEnd::Closed),
                Ok(n) => {
                    received(n);
                    self.advance(n);
                }
            }
        }
        Ok(self)
    }
}
