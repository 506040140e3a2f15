//! Runtime behaviour: many tasks, timers, cross-core wake-ups, TCP echo over
//! loopback, file IO, cancellation safety, panics and shutdown.

use std::future::Future;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use granary_rt::net::{TcpListener, TcpStream};
use granary_rt::{
    fdatasync, read_at, sleep, spawn, timeout, write_at, yield_now, JoinError, JoinHandle, Runtime, RuntimeConfig,
};

fn rt(threads: usize) -> Runtime {
    Runtime::new(RuntimeConfig { threads, pin: false, ..Default::default() }).expect("io_uring runtime")
}

/// A one-value channel usable across executors.
struct Slot<T> {
    inner: Mutex<(Option<T>, Option<Waker>)>,
}

impl<T> Slot<T> {
    fn new() -> Arc<Slot<T>> {
        Arc::new(Slot { inner: Mutex::new((None, None)) })
    }
    fn put(&self, v: T) {
        let w = {
            let mut g = self.inner.lock().unwrap();
            g.0 = Some(v);
            g.1.take()
        };
        if let Some(w) = w {
            w.wake();
        }
    }
    fn take(self: &Arc<Self>) -> impl Future<Output = T> {
        let me = self.clone();
        std::future::poll_fn(move |cx: &mut Context<'_>| {
            let mut g = me.inner.lock().unwrap();
            match g.0.take() {
                Some(v) => Poll::Ready(v),
                None => {
                    g.1 = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
    }
}

#[test]
fn many_tasks_run_to_completion_on_every_core() {
    let rt = rt(2);
    let count = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..2_000)
        .map(|i| {
            let count = count.clone();
            rt.spawn(async move {
                // Each task spawns children on its own core and yields.
                let kids: Vec<_> = (0..4)
                    .map(|_| {
                        let count = count.clone();
                        spawn(async move {
                            yield_now().await;
                            count.fetch_add(1, Relaxed);
                        })
                    })
                    .collect();
                for k in kids {
                    k.await.unwrap();
                }
                i
            })
        })
        .collect();
    let sum: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(sum, (0..2_000).sum::<usize>());
    assert_eq!(count.load(Relaxed), 8_000);
    let stats = rt.stats();
    assert!(stats.iter().all(|s| s.spawned > 0), "tasks were spread over both executors: {stats:?}");
}

/// `fdatasync` through the ring: Ok on a file written through it, the
/// kernel's error (EINVAL) on a pipe, which cannot be synced.
#[test]
fn fdatasync_syncs_a_file_and_reports_the_kernels_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = std::fs::File::create(dir.path().join("f")).unwrap();
    let mut fds = [0i32; 2];
    // SAFETY: pipe() fills the two-element array with fresh descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    use std::os::fd::FromRawFd;
    // SAFETY: both descriptors are fresh and owned here only.
    let (rd, wr) = unsafe { (std::os::fd::OwnedFd::from_raw_fd(fds[0]), std::os::fd::OwnedFd::from_raw_fd(fds[1])) };
    let (ffd, pfd) = (file.as_raw_fd(), rd.as_raw_fd());
    let (ok, pipe) = rt(1)
        .block_on(async move {
            let (r, _) = write_at(ffd, vec![1u8; 4096], 0).await;
            assert_eq!(r.unwrap(), 4096);
            (fdatasync(ffd).await, fdatasync(pfd).await)
        })
        .unwrap();
    ok.unwrap();
    assert_eq!(pipe.unwrap_err().raw_os_error(), Some(libc::EINVAL));
    drop((rd, wr, file));
}

#[test]
fn timers_fire_in_deadline_order_and_timeout_cancels() {
    let rt = rt(1);
    let order = rt
        .block_on(async {
            let order = Arc::new(Mutex::new(Vec::new()));
            // Deadlines from one instant, so that a stall between the tasks'
            // first polls cannot reorder them.
            let base = std::time::Instant::now();
            let hs: Vec<_> = [30u64, 10, 20, 0]
                .into_iter()
                .map(|ms| {
                    let order = order.clone();
                    spawn(async move {
                        granary_rt::sleep_until(base + Duration::from_millis(ms)).await;
                        order.lock().unwrap().push(ms);
                    })
                })
                .collect();
            for h in hs {
                h.await.unwrap();
            }
            let slow = timeout(Duration::from_millis(5), sleep(Duration::from_secs(3600))).await;
            assert!(slow.is_err());
            let fast = timeout(Duration::from_secs(3600), async { 7 }).await;
            assert_eq!(fast, Ok(7));
            // A duration past the clock's range (an idle timeout of u64::MAX
            // seconds) is a sleep that does not end, not an overflow panic.
            let never = timeout(Duration::from_millis(5), sleep(Duration::MAX)).await;
            assert!(never.is_err());
            let fast = timeout(Duration::MAX, async { 8 }).await;
            assert_eq!(fast, Ok(8));
            let v = order.lock().unwrap().clone();
            v
        })
        .unwrap();
    assert_eq!(order, vec![0, 10, 20, 30]);
}

#[test]
fn cross_core_wakeups_ping_pong() {
    let rt = rt(2);
    let ping: Arc<Slot<u64>> = Slot::new();
    let pong: Arc<Slot<u64>> = Slot::new();
    const ROUNDS: u64 = 2_000;
    let (p1, q1) = (ping.clone(), pong.clone());
    let a = rt.spawn_on(0, async move {
        let mut sum = 0;
        for i in 0..ROUNDS {
            p1.put(i);
            sum += q1.take().await;
        }
        sum
    });
    let b = rt.spawn_on(1, async move {
        for _ in 0..ROUNDS {
            let v = ping.take().await;
            pong.put(v * 2);
        }
    });
    b.join().unwrap();
    assert_eq!(a.join().unwrap(), (0..ROUNDS).map(|i| i * 2).sum::<u64>());
    let stats = rt.stats();
    assert!(stats.iter().map(|s| s.remote_wakes).sum::<u64>() > 0);
}

#[test]
fn tcp_echo_over_loopback() {
    let rt = rt(2);
    let listener = granary_rt::net::bind_low_port([127, 0, 0, 1].into()).unwrap();
    let addr = listener.local_addr().unwrap();
    const CONNS: usize = 16;
    const MSGS: usize = 50;
    let server = rt.spawn_on(0, async move {
        let l = TcpListener::from_std(listener);
        let mut conns = Vec::new();
        for _ in 0..CONNS {
            let (s, _) = l.accept().await.unwrap();
            conns.push(spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut total = 0;
                loop {
                    let (r, mut b) = s.recv(buf).await;
                    let n = r.unwrap();
                    if n == 0 {
                        return total;
                    }
                    total += n;
                    b.truncate(n);
                    let (r, mut b) = s.send_all(b).await;
                    r.unwrap();
                    b.resize(4096, 0);
                    buf = b;
                }
            }));
        }
        let mut total = 0;
        for c in conns {
            total += c.await.unwrap();
        }
        total
    });
    let clients: Vec<_> = (0..CONNS)
        .map(|c| {
            rt.spawn_on(1, async move {
                let s = TcpStream::connect(addr).await.unwrap();
                let mut got = Vec::new();
                for m in 0..MSGS {
                    let msg = format!("conn {c} message {m}\n").into_bytes();
                    let len = msg.len();
                    let (r, _) = s.send_all(msg).await;
                    r.unwrap();
                    let mut have = 0;
                    while have < len {
                        let (r, b) = s.recv(vec![0u8; len - have]).await;
                        let n = r.unwrap();
                        assert!(n > 0, "server closed early");
                        got.extend_from_slice(&b[..n]);
                        have += n;
                    }
                }
                s.shutdown_write().unwrap();
                let expect: Vec<u8> = (0..MSGS).flat_map(|m| format!("conn {c} message {m}\n").into_bytes()).collect();
                assert_eq!(got, expect);
                expect.len()
            })
        })
        .collect();
    let sent: usize = clients.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(server.join().unwrap(), sent);
}

#[test]
fn send_vec_sends_the_whole_buffer_and_keeps_a_small_allocation() {
    let rt = rt(1);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    const BIG: usize = 8 << 20; // far more than a socket buffer: through the ring
    let reader = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut s, &mut got).unwrap();
        got
    });
    let (small_cap, big_cap) = rt
        .spawn_on(0, async move {
            let s = TcpStream::connect(addr).await.unwrap();
            let mut empty = Vec::new();
            assert!(s.send_vec(&mut empty, 0).await);
            let mut small = Vec::with_capacity(64);
            small.extend_from_slice(b"hello ");
            assert!(s.send_vec(&mut small, 64).await);
            assert!(small.is_empty());
            let mut big: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8).collect();
            assert!(s.send_vec(&mut big, 4096).await);
            assert!(big.is_empty());
            s.shutdown_write().unwrap();
            (small.capacity(), big.capacity())
        })
        .join()
        .unwrap();
    assert_eq!(small_cap, 64, "a small allocation is kept");
    assert_eq!(big_cap, 0, "a large one is freed");
    let got = reader.join().unwrap();
    assert_eq!(got.len(), 6 + BIG);
    assert_eq!(&got[..6], b"hello ");
    assert!(got[6..].iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
}

#[test]
fn file_reads_and_writes_through_the_ring() {
    let rt = rt(2);
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(&vec![0u8; 1 << 20]).unwrap();
    let f = Arc::new(f);
    let handles: Vec<_> = (0..64u64)
        .map(|i| {
            let f = f.clone();
            rt.spawn(async move {
                let fd = f.as_raw_fd();
                let block = vec![i as u8; 4096];
                let (r, _) = write_at(fd, block, i * 16384).await;
                assert_eq!(r.unwrap(), 4096);
                let (r, b) = read_at(fd, vec![0u8; 4096], i * 16384).await;
                assert_eq!(r.unwrap(), 4096);
                assert!(b.iter().all(|&x| x == i as u8));
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // Reading past the end is a short read, not an error.
    let f2 = f.clone();
    let n = rt.block_on(async move { read_at(f2.as_raw_fd(), vec![0u8; 8192], (1 << 20) - 4096).await.0 }).unwrap();
    assert_eq!(n.unwrap(), 4096);
}

/// Dropping receive futures whose operations the kernel will still perform
/// must not free their buffers: fresh same-sized allocations, filled with a
/// sentinel, must stay intact. The peers' data is already queued, and the
/// receives are queued, dropped (queuing their cancels behind them) and
/// followed by the sentinel allocations within one poll, so the kernel runs
/// each receive, writing into its buffer, before it sees the cancel.
#[test]
fn dropped_operations_never_release_buffers_the_kernel_still_owns() {
    const CONNS: usize = 64;
    const BUF: usize = 32 * 1024;
    let rt = rt(1);
    let listener = granary_rt::net::bind_low_port([127, 0, 0, 1].into()).unwrap();
    let addr = listener.local_addr().unwrap();
    let accept = std::thread::spawn(move || (0..CONNS).map(|_| listener.accept().unwrap().0).collect::<Vec<_>>());
    let streams = rt
        .block_on(async move {
            let mut v = Vec::new();
            for _ in 0..CONNS {
                v.push(TcpStream::connect(addr).await.unwrap());
            }
            v
        })
        .unwrap();
    let mut peers = accept.join().unwrap();
    for p in &mut peers {
        p.write_all(&[0x55u8; BUF]).unwrap();
    }
    let (pending, intact) = rt
        .block_on(async move {
            let mut pending = 0;
            for s in &streams {
                let mut fut = Box::pin(s.recv(vec![0u8; BUF]));
                let waker = std::task::Waker::noop();
                if fut.as_mut().poll(&mut Context::from_waker(waker)).is_pending() {
                    pending += 1;
                }
                drop(fut);
            }
            // Same-sized allocations now likely reuse freed chunks.
            let sentinels: Vec<Vec<u8>> = (0..CONNS * 2).map(|_| vec![0xAAu8; BUF]).collect();
            for _ in 0..20 {
                granary_rt::sleep(Duration::from_millis(1)).await;
            }
            let intact = sentinels.iter().all(|s| s.iter().all(|&b| b == 0xAA));
            drop(streams);
            (pending, intact)
        })
        .unwrap();
    assert_eq!(pending, CONNS, "every receive was in flight when dropped");
    assert!(intact, "a freed receive buffer was written by the kernel");
}

/// A receive polled on one executor, sent to another and dropped there
/// cannot be cancelled from there (only its own ring can): its buffer must
/// be leaked, never freed, or a later allocation of that memory (a
/// sentinel here) is written by the kernel when the data arrives. The
/// receives cannot complete before the peers write, so the drop always
/// comes first.
#[test]
fn a_receive_dropped_on_another_executor_leaks_its_buffer() {
    const CONNS: usize = 16;
    const BUF: usize = 32 * 1024;
    let rt = rt(2);
    let listener = granary_rt::net::bind_low_port([127, 0, 0, 1].into()).unwrap();
    let addr = listener.local_addr().unwrap();
    let accept = std::thread::spawn(move || (0..CONNS).map(|_| listener.accept().unwrap().0).collect::<Vec<_>>());
    let streams: Vec<TcpStream> = rt
        .spawn_on(0, async move {
            let mut v = Vec::new();
            for _ in 0..CONNS {
                v.push(TcpStream::connect(addr).await.unwrap());
            }
            v
        })
        .join()
        .unwrap();
    // 'static: the futures borrow them and outlive the task that polled them.
    let streams: &'static [TcpStream] = Box::leak(streams.into_boxed_slice());
    let mut peers = accept.join().unwrap();
    let futs = rt
        .spawn_on(0, async move {
            let mut v = Vec::new();
            for s in streams {
                let mut fut = Box::pin(s.recv(vec![0u8; BUF]));
                let waker = std::task::Waker::noop();
                assert!(fut.as_mut().poll(&mut Context::from_waker(waker)).is_pending());
                v.push(fut);
            }
            v
        })
        .join()
        .unwrap();
    rt.spawn_on(1, async move { drop(futs) }).join().unwrap();
    // Freed chunks go back to the arena they came from: executor 0's.
    let sentinels = rt.spawn_on(0, async { (0..CONNS * 2).map(|_| vec![0xAAu8; BUF]).collect::<Vec<_>>() });
    let sentinels = sentinels.join().unwrap();
    for p in &mut peers {
        p.write_all(&[0x55u8; BUF]).unwrap();
    }
    // Bounded: the receives complete on executor 0 once the data is there.
    let mut intact = true;
    for _ in 0..200 {
        intact = sentinels.iter().all(|s| s.iter().all(|&b| b == 0xAA));
        if !intact {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(intact, "a receive buffer freed on another executor was written by the kernel");
}

/// An accept dropped while the connection it takes is already waiting:
/// its SQE goes out before its cancel, so it completes anyway, and the
/// descriptor it made is closed (it leaked before: the client's
/// connection stayed open with nobody at the other end).
#[test]
fn an_accept_dropped_as_it_completes_closes_the_connection() {
    let rt = rt(1);
    let listener = granary_rt::net::bind_low_port([127, 0, 0, 1].into()).unwrap();
    let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    rt.block_on(async move {
        let l = granary_rt::net::TcpListener::from_std(listener);
        let mut accept = Box::pin(l.accept());
        let waker = std::task::Waker::noop();
        assert!(accept.as_mut().poll(&mut Context::from_waker(waker)).is_pending());
        drop(accept);
        // Let the executor submit both and reap the completions.
        for _ in 0..5 {
            sleep(Duration::from_millis(2)).await;
        }
        drop(l);
    })
    .unwrap();
    client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 16];
    let r = std::io::Read::read(&mut client, &mut b);
    assert!(matches!(r, Ok(0)), "the accepted connection was not closed: {r:?}");
}

#[test]
fn shutdown_cancels_pending_operations_and_reports_cancelled() {
    let rt = rt(2);
    let listener = granary_rt::net::bind_low_port([127, 0, 0, 1].into()).unwrap();
    let addr = listener.local_addr().unwrap();
    let accept = std::thread::spawn(move || listener.accept().unwrap().0);
    let h = rt.spawn_on(1, async move {
        let s = TcpStream::connect(addr).await.unwrap();
        // Never satisfied: the peer sends nothing.
        let (r, _) = s.recv(vec![0u8; 1024]).await;
        r.map(|_| ())
    });
    let peer = accept.join().unwrap();
    let sleeper = rt.spawn_on(0, sleep(Duration::from_secs(3600)));
    drop(rt);
    assert_eq!(h.join().unwrap_err(), JoinError::Cancelled);
    assert_eq!(sleeper.join().unwrap_err(), JoinError::Cancelled);
    drop(peer);
}

/// A task spawned through a `Spawner` after its runtime stopped is
/// dropped unpolled and its handle answers `Cancelled` (it used to wait in
/// the stopped executor's queue, and `join` never returned).
#[test]
fn a_task_spawned_after_shutdown_is_cancelled() {
    let rt = rt(2);
    let sp = rt.spawner();
    assert_eq!(sp.spawn_on(1, async { 7 }).join().unwrap(), 7);
    drop(rt);
    assert_a_spawn_on_core_1_is_cancelled(sp);
}

/// A task spawned on core 1 through `sp` (its runtime stopped) is dropped
/// unpolled: its handle answers `Cancelled` within 20 s.
fn assert_a_spawn_on_core_1_is_cancelled(sp: granary_rt::Spawner) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(sp.spawn_on(1, async { 8 }).join()));
    let r = rx.recv_timeout(Duration::from_secs(20)).expect("join returned");
    assert_eq!(r.unwrap_err(), JoinError::Cancelled);
}

/// An executor whose thread unwinds (here: a task's `Drop` panics as
/// teardown drops it) is closed to spawns all the same: a task spawned on
/// it afterwards is dropped unpolled and its handle answers `Cancelled`
/// (it waited for ever in a queue no one ran).
#[test]
fn a_spawn_on_an_executor_that_panicked_in_teardown_is_cancelled() {
    struct PanicsOnDrop;
    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            panic!("a task's Drop panics in teardown");
        }
    }
    let rt = rt(2);
    let sp = rt.spawner();
    let _stuck = sp.spawn_on(1, async {
        let _p = PanicsOnDrop;
        std::future::pending::<()>().await;
    });
    assert_eq!(sp.spawn_on(1, async { 7 }).join().unwrap(), 7);
    drop(rt);
    assert_a_spawn_on_core_1_is_cancelled(sp);
}

/// A task spawned while its executor tears down (a task dropped there
/// spawns one from its `Drop`, as a write handed on does) is dropped at
/// once, while the executor is still there to cancel its IO, not left in
/// the drained executor until its thread ends.
#[test]
fn a_task_spawned_during_teardown_is_dropped_at_once() {
    struct SpawnOnDrop(std::sync::mpsc::Sender<(JoinHandle<()>, Arc<AtomicBool>)>);
    struct Late(Arc<AtomicBool>);
    impl Drop for Late {
        fn drop(&mut self) {
            // On the executor's thread: still in its context.
            self.0.store(granary_rt::current_core().is_some(), SeqCst);
        }
    }
    impl Drop for SpawnOnDrop {
        fn drop(&mut self) {
            let seen = Arc::new(AtomicBool::new(false));
            let late = Late(seen.clone());
            let h = granary_rt::spawn(async move {
                let _late = late;
                std::future::pending::<()>().await
            });
            let _ = self.0.send((h, seen));
        }
    }
    let rt = rt(1);
    let (tx, rx) = std::sync::mpsc::channel();
    let parked = rt.spawn_on(0, async move {
        let _guard = SpawnOnDrop(tx);
        std::future::pending::<()>().await
    });
    drop(rt);
    assert_eq!(parked.join().unwrap_err(), JoinError::Cancelled);
    let (late, seen) = rx.recv_timeout(Duration::from_secs(20)).expect("the dropped task spawned one");
    assert_eq!(late.join().unwrap_err(), JoinError::Cancelled);
    assert!(seen.load(SeqCst), "the task spawned during teardown was dropped after its executor was gone");
}

/// Connections still open at the drain's timeout are shut down, and the
/// drain waits a grace for them to end: a connection then finishing a
/// store write is not dropped midway with its runtime, which would poison
/// the store and skip its clean checkpoint.
#[test]
fn a_drain_waits_for_the_connections_it_shuts_down_at_its_timeout() {
    let listener = granary_rt::net::bind_low_port([127, 0, 0, 1].into()).unwrap();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (mut served, _) = listener.accept().unwrap();
    let conns = Arc::new(granary_rt::net::Connections::default());
    let (admitted, _) = conns.admit(served.as_raw_fd());
    let shut = Arc::new(AtomicBool::new(false));
    let connection = {
        let shut = shut.clone();
        std::thread::spawn(move || {
            // Busy sending to a client that reads nothing until the
            // shutdown fails the send, then a moment's work (as a store
            // write finishing), then it closes.
            let chunk = vec![0u8; 64 << 10];
            while served.write_all(&chunk).is_ok() {}
            shut.store(true, SeqCst);
            while shut.load(SeqCst) {
                std::thread::yield_now();
            }
            drop(admitted);
        })
    };
    // The connection's last step waits for another thread's turn, as a
    // store write finishing would: a drain that does not wait for it
    // returns while the connection is still open.
    let finisher = {
        let shut = shut.clone();
        std::thread::spawn(move || {
            while !shut.load(SeqCst) {
                std::thread::yield_now();
            }
            shut.store(false, SeqCst);
        })
    };
    let left = conns.drain(listener.as_raw_fd(), Duration::from_millis(1));
    assert_eq!(left, 1, "the connection was busy at the timeout");
    assert_eq!(conns.open(), 0, "the drain returned before the connection it shut down had ended");
    connection.join().unwrap();
    finisher.join().unwrap();
    drop(client);
}

#[test]
fn a_panicking_task_is_reported_and_the_executor_goes_on() {
    let rt = rt(1);
    let bad = rt.spawn_on(0, async { panic!("boom {}", 42) });
    match bad.join() {
        Err(JoinError::Panicked(m)) => assert!(m.contains("boom 42"), "{m}"),
        other => panic!("expected a panic report, got {other:?}"),
    }
    assert_eq!(rt.block_on(async { 5 }).unwrap(), 5);
}

#[test]
fn block_on_runs_futures_off_the_runtime() {
    assert!(!granary_rt::on_runtime());
    let v = granary_rt::block_on(async {
        granary_rt::sleep(Duration::from_millis(1)).await;
        3
    });
    assert_eq!(v, 3);
    let rt = rt(1);
    let inside =
        rt.block_on(async { (granary_rt::on_runtime(), granary_rt::block_on(async { granary_rt::on_runtime() })) });
    assert_eq!(inside.unwrap(), (true, false));
}

/// The executor counts the file reads and writes in flight (it spins
/// longer before sleeping while there are some): a read that waits is
/// counted until it completes, and one whose future is dropped while in
/// flight stops counting then.
#[test]
fn file_io_in_flight_is_counted_until_done_or_dropped() {
    let rt = rt(1);
    let mut fds = [0i32; 2];
    // SAFETY: pipe() fills the two-element array with fresh descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors are fresh and owned here only.
    let (rd, wr) = unsafe { (std::os::fd::OwnedFd::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) };
    use std::os::fd::FromRawFd;
    let rfd = rd.as_raw_fd();
    let in_flight = || rt.stats()[0].file_ios_in_flight;
    let wait_for = |n: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while in_flight() != n {
            assert!(std::time::Instant::now() < deadline, "file IO in flight stayed {} (want {n})", in_flight());
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    assert_eq!(in_flight(), 0);
    let h = rt.spawn(async move { read_at(rfd, vec![0u8; 8], 0).await.0.unwrap() });
    wait_for(1);
    (&wr).write_all(b"12345678").unwrap();
    assert_eq!(h.join().unwrap(), 8);
    assert_eq!(in_flight(), 0, "a completed read still counted");
    // Polled once (submitted), then dropped while the kernel still holds it.
    let h = rt.spawn(async move {
        let mut fut = Box::pin(read_at(rfd, vec![0u8; 8], 0));
        let pending = fut.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending();
        drop(fut);
        pending
    });
    assert!(h.join().unwrap(), "the read finished before it was dropped");
    assert_eq!(in_flight(), 0, "a dropped read still counted");
    drop(rt);
    drop(wr);
    drop(rd);
}

/// While the executor is busy (it has not waited for work for more than
/// SUBMIT_AT_ONCE_ROUNDS rounds), file IO queued by a task goes to the
/// kernel before the next task of the same round runs when little file IO
/// is in flight, and waits for a batch of 1/SUBMIT_EARLY_DIVISOR of what is
/// in flight when much is. Pipe reads stand in for file IO: they stay in
/// flight until the pipe is written.
#[test]
fn file_io_is_submitted_mid_round_in_proportion_to_the_io_in_flight() {
    let (before, low, seen, _) = mid_round_probe(true, false);
    assert!(low > before, "a lone read waited for the end of its round ({before} enters, then {low})");
    // With `in_kernel` reads in flight, one submission per
    // in_kernel / DIVISOR queued reads: the probes see the count step up
    // once every so many pairs, not after every read.
    let steps = seen.windows(2).filter(|w| w[1] > w[0]).count();
    assert!(
        (1..=seen.len() / 4).contains(&steps),
        "{steps} submissions for {} reads queued with {} in flight: {seen:?}",
        seen.len(),
        granary_rt::SUBMIT_EARLY_DIVISOR * 8
    );
}

/// Right after the executor waited for work, each task's file IO goes to
/// the kernel right after the task, however much is in flight.
#[test]
fn file_io_is_submitted_after_each_task_when_the_executor_had_waited() {
    // On a busy machine the executor may be preempted until the timer is
    // already due and never wait: that run shows nothing, and another is
    // made (bounded).
    let mut tries = 0;
    let (before, low, seen) = loop {
        let (before, low, seen, waited) = mid_round_probe(true, true);
        if waited {
            break (before, low, seen);
        }
        tries += 1;
        assert!(tries < 50, "the executor never waited for the probe's timer in {tries} runs");
    };
    assert!(low > before, "a lone read waited for the end of its round ({before} enters, then {low})");
    assert!(seen.windows(2).all(|w| w[1] > w[0]), "reads waited for a batch after an idle wait: {seen:?}");
}

/// With `submit_early` off, file IO waits for the end of the round.
#[test]
fn file_io_waits_for_the_round_without_early_submission() {
    for idle_first in [false, true] {
        let (before, low, seen, _) = mid_round_probe(false, idle_first);
        assert_eq!(low, before, "a read was submitted mid-round");
        assert!(seen.windows(2).all(|w| w[1] == w[0]), "reads were submitted mid-round: {seen:?}");
    }
}

/// The enter counts seen by probe tasks polled right after readers in the
/// same round: before and after one read at low depth, then after each of
/// 2 * SUBMIT_EARLY_DIVISOR reads with 8 * SUBMIT_EARLY_DIVISOR in flight,
/// polled in a round that follows either a run of busy rounds or, with
/// `idle_first`, a wait of the executor (every task asleep on a timer);
/// and whether the executor did sleep during that wait (false when it was
/// preempted until the timer was due, so it went on without waiting).
fn mid_round_probe(submit_early: bool, idle_first: bool) -> (u64, u64, Vec<u64>, bool) {
    use granary_rt::SUBMIT_EARLY_DIVISOR;
    let rt = Arc::new(
        Runtime::new(RuntimeConfig { threads: 1, pin: false, submit_early, ..Default::default() })
            .expect("io_uring runtime"),
    );
    let mut fds = [0i32; 2];
    // SAFETY: pipe() fills the two-element array with fresh descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    use std::os::fd::FromRawFd;
    // SAFETY: both descriptors are fresh and owned here only.
    let (rd, wr) = unsafe { (std::os::fd::OwnedFd::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) };
    let rfd = rd.as_raw_fd();
    let in_kernel = SUBMIT_EARLY_DIVISOR as usize * 8;
    let (rt2, rt3) = (rt.clone(), rt.clone());
    let h = rt.spawn(async move {
        let probe = move || {
            let rt = rt2.clone();
            spawn(async move { rt.stats()[0].enters })
        };
        let read = move || spawn(async move { read_at(rfd, vec![0u8; 1], 0).await.0.unwrap() });
        let mut readers = Vec::new();
        // Low depth: reader, then a probe, in one round.
        let before = probe().await.unwrap();
        readers.push(read());
        let probe_low = probe();
        let low = probe_low.await.unwrap();
        // High depth: `in_kernel` readers submitted, then reader/probe
        // pairs in one round.
        for _ in 0..in_kernel - 1 {
            readers.push(read());
        }
        let mut waited = false;
        if idle_first {
            let sleeps = rt3.stats()[0].sleeps;
            sleep(Duration::from_millis(1)).await;
            waited = rt3.stats()[0].sleeps > sleeps;
        } else {
            for _ in 0..granary_rt::SUBMIT_AT_ONCE_ROUNDS + 2 {
                yield_now().await;
            }
        }
        let mut probes = Vec::new();
        for _ in 0..SUBMIT_EARLY_DIVISOR * 2 {
            readers.push(read());
            probes.push(probe());
        }
        let mut seen = Vec::new();
        for p in probes {
            seen.push(p.await.unwrap());
        }
        (before, low, seen, readers, waited)
    });
    // The pipe holds the readers' bytes; one byte each completes them all.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !h.is_finished() {
        assert!(std::time::Instant::now() < deadline, "the probes never ran");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (before, low, seen, readers, waited) = h.join().unwrap();
    (&wr).write_all(&vec![7u8; readers.len()]).unwrap();
    for r in readers {
        assert_eq!(r.join().unwrap(), 1);
    }
    drop(wr);
    drop(rd);
    (before, low, seen, waited)
}

/// A future another thread completes, and the waker it leaves.
#[derive(Default)]
struct Flag(Mutex<(bool, Option<Waker>)>);

impl Flag {
    fn set(&self) {
        let mut g = self.0.lock().unwrap();
        g.0 = true;
        if let Some(w) = g.1.take() {
            w.wake();
        }
    }
    fn wait(self: &Arc<Self>) -> impl Future<Output = ()> {
        let me = self.clone();
        std::future::poll_fn(move |cx| {
            let mut g = me.0.lock().unwrap();
            if g.0 {
                return Poll::Ready(());
            }
            g.1 = Some(cx.waker().clone());
            Poll::Pending
        })
    }
}

/// Off any executor (`block_on`), a timeout ends when its future does,
/// not at its deadline, and ends at its deadline when the future never
/// does; a sleep there ends on time, also inside a nested block_on. Before,
/// the timer slept the thread for the whole duration at its first poll, so
/// the timeout below took its hour and then answered Elapsed.
#[test]
fn a_timeout_in_block_on_ends_with_its_future() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let flag = Arc::new(Flag::default());
        let setter = flag.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            setter.set();
        });
        let done = granary_rt::block_on(timeout(Duration::from_secs(3600), flag.wait()));
        let never = granary_rt::block_on(timeout(Duration::from_millis(20), std::future::pending::<()>()));
        // The outer timeout's sleep is polled, then a block_on runs inside
        // the same poll: the outer deadline outlives the inner one.
        let mut outer = Box::pin(timeout(Duration::from_millis(30), std::future::pending::<()>()));
        let mut inner = None;
        let nested = granary_rt::block_on(std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = outer.as_mut().poll(cx) {
                return Poll::Ready((inner.take().expect("the inner ran"), r));
            }
            inner = Some(granary_rt::block_on(timeout(Duration::from_millis(10), std::future::pending::<()>())));
            Poll::Pending
        }));
        tx.send((done, never, nested)).unwrap();
    });
    let (done, never, nested) = rx.recv_timeout(Duration::from_secs(60)).expect("block_on(timeout) hung");
    assert_eq!(done, Ok(()));
    assert!(never.is_err());
    assert!(nested.0.is_err() && nested.1.is_err());
}

/// A send whose future is dropped before the executor's next submission,
/// its stream closed at once: the operation is submitted as it is dropped,
/// so it has its socket before the descriptor number can be given to
/// another file; it never writes into whatever gets that number.
#[test]
fn a_send_dropped_before_its_submission_never_reaches_a_reused_descriptor() {
    assert_eq!(bytes_a_dropped_send_leaks(rt(1), 0), 0, "a dropped send wrote into the descriptor's next owner");
}

/// The same while the ring's completion queue overflows (its executor has
/// not reaped the completions of the reads this task queued): some kernels
/// refuse submissions then (EBUSY) until completions are reaped, and the
/// dropped send's submission must not stop at that refusal, or the send
/// would run later, on the descriptor's next owner.
#[test]
fn a_send_dropped_while_completions_overflow_never_reaches_a_reused_descriptor() {
    let rt = Runtime::new(RuntimeConfig { threads: 1, pin: false, ring_entries: 4, ..Default::default() }).unwrap();
    assert_eq!(bytes_a_dropped_send_leaks(rt, 64), 0, "a dropped send wrote into the descriptor's next owner");
}

/// On `rt`: `reads` reads of /dev/zero queued and left unreaped (this
/// task does not yield), then a send polled once and dropped, and its
/// stream's descriptor number given to another socket in one step (tests
/// running beside this one open files too: as if the stream had closed
/// and the number been given out again). The bytes that reached that
/// socket's pair.
fn bytes_a_dropped_send_leaks(rt: Runtime, reads: usize) -> usize {
    let listener = granary_rt::net::bind_low_port([127, 0, 0, 1].into()).unwrap();
    let addr = listener.local_addr().unwrap();
    let accept = std::thread::spawn(move || listener.accept().unwrap().0);
    let zero = std::fs::File::open("/dev/zero").unwrap();
    let leaked = rt
        .block_on(async move {
            let s = TcpStream::connect(addr).await.unwrap();
            let fd = s.raw_fd();
            let (c, d) = std::os::unix::net::UnixStream::pair().unwrap();
            let mut queued = Vec::new();
            for _ in 0..reads {
                let mut r = Box::pin(read_at(zero.as_raw_fd(), vec![0u8; 8], 0));
                assert!(r.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending());
                queued.push(r);
            }
            let mut send = Box::pin(s.send_from(vec![b'X'; 64], 0));
            assert!(send.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending());
            drop(send);
            // SAFETY: both are open descriptors of this process; the
            // stream's (closed by it when dropped below) becomes a copy of
            // `c`'s.
            assert_eq!(unsafe { libc::dup2(c.as_raw_fd(), fd) }, fd);
            for r in queued {
                assert_eq!(r.await.0.unwrap(), 8);
            }
            for _ in 0..5 {
                sleep(Duration::from_millis(2)).await;
            }
            drop(s);
            let mut leaked = 0;
            for end in [&c, &d] {
                end.set_nonblocking(true).unwrap();
                let mut b = [0u8; 128];
                if let Ok(n) = std::io::Read::read(&mut &*end, &mut b) {
                    leaked += n;
                }
            }
            leaked
        })
        .unwrap();
    drop(accept.join().unwrap());
    leaked
}

/// A `block_on` nested in a future an outer `block_on` polls shares the
/// thread's waker: a wake-up meant for the outer future that comes while
/// the inner one waits is not lost (the outer would park for good).
#[test]
fn a_nested_block_on_keeps_the_outer_futures_wake_up() {
    let flag = Arc::new(AtomicBool::new(false));
    let waker: Arc<Mutex<Option<Waker>>> = Arc::default();
    let (f, w) = (flag.clone(), waker.clone());
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(10));
        f.store(true, SeqCst);
        if let Some(w) = w.lock().unwrap().take() {
            w.wake();
        }
    });
    let ready = std::future::poll_fn(|cx| {
        *waker.lock().unwrap() = Some(cx.waker().clone());
        if flag.load(SeqCst) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    });
    let inner = async { granary_rt::block_on(sleep(Duration::from_millis(50))) };
    let (done, watchdog) = (Arc::new(AtomicBool::new(false)), std::time::Instant::now());
    let d = done.clone();
    let dog = std::thread::spawn(move || {
        while !d.load(SeqCst) {
            if watchdog.elapsed() > Duration::from_secs(20) {
                // The test's thread is parked for good: end the run.
                eprintln!("a_nested_block_on_keeps_the_outer_futures_wake_up: the outer block_on never woke");
                std::process::abort();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    granary_rt::block_on(granary_rt::sync::join2(ready, inner));
    done.store(true, SeqCst);
    setter.join().unwrap();
    dog.join().unwrap();
}

/// A sleep registered on one executor and dropped on another removes its
/// own registration only: another executor's sleep with the same deadline
/// and sequence number (each executor counts its own) still wakes.
#[test]
fn a_sleep_dropped_on_another_executor_leaves_that_executor_s_timers() {
    /// The sleep, handed from one executor to another (not awaited there).
    struct Moved(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>);
    let rt = rt(2);
    let sp = rt.spawner();
    let at = std::time::Instant::now() + Duration::from_millis(300);
    // A sleep polled once on core 0 (its first timer there), handed back.
    let moved = sp
        .spawn_on(0, async move {
            let mut s = Moved(Box::pin(granary_rt::sleep_until(at)));
            std::future::poll_fn(|cx| {
                let _ = s.0.as_mut().poll(cx);
                Poll::Ready(())
            })
            .await;
            s
        })
        .join()
        .unwrap();
    // Core 1's first timer: the same deadline and sequence number.
    let (tx, rx) = std::sync::mpsc::channel();
    let sleeper = sp.spawn_on(1, async move {
        let mut s = Box::pin(granary_rt::sleep_until(at));
        let mut first = true;
        std::future::poll_fn(|cx| {
            let r = s.as_mut().poll(cx);
            if std::mem::take(&mut first) {
                let _ = tx.send(());
            }
            r
        })
        .await;
    });
    rx.recv().unwrap();
    // Dropped on core 1.
    sp.spawn_on(1, async move { drop(moved) }).join().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || done_tx.send(sleeper.join()));
    done_rx.recv_timeout(Duration::from_secs(20)).expect("the sleep on core 1 never woke").unwrap();
}
