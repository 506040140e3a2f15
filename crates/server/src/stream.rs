//! [`Stream`]: a connection's transport as the protocols see it, plain TCP
//! or TLS over TCP, with the socket's method names (`try_send`,
//! `send_from`, `send_vec`, `readable`, `try_recv`, `recv_within`, ...).
//!
//! Invariants: the plain path is the socket's own method behind one match
//! (no copy, no state); the TLS path ([`crate::tls::TlsStream`]) keeps its
//! rules: a send returns once its records are on the socket, a receive
//! never writes. `try_send` on TLS always answers `WouldBlock`, so callers'
//! "direct send, then the rest through the ring" pattern takes the
//! awaiting path, which is the one that can finish sending what it
//! encrypted.

use crate::tls::TlsStream;
use granary_rt::net::TcpStream;
use granary_rt::IoBuf;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

/// A connection's transport.
pub enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP, handshake done.
    Tls(Box<TlsStream>),
}

impl Stream {
    /// The socket under the transport.
    #[inline]
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => t.tcp(),
        }
    }

    /// Whether the connection speaks TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().peer_addr()
    }

    /// The socket's descriptor.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.tcp().raw_fd()
    }

    /// Shut down the writing half (the peer sees end of stream; under TLS
    /// after a close_notify).
    pub fn shutdown_write(&self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.shutdown_write(),
            Stream::Tls(t) => t.shutdown_write(),
        }
    }

    /// Wait until a receive will find data or the end (holds no buffer).
    #[inline]
    pub async fn readable(&self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.readable().await,
            Stream::Tls(t) => t.readable().await,
        }
    }

    /// Receive what has come into `buf` without waiting: the count, 0 at
    /// end of stream, or `WouldBlock`.
    #[inline]
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.try_recv(buf),
            Stream::Tls(t) => t.try_recv(buf),
        }
    }

    /// Receive into `buf` (its whole length); Ok(0) at end of stream.
    pub async fn recv<B: IoBuf>(&self, buf: B) -> (io::Result<usize>, B) {
        match self {
            Stream::Plain(s) => s.recv(buf).await,
            Stream::Tls(t) => match t.recv_within(buf, None).await {
                Ok(r) => r,
                Err(_) => unreachable!("a receive without a timeout does not time out"),
            },
        }
    }

    /// [`Stream::recv`] that gives up after `idle` (if given) without data.
    #[inline]
    pub async fn recv_within<B: IoBuf>(
        &self,
        buf: B,
        idle: Option<Duration>,
    ) -> Result<(io::Result<usize>, B), granary_rt::Elapsed> {
        match self {
            Stream::Plain(s) => s.recv_within(buf, idle).await,
            Stream::Tls(t) => t.recv_within(buf, idle).await,
        }
    }

    /// Send `buf[from..]` (once, or one piece under TLS); returns the
    /// count sent.
    #[inline]
    pub async fn send_from<B: IoBuf>(&self, buf: B, from: usize) -> (io::Result<usize>, B) {
        match self {
            Stream::Plain(s) => s.send_from(buf, from).await,
            Stream::Tls(t) => t.send_from(buf, from).await,
        }
    }

    /// Send what the socket takes of `buf` now, without waiting: the count
    /// sent, or `WouldBlock` (always under TLS: see the module's doc).
    #[inline]
    pub fn try_send(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.try_send(buf),
            Stream::Tls(_) => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Send all of `buf`.
    pub async fn send_all<B: IoBuf>(&self, buf: B) -> (io::Result<()>, B) {
        match self {
            Stream::Plain(s) => s.send_all(buf).await,
            Stream::Tls(t) => t.send_all(buf).await,
        }
    }

    /// Send all of `buf`, then leave it empty, its allocation kept when it
    /// holds at most `keep_capacity` bytes ([`TcpStream::send_vec`]).
    /// False if the connection is gone.
    #[inline]
    pub async fn send_vec(&self, buf: &mut Vec<u8>, keep_capacity: usize) -> bool {
        match self {
            Stream::Plain(s) => s.send_vec(buf, keep_capacity).await,
            Stream::Tls(t) => {
                if buf.is_empty() {
                    return true;
                }
                let (r, mut out) = t.send_all(std::mem::take(buf)).await;
                out.clear();
                if out.capacity() <= keep_capacity {
                    *buf = out;
                }
                r.is_ok()
            }
        }
    }
}

impl granary_rt::net::RecvWithin for Stream {
    fn recv_within<B: IoBuf>(
        &self,
        buf: B,
        idle: Option<Duration>,
    ) -> impl Future<Output = Result<(io::Result<usize>, B), granary_rt::Elapsed>> {
        Stream::recv_within(self, buf, idle)
    }
}
