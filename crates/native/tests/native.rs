//! The native server against the client crate and raw sockets over
//! loopback: every opcode, pipelining order, malformed and oversized
//! frames, limits, timeouts and reconnects, a sharded client over three
//! servers, namespaces (protocol version 2) next to version 1 clients,
//! exports (namespaces of kind block), and atomic TXNs.

use granary_client::{
    BatchOp, BatchResult, Client, ClientConfig, Connection, Error, NamespaceKind, NamespaceMode, NamespaceOptions,
    PutMode, Request, ShardedClient, Status, TxnOp, TxnOutcome,
};
use granary_native::{NativeConfig, Server};
use granary_proto::{self as proto, ClientHello, Header, Op, ServerHello};
use granary_store::io::MemDevice;
use granary_store::{CreateOptions, OpenOptions, Store};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::num::NonZeroU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

fn store(size: u64) -> Arc<Store> {
    let dev = Arc::new(MemDevice::new(size));
    let c = CreateOptions { segment_bytes: Some(4 << 20), grain_bytes: Some(512), ..CreateOptions::default() };
    Arc::new(Store::create(dev, &c, &OpenOptions::default()).unwrap())
}

fn server_with(cfg: NativeConfig) -> Server {
    let cfg =
        NativeConfig { listen: ([127, 0, 0, 1], granary_rt::net::free_low_port().unwrap()).into(), threads: 2, ..cfg };
    Server::start(store(64 << 20), cfg).unwrap()
}

fn server() -> Server {
    server_with(NativeConfig::default())
}

fn client(s: &Server) -> Client {
    Client::connect(s.local_addr(), ClientConfig::default()).unwrap()
}

/// A raw connection after the handshake (the latest version).
fn raw(addr: SocketAddr) -> TcpStream {
    raw_offering(addr, ClientHello::default(), proto::VERSION)
}

/// A raw connection after a handshake offering `offer`, which the server
/// answers with `version`.
fn raw_offering(addr: SocketAddr, offer: ClientHello, version: u16) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&offer.encode()).unwrap();
    let mut b = [0u8; proto::SERVER_HELLO_BYTES];
    s.read_exact(&mut b).unwrap();
    let h = ServerHello::decode(&b).unwrap();
    assert_eq!((h.status, h.version), (Status::Ok, version));
    s
}

/// Send `frames` on `s` and read one response per frame: (status, body) by id.
fn exchange(s: &mut TcpStream, frames: &[u8], n: usize) -> std::collections::HashMap<u64, (Status, Vec<u8>)> {
    s.write_all(frames).unwrap();
    let mut got = std::collections::HashMap::new();
    for _ in 0..n {
        let (h, st, body) = read_frame(s).expect("a response");
        assert!(got.insert(h.id, (st, body)).is_none(), "two responses to {}", h.id);
    }
    got
}

/// Read one response frame: (header, status, body); None at end of stream.
fn read_frame(s: &mut TcpStream) -> Option<(Header, Status, Vec<u8>)> {
    let mut h = [0u8; proto::HEADER_BYTES];
    if s.read_exact(&mut h).is_err() {
        return None;
    }
    let (hd, st) = proto::Response::decode_header(&h, u32::MAX).unwrap();
    let mut body = vec![0u8; hd.len as usize];
    s.read_exact(&mut body).unwrap();
    Some((hd, st, body))
}

fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

#[test]
fn every_operation_through_the_client() {
    let srv = server();
    let c = client(&srv);
    assert_eq!(c.get(b"a").unwrap(), None);
    c.put(b"a", b"1").unwrap();
    assert_eq!(c.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    assert!(!c.put_with(b"a", b"2", PutMode::CreateOnly).unwrap());
    assert!(c.put_with(b"b", b"2", PutMode::CreateOnly).unwrap());
    assert!(!c.put_with(b"zz", b"3", PutMode::ReplaceOnly).unwrap());
    assert!(c.put_with(b"a", b"3", PutMode::ReplaceOnly).unwrap());
    assert_eq!(c.get(b"a").unwrap().as_deref(), Some(&b"3"[..]));
    assert_eq!(c.mget(&[b"a", b"nope", b"b"]).unwrap(), vec![Some(b"3".to_vec()), None, Some(b"2".to_vec())]);
    assert!(c.delete(b"a").unwrap());
    assert!(!c.delete(b"a").unwrap());
    let big = vec![7u8; 1 << 20];
    c.put(b"big", &big).unwrap();
    assert_eq!(c.get(b"big").unwrap().unwrap(), big);
    // Empty value, binary key.
    c.put(b"\0\xff\n", b"").unwrap();
    assert_eq!(c.get(b"\0\xff\n").unwrap(), Some(Vec::new()));

    let r = c
        .batch(&[
            BatchOp::Put { key: b"x", value: b"1", mode: PutMode::Upsert },
            BatchOp::Get(b"x"),
            BatchOp::Put { key: b"x", value: b"2", mode: PutMode::CreateOnly },
            BatchOp::Delete(b"x"),
            BatchOp::Get(b"x"),
            BatchOp::Get(b"\0granary.x"),
        ])
        .unwrap();
    assert!(matches!(r[0], BatchResult::Stored(true)));
    assert!(matches!(&r[1], BatchResult::Value(Some(v)) if v == b"1"));
    assert!(matches!(r[2], BatchResult::Stored(false)));
    assert!(matches!(r[3], BatchResult::Deleted(true)));
    assert!(matches!(r[4], BatchResult::Value(None)));
    // One failed operation does not fail the others.
    assert!(matches!(&r[5], BatchResult::Failed(Error::Server { status: Status::KeyInvalid, .. })), "{:?}", r[5]);

    c.ping().unwrap();
    let st: std::collections::HashMap<String, String> = c.stats().unwrap().into_iter().collect();
    assert_eq!(st["cmd_put"], "9");
    assert_eq!(st["keys"], "3");
    assert_eq!(srv.stats().gets.load(Relaxed), 6 + 2 + 1 + 2);

    // The async API, driven by a plain executor.
    let v = granary_rt::block_on(async {
        c.put_async(b"as", b"yes").await.unwrap();
        let v = c.get_async(b"as").await.unwrap();
        assert!(c.delete_async(b"as").await.unwrap());
        v
    });
    assert_eq!(v.as_deref(), Some(&b"yes"[..]));
}

#[test]
fn server_errors_are_reported_and_the_connection_continues() {
    let srv = server_with(NativeConfig { value_bytes_max: 1000, ..NativeConfig::default() });
    let c = client(&srv);
    // Checked by the client before sending.
    assert!(matches!(c.put(b"k", &[0u8; 1001]), Err(Error::TooLarge { what: "value", .. })));
    assert!(matches!(c.get(b""), Err(Error::TooLarge { what: "key", .. })));
    // Checked by the server (raw frames skip the client's checks).
    let mut s = raw(srv.local_addr());
    let mut f = Vec::new();
    Request::Put { key: b"k", value: &[0u8; 1001], mode: PutMode::Upsert }.encode(1, &mut f);
    Request::Get(b"").encode(2, &mut f);
    Request::Put { key: b"\0granary.flush_floor", value: b"x", mode: PutMode::Upsert }.encode(3, &mut f);
    Request::Get(b"ok").encode(4, &mut f);
    s.write_all(&f).unwrap();
    let mut got = std::collections::HashMap::new();
    for _ in 0..4 {
        let (h, st, body) = read_frame(&mut s).unwrap();
        got.insert(h.id, (st, String::from_utf8_lossy(&body).into_owned()));
    }
    assert_eq!(got[&1].0, Status::ValueTooLarge, "{}", got[&1].1);
    assert!(got[&1].1.contains("limit of 1000"), "{}", got[&1].1);
    assert_eq!(got[&2].0, Status::KeyInvalid);
    assert_eq!(got[&3].0, Status::KeyInvalid);
    assert!(got[&3].1.contains("reserved"), "{}", got[&3].1);
    assert_eq!(got[&4].0, Status::NotFound);
    assert_eq!(c.get(b"k").unwrap(), None);
}

#[test]
fn pipelined_requests_take_effect_in_order() {
    let srv = server();
    let mut s = raw(srv.local_addr());
    let mut f = Vec::new();
    let reqs = [
        Request::Put { key: b"p", value: b"1", mode: PutMode::Upsert },
        Request::Get(b"p"),
        Request::Put { key: b"p", value: b"2", mode: PutMode::Upsert },
        Request::Get(b"p"),
        Request::MultiGet(vec![b"p", b"q"]),
        Request::Delete(b"p"),
        Request::Get(b"p"),
        Request::Put { key: b"p", value: b"3", mode: PutMode::CreateOnly },
        Request::Get(b"p"),
        Request::Nop,
    ];
    // Many rounds in one write, ids distinct.
    let rounds = 50u64;
    for r in 0..rounds {
        for (i, q) in reqs.iter().enumerate() {
            q.encode(r * 100 + i as u64, &mut f);
        }
    }
    s.write_all(&f).unwrap();
    let mut seen = 0;
    for r in 0..rounds {
        let mut got = std::collections::HashMap::new();
        loop {
            let (h, st, body) = read_frame(&mut s).unwrap();
            assert_eq!(h.id / 100, r, "a response of round {} came before round {r}'s NOP", h.id / 100);
            seen += 1;
            if h.op == Op::Nop {
                // The barrier: answered after every earlier request.
                assert_eq!(got.len(), reqs.len() - 1, "NOP answered before earlier requests");
                break;
            }
            assert_eq!(h.op, reqs[(h.id % 100) as usize].op());
            got.insert(h.id % 100, (st, body));
        }
        assert_eq!(got[&1], (Status::Ok, b"1".to_vec()));
        assert_eq!(got[&3], (Status::Ok, b"2".to_vec()));
        let e = proto::decode_entries(&got[&4].1).unwrap();
        assert_eq!((e[0].status, &e[0].bytes[..], e[1].status), (Status::Ok, &b"2"[..], Status::NotFound));
        assert_eq!(got[&5].0, Status::Ok);
        assert_eq!(got[&6].0, Status::NotFound);
        assert_eq!(got[&7].0, Status::Ok);
        assert_eq!(got[&8], (Status::Ok, b"3".to_vec()));
    }
    assert_eq!(seen, rounds as usize * reqs.len());
}

/// A name that resolves to several addresses is tried address by address
/// (as "localhost" may give ::1 first to a server on 127.0.0.1): the
/// client keeps the first that answers; none answering is the last error.
#[test]
fn connect_tries_each_address_the_name_resolves_to() {
    let srv = server();
    // Bound and not listening for the whole test: connections are refused
    // (a port only found free could be taken by another test's server).
    let held = granary_rt::net::BoundSocket::bind(([127, 0, 0, 1], 0).into()).unwrap();
    let closed = held.local_addr();
    let c = Client::connect(&[closed, srv.local_addr()][..], ClientConfig::default()).unwrap();
    c.put(b"k", b"v").unwrap();
    assert_eq!(c.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    assert!(matches!(Client::connect(&[closed][..], ClientConfig::default()), Err(granary_client::Error::Connect(..))));
    assert!(Client::connect(&[][..], ClientConfig::default()).is_err());
    // A server that answers and refuses is reported as such, not passed
    // over for the next address.
    let guarded = server_with(NativeConfig { token: Some(b"s3cret".to_vec()), ..NativeConfig::default() });
    let e = Client::connect(&[guarded.local_addr(), srv.local_addr()][..], ClientConfig::default()).err();
    assert!(matches!(e, Some(granary_client::Error::Handshake(_))), "{e:?}");
    drop(held);
}

#[test]
fn many_requests_in_flight_on_one_connection() {
    let srv = server();
    let c = client(&srv);
    let conn = c.conn().unwrap();
    let n = 2000u32;
    let keys: Vec<Vec<u8>> = (0..n).map(|i| format!("key-{i}").into_bytes()).collect();
    let pending: Vec<_> =
        keys.iter().map(|k| conn.send(&Request::Put { key: k, value: k, mode: PutMode::Upsert }).unwrap()).collect();
    for p in pending {
        assert_eq!(p.wait().unwrap().status, Status::Ok);
    }
    let pending: Vec<_> = keys.iter().map(|k| conn.send(&Request::Get(k)).unwrap()).collect();
    for (k, p) in keys.iter().zip(pending) {
        let r = p.wait().unwrap();
        assert_eq!((r.status, &r.body), (Status::Ok, k));
    }
    // Async pipelining from a single task: all sent, then awaited.
    granary_rt::block_on(async {
        let ps: Vec<_> = keys.iter().map(|k| conn.send(&Request::Delete(k)).unwrap()).collect();
        for p in ps {
            assert_eq!(p.await.unwrap().status, Status::Ok);
        }
    });
    assert_eq!(conn.in_flight(), 0);
}

/// A malformed frame behind requests still running: their responses come
/// first, then its error frame, then the close (a client that treats the
/// error as fatal has every earlier answer by then).
#[test]
fn a_malformed_frame_is_answered_after_the_requests_before_it() {
    let srv = server();
    let mut s = raw(srv.local_addr());
    let mut f = Vec::new();
    Request::Put { key: b"first", value: b"1", mode: PutMode::Upsert }.encode(1, &mut f);
    Request::Get(b"first").encode(2, &mut f);
    let mut bad = Vec::new();
    Request::Get(b"k").encode(3, &mut bad);
    bad[4] = 200;
    f.extend_from_slice(&bad);
    s.write_all(&f).unwrap();
    let order: Vec<(u64, Status)> = (0..3).map(|_| read_frame(&mut s).map(|(h, st, _)| (h.id, st)).unwrap()).collect();
    assert_eq!(order, vec![(1, Status::Ok), (2, Status::Ok), (3, Status::BadFrame)]);
    assert!(closed(&mut s));
    assert_eq!(client(&srv).get(b"first").unwrap().as_deref(), Some(&b"1"[..]), "the PUT was applied");
}

/// A value larger than a response frame (written under a larger limit, or
/// by the embedded API) is answered VALUE_TOO_LARGE, never with a frame the
/// client must refuse; the connection goes on.
#[test]
fn a_value_larger_than_a_frame_is_refused_not_sent() {
    // Past the 16 MiB floor of the frame limit, in segments that hold it.
    let dev = Arc::new(MemDevice::new(160 << 20));
    let c = CreateOptions { segment_bytes: Some(32 << 20), grain_bytes: Some(512), ..CreateOptions::default() };
    let st = Arc::new(Store::create(dev, &c, &OpenOptions::default()).unwrap());
    let big = vec![7u8; 17 << 20];
    st.put(b"big", &big).unwrap();
    st.put(b"small", b"s").unwrap();
    let cfg = NativeConfig {
        listen: ([127, 0, 0, 1], granary_rt::net::free_low_port().unwrap()).into(),
        threads: 2,
        value_bytes_max: 1 << 20,
        ..NativeConfig::default()
    };
    assert!(proto::frame_bytes_max(1 << 20) < big.len() as u32, "the frame limit is below the value");
    let srv = Server::start(st, cfg).unwrap();
    let c = client(&srv);
    for r in [c.get(b"big").map(|_| ()), c.get_cas(b"big").map(|_| ())] {
        match r {
            Err(Error::Server { status: Status::ValueTooLarge, message }) => {
                assert!(message.contains("larger than a response frame"), "{message}")
            }
            other => panic!("GET of a value past the frame limit: {other:?}"),
        }
    }
    assert_eq!(c.get(b"small").unwrap().as_deref(), Some(&b"s"[..]), "the connection goes on");
}

#[test]
fn malformed_frames_close_the_connection_and_nothing_else() {
    let srv = server_with(NativeConfig { value_bytes_max: 1 << 20, ..NativeConfig::default() });
    let frame_max = proto::frame_bytes_max(1 << 20);
    let check = |bytes: &[u8], want: Status, why: &str| {
        let mut s = raw(srv.local_addr());
        s.write_all(bytes).unwrap();
        let (h, st, body) = read_frame(&mut s).unwrap_or_else(|| panic!("{why}: no error frame"));
        assert_eq!(st, want, "{why}: {}", String::from_utf8_lossy(&body));
        assert_eq!(h.id, 77, "{why}");
        assert!(closed(&mut s), "{why}: connection left open");
    };
    let mut f = Vec::new();
    Request::Get(b"k").encode(77, &mut f);
    let mut bad = f.clone();
    bad[4] = 200;
    check(&bad, Status::BadFrame, "unknown opcode");
    let mut bad = f.clone();
    bad[7] = 1;
    check(&bad, Status::BadFrame, "reserved bytes");
    let mut bad = f.clone();
    bad[5] = 1;
    check(&bad, Status::BadFrame, "flags on a GET");
    // A header announcing a huge body is refused before anything is allocated.
    let mut bad = f[..proto::HEADER_BYTES].to_vec();
    bad[0..4].copy_from_slice(&(frame_max + 1).to_le_bytes());
    check(&bad, Status::FrameTooLarge, "oversized");
    let mut bad = f[..proto::HEADER_BYTES].to_vec();
    bad[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
    check(&bad, Status::FrameTooLarge, "u32::MAX");
    // An MGET whose count overruns its body.
    let mut bad = Vec::new();
    Header { len: 4, op: Op::MultiGet, flags: 0, ns_len: 0, id: 77 }.encode(&mut bad);
    bad.extend_from_slice(&1000u32.to_le_bytes());
    check(&bad, Status::BadFrame, "MGET overrun");

    // A bad hello: the server closes without a reply.
    let mut s = TcpStream::connect(srv.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"get foo\r\nget bar\r\n").unwrap();
    assert!(closed(&mut s));
    // A client speaking only a future version gets UNSUPPORTED_VERSION.
    let mut s = TcpStream::connect(srv.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&ClientHello { min_version: 9, max_version: 9 }.encode()).unwrap();
    let mut b = [0u8; proto::SERVER_HELLO_BYTES];
    s.read_exact(&mut b).unwrap();
    assert_eq!(ServerHello::decode(&b).unwrap().status, Status::UnsupportedVersion);
    assert!(closed(&mut s));
    // A truncated frame, then the client goes away.
    let mut s = raw(srv.local_addr());
    s.write_all(&f[..20.min(f.len() - 1)]).unwrap();
    drop(s);
    assert_eq!(srv.stats().bad_frames.load(Relaxed), 7);
    // The server still serves.
    client(&srv).ping().unwrap();
}

/// Seeded garbage after a valid hello (GRANARY_FUZZ_SEED reruns one seed):
/// the server never crashes and keeps serving.
#[test]
fn garbage_never_crashes_the_server() {
    let srv = server();
    let seeds: Vec<u64> = match std::env::var("GRANARY_FUZZ_SEED") {
        Ok(s) => vec![s.parse().expect("GRANARY_FUZZ_SEED is a number")],
        Err(_) => (1..=60).collect(),
    };
    for seed in seeds {
        let mut rng = granary_store::io::SimRng::new(seed);
        let mut next = move || rng.next_u64();
        // Valid frames with random bytes flipped, or plain noise.
        let mut f = Vec::new();
        for i in 0..20 {
            let k = format!("k{}", next() % 50);
            match next() % 4 {
                0 => Request::Get(k.as_bytes()).encode(i, &mut f),
                1 => Request::Put { key: k.as_bytes(), value: b"v", mode: PutMode::Upsert }.encode(i, &mut f),
                2 => Request::MultiGet(vec![k.as_bytes(), b"z"]).encode(i, &mut f),
                _ => Request::Batch(vec![BatchOp::Delete(k.as_bytes())]).encode(i, &mut f),
            }
        }
        if next() % 3 == 0 {
            for b in f.iter_mut() {
                *b = next() as u8;
            }
        } else {
            for _ in 0..1 + next() % 4 {
                let i = (next() as usize) % f.len();
                f[i] = next() as u8;
            }
        }
        let mut s = raw(srv.local_addr());
        let _ = s.write_all(&f);
        let _ = s.shutdown(std::net::Shutdown::Write);
        // Read until the server closes: every frame it sends is well formed.
        loop {
            let mut h = [0u8; proto::HEADER_BYTES];
            if s.read_exact(&mut h).is_err() {
                break;
            }
            let (hd, _) = proto::Response::decode_header(&h, u32::MAX)
                .unwrap_or_else(|e| panic!("seed {seed}: bad response header: {e}"));
            let mut body = vec![0u8; hd.len as usize];
            s.read_exact(&mut body).unwrap_or_else(|e| panic!("seed {seed}: truncated response: {e}"));
        }
        client(&srv).ping().unwrap_or_else(|e| panic!("seed {seed}: server stopped serving: {e}"));
    }
}

#[test]
fn connection_limit_is_enforced() {
    let srv = server_with(NativeConfig { max_connections: 2, ..NativeConfig::default() });
    let a = client(&srv);
    let b = client(&srv);
    a.ping().unwrap();
    b.ping().unwrap();
    match Client::connect(srv.local_addr(), ClientConfig::default()) {
        Err(Error::Handshake(m)) => assert!(m.contains("connection limit"), "{m}"),
        other => panic!("third connection: {:?}", other.map(|_| ())),
    }
    assert_eq!(srv.stats().listener.rejected_connections.load(Relaxed), 1);
    drop(a);
    // Once one closes, a new client gets in (the count drops when the
    // server sees the close: retry a bounded number of times).
    let mut ok = false;
    for _ in 0..200 {
        if Client::connect(srv.local_addr(), ClientConfig::default()).is_ok() {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(ok, "no connection accepted after one closed");
}

/// Connections over the limit that say nothing (a native refusal waits for
/// the client's hello, seconds): past `REFUSING_MAX` of them at once the
/// rest are closed without waiting, so a flood holds no descriptors.
#[test]
fn a_flood_past_the_limit_is_closed_at_once_past_the_refusals_under_way() {
    use granary_server::REFUSING_MAX;
    let srv = server_with(NativeConfig { max_connections: 1, ..NativeConfig::default() });
    let held = client(&srv);
    held.ping().unwrap();
    let extra = REFUSING_MAX as usize + 16;
    let mut silent: Vec<TcpStream> = (0..extra).map(|_| TcpStream::connect(srv.local_addr()).unwrap()).collect();
    // In accept order: the first REFUSING_MAX wait for a hello that never
    // comes (the first of them is checked); the others are closed at once,
    // long before the hello timeout.
    let mut b = [0u8; 1];
    for (i, s) in silent.iter_mut().enumerate().skip(REFUSING_MAX as usize) {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        match s.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("connection {i} past the refusals under way: {other:?}"),
        }
    }
    silent[0].set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let waiting = silent[0].read(&mut b).unwrap_err();
    assert!(matches!(waiting.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "{waiting}");
    assert_eq!(srv.stats().listener.rejected_connections.load(Relaxed), extra as u64, "every one is counted");
    held.ping().unwrap();
}

/// The lifecycle (granary-server) keeps the connection counters; STATS
/// still reports them under their names, and the idle timeout closes a
/// silent connection and one stalled inside a zero-copy PUT's value.
#[test]
fn idle_connections_are_closed_and_stats_keeps_its_names() {
    // A second: long enough that the STATS clients, which send at once, are
    // not kicked when the machine is loaded.
    let srv = server_with(NativeConfig { idle_timeout: Some(Duration::from_secs(1)), ..NativeConfig::default() });
    let stats = |srv: &Server| -> std::collections::HashMap<String, String> {
        let pairs = client(srv).stats().unwrap();
        let mut names: Vec<&String> = pairs.iter().map(|(k, _)| k).collect();
        names.sort();
        let twice: Vec<_> = names.windows(2).filter(|w| w[0] == w[1]).map(|w| w[0]).collect();
        assert!(twice.is_empty(), "STATS names {twice:?} twice (a client's map keeps one)");
        pairs.into_iter().collect()
    };
    let st = stats(&srv);
    for name in [
        "version",
        "uptime",
        "curr_connections",
        "total_connections",
        "rejected_connections",
        "bad_frames",
        "idle_kicks",
        "cmd_get",
        "get_hits",
        "cmd_put",
        "cmd_delete",
        "cmd_mget",
        "cmd_batch",
        "cmd_nop",
        "cmd_ns_create",
        "cmd_ns_drop",
        "cmd_ns_truncate",
        "cmd_ns_list",
        "cmd_ns_stats",
        "errors",
        "bytes_read",
        "bytes_written",
        "conn_buffer_bytes_max",
        "conns_waiting_to_send",
        "conns_paused",
        "zero_copy_gets",
        "zero_copy_puts",
        "value_bytes_max",
        "keys",
        "segments",
        "segments_free",
        "live_bytes",
        "write_amplification",
        "evicting",
    ] {
        assert!(st.contains_key(name), "STATS lacks {name}");
    }
    assert_eq!((st["curr_connections"].as_str(), st["total_connections"].as_str()), ("1", "1"));
    assert_eq!(st["bytes_read"], proto::HEADER_BYTES.to_string(), "the STATS request itself");
    // The server's own figures, not the store's of the same names (those
    // prefixed `store_`).
    assert_eq!(st["value_bytes_max"], NativeConfig::default().value_bytes_max.to_string());
    assert_ne!(st["store_value_bytes_max"], st["value_bytes_max"]);
    assert!(st.contains_key("store_get_hits"));

    // Silent after its hello.
    let mut s = raw(srv.local_addr());
    assert!(closed(&mut s), "a silent connection was left open");
    // Stalled inside a value received straight into a record buffer.
    let mut s = raw(srv.local_addr());
    let mut f = Vec::new();
    Request::Put { key: b"stall", value: &vec![1u8; 100_000], mode: PutMode::Upsert }.encode(1, &mut f);
    s.write_all(&f[..50_000]).unwrap();
    assert!(closed(&mut s), "a stalled PUT was left open");
    let l = &srv.stats().listener;
    assert_eq!(l.idle_kicks.load(Relaxed), 2);
    assert_eq!(l.bytes_read.load(Relaxed), proto::HEADER_BYTES as u64 + 50_000);
    assert_eq!(srv.stats().zero_copy_puts.load(Relaxed), 0, "the stalled PUT never ran");
    let st = stats(&srv);
    assert_eq!(st["idle_kicks"], "2");
    assert_eq!(st["total_connections"], "4");
}

/// A fake server: answers the hello, then runs `then` on the socket.
fn fake_server(then: impl Fn(TcpStream) + Send + 'static) -> SocketAddr {
    let l = granary_rt::net::bind_low_port([127, 0, 0, 1].into()).unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut b = [0u8; proto::CLIENT_HELLO_BYTES];
            if s.read_exact(&mut b).is_err() {
                continue;
            }
            let h = ServerHello {
                version: proto::VERSION,
                status: Status::Ok,
                key_bytes_max: 100,
                value_bytes_max: 100,
                frame_bytes_max: proto::FRAME_BYTES_FLOOR,
            };
            let _ = s.write_all(&h.encode());
            then(s);
        }
    });
    addr
}

/// A send that fails partway through its frame (the server stopped
/// reading; the socket's send timeout) closes the stream before any other
/// frame can follow the part, and a request that was failed meanwhile
/// (here by that failure) is never sent afterwards: the server sees A's
/// partial frame and then the end of the stream, never B's frame spliced
/// into what it takes for A's value.
#[test]
fn a_send_that_fails_partway_closes_the_stream_before_another_frame() {
    const BIG: usize = 48 << 20;
    let l = granary_rt::net::bind_low_port([127, 0, 0, 1].into()).unwrap();
    let addr = l.local_addr().unwrap();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (got_tx, got_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; proto::CLIENT_HELLO_BYTES];
        s.read_exact(&mut b).unwrap();
        let h = ServerHello {
            version: proto::VERSION,
            status: proto::Status::Ok,
            key_bytes_max: 100,
            value_bytes_max: BIG as u32 * 2,
            frame_bytes_max: BIG as u32 * 2,
        };
        s.write_all(&h.encode()).unwrap();
        // Read nothing until told, then everything until the end (or 5 s
        // of nothing: a stream left open).
        go_rx.recv().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        let mut b = vec![0u8; 1 << 20];
        while let Ok(n @ 1..) = s.read(&mut b) {
            got.extend_from_slice(&b[..n]);
        }
        got_tx.send(got).unwrap();
    });
    let cfg = ClientConfig { timeout: Duration::from_millis(300), connections: 1, ..ClientConfig::default() };
    let c = Arc::new(Client::connect(addr, cfg).unwrap());
    let conn = c.conn().unwrap();
    let c2 = c.clone();
    let a = std::thread::spawn(move || c2.put(b"A-key", &vec![b'a'; BIG]));
    while conn.in_flight() == 0 {
        std::thread::yield_now();
    }
    let c3 = c.clone();
    let b = std::thread::spawn(move || c3.put(b"B-key", b"B-MARKER"));
    assert!(a.join().unwrap().is_err(), "the server read nothing of a 48 MiB frame");
    go_tx.send(()).unwrap();
    let _ = b.join().unwrap();
    let got = got_rx.recv().unwrap();
    let at = got.windows(64).position(|w| w.iter().all(|&x| x == b'a')).expect("A's value began");
    assert!(got.len() - at < BIG, "A's frame was cut short");
    assert!(got[at..].iter().all(|&x| x == b'a'), "another frame followed A's partial frame");
}

/// A timeout past what an `Instant` holds (`Duration::MAX`: none) is a
/// century, not a panic on the first request.
#[test]
fn a_client_without_a_timeout_serves_requests() {
    let s = server();
    let cfg = ClientConfig { timeout: Duration::MAX, ..ClientConfig::default() };
    let c = Client::connect(s.local_addr(), cfg).unwrap();
    c.put(b"k", b"v").unwrap();
    assert_eq!(c.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
}

#[test]
fn timeouts_and_reconnects() {
    // Never answers: the request times out; the connection stays usable.
    let silent = fake_server(|s| {
        std::thread::spawn(move || {
            let mut s = s;
            let mut b = [0u8; 4096];
            while matches!(s.read(&mut b), Ok(n) if n > 0) {}
        });
    });
    let cfg = ClientConfig { timeout: Duration::from_millis(200), connections: 1, ..ClientConfig::default() };
    let c = Client::connect(silent, cfg.clone()).unwrap();
    assert!(matches!(c.get(b"k"), Err(Error::Timeout)));
    let err = granary_rt::block_on(c.get_async(b"k")).unwrap_err();
    assert!(matches!(err, Error::Timeout), "{err}");
    assert!(c.conn().unwrap().is_alive());

    // Closes after the hello: the request fails as disconnected, and the
    // next one connects anew.
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n = count.clone();
    let closer = fake_server(move |s| {
        n.fetch_add(1, Relaxed);
        drop(s);
    });
    // A long timeout: a closer preempted before it drops the socket must
    // not make the request time out.
    let c = Client::connect(closer, ClientConfig { timeout: Duration::from_secs(30), ..cfg }).unwrap();
    let first = c.conn().unwrap();
    match c.get(b"k") {
        Err(Error::Disconnected(_)) => {}
        // The send itself may fail if the close already arrived.
        Err(Error::Timeout) => panic!("a closed connection must not wait for the timeout"),
        other => panic!("{other:?}"),
    }
    // Wait (bounded) for the reader to notice, then the pool reconnects.
    for _ in 0..500 {
        if !first.is_alive() {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(!first.is_alive());
    let _ = c.get(b"k");
    assert!(count.load(Relaxed) >= 2, "the pool did not reconnect");

    // Nothing listening: a clear connect error.
    let dead = granary_rt::net::bind_low_port([127, 0, 0, 1].into()).unwrap().local_addr().unwrap();
    match Client::connect(dead, ClientConfig::default()) {
        Err(e @ Error::Connect(..)) => assert!(e.to_string().contains("cannot connect"), "{e}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[test]
fn sharded_client_spreads_keys_over_three_servers() {
    let servers: Vec<Server> = (0..3).map(|_| server()).collect();
    let names: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let sc = ShardedClient::new(&names, ClientConfig::default()).unwrap();
    let keys: Vec<Vec<u8>> = (0..600).map(|i| format!("user:{i}").into_bytes()).collect();
    for k in &keys {
        sc.put(k, k).unwrap();
    }
    // Each key is on the ring's server and only there; all three get a share.
    let direct: Vec<Client> = servers.iter().map(client).collect();
    let mut per = [0usize; 3];
    for k in &keys {
        let owner = sc.server_of(k);
        assert_eq!(owner, granary_client::ketama::Ketama::new(&names).server_of(k).unwrap());
        per[owner] += 1;
        for (i, d) in direct.iter().enumerate() {
            assert_eq!(d.get(k).unwrap().is_some(), i == owner, "key {:?}", String::from_utf8_lossy(k));
        }
    }
    assert!(per.iter().all(|&n| n > 100), "uneven spread {per:?}");
    let ks: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    let vals = sc.mget(&ks).unwrap();
    assert!(vals.iter().zip(&keys).all(|(v, k)| v.as_ref() == Some(k)));
    assert_eq!(sc.get_many(&ks).unwrap(), vals);
    let ops: Vec<BatchOp> = ks.iter().map(|k| BatchOp::Delete(k)).collect();
    let r = sc.batch(&ops).unwrap();
    assert!(r.iter().all(|x| matches!(x, BatchResult::Deleted(true))));
    assert!(sc.mget(&ks).unwrap().iter().all(|v| v.is_none()));
    let items: Vec<(&[u8], &[u8])> = ks.iter().map(|k| (*k, &b"v"[..])).collect();
    sc.put_many(&items).unwrap();
    assert_eq!(sc.delete_many(&ks[..10]).unwrap(), vec![true; 10]);
    let total: u64 = servers.iter().map(|s| s.stats().puts.load(Relaxed)).sum();
    assert_eq!(total, 1200);
}

/// A server of three down: `mget` fails whole, `mget_partial` answers the
/// keys of the two still up and names the one that failed, for its keys
/// only.
#[test]
fn a_sharded_partial_mget_keeps_the_servers_still_up() {
    let mut servers: Vec<Server> = (0..3).map(|_| server()).collect();
    let names: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let sc = ShardedClient::new(&names, ClientConfig::default()).unwrap();
    let keys: Vec<Vec<u8>> = (0..300).map(|i| format!("user:{i}").into_bytes()).collect();
    let ks: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    // Every other key written: absent ones read as absent, not failed.
    for k in ks.iter().step_by(2) {
        sc.put(k, k).unwrap();
    }
    let all = sc.mget_partial(&ks);
    assert!(all.failed.is_empty(), "{:?}", all.failed);
    for (i, (v, k)) in all.values.iter().zip(&keys).enumerate() {
        assert_eq!(v.as_ref().unwrap().as_ref(), (i % 2 == 0).then_some(k));
    }
    let down = 1;
    assert_eq!(servers.remove(down).shutdown(), 0);
    assert!(sc.mget(&ks).is_err(), "mget fails whole with a server down");
    let part = sc.mget_partial(&ks);
    assert_eq!(part.failed.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [down]);
    let mut lost = 0;
    for (i, (v, k)) in part.values.iter().zip(&keys).enumerate() {
        if sc.server_of(k) == down {
            assert_eq!(v.as_ref().unwrap_err(), &down, "key {i}");
            lost += 1;
        } else {
            assert_eq!(v.as_ref().unwrap().as_ref(), (i % 2 == 0).then_some(k), "key {i}");
        }
    }
    assert!(lost > 0 && lost < keys.len(), "{lost} keys on the server down");
}

#[test]
fn shutdown_drains_and_counts_nothing_left() {
    let srv = server();
    let c = client(&srv);
    let conn = c.conn().unwrap();
    let pending: Vec<_> = (0..200u32)
        .map(|i| conn.send(&Request::Put { key: &i.to_le_bytes(), value: b"v", mode: PutMode::Upsert }).unwrap())
        .collect();
    // Every request the server read before the shutdown is answered.
    let first = pending.into_iter().next().unwrap().wait().unwrap();
    assert_eq!(first.status, Status::Ok);
    assert_eq!(srv.shutdown(), 0);
}

#[test]
fn multi_get_responses_stay_within_the_frame_limit() {
    let srv = server_with(NativeConfig { value_bytes_max: 100_000, ..NativeConfig::default() });
    let c = client(&srv);
    let frame_max = c.conn().unwrap().server_hello().frame_bytes_max as usize;
    let keys: Vec<Vec<u8>> = (0..200u32).map(|i| format!("v{i}").into_bytes()).collect();
    let value = vec![1u8; 100_000];
    for k in &keys {
        c.put(k, &value).unwrap();
    }
    // 20 MB of values asked for in one MGET: the response stays under the
    // limit (values that do not fit come back as VALUE_TOO_LARGE entries)
    // and the connection survives.
    let ks: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    let r = c.conn().unwrap().call(&Request::MultiGet(ks.clone())).unwrap();
    assert!(r.body.len() <= frame_max, "{} > {frame_max}", r.body.len());
    let e = proto::decode_entries(&r.body).unwrap();
    assert_eq!(e.len(), 200);
    let fit = e.iter().take_while(|x| x.status == Status::Ok).count();
    assert!(fit > 100 && fit < 200, "{fit} values fit");
    assert!(e[fit..].iter().all(|x| x.status == Status::ValueTooLarge));
    assert!(matches!(c.mget(&ks), Err(Error::Server { status: Status::ValueTooLarge, .. })));
    // The same connection still works, and the keys read alone.
    assert_eq!(c.get(&keys[199]).unwrap().unwrap(), value);
}

#[test]
fn a_client_that_does_not_read_holds_the_server_to_its_memory_bound() {
    let srv = server();
    let v = vec![b'n'; 64 << 10];
    client(&srv).put(b"big", &v).unwrap();
    // 4000 GETs, 256 MiB of responses, in one write; none read yet.
    const GETS: u64 = 4000;
    let mut s = raw(srv.local_addr());
    let mut f = Vec::new();
    for id in 0..GETS {
        Request::Get(b"big").encode(id, &mut f);
    }
    let mut w = s.try_clone().unwrap();
    let sent = f.clone();
    let writer = std::thread::spawn(move || w.write_all(&sent).unwrap());
    let st = srv.stats();
    // The server pauses the connection once the socket is full and
    // responses wait; it starts no more requests.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while st.conns_paused.load(Relaxed) == 0 {
        assert!(std::time::Instant::now() < deadline, "the server never paused the connection");
        std::thread::sleep(Duration::from_millis(1));
    }
    let frame = f.len() / GETS as usize;
    let bound = granary_native::limits::connection_bytes_bound(frame, proto::HEADER_BYTES + v.len()) as u64;
    let served = st.get_hits.load(Relaxed);
    let held = st.conn_buffer_bytes_max.load(Relaxed);
    assert!(served < GETS, "all {GETS} responses were produced for a client that reads none");
    assert!(held <= bound, "a connection held {held} bytes, over its bound of {bound}");
    // Every response then arrives whole, once.
    let mut seen = vec![false; GETS as usize];
    for _ in 0..GETS {
        let (h, status, body) = read_frame(&mut s).unwrap();
        assert_eq!((status, body.len()), (Status::Ok, v.len()));
        assert!(!std::mem::replace(&mut seen[h.id as usize], true), "two responses to {}", h.id);
    }
    writer.join().unwrap();
    assert_eq!(st.get_hits.load(Relaxed), GETS);
    let held = st.conn_buffer_bytes_max.load(Relaxed);
    assert!(held <= bound, "a connection held {held} bytes, over its bound of {bound}");
}

#[test]
fn large_values_travel_without_copies_split_and_pipelined() {
    let srv = server();
    let mut s = raw(srv.local_addr());
    let v1: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let v2: Vec<u8> = (0..40_000u32).map(|i| (i % 13) as u8).collect();
    let small = vec![5u8; 100];
    let mut f = Vec::new();
    Request::Put { key: b"z1", value: &v1, mode: PutMode::Upsert }.encode(1, &mut f);
    Request::Get(b"z1").encode(2, &mut f);
    Request::Put { key: b"z1", value: &v2, mode: PutMode::CreateOnly }.encode(3, &mut f);
    Request::Put { key: b"z2", value: &v2, mode: PutMode::ReplaceOnly }.encode(4, &mut f);
    Request::Put { key: b"z1", value: &v2, mode: PutMode::ReplaceOnly }.encode(5, &mut f);
    Request::Get(b"z1").encode(6, &mut f);
    Request::Put { key: b"s", value: &small, mode: PutMode::Upsert }.encode(7, &mut f);
    Request::Get(b"s").encode(8, &mut f);
    Request::Nop.encode(9, &mut f);
    // In uneven pieces: a value arrives across many receives, some frames
    // start mid-piece, one piece ends inside a key.
    for piece in f.chunks(7_777) {
        s.write_all(piece).unwrap();
    }
    let mut got = std::collections::HashMap::new();
    loop {
        let (h, st, body) = read_frame(&mut s).unwrap();
        got.insert(h.id, (st, body));
        if h.id == 9 {
            break;
        }
    }
    assert_eq!(got[&1], (Status::Ok, vec![]));
    assert_eq!(got[&2].0, Status::Ok);
    assert!(got[&2].1 == v1, "the first value came back changed");
    assert_eq!(got[&3].0, Status::Exists);
    assert_eq!(got[&4].0, Status::NotFound);
    assert_eq!(got[&5].0, Status::Ok);
    assert!(got[&6].1 == v2, "the replaced value came back changed");
    assert_eq!(got[&8], (Status::Ok, small.clone()));
    let st = srv.stats();
    // PUTs 1, 3, 4, 5 and GETs 2, 6 took the zero-copy path; the small ones did not.
    assert_eq!(st.zero_copy_puts.load(Relaxed), 4);
    assert_eq!(st.zero_copy_gets.load(Relaxed), 2);
    // The client sees the same through its API, and after a reopen-free check.
    let c = client(&srv);
    assert_eq!(c.get(b"z1").unwrap().as_deref(), Some(&v2[..]));
    // A large PUT refused by the engine (reserved key) still gets its answer.
    let mut f = Vec::new();
    Request::Put { key: b"\0granary.x", value: &v2, mode: PutMode::Upsert }.encode(10, &mut f);
    s.write_all(&f).unwrap();
    let (h, status, _) = read_frame(&mut s).unwrap();
    assert_eq!((h.id, status), (10, Status::KeyInvalid));
}

/// Accepted connections go to the executors in turn (one accept loop hands
/// them out; left to the kernel, most went to one executor).
#[test]
fn connections_are_spread_over_the_executors() {
    use granary_rt::{Runtime, RuntimeConfig};
    let rt = Arc::new(Runtime::new(RuntimeConfig { threads: 2, pin: false, ..RuntimeConfig::default() }).unwrap());
    let cfg = NativeConfig {
        listen: ([127, 0, 0, 1], granary_rt::net::free_low_port().unwrap()).into(),
        ..NativeConfig::default()
    };
    let srv = Server::start_on(store(64 << 20), cfg, rt.clone()).unwrap();
    let before: Vec<u64> = rt.stats().iter().map(|s| s.spawned).collect();
    let clients: Vec<Client> = (0..8).map(|_| client(&srv)).collect();
    for c in &clients {
        c.ping().unwrap();
    }
    let spawned: Vec<u64> = rt.stats().iter().zip(&before).map(|(s, b)| s.spawned - b).collect();
    // Each connection spawns a reader and a writer task on its executor.
    assert!(spawned.iter().all(|&n| n >= 8), "8 connections, 4 to each executor at least: {spawned:?}");
    drop(clients);
    srv.shutdown();
}

fn server_error(r: Result<impl std::fmt::Debug, Error>) -> (Status, String) {
    match r {
        Err(Error::Server { status, message }) => (status, message),
        other => panic!("not a server error: {other:?}"),
    }
}

/// Keys of two namespaces (and the default one) are distinct; create,
/// list, stats, truncate and drop over the wire; a dropped namespace's
/// requests get NO_SUCH_NAMESPACE, and one created again under its name is
/// a new, empty one.
#[test]
fn namespaces_keep_keys_apart_and_are_managed_over_the_wire() {
    let srv = server();
    let c = client(&srv);
    assert_eq!(c.conn().unwrap().version(), proto::VERSION);
    let opts = NamespaceOptions {
        mode: NamespaceMode::Store,
        default_ttl_secs: 3600,
        max_bytes: NonZeroU64::new(1 << 30),
        max_keys: NonZeroU64::new(1_000_000),
        kind: NamespaceKind::Kv,
    };
    c.ns_create("users", opts).unwrap();
    c.ns_create("carts", NamespaceOptions::default()).unwrap();
    assert_eq!(server_error(c.ns_create("users", NamespaceOptions::default())).0, Status::NamespaceExists);
    let (st, msg) = server_error(c.ns_create("bad name!", NamespaceOptions::default()));
    assert_eq!(st, Status::BadNamespace, "{msg}");
    assert_eq!(server_error(c.ns_create("", NamespaceOptions::default())).0, Status::BadNamespace);
    assert_eq!(server_error(c.ns_create("default", NamespaceOptions::default())).0, Status::NamespaceExists);
    assert!(matches!(c.ns_create(&"x".repeat(65), NamespaceOptions::default()), Err(Error::TooLarge { .. })));

    // One key, three values.
    let (users, carts) = (c.ns("users"), c.ns("carts"));
    c.put(b"k", b"default").unwrap();
    users.put(b"k", b"users").unwrap();
    carts.put(b"k", b"carts").unwrap();
    assert_eq!(c.get(b"k").unwrap().as_deref(), Some(&b"default"[..]));
    assert_eq!(c.ns("default").get(b"k").unwrap().as_deref(), Some(&b"default"[..]));
    assert_eq!(users.get(b"k").unwrap().as_deref(), Some(&b"users"[..]));
    assert_eq!(carts.get(b"k").unwrap().as_deref(), Some(&b"carts"[..]));
    assert!(!users.put_with(b"k", b"again", PutMode::CreateOnly).unwrap());
    assert!(users.put_with(b"only-users", b"1", PutMode::CreateOnly).unwrap());
    assert_eq!(c.get(b"only-users").unwrap(), None);
    assert_eq!(carts.mget(&[b"k", b"only-users"]).unwrap(), vec![Some(b"carts".to_vec()), None]);
    assert!(carts.delete(b"k").unwrap());
    assert_eq!(users.get(b"k").unwrap().as_deref(), Some(&b"users"[..]));
    let r = users.batch(&[BatchOp::Get(b"k"), BatchOp::Put { key: b"b", value: b"2", mode: PutMode::Upsert }]).unwrap();
    assert!(matches!(&r[0], BatchResult::Value(Some(v)) if v == b"users"));
    assert!(matches!(r[1], BatchResult::Stored(true)));
    assert_eq!(c.get(b"b").unwrap(), None);
    // A large value, received into the engine's buffer, in a namespace.
    let big: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    users.put(b"big", &big).unwrap();
    assert_eq!(users.get(b"big").unwrap().unwrap(), big);
    assert_eq!(c.get(b"big").unwrap(), None);
    assert_eq!(srv.stats().zero_copy_puts.load(Relaxed), 1);
    assert_eq!(srv.stats().zero_copy_gets.load(Relaxed), 1);
    let v = granary_rt::block_on(async {
        users.put_async(b"as", b"yes").await.unwrap();
        users.get_async(b"as").await.unwrap()
    });
    assert_eq!(v.as_deref(), Some(&b"yes"[..]));

    // List and stats.
    let list = c.ns_list().unwrap();
    let names: Vec<&str> = list.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["default", "carts", "users"]);
    let u = c.ns_stats("users").unwrap();
    assert_eq!(&u, list.iter().find(|s| s.name == "users").unwrap());
    assert_eq!((u.keys, u.options), (5, opts));
    assert!(u.value_bytes >= 100_000 && u.sets == 5 && u.gets >= 3 && u.hits >= 3, "{u:?}");
    assert_eq!(c.ns_stats("carts").unwrap().keys, 0);
    assert_eq!(c.ns_stats("default").unwrap().keys, 1);
    assert_eq!(c.ns_stats("").unwrap().name, "default");
    assert_eq!(users.stats().unwrap().keys, 5);
    assert_eq!(server_error(c.ns_stats("nope")).0, Status::NoSuchNamespace);

    // Truncate: empty, and still there with its options.
    let id = u.id;
    c.ns_truncate("users").unwrap();
    assert_eq!(users.get(b"k").unwrap(), None);
    let u = c.ns_stats("users").unwrap();
    assert_eq!((u.keys, u.options), (0, opts));
    assert_ne!(u.id, id);
    users.put(b"k", b"after").unwrap();
    assert_eq!(users.get(b"k").unwrap().as_deref(), Some(&b"after"[..]));
    assert_eq!(c.get(b"k").unwrap().as_deref(), Some(&b"default"[..]), "other namespaces untouched");

    // Drop: every request in it gets NO_SUCH_NAMESPACE, on every path.
    c.ns_drop("users").unwrap();
    assert_eq!(server_error(users.get(b"k")).0, Status::NoSuchNamespace);
    assert_eq!(server_error(users.put(b"k", b"v")).0, Status::NoSuchNamespace);
    assert_eq!(server_error(users.put(b"big", &big)).0, Status::NoSuchNamespace);
    assert_eq!(server_error(users.delete(b"k")).0, Status::NoSuchNamespace);
    assert_eq!(server_error(users.mget(&[b"k"])).0, Status::NoSuchNamespace);
    assert_eq!(server_error(users.batch(&[BatchOp::Get(b"k")])).0, Status::NoSuchNamespace);
    assert_eq!(server_error(c.ns_drop("users")).0, Status::NoSuchNamespace);
    assert_eq!(server_error(c.ns_truncate("users")).0, Status::NoSuchNamespace);
    assert_eq!(server_error(c.ns_stats("users")).0, Status::NoSuchNamespace);
    assert_eq!(server_error(c.ns("never").get(b"k")).0, Status::NoSuchNamespace);
    assert_eq!(server_error(c.ns_drop("default")).0, Status::BadNamespace);
    assert_eq!(server_error(c.ns_drop("")).0, Status::BadNamespace);
    // Created again: a new, empty namespace, on the same connection.
    c.ns_create("users", NamespaceOptions::default()).unwrap();
    assert_eq!(users.get(b"k").unwrap(), None);
    users.put(b"k", b"new").unwrap();
    assert_eq!(users.get(b"k").unwrap().as_deref(), Some(&b"new"[..]));
    assert_eq!(c.ns_list().unwrap().len(), 3);

    let st: std::collections::HashMap<String, String> = c.stats().unwrap().into_iter().collect();
    assert_eq!(st["cmd_ns_create"], "7", "the name over the limit was refused by the client");
    assert_eq!(st["cmd_ns_drop"], "4");
    assert_eq!(st["cmd_ns_truncate"], "2");
    assert_eq!(st["cmd_ns_list"], "2");
    assert_eq!(st["cmd_ns_stats"], "8");
    assert!(st.contains_key("latency_ns_create_count"));
    let s = srv.stats();
    assert_eq!(s.ns_creates.load(Relaxed), 7);
}

/// Namespace changes are barriers: pipelined behind one, a request sees
/// it (a drop, a create, a truncate). A large PUT right behind a truncate
/// of its namespace, whose record buffer was built for the namespace's id
/// as the frame arrived, still lands in the namespace as it is when it
/// runs (without the server building it again, it gets NO_SUCH_NAMESPACE).
/// Exports over the wire: `create_export` sends NS_CREATE with its kind
/// section and makes a namespace of kind block, whose geometry NS_STATS
/// and NS_LIST report and whose blocks are its keys; geometry the engine
/// refuses is BAD_NAMESPACE, a name taken NAMESPACE_EXISTS. An NS_CREATE
/// without the section (what clients without kinds send) makes a key
/// space; one with an unknown kind is malformed.
#[test]
fn exports_are_created_and_reported_over_the_wire() {
    use granary_store::block::block_key;
    let srv = server();
    let c = client(&srv);
    c.create_export("disk", 1 << 30, 4096).unwrap();
    let export = NamespaceOptions::export(1 << 30, 4096);
    assert_eq!(export.kind, NamespaceKind::Block { size_bytes: 1 << 30, block_bytes: 4096 });
    assert_eq!(c.ns_stats("disk").unwrap().options, export);
    let disk = c.ns("disk");
    disk.put(&block_key(5), &[9u8; 4096]).unwrap();
    assert_eq!(disk.get(&block_key(5)).unwrap().unwrap(), vec![9u8; 4096]);
    assert_eq!(disk.get(&block_key(6)).unwrap(), None, "an unwritten block");
    assert_eq!(c.ns_stats("disk").unwrap().keys, 1);

    for (size, block) in [(1 << 30, 3000), (1 << 30, 256), (1 << 30, 128 << 10), (5000, 4096), (0, 4096)] {
        let (st, msg) = server_error(c.create_export("bad", size, block));
        assert_eq!(st, Status::BadNamespace, "{size} {block}: {msg}");
    }
    let (st, msg) = server_error(c.ns_create("bad", NamespaceOptions { mode: NamespaceMode::Cache, ..export }));
    assert!(st == Status::BadNamespace && msg.contains("mode is store"), "{st}: {msg}");
    let (st, msg) = server_error(c.ns_create("bad", NamespaceOptions { max_keys: NonZeroU64::new(9), ..export }));
    assert!(st == Status::BadNamespace && msg.contains("no quota"), "{st}: {msg}");
    assert_eq!(server_error(c.create_export("disk", 1 << 20, 4096)).0, Status::NamespaceExists);
    granary_rt::block_on(c.create_export_async("small", 1 << 20, 512)).unwrap();
    c.ns_create("kv", NamespaceOptions::default()).unwrap();
    let kinds: Vec<(String, NamespaceKind)> =
        c.ns_list().unwrap().into_iter().map(|s| (s.name, s.options.kind)).collect();
    let small = NamespaceKind::Block { size_bytes: 1 << 20, block_bytes: 512 };
    let want = [("default", NamespaceKind::Kv), ("disk", export.kind), ("kv", NamespaceKind::Kv), ("small", small)];
    assert_eq!(kinds, want.map(|(n, k)| (n.to_string(), k)));

    // Raw frames: no kind section is a key space.
    let mut s = raw(srv.local_addr());
    let mut f = Vec::new();
    Request::NsCreate(NamespaceOptions::default()).encode_in(b"plain", 1, &mut f);
    assert_eq!(f.len(), proto::HEADER_BYTES + 5 + 20, "the frame of clients without kinds");
    Request::NsStats.encode_in(b"plain", 2, &mut f);
    let got = exchange(&mut s, &f, 2);
    assert_eq!(got[&1].0, Status::Ok);
    let plain = proto::decode_namespace_stats(&got[&2].1).unwrap();
    assert_eq!(plain.options.kind, NamespaceKind::Kv);
    // An unknown kind: BAD_FRAME, and the connection closes.
    let mut f = Vec::new();
    Request::NsCreate(export).encode_in(b"odd", 77, &mut f);
    f[proto::HEADER_BYTES + 3 + 20] = 7;
    s.write_all(&f).unwrap();
    let (h, st, body) = read_frame(&mut s).unwrap();
    assert_eq!((h.id, st), (77, Status::BadFrame), "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("unknown namespace kind 7"));
    assert!(closed(&mut s));
    assert!(matches!(c.ns_stats("odd"), Err(Error::Server { status: Status::NoSuchNamespace, .. })));

    c.ns_drop("disk").unwrap();
    assert!(c.ns_list().unwrap().iter().all(|s| s.name != "disk"));
    assert_eq!(server_error(disk.get(&block_key(5))).0, Status::NoSuchNamespace);
}

#[test]
fn pipelined_requests_see_the_namespace_changes_sent_before_them() {
    let srv = server();
    let mut s = raw(srv.local_addr());
    let big: Vec<u8> = (0..50_000u32).map(|i| (i % 7) as u8).collect();
    let big2: Vec<u8> = (0..60_000u32).map(|i| (i % 11) as u8).collect();
    let mut f = Vec::new();
    let put = |key: &'static [u8], value: &'static [u8]| Request::Put { key, value, mode: PutMode::Upsert };
    Request::NsCreate(NamespaceOptions::default()).encode_in(b"p", 1, &mut f);
    put(b"k", b"v").encode_in(b"p", 2, &mut f);
    Request::Put { key: b"big", value: &big, mode: PutMode::Upsert }.encode_in(b"p", 3, &mut f);
    Request::Get(b"k").encode_in(b"p", 4, &mut f);
    // Right behind the barrier: its record buffer is built (for the id
    // the truncate is about to replace) before the truncate runs.
    Request::NsTruncate.encode_in(b"p", 5, &mut f);
    Request::Put { key: b"big", value: &big2, mode: PutMode::CreateOnly }.encode_in(b"p", 7, &mut f);
    Request::Get(b"k").encode_in(b"p", 6, &mut f);
    Request::Get(b"big").encode_in(b"p", 8, &mut f);
    Request::NsDrop.encode_in(b"p", 9, &mut f);
    Request::Get(b"big").encode_in(b"p", 10, &mut f);
    Request::NsCreate(NamespaceOptions::default()).encode_in(b"p", 11, &mut f);
    Request::Put { key: b"big", value: &big, mode: PutMode::CreateOnly }.encode_in(b"p", 12, &mut f);
    Request::Get(b"big").encode_in(b"p", 13, &mut f);
    Request::NsDrop.encode_in(b"p", 14, &mut f);
    Request::Put { key: b"big", value: &big, mode: PutMode::Upsert }.encode_in(b"p", 15, &mut f);
    Request::NsStats.encode_in(b"p", 16, &mut f);
    Request::Nop.encode(17, &mut f);
    let got = exchange(&mut s, &f, 17);
    for id in [1, 2, 3, 5, 7, 9, 11, 12, 14] {
        assert_eq!(got[&id].0, Status::Ok, "request {id}: {}", String::from_utf8_lossy(&got[&id].1));
    }
    assert_eq!(got[&4], (Status::Ok, b"v".to_vec()));
    assert_eq!(got[&6].0, Status::NotFound, "read after the truncate");
    assert!(got[&8] == (Status::Ok, big2.clone()), "the PUT after the truncate");
    assert_eq!(got[&10].0, Status::NoSuchNamespace);
    assert!(got[&13] == (Status::Ok, big.clone()), "the PUT after the drop and create");
    assert_eq!(got[&15].0, Status::NoSuchNamespace, "{}", String::from_utf8_lossy(&got[&15].1));
    assert_eq!(got[&16].0, Status::NoSuchNamespace);
    assert_eq!(srv.stats().bad_frames.load(Relaxed), 0);
}

/// A version 1 client (one offering only version 1) is answered in version
/// 1 and works in the default namespace, the one version 2's plain calls
/// use; version 2's frames and opcodes are malformed on its connection.
#[test]
fn a_version_1_client_works_in_the_default_namespace() {
    let srv = server();
    let v1 = ClientHello { min_version: 1, max_version: 1 };
    let mut s = raw_offering(srv.local_addr(), v1, 1);
    let mut f = Vec::new();
    Request::Put { key: b"old", value: b"v1", mode: PutMode::Upsert }.encode(1, &mut f);
    Request::Get(b"old").encode(2, &mut f);
    Request::MultiGet(vec![b"old", b"none"]).encode(3, &mut f);
    Request::Batch(vec![BatchOp::Delete(b"none")]).encode(4, &mut f);
    Request::Stats.encode(5, &mut f);
    let got = exchange(&mut s, &f, 5);
    assert_eq!(got[&1].0, Status::Ok);
    assert_eq!(got[&2], (Status::Ok, b"v1".to_vec()));
    assert_eq!(proto::decode_entries(&got[&3].1).unwrap().len(), 2);
    assert_eq!(proto::decode_entries(&got[&4].1).unwrap()[0].status, Status::NotFound);
    assert_eq!(got[&5].0, Status::Ok);
    // Shared with version 2's default namespace, not with a named one.
    let c = client(&srv);
    c.ns_create("other", NamespaceOptions::default()).unwrap();
    assert_eq!(c.get(b"old").unwrap().as_deref(), Some(&b"v1"[..]));
    assert_eq!(c.ns("other").get(b"old").unwrap(), None);
    c.put(b"new", b"v2").unwrap();
    let got = exchange(
        &mut s,
        &{
            let mut f = Vec::new();
            Request::Get(b"new").encode(6, &mut f);
            f
        },
        1,
    );
    assert_eq!(got[&6], (Status::Ok, b"v2".to_vec()));
    // A namespace name (header byte 6, reserved in version 1), or a
    // version 2 opcode: a malformed frame.
    for (frame, why) in [
        (
            {
                let mut f = Vec::new();
                Request::Get(b"old").encode_in(b"other", 7, &mut f);
                f
            },
            "reserved",
        ),
        (
            {
                let mut f = Vec::new();
                Request::NsList.encode(7, &mut f);
                f
            },
            "needs protocol version 2",
        ),
    ] {
        let mut s = raw_offering(srv.local_addr(), v1, 1);
        s.write_all(&frame).unwrap();
        let (h, st, body) = read_frame(&mut s).unwrap();
        let msg = String::from_utf8_lossy(&body);
        assert_eq!((h.id, st), (7, Status::BadFrame), "{msg}");
        assert!(msg.contains(why), "{msg}");
        assert!(closed(&mut s));
    }
    // The client offering version 1 only: the default namespace works,
    // namespaces fail before anything is sent.
    let conn = Connection::connect_with(srv.local_addr(), Duration::from_secs(5), v1).unwrap();
    assert_eq!(conn.version(), 1);
    assert_eq!(conn.call(&Request::Get(b"old")).unwrap().body, b"v1");
    assert_eq!(conn.send_in(b"default", &Request::Get(b"new")).unwrap().wait().unwrap().body, b"v2");
    assert!(
        matches!(conn.send_in(b"other", &Request::Get(b"old")), Err(Error::Protocol(m)) if m.contains("version 1"))
    );
    assert!(matches!(conn.send(&Request::NsList), Err(Error::Protocol(m)) if m.contains("NS_LIST")));
    // A range reaching past this server's versions gets its highest.
    let conn = Connection::connect_with(
        srv.local_addr(),
        Duration::from_secs(5),
        ClientHello { min_version: 1, max_version: 9 },
    )
    .unwrap();
    assert_eq!(conn.version(), proto::VERSION);
    assert_eq!(srv.stats().bad_frames.load(Relaxed), 2);
}

/// A write past a namespace's limit gets QUOTA_EXCEEDED, having written
/// nothing, on every write path; the connection goes on.
#[test]
fn quota_exceeded_has_its_status() {
    let srv = server();
    let c = client(&srv);
    c.ns_create("small", NamespaceOptions { max_keys: NonZeroU64::new(2), ..Default::default() }).unwrap();
    c.ns_create("tiny", NamespaceOptions { max_bytes: NonZeroU64::new(8192), ..Default::default() }).unwrap();
    let small = c.ns("small");
    small.put(b"a", b"1").unwrap();
    small.put(b"b", b"2").unwrap();
    let (st, msg) = server_error(small.put(b"c", b"3"));
    assert_eq!(st, Status::QuotaExceeded);
    assert!(msg.contains("small"), "{msg}");
    small.put(b"a", b"overwritten").unwrap();
    let r = small.batch(&[BatchOp::Put { key: b"d", value: b"4", mode: PutMode::Upsert }, BatchOp::Get(b"a")]).unwrap();
    assert!(matches!(&r[0], BatchResult::Failed(Error::Server { status: Status::QuotaExceeded, .. })), "{:?}", r[0]);
    assert!(matches!(&r[1], BatchResult::Value(Some(v)) if v == b"overwritten"));
    assert_eq!(small.get(b"c").unwrap(), None);
    // Bytes: a small value fits, a large one (the zero-copy path) does not.
    let tiny = c.ns("tiny");
    tiny.put(b"s", b"small").unwrap();
    assert_eq!(server_error(tiny.put(b"l", &[1u8; 40_000])).0, Status::QuotaExceeded);
    assert_eq!(server_error(tiny.put(b"m", &[1u8; 9_000])).0, Status::QuotaExceeded);
    assert_eq!(tiny.get(b"l").unwrap(), None);
    assert_eq!(c.ns_stats("tiny").unwrap().keys, 1);
    assert_eq!(c.ns_stats("small").unwrap().keys, 2);
    // The default namespace has no quota.
    c.put(b"c", &[1u8; 40_000]).unwrap();
}

/// The sharded client: namespace changes on every server, keys routed by
/// key as in the default namespace, figures summed.
#[test]
fn sharded_client_namespaces() {
    let servers: Vec<Server> = (0..3).map(|_| server()).collect();
    let names: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let sc = ShardedClient::new(&names, ClientConfig::default()).unwrap();
    sc.ns_create("users", NamespaceOptions::default()).unwrap();
    let direct: Vec<Client> = servers.iter().map(client).collect();
    for d in &direct {
        assert!(d.ns_list().unwrap().iter().any(|s| s.name == "users"));
    }
    let users = sc.ns("users");
    let keys: Vec<Vec<u8>> = (0..300).map(|i| format!("u{i}").into_bytes()).collect();
    let ks: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    for k in &ks {
        users.put(k, k).unwrap();
    }
    for k in &ks {
        let owner = sc.server_of(k);
        for (i, d) in direct.iter().enumerate() {
            assert_eq!(d.ns("users").get(k).unwrap().is_some(), i == owner);
        }
        assert_eq!(sc.get(k).unwrap(), None, "not in the default namespace");
    }
    assert!(users.mget(&ks).unwrap().iter().zip(&keys).all(|(v, k)| v.as_ref() == Some(k)));
    assert_eq!(users.get_many(&ks).unwrap().len(), 300);
    assert_eq!(sc.ns_stats("users").unwrap().keys, 300);
    assert_eq!(users.stats().unwrap().keys, 300);
    let list = sc.ns_list().unwrap();
    assert_eq!(list.iter().map(|s| (s.name.as_str(), s.keys)).collect::<Vec<_>>(), [("default", 0), ("users", 300)]);
    assert_eq!(users.delete_many(&ks[..10]).unwrap(), vec![true; 10]);
    sc.ns_truncate("users").unwrap();
    assert_eq!(sc.ns_stats("users").unwrap().keys, 0);
    // A partial change: the first error, the others keep theirs.
    direct[1].ns_create("partial", NamespaceOptions::default()).unwrap();
    assert_eq!(server_error(sc.ns_create("partial", NamespaceOptions::default())).0, Status::NamespaceExists);
    assert_eq!(direct[0].ns_list().unwrap().len(), 3);
    sc.ns_drop("users").unwrap();
    assert_eq!(server_error(users.get(b"u1")).0, Status::NoSuchNamespace);
    assert_eq!(server_error(sc.ns_stats("users")).0, Status::NoSuchNamespace);
    // A server that fails is reported, not hidden behind another's
    // "exists" (which a caller may take for done).
    direct[0].ns_create("half", NamespaceOptions::default()).unwrap();
    let mut servers = servers;
    drop(servers.pop());
    match sc.ns_create("half", NamespaceOptions::default()) {
        Err(Error::Server { status: Status::NamespaceExists, .. }) | Ok(()) => {
            panic!("the stopped server's failure was hidden")
        }
        Err(_) => {}
    }
}

/// A TXN's answer, which must be an outcome (not an error).
fn txn(c: &Client, ops: &[TxnOp]) -> TxnOutcome {
    c.txn(ops).unwrap_or_else(|e| panic!("TXN failed: {e}"))
}

fn committed(o: TxnOutcome) -> Vec<u64> {
    match o {
        TxnOutcome::Committed { cas } => cas,
        other => panic!("not committed: {other:?}"),
    }
}

/// A TXN over two namespaces and the default one commits all of it, with
/// a CAS value per operation that a later TXN's cas takes; a failed
/// condition (put_absent, put_present, a stale or absent cas) applies
/// nothing and names the operation and how; a key twice (BAD_BATCH), a
/// namespace that does not exist, a quota or a value over the server's
/// limit fail the whole TXN with nothing applied; the connection goes on.
#[test]
fn txn_commits_across_namespaces_all_or_nothing() {
    let srv = server_with(NativeConfig { value_bytes_max: 1000, ..NativeConfig::default() });
    let c = client(&srv);
    c.ns_create("users", NamespaceOptions::default()).unwrap();
    c.ns_create("carts", NamespaceOptions { max_keys: NonZeroU64::new(2), ..Default::default() }).unwrap();
    let (users, carts) = (c.ns("users"), c.ns("carts"));
    c.put(b"gone", b"x").unwrap();
    let cas = committed(txn(
        &c,
        &[
            TxnOp::put("users", b"k", b"u1"),
            TxnOp::put_absent("carts", b"k", b"c1"),
            TxnOp::put("", b"k", b"d1"),
            TxnOp::delete("default", b"gone"),
        ],
    ));
    assert_eq!(cas.len(), 4);
    assert!(cas[0] > 0 && cas[1] > 0 && cas[2] > 0 && cas[3] == 0, "{cas:?}");
    assert_eq!(users.get(b"k").unwrap().as_deref(), Some(&b"u1"[..]));
    assert_eq!(carts.get(b"k").unwrap().as_deref(), Some(&b"c1"[..]));
    assert_eq!(c.get(b"k").unwrap().as_deref(), Some(&b"d1"[..]));
    assert_eq!(c.get(b"gone").unwrap(), None);

    // The CAS values returned are the keys' own: a cas with one commits.
    let cas2 = committed(txn(&c, &[TxnOp::cas("users", b"k", cas[0], b"u2"), TxnOp::put_present("", b"k", b"d2")]));
    assert_eq!(users.get(b"k").unwrap().as_deref(), Some(&b"u2"[..]));
    assert_eq!(c.get(b"k").unwrap().as_deref(), Some(&b"d2"[..]));

    // Failed conditions: nothing applied, the operation and the reason named.
    let before = |c: &Client| {
        (users.get(b"k").unwrap(), carts.get(b"k").unwrap(), c.get(b"k").unwrap(), users.get(b"new").unwrap())
    };
    let snapshot = before(&c);
    for (ops, op, status) in [
        (
            vec![
                TxnOp::put("users", b"new", b"n"),
                TxnOp::put("", b"k", b"no"),
                TxnOp::put_absent("carts", b"k", b"no"),
            ],
            2,
            Status::Exists,
        ),
        (vec![TxnOp::put("users", b"new", b"n"), TxnOp::put_present("users", b"absent", b"no")], 1, Status::NotFound),
        (vec![TxnOp::cas("users", b"k", cas[0], b"stale"), TxnOp::put("users", b"new", b"n")], 0, Status::Exists),
        (vec![TxnOp::put("users", b"new", b"n"), TxnOp::cas("users", b"absent", cas2[0], b"no")], 1, Status::NotFound),
    ] {
        assert_eq!(txn(&c, &ops), TxnOutcome::ConditionFailed { op, status }, "{ops:?}");
        assert_eq!(before(&c), snapshot, "nothing applied: {ops:?}");
    }

    // Refused whole: a key twice (the same key in two namespaces is two keys).
    let (st, msg) = server_error(c.txn(&[TxnOp::put("users", b"new", b"n"), TxnOp::delete("users", b"new")]));
    assert_eq!(st, Status::BadBatch, "{msg}");
    assert!(msg.contains("appears twice") && msg.contains("nothing applied"), "{msg}");
    committed(txn(&c, &[TxnOp::put("users", b"twin", b"u"), TxnOp::put("", b"twin", b"d")]));
    assert_eq!(c.get(b"twin").unwrap().as_deref(), Some(&b"d"[..]));
    // A namespace that does not exist, named by operation.
    let (st, msg) = server_error(c.txn(&[TxnOp::put("users", b"new", b"n"), TxnOp::put("nope", b"k", b"v")]));
    assert_eq!(st, Status::NoSuchNamespace);
    assert!(msg.starts_with("operation 1: "), "{msg}");
    // A quota: carts holds 2 keys at most, and holds 2.
    carts.put(b"full", b"v").unwrap();
    let (st, _) = server_error(c.txn(&[TxnOp::put("users", b"new", b"n"), TxnOp::put("carts", b"c2", b"v")]));
    assert_eq!(st, Status::QuotaExceeded);
    // A value over the server's limit: the client checks; so does the server.
    assert!(matches!(c.txn(&[TxnOp::put("users", b"new", &[0u8; 1001])]), Err(Error::TooLarge { what: "value", .. })));
    let mut s = raw(srv.local_addr());
    let mut f = Vec::new();
    Request::Txn(vec![TxnOp::put("users", b"new", b"n"), TxnOp::put("users", b"big", &[0u8; 1001])]).encode(1, &mut f);
    Request::Txn(vec![TxnOp::put("users", b"new", b""), TxnOp::put("users", b"", b"empty key")]).encode(2, &mut f);
    let got = exchange(&mut s, &f, 2);
    assert_eq!(got[&1].0, Status::ValueTooLarge);
    assert!(String::from_utf8_lossy(&got[&1].1).starts_with("operation 1: "));
    assert_eq!(got[&2].0, Status::KeyInvalid, "{}", String::from_utf8_lossy(&got[&2].1));
    assert_eq!(before(&c), snapshot, "nothing applied by any refused TXN");
    assert_eq!(carts.get(b"c2").unwrap(), None);
    assert_eq!(users.get(b"big").unwrap(), None);
    // Too many operations: the client refuses to send them.
    let keys: Vec<Vec<u8>> = (0..=proto::TXN_OPS_MAX).map(|i| format!("k{i}").into_bytes()).collect();
    let many: Vec<TxnOp> = keys.iter().map(|k| TxnOp::put("", k, b"")).collect();
    assert!(matches!(c.txn(&many), Err(Error::TooLarge { what: "operation count", .. })));
    // 1024 is the limit, and commits.
    assert_eq!(committed(txn(&c, &many[..proto::TXN_OPS_MAX])).len(), proto::TXN_OPS_MAX);
    assert_eq!(c.get(b"k1023").unwrap(), Some(Vec::new()));
    // Empty: committed, nothing to do.
    assert_eq!(txn(&c, &[]), TxnOutcome::Committed { cas: vec![] });

    // Async.
    let o = granary_rt::block_on(c.txn_async(&[TxnOp::put("users", b"async", b"a")])).unwrap();
    assert_eq!(committed(o).len(), 1);
    assert_eq!(users.get(b"async").unwrap().as_deref(), Some(&b"a"[..]));

    let st: std::collections::HashMap<String, String> = c.stats().unwrap().into_iter().collect();
    assert_eq!(st["cmd_txn"], "15", "{st:?}");
    assert_eq!(st["txn_condition_failed"], "4");
    assert_eq!(st["latency_txn_count"], "15");
    assert_eq!(srv.stats().txns.load(Relaxed), 15);
    assert_eq!(srv.stats().bad_frames.load(Relaxed), 0);
}

/// TXNs are ordered per key with the connection's other requests, and see
/// the namespace changes sent before them; a malformed TXN is a BAD_FRAME
/// that closes the connection; a version 1 connection does not know the
/// opcode.
#[test]
fn txn_frames_pipeline_in_order_and_malformed_ones_close_the_connection() {
    let srv = server();
    let mut s = raw(srv.local_addr());
    let mut f = Vec::new();
    Request::NsCreate(NamespaceOptions::default()).encode_in(b"p", 1, &mut f);
    Request::Txn(vec![TxnOp::put("p", b"a", b"1"), TxnOp::put("", b"a", b"d")]).encode(2, &mut f);
    Request::Get(b"a").encode_in(b"p", 3, &mut f);
    Request::Txn(vec![TxnOp::put_absent("p", b"a", b"2")]).encode(4, &mut f);
    Request::Put { key: b"a", value: b"3", mode: PutMode::Upsert }.encode_in(b"p", 5, &mut f);
    Request::Txn(vec![TxnOp::put_present("p", b"a", b"4"), TxnOp::delete("", b"a")]).encode(6, &mut f);
    Request::Get(b"a").encode_in(b"p", 7, &mut f);
    Request::Get(b"a").encode(8, &mut f);
    Request::NsDrop.encode_in(b"p", 9, &mut f);
    Request::Txn(vec![TxnOp::put("", b"b", b"1"), TxnOp::put("p", b"a", b"5")]).encode(10, &mut f);
    Request::Get(b"b").encode(11, &mut f);
    let got = exchange(&mut s, &f, 11);
    assert_eq!(got[&1].0, Status::Ok);
    assert_eq!(got[&2].0, Status::Ok, "{}", String::from_utf8_lossy(&got[&2].1));
    assert_eq!(got[&3], (Status::Ok, b"1".to_vec()));
    assert_eq!(got[&4], (Status::Exists, 0u32.to_le_bytes().to_vec()));
    let TxnOutcome::Committed { cas } = TxnOutcome::decode(got[&6].0, &got[&6].1).unwrap() else { panic!() };
    assert_eq!(cas.len(), 2);
    assert_eq!(got[&7], (Status::Ok, b"4".to_vec()));
    assert_eq!(got[&8].0, Status::NotFound);
    assert_eq!(got[&10].0, Status::NoSuchNamespace, "the drop before it");
    assert_eq!(got[&11].0, Status::NotFound, "nothing of the refused TXN applied");

    // Malformed: an unknown operation kind. The error frame, then the close.
    let mut f = Vec::new();
    Request::Txn(vec![TxnOp::put("", b"k", b"v")]).encode(12, &mut f);
    f[proto::HEADER_BYTES + 4] = 9;
    s.write_all(&f).unwrap();
    let (h, st, body) = read_frame(&mut s).unwrap();
    let msg = String::from_utf8_lossy(&body);
    assert_eq!((h.id, h.op, st), (12, Op::Nop, Status::BadFrame), "{msg}");
    assert!(msg.contains("TXN: operation 0: unknown kind 9"), "{msg}");
    assert!(closed(&mut s));
    // More operations than the engine takes in one batch.
    let mut s = raw(srv.local_addr());
    let keys: Vec<Vec<u8>> = (0..=proto::TXN_OPS_MAX).map(|i| format!("k{i}").into_bytes()).collect();
    let mut f = Vec::new();
    Request::Txn(keys.iter().map(|k| TxnOp::delete("", k)).collect()).encode(13, &mut f);
    s.write_all(&f).unwrap();
    let (h, st, body) = read_frame(&mut s).unwrap();
    assert_eq!((h.id, st), (13, Status::BadFrame));
    assert!(String::from_utf8_lossy(&body).contains("exceed the limit of 1024"));
    assert!(closed(&mut s));

    // A version 1 connection: TXN is an unknown opcode there.
    let v1 = ClientHello { min_version: 1, max_version: 1 };
    let mut s = raw_offering(srv.local_addr(), v1, 1);
    let mut f = Vec::new();
    Request::Txn(vec![TxnOp::put("", b"k", b"v")]).encode(14, &mut f);
    s.write_all(&f).unwrap();
    let (h, st, body) = read_frame(&mut s).unwrap();
    let msg = String::from_utf8_lossy(&body);
    assert_eq!((h.id, st), (14, Status::BadFrame), "{msg}");
    assert!(msg.contains("opcode 13 (TXN) needs protocol version 2"), "{msg}");
    assert!(closed(&mut s));
    let conn = Connection::connect_with(srv.local_addr(), Duration::from_secs(5), v1).unwrap();
    assert!(matches!(conn.send(&Request::Txn(vec![])), Err(Error::Protocol(m)) if m.contains("TXN needs version 2")));
    assert_eq!(client(&srv).get(b"k").unwrap(), None);
    assert_eq!(srv.stats().bad_frames.load(Relaxed), 3);
}

/// The sharded client: a TXN whose keys map to one server goes there; one
/// spanning servers is refused before anything is sent.
#[test]
fn sharded_client_txn_on_one_server_only() {
    let servers: Vec<Server> = (0..3).map(|_| server()).collect();
    let names: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let sc = ShardedClient::new(&names, ClientConfig::default()).unwrap();
    sc.ns_create("users", NamespaceOptions::default()).unwrap();
    let keys: Vec<Vec<u8>> = (0..100).map(|i| format!("t{i}").into_bytes()).collect();
    let on = |s: usize| keys.iter().filter(|k| sc.server_of(k) == s).take(3).collect::<Vec<_>>();
    let (k0, k1) = (on(0), on(1));
    assert!(k0.len() == 3 && !k1.is_empty());
    // Three keys of server 0, one of them in two namespaces.
    let ops = [TxnOp::put("users", k0[0], b"a"), TxnOp::put("", k0[0], b"b"), TxnOp::put_absent("users", k0[1], b"c")];
    assert_eq!(committed(sc.txn(&ops).unwrap()).len(), 3);
    let direct = client(&servers[0]);
    assert_eq!(direct.ns("users").get(k0[0]).unwrap().as_deref(), Some(&b"a"[..]));
    assert_eq!(direct.get(k0[0]).unwrap().as_deref(), Some(&b"b"[..]));
    assert_eq!(sc.ns("users").get(k0[1]).unwrap().as_deref(), Some(&b"c"[..]));
    let o = granary_rt::block_on(sc.txn_async(&[TxnOp::put_absent("users", k0[1], b"again")])).unwrap();
    assert_eq!(o, TxnOutcome::ConditionFailed { op: 0, status: Status::Exists });
    // Spanning two servers: refused, nothing sent.
    let e = sc.txn(&[TxnOp::put("users", k0[2], b"x"), TxnOp::put("users", k1[0], b"y")]).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(&e, Error::CrossServerTxn { servers } if servers.len() == 2), "{msg}");
    assert!(msg.contains(&names[0]) && msg.contains(&names[1]) && msg.contains("no distributed transactions"), "{msg}");
    assert_eq!(sc.ns("users").get(k0[2]).unwrap(), None);
    assert_eq!(sc.ns("users").get(k1[0]).unwrap(), None);
    let st: std::collections::HashMap<String, String> = direct.stats().unwrap().into_iter().collect();
    assert_eq!(st["cmd_txn"], "2");
}

/// A memory device whose reads panic while armed and the bytes read hold
/// `MARK`: a bug inside a request's task, for the test below.
struct PanickingDevice {
    inner: MemDevice,
    armed: std::sync::atomic::AtomicBool,
}

const MARK: &[u8] = b"a value whose reading panics";

impl granary_store::io::Device for PanickingDevice {
    fn read_at(&self, buf: granary_store::io::AlignedBuf, offset: u64) -> granary_store::io::IoResult {
        let (buf, r) = self.inner.read_at(buf, offset);
        if self.armed.load(Relaxed) && buf.windows(MARK.len()).any(|w| w == MARK) {
            panic!("reading the marked value (a test's planted bug)");
        }
        (buf, r)
    }
    fn write_at(&self, buf: granary_store::io::AlignedBuf, offset: u64) -> granary_store::io::IoResult {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn block_bytes(&self) -> u32 {
        self.inner.block_bytes()
    }
    fn counters(&self) -> &granary_store::io::IoCounters {
        self.inner.counters()
    }
    fn describe(&self) -> String {
        "a memory device that panics on reading a marked value".into()
    }
}

#[test]
fn a_request_whose_task_panics_closes_its_connection_after_the_others_responses() {
    let dev = Arc::new(PanickingDevice { inner: MemDevice::new(64 << 20), armed: false.into() });
    let c = CreateOptions { segment_bytes: Some(4 << 20), grain_bytes: Some(512), ..CreateOptions::default() };
    let st = Arc::new(Store::create(dev.clone(), &c, &OpenOptions::default()).unwrap());
    let cfg = NativeConfig {
        listen: ([127, 0, 0, 1], granary_rt::net::free_low_port().unwrap()).into(),
        threads: 1,
        ..NativeConfig::default()
    };
    let srv = Server::start(st, cfg).unwrap();
    let cl = client(&srv);
    cl.put(b"bad", MARK).unwrap();
    cl.put(b"good", b"fine").unwrap();
    dev.armed.store(true, Relaxed);
    // A PUT, the GET that panics, and a PUT of the same key sent after it
    // (it waits for the GET it conflicts with), in one write: the first
    // PUT is answered, the GET never is, the last PUT never starts, and
    // the connection ends rather than leave the client waiting.
    let mut s = raw(srv.local_addr());
    let mut f = Vec::new();
    Request::Put { key: b"before", value: b"1", mode: PutMode::Upsert }.encode(1, &mut f);
    Request::Get(b"bad").encode(2, &mut f);
    Request::Put { key: b"bad", value: b"after", mode: PutMode::Upsert }.encode(3, &mut f);
    s.write_all(&f).unwrap();
    // The PUT's response, then the end of the stream (not the read
    // timeout: a client left waiting).
    let (h, st, _) = read_frame(&mut s).expect("the PUT's response");
    assert_eq!((h.id, st), (1, Status::Ok));
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => {}
        Ok(_) => panic!("a response after the PUT's"),
        Err(e) => panic!("the stream did not end ({e}): the client is left waiting"),
    }
    // The server and its other connections go on.
    dev.armed.store(false, Relaxed);
    let cl = client(&srv);
    assert_eq!(cl.get(b"good").unwrap().as_deref(), Some(&b"fine"[..]));
    assert_eq!(cl.get(b"before").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(cl.get(b"bad").unwrap().as_deref(), Some(MARK), "the PUT after the panic never ran");
    srv.shutdown();
}

/// `put_many`, `get_many` and `delete_many` send each server's requests on
/// one of its connections, in order: with a pool of several connections,
/// two writes of a key in one call take effect as given (round robin over
/// the pool put them on two connections, which the server runs in either
/// order).
#[test]
fn a_sharded_put_many_writes_a_key_twice_in_the_order_given() {
    let servers: Vec<Server> = (0..2).map(|_| server()).collect();
    let names: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let sc = ShardedClient::new(&names, ClientConfig { connections: 4, ..ClientConfig::default() }).unwrap();
    let keys: Vec<Vec<u8>> = (0..200).map(|i| format!("k{i}").into_bytes()).collect();
    for round in 0..20 {
        let (a, b) = (format!("a{round}").into_bytes(), format!("b{round}").into_bytes());
        let items: Vec<(&[u8], &[u8])> = keys.iter().flat_map(|k| [(&k[..], &a[..]), (&k[..], &b[..])]).collect();
        sc.put_many(&items).unwrap();
        let ks: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        let got = sc.get_many(&ks).unwrap();
        let late = got.iter().filter(|v| v.as_deref() != Some(&b[..])).count();
        assert_eq!(late, 0, "round {round}: {late} keys kept their first value");
    }
}

/// A waker that panics (its executor gone) when the reply comes does not
/// end the connection's reader: the connection still answers, and still
/// times requests out.
#[test]
fn a_panicking_waker_leaves_the_connection_working() {
    use std::future::Future;
    struct Panics;
    impl std::task::Wake for Panics {
        fn wake(self: Arc<Self>) {
            panic!("this executor is gone");
        }
    }
    let s = server();
    let c = Arc::new(client(&s));
    c.put(b"k", b"v").unwrap();
    let waker = std::task::Waker::from(Arc::new(Panics));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = Box::pin(c.get_async(b"k"));
    // Polled once: its waker is registered, and the reply wakes it.
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    // On a thread of its own, left behind if it hangs: the test fails at
    // the timeout instead of waiting for it.
    let (tx, rx) = std::sync::mpsc::channel();
    let c2 = c.clone();
    std::thread::spawn(move || {
        for _ in 0..50 {
            let _ = tx.send(c2.get(b"k"));
        }
    });
    for i in 0..50 {
        let r = rx.recv_timeout(Duration::from_secs(30)).expect("a request after the panic never finished");
        assert_eq!(r.unwrap(), Some(b"v".to_vec()), "request {i}");
    }
}

/// A request the server answers BAD_FRAME ends the connection on the
/// client's side at once (the server reads nothing more after it): the
/// pool replaces it instead of sending more requests that would never run.
#[test]
fn a_rejected_frame_ends_the_connection_at_once() {
    let addr = fake_server(|mut s| {
        let mut h = [0u8; proto::HEADER_BYTES];
        if s.read_exact(&mut h).is_err() {
            return;
        }
        let hd = Header::decode(&h, u32::MAX, proto::VERSION).unwrap();
        let mut body = vec![0u8; hd.len as usize];
        s.read_exact(&mut body).unwrap();
        let mut out = Vec::new();
        proto::encode_response(&mut out, hd.op, Status::BadFrame, hd.id, b"not understood");
        s.write_all(&out).unwrap();
        // The stream stays open: only the reply says the connection is over.
        let _ = s.read(&mut [0u8; 1]);
    });
    let cfg = ClientConfig { connections: 1, ..ClientConfig::default() };
    let c = Client::connect(addr, cfg).unwrap();
    let conn = c.conn().unwrap();
    assert!(c.get(b"k").is_err());
    // Dead before the caller woke: it never takes the connection again.
    assert!(!conn.is_alive(), "the connection stayed in the pool after BAD_FRAME");
}
