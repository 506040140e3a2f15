//! Text-protocol authentication as memcached 1.6 does it with `-Y`
//! (`ServerConfig::auth`): before a connection's authentication `set`
//! every command is answered `CLIENT_ERROR unauthenticated`; the `set`'s
//! data `<user> <pass>` is checked against the auth file. Compared byte
//! for byte with a memcached 1.6 started here with the same file
//! (skipped without memcached, unless `GRANARY_REQUIRE_PEERS` is set).

mod common;

use common::{Client, Fixture};
use granary_memcache::ServerConfig;
use granary_server::auth::UserFile;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

const AUTH_FILE: &str = "alice:pw1\nbob:pw2\n";
const UNAUTH: &[u8] = b"CLIENT_ERROR unauthenticated\r\n";

fn with_auth() -> Fixture {
    let users = Arc::new(UserFile::parse(AUTH_FILE.as_bytes()).unwrap());
    Fixture::new(64 << 20, true, ServerConfig { threads: 2, auth: Some(users), ..ServerConfig::default() })
}

/// Send `req`, then read exactly `want.len()` bytes and compare.
fn expect(c: &mut Client, req: &[u8], want: &[u8]) {
    c.send(req);
    let mut got = vec![0u8; want.len()];
    c.s.read_exact(&mut got).unwrap_or_else(|e| panic!("{:?}: {e}", String::from_utf8_lossy(req)));
    assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(want), "{:?}", String::from_utf8_lossy(req));
}

#[test]
fn every_command_before_authentication_is_refused() {
    let f = with_auth();
    let mut c = f.client();
    for req in [
        &b"get a\r\n"[..],
        b"version\r\n",
        b"stats\r\n",
        b"mg a v\r\n",
        b"mn\r\n",
        b"quit\r\n",
        b"add x 0 0 9\r\n",
        b"set x 0 0\r\n",
        b"set x 0 0 notanumber\r\n",
        b"garbage\r\n",
        b"\r\n",
    ] {
        expect(&mut c, req, UNAUTH);
    }
    // The binary protocol's magic: not served with an auth file. Its
    // header holds a '\n' (opcode 0x0a): two lines, two refusals.
    let binary = b"\x80\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\n";
    expect(&mut c, binary, &[UNAUTH, UNAUTH].concat());
    // Pipelined, each is answered (memcached 1.6.18 answers only the
    // last of those it read at once: docs/SECURITY.md).
    expect(&mut c, b"get a\r\nversion\r\nquit\r\n", &[UNAUTH, UNAUTH, UNAUTH].concat());
    // The connection is still open, and authenticates.
    expect(&mut c, b"set x 0 0 9\r\nalice pw1\r\n", b"STORED\r\n");
    let v = c.call(b"version\r\n");
    assert!(v.starts_with(b"VERSION "), "{}", String::from_utf8_lossy(&v));
    // Nothing was stored by the authentication.
    assert_eq!(c.call(b"get x\r\n"), b"END\r\n");
}

#[test]
fn wrong_and_malformed_credentials_are_refused() {
    let f = with_auth();
    let mut c = f.client();
    expect(&mut c, b"set x 0 0 7\r\nalice x\r\n", b"CLIENT_ERROR authentication failure\r\n");
    expect(&mut c, b"set x 0 0 9\r\nbob pw1\r\n\r\n", b"CLIENT_ERROR authentication failure\r\n");
    expect(&mut c, b"set x 0 0 8\r\ncarol pw\r\n", b"CLIENT_ERROR authentication failure\r\n");
    expect(&mut c, b"set x 0 0 3\r\nabc\r\n", b"CLIENT_ERROR bad authentication token format\r\n");
    expect(&mut c, b"set x 0 0 4\r\nbob \r\n", b"CLIENT_ERROR bad authentication token format\r\n");
    expect(&mut c, b"set x 0 0 9\r\nalice:pw1\r\n", b"CLIENT_ERROR bad authentication token format\r\n");
    expect(&mut c, b"get a\r\n", UNAUTH);
    // Split anywhere, extra words ignored, repeated spaces skipped, and
    // a `noreply` still answered (as memcached).
    for part in [&b"set k 0 0 "[..], b"10", b"\r\nbob  pw2", b" x\r", b"\n"] {
        c.send(part);
        std::thread::yield_now();
    }
    expect(&mut c, b"", b"STORED\r\n");
    assert_eq!(c.call(b"set a 0 0 1\r\n1\r\nget a\r\n"), b"STORED\r\nVALUE a 0 1\r\n1\r\nEND\r\n");
    let stats = f.server.as_ref().unwrap().stats();
    assert_eq!((stats.auth_cmds.load(Relaxed), stats.auth_errors.load(Relaxed)), (4, 3));
    let s = String::from_utf8(c.call(b"stats\r\n")).unwrap();
    assert!(s.contains("STAT auth_cmds 4\r\n") && s.contains("STAT auth_errors 3\r\n"), "{s}");
    let mut n = f.client();
    expect(&mut n, b"set x 0 0 9 noreply\r\nalice pw1\r\n", b"STORED\r\n");
}

#[test]
fn an_oversized_token_or_endless_line_closes_the_connection() {
    let f = with_auth();
    let mut c = f.client();
    c.send(b"set x 0 0 2000000\r\n");
    assert_eq!(c.read_to_close(), b"CLIENT_ERROR bad authentication token format\r\n");
    let mut c = f.client();
    c.send(&vec![b'a'; 3000]);
    assert_eq!(c.read_to_close(), b"");
    // The server still serves.
    let mut c = f.client();
    expect(&mut c, b"set x 0 0 9\r\nalice pw1\r\n", b"STORED\r\n");
}

#[test]
fn without_an_auth_file_no_authentication_is_asked() {
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(c.call(b"set x 0 0 9\r\nalice pw1\r\nget x\r\n"), b"STORED\r\nVALUE x 0 9\r\nalice pw1\r\nEND\r\n");
}

/// A memcached child with `-Y` on a free low port; killed on drop.
struct Memcached {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Memcached {
    fn start() -> Option<Memcached> {
        let bin = std::env::var_os("PATH")?
            .to_str()?
            .split(':')
            .map(|d| std::path::Path::new(d).join("memcached"))
            .find(|p| p.is_file());
        let Some(bin) = bin else {
            assert!(std::env::var_os("GRANARY_REQUIRE_PEERS").is_none(), "memcached is required");
            eprintln!("skipped: memcached is not installed");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("auth");
        std::fs::write(&file, AUTH_FILE).unwrap();
        for _ in 0..5 {
            let port = granary_rt::net::free_low_port().unwrap();
            let mut child = Command::new(&bin)
                .args(["-u", "root", "-l", "127.0.0.1", "-U", "0", "-p", &port.to_string(), "-Y"])
                .arg(&file)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                if TcpStream::connect(addr).is_ok() {
                    return Some(Memcached { child, addr, _dir: dir });
                }
                assert!(Instant::now() < deadline, "memcached did not start on {addr}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("memcached did not start on any of 5 free ports");
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Everything `addr` answers to `req`, sent at once, until it closes
/// after the client's end of input.
fn exchange(addr: SocketAddr, req: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(req).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    // The version string is each server's own.
    let text = String::from_utf8_lossy(&got).into_owned();
    text.lines()
        .map(|l| if l.starts_with("VERSION ") { "VERSION *" } else { l })
        .collect::<Vec<_>>()
        .join("\n")
        .into_bytes()
}

#[test]
fn replies_are_memcached_1_6s() {
    let Some(mc) = Memcached::start() else { return };
    let f = with_auth();
    // Before authentication each case holds one request: memcached
    // 1.6.18 answers only the last refusal of those it read at once (its
    // replies overwrite each other), where Granary answers each.
    let cases: &[&[u8]] = &[
        b"get a\r\n",
        b"version\r\n",
        b"stats\r\n",
        b"mg a v\r\n",
        b"quit\r\n",
        b"add x 0 0 9\r\n",
        b"set x 0 0\r\n",
        b"set x 0 0 7\r\nalice x\r\n",
        b"set x 0 0 3\r\nabc\r\n",
        b"set x 0 0 4\r\nbob \r\n",
        b"set x 0 0 9\r\nalice:pw1\r\n",
        b"set x 0 0 9\r\nalice pw1\r\nversion\r\nset k 0 0 1\r\nv\r\nget k\r\ndelete k\r\n",
        b"set x 0 0 9 noreply\r\nalice pw1\r\nversion\r\n",
        b"set x 0 0 10\r\nalice  pw1\r\nversion\r\n",
        b"set x 0 0 15\r\nalice pw1 extra\r\nversion\r\n",
        b"set x 0 0 7\r\nbob pw2\r\nset x 0 0 9\r\nalice pw1\r\nset x 0 0 7\r\nbob bad\r\nget x\r\n",
        b"set x 0 0 7\r\nbob pw2\r\nquit\r\nversion\r\n",
        b"\x80\x0a",
    ];
    for req in cases {
        let want = exchange(mc.addr, req);
        let got = exchange(f.addr, req);
        assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(&want), "{:?}", String::from_utf8_lossy(req));
    }
}
