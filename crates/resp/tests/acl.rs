//! RESP users from an ACL file (`RespConfig::acl`, Redis's `aclfile`):
//! AUTH and HELLO ... AUTH as each user, `on`/`off`, `>password`, `#hash`,
//! `nopass`, the NOAUTH gate of a `default` user that is off, NOPERM for a
//! user without permissions, ACL WHOAMI; and the replies compared byte for
//! byte with a redis-server 7.0 started here with the same file. Without
//! redis-server the comparison is skipped, unless `GRANARY_REQUIRE_PEERS`
//! is set (scripts/test.sh), when it fails.

mod common;

use common::{Fixture, Redis, Value};
use granary_resp::acl::Acl;
use granary_resp::RespConfig;
use std::sync::Arc;

/// `bob`'s hash is SHA-256("test").
const USERS: &str = "\
user default off nopass ~* &* +@all
user alice on >wonderland ~* &* +@all

user bob on #9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 allkeys allcommands
user carol off >pw ~* +@all
user dave on nopass
user erin on >a >b <a ~* resetchannels +@all
";

const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
const NOAUTH: &str = "NOAUTH Authentication required.";

fn noperm(cmd: &str) -> Value {
    Value::err(&format!("NOPERM this user has no permissions to run the '{cmd}' command"))
}

fn with_acl(text: &str) -> Fixture {
    let acl = Arc::new(Acl::parse(text).unwrap());
    Fixture::new(RespConfig { threads: 2, acl: Some(acl), ..RespConfig::default() })
}

#[test]
fn users_authenticate_with_their_passwords() {
    let f = with_acl(USERS);
    let mut c = f.client();
    // `default` is off: every connection must authenticate.
    assert_eq!(c.cmd("PING"), Value::err(NOAUTH));
    assert!(matches!(c.cmd("AUTH x"), Value::Error(e) if e.starts_with("ERR AUTH <password> called without any")));
    for bad in ["AUTH default x", "AUTH alice wrong", "AUTH carol pw", "AUTH erin a", "AUTH nobody x"] {
        assert_eq!(c.cmd(bad), Value::err(WRONGPASS), "{bad}");
    }
    assert_eq!(c.cmd("ACL WHOAMI"), Value::err(NOAUTH));
    assert_eq!(c.cmd("AUTH alice wonderland"), Value::ok());
    assert_eq!(c.cmd("ACL WHOAMI"), Value::bulk("alice"));
    assert_eq!(c.cmd("SET k v"), Value::ok());
    assert_eq!(c.cmd("AUTH bob test"), Value::ok());
    assert_eq!(c.cmd("ACL whoami"), Value::bulk("bob"));
    assert_eq!(c.cmd("GET k"), Value::bulk("v"));
    assert_eq!(c.cmd("AUTH erin wrong"), Value::err(WRONGPASS));
    assert_eq!(c.cmd("ACL WHOAMI"), Value::bulk("bob"), "a refused AUTH keeps the user");
    assert_eq!(c.cmd("AUTH erin b"), Value::ok());
    assert_eq!(c.cmd("ACL WHOAMI"), Value::bulk("erin"));

    let mut h = f.client();
    let Value::Map(m) = h.cmd("HELLO 3 AUTH alice wonderland SETNAME app") else { panic!("a map") };
    assert!(m.contains(&(Value::bulk("proto"), Value::Int(3))));
    assert_eq!(h.cmd("ACL WHOAMI"), Value::bulk("alice"));
    assert_eq!(h.cmd("GET k"), Value::bulk("v"));
    // Only WHOAMI of ACL's subcommands is served.
    assert_eq!(h.cmd("ACL LIST"), Value::err("ERR unknown subcommand 'LIST'. Try ACL HELP."));
    assert_eq!(h.cmd("ACL SETUSER x on"), Value::err("ERR unknown subcommand 'SETUSER'. Try ACL HELP."));
    assert_eq!(h.cmd("ACL WHOAMI x"), Value::err("ERR wrong number of arguments for 'acl|whoami' command"));
}

#[test]
fn a_user_without_permissions_runs_nothing_but_auth_hello_and_quit() {
    let f = with_acl(USERS);
    let mut c = f.client();
    assert_eq!(c.cmd("AUTH dave anything"), Value::ok());
    assert_eq!(c.cmd("PING"), noperm("ping"));
    assert_eq!(c.cmd("GET k"), noperm("get"));
    assert_eq!(c.cmd("MULTI"), noperm("multi"));
    assert_eq!(c.cmd("ACL WHOAMI"), noperm("acl|whoami"));
    assert_eq!(c.cmd("CLIENT ID"), noperm("client|id"));
    assert_eq!(c.cmd("COMMAND"), noperm("command"));
    // Existence, arity and subcommands are checked first, as Redis does.
    assert!(matches!(c.cmd("NOSUCH"), Value::Error(e) if e.starts_with("ERR unknown command")));
    assert_eq!(c.cmd("GET"), Value::err("ERR wrong number of arguments for 'get' command"));
    assert_eq!(c.cmd("ACL FOO"), Value::err("ERR unknown subcommand 'FOO'. Try ACL HELP."));
    assert!(matches!(c.cmd("HELLO 3"), Value::Map(_)));
    assert_eq!(c.cmd("AUTH alice wonderland"), Value::ok());
    assert_eq!(c.cmd("PING"), Value::Simple("PONG".into()));
    assert!(matches!(c.cmd("HELLO 3 AUTH dave x"), Value::Map(_)));
    assert_eq!(c.cmd("PING"), noperm("ping"));
    assert_eq!(c.cmd("QUIT"), Value::ok());
}

#[test]
fn without_a_default_line_default_is_on_nopass_with_every_permission() {
    let f = with_acl("user alice on >pw ~* +@all\n");
    let mut c = f.client();
    assert_eq!(c.cmd("PING"), Value::Simple("PONG".into()));
    assert_eq!(c.cmd("ACL WHOAMI"), Value::bulk("default"));
    assert!(matches!(c.cmd("AUTH pw"), Value::Error(e) if e.starts_with("ERR AUTH <password> called without any")));
    assert_eq!(c.cmd("AUTH default anything"), Value::ok());
    assert_eq!(c.cmd("AUTH alice pw"), Value::ok());
    assert_eq!(c.cmd("ACL WHOAMI"), Value::bulk("alice"));
    // A default user with a password: `AUTH password` is that user.
    let f = with_acl("user default on >pw ~* +@all\n");
    let mut c = f.client();
    assert_eq!(c.cmd("PING"), Value::err(NOAUTH));
    assert_eq!(c.cmd("AUTH pw"), Value::ok());
    assert_eq!(c.cmd("ACL WHOAMI"), Value::bulk("default"));
}

#[test]
fn requirepass_and_an_acl_file_together_refuse_the_start() {
    let dev = Arc::new(granary_store::io::MemDevice::new(64 << 20));
    let c = granary_store::CreateOptions { segment_bytes: Some(2 << 20), ..Default::default() };
    let store = Arc::new(granary_store::Store::create(dev, &c, &Default::default()).unwrap());
    let cfg = RespConfig {
        listen: ([127, 0, 0, 1], granary_rt::net::free_low_port().unwrap()).into(),
        requirepass: Some(b"pw".to_vec()),
        acl: Some(Arc::new(Acl::parse(USERS).unwrap())),
        ..RespConfig::default()
    };
    let e = granary_resp::Server::start(store, cfg).err().expect("refused");
    assert!(e.to_string().contains("cannot both be set"), "{e}");
}

/// The same sequences on fresh connections to both servers, loaded with
/// the same ACL file: every reply (errors byte for byte) must be Redis's.
#[test]
fn replies_are_redis_7_0s_with_the_same_acl_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("users.acl");
    std::fs::write(&file, USERS).unwrap();
    let Some(redis) = Redis::start(&["--aclfile", file.to_str().unwrap()], "AUTH alice wonderland") else { return };
    let f = with_acl(USERS);
    let sequences: &[&[&str]] = &[
        &["PING", "AUTH x", "AUTH alice wrong", "AUTH carol pw", "AUTH default x", "AUTH nobody x", "ACL WHOAMI"],
        &["HELLO 3", "HELLO 2 SETNAME x", "HELLO 3 AUTH carol pw", "AUTH erin a", "AUTH erin b", "ACL WHOAMI"],
        &["AUTH alice wonderland", "ACL WHOAMI", "SET a 1", "GET a", "AUTH alice nope", "ACL WHOAMI", "DEL a"],
        &["AUTH bob test", "ACL whoami", "ACL WHOAMI x", "ACL", "ACL FOO", "acl Foo bar", "PING"],
        &["HELLO 3 AUTH bob test SETNAME n", "CLIENT GETNAME", "ACL WHOAMI"],
        &["AUTH dave x", "ACL WHOAMI", "PING", "GET a", "SET a 1", "MULTI", "CLIENT ID", "CLIENT GETNAME"],
        &["AUTH dave x", "CONFIG GET maxmemory", "COMMAND", "COMMAND COUNT", "INFO", "SELECT 1", "ECHO x"],
        &["AUTH dave x", "NOSUCH", "GET", "ACL FOO", "CLIENT FOO", "HELLO 3", "HELLO 2 AUTH dave y", "PING"],
        &["HELLO 2 AUTH dave y", "PING", "AUTH erin b", "PING", "ACL WHOAMI"],
        &["AUTH alice wonderland", "MULTI", "ACL WHOAMI", "EXEC", "MULTI", "ACL FOO", "EXEC"],
        // A refused EXEC discards the WATCH of a key since changed.
        &[
            "AUTH alice wonderland",
            "WATCH k",
            "SET k 1",
            "AUTH dave x",
            "EXEC",
            "AUTH alice wonderland",
            "MULTI",
            "EXEC",
        ],
        &["AUTH dave x", "EXEC", "EXEC x", "DEL k"],
        &["AUTH dave x", "QUIT"],
    ];
    common::same_replies(f.addr, redis.addr, sequences);
}

/// redis-cli authenticates as an ACL user with `--user` and `--pass`.
#[test]
fn redis_cli_authenticates_as_a_user() {
    let Some(cli) = common::peer("redis-cli") else { return };
    let f = with_acl(USERS);
    let run = |extra: &[&str], cmd: &[&str]| common::redis_cli(&cli, f.addr, extra, cmd);
    assert_eq!(run(&[], &["GET", "k"]), NOAUTH);
    assert_eq!(run(&["--user", "alice", "--pass", "wonderland"], &["SET", "k", "v"]), "OK");
    assert_eq!(run(&["--user", "bob", "--pass", "test"], &["ACL", "WHOAMI"]), "bob");
    assert!(run(&["--user", "carol", "--pass", "pw"], &["GET", "k"]).contains("WRONGPASS"));
    assert!(run(&["--user", "dave", "--pass", "x"], &["GET", "k"]).contains("NOPERM"));
}
