//! Running one command: the table of commands (what COMMAND reports: name,
//! arity, flags, key positions), argument checks with Redis's error
//! replies word for word, and each command's work over a [`Keys`] view, so
//! one implementation serves a lone command and a command inside EXEC.
//!
//! Invariants: every command writes exactly one reply (an array counts as
//! one); a command that fails writes only its error reply and changes
//! nothing; a command's writes are atomic (one key under its lock, several
//! keys as one batch).

use crate::acl::Acl;
use crate::glob;
use crate::keys::{Commit, Direct, Keys, Overlay, Txn, Write};
use crate::limits::*;
use crate::parse::parse_i64;
use crate::reply::Reply;
use crate::value::{now_ms, Hash, Kind, Rec, EXPIRE_MS_MAX};
use crate::{RespConfig, RespStats};
use granary_store::{Error, Namespace, NamespaceOptions, Store, BATCH_OPS_MAX};
use std::borrow::Cow;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// An error reply, its code first (`ERR ...`). Bytes, not text: Redis
/// echoes a client's bytes (a command's name, an option) as they came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fail(Cow<'static, [u8]>);
type Res<T = ()> = Result<T, Fail>;

impl From<&'static str> for Fail {
    fn from(s: &'static str) -> Fail {
        Fail(Cow::Borrowed(s.as_bytes()))
    }
}

impl From<String> for Fail {
    fn from(s: String) -> Fail {
        Fail(Cow::Owned(s.into_bytes()))
    }
}

impl From<Vec<u8>> for Fail {
    fn from(b: Vec<u8>) -> Fail {
        Fail(Cow::Owned(b))
    }
}

impl AsRef<[u8]> for Fail {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

pub(crate) const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOT_INT: &str = "ERR value is not an integer or out of range";
const SYNTAX: &str = "ERR syntax error";
const OVERFLOW: &str = "ERR increment or decrement would overflow";
const TOO_BIG: &str = "ERR string exceeds maximum allowed size (proto-max-bulk-len)";

fn store_err(e: Error) -> Fail {
    format!("ERR {e}").into()
}

/// Which command a table entry runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmd {
    // connection and server
    Ping,
    Echo,
    Quit,
    Select,
    Hello,
    Auth,
    Client,
    Dbsize,
    Flushdb,
    Flushall,
    Info,
    Config,
    Command,
    Acl,
    Time,
    // strings
    Get,
    Set,
    Setnx,
    Setex,
    Psetex,
    Getset,
    Getdel,
    Getex,
    Mget,
    Mset,
    Msetnx,
    Append,
    Strlen,
    Getrange,
    Setrange,
    Incr,
    Decr,
    Incrby,
    Decrby,
    Incrbyfloat,
    // keys
    Del,
    Unlink,
    Exists,
    Type,
    Expire,
    Pexpire,
    Expireat,
    Pexpireat,
    Ttl,
    Pttl,
    Persist,
    Rename,
    Scan,
    Keys,
    Randomkey,
    // hashes
    Hset,
    Hmset,
    Hget,
    Hmget,
    Hgetall,
    Hdel,
    Hexists,
    Hlen,
    Hkeys,
    Hvals,
    Hincrby,
    Hsetnx,
    // transactions
    Multi,
    Exec,
    Discard,
    Watch,
    Unwatch,
}

/// One command of the table.
pub(crate) struct Spec {
    pub name: &'static str,
    /// Redis's arity: `n` exactly n arguments (the name counted), `-n` at
    /// least n.
    pub arity: i32,
    pub flags: &'static [&'static str],
    /// First key, last key (-1: the last argument), step.
    pub keys: (i32, i32, i32),
    pub group: &'static str,
    pub summary: &'static str,
    pub cmd: Cmd,
}

const R: &[&str] = &["readonly", "fast"];
const RS: &[&str] = &["readonly"];
const W: &[&str] = &["write", "denyoom"];
const WF: &[&str] = &["write", "denyoom", "fast"];
const WD: &[&str] = &["write", "fast"];
const WS: &[&str] = &["write"];
const C: &[&str] = &["fast"];
const T: &[&str] = &["noscript", "loading", "stale", "fast", "allow_busy"];
const LSF: &[&str] = &["loading", "stale", "fast"];
const NA: &[&str] = &["noscript", "loading", "stale", "fast", "no_auth", "allow_busy"];

macro_rules! spec {
    ($name:literal, $arity:expr, $flags:expr, $keys:expr, $group:literal, $cmd:ident, $summary:literal) => {
        Spec {
            name: $name,
            arity: $arity,
            flags: $flags,
            keys: $keys,
            group: $group,
            summary: $summary,
            cmd: Cmd::$cmd,
        }
    };
}

const K1: (i32, i32, i32) = (1, 1, 1);
const KN: (i32, i32, i32) = (1, -1, 1);
const K0: (i32, i32, i32) = (0, 0, 0);

/// Every command the server knows, with Redis 7's arity and flags.
pub(crate) static COMMANDS: &[Spec] = &[
    spec!("ping", -1, C, K0, "connection", Ping, "Returns the server's liveliness response."),
    spec!("echo", 2, LSF, K0, "connection", Echo, "Returns the given string."),
    spec!("quit", -1, NA, K0, "connection", Quit, "Closes the connection."),
    spec!("select", 2, LSF, K0, "connection", Select, "Changes the selected database."),
    spec!("hello", -1, NA, K0, "connection", Hello, "Handshakes with the server."),
    spec!("auth", -2, NA, K0, "connection", Auth, "Authenticates the connection."),
    spec!("client", -2, &[], K0, "connection", Client, "A container for client connection commands."),
    spec!("dbsize", 1, R, K0, "server", Dbsize, "Returns the number of keys in the database."),
    spec!("flushdb", -1, WS, K0, "server", Flushdb, "Removes all keys from the current database."),
    spec!("flushall", -1, WS, K0, "server", Flushall, "Removes all keys from all databases."),
    spec!(
        "info",
        -1,
        &["loading", "stale"],
        K0,
        "server",
        Info,
        "Returns information and statistics about the server."
    ),
    spec!("config", -2, &[], K0, "server", Config, "A container for server configuration commands."),
    spec!(
        "command",
        -1,
        &["loading", "stale"],
        K0,
        "server",
        Command,
        "Returns detailed information about all commands."
    ),
    spec!("acl", -2, &[], K0, "server", Acl, "A container for Access List Control commands."),
    spec!("time", 1, LSF, K0, "server", Time, "Returns the server time."),
    spec!("get", 2, R, K1, "string", Get, "Returns the string value of a key."),
    spec!("set", -3, W, K1, "string", Set, "Sets the string value of a key, ignoring its type."),
    spec!("setnx", 3, WF, K1, "string", Setnx, "Set the string value of a key only when the key doesn't exist."),
    spec!("setex", 4, W, K1, "string", Setex, "Sets the string value and expiration time of a key."),
    spec!("psetex", 4, W, K1, "string", Psetex, "Sets both string value and expiration time in milliseconds of a key."),
    spec!(
        "getset",
        3,
        WF,
        K1,
        "string",
        Getset,
        "Returns the previous string value of a key after setting it to a new value."
    ),
    spec!("getdel", 2, WD, K1, "string", Getdel, "Returns the string value of a key after deleting the key."),
    spec!("getex", -2, WD, K1, "string", Getex, "Returns the string value of a key after setting its expiration time."),
    spec!("mget", -2, R, KN, "string", Mget, "Atomically returns the string values of one or more keys."),
    spec!(
        "mset",
        -3,
        W,
        (1, -1, 2),
        "string",
        Mset,
        "Atomically creates or modifies the string values of one or more keys."
    ),
    spec!(
        "msetnx",
        -3,
        W,
        (1, -1, 2),
        "string",
        Msetnx,
        "Atomically modifies the string values of one or more keys only when all keys don't exist."
    ),
    spec!(
        "append",
        3,
        WF,
        K1,
        "string",
        Append,
        "Appends a string to the value of a key. Creates the key if it doesn't exist."
    ),
    spec!("strlen", 2, R, K1, "string", Strlen, "Returns the length of a string value."),
    spec!("getrange", 4, RS, K1, "string", Getrange, "Returns a substring of the string stored at a key."),
    spec!("setrange", 4, W, K1, "string", Setrange, "Overwrites a part of a string value with another by an offset."),
    spec!("incr", 2, WF, K1, "string", Incr, "Increments the integer value of a key by one."),
    spec!("decr", 2, WF, K1, "string", Decr, "Decrements the integer value of a key by one."),
    spec!("incrby", 3, WF, K1, "string", Incrby, "Increments the integer value of a key by a number."),
    spec!("decrby", 3, WF, K1, "string", Decrby, "Decrements a number from the integer value of a key."),
    spec!("incrbyfloat", 3, WF, K1, "string", Incrbyfloat, "Increment the floating point value of a key by a number."),
    spec!("del", -2, WS, KN, "generic", Del, "Deletes one or more keys."),
    spec!("unlink", -2, WD, KN, "generic", Unlink, "Asynchronously deletes one or more keys."),
    spec!("exists", -2, R, KN, "generic", Exists, "Determines whether one or more keys exist."),
    spec!("type", 2, R, K1, "generic", Type, "Determines the type of value stored at a key."),
    spec!("expire", -3, WD, K1, "generic", Expire, "Sets the expiration time of a key in seconds."),
    spec!("pexpire", -3, WD, K1, "generic", Pexpire, "Sets the expiration time of a key in milliseconds."),
    spec!("expireat", -3, WD, K1, "generic", Expireat, "Sets the expiration time of a key to a Unix timestamp."),
    spec!(
        "pexpireat",
        -3,
        WD,
        K1,
        "generic",
        Pexpireat,
        "Sets the expiration time of a key to a Unix milliseconds timestamp."
    ),
    spec!("ttl", 2, R, K1, "generic", Ttl, "Returns the expiration time in seconds of a key."),
    spec!("pttl", 2, R, K1, "generic", Pttl, "Returns the expiration time in milliseconds of a key."),
    spec!("persist", 2, WD, K1, "generic", Persist, "Removes the expiration time of a key."),
    spec!("rename", 3, WS, (1, 2, 1), "generic", Rename, "Renames a key and overwrites the destination."),
    spec!("scan", -2, RS, K0, "generic", Scan, "Iterates over the key names in the database."),
    spec!("keys", 2, RS, K0, "generic", Keys, "Returns all key names that match a pattern."),
    spec!("randomkey", 1, RS, K0, "generic", Randomkey, "Returns a random key name from the database."),
    spec!("hset", -4, WF, K1, "hash", Hset, "Creates or modifies the value of a field in a hash."),
    spec!("hmset", -4, WF, K1, "hash", Hmset, "Sets the values of multiple fields."),
    spec!("hget", 3, R, K1, "hash", Hget, "Returns the value of a field in a hash."),
    spec!("hmget", -3, R, K1, "hash", Hmget, "Returns the values of all fields in a hash."),
    spec!("hgetall", 2, RS, K1, "hash", Hgetall, "Returns all fields and values in a hash."),
    spec!("hdel", -3, WD, K1, "hash", Hdel, "Deletes one or more fields and their values from a hash."),
    spec!("hexists", 3, R, K1, "hash", Hexists, "Determines whether a field exists in a hash."),
    spec!("hlen", 2, R, K1, "hash", Hlen, "Returns the number of fields in a hash."),
    spec!("hkeys", 2, RS, K1, "hash", Hkeys, "Returns all fields in a hash."),
    spec!("hvals", 2, RS, K1, "hash", Hvals, "Returns all values in a hash."),
    spec!("hincrby", 4, WF, K1, "hash", Hincrby, "Increments the integer value of a field in a hash by a number."),
    spec!(
        "hsetnx",
        4,
        WF,
        K1,
        "hash",
        Hsetnx,
        "Sets the value of a field in a hash only when the field doesn't exist."
    ),
    spec!("multi", 1, T, K0, "transactions", Multi, "Starts a transaction."),
    spec!(
        "exec",
        1,
        &["noscript", "loading", "stale", "skip_slowlog"],
        K0,
        "transactions",
        Exec,
        "Executes all commands in a transaction."
    ),
    spec!("discard", 1, T, K0, "transactions", Discard, "Discards a transaction."),
    spec!(
        "watch",
        -2,
        T,
        KN,
        "transactions",
        Watch,
        "Monitors changes to keys to determine the execution of a transaction."
    ),
    spec!("unwatch", 1, T, K0, "transactions", Unwatch, "Forgets about watched keys of a transaction."),
];

/// The table entry of a command name, any case.
pub(crate) fn lookup(name: &[u8]) -> Option<&'static Spec> {
    COMMANDS.iter().find(|s| s.name.as_bytes().eq_ignore_ascii_case(name))
}

/// Whether `argc` arguments (the name counted) fit `arity`.
pub(crate) fn arity_ok(arity: i32, argc: usize) -> bool {
    if arity >= 0 {
        argc == arity as usize
    } else {
        argc >= (-arity) as usize
    }
}

/// The server's shared state.
pub(crate) struct Ctx {
    pub store: Arc<Store>,
    pub stats: Arc<RespStats>,
    pub cfg: RespConfig,
    /// Who may AUTH (`cfg.acl`, or `default` with `cfg.requirepass`).
    pub users: Arc<Acl>,
    /// Handles on the databases used so far (index = database number).
    dbs: Vec<Mutex<Option<Namespace>>>,
    pub started: Instant,
}

impl Ctx {
    pub(crate) fn new(store: Arc<Store>, stats: Arc<RespStats>, cfg: RespConfig, users: Arc<Acl>) -> Ctx {
        let dbs = (0..cfg.databases).map(|_| Mutex::new(None)).collect();
        Ctx { store, stats, cfg, users, dbs, started: Instant::now() }
    }

    /// The largest string or hash.
    pub(crate) fn bulk_max(&self) -> usize {
        self.cfg.value_bytes_max as usize
    }

    fn db_name(n: usize) -> String {
        format!("db{n}")
    }

    /// The namespace of database `n`, created on first use.
    pub(crate) async fn db(&self, n: usize) -> Result<Namespace, Error> {
        if let Some(ns) = self.dbs[n].lock().unwrap_or_else(|e| e.into_inner()).as_ref().filter(|ns| !ns.is_dropped()) {
            return Ok(ns.clone());
        }
        let name = Self::db_name(n);
        let ns = match self.store.namespace(&name) {
            Ok(ns) => ns,
            Err(Error::NoSuchNamespace { .. }) => {
                match self.store.create_namespace_async(&name, NamespaceOptions::default()).await {
                    Ok(ns) => ns,
                    Err(Error::NamespaceExists { .. }) => self.store.namespace(&name)?,
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        if ns.kind().is_block() {
            // An export that happens to bear a database's name (`granary
            // export create ... db3`) is not one: its blocks are not keys
            // (the engine refuses them as such), and FLUSHDB would empty it.
            return Err(Error::BadNamespace {
                name,
                why: "it is an export (a block device's namespace), not a database".into(),
            });
        }
        *self.dbs[n].lock().unwrap_or_else(|e| e.into_inner()) = Some(ns.clone());
        Ok(ns)
    }

    /// The databases that exist now (without creating any; not an export
    /// that bears a database's name).
    fn existing_dbs(&self) -> Vec<(usize, Namespace)> {
        (0..self.cfg.databases)
            .filter_map(|n| self.store.namespace(&Self::db_name(n)).ok().map(|ns| (n, ns)))
            .filter(|(_, ns)| !ns.kind().is_block())
            .collect()
    }
}

/// The commands a connection queued since MULTI.
#[derive(Default)]
pub(crate) struct Multi {
    /// Each command's arguments, in order.
    pub queue: Vec<Vec<Vec<u8>>>,
    /// A command was refused while queuing: EXEC aborts.
    pub refused: bool,
    /// The memory the queue holds, as [`queued_bytes`] counts it: at most
    /// `MULTI_QUEUE_BYTES_MAX`.
    pub bytes: usize,
}

/// What a queued command holds: its arguments' bytes and a `Vec` header
/// for each and for the command.
pub(crate) fn queued_bytes(args: &[&[u8]]) -> usize {
    let header = std::mem::size_of::<Vec<u8>>();
    header + args.iter().map(|a| a.len() + header).sum::<usize>()
}

/// A connection's state that commands read and change.
pub(crate) struct Client {
    pub id: u64,
    pub name: Option<Vec<u8>>,
    pub lib_name: Option<Vec<u8>>,
    pub lib_ver: Option<Vec<u8>>,
    pub resp3: bool,
    pub db: usize,
    /// Between MULTI and EXEC: the commands queued.
    pub multi: Option<Multi>,
    /// WATCHed keys: database, key, the version read (None: absent or
    /// expired; `Overlay::live_version`).
    pub watched: Vec<(usize, Vec<u8>, Option<u64>)>,
    /// A WATCHed key was written without its version changing (a SET
    /// that left an absent key absent, its expiry being past): EXEC
    /// aborts, as Redis's does for any write of a watched key.
    pub watch_dirty: bool,
    /// QUIT: close once the reply is sent.
    pub quit: bool,
    /// AUTH (or HELLO ... AUTH) succeeded, or no password is required.
    pub authenticated: bool,
    /// The user it runs as (`Acl::user`; 0: `default`), and whether that
    /// user may run every command (else NOPERM for all but AUTH, HELLO
    /// and QUIT).
    pub user: usize,
    pub permitted: bool,
}

impl Client {
    pub(crate) fn new(id: u64) -> Client {
        Client {
            id,
            name: None,
            lib_name: None,
            lib_ver: None,
            resp3: false,
            db: 0,
            multi: None,
            watched: vec![],
            watch_dirty: false,
            quit: false,
            authenticated: false,
            user: 0,
            permitted: false,
        }
    }

    /// A write of `key` in database `db` that its version does not show:
    /// a WATCH of it aborts the next EXEC.
    fn touch(&mut self, db: usize, key: &[u8]) {
        if self.watched.iter().any(|(d, k, _)| *d == db && k == key) {
            self.watch_dirty = true;
        }
    }
}

/// `s` up to its first NUL byte: what Redis prints of an argument with
/// a C string format (`%s`).
pub(crate) fn cstr(s: &[u8]) -> &[u8] {
    s.iter().position(|&b| b == 0).map_or(s, |n| &s[..n])
}

/// At most `n` bytes of `s` (Redis's `%.128s`: bytes, even mid-character).
fn prefix(s: &[u8], n: usize) -> &[u8] {
    &s[..s.len().min(n)]
}

/// Redis's reply to a command it does not know: the name and the first
/// arguments, each cut at a NUL byte, 128 bytes of each at most.
pub(crate) fn unknown_command(args: &[&[u8]]) -> Vec<u8> {
    let mut rest = Vec::new();
    for a in &args[1..] {
        if rest.len() >= 128 {
            break;
        }
        let room = 128 - rest.len();
        rest.push(b'\'');
        rest.extend_from_slice(prefix(cstr(a), room));
        rest.extend_from_slice(b"' ");
    }
    let mut m = b"ERR unknown command '".to_vec();
    m.extend_from_slice(prefix(cstr(args[0]), 128));
    m.extend_from_slice(b"', with args beginning with: ");
    m.extend(rest);
    m
}

/// Redis's reply to an unknown subcommand of a container command.
pub(crate) fn unknown_subcommand(args: &[&[u8]]) -> Vec<u8> {
    let mut m = b"ERR unknown subcommand '".to_vec();
    m.extend_from_slice(prefix(cstr(args[1]), 128));
    m.extend_from_slice(b"'. Try ");
    m.extend(cstr(args[0]).to_ascii_uppercase());
    m.extend_from_slice(b" HELP.");
    m
}

/// The subcommands of the container commands that Granary serves, with
/// Redis 7.0's arity (the container's name and the subcommand counted).
static SUBCOMMANDS: &[(Cmd, &str, i32)] = &[
    (Cmd::Client, "id", 2),
    (Cmd::Client, "info", 2),
    (Cmd::Client, "getname", 2),
    (Cmd::Client, "setname", 3),
    (Cmd::Client, "setinfo", 4),
    (Cmd::Config, "get", -3),
    (Cmd::Config, "set", -4),
    (Cmd::Config, "resetstat", 2),
    (Cmd::Command, "count", 2),
    (Cmd::Command, "list", -2),
    (Cmd::Command, "info", -2),
    (Cmd::Command, "docs", -2),
    (Cmd::Acl, "whoami", 2),
];

/// Redis's checks of a container command's subcommand (CLIENT, CONFIG,
/// COMMAND with one argument or more), made before the command runs or is
/// queued, as Redis makes them (so a refusal aborts MULTI): an unknown
/// subcommand, then its arity (`'client|id'`).
pub(crate) fn check_subcommand(spec: &Spec, args: &[&[u8]]) -> Res {
    if args.len() < 2 || !matches!(spec.cmd, Cmd::Client | Cmd::Config | Cmd::Command | Cmd::Acl) {
        return Ok(());
    }
    let Some(&(_, name, arity)) = SUBCOMMANDS.iter().find(|(c, n, _)| *c == spec.cmd && is(args[1], n)) else {
        return Err(unknown_subcommand(args).into());
    };
    if !arity_ok(arity, args.len()) {
        return Err(arity_error(&format!("{}|{name}", spec.name)).into());
    }
    Ok(())
}

/// The name Redis gives a command in its errors: a container's with its
/// subcommand (`'client|id'`), lowercase; `args` passed
/// [`check_subcommand`].
pub(crate) fn full_name(spec: &Spec, args: &[&[u8]]) -> String {
    match SUBCOMMANDS.iter().find(|(c, n, _)| *c == spec.cmd && args.len() >= 2 && is(args[1], n)) {
        Some((_, sub, _)) => format!("{}|{sub}", spec.name),
        None => spec.name.to_string(),
    }
}

pub(crate) fn arity_error(name: &str) -> String {
    format!("ERR wrong number of arguments for '{name}' command")
}

fn int_arg(a: &[u8]) -> Res<i64> {
    parse_i64(a).ok_or(Fail::from(NOT_INT))
}

fn is(a: &[u8], word: &str) -> bool {
    a.eq_ignore_ascii_case(word.as_bytes())
}

/// A string's live value, or WRONGTYPE.
fn string_of(r: Option<&Rec>) -> Res<Option<&[u8]>> {
    match r {
        None => Ok(None),
        Some(r) if r.kind == Kind::String => Ok(Some(&r.value)),
        Some(_) => Err(WRONGTYPE.into()),
    }
}

/// A hash's fields, or WRONGTYPE (or a corrupt encoding's error).
fn hash_of(r: Option<&Rec>) -> Res<Option<Hash>> {
    match r {
        None => Ok(None),
        Some(r) if r.kind == Kind::Hash => {
            Hash::decode(&r.value).map(Some).map_err(|_| "ERR corrupt hash record (docs/RESP.md, Records)".into())
        }
        Some(_) => Err(WRONGTYPE.into()),
    }
}

/// Expiry options of SET and GETEX.
#[derive(Default, Clone, Copy)]
struct SetOpts {
    nx: bool,
    xx: bool,
    get: bool,
    keepttl: bool,
    persist: bool,
    /// Unix ms, if an expiry was given.
    expire: Option<u64>,
}

/// An expiry option's argument as given: unit ms, absolute, the text.
type ExpireArg<'a> = Option<(bool, bool, &'a [u8])>;

/// Parse SET's (`is_set`) or GETEX's options, as Redis does: the syntax
/// only (an expiry unit may be repeated, the last counts; two different
/// units may not), the expiry's value is read by the caller (SET before
/// anything else, GETEX once the key is found a string).
fn set_opts<'a>(args: &[&'a [u8]], is_set: bool) -> Res<(SetOpts, ExpireArg<'a>)> {
    let mut o = SetOpts::default();
    let mut exp: ExpireArg<'a> = None;
    let mut j = 0;
    while j < args.len() {
        let a = args[j];
        let next = args.get(j + 1).copied();
        let unit = exp.map(|(ms, abs, _)| (ms, abs));
        if is(a, "nx") && !o.xx && is_set {
            o.nx = true;
        } else if is(a, "xx") && !o.nx && is_set {
            o.xx = true;
        } else if is(a, "get") && is_set {
            o.get = true;
        } else if is(a, "keepttl") && !o.persist && unit.is_none() && is_set {
            o.keepttl = true;
        } else if is(a, "persist") && !is_set && unit.is_none() && !o.keepttl {
            o.persist = true;
        } else {
            let this = if is(a, "ex") {
                (false, false)
            } else if is(a, "px") {
                (true, false)
            } else if is(a, "exat") {
                (false, true)
            } else if is(a, "pxat") {
                (true, true)
            } else {
                return Err(SYNTAX.into());
            };
            match next {
                Some(n) if !o.keepttl && !o.persist && unit.is_none_or(|u| u == this) => {
                    exp = Some((this.0, this.1, n));
                    j += 1;
                }
                _ => return Err(SYNTAX.into()),
            }
        }
        j += 1;
    }
    Ok((o, exp))
}

/// An expiry argument as unix ms (Redis's getExpireMillisecondsOrReply):
/// not an integer, not positive, or overflowing is refused.
fn expire_at(v: &[u8], unit_ms: bool, absolute: bool, cmd: &str) -> Res<u64> {
    let n = int_arg(v)?;
    let invalid = || Fail::from(format!("ERR invalid expire time in '{cmd}' command"));
    if n <= 0 || (!unit_ms && n > i64::MAX / 1000) {
        return Err(invalid());
    }
    let ms = if unit_ms { n } else { n * 1000 };
    let ms = if absolute { ms } else { ms.checked_add(now_ms() as i64).ok_or_else(invalid)? };
    Ok(ms as u64)
}

/// The record of an expiry, within what the engine holds.
fn clamp_expire(ms: u64) -> u64 {
    ms.min(EXPIRE_MS_MAX)
}

/// Increment a string as an integer (INCR and friends).
fn incr_string(cur: Option<&Rec>, by: i64) -> Res<(Rec, i64)> {
    let (v, expire_ms) = match cur {
        None => (0, 0),
        Some(r) if r.kind != Kind::String => return Err(WRONGTYPE.into()),
        Some(r) => (parse_i64(&r.value).ok_or(Fail::from(NOT_INT))?, r.expire_ms),
    };
    let n = v.checked_add(by).ok_or(Fail::from(OVERFLOW))?;
    Ok((Rec { kind: Kind::String, value: n.to_string().into_bytes(), expire_ms }, n))
}

/// What a command run tells the connection.
pub(crate) struct Cx<'a, K: Keys> {
    pub ctx: &'a Ctx,
    pub client: &'a mut Client,
    pub k: K,
    pub r: Reply<'a>,
}

/// Run a command already checked for arity, in a connection's own keys
/// view. Multi-key writes get an overlay committed as one batch, run again
/// if a key they read changed meanwhile.
pub(crate) async fn run_direct(ctx: &Ctx, client: &mut Client, spec: &Spec, args: &[&[u8]], out: &mut Vec<u8>) {
    let resp3 = client.resp3;
    // Commands that address no database do not create one (a PING must not
    // turn namespaces on in the store): they get the default namespace's
    // handle, which they never use.
    let needs_db = !matches!(
        spec.cmd,
        Cmd::Ping
            | Cmd::Echo
            | Cmd::Time
            | Cmd::Info
            | Cmd::Config
            | Cmd::Command
            | Cmd::Client
            | Cmd::Acl
            | Cmd::Select
    );
    let ns = match needs_db {
        true => ctx.db(client.db).await,
        false => ctx.store.namespace(granary_store::DEFAULT_NAMESPACE),
    };
    let ns = match ns {
        Ok(ns) => ns,
        Err(e) => return Reply { buf: out, resp3 }.error(store_err(e)),
    };
    let atomic = match spec.cmd {
        // An MSET of one key (named once or more: the last value wins) is
        // a SET of that value: one write, combined with other writes of a
        // hot key that queue behind it, instead of a batch.
        Cmd::Mset => args.len() < 3 || args[3..].chunks(2).any(|p| p[0] != args[1]),
        Cmd::Msetnx | Cmd::Rename => true,
        // More keys than one engine batch holds are deleted one by one.
        Cmd::Del | Cmd::Unlink => (3..=BATCH_OPS_MAX + 1).contains(&args.len()),
        _ => false,
    };
    // A connection's own writes of keys it WATCHes abort its EXEC, as in
    // Redis, even when the key ends as it was (created, then deleted).
    let track = !client.watched.is_empty();
    if !atomic {
        let wrote = track.then(Vec::new);
        let mut cx = Cx { ctx, client, k: Direct { ns, wrote }, r: Reply { buf: out, resp3 } };
        cx.run_replying(spec, args).await;
        let db = cx.client.db;
        for key in cx.k.wrote.take().unwrap_or_default() {
            cx.client.touch(db, &key);
        }
        return;
    }
    let mark = out.len();
    for _ in 0..TXN_RETRIES_MAX {
        out.truncate(mark);
        let mut overlay = Overlay::default();
        let mut cx = Cx {
            ctx,
            client: &mut *client,
            k: Txn { overlay: &mut overlay, ns: ns.clone() },
            r: Reply { buf: &mut *out, resp3 },
        };
        if cx.run_replying(spec, args).await {
            return;
        }
        match overlay.commit(&ctx.store).await {
            Ok(Commit::Done) => {
                ctx.stats.txn_commits.fetch_add(1, Relaxed);
                if track {
                    let db = client.db;
                    for key in overlay.changed() {
                        client.touch(db, key);
                    }
                }
                return;
            }
            Ok(_) => {
                ctx.stats.txn_retries.fetch_add(1, Relaxed);
            }
            Err(e) => {
                out.truncate(mark);
                Reply { buf: out, resp3 }.error(store_err(e));
                return;
            }
        }
    }
    out.truncate(mark);
    Reply { buf: out, resp3 }.error("ERR the keys this command read kept changing; try again");
}

impl<K: Keys> Cx<'_, K> {
    /// Run one command (arity checked) and write its reply; on an error the
    /// reply is the error alone: whatever the command wrote before it
    /// failed (an array's header, its first elements: MGET's keys before
    /// one a read failed for) is taken back, so the client still reads
    /// one well-formed reply. True if it failed.
    pub(crate) async fn run_replying(&mut self, spec: &Spec, a: &[&[u8]]) -> bool {
        let mark = self.r.buf.len();
        match self.run(spec, a).await {
            Ok(()) => false,
            Err(e) => {
                self.r.buf.truncate(mark);
                self.r.error(&e);
                self.ctx.stats.errors.fetch_add(1, Relaxed);
                true
            }
        }
    }

    /// Run one command (arity checked). Errors are returned, not written.
    pub(crate) async fn run(&mut self, spec: &Spec, a: &[&[u8]]) -> Res {
        self.ctx.stats.commands.fetch_add(1, Relaxed);
        match spec.cmd {
            Cmd::Ping => match a.len() {
                1 => self.r.simple("PONG"),
                2 => self.r.bulk(a[1]),
                _ => return Err(arity_error("ping").into()),
            },
            Cmd::Echo => self.r.bulk(a[1]),
            Cmd::Time => {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                self.r.array(2);
                self.r.bulk(now.as_secs().to_string().as_bytes());
                self.r.bulk(now.subsec_micros().to_string().as_bytes());
            }
            Cmd::Select => {
                let n = parse_i64(a[1]).ok_or(Fail::from(NOT_INT))?;
                if !(i32::MIN as i64..=i32::MAX as i64).contains(&n) {
                    return Err("ERR value is out of range, value must between -2147483648 and 2147483647".into());
                }
                if n < 0 || n as u64 >= self.ctx.cfg.databases as u64 {
                    return Err("ERR DB index is out of range".into());
                }
                let ns = self.ctx.db(n as usize).await.map_err(store_err)?;
                self.k.use_db(ns);
                self.client.db = n as usize;
                self.r.ok();
            }
            Cmd::Dbsize => {
                settle_links(&self.ctx.store).await.map_err(store_err)?;
                let st = self.k.db().stats().map_err(store_err)?;
                self.r.int(st.keys as i64);
            }
            Cmd::Flushdb | Cmd::Flushall => {
                if a.len() > 2 || (a.len() == 2 && !is(a[1], "async") && !is(a[1], "sync")) {
                    return Err(SYNTAX.into());
                }
                if spec.cmd == Cmd::Flushdb {
                    self.k.db().flush_all_async().await.map_err(store_err)?;
                } else {
                    for (_, ns) in self.ctx.existing_dbs() {
                        ns.flush_all_async().await.map_err(store_err)?;
                    }
                }
                self.r.ok();
            }
            Cmd::Info => {
                let text = crate::server::info(self.ctx, self.client, &a[1..]);
                self.r.verbatim(text.as_bytes());
            }
            Cmd::Config => self.config(a)?,
            Cmd::Command => self.command(a)?,
            Cmd::Client => self.client_cmd(a)?,
            Cmd::Acl => {
                // check_subcommand let only WHOAMI through (arity checked).
                let name = self.ctx.users.user(self.client.user).name();
                self.r.bulk(name.as_bytes());
            }
            Cmd::Get => {
                let r = self.read(a[1]).await?;
                self.r.bulk_or_null(string_of(r.as_ref())?);
            }
            Cmd::Set => {
                let (mut o, exp) = set_opts(&a[3..], true)?;
                o.expire = exp.map(|(ms, abs, v)| expire_at(v, ms, abs, "set")).transpose()?;
                self.set(a[1], a[2], o).await?;
            }
            Cmd::Setnx => {
                let v = a[2].to_vec();
                let done = self
                    .k
                    .update(a[1], |cur| match cur {
                        Some(_) => (Write::Keep, false),
                        None => (Write::Set(Rec::string(v.clone())), true),
                    })
                    .await
                    .map_err(store_err)?;
                self.r.int(done as i64);
            }
            Cmd::Setex | Cmd::Psetex => {
                let ms = spec.cmd == Cmd::Psetex;
                let at = expire_at(a[2], ms, false, spec.name)?;
                let rec = Rec { kind: Kind::String, value: a[3].to_vec(), expire_ms: clamp_expire(at) };
                self.k.set(a[1], rec).await.map_err(store_err)?;
                self.r.ok();
            }
            Cmd::Getset => {
                let o = SetOpts { get: true, ..Default::default() };
                self.set(a[1], a[2], o).await?;
            }
            Cmd::Getdel => {
                let old = self
                    .k
                    .update(a[1], |cur| match string_of(cur) {
                        Ok(Some(v)) => (Write::Delete, Ok(Some(v.to_vec()))),
                        other => (Write::Keep, other.map(|_| None)),
                    })
                    .await
                    .map_err(store_err)??;
                self.r.bulk_or_null(old.as_deref());
            }
            Cmd::Getex => {
                // The options' syntax, then the key (nil if absent), its
                // type, and only then the expiry's value (Redis's order).
                let (o, exp) = set_opts(&a[2..], false)?;
                let expire = exp.map(|(ms, abs, v)| expire_at(v, ms, abs, "getex")).transpose();
                let now = now_ms();
                let v = self
                    .k
                    .update(a[1], |cur| match string_of(cur) {
                        Ok(Some(v)) => {
                            let expire = match &expire {
                                Ok(e) => *e,
                                Err(e) => return (Write::Keep, Err(e.clone())),
                            };
                            let mut rec = cur.expect("a value").clone();
                            let w = match (expire, o.persist) {
                                (Some(at), _) if at <= now => Write::Delete,
                                (Some(at), _) => {
                                    rec.expire_ms = clamp_expire(at);
                                    Write::Derive(rec)
                                }
                                (None, true) if rec.expire_ms != 0 => {
                                    rec.expire_ms = 0;
                                    Write::Derive(rec)
                                }
                                _ => Write::Keep,
                            };
                            (w, Ok(Some(v.to_vec())))
                        }
                        other => (Write::Keep, other.map(|_| None)),
                    })
                    .await
                    .map_err(store_err)??;
                self.r.bulk_or_null(v.as_deref());
            }
            Cmd::Mget => {
                self.r.array(a.len() - 1);
                let Some(ns) = self.k.reads_direct().cloned() else {
                    // In a transaction: through its overlay, one by one.
                    for key in &a[1..] {
                        let r = self.read(key).await?;
                        self.mget_reply(r.as_ref());
                    }
                    return Ok(());
                };
                // The keys' reads run together, answered in order.
                let mut reads = granary_rt::Window::new(MULTI_GET_READS, MULTI_GET_BYTES);
                let mut queued = a[1..].iter();
                let mut next = queued.next();
                loop {
                    while let Some(key) = next {
                        let hint = ns.value_size_hint(key).unwrap_or(0);
                        if !reads.has_room(hint) {
                            break;
                        }
                        reads.push(crate::keys::read_direct(&ns, key), hint);
                        next = queued.next();
                    }
                    let Some(r) = reads.next().await else { break };
                    let r = r.map_err(store_err)?;
                    let st = &self.ctx.stats;
                    (if r.is_some() { &st.keyspace_hits } else { &st.keyspace_misses }).fetch_add(1, Relaxed);
                    self.mget_reply(r.as_ref());
                }
            }
            Cmd::Mset | Cmd::Msetnx => {
                if a.len().is_multiple_of(2) {
                    return Err(arity_error(spec.name).into());
                }
                if spec.cmd == Cmd::Msetnx {
                    for p in a[1..].chunks(2) {
                        if self.k.get(p[0]).await.map_err(store_err)?.is_some() {
                            self.r.int(0);
                            return Ok(());
                        }
                    }
                }
                // A key named more than once: its last value only (MSET is
                // atomic: nothing sees the values before it). Outside a
                // batch (one key), it is then one SET.
                let mut later: std::collections::HashSet<&[u8]> = std::collections::HashSet::new();
                let mut last: Vec<&[&[u8]]> = a[1..].chunks(2).rev().filter(|p| later.insert(p[0])).collect();
                last.reverse();
                for p in last {
                    self.k.set(p[0], Rec::string(p[1].to_vec())).await.map_err(store_err)?;
                }
                if spec.cmd == Cmd::Msetnx {
                    self.r.int(1);
                } else {
                    self.r.ok();
                }
            }
            Cmd::Append => {
                let max = self.ctx.bulk_max();
                let add = a[2];
                let len = self
                    .k
                    .update(a[1], |cur| match string_of(cur) {
                        Err(e) => (Write::Keep, Err(e)),
                        Ok(v) => {
                            let old = v.unwrap_or_default();
                            if old.len() + add.len() > max {
                                return (Write::Keep, Err(TOO_BIG.into()));
                            }
                            let mut rec = cur.cloned().unwrap_or_else(|| Rec::string(Vec::new()));
                            rec.value.extend_from_slice(add);
                            let n = rec.value.len();
                            (Write::Derive(rec), Ok(n))
                        }
                    })
                    .await
                    .map_err(store_err)??;
                self.r.int(len as i64);
            }
            Cmd::Strlen => {
                let r = self.read(a[1]).await?;
                self.r.int(string_of(r.as_ref())?.map_or(0, |v| v.len()) as i64);
            }
            Cmd::Getrange => {
                let (start, end) = (int_arg(a[2])?, int_arg(a[3])?);
                let r = self.read(a[1]).await?;
                let v = string_of(r.as_ref())?.unwrap_or_default();
                self.r.bulk(range_of(v, start, end));
            }
            Cmd::Setrange => {
                let off = int_arg(a[2])?;
                if off < 0 {
                    return Err("ERR offset is out of range".into());
                }
                let (off, add, max) = (off as usize, a[3], self.ctx.bulk_max());
                let len = self
                    .k
                    .update(a[1], |cur| match string_of(cur) {
                        Err(e) => (Write::Keep, Err(e)),
                        Ok(v) if add.is_empty() => (Write::Keep, Ok(v.map_or(0, |v| v.len()))),
                        Ok(_) if off.saturating_add(add.len()) > max => (Write::Keep, Err(TOO_BIG.into())),
                        Ok(_) => {
                            let mut rec = cur.cloned().unwrap_or_else(|| Rec::string(Vec::new()));
                            if rec.value.len() < off + add.len() {
                                rec.value.resize(off + add.len(), 0);
                            }
                            rec.value[off..off + add.len()].copy_from_slice(add);
                            let n = rec.value.len();
                            (Write::Derive(rec), Ok(n))
                        }
                    })
                    .await
                    .map_err(store_err)??;
                self.r.int(len as i64);
            }
            Cmd::Incr | Cmd::Decr | Cmd::Incrby | Cmd::Decrby => {
                let by = match spec.cmd {
                    Cmd::Incr => 1,
                    Cmd::Decr => -1,
                    Cmd::Incrby => int_arg(a[2])?,
                    _ => {
                        let d = int_arg(a[2])?;
                        if d == i64::MIN {
                            return Err("ERR decrement would overflow".into());
                        }
                        -d
                    }
                };
                let n = self
                    .k
                    .update(a[1], |cur| match incr_string(cur, by) {
                        Ok((rec, n)) => (Write::Derive(rec), Ok(n)),
                        Err(e) => (Write::Keep, Err(e)),
                    })
                    .await
                    .map_err(store_err)??;
                self.r.int(n);
            }
            Cmd::Incrbyfloat => {
                // The key's type first, then its value, then the increment
                // (Redis's order of checks).
                let text = self
                    .k
                    .update(a[1], |cur| match string_of(cur) {
                        Err(e) => (Write::Keep, Err(e)),
                        Ok(v) => match crate::float::incr_by_float(v, a[2]) {
                            Ok(t) => {
                                let exp = cur.map_or(0, |c| c.expire_ms);
                                (Write::Derive(Rec { kind: Kind::String, value: t.clone(), expire_ms: exp }), Ok(t))
                            }
                            Err(e) => (Write::Keep, Err(Fail::from(e.message()))),
                        },
                    })
                    .await
                    .map_err(store_err)??;
                self.r.bulk(&text);
            }
            Cmd::Del | Cmd::Unlink => {
                let mut n = 0;
                for key in &a[1..] {
                    n += self.k.del(key).await.map_err(store_err)? as i64;
                }
                self.r.int(n);
            }
            Cmd::Exists => {
                let mut n = 0;
                for key in &a[1..] {
                    n += self.read(key).await?.is_some() as i64;
                }
                self.r.int(n);
            }
            Cmd::Type => {
                let r = self.read(a[1]).await?;
                self.r.simple(r.map_or("none", |r| r.kind.name()));
            }
            Cmd::Expire | Cmd::Pexpire | Cmd::Expireat | Cmd::Pexpireat => self.expire(spec, a).await?,
            Cmd::Ttl | Cmd::Pttl => {
                let r = self.read(a[1]).await?;
                let v = match r {
                    None => -2,
                    Some(r) if r.expire_ms == 0 => -1,
                    Some(r) => {
                        let ms = r.expire_ms.saturating_sub(now_ms()) as i64;
                        if spec.cmd == Cmd::Pttl {
                            ms
                        } else {
                            (ms + 500) / 1000
                        }
                    }
                };
                self.r.int(v);
            }
            Cmd::Persist => {
                let done = self
                    .k
                    .update(a[1], |cur| match cur {
                        Some(r) if r.expire_ms != 0 => {
                            let mut r = r.clone();
                            r.expire_ms = 0;
                            (Write::Derive(r), true)
                        }
                        _ => (Write::Keep, false),
                    })
                    .await
                    .map_err(store_err)?;
                self.r.int(done as i64);
            }
            Cmd::Rename => {
                let Some(rec) = self.k.get(a[1]).await.map_err(store_err)? else {
                    return Err("ERR no such key".into());
                };
                if a[1] != a[2] {
                    self.k.del(a[1]).await.map_err(store_err)?;
                    // Its expiry goes with it, none included (as Redis).
                    self.k.set_carried(a[2], rec).await.map_err(store_err)?;
                }
                self.r.ok();
            }
            Cmd::Scan => self.scan(a).await?,
            Cmd::Keys => {
                let mut keys = Vec::new();
                let mut cursor = 0;
                loop {
                    let page = self.k.db().scan_async(cursor, 1024).await.map_err(store_err)?;
                    for k in page.keys.into_iter().filter(|k| glob::matches(a[1], k)) {
                        if self.stored(&k).await?.is_some() {
                            keys.push(k);
                        }
                    }
                    cursor = page.cursor;
                    if cursor == 0 {
                        break;
                    }
                }
                self.r.array(keys.len());
                for k in &keys {
                    self.r.bulk(k);
                }
            }
            Cmd::Randomkey => {
                let seed = {
                    use std::hash::{BuildHasher, Hasher};
                    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                    h.write_u64(now_ms());
                    h.finish()
                };
                // The engine's pick is live to its whole second; one whose
                // millisecond has passed is skipped, as Redis skips (and
                // deletes) an expired pick: a few more picks, then the
                // first live key of a full scan. A pick that found none
                // walked the whole index already: no scan follows it.
                let (mut found, mut walked) = (None, false);
                for i in 0..RANDOMKEY_PICKS {
                    match self.k.db().random_key_async(seed.wrapping_add(i)).await.map_err(store_err)? {
                        None => {
                            walked = true;
                            break;
                        }
                        Some(k) if self.stored(&k).await?.is_some() => {
                            found = Some(k);
                            break;
                        }
                        Some(_) => {}
                    }
                }
                if found.is_none() && !walked {
                    let mut cursor = 0;
                    'scan: loop {
                        let page = self.k.db().scan_async(cursor, 1024).await.map_err(store_err)?;
                        for k in page.keys {
                            if self.stored(&k).await?.is_some() {
                                found = Some(k);
                                break 'scan;
                            }
                        }
                        cursor = page.cursor;
                        if cursor == 0 {
                            break;
                        }
                    }
                }
                self.r.bulk_or_null(found.as_deref());
            }
            Cmd::Hset | Cmd::Hmset | Cmd::Hsetnx => {
                if !a.len().is_multiple_of(2) {
                    return Err(arity_error(spec.name).into());
                }
                let max = self.ctx.bulk_max();
                let nx = spec.cmd == Cmd::Hsetnx;
                let added = self
                    .k
                    .update(a[1], |cur| {
                        let mut h = match hash_of(cur) {
                            Ok(h) => h.unwrap_or_default().indexed(a.len() / 2 - 1),
                            Err(e) => return (Write::Keep, Err(e)),
                        };
                        if nx && h.get(a[2]).is_some() {
                            return (Write::Keep, Ok(0));
                        }
                        let added = a[2..].chunks(2).filter(|p| h.set(p[0], p[1])).count();
                        if h.encoded_len() > max {
                            return (Write::Keep, Err(hash_too_big(max)));
                        }
                        let exp = cur.map_or(0, |c| c.expire_ms);
                        (Write::Derive(Rec { kind: Kind::Hash, value: h.encode(), expire_ms: exp }), Ok(added))
                    })
                    .await
                    .map_err(store_err)??;
                match spec.cmd {
                    Cmd::Hmset => self.r.ok(),
                    _ => self.r.int(added as i64),
                }
            }
            Cmd::Hget | Cmd::Hexists => {
                let r = self.read(a[1]).await?;
                let h = hash_of(r.as_ref())?;
                let v = h.as_ref().and_then(|h| h.get(a[2]));
                if spec.cmd == Cmd::Hget {
                    self.r.bulk_or_null(v);
                } else {
                    self.r.int(v.is_some() as i64);
                }
            }
            Cmd::Hmget => {
                let r = self.read(a[1]).await?;
                let h = hash_of(r.as_ref())?.map(|h| h.indexed(a.len() - 2));
                self.r.array(a.len() - 2);
                for f in &a[2..] {
                    self.r.bulk_or_null(h.as_ref().and_then(|h| h.get(f)));
                }
            }
            Cmd::Hgetall | Cmd::Hkeys | Cmd::Hvals | Cmd::Hlen => {
                let r = self.read(a[1]).await?;
                let h = hash_of(r.as_ref())?.unwrap_or_default();
                match spec.cmd {
                    Cmd::Hlen => self.r.int(h.fields.len() as i64),
                    Cmd::Hgetall => {
                        self.r.map(h.fields.len());
                        for (f, v) in &h.fields {
                            self.r.bulk(f);
                            self.r.bulk(v);
                        }
                    }
                    _ => {
                        self.r.array(h.fields.len());
                        for (f, v) in &h.fields {
                            self.r.bulk(if spec.cmd == Cmd::Hkeys { f } else { v });
                        }
                    }
                }
            }
            Cmd::Hdel => {
                let n = self
                    .k
                    .update(a[1], |cur| {
                        let mut h = match hash_of(cur) {
                            Ok(Some(h)) => h,
                            Ok(None) => return (Write::Keep, Ok(0)),
                            Err(e) => return (Write::Keep, Err(e)),
                        };
                        let n = h.remove_all(&a[2..]);
                        let w = match (n, h.fields.is_empty()) {
                            (0, _) => Write::Keep,
                            (_, true) => Write::Delete,
                            _ => {
                                let exp = cur.map_or(0, |c| c.expire_ms);
                                Write::Derive(Rec { kind: Kind::Hash, value: h.encode(), expire_ms: exp })
                            }
                        };
                        (w, Ok(n))
                    })
                    .await
                    .map_err(store_err)??;
                self.r.int(n as i64);
            }
            Cmd::Hincrby => {
                let by = int_arg(a[3])?;
                let max = self.ctx.bulk_max();
                let n = self
                    .k
                    .update(a[1], |cur| {
                        let r = (|| {
                            let mut h = hash_of(cur)?.unwrap_or_default();
                            let v = match h.get(a[2]) {
                                None => 0,
                                Some(v) => parse_i64(v).ok_or(Fail::from("ERR hash value is not an integer"))?,
                            };
                            let n = v.checked_add(by).ok_or(Fail::from(OVERFLOW))?;
                            h.set(a[2], n.to_string().as_bytes());
                            if h.encoded_len() > max {
                                return Err(hash_too_big(max));
                            }
                            let exp = cur.map_or(0, |c| c.expire_ms);
                            Ok((Rec { kind: Kind::Hash, value: h.encode(), expire_ms: exp }, n))
                        })();
                        match r {
                            Ok((rec, n)) => (Write::Derive(rec), Ok(n)),
                            Err(e) => (Write::Keep, Err(e)),
                        }
                    })
                    .await
                    .map_err(store_err)??;
                self.r.int(n);
            }
            // The connection runs these itself (conn.rs); they never get here.
            Cmd::Quit | Cmd::Hello | Cmd::Auth | Cmd::Multi | Cmd::Exec | Cmd::Discard | Cmd::Watch | Cmd::Unwatch => {
                unreachable!("{} is run by the connection", spec.name)
            }
        }
        Ok(())
    }

    /// The live value of `key` in the store as it is (what SCAN, KEYS and
    /// RANDOMKEY see, inside EXEC too: docs/RESP.md, "Differences"); a key
    /// the engine still holds past its millisecond expiry is absent.
    async fn stored(&self, key: &[u8]) -> Res<Option<Rec>> {
        let item = self.k.db().get_item_async(key).await.map_err(store_err)?;
        Ok(item.map(Rec::from_item).filter(|r| !r.expired(now_ms())))
    }

    /// One MGET element: the value of a string, else nil.
    fn mget_reply(&mut self, r: Option<&Rec>) {
        match r {
            Some(r) if r.kind == Kind::String => self.r.bulk(&r.value),
            _ => self.r.null(),
        }
    }

    /// A read of one key by a read command, counted in `keyspace_hits` or
    /// `keyspace_misses` (writes are not, as in Redis).
    async fn read(&mut self, key: &[u8]) -> Res<Option<Rec>> {
        let r = self.k.get(key).await.map_err(store_err)?;
        let st = &self.ctx.stats;
        (if r.is_some() { &st.keyspace_hits } else { &st.keyspace_misses }).fetch_add(1, Relaxed);
        Ok(r)
    }

    /// SET with its options parsed (GETSET is SET ... GET).
    async fn set(&mut self, key: &[u8], value: &[u8], o: SetOpts) -> Res {
        let now = now_ms();
        if !(o.nx || o.xx || o.get || o.keepttl || o.expire.is_some_and(|at| at <= now)) {
            // Nothing to read first: an unconditional write, which the
            // engine may do without reading the key's old record.
            let rec = Rec { kind: Kind::String, value: value.to_vec(), expire_ms: o.expire.map_or(0, clamp_expire) };
            self.k.set(key, rec).await.map_err(store_err)?;
            self.r.ok();
            return Ok(());
        }
        let (stored, old, absent) = self
            .k
            .update(key, |cur| {
                let old = if o.get {
                    match string_of(cur) {
                        Ok(v) => v.map(|v| v.to_vec()),
                        Err(e) => return (Write::Keep, Err(e)),
                    }
                } else {
                    None
                };
                if (o.nx && cur.is_some()) || (o.xx && cur.is_none()) {
                    return (Write::Keep, Ok((false, old, false)));
                }
                let expire_ms = match (o.expire, o.keepttl) {
                    (Some(at), _) => clamp_expire(at),
                    (None, true) => cur.map_or(0, |c| c.expire_ms),
                    _ => 0,
                };
                let w = if o.expire.is_some_and(|at| at <= now) {
                    Write::Delete
                } else {
                    let rec = Rec { kind: Kind::String, value: value.to_vec(), expire_ms };
                    // KEEPTTL keeps what the key had, none included.
                    if o.keepttl {
                        Write::Derive(rec)
                    } else {
                        Write::Set(rec)
                    }
                };
                (w, Ok((true, old, cur.is_none())))
            })
            .await
            .map_err(store_err)??;
        if stored && absent && o.expire.is_some_and(|at| at <= now) {
            // Redis stores the key already expired: a write a WATCH sees.
            let db = self.client.db;
            self.client.touch(db, key);
        }
        if o.get {
            self.r.bulk_or_null(old.as_deref());
        } else if stored {
            self.r.ok();
        } else {
            self.r.null();
        }
        Ok(())
    }

    /// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT with NX, XX, GT, LT.
    async fn expire(&mut self, spec: &Spec, a: &[&[u8]]) -> Res {
        let ms_unit = matches!(spec.cmd, Cmd::Pexpire | Cmd::Pexpireat);
        let absolute = matches!(spec.cmd, Cmd::Expireat | Cmd::Pexpireat);
        // The options first, then the time (Redis's order of checks).
        let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
        for o in &a[3..] {
            if is(o, "nx") {
                nx = true;
            } else if is(o, "xx") {
                xx = true;
            } else if is(o, "gt") {
                gt = true;
            } else if is(o, "lt") {
                lt = true;
            } else {
                return Err([&b"ERR Unsupported option "[..], cstr(o)].concat().into());
            }
        }
        if nx && (xx || gt || lt) {
            return Err("ERR NX and XX, GT or LT options at the same time are not compatible".into());
        }
        if gt && lt {
            return Err("ERR GT and LT options at the same time are not compatible".into());
        }
        let n = int_arg(a[2])?;
        let invalid = || Fail::from(format!("ERR invalid expire time in '{}' command", spec.name));
        let now = now_ms() as i64;
        let ms = if ms_unit { Some(n) } else { n.checked_mul(1000) }.ok_or_else(invalid)?;
        let at = if absolute { ms } else { ms.checked_add(now).ok_or_else(invalid)? };
        let done = self
            .k
            .update(a[1], |cur| {
                let Some(r) = cur else { return (Write::Keep, false) };
                let ttl = (r.expire_ms != 0).then_some(r.expire_ms as i64);
                let skip = (nx && ttl.is_some())
                    || (xx && ttl.is_none())
                    || (gt && ttl.is_none_or(|t| at <= t))
                    || (lt && ttl.is_some_and(|t| at >= t));
                if skip {
                    return (Write::Keep, false);
                }
                if at <= now {
                    return (Write::Delete, true);
                }
                let mut r = r.clone();
                r.expire_ms = clamp_expire(at as u64);
                (Write::Derive(r), true)
            })
            .await
            .map_err(store_err)?;
        self.r.int(done as i64);
        Ok(())
    }

    /// SCAN cursor [MATCH pattern] [COUNT count] [TYPE type].
    async fn scan(&mut self, a: &[&[u8]]) -> Res {
        let cursor = scan_cursor(a[1]).ok_or(Fail::from("ERR invalid cursor"))?;
        let (mut pattern, mut count, mut typ) = (None, 10usize, None);
        let mut j = 2;
        while j < a.len() {
            let more = j + 1 < a.len();
            if is(a[j], "count") && more {
                let c = int_arg(a[j + 1])?;
                if c < 1 {
                    return Err(SYNTAX.into());
                }
                count = (c as u64).min(SCAN_COUNT_MAX as u64) as usize;
            } else if is(a[j], "match") && more {
                pattern = Some(a[j + 1]);
            } else if is(a[j], "type") && more {
                typ = Some(String::from_utf8_lossy(a[j + 1]).to_ascii_lowercase());
            } else {
                return Err(SYNTAX.into());
            }
            j += 2;
        }
        let page = self.k.db().scan_async(cursor, count).await.map_err(store_err)?;
        let mut keys = Vec::new();
        for k in page.keys {
            if pattern.is_some_and(|p| !glob::matches(p, &k)) {
                continue;
            }
            match self.stored(&k).await? {
                Some(r) if typ.as_ref().is_none_or(|t| r.kind.name() == t) => keys.push(k),
                _ => {}
            }
        }
        self.r.array(2);
        self.r.bulk(page.cursor.to_string().as_bytes());
        self.r.array(keys.len());
        for k in &keys {
            self.r.bulk(k);
        }
        Ok(())
    }

    fn unknown_sub(&self, a: &[&[u8]]) -> Fail {
        unknown_subcommand(a).into()
    }

    /// CONFIG GET (the settings clients and redis-benchmark ask for) and
    /// CONFIG RESETSTAT; CONFIG SET changes nothing here.
    fn config(&mut self, a: &[&[u8]]) -> Res {
        let sub = a[1];
        if is(sub, "get") {
            if a.len() < 3 {
                return Err(arity_error("config|get").into());
            }
            let cfg = &self.ctx.cfg;
            let table: Vec<(&str, String)> = vec![
                ("appendonly", "no".into()),
                ("appendfsync", "everysec".into()),
                ("save", "".into()),
                ("databases", cfg.databases.to_string()),
                ("maxclients", cfg.max_connections.to_string()),
                ("maxmemory", "0".into()),
                ("maxmemory-policy", if self.ctx.store.evicts() { "allkeys-lru" } else { "noeviction" }.into()),
                ("proto-max-bulk-len", cfg.value_bytes_max.to_string()),
                ("port", cfg.listen.port().to_string()),
                ("bind", cfg.listen.ip().to_string()),
                ("timeout", cfg.idle_timeout.map_or(0, |d| d.as_secs()).to_string()),
                ("cluster-enabled", "no".into()),
            ];
            // As Redis: a name without glob characters is looked up (any
            // case) and answered as the client spelled it; a pattern
            // matches without regard to case and answers the setting's
            // name; a setting is answered once.
            let mut hits: Vec<(&[u8], &str)> = Vec::new();
            for p in &a[2..] {
                let seen = |hits: &Vec<(&[u8], &str)>, k: &[u8]| hits.iter().any(|h| h.0.eq_ignore_ascii_case(k));
                if !cstr(p).iter().any(|c| b"[*?".contains(c)) {
                    if let Some((_, v)) = table.iter().find(|(k, _)| k.as_bytes().eq_ignore_ascii_case(p)) {
                        if !seen(&hits, p) {
                            hits.push((p, v));
                        }
                    }
                    continue;
                }
                let p = p.to_ascii_lowercase();
                for (k, v) in table.iter().filter(|(k, _)| glob::matches(&p, k.as_bytes())) {
                    if !seen(&hits, k.as_bytes()) {
                        hits.push((k.as_bytes(), v));
                    }
                }
            }
            self.r.map(hits.len());
            for (k, v) in hits {
                self.r.bulk(k);
                self.r.bulk(v.as_bytes());
            }
            Ok(())
        } else if is(sub, "resetstat") {
            self.r.ok();
            Ok(())
        } else if is(sub, "set") {
            Err("ERR CONFIG SET is not supported: Granary is configured by `granary serve` settings (docs/CONFIG.md)"
                .into())
        } else {
            Err(self.unknown_sub(a))
        }
    }

    /// COMMAND, COMMAND COUNT, COMMAND INFO, COMMAND DOCS, COMMAND LIST.
    fn command(&mut self, a: &[&[u8]]) -> Res {
        let all: Vec<&Spec> = COMMANDS.iter().collect();
        let named = |names: &[&[u8]]| names.iter().map(|n| lookup(n)).collect::<Vec<_>>();
        if a.len() == 1 {
            self.r.array(all.len());
            for s in all {
                self.command_info(s);
            }
            return Ok(());
        }
        let sub = a[1];
        if is(sub, "count") {
            self.r.int(COMMANDS.len() as i64);
        } else if is(sub, "list") {
            self.r.array(COMMANDS.len());
            for s in COMMANDS {
                self.r.bulk(s.name.as_bytes());
            }
        } else if is(sub, "info") {
            let specs: Vec<Option<&Spec>> =
                if a.len() == 2 { all.into_iter().map(Some).collect() } else { named(&a[2..]) };
            self.r.array(specs.len());
            for s in specs {
                match s {
                    Some(s) => self.command_info(s),
                    None => self.r.null(),
                }
            }
        } else if is(sub, "docs") {
            let specs: Vec<&Spec> = if a.len() == 2 { all } else { named(&a[2..]).into_iter().flatten().collect() };
            self.r.map(specs.len());
            for s in specs {
                self.r.bulk(s.name.as_bytes());
                self.r.map(3);
                self.r.bulk(b"summary");
                self.r.bulk(s.summary.as_bytes());
                self.r.bulk(b"since");
                self.r.bulk(b"1.0.0");
                self.r.bulk(b"group");
                self.r.bulk(s.group.as_bytes());
            }
        } else {
            return Err(self.unknown_sub(a));
        }
        Ok(())
    }

    /// One command's COMMAND INFO entry (Redis 7's ten fields).
    fn command_info(&mut self, s: &Spec) {
        self.r.array(10);
        self.r.bulk(s.name.as_bytes());
        self.r.int(s.arity as i64);
        self.r.set(s.flags.len());
        for f in s.flags {
            self.r.simple(f);
        }
        self.r.int(s.keys.0 as i64);
        self.r.int(s.keys.1 as i64);
        self.r.int(s.keys.2 as i64);
        let cat = format!("@{}", s.group);
        self.r.set(1);
        self.r.simple(&cat);
        self.r.set(0); // tips
        self.r.array(0); // key specs
        self.r.array(0); // subcommands
    }

    /// CLIENT ID, SETNAME, GETNAME, SETINFO, INFO.
    fn client_cmd(&mut self, a: &[&[u8]]) -> Res {
        let sub = a[1];
        let argc = |n: usize, name: &str| {
            if a.len() == n {
                Ok(())
            } else {
                Err(Fail::from(arity_error(name)))
            }
        };
        if is(sub, "id") {
            argc(2, "client|id")?;
            self.r.int(self.client.id as i64);
        } else if is(sub, "getname") {
            argc(2, "client|getname")?;
            let name = self.client.name.clone();
            self.r.bulk_or_null(name.as_deref());
        } else if is(sub, "setname") {
            argc(3, "client|setname")?;
            self.client.name = client_name(a[2])?;
            self.r.ok();
        } else if is(sub, "setinfo") {
            argc(4, "client|setinfo")?;
            let v = a[3];
            if v.len() > CLIENT_NAME_MAX || v.iter().any(|&b| !(b'!'..=b'~').contains(&b)) {
                return Err(format!(
                    "ERR {} cannot contain spaces, newlines or special characters.",
                    String::from_utf8_lossy(a[2]).to_ascii_uppercase()
                )
                .into());
            }
            if is(a[2], "lib-name") {
                self.client.lib_name = Some(v.to_vec());
            } else if is(a[2], "lib-ver") {
                self.client.lib_ver = Some(v.to_vec());
            } else {
                return Err(format!("ERR Unrecognized option '{}'", String::from_utf8_lossy(a[2])).into());
            }
            self.r.ok();
        } else if is(sub, "info") {
            argc(2, "client|info")?;
            let line = crate::server::client_line(self.client);
            self.r.verbatim(line.as_bytes());
        } else {
            return Err(self.unknown_sub(a));
        }
        Ok(())
    }
}

/// Settle the links blind overwrites left (a few device reads when keys
/// collided), so that key counts are exact: on a thread of its own, since
/// it takes key locks that this executor's tasks may hold across IO; the
/// executor polls for its end meanwhile.
async fn settle_links(store: &Arc<Store>) -> Result<(), Error> {
    if !store.has_unsettled_links() {
        return Ok(());
    }
    let s = store.clone();
    let h = std::thread::spawn(move || s.settle_links());
    while !h.is_finished() {
        granary_rt::sleep(std::time::Duration::from_millis(1)).await;
    }
    h.join().unwrap_or_else(|_| Err(Error::Poisoned { cause: "settling links panicked".into() })).map(|_| ())
}

/// A CLIENT SETNAME (or HELLO SETNAME) argument: empty clears the name.
pub(crate) fn client_name(v: &[u8]) -> Res<Option<Vec<u8>>> {
    if v.iter().any(|&b| !(b'!'..=b'~').contains(&b)) || v.len() > CLIENT_NAME_MAX {
        return Err("ERR Client names cannot contain spaces, newlines or special characters.".into());
    }
    Ok((!v.is_empty()).then(|| v.to_vec()))
}

fn hash_too_big(max: usize) -> Fail {
    format!("ERR hash exceeds the largest value this server stores ({max} bytes)").into()
}

/// SCAN's cursor as Redis reads it (strtoul, base 10, up to a NUL): no
/// leading space, an optional sign ('-' negates modulo 2^64), digits, and
/// nothing after; empty is 0; past 64 bits is refused.
fn scan_cursor(a: &[u8]) -> Option<u64> {
    let a = cstr(a);
    if a.first().is_some_and(|&c| c.is_ascii_whitespace() || c == 0x0b) {
        return None;
    }
    let (neg, digits) = match a.first() {
        Some(b'-') => (true, &a[1..]),
        Some(b'+') => (false, &a[1..]),
        _ => (false, a),
    };
    if digits.is_empty() {
        return a.is_empty().then_some(0);
    }
    let mut v: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((d - b'0') as u64)?;
    }
    Some(if neg { v.wrapping_neg() } else { v })
}

/// GETRANGE's substring, with Redis's handling of negative and
/// out-of-range indexes.
fn range_of(v: &[u8], start: i64, end: i64) -> &[u8] {
    let len = v.len() as i64;
    if (start < 0 && end < 0 && start > end) || len == 0 {
        return &[];
    }
    let s = if start < 0 { (len + start).max(0) } else { start };
    let e = if end < 0 { (len + end).max(0) } else { end.min(len - 1) };
    if s > e || s >= len {
        return &[];
    }
    &v[s as usize..=e as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        for (i, s) in COMMANDS.iter().enumerate() {
            assert_eq!(s.name, s.name.to_ascii_lowercase());
            assert!(COMMANDS[..i].iter().all(|o| o.name != s.name), "{} twice", s.name);
            assert!(s.arity != 0);
        }
        assert!(lookup(b"GeT").is_some_and(|s| s.cmd == Cmd::Get));
        assert!(arity_ok(-2, 3) && !arity_ok(-2, 1) && arity_ok(2, 2) && !arity_ok(2, 3));
    }

    #[test]
    fn unknown_command_reply_is_redis_words() {
        assert_eq!(
            unknown_command(&[b"foo", b"a", b"b"]),
            b"ERR unknown command 'foo', with args beginning with: 'a' 'b' "
        );
        assert_eq!(unknown_command(&[b"foo"]), b"ERR unknown command 'foo', with args beginning with: ");
        // Bytes as sent, cut at a NUL and at 128 bytes (even mid-character).
        let long = "é".repeat(100);
        let got = unknown_command(&[b"f\0oo", b"\xff", long.as_bytes(), b"x"]);
        let mut want = b"ERR unknown command 'f', with args beginning with: '\xff' '".to_vec();
        want.extend_from_slice(&long.as_bytes()[..124]);
        want.extend_from_slice(b"' ");
        assert_eq!(got, want);
        assert_eq!(unknown_subcommand(&[b"client", b"zz\0z"]), b"ERR unknown subcommand 'zz'. Try CLIENT HELP.");
    }

    #[test]
    fn scan_cursors_as_strtoul_reads_them() {
        for (c, want) in [
            (&b"0"[..], Some(0)),
            (b"", Some(0)),
            (b"+5", Some(5)),
            (b"007", Some(7)),
            (b"-1", Some(u64::MAX)),
            (b"18446744073709551615", Some(u64::MAX)),
            (b"18446744073709551616", None),
            (b" 1", None),
            (b"1 ", None),
            (b"+", None),
            (b"-", None),
            (b"0x1", None),
            (b"5\0x", Some(5)),
        ] {
            assert_eq!(scan_cursor(c), want, "{c:?}");
        }
    }

    #[test]
    fn getrange_indexes() {
        let v = b"This is a string";
        assert_eq!(range_of(v, 0, 3), b"This");
        assert_eq!(range_of(v, -3, -1), b"ing");
        assert_eq!(range_of(v, 0, -1), v);
        assert_eq!(range_of(v, 10, 100), b"string");
        assert_eq!(range_of(v, -1, -5), b"");
        assert_eq!(range_of(v, 5, 3), b"");
        assert_eq!(range_of(b"", 0, -1), b"");
    }
}
