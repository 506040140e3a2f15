//! Key dumps and the administrative commands tools expect of memcached:
//! `stats cachedump`, `lru_crawler metadump` (and the crawler's other
//! subcommands), `stats items` as memcdump reads it, `stats detail` and
//! `shutdown` without `-A`. Replies recorded from memcached 1.6.18.

mod common;

use common::*;
use std::collections::HashMap;

/// Store `keys` (value `v<i>`, no expiry) in one pipelined batch.
fn set_all(c: &mut Client, keys: &[String]) {
    let mut req = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let v = format!("v{i}");
        req.extend_from_slice(format!("set {k} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes());
    }
    let got = c.call(&req);
    assert_eq!(got, "STORED\r\n".repeat(keys.len()).as_bytes());
}

fn text(b: Vec<u8>) -> String {
    String::from_utf8(b).unwrap()
}

/// `stats cachedump`'s lines as key -> (bytes, exptime); each key once.
fn cachedump(c: &mut Client, args: &str) -> HashMap<String, (usize, u64)> {
    let got = text(c.call(format!("stats cachedump {args}\r\n").as_bytes()));
    let body = got.strip_suffix("END\r\n").unwrap_or_else(|| panic!("no END: {got:?}"));
    let mut m = HashMap::new();
    for line in body.split_terminator("\r\n") {
        let rest = line.strip_prefix("ITEM ").unwrap();
        let (key, fields) = rest.split_once(" [").unwrap();
        let fields = fields.strip_suffix(" s]").unwrap();
        let (bytes, exp) = fields.split_once(" b; ").unwrap();
        let old = m.insert(key.to_string(), (bytes.parse().unwrap(), exp.parse().unwrap()));
        assert!(old.is_none(), "{key} listed twice");
    }
    m
}

/// `lru_crawler metadump`'s lines as encoded key -> its fields; each once.
fn metadump(c: &mut Client, classes: &str) -> HashMap<String, HashMap<String, String>> {
    let got = text(c.call(format!("lru_crawler metadump {classes}\r\n").as_bytes()));
    let body = got.strip_suffix("END\r\n").unwrap_or_else(|| panic!("no END: {got:?}"));
    let mut m = HashMap::new();
    for line in body.split_terminator('\n') {
        assert!(!line.ends_with('\r'), "metadump lines end in a bare newline");
        let fields: HashMap<String, String> = line
            .split(' ')
            .map(|f| {
                let (k, v) = f.split_once('=').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect();
        let key = fields["key"].clone();
        assert!(m.insert(key.clone(), fields).is_none(), "{key} listed twice");
    }
    m
}

#[test]
fn cachedump_and_metadump_list_every_key_once_with_its_expiry() {
    let f = Fixture::default();
    let mut c = f.client();
    let now = f.store().now() as u64;
    let keys: Vec<String> = (0..700).map(|i| format!("key:{i}")).collect();
    set_all(&mut c, &keys);
    let got = c.call(b"set exp 0 100 3\r\nxyz\r\nset c%20d 0 0 2\r\nhi\r\nget key:1\r\n");
    assert_eq!(got, b"STORED\r\nSTORED\r\nVALUE key:1 0 2\r\nv1\r\nEND\r\n");
    let dump = cachedump(&mut c, "1 0");
    assert_eq!(dump.len(), 702);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(dump[k], (format!("v{i}").len(), 0), "{k}");
    }
    assert_eq!(dump["exp"], (3, now + 100));
    assert_eq!(dump["c%20d"], (2, 0));

    let meta = metadump(&mut c, "all");
    assert_eq!(meta.len(), 702);
    for (i, k) in keys.iter().enumerate() {
        let fl = &meta[&k.replace(':', "%3A")];
        assert_eq!(fl["exp"], "-1");
        assert_eq!(fl["size"], format!("v{i}").len().to_string());
        assert_eq!(fl["cls"], "1");
        assert_eq!(fl["la"], now.to_string());
        assert_eq!(fl["fetch"], if i == 1 { "yes" } else { "no" }, "{k}");
    }
    assert_eq!(meta["exp"]["exp"], (now + 100).to_string());
    assert_eq!(meta["c%2520d"]["size"], "2");
    // A dump reads without marking items fetched.
    assert_eq!(metadump(&mut c, "all")["key%3A2"]["fetch"], "no");
    // The CAS value is the item's.
    let gets = text(c.call(b"gets exp\r\n"));
    assert_eq!(gets.lines().next().unwrap().rsplit(' ').next().unwrap(), meta["exp"]["cas"]);
    // Class lists that take class 1, and `hash`, list every key; other
    // valid classes are empty.
    assert_eq!(metadump(&mut c, "1,2").len(), 702);
    assert_eq!(metadump(&mut c, "hash").len(), 702);
    assert!(metadump(&mut c, "2,63").is_empty());
    assert!(cachedump(&mut c, "2 0").is_empty());
    assert!(cachedump(&mut c, "0 0").is_empty());

    // Expired and deleted keys are gone from both.
    f.advance(101);
    assert_eq!(c.call(b"delete key:0\r\n"), b"DELETED\r\n");
    let dump = cachedump(&mut c, "1 0");
    assert_eq!(dump.len(), 700);
    assert!(!dump.contains_key("exp") && !dump.contains_key("key:0"));
    assert_eq!(metadump(&mut c, "all").len(), 700);
}

#[test]
fn cachedump_dram_lists_the_keys_the_dram_tier_holds() {
    let f = Fixture::with_dram_tier(4 << 20);
    let mut c = f.client();
    let now = f.store().now() as u64;
    let keys: Vec<String> = (0..100).map(|i| format!("key:{i}")).collect();
    set_all(&mut c, &keys);
    // Reads from the device offer their items to the tier.
    let mut hot = HashMap::new();
    for (i, k) in keys.iter().enumerate().take(20) {
        assert_eq!(
            text(c.call(format!("get {k}\r\n").as_bytes())),
            format!("VALUE {k} 0 {0}\r\nv{i}\r\nEND\r\n", format!("v{i}").len())
        );
        hot.insert(k.clone(), (format!("v{i}").len(), 0));
    }
    assert_eq!(text(c.call(b"set exp 0 100 3\r\nxyz\r\nget exp\r\n")), "STORED\r\nVALUE exp 0 3\r\nxyz\r\nEND\r\n");
    hot.insert("exp".into(), (3, now + 100));
    assert_eq!(cachedump(&mut c, "dram 0"), hot);
    let some = cachedump(&mut c, "dram 5");
    assert_eq!(some.len(), 5);
    assert!(some.iter().all(|(k, v)| hot.get(k) == Some(v)));

    // Deleted and expired items are not listed.
    assert_eq!(c.call(b"delete key:3\r\n"), b"DELETED\r\n");
    f.advance(101);
    let dump = cachedump(&mut c, "dram 0");
    assert_eq!(dump.len(), 19);
    assert!(!dump.contains_key("key:3") && !dump.contains_key("exp"));
    assert_eq!(c.call(b"stats cachedump dram x\r\n"), b"CLIENT_ERROR bad command line format\r\n");
    // Class 1 still lists every key (its walk reads them, as GETs that
    // the tier may admit: last).
    assert_eq!(cachedump(&mut c, "1 0").len(), 99);

    // Without a tier the dump is empty.
    let g = Fixture::default();
    let mut c = g.client();
    set_all(&mut c, &keys[..3]);
    assert_eq!(c.call(b"get key:0\r\n"), b"VALUE key:0 0 2\r\nv0\r\nEND\r\n");
    assert!(cachedump(&mut c, "dram 0").is_empty());
}

#[test]
fn cachedump_stops_at_its_limit_and_at_memcached_s_reply_cap() {
    let f = Fixture::default();
    let mut c = f.client();
    // Long keys: 9000 of them pass the 2 MiB cap, and their metadump
    // passes the reply buffer's flush point many times.
    let keys: Vec<String> = (0..9000).map(|i| format!("{i:0>240}")).collect();
    set_all(&mut c, &keys);
    assert_eq!(cachedump(&mut c, "1 1").len(), 1);
    assert_eq!(cachedump(&mut c, "1 25").len(), 25);
    let got = c.call(b"stats cachedump 1 0\r\n");
    assert!(got.len() <= granary_memcache::limits::CACHEDUMP_BYTES_MAX, "{} bytes", got.len());
    let shown = got.split(|&b| b == b'\n').filter(|l| l.starts_with(b"ITEM ")).count();
    assert!(shown > 7000 && shown < 9000, "{shown} keys");
    let meta = metadump(&mut c, "all");
    assert_eq!(meta.len(), 9000);
    assert!(keys.iter().all(|k| meta.contains_key(k)));
    // The connection goes on.
    assert_eq!(c.call(b"get nope\r\n"), b"END\r\n");
}

/// (request, memcached 1.6.18's reply), with its LRU crawler enabled and
/// without `-A`: recorded from it over a socket, one request at a time
/// (its metadump runs in the crawler's thread, so a pipelined `mn` may
/// overtake it: the table is not replayed against it here).
const ADMIN_CASES: &[(&str, &str)] = &[
    ("stats cachedump 1\r\n", "CLIENT_ERROR bad command line\r\n"),
    ("stats cachedump\r\n", "CLIENT_ERROR bad command line\r\n"),
    ("stats cachedump x 0\r\n", "CLIENT_ERROR bad command line format\r\n"),
    ("stats cachedump 1 x\r\n", "CLIENT_ERROR bad command line format\r\n"),
    ("stats cachedump -1 0\r\n", "CLIENT_ERROR bad command line format\r\n"),
    ("stats cachedump 1 -1\r\n", "CLIENT_ERROR bad command line format\r\n"),
    ("stats cachedump 64 0\r\n", "CLIENT_ERROR Illegal slab id\r\n"),
    ("stats cachedump 63 0\r\n", "END\r\n"),
    ("stats cachedump 1 0 5\r\n", "ITEM a [1 b; 0 s]\r\nEND\r\n"),
    ("lru_crawler metadump\r\n", "ERROR\r\n"),
    ("lru_crawler metadump x\r\n", "BADCLASS invalid class id\r\n"),
    ("lru_crawler metadump 0\r\n", "BADCLASS invalid class id\r\n"),
    ("lru_crawler metadump 64\r\n", "BADCLASS invalid class id\r\n"),
    ("lru_crawler metadump 1 2\r\n", "ERROR\r\n"),
    ("lru_crawler metadump all x\r\n", "ERROR\r\n"),
    ("lru_crawler metadump 2\r\n", "END\r\n"),
    ("lru_crawler crawl all\r\n", "OK\r\n"),
    ("lru_crawler crawl\r\n", "ERROR\r\n"),
    ("lru_crawler crawl x\r\n", "BADCLASS invalid class id\r\n"),
    ("lru_crawler sleep 100\r\n", "OK\r\n"),
    ("lru_crawler sleep x\r\n", "CLIENT_ERROR bad command line format\r\n"),
    ("lru_crawler tocrawl 10\r\n", "OK\r\n"),
    ("lru_crawler tocrawl\r\n", "ERROR\r\n"),
    ("lru_crawler foo\r\n", "ERROR\r\n"),
    ("lru_crawler\r\n", "ERROR\r\n"),
    ("lru_crawler mgdump all\r\n", "ERROR\r\n"),
    ("stats detail on\r\n", "OK\r\n"),
    ("stats detail off\r\n", "OK\r\n"),
    ("stats detail on x\r\n", "OK\r\n"),
    ("stats detail dump\r\n", "END\r\n"),
    ("stats detail\r\n", "CLIENT_ERROR usage: stats detail on|off|dump\r\n"),
    ("stats detail foo\r\n", "CLIENT_ERROR usage: stats detail on|off|dump\r\n"),
    ("shutdown\r\n", "ERROR: shutdown not enabled\r\n"),
    ("shutdown graceful\r\n", "ERROR: shutdown not enabled\r\n"),
    ("shutdown x\r\n", "ERROR: shutdown not enabled\r\n"),
];

fn admin_replies(addr: std::net::SocketAddr) -> Vec<(String, String)> {
    let mut c = Client::connect(addr);
    assert_eq!(c.call(b"flush_all\r\nset a 0 0 1\r\nx\r\n"), b"OK\r\nSTORED\r\n");
    ADMIN_CASES.iter().map(|(req, _)| (req.to_string(), text(c.call(req.as_bytes())))).collect()
}

#[test]
fn admin_commands_answer_as_memcached() {
    let f = Fixture::default();
    for ((req, got), (_, want)) in admin_replies(f.addr).iter().zip(ADMIN_CASES) {
        assert_eq!(got, want, "reply to {req:?}");
    }
    // The server goes on serving.
    assert_eq!(f.client().call(b"get a\r\n"), b"VALUE a 0 1\r\nx\r\nEND\r\n");
}

#[test]
fn memcdump_lists_every_key() {
    let Some(tool) = peer("memcdump") else { return };
    let f = Fixture::default();
    let mut c = f.client();
    let keys: Vec<String> = (0..1500).map(|i| format!("dump-{i}")).collect();
    set_all(&mut c, &keys);
    let out = std::process::Command::new(tool).arg(format!("--servers=127.0.0.1:{}", f.addr.port())).output().unwrap();
    assert!(out.status.success(), "memcdump: {}", String::from_utf8_lossy(&out.stderr));
    let mut got: Vec<String> = text(out.stdout).lines().map(str::to_string).collect();
    got.sort();
    let mut want = keys.clone();
    want.sort();
    assert_eq!(got, want);
}
