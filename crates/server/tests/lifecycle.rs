//! The shared lifecycle with a line-echo protocol: the connection limit
//! refuses the newest connection, the idle timeout closes a silent one,
//! and a drain lets a connection finish what it read, then closes it; and
//! with a protocol that answers once and ends, a close with input unread
//! still delivers the answer.

use granary_rt::{Runtime, RuntimeConfig};
use granary_server::{Listener, ListenerConfig, ListenerStats, Protocol, RecvEnd, Session, Stream};
use std::io::{BufRead, BufReader, Read, Write};
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// Echoes every byte it receives; refuses with "BUSY\n".
struct Echo;

impl Protocol for Echo {
    async fn serve(self: Arc<Self>, session: Session) {
        let mut buf = vec![0u8; 4096];
        loop {
            match session.recv(buf).await {
                Ok((n, b)) => {
                    if session.stream().send_all(b[..n].to_vec()).await.0.is_err() {
                        return;
                    }
                    buf = b;
                }
                Err((RecvEnd::Closed | RecvEnd::Idle | RecvEnd::Error(_), _)) => return,
            }
        }
    }

    async fn refuse(self: Arc<Self>, stream: Rc<Stream>) {
        let _ = stream.send_all(b"BUSY\n".to_vec()).await;
    }
}

fn start(max_connections: usize, idle_timeout: Option<Duration>) -> (Listener, std::net::SocketAddr) {
    let rt = Arc::new(Runtime::new(RuntimeConfig { threads: 2, ..RuntimeConfig::default() }).unwrap());
    let socket = granary_rt::net::bind_low_port([127, 0, 0, 1].into()).unwrap();
    let cfg = ListenerConfig { max_connections, idle_timeout, name: "echo", tls: None };
    let l = Listener::start(rt, socket, cfg, Arc::new(Echo), Arc::new(ListenerStats::default())).unwrap();
    let addr = l.local_addr();
    (l, addr)
}

fn connect(addr: std::net::SocketAddr) -> std::net::TcpStream {
    let s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn echo_line(s: &mut std::net::TcpStream, line: &str) -> String {
    s.write_all(line.as_bytes()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut got = String::new();
    r.read_line(&mut got).unwrap();
    got
}

#[test]
fn the_connection_limit_refuses_the_newest_and_counts_it() {
    let (l, addr) = start(2, None);
    let mut a = connect(addr);
    let mut b = connect(addr);
    assert_eq!(echo_line(&mut a, "a\n"), "a\n");
    assert_eq!(echo_line(&mut b, "b\n"), "b\n");
    let mut c = connect(addr);
    let mut refused = String::new();
    c.read_to_string(&mut refused).unwrap();
    assert_eq!(refused, "BUSY\n");
    // The first two are still served.
    assert_eq!(echo_line(&mut a, "again\n"), "again\n");
    let st = l.stats();
    assert_eq!(st.rejected_connections.load(Relaxed), 1);
    assert_eq!(st.total_connections.load(Relaxed), 2);
    assert_eq!(st.connections.open(), 2);
    drop((a, b));
    assert_eq!(l.shutdown(Duration::from_secs(5)), 0);
}

#[test]
fn the_idle_timeout_closes_a_silent_connection() {
    // Long enough that a client stalled between its connect and its line
    // is not kicked before it (a loaded machine).
    let (l, addr) = start(8, Some(Duration::from_secs(1)));
    let mut a = connect(addr);
    assert_eq!(echo_line(&mut a, "x\n"), "x\n");
    // The server closes it: the read ends (bounded by the read timeout).
    let mut rest = Vec::new();
    assert_eq!(a.read_to_end(&mut rest).unwrap(), 0);
    assert_eq!(l.stats().idle_kicks.load(Relaxed), 1);
    assert_eq!(l.shutdown(Duration::from_secs(5)), 0);
}

#[test]
fn a_drain_answers_what_was_read_then_closes() {
    let (l, addr) = start(8, None);
    let mut a = connect(addr);
    assert_eq!(echo_line(&mut a, "before\n"), "before\n");
    let stats = l.stats().clone();
    let drained = std::thread::spawn(move || l.shutdown(Duration::from_secs(5)));
    // The connection sees the end of its input and closes: the client's
    // read returns end of file.
    let mut rest = Vec::new();
    a.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    assert_eq!(drained.join().unwrap(), 0);
    assert_eq!(stats.connections.open(), 0);
    // No new connection is accepted.
    assert!(std::net::TcpStream::connect(addr).map(|mut s| s.read(&mut [0u8; 1]).unwrap_or(0)).unwrap_or(0) == 0);
}

/// Reads once, answers with [`Answer::BYTES`] bytes, and ends the session
/// with what else the client sent unread; says on `served` once its answer
/// is on the socket (in the kernel's send buffer, not yet delivered).
struct Answer {
    served: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
}

impl Answer {
    const BYTES: usize = 96 << 10;
}

/// Set an int socket option on `fd`.
fn set_buffer(fd: std::os::fd::RawFd, option: libc::c_int, bytes: libc::c_int) {
    // SAFETY: setsockopt(2) on an open socket with a pointer to an int
    // that outlives the call and its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "setsockopt: {}", std::io::Error::last_os_error());
}

impl Protocol for Answer {
    async fn serve(self: Arc<Self>, session: Session) {
        // Room for the whole answer in the send buffer, so its send
        // completes while the client reads nothing.
        set_buffer(session.stream().raw_fd(), libc::SO_SNDBUF, 1 << 20);
        if session.recv(vec![0u8; 16]).await.is_err() {
            return;
        }
        let (r, _) = session.stream().send_all(vec![b'a'; Answer::BYTES]).await;
        r.unwrap();
        if let Some(tx) = self.served.lock().unwrap().take() {
            tx.send(()).unwrap();
        }
    }

    async fn refuse(self: Arc<Self>, _stream: Rc<Stream>) {}
}

/// A session that ends with input unread (an error that closes the
/// connection, a QUIT with more pipelined after it) still delivers what it
/// sent: the lifecycle half-closes and drops the rest of the input before
/// the socket closes. Before, the close with input unread made the kernel
/// reset the connection, dropping the part of the answer the client had
/// not received (here nearly all of it: the client's receive buffer is
/// small and it reads only after the session ended).
#[test]
fn a_session_that_ends_with_input_unread_still_delivers_its_answer() {
    use std::os::fd::AsRawFd;
    let (tx, rx) = std::sync::mpsc::channel();
    let rt = Arc::new(Runtime::new(RuntimeConfig { threads: 1, ..RuntimeConfig::default() }).unwrap());
    let socket = granary_rt::net::bind_low_port([127, 0, 0, 1].into()).unwrap();
    let cfg = ListenerConfig { max_connections: 8, idle_timeout: None, name: "answer", tls: None };
    let protocol = Arc::new(Answer { served: std::sync::Mutex::new(Some(tx)) });
    let l = Listener::start(rt, socket, cfg, protocol, Arc::new(ListenerStats::default())).unwrap();
    let mut c = connect(l.local_addr());
    set_buffer(c.as_raw_fd(), libc::SO_RCVBUF, 4096);
    // The request and 32 KiB more the session never reads.
    let mut sent = b"go".to_vec();
    sent.resize(32 << 10, b'x');
    c.write_all(&sent).unwrap();
    rx.recv_timeout(Duration::from_secs(10)).expect("the session answered");
    let mut got = Vec::new();
    let r = c.read_to_end(&mut got);
    assert!(r.is_ok(), "the answer was cut off ({} of {} bytes): {r:?}", got.len(), Answer::BYTES);
    assert_eq!(got.len(), Answer::BYTES);
    drop(c);
    assert_eq!(l.shutdown(Duration::from_secs(5)), 0);
}
