//! The native protocol's token (`NativeConfig::token`, `granary serve
//! --native-token`): a hello without it, or with another, is answered
//! `UNAUTHORIZED` and closed; with it the connection is served; a server
//! without a token serves every hello, carrying a token or not.

use granary_client::{Client, ClientConfig, Connection, Error, Status};
use granary_native::{NativeConfig, Server};
use granary_proto::{self as proto, ClientHello, ServerHello};
use granary_store::io::MemDevice;
use granary_store::{CreateOptions, OpenOptions, Store};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &[u8] = b"t0ken with spaces";

fn server(token: Option<&[u8]>) -> Server {
    start(token).unwrap()
}

/// A server on a new in-memory store requiring `token` (None: none).
fn start(token: Option<&[u8]>) -> std::io::Result<Server> {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let c = CreateOptions { segment_bytes: Some(4 << 20), grain_bytes: Some(512), ..CreateOptions::default() };
    let store = Arc::new(Store::create(dev, &c, &OpenOptions::default()).unwrap());
    let cfg = NativeConfig {
        listen: ([127, 0, 0, 1], granary_rt::net::free_low_port().unwrap()).into(),
        threads: 2,
        token: token.map(|t| t.to_vec()),
        ..NativeConfig::default()
    };
    Server::start(store, cfg)
}

/// The server's hello to `hello` (and `token` after it), and for a
/// refusal whether the connection is closed after it (waiting for the
/// close; an accepted connection is not waited on).
fn handshake(addr: SocketAddr, hello: [u8; proto::CLIENT_HELLO_BYTES], token: &[u8]) -> (ServerHello, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&hello).unwrap();
    s.write_all(token).unwrap();
    let mut b = [0u8; proto::SERVER_HELLO_BYTES];
    s.read_exact(&mut b).unwrap();
    let h = ServerHello::decode(&b).unwrap();
    if h.status == Status::Ok {
        return (h, false);
    }
    let mut rest = [0u8; 1];
    let closed = match s.read(&mut rest) {
        Ok(0) => true,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        Ok(_) => false,
    };
    (h, closed)
}

#[test]
fn a_hello_without_the_token_or_with_another_is_unauthorized() {
    let srv = server(Some(TOKEN));
    let addr = srv.local_addr();
    let offer = ClientHello::default();
    let (h, closed) = handshake(addr, offer.encode(), b"");
    assert_eq!((h.status, h.version, closed), (Status::Unauthorized, 0, true));
    let (h, closed) = handshake(addr, offer.encode_with_token(5), b"wrong");
    assert_eq!((h.status, closed), (Status::Unauthorized, true));
    let (h, closed) = handshake(addr, offer.encode_with_token(TOKEN.len() - 1), &TOKEN[..TOKEN.len() - 1]);
    assert_eq!((h.status, closed), (Status::Unauthorized, true), "a prefix is another token");
    assert_eq!(srv.stats().auth_failures.load(Relaxed), 3);

    // The client crate: a clear error, with and without a token.
    let e = Client::connect(addr, ClientConfig::default()).err().expect("refused");
    assert!(matches!(&e, Error::Handshake(m) if m.contains("requires a token")), "{e}");
    let e = Client::connect(addr, ClientConfig::default().with_token("nope")).err().expect("refused");
    assert!(matches!(&e, Error::Handshake(m) if m.contains("refused the token")), "{e}");
}

#[test]
fn the_right_token_is_served() {
    let srv = server(Some(TOKEN));
    let addr = srv.local_addr();
    let offer = ClientHello::default();
    let (h, _) = handshake(addr, offer.encode_with_token(TOKEN.len()), TOKEN);
    assert_eq!((h.status, h.version), (Status::Ok, proto::VERSION));
    let c = Client::connect(addr, ClientConfig::default().with_token(TOKEN)).unwrap();
    c.put(b"k", b"v").unwrap();
    assert_eq!(c.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    let conn = Connection::connect_with_token(addr, Duration::from_secs(5), TOKEN).unwrap();
    assert_eq!(conn.version(), proto::VERSION);
    assert!(!format!("{:?}", ClientConfig::default().with_token(TOKEN)).contains("t0ken"), "Debug hides it");
}

/// A token no hello can carry (empty, or over 1024 bytes) refuses the
/// start, and the configuration's Debug form never shows the token.
#[test]
fn a_token_no_hello_can_carry_refuses_the_start() {
    for t in [vec![], vec![b'x'; 1025]] {
        let e = start(Some(&t)).err().expect("refused");
        assert!(e.to_string().contains("a hello carries 1 to 1024"), "{e}");
    }
    let shown = format!("{:?}", NativeConfig { token: Some(TOKEN.to_vec()), ..NativeConfig::default() });
    assert!(!shown.contains("t0ken") && shown.contains("<set>"), "{shown}");
}

#[test]
fn a_server_without_a_token_serves_every_hello() {
    let srv = server(None);
    let addr = srv.local_addr();
    let (h, closed) = handshake(addr, ClientHello::default().encode_with_token(3), b"abc");
    assert_eq!((h.status, closed), (Status::Ok, false));
    Client::connect(addr, ClientConfig::default().with_token("anything")).unwrap().put(b"k", b"v").unwrap();
    Client::connect(addr, ClientConfig::default()).unwrap().put(b"k", b"v").unwrap();
}

#[test]
fn a_malformed_token_hello_is_closed_as_a_bad_hello() {
    let srv = server(Some(TOKEN));
    let mut zero_len = ClientHello::default().encode_with_token(1);
    zero_len[10] = 0;
    let mut s = TcpStream::connect(srv.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&zero_len).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(got.is_empty(), "no hello for a malformed one");
    assert_eq!(srv.stats().bad_frames.load(Relaxed), 1);
    // A token announced but never sent ends at the client's close.
    let mut s = TcpStream::connect(srv.local_addr()).unwrap();
    s.write_all(&ClientHello::default().encode_with_token(100)).unwrap();
    s.write_all(b"short").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(got.is_empty());
}
