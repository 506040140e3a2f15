//! The Redis tools and a Redis client library, unchanged, against
//! `granary serve`'s RESP listener: redis-cli (commands as arguments,
//! commands read from stdin as a user types them, and `--pipe` mass
//! insertion), redis-benchmark, and redis-py. scripts/test.sh installs
//! redis-tools and python3-redis; without them these tests are skipped
//! unless GRANARY_REQUIRE_PEERS is set.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};

mod common;

/// A `granary serve` with only its RESP listener on a free port; stopped
/// (by its PID) when dropped.
struct Serve {
    child: Child,
    port: u16,
}

impl Serve {
    fn start(dir: &Path) -> Serve {
        let port = granary_rt::net::free_low_port().unwrap();
        let mc = granary_rt::net::free_low_port().unwrap();
        let data = dir.join("g.db");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_granary"));
        cmd.args(["serve", "--data", data.to_str().unwrap(), "--size", "64M", "-t", "2", "--no-native"]).args([
            "-p",
            &mc.to_string(),
            "--resp-port",
            &port.to_string(),
        ]);
        let ready = |line: &str| line.contains("serving the Redis protocol");
        let child = common::start_or_panic(&mut cmd, ready, common::START_LIMIT).child;
        Serve { child, port }
    }

    fn cli(&self, args: &[&str]) -> String {
        let o = Command::new("redis-cli").args(["-p", &self.port.to_string()]).args(args).output().unwrap();
        assert!(o.status.success(), "redis-cli {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    }

    /// redis-cli reading commands from stdin, as typed.
    fn cli_stdin(&self, extra: &[&str], input: &[u8]) -> String {
        let mut c = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(input).unwrap();
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "redis-cli {extra:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        common::stop(&mut self.child);
    }
}

#[test]
fn redis_cli_as_users_run_it() {
    if !common::have_peers(&["redis-cli"], &[]) {
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let s = Serve::start(dir.path());
    assert_eq!(s.cli(&["ping"]), "PONG\n");
    assert_eq!(s.cli(&["set", "greeting", "hello world"]), "OK\n");
    assert_eq!(s.cli(&["get", "greeting"]), "hello world\n");
    assert_eq!(s.cli(&["hset", "h", "a", "1", "b", "2"]), "2\n");
    assert_eq!(s.cli(&["hgetall", "h"]), "a\n1\nb\n2\n");
    assert_eq!(s.cli(&["incrby", "n", "5"]), "5\n");
    assert_eq!(s.cli(&["get", "nokey"]), "\n");
    assert!(s.cli(&["nosuchcommand"]).contains("ERR unknown command 'nosuchcommand'"));
    assert!(s.cli(&["info", "server"]).contains("redis_version:"));
    // Commands typed one per line (quoting as redis-cli's prompt takes it).
    let out = s.cli_stdin(&[], b"set \"two words\" 'it is'\nget \"two words\"\nselect 2\ndbsize\nexists greeting\n");
    assert_eq!(out, "OK\nit is\nOK\n0\n0\n");
    // Mass insertion: --pipe sends a file of commands in RESP form.
    let mut proto = Vec::new();
    for i in 0..5000 {
        let (k, v) = (format!("key:{i}"), format!("value:{i}"));
        proto
            .extend_from_slice(format!("*3\r\n$3\r\nSET\r\n${}\r\n{k}\r\n${}\r\n{v}\r\n", k.len(), v.len()).as_bytes());
    }
    let out = s.cli_stdin(&["--pipe"], &proto);
    assert!(out.contains("errors: 0, replies: 5000"), "{out}");
    assert_eq!(s.cli(&["get", "key:4999"]), "value:4999\n");
    assert_eq!(s.cli(&["dbsize"]), "5004\n");
    let scanned = s.cli(&["--scan", "--pattern", "key:1*"]);
    assert_eq!(scanned.lines().count(), 1111, "key:1, key:1x, key:1xx, key:1xxx");
}

#[test]
fn redis_benchmark_runs_unchanged() {
    if !common::have_peers(&["redis-benchmark"], &[]) {
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let s = Serve::start(dir.path());
    for pipeline in ["1", "16"] {
        let o = Command::new("redis-benchmark")
            .args(["-p", &s.port.to_string(), "-c", "10", "-n", "2000", "-P", pipeline, "--csv"])
            .args(["-t", "ping,set,get,incr,mset"])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
        for t in ["PING_INLINE", "PING_MBULK", "SET", "GET", "INCR", "MSET (10 keys)"] {
            assert!(out.contains(&format!("\"{t}\"")), "no {t} row in:\n{out}");
        }
    }
    // The keys redis-benchmark writes are there.
    let got = s.cli(&["get", "counter:__rand_int__"]);
    assert!(got.trim().parse::<u64>().is_ok_and(|n| n > 0), "{got}");
}

#[test]
fn redis_py_works_unchanged() {
    if !common::have_peers(&[], &[("redis", "python3-redis")]) {
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let s = Serve::start(dir.path());
    let script = r#"
import sys, redis
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]), db=3)
assert r.ping()
assert r.set("k", b"v\x00\xff")
assert r.get("k") == b"v\x00\xff"
assert r.set("k", "w", nx=True) is None
assert r.set("t", "v", ex=100)
assert 99 <= r.ttl("t") <= 100
assert r.incr("n") == 1 and r.incrby("n", 9) == 10
assert r.mset({"a": "1", "b": "2"}) and r.mget("a", "b", "zz") == [b"1", b"2", None]
assert r.hset("h", mapping={"f1": "x", "f2": "y"}) == 2
assert r.hgetall("h") == {b"f1": b"x", b"f2": b"y"}
assert r.type("h") == b"hash"
try:
    r.incr("h")
    raise SystemExit("INCR of a hash succeeded")
except redis.ResponseError as e:
    assert str(e).startswith("WRONGTYPE"), e
p = r.pipeline(transaction=True)
p.set("x", 1).incr("x").get("x")
assert p.execute() == [True, 2, b"2"]
with r.pipeline() as p:
    p.watch("x")
    p.multi()
    p.set("x", 10)
    assert p.execute() == [True]
assert sorted(r.scan_iter(match="[ab]")) == [b"a", b"b"]
assert r.dbsize() == 7
assert r.delete("a", "b", "zz") == 2
r.flushdb()
assert r.dbsize() == 0
print("ok")
"#;
    let o = Command::new("/usr/bin/python3").args(["-c", script, &s.port.to_string()]).output().unwrap();
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "ok",
        "redis-py: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}
