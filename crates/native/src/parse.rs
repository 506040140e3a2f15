//! Decoding one request frame from the front of a connection's input: the
//! header (for the protocol version the connection negotiated), then the
//! namespace name and the opcode's body (docs/PROTOCOL.md, "Frames"), with
//! the frame-level errors the server answers before it closes the
//! connection.
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

/// The header at the front of `input`, checked against the frame limit
/// and protocol `version`; None until its bytes are in.
pub(crate) fn header(input: &[u8], limits: &Limits, version: u16) -> Result<Option<Header>, FrameError> {
    if input.len() < proto::HEADER_BYTES {
        return Ok(None);
    }
    Header::decode(input, limits.frame_max, version).map(Some).map_err(|e| FrameError {
        status: if Header::peek_len(input) > limits.frame_max { Status::FrameTooLarge } else { Status::BadFrame },
        id: Header::peek_id(input),
        reason: e.0,
    })
}

/// Bytes of the whole frame `h` begins.
pub(crate) fn frame_len(h: &Header) -> usize {
    proto::HEADER_BYTES + h.len as usize
}

/// A request frame decoded: the namespace it names (empty: the default
/// one), the request, and the whole body it borrows from.
pub(crate) type Parsed<'a> = (&'a [u8], Request<'a>, &'a [u8]);

/// The request of the frame at the front of `input`, whose header is `h`,
/// on a connection of protocol `version` (a TXN operation of a later
/// version's kind is malformed, as a later opcode is); None until the
/// whole frame is in (the input grows as the body arrives, never ahead
/// of it).
pub(crate) fn request<'a>(h: &Header, input: &'a [u8], version: u16) -> Result<Option<Parsed<'a>>, FrameError> {
    let total = frame_len(h);
    if input.len() < total {
        return Ok(None);
    }
    let body = &input[proto::HEADER_BYTES..total];
    let bad = |e: proto::ProtoError| FrameError { status: Status::BadFrame, id: h.id, reason: e.0 };
    let (ns, req) =
        Request::decode(h, body).map_err(|e| bad(proto::ProtoError(format!("{}: {}", h.op.name(), e.0))))?;
    req.check_version(version).map_err(bad)?;
    Ok(Some((ns, req, body)))
}

/// Whether the frame at the front of `input` (header `h`) is a PUT whose
/// value should be received straight into the record buffer the device
/// writes, rather than through the input buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LargePut<'a> {
    /// No: the frame takes the ordinary path, which also answers every
    /// malformed case (a bad mode, a key length overrunning the body...).
    No,
    /// Not known until the key (and its length), and a 16th of the value
    /// (at least `ZERO_COPY_MIN_BYTES`), are in: read more.
    Incomplete,
    /// Yes: the namespace named (empty: the default one), the key, and
    /// where in `input` the value starts (some of it may already be there).
    Yes { ns: &'a [u8], key: &'a [u8], mode: PutMode, value_at: usize, value_len: usize },
}

/// Classify the frame at the front of `input` (see [`LargePut`]): a PUT
/// with a valid mode, a key of 1..=`KEY_BYTES_MAX` bytes, and a value of at
/// least [`ZERO_COPY_MIN_BYTES`] within the server's value limit, once the
/// key and a 16th of the value (at least [`ZERO_COPY_MIN_BYTES`]) are in. The
/// value is the frame's tail in both versions: after the header, the
/// namespace name (`ns_len` bytes, version 2), the key's length and the key.
pub(crate) fn large_put<'a>(h: &Header, input: &'a [u8], limits: &Limits) -> LargePut<'a> {
    let nl = h.ns_len as usize;
    if h.op != Op::Put || (h.len as usize) < nl + 4 + ZERO_COPY_MIN_BYTES {
        return LargePut::No;
    }
    let Ok(mode) = PutMode::from_u8(h.flags) else { return LargePut::No };
    let body = &input[proto::HEADER_BYTES..];
    if body.len() < nl + 4 {
        return LargePut::Incomplete;
    }
    let kl = u32::from_le_bytes([body[nl], body[nl + 1], body[nl + 2], body[nl + 3]]) as usize;
    if kl == 0 || kl > proto::KEY_BYTES_MAX || nl + 4 + kl > h.len as usize {
        return LargePut::No;
    }
    let value_len = h.len as usize - nl - 4 - kl;
    if value_len < ZERO_COPY_MIN_BYTES || value_len > limits.value_bytes_max as usize {
        return LargePut::No;
    }
    // The value's buffer is made only once part of the value has come
    // (1/16 of it, at least ZERO_COPY_MIN_BYTES): a header alone never
    // makes the server allocate the value it announces, and a peer must
    // send 1 byte for every 16 it makes the server hold.
    let need = value_len.min((value_len / 16).max(ZERO_COPY_MIN_BYTES));
    if body.len() < nl + 4 + kl + need {
        return LargePut::Incomplete;
    }
    let key = &body[nl + 4..nl + 4 + kl];
    LargePut::Yes { ns: &body[..nl], key, mode, value_at: proto::HEADER_BYTES + nl + 4 + kl, value_len }
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

    /// Header, namespace and request of a whole frame, or the first
    /// error, on a connection of `version`.
    type Frame<'a> = (Header, &'a [u8], Request<'a>, usize);
    fn parse_v(input: &[u8], version: u16) -> Result<Option<Frame<'_>>, FrameError> {
        let Some(h) = header(input, &limits(), version)? else { return Ok(None) };
        Ok(request(&h, input, version)?.map(|(ns, r, body)| (h, ns, r, proto::HEADER_BYTES + body.len())))
    }

    fn parse(input: &[u8]) -> Result<Option<Frame<'_>>, FrameError> {
        parse_v(input, proto::VERSION)
    }

    fn error_v(input: &[u8], version: u16) -> FrameError {
        match parse_v(input, version) {
            Err(e) => e,
            Ok(r) => panic!("parsed: {r:?}"),
        }
    }

    fn error(input: &[u8]) -> FrameError {
        error_v(input, proto::VERSION)
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
            Request::NsCreate(proto::NamespaceOptions { default_ttl_secs: 60, ..Default::default() }),
            Request::NsDrop,
            Request::NsTruncate,
            Request::NsList,
            Request::NsStats,
            Request::Txn(vec![
                proto::TxnOp::put("users", b"a", b"1"),
                proto::TxnOp::cas("", b"b", 7, b"2"),
                proto::TxnOp::delete("default", b"c"),
            ]),
            Request::Gets(b"k"),
            Request::DeleteCas { key: b"k", cas: 77 },
        ];
        // In the default namespace, then (where the opcode names one) in
        // "users", pipelined.
        let mut input = Vec::new();
        let mut want = Vec::new();
        for (id, r) in reqs.iter().enumerate() {
            r.encode(id as u64, &mut input);
            want.push((id as u64, &b""[..], r));
            if r.op().names_namespace() {
                r.encode_in(b"users", 100 + id as u64, &mut input);
                want.push((100 + id as u64, &b"users"[..], r));
            }
        }
        let mut at = 0;
        for (id, ns, r) in want {
            let (h, got_ns, got, len) = parse(&input[at..]).unwrap().unwrap();
            assert_eq!((h.id, h.op, got_ns, &got), (id, r.op(), ns, r));
            at += len;
        }
        assert_eq!(at, input.len());
        assert_eq!(parse(&input[at..]), Ok(None));
    }

    #[test]
    fn a_version_1_connection_takes_version_1_frames_only() {
        // The default namespace's frames are the same in both versions.
        let f = encode(&Request::Put { key: b"k", value: b"v", mode: PutMode::Upsert }, 4);
        assert_eq!(parse_v(&f, 1).unwrap().unwrap().1, b"");
        // A name (byte 6: reserved in version 1), or a version 2 opcode.
        let mut f = Vec::new();
        Request::Get(b"k").encode_in(b"users", 4, &mut f);
        let e = error_v(&f, 1);
        assert_eq!((e.status, e.id), (Status::BadFrame, 4));
        assert!(e.reason.contains("reserved"), "{}", e.reason);
        for r in [Request::NsList, Request::NsDrop, Request::Txn(vec![proto::TxnOp::put("", b"k", b"v")])] {
            let e = error_v(&encode(&r, 5), 1);
            assert_eq!((e.status, e.id), (Status::BadFrame, 5));
            assert!(e.reason.contains("needs protocol version 2"), "{}", e.reason);
        }
        // GETS and DELETE_CAS are version 3's: malformed on versions 1 and 2.
        for v in [1, 2] {
            for r in [Request::Gets(b"k"), Request::DeleteCas { key: b"k", cas: 1 }] {
                let e = error_v(&encode(&r, 7), v);
                assert_eq!((e.status, e.id), (Status::BadFrame, 7));
                assert!(e.reason.contains("needs protocol version 3"), "{}", e.reason);
            }
        }
        // A TXN's delete_cas (kind 6) is version 3's too.
        let f =
            encode(&Request::Txn(vec![proto::TxnOp::put("", b"a", b"v"), proto::TxnOp::delete_cas("", b"k", 1)]), 8);
        for v in [1, 2] {
            let e = error_v(&f, v);
            assert_eq!((e.status, e.id), (Status::BadFrame, 8));
            assert!(e.reason.contains(&format!("needs protocol version {}", v + 1)), "{}", e.reason);
        }
        assert!(parse_v(&f, 3).unwrap().is_some());
        // Version 2: a name over the limit; a name on an opcode that takes none.
        let mut f = encode(&Request::Get(&[b'k'; 100]), 6);
        f[6] = proto::NAMESPACE_NAME_MAX as u8 + 1;
        assert!(error(&f).reason.contains("namespace name of 65 bytes"));
        let mut f = Vec::new();
        Header { len: 1, op: Op::NsList, flags: 0, ns_len: 1, id: 6 }.encode(&mut f);
        f.push(b'x');
        assert!(error(&f).reason.contains("NS_LIST: names no namespace"));
    }

    #[test]
    fn a_frame_is_incomplete_until_every_byte_is_in() {
        let f = encode(&Request::Put { key: b"key", value: b"value", mode: PutMode::Upsert }, 9);
        for n in 0..f.len() {
            assert_eq!(parse(&f[..n]), Ok(None), "{n} bytes");
        }
        let mut named = Vec::new();
        Request::Put { key: b"key", value: b"value", mode: PutMode::Upsert }.encode_in(b"ns", 9, &mut named);
        for n in 0..named.len() {
            assert_eq!(parse(&named[..n]), Ok(None), "{n} bytes");
        }
        assert_eq!(parse(&named).unwrap().unwrap().1, b"ns");
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
        let e = bad(4, 16);
        assert!(e.reason.contains("unknown opcode 16"), "{}", e.reason);
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
        assert_eq!(header(&b, &limits(), proto::VERSION).unwrap().unwrap().len, limits().frame_max);
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
        let hd = |op: Op, flags: u8, len: usize| Header { len: len as u32, op, flags, ns_len: 0, id: 5 };
        // Flags on anything but a PUT or an NS_CREATE.
        for op in Op::ALL.into_iter().filter(|&op| op != Op::Put && op != Op::NsCreate) {
            assert!(body_error(hd(op, 1, 0), &[]).contains("flags"));
        }
        // An unknown namespace mode; an NS_CREATE cut short.
        assert!(body_error(hd(Op::NsCreate, 2, 20), &[0; 20]).contains("namespace mode"));
        assert!(body_error(hd(Op::NsCreate, 0, 19), &[0; 19]).contains("overruns"));
        // A namespace name overrunning its body.
        let mut h = hd(Op::Get, 0, 3);
        h.ns_len = 4;
        assert!(body_error(h, b"abc").contains("overruns"));
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
        // TXN: a name on the frame, an unknown operation kind, a count over
        // the engine's limit of operations.
        let mut h = hd(Op::Txn, 0, 5);
        h.ns_len = 5;
        assert!(body_error(h, b"users").contains("names no namespace"));
        let mut b = 1u32.to_le_bytes().to_vec();
        b.extend_from_slice(&[9, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        b.extend_from_slice(&[0; 8]);
        b.push(b'k');
        assert!(body_error(hd(Op::Txn, 0, b.len()), &b).contains("unknown kind 9"));
        let mut b = (proto::TXN_OPS_MAX as u32 + 1).to_le_bytes().to_vec();
        b.resize(4 + (proto::TXN_OPS_MAX + 1) * proto::TXN_OP_BYTES, 0);
        assert!(body_error(hd(Op::Txn, 0, b.len()), &b).contains("exceed the limit of 1024"));
        // A key over the protocol's limit, in a frame within it.
        let key = vec![b'k'; proto::KEY_BYTES_MAX + 1];
        assert!(body_error(hd(Op::Get, 0, key.len()), &key).contains("exceeds"));
    }

    #[test]
    fn what_the_store_refuses_is_not_a_frame_error() {
        // An empty key, or a value over the server's limit, is answered by
        // the request (KEY_INVALID, VALUE_TOO_LARGE) on an open connection.
        let f = encode(&Request::Get(b""), 1);
        let (_, _, r, _) = parse(&f).unwrap().unwrap();
        assert_eq!(r, Request::Get(b""));
        // A namespace that does not exist, or a name the engine refuses,
        // is the request's answer too (NO_SUCH_NAMESPACE, BAD_NAMESPACE).
        let mut f = Vec::new();
        Request::NsCreate(Default::default()).encode_in(b"not a name!", 1, &mut f);
        assert!(parse(&f).unwrap().is_some());
        let value = vec![0u8; VALUE_MAX as usize + 1];
        let f = encode(&Request::Put { key: b"k", value: &value, mode: PutMode::Upsert }, 1);
        assert!(parse(&f).unwrap().is_some());
    }

    #[test]
    fn large_puts_are_recognised_once_their_key_and_part_of_their_value_are_in() {
        let l = limits();
        let put = |key: &[u8], value_len: usize, mode: PutMode| {
            encode(&Request::Put { key, value: &vec![7u8; value_len], mode }, 3)
        };
        let classify = |f: &[u8], n: usize| {
            let h = header(&f[..n], &l, proto::VERSION).unwrap().unwrap();
            match large_put(&h, &f[..n], &l) {
                LargePut::Yes { ns, key, mode, value_at, value_len } => {
                    assert_eq!(ns, &f[proto::HEADER_BYTES..proto::HEADER_BYTES + h.ns_len as usize]);
                    Some((key.to_vec(), mode, value_at, value_len))
                }
                LargePut::Incomplete => None,
                LargePut::No => panic!("not a large PUT"),
            }
        };
        let f = put(b"key", ZERO_COPY_MIN_BYTES, PutMode::ReplaceOnly);
        let at = proto::HEADER_BYTES + 4 + 3;
        // Until the key and ZERO_COPY_MIN_BYTES of the value are in (here
        // all of it): a header alone made the server allocate the value.
        for n in proto::HEADER_BYTES..f.len() {
            assert_eq!(classify(&f, n), None, "{n} bytes");
        }
        let want = Some((b"key".to_vec(), PutMode::ReplaceOnly, at, ZERO_COPY_MIN_BYTES));
        assert_eq!(classify(&f, f.len()), want);
        // A 1 MiB value: once 64 KiB of it are in.
        let f = put(b"key", 1 << 20, PutMode::Upsert);
        assert_eq!(classify(&f, at + (64 << 10) - 1), None);
        assert_eq!(classify(&f, at + (64 << 10)), Some((b"key".to_vec(), PutMode::Upsert, at, 1 << 20)));
        // In a namespace: the value starts after the name too.
        let mut f = Vec::new();
        Request::Put { key: b"key", value: &[7u8; ZERO_COPY_MIN_BYTES], mode: PutMode::Upsert }
            .encode_in(b"users", 3, &mut f);
        let at = proto::HEADER_BYTES + 5 + 4 + 3;
        for n in proto::HEADER_BYTES..f.len() {
            assert_eq!(classify(&f, n), None, "{n} bytes");
        }
        assert_eq!(classify(&f, f.len()), Some((b"key".to_vec(), PutMode::Upsert, at, ZERO_COPY_MIN_BYTES)));
        assert_eq!(&f[at..], &[7u8; ZERO_COPY_MIN_BYTES][..]);
        let no = |f: &[u8], why: &str| {
            let h = header(f, &l, proto::VERSION).unwrap().unwrap();
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
