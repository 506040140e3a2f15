//! Runs engine tests on either IO backend: synchronous calls on the
//! in-memory device, or the async API on a `granary-rt` executor over a real
//! O_DIRECT file whose operations go through the executor's io_uring.

#![allow(dead_code)]

use granary_io::{Device, FileDevice, IoBackend, MemDevice, OpenMode};
use granary_rt::{Runtime, RuntimeConfig};
use granary_store::{PutMode, PutOutcome, Result, Store};
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sync,
    Uring,
}

pub struct Harness {
    pub backend: Backend,
    rt: Option<Runtime>,
    _dir: Option<tempfile::TempDir>,
}

impl Harness {
    pub fn new(backend: Backend) -> Harness {
        let rt = (backend == Backend::Uring)
            .then(|| Runtime::new(RuntimeConfig { threads: 2, pin: false, ..Default::default() }).unwrap());
        Harness { backend, rt, _dir: None }
    }

    /// A fresh device of `size` bytes for this backend.
    pub fn device(&mut self, size: u64) -> Arc<dyn Device> {
        match self.backend {
            Backend::Sync => Arc::new(MemDevice::new(size)),
            Backend::Uring => {
                let dir = tempfile::tempdir().unwrap();
                let dev = FileDevice::create(&dir.path().join("dev"), size, OpenMode::Direct)
                    .unwrap()
                    .with_backend(IoBackend::Uring);
                self._dir = Some(dir);
                Arc::new(dev)
            }
        }
    }

    fn run<T: Send + 'static>(&self, f: impl std::future::Future<Output = T> + Send + 'static) -> T {
        self.rt.as_ref().expect("uring backend").block_on(f).expect("task finished")
    }

    pub fn get(&self, s: &Arc<Store>, k: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.backend {
            Backend::Sync => s.get(k),
            Backend::Uring => {
                let (s, k) = (s.clone(), k.to_vec());
                self.run(async move { s.get_async(&k).await })
            }
        }
    }

    pub fn put_with(&self, s: &Arc<Store>, k: &[u8], v: &[u8], mode: PutMode) -> Result<PutOutcome> {
        match self.backend {
            Backend::Sync => s.put_with(k, v, mode),
            Backend::Uring => {
                let (s, k, v) = (s.clone(), k.to_vec(), v.to_vec());
                self.run(async move { s.put_with_async(&k, &v, mode).await })
            }
        }
    }

    pub fn delete(&self, s: &Arc<Store>, k: &[u8]) -> Result<bool> {
        match self.backend {
            Backend::Sync => s.delete(k),
            Backend::Uring => {
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
