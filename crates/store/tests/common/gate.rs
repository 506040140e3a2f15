//! A device whose async writes wait while its gate is shut, as a slow
//! device's would: tests hold writes in flight with it (to drop their
//! futures midway, or to queue other writes behind them). Reads and the
//! synchronous calls go on; the gate counts each poll of a held write and
//! names the thread that completes it.

use granary_store::io::{AlignedBuf, Device, IoCounters, IoFuture, IoResult, TestBackend, TestDevice, ZoneGeometry};
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// A device whose async writes wait while its gate is shut.
pub struct Gate {
    pub inner: TestDevice,
    shut: AtomicBool,
    /// Polls of held writes that found the gate shut.
    pub held_polls: AtomicU64,
    wakers: Mutex<Vec<Waker>>,
    /// The threads that completed held writes, by name.
    pub completed_on: Mutex<Vec<String>>,
}

impl Gate {
    /// On the backend `GRANARY_TEST_BACKEND` picks, in zones of `zone`
    /// bytes when zoned.
    pub fn new(size: u64, zone: u64) -> Arc<Gate> {
        Gate::on(TestBackend::from_env(), size, zone)
    }

    pub fn on(backend: TestBackend, size: u64, zone: u64) -> Arc<Gate> {
        let inner = TestDevice::with_backend(backend, size, std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
        inner.shape_zones(zone);
        Arc::new(Gate {
            inner,
            shut: AtomicBool::new(false),
            held_polls: AtomicU64::new(0),
            wakers: Mutex::new(vec![]),
            completed_on: Mutex::new(vec![]),
        })
    }

    pub fn shut(&self) {
        self.shut.store(true, SeqCst);
    }

    pub fn open(&self) {
        self.shut.store(false, SeqCst);
        for w in self.wakers.lock().unwrap().drain(..) {
            w.wake();
        }
    }
}

struct HeldWrite<'a> {
    gate: &'a Gate,
    buf: Option<AlignedBuf>,
    offset: u64,
}

impl Future for HeldWrite<'_> {
    type Output = IoResult;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<IoResult> {
        if self.gate.shut.load(SeqCst) {
            self.gate.wakers.lock().unwrap().push(cx.waker().clone());
            if self.gate.shut.load(SeqCst) {
                self.gate.held_polls.fetch_add(1, SeqCst);
                return Poll::Pending;
            }
        }
        let buf = self.buf.take().expect("polled after completion");
        let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
        self.gate.completed_on.lock().unwrap().push(thread);
        Poll::Ready(self.gate.inner.write_at(buf, self.offset))
    }
}

impl Device for Gate {
    fn read_at(&self, buf: AlignedBuf, offset: u64) -> IoResult {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoResult {
        self.inner.write_at(buf, offset)
    }
    fn read_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        self.inner.read_at_async(buf, offset)
    }
    fn write_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        IoFuture::Pending(Box::pin(HeldWrite { gate: self, buf: Some(buf), offset }))
    }
    fn in_memory(&self) -> bool {
        self.inner.in_memory()
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.discard(offset, len)
    }
    fn zones(&self) -> Option<ZoneGeometry> {
        self.inner.zones()
    }
    fn reset_zones(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.reset_zones(offset, len)
    }
    fn finish_zones(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.finish_zones(offset, len)
    }
    fn write_pointer(&self, offset: u64) -> std::io::Result<u64> {
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
        format!("gate in front of {}", self.inner.describe())
    }
}

/// Poll `f` once (it must wait).
pub async fn poll_once<F: Future + ?Sized>(f: Pin<&mut F>) {
    let mut f = Some(f);
    poll_fn(|cx| {
        assert!(f.take().unwrap().poll(cx).is_pending(), "the write was expected to wait");
        Poll::Ready(())
    })
    .await;
}
