//! TLS for the listeners: the server configuration read from PEM files
//! ([`server_config`]) and the TLS half of [`crate::Stream`]
//! ([`TlsStream`]): a TCP socket and a rustls `ServerConnection` driven
//! without blocking on the executor.
//!
//! Invariants:
//! - only one task sends on a connection at a time (the protocols' rule
//!   for plain sockets too), and every send returns only once the records
//!   it made are all on the socket: no ciphertext waits in a buffer while
//!   the connection waits for its client;
//! - receives never write to the socket (what rustls queues while reading,
//!   such as an answer to a key update, leaves with the next send);
//! - the connection's `RefCell` is never borrowed across an await.
//!
//! The handshake runs on the executor that serves the connection, before
//! the protocol sees it, bounded by [`HANDSHAKE_TIMEOUT`].

use granary_rt::net::TcpStream;
use granary_rt::IoBuf;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use std::cell::{Cell, RefCell};
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How long a client has to complete the TLS handshake after it connects;
/// then the connection is closed (counted in `ssl_handshake_errors`).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Plaintext encrypted by one [`TlsStream::send_from`]: a larger buffer is
/// sent in pieces of this size, so a send holds at most this much
/// ciphertext besides the caller's buffer.
pub const SEND_CHUNK_BYTES: usize = 64 * 1024;

/// A listener's TLS settings, shared by its connections.
pub type TlsConfig = Arc<ServerConfig>;

/// The crypto provider: rustls's `ring` one.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Read a PEM file whole, naming it (and what it is for) in the error.
fn read_pem(what: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("TLS {what} {}: cannot read it: {e}", path.display()))
}

/// The certificates of a PEM file (at least one).
fn certificates(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read_pem(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("TLS {what} {}: not valid PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("TLS {what} {}: no certificate in it (a PEM `CERTIFICATE` block)", path.display()));
    }
    Ok(certs)
}

/// The TLS settings of a listener from its certificate chain, private key
/// and, when `ca` is given, the CA bundle client certificates must chain
/// to (a client without a certificate, or with one the bundle does not
/// vouch for, fails the handshake). Every file is read and checked now: a
/// missing, unreadable or invalid one is an error naming it, and the
/// certificate must match the key.
pub fn server_config(cert: &Path, key: &Path, ca: Option<&Path>) -> Result<TlsConfig, String> {
    let chain = certificates("certificate", cert)?;
    let key_pem = read_pem("key", key)?;
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        format!(
            "TLS key {}: no private key in it (a PEM `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY` block): {e}",
            key.display()
        )
    })?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in certificates("CA bundle", ca)? {
                roots.add(c).map_err(|e| format!("TLS CA bundle {}: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| format!("TLS CA bundle {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(chain, key_der)
        .map_err(|e| format!("TLS certificate {} and key {}: {e}", cert.display(), key.display()))?;
    let config = Arc::new(config);
    // Every connection starts one: a configuration that cannot is refused
    // now, not at each accept.
    ServerConnection::new(config.clone()).map_err(|e| format!("TLS: {e}"))?;
    Ok(config)
}

/// The socket as rustls's `Read` and `Write`, without waiting: a read or a
/// write the socket cannot take now is `WouldBlock`.
struct Direct<'a>(&'a TcpStream);

impl Read for Direct<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_recv(buf)
    }
}

impl Write for Direct<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_send(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// An error of the TLS protocol, as an I/O error.
fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// A TLS connection: the socket and its rustls state.
pub struct TlsStream {
    tcp: TcpStream,
    conn: RefCell<ServerConnection>,
    /// The socket reached its end of stream.
    eof: Cell<bool>,
}

impl TlsStream {
    /// Complete the server side of the handshake on `tcp`, within
    /// [`HANDSHAKE_TIMEOUT`]. The stream comes back also when the
    /// handshake failed, for the caller to choose when its socket closes.
    pub(crate) async fn accept(tcp: TcpStream, config: &TlsConfig) -> (TlsStream, io::Result<()>) {
        let mut conn =
            ServerConnection::new(config.clone()).expect("server_config() started one from this configuration");
        // What a send encrypts is bounded by SEND_CHUNK_BYTES instead.
        conn.set_buffer_limit(None);
        let s = TlsStream { tcp, conn: RefCell::new(conn), eof: Cell::new(false) };
        let r = match granary_rt::timeout(HANDSHAKE_TIMEOUT, s.handshake()).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "no TLS handshake within the timeout")),
        };
        (s, r)
    }

    async fn handshake(&self) -> io::Result<()> {
        loop {
            self.flush().await?;
            if !self.conn.borrow().is_handshaking() {
                return Ok(());
            }
            let read = self.conn.borrow_mut().read_tls(&mut Direct(&self.tcp));
            match read {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed during the TLS handshake")),
                Ok(_) => {
                    let processed = self.conn.borrow_mut().process_new_packets().map(|_| ());
                    if let Err(e) = processed {
                        // The alert rustls queued tells the client why.
                        let _ = self.flush().await;
                        return Err(tls_error(e));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.tcp.readable().await?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The socket under the TLS.
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Send every record rustls has queued: directly while the socket
    /// takes them, the rest through the ring (waiting for room).
    async fn flush(&self) -> io::Result<()> {
        loop {
            let rest = {
                let mut conn = self.conn.borrow_mut();
                if !conn.wants_write() {
                    return Ok(());
                }
                match conn.write_tls(&mut Direct(&self.tcp)) {
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        let mut rest = Vec::new();
                        while conn.wants_write() {
                            conn.write_tls(&mut rest)?;
                        }
                        rest
                    }
                    Err(e) => return Err(e),
                }
            };
            self.tcp.send_all(rest).await.0?;
        }
    }

    /// Whether a receive would find something without reading the socket:
    /// decrypted data, the client's close, or the end of the socket.
    fn has_buffered(&self) -> bool {
        if self.eof.get() {
            return true;
        }
        match self.conn.borrow_mut().process_new_packets() {
            Ok(state) => state.plaintext_bytes_to_read() > 0 || state.peer_has_closed(),
            Err(_) => true,
        }
    }

    /// Wait until a receive will find something (or the socket fails).
    pub async fn readable(&self) -> io::Result<()> {
        if self.has_buffered() {
            return Ok(());
        }
        self.tcp.readable().await
    }

    /// Decrypted bytes into `buf` without waiting: the count, 0 at the end
    /// (the client's close_notify, or its socket closing), `WouldBlock`
    /// when no whole record has come, `InvalidData` for a TLS error.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut conn = self.conn.borrow_mut();
        loop {
            match conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // The socket closed without a close_notify: an end too.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            if self.eof.get() {
                return Ok(0);
            }
            match conn.read_tls(&mut Direct(&self.tcp)) {
                Ok(0) => self.eof.set(true),
                Ok(_) => {
                    conn.process_new_packets().map_err(tls_error)?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Receive decrypted bytes into `buf` (its whole length), waiting at
    /// most `idle` (if given) for each read of the socket: the count, 0 at
    /// the end, or `Err(Elapsed)`.
    pub async fn recv_within<B: IoBuf>(
        &self,
        mut buf: B,
        idle: Option<Duration>,
    ) -> Result<(io::Result<usize>, B), granary_rt::Elapsed> {
        loop {
            let len = buf.buf_len();
            // SAFETY: an IoBuf's pointer is valid for reads and writes of
            // buf_len() bytes while it lives; the slice ends before `buf`
            // is touched again.
            let dst = unsafe { std::slice::from_raw_parts_mut(buf.stable_ptr(), len) };
            match self.try_recv(dst) {
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                r => return Ok((r, buf)),
            }
            let waited = match idle {
                None => self.tcp.readable().await,
                Some(d) => granary_rt::timeout(d, self.tcp.readable()).await?,
            };
            if let Err(e) = waited {
                return Ok((Err(e), buf));
            }
        }
    }

    /// Encrypt and send `buf[from..]`, at most [`SEND_CHUNK_BYTES`] of
    /// it; returns the count of plaintext bytes sent once all their
    /// records are on the socket.
    pub async fn send_from<B: IoBuf>(&self, mut buf: B, from: usize) -> (io::Result<usize>, B) {
        assert!(from <= buf.buf_len(), "send_from past the end of the buffer");
        let n = (buf.buf_len() - from).min(SEND_CHUNK_BYTES);
        // SAFETY: an IoBuf's pointer is valid for buf_len() bytes while it
        // lives and from + n <= buf_len(); the slice ends before `buf` is
        // touched again.
        let plain = unsafe { std::slice::from_raw_parts(buf.stable_ptr().add(from), n) };
        if let Err(e) = self.conn.borrow_mut().writer().write_all(plain) {
            return (Err(e), buf);
        }
        (self.flush().await.map(|()| n), buf)
    }

    /// Encrypt and send all of `buf`.
    pub async fn send_all<B: IoBuf>(&self, mut buf: B) -> (io::Result<()>, B) {
        let mut off = 0;
        while off < buf.buf_len() {
            let (r, b) = self.send_from(buf, off).await;
            buf = b;
            match r {
                Ok(n) => off += n,
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(()), buf)
    }

    /// Tell the client this is the end (a close_notify, if the socket
    /// takes it now), then shut down the socket's writing half.
    pub fn shutdown_write(&self) -> io::Result<()> {
        self.close_notify();
        self.tcp.shutdown_write()
    }

    /// Queue a close_notify and send what the socket takes now.
    fn close_notify(&self) {
        let Ok(mut conn) = self.conn.try_borrow_mut() else { return };
        if conn.is_handshaking() {
            return;
        }
        conn.send_close_notify();
        while conn.wants_write() {
            if conn.write_tls(&mut Direct(&self.tcp)).is_err() {
                break;
            }
        }
    }
}

impl Drop for TlsStream {
    fn drop(&mut self) {
        self.close_notify();
    }
}
