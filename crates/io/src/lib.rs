//! Device IO behind one trait, [`Device`], with owned buffers.
//!
//! Every operation takes an [`AlignedBuf`] by value and hands it back with
//! the result. That is what an asynchronous backend (io_uring) needs, since
//! the kernel owns a buffer until the operation completes; the synchronous
//! backends follow the same shape so the engine is written once.
//!
//! Each operation also has an asynchronous form (`read_at_async`,
//! `write_at_async`) returning an [`IoFuture`]. Synchronous backends answer
//! it at once (a ready future, no allocation), but for the in-memory
//! device's reads on an executor, which yield once before their copy
//! ([`memory`]); the io_uring backend submits to the current executor's
//! ring when called on a `granary-rt` executor, and to the calling thread's
//! private ring elsewhere.
//!
//! Backends: [`file::FileDevice`] (O_DIRECT by default, on a regular file or
//! a block device; synchronous pread/pwrite, or io_uring with
//! [`IoBackend::Uring`]), [`memory::MemDevice`] (tests, and the measure
//! of pure software overhead) and [`fault::FaultDevice`] (crash simulation:
//! torn and lost writes, EIO, reordered completions; its doc states the
//! fault model). [`stripe::StripedDevice`] stripes one logical device over
//! several (RAID-0); [`spec::DeviceSpec`] names one device or a stripe set
//! on the command line; [`testdev::TestDevice`] is the engine test suite's
//! device, on either backend; [`zoned::ZonedDevice`] emulates a zoned
//! block device and enforces its rules. Every backend counts the bytes and
//! operations it performs in [`IoCounters`], the ground truth for write
//! amplification.

pub mod buf;
pub mod fault;
pub mod file;
pub mod inject;
pub mod memory;
pub mod spec;
pub mod stripe;
pub mod testdev;
pub mod zoned;

pub use buf::AlignedBuf;
pub use fault::{CrashKind, FaultDevice, OpKind, SimRng, TraceEvent};
pub use file::{FileDevice, IoBackend, OpenMode};
pub use inject::InjectDevice;
pub use memory::MemDevice;
pub use spec::DeviceSpec;
pub use stripe::StripedDevice;
pub use testdev::{TestBackend, TestDevice};
pub use zoned::{Zone, ZoneCond, ZonedDevice};

/// The zone geometry of a zoned block device ([`Device::zones`]): equal
/// zones from offset 0, the first `conventional_bytes` of them
/// conventional (written anywhere, as a plain device), the others
/// sequential-write-required (written only at their write pointer, made
/// writable again by a reset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneGeometry {
    pub zone_bytes: u64,
    /// Bytes of conventional zones at the start (a multiple of `zone_bytes`).
    pub conventional_bytes: u64,
    /// Most zones open (implicitly or explicitly) at once.
    pub max_open: usize,
    /// Most zones open or closed (partly written) at once.
    pub max_active: usize,
}

fn not_zoned(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, format!("{what} is not a zoned device"))
}

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Instant;

use granary_rt::latency::{self, Histogram};

/// Result of an operation: the buffer comes back whatever happened.
pub type IoResult = (AlignedBuf, io::Result<()>);

/// A flush in progress ([`Device::flush_async`]).
pub type FlushFuture<'a> = Pin<Box<dyn Future<Output = io::Result<()>> + Send + 'a>>;

/// An operation in progress: either already done (synchronous backends),
/// waiting for its completion on the current executor's ring, or a
/// synchronous read run after one yield to the executor.
pub enum IoFuture<'a> {
    Ready(Option<IoResult>),
    Pending(Pin<Box<dyn Future<Output = IoResult> + Send + 'a>>),
    /// `dev.read_at(buf, offset)`, run at the second poll: the first poll
    /// wakes the task and returns `Pending`, so the executor runs its other
    /// ready tasks in between (the in-memory device's read on an executor:
    /// the record's first lines were asked of memory when the read was
    /// made; see [`memory`]). Allocates nothing.
    ReadAfterYield {
        dev: &'a dyn Device,
        buf: Option<AlignedBuf>,
        offset: u64,
        yielded: bool,
    },
}

impl IoFuture<'_> {
    pub fn ready(r: IoResult) -> Self {
        IoFuture::Ready(Some(r))
    }
}

impl Future for IoFuture<'_> {
    type Output = IoResult;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<IoResult> {
        match self.get_mut() {
            IoFuture::Ready(r) => Poll::Ready(r.take().expect("IoFuture polled after completion")),
            IoFuture::Pending(f) => f.as_mut().poll(cx),
            IoFuture::ReadAfterYield { dev, buf, offset, yielded } => {
                if !*yielded {
                    *yielded = true;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Poll::Ready(dev.read_at(buf.take().expect("IoFuture polled after completion"), *offset))
            }
        }
    }
}

/// A block device or file, addressed in bytes.
///
/// Offsets and lengths must be multiples of [`Device::block_bytes`]; buffers
/// from [`AlignedBuf`] are always aligned enough. Reads and writes transfer
/// the whole buffer or fail: short transfers and EINTR are handled inside.
pub trait Device: Send + Sync + 'static {
    /// Read `buf.len()` bytes at `offset` into `buf`.
    fn read_at(&self, buf: AlignedBuf, offset: u64) -> IoResult;
    /// Write all of `buf` at `offset`. When it returns Ok the data is on the
    /// device (for direct IO), or in the page cache (buffered mode).
    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoResult;
    /// [`Device::read_at`] as a future; synchronous unless the backend
    /// submits to an executor's ring.
    fn read_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        IoFuture::ready(self.read_at(buf, offset))
    }
    /// [`Device::write_at`] as a future.
    fn write_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        IoFuture::ready(self.write_at(buf, offset))
    }
    /// Whether reads are copies out of DRAM (the in-memory device): on an
    /// executor the engine then asks for the index's cache line and yields
    /// before a lookup, as the device does before a copy, so that the
    /// memory misses of a core's concurrent operations overlap, as device
    /// IO does (docs/ARCHITECTURE.md, "In-memory reads on an executor").
    fn in_memory(&self) -> bool {
        false
    }
    /// Make every completed write durable (fdatasync).
    fn flush(&self) -> io::Result<()>;
    /// [`Device::flush`] as a future: through an executor's ring where the
    /// backend submits there (the executor runs its other tasks while the
    /// device flushes), else the synchronous call.
    fn flush_async(&self) -> FlushFuture<'_> {
        Box::pin(std::future::ready(self.flush()))
    }
    /// Tell the device that `len` bytes at `offset` (block-aligned) hold
    /// nothing any more: a TRIM (BLKDISCARD) on a block device, a punched
    /// hole in a file, zeros in memory. What they read afterwards is
    /// undefined (old data or zeros). Default: nothing.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
    /// Whether discarding freed space pays by default (block devices: the
    /// drive's own GC stops copying what the store no longer holds). A
    /// file's holes cost a later direct write its extent conversion.
    fn discards_by_default(&self) -> bool {
        false
    }
    /// The zone geometry of a zoned device (None: not zoned, the default).
    /// On a zoned device every write to a sequential zone must start at
    /// that zone's write pointer.
    fn zones(&self) -> Option<ZoneGeometry> {
        None
    }
    /// Reset the sequential zones of `len` bytes at `offset` (whole zones;
    /// `BLKRESETZONE`): empty, their write pointers back at their starts.
    fn reset_zones(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Err(not_zoned(self.describe()))
    }
    /// Finish the sequential zones of `len` bytes at `offset` (whole zones;
    /// `BLKFINISHZONE`): full, no longer open or active.
    fn finish_zones(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Err(not_zoned(self.describe()))
    }
    /// The write pointer (a device offset) of the sequential zone holding
    /// `offset` (`BLKREPORTZONE`).
    fn write_pointer(&self, offset: u64) -> io::Result<u64> {
        let _ = offset;
        Err(not_zoned(self.describe()))
    }
    /// Usable size in bytes.
    fn size_bytes(&self) -> u64;
    /// Required alignment of offsets and lengths.
    fn block_bytes(&self) -> u32;
    /// Bytes and operations performed so far.
    fn counters(&self) -> &IoCounters;
    /// A short description for logs and errors (path, mode).
    fn describe(&self) -> String;
    /// The store using it has closed: give up what keeps another open
    /// of the same device out (a file's `flock`, a block device's
    /// exclusive claim), though handles on the
    /// closed store may still hold the device itself. A file device then
    /// refuses new operations (a call that raced the close fails) and
    /// unlocks once those under way have ended; [`Device::claim`] undoes
    /// it. Default: nothing.
    fn release(&self) {}
    /// Take the device back after a [`Device::release`] (a store opened on
    /// it again): its lock again, or an error if another process holds it
    /// now. Default, and for a device never released: nothing.
    fn claim(&self) -> io::Result<()> {
        Ok(())
    }
}

/// Counters every backend keeps: operations and bytes that completed, and
/// the latency of each operation (from its start to its completion as the
/// caller sees it: for io_uring, submission queueing included). The
/// in-memory device counts but does not time (see [`memory`]).
#[derive(Debug, Default)]
pub struct IoCounters {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub written_bytes: AtomicU64,
    pub flushes: AtomicU64,
    /// Discards that succeeded, and the bytes they covered.
    pub discards: AtomicU64,
    pub discarded_bytes: AtomicU64,
    pub read_latency: Histogram,
    pub write_latency: Histogram,
    pub flush_latency: Histogram,
}

/// A copy of [`IoCounters`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IoCountersSnapshot {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub written_bytes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub discarded_bytes: u64,
    pub read_latency: latency::Snapshot,
    pub write_latency: latency::Snapshot,
    pub flush_latency: latency::Snapshot,
}

impl IoCounters {
    /// A read of `bytes` that started at `start` completed.
    pub(crate) fn read(&self, bytes: usize, start: Instant) {
        self.reads.fetch_add(1, Relaxed);
        self.read_bytes.fetch_add(bytes as u64, Relaxed);
        self.read_latency.since(start);
    }
    /// A write of `bytes` that started at `start` completed.
    pub(crate) fn write(&self, bytes: usize, start: Instant) {
        self.writes.fetch_add(1, Relaxed);
        self.written_bytes.fetch_add(bytes as u64, Relaxed);
        self.write_latency.since(start);
    }
    /// A read of `bytes` completed, not timed (see [`crate::memory`]).
    pub(crate) fn count_read(&self, bytes: usize) {
        self.reads.fetch_add(1, Relaxed);
        self.read_bytes.fetch_add(bytes as u64, Relaxed);
    }
    /// A write of `bytes` completed, not timed.
    pub(crate) fn count_write(&self, bytes: usize) {
        self.writes.fetch_add(1, Relaxed);
        self.written_bytes.fetch_add(bytes as u64, Relaxed);
    }
    /// A discard of `bytes` succeeded.
    pub(crate) fn discard(&self, bytes: u64) {
        self.discards.fetch_add(1, Relaxed);
        self.discarded_bytes.fetch_add(bytes, Relaxed);
    }
    /// A flush that started at `start` ended (successful or not).
    pub(crate) fn flush(&self, start: Instant) {
        self.flushes.fetch_add(1, Relaxed);
        self.flush_latency.since(start);
    }
    pub fn snapshot(&self) -> IoCountersSnapshot {
        IoCountersSnapshot {
            reads: self.reads.load(Relaxed),
            read_bytes: self.read_bytes.load(Relaxed),
            writes: self.writes.load(Relaxed),
            written_bytes: self.written_bytes.load(Relaxed),
            flushes: self.flushes.load(Relaxed),
            discards: self.discards.load(Relaxed),
            discarded_bytes: self.discarded_bytes.load(Relaxed),
            read_latency: self.read_latency.snapshot(),
            write_latency: self.write_latency.snapshot(),
            flush_latency: self.flush_latency.snapshot(),
        }
    }
}

/// Check an operation's geometry; a violation is a programmer error in the
/// caller, reported as `InvalidInput` rather than sent to the kernel.
pub(crate) fn check_range(dev: &dyn Device, len: usize, offset: u64) -> io::Result<()> {
    let bs = dev.block_bytes() as u64;
    if !offset.is_multiple_of(bs) || !(len as u64).is_multiple_of(bs) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unaligned IO: offset {offset} length {len} (block {bs})"),
        ));
    }
    if offset.checked_add(len as u64).is_none_or(|end| end > dev.size_bytes()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("IO past the end of the device: offset {offset} length {len} size {}", dev.size_bytes()),
        ));
    }
    Ok(())
}
