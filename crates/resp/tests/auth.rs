//! RESP authentication (`RespConfig::requirepass`, Redis's
//! `requirepass`): AUTH, HELLO ... AUTH, the NOAUTH gate, and the replies
//! compared byte for byte with a redis-server 7.0 started here with the
//! same password; redis-cli's `-a` and `--user`/`--pass` against Granary.
//! Without redis-server or redis-cli the comparisons are skipped, unless
//! `GRANARY_REQUIRE_PEERS` is set (scripts/test.sh), when they fail.

mod common;

use common::{peer, Fixture, Redis, Value};
use granary_resp::RespConfig;

const PASS: &str = "s3cret";
const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
const NOAUTH: &str = "NOAUTH Authentication required.";

fn with_password() -> Fixture {
    Fixture::new(RespConfig { threads: 2, requirepass: Some(PASS.into()), ..RespConfig::default() })
}

#[test]
fn before_auth_only_auth_hello_and_quit_run() {
    let f = with_password();
    let mut c = f.client();
    for cmd in ["PING", "GET a", "SET a 1", "CLIENT ID", "MULTI", "SELECT 1", "COMMAND COUNT", "INFO", "ECHO x"] {
        assert_eq!(c.cmd(cmd), Value::err(NOAUTH), "{cmd}");
    }
    // EXEC refused is the transaction discarded, saying why (Redis's
    // execCommandAbort).
    assert_eq!(c.cmd("EXEC"), Value::err(&format!("EXECABORT Transaction discarded because of: {NOAUTH}")));
    // Existence and arity are checked first, as Redis does.
    assert!(matches!(c.cmd("NOSUCH x"), Value::Error(e) if e.starts_with("ERR unknown command")));
    assert_eq!(c.cmd("GET"), Value::err("ERR wrong number of arguments for 'get' command"));
    assert_eq!(c.cmd("AUTH"), Value::err("ERR wrong number of arguments for 'auth' command"));
    assert_eq!(c.cmd("AUTH a b c"), Value::err("ERR syntax error"));
    assert_eq!(c.cmd("AUTH wrong"), Value::err(WRONGPASS));
    assert_eq!(c.cmd("AUTH someone s3cret"), Value::err(WRONGPASS));
    assert_eq!(c.cmd("PING"), Value::err(NOAUTH), "a refused AUTH leaves the connection unauthenticated");
    assert!(matches!(c.cmd("HELLO 3"), Value::Error(e) if e.starts_with("NOAUTH HELLO must be called")));
    assert_eq!(c.cmd("AUTH s3cret"), Value::ok());
    assert_eq!(c.cmd("PING"), Value::Simple("PONG".into()));
    assert_eq!(c.cmd("SET a 1"), Value::ok());
    assert_eq!(c.cmd("AUTH wrong"), Value::err(WRONGPASS));
    assert_eq!(c.cmd("GET a"), Value::bulk("1"), "a refused AUTH keeps an authenticated connection so");
    assert_eq!(c.cmd("MULTI"), Value::ok());
    assert!(matches!(c.cmd("AUTH s3cret"), Value::Error(e) if e.contains("inside MULTI is not supported")));
    assert!(matches!(c.cmd("EXEC"), Value::Error(e) if e.starts_with("EXECABORT")));
    let mut q = f.client();
    assert_eq!(q.cmd("QUIT"), Value::ok());
    assert_eq!(q.try_read(), None);
}

#[test]
fn auth_with_the_default_user_and_hello_auth() {
    let f = with_password();
    let mut c = f.client();
    assert_eq!(c.cmd("AUTH default s3cret"), Value::ok());
    assert_eq!(c.cmd("DBSIZE"), Value::Int(0));
    let mut h = f.client();
    assert_eq!(h.cmd("HELLO 3 AUTH default wrong"), Value::err(WRONGPASS));
    let Value::Map(m) = h.cmd("HELLO 3 AUTH default s3cret SETNAME app") else { panic!("a map") };
    assert!(m.contains(&(Value::bulk("proto"), Value::Int(3))));
    assert_eq!(h.cmd("CLIENT GETNAME"), Value::bulk("app"));
    let (Value::Bulk(info) | Value::Verbatim(_, info)) = h.cmd("INFO stats") else { panic!() };
    let info = String::from_utf8(info).unwrap();
    assert!(info.contains("granary_auth_failures:1\r\n"), "{info}");
    let stats = f.server.as_ref().unwrap().stats();
    assert_eq!(stats.auth_failures.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn without_a_password_auth_answers_as_redis_does() {
    let f = Fixture::default();
    let mut c = f.client();
    assert_eq!(c.cmd("PING"), Value::Simple("PONG".into()));
    assert!(
        matches!(c.cmd("AUTH x"), Value::Error(e) if e.starts_with("ERR AUTH <password> called without any password"))
    );
    assert_eq!(c.cmd("AUTH default anything"), Value::ok());
    assert_eq!(c.cmd("AUTH bob anything"), Value::err(WRONGPASS));
    let Value::Array(info) = c.cmd("COMMAND INFO auth") else { panic!() };
    let Value::Array(spec) = &info[0] else { panic!("{info:?}") };
    assert_eq!((&spec[0], &spec[1]), (&Value::bulk("auth"), &Value::Int(-2)));
    assert!(matches!(&spec[2], Value::Set(f) | Value::Array(f) if f.contains(&Value::Simple("no_auth".into()))));
}

/// The same sequences on fresh connections to both servers: every reply
/// (errors byte for byte) must be Redis's.
#[test]
fn replies_are_redis_7_0s_with_requirepass() {
    let Some(redis) = Redis::start(&["--requirepass", PASS], &format!("AUTH {PASS}")) else { return };
    let f = with_password();
    let sequences: &[&[&str]] = &[
        &["PING", "GET a", "SET a 1", "NOSUCH", "GET", "AUTH", "AUTH a b c", "AUTH wrong", "AUTH default wrong"],
        &["AUTH bob s3cret", "HELLO 3", "HELLO 2 SETNAME x", "HELLO 3 AUTH default wrong", "CLIENT ID", "MULTI"],
        &["AUTH s3cret", "PING", "SET a 1", "GET a", "AUTH wrong", "GET a", "DEL a"],
        &["AUTH default s3cret", "PING", "AUTH x y", "PING"],
        &["HELLO 2 AUTH default s3cret", "PING", "HELLO 3", "PING"],
        &["HELLO 3 AUTH default s3cret SETNAME n", "CLIENT GETNAME"],
        &["HELLO 4 AUTH default s3cret", "HELLO x", "HELLO 3 AUTH default", "PING"],
        &["ping", "auth S3CRET", "Auth s3cret", "ping"],
        &["EXEC", "EXEC x", "MULTI", "EXEC", "AUTH s3cret", "EXEC", "MULTI", "EXEC"],
        &["QUIT"],
    ];
    common::same_replies(f.addr, redis.addr, sequences);
}

/// Before it authenticates, a connection may send at most 10 arguments of
/// at most 16 KiB each (Redis 6.2.6 on): past either it gets Redis's
/// protocol error and is closed; at the bounds, and after AUTH, commands
/// are read as usual. The same bytes to a redis-server 7.0 (when there is
/// one) get the same replies and the same closes.
#[test]
fn an_unauthenticated_connection_is_held_to_small_commands() {
    use common::encode;
    use granary_resp::limits::{UNAUTH_BULK_MAX, UNAUTH_MULTIBULK_MAX};
    let f = with_password();
    let redis = Redis::start(&["--requirepass", PASS], &format!("AUTH {PASS}"));
    let many: Vec<&[u8]> =
        std::iter::once(&b"DEL"[..]).chain(std::iter::repeat_n(&b"k"[..], UNAUTH_MULTIBULK_MAX)).collect();
    let big = vec![b'x'; UNAUTH_BULK_MAX + 1];
    let fits = vec![b'x'; UNAUTH_BULK_MAX];
    // (bytes sent, the reply, whether the connection closes after it)
    let cases: Vec<(Vec<u8>, Value, bool)> = vec![
        (encode(&many), Value::err("ERR Protocol error: unauthenticated multibulk length"), true),
        (encode(&many[..UNAUTH_MULTIBULK_MAX]), Value::err(NOAUTH), false),
        (encode(&[b"ECHO", &big]), Value::err("ERR Protocol error: unauthenticated bulk length"), true),
        (encode(&[b"ECHO", &fits]), Value::err(NOAUTH), false),
    ];
    let mut addrs = vec![f.addr];
    addrs.extend(redis.as_ref().map(|r| r.addr));
    for addr in addrs {
        for (bytes, want, closes) in &cases {
            let mut c = common::Client::connect(addr);
            c.send_raw(bytes);
            assert_eq!(&c.read(), want, "{addr}");
            if *closes {
                assert_eq!(c.try_read(), None, "{addr}: closed after {want:?}");
            } else {
                assert_eq!(c.cmd("PING"), Value::err(NOAUTH), "{addr}");
            }
        }
        // Authenticated, the same commands are read.
        let mut c = common::Client::connect(addr);
        assert_eq!(c.cmd(&format!("AUTH {PASS}")), Value::ok());
        assert_eq!(c.call(&many), Value::Int(0), "{addr}");
        assert_eq!(c.call(&[b"ECHO", &big]), Value::Bulk(big.clone()), "{addr}");
    }
}

/// redis-cli authenticates with `-a` (AUTH password) and with `--user`
/// and `--pass` (AUTH user password); without, it gets NOAUTH.
#[test]
fn redis_cli_authenticates() {
    let Some(cli) = peer("redis-cli") else { return };
    let f = with_password();
    let run = |extra: &[&str], cmd: &[&str]| common::redis_cli(&cli, f.addr, extra, cmd);
    assert_eq!(run(&[], &["SET", "k", "v"]), NOAUTH);
    assert_eq!(run(&["-a", PASS], &["SET", "k", "v"]), "OK");
    assert_eq!(run(&["--user", "default", "--pass", PASS], &["GET", "k"]), "v");
    assert!(run(&["-a", "wrong"], &["GET", "k"]).contains("WRONGPASS"));
    assert!(run(&["-3", "-a", PASS], &["HELLO"]).contains("proto"));
}
