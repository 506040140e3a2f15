//! The shared lifecycle with a line-echo protocol: the connection limit
//! refuses the newest connection, the idle timeout closes a silent one,
//! and a drain lets a connection finish what it read, then closes it.

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
