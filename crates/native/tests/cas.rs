//! GETS and DELETE_CAS (protocol version 3) over loopback: a key's CAS
//! value, flags and expiry read back through the client, on the zero-copy
//! path too, deletes conditioned on the CAS value, in a namespace and on a
//! sharded client, and as a TXN's delete_cas operation (kind 6); and the
//! version rules: a version 2 connection never sends them (the client
//! refuses before sending) and a server answers them `BAD_FRAME` on one.

use granary_client::{Client, ClientConfig, Connection, Error, Item, NamespaceOptions, Request, ShardedClient, Status};
use granary_client::{TxnOp, TxnOutcome};
use granary_native::{NativeConfig, Server};
use granary_proto::{self as proto, ClientHello, ServerHello};
use granary_store::io::MemDevice;
use granary_store::{Cond, CreateOptions, ItemMeta, OpenOptions, Store};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

fn store() -> Arc<Store> {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let c = CreateOptions { segment_bytes: Some(4 << 20), grain_bytes: Some(512), ..CreateOptions::default() };
    Arc::new(Store::create(dev, &c, &OpenOptions::default()).unwrap())
}

fn server_on(store: Arc<Store>) -> Server {
    let listen = ([127, 0, 0, 1], granary_rt::net::free_low_port().unwrap()).into();
    Server::start(store, NativeConfig { listen, threads: 2, ..NativeConfig::default() }).unwrap()
}

fn client(s: &Server) -> Client {
    Client::connect(s.local_addr(), ClientConfig::default()).unwrap()
}

#[test]
fn get_cas_reads_the_cas_value_and_delete_cas_obeys_it() {
    let st = store();
    let srv = server_on(st.clone());
    let c = client(&srv);
    assert_eq!(c.conn().unwrap().version(), proto::VERSION);
    assert_eq!(c.get_cas(b"none").unwrap(), None);
    c.put(b"k", b"v1").unwrap();
    let a = c.get_cas(b"k").unwrap().expect("a value");
    assert_eq!((a.value.as_slice(), a.flags, a.expires), (&b"v1"[..], 0, 0));
    // Every write gives a new CAS value; a read does not.
    assert_eq!(c.get_cas(b"k").unwrap().unwrap().cas, a.cas);
    c.put(b"k", b"v2").unwrap();
    let b = c.get_cas(b"k").unwrap().unwrap();
    assert_ne!(b.cas, a.cas);
    // The CAS value a TXN returns is the one GETS reads, and the other way.
    let cas = match c.txn(&[TxnOp::cas("", b"k", b.cas, b"v3")]).unwrap() {
        TxnOutcome::Committed { cas } => cas[0],
        o => panic!("{o:?}"),
    };
    assert_eq!(c.get_cas(b"k").unwrap().unwrap(), Item { value: b"v3".to_vec(), cas, flags: 0, expires: 0 });
    // A stale CAS value deletes nothing; the current one deletes; then the
    // key holds nothing to delete.
    assert!(!c.delete_cas(b"k", b.cas).unwrap());
    assert_eq!(c.get(b"k").unwrap().as_deref(), Some(&b"v3"[..]));
    assert!(c.delete_cas(b"k", cas).unwrap());
    assert_eq!(c.get(b"k").unwrap(), None);
    assert!(!c.delete_cas(b"k", cas).unwrap());

    // Flags and expiry written by another protocol (here the engine, as
    // the Memcache listener writes them) come back with the value.
    let expires = 4_000_000_000;
    st.put_item(b"mc", b"m", ItemMeta::new(0xdead_beef, expires), Cond::Always).unwrap();
    let m = c.get_cas(b"mc").unwrap().unwrap();
    assert_eq!((m.value.as_slice(), m.flags, m.expires), (&b"m"[..], 0xdead_beef, expires));
    assert_eq!(st.get_item(b"mc").unwrap().unwrap().cas, m.cas);

    // A large value, sent from the buffer the device read it into.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    c.put(b"big", &big).unwrap();
    let zero_copy = srv.stats().zero_copy_gets.load(Relaxed);
    let g = c.get_cas(b"big").unwrap().unwrap();
    assert_eq!(g.value, big);
    assert!(srv.stats().zero_copy_gets.load(Relaxed) > zero_copy);
    assert_eq!(g.cas, st.get_item(b"big").unwrap().unwrap().cas);

    // In a namespace: its own keys.
    c.ns_create("users", NamespaceOptions::default()).unwrap();
    let users = c.ns("users");
    users.put(b"k", b"u").unwrap();
    assert_eq!(c.get_cas(b"k").unwrap(), None);
    let u = users.get_cas(b"k").unwrap().unwrap();
    assert_eq!(u.value, b"u");
    assert!(!c.delete_cas(b"k", u.cas).unwrap(), "the default namespace's k holds nothing");
    assert!(users.delete_cas(b"k", u.cas).unwrap());
    assert_eq!(users.get(b"k").unwrap(), None);
    assert!(matches!(c.ns("nope").get_cas(b"k"), Err(Error::Server { status: Status::NoSuchNamespace, .. })));

    // Async, and the client's checks before sending.
    c.put(b"a", b"x").unwrap();
    let it = granary_rt::block_on(c.get_cas_async(b"a")).unwrap().unwrap();
    assert!(!granary_rt::block_on(c.delete_cas_async(b"a", it.cas + 1)).unwrap());
    assert!(granary_rt::block_on(c.delete_cas_async(b"a", it.cas)).unwrap());
    assert!(matches!(c.get_cas(b""), Err(Error::TooLarge { what: "key", .. })));
    assert!(matches!(c.delete_cas(&[b'k'; 70_000], 1), Err(Error::TooLarge { what: "key", .. })));

    // Counted as GETs and DELETEs.
    let s = srv.stats();
    assert!(s.gets.load(Relaxed) >= 10 && s.deletes.load(Relaxed) >= 7);
}

/// A key's value read over a fresh connection.
fn srv_get(srv: &Server, key: &[u8]) -> Option<Vec<u8>> {
    client(srv).get(key).unwrap()
}

#[test]
fn a_txn_delete_cas_deletes_only_at_its_cas_value() {
    let srv = server_on(store());
    let c = client(&srv);
    c.ns_create("users", NamespaceOptions::default()).unwrap();
    c.put(b"k", b"v").unwrap();
    c.ns("users").put(b"u", b"x").unwrap();
    let k = c.get_cas(b"k").unwrap().unwrap().cas;
    let u = c.ns("users").get_cas(b"u").unwrap().unwrap().cas;

    // A stale CAS value: the whole TXN fails EXISTS at that operation, and
    // nothing is applied (the put before it, the delete_cas of u after).
    let stale = [TxnOp::put("", b"new", b"1"), TxnOp::delete_cas("", b"k", k + 1), TxnOp::delete_cas("users", b"u", u)];
    assert_eq!(c.txn(&stale).unwrap(), TxnOutcome::ConditionFailed { op: 1, status: Status::Exists });
    assert_eq!(c.get(b"new").unwrap(), None);
    assert_eq!(c.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    assert_eq!(c.ns("users").get(b"u").unwrap().as_deref(), Some(&b"x"[..]));
    // A key holding no value: NOT_FOUND.
    let absent = [TxnOp::delete_cas("", b"none", k)];
    assert_eq!(c.txn(&absent).unwrap(), TxnOutcome::ConditionFailed { op: 0, status: Status::NotFound });

    // The right CAS values: both deleted, with the put, atomically.
    let right = [TxnOp::put("", b"new", b"1"), TxnOp::delete_cas("", b"k", k), TxnOp::delete_cas("users", b"u", u)];
    let TxnOutcome::Committed { cas } = c.txn(&right).unwrap() else { panic!("not committed") };
    assert_eq!((cas.len(), cas[1], cas[2]), (3, 0, 0));
    assert_ne!(cas[0], 0);
    assert_eq!(c.get(b"k").unwrap(), None);
    assert_eq!(c.ns("users").get(b"u").unwrap(), None);
    assert_eq!(c.get_cas(b"new").unwrap().unwrap().cas, cas[0]);
    // Once deleted, the same delete_cas finds no value.
    assert_eq!(c.txn(&right[1..2]).unwrap(), TxnOutcome::ConditionFailed { op: 0, status: Status::NotFound });
    // Async too.
    let n = c.get_cas(b"new").unwrap().unwrap().cas;
    let op = [TxnOp::delete_cas("", b"new", n)];
    assert_eq!(granary_rt::block_on(c.txn_async(&op)).unwrap(), TxnOutcome::Committed { cas: vec![0] });
}

#[test]
fn a_version_2_connection_has_no_gets_or_delete_cas() {
    let srv = server_on(store());
    // A client offering 1 to 2 (what a version 2 client offers) gets
    // version 2 and is refused the version 3 requests before sending.
    let v2 = ClientHello { min_version: 1, max_version: 2 };
    let conn = Connection::connect_with(srv.local_addr(), Duration::from_secs(5), v2).unwrap();
    assert_eq!(conn.version(), 2);
    let txn = Request::Txn(vec![TxnOp::put("", b"a", b"v"), TxnOp::delete_cas("", b"k", 1)]);
    for r in [Request::Gets(b"k"), Request::DeleteCas { key: b"k", cas: 1 }, txn.clone()] {
        match conn.send(&r) {
            Err(Error::Protocol(m)) => assert!(m.contains("needs version 3"), "{m}"),
            Err(e) => panic!("{:?}: {e}", r.op()),
            Ok(_) => panic!("{:?} was sent on a version 2 connection", r.op()),
        }
    }
    assert!(conn.call(&Request::Get(b"k")).is_ok(), "the connection goes on");
    // A TXN without delete_cas is version 2's, and sent.
    let plain = Request::Txn(vec![TxnOp::delete("", b"k")]);
    assert_eq!(conn.call(&plain).unwrap().status, Status::Ok);

    // On the wire: a version 2 connection's GETS frame, or TXN with a
    // delete_cas, is malformed (the server closes the connection, nothing
    // applied); a version 3 one is answered.
    for (version, ok, req) in
        [(2, false, &Request::Gets(b"k")), (3, true, &Request::Gets(b"k")), (2, false, &txn), (3, true, &txn)]
    {
        let mut s = TcpStream::connect(srv.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&ClientHello { min_version: 1, max_version: version }.encode()).unwrap();
        let mut b = [0u8; proto::SERVER_HELLO_BYTES];
        s.read_exact(&mut b).unwrap();
        assert_eq!(ServerHello::decode(&b).unwrap().version, version);
        let mut f = Vec::new();
        req.encode(5, &mut f);
        s.write_all(&f).unwrap();
        let mut h = [0u8; proto::HEADER_BYTES];
        s.read_exact(&mut h).unwrap();
        let (hd, st) = proto::Response::decode_header(&h, u32::MAX).unwrap();
        let mut body = vec![0u8; hd.len as usize];
        s.read_exact(&mut body).unwrap();
        if ok && req.op() == proto::Op::Txn {
            // The delete_cas (operation 1) of a key holding no value.
            assert_eq!((hd.id, st, body.as_slice()), (5, Status::NotFound, &[1, 0, 0, 0][..]));
        } else if ok {
            assert_eq!((hd.id, st, body.len()), (5, Status::NotFound, 0));
        } else {
            assert_eq!((hd.id, st), (5, Status::BadFrame));
            assert!(String::from_utf8_lossy(&body).contains("needs protocol version 3"));
            assert_eq!(srv_get(&srv, b"a"), None, "nothing applied");
            let mut one = [0u8; 1];
            assert!(matches!(s.read(&mut one), Ok(0) | Err(_)), "the connection is closed");
        }
    }
}

#[test]
fn sharded_get_cas_and_delete_cas_go_to_the_key_s_server() {
    let servers: Vec<Server> = (0..2).map(|_| server_on(store())).collect();
    let names: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let sc = ShardedClient::new(&names, ClientConfig::default()).unwrap();
    let direct: Vec<Client> = servers.iter().map(client).collect();
    sc.ns_create("users", NamespaceOptions::default()).unwrap();
    for i in 0..40 {
        let k = format!("key:{i}").into_bytes();
        sc.put(&k, &k).unwrap();
        sc.ns("users").put(&k, b"u").unwrap();
        let it = sc.get_cas(&k).unwrap().unwrap();
        assert_eq!(it, direct[sc.server_of(&k)].get_cas(&k).unwrap().unwrap());
        let u = sc.ns("users").get_cas(&k).unwrap().unwrap();
        assert_eq!(u.value, b"u");
        assert!(!sc.delete_cas(&k, it.cas ^ 1).unwrap());
        assert!(sc.delete_cas(&k, it.cas).unwrap());
        assert!(sc.ns("users").delete_cas(&k, u.cas).unwrap());
        assert_eq!((sc.get(&k).unwrap(), sc.ns("users").get(&k).unwrap()), (None, None));
    }
    assert!(servers.iter().all(|s| s.stats().deletes.load(Relaxed) > 0), "both servers own keys");
}
