//! Runs engine tests on either IO backend: synchronous calls on the
//! in-memory device, or the async API on a `granary-rt` executor over a real
//! O_DIRECT file whose operations go through the executor's io_uring; and
//! that again over a RAID-0 stripe set of three such files; and
//! synchronous calls on the emulated zoned device (zoned mode).

#![allow(dead_code)]

pub mod gate;

use granary_format::hash::KeyHasher;
use granary_io::{Device, FileDevice, IoBackend, MemDevice, OpenMode, StripedDevice};
use granary_rt::{Runtime, RuntimeConfig};
use granary_store::{PutMode, PutOutcome, Result, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a test waits, at most, for another thread to get somewhere.
pub const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// Poll `cond` every millisecond until it holds or [`WAIT_LIMIT`] passes;
/// whether it held. For a test that needs another thread to have done
/// something, whatever the scheduling (not a timing: it returns as soon as
/// the thing is done).
pub fn wait_until(mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + WAIT_LIMIT;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sync,
    Uring,
    /// io_uring over a stripe set of three files with 64 KiB stripes
    /// (records, group writes and segment scans cross members).
    Striped,
    /// Synchronous calls on the emulated zoned device
    /// (`granary_io::testdev`'s zoned backend) of 1 MiB zones: the store
    /// must have 1 MiB segments, and runs in zoned mode.
    Zoned,
}

/// A device of `size` bytes for a store of `segment`-byte segments: the
/// emulated zoned device of `segment`-byte zones with
/// `GRANARY_TEST_BACKEND=zoned` (`granary_io::testdev`), else in memory.
/// (The tests using it expect a device in memory, as the store's defaults
/// for one, so they do not run on the io_uring backend.)
pub fn test_device(size: u64, segment: u64) -> Arc<granary_io::TestDevice> {
    use granary_io::{TestBackend, TestDevice};
    let backend = match TestBackend::from_env() {
        TestBackend::Zoned => TestBackend::Zoned,
        TestBackend::Sync | TestBackend::Uring => TestBackend::Sync,
    };
    let dev = TestDevice::with_backend(backend, size, std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    dev.shape_zones(segment);
    Arc::new(dev)
}

/// Whether the suite runs on the zoned test backend
/// (`GRANARY_TEST_BACKEND=zoned`, `granary_io::testdev`), where a test that
/// cannot apply skips, saying why on stderr (past the harness's capture).
pub fn skip_zoned(why: &str) -> bool {
    let zoned = granary_io::TestBackend::from_env() == granary_io::TestBackend::Zoned;
    if zoned {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "skipped on the zoned test backend: {why}");
    }
    zoned
}

pub struct Harness {
    pub backend: Backend,
    rt: Option<Runtime>,
    _dir: Option<tempfile::TempDir>,
}

impl Harness {
    pub fn new(backend: Backend) -> Harness {
        let rt = matches!(backend, Backend::Uring | Backend::Striped)
            .then(|| Runtime::new(RuntimeConfig { threads: 2, pin: false, ..Default::default() }).unwrap());
        Harness { backend, rt, _dir: None }
    }

    /// A fresh device of `size` bytes for this backend.
    pub fn device(&mut self, size: u64) -> Arc<dyn Device> {
        match self.backend {
            Backend::Sync => Arc::new(MemDevice::new(size)),
            Backend::Zoned => {
                let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
                let dev = granary_io::TestDevice::with_backend(granary_io::TestBackend::Zoned, size, dir);
                dev.shape_zones(1 << 20);
                Arc::new(dev)
            }
            Backend::Uring => {
                let dir = tempfile::tempdir().unwrap();
                let dev = FileDevice::create(&dir.path().join("dev"), size, OpenMode::Direct)
                    .unwrap()
                    .with_backend(IoBackend::Uring);
                self._dir = Some(dir);
                Arc::new(dev)
            }
            Backend::Striped => {
                let dir = tempfile::tempdir().unwrap();
                let members = (0..3)
                    .map(|i| {
                        let per = (size / 3).next_multiple_of(64 << 10) + granary_io::stripe::LABEL_BYTES;
                        let f = FileDevice::create(&dir.path().join(format!("m{i}")), per, OpenMode::Direct).unwrap();
                        Arc::new(f.with_backend(IoBackend::Uring)) as Arc<dyn Device>
                    })
                    .collect();
                self._dir = Some(dir);
                Arc::new(StripedDevice::create(members, 64 << 10).unwrap())
            }
        }
    }

    fn run<T: Send + 'static>(&self, f: impl std::future::Future<Output = T> + Send + 'static) -> T {
        self.rt.as_ref().expect("uring backend").block_on(f).expect("task finished")
    }

    pub fn get(&self, s: &Arc<Store>, k: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.backend {
            Backend::Sync | Backend::Zoned => s.get(k),
            Backend::Uring | Backend::Striped => {
                let (s, k) = (s.clone(), k.to_vec());
                self.run(async move { s.get_async(&k).await })
            }
        }
    }

    pub fn put_with(&self, s: &Arc<Store>, k: &[u8], v: &[u8], mode: PutMode) -> Result<PutOutcome> {
        match self.backend {
            Backend::Sync | Backend::Zoned => s.put_with(k, v, mode),
            Backend::Uring | Backend::Striped => {
                let (s, k, v) = (s.clone(), k.to_vec(), v.to_vec());
                self.run(async move { s.put_with_async(&k, &v, mode).await })
            }
        }
    }

    pub fn delete(&self, s: &Arc<Store>, k: &[u8]) -> Result<bool> {
        match self.backend {
            Backend::Sync | Backend::Zoned => s.delete(k),
            Backend::Uring | Backend::Striped => {
                let (s, k) = (s.clone(), k.to_vec());
                self.run(async move { s.delete_async(&k).await })
            }
        }
    }

    /// Ring submissions so far (proof the uring path was taken).
    pub fn ring_sqes(&self) -> u64 {
        self.rt.as_ref().map(|rt| rt.stats().iter().map(|s| s.sqes).sum()).unwrap_or(0)
    }
}

/// `groups` groups of `per` keys named `{prefix}{i}` that share home slot
/// and key tag in a store with 64-slot tables (each other's index
/// candidates) whose keys hash with `hasher` (its superblock's
/// `key_hasher()`), group after group.
pub fn colliding_groups(hasher: KeyHasher, prefix: &str, groups: usize, per: usize) -> Vec<Vec<u8>> {
    use granary_format::hash::key_tag;
    let mut by_fp: std::collections::HashMap<(usize, u16), Vec<Vec<u8>>> = Default::default();
    let mut out = Vec::new();
    for i in 0.. {
        let k = format!("{prefix}{i}").into_bytes();
        let h = hasher.hash(&k);
        let g = by_fp.entry((granary_index::home_of(h, 64), key_tag(h))).or_default();
        g.push(k);
        if g.len() == per {
            out.append(g);
            if out.len() == groups * per {
                break;
            }
        }
    }
    out
}
