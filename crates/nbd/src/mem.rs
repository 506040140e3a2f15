//! Exports kept in memory: [`MemExports`], for tests and demonstrations.
//! Blocks live in a map shared by every connection; an optional delay per
//! block operation stands in for a device, so concurrent requests overlap
//! as they would on one, and the counters show how many ran at once.
//!
//! Invariants: as [`crate::Export`] states; a block reading as zeroes is
//! absent from the map (a trim or an all-zero read-modify-write removes
//! it), so [`MemExport::blocks_stored`] counts only blocks holding data.

use crate::export::{Export, ExportInfo, Exports};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Named in-memory exports.
#[derive(Default)]
pub struct MemExports {
    exports: Mutex<BTreeMap<String, Arc<MemExport>>>,
}

impl MemExports {
    pub fn new() -> MemExports {
        MemExports::default()
    }

    /// Add (or replace) export `name`: `size_bytes` of zeroes in blocks of
    /// `block_bytes`.
    pub fn add(&self, name: &str, size_bytes: u64, block_bytes: u32) -> Arc<MemExport> {
        let e = Arc::new(MemExport::new(size_bytes, block_bytes));
        self.exports.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string(), e.clone());
        e
    }
}

impl Exports for MemExports {
    type Export = MemExport;

    fn list(&self) -> Vec<ExportInfo> {
        let all = self.exports.lock().unwrap_or_else(|e| e.into_inner());
        all.iter()
            .map(|(name, e)| ExportInfo {
                name: name.clone(),
                size_bytes: e.size_bytes,
                block_bytes: e.block_bytes,
                description: e.description(),
            })
            .collect()
    }

    fn open(&self, name: &str) -> Option<Arc<MemExport>> {
        self.exports.lock().unwrap_or_else(|e| e.into_inner()).get(name).cloned()
    }
}

/// One in-memory export.
pub struct MemExport {
    size_bytes: u64,
    block_bytes: u32,
    blocks: Mutex<HashMap<u64, Vec<u8>>>,
    /// Each block operation waits this long first (a device's latency).
    delay: Mutex<Option<Duration>>,
    syncs: AtomicU64,
    block_writes: AtomicU64,
    running: AtomicU64,
    running_max: AtomicU64,
}

/// Counts a block operation as running while it lives.
struct Running<'a>(&'a MemExport);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Relaxed);
    }
}

impl MemExport {
    /// `size_bytes` of zeroes in blocks of `block_bytes`.
    pub fn new(size_bytes: u64, block_bytes: u32) -> MemExport {
        MemExport {
            size_bytes,
            block_bytes,
            blocks: Mutex::new(HashMap::new()),
            delay: Mutex::new(None),
            syncs: AtomicU64::new(0),
            block_writes: AtomicU64::new(0),
            running: AtomicU64::new(0),
            running_max: AtomicU64::new(0),
        }
    }

    /// Make every block operation wait `d` first (None: only yield).
    pub fn set_delay(&self, d: Option<Duration>) {
        *self.delay.lock().unwrap_or_else(|e| e.into_inner()) = d;
    }

    /// Syncs served.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Relaxed)
    }

    /// Whole-block writes and read-modify-writes served.
    pub fn block_writes(&self) -> u64 {
        self.block_writes.load(Relaxed)
    }

    /// The most block operations that ran at once.
    pub fn running_max(&self) -> u64 {
        self.running_max.load(Relaxed)
    }

    /// Blocks holding data (not reading as zeroes).
    pub fn blocks_stored(&self) -> usize {
        self.blocks().len()
    }

    /// Bytes `offset .. offset + len` as a client would read them.
    pub fn read_range(&self, offset: u64, len: usize) -> Vec<u8> {
        let b = u64::from(self.block_bytes);
        let blocks = self.blocks();
        (offset..offset + len as u64)
            .map(|p| blocks.get(&(p / b)).and_then(|v| v.get((p % b) as usize).copied()).unwrap_or(0))
            .collect()
    }

    fn blocks(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<u8>>> {
        self.blocks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait as a device would, counting the operation as running.
    async fn io(&self) -> Running<'_> {
        let n = self.running.fetch_add(1, Relaxed) + 1;
        granary_rt::net::raise_high_water(&self.running_max, n);
        let guard = Running(self);
        let delay = *self.delay.lock().unwrap_or_else(|e| e.into_inner());
        match delay {
            Some(d) => granary_rt::sleep(d).await,
            None => granary_rt::yield_now().await,
        }
        guard
    }
}

impl Export for MemExport {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn block_bytes(&self) -> u32 {
        self.block_bytes
    }

    fn description(&self) -> String {
        "in-memory export".to_string()
    }

    async fn read_block(&self, n: u64) -> io::Result<Option<Vec<u8>>> {
        let _io = self.io().await;
        Ok(self.blocks().get(&n).cloned())
    }

    async fn write_block(&self, n: u64, data: &[u8]) -> io::Result<()> {
        debug_assert_eq!(data.len(), self.block_bytes as usize);
        let _io = self.io().await;
        self.block_writes.fetch_add(1, Relaxed);
        self.blocks().insert(n, data.to_vec());
        Ok(())
    }

    /// One device operation for the whole run, as a device reads it.
    async fn read_blocks(&self, first: u64, out: &mut [u8]) -> io::Result<()> {
        let _io = self.io().await;
        let blocks = self.blocks();
        for (i, o) in out.chunks_mut(self.block_bytes as usize).enumerate() {
            if let Some(v) = blocks.get(&(first + i as u64)) {
                let n = v.len().min(o.len());
                o[..n].copy_from_slice(&v[..n]);
            }
        }
        Ok(())
    }

    /// One device operation for the whole run, as a device writes it.
    async fn write_blocks(&self, first: u64, data: &[u8]) -> io::Result<()> {
        let b = self.block_bytes as usize;
        debug_assert_eq!(data.len() % b, 0);
        let _io = self.io().await;
        self.block_writes.fetch_add((data.len() / b) as u64, Relaxed);
        let mut blocks = self.blocks();
        for (i, d) in data.chunks(b).enumerate() {
            blocks.insert(first + i as u64, d.to_vec());
        }
        Ok(())
    }

    async fn update_block(&self, n: u64, at: usize, data: &[u8]) -> io::Result<()> {
        let _io = self.io().await;
        self.block_writes.fetch_add(1, Relaxed);
        let mut blocks = self.blocks();
        let mut v = blocks.remove(&n).unwrap_or_default();
        v.resize(self.block_bytes as usize, 0);
        v[at..at + data.len()].copy_from_slice(data);
        if v.iter().any(|&x| x != 0) {
            blocks.insert(n, v);
        }
        Ok(())
    }

    async fn trim_block(&self, n: u64) -> io::Result<()> {
        let _io = self.io().await;
        self.blocks().remove(&n);
        Ok(())
    }

    async fn sync(&self) -> io::Result<()> {
        let _io = self.io().await;
        self.syncs.fetch_add(1, Relaxed);
        Ok(())
    }
}
