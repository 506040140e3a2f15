//! [`TestDevice`]: the device the engine's test suite runs on, chosen by the
//! environment so the same tests run on both IO backends:
//!
//! - `GRANARY_TEST_BACKEND` unset or `sync`: a [`MemDevice`] (synchronous,
//!   in memory);
//! - `GRANARY_TEST_BACKEND=uring`: an O_DIRECT [`FileDevice`] with the
//!   io_uring backend, in a fresh directory under the directory the test
//!   names (removed on drop). The synchronous API's IO then goes through
//!   the calling thread's private ring (`granary_rt::sync_ring`), the async
//!   API's through its executor's ring;
//! - `GRANARY_TEST_BACKEND=zoned`: an emulated zoned device
//!   ([`ZonedDevice`], in memory) with one conventional zone at the start
//!   (the store's superblocks), 512-byte blocks and [`ZONED_MAX_OPEN`]
//!   open and active zones at most. Its zones are the store's segments:
//!   a test names the segment size with [`TestDevice::shape_zones`]
//!   before the device's first use (without it, zones of
//!   [`ZONED_DEFAULT_ZONE_BYTES`]). The store then opens in zoned mode.
//!   Every operation the emulation refuses for breaking a zone rule is
//!   printed, and the device's drop fails the test if there was one
//!   ([`TestDevice::zone_violations`]).
//!
//! [`LoopDevice`] puts a file behind a block device for the tests of
//! block devices.
//!
//! Any way the test can corrupt bytes ([`TestDevice::with_bytes_mut`])
//! and make writes fail ([`TestDevice::fail_writes`]). Crash points (torn
//! and lost writes) belong to the simulated devices ([`MemDevice`],
//! [`crate::FaultDevice`]); [`TestDevice::mem`] gives the memory device
//! when there is one.

use crate::{
    AlignedBuf, Device, FileDevice, IoBackend, IoCounters, IoFuture, IoResult, MemDevice, OpenMode, ZoneGeometry,
    ZonedDevice,
};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

/// The environment variable that picks the backend.
pub const BACKEND_VAR: &str = "GRANARY_TEST_BACKEND";

/// A loop device over a file (`losetup`), for tests of block devices;
/// detached on drop.
pub struct LoopDevice(String);

impl LoopDevice {
    /// Attach `backing` to a free loop device, or say why there is none
    /// (not root, no free loop device), for the test to print and skip.
    pub fn attach(backing: &Path) -> Result<LoopDevice, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root (losetup needs it)".into());
        }
        match std::process::Command::new("losetup").args(["-f", "--show"]).arg(backing).output() {
            Ok(o) if o.status.success() => Ok(LoopDevice(String::from_utf8_lossy(&o.stdout).trim().to_string())),
            other => Err(format!("no loop device: {other:?}")),
        }
    }

    /// Its node (`/dev/loopN`).
    pub fn node(&self) -> &str {
        &self.0
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// The zoned backend's limit on open and on active zones: the most the
/// store ever needs (two per segment stream with hot/cold separation's
/// three streams, one more for an index checkpoint), so a zone it opens
/// beyond its own accounting is refused. Drives allow as many or more
/// (Western Digital's ZN540 ZNS SSD: 14).
pub const ZONED_MAX_OPEN: usize = 7;

/// The zoned backend's zone size when the test names none
/// ([`TestDevice::shape_zones`]): the store's first segment starts at
/// 1 MiB, so zones of 1 MiB or less divide it.
pub const ZONED_DEFAULT_ZONE_BYTES: u64 = 1 << 20;

/// Which backend [`TestDevice::new`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestBackend {
    Sync,
    Uring,
    Zoned,
}

impl TestBackend {
    /// From [`BACKEND_VAR`]; panics on a value it does not know, so a typo
    /// never silently runs the other backend.
    pub fn from_env() -> TestBackend {
        match std::env::var(BACKEND_VAR).as_deref() {
            Err(_) | Ok("") | Ok("sync") => TestBackend::Sync,
            Ok("uring") => TestBackend::Uring,
            Ok("zoned") => TestBackend::Zoned,
            Ok(other) => panic!("{BACKEND_VAR}={other:?}: expected sync, uring or zoned"),
        }
    }
}

enum Inner {
    Mem(Arc<MemDevice>),
    File {
        dev: Box<FileDevice>,
        path: PathBuf,
        dir: PathBuf,
    },
    /// Built at its first use, with the zone size named by then.
    Zoned {
        dev: Box<OnceLock<ZonedDevice>>,
        size: u64,
        zone_bytes: OnceLock<u64>,
    },
}

/// A test's device. See the module doc.
pub struct TestDevice {
    inner: Inner,
    fail_writes: AtomicBool,
    /// The first zone rule broken (the zoned backend), for the drop's
    /// failure.
    violation: Mutex<Option<String>>,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

impl TestDevice {
    /// A zeroed device of `size_bytes` on the backend the environment picks;
    /// a file device lives in a new directory under `dir` (which must be on
    /// a filesystem with O_DIRECT, not tmpfs).
    pub fn new(size_bytes: u64, dir: &Path) -> TestDevice {
        Self::with_backend(TestBackend::from_env(), size_bytes, dir)
    }

    pub fn with_backend(backend: TestBackend, size_bytes: u64, dir: &Path) -> TestDevice {
        let inner = match backend {
            TestBackend::Sync => Inner::Mem(Arc::new(MemDevice::new(size_bytes))),
            TestBackend::Uring => {
                let n = NEXT.fetch_add(1, Relaxed);
                let sub = dir.join(format!("granary-testdev-{}-{n}", std::process::id()));
                std::fs::create_dir_all(&sub).expect("test device directory");
                let path = sub.join("dev");
                let dev = FileDevice::create(&path, size_bytes, OpenMode::Direct)
                    .expect("test device file")
                    .with_backend(IoBackend::Uring);
                Inner::File { dev: Box::new(dev), path, dir: sub }
            }
            TestBackend::Zoned => {
                Inner::Zoned { dev: Box::new(OnceLock::new()), size: size_bytes, zone_bytes: OnceLock::new() }
            }
        };
        TestDevice { inner, fail_writes: AtomicBool::new(false), violation: Mutex::new(None) }
    }

    pub fn backend(&self) -> TestBackend {
        match self.inner {
            Inner::Mem(_) => TestBackend::Sync,
            Inner::File { .. } => TestBackend::Uring,
            Inner::Zoned { .. } => TestBackend::Zoned,
        }
    }

    /// The zoned backend: its zones are `zone_bytes` each (the segment
    /// size of the store the test creates). Call before the device's first
    /// use; nothing on the other backends. Panics if the device was built
    /// with another zone size already.
    pub fn shape_zones(&self, zone_bytes: u64) -> &Self {
        if let Inner::Zoned { zone_bytes: z, .. } = &self.inner {
            let set = *z.get_or_init(|| zone_bytes);
            assert_eq!(set, zone_bytes, "the zoned test device was built with {set}-byte zones already");
        }
        self
    }

    /// The memory device, for crash-point tests.
    pub fn mem(&self) -> Option<&Arc<MemDevice>> {
        match &self.inner {
            Inner::Mem(m) => Some(m),
            Inner::File { .. } | Inner::Zoned { .. } => None,
        }
    }

    /// The emulated zoned device (the zoned backend).
    pub fn zoned(&self) -> Option<&ZonedDevice> {
        match &self.inner {
            Inner::Zoned { .. } => Some(self.zoned_dev()),
            _ => None,
        }
    }

    /// Operations the zoned backend refused for breaking a zone rule (0
    /// on the other backends).
    pub fn zone_violations(&self) -> u64 {
        self.zoned().map_or(0, ZonedDevice::violations)
    }

    fn zoned_dev(&self) -> &ZonedDevice {
        let Inner::Zoned { dev, size, zone_bytes } = &self.inner else { unreachable!("not the zoned backend") };
        dev.get_or_init(|| {
            let zone = *zone_bytes.get_or_init(|| ZONED_DEFAULT_ZONE_BYTES);
            let zones = (*size / zone) as usize;
            assert!(zones >= 2, "a zoned test device of {size} bytes holds fewer than two {zone}-byte zones");
            // 512-byte blocks, as the memory device's: the suite's stores
            // have 512-byte grains.
            ZonedDevice::new(zones, zone, ZONED_MAX_OPEN, ZONED_MAX_OPEN).with_conventional(1).with_block_bytes(512)
        })
    }

    /// A zone rule broken (the emulation's `InvalidInput` refusal): printed
    /// at once, the first kept for the drop's failure.
    fn note<T>(&self, r: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &r {
            let msg = e.to_string();
            // The prefix of the emulation's refusals (`zoned::violation`).
            if matches!(self.inner, Inner::Zoned { .. }) && msg.starts_with("zone rule violated") {
                // Straight to stderr, past the test harness's capture.
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "zoned test device: {msg}");
                self.violation.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(msg);
            }
        }
        r
    }

    /// Run `f` on the device's bytes; changes are kept (for a file: read
    /// whole, changed, written back and synced through the page cache,
    /// which direct IO then sees).
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        match &self.inner {
            Inner::Mem(m) => m.with_bytes_mut(f),
            Inner::Zoned { .. } => self.zoned_dev().with_bytes_mut(f),
            Inner::File { path, dev, .. } => {
                let mut bytes = std::fs::read(path).expect("read the test device");
                bytes.truncate(dev.size_bytes() as usize);
                let before = bytes.clone();
                let r = f(&mut bytes);
                if bytes != before {
                    use std::io::{Seek, Write};
                    let mut file = std::fs::OpenOptions::new().write(true).open(path).expect("open the test device");
                    // Only the changed range, so concurrent direct writes
                    // elsewhere are not overwritten with stale bytes.
                    let first = bytes.iter().zip(&before).position(|(a, b)| a != b).expect("a change");
                    let last = bytes.iter().zip(&before).rposition(|(a, b)| a != b).expect("a change");
                    file.seek(std::io::SeekFrom::Start(first as u64)).expect("seek");
                    file.write_all(&bytes[first..=last]).expect("write back");
                    file.sync_all().expect("sync");
                }
                r
            }
        }
    }

    /// Make every later write fail with EIO (or succeed again).
    pub fn fail_writes(&self, fail: bool) {
        self.fail_writes.store(fail, Relaxed);
    }

    fn dev(&self) -> &dyn Device {
        match &self.inner {
            Inner::Mem(m) => m.as_ref(),
            Inner::File { dev, .. } => dev.as_ref(),
            Inner::Zoned { .. } => self.zoned_dev(),
        }
    }

    fn injected(&self) -> Option<io::Error> {
        self.fail_writes.load(Relaxed).then(|| io::Error::from_raw_os_error(libc::EIO))
    }
}

impl Drop for TestDevice {
    fn drop(&mut self) {
        if let Inner::File { dir, .. } = &self.inner {
            let _ = std::fs::remove_dir_all(dir);
        }
        if let Inner::Zoned { dev, .. } = &self.inner {
            let n = dev.get().map_or(0, ZonedDevice::violations);
            if n > 0 && !std::thread::panicking() {
                let first = self.violation.get_mut().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default();
                panic!("the zoned test device refused {n} operations for breaking a zone rule; the first: {first}");
            }
        }
    }
}

impl Device for TestDevice {
    fn read_at(&self, buf: AlignedBuf, offset: u64) -> IoResult {
        self.dev().read_at(buf, offset)
    }
    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoResult {
        if let Some(e) = self.injected() {
            return (buf, Err(e));
        }
        let (buf, r) = self.dev().write_at(buf, offset);
        (buf, self.note(r))
    }
    fn read_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        self.dev().read_at_async(buf, offset)
    }
    fn write_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        if let Some(e) = self.injected() {
            return IoFuture::ready((buf, Err(e)));
        }
        if matches!(self.inner, Inner::Zoned { .. }) {
            // The emulation is synchronous: its refusal is seen here.
            return IoFuture::ready(self.write_at(buf, offset));
        }
        self.dev().write_at_async(buf, offset)
    }
    fn in_memory(&self) -> bool {
        self.dev().in_memory()
    }
    fn flush(&self) -> io::Result<()> {
        self.dev().flush()
    }
    fn flush_async(&self) -> crate::FlushFuture<'_> {
        self.dev().flush_async()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.note(self.dev().discard(offset, len))
    }
    fn discards_by_default(&self) -> bool {
        self.dev().discards_by_default()
    }
    fn zones(&self) -> Option<ZoneGeometry> {
        self.dev().zones()
    }
    fn reset_zones(&self, offset: u64, len: u64) -> io::Result<()> {
        self.note(self.dev().reset_zones(offset, len))
    }
    fn finish_zones(&self, offset: u64, len: u64) -> io::Result<()> {
        self.note(self.dev().finish_zones(offset, len))
    }
    fn write_pointer(&self, offset: u64) -> io::Result<u64> {
        self.note(self.dev().write_pointer(offset))
    }
    fn size_bytes(&self) -> u64 {
        self.dev().size_bytes()
    }
    fn block_bytes(&self) -> u32 {
        self.dev().block_bytes()
    }
    fn counters(&self) -> &IoCounters {
        match &self.inner {
            Inner::Mem(m) => m.counters(),
            Inner::File { dev, .. } => dev.counters(),
            Inner::Zoned { .. } => self.zoned_dev().counters(),
        }
    }
    fn describe(&self) -> String {
        format!("test device: {}", self.dev().describe())
    }
    fn release(&self) {
        self.dev().release()
    }
    fn claim(&self) -> io::Result<()> {
        self.dev().claim()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_backends_round_trip_corrupt_and_fail() {
        for backend in [TestBackend::Sync, TestBackend::Uring] {
            let d = TestDevice::with_backend(backend, 1 << 20, Path::new(env!("CARGO_MANIFEST_DIR")));
            let mut b = AlignedBuf::zeroed(4096);
            b[..5].copy_from_slice(b"hello");
            let (_, r) = d.write_at(b, 8192);
            r.unwrap();
            d.with_bytes_mut(|bytes| bytes[8192] = b'j');
            let (b, r) = d.read_at(AlignedBuf::zeroed(4096), 8192);
            r.unwrap();
            assert_eq!(&b[..5], b"jello", "{backend:?}: the direct read sees the change");
            d.fail_writes(true);
            let (_, r) = d.write_at(AlignedBuf::zeroed(4096), 0);
            assert!(r.is_err());
            d.fail_writes(false);
            assert_eq!(d.mem().is_some(), backend == TestBackend::Sync);
        }
    }

    #[test]
    fn zoned_backend_takes_its_zone_size_and_fails_on_a_broken_rule() {
        let d = TestDevice::with_backend(TestBackend::Zoned, 1 << 20, Path::new(env!("CARGO_MANIFEST_DIR")));
        d.shape_zones(64 << 10);
        let g = d.zones().unwrap();
        assert_eq!((g.zone_bytes, g.conventional_bytes, g.max_open), (64 << 10, 64 << 10, ZONED_MAX_OPEN));
        d.write_at(AlignedBuf::zeroed(4096), 4096).1.unwrap();
        d.write_at(AlignedBuf::zeroed(4096), 64 << 10).1.unwrap();
        d.with_bytes_mut(|b| b[(64 << 10) + 1] = 7);
        let (b, r) = d.read_at(AlignedBuf::zeroed(4096), 64 << 10);
        r.unwrap();
        assert_eq!(b[1], 7);
        assert_eq!(d.zone_violations(), 0);
        // Behind the write pointer: refused, counted, and the drop fails.
        assert!(d.write_at(AlignedBuf::zeroed(4096), 64 << 10).1.is_err());
        assert_eq!(d.zone_violations(), 1);
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(d)));
        let e = dropped.unwrap_err();
        let msg = e.downcast_ref::<String>().unwrap();
        assert!(msg.contains("write pointer"), "{msg}");
        // Unshaped: zones of the default size.
        let d = TestDevice::with_backend(TestBackend::Zoned, 4 << 20, Path::new(env!("CARGO_MANIFEST_DIR")));
        assert_eq!(d.zones().unwrap().zone_bytes, ZONED_DEFAULT_ZONE_BYTES);
    }

    #[test]
    fn uring_backend_uses_the_private_ring_off_executors() {
        let d = TestDevice::with_backend(TestBackend::Uring, 1 << 20, Path::new(env!("CARGO_MANIFEST_DIR")));
        let before = granary_rt::sync_ring::ops();
        let (_, r) = d.read_at(AlignedBuf::zeroed(4096), 0);
        r.unwrap();
        assert!(granary_rt::sync_ring::ops() > before);
    }
}
