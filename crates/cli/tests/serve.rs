//! `granary serve` as a process on a real file: it serves memcache on the
//! given port, stops cleanly on SIGTERM (the next start is a clean restart
//! that reads no log), and after SIGKILL comes back with every
//! acknowledged write (warm restart after a crash).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Serve {
    child: Child,
    port: u16,
    native_port: u16,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Serve {
    /// Start `granary serve` and wait for its "serving" line.
    fn start(data: &Path) -> Serve {
        Serve::start_with(data, &[])
    }

    fn start_with(data: &Path, extra: &[&str]) -> Serve {
        let port = free_port();
        let native_port = free_port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_granary"))
            .args(["serve", "--data", data.to_str().unwrap(), "--size", "64M", "-p", &port.to_string(), "-t", "2"])
            .args(["--native-port", &native_port.to_string()])
            .args(extra)
            .env("GRANARY_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut log = String::new();
        loop {
            let mut line = String::new();
            assert!(err.read_line(&mut line).unwrap() > 0, "granary serve exited early:\n{log}");
            log.push_str(&line);
            // Both listeners are up (or memcache alone with --no-native).
            if line.contains("serving the native protocol")
                || (line.contains("serving") && extra.contains(&"--no-native"))
            {
                break;
            }
        }
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = err.read_to_end(&mut sink);
        });
        Serve { child, port, native_port }
    }

    fn call(&self, req: &[u8]) -> Vec<u8> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(req).unwrap();
        s.write_all(b"mn\r\n").unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        while !got.ends_with(b"MN\r\n") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "connection closed");
            got.extend_from_slice(&buf[..n]);
        }
        got.truncate(got.len() - 4);
        got
    }

    fn signal(mut self, sig: i32) -> std::process::ExitStatus {
        // SAFETY: kill with a pid of our own child.
        unsafe { libc_kill(self.child.id() as i32, sig) };
        self.child.wait().unwrap()
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

fn stat(s: &Serve, name: &str) -> String {
    let out = String::from_utf8(s.call(b"stats\r\n")).unwrap();
    let prefix = format!("STAT {name} ");
    out.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("no {name} in stats")).to_string()
}

#[test]
fn sigterm_is_a_clean_stop_and_sigkill_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("sub/cache.db");
    let s = Serve::start(&data);
    assert!(data.exists(), "the data file (and its directory) is created");
    let mut req = Vec::new();
    for i in 0..500 {
        req.extend_from_slice(format!("set key-{i} {i} 0 7\r\nvalue-{}\r\n", i % 10).as_bytes());
    }
    assert_eq!(s.call(&req), b"STORED\r\n".repeat(500));
    let gets = s.call(b"gets key-7\r\n");
    let status = s.signal(SIGTERM);
    assert!(status.success(), "SIGTERM exits 0, got {status:?}");

    let s = Serve::start(&data);
    assert_eq!(s.call(b"gets key-7\r\n"), gets, "flags, value and CAS value survive");
    assert_eq!(stat(&s, "curr_items"), "500");
    s.call(b"flush_all\r\n");
    assert_eq!(s.call(b"get key-1\r\n"), b"END\r\n");
    for i in 0..100 {
        assert_eq!(s.call(format!("set new-{i} 0 0 1\r\nx\r\n").as_bytes()), b"STORED\r\n");
    }
    assert!(!s.signal(SIGKILL).success());

    // After a crash: everything acknowledged is there, the flush still holds.
    let s = Serve::start(&data);
    for i in 0..100 {
        assert_eq!(
            s.call(format!("get new-{i}\r\n").as_bytes()),
            format!("VALUE new-{i} 0 1\r\nx\r\nEND\r\n").as_bytes()
        );
    }
    assert_eq!(s.call(b"get key-1\r\n"), b"END\r\n");
    assert!(s.signal(SIGTERM).success());
}

#[test]
fn the_sync_io_backend_serves_too() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("sync.db");
    let s = Serve::start_with(&data, &["--io", "sync", "--no-evict"]);
    assert_eq!(s.call(b"set k 3 0 2\r\nhi\r\nget k\r\n"), b"STORED\r\nVALUE k 3 2\r\nhi\r\nEND\r\n");
    assert_eq!(stat(&s, "curr_items"), "1");
    assert!(s.signal(SIGTERM).success());
    let s = Serve::start(&data);
    assert_eq!(s.call(b"get k\r\n"), b"VALUE k 3 2\r\nhi\r\nEND\r\n");
    assert!(s.signal(SIGTERM).success());
}

#[test]
fn bench_memcache_drives_granary_serve_and_reports_json() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let json = dir.path().join("r.json");
    let out = Command::new(env!("CARGO_BIN_EXE_granary"))
        .args(["bench", "memcache", "--peers", "granary", "--keys", "2000", "--conns", "4", "--secs", "0.5"])
        .args(["--disk", "64M", "--no-memcaslap", "--value-bytes", "100", "--dist", "zipf", "--dir"])
        .arg(dir.path())
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let p = &v["peers"][0];
    assert_eq!(p["peer"], "granary");
    assert!(p["ops"].as_u64().unwrap() > 0);
    assert_eq!(p["hit_ratio"].as_f64().unwrap(), 1.0, "every key was loaded first");
    assert_eq!(p["errors"].as_u64().unwrap(), 0);
    assert!(String::from_utf8_lossy(&out.stdout).contains("granary"));
    // The data file is removed afterwards.
    assert!(!dir.path().join("bench-memcache-granary.db").exists());
}

fn granary(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_granary")).args(args).output().unwrap()
}

#[test]
fn cli_get_put_del_against_a_server_over_the_native_protocol() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let s = Serve::start(&dir.path().join("n.db"));
    let addr = format!("127.0.0.1:{}", s.native_port);
    let o = granary(&["put", "--server", &addr, "greeting", "hello"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = granary(&["get", "--server", &addr, "greeting"]);
    assert_eq!((o.status.code(), &o.stdout[..]), (Some(0), &b"hello"[..]));
    // The same store behind both listeners.
    assert_eq!(s.call(b"get greeting\r\n"), b"VALUE greeting 0 5\r\nhello\r\nEND\r\n");
    let o = granary(&["put", "--server", &addr, "--mode", "add", "greeting", "again"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(granary(&["del", "--server", &addr, "greeting"]).status.code(), Some(0));
    assert_eq!(granary(&["del", "--server", &addr, "greeting"]).status.code(), Some(1));
    let o = granary(&["get", "--server", &addr, "greeting"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("key not found"));
    // Usage errors and an unreachable server: exit 2 with a clear line.
    let o = granary(&["get", "--server", &addr, "a", "b"]);
    assert_eq!(o.status.code(), Some(2));
    let dead = format!("127.0.0.1:{}", free_port());
    let o = granary(&["get", "--server", &dead, "k"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot connect"), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(s.signal(SIGTERM).code(), Some(0));
}
