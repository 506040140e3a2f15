//! [`TestDevice`]: the device the engine's test suite runs on, chosen by the
//! environment so the same tests run on both IO backends:
//!
//! - `GRANARY_TEST_BACKEND` unset or `sync`: a [`MemDevice`] (synchronous,
//!   in memory);
//! - `GRANARY_TEST_BACKEND=uring`: an O_DIRECT [`FileDevice`] with the
//!   io_uring backend, in a fresh directory under the directory the test
//!   names (removed on drop). The synchronous API's IO then goes through
//!   the calling thread's private ring (`granary_rt::sync_ring`), the async
//!   API's through its executor's ring.
//!
//! Either way the test can corrupt bytes ([`TestDevice::with_bytes_mut`])
//! and make writes fail ([`TestDevice::fail_writes`]). Crash points (torn
//! and lost writes) belong to the simulated devices ([`MemDevice`],
//! [`crate::FaultDevice`]); [`TestDevice::mem`] gives the memory device
//! when there is one.

use crate::{AlignedBuf, Device, FileDevice, IoBackend, IoCounters, IoFuture, IoResult, MemDevice, OpenMode};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// The environment variable that picks the backend.
pub const BACKEND_VAR: &str = "GRANARY_TEST_BACKEND";

/// Which backend [`TestDevice::new`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestBackend {
    Sync,
    Uring,
}

impl TestBackend {
    /// From [`BACKEND_VAR`]; panics on a value it does not know, so a typo
    /// never silently runs the other backend.
    pub fn from_env() -> TestBackend {
        match std::env::var(BACKEND_VAR).as_deref() {
            Err(_) | Ok("") | Ok("sync") => TestBackend::Sync,
            Ok("uring") => TestBackend::Uring,
            Ok(other) => panic!("{BACKEND_VAR}={other:?}: expected sync or uring"),
        }
    }
}

enum Inner {
    Mem(Arc<MemDevice>),
    File { dev: Box<FileDevice>, path: PathBuf, dir: PathBuf },
}

/// A test's device. See the module doc.
pub struct TestDevice {
    inner: Inner,
    fail_writes: AtomicBool,
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
        };
        TestDevice { inner, fail_writes: AtomicBool::new(false) }
    }

    pub fn backend(&self) -> TestBackend {
        match self.inner {
            Inner::Mem(_) => TestBackend::Sync,
            Inner::File { .. } => TestBackend::Uring,
        }
    }

    /// The memory device, for crash-point tests.
    pub fn mem(&self) -> Option<&Arc<MemDevice>> {
        match &self.inner {
            Inner::Mem(m) => Some(m),
            Inner::File { .. } => None,
        }
    }

    /// Run `f` on the device's bytes; changes are kept (for a file: read
    /// whole, changed, written back and synced through the page cache,
    /// which direct IO then sees).
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        match &self.inner {
            Inner::Mem(m) => m.with_bytes_mut(f),
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
        self.dev().write_at(buf, offset)
    }
    fn read_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        self.dev().read_at_async(buf, offset)
    }
    fn write_at_async(&self, buf: AlignedBuf, offset: u64) -> IoFuture<'_> {
        if let Some(e) = self.injected() {
            return IoFuture::ready((buf, Err(e)));
        }
        self.dev().write_at_async(buf, offset)
    }
    fn in_memory(&self) -> bool {
        self.dev().in_memory()
    }
    fn flush(&self) -> io::Result<()> {
        self.dev().flush()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.dev().discard(offset, len)
    }
    fn discards_by_default(&self) -> bool {
        self.dev().discards_by_default()
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
        }
    }
    fn describe(&self) -> String {
        format!("test device: {}", self.dev().describe())
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
    fn uring_backend_uses_the_private_ring_off_executors() {
        let d = TestDevice::with_backend(TestBackend::Uring, 1 << 20, Path::new(env!("CARGO_MANIFEST_DIR")));
        let before = granary_rt::sync_ring::ops();
        let (_, r) = d.read_at(AlignedBuf::zeroed(4096), 0);
        r.unwrap();
        assert!(granary_rt::sync_ring::ops() > before);
    }
}
