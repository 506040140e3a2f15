//! Codec tests: round trips of every request and response shape (in the
//! default namespace and in a named one), and decoders that reject (never
//! panic on) truncated, oversized, out-of-version and random input.

use super::*;
use proptest::prelude::*;

const BIG: u32 = u32::MAX;

fn split(frame: &[u8]) -> (Header, &[u8]) {
    let h = Header::decode(frame, BIG, VERSION).expect("header");
    (h, &frame[HEADER_BYTES..])
}

fn roundtrip(req: &Request) {
    roundtrip_in(b"", req);
    if req.op().names_namespace() {
        roundtrip_in(b"users", req);
        roundtrip_in(&[b'n'; NAMESPACE_NAME_MAX], req);
    }
}

fn roundtrip_in(ns: &[u8], req: &Request) {
    let mut f = Vec::new();
    req.encode_in(ns, 42, &mut f);
    assert_eq!(f.len(), HEADER_BYTES + ns.len() + req.body_len());
    let (h, body) = split(&f);
    assert_eq!((h.id, h.ns_len as usize), (42, ns.len()));
    assert_eq!(h.len as usize, body.len());
    assert_eq!(Request::decode(&h, body).expect("decode"), (ns, req.clone()));
    // A body shorter than its header says is rejected.
    for cut in 0..body.len() {
        assert!(Request::decode(&h, &body[..cut]).is_err(), "cut {cut} of {req:?}");
    }
    // In the default namespace a frame is the same in both versions; a
    // version 1 header decoder takes it if its opcode is version 1's.
    let v1 = Header::decode(&f, BIG, 1);
    assert_eq!(v1.is_ok(), ns.is_empty() && req.op().since() == 1, "{req:?} in {ns:?}");
    // A version 2 header decoder takes every frame but version 3's opcodes.
    let v2 = Header::decode(&f, BIG, 2);
    assert_eq!(v2.is_ok(), req.op().since() <= 2, "{req:?} in {ns:?}");
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

#[derive(Debug, Clone)]
struct OwnedTxnOp {
    ns: Vec<u8>,
    key: Vec<u8>,
    kind: u8,
    cas: u64,
    value: Vec<u8>,
}

fn txn_op() -> impl Strategy<Value = OwnedTxnOp> {
    let ns = prop_oneof![
        Just(Vec::new()),
        Just(b"users".to_vec()),
        Just(b"default".to_vec()),
        Just(vec![b'n'; NAMESPACE_NAME_MAX]),
    ];
    (ns, key(), 1u8..=6, any::<u64>(), val()).prop_map(|(ns, key, kind, cas, value)| OwnedTxnOp {
        ns,
        key,
        kind,
        cas: if matches!(kind, 4 | 6) { cas } else { 0 },
        value: if matches!(kind, 5 | 6) { Vec::new() } else { value },
    })
}

fn borrow_txn(o: &OwnedTxnOp) -> TxnOp<'_> {
    let write = match o.kind {
        1 => TxnWrite::Put(&o.value),
        2 => TxnWrite::PutAbsent(&o.value),
        3 => TxnWrite::PutPresent(&o.value),
        4 => TxnWrite::Cas { cas: o.cas, value: &o.value },
        6 => TxnWrite::DeleteCas(o.cas),
        _ => TxnWrite::Delete,
    };
    TxnOp { ns: &o.ns, key: &o.key, write }
}

fn ns_mode() -> impl Strategy<Value = NamespaceMode> {
    prop_oneof![Just(NamespaceMode::Cache), Just(NamespaceMode::Store)]
}

fn ns_kind() -> impl Strategy<Value = NamespaceKind> {
    prop_oneof![
        Just(NamespaceKind::Kv),
        (any::<u64>(), any::<u32>())
            .prop_map(|(size_bytes, block_bytes)| NamespaceKind::Block { size_bytes, block_bytes }),
    ]
}

fn ns_stats() -> impl Strategy<Value = NamespaceStats> {
    (
        "[a-zA-Z0-9_.-]{1,64}",
        any::<u32>(),
        (ns_mode(), any::<u32>(), any::<u64>(), any::<u64>(), ns_kind()),
        proptest::collection::vec(any::<u64>(), 9),
    )
        .prop_map(|(name, id, (mode, ttl, mb, mk, kind), n)| NamespaceStats {
            name,
            id,
            options: NamespaceOptions {
                mode,
                default_ttl_secs: ttl,
                max_bytes: NonZeroU64::new(mb),
                max_keys: NonZeroU64::new(mk),
                kind,
            },
            keys: n[0],
            value_bytes: n[1],
            gets: n[2],
            hits: n[3],
            misses: n[4],
            sets: n[5],
            deletes: n[6],
            evictions: n[7],
            expirations: n[8],
        })
}

proptest! {
    #[test]
    fn single_key_requests_round_trip(k in key(), v in val(), m in mode()) {
        roundtrip(&Request::Get(&k));
        roundtrip(&Request::Gets(&k));
        roundtrip(&Request::DeleteCas { key: &k, cas: v.len() as u64 * 0x0101_0101_0101 });
        roundtrip(&Request::Delete(&k));
        roundtrip(&Request::Put { key: &k, value: &v, mode: m });
    }

    #[test]
    fn namespace_requests_round_trip(
        m in ns_mode(),
        ttl in any::<u32>(),
        mb in any::<u64>(),
        mk in any::<u64>(),
        kind in ns_kind(),
    ) {
        let o = NamespaceOptions {
            mode: m,
            default_ttl_secs: ttl,
            max_bytes: NonZeroU64::new(mb),
            max_keys: NonZeroU64::new(mk),
            kind,
        };
        for r in [Request::NsCreate(o), Request::NsDrop, Request::NsTruncate, Request::NsList, Request::NsStats] {
            roundtrip(&r);
        }
    }

    #[test]
    fn namespace_stats_round_trip(list in proptest::collection::vec(ns_stats(), 0..10)) {
        let mut b = Vec::new();
        encode_namespace_list(&mut b, &list);
        prop_assert_eq!(&decode_namespace_list(&b).unwrap(), &list);
        for cut in 0..b.len() {
            prop_assert!(decode_namespace_list(&b[..cut]).is_err());
        }
        for s in &list {
            let mut b = Vec::new();
            encode_namespace_stats(&mut b, s);
            let export = if s.options.kind == NamespaceKind::Kv { 0 } else { NAMESPACE_EXPORT_BYTES };
            prop_assert_eq!(b.len(), NAMESPACE_STATS_BYTES + export + s.name.len());
            prop_assert_eq!(&decode_namespace_stats(&b).unwrap(), s);
            b.push(0);
            prop_assert!(decode_namespace_stats(&b).unwrap_err().0.contains("trailing"));
        }
    }

    #[test]
    fn multi_requests_round_trip(keys in proptest::collection::vec(key(), 0..20),
                                 ops in proptest::collection::vec(owned_op(), 0..20)) {
        let ks: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        roundtrip(&Request::MultiGet(ks));
        roundtrip(&Request::Batch(ops.iter().map(borrow).collect()));
    }

    #[test]
    fn txn_requests_and_outcomes_round_trip(ops in proptest::collection::vec(txn_op(), 0..20),
                                            cas in proptest::collection::vec(any::<u64>(), 0..40),
                                            failed in 0..TXN_OPS_MAX, exists in any::<bool>()) {
        let txn: Vec<TxnOp> = ops.iter().map(borrow_txn).collect();
        for (o, w) in txn.iter().zip(&ops) {
            prop_assert_eq!((o.write.kind(), o.write.value(), o.write.cas()), (w.kind, &w.value[..], w.cas));
        }
        roundtrip(&Request::Txn(txn));
        // Committed: a CAS value per operation.
        let c = TxnOutcome::Committed { cas };
        let mut b = Vec::new();
        prop_assert_eq!(c.encode(&mut b), Status::Ok);
        prop_assert_eq!(&TxnOutcome::decode(Status::Ok, &b).unwrap(), &c);
        for cut in 0..b.len() {
            prop_assert!(TxnOutcome::decode(Status::Ok, &b[..cut]).is_err());
        }
        b.push(0);
        prop_assert!(TxnOutcome::decode(Status::Ok, &b).unwrap_err().0.contains("trailing"));
        // A failed condition: which operation, and how.
        let status = if exists { Status::Exists } else { Status::NotFound };
        let f = TxnOutcome::ConditionFailed { op: failed, status };
        let mut b = Vec::new();
        prop_assert_eq!(f.encode(&mut b), status);
        prop_assert_eq!(b.len(), 4);
        prop_assert_eq!(&TxnOutcome::decode(status, &b).unwrap(), &f);
        prop_assert!(TxnOutcome::decode(status, &b[..3]).is_err());
    }

    #[test]
    fn entries_and_stats_round_trip(es in proptest::collection::vec((0u8..=17, val()), 0..20),
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
        // Make half of the cases plausible: a known opcode, a short
        // namespace name (or none), zero reserved bytes.
        if hb[15] & 1 == 0 {
            hb[4] = 1 + hb[4] % 13;
            hb[5] %= 3;
            hb[6] = if hb[14] & 1 == 0 { 0 } else { hb[6] % 8 };
            hb[7] = 0;
        }
        for version in [1, VERSION] {
            if let Ok(hd) = Header::decode(&hb, BIG, version) {
                if let Ok((ns, req)) = Request::decode(&hd, &body) {
                    let mut again = Vec::new();
                    req.encode_in(ns, hd.id, &mut again);
                    prop_assert_eq!(&again[..HEADER_BYTES], &hb[..]);
                    prop_assert_eq!(&again[HEADER_BYTES..], &body[..]);
                }
            }
        }
        let _ = decode_entries(&body);
        let _ = decode_stats(&body);
        let _ = decode_namespace_stats(&body);
        let _ = decode_namespace_list(&body);
        for s in [Status::Ok, Status::Exists, Status::NotFound, Status::Internal] {
            let _ = TxnOutcome::decode(s, &body);
        }
        let _ = Response::decode_header(&hb, BIG);
    }

    /// Fuzz: mutate one byte of a valid frame; decoding never panics.
    #[test]
    fn mutated_frames_never_panic(ops in proptest::collection::vec(owned_op(), 1..8), at in any::<usize>(), b in any::<u8>()) {
        let req = Request::Batch(ops.iter().map(borrow).collect());
        let mut f = Vec::new();
        req.encode_in(b"ns", 7, &mut f);
        let i = at % f.len();
        f[i] = b;
        if let Ok(h) = Header::decode(&f, BIG, VERSION) {
            let body = &f[HEADER_BYTES..];
            let _ = Request::decode(&h, &body[..body.len().min(h.len as usize)]);
        }
    }

    /// Fuzz: mutate one byte of a valid TXN; decoding never panics, and
    /// what still decodes re-encodes to the same bytes.
    #[test]
    fn mutated_txns_never_panic(ops in proptest::collection::vec(txn_op(), 1..8), at in any::<usize>(), b in any::<u8>()) {
        let req = Request::Txn(ops.iter().map(borrow_txn).collect());
        let mut f = Vec::new();
        req.encode(7, &mut f);
        let i = at % f.len();
        f[i] = b;
        if let Ok(h) = Header::decode(&f, BIG, VERSION) {
            let body = &f[HEADER_BYTES..];
            if let Ok((ns, r)) = Request::decode(&h, &body[..body.len().min(h.len as usize)]) {
                let mut again = Vec::new();
                r.encode_in(ns, h.id, &mut again);
                prop_assert_eq!(&again[..], &f[..again.len()]);
            }
        }
    }
}

#[test]
fn header_limits_and_reserved_bytes() {
    let mut f = Vec::new();
    Request::Get(b"k").encode(1, &mut f);
    for v in [1, VERSION] {
        assert!(Header::decode(&f, 1, v).is_ok());
        let e = Header::decode(&f, 0, v).unwrap_err();
        assert!(e.0.contains("exceeds the limit"), "{e}");
        let mut bad = f.clone();
        bad[7] = 1;
        assert!(Header::decode(&bad, BIG, v).unwrap_err().0.contains("reserved"));
        let mut bad = f.clone();
        bad[4] = 99;
        assert!(Header::decode(&bad, BIG, v).unwrap_err().0.contains("unknown opcode 99"));
        assert_eq!(Header::peek_id(&bad), 1);
        assert!(Header::decode(&f[..15], BIG, v).is_err());
    }
    // Byte 6 is reserved in version 1, the namespace name's length in 2.
    let mut ns = f.clone();
    ns[6] = 1;
    assert!(Header::decode(&ns, BIG, 1).unwrap_err().0.contains("reserved"));
    assert_eq!(Header::decode(&ns, BIG, 2).unwrap().ns_len, 1);
    ns[6] = NAMESPACE_NAME_MAX as u8 + 1;
    assert!(Header::decode(&ns, BIG, 2).unwrap_err().0.contains("exceeds 64"), "a name over the limit");
    // A response never names a namespace.
    let mut r = Vec::new();
    encode_response(&mut r, Op::Get, Status::Ok, 3, b"v");
    assert_eq!(Response::decode_header(&r, BIG).unwrap().1, Status::Ok);
    r[6] = 1;
    assert!(Response::decode_header(&r, BIG).unwrap_err().0.contains("reserved"));
}

#[test]
fn version_1_knows_no_namespace_opcodes() {
    for op in Op::ALL {
        let mut f = Vec::new();
        Header { len: 0, op, flags: 0, ns_len: 0, id: 9 }.encode(&mut f);
        assert!(Header::decode(&f, BIG, VERSION).is_ok());
        let v1 = Header::decode(&f, BIG, 1);
        let v2 = Header::decode(&f, BIG, 2);
        if (op as u8) < 8 {
            assert!(v1.is_ok(), "{op:?}");
        } else if (op as u8) < 14 {
            let e = v1.unwrap_err().0;
            assert!(e.contains("needs protocol version 2"), "{e}");
            assert_eq!(op.since(), 2);
            assert!(v2.is_ok(), "{op:?}");
        } else {
            assert_eq!(op.since(), 3);
            for e in [v1.unwrap_err().0, v2.unwrap_err().0] {
                assert!(e.contains("needs protocol version 3"), "{e}");
            }
        }
    }
}

/// GETS and DELETE_CAS (version 3): their layouts, and what their
/// decoders refuse.
#[test]
fn gets_and_delete_cas_are_as_documented() {
    let mut f = Vec::new();
    Request::DeleteCas { key: b"k", cas: 0x0102_0304_0506_0708 }.encode_in(b"ns", 3, &mut f);
    assert_eq!(f[4], 15);
    assert_eq!(&f[HEADER_BYTES..], b"ns\x08\x07\x06\x05\x04\x03\x02\x01k");
    let h = |op: Op, flags, len: usize| Header { len: len as u32, op, flags, ns_len: 0, id: 1 };
    // A CAS value shorter than 8 bytes, flags, an empty or oversized key.
    assert!(Request::decode(&h(Op::DeleteCas, 0, 7), &[0; 7]).unwrap_err().0.contains("overruns"));
    assert!(Request::decode(&h(Op::DeleteCas, 1, 9), &[0; 9]).unwrap_err().0.contains("flags"));
    assert!(Request::decode(&h(Op::Gets, 1, 1), b"k").unwrap_err().0.contains("flags"));
    assert_eq!(Request::decode(&h(Op::DeleteCas, 0, 8), &[0; 8]).unwrap().1, Request::DeleteCas { key: b"", cas: 0 });
    let long = vec![b'k'; KEY_BYTES_MAX + 1];
    assert!(Request::decode(&h(Op::Gets, 0, long.len()), &long).unwrap_err().0.contains("exceeds"));
    // The reply: cas, flags, expires, then the value.
    let info = ItemInfo { cas: 9, flags: 0xdead_beef, expires: 1_700_000_000 };
    let mut b = Vec::new();
    info.encode(&mut b);
    assert_eq!(b.len(), ITEM_INFO_BYTES);
    assert_eq!(&b[..12], &[9, 0, 0, 0, 0, 0, 0, 0, 0xef, 0xbe, 0xad, 0xde]);
    b.extend_from_slice(b"value");
    assert_eq!(ItemInfo::decode_reply(&b), Ok((info, &b"value"[..])));
    assert_eq!(ItemInfo::decode_reply(&b[..ITEM_INFO_BYTES]), Ok((info, &b""[..])));
    for cut in 0..ITEM_INFO_BYTES {
        assert!(ItemInfo::decode_reply(&b[..cut]).unwrap_err().0.contains("GETS response"));
    }
}

#[test]
fn namespace_requests_reject_bad_fields() {
    let h = |op, flags, ns_len: u8, len: usize| Header { len: len as u32, op, flags, ns_len, id: 0 };
    let create = |flags: u8, ns: &[u8], tail: usize| {
        let mut b = ns.to_vec();
        b.extend_from_slice(&[0u8; NS_CREATE_BYTES][..tail]);
        (h(Op::NsCreate, flags, ns.len() as u8, b.len()), b)
    };
    let (hd, b) = create(1, b"users", NS_CREATE_BYTES);
    let (ns, r) = Request::decode(&hd, &b).unwrap();
    assert_eq!(ns, b"users");
    assert_eq!(r, Request::NsCreate(NamespaceOptions { mode: NamespaceMode::Store, ..Default::default() }));
    // An unknown mode, a short or long body (past 20 bytes, a kind section
    // of 16 bytes must follow, and nothing after it).
    let (hd, b) = create(2, b"users", NS_CREATE_BYTES);
    assert!(Request::decode(&hd, &b).unwrap_err().0.contains("unknown namespace mode 2"));
    let (hd, b) = create(0, b"users", NS_CREATE_BYTES - 1);
    assert!(Request::decode(&hd, &b).unwrap_err().0.contains("overruns"));
    for (extra, why) in [(1, "overruns"), (NS_CREATE_KIND_BYTES, ""), (NS_CREATE_KIND_BYTES + 1, "trailing")] {
        let mut b = b"users".to_vec();
        b.extend_from_slice(&vec![0u8; NS_CREATE_BYTES + extra]);
        match Request::decode(&h(Op::NsCreate, 0, 5, b.len()), &b) {
            Ok((_, r)) => assert!(why.is_empty() && r == Request::NsCreate(NamespaceOptions::default()), "{r:?}"),
            Err(e) => assert!(!why.is_empty() && e.0.contains(why), "{extra}: {}", e.0),
        }
    }
    // A name longer than the body; flags on an NS_DROP; a body after the name.
    assert!(Request::decode(&h(Op::NsDrop, 0, 6, 5), b"users").unwrap_err().0.contains("overruns"));
    assert!(Request::decode(&h(Op::NsDrop, 1, 5, 5), b"users").unwrap_err().0.contains("flags"));
    for op in [Op::NsDrop, Op::NsTruncate, Op::NsStats] {
        assert_eq!(Request::decode(&h(op, 0, 5, 5), b"users").unwrap().0, b"users");
        assert!(Request::decode(&h(op, 0, 5, 6), b"usersx").unwrap_err().0.contains("trailing"), "{op:?}");
    }
    // NOP, STATS and NS_LIST name no namespace.
    for op in [Op::Nop, Op::Stats, Op::NsList] {
        assert!(Request::decode(&h(op, 0, 1, 1), b"x").unwrap_err().0.contains("names no namespace"), "{op:?}");
        assert!(Request::decode(&h(op, 0, 0, 0), b"").is_ok());
    }
    // A key request's name comes before its body.
    let mut f = Vec::new();
    Request::Put { key: b"k", value: b"v", mode: PutMode::Upsert }.encode_in(b"ns", 0, &mut f);
    let (hd, body) = split(&f);
    assert_eq!(&body[..2], b"ns");
    assert_eq!(Request::decode(&hd, body).unwrap().0, b"ns");
    let mut short = hd;
    short.ns_len = 3;
    assert!(Request::decode(&short, body).is_err(), "the name swallowed the key length");
}

/// NS_CREATE of a key space is the 20-byte body of peers without kinds;
/// an export's adds the 16-byte kind section, which decodes strictly.
#[test]
fn ns_create_carries_a_kind_section_only_for_an_export() {
    let frame = |o: NamespaceOptions| {
        let mut f = Vec::new();
        Request::NsCreate(o).encode_in(b"disk", 3, &mut f);
        f
    };
    let kv = frame(NamespaceOptions::default());
    assert_eq!(kv.len(), HEADER_BYTES + 4 + NS_CREATE_BYTES, "no section for a key space");
    let export = NamespaceOptions::export(1 << 30, 4096);
    assert_eq!(export.mode, NamespaceMode::Store);
    let f = frame(export);
    assert_eq!(f.len(), HEADER_BYTES + 4 + NS_CREATE_BYTES + NS_CREATE_KIND_BYTES);
    let at = HEADER_BYTES + 4 + NS_CREATE_BYTES;
    assert_eq!(f[at..at + 4], [1, 0, 0, 0]);
    assert_eq!(f[at + 4..at + 8], 4096u32.to_le_bytes());
    assert_eq!(f[at + 8..], (1u64 << 30).to_le_bytes());
    let (hd, body) = split(&f);
    assert_eq!(Request::decode(&hd, body).unwrap(), (&b"disk"[..], Request::NsCreate(export)));

    // The section's own rules: kind 0 with zeros is a key space; anything
    // else unknown or non-zero where it must be zero is malformed.
    let with = |section: &[u8]| {
        let mut b = b"disk".to_vec();
        b.extend_from_slice(&[0u8; NS_CREATE_BYTES]);
        b.extend_from_slice(section);
        let h = Header { len: b.len() as u32, op: Op::NsCreate, flags: 1, ns_len: 4, id: 0 };
        match Request::decode(&h, &b) {
            Ok((_, Request::NsCreate(o))) => Ok(o),
            Ok((_, r)) => panic!("{r:?}"),
            Err(e) => Err(e.0),
        }
    };
    let section = |kind: u8, reserved: u8, block: u32, size: u64| {
        let mut s = vec![kind, reserved, 0, 0];
        s.extend_from_slice(&block.to_le_bytes());
        s.extend_from_slice(&size.to_le_bytes());
        s
    };
    let store = NamespaceOptions { mode: NamespaceMode::Store, ..Default::default() };
    assert_eq!(with(&section(0, 0, 0, 0)).unwrap(), store);
    let odd = NamespaceKind::Block { size_bytes: 7, block_bytes: 3 };
    assert_eq!(with(&section(1, 0, 3, 7)).unwrap(), NamespaceOptions { kind: odd, ..store });
    assert!(with(&section(0, 0, 4096, 0)).unwrap_err().contains("for kind 0"));
    assert!(with(&section(2, 0, 4096, 4096)).unwrap_err().contains("unknown namespace kind 2"));
    assert!(with(&section(1, 1, 4096, 4096)).unwrap_err().contains("reserved"));
    let s = section(1, 0, 4096, 4096);
    assert!(with(&s[..NS_CREATE_KIND_BYTES - 1]).unwrap_err().contains("overruns"));
    let mut long = s.clone();
    long.push(0);
    assert!(with(&long).unwrap_err().contains("trailing"));
}

#[test]
fn namespace_stats_reject_bad_records() {
    let s = NamespaceStats { name: "users".into(), id: 4, keys: 9, ..Default::default() };
    let mut b = Vec::new();
    encode_namespace_stats(&mut b, &s);
    assert_eq!(decode_namespace_stats(&b).unwrap(), s);
    let bad = |at: usize, v: u8| {
        let mut x = b.clone();
        x[at] = v;
        decode_namespace_stats(&x).unwrap_err().0
    };
    assert!(bad(0, 0).contains("name of 0 bytes"));
    assert!(bad(0, 65).contains("name of 65 bytes"));
    assert!(bad(1, 2).contains("unknown namespace mode 2"));
    assert!(bad(2, 2).contains("unknown namespace kind 2"));
    assert!(bad(3, 1).contains("reserved"));
    // Kind 1 claimed by a record without its export section: the name is
    // too short to hold it.
    assert!(bad(2, 1).contains("overruns"), "{}", bad(2, 1));
    assert!(bad(NAMESPACE_STATS_BYTES, 0xff).contains("UTF-8"));
    // A list claiming more records than its bytes hold, or than a server has.
    let mut l = Vec::new();
    l.extend_from_slice(&2u32.to_le_bytes());
    l.extend_from_slice(&b);
    assert!(decode_namespace_list(&l).unwrap_err().0.contains("overrun"));
    let mut l = Vec::new();
    l.extend_from_slice(&(NAMESPACES_MAX as u32 + 2).to_le_bytes());
    assert!(decode_namespace_list(&l).unwrap_err().0.contains("limit"));
}

#[test]
fn requests_reject_bad_fields() {
    let h = |op, flags, len| Header { len, op, flags, ns_len: 0, id: 0 };
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
    assert_eq!((c.min_version, c.max_version), (1, 3));
    assert_eq!(c.agree(), Some(VERSION));
    let future = ClientHello { min_version: VERSION + 1, max_version: VERSION + 3 };
    assert_eq!(ClientHello::decode(&future.encode()).unwrap().agree(), None);
    // The highest version both speak.
    let agree = |min, max| ClientHello { min_version: min, max_version: max }.agree();
    assert_eq!(agree(1, 1), Some(1));
    assert_eq!(agree(1, 2), Some(2));
    assert_eq!(agree(2, 2), Some(2));
    assert_eq!(agree(1, 3), Some(3));
    assert_eq!(agree(1, 9), Some(3));
    assert_eq!(agree(2, 9), Some(3));
    assert_eq!(agree(3, 9), Some(3));
    assert_eq!(agree(4, 9), None);
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
    // Limits no server announces (a client reserved a response's body of
    // up to the frame limit from its header alone).
    for bad in [
        ServerHello { frame_bytes_max: u32::MAX, ..s },
        ServerHello { frame_bytes_max: FRAME_BYTES_FLOOR - 1, ..s },
        ServerHello { value_bytes_max: VALUE_BYTES_LIMIT + 1, ..s },
        ServerHello { key_bytes_max: KEY_BYTES_MAX as u32 + 1, ..s },
    ] {
        assert!(ServerHello::decode(&bad.encode()).unwrap_err().0.contains("limits"), "{bad:?}");
    }
    let most =
        ServerHello { value_bytes_max: VALUE_BYTES_LIMIT, frame_bytes_max: frame_bytes_max(VALUE_BYTES_LIMIT), ..s };
    assert_eq!(ServerHello::decode(&most.encode()).unwrap(), most);
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
fn a_hello_carries_a_token_length_only_when_flagged() {
    let c = ClientHello::default();
    assert_eq!(ClientHello::decode_with_token(&c.encode()).unwrap(), (c, 0));
    let t = c.encode_with_token(5);
    assert_eq!(ClientHello::decode_with_token(&t).unwrap(), (c, 5));
    assert_eq!(t[8], HELLO_FLAG_TOKEN);
    // A server without tokens (decode) refuses it as it refused any
    // reserved byte before tokens existed.
    assert!(ClientHello::decode(&t).is_err());
    let max = c.encode_with_token(HELLO_TOKEN_BYTES_MAX);
    assert_eq!(ClientHello::decode_with_token(&max).unwrap().1, HELLO_TOKEN_BYTES_MAX);
    let mut zero = t;
    zero[10..12].copy_from_slice(&0u16.to_le_bytes());
    assert!(ClientHello::decode_with_token(&zero).unwrap_err().0.contains("token of 0 bytes"));
    let mut long = t;
    long[10..12].copy_from_slice(&1025u16.to_le_bytes());
    assert!(ClientHello::decode_with_token(&long).is_err());
    let mut len_without_flag = c.encode();
    len_without_flag[10] = 3;
    assert!(ClientHello::decode_with_token(&len_without_flag).is_err());
    let mut other_flag = t;
    other_flag[8] = 2;
    assert!(ClientHello::decode_with_token(&other_flag).is_err());
}

#[test]
fn status_codes_round_trip() {
    for b in 0..=255u8 {
        if let Ok(s) = Status::from_u8(b) {
            assert_eq!(s as u8, b);
            assert_eq!(s.is_error(), b >= 3);
            assert_eq!(s.since(), if b >= 14 && s != Status::Unauthorized { 2 } else { 1 });
        }
    }
    assert_eq!(Status::from_u8(18), Ok(Status::BadBatch));
    assert!(Status::BadBatch.is_error());
    assert_eq!(Status::from_u8(19), Ok(Status::Unauthorized));
    assert!(Status::from_u8(20).is_err());
    for b in 0..=255u8 {
        if let Ok(o) = Op::from_u8(b) {
            assert_eq!(o as u8, b);
            assert_eq!(Op::ALL[b as usize - 1], o);
        }
    }
}

/// A TXN body: `count`, then each operation's 20 bytes and its name, key
/// and value.
/// (kind, namespace, key, cas, value) of one TXN operation.
type RawTxnOp<'a> = (u8, &'a [u8], &'a [u8], u64, &'a [u8]);

fn txn_body(ops: &[RawTxnOp]) -> Vec<u8> {
    let mut b = (ops.len() as u32).to_le_bytes().to_vec();
    for (kind, ns, key, cas, value) in ops {
        b.extend_from_slice(&[*kind, ns.len() as u8, 0, 0]);
        b.extend_from_slice(&(key.len() as u32).to_le_bytes());
        b.extend_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(&cas.to_le_bytes());
        b.extend_from_slice(ns);
        b.extend_from_slice(key);
        b.extend_from_slice(value);
    }
    b
}

#[test]
fn txn_layout_is_as_documented() {
    let req = Request::Txn(vec![TxnOp::cas("users", b"k", 0x0102, b"v"), TxnOp::delete("", b"d")]);
    let mut f = Vec::new();
    req.encode(9, &mut f);
    let mut want = Vec::new();
    Header { len: (4 + 20 + 5 + 1 + 1 + 20 + 1) as u32, op: Op::Txn, flags: 0, ns_len: 0, id: 9 }.encode(&mut want);
    assert_eq!(want[4], 13, "TXN is opcode 13");
    want.extend_from_slice(&txn_body(&[(4, b"users", b"k", 0x0102, b"v"), (5, b"", b"d", 0, b"")]));
    assert_eq!(f, want);
    // Byte for byte, the example of docs/PROTOCOL.md, "Transactions".
    let doc = "34 00 00 00 0d 00 00 00 09 00 00 00 00 00 00 00 02 00 00 00 \
               04 05 00 00 01 00 00 00 01 00 00 00 02 01 00 00 00 00 00 00 75 73 65 72 73 6b 76 \
               05 00 00 00 01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 64";
    let doc: Vec<u8> = doc.split_whitespace().map(|h| u8::from_str_radix(h, 16).unwrap()).collect();
    assert_eq!(f, doc);
    let (h, body) = split(&f);
    assert_eq!(Request::decode(&h, body).unwrap(), (&b""[..], req));
    // A committed TXN's body: count, then a CAS value per operation.
    let mut b = Vec::new();
    assert_eq!(TxnOutcome::Committed { cas: vec![7, 0] }.encode(&mut b), Status::Ok);
    assert_eq!(b, [2, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn malformed_txns_are_rejected() {
    let h = |flags: u8, ns_len: u8, len: usize| Header { len: len as u32, op: Op::Txn, flags, ns_len, id: 0 };
    fn decode(body: &[u8]) -> Result<Request<'_>, ProtoError> {
        let h = Header { len: body.len() as u32, op: Op::Txn, flags: 0, ns_len: 0, id: 0 };
        Request::decode(&h, body).map(|(_, r)| r)
    }
    let bad = |body: &[u8]| decode(body).unwrap_err().0;
    let ok = txn_body(&[(1, b"users", b"k", 0, b"v")]);
    assert_eq!(decode(&ok).unwrap(), Request::Txn(vec![TxnOp::put("users", b"k", b"v")]));
    assert_eq!(decode(&txn_body(&[])).unwrap(), Request::Txn(vec![]), "an empty TXN is well formed");
    // Flags; a namespace named by the frame (each operation names its own).
    assert!(Request::decode(&h(1, 0, ok.len()), &ok).unwrap_err().0.contains("flags"));
    let mut named = b"users".to_vec();
    named.extend_from_slice(&ok);
    assert!(Request::decode(&h(0, 5, named.len()), &named).unwrap_err().0.contains("TXN: names no namespace"));
    // Unknown kinds; a delete with a value; a CAS value on another kind.
    for kind in [0u8, 7, 255] {
        let e = bad(&txn_body(&[(kind, b"", b"k", 0, b"v")]));
        assert!(e.contains(&format!("operation 0: unknown kind {kind}")), "{e}");
    }
    assert!(bad(&txn_body(&[(5, b"", b"k", 0, b"v")])).contains("a delete with a value"));
    assert!(bad(&txn_body(&[(6, b"", b"k", 0, b"v")])).contains("a delete_cas with a value"));
    for kind in [1u8, 2, 3, 5] {
        let e = bad(&txn_body(&[(1, b"", b"a", 0, b""), (kind, b"", b"k", 1, b"")]));
        assert!(e.contains("operation 1: a CAS value on a"), "{e}");
    }
    // Reserved bytes; a namespace name over the limit; a key over the limit.
    let mut b = ok.clone();
    b[4 + 2] = 1;
    assert!(bad(&b).contains("reserved"));
    let long = [b'n'; NAMESPACE_NAME_MAX + 1];
    assert!(bad(&txn_body(&[(1, &long, b"k", 0, b"v")])).contains("namespace name of 65 bytes exceeds 64"));
    let key = vec![b'k'; KEY_BYTES_MAX + 1];
    assert!(bad(&txn_body(&[(1, b"", &key, 0, b"v")])).contains("exceeds"));
    // Lengths overrunning the frame; a count overrunning it or over the
    // limit; trailing bytes.
    for cut in 0..ok.len() {
        assert!(decode(&ok[..cut]).is_err(), "cut {cut}");
    }
    let mut b = ok.clone();
    b[4 + 4..4 + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(bad(&b).contains("overruns"));
    let mut b = ok.clone();
    b[..4].copy_from_slice(&2u32.to_le_bytes());
    assert!(bad(&b).contains("overrun"));
    let mut b = (TXN_OPS_MAX as u32 + 1).to_le_bytes().to_vec();
    b.resize(4 + (TXN_OPS_MAX + 1) * TXN_OP_BYTES, 0);
    assert!(bad(&b).contains("exceed the limit of 1024"));
    let mut b = ok.clone();
    b.push(0);
    assert!(bad(&b).contains("trailing"));
    // TXN is version 2's: a version 1 header decoder does not know it.
    let mut f = Vec::new();
    Request::Txn(vec![]).encode(3, &mut f);
    assert!(Header::decode(&f, BIG, 1).unwrap_err().0.contains("opcode 13 (TXN) needs protocol version 2"));
    // Responses: a status with no outcome, an operation past the limit.
    assert!(TxnOutcome::decode(Status::Internal, b"").unwrap_err().0.contains("no outcome"));
    assert!(TxnOutcome::decode(Status::Exists, &(TXN_OPS_MAX as u32).to_le_bytes()).is_err());
    let mut b = (TXN_OPS_MAX as u32 + 1).to_le_bytes().to_vec();
    b.resize(4 + (TXN_OPS_MAX + 1) * 8, 0);
    assert!(TxnOutcome::decode(Status::Ok, &b).unwrap_err().0.contains("limit"));
}

/// A TXN's delete_cas (kind 6, version 3): its layout, what its decoder
/// refuses, and the version a request of one needs.
#[test]
fn txn_delete_cas_is_as_documented() {
    let ops = vec![TxnOp::delete_cas("users", b"k", 0x0102), TxnOp::delete("", b"d")];
    let req = Request::Txn(ops.clone());
    let mut f = Vec::new();
    req.encode(9, &mut f);
    let body = &f[HEADER_BYTES..];
    assert_eq!(&body[..4], &[2, 0, 0, 0]);
    assert_eq!(&body[4..24], &[6, 5, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&body[24..30], b"usersk");
    let h = Header { len: body.len() as u32, op: Op::Txn, flags: 0, ns_len: 0, id: 9 };
    assert_eq!(Request::decode(&h, body).unwrap().1, req);
    // A value on a delete_cas; a CAS value of 0 is a CAS value.
    let mut b = body.to_vec();
    b[12] = 1;
    b.insert(30, b'v');
    let h1 = Header { len: b.len() as u32, ..h };
    assert!(Request::decode(&h1, &b).unwrap_err().0.contains("a delete_cas with a value"));
    let zero = Request::Txn(vec![TxnOp::delete_cas("", b"k", 0)]);
    roundtrip(&zero);
    // Version 3's, while a TXN of the other kinds is version 2's.
    assert_eq!((req.since(), Request::Txn(vec![ops[1]]).since(), Request::Txn(vec![]).since()), (3, 2, 2));
    assert_eq!(req.check_version(3), Ok(()));
    for v in [1, 2] {
        let e = Request::Txn(vec![ops[1], ops[0]]).check_version(v).unwrap_err().0;
        let want = if v == 1 {
            "opcode 13 (TXN) needs protocol version 2"
        } else {
            "TXN: operation 1: kind 6 (delete_cas) needs protocol version 3"
        };
        assert_eq!(e, want);
    }
    assert_eq!(Request::Gets(b"k").check_version(2).unwrap_err().0, "opcode 14 (GETS) needs protocol version 3");
}
