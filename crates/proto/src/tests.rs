//! Codec tests: round trips of every request and response shape, and
//! decoders that reject (never panic on) truncated, oversized and random
//! input.

use super::*;
use proptest::prelude::*;

const BIG: u32 = u32::MAX;

fn split(frame: &[u8]) -> (Header, &[u8]) {
    let h = Header::decode(frame, BIG).expect("header");
    (h, &frame[HEADER_BYTES..])
}

fn roundtrip(req: &Request) {
    let mut f = Vec::new();
    req.encode(42, &mut f);
    assert_eq!(f.len(), HEADER_BYTES + req.body_len());
    let (h, body) = split(&f);
    assert_eq!(h.id, 42);
    assert_eq!(h.len as usize, body.len());
    assert_eq!(&Request::decode(&h, body).expect("decode"), req);
    // A body shorter than its header says is rejected.
    for cut in 0..body.len() {
        assert!(Request::decode(&h, &body[..cut]).is_err(), "cut {cut} of {req:?}");
    }
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..40)
}
fn val() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..300)
}
fn mode() -> impl Strategy<Value = PutMode> {
    prop_oneof![Just(PutMode::Upsert), Just(PutMode::CreateOnly), Just(PutMode::ReplaceOnly)]
}

#[derive(Debug, Clone)]
enum OwnedOp {
    Get(Vec<u8>),
    Put(Vec<u8>, Vec<u8>, PutMode),
    Del(Vec<u8>),
}

fn owned_op() -> impl Strategy<Value = OwnedOp> {
    prop_oneof![
        key().prop_map(OwnedOp::Get),
        (key(), val(), mode()).prop_map(|(k, v, m)| OwnedOp::Put(k, v, m)),
        key().prop_map(OwnedOp::Del),
    ]
}

fn borrow(o: &OwnedOp) -> BatchOp<'_> {
    match o {
        OwnedOp::Get(k) => BatchOp::Get(k),
        OwnedOp::Put(k, v, m) => BatchOp::Put { key: k, value: v, mode: *m },
        OwnedOp::Del(k) => BatchOp::Delete(k),
    }
}

proptest! {
    #[test]
    fn single_key_requests_round_trip(k in key(), v in val(), m in mode()) {
        roundtrip(&Request::Get(&k));
        roundtrip(&Request::Delete(&k));
        roundtrip(&Request::Put { key: &k, value: &v, mode: m });
    }

    #[test]
    fn multi_requests_round_trip(keys in proptest::collection::vec(key(), 0..20),
                                 ops in proptest::collection::vec(owned_op(), 0..20)) {
        let ks: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        roundtrip(&Request::MultiGet(ks));
        roundtrip(&Request::Batch(ops.iter().map(borrow).collect()));
    }

    #[test]
    fn entries_and_stats_round_trip(es in proptest::collection::vec((0u8..=13, val()), 0..20),
                                    st in proptest::collection::vec(("[a-z_]{1,20}", "[0-9.]{0,12}"), 0..20)) {
        let mut b = Vec::new();
        encode_count(&mut b, es.len());
        for (s, v) in &es {
            encode_entry(&mut b, Status::from_u8(*s).unwrap(), v);
        }
        let back = decode_entries(&b).unwrap();
        prop_assert_eq!(back.len(), es.len());
        for (e, (s, v)) in back.iter().zip(&es) {
            prop_assert_eq!(e.status as u8, *s);
            prop_assert_eq!(&e.bytes, v);
        }
        for cut in 0..b.len() {
            prop_assert!(decode_entries(&b[..cut]).is_err());
        }
        let pairs: Vec<(String, String)> = st;
        let mut b = Vec::new();
        encode_stats(&mut b, &pairs);
        prop_assert_eq!(decode_stats(&b).unwrap(), pairs);
    }

    /// Fuzz: arbitrary bytes as a header and body never panic the
    /// decoders, and whatever decodes re-encodes to the same bytes.
    #[test]
    fn random_frames_never_panic(h in proptest::collection::vec(any::<u8>(), 16),
                                 body in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut hb = h.clone();
        hb[0..4].copy_from_slice(&(body.len() as u32).to_le_bytes());
        // Make half of the cases plausible: a known opcode, zero reserved bytes.
        if hb[15] & 1 == 0 {
            hb[4] = 1 + hb[4] % 7;
            hb[5] %= 3;
            hb[6] = 0;
            hb[7] = 0;
        }
        if let Ok(hd) = Header::decode(&hb, BIG) {
            if let Ok(req) = Request::decode(&hd, &body) {
                let mut again = Vec::new();
                req.encode(hd.id, &mut again);
                prop_assert_eq!(&again[..HEADER_BYTES], &hb[..]);
                prop_assert_eq!(&again[HEADER_BYTES..], &body[..]);
            }
        }
        let _ = decode_entries(&body);
        let _ = decode_stats(&body);
        let _ = Response::decode_header(&hb, BIG);
    }

    /// Fuzz: mutate one byte of a valid frame; decoding never panics.
    #[test]
    fn mutated_frames_never_panic(ops in proptest::collection::vec(owned_op(), 1..8), at in any::<usize>(), b in any::<u8>()) {
        let req = Request::Batch(ops.iter().map(borrow).collect());
        let mut f = Vec::new();
        req.encode(7, &mut f);
        let i = at % f.len();
        f[i] = b;
        if let Ok(h) = Header::decode(&f, BIG) {
            let body = &f[HEADER_BYTES..];
            let _ = Request::decode(&h, &body[..body.len().min(h.len as usize)]);
        }
    }
}

#[test]
fn header_limits_and_reserved_bytes() {
    let mut f = Vec::new();
    Request::Get(b"k").encode(1, &mut f);
    assert!(Header::decode(&f, 1).is_ok());
    let e = Header::decode(&f, 0).unwrap_err();
    assert!(e.0.contains("exceeds the limit"), "{e}");
    let mut bad = f.clone();
    bad[6] = 1;
    assert!(Header::decode(&bad, BIG).unwrap_err().0.contains("reserved"));
    let mut bad = f.clone();
    bad[4] = 99;
    assert!(Header::decode(&bad, BIG).unwrap_err().0.contains("unknown opcode 99"));
    assert_eq!(Header::peek_id(&bad), 1);
    assert!(Header::decode(&f[..15], BIG).is_err());
}

#[test]
fn requests_reject_bad_fields() {
    let h = |op, flags, len| Header { len, op, flags, id: 0 };
    // flags on a GET, unknown PUT mode
    assert!(Request::decode(&h(Op::Get, 1, 1), b"k").is_err());
    let mut f = Vec::new();
    Request::Put { key: b"k", value: b"v", mode: PutMode::Upsert }.encode(0, &mut f);
    let (mut hd, body) = split(&f);
    hd.flags = 3;
    assert!(Request::decode(&hd, body).unwrap_err().0.contains("PUT mode"));
    // trailing bytes after a NOP
    assert!(Request::decode(&h(Op::Nop, 0, 1), b"x").unwrap_err().0.contains("trailing"));
    // an MGET claiming more keys than its bytes could hold
    let mut b = Vec::new();
    b.extend_from_slice(&(MULTI_OPS_MAX as u32).to_le_bytes());
    assert!(Request::decode(&h(Op::MultiGet, 0, 4), &b).unwrap_err().0.contains("overrun"));
    let mut b = Vec::new();
    b.extend_from_slice(&(MULTI_OPS_MAX as u32 + 1).to_le_bytes());
    assert!(Request::decode(&h(Op::MultiGet, 0, 4), &b).unwrap_err().0.contains("limit"));
    // a key longer than the limit
    let long = vec![b'k'; KEY_BYTES_MAX + 1];
    assert!(Request::decode(&h(Op::Get, 0, long.len() as u32), &long).unwrap_err().0.contains("exceeds"));
    // a batched NOP, a batched GET with a value
    let mut f = Vec::new();
    Request::Batch(vec![BatchOp::Get(b"k")]).encode(0, &mut f);
    let (hd, body) = split(&f);
    let mut b = body.to_vec();
    b[4] = Op::Nop as u8;
    assert!(Request::decode(&hd, &b).unwrap_err().0.contains("cannot be batched"));
    let mut b = body.to_vec();
    b[5] = 1;
    assert!(Request::decode(&hd, &b).is_err());
}

#[test]
fn hellos() {
    let c = ClientHello::default();
    assert_eq!(ClientHello::decode(&c.encode()).unwrap(), c);
    assert_eq!(c.agree(), Some(VERSION));
    let future = ClientHello { min_version: VERSION + 1, max_version: VERSION + 3 };
    assert_eq!(ClientHello::decode(&future.encode()).unwrap().agree(), None);
    let mut bad = c.encode();
    bad[0] = b'X';
    assert!(ClientHello::decode(&bad).unwrap_err().0.contains("magic"));
    let mut bad = c.encode();
    bad[12] = 1;
    assert!(ClientHello::decode(&bad).is_err());
    let bad = ClientHello { min_version: 3, max_version: 2 }.encode();
    assert!(ClientHello::decode(&bad).is_err());
    let s = ServerHello {
        version: VERSION,
        status: Status::Ok,
        key_bytes_max: KEY_BYTES_MAX as u32,
        value_bytes_max: 1 << 20,
        frame_bytes_max: frame_bytes_max(1 << 20),
    };
    assert_eq!(ServerHello::decode(&s.encode()).unwrap(), s);
    let mut bad = s.encode();
    bad[6] = 200;
    assert!(ServerHello::decode(&bad).unwrap_err().0.contains("unknown status"));
}

#[test]
fn frame_limit_covers_the_largest_put() {
    for vmax in [0u32, 1 << 20, 64 << 20, VALUE_BYTES_LIMIT] {
        let f = frame_bytes_max(vmax);
        assert!(f >= FRAME_BYTES_FLOOR);
        assert!(f as u64 >= vmax as u64 + 4 + KEY_BYTES_MAX as u64);
    }
}

#[test]
fn status_codes_round_trip() {
    for b in 0..=255u8 {
        if let Ok(s) = Status::from_u8(b) {
            assert_eq!(s as u8, b);
            assert_eq!(s.is_error(), b >= 3);
        }
    }
    for b in 0..=255u8 {
        if let Ok(o) = Op::from_u8(b) {
            assert_eq!(o as u8, b);
        }
    }
}
