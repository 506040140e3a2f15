//! [`InjectDevice`]: a device that wraps a real one and fails, slows or
//! stops its operations on command while a server runs. For tests only:
//! `granary serve` wraps its device in one when the environment variable
//! [`CONTROL_VAR`] names a Unix socket path, and [`serve_control`] takes
//! commands there (docs/FAULTS.md). [`crate::FaultDevice`] is the
//! in-process simulator of crashes; this one injects faults into a live
//! process from outside.
//!
//! Faults, each independent, off until set:
//!
//! - **read EIO**: every read, or every read whose bytes contain a chosen
//!   pattern (a key, so that one record's sectors are "bad" while the
//!   rest of the device answers), fails with EIO. The data is not changed.
//! - **write EIO**: every write, flush, discard and zone reset or finish
//!   fails with EIO; nothing of a failed write reaches the inner device.
//! - **delay**: every operation waits this long before it starts, on the
//!   calling thread (a latency spike: an executor that issued it stalls,
//!   as it would on a synchronous device).
//! - **hang**: operations issued while hung wait, without touching the
//!   inner device, until released; the synchronous forms block their
//!   thread, the asynchronous ones stay pending (their task yields).
//!
//! Invariant: with no fault set, every call of [`Device`] goes straight
//! to the inner device (one atomic load more), so a wrapped device that is
//! never told anything behaves as the device itself: its asynchronous
//! flush, discards and zones included (every method of the trait is
//! passed on, none left to the trait's defaults).

use crate::{AlignedBuf, Device, IoCounters, IoFuture, IoResult};
use std::future::Future;
use std::io::{self, BufRead, Write};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// The environment variable that, set to a path, makes `granary serve`
/// wrap its device in an [`InjectDevice`] controlled through a Unix socket
/// made at that path. Meant for tests; unset in production.
pub const CONTROL_VAR: &str = "GRANARY_FAULT_SOCKET";

/// Beside [`CONTROL_VAR`]: control commands, separated by `;`, applied
/// before the device is first used ([`Controls::apply_all`]).
pub const INIT_VAR: &str = "GRANARY_FAULT_INIT";

/// Which reads fail with EIO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadFault {
    Off,
    All,
    /// Reads whose bytes contain this pattern.
    Matching(Vec<u8>),
}

#[derive(Debug)]
struct Faults {
    read: ReadFault,
    write_eio: bool,
    delay: Duration,
    hung: bool,
    /// Tasks whose operation waits for a release.
    waiters: Vec<Waker>,
}

/// What the device was told, shared by the device and its controller.
pub struct Controls {
    /// Whether any fault is set (the fast path's one load).
    any: AtomicBool,
    faults: Mutex<Faults>,
    released: Condvar,
    /// Operations waiting for a release now.
    held: AtomicU64,
    /// Operations failed by injection so far.
    failed_reads: AtomicU64,
    failed_writes: AtomicU64,
}

impl Default for Controls {
    fn default() -> Controls {
        Controls::new()
    }
}

impl Controls {
    /// No fault set.
    pub fn new() -> Controls {
        Controls {
            any: AtomicBool::new(false),
            faults: Mutex::new(Faults {
                read: ReadFault::Off,
                write_eio: false,
                delay: Duration::ZERO,
                hung: false,
                waiters: Vec::new(),
            }),
            released: Condvar::new(),
            held: AtomicU64::new(0),
            failed_reads: AtomicU64::new(0),
            failed_writes: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut Faults)) {
        let mut g = self.lock();
        f(&mut g);
        let any = g.read != ReadFault::Off || g.write_eio || !g.delay.is_zero() || g.hung;
        self.any.store(any, SeqCst);
        if !g.hung {
            for w in g.waiters.drain(..) {
                w.wake();
            }
            self.released.notify_all();
        }
    }

    /// Which reads fail.
    pub fn set_read(&self, r: ReadFault) {
        self.update(|f| f.read = r);
    }

    /// Whether writes and flushes fail.
    pub fn set_write_eio(&self, on: bool) {
        self.update(|f| f.write_eio = on);
    }

    /// How long each operation waits before it starts.
    pub fn set_delay(&self, d: Duration) {
        self.update(|f| f.delay = d);
    }

    /// Hold operations from now on (true), or release them all (false).
    pub fn set_hung(&self, on: bool) {
        self.update(|f| f.hung = on);
    }

    /// Operations waiting for a release now.
    pub fn held(&self) -> u64 {
        self.held.load(SeqCst)
    }

    /// Reads and writes (flushes included) failed by injection so far.
    pub fn failed(&self) -> (u64, u64) {
        (self.failed_reads.load(SeqCst), self.failed_writes.load(SeqCst))
    }

    /// Wait up to `limit` until at least `n` operations are held; whether
    /// they are.
    pub fn wait_held(&self, n: u64, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        let mut g = self.lock();
        while self.held() < n {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            g = self.released.wait_timeout(g, left.min(Duration::from_millis(10))).unwrap_or_else(|e| e.into_inner()).0;
        }
        true
    }

    /// The delay and whether to hold, for an operation starting now.
    fn before(&self) -> (Duration, bool) {
        let g = self.lock();
        (g.delay, g.hung)
    }

    /// Block this thread while hung.
    fn wait_sync(&self) {
        let mut g = self.lock();
        if !g.hung {
            return;
        }
        self.held.fetch_add(1, SeqCst);
        self.released.notify_all();
        while g.hung {
            g = self.released.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        self.held.fetch_sub(1, SeqCst);
    }

    fn read_fails(&self, bytes: &[u8]) -> bool {
        let fails = match &self.lock().read {
            ReadFault::Off => false,
            ReadFault::All => true,
            ReadFault::Matching(p) => !p.is_empty() && bytes.windows(p.len()).any(|w| w == &p[..]),
        };
        if fails {
            self.failed_reads.fetch_add(1, SeqCst);
        }
        fails
    }

    fn write_fails(&self) -> bool {
        let fails = self.lock().write_eio;
        if fails {
            self.failed_writes.fetch_add(1, SeqCst);
        }
        fails
    }

    /// Run the commands of `list`, separated by `;` (blank ones skipped);
    /// the first reply that is not "ok" is the error.
    pub fn apply_all(&self, list: &str) -> Result<(), String> {
        for cmd in list.split(';').map(str::trim).filter(|c| !c.is_empty()) {
            let reply = self.command(cmd);
            if !reply.starts_with("ok") {
                return Err(format!("{cmd:?}: {reply}"));
            }
        }
        Ok(())
    }

    /// Run one command line of the control protocol (docs/FAULTS.md);
    /// the reply line, without its newline.
    pub fn command(&self, line: &str) -> String {
        let words: Vec<&str> = line.split_whitespace().collect();
        let ok = |s: &str| format!("ok{s}");
        match words.as_slice() {
            ["read-eio", "off"] => self.set_read(ReadFault::Off),
            ["read-eio", "all"] => self.set_read(ReadFault::All),
            ["read-eio", "match", pattern] => self.set_read(ReadFault::Matching(pattern.as_bytes().to_vec())),
            ["write-eio", on @ ("on" | "off")] => self.set_write_eio(*on == "on"),
            ["delay-ms", ms] => match ms.parse::<u64>() {
                Ok(ms) => self.set_delay(Duration::from_millis(ms)),
                Err(_) => return format!("error: delay-ms {ms}: not a number"),
            },
            ["hang"] => self.set_hung(true),
            ["release"] => self.set_hung(false),
            ["wait-held", n] => match n.parse::<u64>() {
                Ok(n) if self.wait_held(n, Duration::from_secs(10)) => {}
                Ok(n) => return format!("error: fewer than {n} operations held after 10 s"),
                Err(_) => return format!("error: wait-held {n}: not a number"),
            },
            ["status"] => {
                let (r, w) = self.failed();
                return ok(&format!(" held={} failed_reads={r} failed_writes={w}", self.held()));
            }
            _ => return format!("error: unknown command {line:?}"),
        }
        ok("")
    }
}

/// A device whose operations fail, slow down or stop on command. See the
/// module doc.
pub struct InjectDevice {
    inner: Arc<dyn Device>,
    controls: Arc<Controls>,
}

impl InjectDevice {
    /// `inner`, with no fault set.
    pub fn new(inner: Arc<dyn Device>) -> InjectDevice {
        InjectDevice::with_controls(inner, Arc::new(Controls::new()))
    }

    /// `inner`, with the faults `controls` sets.
    pub fn with_controls(inner: Arc<dyn Device>, controls: Arc<Controls>) -> InjectDevice {
        InjectDevice { inner, controls }
    }

    /// What sets its faults.
    pub fn controls(&self) -> Arc<Controls> {
        self.controls.clone()
    }

    fn faulty(&self) -> bool {
        self.controls.any.load(SeqCst)
    }

    /// The delay, then the wait for a release (synchronous forms).
    fn gate_sync(&self) {
        let (delay, hung) = self.controls.before();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        if hung {
            self.controls.wait_sync();
        }
    }

    /// [`InjectDevice::gate_sync`] for an operation that changes the
    /// device (a flush, a discard, a zone reset): EIO if writes fail.
    fn gate_write_sync(&self) -> io::Result<()> {
        if self.faulty() {
            self.gate_sync();
            if self.controls.write_fails() {
                return Err(eio());
            }
        }
        Ok(())
    }

    /// The delay, then a future that waits for a release (asynchronous forms).
    fn gate_async(&self) -> Release<'_> {
        let (delay, _) = self.controls.before();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        Release { c: &self.controls, counted: false }
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

/// Pending while the device is hung.
struct Release<'a> {
    c: &'a Controls,
    counted: bool,
}

impl Future for Release<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut g = self.c.lock();
        if !g.hung {
            drop(g);
            if self.counted {
                self.c.held.fetch_sub(1, SeqCst);
                self.counted = false;
            }
            return Poll::Ready(());
        }
        // Polled again while hung (a spurious wake-up): one waker each.
        if !g.waiters.iter().any(|w| w.will_wake(cx.waker())) {
            g.waiters.push(cx.waker().clone());
        }
        drop(g);
        if !self.counted {
            self.counted = true;
            self.c.held.fetch_add(1, SeqCst);
            self.c.released.notify_all();
        }
        Poll::Pending
    }
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        if self.counted {
            self.c.held.fetch_sub(1, SeqCst);
        }
    }
}

impl Device for InjectDevice {
    fn read_at(&self, buf: AlignedBuf, offset: u64) -> IoResult {
        if !self.faulty() {
            return self.inner.read_at(buf, offset);
        }
        self.gate_sync();
        let (buf, r) = self.inner.read_at(buf, offset);
        if r.is_ok() && self.controls.read_fails(&buf) {
            return (buf, Err(eio()));
        }
        (buf, r)
    }

    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoResult {
        if !self.faulty() {
            return self.inner.write_at(buf, offset);
        }
        self.gate_sync();
        if self.controls.write_fails() {
            return (buf, Err(eio()));
        }
        self.inner.write_at(buf, offset)
    }

    fn read_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        if !self.faulty() {
            return self.inner.read_at_async(buf, offset);
        }
        let release = self.gate_async();
        IoFuture::Pending(Box::pin(async move {
            release.await;
            let (buf, r) = self.inner.read_at_async(buf, offset).await;
            if r.is_ok() && self.controls.read_fails(&buf) {
                return (buf, Err(eio()));
            }
            (buf, r)
        }))
    }

    fn write_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        if !self.faulty() {
            return self.inner.write_at_async(buf, offset);
        }
        let release = self.gate_async();
        IoFuture::Pending(Box::pin(async move {
            release.await;
            if self.controls.write_fails() {
                return (buf, Err(eio()));
            }
            self.inner.write_at_async(buf, offset).await
        }))
    }

    fn in_memory(&self) -> bool {
        self.inner.in_memory()
    }

    fn flush(&self) -> io::Result<()> {
        self.gate_write_sync()?;
        self.inner.flush()
    }

    fn flush_async(&self) -> crate::FlushFuture<'_> {
        if !self.faulty() {
            return self.inner.flush_async();
        }
        let release = self.gate_async();
        Box::pin(async move {
            release.await;
            if self.controls.write_fails() {
                return Err(eio());
            }
            self.inner.flush_async().await
        })
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.gate_write_sync()?;
        self.inner.discard(offset, len)
    }

    fn discards_by_default(&self) -> bool {
        self.inner.discards_by_default()
    }

    fn zones(&self) -> Option<crate::ZoneGeometry> {
        self.inner.zones()
    }

    fn reset_zones(&self, offset: u64, len: u64) -> io::Result<()> {
        self.gate_write_sync()?;
        self.inner.reset_zones(offset, len)
    }

    fn finish_zones(&self, offset: u64, len: u64) -> io::Result<()> {
        self.gate_write_sync()?;
        self.inner.finish_zones(offset, len)
    }

    fn write_pointer(&self, offset: u64) -> io::Result<u64> {
        if self.faulty() {
            self.gate_sync();
        }
        self.inner.write_pointer(offset)
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn block_bytes(&self) -> u32 {
        self.inner.block_bytes()
    }

    fn counters(&self) -> &IoCounters {
        self.inner.counters()
    }

    fn describe(&self) -> String {
        format!("{} (fault injection)", self.inner.describe())
    }

    fn release(&self) {
        self.inner.release()
    }

    fn claim(&self) -> io::Result<()> {
        self.inner.claim()
    }
}

/// Take commands for `controls` on a Unix socket made at `path` (an old
/// socket file there is replaced), on a thread of its own, for the life of
/// the process: one command per line, one reply line each ("ok ..." or
/// "error: ..."); several connections may come and go.
pub fn serve_control(path: &std::path::Path, controls: Arc<Controls>) -> io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    std::thread::Builder::new().name("granary-fault-control".into()).spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let c = controls.clone();
            let _ = std::thread::Builder::new().name("granary-fault-conn".into()).spawn(move || {
                let Ok(mut out) = conn.try_clone() else { return };
                for line in io::BufReader::new(conn).lines() {
                    let Ok(line) = line else { return };
                    let reply = c.command(&line);
                    if writeln!(out, "{reply}").is_err() {
                        return;
                    }
                }
            });
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    fn dev() -> (InjectDevice, Arc<Controls>) {
        let d = InjectDevice::new(Arc::new(MemDevice::new(1 << 20)));
        let c = d.controls();
        (d, c)
    }

    fn block(fill: &[u8]) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(4096);
        b[..fill.len()].copy_from_slice(fill);
        b
    }

    #[test]
    fn reads_fail_only_where_the_pattern_is() {
        let (d, c) = dev();
        d.write_at(block(b"victim-key"), 0).1.unwrap();
        d.write_at(block(b"other-key"), 4096).1.unwrap();
        assert_eq!(c.command("read-eio match victim-key"), "ok");
        let e = d.read_at(AlignedBuf::zeroed(4096), 0).1.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        d.read_at(AlignedBuf::zeroed(4096), 4096).1.unwrap();
        assert_eq!(c.command("read-eio all"), "ok");
        assert!(d.read_at(AlignedBuf::zeroed(4096), 4096).1.is_err());
        assert_eq!(c.command("read-eio off"), "ok");
        let (b, r) = d.read_at(AlignedBuf::zeroed(4096), 0);
        r.unwrap();
        assert_eq!(&b[..10], b"victim-key");
        assert_eq!(c.failed(), (2, 0));
    }

    #[test]
    fn failed_writes_leave_the_device_unchanged() {
        let (d, c) = dev();
        d.write_at(block(b"before"), 0).1.unwrap();
        assert_eq!(c.command("write-eio on"), "ok");
        assert!(d.write_at(block(b"after!"), 0).1.is_err());
        assert!(d.flush().is_err());
        assert_eq!(c.command("write-eio off"), "ok");
        let (b, r) = d.read_at(AlignedBuf::zeroed(4096), 0);
        r.unwrap();
        assert_eq!(&b[..6], b"before");
        assert_eq!(c.failed(), (0, 2));
    }

    #[test]
    fn hung_operations_complete_once_released() {
        let (d, c) = dev();
        let d = Arc::new(d);
        assert_eq!(c.command("hang"), "ok");
        let d2 = d.clone();
        let t = std::thread::spawn(move || d2.write_at(block(b"held"), 0).1.is_ok());
        assert_eq!(c.command("wait-held 1"), "ok");
        assert_eq!(c.command("status"), "ok held=1 failed_reads=0 failed_writes=0");
        assert_eq!(c.command("release"), "ok");
        assert!(t.join().unwrap());
        assert_eq!(c.held(), 0);
        let (b, r) = d.read_at(AlignedBuf::zeroed(4096), 0);
        r.unwrap();
        assert_eq!(&b[..4], b"held");
    }

    #[test]
    fn async_reads_stay_pending_while_hung() {
        let (d, c) = dev();
        c.set_hung(true);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut f = d.read_at_async(AlignedBuf::zeroed(4096), 0);
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        assert_eq!(c.held(), 1);
        c.set_hung(false);
        match Pin::new(&mut f).poll(&mut cx) {
            Poll::Ready((_, r)) => r.unwrap(),
            Poll::Pending => panic!("still pending after the release"),
        }
        assert_eq!(c.held(), 0);
    }

    #[test]
    fn every_call_reaches_the_inner_device_when_no_fault_is_set() {
        let (d, c) = dev();
        d.write_at(block(&[0x55; 8]), 0).1.unwrap();
        d.discard(0, 4096).unwrap();
        let (b, r) = d.read_at(AlignedBuf::zeroed(4096), 0);
        r.unwrap();
        assert_eq!(&b[..8], &[0; 8], "the discard reached the memory device");
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let before = d.counters().snapshot().flushes;
        assert!(matches!(d.flush_async().as_mut().poll(&mut cx), Poll::Ready(Ok(()))));
        assert_eq!(d.counters().snapshot().flushes, before + 1);
        let zoned = InjectDevice::new(Arc::new(crate::ZonedDevice::new(4, 1 << 20, 2, 2)));
        assert!(zoned.zones().is_some(), "a zoned device stays zoned when wrapped");
        assert_eq!(zoned.write_pointer(1 << 20).unwrap(), 1 << 20);
        c.set_write_eio(true);
        assert!(d.discard(0, 4096).is_err());
        assert!(matches!(d.flush_async().as_mut().poll(&mut cx), Poll::Ready(Err(_))));
        assert_eq!(c.failed(), (0, 2));
    }

    #[test]
    fn a_hung_async_flush_stays_pending_and_its_polls_keep_one_waker() {
        let (d, c) = dev();
        c.set_hung(true);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut f = d.flush_async();
        for _ in 0..3 {
            assert!(f.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(c.held(), 1);
        assert_eq!(c.lock().waiters.len(), 1);
        c.set_hung(false);
        assert!(matches!(f.as_mut().poll(&mut cx), Poll::Ready(Ok(()))));
        assert_eq!(c.held(), 0);
    }

    #[test]
    fn unknown_commands_are_refused() {
        let (_, c) = dev();
        assert!(c.command("explode").starts_with("error"));
        assert!(c.command("delay-ms x").starts_with("error"));
        assert_eq!(c.command("delay-ms 0"), "ok");
    }

    #[test]
    fn a_list_of_commands_applies_each_and_stops_at_the_first_error() {
        let (_, c) = dev();
        c.apply_all(" delay-ms 7 ; ;write-eio on").unwrap();
        assert_eq!(c.before(), (Duration::from_millis(7), false));
        assert!(c.write_fails());
        let e = c.apply_all("write-eio off; explode; hang").unwrap_err();
        assert!(e.contains("explode"), "{e}");
        assert!(!c.write_fails(), "the command before the error was not applied");
        assert_eq!(c.before(), (Duration::from_millis(7), false), "a command after the error was applied");
    }
}
