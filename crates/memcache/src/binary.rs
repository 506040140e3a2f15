//! memcached's binary protocol, framing side: the 24-byte request header,
//! the opcodes served, the shape each opcode's extras, key and value must
//! have, and the response header. Pure: no IO, no store; the executor
//! (`exec::binary`) runs a framed request.
//!
//! A connection whose first byte is [`MAGIC_REQUEST`] speaks this protocol
//! for its whole life (memcached's auto-negotiation); see `conn`.
//!
//! Invariants:
//! - [`frame`] never asks for more than [`HEADER_BYTES`] plus a body the
//!   connection may buffer: a storage request's value over the item size
//!   limit, and an unknown opcode's body, are skipped ([`Frame::Skip`]),
//!   never buffered; any other request whose body is longer than its
//!   extras and a key of [`KEY_BYTES_MAX`] fails its shape check first;
//! - the checks are memcached 1.6's, in its order: a wrong magic closes
//!   the connection without a reply, a key and extras longer than the body
//!   get "Unknown command" and close it, a key longer than
//!   [`KEY_BYTES_MAX`] (whatever the opcode) or a body of the wrong shape
//!   for its opcode gets "Invalid arguments" and closes it, an unknown
//!   opcode gets "Unknown command" and the connection goes on.

use crate::limits::KEY_BYTES_MAX;

/// The first byte of a request.
pub(crate) const MAGIC_REQUEST: u8 = 0x80;
/// The first byte of a response.
pub(crate) const MAGIC_RESPONSE: u8 = 0x81;
/// Bytes of a request or response header.
pub(crate) const HEADER_BYTES: usize = 24;
/// Extras of a storage request (flags, expiration).
pub(crate) const STORE_EXTRAS_BYTES: usize = 8;
/// Extras of an increment or decrement (delta, initial, expiration).
pub(crate) const ARITH_EXTRAS_BYTES: usize = 20;
/// Extras of touch and get-and-touch, and optional of flush (expiration).
pub(crate) const EXPIRY_EXTRAS_BYTES: usize = 4;
/// The expiration of an increment or decrement that must not create a
/// missing counter.
pub(crate) const ARITH_NO_CREATE: u32 = 0xffff_ffff;

/// Response statuses (memcached's protocol_binary.h).
pub(crate) mod status {
    pub const OK: u16 = 0x0000;
    pub const KEY_ENOENT: u16 = 0x0001;
    pub const KEY_EEXISTS: u16 = 0x0002;
    pub const E2BIG: u16 = 0x0003;
    pub const EINVAL: u16 = 0x0004;
    pub const NOT_STORED: u16 = 0x0005;
    pub const DELTA_BADVAL: u16 = 0x0006;
    pub const UNKNOWN_COMMAND: u16 = 0x0081;
    pub const ENOMEM: u16 = 0x0082;
    pub const EINTERNAL: u16 = 0x0084;

    /// memcached 1.6's text for an error status, sent as the value.
    pub fn text(st: u16) -> &'static str {
        match st {
            KEY_ENOENT => "Not found",
            KEY_EEXISTS => "Data exists for key.",
            E2BIG => "Too large.",
            EINVAL => "Invalid arguments",
            NOT_STORED => "Not stored.",
            DELTA_BADVAL => "Non-numeric server-side value for incr or decr",
            UNKNOWN_COMMAND => "Unknown command",
            ENOMEM => "Out of memory",
            _ => "Internal error",
        }
    }
}

/// The opcodes served; every other one gets "Unknown command" (SASL's
/// included: Granary has no authentication).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// get, getq, getk, getkq.
    Get {
        quiet: bool,
        with_key: bool,
    },
    /// set, add, replace and their quiet variants.
    Store {
        kind: StoreKind,
        quiet: bool,
    },
    /// append, prepend and their quiet variants.
    Concat {
        append: bool,
        quiet: bool,
    },
    Delete {
        quiet: bool,
    },
    Arith {
        incr: bool,
        quiet: bool,
    },
    Quit {
        quiet: bool,
    },
    Flush {
        quiet: bool,
    },
    Noop,
    Version,
    Stat,
    Verbosity,
    Touch,
    /// gat, gatq, gatk, gatkq.
    Gat {
        quiet: bool,
        with_key: bool,
    },
}

/// Which storage condition a set-like opcode has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreKind {
    Set,
    Add,
    Replace,
}

impl Op {
    /// The opcode's meaning; None: unknown.
    pub(crate) fn from_code(code: u8) -> Option<Op> {
        use StoreKind::*;
        Some(match code {
            0x00 => Op::Get { quiet: false, with_key: false },
            0x09 => Op::Get { quiet: true, with_key: false },
            0x0c => Op::Get { quiet: false, with_key: true },
            0x0d => Op::Get { quiet: true, with_key: true },
            0x01 => Op::Store { kind: Set, quiet: false },
            0x02 => Op::Store { kind: Add, quiet: false },
            0x03 => Op::Store { kind: Replace, quiet: false },
            0x11 => Op::Store { kind: Set, quiet: true },
            0x12 => Op::Store { kind: Add, quiet: true },
            0x13 => Op::Store { kind: Replace, quiet: true },
            0x04 => Op::Delete { quiet: false },
            0x14 => Op::Delete { quiet: true },
            0x05 => Op::Arith { incr: true, quiet: false },
            0x06 => Op::Arith { incr: false, quiet: false },
            0x15 => Op::Arith { incr: true, quiet: true },
            0x16 => Op::Arith { incr: false, quiet: true },
            0x07 => Op::Quit { quiet: false },
            0x17 => Op::Quit { quiet: true },
            0x08 => Op::Flush { quiet: false },
            0x18 => Op::Flush { quiet: true },
            0x0a => Op::Noop,
            0x0b => Op::Version,
            0x0e => Op::Concat { append: true, quiet: false },
            0x0f => Op::Concat { append: false, quiet: false },
            0x19 => Op::Concat { append: true, quiet: true },
            0x1a => Op::Concat { append: false, quiet: true },
            0x10 => Op::Stat,
            0x1b => Op::Verbosity,
            0x1c => Op::Touch,
            0x1d => Op::Gat { quiet: false, with_key: false },
            0x1e => Op::Gat { quiet: true, with_key: false },
            0x23 => Op::Gat { quiet: false, with_key: true },
            0x24 => Op::Gat { quiet: true, with_key: true },
            _ => return None,
        })
    }

    /// The text command whose counters and latency it shares (an index
    /// of `COMMANDS` by name).
    pub(crate) fn command_name(self) -> &'static str {
        match self {
            Op::Get { .. } => "get",
            Op::Store { kind: StoreKind::Set, .. } => "set",
            Op::Store { kind: StoreKind::Add, .. } => "add",
            Op::Store { kind: StoreKind::Replace, .. } => "replace",
            Op::Concat { append: true, .. } => "append",
            Op::Concat { append: false, .. } => "prepend",
            Op::Delete { .. } => "delete",
            Op::Arith { incr: true, .. } => "incr",
            Op::Arith { incr: false, .. } => "decr",
            Op::Flush { .. } => "flush_all",
            Op::Touch => "touch",
            Op::Gat { .. } => "gat",
            _ => "other",
        }
    }

    /// Whether the body's shape fits the opcode (memcached's checks):
    /// extras length, key presence and length, value presence.
    fn shape_ok(self, extras: usize, key: usize, value: usize) -> bool {
        let key_ok = key > 0 && key <= KEY_BYTES_MAX;
        match self {
            Op::Get { .. } | Op::Delete { .. } => extras == 0 && key_ok && value == 0,
            Op::Store { .. } => extras == STORE_EXTRAS_BYTES && key_ok,
            Op::Concat { .. } => extras == 0 && key_ok,
            Op::Arith { .. } => extras == ARITH_EXTRAS_BYTES && key_ok && value == 0,
            Op::Quit { .. } | Op::Noop | Op::Version => extras == 0 && key == 0 && value == 0,
            Op::Flush { .. } => (extras == 0 || extras == EXPIRY_EXTRAS_BYTES) && key == 0 && value == 0,
            Op::Stat => extras == 0 && key <= KEY_BYTES_MAX && value == 0,
            Op::Verbosity => extras == EXPIRY_EXTRAS_BYTES && key == 0 && value == 0,
            Op::Touch | Op::Gat { .. } => extras == EXPIRY_EXTRAS_BYTES && key_ok && value == 0,
        }
    }

    /// A storage opcode, whose value may be over the item size limit.
    fn stores(self) -> bool {
        matches!(self, Op::Store { .. } | Op::Concat { .. })
    }
}

/// A request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub opcode: u8,
    pub key_len: usize,
    pub extras_len: usize,
    pub body_len: usize,
    pub opaque: u32,
    pub cas: u64,
}

impl Header {
    /// The header at the start of `b` (at least [`HEADER_BYTES`] long);
    /// its magic is not checked.
    fn read(b: &[u8]) -> Header {
        Header {
            opcode: b[1],
            key_len: u16::from_be_bytes([b[2], b[3]]) as usize,
            extras_len: b[4] as usize,
            body_len: u32::from_be_bytes([b[8], b[9], b[10], b[11]]) as usize,
            opaque: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
            cas: u64::from_be_bytes([b[16], b[17], b[18], b[19], b[20], b[21], b[22], b[23]]),
        }
    }

    fn value_len(&self) -> usize {
        self.body_len - self.key_len - self.extras_len
    }
}

/// A complete request: its header, opcode and body parts.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Packet<'a> {
    pub h: Header,
    pub op: Op,
    pub extras: &'a [u8],
    pub key: &'a [u8],
    pub value: &'a [u8],
}

/// What the next bytes of a binary connection's input are.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame<'a> {
    /// A request of the given total length (header and body).
    Request(Packet<'a>, usize),
    /// Not all of the next request is in yet: read more.
    Incomplete,
    /// Answer `status` (an error) to the header, having consumed
    /// `consumed` bytes (the header, and for a value over the item size
    /// limit its extras and `key`), and skip the `skip` bytes that follow
    /// (the rest of the body): an unknown opcode, a value over the limit.
    Skip { h: Header, status: u16, op: Option<Op>, key: &'a [u8], consumed: usize, skip: usize },
    /// Answer `status` (if any) and close the connection.
    Close { h: Header, status: Option<u16> },
}

/// The next request of `buf`, with values of at most `item_bytes_max`.
pub(crate) fn frame(buf: &[u8], item_bytes_max: usize) -> Frame<'_> {
    if buf.is_empty() {
        return Frame::Incomplete;
    }
    if buf[0] != MAGIC_REQUEST {
        // memcached closes without a reply (its reply to a zero header
        // aside).
        let h = if buf.len() >= HEADER_BYTES { Header::read(buf) } else { Header::read(&[0; HEADER_BYTES]) };
        return Frame::Close { h, status: None };
    }
    if buf.len() < HEADER_BYTES {
        return Frame::Incomplete;
    }
    let h = Header::read(buf);
    if h.key_len + h.extras_len > h.body_len {
        return Frame::Close { h, status: Some(status::UNKNOWN_COMMAND) };
    }
    // Before the opcode is looked at, as memcached checks it.
    if h.key_len > KEY_BYTES_MAX {
        return Frame::Close { h, status: Some(status::EINVAL) };
    }
    let Some(op) = Op::from_code(h.opcode) else {
        return Frame::Skip {
            h,
            status: status::UNKNOWN_COMMAND,
            op: None,
            key: &[],
            consumed: HEADER_BYTES,
            skip: h.body_len,
        };
    };
    if !op.shape_ok(h.extras_len, h.key_len, h.value_len()) {
        return Frame::Close { h, status: Some(status::EINVAL) };
    }
    if op.stores() && h.value_len() > item_bytes_max {
        // The key is read (a set drops its old value), the value skipped.
        let head = HEADER_BYTES + h.extras_len + h.key_len;
        if buf.len() < head {
            return Frame::Incomplete;
        }
        let key = &buf[HEADER_BYTES + h.extras_len..head];
        return Frame::Skip { h, status: status::E2BIG, op: Some(op), key, consumed: head, skip: h.value_len() };
    }
    let total = HEADER_BYTES + h.body_len;
    if buf.len() < total {
        return Frame::Incomplete;
    }
    let body = &buf[HEADER_BYTES..total];
    let (extras, rest) = body.split_at(h.extras_len);
    let (key, value) = rest.split_at(h.key_len);
    Frame::Request(Packet { h, op, extras, key, value }, total)
}

/// Append a response to `out`: the header answering `opcode`/`opaque`
/// with `status` and `cas`, then extras, key and value.
pub(crate) fn response(out: &mut Vec<u8>, opcode: u8, opaque: u32, st: u16, cas: u64, parts: [&[u8]; 3]) {
    let [extras, key, value] = parts;
    response_header(out, opcode, opaque, st, cas, extras.len(), key.len(), value.len());
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// Append a response header whose body (extras, key, value of the given
/// lengths) the caller sends next.
#[allow(clippy::too_many_arguments)]
pub(crate) fn response_header(
    out: &mut Vec<u8>,
    opcode: u8,
    opaque: u32,
    st: u16,
    cas: u64,
    extras: usize,
    key: usize,
    value: usize,
) {
    out.push(MAGIC_RESPONSE);
    out.push(opcode);
    out.extend_from_slice(&(key as u16).to_be_bytes());
    out.push(extras as u8);
    out.push(0); // data type: raw bytes
    out.extend_from_slice(&st.to_be_bytes());
    out.extend_from_slice(&((extras + key + value) as u32).to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(&cas.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(op: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut b = vec![MAGIC_REQUEST, op];
        b.extend_from_slice(&(key.len() as u16).to_be_bytes());
        b.push(extras.len() as u8);
        b.extend_from_slice(&[0, 0, 0]);
        b.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
        b.extend_from_slice(&7u32.to_be_bytes());
        b.extend_from_slice(&9u64.to_be_bytes());
        [b, extras.to_vec(), key.to_vec(), value.to_vec()].concat()
    }

    #[test]
    fn frames_split_a_request_into_its_parts() {
        let b = req(0x01, &[0, 0, 0, 5, 0, 0, 0, 0], b"k", b"val");
        for cut in 0..b.len() {
            assert_eq!(frame(&b[..cut], 100), Frame::Incomplete, "cut at {cut}");
        }
        let Frame::Request(p, n) = frame(&b, 100) else { panic!("not a request") };
        assert_eq!(
            (p.key, p.value, p.extras.len(), n, p.h.opaque, p.h.cas),
            (&b"k"[..], &b"val"[..], 8, b.len(), 7, 9)
        );
    }

    #[test]
    fn bad_requests_get_memcached_s_answers() {
        // Wrong magic: close, no reply.
        assert!(matches!(frame(b"get x\r\n", 100), Frame::Close { status: None, .. }));
        // Unknown opcode: skip its body, go on.
        assert!(matches!(
            frame(&req(0x40, b"", b"k", b"v"), 100),
            Frame::Skip { status: status::UNKNOWN_COMMAND, consumed: 24, skip: 2, .. }
        ));
        // Wrong shapes: close with EINVAL.
        for b in [
            req(0x00, b"", b"", b""),
            req(0x00, b"1234", b"k", b""),
            req(0x01, b"", b"k", b"v"),
            req(0x0a, b"", b"k", b""),
        ] {
            assert!(matches!(frame(&b, 100), Frame::Close { status: Some(status::EINVAL), .. }), "{b:?}");
        }
        let long = vec![b'k'; KEY_BYTES_MAX + 1];
        assert!(matches!(frame(&req(0x00, b"", &long, b""), 100), Frame::Close { status: Some(status::EINVAL), .. }));
        // Also for an unknown opcode: the key's length is checked first.
        assert!(matches!(frame(&req(0x40, b"", &long, b""), 100), Frame::Close { status: Some(status::EINVAL), .. }));
        // A value over the limit: skipped before it is read.
        let mut b = req(0x01, &[0; 8], b"k", b"");
        b[8..12].copy_from_slice(&(9u32 + 1000).to_be_bytes());
        assert!(matches!(frame(&b[..30], 100), Frame::Incomplete));
        assert!(matches!(
            frame(&b, 100),
            Frame::Skip { status: status::E2BIG, key: b"k", consumed: 33, skip: 1000, .. }
        ));
        // Key and extras longer than the body: close.
        let mut b = req(0x00, b"", b"abc", b"");
        b[8..12].copy_from_slice(&1u32.to_be_bytes());
        assert!(matches!(frame(&b, 100), Frame::Close { status: Some(status::UNKNOWN_COMMAND), .. }));
    }
}
