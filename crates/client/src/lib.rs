//! The Rust client of Granary's native protocol (docs/PROTOCOL.md).
//!
//! - [`Client`]: one server, a pool of multiplexed connections (each with
//!   many requests in flight), blocking methods (`get`, `put`, ...) and
//!   async ones (`get_async`, ...) that work on any executor (they need no
//!   runtime: a reader thread per connection wakes them).
//! - [`Connection`]: one connection; [`Connection::send`] pipelines raw
//!   requests and returns a [`Pending`] response.
//! - [`ShardedClient`]: keys spread over several servers by a
//!   ketama-compatible consistent-hash ring ([`ketama`]): libketama's, or
//!   a nutcracker (twemproxy) pool's, so the client and the proxy place
//!   every key on the same node ([`ShardedClient::twemproxy`]).
//! - Namespaces (protocol version 2): [`Client::ns`] (and
//!   [`ShardedClient::ns`]) gives the same key calls in one namespace;
//!   [`Client::ns_create`], `ns_drop`, `ns_truncate`, `ns_list` and
//!   `ns_stats` manage them; [`Client::create_export`] creates an export
//!   (a namespace of kind block, for a block server). The plain calls are
//!   the default namespace's, and all a version 1 server offers.
//! - Atomic transactions (protocol version 2): [`Client::txn`] commits
//!   puts, conditional puts, CAS writes and deletes over keys of any
//!   namespaces, all or none ([`TxnOp`], [`TxnOutcome`]);
//!   [`ShardedClient::txn`] sends one to the server owning all its keys and
//!   refuses one whose keys span servers ([`Error::CrossServerTxn`]).
//!
//! - One key's CAS value (protocol version 3): [`Client::get_cas`] reads a
//!   value with its CAS value, flags and expiry ([`Item`]);
//!   [`Client::delete_cas`] deletes only if the CAS value is still the
//!   one read, and `TxnOp::cas` writes only then. On a connection to an
//!   older server they fail with [`Error::Protocol`] before sending.
//!
//! Every request has a timeout ([`ClientConfig::timeout`]); errors say
//! what failed ([`Error`]). A broken connection is replaced on next use.
//! A write that timed out or whose connection broke after it was sent has
//! an unknown outcome: the server may have executed it.

mod conn;
pub mod ketama;
mod sharded;
pub mod tls;

pub use conn::{Connection, Pending, TICK};
pub use granary_proto::{
    BatchOp, ClientHello, ItemInfo, NamespaceKind, NamespaceMode, NamespaceOptions, NamespaceStats, PutMode, Request,
    Response, Status, TxnOp, TxnOutcome, TxnWrite, DEFAULT_NAMESPACE, HELLO_TOKEN_BYTES_MAX, TXN_OPS_MAX,
};
pub use sharded::{PartialMget, ShardedClient, ShardedNamespace};
pub use tls::Tls;

use granary_proto::Op;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What went wrong.
#[derive(Debug)]
pub enum Error {
    /// Connecting failed.
    Connect(SocketAddr, std::io::Error),
    /// The server's hello was refused or not understood.
    Handshake(String),
    /// No response within the timeout. A request sent before it expired
    /// may still be executed by the server (as with any network store): a
    /// write's outcome is unknown. Read the key back, or retry where the
    /// write is idempotent; a read-modify-write uses a CAS value so a
    /// retry cannot apply twice.
    Timeout,
    /// The connection broke (the reason); the request may or may not have
    /// been executed.
    Disconnected(String),
    /// The server answered with an error status.
    Server { status: Status, message: String },
    /// A key, value or request exceeds the server's limits (not sent).
    TooLarge { what: &'static str, len: usize, max: usize },
    /// The server's response could not be understood, or the request needs
    /// a protocol version the connection does not speak (namespaces with a
    /// version 1 server).
    Protocol(String),
    /// Bad address or other local IO failure.
    Io(std::io::Error),
    /// A [`ShardedClient::txn`] whose keys map to several servers (their
    /// "host:port" names, and how many of its operations each owns): there
    /// are no distributed transactions. Nothing was sent.
    CrossServerTxn { servers: Vec<(String, usize)> },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Connect(a, e) => write!(f, "cannot connect to {a}: {e}"),
            Error::Handshake(m) => write!(f, "handshake failed: {m}"),
            Error::Timeout => write!(f, "request timed out"),
            Error::Disconnected(m) => write!(f, "connection lost: {m}"),
            Error::Server { status, message } => write!(f, "server error {status}: {message}"),
            Error::TooLarge { what, len, max } => {
                if *len == 0 {
                    write!(f, "{what} is empty")
                } else {
                    write!(f, "{what} of {len} exceeds the server's limit of {max}")
                }
            }
            Error::Protocol(m) => write!(f, "protocol error: {m}"),
            Error::Io(e) => write!(f, "{e}"),
            Error::CrossServerTxn { servers } => {
                let list: Vec<String> = servers
                    .iter()
                    .map(|(s, n)| format!("{s} ({n} operation{})", if *n == 1 { "" } else { "s" }))
                    .collect();
                write!(
                    f,
                    "a transaction is atomic on one server only, and its keys map to {} servers: {}; \
                     nothing was sent (no distributed transactions: keep the keys of one transaction on one server)",
                    servers.len(),
                    list.join(", ")
                )
            }
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Client settings.
#[derive(Clone)]
pub struct ClientConfig {
    /// Bound on connecting, the handshake, and each request
    /// (`Duration::MAX`: in effect none, a century).
    pub timeout: Duration,
    /// Connections per server; requests are spread over them in turn.
    pub connections: usize,
    /// The token every hello carries, for a server started with
    /// `--native-token` (docs/SECURITY.md); None: none is sent.
    pub token: Option<Vec<u8>>,
    /// Speak TLS with these settings, for a server started with
    /// `--tls-cert` (docs/SECURITY.md); None: plain TCP.
    pub tls: Option<Tls>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig { timeout: Duration::from_secs(5), connections: 1, token: None, tls: None }
    }
}

impl ClientConfig {
    /// These settings, sending `token` in every hello.
    pub fn with_token(mut self, token: impl Into<Vec<u8>>) -> ClientConfig {
        self.token = Some(token.into());
        self
    }

    /// These settings, over TLS.
    pub fn with_tls(mut self, tls: Tls) -> ClientConfig {
        self.tls = Some(tls);
        self
    }
}

impl std::fmt::Debug for ClientConfig {
    // Never the token itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("timeout", &self.timeout)
            .field("connections", &self.connections)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// The result of one operation of a batch.
#[derive(Debug)]
pub enum BatchResult {
    /// GET: the value, or None if absent.
    Value(Option<Vec<u8>>),
    /// PUT: whether it stored (false: the mode's condition failed).
    Stored(bool),
    /// DELETE: whether the key was present.
    Deleted(bool),
    /// The operation failed.
    Failed(Error),
}

/// A value with its CAS value and metadata ([`Client::get_cas`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub value: Vec<u8>,
    /// The value's CAS value: new at every write of the key (give it to
    /// [`Client::delete_cas`] or `TxnOp::cas`).
    pub cas: u64,
    /// The Memcache flags stored with it (0 when written over the native
    /// protocol).
    pub flags: u32,
    /// Unix seconds from which it reads as absent; 0: never.
    pub expires: u32,
}

fn server_error(r: &Response) -> Error {
    Error::Server { status: r.status, message: String::from_utf8_lossy(&r.body).into_owned() }
}

fn expect_op(r: &Response, op: granary_proto::Op) -> Result<()> {
    if r.op != op && !r.status.is_error() {
        return Err(Error::Protocol(format!("response to {} carries opcode {}", op.name(), r.op.name())));
    }
    Ok(())
}

pub(crate) fn as_value(r: Response) -> Result<Option<Vec<u8>>> {
    expect_op(&r, granary_proto::Op::Get)?;
    match r.status {
        Status::Ok => Ok(Some(r.body)),
        Status::NotFound => Ok(None),
        _ => Err(server_error(&r)),
    }
}

pub(crate) fn as_item(r: Response) -> Result<Option<Item>> {
    expect_op(&r, Op::Gets)?;
    match r.status {
        Status::Ok => {
            let (info, value) = ItemInfo::decode_reply(&r.body).map_err(|e| Error::Protocol(e.0))?;
            Ok(Some(Item { value: value.to_vec(), cas: info.cas, flags: info.flags, expires: info.expires }))
        }
        Status::NotFound => Ok(None),
        _ => Err(server_error(&r)),
    }
}

/// DELETE_CAS: deleted (true), or its condition failed (false: no value,
/// or another CAS value).
pub(crate) fn as_deleted_cas(r: Response) -> Result<bool> {
    expect_op(&r, Op::DeleteCas)?;
    match r.status {
        Status::Ok => Ok(true),
        Status::NotFound | Status::Exists => Ok(false),
        _ => Err(server_error(&r)),
    }
}

pub(crate) fn as_stored(r: Response) -> Result<bool> {
    expect_op(&r, granary_proto::Op::Put)?;
    match r.status {
        Status::Ok => Ok(true),
        Status::Exists | Status::NotFound => Ok(false),
        _ => Err(server_error(&r)),
    }
}

pub(crate) fn as_deleted(r: Response) -> Result<bool> {
    expect_op(&r, granary_proto::Op::Delete)?;
    match r.status {
        Status::Ok => Ok(true),
        Status::NotFound => Ok(false),
        _ => Err(server_error(&r)),
    }
}

fn entries(r: Response, op: granary_proto::Op, n: usize) -> Result<Vec<granary_proto::Entry>> {
    expect_op(&r, op)?;
    if r.status != Status::Ok {
        return Err(server_error(&r));
    }
    let e = granary_proto::decode_entries(&r.body).map_err(|e| Error::Protocol(e.0))?;
    if e.len() != n {
        return Err(Error::Protocol(format!("{} entries for {n} keys", e.len())));
    }
    Ok(e)
}

pub(crate) fn as_values(r: Response, n: usize) -> Result<Vec<Option<Vec<u8>>>> {
    entries(r, granary_proto::Op::MultiGet, n)?
        .into_iter()
        .map(|e| match e.status {
            Status::Ok => Ok(Some(e.bytes)),
            Status::NotFound => Ok(None),
            s => Err(Error::Server { status: s, message: String::from_utf8_lossy(&e.bytes).into_owned() }),
        })
        .collect()
}

pub(crate) fn as_batch(r: Response, ops: &[BatchOp]) -> Result<Vec<BatchResult>> {
    let es = entries(r, granary_proto::Op::Batch, ops.len())?;
    Ok(es
        .into_iter()
        .zip(ops)
        .map(|(e, o)| match (e.status, o) {
            (s, _) if s.is_error() => BatchResult::Failed(Error::Server {
                status: s,
                message: String::from_utf8_lossy(&e.bytes).into_owned(),
            }),
            (Status::Ok, BatchOp::Get(_)) => BatchResult::Value(Some(e.bytes)),
            (_, BatchOp::Get(_)) => BatchResult::Value(None),
            (s, BatchOp::Put { .. }) => BatchResult::Stored(s == Status::Ok),
            (s, BatchOp::Delete(_)) => BatchResult::Deleted(s == Status::Ok),
        })
        .collect())
}

/// The answer to a TXN of `n` operations.
pub(crate) fn as_txn(r: Response, n: usize) -> Result<TxnOutcome> {
    expect_op(&r, Op::Txn)?;
    if !matches!(r.status, Status::Ok | Status::Exists | Status::NotFound) {
        return Err(server_error(&r));
    }
    let o = TxnOutcome::decode(r.status, &r.body).map_err(|e| Error::Protocol(e.0))?;
    match &o {
        TxnOutcome::Committed { cas } if cas.len() != n => {
            Err(Error::Protocol(format!("{} CAS values for a TXN of {n} operations", cas.len())))
        }
        TxnOutcome::ConditionFailed { op, .. } if *op >= n => {
            Err(Error::Protocol(format!("operation {op} failed, of a TXN of {n} operations")))
        }
        _ => Ok(o),
    }
}

pub(crate) fn as_stats(r: Response) -> Result<Vec<(String, String)>> {
    expect_op(&r, granary_proto::Op::Stats)?;
    if r.status != Status::Ok {
        return Err(server_error(&r));
    }
    granary_proto::decode_stats(&r.body).map_err(|e| Error::Protocol(e.0))
}

pub(crate) fn as_ok(r: Response) -> Result<()> {
    if r.status != Status::Ok {
        return Err(server_error(&r));
    }
    Ok(())
}

/// The answer to NS_CREATE, NS_DROP or NS_TRUNCATE.
pub(crate) fn as_done(r: Response, op: granary_proto::Op) -> Result<()> {
    expect_op(&r, op)?;
    as_ok(r)
}

pub(crate) fn as_ns_stats(r: Response) -> Result<NamespaceStats> {
    expect_op(&r, granary_proto::Op::NsStats)?;
    if r.status != Status::Ok {
        return Err(server_error(&r));
    }
    granary_proto::decode_namespace_stats(&r.body).map_err(|e| Error::Protocol(e.0))
}

pub(crate) fn as_ns_list(r: Response) -> Result<Vec<NamespaceStats>> {
    expect_op(&r, granary_proto::Op::NsList)?;
    if r.status != Status::Ok {
        return Err(server_error(&r));
    }
    granary_proto::decode_namespace_list(&r.body).map_err(|e| Error::Protocol(e.0))
}

/// A client of one server: a pool of connections, made on first use and
/// replaced when they break.
pub struct Client {
    /// The server's addresses (a name may resolve to several), tried in
    /// turn from the one that last accepted a connection (`at`).
    addrs: Vec<SocketAddr>,
    at: AtomicUsize,
    cfg: ClientConfig,
    pool: Vec<Mutex<Option<Arc<Connection>>>>,
    next: AtomicUsize,
}

impl Client {
    /// A client of `addr` ("host:port"); connects once now so a bad
    /// address or a refused handshake is reported here. Each address the
    /// name resolves to is tried in turn, as `TcpStream::connect` does
    /// ("localhost" may give `::1` first to a server listening on
    /// 127.0.0.1): the client keeps the first that accepts the connection,
    /// and a server that answers but refuses (its handshake, token or TLS)
    /// is reported as such.
    pub fn connect(addr: impl ToSocketAddrs, cfg: ClientConfig) -> Result<Client> {
        let c = Client::resolve(addr, cfg)?;
        c.conn()?;
        Ok(c)
    }

    /// A client of every address `addr` resolves to (tried in turn, as
    /// [`Client::connect`] does) that connects on first use.
    pub fn resolve(addr: impl ToSocketAddrs, cfg: ClientConfig) -> Result<Client> {
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs().map_err(Error::Io)?.collect();
        if addrs.is_empty() {
            return Err(Error::Io(std::io::Error::other("address resolves to nothing")));
        }
        Ok(Client::of(addrs, cfg))
    }

    /// A client that connects on first use.
    pub fn lazy(addr: SocketAddr, cfg: ClientConfig) -> Client {
        Client::of(vec![addr], cfg)
    }

    fn of(addrs: Vec<SocketAddr>, cfg: ClientConfig) -> Client {
        let n = cfg.connections.max(1);
        let pool = (0..n).map(|_| Mutex::new(None)).collect();
        Client { addrs, at: AtomicUsize::new(0), cfg, pool, next: AtomicUsize::new(0) }
    }

    /// The address it connects to (the one that last accepted).
    pub fn addr(&self) -> SocketAddr {
        self.addrs[self.at.load(Relaxed) % self.addrs.len()]
    }

    /// A new connection: to each address in turn from the one that last
    /// accepted, until one answers; a server that answers and refuses (its
    /// handshake, token or TLS) is reported as such.
    fn connect_one(&self) -> Result<Connection> {
        let first = self.at.load(Relaxed);
        let mut last = None;
        for k in 0..self.addrs.len() {
            let i = (first + k) % self.addrs.len();
            let hello = ClientHello::default();
            let tls = self.cfg.tls.as_ref();
            match Connection::connect_over(self.addrs[i], self.cfg.timeout, hello, self.cfg.token.as_deref(), tls) {
                Ok(c) => {
                    self.at.store(i, Relaxed);
                    return Ok(c);
                }
                // Refused, or accepted with no hello in time: the next one.
                Err(e @ (Error::Connect(..) | Error::Timeout)) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("a client has an address"))
    }

    /// A live connection of the pool (the next in turn).
    pub fn conn(&self) -> Result<Arc<Connection>> {
        let i = self.next.fetch_add(1, Relaxed) % self.pool.len();
        let mut slot = self.pool[i].lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = slot.as_ref().filter(|c| c.is_alive()) {
            return Ok(c.clone());
        }
        let c = Arc::new(self.connect_one()?);
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Send a raw request on a pooled connection (pipelining: send many,
    /// then wait for each), in the default namespace.
    pub fn send(&self, req: &Request) -> Result<Pending> {
        self.conn()?.send(req)
    }

    /// [`Client::send`] naming namespace `ns` ([`Connection::send_in`]).
    pub fn send_in(&self, ns: &[u8], req: &Request) -> Result<Pending> {
        self.conn()?.send_in(ns, req)
    }

    /// The key calls in namespace `name` (`client.ns("users").get(k)`).
    /// Nothing is sent until a call: a namespace that does not exist
    /// fails each with `NO_SUCH_NAMESPACE` ([`Error::Server`]).
    pub fn ns<'a>(&'a self, name: &'a str) -> Namespace<'a> {
        Namespace { client: self, name }
    }

    fn default_ns(&self) -> Namespace<'_> {
        Namespace { client: self, name: "" }
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.default_ns().get(key)
    }
    /// Insert or overwrite.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.default_ns().put(key, value)
    }
    /// PUT with a mode; false if the mode's condition failed.
    pub fn put_with(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<bool> {
        self.default_ns().put_with(key, value, mode)
    }
    /// Delete; whether the key was present.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.default_ns().delete(key)
    }
    /// The value with its CAS value, flags and expiry, or None (protocol
    /// version 3: GETS).
    pub fn get_cas(&self, key: &[u8]) -> Result<Option<Item>> {
        self.default_ns().get_cas(key)
    }
    /// Delete only if the value's CAS value is `cas` (protocol version 3:
    /// DELETE_CAS); false if the key holds no value or another CAS value.
    pub fn delete_cas(&self, key: &[u8], cas: u64) -> Result<bool> {
        self.default_ns().delete_cas(key, cas)
    }
    /// Values of several keys, in order.
    pub fn mget(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.default_ns().mget(keys)
    }
    /// Several operations executed in order on the server (not atomic).
    pub fn batch(&self, ops: &[BatchOp]) -> Result<Vec<BatchResult>> {
        self.default_ns().batch(ops)
    }
    /// Round trip; answered after every earlier request on its connection.
    pub fn ping(&self) -> Result<Duration> {
        let t = std::time::Instant::now();
        as_ok(self.send(&Request::Nop)?.wait()?)?;
        Ok(t.elapsed())
    }
    pub fn stats(&self) -> Result<Vec<(String, String)>> {
        as_stats(self.send(&Request::Stats)?.wait()?)
    }

    /// Commit `ops` atomically (protocol version 2): each names its
    /// namespace (`""` or `"default"`: the default one), and together they
    /// are applied all or none. `Committed` (durable when returned) carries
    /// each operation's new CAS value (0 for a delete);
    /// `ConditionFailed` names the first operation whose condition failed
    /// and how (`EXISTS`, `NOT_FOUND`), nothing applied. What the server
    /// refuses is an error, nothing applied: `BAD_BATCH` (a key twice, or
    /// records larger than a segment), `NO_SUCH_NAMESPACE`,
    /// `QUOTA_EXCEEDED`, `NO_SPACE`, ... At most [`TXN_OPS_MAX`] operations
    /// in one frame ([`Error::TooLarge`] beyond, not sent).
    pub fn txn(&self, ops: &[TxnOp]) -> Result<TxnOutcome> {
        as_txn(self.send(&Request::Txn(ops.to_vec()))?.wait()?, ops.len())
    }

    pub async fn get_async(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.default_ns().get_async(key).await
    }
    pub async fn put_async(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.default_ns().put_async(key, value).await
    }
    pub async fn put_with_async(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<bool> {
        self.default_ns().put_with_async(key, value, mode).await
    }
    pub async fn delete_async(&self, key: &[u8]) -> Result<bool> {
        self.default_ns().delete_async(key).await
    }
    pub async fn get_cas_async(&self, key: &[u8]) -> Result<Option<Item>> {
        self.default_ns().get_cas_async(key).await
    }
    pub async fn delete_cas_async(&self, key: &[u8], cas: u64) -> Result<bool> {
        self.default_ns().delete_cas_async(key, cas).await
    }
    pub async fn mget_async(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.default_ns().mget_async(keys).await
    }
    pub async fn batch_async(&self, ops: &[BatchOp<'_>]) -> Result<Vec<BatchResult>> {
        self.default_ns().batch_async(ops).await
    }
    pub async fn stats_async(&self) -> Result<Vec<(String, String)>> {
        as_stats(self.send(&Request::Stats)?.await?)
    }
    /// [`Client::txn`], awaited.
    pub async fn txn_async(&self, ops: &[TxnOp<'_>]) -> Result<TxnOutcome> {
        as_txn(self.send(&Request::Txn(ops.to_vec()))?.await?, ops.len())
    }

    /// Create namespace `name` (1 to 64 ASCII letters, digits, `_`, `-`,
    /// `.`) on the server: `NAMESPACE_EXISTS` if it exists,
    /// `BAD_NAMESPACE` for a name or option the server does not take.
    pub fn ns_create(&self, name: &str, options: NamespaceOptions) -> Result<()> {
        as_done(self.send_in(name.as_bytes(), &Request::NsCreate(options))?.wait()?, Op::NsCreate)
    }
    /// Create export `name` on the server: a namespace of kind block, a
    /// block device of `size_bytes` in blocks of `block_bytes` (block `n`
    /// under its 8-byte big-endian number). `BAD_NAMESPACE` for a geometry
    /// the server does not take (a block size that is not a power of two
    /// from 512 to 65536 or larger than one value, a size that is not a
    /// positive multiple of it or over 2^63); `NAMESPACE_EXISTS` if the
    /// name exists. Dropped and truncated as any namespace (`ns_drop`,
    /// `ns_truncate`). A server that predates exports answers `BAD_FRAME`
    /// and closes the connection.
    pub fn create_export(&self, name: &str, size_bytes: u64, block_bytes: u32) -> Result<()> {
        self.ns_create(name, NamespaceOptions::export(size_bytes, block_bytes))
    }
    /// Drop namespace `name`: its keys are gone at once (`NO_SUCH_NAMESPACE`
    /// if there is none; `BAD_NAMESPACE` for the default one).
    pub fn ns_drop(&self, name: &str) -> Result<()> {
        as_done(self.send_in(name.as_bytes(), &Request::NsDrop)?.wait()?, Op::NsDrop)
    }
    /// Empty namespace `name`, keeping it and its options (the default
    /// namespace: every key of it, as memcache `flush_all`).
    pub fn ns_truncate(&self, name: &str) -> Result<()> {
        as_done(self.send_in(name.as_bytes(), &Request::NsTruncate)?.wait()?, Op::NsTruncate)
    }
    /// Every namespace with its options and figures, the default one first.
    pub fn ns_list(&self) -> Result<Vec<NamespaceStats>> {
        as_ns_list(self.send(&Request::NsList)?.wait()?)
    }
    /// Namespace `name`'s options and figures.
    pub fn ns_stats(&self, name: &str) -> Result<NamespaceStats> {
        as_ns_stats(self.send_in(name.as_bytes(), &Request::NsStats)?.wait()?)
    }

    pub async fn ns_create_async(&self, name: &str, options: NamespaceOptions) -> Result<()> {
        as_done(self.send_in(name.as_bytes(), &Request::NsCreate(options))?.await?, Op::NsCreate)
    }
    pub async fn create_export_async(&self, name: &str, size_bytes: u64, block_bytes: u32) -> Result<()> {
        self.ns_create_async(name, NamespaceOptions::export(size_bytes, block_bytes)).await
    }
    pub async fn ns_drop_async(&self, name: &str) -> Result<()> {
        as_done(self.send_in(name.as_bytes(), &Request::NsDrop)?.await?, Op::NsDrop)
    }
    pub async fn ns_truncate_async(&self, name: &str) -> Result<()> {
        as_done(self.send_in(name.as_bytes(), &Request::NsTruncate)?.await?, Op::NsTruncate)
    }
    pub async fn ns_list_async(&self) -> Result<Vec<NamespaceStats>> {
        as_ns_list(self.send(&Request::NsList)?.await?)
    }
    pub async fn ns_stats_async(&self, name: &str) -> Result<NamespaceStats> {
        as_ns_stats(self.send_in(name.as_bytes(), &Request::NsStats)?.await?)
    }
}

/// The key calls of a [`Client`] in one namespace ([`Client::ns`]); the
/// same pool of connections, the same rules. The empty name is the default
/// namespace.
#[derive(Clone, Copy)]
pub struct Namespace<'a> {
    client: &'a Client,
    name: &'a str,
}

impl<'a> Namespace<'a> {
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// Send a raw key request in this namespace ([`Client::send_in`]).
    pub fn send(&self, req: &Request) -> Result<Pending> {
        self.client.send_in(self.name.as_bytes(), req)
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        as_value(self.send(&Request::Get(key))?.wait()?)
    }
    /// Insert or overwrite.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.put_with(key, value, PutMode::Upsert).map(|_| ())
    }
    /// PUT with a mode; false if the mode's condition failed.
    pub fn put_with(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<bool> {
        as_stored(self.send(&Request::Put { key, value, mode })?.wait()?)
    }
    /// Delete; whether the key was present.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        as_deleted(self.send(&Request::Delete(key))?.wait()?)
    }
    /// [`Client::get_cas`] in this namespace.
    pub fn get_cas(&self, key: &[u8]) -> Result<Option<Item>> {
        as_item(self.send(&Request::Gets(key))?.wait()?)
    }
    /// [`Client::delete_cas`] in this namespace.
    pub fn delete_cas(&self, key: &[u8], cas: u64) -> Result<bool> {
        as_deleted_cas(self.send(&Request::DeleteCas { key, cas })?.wait()?)
    }
    /// Values of several keys, in order.
    pub fn mget(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        as_values(self.send(&Request::MultiGet(keys.to_vec()))?.wait()?, keys.len())
    }
    /// Several operations executed in order on the server (not atomic).
    pub fn batch(&self, ops: &[BatchOp]) -> Result<Vec<BatchResult>> {
        as_batch(self.send(&Request::Batch(ops.to_vec()))?.wait()?, ops)
    }
    /// This namespace's options and figures ([`Client::ns_stats`]).
    pub fn stats(&self) -> Result<NamespaceStats> {
        self.client.ns_stats(self.name)
    }

    pub async fn get_async(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        as_value(self.send(&Request::Get(key))?.await?)
    }
    pub async fn put_async(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.put_with_async(key, value, PutMode::Upsert).await.map(|_| ())
    }
    pub async fn put_with_async(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<bool> {
        as_stored(self.send(&Request::Put { key, value, mode })?.await?)
    }
    pub async fn delete_async(&self, key: &[u8]) -> Result<bool> {
        as_deleted(self.send(&Request::Delete(key))?.await?)
    }
    pub async fn get_cas_async(&self, key: &[u8]) -> Result<Option<Item>> {
        as_item(self.send(&Request::Gets(key))?.await?)
    }
    pub async fn delete_cas_async(&self, key: &[u8], cas: u64) -> Result<bool> {
        as_deleted_cas(self.send(&Request::DeleteCas { key, cas })?.await?)
    }
    pub async fn mget_async(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        as_values(self.send(&Request::MultiGet(keys.to_vec()))?.await?, keys.len())
    }
    pub async fn batch_async(&self, ops: &[BatchOp<'_>]) -> Result<Vec<BatchResult>> {
        as_batch(self.send(&Request::Batch(ops.to_vec()))?.await?, ops)
    }
}
