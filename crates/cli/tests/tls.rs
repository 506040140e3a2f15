//! `granary serve` with TLS (`--tls-cert`, `--tls-key`, `--tls-ca`;
//! docs/SECURITY.md), against real clients over loopback: `openssl
//! s_client` speaking memcache text, `redis-cli --tls`, pymemcache with an
//! SSL context, and granary-client over the native protocol. With
//! `--tls-ca` a client without a certificate is refused and one with a
//! certificate the CA signed is served; a plain client on a TLS port is
//! closed and the server keeps serving; the connection limit still refuses
//! with the protocol's answer; bad certificate or key files refuse the
//! start before a data file is made. The native client's TLS stream keeps
//! timing requests out while a reply trickles in (a fake server).
//!
//! Certificates are made per test with the openssl command (a CA, a server
//! certificate for 127.0.0.1, a client certificate). scripts/test.sh
//! installs openssl, redis-tools and python3-pymemcache; without them these
//! tests are skipped unless GRANARY_REQUIRE_PEERS is set.

use granary_client::{Client, ClientConfig, Request, Tls};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

/// How long a client tool may run.
const TOOL_LIMIT: Duration = Duration::from_secs(30);

/// Run `cmd` with `input` on its stdin; killed after [`TOOL_LIMIT`].
fn run(cmd: &mut Command, input: &[u8]) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    drop(stdin);
    let deadline = Instant::now() + TOOL_LIMIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("{what}: still running after {TOOL_LIMIT:?}: {}", String::from_utf8_lossy(&o.stdout));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// The files of a test's certificates.
struct Certs {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl").current_dir(dir).args(args).output().unwrap();
    assert!(o.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// A CA, and a server (127.0.0.1, localhost) and a client certificate it
/// signed, made in `dir` (P-256 keys, PKCS#8 PEM).
fn make_certs(dir: &Path) -> Certs {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let ca_ext = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"];
    let mut args = vec!["req", "-x509"];
    args.extend(ec);
    args.extend(["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=granary-test-ca"]);
    args.extend(ca_ext);
    openssl(dir, &args);
    for (name, cn, ext) in [
        ("server", "/CN=localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", "/CN=granary-test-client", "extendedKeyUsage=clientAuth\n"),
    ] {
        let (key, csr, pem, extfile) =
            (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
        std::fs::write(dir.join(&extfile), format!("basicConstraints=CA:FALSE\n{ext}")).unwrap();
        let mut args = vec!["req"];
        args.extend(ec);
        args.extend(["-keyout", &key, "-out", &csr, "-subj", cn]);
        openssl(dir, &args);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "2",
                "-extfile",
                &extfile,
            ],
        );
    }
    Certs {
        ca: dir.join("ca.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server.key"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client.key"),
    }
}

/// A `granary serve` with TLS on its memcache, RESP and native listeners;
/// stopped (by its PID) when dropped.
struct Serve {
    child: Child,
    mc: u16,
    native: u16,
    resp: u16,
    metrics: u16,
}

impl Serve {
    fn start(dir: &Path, certs: &Certs, extra: &[&str]) -> Serve {
        let port = || granary_rt::net::free_low_port().unwrap();
        let (mc, native, resp, metrics) = (port(), port(), port(), port());
        let data = dir.join("g.db");
        let mut cmd = common::granary(&["serve", "--data", data.to_str().unwrap(), "--size", "64M", "-t", "2"]);
        cmd.args(["-p", &mc.to_string(), "--native-port", &native.to_string(), "--resp-port", &resp.to_string()])
            .args(["--metrics", &format!("127.0.0.1:{metrics}")])
            .arg("--tls-cert")
            .arg(&certs.server_cert)
            .arg("--tls-key")
            .arg(&certs.server_key)
            .args(extra);
        // The native listener's line comes last, once every one is up.
        let ready = |line: &str| line.contains("serving the native protocol");
        let child = common::start_or_panic(&mut cmd, ready, common::START_LIMIT).child;
        Serve { child, mc, native, resp, metrics }
    }

    /// A counter of /metrics (plain HTTP).
    fn metric(&self, name: &str) -> u64 {
        let mut s = TcpStream::connect(("127.0.0.1", self.metrics)).unwrap();
        s.set_read_timeout(Some(TOOL_LIMIT)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        let line = body.lines().find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '));
        line.unwrap_or_else(|| panic!("no {name} in\n{body}")).rsplit(' ').next().unwrap().parse().unwrap()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        common::stop(&mut self.child);
    }
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// `openssl s_client` to `port`, sending `input` (memcache text ending in
/// `quit`, so the server closes and s_client exits); its stdout.
fn s_client(port: u16, certs: &Certs, identity: bool, input: &[u8]) -> String {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-quiet", "-verify_return_error", "-connect", &format!("127.0.0.1:{port}")])
        .arg("-CAfile")
        .arg(&certs.ca);
    if identity {
        cmd.arg("-cert").arg(&certs.client_cert).arg("-key").arg(&certs.client_key);
    }
    String::from_utf8_lossy(&run(&mut cmd, input).stdout).into_owned()
}

fn redis_cli(port: u16, certs: &Certs, identity: bool, args: &[&str]) -> Output {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["--tls", "-h", "127.0.0.1", "-p", &port.to_string(), "--cacert"]).arg(&certs.ca);
    if identity {
        cmd.arg("--cert").arg(&certs.client_cert).arg("--key").arg(&certs.client_key);
    }
    run(cmd.args(args), b"")
}

fn tls_client(certs: &Certs, identity: bool) -> ClientConfig {
    let id = identity.then_some((certs.client_cert.as_path(), certs.client_key.as_path()));
    ClientConfig { timeout: TOOL_LIMIT, ..ClientConfig::default() }.with_tls(Tls::from_pem(&certs.ca, id).unwrap())
}

#[test]
fn every_tls_listener_serves_real_clients() {
    if !common::have_peers(&["openssl", "redis-cli"], &[("pymemcache", "python3-pymemcache")]) {
        return;
    }
    let dir = tempdir();
    let certs = make_certs(dir.path());
    let s = Serve::start(dir.path(), &certs, &[]);

    let out = s_client(s.mc, &certs, false, b"set foo 0 0 3\r\nbar\r\nget foo\r\nquit\r\n");
    assert!(out.contains("STORED\r\nVALUE foo 0 3\r\nbar\r\nEND\r\n"), "s_client: {out:?}");

    let set = redis_cli(s.resp, &certs, false, &["SET", "rk", "rv"]);
    assert_eq!(String::from_utf8_lossy(&set.stdout).trim(), "OK", "{set:?}");
    let get = redis_cli(s.resp, &certs, false, &["GET", "rk"]);
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "rv", "{get:?}");

    let script = format!(
        "import ssl\nfrom pymemcache.client.base import Client\n\
         ctx = ssl.create_default_context(cafile={:?})\n\
         c = Client(('127.0.0.1', {}), tls_context=ctx, timeout=20)\n\
         c.set('pk', 'pv' * 40000)\nv = c.get('pk')\nassert v == b'pv' * 40000, len(v)\nprint(c.get('foo').decode())\n",
        certs.ca.to_str().unwrap(),
        s.mc
    );
    let py = run(Command::new("/usr/bin/python3").args(["-c", &script]), b"");
    assert!(py.status.success(), "pymemcache: {}", String::from_utf8_lossy(&py.stderr));
    assert_eq!(String::from_utf8_lossy(&py.stdout).trim(), "bar");

    let c = Client::connect(("127.0.0.1", s.native), tls_client(&certs, false)).unwrap();
    // A value larger than a TLS record and than a send's piece.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    c.put(b"nk", &big).unwrap();
    assert_eq!(c.get(b"nk").unwrap().as_deref(), Some(&big[..]));
    assert_eq!(s.metric("granary_memcache_tls_handshake_errors_total"), 0);

    // The command line over TLS (--tls-ca), and refused without it.
    let server = format!("127.0.0.1:{}", s.native);
    let cli = |args: &[&str]| {
        run(Command::new(env!("CARGO_BIN_EXE_granary")).args(args).args(["--server", server.as_str()]), b"")
    };
    let ca = certs.ca.to_str().unwrap();
    let put = cli(&["put", "--tls-ca", ca, "ck", "over-tls"]);
    assert!(put.status.success(), "{put:?}");
    let get = cli(&["get", "--tls-ca", ca, "ck"]);
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "over-tls", "{get:?}");
    let plain = cli(&["get", "ck"]);
    assert!(!plain.status.success(), "a plain client on the TLS port: {plain:?}");
}

#[test]
fn with_a_ca_only_clients_with_a_certificate_it_signed_are_served() {
    if !common::have_peers(&["openssl", "redis-cli"], &[]) {
        return;
    }
    let dir = tempdir();
    let certs = make_certs(dir.path());
    let ca = certs.ca.to_str().unwrap().to_string();
    let s = Serve::start(dir.path(), &certs, &["--tls-ca", &ca]);

    let refused = Client::connect(("127.0.0.1", s.native), tls_client(&certs, false));
    assert!(refused.is_err(), "a client without a certificate is refused");
    let c = Client::connect(("127.0.0.1", s.native), tls_client(&certs, true)).unwrap();
    c.put(b"k", b"v").unwrap();
    assert_eq!(c.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));

    let no_cert = redis_cli(s.resp, &certs, false, &["PING"]);
    assert!(!String::from_utf8_lossy(&no_cert.stdout).contains("PONG"), "{no_cert:?}");
    let with_cert = redis_cli(s.resp, &certs, true, &["PING"]);
    assert_eq!(String::from_utf8_lossy(&with_cert.stdout).trim(), "PONG", "{with_cert:?}");

    let out = s_client(s.mc, &certs, true, b"version\r\nquit\r\n");
    assert!(out.starts_with("VERSION "), "s_client with a certificate: {out:?}");
    assert!(s.metric("granary_native_tls_handshake_errors_total") >= 1);
}

/// The native client's TLS stream:
/// - pipelined responses of mixed sizes, some larger than a TLS record (a
///   full 16 KiB record then short ones), arrive several records to a
///   socket read; the client hands rustls its ciphertext as its plaintext
///   is read (rustls refuses more once 16 KiB of plaintext wait: the
///   connection was lost with "received plaintext buffer full"), so every
///   response comes back;
/// - the client's reader wakes every tick (its socket's read timeout) to
///   time requests out; a wake with nothing read leaves the stream as it
///   was (a fix of the above handed rustls a buffer of zeros as
///   ciphertext, and the connection was lost after its first idle tick).
#[test]
fn tls_client_streams_survive_pipelined_records_and_idle_ticks() {
    if !common::have_peers(&["openssl"], &[]) {
        return;
    }
    let dir = tempdir();
    let certs = make_certs(dir.path());
    let s = Serve::start(dir.path(), &certs, &[]);
    let c = Client::connect(("127.0.0.1", s.native), tls_client(&certs, false)).unwrap();
    let sizes = [20 * 1024, 100, 16 * 1024 - 30, 3000, 40 * 1024, 7];
    for (k, &n) in sizes.iter().enumerate() {
        let value: Vec<u8> = (0..n as u32).map(|i| (i % 253) as u8).collect();
        c.put(format!("v{k}").as_bytes(), &value).unwrap();
    }
    let conn = c.conn().unwrap();
    for round in 0..8 {
        let keys: Vec<String> = (0..60).map(|i| format!("v{}", (i * 7 + round) % sizes.len())).collect();
        let sent: Vec<_> = keys.iter().map(|k| conn.send(&Request::Get(k.as_bytes())).unwrap()).collect();
        for (i, p) in sent.into_iter().enumerate() {
            let r = p.wait().unwrap_or_else(|e| panic!("round {round}, get {i}: {e}"));
            assert_eq!(r.body.len(), sizes[(i * 7 + round) % sizes.len()], "round {round}, get {i}");
        }
    }
    // Idle for several of the reader's ticks (no response is awaited
    // meanwhile: this waits for idleness, not for an event).
    std::thread::sleep(granary_client::TICK * 10);
    assert!(conn.is_alive(), "the connection died while idle");
    assert_eq!(c.get(b"v1").unwrap().map(|v| v.len()), Some(100));
}

/// Plaintext from `conn` until `want` bytes came (the handshake's and
/// requests' bytes of the fake server below); None if the client went.
fn read_plain(conn: &mut rustls::ServerConnection, tcp: &mut TcpStream, want: usize) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    while got.len() < want {
        let mut b = vec![0u8; want - got.len()];
        match conn.reader().read(&mut b) {
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if conn.read_tls(tcp).ok()? == 0 {
                    return None;
                }
                conn.process_new_packets().ok()?;
            }
            Err(_) => return None,
        }
    }
    Some(got)
}

/// A native-protocol server over TLS that answers the client's first
/// request with a reply whose ciphertext it sends a byte at a time, 4 ms
/// apart (about 4 s for the whole record): the client's reader, which
/// fails requests past their deadline between its reads, must not stay
/// inside the TLS stream's read while the bytes trickle in. The request's
/// 1 s timeout then fails it; before, it waited for the whole record and
/// succeeded.
#[test]
fn a_reply_trickling_in_over_tls_still_times_the_request_out() {
    if !common::have_peers(&["openssl"], &[]) {
        return;
    }
    use granary_proto as proto;
    let dir = tempdir();
    let certs = make_certs(dir.path());
    let config = granary_server::tls::server_config(&certs.server_cert, &certs.server_key, None).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // The fake server: it stops at the first sign of the client going
    // (a read or a write failing), so the test never waits on it long.
    let server = std::thread::spawn(move || -> Option<()> {
        let (mut tcp, _) = listener.accept().ok()?;
        let mut conn = rustls::ServerConnection::new(config).ok()?;
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp).ok()?;
        }
        read_plain(&mut conn, &mut tcp, proto::CLIENT_HELLO_BYTES)?;
        let hello = proto::ServerHello {
            version: proto::VERSION,
            status: proto::Status::Ok,
            key_bytes_max: 1024,
            value_bytes_max: 1 << 20,
            frame_bytes_max: proto::FRAME_BYTES_FLOOR,
        };
        conn.writer().write_all(&hello.encode()).ok()?;
        while conn.wants_write() {
            conn.write_tls(&mut tcp).ok()?;
        }
        let head = read_plain(&mut conn, &mut tcp, proto::HEADER_BYTES)?;
        let h = proto::Header::decode(&head, proto::FRAME_BYTES_FLOOR, proto::VERSION).ok()?;
        read_plain(&mut conn, &mut tcp, h.len as usize)?;
        let mut reply = Vec::new();
        proto::encode_response(&mut reply, h.op, proto::Status::Ok, h.id, &[7u8; 1000]);
        conn.writer().write_all(&reply).ok()?;
        let mut ciphertext = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut ciphertext).ok()?;
        }
        for b in ciphertext {
            tcp.write_all(&[b]).ok()?;
            std::thread::sleep(Duration::from_millis(4));
        }
        Some(())
    });
    let cfg = ClientConfig { timeout: Duration::from_secs(1), ..ClientConfig::default() }
        .with_tls(Tls::from_pem(&certs.ca, None).unwrap());
    let c = Client::connect(addr, cfg).unwrap();
    match c.get(b"k") {
        Err(granary_client::Error::Timeout) => {}
        other => panic!("the request outlived its timeout: {:?}", other.map(|v| v.map(|v| v.len()))),
    }
    drop(c);
    let _ = server.join();
}

#[test]
fn a_plain_client_on_a_tls_port_is_closed_and_the_server_keeps_serving() {
    if !common::have_peers(&["openssl"], &[]) {
        return;
    }
    let dir = tempdir();
    let certs = make_certs(dir.path());
    let s = Serve::start(dir.path(), &certs, &[]);
    for port in [s.mc, s.resp, s.native] {
        let mut plain = TcpStream::connect(("127.0.0.1", port)).unwrap();
        plain.set_read_timeout(Some(TOOL_LIMIT)).unwrap();
        plain.write_all(b"get foo\r\n").unwrap();
        // At most an alert record, then the end (or a reset).
        let mut got = Vec::new();
        let end = plain.read_to_end(&mut got);
        assert!(
            end.is_ok() || end.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "{port}: {end:?}"
        );
        assert!(got.len() < 64 && !got.starts_with(b"END") && !got.starts_with(b"-"), "{port}: {got:?}");
    }
    assert_eq!(s.metric("granary_memcache_tls_handshake_errors_total"), 1);
    assert_eq!(s.metric("granary_resp_tls_handshake_errors_total"), 1);
    let out = s_client(s.mc, &certs, false, b"set after 0 0 2\r\nok\r\nget after\r\nquit\r\n");
    assert!(out.contains("VALUE after 0 2\r\nok\r\n"), "{out:?}");
    let c = Client::connect(("127.0.0.1", s.native), tls_client(&certs, false)).unwrap();
    // Memcache and the native protocol share the default namespace.
    assert_eq!(c.get(b"after").unwrap().as_deref(), Some(&b"ok"[..]));
}

/// A native TLS client connects to `s` and writes, once the server has
/// seen a served connection close (each refusal until then says the
/// connection limit); fails after [`TOOL_LIMIT`].
fn served_once_the_limit_frees(s: &Serve, certs: &Certs) {
    let deadline = Instant::now() + TOOL_LIMIT;
    loop {
        match Client::connect(("127.0.0.1", s.native), tls_client(certs, false)) {
            Ok(c) => {
                c.put(b"k", b"v").unwrap();
                return;
            }
            Err(e) if Instant::now() < deadline => assert!(e.to_string().contains("connection limit"), "{e}"),
            Err(e) => panic!("still refused after {TOOL_LIMIT:?}: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The connection limit refuses over TLS, with the protocol's words; a
/// connection being refused (over the limit, its TLS handshake not yet
/// made: it may take 10 s) does not count against the limit: once the
/// served connection closes, the next is served while the refusal still
/// waits (it held a slot, so every connection was refused until it ended).
#[test]
fn the_connection_limit_refuses_over_tls_and_refusals_hold_no_place() {
    if !common::have_peers(&["openssl"], &[]) {
        return;
    }
    let dir = tempdir();
    let certs = make_certs(dir.path());
    let s = Serve::start(dir.path(), &certs, &["--conn-limit", "1"]);
    let held = Client::connect(("127.0.0.1", s.native), tls_client(&certs, false)).unwrap();
    // Over the limit, and silent: its refusal waits for its handshake.
    let stalled = TcpStream::connect(("127.0.0.1", s.native)).unwrap();
    let e = Client::connect(("127.0.0.1", s.native), tls_client(&certs, false)).err().expect("over the limit");
    assert!(e.to_string().contains("connection limit"), "{e}");
    drop(held);
    served_once_the_limit_frees(&s, &certs);
    // Served while the refusal still waited: its socket is still open.
    stalled.set_nonblocking(true).unwrap();
    let open = matches!((&stalled).read(&mut [0u8; 16]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    assert!(open, "the stalled connection's refusal had ended: it held the only place until then");
}

#[test]
fn bad_tls_files_refuse_the_start() {
    if !common::have_peers(&["openssl"], &[]) {
        return;
    }
    let dir = tempdir();
    let certs = make_certs(dir.path());
    let data = dir.path().join("g.db");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a PEM file\n").unwrap();
    let missing = dir.path().join("missing.pem");
    let p = |p: &Path| p.to_str().unwrap().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--tls-cert".into(), p(&missing), "--tls-key".into(), p(&certs.server_key)], "cannot read"),
        (vec!["--tls-cert".into(), p(&garbage), "--tls-key".into(), p(&certs.server_key)], "no certificate"),
        (vec!["--tls-cert".into(), p(&certs.server_cert), "--tls-key".into(), p(&garbage)], "no private key"),
        // The client's key is not the server certificate's.
        (vec!["--tls-cert".into(), p(&certs.server_cert), "--tls-key".into(), p(&certs.client_key)], "key"),
        (vec!["--tls-cert".into(), p(&certs.server_cert)], "tls_cert needs tls_key"),
        (vec!["--tls-ca".into(), p(&certs.ca)], "tls_ca needs"),
        (
            vec![
                "--tls-cert".into(),
                p(&certs.server_cert),
                "--tls-key".into(),
                p(&certs.server_key),
                "--tls-ca".into(),
                p(&garbage),
            ],
            "CA bundle",
        ),
    ];
    for (args, why) in cases {
        let o = Command::new(env!("CARGO_BIN_EXE_granary"))
            .args(["serve", "--data", data.to_str().unwrap(), "--size", "64M", "-t", "1"])
            .args(["-p", &granary_rt::net::free_low_port().unwrap().to_string(), "--no-native", "--no-resp"])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(why), "{args:?}: {err}");
        assert!(!data.exists(), "{args:?}: no data file is created");
    }
}

#[test]
fn the_tls_settings_come_from_the_config_file_too() {
    if !common::have_peers(&["openssl"], &[]) {
        return;
    }
    let dir = tempdir();
    let certs = make_certs(dir.path());
    let file = dir.path().join("granary.toml");
    std::fs::write(
        &file,
        format!("tls_cert = {:?}\ntls_key = {:?}\ntls_ca = {:?}\n", certs.server_cert, certs.server_key, certs.ca),
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_granary"))
        .args(["serve", "--print-config", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let toml = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (key, path) in [("tls_cert", &certs.server_cert), ("tls_key", &certs.server_key), ("tls_ca", &certs.ca)] {
        assert!(toml.contains(&format!("{key} = {:?}", path.to_str().unwrap())), "{key}: {toml}");
    }
}
