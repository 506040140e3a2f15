//! `granary serve` with authentication on every listener
//! (docs/SECURITY.md): `--requirepass` on the Redis protocol, `--auth-file`
//! (memcached's `-Y`) on Memcache, `--native-token` on the native
//! protocol; each refuses a client without the credential and serves one
//! with it. An unreadable or empty auth file refuses the start, before a
//! data file is created.

use granary_client::{Client, ClientConfig};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command};
use std::time::Duration;

mod common;

struct Serve {
    child: Child,
    mc: u16,
    native: u16,
    resp: u16,
}

impl Serve {
    fn start(dir: &std::path::Path, auth_file: &std::path::Path) -> Serve {
        let port = || granary_rt::net::free_low_port().unwrap();
        let (mc, native, resp) = (port(), port(), port());
        let data = dir.join("g.db");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_granary"));
        cmd.args(["serve", "--data", data.to_str().unwrap(), "--size", "64M", "-t", "2"])
            .args(["-p", &mc.to_string(), "--native-port", &native.to_string(), "--resp-port", &resp.to_string()])
            .args(["--requirepass", "rpass", "--native-token", "ntoken", "--auth-file"])
            .arg(auth_file);
        // The native listener's line comes last, once every one is up.
        let ready = |line: &str| line.contains("serving the native protocol");
        let child = common::start_or_panic(&mut cmd, ready, common::START_LIMIT).child;
        Serve { child, mc, native, resp }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        common::stop(&mut self.child);
    }
}

/// Send `req` on a fresh connection and read `n` bytes of reply.
fn ask(port: u16, req: &[u8], n: usize) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(req).unwrap();
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).unwrap();
    String::from_utf8_lossy(&b).into_owned()
}

#[test]
fn every_listener_requires_its_credential() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let users = dir.path().join("users");
    std::fs::write(&users, "app:apppass\n").unwrap();
    let s = Serve::start(dir.path(), &users);

    let unauth = "CLIENT_ERROR unauthenticated\r\n";
    assert_eq!(ask(s.mc, b"get k\r\n", unauth.len()), unauth);
    let stored = "STORED\r\nSTORED\r\nVALUE k 0 1\r\nv\r\nEND\r\n";
    assert_eq!(ask(s.mc, b"set a 0 0 11\r\napp apppass\r\nset k 0 0 1\r\nv\r\nget k\r\n", stored.len()), stored);

    let noauth = "-NOAUTH Authentication required.\r\n";
    assert_eq!(ask(s.resp, b"GET k\r\n", noauth.len()), noauth);
    // (The Redis protocol's database 0 is a namespace of its own.)
    assert_eq!(ask(s.resp, b"AUTH rpass\r\nGET k\r\n", 10), "+OK\r\n$-1\r\n");

    let addr = ("127.0.0.1", s.native);
    let e = Client::connect(addr, ClientConfig::default()).err().expect("refused without a token");
    assert!(e.to_string().contains("requires a token"), "{e}");
    let c = Client::connect(addr, ClientConfig::default().with_token("ntoken")).unwrap();
    c.put(b"n", b"w").unwrap();
    assert_eq!(c.get(b"n").unwrap().as_deref(), Some(&b"w"[..]));

    // The command line: --token-file (a trailing newline is not part of it).
    let server = format!("127.0.0.1:{}", s.native);
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_granary")).args(args).args(["--server", server.as_str()]).output().unwrap()
    };
    let o = cli(&["get", "n"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("requires a token"), "{o:?}");
    let token = dir.path().join("token");
    std::fs::write(&token, "ntoken\n").unwrap();
    let t = token.to_str().unwrap();
    let o = cli(&["put", "--token-file", t, "c", "from-the-cli"]);
    assert!(o.status.success(), "{o:?}");
    let o = cli(&["get", "--token-file", t, "c"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "from-the-cli", "{o:?}");
    std::fs::write(&token, "wrong").unwrap();
    let o = cli(&["get", "--token-file", t, "c"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("refused the token"), "{o:?}");
}

#[test]
fn a_bad_auth_file_refuses_the_start() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("g.db");
    for (content, why) in [(None, "cannot read"), (Some("\n"), "no user:password line"), (Some("x\n"), "line 1")] {
        let file = dir.path().join("users");
        let _ = std::fs::remove_file(&file);
        if let Some(c) = content {
            std::fs::write(&file, c).unwrap();
        }
        let o = Command::new(env!("CARGO_BIN_EXE_granary"))
            .args(["serve", "--data", data.to_str().unwrap(), "--size", "64M", "-t", "1"])
            .args(["-p", &granary_rt::net::free_low_port().unwrap().to_string(), "--no-native", "--no-resp"])
            .arg("-Y")
            .arg(&file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("auth file") && err.contains(why), "{content:?}: {err}");
        assert!(!data.exists(), "no data file is created");
    }
}

#[test]
fn an_acl_file_gives_the_redis_protocol_its_users() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let users = dir.path().join("users.acl");
    std::fs::write(&users, "user default off nopass ~* +@all\nuser app on >apppass ~* +@all\nuser guest on nopass\n")
        .unwrap();
    let resp = granary_rt::net::free_low_port().unwrap();
    let data = dir.path().join("g.db");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_granary"));
    cmd.args(["serve", "--data", data.to_str().unwrap(), "--size", "64M", "-t", "1", "--no-native"])
        .args(["-p", &granary_rt::net::free_low_port().unwrap().to_string(), "--resp-port", &resp.to_string()])
        .arg("--aclfile")
        .arg(&users);
    let ready = |line: &str| line.contains("serving the Redis protocol");
    let child = common::start_or_panic(&mut cmd, ready, common::START_LIMIT).child;
    let _s = Serve { child, mc: 0, native: 0, resp };

    let noauth = "-NOAUTH Authentication required.\r\n";
    assert_eq!(ask(resp, b"GET k\r\n", noauth.len()), noauth);
    let wrong = "-WRONGPASS invalid username-password pair or user is disabled.\r\n";
    assert_eq!(ask(resp, b"AUTH app nope\r\n", wrong.len()), wrong);
    assert_eq!(ask(resp, b"AUTH app apppass\r\nSET k v\r\nACL WHOAMI\r\n", 19), "+OK\r\n+OK\r\n$3\r\napp\r\n");
    let noperm = "+OK\r\n-NOPERM this user has no permissions to run the 'get' command\r\n";
    assert_eq!(ask(resp, b"AUTH guest x\r\nGET k\r\n", noperm.len()), noperm);
}

#[test]
fn a_bad_acl_file_refuses_the_start() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("g.db");
    let file = dir.path().join("users.acl");
    let cases: [(Option<&str>, &[&str], &[&str]); 4] = [
        (None, &[], &["aclfile", "cannot read"]),
        (Some("user a on >p ~* +@all\nuser b on >p ~app:* +@all\n"), &[], &["aclfile", "users.acl:2:", "'~app:*'"]),
        (Some("user a on >p ~* +@all -flushall\n"), &[], &["users.acl:1:", "'-flushall' is not supported"]),
        (Some("user a on >p ~* +@all\n"), &["--requirepass", "x"], &["cannot both be set"]),
    ];
    for (content, extra, why) in cases {
        let _ = std::fs::remove_file(&file);
        if let Some(c) = content {
            std::fs::write(&file, c).unwrap();
        }
        let o = Command::new(env!("CARGO_BIN_EXE_granary"))
            .args(["serve", "--data", data.to_str().unwrap(), "--size", "64M", "-t", "1", "--no-native"])
            .args(["-p", &granary_rt::net::free_low_port().unwrap().to_string()])
            .args(["--resp-port", &granary_rt::net::free_low_port().unwrap().to_string()])
            .arg("--aclfile")
            .arg(&file)
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && why.iter().all(|w| err.contains(w)), "{content:?}: {err}");
        assert!(!data.exists(), "no data file is created");
    }
}
