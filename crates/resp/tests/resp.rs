//! The RESP server end to end over TCP: replies of each command family,
//! pipelining, inline commands, protocol errors, RESP3, databases,
//! MULTI/EXEC/WATCH, and the limits.

mod common;

use common::{encode, Fixture, Value};
use granary_resp::limits::INLINE_BYTES_MAX;
use std::time::{SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

#[test]
fn strings_and_their_options() {
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(c.cmd("PING"), Value::Simple("PONG".into()));
    assert_eq!(c.cmd("SET k v"), Value::ok());
    assert_eq!(c.cmd("GET k"), Value::bulk("v"));
    assert_eq!(c.cmd("SET k w NX"), Value::Nil);
    assert_eq!(c.cmd("SET k w XX GET"), Value::bulk("v"));
    assert_eq!(c.cmd("SET nokey w XX"), Value::Nil);
    assert_eq!(c.cmd("SET k x NX XX"), Value::err("ERR syntax error"));
    assert_eq!(c.cmd("SET k x EX 0"), Value::err("ERR invalid expire time in 'set' command"));
    assert_eq!(c.cmd("SET k x EX a"), Value::err("ERR value is not an integer or out of range"));
    assert_eq!(c.cmd("SET k x EX 100 KEEPTTL"), Value::err("ERR syntax error"));
    assert_eq!(c.cmd("APPEND k 12"), Value::Int(3));
    assert_eq!(c.cmd("STRLEN k"), Value::Int(3));
    assert_eq!(c.cmd("GETRANGE k 1 -1"), Value::bulk("12"));
    assert_eq!(c.cmd("SETRANGE k 5 ab"), Value::Int(7));
    assert_eq!(c.call(&[b"GET", b"k"]), Value::Bulk(b"w12\0\0ab".to_vec()));
    assert_eq!(c.cmd("SETRANGE k -1 ab"), Value::err("ERR offset is out of range"));
    assert_eq!(c.cmd("MSET a 1 b 2"), Value::ok());
    assert_eq!(c.cmd("MGET a b zz"), Value::Array(vec![Value::bulk("1"), Value::bulk("2"), Value::Nil]));
    assert_eq!(c.cmd("MSETNX a 3 c 4"), Value::Int(0));
    assert_eq!(c.cmd("EXISTS c"), Value::Int(0), "MSETNX set nothing");
    assert_eq!(c.cmd("MSETNX c 3 d 4"), Value::Int(1));
    assert_eq!(c.cmd("MSET a"), Value::err("ERR wrong number of arguments for 'mset' command"));
    assert_eq!(c.cmd("MSET a 1 b"), Value::err("ERR wrong number of arguments for 'mset' command"));
    assert_eq!(c.cmd("GETSET a 9"), Value::bulk("1"));
    assert_eq!(c.cmd("GETDEL a"), Value::bulk("9"));
    assert_eq!(c.cmd("GETDEL a"), Value::Nil);
    assert_eq!(c.cmd("SETNX a 1"), Value::Int(1));
    assert_eq!(c.cmd("SETNX a 2"), Value::Int(0));
}

/// An MSET that names one key (once or more) is one SET of its last value,
/// not a batch (so the writes of a hot key that queue behind it combine);
/// one of several keys is one batch, each key's last value written.
#[test]
fn an_mset_of_one_key_is_one_set_of_its_last_value() {
    let f = Fixture::default();
    let mut c = f.client();
    let store = f.store.as_ref().unwrap();
    let server = f.server.as_ref().unwrap();
    let counts = || (store.stats().puts, server.stats().txn_commits.load(std::sync::atomic::Ordering::Relaxed));
    // (db0 made first: its creation is a write of the catalog.)
    assert_eq!(c.cmd("SET other v"), Value::ok());
    let (puts, batches) = counts();
    assert_eq!(c.cmd("MSET k 1 k 2 k 3"), Value::ok());
    assert_eq!(c.cmd("GET k"), Value::bulk("3"));
    assert_eq!(counts(), (puts + 1, batches));
    assert_eq!(c.cmd("MSET k 4 j 5 k 6"), Value::ok());
    assert_eq!(c.cmd("MGET k j"), Value::Array(vec![Value::bulk("6"), Value::bulk("5")]));
    assert_eq!(counts().1, batches + 1);
    assert_eq!(c.cmd("MSET k 7 k"), Value::err("ERR wrong number of arguments for 'mset' command"));
    assert_eq!(c.cmd("GET k"), Value::bulk("6"));
}

/// In a database an operator gave a default TTL, a new value gets it (a
/// SET, a key INCR or HSET creates); a change of a live value keeps the
/// key's own expiry, none included (PERSIST, APPEND, INCR, HSET, SET
/// KEEPTTL), as Redis keeps it; in MULTI/EXEC and multi-key commands
/// (one engine batch) too, and RENAME carries the key's own.
#[test]
fn a_database_s_default_ttl_goes_to_new_values_only() {
    let f = Fixture::default();
    let store = f.store.as_ref().unwrap();
    let opts = granary_store::NamespaceOptions { default_ttl_secs: 1000, ..Default::default() };
    store.create_namespace("db0", opts).unwrap();
    let mut c = f.client();
    let ttl = |c: &mut common::Client, key: &str| match c.cmd(&format!("TTL {key}")) {
        Value::Int(t) => t,
        v => panic!("{v:?}"),
    };
    let defaulted = |t: i64| (990..=1000).contains(&t);
    assert_eq!(c.cmd("SET k v"), Value::ok());
    assert!(defaulted(ttl(&mut c, "k")));
    assert_eq!(c.cmd("PERSIST k"), Value::Int(1));
    assert_eq!(ttl(&mut c, "k"), -1);
    assert_eq!(c.cmd("APPEND k w"), Value::Int(2));
    assert_eq!(ttl(&mut c, "k"), -1, "APPEND keeps no expiry");
    assert_eq!(c.cmd("SET k x KEEPTTL"), Value::ok());
    assert_eq!(ttl(&mut c, "k"), -1, "KEEPTTL keeps no expiry");
    assert_eq!(c.cmd("SET k y"), Value::ok());
    assert!(defaulted(ttl(&mut c, "k")), "a SET is a new value");
    assert_eq!(c.cmd("INCR n"), Value::Int(1));
    assert!(defaulted(ttl(&mut c, "n")), "a counter INCR creates");
    assert_eq!(c.cmd("PERSIST n"), Value::Int(1));
    assert_eq!(c.cmd("INCR n"), Value::Int(2));
    assert_eq!(ttl(&mut c, "n"), -1);
    assert_eq!(c.cmd("HSET h f 1"), Value::Int(1));
    assert!(defaulted(ttl(&mut c, "h")));
    assert_eq!(c.cmd("PERSIST h"), Value::Int(1));
    assert_eq!(c.cmd("HSET h g 2"), Value::Int(1));
    assert_eq!(ttl(&mut c, "h"), -1);
    // The same inside MULTI/EXEC, whose writes are one engine batch: a
    // PERSIST holds, a change keeps no expiry, a new value gets the default.
    assert_eq!(c.cmd("SET t v"), Value::ok());
    assert_eq!(c.cmd("PERSIST k"), Value::Int(1));
    assert_eq!(c.cmd("MULTI"), Value::ok());
    for cmd in ["PERSIST t", "APPEND k z", "INCR n", "HSET h i 3", "SET fresh 1", "INCR fresh2"] {
        assert_eq!(c.cmd(cmd), Value::Simple("QUEUED".into()));
    }
    assert!(matches!(c.cmd("EXEC"), Value::Array(v) if v.len() == 6));
    for key in ["t", "k", "n", "h"] {
        assert_eq!(ttl(&mut c, key), -1, "{key} in MULTI/EXEC");
    }
    assert!(defaulted(ttl(&mut c, "fresh")) && defaulted(ttl(&mut c, "fresh2")));
    // A SET then a change in one transaction: the SET's value got the
    // default, which the change keeps (as one after the other outside).
    assert_eq!(c.cmd("MULTI"), Value::ok());
    assert_eq!(c.cmd("SET s a"), Value::Simple("QUEUED".into()));
    assert_eq!(c.cmd("APPEND s b"), Value::Simple("QUEUED".into()));
    assert_eq!(c.cmd("EXEC"), Value::Array(vec![Value::ok(), Value::Int(2)]));
    assert!(defaulted(ttl(&mut c, "s")));
    // RENAME carries the key's expiry, none included; MSETNX's values are new.
    assert_eq!(c.cmd("RENAME t t2"), Value::ok());
    assert_eq!(ttl(&mut c, "t2"), -1, "RENAME keeps no expiry");
    assert_eq!(c.cmd("EXPIRE t2 5000"), Value::Int(1));
    assert_eq!(c.cmd("RENAME t2 t3"), Value::ok());
    assert!((4990..=5000).contains(&ttl(&mut c, "t3")), "RENAME keeps its expiry");
    assert_eq!(c.cmd("MSETNX m1 1 m2 2"), Value::Int(1));
    assert!(defaulted(ttl(&mut c, "m1")) && defaulted(ttl(&mut c, "m2")));
}

#[test]
fn counters() {
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(c.cmd("INCR n"), Value::Int(1));
    assert_eq!(c.cmd("INCRBY n 41"), Value::Int(42));
    assert_eq!(c.cmd("DECR n"), Value::Int(41));
    assert_eq!(c.cmd("DECRBY n 40"), Value::Int(1));
    assert_eq!(c.cmd("SET n 9223372036854775807"), Value::ok());
    assert_eq!(c.cmd("INCR n"), Value::err("ERR increment or decrement would overflow"));
    assert_eq!(c.cmd("DECRBY n -9223372036854775808"), Value::err("ERR decrement would overflow"));
    assert_eq!(c.cmd("SET s abc"), Value::ok());
    assert_eq!(c.cmd("INCR s"), Value::err("ERR value is not an integer or out of range"));
    assert_eq!(c.cmd("INCRBY n x"), Value::err("ERR value is not an integer or out of range"));
    assert_eq!(c.cmd("INCRBYFLOAT f 10.5"), Value::bulk("10.5"));
    assert_eq!(c.cmd("INCRBYFLOAT f 5.0e3"), Value::bulk("5010.5"));
    assert_eq!(c.cmd("INCRBYFLOAT f x"), Value::err("ERR value is not a valid float"));
    assert_eq!(c.cmd("HSET h f 1"), Value::Int(1));
    assert_eq!(c.cmd("INCR h"), Value::err("WRONGTYPE Operation against a key holding the wrong kind of value"));
}

#[test]
fn hashes() {
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(c.cmd("HSET h a 1 b 2"), Value::Int(2));
    assert_eq!(c.cmd("HSET h a 3 c 4"), Value::Int(1));
    assert_eq!(c.cmd("HGET h a"), Value::bulk("3"));
    assert_eq!(c.cmd("HGET h zz"), Value::Nil);
    assert_eq!(c.cmd("HMGET h a zz c"), Value::Array(vec![Value::bulk("3"), Value::Nil, Value::bulk("4")]));
    assert_eq!(c.cmd("HGETALL h"), Value::array(&["a", "3", "b", "2", "c", "4"]));
    assert_eq!(c.cmd("HLEN h"), Value::Int(3));
    assert_eq!(c.cmd("HKEYS h"), Value::array(&["a", "b", "c"]));
    assert_eq!(c.cmd("HVALS h"), Value::array(&["3", "2", "4"]));
    assert_eq!(c.cmd("HEXISTS h b"), Value::Int(1));
    assert_eq!(c.cmd("HINCRBY h a 10"), Value::Int(13));
    assert_eq!(c.cmd("HSETNX h a 1"), Value::Int(0));
    assert_eq!(c.cmd("HSETNX h d 1"), Value::Int(1));
    assert_eq!(c.cmd("HMSET h e 5"), Value::ok());
    assert_eq!(c.cmd("HSET h x"), Value::err("ERR wrong number of arguments for 'hset' command"));
    assert_eq!(c.cmd("HDEL h a b zz"), Value::Int(2));
    assert_eq!(c.cmd("TYPE h"), Value::Simple("hash".into()));
    assert_eq!(c.cmd("HDEL h c d e"), Value::Int(3));
    assert_eq!(c.cmd("EXISTS h"), Value::Int(0), "an emptied hash is deleted");
    assert_eq!(c.cmd("SET s v"), Value::ok());
    assert_eq!(c.cmd("HGET s a"), Value::err("WRONGTYPE Operation against a key holding the wrong kind of value"));
    assert_eq!(c.cmd("GET h"), Value::Nil);
}

#[test]
fn keys_expiry_and_rename() {
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(c.cmd("SET k v"), Value::ok());
    assert_eq!(c.cmd("TTL k"), Value::Int(-1));
    assert_eq!(c.cmd("TTL nokey"), Value::Int(-2));
    // TTLs are read on the real clock: a loaded machine may take seconds
    // between two commands, so a TTL of 100 reads as 95 to 100.
    let ttl_near_100 = |got: Value| matches!(got, Value::Int(95..=100));
    assert_eq!(c.cmd("EXPIRE k 100"), Value::Int(1));
    assert!(ttl_near_100(c.cmd("TTL k")));
    let Value::Int(pttl) = c.cmd("PTTL k") else { panic!() };
    assert!((95_000..=100_000).contains(&pttl), "{pttl}");
    assert_eq!(c.cmd("EXPIRE k 50 GT"), Value::Int(0));
    assert_eq!(c.cmd("EXPIRE k 50 LT"), Value::Int(1));
    assert_eq!(c.cmd("EXPIRE k 50 NX"), Value::Int(0));
    assert_eq!(
        c.cmd("EXPIRE k 50 NX XX"),
        Value::err("ERR NX and XX, GT or LT options at the same time are not compatible")
    );
    assert_eq!(c.cmd("EXPIRE k 50 FOO"), Value::err("ERR Unsupported option FOO"));
    assert_eq!(c.cmd("PERSIST k"), Value::Int(1));
    assert_eq!(c.cmd("PERSIST k"), Value::Int(0));
    // A millisecond expiry survives in the record and is honoured.
    let at = now_ms() + 3_600_123;
    assert_eq!(c.cmd(&format!("PEXPIREAT k {at}")), Value::Int(1));
    let Value::Int(pttl) = c.cmd("PTTL k") else { panic!() };
    assert!(pttl > 3_599_000 && pttl <= 3_600_123, "{pttl}");
    // An expiry in the past deletes.
    assert_eq!(c.cmd("EXPIREAT k 1"), Value::Int(1));
    assert_eq!(c.cmd("EXISTS k"), Value::Int(0));
    // SET PXAT a few ms ahead: gone once that millisecond has passed,
    // though the engine's whole second may not have.
    let at = now_ms() + 20;
    assert_eq!(c.cmd(&format!("SET e v PXAT {at}")), Value::ok());
    while now_ms() <= at {
        std::thread::yield_now();
    }
    assert_eq!(c.cmd("GET e"), Value::Nil);
    assert_eq!(c.cmd("SET e v NX"), Value::ok(), "an expired key counts as absent");
    assert_eq!(c.cmd("SET a 1 EX 100"), Value::ok());
    assert_eq!(c.cmd("RENAME a b"), Value::ok());
    assert_eq!(c.cmd("GET b"), Value::bulk("1"));
    assert!(ttl_near_100(c.cmd("TTL b")), "RENAME keeps the expiry");
    assert_eq!(c.cmd("RENAME a b"), Value::err("ERR no such key"));
    assert_eq!(c.cmd("DEL b e nokey"), Value::Int(2));
    assert_eq!(c.cmd("SET k v EX 100"), Value::ok());
    assert_eq!(c.cmd("SET k w KEEPTTL"), Value::ok());
    assert!(ttl_near_100(c.cmd("TTL k")));
    assert_eq!(c.cmd("GETEX k PERSIST"), Value::bulk("w"));
    assert_eq!(c.cmd("TTL k"), Value::Int(-1));
    assert_eq!(c.cmd("GETEX k NX"), Value::err("ERR syntax error"));
}

#[test]
fn scan_keys_randomkey_and_dbsize() {
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(c.cmd("RANDOMKEY"), Value::Nil);
    for i in 0..500 {
        assert_eq!(c.cmd(&format!("SET key:{i} v")), Value::ok());
    }
    assert_eq!(c.cmd("HSET other f v"), Value::Int(1));
    assert_eq!(c.cmd("DBSIZE"), Value::Int(501));
    let mut seen = std::collections::BTreeSet::new();
    let mut cursor = "0".to_string();
    loop {
        let Value::Array(r) = c.cmd(&format!("SCAN {cursor} MATCH key:* COUNT 37")) else { panic!() };
        let (Value::Bulk(next), Value::Array(keys)) = (&r[0], &r[1]) else { panic!("{r:?}") };
        for k in keys {
            let Value::Bulk(k) = k else { panic!() };
            seen.insert(String::from_utf8(k.clone()).unwrap());
        }
        cursor = String::from_utf8(next.clone()).unwrap();
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(seen.len(), 500);
    assert!(seen.iter().all(|k| k.starts_with("key:")));
    let Value::Array(r) = c.cmd("SCAN 0 TYPE hash COUNT 1000") else { panic!() };
    assert_eq!(r[1], Value::array(&["other"]));
    let Value::Array(k) = c.cmd("KEYS key:1?") else { panic!() };
    assert_eq!(k.len(), 10);
    assert!(matches!(c.cmd("RANDOMKEY"), Value::Bulk(_)));
    assert_eq!(c.cmd("SCAN x"), Value::err("ERR invalid cursor"));
    assert_eq!(c.cmd("SCAN 0 COUNT 0"), Value::err("ERR syntax error"));
}

/// RANDOMKEY in an empty database, beside another holding many keys,
/// walks the store's index once: a pick that found none is not followed
/// by a scan of it all again (each walk reads a record of every other
/// database's key).
#[test]
fn randomkey_of_an_empty_database_walks_the_index_once() {
    let f = Fixture::default();
    let mut c = f.client();
    const N: u64 = 2000;
    for i in 0..N {
        assert_eq!(c.cmd(&format!("SET key:{i} v")), Value::ok());
    }
    assert_eq!(c.cmd("SELECT 1"), Value::ok());
    let store = f.store.as_ref().unwrap();
    let before = store.stats().io.reads;
    assert_eq!(c.cmd("RANDOMKEY"), Value::Nil);
    let reads = store.stats().io.reads - before;
    assert!(reads < N * 3 / 2, "{reads} device reads for {N} keys of another database: more than one walk");
}

#[test]
fn databases_are_namespaces() {
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(c.cmd("SET k zero"), Value::ok());
    assert_eq!(c.cmd("SELECT 1"), Value::ok());
    assert_eq!(c.cmd("GET k"), Value::Nil);
    assert_eq!(c.cmd("SET k one"), Value::ok());
    assert_eq!(c.cmd("SELECT 16"), Value::err("ERR DB index is out of range"));
    assert_eq!(c.cmd("SELECT x"), Value::err("ERR value is not an integer or out of range"));
    assert_eq!(c.cmd("FLUSHDB"), Value::ok());
    assert_eq!(c.cmd("DBSIZE"), Value::Int(0));
    assert_eq!(c.cmd("SELECT 0"), Value::ok());
    assert_eq!(c.cmd("GET k"), Value::bulk("zero"));
    let store = f.store.as_ref().unwrap();
    assert_eq!(store.namespace("db0").unwrap().get(b"k").unwrap(), Some(b"zero".to_vec()));
    assert_eq!(c.cmd("FLUSHALL"), Value::ok());
    assert_eq!(c.cmd("GET k"), Value::Nil);
}

/// An export that bears a database's name (`db3`) is not a database:
/// SELECT refuses it, and FLUSHALL leaves its blocks (it emptied it).
#[test]
fn an_export_named_as_a_database_is_not_one() {
    let f = Fixture::default();
    let store = f.store.as_ref().unwrap();
    let disk = store.create_export("db3", 1 << 20, 4096).unwrap();
    disk.put(&granary_store::block::block_key(0), &[7u8; 4096]).unwrap();
    let mut c = f.client();
    match c.cmd("SELECT 3") {
        Value::Error(e) => assert!(e.contains("an export"), "{e}"),
        v => panic!("{v:?}"),
    }
    assert_eq!(c.cmd("SET k v"), Value::ok(), "still on db0");
    // A namespace whose name only parses as a database's is not one either.
    store.create_namespace("db03", granary_store::NamespaceOptions::default()).unwrap().put(b"x", b"y").unwrap();
    let info = match c.cmd("INFO keyspace") {
        Value::Bulk(b) => String::from_utf8(b).unwrap(),
        v => panic!("{v:?}"),
    };
    assert!(info.contains("db0:keys=1") && !info.contains("db3"), "{info}");
    assert_eq!(c.cmd("FLUSHALL"), Value::ok());
    assert_eq!(
        disk.get(&granary_store::block::block_key(0)).unwrap(),
        Some(vec![7u8; 4096]),
        "FLUSHALL emptied the export"
    );
    assert_eq!(c.cmd("GET k"), Value::Nil);
}

#[test]
fn transactions() {
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(c.cmd("MULTI"), Value::ok());
    assert_eq!(c.cmd("SET a 1"), Value::Simple("QUEUED".into()));
    assert_eq!(c.cmd("INCR a"), Value::Simple("QUEUED".into()));
    assert_eq!(c.cmd("HSET a f v"), Value::Simple("QUEUED".into()));
    assert_eq!(c.cmd("GET a"), Value::Simple("QUEUED".into()));
    assert_eq!(c.cmd("MULTI"), Value::err("ERR MULTI calls can not be nested"));
    assert_eq!(
        c.cmd("EXEC"),
        Value::Array(vec![
            Value::ok(),
            Value::Int(2),
            Value::err("WRONGTYPE Operation against a key holding the wrong kind of value"),
            Value::bulk("2"),
        ])
    );
    assert_eq!(c.cmd("EXEC"), Value::err("ERR EXEC without MULTI"));
    assert_eq!(c.cmd("DISCARD"), Value::err("ERR DISCARD without MULTI"));
    // A refused command aborts the transaction.
    assert_eq!(c.cmd("MULTI"), Value::ok());
    assert_eq!(c.cmd("SET a 5"), Value::Simple("QUEUED".into()));
    assert_eq!(c.cmd("NOSUCH x"), Value::err("ERR unknown command 'NOSUCH', with args beginning with: 'x' "));
    assert_eq!(c.cmd("EXEC"), Value::err("EXECABORT Transaction discarded because of previous errors."));
    assert_eq!(c.cmd("GET a"), Value::bulk("2"));
    // WATCH: a change by another connection aborts EXEC.
    let mut other = f.client();
    assert_eq!(c.cmd("WATCH a"), Value::ok());
    assert_eq!(other.cmd("SET a 7"), Value::ok());
    assert_eq!(c.cmd("MULTI"), Value::ok());
    assert_eq!(c.cmd("SET a 8"), Value::Simple("QUEUED".into()));
    assert_eq!(c.cmd("EXEC"), Value::NilArray);
    assert_eq!(c.cmd("GET a"), Value::bulk("7"));
    // An unchanged WATCHed key lets it through.
    assert_eq!(c.cmd("WATCH a"), Value::ok());
    assert_eq!(c.cmd("MULTI"), Value::ok());
    assert_eq!(c.cmd("WATCH a"), Value::err("ERR WATCH inside MULTI is not allowed"));
    assert_eq!(c.cmd("SET a 8"), Value::Simple("QUEUED".into()));
    assert_eq!(c.cmd("EXEC"), Value::Array(vec![Value::ok()]));
    assert_eq!(c.cmd("GET a"), Value::bulk("8"));
    assert_eq!(c.cmd("MULTI"), Value::ok());
    assert_eq!(c.cmd("FLUSHDB"), Value::err("ERR FLUSHDB inside MULTI is not supported (docs/RESP.md)"));
    assert_eq!(c.cmd("DISCARD"), Value::ok());
}

/// MULTI's queue is bounded in commands and in bytes: the command past
/// either bound is refused, the transaction aborts, and the connection
/// goes on.
#[test]
fn multi_queues_within_its_bounds() {
    use granary_resp::limits::{MULTI_QUEUE_BYTES_MAX, MULTI_QUEUE_MAX};
    let f = Fixture::default();
    let mut c = f.client();
    let queued = Value::Simple("QUEUED".into());
    // Commands: MULTI_QUEUE_MAX are queued, one more is refused.
    let mut b = encode(&[b"MULTI"]);
    for _ in 0..=MULTI_QUEUE_MAX {
        b.extend(encode(&[b"INCR", b"n"]));
    }
    c.send_raw(&b);
    assert_eq!(c.read(), Value::ok());
    for _ in 0..MULTI_QUEUE_MAX {
        assert_eq!(c.read(), queued);
    }
    assert_eq!(c.read(), Value::err(&format!("ERR MULTI queues at most {MULTI_QUEUE_MAX} commands")));
    assert_eq!(c.cmd("EXEC"), Value::err("EXECABORT Transaction discarded because of previous errors."));
    assert_eq!(c.cmd("GET n"), Value::Nil);
    // Bytes: SETs of values just under the item limit, as many as fit.
    let value = vec![b'v'; (1 << 20) - 4096];
    let one = 4 * 24 + 3 + 1 + value.len(); // a Vec header each for the command and its three arguments
    let fit = MULTI_QUEUE_BYTES_MAX / one;
    assert!(fit < MULTI_QUEUE_MAX);
    let mut b = encode(&[b"MULTI"]);
    for _ in 0..=fit {
        b.extend(encode(&[b"SET", b"k", &value]));
    }
    c.send_raw(&b);
    assert_eq!(c.read(), Value::ok());
    for _ in 0..fit {
        assert_eq!(c.read(), queued);
    }
    let msg = format!(
        "ERR MULTI queues at most {MULTI_QUEUE_BYTES_MAX} bytes of commands ({} queued, this one {one})",
        fit * one
    );
    assert_eq!(c.read(), Value::err(&msg));
    // Later commands are answered QUEUED (and not kept); EXEC aborts.
    assert_eq!(c.cmd("SET k small"), queued);
    assert_eq!(c.cmd("EXEC"), Value::err("EXECABORT Transaction discarded because of previous errors."));
    assert_eq!(c.cmd("GET k"), Value::Nil);
    // The connection goes on, and a transaction within the bounds runs.
    assert_eq!(c.cmd("MULTI"), Value::ok());
    assert_eq!(c.call(&[b"SET", b"k", &value]), queued);
    assert_eq!(c.cmd("EXEC"), Value::Array(vec![Value::ok()]));
    assert_eq!(c.call(&[b"STRLEN", b"k"]), Value::Int(value.len() as i64));
}

/// Concurrent INCRs by EXEC from several connections lose none: each
/// EXEC reads and writes as one atomic batch, run again on a conflict.
#[test]
fn concurrent_exec_increments_are_isolated() {
    let f = Fixture::default();
    let threads = 4;
    let rounds = 200;
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut c = f.client();
                for _ in 0..rounds {
                    assert_eq!(c.cmd("MULTI"), Value::ok());
                    c.cmd("GET n");
                    c.cmd("INCR n");
                    c.cmd("INCR m");
                    let Value::Array(r) = c.cmd("EXEC") else { panic!("EXEC") };
                    assert!(matches!(r[1], Value::Int(_)), "{r:?}");
                }
            });
        }
    });
    let mut c = f.client();
    assert_eq!(c.cmd("GET n"), Value::bulk(&(threads * rounds).to_string()));
    assert_eq!(c.cmd("GET m"), Value::bulk(&(threads * rounds).to_string()));
}

#[test]
fn pipelining_and_inline_commands() {
    let f = Fixture::default();
    let mut c = f.client();
    let mut batch = Vec::new();
    for i in 0..100 {
        batch.extend(encode(&[b"SET", format!("p{i}").as_bytes(), b"v"]));
        batch.extend(encode(&[b"GET", format!("p{i}").as_bytes()]));
    }
    c.send_raw(&batch);
    for _ in 0..100 {
        assert_eq!(c.read(), Value::ok());
        assert_eq!(c.read(), Value::bulk("v"));
    }
    c.send_raw(b"SET \"a b\" 'c d'\r\nGET \"a b\"\r\n\r\nPING\n");
    assert_eq!(c.read(), Value::ok());
    assert_eq!(c.read(), Value::bulk("c d"));
    assert_eq!(c.read(), Value::Simple("PONG".into()));
    assert_eq!(c.cmd("ECHO hi"), Value::bulk("hi"));
    assert_eq!(c.cmd("GET"), Value::err("ERR wrong number of arguments for 'get' command"));
    assert_eq!(c.cmd("CLIENT FOO"), Value::err("ERR unknown subcommand 'FOO'. Try CLIENT HELP."));
}

/// A key already expired when it was WATCHed, whose record a command of
/// the same connection then removes (PERSIST meets it: `:0`; so does a DEL
/// of several keys, one atomic batch), was not changed: EXEC runs, as in
/// Redis 7.0. (The engine keeps an expired
/// record until the end of its second; the expiry is set 1 ms past a
/// second, so that is most of a second after it.)
#[test]
fn removing_an_expired_watched_key_does_not_abort_exec() {
    let f = Fixture::default();
    let mut c = f.client();
    let at = (now_ms() / 1000 + 2) * 1000 + 1;
    assert_eq!(c.cmd(&format!("SET w v PXAT {at}")), Value::ok());
    assert_eq!(c.cmd(&format!("SET wd v PXAT {at}")), Value::ok());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while now_ms() <= at {
        assert!(std::time::Instant::now() < deadline, "the clock did not reach the expiry");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(c.cmd("WATCH w"), Value::ok());
    assert_eq!(c.cmd("PERSIST w"), Value::Int(0));
    assert_eq!(c.cmd("MULTI"), Value::ok());
    assert_eq!(c.cmd("PING"), Value::Simple("QUEUED".into()));
    assert_eq!(c.cmd("EXEC"), Value::Array(vec![Value::Simple("PONG".into())]));
    assert_eq!(c.cmd("WATCH wd"), Value::ok());
    assert_eq!(c.cmd("DEL wd x"), Value::Int(0));
    assert_eq!(c.cmd("MULTI"), Value::ok());
    assert_eq!(c.cmd("PING"), Value::Simple("QUEUED".into()));
    assert_eq!(c.cmd("EXEC"), Value::Array(vec![Value::Simple("PONG".into())]), "a multi-key DEL");
    // A key live when WATCHed and then written still aborts.
    assert_eq!(c.cmd("SET w2 a"), Value::ok());
    assert_eq!(c.cmd("WATCH w2"), Value::ok());
    assert_eq!(c.cmd("DEL w2"), Value::Int(1));
    assert_eq!(c.cmd("MULTI"), Value::ok());
    assert_eq!(c.cmd("PING"), Value::Simple("QUEUED".into()));
    assert_eq!(c.cmd("EXEC"), Value::NilArray);
}

/// DEL and UNLINK of more keys than one engine batch holds delete them all
/// (one by one) and count them; MSET of that many is refused whole, with
/// the limit named.
#[test]
fn del_of_more_keys_than_a_batch_holds_deletes_them_all() {
    let n = granary_store::BATCH_OPS_MAX + 500;
    let f = Fixture::default();
    let mut c = f.client();
    let keys: Vec<Vec<u8>> = (0..n).map(|i| format!("d{i}").into_bytes()).collect();
    for k in keys.iter().step_by(2) {
        assert_eq!(c.call(&[b"SET", k, b"v"]), Value::ok());
    }
    for cmd in [&b"DEL"[..], b"UNLINK"] {
        let args: Vec<&[u8]> = std::iter::once(cmd).chain(keys.iter().map(|k| &k[..])).collect();
        let want = if cmd == b"DEL" { n.div_ceil(2) as i64 } else { 0 };
        assert_eq!(c.call(&args), Value::Int(want), "{}", String::from_utf8_lossy(cmd));
    }
    assert_eq!(c.cmd("DBSIZE"), Value::Int(0));
    let mut mset: Vec<&[u8]> = vec![b"MSET"];
    for k in &keys {
        mset.push(k);
        mset.push(b"v");
    }
    let Value::Error(e) = c.call(&mset) else { panic!("MSET over the batch limit must be refused") };
    assert!(e.contains(&format!("at most {}", granary_store::BATCH_OPS_MAX)), "{e}");
    assert_eq!(c.cmd("DBSIZE"), Value::Int(0), "nothing applied");
}

/// An EXEC that does not commit leaves the connection as it was: a SELECT
/// or CLIENT SETNAME queued in it does not stay in effect.
#[test]
fn an_exec_that_fails_keeps_the_connections_database_and_name() {
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(c.cmd("MULTI"), Value::ok());
    assert_eq!(c.cmd("SELECT 1"), Value::Simple("QUEUED".into()));
    assert_eq!(c.cmd("CLIENT SETNAME inside"), Value::Simple("QUEUED".into()));
    // More keys than one transaction holds: EXEC fails as a whole.
    let mut mset: Vec<Vec<u8>> = vec![b"MSET".to_vec()];
    for i in 0..=granary_store::BATCH_OPS_MAX {
        mset.push(format!("k{i}").into_bytes());
        mset.push(b"v".to_vec());
    }
    let args: Vec<&[u8]> = mset.iter().map(|a| &a[..]).collect();
    assert_eq!(c.call(&args), Value::Simple("QUEUED".into()));
    let Value::Error(e) = c.cmd("EXEC") else { panic!("EXEC over the key limit must fail") };
    assert!(e.contains("one transaction holds at most"), "{e}");
    assert_eq!(c.cmd("CLIENT GETNAME"), Value::Nil);
    assert_eq!(c.cmd("SET probe here"), Value::ok());
    let mut d = f.client();
    assert_eq!(d.cmd("GET probe"), Value::bulk("here"), "the SET after the failed EXEC went to db 0");
}

/// A command that fails after it began its reply (MGET of a key the engine
/// refuses, after keys it read) answers with the error alone, directly and
/// inside EXEC, and the replies after it stay in step.
#[test]
fn a_command_failing_midway_answers_with_its_error_alone() {
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(c.cmd("SET a 1"), Value::ok());
    let long = vec![b'k'; 70_000];
    let mut batch = encode(&[b"MGET", b"a", b"a", &long, b"a"]);
    batch.extend(encode(&[b"GET", b"a"]));
    c.send_raw(&batch);
    let Value::Error(e) = c.read() else { panic!("MGET with a refused key must answer an error") };
    assert!(e.starts_with("ERR key of 70000 bytes rejected"), "{e}");
    assert_eq!(c.read(), Value::bulk("1"), "the next reply is the GET's");

    assert_eq!(c.cmd("MULTI"), Value::ok());
    assert_eq!(c.call(&[b"MGET", b"a", &long]), Value::Simple("QUEUED".into()));
    assert_eq!(c.cmd("GET a"), Value::Simple("QUEUED".into()));
    match c.cmd("EXEC") {
        Value::Array(v) => {
            assert_eq!(v.len(), 2, "{v:?}");
            assert!(matches!(&v[0], Value::Error(e) if e.starts_with("ERR key of 70000 bytes rejected")), "{v:?}");
            assert_eq!(v[1], Value::bulk("1"));
        }
        other => panic!("EXEC: {other:?}"),
    }
    assert_eq!(c.cmd("PING"), Value::Simple("PONG".into()));
}

#[test]
fn protocol_errors_close_the_connection_after_the_replies_before() {
    let f = Fixture::default();
    for (bad, msg) in [
        (&b"*1\r\nfoo\r\n"[..], "ERR Protocol error: expected '$', got 'f'"),
        (b"*x\r\n", "ERR Protocol error: invalid multibulk length"),
        (b"*1\r\n$-5\r\n", "ERR Protocol error: invalid bulk length"),
        (b"SET \"a\r\n", "ERR Protocol error: unbalanced quotes in request"),
    ] {
        let mut c = f.client();
        let mut b = encode(&[b"PING"]);
        b.extend_from_slice(bad);
        c.send_raw(&b);
        assert_eq!(c.read(), Value::Simple("PONG".into()));
        assert_eq!(c.read(), Value::err(msg));
        assert_eq!(c.try_read(), None, "closed after {msg}");
    }
    let mut c = f.client();
    c.send_raw(&vec![b'a'; INLINE_BYTES_MAX + 10]);
    assert_eq!(c.read(), Value::err("ERR Protocol error: too big inline request"));
    // The server is still fine.
    assert_eq!(f.client().cmd("PING"), Value::Simple("PONG".into()));
}

#[test]
fn resp3_after_hello_3() {
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(c.cmd("HELLO 4"), Value::err("NOPROTO unsupported protocol version"));
    let Value::Map(m) = c.cmd("HELLO 3 SETNAME app") else { panic!("a map") };
    assert!(m.contains(&(Value::bulk("proto"), Value::Int(3))));
    assert_eq!(c.cmd("CLIENT GETNAME"), Value::bulk("app"));
    assert_eq!(c.cmd("GET nokey"), Value::Nil);
    assert_eq!(c.cmd("HSET h a 1"), Value::Int(1));
    assert_eq!(c.cmd("HGETALL h"), Value::Map(vec![(Value::bulk("a"), Value::bulk("1"))]));
    let Value::Map(cfg) = c.cmd("CONFIG GET save") else { panic!("a map") };
    assert_eq!(cfg, vec![(Value::bulk("save"), Value::bulk(""))]);
    assert!(matches!(c.cmd("HELLO 2"), Value::Array(_)));
    assert!(matches!(c.cmd("CONFIG GET appendonly"), Value::Array(_)));
    assert_eq!(
        c.cmd("HELLO 3 AUTH someone pw"),
        Value::err("WRONGPASS invalid username-password pair or user is disabled.")
    );
}

#[test]
fn server_commands_answer() {
    let f = Fixture::default();
    let mut c = f.client();
    let Value::Bulk(info) = c.cmd("INFO") else { panic!() };
    let info = String::from_utf8(info).unwrap();
    for s in ["# Server", "# Clients", "# Memory", "# Stats", "# Keyspace", "redis_version:"] {
        assert!(info.contains(s), "{s} missing from INFO");
    }
    let Value::Bulk(info) = c.cmd("INFO stats") else { panic!() };
    assert!(!String::from_utf8(info).unwrap().contains("# Server"));
    assert!(matches!(c.cmd("CLIENT ID"), Value::Int(n) if n > 0));
    assert_eq!(c.cmd("CLIENT SETINFO LIB-NAME redis-py"), Value::ok());
    let Value::Int(n) = c.cmd("COMMAND COUNT") else { panic!() };
    let Value::Array(all) = c.cmd("COMMAND") else { panic!() };
    assert_eq!(all.len() as i64, n);
    let Value::Array(get) = c.cmd("COMMAND INFO get nosuch") else { panic!() };
    assert_eq!(get[1], Value::Nil);
    let Value::Array(g) = &get[0] else { panic!() };
    assert_eq!((&g[0], &g[1]), (&Value::bulk("get"), &Value::Int(2)));
    assert!(matches!(c.cmd("TIME"), Value::Array(t) if t.len() == 2));
    assert_eq!(c.cmd("QUIT"), Value::ok());
    assert_eq!(c.try_read(), None);
}

#[test]
fn the_connection_limit_refuses_with_redis_words() {
    let f = Fixture::new(granary_resp::RespConfig { threads: 1, max_connections: 1, ..Default::default() });
    let mut a = f.client();
    assert_eq!(a.cmd("PING"), Value::Simple("PONG".into()));
    let mut b = f.client();
    assert_eq!(b.read(), Value::err("ERR max number of clients reached"));
    assert_eq!(b.try_read(), None);
}
