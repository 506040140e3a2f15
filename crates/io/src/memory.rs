//! [`MemDevice`]: a device in DRAM, for tests and for measuring the engine's
//! software overhead without a disk.
//!
//! Reads run concurrently; writes take an exclusive lock. Tests reach the raw
//! bytes with [`MemDevice::with_bytes_mut`] to corrupt or inspect them,
//! [`MemDevice::fail_writes`] makes every later write fail with EIO, and
//! [`MemDevice::crash_after`] simulates a process crash: after a chosen
//! number of writes, the next one is torn at sector (512 B) granularity (a
//! seeded prefix of its sectors reaches the device) and it and every later
//! write and flush fail, until [`MemDevice::restart`].
//!
//! **On an executor** (`granary-rt`, outside its `block_on`),
//! [`Device::read_at_async`] asks the CPU for the first
//! [`READ_PREFETCH_LINES`] lines of the range and yields once before it
//! copies, the in-memory counterpart of submitting a read and waiting for
//! its completion: the executor runs its other ready tasks meanwhile, so
//! the DRAM misses of a core's concurrent reads overlap instead of
//! following one another. Elsewhere (the synchronous API, also when called
//! from a task) a read copies at once. With the engine's own yield before
//! its index lookup ([`Device::in_memory`]), 8-32 GETs in flight on one
//! executor make more GETs per second than the same tasks without either
//! yield (docs/BENCHMARKS-HISTORY.md).
//!
//! Its operations are counted (ops, bytes) but not timed: each is a memory
//! copy, and the two clock reads a timing needs cost about as much as a
//! 4 KiB copy, which would distort
//! the software ceiling the device is there to measure. Its latency
//! histograms stay empty.

use crate::{check_range, AlignedBuf, Device, IoCounters, IoFuture, IoResult};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, RwLock};

/// A transparent huge page on x86-64 (and most arm64 kernels).
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Cache lines of a read that [`Device::read_at_async`] asks memory for
/// before it yields on an executor. The CPU's own prefetcher streams the
/// rest once the copy starts; more lines only fill the CPU's miss buffers
/// (a 4 KiB read's 64 prefetches would be a visible share of an in-memory
/// GET). On random 4 KiB copies out of 800 MiB, each prefetched 4 copies
/// ahead, 8 or 16 lines copy fastest, 4 or 64 lines less so, and no
/// prefetch slowest (`cargo run --release -p granary-bench --example
/// prefetch_copies` measures it; docs/BENCHMARKS-HISTORY.md).
pub const READ_PREFETCH_LINES: usize = 8;

/// A planned crash: writes left before it, the seed of the tear, and
/// whether it happened.
#[derive(Debug, Clone, Copy)]
struct Crash {
    writes_left: u64,
    seed: u64,
    crashed: bool,
}

pub struct MemDevice {
    bytes: RwLock<Vec<u8>>,
    /// `bytes.len()`, which never changes (read without the lock).
    size: u64,
    block: u32,
    fail_writes: AtomicBool,
    crash: Mutex<Option<Crash>>,
    counters: IoCounters,
}

impl MemDevice {
    /// A zeroed device of `size_bytes` with 512-byte blocks.
    pub fn new(size_bytes: u64) -> MemDevice {
        MemDevice::with_block(size_bytes, 512)
    }

    /// [`MemDevice::new`] for a size a user gave, refusing what `new`
    /// panics or aborts on: a size that is zero, not a multiple of 512 or
    /// more than an address space holds (`InvalidInput`), or more memory
    /// than the allocator grants (`OutOfMemory`; `vec!` would abort the
    /// process). The probe allocates without touching a page, so it costs
    /// no memory; the allocator may still overcommit, as for any `vec!`.
    pub fn try_new(size_bytes: u64) -> io::Result<MemDevice> {
        if size_bytes == 0 || !size_bytes.is_multiple_of(512) || size_bytes > isize::MAX as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("an in-memory store's size is a positive multiple of 512, not {size_bytes}"),
            ));
        }
        if Vec::<u8>::new().try_reserve_exact(size_bytes as usize).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("cannot allocate an in-memory store of {size_bytes} bytes"),
            ));
        }
        Ok(MemDevice::new(size_bytes))
    }

    pub fn with_block(size_bytes: u64, block: u32) -> MemDevice {
        assert!(size_bytes.is_multiple_of(block as u64));
        MemDevice {
            bytes: RwLock::new(vec![0; size_bytes as usize]),
            size: size_bytes,
            block,
            fail_writes: AtomicBool::new(false),
            crash: Mutex::new(None),
            counters: IoCounters::default(),
        }
    }

    /// [`MemDevice::new`] on transparent huge pages (`MADV_HUGEPAGE` on
    /// the 2 MiB-aligned part of its memory, asked before anything is
    /// written there): a random 4 KiB read then takes no TLB miss of its
    /// own, and filling the device takes a fault per 2 MiB, not per 4 KiB.
    /// For a device that will be filled (the benchmarks' in-memory
    /// backend); a large, sparsely written one (most tests) would hold
    /// 2 MiB for every place it touches. A kernel without THP ignores it.
    pub fn new_huge(size_bytes: u64) -> MemDevice {
        let dev = MemDevice::new(size_bytes);
        {
            let bytes = dev.bytes.read().unwrap_or_else(|e| e.into_inner());
            let base = bytes.as_ptr() as usize;
            let lo = base.next_multiple_of(HUGE_PAGE_BYTES);
            let hi = (base + bytes.len()) & !(HUGE_PAGE_BYTES - 1);
            if hi > lo {
                // SAFETY: [lo, hi) lies inside the vector's allocation and is
                // page-aligned; the advice changes no contents.
                unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
            }
        }
        dev
    }

    /// Ask the CPU to start loading the first [`READ_PREFETCH_LINES`] cache
    /// lines of `[offset, offset + len)` (a hint: nothing is read, nothing
    /// can fault). The caller checked the range.
    fn prefetch(&self, offset: usize, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let bytes = self.bytes.read().unwrap_or_else(|e| e.into_inner());
            let end = offset + len.min(READ_PREFETCH_LINES * 64);
            for at in (offset..end).step_by(64) {
                // SAFETY: `at` lies inside the vector (the range was checked
                // against the device's size, which is the vector's length);
                // a prefetch reads nothing and cannot fault.
                unsafe {
                    std::arch::x86_64::_mm_prefetch(bytes.as_ptr().add(at) as *const i8, std::arch::x86_64::_MM_HINT_T0)
                };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (offset, len);
    }

    /// Run `f` on the raw bytes (tests: corrupt, inspect).
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(&mut self.bytes.write().unwrap_or_else(|e| e.into_inner()))
    }

    /// Make every later write fail with EIO (or succeed again).
    pub fn fail_writes(&self, fail: bool) {
        self.fail_writes.store(fail, Relaxed);
    }

    /// Crash after `writes` more writes: the next write is torn (a prefix
    /// of its sectors, chosen by `seed`, is applied) and it and every later
    /// write and flush fail with EIO.
    pub fn crash_after(&self, writes: u64, seed: u64) {
        *self.crash.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Crash { writes_left: writes, seed, crashed: false });
    }

    /// Whether the planned crash has happened.
    pub fn crashed(&self) -> bool {
        self.crash.lock().unwrap_or_else(|e| e.into_inner()).is_some_and(|c| c.crashed)
    }

    /// Forget the crash: the device works again, as after a restart.
    pub fn restart(&self) {
        *self.crash.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Apply the crash plan to a write of `len` bytes: how many leading
    /// bytes reach the device, and whether the write fails.
    fn plan(&self, len: usize) -> (usize, bool) {
        let mut crash = self.crash.lock().unwrap_or_else(|e| e.into_inner());
        let Some(c) = crash.as_mut() else { return (len, false) };
        if c.crashed {
            return (0, true);
        }
        if c.writes_left > 0 {
            c.writes_left -= 1;
            return (len, false);
        }
        c.crashed = true;
        let sectors = len / 512;
        let kept = crate::SimRng::new(c.seed).below(sectors as u64 + 1) as usize;
        (kept * 512, true)
    }
}

impl Device for MemDevice {
    fn read_at(&self, mut buf: AlignedBuf, offset: u64) -> IoResult {
        if let Err(e) = check_range(self, buf.len(), offset) {
            return (buf, Err(e));
        }
        {
            let bytes = self.bytes.read().unwrap_or_else(|e| e.into_inner());
            let o = offset as usize;
            let n = buf.len();
            buf.copy_from_slice(&bytes[o..o + n]);
        }
        self.counters.count_read(buf.len());
        (buf, Ok(()))
    }

    /// On a `granary-rt` executor (outside `block_on`): ask memory for the
    /// first [`READ_PREFETCH_LINES`] cache lines of the range, then yield
    /// once before copying (see the module doc); elsewhere, copy at once.
    fn read_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        if !granary_rt::on_runtime() || check_range(self, buf.len(), offset).is_err() {
            return IoFuture::ready(self.read_at(buf, offset));
        }
        self.prefetch(offset as usize, buf.len());
        IoFuture::ReadAfterYield { dev: self, buf: Some(buf), offset, yielded: false }
    }

    fn in_memory(&self) -> bool {
        true
    }

    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoResult {
        if let Err(e) = check_range(self, buf.len(), offset) {
            return (buf, Err(e));
        }
        if self.fail_writes.load(Relaxed) {
            return (buf, Err(io::Error::from_raw_os_error(libc::EIO)));
        }
        let (applied, failed) = self.plan(buf.len());
        {
            let mut bytes = self.bytes.write().unwrap_or_else(|e| e.into_inner());
            let o = offset as usize;
            bytes[o..o + applied].copy_from_slice(&buf[..applied]);
        }
        if failed {
            return (buf, Err(io::Error::from_raw_os_error(libc::EIO)));
        }
        self.counters.count_write(buf.len());
        (buf, Ok(()))
    }

    /// The range reads as zeros from now on.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self, len as usize, offset)?;
        if self.crashed() || self.fail_writes.load(Relaxed) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let mut bytes = self.bytes.write().unwrap_or_else(|e| e.into_inner());
        bytes[offset as usize..(offset + len) as usize].fill(0);
        drop(bytes);
        self.counters.discard(len);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        if self.crashed() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.counters.flushes.fetch_add(1, Relaxed);
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.size
    }

    fn block_bytes(&self) -> u32 {
        self.block
    }

    fn counters(&self) -> &IoCounters {
        &self.counters
    }

    fn describe(&self) -> String {
        format!("memory device ({} bytes)", self.size_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_injected_eio() {
        let dev = MemDevice::new(1 << 16);
        let mut w = AlignedBuf::zeroed(512);
        w[0] = 42;
        dev.write_at(w, 1024).1.unwrap();
        let (r, res) = dev.read_at(AlignedBuf::zeroed(512), 1024);
        res.unwrap();
        assert_eq!(r[0], 42);
        dev.fail_writes(true);
        let (_, res) = dev.write_at(AlignedBuf::zeroed(512), 0);
        assert_eq!(res.unwrap_err().raw_os_error(), Some(libc::EIO));
        assert_eq!(dev.counters().snapshot().writes, 1);
    }

    /// On an executor a read yields once, so another task runs between the
    /// read's call and its copy (and sees it not yet copied), and the read
    /// then returns the bytes; off an executor it is done at once. A bad
    /// range fails at once either way.
    #[test]
    fn a_read_on_an_executor_yields_once_before_its_copy() {
        let dev = std::sync::Arc::new(MemDevice::new(1 << 16));
        let mut w = AlignedBuf::zeroed(8192);
        w.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
        dev.write_at(w, 4096).1.unwrap();
        let cfg = granary_rt::RuntimeConfig { threads: 1, pin: false, ..Default::default() };
        let rt = granary_rt::Runtime::new(cfg).unwrap();
        let d = dev.clone();
        let (order, bytes) = rt
            .block_on(async move {
                let order = std::sync::Arc::new(Mutex::new(Vec::new()));
                let fut = d.read_at_async(AlignedBuf::zeroed(8192), 4096);
                assert!(matches!(fut, IoFuture::ReadAfterYield { .. }), "on an executor the read yields");
                let o = order.clone();
                let other = granary_rt::spawn(async move { o.lock().unwrap().push("other task") });
                let (b, r) = fut.await;
                r.unwrap();
                order.lock().unwrap().push("read done");
                other.await.unwrap();
                let bad = d.read_at_async(AlignedBuf::zeroed(4096), 1 << 16);
                assert!(matches!(bad, IoFuture::Ready(_)), "a bad range fails at once");
                assert!(bad.await.1.is_err());
                let order = order.lock().unwrap().clone();
                (order, b.to_vec())
            })
            .unwrap();
        assert_eq!(order, ["other task", "read done"], "the spawned task ran while the read waited");
        assert!(bytes.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        let fut = dev.read_at_async(AlignedBuf::zeroed(4096), 4096);
        assert!(matches!(fut, IoFuture::Ready(_)), "off an executor the read copies at once");
        assert_eq!(granary_rt::block_on(fut).0[1], 1);
        assert_eq!(dev.counters().snapshot().reads, 2);
    }

    /// A device on huge pages is zeroed and reads back what was written
    /// across a 2 MiB boundary, like any other.
    #[test]
    fn huge_page_device_round_trips() {
        let dev = MemDevice::new_huge(8 << 20);
        let (r, res) = dev.read_at(AlignedBuf::zeroed(4096), (4 << 20) - 2048);
        res.unwrap();
        assert!(r.iter().all(|&b| b == 0), "a new device reads zeros");
        let mut w = AlignedBuf::zeroed(4096);
        for (i, b) in w.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        dev.write_at(w, (4 << 20) - 2048).1.unwrap();
        let (r, res) = dev.read_at(AlignedBuf::zeroed(4096), (4 << 20) - 2048);
        res.unwrap();
        assert!(r.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        assert_eq!(dev.size_bytes(), 8 << 20);
    }

    #[test]
    fn crash_tears_one_write_and_fails_the_rest() {
        let mut torn_prefixes = std::collections::BTreeSet::new();
        for seed in 0..32 {
            let dev = MemDevice::new(1 << 16);
            dev.crash_after(1, seed);
            let mut w = AlignedBuf::zeroed(4096);
            w.fill(0xAB);
            dev.write_at(w, 0).1.unwrap();
            let mut w = AlignedBuf::zeroed(4096);
            w.fill(0xCD);
            assert!(dev.write_at(w, 8192).1.is_err());
            assert!(dev.crashed());
            assert!(dev.write_at(AlignedBuf::zeroed(512), 0).1.is_err());
            assert!(dev.flush().is_err());
            let applied = dev.with_bytes_mut(|b| b[8192..12288].iter().take_while(|&&x| x == 0xCD).count());
            assert_eq!(applied % 512, 0, "torn at sector granularity");
            assert!(dev.with_bytes_mut(|b| b[8192 + applied..12288].iter().all(|&x| x == 0)));
            assert!(dev.with_bytes_mut(|b| b[..4096].iter().all(|&x| x == 0xAB)), "the earlier write survives");
            torn_prefixes.insert(applied);
            dev.restart();
            dev.write_at(AlignedBuf::zeroed(512), 0).1.unwrap();
        }
        assert!(torn_prefixes.len() > 3, "seeds choose different tears: {torn_prefixes:?}");
    }
}
