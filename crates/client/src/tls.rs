//! TLS for the native protocol's connections (a server started with
//! `--tls-cert`; docs/SECURITY.md): the client's rustls settings
//! ([`Tls`], read from PEM files by [`Tls::from_pem`]) and the transport a
//! [`crate::Connection`] uses over them, split as the connection is, into
//! a write half (under the connection's write lock) and a read half (its
//! reader thread), both sharing one rustls `ClientConnection`.
//!
//! Invariants: records are made and taken from rustls under its lock and
//! written to the socket under the connection's write lock, in the order
//! they were made; the reader only decrypts (anything rustls queues while
//! reading leaves with the next write).

use crate::Error;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Plaintext encrypted at a time by a send (rustls's own buffer limit is
/// 64 KiB of records).
const SEND_CHUNK_BYTES: usize = 16 * 1024;

/// How a client speaks TLS: its rustls settings and the name the server's
/// certificate must carry.
#[derive(Clone, Debug)]
pub struct Tls {
    /// rustls's client settings (the trusted CAs, a client certificate).
    pub config: Arc<ClientConfig>,
    /// The name the server's certificate is checked against (a DNS name or
    /// an IP address); None: the address connected to, as an IP address.
    pub server_name: Option<String>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pem_error(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io(io::Error::new(io::ErrorKind::InvalidInput, format!("TLS {what} {}: {e}", path.display())))
}

fn certificates(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let pem = std::fs::read(path).map_err(|e| pem_error(what, path, e))?;
    let certs =
        CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>().map_err(|e| pem_error(what, path, e))?;
    if certs.is_empty() {
        return Err(pem_error(what, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

impl Tls {
    /// Trust the CA certificates of the PEM file `ca`; with `identity`
    /// (a PEM certificate chain and its key), present that client
    /// certificate to a server that asks for one (`--tls-ca`).
    pub fn from_pem(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<Tls, Error> {
        let mut roots = RootCertStore::empty();
        for c in certificates("CA bundle", ca)? {
            roots.add(c).map_err(|e| pem_error("CA bundle", ca, e))?;
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Io(io::Error::other(e)))?
            .with_root_certificates(roots);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = certificates("certificate", cert)?;
                let pem = std::fs::read(key).map_err(|e| pem_error("key", key, e))?;
                let key_der = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| pem_error("key", key, e))?;
                builder.with_client_auth_cert(chain, key_der).map_err(|e| pem_error("certificate", cert, e))?
            }
        };
        Ok(Tls { config: Arc::new(config), server_name: None })
    }

    /// These settings, checking the server's certificate against `name`.
    pub fn with_server_name(mut self, name: impl Into<String>) -> Tls {
        self.server_name = Some(name.into());
        self
    }

    /// Handshake on `tcp` (blocking, within its timeouts).
    pub(crate) fn connect(&self, addr: SocketAddr, mut tcp: TcpStream) -> Result<(WriteHalf, ReadHalf), Error> {
        let name = match &self.server_name {
            Some(n) => {
                ServerName::try_from(n.clone()).map_err(|e| Error::Handshake(format!("TLS server name {n:?}: {e}")))?
            }
            None => ServerName::IpAddress(addr.ip().into()),
        };
        let mut conn = ClientConnection::new(self.config.clone(), name)
            .map_err(|e| Error::Handshake(format!("{addr}: TLS: {e}")))?;
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp).map_err(|e| match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout,
                _ => Error::Handshake(format!("{addr}: TLS handshake: {e}")),
            })?;
        }
        let rs = tcp.try_clone().map_err(Error::Io)?;
        let conn = Arc::new(Mutex::new(conn));
        Ok((
            WriteHalf { conn: conn.clone(), tcp, out: Vec::new() },
            ReadHalf { conn, tcp: rs, pending: Vec::new(), at: 0, eof: false },
        ))
    }
}

/// The sending half of a TLS connection.
pub(crate) struct WriteHalf {
    conn: Arc<Mutex<ClientConnection>>,
    tcp: TcpStream,
    /// Records made and not yet written.
    out: Vec<u8>,
}

impl WriteHalf {
    pub(crate) fn tcp(&self) -> &TcpStream {
        &self.tcp
    }
}

impl Write for WriteHalf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf).map(|()| buf.len())
    }

    /// Encrypt and send `buf` in pieces of [`SEND_CHUNK_BYTES`] (rustls
    /// buffers at most that much of a piece's records).
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        for piece in buf.chunks(SEND_CHUNK_BYTES) {
            {
                let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
                conn.writer().write_all(piece)?;
                while conn.wants_write() {
                    conn.write_tls(&mut self.out)?;
                }
            }
            let r = self.tcp.write_all(&self.out);
            self.out.clear();
            r?;
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The receiving half of a TLS connection.
pub(crate) struct ReadHalf {
    conn: Arc<Mutex<ClientConnection>>,
    tcp: TcpStream,
    /// Ciphertext read from the socket that rustls has not taken yet.
    pending: Vec<u8>,
    /// Where `pending`'s untaken bytes start.
    at: usize,
    eof: bool,
}

impl Read for ReadHalf {
    /// Decrypted bytes: what rustls holds; else rustls is given more of
    /// the ciphertext read before, one piece at a time (it refuses more
    /// while 16 KiB of plaintext wait to be read, so a piece goes in only
    /// once the plaintext before it was taken); else one read of the
    /// socket, outside the lock the sending half takes (so the socket's
    /// read timeout applies as to a plain one). Ciphertext that keeps
    /// arriving without yielding plaintext (a peer sending a few bytes of
    /// a record at a time) ends the call with `WouldBlock` once the
    /// socket's read timeout has passed since the first of it, as a plain
    /// socket's read would have returned by then: the caller (the reader,
    /// which times requests out between reads) gets its turn; what arrived
    /// stays buffered for the next call.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // When this call's first socket read brought ciphertext.
        let mut since: Option<Instant> = None;
        loop {
            {
                let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
                match conn.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                    Err(e) => return Err(e),
                }
                if self.at < self.pending.len() {
                    let mut rest = &self.pending[self.at..];
                    let before = rest.len();
                    conn.read_tls(&mut rest)?;
                    self.at += before - rest.len();
                    conn.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    continue;
                }
                if self.eof {
                    return Ok(0);
                }
            }
            if let Some(t) = since {
                if self.tcp.read_timeout().ok().flatten().is_some_and(|limit| t.elapsed() >= limit) {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
            }
            self.pending.resize(16 * 1024, 0);
            self.at = 0;
            let r = self.tcp.read(&mut self.pending);
            if since.is_none() && matches!(r, Ok(n) if n > 0) {
                since = Some(Instant::now());
            }
            // Nothing read (the read timeout every idle tick, EINTR)
            // leaves nothing pending: those bytes are not ciphertext.
            self.pending.truncate(*r.as_ref().unwrap_or(&0));
            let n = r?;
            if n == 0 {
                self.eof = true;
                // Lets rustls tell a close_notify from a cut connection.
                let _ = self.conn.lock().unwrap_or_else(|e| e.into_inner()).read_tls(&mut &[][..]);
            }
        }
    }
}
