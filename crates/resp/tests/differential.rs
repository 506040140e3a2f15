//! Differential test: the same seeded random command sequences sent to
//! Granary's RESP server and to a real redis-server 7.0 (started here as a
//! child on a free loopback port, stopped on every path), on one
//! connection each: one command at a time (sometimes split across two
//! writes, sometimes a few pipelined in one), every reply compared.
//!
//! A failure prints the seed; `GRANARY_FUZZ_SEED=N` reruns that seed alone,
//! `GRANARY_FUZZ_CASES=N` runs seeds 1..=N (default 20) and
//! `GRANARY_FUZZ_STEPS=N` sends N commands per seed (default 400). Without
//! redis-server the tests are skipped, unless `GRANARY_REQUIRE_PEERS` is set
//! (scripts/test.sh), when they fail.
//!
//! The grammar ([`Gen`]) covers every command Granary serves: valid
//! arguments, wrong arity, wrong types, option syntax and case, integer and
//! float edge cases, range and offset edges, expiry (only far in the future
//! or already past, so nothing expires while a seed runs), MULTI/EXEC/
//! DISCARD/WATCH, databases, RESP3, unknown commands and subcommands,
//! inline commands with quoting. It stays away from what docs/RESP.md lists as
//! deliberate differences, each place saying so. Replies that legitimately
//! differ (ids, times, server facts, SCAN cursors, RANDOMKEY) are
//! normalized by [`Cmp`], each variant saying why; every other reply must be
//! byte for byte Redis's.

mod common;

use common::{encode, Client, Fixture, Redis, Value};
use num_bigint::BigUint;
use rand::{Rng as _, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::collections::{BTreeSet, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Granary's default `proto-max-bulk-len` (RespConfig::value_bytes_max):
/// redis-server is started with the same, so both refuse the same bulks
/// and strings (Redis's smallest allowed value is this 1 MiB).
const BULK_MAX: usize = 1 << 20;

/// A redis-server 7.0 child on a free loopback port below the ephemeral
/// range ([`Redis::start`]), refusing bulks as Granary does.
fn start_redis() -> Option<Redis> {
    Redis::start(&["--proto-max-bulk-len", &BULK_MAX.to_string()], "")
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|s| s.parse().unwrap_or_else(|_| panic!("{name} is a number")))
}

fn now_s() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

// ---------------------------------------------------------------------
// The generator.

/// The key space: few keys, so types collide; glob and quoting characters
/// in some. No empty key (Granary refuses it: docs/RESP.md, "Differences").
const KEYS: &[&str] = &["a", "n", "h", "hh", "k:1", "k:22", "x]y", "k\\z"];

/// Fields of hashes. Fields and values stay short and few, so Redis keeps
/// every hash a listpack, whose order (insertion order) is Granary's, and
/// HGETALL/HKEYS/HVALS compare exactly.
const FIELDS: &[&str] = &["f", "g", "f1", "a b", "", "x"];

/// Redis 7.0's arity of each command Granary serves.
#[rustfmt::skip]
const ARITY: &[(&str, i32)] = &[
    ("ping", -1), ("echo", 2), ("select", 2), ("hello", -1), ("client", -2), ("dbsize", 1), ("flushdb", -1),
    ("flushall", -1), ("info", -1), ("config", -2), ("command", -1), ("time", 1), ("get", 2), ("set", -3),
    ("setnx", 3), ("setex", 4), ("psetex", 4), ("getset", 3), ("getdel", 2), ("getex", -2), ("mget", -2),
    ("mset", -3), ("msetnx", -3), ("append", 3), ("strlen", 2), ("getrange", 4), ("setrange", 4), ("incr", 2),
    ("decr", 2), ("incrby", 3), ("decrby", 3), ("incrbyfloat", 3), ("del", -2), ("unlink", -2), ("exists", -2),
    ("type", 2), ("expire", -3), ("pexpire", -3), ("expireat", -3), ("pexpireat", -3), ("ttl", 2), ("pttl", 2),
    ("persist", 2), ("rename", 3), ("scan", -2), ("keys", 2), ("randomkey", 1), ("hset", -4), ("hmset", -4),
    ("hget", 3), ("hmget", -3), ("hgetall", 2), ("hdel", -3), ("hexists", 3), ("hlen", 2), ("hkeys", 2),
    ("hvals", 2), ("hincrby", 4), ("hsetnx", 4), ("multi", 1), ("exec", 1), ("discard", 1), ("watch", -2),
    ("unwatch", 1),
];

/// How two replies are compared. Two error replies are always compared
/// exactly, whatever the variant; an error against a non-error differs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cmp {
    Exact,
    /// TTL: the servers ran the command at slightly different instants
    /// (equal, or one second apart across a rounding edge).
    Ttl,
    /// PTTL: within 2 s, for the same reason.
    Pttl,
    /// KEYS: the order is each server's table order.
    Sorted,
    /// RANDOMKEY: random; each side's answer is checked against its own
    /// keyspace (a live key, or nil iff the database is empty).
    RandomKey,
    /// SCAN: a cursor is a position in each server's own table, so a page
    /// differs; each side's keys are checked live, full scans are compared
    /// at checkpoints.
    Scan,
    /// HELLO: `id` (a connection counter) and `version` (Granary says
    /// 7.0.0) differ; the fields and the other values must not.
    Hello,
    /// INFO and CLIENT INFO: the server's own facts; only the reply's type
    /// (bulk, or verbatim in RESP3) is compared.
    Text,
    /// CLIENT ID and COMMAND COUNT: counters of each server.
    Int,
    /// TIME: the clock.
    Time,
    /// COMMAND INFO: name, arity, flags, key positions compared; ACL
    /// categories, tips, key specs and subcommands are Redis's richer
    /// metadata.
    CommandInfo,
    /// COMMAND LIST: Granary's commands are a subset of Redis's.
    CommandList,
    /// COMMAND, COMMAND DOCS: Redis documents more; the shape is compared.
    Shape,
    /// CONFIG GET of settings Granary reports: compared as a set of pairs,
    /// but `port` (each server's own).
    ConfigGet,
}

/// One request of a sequence.
#[derive(Debug, Clone)]
struct Req {
    args: Vec<Vec<u8>>,
    /// Sent in inline form (quoted as needed) instead of multibulk.
    inline: bool,
    /// Raw bytes sent as they are (inline quirks), instead of `args`.
    raw: Option<Vec<u8>>,
    cmp: Cmp,
    /// SET with EXAT/PXAT in the past: Redis stores the key already
    /// expired and removes it on its next access, Granary never stores it.
    /// Touching the key right after makes DBSIZE agree.
    past_set: bool,
}

impl Req {
    fn new(args: Vec<Vec<u8>>) -> Req {
        Req { args, inline: false, raw: None, cmp: Cmp::Exact, past_set: false }
    }

    fn of(args: &[&[u8]]) -> Req {
        Req::new(args.iter().map(|a| a.to_vec()).collect())
    }

    fn cmp(mut self, cmp: Cmp) -> Req {
        self.cmp = cmp;
        self
    }

    fn name(&self) -> String {
        self.args.first().map(|a| String::from_utf8_lossy(a).to_ascii_lowercase()).unwrap_or_default()
    }

    fn bytes(&self) -> Vec<u8> {
        if let Some(r) = &self.raw {
            return r.clone();
        }
        if self.inline {
            if let Some(line) = inline_form(&self.args) {
                return line;
            }
        }
        let args: Vec<&[u8]> = self.args.iter().map(|a| &a[..]).collect();
        encode(&args)
    }

    fn show(&self) -> String {
        if let Some(r) = &self.raw {
            return format!("raw {}", show_bytes(r, 200));
        }
        let words: Vec<String> = self.args.iter().map(|a| show_bytes(a, 80)).collect();
        format!("{}{}", if self.inline { "inline " } else { "" }, words.join(" "))
    }
}

fn show_bytes(b: &[u8], max: usize) -> String {
    let mut s = String::new();
    for &c in b.iter().take(max) {
        match c {
            b' '..=b'~' if c != b'"' && c != b'\\' => s.push(c as char),
            _ => s.push_str(&format!("\\x{c:02x}")),
        }
    }
    if b.len() > max {
        s.push_str(&format!("...({} bytes)", b.len()));
    }
    format!("\"{s}\"")
}

/// `args` as one inline line, quoted as `redis-cli` would (sdssplitargs
/// reads it back); None if too long for an inline command or if the name
/// would read as multibulk.
fn inline_form(args: &[Vec<u8>]) -> Option<Vec<u8>> {
    if args.iter().map(|a| a.len() * 4 + 3).sum::<usize>() > 8192 || args[0].first() == Some(&b'*') {
        return None;
    }
    let mut line = Vec::new();
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            line.push(b' ');
        }
        let plain = !a.is_empty() && a.iter().all(|&c| c.is_ascii_graphic() && c != b'"' && c != b'\'');
        let single =
            !a.is_empty() && a.iter().all(|&c| (c.is_ascii_graphic() || c == b' ') && c != b'\'' && c != b'\\');
        if plain && a.len() % 3 != 0 {
            line.extend_from_slice(a);
        } else if single && a.len() % 2 == 0 {
            line.push(b'\'');
            line.extend_from_slice(a);
            line.push(b'\'');
        } else {
            line.push(b'"');
            for &c in a {
                match c {
                    b'"' => line.extend_from_slice(b"\\\""),
                    b'\\' => line.extend_from_slice(b"\\\\"),
                    b'\n' => line.extend_from_slice(b"\\n"),
                    b' '..=b'~' => line.push(c),
                    _ => line.extend_from_slice(format!("\\x{c:02x}").as_bytes()),
                }
            }
            line.push(b'"');
        }
    }
    line.extend_from_slice(b"\r\n");
    Some(line)
}

/// What the generator needs to know of the connection.
#[derive(Default)]
struct State {
    /// Inside MULTI; whether a write was queued (then DBSIZE and KEYS stay
    /// out: inside EXEC they read the store, not the transaction's own
    /// writes, docs/RESP.md "Differences").
    multi: bool,
    queued_write: bool,
}

struct Gen {
    rng: Pcg64Mcg,
    /// Unix seconds when the seed started: absolute expiries are counted
    /// from it, so both servers get the same instants.
    t0: i64,
    /// Relative expiries handed out: each is new, and any two are at least
    /// 100 s apart, so GT/LT between two deadlines never depends on the
    /// millisecond each server ran a command at.
    used: HashSet<i64>,
}

const WRITES: &[&str] = &[
    "set",
    "setnx",
    "setex",
    "psetex",
    "getset",
    "getdel",
    "getex",
    "mset",
    "msetnx",
    "append",
    "setrange",
    "incr",
    "decr",
    "incrby",
    "decrby",
    "incrbyfloat",
    "del",
    "unlink",
    "expire",
    "pexpire",
    "expireat",
    "pexpireat",
    "persist",
    "rename",
    "hset",
    "hmset",
    "hdel",
    "hincrby",
    "hsetnx",
    "select",
];

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen { rng: Pcg64Mcg::seed_from_u64(seed), t0: now_s(), used: HashSet::new() }
    }

    fn below(&mut self, n: u64) -> u64 {
        self.rng.random_range(0..n)
    }

    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        self.rng.random_range(lo..=hi)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn next(&mut self) -> u64 {
        self.rng.random()
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }

    fn digits(&mut self, n: usize) -> String {
        (0..n).map(|_| (b'0' + self.below(10) as u8) as char).collect()
    }

    /// An option word in a random case.
    fn word(&mut self, w: &str) -> Vec<u8> {
        match self.below(5) {
            0..=2 => w.to_ascii_uppercase().into_bytes(),
            3 => w.to_ascii_lowercase().into_bytes(),
            _ => w
                .bytes()
                .map(|c| if self.chance(50) { c.to_ascii_uppercase() } else { c.to_ascii_lowercase() })
                .collect(),
        }
    }

    fn key(&mut self) -> Vec<u8> {
        self.pick(KEYS).as_bytes().to_vec()
    }

    /// A key for a hash command: mostly the two hash-named ones.
    fn hkey(&mut self) -> Vec<u8> {
        if self.chance(60) {
            self.pick(&["h", "hh"]).as_bytes().to_vec()
        } else {
            self.key()
        }
    }

    fn field(&mut self) -> Vec<u8> {
        self.pick(FIELDS).as_bytes().to_vec()
    }

    fn value(&mut self) -> Vec<u8> {
        match self.below(12) {
            0..=3 => self
                .pick(&[
                    "",
                    "0",
                    "1",
                    "-1",
                    "10",
                    "42",
                    "9223372036854775807",
                    "-9223372036854775808",
                    "9223372036854775808",
                    "abc",
                    "3.5",
                    "1e3",
                    " 1",
                    "1 ",
                    "+1",
                    "01",
                    "-0",
                    "0x10",
                    "hello world",
                    "v",
                    "1.5e-3",
                    "inf",
                    "-12.000",
                    "00",
                ])
                .as_bytes()
                .to_vec(),
            4 | 5 => self.range(-1000, 1000).to_string().into_bytes(),
            6 | 7 => float_text(self).into_bytes(),
            8 => (0..self.below(8)).map(|_| self.below(256) as u8).collect(),
            _ => (0..self.range(1, 12)).map(|_| b"abcdefgh xyz"[self.below(12) as usize]).collect(),
        }
    }

    /// A hash value: at most 64 bytes (listpack order, see FIELDS).
    fn hvalue(&mut self) -> Vec<u8> {
        let mut v = self.value();
        v.truncate(64);
        v
    }

    /// An integer argument: edges, junk and ordinary values.
    fn int(&mut self) -> Vec<u8> {
        match self.below(10) {
            0..=3 => self
                .pick(&[
                    "0",
                    "1",
                    "-1",
                    "2",
                    "10",
                    "-10",
                    "100",
                    "9223372036854775807",
                    "-9223372036854775808",
                    "9223372036854775806",
                    "-9223372036854775807",
                    "9223372036854775808",
                    "-9223372036854775809",
                    "abc",
                    "",
                    "1.5",
                    "+1",
                    "01",
                    "-0",
                    " 1",
                    "1 ",
                    "0x1",
                    "1e3",
                    "4611686018427387904",
                    "99999999999999999999",
                ])
                .as_bytes()
                .to_vec(),
            4..=7 => self.range(-100, 100).to_string().into_bytes(),
            _ => (self.next() as i64 >> self.below(64)).to_string().into_bytes(),
        }
    }

    /// A new relative expiry in seconds, at least 1000 s (nothing expires
    /// while a seed runs) and below 10^8 s (within the year 2106 that
    /// Granary's expiry holds: docs/RESP.md, "Expiry").
    fn fresh(&mut self) -> i64 {
        loop {
            let v = 1000 + 100 * self.below(1_000_000) as i64;
            if self.used.insert(v) {
                return v;
            }
        }
    }

    /// Invalid or edge expiry texts (in ms or seconds, absolute or not):
    /// junk, non-positive, overflowing. Not a valid instant past 2106:
    /// Granary keeps that as 2106 (docs/RESP.md, "Differences").
    fn bad_expiry(&mut self, ms: bool, abs: bool) -> String {
        let mut v = vec!["0", "-1", "-100", "abc", "1.5", "", "-9223372036854775808", "+5", "01", "-9223372036854776"];
        v.push("9223372036854776"); // seconds past i64 ms
        if !ms {
            v.push("9223372036854775807");
            if !abs {
                v.push("9223372036854775"); // overflows once now is added
            }
        } else if !abs {
            v.push("9223372036854775807"); // overflows once now is added
        }
        if ms {
            v.retain(|x| *x != "9223372036854776");
        }
        self.pick(&v).to_string()
    }

    fn rel_secs(&mut self) -> String {
        if self.chance(85) {
            self.fresh().to_string()
        } else {
            self.bad_expiry(false, false)
        }
    }

    fn rel_ms(&mut self) -> String {
        if self.chance(85) {
            (self.fresh() * 1000 + self.below(1000) as i64).to_string()
        } else {
            self.bad_expiry(true, false)
        }
    }

    /// An absolute expiry (seconds or ms): far future, past, or invalid;
    /// and whether it is a past instant (positive).
    fn abs(&mut self, ms: bool) -> (String, bool) {
        let unit = if ms { 1000 } else { 1 };
        match self.below(20) {
            0..=9 => {
                let extra = if ms { self.below(1000) as i64 } else { 0 };
                (((self.t0 + self.fresh()) * unit + extra).to_string(), false)
            }
            10..=16 => {
                let past = self.pick(&[1, 2, 999, 1000, 1_600_000_000 * unit, (self.t0 - 5000) * unit]);
                (past.to_string(), true)
            }
            _ => (self.bad_expiry(ms, true), false),
        }
    }

    /// A glob pattern: fixed ones and random ones over the keys' alphabet
    /// and every special character (classes, ranges, escapes).
    fn pattern(&mut self) -> Vec<u8> {
        if self.chance(40) {
            return self
                .pick(&[
                    "*", "k*", "k:?", "k:*", "?", "[ah]*", "[a-h]", "[^a]*", "x\\]y", "x]y", "*]*", "k[:]*", "[a-]*",
                    "h?", "*\\\\*", "k\\\\z", "[", "[^", "*[", "k[\\", "\\", "[]]*", "[a-\\]", "[z-a]*", "**", "h*h",
                ])
                .as_bytes()
                .to_vec();
        }
        let alphabet = b"ahnkxyz12:*?[]^-\\";
        (0..self.range(1, 6)).map(|_| alphabet[self.below(alphabet.len() as u64) as usize]).collect()
    }

    /// SET's or GETEX's options: valid combinations, conflicting ones,
    /// repeats, junk; and whether an absolute expiry in the past is among
    /// them.
    fn string_opts(&mut self, set: bool) -> (Vec<Vec<u8>>, bool) {
        let mut out = Vec::new();
        let mut past = false;
        for _ in 0..self.pick(&[0, 1, 1, 1, 2, 2, 3, 4]) {
            match self.below(if set { 12 } else { 8 }) {
                0 => out.push(self.word("ex")),
                1 => out.push(self.word("px")),
                2 | 3 => {
                    let ms = self.chance(50);
                    out.push(self.word(if ms { "pxat" } else { "exat" }));
                    let (v, p) = self.abs(ms);
                    past |= p;
                    out.push(v.into_bytes());
                    continue;
                }
                4 => out.push(self.word("persist")),
                5 => out.push(self.word("keepttl")),
                6 => {
                    // a dangling unit, or junk
                    out.push(self.pick(&[&b"EX"[..], b"PXAT", b"FOO", b"NXX", b"E", b""]).to_vec());
                    continue;
                }
                7 => {
                    let w = if self.chance(50) { "ex" } else { "px" };
                    out.push(self.word(w));
                }
                8 | 9 => out.push(self.word("nx")),
                10 => out.push(self.word("xx")),
                _ => out.push(self.word("get")),
            }
            let last = out.last().unwrap().to_ascii_lowercase();
            match &last[..] {
                b"ex" => out.push(self.rel_secs().into_bytes()),
                b"px" => out.push(self.rel_ms().into_bytes()),
                _ => {}
            }
        }
        (out, past)
    }

    /// EXPIRE-family options.
    fn expire_opts(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for _ in 0..self.pick(&[0, 0, 1, 1, 1, 2, 3]) {
            let w = self.pick(&["nx", "xx", "gt", "lt", "nx", "gt", "lt", "foo"]);
            out.push(self.word(w));
        }
        out
    }

    /// One command (not EXEC or DISCARD inside MULTI: [`Gen::step`]).
    fn command(&mut self, st: &State) -> Req {
        let k = self.key();
        let mut r = match self.below(1000) {
            // strings
            0..=49 => Req::new(vec![self.word("get"), k]),
            50..=139 => {
                let (opts, past) = self.string_opts(true);
                let mut args = vec![self.word("set"), k, self.value()];
                args.extend(opts);
                let mut r = Req::new(args);
                r.past_set = past;
                r
            }
            140..=154 => Req::new(vec![self.word("setnx"), k, self.value()]),
            155..=169 => {
                let ms = self.chance(50);
                let t = if ms { self.rel_ms() } else { self.rel_secs() };
                Req::new(vec![self.word(if ms { "psetex" } else { "setex" }), k, t.into_bytes(), self.value()])
            }
            170..=184 => Req::new(vec![self.word("getset"), k, self.value()]),
            185..=199 => Req::new(vec![self.word("getdel"), k]),
            200..=229 => {
                let (opts, _) = self.string_opts(false);
                let mut args = vec![self.word("getex"), k];
                args.extend(opts);
                Req::new(args)
            }
            230..=249 => {
                let mut args = vec![self.word("mget")];
                for _ in 0..self.range(1, 5) {
                    args.push(self.key());
                }
                Req::new(args)
            }
            250..=274 => {
                let nx = self.chance(40);
                let mut args = vec![self.word(if nx { "msetnx" } else { "mset" })];
                for _ in 0..self.range(1, 4) {
                    args.push(self.key());
                    args.push(self.value());
                }
                if self.chance(10) {
                    args.push(self.key()); // an odd count: wrong arity
                }
                Req::new(args)
            }
            275..=294 => Req::new(vec![self.word("append"), k, self.value()]),
            295..=304 => Req::new(vec![self.word("strlen"), k]),
            305..=329 => {
                let (a, b) = (self.range_index(), self.range_index());
                Req::new(vec![self.word("getrange"), k, a, b])
            }
            330..=349 => {
                // Offsets within Granary's proto-max-bulk-len (1 MiB, the
                // same given to redis-server), and past it: both refuse
                // with the same words.
                let off = match self.below(50) {
                    0 => self.pick(&["1048575", "1048576", "1048570", "9223372036854775807", "2147483648"]).to_string(),
                    1..=4 => self.pick(&["-1", "abc", "", "1.5", "+3", "-9223372036854775808"]).to_string(),
                    _ => self.range(0, 40).to_string(),
                };
                let v = if self.chance(15) { Vec::new() } else { self.value() };
                Req::new(vec![self.word("setrange"), k, off.into_bytes(), v])
            }
            // counters
            350..=369 => {
                let w = self.pick(&["incr", "decr"]);
                Req::new(vec![self.word(w), k])
            }
            370..=394 => {
                let w = self.pick(&["incrby", "decrby"]);
                Req::new(vec![self.word(w), k, self.int()])
            }
            395..=429 => Req::new(vec![self.word("incrbyfloat"), k, float_text(self).into_bytes()]),
            // keys
            430..=454 => {
                let w = self.pick(&["del", "unlink", "exists"]);
                let mut args = vec![self.word(w), k];
                for _ in 0..self.pick(&[0, 0, 1, 2, 3]) {
                    args.push(self.key());
                }
                Req::new(args)
            }
            455..=464 => Req::new(vec![self.word("type"), k]),
            465..=514 => {
                let (w, t) = match self.below(4) {
                    0 => ("expire", self.rel_secs_or_past()),
                    1 => ("pexpire", self.rel_ms_or_past()),
                    2 => ("expireat", self.abs(false).0),
                    _ => ("pexpireat", self.abs(true).0),
                };
                let mut args = vec![self.word(w), k, t.into_bytes()];
                args.extend(self.expire_opts());
                Req::new(args)
            }
            515..=534 => Req::new(vec![self.word("ttl"), k]).cmp(Cmp::Ttl),
            535..=549 => Req::new(vec![self.word("pttl"), k]).cmp(Cmp::Pttl),
            550..=559 => Req::new(vec![self.word("persist"), k]),
            560..=574 => {
                let to = if self.chance(15) { k.clone() } else { self.key() };
                Req::new(vec![self.word("rename"), k, to])
            }
            // hashes
            575..=619 => {
                let w = self.pick(&["hset", "hset", "hmset"]);
                let mut args = vec![self.word(w), self.hkey()];
                for _ in 0..self.range(1, 3) {
                    args.push(self.field());
                    args.push(self.hvalue());
                }
                if self.chance(8) {
                    args.pop(); // a field without its value
                }
                Req::new(args)
            }
            620..=629 => Req::new(vec![self.word("hsetnx"), self.hkey(), self.field(), self.hvalue()]),
            630..=649 => {
                let w = self.pick(&["hget", "hexists"]);
                Req::new(vec![self.word(w), self.hkey(), self.field()])
            }
            650..=659 => {
                let mut args = vec![self.word("hmget"), self.hkey()];
                for _ in 0..self.range(1, 4) {
                    args.push(self.field());
                }
                Req::new(args)
            }
            660..=689 => {
                let w = self.pick(&["hgetall", "hkeys", "hvals", "hlen"]);
                Req::new(vec![self.word(w), self.hkey()])
            }
            690..=704 => {
                let mut args = vec![self.word("hdel"), self.hkey()];
                for _ in 0..self.range(1, 3) {
                    args.push(self.field());
                }
                Req::new(args)
            }
            705..=724 => Req::new(vec![self.word("hincrby"), self.hkey(), self.field(), self.int()]),
            // server and connection
            725..=734 => match self.below(4) {
                0 => Req::new(vec![self.word("ping")]),
                1 => Req::new(vec![self.word("ping"), self.value()]),
                2 => Req::new(vec![self.word("echo"), self.value()]),
                _ => Req::new(vec![self.word("ping"), self.value(), self.value()]),
            },
            735..=749 => {
                let n = match self.below(10) {
                    0..=7 => self.range(0, 3).to_string(),
                    _ => self
                        .pick(&["16", "-1", "abc", "4294967296", "2147483648", "-2147483649", "", "+1", "01", "15"])
                        .to_string(),
                };
                Req::new(vec![self.word("select"), n.into_bytes()])
            }
            750..=764 if !st.queued_write => Req::new(vec![self.word("dbsize")]),
            765..=769 if !st.multi => {
                // FLUSHDB and FLUSHALL are refused inside MULTI (docs/RESP.md,
                // "Differences"): only outside.
                let w = if self.chance(85) { "flushdb" } else { "flushall" };
                let mut args = vec![self.word(w)];
                match self.below(6) {
                    0 => args.push(self.word("async")),
                    1 => args.push(self.word("sync")),
                    2 => args.push(b"now".to_vec()),
                    3 => args.extend([self.word("async"), self.word("sync")]),
                    _ => {}
                }
                Req::new(args)
            }
            770..=789 if !st.queued_write => Req::new(vec![self.word("keys"), self.pattern()]).cmp(Cmp::Sorted),
            790..=799 if !st.multi => Req::new(vec![self.word("randomkey")]).cmp(Cmp::RandomKey),
            800..=814 if !st.multi => self.scan(),
            815..=829 => self.server(st),
            // errors: arity, unknown commands and subcommands
            830..=859 => self.wrong_arity(),
            860..=874 => self.unknown(),
            // transactions
            875..=904 if !st.multi => {
                let mut args = vec![self.word("watch")];
                for _ in 0..self.range(1, 3) {
                    args.push(self.key());
                }
                Req::new(args)
            }
            905..=914 => Req::new(vec![self.word("unwatch")]),
            915..=919 if st.multi => {
                // WATCH inside MULTI, nested MULTI: errors that do not
                // abort the transaction.
                if self.chance(50) {
                    Req::new(vec![self.word("watch"), k])
                } else {
                    Req::new(vec![self.word("multi")])
                }
            }
            920..=929 if !st.multi => {
                // EXEC or DISCARD without MULTI
                let w = self.pick(&["exec", "discard"]);
                Req::new(vec![self.word(w)])
            }
            930..=979 if !st.multi => Req::new(vec![self.word("multi")]),
            980..=989 if !st.multi => self.raw_inline(),
            990..=991 => Req::new(vec![self.word("quit")]),
            _ => Req::new(vec![self.word("exists"), k]),
        };
        if r.raw.is_none() && self.chance(12) {
            r.inline = true;
        }
        r
    }

    fn rel_secs_or_past(&mut self) -> String {
        if self.chance(15) {
            self.pick(&["0", "-1", "-1000"]).to_string()
        } else {
            self.rel_secs()
        }
    }

    fn rel_ms_or_past(&mut self) -> String {
        if self.chance(15) {
            self.pick(&["0", "-1", "-1000000"]).to_string()
        } else {
            self.rel_ms()
        }
    }

    /// A GETRANGE index.
    fn range_index(&mut self) -> Vec<u8> {
        match self.below(10) {
            0..=6 => self.range(-12, 12).to_string().into_bytes(),
            _ => self
                .pick(&["9223372036854775807", "-9223372036854775808", "100", "-100", "abc", "", "1.5", "+1"])
                .as_bytes()
                .to_vec(),
        }
    }

    fn scan(&mut self) -> Req {
        let cursor = if self.chance(70) {
            "0"
        } else {
            self.pick(&[
                "",
                "+0",
                "-1",
                "abc",
                " 0",
                "18446744073709551615",
                "18446744073709551616",
                "00",
                "5",
                "0x1",
                "1 ",
            ])
        };
        let mut args = vec![self.word("scan"), cursor.as_bytes().to_vec()];
        for _ in 0..self.pick(&[0, 1, 1, 2, 3]) {
            match self.below(10) {
                0..=2 => args.extend([self.word("match"), self.pattern()]),
                3..=5 => {
                    let c = if self.chance(80) {
                        self.range(1, 1000).to_string()
                    } else {
                        String::from_utf8(self.int()).unwrap()
                    };
                    args.extend([self.word("count"), c.into_bytes()]);
                }
                6..=7 => {
                    let t = self.pick(&["string", "hash", "STRING", "Hash", "list", "none", "zzz"]);
                    args.extend([self.word("type"), t.as_bytes().to_vec()]);
                }
                8 => args.push(self.pick(&[&b"MATCH"[..], b"COUNT", b"TYPE"]).to_vec()),
                _ => args.extend([b"FOO".to_vec(), b"1".to_vec()]),
            }
        }
        Req::new(args).cmp(Cmp::Scan)
    }

    /// HELLO, CLIENT, CONFIG, COMMAND, INFO, TIME.
    fn server(&mut self, st: &State) -> Req {
        match self.below(12) {
            // HELLO is refused inside MULTI (docs/RESP.md, "Differences").
            0 | 1 if !st.multi => {
                let mut args = vec![self.word("hello")];
                match self.below(16) {
                    0 => {}
                    1..=3 => args.push(self.pick(&[&b"2"[..], b"3"]).to_vec()),
                    4 => args.push(
                        self.pick(&[&b"1"[..], b"4", b"abc", b"", b"-3", b"03", b"9223372036854775808"]).to_vec(),
                    ),
                    5 | 6 => args.extend([b"3".to_vec(), self.word("setname"), self.client_name()]),
                    7 => args.extend([b"2".to_vec(), self.word("auth"), b"default".to_vec(), b"anything".to_vec()]),
                    8 => {
                        let user = self.pick(&[&b"DEFAULT"[..], b"bob", b""]);
                        args.extend([b"3".to_vec(), self.word("auth"), user.to_vec(), b"pw".to_vec()]);
                    }
                    9 => args.extend([b"3".to_vec(), self.word("setname")]),
                    10 => args.extend([b"3".to_vec(), self.word("auth"), b"default".to_vec()]),
                    11 => args.extend([b"3".to_vec(), self.word("setname"), b"early".to_vec(), b"FOO".to_vec()]),
                    12 => args.extend([b"2".to_vec(), b"FOO\x00bar".to_vec()]),
                    13 => args.extend([
                        b"3".to_vec(),
                        self.word("setname"),
                        b"a".to_vec(),
                        self.word("setname"),
                        b"b".to_vec(),
                    ]),
                    _ => args.extend([self.pick(&[&b"2"[..], b"3"]).to_vec(), self.word("foo")]),
                }
                Req::new(args).cmp(Cmp::Hello)
            }
            2 | 3 => {
                // CLIENT: what Granary serves of it. SETINFO (Redis 7.2),
                // LIST, KILL... are left out (docs/RESP.md, "Differences").
                let c = self.word("client");
                match self.below(10) {
                    0 => Req::new(vec![c, self.word("id")]).cmp(Cmp::Int),
                    1 => Req::new(vec![c, self.word("info")]).cmp(Cmp::Text),
                    2 | 3 => Req::new(vec![c, self.word("getname")]),
                    4 | 5 => Req::new(vec![c, self.word("setname"), self.client_name()]),
                    6 => Req::new(vec![c, self.word("id"), b"x".to_vec()]),
                    7 => Req::new(vec![c, self.word("setname")]),
                    8 => Req::new(vec![c, self.word("getname"), b"x".to_vec()]),
                    _ => Req::new(vec![c, self.word("info"), b"x".to_vec()]),
                }
            }
            4 | 5 => {
                // CONFIG GET of the exact names Granary reports (a pattern
                // would match Redis's hundreds of others); CONFIG SET is
                // refused by Granary (docs/RESP.md, "Differences").
                let mut args = vec![self.word("config")];
                match self.below(8) {
                    0..=4 => {
                        args.push(self.word("get"));
                        for _ in 0..self.range(1, 3) {
                            let n = self.pick(&[
                                "appendonly",
                                "appendfsync",
                                "save",
                                "databases",
                                "maxclients",
                                "maxmemory",
                                "maxmemory-policy",
                                "proto-max-bulk-len",
                                "port",
                                "bind",
                                "timeout",
                                "cluster-enabled",
                                "no-such-setting",
                            ]);
                            args.push(self.word(n));
                        }
                        return Req::new(args).cmp(Cmp::ConfigGet);
                    }
                    5 => args.push(self.word("get")),
                    6 => args.extend([self.word("resetstat"), b"x".to_vec()]),
                    _ => args.push(self.word("resetstat")),
                }
                Req::new(args)
            }
            6 | 7 => {
                let c = self.word("command");
                match self.below(10) {
                    0..=3 => {
                        let mut args = vec![c, self.word("info")];
                        for _ in 0..self.range(1, 3) {
                            let n = if self.chance(85) { self.pick(ARITY).0 } else { "zznosuch" };
                            args.push(self.word(n));
                        }
                        Req::new(args).cmp(Cmp::CommandInfo)
                    }
                    4 => Req::new(vec![c, self.word("count")]).cmp(Cmp::Int),
                    5 => Req::new(vec![c, self.word("count"), b"x".to_vec()]),
                    6 => Req::new(vec![c, self.word("list")]).cmp(Cmp::CommandList),
                    7 => {
                        let n = self.pick(ARITY).0;
                        Req::new(vec![c, self.word("docs"), self.word(n)]).cmp(Cmp::Shape)
                    }
                    8 if self.chance(10) => Req::new(vec![c]).cmp(Cmp::Shape),
                    _ => Req::new(vec![c, self.word("info"), b"get".to_vec()]).cmp(Cmp::CommandInfo),
                }
            }
            8 | 9 => {
                let mut args = vec![self.word("info")];
                if self.chance(50) {
                    let s =
                        self.pick(&["server", "clients", "memory", "stats", "keyspace", "all", "default", "nosuch"]);
                    args.push(self.word(s));
                }
                Req::new(args).cmp(Cmp::Text)
            }
            _ => {
                if self.chance(10) {
                    Req::new(vec![self.word("time"), b"x".to_vec()])
                } else {
                    Req::new(vec![self.word("time")]).cmp(Cmp::Time)
                }
            }
        }
    }

    fn client_name(&mut self) -> Vec<u8> {
        self.pick(&[&b"app"[..], b"", b"my-client", b"bad name", b"tab\tname", b"\xc3\xa9", b"x~!"]).to_vec()
    }

    /// A command of the table with one argument too few or too many (the
    /// name counted), or a subcommand with the wrong count.
    fn wrong_arity(&mut self) -> Req {
        loop {
            let (name, arity) = self.pick(ARITY);
            if arity == -1 {
                continue; // any count is right
            }
            let n = if arity > 0 {
                if arity == 1 || self.chance(50) {
                    arity + 1
                } else {
                    arity - 1
                }
            } else {
                -arity - 1
            } as usize;
            let mut args = vec![self.word(name)];
            while args.len() < n {
                let a = if self.chance(50) { self.key() } else { self.value() };
                args.push(a);
            }
            return Req::new(args);
        }
    }

    /// Unknown commands (names no Redis has, so both answer the same),
    /// with args that test Redis's 128-byte truncation, NUL bytes and
    /// bytes that are not UTF-8; and unknown subcommands.
    fn unknown(&mut self) -> Req {
        let mut name = b"zz".to_vec();
        match self.below(6) {
            0 => name.extend(std::iter::repeat_n(b'q', self.range(100, 200) as usize)),
            1 => name.extend_from_slice("ñandú".repeat(self.range(1, 40) as usize).as_bytes()),
            2 => name.extend_from_slice(b"nul\x00after"),
            3 => name.extend([0xff, 0xfe, b'x']),
            _ => name.extend((0..self.range(1, 6)).map(|_| b'a' + self.below(26) as u8)),
        }
        if self.chance(25) {
            // an unknown subcommand of a container
            let c = self.pick(&["client", "config", "command"]);
            let mut args = vec![self.word(c), name];
            if self.chance(30) {
                args.push(self.value());
            }
            return Req::new(args);
        }
        let mut args = vec![name];
        for _ in 0..self.pick(&[0, 1, 2, 3, 5]) {
            let a = match self.below(6) {
                0 => vec![b'w'; self.range(20, 140) as usize],
                1 => "é".repeat(self.range(1, 80) as usize).into_bytes(),
                2 => b"a\x00b".to_vec(),
                3 => b"line\r\nbreak".to_vec(),
                _ => self.value(),
            };
            args.push(a);
        }
        Req::new(args)
    }

    /// Inline lines with Redis's quoting and whitespace rules.
    fn raw_inline(&mut self) -> Req {
        let line: &[u8] = self.pick(&[
            &b"ECHO a\x0bb\r\n"[..],
            b"ECHO a\x0cb\r\n",
            b"ECHO \x0b a\r\n",
            b"ECHO \"a\"\x0b\r\n",
            b"PING\t\r\n",
            b"  PING  \r\n",
            b"ECHO 'a\\'b'\r\n",
            b"ECHO \"\\x4g\"\r\n",
            b"ECHO \"\\x41\\x4a\"\r\n",
            b"ECHO \"\\\"\"\r\n",
            b"ECHO \"a\\zb\"\r\n",
            b"ECHO 'a\\zb'\r\n",
            b"ECHO a\"b c\"d\r\n",
            b"ECHO a'b'\r\n",
            b"\r\nPING\r\n",
            b"\nPING\r\n",
            b"ECHO x\n",
            b"ECHO x\r\r\n",
            b"SET a \"1 2\"\r\n",
            b"GET a\x0b\r\n",
            b"ECHO \"\"\r\n",
            b"ECHO ''\r\n",
            b"ECHO \"\\n\\r\\t\\b\\a\"\r\n",
        ]);
        let mut r = Req::new(vec![b"raw".to_vec()]);
        r.raw = Some(line.to_vec());
        r
    }

    /// The next request: inside MULTI, sometimes EXEC or DISCARD.
    fn step(&mut self, st: &State) -> Req {
        if st.multi && self.chance(18) {
            let w = if self.chance(85) { "exec" } else { "discard" };
            return Req::new(vec![self.word(w)]);
        }
        loop {
            let r = self.command(st);
            // Not queued inside MULTI (each needs its own checks after the
            // reply; see Cmp).
            if st.multi && matches!(r.cmp, Cmp::RandomKey | Cmp::Scan | Cmp::Hello) {
                continue;
            }
            return r;
        }
    }
}

// Float texts for INCRBYFLOAT, adapted from the generators that checked
// crates/resp/src/float.rs against redis-server: decimals of every length
// and exponent (down to subnormals, up to overflow), hex floats, exact
// ties of the 80-bit format, and specials (inf, nan, whitespace, garbage).

fn sign(g: &mut Gen) -> &'static str {
    match g.below(10) {
        0..=5 => "",
        6..=8 => "-",
        _ => "+",
    }
}

fn gen_decimal(g: &mut Gen) -> String {
    let n = match g.below(10) {
        0..=5 => g.range(1, 20),
        6..=8 => g.range(18, 40),
        _ => g.range(40, 300),
    } as usize;
    let mut d = g.digits(n);
    if g.chance(10) {
        d = format!("{}{}", "0".repeat(g.range(1, 5) as usize), d);
    }
    let mut s = sign(g).to_string();
    if g.chance(70) {
        let p = g.below(d.len() as u64 + 1) as usize;
        s += &format!("{}.{}", &d[..p], &d[p..]);
    } else {
        s += &d;
    }
    if g.chance(50) {
        let e = match g.below(10) {
            0..=4 => g.range(-25, 25),
            5..=7 => g.range(-400, 400),
            8 => g.range(-4960, -4900),
            _ => g.range(4890, 4935),
        };
        let mark = if g.chance(50) { "e" } else { "E" };
        s += &format!("{mark}{e}");
    }
    s
}

fn gen_hex(g: &mut Gen) -> String {
    let n = g.range(1, 24) as usize;
    let d: String = (0..n).map(|_| b"0123456789abcdefABCDEF"[g.below(22) as usize] as char).collect();
    let p = g.below(n as u64 + 1) as usize;
    let x = if g.chance(50) { "x" } else { "X" };
    let mut s = format!("{}0{x}{}", sign(g), &d[..p]);
    if p < n {
        s += &format!(".{}", &d[p..]);
    }
    if g.chance(70) {
        let e = match g.below(10) {
            0..=6 => g.range(-80, 80),
            7 | 8 => g.range(-16530, -16370),
            _ => g.range(16300, 16390),
        };
        s += &format!("p{e}");
    }
    s
}

/// The exact decimal of mant * 2^exp.
fn dyadic_decimal(mant: &BigUint, exp: i64) -> String {
    if exp >= 0 {
        return (mant << exp as usize).to_string();
    }
    let k = (-exp) as usize;
    let digits = (mant * BigUint::from(5u32).pow(k as u32)).to_string();
    let digits = format!("{}{}", "0".repeat((k + 1).saturating_sub(digits.len())), digits);
    let (int, frac) = digits.split_at(digits.len() - k);
    format!("{int}.{frac}")
}

/// Values at and next to the rounding ties of the 80-bit format.
fn gen_tricky(g: &mut Gen) -> String {
    let s = sign(g);
    if g.chance(25) {
        let k = BigUint::from(g.next() >> g.below(64));
        return format!("{s}{}", dyadic_decimal(&k, -g.range(0, 70)));
    }
    let m = g.next() | (1 << 63);
    let q = g.range(-130, 20);
    let mid = (BigUint::from(m) << 1usize) + 1u32;
    let text = dyadic_decimal(&mid, q - 1);
    match g.below(3) {
        0 => format!("{s}{text}"),
        1 => {
            let t = if text.contains('.') { text } else { text + "." };
            format!("{s}{t}{}1", "0".repeat(g.range(0, 30) as usize))
        }
        _ => {
            let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
            let extra = g.range(0, 10) as usize;
            let n: BigUint = format!("{int}{frac}{}", "0".repeat(extra)).parse().unwrap();
            format!("{s}{}e-{}", n - 1u32, frac.len() + extra)
        }
    }
}

fn gen_special(g: &mut Gen) -> String {
    g.pick(&[
        "inf",
        "-inf",
        "INFINITY",
        "+Inf",
        "infinit",
        "nan",
        "-nan",
        "NAN(1)",
        " 1",
        "1 ",
        "\t2",
        "1x",
        "",
        ".",
        "+",
        "-",
        "0x",
        "0x.",
        "0x1p",
        "1e",
        "1e+",
        ".e1",
        "-0",
        "0",
        "+0",
        "0.0",
        "1\u{0}",
        "1,5",
        "--1",
        "+-1",
        "0x1.8p1",
        ".5",
        "5.",
        "1e99999999999",
        "1e-99999999999",
        "0e99999999999",
        "10",
        "-10",
        "9223372036854775807",
        "-9223372036854775808",
        "18446744073709551616",
        "0.1",
        "0.2",
        "1.1",
        "3.0e3",
        "1e308",
        "1e-320",
    ])
    .to_string()
}

fn float_text(g: &mut Gen) -> String {
    match g.below(100) {
        0..=44 => gen_decimal(g),
        45..=54 => gen_hex(g),
        55..=79 => gen_tricky(g),
        _ => gen_special(g),
    }
}

// ---------------------------------------------------------------------
// The driver.

/// One server's connection.
struct Side {
    name: &'static str,
    addr: SocketAddr,
    c: Client,
}

impl Side {
    fn connect(name: &'static str, addr: SocketAddr) -> Side {
        let c = Client::connect(addr);
        // A command's second part goes out at once (see ask_many), not
        // after the first's delayed ACK.
        c.w.set_nodelay(true).unwrap();
        Side { name, addr, c }
    }

    /// Send `bytes`, read one reply; None if the server closed.
    fn ask(&mut self, bytes: &[u8]) -> Option<Value> {
        self.ask_many(bytes, 1, None).pop().unwrap()
    }

    /// Send `bytes` (in two writes, apart, when `split` says where), read
    /// `n` replies; None for each after the server closed.
    fn ask_many(&mut self, bytes: &[u8], n: usize, split: Option<usize>) -> Vec<Option<Value>> {
        // A closed connection shows in the read.
        match split {
            Some(at) if at < bytes.len() => {
                let _ = self.c.w.write_all(&bytes[..at]);
                std::thread::sleep(Duration::from_millis(2));
                let _ = self.c.w.write_all(&bytes[at..]);
            }
            _ => {
                let _ = self.c.w.write_all(bytes);
            }
        }
        let mut out = Vec::new();
        for _ in 0..n {
            let v = if out.last().is_some_and(Option::is_none) { None } else { self.c.try_read() };
            out.push(v);
        }
        out
    }

    fn call(&mut self, args: &[&[u8]]) -> Value {
        self.c.call(args)
    }
}

fn pairs(v: &Value) -> Option<Vec<(Value, Value)>> {
    match v {
        Value::Map(m) => Some(m.clone()),
        Value::Array(a) if a.len() % 2 == 0 => Some(a.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect()),
        _ => None,
    }
}

fn is_text(v: &Value) -> bool {
    matches!(v, Value::Bulk(_) | Value::Verbatim(..))
}

/// Compare one reply pair (EXEC's: [`Run::compare_exec`]).
fn compare(cmp: Cmp, g: &Value, r: &Value) -> Result<(), String> {
    let differ = || Err("replies differ".to_string());
    if matches!(g, Value::Error(_)) || matches!(r, Value::Error(_)) {
        return if g == r { Ok(()) } else { differ() };
    }
    match cmp {
        Cmp::Exact => {
            if g == r {
                Ok(())
            } else {
                differ()
            }
        }
        // Checked on each side by the caller (Run::check_random_key,
        // Run::check_scan_page).
        Cmp::RandomKey | Cmp::Scan => Ok(()),
        Cmp::Ttl | Cmp::Pttl => match (g, r) {
            (Value::Int(a), Value::Int(b)) if *a < 0 || *b < 0 => {
                if a == b {
                    Ok(())
                } else {
                    differ()
                }
            }
            (Value::Int(a), Value::Int(b)) => {
                let tol = if cmp == Cmp::Ttl { 1 } else { 2000 };
                if (a - b).abs() <= tol {
                    Ok(())
                } else {
                    differ()
                }
            }
            _ => differ(),
        },
        Cmp::Sorted => match (g, r) {
            (Value::Array(a), Value::Array(b)) => {
                let sort = |v: &Vec<Value>| {
                    let mut v: Vec<String> = v.iter().map(|x| format!("{x:?}")).collect();
                    v.sort();
                    v
                };
                if sort(a) == sort(b) {
                    Ok(())
                } else {
                    differ()
                }
            }
            _ => differ(),
        },
        Cmp::Hello => {
            let (Some(a), Some(b)) = (pairs(g), pairs(r)) else { return differ() };
            if std::mem::discriminant(g) != std::mem::discriminant(r) {
                return differ();
            }
            let keep = |p: &Vec<(Value, Value)>| -> Vec<(Value, Option<Value>)> {
                p.iter()
                    .map(|(k, v)| {
                        let skip = *k == Value::bulk("id") || *k == Value::bulk("version");
                        (k.clone(), (!skip).then(|| v.clone()))
                    })
                    .collect()
            };
            if keep(&a) == keep(&b) {
                Ok(())
            } else {
                differ()
            }
        }
        Cmp::Text => {
            if is_text(g) && std::mem::discriminant(g) == std::mem::discriminant(r) {
                Ok(())
            } else {
                differ()
            }
        }
        Cmp::Int => {
            if matches!((g, r), (Value::Int(_), Value::Int(_))) {
                Ok(())
            } else {
                differ()
            }
        }
        Cmp::Time => match (g, r) {
            (Value::Array(a), Value::Array(b))
                if a.len() == 2 && b.len() == 2 && a.iter().chain(b).all(|v| matches!(v, Value::Bulk(_))) =>
            {
                Ok(())
            }
            _ => differ(),
        },
        Cmp::CommandInfo => {
            let norm = |v: &Value| -> Option<Vec<Value>> {
                let Value::Array(entries) = v else { return None };
                Some(
                    entries
                        .iter()
                        .map(|e| match e {
                            Value::Array(f) if f.len() >= 6 => {
                                let mut flags = match &f[2] {
                                    Value::Array(x) | Value::Set(x) => x.iter().map(|x| format!("{x:?}")).collect(),
                                    _ => vec!["?".to_string()],
                                };
                                flags.sort();
                                Value::Array(vec![
                                    f[0].clone(),
                                    f[1].clone(),
                                    Value::Simple(flags.join(",")),
                                    f[3].clone(),
                                    f[4].clone(),
                                    f[5].clone(),
                                ])
                            }
                            other => other.clone(),
                        })
                        .collect(),
                )
            };
            match (norm(g), norm(r)) {
                (Some(a), Some(b)) if a == b => Ok(()),
                _ => differ(),
            }
        }
        Cmp::CommandList => match (g, r) {
            (Value::Array(a), Value::Array(b)) if a.iter().all(|x| b.contains(x)) => Ok(()),
            _ => differ(),
        },
        Cmp::Shape => {
            if std::mem::discriminant(g) == std::mem::discriminant(r) {
                Ok(())
            } else {
                differ()
            }
        }
        Cmp::ConfigGet => {
            if std::mem::discriminant(g) != std::mem::discriminant(r) {
                return differ();
            }
            let norm = |v: &Value| {
                let mut p: Vec<String> = pairs(v)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| {
                        let port = matches!(&k, Value::Bulk(b) if b.eq_ignore_ascii_case(b"port"));
                        format!("{k:?}={:?}", if port { Value::bulk("PORT") } else { v })
                    })
                    .collect();
                p.sort();
                p
            };
            if norm(g) == norm(r) {
                Ok(())
            } else {
                differ()
            }
        }
    }
}

/// One seed's run: the two connections and what the test knows of them.
struct Run {
    seed: u64,
    g: Side,
    r: Side,
    st: State,
    /// Requests queued since MULTI (those answered QUEUED).
    queued: Vec<Req>,
    /// The database each connection addresses (as the replies tell).
    db: u32,
    /// Keys a SET may have left expired in Redis (database, key).
    touch: Vec<(u32, Vec<u8>)>,
    history: Vec<String>,
    step: usize,
    /// With GRANARY_FUZZ_STATS: how often each command got each kind of
    /// reply (what the grammar reaches).
    stats: Option<std::collections::BTreeMap<(String, String), u64>>,
}

impl Run {
    fn fail(&self, req: &str, g: &Option<Value>, r: &Option<Value>, why: &str) -> ! {
        let from = self.history.len().saturating_sub(30);
        panic!(
            "seed {} (rerun: GRANARY_FUZZ_SEED={}), step {}: {why}\n request: {req}\n Granary: {}\n Redis:   {}\nthe requests before:\n  {}",
            self.seed,
            self.seed,
            self.step,
            show_value(g),
            show_value(r),
            self.history[from..].join("\n  ")
        );
    }

    /// Send one request to both, compare, and follow what it did.
    fn exchange(&mut self, req: &Req) {
        self.pipeline(std::slice::from_ref(req), None);
    }

    /// Send requests to both in one write (pipelined; or one request in
    /// two writes, apart, at `split`), then judge each reply in order.
    fn pipeline(&mut self, reqs: &[Req], split: Option<usize>) {
        let bytes: Vec<u8> = reqs.iter().flat_map(|r| r.bytes()).collect();
        let gs = self.g.ask_many(&bytes, reqs.len(), split);
        let rs = self.r.ask_many(&bytes, reqs.len(), split);
        for ((req, g), r) in reqs.iter().zip(gs).zip(rs) {
            self.judge(req, g, r);
        }
    }

    /// Compare the replies to one request, and follow what it did.
    fn judge(&mut self, req: &Req, g: Option<Value>, r: Option<Value>) {
        let shown = req.show();
        match (&g, &r) {
            (None, None) => {}
            (Some(gv), Some(rv)) => {
                let name = req.name();
                let queued = self.st.multi && !matches!(&name[..], "exec" | "discard" | "multi" | "watch" | "quit");
                let res = if self.st.multi && name == "exec" {
                    self.compare_exec(gv, rv)
                } else if queued {
                    compare(Cmp::Exact, gv, rv) // QUEUED, or why not
                } else {
                    compare(req.cmp, gv, rv)
                };
                if let Err(why) = res {
                    self.fail(&shown, &g, &r, &why);
                }
            }
            _ => self.fail(&shown, &g, &r, "one server closed the connection"),
        }
        self.history.push(format!("{shown}  -> {}", show_value(&r)));
        if let Some(stats) = &mut self.stats {
            let kind = match &r {
                None => "closed".to_string(),
                Some(Value::Error(e)) => e.split(' ').take(3).collect::<Vec<_>>().join(" "),
                Some(Value::Simple(s)) if s == "QUEUED" => "QUEUED".to_string(),
                Some(v) => format!("{v:?}").split('(').next().unwrap_or("").to_string(),
            };
            *stats.entry((req.name(), kind)).or_default() += 1;
        }
        // QUIT, or a protocol error (an inline line's quotes): both
        // answer and close.
        let protocol_error = matches!(&r, Some(Value::Error(e)) if e.starts_with("ERR Protocol error"));
        let closed = r.is_none() || protocol_error || (req.name() == "quit" && r == Some(Value::ok()));
        if closed && r.is_some() {
            let (cg, cr) = (self.g.c.try_read(), self.r.c.try_read());
            if cg.is_some() || cr.is_some() {
                self.fail(&shown, &cg, &cr, "the connection stayed open");
            }
        }
        if closed {
            // QUIT (or an inline quirk that closes): both closed; start over
            // on new connections.
            self.g = Side::connect(self.g.name, self.g.addr);
            self.r = Side::connect(self.r.name, self.r.addr);
            self.st = State::default();
            self.queued.clear();
            self.db = 0;
            return;
        }
        let (gv, rv) = (g.unwrap(), r.unwrap());
        match req.cmp {
            Cmp::RandomKey => {
                self.check_random_key(&gv, true);
                self.check_random_key(&rv, false);
            }
            Cmp::Scan => {
                self.check_scan_page(&gv, true, &shown);
                self.check_scan_page(&rv, false, &shown);
            }
            _ => {}
        }
        self.follow(req, &rv);
    }

    /// Follow the connection's state from Redis's reply (equal to
    /// Granary's by now).
    fn follow(&mut self, req: &Req, reply: &Value) {
        let name = req.name();
        if self.st.multi {
            match &name[..] {
                // EXEC ends MULTI even refused for its arity (Redis then
                // discards the transaction); DISCARD only when it runs.
                "exec" | "discard" if name == "exec" || req.args.len() == 1 => {
                    if let Value::Array(results) = reply {
                        let queued = std::mem::take(&mut self.queued);
                        for (q, res) in queued.iter().zip(results) {
                            self.after(q, res);
                        }
                    }
                    self.st = State::default();
                    self.queued.clear();
                }
                _ if *reply == Value::Simple("QUEUED".into()) => {
                    self.st.queued_write |= WRITES.contains(&&name[..]);
                    self.queued.push(req.clone());
                }
                _ => {}
            }
            return;
        }
        if name == "multi" && *reply == Value::ok() {
            self.st.multi = true;
            return;
        }
        self.after(req, reply);
    }

    /// What a command that ran did to the state the test follows.
    fn after(&mut self, req: &Req, reply: &Value) {
        if matches!(reply, Value::Error(_)) {
            return;
        }
        if req.name() == "select" {
            self.db = String::from_utf8_lossy(&req.args[1]).parse().unwrap();
        }
        if req.past_set {
            self.touch.push((self.db, req.args[1].clone()));
        }
    }

    /// Read every key SET may have left expired in Redis, so that it
    /// removes them (its lazy expiry) and DBSIZE counts alike; the reads
    /// are compared too.
    fn touch_expired(&mut self) {
        for (db, key) in std::mem::take(&mut self.touch) {
            let here = self.db;
            if db != here {
                self.exchange(&Req::new(vec![b"SELECT".to_vec(), db.to_string().into_bytes()]));
            }
            self.exchange(&Req::new(vec![b"EXISTS".to_vec(), key]));
            if db != here {
                self.exchange(&Req::new(vec![b"SELECT".to_vec(), here.to_string().into_bytes()]));
            }
        }
    }

    /// EXEC: element by element, each with its command's comparison.
    fn compare_exec(&self, g: &Value, r: &Value) -> Result<(), String> {
        match (g, r) {
            (Value::Array(a), Value::Array(b)) if a.len() == b.len() && a.len() == self.queued.len() => {
                for (i, ((x, y), q)) in a.iter().zip(b).zip(&self.queued).enumerate() {
                    compare(q.cmp, x, y).map_err(|e| format!("EXEC's reply {i} ({}): {e}", q.show()))?;
                }
                Ok(())
            }
            _ => compare(Cmp::Exact, g, r),
        }
    }

    fn side(&mut self, granary: bool) -> &mut Side {
        if granary {
            &mut self.g
        } else {
            &mut self.r
        }
    }

    /// RANDOMKEY's answer is a live key of the database, or nil iff it is
    /// empty.
    fn check_random_key(&mut self, v: &Value, granary: bool) {
        let s = self.side(granary);
        let ok = match v {
            Value::Nil => s.call(&[b"DBSIZE"]) == Value::Int(0),
            Value::Bulk(k) => s.call(&[b"EXISTS", k]) == Value::Int(1),
            _ => false,
        };
        if !ok {
            let name = s.name;
            self.fail("RANDOMKEY", &Some(v.clone()), &None, &format!("{name}'s RANDOMKEY is not a live key"));
        }
    }

    /// A SCAN page: a cursor and live keys.
    fn check_scan_page(&mut self, v: &Value, granary: bool, req: &str) {
        if matches!(v, Value::Error(_)) {
            return;
        }
        let s = self.side(granary);
        let name = s.name;
        let ok = match v {
            Value::Array(p) if p.len() == 2 => match (&p[0], &p[1]) {
                (Value::Bulk(c), Value::Array(keys)) => {
                    std::str::from_utf8(c).is_ok_and(|c| c.parse::<u64>().is_ok())
                        && keys.iter().all(|k| match k {
                            Value::Bulk(k) => s.call(&[b"EXISTS", k]) == Value::Int(1),
                            _ => false,
                        })
                }
                _ => false,
            },
            _ => false,
        };
        if !ok {
            self.fail(req, &Some(v.clone()), &None, &format!("{name}'s SCAN page is not a cursor and live keys"));
        }
    }

    /// A full SCAN (cursor 0 back to 0) on one side: its set of keys.
    fn full_scan(&mut self, granary: bool, opts: &[Vec<u8>]) -> Result<BTreeSet<Vec<u8>>, Value> {
        let s = self.side(granary);
        let mut cursor = b"0".to_vec();
        let mut keys = BTreeSet::new();
        for _ in 0..10_000 {
            let mut args: Vec<&[u8]> = vec![b"SCAN", &cursor];
            args.extend(opts.iter().map(|o| &o[..]));
            let Some(v) = s.ask(&encode(&args)) else { return Err(Value::Simple("(closed)".into())) };
            let Value::Array(p) = &v else { return Err(v) };
            let (Value::Bulk(c), Value::Array(page)) = (&p[0], &p[1]) else { return Err(v) };
            for k in page {
                let Value::Bulk(k) = k else { return Err(v.clone()) };
                keys.insert(k.clone());
            }
            cursor = c.clone();
            if cursor == b"0" {
                return Ok(keys);
            }
        }
        panic!("{}: SCAN never came back to cursor 0", s.name);
    }

    /// Compare the whole database: full scans (random MATCH, COUNT, TYPE),
    /// KEYS *, and each key's type, value and expiry.
    fn checkpoint(&mut self, gen: &mut Gen) {
        let mut opts = Vec::new();
        if gen.chance(50) {
            opts.extend([b"MATCH".to_vec(), gen.pattern()]);
        }
        if gen.chance(50) {
            opts.extend([b"COUNT".to_vec(), gen.range(1, 20).to_string().into_bytes()]);
        }
        if gen.chance(30) {
            opts.extend([b"TYPE".to_vec(), gen.pick(&[&b"string"[..], b"hash"]).to_vec()]);
        }
        let (a, b) = (self.full_scan(true, &opts), self.full_scan(false, &opts));
        if a != b {
            let show = |x: &Result<BTreeSet<Vec<u8>>, Value>| match x {
                Ok(k) => Some(Value::Array(k.iter().map(|k| Value::Bulk(k.clone())).collect())),
                Err(v) => Some(v.clone()),
            };
            let req = Req::new([vec![b"SCAN".to_vec(), b"(full)".to_vec()], opts].concat()).show();
            self.fail(&req, &show(&a), &show(&b), "full scans found different keys");
        }
        self.exchange(&Req::of(&[b"DBSIZE"]));
        self.exchange(&Req::of(&[b"KEYS", b"*"]).cmp(Cmp::Sorted));
        let Value::Array(keys) = self.r.call(&[b"KEYS", b"*"]) else { panic!("KEYS") };
        for k in keys {
            let Value::Bulk(k) = k else { panic!("KEYS") };
            self.exchange(&Req::of(&[b"TYPE", &k]));
            match self.r.call(&[b"TYPE", &k]) {
                Value::Simple(t) if t == "hash" => self.exchange(&Req::of(&[b"HGETALL", &k])),
                _ => self.exchange(&Req::of(&[b"GET", &k])),
            }
            self.exchange(&Req::of(&[b"PTTL", &k]).cmp(Cmp::Pttl));
        }
    }
}

fn show_value(v: &Option<Value>) -> String {
    match v {
        None => "(closed)".into(),
        Some(v) => {
            let s = format!("{v:?}");
            if s.len() > 400 {
                format!("{}...({} chars)", &s[..400], s.len())
            } else {
                s
            }
        }
    }
}

/// The differential test (see the module's comment).
#[test]
fn random_commands_get_redis_s_replies() {
    let Some(redis) = start_redis() else { return };
    let seeds: Vec<u64> = match env_u64("GRANARY_FUZZ_SEED") {
        Some(s) => vec![s],
        None => (1..=env_u64("GRANARY_FUZZ_CASES").unwrap_or(20)).collect(),
    };
    let steps = env_u64("GRANARY_FUZZ_STEPS").unwrap_or(400) as usize;
    let mut totals = std::collections::BTreeMap::<(String, String), u64>::new();
    for seed in seeds {
        let f = Fixture::default();
        let mut run = Run {
            seed,
            g: Side::connect("Granary", f.addr),
            r: Side::connect("Redis", redis.addr),
            st: State::default(),
            queued: Vec::new(),
            db: 0,
            touch: Vec::new(),
            history: Vec::new(),
            step: 0,
            stats: std::env::var_os("GRANARY_FUZZ_STATS").map(|_| Default::default()),
        };
        assert_eq!(run.r.call(&[b"FLUSHALL"]), Value::ok());
        let mut gen = Gen::new(seed);
        for step in 0..steps {
            run.step = step;
            if !run.st.multi && gen.chance(3) {
                // A few commands pipelined in one write.
                let mut batch = Vec::new();
                while batch.len() < gen.range(2, 6) as usize {
                    let r = gen.command(&State::default());
                    let special = matches!(r.cmp, Cmp::RandomKey | Cmp::Scan | Cmp::Hello) || r.raw.is_some();
                    if !special && !matches!(&r.name()[..], "multi" | "exec" | "discard" | "quit") {
                        // A SET that may leave an expired key in Redis ends
                        // the batch: the key is touched right after it.
                        let last = r.past_set;
                        batch.push(r);
                        if last {
                            break;
                        }
                    }
                }
                run.pipeline(&batch, None);
            } else {
                let req = gen.step(&run.st);
                // Sometimes in two writes, apart: a command read in pieces.
                let split = (gen.chance(3) && req.raw.is_none()).then(|| gen.below(req.bytes().len() as u64) as usize);
                run.pipeline(std::slice::from_ref(&req), split);
            }
            if !run.st.multi {
                run.touch_expired();
                if step % 50 == 49 {
                    run.checkpoint(&mut gen);
                }
            }
        }
        // Leave MULTI, then compare everything once more.
        if run.st.multi {
            run.exchange(&Req::of(&[b"DISCARD"]));
        }
        run.touch_expired();
        run.checkpoint(&mut gen);
        for ((cmd, kind), n) in run.stats.take().unwrap_or_default() {
            *totals.entry((cmd, kind)).or_default() += n;
        }
    }
    for ((cmd, kind), n) in totals {
        eprintln!("{n:8} {cmd:12} {kind}");
    }
}

/// Read everything until the server closes (or 5 s pass): the bytes, and
/// whether it closed.
fn read_to_close(s: &mut TcpStream) -> (Vec<u8>, bool) {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (got, true),
            Err(_) => return (got, false),
        }
    }
}

/// Protocol errors: each sent after a PING on a fresh connection to both;
/// the bytes answered (PONG, then the error) must be the same and both
/// must close the connection.
#[test]
fn protocol_errors_get_redis_s_replies_and_close() {
    let Some(redis) = start_redis() else { return };
    let f = Fixture::default();
    let big = granary_resp::limits::INLINE_BYTES_MAX + 100;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("multibulk length not a number", b"*x\r\n".to_vec()),
        ("multibulk length with a '+'", b"*+1\r\n".to_vec()),
        ("multibulk length past INT_MAX", b"*3000000000\r\n".to_vec()),
        ("empty multibulk length", b"*\r\n".to_vec()),
        ("bulk length not a number", b"*1\r\n$x\r\n".to_vec()),
        ("negative bulk length", b"*1\r\n$-1\r\n".to_vec()),
        ("bulk past proto-max-bulk-len", format!("*1\r\n${}\r\n", BULK_MAX + 1).into_bytes()),
        ("expected '$'", b"*1\r\nfoo\r\n".to_vec()),
        ("expected '$', a byte past ASCII", b"*1\r\n\xe9oo\r\n".to_vec()),
        ("expected '$' for the second argument", b"*2\r\n$3\r\nget\r\n:1\r\n".to_vec()),
        ("unbalanced double quote", b"SET \"a\r\n".to_vec()),
        ("unbalanced single quote", b"SET 'a\r\n".to_vec()),
        ("closing quote not followed by a space", b"SET \"a\"b c\r\n".to_vec()),
        ("escape at the end of a quote", b"ECHO \"a\\\"\r\n".to_vec()),
        ("too big inline request", vec![b'a'; big]),
        ("too big mbulk count string", [&b"*"[..], &vec![b'1'; big]].concat()),
        ("too big bulk count string", [&b"*1\r\n$"[..], &vec![b'1'; big]].concat()),
        // Redis looks for the line's end as a C string: a NUL hides it.
        ("NUL in an inline line", [&b"PI\x00NG\r\n"[..], &vec![b'a'; big]].concat()),
        ("NUL in a multibulk header", [&b"*1\x00\r\n"[..], &vec![b'a'; big]].concat()),
    ];
    for (what, bad) in cases {
        let mut got = Vec::new();
        for addr in [f.addr, redis.addr] {
            let mut s = TcpStream::connect(addr).unwrap();
            let mut b = encode(&[b"PING"]);
            b.extend_from_slice(&bad);
            s.write_all(&b).unwrap();
            got.push(read_to_close(&mut s));
        }
        assert_eq!(
            (show_bytes(&got[0].0, 300), got[0].1),
            (show_bytes(&got[1].0, 300), got[1].1),
            "{what}: Granary's reply and close (left), Redis's (right)"
        );
        assert!(got[1].1, "{what}: Redis closed the connection");
    }
    // What is not an error: an empty or null multibulk, an empty line.
    for ok in [&b"*0\r\n"[..], b"*-1\r\n", b"*-7\r\n", b"\r\n", b"\n", b"  \r\n"] {
        let mut replies = Vec::new();
        for addr in [f.addr, redis.addr] {
            let mut c = Client::connect(addr);
            let mut b = ok.to_vec();
            b.extend(encode(&[b"PING"]));
            c.send_raw(&b);
            replies.push(c.read());
        }
        assert_eq!(replies[0], replies[1], "{}", show_bytes(ok, 20));
        assert_eq!(replies[1], Value::Simple("PONG".into()));
    }
}

/// Expiry as time passes, which the random sequences keep away from: keys
/// set to expire in a second (long enough that the set-up's commands to
/// the two servers all come before it on a loaded machine), read 2.2 s
/// after (Redis's lazy expiry, as
/// Granary's), and a WATCHed key expiring before EXEC (Redis aborts it).
#[test]
fn expired_keys_get_redis_s_replies() {
    let Some(redis) = start_redis() else { return };
    let f = Fixture::default();
    let (mut g, mut r) = (Side::connect("Granary", f.addr), Side::connect("Redis", redis.addr));
    assert_eq!(r.call(&[b"FLUSHALL"]), Value::ok());
    let mut both = |line: &str, cmp: Cmp| {
        let args: Vec<&[u8]> = line.split(' ').map(|a| a.as_bytes()).collect();
        let (a, b) = (g.call(&args), r.call(&args));
        if let Err(e) = compare(cmp, &a, &b) {
            panic!("{line}: {e}\n Granary: {a:?}\n Redis:   {b:?}");
        }
        b
    };
    for line in [
        "SET w v PX 1100",
        "WATCH w",
        "SET x 1 PX 1000",
        "SET y 1 PX 1000",
        "SET z 1 PX 1000",
        "SET q 1 PX 1000",
        "SET g v",
        "GETEX g PX 1000",
        "SET k v PX 1000",
        "SET k w KEEPTTL",
        "HSET h f v",
        "PEXPIRE h 1000",
        "SET keep v EX 1000",
    ] {
        both(line, Cmp::Exact);
    }
    std::thread::sleep(Duration::from_millis(2200));
    for (line, cmp) in [
        // The WATCHed key expired: EXEC aborts.
        ("MULTI", Cmp::Exact),
        ("GET keep", Cmp::Exact),
        ("EXEC", Cmp::Exact),
        // Watched already expired, then not written: EXEC runs.
        ("WATCH x", Cmp::Exact),
        ("MULTI", Cmp::Exact),
        ("GET x", Cmp::Exact),
        ("EXEC", Cmp::Exact),
        // Watched already expired, then written: EXEC aborts.
        ("WATCH q", Cmp::Exact),
        ("SET q 2", Cmp::Exact),
        ("MULTI", Cmp::Exact),
        ("EXEC", Cmp::Exact),
        ("GET x", Cmp::Exact),
        ("GET g", Cmp::Exact),
        ("GET k", Cmp::Exact),
        ("TTL y", Cmp::Exact),
        ("PTTL y", Cmp::Exact),
        ("EXISTS z y x", Cmp::Exact),
        ("TYPE h", Cmp::Exact),
        ("PERSIST z", Cmp::Exact),
        ("EXPIRE z 100", Cmp::Exact),
        ("RENAME z zz", Cmp::Exact),
        ("INCR x", Cmp::Exact),
        ("SET y 2 NX", Cmp::Exact),
        ("HSET h g w", Cmp::Exact),
        ("HGETALL h", Cmp::Exact),
        ("APPEND z ab", Cmp::Exact),
        ("MSETNX k 1 kk 2", Cmp::Exact),
        ("KEYS *", Cmp::Sorted),
        // Not DBSIZE: it counts expired keys until the engine drops them
        // (docs/RESP.md, "Differences"), Redis until its active expiry.
        ("TTL keep", Cmp::Ttl),
    ] {
        both(line, cmp);
    }
    // Full scans find the same live keys; RANDOMKEY picks live ones.
    let mut scans = Vec::new();
    for s in [&mut g, &mut r] {
        let (mut cursor, mut keys) = (b"0".to_vec(), BTreeSet::new());
        loop {
            let Value::Array(p) = s.call(&[b"SCAN", &cursor, b"COUNT", b"3"]) else { panic!("SCAN") };
            let (Value::Bulk(c), Value::Array(page)) = (&p[0], &p[1]) else { panic!("SCAN: {p:?}") };
            keys.extend(page.iter().map(|k| format!("{k:?}")));
            cursor = c.clone();
            if cursor == b"0" {
                break;
            }
        }
        scans.push(keys);
        for _ in 0..20 {
            let Value::Bulk(k) = s.call(&[b"RANDOMKEY"]) else { panic!("RANDOMKEY") };
            assert_eq!(s.call(&[b"EXISTS", &k]), Value::Int(1), "{}: RANDOMKEY {k:?} is not live", s.name);
        }
    }
    assert_eq!(scans[0], scans[1], "full scans: Granary's keys (left), Redis's (right)");
}

/// Edge cases the random sequences reach only by luck, each a short
/// script on an empty database, every reply compared.
#[test]
fn edge_cases_get_redis_s_replies() {
    let Some(redis) = start_redis() else { return };
    let f = Fixture::default();
    let scripts: &[&[&str]] = &[
        &["SET k v EX 1000 EX 2000", "TTL k", "SET k v PX 100 EX 10", "SET k v EX 10 PXAT 1", "SET k v GET GET"],
        &["SET k v NX NX", "SET k v nx xx", "SET k v XX NX", "SET k w KEEPTTL KEEPTTL", "GET k"],
        &["SET k v EX abc EX 1000", "TTL k", "SET k v EX 1000 EX abc", "SET k v EX", "SET k v KEEPTTL PX 1000"],
        &[
            "SETEX k 0 v",
            "SETEX k -1 v",
            "SETEX k 9223372036854775807 v",
            "PSETEX k 9223372036854775807 v",
            "SETEX k 1.5 v",
        ],
        &[
            "GETEX nokey EX abc",
            "GETEX nokey EXAT 0",
            "SET k v",
            "GETEX k EXAT 0",
            "GETEX k EX abc",
            "GETEX k PERSIST PERSIST",
        ],
        &["HSET h f v", "GETEX h EX abc", "GETEX h EX 1000", "GETEX h FOO", "SET h v GET EX abc", "SET h v GET"],
        &["GETEX nokey PERSIST EX 10", "GETEX nokey KEEPTTL", "GETEX nokey NX", "GETEX nokey GET"],
        &[
            "SET k v",
            "GETEX k EX 1000 EX 2000",
            "TTL k",
            "GETEX k PX 5000 PX 6000",
            "PTTL k",
            "GETEX k PXAT 1",
            "EXISTS k",
        ],
        &["SETRANGE nokey 0 \"\"", "SETRANGE nokey 2000000 \"\"", "HSET h f v", "SETRANGE h 0 \"\"", "SETRANGE h -1 x"],
        &["SETRANGE k -1 \"\"", "SETRANGE k abc x", "SETRANGE k 1048576 x", "SETRANGE k 1048575 \"\"", "STRLEN k"],
        &[
            "GETRANGE nokey 0 -1",
            "GETRANGE nokey a b",
            "SET k 12345",
            "GETRANGE k -2 -1",
            "GETRANGE k 3 1",
            "GETRANGE k -100 100",
        ],
        &["MSET k v k w", "GET k", "MSETNX a 1 a 2", "GET a", "MSETNX a 1 b 2", "EXISTS b", "MGET a b k nokey"],
        &["HSET h f v", "MGET h a", "APPEND h x", "STRLEN h", "INCR h", "INCRBYFLOAT h 1", "GETDEL h", "GETSET h x"],
        &[
            "SET n 9223372036854775806",
            "INCR n",
            "INCR n",
            "DECRBY n -9223372036854775808",
            "DECRBY n 9223372036854775807",
        ],
        &["SET n -9223372036854775807", "DECR n", "DECR n", "INCRBY n -1", "INCRBY n 9223372036854775807", "GET n"],
        &[
            "SET n \" 1\"",
            "INCR n",
            "SET n 1e3",
            "INCR n",
            "SET n 007",
            "INCR n",
            "SET n -0",
            "INCR n",
            "SET n +1",
            "INCR n",
        ],
        &[
            "INCRBYFLOAT f \"\"",
            "INCRBYFLOAT f 0x10",
            "INCRBYFLOAT f 1e5000",
            "INCRBYFLOAT f inf",
            "SET f inf",
            "INCRBYFLOAT f 1",
        ],
        &["SET f 1.5", "INCRBYFLOAT f -1.5", "GET f", "INCRBYFLOAT f 0.1", "INCRBYFLOAT f 0.2", "INCRBY f 1"],
        &["RENAME k k", "SET k v", "RENAME k k", "RENAME k j", "EXISTS k j", "HSET h f v", "RENAME h j", "TYPE j"],
        &["SET k v", "EXPIRE k 1000 GT", "EXPIRE k 1000 LT", "TTL k", "EXPIRE k 2000 LT", "EXPIRE k 500 LT", "TTL k"],
        &["SET k v", "EXPIRE k abc GT LT", "EXPIRE k abc NX XX", "EXPIRE k abc FOO", "EXPIRE k 10 FOO", "EXPIRE k abc"],
        &["SET k v", "EXPIRE k 9223372036854775", "EXPIRE k -9223372036854775", "EXISTS k", "SET k v", "PEXPIRE k -1"],
        &["SET k v", "EXPIREAT k 0 NX", "EXISTS k", "PERSIST nokey", "EXPIRE nokey 100", "TTL nokey", "PTTL nokey"],
        &["SCAN 0 COUNT 0", "SCAN 0 COUNT -1", "SCAN 0 COUNT abc", "SCAN 0 MATCH", "SCAN 0 TYPE", "SCAN 0 FOO bar"],
        &["SCAN \"\"", "SCAN +0", "SCAN -0", "SCAN \" 0\"", "SCAN 0x0", "SCAN 18446744073709551616", "SCAN 1.0"],
        &[
            "HSET h f v f2",
            "HMSET h f",
            "HMGET nokey a b",
            "HGETALL nokey",
            "HKEYS nokey",
            "HLEN nokey",
            "HDEL nokey f",
        ],
        &["HSET h f v g w f x", "HGETALL h", "HDEL h f f g", "EXISTS h", "HSETNX h f v", "HSETNX h f w", "HGET h f"],
        &[
            "HSET h f 9223372036854775807",
            "HINCRBY h f 1",
            "HSET h f abc",
            "HINCRBY h f 1",
            "HINCRBY h f abc",
            "HINCRBY h g -5",
        ],
        &["HSET h f \"\"", "HINCRBY h f 1", "HSET h f \" 1\"", "HINCRBY h f 1", "HSET h f 01", "HINCRBY h f 1"],
        &[
            "ECHO \"\"",
            "PING \"\"",
            "ECHO a b",
            "SELECT 16",
            "SELECT -1",
            "SELECT 2147483648",
            "SELECT 1.0",
            "SELECT \"\"",
        ],
        &[
            "CLIENT SETNAME \"\"",
            "CLIENT GETNAME",
            "CLIENT SETNAME a",
            "CLIENT GETNAME",
            "CLIENT SETNAME \"a b\"",
            "CLIENT GETNAME",
        ],
        &[
            "HELLO 3 AUTH default \"\"",
            "HELLO 2 SETNAME x",
            "CLIENT GETNAME",
            "HELLO 3 SETNAME y FOO",
            "CLIENT GETNAME",
        ],
        &["HELLO 3 AUTH DEFAULT x", "HELLO 3 AUTH", "HELLO 3 SETNAME", "HELLO -1", "HELLO 2.0", "HELLO \"\""],
        &["MULTI", "EXEC", "MULTI", "MULTI", "PING", "EXEC", "DISCARD", "EXEC"],
        &["SET k 1", "WATCH k", "UNWATCH", "SET k 2", "MULTI", "GET k", "EXEC"],
        &["WATCH k", "SET k 1", "DEL k", "MULTI", "GET k", "EXEC"],
        &["WATCH k", "SET k 1 NX EXAT 1", "MULTI", "PING", "EXEC"],
        &["SET k 1", "WATCH k", "EXEC x", "SET k 2", "MULTI", "PING", "EXEC"],
        &["MULTI", "CLIENT FOO", "EXEC", "MULTI", "CONFIG GET", "EXEC", "MULTI", "COMMAND COUNT x", "EXEC"],
        &["MULTI", "SET k", "PING", "EXEC", "MULTI", "NOSUCHCMD", "DISCARD", "GET k"],
        &["MULTI", "SELECT 1", "SET k one", "EXEC", "GET k", "SELECT 0", "GET k"],
        &["MULTI", "WATCH k", "SET k 1", "EXEC", "GET k"],
        &["FLUSHDB ASYNC SYNC", "FLUSHDB now", "FLUSHALL sync", "FLUSHDB Async", "DBSIZE"],
        &["CONFIG GET save SAVE Save", "CONFIG GET maxclients databases", "CONFIG GET nosuch", "CONFIG RESETSTAT x"],
        &[
            "COMMAND COUNT x",
            "COMMAND INFO nosuch",
            "CLIENT ID x",
            "CLIENT INFO x",
            "CLIENT GETNAME x",
            "CLIENT SETNAME",
        ],
        &["KEYS \"\"", "SET \"x]y\" 1", "SET ab 1", "KEYS [a-]*", "KEYS x[\\]]y", "KEYS [^a]*", "KEYS *[", "KEYS a\\"],
    ];
    for script in scripts {
        let (mut g, mut r) = (Side::connect("Granary", f.addr), Side::connect("Redis", redis.addr));
        g.call(&[b"FLUSHALL"]);
        r.call(&[b"FLUSHALL"]);
        for line in *script {
            let cmp = if line.starts_with("TTL") {
                Cmp::Ttl
            } else if line.starts_with("PTTL") {
                Cmp::Pttl
            } else if line.starts_with("KEYS") {
                Cmp::Sorted
            } else if line.starts_with("HELLO") {
                Cmp::Hello
            } else if line.starts_with("CONFIG GET") {
                Cmp::ConfigGet
            } else {
                Cmp::Exact
            };
            // Inline, as redis-cli would type it (quotes for empty and
            // spaced arguments).
            let bytes = format!("{line}\r\n").into_bytes();
            let (a, b) = (g.ask(&bytes), r.ask(&bytes));
            let ok = match (&a, &b) {
                (Some(x), Some(y)) => compare(cmp, x, y).is_ok(),
                (None, None) => true,
                _ => false,
            };
            assert!(ok, "{script:?}: {line}\n Granary: {}\n Redis:   {}", show_value(&a), show_value(&b));
        }
    }
}
