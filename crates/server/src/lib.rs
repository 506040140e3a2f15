//! The listener and connection lifecycle every protocol server shares
//! (memcache, native, and the ones that follow): a [`Listener`] accepts on
//! one executor, admits connections in the order they came, refuses those
//! over the connection limit, hands the rest to the executors in turn, and
//! on shutdown drains them; a [`Session`] is one connection's transport
//! ([`Stream`]: plain TCP, or TLS when the listener has a [`tls`]
//! configuration, its handshake done before the protocol sees the
//! connection) with the idle timeout and the lifecycle counters applied.
//!
//! A protocol plugs in by implementing [`Protocol`]: how to serve one
//! admitted connection, and how to tell one over the limit why it is
//! refused. Everything else (accept errors, connection counting and
//! registration, the order of admission, the spread over executors, the
//! drain) is here, once; and [`auth`], the credentials every protocol
//! checks.
//!
//! Invariants:
//! - a connection is counted and registered before its task starts and
//!   deregistered before its socket closes, so a draining shutdown never
//!   touches a reused descriptor and `curr_connections` is exact;
//! - a limit refuses the newest connections, never one accepted before them
//!   (admission happens in accept order, on the accepting executor);
//! - once stopping, the accept loop ends and a session reads no more: what
//!   a connection has read is executed and answered, then it closes;
//! - a connection that ends with input unread closes by a half-close, then
//!   reads and drops what its client still sends (bounded: [`LINGER_TIME`],
//!   [`LINGER_BYTES`]), so the replies it sent reach the client: closed
//!   with input unread, the kernel would reset the connection and drop the
//!   replies not yet delivered.

pub mod auth;
mod stream;
pub mod tls;

pub use stream::Stream;

use granary_rt::metrics::Registry;
use granary_rt::net::{Admitted, Connections, TcpListener, TcpStream};
use granary_rt::{Runtime, Spawner};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// How long [`Listener::shutdown`] waits for connections to finish the
/// requests they are executing before it closes them.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an accept loop waits after a failed accept (EMFILE, ENFILE,
/// ENOBUFS) before it tries again: the failure is logged, not spun on.
pub const ACCEPT_RETRY: Duration = Duration::from_millis(10);

/// Connections over the limit a listener refuses at once with its
/// protocol's words (which may wait for a TLS handshake or the client's
/// hello, seconds): more are closed without a word, so a flood of them
/// holds no more descriptors than the limit and this.
pub const REFUSING_MAX: u64 = 64;

/// Bytes read from a socket at a time by [`Session::recv_into`], into one
/// chunk per executor thread (shared by its connections: a read never
/// waits while it holds the chunk).
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Input buffer a connection keeps while it waits for its client with
/// nothing left to process: a larger one is freed (an idle connection
/// holds no read buffer to speak of).
pub const INPUT_KEEP_BYTES: usize = 4096;

/// How long a connection that is closing keeps reading, and dropping,
/// what its client still sends ([`linger`]), at most.
pub const LINGER_TIME: Duration = Duration::from_secs(2);

/// How much a closing connection reads and drops at most ([`linger`]):
/// a client that sends more than this after its connection ends is reset.
pub const LINGER_BYTES: usize = 1 << 20;

/// Reply buffer a connection keeps while it waits for its client, for the
/// protocols to apply the same rule to their output as
/// [`INPUT_KEEP_BYTES`] to their input.
pub const OUTPUT_KEEP_BYTES: usize = 4096;

thread_local! {
    /// The executor thread's read chunk ([`Session::recv_into`]).
    static READ_CHUNK: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0u8; READ_CHUNK_BYTES].into_boxed_slice());
}

/// What the lifecycle enforces for one listener.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    /// Simultaneous connections; more are refused ([`Protocol::refuse`]).
    pub max_connections: usize,
    /// Close a connection that sends nothing for this long; None = never.
    pub idle_timeout: Option<Duration>,
    /// The protocol's name in logs ("memcache", "native").
    pub name: &'static str,
    /// Speak TLS with these settings (docs/SECURITY.md); None: plain TCP.
    pub tls: Option<tls::TlsConfig>,
}

/// The lifecycle's counters of one listener.
#[derive(Debug, Default)]
pub struct ListenerStats {
    /// Open connections, for the drain and `curr_connections`.
    pub connections: Arc<Connections>,
    /// Connections served since the start.
    pub total_connections: AtomicU64,
    /// Connections refused by the connection limit.
    pub rejected_connections: AtomicU64,
    /// Connections closed by the idle timeout.
    pub idle_kicks: AtomicU64,
    /// Bytes received from clients.
    pub bytes_read: AtomicU64,
    /// TLS handshakes that failed or timed out (the connection was closed).
    pub tls_handshake_errors: AtomicU64,
    /// Connections over the limit being told so now ([`REFUSING_MAX`]).
    pub refusing: AtomicU64,
}

impl ListenerStats {
    /// The lifecycle's figures, with memcached's `stats` names, exported
    /// to Prometheus as `granary_<protocol>_connections`,
    /// `..._connections_total`, `..._rejected_connections_total` and
    /// `..._idle_kicks_total`, and `ssl_handshake_errors` (memcached's
    /// name) as `..._tls_handshake_errors_total` (bytes read go with each
    /// protocol's bytes written).
    pub fn register(&self, protocol: &str, r: &mut Registry) {
        let family = |f: &str| format!("granary_{protocol}_{f}");
        r.gauge("curr_connections", family("connections"), "Open connections.", self.connections.open() as u64)
            .counter(
                "total_connections",
                family("connections_total"),
                "Connections accepted.",
                self.total_connections.load(Relaxed),
            )
            .counter(
                "rejected_connections",
                family("rejected_connections_total"),
                "Connections refused at the connection limit.",
                self.rejected_connections.load(Relaxed),
            )
            .counter(
                "idle_kicks",
                family("idle_kicks_total"),
                "Connections closed by the idle timeout.",
                self.idle_kicks.load(Relaxed),
            )
            .counter(
                "ssl_handshake_errors",
                family("tls_handshake_errors_total"),
                "TLS handshakes that failed or timed out.",
                self.tls_handshake_errors.load(Relaxed),
            );
    }
}

/// A protocol served by a [`Listener`]. Its futures run on one executor and
/// need not be `Send`; the protocol itself is shared by every executor.
pub trait Protocol: Send + Sync + 'static {
    /// Serve one admitted connection until it ends (closed by the client,
    /// an error, the idle timeout, or a drain).
    fn serve(self: Arc<Self>, session: Session) -> impl Future<Output = ()> + 'static;

    /// Tell a connection over the limit why it is refused (it is closed
    /// after; under TLS the handshake was done first).
    fn refuse(self: Arc<Self>, stream: Rc<Stream>) -> impl Future<Output = ()> + 'static;
}

/// One connection: its socket, shared with the protocol's tasks, and the
/// lifecycle rules for reading it.
pub struct Session {
    stream: Rc<Stream>,
    idle_timeout: Option<Duration>,
    stats: Arc<ListenerStats>,
    /// The last read filled the chunk (or none was made yet): more is
    /// likely waiting, so [`Session::recv_into`] reads before it polls.
    read_first: std::cell::Cell<bool>,
}

/// How a [`Session::recv`] ended without data.
#[derive(Debug)]
pub enum RecvEnd {
    /// The client closed its side, or the listener is draining.
    Closed,
    /// Nothing arrived for the idle timeout (counted in `idle_kicks`).
    Idle,
    /// The socket failed.
    Error(io::Error),
}

impl Session {
    /// The transport, to send on (and for zero-copy receives into a
    /// record buffer: see [`Session::idle_timeout`]).
    pub fn stream(&self) -> &Rc<Stream> {
        &self.stream
    }

    /// The idle timeout receives must honour.
    pub fn idle_timeout(&self) -> Option<Duration> {
        self.idle_timeout
    }

    /// True once the listener is draining: the session should finish what
    /// it has read and read no more.
    pub fn stopping(&self) -> bool {
        self.stats.connections.stopping()
    }

    /// Count bytes received outside [`Session::recv`] (a zero-copy receive).
    pub fn count_read(&self, n: usize) {
        self.stats.bytes_read.fetch_add(n as u64, Relaxed);
    }

    /// Count an idle timeout met outside [`Session::recv`].
    pub fn count_idle_kick(&self) {
        self.stats.idle_kicks.fetch_add(1, Relaxed);
    }

    /// Receive what the client sent, appended to `input`: `Ok(n)` with
    /// `n > 0` bytes, or how the connection ended. A draining listener
    /// ends the session here, before it reads more.
    ///
    /// No buffer is held while the client sends nothing: the socket is
    /// read directly into the executor's [`READ_CHUNK_BYTES`] chunk when
    /// it has data, and only what came is copied into `input`. Before
    /// waiting, an `input` with nothing left in it gives back an
    /// allocation over [`INPUT_KEEP_BYTES`], so an idle connection's
    /// memory is its state, not its buffers (docs/MEMCACHE.md,
    /// "Connections and memory").
    ///
    /// A client that answers each reply with its next request has sent
    /// nothing yet when its connection comes here: it polls first (a read
    /// now would only find nothing). After a read that filled the chunk,
    /// more is likely waiting: it reads first.
    pub async fn recv_into(&self, input: &mut Vec<u8>) -> Result<usize, RecvEnd> {
        let mut poll_first = !self.read_first.get();
        loop {
            if self.stopping() {
                return Err(RecvEnd::Closed);
            }
            if std::mem::take(&mut poll_first) {
                if input.is_empty() && input.capacity() > INPUT_KEEP_BYTES {
                    *input = Vec::new();
                }
                self.wait_readable().await?;
                continue;
            }
            let got = READ_CHUNK.with(|c| {
                let mut c = c.borrow_mut();
                let r = self.stream.try_recv(&mut c);
                if let Ok(n) = r {
                    input.extend_from_slice(&c[..n]);
                }
                r
            });
            match got {
                Ok(0) => return Err(RecvEnd::Closed),
                Ok(n) => {
                    self.count_read(n);
                    self.read_first.set(n == READ_CHUNK_BYTES);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => poll_first = true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(RecvEnd::Error(e)),
            }
        }
    }

    /// Wait until the socket is readable, within the idle timeout.
    async fn wait_readable(&self) -> Result<(), RecvEnd> {
        let waited = match self.idle_timeout {
            None => self.stream.readable().await,
            Some(d) => match granary_rt::timeout(d, self.stream.readable()).await {
                Ok(r) => r,
                Err(_) => {
                    self.count_idle_kick();
                    return Err(RecvEnd::Idle);
                }
            },
        };
        waited.map_err(RecvEnd::Error)
    }

    /// Receive into `buf` (its whole length): `Ok((n, buf))` with `n > 0`
    /// bytes, or how the connection ended. A draining listener ends the
    /// session here, before it reads more.
    pub async fn recv(&self, buf: Vec<u8>) -> Result<(usize, Vec<u8>), (RecvEnd, Option<Vec<u8>>)> {
        if self.stopping() {
            return Err((RecvEnd::Closed, Some(buf)));
        }
        match self.stream.recv_within(buf, self.idle_timeout).await {
            Err(_) => {
                self.count_idle_kick();
                Err((RecvEnd::Idle, None))
            }
            Ok((Ok(0), b)) => Err((RecvEnd::Closed, Some(b))),
            Ok((Ok(n), b)) => {
                self.count_read(n);
                Ok((n, b))
            }
            Ok((Err(e), b)) => Err((RecvEnd::Error(e), Some(b))),
        }
    }
}

/// A running listener.
pub struct Listener {
    stats: Arc<ListenerStats>,
    addr: SocketAddr,
    socket: std::net::TcpListener,
    /// Keeps the runtime alive while the listener runs (it may be shared).
    rt: Option<Arc<Runtime>>,
    name: &'static str,
}

impl Listener {
    /// Serve `protocol` on `socket` (bound by the caller, so it can bind
    /// every listener before doing anything that must be undone), accepting
    /// on executor 0 of `rt`.
    pub fn start<P: Protocol>(
        rt: Arc<Runtime>,
        socket: std::net::TcpListener,
        cfg: ListenerConfig,
        protocol: Arc<P>,
        stats: Arc<ListenerStats>,
    ) -> io::Result<Listener> {
        let addr = socket.local_addr()?;
        let accepting = TcpListener::from_std(socket.try_clone()?);
        let name = cfg.name;
        rt.spawn_on(0, accept_loop(accepting, cfg, protocol, stats.clone(), rt.spawner()));
        tracing::debug!(%addr, protocol = name, "listening");
        Ok(Listener { stats, addr, socket, rt: Some(rt), name })
    }

    /// The address it listens on (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The lifecycle's counters.
    pub fn stats(&self) -> &Arc<ListenerStats> {
        &self.stats
    }

    /// Stop and drain: no new connections; every connection finishes the
    /// requests it has read (their replies are sent), then sees the end of
    /// its input and closes. Waits at most `timeout`; connections still
    /// open then are shut down and given [`granary_rt::net::DRAIN_GRACE`]
    /// more to end (a write cancelled with them after that was never
    /// acknowledged). Returns how many were left at `timeout`.
    pub fn shutdown(mut self, timeout: Duration) -> usize {
        let left = self.stats.connections.drain(self.socket.as_raw_fd(), timeout);
        if left > 0 {
            tracing::warn!(
                connections = left,
                protocol = self.name,
                "connections still busy after the drain timeout are closed"
            );
        }
        self.rt.take();
        left
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // The accept loop ends (it may run on a runtime shared with others).
        self.stats.connections.stop_accepting(self.socket.as_raw_fd());
        self.rt.take();
    }
}

/// The accept loop: connections are admitted here, in the order the kernel
/// queued them (so a limit refuses the latest), then served by the
/// executors in turn, as memcached's listener hands them to its workers
/// (left to the kernel, an accept loop per executor on a shared socket
/// sends most connections to one executor).
async fn accept_loop<P: Protocol>(
    listener: TcpListener,
    cfg: ListenerConfig,
    protocol: Arc<P>,
    stats: Arc<ListenerStats>,
    spawner: Spawner,
) {
    for turn in 0usize.. {
        let accepted = listener.accept().await;
        if stats.connections.stopping() {
            return;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, protocol = cfg.name, "accept failed");
                granary_rt::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let (admitted, n) = stats.connections.admit(stream.raw_fd());
        // Connections being refused hold their descriptors (and count as
        // open) for seconds, but are not served: the limit is on the
        // others.
        let serving = n.saturating_sub(stats.refusing.load(Relaxed) as usize);
        let refusal = match serving > cfg.max_connections {
            false => None,
            true => match Refusal::take(&stats) {
                Some(r) => Some(r),
                None => {
                    // Closed at once, without a word (the registration
                    // first).
                    stats.rejected_connections.fetch_add(1, Relaxed);
                    drop(admitted);
                    drop(stream);
                    continue;
                }
            },
        };
        let task = ConnectionTask {
            admitted,
            stream,
            over_limit: refusal,
            idle_timeout: cfg.idle_timeout,
            tls: cfg.tls.clone(),
            name: cfg.name,
            protocol: protocol.clone(),
            stats: stats.clone(),
        };
        // Connection tasks are not Send (the stream is shared with Rc):
        // what crosses executors is the accepted stream; its task starts
        // there.
        let core = turn % spawner.cores();
        if granary_rt::current_core() == Some(core) {
            granary_rt::spawn(task.run());
        } else {
            spawner.spawn_on(core, async move {
                granary_rt::spawn(task.run());
            });
        }
    }
}

/// An accepted connection on its way to its executor.
struct ConnectionTask<P> {
    // Declared before the stream: dropped (deregistered) before it closes,
    // also when the task is dropped unpolled by a stopping runtime.
    admitted: Admitted,
    stream: TcpStream,
    /// Over the limit: to be refused (the refusal counted while it runs).
    over_limit: Option<Refusal>,
    idle_timeout: Option<Duration>,
    tls: Option<tls::TlsConfig>,
    name: &'static str,
    protocol: Arc<P>,
    stats: Arc<ListenerStats>,
}

impl<P: Protocol> ConnectionTask<P> {
    async fn run(self) {
        let ConnectionTask { admitted, stream, over_limit, idle_timeout, tls, name, protocol, stats } = self;
        let (admitted, stream) = match tls {
            None => (admitted, Stream::Plain(stream)),
            Some(config) => {
                // The handshake owns the socket: it holds the registration
                // too, so that dropped midway (a runtime torn down) the
                // registration goes first.
                let mut hs =
                    Handshake { registered: Some(admitted), fut: Box::pin(tls::TlsStream::accept(stream, &config)) };
                let (t, r) = (&mut hs).await;
                let admitted = hs.registered.take().expect("held until the handshake ends");
                match r {
                    Ok(()) => (admitted, Stream::Tls(Box::new(t))),
                    Err(e) => {
                        stats.tls_handshake_errors.fetch_add(1, Relaxed);
                        tracing::debug!(error = %e, protocol = name, "TLS handshake failed; connection closed");
                        // A refusal ends before its registration, so the
                        // accept loop never sees it gone from the refusals
                        // but still open (it would serve one over the limit).
                        drop(over_limit);
                        drop(admitted);
                        drop(t);
                        return;
                    }
                }
            }
        };
        // However the task ends (the protocol's clones of the stream are
        // gone once its future has), the registration goes first.
        let held = Held { _registered: admitted, stream: Rc::new(stream) };
        if let Some(_refusal) = over_limit {
            stats.rejected_connections.fetch_add(1, Relaxed);
            protocol.refuse(held.stream.clone()).await;
            linger(&held.stream).await;
            return;
        }
        stats.total_connections.fetch_add(1, Relaxed);
        // A shutdown that ran before the registration missed this one.
        if !stats.connections.stopping() {
            let read_first = std::cell::Cell::new(true);
            protocol.serve(Session { stream: held.stream.clone(), idle_timeout, stats, read_first }).await;
        }
        linger(&held.stream).await;
    }
}

/// End a connection the way that keeps its replies: a socket closed with
/// input it never read makes the kernel send a reset, and a reset drops
/// what the client had not received yet (the replies before an error that
/// ends the connection, a QUIT with more pipelined after it, a refusal
/// sent to a client that spoke first). So where input is waiting unread:
/// half-close (the client reads every reply, then the end), then read and
/// drop what still comes until the client closes its side, for
/// [`LINGER_TIME`] and [`LINGER_BYTES`] at most; the socket then closes
/// with nothing unread, or resets a client that kept sending. Where
/// nothing is waiting (a client that closed first, or one waiting for a
/// reply) it closes at once: one read more.
async fn linger(stream: &Stream) {
    let drop_input = || READ_CHUNK.with(|c| stream.try_recv(&mut c.borrow_mut()));
    let mut left = match drop_input() {
        Ok(n) if n > 0 => LINGER_BYTES.saturating_sub(n),
        _ => return,
    };
    if left == 0 || stream.shutdown_write().is_err() {
        return;
    }
    let deadline = std::time::Instant::now() + LINGER_TIME;
    loop {
        match drop_input() {
            Ok(0) => return,
            Ok(n) if n >= left => return,
            Ok(n) => left -= n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let rest = deadline.saturating_duration_since(std::time::Instant::now());
                if rest.is_zero() || !matches!(granary_rt::timeout(rest, stream.readable()).await, Ok(Ok(()))) {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// One of the [`REFUSING_MAX`] refusals a listener runs at once, counted
/// in [`ListenerStats::refusing`] until it ends.
struct Refusal(Arc<ListenerStats>);

impl Refusal {
    /// Taken by the accept loop (in accept order); None at the cap.
    fn take(stats: &Arc<ListenerStats>) -> Option<Refusal> {
        if stats.refusing.fetch_add(1, Relaxed) >= REFUSING_MAX {
            stats.refusing.fetch_sub(1, Relaxed);
            return None;
        }
        Some(Refusal(stats.clone()))
    }
}

impl Drop for Refusal {
    fn drop(&mut self) {
        self.0.refusing.fetch_sub(1, Relaxed);
    }
}

/// A TLS handshake with the registration of the connection whose socket it
/// owns: dropped before it ends, the registration goes first (`drop` runs
/// before the fields drop).
struct Handshake<'a> {
    registered: Option<Admitted>,
    fut: std::pin::Pin<Box<dyn std::future::Future<Output = (tls::TlsStream, std::io::Result<()>)> + 'a>>,
}

impl std::future::Future for Handshake<'_> {
    type Output = (tls::TlsStream, std::io::Result<()>);
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        self.fut.as_mut().poll(cx)
    }
}

impl Drop for Handshake<'_> {
    fn drop(&mut self) {
        self.registered.take();
    }
}

/// A served connection's registration and its socket. Fields drop in
/// declaration order: the registration goes before the last reference to
/// the socket closes it (a shutdown meanwhile never meets a descriptor
/// number the kernel may have given to another connection).
struct Held {
    _registered: Admitted,
    stream: Rc<Stream>,
}
