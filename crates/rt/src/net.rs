//! TCP on the executor's ring: accept, connect, recv and send as io_uring
//! operations owning their buffers (see `op.rs`); and [`Connections`], a
//! listener's registry of open connections for a draining shutdown. Sockets are ordinary
//! blocking-mode descriptors; io_uring waits for readiness internally.
//! A connection that should hold no buffer while it waits polls for
//! readability ([`TcpStream::readable`]) and then reads what came without
//! blocking ([`TcpStream::try_recv`]).
//! Only usable on an executor thread.

use std::collections::HashSet;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use io_uring::{opcode, types};

use crate::op::{result, IoBuf, Op};

/// A listening socket.
pub struct TcpListener {
    inner: std::net::TcpListener,
}

/// A connected socket.
pub struct TcpStream {
    inner: std::net::TcpStream,
}

/// A socket address in the kernel's layout, on the heap for the kernel.
struct RawAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl RawAddr {
    fn empty() -> Box<RawAddr> {
        // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
        Box::new(RawAddr { storage: unsafe { zeroed() }, len: size_of::<libc::sockaddr_storage>() as libc::socklen_t })
    }

    fn from(addr: SocketAddr) -> Box<RawAddr> {
        let mut r = RawAddr::empty();
        match addr {
            SocketAddr::V4(a) => {
                // SAFETY: sockaddr_in fits in sockaddr_storage, which is aligned for it.
                let sin = unsafe { &mut *(&mut r.storage as *mut _ as *mut libc::sockaddr_in) };
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = a.port().to_be();
                sin.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) };
                r.len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            }
            SocketAddr::V6(a) => {
                // SAFETY: as above, for sockaddr_in6.
                let sin6 = unsafe { &mut *(&mut r.storage as *mut _ as *mut libc::sockaddr_in6) };
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = a.port().to_be();
                sin6.sin6_addr = libc::in6_addr { s6_addr: a.ip().octets() };
                sin6.sin6_flowinfo = a.flowinfo();
                sin6.sin6_scope_id = a.scope_id();
                r.len = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            }
        }
        r
    }

    fn to_socket_addr(&self) -> Option<SocketAddr> {
        match self.storage.ss_family as i32 {
            libc::AF_INET => {
                // SAFETY: the kernel wrote a sockaddr_in (family says so).
                let sin = unsafe { &*(&self.storage as *const _ as *const libc::sockaddr_in) };
                let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
            }
            libc::AF_INET6 => {
                // SAFETY: the kernel wrote a sockaddr_in6.
                let s = unsafe { &*(&self.storage as *const _ as *const libc::sockaddr_in6) };
                let ip = std::net::Ipv6Addr::from(s.sin6_addr.s6_addr);
                Some(SocketAddr::V6(SocketAddrV6::new(ip, u16::from_be(s.sin6_port), s.sin6_flowinfo, s.sin6_scope_id)))
            }
            _ => None,
        }
    }
}

/// The ports tests and benchmarks give the servers they start: below the
/// kernel's ephemeral range (32768 and up), so a server's port is never
/// one the kernel could hand a client as its own end of a connection (a
/// client connected to itself would look like a server answering).
pub const LOW_PORTS: std::ops::Range<u16> = 20000..32768;

/// Bind a listener on `ip` at a free port of [`LOW_PORTS`]. Candidates
/// start at an offset drawn from the process id and every call moves on
/// to the next candidate, so tests running in parallel in one process, or
/// in processes started one after another, rarely try the same port.
pub fn bind_low_port(ip: std::net::IpAddr) -> io::Result<std::net::TcpListener> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let span = (LOW_PORTS.end - LOW_PORTS.start) as usize;
    let base = (std::process::id() as usize).wrapping_mul(7919) % span;
    let mut last = None;
    for _ in 0..512 {
        let n = NEXT.fetch_add(1, Relaxed);
        let port = LOW_PORTS.start + ((base + n * 13) % span) as u16;
        match std::net::TcpListener::bind(SocketAddr::new(ip, port)) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::AddrInUse, "no free port")))
}

/// A port of [`LOW_PORTS`] free on 127.0.0.1 a moment ago, for a server
/// started in another process (it binds the port itself).
pub fn free_low_port() -> io::Result<u16> {
    Ok(bind_low_port(std::net::IpAddr::from([127, 0, 0, 1]))?.local_addr()?.port())
}

/// Bind a listening socket for a server, with an error that names the
/// address ("cannot listen on 127.0.0.1:11211: Address in use").
pub fn bind_listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    BoundSocket::bind(addr)?.listen()
}

/// Connections a listening socket queues before the server accepts them.
pub const LISTEN_BACKLOG: i32 = 1024;

/// A TCP socket bound to its address but not listening yet: the address is
/// taken (no other process can bind it) while connections to it are still
/// refused. A server binds every address this way before it does anything
/// that must be undone when one is in use (creating a data file), and
/// listens once it is ready to serve, so a client's successful connect
/// means the server is up.
#[derive(Debug)]
pub struct BoundSocket {
    fd: OwnedFd,
    addr: SocketAddr,
}

impl BoundSocket {
    /// Bind `addr` (with SO_REUSEADDR, as std's listeners have it).
    pub fn bind(addr: SocketAddr) -> io::Result<BoundSocket> {
        let named = |e: io::Error| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}"));
        let family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
        // SAFETY: socket(2) with constant arguments; the descriptor it
        // returns is owned by the OwnedFd below.
        let raw = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(named(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a descriptor this call just opened, owned by no one else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let one: libc::c_int = 1;
        // SAFETY: setsockopt reads `one` (a c_int, its length given) for the call.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                (&one as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(named(io::Error::last_os_error()));
        }
        let raw_addr = RawAddr::from(addr);
        // SAFETY: bind reads `raw_addr.len` bytes of the address storage.
        let r = unsafe {
            libc::bind(fd.as_raw_fd(), (&raw_addr.storage as *const libc::sockaddr_storage).cast(), raw_addr.len)
        };
        if r != 0 {
            return Err(named(io::Error::last_os_error()));
        }
        let mut local = RawAddr::empty();
        // SAFETY: getsockname writes at most `local.len` bytes into the storage.
        let r = unsafe {
            libc::getsockname(
                fd.as_raw_fd(),
                (&mut local.storage as *mut libc::sockaddr_storage).cast(),
                &mut local.len,
            )
        };
        let addr = if r == 0 { local.to_socket_addr().unwrap_or(addr) } else { addr };
        Ok(BoundSocket { fd, addr })
    }

    /// The address it is bound to (the port chosen, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Start listening: connections are queued from now on.
    pub fn listen(self) -> io::Result<std::net::TcpListener> {
        // SAFETY: listen(2) on the descriptor this value owns.
        if unsafe { libc::listen(self.fd.as_raw_fd(), LISTEN_BACKLOG) } != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("cannot listen on {}: {e}", self.addr)));
        }
        Ok(std::net::TcpListener::from(self.fd))
    }
}

impl TcpListener {
    /// Bind and listen (backlog 1024), with SO_REUSEADDR as std sets it.
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<TcpListener> {
        Ok(TcpListener { inner: std::net::TcpListener::bind(addr)? })
    }

    /// Use an already listening std socket.
    pub fn from_std(inner: std::net::TcpListener) -> TcpListener {
        TcpListener { inner }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// Accept one connection.
    pub async fn accept(&self) -> io::Result<(TcpStream, Option<SocketAddr>)> {
        let mut addr = RawAddr::empty();
        let sqe = opcode::Accept::new(
            types::Fd(self.inner.as_raw_fd()),
            &mut addr.storage as *mut _ as *mut libc::sockaddr,
            &mut addr.len,
        )
        .flags(libc::SOCK_CLOEXEC)
        .build();
        // SAFETY: the SQE points into `addr`, a box owned by the Op.
        let (res, addr) = unsafe { Op::submit_fd(sqe, addr) }.await;
        let fd = result(res)?;
        // SAFETY: accept returned a new descriptor that we now own.
        let owned = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let inner = std::net::TcpStream::from(owned);
        inner.set_nodelay(true)?;
        Ok((TcpStream { inner }, addr.to_socket_addr()))
    }
}

impl TcpStream {
    /// Connect to `addr`.
    pub async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
        let family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
        // SAFETY: plain socket(2); the result is checked.
        let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = RawAddr::from(addr);
        let sqe =
            opcode::Connect::new(types::Fd(fd), &raw.storage as *const _ as *const libc::sockaddr, raw.len).build();
        // SAFETY: the SQE points into `raw`, a box owned by the Op.
        let (res, _raw) = unsafe { Op::submit(sqe, raw) }.await;
        result(res)?;
        let inner = std::net::TcpStream::from(owned);
        inner.set_nodelay(true)?;
        Ok(TcpStream { inner })
    }

    pub fn from_std(inner: std::net::TcpStream) -> TcpStream {
        TcpStream { inner }
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.peer_addr()
    }

    /// Receive into `buf` (its whole length); Ok(0) at end of stream.
    pub async fn recv<B: IoBuf>(&self, mut buf: B) -> (io::Result<usize>, B) {
        let len = u32::try_from(buf.buf_len()).unwrap_or(u32::MAX);
        let sqe = opcode::Recv::new(types::Fd(self.inner.as_raw_fd()), buf.stable_ptr(), len).build();
        // SAFETY: the SQE points into buf's heap memory, owned by the Op.
        let (res, buf) = unsafe { Op::submit(sqe, buf) }.await;
        (result(res), buf)
    }

    /// Wait until the socket has data to read, its peer closed or reset
    /// it, or it was shut down for reading. Holds no buffer while it
    /// waits: a connection that waits here costs no read buffer (then
    /// [`TcpStream::try_recv`] reads what came).
    pub async fn readable(&self) -> io::Result<()> {
        let events = (libc::POLLIN | libc::POLLRDHUP) as u32;
        let sqe = opcode::PollAdd::new(types::Fd(self.inner.as_raw_fd()), events).build();
        // SAFETY: a poll SQE points into no memory.
        let (res, ()) = unsafe { Op::submit(sqe, ()) }.await;
        result(res).map(|_| ())
    }

    /// Receive what the socket holds now into `buf`, without waiting (a
    /// direct `recv(2)` with MSG_DONTWAIT): the count, 0 at end of stream,
    /// or `WouldBlock`.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for writes of buf.len() bytes for the call.
        let n = unsafe { libc::recv(self.inner.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// [`TcpStream::recv`] that gives up after `idle` (if given) without
    /// data: `Err(Elapsed)`, and the buffer stays with the cancelled
    /// receive until the kernel lets go of it.
    pub async fn recv_within<B: IoBuf>(
        &self,
        buf: B,
        idle: Option<Duration>,
    ) -> Result<(io::Result<usize>, B), crate::Elapsed> {
        match idle {
            None => Ok(self.recv(buf).await),
            Some(d) => crate::timeout(d, self.recv(buf)).await,
        }
    }

    /// Send `buf[from..]` once; returns the count sent.
    pub async fn send_from<B: IoBuf>(&self, mut buf: B, from: usize) -> (io::Result<usize>, B) {
        assert!(from <= buf.buf_len(), "send_from past the end of the buffer");
        let len = u32::try_from(buf.buf_len() - from).unwrap_or(u32::MAX);
        // SAFETY: from <= len, so the pointer stays within (or one past) buf.
        let ptr = unsafe { buf.stable_ptr().add(from) };
        let sqe = opcode::Send::new(types::Fd(self.inner.as_raw_fd()), ptr, len).flags(libc::MSG_NOSIGNAL).build();
        // SAFETY: the SQE points into buf's heap memory, owned by the Op.
        let (res, buf) = unsafe { Op::submit(sqe, buf) }.await;
        (result(res), buf)
    }

    /// Send what the socket takes of `buf` now, without waiting (a direct
    /// `send(2)` with MSG_DONTWAIT): the count sent, or `WouldBlock`. A
    /// reply that fits the socket buffer then costs one system call and no
    /// trip through the ring.
    pub fn try_send(&self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for reads of buf.len() bytes for the call.
        let n = unsafe {
            libc::send(self.inner.as_raw_fd(), buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Send all of `buf`.
    pub async fn send_all<B: IoBuf>(&self, mut buf: B) -> (io::Result<()>, B) {
        let mut off = 0;
        while off < buf.buf_len() {
            let (r, b) = self.send_from(buf, off).await;
            buf = b;
            match r {
                Ok(0) => return (Err(io::ErrorKind::WriteZero.into()), buf),
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(()), buf)
    }

    /// Send all of `buf`: first one direct [`try_send`](Self::try_send)
    /// (most replies fit the socket buffer: one system call, no trip
    /// through the ring), then the rest through the ring, waiting for room
    /// in the socket. False if the connection is gone (an error, or the
    /// socket taking nothing); what was sent is then unknown.
    ///
    /// Once the ring was used (or everything went out directly), `buf` is
    /// left empty, its allocation kept for the next replies when it holds
    /// at most `keep_capacity` bytes, else freed. A failed direct send
    /// leaves `buf` as it was.
    pub async fn send_vec(&self, buf: &mut Vec<u8>, keep_capacity: usize) -> bool {
        if buf.is_empty() {
            return true;
        }
        let n = buf.len();
        let mut off = match self.try_send(buf) {
            Ok(k) => k,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => 0,
            Err(_) => return false,
        };
        let mut out = std::mem::take(buf);
        let mut ok = true;
        while ok && off < n {
            let (r, o) = self.send_from(out, off).await;
            out = o;
            match r {
                Ok(0) => ok = false,
                Ok(k) => off += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => ok = false,
            }
        }
        out.clear();
        if out.capacity() <= keep_capacity {
            *buf = out;
        }
        ok
    }

    /// The socket's descriptor (for `shutdown(2)` from another thread).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.inner.as_raw_fd()
    }

    /// Shut down the writing half (the peer sees end of stream).
    pub fn shutdown_write(&self) -> io::Result<()> {
        self.inner.shutdown(std::net::Shutdown::Write)
    }

    /// Shut down the reading half: a receive waiting here ends (it reads
    /// end of stream), and so does every later one.
    pub fn shutdown_read(&self) -> io::Result<()> {
        self.inner.shutdown(std::net::Shutdown::Read)
    }

    /// Shut down both directions: the peer sees end of stream, and a
    /// receive waiting here ends.
    pub fn shutdown_both(&self) -> io::Result<()> {
        self.inner.shutdown(std::net::Shutdown::Both)
    }
}

/// A stream a receive into an owned buffer can fill within an idle
/// timeout: [`TcpStream`], or a transport over one (the server's TLS), for
/// the zero-copy receives that take either.
pub trait RecvWithin {
    /// Receive into `buf` (its whole length), giving up after `idle` (if
    /// given) without data ([`TcpStream::recv_within`]).
    fn recv_within<B: IoBuf>(
        &self,
        buf: B,
        idle: Option<Duration>,
    ) -> impl std::future::Future<Output = Result<(io::Result<usize>, B), crate::Elapsed>>;
}

impl<T: RecvWithin> RecvWithin for std::rc::Rc<T> {
    fn recv_within<B: IoBuf>(
        &self,
        buf: B,
        idle: Option<Duration>,
    ) -> impl std::future::Future<Output = Result<(io::Result<usize>, B), crate::Elapsed>> {
        (**self).recv_within(buf, idle)
    }
}

impl RecvWithin for TcpStream {
    fn recv_within<B: IoBuf>(
        &self,
        buf: B,
        idle: Option<Duration>,
    ) -> impl std::future::Future<Output = Result<(io::Result<usize>, B), crate::Elapsed>> {
        TcpStream::recv_within(self, buf, idle)
    }
}

/// Raise a high-water mark to `v` (one load when it is not higher).
pub fn raise_high_water(mark: &AtomicU64, v: u64) {
    if v > mark.load(Relaxed) {
        mark.fetch_max(v, Relaxed);
    }
}

/// Adds one to a gauge while it lives: a connection in some state (waiting
/// to send, paused), counted however the task ends, cancellation included.
pub struct GaugeHold<'a>(&'a AtomicU64);

impl<'a> GaugeHold<'a> {
    pub fn new(gauge: &'a AtomicU64) -> GaugeHold<'a> {
        gauge.fetch_add(1, Relaxed);
        GaugeHold(gauge)
    }
}

impl Drop for GaugeHold<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// How long [`Connections::drain`] waits, after its timeout shut the
/// connections left down, for them to end.
pub const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// The open connections of a listener, for a draining shutdown: their
/// count and descriptors, and whether the listener is stopping. Servers
/// keep one per listener and read their `curr_connections` from it.
#[derive(Debug, Default)]
pub struct Connections {
    open: AtomicUsize,
    stopping: AtomicBool,
    fds: Mutex<HashSet<RawFd>>,
}

/// A connection counted and registered in [`Connections`] until dropped.
/// Declare the stream before it, so the descriptor closes only after it is
/// deregistered (a shutdown never touches a reused descriptor). It owns a
/// reference to the set, so it can go with its stream to another core.
pub struct Admitted {
    set: Arc<Connections>,
    fd: RawFd,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        // The order this type asks for: its descriptor is still open (else
        // a shutdown could meet the number given to another socket since).
        // SAFETY: F_GETFD reads a descriptor's flags; on a closed one it
        // fails with EBADF, touching nothing.
        debug_assert!(
            unsafe { libc::fcntl(self.fd, libc::F_GETFD) } != -1,
            "a connection's socket closed before it was deregistered"
        );
        self.set.fds.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.fd);
        self.set.open.fetch_sub(1, Relaxed);
    }
}

impl Connections {
    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Relaxed)
    }

    /// True once the listener is stopping: accept loops end, connections
    /// read no more.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Relaxed)
    }

    /// Count and register the connection on `fd`; also the number open,
    /// this one included (for a connection limit: drop the guard to refuse).
    /// Admit in the order connections were accepted: a limit then refuses
    /// the latest ones, never one accepted before them.
    pub fn admit(self: &Arc<Self>, fd: RawFd) -> (Admitted, usize) {
        self.fds.lock().unwrap_or_else(|e| e.into_inner()).insert(fd);
        let n = self.open.fetch_add(1, Relaxed) + 1;
        (Admitted { set: self.clone(), fd }, n)
    }

    /// Stop accepting on `listener` (a listening socket the caller owns).
    pub fn stop_accepting(&self, listener: RawFd) {
        self.stopping.store(true, Relaxed);
        // SAFETY: shutdown(2) on a descriptor the caller owns; it wakes the
        // accept loops, which see `stopping` and end.
        unsafe { libc::shutdown(listener, libc::SHUT_RDWR) };
    }

    fn shutdown_all(&self, how: i32) {
        for &fd in self.fds.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            // SAFETY: registered descriptors are open: a connection
            // deregisters (under this lock) before its descriptor closes.
            unsafe { libc::shutdown(fd, how) };
        }
    }

    /// Draining stop: no new connections; every connection sees the end of
    /// its input once it has read what was sent, finishes, and closes. Waits
    /// at most `timeout`, then shuts down both directions of the
    /// connections left (a send blocked on a client that does not read
    /// fails) and waits at most [`DRAIN_GRACE`] more for them to end: one
    /// inside a store write finishes it (its IO is on its way) rather than
    /// be dropped midway with its runtime. Returns how many were left at
    /// `timeout`.
    pub fn drain(&self, listener: RawFd, timeout: Duration) -> usize {
        self.stop_accepting(listener);
        self.shutdown_all(libc::SHUT_RD);
        self.wait_closed(Instant::now() + timeout);
        let left = self.open();
        if left > 0 {
            self.shutdown_all(libc::SHUT_RDWR);
            self.wait_closed(Instant::now() + DRAIN_GRACE);
        }
        left
    }

    fn wait_closed(&self, deadline: Instant) {
        while self.open() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}
