//! Seed inputs for every target, built from the real encoders (and, for
//! the text protocols, written as clients send them), so a seed stays a
//! valid input when a format changes. `fuzz/corpus/<target>/seed-<name>`
//! holds them; the `seeds_are_committed` test checks that the committed
//! files are these bytes (`GRANARY_FUZZ_WRITE_SEEDS=1` rewrites them).
//!
//! Invariant: every seed is small (a corpus stays a few KiB per target).

use granary_format::checkpoint::{Item, Manifest, ITEM_BYTES};
use granary_format::hash::KEY_HASH_ALGO_XXH3_64;
use granary_format::limits::{SEGMENT_HEADER_BYTES, SUPERBLOCK_BYTES};
use granary_format::segment::Stream;
use granary_format::superblock::{FLAG_NAMESPACES, SUPERBLOCK_VERSION};
use granary_format::{batch, RecordHeader, SegmentHeader, SegmentKind, Superblock};
use granary_memcache::fuzzing::binary_request;
use granary_nbd::proto as nbd;
use granary_proto::{self as proto, BatchOp, ClientHello, NamespaceOptions, PutMode, Request, TxnOp};

/// One seed: its target, its name (the file is `seed-<name>`), its bytes.
pub struct Seed {
    pub target: &'static str,
    pub name: String,
    pub bytes: Vec<u8>,
}

/// Every seed of every target.
pub fn all() -> Vec<Seed> {
    let mut v = Vec::new();
    let mut add = |target: &'static str, name: &str, bytes: Vec<u8>| {
        v.push(Seed { target, name: name.to_string(), bytes });
    };
    for (name, b) in memcache_text() {
        add("memcache_text", name, b);
    }
    for (name, b) in memcache_binary() {
        add("memcache_binary", name, b);
    }
    for (name, b) in native_frames() {
        add("native_frames", name, b);
    }
    for (name, b) in native_replies() {
        add("native_replies", name, b);
    }
    for (name, b) in resp() {
        add("resp", name, b);
    }
    for (name, b) in nbd_handshake() {
        add("nbd_handshake", name, b);
    }
    for (name, b) in nbd_requests() {
        add("nbd_requests", name, b);
    }
    for (name, b) in records() {
        add("record", name, b);
    }
    add("segment_header", "kv", fixed(segment()));
    let mut index = segment_header(SegmentKind::Index, Stream::User);
    index.alloc_seq = 7;
    add("segment_header", "index", fixed(encode_segment(&index)));
    let entries = [
        granary_format::summary::Entry { grain: 1, key: b"a" },
        granary_format::summary::Entry { grain: 5, key: b"key" },
    ];
    add("summary", "two", [&[0u8][..], &granary_format::summary::encode(0, 7, 40, &entries, 512)].concat());
    add("summary", "empty", fixed(granary_format::summary::encode(0, 7, 1, &[], 512)));
    for (name, b) in superblocks() {
        add("superblock", name, fixed(b));
    }
    for (name, b) in stripe_labels() {
        add("stripe_label", name, fixed(b));
    }
    for (name, b) in checkpoints() {
        add("checkpoint", name, fixed(b));
    }
    let (catalogs, totals) = granary_store::fuzzing::seeds();
    for (name, b) in catalogs {
        add("catalog", &format!("catalog-{name}"), [&[0u8][..], &b].concat());
    }
    for (name, b) in totals {
        add("catalog", &format!("totals-{name}"), [&[1u8][..], &b].concat());
    }
    for (name, b) in config_toml() {
        add("config_toml", name, b.into());
    }
    v
}

/// A format target's input: the "fix the checksum" choice, then `b`.
fn fixed(b: Vec<u8>) -> Vec<u8> {
    [&[1u8][..], &b].concat()
}

fn memcache_text() -> Vec<(&'static str, Vec<u8>)> {
    let s = |name, text: &str| (name, text.as_bytes().to_vec());
    vec![
        s("storage", "set k 0 0 5\r\nhello\r\nadd k2 5 100 1 noreply\r\nx\r\ncas k 0 0 2 7\r\nhi\r\n"),
        s("concat", "append k 0 0 1\r\na\r\nprepend k 0 0 1\r\nb\r\nreplace k 1 2 0\r\n\r\n"),
        s("retrieval", "get k\r\ngets a b c\r\ngat 10 k\r\ngats 0 k k2\r\n"),
        s("other", "delete k\r\nincr n 5\r\ndecr n 1 noreply\r\ntouch k 10\r\nflush_all 0\r\nversion\r\n"),
        s(
            "admin",
            "verbosity 1\r\nstats\r\nstats items\r\nstats cachedump 1 10\r\nlru_crawler metadump all\r\nquit\r\n",
        ),
        s("meta", "ms k 5 T10 F3 c\r\nhello\r\nmg k v f t c k O123 q\r\nma n N0 J5 D2 MI\r\nmd k q\r\nmn\r\n"),
        s("meta-b64", "mg a2V5 b v\r\nms a2V5 2 b MS\r\nhi\r\nme k\r\n"),
        s("bad", "get\r\nset k 0 0 -1\r\nbogus\r\nms k 2 Mz\r\nxx\r\nincr k x\r\n\r\n"),
    ]
}

/// Each after the target's choice byte (0: the default item limit; 1:
/// the small one).
fn memcache_binary() -> Vec<(&'static str, Vec<u8>)> {
    let store = [0, 0, 0, 1, 0, 0, 0, 0];
    let arith = [0u8; 20];
    let seeds = vec![
        ("get", [binary_request(0x00, &[], b"k", &[]), binary_request(0x0c, &[], b"k", &[])].concat()),
        ("set", [binary_request(0x01, &store, b"k", b"hello"), binary_request(0x11, &store, b"q", b"v")].concat()),
        ("delete", binary_request(0x04, &[], b"k", &[])),
        ("incr", [binary_request(0x05, &arith, b"n", &[]), binary_request(0x06, &arith, b"n", &[])].concat()),
        ("misc", [binary_request(0x0a, &[], &[], &[]), binary_request(0x0b, &[], &[], &[])].concat()),
        ("append", binary_request(0x0e, &[], b"k", b"tail")),
        ("touch", binary_request(0x1c, &[0, 0, 0, 9], b"k", &[])),
        ("unknown", binary_request(0x7f, &[], b"k", b"v")),
    ];
    let mut seeds: Vec<_> = seeds.into_iter().map(|(n, b)| (n, [&[0u8][..], &b].concat())).collect();
    let too_large = [binary_request(0x01, &store, b"k", &[7; 100]), binary_request(0x00, &[], b"k", &[])].concat();
    seeds.push(("too-large", [&[1u8][..], &too_large].concat()));
    seeds
}

/// Frames of `reqs` in namespace `ns` after the target's choice byte (0)
/// and a client hello.
fn native(ns: &[u8], reqs: &[Request<'_>]) -> Vec<u8> {
    let mut b = vec![0u8];
    b.extend_from_slice(&ClientHello::default().encode());
    for (id, r) in reqs.iter().enumerate() {
        let names = r.op().names_namespace();
        r.encode_in(if names { ns } else { b"" }, id as u64 + 1, &mut b);
    }
    b
}

fn native_frames() -> Vec<(&'static str, Vec<u8>)> {
    let put = |key, value| Request::Put { key, value, mode: PutMode::Upsert };
    let batch = Request::Batch(vec![
        BatchOp::Get(b"a"),
        BatchOp::Put { key: b"b", value: b"2", mode: PutMode::CreateOnly },
        BatchOp::Delete(b"c"),
    ]);
    let txn =
        Request::Txn(vec![TxnOp::put("default", b"a", b"1"), TxnOp::cas("", b"b", 9, b"2"), TxnOp::delete("", b"c")]);
    vec![
        ("kv", native(b"", &[put(b"k", b"hello"), Request::Get(b"k"), Request::Delete(b"k"), Request::Nop])),
        ("multi", native(b"", &[Request::MultiGet(vec![b"a", b"b"]), batch, Request::Stats])),
        ("txn", native(b"", &[txn])),
        (
            "namespaces",
            native(
                b"users",
                &[
                    Request::NsCreate(NamespaceOptions::default()),
                    put(b"k", b"v"),
                    Request::NsStats,
                    Request::NsList,
                    Request::NsTruncate,
                    Request::NsDrop,
                ],
            ),
        ),
        ("export", native(b"disk", &[Request::NsCreate(NamespaceOptions::export(1 << 20, 4096))])),
        ("cas", native(b"users", &[Request::Gets(b"k"), Request::DeleteCas { key: b"k", cas: 0x0102_0304_0506_0708 }])),
        ("txn-delete-cas", native(b"", &[Request::Txn(vec![TxnOp::delete_cas("users", b"k", 0x0102_0304_0506_0708)])])),
        ("token", {
            // A hello with a token, and the large value limit.
            let mut b = vec![2u8];
            b.extend_from_slice(&ClientHello::default().encode_with_token(5));
            b.extend_from_slice(b"s3cre");
            Request::Get(b"k").encode_in(b"", 1, &mut b);
            b
        }),
    ]
}

fn native_replies() -> Vec<(&'static str, Vec<u8>)> {
    let mut entries = Vec::new();
    proto::encode_count(&mut entries, 2);
    proto::encode_entry(&mut entries, proto::Status::Ok, b"value");
    proto::encode_entry(&mut entries, proto::Status::NotFound, b"");
    let mut stats = Vec::new();
    proto::encode_stats(&mut stats, &[("keys".into(), "3".into()), ("version".into(), "0.1.0".into())]);
    let ns = proto::NamespaceStats { name: "users".into(), keys: 4, ..Default::default() };
    let mut one = Vec::new();
    proto::encode_namespace_stats(&mut one, &ns);
    let mut list = Vec::new();
    proto::encode_namespace_list(&mut list, &[ns.clone(), proto::NamespaceStats { name: "b".into(), ..ns }]);
    let mut txn = Vec::new();
    proto::TxnOutcome::Committed { cas: vec![5, 6] }.encode(&mut txn);
    let hello = proto::ServerHello {
        version: proto::VERSION,
        status: proto::Status::Ok,
        key_bytes_max: 65536,
        value_bytes_max: 1 << 20,
        frame_bytes_max: proto::FRAME_BYTES_FLOOR,
    };
    let mut response = Vec::new();
    proto::encode_response(&mut response, proto::Op::Get, proto::Status::Ok, 7, b"value");
    let mut gets = Vec::new();
    proto::ItemInfo { cas: 9, flags: 3, expires: 1_700_000_000 }.encode(&mut gets);
    gets.extend_from_slice(b"value");
    vec![
        ("entries", [&[0u8][..], &entries].concat()),
        ("stats", [&[1u8][..], &stats].concat()),
        ("ns-stats", [&[2u8][..], &one].concat()),
        ("ns-list", [&[3u8][..], &list].concat()),
        ("txn", [&[4u8][..], &txn].concat()),
        ("hello", [&[1u8][..], &hello.encode()[..]].concat()),
        ("response", [&[0u8][..], &response].concat()),
        ("gets", [&[0u8][..], &gets].concat()),
    ]
}

fn resp() -> Vec<(&'static str, Vec<u8>)> {
    let s = |name, text: &str| (name, text.as_bytes().to_vec());
    vec![
        s("multibulk", "\x00*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"),
        s("inline", "\x00PING\r\nSET k \"a\\x41\\n\" EX 10\r\nGET 'k'\r\n"),
        s("pipeline", "\x02*1\r\n$4\r\nPING\r\n*0\r\n\r\n*-1\r\n*2\r\n$4\r\nINCR\r\n$1\r\nn\r\n"),
        s("errors", "\x01*2\r\n$3\r\nGET\r\n$99\r\nk\r\n"),
        s("bad", "\x00*1\r\n:1\r\n"),
    ]
}

/// An NBD option: IHAVEOPT, option, data.
fn option(opt: u32, data: &[u8]) -> Vec<u8> {
    let mut b = nbd::IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    [b, data.to_vec()].concat()
}

/// `NBD_OPT_INFO`/`NBD_OPT_GO` data: the name and the information asked.
fn info(name: &str, asked: &[u16]) -> Vec<u8> {
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&(asked.len() as u16).to_be_bytes());
    for a in asked {
        b.extend_from_slice(&a.to_be_bytes());
    }
    b
}

fn nbd_handshake() -> Vec<(&'static str, Vec<u8>)> {
    let flags = (nbd::FLAG_C_FIXED_NEWSTYLE | nbd::FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
    let go = info("disk", &[nbd::INFO_NAME, nbd::INFO_DESCRIPTION, nbd::INFO_BLOCK_SIZE]);
    vec![
        ("go", [flags.clone(), option(nbd::OPT_GO, &go)].concat()),
        (
            "list-info",
            [
                flags.clone(),
                option(nbd::OPT_LIST, &[]),
                option(nbd::OPT_INFO, &info("", &[])),
                option(nbd::OPT_INFO, &info("odd", &[nbd::INFO_BLOCK_SIZE])),
                option(nbd::OPT_STRUCTURED_REPLY, &[]),
                option(nbd::OPT_GO, &info("missing", &[])),
            ]
            .concat(),
        ),
        ("export-name", [flags.clone(), option(nbd::OPT_EXPORT_NAME, b"disk")].concat()),
        ("abort", [flags, option(nbd::OPT_ABORT, &[])].concat()),
    ]
}

/// An NBD request header.
fn nbd_request(kind: u16, flags: u16, offset: u64, len: u32) -> Vec<u8> {
    nbd::Request { magic: nbd::REQUEST_MAGIC, flags, kind, cookie: 1, offset, len }.encode().to_vec()
}

fn nbd_requests() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "read-write",
            [
                vec![2u8],
                nbd_request(nbd::CMD_WRITE, 0, 4096, 5),
                b"hello".to_vec(),
                nbd_request(nbd::CMD_READ, 0, 4000, 200),
                nbd_request(nbd::CMD_FLUSH, 0, 0, 0),
                nbd_request(nbd::CMD_DISC, 0, 0, 0),
            ]
            .concat(),
        ),
        (
            "trim-zero",
            [
                vec![6u8],
                nbd_request(nbd::CMD_TRIM, 0, 0, 8192),
                nbd_request(nbd::CMD_WRITE_ZEROES, nbd::CMD_FLAG_FUA | nbd::CMD_FLAG_NO_HOLE, 512, 10000),
                nbd_request(nbd::CMD_CACHE, 0, 0, 4096),
            ]
            .concat(),
        ),
        (
            "aligned",
            [vec![14u8], nbd_request(nbd::CMD_READ, 0, 1000, 24), nbd_request(nbd::CMD_READ, 0, 0, 4096)].concat(),
        ),
        ("past-end", [vec![1u8], nbd_request(nbd::CMD_WRITE, 0, 4000, 200), vec![7; 200]].concat()),
    ]
}

fn records() -> Vec<(&'static str, Vec<u8>)> {
    let enc = |h: RecordHeader, key: &[u8], value: &[u8]| {
        let mut out = vec![0u8; h.record_bytes() as usize];
        h.encode(0, key, value, &mut out);
        fixed(out)
    };
    let value = RecordHeader::value(3, 5, 42, 7).with_meta(9, 1_700_000_000);
    let cas = RecordHeader::value(1, 12, 43, 7).with_explicit_cas().with_supersedes(true);
    let batch = RecordHeader::value(2, 1, 44, 7).in_batch().with_stale(true);
    vec![
        ("value", enc(value, b"key", b"hello")),
        ("cas", enc(cas, b"k", b"\x05\0\0\0\0\0\0\0abcd")),
        ("batch", enc(batch, b"kk", b"x")),
        ("tombstone", enc(RecordHeader::tombstone(3, 45, 7, 6), b"key", b"")),
    ]
}

fn segment_header(kind: SegmentKind, stream: Stream) -> SegmentHeader {
    SegmentHeader {
        kind,
        stream,
        alloc_seq: 3,
        uuid: [7; 16],
        grain_bytes: 4096,
        segment_index: 1,
        segment_bytes: 1 << 20,
        first_seq: 100,
    }
}

fn encode_segment(h: &SegmentHeader) -> Vec<u8> {
    let mut b = vec![0u8; SEGMENT_HEADER_BYTES];
    h.encode(&mut b);
    b
}

fn segment() -> Vec<u8> {
    encode_segment(&segment_header(SegmentKind::Kv, Stream::Relocation))
}

/// The labels of a stripe set's first and last members, as
/// `StripedDevice::create` writes them (its set id is random: fixed here
/// afterwards, with the checksum, so the seeds stay the same bytes).
fn stripe_labels() -> Vec<(&'static str, Vec<u8>)> {
    use granary_store::io::{AlignedBuf, Device, MemDevice, StripedDevice};
    use std::sync::Arc;
    let members: Vec<Arc<dyn Device>> = (0..3).map(|_| Arc::new(MemDevice::new(1 << 20)) as Arc<dyn Device>).collect();
    StripedDevice::create(members.clone(), 64 << 10).expect("a stripe set");
    [("first", 0), ("last", 2)]
        .into_iter()
        .map(|(name, i)| {
            let (buf, r) = members[i].read_at(AlignedBuf::zeroed(4096), 0);
            r.expect("a label");
            let mut b = buf[..44].to_vec();
            b[24..32].copy_from_slice(&0x5eed_u64.to_le_bytes());
            let crc = granary_format::checksum::crc32c(&b[..40]);
            b[40..44].copy_from_slice(&crc.to_le_bytes());
            (name, b)
        })
        .collect()
}

fn superblocks() -> Vec<(&'static str, Vec<u8>)> {
    let sb = Superblock {
        version: SUPERBLOCK_VERSION,
        flags: FLAG_NAMESPACES,
        uuid: [9; 16],
        grain_bytes: 4096,
        hash_algo: KEY_HASH_ALGO_XXH3_64,
        hash_seed: 0,
        segment_bytes: 1 << 20,
        segment_count: 62,
        device_bytes: 64 << 20,
        index_table_homes: 1024,
        created_unix_ms: 1_700_000_000_000,
    };
    let v1 = Superblock { version: 1, flags: 0, grain_bytes: 512, segment_bytes: 64 << 10, ..sb.clone() };
    [("v2", sb), ("v1", v1)]
        .into_iter()
        .map(|(name, sb)| {
            let mut b = vec![0u8; SUPERBLOCK_BYTES];
            sb.encode(&mut b);
            (name, b)
        })
        .collect()
}

fn checkpoints() -> Vec<(&'static str, Vec<u8>)> {
    let m = Manifest {
        clean: true,
        id: 4,
        session: 2,
        replay_from: 10,
        next_seq: 99,
        next_alloc_seq: 12,
        created_unix_ms: 1_700_000_000_000,
        entries: 2,
        tables_log2: 1,
        table_homes: 1024,
        body_crc: 0x1234_5678,
        hash_check: 0,
        body_segments: vec![5, 6],
        seg_alloc: vec![1, 2, 3],
    };
    let mut b = vec![0u8; m.encoded_bytes()];
    m.encode(&mut b);
    for item in [Item { entry: 0xabc, home: 3, grains: 1 }, Item { entry: 7, home: 9, grains: 2 }] {
        let mut chunk = [0u8; ITEM_BYTES];
        item.encode(&mut chunk);
        b.extend_from_slice(&chunk);
    }
    let commit = batch::Commit { records: 3, first_seq: 50, members_crc: batch::members_crc([1, 2, 3]) };
    vec![("manifest", b), ("commit", commit.encode().to_vec())]
}

fn config_toml() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            "docs-example",
            "data = \"/var/lib/granary/granary.db\"\nsize = \"64G\"\nlisten = \"0.0.0.0\"\nthreads = 0\n\
             conn_limit = 4096\nmax_item_size = \"4m\"\nidle_timeout = 600\nmetrics = \"127.0.0.1:9121\"\n\
             log_format = \"json\"\n",
        ),
        ("switches", "# comment\nevict = false\nflush = true\nport = 11211\n"),
        ("unknown-key", "no_such_key = 1\n[table]\nx = [1, 2.5, \"s\"]\n"),
        ("bad", "size = \"64Q\"\nport = 99999999\nlisten = 'not an address'\n"),
    ]
}
