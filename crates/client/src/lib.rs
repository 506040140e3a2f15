//! The Rust client of Granary's native protocol (docs/PROTOCOL.md).
//!
//! - [`Client`]: one server, a pool of multiplexed connections (each with
//!   many requests in flight), blocking methods (`get`, `put`, ...) and
//!   async ones (`get_async`, ...) that work on any executor (they need no
//!   runtime: a reader thread per connection wakes them).
//! - [`Connection`]: one connection; [`Connection::send`] pipelines raw
//!   requests and returns a [`Pending`] response.
//! - [`ShardedClient`]: keys spread over several servers by a
//!   ketama-compatible consistent-hash ring ([`ketama`]).
//!
//! Every request has a timeout ([`ClientConfig::timeout`]); errors say
//! what failed ([`Error`]). A broken connection is replaced on next use.

mod conn;
pub mod ketama;
mod sharded;

pub use conn::{Connection, Pending, TICK};
pub use granary_proto::{BatchOp, PutMode, Request, Response, Status};
pub use sharded::ShardedClient;

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
    /// No response within the timeout.
    Timeout,
    /// The connection broke (the reason); the request may or may not have
    /// been executed.
    Disconnected(String),
    /// The server answered with an error status.
    Server { status: Status, message: String },
    /// A key, value or request exceeds the server's limits (not sent).
    TooLarge { what: &'static str, len: usize, max: usize },
    /// The server's response could not be understood.
    Protocol(String),
    /// Bad address or other local IO failure.
    Io(std::io::Error),
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
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Bound on connecting, the handshake, and each request.
    pub timeout: Duration,
    /// Connections per server; requests are spread over them in turn.
    pub connections: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig { timeout: Duration::from_secs(5), connections: 1 }
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

/// A client of one server: a pool of connections, made on first use and
/// replaced when they break.
pub struct Client {
    addr: SocketAddr,
    cfg: ClientConfig,
    pool: Vec<Mutex<Option<Arc<Connection>>>>,
    next: AtomicUsize,
}

impl Client {
    /// A client of `addr` ("host:port"); connects once now so a bad
    /// address or a refused handshake is reported here.
    pub fn connect(addr: impl ToSocketAddrs, cfg: ClientConfig) -> Result<Client> {
        let addr = addr
            .to_socket_addrs()
            .map_err(Error::Io)?
            .next()
            .ok_or_else(|| Error::Io(std::io::Error::other("address resolves to nothing")))?;
        let c = Client::lazy(addr, cfg);
        c.conn()?;
        Ok(c)
    }

    /// A client that connects on first use.
    pub fn lazy(addr: SocketAddr, cfg: ClientConfig) -> Client {
        let n = cfg.connections.max(1);
        Client { addr, cfg, pool: (0..n).map(|_| Mutex::new(None)).collect(), next: AtomicUsize::new(0) }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A live connection of the pool (the next in turn).
    pub fn conn(&self) -> Result<Arc<Connection>> {
        let i = self.next.fetch_add(1, Relaxed) % self.pool.len();
        let mut slot = self.pool[i].lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = slot.as_ref().filter(|c| c.is_alive()) {
            return Ok(c.clone());
        }
        let c = Arc::new(Connection::connect(self.addr, self.cfg.timeout)?);
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Send a raw request on a pooled connection (pipelining: send many,
    /// then wait for each).
    pub fn send(&self, req: &Request) -> Result<Pending> {
        self.conn()?.send(req)
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
    /// Values of several keys, in order.
    pub fn mget(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        as_values(self.send(&Request::MultiGet(keys.to_vec()))?.wait()?, keys.len())
    }
    /// Several operations executed in order on the server (not atomic).
    pub fn batch(&self, ops: &[BatchOp]) -> Result<Vec<BatchResult>> {
        as_batch(self.send(&Request::Batch(ops.to_vec()))?.wait()?, ops)
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
    pub async fn mget_async(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        as_values(self.send(&Request::MultiGet(keys.to_vec()))?.await?, keys.len())
    }
    pub async fn batch_async(&self, ops: &[BatchOp<'_>]) -> Result<Vec<BatchResult>> {
        as_batch(self.send(&Request::Batch(ops.to_vec()))?.await?, ops)
    }
    pub async fn stats_async(&self) -> Result<Vec<(String, String)>> {
        as_stats(self.send(&Request::Stats)?.await?)
    }
}
