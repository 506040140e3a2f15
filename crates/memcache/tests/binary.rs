//! The binary protocol, end to end: raw requests and responses for every
//! opcode (quiet variants, CAS, errors, pipelining, bad input), the same
//! random requests against a real memcached, memccapable's binary tests
//! and pylibmc in binary mode.

mod common;

use common::{peer, Client, Fixture};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const GET: u8 = 0x00;
const SET: u8 = 0x01;
const ADD: u8 = 0x02;
const REPLACE: u8 = 0x03;
const DELETE: u8 = 0x04;
const INCR: u8 = 0x05;
const DECR: u8 = 0x06;
const QUIT: u8 = 0x07;
const FLUSH: u8 = 0x08;
const GETQ: u8 = 0x09;
const NOOP: u8 = 0x0a;
const VERSION: u8 = 0x0b;
const GETK: u8 = 0x0c;
const GETKQ: u8 = 0x0d;
const APPEND: u8 = 0x0e;
const PREPEND: u8 = 0x0f;
const STAT: u8 = 0x10;
const SETQ: u8 = 0x11;
const ADDQ: u8 = 0x12;
const REPLACEQ: u8 = 0x13;
const DELETEQ: u8 = 0x14;
const INCRQ: u8 = 0x15;
const DECRQ: u8 = 0x16;
const QUITQ: u8 = 0x17;
const FLUSHQ: u8 = 0x18;
const APPENDQ: u8 = 0x19;
const PREPENDQ: u8 = 0x1a;
const VERBOSITY: u8 = 0x1b;
const TOUCH: u8 = 0x1c;
const GAT: u8 = 0x1d;
const GATQ: u8 = 0x1e;
const GATK: u8 = 0x23;
const GATKQ: u8 = 0x24;

/// A request: header (magic 0x80) and body.
fn req(op: u8, extras: &[u8], key: &[u8], value: &[u8], cas: u64, opaque: u32) -> Vec<u8> {
    let mut b = vec![0x80, op];
    b.extend_from_slice(&(key.len() as u16).to_be_bytes());
    b.push(extras.len() as u8);
    b.extend_from_slice(&[0, 0, 0]);
    b.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
    b.extend_from_slice(&opaque.to_be_bytes());
    b.extend_from_slice(&cas.to_be_bytes());
    [b, extras.to_vec(), key.to_vec(), value.to_vec()].concat()
}

fn set_extras(flags: u32, exp: u32) -> Vec<u8> {
    [flags.to_be_bytes(), exp.to_be_bytes()].concat()
}

fn arith_extras(delta: u64, initial: u64, exp: u32) -> Vec<u8> {
    [&delta.to_be_bytes()[..], &initial.to_be_bytes(), &exp.to_be_bytes()].concat()
}

/// A response, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Resp {
    op: u8,
    status: u16,
    opaque: u32,
    cas: u64,
    extras: Vec<u8>,
    key: Vec<u8>,
    value: Vec<u8>,
}

/// A raw binary connection.
struct Bin {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Bin {
    fn connect(addr: SocketAddr) -> Bin {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_nodelay(true).unwrap();
        Bin { s, buf: Vec::new() }
    }

    fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap();
    }

    /// The next response; None if the connection closed first.
    fn read(&mut self) -> Option<Resp> {
        loop {
            if self.buf.len() >= 24 {
                let b = &self.buf;
                assert_eq!(b[0], 0x81, "response magic");
                let kl = u16::from_be_bytes([b[2], b[3]]) as usize;
                let el = b[4] as usize;
                let bl = u32::from_be_bytes([b[8], b[9], b[10], b[11]]) as usize;
                if b.len() >= 24 + bl {
                    let r = Resp {
                        op: b[1],
                        status: u16::from_be_bytes([b[6], b[7]]),
                        opaque: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
                        cas: u64::from_be_bytes(b[16..24].try_into().unwrap()),
                        extras: b[24..24 + el].to_vec(),
                        key: b[24 + el..24 + el + kl].to_vec(),
                        value: b[24 + el + kl..24 + bl].to_vec(),
                    };
                    self.buf.drain(..24 + bl);
                    return Some(r);
                }
            }
            let mut chunk = [0u8; 65536];
            match self.s.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Send `reqs` and a noop; every response before the noop's.
    fn call(&mut self, reqs: &[u8]) -> Vec<Resp> {
        let (got, closed) = self.try_call(reqs);
        assert!(!closed, "connection closed before the noop's response; got {got:?}");
        got
    }

    /// Send `reqs` and a noop; every response before the noop's, and
    /// whether the connection closed before it.
    fn try_call(&mut self, reqs: &[u8]) -> (Vec<Resp>, bool) {
        self.send(&[reqs, &req(NOOP, b"", b"", b"", 0, 0xfeed)].concat());
        let mut got = Vec::new();
        loop {
            match self.read() {
                None => return (got, true),
                Some(r) if r.op == NOOP && r.opaque == 0xfeed => return (got, false),
                Some(r) => got.push(r),
            }
        }
    }

    /// One request, one response.
    fn one(&mut self, op: u8, extras: &[u8], key: &[u8], value: &[u8], cas: u64) -> Resp {
        let mut got = self.call(&req(op, extras, key, value, cas, 0x1234));
        assert_eq!(got.len(), 1, "responses to {op:#x}: {got:?}");
        let r = got.remove(0);
        assert_eq!((r.op, r.opaque), (op, 0x1234), "echoed opcode and opaque");
        r
    }

    /// Until the server closes: the responses before.
    fn read_to_close(&mut self) -> Vec<Resp> {
        let mut got = Vec::new();
        while let Some(r) = self.read() {
            got.push(r);
        }
        got
    }
}

fn ok(r: &Resp) {
    assert_eq!(r.status, 0, "{r:?} (value {:?})", String::from_utf8_lossy(&r.value));
}

fn err(r: &Resp, status: u16, text: &str) {
    assert_eq!((r.status, String::from_utf8_lossy(&r.value).as_ref()), (status, text), "{r:?}");
}

#[test]
fn every_opcode_answers_as_memcached() {
    let f = Fixture::default();
    let mut c = Bin::connect(f.addr);

    // set, get, getk: flags, CAS value, key echoed only by getk.
    let r = c.one(SET, &set_extras(0xdeadbeef, 0), b"k", b"hello", 0);
    ok(&r);
    assert!(r.cas != 0 && r.value.is_empty() && r.extras.is_empty());
    let cas = r.cas;
    let g = c.one(GET, b"", b"k", b"", 0);
    ok(&g);
    assert_eq!(
        (g.extras.as_slice(), g.key.as_slice(), g.value.as_slice(), g.cas),
        (&0xdeadbeefu32.to_be_bytes()[..], &b""[..], &b"hello"[..], cas)
    );
    let g = c.one(GETK, b"", b"k", b"", 0);
    assert_eq!((g.key.as_slice(), g.value.as_slice()), (&b"k"[..], &b"hello"[..]));
    err(&c.one(GET, b"", b"nope", b"", 0), 1, "Not found");
    // getk's miss carries the key, no text.
    let m = c.one(GETK, b"", b"nope", b"", 0);
    assert_eq!((m.status, m.key.as_slice(), m.value.as_slice()), (1, &b"nope"[..], &b""[..]));

    // add, replace.
    err(&c.one(ADD, &set_extras(0, 0), b"k", b"x", 0), 2, "Data exists for key.");
    ok(&c.one(ADD, &set_extras(0, 0), b"a", b"x", 0));
    err(&c.one(REPLACE, &set_extras(0, 0), b"nope", b"x", 0), 1, "Not found");
    ok(&c.one(REPLACE, &set_extras(7, 0), b"a", b"y", 0));

    // CAS: a stale value is refused, the current one accepted; a missing key.
    let cur = c.one(GET, b"", b"k", b"", 0).cas;
    err(&c.one(SET, &set_extras(0, 0), b"k", b"v2", cur + 1000), 2, "Data exists for key.");
    let r = c.one(SET, &set_extras(0, 0), b"k", b"v2", cur);
    ok(&r);
    assert_ne!(r.cas, cur);
    err(&c.one(SET, &set_extras(0, 0), b"nope", b"v", 5), 1, "Not found");

    // append, prepend (a miss is "Not stored."); CAS honoured.
    ok(&c.one(APPEND, b"", b"k", b"!", 0));
    ok(&c.one(PREPEND, b"", b"k", b"<", 0));
    assert_eq!(c.one(GET, b"", b"k", b"", 0).value, b"<v2!");
    err(&c.one(APPEND, b"", b"nope", b"x", 0), 5, "Not stored.");
    err(&c.one(APPEND, b"", b"k", b"x", 1), 2, "Data exists for key.");

    // incr, decr: 8-byte results, creation with the initial value, no
    // creation with expiration 0xffffffff, non-numeric values.
    let r = c.one(INCR, &arith_extras(1, 10, 0), b"n", b"", 0);
    ok(&r);
    assert_eq!(r.value, 10u64.to_be_bytes());
    assert_eq!(c.one(INCR, &arith_extras(5, 0, 0), b"n", b"", 0).value, 15u64.to_be_bytes());
    assert_eq!(c.one(DECR, &arith_extras(100, 0, 0), b"n", b"", 0).value, 0u64.to_be_bytes());
    err(&c.one(INCR, &arith_extras(1, 0, 0xffff_ffff), b"none", b"", 0), 1, "Not found");
    err(&c.one(INCR, &arith_extras(1, 0, 0), b"k", b"", 0), 6, "Non-numeric server-side value for incr or decr");
    let ncas = c.one(GET, b"", b"n", b"", 0).cas;
    err(&c.one(INCR, &arith_extras(1, 0, 0), b"n", b"", ncas + 1), 2, "Data exists for key.");
    ok(&c.one(INCR, &arith_extras(1, 0, 0), b"n", b"", ncas));

    // touch, gat, gatk: the CAS value is kept.
    let before = c.one(GET, b"", b"a", b"", 0);
    let t = c.one(TOUCH, &100u32.to_be_bytes(), b"a", b"", 0);
    ok(&t);
    err(&c.one(TOUCH, &100u32.to_be_bytes(), b"nope", b"", 0), 1, "Not found");
    let g = c.one(GAT, &100u32.to_be_bytes(), b"a", b"", 0);
    assert_eq!(
        (g.status, g.value.as_slice(), g.cas, g.extras.as_slice()),
        (0, &b"y"[..], before.cas, &7u32.to_be_bytes()[..])
    );
    let g = c.one(GATK, &100u32.to_be_bytes(), b"a", b"", 0);
    assert_eq!((g.key.as_slice(), g.value.as_slice()), (&b"a"[..], &b"y"[..]));
    err(&c.one(GAT, &0u32.to_be_bytes(), b"nope", b"", 0), 1, "Not found");
    // Expiry: relative seconds, as the text protocol.
    f.advance(101);
    err(&c.one(GET, b"", b"a", b"", 0), 1, "Not found");

    // delete, with CAS.
    let kc = c.one(GET, b"", b"k", b"", 0).cas;
    err(&c.one(DELETE, b"", b"k", b"", kc + 1), 2, "Data exists for key.");
    ok(&c.one(DELETE, b"", b"k", b"", kc));
    err(&c.one(DELETE, b"", b"k", b"", 0), 1, "Not found");

    // version, verbosity, noop, stat.
    let v = c.one(VERSION, b"", b"", b"", 0);
    assert!(v.value.starts_with(b"1.6"), "{v:?}");
    ok(&c.one(VERBOSITY, &1u32.to_be_bytes(), b"", b"", 0));
    let stats = c.call(&req(STAT, b"", b"", b"", 0, 9));
    let last = stats.last().unwrap();
    assert!(last.key.is_empty() && last.value.is_empty() && stats.len() > 10);
    assert!(stats.iter().any(|r| r.key == b"cmd_get"));
    let s = c.call(&req(STAT, b"", b"settings", b"", 0, 9));
    assert!(s.iter().any(|r| r.key == b"item_size_max"));
    assert_eq!(c.call(&req(STAT, b"", b"reset", b"", 0, 9)).len(), 1);
    err(&c.one(STAT, b"", b"bogus", b"", 0), 1, "Not found");
    // The groups as memcached 1.6.18 answers them (checked against it):
    // prefixes of reset and settings, detail's forms, sizes.
    let mut kv = |group: &[u8]| -> Vec<(Vec<u8>, Vec<u8>)> {
        c.call(&req(STAT, b"", group, b"", 0, 9)).into_iter().map(|r| (r.key, r.value)).collect()
    };
    let end = (Vec::new(), Vec::new());
    assert_eq!(kv(b"resetX"), std::slice::from_ref(&end));
    assert!(kv(b"settingsX").iter().any(|(k, _)| k == b"item_size_max"));
    assert_eq!(kv(b"detail on"), std::slice::from_ref(&end));
    assert_eq!(kv(b"detail off"), std::slice::from_ref(&end));
    let dump = (b"detailed".to_vec(), b"END\r\n".to_vec());
    assert_eq!(kv(b"detail dump"), [dump, end.clone()]);
    assert_eq!(kv(b"sizes"), [(b"sizes_status".to_vec(), b"disabled".to_vec()), end]);
    err(&c.one(STAT, b"", b"detailX", b"", 0), 1, "Not found");
    err(&c.one(STAT, b"", b"detail", b"", 0), 1, "Not found");

    // flush, with and without an expiration.
    ok(&c.one(SET, &set_extras(0, 0), b"f", b"1", 0));
    ok(&c.one(FLUSH, b"", b"", b"", 0));
    err(&c.one(GET, b"", b"f", b"", 0), 1, "Not found");
    ok(&c.one(FLUSH, &0u32.to_be_bytes(), b"", b"", 0));

    // quit: its response, then the close.
    c.send(&req(QUIT, b"", b"", b"", 0, 3));
    let got = c.read_to_close();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].op, got[0].status), (QUIT, 0));
    let mut q = Bin::connect(f.addr);
    q.send(&req(QUITQ, b"", b"", b"", 0, 3));
    assert!(q.read_to_close().is_empty());
}

#[test]
fn quiet_variants_answer_only_errors() {
    let f = Fixture::default();
    let mut c = Bin::connect(f.addr);
    let ex = set_extras(0, 0);
    let got = c.call(
        &[
            req(SETQ, &ex, b"q", b"v", 0, 1),
            req(ADDQ, &ex, b"q", b"v", 0, 2),                     // error: exists
            req(REPLACEQ, &ex, b"q", b"w", 0, 3),                 // ok
            req(APPENDQ, b"", b"q", b"x", 0, 4),                  // ok
            req(PREPENDQ, b"", b"q", b"<", 0, 5),                 // ok
            req(PREPENDQ, b"", b"z", b"<", 0, 6),                 // error: not stored
            req(GETQ, b"", b"q", b"", 0, 7),                      // hit
            req(GETQ, b"", b"z", b"", 0, 8),                      // miss: nothing
            req(GETKQ, b"", b"q", b"", 0, 9),                     // hit with key
            req(INCRQ, &arith_extras(1, 5, 0), b"n", b"", 0, 10), // created
            req(DECRQ, &arith_extras(1, 0, 0), b"n", b"", 0, 11), // ok
            req(INCRQ, &arith_extras(1, 0, 0), b"q", b"", 0, 12), // non-numeric
            req(GATQ, &0u32.to_be_bytes(), b"z", b"", 0, 13),     // miss
            req(GATKQ, &0u32.to_be_bytes(), b"n", b"", 0, 14),    // hit
            req(DELETEQ, b"", b"q", b"", 0, 15),                  // ok
            req(DELETEQ, b"", b"q", b"", 0, 16),                  // error: not found
            req(SETQ, &ex, b"c", b"v", 99, 17),                   // error: CAS on a missing key
        ]
        .concat(),
    );
    let seen: Vec<(u32, u16)> = got.iter().map(|r| (r.opaque, r.status)).collect();
    assert_eq!(seen, [(2, 2), (6, 5), (7, 0), (9, 0), (12, 6), (14, 0), (16, 1), (17, 1)]);
    assert_eq!(got[2].value, b"<wx");
    assert_eq!(got[3].key, b"q");
    assert_eq!(got[5].value, b"4");
    // flushq: nothing, and it flushed.
    assert!(c.call(&req(FLUSHQ, b"", b"", b"", 0, 1)).is_empty());
    assert_eq!(c.one(GET, b"", b"n", b"", 0).status, 1);
}

/// Keys with the engine's reserved prefix (binary keys may hold any
/// byte): a get, getq, getkq, gat or touch of one is a miss (the quiet ones
/// answer nothing), a write is refused as invalid arguments; the
/// connection goes on.
#[test]
fn reserved_keys_are_misses_and_refused_writes() {
    let f = Fixture::default();
    let mut c = Bin::connect(f.addr);
    let key = b"\0granary.flush_floor";
    err(&c.one(GET, b"", key, b"", 0), 1, "Not found");
    assert_eq!(c.call(&[req(GETQ, b"", key, b"", 0, 1), req(GETKQ, b"", key, b"", 0, 2)].concat()), []);
    err(&c.one(GAT, &0u32.to_be_bytes(), key, b"", 0), 1, "Not found");
    assert_eq!(c.call(&req(GATQ, &0u32.to_be_bytes(), key, b"", 0, 3)), []);
    err(&c.one(TOUCH, &0u32.to_be_bytes(), key, b"", 0), 1, "Not found");
    err(&c.one(SET, &set_extras(0, 0), key, b"x", 0), 4, "Invalid arguments");
    let quiet = c.call(&req(SETQ, &set_extras(0, 0), key, b"x", 0, 4));
    assert_eq!(quiet.iter().map(|r| r.status).collect::<Vec<_>>(), [4], "{quiet:?}");
    ok(&c.one(SET, &set_extras(0, 0), b"k", b"v", 0));
    assert_eq!(c.one(GET, b"", b"k", b"", 0).value, b"v");
}

/// Counters as memcached keeps them: an increment that creates its
/// counter is not a miss (one that may not create is), and a delete whose
/// CAS value does not match is neither a hit nor a miss.
#[test]
fn creating_increments_and_cas_mismatched_deletes_are_not_misses() {
    let f = Fixture::default();
    let mut c = Bin::connect(f.addr);
    let stat = |c: &mut Bin, name: &str| -> u64 {
        let got = c.call(&req(STAT, b"", b"", b"", 0, 9));
        let r = got.iter().find(|r| r.key == name.as_bytes()).unwrap_or_else(|| panic!("no {name}: {got:?}"));
        String::from_utf8_lossy(&r.value).parse().unwrap()
    };
    assert_eq!(c.one(INCR, &arith_extras(1, 5, 0), b"n", b"", 0).value, 5u64.to_be_bytes());
    assert_eq!(c.one(DECR, &arith_extras(1, 7, 0), b"m", b"", 0).value, 7u64.to_be_bytes());
    assert_eq!((stat(&mut c, "incr_misses"), stat(&mut c, "decr_misses")), (0, 0));
    err(&c.one(INCR, &arith_extras(1, 5, 0xffff_ffff), b"absent", b"", 0), 1, "Not found");
    assert_eq!(stat(&mut c, "incr_misses"), 1);
    let cas = c.one(GET, b"", b"n", b"", 0).cas;
    err(&c.one(DELETE, b"", b"n", b"", cas + 1), 2, "Data exists for key.");
    assert_eq!((stat(&mut c, "delete_misses"), stat(&mut c, "delete_hits")), (0, 0));
    ok(&c.one(DELETE, b"", b"n", b"", cas));
    err(&c.one(DELETE, b"", b"n", b"", 0), 1, "Not found");
    assert_eq!((stat(&mut c, "delete_misses"), stat(&mut c, "delete_hits")), (1, 1));
}

#[test]
fn pipelined_getkq_and_noop_return_the_hits_in_order() {
    let f = Fixture::default();
    let mut c = Bin::connect(f.addr);
    let mut sets = Vec::new();
    for i in 0..500u32 {
        if i % 3 != 0 {
            sets.extend(req(SETQ, &set_extras(i, 0), format!("key{i}").as_bytes(), &vec![b'v'; i as usize], 0, i));
        }
    }
    assert!(c.call(&sets).is_empty());
    let mut gets = Vec::new();
    for i in 0..500u32 {
        gets.extend(req(GETKQ, b"", format!("key{i}").as_bytes(), b"", 0, i));
    }
    // Split in odd pieces, so requests straddle reads.
    for piece in gets.chunks(777) {
        c.send(piece);
    }
    let got = c.call(b"");
    let want: Vec<u32> = (0..500).filter(|i| i % 3 != 0).collect();
    assert_eq!(got.iter().map(|r| r.opaque).collect::<Vec<_>>(), want);
    for r in &got {
        assert_eq!(r.key, format!("key{}", r.opaque).as_bytes());
        assert_eq!((r.value.len(), r.extras.as_slice()), (r.opaque as usize, &r.opaque.to_be_bytes()[..]));
    }
}

/// Gets of every kind pipelined in one write are answered together, in
/// order, each as alone (a quiet miss says nothing, getk names its key);
/// a write ends the group, and the get after it sees the write.
#[test]
fn pipelined_gets_of_every_kind_answer_in_order_and_a_write_ends_the_group() {
    let f = Fixture::default();
    let mut c = Bin::connect(f.addr);
    ok(&c.one(SET, &set_extras(7, 0), b"a", b"1", 0));
    let mut reqs = Vec::new();
    reqs.extend(req(GET, b"", b"a", b"", 0, 1));
    reqs.extend(req(GETQ, b"", b"b", b"", 0, 2));
    reqs.extend(req(GETK, b"", b"b", b"", 0, 3));
    reqs.extend(req(GETKQ, b"", b"a", b"", 0, 4));
    reqs.extend(req(SETQ, &set_extras(8, 0), b"a", b"2", 0, 5));
    reqs.extend(req(GETK, b"", b"a", b"", 0, 6));
    reqs.extend(req(GET, b"", b"a", b"", 0, 7));
    let got = c.call(&reqs);
    // Opcode, status, opaque, key, value.
    type Brief<'r> = (u8, u16, u32, &'r [u8], &'r [u8]);
    let brief: Vec<Brief<'_>> = got.iter().map(|r| (r.op, r.status, r.opaque, &r.key[..], &r.value[..])).collect();
    assert_eq!(
        brief,
        vec![
            (GET, 0, 1, &b""[..], &b"1"[..]),
            (GETK, 1, 3, &b"b"[..], &b""[..]),
            (GETKQ, 0, 4, &b"a"[..], &b"1"[..]),
            (GETK, 0, 6, &b"a"[..], &b"2"[..]),
            (GET, 0, 7, &b""[..], &b"2"[..]),
        ]
    );
    assert_eq!(got[0].extras, 7u32.to_be_bytes(), "a get's flags");
    assert_eq!(got[3].extras, 8u32.to_be_bytes());
}

/// One more pipelined get than a group takes: all are answered in order,
/// the last one alone (not counted as grouped).
#[test]
fn a_long_pipeline_of_binary_gets_is_answered_in_bounded_groups() {
    use granary_memcache::limits::PIPELINED_GETS_MAX;
    let f = Fixture::default();
    let mut c = Bin::connect(f.addr);
    ok(&c.one(SET, &set_extras(0, 0), b"a", b"1", 0));
    let n = PIPELINED_GETS_MAX + 1;
    let reqs: Vec<u8> = (1..=n as u32).flat_map(|i| req(GETK, b"", b"a", b"", 0, i)).collect();
    let got = c.call(&reqs);
    let opaques: Vec<u32> = got.iter().map(|r| r.opaque).collect();
    assert_eq!(opaques, (1..=n as u32).collect::<Vec<_>>());
    assert!(got.iter().all(|r| r.status == 0 && r.value == b"1"));
    let mut t = f.client();
    let stats = String::from_utf8(t.call(b"stats\r\n")).unwrap();
    assert!(stats.contains(&format!("STAT granary_pipelined_gets {PIPELINED_GETS_MAX}\r\n")), "{stats}");
}

#[test]
fn large_values_and_values_over_the_limit() {
    let f = Fixture::default();
    let mut c = Bin::connect(f.addr);
    // A value past the zero-copy threshold, both ways.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    ok(&c.one(SET, &set_extras(1, 0), b"big", &big, 0));
    assert_eq!(c.one(GET, b"", b"big", b"", 0).value, big);
    // Over the 1 MiB item limit: "Too large.", the body skipped, the old
    // value dropped (a set), the connection going on; neither counted as
    // a set nor as too large (memcached 1.6 refuses such a request before
    // it counts anything).
    let mut t = f.client();
    let counts = |t: &mut Client| {
        let stats = String::from_utf8(t.call(b"stats\r\n")).unwrap();
        let stat = |name: &str| {
            let line = stats.lines().find(|l| l.starts_with(&format!("STAT {name} "))).expect(name);
            line.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
        };
        (stat("cmd_set"), stat("store_too_large"))
    };
    let huge = vec![b'x'; (1 << 20) + 1];
    let before = counts(&mut t);
    err(&c.one(SET, &set_extras(0, 0), b"big", &huge, 0), 3, "Too large.");
    err(&c.one(GET, b"", b"big", b"", 0), 1, "Not found");
    assert_eq!(counts(&mut t), before);
    ok(&c.one(SET, &set_extras(0, 0), b"small", b"1", 0));
    let before = counts(&mut t);
    err(&c.one(APPEND, b"", b"small", &huge, 0), 3, "Too large.");
    assert_eq!(counts(&mut t), before);
    // An append past the limit too.
    ok(&c.one(SET, &set_extras(0, 0), b"half", &vec![b'h'; 600_000], 0));
    err(&c.one(APPEND, b"", b"half", &vec![b'h'; 600_000], 0), 5, "Not stored.");
    assert_eq!(c.one(GET, b"", b"half", b"", 0).value.len(), 600_000, "kept as it was");
    // A binary touch marks the item fetched, as a text touch does.
    ok(&c.one(SET, &set_extras(0, 0), b"touched", b"t", 0));
    ok(&c.one(SET, &set_extras(0, 0), b"untouched", b"u", 0));
    ok(&c.one(TOUCH, &100u32.to_be_bytes(), b"touched", b"", 0));
    assert_eq!(t.call(b"mg touched h\r\nmg untouched h\r\n"), b"HD h1\r\nHD h0\r\n");
    assert_eq!(c.one(GET, b"", b"small", b"", 0).value, b"1");
}

#[test]
fn bad_input_gets_memcached_s_answers_and_never_crashes() {
    let f = Fixture::default();
    // Unknown opcodes (SASL's included), with and without a body: "Unknown
    // command", the connection goes on.
    let mut c = Bin::connect(f.addr);
    for op in [0x20u8, 0x21, 0x40, 0xff] {
        err(&c.one(op, b"", b"", b"", 0), 0x81, "Unknown command");
        err(&c.one(op, b"ex", b"key", b"value", 0), 0x81, "Unknown command");
    }
    ok(&c.one(SET, &set_extras(0, 0), b"still", b"here", 0));

    // A body of the wrong shape: "Invalid arguments", then the close.
    let shapes = [
        req(GET, b"", b"", b"", 0, 1),
        req(GET, b"1234", b"k", b"", 0, 1),
        req(SET, b"", b"k", b"v", 0, 1),
        req(DELETE, b"", b"k", b"v", 0, 1),
        req(INCR, b"123", b"k", b"", 0, 1),
        req(TOUCH, b"", b"k", b"", 0, 1),
        req(NOOP, b"", b"k", b"", 0, 1),
        req(VERSION, b"", b"k", b"", 0, 1),
        req(GET, b"", &[b'k'; 251], b"", 0, 1),
        req(APPEND, b"1234", b"k", b"v", 0, 1),
    ];
    for r in &shapes {
        let mut c = Bin::connect(f.addr);
        c.send(&[r.clone(), req(NOOP, b"", b"", b"", 0, 2)].concat());
        let got = c.read_to_close();
        assert_eq!(got.len(), 1, "{r:?}: {got:?}");
        err(&got[0], 4, "Invalid arguments");
    }
    // Key and extras longer than the body: "Unknown command", the close.
    let mut bad = req(GET, b"", b"abc", b"", 0, 1);
    bad[8..12].copy_from_slice(&1u32.to_be_bytes());
    let mut c = Bin::connect(f.addr);
    c.send(&bad);
    let got = c.read_to_close();
    assert_eq!((got.len(), got[0].status), (1, 0x81));
    // A wrong magic mid-stream: the close, no reply; what came before is
    // answered.
    let mut c = Bin::connect(f.addr);
    c.send(&[req(NOOP, b"", b"", b"", 0, 1), b"get still\r\n".to_vec(), req(NOOP, b"", b"", b"", 0, 2)].concat());
    let got = c.read_to_close();
    assert_eq!(got.iter().map(|r| r.opaque).collect::<Vec<_>>(), [1]);
    // A connection that started as text stays text.
    let mut t = f.client();
    assert!(t.call(b"version\r\n").starts_with(b"VERSION"));
    t.send(&[0x80]);
    assert_eq!(t.call(b"\r\n"), b"ERROR\r\n");

    // Random bytes after a valid start: whatever happens, the server
    // serves the next connection.
    let seed: u64 = std::env::var("GRANARY_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0xb1);
    eprintln!("binary garbage seed {seed} (rerun: GRANARY_FUZZ_SEED={seed})");
    let mut rng = granary_store::io::SimRng::new(seed);
    for _ in 0..50 {
        let mut c = Bin::connect(f.addr);
        let mut b = req(NOOP, b"", b"", b"", 0, 0);
        let mut r = req(rng.below(0x30) as u8, &vec![0; rng.below(24) as usize], b"key", b"val", 0, 0);
        // Corrupt a header byte or two (lengths included).
        for _ in 0..2 {
            let at = rng.below(24) as usize;
            r[at] = rng.below(256) as u8;
        }
        r[0] = 0x80;
        b.extend_from_slice(&r);
        c.send(&b);
        let _ = c.s.shutdown(std::net::Shutdown::Write);
        let _ = c.read_to_close();
    }
    let mut c = Bin::connect(f.addr);
    assert_eq!(c.one(GET, b"", b"still", b"", 0).value, b"here");
}

/// A memcached child process on a free loopback port, killed on drop.
struct Memcached(std::process::Child, SocketAddr);

impl Memcached {
    fn start() -> Option<Memcached> {
        let bin = peer("memcached")?;
        let port = granary_rt::net::free_low_port().unwrap();
        let child = std::process::Command::new(bin)
            .args(["-U", "0", "-l", "127.0.0.1", "-p", &port.to_string(), "-u", "root", "-m", "64"])
            .args(["-o", "no_lru_crawler,no_lru_maintainer"])
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let m = Memcached(child, addr);
        for _ in 0..200 {
            if TcpStream::connect(addr).is_ok() {
                return Some(m);
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("memcached did not start listening on {addr}");
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One random request of the differential test: (opcode, extras, key,
/// value, whether it takes the key's last CAS value). Leaves out what
/// differs on purpose (docs/MEMCACHE.md, "Binary protocol"): stat,
/// version, verbosity, a delayed flush, unknown opcodes with a body, and
/// malformed requests (which close the connection: the unit and raw tests
/// cover them).
fn random_request(rng: &mut granary_store::io::SimRng) -> (u8, Vec<u8>, Vec<u8>, Vec<u8>, bool) {
    let pick = |rng: &mut granary_store::io::SimRng, xs: &[&str]| xs[rng.below(xs.len() as u64) as usize].to_string();
    let long = "x".repeat(250);
    let k = pick(rng, &["k0", "k1", "k2", "n", "c", &long]).into_bytes();
    let v = pick(rng, &["", "1", "42", "4294967296", "18446744073709551616", "abc", "007", " 5", "+9"]).into_bytes();
    let exp = [0u32, 1000, 0x7fff_ffff][rng.below(3) as usize];
    let flags = [0u32, 1, 0xffff_ffff][rng.below(3) as usize];
    let with_cas = rng.below(4) == 0;
    let quiet = rng.below(3) == 0;
    let q = |loud: u8, quiet_op: u8| if quiet { quiet_op } else { loud };
    match rng.below(12) {
        0 | 1 => {
            let op = [q(SET, SETQ), q(ADD, ADDQ), q(REPLACE, REPLACEQ)][rng.below(3) as usize];
            (op, set_extras(flags, exp), k, v, with_cas)
        }
        2 => ([q(APPEND, APPENDQ), q(PREPEND, PREPENDQ)][rng.below(2) as usize], vec![], k, v, with_cas),
        3 | 4 => ([GET, GETQ, GETK, GETKQ][rng.below(4) as usize], vec![], k, vec![], false),
        5 => (q(DELETE, DELETEQ), vec![], k, vec![], with_cas),
        6 | 7 => {
            let op = [q(INCR, INCRQ), q(DECR, DECRQ)][rng.below(2) as usize];
            let delta = [0u64, 1, 5, 1 << 32, u64::MAX][rng.below(5) as usize];
            let init = [0u64, 7, u64::MAX][rng.below(3) as usize];
            let e = [0u32, 1000, 0xffff_ffff][rng.below(3) as usize];
            (op, arith_extras(delta, init, e), k, vec![], with_cas)
        }
        8 => (TOUCH, exp.to_be_bytes().to_vec(), k, vec![], false),
        9 => ([GAT, GATQ, GATK, GATKQ][rng.below(4) as usize], exp.to_be_bytes().to_vec(), k, vec![], false),
        10 => (NOOP, vec![], vec![], vec![], false),
        _ => ([0x20u8, 0x30, 0x45][rng.below(3) as usize], vec![], vec![], vec![], false),
    }
}

/// A response with what may rightly differ made equal: CAS values (0 or
/// not), and a counter's padding (spaces) in a value.
fn normalize(r: &Resp) -> String {
    let value: Vec<u8> = r.value.iter().copied().filter(|&b| b != b' ').collect();
    format!(
        "op {:#x} status {:#x} opaque {} cas {} extras {:?} key {:?} value {:?}",
        r.op,
        r.status,
        r.opaque,
        if r.cas == 0 { "0" } else { "set" },
        r.extras,
        String::from_utf8_lossy(&r.key),
        String::from_utf8_lossy(&value)
    )
}

/// Differential test: the same seeded random binary requests, one at a
/// time (each followed by a noop), to Granary and to a real memcached,
/// responses compared (CAS values masked; a request with a CAS value uses
/// each server's own last CAS value of the key). A failure prints the
/// seed; rerun with `GRANARY_FUZZ_SEED`.
#[test]
fn random_binary_requests_get_memcached_s_responses() {
    let Some(m) = Memcached::start() else { return };
    let seeds: Vec<u64> = match std::env::var("GRANARY_FUZZ_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(s) => vec![s],
        None => (1..=8).collect(),
    };
    for seed in seeds {
        let f = Fixture::default();
        let (mut g, mut mc) = (Bin::connect(f.addr), Bin::connect(m.1));
        g.call(&req(FLUSH, b"", b"", b"", 0, 0));
        mc.call(&req(FLUSH, b"", b"", b"", 0, 0));
        let mut cas_g = std::collections::HashMap::new();
        let mut cas_m = std::collections::HashMap::new();
        let mut rng = granary_store::io::SimRng::new(seed);
        let mut history: Vec<String> = Vec::new();
        for step in 0..1500u32 {
            let (op, extras, key, value, with_cas) = random_request(&mut rng);
            let run = |c: &mut Bin, cas: &mut std::collections::HashMap<Vec<u8>, u64>| {
                let cv = if with_cas { cas.get(&key).copied().unwrap_or(1) } else { 0 };
                let (got, closed) = c.try_call(&req(op, &extras, &key, &value, cv, step));
                for r in &got {
                    if r.cas != 0 && r.status == 0 {
                        cas.insert(key.clone(), r.cas);
                    }
                }
                let mut got = got.iter().map(normalize).collect::<Vec<_>>();
                if closed {
                    got.push("closed".into());
                }
                got
            };
            let got = run(&mut g, &mut cas_g);
            let want = run(&mut mc, &mut cas_m);
            let desc = format!(
                "op {op:#x} extras {extras:?} key {:?} value {:?} cas {with_cas}",
                String::from_utf8_lossy(&key[..key.len().min(8)]),
                String::from_utf8_lossy(&value)
            );
            assert_eq!(
                got,
                want,
                "seed {seed} (rerun: GRANARY_FUZZ_SEED={seed}), step {step}: {desc}\nearlier:\n{:#?}",
                &history[history.len().saturating_sub(12)..]
            );
            history.push(desc);
        }
    }
}

#[test]
fn memccapable_binary_passes() {
    let Some(bin) = peer("memccapable") else { return };
    let f = Fixture::default();
    let out = std::process::Command::new(bin)
        .args(["-b", "-h", "127.0.0.1", "-p", &f.addr.port().to_string(), "-t", "10"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("All tests passed"), "memccapable -b failed:\n{text}");
}

/// pylibmc (libmemcached) in binary mode, through the Debian package's
/// /usr/bin/python3.
#[test]
fn pylibmc_in_binary_mode_works() {
    let python = std::path::Path::new("/usr/bin/python3");
    let has = python.is_file()
        && std::process::Command::new(python).args(["-c", "import pylibmc"]).output().is_ok_and(|o| o.status.success());
    if !has {
        if common::require_peers() {
            panic!("pylibmc is required (scripts/test.sh installs python3-pylibmc)");
        }
        eprintln!("skipped: pylibmc is not installed (scripts/test.sh installs python3-pylibmc)");
        return;
    }
    let f = Fixture::default();
    let script = r#"
import sys, pylibmc
c = pylibmc.Client([sys.argv[1]], binary=True, behaviors={"cas": True})
assert c.set("a", "hello")
assert c.get("a") == "hello"
assert not c.add("a", "x")
assert c.add("b", "x")
assert c.replace("b", "y") and c.get("b") == "y"
try:
    c.replace("nope", "y")
    raise AssertionError("replace of a missing key succeeded")
except pylibmc.NotFound:
    pass
assert c.append("a", " world") and c.prepend("a", ">")
assert c.get("a") == ">hello world"
assert c.set("n", 10)
assert c.incr("n", 5) == 15 and c.decr("n", 20) == 0
val, cas = c.gets("a")
assert val == ">hello world" and cas
assert c.cas("a", "new", cas)
assert not c.cas("a", "newer", cas)
assert c.get("a") == "new"
assert c.set_multi({"m1": "1", "m2": "2", "m3": 3}) == []
assert c.get_multi(["m1", "m2", "m3", "none"]) == {"m1": "1", "m2": "2", "m3": 3}
assert c.touch("m1", 100)
assert not c.touch("nope", 100)
assert c.delete("b") and not c.delete("b")
big = "x" * 500000
assert c.set("big", big) and c.get("big") == big
assert c.flush_all()
assert c.get("a") is None and c.get_multi(["m1", "m2"]) == {}
print("ok")
"#;
    let out = std::process::Command::new(python).args(["-c", script, &f.addr.to_string()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("ok"), "pylibmc failed:\n{text}");
}
