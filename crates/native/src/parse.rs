//! Decoding one request frame from the front of a connection's input: the
//! header, then the opcode's body (docs/PROTOCOL.md, "Frames"), with the
//! frame-level errors the server answers before it closes the connection.
//! The byte layouts are `granary_proto`'s; this module decides what the
//! server makes of them: which status an error gets, which id it echoes,
//! and which PUTs take the zero-copy path.
//!
//! Pure: no I/O, no store, no counters.
//!
//! Invariants:
//! - nothing is allocated on a header's say-so: a length over the frame
//!   limit is refused from the header's 16 bytes alone (`FRAME_TOO_LARGE`,
//!   checked before any other field, so it wins over a bad opcode);
//! - a frame is incomplete (`None`: read more) until every byte its
//!   decoding needs is in the input; nothing is consumed before;
//! - an error names the id its error frame echoes: the header's id field,
//!   even when the rest of the header is invalid.

use crate::limits::ZERO_COPY_MIN_BYTES;
use granary_proto::{self as proto, Header, Op, PutMode, Request, Status};

/// The bounds a frame is checked against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Largest request body (`granary_proto::frame_bytes_max`).
    pub frame_max: u32,
    /// Largest value the server accepts.
    pub value_bytes_max: u32,
}

/// A malformed frame: the server answers with an error frame (opcode NOP,
/// `status`, `id`, `reason` as its message) and closes the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FrameError {
    /// `BAD_FRAME`, or `FRAME_TOO_LARGE` for a length over the limit.
    pub status: Status,
    pub id: u64,
    pub reason: String,
}

/// The header at the front of `input`, checked against the frame limit;
/// None until its bytes are in.
pub(crate) fn header(input: &[u8], limits: &Limits) -> Result<Option<Header>, FrameError> {
    if input.len() < proto::HEADER_BYTES {
        return Ok(None);
    }
    Header::decode(input, limits.frame_max).map(Some).map_err(|e| FrameError {
        status: if Header::peek_len(input) > limits.frame_max { Status::FrameTooLarge } else { Status::BadFrame },
        id: Header::peek_id(input),
        reason: e.0,
    })
}

/// Bytes of the whole frame `h` begins.
pub(crate) fn frame_len(h: &Header) -> usize {
    proto::HEADER_BYTES + h.len as usize
}

/// The request of the frame at the front of `input`, whose header is `h`,
/// and the body it borrows from; None until the whole frame is in (the
/// input grows as the body arrives, never ahead of it).
pub(crate) fn request<'a>(h: &Header, input: &'a [u8]) -> Result<Option<(Request<'a>, &'a [u8])>, FrameError> {
    let total = frame_len(h);
    if input.len() < total {
        return Ok(None);
    }
    let body = &input[proto::HEADER_BYTES..total];
    match Request::decode(h, body) {
        Ok(req) => Ok(Some((req, body))),
        Err(e) => Err(FrameError { status: Status::BadFrame, id: h.id, reason: format!("{}: {}", h.op.name(), e.0) }),
    }
}

/// Whether the frame at the front of `input` (header `h`) is a PUT whose
/// value should be received straight into the record buffer the device
/// writes, rather than through the input buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LargePut<'a> {
    /// No: the frame takes the ordinary path, which also answers every
    /// malformed case (a bad mode, a key length overrunning the body...).
    No,
    /// Not known until the key (and its length) are in: read more.
    Incomplete,
    /// Yes: the key, and where in `input` the value starts (some of it may
    /// already be there).
    Yes { key: &'a [u8], mode: PutMode, value_at: usize, value_len: usize },
}

/// Classify the frame at the front of `input` (see [`LargePut`]): a PUT
/// with a valid mode, a key of 1..=`KEY_BYTES_MAX` bytes, and a value of at
/// least [`ZERO_COPY_MIN_BYTES`] within the server's value limit.
pub(crate) fn large_put<'a>(h: &Header, input: &'a [u8], limits: &Limits) -> LargePut<'a> {
    if h.op != Op::Put || (h.len as usize) < ZERO_COPY_MIN_BYTES + 4 {
        return LargePut::No;
    }
    let Ok(mode) = PutMode::from_u8(h.flags) else { return LargePut::No };
    let body = &input[proto::HEADER_BYTES..];
    if body.len() < 4 {
        return LargePut::Incomplete;
    }
    let kl = u32::from_le_bytes([body[0], body[1], body[2], body[3]]) as usize;
    if kl == 0 || kl > proto::KEY_BYTES_MAX || 4 + kl > h.len as usize {
        return LargePut::No;
    }
    let value_len = h.len as usize - 4 - kl;
    if value_len < ZERO_COPY_MIN_BYTES || value_len > limits.value_bytes_max as usize {
        return LargePut::No;
    }
    if body.len() < 4 + kl {
        return LargePut::Incomplete;
    }
    LargePut::Yes { key: &body[4..4 + kl], mode, value_at: proto::HEADER_BYTES + 4 + kl, value_len }
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_proto::BatchOp;

    const VALUE_MAX: u32 = 1 << 20;

    fn limits() -> Limits {
        Limits { frame_max: proto::frame_bytes_max(VALUE_MAX), value_bytes_max: VALUE_MAX }
    }

    fn encode(r: &Request, id: u64) -> Vec<u8> {
        let mut f = Vec::new();
        r.encode(id, &mut f);
        f
    }

    /// Header and request of a whole frame, or the first error.
    fn parse(input: &[u8]) -> Result<Option<(Header, Request<'_>, usize)>, FrameError> {
        let Some(h) = header(input, &limits())? else { return Ok(None) };
        Ok(request(&h, input)?.map(|(r, body)| (h, r, proto::HEADER_BYTES + body.len())))
    }

    fn error(input: &[u8]) -> FrameError {
        match parse(input) {
            Err(e) => e,
            Ok(r) => panic!("parsed: {r:?}"),
        }
    }

    #[test]
    fn every_opcode_round_trips_and_pipelined_frames_follow_each_other() {
        let reqs = [
            Request::Get(b"k"),
            Request::Put { key: b"k", value: b"v", mode: PutMode::CreateOnly },
            Request::Delete(b"k"),
            Request::MultiGet(vec![b"a", b"bb"]),
            Request::Batch(vec![
                BatchOp::Get(b"a"),
                BatchOp::Put { key: b"b", value: b"v", mode: PutMode::ReplaceOnly },
                BatchOp::Delete(b"c"),
            ]),
            Request::Nop,
            Request::Stats,
        ];
        let mut input = Vec::new();
        for (id, r) in reqs.iter().enumerate() {
            r.encode(id as u64, &mut input);
        }
        let mut at = 0;
        for (id, want) in reqs.iter().enumerate() {
            let (h, got, len) = parse(&input[at..]).unwrap().unwrap();
            assert_eq!((h.id, h.op, &got), (id as u64, want.op(), want));
            at += len;
        }
        assert_eq!(at, input.len());
        assert_eq!(parse(&input[at..]), Ok(None));
    }

    #[test]
    fn a_frame_is_incomplete_until_every_byte_is_in() {
        let f = encode(&Request::Put { key: b"key", value: b"value", mode: PutMode::Upsert }, 9);
        for n in 0..f.len() {
            assert_eq!(parse(&f[..n]), Ok(None), "{n} bytes");
        }
        assert!(parse(&f).unwrap().is_some());
        // A header announcing a large body asks for it, allocating nothing.
        let mut big = f[..proto::HEADER_BYTES].to_vec();
        big[0..4].copy_from_slice(&limits().frame_max.to_le_bytes());
        assert_eq!(parse(&big), Ok(None));
    }

    #[test]
    fn header_errors_echo_the_id_and_tell_too_large_from_bad() {
        let f = encode(&Request::Get(b"k"), 77);
        let bad = |at: usize, byte: u8| {
            let mut b = f.clone();
            b[at] = byte;
            error(&b)
        };
        let e = bad(4, 200);
        assert_eq!((e.status, e.id), (Status::BadFrame, 77));
        assert!(e.reason.contains("unknown opcode 200"), "{}", e.reason);
        let e = bad(4, 0);
        assert_eq!((e.status, e.id), (Status::BadFrame, 77), "opcode 0");
        let e = bad(7, 1);
        assert_eq!((e.status, e.id), (Status::BadFrame, 77));
        assert!(e.reason.contains("reserved"), "{}", e.reason);
        // Over the limit, from the header alone; the length is checked
        // first, so it wins over a bad opcode too.
        for len in [limits().frame_max + 1, u32::MAX] {
            let mut b = f[..proto::HEADER_BYTES].to_vec();
            b[0..4].copy_from_slice(&len.to_le_bytes());
            let e = error(&b);
            assert_eq!((e.status, e.id), (Status::FrameTooLarge, 77), "{len}");
            b[4] = 200;
            assert_eq!(error(&b).status, Status::FrameTooLarge, "{len} with a bad opcode");
        }
        // Exactly the limit is a frame (incomplete here).
        let mut b = f[..proto::HEADER_BYTES].to_vec();
        b[0..4].copy_from_slice(&limits().frame_max.to_le_bytes());
        assert_eq!(header(&b, &limits()).unwrap().unwrap().len, limits().frame_max);
    }

    #[test]
    fn body_errors_are_bad_frames_named_by_opcode() {
        let body_error = |h: Header, body: &[u8]| {
            let mut f = Vec::new();
            h.encode(&mut f);
            f.extend_from_slice(body);
            let e = error(&f);
            assert_eq!((e.status, e.id), (Status::BadFrame, h.id), "{}", e.reason);
            assert!(e.reason.starts_with(&format!("{}: ", h.op.name())), "{}", e.reason);
            e.reason
        };
        let hd = |op: Op, flags: u8, len: usize| Header { len: len as u32, op, flags, id: 5 };
        // Flags on anything but a PUT.
        for op in [Op::Get, Op::Delete, Op::MultiGet, Op::Batch, Op::Nop, Op::Stats] {
            assert!(body_error(hd(op, 1, 0), &[]).contains("flags"));
        }
        // An unknown PUT mode.
        assert!(body_error(hd(Op::Put, 3, 5), &[1, 0, 0, 0, b'k']).contains("PUT mode"));
        // A PUT whose key length overruns its body, or is cut short.
        assert!(body_error(hd(Op::Put, 0, 5), &[9, 0, 0, 0, b'k']).contains("overruns"));
        assert!(body_error(hd(Op::Put, 0, 2), &[1, 0]).contains("overruns"));
        // An MGET whose count overruns its body, or exceeds the limit.
        assert!(body_error(hd(Op::MultiGet, 0, 4), &1000u32.to_le_bytes()).contains("overrun"));
        let n = (proto::MULTI_OPS_MAX as u32 + 1).to_le_bytes();
        assert!(body_error(hd(Op::MultiGet, 0, 4), &n).contains("exceed the limit"));
        // Trailing bytes after the last key.
        assert!(body_error(hd(Op::MultiGet, 0, 10), &[1, 0, 0, 0, 1, 0, 0, 0, b'k', b'x']).contains("trailing"));
        // A BATCH entry that cannot be batched, or a GET with a value.
        let entry = |op: u8, flags: u8, key: &[u8], value: &[u8]| {
            let mut b = 1u32.to_le_bytes().to_vec();
            b.extend_from_slice(&[op, flags]);
            b.extend_from_slice(&(key.len() as u32).to_le_bytes());
            b.extend_from_slice(&(value.len() as u32).to_le_bytes());
            b.extend_from_slice(key);
            b.extend_from_slice(value);
            b
        };
        let b = entry(Op::Nop as u8, 0, b"k", b"");
        assert!(body_error(hd(Op::Batch, 0, b.len()), &b).contains("cannot be batched"));
        let b = entry(Op::Get as u8, 0, b"k", b"v");
        assert!(body_error(hd(Op::Batch, 0, b.len()), &b).contains("with flags or a value"));
        let b = entry(99, 0, b"k", b"");
        assert!(body_error(hd(Op::Batch, 0, b.len()), &b).contains("unknown opcode 99"));
        // A key over the protocol's limit, in a frame within it.
        let key = vec![b'k'; proto::KEY_BYTES_MAX + 1];
        assert!(body_error(hd(Op::Get, 0, key.len()), &key).contains("exceeds"));
    }

    #[test]
    fn what_the_store_refuses_is_not_a_frame_error() {
        // An empty key, or a value over the server's limit, is answered by
        // the request (KEY_INVALID, VALUE_TOO_LARGE) on an open connection.
        let f = encode(&Request::Get(b""), 1);
        let (_, r, _) = parse(&f).unwrap().unwrap();
        assert_eq!(r, Request::Get(b""));
        let value = vec![0u8; VALUE_MAX as usize + 1];
        let f = encode(&Request::Put { key: b"k", value: &value, mode: PutMode::Upsert }, 1);
        assert!(parse(&f).unwrap().is_some());
    }

    #[test]
    fn large_puts_are_recognised_once_their_key_is_in() {
        let l = limits();
        let put = |key: &[u8], value_len: usize, mode: PutMode| {
            encode(&Request::Put { key, value: &vec![7u8; value_len], mode }, 3)
        };
        let classify = |f: &[u8], n: usize| {
            let h = header(&f[..n], &l).unwrap().unwrap();
            match large_put(&h, &f[..n], &l) {
                LargePut::Yes { key, mode, value_at, value_len } => Some((key.to_vec(), mode, value_at, value_len)),
                LargePut::Incomplete => None,
                LargePut::No => panic!("not a large PUT"),
            }
        };
        let f = put(b"key", ZERO_COPY_MIN_BYTES, PutMode::ReplaceOnly);
        let at = proto::HEADER_BYTES + 4 + 3;
        for n in proto::HEADER_BYTES..at {
            assert_eq!(classify(&f, n), None, "{n} bytes");
        }
        let want = Some((b"key".to_vec(), PutMode::ReplaceOnly, at, ZERO_COPY_MIN_BYTES));
        assert_eq!(classify(&f, at), want);
        assert_eq!(classify(&f, f.len()), want);
        let no = |f: &[u8], why: &str| {
            let h = header(f, &l).unwrap().unwrap();
            assert_eq!(large_put(&h, f, &l), LargePut::No, "{why}");
        };
        no(&put(b"key", ZERO_COPY_MIN_BYTES - 1, PutMode::Upsert), "a small value");
        no(&put(b"", ZERO_COPY_MIN_BYTES, PutMode::Upsert), "an empty key");
        no(&put(b"k", l.value_bytes_max as usize + 1, PutMode::Upsert), "a value over the limit");
        no(&encode(&Request::Get(&[b'k'; ZERO_COPY_MIN_BYTES + 4]), 3), "not a PUT");
        let mut f = put(b"key", ZERO_COPY_MIN_BYTES, PutMode::Upsert);
        f[5] = 3;
        no(&f, "an unknown mode");
        let mut f = put(b"key", ZERO_COPY_MIN_BYTES, PutMode::Upsert);
        f[proto::HEADER_BYTES..proto::HEADER_BYTES + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        no(&f, "a key length overrunning the body");
        let mut f = put(b"key", ZERO_COPY_MIN_BYTES, PutMode::Upsert);
        f[proto::HEADER_BYTES..proto::HEADER_BYTES + 4]
            .copy_from_slice(&(proto::KEY_BYTES_MAX as u32 + 1).to_le_bytes());
        no(&f, "a key over the limit");
    }
}
