//! `granary serve`'s Memcache protocol over loopback: replies checked
//! against memcached 1.6's (a table recorded from it, and, where memcached
//! is installed, the same requests sent to a real memcached in the same
//! run), memccapable, a real client library, pipelining, limits, bad input,
//! expiry, eviction and warm restart.

mod common;

use common::*;
use granary_memcache::ServerConfig;
use std::io::Write;

/// (request, memcached's exact reply). Each case runs on a flushed server.
const CASES: &[(&str, &str)] = &[
    ("set a 5 0 3\r\nabc\r\nget a\r\n", "STORED\r\nVALUE a 5 3\r\nabc\r\nEND\r\n"),
    ("get a b c\r\n", "END\r\n"),
    // Pipelined retrievals (answered as one group, their reads together):
    // each request's replies in its keys' order, the requests in theirs.
    (
        "set a 0 0 1\r\n1\r\nset b 5 0 2\r\n22\r\nget a\r\nget b zz a\r\ngets zz\r\nget a\r\n",
        "STORED\r\nSTORED\r\nVALUE a 0 1\r\n1\r\nEND\r\nVALUE b 5 2\r\n22\r\nVALUE a 0 1\r\n1\r\nEND\r\nEND\r\nVALUE a 0 1\r\n1\r\nEND\r\n",
    ),
    // A write ends the group: the gets after it see it.
    (
        "set a 0 0 1\r\n1\r\nget a\r\nget a\r\nset a 0 0 1\r\n9\r\nget a\r\nget zz a\r\n",
        "STORED\r\nVALUE a 0 1\r\n1\r\nEND\r\nVALUE a 0 1\r\n1\r\nEND\r\nSTORED\r\nVALUE a 0 1\r\n9\r\nEND\r\nVALUE a 0 1\r\n9\r\nEND\r\n",
    ),
    (
        "set \x10\x10ctl\tkey 1 0 1\r\nx\r\nget \x10\x10ctl\tkey\r\n",
        "STORED\r\nVALUE \x10\x10ctl\tkey 1 1\r\nx\r\nEND\r\n",
    ),
    ("set a 0 0 1\r\nx\r\nadd a 0 0 1\r\ny\r\nget a\r\n", "STORED\r\nNOT_STORED\r\nVALUE a 0 1\r\nx\r\nEND\r\n"),
    ("replace zz 0 0 1\r\nx\r\n", "NOT_STORED\r\n"),
    (
        "set a 3 0 1\r\nc\r\nappend a 0 0 2\r\nde\r\nprepend a 9 0 2\r\nxy\r\nget a\r\n",
        "STORED\r\nSTORED\r\nSTORED\r\nVALUE a 3 5\r\nxycde\r\nEND\r\n",
    ),
    ("append nope 0 0 1\r\nx\r\n", "NOT_STORED\r\n"),
    (
        "set n 0 0 3\r\n100\r\nincr n 5\r\ndecr n 200\r\nget n\r\n",
        "STORED\r\n105\r\n0\r\nVALUE n 0 3\r\n0  \r\nEND\r\n",
    ),
    (
        "set s 0 0 3\r\nabc\r\nincr s 1\r\n",
        "STORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
    ),
    ("incr n -1\r\n", "CLIENT_ERROR invalid numeric delta argument\r\n"),
    ("incr n\r\n", "ERROR\r\n"),
    ("incr nope 1\r\n", "NOT_FOUND\r\n"),
    (
        "set n2 0 0 20\r\n18446744073709551615\r\nincr n2 2\r\nget n2\r\n",
        "STORED\r\n1\r\nVALUE n2 0 20\r\n1                   \r\nEND\r\n",
    ),
    ("set a 0 0 1\r\nx\r\ntouch a 100\r\ntouch nope 100\r\n", "STORED\r\nTOUCHED\r\nNOT_FOUND\r\n"),
    ("set a 0 0 1\r\nx\r\ndelete a\r\ndelete a\r\nget a\r\n", "STORED\r\nDELETED\r\nNOT_FOUND\r\nEND\r\n"),
    (
        "delete a 0\r\ndelete a 1\r\n",
        "NOT_FOUND\r\nCLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n",
    ),
    ("delete a noreply\r\ndelete x 1 noreply\r\n", ""),
    ("delete\r\n", "ERROR\r\n"),
    // A wrong token count is answered despite a last `noreply`, and
    // `delete noreply` deletes the key `noreply`.
    ("set noreply 0 0 1\r\nx\r\ndelete noreply\r\nget noreply\r\n", "STORED\r\nDELETED\r\nEND\r\n"),
    (
        "incr noreply\r\nset k 0 noreply\r\ndelete k 0 2 noreply\r\nflush_all 1 2 noreply\r\nverbosity 1 2 noreply\r\ntouch noreply\r\n",
        "ERROR\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\n",
    ),
    ("set k 0 0 1 x noreply\r\ny\r\n", "ERROR\r\nERROR\r\n"),
    // A refused key: the request's error alone (memcached drops even the
    // replies before it in the same read, which Granary does not copy:
    // one request a case; `pipelined_retrievals_are_answered_together_in_order`
    // checks that a refused key's request drops its own VALUEs).
    ("get a kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\r\n", "CLIENT_ERROR bad command line format\r\n"),
    ("gat 0 a kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\r\n", "CLIENT_ERROR bad command line format\r\n"),
    ("set neg 0 -1 1\r\nx\r\nget neg\r\n", "STORED\r\nEND\r\n"),
    ("set f 4294967295 0 1\r\nx\r\nget f\r\n", "STORED\r\nVALUE f 4294967295 1\r\nx\r\nEND\r\n"),
    ("set f abc 0 1\r\nx\r\n", "CLIENT_ERROR bad command line format\r\nERROR\r\n"),
    ("set f 0 0 -1\r\n", "CLIENT_ERROR bad command line format\r\n"),
    ("set f 0 0\r\n", "ERROR\r\n"),
    ("set k 0 0 2\r\nabc\r\n", "CLIENT_ERROR bad data chunk\r\nERROR\r\n"),
    ("set x 0 0 1 noreply\r\ny\r\nget x\r\n", "VALUE x 0 1\r\ny\r\nEND\r\n"),
    ("set x 0 0 1 norepl\r\ny\r\n", "STORED\r\n"),
    ("set x 0 0 1 noreply\r\nyy\r\n", "ERROR\r\n"),
    ("bogus\r\n", "ERROR\r\n"),
    ("\r\n", "ERROR\r\n"),
    ("GET a\r\n", "ERROR\r\n"),
    ("get\r\n", "ERROR\r\n"),
    ("gets\r\n", "ERROR\r\n"),
    ("cas a 0 0 1 1\r\nx\r\n", "NOT_FOUND\r\n"),
    ("gat 100 nope\r\n", "END\r\n"),
    ("gat\r\n", "ERROR\r\n"),
    ("gat abc n\r\n", "CLIENT_ERROR invalid exptime argument\r\n"),
    ("gat 10\r\ngats abc\r\n", "END\r\nCLIENT_ERROR invalid exptime argument\r\n"),
    ("set a 7 0 2\r\nhi\r\ngat 0 a\r\n", "STORED\r\nVALUE a 7 2\r\nhi\r\nEND\r\n"),
    ("set n 0 0 1\r\n1\r\nflush_all 0\r\nget n\r\n", "STORED\r\nOK\r\nEND\r\n"),
    ("set n 0 0 1\r\n5\r\nincr n 1 x\r\ntouch n 10 x\r\ndecr n 2 y\r\nincr n 1 x y\r\n", "STORED\r\n6\r\nTOUCHED\r\n4\r\nERROR\r\n"),
    ("flush_all abc\r\n", "CLIENT_ERROR invalid exptime argument\r\n"),
    ("flush_all 1 2 3\r\n", "ERROR\r\n"),
    ("flush_all noreply\r\n", ""),
    ("verbosity\r\n", "ERROR\r\n"),
    ("verbosity 1\r\nverbosity 1 noreply\r\nverbosity foo\r\n", "OK\r\nCLIENT_ERROR bad command line format\r\n"),
    ("stats foo\r\n", "ERROR\r\n"),
    ("stats reset\r\n", "RESET\r\n"),
    ("ms mk 2 T0 F3\r\nhi\r\nmg mk v f s k O9\r\n", "HD\r\nVA 2 f3 s2 kmk O9\r\nhi\r\n"),
    ("mg missing v\r\n", "EN\r\n"),
    ("mg nokey v O123 k\r\n", "EN O123 knokey\r\n"),
    ("ms n 1\r\n5\r\nma n q v\r\n", "HD\r\n"),
    ("ms ae 1 ME C99\r\nx\r\nms ae 1 ME C99\r\nx\r\n", "HD\r\nNS\r\n"),
    ("ms n 1\r\n5\r\nma n T30 t v\r\nmg n t\r\n", "HD\r\nVA 1 t30\r\n6\r\nHD t30\r\n"),
    ("ms k -1\r\n", "CLIENT_ERROR bad command line format\r\n"),
    ("ms kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk 2\r\nhi\r\n", "CLIENT_ERROR bad command line format\r\nERROR\r\n"),
    ("mg missing v q\r\n", ""),
    ("ms mk 2\r\nhi\r\nmg mk q\r\n", "HD\r\nHD\r\n"),
    ("ms mk 2\r\nhi\r\nms mk 2 MA\r\nyo\r\nms mk 2 MP\r\nab\r\nmg mk v\r\n", "HD\r\nHD\r\nHD\r\nVA 6\r\nabhiyo\r\n"),
    ("ms mk 2 MA\r\nhi\r\n", "NS\r\n"),
    ("ms mk 2\r\nhi\r\nms mk 2 ME\r\nzz\r\nms new 2 MR\r\nzz\r\n", "HD\r\nNS\r\nNS\r\n"),
    ("ms mk 2\r\nhi\r\nmd mk\r\nmd mk\r\nmd mk q\r\n", "HD\r\nHD\r\nNF\r\nNF\r\n"),
    ("ma c1\r\n", "NF\r\n"),
    ("ma c1 N0 J5 v\r\nma c1 v\r\nma c1 MD D10 v\r\nma c1 q\r\n", "VA 1\r\n5\r\nVA 1\r\n6\r\nVA 1\r\n0\r\n"),
    ("ms c2 3\r\nabc\r\nma c2\r\n", "HD\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n"),
    ("mg x zz\r\n", "CLIENT_ERROR invalid flag\r\n"),
    ("mg x v v\r\n", "CLIENT_ERROR duplicate flag\r\n"),
    ("mg a Tabc\r\n", "CLIENT_ERROR bad token in command line format\r\n"),
    ("ms x abc\r\n", "CLIENT_ERROR bad command line format\r\n"),
    ("ms a 2 Fabc\r\nhi\r\n", "CLIENT_ERROR bad command line format\r\n"),
    ("ms a 2 Cabc\r\nhi\r\n", "CLIENT_ERROR bad token in command line format\r\n"),
    ("md a Cabc\r\n", "CLIENT_ERROR invalid or duplicate flag\r\n"),
    ("ms k 2 MX\r\nhi\r\n", "CLIENT_ERROR invalid mode for ms M token\r\n"),
    ("ma a MX\r\n", "CLIENT_ERROR invalid mode for ma M token\r\n"),
    ("ms k 3\r\nabcd\r\n", "CLIENT_ERROR bad data chunk\r\nERROR\r\n"),
    ("me nope\r\n", "EN\r\n"),
    ("me\r\n", "CLIENT_ERROR bad command line format\r\n"),
    ("mg\r\nms\r\nmd\r\nma\r\n", "ERROR\r\nERROR\r\nERROR\r\nERROR\r\n"),
    ("ms b64 2 b\r\nhi\r\n", "CLIENT_ERROR error decoding key\r\n"),
    ("ms Zm9v 2 b\r\nhi\r\nmg Zm9v b v k\r\nget foo\r\n", "HD\r\nVA 2 kZm9v b\r\nhi\r\nVALUE foo 0 2\r\nhi\r\nEND\r\n"),
    ("set tt 0 100 1\r\nx\r\nmg tt t\r\nmg tt T0 t\r\nmg tt t\r\n", "STORED\r\nHD t100\r\nHD t-1\r\nHD t-1\r\n"),
    ("md k Z\r\nmd k x\r\nma k q q\r\nmd k C1 C1\r\n",
        "CLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR invalid or duplicate flag\r\n",
    ),
    // Flags memcached knows but a command does not use are ignored; every
    // meta command checks every flag's token as memcached does.
    ("ms k 2 v s t N0 h l u P L\r\nhi\r\nmg k MS D5 J5 I C0 F7 P L v\r\n", "HD\r\nVA 2\r\nhi\r\n"),
    (
        "mg k MSS\r\nmg k Dx\r\nmg k Jx\r\nmg k Nx\r\nmg k Fx\r\nmg k Cx\r\n",
        "CLIENT_ERROR incorrect length for M token\r\nCLIENT_ERROR invalid numeric delta value\r\n\
         CLIENT_ERROR invalid numeric initial value\r\nCLIENT_ERROR bad token in command line format\r\n\
         CLIENT_ERROR bad command line format\r\nCLIENT_ERROR bad token in command line format\r\n",
    ),
    (
        "ms k 1 M\r\nx\r\nma k M\r\nmg k MS MS\r\n",
        "CLIENT_ERROR incorrect length for M token\r\nCLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR duplicate flag\r\n",
    ),
    (
        "mg k O1234567890123456789012345678901\r\nmg k O12345678901234567890123456789012\r\n\
         md k O12345678901234567890123456789012\r\nms k 1 O12345678901234567890123456789012\r\nx\r\n",
        "EN O1234567890123456789012345678901\r\nCLIENT_ERROR opaque token too long\r\n\
         CLIENT_ERROR opaque token too long\r\nCLIENT_ERROR opaque token too long\r\n",
    ),
    (
        "mg k s t c f l h k u v q O1 T5 N5 R5 P L I F1\r\nmd k s t c f l h k u q O1 T5 N5 R5 P L I F1\r\n",
        "CLIENT_ERROR options flags are too long\r\nNF kk O1\r\n",
    ),
    ("ms f 1 F4294967297\r\nx\r\nmg f f\r\n", "HD\r\nHD f1\r\n"),
    ("ma k b\r\nmd k b\r\n", "CLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR invalid or duplicate flag\r\n"),
    // ms echoes c as c0 when it stores nothing; C0 checks nothing in ma
    // and in an append, where a miss is NS.
    ("ms zz 1 c MA\r\nx\r\nms zz 1 c C5\r\nx\r\n", "NS c0\r\nNF c0\r\n"),
    ("ms n 1\r\n5\r\nma n C0 v\r\nms n 1 C0 MA\r\n0\r\nmg n v\r\n", "HD\r\nVA 1\r\n6\r\nHD\r\nVA 2\r\n60\r\n"),
    // The item mg creates with N counts as read by it (h1 next time); ms
    // with I and C0 stores nothing.
    ("mg v N30 h\r\nmg v h\r\nmg w N30 u\r\nmg w h\r\n", "HD h0 W\r\nHD h1 Z\r\nHD W\r\nHD h0 Z\r\n"),
    ("ms c 2\r\nhi\r\nms c 2 I C0\r\nzz\r\nmg c v\r\n", "HD\r\nEX\r\nVA 2\r\nhi\r\n"),
    // An append makes a new item: not stale. In replace mode too, I with
    // an older C stores the value as stale.
    ("ms c 2\r\nhi\r\nmd c I\r\nappend c 0 0 1\r\nx\r\nmg c v\r\n", "HD\r\nHD\r\nSTORED\r\nVA 3\r\nhix\r\n"),
    ("ms c 2\r\nhi\r\nms c 2 I C1 MR\r\nzz\r\nmg c v\r\n", "HD\r\nHD\r\nVA 2 X W\r\nzz\r\n"),
    // q does not hide the creation of a missing counter.
    ("ma v q N0 J5 v\r\nma v q v\r\nmg v v\r\n", "VA 1\r\n5\r\nVA 1\r\n6\r\n"),
    // Counters read as C's strtoull reads them: leading space, a sign.
    (
        "set a 0 0 2\r\n 5\r\nincr a 1\r\nset b 0 0 3\r\n+12\r\nincr b 1\r\nset c 0 0 2\r\n-5\r\nincr c 1\r\n",
        "STORED\r\n6\r\nSTORED\r\n13\r\nSTORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
    ),
    // h: hit before (u reads without marking).
    ("ms a 2 T100\r\nhi\r\nmg a h u\r\nmg a h\r\nmg a h v\r\n", "HD\r\nHD h0\r\nHD h0\r\nVA 2 h1\r\nhi\r\n"),
    ("set a 0 0 2\r\nhi\r\nget a\r\nmg a h\r\nset a 0 0 2\r\nyo\r\nmg a h\r\n", "STORED\r\nVALUE a 0 2\r\nhi\r\nEND\r\nHD h1\r\nSTORED\r\nHD h0\r\n"),
    // Invalidation: the item stays, stale (X); the first reader wins (W),
    // later ones see Z; a new value ends it.
    (
        "ms e 2 T100\r\nhi\r\nmd e I T30\r\nmg e s v\r\nmg e s\r\nmd e I\r\nmg e s\r\nms e 2\r\nyo\r\nmg e s v\r\n",
        "HD\r\nHD\r\nVA 2 s2 X W\r\nhi\r\nHD s2 Z X\r\nHD\r\nHD s2 X W\r\nHD\r\nVA 2 s2\r\nyo\r\n",
    ),
    ("md nokey I\r\nms d 1\r\nx\r\nmd d I q\r\nmg d v k\r\n", "NF\r\nHD\r\nVA 1 kd X W\r\nx\r\n"),
    ("ms n 1\r\n5\r\nmd n I\r\nma n v\r\nmg n v\r\n", "HD\r\nHD\r\nVA 1\r\n6\r\nVA 1 X W\r\n6\r\n"),
    // ms I: an older CAS value stores the value as stale; a newer one is EX.
    ("ms c 2\r\nhi\r\nms c 2 I C1\r\nzz\r\nmg c v\r\nmg c v\r\n", "HD\r\nHD\r\nVA 2 X W\r\nzz\r\nVA 2 Z X\r\nzz\r\n"),
    ("ms c 2\r\nhi\r\nms c 2 I C999999999\r\nzz\r\nms c 2 I\r\nyo\r\nmg c v\r\n", "HD\r\nEX\r\nHD\r\nVA 2\r\nyo\r\n"),
    // Vivify: W to the creator, Z to everyone after, until a new value.
    ("mg v N30 s\r\nmg v N30 s\r\nmg v s\r\nms v 1\r\nz\r\nmg v s\r\n", "HD s0 W\r\nHD s0 Z\r\nHD s0 Z\r\nHD\r\nHD s1\r\n"),
    // R: a win when less than that many seconds are left.
    ("ms r 1 T100\r\nx\r\nmg r R30 s\r\nmg r R200 s\r\nmg r R200 s\r\n", "HD\r\nHD s1\r\nHD s1 W\r\nHD s1 Z\r\n"),
    ("ms r 1\r\nx\r\nmg r R200 s\r\nmd r T30\r\nmg r s\r\n", "HD\r\nHD s1\r\nHD\r\nEN\r\n"),
];

fn run_cases(addr: std::net::SocketAddr) -> Vec<(String, String)> {
    CASES
        .iter()
        .map(|(req, _)| {
            let mut c = Client::connect(addr);
            c.call(b"flush_all\r\n");
            (req.to_string(), String::from_utf8_lossy(&c.call(req.as_bytes())).into_owned())
        })
        .collect()
}

#[test]
fn replies_match_memcached() {
    let f = Fixture::default();
    let mut bad = Vec::new();
    for ((req, got), (_, want)) in run_cases(f.addr).iter().zip(CASES) {
        if got != want {
            bad.push(format!("{req:?}\n  want {want:?}\n  got  {got:?}"));
        }
    }
    assert!(bad.is_empty(), "{} replies differ from memcached's:\n{}", bad.len(), bad.join("\n"));
}

/// A memcached child process on a free loopback port, killed on drop.
struct Memcached(std::process::Child, std::net::SocketAddr);

impl Memcached {
    fn start() -> Option<Memcached> {
        let bin = peer("memcached")?;
        let port = granary_rt::net::free_low_port().unwrap();
        let child = std::process::Command::new(bin)
            .args(["-U", "0", "-l", "127.0.0.1", "-p", &port.to_string(), "-u", "root", "-m", "64"])
            // No background thread holding items: an incr rewrites in place
            // only when nothing else holds the item (random_requests_...).
            .args(["-o", "no_lru_crawler,no_lru_maintainer"])
            .spawn()
            .unwrap();
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        // Owned by the guard from here: killed and waited for on every path.
        let m = Memcached(child, addr);
        // Wait (bounded) until it accepts connections.
        for _ in 0..200 {
            if std::net::TcpStream::connect(addr).is_ok() {
                return Some(m);
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
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

/// The same requests against a real memcached in this run: the table above
/// must still be what memcached says (catches a table that drifted).
#[test]
fn the_reply_table_is_what_a_real_memcached_says() {
    let Some(m) = Memcached::start() else { return };
    let mut bad = Vec::new();
    for ((req, got), (_, want)) in run_cases(m.1).iter().zip(CASES) {
        if got != want {
            bad.push(format!("{req:?}\n  table    {want:?}\n  memcached {got:?}"));
        }
    }
    assert!(bad.is_empty(), "{} table entries differ from this memcached:\n{}", bad.len(), bad.join("\n"));
}

/// One of `xs`, at random.
fn pick(rng: &mut granary_store::io::SimRng, xs: &[&str]) -> String {
    xs[rng.below(xs.len() as u64) as usize].to_string()
}

/// One random request of the differential test, from a grammar that
/// leaves out what Granary does differently on purpose (MEMCACHE.md, "Where
/// Granary differs"): the `E` and `t`/`l` flags (the test's clock is
/// frozen, memcached's is not), `T` with `N` or `R` in one request
/// (memcached applies them in order), a long opaque token on mg and ma
/// (memcached refuses it only after acting), base64 keys; and `h` and `s`
/// (an arithmetic whose result is shorter keeps the item, its length and
/// access state, in memcached only when no response still holds the
/// item), `flush_all` (memcached's flush and the sets in the same second
/// race) and counters of 2^63 and more (memcached 1.6.18 reads one as
/// non-numeric when a `-` follows it anywhere in memory up to the next
/// zero byte, that is, by chance): the table above covers them. `cas` takes `%CAS%`,
/// replaced by each server's own last CAS value of the key.
fn random_request(rng: &mut granary_store::io::SimRng) -> (Vec<u8>, Vec<u8>) {
    let long = "x".repeat(250);
    let keys: [&str; 7] = ["k0", "k1", "k2", "k3", "n", "c", &long];
    let values = ["", "1", "42", "4294967296", "18446744073709551616", "abc", "-5", "007", " 5", "+9"];
    let k = pick(rng, &keys);
    let v = pick(rng, &values);
    // Meta flags: ones the command uses, known letters it ignores, and
    // unknown, repeated and malformed ones.
    let meta = |rng: &mut granary_store::io::SimRng, own: &[&str], long_opaque: bool| {
        let extra =
            ["P", "L", "u", "x", "Z", "Tx", "Dx", "Jx", "MSS", "C0", "F7", "O1234567890123456789012345678901234"];
        let mut fl: Vec<String> = Vec::new();
        for _ in 0..rng.below(5) {
            fl.push(if rng.below(5) == 0 { pick(rng, &extra) } else { pick(rng, own) });
        }
        if fl.iter().any(|f| f.starts_with('N') || f.starts_with('R')) {
            fl.retain(|f| !f.starts_with('T'));
        }
        if !long_opaque {
            fl.retain(|f| f.len() < 32);
        }
        fl.join(" ")
    };
    const MG: &[&str] =
        &["c", "f", "k", "O123", "q", "v", "T0", "T1000", "T-1", "N0", "N100", "R30", "R2000", "D5", "MS", "I"];
    const MS: &[&str] =
        &["c", "C1", "F7", "I", "k", "O123", "q", "T0", "T1000", "T-1", "MS", "ME", "MA", "MP", "MR", "v", "h", "N0"];
    const MD: &[&str] = &["C0", "C1", "I", "q", "k", "O123", "T1000", "v", "f"];
    const MA: &[&str] = &["N0", "J5", "D5", "D4294967296", "MI", "MD", "M+", "M-", "q", "v", "k", "O123", "c", "C0"];
    let line = match rng.below(14) {
        0 | 1 => {
            let cmd = pick(rng, &["set", "add", "replace", "append", "prepend"]);
            let flags = pick(rng, &["0", "1", "4294967295", "4294967296"]);
            let exp = pick(rng, &["0", "-1", "1000"]);
            let nr = if rng.below(8) == 0 { " noreply" } else { "" };
            format!("{cmd} {k} {flags} {exp} {}{nr}\r\n{v}\r\n", v.len())
        }
        2 => {
            let cmd = pick(rng, &["incr", "decr"]);
            format!("{cmd} {k} {}\r\n", pick(rng, &["0", "1", "5", "4294967296", "-1", "abc"]))
        }
        3 => format!("{} {k} {} {}\r\n", pick(rng, &["get", "gets"]), pick(rng, &keys), pick(rng, &keys)),
        4 => format!("delete {k}{}\r\n", pick(rng, &["", " noreply", " 0"])),
        5 => format!("touch {k} {}\r\n", pick(rng, &["0", "-1", "1000"])),
        6 => format!("{} {} {k}\r\n", pick(rng, &["gat", "gats"]), pick(rng, &["0", "1000", "-1"])),
        7 => format!("cas {k} 0 0 {} %CAS%\r\n{v}\r\n", v.len()),
        8 | 9 => format!("mg {k} {}\r\n", meta(rng, MG, false)),
        10 | 11 => format!("ms {k} {} {}\r\n{v}\r\n", v.len(), meta(rng, MS, true)),
        12 => format!("md {k} {}\r\n", meta(rng, MD, true)),
        _ => format!("ma {k} {}\r\n", meta(rng, MA, false)),
    };
    (line.into_bytes(), k.into_bytes())
}

/// A reply with what may rightly differ made equal: CAS values, and the
/// padding of a counter a shrinking incr or decr left (memcached pads it
/// in place or reallocates it, depending on references it holds): values
/// lose their spaces and their lengths.
fn normalize(reply: &[u8], last_cas: &mut std::collections::HashMap<Vec<u8>, Vec<u8>>) -> String {
    let text = String::from_utf8_lossy(reply);
    let mut out = String::new();
    let mut data_next = false;
    for line in text.split_inclusive("\r\n") {
        let body = line.trim_end_matches("\r\n");
        if std::mem::take(&mut data_next) {
            // A value: its spaces dropped (a counter's padding).
            out.push_str(&body.replace(' ', ""));
            out.push('\n');
            continue;
        }
        let mut words: Vec<String> = body.split(' ').map(str::to_string).collect();
        data_next = words[0] == "VALUE" || words[0] == "VA";
        if words[0] == "VALUE" && words.len() >= 4 {
            if let Some(cas) = words.get(4) {
                last_cas.insert(words[1].clone().into_bytes(), cas.clone().into_bytes());
            }
            words.truncate(3);
        } else if words[0] == "VA" {
            words[1] = "_".into();
        }
        for w in words.iter_mut().skip(1) {
            if w.starts_with('c') && w.len() > 1 && w[1..].bytes().all(|b| b.is_ascii_digit()) {
                *w = "c_".into();
            }
        }
        out.push_str(&words.join(" "));
        out.push('\n');
    }
    out
}

/// Differential test: the same random requests, one at a time, to
/// `granary serve` and to a real memcached, replies compared (CAS values
/// and counter padding normalized). Seeded; a failure prints the seed,
/// rerun with `GRANARY_FUZZ_SEED`. The grammar (`random_request`) covers
/// the text and meta commands with valid, malformed and ignored flags.
#[test]
fn random_requests_get_memcached_s_replies() {
    let Some(m) = Memcached::start() else { return };
    let seeds: Vec<u64> = match std::env::var("GRANARY_FUZZ_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(s) => vec![s],
        None => (1..=8).collect(),
    };
    for seed in seeds {
        let f = Fixture::default();
        let (mut g, mut mc) = (f.client(), Client::connect(m.1));
        let (mut cas_g, mut cas_m) = (Default::default(), Default::default());
        g.call(b"flush_all\r\n");
        mc.call(b"flush_all\r\n");
        let mut rng = granary_store::io::SimRng::new(seed);
        let mut history: Vec<(Vec<u8>, String)> = Vec::new();
        for step in 0..1500 {
            let (req, key) = random_request(&mut rng);
            let fill = |cas: &std::collections::HashMap<Vec<u8>, Vec<u8>>| {
                let c = cas.get(&key).cloned().unwrap_or_else(|| b"1".to_vec());
                String::from_utf8_lossy(&req).replace("%CAS%", &String::from_utf8_lossy(&c)).into_bytes()
            };
            let (rg, rm) = (fill(&cas_g), fill(&cas_m));
            let got = normalize(&g.call(&rg), &mut cas_g);
            let want = normalize(&mc.call(&rm), &mut cas_m);
            if got != want {
                let before: Vec<&str> = history
                    .iter()
                    .filter(|(k, r)| *k == key || r.starts_with("flush_all") || r.starts_with("get"))
                    .map(|(_, r)| r.as_str())
                    .collect();
                panic!(
                    "seed {seed} (rerun: GRANARY_FUZZ_SEED={seed}), step {step}: {:?}\n Granary: {got:?}\n memcached: {want:?}\nthe earlier requests on its key:\n{:#?}",
                    String::from_utf8_lossy(&rg),
                    &before[before.len().saturating_sub(12)..]
                );
            }
            history.push((key, String::from_utf8_lossy(&rg).into_owned()));
        }
    }
}

#[test]
fn memccapable_ascii_passes() {
    let Some(bin) = peer("memccapable") else { return };
    let f = Fixture::default();
    let out = std::process::Command::new(bin)
        .args(["-a", "-h", "127.0.0.1", "-p", &f.addr.port().to_string(), "-t", "10"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("All tests passed"), "memccapable -a failed:\n{text}");
}

#[test]
fn a_client_library_works_unchanged() {
    let f = Fixture::default();
    let c = memcache::Client::connect(format!("memcache://{}?protocol=ascii", f.addr)).unwrap();
    c.set("greeting", "hello", 0).unwrap();
    assert_eq!(c.get::<String>("greeting").unwrap().as_deref(), Some("hello"));
    assert!(c.add("greeting", "x", 0).is_err() || c.get::<String>("greeting").unwrap().as_deref() == Some("hello"));
    c.set("counter", 41u64, 0).unwrap();
    assert_eq!(c.increment("counter", 1).unwrap(), 42);
    assert_eq!(c.decrement("counter", 50).unwrap(), 0);
    c.append("greeting", ", world").unwrap();
    assert_eq!(c.get::<String>("greeting").unwrap().as_deref(), Some("hello, world"));
    let many: std::collections::HashMap<String, String> = c.gets(&["greeting", "nope", "counter"]).unwrap();
    assert_eq!(many.len(), 2);
    assert!(c.delete("greeting").unwrap());
    assert!(!c.delete("greeting").unwrap());
    let v = c.version().unwrap();
    assert_eq!(v.len(), 1);
    // (The crate's ascii `stats()` parser stops at the first line, for
    // memcached too, so only that the call succeeds is checked.)
    c.stats().unwrap();
    c.flush().unwrap();
    assert_eq!(c.get::<u64>("counter").unwrap(), None);
}

#[test]
fn cas_values_are_unique_and_survive_a_restart() {
    let mut f = Fixture::default();
    let mut c = f.client();
    let r = c.call(b"set k 9 0 2\r\nv1\r\ngets k\r\n");
    let cas1: u64 = String::from_utf8_lossy(&r).split_whitespace().nth(5).unwrap().parse().unwrap();
    assert_eq!(c.call(format!("cas k 1 0 2 {}\r\nzz\r\n", cas1 + 1).as_bytes()), b"EXISTS\r\n");
    assert_eq!(c.call(format!("cas k 1 0 2 {cas1}\r\nv2\r\n").as_bytes()), b"STORED\r\n");
    assert_eq!(c.call(format!("cas k 1 0 2 {cas1}\r\nv3\r\n").as_bytes()), b"EXISTS\r\n");
    let before = c.call(b"gets k\r\n");
    drop(c);
    f.restart(true);
    let mut c = f.client();
    assert_eq!(c.call(b"gets k\r\n"), before, "value, flags and CAS value come back after a restart");
    assert!(f.store().stats().recovery.clean_shutdown);
}

/// As in memcached, touching an item (touch, gat, gats, mg T) does not
/// change its CAS value; meta `E<cas>` sets the CAS value of an item it
/// writes (ms, ma, mg with N or T). Both survive a restart.
#[test]
fn touch_keeps_the_cas_value_and_meta_e_sets_it() {
    let mut f = Fixture::default();
    let mut c = f.client();
    let gets_cas = |c: &mut Client, k: &str| -> u64 {
        let r = c.call(format!("gets {k}\r\n").as_bytes());
        String::from_utf8_lossy(&r).split_whitespace().nth(4).unwrap().parse().unwrap()
    };
    assert_eq!(c.call(b"set k 5 0 2\r\nv1\r\n"), b"STORED\r\n");
    let cas = gets_cas(&mut c, "k");
    assert_eq!(c.call(b"touch k 1000\r\n"), b"TOUCHED\r\n");
    assert_eq!(gets_cas(&mut c, "k"), cas, "touch");
    assert_eq!(c.call(b"gats 2000 k\r\n"), format!("VALUE k 5 2 {cas}\r\nv1\r\nEND\r\n").as_bytes(), "gats");
    assert_eq!(c.call(b"mg k T3000 c t\r\n"), format!("HD c{cas} t3000\r\n").as_bytes(), "mg T");
    assert_eq!(c.call(format!("cas k 5 0 2 {cas}\r\nv2\r\n").as_bytes()), b"STORED\r\n");
    assert_ne!(gets_cas(&mut c, "k"), cas, "a write gives a new CAS value");
    // E: the client's CAS value.
    assert_eq!(c.call(b"ms e 2 E12345 c\r\nhi\r\n"), b"HD c12345\r\n");
    assert_eq!(c.call(b"mg e c v\r\n"), b"VA 2 c12345\r\nhi\r\n");
    assert_eq!(c.call(b"cas e 0 0 2 12344\r\nno\r\n"), b"EXISTS\r\n");
    assert_eq!(c.call(b"ms e 2 C12345 E777 MA c\r\nyo\r\n"), b"HD c777\r\n");
    assert_eq!(c.call(b"mg e c v\r\n"), b"VA 4 c777\r\nhiyo\r\n");
    assert_eq!(c.call(b"ms n 1\r\n5\r\nma n E4242 c v\r\n"), b"HD\r\nVA 1 c4242\r\n6\r\n");
    assert_eq!(c.call(b"mg viv N30 E99 c\r\n"), b"HD c99 W\r\n");
    assert_eq!(c.call(b"mg e T100 E555 c\r\n"), b"HD c555\r\n");
    assert_eq!(c.call(b"ms e 2 Exyz\r\nhi\r\n"), b"CLIENT_ERROR bad token in command line format\r\n");
    let before = c.call(b"gets k e n viv\r\n");
    drop(c);
    f.restart(true);
    let mut c = f.client();
    assert_eq!(c.call(b"gets k e n viv\r\n"), before, "CAS values come back after a restart");
}

/// Meta `l` (seconds since the last access), `h`, `u`, `me`'s `la` and
/// `fetch`, with the test's clock; touch and gat count as reads; the
/// stale mark survives a restart, the access state (DRAM only) does not.
#[test]
fn access_state_follows_reads_and_restarts() {
    use std::sync::atomic::Ordering::Relaxed;
    let mut f = Fixture::default();
    let mut c = f.client();
    let tick = |f: &Fixture, s: u32| f.now.fetch_add(s, Relaxed);
    assert_eq!(c.call(b"ms a 2\r\nhi\r\n"), b"HD\r\n");
    tick(&f, 5);
    assert_eq!(c.call(b"mg a h l\r\n"), b"HD h0 l5\r\n");
    tick(&f, 3);
    assert_eq!(c.call(b"mg a h l u\r\n"), b"HD h1 l3\r\n");
    tick(&f, 4);
    let me = String::from_utf8(c.call(b"me a\r\n")).unwrap();
    assert!(me.starts_with("ME a exp=-1 la=7 cas=") && me.ends_with(" fetch=yes cls=1 size=2\r\n"), "{me:?}");
    assert_eq!(c.call(b"mg a l\r\n"), b"HD l7\r\n", "u and me do not count as reads");
    assert_eq!(c.call(b"mg a l\r\n"), b"HD l0\r\n");
    // touch and gat are reads; a new value starts over.
    assert_eq!(c.call(b"set t 0 0 1\r\nx\r\n"), b"STORED\r\n");
    tick(&f, 9);
    assert_eq!(c.call(b"touch t 1000\r\n"), b"TOUCHED\r\n");
    assert_eq!(c.call(b"mg t h l\r\n"), b"HD h1 l0\r\n");
    tick(&f, 2);
    assert_eq!(c.call(b"set t 0 0 1\r\ny\r\n"), b"STORED\r\n");
    assert_eq!(c.call(b"mg t h l\r\n"), b"HD h0 l0\r\n");
    tick(&f, 2);
    assert_eq!(c.call(b"gat 0 t\r\n"), b"VALUE t 0 1\r\ny\r\nEND\r\n");
    assert_eq!(c.call(b"mg t h l u\r\n"), b"HD h1 l0\r\n");
    // mg T reports the state before it, as a plain mg would.
    assert_eq!(c.call(b"set m 0 0 1\r\nz\r\n"), b"STORED\r\n");
    tick(&f, 6);
    assert_eq!(c.call(b"mg m h l T100 t\r\n"), b"HD h0 l6 t100\r\n");
    assert_eq!(c.call(b"mg m h l\r\n"), b"HD h1 l0\r\n");
    // Stale marks are in the records; GC relocation and a restart keep
    // them, and the win token state starts over after the restart.
    assert_eq!(c.call(b"ms s 2\r\nhi\r\nmd s I\r\nmg s v\r\n"), b"HD\r\nHD\r\nVA 2 X W\r\nhi\r\n");
    assert_eq!(c.call(b"mg s\r\n"), b"HD Z X\r\n");
    drop(c);
    f.restart(true);
    let mut c = f.client();
    assert_eq!(c.call(b"mg s h\r\n"), b"HD h0 X W\r\n");
    assert_eq!(c.call(b"mg a h l\r\n"), b"HD h0 l0\r\n", "access state is not persisted");
    tick(&f, 4);
    assert_eq!(c.call(b"mg a h l\r\n"), b"HD h1 l4\r\n");
}

#[test]
fn expiry_follows_memcached_rules() {
    let f = Fixture::default();
    let mut c = f.client();
    let now = f.store().now() as u64;
    c.call(b"set rel 0 10 1\r\nx\r\n");
    c.call(format!("set abs 0 {} 1\r\nx\r\n", now + 20).as_bytes());
    c.call(b"set past 0 2592001 1\r\nx\r\n"); // absolute, long ago
    c.call(b"set never 0 0 1\r\nx\r\n");
    assert_eq!(c.call(b"get past\r\n"), b"END\r\n");
    f.advance(10);
    assert_eq!(c.call(b"get rel\r\n"), b"END\r\n");
    assert_eq!(c.call(b"get abs\r\n"), b"VALUE abs 0 1\r\nx\r\nEND\r\n");
    assert_eq!(c.call(b"touch abs 100\r\n"), b"TOUCHED\r\n");
    f.advance(50);
    assert_eq!(c.call(b"get abs never\r\n"), b"VALUE abs 0 1\r\nx\r\nVALUE never 0 1\r\nx\r\nEND\r\n");
    assert_eq!(c.call(b"mg abs t\r\n"), b"HD t50\r\n");
    // Expired counts as absent for add and incr.
    f.advance(51);
    assert_eq!(c.call(b"add abs 0 0 1\r\ny\r\nincr rel 1\r\n"), b"STORED\r\nNOT_FOUND\r\n");
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let f = Fixture::default();
    let mut c = f.client();
    let mut req = Vec::new();
    let mut want = Vec::new();
    for i in 0..2000 {
        req.extend_from_slice(format!("set k{i} {i} 0 {}\r\n{}\r\n", i.to_string().len(), i).as_bytes());
        want.extend_from_slice(b"STORED\r\n");
        if i % 3 == 0 {
            req.extend_from_slice(format!("get k{i} nope\r\n").as_bytes());
            want.extend_from_slice(format!("VALUE k{i} {i} {}\r\n{i}\r\nEND\r\n", i.to_string().len()).as_bytes());
        }
    }
    assert_eq!(String::from_utf8(c.call(&req)).unwrap(), String::from_utf8(want).unwrap());
}

#[test]
fn values_split_across_reads_and_large_values() {
    let f = Fixture::default();
    let mut c = f.client();
    let v: Vec<u8> = (0..1_000_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    c.send(format!("set big 1 0 {}\r\n", v.len()).as_bytes());
    for part in v.chunks(7919) {
        c.send(part);
    }
    c.send(b"\r\n");
    assert_eq!(c.read_until(b"STORED\r\n"), b"");
    let got = c.call(b"get big\r\n");
    let head = format!("VALUE big 1 {}\r\n", v.len());
    assert!(got.starts_with(head.as_bytes()));
    assert_eq!(&got[head.len()..head.len() + v.len()], &v[..]);
}

/// Values of ZERO_COPY_MIN_BYTES and more go from the socket into the
/// record buffer and from the read buffer to the socket: every storage
/// command's condition, noreply, pipelining around them, a bad line end,
/// and a client that leaves mid-value; the counters show the path taken.
#[test]
fn large_values_skip_the_connection_buffers() {
    use granary_memcache::limits::ZERO_COPY_MIN_BYTES;
    use std::sync::atomic::Ordering::Relaxed;
    let f = Fixture::default();
    let mut c = f.client();
    let val = |n: usize, seed: u8| -> Vec<u8> { (0..n).map(|i| seed.wrapping_add((i % 251) as u8)).collect() };
    let big = val(200_000, 1);
    // The line and a little data in one packet, the rest in odd pieces.
    c.send(format!("set zc 7 0 {}\r\n", big.len()).as_bytes());
    c.send(&big[..1000]);
    for part in big[1000..].chunks(65_537) {
        c.send(part);
    }
    assert_eq!(c.call(b"\r\n"), b"STORED\r\n");
    let st = f.server.as_ref().unwrap().stats();
    assert_eq!(st.zero_copy_sets.load(Relaxed), 1, "the value was received into the record buffer");
    let got = c.call(b"gets zc\r\n");
    let it = f.store().get_item(b"zc").unwrap().unwrap();
    let head = format!("VALUE zc 7 {} {}\r\n", big.len(), it.cas);
    assert_eq!(&got[..head.len()], head.as_bytes());
    assert_eq!(&got[head.len()..head.len() + big.len()], &big[..]);
    assert_eq!(&got[head.len() + big.len()..], b"\r\nEND\r\n");
    assert_eq!(st.zero_copy_gets.load(Relaxed), 1, "the value was sent from the read buffer");
    // Conditions, pipelined with small commands in one write.
    let b2 = val(ZERO_COPY_MIN_BYTES, 2);
    let mut req = Vec::new();
    for (cmd, key) in [("add", "zc"), ("replace", "nope"), ("add", "zc2"), ("replace", "zc2")] {
        req.extend_from_slice(format!("{cmd} {key} 0 0 {}\r\n", b2.len()).as_bytes());
        req.extend_from_slice(&b2);
        req.extend_from_slice(b"\r\nget small\r\n");
    }
    req.extend_from_slice(format!("cas zc 0 0 {} {}\r\n", b2.len(), it.cas + 1).as_bytes());
    req.extend_from_slice(&b2);
    req.extend_from_slice(format!("\r\ncas zc 3 0 {} {}\r\n", b2.len(), it.cas).as_bytes());
    req.extend_from_slice(&b2);
    req.extend_from_slice(format!("\r\nset quiet 0 0 {} noreply\r\n", b2.len()).as_bytes());
    req.extend_from_slice(&b2);
    req.extend_from_slice(b"\r\n");
    let want = "NOT_STORED\r\nEND\r\nNOT_STORED\r\nEND\r\nSTORED\r\nEND\r\nSTORED\r\nEND\r\nEXISTS\r\nSTORED\r\n";
    assert_eq!(String::from_utf8_lossy(&c.call(&req)), want);
    for key in ["zc", "zc2", "quiet"] {
        assert_eq!(f.store().get(key.as_bytes()).unwrap().as_deref(), Some(&b2[..]), "{key}");
    }
    assert_eq!(f.store().get_item(b"zc").unwrap().unwrap().meta.flags, 3);
    // A value not followed by its line end: memcached's error, the data
    // is not stored, and the connection goes on.
    c.send(format!("set bad 0 0 {}\r\n", b2.len()).as_bytes());
    c.send(&b2);
    assert_eq!(c.call(b"XX"), b"CLIENT_ERROR bad data chunk\r\n");
    assert_eq!(f.store().get(b"bad").unwrap(), None);
    assert_eq!(c.call(b"get bad\r\n"), b"END\r\n");
    // A client that leaves mid-value stores nothing; the server goes on.
    let mut gone = f.client();
    gone.send(format!("set half 0 0 {}\r\n", big.len()).as_bytes());
    gone.send(&big[..100_000]);
    drop(gone);
    assert_eq!(c.call(b"get half\r\n"), b"END\r\n");
    let stats = String::from_utf8(c.call(b"stats\r\n")).unwrap();
    assert!(stats.contains("STAT granary_zero_copy_gets 1\r\n"), "{stats}");
    assert!(stats.contains("STAT granary_zero_copy_sets "), "{stats}");
}

/// Retrievals pipelined in one write are answered as one group (their
/// reads together): a refused key makes its own request's reply the error
/// alone (memcached 1.6 drops the `VALUE`s it had built), a
/// `gets` carries the CAS value a lone `gets` gives, and the requests keep
/// their order; `granary_pipelined_gets` counts them.
#[test]
fn pipelined_retrievals_are_answered_together_in_order() {
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(c.call(b"set a 3 0 1\r\n1\r\nset b 0 0 2\r\n22\r\n"), b"STORED\r\nSTORED\r\n");
    let lone = String::from_utf8(c.call(b"gets a\r\n")).unwrap();
    assert!(lone.starts_with("VALUE a 3 1 ") && lone.ends_with("\r\n1\r\nEND\r\n"), "{lone:?}");
    let long = "k".repeat(251);
    let req = format!("get a {long} b\r\ngets a\r\nget zz b\r\n");
    let want = format!("CLIENT_ERROR bad command line format\r\n{lone}VALUE b 0 2\r\n22\r\nEND\r\n");
    assert_eq!(String::from_utf8(c.call(req.as_bytes())).unwrap(), want);
    // Alone, one key before the refused one (the single-key path), and
    // with a touch (gat: the key before it is touched all the same).
    let err = "CLIENT_ERROR bad command line format\r\n";
    assert_eq!(String::from_utf8(c.call(format!("get a {long}\r\n").as_bytes())).unwrap(), err);
    assert_eq!(String::from_utf8(c.call(format!("gat 0 a {long}\r\n").as_bytes())).unwrap(), err);
    let stats = String::from_utf8(c.call(b"stats\r\n")).unwrap();
    assert!(stats.contains("STAT granary_pipelined_gets 3\r\n"), "{stats}");
}

/// A delayed `flush_all` happens when its time comes unless a later one
/// replaced it (memcached keeps one flush time): `flush_all 1` then
/// `flush_all` leaves what is set after them; `flush_all 1` alone flushes
/// them a second later; an absolute time already past flushes nothing.
#[test]
fn a_later_flush_all_replaces_a_delayed_one() {
    let f = Fixture::default();
    let mut c = f.client();
    // Past the replaced flush's time, with room for its timer to fire.
    let wait_past = |secs: u64| {
        let until = std::time::Instant::now() + std::time::Duration::from_millis(secs * 1000 + 2500);
        while std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    assert_eq!(c.call(b"flush_all 1\r\nflush_all\r\nset kept 0 0 1\r\nx\r\n"), b"OK\r\nOK\r\nSTORED\r\n");
    assert_eq!(c.call(b"flush_all 1000000000\r\nset past 0 0 1\r\ny\r\n"), b"OK\r\nSTORED\r\n");
    wait_past(1);
    assert_eq!(c.call(b"get kept past\r\n"), b"VALUE kept 0 1\r\nx\r\nVALUE past 0 1\r\ny\r\nEND\r\n");
    // Not replaced, it flushes (within a bound).
    assert_eq!(c.call(b"flush_all 1\r\n"), b"OK\r\n");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while c.call(b"get kept\r\n") != b"END\r\n" {
        assert!(std::time::Instant::now() < deadline, "the delayed flush did not happen");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A long pipeline of gets is answered in groups of at most
/// `PIPELINED_GETS_MAX` requests, and a text group takes no more lines
/// once it holds `PIPELINED_GET_KEYS_MAX` keys: every reply comes, in order,
/// and the requests answered alone (not in a group) show in the count.
#[test]
fn a_long_pipeline_of_gets_is_answered_in_bounded_groups() {
    use granary_memcache::limits::{PIPELINED_GETS_MAX, PIPELINED_GET_KEYS_MAX};
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(c.call(b"set a 0 0 1\r\n1\r\n"), b"STORED\r\n");
    // One more than a group: the last is answered alone.
    let n = PIPELINED_GETS_MAX + 1;
    let got = c.call("get a\r\n".repeat(n).as_bytes());
    assert_eq!(String::from_utf8(got).unwrap(), "VALUE a 0 1\r\n1\r\nEND\r\n".repeat(n));
    // A first line holding the key bound takes no other line; the two
    // after it form a group of their own.
    let first = format!("get{}\r\n", " a".repeat(PIPELINED_GET_KEYS_MAX));
    let req = format!("{first}get a\r\nget zz\r\n");
    let want =
        format!("{}END\r\nVALUE a 0 1\r\n1\r\nEND\r\nEND\r\n", "VALUE a 0 1\r\n1\r\n".repeat(PIPELINED_GET_KEYS_MAX));
    assert_eq!(String::from_utf8(c.call(req.as_bytes())).unwrap(), want);
    let stats = String::from_utf8(c.call(b"stats\r\n")).unwrap();
    let grouped = PIPELINED_GETS_MAX + 2;
    assert!(stats.contains(&format!("STAT granary_pipelined_gets {grouped}\r\n")), "{stats}");
}

#[test]
fn a_multi_get_of_large_items_is_sent_as_it_goes() {
    let f = Fixture::default();
    let mut c = f.client();
    let v = vec![b'v'; 1 << 20];
    c.send(format!("set big 0 0 {}\r\n", v.len()).as_bytes());
    c.send(&v);
    assert_eq!(c.call(b"\r\n"), b"STORED\r\n");
    // 64 MiB of reply to one request line.
    let req = format!("get{}\r\n", " big".repeat(64));
    let got = c.call(req.as_bytes());
    let one = format!("VALUE big 0 {}\r\n", v.len()).len() + v.len() + 2;
    assert_eq!(got.len(), 64 * one + 5);
    assert!(got.ends_with(b"END\r\n"));
    // A meta set with an impossible length is refused, nothing swallowed.
    assert_eq!(c.call(b"ms k 4294967296 T0\r\n"), b"CLIENT_ERROR bad command line format\r\n");
}

#[test]
fn a_client_that_does_not_read_holds_the_server_to_its_memory_bound() {
    use std::sync::atomic::Ordering::Relaxed;
    let f = Fixture::default();
    let mut c = f.client();
    let v = vec![b'm'; 512 << 10];
    c.send(format!("set big 0 0 {}\r\n", v.len()).as_bytes());
    c.send(&v);
    assert_eq!(c.call(b"\r\n"), b"STORED\r\n");
    // 400 GETs in one write (200 MiB of replies), sent by another thread;
    // none read yet.
    const GETS: u64 = 400;
    // The hit count is read before the GETs go out, so none is missed.
    let st = f.server.as_ref().unwrap().stats();
    let hits0 = st.get_hits.load(Relaxed);
    let mut w = c.s.try_clone().unwrap();
    let writer = std::thread::spawn(move || w.write_all(&b"get big\r\n".repeat(GETS as usize)).unwrap());
    // The server stops once the socket is full and it waits for this client.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while st.conns_waiting_to_send.load(Relaxed) == 0 {
        assert!(std::time::Instant::now() < deadline, "the server never waited for the client to read");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let bound = granary_memcache::limits::connection_bytes_bound(ServerConfig::default().item_bytes_max) as u64;
    let served = st.get_hits.load(Relaxed) - hits0;
    let held = st.conn_buffer_bytes_max.load(Relaxed);
    assert!(served < GETS, "all {GETS} replies were produced for a client that reads none");
    assert!(held <= bound, "a connection held {held} bytes, over its bound of {bound}");
    // Every reply then arrives whole, and the bound held throughout.
    let one = format!("VALUE big 0 {}\r\n", v.len()).len() + v.len() + 2 + 5;
    let mut got = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    while got < GETS * one as u64 {
        let n = std::io::Read::read(&mut c.s, &mut buf).unwrap();
        assert!(n > 0, "connection closed after {got} bytes");
        got += n as u64;
    }
    writer.join().unwrap();
    assert_eq!(c.call(b"get nothing\r\n"), b"END\r\n", "exactly the replies, nothing more");
    assert_eq!(st.get_hits.load(Relaxed) - hits0, GETS);
    let held = st.conn_buffer_bytes_max.load(Relaxed);
    assert!(held <= bound, "a connection held {held} bytes, over its bound of {bound}");
}

#[test]
fn limits_give_memcached_errors_and_the_connection_goes_on() {
    let cfg = ServerConfig { threads: 1, item_bytes_max: 1000, max_connections: 4, ..ServerConfig::default() };
    let f = Fixture::new(16 << 20, true, cfg);
    let mut c = f.client();
    c.call(b"set big 0 0 3\r\nold\r\n");
    // Too large: refused, its data skipped, the old value dropped (as memcached).
    let r = c.call(format!("set big 0 0 1001\r\n{}\r\nget big\r\n", "x".repeat(1001)).as_bytes());
    assert_eq!(r, b"SERVER_ERROR object too large for cache\r\nEND\r\n");
    let r = c.call(format!("append k 0 0 1001\r\n{}\r\n", "x".repeat(1001)).as_bytes());
    assert_eq!(r, b"SERVER_ERROR object too large for cache\r\n");
    // Append past the limit.
    c.call(format!("set k 0 0 900\r\n{}\r\n", "y".repeat(900)).as_bytes());
    let r = c.call(format!("append k 0 0 200\r\n{}\r\n", "z".repeat(200)).as_bytes());
    assert_eq!(r, b"SERVER_ERROR object too large for cache\r\n");
    // A key of 251 bytes.
    let r = c.call(format!("get {}\r\n", "k".repeat(251)).as_bytes());
    assert_eq!(r, b"CLIENT_ERROR bad command line format\r\n");
    assert_eq!(c.call(b"get k\r\n").len(), 900 + "VALUE k 0 900\r\n\r\nEND\r\n".len());
    // The three refusals are counted; memcached's general fields for
    // monitoring tools are there.
    let stats = String::from_utf8(c.call(b"stats\r\n")).unwrap();
    for want in ["STAT store_too_large 3\r\n", "STAT store_no_memory 0\r\n", "STAT max_connections 4\r\n"] {
        assert!(stats.contains(want), "{want:?} not in {stats}");
    }
    let cpu = |name: &str| stats.lines().find_map(|l| l.strip_prefix(&format!("STAT {name} "))).map(str::to_string);
    for name in ["rusage_user", "rusage_system"] {
        let v = cpu(name).unwrap_or_else(|| panic!("no {name}"));
        let (secs, micros) = v.split_once('.').unwrap_or_else(|| panic!("{name} {v}"));
        assert!(secs.parse::<u64>().is_ok() && micros.len() == 6 && micros.parse::<u32>().is_ok(), "{name} {v}");
    }
    // A line with no end is cut off and the connection closed.
    let mut l = f.client();
    l.send(&vec![b'g'; 70 * 1024]);
    assert_eq!(l.read_to_close(), b"CLIENT_ERROR line too long\r\n");
    // Connections past the limit are refused with memcached's message.
    let _held: Vec<Client> = (0..3).map(|_| f.client()).collect();
    for h in &_held {
        let mut h = Client { s: h.s.try_clone().unwrap() };
        h.call(b"version\r\n");
    }
    let mut extra = f.client();
    assert_eq!(extra.read_to_close(), b"SERVER_ERROR too many open connections\r\n");
    let st = f.server.as_ref().unwrap().stats();
    assert_eq!(st.listener.rejected_connections.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn store_mode_refuses_writes_when_full_and_cache_mode_evicts() {
    for evict in [false, true] {
        let f = Fixture::new(16 << 20, evict, ServerConfig { threads: 1, ..ServerConfig::default() });
        let mut c = f.client();
        let v = "v".repeat(4000);
        let mut refused = 0;
        for i in 0..8000 {
            let r = c.call(format!("set key-{i} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes());
            match &r[..] {
                b"STORED\r\n" => {}
                b"SERVER_ERROR out of memory storing object\r\n" => refused += 1,
                other => panic!("unexpected reply {:?}", String::from_utf8_lossy(other)),
            }
        }
        let st = f.store().stats();
        let counted = f.server.as_ref().unwrap().stats().store_no_memory.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(counted, refused, "store_no_memory counts the refusals");
        if evict {
            assert_eq!(refused, 0);
            assert!(st.gc.evicted_values > 0);
            let last = c.call(b"get key-7999\r\n");
            assert!(last.starts_with(b"VALUE key-7999 0 4000\r\n"));
        } else {
            assert!(refused > 0, "a full store in store mode refuses writes");
            assert_eq!(st.gc.evicted_values, 0);
            assert!(c.call(b"get key-0\r\n").starts_with(b"VALUE key-0 "), "nothing is evicted in store mode");
        }
    }
}

/// Seeded random garbage and truncated requests: the server never crashes,
/// and answers correctly on a fresh connection afterwards.
#[test]
fn garbage_never_crashes_the_server() {
    let seed: u64 = std::env::var("GRANARY_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    eprintln!("garbage seed {seed} (rerun: GRANARY_FUZZ_SEED={seed})");
    let f = Fixture::default();
    let mut rng = granary_store::io::SimRng::new(seed);
    let words: &[&[u8]] = &[
        b"get ",
        b"set ",
        b"ms ",
        b"mg ",
        b"ma ",
        b"md ",
        b"cas ",
        b"incr ",
        b"gat ",
        b"k ",
        b"0 ",
        b"-1 ",
        b"99999999999 ",
        b"5 ",
        b"\r\n",
        b"\n",
        b"noreply",
        b"T",
        b"v ",
        b"b ",
        b"q ",
        b"N1 ",
        b"MA ",
        b"\0",
        b"\xff",
        b"abcde",
    ];
    for round in 0..200 {
        let mut c = f.client();
        let mut req = Vec::new();
        for _ in 0..rng.below(40) {
            if rng.below(4) == 0 {
                let n = rng.below(20) as usize;
                req.extend((0..n).map(|_| rng.next_u64() as u8));
            } else {
                req.extend_from_slice(words[rng.below(words.len() as u64) as usize]);
            }
        }
        // Ignore the replies; the server may close on a too-long line.
        let _ = c.s.write_all(&req);
        drop(c);
        if round % 20 == 0 {
            let mut ok = f.client();
            assert_eq!(ok.call(b"set sane 0 0 2\r\nok\r\nget sane\r\n"), b"STORED\r\nVALUE sane 0 2\r\nok\r\nEND\r\n");
        }
    }
    let mut ok = f.client();
    assert!(ok.call(b"version\r\n").starts_with(b"VERSION "));
}

#[test]
fn shutdown_drains_connections_instead_of_cutting_them() {
    let mut f = Fixture::default();
    let mut idle = f.client();
    assert_eq!(idle.call(b"set a 0 0 1\r\n1\r\n"), b"STORED\r\n");
    let mut partial = f.client();
    partial.send(b"set b 0 0 10\r\nabc");
    // A full pipelined batch whose replies are read (so it was executed).
    let mut busy = f.client();
    let batch: Vec<u8> = (0..100).flat_map(|i| format!("set k{i} 0 0 1\r\nx\r\n").into_bytes()).collect();
    assert_eq!(busy.call(&batch), b"STORED\r\n".repeat(100));
    let started = std::time::Instant::now();
    let cancelled = f.server.take().unwrap().shutdown();
    assert_eq!(cancelled, 0, "every connection ended by itself");
    assert!(started.elapsed() < granary_memcache::server::DRAIN_TIMEOUT);
    // Every client sees the end of the connection, with nothing more sent.
    assert_eq!(idle.read_to_close(), b"");
    assert_eq!(partial.read_to_close(), b"");
    assert_eq!(busy.read_to_close(), b"");
    let s = f.store.as_ref().unwrap();
    assert!(s.get(b"a").unwrap().is_some());
    assert!(s.get(b"k99").unwrap().is_some());
    assert_eq!(s.get(b"b").unwrap(), None, "a request never completed is not executed");
}

/// Accepted connections go to the executors in turn, whichever executor's
/// accept took them (the kernel tends to hand most of them to one).
#[test]
fn connections_are_spread_over_the_executors() {
    use granary_rt::{Runtime, RuntimeConfig};
    use granary_store::io::MemDevice;
    use granary_store::{CreateOptions, OpenOptions, Store};
    use std::sync::Arc;
    let dev = Arc::new(MemDevice::new(64 << 20));
    let c = CreateOptions { segment_bytes: Some(2 << 20), grain_bytes: Some(512), ..CreateOptions::default() };
    let store = Arc::new(Store::create(dev, &c, &OpenOptions::default()).unwrap());
    let rt = Arc::new(Runtime::new(RuntimeConfig { threads: 2, pin: false, ..RuntimeConfig::default() }).unwrap());
    let cfg = ServerConfig { listen: "127.0.0.1:0".parse().unwrap(), ..ServerConfig::default() };
    let server = granary_memcache::Server::start_on(store, cfg, rt.clone()).unwrap();
    let before: Vec<u64> = rt.stats().iter().map(|s| s.spawned).collect();
    let mut clients: Vec<Client> = (0..8).map(|_| Client::connect(server.local_addr())).collect();
    for c in &mut clients {
        assert!(c.call(b"version\r\n").starts_with(b"VERSION "), "every connection is served");
    }
    let spawned: Vec<u64> = rt.stats().iter().zip(&before).map(|(s, b)| s.spawned - b).collect();
    assert!(spawned.iter().all(|&n| n >= 4), "8 connections, 4 to each executor at least: {spawned:?}");
    drop(clients);
    server.shutdown();
}

/// A listener serves one namespace: its keys, its `stats`, its
/// `flush_all`; the default listener does not see them.
/// A one-thread listener's settings for `namespace`, on a free port.
fn namespace_listener(namespace: &str) -> ServerConfig {
    ServerConfig {
        threads: 1,
        listen: ([127, 0, 0, 1], granary_rt::net::free_low_port().unwrap()).into(),
        namespace: namespace.into(),
        ..ServerConfig::default()
    }
}

/// In a namespace with a default TTL, a new item gets it and an item's
/// own expiry stays through what memcached makes a new item of (append,
/// prepend, ms's append mode, an incr whose result is longer) and through
/// md's invalidation and ms's stale store: `touch k 0` (never expires) is
/// not undone by them.
#[test]
fn a_namespace_default_ttl_goes_to_new_items_only() {
    let f = Fixture::default();
    let opts = granary_store::NamespaceOptions { default_ttl_secs: 100, ..Default::default() };
    f.store().create_namespace("ttl", opts).unwrap();
    let server = granary_memcache::Server::start(f.store.clone().unwrap(), namespace_listener("ttl")).unwrap();
    let mut c = Client::connect(server.local_addr());
    assert_eq!(c.call(b"set k 0 0 1\r\n9\r\nmg k t\r\n"), b"STORED\r\nHD t100\r\n");
    assert_eq!(c.call(b"touch k 0\r\nmg k t\r\n"), b"TOUCHED\r\nHD t-1\r\n");
    for (req, reply) in [
        (&b"incr k 1\r\n"[..], &b"10\r\n"[..]),
        (b"append k 0 0 1\r\nx\r\n", b"STORED\r\n"),
        (b"prepend k 0 0 1\r\ny\r\n", b"STORED\r\n"),
        (b"ms k 1 MA\r\nz\r\n", b"HD\r\n"),
        (b"md k I\r\n", b"HD\r\n"),
    ] {
        assert_eq!(c.call(req), reply, "{}", String::from_utf8_lossy(req));
        let got = String::from_utf8(c.call(b"mg k t\r\n")).unwrap();
        assert!(got.starts_with("HD t-1"), "after {}: {got}", String::from_utf8_lossy(req));
    }
    assert_eq!(c.call(b"mg k v\r\n"), b"VA 5 Z X\r\ny10xz\r\n");
    // A stale store (an older CAS value with I) keeps the item's expiry.
    assert_eq!(c.call(b"ms k 1 I C1\r\nw\r\n"), b"HD\r\n");
    assert_eq!(c.call(b"mg k t v\r\n"), b"VA 1 t-1 Z X\r\nw\r\n");
    assert_eq!(c.call(b"set n 0 0 1\r\n1\r\nincr n 99\r\nmg n t\r\n"), b"STORED\r\n100\r\nHD t100\r\n");
}

#[test]
fn a_listener_serves_its_namespace() {
    let f = Fixture::default();
    f.store().create_namespace("users", granary_store::NamespaceOptions::default()).unwrap();
    let store = f.store.clone().unwrap();
    let users = granary_memcache::Server::start(store.clone(), namespace_listener("users")).unwrap();
    let mut u = Client::connect(users.local_addr());
    let mut d = f.client();
    assert_eq!(u.call(b"set k 0 0 5\r\nusers\r\n"), b"STORED\r\n");
    assert_eq!(d.call(b"get k\r\n"), b"END\r\n");
    assert_eq!(d.call(b"set k 0 0 7\r\ndefault\r\n"), b"STORED\r\n");
    assert_eq!(u.call(b"get k\r\n"), b"VALUE k 0 5\r\nusers\r\nEND\r\n");
    assert_eq!(d.call(b"get k\r\n"), b"VALUE k 0 7\r\ndefault\r\nEND\r\n");
    let stats = String::from_utf8(u.call(b"stats\r\n")).unwrap();
    assert!(stats.contains("STAT curr_items 1\r\n"), "{stats}");
    assert!(stats.contains("STAT granary_namespace users\r\n"), "{stats}");
    assert_eq!(u.call(b"set k2 0 0 1\r\nx\r\n"), b"STORED\r\n");
    assert_eq!(f.store().namespace("users").unwrap().stats().unwrap().keys, 2);
    // flush_all empties the listener's namespace only.
    assert_eq!(u.call(b"flush_all\r\n"), b"OK\r\n");
    assert_eq!(u.call(b"get k k2\r\n"), b"END\r\n");
    assert_eq!(d.call(b"get k\r\n"), b"VALUE k 0 7\r\ndefault\r\nEND\r\n");
    users.shutdown();
    let err = granary_memcache::Server::start(store, namespace_listener("nope")).err().expect("no such namespace");
    assert!(err.to_string().contains("no namespace \"nope\""), "{err}");
}

/// In a cache-mode server, a listener's `cache` namespace at its quota
/// evicts its own oldest values: every set is stored, the namespace stays
/// within its limit, the newest key reads back, the oldest is gone, and
/// `stats` counts the evictions; the default namespace keeps its keys.
#[test]
fn a_namespace_at_its_quota_evicts_its_own_values() {
    let f = Fixture::default();
    let o = granary_store::NamespaceOptions { max_keys: Some(8), ..Default::default() };
    f.store().create_namespace("small", o).unwrap();
    let small = granary_memcache::Server::start(f.store.clone().unwrap(), namespace_listener("small")).unwrap();
    let mut c = Client::connect(small.local_addr());
    let mut d = f.client();
    assert_eq!(d.call(b"set mine 0 0 1\r\nd\r\n"), b"STORED\r\n");
    for i in 0..50 {
        assert_eq!(c.call(format!("set k{i} 0 0 1\r\nx\r\n").as_bytes()), b"STORED\r\n", "key {i}");
    }
    let st = f.store().namespace("small").unwrap().stats().unwrap();
    assert!(st.keys <= 8 && st.evictions >= 42, "{st:?}");
    assert_eq!(c.call(b"get k49\r\n"), b"VALUE k49 0 1\r\nx\r\nEND\r\n");
    assert_eq!(c.call(b"get k0\r\n"), b"END\r\n");
    let stats = String::from_utf8(c.call(b"stats\r\n")).unwrap();
    assert!(stats.contains(&format!("STAT curr_items {}\r\n", st.keys)), "{stats}");
    assert!(stats.contains(&format!("STAT evictions {}\r\n", st.evictions)), "{stats}");
    assert_eq!(d.call(b"get mine\r\n"), b"VALUE mine 0 1\r\nd\r\nEND\r\n");
    small.shutdown();
}

/// A touching get counts as memcached counts it: text `gat` and binary
/// GAT as a touch only, hit or miss (`cmd_touch`, `touch_hits`,
/// `touch_misses`, never `cmd_get` nor `get_hits`/`get_misses`); meta
/// `mg` with `T` as a touch when it found the item, as a GET miss when not.
#[test]
fn touching_gets_count_as_touches_only() {
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(c.call(b"set k 0 0 1\r\nv\r\n"), b"STORED\r\n");
    assert_eq!(c.call(b"gat 0 k\r\n"), b"VALUE k 0 1\r\nv\r\nEND\r\n");
    assert_eq!(c.call(b"gat 0 nope\r\n"), b"END\r\n");
    assert_eq!(c.call(b"mg k v T10\r\n"), b"VA 1\r\nv\r\n");
    assert_eq!(c.call(b"mg nope v T10\r\n"), b"EN\r\n");
    let stats = String::from_utf8(c.call(b"stats\r\n")).unwrap();
    let stat = |name: &str| -> String {
        let line = stats.lines().find(|l| l.starts_with(&format!("STAT {name} "))).unwrap_or_else(|| panic!("{name}"));
        line.rsplit(' ').next().unwrap().to_string()
    };
    let got: Vec<String> =
        ["cmd_get", "get_hits", "get_misses", "cmd_touch", "touch_hits", "touch_misses"].map(stat).to_vec();
    assert_eq!(got, ["1", "0", "1", "3", "2", "1"], "{stats}");
}

/// An append or prepend stores a new item, counted in `total_items` as
/// memcached counts it (and as the binary protocol's did).
#[test]
fn appends_count_as_items_stored() {
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(
        c.call(b"set k 0 0 1\r\nv\r\nappend k 0 0 1\r\nw\r\nprepend k 0 0 1\r\nu\r\n"),
        b"STORED\r\nSTORED\r\nSTORED\r\n"
    );
    assert_eq!(c.call(b"append nope 0 0 1\r\nw\r\n"), b"NOT_STORED\r\n");
    let stats = String::from_utf8(c.call(b"stats\r\n")).unwrap();
    assert!(stats.contains("STAT total_items 3\r\n"), "{stats}");
}

/// Clients racing to vivify one missing key (`mg k N30`): one creates it
/// and wins (`W`); every other reads the item made (`Z`), none answers a
/// miss, as memcached, which looks up and creates under one lock. Each
/// thread asks for the same keys in the same order, so their requests for
/// one key meet.
#[test]
fn a_vivify_that_loses_the_race_reads_the_item_made() {
    const THREADS: usize = 4;
    const KEYS: usize = 300;
    let f = Fixture::default();
    let start = std::sync::Arc::new(std::sync::Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (mut c, start) = (f.client(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                (0..KEYS)
                    .map(|i| String::from_utf8(c.call(format!("mg viv-{i} N30 s\r\n").as_bytes())).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let replies: Vec<Vec<String>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for i in 0..KEYS {
        let of_key: Vec<&str> = replies.iter().map(|r| r[i].as_str()).collect();
        assert_eq!(of_key.iter().filter(|r| **r == "HD s0 W\r\n").count(), 1, "key {i}: {of_key:?}");
        assert!(of_key.iter().all(|r| *r == "HD s0 W\r\n" || *r == "HD s0 Z\r\n"), "key {i}: {of_key:?}");
    }
}

/// However many delayed `flush_all` requests arrive, the server holds one
/// timer for them (each replaced the time of the one before); an absolute
/// time since the start that is already past flushes before its reply,
/// and cancels the pending one, whose timer then ends.
#[test]
fn delayed_flushes_hold_one_timer_and_a_past_time_flushes_before_its_reply() {
    let f = Fixture::default();
    let mut c = f.client();
    c.send("flush_all 2592000 noreply\r\n".repeat(5000).as_bytes());
    let stats = String::from_utf8(c.call(b"stats\r\n")).unwrap();
    assert!(stats.contains("STAT granary_flush_timers 1\r\n"), "{stats}");
    f.advance(10);
    let past = f.store().now() - 5;
    let req = format!("set k 0 0 1\r\nx\r\nflush_all {past}\r\nget k\r\n");
    assert_eq!(c.call(req.as_bytes()), b"STORED\r\nOK\r\nEND\r\n");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let stats = String::from_utf8(c.call(b"stats\r\n")).unwrap();
        if stats.contains("STAT granary_flush_timers 0\r\n") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the cancelled flush's timer did not end: {stats}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A request that arrives in pieces (a long line padded with spaces, then
/// its data a few bytes at a time) is answered once whole, as if it had
/// come at once, and the request after it follows.
#[test]
fn a_request_sent_in_pieces_is_answered_once_whole() {
    let f = Fixture::default();
    let mut c = f.client();
    let value: Vec<u8> = (0..3000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut req = format!("set k 7 0 {}{}\r\n", value.len(), " ".repeat(20_000)).into_bytes();
    req.extend_from_slice(&value);
    req.extend_from_slice(b"\r\n");
    for piece in req.chunks(997) {
        c.send(piece);
    }
    let mut want = b"STORED\r\nVALUE k 7 3000\r\n".to_vec();
    want.extend_from_slice(&value);
    want.extend_from_slice(b"\r\nEND\r\n");
    assert_eq!(c.call(b"get k\r\n"), want);
}
